"""What the ordering token prevents: tests/mpi/test_jax.py's two independent redistributes in
one ``jax.jit``, run with pyshard.jax's collectives lowered WITHOUT the ordered effect (each
custom call gets a fresh token of its own, and the primitive declares no effect), so XLA may
schedule them in any order, or at once on two threads.

    timeout 300 mpiexec -n 2 python scripts/jax_unordered_demo.py [--calls 200] [--ordered]

Prints, on rank 0, how many of the calls gave the right results, or the ranks hang (the
``timeout`` ends it; a watchdog in each rank prints where it waits after ``--watchdog`` s).
``--ordered`` runs the same program with pyshard.jax as shipped. A demonstration for
docs/jax.md, not a test: without the token the outcome depends on XLA's scheduler.
"""

from __future__ import annotations

import argparse
import faulthandler
import sys
from typing import Any

import numpy as np
from mpi4py import MPI


def unorder(side_effect: bool = True) -> None:
    """Lower pyshard.jax's step primitive with no ordered effect and a fresh token a call."""
    from jax._src.lib.mlir.dialects import hlo
    from jax.core import ShapedArray
    from jax.ffi import ffi_lowering
    from jax.interpreters import mlir

    from pyshard.jax import _ops

    def abstract(x: Any, *, step: Any, mesh: Any, algorithm: str, shape: tuple,
                 dtype: Any) -> Any:
        return ShapedArray(shape, dtype), set()

    def lower(ctx: Any, x: Any, *, step: Any, mesh: Any, algorithm: str, shape: tuple,
              dtype: Any) -> list:
        tok = hlo.create_token()
        ctx2 = ctx.replace(avals_in=(*ctx.avals_in, _ops.abstract_token),
                           avals_out=(*ctx.avals_out, _ops.abstract_token))
        out, _ = ffi_lowering(_ops.TARGET, has_side_effect=side_effect)(
            ctx2, x, tok, step=np.int64(_ops._step_id(step, mesh, algorithm)))
        return [out]

    _ops.step_p.def_effectful_abstract_eval(abstract)
    mlir.register_lowering(_ops.step_p, lower, platform="cpu")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--ordered", action="store_true", help="pyshard.jax as shipped")
    ap.add_argument("--watchdog", type=float, default=60.0)
    ap.add_argument("--rows", type=int, default=4, help="rows a rank of the first array")
    ap.add_argument("--skew", action="store_true",
                    help="uneven shards: rank 0 holds most of the first array, the last rank "
                    "most of the second (per-rank shapes differ, so may XLA's schedules)")
    ap.add_argument("--compute", action="store_true",
                    help="work before the first redistribute (its input an expression), none "
                    "before the second: a scheduler may move the second first")
    ap.add_argument("--no-side-effect", action="store_true",
                    help="unordered calls also lowered has_side_effect=False")
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    import jax

    jax.config.update("jax_enable_x64", True)  # float64, as the test runs
    import pyshard as ps
    import pyshard.jax as psj
    from pyshard import Replicate, Shard

    if not args.ordered:
        unorder(not args.no_side_effect)
    faulthandler.dump_traceback_later(args.watchdog, exit=True)
    mesh = ps.Mesh(comm, (comm.size,))
    rng = np.random.default_rng(0)
    a = rng.standard_normal((args.rows * comm.size + 3, 9 * args.rows))
    b = rng.standard_normal((5 * args.rows, 3 * comm.size + 1)).astype(np.float32)
    sa = sb = None
    if args.skew and comm.size > 1:
        n, m = a.shape[0], b.shape[1]
        sa = {0: [n - (comm.size - 1)] + [1] * (comm.size - 1)}
        sb = {1: [1] * (comm.size - 1) + [m - (comm.size - 1)]}
    xa = psj.distribute(a, mesh, [Shard(0)], sizes=sa)
    xb = psj.distribute(b, mesh, [Shard(1)], sizes=sb)

    @jax.jit
    def f(xa: Any, xb: Any) -> Any:
        if args.compute:  # exact: eight multiplications by cos(0) = 1
            w = xa.local
            for _ in range(8):
                w = w * jax.numpy.cos(w * 0.0)
            xa = psj.Sharded(w, xa.layout, mesh)
        ya = psj.redistribute(xa, [Shard(1)])
        yb = psj.redistribute(xb, [Shard(0)])
        za = psj.redistribute(ya, [Replicate()])
        return yb, za

    good = 0
    for _ in range(args.calls):
        yb, za = f(xa, xb)
        good += int(np.array_equal(np.asarray(za.local), a)
                    and np.array_equal(np.asarray(yb.local), b[yb.layout.box(mesh.coords)]))
    faulthandler.cancel_dump_traceback_later()
    bad = comm.allreduce(args.calls - good)
    if comm.rank == 0:
        mode = "ordered (as shipped)" if args.ordered else "without the ordering token"
        print(f"{comm.size} ranks, {mode}: {args.calls * comm.size - bad} of "
              f"{args.calls * comm.size} rank-calls right, jax {jax.__version__}")
    mesh.free()
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
