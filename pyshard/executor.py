"""Plan execution: each step of a plan bound to this rank and memory kind (an executor built
once from the step's geometry and kept in the mesh's bounded cache), the exchange-algorithm
rule, and the results pool. ``ShardedArray.redistribute`` runs these."""

from __future__ import annotations

import logging
from math import prod
from typing import Any, Callable, Optional, Tuple

import numpy as np

from . import _backend as bk
from . import _core, _tune
from ._dtypes import accumulator, is_ml_float, sum_zero
from ._dtypes import identity as ml_identity
from .collectives import check_finalized
from .exchange import NONBLOCKING_MIN_BLOCK, Exchange, Request
from .geometry import (
    Pads,
    attach_runs,
    gather_push_specs,
    geometry,
    pad_at,
    padded,
    push_specs,
)
from .layout import Layout, Partial, Shard
from .memory import allocate, pooled
from .mesh import Mesh
from .planner import Plan, Step
from .route import ALGORITHMS, Route, check_algorithm, choose_algorithm, core_transport, route

__all__ = ["ALGORITHMS", "PENDING_WARN", "Pending", "check_out", "choose_algorithm",
           "executors", "one_exchange", "start"]

log = logging.getLogger("pyshard")

PENDING_WARN = 1024
"""Redistributes in flight on one mesh at which a warning is logged (handles dropped
unwaited: see :class:`Pending`)."""




class _Step(Exchange):
    """One step of a plan bound to this rank and memory kind: the :class:`Exchange` of a
    redistribute (its core object built once from the step's geometry, on the path
    :func:`pyshard.route.route` chose, with the MPI transport of that route, which it keeps)
    and how to run it. ``direct``: the core writes the result straight into its output (the
    hot path)."""

    __slots__ = ("step", "out_shape", "dtype", "dev", "node", "pooled", "direct", "upcast",
                 "wide", "spares", "bound", "pads")  # fmt: skip

    def __init__(self, step: Step, mesh: Mesh, r: Route, dev: bool,
                 pads: Pads = (None, None)) -> None:
        super().__init__("redistribute", r)
        self.step = step
        self.pads = pads  # how the source's and the result's storage are padded (exchange)
        self.node = r.node if r.path == "shm" else None  # results in node-shared memory
        self.out_shape = tuple(padded(step.dst.local_shape(mesh.coords),
                                      pad_at(pads[1], mesh.coords)))
        self.dtype = step.dst.dtype
        self.dev = dev
        self.pooled = not dev and pooled(prod(self.out_shape) * self.dtype.itemsize)
        self.direct = False
        self.upcast: Optional[np.dtype] = None
        self.wide = False  # leave the result in ``upcast`` for the next reduction step
        self.spares: list = []  # the core's PendingExchange objects free for reuse
        self.bound: Any = None  # the core binding of the fast path (executor.bind), if any
        self.build(mesh)
        if self.core is not None and step.is_collective:
            staged = r.path == "staged"
            self.need = int(self.core.staged_bytes if staged else self.core.workspace_bytes)

    def build(self, mesh: Mesh) -> None:
        pass

    def _call(self, src: Any, res: Any) -> None:
        if self.dev:
            self.core.run_device(src.data.ptr, res.data.ptr, bk.stream_ptr())
        else:
            self.core.run(src, res)

    def run(self, local: Any, out: Optional[Any] = None) -> Any:
        """Run the step on ``local``; write into ``out`` when given (the target's shape)."""
        res = out if out is not None else allocate(self.out_shape, self.dtype, local, self.node)
        self._call(local, res)
        self.calls += 1
        return res

    def runs(self) -> int:
        """Runs through the executor and through its fast-path binding (counted by the core)."""
        return self.calls + (int(self.bound.calls) if self.bound is not None else 0)


class _Exchange(_Step):
    """``alltoallv``: node-shared memory (``ShmExchangeStep``) or an MPI exchange."""

    __slots__ = ()

    def build(self, mesh: Mesh) -> None:
        step, coords = self.step, mesh.coords
        comm, ws = mesh.core_comm(step.mesh_dims), mesh.cache.workspace
        self.direct = True
        if self.route.path == "shm":
            self.core = _shm_step(step, coords, comm, self.node, ws, push_specs, self.pads)
            return
        algo = getattr(_core.Algorithm, self.route.algorithm)
        block = step.max_block_volume() * step.src.dtype.itemsize  # the same on every rank
        pad = block if algo == _core.Algorithm.alltoall else 0
        # Ialltoallv (local copy overlapped) for large blocks, Alltoallv for small ones:
        # decided from the layouts, so every rank calls the same collective
        g = geometry(step, coords, algo, pad, self.pads)
        self.core = _core.ExchangeStep(comm, g, ws, core_transport(self.route),
                                       block >= NONBLOCKING_MIN_BLOCK)


class _Gather(_Step):
    """``allgatherv``: every rank writes its shard into every node peer's result once
    (node-shared memory), or ``MPI_Allgather(v)``."""

    __slots__ = ()

    def build(self, mesh: Mesh) -> None:
        step, comm, ws = self.step, mesh.core_comm(self.step.mesh_dims), mesh.cache.workspace
        self.direct = True
        if self.route.path == "shm":
            self.core = _shm_step(step, mesh.coords, comm, self.node, ws, gather_push_specs)
        else:
            self.core = _core.AllgathervStep(comm, geometry(step, mesh.coords), ws,
                                             core_transport(self.route))


def _shm_step(step: Step, coords: Tuple[int, ...], comm: Any, node: Any, ws: Any,
              specs: Callable[..., Any], pads: Pads = (None, None)) -> Any:
    item = step.src.dtype.itemsize
    sshape = padded(step.src.local_shape(coords), pad_at(pads[0], coords))
    dshape = padded(step.dst.local_shape(coords), pad_at(pads[1], coords))
    pushes, recvs, local = specs(step, coords) if pads[1] is None else specs(step, coords, pads[1])
    attach = step.kind in ("alltoallv", "allgatherv") and attach_runs(step, coords, pads)
    return _core.ShmExchangeStep(comm, node, item, sshape, dshape, pushes, recvs, local, ws,
                                 attach)


class _Reduction(_Step):
    """``reduce_scatter`` and ``allreduce``, on node-shared memory or MPI; float16, bfloat16
    and float8 accumulate in float32 and round once after the last reduction in a row;
    ``avg`` sums, then scales."""

    __slots__ = ("scale",)

    def build(self, mesh: Mesh) -> None:
        step, coords = self.step, mesh.coords
        comm, ws = mesh.core_comm(step.mesh_dims), mesh.cache.workspace
        rdt = accumulator(step.src.dtype)
        self.upcast = rdt if rdt != step.src.dtype else None
        # the divisor (sum / n, as numpy's mean: sum * (1 / n) rounds twice, 0.7 -> 0.69..98)
        self.scale = prod(step.group_shape) if step.op == "avg" else None
        self.direct = self.upcast is None and self.scale is None
        op = getattr(_core.ReduceOp, _reduce_op(step.src.dtype, step.op))
        shm, tr = self.route.path == "shm", core_transport(self.route)
        if step.kind == "allreduce":
            shape = list(step.src.local_shape(coords))
            if shm:  # every rank of the communicator on one node
                self.core = _core.ShmAllreduceStep(self.node, rdt, op, shape)
            else:
                self.core = _core.AllreduceStep(comm, rdt, op, shape, ws, tr)
        elif shm:
            self.core = _core.ShmReduceScatterStep(self.node, geometry(step, coords), rdt, op)
        else:
            self.core = _core.ReduceScatterStep(comm, geometry(step, coords), rdt, op, ws, tr)

    def run(self, local: Any, out: Optional[Any] = None) -> Any:
        if self.direct:  # into a private result (the node transport stages the pieces)
            res = out if out is not None else allocate(self.out_shape, self.dtype, local)
            self._call(local, res)
            return res
        xp = bk.xp_of(local)
        src = local
        if self.upcast is not None:
            if local.dtype != self.upcast:  # (a previous reduction step left it wide)
                src = bk.astype(local, self.upcast)
            res = xp.empty(self.out_shape, dtype=self.upcast)
        else:
            res = out if out is not None else xp.empty(self.out_shape, dtype=local.dtype)
        self._call(src, res)
        if self.scale is not None:
            # complex: each part divided by the real n (numpy's complex / complex multiplies
            # by 1 / (n + 0j), two roundings: 7 x (3 + 3j) / 7 gave 3.0000002 + 3.0000002j)
            # (.real and .imag: views of any array, 0-d and strided ones too)
            for part in (res.real, res.imag) if res.dtype.kind == "c" else (res,):
                part /= part.dtype.type(self.scale)
        if self.upcast is not None:  # one rounding, to nearest even, after the last reduction
            if self.wide:
                return res
            if out is None:
                return bk.astype(res, self.dtype)
            bk.copy_cast(out, res)
            return out
        return res


class _LocalCopy(_Step):
    """``local_copy``: this rank's target box sliced out of its source (no communication)."""

    __slots__ = ()

    def build(self, mesh: Mesh) -> None:
        self.core = local_slices(self.step.dst, self.step.src, mesh.coords)

    def run(self, local: Any, out: Optional[Any] = None) -> Any:
        part = local[self.core]
        if out is None:
            return bk.xp_of(local).array(part, order="C", copy=True)
        bk.xp_of(local).copyto(out, part)
        return out


class _Relabel(_Step):
    """``relabel``: the same local array under other placements (no communication; a plan of
    relabels alone copies it at the end, :func:`_steps`)."""

    __slots__ = ()

    def run(self, local: Any, out: Optional[Any] = None) -> Any:
        if out is None:
            return local
        bk.xp_of(local).copyto(out, local)
        return out


class _MakePartial(_Step):
    """``make_partial``: Replicate or Shard -> Partial. Spread dims (the source shards them):
    the shard inside the op's identity; replicated dims: keep the value, or zero it for sum
    away from coordinate 0."""

    __slots__ = ("zero", "fill")

    def build(self, mesh: Mesh) -> None:
        step, coords = self.step, mesh.coords
        spread = [m for m in step.mesh_dims if isinstance(step.src.placements[m], Shard)]
        self.zero = any(
            step.dst.placements[m].op == "sum" and coords[m] != 0
            for m in step.mesh_dims
            if m not in spread
        )
        self.fill: object = None
        if spread:
            self.fill = _identity(step.dst.dtype, _fill_op(step.dst, spread[0], coords))
            self.core = local_slices(step.src, step.dst, coords)

    def run(self, local: Any, out: Optional[Any] = None) -> Any:
        xp = bk.xp_of(local)
        if self.core is not None:
            res = out if out is not None else xp.empty(self.out_shape, local.dtype)
            res[...] = self.fill  # the reduction's identity
            if not self.zero:
                res[self.core] = local
            return res
        if self.zero:  # (the sum's identity: -0.0 for floats)
            z = sum_zero(local.dtype)
            if out is None:
                return xp.full(self.out_shape, z, local.dtype)
            out[...] = z
            return out
        if out is None:
            return xp.array(local, order="C", copy=True)
        xp.copyto(out, local)
        return out


_KINDS = {
    "alltoallv": _Exchange, "allgatherv": _Gather, "reduce_scatter": _Reduction,
    "allreduce": _Reduction, "local_copy": _LocalCopy, "relabel": _Relabel,
    "make_partial": _MakePartial,
}  # fmt: skip


def local_slices(box_of: Layout, rel: Layout, coords: Tuple[int, ...]) -> Tuple[slice, ...]:
    """This rank's box in ``box_of`` as slices of its local array in ``rel``."""
    return tuple(
        slice(a - o, b - o)
        for (a, b), (o, _) in zip(
            (box_of.interval(d, coords) for d in range(box_of.ndim)),
            (rel.interval(d, coords) for d in range(rel.ndim)),
        )
    )


def _fill_op(dst: Layout, m: int, coords: Tuple[int, ...]) -> str:
    """Whose identity fills the cells outside this rank's shard where mesh dim ``m`` turns
    from Shard into Partial. The Partial dims reduce in mesh-dim order, dim 0 first, so the
    dims before ``m`` must reduce those cells to ``m``'s identity: where this rank's
    coordinate is 0 on each of them it holds ``m``'s identity, else the identity of the
    first of them (the first reduced) where its coordinate is not 0. Each reduction then
    meets one value that passes and identities of its own op: nothing is combined twice (n
    copies of an integer's lowest value summed would wrap; +inf and -inf summed are NaN).
    ``avg`` dims are skipped: their ranks then hold equal values, whose mean is that value
    up to its last bit (``avg`` is for floats only)."""
    for k in range(m):
        p = dst.placements[k]
        if isinstance(p, Partial) and p.op != "avg" and coords[k] != 0:
            return p.op
    return dst.placements[m].op


def _identity(dtype: np.dtype, op: str) -> object:
    """The identity of reduction ``op`` in ``dtype`` (0, -0.0 for a float sum, the lowest or
    the highest value)."""
    if op == "sum":
        return sum_zero(dtype)
    if is_ml_float(dtype):  # bfloat16, float8: -inf / +inf, or the extremes where none
        return ml_identity(dtype, op)
    if dtype.kind == "b":
        return dtype.type(op == "min")
    if dtype.kind == "f":
        return dtype.type(-np.inf if op == "max" else np.inf)
    info = np.iinfo(dtype)
    return dtype.type(info.min if op == "max" else info.max)


def _reduce_op(dtype: np.dtype, op: Optional[str]) -> str:
    """The MPI reduction for Partial ``op`` (avg sums, then scales; bool uses or / and)."""
    if dtype.kind == "b":
        return {"sum": "lor", "max": "lor", "min": "land"}[op or "sum"]
    return {"sum": "sum", "avg": "sum", "max": "max", "min": "min"}[op or "sum"]


def step_executor(s: Step, mesh: Mesh, r: Route, dev: bool = False) -> _Step:
    """Step ``s`` bound on route ``r`` (what :func:`executors` builds for each step; the
    front ends that run a plan's steps themselves, pyshard.jax, take its ``core``)."""
    return _KINDS[s.kind](s, mesh, r, dev)


def _exec(s: Step, mesh: Mesh, algorithm: str, dev: bool,
          pads: Pads = (None, None)) -> _Step:
    """Step ``s`` bound on the path :func:`pyshard.route.route` takes (measured first where
    it says ``tune``); ``pads``: an exchange's storage padding (:func:`executors`)."""
    r = route(s, mesh, algorithm, dev)
    if r.path == "tune":
        def build(a: str) -> _Step:
            return _KINDS[s.kind](s, mesh, route(s, mesh, a, dev), dev)

        r = route(s, mesh, _tune.choose(s, mesh, dev, build, r.candidates), dev)
    if pads != (None, None):
        return _Exchange(s, mesh, r, dev, pads)
    return _KINDS[s.kind](s, mesh, r, dev)


def one_exchange(p: Plan) -> bool:
    """Is plan ``p`` one all-to-all exchange (the plans whose storage can be padded)?"""
    return len(p.steps) == 1 and p.steps[0].kind == "alltoallv"


def executors(p: Plan, mesh: Mesh, algorithm: str = "auto", like: Any = None,
              pads: Pads = (None, None)) -> list:
    """The executors of plan ``p`` on this rank for arrays like ``like`` (numpy by default),
    built once and kept in the mesh's bounded cache. ``pads``: for a host plan of one
    exchange, the rules (the same on every rank) by which its source's and its result's
    storage are :func:`~pyshard.geometry.padded`: its ``run`` then takes and returns that
    storage, whose views are the local arrays (:mod:`pyshard.fft`'s passes along a leading
    axis run faster there)."""
    dev = bk.is_device(like)
    key = (p, algorithm, dev, pads)
    cache = mesh.cache
    execs = cache.execs.get(key)
    if execs is None:
        check_algorithm(algorithm)  # the precise error, whatever the plan
        if pads != (None, None) and (dev or not one_exchange(p)):
            raise ValueError("executors: padded storage is for host plans of one exchange, "
                             f"not {p}")
        if dev:
            bk.announce()
        execs = [_exec(s, mesh, algorithm, dev, pads) for s in p.steps]
        for e, (sent, received) in zip(execs, p.rank_bytes(mesh.coords)):
            e.sent, e.received = sent, received
        for a, b in zip(execs, execs[1:]):  # reductions in a row: accumulate, round once
            a.wide = a.upcast is not None and b.upcast is not None
        cache.execs.put(key, execs)
        cache.note(execs)
        log.debug("pyshard: built %s (%s) for rank %d", p, algorithm, mesh.rank)
    return execs


def run_steps(execs: list, p: Plan, mesh: Mesh, local: Any, out: Optional[Any]) -> Any:
    """Run the executors ``execs`` of plan ``p`` on ``local`` (into ``out`` when given)."""
    if out is not None:
        want = execs[-1].out_shape if execs else local.shape
        if not out_ok(out, want, p.dst.dtype, local):
            check_out(out, p, mesh, local)  # the precise error, or a strided out: copied into
            return _copy_into(out, _steps(execs, local, None))
    return _steps(execs, local, out)


def _copy_into(out: Any, res: Any) -> Any:
    """``res`` copied into ``out``, an ``out=`` that fits the result but is not C-contiguous
    (Fortran-ordered, a slice): taken as numpy's ``out=`` takes any writable array. Refusing
    it would be a trap: whether such a buffer is C-contiguous can differ by rank (a
    one-column Fortran array is), and the ranks that raised would leave the others waiting."""
    bk.xp_of(res).copyto(out, res)
    return out


def _steps(execs: list, local: Any, out: Optional[Any]) -> Any:
    if not execs:
        if out is None:
            return local
        bk.xp_of(local).copyto(out, local)
        return out
    res = local
    last = len(execs) - 1
    for i, e in enumerate(execs):
        res = e.run(res, out if i == last else None)
    if res is local:  # relabels alone: only a redistribution to the same layout shares memory
        res = bk.xp_of(local).array(local, order="C", copy=True)
    return res


# the core steps a host plan of one direct step binds whole (see bind)
_BOUND = {
    _core.ExchangeStep: ("exchange", _core.BoundExchange),
    _core.AllgathervStep: ("allgatherv", _core.BoundAllgatherv),
}


class CoreBinding:
    """A repeated redistribute's core step bound whole (the second value of :func:`bind`, kept
    in the mesh's fast path as ``Mesh.cache.fast``'s entry's ``binding``): ``kind``, the step
    it binds (``"exchange"``: an all-to-all exchange; ``"allgatherv"``: a gather), and
    ``calls``, how many times its one C++ function has run."""

    __slots__ = ("kind", "core")

    def __init__(self, kind: str, core: Any) -> None:
        self.kind = kind
        self.core = core  # the core's BoundExchange or BoundAllgatherv: its fn is the call

    @property
    def calls(self) -> int:
        """How many times the bound step has run."""
        return int(self.core.calls)

    def __repr__(self) -> str:
        return f"CoreBinding({self.kind!r}, calls={self.calls})"


def bind(
    execs: list, p: Plan
) -> Tuple[Callable[[Any, Optional[Any]], Any], Optional[CoreBinding]]:
    """The one call a repeated redistribute makes (``ShardedArray.redistribute``'s fast
    path): ``call(local, out)`` runs the executors ``execs`` of plan ``p`` and returns the
    result array, or returns None having done nothing when ``local`` or ``out`` is not what
    the binding takes (a non-contiguous source, an ``out`` that fails :func:`out_ok`); the
    caller then takes the general path, which says what is wrong.

    A host plan of one exchange or gather straight into its output binds the core step
    itself (``_core.BoundExchange``, ``BoundAllgatherv``): ``call`` is its ``fn``, one C++
    function that checks the arrays, allocates the result (from the result pool when large)
    and runs the step. Any other plan binds :func:`_steps` over its executors. The
    collectives and their counts are the executors', fixed by the layouts; the binding only
    decides who allocates. Returns ``(call, CoreBinding or None)``: the
    :class:`CoreBinding` where the core step is bound whole.
    """
    if len(execs) == 1:
        e = execs[0]
        kind = _BOUND.get(type(e.core)) if e.direct and not e.dev else None
        if kind is not None:
            bound = kind[1](e.core, e.dtype, e.pooled)
            if e.bound is not None:  # a binding made again: keep the old one's runs
                e.calls += int(e.bound.calls)
            e.bound = bound
            return bound.fn, CoreBinding(kind[0], bound)
    want = execs[-1].out_shape if execs else None  # no steps: the source's shape
    dtype = p.dst.dtype

    def call(local: Any, out: Optional[Any]) -> Any:
        if not local.flags.c_contiguous:
            return None
        if out is not None and not out_ok(out, local.shape if want is None else want, dtype, local):
            return None
        return _steps(execs, local, out)

    return call, None


def out_ok(out: object, shape: tuple, dtype: np.dtype, local: Any) -> bool:
    """The cheap test of an ``out=`` buffer (``check_out`` says what is wrong)."""
    return (
        type(out) is type(local)
        and out.shape == shape
        and out.dtype == dtype
        and out.flags.c_contiguous
        and (out.flags.writeable if type(out) is np.ndarray else True)
        and not (out.size and bk.xp_of(local).may_share_memory(out, local))
    )


def check_out(out: object, p: Plan, mesh: Mesh, local: Any) -> None:
    want = p.dst.local_shape(mesh.coords)
    if not isinstance(out, np.ndarray) and not bk.is_device(out):
        raise TypeError(f"out must be a numpy or cupy array, got {type(out).__name__}")
    bk.same_kind(local, out, "the array's local shard", "out")
    if out.shape != want or out.dtype != p.dst.dtype:
        raise ValueError(
            f"out has shape {out.shape} {out.dtype}, the target layout needs {want} {p.dst.dtype}"
        )
    if isinstance(out, np.ndarray) and not out.flags.writeable:
        raise ValueError("out must be writable")
    if out.size and bk.xp_of(local).shares_memory(out, local):
        raise ValueError("out must not overlap the source array")
    if type(out) is not type(local):
        raise TypeError(f"out must be a plain {type(local).__name__}, got {type(out).__name__}")


# ----------------------------------------------------------------------------- in flight


def _startable(e: _Step) -> bool:
    """Can this executor's step be posted when the redistribute starts and completed later
    (an exchange on the alltoallv or p2p algorithm)?"""
    return (
        e.direct
        and e.step.kind == "alltoallv"
        and e.core.algorithm in (_core.Algorithm.alltoallv, _core.Algorithm.p2p)
    )


class Pending(Request):
    """A redistribute in flight, from ``ShardedArray.redistribute(..., wait=False)``.

    :meth:`wait` returns the result; :meth:`test` says whether it is complete (as
    ``MPI_Test``: once it returns True, :meth:`wait` returns the result at once). Several may
    be in flight on one mesh; every rank must
    start them in the same order, and may wait for them in any order: waiting for one first
    completes, in start order, those started before it (identically on every rank, so the
    collectives of later steps match). Overlap: the first step of the plan is posted when
    the redistribute starts if it is an exchange on the ``alltoallv`` or ``p2p`` algorithm
    (the common case: a ``Shard -> Shard`` transpose, a rebalance); its remaining steps run in
    :meth:`wait`. Any other plan (a gather, a reduction first, a step on ``alltoall`` or
    ``alltoallw``) runs whole when it starts, and :meth:`wait` only returns it.

    Until :meth:`wait` returns, the source array and ``out`` must stay alive and unwritten
    (the source may be read). A handle dropped without :meth:`wait` stays in flight (with
    its buffers) until a later redistribute's :meth:`wait` on the mesh completes it, or
    :meth:`Mesh.free` does: wait for every handle.
    """

    __slots__ = ("_mesh", "_execs", "_plan", "_local", "_out", "_res", "_core", "_wrap",
                 "_result", "_done")

    def __init__(self, mesh: Mesh, execs: list, p: Plan, local: Any, out: Optional[Any],
                 wrap: Any) -> None:
        self._mesh = mesh
        self._execs = execs
        self._plan = p
        self._local = local
        self._out = out
        self._wrap = wrap
        self._res: Any = None
        self._core: Any = None
        self._result: Any = None
        self._done = False

    def _start(self) -> None:
        execs, local, out = self._execs, self._local, self._out
        if not execs or not _startable(execs[0]):
            self._result = self._wrap(run_steps(execs, self._plan, self._mesh, local, out))
            self._done = True
            return
        e = execs[0]
        last = len(execs) == 1
        res = out if last and out is not None else allocate(e.out_shape, e.dtype, local)
        pe = e.spares.pop() if e.spares else _core.PendingExchange()
        if e.dev:
            e.core.start_device(local.data.ptr, res.data.ptr, bk.stream_ptr(), pe)
        else:
            e.core.start(local, res, pe)
        e.calls += 1
        self._res, self._core = res, pe
        self._mesh.pending.append(self)
        if len(self._mesh.pending) == PENDING_WARN:  # (each time the count climbs past it)
            log.warning("pyshard: %d redistributes in flight on %r: a handle dropped without "
                        "wait() keeps its buffers and requests until a later wait() or "
                        "Mesh.free() completes it; wait for every handle", PENDING_WARN,
                        self._mesh)

    def _finish(self) -> None:
        """Complete this one (the oldest in flight on its mesh) and run its other steps."""
        e = self._execs[0]
        pe, res = self._core, self._res
        try:
            if e.dev:
                e.core.complete_device(pe, bk.stream_ptr())
            else:
                e.core.complete(pe)
        finally:
            self._mesh.pending.remove(self)
            e.spares.append(pe)
        last = len(self._execs) - 1
        for i, ex in enumerate(self._execs[1:], start=1):
            res = ex.run(res, self._out if i == last else None)
        self._result = self._wrap(res)
        self._done = True
        self._local = self._res = self._core = None

    def wait(self) -> Any:
        """The result (a :class:`~pyshard.ShardedArray`); collective, as the redistribute."""
        if not self._done:
            check_finalized()
        while not self._done:
            self._mesh.pending[0]._finish()
        return self._result

    @property
    def done(self) -> bool:
        """Has the redistribute completed? (A plan that ran whole when it started has.)"""
        return self._done

    def test(self) -> bool:
        """True when the redistribute has completed; never blocks while its messages are in
        flight (``MPI_Testall`` on the posted exchange), so ``while not p.test(): compute()``
        overlaps the exchange with the computation. Once its messages have arrived, a
        single-step plan that is the oldest in flight on its mesh completes here (the unpack
        only, no communication) and :meth:`wait` returns at once; a plan with steps after the
        exchange, or with an older redistribute in flight, completes then as :meth:`wait`
        does (its later steps and the older ones run here, in start order, collectively)."""
        if self._done:
            return True
        check_finalized()
        e = self._execs[0]
        if not e.core.test(self._core):
            return False
        if len(self._execs) == 1 and self._mesh.pending[0] is self:
            self._finish()
        else:
            self.wait()
        return True

    def __repr__(self) -> str:
        return f"Pending({self._plan}, {'done' if self._done else 'in flight'})"


def start(execs: list, p: Plan, mesh: Mesh, local: Any, out: Optional[Any], wrap: Any) -> Pending:
    """Start running the executors ``execs`` of plan ``p`` (see :class:`Pending`)."""
    if out is not None:
        want = execs[-1].out_shape if execs else local.shape
        if not out_ok(out, want, p.dst.dtype, local):
            check_out(out, p, mesh, local)  # the precise error, or a strided out: copied into
            strided, out = out, None
            wrap0 = wrap

            def wrap(r: Any) -> Any:
                return wrap0(_copy_into(strided, r))

    pend = Pending(mesh, execs, p, local, out, wrap)
    pend._start()
    return pend
