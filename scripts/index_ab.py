"""Gathers and scatters of one graph in two or more variants, alternated in one process, so
all see the same machine (docs/unstructured.md): by method (the evidence for ``gather_plan``'s
``method="auto"``), with the arrays at 64-byte boundaries against numpy's own allocations
(16 bytes past a page: "Rows at 64-byte boundaries"), or gathers into the caller's ``out=``
against gathers that return their result (node owners write into it: "Node-shared memory").

    mpiexec -n P python scripts/index_ab.py [--rows 1000000[,ROWS...]] [--rounds 40]
        [--methods p2p,shm | --align | --result]

The bench's graph (``pyshard/bench/ghosts.py``: rows of 64 B, each rank reading a tenth of
its row count, the ``mesh`` and ``random`` patterns). ``--methods``: one plan per method, the
same arrays. ``--align``: one plan (``auto``); ``np`` runs on numpy's allocations, ``al`` on
copies of ``x``, ``into``, the values and ``out`` at 64-byte boundaries; then, on rank 0
alone, ``np.take`` and ``a[idx] += v`` of the random rows at each offset. ``--result``: one
plan (``auto``), gathers alone: ``out`` is ``plan.gather(x, out=buf)``, ``new``
``plan.gather(x)``, ``node`` and ``plain`` the same with the result forced into node-shared
memory or a plain array (the evidence for ``NODE_RESULT_MIN_BYTES``: give ``--rows`` several
row counts). Each round runs a gather then a scatter of each variant in turn
(``pyshard.bench.timing.alternated``; ``--result``: gathers only). Prints, per pattern, the
slowest rank's median in ms of each (direction, variant), the first three rounds left out.
"""

from __future__ import annotations

import argparse
import time
from typing import Any, Dict, Tuple

import numpy as np
from mpi4py import MPI

import pyshard as ps
import pyshard.memory as _memory
import pyshard.unstructured as _unstructured
from pyshard.array import from_local
from pyshard.bench.ghosts import read_rows, row_values
from pyshard.bench.timing import alternated


def at_offset(a: np.ndarray, off: int = 0) -> np.ndarray:
    """A copy of ``a`` starting ``off`` bytes past a 64-byte boundary."""
    raw = np.empty(a.nbytes + 128, np.uint8)
    s = (-raw.ctypes.data) % 64 + off
    b = raw[s:s + a.nbytes].view(a.dtype).reshape(a.shape)
    b[...] = a
    return b


def alone(local: np.ndarray, n: int) -> None:
    """np.take and a[idx] += v of a tenth of the rows, sorted, at each offset (one process)."""
    rows = np.sort(np.random.default_rng(1).choice(n, n // 10, replace=False))
    out = np.empty((rows.size, local.shape[1]))
    for off in (0, 16, 32, 48):
        x = at_offset(local, off)
        tt, ta = [], []
        for _ in range(30):
            t = time.perf_counter()
            np.take(x, rows, axis=0, out=out)
            tt.append(time.perf_counter() - t)
            t = time.perf_counter()
            x[rows] += out
            ta.append(time.perf_counter() - t)
        print(f"rank 0 alone, rows {off} bytes past a line: np.take "
              f"{np.median(tt) * 1e3:.2f} ms, a[idx] += v {np.median(ta) * 1e3:.2f} ms")


def forced(plan: Any, x: Any, node: bool) -> np.ndarray:
    """``plan.gather(x)`` with its result in node-shared memory (``node``) or a plain array,
    whatever its size."""
    saved = _unstructured.NODE_RESULT_MIN_BYTES, _memory._pool_min[0]
    _unstructured.NODE_RESULT_MIN_BYTES = 0 if node else 1 << 62
    _memory._pool_min[0] = 1 << 62
    try:
        return plan.gather(x)
    finally:
        _unstructured.NODE_RESULT_MIN_BYTES, _memory._pool_min[0] = saved


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default=str(10**6),
                    help="rows a rank; several, comma-separated, run one after the other")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--methods", default="p2p,shm")
    ap.add_argument("--align", action="store_true",
                    help="numpy's allocations against 64-byte boundaries (one plan, auto)")
    ap.add_argument("--result", action="store_true",
                    help="gathers into out= against gathers returning their result (auto)")
    a = ap.parse_args()
    comm = MPI.COMM_WORLD
    mesh = ps.Mesh(comm, (comm.size,))
    for n in (int(r) for r in a.rows.split(",")):
        run(a, mesh, n)
    mesh.free()


def run(a: argparse.Namespace, mesh: Any, n: int) -> None:
    """Every variant of ``a`` at ``n`` rows a rank, both patterns; rank 0 prints."""
    comm = mesh.comm
    P, me = comm.size, comm.rank
    local = row_values(n, me)
    shape = (n * P, local.shape[1])

    def sharded(arr: np.ndarray) -> Any:
        return from_local(arr, mesh, [ps.Shard(0)], global_shape=shape)

    x = sharded(local)
    x_al = sharded(at_offset(local)) if a.align else None
    lines = []
    for pat in ("mesh", "random"):
        idx = read_rows(n, P, me, pat, 0.1)
        vals = np.random.default_rng([5, me]).standard_normal((idx.shape[0], local.shape[1]))
        # per variant: (plan, x, out, values, into)
        var: Dict[str, Tuple[Any, Any, np.ndarray, np.ndarray, Any]] = {}
        if a.align:
            plan = ps.gather_plan(idx, like=x)
            var["np"] = (plan, x, np.empty_like(vals), vals, sharded(local.copy()))
            var["al"] = (plan, x_al, at_offset(np.empty_like(vals)), at_offset(vals),
                         sharded(at_offset(local)))
        else:
            buf, y = np.empty_like(vals), sharded(local.copy())
            for m in a.methods.split(","):
                var[m] = (ps.gather_plan(idx, like=x, method=m), x, buf, vals, y)
        fns = {}
        if a.result:
            plan = ps.gather_plan(idx, like=x)
            buf = np.empty_like(vals)
            want = plan.gather(x, out=buf).copy()
            for got in (plan.gather(x), forced(plan, x, True), forced(plan, x, False)):
                assert np.array_equal(got, want), "gather(x) differs from out="
            fns[("gather", "out")] = lambda p=plan, o=buf: p.gather(x, out=o)
            fns[("gather", "new")] = lambda p=plan: p.gather(x)
            fns[("gather", "node")] = lambda p=plan: forced(p, x, True)
            fns[("gather", "plain")] = lambda p=plan: forced(p, x, False)
            var = {}
        for k, (pl, xk, b, v, t) in var.items():
            fns[("gather", k)] = lambda p=pl, xx=xk, o=b: p.gather(xx, out=o)
            fns[("scatter", k)] = lambda p=pl, vv=v, tt=t: p.scatter(vv, into=tt)
        ts = alternated(fns, comm, a.rounds)
        lines.append(f"{pat:>7}: " + "  ".join(
            f"{d} {k} {v * 1e3:.3f}" for (d, k), v in sorted(ts.items())))
    if me == 0:
        kib = f" (results of {idx.shape[0] * 64 / 1024:.0f} KiB on rank 0)" if a.result else ""
        print(f"{P} ranks, {n} rows of 64 B a rank{kib}, median of {a.rounds - 3} rounds (ms):")
        print("\n".join(lines), flush=True)
        if a.align:
            alone(local, n)

if __name__ == "__main__":
    main()
