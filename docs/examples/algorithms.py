"""Exchange algorithms: pick one per call, let `auto` decide, or `tune` once and keep it.

Run: mpiexec -n 2 python -m mpi4py docs/examples/algorithms.py
"""

import json
import os
import shutil
import tempfile

import numpy as np
from mpi4py import MPI

import pyshard as ps
from pyshard import Shard

comm = MPI.COMM_WORLD
mesh = ps.Mesh(comm, (comm.size,))
g = np.random.default_rng(0).standard_normal((256, 96))
x = ps.distribute(g, mesh, [Shard(0)])

# Every algorithm gives the same result; the choice must be the same on every rank.
for algorithm in ("alltoallv", "alltoall", "p2p", "alltoallw", "auto"):
    ps.reset_comm_stats()
    y = x.redistribute([Shard(1)], algorithm=algorithm)
    assert (y.local == g[y.box]).all()
    if comm.rank == 0:
        print(f"{algorithm:>9}: ran {ps.comm_stats()}")

# tune: the first call of a step of this kind and size times every candidate (on scratch
# buffers) and every rank adopts the winner; PYSHARD_TUNE_FILE keeps the choice for the
# next job (rank 0 reads and writes it). On one rank nothing moves: nothing is tuned and
# no file is written.
tune_file = None
if comm.rank == 0:
    tune_file = os.path.join(tempfile.mkdtemp(), "tune.json")
tune_file = comm.bcast(tune_file, root=0)
os.environ["PYSHARD_TUNE_FILE"] = tune_file
try:
    y = x.redistribute([Shard(1)], algorithm="tune")
    assert (y.local == g[y.box]).all()
    comm.Barrier()
    if comm.rank == 0:
        if os.path.exists(tune_file):
            with open(tune_file) as f:
                choices = json.load(f)
            for key, winner in choices.items():  # key: MPI library|ranks|memory|sparse?|bytes
                print(f"tuned: {key} -> {winner}")
        else:
            print(f"tuned: nothing on {comm.size} rank(s) (no exchange to time)")
finally:
    if comm.rank == 0:
        shutil.rmtree(os.path.dirname(tune_file), ignore_errors=True)
