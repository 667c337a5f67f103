"""A job for tests/mpi/test_unstructured.py: NBX setups (gather_plan) on communicators whose
handles this process reuses differently on each rank. A mesh's communicator is freed, rank 0
alone then takes a communicator of its own (so the next handle each rank gets differs), and a
new mesh's setups must still agree on their messages: prints "ok" on rank 0, or hangs (the
test's timeout) where the setup keys its rounds on the rank-local handle."""

from __future__ import annotations

import gc

import numpy as np
from mpi4py import MPI

import pyshard as ps
from pyshard import Shard


def setups(rounds: int) -> None:
    mesh = ps.Mesh(MPI.COMM_WORLD, (MPI.COMM_WORLD.size,))
    P, me = mesh.size, mesh.rank
    g = np.arange(4 * P, dtype=np.float64)
    x = ps.distribute(g, mesh, [Shard(0)])
    for k in range(rounds):
        idx = np.array([(me + 1 + k) % (4 * P), (3 * me + k) % (4 * P)], np.int64)
        plan = ps.gather_plan(idx, like=x)
        assert np.array_equal(plan.gather(x), g[idx])
        del plan
    del x
    mesh.free()
    gc.collect()


def main() -> None:
    comm = MPI.COMM_WORLD
    setups(1)  # one round on the first mesh's communicator
    kept = MPI.COMM_SELF.Dup() if comm.rank == 0 else None  # rank 0 alone takes a handle
    setups(3)
    setups(2)
    if kept is not None:
        kept.Free()
    if comm.rank == 0:
        print("ok")


if __name__ == "__main__":
    main()
