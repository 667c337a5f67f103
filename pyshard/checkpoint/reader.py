"""``load``: arrays of a checkpoint read with MPI-IO into any layout on any mesh.

Rank 0 reads the manifest and checks every named array's file (present, header, size); every
rank learns its verdict. With ``verify`` the saved blocks are re-read round robin over the
ranks and their crc32 checked (one allgather of the verdicts). Then the small arrays that
:func:`~pyshard.redistribute_many` would fuse are read as contiguous row blocks, each rank its
own with independent I/O, and moved to their targets by one fused exchange per batch. An
array stored whole in one file (.npy, safetensors, contiguous HDF5) whose boxes are made of
runs of at least PYSHARD_LOAD_DIRECT_BYTES is copied by every rank straight into its box out of
a read-only mapping of the file (no exchange, no collective read); the others are read as row
blocks and redistributed (HDF5, safetensors) or by one collective read of every rank's box
(.npy, and Partial targets).
"""

from __future__ import annotations

import logging
import mmap
import os
import time
from math import prod
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
from mpi4py import MPI

from .. import _backend as bk
from .. import _validate, config
from ..array import ShardedArray, zeroed
from ..layout import Layout, Partial, Placement, Replicate, Shard, split_sizes
from ..many import ManyPlan, redistribute_many
from ..mesh import Mesh
from ..plan import plan
from . import hdf5_format
from .errors import Error, PathArg, error, norm_path, on_root
from .formats import open_arrays
from .manifest import (
    MANIFEST,
    crc32,
    dtype_of,
    parse_placement,
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


def _read_entries(path: str, names: Sequence[str]) -> Tuple[str, Dict[str, Any]]:
    """Rank 0: detect the format, read its metadata and check the named arrays (for a .npy
    checkpoint: their files); (format, name -> array description of
    :mod:`~pyshard.checkpoint.formats`, with every raw array's data offset)."""
    fmt, arrays, _ = open_arrays(path, "load")
    unknown = [n for n in names if n not in arrays]
    if unknown:
        raise ValueError(
            f"load: {path!r} has no array named {unknown[0]!r}; it holds {sorted(arrays)}"
        )
    sel = {n: arrays[n] for n in names}
    if fmt == "npy":
        offsets = _check_files(path, {"arrays": {n: e["npy"] for n, e in sel.items()}}, names)
        for n in names:
            sel[n]["offset"] = offsets[n]
    return fmt, sel


def _read_error(path: str, e: Exception) -> Error:
    """The error every rank raises when rank 0 cannot read the checkpoint at ``path``."""
    if isinstance(e, (FileNotFoundError, ValueError, ImportError, TypeError)):
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
    """The layouts to load into, from the metadata and the arguments: identical on every
    rank."""
    return {
        n: Layout(tuple(e["shape"]), e["dtype"], mesh.shape, want[n], sizes.get(n))
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


# Small arrays are read as row blocks and fused into one exchange per batch (False: every
# array is a collective read of its target boxes, as before; for timing the two).
FUSE_SMALL = True


def _row_layout(lay: Layout) -> Optional[Layout]:
    """The layout of ``lay``'s array in which every rank's box is one contiguous range of its
    file: rows split over every mesh dim (``Shard(0)``, nested), balanced. None for 0-d
    arrays and Partial targets (those are read into their boxes directly)."""
    if lay.ndim == 0 or any(isinstance(p, Partial) for p in lay.placements):
        return None
    return lay.replace([Shard(0)] * len(lay.mesh_shape))


def _fused_batches(names: Sequence[str], layouts: Dict[str, Layout]) -> List[Dict[str, Layout]]:
    """The arrays read as row blocks (name -> row layout), in the batches that
    :func:`redistribute_many` fuses into one exchange each (the same on every rank: from
    the layouts alone)."""
    rows = {n: r for n in names if (r := _row_layout(layouts[n])) is not None}
    cand = list(rows)
    mp = ManyPlan([plan(rows[n], layouts[n]) for n in cand])
    return [{cand[i]: rows[cand[i]] for i in ix} for _, ix in mp.fused]


def _read_rows(fname: str, offset: int, lay: Layout, coords: Sequence[int]) -> np.ndarray:
    """This rank's row block of ``lay`` (a :func:`_row_layout`): one contiguous read with
    independent MPI-IO (no collective open or read per array)."""
    local = np.empty(lay.local_shape(coords), dtype=lay.dtype)
    if local.size:
        start = lay.box(coords)[0].start
        row = lay.dtype.itemsize * prod(lay.shape[1:])
        data = local.reshape(-1).view(np.uint8)  # bytes: ml_dtypes export no buffer
        fh = MPI.File.Open(MPI.COMM_SELF, fname, MPI.MODE_RDONLY)
        try:
            st = MPI.Status()
            fh.Read_at(offset + start * row, [data, MPI.BYTE], st)
            got = st.Get_count(MPI.BYTE)
        finally:
            fh.Close()
        if got != data.size:
            raise ValueError(f"load: {fname!r}: read {got} of {data.size} bytes at row {start}")
    return local


class _NoMapping(OSError):
    """The file cannot be mapped here (a file system without mmap): read it another way."""


def _agreed(comm: MPI.Comm, prefix: str, read: Callable[[], Any]) -> Any:
    """``read()`` on every rank, the verdicts agreed with one allgather, so that no rank goes
    on into a collective that another has left: every rank raises the first failing rank's
    error as the same ValueError (``prefix: error`` for errors other than ValueError); where
    some rank's file system cannot map the file (:class:`_NoMapping`) and no rank failed,
    every rank gets None (the caller reads it another way). Else this rank's value."""
    value, bad = None, None
    try:
        value = read()
    except _NoMapping as e:
        bad = ("unmapped", f"{prefix}: {e}")
    except Exception as e:  # a verdict from every rank, whatever happened
        bad = ("error", str(e) if isinstance(e, ValueError) else f"{prefix}: {e!r}")
    verdicts = [v for v in comm.allgather(bad) if v is not None]
    errors = [m for k, m in verdicts if k == "error"]
    if errors:
        raise ValueError(errors[0])
    if verdicts:
        log.info("pyshard: %s; reading it without a mapping", verdicts[0][1])
        return None
    return value


def _load_fused(
    comm: MPI.Comm,
    mesh: Mesh,
    path: str,
    entries: Dict[str, Any],
    offsets: Dict[str, int],
    layouts: Dict[str, Layout],
    batch: Dict[str, Layout],
) -> Dict[str, ShardedArray]:
    """Read one batch of small arrays as row blocks, then one :func:`redistribute_many` to
    their targets. Read errors are agreed (one allgather) before the exchange, so every rank
    raises the same error and none waits in the exchange."""
    parts = _agreed(comm, f"load: cannot read {path!r}", lambda: {
        n: ShardedArray.wrap(_read_rows(entries[n]["file"], offsets[n], lay, mesh.coords), lay,
                             mesh)
        for n, lay in batch.items()
    })  # fmt: skip
    return redistribute_many(
        parts,
        {n: list(layouts[n].placements) for n in batch},
        sizes={n: layouts[n].sizes for n in batch},
    )


# Large arrays of the one-file formats (HDF5, safetensors) are read as row blocks (each rank
# one contiguous run, independent I/O) and redistributed, rather than by a collective read of
# the target boxes (False: the collective read; for timing the two)
ROWS_LARGE = True


def _load_raw_rows(
    mesh: Mesh, fname: str, offset: int, lay: Layout, device: Optional[str]
) -> ShardedArray:
    """Read ``lay``'s array as row blocks (one contiguous run per rank, independent MPI-IO),
    then one redistribute to ``lay``. Read errors are agreed (one allgather) first."""
    src = _row_layout(lay)
    assert src is not None
    local = _agreed(mesh.comm, f"load: cannot read {fname!r}",
                    lambda: _read_rows(fname, offset, src, mesh.coords))  # fmt: skip
    y = ShardedArray.wrap(local, src, mesh).redistribute(list(lay.placements), sizes=lay.sizes)
    if device == "cuda":
        return ShardedArray(bk.cupy().asarray(y.local), lay, mesh)
    return y


def _shortest_run(lay: Layout) -> int:
    """The fewest contiguous bytes of the file in one run of any rank's box of ``lay`` (a
    C-order array stored whole): from the layout alone, so every rank decides alike. The
    last array dim split into two or more non-empty shards ends the runs."""
    split = [d for d, ext in lay.sizes.items() if sum(1 for e in ext if e) > 1]
    if not split:
        return lay.dtype.itemsize * prod(lay.shape)
    d = max(split)
    return lay.dtype.itemsize * prod(lay.shape[d + 1 :]) * min(e for e in lay.sizes[d] if e)


def _direct(lay: Layout) -> bool:
    """Whether ``load`` copies ``lay``'s array straight into every rank's box (no exchange,
    no collective read): a target that is not Partial and whose runs are at least
    PYSHARD_LOAD_DIRECT_BYTES long."""
    if _row_layout(lay) is None:  # 0-d, or a Partial target (its zero ranks read nothing)
        return False
    return _shortest_run(lay) >= int(config.get("PYSHARD_LOAD_DIRECT_BYTES"))


def _read_box(fname: str, offset: int, lay: Layout, coords: Sequence[int]) -> np.ndarray:
    """This rank's box of ``lay``'s array, stored whole in C order at ``offset`` of
    ``fname``: copied out of a read-only mapping of the file, so each rank passes once over
    its own bytes (out of the page cache) and over no one else's."""
    local = np.empty(lay.local_shape(coords), dtype=lay.dtype)
    if not local.size:
        return local
    item = lay.dtype.itemsize
    end = offset + item * prod(lay.shape)
    start = offset - offset % mmap.ALLOCATIONGRANULARITY
    with open(fname, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < end:  # checked on rank 0 before; the file changed since
            raise ValueError(f"load: {fname!r}: {size} bytes, the array ends at byte {end}")
        try:
            m = mmap.mmap(f.fileno(), end - start, access=mmap.ACCESS_READ, offset=start)
        except OSError as e:  # (ENODEV: a file system that cannot map files)
            raise _NoMapping(str(e)) from e
        with m:
            # bytes (a trailing dim of itemsize): ml_dtypes' types export no buffer
            whole = np.frombuffer(m, np.uint8, end - offset, offset - start)
            dst = local.reshape(-1).view(np.uint8).reshape(*local.shape, item)
            try:
                np.copyto(dst, whole.reshape(*lay.shape, item)[lay.box(coords)])
            finally:
                del whole  # no view of the mapping is left when it closes
    return local


def _load_raw_direct(
    mesh: Mesh, fname: str, offset: int, lay: Layout, device: Optional[str]
) -> Optional[ShardedArray]:
    """Every rank copies its box of ``lay`` out of the file (:func:`_read_box`), the verdicts
    agreed (:func:`_agreed`): the same read error on every rank, or None on every rank where
    some rank cannot map the file (the caller reads it another way)."""
    local = _agreed(mesh.comm, f"load: cannot read {fname!r}",
                    lambda: _read_box(fname, offset, lay, mesh.coords))  # fmt: skip
    if local is None:
        return None
    if device == "cuda":
        local = bk.cupy().asarray(local)
    return ShardedArray(local, lay, mesh)


def _filled(mesh: Mesh, lay: Layout, fill: bytes, device: Optional[str]) -> ShardedArray:
    """This rank's shard of an array never written: every element is the bytes ``fill``."""
    local = np.empty(lay.local_shape(mesh.coords), dtype=lay.dtype)
    if local.size and not zeroed(lay, mesh.coords):
        local.reshape(-1).view(np.uint8).reshape(-1, lay.dtype.itemsize)[:] = np.frombuffer(
            fill, np.uint8
        )
    else:
        local.reshape(-1).view(np.uint8)[:] = 0
    if device == "cuda":
        local = bk.cupy().asarray(local)
    return ShardedArray(local, lay, mesh)


def _blocks_source(lay: Layout, grid: Sequence[int]) -> Tuple[Layout, int]:
    """(the layout an array stored in chunks of shape ``grid`` is read in, its split dim d):
    ``Shard(d)`` over every mesh dim along the dim with the most stored chunks, with
    extents in whole chunks, balanced by chunks, the other dims whole: each stored chunk
    lies in one rank's box."""
    counts = [-(-n // max(1, g)) for n, g in zip(lay.shape, grid)]
    d = max(range(lay.ndim), key=lambda i: (counts[i], -i))
    parts = prod(lay.mesh_shape)
    g = max(1, min(int(grid[d]), lay.shape[d] or 1))
    ext = split_sizes(lay.shape[d], parts, grain=g)
    return lay.replace([Shard(d)] * len(lay.mesh_shape), sizes={d: list(ext)}), d


def _load_rows(
    mesh: Mesh, fmt: str, name: str, e: Dict[str, Any], lay: Layout, device: Optional[str]
) -> ShardedArray:
    """Read an array through its format's library (chunked or compressed storage): each rank
    reads its block of whole stored chunks (:func:`_blocks_source`), each chunk read by one
    rank, then one redistribute to ``lay``. Read errors are agreed (one allgather) before
    the exchange."""
    comm = mesh.comm
    src, d = _blocks_source(lay, e["grid"]) if lay.ndim else (None, 0)

    def read() -> np.ndarray:
        if src is None:  # 0-d: every rank reads the one value
            return _read_block(fmt, name, e, 0, 0, 1, lay.dtype).reshape(())
        b = src.box(mesh.coords)[d]
        want = src.local_shape(mesh.coords)
        if b.stop > b.start:
            local = _read_block(fmt, name, e, d, b.start, b.stop, lay.dtype)
        else:
            local = np.empty(want, lay.dtype)
        if local.shape != want:
            raise ValueError(
                f"load: {e['file']!r}: array {name!r}: indices {b.start}:{b.stop} of dim "
                f"{d} came back as {local.shape}"
            )
        return local

    local = _agreed(comm, f"load: {e['file']!r}", read)
    assert local is not None
    if src is None:
        y_local = np.array(local, copy=True).reshape(lay.local_shape(mesh.coords))
    else:
        x = ShardedArray.wrap(np.ascontiguousarray(local), src, mesh)
        plain = [Replicate() if isinstance(p, Partial) else p for p in lay.placements]
        y_local = x.redistribute(plain, sizes=lay.sizes).local
    if zeroed(lay, mesh.coords):
        y_local = np.zeros_like(y_local)
    if device == "cuda":
        y_local = bk.cupy().asarray(y_local)
    return ShardedArray(y_local, lay, mesh)


def _read_block(
    fmt: str, name: str, e: Dict[str, Any], d: int, r0: int, r1: int, dtype: Any
) -> Any:
    """Indices ``r0:r1`` of dim ``d`` of a chunked array (the whole value of a 0-d one),
    through h5py or zarr-python."""
    if fmt == "hdf5":
        return hdf5_format.read_rows(e["file"], name, d, r0, r1, dtype)
    from . import zarr_format

    return zarr_format.read_rows(e, d, r0, r1, dtype)


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

    path: a checkpoint written by :func:`save` in any format, or a file from another tool:
    an HDF5 file (serial h5py; contiguous datasets are read with MPI-IO at their offset,
    chunked or compressed ones through h5py in blocks of whole chunk rows), a Zarr v3 group
    or array (zarr-python, tensorstore; any chunk and shard shape, compressed or not) or a
    ``.safetensors`` file (numpy, torch). The format is detected. Array names are dataset
    paths (HDF5, Zarr: ``"group/x"``) or tensor names (safetensors).
    mesh: the mesh to load onto (any shape and rank count).
    placements: name -> placements list, one per mesh dim (``Shard``/``Replicate``/
    ``Partial`` objects or strings like ``"S(0)"``); the names to load.
    sizes: name -> ``{array_dim: extents}`` for uneven shards (default balanced).
    verify: re-read every saved block once (spread round robin over the ranks) and check
    its crc32 before loading (default True; ``.npy`` checkpoints, the only format with
    pyshard's checksums).
    device: ``None`` or ``"cpu"`` for numpy arrays, ``"cuda"`` for cupy arrays on the current
    GPU (read through host memory).

    Every rank raises the same FileNotFoundError or ValueError, naming the path and the
    problem, for a missing manifest or file, a truncated or mismatched .npy, a checksum
    mismatch, an unknown name, or an untrustworthy file (an offset or length outside the
    file, an oversized safetensors header, overlapping tensors, a Zarr key that escapes the
    directory, an unknown codec, a dtype pyshard cannot hold, a huge shape); ImportError
    naming the extra when the format's package (h5py, zarr-python) is not installed.
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
    # rank 0 detects the format, reads the metadata and checks the files; every rank gets
    # its verdict
    fmt, entries = on_root(
        comm, lambda: _read_entries(path, names), lambda e: _read_error(path, e)
    )
    layouts = _target_layouts(entries, mesh, want, sizes)
    offsets = {n: e["offset"] for n, e in entries.items() if e["kind"] == "raw"}
    if verify and fmt == "npy":
        npy = {n: dict(e["npy"]) for n, e in entries.items()}
        _verify_all(comm, path, {"arrays": npy}, names, offsets)
    raw = [n for n in names if entries[n]["kind"] == "raw"]
    batches = _fused_batches(raw, layouts) if FUSE_SMALL else []
    out: Dict[str, ShardedArray] = {}
    for batch in batches:
        for n, y in _load_fused(comm, mesh, path, entries, offsets, layouts, batch).items():
            if device == "cuda":
                y = ShardedArray(bk.cupy().asarray(y.local), y.layout, mesh)
            out[n] = y
    for n in names:
        if n in out:
            continue
        kind = entries[n]["kind"]
        y = None
        if kind == "raw" and _direct(layouts[n]):
            y = _load_raw_direct(mesh, entries[n]["file"], offsets[n], layouts[n], device)
        if y is not None:
            out[n] = y
        elif kind == "raw" and fmt != "npy" and ROWS_LARGE and _row_layout(layouts[n]):
            out[n] = _load_raw_rows(mesh, entries[n]["file"], offsets[n], layouts[n], device)
        elif kind == "raw":
            out[n] = _read_array(mesh, entries[n]["file"], offsets[n], layouts[n], device)
        elif kind == "fill":
            out[n] = _filled(mesh, layouts[n], entries[n]["fill"], device)
        else:
            out[n] = _load_rows(mesh, fmt, n, entries[n], layouts[n], device)
    out = {n: out[n] for n in names}
    if comm.Get_rank() == 0:
        log.info(
            "pyshard: loaded %d array(s) from %s onto %d rank(s) in %.3f s",
            len(names),
            path,
            comm.Get_size(),
            time.perf_counter() - t0,
        )
    return out
