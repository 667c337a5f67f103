"""Benchmarks: each case timed next to its communication floor and a hand-written baseline.

For every case, in the same run and on the same communicator:

- pyshard: ``x.redistribute(target, algorithm=...)`` with a cached plan;
- floor: the same exchange as one raw MPI collective (mpi4py) on pre-packed contiguous
  buffers of exactly the same per-peer byte counts (self block included, as MPI does it);
- baseline: what an expert writes by hand with mpi4py: numpy slicing to pack (skipped
  where every block is already contiguous), the raw collective, numpy slicing to unpack
  (skipped where the receive can land in the output directly).

Times are the median and minimum over ``reps`` of the slowest rank (a barrier before each
rep, the maximum over ranks after).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from dataclasses import dataclass
from math import prod
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
from mpi4py import MPI

from .array import ShardedArray, from_local
from .layout import Layout, Partial, Replicate, Shard
from .mesh import Mesh
from .plan import Plan, Step, _contiguous

log = logging.getLogger("pyshard")

CASES = (
    "transpose",
    "transpose_uneven",
    "gather",
    "reduce_scatter",
    "swap2d",
    "rebalance",
    "small",
)


def _mesh2d(p: int) -> Tuple[int, int]:
    a = int(np.sqrt(p))
    while p % a:
        a -= 1
    return (a, p // a)


@dataclass
class Case:
    name: str
    mesh_shape: Tuple[int, ...]
    shape: Tuple[int, ...]
    src: list
    dst: list
    src_sizes: Optional[dict] = None


def make_cases(names: Sequence[str], shape: Tuple[int, ...], p: int) -> List[Case]:
    out = []
    for n in names:
        if n == "transpose":
            out.append(Case(n, (p,), shape, [Shard(0)], [Shard(1)]))
        elif n == "transpose_uneven":
            un = (shape[0] + 3, shape[1] + 1) + tuple(shape[2:])
            out.append(Case(n, (p,), un, [Shard(0)], [Shard(1)]))
        elif n == "gather":
            out.append(Case(n, (p,), shape, [Shard(0)], [Replicate()]))
        elif n == "reduce_scatter":
            out.append(Case(n, (p,), shape, [Partial("sum")], [Shard(0)]))
        elif n == "swap2d":
            out.append(Case(n, _mesh2d(p), shape, [Shard(0), Shard(1)], [Shard(1), Shard(0)]))
        elif n == "rebalance":
            # very uneven: rank 0 holds 7/8 of the rows, the rest share 1/8
            rest = shape[0] // 8 if p > 1 else 0
            tail = [rest // (p - 1) + (i < rest % (p - 1)) for i in range(p - 1)] if p > 1 else []
            sizes = [shape[0] - sum(tail)] + tail
            out.append(Case(n, (p,), shape, [Shard(0)], [Shard(0)], {0: sizes}))
        elif n == "small":
            out.append(Case(n, (p,), (64, 64), [Shard(0)], [Shard(1)]))
        else:
            raise ValueError(f"unknown bench case {n!r}; cases are {CASES + ('checkpoint',)}")
    return out


def _timed(fn: Callable[[], object], comm: MPI.Comm, reps: int, warmup: int) -> List[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(reps):
        comm.Barrier()
        t0 = time.perf_counter()
        fn()
        out.append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
    return out


# ----------------------------------------------------------------------------- floor/baseline


def _exchange_blocks(step: Step, coords: tuple) -> Tuple[list, list]:
    """This rank's (peer group rank, local slices) send and receive blocks, self included."""
    src_lo = [step.src.interval(d, coords)[0] for d in range(step.src.ndim)]
    dst_lo = [step.dst.interval(d, coords)[0] for d in range(step.dst.ndim)]
    sends = sorted(
        (step.group_rank(r), tuple(slice(a - o, b - o) for (a, b), o in zip(box, src_lo)))
        for r, box in step.sends(coords)
    )
    recvs = sorted(
        (step.group_rank(r), tuple(slice(a - o, b - o) for (a, b), o in zip(box, dst_lo)))
        for r, box in step.recvs(coords)
    )
    return sends, recvs


def _member_box(step: Step, coords: tuple, g: int, of: Layout, rel: Layout) -> tuple:
    """Member ``g``'s box in layout ``of``, as slices relative to this rank's box in ``rel``."""
    m = step.member(coords, g)
    return tuple(
        slice(of.interval(d, m)[0] - rel.interval(d, coords)[0],
              of.interval(d, m)[1] - rel.interval(d, coords)[0])
        for d in range(of.ndim)
    )  # fmt: skip


def _aligned_displs(counts: Sequence[int], align: int = 64) -> List[int]:
    out, off = [], 0
    for c in counts:
        out.append(off)
        off = (off + c + align - 1) // align * align
    return out


def _contig(shape: Sequence[int], sl: Tuple[slice, ...]) -> bool:
    return _contiguous(shape, [s.start for s in sl], [s.stop - s.start for s in sl])


def _offset(shape: Sequence[int], sl: Tuple[slice, ...]) -> int:
    off, stride = 0, 1
    for s, n in zip(reversed(sl), reversed(shape)):
        off += s.start * stride
        stride *= n
    return off


class _Reference:
    """Floor and baseline for one plan step, bound to this rank's buffers."""

    def __init__(self, step: Step, mesh: Mesh, local: np.ndarray) -> None:
        self.step = step
        self.comm = mesh.sub_dims(step.mesh_dims) if step.mesh_dims else mesh.comm
        coords = mesh.coords
        self.local = local
        self.out_shape = step.dst.local_shape(coords)
        self.dtype = local.dtype
        self.out = np.empty(self.out_shape, self.dtype)  # preallocated, as for pyshard
        item = local.dtype.itemsize
        n = self.comm.Get_size()
        k = step.kind
        self.kind = k
        if k == "alltoallv":
            self.sends, self.recvs = _exchange_blocks(step, coords)
            sc, rc = [0] * n, [0] * n
            for g, sl in self.sends:
                sc[g] = prod(s.stop - s.start for s in sl) * item
            for g, sl in self.recvs:
                rc[g] = prod(s.stop - s.start for s in sl) * item
            self.sc, self.rc = sc, rc
            # pre-packed blocks start 64-byte aligned (MPICH is slower on misaligned ones)
            self.sd = _aligned_displs(sc)
            self.rd = _aligned_displs(rc)
            self.sbuf = np.zeros(self.sd[-1] + sc[-1], np.uint8)
            self.rbuf = np.zeros(self.rd[-1] + rc[-1], np.uint8)
            self.send_direct = all(_contig(local.shape, sl) for _, sl in self.sends)
            self.recv_direct = all(_contig(self.out_shape, sl) for _, sl in self.recvs)
        elif k == "allgatherv":
            self.counts = [
                prod(step.src.local_shape(step.member(coords, g))) * item for g in range(n)
            ]
            self.displs = list(np.concatenate(([0], np.cumsum(self.counts)[:-1])).astype(int))
            self.sbuf = np.zeros(self.counts[self.comm.Get_rank()], np.uint8)
            self.rbuf = np.zeros(sum(self.counts), np.uint8)
            # member g's source box, relative to this rank's target box
            self.blocks = [_member_box(step, coords, g, step.src, step.dst) for g in range(n)]
        elif k == "reduce_scatter":
            # member g's target box, relative to this rank's source box
            self.pieces = [_member_box(step, coords, g, step.dst, step.src) for g in range(n)]
            self.counts = [prod(s.stop - s.start for s in sl) for sl in self.pieces]
            self.sbuf = np.zeros(sum(self.counts), local.dtype)
            self.rbuf = np.zeros(self.counts[self.comm.Get_rank()], local.dtype)
        elif k in ("local_copy", "make_partial", "relabel"):
            # no communication (one rank): the floor is a memcpy of the output's bytes
            self.sbuf = np.zeros(prod(self.out_shape) * item, np.uint8)
            self.rbuf = np.zeros_like(self.sbuf)
            src_lo = [step.src.interval(d, coords)[0] for d in range(step.src.ndim)]
            self.sl = tuple(
                slice(a - o, b - o)
                for (a, b), o in zip(
                    (step.dst.interval(d, coords) for d in range(step.dst.ndim)), src_lo
                )
            )
        else:
            raise ValueError(f"no reference for a {k} step")

    def floor(self) -> None:
        c = self.comm
        if self.kind in ("local_copy", "make_partial", "relabel"):
            np.copyto(self.rbuf, self.sbuf)
        elif self.kind == "alltoallv":
            c.Alltoallv(
                [self.sbuf, (self.sc, self.sd), MPI.BYTE], [self.rbuf, (self.rc, self.rd), MPI.BYTE]
            )
        elif self.kind == "allgatherv":
            c.Allgatherv([self.sbuf, MPI.BYTE], [self.rbuf, (self.counts, self.displs), MPI.BYTE])
        else:
            c.Reduce_scatter(self.sbuf, self.rbuf, self.counts, op=MPI.SUM)

    def baseline(self) -> np.ndarray:
        c, local = self.comm, self.local
        out = self.out
        if self.kind in ("local_copy", "make_partial", "relabel"):
            out[...] = local[self.sl]
        elif self.kind == "alltoallv":
            item = self.dtype.itemsize
            if self.send_direct:
                sbuf = local.reshape(-1).view(np.uint8)
                sd = [_offset(local.shape, sl) * item for _, sl in self.sends]
                scount, sdisp = [0] * c.Get_size(), [0] * c.Get_size()
                for (g, _), d in zip(self.sends, sd):
                    scount[g], sdisp[g] = self.sc[g], d
            else:
                sbuf = self.sbuf
                for g, sl in self.sends:
                    a = self.sd[g]
                    sbuf[a : a + self.sc[g]] = local[sl].reshape(-1).view(np.uint8)
                scount, sdisp = self.sc, self.sd
            if self.recv_direct:
                rbuf = out.reshape(-1).view(np.uint8)
                rcount, rdisp = [0] * c.Get_size(), [0] * c.Get_size()
                for g, sl in self.recvs:
                    rcount[g], rdisp[g] = self.rc[g], _offset(self.out_shape, sl) * item
            else:
                rbuf, rcount, rdisp = self.rbuf, self.rc, self.rd
            c.Alltoallv([sbuf, (scount, sdisp), MPI.BYTE], [rbuf, (rcount, rdisp), MPI.BYTE])
            if not self.recv_direct:
                flat = rbuf.view(self.dtype)
                for g, sl in self.recvs:
                    a = self.rd[g] // item
                    shp = tuple(s.stop - s.start for s in sl)
                    out[sl] = flat[a : a + prod(shp)].reshape(shp)
        elif self.kind == "allgatherv":
            c.Allgatherv(
                [local.reshape(-1).view(np.uint8), MPI.BYTE],
                [self.rbuf, (self.counts, self.displs), MPI.BYTE],
            )
            flat = self.rbuf.view(self.dtype)
            item = self.dtype.itemsize
            for sl, d in zip(self.blocks, self.displs):
                shp = tuple(s.stop - s.start for s in sl)
                out[sl] = flat[d // item : d // item + prod(shp)].reshape(shp)
        else:
            sbuf = np.concatenate([local[sl].reshape(-1) for sl in self.pieces])
            c.Reduce_scatter(sbuf, out.reshape(-1), self.counts, op=MPI.SUM)
        return out


# ----------------------------------------------------------------------------- running


def _source(case: Case, mesh: Mesh, dtype: np.dtype) -> ShardedArray:
    layout = Layout(case.shape, dtype, mesh.shape, case.src, case.src_sizes)
    shp = layout.local_shape(mesh.coords)
    rng = np.random.default_rng(1234 + mesh.rank)
    if dtype.kind == "f":
        local = rng.random(shp, dtype=np.float64).astype(dtype) if shp else np.zeros(shp, dtype)
    else:
        local = rng.integers(0, 100, size=shp).astype(dtype)
    return from_local(local, mesh, case.src, global_shape=case.shape, sizes=case.src_sizes)


def _peak_extra(p: Plan, mesh: Mesh, algorithm: str) -> int:
    """Bytes allocated beyond the input and the final output: pack/unpack workspace of
    the core objects, plus intermediate results of multi-step plans."""
    execs = mesh._exec_cache.get((p, algorithm), [])
    peak, held = 0, 0
    for i, e in enumerate(execs):
        last = i == len(execs) - 1
        out = 0 if last or e.step.kind == "relabel" else prod(e.out_shape) * p.src.dtype.itemsize
        ws = getattr(e.core, "workspace_bytes", 0) if e.core is not None else 0
        ws = ws if isinstance(ws, int) else 0
        peak = max(peak, held + out + ws)
        held = out
    return peak


def run_case(
    case: Case, comm: MPI.Comm, dtype: np.dtype, reps: int, warmup: int, algorithm: str
) -> Dict:
    """Time one case (pyshard, floor, baseline) and check pyshard against the baseline."""
    mesh = Mesh(comm, case.mesh_shape)
    x = _source(case, mesh, dtype)
    p = x.plan_to(case.dst)
    y = x.redistribute(case.dst, algorithm=algorithm)  # builds plan and core objects
    coll = [s for s in p.steps if s.is_collective] or [s for s in p.steps if s.kind != "relabel"]
    if not coll:  # nothing to do (one rank, same layout): compare with a plain copy
        coll = [Step("local_copy", (), p.src, p.dst)]
    if len(coll) != 1:
        raise ValueError(f"bench case {case.name}: expected a one-step plan, plan is {p}")
    ref = _Reference(coll[0], mesh, x.local)
    base_out = ref.baseline()
    ok = bool(np.array_equal(base_out, y.local))
    y2 = x.redistribute(case.dst, algorithm=algorithm, out=np.empty_like(y.local))
    ok = ok and bool(np.array_equal(y2.local, y.local))
    ok = comm.allreduce(ok, op=MPI.LAND)
    del y, y2, base_out
    out = np.empty(p.dst.local_shape(mesh.coords), dtype)
    t_ps = _timed(
        lambda: x.redistribute(case.dst, algorithm=algorithm, out=out), comm, reps, warmup
    )
    t_floor = _timed(ref.floor, comm, reps, warmup)
    t_base = _timed(ref.baseline, comm, reps, warmup)
    sent = max((b[0] for b in p.rank_bytes(mesh.coords)), default=0)
    sent = comm.allreduce(sent, op=MPI.MAX)
    peak = comm.allreduce(_peak_extra(p, mesh, algorithm), op=MPI.MAX)
    local_bytes = comm.allreduce(x.local.nbytes, op=MPI.MAX)
    med, flo, base = float(np.median(t_ps)), float(np.median(t_floor)), float(np.median(t_base))
    return {
        "case": case.name,
        "shape": list(case.shape),
        "dtype": str(dtype),
        "ranks": comm.Get_size(),
        "mesh": list(case.mesh_shape),
        "placements": [str(q) for q in case.src] + ["->"] + [str(q) for q in case.dst],
        "algorithm": algorithm,
        "collective": coll[0].kind,
        "median_s": med,
        "min_s": float(np.min(t_ps)),
        "floor_median_s": flo,
        "ratio_to_floor": med / flo if flo > 0 else float("nan"),
        "baseline_median_s": base,
        "ratio_to_baseline": med / base if base > 0 else float("nan"),
        "bytes_per_rank": int(sent),
        "gbps": sent / med / 1e9 if med > 0 else 0.0,
        "peak_extra_bytes": int(peak),
        "local_bytes": int(local_bytes),
        "check": ok,
        "reps": reps,
        "mpi": MPI.Get_library_version().splitlines()[0].strip(),
    }


def _fmt_table(rows: List[Dict]) -> str:
    head = (
        f"{'case':<18}{'algorithm':<11}{'shape':<12}{'median ms':>10}{'floor ms':>10}"
        f"{'x floor':>8}{'base ms':>9}{'x base':>8}{'MB/rank':>9}{'GB/s':>7}{'extra/loc':>10}"
        f"  check"
    )
    lines = [head]
    for r in rows:
        if r["case"] == "checkpoint":
            continue
        shape = "x".join(map(str, r["shape"]))
        lines.append(
            f"{r['case']:<18}{r['algorithm']:<11}{shape:<12}{r['median_s'] * 1e3:>10.3f}"
            f"{r['floor_median_s'] * 1e3:>10.3f}{r['ratio_to_floor']:>8.2f}"
            f"{r['baseline_median_s'] * 1e3:>9.3f}{r['ratio_to_baseline']:>8.2f}"
            f"{r['bytes_per_rank'] / 1e6:>9.2f}{r['gbps']:>7.2f}"
            f"{r['peak_extra_bytes'] / max(r['local_bytes'], 1):>10.2f}  "
            f"{'ok' if r['check'] else 'WRONG'}"
        )
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m pyshard bench``: run the cases, print a table, append JSON lines."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m pyshard bench")
    ap.add_argument("--cases", "--case", default=",".join(CASES), help=f"comma list of {CASES}")
    ap.add_argument("--shape", default="8192x8192")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument(
        "--algorithm", default="auto", help="auto, alltoallv, alltoall, p2p, or a comma list"
    )
    ap.add_argument("--json", default=None, help="append one JSON object per case to FILE")
    ap.add_argument("--checkpoint-bytes", type=int, default=1 << 30)
    args = ap.parse_args(argv)
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
            f"warmup {args.warmup}; {MPI.Get_library_version().splitlines()[0].strip()}",
            flush=True,
        )
    for name in names:
        if name == "checkpoint":
            from .checkpoint import bench_checkpoint

            mesh = Mesh(comm, (p,))
            r = bench_checkpoint(mesh, nbytes=args.checkpoint_bytes, reps=1)
            rows.append(r)
            if rank == 0:
                print(json.dumps(r), flush=True)
            continue
        for case in make_cases([name], shape, p):
            for algo in algos:
                if rank == 0:
                    print(f"[bench] {case.name} {algo} ...", file=sys.stderr, flush=True)
                rows.append(run_case(case, comm, dtype, args.reps, args.warmup, algo))
    if rank == 0:
        if any(r["case"] != "checkpoint" for r in rows):
            print(_fmt_table(rows))
        if args.json:
            with open(args.json, "a") as f:
                for r in rows:
                    f.write(json.dumps(r) + "\n")
    return 0 if all(r.get("check", True) for r in rows) else 1


def plot_main(argv: Optional[List[str]] = None) -> int:
    """``python -m pyshard plot FILE... -o out.png``: ratios and bandwidth per case, and
    scaling curves when the files hold several rank counts."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m pyshard plot")
    ap.add_argument("files", nargs="+")
    ap.add_argument("-o", "--output", default="bench.png")
    args = ap.parse_args(argv)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("python -m pyshard plot needs matplotlib: pip install matplotlib", file=sys.stderr)
        return 2
    rows = []
    for fn in args.files:
        with open(fn) as f:
            rows += [json.loads(line) for line in f if line.strip()]
    rows = [r for r in rows if "ratio_to_floor" in r]
    if not rows:
        print("no benchmark rows in the given files", file=sys.stderr)
        return 1
    ranks = sorted({r["ranks"] for r in rows})
    keys = sorted({(r["case"], r["algorithm"]) for r in rows})
    ncols = 3 if len(ranks) > 1 else 2
    width = max(6.0, 0.32 * len(keys) + 2)
    fig, axes = plt.subplots(1, ncols, figsize=(width * ncols, 5.5))
    top = max(ranks)
    sel = [
        next(r for r in reversed(rows) if (r["case"], r["algorithm"]) == k and r["ranks"] == top)
        for k in keys
        if any((r["case"], r["algorithm"]) == k and r["ranks"] == top for r in rows)
    ]
    labels = [f"{r['case']} {r['algorithm']}" for r in sel]
    xs = np.arange(len(sel))
    axes[0].bar(xs - 0.2, [r["ratio_to_floor"] for r in sel], 0.4, label="/ floor (raw MPI)")
    axes[0].bar(xs + 0.2, [r["ratio_to_baseline"] for r in sel], 0.4, label="/ mpi4py baseline")
    axes[0].axhline(1.0, color="k", lw=0.8)
    axes[0].set_xticks(xs, labels, fontsize=7, rotation=90)
    axes[0].set_ylabel("time ratio (lower is better)")
    axes[0].set_title(f"pyshard time / reference, {top} ranks")
    axes[0].legend()
    axes[1].bar(xs, [r["gbps"] for r in sel])
    axes[1].set_xticks(xs, labels, fontsize=7, rotation=90)
    axes[1].set_ylabel("GB/s sent per rank")
    axes[1].set_title("bandwidth")
    if ncols == 3:
        for k in keys:
            best: Dict[int, float] = {}  # several files may hold one rank count: keep the best
            for r in rows:
                if (r["case"], r["algorithm"]) == k:
                    best[r["ranks"]] = min(best.get(r["ranks"], np.inf), r["median_s"])
            pts = sorted(best.items())
            if len(pts) > 1:
                axes[2].plot([a for a, _ in pts], [b for _, b in pts], "o-", label=f"{k[0]} {k[1]}")
        axes[2].set_xscale("log", base=2)
        axes[2].set_yscale("log")
        axes[2].set_xlabel("ranks")
        axes[2].set_ylabel("median time (s)")
        axes[2].set_title("scaling")
        axes[2].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.output, dpi=110)
    print(f"wrote {args.output} ({len(rows)} rows, ranks {ranks})")
    return 0
