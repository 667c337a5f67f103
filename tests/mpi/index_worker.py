"""A job for tests/mpi/test_unstructured.py, run with the PMPI shim (pmpi_count.c) preloaded:
a gather plan on a 1-D layout with uneven and empty shards, indices with duplicates (none on
one rank); counts every MPI call of a plan's setup (a second plan: the first made the
mesh's communicator), of a steady gather, of a gather with wait=False driven by test(), and
of a scatter; prints one JSON line on rank 0 with every rank's calls, the owners it reads
from and the readers it serves (from every rank's indices, not from the plan), and whether
the results equal the oracle. argv[1]: the plan's method (default "p2p")."""

from __future__ import annotations

import json
import sys

import numpy as np
from count_worker import counts, since
from mpi4py import MPI

import pyshard as ps
from pyshard import Shard


def indices(rank, n):
    rng = np.random.default_rng([31, rank])
    if rank == 2:
        return np.zeros(0, np.int64)
    return rng.integers(0, n, size=int(rng.integers(3, 2 * n)))


def main() -> None:
    comm = MPI.COMM_WORLD
    P, me = comm.size, comm.rank
    mesh = ps.Mesh(comm, (P,))
    n = 4 * P + 3
    sizes = [n - 3 * (P - 2), 0] + [3] * (P - 2)  # rank 1 empty
    offsets = np.concatenate(([0], np.cumsum(sizes)))
    g = np.arange(2.0 * n).reshape(n, 2)
    x = ps.distribute(g, mesh, [Shard(0)], sizes={0: sizes})
    idxs = [indices(q, n) for q in range(P)]

    def owners(i):
        return set((np.searchsorted(offsets[:-1], np.unique(i), side="right") - 1).tolist())

    mine = idxs[me]
    method = sys.argv[1] if len(sys.argv) > 1 else "p2p"
    plan = ps.gather_plan(mine, like=x, method=method)
    comm.Barrier()
    c0 = counts()
    plan = ps.gather_plan(mine, like=x, method=method)
    setup = since(c0, counts())
    vals = np.ones((len(mine), 2))
    plan.gather(x)  # warm: the first call's buffers
    plan.scatter(vals, into=x)
    comm.Barrier()
    c0 = counts()
    got = plan.gather(x)
    gather = since(c0, counts())
    c0 = counts()
    p = plan.gather(x, wait=False)
    while not p.test():
        pass
    got2 = p.wait()
    pending = since(c0, counts())
    c0 = counts()
    plan.scatter(vals, into=x)
    scatter = since(c0, counts())
    once = g.copy()
    for i in idxs:
        np.add.at(once, i, 1.0)  # a scatter of ones (small integers: exact in any order)
    twice = once.copy()
    for i in idxs:
        np.add.at(twice, i, 1.0)
    ok = bool(np.array_equal(got, once[mine]) and np.array_equal(got2, once[mine])
              and np.array_equal(x.local, twice[x.box]))
    out = {
        "setup": setup, "gather": gather, "pending": pending, "scatter": scatter,
        "owners": sorted(owners(mine) - {me}),
        "readers": sorted(q for q in range(P) if q != me and me in owners(idxs[q])),
        "ok": ok, "path": plan.route.path,
    }  # fmt: skip
    everything = comm.gather(out, root=0)  # after all the counting
    if me == 0:
        print(json.dumps(everything))
    mesh.free()


if __name__ == "__main__":
    main()
