"""pyshard's own format: a directory with one standard ``.npy`` file per array (``numpy.load``
opens it and gives the global array) and ``manifest.json``, written last, with the layouts
and a crc32 per saved block (:mod:`~pyshard.checkpoint.manifest`).

A save: rank 0 makes ``path.tmp-<token>`` and writes the ``.npy`` headers; every array's data
is written with one MPI-IO collective write through subarray file views (Partial arrays
reduced first, one writer per replicated box); rank 0 gathers the block checksums, writes
the manifest and swaps the directory in for the old one. A load reads the arrays through
the reader's raw paths after rank 0 has checked every file (present, header, size); with
``verify`` the saved blocks are re-read round robin over the ranks and their crc32 checked.
"""

from __future__ import annotations

import json
import os
from math import prod
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from .. import _backend as bk
from ..array import ShardedArray
from ..layout import Partial, Replicate
from . import saving
from .driver import Arrays, Facts, Format, Items
from .errors import agree
from .manifest import (
    MANIFEST,
    build_manifest,
    crc32,
    dtype_of,
    entry,
    file_name,
    npy_header,
    read_manifest,
    read_npy_header,
)
from .mpiio import box_bounds, collective_io
from .record import layout_of

__all__ = ["NpyFormat"]

Block = Tuple[List[int], List[int], int]  # (start, shape, crc32) of a block one rank wrote


def _write_array(
    comm: Any,
    x: ShardedArray,
    fname: str,
    disp: int,
    size: Optional[int],
    sync: bool,
    idle: bool = False,
) -> Optional[Block]:
    """Write one array's data at byte ``disp`` of ``fname`` (C order, as in a .npy file);
    collective over ``comm`` (a Partial array is reduced first, one collective). ``size``:
    the file size to set first (None: leave it). ``idle``: this rank has already failed a
    write of this save; it takes part in every collective with an empty box and writes
    nothing. This rank's (start, shape, crc32) block if it wrote one."""
    if x.layout.partial_mesh_dims():
        target = [Replicate() if isinstance(p, Partial) else p for p in x.placements]
        x = x.redistribute(target, sizes=x.layout.sizes)
    lay = x.layout
    start, ext = box_bounds(lay, x.mesh.coords)
    writes = not idle and saving.is_writer(lay, x.mesh.coords) and prod(ext) > 0
    local = np.empty(0, np.uint8)
    failed: Optional[BaseException] = None
    if writes:
        try:  # MPI-IO writes host memory: a GPU shard is copied down once
            local = np.ascontiguousarray(bk.to_host(x.local))
        except Exception as e:  # still take part in the collective write (an empty box)
            failed, writes = e, False
    collective_io(comm, fname, lay, disp, (start, ext, writes), local, write=True, size=size,
                  sync=sync)
    if failed is not None:
        raise failed
    return (start, ext, crc32(local)) if writes else None


def _write_manifest(tmp: str, manifest: Dict[str, Any], sync: bool) -> None:
    """Rank 0: write the manifest into ``tmp`` (under another name, then renamed: a manifest
    is whole or absent)."""
    mpath = os.path.join(tmp, MANIFEST)
    with open(mpath + ".part", "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1, sort_keys=False)
        f.write("\n")
        f.flush()
        if sync:
            os.fsync(f.fileno())
    os.replace(mpath + ".part", mpath)
    if sync:
        saving.fsync_dir(tmp)


def _check_file(path: str, name: str, e: Dict[str, Any]) -> int:
    """Rank 0: check array ``name``'s file (present, header, size; manifest entry ``e``); its
    data offset."""
    mpath = os.path.join(path, MANIFEST)
    fname = os.path.join(path, e["file"])
    if not os.path.isfile(fname):
        raise FileNotFoundError(f"load: array {name!r}: its file {fname!r} is missing")
    shape, dtype, fortran, offset = read_npy_header(fname)
    want_shape, want_dtype = tuple(e["shape"]), dtype_of(e)
    if shape != want_shape or dtype != want_dtype or fortran:
        raise ValueError(
            f"load: {fname!r} holds a {'Fortran-order ' if fortran else ''}{shape} {dtype} "
            f"array, but {mpath!r} says array {name!r} is {want_shape} {want_dtype}"
        )
    have = os.path.getsize(fname)
    want = offset + int(e["nbytes"])
    if have != want:
        what = "truncated" if have < want else "longer than expected"
        raise ValueError(
            f"load: {fname!r} is {what}: {have} bytes, expected {want} "
            f"({offset} header + {e['nbytes']} data) for array {name!r}"
        )
    blocks = e["checksum"]["blocks"]
    covered = sum(prod(b["shape"]) for b in blocks)
    if covered != prod(want_shape):
        raise ValueError(
            f"load: {mpath!r}: the checksummed blocks of array {name!r} cover {covered} of "
            f"{prod(want_shape)} elements"
        )
    return offset


def _verify(path: str, arrays: Arrays, rank: int, size: int) -> Optional[str]:
    """Re-read this rank's round-robin share of the saved blocks and check their crc32."""
    k = 0
    for name in sorted(arrays):
        e = arrays[name]["npy"]
        fname = os.path.join(path, e["file"])
        mm = None
        for b in e["checksum"]["blocks"]:
            mine = k % size == rank
            k += 1
            if not mine:
                continue
            if mm is None:
                mm = np.memmap(
                    fname,
                    dtype=dtype_of(e),
                    mode="r",
                    offset=arrays[name]["offset"],
                    shape=tuple(e["shape"]),
                )
            box = tuple(slice(s, s + n) for s, n in zip(b["start"], b["shape"]))
            got = crc32(mm[box + (Ellipsis,)])  # a 0-d box gives a native-order scalar
            if got != int(b["crc32"]):
                return (
                    f"load: checksum mismatch in {fname!r} (array {name!r}, block at "
                    f"{b['start']} of shape {b['shape']}: crc32 {got:#010x}, manifest says "
                    f"{int(b['crc32']):#010x}): the file is corrupt"
                )
        del mm
    return None


class NpyFormat(Format):
    """A directory of ``.npy`` files and ``manifest.json``."""

    name = "npy"
    label = ".npy"
    target = f"a pyshard checkpoint (no {MANIFEST}) nor an empty directory"

    def probe(self, path: str) -> bool:
        return os.path.isfile(os.path.join(path, MANIFEST))

    def replaceable(self, path: str) -> bool:
        return os.path.isdir(path) and (
            os.path.isfile(os.path.join(path, MANIFEST)) or not os.listdir(path)
        )

    def describe(self, path: str, what: str) -> Tuple[Arrays, Facts]:
        m = read_manifest(path, what)
        arrays = {}
        for name, e in m["arrays"].items():
            arrays[name] = {
                "shape": tuple(int(s) for s in e["shape"]),
                "dtype": dtype_of(e, what),
                "nbytes": int(e["nbytes"]),
                "file": os.path.join(path, e["file"]),
                "info_file": e["file"],
                "kind": "raw",
                "offset": None,  # after the .npy header: check_arrays reads it
                "npy": e,
                **layout_of(m, name),
            }
        facts = {k: m.get(k) for k in ("version", "ranks", "created")}
        facts["metadata"] = m.get("metadata", {})
        return arrays, facts

    def check_arrays(self, path: str, arrays: Arrays, missing_as_fill: bool = False) -> Arrays:
        for name, a in arrays.items():
            a["offset"] = _check_file(path, name, a["npy"])
        return arrays

    def verify(self, comm: Any, path: str, arrays: Arrays) -> None:
        """Each rank checks its share of the saved blocks; one allgather of the verdicts,
        and every rank raises the first mismatch."""
        try:
            bad = _verify(path, arrays, comm.Get_rank(), comm.Get_size())
        except Exception as e:  # a verdict from every rank, whatever happened
            bad = f"load: cannot verify {path!r}: {e!r}"
        bad = agree(comm, bad)
        if bad is not None:
            raise ValueError(bad)

    def save(
        self,
        comm: Any,
        path: str,
        items: Items,
        meta_json: str,
        sync: bool,
        compression: Optional[str],
    ) -> None:
        taken: set = set()
        entries = {name: entry(x.layout, file_name(name, taken)) for name, x in items}
        headers = [
            (e["file"], npy_header(tuple(e["shape"]), dtype_of(e, "save")))
            for e in entries.values()
        ]

        def prepare() -> Tuple[str, str, str]:
            """Rank 0: check ``path``, make the temporary directory, write the headers."""
            parent = saving.check_target(path, self)
            tmp, token = saving.temporary(path)
            os.mkdir(tmp)
            try:
                for fname, hdr in headers:
                    with open(os.path.join(tmp, fname), "wb") as f:
                        f.write(hdr)
            except BaseException:
                saving.remove(tmp)
                raise
            return tmp, parent, token

        tmp, parent, token = saving.prepare(comm, path, prepare)
        blocks: Dict[str, List[Block]] = {}
        bad: Optional[str] = None
        for (name, x), (_, hdr) in zip(items, headers):  # collective, in name order
            fname = os.path.join(tmp, entries[name]["file"])
            size = len(hdr) + entries[name]["nbytes"]
            # after a failed write this rank still takes part in every collective (an empty
            # box), so that no rank waits; the verdicts are agreed in finish, before the
            # manifest and the rename
            try:
                block = _write_array(comm, x, fname, len(hdr), size, sync, idle=bad is not None)
            except Exception as e:
                if bad is None:
                    bad = saving.write_error(path, name, comm.Get_rank(), e)
                block = None
            if block is not None:
                blocks[name] = [block]

        def commit(gathered: List[Any]) -> None:
            manifest = build_manifest(entries, gathered, comm.Get_size(), meta_json)
            _write_manifest(tmp, manifest, sync)
            saving.swap_in(tmp, path, parent, token, sync)

        saving.finish(comm, path, tmp, bad, blocks, commit)
