"""Gather plans on cupy arrays against the same plan on numpy arrays, for scripts/gpu-check.sh
(a GPU machine), and what the device pack saves against staging the whole shard:

    mpiexec -n 4 python scripts/gpu_gather_time.py [--rows 2000000] [--feat 16] [--ghost 0.01]

Each rank owns ``rows`` rows of ``feat`` float32 and reads ``ghost`` of that many rows from
its two neighbours (a partitioned mesh's ghost rows) plus as many of its own. Microseconds per
call (median over the slowest rank of ``reps`` calls after 3 warm-ups) of: a gather and a
scatter (sum) on cupy (GPU synchronised before the clock stops) and on numpy, and the cost
of one device-to-host copy of the whole shard, which every call paid before the device pack.
Prints ``gpu-gather: ok`` when the cupy gather equals ``G[indices]``.
"""

from __future__ import annotations

import argparse
import time
from typing import Callable

import cupy as cp
import numpy as np
from mpi4py import MPI

import pyshard as ps


def _timed(comm: MPI.Comm, fn: Callable[[], object], reps: int) -> float:
    for _ in range(3):
        fn()
    cp.cuda.Device().synchronize()
    ts = []
    for _ in range(reps):
        comm.Barrier()
        t0 = time.perf_counter()
        fn()
        cp.cuda.Device().synchronize()
        ts.append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
    return float(np.median(ts)) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--feat", type=int, default=16)
    ap.add_argument("--ghost", type=float, default=0.01)
    ap.add_argument("--reps", type=int, default=10)
    a = ap.parse_args()
    comm = MPI.COMM_WORLD
    P, r = comm.size, comm.rank
    N = a.rows * P
    mesh = ps.Mesh(comm, (P,))
    rng = np.random.default_rng(r)
    k = max(1, int(a.rows * a.ghost))
    lo = r * a.rows
    idx = np.concatenate([rng.integers(lo - a.rows, lo, k) % N,
                          rng.integers(lo + a.rows, lo + 2 * a.rows, k) % N,
                          rng.integers(lo, lo + a.rows, k)]).astype(np.int64)
    local = (np.arange(a.rows, dtype=np.float32)[:, None] + lo
             + np.arange(a.feat, dtype=np.float32)[None, :] / 64)
    xh = ps.from_local(local, mesh, [ps.Shard(0)], global_shape=(N, a.feat))
    xd = ps.from_local(cp.asarray(local), mesh, [ps.Shard(0)], global_shape=(N, a.feat))
    plan = ps.gather_plan(idx, like=xh)
    got = cp.asnumpy(plan.gather(xd))
    want = idx.astype(np.float32)[:, None] + np.arange(a.feat, dtype=np.float32)[None, :] / 64
    ok = comm.allreduce(int(np.array_equal(got, want)), op=MPI.MIN)
    vh = np.ones((idx.size, a.feat), np.float32)
    vd = cp.asarray(vh)
    t = {
        "gather cupy": _timed(comm, lambda: plan.gather(xd), a.reps),
        "gather numpy": _timed(comm, lambda: plan.gather(xh), a.reps),
        "scatter cupy": _timed(comm, lambda: plan.scatter(vd, into=xd), a.reps),
        "scatter numpy": _timed(comm, lambda: plan.scatter(vh, into=xh), a.reps),
        "whole shard to host": _timed(comm, lambda: cp.asnumpy(xd.local), a.reps),
    }
    if r == 0:
        mb = a.rows * a.feat * 4 / 2**20
        print(f"gpu-gather: {P} ranks, {a.rows} rows x {a.feat} float32 per rank "
              f"({mb:.0f} MiB), {idx.size} indices per rank ({a.ghost:.0%} per neighbour), "
              f"touched rows {plan.touched.size}")
        for name, us in t.items():
            print(f"gpu-gather: {name:22s} {us:10.0f} us")
        print("gpu-gather:", "ok" if ok else "WRONG")
    mesh.free()


if __name__ == "__main__":
    main()
