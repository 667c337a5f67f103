"""Which format a checkpoint path holds, and its arrays described alike for every format
(no MPI): what :func:`~pyshard.checkpoint.load` plans from and
:func:`~pyshard.checkpoint.checkpoint_info` reports.

- a directory with ``manifest.json``: pyshard's ``.npy`` checkpoint;
- a directory with ``zarr.json``: a Zarr v3 group or array;
- a file with an HDF5 signature: HDF5;
- a file that starts like a safetensors header: safetensors.

Each array is a dict: ``shape`` (tuple), ``dtype`` (numpy dtype), ``nbytes``, ``file`` (the
file its bytes are in, or the Zarr array's directory), ``kind`` and what reading it takes:
``"raw"`` (C-order bytes at ``offset`` of ``file``: read with MPI-IO), ``"fill"`` (never
written: every element is the bytes ``fill``), ``"rows"`` (read through the format's library
in blocks of whole stored chunks of shape ``grid``, each by one rank); and the layout it was
saved from where pyshard saved it (``mesh_shape``, ``placements``, ``sizes``).
"""

from __future__ import annotations

import os
from typing import Any, Dict, Optional, Tuple

from .. import _dtypes
from . import hdf5_format, safetensors_format
from .manifest import dtype_of, read_manifest

Arrays = Dict[str, Dict[str, Any]]


def detect(path: str, what: str) -> str:
    """``"npy"``, ``"zarr"``, ``"hdf5"`` or ``"safetensors"``: the format at ``path``;
    FileNotFoundError when nothing is there, ValueError when it is none of them."""
    if os.path.isdir(path):
        if os.path.isfile(os.path.join(path, "zarr.json")):
            return "zarr"
        return "npy"  # read_manifest explains a directory without a manifest
    if os.path.isfile(path):
        if hdf5_format.is_hdf5(path):
            return "hdf5"
        if safetensors_format.is_safetensors(path):
            return "safetensors"
        raise ValueError(
            f"{what}: {path!r} is a file but neither HDF5 nor safetensors (a pyshard .npy "
            f"checkpoint is a directory)"
        )
    return "npy"  # read_manifest raises FileNotFoundError, with its hint about .old- names


def _layout_of(rec: Optional[Dict[str, Any]], name: str) -> Dict[str, Any]:
    """The saved layout of ``name`` from a pyshard record (empty for other tools' files)."""
    a = (rec or {}).get("arrays", {}).get(name) if isinstance(rec, dict) else None
    if not isinstance(a, dict):
        return {"mesh_shape": (), "placements": [], "sizes": {}}
    try:
        return {
            "mesh_shape": tuple(int(s) for s in a.get("mesh_shape", ())),
            "placements": [str(p) for p in a.get("placements", [])],
            "sizes": {int(d): tuple(int(v) for v in x) for d, x in a.get("sizes", {}).items()},
        }
    except (TypeError, ValueError, AttributeError):
        return {"mesh_shape": (), "placements": [], "sizes": {}}


def open_arrays(path: str, what: str) -> Tuple[str, Arrays, Dict[str, Any]]:
    """(format, arrays, checkpoint facts) of the checkpoint at ``path``; the facts are
    ``version``, ``ranks``, ``created`` and ``metadata`` (None / {} for other tools' files).
    Raises FileNotFoundError, ValueError (an untrustworthy file, named), ImportError (the
    format's package is missing: the message names the extra)."""
    fmt = detect(path, what)
    if fmt == "npy":
        m = read_manifest(path, what)
        arrays = {}
        for name, e in m["arrays"].items():
            arrays[name] = {
                "shape": tuple(int(s) for s in e["shape"]),
                "dtype": dtype_of(e, what),
                "nbytes": int(e["nbytes"]),
                "file": os.path.join(path, e["file"]),
                "kind": "raw",
                "offset": None,  # after the .npy header: the load checks it
                "npy": e,
                **_layout_of(m, name),
            }
        facts = {k: m.get(k) for k in ("version", "ranks", "created")}
        facts["metadata"] = m.get("metadata", {})
        return fmt, arrays, facts
    if fmt == "safetensors":
        table, meta, _ = safetensors_format.parse(path, what)
        rec = safetensors_format.pyshard_meta(meta)
        arrays = {}
        for name, e in table.items():
            dtype = e["dtype"]
            saved = (rec or {}).get("arrays", {}).get(name, {}) if rec else {}
            if isinstance(saved, dict) and saved.get("dtype") not in (None, _dtypes.name(dtype)):
                raise ValueError(f"{what}: {path!r}: tensor {name!r}: dtype disagrees with record")
            arrays[name] = {
                "shape": e["shape"],
                "dtype": dtype,
                "nbytes": e["nbytes"],
                "file": path,
                "kind": "raw",
                "offset": e["offset"],
                **_layout_of(rec, name),
            }
        return fmt, arrays, _facts(rec, meta)
    if fmt == "hdf5":
        table, rec_s = hdf5_format.inspect(path, what)
        rec = hdf5_format.record_of(rec_s)
        arrays = {}
        for name, e in table.items():
            arrays[name] = dict(e, file=path, **_layout_of(rec, name))
        return fmt, arrays, _facts(rec, {})
    from . import zarr_format  # zarr-python imports only for Zarr paths

    table, rec = zarr_format.inspect(path, what)
    arrays = {name: dict(e, **_layout_of(rec, name)) for name, e in table.items()}
    return fmt, arrays, _facts(rec, {})


def _facts(rec: Optional[Dict[str, Any]], meta: Dict[str, str]) -> Dict[str, Any]:
    """version, ranks, created, metadata of a pyshard record; a foreign file's own string
    metadata (safetensors ``__metadata__``) when there is none."""
    if not rec:
        return {"version": None, "ranks": None, "created": None, "metadata": dict(meta)}
    md = rec.get("metadata", {})
    return {
        "version": rec.get("version"),
        "ranks": rec.get("ranks"),
        "created": rec.get("created"),
        "metadata": md if isinstance(md, dict) else {},
    }
