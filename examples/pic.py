"""Charge deposition of a particle-in-cell code on a sharded 2-D or 3-D grid, with a halo fold.

    mpiexec -n 4 python examples/pic.py --n 64 --dim 2 --particles 100000 [--overlap]

A periodic grid of n^dim cells (unit spacing, cell i at [i, i+1)) is split over a mesh of the
ranks (``--mesh``, default ``MPI.Compute_dims``). A global particle set comes from a fixed
seed (``--seed``): positions uniform in [0, n)^dim, charges in [0.5, 1.5). Each rank keeps
the particles whose cell ``floor(x)`` lies in its own box and deposits their charge by
cloud-in-cell: particle x gives ``prod((1 - f) or f)`` of its charge to each of the 2^dim
cells ``floor(x) + {0, 1}`` (``f = x - floor(x)``), so a particle in the last cell of a box
deposits partly into the ghost layer (width 1, periodic). ``HaloArray.fold()`` then adds
every ghost cell into the cell of its owner. The total charge is conserved to round-off, and
the grid equals a serial numpy deposit of the same particles (a different summation order:
equal to about 1e-12 relative).

``--overlap`` deposits the particles that touch a ghost cell first, starts the fold
(``start_fold()``), deposits the others (whose cells all lie in the interior) while it
flies, then ``wait()``: the interior may be written while a fold is in flight.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
from mpi4py import MPI

import pyshard as ps


def particles(n: int, dim: int, count: int, seed: int) -> Tuple[np.ndarray, np.ndarray]:
    """The global particle set: positions (count, dim) in [0, n) and charges (count,)."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0.0, n, size=(count, dim))
    x = np.minimum(x, np.nextafter(float(n), 0.0))  # [0, n): floor(x) < n
    q = rng.uniform(0.5, 1.5, size=count)
    return x, q


def deposit(grid: np.ndarray, x: np.ndarray, q: np.ndarray, origin: Sequence[int],
            wrap: Optional[Sequence[int]] = None) -> None:
    """Cloud-in-cell: add each particle's charge into the 2^dim cells around it, cell
    ``c`` at ``grid[c - origin]`` (modulo ``wrap`` per dim when given)."""
    if not len(q):
        return
    dim = x.shape[1]
    base = np.floor(x).astype(np.int64)
    frac = x - base
    for corner in itertools.product((0, 1), repeat=dim):
        w = q.copy()
        idx = []
        for d, c in enumerate(corner):
            w *= frac[:, d] if c else 1.0 - frac[:, d]
            i = base[:, d] + c
            if wrap is not None:
                i = np.mod(i, wrap[d])
            idx.append(i - origin[d])
        np.add.at(grid, tuple(idx), w)


def serial(n: int, dim: int, x: np.ndarray, q: np.ndarray) -> np.ndarray:
    """The same deposit on the whole periodic grid, serially."""
    grid = np.zeros((n,) * dim)
    deposit(grid, x, q, (0,) * dim, wrap=(n,) * dim)
    return grid


def run(mesh: ps.Mesh, n: int, dim: int, count: int, overlap: bool = False, seed: int = 0,
        method: Optional[str] = None) -> Tuple[ps.ShardedArray, Dict[str, float]]:
    """Deposit the global particle set's charge on the sharded grid (periodic, one ghost
    layer) and fold the ghosts; returns the grid and the times (deposit, fold) of this
    rank."""
    shape = (n,) * dim
    rho = ps.distribute(np.zeros(shape), mesh, [ps.Shard(d) for d in range(dim)])
    h = rho.with_halo(1, periodic=True, method=method)
    box = rho.box
    lo = np.array([b.start for b in box])
    hi = np.array([b.stop for b in box])
    x, q = particles(n, dim, count, seed)
    cell = np.floor(x).astype(np.int64)
    mine = np.all((cell >= lo) & (cell < hi), axis=1)
    x, q, cell = x[mine], q[mine], cell[mine]
    origin = lo - 1  # the padded array's first cell (width 1)
    t0 = time.perf_counter()
    if overlap:
        edge = np.any(cell == hi - 1, axis=1)  # its cloud reaches a ghost cell
        deposit(h.padded, x[edge], q[edge], origin)
        t1 = time.perf_counter()
        h.start_fold("sum")
        deposit(h.padded, x[~edge], q[~edge], origin)  # interior only, while it flies
        h.wait()
        t2 = time.perf_counter()
        times = {"deposit": t1 - t0, "fold": t2 - t1}
    else:
        deposit(h.padded, x, q, origin)
        t1 = time.perf_counter()
        h.fold("sum")
        t2 = time.perf_counter()
        times = {"deposit": t1 - t0, "fold": t2 - t1}
    return h.array, times


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=64, help="cells per grid dim (default 64)")
    ap.add_argument("--dim", type=int, default=2, choices=[2, 3])
    ap.add_argument("--particles", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--overlap", action="store_true")
    ap.add_argument("--mesh", default=None, help="e.g. 2x2 (default: MPI.Compute_dims)")
    ap.add_argument("--check", default="yes", choices=["yes", "no"])
    args = ap.parse_args(argv)
    comm = MPI.COMM_WORLD
    if args.mesh:
        mesh_shape = tuple(int(m) for m in args.mesh.lower().split("x"))
    else:
        mesh_shape = tuple(MPI.Compute_dims(comm.size, args.dim))
    mesh = ps.Mesh(comm, mesh_shape)
    rho, t = run(mesh, args.n, args.dim, args.particles, args.overlap, args.seed)
    total = comm.allreduce(float(rho.local.sum()))
    _, q = particles(args.n, args.dim, args.particles, args.seed)
    fold_t = comm.allreduce(t["fold"], op=MPI.MAX)
    ok = None
    err = float("nan")
    if args.check == "yes":
        full = rho.full()
        x, q = particles(args.n, args.dim, args.particles, args.seed)
        ref = serial(args.n, args.dim, x, q)
        err = float(np.max(np.abs(full - ref)) / max(np.max(np.abs(ref)), 1e-300))
        ok = err <= 1e-12
    if comm.rank == 0:
        print(
            f"pic {args.dim}-D {args.n}^{args.dim} grid, {args.particles} particles on mesh "
            f"{'x'.join(map(str, mesh_shape))} ({'overlapped' if args.overlap else 'blocking'}"
            f" fold): fold {fold_t * 1e3:.3f} ms; total charge {total:.12g} (particles "
            f"{float(q.sum()):.12g}, relative difference "
            f"{abs(total - float(q.sum())) / float(q.sum()):.1e})"
        )
        if ok is not None:
            print(f"equal to the serial numpy deposit within 1e-12 relative: {ok} ({err:.1e})")
    mesh.free()
    return 0 if ok is not False else 1


if __name__ == "__main__":
    sys.exit(main())
