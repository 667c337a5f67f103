"""The explicit heat equation on a sharded 2-D or 3-D grid, with pyshard halo exchanges.

    mpiexec -n 4 python examples/heat.py --n 256 --dim 2 --stencil star --steps 50 [--overlap]

The grid (n^dim cells) is split over a mesh of the ranks (``--mesh``, default
``MPI.Compute_dims``); each step updates each rank's ghost cells (width 1: ``star`` is the
5-/7-point stencil, ``box`` the 9-/27-point one, corners included) and then its cells.
``--periodic`` wraps the grid; otherwise the boundary is fixed at ``--boundary``.
``--overlap`` starts the exchange, updates the inner cells while it flies, then the shell.
``--check`` (default on for grids up to 2^20 cells) gathers the result and compares it with
a serial numpy run of the same steps: it must be equal bit for bit (NaNs in the same places
count as equal: a ``--boundary`` of nan or inf gives them). Prints the time per step
(slowest rank) and the check.
"""

from __future__ import annotations

import argparse
import sys
from math import prod
from typing import List, Optional

import numpy as np
from mpi4py import MPI

import pyshard as ps
from pyshard.apps.heat import STENCILS, initial, run, serial
from pyshard.bench.cli import count_arg, shape_arg


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=count_arg(1), default=128,
                    help="cells per grid dim (default 128)")
    ap.add_argument("--dim", type=int, default=2, choices=[2, 3])
    ap.add_argument("--stencil", default="star", choices=STENCILS)
    ap.add_argument("--periodic", action="store_true")
    ap.add_argument("--boundary", type=float, default=0.0)
    ap.add_argument("--steps", type=count_arg(0), default=20)
    ap.add_argument("--overlap", action="store_true")
    ap.add_argument("--mesh", default=None, type=shape_arg((1, 2, 3)),
                    help="e.g. 2x2: at most --dim dims, the rank count in all "
                    "(default: MPI.Compute_dims)")
    ap.add_argument("--check", default=None, choices=["yes", "no"])
    args = ap.parse_args(argv)
    comm = MPI.COMM_WORLD
    if args.mesh:
        mesh_shape = tuple(int(m) for m in args.mesh.split("x"))
        if len(mesh_shape) > args.dim or prod(mesh_shape) != comm.size:
            ap.error(f"argument --mesh: {args.mesh} is not a mesh of at most {args.dim} dims "
                     f"holding the run's {comm.size} ranks")
    else:
        mesh_shape = tuple(MPI.Compute_dims(comm.size, args.dim))
    mesh = ps.Mesh(comm, mesh_shape)
    shape = (args.n,) * args.dim
    u0 = initial(shape)
    u, t = run(mesh, shape, args.steps, args.stencil, args.periodic, args.overlap,
               args.boundary, u0=u0)
    per_step = comm.allreduce(t["per_step"], op=MPI.MAX)
    check = args.check == "yes" or (args.check is None and prod(shape) <= 1 << 20)
    ok = None
    if check:
        full = u.full()
        ref = serial(u0, args.steps, args.stencil, args.periodic, args.boundary)
        ok = comm.allreduce(int(np.array_equal(full, ref, equal_nan=True)), op=MPI.MIN) == 1
    if comm.rank == 0:
        mode = "overlapped" if args.overlap else "blocking"
        bc = "periodic" if args.periodic else f"fixed at {args.boundary}"
        print(
            f"heat {args.dim}-D {'x'.join(map(str, shape))} {args.stencil} stencil, {bc}, "
            f"{args.steps} steps on mesh {'x'.join(map(str, mesh_shape))} ({mode}): "
            f"{per_step * 1e3:.3f} ms/step"
        )
        if ok is not None:
            print(f"equal to the serial numpy run, bit for bit: {ok}")
    mesh.free()
    return 0 if ok is not False else 1


if __name__ == "__main__":
    sys.exit(main())
