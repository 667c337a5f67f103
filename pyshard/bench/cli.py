"""``python -m pyshard bench``: the command line. Parses the flags, runs the named cases
(the redistribution cases of :mod:`~pyshard.bench.cases` on the host, or on the GPU with
``--device cuda``, and the extra cases: checkpoint, memory, sparse, fft3d), prints a table
and appends JSON lines."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Dict, List, Optional

import numpy as np
from mpi4py import MPI

from .._mpi import library_line
from ..mesh import Mesh
from .cases import CASES, EXTRA_CASES, make_cases
from .checkpoint import bench_checkpoint
from .ckpt_formats import bench_formats, format_formats
from .fft import bench_fft, format_fft
from .fft3d import bench_fft3d, format_fft3d
from .gpu import main_cuda
from .halo import bench_halo, bench_stencil, format_halo, format_stencil
from .host import run_case
from .many import bench_many, format_many
from .memory import MEMORY_LIMIT_MIB, bench_memory, format_memory
from .migrate import bench_migrate, format_migrate
from .report import append_json, format_table
from .sparse import bench_sparse_setup, format_sparse
from .unstructured import bench_unstructured, format_unstructured


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m pyshard bench",
        epilog="Cases run only when named: checkpoint (save/load GB/s, --checkpoint-bytes; "
        "--formats: each checkpoint format next to the tools), "
        "memory (peak RSS over --memory-shapes distinct shapes; check: growth after 40 shapes "
        f"<= {MEMORY_LIMIT_MIB} MiB), sparse (setup at up to 65,536 simulated ranks) and fft3d "
        "(a pencil 3-D FFT, --fft-n), fft (pyshard.fft: c2c and r2c, slab and pencil, forward "
        "and backward, local FFT and transpose times; a batched 2-D case, --fft-batch), "
        "halo (one ghost-cell update of 2-D 8192^2 float64 width 1 "
        "and 4, 3-D 384^3 float32 width 2, on a 2-D mesh; --halo-scale, --halo-shape) and "
        "stencil (the heat example, blocking vs overlapped steps; --stencil-n), many (200 arrays "
        "in one redistribute_many vs a loop vs one raw collective; --many-count), "
        "unstructured (gather_plan's gather, scatter and setup vs the floor and by hand; "
        "--unstructured-rows). See the "
        "docstring of the package pyshard.bench.",
    )
    ap.add_argument(
        "--cases", "--case", default=",".join(CASES), help=f"comma list of {CASES + EXTRA_CASES}"
    )
    ap.add_argument("--shape", default="8192x8192")
    ap.add_argument(
        "--fft-n", type=int, default=256, help="fft3d case: an n^3 complex128 array (default 256)"
    )
    ap.add_argument(
        "--fft-batch",
        default="64x1024",
        help="fft case: the batched 2-D transform BxM (B x M x M complex128; 0 skips it)",
    )
    ap.add_argument(
        "--fft-backends",
        default="auto",
        help="fft case: pyshard.fft backends to run (comma list of scipy, numpy, pyfftw, "
        "pyfftw-measure; auto: every one installed but numpy)",
    )
    ap.add_argument(
        "--fft-pfft",
        default="fftw,numpy",
        help="fft case: mpi4py-fft PFFT backends run beside it ('' none; skipped where "
        "mpi4py_fft does not import)",
    )
    ap.add_argument("--fft-decomps", default="slab,pencil", help="fft case: slab,pencil")
    ap.add_argument("--fft-kinds", default="c2c,r2c", help="fft case: c2c,r2c")
    ap.add_argument(
        "--halo-scale", type=int, default=1, help="halo case: divide the grid extents by this"
    )
    ap.add_argument(
        "--halo-shape", default=None, help="halo case: one grid AxB[xC] (width 1) instead"
    )
    ap.add_argument("--halo-loop", type=int, default=20, help="halo case: updates per rep")
    ap.add_argument(
        "--stencil-n", type=int, default=2048, help="stencil case: an n^dim grid (default 2048)"
    )
    ap.add_argument("--stencil-dim", type=int, default=2, choices=(2, 3))
    ap.add_argument(
        "--stencil-shape", default=None, help="stencil case: the grid AxB[xC] (not --stencil-n)"
    )
    ap.add_argument("--stencil-steps", type=int, default=20)
    ap.add_argument("--many-count", type=int, default=200, help="many case: how many arrays")
    ap.add_argument("--migrate-rows", type=int, default=1_000_000,
                    help="migrate case: rows a rank (64 B each; default 10^6)")
    ap.add_argument("--unstructured-rows", type=int, default=1_000_000,
                    help="unstructured case: rows owned a rank (64 B each; default 10^6)")
    ap.add_argument("--many-scale", type=int, default=1, help="many case: divide the shapes")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument(
        "--algorithm", default="auto", help="auto, alltoallv, alltoall, p2p, or a comma list"
    )
    ap.add_argument("--json", default=None, help="append one JSON object per case to FILE")
    ap.add_argument("--checkpoint-bytes", type=int, default=1 << 30)
    ap.add_argument(
        "--formats",
        default=None,
        help="checkpoint case: instead of the .npy save/load next to numpy, compare these "
        "formats (comma list of npy,hdf5,zarr,safetensors, or 'all') through pyshard and "
        "the tools (gather to rank 0 + h5py/zarr/safetensors, zarr-python and tensorstore "
        "per rank, torch DCP, h5py mpio), Shard(1), no fsync",
    )
    ap.add_argument("--checkpoint-reps", type=int, default=1, help="checkpoint --formats reps")
    ap.add_argument(
        "--memory-shapes",
        type=int,
        default=400,
        help="distinct shapes of the memory case (default 400)",
    )
    ap.add_argument(
        "--device",
        choices=("host", "cuda"),
        default="host",
        help="host: numpy arrays (default); cuda: cupy arrays, the cases transpose and gather "
        "next to cupy + mpi4py by hand, and the pack kernel's bandwidth",
    )
    return ap


def _run_extra(name: str, comm: MPI.Comm, args: argparse.Namespace) -> Dict:
    """Run an extra case (checkpoint, memory, sparse, fft3d, halo, stencil); rank 0 prints
    its row."""
    if name == "checkpoint" and args.formats:
        fmts = None if args.formats == "all" else [f for f in args.formats.split(",") if f]
        rows = bench_formats(
            Mesh(comm, (comm.Get_size(),)), nbytes=args.checkpoint_bytes, formats=fmts,
            reps=args.checkpoint_reps,
            progress=lambda row: comm.Get_rank() == 0 and print(
                f"[bench] {row['method']} ({row['wall_s']:.1f} s)", file=sys.stderr, flush=True),
        )
        if comm.Get_rank() == 0:
            b = rows[0]["bytes"] if rows else 0
            print(f"checkpoint formats: {b} bytes float32 Shard(1), {comm.Get_size()} ranks")
            print(format_formats(rows), flush=True)
            for row in rows:
                print(json.dumps(row), flush=True)
        return {"case": "checkpoint", "formats": rows,
                "check": all(r.get("ok", True) for r in rows)}
    if name == "checkpoint":
        r = bench_checkpoint(Mesh(comm, (comm.Get_size(),)), nbytes=args.checkpoint_bytes, reps=1)
    elif name == "sparse":
        r = bench_sparse_setup()
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
        r = bench_fft(comm, n=args.fft_n, reps=args.reps, warmup=args.warmup, batch=int(b),
                      batch_n=int(m or 1024), backends=be,
                      pfft_backends=[v for v in args.fft_pfft.split(",") if v],
                      decomps=tuple(args.fft_decomps.split(",")),
                      kinds=tuple(args.fft_kinds.split(",")),
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
        n = args.fft_n
        r = bench_fft3d(comm, n=n, reps=args.reps, warmup=args.warmup)
        if comm.Get_rank() == 0:
            print(format_fft3d(r), flush=True)
    else:
        if comm.Get_rank() == 0:
            print(f"[bench] memory {args.memory_shapes} shapes ...", file=sys.stderr, flush=True)
        r = bench_memory(comm, shapes=args.memory_shapes)
        if comm.Get_rank() == 0:
            print(format_memory(r), flush=True)
    if comm.Get_rank() == 0:
        print(json.dumps(r), flush=True)
    return r


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m pyshard bench``: run the cases, print a table, append JSON lines."""
    args = _parser().parse_args(argv)
    if args.device == "cuda":
        return main_cuda(args)
    comm = MPI.COMM_WORLD
    rank, p = comm.Get_rank(), comm.Get_size()
    shape = tuple(int(s) for s in args.shape.lower().split("x"))
    dtype = np.dtype(args.dtype)
    names = [n for n in args.cases.split(",") if n]
    algos = [a for a in args.algorithm.split(",") if a]
    rows: List[Dict] = []
    if rank == 0:
        print(
            f"pyshard bench: {p} ranks, {args.shape} {dtype}, reps {args.reps}, "
            f"warmup {args.warmup}; {library_line()}",
            flush=True,
        )
    for name in names:
        if name in EXTRA_CASES:
            rows.append(_run_extra(name, comm, args))
            continue
        for case in make_cases([name], shape, p):
            for algo in algos:
                if rank == 0:
                    print(f"[bench] {case.name} {algo} ...", file=sys.stderr, flush=True)
                rows.append(run_case(case, comm, dtype, args.reps, args.warmup, algo))
    if rank == 0:
        if any(r["case"] not in EXTRA_CASES for r in rows):
            print(format_table(rows))
        if args.json:
            append_json(args.json, rows)
    return 0 if all(r.get("check", True) for r in rows) else 1
