"""The migrate bench's particles and their moves, with numpy alone: ``scripts/petsc_swarm.py``
loads this file by its path from a Python that cannot import pyshard (Debian's python3 with
its petsc4py), so both benches move the same rows the same way (same seeds)."""

from __future__ import annotations

from typing import Dict, Sequence

import numpy as np


def particles(n: int, rank: int) -> Dict[str, np.ndarray]:
    """Rank ``rank``'s ``n`` rows: pos (3 float64), vel (3), q and a global id, 64 bytes."""
    rng = np.random.default_rng([12, rank])
    return {
        "pos": rng.random((n, 3)),
        "vel": rng.standard_normal((n, 3)),
        "q": rng.random(n),
        "id": np.arange(n, dtype=np.int64) + n * rank,
    }


def dests(n: int, size: int, rank: int, shape: Sequence[int], pattern: str,
          frac: float) -> np.ndarray:  # fmt: skip
    """Neighbour moves on a mesh of ``shape`` (``frac`` of the rows leave, each to one of the
    up to 8 neighbouring boxes of a periodic 2-D mesh; a 1-D mesh as ``(size, 1)``), or
    uniform random ranks (``pattern="uniform"``)."""
    rng = np.random.default_rng([34, rank])
    if pattern == "uniform":
        return rng.integers(0, size, size=n).astype(np.int64)
    shape = tuple(shape) if len(shape) == 2 else (size, 1)
    cy, cx = divmod(rank, shape[1])
    dest = np.full(n, rank, np.int64)
    leave = rng.random(n) < frac
    k = int(leave.sum())
    dy, dx = rng.integers(-1, 2, size=k), rng.integers(-1, 2, size=k)
    stay = (dy == 0) & (dx == 0)
    dx[stay] = 1  # a leaving row moves
    if shape[1] == 1:
        dx[:] = 0
        dy[dy == 0] = 1
    dest[leave] = ((cy + dy) % shape[0]) * shape[1] + (cx + dx) % shape[1]
    return dest
