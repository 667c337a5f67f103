"""`ShardedArray`: a local numpy or cupy array plus the layout it belongs to, and plan
execution."""

from __future__ import annotations

import logging
import os
import zlib
from math import prod
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from . import _backend as bk
from . import _core, _tune, _validate
from ._cache import memoize
from .halo import HaloArray, PeriodicArg, WidthArg
from .layout import (
    Layout,
    Partial,
    PlacementsArg,
    Replicate,
    Shard,
    SizesArg,
    check_dtype,
    check_placements,
    ravel,
    unravel,
)
from .mesh import Mesh
from .plan import Plan, Step, geometry, plan, reduce_dtype

__all__ = ["ShardedArray", "distribute", "from_local"]

log = logging.getLogger("pyshard")


def _check_mesh(mesh: object) -> Mesh:
    if not isinstance(mesh, Mesh):
        raise TypeError(f"mesh must be a pyshard.Mesh, got {type(mesh).__name__}")
    return mesh


def _check_array(a: object, name: str) -> Any:
    a = bk.as_array(a, name)
    check_dtype(a.dtype, f"{name}.dtype")
    return a


class ShardedArray:
    """This rank's shard ``local`` of a global array laid out as ``layout`` on ``mesh``.

    ``global_array[x.box]`` equals ``x.local`` when no mesh dim is Partial. ``local`` is
    always C-contiguous: a numpy array on the host, or a cupy array on a GPU (results of a
    redistribution stay where the input was; ``torch.from_dlpack(x.local)`` views a GPU
    shard as a torch tensor without a copy).
    """

    __slots__ = ("local", "layout", "mesh")

    def __init__(self, local: Any, layout: Layout, mesh: Mesh) -> None:
        want = layout.local_shape(mesh.coords)
        if local.shape != want or local.dtype != layout.dtype:
            raise ValueError(
                f"local array {local.shape} {local.dtype} disagrees with the layout, which puts "
                f"{want} {layout.dtype} at mesh coords {mesh.coords}"
            )
        self.local = local if local.flags.c_contiguous else bk.xp_of(local).array(local, order="C")
        self.layout = layout
        self.mesh = mesh

    @property
    def global_shape(self) -> Tuple[int, ...]:
        return self.layout.shape

    @property
    def shape(self) -> Tuple[int, ...]:
        return self.layout.shape

    @property
    def dtype(self) -> np.dtype:
        return self.layout.dtype

    @property
    def placements(self) -> Tuple:
        return self.layout.placements

    @property
    def box(self) -> Tuple[slice, ...]:
        """The global region this rank holds."""
        return self.layout.box(self.mesh.coords)

    def __repr__(self) -> str:
        return f"ShardedArray({self.layout!r}, local {self.local.shape} at {self.mesh.coords})"

    def plan_to(self, placements: PlacementsArg, sizes: SizesArg = None) -> Plan:
        """The (cached) plan that :meth:`redistribute` would run; no communication."""
        return plan(self.layout, self._target(placements, sizes))

    def _target(self, placements: PlacementsArg, sizes: SizesArg) -> Layout:
        return _layout(self.layout, self.mesh.shape, placements, sizes)

    def redistribute(
        self,
        placements: PlacementsArg,
        sizes: SizesArg = None,
        algorithm: Optional[str] = None,
        out: Optional[Any] = None,
    ) -> ShardedArray:
        """The same global array laid out as ``placements`` (and ``sizes``); collective.

        ``algorithm`` picks how an exchange step runs: ``"alltoallv"``, ``"alltoall"``
        (blocks padded to the largest), ``"p2p"`` (pipelined Isend/Irecv), ``"alltoallw"``
        (one subarray datatype per peer: MPI packs on the fly, no workspace; host arrays
        only, GPU arrays take ``alltoallv``), ``"auto"`` (a fixed rule, see
        :func:`pyshard.array.choose_algorithm`) or ``"tune"`` (measure the candidates the
        first time a step of that kind and size runs, see :mod:`pyshard._tune`). The default
        is ``PYSHARD_ALGORITHM`` from the environment, else ``"auto"``. It must be the same
        on every rank.
        ``out``: an array of the target's local shape and dtype, on the same side (host or
        GPU) as ``local``, to write the result into (reused across calls, it saves the page
        faults of a fresh output); it is checked on this rank before any communication.

        Every layout check happens before any communication. When the target layout equals
        the source, nothing is communicated or copied and the result shares ``local`` with
        this array; otherwise the result owns a new buffer. GPU arrays: the kernels run on
        cupy's current stream, and the result is ready on that stream when this returns.
        """
        cache = self.mesh._cache
        local = self.local
        if not local.flags.c_contiguous:  # a view, e.g. HaloArray.array's interior
            local = bk.xp_of(local).ascontiguousarray(local)
        if algorithm is None:
            algorithm = DEFAULT_ALGORITHM
        if _validate.enabled:  # one small Allgather: a mismatch raises on every rank
            self._agree(placements, sizes, algorithm)
        if sizes is None:
            try:
                key = (self.layout, *placements, algorithm, type(self.local))
                hit = cache.fast.get(key)
            except TypeError:  # unhashable input: the slow path gives the precise error
                hit = key = None
            if hit is not None:  # a repeated call: one lookup, then the core
                target, e = hit
                if out is None or _out_ok(out, e.out_shape, target.dtype, local):
                    return ShardedArray._wrap(e.run(local, out), target, self.mesh)
        else:
            key = None
        target = self._target(placements, sizes)
        p = plan(self.layout, target)
        execs = executors(p, self.mesh, algorithm, local)
        res = _execute(execs, p, self.mesh, local, out)
        if key is not None and len(execs) == 1 and execs[0].direct:
            cache.fast.put(key, (target, execs[0]))
        return ShardedArray._wrap(res, target, self.mesh)

    def _agree(self, placements: PlacementsArg, sizes: SizesArg, algorithm: str) -> None:
        """Validation mode: every rank must pass the same target (see pyshard._validate)."""
        err: Optional[Exception] = None
        try:
            target = repr(self._target(placements, sizes))
        except (TypeError, ValueError) as e:
            err, target = e, f"invalid ({e})"
        want = self.layout.local_shape(self.mesh.coords)
        local = (
            "fits the layout"
            if tuple(self.local.shape) == want and self.local.dtype == self.layout.dtype
            else f"{tuple(self.local.shape)} {self.local.dtype}, the layout gives {want}"
        )
        items = {
            "source layout": repr(self.layout),
            "target layout": target,
            "algorithm": repr(algorithm),
            "local shard": local,
        }
        _validate.agree(self.mesh.comm, "redistribute", items)
        if err is not None:
            raise err

    @classmethod
    def _wrap(cls, local: Any, layout: Layout, mesh: Mesh) -> ShardedArray:
        """Internal: a result the executor built to the layout's shape (no checks)."""
        self = cls.__new__(cls)
        self.local = local
        self.layout = layout
        self.mesh = mesh
        return self

    def with_halo(
        self,
        width: WidthArg,
        periodic: PeriodicArg = False,
        corners: bool = True,
        method: Optional[str] = None,
    ) -> HaloArray:
        """This shard with ``width`` ghost cells on each side of each dim (an int, or one per
        array dim): a :class:`~pyshard.HaloArray` whose ``padded`` array (same array module
        and dtype as ``local``) holds a copy of ``local`` in its interior; no communication.

        ``periodic``: a bool or one per dim (ghosts wrap around the global extent);
        ``corners=True``: a box stencil (every ghost cell), ``False``: a star stencil (only
        the cells outside the box along exactly one dim). ``method``: ``"persistent"``
        (default, or ``PYSHARD_HALO_METHOD``) or ``"p2p"``. ``Partial`` placements, negative
        widths or a width larger than its dim's global extent raise :class:`ValueError`
        before any communication.
        """
        return HaloArray(self, width, periodic, corners, method)

    def full(self) -> Any:
        """The whole global array on every rank (reduced where the layout is Partial), on the
        same side (host or GPU) as ``local``."""
        return self.redistribute([Replicate()] * self.mesh.ndim).local


@memoize
def _layout_cached(shape: tuple, dtype: str, mesh_shape: tuple, placements: tuple, sizes: tuple):
    return Layout(shape, dtype, mesh_shape, placements, dict(sizes) if sizes is not None else None)


def _layout(like: Layout, mesh_shape: tuple, placements: PlacementsArg, sizes: SizesArg) -> Layout:
    """Layout of ``like``'s array as ``placements``, cached so that a repeated redistribute
    does no work that grows with the number of ranks."""
    try:
        key_sizes = (
            None
            if sizes is None
            else tuple(sorted((int(d), tuple(int(e) for e in v)) for d, v in sizes.items()))
        )
        return _layout_cached(like.shape, like.dtype.str, mesh_shape, tuple(placements), key_sizes)
    except (TypeError, ValueError, AttributeError):
        # not hashable or not well formed: build it uncached for the precise error
        return Layout(like.shape, like.dtype, mesh_shape, placements, sizes)


def distribute(
    global_array: Any,
    mesh: Mesh,
    placements: PlacementsArg,
    sizes: SizesArg = None,
) -> ShardedArray:
    """Every rank passes the same full array and gets its shard; no communication.

    ``global_array``: a numpy or cupy array (or anything with ``__dlpack__`` or
    ``__cuda_array_interface__``, viewed without a copy); the shard stays on its side.

    A Partial mesh dim holds the array as Replicate -> Partial would: ``sum`` keeps it at
    coordinate 0 and zeros elsewhere; ``avg``, ``max`` and ``min`` keep it everywhere.
    """
    mesh = _check_mesh(mesh)
    a = _check_array(global_array, "global_array")
    layout = Layout(a.shape, a.dtype, mesh.shape, placements, sizes)
    local = bk.xp_of(a).array(a[layout.box(mesh.coords)], order="C", copy=True)
    if zeroed(layout, mesh.coords):
        local[...] = 0
    return ShardedArray(local, layout, mesh)


def from_local(
    local: Any,
    mesh: Mesh,
    placements: PlacementsArg,
    global_shape: Optional[Sequence[int]] = None,
    sizes: SizesArg = None,
    validate: bool = False,
) -> ShardedArray:
    """Wrap this rank's shard ``local`` (numpy or cupy, or a DLPack / CUDA array interface
    producer, viewed without a copy) as a ShardedArray.

    With ``global_shape`` (and ``sizes`` where the split is not balanced) there is no
    communication at all: every rank must pass the shard the layout gives it, or
    :class:`ValueError` is raised on the ranks whose shard disagrees. ``validate=True`` adds
    one Allgather of the local shapes so that every rank raises the same error.

    With ``global_shape=None`` the extents are learned with one Allgather of the local
    shapes (the only place pyshard asks other ranks for shapes); mismatches then raise the
    same error on every rank.
    """
    mesh = _check_mesh(mesh)
    if _validate.enabled:  # the same arguments everywhere; then every shape check agrees
        args = {"placements": repr(placements), "global_shape": repr(global_shape)}
        args["sizes"] = repr(sizes)
        args["dtype"] = str(getattr(local, "dtype", type(local).__name__))
        args["ndim"] = str(getattr(local, "ndim", "?"))
        _validate.agree(mesh.comm, "from_local", args)
        validate = True
    a = _check_array(local, "local")
    placements = check_placements(placements, mesh.ndim, a.ndim)
    if global_shape is None:
        shapes = _gather_shapes(a, mesh)
        global_shape, sizes_in = _infer_global(shapes, mesh, placements)
        if sizes is not None:
            raise ValueError("from_local: give sizes only together with global_shape")
        layout = Layout(global_shape, a.dtype, mesh.shape, placements, sizes_in)
        return ShardedArray(a, layout, mesh)
    layout = Layout(global_shape, a.dtype, mesh.shape, placements, sizes)
    if validate:
        shapes = _gather_shapes(a, mesh)
        for r, shp in enumerate(shapes):
            coords = tuple(unravel(r, mesh.shape))
            want = layout.local_shape(coords)
            if tuple(shp) != want:
                raise ValueError(
                    f"from_local: rank {r} at mesh coords {coords} passed a local array of shape "
                    f"{tuple(shp)}, but the layout gives it {want}"
                )
    return ShardedArray(a, layout, mesh)


def _gather_shapes(a: Any, mesh: Mesh) -> List[Tuple[int, ...]]:
    # one Allgather of (ndim, itemsize code, extents...) padded to a fixed width of 34 ints
    width = 34
    if a.ndim > width - 2:
        raise ValueError(f"from_local: arrays of ndim > {width - 2} are not supported")
    mine = [a.ndim, zlib.crc32(a.dtype.str.encode())] + list(a.shape)
    mine += [0] * (width - len(mine))
    flat = _core.allgather_i64(mesh._core_comm(tuple(range(mesh.ndim))), mine)
    rows = [flat[i * width : (i + 1) * width] for i in range(mesh.size)]
    for r, row in enumerate(rows):
        if row[0] != a.ndim or row[1] != mine[1]:
            raise ValueError(
                f"from_local: local arrays disagree in ndim or dtype across ranks (rank {r} has "
                f"ndim {row[0]}); every rank must pass the same ndim and dtype"
            )
    return [tuple(row[2 : 2 + a.ndim]) for row in rows]


def _infer_global(shapes: List[Tuple[int, ...]], mesh: Mesh, placements: Sequence) -> tuple:
    ndim = len(shapes[0])
    coords = [tuple(unravel(r, mesh.shape)) for r in range(mesh.size)]
    sharding = {}
    for m, p in enumerate(placements):
        if isinstance(p, Shard):
            sharding.setdefault(p.dim, []).append(m)
    gshape, sizes = [], {}
    for d in range(ndim):
        mdims = sharding.get(d, [])
        nparts = prod(mesh.shape[m] for m in mdims)
        ext: List[Optional[int]] = [None] * nparts
        for r, c in enumerate(coords):
            k = ravel([c[m] for m in mdims], [mesh.shape[m] for m in mdims])
            if ext[k] is None:
                ext[k] = shapes[r][d]
            elif ext[k] != shapes[r][d]:
                raise ValueError(
                    f"from_local: local extents along array dim {d} disagree between ranks that "
                    f"must hold the same shard (rank {r} has {shapes[r][d]}, another {ext[k]})"
                )
        gshape.append(sum(ext))
        if mdims:
            sizes[d] = tuple(ext)
    return tuple(gshape), sizes


def zeroed(layout: Layout, coords: Sequence[int]) -> bool:
    """Does a Replicate -> Partial(sum) conversion hold zeros at these coords?"""
    return any(
        isinstance(p, Partial) and p.op == "sum" and coords[m] != 0
        for m, p in enumerate(layout.placements)
    )


# ----------------------------------------------------------------------------- execution


class _Exec:
    """One step bound to this rank and memory kind: the core object (built once from the
    step's geometry) and how to run it."""

    __slots__ = (
        "step", "core", "out_shape", "upcast", "scale", "zero", "fill", "direct", "dtype",
        "dev", "need", "pooled",
    )

    def __init__(self, step: Step, mesh: Mesh, algorithm: str = "alltoallv", dev: bool = False):
        self.step = step
        coords = mesh.coords
        self.out_shape = step.dst.local_shape(coords)
        self.core: Any = None
        self.upcast: Optional[np.dtype] = None
        self.scale: Optional[float] = None
        self.zero = False
        self.fill: object = None
        self.dtype = step.dst.dtype
        self.dev = dev
        self.pooled = not dev and prod(self.out_shape) * self.dtype.itemsize >= POOL_MIN_BYTES
        if step.is_collective:
            self._collective(step, mesh, algorithm)
        elif step.kind == "local_copy":
            self.core = _slices(step.dst, step.src, coords)
        elif step.kind == "make_partial":
            self._make_partial(step, coords)
        self.direct = step.is_collective and self.upcast is None and self.scale is None
        self.need = 0
        if self.core is not None and step.is_collective:
            staged = _core.transport(_core.Mem.cuda if dev else _core.Mem.host).name == "staged"
            self.need = int(self.core.staged_bytes if staged else self.core.workspace_bytes)

    def _collective(self, step: Step, mesh: Mesh, algorithm: str) -> None:
        coords = mesh.coords
        comm = mesh._core_comm(step.mesh_dims)
        ws = mesh._cache.workspace
        kind = step.kind
        if kind == "alltoallv":
            algo = getattr(_core.Algorithm, algorithm)
            block = step.max_block_volume() * step.src.dtype.itemsize  # the same on every rank
            pad = block if algo == _core.Algorithm.alltoall else 0
            # Ialltoallv (local copy overlapped) for large blocks, Alltoallv for small ones:
            # decided from the layouts, so every rank calls the same collective
            nonblocking = block >= NONBLOCKING_MIN_BLOCK
            g = geometry(step, coords, algo, pad)
            self.core = _core.ExchangeStep(comm, g, ws, nonblocking)
        elif kind == "allgatherv":
            self.core = _core.AllgathervStep(comm, geometry(step, coords), ws)
        else:
            rdt = reduce_dtype(step.src.dtype)
            if rdt != step.src.dtype:
                self.upcast = rdt
            if step.op == "avg":
                self.scale = 1.0 / prod(step.group_shape)
            op = getattr(_core.ReduceOp, _reduce_op(step.src.dtype, step.op))
            if kind == "allreduce":
                shape = list(step.src.local_shape(coords))
                self.core = _core.AllreduceStep(comm, rdt, op, shape, ws)
            else:
                self.core = _core.ReduceScatterStep(comm, geometry(step, coords), rdt, op, ws)

    def _make_partial(self, step: Step, coords: Tuple[int, ...]) -> None:
        # spread dims (the source shards them): the shard inside the op's identity;
        # replicated dims: keep the value, or zero it for sum away from coordinate 0
        spread = [m for m in step.mesh_dims if isinstance(step.src.placements[m], Shard)]
        self.zero = any(
            step.dst.placements[m].op == "sum" and coords[m] != 0
            for m in step.mesh_dims
            if m not in spread
        )
        if spread:
            self.fill = _identity(step.dst.dtype, step.dst.placements[spread[0]].op)
            self.core = _slices(step.src, step.dst, coords)

    def _call(self, src: Any, res: Any) -> None:
        if self.dev:
            self.core.run_device(src.data.ptr, res.data.ptr, bk.stream_ptr())
        else:
            self.core.run(src, res)

    def run(self, local: Any, out: Optional[Any] = None) -> Any:
        """Run the step on ``local``; write into ``out`` when given (the target's shape)."""
        if self.direct:  # a collective straight into the output: the hot path
            if self.dev:
                res = bk.xp_of(local).empty(self.out_shape, self.dtype) if out is None else out
                self.core.run_device(local.data.ptr, res.data.ptr, bk.stream_ptr())
                return res
            if out is not None:
                res = out
            elif self.pooled:  # memory that is already faulted in (see _pooled_empty)
                res = _pooled_empty(self.out_shape, self.dtype)
            else:
                res = np.empty(self.out_shape, self.dtype)
            self.core.run(local, res)
            return res
        xp = bk.xp_of(local)
        kind = self.step.kind
        if kind == "make_partial" and self.core is not None:
            res = out if out is not None else xp.empty(self.out_shape, local.dtype)
            res[...] = self.fill  # the reduction's identity
            if not self.zero:
                res[self.core] = local
            return res
        if kind in ("local_copy", "make_partial", "relabel"):
            if kind == "local_copy":
                res = local[self.core]
            elif kind == "make_partial" and self.zero:
                res = None
            else:
                res = local
            if out is None:
                if res is None:
                    return xp.zeros(self.out_shape, local.dtype)
                return res if kind == "relabel" else xp.array(res, order="C", copy=True)
            if res is None:
                out[...] = 0
            else:
                xp.copyto(out, res)
            return out
        src = local
        if self.upcast is not None:
            src = local.astype(self.upcast)
            res = xp.empty(self.out_shape, dtype=self.upcast)
        else:
            res = out if out is not None else xp.empty(self.out_shape, dtype=local.dtype)
        self._call(src, res)
        if self.scale is not None:
            res *= res.dtype.type(self.scale)
        if self.upcast is not None:
            if out is None:
                return res.astype(local.dtype)
            xp.copyto(out, res, casting="unsafe")
            return out
        return res


POOL_MIN_BYTES = 1 << 20


def _pooled_empty(shape: Tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An uninitialised array whose memory comes from the core's result pool and returns to
    it when the array (and every view of it) is freed: a loop of redistributes without
    ``out=`` reuses pages instead of faulting in fresh ones on every call."""
    buf = _core.PooledBuffer(prod(shape) * dtype.itemsize)
    return np.frombuffer(buf, dtype=dtype).reshape(shape)


def _slices(box_of: Layout, rel: Layout, coords: Tuple[int, ...]) -> Tuple[slice, ...]:
    """This rank's box in ``box_of`` as slices of its local array in ``rel``."""
    return tuple(
        slice(a - o, b - o)
        for (a, b), (o, _) in zip(
            (box_of.interval(d, coords) for d in range(box_of.ndim)),
            (rel.interval(d, coords) for d in range(rel.ndim)),
        )
    )


def _identity(dtype: np.dtype, op: str) -> object:
    """The identity of reduction ``op`` in ``dtype`` (0, the lowest or the highest value)."""
    if op == "sum":
        return dtype.type(0)
    if dtype.kind == "b":
        return dtype.type(op == "min")
    info = np.finfo(dtype) if dtype.kind == "f" else np.iinfo(dtype)
    if dtype.kind == "f":
        return dtype.type(-np.inf if op == "max" else np.inf)
    return dtype.type(info.min if op == "max" else info.max)


def _reduce_op(dtype: np.dtype, op: Optional[str]) -> str:
    """The MPI reduction for Partial ``op`` (avg sums, then scales; bool uses or / and)."""
    if dtype.kind == "b":
        return {"sum": "lor", "max": "lor", "min": "land"}[op or "sum"]
    return {"sum": "sum", "avg": "sum", "max": "max", "min": "min"}[op or "sum"]


ALGORITHMS = ("alltoallv", "alltoall", "p2p", "alltoallw")


def _default_algorithm() -> str:
    raw = os.environ.get("PYSHARD_ALGORITHM", "").strip() or "auto"
    if raw not in ALGORITHMS + ("auto", "tune"):
        raise ValueError(
            f"PYSHARD_ALGORITHM must be auto, tune or one of {ALGORITHMS}, got {raw!r}"
        )
    return raw


DEFAULT_ALGORITHM = _default_algorithm()
NONBLOCKING_MIN_BLOCK = 1 << 20  # bytes


def choose_algorithm(
    step: Optional[Step], algorithm: str, device: bool = False, coords: Optional[tuple] = None
) -> str:
    """The exchange algorithm for an alltoallv step at mesh ``coords``; the same on every
    rank of the step's communicator (decided from the layouts alone).

    ``auto``: ``p2p`` when the exchange is sparse (each rank sends to at most a quarter of
    its group, e.g. the 2-D swap ``[S0,S1] -> [S1,S0]`` or a target whose shards are mostly
    empty), so that no collective carries a count for every rank of the group; else
    ``alltoallv``. Measured here (MPICH 5.0.2, 8192^2 float32 transpose, docs/performance.md):
    ``alltoallv`` 40 ms against 52 ms for the regular ``alltoall`` at 2 ranks, 47 against 63
    at 4, although the raw Alltoall of pre-packed bytes is the faster collective (23 vs 30 ms
    at 2 ranks, a tie at 4): a regular Alltoall must also move this rank's own block through
    the packed buffers, which Alltoallv leaves out (it is copied locally while the exchange
    runs). ``alltoallw`` swung between 31 and 60 ms; ``p2p`` tied on dense exchanges.
    ``algorithm="tune"`` measures instead of assuming. ``alltoallw`` is host-only: GPU
    arrays take ``alltoallv``.
    """
    if algorithm == "auto":
        if step is not None and 4 * step.max_peers() <= prod(step.group_shape):
            return "p2p"
        return "alltoallv"
    if algorithm not in ALGORITHMS:
        raise ValueError(
            f"algorithm must be 'auto', 'tune' or one of {ALGORITHMS}, got {algorithm!r}"
        )
    if device and algorithm == "alltoallw":
        return "alltoallv"
    return algorithm


def _exec(s: Step, mesh: Mesh, algorithm: str, dev: bool) -> _Exec:
    if s.kind != "alltoallv":
        return _Exec(s, mesh, "", dev)
    if algorithm == "tune":
        algorithm = _tune.choose(
            s, mesh, dev, lambda a: _Exec(s, mesh, choose_algorithm(s, a, dev), dev)
        )
    return _Exec(s, mesh, choose_algorithm(s, algorithm, dev, mesh.coords), dev)


def executors(p: Plan, mesh: Mesh, algorithm: str = "auto", like: Any = None) -> list:
    """The executors of plan ``p`` on this rank for arrays like ``like`` (numpy by default),
    built once and kept in the mesh's bounded cache."""
    dev = bk.is_device(like)
    key = (p, algorithm, dev)
    cache = mesh._cache
    execs = cache.execs.get(key)
    if execs is None:
        if algorithm not in ("auto", "tune") and algorithm not in ALGORITHMS:
            choose_algorithm(None, algorithm)  # the precise error, whatever the plan
        if dev:
            bk.announce()
        execs = [_exec(s, mesh, algorithm, dev) for s in p.steps]
        cache.execs.put(key, execs)
        cache.note(execs)
        log.debug("pyshard: built %s (%s) for rank %d", p, algorithm, mesh.rank)
    return execs


def execute(
    p: Plan,
    mesh: Mesh,
    local: Any,
    algorithm: Optional[str] = None,
    out: Optional[Any] = None,
) -> Any:
    """Run plan ``p`` on this rank's ``local`` shard (numpy or cupy); collective over ``mesh``.

    ``out``: a C-contiguous, writable array of the target's local shape and dtype, on the
    same side as ``local``, that the last step writes into (checked before any
    communication).
    """
    algorithm = DEFAULT_ALGORITHM if algorithm is None else algorithm
    return _execute(executors(p, mesh, algorithm, local), p, mesh, local, out)


def _execute(execs: list, p: Plan, mesh: Mesh, local: Any, out: Optional[Any]) -> Any:
    if out is not None:
        want = execs[-1].out_shape if execs else local.shape
        if not _out_ok(out, want, p.dst.dtype, local):
            _check_out(out, p, mesh, local)  # the precise error
        if not execs:
            bk.xp_of(local).copyto(out, local)
            return out
    res = local
    last = len(execs) - 1
    for i, e in enumerate(execs):
        res = e.run(res, out if i == last else None)
    return res


def _out_ok(out: object, shape: tuple, dtype: np.dtype, local: Any) -> bool:
    """The cheap test of an ``out=`` buffer (``_check_out`` says what is wrong)."""
    return (
        type(out) is type(local)
        and out.shape == shape
        and out.dtype == dtype
        and out.flags.c_contiguous
        and (out.flags.writeable if type(out) is np.ndarray else True)
        and not (out.size and bk.xp_of(local).may_share_memory(out, local))
    )


def _check_out(out: object, p: Plan, mesh: Mesh, local: Any) -> None:
    want = p.dst.local_shape(mesh.coords)
    if not isinstance(out, np.ndarray) and not bk.is_device(out):
        raise TypeError(f"out must be a numpy or cupy array, got {type(out).__name__}")
    bk.same_kind(local, out, "the array's local shard", "out")
    if out.shape != want or out.dtype != p.dst.dtype:
        raise ValueError(
            f"out has shape {out.shape} {out.dtype}, the target layout needs {want} {p.dst.dtype}"
        )
    if not out.flags.c_contiguous or (isinstance(out, np.ndarray) and not out.flags.writeable):
        raise ValueError("out must be C-contiguous and writable")
    if out.size and bk.xp_of(local).shares_memory(out, local):
        raise ValueError("out must not overlap the source array")
    if type(out) is not type(local):
        raise TypeError(f"out must be a plain {type(local).__name__}, got {type(out).__name__}")
