"""PETSc's MatMult on the matrix of ``examples/spmv.py``, for its time per product.

    PETSC_DIR=/usr/lib/petscdir/petsc3.18/x86_64-linux-gnu-real \\
        mpiexec -n 4 /usr/bin/python3 scripts/petsc_matmult.py --m 400 [--split uneven]

Run with Debian's python3-petsc4py and its Open MPI (see scripts/petsc_sf.py for the set-up:
PETSC_DIR, Open MPI as root), next to ``mpiexec -n 4 python examples/spmv.py --m 400
--check no``, which prints pyshard's time per product. The matrix and the row split are the
example's own: its ``laplacian`` and ``row_sizes`` are read from examples/spmv.py (the file
imports pyshard, which this Python does not have, so only those two functions are taken from
its source) and run here with this Python's numpy and scipy. The matrix's checksum (its
size, its entry count and the sum of its entries weighted by position) is printed so that
the two runs can be seen to multiply the same matrix.

The matrix is an MPIAIJ with the example's row ownership (``--split uneven`` by default,
``balanced``: PETSc's own split of n rows), filled from each rank's CSR rows; ``x`` a random
vector. Timed: ``mult`` (the product, ghost exchange included: PETSc's VecScatter), ``reps``
products after ``warmup``, each rep the slowest rank's time of one product, the median
printed. Check: ``y`` against scipy's product of the same rows (to 1e-14 relative).
Prints a table and one JSON line (``"case": "petsc_matmult"``).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import time
from typing import Callable, List, Sequence

import numpy as np
import scipy.sparse as sp
from mpi4py import MPI
from petsc4py import PETSc
from scipy.spatial import Delaunay

EXAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "spmv.py")


def example_functions(names: Sequence[str] = ("laplacian", "row_sizes")) -> List[Callable]:
    """The example's functions ``names``, compiled from its source without importing it."""
    with open(EXAMPLE) as f:
        tree = ast.parse(f.read(), EXAMPLE)
    keep = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
    ns = {"np": np, "sp": sp, "Delaunay": Delaunay, "Optional": None, "List": None}
    exec(compile(ast.Module(body=keep, type_ignores=[]), EXAMPLE, "exec"), ns)
    return [ns[n] for n in names]


def checksum(a: sp.csr_matrix) -> float:
    w = np.arange(1, a.nnz + 1, dtype=np.float64)
    return float(np.sum(a.data * w) + np.sum(a.indices * 1e-3) + np.sum(a.indptr * 1e-6))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int, default=400)
    ap.add_argument("--split", default="uneven", choices=["uneven", "balanced"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    laplacian, row_sizes = example_functions()
    a = laplacian(args.m, args.seed)
    n = a.shape[0]
    sizes = row_sizes(n, comm.size, args.split)
    if sizes is None:
        sizes = [n // comm.size + (r < n % comm.size) for r in range(comm.size)]
    lo = int(np.sum(sizes[:comm.rank]))
    hi = lo + sizes[comm.rank]
    rows = a[lo:hi]
    A = PETSc.Mat().createAIJ(size=((hi - lo, n), (hi - lo, n)), comm=PETSc.COMM_WORLD)
    A.setPreallocationCSR((rows.indptr.astype(PETSc.IntType), rows.indices.astype(PETSc.IntType),
                           rows.data))
    A.assemble()
    x, y = A.createVecs()
    xg = np.random.default_rng([args.seed, 1]).standard_normal(n)
    x.setArray(xg[lo:hi])
    for _ in range(args.warmup):
        A.mult(x, y)
    times = []
    for _ in range(args.reps):
        comm.Barrier()
        t0 = time.perf_counter()
        A.mult(x, y)
        times.append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
    want = rows @ xg
    diff = float(np.abs(y.getArray() - want).max(initial=0.0))  # a rank may own no rows
    scale = comm.allreduce(float(np.abs(want).max(initial=0.0)), op=MPI.MAX)
    err = comm.allreduce(diff, op=MPI.MAX) / max(scale, 1e-300)
    out = {"case": "petsc_matmult", "ranks": comm.size, "m": args.m, "n": n, "nnz": int(a.nnz),
           "split": args.split, "sizes": [int(s) for s in sizes], "checksum": checksum(a),
           "mult_s": float(np.median(times)), "err": err, "ok": err <= 1e-14,
           "petsc": ".".join(map(str, PETSc.Sys.getVersion())),
           "mpi": MPI.Get_library_version().splitlines()[0].strip()}
    if comm.rank == 0:
        print(f"petsc MatMult: {comm.size} ranks, n {n}, nnz {a.nnz}, rows {out['sizes']}, "
              f"checksum {out['checksum']:.6e}")
        print(f"  mult {out['mult_s'] * 1e3:.3f} ms (median of {args.reps}, slowest rank); "
              f"error against scipy {err:.1e}: {'ok' if out['ok'] else 'FAILED'}")
        print(json.dumps(out))


if __name__ == "__main__":
    main()
