"""Blocks of a Zarr v3 array read for a load (:func:`read_rows`): straight from its shard and
chunk files, each shard's index and chunks decoded by zarr-python's codecs
(:class:`~pyshard.checkpoint.zarr_codecs.Codecs`), or through a zarr-python Array."""

from __future__ import annotations

import itertools
import os
from math import prod
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from .. import _dtypes, config
from .zarr_codecs import Codecs
from .zarr_meta import open_array


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


def missing_shard(e: Dict[str, Any]) -> Optional[str]:
    """The first shard (or chunk) file of the array ``e`` describes that is not there, or
    None: one file per cell of its chunk grid (a 0-d array: its one chunk; an array with no
    element: none). For pyshard's own arrays (``e["saved"]``), whose save wrote every
    shard; another tool's missing chunk is the fill value."""
    shape = list(e["shape"])
    if 0 in shape:
        return None
    cd = Codecs(e["meta"])
    grid = [range(-(-n // s)) for n, s in zip(shape, cd.outer)]
    for idx in itertools.product(*grid):
        fname = os.path.join(e["file"], *cd.key(tuple(idx)).split("/"))
        if not os.path.isfile(fname):
            return fname
    return None


def read_direct(
    e: Dict[str, Any], cd: Codecs, d: int, r0: int, r1: int, dtype: np.dtype
) -> np.ndarray:
    """Indices ``r0:r1`` of dim ``d`` read straight from the array's files: for each shard
    (or chunk, unsharded) its index, decoded and crc32c-checked by zarr-python's index
    codecs, then only the inner chunks inside the region, decoded in batches by
    zarr-python's codec pipeline (:class:`Codecs`), or, stored as plain bytes, read from the
    file into their place in the result; absent chunks and shards are the fill value (for
    pyshard's own arrays, ``e["saved"]``, a missing shard file raises ValueError)."""
    shape = list(e["shape"])
    lo = [0] * len(shape)
    hi = list(shape)
    lo[d], hi[d] = r0, r1
    out = np.empty([h - a for a, h in zip(lo, hi)], dtype=cd.dtype)
    sshape, cshape = list(cd.outer), list(cd.inner)
    full = prod(cshape) * cd.dtype.itemsize
    pending: List[Tuple[bytes, np.ndarray, Tuple[slice, ...], str]] = []
    held = 0
    # zarr-python's pipeline: one call per batch of at most this many decoded bytes
    limit = int(config.get("PYSHARD_ZARR_DECODE_BYTES")) if cd.batched else 0

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
            if e.get("saved"):  # pyshard's save wrote every shard (checked on rank 0 first)
                raise ValueError(
                    f"load: {fname!r}: a shard file of a pyshard checkpoint is missing "
                    f"(removed since the load checked it)"
                ) from None
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
    (:func:`read_direct`), or through a zarr-python Array where a shard index has no fixed
    size (none of zarr-python's own index codecs) or ``PYSHARD_ZARR_DIRECT`` is off."""
    cd = Codecs(e["meta"]) if config.get("PYSHARD_ZARR_DIRECT") and e["shape"] else None
    if cd is not None and cd.direct:
        return read_direct(e, cd, d, r0, r1, dtype)
    arr = open_array(e["file"], "", e["meta"])
    a = arr[()] if not e["shape"] else arr[(slice(None),) * d + (slice(r0, r1),)]
    a = np.asarray(a)
    if _dtypes.is_ml(dtype):
        return np.ascontiguousarray(a).view(dtype)
    return np.ascontiguousarray(a, dtype=dtype)
