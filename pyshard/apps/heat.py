"""The explicit heat equation on a 2-D or 3-D grid, on pyshard halo exchanges.

One time step of ``u_t = laplace(u)`` (forward Euler, ``u += alpha * L(u)``) needs each
cell's neighbours: on a sharded grid, the ghost cells around each rank's block. Stencils:
``star`` (5 points in 2-D, 7 in 3-D: ghost width 1, no corners) and ``box`` (9 points in 2-D,
27 in 3-D: the corner ghosts too). Boundaries: ``periodic`` (the grid wraps) or fixed
(Dirichlet: the ghost cells outside the grid hold ``boundary`` and are never written by a
halo update, which leaves them to the user).

Every rank computes its cells with the same numpy expression, in the same order, as the
serial reference :func:`serial`, so the distributed result equals it bit for bit. With
``overlap=True`` a step starts the halo exchange, updates the inner cells (those whose
stencil touches no ghost cell) while the messages fly, waits, then updates the shell.
"""

from __future__ import annotations

import itertools
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .. import collectives
from ..array import ShardedArray, distribute
from ..halo import HaloArray
from ..layout import Shard
from ..mesh import Mesh

__all__ = [
    "STENCILS", "alpha_for", "initial", "inner_and_shell", "run", "serial", "serial_padded",
    "step", "step_cells",
]

STENCILS = ("star", "box")


def _offsets(ndim: int, stencil: str) -> List[Tuple[int, ...]]:
    """Neighbour offsets of the stencil (the centre left out), in a fixed order."""
    if stencil == "star":
        out = []
        for d in range(ndim):
            for s in (-1, 1):
                o = [0] * ndim
                o[d] = s
                out.append(tuple(o))
        return out
    return [o for o in itertools.product((-1, 0, 1), repeat=ndim) if any(o)]


def alpha_for(ndim: int, stencil: str) -> float:
    """A stable explicit step: alpha * (number of neighbours) <= 1/2."""
    return 0.5 / len(_offsets(ndim, stencil))


def step_cells(padded: Any, out: Any, cells: Sequence[slice], stencil: str, alpha: float) -> None:
    """``out[cells] = u + alpha * (sum of neighbours - k u)`` for the interior cells ``cells``
    (slices of the interior index space) of the padded array ``padded`` (ghost width 1)."""
    nd = padded.ndim
    offs = _offsets(nd, stencil)
    centre = tuple(slice(c.start + 1, c.stop + 1) for c in cells)
    u = padded[centre]
    acc = None
    for o in offs:  # the same order everywhere: bitwise equal sums
        v = padded[tuple(slice(c.start + 1 + k, c.stop + 1 + k) for c, k in zip(cells, o))]
        acc = v.copy() if acc is None else acc + v
    out[tuple(cells)] = u + alpha * (acc - len(offs) * u)


def inner_and_shell(shape: Sequence[int]) -> Tuple[Optional[List[slice]], List[List[slice]]]:
    """The inner cells (no ghost in their stencil) and the shell around them, as disjoint
    boxes of the interior index space."""
    nd = len(shape)
    if any(n < 3 for n in shape):
        return None, [[slice(0, n) for n in shape]]
    inner = [slice(1, n - 1) for n in shape]
    shell = []
    for d in range(nd):
        for lo, hi in ((0, 1), (shape[d] - 1, shape[d])):
            box = [slice(1, n - 1) if e < d else slice(0, n) for e, n in enumerate(shape)]
            box[d] = slice(lo, hi)
            shell.append(box)
    return inner, shell


def step(cur: HaloArray, nxt: HaloArray, stencil: str, alpha: float, overlap: bool,
         regions: Tuple[Optional[List[slice]], List[List[slice]], List[slice]]) -> None:
    """One time step: ``nxt``'s cells from ``cur``'s (its ghost cells updated first).
    ``overlap``: start the exchange, update the inner cells, wait, update the shell;
    otherwise update, then every cell. ``regions``: (inner, shell, whole) of the interior."""
    inner, shell, whole = regions
    if overlap and inner is not None:
        cur.start()
        step_cells(cur.padded, nxt.interior, inner, stencil, alpha)
        cur.wait()
        for box in shell:
            step_cells(cur.padded, nxt.interior, box, stencil, alpha)
    else:
        cur.update()
        step_cells(cur.padded, nxt.interior, whole, stencil, alpha)


def serial_padded(u: np.ndarray, periodic: bool, boundary: float) -> np.ndarray:
    """``u`` with one ghost layer: wrapped (periodic) or ``boundary`` (fixed)."""
    if periodic:
        return np.pad(u, 1, mode="wrap")
    return np.pad(u, 1, mode="constant", constant_values=boundary)


def serial(u0: np.ndarray, steps: int, stencil: str, periodic: bool,
           boundary: float = 0.0) -> np.ndarray:
    """The reference: ``steps`` steps on one process, the same arithmetic as :func:`run`."""
    alpha = alpha_for(u0.ndim, stencil)
    u = u0.copy()
    for _ in range(steps):
        p = serial_padded(u, periodic, boundary)
        step_cells(p, u, [slice(0, n) for n in u.shape], stencil, alpha)
    return u


def initial(shape: Sequence[int], dtype: Any = "float64") -> np.ndarray:
    """A deterministic initial field: a hot box and a smooth ripple."""
    grids = np.meshgrid(*[np.linspace(0.0, 1.0, n) for n in shape], indexing="ij")
    u = np.ones(shape) * 0.25
    for g in grids:
        u = u + 0.1 * np.sin(6.0 * g)
    hot = tuple(slice(n // 3, max(n // 3 + 1, 2 * n // 3)) for n in shape)
    u[hot] += 1.0
    return u.astype(dtype)


def run(
    mesh: Mesh,
    shape: Sequence[int],
    steps: int,
    stencil: str = "star",
    periodic: bool = False,
    overlap: bool = False,
    boundary: float = 0.0,
    u0: Optional[np.ndarray] = None,
    dtype: Any = "float64",
) -> Tuple[ShardedArray, Dict[str, float]]:
    """``steps`` heat steps of the grid ``shape`` sharded over ``mesh`` (mesh dim k shards
    grid dim k); collective. ``u0`` (default :func:`initial`) must have the shape ``shape``.
    Returns the final field and timings (seconds, this rank): ``total``, ``per_step``."""
    if stencil not in STENCILS:
        raise ValueError(f"stencil must be one of {STENCILS}, got {stencil!r}")
    nd = len(shape)
    if not 1 <= mesh.ndim <= nd:
        raise ValueError(f"a {mesh.ndim}-D mesh cannot shard a {nd}-D grid")
    if steps < 0:
        raise ValueError(f"steps must be >= 0, got {steps}")
    if u0 is None:
        u0 = initial(shape, dtype)
    elif tuple(np.shape(u0)) != tuple(shape):
        raise ValueError(f"u0 has the shape {tuple(np.shape(u0))}, not the grid's shape "
                         f"{tuple(shape)}")
    placements = [Shard(d) for d in range(mesh.ndim)]
    x = distribute(u0, mesh, placements)
    corners = stencil == "box"
    a = x.with_halo(1, periodic=periodic, corners=corners)
    b = x.with_halo(1, periodic=periodic, corners=corners)
    for h in (a, b):  # fixed boundaries: the ghosts outside the grid hold the boundary value
        if not periodic:
            inner = h.interior.copy()
            h.padded[...] = boundary
            h.interior[...] = inner
    alpha = alpha_for(nd, stencil)
    inner, shell = inner_and_shell(a.interior.shape)
    whole = [slice(0, n) for n in a.interior.shape]
    collectives.barrier(mesh.comm)
    t0 = time.perf_counter()
    cur: HaloArray = a
    nxt: HaloArray = b
    for _ in range(steps):
        step(cur, nxt, stencil, alpha, overlap, (inner, shell, whole))
        cur, nxt = nxt, cur
    t = time.perf_counter() - t0
    return cur.array, {"total": t, "per_step": t / max(steps, 1)}
