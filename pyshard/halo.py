"""Halo (ghost-cell) exchange on any layout, blocking or overlapped with compute:
:class:`HaloArray`, a shard with ghost layers around it, runs this rank's
:class:`~pyshard.HaloPlan` (:mod:`pyshard.halo_planner`): one message per peer each way, packed
by the core's packers (CPU or CUDA, the same descriptor tables as ``redistribute``), moved
by one of four MPI methods (persistent point-to-point requests by default), or through
node-shared memory where ranks share a node (``method="shm"``, and ``"auto"`` for faces
of at least ``PYSHARD_SHM_MIN_BYTES``: the padded arrays live in node-shared memory and each
ghost cell is copied once, straight from its owner's interior, ``cpp/shm_halo.h``), split
into ``start()`` and ``wait()``. :func:`pyshard.route.halo_route` decides the path. The
semantics are :mod:`pyshard.halo_planner`'s.

:meth:`HaloArray.fold` (and :meth:`~HaloArray.start_fold` / ``wait()``) is the reverse
exchange, the adjoint of an update: every ghost cell an update writes is combined (sum, max
or min) into the owner's interior cell at its global index, over the same peers and bytes
with the directions swapped, in a fixed order (docs/halo.md, docs/adjoints.md).
"""

from __future__ import annotations

import ctypes
import logging
import time
import warnings
from math import prod
from typing import Any, Optional, Tuple

import numpy as np

from . import _backend as bk
from . import _core, _dtypes, _validate, collectives, config
from .exchange import Exchange
from .halo_planner import HaloPlan, PeriodicArg, WidthArg, halo_plan, halo_spec
from .layout import Layout, Placed
from .mesh import Mesh
from .route import FOLD_KIND, HALO_METHODS, core_transport, halo_reason, halo_route

__all__ = ["FOLD_OPS", "METHODS", "HaloArray", "HaloExchange"]

log = logging.getLogger("pyshard")

METHODS = HALO_METHODS  # the MPI methods, then "shm" (node-shared memory)
TUNE_REPS = 5  # updates per method when method="tune"
HALO_TAG = _core.HALO_TAG  # the core's table of MPI tags (cpp/tags.h)
FOLD_TAG = _core.FOLD_TAG  # the reverse exchange (fold), its own tag there
FOLD_OPS = ("sum", "max", "min")
_OP_CODE = {"sum": 0, "max": 1, "min": 2}  # cpp/halo.h FoldOp
# FOLD_KIND (route.py): the dtypes the core's host combine runs in; every other dtype
# (float16 and the ml_dtypes floats, accumulated in float32; bool; device arrays) combines here


# ----------------------------------------------------------------------------- execution


def _default_method() -> str:
    return config.get("PYSHARD_HALO_METHOD")


def update_geometry(p: HaloPlan) -> Any:
    """The core's geometry of an update on this rank: the messages of ``p`` (per peer its
    boxes in the padded array) and its periodic wraps onto itself."""
    return _core.HaloGeometry(
        p.itemsize,
        list(p.padded_shape),
        [(r, [(list(s), list(e)) for s, e in boxes]) for r, _, boxes in p.sends],
        [(r, [(list(s), list(e)) for s, e in boxes]) for r, _, boxes in p.recvs],
        [(list(s), list(t), list(e)) for s, t, e in p.local],
    )


def fold_geometry(p: HaloPlan) -> Any:
    """The update's geometry with sends and receives swapped: a fold sends its ghost boxes
    and receives into its interior boxes; its own wrap copies go ghost -> interior, combined
    at the place of this rank among the peers (the fixed order)."""
    local_at = sum(1 for r, _, _ in p.sends if r < p.rank)
    return _core.HaloGeometry(
        p.itemsize,
        list(p.padded_shape),
        [(r, [(list(s), list(e)) for s, e in boxes]) for r, _, boxes in p.recvs],
        [(r, [(list(s), list(e)) for s, e in boxes]) for r, _, boxes in p.sends],
        [(list(t), list(s), list(e)) for s, t, e in p.local],
        True,
        local_at,
    )


def _boxes(msgs: Any) -> list:
    return [(r, [(list(s), list(e)) for s, e in boxes]) for r, _, boxes in msgs]


def _node_peers(p: HaloPlan, on: set) -> list:
    """Per node peer this rank sends to (``on``: the other ranks of its node): its rank, its
    padded shape, and per box (start here, start in the peer's padded array, extent), from
    the peer's own plan (the same boxes in message order on both sides)."""
    out = []
    for r, qc, boxes in p.sends:
        if r not in on:
            continue
        q = halo_plan(p.layout, p.spec, qc)
        theirs = next(b for rr, _, b in q.recvs if rr == p.rank)
        if len(theirs) != len(boxes) or any(e != f for (_, e), (_, f) in zip(boxes, theirs)):
            raise RuntimeError(f"pyshard: halo plans of ranks {p.rank} and {r} disagree")
        out.append((r, list(q.padded_shape),
                    [(list(s), list(t), list(e)) for (s, e), (t, _) in zip(boxes, theirs)]))
    return out


def _shm_step(p: HaloPlan, comm: Any, node: Any, buf: Any, reverse: bool) -> Any:
    """The exchange through node-shared memory (``cpp/shm_halo.h``): node peers by copies
    between the padded arrays, peers on other nodes by persistent requests (an inner step of
    just their messages); for a fold, the combine order of the MPI path."""
    on = set(node.node_ranks) - {p.rank}
    off_sends = [m for m in p.sends if m[0] not in on]
    off_recvs = [m for m in p.recvs if m[0] not in on]
    peers = _node_peers(p, on)
    waiters = sum(1 for r, _, _ in p.recvs if r in on)
    if not reverse:
        geom = _core.HaloGeometry(
            p.itemsize, list(p.padded_shape), _boxes(off_sends), _boxes(off_recvs),
            [(list(s), list(t), list(e)) for s, t, e in p.local],
        )
        return _core.ShmHaloStep(comm, buf, geom, HALO_TAG, peers, waiters)
    geom = _core.HaloGeometry(
        p.itemsize, list(p.padded_shape), _boxes(off_recvs), _boxes(off_sends), [], True, 0
    )
    order, m, n = [], 0, 0  # by peer rank (the update's sends), this rank at its place
    for r, _, _ in p.sends:
        if r > p.rank and (2, 0) not in order:
            order.append((2, 0))
        if r in on:
            order.append((1, n))
            n += 1
        else:
            order.append((0, m))
            m += 1
    if (2, 0) not in order:
        order.append((2, 0))
    wraps = [(list(t), list(s), list(e)) for s, t, e in p.local]
    return _core.ShmHaloStep(comm, buf, geom, FOLD_TAG, peers, waiters, True, order, wraps)


def _bytes_at(ptr: int, n: int, xp: Any, owner: Any) -> Any:
    """A uint8 array over ``n`` bytes at ``ptr`` (host memory, or device memory for cupy)."""
    if xp is np:
        return np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(ptr))
    mem = xp.cuda.UnownedMemory(ptr, n, owner)
    return xp.ndarray((n,), dtype=np.uint8, memptr=xp.cuda.MemoryPointer(mem, 0))


class HaloExchange(Exchange):
    """A halo array's update (``op`` ``"halo"``) or fold (``"fold"``) :class:`Exchange`: the
    core's ``HaloStep`` (``method`` one of the MPI methods: one message per peer each way) or
    ``ShmHaloStep`` (``method`` ``"shm"``: node peers by copies between the padded arrays, the
    others by persistent requests), built once for the array."""

    __slots__ = ("method",)

    def __init__(self, op: str, route: Any, core: Any, method: str) -> None:
        super().__init__(op, route, core)
        self.method = method


def _mpi_step(p: HaloPlan, comm: Any, method: str, reverse: bool, r: Any) -> Any:
    """The core's MPI step of plan ``p``'s update (or, ``reverse``, fold) by ``method``, on
    the transport of route ``r``."""
    return _core.HaloStep(
        comm, fold_geometry(p) if reverse else update_geometry(p),
        getattr(_core.HaloMethod, method), FOLD_TAG if reverse else HALO_TAG, core_transport(r),
    )


def mpi_exchange(layout: Layout, spec: Any, mesh: Mesh, method: str, fold: bool,
                 device: bool = False) -> HaloExchange:  # fmt: skip
    """The halo update (or, ``fold=True``, fold) of ``layout`` with ``spec`` on ``mesh`` by
    the MPI ``method`` (one of :data:`pyshard.route.HALO_MPI`) for host arrays (``device``:
    GPU arrays, on the GPU route's transport), built as a :class:`HaloArray` builds its own:
    for front ends that run its core step on buffers of their own (pyshard.jax, on XLA's).
    Its core step takes any padded array of the plan's shape at each call."""
    p = halo_plan(layout, spec, mesh.coords)
    r = halo_route(layout, spec, mesh, method, device, fold=fold)
    core = _mpi_step(p, mesh.core_comm(tuple(range(mesh.ndim))), method, fold, r)
    return HaloExchange("fold" if fold else "halo", r, core, method)


class HaloArray:
    """A sharded array's local block with ghost layers around it (see the module doc).

    ``padded``: the local array with ``width`` ghost cells on each side of each dim;
    ``interior``: the view of ``padded`` that is this rank's owned box; ``array``: a
    :class:`~pyshard.ShardedArray` whose local array is ``interior`` (``redistribute`` and
    ``save`` work on it). :meth:`update` fills the ghost cells from the owners' current
    interiors; :meth:`start` / :meth:`wait` do the same in two halves so that the caller
    computes in between (:meth:`test`: whether the exchange is complete). Every rank of the
    mesh must call them, in the same order for all the halo arrays of a mesh. While an
    exchange is in flight (after :meth:`start`, before :meth:`wait`) the interior may be
    read and written (the sends were packed, or copied into the node peers, when
    :meth:`start` returned; not with ``method="datatype"``, whose MPI datatypes read it
    until :meth:`wait`), the ghost cells may not be touched (they are written by
    :meth:`wait`, or land by MPI at any time).

    :meth:`fold` is the reverse (the adjoint of :meth:`update` for ``op="sum"``): each ghost
    cell an update would write is combined into the interior cell of its owner;
    :meth:`start_fold` / :meth:`wait` split it. While a fold is in flight the interior may be
    read and written (what it holds at :meth:`wait` is what the contributions combine into:
    nothing lands there before), the ghost cells may be read but not written.
    """

    __slots__ = (
        "_padded", "_interior", "width", "periodic", "corners", "layout", "mesh", "method",
        "chosen", "fold_chosen",
        "_spec", "_cls", "_step", "_dev", "_active", "_array", "_fstep", "_fgeom", "_folding",
        "_route", "_froute", "_buf", "_tested",
    )

    def __init__(self, x: Placed, width: WidthArg, periodic: PeriodicArg = False,
                 corners: bool = True, method: Optional[str] = None) -> None:
        try:
            self._init(x, width, periodic, corners, method)
        except (TypeError, ValueError) as e:  # (validation: ranks that built theirs would
            # wait in their first update's agreement for this one)
            if isinstance(x, Placed):
                _validate.refused(x.mesh.comm, "halo update", e)
            raise

    def _init(self, x: Placed, width: WidthArg, periodic: PeriodicArg, corners: bool,
              method: Optional[str]) -> None:
        if not isinstance(x, Placed):
            raise TypeError(f"HaloArray: x must be a pyshard.ShardedArray (its layout gives the "
                            f"neighbours), got {type(x).__name__}")
        spec = halo_spec(x.layout, width, periodic, corners)
        method = _default_method() if method is None else method
        if method not in ("auto",) + METHODS + ("tune",):
            raise ValueError(
                f"with_halo: method must be one of {('auto',) + METHODS + ('tune',)}, got "
                f"{method!r}"
            )
        if method == "datatype" and bk.is_device(x.local):
            raise ValueError(
                "with_halo: method='datatype' takes host arrays (MPI datatypes on device "
                "memory need a CUDA-aware MPI's datatype engine); use 'persistent'"
            )
        problem = x.local_problem()
        if problem is not None:
            # (.local replaced by another array: the exchanges are planned on the layout, and
            # the core checks only the byte size, so a same-size dtype was read as bytes)
            raise ValueError(f"with_halo: the local array is {problem}")
        self._spec = spec
        self.width: Tuple[int, ...] = spec.width
        self.periodic: Tuple[bool, ...] = spec.periodic
        self.corners: bool = spec.corners
        self.method = method
        self.chosen: Optional[str] = None  # the method in use, once built ("tune": measured)
        self.layout: Layout = x.layout
        self.mesh: Mesh = x.mesh
        self._cls = type(x)
        local = x.local
        xp = bk.xp_of(local)
        shape = tuple(s + 2 * w for s, w in zip(local.shape, spec.width))
        self._route = halo_route(x.layout, spec, x.mesh, method, bk.is_device(local))
        self._froute = halo_route(x.layout, spec, x.mesh, method, bk.is_device(local), fold=True)
        self._buf: Any = None
        if self._route.node is not None and self._route.path in ("shm", "tune"):
            # in node-shared memory (a segment of its own, zeroed), for node peers to reach:
            # the pages of its ghost boxes that node peers write (and a fold reads), the rest
            # private where that is most of it (cpp/shm_halo.h)
            p = halo_plan(x.layout, spec, x.mesh.coords)
            on = set(self._route.node.node_ranks) - {p.rank}
            reach = [(list(s), list(e)) for r, _, bs in p.recvs if r in on for s, e in bs]
            self._buf = _core.HaloBuffer(self._route.node, prod(shape) * local.dtype.itemsize,
                                         list(shape), local.dtype.itemsize, reach)
            flat = np.frombuffer(self._buf, dtype=local.dtype, count=prod(shape))
            self._padded = flat.reshape(shape)
        else:
            self._padded = xp.zeros(shape, dtype=local.dtype)
        # (a 0-d array's interior is the whole 0-d array: index it with `...`, not `()`)
        self._interior = self._padded[
            tuple(slice(w, w + s) for w, s in zip(spec.width, local.shape)) or ...
        ]
        self.interior[...] = local
        self._dev = bk.is_device(local)
        self._step: Any = None
        self._active = False
        self._array: Optional[Placed] = None
        self.fold_chosen: Optional[str] = None
        self._fstep: Any = None
        self._fgeom: Any = None
        self._folding: Optional[str] = None  # the op of the fold in flight
        self._tested = False  # test() completed the exchange in flight; wait() has not run

    @property
    def padded(self) -> Any:
        """This rank's padded array: the interior and ``width`` ghost cells on each side of
        each dim (write into it, ``h.padded[...] = ...``; the attribute itself is fixed: the
        exchanges are planned on this array's memory)."""
        return self._padded

    @property
    def interior(self) -> Any:
        """The view of :attr:`padded` without its ghost cells (this rank's shard)."""
        return self._interior

    @property
    def array(self) -> Placed:
        """The owned values as a :class:`~pyshard.ShardedArray` (its local array is
        ``interior``, a view: no copy)."""
        if self._array is None:
            self._array = self._cls.wrap(self.interior, self.layout, self.mesh)
        return self._array

    @property
    def route(self) -> Any:
        """Where updates go (a :class:`pyshard.route.HaloRoute`: ``path``, ``algorithm``,
        ``candidates``, ``transport``), decided when the array was made."""
        return self._route

    @property
    def fold_route(self) -> Any:
        """Where folds go (as :attr:`route`)."""
        return self._froute

    @property
    def exchange(self) -> Optional[HaloExchange]:
        """The update's :class:`HaloExchange` once the first update (or :meth:`start`) has
        built it, else None."""
        return self._step

    @property
    def fold_exchange(self) -> Optional[HaloExchange]:
        """The fold's :class:`HaloExchange` once the first fold has built it, else None."""
        return self._fstep

    @property
    def node_buffer(self) -> Any:
        """The node-shared segment that holds :attr:`padded` where node peers reach it (its
        ``nbytes``, and ``shared_bytes``: the pages node peers write or read, the rest
        private), or None where :attr:`padded` is private memory."""
        return self._buf

    @property
    def plan(self) -> HaloPlan:
        """This rank's :class:`HaloPlan` (cached; no communication)."""
        return halo_plan(self.layout, self._spec, self.mesh.coords)

    def _core_step(self) -> Any:
        self.mesh.check_live()
        if _validate.enabled:  # every call, as a fold's (one rank folding meets it)
            _validate.agree(self.mesh.comm, "halo update", {
                "layout": repr(self.layout), "halo": repr(self._spec),
                "method": self.method,
            })
        if self._step is None:
            p = self.plan
            comm = self.mesh.core_comm(tuple(range(self.mesh.ndim)))
            if self._route.path == "tune":
                self.chosen, self._step = self._tune(comm, p)
            else:
                self.chosen = self._route.algorithm
                self._step = self._make(self.chosen, comm, p, False)
            if self._dev:
                bk.announce()
            log.debug("pyshard: halo exchange built for rank %d: %r (%s)", self.mesh.rank, p,
                      self.chosen)
        return self._step

    def _make(self, method: str, comm: Any, p: HaloPlan, reverse: bool) -> HaloExchange:
        """The exchange of ``method`` for an update (or, ``reverse``, a fold), on the MPI
        transport of the route chosen when this array was made (its core step keeps it)."""
        r = self._froute if reverse else self._route
        if method == "shm":
            core = _shm_step(p, comm, self._route.node, self._buf, reverse)
        else:
            core = _mpi_step(p, comm, method, reverse, r)
        x = HaloExchange("fold" if reverse else "halo", r, core, method)
        sent = sum(prod(e) for q, _, bs in p.sends if q != p.rank for _, e in bs) * p.itemsize
        received = sum(prod(e) for q, _, bs in p.recvs if q != p.rank for _, e in bs) * p.itemsize
        x.sent, x.received = (received, sent) if reverse else (sent, received)
        return x

    def _tune(self, comm: Any, p: HaloPlan) -> Tuple[str, Any]:
        """Time every candidate on this array (a few full updates each, the slowest rank's
        median) and keep the fastest: the same choice on every rank (one allreduce)."""
        best: Tuple[float, str, Any] = (float("inf"), "", None)
        for m in self._route.candidates:
            step = self._make(m, comm, p, False)
            times = []
            for _ in range(TUNE_REPS):
                t0 = time.perf_counter()
                self._run(step)
                times.append(time.perf_counter() - t0)
            t = collectives.max_all(self.mesh.comm, sorted(times)[len(times) // 2])
            if t < best[0]:
                best = (t, m, step)
        log.info("pyshard: halo method tuned for %r: %s (%.1f us)", self._spec, best[1],
                 best[0] * 1e6)
        return best[1], best[2]

    def _run(self, step: Any) -> None:
        step.calls += 1
        if self._dev:
            ptr, stream = self.padded.data.ptr, bk.stream_ptr()
            step.core.start_device(ptr, stream)
            step.core.wait_device(ptr, stream)
            bk.xp_of(self.padded).cuda.get_current_stream().synchronize()
        else:
            step.core.update(self.padded)

    def update(self) -> None:
        """Fill the ghost cells from the owners' current interiors; collective (blocking)."""
        if self._active or self._folding:
            raise RuntimeError("HaloArray.update(): an exchange is in flight; call wait() first")
        self._tested = False
        step = self._core_step()
        step.calls += 1
        if self._dev:
            ptr, stream = self.padded.data.ptr, bk.stream_ptr()
            step.core.start_device(ptr, stream)
            step.core.wait_device(ptr, stream)
        else:
            step.core.update(self.padded)

    def start(self) -> None:
        """Start filling the ghost cells and return at once; :meth:`wait` completes it."""
        if self._active or self._folding:
            raise RuntimeError("HaloArray.start(): already started; call wait() first")
        self._tested = False
        step = self._core_step()
        step.calls += 1
        if self._dev:
            step.core.start_device(self.padded.data.ptr, bk.stream_ptr())
        else:
            step.core.start(self.padded)
        self._active = True

    # -- the reverse exchange

    def _check_fold(self, op: str, what: str) -> None:
        """Errors found from the arguments and this array's state alone (the same on every
        rank that makes the same calls), raised before any communication."""
        self.mesh.check_live()
        bad = None
        if not isinstance(op, str) or op not in FOLD_OPS:
            bad = ValueError(f"HaloArray.{what}: op must be one of {FOLD_OPS}, got {op!r}")
        elif op != "sum" and self.padded.dtype.kind == "c":
            bad = ValueError(
                f"HaloArray.{what}: op={op!r} on complex data ({self.padded.dtype}) has no "
                f"order; complex arrays fold with op='sum' only"
            )
        if bad is not None:  # (validation mode: the others wait in their agreement for it)
            _validate.refused(self.mesh.comm, "halo fold", bad)
            raise bad
        if self._active:
            raise RuntimeError(
                f"HaloArray.{what}: an update is in flight (start() without wait()); call "
                f"wait() first"
            )
        if self._folding:
            raise RuntimeError(
                f"HaloArray.{what}: a fold is in flight (start_fold() without wait()); call "
                f"wait() first"
            )
        if _validate.enabled:
            _validate.agree(self.mesh.comm, "halo fold", {
                "layout": repr(self.layout), "halo": repr(self._spec),
                "method": self.method, "op": op,
            })

    def _fold_step(self) -> Any:
        if self._fstep is None:
            p = self.plan
            comm = self.mesh.core_comm(tuple(range(self.mesh.ndim)))
            self._fgeom = fold_geometry(p)  # (the Python combine's offsets: MPI methods)
            if self._froute.path == "tune":
                self.fold_chosen, self._fstep = self._tune_fold(comm, p)
            else:
                m = self._froute.algorithm
                self.fold_chosen = m
                self._fstep = self._make(m, comm, p, True)
            log.debug("pyshard: halo fold built for rank %d: %r (%s)", self.mesh.rank, p,
                      self.fold_chosen)
        return self._fstep

    def _tune_fold(self, comm: Any, p: HaloPlan) -> Tuple[str, Any]:
        """As :meth:`_tune`, timing folds of this array, put back as it was before each fold
        (a fold changes the interior: folds on folds would add up, and overflow a small
        dtype where the real fold does not) and afterwards."""
        keep = self.padded.copy()
        best: Tuple[float, str, Any] = (float("inf"), "", None)
        for m in self._froute.candidates:
            step = self._make(m, comm, p, True)
            self.fold_chosen = m  # _fold_wait reads it (the datatype method's buffer)
            times = []
            failed: Optional[BaseException] = None
            for _ in range(TUNE_REPS):
                self.padded[...] = keep
                t0 = time.perf_counter()
                try:  # (values thrown away: no floating-point warning or error of numpy's)
                    with np.errstate(all="ignore"), warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        self._fold_start(step, self.padded)
                        self._fold_wait(step, "sum", self.padded)
                        if self._dev:
                            bk.xp_of(self.padded).cuda.get_current_stream().synchronize()
                except Exception as e:  # every rank runs every timed fold, then all raise
                    failed = failed or e
                times.append(time.perf_counter() - t0)
            me = self.mesh.rank
            bad, who, t = collectives.max_all(
                self.mesh.comm, (failed is not None, me if failed else -1,
                                 sorted(times)[len(times) // 2]))
            if bad:
                self.padded[...] = keep
                if failed is not None:
                    raise failed
                raise RuntimeError(f"HaloArray.fold (method='tune'): rank {who}'s timed fold "
                                   f"raised (its own error names why)")
            if t < best[0]:
                best = (t, m, step)
        self.padded[...] = keep
        log.info("pyshard: halo fold method tuned for %r: %s (%.1f us)", self._spec, best[1],
                 best[0] * 1e6)
        return best[1], best[2]

    def _fold_start(self, step: Any, arr: Any) -> None:
        step.calls += 1
        if self._dev:
            step.core.start_device(arr.data.ptr, bk.stream_ptr())
        else:
            step.core.start(arr)

    def _fold_wait(self, step: Any, op: str, arr: Any) -> None:
        kind = None if self._dev else FOLD_KIND.get(arr.dtype)
        if kind is not None:  # the core combines (host, native dtypes)
            step.core.fold_wait(arr, _OP_CODE[op], kind)
            return
        if self._dev:
            step.core.wait_device(arr.data.ptr, bk.stream_ptr())
        else:
            step.core.fold_wait(arr, _OP_CODE[op], -1)
        self._combine(step, op, arr)

    def _combine(self, step: Any, op: str, arr: Any) -> None:
        """The combine in array-module operations (numpy or cupy), in the core's order: the
        received messages by peer rank, this rank's own wrap copies at its own place, boxes
        in message order; float16 and the ml_dtypes floats accumulate in float32, rounded
        once."""
        g, p, xp = self._fgeom, self.plan, bk.xp_of(arr)
        S = 0 if self.fold_chosen == "datatype" else g.send_bytes
        R = g.recv_bytes
        if R + g.local_bytes == 0:
            return
        buf = _bytes_at(step.core.buffer, S + R, xp, step.core) if R else None
        dt = arr.dtype
        w = self.width
        interior = arr[tuple(slice(ww, n - ww) for ww, n in zip(w, arr.shape)) or ...]
        acc_dt = _dtypes.accumulator(dt)
        ml = _dtypes.is_ml_float(dt)

        def wide(x: Any) -> Any:
            if acc_dt == dt:
                return x
            if ml:
                return _dtypes.widen(x.view(_dtypes.word(dt)), dt, xp)
            return x.astype(acc_dt)

        acc = wide(interior)
        ufunc = {"sum": xp.add, "max": xp.maximum, "min": xp.minimum}[op]
        isz = dt.itemsize

        def combine(start: Tuple[int, ...], ext: Tuple[int, ...], src: Any) -> None:
            d = acc[tuple(slice(s - ww, s - ww + e) for s, ww, e in zip(start, w, ext)) or ...]
            ufunc(d, wide(src), out=d)

        def apply(at: int, start: Tuple[int, ...], ext: Tuple[int, ...]) -> int:
            n = prod(ext) * isz
            combine(start, ext, buf[at:at + n].view(dt).reshape(ext))
            return at + n

        def local() -> None:  # straight from the ghost boxes (not written in flight)
            for s, t, e in p.local:  # forward (interior src, ghost dst, extent)
                combine(s, e, arr[tuple(slice(a, a + k) for a, k in zip(t, e)) or ...])

        for i, ((_, _, boxes), off) in enumerate(zip(p.sends, g.recv_offsets)):
            if i == g.local_at:
                local()
            at = S + off
            for start, ext in boxes:
                at = apply(at, start, ext)
        if g.local_at == len(p.sends):
            local()
        if acc_dt != dt:
            interior[...] = _dtypes.narrow(acc, dt, xp).view(dt) if ml else acc.astype(dt)

    def fold(self, op: str = "sum", refresh: bool = False) -> None:
        """Combine every ghost cell an :meth:`update` would write into the owner's interior
        cell at its global index (the reverse exchange; collective, blocking): ``op`` is
        ``"sum"`` (the adjoint of :meth:`update`), ``"max"`` or ``"min"``. Contributions
        combine in a fixed order (by peer rank, this rank's own periodic wraps at its own
        place, boxes in message order): the same bits on every run and with every method.
        The ghost cells are left as they are; ``refresh=True`` then fills them with the
        owners' new values (an :meth:`update`)."""
        self._check_fold(op, "fold()")
        self._tested = False
        step = self._fold_step()
        if not self._dev and op in _OP_CODE and self.padded.dtype in FOLD_KIND:
            step.calls += 1
            step.core.fold(self.padded, _OP_CODE[op], FOLD_KIND[self.padded.dtype])
        else:
            self._fold_start(step, self.padded)
            self._fold_wait(step, op, self.padded)
        if refresh:
            self.update()

    def start_fold(self, op: str = "sum") -> None:
        """Start a :meth:`fold` and return at once; :meth:`wait` completes it. In flight, the
        interior may be read and written (the contributions combine into what it holds at
        :meth:`wait`), the ghost cells may be read, not written."""
        self._check_fold(op, "start_fold()")
        self._tested = False
        step = self._fold_step()
        self._fold_start(step, self.padded)
        self._folding = op

    def wait(self) -> None:
        """Complete the exchange :meth:`start` (or :meth:`start_fold`) began: the ghost
        cells are filled (the interior cells combined), on a GPU ready on cupy's current
        stream. After a :meth:`test` that completed it, returns at once."""
        if self._folding or self._active:
            collectives.check_finalized()
        if self._folding:
            op, self._folding = self._folding, None
            self._fold_wait(self._fstep, op, self.padded)
            return
        if self._tested:
            self._tested = False
            return
        if not self._active:
            raise RuntimeError("HaloArray.wait(): no exchange in flight; call start() first")
        self._active = False
        if self._dev:
            self._step.core.wait_device(self.padded.data.ptr, bk.stream_ptr())
        else:
            self._step.core.wait(self.padded)

    def test(self) -> bool:
        """True when the exchange :meth:`start` (or :meth:`start_fold`) began has completed:
        the ghost cells are then filled (the interior cells combined), :meth:`wait` returns
        at once, and every later call returns True until the next exchange starts. With no
        exchange in flight, True (as ``MPI_Test`` on an inactive request). On the MPI methods
        it never blocks (``MPI_Testall`` on the step's requests; False while a message is
        out); on node-shared memory (``shm``) the first call completes the exchange as
        :meth:`wait` does (waiting for the node peers) and returns True."""
        if not (self._active or self._folding):
            return True
        collectives.check_finalized()
        step = self._fstep if self._folding else self._step
        probe = getattr(step.core, "test", None)
        if probe is not None and not probe():
            return False
        self.wait()
        self._tested = True
        return True

    def explain(self) -> str:
        """Peers, messages and bytes of this rank's exchange, and how it runs."""
        how = {
            "persistent": "persistent point-to-point requests (MPI_Send_init/MPI_Recv_init, "
            "MPI_Startall) on packed buffers",
            "p2p": "point-to-point messages (MPI_Isend/MPI_Irecv) per update on packed buffers",
            "datatype": "persistent point-to-point requests on the padded array with one MPI "
            "datatype (subarrays) per message: the MPI library packs and unpacks",
            "neighbor": "one neighbourhood all-to-all on a distributed-graph communicator of "
            "the peers (MPI_Neighbor_alltoallv_init where MPI-4, else MPI_Ineighbor_alltoallw) "
            "on packed buffers",
            "shm": "node-shared memory: the padded arrays live in it (the pages node peers reach: "
            "below), each ghost cell is copied "
            "once from its owner's interior straight into it (a handshake of counters per "
            "update, no messages); peers on other nodes by persistent requests",
        }
        m = self.chosen or self._route.algorithm
        if m == "tune":
            text = self.plan.explain() + "\n  method: tune (measured at the first update)"
        else:
            tuned = " (chosen by measurement)" if self.method == "tune" else ""
            text = self.plan.explain() + f"\n  runs as {how[m]}{tuned}"
        p = self.plan
        nl = len(p.local)
        text += (
            f"\n  fold (the reverse, HaloArray.fold): the same {len(p.peers)} peer(s) and bytes "
            f"with the directions swapped: sends {p.recv_bytes} B in {len(p.recvs)} "
            f"message(s) from the ghost cells, receives {p.send_bytes} B in {len(p.sends)} "
            f"message(s) into the buffer, then combines them into the interior"
            + (f" with its {nl} periodic wrap box(es) onto itself" if nl else "")
            + " in a fixed order (by peer rank, its own wraps at its own rank's place, boxes "
            "in message order)"
            + (f"; runs as {self.fold_chosen}" if self.fold_chosen else "")
        )
        why = halo_reason(self._route, self.layout, self._spec, self.mesh, self.method)
        text += f"\n  route ({self.method}): {why}"
        node = self._route.node
        if node is not None and m in ("shm", "tune"):  # (not where tune measured MPI faster)
            on = set(node.node_ranks) - {p.rank}
            mine = [r for r in p.peers if r in on]
            text += (
                f"; it reaches {len(mine)} of this rank's {len(p.peers)} peer(s) (ranks "
                f"{mine}), MPI the others" + (" (where the measurement picks node-shared "
                                             "memory)" if m == "tune" else "")
            )
        if self._buf is not None:
            sb, nb = self._buf.shared_bytes, self._buf.nbytes
            text += (
                f"\n  padded array: {sb} of its {nb} B in node-shared memory"
                + (" (all of it)" if sb >= nb else
                   " (the pages of the ghost boxes node peers reach; the rest private)")
            )
        if self._dev:
            text += "\n  GPU arrays: " + (
                "pack kernel, MPI on device memory"
                if self._route.transport == "direct"
                else "pack kernel, staged through pinned host buffers"
            )
        return text

    def __repr__(self) -> str:
        return (
            f"HaloArray({self.layout!r}, width {self.width}, periodic {self.periodic}, "
            f"{'box' if self.corners else 'star'} stencil, padded {tuple(self.padded.shape)})"
        )
