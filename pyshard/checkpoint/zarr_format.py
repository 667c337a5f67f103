"""Zarr v3 through zarr-python's own classes: sharded arrays saved with each shard file
written by exactly one rank, and any Zarr v3 array (any chunk and shard shape, compressed or
not, from zarr-python, tensorstore or pyshard) checked and read in blocks of whole shard rows.

A save is a Zarr v3 group directory: ``zarr.json`` (node_type group, ``attributes["pyshard"]``
the checkpoint record) and one sharded array per name. The shard grid splits dim 0 into one
block of ``ceil(n0 / ranks)`` rows per rank and keeps the other dims whole; the inner chunks
split a shard's rows into chunks of about :data:`CHUNK_BYTES`. The arrays are first
redistributed to ``Shard(0)`` over every mesh dim with ``sizes`` aligned to that shard grid,
so every rank's box is whole shards and no shard file is touched by two ranks (zarr-python's
own concurrent partial writes into one shard lose data). Each rank encodes its shard files
itself (:func:`write_shards`: the ``sharding_indexed`` layout, zarr-python's ZstdCodec
compressor, crc32c of the index); rank 0 writes every ``zarr.json`` after the data, and
renames the directory into place. Reading goes through zarr-python.

bfloat16 and the float8 formats have no zarr-python 3.1 data type: pyshard writes their
``data_type`` under ml_dtypes' (and tensorstore's zarr3 driver's) name (``"bfloat16"``,
``"float8_e4m3fn"``), writes and reads the bytes through zarr-python as unsigned integers of the
same width, and views them as the ml_dtypes type. tensorstore opens them as such;
zarr-python 3.1 refuses to open those arrays (it does not know the data type).
"""

from __future__ import annotations

import itertools
import json
import os
import secrets
import shutil
from math import ceil, prod
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from .. import _dtypes
from .._optional import OptionalModule

zarr = OptionalModule("zarr")

CHUNK_BYTES = 1 << 20
"""About how many bytes an inner chunk of a saved shard holds (whole rows of dim 0)."""

MAX_BYTES = 1 << 50
"""The largest array (bytes) read: a larger shape is refused as corrupt or hostile."""

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

READ_PLAIN = True
"""Read uncompressed shards straight from their files (False: always through zarr-python)."""

CODECS = {"bytes", "zstd", "gzip", "blosc", "crc32c", "transpose", "sharding_indexed"}
"""The codecs pyshard accepts in a Zarr array (all zarr-python's own)."""


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
    if any(p in ("", ".", "..") or p.startswith("__") for p in parts) or name == "zarr.json":
        raise ValueError(
            f"save(arrays[{name!r}]): not a usable Zarr node name (empty, '.', '..' or "
            f"'__' parts)"
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


def _as_zarr_python(meta: Dict[str, Any]) -> Dict[str, Any]:
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
    return z.Array(AsyncArray(metadata=_as_zarr_python(meta), store_path=store_path))


# ----------------------------------------------------------------------------- reading


def _check_codecs(codecs: Any, where: str) -> None:
    if not isinstance(codecs, list):
        raise ValueError(f"{where}: codecs must be a list")
    for c in codecs:
        name = c.get("name") if isinstance(c, dict) else c
        if name not in CODECS:
            raise ValueError(
                f"{where}: unknown codec {name!r} (pyshard reads {', '.join(sorted(CODECS))})"
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
    """The description of the Zarr array at directory ``d`` with metadata ``m``."""
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
        raise ValueError(f"{where}: data_type {dt!r} is not one pyshard can hold")
    dtype = _dtypes.resolve(dt, where)
    nbytes = prod(shape) * dtype.itemsize
    if nbytes > MAX_BYTES:
        raise ValueError(f"{where}: shape {list(shape)} ({nbytes} bytes) is too large to be real")
    enc = m.get("chunk_key_encoding", {"name": "default"})
    default_sep = "/" if enc.get("name") == "default" else "."
    sep = (enc.get("configuration") or {}).get("separator", default_sep)
    if enc.get("name") not in ("default", "v2") or sep not in ("/", "."):
        raise ValueError(f"{where}: chunk_key_encoding {enc!r} is not one pyshard reads")
    if m.get("storage_transformers"):
        raise ValueError(f"{where}: storage transformers are not supported")
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
        out[name] = _array_entry(path, root_meta, f"{what}: {path!r}")
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
            out[name] = _array_entry(d, m, f"{what}: {path!r}: array {name!r}")
            arrays_at.append(d)
    attrs = root_meta.get("attributes") or {}
    rec = attrs.get("pyshard") if isinstance(attrs, dict) else None
    return out, rec if isinstance(rec, dict) else None


_LE_BYTES = {"name": "bytes", "configuration": {"endian": "little"}}


def _plain_shards(meta: Dict[str, Any], itemsize: int) -> Optional[Tuple[List[int], List[int]]]:
    """(shard shape, inner chunk shape) when the array's shards are plain bytes that pyshard
    reads itself: one ``sharding_indexed`` codec with inner codecs ``bytes`` (little-endian)
    alone, index ``bytes`` + ``crc32c`` at the end, default chunk keys with ``/``, fill value
    zero; None otherwise (zarr-python reads it)."""
    codecs = meta.get("codecs") or []
    if len(codecs) != 1 or codecs[0].get("name") != "sharding_indexed" or not meta["shape"]:
        return None
    conf = codecs[0].get("configuration", {})
    inner = conf.get("codecs", [])
    plain = [{"name": "bytes"}] if itemsize == 1 else []
    if inner not in ([_LE_BYTES], plain) or conf.get("index_location", "end") != "end":
        return None
    if conf.get("index_codecs") != [_LE_BYTES, {"name": "crc32c"}]:
        return None
    enc = meta.get("chunk_key_encoding", {})
    if enc.get("name") != "default" or (enc.get("configuration") or {}).get("separator",
                                                                             "/") != "/":
        return None
    fv = meta.get("fill_value", 0)
    if fv not in (0, 0.0, False, [0, 0], [0.0, 0.0]) or isinstance(fv, str):
        return None
    sshape = list(meta["chunk_grid"]["configuration"]["chunk_shape"])
    cshape = list(conf.get("chunk_shape", []))
    if len(cshape) != len(sshape) or any(c <= 0 or s % c for s, c in zip(sshape, cshape)):
        return None
    return sshape, cshape


def _read_plain(
    e: Dict[str, Any], grids: Tuple[List[int], List[int]], d: int, r0: int, r1: int,
    dtype: np.dtype,
) -> np.ndarray:
    """Indices ``r0:r1`` of dim ``d`` (on the shard grid) read straight from plain shard
    files: each shard's index (its crc32c checked), then its chunks' bytes."""
    import google_crc32c

    shape = list(e["shape"])
    sshape, cshape = grids
    lo = [0] * len(shape)
    hi = list(shape)
    lo[d], hi[d] = r0, r1
    le = np.dtype(dtype).newbyteorder("<") if not _dtypes.is_ml(dtype) else dtype
    out = np.zeros([h - a for a, h in zip(lo, hi)], dtype=le)
    per = [s // c for s, c in zip(sshape, cshape)]
    nidx = prod(per) * 16
    ranges = [range(a // s, -(-b // s)) for a, b, s in zip(lo, hi, sshape)]
    for sidx in itertools.product(*ranges):
        fname = os.path.join(e["file"], "c", *map(str, sidx))
        if not os.path.isfile(fname):
            continue  # never written: the fill value (zero)
        with open(fname, "rb") as f:
            raw = f.read()
        if len(raw) < nidx + 4:
            raise ValueError(f"load: {fname!r}: a shard shorter than its index")
        idx_bytes = raw[-(nidx + 4):-4]
        crc = np.frombuffer(raw[-4:], "<u4")[0]
        if google_crc32c.value(idx_bytes) != int(crc):
            raise ValueError(f"load: {fname!r}: the shard index fails its crc32c")
        index = np.frombuffer(idx_bytes, "<u8").reshape(per + [2])
        body = len(raw) - nidx - 4
        for cidx in itertools.product(*[range(k) for k in per]):
            off, n = (int(v) for v in index[cidx])
            if off == 2**64 - 1 and n == 2**64 - 1:
                continue  # an absent chunk: the fill value
            a = [si * s + ci * c for si, s, ci, c in zip(sidx, sshape, cidx, cshape)]
            if any(x >= m for x, m in zip(a, shape)):
                continue
            if n != prod(cshape) * le.itemsize or off + n > body:
                raise ValueError(f"load: {fname!r}: chunk {list(cidx)} lies outside the shard")
            chunk = np.frombuffer(raw, np.uint8, n, off).view(le).reshape(cshape)
            b = [min(x + c, m) for x, c, m in zip(a, cshape, shape)]
            ia = [max(x, o) for x, o in zip(a, lo)]  # the part inside the region read
            ib = [min(y, h) for y, h in zip(b, hi)]
            if any(x >= y for x, y in zip(ia, ib)):
                continue
            src = tuple(slice(x - c0, y - c0) for x, y, c0 in zip(ia, ib, a))
            dst = tuple(slice(x - o, y - o) for x, y, o in zip(ia, ib, lo))
            out[dst] = chunk[src]
    return out if _dtypes.is_ml(dtype) else np.ascontiguousarray(out, dtype=dtype)


def read_rows(e: Dict[str, Any], d: int, r0: int, r1: int, dtype: np.dtype) -> np.ndarray:
    """Indices ``r0:r1`` of dim ``d`` of the array ``e`` describes (a 0-d array: its value):
    plain shards (:func:`_plain_shards`, as pyshard writes them uncompressed) straight from
    their files, anything else through zarr-python, as ``dtype``."""
    grids = _plain_shards(e["meta"], np.dtype(dtype).itemsize) if READ_PLAIN else None
    if grids is not None:
        return _read_plain(e, grids, d, r0, r1, dtype)
    arr = open_array(e["file"], "", e["meta"])
    a = arr[()] if not e["shape"] else arr[(slice(None),) * d + (slice(r0, r1),)]
    a = np.asarray(a)
    if _dtypes.is_ml(dtype):
        return np.ascontiguousarray(a).view(dtype)
    return np.ascontiguousarray(a, dtype=dtype)


# ----------------------------------------------------------------------------- saving


def save_zarr(
    comm: Any,
    path: str,
    items: List[Tuple[str, Any]],
    meta_json: str,
    sync: bool,
    compression: Optional[str] = None,
) -> None:
    """A Zarr v3 checkpoint; collective over ``comm``. Rank 0 makes ``path.tmp-<token>``;
    each array is redistributed to its shard-aligned layout and every rank writes its whole
    shards with zarr-python; rank 0 writes every ``zarr.json`` last and renames."""
    from ..layout import Partial, Replicate, Shard, split_sizes
    from .errors import Failure, error, on_root
    from .manifest import MANIFEST, entry
    from .saving import check_same, is_writer, record

    parts = comm.Get_size()
    entries = {n: entry(x.layout, "") for n, x in items}
    check_same(comm, path, meta_json + "zarr" + str(compression), entries)
    rec = record(items, meta_json, parts)
    shards = {n: regular_shards(x.layout) for n, x in items}
    metas = {
        n: array_meta(tuple(x.global_shape), x.dtype, parts, compression, shards[n])
        for n, x in items
    }

    def prepare() -> Tuple[str, str, str]:
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            raise Failure(
                error("FileNotFoundError", f"save: parent {parent!r} of {path!r} not found")
            )
        if os.path.lexists(path):
            ok = os.path.isdir(path) and (
                os.path.isfile(os.path.join(path, "zarr.json"))
                or os.path.isfile(os.path.join(path, MANIFEST))
                or not os.listdir(path)
            )
            if not ok:
                raise Failure(
                    error("ValueError", f"save: refusing to replace {path!r}: it exists and is "
                          f"not a checkpoint nor an empty directory")
                )
        token = secrets.token_hex(6)
        tmp = f"{path}.tmp-{token}"
        os.mkdir(tmp)
        return tmp, parent, token

    tmp, parent, token = on_root(
        comm, prepare, lambda e: error("ValueError", f"save({path!r}): cannot prepare: {e}")
    )
    bad = None
    for name, x in items:
        meta = metas[name]
        lay = x.layout
        if lay.ndim and shards[name] is not None:
            # the source's boxes are the shard grid: one replica of each box writes it
            if lay.partial_mesh_dims():
                plain = [Replicate() if isinstance(p, Partial) else p for p in x.placements]
                x = x.redistribute(plain, sizes=lay.sizes)
            box = x.layout.box(x.mesh.coords)
            local = np.asarray(x.local)
            mine = local.size > 0 and is_writer(x.layout, x.mesh.coords)
        elif lay.ndim:
            s0 = meta["chunk_grid"]["configuration"]["chunk_shape"][0]
            ext = split_sizes(lay.shape[0], parts, grain=s0)
            target = [Shard(0)] * len(lay.mesh_shape)
            y = x.redistribute(target, sizes={0: list(ext)})
            box = y.layout.box(y.mesh.coords)
            local = np.asarray(y.local)
            mine = local.size > 0
        else:  # 0-d: rank 0 writes the one chunk
            if lay.partial_mesh_dims():
                plain = [Replicate() if isinstance(p, Partial) else p for p in x.placements]
                x = x.redistribute(plain)
            local = np.asarray(x.local).reshape(())
            box = ()
            mine = comm.Get_rank() == 0
        if mine and bad is None:
            try:
                write_shards(tmp, name, meta, local, box, sync)
            except Exception as e:  # agreed below, before the metadata is written
                bad = f"save({path!r}): array {name!r}: {e!r}"
    _finish_zarr(comm, path, (tmp, parent, token), metas, rec, bad, sync)


def _finish_zarr(
    comm: Any,
    path: str,
    prep: Tuple[str, str, str],
    metas: Dict[str, Dict[str, Any]],
    rec: Dict[str, Any],
    bad: Optional[str],
    sync: bool,
) -> None:
    """Every rank has written its shards: agree on errors (one allgather), then rank 0
    writes every ``zarr.json`` and renames the directory into place (one bcast)."""
    from .errors import Failure, error, on_root
    from .saving import fsync_dir, swap_in

    tmp, parent, token = prep
    verdicts = comm.allgather(bad)
    bad = next((v for v in verdicts if v is not None), None)

    def commit() -> None:
        try:
            if bad is not None:
                raise Failure(error("ValueError", bad))
            for name, meta in metas.items():
                d = os.path.join(tmp, *name.split("/"))
                os.makedirs(d, exist_ok=True)
                _write_json(os.path.join(d, "zarr.json"), meta, sync)
                # intermediate groups of nested names
                g = os.path.dirname(d)
                while os.path.abspath(g) != os.path.abspath(tmp):
                    if not os.path.isfile(os.path.join(g, "zarr.json")):
                        _write_json(os.path.join(g, "zarr.json"), _group({}), sync)
                    g = os.path.dirname(g)
            _write_json(os.path.join(tmp, "zarr.json"), _group({"pyshard": rec}), sync)
            if sync:
                for d, _dirs, _files in os.walk(tmp):  # the shard files, every zarr.json
                    fsync_dir(d)
            swap_in(tmp, path, parent, token, sync)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    on_root(
        comm, commit, lambda e: error("ValueError", f"save({path!r}): cannot write or rename: {e}")
    )




def _encoder(meta: Dict[str, Any]) -> Any:
    """bytes (a buffer) -> the stored bytes of one inner chunk: raw, or zarr-python's ZstdCodec's
    compressor (numcodecs' Zstd, which zarr-python's ZstdCodec wraps, with that codec's
    configuration)."""
    codecs = meta["codecs"]
    if codecs and codecs[0]["name"] == "sharding_indexed":
        codecs = codecs[0]["configuration"]["codecs"]
    z = next((c for c in codecs if c["name"] == "zstd"), None)
    if z is None:
        return lambda b: b
    from numcodecs.zstd import Zstd  # what zarr-python's ZstdCodec compresses with

    conf = z.get("configuration", {})
    zc = Zstd(level=int(conf.get("level", 0)), checksum=bool(conf.get("checksum", False)))
    return lambda b: bytes(zc.encode(b))


def _index_checksum(index: bytes) -> bytes:
    """The crc32c that zarr-python's Crc32cCodec appends (google_crc32c, little-endian)."""
    import google_crc32c

    return np.array([google_crc32c.value(index)], dtype="<u4").tobytes()


def write_shards(
    root: str, name: str, meta: Dict[str, Any], local: np.ndarray, box: Tuple[slice, ...],
    sync: bool,
) -> None:
    """Write the whole shards that ``box`` covers (its edges on the shard grid) from this
    rank's ``local`` block (a 0-d array: its one chunk): per shard its inner chunks in C
    order (an edge chunk stored whole, padded with the fill value; chunks past the array's
    end left out), then the index (offset, length per chunk, uint64 little-endian) and its
    crc32c, as the ``sharding_indexed`` codec lays them out. One file per shard; this rank
    alone writes it."""
    enc = _encoder(meta)
    le = local.dtype.newbyteorder("<") if local.dtype.byteorder == ">" else local.dtype
    raw = np.ascontiguousarray(local, dtype=le)
    d = os.path.join(root, *name.split("/"))
    shape = list(meta["shape"])
    if not shape:
        _put(os.path.join(d, "c"), [enc(_bytes(raw))], sync)
        return
    sshape = meta["chunk_grid"]["configuration"]["chunk_shape"]
    cshape = meta["codecs"][0]["configuration"]["chunk_shape"]
    per = [s // c for s, c in zip(sshape, cshape)]
    lo = [b.start for b in box]
    ranges = [range(b.start // s, -(-b.stop // s)) for b, s in zip(box, sshape)]
    for sidx in itertools.product(*ranges):
        parts: List[Any] = []
        index = np.full(per + [2], np.iinfo(np.uint64).max, dtype="<u8")
        pos = 0
        for cidx in itertools.product(*[range(k) for k in per]):
            a = [si * s + ci * c for si, s, ci, c in zip(sidx, sshape, cidx, cshape)]
            if any(x >= n for x, n in zip(a, shape)):
                continue  # past the array's end: no chunk
            b = [min(x + c, n) for x, c, n in zip(a, cshape, shape)]
            block = raw[tuple(slice(x - o, y - o) for x, y, o in zip(a, b, lo))]
            if list(block.shape) != list(cshape):  # an edge chunk: padded with the fill (0)
                full = np.zeros(cshape, dtype=raw.dtype)
                full[tuple(slice(0, e) for e in block.shape)] = block
                block = full
            data = enc(_bytes(block))
            index[cidx] = (pos, len(data))
            parts.append(data)
            pos += len(data)
        idx = index.tobytes()
        parts.append(idx + _index_checksum(idx))
        _put(os.path.join(d, "c", *map(str, sidx)), parts, sync)


def _bytes(a: np.ndarray) -> memoryview:
    """C-order bytes of ``a`` without a copy where it is contiguous (ml_dtypes arrays export
    no buffer: viewed as bytes)."""
    return memoryview(np.ascontiguousarray(a).reshape(-1).view(np.uint8))


def _put(fname: str, parts: List[Any], sync: bool) -> None:
    os.makedirs(os.path.dirname(fname), exist_ok=True)
    with open(fname, "wb") as f:
        for p in parts:
            f.write(p)
        f.flush()
        if sync:
            os.fsync(f.fileno())


def _group(attrs: Dict[str, Any]) -> Dict[str, Any]:
    return {"zarr_format": 3, "node_type": "group", "attributes": attrs}


def _write_json(fname: str, obj: Any, sync: bool) -> None:
    with open(fname, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")
        f.flush()
        if sync:
            os.fsync(f.fileno())


