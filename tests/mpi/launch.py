"""The one way tests start an MPI job of their own (``mpiexec -n N python ...``), configured by
the environment so that it works with every MPI library:

- ``PYSHARD_MPIEXEC``: the launcher (default: the ``mpiexec`` beside this Python, as pip's MPI
  packages install it, else ``mpiexec`` on ``PATH``, as a site MPI or Debian's has it);
- ``PYSHARD_MPIEXEC_ARGS``: extra launcher arguments, split like a shell would (for example
  ``--oversubscribe`` for Open MPI on a machine with fewer cores than ranks).

The job gets this process's environment without what the enclosing job's launcher set for its
own ranks (PMI/PMIx connection details, rank and size variables: a nested ``mpiexec`` would
otherwise take itself for a rank of the outer job), and keeps what a user sets for the library,
such as ``OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1`` (Open MPI run as root,
as CI does). Open MPI 5's launcher does not pass its own ``PRTE_MCA_*`` settings on to the
ranks, so a nested job needs ``--oversubscribe`` here to run more ranks than cores:
scripts/test-mpi.sh sets ``PYSHARD_MPIEXEC_ARGS=--oversubscribe`` for Open MPI.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys

import pytest

# variables a launcher sets for the ranks of its job (MPICH/Intel MPI Hydra, Open MPI 4 orte,
# Open MPI 5 prte, PMIx)
_JOB_VARS = (
    "PMI_", "PMIX_", "HYDRA_", "HYDI_", "MPIR_", "MPI_LOCALNRANKS", "MPI_LOCALRANKID",
    "I_MPI_INFO_", "I_MPI_HYDRA_UUID", "I_MPI_PIN_INFO", "I_MPI_PIN_MAPPING",
    "OMPI_COMM_WORLD_", "OMPI_WORLD_", "OMPI_UNIVERSE_SIZE", "OMPI_FIRST_RANKS", "OMPI_APP_CTX",
    "OMPI_NUM_APP_CTX", "OMPI_FILE_LOCATION", "OMPI_ARGV", "OMPI_COMMAND", "OMPI_TOOL_NAME",
    "OMPI_VERSION", "OMPI_LIBDIR_LOC", "OMPI_MCA_orte_", "OMPI_MCA_ess", "OMPI_MCA_pmix",
    "OMPI_MCA_initial_wdir", "OMPI_MCA_num_procs", "OMPI_MCA_mpi_oversubscribe",
    "OMPI_MCA_mpi_yield_when_idle", "OMPI_MCA_shmem_RUNTIME_QUERY_hint", "OMPI_MCA_cpu_type",
    "OMPI_MCA_PREFIXES", "PRTE_LAUNCHED", "PRTE_SHARED_FS", "OPAL_USER_PARAMS_GIVEN",
)  # fmt: skip


def mpiexec():
    """The launcher's path, or None when there is none."""
    exe = os.environ.get("PYSHARD_MPIEXEC", "").strip()
    if exe:  # a name on PATH, or a path (relative to where the tests started)
        return os.path.abspath(exe) if os.sep in exe else shutil.which(exe) or exe
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.path.exists(beside):
        return beside
    return shutil.which("mpiexec")


def require(comm):
    """Skip unless this test runs at size 1 (it starts jobs of its own) and a launcher exists."""
    if comm.size != 1:
        pytest.skip("launches its own mpiexec: runs at size 1")
    if mpiexec() is None:
        pytest.skip("no mpiexec (set PYSHARD_MPIEXEC)")


def child_env(extra=None):
    """This process's environment for a job of its own (see the module docstring)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_JOB_VARS)}
    env.update(extra or {})
    return env


def command(n, args):
    """``mpiexec [PYSHARD_MPIEXEC_ARGS] -n N ARGS...``."""
    extra = shlex.split(os.environ.get("PYSHARD_MPIEXEC_ARGS", ""))
    return [mpiexec(), *extra, "-n", str(n), *args]


def run(n, args, env=None, timeout=120, **kwargs):
    """Run ``args`` (usually ``[sys.executable, script, ...]``) on ``n`` ranks; the completed
    process (output captured as text). ``env``: variables added to the child environment."""
    return subprocess.run(
        command(n, args), env=child_env(env), capture_output=True, text=True, timeout=timeout,
        **kwargs,
    )  # fmt: skip
