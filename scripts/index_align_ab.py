"""Gathers and scatters of one graph with the arrays at 64-byte boundaries and as numpy
allocates them (16 bytes past a page), alternated in one process (docs/unstructured.md, "Rows
at 64-byte boundaries").

    mpiexec -n P python scripts/index_align_ab.py [--rows 1000000] [--rounds 40]

The bench's graph (``pyshard/bench/ghosts.py``: rows of 64 B, each rank reading a tenth of
its row count, the ``mesh`` and ``random`` patterns), one plan. ``al``: ``x``, ``into``, the
values and ``out`` copied to 64-byte boundaries; ``np``: numpy's own allocations. Prints, per
pattern, the slowest rank's median in ms, the first three rounds left out; then, on rank 0
alone, ``np.take`` and ``a[idx] += v`` of the random rows at each offset.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from mpi4py import MPI

import pyshard as ps
from pyshard.array import from_local
from pyshard.bench.ghosts import read_rows, row_values
from pyshard.bench.timing import alternated


def at_offset(a: np.ndarray, off: int = 0) -> np.ndarray:
    """A copy of ``a`` starting ``off`` bytes past a 64-byte boundary."""
    raw = np.empty(a.nbytes + 128, np.uint8)
    s = (-raw.ctypes.data) % 64 + off
    b = raw[s:s + a.nbytes].view(a.dtype).reshape(a.shape)
    b[...] = a
    return b


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=10**6, help="rows a rank")
    ap.add_argument("--rounds", type=int, default=40)
    a = ap.parse_args()
    comm = MPI.COMM_WORLD
    P, me, n = comm.size, comm.rank, a.rows
    mesh = ps.Mesh(comm, (P,))
    local = row_values(n, me)
    shape = (n * P, local.shape[1])
    xs = {"np": from_local(local, mesh, [ps.Shard(0)], global_shape=shape),
          "al": from_local(at_offset(local), mesh, [ps.Shard(0)], global_shape=shape)}
    lines = []
    for pat in ("mesh", "random"):
        idx = read_rows(n, P, me, pat, 0.1)
        plan = ps.gather_plan(idx, like=xs["np"])
        vals = np.random.default_rng([5, me]).standard_normal((idx.shape[0], local.shape[1]))
        bufs = {"np": np.empty_like(vals), "al": at_offset(np.empty_like(vals))}
        valss = {"np": vals, "al": at_offset(vals)}
        ys = {"np": from_local(local.copy(), mesh, [ps.Shard(0)], global_shape=shape),
              "al": from_local(at_offset(local), mesh, [ps.Shard(0)], global_shape=shape)}
        fns = {}
        for k in ("np", "al"):
            fns[("gather", k)] = lambda p=plan, x=xs[k], b=bufs[k]: p.gather(x, out=b)
            fns[("scatter", k)] = lambda p=plan, v=valss[k], t=ys[k]: p.scatter(v, into=t)
        ts = alternated(fns, comm, a.rounds)
        lines.append(f"{pat:>7}: " + "  ".join(
            f"{d} {k} {v * 1e3:.2f}" for (d, k), v in sorted(ts.items())))
    if me == 0:
        print(f"{P} ranks, {n} rows of 64 B a rank, median of {a.rounds - 3} rounds (ms):")
        print("\n".join(lines))
        rows = np.sort(np.random.default_rng(1).choice(n, n // 10, replace=False))
        out = np.empty((rows.size, local.shape[1]))
        for off in (0, 16, 32, 48):
            x = at_offset(local, off)
            tt, ta = [], []
            for _ in range(30):
                t = time.perf_counter()
                np.take(x, rows, axis=0, out=out)
                tt.append(time.perf_counter() - t)
                t = time.perf_counter()
                x[rows] += out
                ta.append(time.perf_counter() - t)
            print(f"rank 0 alone, rows {off} bytes past a line: np.take "
                  f"{np.median(tt) * 1e3:.2f} ms, a[idx] += v {np.median(ta) * 1e3:.2f} ms")
    mesh.free()


if __name__ == "__main__":
    main()
