"""migrate's MPI calls, counted by a PMPI shim (pmpi_count.c) preloaded into a job of 8 ranks
on a 4x2 mesh, particles moving to neighbouring boxes: the sparse path (NBX) runs no
Alltoall or Alltoallv, one nonblocking reduction, and sends its count and its rows only to
the ranks that get rows (one synchronous send and one send each), receiving from exactly the
ranks that send to it; the dense path's only collective is one Alltoall (the counts), its rows
the same messages."""

from __future__ import annotations

import json
import os
import sys

import launch
import pytest
from count_worker import COLLECTIVE
from test_first_call import shim  # noqa: F401  (the fixture that builds the shim)

pytestmark = pytest.mark.mpi

HERE = os.path.dirname(os.path.abspath(__file__))
COLL = COLLECTIVE | {k + "_c" for k in COLLECTIVE}  # the large-count forms too


@pytest.mark.spawns  # starts mpiexec jobs of its own (the matrix's 1-rank run)
def test_nbx_messages_only_to_receivers(comm, shim):  # noqa: F811
    launch.require(comm)
    r = launch.run(8, ["env", f"LD_PRELOAD={shim}", sys.executable,
                       os.path.join(HERE, "migrate_worker.py"), "nbx", "alltoall", "shm"],
                   env={"PYSHARD_TEST_PMPI": shim, "PYSHARD_TRANSPORT": "auto"},
                   timeout=240)  # fmt: skip
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    ranks = json.loads([ln for ln in r.stdout.splitlines() if ln.startswith("[")][-1])
    assert len(ranks) == 8
    for me, out in enumerate(ranks):
        nbx, dense = out["nbx"], out["alltoall"]
        assert nbx["ok"] and dense["ok"], me
        c = nbx["calls"]
        coll = {k: v for k, v in c.items() if k in COLL}
        assert coll == {"Iallreduce": 1}, (me, c)
        to, frm = nbx["to"], nbx["from"]
        cy, cx = divmod(me, 2)  # the 4x2 mesh (Compute_dims): the neighbouring boxes, periodic
        near = {((cy + dy) % 4) * 2 + (cx + dx) % 2 for dy in (-1, 0, 1) for dx in (-1, 0, 1)}
        assert set(to) == near - {me}, (me, to)
        assert c.get("Issend", 0) == len(to), (me, c, to)  # the counts
        sends = c.get("Isend", 0) + c.get("Isend_c", 0)
        recvs = c.get("Irecv", 0) + c.get("Irecv_c", 0)
        assert sends == len(to), (me, c, to)  # the rows
        assert recvs == len(frm), (me, c, frm)
        assert c.get("Recv", 0) == len(frm), (me, c, frm)  # the counts, probed
        d = dense["calls"]
        dc = {k: v for k, v in d.items() if k in COLL}
        assert dc in ({"Alltoall": 1}, {"Alltoall_c": 1}), (me, d)  # the counts
        assert d.get("Isend", 0) + d.get("Isend_c", 0) == len(to), (me, d)  # the rows
        assert d.get("Irecv", 0) + d.get("Irecv_c", 0) == len(frm), (me, d)
        # the shm path (one node): the counts' one Alltoall, and no message for the rows
        sh = out["shm"]
        assert sh["ok"], me
        s = sh["calls"]
        assert {k: v for k, v in s.items() if k in COLL} in ({"Alltoall": 1}, {"Alltoall_c": 1})
        p2p = ("Isend", "Irecv", "Issend", "Send", "Recv", "Ssend", "Probe", "Iprobe")
        assert not any(s.get(k, 0) or s.get(k + "_c", 0) for k in p2p), (me, s)
    # messages per rank at 8 ranks for the neighbour pattern: what the closing note quotes
    print("NBX messages per rank (counts + rows):",
          [len(o["nbx"]["to"]) for o in ranks])
