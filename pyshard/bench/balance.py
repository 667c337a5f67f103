"""The balance benchmark: ``python -m pyshard.bench.balance`` (serial tables), or under
``mpiexec -n P`` (adds the time of one ``ps.balance`` call at P ranks).

- quality: on random, heavy-tailed and Gaussian-cluster cost fields, the largest shard found
  by ``balance_array`` against the best rectilinear split by brute force (small 2-D cases;
  1-D cases against the brute force of :func:`brute_1d`), and against the even split;
- time: one ``balance_array`` call on a 1024^2 cluster on simulated meshes up to 256x256
  (65,536 ranks), and one ``ps.balance`` call at the ranks of the run.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from typing import List, Optional

import numpy as np
from mpi4py import MPI

import pyshard as ps
from pyshard import collectives


def field(kind: str, shape: tuple, rng: np.random.Generator) -> np.ndarray:
    """A cost field: ``random`` (uniform integers), ``tail`` (heavy-tailed), ``cluster``."""
    if kind == "random":
        return rng.integers(0, 10, shape).astype(float)
    if kind == "tail":
        return np.floor(rng.exponential(1.0, shape) ** 3 * 3)
    grid = np.meshgrid(*[np.arange(n) for n in shape], indexing="ij")
    c = rng.uniform(0, shape[0], len(shape))
    r2 = sum((g - ci) ** 2 for g, ci in zip(grid, c))
    return np.floor(1 + 20 * np.exp(-r2 / (2 * (shape[0] / 6) ** 2)))


def brute_1d(c: np.ndarray, p: int) -> float:
    s = np.concatenate(([0.0], np.cumsum(c)))
    return min(max(s[b] - s[a] for a, b in zip((0, *cut), (*cut, len(c))))
               for cut in itertools.combinations_with_replacement(range(len(c) + 1), p - 1))


def brute_2d(c: np.ndarray, p0: int, p1: int) -> float:
    n0, n1 = c.shape
    s = np.zeros((n0 + 1, n1 + 1))
    s[1:, 1:] = c.cumsum(0).cumsum(1)
    bs = np.array([[0, *b, n1] for b in itertools.combinations_with_replacement(range(n1 + 1),
                                                                               p1 - 1)])
    best = np.inf
    for a in itertools.combinations_with_replacement(range(n0 + 1), p0 - 1):
        oa = (0, *a, n0)
        m = np.zeros(len(bs))
        for i in range(p0):
            row = s[oa[i + 1]] - s[oa[i]]
            for j in range(p1):
                m = np.maximum(m, row[bs[:, j + 1]] - row[bs[:, j]])
        best = min(best, float(m.min()))
    return best


def quality(cases: int) -> None:
    rng = np.random.default_rng(7)
    print("quality: largest shard found / best rectilinear (brute force), and even / best")
    print(f"  {'case':28s} {'n':>3s} {'exact':>6s} {'mean':>7s} {'worst':>7s} {'even':>7s}")
    for kind in ("random", "tail", "cluster"):
        for shape, mesh in (((10,), (3,)), ((8, 8), (2, 2)), ((8, 8), (3, 2)), ((8, 8), (3, 3)),
                            ((16, 16), (2, 2))):
            r, ev = [], []
            for _ in range(cases):
                c = field(kind, shape, rng)
                lay = ps.Layout(shape, np.float64, mesh, [ps.Shard(d) for d in range(len(mesh))])
                b = ps.balance_array(c, lay, tolerance=0.0)
                best = brute_1d(c, mesh[0]) if len(shape) == 1 else brute_2d(c, *mesh)
                if best > 0:
                    r.append(b.found_max / best)
                    ev.append(b.before_max / best)
            r_ = np.array(r)
            name = f"{kind} {'x'.join(map(str, shape))} on {'x'.join(map(str, mesh))}"
            print(f"  {name:28s} {len(r_):3d} {int(np.sum(r_ < 1 + 1e-12)):6d} "
                  f"{r_.mean():7.4f} {r_.max():7.4f} {np.mean(ev):7.3f}")


def timing(meshes: List[tuple], n: int) -> None:
    rng = np.random.default_rng(1)
    c = field("cluster", (n, n), rng)
    print(f"time: one balance_array call, {n}^2 cluster, simulated meshes")
    print(f"  {'mesh':>9s} {'ranks':>6s} {'seconds':>8s} {'before':>7s} {'after':>7s} "
          f"{'bound':>7s} {'sweeps':>6s}")
    for mesh in meshes:
        lay = ps.Layout((n, n), np.float64, mesh, [ps.Shard(0), ps.Shard(1)])
        t = time.perf_counter()
        b = ps.balance_array(c, lay)
        dt = time.perf_counter() - t
        print(f"  {'x'.join(map(str, mesh)):>9s} {mesh[0] * mesh[1]:6d} {dt:8.3f} "
              f"{b.before:7.3f} {b.after:7.3f} {b.lower_bound / b.mean:7.3f} {b.sweeps:6d}")


def mpi_timing(comm: MPI.Comm, n: int, reps: int) -> None:
    dims = MPI.Compute_dims(comm.size, 2)
    mesh = ps.Mesh(comm, dims)
    c = field("cluster", (n, n), np.random.default_rng(1))
    cost = ps.distribute(c, mesh, [ps.Shard(0), ps.Shard(1)])
    ts = []
    for _ in range(reps + 1):
        collectives.barrier(comm)
        t = time.perf_counter()
        b = ps.balance(cost)
        ts.append(collectives.max_all(comm, time.perf_counter() - t))
    if comm.rank == 0:
        print(f"time: one ps.balance call at {comm.size} ranks ({'x'.join(map(str, dims))}), "
              f"{n}^2 cluster: median {np.median(ts[1:]):.4f} s over {reps} (slowest rank), "
              f"{b.collectives} collectives, imbalance {b.before:.3f} -> {b.after:.3f}")
    mesh.free()


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=10, help="random fields per quality row")
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--max-mesh", type=int, default=256, help="largest simulated mesh side")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args(argv)
    comm = MPI.COMM_WORLD
    if comm.rank == 0:
        quality(args.cases)
        timing([(m, m) for m in (2, 4, 16, 64, 256) if m <= args.max_mesh], args.n)
    mpi_timing(comm, args.n, args.reps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
