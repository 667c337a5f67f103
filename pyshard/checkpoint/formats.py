"""The table of checkpoint formats, and which of them a path holds (no MPI).

Each format is one module with one :class:`~pyshard.checkpoint.driver.Format` (probe,
describe, save boxes, read a block), registered in :data:`DRIVERS`;
:func:`~pyshard.checkpoint.save`, :func:`~pyshard.checkpoint.load` and
:func:`~pyshard.checkpoint.checkpoint_info` reach every format through this table:

- ``"npy"``: a directory with ``manifest.json`` and one ``.npy`` file per array
  (:mod:`~pyshard.checkpoint.npy_format`);
- ``"hdf5"``: a file with an HDF5 signature (:mod:`~pyshard.checkpoint.hdf5_format`);
- ``"zarr"``: a directory with ``zarr.json``, a Zarr v3 group or array
  (:mod:`~pyshard.checkpoint.zarr_format`);
- ``"safetensors"``: a file that starts with a whole safetensors header, probed before the
  HDF5 signature (:mod:`~pyshard.checkpoint.safetensors_format`).
"""

from __future__ import annotations

import os
from typing import Dict, Tuple

from .driver import Arrays, Facts, Format
from .hdf5_format import Hdf5Format
from .manifest import MANIFEST
from .npy_format import NpyFormat
from .safetensors_format import SafetensorsFormat
from .zarr_format import ZarrFormat

__all__ = ["DEFAULT", "DRIVERS", "FORMATS", "detect", "driver", "open_arrays"]

DRIVERS: Dict[str, Format] = {
    f.name: f for f in (NpyFormat(), Hdf5Format(), ZarrFormat(), SafetensorsFormat())
}
"""Every format by name; :func:`detect` probes them in this order, but safetensors first."""

FORMATS = tuple(DRIVERS)
"""The formats :func:`~pyshard.checkpoint.save` writes (``format=``) and
:func:`~pyshard.checkpoint.load` detects."""

DEFAULT = DRIVERS["npy"]
"""The format of a path that is not a file and that no format claims: a missing path or a
directory, whose description explains what is missing."""


def driver(name: str) -> Format:
    """The format called ``name`` (one of :data:`FORMATS`)."""
    return DRIVERS[name]


def detect(path: str, what: str) -> Format:
    """The format at ``path``, the first of :data:`DRIVERS` (safetensors first) whose probe
    claims it, else for a file the first that it resembles (a damaged file of that format:
    its description says what is wrong); ValueError for a file none claims or resembles (a
    lone ``.npy`` file from ``numpy.save``: the message says to read it with numpy.load), or
    for a Zarr v2 store (``.zgroup``, ``.zarray``: pyshard reads Zarr v3 only),
    FileNotFoundError for an empty directory, :data:`DEFAULT` for anything else (its
    description raises FileNotFoundError for a missing path, with its hint about ``.old-``
    names, or a directory without a manifest)."""
    # safetensors first: its header is checked whole, while an HDF5 signature may sit at
    # byte 512, 1024, ... (after a user block), which a safetensors file's data can hold
    for fmt in sorted(DRIVERS.values(), key=lambda f: f.name != "safetensors"):
        if fmt.probe(path):
            return fmt
    if os.path.isfile(path):
        if _starts_with(path, NPY_MAGIC):
            raise ValueError(
                f"{what}: {path!r} is a single .npy file (numpy.save), not a checkpoint: read "
                f"it with numpy.load (a pyshard npy checkpoint is a directory with "
                f"{MANIFEST} and one .npy file per array)"
            )
        for fmt in DRIVERS.values():
            if fmt.resembles(path):  # a damaged file: its description names the damage
                return fmt
        files = " nor ".join(f.label for f in DRIVERS.values() if f.one_file)
        dirs = " or ".join(f.label for f in DRIVERS.values() if not f.one_file)
        raise ValueError(
            f"{what}: {path!r} is a file but neither {files} (a {dirs} checkpoint is a "
            f"directory)"
        )
    if os.path.isdir(path):
        _unclaimed_directory(path, what)
    return DEFAULT


NPY_MAGIC = b"\x93NUMPY"
"""The first bytes of a ``.npy`` file (numpy's format)."""


def _starts_with(path: str, magic: bytes) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(len(magic)) == magic
    except OSError:
        return False


ZARR_V2 = (".zgroup", ".zarray", ".zmetadata")
"""The files that mark a Zarr v2 group or array (a v3 store has ``zarr.json`` instead)."""


def _unclaimed_directory(path: str, what: str) -> None:
    """A directory no format claims: ValueError for a Zarr v2 store (pyshard reads Zarr v3
    only), FileNotFoundError for an empty one; anything else is left to :data:`DEFAULT`'s
    description (no manifest)."""
    try:
        names = os.listdir(path)
    except OSError:
        return  # DEFAULT's description says what is wrong
    v2 = sorted(n for n in names if n in ZARR_V2)
    if v2:
        raise ValueError(
            f"{what}: {path!r} is a Zarr v2 store ({', '.join(v2)}, no zarr.json): pyshard "
            f"reads Zarr v3 only (convert it, for example by copying it with zarr-python 3 "
            f"into a zarr_format=3 group)"
        )
    if not names:
        raise FileNotFoundError(
            f"{what}: {path!r} is an empty directory: no checkpoint (no {MANIFEST}, "
            f"zarr.json or data files)"
        )


def open_arrays(path: str, what: str) -> Tuple[Format, Arrays, Facts]:
    """(format, arrays, checkpoint facts) of the checkpoint at ``path``; the facts are
    ``version``, ``ranks``, ``created`` and ``metadata`` (None / {} for other tools' files).
    Raises FileNotFoundError, ValueError (an untrustworthy file, named), ImportError (the
    format's package is missing: the message names the extra)."""
    fmt = detect(path, what)
    arrays, facts = fmt.describe(path, what)
    return fmt, arrays, facts
