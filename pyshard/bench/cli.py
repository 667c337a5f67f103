"""``python -m pyshard bench``: the command line. Parses the flags (counts, shapes, names and
backends are checked here: a bad value is an argparse error naming the option, before any
case runs), runs the named cases (the redistribution cases of :mod:`~pyshard.bench.cases` on
the host, or on the GPU with ``--device cuda``, and the extra cases of
:data:`~pyshard.bench.cases.EXTRA_CASES`), prints a table and appends JSON lines: strict JSON
(:func:`~pyshard.bench.report.json_line`), each row with ``"ranks"``, the run's rank count."""

from __future__ import annotations

import argparse
import sys
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
from mpi4py import MPI

from .. import _dtypes, collectives
from .._mpi import library_line
from ..config import ALGORITHMS
from ..layout import Layout, Partial, check_dtype
from ..mesh import Mesh
from .cases import CASES, EXTRA_CASES, make_cases
from .checkpoint import bench_checkpoint
from .ckpt_formats import ALL as CKPT_FORMATS
from .ckpt_formats import bench_formats, format_formats
from .fft import bench_fft, format_fft
from .fft3d import bench_fft3d, format_fft3d
from .gpu import main_cuda
from .halo import bench_halo, bench_stencil, format_halo, format_stencil
from .host import run_case
from .many import bench_many, format_many
from .memory import MEMORY_LIMIT_MIB, bench_memory, format_memory
from .migrate import bench_migrate, format_migrate
from .report import append_json, format_table, json_line
from .sparse import bench_sparse_setup, format_sparse
from .unstructured import bench_unstructured, format_unstructured

ALGORITHM_NAMES = ("auto", "tune", *ALGORITHMS)
"""Every value ``--algorithm`` accepts (``redistribute(algorithm=)``'s)."""

FFT_BACKENDS = ("scipy", "numpy", "pyfftw", "pyfftw-measure")
"""pyshard.fft's local-transform backends (``--fft-backends``)."""

PFFT_BACKENDS = ("fftw", "pyfftw", "numpy", "scipy", "mkl_fft")
"""mpi4py-fft PFFT's serial backends (``--fft-pfft``)."""

REDIST_USE = "the redistribution cases (" + ", ".join(CASES) + ")"


def count_arg(lo: int) -> Callable[[str], int]:
    """An argparse type: an integer >= ``lo`` (argparse names the option in its error)."""

    def count(s: str) -> int:
        try:
            v = int(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{s!r} is not an integer") from None
        if v < lo:
            raise argparse.ArgumentTypeError(f"must be an integer >= {lo}, got {v}")
        return v

    return count


def shape_arg(dims: Tuple[int, ...]) -> Callable[[str], str]:
    """An argparse type: ``AxB[xC...]`` of positive integers with a number of dims in
    ``dims``; the string (lower case)."""

    def shape(s: str) -> str:
        parts = s.lower().split("x")
        if not all(p.isdigit() and int(p) > 0 for p in parts) or len(parts) not in dims:
            want = (" or ".join(f"{d}-D" for d in dims) if len(dims) < 4
                    else f"{dims[0]}-D to {dims[-1]}-D")
            raise argparse.ArgumentTypeError(
                f"{s!r} is not a shape AxB[xC] of positive integers ({want})")
        return s.lower()

    return shape


def _names(allowed: Sequence[str], what: str, empty: str = "",
           extra: Sequence[str] = ()) -> Callable[[str], str]:
    """An argparse type: a comma list of names from ``allowed`` (or one of ``extra``
    alone); ``empty``: where not "", the empty list is allowed and this says how."""

    def names(s: str) -> str:
        if s in extra:
            return s
        vals = [v for v in s.split(",") if v]
        bad = [v for v in vals if v not in allowed]
        if bad or (not vals and not empty):
            more = f"; or {' or '.join(extra)} alone" if extra and not empty else ""
            raise argparse.ArgumentTypeError(
                f"unknown {what} {', '.join(map(repr, bad)) or repr(s)}: give a comma list of "
                f"{', '.join(allowed)}{more}{'; ' + empty if empty else ''}")
        return s

    return names


def _fft_batch(s: str) -> str:
    """An argparse type: ``0`` (skip), ``B`` or ``BxM`` with B, M >= 1."""
    b, x, m = s.lower().partition("x")
    ok = b.isdigit() and (not x or (m.isdigit() and int(m) > 0))
    if not ok or (int(b) == 0 and x) or (int(b) > 0 and x and int(m) == 0):
        raise argparse.ArgumentTypeError(
            f"{s!r} is not BxM (B, M >= 1; B alone: M = 1024) or 0 (skip the batched case)")
    return s.lower()


def make_parser() -> argparse.ArgumentParser:
    """The argument parser of ``python -m pyshard bench``."""
    ap = argparse.ArgumentParser(
        prog="python -m pyshard bench",
        epilog="Cases run only when named: checkpoint (save/load GB/s, --checkpoint-bytes, "
        "--checkpoint-reps; --formats: each checkpoint format next to the tools), "
        "memory (peak RSS over --memory-shapes distinct shapes; check: growth after 40 shapes "
        f"<= {MEMORY_LIMIT_MIB} MiB), sparse (setup at up to 65,536 simulated ranks), fft3d "
        "(a pencil 3-D FFT, --fft-n), fft (pyshard.fft: c2c and r2c, slab and pencil, forward "
        "and backward, local FFT and transpose times; a batched 2-D case, --fft-batch), "
        "halo (one ghost-cell update of 2-D 8192^2 float64 width 1 "
        "and 4, 3-D 384^3 float32 width 2, on a 2-D mesh; --halo-scale, --halo-shape) and "
        "stencil (the heat example, blocking vs overlapped steps; --stencil-n), many (200 arrays "
        "in one redistribute_many vs a loop vs one raw collective; --many-count), "
        "migrate (migrate's row exchange vs the floor and by hand; --migrate-rows), "
        "unstructured (gather_plan's gather, scatter and setup vs the floor and by hand; "
        "--unstructured-rows). Every JSON row carries \"ranks\" (the run's rank count). See "
        "the docstring of the package pyshard.bench.",
    )
    ap.add_argument(
        "--cases", "--case", default=",".join(CASES), help=f"comma list of {CASES + EXTRA_CASES}"
    )
    ap.add_argument("--shape", default="8192x8192", type=shape_arg((2, 3, 4, 5, 6, 7, 8)),
                    help=f"{REDIST_USE}, but for small (always 64x64: the small-call "
                    f"case): the global shape AxB[xC...] (default 8192x8192)")
    ap.add_argument(
        "--fft-n", type=count_arg(1), default=256,
        help="fft3d and fft cases: an n^3 grid (fft3d complex128; fft c2c complex128 and r2c "
        "float64; default 256)",
    )
    ap.add_argument(
        "--fft-batch",
        default="64x1024",
        type=_fft_batch,
        help="fft case: the batched 2-D transform BxM (B x M x M complex128; 0 skips it)",
    )
    ap.add_argument(
        "--fft-backends",
        default="auto",
        type=_names(FFT_BACKENDS, "pyshard.fft backend", extra=("auto",)),
        help="fft case: pyshard.fft backends to run (comma list of "
        f"{', '.join(FFT_BACKENDS)}; auto: every one installed but numpy)",
    )
    ap.add_argument(
        "--fft-pfft",
        default="fftw,numpy",
        type=_names(PFFT_BACKENDS, "mpi4py-fft PFFT backend", extra=("none",),
                    empty="none or an empty value (--fft-pfft=) runs no PFFT"),
        help="fft case: mpi4py-fft PFFT backends run beside it (comma list of "
        f"{', '.join(PFFT_BACKENDS)}; none or --fft-pfft= for none; skipped where "
        "mpi4py_fft does not import)",
    )
    ap.add_argument("--fft-decomps", default="slab,pencil",
                    type=_names(("slab", "pencil"), "fft decomposition"),
                    help="fft case: slab,pencil")
    ap.add_argument("--fft-kinds", default="c2c,r2c", type=_names(("c2c", "r2c"), "fft kind"),
                    help="fft case: c2c,r2c")
    ap.add_argument(
        "--halo-scale", type=count_arg(1), default=1,
        help="halo case: divide the built-in grids' extents by this (not --halo-shape's)",
    )
    ap.add_argument(
        "--halo-shape", default=None, type=shape_arg((2, 3)),
        help="halo case: one grid AxB[xC] (width 1) instead",
    )
    ap.add_argument("--halo-loop", type=count_arg(1), default=20,
                    help="halo case: updates per rep (default 20)")
    ap.add_argument(
        "--stencil-n", type=count_arg(1), default=2048,
        help="stencil case: an n^dim grid (default 2048)",
    )
    ap.add_argument("--stencil-dim", type=int, default=2, choices=(2, 3),
                    help="stencil case: the grid's dims (with --stencil-n)")
    ap.add_argument(
        "--stencil-shape", default=None, type=shape_arg((2, 3)),
        help="stencil case: the grid AxB[xC] (not --stencil-n)",
    )
    ap.add_argument("--stencil-steps", type=count_arg(1), default=20,
                    help="stencil case: heat steps per rep (default 20)")
    ap.add_argument("--many-count", type=count_arg(1), default=200,
                    help="many case: how many arrays (default 200)")
    ap.add_argument("--migrate-rows", type=count_arg(1), default=1_000_000,
                    help="migrate case: rows a rank (64 B each; default 10^6)")
    ap.add_argument("--unstructured-rows", type=count_arg(1), default=1_000_000,
                    help="unstructured case: rows owned a rank (64 B each; default 10^6)")
    ap.add_argument("--many-scale", type=count_arg(1), default=1,
                    help="many case: divide the shapes")
    ap.add_argument("--dtype", default="float32", type=_dtype,
                    help=f"{REDIST_USE} and --device cuda only: the element type (default "
                    "float32); the other cases use the dtypes their help states")
    ap.add_argument("--reps", type=count_arg(1), default=10,
                    help="timed repetitions (default 10): the redistribution cases, fft3d, fft, "
                    "halo, many, migrate, unstructured; stencil runs max(1, reps // 3); "
                    "checkpoint uses --checkpoint-reps; memory and sparse ignore it")
    ap.add_argument("--warmup", type=count_arg(0), default=2,
                    help="untimed runs before the timed ones (default 2): the redistribution "
                    "cases, fft3d, fft, many, migrate, unstructured (halo and stencil run one "
                    "untimed loop of their own)")
    ap.add_argument(
        "--algorithm", default="auto",
        type=_names(ALGORITHM_NAMES, "algorithm"),
        help=f"{REDIST_USE} and fft3d (its transposes), one row per algorithm: "
        f"{', '.join(ALGORITHM_NAMES)}, or a comma list of them (default auto)",
    )
    ap.add_argument("--json", default=None, help="append one JSON object per case to FILE")
    ap.add_argument("--checkpoint-bytes", type=count_arg(4), default=1 << 30,
                    help="checkpoint case: the array's bytes, rounded down to whole float32 "
                    "elements (default 1 GiB), saved in a "
                    "temporary directory under TMPDIR (on several nodes, a shared file system)")
    ap.add_argument(
        "--formats",
        default=None,
        type=_names(CKPT_FORMATS, "checkpoint format", extra=("all",)),
        help="checkpoint case: instead of the .npy save/load next to numpy, compare these "
        "formats (comma list of npy,hdf5,zarr,safetensors, or 'all') through pyshard and "
        "the tools (gather to rank 0 + h5py/zarr/safetensors, zarr-python and tensorstore "
        "per rank, torch DCP, h5py mpio), Shard(1), no fsync",
    )
    ap.add_argument("--checkpoint-reps", type=count_arg(1), default=1,
                    help="checkpoint case (with or without --formats): repetitions of each save "
                    "and load (default 1)")
    ap.add_argument(
        "--memory-shapes",
        type=count_arg(1),
        default=400,
        help="memory case: distinct shapes (default 400; its growth check compares the peak "
        "after the 40th with the last, so fewer than 40 check nothing)",
    )
    ap.add_argument(
        "--device",
        choices=("host", "cuda"),
        default="host",
        help="host: numpy arrays (default); cuda: cupy arrays, the cases transpose and gather "
        "next to cupy + mpi4py by hand, and the pack kernel's bandwidth",
    )
    return ap


def _dtype(s: str) -> str:
    """An argparse type: the name of a dtype pyshard moves (numbers, bool, ml_dtypes' floats:
    an object or string dtype failed in the first case, with a traceback)."""
    try:
        check_dtype(s, "--dtype")
    except TypeError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--dtype: ")) from None
    return s


def _sums(dtype: np.dtype) -> bool:
    """Does pyshard take a Partial("sum") of ``dtype`` (the layout's own rule: not long
    double)?"""
    try:
        Layout((1,), dtype, (1,), [Partial("sum")])
    except ValueError:
        return False
    return True


def _run_extra(name: str, comm: MPI.Comm, args: argparse.Namespace) -> List[Dict]:
    """Run an extra case (checkpoint, memory, sparse, fft3d, fft, halo, stencil, many,
    migrate, unstructured); rank 0 prints its rows. Every row carries ``"ranks"``: the
    run's rank count (the Slurm scripts check it)."""
    p = comm.Get_size()
    if name == "checkpoint" and args.formats:
        fmts = None if args.formats == "all" else [f for f in args.formats.split(",") if f]
        rows = bench_formats(
            Mesh(comm, (p,)), nbytes=args.checkpoint_bytes, formats=fmts,
            reps=args.checkpoint_reps,
            progress=lambda row: comm.Get_rank() == 0 and print(
                f"[bench] {row['method']} ({row['wall_s']:.1f} s)", file=sys.stderr, flush=True),
        )
        if comm.Get_rank() == 0:
            b = rows[0]["bytes"] if rows else 0
            print(f"checkpoint formats: {b} bytes float32 Shard(1), {p} ranks")
            print(format_formats(rows), flush=True)
            for row in rows:
                print(json_line(row), flush=True)
        return [{"case": "checkpoint", "ranks": p, "formats": rows,
                 "check": all(r.get("ok", True) for r in rows)}]
    if name == "checkpoint":
        r = bench_checkpoint(Mesh(comm, (p,)), nbytes=args.checkpoint_bytes,
                             reps=args.checkpoint_reps)
        r["reps"] = args.checkpoint_reps
    elif name == "sparse":
        # "ranks": this run's; the simulated meshes' rank counts are in "rows"
        r = {**bench_sparse_setup(), "ranks": p}
        if comm.Get_rank() == 0:
            print(format_sparse(r), flush=True)
    elif name == "many":
        r = bench_many(comm, count=args.many_count, scale=args.many_scale, reps=args.reps,
                       warmup=args.warmup)
        if comm.Get_rank() == 0:
            print(format_many(r), flush=True)
    elif name == "halo":
        shape = None if not args.halo_shape else [int(v) for v in args.halo_shape.split("x")]
        r = bench_halo(comm, scale=args.halo_scale, reps=args.reps, loop=args.halo_loop,
                       shape=shape)
        if comm.Get_rank() == 0:
            print(format_halo(r), flush=True)
    elif name == "stencil":
        shape = None if not args.stencil_shape else [
            int(v) for v in args.stencil_shape.split("x")]
        r = bench_stencil(comm, n=args.stencil_n, steps=args.stencil_steps,
                          reps=max(1, args.reps // 3), dim=args.stencil_dim, shape=shape)
        if comm.Get_rank() == 0:
            print(format_stencil(r), flush=True)
    elif name == "fft":
        b, _, m = args.fft_batch.partition("x")
        be = None if args.fft_backends == "auto" else [v for v in args.fft_backends.split(",") if v]
        pf = [] if args.fft_pfft == "none" else [v for v in args.fft_pfft.split(",") if v]
        r = bench_fft(comm, n=args.fft_n, reps=args.reps, warmup=args.warmup, batch=int(b),
                      batch_n=int(m or 1024), backends=be,
                      pfft_backends=pf,
                      decomps=tuple(v for v in args.fft_decomps.split(",") if v),
                      kinds=tuple(v for v in args.fft_kinds.split(",") if v),
                      progress=lambda row: comm.Get_rank() == 0 and print(
                          format_fft(row), file=sys.stderr, flush=True))
        if comm.Get_rank() == 0:
            print(format_fft(r), flush=True)
    elif name == "migrate":
        r = bench_migrate(comm, rows=args.migrate_rows, reps=args.reps, warmup=args.warmup)
        if comm.Get_rank() == 0:
            print(format_migrate(r), flush=True)
    elif name == "unstructured":
        r = bench_unstructured(comm, rows=args.unstructured_rows, reps=args.reps,
                               warmup=args.warmup)
        if comm.Get_rank() == 0:
            print(format_unstructured(r), flush=True)
    elif name == "fft3d":
        out = []
        for algo in _algos(args):  # its transposes' algorithm; complex128 always
            r = bench_fft3d(comm, n=args.fft_n, reps=args.reps, warmup=args.warmup,
                            algorithm=algo)
            r.setdefault("ranks", p)
            if comm.Get_rank() == 0:
                print(format_fft3d(r), flush=True)
                print(json_line(r), flush=True)
            out.append(r)
        return out
    else:
        if comm.Get_rank() == 0:
            print(f"[bench] memory {args.memory_shapes} shapes ...", file=sys.stderr, flush=True)
        r = bench_memory(comm, shapes=args.memory_shapes)
        if comm.Get_rank() == 0:
            print(format_memory(r), flush=True)
    r.setdefault("ranks", p)
    if comm.Get_rank() == 0:
        print(json_line(r), flush=True)
    return [r]


def _algos(args: argparse.Namespace) -> List[str]:
    return [a for a in args.algorithm.split(",") if a]


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m pyshard bench``: run the cases, print a table, append JSON lines."""
    ap = make_parser()
    args = ap.parse_args(argv)
    if args.device == "cuda":
        return main_cuda(args)
    names = [n for n in args.cases.split(",") if n]
    bad = [n for n in names if n not in CASES + EXTRA_CASES]
    if bad or not names:
        ap.error(f"argument --cases: unknown case(s) {bad or [args.cases]}; cases are "
                 f"{', '.join(CASES + EXTRA_CASES)}")
    comm = MPI.COMM_WORLD
    rank, p = comm.Get_rank(), comm.Get_size()
    shape = tuple(int(s) for s in args.shape.split("x"))
    dtype = np.dtype(args.dtype)
    if "reduce_scatter" in names and (dtype == np.dtype(bool) or _dtypes.is_ml(dtype)
                                      or not _sums(dtype)):
        # (its MPI reference: MPI has no sum of C bools, mpi4py no buffer of ml_dtypes')
        if args.cases != ",".join(CASES):
            ap.error(f"argument --cases: the reduce_scatter case cannot sum --dtype "
                     f"{args.dtype} (its MPI reference, or pyshard's Partial); leave it out or "
                     f"bench another dtype")
        names.remove("reduce_scatter")
        if rank == 0:
            print(f"[bench] note: reduce_scatter left out: it cannot sum --dtype "
                  f"{args.dtype}", file=sys.stderr, flush=True)
    if args.json:  # writable? (before any case: else the results were lost at the end)
        why = None
        if rank == 0:
            try:
                with open(args.json, "a", encoding="utf-8"):
                    pass
            except OSError as e:
                why = f"{type(e).__name__}: {e.strerror or e}"
        why = collectives.bcast(comm, why)
        if why is not None:
            ap.error(f"argument --json: cannot append to {args.json!r} ({why})")
    algos = _algos(args)
    redist = [n for n in names if n not in EXTRA_CASES]
    rows: List[Dict] = []

    def finish(new: List[Dict]) -> None:
        """Mark and keep the rows of a case; rank 0 appends them to --json at once (a case
        that fails later loses nothing run before it)."""
        for r in new:  # the Slurm scripts check every row's rank count
            r.setdefault("ranks", p)
            r.setdefault("mpi", library_line())  # (plot's title names it)
            if r.get("ok") is False:  # (the checkpoint case's round trip says "ok")
                r["check"] = False
                if rank == 0:
                    print(f"[bench] {r['case']}: WRONG: the data read back differs from what "
                          f"was saved", file=sys.stderr, flush=True)
        rows.extend(new)
        if rank == 0 and args.json:
            append_json(args.json, new)
    if rank == 0:
        what = f"{args.shape} {dtype}, " if redist else ""  # only the redistribution cases'
        print(
            f"pyshard bench: {p} ranks, {what}reps {args.reps}, "
            f"warmup {args.warmup}; {library_line()}",
            flush=True,
        )
        if not redist and dtype != np.dtype("float32"):
            print(f"[bench] note: --dtype {args.dtype} is used by {REDIST_USE} only; none runs",
                  file=sys.stderr, flush=True)
        if not redist and "fft3d" not in names and algos != ["auto"]:
            print(f"[bench] note: --algorithm {args.algorithm} is used by {REDIST_USE} and "
                  "fft3d only; none runs", file=sys.stderr, flush=True)
    for name in names:
        if name in EXTRA_CASES:
            finish(_run_extra(name, comm, args))
            continue
        for case in make_cases([name], shape, p):
            for algo in algos:
                if rank == 0:
                    print(f"[bench] {case.name} {algo} ...", file=sys.stderr, flush=True)
                finish([run_case(case, comm, dtype, args.reps, args.warmup, algo)])
    if rank == 0 and any(r["case"] not in EXTRA_CASES for r in rows):
        print(format_table(rows))
    return 0 if all(r.get("check", True) for r in rows) else 1
