"""A Zarr v3 checkpoint saved (:func:`save`): each array redistributed to its shard-aligned
layout, every rank writing its whole shard files itself (:func:`write_shards`), rank 0
writing every ``zarr.json`` last and renaming the directory into place."""

from __future__ import annotations

import itertools
import json
import os
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from .. import _backend as bk
from .. import _dtypes
from ..layout import Partial, Replicate, Shard, split_sizes
from . import saving
from .driver import Format, Items
from .record import record
from .zarr_codecs import Codecs
from .zarr_meta import array_meta, regular_shards


def save(
    fmt: Format,
    comm: Any,
    path: str,
    items: Items,
    meta_json: str,
    sync: bool,
    compression: Optional[str] = None,
) -> None:
    """A Zarr v3 checkpoint of format ``fmt``; collective over ``comm``. Rank 0 makes
    ``path.tmp-<token>``; each array is redistributed to its shard-aligned layout and every
    rank writes its whole shards; rank 0 writes every ``zarr.json`` last and renames."""
    parts = comm.Get_size()
    rec = record(items, meta_json, parts)
    shards = {n: regular_shards(x.layout) for n, x in items}
    metas = {
        n: array_meta(tuple(x.global_shape), x.dtype, parts, compression, shards[n])
        for n, x in items
    }

    def prepare() -> Tuple[str, str, str]:
        parent = saving.check_target(path, fmt)
        tmp, token = saving.temporary(path)
        os.mkdir(tmp)
        return tmp, parent, token

    tmp, parent, token = saving.prepare(comm, path, prepare)
    bad = None
    for name, x in items:
        meta = metas[name]
        try:  # collective (the redistributes): an error, raised alike on every rank (its
            # checks read shared layouts), is agreed in finish as a write error, which
            # removes the temporary directory and names the array, as the npy save does
            lay = x.layout
            if lay.ndim and shards[name] is not None:
                # the source's boxes are the shard grid: one replica of each box writes it
                if lay.partial_mesh_dims():
                    plain = [Replicate() if isinstance(p, Partial) else p for p in x.placements]
                    x = x.redistribute(plain, sizes=lay.sizes)
                box = x.layout.box(x.mesh.coords)
                local = bk.to_host(x.local)  # (a cupy shard: its host copy)
                mine = local.size > 0 and saving.is_writer(x.layout, x.mesh.coords)
            elif lay.ndim:
                s0 = meta["chunk_grid"]["configuration"]["chunk_shape"][0]
                ext = split_sizes(lay.shape[0], parts, grain=s0)
                target = [Shard(0)] * len(lay.mesh_shape)
                y = x.redistribute(target, sizes={0: list(ext)})
                box = y.layout.box(y.mesh.coords)
                local = bk.to_host(y.local)
                mine = local.size > 0
            else:  # 0-d: rank 0 writes the one chunk
                if lay.partial_mesh_dims():
                    plain = [Replicate() if isinstance(p, Partial) else p for p in x.placements]
                    x = x.redistribute(plain)
                local = bk.to_host(x.local).reshape(())
                box = ()
                mine = comm.Get_rank() == 0
        except Exception as e:
            if bad is None:
                bad = saving.write_error(path, name, comm.Get_rank(), e)
            continue
        if mine and bad is None:
            try:
                write_shards(tmp, name, meta, local, box, sync)
            except Exception as e:  # agreed in finish, before the metadata is written
                bad = saving.write_error(path, name, comm.Get_rank(), e)

    def commit(_: List[Any]) -> None:
        """Rank 0: every ``zarr.json`` (the arrays', nested names' groups, the root group with
        the record), the fsyncs, the rename."""
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
                saving.fsync_dir(d)
        saving.swap_in(tmp, path, parent, token, sync)

    saving.finish(comm, path, tmp, bad, None, commit)


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
