"""Poisson's equation -lap(u) = f on a sharded 3-D grid with pyshard.fft, three ways, each
against an analytic solution:

    mpiexec -n 4 python -m mpi4py examples/poisson.py --n 32 [--mesh 2x2]

- periodic on [0, 2pi)^3 (``fftn``/``ifftn``; the mean of u fixed at zero);
- homogeneous Neumann on [0, 1]^3, cell-centred grid (``dctn`` type 2 forward, its inverse
  ``idctn``: DCT-III), u = cos(pi x) cos(2 pi y) cos(pi z) + cos(3 pi x);
- homogeneous Dirichlet on [0, 1]^3, interior nodes (``dstn`` type 1, its own inverse),
  u = sin(pi x) sin(2 pi y) sin(3 pi z) + sin(2 pi x) sin(pi y) sin(pi z).

The grid is split over a 2-D mesh ``[Shard(0), Shard(1)]`` (pencils); each forward transform
runs with ``placements="any"`` (two transposes, no move back) and its plan's ``backward``
brings the solution home. The wavenumbers of the spectral array come from its ``box`` (the
global index ranges this rank holds). The spectral eigenvalues make each solve exact up to
rounding for these right-hand sides from ``n = 8`` (``--n`` takes no less: below it the
grid aliases the periodic ``cos(4x + z)``, and the Neumann solution's modes). Prints the
max error of each (over the ranks, a NaN kept) and exits non-zero when one is above 1e-10
(or NaN).
"""

from __future__ import annotations

import argparse
import sys
from math import prod
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
from mpi4py import MPI

import pyshard as ps
from pyshard import Shard
from pyshard import fft as pf
from pyshard.bench.cli import count_arg, shape_arg
from pyshard.collectives import all_true

MIN_N = 8  # the smallest grid that resolves every mode of the three solutions
TOL = 1e-10


def _coords(box: Sequence[slice], h: Sequence[float], off: float) -> List[np.ndarray]:
    """Open-grid coordinates (index + off) * h of the rank's box, one array per axis."""
    out = []
    for d, s in enumerate(box):
        shape = [1, 1, 1]
        shape[d] = s.stop - s.start
        out.append(((np.arange(s.start, s.stop) + off) * h[d]).reshape(shape))
    return out


def solve(x: ps.ShardedArray, kind: str, type_: Optional[int], eig: List[np.ndarray]
           ) -> ps.ShardedArray:
    """u with lap(u) = -f: forward transform, divide by the eigenvalues at the spectral
    array's box, backward."""
    kw = {} if type_ is None else {"type": type_}
    p = pf.plan(x.layout, kind, placements="any", **kw)
    fh = p.forward(x)
    lam = sum(e[b].reshape([-1 if i == d else 1 for i in range(3)])
              for d, (e, b) in enumerate(zip(eig, fh.box)))
    with np.errstate(divide="ignore", invalid="ignore"):
        uh = np.where(lam == 0, 0, fh.local / lam)
    uh = ps.ShardedArray(np.ascontiguousarray(uh.astype(fh.dtype)), fh.layout, fh.mesh)
    return p.backward(uh)


def solve_all(comm: MPI.Comm, n: int = 32, mesh_shape: Optional[Tuple[int, ...]] = None
              ) -> Dict[str, float]:
    """The max error (over all ranks; NaN where a rank's is NaN) of each of the three
    solves on an n^3 grid, ``n >= MIN_N``."""
    if n < MIN_N:
        raise ValueError(f"poisson: n must be at least {MIN_N} (a smaller grid aliases the "
                         f"solutions' modes), got {n}")
    ms = tuple(mesh_shape) if mesh_shape else tuple(MPI.Compute_dims(comm.size, 2))
    mesh = ps.Mesh(comm, ms)
    pl = [Shard(0), Shard(1)][: len(ms)]
    errs: Dict[str, float] = {}
    shape = (n, n, n)
    lay = ps.Layout(shape, np.float64, ms, pl)
    box = lay.box(mesh.coords)

    # periodic: x_j = 2 pi j / n; eigenvalue k^2 with the integer wavenumbers k
    x, y, z = _coords(box, [2 * np.pi / n] * 3, 0.0)
    u = np.sin(x) * np.cos(2 * y) * np.sin(3 * z) + np.cos(4 * x + z)
    f = 14 * np.sin(x) * np.cos(2 * y) * np.sin(3 * z) + 17 * np.cos(4 * x + z)
    k2 = [np.fft.fftfreq(n, 1.0 / n) ** 2] * 3
    clay = ps.Layout(shape, np.complex128, ms, pl)
    got = solve(ps.ShardedArray(np.ascontiguousarray(f + 0j), clay, mesh), "fftn", None, k2)
    errs["periodic (fftn)"] = float(np.max(np.abs(got.local.real - u), initial=0.0))

    # Neumann: cell centres x_j = (j + 1/2) / n; cos(pi k x) has eigenvalue (pi k)^2
    x, y, z = _coords(box, [1.0 / n] * 3, 0.5)
    u = np.cos(np.pi * x) * np.cos(2 * np.pi * y) * np.cos(np.pi * z) + np.cos(3 * np.pi * x)
    f = (6 * np.pi**2 * np.cos(np.pi * x) * np.cos(2 * np.pi * y) * np.cos(np.pi * z)
         + 9 * np.pi**2 * np.cos(3 * np.pi * x))
    f = np.broadcast_to(f, lay.local_shape(mesh.coords))
    kc = [(np.pi * np.arange(n)) ** 2] * 3
    got = solve(ps.ShardedArray(np.ascontiguousarray(f), lay, mesh), "dctn", 2, kc)
    errs["Neumann (DCT-II/III)"] = float(np.max(np.abs(got.local - u), initial=0.0))

    # Dirichlet: interior nodes x_j = (j + 1) / (n + 1); sin(pi k x), k >= 1: (pi k)^2
    x, y, z = _coords(box, [1.0 / (n + 1)] * 3, 1.0)
    s = np.sin
    u = (s(np.pi * x) * s(2 * np.pi * y) * s(3 * np.pi * z)
         + s(2 * np.pi * x) * s(np.pi * y) * s(np.pi * z))
    f = np.pi**2 * (14 * s(np.pi * x) * s(2 * np.pi * y) * s(3 * np.pi * z)
                    + 6 * s(2 * np.pi * x) * s(np.pi * y) * s(np.pi * z))
    ks = [(np.pi * np.arange(1, n + 1)) ** 2] * 3
    got = solve(ps.ShardedArray(np.ascontiguousarray(f), lay, mesh), "dstn", 1, ks)
    errs["Dirichlet (DST-I)"] = float(np.max(np.abs(got.local - u), initial=0.0))

    mesh.free()
    # numpy's max over the ranks' values keeps a NaN (an MPI MAX reduction may drop it)
    return {k: float(np.max(comm.allgather(v))) for k, v in errs.items()}


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=count_arg(MIN_N), default=32,
                    help=f"grid points per dim (default 32, at least {MIN_N})")
    ap.add_argument("--mesh", default=None, type=shape_arg((1, 2)),
                    help="P or P0xP1, the rank count in all (default: MPI.Compute_dims, 2-D)")
    args = ap.parse_args(argv)
    comm = MPI.COMM_WORLD
    ms = tuple(int(v) for v in args.mesh.split("x")) if args.mesh else None
    if ms and prod(ms) != comm.size:
        ap.error(f"argument --mesh: {args.mesh} holds {prod(ms)} ranks, the run has "
                 f"{comm.size}")
    errs = solve_all(comm, args.n, ms)
    if comm.rank == 0:
        print(f"poisson {args.n}^3 on {comm.size} ranks")
        for k, v in errs.items():
            print(f"  {k:<22} max error {v:.2e}")
    ok = all_true(comm, all(v <= TOL for v in errs.values()))  # False for a NaN
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
