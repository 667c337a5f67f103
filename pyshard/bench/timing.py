"""Wall time of the slowest rank, shared by the benchmarks and the demo."""

from __future__ import annotations

import time
from typing import Callable, List

import numpy as np
from mpi4py import MPI

from .. import collectives


def timed(fn: Callable[[], object], comm: MPI.Comm, reps: int, warmup: int) -> List[float]:
    """Run ``fn`` ``warmup`` times untimed, then ``reps`` times with a barrier before each;
    return each rep's time on the slowest rank (collective over ``comm``)."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(reps):
        collectives.barrier(comm)
        t0 = time.perf_counter()
        fn()
        out.append(collectives.max_all(comm, time.perf_counter() - t0))
    return out


def median_s(fn: Callable[[], object], comm: MPI.Comm, reps: int, warmup: int = 0) -> float:
    """The median of :func:`timed` (collective over ``comm``)."""
    return float(np.median(timed(fn, comm, reps, warmup)))
