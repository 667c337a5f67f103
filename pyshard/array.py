"""`ShardedArray`: a local numpy or cupy array plus the layout it belongs to; `distribute` and
`from_local` make one, `redistribute` runs a plan on it (pyshard.executor)."""

from __future__ import annotations

import logging
import zlib
from math import prod
from typing import Any, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _backend as bk
from . import _core, _dtypes, _validate
from ._cache import FastEntry
from .exchange import default_algorithm
from .executor import Pending, bind, executors, run_steps, start
from .halo import HaloArray
from .halo_planner import PeriodicArg, WidthArg
from .layout import (  # Placed: re-exported (pyshard.torch's ShardedTensor is one too)
    Layout,
    Partial,
    Placed,
    PlacementsArg,
    Replicate,
    Shard,
    SizesArg,
    check_dtype,
    check_placements,
    ravel,
    relaid,
    unravel,
)
from .mesh import Mesh
from .planner import Plan, plan

__all__ = ["ShardedArray", "distribute", "from_local"]

log = logging.getLogger("pyshard")
_new = object.__new__


def _check_mesh(mesh: object) -> Mesh:
    if not isinstance(mesh, Mesh):
        raise TypeError(f"mesh must be a pyshard.Mesh, got {type(mesh).__name__}")
    return mesh


def _check_array(a: object, name: str) -> Any:
    a = bk.as_array(a, name)
    check_dtype(a.dtype, f"{name}.dtype")
    return a


class ShardedArray(Placed):
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
    def dtype(self) -> np.dtype:
        return self.layout.dtype

    def __repr__(self) -> str:
        return f"ShardedArray({self.layout!r}, local {self.local.shape} at {self.mesh.coords})"

    def plan_to(self, placements: PlacementsArg, sizes: SizesArg = None) -> Plan:
        """The (cached) plan that :meth:`redistribute` would run; no communication."""
        return plan(self.layout, self.target_layout(placements, sizes))

    def target_layout(self, placements: PlacementsArg, sizes: SizesArg = None) -> Layout:
        """The layout :meth:`redistribute` with these arguments would give (no communication)."""
        return relaid(self.layout, placements, sizes)

    def redistribute(
        self,
        placements: PlacementsArg,
        sizes: SizesArg = None,
        algorithm: Optional[str] = None,
        out: Optional[Any] = None,
        wait: bool = True,
    ) -> Union[ShardedArray, Pending]:
        """The same global array laid out as ``placements`` (and ``sizes``); collective.

        ``algorithm`` picks how an exchange step runs: ``"alltoallv"``, ``"alltoall"``
        (blocks padded to the largest), ``"p2p"`` (pipelined Isend/Irecv), ``"alltoallw"``
        (one subarray datatype per peer: MPI packs on the fly, no workspace; host arrays
        only, GPU arrays take ``alltoallv``), ``"auto"`` (a fixed rule, see
        :func:`pyshard.route.choose_algorithm`) or ``"tune"`` (measure the candidates the
        first time a step of that kind and size runs, see :mod:`pyshard._tune`). The default
        is ``PYSHARD_ALGORITHM`` from the environment, else ``"auto"``. It must be the same
        on every rank.
        ``out``: an array of the target's local shape and dtype, on the same side (host or
        GPU) as ``local``, to write the result into (reused across calls, it saves the page
        faults of a fresh output); it is checked on this rank before any communication.

        ``wait=False``: start the redistribute and return a :class:`~pyshard.Pending`
        at once, whose ``wait()`` returns the result (``test()``: whether it is complete);
        the caller computes in between. Several may be in flight, started in the same order
        on every rank and waited in any order;
        the source and ``out`` must stay alive and unwritten until then. The first step is
        in flight only when it is an exchange on the ``alltoallv`` or ``p2p`` algorithm (see
        :class:`~pyshard.Pending`); other plans complete before this returns.

        Every layout check happens before any communication. When the target layout equals
        the source, nothing is communicated or copied and the result shares ``local`` with
        this array; otherwise the result owns a new buffer. GPU arrays: the kernels run on
        cupy's current stream, and the result is ready on that stream when this returns.
        """
        if algorithm is None:
            algorithm = default_algorithm()
        dt = self.local.dtype  # (an identity test first: a few tens of ns on the fast path)
        if dt is not self.layout.dtype and dt != self.layout.dtype:
            raise TypeError(
                f"redistribute: the local array has dtype {dt}, the layout {self.layout.dtype} "
                f"(was .local replaced by an array of another dtype? ShardedArray.wrap the new "
                f"array with a layout of its dtype)")
        if sizes is None and wait and not _validate.enabled:
            # a repeated call: one lookup, then one call of the binding (executor.bind)
            try:
                key = (self.layout, *placements, algorithm, type(self.local))
                hit = self.mesh.cache.fast.get(key)
            except TypeError:  # unhashable or not a sequence: the general path says so
                hit = None
            if hit is not None:
                res = hit.call(self.local, out)
                if res is not None:
                    r = _new(ShardedArray)
                    r.local, r.layout, r.mesh = res, hit.target, self.mesh
                    return r
        return self._redistribute(placements, sizes, algorithm, out, wait)

    def _redistribute(
        self,
        placements: PlacementsArg,
        sizes: SizesArg,
        algorithm: str,
        out: Optional[Any],
        wait: bool,
    ) -> Union[ShardedArray, Pending]:
        """The general path: validate, plan, build or find the executors, run them, and
        keep the binding for the fast path of the next such call."""
        mesh = self.mesh
        local = self.local
        if not local.flags.c_contiguous:  # a view, e.g. HaloArray.array's interior
            local = bk.xp_of(local).ascontiguousarray(local)
        if _validate.enabled:  # one small Allgather: a mismatch raises on every rank
            self._agree(placements, sizes, algorithm)
        target = self.target_layout(placements, sizes)
        p = plan(self.layout, target)
        execs = executors(p, mesh, algorithm, local)
        if not wait:
            return start(execs, p, mesh, local, out, lambda r: ShardedArray.wrap(r, target, mesh))
        res = run_steps(execs, p, mesh, local, out)
        if sizes is None:
            fast = mesh.cache.fast
            try:
                key = (self.layout, *placements, algorithm, type(self.local))
                if key not in fast:
                    fast.put(key, FastEntry(*bind(execs, p), target, execs))
            except TypeError:  # placements the layout accepted but cannot hash
                pass
        return ShardedArray.wrap(res, target, mesh)

    def _agree(self, placements: PlacementsArg, sizes: SizesArg, algorithm: str) -> None:
        """Validation mode: every rank must pass the same target (see pyshard._validate)."""
        err: Optional[Exception] = None
        try:
            target = repr(self.target_layout(placements, sizes))
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
    def wrap(cls, local: Any, layout: Layout, mesh: Mesh) -> ShardedArray:
        """A sharded array over ``local``, which is already this rank's shard of ``layout`` (no
        checks, no communication): for results pyshard built itself (use :func:`from_local`
        for arrays of your own)."""
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
        the cells outside the box along exactly one dim). ``method``: how the messages move:
        ``"auto"`` (default, or ``PYSHARD_HALO_METHOD``: node-shared memory between ranks of
        a node for faces of at least ``PYSHARD_SHM_MIN_BYTES``, else ``"persistent"``),
        ``"shm"``, ``"persistent"``, ``"p2p"``, ``"neighbor"``, ``"datatype"`` (host arrays) or
        ``"tune"`` (each measured at the first update, the fastest kept); see docs/halo.md.
        ``Partial`` placements, negative widths or a width larger than its dim's global
        extent raise :class:`ValueError` before any communication.
        """
        return HaloArray(self, width, periodic, corners, method)

    def full(self) -> Any:
        """The whole global array on every rank (reduced where the layout is Partial), on the
        same side (host or GPU) as ``local``."""
        return self.redistribute([Replicate()] * self.mesh.ndim).local


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
    mine = [a.ndim, zlib.crc32(_dtypes.name(a.dtype).encode())] + list(a.shape)
    mine += [0] * (width - len(mine))
    flat = _core.allgather_i64(mesh.core_comm(tuple(range(mesh.ndim))), mine)
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
