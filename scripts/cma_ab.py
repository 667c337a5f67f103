"""A node-shared exchange into a private ``out=``: node peers writing into it by cross-memory
attach (``PYSHARD_CMA`` on) against landing in a segment and copying over (off), MPI into the
same ``out`` and auto into a pooled result, alternated in one process (docs/performance.md,
"Into ``out=`` by cross-memory attach").

    mpiexec -n 2 python scripts/cma_ab.py [--n 4096] [--rounds 3] [--reps 15]

S0->S1 of an n x n float32 array on a 1-D mesh; each value is the slowest rank's median of
``--reps`` calls (pyshard.bench.timing), ms, one list of ``--rounds`` values per variant. The
results are checked against each other first.
"""

from __future__ import annotations

import argparse
from typing import Callable

import numpy as np
from mpi4py import MPI

import pyshard as ps
from pyshard.bench.timing import median_s


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=15)
    a = ap.parse_args()
    comm = MPI.COMM_WORLD
    p, n = comm.size, a.n
    mesh = ps.Mesh(comm, (p,))
    rows = n // p
    g = np.arange(rows * p * n, dtype=np.float32).reshape(rows * p, n)
    x = ps.from_local(g[comm.rank * rows:(comm.rank + 1) * rows].copy(), mesh, [ps.Shard(0)],
                      global_shape=g.shape)  # fmt: skip
    s1 = [ps.Shard(1)]
    ref = np.asarray(x.redistribute(s1).local)
    out = np.empty_like(ref)
    for on in (False, True):
        with ps.config.override(PYSHARD_CMA=on):
            out[...] = -1
            x.redistribute(s1, out=out)
            assert np.array_equal(out, ref), f"PYSHARD_CMA={on}: wrong result"

    def timed(fn: Callable[[], object]) -> float:
        return median_s(fn, comm, a.reps, warmup=2) * 1e3

    res: dict = {"segment": [], "attach": [], "mpi": [], "pooled": []}
    for _ in range(a.rounds):
        for name, on in (("segment", False), ("attach", True)):
            with ps.config.override(PYSHARD_CMA=on):
                res[name].append(timed(lambda: x.redistribute(s1, out=out)))
        res["mpi"].append(timed(lambda: x.redistribute(s1, out=out, algorithm="alltoallv")))
        res["pooled"].append(timed(lambda: x.redistribute(s1)))
    node = mesh.node_transport((0,))
    if comm.rank == 0:
        cells = ", ".join(f"{k} {[round(v, 2) for v in vs]}" for k, vs in res.items())
        able = node is not None and node.cma
        print(f"S0->S1 {n}^2 float32 into out=, {p} ranks (attach possible: {able}): {cells} ms")
    mesh.free()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
