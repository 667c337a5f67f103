"""Run under `mpiexec -n 2 python peer_worker.py WHERE [RANK]`: rank RANK (default 1) stops
(sleeps) at WHERE while its node peer goes on into a wait for it in node-shared memory; that
peer must raise RuntimeError within PYSHARD_PEER_TIMEOUT, print it, and end the job
(MPI_Abort). On two hosts (tests/mpi/test_two_hosts.py) RANK is on the second.

WHERE: "setup" (rank 1 stops inside the mesh's node setup, after its Allgather: rank 0 waits
for its control segment at its first exchange), "exchange" (rank 1 stops before the second
of two node-shared exchanges), "arrive" (rank 1 stops inside the second of two node-shared
exchanges, after its writes and before it tells its peer they are done: the peer's wait for
arrivals must name it), "halo" (before the second of two halo updates), "kill" (rank
RANK kills itself with SIGKILL before the second of two exchanges), "validate" (as
"exchange", in the validation mode: the wait is its check's), "dim" (4 ranks, a 2x2 mesh:
rank RANK stops before the second of two exchanges along mesh dim 1).

A rank that raises prints "RAISED ..." and, where PEER_WORKER_REPORT names a file, appends the
same line there (synced) before MPI_Abort: the launcher may tear the job down before it forwards
the rank's last output (once in CI, under load, Hydra forwarded neither stdout nor stderr)."""

import os
import signal
import sys
import time

import numpy as np
from mpi4py import MPI

import pyshard as ps
from pyshard import Replicate, Shard, _core, collectives

where = sys.argv[1]
stopping = int(sys.argv[2]) if len(sys.argv) > 2 else 1
comm = MPI.COMM_WORLD
ps.config.set("PYSHARD_SHM_MIN_BYTES", 0)  # every exchange through node-shared memory
ps.config.set("PYSHARD_TRANSPORT", "auto")


def report(line):
    print(line, flush=True)
    path = os.environ.get("PEER_WORKER_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())


def stop():
    sys.stdout.flush()
    time.sleep(120)  # a rank that stopped: the others must not wait for it this long
    sys.exit(0)


if where == "setup" and comm.rank == stopping:
    # the mesh's node setup runs one allgather_rows (pyshard.collectives), then maps its node
    # peers' control segments: this rank stops in between (its own segment made, its peers'
    # never mapped)
    real = collectives.allgather_rows

    def stopping_after(*args):
        real(*args)
        stop()

    collectives.allgather_rows = stopping_after
t0 = None
try:
    mesh = ps.Mesh(comm, (2, comm.size // 2) if where == "dim" else (comm.size,))
    g = np.arange(64.0 * comm.size).reshape(8 * comm.size, 8)
    if where == "dim":  # along mesh dim 1: rank 1 of that dim's communicator is world rank 3
        x = ps.distribute(g, mesh, [Replicate(), Shard(0)])
        x.redistribute([Replicate(), Shard(1)])
        if comm.rank == stopping:
            stop()
        t0 = time.monotonic()
        x.redistribute([Replicate(), Shard(1)])
        print(f"rank {comm.rank}: finished ({where})", flush=True)
        # wait for rank 2's MPI_Abort rather than finalize: Debian's Open MPI 4.1.4 mpiexec
        # segfaulted or hung in its own teardown (PMIx_server_finalize) in 4 of 13 jobs here
        # where some ranks had finished normally before another aborted
        time.sleep(60)
        sys.exit(0)
    x = ps.distribute(g, mesh, [Shard(0)])
    if where == "halo":
        h = x.with_halo(1, method="shm")
        h.update()
        if comm.rank == stopping:
            stop()
        t0 = time.monotonic()
        h.update()
    else:
        if where == "validate":  # the validation mode's check waits for the late rank
            ps.set_validation(True)
        if where in ("exchange", "kill", "validate", "arrive"):
            x.redistribute([Shard(1)])
            if comm.rank == stopping:
                sys.stdout.flush()
                if where == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                if where == "arrive":  # stop inside the next exchange, after its writes
                    _core.stall_next_arrival(120.0)
                else:
                    stop()
        t0 = time.monotonic()
        x.redistribute([Shard(1)])
    print(f"rank {comm.rank}: finished ({where})", flush=True)
except RuntimeError as e:
    took = time.monotonic() - (t0 if t0 is not None else 0)
    report(f"RAISED after {took:.1f} s on rank {comm.rank}: {e}")
    comm.Abort(7)
