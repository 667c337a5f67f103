"""The pass planner: a transform of arrays laid out as ``src`` as a list of passes, decided
from the layout alone (the same on every rank; pure Python, no MPI).

:func:`build_passes`: every transformed axis that is whole on each rank (no mesh dim of size
> 1 shards it) is transformed locally, all of them in one :class:`Local` pass; for each
transformed axis still sharded, one :class:`Move` (a pyshard redistribution :class:`Plan`:
one exchange on one sub-communicator) moves its Shard onto an axis that is done or a batch
axis, on the same mesh dims (:func:`choose_move`), and so on; at the end one move to the
requested layout, unless it is ``"any"``. ``rfftn`` and ``ihfftn`` transform their last
axis first (real to complex), ``irfftn`` and ``hfftn`` last (complex to real).
``Partial("max"/"min")`` inputs, and ``Partial("sum")`` of bool or integers, are reduced first
(:func:`stays_partial`).
:func:`invert_passes`: the inverse transform, each pass undone in reverse order, back to the
forward's input layout with no extra move.
"""

from __future__ import annotations

import logging
from math import prod
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .. import _dtypes
from ..layout import Layout, Partial, Placement, Replicate, Shard
from ..planner import Plan
from ..planner import plan as redistribution_plan
from .kinds import INVERSE, pass_out_dtype

__all__ = ["Local", "Move", "build_passes", "choose_move", "invert_passes", "reduced_first",
           "stays_partial"]

log = logging.getLogger("pyshard.fft")


class Local:
    """A local transform: ``func`` along ``axes`` with lengths ``ns``, resized to ``outs``;
    no communication."""

    __slots__ = ("func", "axes", "ns", "outs", "src", "dst")

    def __init__(
        self, func: str, axes: Tuple[int, ...], ns: Tuple[int, ...], outs: Tuple[int, ...],
        src: Layout, dst: Layout,
    ) -> None:
        self.func, self.axes, self.ns, self.outs = func, axes, ns, outs
        self.src, self.dst = src, dst

    def describe(self) -> str:
        ax = ", ".join(map(str, self.axes))
        return (
            f"local {self.func} along axes ({ax}) n={list(self.ns)}: "
            f"{self.src.shape} {self.src.dtype} -> {self.dst.shape} {self.dst.dtype}"
        )


class Move:
    """A redistribute (a pyshard Plan: one exchange on one sub-communicator, or nothing)."""

    __slots__ = ("plan", "src", "dst")

    def __init__(self, p: Plan) -> None:
        self.plan, self.src, self.dst = p, p.src, p.dst


def stays_partial(p: Placement, dtype: np.dtype) -> bool:
    """Does a transform keep the input placement ``p`` (of an input of ``dtype``) Partial?
    Only a sum (or avg) of floating or complex values: the transforms are linear over them.
    max/min are not linear, and neither is pyshard's sum of bool (a logical or) or of
    integers (it wraps in the input's dtype, where the transform computes in floats): those
    are reduced first."""
    return (isinstance(p, Partial) and p.op in ("sum", "avg")
            and (dtype.kind in "fc" or _dtypes.is_ml_float(dtype)))


def reduced_first(placements: Sequence[Placement], dtype: np.dtype) -> Tuple[int, ...]:
    """The Partial mesh dims a transform reduces before it runs: those it cannot keep
    (:func:`stays_partial`), and every Partial dim before the last of them (mesh dims reduce
    in order, dim 0 first: the sum over dim 0 of [P(sum), P(max)] is taken before the max,
    so it cannot stay Partial past it)."""
    keep = [m for m, p in enumerate(placements) if isinstance(p, Partial)
            and not stays_partial(p, dtype)]
    if not keep:
        return ()
    last = max(keep)
    return tuple(m for m, p in enumerate(placements)
                 if isinstance(p, Partial) and (m in keep or m < last))


def _sharded(lay: Layout, a: int) -> bool:
    return bool(lay.table[a][0]) and any(lay.mesh_shape[m] > 1 for m in lay.table[a][0])


def _with(
    lay: Layout,
    shape: Optional[Sequence[int]] = None,
    dtype: Optional[np.dtype] = None,
    placements: Optional[Sequence[Placement]] = None,
    sizes: Optional[Dict[int, Sequence[int]]] = None,
    keep: bool = True,
) -> Layout:
    """``lay`` with another shape, dtype or placements; with ``keep``, the shard extents of
    every dim whose length and sharding mesh dims are unchanged are kept (plus ``sizes``)."""
    shape = tuple(lay.shape if shape is None else shape)
    dtype = lay.dtype if dtype is None else dtype
    pl = tuple(lay.placements if placements is None else placements)
    out: Dict[int, Tuple[int, ...]] = {}
    if keep:
        for d, (mdims, ext, _) in enumerate(lay.table):
            nd = tuple(m for m, p in enumerate(pl) if p == Shard(d))
            if mdims and nd == mdims and shape[d] == lay.shape[d]:
                out[d] = ext
    if sizes:
        out.update({int(d): tuple(v) for d, v in sizes.items()})
    return Layout(shape, dtype, lay.mesh_shape, pl, out or None)


def choose_move(
    cur: Layout, todo: Sequence[int], pending: Sequence[int], target: Optional[Tuple]
) -> Layout:
    """The next transpose: move the Shard of one transformed axis ``a`` in ``todo`` (all
    sharded) onto another axis ``b`` on the same mesh dims, preferring a ``b`` that is done or
    a batch axis (not in ``pending``), is where the target shards those mesh dims (else the
    final redistribute moves it again), holds a shard per rank, is not sharded yet, and is
    long. With no other axis (a 1-D array) the mesh dims
    replicate ``a`` (an Allgather). Decided from the layout alone: the same on every rank."""
    best = None
    for i, a in enumerate(todo):
        mdims = [m for m in cur.table[a][0]]
        parts = prod(cur.mesh_shape[m] for m in mdims)
        for b in range(cur.ndim):
            if b == a:
                continue
            on_target = target is not None and all(
                target[0][m] == Shard(b) for m in mdims
            )
            score = (
                b in pending,
                not on_target,  # else the final redistribute moves it again
                cur.shape[b] < parts,
                _sharded(cur, b),
                -cur.shape[b],
                i,
                b,
            )
            if best is None or score < best[0]:
                best = (score, a, b, mdims)
    pl = list(cur.placements)
    if best is None:  # 1-D: gather the axis on its mesh dims
        for a in todo:
            for m in cur.table[a][0]:
                pl[m] = Replicate()
        log.debug("pyshard.fft: no axis to move the shard onto; replicating %s", todo)
        return _with(cur, placements=pl)
    _, a, b, mdims = best
    for m in mdims:
        pl[m] = Shard(b)
    return _with(cur, placements=pl)


def _apply(cur: Layout, func: str, axes: Tuple[int, ...], ns: Tuple[int, ...],
           outs: Tuple[int, ...]) -> Tuple[Local, Layout]:
    shape = list(cur.shape)
    for ax, o in zip(axes, outs):
        shape[ax] = o
    nxt = _with(cur, shape=shape, dtype=pass_out_dtype(func, cur.dtype))
    return Local(func, axes, ns, outs, cur, nxt), nxt


def _groups(kind: str, axes: Tuple[int, ...], ns: Tuple[int, ...], src: Layout) -> list:
    """(func, axes, ns, outs) per group, in the order they run."""
    if kind == "rfftn":
        last = axes[-1]
        g = [("rfft", (last,), (ns[-1],), (ns[-1] // 2 + 1,))]
        if len(axes) > 1:
            g.append(("fftn", axes[:-1], ns[:-1], ns[:-1]))
        return g
    if kind == "ihfftn":  # ifftn over the others of ihfft (conj(rfft) / n) of the last
        last = axes[-1]
        g = [("ihfft", (last,), (ns[-1],), (ns[-1] // 2 + 1,))]
        if len(axes) > 1:
            g.append(("ifftn", axes[:-1], ns[:-1], ns[:-1]))
        return g
    if kind == "irfftn":
        g = []
        if len(axes) > 1:
            g.append(("ifftn", axes[:-1], ns[:-1], ns[:-1]))
        g.append(("irfft", (axes[-1],), (ns[-1],), (ns[-1],)))
        return g
    if kind == "hfftn":  # hfft (a forward c2r) of the last axis of fftn over the others
        g = []
        if len(axes) > 1:
            g.append(("fftn", axes[:-1], ns[:-1], ns[:-1]))
        g.append(("hfft", (axes[-1],), (ns[-1],), (ns[-1],)))
        return g
    return [(kind, axes, ns, ns)]


def build_passes(src: Layout, kind: str, axes: Tuple[int, ...], ns: Tuple[int, ...],
                 target: Optional[Tuple]) -> List[Any]:
    """The passes of a forward transform from ``src``; ``target`` (placements, sizes) or
    None for "any"."""
    passes: List[Any] = []
    cur = src
    red = reduced_first(cur.placements, cur.dtype)
    if red:  # Partial max/min, or a sum of bool/integers: not linear, reduce first
        pl = [Replicate() if m in red else p for m, p in enumerate(cur.placements)]
        nxt = _with(cur, placements=pl)
        passes.append(Move(redistribution_plan(cur, nxt)))
        cur = nxt
    groups = _groups(kind, axes, ns, src)
    for gi, (func, gaxes, gns, gouts) in enumerate(groups):
        later = [a for g in groups[gi + 1:] for a in g[1]]
        todo = list(gaxes)
        while todo:
            whole = [a for a in todo if not _sharded(cur, a)]
            if whole:
                sel = tuple(whole)
                idx = [gaxes.index(a) for a in sel]
                lp, cur = _apply(
                    cur, func, sel, tuple(gns[i] for i in idx), tuple(gouts[i] for i in idx)
                )
                passes.append(lp)
                todo = [a for a in todo if a not in whole]
                continue
            nxt = choose_move(cur, todo, todo + later, target)
            passes.append(Move(redistribution_plan(cur, nxt)))
            cur = nxt
    if target is not None:
        pl, sizes = target
        dst = Layout(cur.shape, cur.dtype, cur.mesh_shape, pl, dict(sizes) if sizes else None)
        if dst != cur:
            passes.append(Move(redistribution_plan(cur, dst)))
    return passes


def _holdable(placements: Sequence[Placement], dtype: np.dtype) -> Tuple[Placement, ...]:
    """``placements`` where ``dtype`` can be laid out so: a Partial max or min mesh dim is
    Replicate for complex data (no order: the inverse of a c2c transform of a real input
    laid out so ends on the reduced value, replicated)."""
    if np.dtype(dtype).kind != "c":
        return tuple(placements)
    return tuple(Replicate() if isinstance(p, Partial) and p.op in ("max", "min") else p
                 for p in placements)


def invert_passes(passes: Sequence[Any], start: Layout, kind: str) -> List[Any]:
    """The passes of the inverse transform, from ``start`` (the forward's result) back to
    the forward's input placements and extents, each forward pass undone in reverse order.
    A pass whose forward zero-padded or truncated (``s=``) is undone at the forward's
    lengths and then truncated (or zero-padded) to its input's: numpy's
    ``ifft(fft(x, n), n)[:len(x)]``, which gives ``x`` back where ``n >= len(x)``."""
    out: List[Any] = []
    cur = start
    inv_func = {"rfft": "irfft", "irfft": "rfft", "hfft": "ihfft", "ihfft": "hfft", **INVERSE}
    for p in reversed(passes):
        if isinstance(p, Move):
            dst = Layout(p.src.shape, cur.dtype, cur.mesh_shape,
                         _holdable(p.src.placements, cur.dtype), p.src.sizes or None)
            if dst != cur:
                out.append(Move(redistribution_plan(cur, dst)))
            cur = dst
        else:
            f = inv_func[p.func]
            outs = tuple(p.src.shape[a] for a in p.axes)
            if f in ("rfft", "ihfft"):  # the real length is this pass's input; bins to outs
                ns = tuple(cur.shape[a] for a in p.axes)
            else:  # c2c, c2r, r2r: at the forward's lengths, then cropped (or padded) to outs
                ns = p.ns
            shape = list(cur.shape)
            for ax, o in zip(p.axes, outs):
                shape[ax] = o
            dt = pass_out_dtype(f, cur.dtype)
            dst = Layout(shape, dt, cur.mesh_shape, _holdable(p.src.placements, dt),
                         p.src.sizes or None)
            out.append(Local(f, p.axes, ns, outs, cur, dst))
            cur = dst
    return out
