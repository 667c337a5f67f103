"""`ShardedArray`: a local numpy or cupy array plus the layout it belongs to; `distribute` and
`from_local` make one, `redistribute` runs a plan on it (pyshard.executor)."""

from __future__ import annotations

import logging
import zlib
from math import prod
from typing import Any, List, Literal, Optional, Sequence, Tuple, Union, overload

import numpy as np
from mpi4py import MPI

from . import _backend as bk
from . import _core, _dtypes, _validate
from ._cache import FastEntry
from .exchange import default_algorithm
from .executor import Pending, bind, check_out, executors, run_steps, start
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
    mesh.check_live()
    return mesh


class Refused:
    """A local array a front end could not take (pyshard.torch): ``from_local`` raises
    ``err`` where it would raise its own error, after the Allgather that carries it."""

    def __init__(self, err: BaseException) -> None:
        self.err = err


def _check_array(a: object, name: str) -> Any:
    if isinstance(a, Refused):
        raise a.err
    a = bk.as_array(a, name)
    check_dtype(a.dtype, f"{name}.dtype")
    return a


class ShardedArray(Placed):
    """This rank's shard ``local`` of a global array laid out as ``layout`` on ``mesh``.

    ``global_array[x.box]`` equals ``x.local`` when no mesh dim is Partial. ``local`` is
    C-contiguous (but for :attr:`HaloArray.array`'s, a view of the interior, and a
    redistribute's result into a strided ``out=``, which is that ``out``; each operation
    copies such a one where it needs a contiguous array, and a scatter's ``into=`` refuses
    it): a numpy array on the host, or a
    cupy array on a GPU (results of a redistribution stay where the input was;
    ``torch.from_dlpack(x.local)`` views a GPU shard as a torch tensor without a copy).
    """

    __slots__ = ("local", "layout", "mesh")

    def __init__(self, local: Any, layout: Layout, mesh: Mesh) -> None:
        if not isinstance(layout, Layout):
            raise TypeError(f"ShardedArray: layout must be a pyshard.Layout, got "
                            f"{type(layout).__name__}")
        if not isinstance(mesh, Mesh):
            raise TypeError(f"ShardedArray: mesh must be a pyshard.Mesh, got {type(mesh).__name__}")
        if not (hasattr(local, "shape") and hasattr(local, "dtype") and hasattr(local, "flags")):
            raise TypeError(f"ShardedArray: local must be a numpy or cupy array, got "
                            f"{type(local).__name__}")
        if layout.mesh_shape != mesh.shape:
            raise ValueError(
                f"ShardedArray: the layout is for a mesh of shape {layout.mesh_shape}, the mesh "
                f"has shape {mesh.shape}"
            )
        want = layout.local_shape(mesh.coords)
        if local.shape != want or local.dtype != layout.dtype:
            raise ValueError(
                f"local array {local.shape} {local.dtype} disagrees with the layout, which puts "
                f"{want} {layout.dtype} at mesh coords {mesh.coords}"
            )
        if type(local) is not np.ndarray and isinstance(local, np.ndarray):
            local = bk.as_array(local, "local")  # a subclass (memmap, matrix): a plain view
        self.local = local if local.flags.c_contiguous else bk.xp_of(local).array(local, order="C")
        self.layout = layout
        self.mesh = mesh

    @property
    def dtype(self) -> np.dtype:
        return self.layout.dtype

    def __repr__(self) -> str:
        return f"ShardedArray({self.layout!r}, local {self.local.shape} at {self.mesh.coords})"

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        # numpy would take it as an opaque object (np.asarray(x): a 0-d object array,
        # np.sum(x): x itself): say which array is meant instead
        raise TypeError(
            "a ShardedArray is not a numpy array: use x.local (this rank's shard) or x.full() "
            "(the whole array on every rank, collective)"
        )

    def plan_to(self, placements: PlacementsArg, sizes: SizesArg = None) -> Plan:
        """The (cached) plan that :meth:`redistribute` would run; no communication."""
        return plan(self.layout, self.target_layout(placements, sizes))

    def target_layout(self, placements: PlacementsArg, sizes: SizesArg = None) -> Layout:
        """The layout :meth:`redistribute` with these arguments would give (no communication)."""
        return relaid(self.layout, placements, sizes)

    @overload
    def redistribute(
        self,
        placements: PlacementsArg,
        sizes: SizesArg = None,
        algorithm: Optional[str] = None,
        out: Optional[Any] = None,
        wait: Literal[True] = True,
    ) -> ShardedArray: ...

    @overload
    def redistribute(
        self,
        placements: PlacementsArg,
        sizes: SizesArg = None,
        algorithm: Optional[str] = None,
        out: Optional[Any] = None,
        *,
        wait: Literal[False],
    ) -> Pending: ...

    @overload
    def redistribute(
        self,
        placements: PlacementsArg,
        sizes: SizesArg = None,
        algorithm: Optional[str] = None,
        out: Optional[Any] = None,
        wait: bool = True,
    ) -> Union[ShardedArray, Pending]: ...

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
        ``out``: a writable array of the target's local shape and dtype, on the same side
        (host or GPU) as ``local``, to write the result into (reused across calls, it saves
        the page faults of a fresh output); it is checked on this rank before any
        communication. A C-contiguous one is written in place; any other (Fortran-ordered,
        a slice) gets the result copied in, as numpy's ``out=`` does.

        ``wait=False``: start the redistribute and return a :class:`~pyshard.Pending`
        at once, whose ``wait()`` returns the result (``test()``: whether it is complete);
        the caller computes in between (every rank must pass the same ``wait``: the
        validation mode checks it). Several may be in flight, started in the same order
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
            try:
                algorithm = default_algorithm()
            except ValueError as e:  # PYSHARD_ALGORITHM refused
                _validate.refused(self.mesh.comm, "redistribute", e)
                raise
        dt = self.local.dtype  # (an identity test first: a few tens of ns on the fast path)
        if dt is not self.layout.dtype and dt != self.layout.dtype:
            err = TypeError(
                f"redistribute: the local array has dtype {dt}, the layout {self.layout.dtype} "
                f"(was .local replaced by an array of another dtype? ShardedArray.wrap the new "
                f"array with a layout of its dtype)")
            if _validate.enabled:  # every rank's check first: this rank's "local shard" names it
                self.mesh.check_live()
                self._agree(placements, sizes, algorithm, out, wait)
            raise err
        if sizes is None and wait and not _validate.enabled:
            # a repeated call: one lookup, then one call of the binding (executor.bind)
            try:
                key = (self.layout, *placements, algorithm, type(self.local))
                hit = self.mesh.cache.fast.get(key)
            except TypeError:  # unhashable or not a sequence: the general path says so
                hit = None
            if hit is not None:
                if self.local.shape != hit.shape:  # (a tuple compare: .local was replaced)
                    self._wrong_shape(hit.shape)
                if MPI.Is_finalized():  # (27 ns; MPICH ends the process on a call after it)
                    self.mesh.check_live()
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
        mesh.check_live()  # (a freed mesh's fast path is empty: every call comes here)
        local = self.local
        if _validate.enabled:  # one small Allgather: a mismatch raises on every rank
            self._agree(placements, sizes, algorithm, out, wait)
        shape = self.layout.local_shape(mesh.coords)
        if tuple(local.shape) != shape:
            self._wrong_shape(shape)
        if not local.flags.c_contiguous:  # a view, e.g. HaloArray.array's interior
            local = bk.xp_of(local).ascontiguousarray(local)
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
                    fast.put(key, FastEntry(*bind(execs, p), target, shape, execs))
            except TypeError:  # placements the layout accepted but cannot hash
                pass
        return ShardedArray.wrap(res, target, mesh)

    def local_problem(self) -> Optional[str]:
        """What is wrong with ``local`` as this rank's shard of ``layout`` (its shape and
        dtype at this rank's mesh coords), or None where it fits: ``.local`` can be replaced
        after construction, and the exchanges are planned on the layout (the core checks
        byte sizes only). Rank-local: calls that can agree it with the others do."""
        want = self.layout.local_shape(self.mesh.coords)
        local = self.local
        if tuple(getattr(local, "shape", ())) == want and \
                getattr(local, "dtype", None) == self.layout.dtype:
            return None
        return (f"{tuple(getattr(local, 'shape', ()))} {getattr(local, 'dtype', '?')}, the "
                f"layout puts {want} {self.layout.dtype} at mesh coords {self.mesh.coords} "
                f"(was .local replaced by an array of another shape or dtype? from_local or "
                f"ShardedArray.wrap the new array with a layout of its own)")

    def _wrong_shape(self, want: Tuple[int, ...]) -> None:
        raise ValueError(
            f"redistribute: the local array has shape {tuple(self.local.shape)}, the layout "
            f"puts {want} at mesh coords {self.mesh.coords} (was .local replaced by an array "
            f"of another shape? from_local or ShardedArray(local, layout, mesh) wrap the new "
            f"array with a layout of its shape)")

    def _agree(self, placements: PlacementsArg, sizes: SizesArg, algorithm: str,
               out: Any = None, wait: bool = True) -> None:
        """Validation mode: every rank must pass the same target, and an ``out`` that fits it
        or none (see pyshard._validate)."""
        err: Optional[Exception] = None
        fits = "none or fits the target"  # (each rank may pass one or not)
        try:
            dst = self.target_layout(placements, sizes)
            target = repr(dst)
            if out is not None:
                try:
                    check_out(out, plan(self.layout, dst), self.mesh, self.local)
                except (TypeError, ValueError) as e:
                    fits = f"refused ({e})"
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
            "out": fits,
            # (wait=False posts the first exchange nonblocking: a rank calling the blocking
            # one beside it waits for ever)
            "wait": repr(bool(wait)),
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
        extent raise :class:`ValueError` before any communication; a freed mesh (or MPI
        finalized) :class:`RuntimeError`.
        """
        self.mesh.check_live()
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
    coordinate 0 and zeros elsewhere (-0.0 for floats, the sum's identity); ``avg``, ``max``
    and ``min`` keep it everywhere (an ``avg`` reduced is the mean of equal values, which
    can differ from the value in its last bit).
    """
    mesh = _check_mesh(mesh)
    a = _check_array(global_array, "global_array")
    layout = Layout(a.shape, a.dtype, mesh.shape, placements, sizes)
    # (the Ellipsis keeps a 0-d array an array: a[()] is a numpy scalar, always native-endian)
    local = bk.xp_of(a).array(a[layout.box(mesh.coords) + (Ellipsis,)], order="C", copy=True)
    if zeroed(layout, mesh.coords):
        local[...] = _dtypes.sum_zero(local.dtype)
    return ShardedArray(local, layout, mesh)


def _spelled(v: Any) -> str:
    """``repr(v)`` with lists and tuples spelled alike (validation mode: ``[Shard(0)]`` and
    ``(Shard(0),)``, ``[4, 3]`` and ``(4, 3)`` are the same argument)."""
    if isinstance(v, (list, tuple)):
        return "(" + ", ".join(_spelled(e) for e in v) + ")"
    return repr(v)


def from_local(
    local: Any,
    mesh: Mesh,
    placements: PlacementsArg,
    global_shape: Union[int, Sequence[int], None] = None,
    sizes: SizesArg = None,
    validate: bool = False,
) -> ShardedArray:
    """Wrap this rank's shard ``local`` (numpy or cupy, or a DLPack / CUDA array interface
    producer, viewed without a copy) as a ShardedArray.

    A ``local`` that is not C-contiguous (a strided slice, a transpose) is copied, as
    :attr:`ShardedArray.local` is C-contiguous (see :class:`ShardedArray`): writes into the
    result (a scatter's ``into=``, an ``out=``) then land in the copy, not in ``local``.
    Pass a C-contiguous array where the writes must reach your own buffer.

    With ``global_shape`` (and ``sizes`` where the split is not balanced) there is no
    communication at all: every rank must pass the shard the layout gives it, or
    :class:`ValueError` (:class:`TypeError` for a non-array or a refused dtype) is raised on
    the ranks whose shard disagrees. ``validate=True`` adds one Allgather of the local
    shapes so that every rank raises the same error.

    With ``global_shape=None`` the extents are learned with one Allgather of the local
    shapes (the only place pyshard asks other ranks for shapes); mismatches then raise the
    same error on every rank.

    Wherever it communicates (``validate=True``, or ``global_shape=None``), a problem with
    one rank's ``local`` (not an array, a refused dtype, an ndim the placements do not fit)
    is carried in that same Allgather: every rank raises the same error, naming the ranks at
    fault, and none is left waiting.
    """
    mesh = _check_mesh(mesh)
    if global_shape is None and sizes is not None:  # the same on every rank: no communication
        raise ValueError("from_local: give sizes only together with global_shape")
    if _validate.enabled:  # the same arguments everywhere; then every shape check agrees
        args = {"placements": _spelled(placements), "global_shape": _spelled(global_shape)}
        args["sizes"] = repr(sizes)
        args["dtype"] = (f"refused ({local.err})" if isinstance(local, Refused)
                         else str(getattr(local, "dtype", type(local).__name__)))
        args["ndim"] = str(getattr(local, "ndim", "?"))
        _validate.agree(mesh.comm, "from_local", args)
        validate = True
    a: Any = None
    layout: Optional[Layout] = None
    if global_shape is not None and not validate:  # no communication: raise here, alone
        a = _check_array(local, "local")
        layout = Layout(global_shape, a.dtype, mesh.shape, placements, sizes)
        return ShardedArray(a, layout, mesh)
    # one Allgather follows: this rank's own problems travel in it (raising here would leave
    # the other ranks waiting in it), and every rank raises the same error after it
    err: Optional[BaseException] = None
    pls: Tuple[Any, ...] = ()
    try:
        a = _check_array(local, "local")
        pls = check_placements(placements, mesh.ndim, a.ndim)
        if global_shape is not None:
            layout = Layout(global_shape, a.dtype, mesh.shape, pls, sizes)
        if a.ndim > _MAX_NDIM:
            raise ValueError(f"from_local: arrays of ndim > {_MAX_NDIM} are not supported "
                             f"(local has ndim {a.ndim})")
    except Exception as e:  # noqa: BLE001 (every kind travels; the same type is raised)
        err = e
    shapes = _gather_shapes(a, mesh, err)
    if layout is None:
        global_shape, sizes_in = _infer_global(shapes, mesh, pls)
        layout = Layout(global_shape, a.dtype, mesh.shape, pls, sizes_in)
        return ShardedArray(a, layout, mesh)
    for r, shp in enumerate(shapes):
        coords = tuple(unravel(r, mesh.shape))
        want = layout.local_shape(coords)
        if tuple(shp) != want:
            raise ValueError(
                f"from_local: rank {r} at mesh coords {coords} passed a local array of shape "
                f"{tuple(shp)}, but the layout gives it {want}"
            )
    return ShardedArray(a, layout, mesh)


# the row each rank contributes to from_local's one Allgather, in int64s:
#   an array: [ndim, crc32 of the dtype's name, extents (_MAX_NDIM, zero-padded),
#              str(dtype) (_NAME_WORDS words of UTF-8, zero-padded)]
#   an error: [-1 - code (_ERRORS), length of the message in bytes, the message (UTF-8)]
_MAX_NDIM = 32
_NAME_WORDS = 4
_WIDTH = 2 + _MAX_NDIM + _NAME_WORDS
_ERRORS = (TypeError, ValueError, RuntimeError)


def _pack(text: str, words: int) -> Tuple[int, List[int]]:
    b = text.encode("utf-8")[: 8 * words]
    return len(b), np.frombuffer(b.ljust(8 * words, b"\0"), "<i8").tolist()


def _unpack(n: int, words: Sequence[int]) -> str:
    return np.asarray(words, "<i8").tobytes()[: max(0, min(int(n), 8 * len(words)))].decode(
        "utf-8", "replace")


def _group(by_rank: List[Tuple[int, str]]) -> str:
    """'rank 0: a; ranks 1, 2: b' (ranks in order, equal texts together)."""
    groups: dict = {}
    for r, text in by_rank:
        groups.setdefault(text, []).append(r)
    return "; ".join(("rank " if len(rs) == 1 else "ranks ") + ", ".join(map(str, rs)) + ": "
                     + text for text, rs in groups.items())


def _gather_shapes(a: Any, mesh: Mesh, err: Optional[BaseException] = None
                   ) -> List[Tuple[int, ...]]:
    """One Allgather of every rank's local shape, ndim and dtype (or of its error): raises
    the same error on every rank when a rank had one, or the ranks disagree in ndim or
    dtype."""
    if err is None:
        name = _dtypes.name(a.dtype)
        mine = [a.ndim, zlib.crc32(name.encode())] + list(a.shape)
        mine += [0] * (2 + _MAX_NDIM - len(mine))
        mine += _pack(str(a.dtype), _NAME_WORDS)[1]  # (what the error names)
    else:
        code = next((i for i, t in enumerate(_ERRORS) if isinstance(err, t)), 2)
        n, words = _pack(str(err), _WIDTH - 2)
        mine = [-1 - code, n] + words
    flat = _core.allgather_i64(mesh.core_comm(tuple(range(mesh.ndim))), mine)
    rows = [flat[i * _WIDTH : (i + 1) * _WIDTH] for i in range(mesh.size)]
    bad = [(r, row) for r, row in enumerate(rows) if row[0] < 0]
    if bad:
        exc = _ERRORS[min(-1 - bad[0][1][0], 2)]
        where = _group([(r, _unpack(row[1], row[2:])) for r, row in bad])
        raise exc(f"from_local: refused on {where} (every rank raises this)") from err
    for what, col in (("ndim", 0), ("dtype", 1)):
        if any(row[col] != rows[0][col] for row in rows):
            have = _group([(r, str(row[0]) if col == 0
                            else _unpack(8 * _NAME_WORDS, row[2 + _MAX_NDIM :]).rstrip("\0"))
                           for r, row in enumerate(rows)])
            raise ValueError(
                f"from_local: the local arrays disagree in {what} across ranks ({have}); every "
                f"rank must pass the same ndim and dtype"
            )
    return [tuple(row[2 : 2 + rows[0][0]]) for row in rows]


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
            elif ext[k] != shapes[r][d]:  # every rank of the group, by extent (rank 0 may
                # be the odd one out: naming the first that differs from it blamed the others)
                group = [q for q, cq in enumerate(coords)
                         if ravel([cq[m] for m in mdims], [mesh.shape[m] for m in mdims]) == k]
                have = _group([(q, str(shapes[q][d])) for q in group])
                raise ValueError(
                    f"from_local: local extents along array dim {d} disagree between ranks that "
                    f"must hold the same shard ({have})"
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
