"""Any Zarr v3 group or array (from zarr-python, tensorstore or pyshard) checked before a load
trusts it, and its arrays described (no MPI): :func:`inspect`."""

from __future__ import annotations

import json
import os
from math import prod
from typing import Any, Dict, List, Optional, Tuple

from .. import _dtypes
from .driver import Unsupported, unsupported
from .zarr_meta import ML_TYPES, NUMPY_TYPES, need

MAX_BYTES = 1 << 50
"""The largest array (bytes) read: a larger shape is refused as corrupt or hostile."""

CODECS = {"bytes", "zstd", "gzip", "blosc", "crc32c", "transpose", "sharding_indexed"}
"""The codecs pyshard accepts in a Zarr array (all zarr-python's own)."""


def _check_codecs(codecs: Any, where: str) -> None:
    if not isinstance(codecs, list):
        raise ValueError(f"{where}: codecs must be a list")
    for c in codecs:
        name = c.get("name") if isinstance(c, dict) else c
        if name not in CODECS:
            raise Unsupported(
                f"unknown codec {name!r} (pyshard reads {', '.join(sorted(CODECS))})"
            )
        if name == "sharding_indexed":
            conf = c.get("configuration", {})
            _check_codecs(conf.get("codecs", []), where)
            _check_codecs(conf.get("index_codecs", []), where)


def _read_json(fname: str, what: str) -> Dict[str, Any]:
    try:
        with open(fname, encoding="utf-8") as f:
            m = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"{what}: {fname!r} is not valid JSON ({e})") from e
    if not isinstance(m, dict) or m.get("zarr_format") != 3:
        raise ValueError(f"{what}: {fname!r} is not Zarr v3 metadata")
    return m


def _array_entry(d: str, m: Dict[str, Any], where: str) -> Dict[str, Any]:
    """The description of the Zarr array at directory ``d`` with metadata ``m``;
    :class:`Unsupported` (the reason) for an array pyshard cannot hold (a data type, a
    codec it does not know), ValueError for malformed metadata or a huge shape."""
    try:
        shape = tuple(m["shape"])
        dt = m["data_type"]
        grid_ = m["chunk_grid"]
        outer = tuple(grid_["configuration"]["chunk_shape"])
    except (KeyError, TypeError) as e:
        raise ValueError(f"{where}: malformed array metadata ({e!r})") from e
    if not all(type(s) is int and s >= 0 for s in shape):
        raise ValueError(f"{where}: shape {list(shape)} must be non-negative ints")
    if grid_.get("name") != "regular" or len(outer) != len(shape) or not all(
        type(c) is int and c > 0 for c in outer
    ):
        raise ValueError(f"{where}: needs a regular chunk grid of {len(shape)} positive ints")
    if not isinstance(dt, str) or (dt not in NUMPY_TYPES and dt not in ML_TYPES):
        raise Unsupported(f"data_type {dt!r} is not one pyshard can hold")
    dtype = _dtypes.resolve(dt, where)
    nbytes = prod(shape) * dtype.itemsize
    if nbytes > MAX_BYTES:
        raise ValueError(f"{where}: shape {list(shape)} ({nbytes} bytes) is too large to be real")
    enc = m.get("chunk_key_encoding", {"name": "default"})
    default_sep = "/" if enc.get("name") == "default" else "."
    sep = (enc.get("configuration") or {}).get("separator", default_sep)
    if enc.get("name") not in ("default", "v2") or sep not in ("/", "."):
        raise Unsupported(f"chunk_key_encoding {enc!r} is not one pyshard reads")
    if m.get("storage_transformers"):
        raise Unsupported("storage transformers are not supported")
    _check_codecs(m.get("codecs"), where)
    return {
        "shape": shape,
        "dtype": dtype,
        "nbytes": nbytes,
        "file": d,
        "kind": "rows",
        "offset": None,
        "grid": list(outer),
        "meta": m,
    }


def _entry_or_unsupported(d: str, m: Dict[str, Any], where: str) -> Dict[str, Any]:
    """:func:`_array_entry`, or the description of an array pyshard cannot hold (its
    reason), so that the store's other arrays still load."""
    try:
        return _array_entry(d, m, where)
    except Unsupported as e:
        return unsupported(str(e), d)


def _inside(root: str, p: str) -> bool:
    r = os.path.realpath(root)
    q = os.path.realpath(p)
    return q == r or q.startswith(r + os.sep)


def inspect(
    path: str, what: str = "load"
) -> Tuple[Dict[str, Dict[str, Any]], Optional[Dict[str, Any]]]:
    """Rank 0: every array of the Zarr v3 group or array at ``path`` ({name: description},
    name: the path below the group, or the directory's name without ``.zarr`` for a lone
    array) and the pyshard record (None for other tools' stores). ValueError naming the
    file for anything untrustworthy: a key or link that escapes the directory, an unknown
    codec, a data type pyshard cannot hold, a huge shape, malformed metadata."""
    need(what)
    root_meta = _read_json(os.path.join(path, "zarr.json"), what)
    out: Dict[str, Dict[str, Any]] = {}
    if root_meta.get("node_type") == "array":
        name = os.path.basename(os.path.normpath(path))
        name = name[:-5] if name.endswith(".zarr") and len(name) > 5 else name
        out[name] = _entry_or_unsupported(path, root_meta, f"{what}: {path!r}")
        return out, None
    if root_meta.get("node_type") != "group":
        raise ValueError(f"{what}: {path!r}: zarr.json is neither a group nor an array")
    cons = root_meta.get("consolidated_metadata") or {}
    for key in (cons.get("metadata") or {}) if isinstance(cons, dict) else {}:
        parts = str(key).split("/")
        if str(key).startswith("/") or ".." in parts:
            raise ValueError(f"{what}: {path!r}: Zarr key {key!r} escapes the directory")
    arrays_at: List[str] = []
    for d, dirs, files in os.walk(path):
        # every entry, chunk directories included: zarr-python would follow a link anywhere
        for n in dirs + files:
            p = os.path.join(d, n)
            if os.path.islink(p) and not _inside(path, p):
                raise ValueError(
                    f"{what}: {p!r} links outside {path!r}: the key escapes the directory"
                )
        if d == path or "zarr.json" not in files:
            continue
        if any(d.startswith(a + os.sep) for a in arrays_at):
            continue  # inside an array: its chunks
        m = _read_json(os.path.join(d, "zarr.json"), what)
        if m.get("node_type") == "array":
            name = os.path.relpath(d, path).replace(os.sep, "/")
            out[name] = _entry_or_unsupported(d, m, f"{what}: {path!r}: array {name!r}")
            arrays_at.append(d)
    attrs = root_meta.get("attributes") or {}
    rec = attrs.get("pyshard") if isinstance(attrs, dict) else None
    return out, rec if isinstance(rec, dict) else None
