"""What every format's save shares: the check that all ranks describe one checkpoint, the
one replica that writes a box, the pyshard record kept beside the data, and the fsync of a
directory."""

from __future__ import annotations

import json
import os
import shutil
import time
import zlib
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..array import ShardedArray
from ..layout import Layout, Shard
from .manifest import FORMAT, VERSION, dtype_str

__all__ = ["check_same", "fsync_dir", "is_writer", "record"]


def is_writer(layout: Layout, coords: Sequence[int]) -> bool:
    """The one replica that writes a box: coordinate 0 on every mesh dim that does not shard."""
    return all(c == 0 for c, p in zip(coords, layout.placements) if not isinstance(p, Shard))


def check_same(comm: Any, path: str, meta_json: str, entries: Dict[str, Any]) -> None:
    """Every rank must describe the same checkpoint: one small allgather agrees on it."""
    digest = zlib.crc32(json.dumps([path, meta_json, entries], sort_keys=True).encode())
    digests = comm.allgather(digest)
    if len(set(digests)) != 1:
        bad = [r for r, d in enumerate(digests) if d != digests[0]]
        raise ValueError(
            f"save({path!r}): ranks {bad} pass other names, layouts, path or metadata than "
            f"rank 0; every rank must pass the same"
        )


def record(items: List[Tuple[str, ShardedArray]], meta_json: str, size: int) -> Dict[str, Any]:
    """The pyshard record a one-file or Zarr checkpoint keeps beside the data (HDF5: the root
    attribute ``pyshard``; safetensors: ``__metadata__["pyshard"]``; Zarr: the group's
    ``attributes["pyshard"]``): format, version, rank count, time, the user's metadata and
    each array's dtype name and saved layout."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "ranks": size,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "metadata": json.loads(meta_json),
        "arrays": {
            n: {
                "dtype": dtype_str(x.dtype),
                "mesh_shape": list(x.layout.mesh_shape),
                "placements": [str(p) for p in x.layout.placements],
                "sizes": {str(d): list(e) for d, e in x.layout.sizes.items()},
            }
            for n, x in items
        },
    }


def fsync_dir(d: str) -> None:
    """fsync directory ``d`` (its new entries); nothing where directories cannot be opened."""
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def swap_in(tmp: str, path: str, parent: str, token: str, sync: bool) -> None:
    """Rename the finished checkpoint ``tmp`` to ``path``: a previous one there is moved aside
    first and put back if the rename fails, and removed once the new one is in place."""
    old = None
    if os.path.lexists(path):
        old = f"{path}.old-{token}"
        os.rename(path, old)
    try:
        os.rename(tmp, path)
    except OSError:
        if old is not None:
            os.rename(old, path)  # put the previous checkpoint back
        raise
    if sync:
        fsync_dir(parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def parse_record(s: Optional[str]) -> Optional[Dict[str, Any]]:
    """The pyshard record kept as JSON text in a file of another format, or None (no such
    text, or not a JSON object: a file from another tool)."""
    if not s:
        return None
    try:
        m = json.loads(s)
    except ValueError:
        return None
    return m if isinstance(m, dict) else None
