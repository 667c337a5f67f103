"""PETSc's DMSwarm migrate on the particles of ``python -m pyshard bench --cases migrate``.

    mpiexec -n 4 python3 scripts/petsc_swarm.py [--rows 1000000] [--reps 5] [--warmup 1]

For where petsc4py and pyshard cannot share one Python (Debian's python3-petsc4py is built
for Debian's python3, its numpy and Open MPI and its mpi4py 3.1): run this with that Python
and the same MPI library pyshard was built against, next to the pyshard bench (as
scripts/petsc_halo.py does for the halo). Debian 12 sets no /usr/lib/petsc link without
libpetsc-real-dev, so ``export PETSC_DIR=/usr/lib/petscdir/petsc3.18/x86_64-linux-gnu-real``
first when ``from petsc4py import PETSc`` fails.

The same rows as the bench: ``--rows`` a rank of pos (3 reals), vel (3 reals), q (1 real)
and id, 64 bytes a row, and the same moves (1%, 10%, 50% of the rows leaving for the up to 8
neighbouring boxes of the periodic 2-D mesh ``MPI.Compute_dims(ranks, 2)``, and uniform
random ranks): the bench's own generators, ``pyshard/bench/particles.py`` (numpy only),
loaded by its path, so the seeds and moves are the bench's. The id is registered as a PETSc
real (float64, exact below 2^53): petsc4py 3.18 registers and hands out fields of PetscInt
(int32 in Debian's build), PetscReal and PetscScalar only, not int64. DMSwarm also carries its
own pid (int64) and rank (int32) fields in every point, so it packs 76 bytes a moving row
where the bench moves 64.

A DMSwarm of type BASIC; each point's ``DMSwarm_rank`` field set to its dest; timed:
``sw.migrate(remove_sent_points=True)`` only, the swarm refilled before each rep outside the
timed region (``setLocalSizes(rows, --buffer)``). The buffer is 4 by default, what PETSc's
examples pass: PETSc 3.18 removes each sent point by a resize that zeroes the whole spare room
(``DMSwarmDataBucketSetSizes``), so a large buffer costs buffer x sent points (at 2 ranks, 10^6
rows, 10%: 0.68 s at 4, 1.1 s at 0, 2.5 s at 1000). Each time: the median over reps of the
slowest rank's time. Check, after the last
rep: every rank holds exactly the rows whose dest is it (its sorted ids against the ids every
rank's dests send it, recomputed locally) and each row's pos, vel and q are its source's.
Prints a table and one JSON line (``"case": "petsc_swarm"``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

import numpy as np
from mpi4py import MPI
from petsc4py import PETSc

PATTERNS = ("1%", "10%", "50%", "uniform")
FIELDS = (("pos", 3), ("vel", 3), ("q", 1), ("id", 1))


def _generators():
    """pyshard/bench/particles.py (numpy only), loaded by its path: this Python need not
    import pyshard."""
    path = Path(__file__).resolve().parents[1] / "pyshard" / "bench" / "particles.py"
    spec = importlib.util.spec_from_file_location("pyshard_bench_particles", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.particles, mod.dests


particles, dests = _generators()


def fill(sw: PETSc.DMSwarm, cols: dict, dest: np.ndarray, buffer: int) -> None:
    """Resize the swarm to these rows (``buffer`` rows of spare room) and write every field."""
    n = len(dest)
    sw.setLocalSizes(n, buffer)
    for name, bs in FIELDS:
        f = sw.getField(name).reshape(n, bs)
        f[:] = cols[name].reshape(n, bs)
        sw.restoreField(name)
    r = sw.getField("DMSwarm_rank")
    r[:] = dest
    sw.restoreField("DMSwarm_rank")


def check(sw: PETSc.DMSwarm, n: int, P: int, me: int, shape: tuple, kind: tuple) -> bool:
    """The rows here are exactly those whose dest is this rank, with their source's values."""
    m = sw.getLocalSize()
    got = {name: sw.getField(name).reshape(m, bs).copy() for name, bs in FIELDS}
    for name, _ in FIELDS:
        sw.restoreField(name)
    exp = {name: [] for name, _ in FIELDS}
    for r in range(P):  # every rank's moves, recomputed here: no MPI in the reference
        keep = dests(n, P, r, shape, *kind) == me
        src = particles(n, r)
        for name, bs in FIELDS:
            exp[name].append(src[name].reshape(n, bs)[keep])
    exp = {k: np.concatenate(v) for k, v in exp.items()}  # ids ascending: rank, then index
    order = np.argsort(got["id"][:, 0], kind="stable")
    return m == len(exp["id"]) and all(
        np.array_equal(got[k][order], exp[k].astype(np.float64)) for k in exp
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--buffer", type=int, default=4)
    ap.add_argument("--patterns", default=",".join(PATTERNS))
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    P, me, n = comm.size, comm.rank, args.rows
    shape = tuple(MPI.Compute_dims(P, 2))
    sw = PETSc.DMSwarm().create(comm=PETSc.COMM_WORLD)
    sw.setType(PETSc.DMSwarm.Type.BASIC)
    sw.setDimension(3)
    for name, bs in FIELDS:
        sw.registerField(name, bs, dtype=PETSc.RealType)
    sw.finalizeFieldRegister()
    cols = particles(n, me)
    rows = []
    for pat in args.patterns.split(","):
        frac = float(pat[:-1]) / 100 if pat.endswith("%") else 0.0
        kind = ("uniform" if pat == "uniform" else "neighbours", frac)
        dest = dests(n, P, me, shape, *kind)
        times = []
        for i in range(args.warmup + args.reps):
            fill(sw, cols, dest, args.buffer)
            comm.Barrier()
            t0 = time.perf_counter()
            sw.migrate(remove_sent_points=True)
            t = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
            if i >= args.warmup:
                times.append(t)
        ok = bool(comm.allreduce(check(sw, n, P, me, shape, kind), op=MPI.LAND))
        rows.append(
            {
                "pattern": pat,
                "leaving": comm.allreduce(int((dest != me).sum())),
                "check": ok,
                "ms": 1e3 * float(np.median(times)),
                "reps_ms": [1e3 * t for t in times],
            }
        )
    sw.destroy()
    if me == 0:
        lib = MPI.Get_library_version().split("\0", 1)[0].splitlines()[0].strip()
        ver = ".".join(map(str, PETSc.Sys.getVersion()))
        print(
            f"PETSc {ver} DMSwarm (BASIC) migrate(remove_sent_points=True), {P} ranks, "
            f"mesh {shape[0]}x{shape[1]}, {n} rows of 64 B a rank, {lib}; ms, median of "
            f"{args.reps}, slowest rank"
        )
        print(f"  {'pattern':>8} {'leaving':>9} {'dmswarm':>9} ok")
        for r in rows:
            print(f"  {r['pattern']:>8} {r['leaving']:>9} {r['ms']:9.2f} {r['check']}")
        print(
            json.dumps(
                {
                    "case": "petsc_swarm",
                    "ranks": P,
                    "rows_per_rank": n,
                    "row_bytes": 64,
                    "petsc": ver,
                    "mpi": lib,
                    "reps": args.reps,
                    "check": all(r["check"] for r in rows),
                    "rows": rows,
                }
            )
        )
    return 0 if all(r["check"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
