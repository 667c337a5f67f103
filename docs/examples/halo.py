"""Halo exchange: ghost cells around each rank's block, filled from the neighbours."""

import numpy as np
from mpi4py import MPI

import pyshard as ps
from pyshard import Shard

comm = MPI.COMM_WORLD
mesh = ps.Mesh(comm, (comm.size,))
g = np.arange(8 * 5, dtype=np.float64).reshape(8, 5)
x = ps.distribute(g, mesh, [Shard(0)])

# one ghost layer along dim 0, wrapping around (periodic); none along dim 1
h = x.with_halo((1, 0), periodic=True)
h.update()  # collective: fills h.padded's ghost rows from the neighbours
lo, hi = x.box[0].start, x.box[0].stop
assert np.array_equal(h.padded[0], g[(lo - 1) % 8])  # the row above, wrapped at the top
assert np.array_equal(h.padded[-1], g[hi % 8])  # the row below
assert np.array_equal(h.interior, g[x.box])  # the owned rows, a view of h.padded

# overlap: start the exchange, work on cells that need no ghosts, then wait
h.start()
inner = h.interior[1:-1].sum()  # reads the interior only
h.wait()

if comm.rank == 0:
    print(h.explain())
    print("inner sum on rank 0:", inner)
mesh.free()
