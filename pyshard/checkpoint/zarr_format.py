"""The Zarr v3 format (:class:`ZarrFormat`) through zarr-python's own classes: sharded arrays
saved with each shard file written by exactly one rank, and any Zarr v3 array (any chunk and
shard shape, compressed or not, from zarr-python, tensorstore or pyshard) checked and read in
blocks of whole shard rows.

A save is a Zarr v3 group directory: ``zarr.json`` (node_type group, ``attributes["pyshard"]``
the checkpoint record) and one sharded array per name. The shard grid splits dim 0 into one
block of ``ceil(n0 / ranks)`` rows per rank and keeps the other dims whole (or is the source
layout's own boxes where they form a regular grid); the inner chunks split a shard's rows
into chunks of about :data:`~pyshard.checkpoint.zarr_meta.CHUNK_BYTES`. The arrays are first
redistributed to ``Shard(0)`` over every mesh dim with ``sizes`` aligned to that shard grid,
so every rank's box is whole shards and no shard file is touched by two ranks (zarr-python's
own concurrent partial writes into one shard lose data).

The parts, one module each:

- :mod:`~pyshard.checkpoint.zarr_meta`: the ``zarr.json`` of a saved array, names and data
  types (bfloat16 and float8 under ml_dtypes' names);
- :mod:`~pyshard.checkpoint.zarr_inspect`: any group or array checked and described;
- :mod:`~pyshard.checkpoint.zarr_codecs`: zarr-python's codecs of one array;
- :mod:`~pyshard.checkpoint.zarr_read`: blocks read straight from the shard files;
- :mod:`~pyshard.checkpoint.zarr_write`: the save, each rank laying out its shard files.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Optional, Tuple

import numpy as np

from . import saving, zarr_write
from .driver import Arrays, Facts, Format, Items
from .manifest import MANIFEST
from .record import facts, layout_of
from .zarr_inspect import inspect
from .zarr_meta import check_name, data_type, need
from .zarr_read import missing_shard, read_rows

__all__ = ["ZarrFormat"]


class ZarrFormat(Format):
    """A Zarr v3 group (or a lone array) directory."""

    name = "zarr"
    label = "Zarr v3"
    target = "a Zarr or pyshard checkpoint nor an empty directory"
    compressions = (None, "zstd")

    def probe(self, path: str) -> bool:
        return os.path.isfile(os.path.join(path, "zarr.json"))

    def replaceable(self, path: str) -> bool:
        return os.path.isdir(path) and (
            os.path.isfile(os.path.join(path, "zarr.json"))
            or os.path.isfile(os.path.join(path, MANIFEST))
            or not os.listdir(path)
        )

    def describe(self, path: str, what: str) -> Tuple[Arrays, Facts]:
        table, rec = inspect(path, what)
        saved = rec.get("arrays") if rec is not None else None
        saved = saved if isinstance(saved, dict) else {}
        arrays = {}
        for name, e in table.items():
            lay = layout_of(rec, name, e["shape"], f"{what}: {path!r}", e.get("dtype"))
            # saved: an array the record names, which pyshard's save wrote whole (every
            # shard), and which no other tool resized or recast since
            arrays[name] = dict(e, saved=name in saved and bool(lay["placements"]), **lay)
        return arrays, facts(rec, {})

    def check_arrays(self, path: str, arrays: Arrays, missing_as_fill: bool = False) -> Arrays:
        """Rank 0: every shard file of each of pyshard's own arrays is there (its save wrote
        them all): FileNotFoundError naming the first missing one, unless
        ``missing_as_fill`` (then, as in another tool's store, a chunk or shard that is not
        there is the fill value: the Zarr rule)."""
        for name, e in arrays.items():
            if missing_as_fill:
                e["saved"] = False  # read as another tool's array: absent means fill
                continue
            fname = missing_shard(e) if e.get("saved") else None
            if fname is not None:
                fill = e["meta"].get("fill_value")
                raise FileNotFoundError(
                    f"load: array {name!r}: its shard file {fname!r} is missing (the pyshard "
                    f"checkpoint's save wrote it): a save cut short, or a file removed since; "
                    f"zarr-python itself deletes a shard whose every element it set to the "
                    f"fill value ({fill!r} here), so if another tool modified this "
                    f"checkpoint, load(..., missing_as_fill=True) reads missing shards as "
                    f"the fill value"
                )
        return arrays

    def check_save(self, items: Items) -> None:
        need("save(format='zarr')")
        for name, x in items:
            check_name(name)
            data_type(x.dtype, f"save(arrays[{name!r}])")
        saving.check_nested([n for n, _ in items], "Zarr")

    def save(
        self,
        comm: Any,
        path: str,
        items: Items,
        meta_json: str,
        sync: bool,
        compression: Optional[str],
    ) -> None:
        zarr_write.save(self, comm, path, items, meta_json, sync, compression)

    def read_block(
        self, name: str, e: Dict[str, Any], d: int, r0: int, r1: int, dtype: np.dtype
    ) -> np.ndarray:
        return read_rows(e, d, r0, r1, dtype)
