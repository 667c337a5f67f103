"""Halo update timings on cupy arrays against the same update on numpy arrays, and a check of
the ghosts against numpy, for scripts/gpu-check.sh (a GPU machine). One line per case:

    mpiexec -n 4 python scripts/gpu_halo_time.py [--n 8192] [--reps 20]

Cases: 2-D n x n float64, width 1 and 4, periodic, box stencil, on the mesh MPI.Compute_dims
gives; microseconds per update (median over ranks' slowest of ``reps`` timed updates after 3
warm-ups). The GPU update is synchronised (``cupy.cuda.Device().synchronize()``) before the
clock stops. Prints ``gpu-halo: ok`` when every ghost matched the host update.
"""

from __future__ import annotations

import argparse
import time
from typing import Callable

import cupy as cp
import numpy as np
from mpi4py import MPI

import pyshard as ps


def _timed(
    comm: MPI.Comm, fn: Callable[[], object], reps: int, sync: Callable[[], object]
) -> float:
    for _ in range(3):
        fn()
    sync()
    ts = []
    for _ in range(reps):
        comm.Barrier()
        t0 = time.perf_counter()
        fn()
        sync()
        ts.append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
    return float(np.median(ts)) * 1e6


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    comm = MPI.COMM_WORLD
    dims = MPI.Compute_dims(comm.size, 2)
    mesh = ps.Mesh(comm, tuple(dims))
    rng = np.random.default_rng(7)
    g = rng.standard_normal((a.n, a.n)) if comm.rank == 0 else None
    g = comm.bcast(g, root=0)
    host = ps.distribute(g, mesh, [ps.Shard(0), ps.Shard(1)])
    dev = ps.from_local(cp.asarray(host.local), mesh, list(host.placements),
                        global_shape=host.global_shape)  # fmt: skip
    ok = True
    sync = cp.cuda.Device().synchronize
    small = cp.empty(1024)
    for width in (1, 4):
        hh = host.with_halo(width, periodic=True, corners=True)
        hd = dev.with_halo(width, periodic=True, corners=True)
        t_host = _timed(comm, hh.update, a.reps, lambda: None)
        t_dev = _timed(comm, hd.update, a.reps, sync)
        same = bool(np.array_equal(cp.asnumpy(hd.padded), hh.padded))
        ok = ok and comm.allreduce(same, op=MPI.LAND)
        # where a GPU update's time goes: start() (pack kernels, device-to-host copy, sync,
        # MPI posted) and wait() (MPI completed, host-to-device copy, unpack kernel), each
        # synchronised; a bare device sync; one small kernel (a cupy fill) and its sync
        t_start = t_wait = 0.0
        for _ in range(a.reps):
            comm.Barrier()
            t0 = time.perf_counter()
            hd.start()
            sync()
            t1 = time.perf_counter()
            hd.wait()
            sync()
            t2 = time.perf_counter()
            t_start += comm.allreduce(t1 - t0, op=MPI.MAX)
            t_wait += comm.allreduce(t2 - t1, op=MPI.MAX)
        t_sync = _timed(comm, lambda: None, a.reps, sync)
        t_fill = _timed(comm, lambda: small.fill(1.0), a.reps, sync)
        if comm.rank == 0:
            print(
                f"gpu-halo {a.n}x{a.n} float64 w{width} periodic box, {comm.size} ranks mesh "
                f"{dims[0]}x{dims[1]}, method {hd.chosen}: cupy {t_dev:.1f} us, numpy "
                f"{t_host:.1f} us (x{t_dev / t_host:.2f}); ghosts equal: {same}; cupy start "
                f"{t_start / a.reps * 1e6:.1f} us + wait {t_wait / a.reps * 1e6:.1f} us (mean); "
                f"bare sync {t_sync:.1f} us, one small kernel + sync {t_fill:.1f} us",
                flush=True,
            )
    if comm.rank == 0:
        print(f"gpu-halo: {'ok' if ok else 'MISMATCH'}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
