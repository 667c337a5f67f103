"""zarr-python's own codecs of one Zarr array (:class:`Codecs`): the bytes of every inner
chunk and shard index pyshard writes or reads are encoded and decoded by them, while pyshard
lays out and reads the shard files itself."""

from __future__ import annotations

import sys
from math import prod
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from .. import config
from .zarr_meta import as_zarr_python, need

# PYSHARD_ZARR_NUMCODECS_ZSTD (on by default): chunks whose codecs are ``bytes`` (native order)
# then ``zstd`` go through numcodecs' ``Zstd`` (what zarr-python's ``ZstdCodec`` compresses
# with, configured from that codec's own level and checksum) rather than zarr-python's
# pipeline, whose ``ZstdCodec`` hands every chunk to a thread (``asyncio.to_thread``): with as
# many ranks as cores the pipeline measured 1.3-1.5x slower to save and about 2x slower to
# load here. The bytes are the same.


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

        md = ArrayV3Metadata.from_dict(as_zarr_python(meta))
        self._sync = sync
        self.proto = default_buffer_prototype()
        self.dtype = np.dtype(md.data_type.to_native_dtype())
        """The numpy dtype zarr-python holds the array in (uintN for bfloat16 and float8)."""
        self.fill = np.array(md.fill_value, dtype=self.dtype)
        self.outer = tuple(md.chunk_grid.chunk_shape)  # type: ignore[attr-defined]
        self.sep = md.chunk_key_encoding.separator  # type: ignore[attr-defined]
        self.v2_keys = md.chunk_key_encoding.name == "v2"  # type: ignore[attr-defined]
        array_config = ArrayConfig(order="C", write_empty_chunks=True)
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
                config=array_config,
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
            config=array_config,
            prototype=self.proto,
        )
        self._data = pipeline.from_codecs(codecs)
        self._zstd = None
        native = isinstance(codecs[0], BytesCodec) and (
            codecs[0].endian is None or codecs[0].endian.value == sys.byteorder
        )
        zstd = len(codecs) == 2 and isinstance(codecs[1], ZstdCodec)
        if config.get("PYSHARD_ZARR_NUMCODECS_ZSTD") and native and zstd:
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
