"""Run under `mpiexec -n N python finalize_worker.py`: every rank builds one object of each
kind, runs it once, calls MPI.Finalize(), then calls each again: each call must raise
RuntimeError naming the finalization (MPICH ended the process with its own message from
several of them). Writes "RAISED <call>" or "WRONG <call>: ..." for each, then "done", to
report-<rank>.txt in the working directory (the ranks' output would interleave)."""

import numpy as np
from mpi4py import MPI

import pyshard as ps
from pyshard import Replicate, Shard
from pyshard import fft as pf

comm = MPI.COMM_WORLD
P, rank = comm.size, comm.rank  # (after the finalization these would be MPI calls)
mesh = ps.Mesh(comm, (P,))
g = np.arange(8.0 * comm.size * 6).reshape(8 * comm.size, 6)
x = ps.distribute(g, mesh, [Shard(0)])
x.redistribute([Shard(1)])  # (now on the fast path)
h = x.with_halo(1)
h.update()
plan = ps.gather_plan(np.arange(3), like=x)
plan.gather(x)
fplan = pf.plan(x.layout, "rfftn")
fplan.forward(x)
ps.redistribute_many([x, x], [Replicate()])
moved = ps.migrate(g[:4], np.zeros(4, np.int64), mesh)
# handles in flight across the finalization (their wait() and test() made MPI calls)
pend = x.redistribute([Shard(1)], wait=False)  # (an exchange: Replicate ran whole)
h2 = x.with_halo(1)
h2.start()
pmig = ps.migrate(g[:4], np.zeros(4, np.int64), mesh, wait=False)
pgather = ps.gather_plan(np.arange(3), like=x).gather(x, wait=False)
MPI.Finalize()



def validated(call):
    ps.set_validation(True)
    try:
        return call()
    finally:
        ps.set_validation(False)


calls = {
    "redistribute (fast path)": lambda: x.redistribute([Shard(1)]),
    "redistribute (new target)": lambda: x.redistribute([Replicate()]),
    "halo update": h.update,
    "gather": lambda: plan.gather(x),
    "fft plan": lambda: fplan.forward(x),
    "rfftn": lambda: pf.rfftn(x),
    "redistribute_many": lambda: ps.redistribute_many([x, x], [Shard(1)]),
    "migrate": lambda: ps.migrate(g[:4], np.zeros(4, np.int64), mesh),
    "back": lambda: moved.back(moved.rows),
    "save": lambda: ps.save("never.npy.d", {"x": x}),
    "load": lambda: ps.load("never.npy.d", mesh, {"x": [Shard(0)]}),
    "Mesh": lambda: ps.Mesh(comm, (P,)),
    "Pending.test": pend.test,
    "Pending.wait": pend.wait,
    "HaloArray.test": h2.test,
    "HaloArray.wait": h2.wait,
    "PendingMigration.test": pmig.test,
    "PendingMigration.wait": pmig.wait,
    "gather in flight, test": pgather.test,
    "gather in flight, wait": pgather.wait,
    # (these reached MPI before any check: a new gather plan and what builds one, balance,
    # and the agreement that validation runs first)
    "gather_plan (new)": lambda: ps.gather_plan(np.arange(2), like=x),
    "take": lambda: ps.take(x, np.arange(2)),
    "scatter_add": lambda: ps.scatter_add(x, np.arange(2), np.ones((2, 6))),
    "balance": lambda: ps.balance(x),
    "rfftn (validated)": lambda: validated(lambda: pf.rfftn(x)),
    "gather_plan (validated)": lambda: validated(
        lambda: ps.gather_plan(np.arange(2), like=x)),
    "Mesh.free": mesh.free,
    "build_info": ps.build_info,
}
lines = []
for name, call in calls.items():
    try:
        call()
        lines.append(f"WRONG {name}: returned")
    except RuntimeError as e:
        lines.append(f"RAISED {name}" if "finalized" in str(e) else f"WRONG {name}: {e}")
    except Exception as e:  # noqa: BLE001 - the report
        lines.append(f"WRONG {name}: {type(e).__name__}: {e}")
with open(f"report-{rank}.txt", "w") as f:
    f.write("\n".join(lines + ["done"]) + "\n")
