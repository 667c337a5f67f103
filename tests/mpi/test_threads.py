"""A mesh whose ranks share a machine says, once, on the machine's first rank, that the BLAS
and torch threads are unbounded (none of OMP_NUM_THREADS, OPENBLAS_NUM_THREADS,
MKL_NUM_THREADS set), and nothing where one is set: a job of its own, its stderr read."""

from __future__ import annotations

import sys

import launch
import pytest

from pyshard.config import THREAD_VARIABLES

SCRIPT = """
from mpi4py import MPI
import pyshard as ps
for _ in range(2):  # two meshes, one warning
    ps.Mesh(MPI.COMM_WORLD, (MPI.COMM_WORLD.size,)).free()
print("done", flush=True)
"""


@pytest.mark.spawns  # starts mpiexec jobs of its own (the matrix's 1-rank run)
@pytest.mark.parametrize("setting", [
    None,
    # numerics: which variable silences the warning is pyshard's Python, the same on every MPI
    # library (the matrix's 1-rank run keeps the case without one)
    pytest.param("OMP_NUM_THREADS", marks=pytest.mark.numerics),
    pytest.param("OPENBLAS_NUM_THREADS", marks=pytest.mark.numerics),
])
def test_unbounded_threads_are_named_once(comm, setting, tmp_path):
    launch.require(comm)
    # (run from elsewhere: `python -c` puts the working directory first on sys.path, and the
    # checkout's pyshard/ is not the installed one where `pip install .` built the core)
    r = launch.run(2, [sys.executable, "-c", SCRIPT], env={setting: "1"} if setting else None,
                   unset=THREAD_VARIABLES, cwd=str(tmp_path))
    assert r.returncode == 0 and r.stdout.count("done") == 2, r.stdout + r.stderr
    n = r.stderr.count("ranks share this machine's")
    assert n == (0 if setting else 1), r.stderr
    if not setting:
        assert "Set OMP_NUM_THREADS=" in r.stderr, r.stderr
