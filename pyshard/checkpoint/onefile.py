"""The save of a one-file checkpoint (HDF5, safetensors): :class:`OneFile`, the base of
those formats' drivers.

Rank 0 writes everything but the data into ``path.tmp-<token>`` (:meth:`OneFile.lay_out`: a
header, or a file with its datasets allocated) and learns each array's data offset; each
array is redistributed to run ownership (:func:`runs`) and every rank writes its one
contiguous run at its offset with independent MPI-IO; rank 0 renames the file into place.
"""

from __future__ import annotations

import json
from math import prod
from typing import Any, Dict, Optional

import numpy as np
from mpi4py import MPI

from .. import _backend as bk
from ..array import ShardedArray
from ..layout import Partial, Replicate, Shard
from . import saving
from .driver import Format, Items
from .record import record

__all__ = ["OneFile", "runs", "write_runs"]


def runs(x: ShardedArray) -> ShardedArray:
    """``x`` in a layout of run ownership: every writer's box one contiguous run of the file
    (C order). A layout that shards dim 0 alone already is one (Partial dims reduced to
    Replicate, one replica writes); any other is redistributed to ``Shard(0)`` over every
    mesh dim, balanced. A 0-d array: reduced to one value everywhere. Collective."""
    lay = x.layout
    rows_only = all(
        isinstance(p, (Replicate, Partial)) or (isinstance(p, Shard) and p.dim == 0)
        for p in lay.placements
    )
    if lay.ndim == 0 or rows_only:
        if lay.partial_mesh_dims():
            plain = [Replicate() if isinstance(p, Partial) else p for p in lay.placements]
            return x.redistribute(plain, sizes=lay.sizes)
        return x
    return x.redistribute([Shard(0)] * len(lay.mesh_shape))


def write_runs(y: ShardedArray, fname: str, disp: int, sync: bool) -> None:
    """Write this rank's run of ``y`` (a :func:`runs` layout) at byte ``disp`` of ``fname``
    with independent MPI-IO (``COMM_SELF``), if it is the writer of its box."""
    lay = y.layout
    if not saving.is_writer(lay, y.mesh.coords):
        return  # a replica: coordinate 0 of the same box writes it
    start = lay.box(y.mesh.coords)[0].start if lay.ndim else 0
    local = bk.to_host(y.local)
    data = np.ascontiguousarray(local).reshape(-1).view(np.uint8)  # ml_dtypes: bytes
    if not data.size:
        return
    row = lay.dtype.itemsize * prod(lay.shape[1:])
    fh = MPI.File.Open(MPI.COMM_SELF, fname, MPI.MODE_WRONLY)
    try:
        fh.Write_at(disp + start * row, [data, MPI.BYTE])
        if sync:
            fh.Sync()
    finally:
        fh.Close()


class OneFile(Format):
    """A format whose checkpoint is one file holding every array's bytes C-order and whole
    at an offset: subclasses give :meth:`lay_out`."""

    one_file = True
    row_reads = True

    def lay_out(self, tmp: str, items: Items, rec: str) -> Dict[str, Optional[int]]:
        """Rank 0: write the file ``tmp`` up to the data (``rec``: the pyshard record as
        JSON); each array's data offset (None where it has no bytes)."""
        raise NotImplementedError

    def save(
        self,
        comm: Any,
        path: str,
        items: Items,
        meta_json: str,
        sync: bool,
        compression: Optional[str],
    ) -> None:
        rec = json.dumps(record(items, meta_json, comm.Get_size()), sort_keys=True)

        def prepare() -> Any:
            parent = saving.check_target(path, self)
            tmp, _ = saving.temporary(path)
            try:
                return tmp, parent, self.lay_out(tmp, items, rec)
            except BaseException:
                saving.remove(tmp)
                raise

        tmp, parent, offsets = saving.prepare(comm, path, prepare)
        bad: Optional[str] = None
        for name, x in items:
            off = offsets[name]
            if off is None or not prod(x.global_shape) * x.dtype.itemsize:
                continue  # no bytes: the same on every rank (the shape is shared)
            try:  # collective: every rank takes part even after a failed write
                y = runs(x)
            except Exception as e:  # (raised alike on every rank, its checks reading the
                # shared layout: agreed in finish as a write error, which removes the
                # temporary file and names the array, as the npy save does)
                if bad is None:
                    bad = saving.write_error(path, name, comm.Get_rank(), e)
                continue
            if bad is None:
                try:
                    write_runs(y, tmp, off, sync)
                except Exception as e:  # agreed in finish, before the rename
                    bad = saving.write_error(path, name, comm.Get_rank(), e)
        saving.finish(
            comm, path, tmp, bad, None, lambda _: saving.replace_file(tmp, path, parent, sync)
        )
