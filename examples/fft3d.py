"""A distributed 3-D FFT with pencil decomposition: pyshard.fft on a 2-D mesh.

    mpiexec -n 4 python examples/fft3d.py --n 64 [--order zxy] [--mesh 2x2]

The ranks form a 2-D mesh P0 x P1. A *pencil* holds one axis of the complex n^3 array whole
on every rank while the two mesh dims split the other two. ``--order`` names the axes in the
order they are transformed (x, y, z = axes 0, 1, 2). For order ``abc``:

1. start in the pencil where axis a is whole (mesh dim 0 splits b, mesh dim 1 splits c);
   every rank runs ``numpy.fft.fft`` along a;
2. one redistribution on mesh dim 0 (an all-to-all within each group of P0 ranks): mesh
   dim 0 now splits a and b is whole; FFT along b;
3. one redistribution on mesh dim 1 (within each group of P1 ranks): mesh dim 1 now splits
   b and c is whole; FFT along c.

``xyz`` is the textbook scheme, ``[Shard(1), Shard(2)] -> [Shard(0), Shard(2)] ->
[Shard(0), Shard(1)]``; the default ``zxy``, ``[Shard(0), Shard(1)] -> [Shard(2), Shard(1)]
-> [Shard(2), Shard(0)]``, copies on only one side of each exchange (pyshard/bench/fft3d.py).
``pyshard.fft.fftn(x, placements=<last pencil>)`` plans exactly these two transposes; the
result, ``numpy.fft.fftn`` of the global array (unnormalised), stays in the last pencil.
Every rank checks its box against ``numpy.fft.fftn`` of the global array (the run fails
unless every rank's error is within the tolerance: a NaN fails it); the script prints
the time of the whole transform and of its two transposes alone (median, slowest rank),
next to mpi4py-fft's PFFT (numpy backend) on the same array when mpi4py_fft is installed.
"""

from __future__ import annotations

import argparse
import sys
from math import prod
from typing import List, Optional

import numpy as np
from mpi4py import MPI

import pyshard as ps
from pyshard import fft as pf
from pyshard.bench.cli import count_arg, shape_arg
from pyshard.bench.fft3d import DEFAULT_ORDER, ORDERS, pencils, sample_array, time_fft3d, time_pfft
from pyshard.collectives import all_true


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=count_arg(1), default=64,
                    help="the array is n x n x n (default 64)")
    ap.add_argument("--order", default=DEFAULT_ORDER, choices=ORDERS)
    ap.add_argument("--mesh", default=None, type=shape_arg((2,)),
                    help="P0xP1, the rank count in all (default: MPI.Compute_dims)")
    ap.add_argument("--dtype", default="complex128", choices=["complex128", "complex64"])
    ap.add_argument("--reps", type=count_arg(1), default=5, help="timed runs (>= 1)")
    ap.add_argument("--warmup", type=count_arg(0), default=2)
    args = ap.parse_args(argv)
    comm = MPI.COMM_WORLD
    if args.mesh:
        mesh_shape = tuple(int(m) for m in args.mesh.split("x"))
        if prod(mesh_shape) != comm.size:
            ap.error(f"argument --mesh: {args.mesh} holds {prod(mesh_shape)} ranks, the run "
                     f"has {comm.size}")
    else:
        mesh_shape = tuple(MPI.Compute_dims(comm.size, 2))
    shape = (args.n,) * 3
    dtype = np.dtype(args.dtype)
    steps = pencils(args.order)

    mesh = ps.Mesh(comm, mesh_shape)
    g = sample_array(shape, dtype)  # deterministic: the same global array on every rank
    x = ps.distribute(g, mesh, list(steps[0]))  # this rank's first pencil, g[x.box]
    y = pf.fftn(x, placements=list(steps[2]))  # from the first pencil to the last
    lays = [ps.Layout(shape, dtype, mesh_shape, q) for q in steps]
    transposes = [ps.plan(a, b) for a, b in zip(lays, lays[1:])]

    ref = np.fft.fftn(g.astype(np.complex128))
    err = float(np.max(np.abs(y.local - ref[y.box]), initial=0.0)) / float(np.max(np.abs(ref)))
    # each rank's verdict, and-ed (False for a NaN); the error shown: numpy's max over the
    # ranks, which keeps a NaN (an MPI MAX reduction may drop one)
    ok = all_true(comm, err <= (1e-4 if dtype == np.complex64 else 1e-10))
    err = float(np.max(comm.allgather(err)))
    del ref, g

    ours = time_fft3d(x, args.reps, args.warmup)
    theirs = time_pfft(comm, shape, mesh_shape, dtype, args.reps, args.warmup)
    if comm.rank == 0:
        print(
            f"fft3d {args.n}^3 {dtype.name}, {comm.size} ranks on a "
            f"{mesh_shape[0]}x{mesh_shape[1]} mesh, order {args.order}: matches "
            f"numpy.fft.fftn: {ok} (max relative error {err:.1e})"
        )
        for k, p in enumerate(transposes):
            if mesh_shape[k] > 1:
                where = f"{p.collectives} collective on mesh dim {p.steps[0].mesh_dims[0]}"
            else:
                where = f"nothing moves: mesh dim {k} has size 1"
            print(f"  transpose {k + 1}: {p} ({where})")
        print(f"{'':<24}{'total ms':>10}{'transposes ms':>15}")
        print(f"{'pyshard':<24}{ours['total_ms']:>10.2f}{ours['transposes_ms']:>15.2f}")
        if theirs["pfft"] is None:
            print(f"mpi4py-fft PFFT not run: {theirs['why']}")
        else:
            print(
                f"{'PFFT (numpy backend)':<24}{theirs['total_ms']:>10.2f}"
                f"{theirs['transposes_ms']:>15.2f}   matches numpy: {theirs['check']}"
            )
    mesh.free()
    return 0 if ok and theirs.get("check") is not False else 1


if __name__ == "__main__":
    sys.exit(main())
