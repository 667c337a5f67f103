"""Gathers and scatters of one graph by two methods, alternated in one process, so both see
the same machine (the evidence for ``gather_plan``'s ``method="auto"``: docs/unstructured.md).

    mpiexec -n P python scripts/index_methods_ab.py [--rows 1000000] [--rounds 40]
        [--methods p2p,shm]

The bench's graph (``pyshard/bench/ghosts.py``: rows of 64 B, each rank reading a tenth of
its row count, the ``mesh`` and ``random`` patterns). One plan per method; each round runs a
gather then a scatter by each method in turn
(``pyshard.bench.timing.alternated``). Prints, per pattern, the slowest rank's median
in ms of each (direction, method), the first three rounds left out.
"""

from __future__ import annotations

import argparse

import numpy as np
from mpi4py import MPI

import pyshard as ps
from pyshard.array import from_local
from pyshard.bench.ghosts import read_rows, row_values
from pyshard.bench.timing import alternated


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=10**6, help="rows a rank")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--methods", default="p2p,shm")
    a = ap.parse_args()
    comm = MPI.COMM_WORLD
    P, me, n = comm.size, comm.rank, a.rows
    mesh = ps.Mesh(comm, (P,))
    local = row_values(n, me)
    x = from_local(local, mesh, [ps.Shard(0)], global_shape=(n * P, local.shape[1]))
    lines = []
    for pat in ("mesh", "random"):
        idx = read_rows(n, P, me, pat, 0.1)
        plans = {m: ps.gather_plan(idx, like=x, method=m) for m in a.methods.split(",")}
        buf = np.empty((idx.shape[0], local.shape[1]))
        vals = np.random.default_rng([5, me]).standard_normal(buf.shape)
        y = from_local(local.copy(), mesh, [ps.Shard(0)], global_shape=x.shape)
        fns = {}
        for m, plan in plans.items():
            fns[("gather", m)] = lambda p=plan, b=buf: p.gather(x, out=b)
            fns[("scatter", m)] = lambda p=plan, v=vals, t=y: p.scatter(v, into=t)
        ts = alternated(fns, comm, a.rounds)
        lines.append(f"{pat:>7}: " + "  ".join(
            f"{d} {m} {v * 1e3:.2f}" for (d, m), v in sorted(ts.items())))
    if me == 0:
        print(f"{P} ranks, {n} rows of 64 B a rank, median of {a.rounds - 3} rounds (ms):")
        print("\n".join(lines))
    mesh.free()


if __name__ == "__main__":
    main()
