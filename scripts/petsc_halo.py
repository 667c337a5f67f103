"""PETSc's DMDA halo update on the grids of ``python -m pyshard bench --cases halo``.

    mpiexec -n 4 python3 scripts/petsc_halo.py [--scale 1] [--reps 7] [--loop 20]

For where petsc4py and pyshard cannot share one Python (Debian's python3-petsc4py is built
for Debian's python3, its numpy and Open MPI and its mpi4py 3.1): run this with that Python
and the same MPI library pyshard was built against, next to the pyshard bench. Same cases:
2-D 8192^2 float64 width 1 and 4, 3-D 384^3 width 2 (PETSc scalars are float64 here; the
bench's 3-D case is float32, so this one moves twice its bytes: the row says so), box
stencil, periodic, on the 2-D process grid MPI.Compute_dims(ranks, 2) with the balanced
ownership ranges pyshard's layout has. Each time: the median over reps of the slowest rank's
time per ``da.globalToLocal(g, l)``, a rep being a loop of ``--loop`` calls. Prints a table
and one JSON line (``"case": "petsc_halo"``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
from mpi4py import MPI
from petsc4py import PETSc

CASES = [
    ("2d-w1", (8192, 8192), 1),
    ("2d-w4", (8192, 8192), 4),
    ("3d-w2", (384, 384, 384), 2),
]


def balanced(n: int, parts: int) -> list:
    return [n // parts + (1 if i < n % parts else 0) for i in range(parts)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=int, default=1)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--loop", type=int, default=20)
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    rows = []
    for name, full, w in CASES:
        shape = tuple(max(2 * w, n // args.scale) for n in full)
        dims = list(MPI.Compute_dims(comm.size, 2)) + [1] * (len(shape) - 2)
        ranges = tuple(balanced(n, p) for n, p in zip(shape, dims))
        da = PETSc.DMDA().create(
            dim=len(shape), sizes=shape, proc_sizes=tuple(dims), ownership_ranges=ranges,
            boundary_type=(PETSc.DM.BoundaryType.PERIODIC,) * len(shape),
            stencil_type=PETSc.DMDA.StencilType.BOX, stencil_width=w, dof=1,
        )
        g, loc = da.createGlobalVec(), da.createLocalVec()
        g.set(1.0)
        for _ in range(args.loop):
            da.globalToLocal(g, loc)
        times = []
        for _ in range(args.reps):
            comm.Barrier()
            t0 = time.perf_counter()
            for _ in range(args.loop):
                da.globalToLocal(g, loc)
            times.append(comm.allreduce((time.perf_counter() - t0) / args.loop, op=MPI.MAX))
        rows.append({"name": name, "shape": list(shape), "width": w, "mesh": dims[:2],
                     "dtype": str(np.dtype(PETSc.ScalarType)),
                     "median_s": float(np.median(times))})
        da.destroy()
    if comm.rank == 0:
        lib = MPI.Get_library_version().split("\0", 1)[0].splitlines()[0].strip()
        print(f"PETSc {'.'.join(map(str, PETSc.Sys.getVersion()))} DMDA globalToLocal (BOX, "
              f"periodic), {comm.size} ranks, {lib}; us per update, slowest rank")
        for r in rows:
            print(f"{r['name']:<8}{'x'.join(map(str, r['shape'])):<16}{r['width']:>3}"
                  f"{r['median_s'] * 1e6:>12.1f}  ({r['dtype']})")
        print(json.dumps({"case": "petsc_halo", "ranks": comm.size, "mpi": lib, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
