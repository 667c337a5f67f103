"""``load``: arrays of a checkpoint read with MPI-IO into any layout on any mesh.

Rank 0 reads the manifest and checks every named array's file (present, header, size); every
rank learns its verdict. With ``verify`` the saved blocks are re-read round robin over the
ranks and their crc32 checked (one allgather of the verdicts); then each array is one
collective read of every rank's box.
"""

from __future__ import annotations

import logging
import os
import time
from math import prod
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
from mpi4py import MPI

from .. import _backend as bk
from .. import _validate
from ..array import ShardedArray, zeroed
from ..layout import Layout, Placement
from ..mesh import Mesh
from .errors import Error, PathArg, error, norm_path, on_root
from .manifest import (
    MANIFEST,
    crc32,
    dtype_of,
    parse_placement,
    read_manifest,
    read_npy_header,
)
from .mpiio import box_bounds, collective_io, read_hints

__all__ = ["load"]

log = logging.getLogger("pyshard")


def _check_load_args(
    mesh: object, placements: object, sizes: object
) -> Tuple[List[str], Dict[str, list], Mapping]:
    """Check load's arguments; (sorted names, parsed placements by name, sizes)."""
    if not isinstance(mesh, Mesh):
        raise TypeError(f"load(mesh): expected a pyshard.Mesh, got {type(mesh).__name__}")
    if not isinstance(placements, Mapping):
        raise TypeError(
            f"load(placements): expected a dict name -> placements, got {type(placements).__name__}"
        )
    sizes = {} if sizes is None else sizes
    if not isinstance(sizes, Mapping):
        raise TypeError(f"load(sizes): expected a dict name -> sizes, got {type(sizes).__name__}")
    for name in sizes:
        if name not in placements:
            raise ValueError(f"load(sizes): {name!r} is not among the names in placements")
    names = sorted(placements)
    want = {}
    for name in names:
        pl = placements[name]
        if isinstance(pl, (str, Placement)) or not isinstance(pl, (list, tuple)):
            raise TypeError(
                f"load(placements[{name!r}]): expected a list with one placement per mesh "
                f"dim, got {pl!r}"
            )
        want[name] = [parse_placement(p) for p in pl]
    return names, want, sizes


# ----------------------------------------------------------------------------- checks


def _check_files(path: str, m: Dict[str, Any], names: Sequence[str]) -> Dict[str, int]:
    """Rank 0: check each named array's file (present, header, size); its data offsets."""
    offsets = {}
    mpath = os.path.join(path, MANIFEST)
    for name in names:
        e = m["arrays"][name]
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
        offsets[name] = offset
    return offsets


def _read_entries(path: str, names: Sequence[str]) -> Tuple[Dict[str, Any], Dict[str, int]]:
    """Rank 0: read the manifest and check the named arrays' files; (entries, data offsets)."""
    m = read_manifest(path, "load")
    unknown = [n for n in names if n not in m["arrays"]]
    if unknown:
        raise ValueError(
            f"load: {path!r} has no array named {unknown[0]!r}; it holds {sorted(m['arrays'])}"
        )
    offsets = _check_files(path, m, names)
    return {n: m["arrays"][n] for n in names}, offsets


def _read_error(path: str, e: Exception) -> Error:
    """The error every rank raises when rank 0 cannot read the checkpoint at ``path``."""
    if isinstance(e, (FileNotFoundError, ValueError)):
        return error(type(e).__name__, str(e))
    return error("ValueError", f"load: cannot read {path!r}: {e!r}")


def _verify(
    path: str,
    m: Dict[str, Any],
    names: Sequence[str],
    offsets: Dict[str, int],
    rank: int,
    size: int,
) -> Optional[str]:
    """Re-read this rank's round-robin share of the saved blocks and check their crc32."""
    k = 0
    for name in names:
        e = m["arrays"][name]
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
                    offset=offsets[name],
                    shape=tuple(e["shape"]),
                )
            box = tuple(slice(s, s + n) for s, n in zip(b["start"], b["shape"]))
            got = crc32(mm[box])
            if got != int(b["crc32"]):
                return (
                    f"load: checksum mismatch in {fname!r} (array {name!r}, block at "
                    f"{b['start']} of shape {b['shape']}: crc32 {got:#010x}, manifest says "
                    f"{int(b['crc32']):#010x}): the file is corrupt"
                )
        del mm
    return None


def _verify_all(
    comm: MPI.Comm, path: str, m: Dict[str, Any], names: Sequence[str], offsets: Dict[str, int]
) -> None:
    """Each rank checks its share of the saved blocks; one allgather of the verdicts, and
    every rank raises the first mismatch."""
    try:
        bad = _verify(path, m, names, offsets, comm.Get_rank(), comm.Get_size())
    except Exception as e:  # a verdict from every rank, whatever happened
        bad = f"load: cannot verify {path!r}: {e!r}"
    verdicts = comm.allgather(bad)
    bad = next((v for v in verdicts if v is not None), None)
    if bad is not None:
        raise ValueError(bad)


# ----------------------------------------------------------------------------- data


def _target_layouts(
    entries: Dict[str, Any], mesh: Mesh, want: Dict[str, list], sizes: Mapping
) -> Dict[str, Layout]:
    """The layouts to load into, from the manifest and the arguments: identical on every rank."""
    return {
        n: Layout(tuple(e["shape"]), dtype_of(e), mesh.shape, want[n], sizes.get(n))
        for n, e in entries.items()
    }


def _read_array(
    mesh: Mesh, fname: str, offset: int, lay: Layout, device: Optional[str] = None
) -> ShardedArray:
    """Read this rank's shard of ``lay`` from a .npy file; collective over ``mesh``. With
    ``device="cuda"`` the shard is read into host memory, then copied to the GPU."""
    start, ext = box_bounds(lay, mesh.coords)
    local = np.empty(tuple(ext), dtype=lay.dtype)
    zero = zeroed(lay, mesh.coords)
    box = (start, ext, not zero and local.size > 0)
    hints = read_hints(lay)
    try:
        collective_io(mesh.comm, fname, lay, offset, box, local, write=False, hints=hints)
    finally:
        if hints != MPI.INFO_NULL:
            hints.Free()
    if zero:
        local[...] = 0
    if device == "cuda":
        local = bk.cupy().asarray(local)
    return ShardedArray(local, lay, mesh)


def load(
    path: PathArg,
    mesh: Mesh,
    placements: Mapping[str, Sequence[Union[Placement, str]]],
    sizes: Optional[Mapping[str, Mapping[int, Sequence[int]]]] = None,
    *,
    verify: bool = True,
    device: Optional[str] = None,
) -> Dict[str, ShardedArray]:
    """Load arrays of a checkpoint into any layout on ``mesh``; collective over ``mesh``.

    path: the checkpoint directory written by :func:`save`.
    mesh: the mesh to load onto (any shape and rank count).
    placements: name -> placements list, one per mesh dim (``Shard``/``Replicate``/
    ``Partial`` objects or strings like ``"S(0)"``); the names to load.
    sizes: name -> ``{array_dim: extents}`` for uneven shards (default balanced).
    verify: re-read every saved block once (spread round robin over the ranks) and check
    its crc32 before loading (default True).
    device: ``None`` or ``"cpu"`` for numpy arrays, ``"cuda"`` for cupy arrays on the current
    GPU (read through host memory).

    Every rank raises the same FileNotFoundError or ValueError, naming the path and the
    problem, for a missing manifest or file, a truncated or mismatched .npy, a checksum
    mismatch or an unknown name.
    """
    t0 = time.perf_counter()
    path = norm_path(path, "load")
    if _validate.enabled and isinstance(mesh, Mesh):
        items = {"path": repr(path), "placements": repr(placements), "sizes": repr(sizes)}
        items["device"] = repr(device)
        _validate.agree(mesh.comm, "load", items)
    names, want, sizes = _check_load_args(mesh, placements, sizes)
    if device not in (None, "cpu", "cuda"):
        raise ValueError(f"load(device): expected None, 'cpu' or 'cuda', got {device!r}")
    if device == "cuda" and bk.cupy() is None:
        raise ValueError("load(device='cuda'): cupy does not import here; install cupy")
    comm = mesh.comm
    # rank 0 reads the manifest and checks the files; every rank gets its verdict
    entries, offsets = on_root(
        comm, lambda: _read_entries(path, names), lambda e: _read_error(path, e)
    )
    layouts = _target_layouts(entries, mesh, want, sizes)
    if verify:
        _verify_all(comm, path, {"arrays": entries}, names, offsets)
    out = {
        n: _read_array(
            mesh, os.path.join(path, entries[n]["file"]), offsets[n], layouts[n], device
        )
        for n in names
    }
    if comm.Get_rank() == 0:
        log.info(
            "pyshard: loaded %d array(s) from %s onto %d rank(s) in %.3f s",
            len(names),
            path,
            comm.Get_size(),
            time.perf_counter() - t0,
        )
    return out
