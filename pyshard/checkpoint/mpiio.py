"""One rank's box of a ``.npy`` file written or read with MPI-IO: a subarray file view
after the header, and one collective ``Write_all`` or ``Read_all`` of every rank's box."""

from __future__ import annotations

from math import prod
from typing import List, Optional, Sequence, Tuple

import numpy as np
from mpi4py import MPI

from ..layout import Layout, Partial, Replicate

Box = Tuple[List[int], List[int], bool]
"""(starts, extents, active) of one rank's part in a collective write or read; an inactive
rank takes part with an empty view."""


def box_bounds(layout: Layout, coords: Sequence[int]) -> Tuple[List[int], List[int]]:
    """(starts, extents) of the box ``layout`` holds at mesh ``coords``."""
    b = layout.box(coords)
    return [s.start for s in b], [s.stop - s.start for s in b]


def read_hints(layout: Layout) -> MPI.Info:
    """MPI-IO hints for reading into ``layout`` (free them unless ``MPI.INFO_NULL``).

    Where several ranks read the same box (a Replicate mesh dim, or Partial other than sum,
    of size > 1), ROMIO's collective buffering would read once and ship every copy through
    its aggregators; independent reads under the collective call are several times faster
    (measured in docs/checkpoints.md). Other MPI libraries ignore the hint.
    """
    overlap = any(
        n > 1 and (isinstance(p, Replicate) or (isinstance(p, Partial) and p.op != "sum"))
        for n, p in zip(layout.mesh_shape, layout.placements)
    )
    if not overlap:
        return MPI.INFO_NULL
    info = MPI.Info.Create()
    info.Set("romio_cb_read", "disable")
    return info


class _View:
    """An etype of ``itemsize`` bytes and a subarray filetype for one box (freed by free)."""

    def __init__(
        self, itemsize: int, shape: Sequence[int], start: Sequence[int], ext: Sequence[int]
    ) -> None:
        self.etype = MPI.BYTE.Create_contiguous(itemsize).Commit()
        self.count = prod(ext)
        if len(shape) == 0 or self.count == 0:
            # 0-d arrays and empty boxes: a trivial view (subarray types refuse zero subsizes)
            self.filetype = self.etype
            self.own = False
        else:
            self.filetype = self.etype.Create_subarray(
                list(shape), list(ext), list(start), order=MPI.ORDER_C
            ).Commit()
            self.own = True

    def free(self) -> None:
        if self.own:
            self.filetype.Free()
        self.etype.Free()


def collective_io(
    comm: MPI.Comm,
    fname: str,
    lay: Layout,
    disp: int,
    box: Box,
    buf: np.ndarray,
    *,
    write: bool,
    hints: MPI.Info = MPI.INFO_NULL,
    size: Optional[int] = None,
    sync: bool = False,
) -> None:
    """Write ``buf`` to, or read it from, this rank's box of a .npy file; collective over
    ``comm``. ``box``: a :data:`Box`. ``disp`` is the data offset; ``size`` sets the file
    size first (writes); ``sync`` flushes the file to storage after a write."""
    start, ext, active = box
    data = np.empty(0, np.uint8)
    failed: Optional[BaseException] = None
    if active:
        try:  # bytes: numpy exports no buffer of an ml_dtypes array (bfloat16, float8)
            data = buf.reshape(-1).view(np.uint8)
        except Exception as e:  # still take part in the collectives (an empty box), then raise
            failed, active = e, False
    if not active:
        start, ext = [0] * lay.ndim, [0] * lay.ndim
    view = _View(lay.dtype.itemsize, lay.shape, start, ext)
    try:
        amode = MPI.MODE_WRONLY if write else MPI.MODE_RDONLY
        fh = MPI.File.Open(comm, fname, amode, hints)
        try:
            if size is not None:
                fh.Set_size(size)
            fh.Set_view(disp, view.etype, view.filetype)
            spec = [data, view.count if active else 0, view.etype]
            if write:
                fh.Write_all(spec)
                if sync:
                    fh.Sync()
            else:
                fh.Read_all(spec)
        finally:
            fh.Close()
    finally:
        view.free()
    if failed is not None:
        raise failed
