"""Many arrays changing layout together, in as few collectives as one: a model's parameters,
a checkpoint's arrays. :func:`redistribute_many` plans each array as usual; the arrays whose
plan is one exchange on the same communicator (every ``Shard -> Shard`` transpose and
rebalance of a 1-D mesh, the per-mesh-dim exchanges of an N-D one) are fused into a single
``MPI_Alltoallv`` carrying, per peer, every array's block for that peer; the others run one
after another. Where the ranks of that communicator share a node (host arrays,
:mod:`pyshard._shm`), all those exchanges can instead go through node-shared memory in
batches, one handshake each, every block written once straight into its result: under
``auto`` (and ``tune``, which goes as ``auto`` here) where their largest blocks for one peer,
added up, reach ``PYSHARD_SHM_MIN_BYTES`` (:func:`pyshard.route.batch_route`), under ``shm``
whatever their size. :class:`ManyPlan` is the pure plan (no MPI), cached and explainable.
"""

from __future__ import annotations

import copy
import logging
from math import prod
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from . import _backend as bk
from . import _core, _validate, config
from ._cache import LRU, memoize
from .array import ShardedArray
from .exchange import NONBLOCKING_MIN_BLOCK, Exchange, default_algorithm
from .executor import executors
from .geometry import geometry, push_specs
from .layout import Placed, Placement, PlacementsArg, placements_str
from .memory import allocate
from .mesh import Mesh
from .planner import Plan, plan
from .route import Route, batch_route, check_algorithm, core_transport

__all__ = ["FusedExchange", "ManyPlan", "ShmFusedExchange", "plan_many", "redistribute_many"]

log = logging.getLogger("pyshard")


# Fused: arrays of less than FUSE_MAX_BYTES per rank, in batches of about BATCH_BYTES per
# rank. Measured (200 arrays, 2 and 4 ranks, docs/performance.md): fusing small arrays is
# 2-3x faster than a loop (their calls are latency); fusing large ones was up to 2x slower
# (a fused message is unpacked from the receive buffer, where an array's own exchange
# receives its contiguous blocks in place, and the batch leaves the cache).
# (PYSHARD_MANY_FUSE_MAX_BYTES and PYSHARD_MANY_BATCH_BYTES, pyshard.config; a plan is
# memoised under the values it was made with, so a change reaches the next call)
# Node-shared memory (pyshard/_shm.py), where ranks of the communicator share a node and
# pyshard.route.batch_route takes it (auto: the arrays' largest blocks for one peer, added up,
# reach PYSHARD_SHM_MIN_BYTES; shm: always): every array whose plan is one exchange, large
# ones too (nothing is packed or unpacked: each block is written once, straight into its
# result), in batches of about SHM_BATCH_BYTES per rank,
# each batch one handshake with each node peer. A batch's results share one segment of
# node-shared memory: it returns to the pool when the last of them is freed
# (PYSHARD_MANY_SHM_BATCH_BYTES).
SHM_ALIGN = 64  # bytes: where each result of a batch starts


def _batches(plans: Sequence[Plan], ix: Sequence[int], dims: Tuple[int, ...], per_rank: int
             ) -> List[Tuple[Tuple[int, ...], Tuple[int, ...]]]:  # fmt: skip
    """``ix`` in batches of about ``per_rank`` bytes per rank, decided from global sizes
    (the same on every rank): each array counts its bytes over the ranks, rounded up, so an
    array smaller than one byte a rank still counts one (with ``per_rank`` 1, every array is
    a batch of its own, at any rank count)."""
    if not ix:
        return []
    ranks = prod(plans[ix[0]].src.mesh_shape[m] for m in dims)
    out: List[Tuple[Tuple[int, ...], Tuple[int, ...]]] = []
    batch: List[int] = []
    size = 0
    for i in ix:
        batch.append(i)
        lay = plans[i].src
        size += -(-prod(lay.shape) * lay.dtype.itemsize // ranks)
        if size >= per_rank:
            out.append((dims, tuple(batch)))
            batch, size = [], 0
    if batch:
        out.append((dims, tuple(batch)))
    return out

ArraysArg = Union[Sequence[ShardedArray], Mapping[Any, ShardedArray]]
PlacementsLike = Union[PlacementsArg, Sequence[PlacementsArg], Mapping[Any, PlacementsArg]]


class ManyPlan:
    """The plan of many redistributions on one mesh: each array's :class:`~pyshard.Plan`,
    and which of them share one fused exchange. ``fused``: ``(mesh dims, array indices)``
    per fused collective (arrays of one communicator with less than
    ``PYSHARD_MANY_FUSE_MAX_BYTES`` per rank, default 256 KiB, in batches of about
    ``PYSHARD_MANY_BATCH_BYTES`` per rank, default 4 MiB); ``single``: the indices that run
    on their own, in order. Where the ranks of a communicator share a node (host arrays) and
    :func:`pyshard.route.batch_route` takes node-shared memory for that communicator's
    exchanges (``auto``, and ``tune`` as ``auto``: where :meth:`block_bytes` reaches
    ``PYSHARD_SHM_MIN_BYTES``, 16 KiB by default; ``shm``: always), ``shm_batches`` replace
    both for the arrays whose plan is one exchange: ``(mesh dims, array indices)`` per batch
    of about ``PYSHARD_MANY_SHM_BATCH_BYTES`` per rank (default 64 MiB), each one handshake
    through node-shared memory. ``limits``: those three sizes in that order (None: the
    settings' values now)."""

    __slots__ = ("plans", "fused", "single", "exchanges", "shm_batches", "_block_bytes")

    def __init__(self, plans: Sequence[Plan], limits: Optional[Tuple[int, int, int]] = None
                 ) -> None:  # fmt: skip
        fuse_max, batch, shm_batch = many_limits() if limits is None else limits
        self.plans = tuple(plans)
        groups: Dict[Tuple[int, ...], List[int]] = {}
        exchanges: Dict[Tuple[int, ...], List[int]] = {}
        single = []
        for i, p in enumerate(self.plans):
            one = len(p.steps) == 1 and p.steps[0].kind == "alltoallv"
            if one:
                exchanges.setdefault(p.steps[0].mesh_dims, []).append(i)
            if one and (
                prod(p.src.shape) * p.src.dtype.itemsize
                < fuse_max * prod(p.steps[0].group_shape)
            ):
                groups.setdefault(p.steps[0].mesh_dims, []).append(i)
            else:
                single.append(i)
        # MPI batches: one fused collective per batch keeps each batch's pack, transfer and
        # unpack in cache (a 248 MiB batch ran 2x slower than one call per array)
        fused = []
        for dims, ix in sorted(groups.items()):
            fused += _batches(self.plans, ix, dims, batch)
        self.fused = tuple(fused)
        self.single = tuple(single)
        self.exchanges = tuple(sorted((d, tuple(ix)) for d, ix in exchanges.items()))
        shm = []
        for dims, ix in self.exchanges:
            shm += _batches(self.plans, ix, dims, shm_batch)
        self.shm_batches = tuple(shm)
        # per communicator: its exchanges' largest blocks for one peer, added up
        self._block_bytes = {
            dims: sum(
                self.plans[i].steps[0].max_block_volume() * self.plans[i].src.dtype.itemsize
                for i in ix
            )
            for dims, ix in self.exchanges
        }

    def block_bytes(self, dims: Tuple[int, ...]) -> int:
        """The blocks for one peer of the single exchanges on ``dims``, added up: what
        :func:`pyshard.route.batch_route` weighs for them (a batch is one handshake, as a single
        exchange is)."""
        return self._block_bytes.get(dims, 0)

    @property
    def collectives(self) -> int:
        """Collectives per call: one per fused group, plus the others' own."""
        return len(self.fused) + sum(self.plans[i].collectives for i in self.single)

    def explain(self, coords: Optional[Sequence[int]] = None) -> str:
        """Readable text: the fused exchanges (arrays, bytes at ``coords``) and the rest."""
        n = len(self.plans)
        unfused = sum(p.collectives for p in self.plans)
        lines = [
            f"redistribute_many: {n} array(s), {self.collectives} collective(s) "
            f"(one by one: {unfused})"
        ]
        if not n:
            return lines[0]
        mesh = self.plans[0].src.mesh_shape
        coords = tuple(coords) if coords is not None else (0,) * len(mesh)
        for dims, ix in self.fused:
            sent = sum(self.plans[i].rank_bytes(coords)[0][0] for i in ix)
            recvd = sum(self.plans[i].rank_bytes(coords)[0][1] for i in ix)
            lines.append(
                f"  one alltoallv on mesh dims {','.join(map(str, dims))} for {len(ix)} "
                f"array(s) {list(ix)[:8]}{' ...' if len(ix) > 8 else ''}: rank {coords} sends "
                f"{sent} B, receives {recvd} B"
            )
        if self.shm_batches:
            k = sum(len(ix) for _, ix in self.shm_batches)
            lines.append(
                f"  where the ranks share a node (host arrays) and, under auto, the blocks "
                f"for one peer add up to PYSHARD_SHM_MIN_BYTES: {len(self.shm_batches)} "
                f"batch(es) through node-shared memory for the {k} single-exchange array(s), "
                "one handshake each, in place of those arrays' exchanges above"
            )
        for i in self.single:
            p = self.plans[i]
            kinds = ", ".join(s.kind for s in p.steps) or "nothing"
            lines.append(
                f"  array {i}: {placements_str(p.src.placements)} -> "
                f"{placements_str(p.dst.placements)} on its own ({kinds})"
            )
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"ManyPlan({len(self.plans)} arrays, {self.collectives} collectives)"


def many_limits() -> Tuple[int, int, int]:
    """``PYSHARD_MANY_FUSE_MAX_BYTES``, ``PYSHARD_MANY_BATCH_BYTES`` and
    ``PYSHARD_MANY_SHM_BATCH_BYTES`` as they are now."""
    return (config.get("PYSHARD_MANY_FUSE_MAX_BYTES"), config.get("PYSHARD_MANY_BATCH_BYTES"),
            config.get("PYSHARD_MANY_SHM_BATCH_BYTES"))  # fmt: skip


@memoize
def _plan_with(plans: Tuple[Plan, ...], limits: Tuple[int, int, int]) -> ManyPlan:
    return ManyPlan(plans, limits)


def _many(plans: Tuple[Plan, ...]) -> ManyPlan:
    """The plan of ``plans`` under the batching settings as they are now (memoised under
    them: a changed setting makes the next call's plan)."""
    return _plan_with(plans, many_limits())


def _items(arrays: ArraysArg, call: str = "redistribute_many"
           ) -> Tuple[List[Any], List[ShardedArray], bool]:
    if isinstance(arrays, Mapping):
        keys = list(arrays.keys())
        return keys, [arrays[k] for k in keys], True
    if isinstance(arrays, (list, tuple)):
        return list(range(len(arrays))), list(arrays), False
    raise TypeError(
        f"{call}: arrays must be a list, tuple or dict of ShardedArray, got "
        f"{type(arrays).__name__}"
    )


def _per_array(
    what: str, keys: List[Any], xs: List[ShardedArray], value: Any, is_map: bool, default: Any,
    call: str = "redistribute_many",
) -> list:
    """``value`` per array: a dict (dict containers) or list (list containers) matching
    ``arrays``; ``None`` gives ``default`` to every array."""
    if value is None:
        return [default] * len(xs)
    if is_map and isinstance(value, Mapping):
        extra = [k for k in value if k not in set(keys)]
        if extra:
            raise ValueError(f"{call}: {what} names arrays not in arrays: {extra[:5]}")
        return [value.get(k, default) for k in keys]
    if not is_map and isinstance(value, (list, tuple)):
        if len(value) != len(xs):
            raise ValueError(f"{call}: {len(value)} {what} for {len(xs)} arrays")
        return list(value)
    raise TypeError(
        f"{call}({what}): expected a {'dict' if is_map else 'list'} matching "
        f"arrays, got {type(value).__name__}"
    )


def _targets(
    keys: List[Any], xs: List[ShardedArray], placements: Any, is_map: bool, sizes: Any = None,
    call: str = "redistribute_many",
) -> list:
    """One target layout per array: ``placements`` is one placement list for all, or a list
    (dict) matching ``arrays``; ``sizes`` a list (dict) of ``{array_dim: extents}``."""
    if is_map and isinstance(placements, Mapping):
        missing = [k for k in keys if k not in placements]
        extra = [k for k in placements if k not in set(keys)]
        if missing or extra:
            raise ValueError(
                f"{call}: placements name other arrays than arrays (missing "
                f"{missing[:5]}, extra {extra[:5]})"
            )
        per = [placements[k] for k in keys]
    elif (
        not is_map
        and isinstance(placements, (list, tuple))
        and placements
        and all(isinstance(p, (list, tuple)) for p in placements)
    ):
        if len(placements) != len(xs):
            raise ValueError(
                f"{call}: {len(placements)} placement lists for {len(xs)} arrays"
            )
        per = list(placements)
    else:
        per = [placements] * len(xs)
    per_sizes = _per_array("sizes", keys, xs, sizes, is_map, None, call)
    return [x.target_layout(pl, sz) for x, pl, sz in zip(xs, per, per_sizes)]


def _check_no_arrays(placements: Any, is_map: bool, sizes: Any) -> None:
    """What :func:`_targets` would check of ``placements`` and ``sizes`` for no arrays (no
    mesh: the placements' kinds and the containers' shapes, not their count or dims)."""
    if is_map and isinstance(placements, Mapping):
        if placements:
            raise ValueError(
                f"redistribute_many: placements name other arrays than arrays (missing [], "
                f"extra {list(placements)[:5]})"
            )
    elif (
        not is_map
        and isinstance(placements, (list, tuple))
        and placements
        and all(isinstance(p, (list, tuple)) for p in placements)
    ):
        raise ValueError(f"redistribute_many: {len(placements)} placement lists for 0 arrays")
    else:
        if isinstance(placements, Placement) or not isinstance(placements, (list, tuple)):
            raise TypeError(
                f"placements must be a list of Shard/Replicate/Partial, one per mesh dim, "
                f"got {placements!r}"
            )
        for i, p in enumerate(placements):
            if not isinstance(p, Placement):
                raise TypeError(
                    f"placements[{i}] must be Shard(dim), Replicate() or Partial(op), got {p!r}"
                )
    _per_array("sizes", [], [], sizes, is_map, None)


def _check_arrays(keys: List[Any], xs: List[Any], mesh: Any, call: str = "redistribute_many"
                  ) -> bool:
    """Every item a ShardedArray on ``mesh`` whose ``.local`` has its layout's dtype, all on
    the host or all on a GPU (which: the result); TypeError or ValueError naming the first
    that is not. This rank's facts, as redistribute's checks: the fused and node-shared
    batches move the layout's bytes, so they would read past such an array."""
    first = keys[0]
    for k, x in zip(keys, xs):
        if not isinstance(x, ShardedArray):
            raise TypeError(
                f"{call}: arrays[{k!r}] is a {type(x).__name__}, not a ShardedArray"
            )
        if x.mesh is not mesh:
            raise ValueError(
                f"{call}: arrays[{k!r}] lies on another mesh than "
                f"arrays[{first!r}]; every array must share one Mesh"
            )
        dt = x.local.dtype
        if dt is not x.layout.dtype and dt != x.layout.dtype:
            raise TypeError(
                f"{call}: arrays[{k!r}]'s local array has dtype {dt}, its layout "
                f"{x.layout.dtype} (was .local replaced by an array of another dtype? "
                f"ShardedArray.wrap the new array with a layout of its dtype)")
    if all(type(x.local) is np.ndarray for x in xs):
        return False
    devs = {bk.is_device(x.local) for x in xs}
    if len(devs) > 1:
        raise TypeError(f"{call}: mixes host and GPU arrays; pass one kind")
    return devs.pop()


def _wrong_shape(keys: List[Any], xs: List[ShardedArray], mesh: Mesh) -> Optional[str]:
    """The message for the first array whose ``.local`` does not have its layout's shape
    at this rank's coords, or None (a few microseconds an array: run in validation mode,
    and where the core refused a shape)."""
    for k, x in zip(keys, xs):
        want = x.layout.local_shape(mesh.coords)
        if tuple(x.local.shape) != want:
            return (f"redistribute_many: arrays[{k!r}]'s local array has shape "
                    f"{tuple(x.local.shape)}, its layout puts {want} at mesh coords "
                    f"{mesh.coords} (was .local replaced by an array of another shape? "
                    f"from_local or ShardedArray.wrap the new array with a layout of its own)")
    return None


def plan_many(arrays: ArraysArg, placements: PlacementsLike, sizes: Any = None) -> ManyPlan:
    """The (cached) :class:`ManyPlan` that :func:`redistribute_many` would run; no
    communication."""
    keys, xs, is_map = _items(arrays, "plan_many")
    if xs:
        mesh = next((x.mesh for x in xs if isinstance(x, ShardedArray)), None)
        _check_arrays(keys, xs, mesh, "plan_many")
    targets = _targets(keys, xs, placements, is_map, sizes, "plan_many")
    return _many(tuple(plan(x.layout, t) for x, t in zip(xs, targets)))


class FusedExchange(Exchange):
    """A fused batch's :class:`Exchange` bound to this rank and memory kind, on the MPI
    transport of its batch's route (kept in the mesh's cache)."""

    __slots__ = ("out_shapes", "dtypes", "pooled")

    def __init__(self, plans: Sequence[Plan], mesh: Mesh, dev: bool, r: Route) -> None:
        super().__init__("many", r)
        coords = mesh.coords
        steps = [p.steps[0] for p in plans]
        parts = [geometry(s, coords, _core.Algorithm.alltoallv) for s in steps]
        g = _core.FusedGeometry(parts)
        # the largest message over all ranks decides Ialltoallv, identically everywhere
        big = sum(s.max_block_volume() * s.src.dtype.itemsize for s in steps)
        comm = mesh.core_comm(steps[0].mesh_dims)
        self.core = _core.FusedExchangeStep(
            comm, g, mesh.cache.workspace, core_transport(r), big >= NONBLOCKING_MIN_BLOCK
        )
        self.need = int(g.send_bytes + g.recv_bytes)
        self.out_shapes = [s.dst.local_shape(coords) for s in steps]
        self.dtypes = [s.dst.dtype for s in steps]

    def run(self, locals_: List[Any], dev: bool) -> List[Any]:
        like = locals_[0]
        outs = [allocate(sh, dt, like) for sh, dt in zip(self.out_shapes, self.dtypes)]
        if dev:
            self.core.run_device(
                [a.data.ptr for a in locals_], [o.data.ptr for o in outs], bk.stream_ptr()
            )
        else:
            self.core.run(locals_, outs)
        self.calls += 1
        return outs


_FAST = LRU()  # (source layouts, placements) -> (targets, ManyPlan): see redistribute_many


def _forget_plans(_: Any) -> None:
    _FAST.clear()  # its plans were made under the batching settings before the change


for _name in ("PYSHARD_MANY_FUSE_MAX_BYTES", "PYSHARD_MANY_BATCH_BYTES",
              "PYSHARD_MANY_SHM_BATCH_BYTES"):  # fmt: skip
    config.apply_with(_name, _forget_plans)


class ShmFusedExchange(Exchange):
    """A batch's :class:`Exchange` through node-shared memory, bound to this rank: every
    rank's results of the batch in one segment of its node-shared memory, array ``k`` at an
    offset that every rank computes from the layouts (kept in the mesh's cache)."""

    __slots__ = ("node", "views", "nbytes")

    def __init__(self, plans: Sequence[Plan], mesh: Mesh, r: Route) -> None:
        super().__init__("many", r)
        node = r.node
        coords = mesh.coords
        steps = [p.steps[0] for p in plans]
        comm = mesh.core_comm(steps[0].mesh_dims)
        ws = mesh.cache.workspace
        parts = []
        for s in steps:
            pushes, recvs, local = push_specs(s, coords)
            parts.append(
                _core.ShmExchangeStep(
                    comm, node, s.src.dtype.itemsize, list(s.src.local_shape(coords)),
                    list(s.dst.local_shape(coords)), pushes, recvs, local, ws,
                )
            )
        # array k's offset in the batch of each member of the group (communicator rank order)
        n = prod(steps[0].group_shape)
        offsets = [[0] * n for _ in steps]
        for g in range(n):
            peer = steps[0].member(coords, g)
            off = 0
            for k, s in enumerate(steps):
                offsets[k][g] = off
                nb = prod(s.dst.local_shape(peer)) * s.dst.dtype.itemsize
                off += (nb + SHM_ALIGN - 1) // SHM_ALIGN * SHM_ALIGN
        self.core = _core.ShmFusedStep(node, parts, offsets, ws)
        self.node = node
        self.nbytes = int(self.core.bytes)
        self.need = int(self.core.workspace_bytes)  # messages to ranks on other nodes
        self.views = [
            (int(self.core.offset(k)), s.dst.local_shape(coords), s.dst.dtype)
            for k, s in enumerate(steps)
        ]

    def run(self, locals_: List[Any]) -> List[Any]:
        batch = np.frombuffer(_core.ShmBuffer(self.node, max(self.nbytes, 1)), np.uint8)
        self.core.run(locals_, batch)
        self.calls += 1
        return [
            batch[off : off + prod(sh) * dt.itemsize].view(dt).reshape(sh)
            for off, sh, dt in self.views
        ]


def redistribute_many(
    arrays: ArraysArg,
    placements: PlacementsLike,
    algorithm: Optional[str] = None,
    sizes: Any = None,
) -> Any:
    """Redistribute many arrays of one mesh together; collective.

    ``arrays``: a list, tuple or dict of :class:`~pyshard.ShardedArray` on one mesh;
    ``placements``: one placement list for all, or a list (dict) of them matching
    ``arrays``. Returns the results in a container of the same type (and keys). The arrays
    whose plan is a single exchange on the same communicator are moved by one fused
    ``MPI_Alltoallv`` (one message per peer for all of them); the rest run one after another
    with ``algorithm`` (see :meth:`~pyshard.ShardedArray.redistribute`). Host arrays whose
    communicator's ranks share a node move all those exchanges through node-shared memory
    instead (see :class:`ManyPlan`) with ``algorithm="shm"``, and with ``auto`` or ``tune``
    (which measures nothing for them) where their largest blocks for one peer, added up,
    reach ``PYSHARD_SHM_MIN_BYTES`` (16 KiB by default; a few small arrays go through the
    fused ``MPI_Alltoallv``): one handshake per batch, and the results of a batch are views
    into one shared segment, kept until the last of them is freed. An unknown ``algorithm``
    raises ``ValueError`` on every rank before any communication.
    ``sizes``: uneven target shards, ``{array_dim: extents}`` per array, in a dict (dict
    ``arrays``; arrays left out are balanced) or a list (list or tuple ``arrays``; ``None``
    entries are balanced). :func:`plan_many` shows which arrays fuse. Every check happens
    before any communication; in validation mode every rank must pass the same arrays and
    targets.
    """
    keys, xs, is_map = _items(arrays)
    # the algorithm's name checked here, on every rank alike, before any communication: the
    # fused and node-shared batches below never read it, so a bad name would otherwise pass
    # or fail with the arrays' sizes, after the batches had moved
    try:
        alg = default_algorithm() if algorithm is None else algorithm
        check_algorithm(alg)
    except ValueError as e:  # (PYSHARD_ALGORITHM refused: ranks that passed wait in agree)
        if xs and isinstance(xs[0], Placed):
            _validate.refused(xs[0].mesh.comm, "redistribute_many", e)
        raise
    if not xs:
        _check_no_arrays(placements, is_map, sizes)
        return {} if is_map else type(arrays)()
    # (the first array's mesh, or any array's: validation mode's agreement runs on it)
    mesh = next((x.mesh for x in xs if isinstance(x, ShardedArray)), None)
    if isinstance(mesh, Mesh):  # (a freed mesh, or MPI finalized: before any MPI call)
        mesh.check_live()
    try:
        dev = _check_arrays(keys, xs, mesh)
        # a repeated call (the same layouts and one placement list for all): its targets
        # and plan from one lookup
        fast = hit = None
        if sizes is None and not is_map and isinstance(placements, (list, tuple)):
            try:
                fast = (tuple(x.layout for x in xs), tuple(placements))
                hit = _FAST.get(fast)
            except TypeError:  # an unhashable placement: the general path says what is wrong
                fast = None
        if hit is not None:
            targets, mp = hit
            per_sizes = [None] * len(xs)
        else:
            targets = _targets(keys, xs, placements, is_map, sizes)
            per_sizes = _per_array("sizes", keys, xs, sizes, is_map, None)
        if _validate.enabled:  # (its price: this rank's shapes checked before the agreement)
            wrong = _wrong_shape(keys, xs, mesh)
            if wrong is not None:
                raise ValueError(wrong)
    except (TypeError, ValueError) as e:  # validation mode: ranks that passed wait in agree
        if isinstance(mesh, Mesh):
            _validate.refused(mesh.comm, "redistribute_many", e)
        raise
    assert isinstance(mesh, Mesh)
    if _validate.enabled:
        _validate.agree(
            mesh.comm,
            "redistribute_many",
            {
                "arrays": repr([x.layout for x in xs]),
                "targets": repr(targets),
                "algorithm": repr(alg),  # (None and "auto" alike where they resolve alike)
            },
        )
    if hit is None:
        mp = _many(tuple(plan(x.layout, t) for x, t in zip(xs, targets)))
        if fast is not None:
            _FAST.put(fast, (targets, mp))
    locals_ = [
        x.local if x.local.flags.c_contiguous else bk.xp_of(x.local).ascontiguousarray(x.local)
        for x in xs
    ]
    results: List[Any] = [None] * len(xs)
    cache = mesh.cache
    try:
        # node-shared memory for the single exchanges of a communicator whose ranks share a node
        # (set up collectively on first use; decided from the layouts: the same on every rank)
        shm: Dict[Tuple[int, ...], Any] = {}
        routes: Dict[Tuple[int, ...], Route] = {}
        for dims, _ix in mp.exchanges:
            r = routes[dims] = batch_route("alltoallv", dims, mp.block_bytes(dims), mesh, alg, dev)
            if r.path == "shm":
                shm[dims] = r.node
        # executors keyed by the (memoized) ManyPlan itself and the batch: an identity hash,
        # where a tuple of hundreds of plans took a millisecond to hash
        for b, (dims, ix) in enumerate(mp.shm_batches):
            if dims not in shm:
                continue
            key = ("many-shm", mp, b)
            se = cache.execs.get(key)
            if se is None:
                se = [ShmFusedExchange([mp.plans[i] for i in ix], mesh, routes[dims])]
                cache.execs.put(key, se)
                cache.note(se)
            outs = se[0].run([locals_[i] for i in ix])
            for i, o in zip(ix, outs):
                results[i] = ShardedArray.wrap(o, targets[i], mesh)
        for b, (dims, ix) in enumerate(mp.fused):
            if dims in shm:
                continue
            key = ("many", mp, b, dev)
            fe = cache.execs.get(key)
            if fe is None:
                fe = [FusedExchange([mp.plans[i] for i in ix], mesh, dev, routes[dims])]
                cache.execs.put(key, fe)
                cache.note(fe)
            outs = fe[0].run([locals_[i] for i in ix], dev)
            for i, o in zip(ix, outs):
                results[i] = ShardedArray.wrap(o, targets[i], mesh)
    except ValueError as e:  # the core's shape check on this rank: say which array, and how
        wrong = _wrong_shape(keys, xs, mesh)
        if wrong is None:
            raise
        raise ValueError(wrong) from e
    for i in mp.single:  # without sizes, from placements alone: the one-lookup fast path
        if results[i] is not None:  # moved through node-shared memory above
            if alg == "tune":
                # another communicator of the mesh over these dims may have taken MPI (its
                # ranks share no node): its ranks tune this array's exchange here, and that
                # tuning is collective over the whole mesh (pyshard._tune), so this rank
                # takes part in it (its executors built, measured, kept; nothing moves)
                executors(mp.plans[i], mesh, "tune", locals_[i])
            continue
        sz = None if per_sizes[i] is None else targets[i].sizes
        results[i] = xs[i].redistribute(list(targets[i].placements), sz, algorithm=alg)
    return _rebuild(arrays, keys, results, is_map)


def _rebuild(arrays: Any, keys: List[Any], results: List[Any], is_map: bool) -> Any:
    """The results in a container like ``arrays``: a dict subclass copied with its values
    replaced (a defaultdict keeps its factory), a namedtuple from its fields, any other
    mapping as a dict."""
    if is_map:
        out = dict(zip(keys, results))
        if type(arrays) is dict or not isinstance(arrays, dict):
            return out
        c = copy.copy(arrays)
        c.update(out)
        return c
    if isinstance(arrays, tuple) and hasattr(type(arrays), "_fields"):  # a namedtuple
        return type(arrays)(*results)
    return type(arrays)(results)
