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
import zlib
from math import prod
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from mpi4py import MPI

from .. import _backend as bk
from .. import _validate
from ..array import ShardedArray
from ..layout import Layout, Partial, Replicate, Shard
from .errors import Error, Failure, PathArg, error, norm_path, on_root
from .manifest import MANIFEST, build_manifest, crc32, dtype_of, entry, file_name, npy_header
from .mpiio import box_bounds, collective_io

__all__ = ["save"]

log = logging.getLogger("pyshard")

Block = Tuple[List[int], List[int], int]  # (start, shape, crc32) of a block one rank wrote


def _is_writer(layout: Layout, coords: Sequence[int]) -> bool:
    """The one replica that writes a box: coordinate 0 on every mesh dim that does not shard."""
    return all(c == 0 for c, p in zip(coords, layout.placements) if not isinstance(p, Shard))


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


def _check_same(comm: MPI.Comm, path: str, meta_json: str, entries: Dict[str, Any]) -> None:
    """Every rank must describe the same checkpoint: one small allgather agrees on it."""
    digest = zlib.crc32(json.dumps([path, meta_json, entries], sort_keys=True).encode())
    digests = comm.allgather(digest)
    if len(set(digests)) != 1:
        bad = [r for r, d in enumerate(digests) if d != digests[0]]
        raise ValueError(
            f"save({path!r}): ranks {bad} pass other names, layouts, path or metadata than "
            f"rank 0; every rank must pass the same"
        )


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
        _fsync_dir(tmp)
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
        _fsync_dir(parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _fsync_dir(d: str) -> None:
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


# ----------------------------------------------------------------------------- data


def _write_array(
    comm: MPI.Comm, x: ShardedArray, fname: str, hdr: bytes, nbytes: int, sync: bool
) -> Optional[Block]:
    """Write one array's data after its header; collective over ``comm`` (a Partial array is
    reduced first, one collective). This rank's (start, shape, crc32) block if it wrote one."""
    if x.layout.partial_mesh_dims():
        target = [Replicate() if isinstance(p, Partial) else p for p in x.placements]
        x = x.redistribute(target, sizes=x.layout.sizes)
    lay = x.layout
    start, ext = box_bounds(lay, x.mesh.coords)
    writes = _is_writer(lay, x.mesh.coords) and prod(ext) > 0
    box = (start, ext, writes)
    local = bk.to_host(x.local)  # MPI-IO writes host memory: a GPU shard is copied down once
    collective_io(
        comm, fname, lay, len(hdr), box, local, write=True, size=len(hdr) + nbytes, sync=sync
    )
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
        block = _write_array(comm, x, fname, hdr, entries[name]["nbytes"], sync)
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


def save(
    path: PathArg,
    arrays: Mapping[str, ShardedArray],
    metadata: Optional[Mapping[str, Any]] = None,
    *,
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

    Every rank must pass the same names, layouts, path and metadata.
    """
    t0 = time.perf_counter()
    path = norm_path(path, "save")
    items = _check_arrays(arrays)
    meta_json = _meta_json(metadata)
    comm = items[0][1].mesh.comm
    if _validate.enabled:
        layouts = ", ".join(f"{n}: {x.layout!r}" for n, x in items)
        _validate.agree(comm, "save", {"path": repr(path), "arrays": layouts})
    rank, size = comm.Get_rank(), comm.Get_size()
    taken: set = set()
    entries = {name: entry(x.layout, file_name(name, taken)) for name, x in items}
    headers = [
        (e["file"], npy_header(tuple(e["shape"]), dtype_of(e, "save"))) for e in entries.values()
    ]
    _check_same(comm, path, meta_json, entries)
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
