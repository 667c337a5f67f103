"""Rows by global index: read any rows of a sharded array, and add values back into them."""

import numpy as np
from mpi4py import MPI

import pyshard as ps
from pyshard import Shard

comm = MPI.COMM_WORLD
mesh = ps.Mesh(comm, (comm.size,))
N = 10
g = np.arange(N * 2, dtype=np.float64).reshape(N, 2)  # 10 rows of 2 features
sizes = [N - 3 * (comm.size - 1)] + [3] * (comm.size - 1)  # uneven shards
x = ps.distribute(g, mesh, [Shard(0)], sizes={0: sizes})

# the rows this rank reads: any order, duplicates allowed, a different list on every rank
idx = np.array([N - 1, 0, (3 * comm.rank + 4) % (N - 1) + 1, 0])
plan = ps.gather_plan(idx, like=x)  # collective, once: who reads what from whom
rows = plan.gather(x)  # then as often as needed: no collective, one message per peer
assert np.array_equal(rows, g[idx])

# the reverse: each value added into its owner's row (duplicates accumulate)
y = ps.distribute(np.zeros((N, 2)), mesh, [Shard(0)], sizes={0: sizes})
plan.scatter(np.ones((len(idx), 2)), into=y, op="sum")
total = ps.take(y, np.arange(N))  # every row, on every rank (a one-shot plan)
assert total.sum() == 2 * len(idx) * comm.size  # every value landed once
assert total[0, 0] == 2 * comm.size  # row 0: read twice by every rank

if comm.rank == 0:
    print(plan.explain())
    print("row 0 after the scatter:", total[0].tolist(), "| rows read by rank 0:", rows.tolist())
mesh.free()
