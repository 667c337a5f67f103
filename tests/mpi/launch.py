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
import signal
import subprocess
import sys
import time

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


def one_rank_only(comm):
    """Skip past 1 rank a test whose work is the same at every rank count (a COMM_SELF mesh, a
    plot, a fresh interpreter): every rank would repeat it (seconds a rank on 2 cores)."""
    if comm.size != 1:
        pytest.skip("rank-count independent: runs at 1 rank")


def require(comm):
    """Skip unless this test runs at size 1 (it starts jobs of its own) and a launcher exists."""
    if comm.size != 1:
        pytest.skip("launches its own mpiexec: runs at size 1")
    if mpiexec() is None:
        pytest.skip("no mpiexec (set PYSHARD_MPIEXEC)")


def child_env(extra=None, unset=()):
    """This process's environment for a job of its own (see the module docstring), with
    ``extra`` added and the variables ``unset`` names left out."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(_JOB_VARS) and k not in unset}
    env.update(extra or {})
    return env


def command(n, args):
    """``mpiexec [PYSHARD_MPIEXEC_ARGS] -n N ARGS...``."""
    extra = shlex.split(os.environ.get("PYSHARD_MPIEXEC_ARGS", ""))
    return [mpiexec(), *extra, "-n", str(n), *args]


def run(n, args, env=None, timeout=120, unset=(), **kwargs):
    """Run ``args`` (usually ``[sys.executable, script, ...]``) on ``n`` ranks; the completed
    process (output captured as text). ``env``: variables added to the child environment;
    ``unset``: variables left out of it. A
    job still running after ``timeout`` seconds is killed whole (:func:`kill_job`: every rank,
    not only the launcher) and ``subprocess.TimeoutExpired`` raised."""
    cmd = command(n, args)
    files = shm_files()
    proc = subprocess.Popen(
        cmd, env=child_env(env, unset), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True, **kwargs,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_job(proc)
        out, err = proc.communicate()
        raise subprocess.TimeoutExpired(cmd, timeout, out, err) from None
    finally:  # a job that aborted (the fault tests) leaves its MPI library's segments
        deadline = time.monotonic() + 5
        while session_pids(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)  # ranks still exiting after the launcher
        remove_unused_shm(shm_files() - files)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def session_pids(sid):
    """The processes of session ``sid`` (Linux /proc), this one excluded."""
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue  # gone
        fields = stat[stat.rfind(")") + 2:].split()  # after "pid (comm) "
        if len(fields) > 3 and fields[0] != "Z" and int(fields[3]) == sid:
            pids.append(int(name))
    return pids


def kill_job(proc, timeout=10.0):
    """SIGKILL a job started with ``start_new_session=True``: the launcher and every process
    of its session, as a scheduler's kill of the job's cgroup does. Killing the launcher's
    process group is not enough: Open MPI 5 puts each rank in a process group of its own, and
    its ranks went on running after the launcher died. The pids still alive after ``timeout``
    seconds (none, normally)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + timeout
    while True:
        left = session_pids(proc.pid)
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            proc.wait(timeout=0.1)
        except subprocess.TimeoutExpired:
            pass
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def _in_use(paths):
    """Which of ``paths`` a live process has open or mapped (the ones this process may read)."""
    used = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/maps") as f:
                used.update(p for p in paths if p in f.read())
            for fd in os.listdir(f"/proc/{name}/fd"):
                target = os.readlink(f"/proc/{name}/fd/{fd}")
                if target in paths:
                    used.add(target)
        except OSError:
            continue
    return used


# the files MPI libraries put in /dev/shm (MPICH, Open MPI 5, Open MPI 4)
_MPI_SHM = ("mpich_shm_", "sm_segment.", "vader_segment.")


def shm_files():
    """The MPI libraries' files in /dev/shm (a set of names; empty without /dev/shm)."""
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith(_MPI_SHM)}
    except OSError:
        return set()


def remove_unused_shm(names, wait=2.0):
    """Unlink those of the files ``names`` of /dev/shm that an MPI library made and no live
    process has open or mapped: what a killed or aborted job's MPI library left there (MPICH's
    ``mpich_shm_*``, 2 MiB, Open MPI's ``sm_segment.*``, 16 MiB each), which no one would
    remove otherwise. Files still in use are looked at again for up to ``wait`` seconds (the
    last processes of a job that just ended let go of them a moment later). The names
    removed."""
    left = {os.path.join("/dev/shm", n) for n in names if n.startswith(_MPI_SHM)}
    removed = []
    deadline = time.monotonic() + wait
    while left:
        for p in sorted(left - _in_use(left)):
            left.discard(p)
            try:
                os.unlink(p)
                removed.append(os.path.basename(p))
            except OSError:
                pass
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    return removed
