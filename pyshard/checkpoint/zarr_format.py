"""Zarr v3 through zarr-python's own classes: sharded arrays saved with each shard file
written by exactly one rank, and any Zarr v3 array (any chunk and shard shape, compressed or
not, from zarr-python, tensorstore or pyshard) checked and read in blocks of whole shard rows.

A save is a Zarr v3 group directory: ``zarr.json`` (node_type group, ``attributes["pyshard"]``
the checkpoint record) and one sharded array per name. The shard grid splits dim 0 into one
block of ``ceil(n0 / ranks)`` rows per rank and keeps the other dims whole; the inner chunks
split a shard's rows into chunks of about :data:`CHUNK_BYTES`. The arrays are first
redistributed to ``Shard(0)`` over every mesh dim with ``sizes`` aligned to that shard grid,
so every rank's box is whole shards and no shard file is touched by two ranks (zarr-python's
own concurrent partial writes into one shard lose data). Each rank lays out its shard files
itself (:func:`write_shards`: the ``sharding_indexed`` layout), the chunks and the index
encoded by zarr-python's codecs (:class:`Codecs`); rank 0 writes every ``zarr.json`` after
the data, and renames the directory into place. Reading (:func:`read_rows`) takes each
shard's index and chunks straight from its file, decoded by zarr-python's codecs.

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
import sys
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

ZSTD_DIRECT = True
"""Chunks whose codecs are ``bytes`` (native order) then ``zstd`` go through numcodecs'
``Zstd`` (what zarr-python's ``ZstdCodec`` compresses with, configured from that codec's own
level and checksum) rather than zarr-python's pipeline, whose ``ZstdCodec`` hands every chunk
to a thread (``asyncio.to_thread``): with as many ranks as cores that was 1.3-1.5x slower to
save and about 2x slower to load here. The bytes are the same. False: the pipeline."""

READ_DIRECT = True
"""Read shards and chunks straight from their files, decoded by zarr-python's codecs
(:func:`_read_direct`; False: always through a zarr-python Array)."""

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


class Codecs:
    """zarr-python's own codecs of one array, as zarr-python parses them from its metadata
    (``ArrayV3Metadata``): for a sharded array the ``ShardingCodec``'s inner codecs (for
    example ``BytesCodec``, ``ZstdCodec``) and index codecs (``BytesCodec``, ``Crc32cCodec``),
    else the array's codecs, each set in a zarr-python codec pipeline (``CodecPipeline
    .from_codecs``, the class zarr-python's config names, as its ``ShardingCodec`` does).
    :meth:`encode` and :meth:`decode` run a batch of inner chunks through it in one call
    (zarr-python's ``sync``): the bytes of every chunk and index are zarr-python's, while
    pyshard lays out the shard files itself (no copy of a whole shard)."""

    def __init__(self, meta: Dict[str, Any]) -> None:
        need("zarr")
        from zarr.codecs import BytesCodec, ShardingCodec, ZstdCodec
        from zarr.core.array_spec import ArrayConfig, ArraySpec
        from zarr.core.buffer import default_buffer_prototype
        from zarr.core.dtype.npy.int import UInt64
        from zarr.core.metadata.v3 import ArrayV3Metadata
        from zarr.core.sync import sync
        from zarr.registry import get_pipeline_class

        md = ArrayV3Metadata.from_dict(_as_zarr_python(meta))
        self._sync = sync
        self.proto = default_buffer_prototype()
        self.dtype = np.dtype(md.data_type.to_native_dtype())
        """The numpy dtype zarr-python holds the array in (uintN for bfloat16 and float8)."""
        self.fill = np.array(md.fill_value, dtype=self.dtype)
        self.outer = tuple(md.chunk_grid.chunk_shape)  # type: ignore[attr-defined]
        self.sep = md.chunk_key_encoding.separator  # type: ignore[attr-defined]
        self.v2_keys = md.chunk_key_encoding.name == "v2"  # type: ignore[attr-defined]
        config = ArrayConfig(order="C", write_empty_chunks=True)
        pipeline = get_pipeline_class()
        codecs = tuple(md.codecs)
        self.sharded = len(codecs) == 1 and isinstance(codecs[0], ShardingCodec)
        self.index_bytes: Optional[int] = None
        if self.sharded:
            sc = codecs[0]
            self.inner = tuple(sc.chunk_shape)
            self.per = tuple(s // c for s, c in zip(self.outer, self.inner))
            self.index_at_end = sc.index_location.value == "end"
            self._index_spec = ArraySpec(
                shape=self.per + (2,),
                dtype=UInt64(endianness="little"),
                fill_value=np.uint64(2**64 - 1),
                config=config,
                prototype=self.proto,
            )
            self._index = pipeline.from_codecs(sc.index_codecs)
            self.index_names = [c.to_dict()["name"] for c in sc.index_codecs]
            if all(getattr(c, "is_fixed_size", False) for c in sc.index_codecs):
                self.index_bytes = self._index.compute_encoded_size(
                    16 * prod(self.per), self._index_spec
                )
            codecs = tuple(sc.codecs)
        else:
            self.inner = self.outer
            self.per = tuple(1 for _ in self.outer)
        self._spec = ArraySpec(
            shape=self.inner,
            dtype=md.data_type,
            fill_value=md.fill_value,
            config=config,
            prototype=self.proto,
        )
        self._data = pipeline.from_codecs(codecs)
        self._zstd = None
        native = isinstance(codecs[0], BytesCodec) and (
            codecs[0].endian is None or codecs[0].endian.value == sys.byteorder
        )
        if ZSTD_DIRECT and native and len(codecs) == 2 and isinstance(codecs[1], ZstdCodec):
            from numcodecs.zstd import Zstd  # what ZstdCodec compresses with

            conf = codecs[1].to_dict()["configuration"]
            self._zstd = Zstd(level=int(conf["level"]), checksum=bool(conf["checksum"]))
        self.direct = not self.sharded or self.index_bytes is not None
        """pyshard can find the chunks in the files (a shard index of a fixed size)."""
        self.raw = native and len(codecs) == 1
        self.batched = not self.raw and self._zstd is None
        """Chunks decode through zarr-python's pipeline: many per call pay off."""
        """The inner chunks are the array's bytes as they are (``bytes`` alone, native order):
        read straight into place."""

    def encode(self, chunks: List[np.ndarray]) -> List[np.ndarray]:
        """The stored bytes (uint8) of inner chunks (each its full shape, zarr-python's
        dtype)."""
        if not chunks:
            return []
        if self._zstd is not None:
            zc = self._zstd
            return [np.frombuffer(zc.encode(_flat(a)), np.uint8) for a in chunks]
        nd = self.proto.nd_buffer
        out = self._sync(self._data.encode([(nd.from_numpy_array(a), self._spec) for a in chunks]))
        return [b.as_numpy_array() for b in out]

    def decode(self, raws: List[Any]) -> List[np.ndarray]:
        """Inner chunks (each its full shape) from their stored bytes."""
        if not raws:
            return []
        if self._zstd is not None:
            size = prod(self.inner) * self.dtype.itemsize
            out = []
            for r in raws:
                b = self._zstd.decode(r)
                if len(b) != size:
                    raise ValueError(f"a zstd chunk holds {len(b)} bytes, not {size}")
                out.append(np.frombuffer(b, self.dtype).reshape(self.inner))
            return out
        buf = self.proto.buffer
        items = [(buf.from_array_like(np.frombuffer(r, np.uint8)), self._spec) for r in raws]
        return [x.as_numpy_array() for x in self._sync(self._data.decode(items))]

    def encode_index(self, index: np.ndarray) -> np.ndarray:
        """The stored bytes of a shard index (``per + [2]`` uint64: offset, length)."""
        item = (self.proto.nd_buffer.from_numpy_array(index), self._index_spec)
        return next(iter(self._sync(self._index.encode([item])))).as_numpy_array()

    def decode_index(self, raw: Any) -> np.ndarray:
        """A shard index from its stored bytes (the index codecs check their crc32c)."""
        item = (self.proto.buffer.from_array_like(np.frombuffer(raw, np.uint8)), self._index_spec)
        x = next(iter(self._sync(self._index.decode([item]))))
        return x.as_numpy_array().reshape(self.per + (2,))

    def key(self, idx: Tuple[int, ...]) -> str:
        """The file (relative to the array's directory) of chunk or shard ``idx``."""
        if self.v2_keys:
            return self.sep.join(map(str, idx)) if idx else "0"
        return self.sep.join(("c",) + tuple(map(str, idx)))


def _flat(a: np.ndarray) -> memoryview:
    """The C-order bytes of ``a`` (a view where ``a`` is contiguous)."""
    return memoryview(np.ascontiguousarray(a).reshape(-1).view(np.uint8))


def _pread(fd: int, off: int, n: int, fname: str) -> bytes:
    parts = []
    while n > 0:
        b = os.pread(fd, n, off)
        if not b:
            raise ValueError(f"load: {fname!r}: ends before byte {off + n}")
        parts.append(b)
        off += len(b)
        n -= len(b)
    return b"".join(parts) if len(parts) != 1 else parts[0]


def _pread_into(fd: int, off: int, dst: np.ndarray, fname: str) -> None:
    mv = memoryview(dst.reshape(-1).view(np.uint8))
    while len(mv):
        k = os.preadv(fd, [mv], off)
        if k <= 0:
            raise ValueError(f"load: {fname!r}: ends before byte {off + len(mv)}")
        mv = mv[k:]
        off += k


DECODE_BATCH = 64 << 20
"""Bytes of decoded chunks asked of zarr-python's pipeline in one call (at most)."""


def _read_direct(
    e: Dict[str, Any], cd: Codecs, d: int, r0: int, r1: int, dtype: np.dtype
) -> np.ndarray:
    """Indices ``r0:r1`` of dim ``d`` read straight from the array's files: for each shard
    (or chunk, unsharded) its index, decoded and crc32c-checked by zarr-python's index
    codecs, then only the inner chunks inside the region, decoded in batches by
    zarr-python's codec pipeline (:class:`Codecs`), or, stored as plain bytes, read from the
    file into their place in the result; absent chunks and shards are the fill value."""
    shape = list(e["shape"])
    lo = [0] * len(shape)
    hi = list(shape)
    lo[d], hi[d] = r0, r1
    out = np.empty([h - a for a, h in zip(lo, hi)], dtype=cd.dtype)
    sshape, cshape = list(cd.outer), list(cd.inner)
    full = prod(cshape) * cd.dtype.itemsize
    pending: List[Tuple[bytes, np.ndarray, Tuple[slice, ...], str]] = []
    held = 0
    limit = DECODE_BATCH if cd.batched else 0  # zarr-python's pipeline: one call per batch

    def flush() -> None:
        try:
            chunks = cd.decode([p[0] for p in pending])
        except Exception as err:
            names = sorted({p[3] for p in pending})
            raise ValueError(f"load: {names[0]!r}: a chunk does not decode ({err!r})") from err
        for chunk, (_, dst, src, fname) in zip(chunks, pending):
            if list(chunk.shape) != cshape:
                raise ValueError(
                    f"load: {fname!r}: a chunk decodes to shape {list(chunk.shape)}, not "
                    f"{cshape}"
                )
            dst[...] = chunk[src]
        pending.clear()

    shards = [range(a // s, -(-b // s)) for a, b, s in zip(lo, hi, sshape)]
    for sidx in itertools.product(*shards):
        s_lo = [i * s for i, s in zip(sidx, sshape)]
        s_hi = [min(a + s, n) for a, s, n in zip(s_lo, sshape, shape)]
        fname = os.path.join(e["file"], *cd.key(sidx).split("/"))
        try:
            fd = os.open(fname, os.O_RDONLY)
        except FileNotFoundError:  # never written: the fill value
            part = zip(s_lo, s_hi, lo, hi)
            out[tuple(slice(max(a, x) - x, min(b, y) - x) for a, b, x, y in part)] = cd.fill
            continue
        try:
            size = os.fstat(fd).st_size
            if cd.sharded:
                nidx = int(cd.index_bytes or 0)
                if size < nidx:
                    raise ValueError(f"load: {fname!r}: a shard shorter than its index")
                at = size - nidx if cd.index_at_end else 0
                try:
                    index = cd.decode_index(_pread(fd, at, nidx, fname))
                except ValueError as err:
                    raise ValueError(
                        f"load: {fname!r}: the shard index does not pass its codecs "
                        f"{cd.index_names} ({err})"
                    ) from err
                body = (0, size - nidx) if cd.index_at_end else (nidx, size)
            else:
                index = np.array([0, size], dtype=np.uint64).reshape(cd.per + (2,))
                body = (0, size)
            ranges = [
                range((max(a, x) - a) // c, -(-(min(b, y) - a) // c))
                for a, b, x, y, c in zip(s_lo, s_hi, lo, hi, cshape)
            ]
            for cidx in itertools.product(*ranges):
                a = [sa + ci * c for sa, ci, c in zip(s_lo, cidx, cshape)]
                b = [min(x + c, m) for x, c, m in zip(a, cshape, shape)]
                ia = [max(x, o) for x, o in zip(a, lo)]  # the part inside the region read
                ib = [min(y, h) for y, h in zip(b, hi)]
                dst = out[tuple(slice(x - o, y - o) for x, y, o in zip(ia, ib, lo))]
                off, n = (int(v) for v in index[cidx])
                if off == 2**64 - 1 and n == 2**64 - 1:
                    dst[...] = cd.fill  # an absent chunk
                    continue
                if off < body[0] or off + n > body[1]:
                    raise ValueError(
                        f"load: {fname!r}: chunk {list(cidx)} lies outside the shard's data"
                    )
                if cd.raw and list(dst.shape) == cshape and dst.flags.c_contiguous:
                    if n != full:
                        raise ValueError(
                            f"load: {fname!r}: chunk {list(cidx)} holds {n} bytes, not {full}"
                        )
                    _pread_into(fd, off, dst, fname)
                    continue
                src = tuple(slice(x - c0, y - c0) for x, y, c0 in zip(ia, ib, a))
                pending.append((_pread(fd, off, n, fname), dst, src, fname))
                held += full
                if held >= limit:
                    flush()
                    held = 0
        finally:
            os.close(fd)
    flush()
    if _dtypes.is_ml(dtype):
        return out.view(dtype)
    return np.ascontiguousarray(out, dtype=dtype)


def read_rows(e: Dict[str, Any], d: int, r0: int, r1: int, dtype: np.dtype) -> np.ndarray:
    """Indices ``r0:r1`` of dim ``d`` of the array ``e`` describes (a 0-d array: its value),
    as ``dtype``: straight from its files through zarr-python's codecs
    (:func:`_read_direct`), or through a zarr-python Array where a shard index has no fixed
    size (none of zarr-python's own index codecs) or ``READ_DIRECT`` is off."""
    cd = Codecs(e["meta"]) if READ_DIRECT and e["shape"] else None
    if cd is not None and cd.direct:
        return _read_direct(e, cd, d, r0, r1, dtype)
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




def write_shards(
    root: str,
    name: str,
    meta: Dict[str, Any],
    local: np.ndarray,
    box: Tuple[slice, ...],
    sync: bool,
) -> None:
    """Write the whole shards that ``box`` covers (its edges on the shard grid) from this
    rank's ``local`` block (a 0-d array: its one chunk): per shard its inner chunks in C
    order (an edge chunk stored whole, padded with the fill value; chunks past the array's
    end left out), then the index (offset, length per chunk) and its crc32c, as the
    ``sharding_indexed`` codec lays them out, every chunk and the index encoded by
    zarr-python's codec classes (:class:`Codecs`: ``BytesCodec``, ``ZstdCodec``,
    ``Crc32cCodec``). One file per shard; this rank alone writes it."""
    cd = Codecs(meta)
    raw = np.ascontiguousarray(local)
    if raw.dtype.byteorder not in ("=", "|"):
        raw = raw.astype(raw.dtype.newbyteorder("="))  # BytesCodec stores little-endian
    if _dtypes.is_ml(raw.dtype):
        raw = raw.view(cd.dtype)  # zarr-python holds them as the unsigned int of that width
    d = os.path.join(root, *name.split("/"))
    shape = list(meta["shape"])
    if not shape:
        _put(os.path.join(d, "c"), cd.encode([raw.reshape(())]), sync)
        return
    sshape, cshape = list(cd.outer), list(cd.inner)
    per = list(cd.per)
    lo = [b.start for b in box]
    ranges = [range(b.start // s, -(-b.stop // s)) for b, s in zip(box, sshape)]
    for sidx in itertools.product(*ranges):
        where: List[Tuple[int, ...]] = []
        blocks: List[np.ndarray] = []
        for cidx in itertools.product(*[range(k) for k in per]):
            a = [si * s + ci * c for si, s, ci, c in zip(sidx, sshape, cidx, cshape)]
            if any(x >= n for x, n in zip(a, shape)):
                continue  # past the array's end: no chunk
            b = [min(x + c, n) for x, c, n in zip(a, cshape, shape)]
            block = raw[tuple(slice(x - o, y - o) for x, y, o in zip(a, b, lo))]
            if list(block.shape) != cshape:  # an edge chunk: padded with the fill value
                padded = np.full(cshape, cd.fill, dtype=raw.dtype)
                padded[tuple(slice(0, e) for e in block.shape)] = block
                block = padded
            where.append(cidx)
            blocks.append(block)
        parts = cd.encode(blocks)
        index = np.full(per + [2], np.iinfo(np.uint64).max, dtype="<u8")
        pos = 0
        for cidx, data in zip(where, parts):
            index[cidx] = (pos, data.nbytes)
            pos += data.nbytes
        parts.append(cd.encode_index(index))
        _put(os.path.join(d, *cd.key(sidx).split("/")), parts, sync)


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


