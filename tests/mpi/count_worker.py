"""A job for tests/mpi/test_first_call.py, run with the PMPI shim (pmpi_count.c) preloaded:
for random layout pairs, each on a mesh of its own, counts every MPI call of building the
mesh, of the first redistribute and of the second, checks each result against numpy, and
prints one JSON line per case on rank 0 (the counts of every rank gathered after all the
counting is done)."""

from __future__ import annotations

import ctypes
import json
import os
import random
import sys

import numpy as np
from mpi4py import MPI

import pyshard as ps
from pyshard import Partial, Replicate, Shard

# every collective the shim counts (data movement, barriers, communicator constructors)
COLLECTIVE = {
    "Barrier", "Ibarrier", "Bcast", "Gather", "Gatherv", "Scatter", "Allgather", "Allgatherv",
    "Alltoall", "Alltoallv", "Alltoallw", "Reduce", "Allreduce", "Reduce_scatter",
    "Reduce_scatter_block", "Scan", "Exscan", "Iallreduce", "Ialltoallv", "Iallgatherv",
    "Ireduce_scatter", "Neighbor_alltoallv", "Neighbor_alltoallw", "Comm_dup", "Comm_split",
    "Comm_split_type", "Comm_create", "Cart_create", "Cart_sub", "Dist_graph_create_adjacent",
    "Allgather_c", "Allgatherv_c", "Alltoall_c", "Alltoallv_c", "Allreduce_c",
    "Reduce_scatter_c", "Reduce_scatter_block_c",
}  # fmt: skip
CONSTRUCTORS = {"Comm_dup", "Comm_split", "Comm_split_type", "Comm_create", "Cart_create",
                "Cart_sub", "Dist_graph_create_adjacent"}  # fmt: skip
MESHES = {
    1: [(1,)], 2: [(2,), (1, 2)], 3: [(3,)], 4: [(4,), (2, 2)], 5: [(5,)], 6: [(6,), (2, 3)],
    7: [(7,)], 8: [(8,), (2, 4), (2, 2, 2)],
}  # fmt: skip


def counts():
    buf = ctypes.create_string_buffer(1 << 16)
    ctypes.CDLL(os.environ["PYSHARD_TEST_PMPI"]).pyshard_pmpi_counts(buf, len(buf))
    return {k: int(v) for k, v in (ln.split() for ln in buf.value.decode().splitlines())}


def since(before, after):
    return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}


def collectives(c):
    return {k: v for k, v in c.items() if k in COLLECTIVE}


def placement(rng, ndim, partial):
    r = rng.random()
    if partial and r < 0.2:
        return Partial("sum")
    if r < 0.45:
        return Replicate()
    return Shard(rng.randrange(ndim))


def main():
    comm = MPI.COMM_WORLD
    cases = int(sys.argv[1]) if len(sys.argv) > 1 else 12
    rng = random.Random(1234 + comm.size)
    out = []
    for _ in range(cases):
        mshape = rng.choice(MESHES[comm.size])
        ndim = rng.choice((1, 2, 3))
        shape = tuple(rng.randrange(0, 2 * comm.size + 4) for _ in range(ndim))
        src = [placement(rng, ndim, True) for _ in mshape]
        dst = [placement(rng, ndim, False) for _ in mshape]
        g = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape)
        c0 = counts()
        mesh = ps.Mesh(comm, mshape)
        c1 = counts()
        x = ps.distribute(g, mesh, src)
        plan = x.plan_to(dst)
        c2 = counts()
        y = x.redistribute(dst)
        c3 = counts()
        z = x.redistribute(dst)
        c4 = counts()
        ok = bool(np.array_equal(y.local, g[y.box]) and np.array_equal(z.local, g[z.box]))
        out.append({
            "case": f"{mshape} {shape} {ps.layout.placements_str(src)} -> "
                    f"{ps.layout.placements_str(dst)}",
            "mesh_ndim": len(mshape), "mesh": since(c0, c1), "setup": since(c1, c2),
            "first": since(c2, c3), "second": since(c3, c4), "planned": plan.collectives, "ok": ok,
        })  # fmt: skip
        mesh.free()
    every = comm.gather(out, root=0)  # after all the counting
    if comm.rank == 0:
        for k in range(cases):
            rows = [every[r][k] for r in range(comm.size)]
            print(json.dumps({"case": rows[0]["case"], "ranks": rows}), flush=True)


if __name__ == "__main__":
    main()
