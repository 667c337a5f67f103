"""The core's geometry of planned steps: block lists in local-array coordinates and the
``_core`` geometry objects built from them, the one rule for what the executor binds and for
the workspace ``Plan.explain()`` reports. The executor side of the planner: ``pyshard.plan``
stays pure layout algebra and gets the core's rules from here (:func:`pyshard.plan.set_core_rules`,
called at import).
"""

from __future__ import annotations

from math import prod
from typing import Any, List, Optional, Sequence, Tuple

from . import _backend, _core, _dtypes
from .layout import Layout
from .plan import Coords, Step, set_core_rules
from .route import describe, route

__all__ = ["exchange_specs", "gather_push_specs", "geometry", "member_specs", "push_specs",
           "workspace"]


def _lo(layout: Layout, coords: Sequence[int]) -> List[int]:
    return [layout.interval(d, coords)[0] for d in range(layout.ndim)]


def _rel(box: Sequence[Tuple[int, int]], lo: Sequence[int]) -> Tuple[List[int], List[int]]:
    """(start relative to ``lo``, extent) of a global box."""
    return [a - o for (a, _), o in zip(box, lo)], [b - a for a, b in box]


def exchange_specs(s: Step, coords: Coords) -> Tuple[list, list, list]:
    """The block lists of an alltoallv step at ``coords``, in local-array coordinates:
    sends and recvs as ``(peer rank in the step's communicator, start, extent)`` sorted by
    peer, and this rank's own blocks as ``(src start, dst start, extent)``."""
    src_lo, dst_lo = _lo(s.src, coords), _lo(s.dst, coords)
    sends, recvs, local = [], [], []
    for peer, box in s.sends(coords):
        start, ext = _rel(box, src_lo)
        if peer == coords:
            local.append((start, _rel(box, dst_lo)[0], ext))
        else:
            sends.append((s.group_rank(peer), start, ext))
    for peer, box in s.recvs(coords):
        if peer != coords:
            recvs.append((s.group_rank(peer), *_rel(box, dst_lo)))
    sends.sort(key=lambda t: t[0])
    recvs.sort(key=lambda t: t[0])
    return sends, recvs, local


def push_specs(s: Step, coords: Coords) -> Tuple[list, list, list]:
    """The block lists of an alltoallv step at ``coords`` for the node-local transport, where
    a sender writes straight into the receiver's result: per block sent, ``(peer rank in the
    step's communicator, start in this rank's source, the peer's destination shape, start
    there, extent)``; the blocks received and this rank's own as :func:`exchange_specs`."""
    src_lo = _lo(s.src, coords)
    pushes = []
    for peer, box in s.sends(coords):
        if peer != coords:
            start, ext = _rel(box, src_lo)
            pstart = _rel(box, _lo(s.dst, peer))[0]
            pushes.append((s.group_rank(peer), start, list(s.dst.local_shape(peer)), pstart, ext))
    pushes.sort(key=lambda t: t[0])
    _, recvs, local = exchange_specs(s, coords)
    return pushes, recvs, local


def gather_push_specs(s: Step, coords: Coords) -> Tuple[list, list, list]:
    """:func:`push_specs` of an allgatherv step: this rank's whole shard goes to every other
    member of the group, at the same place in each one's result (the results are replicated
    over the group, so every member's has the same shape); each member's shard is received."""
    boxes = member_specs(s, coords, s.src, s.dst)
    me = s.group_rank(coords)
    start, ext = boxes[me]
    dshape = list(s.dst.local_shape(coords))
    zero = [0] * len(ext)
    pushes = [(g, zero, dshape, start, ext) for g in range(len(boxes)) if g != me]
    recvs = [(g, *boxes[g]) for g in range(len(boxes)) if g != me]
    return pushes, recvs, [(zero, start, ext)]


def member_specs(s: Step, coords: Coords, of: Layout, rel: Layout) -> list:
    """Per member of the step's group (communicator rank order), the box that ``of`` gives
    it, relative to this rank's box in ``rel``: where an Allgatherv lands each member's
    shard, or which piece of the source a Reduce_scatter gives each member."""
    lo = _lo(rel, coords)
    return [
        _rel([of.interval(d, s.member(coords, g)) for d in range(of.ndim)], lo)
        for g in range(prod(s.group_shape))
    ]


def geometry(s: Step, coords: Coords, algorithm: Any = None, pad: int = 0) -> Any:
    """The core's geometry of collective step ``s`` at ``coords`` (None for the others): the
    one rule for its block lists and workspace, shared by the executor and ``explain()``."""
    n = prod(s.group_shape)
    item = s.src.dtype.itemsize
    sshape, dshape = list(s.src.local_shape(coords)), list(s.dst.local_shape(coords))
    if s.kind == "alltoallv":
        algo = _core.Algorithm.alltoallv if algorithm is None else algorithm
        sends, recvs, local = exchange_specs(s, coords)
        if algo == _core.Algorithm.alltoall:  # MPI moves this rank's own block too
            me = s.group_rank(coords)
            sends = sorted(sends + [(me, a, e) for a, _, e in local])
            recvs = sorted(recvs + [(me, b, e) for _, b, e in local])
            local = []
        return _core.ExchangeGeometry(n, item, sshape, dshape, sends, recvs, local, algo, pad)
    if s.kind == "allgatherv":
        recvs = member_specs(s, coords, s.src, s.dst)
        return _core.GatherGeometry(n, s.group_rank(coords), item, sshape, dshape, recvs)
    if s.kind == "reduce_scatter":
        pieces = member_specs(s, coords, s.dst, s.src)
        item = _dtypes.accumulator(s.src.dtype).itemsize
        return _core.ScatterGeometry(n, s.group_rank(coords), item, sshape, dshape, pieces)
    return None


def workspace(s: Step, coords: Coords) -> int:
    """Pack/unpack workspace bytes of the core at ``coords`` (the core's own rule)."""
    g = geometry(s, coords)
    return 0 if g is None else int(g.workspace_bytes)


def route_note(s: Step, mesh: Any) -> Optional[str]:
    """``explain()``'s line on where step ``s`` goes for host arrays with algorithm auto:
    the path :func:`pyshard.route.route` takes on ``mesh``, or the rule in words."""
    if mesh is not None:
        r = route(s, mesh, "auto")
        how = r.path + (f" ({r.algorithm})" if r.algorithm not in ("", r.path) else "")
        if r.path == "shm" and r.node is not None and r.node.nodes > 1:  # the mixed path
            n, k = prod(s.group_shape), r.node.node_size
            how += (
                f"; node-shared memory among the {k} ranks of this rank's node, MPI to the "
                f"other {n - k} on {r.node.nodes - 1} other node(s)"
            )
        if r.why:
            how += f"; {r.why}"
        return f"host arrays, algorithm auto, on this mesh: {how}"
    how = describe(s)
    return None if how is None else f"host arrays, algorithm auto: {how}"


def device_note() -> str:
    """``explain(device="cuda")``'s line: how GPU arrays reach MPI."""
    t = _backend.transports()["cuda"]
    aware = {True: "CUDA-aware", False: "not CUDA-aware", None: "CUDA-awareness unknown"}[
        _backend.cuda_aware()
    ]
    if t == "direct":
        return f"GPU arrays: pack kernel, then MPI on device memory (MPI {aware})"
    return (
        f"GPU arrays: pack kernel, copy to pinned host buffers, MPI on host memory, copy back, "
        f"unpack kernel (staged; MPI {aware})"
    )



set_core_rules(workspace, route_note, device_note)
