"""The core's geometry of planned steps: the ``_core`` geometry objects built from a step's
block lists (:mod:`pyshard.blocks`), the one rule for what the executor binds, and the block
lists of the node-local transport, where a sender writes straight into the receiver's result.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from math import prod
from typing import Any, Optional, Sequence, Tuple

from . import _core, _dtypes
from .blocks import exchange_specs, member_specs, origin, relative
from .layout import Layout
from .planner import Coords, Step

__all__ = [
    "ALIAS_BYTES", "Pad", "Pads", "StoragePad", "alias_pad", "exchange_specs", "gather_push_specs",
    "geometry", "member_specs", "pad_at", "padded", "push_specs",
]  # fmt: skip


# (dim, elements): a local array's storage is that many elements longer along that dim; or None
Pad = Optional[Tuple[int, int]]

# A transform along a leading axis whose byte stride is a multiple of this runs 1.5-3x slower
# than on the same data with the next dim one element longer (measured, docs/fft.md): the
# lanes pocketfft reads at once alias in the caches and the TLB
ALIAS_BYTES = 4096


def padded(shape: Any, pad: Pad) -> list:
    """``shape`` as a list, longer as ``pad`` says (None: unchanged): the storage of a local
    array that is its view ``[..., :n, ...]``, so that the dims before the padded one step by
    no multiple of a page (an FFT pass along a leading axis runs there without the cache
    aliasing of such a stride, docs/fft.md)."""
    out = list(shape)
    if pad is not None:
        out[pad[0]] += pad[1]
    return out


def alias_pad(shape: Sequence[int], itemsize: int, axes: Sequence[int]) -> Pad:
    """Where a pass along ``axes`` of a C-contiguous ``shape`` array runs along a leading axis
    whose byte stride is a multiple of :data:`ALIAS_BYTES`: the padding of its storage that
    makes that axis step by no such multiple, ``(dim, elements)``: one element along the dim
    after the innermost such axis, or one 64-byte line where that dim is the last (rows stay
    aligned to a line, which the node copies' streaming stores need); else None."""
    nd = len(shape)
    for ax in sorted(axes, reverse=True):
        if ax < nd - 1:
            stride = itemsize * prod(shape[ax + 1:])
            if stride and stride % ALIAS_BYTES == 0:
                return (ax + 1, 1 if ax + 1 < nd - 1 else max(1, 64 // itemsize))
    return None


@dataclass(frozen=True)
class StoragePad:
    """The storage rule of one pass along ``axes`` of arrays laid out as ``layout``: at any
    mesh coords, :func:`alias_pad` of the local shape there (shards differ, so ranks may
    differ: a 129-long dim split 65/64 aliases on the 64 side only); a padded last dim only
    where ``last``. Every rank can say how any peer's storage is padded, as a sender writing
    into a peer's result must (:func:`push_specs`)."""

    layout: Layout
    axes: Tuple[int, ...]
    last: bool

    def of(self, coords: Coords) -> Pad:
        """The padding of the storage at mesh coords ``coords``."""
        return self._for(self.layout.local_shape(coords))

    def anywhere(self) -> bool:
        """Whether some rank pads: every distinct local shape checked (the shard table's
        distinct extents per dim; no loop over the ranks)."""
        ext = [sorted(set(t[1])) for t in self.layout.table]
        return any(self._for(shape) is not None for shape in itertools.product(*ext))

    def _for(self, shape: Sequence[int]) -> Pad:
        pad = alias_pad(shape, self.layout.dtype.itemsize, self.axes)
        if pad is None or (pad[0] == len(shape) - 1 and not self.last):
            return None
        return pad


# the rules of an exchange's source storage and result storage
Pads = Tuple[Optional[StoragePad], Optional[StoragePad]]


def pad_at(rule: Optional[StoragePad], coords: Coords) -> Pad:
    """``rule.of(coords)``, None where there is no rule."""
    return None if rule is None else rule.of(coords)


def push_specs(s: Step, coords: Coords,
               pad: Optional[StoragePad] = None) -> Tuple[list, list, list]:
    """The block lists of an alltoallv step at ``coords`` for the node-local transport, where
    a sender writes straight into the receiver's result: per block sent, ``(peer rank in the
    step's communicator, start in this rank's source, the peer's destination shape, start
    there, extent)``; the blocks received and this rank's own as :func:`exchange_specs`."""
    src_lo = origin(s.src, coords)
    pushes = []
    for peer, box in s.sends(coords):
        if peer != coords:
            start, ext = relative(box, src_lo)
            pstart = relative(box, origin(s.dst, peer))[0]
            pshape = padded(s.dst.local_shape(peer), pad_at(pad, peer))
            pushes.append((s.group_rank(peer), start, pshape, pstart, ext))
    pushes.sort(key=lambda t: t[0])
    _, recvs, local = exchange_specs(s, coords)
    return pushes, recvs, local


# Node peers write into a private result by cross-memory attach only where the kernel's
# pieces are long: the runs contiguous in both the sender's source and the result average at
# least ATTACH_MIN_RUN bytes, and the pieces contiguous in the result ATTACH_MIN_PIECE bytes
# (each piece of another process's memory is looked up and pinned, under a lock that the
# node peers writing into one rank share). Measured (scripts/cma_runs_ab.py: S0->S2 and
# S2->S0 of 3-D float32 arrays of 32 MiB a rank, against the copy from a segment): at 2
# ranks runs of 16 B took 5-17x the time, 512 B 1.2-1.3x, 2 KiB 0.9-1.1x, 8 KiB 0.6-0.7x;
# at 4 ranks (3 writers a receiver) S0->S2 in runs of 4 KiB, its result contiguous, 0.72-0.78x,
# and S2->S0 in pieces of 4 KiB 1.1-1.2x.
ATTACH_MIN_RUN = 2048
ATTACH_MIN_PIECE = 32768


def attach_runs(s: Step, coords: Coords, pads: Any = (None, None)) -> bool:
    """May the blocks other ranks send the rank at ``coords`` in exchange step ``s`` be
    written straight into a private result of its by cross-memory attach? Where they come in
    runs of at least :data:`ATTACH_MIN_RUN` bytes on average (contiguous on both sides), in
    pieces of its result of at least :data:`ATTACH_MIN_PIECE`. From the layouts alone (each
    sender's shard shape is known), no communication."""
    item = s.src.dtype.itemsize
    dshape = padded(s.dst.local_shape(coords), pad_at(pads[1], coords))
    dst_lo = origin(s.dst, coords)
    total = runs = pieces = 0
    for peer, box in s.recvs(coords):
        if tuple(peer) == tuple(coords):
            continue
        sshape = padded(s.src.local_shape(peer), pad_at(pads[0], peer))
        _, ext = relative(box, dst_lo)
        n = prod(ext)
        if n == 0:
            continue
        run = piece = 1
        both = True
        for d in range(len(ext) - 1, -1, -1):  # trailing dims whole on one or both sides merge
            if both:
                run *= ext[d]
            piece *= ext[d]
            both = both and ext[d] == sshape[d] and ext[d] == dshape[d]
            if ext[d] != dshape[d]:
                break
        total += n
        runs += n // run
        pieces += n // piece
    b = total * item
    return runs > 0 and b >= ATTACH_MIN_RUN * runs and b >= ATTACH_MIN_PIECE * pieces


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


def geometry(s: Step, coords: Coords, algorithm: Any = None, pad: int = 0,
             pads: Pads = (None, None)) -> Any:
    """The core's geometry of collective step ``s`` at ``coords`` (None for the others): the
    one rule for its block lists and workspace, which the executor binds; its
    ``workspace_bytes`` is what :func:`pyshard.blocks.workspace_bytes` reports for the
    default algorithm. ``pad``: the bytes ``MPI_Alltoall`` pads each block to; ``pads``: the
    rules the source's and the result's storage are :func:`padded` by (an exchange)."""
    n = prod(s.group_shape)
    item = s.src.dtype.itemsize
    sshape = padded(s.src.local_shape(coords), pad_at(pads[0], coords))
    dshape = padded(s.dst.local_shape(coords), pad_at(pads[1], coords))
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
