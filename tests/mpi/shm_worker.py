"""A job for tests/mpi/test_shm.py: redistributes through node-shared memory in a loop until
killed. Rank 0 prints one line once the transport runs: ``running <shm calls> <memfds>``
(its count of shared-memory exchanges, and the memfd segments it has open, read from
/proc/self/fd), then every rank goes on until the test kills the job, or until 120 s have
passed (a safety net: a job the test failed to kill exits with status 3)."""

from __future__ import annotations

import os
import sys
import time

import numpy as np
from mpi4py import MPI

import pyshard as ps


def memfds() -> int:
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:pyshard"):
                n += 1
        except OSError:
            pass
    return n


def main() -> None:
    comm = MPI.COMM_WORLD
    mesh = ps.Mesh(comm, (comm.size,))
    x = ps.from_local(np.ones((64, 256 * comm.size), np.float32), mesh, [ps.Shard(0)],
                      global_shape=(64 * comm.size, 256 * comm.size))  # fmt: skip
    y = x.redistribute([ps.Shard(1)])
    z = y.redistribute([ps.Shard(0)])
    assert np.array_equal(z.local, x.local)
    if comm.rank == 0:
        print(f"running {ps.comm_stats().get('shm', 0)} {memfds()}", flush=True)
    deadline, i = time.monotonic() + 120, 0
    while True:  # until killed
        y = x.redistribute([ps.Shard(1)])
        i += 1
        if i % 200 == 0 and comm.allreduce(time.monotonic() > deadline, op=MPI.LOR):
            break  # every rank at once
    print(f"rank {comm.rank}: not killed within 120 s", file=sys.stderr, flush=True)
    sys.exit(3)


if __name__ == "__main__":
    main()
    sys.exit(0)
