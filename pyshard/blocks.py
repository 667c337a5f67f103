"""The blocks of a planned step in local-array coordinates, and the pack/unpack workspace the
core's geometry gives them: pure Python, no MPI, no core, no settings.

A step (:class:`pyshard.planner.Step`) knows its blocks as global boxes; the core copies them
between local arrays and a packed workspace. :func:`exchange_specs` and :func:`member_specs`
turn the boxes into the block lists the core's geometries are built from
(:func:`pyshard.geometry.geometry`), and :func:`workspace_bytes` is the workspace those
geometries report (``workspace_bytes`` of ``_core.ExchangeGeometry`` with the default
``alltoallv`` algorithm, ``_core.GatherGeometry``, ``_core.ScatterGeometry``), computed here
from the same lists with the core's rules (cpp/geometry.h ``align_up``, ``misaligned``,
``box_contiguous``), so that :meth:`pyshard.Plan.peak_extra_bytes` needs no core.
``tests/test_plan.py`` checks the two agree on steps of every kind.

This module imports nothing of pyshard but ``_dtypes``: a step is any object with the
:class:`~pyshard.planner.Step` interface (``kind``, ``src``, ``dst``, ``sends``, ``recvs``,
``group_rank``, ``group_shape``, ``member``).
"""

from __future__ import annotations

from math import prod
from typing import Any, List, Sequence, Tuple

from . import _dtypes

__all__ = ["ALIGN", "MISALIGNED_MIN_BYTES", "align_up", "box_offset", "exchange_specs",
           "member_specs", "origin", "relative", "workspace_bytes"]

Coords = Tuple[int, ...]
Spec = Tuple[int, List[int], List[int]]  # (peer, start, extent)

ALIGN = 4096  # packed blocks start page-aligned in the workspace
# a contiguous block of this size or more at an offset that is not a multiple of 64 bytes is
# staged through the aligned workspace (the core's ``misaligned``)
MISALIGNED_MIN_BYTES = 1 << 20


def align_up(v: int) -> int:
    """``v`` rounded up to a multiple of :data:`ALIGN`."""
    return -(-v // ALIGN) * ALIGN


def box_offset(shape: Sequence[int], start: Sequence[int], ext: Sequence[int],
               item: int) -> Tuple[int, bool]:
    """(byte offset of ``start`` in a C-contiguous array of ``shape``, whether the box
    ``start``/``ext`` is one contiguous run of it): an empty box is contiguous; else every
    dim after the first (from the outside) whose extent exceeds 1 must be whole."""
    off, stride = 0, item
    for k in range(len(shape) - 1, -1, -1):
        off += start[k] * stride
        stride *= shape[k]
    if prod(ext) == 0:
        return off, True
    k = 0
    while k < len(shape) and ext[k] == 1:
        k += 1
    return off, all(ext[j] == shape[j] for j in range(k + 1, len(shape)))


def origin(layout: Any, coords: Sequence[int]) -> List[int]:
    """The global start of the box ``layout`` gives the rank at ``coords``."""
    return [layout.interval(d, coords)[0] for d in range(layout.ndim)]


def relative(box: Sequence[Tuple[int, int]], lo: Sequence[int]) -> Tuple[List[int], List[int]]:
    """(start relative to ``lo``, extent) of a global box."""
    return [a - o for (a, _), o in zip(box, lo)], [b - a for a, b in box]


def exchange_specs(s: Any, coords: Coords) -> Tuple[List[Spec], List[Spec], list]:
    """The block lists of an alltoallv step at ``coords``, in local-array coordinates:
    sends and recvs as ``(peer rank in the step's communicator, start, extent)`` sorted by
    peer, and this rank's own blocks as ``(src start, dst start, extent)``."""
    src_lo, dst_lo = origin(s.src, coords), origin(s.dst, coords)
    sends, recvs, local = [], [], []
    for peer, box in s.sends(coords):
        start, ext = relative(box, src_lo)
        if peer == coords:
            local.append((start, relative(box, dst_lo)[0], ext))
        else:
            sends.append((s.group_rank(peer), start, ext))
    for peer, box in s.recvs(coords):
        if peer != coords:
            recvs.append((s.group_rank(peer), *relative(box, dst_lo)))
    sends.sort(key=lambda t: t[0])
    recvs.sort(key=lambda t: t[0])
    return sends, recvs, local


def member_specs(s: Any, coords: Coords, of: Any, rel: Any) -> list:
    """Per member of the step's group (communicator rank order), the box that ``of`` gives
    it, relative to this rank's box in ``rel``: where an Allgatherv lands each member's
    shard, or which piece of the source a Reduce_scatter gives each member."""
    lo = origin(rel, coords)
    return [
        relative([of.interval(d, s.member(coords, g)) for d in range(of.ndim)], lo)
        for g in range(prod(s.group_shape))
    ]


def _packed(blocks: Sequence[Spec], shape: Sequence[int], item: int) -> int:
    """The packed workspace of one side of an Alltoallv exchange: every block 4 KiB-aligned
    one after another, needed when some block is not contiguous in the array or is large and
    misaligned (else MPI reads and writes the array itself)."""
    off, needed = 0, False
    for _, start, ext in blocks:
        nbytes = prod(ext) * item
        at, contiguous = box_offset(shape, start, ext, item)
        if not contiguous or (nbytes >= MISALIGNED_MIN_BYTES and at % 64 != 0):
            needed = True
        off = align_up(off + nbytes)
    return off if needed else 0


def _gathered(boxes: Sequence[Tuple[List[int], List[int]]], shape: Sequence[int],
              item: int) -> int:
    """The unpack workspace of an Allgatherv landing every member's box in an array of
    ``shape``: the boxes back to back, needed when one is not contiguous in the array, or,
    where every box has one size (``MPI_Allgather`` lands box p at p times that size), when
    one does not sit there."""
    total, needed, misplaced, sizes = 0, False, False, set()
    for start, ext in boxes:
        nbytes = prod(ext) * item
        at, contiguous = box_offset(shape, start, ext, item)
        needed = needed or not contiguous
        misplaced = misplaced or (nbytes > 0 and at != total)
        sizes.add(nbytes)
        total += nbytes
    return total if needed or (misplaced and len(sizes) == 1) else 0


def _scattered(boxes: Sequence[Tuple[List[int], List[int]]], shape: Sequence[int],
               item: int) -> int:
    """The pack workspace of a Reduce_scatter of an array of ``shape`` into every member's
    piece: the pieces back to back, needed unless each one is contiguous and already sits
    where packing would put it."""
    total, needed = 0, False
    for start, ext in boxes:
        at, contiguous = box_offset(shape, start, ext, item)
        needed = needed or not contiguous or at != total
        total += prod(ext) * item
    return total if needed else 0


def workspace_bytes(s: Any, coords: Coords) -> int:
    """Pack/unpack workspace bytes of collective step ``s`` at ``coords``, as the core's
    geometry of it reports them (0 for an allreduce and the steps that communicate
    nothing)."""
    item = s.src.dtype.itemsize
    sshape, dshape = s.src.local_shape(coords), s.dst.local_shape(coords)
    if s.kind == "alltoallv":
        sends, recvs, _ = exchange_specs(s, coords)
        return _packed(sends, sshape, item) + _packed(recvs, dshape, item)
    if s.kind == "allgatherv":
        return _gathered(member_specs(s, coords, s.src, s.dst), dshape, item)
    if s.kind == "reduce_scatter":
        item = _dtypes.accumulator(s.src.dtype).itemsize
        return _scattered(member_specs(s, coords, s.dst, s.src), sshape, item)
    return 0
