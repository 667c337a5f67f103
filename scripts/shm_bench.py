"""The node-local transport against MPI and the raw collectives, in one run (the
node-shared-memory targets of docs/performance.md): plain calls through node-shared memory
(``algorithm="auto"``), the same through MPI (``algorithm="alltoallv"``, which makes every step
take MPI), and mpi4py's raw collectives moving the same bytes.

    mpiexec -n 4 python scripts/shm_bench.py [--n 8192] [--reps 9]

Cases (float32): Shard(0) -> Shard(1) of n x n against a raw Alltoall of the pre-packed shard
(MPI's self block included) and a memcpy of the shard; Shard(0) -> Replicate against a naive
Allgather into a fresh array (and into a reused one); Partial(sum) -> Shard(0) of n x n/4
(node-shared memory where every rank shares the node, and MPI's Reduce_scatter) against a raw
Reduce_scatter_block into a reused buffer; Partial(sum) -> Replicate of the same against a raw
Allreduce into a reused buffer; a cached 64 x 64 transpose against a raw
Alltoallv. Medians over reps of the slowest rank's time, in ms; ratios to the named floor on
the right.
"""

from __future__ import annotations

import argparse
from typing import Callable, Dict

import numpy as np
from mpi4py import MPI

import pyshard as ps
from pyshard.bench.timing import median_s


def _timed(comm: MPI.Comm, fn: Callable[[], object], reps: int) -> float:
    """Median ms of the slowest rank over ``reps`` calls after two untimed ones."""
    return median_s(fn, comm, reps, warmup=2) * 1e3


def _line(comm: MPI.Comm, name: str, res: Dict[str, float], floor: str) -> None:
    if comm.rank == 0:
        f = res[floor]
        cells = ", ".join(f"{k} {v:.3f} ms ({v / f:.2f}x)" for k, v in res.items())
        print(f"{name}, {comm.size} ranks: {cells}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=9)
    a = ap.parse_args()
    comm = MPI.COMM_WORLD
    p, n, reps = comm.size, a.n, a.reps
    mesh = ps.Mesh(comm, (p,))
    rows = n // p
    x = ps.from_local(
        np.ones((rows, n), np.float32), mesh, [ps.Shard(0)], global_shape=(rows * p, n)
    )
    S1, R = [ps.Shard(1)], [ps.Replicate()]

    res = {}
    res["shm"] = _timed(comm, lambda: x.redistribute(S1), reps)
    res["MPI"] = _timed(comm, lambda: x.redistribute(S1, algorithm="alltoallv"), reps)
    sb = np.ones(x.local.nbytes, np.uint8)
    rb = np.zeros_like(sb)
    res["raw Alltoall"] = _timed(comm, lambda: comm.Alltoall([sb, MPI.BYTE], [rb, MPI.BYTE]), reps)
    res["memcpy of the shard"] = _timed(comm, lambda: np.copyto(rb, sb), reps)
    _line(comm, f"S(0)->S(1) {rows * p}x{n}", res, "raw Alltoall")

    res = {}
    res["shm"] = _timed(comm, lambda: x.redistribute(R), reps)
    res["MPI"] = _timed(comm, lambda: x.redistribute(R, algorithm="alltoallv"), reps)
    loc = x.local
    res["naive Allgather"] = _timed(
        comm, lambda: comm.Allgather(loc, np.empty((rows * p, n), np.float32)), reps
    )
    buf = np.empty((rows * p, n), np.float32)
    res["Allgather, reused buffer"] = _timed(comm, lambda: comm.Allgather(loc, buf), reps)
    _line(comm, f"S(0)->R {rows * p}x{n}", res, "naive Allgather")

    res = {}
    xp = ps.from_local(np.ones((rows * p, n // 4), np.float32), mesh, [ps.Partial("sum")],
                       global_shape=(rows * p, n // 4))  # fmt: skip
    res["shm"] = _timed(comm, lambda: xp.redistribute([ps.Shard(0)]), reps)
    res["MPI"] = _timed(
        comm, lambda: xp.redistribute([ps.Shard(0)], algorithm="alltoallv"), reps
    )
    out = np.empty((rows, n // 4), np.float32)
    lp = xp.local
    res["raw Reduce_scatter_block"] = _timed(
        comm, lambda: comm.Reduce_scatter_block(lp, out, op=MPI.SUM), reps
    )
    _line(comm, f"P->S(0) {rows * p}x{n // 4}", res, "raw Reduce_scatter_block")

    res = {}
    res["shm"] = _timed(comm, lambda: xp.redistribute([ps.Replicate()]), reps)
    res["MPI"] = _timed(
        comm, lambda: xp.redistribute([ps.Replicate()], algorithm="alltoallv"), reps
    )
    full = np.empty_like(lp)
    res["raw Allreduce"] = _timed(comm, lambda: comm.Allreduce(lp, full, op=MPI.SUM), reps)
    _line(comm, f"P->R {rows * p}x{n // 4}", res, "raw Allreduce")

    res = {}
    m = 64 // p * p
    xs = ps.distribute(np.ones((m, m), np.float32), mesh, [ps.Shard(0)])
    small = 20 * reps
    # auto: 64 x 64 is below PYSHARD_SHM_MIN_BYTES, so this call takes MPI
    res["auto"] = _timed(comm, lambda: [xs.redistribute(S1) for _ in range(small)], 3) / small
    res["MPI"] = (
        _timed(comm, lambda: [xs.redistribute(S1, algorithm="alltoallv") for _ in range(small)], 3)
        / small
    )
    blk = xs.local.nbytes // p
    cnt, dsp = [blk] * p, [i * blk for i in range(p)]
    s2, r2 = np.ones(xs.local.nbytes, np.uint8), np.zeros(xs.local.nbytes, np.uint8)
    res["raw Alltoallv"] = (
        _timed(
            comm,
            lambda: [
                comm.Alltoallv([s2, (cnt, dsp), MPI.BYTE], [r2, (cnt, dsp), MPI.BYTE])
                for _ in range(small)
            ],  # fmt: skip
            3,
        )
        / small
    )
    _line(comm, f"S(0)->S(1) {m}x{m} cached", res, "raw Alltoallv")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
