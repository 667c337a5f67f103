"""The ``checkpoint`` bench case: save and load GB/s of a float32 array, next to
numpy.save and numpy.load of the whole array on rank 0."""

from __future__ import annotations

import numbers
import os
import shutil
import tempfile
from typing import Any, Dict, Optional, Tuple

import numpy as np
from mpi4py import MPI

from .. import collectives
from ..array import ShardedArray
from ..checkpoint import load, save
from ..checkpoint.errors import PathArg, error, norm_path, on_root
from ..checkpoint.mpiio import box_bounds
from ..layout import Layout, Shard
from ..mesh import Mesh
from .timing import median_s


def _check_bench_args(mesh: object, nbytes: object, reps: object) -> None:
    if not isinstance(mesh, Mesh):
        raise TypeError(f"bench_checkpoint(mesh): expected a pyshard.Mesh, got {mesh!r}")
    if isinstance(nbytes, bool) or not isinstance(nbytes, numbers.Integral) or nbytes < 4:
        raise ValueError(f"bench_checkpoint(nbytes): need an int >= 4, got {nbytes!r}")
    if isinstance(reps, bool) or not isinstance(reps, numbers.Integral) or reps < 1:
        raise ValueError(f"bench_checkpoint(reps): need an int >= 1, got {reps!r}")


def bench_dir(comm: MPI.Comm, path: Optional[PathArg]) -> str:
    """A new temporary directory (under ``path`` if given, created if missing), made by
    rank 0 and known to every rank (one bcast)."""
    p = None if path is None else norm_path(path, "bench_checkpoint")

    def make() -> str:
        if p is not None:
            os.makedirs(p, exist_ok=True)
        return tempfile.mkdtemp(prefix="pyshard-bench-", dir=p)

    return on_root(
        comm, make, lambda e: error("ValueError", f"bench_checkpoint: cannot use {p!r}: {e}")
    )


def _bench_pattern(start: int, n: int) -> np.ndarray:
    """Elements ``start .. start + n`` of the benchmark array (float32, values below 1009)."""
    return (np.arange(start, start + n, dtype=np.int64) % 1009).astype(np.float32)


def _time_checkpoint(
    x: ShardedArray, ckpt: str, reps: int, sync: bool
) -> Tuple[float, float, bool]:
    """(save seconds, load seconds, loaded == saved on every rank); collective over x's mesh."""
    mesh, comm = x.mesh, x.mesh.comm
    save_s = median_s(lambda: save(ckpt, {"x": x}, sync=sync), comm, reps)
    got: Dict[str, ShardedArray] = {}

    def do_load() -> None:
        got.update(load(ckpt, mesh, {"x": [Shard(0)] * mesh.ndim}))

    load_s = median_s(do_load, comm, reps)
    ok = collectives.all_true(comm, bool(np.array_equal(got["x"].local, x.local)))
    return save_s, load_s, ok


def _time_numpy(comm: MPI.Comm, npy: str, n: int, reps: int, sync: bool) -> Tuple[float, float]:
    """(numpy.save seconds, numpy.load seconds) of the whole array on rank 0 alone, the other
    ranks waiting in the same timing collectives."""
    rank = comm.Get_rank()
    ref = _bench_pattern(0, n) if rank == 0 else np.empty(0, np.float32)

    def np_save() -> None:
        if rank == 0:
            with open(npy, "wb") as f:
                np.save(f, ref)
                if sync:
                    f.flush()
                    os.fsync(f.fileno())

    def np_load() -> None:
        if rank == 0:
            np.load(npy)

    return median_s(np_save, comm, reps), median_s(np_load, comm, reps)


def _checkpoint_row(
    b: int, ranks: int, times: Tuple[float, ...], sync: bool, ok: bool
) -> Dict[str, Any]:
    """The JSON row of the checkpoint case; ``times``: save, load, numpy save, numpy load."""
    save_s, load_s, numpy_save_s, numpy_load_s = times
    return {
        "case": "checkpoint",
        "bytes": b,
        "ranks": ranks,
        "save_s": save_s,
        "load_s": load_s,
        "save_GBps": b / save_s / 1e9,
        "load_GBps": b / load_s / 1e9,
        "numpy_save_s": numpy_save_s,
        "numpy_load_s": numpy_load_s,
        "numpy_save_GBps": b / numpy_save_s / 1e9,
        "numpy_load_GBps": b / numpy_load_s / 1e9,
        "sync": bool(sync),
        "verify": True,
        "ok": bool(ok),
    }


def bench_checkpoint(
    mesh: Mesh,
    nbytes: int = 1 << 30,
    path: Optional[PathArg] = None,
    reps: int = 1,
    sync: bool = True,
) -> Dict[str, Any]:
    """Save and load GB/s of a float32 array of ``nbytes``, next to numpy.save/load on rank 0.

    mesh: the ranks; the array is Shard(0) over every mesh dim (nested on an N-D mesh).
    nbytes: the array's size in bytes (rounded down to whole float32 elements).
    path: a directory for the files (created if missing, the files removed afterwards);
    default a new temporary directory. Put it on the file system you want to measure.
    reps: repetitions; times are the median over reps of the slowest rank.
    sync: fsync on save (checkpoint and numpy.save alike), so both pay the disk.

    Collective over ``mesh``. Loads right after a save read from the page cache.
    """
    _check_bench_args(mesh, nbytes, reps)
    comm = mesh.comm
    n = int(nbytes) // 4
    root = bench_dir(comm, path)
    layout = Layout((n,), np.float32, mesh.shape, [Shard(0)] * mesh.ndim)
    start, ext = box_bounds(layout, mesh.coords)
    x = ShardedArray(_bench_pattern(start[0], ext[0]), layout, mesh)
    try:
        save_s, load_s, ok = _time_checkpoint(x, os.path.join(root, "ckpt"), reps, sync)
        npy = os.path.join(root, "numpy.npy")
        times = (save_s, load_s) + _time_numpy(comm, npy, n, reps, sync)
    finally:
        collectives.barrier(comm)
        if comm.Get_rank() == 0:
            shutil.rmtree(root, ignore_errors=True)
        collectives.barrier(comm)
    return _checkpoint_row(n * 4, comm.Get_size(), times, sync, ok)
