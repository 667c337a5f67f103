"""pyshard.jax's costs: a jit-compiled transpose against the numpy front end and the raw floor,
and a tiny call's overhead inside jit.

    mpiexec -n 4 python scripts/jax_bench.py [--n 4096] [--small 64] [--reps 9]

1. ``[Shard(0)] -> [Shard(1)]`` of an ``n x n`` float32 array, one call per timing:
   - ``jit``: ``jax.jit(lambda x: psj.redistribute(x, [Shard(1)]))`` (the result blocked on);
   - ``numpy mpi``: ``ShardedArray.redistribute`` with ``algorithm="alltoallv"`` (the same
     MPI step pyshard.jax runs);
   - ``numpy auto``: ``ShardedArray.redistribute`` as a user calls it (node-shared memory
     where the route takes it);
   - ``floor``: ``MPI_Alltoall`` of the bytes that move, pre-packed (each rank sends
     ``n*n/P^2`` elements to each peer).
2. The same at ``small x small``: the overhead of one tiny op inside ``jit`` against the raw
   ``MPI_Alltoall`` of its bytes.
3. ``--fft N`` (256 by default; 0 skips it): an FFT round trip of an ``N^3`` complex64 array
   on a 1-D mesh, ``Shard(0)``: ``fftn`` to wherever its last pass ends
   (``placements="any"``), then ``ifftn`` back to ``Shard(0)``; ``jit``: both in one
   ``jax.jit`` of ``pyshard.jax``, against ``pyshard.fft`` (numpy, its default engine) with
   the same plans.

Times are the slowest rank's medians (pyshard.bench.timing) of ``--reps`` calls (of batches
of 20 calls for the small case); one line of JSON per measurement on rank 0.
"""

from __future__ import annotations

import argparse
import json
from typing import List, Optional

import jax
import numpy as np
from mpi4py import MPI

import pyshard as ps
import pyshard.jax as psj
from pyshard import Shard
from pyshard._backend import malloc_name
from pyshard.bench.timing import median_s


def case(comm: MPI.Comm, mesh: ps.Mesh, n: int, reps: int, batch: int) -> dict:
    P = comm.size
    g = np.arange(n * n, dtype=np.float32).reshape(n, n) if n <= 256 else None
    if g is None:  # every rank makes only its shard
        lay = ps.Layout((n, n), np.float32, mesh.shape, [Shard(0)])
        local = np.random.default_rng(comm.rank).random(lay.local_shape(mesh.coords),
                                                         dtype=np.float32)
        x = ps.from_local(local, mesh, [Shard(0)], (n, n))
        xj = psj.from_local(jax.numpy.asarray(local), mesh, [Shard(0)], (n, n))
    else:
        x = ps.distribute(g, mesh, [Shard(0)])
        xj = psj.distribute(g, mesh, [Shard(0)])
    f = jax.jit(lambda x: psj.redistribute(x, [Shard(1)]))

    def run_jit() -> None:
        for _ in range(batch):
            f(xj).local.block_until_ready()

    def run_np(algorithm: str) -> None:
        for _ in range(batch):
            x.redistribute([Shard(1)], algorithm=algorithm)

    block = (n // P) * (n // P)
    sb = np.ones(block * P, np.float32)
    rb = np.empty_like(sb)

    def floor() -> None:
        for _ in range(batch):
            comm.Alltoall(sb, rb)

    # correctness once: the jit result is the numpy one
    assert np.array_equal(np.asarray(f(xj).local), x.redistribute([Shard(1)]).local)
    out = {"case": f"S0->S1 {n}x{n} float32", "ranks": P, "batch": batch}
    for name, fn in (("jit_ms", run_jit), ("numpy_mpi_ms", lambda: run_np("alltoallv")),
                     ("numpy_auto_ms", lambda: run_np("auto")), ("floor_alltoall_ms", floor)):
        out[name] = round(median_s(fn, comm, reps, warmup=2) / batch * 1e3, 4)
    out["jit_over_numpy_mpi"] = round(out["jit_ms"] / out["numpy_mpi_ms"], 3)
    out["jit_over_numpy_auto"] = round(out["jit_ms"] / out["numpy_auto_ms"], 3)
    out["jit_over_floor"] = round(out["jit_ms"] / out["floor_alltoall_ms"], 3)
    return out


def fft_case(comm: MPI.Comm, mesh: ps.Mesh, n: int, reps: int) -> dict:
    import pyshard.fft as pfft

    shape = (n, n, n)
    lay = ps.Layout(shape, np.complex64, mesh.shape, [Shard(0)])
    rng = np.random.default_rng(comm.rank)
    ls = lay.local_shape(mesh.coords)
    local = (rng.random(ls, dtype=np.float32) + 1j * rng.random(ls, dtype=np.float32)).astype(
        np.complex64)
    x = ps.from_local(local, mesh, [Shard(0)], shape)
    xj = psj.from_local(jax.numpy.asarray(local), mesh, [Shard(0)], shape)

    def trip_np() -> ps.ShardedArray:
        return pfft.ifftn(pfft.fftn(x, placements="any"), placements=[Shard(0)])

    f = jax.jit(lambda v: psj.ifftn(psj.fftn(v, placements="any"), placements=[Shard(0)]))

    def trip_jit() -> None:
        f(xj).local.block_until_ready()

    a, b = np.asarray(f(xj).local), trip_np().local  # correctness once: both give x back
    ok = bool(np.allclose(a, local, atol=1e-4) and np.allclose(b, local, atol=1e-4))
    out = {"case": f"fft round trip {n}^3 complex64, Shard(0)", "ranks": comm.size,
           "check": bool(comm.allreduce(ok, op=MPI.LAND))}
    for name, fn in (("jit_ms", trip_jit), ("numpy_ms", trip_np)):
        out[name] = round(median_s(fn, comm, reps, warmup=2) * 1e3, 2)
    out["jit_over_numpy"] = round(out["jit_ms"] / out["numpy_ms"], 3)
    return out


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--small", type=int, default=64)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--fft", type=int, default=256)
    a = ap.parse_args(argv)
    comm = MPI.COMM_WORLD
    mesh = ps.Mesh(comm, (comm.size,))
    runs = [lambda n=n, b=b: case(comm, mesh, n, a.reps, b) for n, b in ((a.n, 1), (a.small, 20))]
    if a.fft:
        runs.append(lambda: fft_case(comm, mesh, a.fft, a.reps))
    for run in runs:
        r = run()
        r["jax"] = jax.__version__
        r["malloc"] = malloc_name()  # tcmalloc keeps XLA's freed buffers (docs/jax.md)
        if comm.rank == 0:
            print(json.dumps(r), flush=True)
    mesh.free()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
