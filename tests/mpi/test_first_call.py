"""The first redistribute on a new mesh runs no collective beyond those its plan names
(docs/architecture.md: no collective is spent on setup in a data call): every MPI call counted by a
PMPI shim (pmpi_count.c, built here with the MPI library's mpicc and preloaded into the ranks
of a job of its own, count_worker.py), for random layout pairs at 1 to 8 ranks, on one node,
with every step on node-shared memory, on simulated nodes and with MPI only.

Expectations come from the layouts and the environment: a mesh of ``d`` dims is built with
``Cart_create``, one ``Cart_sub`` and one ``Comm_dup`` per non-empty set of its dims, and
exactly one other collective (the node map's Allgather; none on one rank); nothing runs
between building the mesh and the first call; the first call makes the same MPI calls as the
second; its collectives are at most the plan's count, exactly it with MPI only
(``PYSHARD_TRANSPORT=mpi``), and none where every rank shares one node and every step takes
node-shared memory (``PYSHARD_SHM_MIN_BYTES=0``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import launch
import pytest
from count_worker import COLLECTIVE, CONSTRUCTORS
from mpi4py import MPI

pytestmark = pytest.mark.mpi

HERE = os.path.dirname(os.path.abspath(__file__))
ALL_SHM = {"PYSHARD_TRANSPORT": "auto", "PYSHARD_SHM_MIN_BYTES": "0"}
# (ranks, environment, every MPI library?): the MPI matrix's 1-rank run keeps the jobs whose
# calls an MPI library could change (MPI only; MPI between simulated nodes; auto by size) and
# leaves the others (`numerics`: one rank, or node-shared memory alone) to MPICH's runs
JOBS = [
    (1, {}, False),
    (2, {"PYSHARD_TRANSPORT": "mpi"}, True),
    (3, ALL_SHM, False),
    (4, {**ALL_SHM, "PYSHARD_NODE_SIZE": "2"}, True),
    (4, {"PYSHARD_TRANSPORT": "auto"}, False),
    (5, {"PYSHARD_TRANSPORT": "mpi"}, True),
    (6, {**ALL_SHM, "PYSHARD_NODE_SIZE": "3"}, False),
    (7, {"PYSHARD_TRANSPORT": "auto", "PYSHARD_SHM_MIN_BYTES": "4096"}, True),
    (8, ALL_SHM, False),
]


@pytest.fixture(scope="module")
def shim(tmp_path_factory):
    # its tests start jobs of their own from a 1-rank run: past 1 rank they skip, so skip
    # before every rank compiles the shim (a second a run at 12 ranks on 2 cores)
    launch.require(MPI.COMM_WORLD)
    mpicc = os.environ.get("MPICC") or shutil.which(
        "mpicc", path=os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]])
    )
    if not mpicc:
        pytest.skip("no mpicc to build the PMPI shim with (set MPICC)")
    out = str(tmp_path_factory.mktemp("pmpi") / "pmpi_count.so")
    src = os.path.join(HERE, "pmpi_count.c")
    cmd = [mpicc, "-shared", "-fPIC", "-O1", "-o", out, src]
    env = dict(os.environ)
    prefix = os.path.dirname(os.path.dirname(os.path.abspath(mpicc)))
    if not env.get("I_MPI_ROOT") and os.path.exists(os.path.join(prefix, "include", "mpi.h")):
        env["I_MPI_ROOT"] = prefix  # pip's Intel MPI: its mpicc needs it (ignored by the others)
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        pytest.skip(f"{mpicc} could not build the PMPI shim: {r.stderr.strip()[-400:]}")
    return out


def coll(c):
    return {k: v for k, v in c.items() if k in COLLECTIVE}


@pytest.mark.spawns  # starts mpiexec jobs of its own (the matrix's 1-rank run)
@pytest.mark.parametrize("n,env", [
    pytest.param(n, e, id=f"{n}-{'-'.join(e.values()) or 'default'}",
                 marks=() if every else pytest.mark.numerics)
    for n, e, every in JOBS
])  # fmt: skip
def test_first_call_runs_only_its_plans_collectives(comm, shim, n, env):
    launch.require(comm)
    r = launch.run(n, ["env", f"LD_PRELOAD={shim}", sys.executable,
                       os.path.join(HERE, "count_worker.py"), "10"],
                   env={**env, "PYSHARD_TEST_PMPI": shim}, timeout=240)  # fmt: skip
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    rows = [json.loads(ln) for ln in r.stdout.splitlines() if ln.startswith("{")]
    assert len(rows) == 10, r.stdout[-2000:]
    bad = []
    for row in rows:
        for rank, c in enumerate(row["ranks"]):
            subsets = (1 << c["mesh_ndim"]) - 1
            want_mesh = {"Cart_create": 1, "Cart_sub": subsets, "Comm_dup": subsets}
            mesh = c["mesh"]
            built = {k: v for k, v in mesh.items() if k in CONSTRUCTORS}
            other = {k: v for k, v in mesh.items() if k not in CONSTRUCTORS}
            planned, first = c["planned"], sum(coll(c["first"]).values())
            problems = []
            if built != want_mesh:
                problems.append(f"mesh built with {built}, want {want_mesh}")
            if sum(other.values()) != (1 if n > 1 else 0) or any(
                not k.startswith("Allgather") for k in other
            ):
                problems.append(f"mesh ran {other}, want one Allgather")
            if c["setup"]:
                problems.append(f"between the mesh and the call: {c['setup']}")
            if c["first"] != c["second"]:
                problems.append(f"first call {c['first']} != second {c['second']}")
            if first > planned:
                problems.append(f"first call ran {first} collectives, the plan names {planned}")
            if env.get("PYSHARD_TRANSPORT") == "mpi" and first != planned:
                problems.append(f"MPI only: {first} collectives, the plan names {planned}")
            if env == ALL_SHM and first != 0:
                problems.append(f"one node, all on shared memory: {c['first']}")
            if not c["ok"]:
                problems.append("wrong result")
            if problems:
                bad.append(f"rank {rank} {row['case']}: " + "; ".join(problems))
    assert not bad, "\n".join(bad[:10])
