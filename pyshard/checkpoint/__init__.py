"""Checkpoints: sharded arrays saved as plain ``.npy`` files with MPI-IO, loadable anywhere,
or (``format=``) as one HDF5 file, one safetensors file or a Zarr v3 group that h5py,
safetensors/torch, zarr-python and tensorstore open; files from those tools load too.

A checkpoint is a directory with one standard ``.npy`` file per array (``numpy.load`` opens
it and gives the global array) and a JSON manifest ``manifest.json`` written last. Data moves
with MPI-IO collective writes and reads through subarray file views, so a checkpoint saved
from one mesh, layout and rank count loads into any other. See ``docs/checkpoints.md``.

One idea per module:

- :mod:`~pyshard.checkpoint.manifest`: the format (manifest, ``.npy`` headers, file names,
  placements as strings, checksums), no MPI;
- :mod:`~pyshard.checkpoint.mpiio`: one rank's box of a ``.npy`` file written or read with
  MPI-IO;
- :mod:`~pyshard.checkpoint.errors`: path arguments, and errors rank 0 finds raised on every
  rank;
- :mod:`~pyshard.checkpoint.formats`: which format a path holds, its arrays described alike
  (no MPI);
- :mod:`~pyshard.checkpoint.hdf5_format`, :mod:`~pyshard.checkpoint.safetensors_format`,
  :mod:`~pyshard.checkpoint.zarr_format`: each format's layout, checks and library calls;
- :mod:`~pyshard.checkpoint.saving`: what every format's save shares (agreement, the writer
  of a box, the pyshard record);
- :mod:`~pyshard.checkpoint.writer`: :func:`save`;
- :mod:`~pyshard.checkpoint.reader`: :func:`load`;
- :mod:`~pyshard.checkpoint.info`: :func:`checkpoint_info`.
"""

from __future__ import annotations

from .info import checkpoint_info
from .reader import load
from .writer import save

__all__ = ["checkpoint_info", "load", "save"]
