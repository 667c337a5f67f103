"""Run under `mpiexec -n N python -m mpi4py fault_worker.py`: rank 1 raises between two
redistributes while the others go on into the second one."""

import numpy as np
from mpi4py import MPI

import pyshard as ps
from pyshard import Replicate, Shard

comm = MPI.COMM_WORLD
mesh = ps.Mesh(comm, (comm.size,))
x = ps.distribute(np.arange(40.0).reshape(8, 5), mesh, [Shard(0)])
y = x.redistribute([Shard(1)])
if comm.rank == 1:
    raise RuntimeError("rank 1 gave up between two redistributes")
z = y.redistribute([Replicate()])  # the others wait here for rank 1
print("unreachable: every rank finished", flush=True)
