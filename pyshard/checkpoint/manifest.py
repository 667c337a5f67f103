"""The ``.npy`` checkpoint format, without MPI: the manifest, the ``.npy`` headers and file
names, placements as strings, and the crc32 of saved blocks.

``manifest.json`` holds ``format`` (:data:`FORMAT`), ``version`` (:data:`VERSION`), the rank
count, creation time, numpy version, the user's metadata, and per array its ``.npy`` file,
shape, dtype (numpy's ``dtype.str`` such as ``"<f4"``, or an ml_dtypes name such as
``"bfloat16"``, also the ``.npy`` header's ``descr``), byte count, the layout it was saved
from (mesh shape, placements as ``S(0)``, ``R``, ``P(sum)``, sizes) and a crc32 per saved
block. See ``docs/checkpoints.md``.
"""

from __future__ import annotations

import io
import json
import os
import re
import time
import zlib
from math import prod
from typing import Any, Dict, Tuple

import numpy as np
import numpy.lib.format as npformat

from .. import _dtypes
from ..layout import Layout, Partial, Replicate, Shard

FORMAT = "pyshard-checkpoint"
VERSION = 1
MANIFEST = "manifest.json"


def file_name(name: str, taken: set) -> str:
    """A file name for array ``name`` (safe characters, unique within ``taken`` ignoring
    case, never ``manifest``), added to ``taken``."""
    base = re.sub(r"[^A-Za-z0-9._-]", "_", name)
    if base.startswith("."):
        base = "_" + base[1:]
    base = base[:120] or "_"
    cand = base
    i = 1
    while cand.lower() in taken or cand.lower() == "manifest":
        cand = f"{base}-{i}"
        i += 1
    taken.add(cand.lower())
    return cand + ".npy"


def dtype_str(dtype: np.dtype) -> str:
    """How the manifest names ``dtype``: ``"<f4"`` for numpy's own, ``"bfloat16"`` for an
    ml_dtypes float (whose ``dtype.str``, ``"<V2"``, would load as raw bytes)."""
    return _dtypes.name(dtype)


def dtype_of(e: Dict[str, Any], what: str = "load") -> np.dtype:
    """The dtype of a manifest entry ``e``; an ml_dtypes name imports ml_dtypes, or raises
    TypeError naming the extra to install."""
    return _dtypes.resolve(e["dtype"], what)


def npy_header(shape: Tuple[int, ...], dtype: np.dtype) -> bytes:
    """The .npy header numpy.save would write for an array of ``shape`` and ``dtype``; for an
    ml_dtypes float the ``descr`` is its name (``'bfloat16'``), so that ``numpy.load`` gives
    a bfloat16 array once ml_dtypes is imported (numpy.save would write ``'<V2'``: raw bytes)."""
    descr = dtype_str(dtype) if _dtypes.is_ml(dtype) else npformat.dtype_to_descr(dtype)
    d = {"descr": descr, "fortran_order": False, "shape": shape}
    bio = io.BytesIO()
    try:
        npformat.write_array_header_1_0(bio, d)
    except ValueError:  # header over 64 KiB: format 2.0
        bio = io.BytesIO()
        npformat.write_array_header_2_0(bio, d)
    return bio.getvalue()


def read_npy_header(fname: str) -> Tuple[Tuple[int, ...], np.dtype, bool, int]:
    """(shape, dtype, fortran_order, data offset) of a .npy file; ValueError if unreadable."""
    with open(fname, "rb") as f:
        try:
            version = npformat.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = npformat.read_array_header_1_0(f)
            elif version == (2, 0):
                shape, fortran, dtype = npformat.read_array_header_2_0(f)
            else:
                raise ValueError(f"unsupported .npy format version {version}")
        except Exception as e:  # numpy raises ValueError or others on garbage
            raise ValueError(f"{fname}: not a readable .npy file ({e})") from e
        return tuple(shape), np.dtype(dtype), bool(fortran), f.tell()


_PLACEMENT_RE = re.compile(
    r"^\s*(?:S\((-?\d+)\)|Shard\((?:dim=)?(-?\d+)\)|(R)|Replicate\(\)"
    r"|P\((\w+)\)|Partial\((?:op=)?'?(\w+)'?\))\s*$"
)


def parse_placement(p: object) -> object:
    """Placement objects pass through; strings such as ``"S(0)"``, ``"R"``, ``"P(sum)"`` parse."""
    if not isinstance(p, str):
        return p
    m = _PLACEMENT_RE.match(p)
    if not m:
        raise ValueError(f"cannot parse placement {p!r}: expected S(dim), R or P(op)")
    s0, s1, _r, p0, p1 = m.groups()
    if s0 is not None or s1 is not None:
        return Shard(int(s0 if s0 is not None else s1))
    if p0 is not None or p1 is not None:
        return Partial(p0 if p0 is not None else p1)
    return Replicate()


def crc32(a: np.ndarray) -> int:
    """The crc32 of an array's bytes in C order (as the manifest records a block)."""
    raw = np.ascontiguousarray(a).reshape(-1).view(np.uint8)  # ml_dtypes arrays export no buffer
    return zlib.crc32(raw) & 0xFFFFFFFF


def entry(layout: Layout, fname: str) -> Dict[str, Any]:
    """The manifest entry of an array of ``layout`` saved in file ``fname`` (its checksums
    are added by :func:`build_manifest`)."""
    return {
        "file": fname,
        "shape": list(layout.shape),
        "dtype": dtype_str(layout.dtype),
        "nbytes": prod(layout.shape) * layout.dtype.itemsize,
        "mesh_shape": list(layout.mesh_shape),
        "placements": [str(p) for p in layout.placements],
        "sizes": {str(d): list(e) for d, e in layout.sizes.items()},
    }


def build_manifest(
    entries: Dict[str, Dict[str, Any]], gathered: list, size: int, meta_json: str
) -> Dict[str, Any]:
    """The manifest: ``entries`` (name -> :func:`entry`) with the (start, shape, crc32)
    blocks every rank wrote (``gathered``: one dict name -> blocks per rank), the rank count
    ``size`` and the metadata (canonical JSON)."""
    for name, e in entries.items():
        recs = [b for g in gathered for b in g.get(name, [])]
        recs.sort(key=lambda b: b[0])
        e["checksum"] = {
            "algorithm": "crc32",
            "blocks": [{"start": s, "shape": x, "crc32": c} for s, x, c in recs],
        }
    return {
        "format": FORMAT,
        "version": VERSION,
        "ranks": size,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "numpy": np.__version__,
        "metadata": json.loads(meta_json),
        "arrays": entries,
    }


def read_manifest(path: str, what: str) -> Dict[str, Any]:
    """Parse and check ``path/manifest.json``; FileNotFoundError or ValueError (naming the
    call ``what`` and the path) if unusable."""
    mpath = os.path.join(path, MANIFEST)
    if not os.path.isdir(path):
        hint = ""
        parent = os.path.dirname(os.path.abspath(path)) or "."
        base = os.path.basename(path)
        try:
            aside = sorted(n for n in os.listdir(parent) if n.startswith(base + ".old-"))
        except OSError:
            aside = []
        if aside:
            hint = (
                f" ({os.path.join(parent, aside[0])} holds a checkpoint set aside by a save that "
                f"stopped during its final rename; rename it back to {path!r})"
            )
        # a missing path: no format claims it, so it may be meant as a file (HDF5,
        # safetensors) or a directory (npy, Zarr)
        raise FileNotFoundError(f"{what}: no checkpoint file or directory at {path!r}{hint}")
    if not os.path.isfile(mpath):
        raise FileNotFoundError(
            f"{what}: {path!r} has no {MANIFEST}: not a pyshard checkpoint, or a save that did "
            f"not finish"
        )
    try:
        with open(mpath, encoding="utf-8") as f:
            m = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"{what}: {mpath!r} is not valid JSON ({e})") from e
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise ValueError(f"{what}: {mpath!r} is not a pyshard checkpoint manifest")
    if m.get("version") != VERSION:
        raise ValueError(
            f"{what}: {mpath!r} has format version {m.get('version')!r}; this pyshard reads "
            f"version {VERSION}"
        )
    arrays = m.get("arrays")
    if not isinstance(arrays, dict):
        raise ValueError(f"{what}: {mpath!r} has no 'arrays' table")
    for name, e in arrays.items():
        try:
            shape = tuple(int(s) for s in e["shape"])
            dtype_of(e, f"{what}: array {name!r}")
            str(e["file"])
            if os.path.basename(e["file"]) != e["file"] or e["file"] in ("", ".", ".."):
                raise ValueError("bad file name")
            int(e["nbytes"])
            e["checksum"]["blocks"]  # noqa: B018
        except _dtypes.NeedsMLDtypes:
            raise
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(
                f"{what}: {mpath!r}: the entry of array {name!r} is malformed ({err!r})"
            ) from err
        if prod(shape) * dtype_of(e).itemsize != int(e["nbytes"]):
            raise ValueError(f"{what}: {mpath!r}: array {name!r} has an inconsistent byte count")
    return m
