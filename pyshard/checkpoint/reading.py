"""One rank's part of an array stored whole in C order, read from its file: by one MPI-IO
collective read of every rank's box (:func:`read_array`), as a contiguous row block with
independent I/O (:func:`read_rows`), or copied out of a read-only mapping (:func:`read_box`);
an array never written (:func:`filled`); and the agreement of the ranks' read verdicts
(:func:`agreed`), so that no rank goes on into a collective another has left."""

from __future__ import annotations

import logging
import mmap
import os
from math import prod
from typing import Any, Callable, Optional, Sequence

import numpy as np
from mpi4py import MPI

from .. import _backend as bk
from .. import _dtypes, collectives
from ..array import ShardedArray, zeroed
from ..layout import Layout
from ..mesh import Mesh
from .mpiio import box_bounds, collective_io, read_hints

__all__ = ["NoMapping", "agreed", "filled", "read_array", "read_box", "read_rows"]

log = logging.getLogger("pyshard")


def read_array(
    mesh: Mesh, fname: str, offset: int, lay: Layout, device: Optional[str] = None
) -> ShardedArray:
    """Read this rank's shard of ``lay`` from a .npy file; collective over ``mesh``. With
    ``device="cuda"`` the shard is read into host memory, then copied to the GPU."""
    start, ext = box_bounds(lay, mesh.coords)
    local = np.empty(tuple(ext), dtype=lay.dtype)
    zero = zeroed(lay, mesh.coords)
    box = (start, ext, not zero and local.size > 0)
    hints = read_hints(lay)
    try:
        collective_io(mesh.comm, fname, lay, offset, box, local, write=False, hints=hints)
    finally:
        if hints != MPI.INFO_NULL:
            hints.Free()
    if zero:
        local[...] = _dtypes.sum_zero(local.dtype)
    if device == "cuda":
        local = bk.cupy().asarray(local)
    return ShardedArray(local, lay, mesh)


def read_rows(fname: str, offset: int, lay: Layout, coords: Sequence[int]) -> np.ndarray:
    """This rank's row block of ``lay`` (rows split over every mesh dim, ``Shard(0)``): one
    contiguous read with independent MPI-IO (no collective open or read per array)."""
    local = np.empty(lay.local_shape(coords), dtype=lay.dtype)
    if local.size:
        start = lay.box(coords)[0].start
        row = lay.dtype.itemsize * prod(lay.shape[1:])
        data = local.reshape(-1).view(np.uint8)  # bytes: ml_dtypes export no buffer
        fh = MPI.File.Open(MPI.COMM_SELF, fname, MPI.MODE_RDONLY)
        try:
            st = MPI.Status()
            fh.Read_at(offset + start * row, [data, MPI.BYTE], st)
            got = st.Get_count(MPI.BYTE)
        finally:
            fh.Close()
        if got != data.size:
            raise ValueError(f"load: {fname!r}: read {got} of {data.size} bytes at row {start}")
    return local


class NoMapping(OSError):
    """The file cannot be mapped here (a file system without mmap): read it another way."""


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _raised_here(e: BaseException) -> bool:
    """Was ``e`` raised by pyshard's own code (its last frame in this package)?"""
    tb = e.__traceback__
    if tb is None:
        return True
    while tb.tb_next is not None:
        tb = tb.tb_next
    return os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(_PACKAGE)


def agreed(comm: MPI.Comm, prefix: str, read: Callable[[], Any]) -> Any:
    """``read()`` on every rank, the verdicts agreed with one allgather, so that no rank goes
    on into a collective that another has left: every rank raises the first failing rank's
    error as the same ValueError (``prefix: error`` for errors other than pyshard's own
    ValueErrors); where some rank's file system cannot map the file (:class:`NoMapping`) and
    no rank failed, every rank gets None (the caller reads it another way). Else this rank's
    value."""
    value, bad = None, None
    try:
        value = read()
    except NoMapping as e:
        bad = ("unmapped", f"{prefix}: {e}")
    except Exception as e:  # a verdict from every rank, whatever happened
        if not isinstance(e, ValueError):
            bad = ("error", f"{prefix}: {e!r}")
        else:  # pyshard's own say what and where; another package's (zarr's) get the prefix
            bad = ("error", str(e) if _raised_here(e) else f"{prefix}: {e}")
    verdicts = [v for v in collectives.allgather(comm, bad) if v is not None]
    errors = [m for k, m in verdicts if k == "error"]
    if errors:
        raise ValueError(errors[0])
    if verdicts:
        log.info("pyshard: %s; reading it without a mapping", verdicts[0][1])
        return None
    return value


def read_box(fname: str, offset: int, lay: Layout, coords: Sequence[int]) -> np.ndarray:
    """This rank's box of ``lay``'s array, stored whole in C order at ``offset`` of
    ``fname``: copied out of a read-only mapping of the file, so each rank passes once over
    its own bytes (out of the page cache) and over no one else's."""
    local = np.empty(lay.local_shape(coords), dtype=lay.dtype)
    if not local.size:
        return local
    item = lay.dtype.itemsize
    end = offset + item * prod(lay.shape)
    start = offset - offset % mmap.ALLOCATIONGRANULARITY
    with open(fname, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < end:  # checked on rank 0 before; the file changed since
            raise ValueError(f"load: {fname!r}: {size} bytes, the array ends at byte {end}")
        try:
            m = mmap.mmap(f.fileno(), end - start, access=mmap.ACCESS_READ, offset=start)
        except OSError as e:  # (ENODEV: a file system that cannot map files)
            raise NoMapping(str(e)) from e
        with m:
            # bytes (a trailing dim of itemsize): ml_dtypes' types export no buffer
            whole = np.frombuffer(m, np.uint8, end - offset, offset - start)
            dst = local.reshape(-1).view(np.uint8).reshape(*local.shape, item)
            try:
                np.copyto(dst, whole.reshape(*lay.shape, item)[lay.box(coords)])
            finally:
                del whole  # no view of the mapping is left when it closes
    return local


def filled(mesh: Mesh, lay: Layout, fill: bytes, device: Optional[str]) -> ShardedArray:
    """This rank's shard of an array never written: every element is the bytes ``fill``."""
    local = np.empty(lay.local_shape(mesh.coords), dtype=lay.dtype)
    if local.size and not zeroed(lay, mesh.coords):
        local.reshape(-1).view(np.uint8).reshape(-1, lay.dtype.itemsize)[:] = np.frombuffer(
            fill, np.uint8
        )
    else:
        local[...] = _dtypes.sum_zero(local.dtype)
    if device == "cuda":
        local = bk.cupy().asarray(local)
    return ShardedArray(local, lay, mesh)
