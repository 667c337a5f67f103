"""The node-local transport (``cpp/shm.h``): which exchanges take it, its setup per
communicator, and results in node-shared memory.

Host-array exchanges (``alltoallv`` steps) and gathers between ranks of one node go through
node-shared memory when the algorithm is ``auto``, ``tune`` or ``shm``: each sender copies its
block once, from its source shard straight into the receiver's result, which lives in
node-shared memory (a Linux memfd segment of the receiver's; never a file in ``/dev/shm``).
Peers on other nodes are reached by MPI point-to-point messages in the same step.
Reduce_scatter steps (``Partial -> Shard``) and Allreduces (``Partial -> Replicate``) take it
where every rank of the communicator shares one node: each rank copies its piece for every
peer once into that peer's staging segment, and each rank reduces its own piece and the
staged ones (an Allreduce then copies every reduced chunk from its owner into each result).

- ``PYSHARD_SHM=off`` turns it off: every exchange goes through MPI; ``auto`` (default) leaves
  it on (the older ``PYSHARD_TRANSPORT=mpi``, ``direct`` or ``staged`` turn it off too,
  ``pyshard.config``).
- ``auto`` takes it for steps whose largest block has at least ``PYSHARD_SHM_MIN_BYTES``
  (default 16 KiB, 256 KiB where ranks outnumber cores); smaller exchanges stay on MPI.
- ``PYSHARD_NODE_SIZE=k`` splits each node further into groups of ``k`` consecutive world
  ranks, so that the mixed path (shared memory within a group, MPI between groups) runs on
  one machine (tests, CI).
- Where the setup fails on any rank (no memfd, ``/proc/<pid>/fd`` of a peer not readable), it is
  logged once and every exchange on that communicator uses MPI; the decision is the same on
  every rank.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
import socket
import weakref
from math import prod
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from . import collectives, config

log = logging.getLogger("pyshard")

_warned = False  # the "not usable" warning is logged once a process
_threads_warned = False  # config.threads_note's warning: once a process
YAMA_SCOPE = "/proc/sys/kernel/yama/ptrace_scope"  # Yama's ptrace_scope (allow_peer_attach)
_attach_allowed: Optional[int] = None  # allow_peer_attach's answer, asked once a process
_cma_noted = False  # the note that a node refuses cross-memory attach: once a process
# pyshard.memory.failing_node_setup: "segment", "map", "cma" or None
fail_setup: Optional[str] = None


# ``auto`` takes node-shared memory for a step whose largest block (from the layouts: the
# same on every rank) has at least min_block() bytes: smaller exchanges are latency, where an
# MPI library's eager messages need no handshake with the receiver. Measured here (MPICH,
# Shard(0) -> Shard(1), shm / MPI): at 2 ranks on 2 cores 1.60x at 4 KiB blocks, 0.82x at
# 16 KiB, 0.51x at 64 KiB; at 4 ranks on 2 cores (a waiting rank sleeps, ~100 us a call)
# 1.79x at 16 KiB, 1.07x at 64 KiB, 0.85x at 256 KiB. So 16 KiB where every rank of a node
# has a core, 256 KiB where some node has more ranks than cores (NodeShm.oversubscribed, the
# same on every rank). PYSHARD_SHM_MIN_BYTES sets it; ``algorithm="shm"`` and ``"tune"``
# ignore it.
MIN_BLOCK_CORES = 16 << 10
MIN_BLOCK_OVERSUBSCRIBED = 256 << 10


def min_block(node: Optional[Any] = None, oversubscribed: bool = False) -> int:
    """The threshold ``auto`` applies on ``node`` (or, without one, on nodes with a core per
    rank, or fewer cores than ranks when ``oversubscribed``)."""
    forced = config.get("PYSHARD_SHM_MIN_BYTES")
    if forced is not None:
        return forced
    over = node.oversubscribed if node is not None else oversubscribed
    return MIN_BLOCK_OVERSUBSCRIBED if over else MIN_BLOCK_CORES


# Halo updates (pyshard/route.py halo_route): measured here at 2 ranks with a core each
# (bench --cases halo --halo-scale 16, MPICH), node-shared memory took 3.9 us where
# persistent requests took 30 (512^2 float64, width 1: 4 KiB faces), so every face takes it
# where each rank has a core; where ranks outnumber cores a wait may sleep (~100 us), so
# only faces of at least MIN_HALO_OVERSUBSCRIBED bytes.
MIN_HALO_OVERSUBSCRIBED = 256 << 10


def halo_min_bytes(node: Any) -> int:
    """The smallest face ``auto`` sends through node-shared memory on ``node``."""
    forced = config.get("PYSHARD_SHM_MIN_BYTES")
    if forced is not None:
        return forced
    return MIN_HALO_OVERSUBSCRIBED if node.oversubscribed else 0


def block_bytes(step: Any) -> int:
    """The largest block of ``step`` in bytes, from the layouts (the same on every rank): of
    an exchange or a gather, its largest block; of a Reduce_scatter, the largest piece a rank
    receives reduced."""
    if step.kind == "reduce_scatter":
        return prod(max(t[1]) for t in step.dst.table) * step.src.dtype.itemsize
    if step.kind == "allreduce":  # the chunk each rank reduces
        whole = prod(max(t[1]) for t in step.src.table) * step.src.dtype.itemsize
        return whole // prod(step.group_shape)
    return step.max_block_volume() * step.src.dtype.itemsize


def enabled() -> bool:
    """Does ``PYSHARD_SHM`` leave the node-local transport on for host exchanges (``auto``;
    ``off`` names MPI for every step)?"""
    return config.get("PYSHARD_SHM") == "auto"


def sim_node_size() -> int:
    """``PYSHARD_NODE_SIZE`` (simulated nodes of that many consecutive world ranks), or 0."""
    return config.get("PYSHARD_NODE_SIZE") or 0


def _machine_key() -> int:
    """Ranks that can share memory have the same key: one machine (host name and boot), one
    process-id namespace (a peer is opened through /proc/<pid>/fd) and one user."""
    parts = [socket.gethostname()]
    for path in ("/proc/sys/kernel/random/boot_id",):
        try:
            with open(path) as f:
                parts.append(f.read().strip())
        except OSError:
            pass
    try:
        parts.append(str(os.stat("/proc/self/ns/pid").st_ino))
    except OSError:
        pass
    parts.append(str(os.getuid()))
    digest = hashlib.blake2b("\0".join(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1  # a non-negative int64


# the mesh's one Allgather: per rank, these int64 fields
_KEY, _PID, _CORES, _OK, _FD, _WORLD = range(6)


class NodeMap:
    """What a :class:`~pyshard.Mesh` learns of its ranks' nodes when it is built, in one
    ``MPI_Allgather`` over the mesh (machine, pid, cores, whether node-shared memory can be set
    up, the fd of its control segment): every communicator's node grouping, whether ranks
    outnumber cores and whether the transport is usable are then arithmetic on what every rank
    holds, so the first exchange on any mesh dims runs no collective of its own.

    Each rank then maps its machine peers' control segments (``_core.NodeCtl``); a rank that
    cannot says so in its own segment, and the ranks of its node take MPI among themselves
    (``_core.NodeShm``), the same choice on each of them, with no MPI call."""

    def __init__(self, comm: Any, shape: Tuple[int, ...], coords: Tuple[int, ...]) -> None:
        from mpi4py import MPI

        from . import _core

        self.shape, self.coords = shape, coords
        _maps.add(self)  # its transports' pools follow PYSHARD_RESULT_POOL_BYTES
        self.rank = comm.Get_rank()
        self.sim = sim_node_size()
        self._nodes: Dict[Tuple[int, ...], Optional[Any]] = {}
        slots = (1 << len(shape)) - 1
        global _attach_allowed
        if _attach_allowed is None and config.get("PYSHARD_CMA") and fail_setup != "cma":
            # before the Allgather below, after which node peers try to write into this rank
            _attach_allowed = _core.allow_peer_attach(YAMA_SCOPE)
            if _attach_allowed == 1:
                log.debug("pyshard: Yama's ptrace_scope is not 0: node peers may attach to "
                          "this rank (PR_SET_PTRACER_ANY) for cross-memory attach")
            elif _attach_allowed < 0:
                log.debug("pyshard: Yama's ptrace_scope is not 0 and PR_SET_PTRACER_ANY was "
                          "refused (%s)", os.strerror(-_attach_allowed))
        self.ctl = _core.NodeCtl(slots, fail_setup == "segment")
        mine = np.array(
            [_machine_key(), os.getpid(), os.cpu_count() or 0, int(self.ctl.ok), self.ctl.fd,
             MPI.COMM_WORLD.Get_rank()], dtype=np.int64,
        )  # fmt: skip
        self.info = collectives.allgather_rows(comm, mine)  # the one collective
        key = self.info[:, _KEY]
        peers = [r for r in range(len(key)) if key[r] == key[self.rank] and self.info[r, _OK]]
        here = [r for r in range(len(key)) if key[r] == key[self.rank]]
        global _threads_warned
        if not _threads_warned and here[0] == self.rank:  # the machine's first rank says it
            note = config.threads_note(len(here), int(self.info[self.rank, _CORES]))
            if note:
                _threads_warned = True
                log.warning(note)
        if self.ctl.ok:
            self.ctl.connect(
                self.rank, peers, [int(self.info[r, _PID]) for r in peers],
                [int(self.info[r, _FD]) for r in peers], fail_setup == "map",
                fail_setup == "cma",
            )  # fmt: skip

    def facts(self) -> Dict[str, List[int]]:
        """What the one Allgather gathered, by mesh rank: ``machine`` (its machine key: equal
        exactly for ranks that can share memory), ``pid``, ``cores``, ``shm`` (1 where it set
        up its control segment), ``world_rank`` (its rank in MPI_COMM_WORLD)."""
        columns = {"machine": _KEY, "pid": _PID, "cores": _CORES, "shm": _OK, "world_rank": _WORLD}
        return {name: [int(v) for v in self.info[:, c]] for name, c in columns.items()}

    def members(self, dims: Tuple[int, ...]) -> List[int]:
        """The mesh ranks of this rank's communicator over ``dims``, in its rank order."""
        ranges = [
            range(n) if d in dims else (c,) for d, (n, c) in enumerate(zip(self.shape, self.coords))
        ]
        return [int(np.ravel_multi_index(c, self.shape)) for c in itertools.product(*ranges)]

    def group(self, r: int) -> Tuple[int, int]:
        """The node of mesh rank ``r``: its machine, and its simulated node there."""
        return int(self.info[r, _KEY]), int(self.info[r, _WORLD]) // self.sim if self.sim else 0

    def transport(self, comm: Any, dims: Tuple[int, ...]) -> Optional[Any]:
        """The node transport of the communicator ``comm`` (a ``_core.Comm``) over ``dims``
        (made on first use, with no MPI call), or None where it cannot help."""
        if dims in self._nodes:
            return self._nodes[dims]
        from . import _core

        global _warned
        n = None
        members = self.members(dims)
        groups = [self.group(r) for r in members]
        nodes = len(set(groups))
        if not all(self.info[r, _OK] for r in members):
            if not _warned:
                _warned = True
                why = self.ctl.why or "another rank could not set up node-shared memory"
                log.warning("pyshard: node-shared memory is not usable (%s); exchanges use MPI",
                            why)  # fmt: skip
        elif nodes < len(members):  # some ranks share a node
            me = groups[members.index(self.rank)]
            local = [i for i, g in enumerate(groups) if g == me]
            on: Dict[int, List[int]] = {}  # ranks of the communicator per machine
            for r in members:
                on.setdefault(int(self.info[r, _KEY]), []).append(r)
            over = any(
                len(rs) > min(int(self.info[r, _CORES]) for r in rs) for rs in on.values()
            )
            mine = on[int(self.info[self.rank, _KEY])]
            n = _core.NodeShm(
                comm, self.ctl, sum(1 << d for d in dims) - 1, local,
                [members[i] for i in local], nodes, over,
                len(mine) <= int(self.info[self.rank, _CORES]),
            )  # fmt: skip
            if not n.usable:
                if not _warned:
                    _warned = True
                    log.warning("pyshard: node-shared memory is not usable (%s); exchanges "
                                "use MPI", n.why_not)  # fmt: skip
                n.release()
                n = None
            else:
                # freed results in node-shared memory kept for reuse up to the result pool's
                # bound (PYSHARD_RESULT_POOL_BYTES), as private results are: a result past
                # the core's default of 512 MiB otherwise faults in fresh shared pages on
                # every call (migrate of 10^7 rows of 64 B: 760 ms against 300 by messages)
                n.set_limit(config.get("PYSHARD_RESULT_POOL_BYTES"))
                log.debug("pyshard: node-shared memory on mesh dims %s: %d ranks on %d "
                          "node(s), cross-memory attach %s", dims, len(members), nodes,
                          "on" if n.cma else "refused")  # fmt: skip
                global _cma_noted
                if not n.cma and n.node_size > 1 and not _cma_noted:
                    _cma_noted = True
                    log.info("pyshard: this node refuses cross-memory attach (process_vm_writev:"
                             " ptrace's attach check, Yama's ptrace_scope or a seccomp profile);"
                             " results in private memory (out=, pyshard.jax) are copied over "
                             "from node-shared memory instead")  # fmt: skip
        self._nodes[dims] = n
        return n

    def release(self) -> None:
        for n in self._nodes.values():  # the pools and mappings (live results keep their
            if n is not None:  # own segments until they are freed)
                n.release()
        self._nodes.clear()
        self.ctl.release()


_maps: weakref.WeakSet[NodeMap] = weakref.WeakSet()


def _bound_pools(limit: int) -> None:
    """Every live node transport's pool of freed results kept up to ``limit`` bytes."""
    for m in list(_maps):
        for n in m._nodes.values():
            if n is not None:
                n.set_limit(limit)


config.apply_with("PYSHARD_RESULT_POOL_BYTES", _bound_pools)  # at every change


def node(mesh: Any, dims: Tuple[int, ...]) -> Optional[Any]:
    """The node-local transport of ``mesh``'s communicator over ``dims`` (from the node map
    the mesh made when it was built: no MPI call), or None where it cannot help: turned off,
    not usable (logged once), or no two ranks of the communicator share a node."""
    if not enabled():
        return None
    return mesh.node_transport(dims)


def set_warned(logged: bool) -> bool:
    """Set whether this process has logged the "not usable" warning (False: the next failure
    logs it again); returns what it was."""
    global _warned
    was, _warned = _warned, logged
    return was


def empty(n: Any, shape: Tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An uninitialised result in this rank's node-shared memory (back to the transport's
    pool when the array and its views are freed)."""
    from . import _core

    buf = _core.ShmBuffer(n, prod(shape) * dtype.itemsize)
    return np.frombuffer(buf, dtype=dtype).reshape(shape)
