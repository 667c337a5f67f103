"""Planning a redistribution: pure Python, no MPI, identical on every rank.

``plan(src, dst)`` returns a :class:`Plan`: a short tuple of :class:`Step`, each one
collective on one communicator (the sub-communicator spanning some mesh dims) or a local
operation. Every count comes from box intersections of the two layouts' shard tables, so
no step ever asks another rank for a shape.

The rules (all decided from the layouts alone, so every rank decides the same):

1. Partial mesh dims of the source that the target does not keep are reduced first. The
   cost model is about bytes: a Reduce_scatter moves half the bytes of an Allreduce and
   leaves 1/n of the data for the exchange that follows, so a Partial mesh dim whose target
   is ``Shard`` is reduced with one Reduce_scatter on that mesh dim, onto the target's array
   dim when no other mesh dim shards it (landing directly in the target's extents), else
   onto the largest array dim nobody shards (the exchange then moves 1/n of the data).
   A Partial mesh dim whose target replicates (or is another Partial op) needs every value
   on every rank: one Allreduce over the sub-communicator of all such mesh dims that share
   a reduction op (one collective however many mesh dims).
2. The remaining change is one exchange over the sub-communicator spanning the mesh dims
   where a sender can differ from its receiver. Each destination block is sent by the rank
   that holds that source shard and shares the receiver's coordinates on every mesh dim the
   source does not shard, so replicas spread the load and a rank that already holds its data
   copies it locally. The exchange is

   - nothing, when the layouts are equal;
   - a local copy, when no data crosses ranks (``Replicate -> Shard``);
   - one Allgatherv, when every member of the communicator needs every member's whole
     shard (``Shard -> Replicate``);
   - otherwise one Alltoallv with counts from the box intersections.
3. Target Partial mesh dims that the source did not hold are made locally: from a
   replicated value, ``sum`` keeps the value at coordinate 0 and zeros elsewhere; ``avg``,
   ``max`` and ``min`` keep it. From a shard (``Shard(d) -> Partial(sum|max|min)`` on the
   same mesh dim), each rank places its shard in an array of the reduction's identity
   (0, the dtype's lowest, its highest; where Partial dims reduce before it, only at
   coordinate 0 of them, executor._fill_op): no communication at all.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from enum import Enum
from math import prod
from typing import Dict, List, Optional, Sequence, Tuple

from ._lru import memoize
from .blocks import workspace_bytes
from .layout import Layout, Partial, Replicate, Shard, placements_str, ravel, unravel

__all__ = ["Plan", "Step", "StepKind", "plan"]

Box = Tuple[Tuple[int, int], ...]
Coords = Tuple[int, ...]


class StepKind(str, Enum):
    """What a step does; compares equal to its name (``StepKind.alltoallv == "alltoallv"``)."""

    alltoallv = "alltoallv"
    allgatherv = "allgatherv"
    allreduce = "allreduce"
    reduce_scatter = "reduce_scatter"
    local_copy = "local_copy"
    make_partial = "make_partial"
    relabel = "relabel"

    def __str__(self) -> str:
        return self.value


COLLECTIVE_KINDS = (
    StepKind.alltoallv,
    StepKind.allgatherv,
    StepKind.allreduce,
    StepKind.reduce_scatter,
)


def _dim_overlaps(a: tuple, b: tuple) -> Tuple[List[list], List[list]]:
    """Overlaps of two partitions of one array dim (each ``(mesh_dims, extents, offsets)``).

    Returns (by_a, by_b): ``by_a[i]`` lists ``(j, lo, hi)`` for every shard j of b that
    overlaps shard i of a with positive length, and symmetrically.
    """
    _, aext, aoff = a
    _, bext, boff = b
    by_a: List[list] = [[] for _ in aext]
    by_b: List[list] = [[] for _ in bext]
    ai = [i for i in range(len(aext)) if aext[i] > 0]
    bi = [j for j in range(len(bext)) if bext[j] > 0]
    p = q = 0
    while p < len(ai) and q < len(bi):
        i, j = ai[p], bi[q]
        lo = max(aoff[i], boff[j])
        ahi, bhi = aoff[i] + aext[i], boff[j] + bext[j]
        hi = min(ahi, bhi)
        if hi > lo:
            by_a[i].append((j, lo, hi))
            by_b[j].append((i, lo, hi))
        if ahi <= bhi:
            p += 1
        else:
            q += 1
    return by_a, by_b


@dataclass(frozen=True, eq=False)
class Step:
    """One step of a plan.

    kind: ``alltoallv``, ``allgatherv``, ``allreduce``, ``reduce_scatter`` (one collective
    on the sub-communicator spanning ``mesh_dims``), ``local_copy``, ``make_partial`` or
    ``relabel`` (a Partial mesh dim of size 1 read as Replicate: nothing to do); the last
    three communicate nothing. ``src`` and ``dst`` are the layouts the step starts from and ends
    at; every count of the step comes from them.
    """

    kind: StepKind
    mesh_dims: Tuple[int, ...]
    src: Layout
    dst: Layout
    op: Optional[str] = None
    _cache: Dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", StepKind(self.kind))

    @property
    def is_collective(self) -> bool:
        return self.kind in COLLECTIVE_KINDS

    @property
    def group_shape(self) -> Tuple[int, ...]:
        return tuple(self.src.mesh_shape[m] for m in self.mesh_dims)

    def group_rank(self, coords: Sequence[int]) -> int:
        """Rank of the rank at mesh ``coords`` in this step's sub-communicator."""
        return ravel([coords[m] for m in self.mesh_dims], self.group_shape)

    def member(self, coords: Sequence[int], group_rank: int) -> Coords:
        """Mesh coords of member ``group_rank`` of the group that ``coords`` belongs to."""
        out = list(coords)
        for m, c in zip(self.mesh_dims, unravel(group_rank, self.group_shape)):
            out[m] = c
        return tuple(out)

    # -- exchange geometry (alltoallv, allgatherv, local_copy)
    def _overlaps(self) -> list:
        ov = self._cache.get("ov")
        if ov is None:
            ov = [_dim_overlaps(self.src.table[d], self.dst.table[d]) for d in range(self.src.ndim)]
            self._cache["ov"] = ov
        return ov

    def recvs(self, coords: Sequence[int]) -> List[Tuple[Coords, Box]]:
        """(sender coords, global box) of every block the rank at ``coords`` receives."""
        src, dst = self.src, self.dst
        per_dim = []
        for d, (_, by_dst) in enumerate(self._overlaps()):
            lst = by_dst[dst.shard_index(d, coords)]
            if not lst:
                return []
            per_dim.append(lst)
        out = []
        for combo in itertools.product(*per_dim):
            sender = list(coords)
            for d, (k, _, _) in enumerate(combo):
                mdims = src.table[d][0]
                if mdims:
                    for m, c in zip(mdims, unravel(k, [src.mesh_shape[x] for x in mdims])):
                        sender[m] = c
            out.append((tuple(sender), tuple((lo, hi) for _, lo, hi in combo)))
        return out

    def _send_lists(self, coords: Sequence[int]) -> Tuple[list, List[int]]:
        """Per array dim, the target shards the rank at ``coords`` sends to: a list of
        ``(((mesh_dim, coord), ...), lo, hi)``; and the mesh dims whose every coord receives.

        A receiver takes its data from the replica that shares its coords on the mesh dims the
        source does not shard; the lists are memoised per (dim, shard, those coords), so a
        mesh of thousands of ranks costs a few distinct lists, not one per rank.
        """
        src, dst = self.src, self.dst
        mesh = src.mesh_shape
        memo = self._cache.setdefault("send_lists", {})
        src_sharding = set(src.sharding_mesh_dims())
        per_dim = []
        for d, (by_src, _) in enumerate(self._overlaps()):
            mdims = dst.table[d][0]
            fixed = tuple(coords[m] if m not in src_sharding else -1 for m in mdims)
            ks = src.shard_index(d, coords)
            key = (d, ks, fixed)
            keep = memo.get(key)
            if keep is None:
                shp = [mesh[x] for x in mdims]
                keep = []
                for k, lo, hi in by_src[ks]:
                    cs = unravel(k, shp)
                    if all(f < 0 or c == f for f, c in zip(fixed, cs)):
                        keep.append((tuple(zip(mdims, cs)), lo, hi))
                keep = (keep, sum(hi - lo for _, lo, hi in keep))
                memo[key] = keep
            per_dim.append(keep)
        free = sorted(src_sharding - set(dst.sharding_mesh_dims()))
        return per_dim, free

    def max_block_volume(self) -> int:
        """An upper bound on the elements of any one block of this exchange, the same on
        every rank: the product over array dims of the longest overlap along that dim."""
        v = 1
        for by_src, _ in self._overlaps():
            v *= max((hi - lo for lst in by_src for _, lo, hi in lst), default=0)
        return v

    def max_peers(self) -> int:
        """An upper bound, the same on every rank, on the other ranks any one rank sends to
        in this exchange: per array dim the most target shards one source shard overlaps,
        times the mesh dims the source shards and the target does not, capped at the group
        size - 1."""
        v = self._cache.get("max_peers")
        if v is None:
            v = 1
            for by_src, _ in self._overlaps():
                v *= max((len(lst) for lst in by_src), default=0)
            free = set(self.src.sharding_mesh_dims()) - set(self.dst.sharding_mesh_dims())
            v *= prod(self.src.mesh_shape[m] for m in free)
            v = min(v, prod(self.group_shape) - 1)
            self._cache["max_peers"] = v
        return v

    def send_volume(self, coords: Sequence[int]) -> int:
        """Elements the rank at ``coords`` sends, itself included (no pair enumeration)."""
        per_dim, free = self._send_lists(coords)
        v = prod(total for _, total in per_dim)
        return v * prod(self.src.mesh_shape[m] for m in free)

    def sends(self, coords: Sequence[int]) -> List[Tuple[Coords, Box]]:
        """(receiver coords, global box) of every block the rank at ``coords`` sends."""
        lists, free = self._send_lists(coords)
        per_dim = [keep for keep, _ in lists]
        if not all(per_dim):
            return []
        mesh = self.src.mesh_shape
        out = []
        for combo in itertools.product(*per_dim):
            recv = list(coords)
            for assign, _, _ in combo:
                for m, c in assign:
                    recv[m] = c
            box = tuple((lo, hi) for _, lo, hi in combo)
            for fc in itertools.product(*[range(mesh[m]) for m in free]):
                for m, c in zip(free, fc):
                    recv[m] = c
                out.append((tuple(recv), box))
        return out


def _exchange_dims(src: Layout, dst: Layout) -> Tuple[int, ...]:
    """Mesh dims on which a sender may differ from its receiver (the exchange communicator)."""
    ov = [_dim_overlaps(src.table[d], dst.table[d]) for d in range(src.ndim)]
    out = []
    for m in src.sharding_mesh_dims():
        if src.mesh_shape[m] == 1:
            continue
        d = src.placements[m].dim
        smd, dmd = src.table[d][0], dst.table[d][0]
        if m in dmd:
            si, di = smd.index(m), dmd.index(m)
            sshape = [src.mesh_shape[x] for x in smd]
            dshape = [dst.mesh_shape[x] for x in dmd]
            by_src = ov[d][0]
            same = all(
                unravel(k, sshape)[si] == unravel(j, dshape)[di]
                for k, lst in enumerate(by_src)
                for j, _, _ in lst
            )
            if same:
                continue
        out.append(m)
    return tuple(out)


def _is_allgather(src: Layout, dst: Layout, dims: Tuple[int, ...]) -> bool:
    """Does every member of each group need every member's whole source box?"""
    if any(isinstance(dst.placements[m], Shard) for m in dims):
        return False
    mesh = src.mesh_shape
    others = [m for m in range(len(mesh)) if m not in dims]
    for oc in itertools.product(*[range(mesh[m]) for m in others]):
        base = [0] * len(mesh)
        for m, c in zip(others, oc):
            base[m] = c
        dbox = [dst.interval(d, base) for d in range(dst.ndim)]
        total = 0
        for gc in itertools.product(*[range(mesh[m]) for m in dims]):
            for m, c in zip(dims, gc):
                base[m] = c
            sbox = [src.interval(d, base) for d in range(src.ndim)]
            vol = prod(hi - lo for lo, hi in sbox)
            if vol and any(lo < dl or hi > dh for (lo, hi), (dl, dh) in zip(sbox, dbox)):
                return False
            total += vol
        if total != prod(hi - lo for lo, hi in dbox):
            return False
    return True


@dataclass(frozen=True, eq=False)
class Plan:
    """An immutable, cached redistribution from ``src`` to ``dst``: a tuple of steps."""

    src: Layout
    dst: Layout
    steps: Tuple[Step, ...]

    @property
    def collectives(self) -> int:
        """Number of collective calls one execution makes (on every rank)."""
        return sum(1 for s in self.steps if s.is_collective)

    def rank_bytes(self, coords: Sequence[int]) -> List[Tuple[int, int]]:
        """(bytes sent, bytes received) to and from other ranks, per step, at ``coords``."""
        return [_step_bytes(s, tuple(coords)) for s in self.steps]

    @property
    def bytes_moved(self) -> int:
        """Bytes sent to other ranks in one execution, summed over all ranks and steps
        (reductions counted as a ring algorithm moves them). O(ranks), no pair enumeration."""
        b = self._cache_get("bytes_moved")
        if b is None:
            b = 0
            for coords in itertools.product(*[range(m) for m in self.src.mesh_shape]):
                for s in self.steps:
                    b += _step_recv_bytes(s, coords)
            self._cache_set("bytes_moved", b)
        return b

    def peak_extra_bytes(self, coords: Sequence[int]) -> int:
        """Peak memory one execution allocates at ``coords`` beyond its input: each step's
        output and pack/unpack workspace (the core's rule, :func:`pyshard.blocks.workspace_bytes`),
        plus the previous step's output while it is read."""
        peak, held = 0, 0
        for s in self.steps:
            out = _step_out_bytes(s, tuple(coords))
            peak = max(peak, held + out + workspace_bytes(s, tuple(coords)))
            held = out
        return peak

    def _cache_get(self, key: str) -> object:
        return self.steps[0]._cache.get(("plan", key)) if self.steps else 0

    def _cache_set(self, key: str, value: object) -> None:
        if self.steps:
            self.steps[0]._cache[("plan", key)] = value

    def explain(
        self,
        coords: Optional[Sequence[int]] = None,
        notes: Sequence[Optional[str]] = (),
        tail: Sequence[str] = (),
    ) -> str:
        """Readable text of what the plan says: each step, its collective and communicator,
        the bytes the rank at ``coords`` (default: mesh coords 0) sends and receives, the
        maximum over ranks, the peak extra memory and the bytes moved over all ranks.

        ``notes``: a line per step (None for none), printed under it; ``tail``: lines printed
        last. :func:`pyshard.explain.explain` passes where each step goes (the rule in words,
        or the path on a given mesh) and how GPU arrays reach MPI, which depend on the
        settings and the core, not on the plan."""
        mshape = self.src.mesh_shape
        coords = tuple(coords) if coords is not None else (0,) * len(mshape)
        lines = [
            f"plan {placements_str(self.src.placements)} -> {placements_str(self.dst.placements)}"
            f" on mesh {'x'.join(map(str, mshape))}, array {self.src.shape} {self.src.dtype}",
            f"  {self.collectives} collective(s); {len(self.steps)} step(s)",
        ]
        all_coords = list(itertools.product(*[range(m) for m in mshape]))
        for i, s in enumerate(self.steps):
            sent, recvd = _step_bytes(s, coords)
            per = [_step_bytes(s, c) for c in all_coords]
            comm = (
                "mesh dims " + ",".join(map(str, s.mesh_dims)) + f" ({prod(s.group_shape)} ranks)"
                if s.is_collective
                else "no communication"
            )
            op = f" op={s.op}" if s.op else ""
            lines.append(
                f"  step {i}: {s.kind}{op} on {comm}: "
                f"{placements_str(s.src.placements)} -> {placements_str(s.dst.placements)}"
            )
            lines.append(
                f"    rank {coords}: sends {sent} B, receives {recvd} B; "
                f"max over ranks: sends {max(p[0] for p in per)} B, "
                f"receives {max(p[1] for p in per)} B"
            )
            if s.kind == "alltoallv":
                lines.append(f"    messages: at most {s.max_peers()} peers per rank")
            note = notes[i] if i < len(notes) else None
            if note is not None:
                lines.append(f"    {note}")
        peak = self.peak_extra_bytes(coords)
        peak_max = max(self.peak_extra_bytes(c) for c in all_coords)
        lines.append(
            f"  peak extra memory: rank {coords} {peak} B, max over ranks {peak_max} B "
            f"(outputs and pack/unpack buffers)"
        )
        lines.append(f"  bytes moved over all ranks: {self.bytes_moved} B")
        lines.extend("  " + t for t in tail)
        return "\n".join(lines)

    def __str__(self) -> str:
        kinds = ", ".join(s.kind for s in self.steps) or "nothing"
        return (
            f"Plan({placements_str(self.src.placements)} -> "
            f"{placements_str(self.dst.placements)}: {kinds})"
        )


def _vol(layout: Layout, coords: Coords) -> int:
    return prod(layout.local_shape(coords))


def _overlap_vol(a: Layout, b: Layout, coords: Coords) -> int:
    v = 1
    for d in range(a.ndim):
        (alo, ahi), (blo, bhi) = a.interval(d, coords), b.interval(d, coords)
        v *= max(0, min(ahi, bhi) - max(alo, blo))
    return v


def _ring(s: Step, coords: Coords) -> int:
    # what a ring algorithm moves: (n-1)/n of the buffer each way (twice for allreduce)
    n = prod(s.group_shape)
    vol = _vol(s.src, coords) * s.src.dtype.itemsize
    return (2 if s.kind == "allreduce" else 1) * vol * (n - 1) // n


def _step_recv_bytes(s: Step, coords: Coords) -> int:
    """Bytes the rank at ``coords`` receives from other ranks in step ``s`` (O(ndim))."""
    item = s.src.dtype.itemsize
    if s.kind == "alltoallv":  # all of its target box but what it holds itself
        return (_vol(s.dst, coords) - _overlap_vol(s.src, s.dst, coords)) * item
    if s.kind == "allgatherv":
        return (_vol(s.dst, coords) - _vol(s.src, coords)) * item
    if s.kind in ("allreduce", "reduce_scatter"):
        return _ring(s, coords)
    return 0


def _step_bytes(s: Step, coords: Coords) -> Tuple[int, int]:
    """(bytes sent to, bytes received from) other ranks at ``coords`` in step ``s``."""
    item = s.src.dtype.itemsize
    recvd = _step_recv_bytes(s, coords)
    if s.kind == "alltoallv":
        sent = s.send_volume(coords) - _overlap_vol(s.src, s.dst, coords)
        return sent * item, recvd
    if s.kind == "allgatherv":
        return _vol(s.src, coords) * (prod(s.group_shape) - 1) * item, recvd
    return recvd, recvd


def _step_out_bytes(s: Step, coords: Coords) -> int:
    if s.kind == "relabel":
        return 0
    return _vol(s.dst, coords) * s.dst.dtype.itemsize


def _commute(a: str, b: str) -> bool:
    """Do reductions by ops ``a`` and ``b`` over two mesh dims give the same in either order?"""
    return a == b or {a, b} <= {"sum", "avg"}


@memoize
def plan(src: Layout, dst: Layout) -> Plan:
    """Plan the redistribution from layout ``src`` to layout ``dst`` (cached, bounded by
    :func:`pyshard.set_cache_limit`).

    Both layouts must describe the same global shape and dtype on the same mesh shape.
    """
    if not isinstance(src, Layout) or not isinstance(dst, Layout):
        raise TypeError("plan(src, dst) takes two Layout objects")
    if src.shape != dst.shape or src.dtype != dst.dtype:
        raise ValueError(
            f"plan: source {src.shape} {src.dtype} and target {dst.shape} {dst.dtype} differ"
        )
    if src.mesh_shape != dst.mesh_shape:
        raise ValueError(f"plan: mesh shapes differ: {src.mesh_shape} vs {dst.mesh_shape}")
    steps: List[Step] = []
    cur = src
    if src == dst:
        return Plan(src, dst, ())

    # 1. reduce the source's Partial mesh dims that the target does not keep
    # Mesh dims with different ops reduce in mesh-dim order (dim 0 first: max over dim 0 of
    # sums over dim 1 is not the sum of the maxima), whatever the target: an allreduce waits
    # for later dims of its own op only, and goes before a later dim's other op.
    # A Partial dim the target keeps is reduced too where a later pending dim's op does not
    # commute with its own (sum and avg commute; max, min only with themselves): the kept
    # max of [P(max), P(sum)] -> [P(max), R] would otherwise be taken after the sum. Step 3
    # makes the target's Partial dim again, locally.
    partial = cur.partial_mesh_dims()
    pending = [m for m in partial if cur.placements[m] != dst.placements[m]]
    grew = True
    while grew:
        grew = False
        for k in partial:
            if k not in pending and any(
                    m > k and not _commute(cur.placements[k].op, cur.placements[m].op)
                    for m in pending):
                pending = sorted(pending + [k])
                grew = True
    allreduce: Dict[str, List[int]] = {}

    def flush(before: Optional[str]) -> None:  # the allreduces of ops other than `before`
        nonlocal cur
        for op in [o for o in allreduce if o != before]:
            mid_pl = list(cur.placements)
            for m in allreduce[op]:
                mid_pl[m] = Replicate()
            mid = _mid(cur, mid_pl)
            steps.append(Step("allreduce", tuple(sorted(allreduce.pop(op))), cur, mid, op))
            cur = mid

    for m in pending:
        op = cur.placements[m].op
        tp = dst.placements[m]
        if cur.mesh_shape[m] == 1:  # one contribution: the value itself, nothing to reduce
            mid_pl = list(cur.placements)
            mid_pl[m] = Replicate()
            mid = _mid(cur, mid_pl)
            steps.append(Step("relabel", (m,), cur, mid))
            cur = mid
        elif not isinstance(tp, (Replicate, Partial)) and _rs_dim(cur, tp) is not None:
            flush(op)
            d = _rs_dim(cur, tp)
            mid_pl = list(cur.placements)
            mid_pl[m] = Shard(d)
            # land in the target's extents when the target shards d by this mesh dim alone
            extra = {d: dst.table[d][1]} if dst.table[d][0] == (m,) else None
            mid = _mid(cur, mid_pl, extra)
            steps.append(Step("reduce_scatter", (m,), cur, mid, op))
            cur = mid
        else:
            flush(op)
            allreduce.setdefault(op, []).append(m)
    flush(None)

    # 2. exchange to the target with its new Partial dims read as Replicate
    post = [
        m for m, p in enumerate(dst.placements) if isinstance(p, Partial) and cur.placements[m] != p
    ]
    # A target Partial(sum|max|min) mesh dim that the source shards (alone along that array
    # dim) needs no data at all: each rank keeps its shard inside an array of the reduction's
    # identity ("spread"). Other new Partial dims are reached as Replicate, then kept (or
    # zeroed, for sum, away from coordinate 0).
    ops = {dst.placements[m].op for m in post}
    spread = []
    if len(ops) == 1 and ops <= {"sum", "max", "min"}:
        for m in post:
            p = cur.placements[m]
            if isinstance(p, Shard) and cur.table[p.dim][0] == (m,) and not dst.table[p.dim][0]:
                spread.append(m)
    eff_pl = list(dst.placements)
    eff_sizes = dict(dst.sizes)
    for m in post:
        eff_pl[m] = cur.placements[m] if m in spread else Replicate()
        if m in spread:
            eff_sizes[cur.placements[m].dim] = cur.table[cur.placements[m].dim][1]
    eff = Layout(dst.shape, dst.dtype, dst.mesh_shape, eff_pl, eff_sizes) if post else dst
    if cur != eff:
        dims = _exchange_dims(cur, eff)
        if not dims:
            steps.append(Step("local_copy", (), cur, eff))
        elif _is_allgather(cur, eff, dims):
            steps.append(Step("allgatherv", dims, cur, eff))
        else:
            steps.append(Step("alltoallv", dims, cur, eff))
        cur = eff

    # 3. make the target's new Partial dims locally
    if post:
        steps.append(Step("make_partial", tuple(post), cur, dst))
    return Plan(src, dst, tuple(steps))


def _rs_dim(cur: Layout, target: Shard) -> Optional[int]:
    """The array dim a Reduce_scatter should split: the target's dim when no mesh dim shards
    it yet, else the largest array dim that no mesh dim shards, else None."""
    free = [d for d in range(cur.ndim) if not cur.table[d][0]]
    if target.dim in free:
        return target.dim
    if not free:
        return None
    return max(free, key=lambda d: (cur.shape[d], -d))


def _mid(
    cur: Layout, placements: Sequence, extra: Optional[Dict[int, Sequence[int]]] = None
) -> Layout:
    """The intermediate layout of ``cur``'s array as ``placements``, keeping ``cur``'s extents
    wherever the sharding mesh dims are unchanged (plus ``extra``)."""
    sizes = _sizes_of(cur, placements, extra)
    return Layout(cur.shape, cur.dtype, cur.mesh_shape, placements, sizes)


def _sizes_of(
    layout: Layout, placements: Sequence, extra: Optional[Dict[int, Sequence[int]]] = None
) -> Dict[int, Tuple[int, ...]]:
    """Sizes for ``placements`` that keep ``layout``'s extents on every array dim whose
    sharding mesh dims are unchanged (plus ``extra``)."""
    out: Dict[int, Tuple[int, ...]] = {}
    for d, (mdims, ext, _) in enumerate(layout.table):
        nd = tuple(m for m, p in enumerate(placements) if p == Shard(d))
        if mdims and nd == mdims:
            out[d] = ext
    if extra:
        out.update({d: tuple(v) for d, v in extra.items()})
    return out
