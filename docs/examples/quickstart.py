"""Quick start: shard an array over every rank, transpose it, gather it, check it.

Run: mpiexec -n 2 python -m mpi4py docs/examples/quickstart.py
"""

import numpy as np
from mpi4py import MPI

import pyshard as ps
from pyshard import Replicate, Shard

comm = MPI.COMM_WORLD
mesh = ps.Mesh(comm, (comm.size,))  # collective: one mesh dim over every rank

g = np.arange(13 * 7, dtype=np.float32).reshape(13, 7)  # the same on every rank
x = ps.distribute(g, mesh, [Shard(0)])  # rows split over the ranks; no communication
assert (x.local == g[x.box]).all()

y = x.redistribute([Shard(1)])  # columns split instead: one MPI_Alltoallv
z = y.redistribute([Replicate()])  # every rank holds all of it: one MPI_Allgatherv
assert (y.local == g[y.box]).all() and (z.local == g).all()

line = f"rank {comm.rank}: x.box {x.box}, y.box {y.box}, y.local.shape {y.local.shape}"
lines = comm.gather(line, root=0)  # rank 0 prints every rank's line, in order
if comm.rank == 0:
    print("\n".join(lines))
    print(x.plan_to([Shard(1)]).explain())
    print("collectives run:", ps.comm_stats())
