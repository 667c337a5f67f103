"""Checkpoints: sharded arrays saved in one of four formats and loaded into any layout on any
mesh and rank count: a directory of plain ``.npy`` files and a manifest (``"npy"``, the
default), one HDF5 file (``"hdf5"``), a Zarr v3 group (``"zarr"``) or one safetensors file
(``"safetensors"``). h5py, safetensors/torch, zarr-python and tensorstore open them, and
files of those formats from those tools load too (the format is detected). Data moves with
MPI-IO (collective subarray views, or one contiguous run per rank) or the format's library
for chunked storage. See ``docs/checkpoints.md``.

Each format is one driver (:class:`~pyshard.checkpoint.driver.Format`: probe, describe, save
boxes, read a block) in one module, registered in the table of
:mod:`~pyshard.checkpoint.formats`; :func:`save`, :func:`load` and :func:`checkpoint_info`
reach every format through that table. One idea per module:

- :mod:`~pyshard.checkpoint.driver`: the protocol every format implements;
- :mod:`~pyshard.checkpoint.formats`: the table, and which format a path holds (no MPI);
- :mod:`~pyshard.checkpoint.npy_format`, :mod:`~pyshard.checkpoint.hdf5_format`,
  :mod:`~pyshard.checkpoint.zarr_format`, :mod:`~pyshard.checkpoint.safetensors_format`:
  the four drivers (Zarr's parts in ``zarr_meta``, ``zarr_inspect``, ``zarr_codecs``,
  ``zarr_read``, ``zarr_write``);
- :mod:`~pyshard.checkpoint.saving`: what every save shares (agreement, the save-target
  check, the writer of a box, the prepare and commit around the data);
- :mod:`~pyshard.checkpoint.onefile`: the save of a one-file format (HDF5, safetensors);
- :mod:`~pyshard.checkpoint.record`: the pyshard record kept beside other formats' data;
- :mod:`~pyshard.checkpoint.manifest`: the ``.npy`` format's manifest, headers, file names,
  placements as strings and checksums (no MPI);
- :mod:`~pyshard.checkpoint.mpiio`: one rank's box of a file written or read with MPI-IO;
- :mod:`~pyshard.checkpoint.reading`: one rank's part of an array read from a file, and the
  agreement of read verdicts;
- :mod:`~pyshard.checkpoint.errors`: path arguments, and errors raised alike on every rank;
- :mod:`~pyshard.checkpoint.writer`: :func:`save`;
- :mod:`~pyshard.checkpoint.reader`: :func:`load`;
- :mod:`~pyshard.checkpoint.info`: :func:`checkpoint_info`.
"""

from __future__ import annotations

from .info import checkpoint_info
from .reader import load
from .writer import save

__all__ = ["checkpoint_info", "load", "save"]
