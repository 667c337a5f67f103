"""Uneven and empty shards: explicit sizes, rebalancing, and from_local.

Run: mpiexec -n 2 python -m mpi4py docs/examples/uneven.py
"""

import numpy as np
from mpi4py import MPI

import pyshard as ps
from pyshard import Shard

comm = MPI.COMM_WORLD
p = comm.size
mesh = ps.Mesh(comm, (p,))
g = np.arange(10 * 4, dtype=np.int64).reshape(10, 4)

# rank 0 holds 10 - (p - 1) rows, every other rank 1 row
skew = [10 - (p - 1)] + [1] * (p - 1)
x = ps.distribute(g, mesh, [Shard(0)], sizes={0: skew})
even = x.redistribute([Shard(0)])  # back to the balanced split: one MPI_Alltoallv
assert even.layout.sizes[0] == ps.split_sizes(10, p)

# everything on the last rank, the others empty (zero-size shards are normal)
last = [0] * (p - 1) + [10]
z = even.redistribute([Shard(0)], sizes={0: last})
assert z.local.shape == ((10, 4) if comm.rank == p - 1 else (0, 4))

# from_local: each rank brings its own rows; with global_shape and sizes, no communication
mine = g[x.box]
w = ps.from_local(mine, mesh, [Shard(0)], global_shape=g.shape, sizes={0: skew})
# without global_shape, one MPI_Allgather of the local shapes learns the extents
v = ps.from_local(mine, mesh, [Shard(0)])
assert v.layout == w.layout and (v.full() == g).all()
if comm.rank == 0:
    print("skewed:  ", x.layout)
    print("balanced:", even.layout)
    print("on last: ", z.layout)
    print("from_local without global_shape:", v.layout)
