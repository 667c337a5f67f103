"""A rank that raises between two redistributes ends the whole job with its message when the
job runs under `python -m mpi4py` (MPI_Abort on an unhandled exception), as the demo, the
bench and the Slurm scripts do: mpiexec exits non-zero within seconds, no rank left waiting."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.mpi

HERE = os.path.dirname(os.path.abspath(__file__))
MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")


def test_a_raising_rank_aborts_the_job(comm):
    if comm.size != 1:
        pytest.skip("launches its own mpiexec: runs at size 1")
    if not os.path.exists(MPIEXEC):
        pytest.skip(f"no mpiexec next to {sys.executable}")
    cmd = [MPIEXEC, "-n", "3", sys.executable, "-m", "mpi4py",
           os.path.join(HERE, "fault_worker.py")]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "PMIX_", "MPI"))}
    t0 = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    took = time.monotonic() - t0
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert "rank 1 gave up between two redistributes" in out, out
    assert "unreachable" not in out, out
    assert took < 60, f"the job took {took:.0f} s to end"
