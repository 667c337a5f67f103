"""The one routing rule: which path a planned step takes (a local copy, node-shared memory,
MPI from host memory, MPI through pinned host buffers, MPI on device memory), with which MPI
algorithm, the node-local transport object, and the MPI transport (direct or staged) that the
core's step is built with and keeps. The executor, ``redistribute_many``,
:func:`pyshard.explain.explain` and the tuner all ask :func:`route` (or, without a mesh,
:func:`describe`), and nothing else decides; every answer depends only on what every rank
holds alike (the layouts, the mesh's node map, the settings), so every rank takes the same
path.

The rule, for host arrays with ``algorithm="auto"``:

- node-shared memory (``_shm``) for exchanges (``alltoallv``) and gathers (``allgatherv``)
  whose largest block has at least ``min_block`` bytes, where ranks of the step's
  communicator share a node (peers on other nodes by MPI messages in the same step) and, for
  an exchange, some block of it goes between two ranks of one node (:func:`node_blocks`:
  the 2-D swap on two hosts, each rank's one peer on the other host, moves nothing through
  node-shared memory and takes MPI), and for reductions (``reduce_scatter``, ``allreduce``)
  where every rank of it shares one node;
- else MPI: a sparse exchange (each rank sends to at most a quarter of its group) by
  point-to-point messages (``p2p``), a dense one by ``alltoallv``; gathers and reductions by
  their collective.

``algorithm="shm"`` takes node-shared memory wherever it is usable, whatever the size;
``"tune"`` measures the candidates :func:`route` lists (node-shared memory among them where,
in some communicator of the step on the mesh, a block goes between two ranks of one node:
:func:`node_blocks_anywhere`, so that every rank of the mesh lists the same) once per kind of
step and keeps the fastest (``pyshard._tune``); an MPI algorithm
by name takes MPI. GPU arrays never take node-shared memory: MPI on device memory where the
library is CUDA-aware, else through pinned host buffers.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from math import prod
from typing import Any, Optional, Tuple

import numpy as np

from . import _shm
from .config import ALGORITHMS, HALO_METHODS, HALO_MPI  # the one list of the names
from .layout import ravel, unravel
from .planner import Step

__all__ = ["ALGORITHMS", "FOLD_DTYPES", "FOLD_KIND", "HALO_METHODS", "MIGRATE_ALGORITHMS",
           "MIGRATE_DENSE_MAX", "MigrateRoute", "Route", "batch_route", "choose_algorithm",
           "core_transport", "describe", "halo_reason", "halo_route", "migrate_route",
           "node_blocks", "node_blocks_anywhere", "route"]

MPI_KINDS = ("alltoallv", "allgatherv", "reduce_scatter", "allreduce")
HOST_CANDIDATES = ("alltoallv", "alltoall", "p2p", "alltoallw")  # what "tune" measures
DEVICE_CANDIDATES = ("alltoallv", "alltoall", "p2p")


@dataclass(frozen=True)
class Route:
    """Where a step goes. ``path``: ``"local"`` (no communication), ``"shm"`` (node-shared
    memory, ``node`` its transport), ``"mpi"`` (MPI from host memory), ``"staged"`` (MPI
    through pinned host buffers), ``"device"`` (MPI on device memory) or ``"tune"`` (to be
    measured among ``candidates``). ``algorithm``: what the core runs: ``"shm"``; for an MPI
    exchange ``"alltoallv"``, ``"alltoall"``, ``"p2p"`` or ``"alltoallw"``; ``""`` for a
    gather, a reduction or a local step. ``transport``: how the MPI steps of this route hand
    their memory to MPI, ``"staged"`` (through pinned host buffers: exactly where ``path`` is
    ``"staged"``, and for ``"tune"`` where its MPI candidates are) or ``"direct"``; the core's
    step is built with it and keeps it (:func:`core_transport`), whatever the settings say
    when it runs."""

    path: str
    algorithm: str = ""
    node: Any = field(default=None, compare=False)
    candidates: Tuple[str, ...] = ()
    transport: str = "direct"
    why: str = field(default="", compare=False)  # for explain(), where the rule needs words


def core_transport(r: Route) -> Any:
    """The ``_core.Transport`` that a core step on route ``r`` is built with."""
    from . import _core

    return getattr(_core.Transport, r.transport)


def choose_algorithm(
    step: Optional[Step], algorithm: str, device: bool = False
) -> str:
    """The MPI algorithm of an exchange step; the same on every rank of its communicator
    (decided from the layouts alone).

    ``auto``: ``p2p`` when the exchange is sparse (each rank sends to at most a quarter of
    its group, e.g. the 2-D swap ``[S0,S1] -> [S1,S0]`` or a target whose shards are mostly
    empty), so that no collective carries a count for every rank of the group; else
    ``alltoallv``. Measured here (MPICH 5.0.2, 8192^2 float32 transpose, docs/performance.md):
    ``alltoallv`` 40 ms against 52 ms for the regular ``alltoall`` at 2 ranks, 47 against 63
    at 4, although the raw Alltoall of pre-packed bytes is the faster collective (23 vs 30 ms
    at 2 ranks, a tie at 4): a regular Alltoall must also move this rank's own block through
    the packed buffers, which Alltoallv leaves out (it is copied locally while the exchange
    runs). ``alltoallw`` swung between 31 and 60 ms; ``p2p`` tied on dense exchanges.
    ``alltoallw`` is host-only: GPU arrays take ``alltoallv``.
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


def check_algorithm(algorithm: str) -> None:
    """Raise the precise error for an unknown algorithm (before any communication)."""
    if algorithm not in ("auto", "tune") and algorithm not in ALGORITHMS:
        choose_algorithm(None, algorithm)


def shm_allowed(kind: str, node: Any) -> bool:
    """Can node-shared memory ``node`` (or None) carry a step of ``kind`` at all? Reductions
    only where every rank of the communicator shares one node."""
    if node is None or kind not in MPI_KINDS:
        return False
    return kind in ("alltoallv", "allgatherv") or node.nodes == 1


def shm_for(kind: str, block: int, node: Any, algorithm: str) -> bool:
    """The rule for node-shared memory: a step (or a batch of them) of ``kind`` whose largest
    block has ``block`` bytes, on a communicator whose node transport is ``node``, called
    with ``algorithm``."""
    if algorithm not in ("auto", "tune", "shm") or not shm_allowed(kind, node):
        return False
    return algorithm == "shm" or block >= _shm.min_block(node)


def batch_route(kind: str, mesh_dims: Tuple[int, ...], block: int, mesh: Any, algorithm: str,
                device: bool = False) -> Route:
    """Where a batch of steps of ``kind`` on ``mesh_dims`` goes when they run fused as one
    (``redistribute_many``), its largest block ``block`` bytes: the rule of :func:`route` for
    one such step (a batch is one handshake, as one step is), except that ``tune`` measures
    nothing here (the batch runs as ``auto`` would). No MPI call."""
    node = None
    if not device and algorithm in ("auto", "tune", "shm"):
        node = _shm.node(mesh, mesh_dims)
    if shm_for(kind, block, node, algorithm):
        return Route("shm", "shm", node)
    return _mpi_route(device, "alltoallv" if kind == "alltoallv" else "")


def _mpi_route(device: bool, algorithm: str = "", node: Any = None) -> Route:
    """An MPI route for host (``device=False``) or GPU memory, on the transport the settings
    give a step built at this call (``pyshard._backend.transport``): ``staged`` through
    pinned host buffers, else MPI on the array's own memory (``mpi`` for host, ``device``
    for GPU)."""
    from ._backend import transport

    t = transport(device)
    path = "staged" if t == "staged" else "device" if device else "mpi"
    return Route(path, algorithm, node, transport=t)


def node_blocks(step: Step, mesh: Any) -> bool:
    """Does some block of exchange ``step`` go between two different ranks of one node in
    this rank's communicator? From the layouts (the blocks each rank of the communicator
    sends) and the mesh's node map (:meth:`~pyshard.Mesh.node_groups`), which every rank of
    the communicator holds alike: each of them answers the same. No MPI call."""
    groups = mesh.node_groups(step.mesh_dims)
    if not groups:
        return False
    on: dict = {}
    for r, g in groups.items():
        on.setdefault(g, []).append(r)
    shape = step.src.mesh_shape
    for rs in on.values():
        if len(rs) < 2:
            continue
        peers = set(rs)
        for r in rs:
            for to, _ in step.sends(tuple(unravel(r, shape))):
                t = ravel(to, shape)
                if t != r and t in peers:
                    return True
    return False


def node_blocks_anywhere(step: Step, mesh: Any) -> bool:
    """Does some block of exchange ``step`` go between two different ranks of one node, both
    able to use node-shared memory, in any communicator of ``mesh`` over the step's mesh
    dims? :func:`node_blocks` asked of every communicator at once: from the layouts and the
    whole mesh's node map (:meth:`~pyshard.Mesh.node_groups` over every mesh dim,
    :meth:`~pyshard.Mesh.node_info`), never from this rank's communicator, so every rank of
    the mesh answers the same. ``tune`` lists its candidates by it: its timings are combined
    over the whole mesh, so every rank must time the same ones. No MPI call."""
    groups = mesh.node_groups(tuple(range(mesh.ndim)))
    if not groups:
        return False
    info = mesh.node_info()
    ok = info.get("shm") if info else None
    shape = step.src.mesh_shape
    for r in range(prod(shape)):
        if ok is not None and not ok[r]:
            continue
        for to, _ in step.sends(tuple(unravel(r, shape))):
            t = ravel(to, shape)
            if t != r and groups[t] == groups[r] and (ok is None or ok[t]):
                return True
    return False


NO_NODE_BLOCKS = (
    "no block of this step goes between two ranks of one node (each rank's peers are on "
    "other nodes): node-shared memory would carry nothing"
)


def route(step: Step, mesh: Any, algorithm: str, device: bool = False) -> Route:
    """Where ``step`` goes on ``mesh`` for an array in host (``device=False``) or GPU memory,
    called with ``algorithm`` (``auto``, ``tune``, ``shm`` or an MPI algorithm). No MPI call:
    the node transport comes from the mesh's node map. An exchange takes node-shared memory
    under ``auto`` only where some block of it goes between two ranks of one node in this
    rank's communicator (:func:`node_blocks`); ``tune`` measures it where that holds in any
    communicator of the step (:func:`node_blocks_anywhere`: the same candidates on every rank
    of the mesh, whose timings are combined over the mesh); ``shm`` takes it wherever it is
    usable (and MPI, as ``auto`` would, where it is not)."""
    if not step.is_collective:
        return Route("local")
    node = None
    if not device and algorithm in ("auto", "tune", "shm"):
        node = _shm.node(mesh, step.mesh_dims)
    exchange, why = step.kind == "alltoallv", ""
    if exchange and algorithm == "tune":
        # the same list on every rank of the mesh (pyshard._tune combines the timings over
        # the whole mesh): "shm" where any communicator of the mesh over the step's dims has
        # a block between two ranks of one node; a rank whose own communicator cannot use it
        # times (and, if it wins, runs) "shm" as route() takes it there: MPI, as auto would
        shm = ("shm",) if not device and _shm.enabled() and node_blocks_anywhere(step, mesh) \
            else ()  # fmt: skip
        cands = DEVICE_CANDIDATES if device else HOST_CANDIDATES + shm
        return Route("tune", "tune", node, cands, _mpi_route(device).transport)
    if shm_for(step.kind, _shm.block_bytes(step), node, algorithm):
        if not exchange or algorithm == "shm" or node_blocks(step, mesh):
            return Route("shm", "shm", node)
        why = NO_NODE_BLOCKS  # MPI, as auto goes without node-shared memory
    if not exchange:
        return _mpi_route(device)
    a = "auto" if algorithm in ("shm", "tune") else algorithm
    return replace(_mpi_route(device, choose_algorithm(step, a, device)), why=why)


def halo_face_bytes(layout: Any, spec: Any) -> int:
    """The largest face a halo exchange of ``layout`` with ``spec`` moves between two ranks,
    from the shard table alone (the same on every rank): per sharded dim with a width, the
    width times the largest shard's extents of the other dims."""
    ext = [max(t[1]) if t[0] else n for t, n in zip(layout.table, layout.shape)]
    faces = [
        w * prod(e for k, e in enumerate(ext) if k != d)
        for d, (w, t) in enumerate(zip(spec.width, layout.table))
        if w and t[0]
    ]
    return max(faces, default=0) * layout.dtype.itemsize


# cpp/halo.h FoldKind: the dtypes the core's host combine of a fold runs in; a fold of any
# other dtype (float16 and the ml_dtypes floats, accumulated in float32; bool) combines in
# Python from an MPI step's buffer, so it never takes node-shared memory
FOLD_DTYPES = ("float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16",
               "uint32", "uint64", "complex64", "complex128")
# the core's FoldKind code of each of those dtypes (its position there)
FOLD_KIND = {np.dtype(t): k for k, t in enumerate(FOLD_DTYPES)}


def halo_route(layout: Any, spec: Any, mesh: Any, method: str, device: bool = False,
               fold: bool = False) -> Route:
    """Where a halo exchange (update, or with ``fold=True`` a fold) of ``layout`` on ``mesh``
    goes, called with ``method`` (``auto``, ``tune``, ``shm`` or an MPI method of
    :data:`HALO_MPI`): no MPI call, the same on every rank.

    ``auto``: node-shared memory (``shm``: each ghost cell copied once, straight between the
    padded arrays; peers on other nodes by persistent requests in the same exchange) where
    ranks of the mesh share a node and the largest face (:func:`halo_face_bytes`) has at least
    ``_shm.halo_min_bytes`` (``PYSHARD_SHM_MIN_BYTES``; 0 where every rank has a core), else
    MPI persistent requests;
    ``shm`` takes node-shared memory wherever it is usable; ``tune`` measures the MPI methods
    and, where usable, ``shm``. GPU arrays and ``PYSHARD_SHM=off`` take
    MPI. A fold whose dtype the core does not combine (not in :data:`FOLD_DTYPES` in native
    byte order: a non-native order such as ``">f8"`` neither) takes
    persistent requests where the update takes node-shared memory, and ``tune`` leaves
    ``shm`` out of its candidates."""
    if fold and np.dtype(layout.dtype) not in FOLD_KIND and not device:
        # (the dtype itself, byte order included: ">f8" is named "float64" too, but the
        # core combines native byte order only, as the fold's wait asks FOLD_KIND)
        r = halo_route(layout, spec, mesh, method, device)
        if r.path == "shm":
            return _mpi_route(device, "persistent", r.node)
        if r.path == "tune":
            return Route("tune", "tune", r.node, tuple(m for m in r.candidates if m != "shm"),
                         r.transport)
        return r
    node = None
    if not device and method in ("auto", "tune", "shm"):
        node = _shm.node(mesh, tuple(range(mesh.ndim)))
    if method == "tune":
        t = _mpi_route(device).transport
        mpi = tuple(m for m in HALO_MPI if not ((device or t == "staged") and m == "datatype"))
        return Route("tune", "tune", node, mpi + (() if node is None else ("shm",)), t)
    if node is not None and (
        method == "shm" or halo_face_bytes(layout, spec) >= _shm.halo_min_bytes(node)
    ):
        return Route("shm", "shm", node)
    return _mpi_route(device, "persistent" if method in ("auto", "shm") else method)


def halo_reason(r: Route, layout: Any, spec: Any, mesh: Any, method: str) -> str:
    """Why :func:`halo_route` took ``r``, in words (``HaloArray.explain()``)."""
    if r.path == "shm":
        return "node-shared memory between ranks of a node" + (
            "" if method == "shm" else
            f" (largest face {halo_face_bytes(layout, spec)} B >= "
            f"{_shm.halo_min_bytes(r.node)} B)"
        )
    if r.path == "tune":
        return "measured at the first update among " + ", ".join(r.candidates)
    if method not in ("auto", "shm"):
        return f"MPI, as asked ({method})"
    node = _shm.node(mesh, tuple(range(mesh.ndim)))
    if node is None:
        return ("MPI: no other rank of the mesh shares this rank's node memory (or "
                "PYSHARD_SHM turns node-shared memory off)")
    return (f"MPI: largest face {halo_face_bytes(layout, spec)} B < "
            f"{_shm.halo_min_bytes(node)} B (PYSHARD_SHM_MIN_BYTES)")


def describe(step: Step, algorithm: str = "auto") -> Optional[str]:
    """Where ``algorithm`` takes ``step`` for host arrays, in words, for any mesh
    (``explain()`` without one): the rule of :func:`route` with the node map's facts left
    open, under the settings as they are now (``PYSHARD_SHM``, the MPI transport)."""
    if step.kind not in MPI_KINDS:
        return None
    block = _shm.block_bytes(step)
    low, high = _shm.min_block(), _shm.min_block(oversubscribed=True)
    reduction = step.kind in ("reduce_scatter", "allreduce")
    staged = _mpi_route(False).transport == "staged"
    mpi = "MPI staged through pinned host buffers" if staged else "MPI"
    exchange = step.kind == "alltoallv"
    if algorithm not in ("auto", "tune", "shm"):  # an MPI algorithm: no node-shared memory
        return f"{mpi} ({algorithm})" if exchange else mpi
    if not _shm.enabled():
        return f"{mpi} (PYSHARD_SHM=off: no node-shared memory)"
    if algorithm == "tune" and exchange:
        return (f"measured at the first call on the mesh: node-shared memory where ranks of "
                f"one node exchange blocks, and {mpi}'s algorithms")
    if algorithm == "shm":
        return ("node-shared memory where ranks of the step share a node"
                + ("" if not reduction else " (a reduction: every rank of it)") + f", else {mpi}")
    if block < low:
        return f"{mpi} (largest {'piece' if reduction else 'block'} {block} B < {low} B, " \
               "PYSHARD_SHM_MIN_BYTES)"  # fmt: skip
    if reduction:
        return (
            "node-shared memory where every rank of the step shares one node "
            + ("" if block >= high else f"and has a core (largest piece {block} B < {high} B), ")
            + f"else {mpi}"
        )
    blocks = " (an exchange: where some block goes between them)" if step.kind == "alltoallv" \
        else ""  # fmt: skip
    if block >= high:
        return f"node-shared memory between ranks of one node{blocks}, {mpi} between nodes"
    return (
        f"node-shared memory between ranks of one node{blocks} where each has a core "
        f"(else {mpi}: largest block {block} B < {high} B), {mpi} between nodes"
    )


# ----------------------------------------------------------------------------- migrate

MIGRATE_ALGORITHMS = ("alltoall", "nbx", "peers", "shm")
# auto's dense count exchange up to this many ranks, NBX past it: an MPI_Alltoall of the counts
# costs every rank O(P) however few peers it has, NBX O(peers) plus a reduction's log P
MIGRATE_DENSE_MAX = 64


@dataclass(frozen=True)
class MigrateRoute:
    """Where a migration (:func:`pyshard.migrate`) goes: ``path`` ``"local"`` (one rank),
    ``"mpi"`` (the rows by point-to-point messages to the ranks that get rows) or ``"shm"``
    (rows for ranks of this node written straight into their results in node-shared memory,
    messages to the other nodes' ranks, in the same pass); ``algorithm``: the count exchange,
    ``"alltoall"`` (one ``MPI_Alltoall``), ``"nbx"`` (synchronous sends and a nonblocking
    reduction) or ``"peers"`` (messages to and from ``peers`` only, no collective); ``why``,
    in words; ``node``: the node transport on the shm path."""

    path: str
    algorithm: str
    why: str
    peers: Tuple[int, ...] = ()
    node: Any = field(default=None, compare=False, repr=False)


def _counts_rule(P: int) -> Tuple[str, str]:
    if P <= MIGRATE_DENSE_MAX:
        return "alltoall", f"{P} ranks <= {MIGRATE_DENSE_MAX}: the counts in one MPI_Alltoall"
    return "nbx", f"{P} ranks > {MIGRATE_DENSE_MAX}: NBX, messages only to the ranks that get rows"


def migrate_route(mesh: Any, algorithm: str, peers: Any = None,
                  inplace: bool = False) -> MigrateRoute:
    """The rule for :func:`pyshard.migrate`, from what every rank holds alike (the mesh size,
    its node map, the settings, the arguments): ``peers`` given -> ``peers`` (point-to-point,
    no collective, no node handshake); ``auto`` -> the rows through node-shared memory where
    ranks of the mesh share a node (``shm``; ``PYSHARD_SHM=off`` turns it off), else by
    messages, and the counts by ``alltoall`` up to :data:`MIGRATE_DENSE_MAX` ranks, ``nbx``
    past it; ``shm`` -> that path with the counts by the same rule (by messages where no two
    ranks share a node); ``alltoall`` / ``nbx`` -> that count exchange, the rows by messages;
    ``tune`` -> measured at the first call on the mesh, the slowest rank's time deciding. No
    MPI call; bad arguments raise ``ValueError`` before any communication. ``inplace``
    (``migrate(..., inplace=True)``): the rows by messages, never node-shared memory (the
    result is the caller's own columns, which no node peer can write), and ``tune`` refused
    (its trials would move the rows)."""
    P = mesh.size
    if algorithm not in ("auto", "tune") + MIGRATE_ALGORITHMS:
        raise ValueError(f"pyshard.migrate: algorithm must be 'auto', 'tune' or one of "
                         f"{MIGRATE_ALGORITHMS}, got {algorithm!r}")
    ps: Tuple[int, ...] = ()
    if peers is not None:
        try:
            ps = tuple(sorted({int(q) for q in peers}))
        except (TypeError, ValueError):
            raise ValueError(f"pyshard.migrate: peers must be ranks, got {peers!r}") from None
        if any(not 0 <= q < P for q in ps):
            raise ValueError(f"pyshard.migrate: peers must be ranks in [0, {P}), got {ps}")
        ps = tuple(q for q in ps if q != mesh.rank)
        if algorithm not in ("auto", "peers"):
            raise ValueError(f"pyshard.migrate: peers= goes with algorithm 'auto' or 'peers', "
                             f"got {algorithm!r}")
        return MigrateRoute("mpi" if P > 1 else "local", "peers",
                            f"peers given: counts to {len(ps)} ranks, no collective", ps)
    if algorithm == "peers":
        raise ValueError("pyshard.migrate: algorithm 'peers' needs peers=")
    path = "mpi" if P > 1 else "local"
    if algorithm == "tune" and inplace:
        raise ValueError("pyshard.migrate: inplace=True does not take algorithm='tune' (its "
                         "trials would move the rows); name the count exchange")
    if algorithm == "tune":
        return MigrateRoute(path, "tune", "measured at the first call on this mesh")
    if algorithm in ("alltoall", "nbx"):
        return MigrateRoute(path, algorithm, f"as asked ({algorithm}); the rows by messages")
    counts, why = _counts_rule(P)
    if P == 1:
        return MigrateRoute("local", counts, f"one rank: the rows stay; {why}")
    if inplace:
        return MigrateRoute("mpi", counts, f"in place: the rows by messages into this rank's "
                            f"own columns; {why}")
    node = _shm.node(mesh, tuple(range(mesh.ndim)))
    if node is None:
        off = ("PYSHARD_SHM=off" if not _shm.enabled()
               else "no two ranks of the mesh share a node with node-shared memory")
        return MigrateRoute("mpi", counts, f"rows by messages ({off}); {why}")
    where = (f"{node.node_size} ranks of this node" + (f", messages to the other {node.nodes - 1}"
             " node(s)" if node.nodes > 1 else ""))
    return MigrateRoute("shm", counts, f"rows through node-shared memory among the {where}; "
                        f"{why}", node=node)
