"""pyshard.torch's costs: a backward redistribute against the forward one of the reverse
change, and the autograd wrapper's own overhead on a small call.

    mpiexec -n 4 python scripts/torch_bench.py [--n 8192] [--small 64] [--reps 7]

1. ``[Shard(0)] -> [Shard(1)]`` of an ``n x n`` float32 tensor through ``pst.redistribute``:
   the backward (``torch.autograd.grad`` of the result with a ready ``[Shard(1)]`` gradient:
   the gradient's ``[Shard(1)] -> [Shard(0)]`` redistribute, with autograd's engine around
   it, no accumulation into a leaf) against the forward ``pst.redistribute`` of the reverse
   change ``[Shard(1)] -> [Shard(0)]``, the two alternated call by call. Target: backward /
   reverse forward <= 1.1.
2. A ``small x small`` float32 ``[Shard(0)] -> [Shard(1)]``: ``pst.redistribute`` forward
   (input requiring grad: an autograd node) and without grad, against pyshard's own
   ``ShardedArray.redistribute`` on the same memory.

Times are the slowest rank's (pyshard.bench.timing), medians of ``--reps`` calls (of
batches of 50 calls for 2., with the process CPU time of the slowest rank beside it: on a
busy or oversubscribed machine the wall time of a small call is mostly waiting). One line of
JSON per measurement on rank 0.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Callable, Dict, List, Optional

import numpy as np
import torch
from mpi4py import MPI

import pyshard as ps
import pyshard.torch as pst
from pyshard import Shard
from pyshard.bench.timing import timed


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

    # alternated, one call of each per round, so that a busy machine slows both alike
    rev, bwd, fwd = [], [], []
    for fn in (reverse_forward, backward, forward):  # warm: pages, plans, executors
        timed(fn, comm, 1, 2)
    for _ in range(reps):
        rev += timed(reverse_forward, comm, 1, 0)
        bwd += timed(backward, comm, 1, 0)
        fwd += timed(forward, comm, 1, 0)
    med = lambda v: float(np.median(v))  # noqa: E731
    return dict(case=f"{n}x{n} float32 S(0)->S(1)", forward_ms=med(fwd) * 1e3,
                backward_ms=med(bwd) * 1e3, reverse_forward_ms=med(rev) * 1e3,
                backward_over_reverse=med(bwd) / med(rev),
                median_round_ratio=med([b / r for b, r in zip(bwd, rev)]))  # fmt: skip


def small_calls(comm: MPI.Comm, mesh: ps.Mesh, m: int, reps: int) -> dict:
    """2. the wrapper's overhead, small."""
    reps = max(reps, 200)
    small = ps.distribute(torch.arange(m * m, dtype=torch.float32).reshape(m, m), mesh,
                          [Shard(0)])  # fmt: skip
    t_leaf = torch.from_numpy(small.local.copy()).requires_grad_()
    xs = pst.from_local(t_leaf, mesh, [Shard(0)], global_shape=(m, m))
    xn = pst.from_local(t_leaf.detach(), mesh, [Shard(0)], global_shape=(m, m))

    calls = {
        "pyshard": lambda: small.redistribute([Shard(1)]),
        "grad": lambda: pst.redistribute(xs, [Shard(1)]),
        "nograd": lambda: pst.redistribute(xn, [Shard(1)]),
    }

    def batch(fn) -> Callable[[], None]:  # noqa: ANN001
        def run() -> None:
            for _ in range(50):
                fn()

        return run

    per: Dict[str, List[float]] = {k: [] for k in calls}
    cpu: Dict[str, List[float]] = {k: [] for k in calls}
    for fn in calls.values():
        timed(batch(fn), comm, 1, 2)
    for _ in range(reps // 50 + 5):  # alternated, batch by batch
        for k, fn in calls.items():
            c0 = time.process_time()
            per[k] += timed(batch(fn), comm, 1, 0)
            cpu[k].append(comm.allreduce(time.process_time() - c0, op=MPI.MAX))
    t_ps, t_grad, t_nograd = (float(np.median(per[k])) / 50 for k in calls)
    c_ps, c_grad, c_nograd = (float(np.median(cpu[k])) / 50 for k in calls)
    return dict(case=f"{m}x{m} float32 S(0)->S(1)", pyshard_us=t_ps * 1e6,
                pst_grad_us=t_grad * 1e6, pst_nograd_us=t_nograd * 1e6,
                grad_overhead_us=(t_grad - t_ps) * 1e6,
                nograd_overhead_us=(t_nograd - t_ps) * 1e6,
                cpu_us={"pyshard": c_ps * 1e6, "grad": c_grad * 1e6,
                        "nograd": c_nograd * 1e6})  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
