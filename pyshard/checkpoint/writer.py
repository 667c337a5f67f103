"""``save``: sharded arrays written as a checkpoint in one of four formats (npy, HDF5, Zarr v3,
safetensors), collective over their mesh.

The arguments are checked (every format's own limits through its driver,
:meth:`~pyshard.checkpoint.driver.Format.check_save`), every rank is agreed to describe the
same checkpoint (one allgather), and the format's driver writes it
(:meth:`~pyshard.checkpoint.driver.Format.save`): into a temporary file or directory that
rank 0 renames into place once every rank has written its boxes.
"""

from __future__ import annotations

import json
import logging
import math
import time
from math import prod
from typing import Any, List, Mapping, Optional, Tuple

from mpi4py import MPI

from .. import _validate
from ..array import ShardedArray
from .errors import PathArg, norm_path
from .formats import DRIVERS, FORMATS
from .manifest import entry
from .saving import check_same

__all__ = ["save", "FORMATS"]

log = logging.getLogger("pyshard")


# ----------------------------------------------------------------------------- arguments


def _check_arrays(arrays: object) -> List[Tuple[str, ShardedArray]]:
    if not isinstance(arrays, Mapping):
        raise TypeError(
            f"save(arrays): expected a dict name -> ShardedArray, got {type(arrays).__name__}"
        )
    if not arrays:
        raise ValueError("save(arrays): nothing to save (an empty dict has no communicator)")
    items = []
    for name, x in arrays.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"save(arrays): names must be non-empty strings, got {name!r}")
        if not isinstance(x, ShardedArray):
            raise TypeError(
                f"save(arrays[{name!r}]): expected a pyshard.ShardedArray, got {type(x).__name__}"
            )
        items.append((name, x))
    items.sort(key=lambda t: t[0])
    comm = items[0][1].mesh.comm
    for name, x in items[1:]:
        if MPI.Comm.Compare(comm, x.mesh.comm) not in (MPI.IDENT, MPI.CONGRUENT):
            raise ValueError(
                f"save(arrays[{name!r}]): its mesh is on another communicator than "
                f"arrays[{items[0][0]!r}]; every array of one checkpoint must share the ranks"
            )
    return items


def _non_finite(obj: Any, where: str) -> Optional[str]:
    """Where in ``obj`` (as ``metadata[...]``) the first NaN or infinite float is, or None."""
    if isinstance(obj, float):
        return None if math.isfinite(obj) else f"{where} = {float(obj)!r}"
    if isinstance(obj, Mapping):
        items: Any = obj.items()
    elif isinstance(obj, (list, tuple)):
        items = enumerate(obj)
    else:
        return None
    for k, v in items:
        found = _non_finite(v, f"{where}[{k!r}]")
        if found is not None:
            return found
    return None


def _meta_json(metadata: object) -> str:
    """``metadata`` (None: empty) as canonical JSON; TypeError unless a JSON-serialisable dict,
    ValueError where it holds a NaN or infinite float (standard JSON has none)."""
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, Mapping):
        raise TypeError(f"save(metadata): expected a dict, got {type(metadata).__name__}")
    try:
        text = json.dumps(metadata, sort_keys=True)
    except (TypeError, ValueError) as e:
        raise TypeError(f"save(metadata): not JSON-serialisable: {e}") from e
    try:
        # what manifest.json and the records hold must be standard JSON: json.dumps would
        # write NaN and Infinity, which other JSON readers refuse
        json.dumps(metadata, sort_keys=True, allow_nan=False)
    except ValueError as e:
        where = _non_finite(metadata, "metadata") or str(e)
        raise ValueError(
            f"save(metadata): holds a non-finite float ({where}): NaN and Infinity are not "
            f"standard JSON; store them as strings or None"
        ) from e
    return text


def _check_compression(format: str, compression: object) -> None:
    """ValueError unless ``compression`` is one that ``format`` takes."""
    if compression not in DRIVERS[format].compressions:
        takes = " or ".join(
            f"{c!r} with format={n!r}"
            for n, f in DRIVERS.items()
            for c in f.compressions
            if c is not None
        )
        raise ValueError(
            f"save(compression): None, or {takes}; got {compression!r} with format={format!r}"
        )


def save(
    path: PathArg,
    arrays: Mapping[str, ShardedArray],
    metadata: Optional[Mapping[str, Any]] = None,
    *,
    format: str = "npy",
    compression: Optional[str] = None,
    sync: bool = True,
) -> None:
    """Save sharded arrays as a checkpoint at ``path`` in one of four formats (npy, HDF5,
    Zarr v3, safetensors: ``format=``); collective over their mesh.

    path: the checkpoint directory (npy, Zarr) or file (HDF5, safetensors). It is written as
    ``path.tmp-<random>`` next to it and
    renamed into place after every rank has finished, replacing an earlier checkpoint at
    ``path`` only then; a save that dies midway leaves the earlier one intact.
    arrays: name -> ShardedArray, all on meshes over the same communicator. Partial arrays
    are reduced first (one collective each); of replicated copies exactly one rank writes.
    metadata: a JSON-serialisable dict kept with the checkpoint (the npy manifest, or the
    pyshard record of the other formats; see :func:`checkpoint_info`); TypeError where it is
    not, ValueError where it holds a NaN or infinite float (not standard JSON).
    sync: fsync the data, the metadata and the directory before the rename (default True).

    format: ``"npy"`` (the default: a directory of ``.npy`` files and a manifest),
    ``"hdf5"`` (one HDF5 file at ``path``, one contiguous dataset per array; needs h5py,
    ``pip install 'pyshard[hdf5]'``),
    ``"safetensors"`` (one safetensors file at ``path``; needs no package) or ``"zarr"``
    (a Zarr v3 group directory at ``path``, one sharded array per name; needs zarr-python,
    ``pip install 'pyshard[zarr]'``). See docs/checkpoints.md for what each stores.
    compression: ``None`` or ``"zstd"`` (level 1) for the inner chunks of a Zarr save; the
    other formats store raw bytes.

    Every rank must pass the same names, layouts, path, metadata, format, compression and
    sync.
    """
    t0 = time.perf_counter()
    try:
        path = norm_path(path, "save")
        if format not in DRIVERS:
            raise ValueError(f"save(format): expected one of {tuple(DRIVERS)}, got {format!r}")
        _check_compression(format, compression)
        fmt = DRIVERS[format]
        items = _check_arrays(arrays)
        meta_json = _meta_json(metadata)
        fmt.check_save(items)
    except (TypeError, ValueError) as e:  # (validation mode: the others wait in agree)
        x0 = next((x for x in arrays.values() if isinstance(x, ShardedArray)), None) \
            if isinstance(arrays, dict) else None
        if x0 is not None and x0.mesh.comm != MPI.COMM_NULL:
            _validate.refused(x0.mesh.comm, "save", e)
        raise
    items[0][1].mesh.check_live()  # (a freed mesh, or MPI finalized: before any MPI call)
    comm = items[0][1].mesh.comm
    if _validate.enabled:
        layouts = ", ".join(f"{n}: {x.layout!r}" for n, x in items)
        _validate.agree(comm, "save", {
            "path": repr(path), "arrays": layouts, "sync": repr(bool(sync)),
            "metadata": meta_json, "format": repr(format), "compression": repr(compression),
        })
    entries = {n: entry(x.layout, "") for n, x in items}
    # sync too: a rank that fsyncs alone would wait in MPI_File_sync (collective)
    problems = [f"array {n!r}'s local array is {p}" for n, x in items
                if (p := x.local_problem()) is not None]
    check_same(comm, path, f"{meta_json} {format} {compression} sync={bool(sync)}", entries,
               problems[0] if problems else None)
    fmt.save(comm, path, items, meta_json, sync, compression)
    if comm.Get_rank() == 0:
        log.info(
            "pyshard: saved %d array(s), %d bytes, as %s to %s from %d rank(s) in %.3f s",
            len(items),
            sum(prod(x.global_shape) * x.dtype.itemsize for _, x in items),
            format,
            path,
            comm.Get_size(),
            time.perf_counter() - t0,
        )
