"""pyshard.torch's costs: a backward redistribute against the forward one of the reverse
change, and the autograd wrapper's own overhead on a small call.

    mpiexec -n 4 python scripts/torch_bench.py [--n 8192] [--small 64] [--reps 7]

1. ``[Shard(0)] -> [Shard(1)]`` of an ``n x n`` float32 tensor through ``pst.redistribute``:
   the backward (``torch.autograd.grad`` of the result with a ready ``[Shard(1)]`` gradient:
   the gradient's ``[Shard(1)] -> [Shard(0)]`` redistribute, with autograd's engine around
   it, no accumulation into a leaf) against the forward ``pst.redistribute`` of the reverse
   change ``[Shard(1)] -> [Shard(0)]``. Target: backward / forward <= 1.1.
2. A ``small x small`` float32 ``[Shard(0)] -> [Shard(1)]``: ``pst.redistribute`` forward
   (input requiring grad: an autograd node) and without grad, against pyshard's own
   ``ShardedArray.redistribute`` on the same memory.

Times are the slowest rank's, medians of ``--reps`` (pyshard.bench.timing). One line of JSON
per measurement on rank 0.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import List, Optional

import torch
from mpi4py import MPI

import pyshard as ps
import pyshard.torch as pst
from pyshard import Shard
from pyshard.bench.timing import median_s


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--small", type=int, default=64)
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args(argv)
    comm = MPI.COMM_WORLD
    mesh = ps.Mesh(comm, (comm.size,))
    rows = []

    def report(**kw: object) -> None:
        kw.update(ranks=comm.size)
        rows.append(kw)
        if comm.rank == 0:
            print(json.dumps(kw), flush=True)

    report(**large(comm, mesh, args.n, args.reps))
    report(**small_calls(comm, mesh, args.small, args.reps))
    return 0


def large(comm: MPI.Comm, mesh: ps.Mesh, n: int, reps: int) -> dict:
    """1. backward vs the reverse forward, large."""
    lay0 = ps.Layout((n, n), "float32", mesh.shape, [Shard(0)])
    lay1 = ps.Layout((n, n), "float32", mesh.shape, [Shard(1)])
    leaf = torch.ones(lay0.local_shape(mesh.coords), dtype=torch.float32, requires_grad=True)
    x = pst.from_local(leaf, mesh, [Shard(0)], global_shape=(n, n))
    y = pst.redistribute(x, [Shard(1)])
    g = torch.ones(lay1.local_shape(mesh.coords), dtype=torch.float32)
    src1 = pst.from_local(g.clone(), mesh, [Shard(1)], global_shape=(n, n))

    def backward() -> None:
        torch.autograd.grad(y.local, leaf, grad_outputs=g, retain_graph=True)

    def reverse_forward() -> None:
        pst.redistribute(src1, [Shard(0)])

    def forward() -> None:
        pst.redistribute(x, [Shard(1)])

    t_rev = median_s(reverse_forward, comm, reps, warmup=2)
    t_bwd = median_s(backward, comm, reps, warmup=2)
    t_fwd = median_s(forward, comm, reps, warmup=2)
    return dict(case=f"{n}x{n} float32 S(0)->S(1)", forward_ms=t_fwd * 1e3,
                backward_ms=t_bwd * 1e3, reverse_forward_ms=t_rev * 1e3,
                backward_over_reverse=t_bwd / t_rev)  # fmt: skip


def small_calls(comm: MPI.Comm, mesh: ps.Mesh, m: int, reps: int) -> dict:
    """2. the wrapper's overhead, small."""
    reps = max(reps, 200)
    small = ps.distribute(torch.arange(m * m, dtype=torch.float32).reshape(m, m), mesh,
                          [Shard(0)])  # fmt: skip
    t_leaf = torch.from_numpy(small.local.copy()).requires_grad_()
    xs = pst.from_local(t_leaf, mesh, [Shard(0)], global_shape=(m, m))
    xn = pst.from_local(t_leaf.detach(), mesh, [Shard(0)], global_shape=(m, m))

    def per_call(fn) -> float:  # noqa: ANN001
        def many() -> None:
            for _ in range(50):
                fn()

        return median_s(many, comm, reps // 50 + 3, warmup=1) / 50

    t_ps = per_call(lambda: small.redistribute([Shard(1)]))
    t_grad = per_call(lambda: pst.redistribute(xs, [Shard(1)]))
    t_nograd = per_call(lambda: pst.redistribute(xn, [Shard(1)]))
    return dict(case=f"{m}x{m} float32 S(0)->S(1)", pyshard_us=t_ps * 1e6,
                pst_grad_us=t_grad * 1e6, pst_nograd_us=t_nograd * 1e6,
                grad_overhead_us=(t_grad - t_ps) * 1e6,
                nograd_overhead_us=(t_nograd - t_ps) * 1e6)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
