"""Benchmarks: each case timed next to its communication floor and a hand-written baseline.

``python -m pyshard bench`` (:func:`main`) runs, for every case, in the same run and on the
same communicator:

- pyshard: ``x.redistribute(target, algorithm=...)`` with a cached plan;
- floor: the same exchange as one raw MPI collective (mpi4py) on pre-packed contiguous
  buffers of exactly the same per-peer byte counts (self block included, as MPI does it);
- baseline: what an expert writes by hand with mpi4py: numpy slicing to pack (skipped
  where every block is already contiguous), the raw collective, numpy slicing to unpack
  (skipped where the receive can land in the output directly).

Times are the median and minimum over ``reps`` of the slowest rank (a barrier before each
rep, the maximum over ranks after).

More cases, each a JSON row of its own fields, run only when named in ``--cases``:

- ``checkpoint``: :func:`bench_checkpoint`, save and load GB/s of a float32 array of
  ``--checkpoint-bytes`` next to numpy.save/load on rank 0; with ``--formats`` instead
  :func:`bench_formats` (pyshard/bench/ckpt_formats.py): a ``Shard(1)`` array saved and loaded
  through pyshard in each format and through the tools (gather + h5py / zarr / safetensors,
  zarr-python and tensorstore per rank, torch DCP, h5py mpio).
- ``memory``: :func:`bench_memory`, a loop of ``Shard(0) -> Shard(1)`` redistributes over
  ``--memory-shapes`` distinct shapes (default 400; a ``(1000 + 7 i) x 2048`` float32 shard
  per rank, results dropped), and the peak RSS after 40 shapes and after all, maximum over
  ranks. ``check`` holds when it grew by at most 64 MiB: the caches stay bounded. It takes
  a few hundred MiB per rank and tens of seconds, hence not in the default list.
- ``sparse``: :func:`bench_sparse_setup`, one rank's setup of the 2-D swap simulated on
  meshes of 256, 4096 and 65,536 ranks (no MPI): it grows with the peers, not the ranks.
- ``fft3d``: :func:`bench_fft3d`, a pencil 3-D FFT with :mod:`pyshard.fft` on a 2-D mesh
  (``--fft-n``, default 256^3 complex128; ``examples/fft3d.py``), total and transposes
  alone, next to mpi4py-fft's PFFT with the numpy backend when it is installed
  (``pip install .[bench-fft]``, which needs FFTW: ``apt-get install libfftw3-dev``).
- ``fft``: :func:`pyshard.bench.fft.bench_fft`, :mod:`pyshard.fft` on ``--fft-n``^3 (c2c
  complex128 and r2c float64; slab ``[Shard(0)]`` on a 1-D mesh and pencil ``[Shard(0),
  Shard(1)]`` on ``MPI.Compute_dims(P, 2)``), forward and backward, each split into its
  local-FFT and transpose time; a batched 2-D case (``--fft-batch BxM``: ``B x M x M``
  complex128 over axes (1, 2), batch sharded, no transpose) against serial scipy.fft of one
  rank's share; PFFT's forward+backward when mpi4py-fft imports.

``--device cuda`` (:mod:`pyshard.bench.gpu`) runs ``transpose`` and ``gather`` on cupy arrays
instead, each next to the same exchange written by hand with cupy and mpi4py (a device pack,
the raw collective on device memory with a CUDA-aware MPI, else staged through pinned host
buffers), plus the CUDA pack kernel's bandwidth as a fraction of a device-to-device copy.

``python -m pyshard plot`` (:func:`plot_main`) draws the JSON lines.

The modules: ``cases`` (the case table), ``floors`` (raw-MPI floors and the hand-written
baselines), ``host`` (one case on numpy arrays), ``gpu`` (the same on cupy arrays, and the
pack kernel), ``checkpoint``, ``memory``, ``sparse``, ``fft3d`` (the extra cases),
``report`` (the table, JSON lines), ``plot`` (figures), ``timing`` (the slowest rank's wall
time), ``cli`` (the command line). They import the library, never the other way round.
"""

from __future__ import annotations

from .cases import CASES, EXTRA_CASES, Case, make_cases
from .checkpoint import bench_checkpoint
from .ckpt_formats import bench_formats
from .cli import main
from .fft3d import bench_fft3d
from .host import run_case
from .memory import bench_memory
from .plot import plot_main
from .sparse import bench_sparse_setup

__all__ = [
    "CASES",
    "EXTRA_CASES",
    "Case",
    "bench_checkpoint",
    "bench_formats",
    "bench_fft3d",
    "bench_memory",
    "bench_sparse_setup",
    "main",
    "make_cases",
    "plot_main",
    "run_case",
]
