"""The pyshard record a one-file or Zarr checkpoint keeps beside its data (HDF5: the root
attribute ``pyshard``; safetensors: ``__metadata__["pyshard"]``; Zarr: the group's
``attributes["pyshard"]``), and what a description of any checkpoint takes from it (no MPI)."""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..array import ShardedArray
from .manifest import FORMAT, VERSION, dtype_str

__all__ = ["facts", "layout_of", "parse_record", "record"]

log = logging.getLogger("pyshard")


def record(items: List[Tuple[str, ShardedArray]], meta_json: str, size: int) -> Dict[str, Any]:
    """The record of a save: format, version, rank count, time, the user's metadata and each
    array's dtype name and saved layout."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "ranks": size,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "metadata": json.loads(meta_json),
        "arrays": {
            n: {
                "dtype": dtype_str(x.dtype),
                "shape": list(x.shape),
                "mesh_shape": list(x.layout.mesh_shape),
                "placements": [str(p) for p in x.layout.placements],
                "sizes": {str(d): list(e) for d, e in x.layout.sizes.items()},
            }
            for n, x in items
        },
    }


def parse_record(s: Optional[str]) -> Optional[Dict[str, Any]]:
    """The record kept as JSON text in a file of another format, or None (no such text, or
    not a JSON object: a file from another tool)."""
    if not s:
        return None
    try:
        m = json.loads(s)
    except ValueError:
        return None
    return m if isinstance(m, dict) else None


def layout_of(
    rec: Optional[Dict[str, Any]],
    name: str,
    shape: Optional[Sequence[int]] = None,
    where: str = "",
    dtype: Optional[np.dtype] = None,
) -> Dict[str, Any]:
    """The saved layout of ``name`` from a record (empty for other tools' files):
    ``mesh_shape``, ``placements``, ``sizes``. With the array's ``shape`` (and ``dtype``) as
    its file gives it now: empty too (and a warning naming ``where``) where the saved shape,
    shard table or dtype no longer fits it (another tool resized or recast the array since
    pyshard saved it; a change of byte order alone keeps the layout)."""
    none: Dict[str, Any] = {"mesh_shape": (), "placements": [], "sizes": {}}
    a = (rec or {}).get("arrays", {}).get(name) if isinstance(rec, dict) else None
    if not isinstance(a, dict):
        return none
    try:
        lay = {
            "mesh_shape": tuple(int(s) for s in a.get("mesh_shape", ())),
            "placements": [str(p) for p in a.get("placements", [])],
            "sizes": {int(d): tuple(int(v) for v in x) for d, x in a.get("sizes", {}).items()},
        }
    except (TypeError, ValueError, AttributeError):
        return none
    if dtype is not None and isinstance(a.get("dtype"), str):
        was, now = a["dtype"], dtype_str(np.dtype(dtype))
        if _orderless(was) != _orderless(now):
            log.warning("pyshard: %s: array %r is %s in the file, but pyshard's record of its "
                        "save says %s (recast by another tool since the save?): read as a "
                        "foreign array, with no saved layout", where, name, now, was)
            return none
    saved = a.get("shape")
    if shape is not None and isinstance(saved, list) and list(saved) != list(shape):
        log.warning("pyshard: %s: array %r is %s in the file, but pyshard's record of its save "
                    "says %s (resized by another tool since the save?): read as a foreign "
                    "array, with no saved layout", where, name, tuple(shape), tuple(saved))
        return none
    if shape is not None:
        bad = [
            (d, sum(ext)) for d, ext in sorted(lay["sizes"].items())
            if not 0 <= d < len(shape) or sum(ext) != shape[d]
        ]
        if bad:
            d, n = bad[0]
            what = (f"has a shard table of {n} along dim {d} (resized by another tool since "
                    f"the save?)" if 0 <= d < len(shape) else
                    f"names dim {d} of a {len(shape)}-D array")
            log.warning("pyshard: %s: array %r is %s in the file, but pyshard's record of its "
                        "save %s: read as a foreign array, with no saved layout",
                        where, name, tuple(shape), what)
            return none
    return lay


def _orderless(name: str) -> str:
    """A manifest dtype name without its byte order (``"<f8"`` and ``">f8"`` -> ``"f8"``)."""
    return name[1:] if name[:1] in "<>|=" else name


def facts(rec: Optional[Dict[str, Any]], meta: Dict[str, str]) -> Dict[str, Any]:
    """``version``, ``ranks``, ``created``, ``metadata`` of a record; a foreign file's own
    string metadata (safetensors ``__metadata__``) when there is none."""
    if not rec:
        return {"version": None, "ranks": None, "created": None, "metadata": dict(meta)}
    md = rec.get("metadata", {})
    return {
        "version": rec.get("version"),
        "ranks": rec.get("ranks"),
        "created": rec.get("created"),
        "metadata": md if isinstance(md, dict) else {},
    }
