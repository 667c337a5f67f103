"""Checkpoints: save from one layout, read the manifest, load into another layout.

Run: mpiexec -n 2 python -m mpi4py docs/examples/checkpoints.py
"""

import os
import shutil
import tempfile

import numpy as np
from mpi4py import MPI

import pyshard as ps
from pyshard import Replicate, Shard

comm = MPI.COMM_WORLD
p = comm.size
mesh = ps.Mesh(comm, (p,))
w = np.arange(101 * 6, dtype=np.float64).reshape(101, 6)
b = np.linspace(0.0, 1.0, 6)

root = comm.bcast(tempfile.mkdtemp() if comm.rank == 0 else None, root=0)
path = os.path.join(root, "step-100")
arrays = {"w": ps.distribute(w, mesh, [Shard(0)]), "b": ps.distribute(b, mesh, [Replicate()])}
ps.save(path, arrays, metadata={"step": 100})  # collective; MPI-IO writes, manifest last

info = ps.checkpoint_info(path)  # the manifest alone: no MPI, no data read
if comm.rank == 0:
    print("metadata:", info["metadata"], "saved by", info["ranks"], "rank(s)")
    for name, a in sorted(info["arrays"].items()):
        print(f"  {name}: shape {a['shape']} {a['dtype']}, saved as {a['placements']}")

# Load into other placements and an uneven split (any mesh and rank count would do).
sizes = {"w": {1: [6 - (p - 1)] + [1] * (p - 1)}}  # rank 0 gets the most columns
out = ps.load(path, mesh, {"w": [Shard(1)], "b": [Shard(0)]}, sizes=sizes)
assert (out["w"].local == w[out["w"].box]).all() and (out["b"].local == b[out["b"].box]).all()
# The files are standard .npy: numpy reads them without pyshard.
assert (np.load(os.path.join(path, info["arrays"]["w"]["file"])) == w).all()
if comm.rank == 0:
    print("loaded w as", out["w"].layout)
comm.Barrier()
if comm.rank == 0:
    shutil.rmtree(root)
