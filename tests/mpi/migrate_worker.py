"""A job for tests/mpi/test_migrate_pmpi.py, run with the PMPI shim (pmpi_count.c) preloaded:
particles on a 2-D mesh moving to neighbouring boxes (periodic), migrated with each count
exchange; prints one JSON line on rank 0 with every rank's MPI calls during each migration,
the ranks it sent rows to and received rows from, and whether the rows equal the oracle."""

from __future__ import annotations

import json
import sys

import numpy as np
from count_worker import counts, since
from mpi4py import MPI

import pyshard as ps


def main() -> None:
    comm = MPI.COMM_WORLD
    P, me = comm.size, comm.rank
    mesh = ps.Mesh(comm, tuple(MPI.Compute_dims(P, 2)))
    ny, nx = mesh.shape
    out = {}
    for alg in sys.argv[1:]:

        def rows(rank):
            rng = np.random.default_rng([21, rank])
            cy, cx = divmod(rank, nx)
            n = 50
            dy, dx = rng.integers(-1, 2, size=n), rng.integers(-1, 2, size=n)
            dest = ((cy + dy) % ny) * nx + (cx + dx) % nx
            return np.arange(n, dtype=np.float64) + 100 * rank, dest

        x, dest = rows(me)
        ps.migrate(x, dest, mesh, algorithm=alg)  # warm: the first call's buffers
        comm.Barrier()
        before = counts()
        r = ps.migrate(x, dest, mesh, algorithm=alg)
        calls = since(before, counts())
        want = np.concatenate([rows(s)[0][rows(s)[1] == me] for s in range(P)])
        out[alg] = {
            "calls": calls,
            "to": sorted(set(dest.tolist()) - {me}),
            "from": sorted(s for s in range(P) if s != me and r.counts[s]),
            "ok": bool(np.array_equal(r.rows, want)),
        }
    everything = comm.gather(out, root=0)
    if me == 0:
        print(json.dumps(everything))
    mesh.free()


if __name__ == "__main__":
    main()
