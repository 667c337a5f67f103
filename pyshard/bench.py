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

More cases, each a JSON row of its own fields, run only when named in ``--cases``:

- ``checkpoint``: :func:`bench_checkpoint`, save and load GB/s of a float32 array of
  ``--checkpoint-bytes`` next to numpy.save/load on rank 0.
- ``memory``: :func:`bench_memory`, a loop of ``Shard(0) -> Shard(1)`` redistributes over
  ``--memory-shapes`` distinct shapes (default 400; a ``(1000 + 7 i) x 2048`` float32 shard
  per rank, results dropped), and the peak RSS after 40 shapes and after all, maximum over
  ranks. ``check`` holds when it grew by at most 64 MiB: the caches stay bounded. It takes
  a few hundred MiB per rank and tens of seconds, hence not in the default list.
- ``sparse``: :func:`bench_sparse_setup`, one rank's setup of the 2-D swap simulated on
  meshes of 256, 4096 and 65,536 ranks (no MPI): it grows with the peers, not the ranks.
- ``fft3d``: a distributed 3-D FFT on a 2-D mesh (``--fft-n``, default 256^3 complex128;
  :mod:`pyshard._fft3d`, ``examples/fft3d.py``), total and transposes alone, next to
  mpi4py-fft's PFFT with the numpy backend when it is installed (``pip install .[fft]``,
  which needs FFTW: ``apt-get install libfftw3-dev``).

``--device cuda`` (:func:`pyshard._bench_gpu.main_cuda`) runs ``transpose`` and ``gather``
on cupy arrays instead, each next to the same exchange written by hand with cupy and mpi4py
(a device pack, the raw collective on device memory with a CUDA-aware MPI, else staged
through pinned host buffers), plus the CUDA pack kernel's bandwidth as a fraction of a
device-to-device copy.
"""

from __future__ import annotations

import argparse
import json
import logging
import numbers
import os
import resource
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from math import prod
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
from mpi4py import MPI

from ._timing import _median_s, _timed
from .array import ShardedArray, executors, from_local
from .checkpoint import load, save
from .checkpoint.errors import PathArg, error, norm_path, on_root
from .checkpoint.mpiio import box_bounds
from .layout import Layout, Partial, Replicate, Shard
from .mesh import Mesh
from .plan import Plan, Step, exchange_specs, geometry
from .plan import plan as make_plan

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
# run only when named: see the module docstring
EXTRA_CASES = ("checkpoint", "memory", "sparse", "fft3d")
MEMORY_FIRST = 40  # the memory case compares the peak RSS after this many shapes ...
MEMORY_LIMIT_MIB = 64  # ... with the peak after all of them: at most this much growth


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
            raise ValueError(f"unknown bench case {n!r}; cases are {CASES + EXTRA_CASES}")
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


def _contiguous(shape: Sequence[int], start: Sequence[int], ext: Sequence[int]) -> bool:
    """Is the box one contiguous run of a C-contiguous array of ``shape``? (as the core)"""
    if prod(ext) == 0:
        return True
    k = 0
    while k < len(ext) and ext[k] == 1:
        k += 1
    return all(ext[j] == shape[j] for j in range(k + 1, len(ext)))


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
        self.floors = self._floors()

    def _floors(self) -> Dict[str, Any]:
        """Raw collectives that move the step's bytes from pre-packed buffers, by MPI name:
        the v-variant with the step's own counts, and the regular collective on blocks
        padded to the largest (the same bytes where the blocks are equal)."""
        c, n = self.comm, self.comm.Get_size()
        if self.kind in ("local_copy", "make_partial", "relabel"):
            return {"memcpy": lambda: np.copyto(self.rbuf, self.sbuf)}
        if self.kind == "alltoallv":
            pad = c.allreduce(max(self.sc + self.rc), op=MPI.MAX)
            sb, rb = np.zeros(n * pad, np.uint8), np.zeros(n * pad, np.uint8)
            return {
                "Alltoallv": lambda: c.Alltoallv(
                    [self.sbuf, (self.sc, self.sd), MPI.BYTE],
                    [self.rbuf, (self.rc, self.rd), MPI.BYTE],
                ),
                "Alltoall": lambda: c.Alltoall([sb, MPI.BYTE], [rb, MPI.BYTE]),
            }
        if self.kind == "allgatherv":
            pad = c.allreduce(max(self.counts), op=MPI.MAX)
            sb, rb = np.zeros(pad, np.uint8), np.zeros(n * pad, np.uint8)
            return {
                "Allgatherv": lambda: c.Allgatherv(
                    [self.sbuf, MPI.BYTE], [self.rbuf, (self.counts, self.displs), MPI.BYTE]
                ),
                "Allgather": lambda: c.Allgather([sb, MPI.BYTE], [rb, MPI.BYTE]),
            }
        pad = c.allreduce(max(self.counts), op=MPI.MAX)
        sb, rb = np.zeros(n * pad, self.dtype), np.zeros(pad, self.dtype)
        return {
            "Reduce_scatter": lambda: c.Reduce_scatter(
                self.sbuf, self.rbuf, self.counts, op=MPI.SUM
            ),
            "Reduce_scatter_block": lambda: c.Reduce_scatter_block(sb, rb, op=MPI.SUM),
        }

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
    execs = executors(p, mesh, algorithm)
    peak, held = 0, 0
    for i, e in enumerate(execs):
        last = i == len(execs) - 1
        out = 0 if last or e.step.kind == "relabel" else prod(e.out_shape) * p.src.dtype.itemsize
        ws = getattr(e.core, "workspace_bytes", 0) if e.core is not None else 0
        ws = ws if isinstance(ws, int) else 0
        peak = max(peak, held + out + ws)
        held = out
    return peak


# the raw collective each pyshard collective corresponds to (the "same-collective" floor)
_SAME_FLOOR = {
    "alltoallv": "Alltoallv", "p2p": "Alltoallv", "alltoallw": "Alltoallv",
    "alltoall": "Alltoall", "allgatherv": "Allgatherv", "allgather": "Allgather",
    "reduce_scatter": "Reduce_scatter", "reduce_scatter_block": "Reduce_scatter_block",
}  # fmt: skip


def _called(x: ShardedArray, case: Case, algorithm: str) -> str:
    """The collective one pyshard call of this case makes (by comm_stats)."""
    before = _backend_stats()
    x.redistribute(case.dst, algorithm=algorithm)
    after = _backend_stats()
    got = [k for k in after if after[k] != before.get(k, 0) and k in _SAME_FLOOR]
    return got[0] if got else ""


def _backend_stats() -> Dict[str, int]:
    from . import _core

    return dict(_core.stats())


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
    t_plain = _timed(lambda: x.redistribute(case.dst, algorithm=algorithm), comm, reps, warmup)
    floors = {k: float(np.median(_timed(f, comm, reps, warmup))) for k, f in ref.floors.items()}
    fastest = min(floors, key=floors.get)
    same = _SAME_FLOOR.get(_called(x, case, algorithm), fastest)
    t_base = _timed(ref.baseline, comm, reps, warmup)
    sent = max((b[0] for b in p.rank_bytes(mesh.coords)), default=0)
    sent = comm.allreduce(sent, op=MPI.MAX)
    peak = comm.allreduce(_peak_extra(p, mesh, algorithm), op=MPI.MAX)
    local_bytes = comm.allreduce(x.local.nbytes, op=MPI.MAX)
    med, base = float(np.median(t_ps)), float(np.median(t_base))
    flo, same_flo = floors[fastest], floors.get(same, floors[fastest])
    plain = float(np.median(t_plain))
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
        "floor_collective": fastest,
        "ratio_to_floor": med / flo if flo > 0 else float("nan"),
        "same_floor_collective": same,
        "same_floor_median_s": same_flo,
        "ratio_to_same_floor": med / same_flo if same_flo > 0 else float("nan"),
        "floors_median_s": floors,
        "plain_median_s": plain,
        "plain_ratio_to_floor": plain / flo if flo > 0 else float("nan"),
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
        f"{'case':<18}{'algorithm':<11}{'shape':<12}{'median ms':>10}{'plain ms':>9}"
        f"{'floor ms':>9} {'(fastest raw)':<21}{'x floor':>8}{'x same':>7}{'base ms':>9}"
        f"{'x base':>7}{'MB/rank':>9}{'GB/s':>6}{'extra/loc':>10}  check"
    )
    lines = [head]
    for r in rows:
        if r["case"] in EXTRA_CASES:
            continue
        shape = "x".join(map(str, r["shape"]))
        lines.append(
            f"{r['case']:<18}{r['algorithm']:<11}{shape:<12}{r['median_s'] * 1e3:>10.3f}"
            f"{r['plain_median_s'] * 1e3:>9.3f}"
            f"{r['floor_median_s'] * 1e3:>9.3f} {r['floor_collective']:<21}"
            f"{r['ratio_to_floor']:>8.2f}{r['ratio_to_same_floor']:>7.2f}"
            f"{r['baseline_median_s'] * 1e3:>9.3f}{r['ratio_to_baseline']:>7.2f}"
            f"{r['bytes_per_rank'] / 1e6:>9.2f}{r['gbps']:>6.2f}"
            f"{r['peak_extra_bytes'] / max(r['local_bytes'], 1):>10.2f}  "
            f"{'ok' if r['check'] else 'WRONG'}"
        )
    return "\n".join(lines)


# ----------------------------------------------------------------------------- checkpoint


def _check_bench_args(mesh: object, nbytes: object, reps: object) -> None:
    if not isinstance(mesh, Mesh):
        raise TypeError(f"bench_checkpoint(mesh): expected a pyshard.Mesh, got {mesh!r}")
    if isinstance(nbytes, bool) or not isinstance(nbytes, numbers.Integral) or nbytes < 4:
        raise ValueError(f"bench_checkpoint(nbytes): need an int >= 4, got {nbytes!r}")
    if isinstance(reps, bool) or not isinstance(reps, numbers.Integral) or reps < 1:
        raise ValueError(f"bench_checkpoint(reps): need an int >= 1, got {reps!r}")


def _bench_dir(comm: MPI.Comm, path: Optional[PathArg]) -> str:
    """A new temporary directory (under ``path`` if given, created if missing), made by
    rank 0 and known to every rank (one bcast)."""
    p = None if path is None else norm_path(path, "bench_checkpoint")

    def make() -> str:
        if p is not None:
            os.makedirs(p, exist_ok=True)
        return tempfile.mkdtemp(prefix="pyshard-bench-", dir=p)

    return on_root(
        comm, make, lambda e: error("ValueError", f"bench_checkpoint: cannot use {p!r}: {e}")
    )


def _bench_pattern(start: int, n: int) -> np.ndarray:
    """Elements ``start .. start + n`` of the benchmark array (float32, values below 1009)."""
    return (np.arange(start, start + n, dtype=np.int64) % 1009).astype(np.float32)


def _time_checkpoint(
    x: ShardedArray, ckpt: str, reps: int, sync: bool
) -> Tuple[float, float, bool]:
    """(save seconds, load seconds, loaded == saved on every rank); collective over x's mesh."""
    mesh, comm = x.mesh, x.mesh.comm
    save_s = _median_s(lambda: save(ckpt, {"x": x}, sync=sync), comm, reps)
    got: Dict[str, ShardedArray] = {}

    def do_load() -> None:
        got.update(load(ckpt, mesh, {"x": [Shard(0)] * mesh.ndim}))

    load_s = _median_s(do_load, comm, reps)
    ok = comm.allreduce(bool(np.array_equal(got["x"].local, x.local)), op=MPI.LAND)
    return save_s, load_s, ok


def _time_numpy(comm: MPI.Comm, npy: str, n: int, reps: int, sync: bool) -> Tuple[float, float]:
    """(numpy.save seconds, numpy.load seconds) of the whole array on rank 0 alone, the other
    ranks waiting in the same timing collectives."""
    rank = comm.Get_rank()
    ref = _bench_pattern(0, n) if rank == 0 else np.empty(0, np.float32)

    def np_save() -> None:
        if rank == 0:
            with open(npy, "wb") as f:
                np.save(f, ref)
                if sync:
                    f.flush()
                    os.fsync(f.fileno())

    def np_load() -> None:
        if rank == 0:
            np.load(npy)

    return _median_s(np_save, comm, reps), _median_s(np_load, comm, reps)


def _checkpoint_row(
    b: int, ranks: int, times: Tuple[float, ...], sync: bool, ok: bool
) -> Dict[str, Any]:
    """The JSON row of the checkpoint case; ``times``: save, load, numpy save, numpy load."""
    save_s, load_s, numpy_save_s, numpy_load_s = times
    return {
        "case": "checkpoint",
        "bytes": b,
        "ranks": ranks,
        "save_s": save_s,
        "load_s": load_s,
        "save_GBps": b / save_s / 1e9,
        "load_GBps": b / load_s / 1e9,
        "numpy_save_s": numpy_save_s,
        "numpy_load_s": numpy_load_s,
        "numpy_save_GBps": b / numpy_save_s / 1e9,
        "numpy_load_GBps": b / numpy_load_s / 1e9,
        "sync": bool(sync),
        "verify": True,
        "ok": bool(ok),
    }


def bench_checkpoint(
    mesh: Mesh,
    nbytes: int = 1 << 30,
    path: Optional[PathArg] = None,
    reps: int = 1,
    sync: bool = True,
) -> Dict[str, Any]:
    """Save and load GB/s of a float32 array of ``nbytes``, next to numpy.save/load on rank 0.

    mesh: the ranks; the array is Shard(0) over every mesh dim (nested on an N-D mesh).
    nbytes: the array's size in bytes (rounded down to whole float32 elements).
    path: a directory for the files (created if missing, the files removed afterwards);
    default a new temporary directory. Put it on the file system you want to measure.
    reps: repetitions; times are the median over reps of the slowest rank.
    sync: fsync on save (checkpoint and numpy.save alike), so both pay the disk.

    Collective over ``mesh``. Loads right after a save read from the page cache.
    """
    _check_bench_args(mesh, nbytes, reps)
    comm = mesh.comm
    n = int(nbytes) // 4
    root = _bench_dir(comm, path)
    layout = Layout((n,), np.float32, mesh.shape, [Shard(0)] * mesh.ndim)
    start, ext = box_bounds(layout, mesh.coords)
    x = ShardedArray(_bench_pattern(start[0], ext[0]), layout, mesh)
    try:
        save_s, load_s, ok = _time_checkpoint(x, os.path.join(root, "ckpt"), reps, sync)
        npy = os.path.join(root, "numpy.npy")
        times = (save_s, load_s) + _time_numpy(comm, npy, n, reps, sync)
    finally:
        comm.Barrier()
        if comm.Get_rank() == 0:
            shutil.rmtree(root, ignore_errors=True)
        comm.Barrier()
    return _checkpoint_row(n * 4, comm.Get_size(), times, sync, ok)


# ----------------------------------------------------------------------------- memory


def _peak_rss_mib() -> float:
    """This process's peak resident set size so far, in MiB."""
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kib / 2**20 if sys.platform == "darwin" else kib / 1024  # macOS reports bytes


def bench_memory(comm: MPI.Comm, shapes: int = 400, cols: int = 2048) -> Dict[str, Any]:
    """Peak RSS of a loop of redistributes over ``shapes`` distinct shapes.

    On a 1-D mesh of every rank, shape ``i`` is a ``(1000 + 7 i) x cols`` float32 shard per
    rank, Shard(0) -> Shard(1) once, the result dropped. The peak RSS (maximum over ranks) is
    taken after 40 shapes (or all, if fewer) and after all; ``check`` holds when it grew by
    at most 64 MiB in between, i.e. per-shape caches stay bounded. Collective over ``comm``.
    """
    if isinstance(shapes, bool) or not isinstance(shapes, numbers.Integral) or shapes < 1:
        raise ValueError(f"bench_memory(shapes): need an int >= 1, got {shapes!r}")
    p = comm.Get_size()
    mesh = Mesh(comm, (p,))
    first = min(MEMORY_FIRST, shapes)
    t0 = time.perf_counter()
    peak_first = 0.0
    for i in range(shapes):
        rows = 1000 + 7 * i
        local = np.ones((rows, cols), np.float32)
        x = from_local(local, mesh, [Shard(0)], global_shape=(p * rows, cols))
        x.redistribute([Shard(1)])
        del x, local
        if i + 1 == first:
            peak_first = _peak_rss_mib()
    peak_n = _peak_rss_mib()
    seconds = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
    peak_first = comm.allreduce(peak_first, op=MPI.MAX)
    peak_n = comm.allreduce(peak_n, op=MPI.MAX)
    growth = peak_n - peak_first
    return {
        "case": "memory",
        "ranks": p,
        "shapes": int(shapes),
        "shard": f"(1000+7i)x{cols}",
        "dtype": "float32",
        "peak_rss_mib_40": round(peak_first, 1),
        "peak_rss_mib_n": round(peak_n, 1),
        "growth_mib": round(growth, 1),
        "limit_mib": MEMORY_LIMIT_MIB,
        "seconds": seconds,
        "check": bool(growth <= MEMORY_LIMIT_MIB),
    }


def _fmt_memory(r: Dict[str, Any]) -> str:
    return (
        f"memory: {r['ranks']} ranks, {r['shapes']} shapes, a {r['shard']} {r['dtype']} shard "
        f"per rank, S(0)->S(1): peak RSS {r['peak_rss_mib_40']:.1f} MiB after "
        f"{min(MEMORY_FIRST, r['shapes'])} shapes, {r['peak_rss_mib_n']:.1f} MiB after "
        f"{r['shapes']}, growth {r['growth_mib']:.1f} MiB (limit {r['limit_mib']}) "
        f"in {r['seconds']:.1f} s  {'ok' if r['check'] else 'GROWS'}"
    )


# ----------------------------------------------------------------------------- sparse setup


def bench_sparse_setup(
    sides: Sequence[int] = (16, 64, 256), n: int = 4096, coords_frac: float = 0.5
) -> Dict[str, Any]:
    """Simulate one rank of the 2-D swap ``[S0,S1] -> [S1,S0]`` of an ``n x n`` array on
    ``side x side`` meshes (up to 65,536 ranks), without MPI: the time to plan, find its
    blocks, build the core's point-to-point geometry and explain the step, next to the
    peers it touches. The setup grows with the peers (one), not with the ranks."""
    rows = []
    for side in sides:
        mesh = (side, side)
        src = Layout((n, n), np.float32, mesh, [Shard(0), Shard(1)])
        dst = Layout((n, n), np.float32, mesh, [Shard(1), Shard(0)])
        me = (int(side * coords_frac), int(side * coords_frac * 0.5))
        best = float("inf")
        for _ in range(3):  # the best of 3, each from scratch (no plan cache)
            t0 = time.perf_counter()
            p = make_plan.__wrapped__(src, dst)
            step = p.steps[0]
            peers = step.max_peers()
            g = geometry(step, me, _core_algorithm("p2p"))
            sends, recvs, _ = exchange_specs(step, me)
            best = min(best, time.perf_counter() - t0)
        rows.append(
            {
                "ranks": side * side,
                "mesh": list(mesh),
                "max_peers": peers,
                "sends": len(sends),
                "recvs": len(recvs),
                "descriptors": int(g.descriptors),
                "setup_ms": 1e3 * best,
                "auto": "p2p" if 4 * peers <= side * side else "alltoallv",
            }
        )
    return {"case": "sparse", "array": [n, n], "rows": rows}


def _core_algorithm(name: str) -> Any:
    from . import _core

    return getattr(_core.Algorithm, name)


def _fmt_sparse(r: Dict[str, Any]) -> str:
    lines = [f"sparse: one rank of the 2-D swap [S0,S1] -> [S1,S0] of {r['array']}, no MPI"]
    for row in r["rows"]:
        lines.append(
            f"  {row['ranks']:>6} ranks: {row['max_peers']} peer(s) at most, this rank sends "
            f"{row['sends']} and receives {row['recvs']} block(s), {row['descriptors']} "
            f"descriptor(s), setup {row['setup_ms']:.2f} ms, auto -> {row['auto']}"
        )
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m pyshard bench",
        epilog="Cases run only when named: checkpoint (save/load GB/s, --checkpoint-bytes) and "
        "memory (peak RSS over --memory-shapes distinct shapes; check: growth after 40 shapes "
        f"<= {MEMORY_LIMIT_MIB} MiB). See the module docstring of pyshard.bench.",
    )
    ap.add_argument(
        "--cases", "--case", default=",".join(CASES), help=f"comma list of {CASES + EXTRA_CASES}"
    )
    ap.add_argument("--shape", default="8192x8192")
    ap.add_argument(
        "--fft-n", type=int, default=256, help="fft3d case: an n^3 complex128 array (default 256)"
    )
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument(
        "--algorithm", default="auto", help="auto, alltoallv, alltoall, p2p, or a comma list"
    )
    ap.add_argument("--json", default=None, help="append one JSON object per case to FILE")
    ap.add_argument("--checkpoint-bytes", type=int, default=1 << 30)
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
    """Run the checkpoint, memory or sparse case; rank 0 prints its row."""
    if name == "checkpoint":
        r = bench_checkpoint(Mesh(comm, (comm.Get_size(),)), nbytes=args.checkpoint_bytes, reps=1)
    elif name == "sparse":
        r = bench_sparse_setup()
        if comm.Get_rank() == 0:
            print(_fmt_sparse(r), flush=True)
    elif name == "fft3d":
        from ._fft3d import bench_fft3d, format_fft3d

        n = args.fft_n
        r = bench_fft3d(comm, n=n, reps=args.reps, warmup=args.warmup)
        if comm.Get_rank() == 0:
            print(format_fft3d(r), flush=True)
    else:
        if comm.Get_rank() == 0:
            print(f"[bench] memory {args.memory_shapes} shapes ...", file=sys.stderr, flush=True)
        r = bench_memory(comm, shapes=args.memory_shapes)
        if comm.Get_rank() == 0:
            print(_fmt_memory(r), flush=True)
    if comm.Get_rank() == 0:
        print(json.dumps(r), flush=True)
    return r


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m pyshard bench``: run the cases, print a table, append JSON lines."""
    args = _parser().parse_args(argv)
    if args.device == "cuda":
        from ._bench_gpu import main_cuda

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
            f"warmup {args.warmup}; {MPI.Get_library_version().splitlines()[0].strip()}",
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
            print(_fmt_table(rows))
        if args.json:
            with open(args.json, "a") as f:
                for r in rows:
                    f.write(json.dumps(r) + "\n")
    return 0 if all(r.get("check", True) for r in rows) else 1


def _plot_mpi_name(s: str) -> str:
    """A short MPI library name for a title: 'MPICH 5.0.2', 'Open MPI v5.0.3', ..."""
    s = " ".join(str(s).split()).split(",")[0]
    return s.replace(" Version:", "").strip() or "MPI ?"


def _plot_shape(r: Dict) -> str:
    shape = r.get("shape")
    return "x".join(map(str, shape)) if shape else "?"


def _plot_unit(seconds: float) -> Tuple[float, str]:
    """A scale and unit that keep the axis numbers short: s, ms or us."""
    if seconds >= 1.0:
        return 1.0, "s"
    if seconds >= 1e-3:
        return 1e3, "ms"
    return 1e6, "\u00b5s"


def _plot_times(r: Dict) -> Dict[str, float]:
    """The times of one row (seconds); older rows carry ratios instead of some of them."""
    med = float(r["median_s"])
    out = {"pyshard": med}
    if r.get("plain_median_s"):
        out["plain"] = float(r["plain_median_s"])
    if r.get("baseline_median_s"):
        out["baseline"] = float(r["baseline_median_s"])
    elif r.get("ratio_to_baseline"):
        out["baseline"] = med / float(r["ratio_to_baseline"])
    if r.get("floor_median_s"):
        out["floor"] = float(r["floor_median_s"])
    elif r.get("ratio_to_floor"):
        out["floor"] = med / float(r["ratio_to_floor"])
    if r.get("same_floor_median_s"):
        out["same_floor"] = float(r["same_floor_median_s"])
    return out


def _plot_case_order(cases: Sequence[str]) -> List[str]:
    known = [c for c in CASES if c in cases]
    return known + sorted(c for c in cases if c not in CASES)


def _plot_algo_order(algos: Sequence[str]) -> List[str]:
    order = ("auto", "tune", "alltoallv", "alltoall", "p2p", "alltoallw")
    return [a for a in order if a in algos] + sorted(a for a in algos if a not in order)


def _plot_grid(n: int, plt: Any, panel: Tuple[float, float], top: float) -> Tuple[Any, list]:
    ncols = min(n, 4)
    nrows = -(-n // ncols)
    w, h = panel
    fig, axes = plt.subplots(nrows, ncols, figsize=(w * ncols, h * nrows + top), squeeze=False)
    axes = list(axes.flat)
    for ax in axes[n:]:
        ax.set_visible(False)
    return fig, axes[:n]


def _plot_bars(rows: List[Dict], plt: Any) -> Any:
    """One panel per case: bars grouped by algorithm, the floor as a horizontal line."""
    last: Dict[Tuple[str, str], Dict] = {}
    for r in rows:  # several runs of one case and algorithm: the last one counts
        last[(r["case"], r["algorithm"])] = r
    cases = _plot_case_order(sorted({c for c, _ in last}))
    fig, axes = _plot_grid(len(cases), plt, (3.9, 3.3), 1.0)
    series = [
        ("pyshard", "pyshard (out=)", "#1f77b4"),
        ("plain", "pyshard (new result)", "#9ecae1"),
        ("baseline", "mpi4py + numpy by hand", "#ff7f0e"),
    ]
    for ax, case in zip(axes, cases):
        algos = _plot_algo_order([a for c, a in last if c == case])
        times = [_plot_times(last[(case, a)]) for a in algos]
        present = [s for s in series if any(s[0] in t for t in times)]
        peak = max(max(t.values()) for t in times)
        scale, unit = _plot_unit(peak)
        width = 0.8 / len(present)
        xs = np.arange(len(algos))
        for i, (key, label, color) in enumerate(present):
            vals = [t.get(key, np.nan) * scale for t in times]
            ax.bar(xs + (i - (len(present) - 1) / 2) * width, vals, width, label=label, color=color)
        floors = [t["floor"] for t in times if "floor" in t]
        if floors:
            floor = float(np.median(floors)) * scale
            coll = last[(case, algos[0])].get("floor_collective", "")
            ax.axhline(floor, color="k", lw=1.2, label="floor: fastest raw MPI collective")
            ax.annotate(
                f"floor {floor:.3g} {unit}" + (f" ({coll})" if coll else ""),
                (0.99, floor),
                xycoords=("axes fraction", "data"),
                xytext=(0, 2),
                textcoords="offset points",
                fontsize=7,
                ha="right",
                va="bottom",
                bbox={"boxstyle": "square,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.8},
            )
            for x, t in zip(xs, times):  # the collective this algorithm calls, when it differs
                same = t.get("same_floor")
                if same is not None and abs(same * scale - floor) > 0.02 * floor:
                    ax.hlines(
                        same * scale,
                        x - 0.45,
                        x + 0.45,
                        colors="k",
                        linestyles="--",
                        lw=1.0,
                        label="floor: same raw collective",
                    )
        r0 = last[(case, algos[0])]
        ax.set_title(f"{case}  ({_plot_shape(r0)}, {r0.get('collective', '')})", fontsize=9)
        ax.set_xticks(xs, algos, fontsize=8)
        ax.set_ylabel(f"time per call ({unit})", fontsize=8)
        ax.tick_params(axis="y", labelsize=7)
        ax.set_ylim(0, peak * scale * 1.15)
        ax.grid(axis="y", alpha=0.3)
        for i, t in enumerate(times):  # how far from the floor: ratio above each group
            if "floor" in t and t["floor"] > 0:
                ax.annotate(
                    f"{t['pyshard'] / t['floor']:.2f}x",
                    (xs[i], peak * scale * 1.1),
                    ha="center",
                    fontsize=7,
                    color="#1f77b4",
                )
    return fig, axes


def _plot_best(rows: List[Dict]) -> Dict[Tuple[str, str, int], Dict]:
    """(case, algorithm, ranks) -> the fastest row: several files may hold one rank count."""
    best: Dict[Tuple[str, str, int], Dict] = {}
    for r in rows:
        k = (r["case"], r["algorithm"], int(r["ranks"]))
        if k not in best or r["median_s"] < best[k]["median_s"]:
            best[k] = r
    return best


def _plot_ideal(best: Dict[Tuple[str, str, int], Dict], case: str, ideal: str) -> Tuple:
    """(ranks, seconds, label) of the ideal line of ``case``, from its fastest time at the
    smallest rank count; ([], [], "") when there is none to draw.

    bytes: the time grows or shrinks with the bytes each rank sends (``bytes_per_rank``),
    i.e. constant bandwidth per rank: 1/ranks for a strong-scaling transpose, flat for a
    weak-scaling one, and no speed-up for a gather of a fixed array, whose every rank must
    receive nearly all of it. strong: time x ranks constant. weak: time constant. auto:
    bytes when every row has its bytes, else strong or weak from the shapes."""
    rows = {n: r for (c, _, n), r in best.items() if c == case}
    ranks = sorted(rows)
    if ideal == "none" or len(ranks) < 2:
        return [], [], ""
    n0 = ranks[0]
    t0 = min(r["median_s"] for (c, _, n), r in best.items() if c == case and n == n0)
    nbytes = {n: r.get("bytes_per_rank") or 0 for n, r in rows.items()}
    if ideal == "auto":
        ideal = "bytes" if all(nbytes.values()) else _plot_scaling_kind(best, case)
    if ideal == "bytes":
        times = [t0 * nbytes[n] / nbytes[n0] for n in ranks]
        return ranks, times, "ideal: time \u221d bytes sent per rank"
    if ideal == "strong":
        return ranks, [t0 * n0 / n for n in ranks], "ideal: time x ranks constant"
    if ideal == "weak":
        return ranks, [t0] * len(ranks), "ideal: time constant"
    return [], [], ""


def _plot_scaling(rows: List[Dict], plt: Any, ideal: str) -> Any:
    """One panel per case: time per call against ranks, one line per algorithm, the floor
    (the fastest raw MPI collective at each rank count) and the ideal line."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    best = _plot_best(rows)
    cases = _plot_case_order(sorted({c for c, _, _ in best}))
    fig, axes = _plot_grid(len(cases), plt, (3.9, 3.4), 0.75)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, case in zip(axes, cases):
        algos = _plot_algo_order(sorted({a for c, a, _ in best if c == case}))
        ranks_all = sorted({n for c, _, n in best if c == case})
        scale, unit = _plot_unit(max(r["median_s"] for k, r in best.items() if k[0] == case))
        for j, a in enumerate(algos):
            pts = sorted(
                (n, r["median_s"]) for (c, al, n), r in best.items() if (c, al) == (case, a)
            )
            ax.plot(
                [n for n, _ in pts],
                [t * scale for _, t in pts],
                "o-",
                color=colors[j % len(colors)],
                label=a,
                lw=1.5,
                ms=4,
            )
        floor: Dict[int, float] = {}
        for (c, _, n), r in best.items():
            f = _plot_times(r).get("floor")
            if c == case and f:
                floor[n] = min(floor.get(n, np.inf), f)
        if floor:
            pts = sorted(floor.items())
            ax.plot(
                [n for n, _ in pts],
                [t * scale for _, t in pts],
                "s--",
                color="0.45",
                lw=1.0,
                ms=3,
                label="floor: fastest raw MPI collective",
            )
        xs, ys, label = _plot_ideal(best, case, ideal)
        if xs:
            ax.plot(xs, [y * scale for y in ys], ":", color="k", lw=1.4, label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(ranks_all, [str(n) for n in ranks_all], fontsize=8)
        ax.minorticks_off()
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.tick_params(axis="y", labelsize=7)
        ax.set_xlabel("ranks", fontsize=8)
        ax.set_ylabel(f"time per call ({unit}, log)", fontsize=8)
        r0 = best[next(k for k in best if k[0] == case)]
        ax.set_title(f"{case}  ({r0.get('collective', '')})", fontsize=9)
        ax.grid(alpha=0.3, which="both")
    return fig, axes


def _plot_scaling_kind(best: Dict[Tuple[str, str, int], Dict], case: str) -> str:
    """strong when the global shape is the same at every rank count, weak when the elements
    per rank are, else none (no ideal line)."""
    sizes = {n: prod(r["shape"]) for (c, _, n), r in best.items() if c == case and r.get("shape")}
    if len(set(sizes.values())) == 1:
        return "strong"
    if len({s / n for n, s in sizes.items()}) == 1:
        return "weak"
    return "none"


def plot_main(argv: Optional[List[str]] = None) -> int:
    """``python -m pyshard plot FILE... -o out.png``: one panel per case. One rank count:
    bars grouped by algorithm (pyshard with ``out=``, pyshard returning a new array, the
    hand-written mpi4py + numpy baseline) and the floor (the fastest raw MPI collective on
    pre-packed buffers) as a horizontal line. Several rank counts (the Slurm scaling runs):
    time per call against ranks, one line per algorithm, the floor and the ideal line."""
    ap = argparse.ArgumentParser(prog="python -m pyshard plot")
    ap.add_argument("files", nargs="+", help="JSON lines written by pyshard bench --json")
    ap.add_argument("-o", "--output", default="bench.png")
    ap.add_argument(
        "--ideal",
        choices=("auto", "bytes", "strong", "weak", "none"),
        default="auto",
        help="the ideal line of a scaling plot (several rank counts): bytes (time in "
        "proportion to the bytes each rank sends: constant bandwidth per rank), strong (time "
        "x ranks constant), weak (time constant); auto (default): bytes when the rows have "
        "bytes_per_rank, else strong or weak from the shapes",
    )
    ap.add_argument("--title", default=None, help="replace the title")
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
    rows = [
        r
        for r in rows
        if r.get("case") not in EXTRA_CASES
        and {"case", "algorithm", "ranks", "median_s"} <= set(r)
        and ("floor_median_s" in r or "ratio_to_floor" in r)
    ]
    if not rows:
        print("no benchmark rows in the given files", file=sys.stderr)
        return 1
    ranks = sorted({int(r["ranks"]) for r in rows})
    mpis = sorted({_plot_mpi_name(r["mpi"]) for r in rows if r.get("mpi")}) or ["MPI not recorded"]
    dtypes = sorted({str(r["dtype"]) for r in rows if r.get("dtype")})
    if len(ranks) == 1:
        fig, axes = _plot_bars(rows, plt)
        what = "pyshard bench"
        shapes = sorted({_plot_shape(r) for r in rows if r["case"] != "small"})
        detail = f"{ranks[0]} rank{'s' if ranks[0] != 1 else ''}"
        if shapes:
            detail += f", {' / '.join(shapes)} {' / '.join(dtypes)}"
    else:
        fig, axes = _plot_scaling(rows, plt, args.ideal)
        best = _plot_best(rows)
        kinds = {_plot_scaling_kind(best, c) for c in {r["case"] for r in rows}}
        kind = kinds.pop() if len(kinds) == 1 else "none"
        what = f"pyshard {kind} scaling" if kind != "none" else "pyshard scaling"
        detail = f"{ranks[0]} to {ranks[-1]} ranks"
        big = [r for r in rows if r["case"] != "small" and r.get("shape")]
        if kind == "strong" and big:
            detail += f", {' / '.join(sorted({_plot_shape(r) for r in big}))}"
        elif kind == "weak" and big:
            lo = min(big, key=lambda r: r["ranks"])
            hi = max(big, key=lambda r: r["ranks"])
            detail += f", {_plot_shape(lo)} to {_plot_shape(hi)}"
        if dtypes:
            detail += f" {' / '.join(dtypes)}"
    title = args.title or f"{what}: {' / '.join(mpis)}, {detail}"
    height = fig.get_figheight()  # inches; the top holds the title, legend (and note)
    top = 0.95 if len(ranks) == 1 else 0.75
    fig.tight_layout(rect=(0, 0, 1, 1 - top / height))  # before the figure-level texts
    fig.suptitle(title, fontsize=11, y=1 - 0.1 / height, va="top")
    handles: Dict[str, Any] = {}
    for ax in axes:  # one legend for the figure, each entry once
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    fig.legend(
        handles.values(),
        handles.keys(),
        loc="upper center",
        ncol=len(handles) if len(handles) <= 5 else 4,
        fontsize=8,
        frameon=False,
        bbox_to_anchor=(0.5, 1 - 0.38 / height),
    )
    if len(ranks) == 1:
        note = "above each group: pyshard (out=) time / floor; lower is better"
        fig.text(0.5, 1 - 0.72 / height, note, ha="center", va="top", fontsize=7, color="0.3")
    fig.savefig(args.output, dpi=110)
    plt.close(fig)
    print(f"wrote {args.output} ({len(rows)} rows, ranks {ranks})")
    return 0
