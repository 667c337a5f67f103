"""A Zarr v3 array as pyshard saves it: its ``zarr.json`` (shard grid, inner chunks,
codecs, data type), the names and data types a Zarr checkpoint takes, and zarr-python's view
of it (no MPI).

bfloat16 and the float8 formats have no zarr-python 3.1 data type: pyshard writes their
``data_type`` under ml_dtypes' (and tensorstore's zarr3 driver's) name (``"bfloat16"``,
``"float8_e4m3fn"``), writes and reads the bytes through zarr-python as unsigned integers of the
same width (:func:`as_zarr_python`), and views them as the ml_dtypes type. tensorstore opens
them as such; zarr-python 3.1 refuses to open those arrays (it does not know the data type).
"""

from __future__ import annotations

from math import ceil, prod
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from .. import _dtypes
from .._optional import OptionalModule

zarr = OptionalModule("zarr")

CHUNK_BYTES = 1 << 20
"""About how many bytes an inner chunk of a saved shard holds (whole rows of dim 0)."""

NUMPY_TYPES = (
    "bool int8 int16 int32 int64 uint8 uint16 uint32 uint64 float16 float32 float64 "
    "complex64 complex128"
).split()
"""Zarr v3 data types that are numpy's own (zarr-python 3.1 holds them)."""

ML_TYPES = (
    "bfloat16 float8_e4m3fn float8_e5m2 float8_e4m3fnuz float8_e5m2fnuz float8_e4m3b11fnuz "
    "float8_e4m3 float8_e3m4 float8_e8m0fnu"
).split()
"""ml_dtypes floats stored under their own names (tensorstore's zarr3 driver reads these)."""


def need(what: str) -> Any:
    """The zarr module (3.x), or ImportError naming the extra."""
    m = zarr()
    if m is None or not str(getattr(m, "__version__", "0")).startswith("3"):
        raise ImportError(
            f"{what}: the Zarr format needs zarr-python 3: pip install 'pyshard[zarr]'"
        )
    return m


def check_name(name: str) -> None:
    """ValueError unless ``name`` is a usable Zarr node path (``a`` or ``group/a``)."""
    parts = name.split("/")
    if any(p in ("", ".", "..", "zarr.json") or p.startswith("__") or "\x00" in p
           for p in parts):
        raise ValueError(
            f"save(arrays[{name!r}]): not a usable Zarr node name (empty, '.', '..', "
            f"'zarr.json' (a node's metadata file) or '__' parts, or a NUL character)"
        )


def data_type(dtype: np.dtype, what: str = "save") -> str:
    """The Zarr v3 ``data_type`` of ``dtype``; TypeError for one pyshard does not store."""
    name = _dtypes.name(dtype) if _dtypes.is_ml(dtype) else np.dtype(dtype).name
    if name not in NUMPY_TYPES and name not in ML_TYPES:
        raise TypeError(f"{what}: the Zarr format cannot hold dtype {dtype}")
    return name


def _fill(dt: str) -> Any:
    return False if dt == "bool" else [0.0, 0.0] if dt.startswith("complex") else (
        0.0 if dt.startswith(("float", "bfloat")) else 0
    )


def regular_shards(layout: Any) -> Optional[List[int]]:
    """The shard shape whose grid is exactly ``layout``'s boxes, or None. Each sharded dim's
    extents must be ``[s] * k + [r] + [0] * m`` with ``0 <= r <= s`` (an even split, or one
    whose boxes start at multiples of ``s``); unsharded dims are whole. Partial and
    Replicate mesh dims are fine (one replica writes). Then saving needs no redistribute."""
    if not layout.ndim or 0 in layout.shape:
        return None
    out = []
    sizes = layout.sizes
    for d, n in enumerate(layout.shape):
        ext = sizes.get(d)
        if ext is None:
            out.append(n)
            continue
        s0 = ext[0]
        if s0 <= 0:
            return None
        k = 0
        while k < len(ext) and ext[k] == s0:
            k += 1
        rest = list(ext[k:])
        if rest and not (rest[0] <= s0 and all(e == 0 for e in rest[1:])):
            return None
        out.append(s0)
    return out


def grid(
    shape: Tuple[int, ...], itemsize: int, parts: int, shard: Optional[List[int]] = None
) -> Tuple[List[int], List[int]]:
    """(shard shape, inner chunk shape) of a saved array: ``shard`` when given (the source
    layout's boxes, :func:`regular_shards`), else ``ceil(n0 / parts)`` rows per shard (the
    other dims whole); inner chunks are whole rows of a shard dividing it, about
    :data:`CHUNK_BYTES` each."""
    if not shape:
        return [], []
    if shard is None:
        shard = [max(1, ceil(shape[0] / parts))] + [max(1, n) for n in shape[1:]]
    s0 = shard[0]
    row = itemsize * prod(shard[1:])
    want = max(1, CHUNK_BYTES // max(1, row))
    c0 = max(d for d in range(1, min(s0, want) + 1) if s0 % d == 0)
    return list(shard), [c0] + list(shard[1:])


def array_meta(
    shape: Tuple[int, ...],
    dtype: np.dtype,
    parts: int,
    compression: Optional[str],
    shard: Optional[List[int]] = None,
) -> Dict[str, Any]:
    """The ``zarr.json`` of a saved array (the data type under its own name)."""
    dt = data_type(dtype)
    shard, inner = grid(shape, dtype.itemsize, parts, shard)
    bytes_codec: Dict[str, Any] = {"name": "bytes"}
    if dtype.itemsize > 1:
        bytes_codec["configuration"] = {"endian": "little"}
    inner_codecs: List[Dict[str, Any]] = [bytes_codec]
    if compression == "zstd":
        inner_codecs.append({"name": "zstd", "configuration": {"level": 1, "checksum": False}})
    if shape:
        codecs = [
            {
                "name": "sharding_indexed",
                "configuration": {
                    "chunk_shape": inner,
                    "codecs": inner_codecs,
                    "index_codecs": [
                        {"name": "bytes", "configuration": {"endian": "little"}},
                        {"name": "crc32c"},
                    ],
                    "index_location": "end",
                },
            }
        ]
    else:
        codecs = inner_codecs
    return {
        "zarr_format": 3,
        "node_type": "array",
        "shape": list(shape),
        "data_type": dt,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": shard}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": _fill(dt),
        "codecs": codecs,
        "attributes": {},
    }


def as_zarr_python(meta: Dict[str, Any]) -> Dict[str, Any]:
    """``meta`` as zarr-python 3.1 takes it: an ml_dtypes data type becomes the unsigned
    integer of its width, its fill value the same bits."""
    dt = meta["data_type"]
    if dt not in ML_TYPES:
        return meta
    ml = _dtypes.resolve(dt, "zarr")
    fv = meta.get("fill_value", 0)
    if isinstance(fv, str) and fv.startswith("0x"):
        bits = int(fv, 16)
    else:
        val = {"NaN": np.nan, "Infinity": np.inf, "-Infinity": -np.inf}.get(fv, fv)
        bits = int(np.array(float(val), dtype=ml).view(f"<u{ml.itemsize}"))
    return dict(meta, data_type=f"uint{8 * ml.itemsize}", fill_value=bits)


def open_array(root: str, name: str, meta: Dict[str, Any]) -> Any:
    """A zarr-python Array at ``root/name`` with metadata ``meta`` (no file read for it)."""
    z = need("zarr")
    from zarr.core.array import AsyncArray
    from zarr.storage import LocalStore, StorePath

    store_path = StorePath(LocalStore(root), name)
    return z.Array(AsyncArray(metadata=as_zarr_python(meta), store_path=store_path))
