"""``save``: every array's shard written into its ``.npy`` file with MPI-IO, in a temporary
directory that rank 0 renames into place once the manifest is written.

The steps, collective over the arrays' mesh: agree that every rank describes the same
checkpoint (one allgather); rank 0 makes ``path.tmp-<token>`` and writes the headers; every
array's data (Partial arrays reduced first, one writer per replicated box); rank 0 gathers the
block checksums, writes the manifest last, and swaps the directory in for the old one.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import time
from math import prod
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np
from mpi4py import MPI

from .. import _backend as bk
from .. import _dtypes, _validate
from ..array import ShardedArray
from ..layout import Partial, Replicate, Shard
from . import hdf5_format, safetensors_format
from .errors import Error, Failure, PathArg, error, norm_path, on_root
from .manifest import (
    MANIFEST,
    build_manifest,
    crc32,
    dtype_of,
    dtype_str,
    entry,
    file_name,
    npy_header,
)
from .mpiio import box_bounds, collective_io
from .saving import check_same, fsync_dir, is_writer, record, swap_in

__all__ = ["save", "FORMATS"]

FORMATS = ("npy", "hdf5", "zarr", "safetensors")
"""The formats :func:`save` writes (``format=``); :func:`~pyshard.checkpoint.load` detects them."""

log = logging.getLogger("pyshard")

Block = Tuple[List[int], List[int], int]  # (start, shape, crc32) of a block one rank wrote


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


def _meta_json(metadata: object) -> str:
    """``metadata`` (None: empty) as canonical JSON; TypeError unless a JSON-serialisable dict."""
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, Mapping):
        raise TypeError(f"save(metadata): expected a dict, got {type(metadata).__name__}")
    try:
        return json.dumps(metadata, sort_keys=True)
    except (TypeError, ValueError) as e:
        raise TypeError(f"save(metadata): not JSON-serialisable: {e}") from e


# ----------------------------------------------------------------------------- rank 0's files


def _prepare(path: str, headers: List[Tuple[str, bytes]]) -> Tuple[str, str, str]:
    """Rank 0: check ``path``, make the temporary directory and write the .npy headers;
    (temporary directory, parent directory, token)."""
    token = secrets.token_hex(6)
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise Failure(
            error("FileNotFoundError", f"save: parent directory {parent!r} of {path!r} not found")
        )
    if os.path.lexists(path):
        ok = os.path.isdir(path) and (
            os.path.isfile(os.path.join(path, MANIFEST)) or not os.listdir(path)
        )
        if not ok:
            raise Failure(
                error(
                    "ValueError",
                    f"save: refusing to replace {path!r}: it exists and is not a pyshard "
                    f"checkpoint (no {MANIFEST}) nor an empty directory",
                )
            )
    tmp = f"{path}.tmp-{token}"
    os.mkdir(tmp)
    for fname, hdr in headers:
        with open(os.path.join(tmp, fname), "wb") as f:
            f.write(hdr)
    return tmp, parent, token


def _commit(
    path: str, tmp: str, parent: str, token: str, manifest: dict, sync: bool
) -> None:
    """Rank 0: write the manifest last, then swap the new directory in for the old one."""
    mpath = os.path.join(tmp, MANIFEST)
    with open(mpath + ".part", "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1, sort_keys=False)
        f.write("\n")
        f.flush()
        if sync:
            os.fsync(f.fileno())
    os.replace(mpath + ".part", mpath)
    if sync:
        fsync_dir(tmp)
    swap_in(tmp, path, parent, token, sync)


# ----------------------------------------------------------------------------- data


def _write_array(
    comm: MPI.Comm,
    x: ShardedArray,
    fname: str,
    disp: int,
    size: Optional[int],
    sync: bool,
) -> Optional[Block]:
    """Write one array's data at byte ``disp`` of ``fname`` (C order, as in a .npy file);
    collective over ``comm`` (a Partial array is reduced first, one collective). ``size``:
    the file size to set first (None: leave it). This rank's (start, shape, crc32) block if
    it wrote one."""
    if x.layout.partial_mesh_dims():
        target = [Replicate() if isinstance(p, Partial) else p for p in x.placements]
        x = x.redistribute(target, sizes=x.layout.sizes)
    lay = x.layout
    start, ext = box_bounds(lay, x.mesh.coords)
    writes = is_writer(lay, x.mesh.coords) and prod(ext) > 0
    box = (start, ext, writes)
    local = bk.to_host(x.local)  # MPI-IO writes host memory: a GPU shard is copied down once
    collective_io(comm, fname, lay, disp, box, local, write=True, size=size, sync=sync)
    return (start, ext, crc32(local)) if writes else None


def _write_data(
    comm: MPI.Comm,
    items: List[Tuple[str, ShardedArray]],
    entries: Dict[str, Dict[str, Any]],
    headers: List[Tuple[str, bytes]],
    tmp: str,
    sync: bool,
) -> Dict[str, List[Block]]:
    """Write every array into ``tmp`` (collective, in name order); this rank's blocks."""
    blocks: Dict[str, List[Block]] = {}
    for (name, x), (_, hdr) in zip(items, headers):
        fname = os.path.join(tmp, entries[name]["file"])
        size = len(hdr) + entries[name]["nbytes"]
        block = _write_array(comm, x, fname, len(hdr), size, sync)
        if block is not None:
            blocks[name] = [block]
    return blocks


def _finish(
    comm: MPI.Comm,
    path: str,
    prep: Tuple[str, str, str],
    entries: Dict[str, Dict[str, Any]],
    blocks: Dict[str, list],
    meta_json: str,
    sync: bool,
) -> None:
    """Every rank has closed its files: rank 0 gathers the checksums, writes the manifest and
    renames (a gather and a bcast on every rank); a failure removes the temporary directory."""
    tmp, parent, token = prep
    size = comm.Get_size()
    gathered = comm.gather(blocks, root=0)

    def commit() -> None:
        try:
            manifest = build_manifest(entries, gathered, size, meta_json)
            _commit(path, tmp, parent, token, manifest, sync)
        except Exception:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    def failed(e: Exception) -> Error:
        return error("ValueError", f"save({path!r}): cannot write or rename: {e}")

    on_root(comm, commit, failed)


# ----------------------------------------------------------------------------- one-file formats


def check_target(path: str, is_format: Any, what: str) -> str:
    """Rank 0: the parent directory of ``path`` (a one-file checkpoint); ``path`` may be
    missing or a file of this format (``is_format(path)``), nothing else."""
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise Failure(
            error("FileNotFoundError", f"save: parent directory {parent!r} of {path!r} not found")
        )
    if os.path.lexists(path) and not (os.path.isfile(path) and is_format(path)):
        raise Failure(
            error("ValueError", f"save: refusing to replace {path!r}: it exists and is not {what}")
        )
    return parent


def _prepare_file(
    path: str, fmt: str, items: List[Tuple[str, ShardedArray]], rec: str
) -> Tuple[str, str, Dict[str, Optional[int]], Optional[int]]:
    """Rank 0: write ``path.tmp-<token>`` up to the data (the safetensors header, or the HDF5
    file with its datasets allocated); (temporary file, parent, data offsets, file size to
    set or None)."""
    if fmt == "hdf5":
        parent = check_target(path, hdf5_format.is_hdf5, "an HDF5 file")
    else:
        parent = check_target(path, safetensors_format.is_safetensors, "a safetensors file")
    tmp = f"{path}.tmp-{secrets.token_hex(6)}"
    try:
        if fmt == "hdf5":
            tensors = [
                (
                    n,
                    tuple(x.global_shape),
                    x.dtype,
                    {"pyshard_dtype": dtype_str(x.dtype)} if _dtypes.is_ml(x.dtype) else {},
                )
                for n, x in items
            ]
            offsets = hdf5_format.create(tmp, tensors, rec)
            return tmp, parent, offsets, None
        meta = {"pyshard": rec}
        user = json.loads(rec)["metadata"]
        meta.update({k: v for k, v in user.items() if isinstance(v, str) and k != "pyshard"})
        hdr, offs = safetensors_format.build_header(
            [(n, tuple(x.global_shape), x.dtype) for n, x in items], meta
        )
        with open(tmp, "wb") as f:
            f.write(hdr)
        total = len(hdr) + sum(prod(x.global_shape) * x.dtype.itemsize for _, x in items)
        return tmp, parent, dict(offs), total
    except BaseException:
        if os.path.lexists(tmp):
            os.remove(tmp)
        raise


def _finish_file(
    comm: MPI.Comm, path: str, tmp: str, parent: str, bad: Optional[str], sync: bool
) -> None:
    """Every rank has closed the file: agree on write errors (one allgather), then rank 0
    fsyncs it and renames it over ``path`` (a bcast); a failure removes the temporary file
    and raises the same error on every rank."""
    bad = next((v for v in comm.allgather(bad) if v is not None), None)

    def commit() -> None:
        try:
            if bad is not None:
                raise Failure(error("ValueError", bad))
            if sync:
                fd = os.open(tmp, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            os.rename(tmp, path)  # atomic: the previous file stays whole until this instant
        except Exception:
            if os.path.lexists(tmp):
                os.remove(tmp)
            raise
        if sync:
            fsync_dir(parent)

    def failed(e: Exception) -> Error:
        return error("ValueError", f"save({path!r}): cannot write or rename: {e}")

    on_root(comm, commit, failed)


def _save_file(
    comm: MPI.Comm,
    path: str,
    fmt: str,
    items: List[Tuple[str, ShardedArray]],
    meta_json: str,
    sync: bool,
) -> None:
    """A one-file checkpoint (HDF5 or safetensors); collective over ``comm``. Rank 0 writes
    everything but the data into a temporary file; each array is redistributed to run
    ownership (:func:`_runs`) and every rank writes its one contiguous run at its offset
    with independent MPI-IO; rank 0 renames the file into place."""
    entries = {n: entry(x.layout, "") for n, x in items}
    check_same(comm, path, meta_json + fmt, entries)
    rec = json.dumps(record(items, meta_json, comm.Get_size()), sort_keys=True)
    tmp, parent, offsets, _size = on_root(
        comm,
        lambda: _prepare_file(path, fmt, items, rec),
        lambda e: error("ValueError", f"save({path!r}): cannot prepare {path!r}: {e}"),
    )
    bad: Optional[str] = None
    for name, x in items:
        off = offsets[name]
        if off is None or not entries[name]["nbytes"]:
            continue  # no bytes: the same on every rank (the shape is shared)
        y = _runs(x)  # collective: every rank takes part even after a failed write
        if bad is None:
            try:
                _write_runs(y, tmp, off, sync)
            except Exception as e:  # agreed in _finish_file, before the rename
                bad = f"save({path!r}): array {name!r}: rank {comm.Get_rank()}: {e!r}"
    _finish_file(comm, path, tmp, parent, bad, sync)


def _runs(x: ShardedArray) -> ShardedArray:
    """``x`` in a layout of run ownership: every writer's box one contiguous run of the file
    (C order). A layout that shards dim 0 alone already is one (Partial dims reduced to
    Replicate, one replica writes); any other is redistributed to ``Shard(0)`` over every
    mesh dim, balanced. A 0-d array: reduced to one value everywhere. Collective."""
    lay = x.layout
    rows_only = all(
        isinstance(p, (Replicate, Partial)) or (isinstance(p, Shard) and p.dim == 0)
        for p in lay.placements
    )
    if lay.ndim == 0 or rows_only:
        if lay.partial_mesh_dims():
            plain = [Replicate() if isinstance(p, Partial) else p for p in lay.placements]
            return x.redistribute(plain, sizes=lay.sizes)
        return x
    return x.redistribute([Shard(0)] * len(lay.mesh_shape))


def _write_runs(y: ShardedArray, fname: str, disp: int, sync: bool) -> None:
    """Write this rank's run of ``y`` (a :func:`_runs` layout) at byte ``disp`` of ``fname``
    with independent MPI-IO (``COMM_SELF``), if it is the writer of its box."""
    lay = y.layout
    if not is_writer(lay, y.mesh.coords):
        return  # a replica: coordinate 0 of the same box writes it
    start = lay.box(y.mesh.coords)[0].start if lay.ndim else 0
    local = bk.to_host(y.local)
    data = np.ascontiguousarray(local).reshape(-1).view(np.uint8)  # ml_dtypes: bytes
    if not data.size:
        return
    row = lay.dtype.itemsize * prod(lay.shape[1:])
    fh = MPI.File.Open(MPI.COMM_SELF, fname, MPI.MODE_WRONLY)
    try:
        fh.Write_at(disp + start * row, [data, MPI.BYTE])
        if sync:
            fh.Sync()
    finally:
        fh.Close()


def save(
    path: PathArg,
    arrays: Mapping[str, ShardedArray],
    metadata: Optional[Mapping[str, Any]] = None,
    *,
    format: str = "npy",
    compression: Optional[str] = None,
    sync: bool = True,
) -> None:
    """Save sharded arrays as a checkpoint directory at ``path``; collective over their mesh.

    path: the checkpoint directory. It is written as ``path.tmp-<random>`` next to it and
    renamed into place after every rank has finished, replacing an earlier checkpoint at
    ``path`` only then; a save that dies midway leaves the earlier one intact.
    arrays: name -> ShardedArray, all on meshes over the same communicator. Partial arrays
    are reduced first (one collective each); of replicated copies exactly one rank writes.
    metadata: a JSON-serialisable dict kept in the manifest (see :func:`checkpoint_info`).
    sync: fsync the data, the manifest and the directory before the rename (default True).

    format: ``"npy"`` (the default: the directory above), ``"hdf5"`` (one HDF5 file at
    ``path``, one contiguous dataset per array; needs h5py, ``pip install 'pyshard[hdf5]'``),
    ``"safetensors"`` (one safetensors file at ``path``; needs no package) or ``"zarr"``
    (a Zarr v3 group directory at ``path``, one sharded array per name; needs zarr-python,
    ``pip install 'pyshard[zarr]'``). See docs/checkpoints.md for what each stores.
    compression: ``None`` or ``"zstd"`` (level 1) for the inner chunks of a Zarr save; the
    other formats store raw bytes.

    Every rank must pass the same names, layouts, path, metadata and format.
    """
    t0 = time.perf_counter()
    path = norm_path(path, "save")
    if format not in FORMATS:
        raise ValueError(f"save(format): expected one of {FORMATS}, got {format!r}")
    if compression not in (None, "zstd") or (compression is not None and format != "zarr"):
        raise ValueError(
            f"save(compression): None, or 'zstd' with format='zarr'; got {compression!r} "
            f"with format={format!r}"
        )
    items = _check_arrays(arrays)
    meta_json = _meta_json(metadata)
    if format == "hdf5":
        hdf5_format.need("save(format='hdf5')")
        for name, x in items:
            hdf5_format.check_name(name)
            hdf5_format.stored_dtype(x.dtype)
    elif format == "safetensors":
        for name, x in items:
            safetensors_format.code_of(x.dtype, f"save(arrays[{name!r}])")
    elif format == "zarr":
        from . import zarr_format

        zarr_format.need("save(format='zarr')")
        for name, x in items:
            zarr_format.check_name(name)
            zarr_format.data_type(x.dtype, f"save(arrays[{name!r}])")
    comm = items[0][1].mesh.comm
    if _validate.enabled:
        layouts = ", ".join(f"{n}: {x.layout!r}" for n, x in items)
        _validate.agree(comm, "save", {"path": repr(path), "arrays": layouts})
    rank, size = comm.Get_rank(), comm.Get_size()
    if format != "npy":
        if format == "zarr":
            from .zarr_format import save_zarr

            save_zarr(comm, path, items, meta_json, sync, compression)
        else:
            _save_file(comm, path, format, items, meta_json, sync)
        if rank == 0:
            log.info(
                "pyshard: saved %d array(s) as %s to %s from %d rank(s) in %.3f s",
                len(items), format, path, size, time.perf_counter() - t0,
            )
        return
    taken: set = set()
    entries = {name: entry(x.layout, file_name(name, taken)) for name, x in items}
    headers = [
        (e["file"], npy_header(tuple(e["shape"]), dtype_of(e, "save"))) for e in entries.values()
    ]
    check_same(comm, path, meta_json, entries)
    # rank 0 makes the temporary directory and writes the headers; everyone learns the result
    prep = on_root(
        comm,
        lambda: _prepare(path, headers),
        lambda e: error("ValueError", f"save({path!r}): cannot prepare {path!r}: {e}"),
    )
    blocks = _write_data(comm, items, entries, headers, prep[0], sync)
    _finish(comm, path, prep, entries, blocks, meta_json, sync)
    if rank == 0:
        log.info(
            "pyshard: saved %d array(s), %d bytes, to %s from %d rank(s) in %.3f s",
            len(entries),
            sum(e["nbytes"] for e in entries.values()),
            path,
            size,
            time.perf_counter() - t0,
        )
