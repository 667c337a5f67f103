"""Rows read and accumulated by global index: finite-element meshes, sparse matrices, graphs.

An index space of ``N`` rows (mesh vertices, matrix rows, graph nodes) lies on a 1-D layout:
each rank owns a range of rows (uneven and empty ranges as everywhere in pyshard), and the
layout's shard table says who owns each index with no communication. Each rank names the
global rows it needs, any order, duplicates allowed; :func:`gather_plan` learns once who reads
what from whom, and the plan then runs many times:

- :meth:`GatherPlan.gather`: ``x_global[indices]`` on every rank (the rows this rank owns
  copied locally, the others one message per owner, or by default from owners on this
  rank's node straight through node-shared memory);
- :meth:`GatherPlan.scatter`: the reverse, each value combined into its owner's row
  (``"sum"``, ``"max"``, ``"min"`` or ``"replace"``) in a fixed order (below).

The order rule (what makes a scatter bit-reproducible whatever the path and the timing): the
values one rank sends to one row are combined first, in the order of that rank's indices
(``c_q = v[k1] op v[k2] op ...``); then the owner combines the ranks' partial values into its
row in ascending rank order, its own at its place: ``row op c_0 op c_1 op ...``.
``"replace"`` keeps the last in that order (the highest rank's last occurrence).

The setup is collective over the mesh and sends no P-wide collective's worth of data: the
counts go by NBX (synchronous sends to the owners this rank reads from, and one nonblocking
reduction that also carries every rank's error flag), then each reader's list of rows to
each owner. A gather or scatter then runs no collective at all: one message to and from each
peer, packed and unpacked by the core (:class:`IndexExchange`, the family's point-to-point
member), or for a gather's node peers under ``method="auto"`` one copy through node-shared
memory in a handshake of the node's ranks.
"""

from __future__ import annotations

import logging
import time
import weakref
import zlib
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

import numpy as np

from . import _backend, _core, _dtypes, _shm, _validate, collectives
from .array import ShardedArray
from .exchange import Exchange, Request
from .layout import Shard
from .memory import allocate, pooled
from .route import FOLD_KIND

log = logging.getLogger(__name__)
_U8 = np.dtype(np.uint8)

__all__ = ["GatherPlan", "IndexExchange", "IndexRoute", "PendingIndex", "csr_plan",
           "gather_plan", "scatter_add", "take"]

OPS = ("sum", "max", "min", "replace")
_OP_CODE = {op: k for k, op in enumerate(OPS)}  # cpp/index_exchange.h IndexOp
_ALGORITHMS = {"alltoall": 0, "nbx": 1}
METHODS = ("p2p", "persistent", "neighbor")  # cpp/peer_messages.h PeerMethod, in its order
TUNE_REPS = 5  # calls per candidate when method="tune"
# each mesh's gather plans, numbered as they are made (collectively: the same numbers on
# every rank), which the validation mode compares at each call
_PLAN_SERIALS: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
# A gather's result of this many bytes or more lives in node-shared memory on a node transport
# (node owners write into it); smaller ones are plain arrays: below about 512 KiB the
# handshake's segment costs more than the copy at wait() it saves (scripts/index_ab.py
# --result --rows 60000,80000,100000; docs/unstructured.md, "Gathers that return their
# result").
NODE_RESULT_MIN_BYTES = 512 << 10
_ERRORS = {1: "an index outside [0, N)", 2: "indices not integers", 3: "indices not 1-D",
           4: "a column count other than like's rows"}


@dataclass(frozen=True)
class IndexRoute:
    """Where an index exchange goes: ``path`` ``"local"`` (one rank) or ``"mpi"``
    (point-to-point messages, one to and from each peer); ``algorithm``: the setup's count
    exchange (``"nbx"``: synchronous sends and one nonblocking reduction; ``"alltoall"``:
    one ``MPI_Alltoall``); ``method``: how each call's messages are posted (``"p2p"``: fresh
    ``MPI_Isend``/``MPI_Irecv``; ``"persistent"``: requests bound once, started each call;
    ``"neighbor"``: one neighbourhood all-to-all on a graph communicator of the peers);
    ``why``, in words; ``candidates``: the methods ``"tune"`` measures (empty otherwise);
    ``scatter_by``: where the scatter takes another way than the gather, the MPI method it
    runs by (``method="auto"`` on a node: gathers through node-shared memory, scatters by
    ``"p2p"``), else empty."""

    path: str
    algorithm: str
    why: str
    method: str = "p2p"
    candidates: Tuple[str, ...] = ()
    scatter_by: str = ""


def index_route(mesh: Any, algorithm: str, method: str = "auto") -> IndexRoute:
    """The rule for :func:`gather_plan`: ``auto`` -> NBX (no collective over every rank
    beyond its one nonblocking reduction); ``method`` ``auto`` -> where ranks of the mesh
    share a node, gathers through node-shared memory between them and scatters by fresh
    point-to-point messages (``path`` ``"shm"``, ``scatter_by`` ``"p2p"``: each measured the
    faster for its direction, docs/unstructured.md), else fresh messages to every peer;
    ``shm`` -> node-shared memory between ranks of one node both ways (``path`` ``"shm"``)
    and fresh messages to the others (``PYSHARD_SHM=off`` turns node-shared memory off for
    both), ``tune`` -> measured at the first calls (``path`` ``"tune"``), any other -> MPI
    messages by that method to every peer. No MPI call."""
    if algorithm not in ("auto",) + tuple(_ALGORITHMS):
        raise ValueError(f"pyshard.gather_plan: algorithm must be 'auto' or one of "
                         f"{tuple(_ALGORITHMS)}, got {algorithm!r}")
    if method not in ("auto", "shm", "tune") + METHODS:
        raise ValueError(f"pyshard.gather_plan: method must be 'auto', 'shm', 'tune' or one "
                         f"of {METHODS}, got {method!r}")
    path = "mpi" if mesh.size > 1 else "local"
    if method == "tune" and path == "mpi":
        node = _shm.node(mesh, tuple(range(mesh.ndim))) is not None
        # never "neighbor": its collective cannot carry a rank's bad values (scatter) or x
        # (gather) to the others (an explicit method="neighbor" documents that; a tuned
        # choice would make every later bad call hang), and it measured 1.0-1.5x p2p
        # (docs/unstructured.md)
        cands = tuple(m for m in METHODS if m != "neighbor") + (("shm",) if node else ())
        why = (f"messages by the fastest of {', '.join(cands)}, measured at the first gather "
               f"and at the first scatter")
        algo = "nbx" if algorithm == "auto" else algorithm
        return IndexRoute("tune", algo, f"setup counts by {algo}; {why}", "tune", cands)
    m = "p2p" if method in ("auto", "shm") else method
    node = path == "mpi" and method in ("auto", "shm") and \
        _shm.node(mesh, tuple(range(mesh.ndim))) is not None  # fmt: skip
    scatter_by = ""
    if node:
        path = "shm"
        mwhy = ("node peers through node-shared memory (one copy per row, no message), "
                "messages to the others posted fresh each call (p2p)")
        if method == "auto":
            scatter_by = "p2p"
            mwhy = (f"gathers: {mwhy}; scatters: messages posted fresh each call (p2p); each "
                    f"measured the faster way for its direction")
    elif method == "shm":
        mwhy = "messages posted fresh each call (p2p)" + (
            "" if path == "local" else ": no other rank of the mesh shares this rank's node "
            "(or PYSHARD_SHM=off)")
    elif method in ("auto", "tune"):
        m = "p2p"
        mwhy = "messages posted fresh each call (p2p)"
    else:
        mwhy = f"messages by {method}, as asked"
    if algorithm == "auto":
        return IndexRoute(path, "nbx",
                          f"setup counts by NBX: messages only to the owners read; {mwhy}", m,
                          scatter_by=scatter_by)
    return IndexRoute(path, algorithm, f"setup counts by {algorithm}, as asked; {mwhy}", m,
                      scatter_by=scatter_by)


class IndexExchange(Exchange):
    """A gather plan's :class:`Exchange` (``op`` ``"gather"``): the core's ``IndexExchange``,
    one message to and from each peer, run forward (gather) and in reverse (scatter). Its
    :meth:`comm_stats` counts both directions (the plan's ``bytes_sent`` and
    ``bytes_received``, which depend on each call's row width)."""

    __slots__ = ("plan_stats",)

    def __init__(self, op: str, route: Any, core: Any = None, need: int = 0) -> None:
        super().__init__(op, route, core, need)
        self.plan_stats: Dict[str, int] = {"bytes_sent": 0, "bytes_received": 0}

    def comm_stats(self) -> Dict[str, int]:
        s = self.plan_stats
        return {"calls": self.calls, "bytes_sent": s["bytes_sent"],
                "bytes_received": s["bytes_received"]}


def _index_layout(x: Any, what: str) -> Tuple[Any, Any, np.ndarray]:
    """The mesh, layout and row offsets (one per rank, plus N) of an index space: a
    ShardedArray whose dim 0 is sharded by every mesh dim, in order, and no other dim."""
    if not isinstance(x, ShardedArray):
        raise TypeError(f"pyshard.{what}: expected a ShardedArray, got {type(x).__name__}")
    lay, mesh = x.layout, x.mesh
    if len(lay.shape) < 1 or any(p != Shard(0) for p in lay.placements):
        raise ValueError(
            f"pyshard.{what}: the index space must be dim 0 sharded by every mesh dim "
            f"(placements [Shard(0)] * {mesh.ndim}), got {list(map(str, lay.placements))}")
    _, ext, off = lay.table[0]
    offsets = np.array(list(off) + [lay.shape[0]], np.int64)
    assert len(ext) == mesh.size
    return mesh, lay, offsets


def _signature(lay: Any) -> int:
    """The same number on every rank holding this layout (checked by the setup)."""
    key = repr((lay.shape[0], lay.table[0][1])).encode()
    return zlib.crc32(key) + 1


def _increasing(a: np.ndarray) -> bool:
    """Whether ``a`` is strictly increasing (distinct and sorted): one pass, no sort."""
    return a.size < 2 or bool((a[1:] > a[:-1]).all())


def _check_indices(indices: Any, N: int) -> Tuple[Optional[np.ndarray], int, str, bool]:
    """The indices as int64, or an error code and its detail; and whether they are strictly
    increasing (then the range check reads the two ends alone)."""
    try:
        a = _backend.to_host(indices) if _backend.is_device(indices) else np.asarray(indices)
    except Exception as e:  # noqa: BLE001 - the detail goes to every rank's message
        return None, 2, f"indices cannot be read as an array ({e})", False
    if a.ndim != 1:
        return None, 3, f"indices must be 1-D, got shape {a.shape}", False
    if a.dtype.kind not in "iu" and not (a.size == 0 and a.dtype.kind == "f"):
        return None, 2, f"indices must be integers, got dtype {a.dtype}", False
    if a.dtype.kind == "u" and a.dtype.itemsize == 8 and a.size and int(a.max()) >= N:
        k = int(np.flatnonzero(a >= N)[0])  # (before the cast, which would wrap it negative)
        return None, 1, f"indices[{k}] = {int(a[k])} is outside [0, {N})", False
    # a copy: the plan keeps its indices (plan.indices), and the caller may reuse its buffer
    a = np.array(a, dtype=np.int64, copy=True)
    inc = _increasing(a)
    if a.size and not (inc and 0 <= a[0] and a[-1] < N):
        bad = np.flatnonzero((a < 0) | (a >= N))
        if bad.size:
            k = int(bad[0])
            return None, 1, f"indices[{k}] = {int(a[k])} is outside [0, {N})", False
    return a, 0, "", inc


class PendingIndex(Request):
    """A gather or scatter in flight (``wait=False``): :meth:`wait` completes it and returns
    the gathered rows (gather) or None (scatter); :meth:`test` is ``MPI_Testall`` on its
    messages, True once they have completed (``wait`` then only unpacks). The arrays it reads
    and writes must not be touched until then."""

    __slots__ = ("_plan", "_result", "_keep", "_finish", "_done", "_core", "_error")

    def __init__(self, plan: GatherPlan, result: Any, keep: Tuple[Any, ...],
                 finish: Any = None, core: Any = None, error: Any = "") -> None:
        self._plan, self._result, self._keep, self._finish = plan, result, keep, finish
        self._done = False
        self._core = core if core is not None else plan.exchange.core
        self._error = error  # this rank's input was bad: raised at wait(), once its part ran

    @property
    def done(self) -> bool:
        return self._done

    def test(self) -> bool:
        """True when every message of the exchange has completed (then :meth:`wait` returns
        at once); never blocks."""
        if self._done:
            return True
        collectives.check_finalized()
        return bool(self._core.test())

    def wait(self) -> Any:
        """Complete the exchange; the gathered rows (gather) or None (scatter)."""
        if not self._done:
            collectives.check_finalized()
            try:
                self._core.wait()
            except ValueError:  # a peer's values were bad: nothing combined here
                if not self._error:
                    raise
            finally:
                self._plan._inflight = None
                self._done = True
                self._keep = ()
            if isinstance(self._error, BaseException):
                raise self._error
            if self._error:
                raise ValueError(self._error)
            if self._finish is not None:
                self._finish()
        return self._result


class _DevicePending(PendingIndex):
    """A gather of a cupy array in flight: the result is copied to the device at wait()."""

    __slots__ = ()

    def wait(self) -> Any:
        box = self._result
        super().wait()
        return box["r"]


class GatherPlan:
    """Which rows of an index space this rank reads, and from whom: built once by
    :func:`gather_plan`, run by :meth:`gather` and :meth:`scatter` as often as needed on any
    array laid out as the plan's ``like`` (same index layout; any trailing shape and dtype)."""

    def __init__(self, mesh: Any, layout: Any, offsets: np.ndarray, indices: np.ndarray,
                 exchange: IndexExchange, counts: np.ndarray, rcounts: np.ndarray,
                 make: Any = None, candidates: Tuple[str, ...] = (),
                 touched: Any = None, method: str = "p2p", scatter_by: str = "") -> None:
        self.mesh, self.layout = mesh, layout
        self.serial = _PLAN_SERIALS.get(mesh, 0)  # this mesh's plan number (the same everywhere)
        _PLAN_SERIALS[mesh] = self.serial + 1
        self.offsets = offsets
        self.indices = indices
        self.exchange = exchange
        self.counts = counts  # distinct rows read from each rank (this rank's own included)
        self.rcounts = rcounts  # rows each rank reads from this one (this rank excluded)
        self._inflight: Optional[PendingIndex] = None
        self._stats: Dict[str, int] = {"gather": 0, "scatter": 0, "messages_sent": 0,
                                       "messages_received": 0, "bytes_sent": 0,
                                       "bytes_received": 0}
        exchange.plan_stats = self._stats  # the exchange's comm_stats() reads the plan's
        # the core each direction runs on: the exchange's, or (method "tune") the fastest of
        # `candidates`, each made by `make`, measured at the direction's first call
        # make(m, compact): a core of method m, over the local rows or the compact ones; a
        # scatter by another method than the gather's (scatter_by) gets its own core at its
        # first call
        self._make, self._candidates = make, candidates
        self._methods = {"gather": method, "scatter": scatter_by or method}
        self._cores: Dict[str, Any] = {} if candidates else {"gather": exchange.core}
        if not candidates and not scatter_by:
            self._cores["scatter"] = exchange.core
        self.chosen: Dict[str, str] = {}  # method "tune": what each direction measured best
        # cupy arrays: the local rows any peer or this rank reads (ascending), packed on the
        # device, and the cores over that compact row space ("gather/dev", "scatter/dev"),
        # made at a direction's first device call with the method its host core runs
        self._touched = touched
        self._touched_dev: Any = None

    def _core_for(self, direction: str, trial: Any, device: bool = False) -> Any:
        """The core ``direction`` (``"gather"``, ``"scatter"``) runs on (``device``: the one
        over the compact rows a cupy array's device pack gives). Tuning: each candidate runs
        ``trial(core)`` a few times, and the one whose median on the slowest rank is least is
        kept: the same on every rank (one allreduce per candidate, every rank in the same
        call)."""
        key = direction + "/dev" if device else direction
        core = self._cores.get(key)
        if core is not None:
            return core
        if not self._candidates:  # the direction's method, over the compact rows (device)
            core = self._make(self._methods[direction], device)
            self._cores[key] = core
            return core
        best: Tuple[float, str, Any] = (float("inf"), "", None)
        for m in self._candidates:
            c = self._make(m, device)
            times = []
            for _ in range(TUNE_REPS):
                t0 = time.perf_counter()
                trial(c)
                times.append(time.perf_counter() - t0)
            t = collectives.max_all(self.mesh.comm, sorted(times)[len(times) // 2])
            if t < best[0]:
                best = (t, m, c)
        self.chosen[key], self._cores[key] = best[1], best[2]
        log.info("pyshard: gather plan's %s tuned: %s (%.1f us)", direction, best[1],
                 best[0] * 1e6)
        return best[2]

    @property
    def touched(self) -> np.ndarray:
        """The local rows that any rank reads, this one included (ascending, each once, as
        local row numbers): what a cupy array's gather and scatter copy between the device
        and the host."""
        return self._touched() if self._touched is not None else np.zeros(0, np.int64)

    @property
    def pending(self) -> Optional[PendingIndex]:
        """This plan's exchange in flight (``wait=False``), or None: a handle the caller
        dropped without waiting can still be waited for here (``plan.pending.wait()``)."""
        return self._inflight

    @property
    def n(self) -> int:
        """This rank's number of indices (rows of a gather's result)."""
        return int(self.indices.shape[0])

    @property
    def route(self) -> IndexRoute:
        return self.exchange.route

    def _check(self, x: Any, what: str, args: str = "") -> np.ndarray:
        """``x``'s local array, or the error; under PYSHARD_VALIDATE the ranks first agree
        on the plan (its number on the mesh: plans started in different orders on different
        ranks would exchange each other's rows), the call (``args``) and whether ``x`` fits,
        so that every rank raises the same ValueError."""
        self.mesh.check_live()  # (a freed mesh: its communicators and node memory are gone)
        err: Optional[Exception] = None
        if not isinstance(x, ShardedArray):
            err = TypeError(f"pyshard.GatherPlan.{what}: expected a ShardedArray, got "
                            f"{type(x).__name__}")
        elif x.mesh is not self.mesh:
            err = ValueError(f"pyshard.GatherPlan.{what}: the array lies on another Mesh "
                             f"object than the plan's (a plan runs on arrays of the mesh it "
                             f"was built on: build one on this array's mesh)")
        elif x.layout.table[0] != self.layout.table[0] or any(
                p != Shard(0) for p in x.layout.placements):
            err = ValueError(f"pyshard.GatherPlan.{what}: the array is laid out differently "
                             f"from the plan's like= (its dim 0 must have the same shard table "
                             f"on the same mesh)")
        elif (problem := x.local_problem()) is not None:  # (.local replaced: its rows
            # would be sent as the layout's, or the core would refuse the size after messages)
            err = ValueError(f"pyshard.GatherPlan.{what}: the array's local array is {problem}")
        elif self._inflight is not None:
            err = RuntimeError(f"pyshard.GatherPlan.{what}: this plan's previous exchange is "
                               f"still in flight; wait() for it first (plan.pending is "
                               f"its handle)")
        if _validate.enabled:
            _validate.agree(self.mesh.comm, f"pyshard.GatherPlan.{what}", {
                "plan": f"gather plan #{self.serial} of this mesh",
                "call": args,
                # (its rows' dtype and shape: ranks that differ exchange rows of other sizes)
                "array": f"refused: {err}" if err is not None else
                f"accepted: rows of {x.local.dtype}, shape {tuple(x.shape[1:])}",
            })
        if err is not None:
            raise err
        return x.local

    def _count(self, op: str, rb: int, forward: bool, core: Any) -> None:
        c = self.exchange.core
        s = self._stats
        s[op] += 1
        self.exchange.calls += 1
        peers_r, peers_o = int(c.messages_out), int((self.rcounts > 0).sum())
        if core.on_node_transport:  # groups between node peers go by no message
            peers_r -= int(core.node_groups_in)
            peers_o -= int(core.node_groups_out)
        rin, rout = int(c.rows_in), int(c.rows_out)
        if forward:
            s["messages_sent"] += peers_o
            s["messages_received"] += peers_r
            s["bytes_sent"] += rout * rb
            s["bytes_received"] += rin * rb
        else:
            s["messages_sent"] += peers_r
            s["messages_received"] += peers_o
            s["bytes_sent"] += rin * rb
            s["bytes_received"] += rout * rb

    def _packed(self, local: Any) -> np.ndarray:
        """A cupy array's rows that this plan reads (``touched``), packed on the device by
        one gather and copied to host memory: all a device call moves through the host."""
        cp = _backend.cupy()
        if self._touched_dev is None:
            self._touched_dev = cp.asarray(self.touched)
        packed = cp.take(local, self._touched_dev, axis=0)
        host = allocate(packed.shape, packed.dtype)
        packed.get(out=host)
        return host

    def _unpack(self, local: Any, host: np.ndarray) -> None:
        """The compact rows ``host`` (after a scatter) back into their rows of ``local``."""
        if host.shape[0]:
            local[self._touched_dev] = _backend.cupy().asarray(host)

    def _result(self, core: Any, shape: Tuple[int, ...], dtype: np.dtype,
                rb: int) -> Tuple[np.ndarray, Optional[np.ndarray]]:
        """A gather's result, and the block of node-shared memory it follows where ``core``
        runs on a node transport and the result is :data:`NODE_RESULT_MIN_BYTES` (512 KiB) or
        more, or one the result pool would hold (``PYSHARD_POOL_MIN_BYTES`` set lower): node
        owners then write their groups straight into the result, so ``wait`` copies nothing;
        the result, 64-byte aligned, holds the block. Else None: below that size the
        handshake's extra segment costs more than the copy it saves (docs/unstructured.md)."""
        node = core.node
        n = shape[0] * rb
        if node is None or not (n >= NODE_RESULT_MIN_BYTES or pooled(n)):
            return allocate(shape, dtype), None
        head = int(core.gather_block_bytes(rb))
        block = _shm.empty(node, (head + n,), _U8)
        return block[head:].view(dtype).reshape(shape), block

    def gather(self, x: ShardedArray, out: Any = None, wait: bool = True) -> Any:
        """``x_global[indices]`` on this rank: an array of shape ``(n, *x.shape[1:])`` (into
        ``out`` where given: C-contiguous, that shape and x's dtype). ``wait=False`` returns a
        :class:`PendingIndex` whose ``wait()`` gives it. Every rank of the mesh calls it; no
        collective runs, only messages to this rank's peers. A cupy array's rows that peers
        or this rank read are packed on the device (one gather kernel) and only they go
        through host memory (staged); the result is copied to the device at ``wait()``."""
        failed: Optional[Exception] = None
        try:
            local = self._check(x, "gather")
        except (TypeError, ValueError) as e:
            if _validate.enabled:  # (every rank raises alike: agreed in _check)
                raise
            # this rank alone may have it wrong (an x of another layout or mesh, or no
            # ShardedArray): it takes part without rows, so that every rank reading its rows
            # raises ValueError at wait() naming it instead of waiting; then it raises e
            failed, out = e, None
            local = np.zeros(self.layout.local_shape(self.mesh.coords), self.layout.dtype)
        device = _backend.is_device(local)
        host = self._packed(local) if device else _backend.to_host(local)
        shape = (self.n,) + tuple(local.shape[1:])
        error: Any = failed or ""
        if out is not None and not device:
            if not isinstance(out, np.ndarray) or out.shape != shape or out.dtype != host.dtype \
                    or not out.flags.c_contiguous or not out.flags.writeable:
                # this rank still serves its rows (into a result of its own), then raises
                error = (f"pyshard.GatherPlan.gather: out must be a writable C-contiguous "
                         f"numpy array of shape {shape} and dtype {host.dtype}")
                out = None
            elif np.may_share_memory(out, host) and np.shares_memory(out, host):
                # the rows this rank reads from x would be overwritten as they are read
                error = ("pyshard.GatherPlan.gather: out shares memory with x's local array "
                         "(rows read from x would be overwritten as they are read); pass "
                         "another buffer")
                out = None
        elif out is not None:  # x on a GPU: out is written at wait(), so checked here
            if not _backend.is_device(out) or tuple(out.shape) != shape \
                    or out.dtype != host.dtype:
                error = (f"pyshard.GatherPlan.gather: out must be a cupy array of shape "
                         f"{shape} and dtype {host.dtype} (x is on the GPU)")
                out = None
        rb = host.dtype.itemsize * int(np.prod(shape[1:], dtype=np.int64))

        bad = failed is not None

        def trial(c: Any) -> None:
            r, b = (out, None) if out is not None and not device else \
                self._result(c, shape, host.dtype, rb)
            c.start_forward(host, r, b, bad)  # (tune never measures neighbor)
            try:
                c.wait()
            except ValueError:  # a peer's x was bad: raised by the call itself below
                pass

        core = self._core_for("gather", trial, device)
        if bad and core.method == 2:  # neighbor: raised here, before the collective
            raise failed  # type: ignore[misc]
        if out is not None and not device:
            res, block = out, None
        else:
            res, block = self._result(core, shape, host.dtype, rb)
        core.start_forward(host, res, block, bad)
        if not bad:
            self._count("gather", rb, True, core)
        if device:
            box: Dict[str, Any] = {}

            def finish() -> None:
                d = _backend.cupy().asarray(res)
                if out is not None:
                    out[...] = d
                    box["r"] = out
                else:
                    box["r"] = d

            p: PendingIndex = _DevicePending(self, box, (host, res), finish, core, error)
        else:
            p = PendingIndex(self, res, (host, res), None, core, error)
        self._inflight = p
        return p.wait() if wait else p

    def scatter(self, values: Any, into: ShardedArray, op: str = "sum",
                wait: bool = True) -> Any:
        """Combine ``values`` (shape ``(n, *into.shape[1:])``, into's dtype; row ``k`` for
        ``indices[k]``) into the owners' rows of ``into`` by ``op`` (``"sum"``, ``"max"``,
        ``"min"``, ``"replace"``), in the order rule of the module doc. float16 and the
        ml_dtypes floats accumulate in float32, rounded once; bool's ``"sum"`` is a logical
        or. ``wait=False`` returns a :class:`PendingIndex`. Every rank of the mesh calls it;
        no collective runs."""
        local = self._check(into, "scatter", f"op={op!r}")  # (validation: ops compared first)
        if op not in OPS:
            raise ValueError(f"pyshard.GatherPlan.scatter: op must be one of {OPS}, got {op!r}")
        device = _backend.is_device(local)
        dt = np.dtype(local.dtype)
        if dt.kind == "c" and op in ("max", "min"):
            raise ValueError(f"pyshard.GatherPlan.scatter: op {op!r} is not defined for "
                             f"complex data ({dt}); use 'sum' or 'replace'")
        # (into's dtype is the same on every rank: these raise on every rank alike)
        wdt = dt
        if dt != np.bool_ and FOLD_KIND.get(dt) is None and op != "replace":
            # float16, the ml_dtypes floats: in float32; a byte-swapped dtype: in native order
            wdt = _dtypes.accumulator(dt.newbyteorder("=") if not dt.isnative else dt)
            if FOLD_KIND.get(np.dtype(wdt)) is None:
                raise ValueError(f"pyshard.GatherPlan.scatter: op {op!r} does not combine "
                                 f"{dt} (sum, max and min take bool, the integers, the floats "
                                 f"up to float64 and complex up to complex128; 'replace' any "
                                 f"dtype)")
        vals = _backend.to_host(values) if _backend.is_device(values) else np.asarray(values)
        shape = (self.n,) + tuple(local.shape[1:])
        # A rank whose values (or into's local array) are bad still takes part in the exchange
        # without values, so that every rank it sends to raises too and none waits; it raises
        # at wait() (not for the neighbor method, whose collective cannot carry the error).
        error = ""
        if vals.shape != shape or vals.dtype != dt:
            error = (f"pyshard.GatherPlan.scatter: values must have shape {shape} and dtype "
                     f"{dt} (into's), got {vals.shape} {vals.dtype}")
        # a cupy array: only the rows this plan combines into, packed on the device
        tgt = self._packed(local) if device else np.asarray(local)
        if not device and not (tgt.flags.c_contiguous and tgt.flags.writeable) and not error:
            error = ("pyshard.GatherPlan.scatter: into's local array must be writable and "
                     "C-contiguous")
        if error:
            tgt, vals = np.zeros(tgt.shape, dt), np.zeros(shape, dt)  # sizes only
        kind = FOLD_KIND.get(dt)
        acc, v, narrow = tgt, np.ascontiguousarray(vals), None
        if dt == np.bool_:
            kind = FOLD_KIND[np.dtype(np.uint8)]
            acc, v = tgt.view(np.uint8), v.view(np.uint8)
            if op == "sum":
                op = "max"  # logical or
        elif kind is None and op != "replace":
            ml = _dtypes.is_ml_float(dt)

            def wide(a: np.ndarray) -> np.ndarray:
                return (_dtypes.widen(a.view(_dtypes.word(dt)), dt, np) if ml
                        else a.astype(wdt))

            acc, v = np.ascontiguousarray(wide(tgt)), np.ascontiguousarray(wide(v))
            kind = FOLD_KIND[np.dtype(wdt)]

            def narrow() -> None:
                tgt[...] = _dtypes.narrow(acc, dt, np).view(dt) if ml else acc.astype(dt)
        if kind is None:
            kind = -1  # replace: bytes only
        rb = acc.dtype.itemsize * int(np.prod(shape[1:], dtype=np.int64))
        key = "scatter/dev" if device else "scatter"
        bad = bool(error)
        if key not in self._cores:  # tuning: on a copy (a scatter changes `into`)
            scratch = acc.copy() if self._candidates else acc  # (no trials: no copy)

            def trial(c: Any) -> None:
                c.start_reverse(v, scratch, kind, _OP_CODE[op], bad)  # (never neighbor)
                try:
                    c.wait()
                except ValueError:  # a peer's bad values: raised by the call itself below
                    pass

            self._core_for("scatter", trial, device)
        core = self._cores[key]
        if bad and core.method == 2:  # neighbor: raised here, before the collective
            raise ValueError(error)
        core.start_reverse(v, acc, kind, _OP_CODE[op], bad)
        self._count("scatter", rb, False, core)

        def finish() -> None:
            if narrow is not None:
                narrow()
            if device:
                self._unpack(local, tgt)

        p = PendingIndex(self, None, (v, acc, tgt), finish, core, error)
        self._inflight = p
        return p.wait() if wait else p

    def comm_stats(self) -> Dict[str, int]:
        """This plan's calls and traffic on this rank: ``gather`` and ``scatter`` (calls),
        ``messages_sent``/``messages_received`` and ``bytes_sent``/``bytes_received`` (over
        every call), and ``setup_messages`` (the setup's row lists, out)."""
        d = dict(self._stats)
        d["setup_messages"] = int((self.counts > 0).sum() - (self.counts[self.mesh.rank] > 0))
        return d

    def explain(self) -> str:
        """This rank's peers, messages, rows and bytes per row, path and why."""
        P, me = self.mesh.size, self.mesh.rank
        c = self.exchange.core
        frm = [p for p in range(P) if p != me and self.counts[p]]
        to = [p for p in range(P) if self.rcounts[p]]
        distinct = int(self.counts.sum())
        r = self.route
        return "\n".join([
            f"gather plan on {P} ranks, rank {me}: {self.n} indices ({distinct} distinct rows, "
            f"{self.n - distinct} duplicates) into {self.layout.shape[0]} rows; path {r.path} "
            f"({'gathers: ' if r.scatter_by else ''}"
            f"{'node peers through node-shared memory, the others ' if r.path == 'shm' else ''}"
            f"point-to-point by {r.method}"
            f"{'; scatters: point-to-point by ' + r.scatter_by if r.scatter_by else ''}"
            f", no collective over every rank per call); setup {r.algorithm} ({r.why})",
            f"  own rows read locally: {int(c.self_rows)} (copied once, never sent)",
            f"  gather: {len(frm)} groups of rows in from {frm} ({int(c.rows_in)} rows), "
            f"{len(to)} out to {to} ({int(c.rows_out)} rows), each a message or (node peers on "
            f"the shm path) a node-shared copy; scatter: the same reversed, "
            f"duplicates combined before they are sent",
            *([f"  through node-shared memory{' (gathers)' if r.scatter_by else ''}: "
               f"{int(c.node_groups_in)} of the groups in, {int(c.node_groups_out)} of those "
               f"out (no message)"] if r.path == "shm" else []),
            *([f"  tune: gather by {self.chosen.get('gather', '(not measured yet)')}, scatter "
               f"by {self.chosen.get('scatter', '(not measured yet)')}, of "
               f"{', '.join(self._candidates)}"] if r.path == "tune" else []),
            "  bytes per call: rows x the row's bytes (x.shape[1:] x itemsize)",
        ])

    def __repr__(self) -> str:
        return (f"<GatherPlan rank {self.mesh.rank}: {self.n} indices, "
                f"{int(self.exchange.core.messages_out)} owners read>")


def gather_plan(indices: Any, like: ShardedArray, algorithm: str = "auto",
                method: str = "auto") -> GatherPlan:
    """Plan reading the rows ``indices`` (this rank's global rows of ``like``'s dim 0: a 1-D
    integer array, any order, duplicates allowed, any length including 0) from their owners.

    ``like``: a :class:`ShardedArray` whose dim 0 is the index space, sharded by every mesh
    dim (``[Shard(0)]`` on a 1-D mesh; uneven and empty shards allowed); the plan runs on any
    array with that dim-0 layout. ``algorithm``: the setup's count exchange, ``"auto"``
    (``"nbx"``) or ``"alltoall"``. ``method``: how each gather's and scatter's rows move:

    - ``"auto"``: where ranks of the mesh share a node, gathers as ``"shm"`` and scatters as
      ``"p2p"`` (each measured the faster for its direction; docs/unstructured.md), else
      ``"p2p"``;
    - ``"p2p"``: fresh ``MPI_Isend``/``MPI_Irecv`` each call;
    - ``"persistent"``: ``MPI_Send_init``/``MPI_Recv_init`` once, started each call;
    - ``"neighbor"``: one ``MPI_Neighbor_alltoallv`` on a graph communicator of the peers,
      made at the first gather and the first scatter (collective over the mesh); every row
      goes through the plan's buffers;
    - ``"shm"``: rows between ranks of one node copied through node-shared memory, in a
      handshake of the node's ranks at each call; messages to the other ranks by ``"p2p"``;
    - ``"tune"``: each of the above but ``"neighbor"`` (``"shm"`` where node peers exist)
      timed at the first gather and at the first scatter (the scatter's trials on a copy of
      ``into``); the fastest on the slowest rank is kept for that direction
      (``plan.chosen``).

    Collective over the mesh.

    Bad indices (outside ``[0, N)``, not integers, not 1-D) raise ``ValueError`` on every
    rank, naming the first rank at fault: the error travels with the setup's counts."""
    return _gather_plan(indices, like, algorithm, method, "gather_plan", "")


def _gather_plan(indices: Any, like: ShardedArray, algorithm: str, method: str, name: str,
                 refuse: str) -> GatherPlan:
    """:func:`gather_plan` for ``pyshard.<name>``; ``refuse``: this rank's caller found its
    input bad (the detail), told to every rank with the setup's counts as error code 4."""
    if isinstance(like, ShardedArray):  # (before the agreement's and the setup's MPI calls)
        like.mesh.check_live()
    try:
        mesh, lay, offsets = _index_layout(like, name)
        route = index_route(mesh, algorithm, method)
    except (TypeError, ValueError) as e:  # (a no-op outside validation)
        if isinstance(like, ShardedArray):  # (a like of another layout on one rank)
            _validate.refused(like.mesh.comm, f"pyshard.{name}", e)
        raise
    if _validate.enabled:  # the setup's exchange and every later call depend on both
        _validate.agree(mesh.comm, f"pyshard.{name}", {
            "algorithm": repr(algorithm), "method": repr(method), "like": repr(lay)})
    P, me = mesh.size, mesh.rank
    N = int(lay.shape[0])
    if refuse:
        idx, code, detail, increasing = None, 4, refuse, False
    else:
        idx, code, detail, increasing = _check_indices(indices, N)
    counts = np.zeros(P, np.int64)
    req = np.zeros(0, np.int64)
    own = 0  # req's rows of this rank's own, at its place (not sent)
    slot = self_rows = np.zeros(0, np.int64)
    if not code:
        assert idx is not None
        # the distinct rows in increasing order; indices already so (a CSR matrix's ghost
        # columns, say) skip the sort: one pass over the differences
        if increasing:
            uniq, inv = idx, None
        else:
            uniq, inv = np.unique(idx, return_inverse=True)
        # each owner's rows are one run of uniq: its bounds from the layout's offsets
        bounds = np.searchsorted(uniq, offsets)
        counts = np.diff(bounds).astype(np.int64)
        send_counts = counts.copy()
        send_counts[me] = 0
        lo, hi = int(bounds[me]), int(bounds[me + 1])
        req, own = uniq, hi - lo  # the owners' runs as they lie in uniq, this rank's skipped
        nr = int(uniq.shape[0]) - own
        # slots: the requested rows first (in uniq's order), then this rank's own rows
        uslot = np.arange(uniq.shape[0], dtype=np.int64)
        uslot[lo:hi] += nr - lo
        uslot[hi:] -= own
        slot = uslot if inv is None else uslot[inv.reshape(-1)]
        self_rows = uniq[lo:hi] - offsets[me]
    else:
        send_counts = counts
    comm = mesh.core_comm(tuple(range(mesh.ndim)))
    sig = _signature(lay)
    rcounts, rows, bad, mismatch, sig_rank = _core.index_requests(
        comm, _ALGORITHMS[route.algorithm], send_counts, code, sig, req, own)
    if bad >= 0:
        rank, c = divmod(int(bad), 256)
        own = f": {detail}" if rank == me else ""
        what = "matrix is" if c == 4 else "indices are"
        raise ValueError(f"pyshard.{name}: {collectives.rank_name(mesh.comm, rank)}'s {what} "
                         f"bad ({_ERRORS.get(c, c)}){own}")
    if code:
        raise ValueError(f"pyshard.{name}: {detail}")
    if mismatch:
        who = collectives.rank_name(mesh.comm, sig_rank) if sig_rank >= 0 else "some rank"
        raise ValueError(f"pyshard.{name}: like= is laid out differently on {who} "
                         f"(dim 0's shard table must be the same on every rank)")
    assert idx is not None
    rpeer = [int(p) for p in np.flatnonzero(send_counts)]
    opeer = [int(q) for q in np.flatnonzero(rcounts)]
    ooff = np.concatenate(([0], np.cumsum(rcounts[opeer]))).astype(np.int64)
    own_rows = np.subtract(rows, offsets[me], out=rows)  # (rows is the core's fresh array)
    n_local = int(offsets[me + 1] - offsets[me])
    dims = tuple(range(mesh.ndim))

    memo: Dict[str, np.ndarray] = {}

    def touched() -> np.ndarray:
        """The local rows read by anyone, ascending: what a cupy array's device pack copies
        out (made at the first device call: host plans never pay for it)."""
        t = memo.get("t")
        if t is None:
            mark = np.zeros(n_local, bool)
            mark[own_rows] = True
            mark[self_rows] = True
            t = memo["t"] = np.flatnonzero(mark).astype(np.int64)
        return t

    def make(m: str, compact: bool = False) -> Any:
        """The core of method m ("shm": node-shared memory and p2p), over the local rows or
        (compact) over ``touched()``'s."""
        node = _shm.node(mesh, dims) if m == "shm" else None
        if compact:
            t = touched()
            own, mine, n = (np.searchsorted(t, own_rows).astype(np.int64),
                            np.searchsorted(t, self_rows).astype(np.int64), int(t.shape[0]))
        else:
            own, mine, n = own_rows, self_rows, n_local
        return _core.IndexExchange(comm, rpeer, send_counts[rpeer], slot, mine, opeer,
                                   ooff, own, n, METHODS.index("p2p" if m == "shm" else m),
                                   node)

    tune = route.path == "tune"
    method = "shm" if route.path == "shm" else "p2p" if tune else route.method
    x = IndexExchange("gather", route, make(method))
    if log.isEnabledFor(logging.DEBUG):
        log.debug("gather_plan: %d indices, %d owners read, %d readers served", idx.size,
                  len(rpeer), len(opeer))
    return GatherPlan(mesh, lay, offsets, idx, x, counts, rcounts, make,
                      route.candidates, touched, method, route.scatter_by)


def csr_plan(a: Any, like: ShardedArray, algorithm: str = "auto",
             method: str = "auto") -> Tuple[GatherPlan, Any]:
    """The gather plan of ``y = A x`` for this rank's rows of a row-partitioned sparse matrix,
    and those rows with their columns renumbered to the gathered vector's rows.

    ``a``: this rank's rows of ``A``, numbered by global column: a scipy.sparse matrix or
    array (CSR as it is, any other format through ``tocsr()``) with ``like.shape[0]`` columns;
    or a 1-D integer array of global column indices (a CSR matrix's ``indices``, say).
    ``like``: laid out as the vectors ``x`` will be (``gather_plan``'s ``like``, whose
    ``algorithm`` and ``method`` these are).

    Returns ``(plan, local)``. ``plan`` reads each distinct column once, in increasing order
    (this rank's own entries and the ghosts; ``plan.indices``). For a matrix, ``local`` is
    ``a`` in CSR with ``plan.n`` columns, column ``j`` renumbered to its row in
    ``plan.gather(x)``, the entries in their order (their values and row pointers shared with
    ``a``'s CSR form, not copied), so ``local @ plan.gather(x)`` is this rank's rows of
    ``A @ x`` with every row summed in the order ``A[rows] @ x`` sums it. For an index array,
    ``local`` is the int64 array of each index's row in ``plan.gather(x)``. The reverse,
    ``plan.scatter(v, into=y)``, adds the columns' contributions back (``A.T`` products).

    Collective over the mesh (:func:`gather_plan`; nothing else communicates). A matrix whose
    column count is not ``like.shape[0]``, and bad indices, raise ``ValueError`` on every rank
    in the same call, naming the first rank at fault (this rank's plan is set up with an index
    the others' refuse in the same exchange)."""
    N = int(like.shape[0]) if isinstance(like, ShardedArray) else -1
    matrix = hasattr(a, "tocsr") and hasattr(a, "shape")
    bad = ""
    if matrix:
        m = a if getattr(a, "format", None) == "csr" else a.tocsr()
        if len(m.shape) != 2 or (N >= 0 and int(m.shape[1]) != N):
            bad = f"the matrix has shape {tuple(m.shape)}: {N} columns needed (like's rows)"
        given: Any = m.indices
    else:
        given = a
    cols: Any = given
    pos = None
    if not bad:
        arr = np.asarray(given)
        if arr.ndim == 1 and (arr.dtype.kind in "iu" or arr.size == 0):
            cols = np.unique(arr).astype(np.int64)
            pos = np.searchsorted(cols, arr)
    # bad indices, or a bad matrix (refuse=): refused in the setup on every rank
    plan = _gather_plan(cols, like, algorithm, method, "csr_plan", bad)
    assert pos is not None
    if not matrix:
        return plan, pos.astype(np.int64)
    local = type(m)((m.data, pos.astype(m.indices.dtype), m.indptr),
                    shape=(int(m.shape[0]), plan.n))
    return plan, local


def take(x: ShardedArray, indices: Any) -> np.ndarray:
    """``x_global[indices]`` on this rank, in one call (a :func:`gather_plan` built and run
    once). Collective over ``x``'s mesh."""
    plan = gather_plan(indices, like=x)
    return plan.gather(x)


def scatter_add(x: ShardedArray, indices: Any, values: Any) -> None:
    """Add ``values[k]`` into row ``indices[k]`` of ``x`` (its owner's), in the order rule of
    the module doc, in one call. Collective over ``x``'s mesh."""
    plan = gather_plan(indices, like=x)
    plan.scatter(values, into=x, op="sum")
