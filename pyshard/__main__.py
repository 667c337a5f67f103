"""Command line: ``python -m pyshard demo`` (run it under mpiexec)."""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

import numpy as np
from mpi4py import MPI

import pyshard as ps
from pyshard import Partial, Replicate, Shard, _dtypes, _mpi, collectives
from pyshard.layout import Layout, check_dtype

from .bench.timing import median_s


def _global(shape: tuple, dtype: np.dtype, seed: int = 0) -> np.ndarray:
    n = int(np.prod(shape))
    base = (np.arange(n, dtype=np.int64) * 7919 + 31 * seed) % 1009
    return (base - 504).astype(dtype).reshape(shape)


def demo(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pyshard demo")
    from .bench.cli import count_arg, shape_arg

    def numeric(s: str) -> np.dtype:
        """A dtype the demo's cases all take: one pyshard moves (numbers, bool, ml_dtypes'
        floats such as bfloat16) and sums (its Partial("sum") cases: not long double)."""
        try:
            dt = check_dtype(s, "--dtype")
        except TypeError as e:
            raise argparse.ArgumentTypeError(str(e).removeprefix("--dtype: ")) from None
        try:
            Layout((1,), dt, (1,), [Partial("sum")])
        except ValueError as e:
            raise argparse.ArgumentTypeError(
                f"{s!r}: the demo's reduce-scatter and allreduce cases need a dtype pyshard "
                f"sums ({e})") from None
        return dt

    ap.add_argument("--shape", default="4099x2050", type=shape_arg((2, 3, 4, 5, 6, 7, 8)),
                    help="global shape, AxB[xC...] (at least 2 dims), e.g. 4099x2050")
    ap.add_argument("--dtype", default="float64", type=numeric,
                    help="a numeric numpy dtype, or bfloat16 (default float64)")
    ap.add_argument("--reps", type=count_arg(1), default=5, help="timed calls per case (>= 1)")
    args = ap.parse_args(argv)
    comm = MPI.COMM_WORLD
    p, rank = comm.size, comm.rank
    shape = tuple(int(s) for s in args.shape.split("x"))
    if shape[0] < p:  # the skewed case gives every rank but the first one row
        ap.error(f"--shape {args.shape}: the first dim must be at least the rank count ({p})")
    dtype = args.dtype
    mesh = ps.Mesh(comm, (p,))
    g = _global(shape, dtype)
    skew = [0] * p
    skew[0] = shape[0] - (p - 1)
    for i in range(1, p):
        skew[i] = 1
    parts = [_global(shape, dtype, seed=1 + i) for i in range(p)]
    # (pyshard sums float16 and ml_dtypes' floats in float32 and rounds once, at the end)
    gsum = np.sum(parts, axis=0, dtype=_dtypes.accumulator(dtype)).astype(dtype)

    s0 = ps.distribute(g, mesh, [Shard(0)])
    s1 = ps.distribute(g, mesh, [Shard(1)])
    rep = ps.distribute(g, mesh, [Replicate()])
    part = ps.from_local(parts[rank], mesh, [Partial("sum")], global_shape=shape)
    skewed = ps.distribute(g, mesh, [Shard(0)], sizes={0: skew})
    cases = [
        ("transpose S(0)->S(1)", s0, [Shard(1)], None, g),
        ("transpose S(1)->S(0)", s1, [Shard(0)], None, g),
        ("gather S(0)->R", s0, [Replicate()], None, g),
        ("scatter R->S(1)", rep, [Shard(1)], None, g),
        ("reduce-scatter P->S(0)", part, [Shard(0)], None, gsum),
        ("allreduce P->R", part, [Replicate()], None, gsum),
        ("rebalance skewed->even", skewed, [Shard(0)], None, g),
    ]
    if rank == 0:
        print(
            f"pyshard demo: {p} ranks, global {shape} {dtype} "
            f"({g.nbytes / 2**20:.1f} MiB), MPI: {_mpi.library_line()}"
        )
        print(f"{'case':<26}{'collectives':<28}{'time (ms)':>10}{'max sent/rank':>16}  check")
    failed = 0
    for name, x, target, sizes, ref in cases:
        plan = x.plan_to(target, sizes)
        before = ps.comm_stats()
        y = x.redistribute(target, sizes)  # warm: builds the plan and the core objects once
        now = ps.comm_stats()
        taken = "+".join(k for k, v in now.items() if v > before.get(k, 0))
        ok = bool(np.array_equal(y.local, ref[y.box]))
        ok = collectives.all_true(comm, ok)
        failed += not ok
        t = median_s(lambda x=x, t=target, s=sizes: x.redistribute(t, s), comm, args.reps)
        sent = max((b[0] for b in plan.rank_bytes(mesh.coords)), default=0)
        sent = collectives.max_all(comm, sent)
        kinds = "+".join(s.kind for s in plan.steps if s.is_collective) or "none (local)"
        if taken and taken != kinds:  # the path taken: node-shared memory, another algorithm
            kinds = f"{kinds} [{taken}]"
        if rank == 0:
            print(
                f"{name:<26}{kinds:<28}{t * 1e3:>10.2f}{sent / 2**20:>13.2f} MiB  "
                f"{'ok' if ok else 'WRONG'}"
            )
    if rank == 0:
        print("all results equal the numpy reference" if not failed else f"{failed} case(s) WRONG")
    return 1 if failed else 0


def doctor(argv: Optional[List[str]] = None) -> int:
    """``python -m pyshard doctor``: rank 0 prints :func:`pyshard.doctor.report`; 0 always (a
    report, not a test)."""
    import logging

    from . import doctor as doc

    ap = argparse.ArgumentParser(prog="python -m pyshard doctor", description=doc.__doc__)
    ap.parse_args(argv)
    comm = MPI.COMM_WORLD
    log = logging.getLogger("pyshard")
    level = log.level
    log.setLevel(logging.ERROR)  # the mesh's own notes (threads) are among the hints
    try:
        lines, hints = doc.report(comm)
    finally:
        log.setLevel(level)
    if comm.rank == 0:
        print("\n".join(lines))
        print("hints:" if hints else "hints: none")
        for h in hints:
            print(f"- {h}")
    return 0


def plot(argv: List[str]) -> int:
    """``python -m pyshard plot``: a file it cannot read, or one that is not the bench's JSON
    lines, is a message and exit 1 (they were tracebacks)."""
    import json

    from .bench.plot import plot_main

    try:
        return plot_main(argv)
    except OSError as e:
        print(f"python -m pyshard plot: {e.filename}: {e.strerror}", file=sys.stderr)
    except json.JSONDecodeError as e:
        print(f"python -m pyshard plot: a line is not JSON ({e.msg}): {e.doc.strip()[:80]!r}; "
              "give the JSON lines pyshard bench --json writes", file=sys.stderr)
    except UnicodeDecodeError as e:
        print(f"python -m pyshard plot: a file is not text ({e.reason} at byte {e.start}); "
              "give the JSON lines pyshard bench --json writes", file=sys.stderr)
    except ValueError as e:  # (a line that is JSON but no object)
        print(f"python -m pyshard plot: {e}; give the JSON lines pyshard bench --json writes",
              file=sys.stderr)
    return 1


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    usage = (
        "usage: mpiexec -n N python -m pyshard demo [--shape 4099x2050] [--dtype float64]\n"
        "       mpiexec -n N python -m pyshard bench [--cases ...] [--json FILE] (see --help)\n"
        "       python -m pyshard plot FILE... -o out.png\n"
        "       python -m pyshard config   (every PYSHARD_* setting, as a Markdown table)\n"
        "       mpiexec -n N python -m pyshard doctor   (what the machines give pyshard)"
    )
    if not argv or argv[0] in ("-h", "--help"):
        print(usage, file=sys.stdout if argv else sys.stderr)  # (no command: an error)
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "demo":
        return demo(rest)
    if cmd == "bench":
        from .bench.cli import main as bench_main

        return bench_main(rest)
    if cmd == "config":
        from . import config

        what = "every PYSHARD_* setting, as a Markdown table (docs/configuration.md)"
        if rest in (["-h"], ["--help"]):
            print(f"usage: python -m pyshard config\n\nPrints {what}.")
            return 0
        if rest:
            print(f"python -m pyshard config takes no arguments (got {' '.join(rest)}): it "
                  f"prints {what}", file=sys.stderr)
            return 2
        print(config.table(), end="")
        return 0
    if cmd == "doctor":
        return doctor(rest)
    if cmd == "plot":
        return plot(rest)
    print(f"unknown command {cmd!r}\n{usage}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
