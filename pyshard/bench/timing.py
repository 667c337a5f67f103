"""Wall time of the slowest rank, shared by the benchmarks and the demo."""

from __future__ import annotations

import time
from typing import Callable, Dict, Hashable, List, Optional

import numpy as np
from mpi4py import MPI

from .. import collectives


def timed(fn: Callable[[], object], comm: MPI.Comm, reps: int, warmup: int,
          setup: Optional[Callable[[], object]] = None) -> List[float]:
    """Run ``fn`` ``warmup`` times untimed, then ``reps`` times with a barrier before each;
    return each rep's time on the slowest rank (collective over ``comm``). ``setup``, where
    given, runs before each call, untimed (an in-place call's input restored)."""
    for _ in range(warmup):
        if setup is not None:
            setup()
        fn()
    out = []
    for _ in range(reps):
        if setup is not None:
            setup()
        collectives.barrier(comm)
        t0 = time.perf_counter()
        fn()
        out.append(collectives.max_all(comm, time.perf_counter() - t0))
    return out


def median_s(fn: Callable[[], object], comm: MPI.Comm, reps: int, warmup: int = 0,
             setup: Optional[Callable[[], object]] = None) -> float:
    """The median of :func:`timed` (collective over ``comm``)."""
    return float(np.median(timed(fn, comm, reps, warmup, setup)))


def alternated(fns: Dict[Hashable, Callable[[], object]], comm: MPI.Comm, rounds: int,
               skip: int = 3) -> Dict[Hashable, float]:
    """Each of ``fns`` once a round, in turn, for ``rounds`` rounds (so a busy machine slows
    them alike), a barrier before each call; per name, the median of the slowest rank's times
    in seconds, the first ``skip`` rounds left out (collective over ``comm``)."""
    ts: Dict[Hashable, List[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            collectives.barrier(comm)
            t0 = time.perf_counter()
            fn()
            ts[k].append(collectives.max_all(comm, time.perf_counter() - t0))
    return {k: float(np.median(v[skip:])) for k, v in ts.items()}
