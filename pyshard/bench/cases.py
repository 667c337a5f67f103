"""The benchmark's case table: each case a source and target layout on a mesh of every rank.

:data:`CASES` run by default; :data:`EXTRA_CASES` (checkpoint, memory, sparse, fft3d, fft,
halo, stencil, many) are benchmarks of their own, run only when named in ``--cases``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np

from ..layout import Partial, Replicate, Shard

CASES = (
    "transpose",
    "transpose_uneven",
    "gather",
    "reduce_scatter",
    "swap2d",
    "rebalance",
    "small",
)
"""The redistribution cases, run by default."""

EXTRA_CASES = ("checkpoint", "memory", "sparse", "fft3d", "fft", "halo", "stencil", "many",
               "migrate", "unstructured")
"""Benchmarks with rows of their own fields, run only when named."""


def _mesh2d(p: int) -> Tuple[int, int]:
    a = int(np.sqrt(p))
    while p % a:
        a -= 1
    return (a, p // a)


@dataclass
class Case:
    """One redistribution case: ``src`` -> ``dst`` placements of a global ``shape`` on a mesh
    of ``mesh_shape``; ``src_sizes`` uneven source extents (``{array_dim: extents}``)."""

    name: str
    mesh_shape: Tuple[int, ...]
    shape: Tuple[int, ...]
    src: list
    dst: list
    src_sizes: Optional[dict] = None


def make_cases(names: Sequence[str], shape: Tuple[int, ...], p: int) -> List[Case]:
    """The cases ``names`` (from :data:`CASES`) for a global ``shape`` on ``p`` ranks."""
    out = []
    for n in names:
        if n == "transpose":
            out.append(Case(n, (p,), shape, [Shard(0)], [Shard(1)]))
        elif n == "transpose_uneven":
            un = (shape[0] + 3, shape[1] + 1) + tuple(shape[2:])
            out.append(Case(n, (p,), un, [Shard(0)], [Shard(1)]))
        elif n == "gather":
            out.append(Case(n, (p,), shape, [Shard(0)], [Replicate()]))
        elif n == "reduce_scatter":
            out.append(Case(n, (p,), shape, [Partial("sum")], [Shard(0)]))
        elif n == "swap2d":
            out.append(Case(n, _mesh2d(p), shape, [Shard(0), Shard(1)], [Shard(1), Shard(0)]))
        elif n == "rebalance":
            # very uneven: rank 0 holds 7/8 of the rows, the rest share 1/8
            rest = shape[0] // 8 if p > 1 else 0
            tail = [rest // (p - 1) + (i < rest % (p - 1)) for i in range(p - 1)] if p > 1 else []
            sizes = [shape[0] - sum(tail)] + tail
            out.append(Case(n, (p,), shape, [Shard(0)], [Shard(0)], {0: sizes}))
        elif n == "small":
            out.append(Case(n, (p,), (64, 64), [Shard(0)], [Shard(1)]))
        else:
            raise ValueError(f"unknown bench case {n!r}; cases are {CASES + EXTRA_CASES}")
    return out
