"""Load balancing: shard extents chosen from a measured cost (:func:`balance`).

A pyshard layout splits each sharded array dim at its own cut points (a tensor product of
1-D splits: a *rectilinear* partition), and ``redistribute(..., sizes=)`` moves an array to
any such split in one exchange. :func:`balance` chooses the cut points that minimise the
largest per-shard cost of a per-cell cost array laid out like the data.

The algorithm (docs/balance.md has the proofs' outline and the measurements):

* **1-D, exact**: chains-on-chains partitioning by a bisection on the bottleneck value over
  prefix sums. A probe asks whether every part can cost at most ``B``: with no minimum size
  the greedy sweep (each part as long as it fits) decides it; with ``min_size`` a dynamic
  programme over the allowed cut points does (the greedy sweep is not exact there). A failed
  probe raises the lower end to the smallest cost that blocked it, a successful one lowers
  the upper end to the bottleneck it reached; both are costs of real intervals, so the
  bisection ends on the optimum exactly (no tolerance). Among the optimal splits the one
  nearest an even share of the cost at each cut is kept (uniform costs give
  ``split_sizes(n, parts, grain=multiple_of)``'s extents: ``numpy.array_split``'s, the
  larger parts first, in whole multiples with the rest to the last part).
* **N-D, iterative rectilinear refinement** (Nicol's scheme): start from the exact 1-D split
  of each sharded dim's projected profile (the cost summed over the other dims), then sweep
  the dims in turn. For dim ``d`` with the other dims' cuts fixed, the cost of the shard
  ``(k, j)`` is the sum over the interval ``k`` of the profile column ``j`` (the cost summed
  over the other dims' blocks ``j``), so the largest shard is ``max_k max_j`` of interval
  sums: a 1-D chains-on-chains problem with vector weights that the same bisection solves
  exactly. Each pass therefore never raises the bottleneck; the sweeps stop when a full sweep
  lowers it no more (a local optimum: no single dim's cuts can be moved to lower it), after
  at most ``sweeps`` sweeps. The result reports the lower bound ``max(total / shards,
  max_d B1_d / J_d)`` (``B1_d``: dim ``d``'s exact 1-D bottleneck, ``J_d``: the shards
  across the other dims) that no rectilinear split can beat.

Communication: one allreduce of the 1-D profiles (every sharded dim's, with the count of bad
cells, so a bad cost raises on every rank), one max-allreduce of the current shards' costs,
and one allreduce of an ``(n_d, J_d)`` profile per refinement pass; never a gather of the
cost array. :func:`balance_array` runs the same algorithm on a whole numpy cost array in one
process (a simulated mesh of any size).
"""

from __future__ import annotations

import math
import numbers
import time
from dataclasses import dataclass, field
from math import prod
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from . import _backend, _validate, collectives
from .array import ShardedArray
from .layout import Layout, Partial, Replicate, Shard, unravel
from .mesh import Mesh
from .migration import grid_params

__all__ = ["Balance", "balance", "balance_array", "particle_cost"]

PerDim = Union[int, Mapping[int, int]]
Sizes = Dict[int, Tuple[int, ...]]


# ----------------------------------------------------------------------------- the result


@dataclass
class Balance:
    """What :func:`balance` chose and why.

    ``sizes``: the extents to pass as ``redistribute(x.placements, sizes=...)`` (the current
    extents when ``kept``); ``found``: the split the algorithm found; ``current``: the
    extents of the cost's layout. Costs are per shard (the sum of the cost over a shard's
    box): ``before_max`` and ``after_max`` the largest, ``mean`` their mean (the total over
    the number of distinct shards), ``before`` and ``after`` the imbalance (largest / mean;
    1.0 is perfect). ``predicted_gain``: the fraction of the largest shard's cost the found
    split removes (``1 - found_max / before_max``); ``kept``: that gain was below
    ``tolerance`` and the current extents obey ``multiple_of`` and ``min_size``, so
    ``sizes`` is ``current`` (no move). ``breaks``: why the current extents could not be
    kept whatever the gain (the options they break, as text; empty where they obey them):
    then ``sizes`` is ``found`` even where its largest shard costs more than the current
    one's. ``lower_bound``: no rectilinear split has a smaller largest shard.
    ``measured_gain``: set by :meth:`measure`.
    """

    sizes: Sizes
    found: Sizes
    current: Sizes
    placements: Tuple[Any, ...]
    kept: bool
    tolerance: float
    before_max: float
    found_max: float
    after_max: float
    mean: float
    total: float
    lower_bound: float
    shards: int
    sweeps: int
    collectives: int
    seconds: float
    measured_gain: Optional[float] = None
    passes: List[Tuple[int, float]] = field(default_factory=list)
    breaks: str = ""

    @property
    def before(self) -> float:
        """The current extents' imbalance: largest shard cost / mean."""
        return _ratio(self.before_max, self.mean)

    @property
    def after(self) -> float:
        """The imbalance of ``sizes`` (the current one when ``kept``)."""
        return _ratio(self.after_max, self.mean)

    @property
    def predicted_gain(self) -> float:
        """``1 - found_max / before_max``: the fraction of the slowest shard's cost the found
        split removes (negative when it is worse than the current extents)."""
        if self.before_max <= 0.0:
            return 0.0
        return 1.0 - self.found_max / self.before_max

    def measure(self, seconds_before: float, seconds_after: float) -> float:
        """Record the measured gain, ``1 - seconds_after / seconds_before`` (say, the step time
        on the slowest rank before and after moving to ``sizes``), and return it."""
        b, a = float(seconds_before), float(seconds_after)
        if not (math.isfinite(b) and b > 0.0):
            raise ValueError(f"Balance.measure: seconds_before must be finite and > 0, got "
                             f"{seconds_before}")
        if not (math.isfinite(a) and a >= 0.0):
            raise ValueError(f"Balance.measure: seconds_after must be finite and >= 0, got "
                             f"{seconds_after}")
        self.measured_gain = 1.0 - a / b
        return self.measured_gain

    def explain(self) -> str:
        """A few lines: the imbalance before and after, the gains, the bound, the cost of the
        call and the extents."""
        lines = [
            f"balance: {self.shards} shards, total cost {self.total:.6g}, mean {self.mean:.6g}",
            f"  before: largest {self.before_max:.6g}, imbalance {self.before:.3f}",
            f"  found:  largest {self.found_max:.6g}, imbalance "
            f"{_ratio(self.found_max, self.mean):.3f}; predicted gain "
            f"{100 * self.predicted_gain:.1f}% of the slowest shard",
            f"  lower bound of any rectilinear split: {self.lower_bound:.6g} (found / bound "
            f"{_ratio(self.found_max, self.lower_bound):.3f})",
        ]
        if self.kept:
            lines.append(f"  kept the current extents: the gain is below the tolerance "
                         f"{100 * self.tolerance:.1f}%")
        elif self.breaks:
            lines.append(f"  move: the current extents break {self.breaks}, so they are not "
                         f"kept whatever the gain; imbalance {self.before:.3f} -> "
                         f"{self.after:.3f}")
        else:
            lines.append(f"  move: imbalance {self.before:.3f} -> {self.after:.3f}")
        if self.measured_gain is not None:
            lines.append(f"  measured gain {100 * self.measured_gain:.1f}%")
        lines.append(f"  {self.sweeps} refinement sweep(s), {self.collectives} collective(s), "
                     f"{1e3 * self.seconds:.2f} ms")
        for d in sorted(self.found):
            lines.append(f"  dim {d}: {list(self.current[d])} -> {list(self.sizes[d])}")
        return "\n".join(lines)


def _ratio(a: float, b: float) -> float:
    return 1.0 if b <= 0.0 else float(a) / float(b)


# ----------------------------------------------------------------------------- 1-D solver


class Chain:
    """The chains-on-chains problem of one array dim: ``prof`` is ``(n, J)`` (row ``x``:
    the cost of slice ``x`` within each of ``J`` blocks of the other dims), split into
    ``parts`` intervals cut at multiples of ``grain`` (the last takes the rest) of at least
    ``min_size`` cells, minimising the largest interval sum over the columns."""

    def __init__(self, prof: np.ndarray, parts: int, grain: int = 1, min_size: int = 0) -> None:
        prof = np.asarray(prof, np.float64)
        prof = prof.reshape(prof.shape[0], int(np.prod(prof.shape[1:], dtype=np.int64)))
        n = prof.shape[0]
        self.n, self.p, self.m = n, int(parts), int(min_size)
        self.mu = -(-self.m // grain)  # the fewest grains in a part but the last
        self.S = np.zeros((n + 1, prof.shape[1]))
        np.cumsum(prof, axis=0, out=self.S[1:])
        self.pos = np.arange(0, n + 1, grain)  # the allowed cut points
        self.U = len(self.pos)
        self.Sp = self.S[self.pos]
        self.Sn = self.S[n]
        self.W = self.Sp.sum(axis=1)
        self.Wn = float(self.Sn.sum())
        self.probes = 0

    # -- costs (one formula everywhere: the bisection's end points are such values)
    def cost(self, i: int, k: int) -> float:
        return float((self.Sp[k] - self.Sp[i]).max())

    def cost_end(self, i: int) -> float:
        return float((self.Sn - self.Sp[i]).max())

    def bottleneck(self, offsets: Sequence[int]) -> float:
        """The largest interval sum over the columns of the split at ``offsets`` (any cells,
        not only the allowed cut points)."""
        o = np.asarray(offsets)
        return float((self.S[o[1:]] - self.S[o[:-1]]).max())

    def _reach(self, i: np.ndarray, B: float) -> np.ndarray:
        """For each cut point index in ``i``, the last one ``k`` with ``cost(i, k) <= B``."""
        lo = i.copy()
        hi = np.full(len(i), self.U - 1)
        base = self.Sp[i]
        while True:
            act = lo < hi
            if not act.any():
                return lo
            mid = (lo + hi + 1) // 2
            ok = (self.Sp[mid] - base).max(axis=1) <= B
            lo = np.where(ok, mid, lo)
            hi = np.where(ok, hi, mid - 1)

    def _reach1(self, i: int, B: float) -> int:
        """:meth:`_reach` of one cut point: a window of the next cut points at a time."""
        w = 2 * (self.U // self.p) + 8
        while True:
            hi = min(self.U, i + w)
            m = (self.Sp[i:hi] - self.Sp[i]).max(axis=1)  # non-decreasing
            k = i + int(np.searchsorted(m, B, "right")) - 1
            if k < hi - 1 or hi == self.U:
                return k
            w *= 4

    def _greedy(self, B: float) -> Tuple[bool, float, float]:
        """(feasible, bottleneck reached, smallest cost that blocked a part) with no minimum
        size: each part as long as it fits; its path changes only at the blocking costs."""
        i, worst, nb = 0, 0.0, np.inf
        for _ in range(self.p - 1):
            k = self._reach1(i, B)
            if k < self.U - 1:
                nb = min(nb, self.cost(i, k + 1))
            worst = max(worst, self.cost(i, k))
            i = k
            if k == self.U - 1:
                break
        last = self.cost_end(i)
        if last <= B:
            return True, max(worst, last), nb
        return False, worst, min(nb, last)

    def _backward(self, B: float) -> Tuple[List[np.ndarray], np.ndarray, float]:
        """The dynamic programme: ``back[k][i]``: parts ``k..p-1`` can start at cut point ``i``
        and end at ``n`` (each of at least ``min_size`` cells, costing at most ``B``); the
        reach of every cut point; the smallest cost above ``B`` at which any reach changes."""
        idx = np.arange(self.U)
        e = self._reach(idx, B)
        ce = (self.Sn - self.Sp).max(axis=1)
        nxt = np.minimum(e + 1, self.U - 1)
        step = np.where(e < self.U - 1, (self.Sp[nxt] - self.Sp).max(axis=1), np.inf)
        nb = float(min(step.min(initial=np.inf), ce[ce > B].min(initial=np.inf)))
        back = [np.zeros(self.U, bool)] * self.p
        cur = (self.n - self.pos >= self.m) & (ce <= B)
        back[self.p - 1] = cur
        a = idx + self.mu
        valid = (a <= e) & (a <= self.U - 1)
        ac = np.minimum(a, self.U - 1)
        for k in range(self.p - 2, -1, -1):
            c = np.concatenate(([0], np.cumsum(cur)))
            cur = valid & (c[e + 1] - c[ac] > 0)
            back[k] = cur
        return back, e, nb

    def _choose(self, back: List[np.ndarray], e: np.ndarray, target: bool) -> List[int]:
        """Cut point indices of a split along ``back`` (which must allow one): each cut the
        allowed one nearest an even share of the remaining cost (``target``; ties: the later
        one), or the latest allowed one."""
        i, cuts = 0, [0]
        for k in range(1, self.p):
            a, b = i + self.mu, int(e[i])
            cand = np.flatnonzero(back[k][a:b + 1]) + a
            if not target:
                i = int(cand[-1])
            else:
                # the even share of what lies up to the last allowed cut point (the cells
                # past it, n % grain of them, go to the last part whatever the split, as
                # split_sizes' remainder does), rounded up to an allowed cut point
                r = self.p - k + 1  # parts left, this one included
                rem = float(self.W[-1]) - float(self.W[i])
                if rem > 0.0:
                    t = int(np.searchsorted(self.W, float(self.W[i]) + rem / r, "left"))
                else:
                    t = int(np.searchsorted(self.pos, self.pos[i] + (self.pos[-1] - self.pos[i])
                                            / r, "left"))
                d = np.abs(cand - t)
                i = int(cand[np.flatnonzero(d == d.min())[-1]])
            cuts.append(i)
        return cuts

    def _probe(self, B: float) -> Tuple[bool, float, float]:
        self.probes += 1
        if self.mu == 0:
            return self._greedy(B)
        back, e, nb = self._backward(B)
        if not back[0][0]:
            return False, 0.0, nb
        cuts = self._choose(back, e, target=False)
        return True, self._worst(cuts), nb

    def _worst(self, cuts: List[int]) -> float:
        w = max((self.cost(a, b) for a, b in zip(cuts[:-1], cuts[1:])), default=0.0)
        return max(w, self.cost_end(cuts[-1]))

    def solve(self) -> Tuple[Tuple[int, ...], float]:
        """The optimal split: (extents, largest interval sum)."""
        if self.p == 1:
            return (self.n,), self.cost_end(0)
        # every column's total over p parts, less a margin for the rounding of the sums
        lo = float(self.Sn.max()) / self.p * (1.0 - 1e-6)
        ok, hi, _ = self._probe(self.cost_end(0))  # one part holding everything fits
        if not ok:  # pragma: no cover - excluded by check_room
            raise ValueError("pyshard.balance: no split satisfies min_size")
        while lo < hi:
            mid = lo + (hi - lo) / 2.0
            if not lo < mid < hi:
                mid = lo
            ok, reached, nb = self._probe(mid)
            if ok:
                hi = reached
            else:
                lo = nb
        back, e, _ = self._backward(hi)
        cuts = self._choose(back, e, target=True)
        offs = [int(self.pos[c]) for c in cuts] + [self.n]
        sizes = tuple(b - a for a, b in zip(offs[:-1], offs[1:]))
        return sizes, self.bottleneck(offs)


def check_room(n: int, parts: int, grain: int, min_size: int, dim: int) -> None:
    """ValueError unless ``parts`` shards of at least ``min_size`` cells, cut at multiples of
    ``grain``, fit in ``n`` cells."""
    mu = -(-min_size // grain)
    need = (parts - 1) * mu * grain + min_size
    if need > n:
        raise ValueError(
            f"pyshard.balance: array dim {dim} has {n} cells but its {parts} shards need at "
            f"least {need} (min_size {min_size}, multiple_of {grain}): not every rank can get "
            f"a shard of min_size cells"
        )


def split(prof: Any, parts: int, multiple_of: int = 1, min_size: int = 0
          ) -> Tuple[Tuple[int, ...], float]:
    """The exact 1-D split of a cost profile (one process, no communication): ``parts``
    extents (cut at multiples of ``multiple_of``, the last taking the rest, each at least
    ``min_size``) minimising the largest part's cost, and that cost. ``prof``: ``(n,)``, or
    ``(n, J)`` where a part's cost is the largest of its ``J`` column sums."""
    a = np.asarray(prof, np.float64)
    _check_values(a)
    check_room(a.shape[0], parts, multiple_of, min_size, 0)
    return Chain(a, parts, multiple_of, min_size).solve()


def _check_values(a: np.ndarray) -> None:
    neg, bad = int(np.count_nonzero(a < 0)), int(np.count_nonzero(~np.isfinite(a)))
    if neg or bad:
        raise ValueError(_bad_message(neg, bad))
    with np.errstate(over="ignore"):
        if not np.isfinite(a.sum()):
            raise ValueError(_overflow_message())


def _overflow_message() -> str:
    return ("pyshard.balance: the costs are finite but their total overflows float64; "
            "scale them down (only their ratios matter)")


def _bad_message(neg: int, bad: int) -> str:
    return (f"pyshard.balance: the cost has {neg} negative and {bad} non-finite (NaN or inf) "
            f"cells; costs must be finite and >= 0")


# ----------------------------------------------------------------------------- N-D


def _coarsen(a: np.ndarray, axis: int, start: int, offsets: np.ndarray) -> np.ndarray:
    """``a`` (covering cells ``start..`` along ``axis``) summed within each part of the split
    at ``offsets``: the axis becomes one entry per part (zero where ``a`` has none)."""
    parts = len(offsets) - 1
    shape = list(a.shape)
    shape[axis] = parts
    out = np.zeros(shape)
    if a.shape[axis] == 0:
        return out
    part = np.searchsorted(offsets, start + np.arange(a.shape[axis]), "right") - 1
    runs = np.flatnonzero(np.diff(part, prepend=-1))
    red = np.add.reduceat(a, runs, axis=axis)
    idx = [slice(None)] * a.ndim
    idx[axis] = part[runs]
    out[tuple(idx)] = red
    return out


class _Source:
    """One rank's view of the cost: its block summed over the unsharded dims (``block``,
    float64, one axis per sharded dim, or None where a replica of another rank's block),
    where it starts, and how partial profiles are summed over the ranks (``reduce``)."""

    def __init__(self, block: Optional[np.ndarray], starts: Sequence[int],
                 reduce: Callable[[np.ndarray], np.ndarray]) -> None:
        self.block, self.starts, self.reduce = block, list(starts), reduce
        self.collectives = 0

    def profile(self, which: int, lengths: Sequence[int], cuts: Optional[List[np.ndarray]]
                ) -> np.ndarray:
        """The ``(n, J)`` profile of sharded dim number ``which``: the cost summed over the
        other dims' blocks of ``cuts`` (all of them as one block when None), over the ranks."""
        self.collectives += 1
        return self.reduce(self.local_profile(which, lengths, cuts))

    def local_profile(self, which: int, lengths: Sequence[int],
                      cuts: Optional[List[np.ndarray]]) -> np.ndarray:
        """This rank's part of :meth:`profile` (zero outside its block)."""
        J = 1 if cuts is None else prod(len(c) - 1 for i, c in enumerate(cuts) if i != which)
        g = np.zeros((lengths[which], J))
        b = self.block
        if b is not None and b.size:
            for i in range(b.ndim - 1, -1, -1):
                if i == which:
                    continue
                if cuts is None:
                    b = b.sum(axis=i, keepdims=True)
                else:
                    b = _coarsen(b, i, self.starts[i], cuts[i])
            b = np.moveaxis(b, which, 0).reshape(b.shape[which], -1)
            g[self.starts[which]:self.starts[which] + b.shape[0]] = b
        return g


def _per_dim(value: Any, name: str, ndim: int, least: int) -> Dict[int, int]:
    """An int, or {array dim: int} (other dims: the default), as one int per array dim."""
    default = 1 if least == 1 else 0
    out = dict.fromkeys(range(ndim), default)
    items = value.items() if isinstance(value, Mapping) else [(d, value) for d in range(ndim)]
    for d, v in items:
        if isinstance(d, bool) or not isinstance(d, numbers.Integral) or not -ndim <= d < ndim:
            raise ValueError(f"pyshard.balance: {name} key {d!r} is not an array dim of "
                             f"{ndim}")
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < least:
            raise ValueError(f"pyshard.balance: {name} must be an int >= {least} (or one per "
                             f"array dim), got {v!r}")
        out[int(d) % ndim] = int(v)
    return out


def _options(layout: Layout, multiple_of: PerDim, min_size: PerDim, tolerance: float,
             sweeps: int) -> Tuple[List[int], Dict[int, int], Dict[int, int]]:
    """Every argument check that needs no data (the same on every rank)."""
    if any(isinstance(p, Partial) for p in layout.placements):
        raise ValueError(f"pyshard.balance: the cost's layout {layout} has a Partial mesh dim; "
                         f"give the cost of each cell once (Shard or Replicate)")
    if layout.dtype.kind not in "biuf":
        raise ValueError(f"pyshard.balance: the cost must be a real number per cell, got dtype "
                         f"{layout.dtype}")
    if (isinstance(tolerance, bool) or not isinstance(tolerance, numbers.Real)
            or not 0.0 <= float(tolerance) < 1.0):
        raise ValueError(f"pyshard.balance: tolerance must be a number in [0, 1), got "
                         f"{tolerance!r}")
    if isinstance(sweeps, bool) or not isinstance(sweeps, numbers.Integral) or sweeps < 0:
        raise ValueError(f"pyshard.balance: sweeps must be an int >= 0, got {sweeps!r}")
    grain = _per_dim(multiple_of, "multiple_of", layout.ndim, 1)
    least = _per_dim(min_size, "min_size", layout.ndim, 0)
    dims = sorted(layout.sizes)
    for d in dims:
        check_room(layout.shape[d], len(layout.sizes[d]), grain[d], least[d], d)
    return dims, grain, least


def _refine(src: _Source, layout: Layout, dims: List[int], grain: Dict[int, int],
            least: Dict[int, int], sweeps: int, first: List[np.ndarray]
            ) -> Tuple[Sizes, float, float, int, List[Tuple[int, float]]]:
    """The algorithm on ``src``: (found sizes, their largest shard cost, the lower bound,
    sweeps run, (dim, bottleneck) per accepted pass). ``first``: each sharded dim's 1-D
    profile (all other dims summed)."""
    parts = [len(layout.sizes[d]) for d in dims]
    cuts: List[np.ndarray] = []
    bound = 0.0
    total = float(first[0].sum()) if first else 0.0
    ones: List[float] = []
    for i, d in enumerate(dims):
        sizes, b1 = Chain(first[i], parts[i], grain[d], least[d]).solve()
        cuts.append(np.concatenate(([0], np.cumsum(sizes))).astype(np.int64))
        bound = max(bound, b1 / (prod(parts) // parts[i]))
        ones.append(b1)
    bound = max(bound, total / max(1, prod(parts)))
    split = [i for i, n in enumerate(parts) if n > 1]
    if len(split) <= 1:  # one dim cut at most (a dim of one shard keeps its whole extent):
        # the exact 1-D split, with no refinement and so no more collectives
        b1 = ones[split[0]] if split else ones[0]
        return ({d: tuple(np.diff(cuts[i]).tolist()) for i, d in enumerate(dims)}, b1, bound,
                0, [])
    # starts: the 1-D splits, and the current extents where they obey the options; each
    # swept from the first dim and from the last
    starts = [cuts]
    now = [np.asarray(layout.table[d][2] + (layout.shape[d],), np.int64) for d in dims]
    if all(_allowed(now[i], grain[d], least[d]) for i, d in enumerate(dims)) and not all(
            np.array_equal(a, b) for a, b in zip(now, cuts)):
        starts.append(now)
    best: Optional[Tuple[float, List[np.ndarray], int, List[Tuple[int, float]]]] = None
    done = 0
    for start in starts:
        for order in (list(range(len(dims))), list(range(len(dims)))[::-1]):
            got = _descend(src, layout, dims, grain, least, sweeps, start, order)
            done += got[2]
            if best is None or got[0] < best[0]:
                best = got
    assert best is not None
    b, cuts, _, passes = best
    found = {d: tuple(np.diff(cuts[i]).tolist()) for i, d in enumerate(dims)}
    return found, float(b), bound, done, passes


def _allowed(offsets: np.ndarray, grain: int, least: int) -> bool:
    """Do these offsets cut at multiples of ``grain`` into parts of at least ``least``?"""
    return bool(np.all(offsets[1:-1] % grain == 0) and np.all(np.diff(offsets) >= least))


def _descend(src: _Source, layout: Layout, dims: List[int], grain: Dict[int, int],
             least: Dict[int, int], sweeps: int, start: List[np.ndarray], order: List[int]
             ) -> Tuple[float, List[np.ndarray], int, List[Tuple[int, float]]]:
    """The refinement from ``start``, passing over the dims in ``order``: (the bottleneck,
    the cuts, sweeps run, (dim, bottleneck) per accepted pass). One profile (a collective)
    per pass; at least one sweep, to learn the start's bottleneck."""
    lengths = [layout.shape[d] for d in dims]
    parts = [len(layout.sizes[d]) for d in dims]
    cuts = [c.copy() for c in start]
    passes: List[Tuple[int, float]] = []
    best = np.inf
    done = 0
    while True:
        better = False
        for i in order:
            d = dims[i]
            ch = Chain(src.profile(i, lengths, cuts), parts[i], grain[d], least[d])
            now = ch.bottleneck(cuts[i])
            best = min(best, now)
            if done >= sweeps:  # sweeps == 0: the start's bottleneck only
                break
            sizes, b = ch.solve()
            if b < now:
                cuts[i] = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
                best = b
                better = True
                passes.append((d, b))
        if done >= sweeps:
            break
        done += 1
        if not better:
            break
    return float(best), cuts, done, passes


def _breaks(layout: Layout, grain: Dict[int, int], least: Dict[int, int]) -> str:
    """The options the current extents of ``layout`` break (empty where they obey them):
    from the layout and the options alone, so the same on every rank."""
    why = []
    for d in sorted(layout.sizes):
        offs = np.asarray(layout.table[d][2] + (layout.shape[d],), np.int64)
        if not np.all(offs[1:-1] % grain[d] == 0):
            why.append(f"multiple_of {grain[d]} on dim {d}")
        if not np.all(np.diff(offs) >= least[d]):
            why.append(f"min_size {least[d]} on dim {d}")
    return ", ".join(why)


def _result(layout: Layout, found: Sizes, found_max: float, before_max: float, total: float,
            bound: float, done: int, passes: List[Tuple[int, float]], tolerance: float,
            ncoll: int, t0: float, breaks: str = "") -> Balance:
    current = layout.sizes
    shards = prod(len(current[d]) for d in current) if current else 1
    gain = 0.0 if before_max <= 0.0 else 1.0 - found_max / before_max
    # current extents that break multiple_of or min_size are never kept: the caller asked
    # for extents that obey them (a gain below the tolerance, even a negative one, moves)
    kept = gain < tolerance and not breaks
    return Balance(
        sizes=dict(current) if kept else dict(found), found=dict(found), current=dict(current),
        placements=tuple(layout.placements), kept=kept, tolerance=float(tolerance),
        before_max=float(before_max), found_max=float(found_max),
        after_max=float(before_max if kept else found_max), mean=total / shards,
        total=float(total), lower_bound=float(bound), shards=shards, sweeps=done,
        collectives=ncoll, seconds=time.perf_counter() - t0, passes=passes, breaks=breaks,
    )


def _reduced(a: np.ndarray, layout: Layout, dims: List[int]) -> np.ndarray:
    """``a`` as float64 summed over the unsharded dims (one axis per sharded dim)."""
    a = np.asarray(a, np.float64)
    other = tuple(d for d in range(layout.ndim) if d not in dims)
    return a.sum(axis=other) if other else a


def balance(cost: ShardedArray, multiple_of: PerDim = 1, min_size: PerDim = 0,
            tolerance: float = 0.02, sweeps: int = 8) -> Balance:
    """New extents for every sharded dim of ``cost``'s layout that minimise the largest
    per-shard cost; collective over ``cost.mesh``.

    ``cost``: a :class:`~pyshard.ShardedArray` of finite, non-negative costs per cell, laid
    out like the data to balance (a 1-D layout: a cost per row); its layout may be uneven
    (the extents of the last balance) and may have Replicate mesh dims (not Partial). On a
    Replicate mesh dim the cost is read from the replica at coordinate 0 alone (the total,
    the current and the found largest shard alike): the replicas of a shard share its
    extents, so a cost that differs between them (each replica group's own particles) must
    be summed over them first, as :func:`particle_cost` does.
    ``multiple_of``: cut only at multiples of this (an int, or {array dim: int}; heads,
    blocks, SIMD widths): every shard but the last along a dim is a multiple, the last takes
    the rest. ``min_size``: no shard narrower than this (a halo width). ``tolerance``: keep
    the current extents when the found split removes less than this fraction of the largest
    shard's cost and they obey ``multiple_of`` and ``min_size`` (current extents that break
    them are never kept: ``b.breaks`` says which). ``sweeps``: the most refinement sweeps
    over the dims (N-D).

    The split is rectilinear (each mesh dim cuts its array dim at its own points): exact for
    one sharded dim, a local optimum of the refinement otherwise (see
    :mod:`pyshard.balancing`). Returns a :class:`Balance`; move with
    ``cost.redistribute(b.placements, sizes=b.sizes)`` (and the data the same way).

    Errors (ValueError): not a ShardedArray, a Partial layout, a complex dtype, bad options,
    a dim whose ranks cannot all get ``min_size`` cells (from the arguments alone, before
    any communication: on every rank where every rank passes the same arguments, as this
    collective call requires; a rank that passes other ones, a numpy array say, raises
    alone and the others wait, since a rank without the ShardedArray has no mesh to tell
    them on; ``PYSHARD_VALIDATE=1`` turns a differing layout or option into an error on
    every rank); negative or non-finite costs (after the first collective, which counts
    them, on every rank).
    """
    t0 = time.perf_counter()
    if not isinstance(cost, ShardedArray):
        raise ValueError(f"pyshard.balance: cost must be a pyshard.ShardedArray of per-cell "
                         f"costs, got {type(cost).__name__}")
    layout, mesh = cost.layout, cost.mesh
    mesh.check_live()
    try:
        dims, grain, least = _options(layout, multiple_of, min_size, tolerance, sweeps)
    except ValueError as e:  # (validation mode: the others wait in their agreement)
        _validate.refused(mesh.comm, "balance", e)
        raise
    if _validate.enabled:  # the options as read: 2, np.int64(2) and {0: 2} are one option
        _validate.agree(mesh.comm, "balance", {
            "layout": repr(layout), "multiple_of": repr(sorted(grain.items())),
            "min_size": repr(sorted(least.items())), "tolerance": repr(float(tolerance)),
            "sweeps": repr(int(sweeps)),
        })
    local = cost.local
    # (.local replaced by an array of another shape on one rank: carried in the first
    # collective below, so that every rank raises; its dtype is cast anyway)
    want = layout.local_shape(mesh.coords)
    misfit = tuple(getattr(local, "shape", ())) != want
    detail = cost.local_problem() if misfit else None
    if misfit:
        local = np.zeros(want)
    if _backend.is_device(local):
        local = _backend.to_host(local)
    local = np.asarray(local, np.float64)
    # one replica of each block contributes (coordinate 0 along the Replicate mesh dims)
    mine = all(mesh.coords[m] == 0 for m, p in enumerate(layout.placements)
               if not isinstance(p, Shard))
    box = layout.box(mesh.coords)
    block = _reduced(local, layout, dims) if mine else None
    starts = [box[d].start for d in dims]
    src = _Source(block, starts, lambda g: collectives.sum_all_array(mesh.comm, g))
    lengths = [layout.shape[d] for d in dims]
    # the first collective: the bad cells' counts and every sharded dim's 1-D profile
    head = np.zeros(3)
    if mine:
        head[:2] = np.count_nonzero(local < 0), np.count_nonzero(~np.isfinite(local))
    head[2] = misfit
    parts = [head] + [src.local_profile(i, lengths, None)[:, 0] for i in range(len(dims))]
    summed = collectives.sum_all_array(mesh.comm, np.concatenate(parts))
    if summed[2]:
        raise ValueError(
            f"pyshard.balance: the cost's local array does not fit its layout on "
            f"{int(summed[2])} rank(s); every rank raises this"
            + (f"; this rank's is {detail}" if misfit else ""))
    if summed[0] or summed[1]:
        raise ValueError(_bad_message(int(summed[0]), int(summed[1])))
    with np.errstate(over="ignore"):  # (an overflowing total raises below)
        # the current shards' costs, from the same replicas as the profiles
        mine_sum = float(local.sum()) if mine else 0.0
        if dims and not np.isfinite(summed[3:3 + lengths[0]].sum()):  # the same on every rank
            raise ValueError(_overflow_message())
    before_max = float(collectives.max_all(mesh.comm, mine_sum))
    ncoll = 2
    if not dims:
        return _result(layout, {}, before_max, before_max, before_max, before_max, 0, [],
                       tolerance, ncoll, t0)
    first = np.split(summed[3:], np.cumsum(lengths)[:-1])
    found, found_max, bound, done, passes = _refine(src, layout, dims, grain, least, sweeps,
                                                    first)
    total = float(first[0].sum())
    return _result(layout, found, found_max, before_max, total, bound, done, passes,
                   tolerance, ncoll + src.collectives, t0, _breaks(layout, grain, least))


def balance_array(cost: Any, layout: Layout, multiple_of: PerDim = 1, min_size: PerDim = 0,
                  tolerance: float = 0.02, sweeps: int = 8) -> Balance:
    """:func:`balance` on a whole numpy cost array in this process (no communication):
    ``layout`` is the cost's layout on a mesh of any shape (simulated: no ranks needed), which
    gives the shard counts and the current extents. The same algorithm on the same numbers
    gives the same extents as :func:`balance` (profiles of integer-valued costs sum exactly
    in any order; other floats may differ in the last bits, and so in a tie)."""
    t0 = time.perf_counter()
    if not isinstance(layout, Layout):
        raise ValueError(f"pyshard.balance_array: layout must be a pyshard.Layout, got "
                         f"{type(layout).__name__}")
    if isinstance(cost, ShardedArray):
        raise ValueError("pyshard.balance_array: cost is a ShardedArray: balance_array takes "
                         "the whole cost as a numpy array in this process; pyshard.balance "
                         "takes a ShardedArray (collective)")
    a = np.asarray(cost)
    if a.shape != layout.shape:
        raise ValueError(f"pyshard.balance_array: the cost has shape {a.shape}, the layout "
                         f"{layout.shape}")
    dims, grain, least = _options(layout, multiple_of, min_size, tolerance, sweeps)
    a = np.asarray(a, np.float64)
    _check_values(a)
    # the current shards' costs, each box summed as balance() sums its local block
    before_max = 0.0
    for r in range(layout.mesh_size):
        box = layout.box(unravel(r, layout.mesh_shape))
        before_max = max(before_max, float(np.ascontiguousarray(a[box]).sum()))
    if not dims:
        return _result(layout, {}, before_max, before_max, before_max, before_max, 0, [],
                       tolerance, 0, t0)
    block = _reduced(a, layout, dims)
    src = _Source(block, [0] * len(dims), lambda g: g)
    lengths = [layout.shape[d] for d in dims]
    first = [src.profile(i, lengths, None)[:, 0] for i in range(len(dims))]
    src.collectives = 0
    found, found_max, bound, done, passes = _refine(src, layout, dims, grain, least, sweeps,
                                                    first)
    total = float(first[0].sum())
    return _result(layout, found, found_max, before_max, total, bound, done, passes,
                   tolerance, 0, t0, _breaks(layout, grain, least))


# ----------------------------------------------------------------------------- particles


def particle_cost(positions: Any, like: Any, origin: Any = 0.0, spacing: Any = 1.0,
                  periodic: Any = False, weight: Any = 1.0, base: float = 0.0,
                  mesh: Optional[Mesh] = None) -> ShardedArray:
    """The cost of each grid cell from the particles in it: ``base`` plus the sum of the
    ``weight`` (a number, or one per particle) of the particles whose cell it is, as a
    float64 :class:`~pyshard.ShardedArray` laid out as ``like`` (a ShardedArray, or a Layout
    with ``mesh=``); collective over the mesh (one small allreduce that agrees on errors).

    The cells are :func:`pyshard.owner`'s (``floor((x - origin) / spacing)``, periodic axes
    wrapped), and every particle must lie in this rank's box, as after a
    :func:`pyshard.migrate` to ``owner(positions, like)``; a particle elsewhere or a NaN
    raises ValueError on every rank. A PIC code rebalances in three calls: ``cost =
    particle_cost(x, grid)``, ``b = balance(cost)``, then ``grid.redistribute(b.placements,
    sizes=b.sizes)`` for each field and ``migrate(rows, owner(x, new_grid), mesh)``.

    On a Replicate mesh dim each replica group holds its own particles (``owner`` keeps each
    group's migration within it), and the replicas of a shard share its extents: the cost
    of a cell is then summed over the replicas (each replica's particles, and ``base`` once
    per replica), so the result is the same on every replica (a true Replicate array) and
    :func:`balance` minimises the largest shard's cost summed over its replicas. That is one
    more allreduce, over the Replicate mesh dims, where the layout has them.
    """
    layout: Layout = like if isinstance(like, Layout) else getattr(like, "layout", None)
    mesh = mesh if mesh is not None else getattr(like, "mesh", None)
    if not isinstance(layout, Layout) or not isinstance(mesh, Mesh):
        raise ValueError("pyshard.particle_cost: like must be a ShardedArray, or a Layout "
                         "with mesh=")
    if tuple(mesh.shape) != tuple(layout.mesh_shape):
        raise ValueError(f"pyshard.particle_cost: the layout is for a {layout.mesh_shape} "
                         f"mesh, the mesh is {tuple(mesh.shape)}")
    lay = Layout(layout.shape, np.float64, layout.mesh_shape, layout.placements,
                 layout.sizes)
    x = _backend.as_array(positions, "positions")
    if _backend.is_device(x):
        x = _backend.to_host(x)
    nd = lay.ndim
    # the arguments alone (the same on every rank): raised before any communication
    o_h_per = grid_params(origin, spacing, periodic, nd, "pyshard.particle_cost")
    err = ""
    if x.ndim != 2 or x.shape[1] != nd or x.dtype.kind != "f":
        err = f"positions must be (n, {nd}) floating point, got {x.dtype} {x.shape}"
    w = np.asarray(weight, np.float64)
    if not err and w.ndim and w.shape != (x.shape[0],):
        err = f"weight must be a number or one per particle ({x.shape[0]}), got {w.shape}"
    box = lay.box(mesh.coords)
    shape = lay.local_shape(mesh.coords)
    flat = np.zeros(0, np.int64)
    if not err:
        o, h, per = o_h_per
        ok = np.ones(x.shape[0], bool)
        local = []
        for k in range(nd):
            c = np.floor((x[:, k].astype(np.float64) - o[k]) / h[k])
            ok &= np.isfinite(c)
            c = np.nan_to_num(c, nan=-1.0, posinf=-1.0, neginf=-1.0)
            if per[k]:
                c = np.mod(c, lay.shape[k])
            c = c.astype(np.int64) - box[k].start
            ok &= (c >= 0) & (c < shape[k])
            local.append(np.where(ok, c, 0))
        nonfinite = ~np.isfinite(x).all(axis=1)
        if nonfinite.any():  # no cell at all: migrating cannot help
            i = int(np.flatnonzero(nonfinite)[0])
            err = (f"{int(nonfinite.sum())} of {x.shape[0]} particles are not finite (NaN or "
                   f"inf) (the first: {x[i].tolist()}): they have no cell")
        elif not ok.all():
            i = int(np.flatnonzero(~ok)[0])
            err = (f"{int((~ok).sum())} of {x.shape[0]} particles lie outside rank "
                   f"{mesh.rank}'s box {box} (the first: {x[i].tolist()}); migrate them to "
                   f"their owner first")
        elif x.shape[0]:
            flat = np.ravel_multi_index(tuple(local), shape)
    if not collectives.all_true(mesh.comm, not err):
        raise ValueError("pyshard.particle_cost: " + (err or "another rank's particles are "
                                                      "bad (its error says which)"))
    cells = prod(shape)
    if flat.size:
        counts = np.bincount(flat, weights=np.broadcast_to(w, flat.shape), minlength=cells)
    else:
        counts = np.zeros(cells)
    local_cost = counts.reshape(shape) + float(base)
    # each replica group counted its own particles: the cost of the shard is their sum, the
    # same on each replica (the layout is every rank's, so every rank takes this or not)
    reps = tuple(m for m, p in enumerate(lay.placements) if isinstance(p, Replicate))
    if reps and prod(lay.mesh_shape[m] for m in reps) > 1:
        local_cost = collectives.sum_all_array(mesh.sub_dims(reps), local_cost)
    return ShardedArray(np.ascontiguousarray(local_cost), lay, mesh)
