"""A rank that raises between two redistributes ends the whole job with its message when the
job runs under `python -m mpi4py` (MPI_Abort on an unhandled exception), as the demo, the
bench and the Slurm scripts do: mpiexec exits non-zero within seconds, no rank left waiting."""

from __future__ import annotations

import os
import sys
import time

import launch
import pytest

pytestmark = pytest.mark.mpi

HERE = os.path.dirname(os.path.abspath(__file__))


def test_a_raising_rank_aborts_the_job(comm):
    launch.require(comm)
    t0 = time.monotonic()
    r = launch.run(3, [sys.executable, "-m", "mpi4py", os.path.join(HERE, "fault_worker.py")])
    took = time.monotonic() - t0
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert "rank 1 gave up between two redistributes" in out, out
    assert "unreachable" not in out, out
    assert took < 60, f"the job took {took:.0f} s to end"
