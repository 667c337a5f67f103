"""The validation mode: ranks that ask for different things get an error, not a hang.

Run: mpiexec -n 2 python -m mpi4py docs/examples/validation.py
"""

import numpy as np
from mpi4py import MPI

import pyshard as ps
from pyshard import Replicate, Shard

comm = MPI.COMM_WORLD
mesh = ps.Mesh(comm, (comm.size,))
x = ps.distribute(np.zeros((4, 3)), mesh, [Shard(0)])

ps.set_validation(True)  # or PYSHARD_VALIDATE=1 in the environment
# A bug: rank 0 asks for another layout than the others. Without the validation mode the
# ranks would wait forever in mismatched collectives (Alltoallv against Allgatherv).
if comm.size == 1:  # one rank cannot disagree with itself
    print("validation.py: 1 rank: no other rank to disagree with; run it on 2 or more "
          "(mpiexec -n 2 python -m mpi4py docs/examples/validation.py)")
else:
    target = [Shard(1)] if comm.rank == 0 else [Replicate()]
    try:
        x.redistribute(target)
    except ValueError as e:  # every rank raises the same error
        if comm.rank == 0:
            print(e)
    else:
        raise AssertionError("expected a ValueError")
