"""Planning a redistribution: pure Python, no MPI, identical on every rank.

``plan(src, dst)`` returns a :class:`Plan`: a short tuple of :class:`Step`, each one
collective on one communicator (the sub-communicator spanning some mesh dims) or a local
operation. Every count comes from box intersections of the two layouts' shard tables, so
no step ever asks another rank for a shape.

The rules (all decided from the layouts alone, so every rank decides the same):

1. Partial mesh dims of the source that the target does not keep are reduced first:
   ``Partial -> Shard(d)`` is one Reduce_scatter on that mesh dim when no other mesh dim
   shards ``d`` (the result lands directly in the target's shard extents);
   every other reduction is one Allreduce over the sub-communicator of all such mesh dims
   that share a reduction op.
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
3. Target Partial mesh dims that the source did not hold are made locally: ``sum`` keeps
   the value at coordinate 0 and zeros elsewhere; ``avg``, ``max`` and ``min`` keep it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from functools import lru_cache
from math import prod
from typing import Dict, List, Optional, Sequence, Tuple

from .layout import Layout, Partial, Replicate, Shard, placements_str

__all__ = ["Plan", "Step", "plan"]

Box = Tuple[Tuple[int, int], ...]
Coords = Tuple[int, ...]

COLLECTIVE_KINDS = ("alltoallv", "allgatherv", "allreduce", "reduce_scatter")


def _unravel(k: int, shape: Sequence[int]) -> List[int]:
    out = []
    for s in reversed(shape):
        k, r = divmod(k, s)
        out.append(r)
    return out[::-1]


def _ravel(coords: Sequence[int], shape: Sequence[int]) -> int:
    k = 0
    for c, s in zip(coords, shape):
        k = k * s + c
    return k


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


def _box_volume(box: Box) -> int:
    return prod(hi - lo for lo, hi in box)


@dataclass(frozen=True, eq=False)
class Step:
    """One step of a plan.

    kind: ``alltoallv``, ``allgatherv``, ``allreduce``, ``reduce_scatter`` (one collective
    on the sub-communicator spanning ``mesh_dims``), ``local_copy``, ``make_partial`` or
    ``relabel`` (a Partial mesh dim of size 1 read as Replicate: nothing to do); the last
    three communicate nothing. ``src`` and ``dst`` are the layouts the step starts from and ends
    at; every count of the step comes from them.
    """

    kind: str
    mesh_dims: Tuple[int, ...]
    src: Layout
    dst: Layout
    op: Optional[str] = None
    _cache: Dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def is_collective(self) -> bool:
        return self.kind in COLLECTIVE_KINDS

    @property
    def group_shape(self) -> Tuple[int, ...]:
        return tuple(self.src.mesh_shape[m] for m in self.mesh_dims)

    def group_rank(self, coords: Sequence[int]) -> int:
        """Rank of the rank at mesh ``coords`` in this step's sub-communicator."""
        return _ravel([coords[m] for m in self.mesh_dims], self.group_shape)

    def member(self, coords: Sequence[int], group_rank: int) -> Coords:
        """Mesh coords of member ``group_rank`` of the group that ``coords`` belongs to."""
        out = list(coords)
        for m, c in zip(self.mesh_dims, _unravel(group_rank, self.group_shape)):
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
                    for m, c in zip(mdims, _unravel(k, [src.mesh_shape[x] for x in mdims])):
                        sender[m] = c
            out.append((tuple(sender), tuple((lo, hi) for _, lo, hi in combo)))
        return out

    def sends(self, coords: Sequence[int]) -> List[Tuple[Coords, Box]]:
        """(receiver coords, global box) of every block the rank at ``coords`` sends."""
        src, dst = self.src, self.dst
        mesh = src.mesh_shape
        src_sharding = set(src.sharding_mesh_dims())
        dst_sharding = set(dst.sharding_mesh_dims())
        per_dim = []
        for d, (by_src, _) in enumerate(self._overlaps()):
            mdims = dst.table[d][0]
            shp = [mesh[x] for x in mdims]
            keep = []
            for k, lo, hi in by_src[src.shard_index(d, coords)]:
                cs = _unravel(k, shp)
                # a receiver takes its data from the replica that shares its coords on the
                # mesh dims the source does not shard
                if all(m in src_sharding or c == coords[m] for m, c in zip(mdims, cs)):
                    keep.append((tuple(zip(mdims, cs)), lo, hi))
            if not keep:
                return []
            per_dim.append(keep)
        free = [m for m in sorted(src_sharding - dst_sharding)]
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
                _unravel(k, sshape)[si] == _unravel(j, dshape)[di]
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
        """Bytes sent to other ranks in one execution, summed over all ranks and steps."""
        b = self._cache_get("bytes_moved")
        if b is None:
            b = sum(
                sent
                for coords in itertools.product(*[range(m) for m in self.src.mesh_shape])
                for sent, _ in self.rank_bytes(coords)
            )
            self._cache_set("bytes_moved", b)
        return b

    def _cache_get(self, key: str) -> object:
        return self.steps[0]._cache.get(("plan", key)) if self.steps else 0

    def _cache_set(self, key: str, value: object) -> None:
        if self.steps:
            self.steps[0]._cache[("plan", key)] = value

    def explain(self, coords: Optional[Sequence[int]] = None) -> str:
        """Readable text: each step, its collective and communicator, the bytes the rank at
        ``coords`` (default: mesh coords 0) sends and receives, and the maximum over ranks."""
        mesh = self.src.mesh_shape
        coords = tuple(coords) if coords is not None else (0,) * len(mesh)
        lines = [
            f"plan {placements_str(self.src.placements)} -> {placements_str(self.dst.placements)}"
            f" on mesh {'x'.join(map(str, mesh))}, array {self.src.shape} {self.src.dtype}",
            f"  {self.collectives} collective(s); {len(self.steps)} step(s)",
        ]
        all_coords = list(itertools.product(*[range(m) for m in mesh]))
        for i, s in enumerate(self.steps):
            sent, recvd = _step_bytes(s, coords)
            per = [_step_bytes(s, c) for c in all_coords]
            comm = (
                "mesh dims " + ",".join(map(str, s.mesh_dims)) + f" ({prod(s.group_shape)} ranks)"
                if s.mesh_dims
                else "no communicator"
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
        lines.append(f"  bytes moved over all ranks: {self.bytes_moved} B")
        return "\n".join(lines)

    def __str__(self) -> str:
        kinds = ", ".join(s.kind for s in self.steps) or "nothing"
        return (
            f"Plan({placements_str(self.src.placements)} -> "
            f"{placements_str(self.dst.placements)}: {kinds})"
        )


def _step_bytes(s: Step, coords: Coords) -> Tuple[int, int]:
    item = s.src.dtype.itemsize
    if s.kind == "alltoallv":
        sent = sum(_box_volume(b) for r, b in s.sends(coords) if r != coords)
        recvd = sum(_box_volume(b) for r, b in s.recvs(coords) if r != coords)
        return sent * item, recvd * item
    if s.kind == "allgatherv":
        mine = prod(s.src.local_shape(coords))
        total = prod(s.dst.local_shape(coords))
        n = prod(s.group_shape)
        return mine * (n - 1) * item, (total - mine) * item
    if s.kind in ("allreduce", "reduce_scatter"):
        # what a ring algorithm moves: (n-1)/n of the buffer each way (twice for allreduce)
        n = prod(s.group_shape)
        vol = prod(s.src.local_shape(coords)) * item
        f = 2 if s.kind == "allreduce" else 1
        moved = f * vol * (n - 1) // n
        return moved, moved
    return 0, 0


@lru_cache(maxsize=1024)
def plan(src: Layout, dst: Layout) -> Plan:
    """Plan the redistribution from layout ``src`` to layout ``dst`` (cached).

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
    pending = [m for m in cur.partial_mesh_dims() if cur.placements[m] != dst.placements[m]]
    allreduce: Dict[str, List[int]] = {}
    for m in pending:
        op = cur.placements[m].op
        tp = dst.placements[m]
        if cur.mesh_shape[m] == 1:  # one contribution: the value itself, nothing to reduce
            mid_pl = list(cur.placements)
            mid_pl[m] = Replicate()
            mid = Layout(cur.shape, cur.dtype, cur.mesh_shape, mid_pl, _sizes_of(cur, mid_pl))
            steps.append(Step("relabel", (m,), cur, mid))
            cur = mid
        elif isinstance(tp, Shard) and not cur.table[tp.dim][0] and dst.table[tp.dim][0] == (m,):
            mid_pl = list(cur.placements)
            mid_pl[m] = tp
            extra = {tp.dim: dst.table[tp.dim][1]}
            mid = Layout(
                cur.shape, cur.dtype, cur.mesh_shape, mid_pl, _sizes_of(cur, mid_pl, extra)
            )
            steps.append(Step("reduce_scatter", (m,), cur, mid, op))
            cur = mid
        else:
            allreduce.setdefault(op, []).append(m)
    for op, dims in allreduce.items():
        mid_pl = list(cur.placements)
        for m in dims:
            mid_pl[m] = Replicate()
        mid = Layout(cur.shape, cur.dtype, cur.mesh_shape, mid_pl, _sizes_of(cur, mid_pl))
        steps.append(Step("allreduce", tuple(sorted(dims)), cur, mid, op))
        cur = mid

    # 2. exchange to the target with its new Partial dims read as Replicate
    post = [
        m for m, p in enumerate(dst.placements) if isinstance(p, Partial) and cur.placements[m] != p
    ]
    eff_pl = list(dst.placements)
    for m in post:
        eff_pl[m] = Replicate()
    eff = Layout(dst.shape, dst.dtype, dst.mesh_shape, eff_pl, dst.sizes) if post else dst
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
