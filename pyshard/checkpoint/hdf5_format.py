"""The HDF5 format (:class:`Hdf5Format`) through pip's serial h5py: rank 0 lays out the file
and inspects files to read; the data itself moves through MPI-IO (the one-file save of
:mod:`~pyshard.checkpoint.onefile`, the reader's raw paths).

A save makes one contiguous dataset per array with early allocation and no fill, so h5py
writes only metadata and every dataset's bytes have a fixed offset in the file
(``dset.id.get_offset()``); the ranks then write their boxes there with MPI-IO, as into a
``.npy`` file. bfloat16 and float8 arrays are stored as unsigned integers of their width,
with the attribute ``pyshard_dtype`` naming the ml_dtypes type (HDF5 has no such floats).
The root attribute ``pyshard`` holds the checkpoint record (JSON: metadata, layouts).

A load reads contiguous, unfiltered, native-byte-order datasets whose file type is the one
h5py writes for their numpy dtype the same way (MPI-IO at their offset); every other dataset
(chunked, compressed, compact, big-endian, external, or of a file type h5py converts as it
reads: 12-bit ints in 16, an enum h5py calls bool) is read through h5py in blocks of whole
chunk rows, each chunk by one rank. Every name of a dataset loads (hard and soft links); a
dataset pyshard cannot hold (strings, compounds, an external link) is described as
unsupported, and only a load that names it fails.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from math import prod
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np

from .. import _dtypes
from .._optional import OptionalModule
from . import saving
from .driver import Arrays, Facts, Items, Unsupported, unsupported
from .manifest import dtype_str
from .onefile import OneFile
from .record import facts, layout_of, parse_record

__all__ = ["Hdf5Format"]

h5py = OptionalModule("h5py")

SIGNATURE = b"\x89HDF\r\n\x1a\n"
MAX_BYTES = 1 << 50
"""The largest array (bytes) read from a dataset whose size is not bounded by the file's
(chunked or compressed): anything larger is refused as a corrupt or hostile shape."""


def need(what: str) -> Any:
    """The h5py module, or ImportError naming the extra."""
    m = h5py()
    if m is None:
        raise ImportError(f"{what}: the HDF5 format needs h5py: pip install 'pyshard[hdf5]'")
    return m


def signature_offsets(size: int) -> List[int]:
    """Where HDF5 looks for its superblock signature in a file of ``size`` bytes: byte 0,
    then 512, 1024, 2048, ... (a user block of any power-of-two size from 512 bytes)."""
    out, off = [0], 512
    while off + len(SIGNATURE) <= size:
        out.append(off)
        off *= 2
    return out


def is_hdf5(fname: str) -> bool:
    """Does ``fname`` hold an HDF5 superblock signature (at 0, 512, 1024, 2048, ... bytes,
    up to the file's size, as HDF5 searches)?"""
    try:
        with open(fname, "rb") as f:
            for off in signature_offsets(os.fstat(f.fileno()).st_size):
                f.seek(off)
                if f.read(8) == SIGNATURE:
                    return True
    except OSError:
        return False
    return False


def stored_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype a dataset stores ``dtype`` as: unsigned ints of the same width for the
    ml_dtypes floats, ``dtype`` itself otherwise; TypeError for what HDF5 cannot hold."""
    if _dtypes.is_ml(dtype):
        return np.dtype(f"<u{dtype.itemsize}")
    if dtype.kind not in "biufc":
        raise TypeError(f"save: the HDF5 format cannot hold dtype {dtype}")
    return dtype


def check_name(name: str) -> None:
    """ValueError unless ``name`` is a usable HDF5 dataset path (``a`` or ``group/a``)."""
    parts = name.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise ValueError(
            f"save(arrays[{name!r}]): not a usable HDF5 dataset path (empty, '.' or '..' parts)"
        )
    if "\x00" in name:  # (HDF5 ends a link name at a NUL: 'w\x00a' was saved as 'w')
        raise ValueError(f"save(arrays[{name!r}]): not a usable HDF5 dataset path (a NUL "
                         f"character; HDF5 would cut the name there)")


def create(
    fname: str, tensors: List[Tuple[str, Tuple[int, ...], np.dtype, Dict[str, str]]], record: str
) -> Dict[str, Optional[int]]:
    """Rank 0: create the HDF5 file ``fname`` with one contiguous, early-allocated, unfilled
    dataset per (name, shape, dtype, attributes); each dataset's data offset (None when it
    has no bytes). ``record``: the root attribute ``pyshard``."""
    h5 = need("save")
    offsets: Dict[str, Optional[int]] = {}
    with h5.File(fname, "w") as f:
        f.attrs["pyshard"] = record
        for name, shape, dtype, attrs in tensors:
            dcpl = h5.h5p.create(h5.h5p.DATASET_CREATE)
            dcpl.set_layout(h5.h5d.CONTIGUOUS)
            dcpl.set_alloc_time(h5.h5d.ALLOC_TIME_EARLY)
            dcpl.set_fill_time(h5.h5d.FILL_TIME_NEVER)  # the ranks write every byte
            lcpl = h5.h5p.create(h5.h5p.LINK_CREATE)
            lcpl.set_create_intermediate_group(True)
            space = h5.h5s.create_simple(shape) if shape else h5.h5s.create(h5.h5s.SCALAR)
            tid = h5.h5t.py_create(stored_dtype(dtype), logical=True)
            dsid = h5.h5d.create(f.id, name.encode(), tid, space, dcpl=dcpl, lcpl=lcpl)
            ds = h5.Dataset(dsid)
            for k, v in attrs.items():
                ds.attrs[k] = v
            offsets[name] = dsid.get_offset() if prod(shape) else None
    return offsets


def _dtype(ds: Any, where: str) -> np.dtype:
    """The dtype pyshard loads dataset ``ds`` as; :class:`Unsupported` for one it cannot
    hold (the file's other datasets still load)."""
    ml = ds.attrs.get("pyshard_dtype")
    if ml is not None:
        if isinstance(ml, bytes):
            ml = ml.decode()
        try:
            dt = _dtypes.resolve(str(ml), where)
        except (TypeError, ValueError) as e:
            raise Unsupported(f"pyshard_dtype {ml!r} is not a dtype pyshard knows ({e})") from e
        if ds.dtype.itemsize != dt.itemsize or ds.dtype.kind != "u":
            raise Unsupported(f"pyshard_dtype {ml!r} does not match stored {ds.dtype}")
        return dt
    dt = ds.dtype
    if dt.kind not in "biufc" or dt.fields is not None or dt.subdtype is not None:
        raise Unsupported(f"dtype {dt} is not one pyshard can hold (numbers and bool)")
    return dt.newbyteorder("=") if dt.byteorder not in ("=", "|") else dt


def stores_as_numpy(h5: Any, ds: Any) -> bool:
    """Are the bytes of ``ds`` on disk exactly numpy's bytes of ``ds.dtype``: is its file
    type the one h5py would create for that dtype? Not for an integer of fewer bits than
    its container (12 of 16), an enum h5py reports as bool over a wider base, a float of a
    custom layout: h5py converts those as it reads, so they may not be read as raw bytes."""
    try:
        return bool(ds.id.get_type().equal(h5.h5t.py_create(ds.dtype, logical=True)))
    except (TypeError, ValueError):
        return False


def inspect(fname: str, what: str = "load") -> Tuple[Dict[str, Dict[str, Any]], str]:
    """Rank 0: every dataset of ``fname`` as {path without the leading "/": {"shape",
    "dtype", "nbytes", "kind", "offset", "grid"}} and the root ``pyshard`` attribute ("" if
    none). ``kind``: ``"raw"`` (contiguous bytes at ``offset``: read with MPI-IO), ``"fill"``
    (never written: the fill value), ``"h5py"`` (read through h5py in blocks of whole
    chunks of shape ``grid``). ValueError naming the file for an unreadable file, a dtype
    pyshard cannot hold, a huge shape or a data segment outside the file."""
    with _opened(fname, what) as (h5, size, f, record):
        out = {name: entry_or_unsupported(h5, f, name, fname, size, what)
               for name in dataset_names(h5, f)}
    return out, record


@contextmanager
def _opened(fname: str, what: str) -> Iterator[Tuple[Any, int, Any, str]]:
    """(h5py, the file's size, the open file, its root ``pyshard`` attribute or ""), the
    file closed after; ValueError naming the file where h5py cannot open it."""
    h5 = need(what)
    size = os.path.getsize(fname)
    try:
        f = h5.File(fname, "r")
    except OSError as e:
        raise ValueError(f"{what}: {fname!r} is not a readable HDF5 file ({e})") from e
    with f:
        record = f.attrs.get("pyshard", "")
        yield h5, size, f, str(record.decode() if isinstance(record, bytes) else record)


def dataset_names(h5: Any, f: Any) -> List[str]:
    """Every name of a dataset in ``f`` (without the leading "/"): each hard link and each
    soft link that resolves to a dataset (a dataset linked twice is listed under both
    names), and each external link (described as unsupported)."""
    names: List[str] = []
    visit = getattr(f, "visititems_links", None)
    if visit is None:  # h5py before 3.11: each object once, under its first name
        f.visititems(lambda n, o: names.append(n) if isinstance(o, h5.Dataset) else None)
        return names

    def one(name: str, link: Any) -> None:
        if isinstance(link, h5.ExternalLink):
            names.append(name)
            return
        try:
            obj = f.get(name)  # None: a dangling soft link
        except (KeyError, ValueError, OSError, RuntimeError):
            return  # a soft link that does not resolve (a loop of soft links)
        if isinstance(obj, h5.Dataset):
            names.append(name)

    visit(one)
    return names


def entry_or_unsupported(
    h5: Any, f: Any, name: str, fname: str, size: int, what: str
) -> Dict[str, Any]:
    """The description of dataset ``name`` of the open file ``f``: :func:`_entry`, or
    ``{"kind": "unsupported", "reason"}`` for a dataset pyshard cannot hold (a string, a
    compound, an external link). ValueError for a dataset that makes the file
    untrustworthy (data outside the file, a huge shape)."""
    where = f"{what}: {fname!r}: dataset {name!r}"
    link = f.get(name, getlink=True)
    if isinstance(link, h5.ExternalLink):
        return unsupported(
            f"an external link to {link.path!r} in {link.filename!r} (load that file itself)",
            fname,
        )
    try:
        return _entry(h5, f[name], fname, size, where)
    except Unsupported as e:
        return unsupported(str(e), fname)


def lookup(fname: str, name: str, what: str = "load") -> Tuple[Optional[Dict[str, Any]], str]:
    """Rank 0: (the description of ``name`` as h5py resolves it in ``fname``: a path
    through a group reached by a second link, or None where it names no dataset; the root
    ``pyshard`` attribute)."""
    with _opened(fname, what) as (h5, size, f, record):
        try:
            link = f.get(name, getlink=True)
            found = link is not None and (
                isinstance(link, h5.ExternalLink) or isinstance(f.get(name), h5.Dataset)
            )
        except (KeyError, ValueError, OSError, RuntimeError):
            found = False
        e = entry_or_unsupported(h5, f, name, fname, size, what) if found else None
    return e, record


def _entry(h5: Any, ds: Any, fname: str, size: int, where: str) -> Dict[str, Any]:
    if ds.shape is None:
        raise Unsupported("it has a null dataspace (no shape)")
    shape = tuple(int(s) for s in ds.shape)
    dtype = _dtype(ds, where)
    nbytes = prod(shape) * dtype.itemsize
    if nbytes > MAX_BYTES:
        raise ValueError(f"{where}: shape {shape} ({nbytes} bytes) is too large to be real")
    plist = ds.id.get_create_plist()
    e: Dict[str, Any] = {"shape": shape, "dtype": dtype, "nbytes": nbytes, "offset": None}
    contiguous = plist.get_layout() == h5.h5d.CONTIGUOUS
    native = ds.dtype.byteorder in ("=", "|", "<" if np.little_endian else ">")
    plain = plist.get_nfilters() == 0 and plist.get_external_count() == 0 and native
    # the bytes on disk are numpy's bytes of ds.dtype only where the file type is what
    # h5py would write for it (not 12-bit ints in 16 bits, not an enum h5py calls bool)
    plain = plain and stores_as_numpy(h5, ds)
    if contiguous and plain and nbytes:
        off = ds.id.get_offset()
        if off is None:
            e["kind"] = "fill"
            fv = np.zeros((), ds.dtype)
            plist.get_fill_value(fv)
            e["fill"] = fv.tobytes()
        else:
            if off + nbytes > size:
                raise ValueError(
                    f"{where}: its {nbytes} data bytes at offset {off} lie outside the "
                    f"{size}-byte file (truncated or corrupt)"
                )
            e["kind"], e["offset"] = "raw", int(off)
        return e
    e["kind"] = "h5py"
    chunks = ds.chunks
    e["grid"] = [int(c) for c in chunks] if chunks else [max(1, n) for n in shape]
    return e


def read_rows(
    fname: str, name: str, d: int, r0: int, r1: int, dtype: np.dtype
) -> np.ndarray:
    """Indices ``r0:r1`` of dim ``d`` of dataset ``name`` through h5py (a 0-d dataset: its
    value), as ``dtype`` (an ml_dtypes dtype: the stored integers viewed as it)."""
    h5 = need("load")
    with h5.File(fname, "r") as f:
        ds = f[name]
        a = ds[()] if ds.ndim == 0 else ds[(slice(None),) * d + (slice(r0, r1),)]
    if _dtypes.is_ml(dtype):
        return np.ascontiguousarray(a).view(dtype)
    return np.ascontiguousarray(a, dtype=dtype)


def record_of(s: str) -> Optional[Dict[str, Any]]:
    """The pyshard record of the root attribute, or None (a file from another tool)."""
    return parse_record(s)


class Hdf5Format(OneFile):
    """One HDF5 file, one contiguous dataset per array."""

    name = "hdf5"
    label = "HDF5"
    target = "an HDF5 file"

    def probe(self, path: str) -> bool:
        return os.path.isfile(path) and is_hdf5(path)

    def replaceable(self, path: str) -> bool:
        return self.probe(path)

    def describe(self, path: str, what: str) -> Tuple[Arrays, Facts]:
        table, rec_s = inspect(path, what)
        rec = record_of(rec_s)
        arrays = {
            name: dict(e, file=path, **layout_of(rec, name, e["shape"], f"{what}: {path!r}",
                                 e.get("dtype")))
            for name, e in table.items()
        }
        return arrays, facts(rec, {})

    def check_save(self, items: Items) -> None:
        need("save(format='hdf5')")
        for name, x in items:
            check_name(name)
            stored_dtype(x.dtype)
        saving.check_nested([n for n, _ in items], self.label)

    def lay_out(self, tmp: str, items: Items, rec: str) -> Dict[str, Optional[int]]:
        tensors = [
            (
                n,
                tuple(x.global_shape),
                x.dtype,
                {"pyshard_dtype": dtype_str(x.dtype)} if _dtypes.is_ml(x.dtype) else {},
            )
            for n, x in items
        ]
        return create(tmp, tensors, rec)

    def lookup(self, path: str, name: str, what: str) -> Optional[Dict[str, Any]]:
        e, rec_s = lookup(path, name, what)
        if e is None:
            return None
        return dict(e, file=path,
                    **layout_of(record_of(rec_s), name, e["shape"], f"{what}: {path!r}",
                                 e.get("dtype")))

    def read_block(
        self, name: str, e: Dict[str, Any], d: int, r0: int, r1: int, dtype: np.dtype
    ) -> np.ndarray:
        return read_rows(e["file"], name, d, r0, r1, dtype)
