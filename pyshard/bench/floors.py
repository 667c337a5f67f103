"""Communication floors and hand-written baselines of one plan step, on the host.

- floor: the same exchange as one raw MPI collective (mpi4py) on pre-packed contiguous
  buffers of exactly the same per-peer byte counts (self block included, as MPI does it),
  and the regular collective on blocks padded to the largest; the fastest is the floor;
- baseline: what an expert writes by hand with mpi4py: numpy slicing to pack (skipped
  where every block is already contiguous), the raw collective, numpy slicing to unpack
  (skipped where the receive can land in the output directly).

The block helpers (a step's send and receive blocks as slices, contiguity, offsets) serve
the GPU bench's cupy baseline too.
"""

from __future__ import annotations

from math import prod
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np
from mpi4py import MPI

from .. import collectives
from ..layout import Layout
from ..mesh import Mesh
from ..planner import Step


def exchange_blocks(step: Step, coords: tuple) -> Tuple[list, list]:
    """This rank's (peer group rank, local slices) send and receive blocks, self included."""
    src_lo = [step.src.interval(d, coords)[0] for d in range(step.src.ndim)]
    dst_lo = [step.dst.interval(d, coords)[0] for d in range(step.dst.ndim)]
    sends = sorted(
        (step.group_rank(r), tuple(slice(a - o, b - o) for (a, b), o in zip(box, src_lo)))
        for r, box in step.sends(coords)
    )
    recvs = sorted(
        (step.group_rank(r), tuple(slice(a - o, b - o) for (a, b), o in zip(box, dst_lo)))
        for r, box in step.recvs(coords)
    )
    return sends, recvs


def member_box(step: Step, coords: tuple, g: int, of: Layout, rel: Layout) -> tuple:
    """Member ``g``'s box in layout ``of``, as slices relative to this rank's box in ``rel``."""
    m = step.member(coords, g)
    return tuple(
        slice(of.interval(d, m)[0] - rel.interval(d, coords)[0],
              of.interval(d, m)[1] - rel.interval(d, coords)[0])
        for d in range(of.ndim)
    )  # fmt: skip


def aligned_displs(counts: Sequence[int], align: int = 64) -> List[int]:
    """Displacements of blocks of ``counts`` bytes packed one after another, each starting
    ``align``-byte aligned."""
    out, off = [], 0
    for c in counts:
        out.append(off)
        off = (off + c + align - 1) // align * align
    return out


def is_contiguous(shape: Sequence[int], sl: Tuple[slice, ...]) -> bool:
    """Is the box ``sl`` one contiguous run of a C-contiguous array of ``shape``? (the rule
    the core uses to skip a pack or unpack)"""
    ext = [s.stop - s.start for s in sl]
    if prod(ext) == 0:
        return True
    k = 0
    while k < len(ext) and ext[k] == 1:
        k += 1
    return all(ext[j] == shape[j] for j in range(k + 1, len(ext)))


def flat_offset(shape: Sequence[int], sl: Tuple[slice, ...]) -> int:
    """The element offset of box ``sl``'s first element in a C-contiguous array of ``shape``."""
    off, stride = 0, 1
    for s, n in zip(reversed(sl), reversed(shape)):
        off += s.start * stride
        stride *= n
    return off


class HostReference:
    """Floors and baseline of one plan step on numpy arrays, bound to this rank's buffers.

    ``floors``: raw MPI collectives (by MPI name) moving the step's bytes from pre-packed
    buffers; ``baseline()``: the step written by hand with numpy and mpi4py.
    """

    def __init__(self, step: Step, mesh: Mesh, local: np.ndarray) -> None:
        self.step = step
        self.comm = mesh.sub_dims(step.mesh_dims) if step.mesh_dims else mesh.comm
        coords = mesh.coords
        self.local = local
        self.out_shape = step.dst.local_shape(coords)
        self.dtype = local.dtype
        self.out = np.empty(self.out_shape, self.dtype)  # preallocated, as for pyshard
        item = local.dtype.itemsize
        n = self.comm.Get_size()
        k = step.kind
        self.kind = k
        if k == "alltoallv":
            self.sends, self.recvs = exchange_blocks(step, coords)
            sc, rc = [0] * n, [0] * n
            for g, sl in self.sends:
                sc[g] = prod(s.stop - s.start for s in sl) * item
            for g, sl in self.recvs:
                rc[g] = prod(s.stop - s.start for s in sl) * item
            self.sc, self.rc = sc, rc
            # pre-packed blocks start 64-byte aligned (MPICH is slower on misaligned ones)
            self.sd = aligned_displs(sc)
            self.rd = aligned_displs(rc)
            self.sbuf = np.zeros(self.sd[-1] + sc[-1], np.uint8)
            self.rbuf = np.zeros(self.rd[-1] + rc[-1], np.uint8)
            self.send_direct = all(is_contiguous(local.shape, sl) for _, sl in self.sends)
            self.recv_direct = all(is_contiguous(self.out_shape, sl) for _, sl in self.recvs)
        elif k == "allgatherv":
            self.counts = [
                prod(step.src.local_shape(step.member(coords, g))) * item for g in range(n)
            ]
            self.displs = list(np.concatenate(([0], np.cumsum(self.counts)[:-1])).astype(int))
            self.sbuf = np.zeros(self.counts[self.comm.Get_rank()], np.uint8)
            self.rbuf = np.zeros(sum(self.counts), np.uint8)
            # member g's source box, relative to this rank's target box
            self.blocks = [member_box(step, coords, g, step.src, step.dst) for g in range(n)]
        elif k == "reduce_scatter":
            # member g's target box, relative to this rank's source box
            self.pieces = [member_box(step, coords, g, step.dst, step.src) for g in range(n)]
            self.counts = [prod(s.stop - s.start for s in sl) for sl in self.pieces]
            self.sbuf = np.zeros(sum(self.counts), local.dtype)
            self.rbuf = np.zeros(self.counts[self.comm.Get_rank()], local.dtype)
        elif k in ("local_copy", "make_partial", "relabel"):
            # no communication (one rank): the floor is a memcpy of the output's bytes
            self.sbuf = np.zeros(prod(self.out_shape) * item, np.uint8)
            self.rbuf = np.zeros_like(self.sbuf)
            src_lo = [step.src.interval(d, coords)[0] for d in range(step.src.ndim)]
            self.sl = tuple(
                slice(a - o, b - o)
                for (a, b), o in zip(
                    (step.dst.interval(d, coords) for d in range(step.dst.ndim)), src_lo
                )
            )
        else:
            raise ValueError(f"no reference for a {k} step")
        self.floors = self._floors()

    def _floors(self) -> Dict[str, Any]:
        """Raw collectives that move the step's bytes from pre-packed buffers, by MPI name:
        the v-variant with the step's own counts, and the regular collective on blocks
        padded to the largest (the same bytes where the blocks are equal)."""
        c, n = self.comm, self.comm.Get_size()
        if self.kind in ("local_copy", "make_partial", "relabel"):
            return {"memcpy": lambda: np.copyto(self.rbuf, self.sbuf)}
        if self.kind == "alltoallv":
            pad = collectives.max_all(c, max(self.sc + self.rc))
            sb, rb = np.zeros(n * pad, np.uint8), np.zeros(n * pad, np.uint8)
            return {
                "Alltoallv": lambda: c.Alltoallv(
                    [self.sbuf, (self.sc, self.sd), MPI.BYTE],
                    [self.rbuf, (self.rc, self.rd), MPI.BYTE],
                ),
                "Alltoall": lambda: c.Alltoall([sb, MPI.BYTE], [rb, MPI.BYTE]),
            }
        if self.kind == "allgatherv":
            pad = collectives.max_all(c, max(self.counts))
            sb, rb = np.zeros(pad, np.uint8), np.zeros(n * pad, np.uint8)
            return {
                "Allgatherv": lambda: c.Allgatherv(
                    [self.sbuf, MPI.BYTE], [self.rbuf, (self.counts, self.displs), MPI.BYTE]
                ),
                "Allgather": lambda: c.Allgather([sb, MPI.BYTE], [rb, MPI.BYTE]),
            }
        pad = collectives.max_all(c, max(self.counts))
        sb, rb = np.zeros(n * pad, self.dtype), np.zeros(pad, self.dtype)
        return {
            "Reduce_scatter": lambda: c.Reduce_scatter(
                self.sbuf, self.rbuf, self.counts, op=MPI.SUM
            ),
            "Reduce_scatter_block": lambda: c.Reduce_scatter_block(sb, rb, op=MPI.SUM),
        }

    def baseline(self) -> np.ndarray:
        c, local = self.comm, self.local
        out = self.out
        if self.kind in ("local_copy", "make_partial", "relabel"):
            out[...] = local[self.sl]
        elif self.kind == "alltoallv":
            item = self.dtype.itemsize
            if self.send_direct:
                sbuf = local.reshape(-1).view(np.uint8)
                sd = [flat_offset(local.shape, sl) * item for _, sl in self.sends]
                scount, sdisp = [0] * c.Get_size(), [0] * c.Get_size()
                for (g, _), d in zip(self.sends, sd):
                    scount[g], sdisp[g] = self.sc[g], d
            else:
                sbuf = self.sbuf
                for g, sl in self.sends:
                    a = self.sd[g]
                    # a block one column wide reshapes to a strided view, which has no byte view
                    sbuf[a : a + self.sc[g]] = np.ascontiguousarray(local[sl]).reshape(-1).view(
                        np.uint8
                    )
                scount, sdisp = self.sc, self.sd
            if self.recv_direct:
                rbuf = out.reshape(-1).view(np.uint8)
                rcount, rdisp = [0] * c.Get_size(), [0] * c.Get_size()
                for g, sl in self.recvs:
                    rcount[g], rdisp[g] = self.rc[g], flat_offset(self.out_shape, sl) * item
            else:
                rbuf, rcount, rdisp = self.rbuf, self.rc, self.rd
            c.Alltoallv([sbuf, (scount, sdisp), MPI.BYTE], [rbuf, (rcount, rdisp), MPI.BYTE])
            if not self.recv_direct:
                flat = rbuf.view(self.dtype)
                for g, sl in self.recvs:
                    a = self.rd[g] // item
                    shp = tuple(s.stop - s.start for s in sl)
                    out[sl] = flat[a : a + prod(shp)].reshape(shp)
        elif self.kind == "allgatherv":
            c.Allgatherv(
                [local.reshape(-1).view(np.uint8), MPI.BYTE],
                [self.rbuf, (self.counts, self.displs), MPI.BYTE],
            )
            flat = self.rbuf.view(self.dtype)
            item = self.dtype.itemsize
            for sl, d in zip(self.blocks, self.displs):
                shp = tuple(s.stop - s.start for s in sl)
                out[sl] = flat[d // item : d // item + prod(shp)].reshape(shp)
        else:
            sbuf = np.concatenate([local[sl].reshape(-1) for sl in self.pieces])
            c.Reduce_scatter(sbuf, out.reshape(-1), self.counts, op=MPI.SUM)
        return out
