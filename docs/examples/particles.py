"""Particles: each row sent to the rank whose box holds its cell, and back."""

import numpy as np
from mpi4py import MPI

import pyshard as ps
from pyshard import Shard

comm = MPI.COMM_WORLD
mesh = ps.Mesh(comm, (comm.size,))
grid = ps.distribute(np.zeros((8, 4)), mesh, [Shard(0)])  # a 8x4 grid, rows of cells split

# this rank's particles: positions (n, 2) anywhere in the grid, and an id each
rng = np.random.default_rng(comm.rank)
x = rng.uniform(0, [8, 4], size=(5, 2))
ids = np.arange(5) + 100 * comm.rank

dest = ps.owner(x, grid)  # the rank whose box holds each particle's cell
r = ps.migrate({"x": x, "id": ids}, dest, mesh)  # the counts, then one message per peer
lo, hi = grid.box[0].start, grid.box[0].stop
assert ((r.rows["x"][:, 0] >= lo) & (r.rows["x"][:, 0] < hi)).all()  # all in this box
assert (np.diff(r.rows["id"] // 100) >= 0).all()  # grouped by source rank, in order

# back(): the exact reverse, here with a value computed where each particle lives now
norm = np.linalg.norm(r.rows["x"], axis=1)
assert np.allclose(r.back(norm), np.linalg.norm(x, axis=1))

if comm.rank == 0:
    print(r.explain())
    print("rows from each rank:", r.counts.tolist())
mesh.free()
