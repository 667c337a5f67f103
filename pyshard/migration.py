"""Rows that move between ranks: particles, mixture-of-experts tokens, point clouds.

:func:`migrate` sends each row of a set of columns to the rank its ``dest`` names, in one
message per peer that carries every column (the counts first: one ``MPI_Alltoall``, or
Hoefler et al.'s NBX sparse exchange, or messages to a known set of peers). The result keeps a
fixed order: rows grouped by source rank, increasing, each group in its source's order, so it
is deterministic and equals what an oracle that gathered everything would compute.
:meth:`Migrated.back` is the exact reverse (MoE's combine step, and the adjoint).
:func:`owner` computes ``dest`` for positions on a grid laid out like a sharded array.

The path comes from one rule (:func:`pyshard.route.migrate_route`), the same on every rank:
the count exchange ``alltoall`` (dense) up to :data:`pyshard.route.MIGRATE_DENSE_MAX` ranks,
``nbx`` (sparse: no collective that carries a count per rank) past it, ``peers`` when the
caller names a superset of the ranks each row can go to. Docs: docs/particles.md.
"""

from __future__ import annotations

import logging
import time
import zlib
from typing import Any, Dict, List, Literal, Optional, Sequence, Tuple, Union, overload

import numpy as np

from . import _backend, _core, _dtypes, _shm, _validate, collectives
from .exchange import Exchange, Request
from .layout import Layout, Partial, Replicate
from .memory import allocate
from .route import MigrateRoute, migrate_route

__all__ = ["Migrated", "PendingMigration", "RowExchange", "kept", "migrate", "owner"]

log = logging.getLogger("pyshard")

Rows = Union[Any, Sequence[Any], Dict[str, Any]]

# error codes carried by the count exchange (a negative count, or NBX's reduction)
_ERRORS = {
    1: "a dest outside [0, P)",
    2: "dest is not an integer array",
    3: "dest has another length than the rows",
    4: "columns of different lengths",
    5: "a column of a dtype pyshard cannot move (object, or not an array)",
    6: "no columns",
    7: "inplace=True takes writeable C-contiguous numpy columns with room for dest's rows",
    8: "a dest naming a rank outside peers",
    9: "inplace=True takes columns and a dest that do not overlap in memory",
    10: "a dest of -1: owner(..., invalid='dest') found a position outside the grid or not "
        "finite",
}


class _Structure:
    """The structure of ``rows``: one array, a tuple or list, or a dict (its keys in order)."""

    __slots__ = ("kind", "keys")

    def __init__(self, kind: str, keys: Tuple[Any, ...]) -> None:
        self.kind, self.keys = kind, keys

    def build(self, cols: List[Any]) -> Rows:
        if self.kind == "array":
            return cols[0]
        if self.kind == "dict":
            return dict(zip(self.keys, cols))
        return tuple(cols) if self.kind == "tuple" else list(cols)


def _items(rows: Rows) -> Tuple[_Structure, List[Any]]:
    """The structure of ``rows`` and its columns as given."""
    if isinstance(rows, dict):
        return _Structure("dict", tuple(rows)), list(rows.values())
    if isinstance(rows, (tuple, list)):
        st = _Structure("tuple" if isinstance(rows, tuple) else "list", tuple(range(len(rows))))
        return st, list(rows)
    return _Structure("array", (0,)), [rows]


def _split(rows: Rows, what: str) -> Tuple[_Structure, List[Any], int, str]:
    """(structure, columns as C-contiguous host arrays, error code, its detail)."""
    st, items = _items(rows)
    if not items:
        return st, [], 6, f"{what} holds no columns"
    cols = []
    for k, obj in zip(st.keys, items):
        try:
            a = _backend.as_array(obj, f"{what}[{k!r}]")
        except TypeError as e:
            return st, [], 5, str(e)
        if _backend.is_device(a):
            a = _backend.to_host(a)
        if a.dtype.hasobject or a.ndim == 0:
            return st, [], 5, (f"{what}[{k!r}] has dtype {a.dtype} and shape {a.shape}: "
                               "columns are arrays of a fixed-size dtype with a first (row) axis")
        cols.append(np.ascontiguousarray(a))
    n = cols[0].shape[0]
    for k, a in zip(st.keys, cols):
        if a.shape[0] != n:
            return st, [], 4, (f"{what}[{k!r}] has {a.shape[0]} rows where "
                               f"{what}[{st.keys[0]!r}] has {n}")
    return st, cols, 0, ""


def _signature(st: _Structure, cols: List[np.ndarray]) -> int:
    """A number that differs where two ranks' columns differ (keys, dtypes, trailing shapes)."""
    # a structured dtype's str is its size alone ('|V16'): its fields go in by descr
    text = repr((st.kind, st.keys, [(_dtypes.name(a.dtype), a.dtype.str,
                                     a.dtype.descr if a.dtype.fields else None, a.shape[1:])
                                    for a in cols]))
    return zlib.crc32(text.encode())


def _dest(dest: Any, n: int, room: bool = False) -> Tuple[Optional[np.ndarray], int, str, Any]:
    """``dest`` as a C-contiguous int32 or int64 array of ``n`` entries (``room``: at most
    ``n``, the columns' length, for an in-place migration), an error code and its detail, and
    ``dest`` as given on the host (for the values an error names)."""
    try:
        if isinstance(dest, (list, tuple)):  # (as gather_plan's indices)
            try:
                dest = np.asarray(dest) if dest else np.zeros(0, np.int64)
            except ValueError as e:  # a ragged list
                raise TypeError(f"dest: a list that is not one flat list of ints ({e})") from e
        d = _backend.as_array(dest, "dest")
    except TypeError as e:
        return None, 2, str(e), None
    if _backend.is_device(d):
        d = _backend.to_host(d)
    given = d
    if d.dtype.kind not in "iu" or d.ndim != 1:
        return (None, 2, f"dest must be a 1-D integer array, got dtype {d.dtype}, shape "
                f"{d.shape}", given)
    if d.shape[0] > n if room else d.shape[0] != n:
        what = f"columns with room for {n} rows" if room else f"{n} rows"
        return None, 3, f"dest has {d.shape[0]} entries for {what}", given
    if d.dtype not in (np.dtype(np.int64), np.dtype(np.int32)):
        if d.dtype == np.uint64:  # past 2^63 it would wrap to a negative rank (even -1)
            d = np.minimum(d, np.uint64(np.iinfo(np.int64).max))
        d = d.astype(np.int64)  # out of range stays out of range
    return np.ascontiguousarray(d), 0, "", given


class _Buffers:
    """Send and receive buffers reused from call to call on one mesh: a buffer given back is
    kept for the next call of about its size; at most ``keep`` of them, so the memory stays
    bounded when the row count changes every step."""

    def __init__(self, keep: int = 4) -> None:
        self.free: List[np.ndarray] = []
        self.keep = keep

    def take(self, nbytes: int) -> np.ndarray:
        best = None
        for i, b in enumerate(self.free):
            if nbytes <= b.nbytes <= 2 * nbytes + (1 << 20) and (
                best is None or b.nbytes < self.free[best].nbytes
            ):
                best = i
        if best is not None:
            return self.free.pop(best)[:nbytes]
        return np.empty(max(nbytes, 1), np.uint8)[:nbytes]

    def give(self, b: np.ndarray) -> None:
        base = b.base if isinstance(b.base, np.ndarray) else b
        self.free.append(base)
        if len(self.free) > self.keep:
            self.free.sort(key=lambda a: a.nbytes)
            self.free.pop(0)


def kept(mesh: Any) -> Dict[str, int]:
    """What :func:`migrate` keeps on ``mesh`` between calls: ``"buffers"``, the idle send and
    receive buffers held for the next call (at most four, whatever the row counts do), and
    ``"peer_sets"``, the peer sets whose persistent count requests are kept (at most
    :data:`PEER_SETS_KEPT`)."""
    st = getattr(mesh, "_migrate_state", None) or {}
    bufs = st.get("buffers")
    return {"buffers": len(bufs.free) if bufs is not None else 0,
            "peer_sets": len(st.get("peer_sets", ()))}


def _state(mesh: Any) -> Dict[str, Any]:
    st = getattr(mesh, "_migrate_state", None)
    if st is None:
        st = {"buffers": _Buffers()}
        mesh._migrate_state = st
    return st


class Migrated:
    """The result of :func:`migrate`.

    ``rows``: the same structure as the input (one array, a tuple, list or dict), rows grouped
    by source rank in increasing order, each group in its source's order. ``counts``: rows
    received from each rank (int64, length P). ``sent``: rows sent to each rank. ``route``:
    the path taken."""

    def __init__(self, mesh: Any, rows: Rows, counts: np.ndarray, sent: np.ndarray,
                 dest: np.ndarray, route: Any, sig: int, device: bool,
                 row_bytes: Tuple[int, int] = (0, 0), storage: Rows = None,
                 storage_is_input: bool = False) -> None:
        self.mesh, self.rows, self.counts, self.sent = mesh, rows, counts, sent
        self._row_bytes = row_bytes
        self._dest, self.route, self._sig, self._device = dest, route, sig, device
        self._row_off = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int64)
        self._order: Optional[np.ndarray] = None
        #: an in-place migration's columns (their first :attr:`m` rows are :attr:`rows`):
        #: the input's own arrays where they had room, else new ones with room to grow; None
        #: for a result grouped by source rank
        self.storage = storage
        #: whether :attr:`storage` is the input's own columns (they had room)
        self.storage_is_input = storage_is_input

    @property
    def inplace(self) -> bool:
        """Did this migration run in place (``migrate(..., inplace=True)``)?"""
        return self.storage is not None

    @property
    def order(self) -> np.ndarray:
        """Where each row of the grouped order lies in :attr:`rows` (int64, length :attr:`m`):
        row ``order[k]`` is the one that the grouped order (source rank increasing, each group
        in its source's order) puts at ``k``. ``arange(m)`` for a grouped result; an in-place
        result's rows are ``rows[order]`` in that order."""
        if self._order is None:
            if self.storage is None:
                self._order = np.arange(self.m, dtype=np.int64)
            else:
                self._order = _inplace_order(self._dest, self.mesh.rank, self.counts)
        return self._order

    @property
    def dest(self) -> np.ndarray:
        """The ``dest`` of the migration (as int32 or int64); ``back`` reads it again, so it
        must stay unchanged until then."""
        return self._dest

    @property
    def offsets(self) -> np.ndarray:
        """The first row of each source rank's group in :attr:`rows` (int64, length P): this
        rank's own (staying) rows are ``offsets[rank] : offsets[rank] + counts[rank]``. An
        in-place result is not grouped: its groups are ``rows[order[offsets[p]:...]]``."""
        return self._row_off

    @property
    def n(self) -> int:
        """Rows this rank held before the migration."""
        return int(self._dest.shape[0])

    @property
    def m(self) -> int:
        """Rows this rank holds after it."""
        return int(self.counts.sum())

    def back(self, values: Rows, wait: bool = True) -> Any:
        """Send every received row back where it came from: ``values`` (an array, or a tuple,
        list or dict of arrays, each with first dim :attr:`m`, any trailing dims and dtype)
        returns, on each source rank, the same structure with its original :attr:`n` rows in
        their original order. ``r.back(r.rows)`` returns the input. Point-to-point messages to
        the ranks that sent rows only (no collective). Every rank calls it; bad values raise
        ``ValueError`` here and on the ranks this rank exchanges rows with.
        ``wait=False`` returns a handle whose ``wait()`` gives the result and whose
        ``test()`` completes it (as :meth:`PendingMigration.test`)."""
        check = getattr(self.mesh, "check_live", None)
        if check is not None:  # (a freed mesh, or MPI finalized: before any MPI call)
            check()
        st, cols, code, detail = _split(values, "values")
        if not code:
            for k, a in zip(st.keys, cols):
                if a.shape[0] != self.m:
                    code, detail = 4, (f"values[{k!r}] has {a.shape[0]} rows; back() takes the "
                                       f"{self.m} rows this rank received")
                    break
        sig = _signature(st, cols) if not code else 0
        if not code and self.storage is not None:  # into the grouped order back() sends
            cols = [a[self.order] for a in cols]
        node = self.route.node if self.route.path == "shm" else None
        comm = self.mesh.core_comm(tuple(range(self.mesh.ndim)))
        x = RowExchange("back", self.route, _core.MigrateExchange(comm, node))
        table = x.core.table_bytes(True, 0) if node is not None else 0
        P, me = self.mesh.size, self.mesh.rank
        if code:
            # on the shm path this rank still takes part in its node's handshake: its block
            # holds a header for each rank that owes it rows
            blk = _shm.empty(node, (table + 16 * P,), _U8) if node is not None else None
            x.core.back_error(self.sent, self.counts, sig, code, blk)
            raise ValueError(f"pyshard.Migrated.back: {detail}")
        outs = [allocate((self.n,) + a.shape[1:], a.dtype) for a in cols]
        R = sum(a.dtype.itemsize * int(np.prod(a.shape[1:], dtype=np.int64)) for a in cols)
        others = np.arange(P) != me
        msgs = others & ~_on_node(node, P)  # the sections sent by messages
        sbytes = int(((self.counts * R + 16) * (msgs & (self.counts > 0))).sum())
        rbytes = int(((self.sent * R + 16) * (others & (self.sent > 0))).sum())
        x.calls = 1
        x.sent, x.received = int(self.counts[others].sum() * R), int(self.sent[others].sum() * R)
        bufs = _state(self.mesh)["buffers"]
        send = bufs.take(sbytes)
        if node is not None:  # the sections in node-shared memory, node peers write theirs
            recv = _shm.empty(node, (table + rbytes,), _U8)
        else:
            recv = bufs.take(rbytes)
        x.core.start_back(self._dest, self.sent, self.counts, cols, outs, self._row_off, send, recv,
                     sig)
        pend = _PendingBack(x, bufs, send, recv, st, outs, cols, self._device, node is None)
        return pend.wait() if wait else pend

    def explain(self) -> str:
        """The peers, messages, bytes, path and why, for this rank."""
        P, me = self.mesh.size, self.mesh.rank
        to = [p for p in range(P) if p != me and self.sent[p]]
        frm = [p for p in range(P) if p != me and self.counts[p]]
        R, ncols = self._row_bytes
        lines = [
            f"migrate on {P} ranks, rank {me}: path {self.route.path}, count exchange "
            f"{self.route.algorithm} ({self.route.why})",
            f"  rows: {self.n} held, {int(self.sent[me])} stay, "
            f"{int(self.sent.sum() - self.sent[me])} leave to {len(to)} ranks {to}, "
            f"{int(self.counts.sum() - self.counts[me])} arrive from {len(frm)} ranks {frm}",
        ]
        on = _on_node(self.route.node if self.route.path == "shm" else None, P)
        if self.inplace:
            held = "the input's own columns" if self.storage_is_input else "new columns"
            lines.append(f"  in place: the result in {held}; the staying rows below row "
                         f"{self.m} did not move, arrivals filled the leavers' rows")
        if on.any():
            lines.append(
                f"  node-shared memory: rows written straight into the results of "
                f"{int(on.sum()) - 1} node peers ({[p for p in to if on[p]]} get rows from this "
                f"rank), in the pass that packs the rest; one handshake of the node"
            )
            to, frm = [p for p in to if not on[p]], [p for p in frm if not on[p]]
        sent = int(sum(self.sent[p] for p in to) * R)
        got = int(sum(self.counts[p] for p in frm) * R)
        lines += [
            f"  messages: {len(to)} out, {len(frm)} in, one per peer holding all "
            f"{ncols} columns ({R} B a row); {sent} B out, {got} B in",
            "  back(): the same reversed (point-to-point messages, no collective"
            + ("; node peers through node-shared memory" if on.any() else "") + ")",
        ]
        return "\n".join(lines)


class RowExchange(Exchange):
    """A migration's (``op`` ``"migrate"``) or its way back's (``"back"``) :class:`Exchange`:
    the core's ``MigrateExchange`` (each row packed for its peer, or, on the ``shm`` path,
    written straight into a node peer's result), with counts from the count exchange; one per
    call, on the route of :func:`pyshard.route.migrate_route` (so its :meth:`comm_stats` counts
    that one call: the rows' bytes to and from other ranks, headers left out)."""

    __slots__ = ()


class _InFlight(Request):
    """An exchange in flight: its :class:`RowExchange` and the buffers it holds until done."""

    def __init__(self, x: RowExchange, bufs: _Buffers, send: np.ndarray, recv: np.ndarray,
                 pooled_recv: bool = True) -> None:
        self.x, self.bufs = x, bufs
        self.send: Optional[np.ndarray] = send
        self.recv: Optional[np.ndarray] = recv
        self.pooled_recv = pooled_recv  # else node-shared memory, freed with its last view

    def wait(self) -> Any:
        """Complete the exchange and return its result (each kind of handle its own)."""
        raise NotImplementedError

    def test(self) -> bool:
        """True when the exchange has completed: ``wait()`` then returns the result at once,
        and every later call returns True. Never blocks: ``MPI_Testall`` on the exchange's
        messages (the node handshake of the shm path ran when it started), False while one
        is out; once they are in, the rows are put in place here."""
        if self.done:
            return True
        collectives.check_finalized()
        if not self.x.core.test():
            return False
        self.wait()
        return True

    def _complete(self) -> None:
        """Complete the messages and give the buffers back (once, even when it raises)."""
        if self.send is None or self.recv is None:
            raise RuntimeError("pyshard: this exchange failed in an earlier wait()")
        collectives.check_finalized()
        try:
            self.x.core.wait()
        finally:
            self.bufs.give(self.send)
            if self.pooled_recv:
                self.bufs.give(self.recv)
            self.send = self.recv = None


class _PendingBack(_InFlight):
    """A :meth:`Migrated.back` in flight (``wait=False``): :meth:`wait` gives the values
    back on this rank, :meth:`test` completes it."""

    def __init__(self, x: Any, bufs: _Buffers, send: np.ndarray, recv: np.ndarray,
                 st: _Structure, outs: List[np.ndarray], cols: List[np.ndarray],
                 device: bool, pooled_recv: bool = True) -> None:
        super().__init__(x, bufs, send, recv, pooled_recv)
        self.st, self.outs, self.cols, self.device = st, outs, cols, device
        self.result: Any = None

    @property
    def done(self) -> bool:
        """Have the values come back?"""
        return self.result is not None

    def wait(self) -> Rows:
        """The values back on this rank (the structure ``back`` was given)."""
        if self.result is None:
            self._complete()
            self.result = self.st.build(_to_device(self.outs) if self.device else self.outs)
        return self.result


class PendingMigration(_InFlight):
    """A migration in flight (``migrate(..., wait=False)``): the counts are exchanged (the
    count exchange is blocking: with ``alltoall`` an ``MPI_Alltoall``), the rows packed and
    their messages posted; only the rows' flight overlaps the caller's work. ``counts`` and
    ``sent`` are known already. :meth:`wait` completes the messages and returns the
    :class:`Migrated`; :meth:`test` says whether they are complete. The input arrays and
    ``dest`` must not be written until then (and ``dest`` not until every
    :meth:`Migrated.back` of the result has returned)."""

    def __init__(self, x: Any, bufs: _Buffers, send: np.ndarray, recv: np.ndarray,
                 result: Migrated, outs: List[np.ndarray], st: _Structure) -> None:
        super().__init__(x, bufs, send, recv)
        self._result, self.outs, self.st = result, outs, st
        self._finished = False

    @property
    def done(self) -> bool:
        """Have the rows arrived (:meth:`wait` or :meth:`test` completed the migration)?"""
        return self._finished

    @property
    def counts(self) -> np.ndarray:
        """Rows from each rank (known when :func:`migrate` returns)."""
        return self._result.counts

    @property
    def sent(self) -> np.ndarray:
        """Rows to each rank."""
        return self._result.sent

    def wait(self) -> Migrated:
        """The :class:`Migrated` (its rows received)."""
        if not self._finished:
            self._complete()
            self._finished = True
            r = self._result
            r.rows = self.st.build(_to_device(self.outs) if r._device else self.outs)
        return self._result


def _to_device(cols: List[np.ndarray]) -> List[Any]:
    cp = _backend.cupy()
    return [cp.asarray(a) for a in cols]


@overload
def migrate(rows: Rows, dest: Any, mesh: Any, algorithm: str = ...,
            wait: Literal[True] = ..., peers: Optional[Sequence[int]] = ...,
            inplace: bool = ...) -> Migrated: ...


@overload
def migrate(rows: Rows, dest: Any, mesh: Any, algorithm: str = ..., *,
            wait: Literal[False], peers: Optional[Sequence[int]] = ...,
            inplace: bool = ...) -> PendingMigration: ...


def migrate(rows: Rows, dest: Any, mesh: Any, algorithm: str = "auto", wait: bool = True,
            peers: Optional[Sequence[int]] = None,
            inplace: bool = False) -> Union[Migrated, PendingMigration]:
    """Send each row of ``rows`` to the rank ``dest`` names (a rank of ``mesh.comm``).

    ``rows``: an array, or a tuple, list or dict of arrays (the columns), each with the same
    first-axis length ``n`` on this rank (``n`` may differ between ranks, and be 0); trailing
    dims and any fixed-size dtype (bfloat16 and float8 included); numpy, or cupy (staged
    through host memory). ``dest``: an integer array of length ``n``.

    ``algorithm``: ``"auto"`` (the rule in :func:`pyshard.route.migrate_route`), ``"tune"``
    (measured at the first call on the mesh, then kept), ``"alltoall"``
    (the counts in one ``MPI_Alltoall``), ``"nbx"`` (sparse: synchronous sends of the counts
    to the ranks that get rows, and a nonblocking reduction) or ``"peers"`` (needs
    ``peers``). Whichever ran, the rows then go by point-to-point messages to the ranks that
    get rows only, one a peer holding every column, each received straight into the
    result's columns. ``peers``: a superset of the ranks this rank exchanges rows with, the same
    relation on every rank (``q`` in ``peers`` of ``p`` iff ``p`` in ``peers`` of ``q``): the
    counts go only to them, with no collective at all.

    ``inplace=True``: the rows stay in the input's columns, and only those that move are
    copied (a particle step that keeps most rows copies a tenth of them, not all). The
    columns are writeable C-contiguous numpy arrays whose length is their room; their first
    ``len(dest)`` rows are this rank's rows. The result's order differs from the grouped one:
    the staying rows keep their places; the arriving rows (by source rank, each in its
    source's order) take the leavers' places in increasing order, then rows ``n, n+1, ...``;
    where fewer arrive than leave, the last staying rows (those at row ``m`` and past, in
    order) fill the places left, so the result is the first ``m`` rows (:attr:`Migrated.order`
    maps it to the grouped order; :meth:`Migrated.back` is exact). Where ``m`` exceeds the
    columns' room on a rank, that rank's result goes into new columns with room for
    ``1.25 m`` rows (:attr:`Migrated.storage`; the next step can pass them). The rows go by
    messages (no node-shared path); ``algorithm="tune"`` is refused (its trials would move the
    rows). No two columns may overlap in memory (the same array given twice excepted), and
    ``dest`` may not share memory with any column (a view of a column that stores each row's
    rank, say: pass a copy); either raises ``ValueError`` on every rank, before the rows
    move.

    Returns a :class:`Migrated` (``rows``, ``counts``, ``back``, ``explain``), or with
    ``wait=False`` a :class:`PendingMigration` whose ``wait()`` gives it; the inputs must not
    be written until then.

    Bad input (a ``dest`` out of range or not integer, columns of different lengths, a ``dest``
    of the wrong length, an object dtype, a ``dest`` naming a rank outside ``peers=``, an
    in-place column or ``dest`` that overlaps another column, or columns that differ between
    ranks) raises
    ``ValueError`` on every rank in this call, naming the first rank at fault; the error
    travels with the counts, so no collective is added (with ``peers=`` it reaches the
    rank's peers only: the other ranks return). ``peers=`` must be the same relation on
    every rank (q lists p where p lists q); ``PYSHARD_VALIDATE=1`` checks that, else a
    rank that waits for a count its peer never sends waits for ever."""
    check = getattr(mesh, "check_live", None)
    if check is not None:  # (a freed mesh, or MPI finalized: before any MPI call)
        check()
    P, me = mesh.size, mesh.rank
    try:
        r = migrate_route(mesh, algorithm, peers, inplace)
    except ValueError as e:
        _validate.refused(mesh.comm, "migrate", e)  # (a no-op outside the validation mode)
        raise
    if _validate.enabled:  # the same call everywhere, and peers= one symmetric relation
        _validate.agree(mesh.comm, "migrate", {  # (wait= is this rank's own affair)
            "algorithm": repr(algorithm), "inplace": repr(bool(inplace)),
            "peers": "given" if peers is not None else "none"})
        if r.algorithm == "peers":
            _validate.symmetric(mesh.comm, "migrate", r.peers)
    if r.algorithm == "tune":
        return _tuned(rows, dest, mesh, wait)
    device = _any_device(rows)
    st, cols, code, detail = _split(rows, "rows")
    if inplace and not code:
        code, detail = _inplace_code(rows, st, cols)
    d: Optional[np.ndarray] = None
    n = cols[0].shape[0] if cols else 0
    if not code:
        d, code, detail, given = _dest(dest, n, inplace)
        if inplace and d is not None:
            n = d.shape[0]
            if not code:
                code, detail = _inplace_alias(st, cols, dest, d)
    counts = np.zeros(P, np.int64)
    if not code:
        counts, bad = _core.migrate_count(d, P)
        if bad >= 0:
            code = 10 if int(d[bad]) == -1 else 1
            detail = f"dest[{bad}] = {int(given[bad])} is outside [0, {P})"
    if not code and r.algorithm == "peers":
        out = np.ones(P, bool)
        out[list(r.peers)] = False
        out[me] = False
        if counts[out].any():
            q = int(np.flatnonzero(out & (counts > 0))[0])
            code = 8
            detail = (f"dest sends {int(counts[q])} rows to rank {q}, which is not in "
                      f"peers {r.peers}")
    sig = _signature(st, cols) if not code else 0
    comm = mesh.core_comm(tuple(range(mesh.ndim)))
    alg = {"alltoall": 0, "nbx": 1, "peers": 2}[r.algorithm]
    if alg == 2:  # persistent requests, made at the first call with this peer set
        rcounts, bad, mismatch, sig_rank = _peer_counts(mesh, comm, r.peers).exchange(
            counts, code, sig
        )
    else:
        rcounts, bad, mismatch, sig_rank = _core.migrate_counts(comm, alg, counts, code, sig)
    if bad >= 0:
        rank, c = divmod(int(bad), 256)
        own = f": {detail}" if rank == me else ""
        raise ValueError(f"pyshard.migrate: {collectives.rank_name(mesh.comm, rank)}'s input "
                         f"is bad ({_ERRORS.get(c, c)}){own}")
    if code:  # this rank's error travelled where no other rank learns it (peers)
        raise ValueError(f"pyshard.migrate: {detail}")
    if mismatch:
        who = collectives.rank_name(mesh.comm, sig_rank) if sig_rank >= 0 else "some rank"
        raise ValueError(
            f"pyshard.migrate: the columns differ between ranks: {who}'s keys, dtypes or "
            f"trailing shapes are not those of this rank, {collectives.rank_name(mesh.comm, me)}"
            f" ({_describe(st, cols)}); "
            f"each rank names the first other rank it sees differ, so the rank at fault is "
            f"the one the others name"
        )
    assert d is not None
    m = int(rcounts.sum())
    R = sum(a.dtype.itemsize * int(np.prod(a.shape[1:], dtype=np.int64)) for a in cols)
    if inplace:
        return _migrate_inplace(mesh, r, st, cols, d, counts, rcounts, sig, R, wait)
    row_off = np.concatenate(([0], np.cumsum(rcounts)[:-1])).astype(np.int64)
    node = r.node if r.path == "shm" else None
    x = RowExchange("migrate", r, _core.MigrateExchange(comm, node))
    block = None
    if node is not None:  # the result's columns in one block of node-shared memory
        block, outs = _node_block(node, x.core.table_bytes(False, len(cols)), m, cols)
    else:
        outs = [allocate((m,) + a.shape[1:], a.dtype) for a in cols]
    msgs = (np.arange(P) != me) & ~_on_node(node, P)  # the peers reached by messages
    sbytes = int(counts[msgs].sum() * R)
    rbytes = int(rcounts[msgs].sum() * R)
    others = np.arange(P) != me
    x.calls, x.sent, x.received = 1, int(counts[others].sum() * R), int(rcounts[others].sum() * R)
    bufs = _state(mesh)["buffers"]
    send, recv = bufs.take(sbytes), bufs.take(rbytes)
    x.core.start_forward(d, counts, rcounts, cols, outs, row_off, send, recv, block)
    result = Migrated(mesh, None, rcounts, counts, d, r, sig, device, (R, len(cols)))
    pend = PendingMigration(x, bufs, send, recv, result, outs, st)
    if log.isEnabledFor(logging.DEBUG):
        log.debug("migrate: %d rows, %d stay, path %s", n, int(counts[me]), r.algorithm)
    return pend.wait() if wait else pend


def _inplace_code(rows: Rows, st: _Structure, cols: List[np.ndarray]) -> Tuple[int, str]:
    """Error 7 where a column of an in-place migration is not the caller's own writeable
    C-contiguous numpy array (a copy would leave the caller's columns unchanged)."""
    for k, obj, a in zip(st.keys, _items(rows)[1], cols):
        if not (isinstance(obj, np.ndarray) and a is obj and obj.flags.writeable):
            why = ("not a numpy array" if not isinstance(obj, np.ndarray) else
                   "not C-contiguous" if a is not obj else "read-only")
            return 7, f"inplace=True: rows[{k!r}] is {why}"
    return 0, ""


def _overlap(a: np.ndarray, b: np.ndarray) -> bool:
    """Do ``a`` and ``b`` share a byte (the bounds first: exact only where they meet)?"""
    return bool(np.may_share_memory(a, b) and np.shares_memory(a, b))


def _inplace_alias(st: _Structure, cols: List[np.ndarray], dest: Any,
                   d: np.ndarray) -> Tuple[int, str]:
    """Error 9 where an in-place migration's columns overlap each other in memory (the same
    array given twice excepted: both get the same rows, byte for byte) or ``dest`` (as given,
    or as converted) shares memory with a column: the rows written into the columns would
    change the rows still to be read, and ``dest``, which ``order`` and ``back`` read again."""
    for i in range(len(cols)):
        a = cols[i]
        for j in range(i + 1, len(cols)):
            b = cols[j]
            twice = (a.__array_interface__["data"][0] == b.__array_interface__["data"][0]
                     and a.shape == b.shape and a.strides == b.strides and a.dtype == b.dtype)
            if not twice and _overlap(a, b):
                return 9, (f"inplace=True: rows[{st.keys[i]!r}] and rows[{st.keys[j]!r}] "
                           f"overlap in memory; give each column its own array")
    dests = [d] + ([dest] if isinstance(dest, np.ndarray) and dest is not d else [])
    for k, a in zip(st.keys, cols):
        if any(_overlap(x, a) for x in dests):
            return 9, (f"inplace=True: dest shares memory with rows[{k!r}]; the migration "
                       f"writes the columns, and dest must stay unchanged until back() "
                       f"returns: pass a copy (dest.copy())")
    return 0, ""


GROW = 1.25  # an in-place result without room goes into new columns with room for GROW * m


def _migrate_inplace(mesh: Any, r: MigrateRoute, st: _Structure, cols: List[np.ndarray],
                     d: np.ndarray, counts: np.ndarray, rcounts: np.ndarray, sig: int, R: int,
                     wait: bool) -> Union[Migrated, PendingMigration]:
    """``migrate(..., inplace=True)`` once the counts are known: the leavers packed and sent,
    the arrivals put into their places at ``wait`` (the core's ``start_inplace``)."""
    P, me = mesh.size, mesh.rank
    n, m = d.shape[0], int(rcounts.sum())
    cap = cols[0].shape[0]
    own = m <= cap
    if not own:  # no room on this rank: new columns, this rank's rows copied once
        room = max(m, int(GROW * m))
        log.debug("migrate(inplace=True): %d rows arrive for room of %d; new columns of %d rows",
                  m, cap, room)
        new = []
        for a in cols:
            b = np.empty((room,) + a.shape[1:], a.dtype)
            b[:n] = a[:n]
            new.append(b)
        cols = new
    comm = mesh.core_comm(tuple(range(mesh.ndim)))
    x = RowExchange("migrate", r, _core.MigrateExchange(comm, None))
    others = np.arange(P) != me
    sbytes, rbytes = int(counts[others].sum() * R), int(rcounts[others].sum() * R)
    x.calls, x.sent, x.received = 1, sbytes, rbytes
    bufs = _state(mesh)["buffers"]
    send, recv = bufs.take(sbytes), bufs.take(rbytes)
    x.core.start_inplace(d, counts, rcounts, cols, send, recv)
    result = Migrated(mesh, None, rcounts, counts, d, r, sig, False, (R, len(cols)),
                      st.build(cols), own)
    pend = PendingMigration(x, bufs, send, recv, result, [a[:m] for a in cols], st)
    return pend.wait() if wait else pend


def _inplace_order(dest: np.ndarray, me: int, rcounts: np.ndarray) -> np.ndarray:
    """:attr:`Migrated.order` of an in-place migration, from the rule of ``start_inplace``."""
    stay = dest == me
    sp, holes = np.flatnonzero(stay), np.flatnonzero(~stay)
    n, m = dest.shape[0], int(rcounts.sum())
    a, L = m - sp.size, holes.size
    arrivals = np.concatenate((holes[:min(a, L)], n + np.arange(max(a - L, 0))))
    if a < L:  # the staying rows at m and past took the holes the arrivals left
        tail = sp >= m
        sp[tail] = holes[a:a + int(tail.sum())]
    before = int(rcounts[:me].sum())
    return np.concatenate((arrivals[:before], sp, arrivals[before:])).astype(np.int64)


_U8 = np.dtype(np.uint8)
PEER_SETS_KEPT = 8  # the peer sets whose persistent count requests a mesh keeps


def _peer_counts(mesh: Any, comm: Any, peers: Tuple[int, ...]) -> Any:
    """The count exchange with ``peers`` (persistent requests), kept on the mesh for the next
    call with the same set; the least recently used of more than :data:`PEER_SETS_KEPT` sets
    is freed (``MPI_Request_free``: local, no message)."""
    sets: Dict[Tuple[int, ...], Any] = _state(mesh).setdefault("peer_sets", {})
    x = sets.pop(peers, None)
    if x is None:
        x = _core.MigratePeers(comm, list(peers))
        if len(sets) >= PEER_SETS_KEPT:
            sets.pop(next(iter(sets)))
    sets[peers] = x  # most recent last
    return x


def _on_node(node: Any, P: int) -> np.ndarray:
    """Which ranks of the mesh the shm path reaches through node-shared memory (this rank's
    node; none without a node transport)."""
    on = np.zeros(P, bool)
    if node is not None:
        on[list(node.node_ranks)] = True
    return on


def _node_block(node: Any, table: int, m: int,
                cols: List[np.ndarray]) -> Tuple[np.ndarray, List[np.ndarray]]:
    """One block of this rank's node-shared memory for a result of ``m`` rows: the table the
    core writes (``table`` bytes), then each column, 64-byte aligned; the columns are views of
    it (the block goes back to the node's pool with the last of them)."""
    offs, at = [], table
    for a in cols:
        offs.append(at)
        at += -(-m * a.dtype.itemsize * int(np.prod(a.shape[1:], dtype=np.int64)) // 64) * 64
    block = _shm.empty(node, (max(at, 1),), _U8)
    outs = []
    for a, o in zip(cols, offs):
        trail = a.shape[1:]
        nbytes = m * a.dtype.itemsize * int(np.prod(trail, dtype=np.int64))
        outs.append(block[o:o + nbytes].view(a.dtype).reshape((m,) + trail))
    return block, outs


def _tuned(rows: Rows, dest: Any, mesh: Any, wait: bool) -> Union[Migrated, PendingMigration]:
    """``algorithm="tune"``: the count exchange measured at the first call on ``mesh`` (each
    candidate run twice on this call's rows, the slowest rank's best time deciding, so every
    rank keeps the same), then kept for the mesh."""
    st = _state(mesh)
    if "tuned" not in st:
        times = {}
        shm = migrate_route(mesh, "shm").path == "shm"
        for alg in ("alltoall", "nbx") + (("shm",) if shm else ()):
            best = float("inf")
            for _ in range(2):
                collectives.barrier(mesh.comm)
                t0 = time.perf_counter()
                migrate(rows, dest, mesh, alg)
                best = min(best, time.perf_counter() - t0)
            times[alg] = collectives.max_all(mesh.comm, best)
        pick = min(times, key=lambda a: (times[a], a))
        st["tuned"] = (pick, ", ".join(f"{a} {1e3 * t:.3g} ms" for a, t in times.items()))
        log.info("migrate tune: %s (%s)", pick, st["tuned"][1])
    pick, why = st["tuned"]
    out = migrate(rows, dest, mesh, pick, wait)
    res = out if isinstance(out, Migrated) else out._result
    res.route = MigrateRoute(res.route.path, res.route.algorithm,
                             f"tuned at the first call ({pick}): {why}", node=res.route.node)
    return out


def _any_device(rows: Rows) -> bool:
    return any(_backend.is_device(a) for a in _items(rows)[1])


def _describe(st: _Structure, cols: List[np.ndarray]) -> str:
    # (a record dtype by its fields: its "|V8" alone hides what differs between ranks)
    return ", ".join(f"{k!r}: {a.dtype.descr if a.dtype.fields else _dtypes.name(a.dtype)}"
                     f"{list(a.shape[1:])}" for k, a in zip(st.keys, cols))


def grid_params(origin: Any, spacing: Any, periodic: Any, nd: int, what: str
                ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``origin``, ``spacing`` and ``periodic`` (scalars or one per axis) as arrays of ``nd``;
    ValueError naming the argument where one is not (or a spacing is not finite and > 0, an
    origin not finite): the arguments alone, so every rank that passes them raises alike."""
    out = []
    for name, v, dt in (("origin", origin, np.float64), ("spacing", spacing, np.float64),
                        ("periodic", periodic, bool)):
        try:
            a = np.asarray(v, dt)
            if a.ndim > 1:
                raise ValueError
            out.append(np.broadcast_to(a, (nd,)))
        except (TypeError, ValueError):
            raise ValueError(f"{what}: {name} must be a scalar or one value per axis of the "
                             f"{nd}-D grid, got {v!r}") from None
    o, h, per = out
    if not np.isfinite(o).all():
        raise ValueError(f"{what}: origin must be finite, got {o.tolist()}")
    if not (np.isfinite(h) & (h > 0)).all():
        raise ValueError(f"{what}: spacing must be finite and > 0 on every axis, got "
                         f"{h.tolist()}")
    return o, h, per


def owner(positions: Any, like: Any, origin: Any = 0.0, spacing: Any = 1.0,
          periodic: Any = False, mesh: Any = None, invalid: str = "raise") -> np.ndarray:
    """The ``dest`` that sends each position to the rank whose box holds its cell.

    ``positions``: ``(n, d)`` floating point; ``like``: a ``ShardedArray`` (or a ``Layout``,
    with ``mesh=``) of ``d`` dims. The cell along axis ``k`` is
    ``floor((x[k] - origin[k]) / spacing[k])`` in float64; ``origin``, ``spacing`` and
    ``periodic`` are scalars or one per axis. Periodic axes wrap the cell modulo the shape;
    a position outside a non-periodic axis, or a non-finite one (NaN or +-inf, on any axis,
    periodic or not), raises ``ValueError`` with the count of such rows and the first one.
    That error is this rank's alone (``owner`` communicates nothing): where the next call is
    a collective :func:`migrate`, pass ``invalid="dest"`` instead, and such rows get dest
    ``-1``, which :func:`migrate` then reports on every rank (``rank k's input is bad``)
    instead of leaving the other ranks waiting. Uneven and empty shards come from the shard
    table. On a ``Replicate`` mesh dim the destination shares this rank's
    coordinate, so each replica group migrates within itself; a ``Partial`` mesh dim raises.
    Returns int32 ranks of ``mesh.comm``."""
    layout: Layout = like if isinstance(like, Layout) else like.layout
    mesh = mesh if mesh is not None else getattr(like, "mesh", None)
    if mesh is None:
        raise ValueError("pyshard.owner: like is a Layout; pass mesh= as well")
    if tuple(mesh.shape) != tuple(layout.mesh_shape):
        raise ValueError(f"pyshard.owner: the layout is for a {layout.mesh_shape} mesh, the mesh "
                         f"is {tuple(mesh.shape)}")
    for m, p in enumerate(layout.placements):
        if isinstance(p, Partial):
            raise ValueError(f"pyshard.owner: mesh dim {m} is {p}: a Partial layout has no "
                             "owner for a cell")
    x = _backend.as_array(positions, "positions")
    if _backend.is_device(x):
        x = _backend.to_host(x)
    nd = layout.ndim
    if x.ndim != 2 or x.shape[1] != nd or x.dtype.kind != "f":
        raise ValueError(f"pyshard.owner: positions must be (n, {nd}) floating point, got "
                         f"{x.dtype} {x.shape}")
    origin, spacing, periodic = grid_params(origin, spacing, periodic, nd, "pyshard.owner")
    n = x.shape[0]
    coords = np.empty((n, len(layout.mesh_shape)), np.int64)
    for m, p in enumerate(layout.placements):
        if isinstance(p, Replicate) or not any(m in t[0] for t in layout.table):
            coords[:, m] = mesh.coords[m]
    bad = np.zeros(n, bool)
    cells = []
    for k in range(nd):
        c = np.floor((x[:, k].astype(np.float64) - origin[k]) / spacing[k])
        # NaN and +-inf have no cell on any axis, periodic or not (inf would wrap to NaN):
        # flagged before nan_to_num turns them into cell 0
        out = ~np.isfinite(c)
        c = np.nan_to_num(c, nan=0.0, posinf=0.0, neginf=0.0)
        size = layout.shape[k]
        if periodic[k]:
            c = np.mod(c, size)
        else:
            out |= (c < 0) | (c >= size)
        bad |= out
        cells.append(np.where(out, 0.0, c).astype(np.int64))
    if invalid not in ("raise", "dest"):
        raise ValueError(f"pyshard.owner: invalid must be 'raise' or 'dest', got {invalid!r}")
    if bad.any() and invalid == "raise":
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"pyshard.owner: {int(bad.sum())} of {n} positions lie outside the grid of shape "
            f"{layout.shape} on a non-periodic axis or are not finite (NaN or inf); the first "
            f"is row {i}: {x[i].tolist()}"
        )
    for k in range(nd):
        mdims, ext, off = layout.table[k]
        if not mdims:
            continue
        ends = np.asarray(off, np.int64) + np.asarray(ext, np.int64)
        shard = np.searchsorted(ends, cells[k], side="right")
        sub = [layout.mesh_shape[m] for m in mdims]
        for j, m in enumerate(mdims):
            stride = int(np.prod(sub[j + 1:], dtype=np.int64))
            coords[:, m] = (shard // stride) % sub[j]
    strides = [int(np.prod(layout.mesh_shape[m + 1:], dtype=np.int64))
               for m in range(len(layout.mesh_shape))]
    dest = (coords @ np.asarray(strides, np.int64)).astype(np.int32)
    dest[bad] = -1
    return dest

