"""The unstructured bench's index space and the rows each rank reads, with numpy alone:
``scripts/petsc_sf.py`` loads this file by its path from a Python that cannot import pyshard
(Debian's python3 with its petsc4py), so both benches read the same rows (same seeds).

The index space: ``n`` rows a rank, ``N = n * P`` in all, rank ``r`` owning rows
``[r * n, (r + 1) * n)``. Each rank reads ``m = frac * n`` distinct rows, sorted (what
``np.unique`` of a CSR matrix's column indices gives):

- ``"mesh"``: a tenth of them its own rows, the rest split between its two neighbours on a
  ring of ranks (``r - 1`` and ``r + 1`` modulo P: one rank at P = 2, none at P = 1): the
  ghosts of a partitioned mesh come from the ranks across its interfaces;
- ``"random"``: uniform over ``[0, N)`` (a random graph's edges): about ``m / P`` own rows,
  the rest from every other rank.
"""

from __future__ import annotations

from typing import Tuple

import numpy as np

PATTERNS = ("mesh", "random")


def read_rows(n: int, size: int, rank: int, pattern: str, frac: float = 0.1) -> np.ndarray:
    """Rank ``rank``'s sorted, distinct global rows (int64) under ``pattern``."""
    m = min(int(round(frac * n)), n * size)
    rng = np.random.default_rng([42, rank, PATTERNS.index(pattern)])
    if pattern == "random":
        return np.sort(rng.choice(n * size, size=m, replace=False)).astype(np.int64)
    if pattern != "mesh":
        raise ValueError(f"unknown pattern {pattern!r}; patterns are {PATTERNS}")
    nbrs = sorted({(rank - 1) % size, (rank + 1) % size} - {rank})
    own = m if not nbrs else m // 10
    parts = [rank * n + rng.choice(n, size=min(own, n), replace=False)]
    rest = m - own
    for i, q in enumerate(nbrs):
        k = min(rest // len(nbrs) + (i < rest % len(nbrs)), n)
        parts.append(q * n + rng.choice(n, size=k, replace=False))
    return np.sort(np.concatenate(parts)).astype(np.int64)


def owners(rows: np.ndarray, n: int) -> np.ndarray:
    """The rank owning each global row (even shards of ``n`` rows)."""
    return rows // n


def row_values(n: int, rank: int, width: int = 8) -> np.ndarray:
    """Rank ``rank``'s owned rows: ``(n, width)`` float64 (64 B a row at width 8), each row
    its global index plus a fraction, so a check sees which row arrived where."""
    g = np.arange(rank * n, (rank + 1) * n, dtype=np.float64)
    return g[:, None] + np.arange(width, dtype=np.float64)[None, :] / (2 * width)


def split(rows: np.ndarray, n: int, rank: int) -> Tuple[np.ndarray, np.ndarray]:
    """The rows another rank owns and the ones this rank owns, each sorted."""
    mine = owners(rows, n) == rank
    return rows[~mine], rows[mine]
