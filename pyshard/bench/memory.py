"""The ``memory`` bench case: the peak RSS of a loop of redistributes over hundreds of
distinct shapes stays bounded (the caches keep metadata, not buffers)."""

from __future__ import annotations

import numbers
import resource
import sys
import time
from typing import Any, Dict

import numpy as np
from mpi4py import MPI

from .. import collectives
from ..array import from_local
from ..layout import Shard
from ..mesh import Mesh

MEMORY_FIRST = 40  # the memory case compares the peak RSS after this many shapes ...
MEMORY_LIMIT_MIB = 64  # ... with the peak after all of them: at most this much growth


def _peak_rss_mib() -> float:
    """This process's peak resident set size so far, in MiB."""
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kib / 2**20 if sys.platform == "darwin" else kib / 1024  # macOS reports bytes


def bench_memory(comm: MPI.Comm, shapes: int = 400, cols: int = 2048) -> Dict[str, Any]:
    """Peak RSS of a loop of redistributes over ``shapes`` distinct shapes.

    On a 1-D mesh of every rank, shape ``i`` is a ``(1000 + 7 i) x cols`` float32 shard per
    rank, Shard(0) -> Shard(1) once, the result dropped. The peak RSS (maximum over ranks) is
    taken after 40 shapes (or all, if fewer) and after all; ``check`` holds when it grew by
    at most 64 MiB in between, i.e. per-shape caches stay bounded. Collective over ``comm``.
    """
    if isinstance(shapes, bool) or not isinstance(shapes, numbers.Integral) or shapes < 1:
        raise ValueError(f"bench_memory(shapes): need an int >= 1, got {shapes!r}")
    p = comm.Get_size()
    mesh = Mesh(comm, (p,))
    first = min(MEMORY_FIRST, shapes)
    t0 = time.perf_counter()
    peak_first = 0.0
    for i in range(shapes):
        rows = 1000 + 7 * i
        local = np.ones((rows, cols), np.float32)
        x = from_local(local, mesh, [Shard(0)], global_shape=(p * rows, cols))
        x.redistribute([Shard(1)])
        del x, local
        if i + 1 == first:
            peak_first = _peak_rss_mib()
    peak_n = _peak_rss_mib()
    seconds = collectives.max_all(comm, time.perf_counter() - t0)
    peak_first = collectives.max_all(comm, peak_first)
    peak_n = collectives.max_all(comm, peak_n)
    growth = peak_n - peak_first
    return {
        "case": "memory",
        "ranks": p,
        "shapes": int(shapes),
        "shard": f"(1000+7i)x{cols}",
        "dtype": "float32",
        "peak_rss_mib_40": round(peak_first, 1),
        "peak_rss_mib_n": round(peak_n, 1),
        "growth_mib": round(growth, 1),
        "limit_mib": MEMORY_LIMIT_MIB,
        "seconds": seconds,
        # fewer shapes than the first peak's: nothing to compare (the row passes, says so)
        "checked": bool(shapes > MEMORY_FIRST),
        "check": bool(growth <= MEMORY_LIMIT_MIB or shapes <= MEMORY_FIRST),
    }


def format_memory(r: Dict[str, Any]) -> str:
    """One line for a :func:`bench_memory` row."""
    return (
        f"memory: {r['ranks']} ranks, {r['shapes']} shapes, a {r['shard']} {r['dtype']} shard "
        f"per rank, S(0)->S(1): peak RSS {r['peak_rss_mib_40']:.1f} MiB after "
        f"{min(MEMORY_FIRST, r['shapes'])} shapes, {r['peak_rss_mib_n']:.1f} MiB after "
        f"{r['shapes']}, growth {r['growth_mib']:.1f} MiB (limit {r['limit_mib']}) "
        f"in {r['seconds']:.1f} s  "
        + (("ok" if r["check"] else "GROWS") if r.get("checked", True)
           else f"not checked (at most {MEMORY_FIRST} shapes)")
    )
