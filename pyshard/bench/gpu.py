"""``python -m pyshard bench --device cuda``: GPU cases next to hand-written cupy + mpi4py
exchanges, and the pack kernel's bandwidth against a device-to-device copy.

The cases ``transpose`` and ``gather`` run on cupy arrays, each next to the same exchange
written by hand with cupy and mpi4py (a device pack, the raw collective on device memory with
a CUDA-aware MPI, else staged through pinned host buffers). cupy is imported only when the
GPU bench runs."""

from __future__ import annotations

import argparse
import sys
from math import prod
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
from mpi4py import MPI

from .. import _backend, _core, _mpi, collectives
from ..array import from_local
from ..geometry import exchange_specs, geometry
from ..layout import Layout, Shard
from ..mesh import Mesh
from ..planner import Step
from ..planner import plan as make_plan
from .cases import CASES, Case, make_cases
from .floors import aligned_displs, exchange_blocks, flat_offset, is_contiguous, member_box
from .report import append_json
from .timing import timed

# ----------------------------------------------------------------------------- GPU

CUDA_CASES = ("transpose", "gather")
PACK_TARGET = 0.70  # the pack kernel's bandwidth, as a fraction of a device-to-device copy
_H2D, _D2H, _D2D = 1, 2, 3  # cudaMemcpyKind


def cuda_unavailable() -> Optional[str]:
    """Why ``--device cuda`` cannot run here, or None when it can."""
    if _backend.cuda_available():
        return None
    why = []
    if not _core.cuda_built():
        why.append(
            "pyshard's core was built without CUDA (build with -Ccmake.define.PYSHARD_CUDA=ON)"
        )
    if not _core.cuda_device_present():
        why.append("no CUDA GPU or driver is present")
    if _backend.cupy() is None:
        why.append("cupy does not import (pip install cupy-cuda13x)")
    return "; ".join(why) or "pyshard.cuda_available() is False"


def _cuda_pattern(cp: Any, layout: Layout, coords: tuple) -> Any:
    """This rank's box of the benchmark array (the global flat index mod 1009) on the GPU."""
    box = layout.box(coords)
    idx = cp.zeros((1,) * layout.ndim, cp.int64)
    stride = 1
    for d in reversed(range(layout.ndim)):
        shp = [1] * layout.ndim
        shp[d] = box[d].stop - box[d].start
        idx = idx + (cp.arange(box[d].start, box[d].stop, dtype=cp.int64) * stride).reshape(shp)
        stride *= layout.shape[d]
    return cp.ascontiguousarray((idx % 1009).astype(layout.dtype))


def _pinned(n: int) -> np.ndarray:
    """``n`` bytes of page-locked host memory (a numpy view)."""
    import cupyx  # type: ignore[import-not-found]

    return cupyx.empty_pinned((max(n, 1),), dtype=np.uint8)[:n]


def _bytes(a: Any) -> Any:
    """A flat uint8 view of a C-contiguous numpy or cupy array."""
    return a.reshape(-1).view(np.uint8)


class _CudaReference:
    """One plan step written by hand with cupy and mpi4py, bound to this rank's buffers.

    baseline: pack on the device (cupy slicing into one contiguous buffer; skipped where
    every block is contiguous already), the raw MPI collective on device buffers when
    ``direct`` (a CUDA-aware MPI) or else staged through pinned host buffers (one
    device-to-host copy before, host-to-device copies after), unpack on the device (skipped
    where the blocks land contiguously in the output). Where every block has the same size
    the collective is the regular one, Alltoall (this rank's own block moved by MPI too) or
    Allgather; else Alltoallv (the own block a device copy) or Allgatherv.
    floor: the raw collective alone on pre-packed buffers on the same path.
    Work runs on cupy's current stream, synchronised before MPI touches the buffers.
    """

    def __init__(self, cp: Any, step: Step, mesh: Mesh, local: Any, direct: bool) -> None:
        self.cp = cp
        self.rt = cp.cuda.runtime
        self.stream = cp.cuda.get_current_stream()
        self.kind = step.kind
        self.direct = direct
        self.comm = mesh.sub_dims(step.mesh_dims) if step.mesh_dims else mesh.comm
        coords = mesh.coords
        self.local = local
        self.out_shape = step.dst.local_shape(coords)
        self.dtype = np.dtype(local.dtype)
        self.out = cp.empty(self.out_shape, self.dtype)
        self.regular = False
        if self.kind == "alltoallv":
            self._init_exchange(step, coords)
            self.collective = "alltoall" if self.regular else "alltoallv"
        elif self.kind == "allgatherv":
            self._init_gather(step, coords)
            self.collective = "allgather" if self.regular else "allgatherv"
        elif self.kind in ("local_copy", "make_partial", "relabel"):
            src_lo = [step.src.interval(d, coords)[0] for d in range(step.src.ndim)]
            self.sl = tuple(
                slice(a - o, b - o)
                for (a, b), o in zip(
                    (step.dst.interval(d, coords) for d in range(step.dst.ndim)), src_lo
                )
            )
            self.collective = "copy"
        else:
            raise ValueError(f"no GPU reference for a {self.kind} step")

    def _size(self, sl: Tuple[slice, ...]) -> int:
        return prod(s.stop - s.start for s in sl) * self.dtype.itemsize

    def _init_exchange(self, step: Step, coords: tuple) -> None:
        cp, local, item = self.cp, self.local, self.dtype.itemsize
        n, me = self.comm.Get_size(), self.comm.Get_rank()
        sends, recvs = exchange_blocks(step, coords)
        sizes = {self._size(sl) for _, sl in sends + recvs}
        mine = sizes.pop() if len(sends) == len(recvs) == n and len(sizes) == 1 else -1
        block = collectives.allgather(self.comm, mine)  # the choice must agree on every rank
        self.regular = block[0] > 0 and all(b == block[0] for b in block)
        if self.regular:  # Alltoall: every member's block, this rank's own included
            self.own = None
            self.sends, self.recvs = sends, recvs
            self.sc = self.rc = [block[0]] * n
            self.sd = self.rd = [g * block[0] for g in range(n)]
        else:  # Alltoallv of the other ranks' blocks, 64-byte aligned; the own block copied
            own_s = [sl for g, sl in sends if g == me]
            own_r = [sl for g, sl in recvs if g == me]
            self.own = (own_s[0], own_r[0]) if own_s and own_r else None
            self.sends = [(g, sl) for g, sl in sends if g != me]
            self.recvs = [(g, sl) for g, sl in recvs if g != me]
            self.sc, self.rc = [0] * n, [0] * n
            for g, sl in self.sends:
                self.sc[g] = self._size(sl)
            for g, sl in self.recvs:
                self.rc[g] = self._size(sl)
            self.sd, self.rd = aligned_displs(self.sc), aligned_displs(self.rc)
        self.dsend = cp.zeros(self.sd[-1] + self.sc[-1], cp.uint8)
        self.drecv = cp.zeros(self.rd[-1] + self.rc[-1], cp.uint8)
        # where each block sits in the packed buffers, as typed views
        self.pack = [(self._view(self.dsend, self.sd[g], sl), sl) for g, sl in self.sends]
        self.unpack = [(self._view(self.drecv, self.rd[g], sl), sl) for g, sl in self.recvs]
        # blocks already contiguous in the arrays: no pack (unpack), MPI reads (writes) them
        # in place; a regular Alltoall also needs them one after another in rank order
        self.sdirect, self.rdirect = [0] * n, [0] * n
        for g, sl in self.sends:
            self.sdirect[g] = flat_offset(local.shape, sl) * item
        for g, sl in self.recvs:
            self.rdirect[g] = flat_offset(self.out_shape, sl) * item
        self.send_direct = all(is_contiguous(local.shape, sl) for _, sl in self.sends)
        self.recv_direct = all(is_contiguous(self.out_shape, sl) for _, sl in self.recvs)
        if self.regular:
            self.send_direct = (
                self.send_direct and self.sdirect == self.sd and (local.nbytes == self.dsend.nbytes)
            )
            self.recv_direct = (
                self.recv_direct
                and self.rdirect == self.rd
                and (self.out.nbytes == self.drecv.nbytes)
            )
        if not self.direct:
            self.hsend, self.hrecv = _pinned(self.dsend.nbytes), _pinned(self.drecv.nbytes)

    def _init_gather(self, step: Step, coords: tuple) -> None:
        cp, item = self.cp, self.dtype.itemsize
        n, me = self.comm.Get_size(), self.comm.Get_rank()
        self.counts = [prod(step.src.local_shape(step.member(coords, g))) * item for g in range(n)]
        self.displs = [int(v) for v in np.concatenate(([0], np.cumsum(self.counts)[:-1]))]
        self.regular = self.counts[0] > 0 and len(set(self.counts)) == 1  # from the layouts
        self.cd = (self.counts, self.displs)
        blocks = [member_box(step, coords, g, step.src, step.dst) for g in range(n)]
        # every member's block lands contiguously, in rank order: receive into the output
        self.recv_direct = sum(self.counts) == self.out.nbytes and all(
            is_contiguous(self.out_shape, sl) and flat_offset(self.out_shape, sl) * item == d
            for sl, d in zip(blocks, self.displs)
        )
        self.drecv = cp.zeros(0 if self.recv_direct else sum(self.counts), cp.uint8)
        self.unpack = [
            (self._view(self.drecv, d, sl), sl)
            for sl, d in zip(blocks, self.displs)
            if not self.recv_direct
        ]
        if not self.direct:
            self.hsend, self.hrecv = _pinned(self.counts[me]), _pinned(sum(self.counts))

    def _view(self, buf: Any, off: int, sl: Tuple[slice, ...]) -> Any:
        shp = tuple(s.stop - s.start for s in sl)
        return buf[off : off + self._size(sl)].view(self.dtype).reshape(shp)

    def _copy(self, dst: int, src: int, n: int, kind: int) -> None:
        if n > 0:
            self.rt.memcpyAsync(dst, src, n, kind, self.stream.ptr)

    def _exchange(self, sb: Any, sdisp: List[int], rb: Any, rdisp: List[int]) -> None:
        if self.regular:
            self.comm.Alltoall([sb, MPI.BYTE], [rb, MPI.BYTE])
        else:
            self.comm.Alltoallv([sb, (self.sc, sdisp), MPI.BYTE], [rb, (self.rc, rdisp), MPI.BYTE])

    def _gather(self, sb: Any, rb: Any) -> None:
        if self.regular:
            self.comm.Allgather([sb, MPI.BYTE], [rb, MPI.BYTE])
        else:
            self.comm.Allgatherv([sb, MPI.BYTE], [rb, self.cd, MPI.BYTE])

    def floor(self) -> None:
        if self.kind == "alltoallv":
            sb, rb = (self.dsend, self.drecv) if self.direct else (self.hsend, self.hrecv)
            self._exchange(sb, self.sd, rb, self.rd)
        elif self.kind == "allgatherv":
            if self.direct:
                rb = self.drecv if self.drecv.size else _bytes(self.out)
                self._gather(_bytes(self.local), rb)
            else:
                self._gather(self.hsend, self.hrecv)
        else:
            self._copy(self.out.data.ptr, self.local.data.ptr, self.out.nbytes, _D2D)

    def baseline(self) -> Any:
        if self.kind == "alltoallv":
            self._baseline_exchange()
        elif self.kind == "allgatherv":
            self._baseline_gather()
        else:
            self.out[...] = self.local[self.sl]
        return self.out

    def _baseline_exchange(self) -> None:
        local, out, n = self.local, self.out, self.comm.Get_size()
        if not self.send_direct:
            for v, sl in self.pack:
                v[...] = local[sl]
        if self.own is not None:
            out[self.own[1]] = local[self.own[0]]
        if self.direct:
            sb, sdisp = (_bytes(local), self.sdirect) if self.send_direct else (self.dsend, self.sd)
            rb, rdisp = (_bytes(out), self.rdirect) if self.recv_direct else (self.drecv, self.rd)
            self.stream.synchronize()
            self._exchange(sb, sdisp, rb, rdisp)
        else:
            hs, hr = self.hsend.ctypes.data, self.hrecv.ctypes.data
            if self.send_direct:
                for g in range(n):
                    self._copy(hs + self.sd[g], local.data.ptr + self.sdirect[g], self.sc[g], _D2H)
            else:
                self._copy(hs, self.dsend.data.ptr, self.dsend.nbytes, _D2H)
            self.stream.synchronize()
            self._exchange(self.hsend, self.sd, self.hrecv, self.rd)
            if self.recv_direct:
                for g in range(n):
                    self._copy(out.data.ptr + self.rdirect[g], hr + self.rd[g], self.rc[g], _H2D)
                return
            self._copy(self.drecv.data.ptr, hr, self.drecv.nbytes, _H2D)
        if not self.recv_direct:
            for v, sl in self.unpack:
                out[sl] = v

    def _baseline_gather(self) -> None:
        local, out = self.local, self.out
        if self.direct:
            rb = _bytes(out) if self.recv_direct else self.drecv
            self.stream.synchronize()
            self._gather(_bytes(local), rb)
        else:
            self._copy(self.hsend.ctypes.data, local.data.ptr, local.nbytes, _D2H)
            self.stream.synchronize()
            self._gather(self.hsend, self.hrecv)
            dst = out if self.recv_direct else self.drecv
            self._copy(dst.data.ptr, self.hrecv.ctypes.data, self.hrecv.nbytes, _H2D)
        for v, sl in self.unpack:
            out[sl] = v


def _counts_since(before: Dict[str, int]) -> Dict[str, int]:
    now = dict(_core.stats())
    return {k: v - before.get(k, 0) for k, v in now.items() if v - before.get(k, 0)}


def run_case_cuda(
    cp: Any, case: Case, comm: MPI.Comm, dtype: np.dtype, reps: int, warmup: int, algorithm: str
) -> Dict:
    """Time one case on cupy arrays (pyshard, by hand, raw collective) and check both
    results against the pattern; every timing ends with the stream synchronised."""
    mesh = Mesh(comm, case.mesh_shape)
    stream = cp.cuda.get_current_stream()
    src = Layout(case.shape, dtype, mesh.shape, case.src, case.src_sizes)
    x = from_local(
        _cuda_pattern(cp, src, mesh.coords), mesh, case.src, global_shape=case.shape,
        sizes=case.src_sizes,
    )  # fmt: skip
    p = x.plan_to(case.dst)
    coll = [s for s in p.steps if s.is_collective] or [s for s in p.steps if s.kind != "relabel"]
    if not coll:  # nothing to do (one rank): compare with a plain device copy
        coll = [Step("local_copy", (), p.src, p.dst)]
    if len(coll) != 1:
        raise ValueError(f"bench case {case.name}: expected a one-step plan, plan is {p}")
    direct = _backend.transport(device=True) == "direct"  # what the steps built here take
    want = _cuda_pattern(cp, p.dst, mesh.coords)
    y = x.redistribute(case.dst, algorithm=algorithm)  # builds plan and core objects
    ref = _CudaReference(cp, coll[0], mesh, x.local, direct)
    base = ref.baseline()
    out = cp.empty(want.shape, dtype)
    x.redistribute(case.dst, algorithm=algorithm, out=out)
    stream.synchronize()
    ok = all(bool(cp.array_equal(a, want)) for a in (y.local, base, out))
    ok = collectives.all_true(comm, ok)
    del y, want

    def run_pyshard() -> None:
        x.redistribute(case.dst, algorithm=algorithm, out=out)
        stream.synchronize()

    def run_hand() -> None:
        ref.baseline()
        stream.synchronize()

    def run_floor() -> None:
        ref.floor()
        stream.synchronize()

    before = dict(_core.stats())
    t_ps = timed(run_pyshard, comm, reps, warmup)
    got = _counts_since(before)
    t_hand = timed(run_hand, comm, reps, warmup)
    t_floor = timed(run_floor, comm, reps, warmup)
    path = next((k for k in ("staged", "device_direct") if got.get(k)), "none")
    ps_coll = "+".join(sorted(k for k in got if k not in ("staged", "device_direct"))) or "none"
    sent = max((b[0] for b in p.rank_bytes(mesh.coords)), default=0)
    sent = collectives.max_all(comm, sent)
    med, hand, flo = (float(np.median(t)) for t in (t_ps, t_hand, t_floor))
    return {
        "case": case.name,
        "device": "cuda",
        "shape": list(case.shape),
        "dtype": str(dtype),
        "ranks": comm.Get_size(),
        "mesh": list(case.mesh_shape),
        "placements": [str(q) for q in case.src] + ["->"] + [str(q) for q in case.dst],
        "algorithm": algorithm,
        "collective": coll[0].kind,
        "pyshard_collective": ps_coll,
        "hand_collective": ref.collective,
        "transport": "direct" if direct else "staged",
        "pyshard_path": path,
        "median_s": med,
        "min_s": float(np.min(t_ps)),
        "hand_median_s": hand,
        "ratio_to_hand": med / hand if hand > 0 else float("nan"),
        "floor_median_s": flo,
        "ratio_to_floor": med / flo if flo > 0 else float("nan"),
        "bytes_per_rank": int(sent),
        "gbps": sent / med / 1e9 if med > 0 else 0.0,
        "check": ok,
        "reps": reps,
        "mpi": _mpi.library_line(),
    }


def _event_seconds(cp: Any, fn: Any, reps: int, warmup: int = 3) -> float:
    """Seconds per call of ``fn`` on the current stream, from CUDA events around ``reps``
    back-to-back calls (the device's time, not the launch overhead)."""
    stream = cp.cuda.get_current_stream()
    for _ in range(warmup):
        fn()
    start, end = cp.cuda.Event(), cp.cuda.Event()
    start.record(stream)
    for _ in range(reps):
        fn()
    end.record(stream)
    end.synchronize()
    return cp.cuda.get_elapsed_time(start, end) / 1e3 / reps


def bench_pack_cuda(
    cp: Any, comm: MPI.Comm, shape: Tuple[int, ...], dtype: np.dtype, reps: int = 20
) -> Dict[str, Any]:
    """The CUDA pack kernel's bandwidth on the transpose's geometry (Shard(0) -> Shard(1) on
    a 1-D mesh of every rank), as a fraction of a device-to-device copy of the same bytes.

    Measured on rank 0 alone (the others wait: ranks may share one GPU) with CUDA events;
    collective over ``comm``. ``fraction`` is None where there is nothing to pack (one rank)
    or the core has no ``device_pack``.
    """
    row: Dict[str, Any] = {
        "case": "pack_kernel", "device": "cuda", "shape": list(shape), "dtype": str(dtype),
        "ranks": comm.Get_size(), "target": PACK_TARGET,
    }  # fmt: skip
    if comm.Get_rank() == 0:
        try:
            row.update(_measure_pack(cp, comm.Get_size(), shape, dtype, reps))
        except Exception as e:  # noqa: BLE001 - report it; the other ranks wait in bcast
            row.update({"fraction": None, "why": f"{type(e).__name__}: {e}", "check": False})
    return collectives.bcast(comm, row)


def _measure_pack(
    cp: Any, p: int, shape: Tuple[int, ...], dtype: np.dtype, reps: int
) -> Dict[str, Any]:
    """Rank 0's pack of the transpose on ``p`` ranks (planned from layouts alone)."""
    if not hasattr(_core, "device_pack"):
        return {"fraction": None, "why": "this build of the core has no device_pack"}
    src = Layout(shape, dtype, (p,), [Shard(0)])
    steps = [s for s in make_plan(src, src.replace([Shard(1)])).steps if s.kind == "alltoallv"]
    coords = (0,)
    if not steps:
        return {"fraction": None, "why": "one rank: the transpose packs nothing"}
    step = steps[0]
    g = geometry(step, coords)
    sends = exchange_specs(step, coords)[0]
    nbytes = sum(prod(ext) for _, _, ext in sends) * np.dtype(dtype).itemsize
    if nbytes == 0:
        return {"fraction": None, "why": "no send blocks at rank 0"}
    local = _cuda_pattern(cp, src, coords)
    packed = cp.empty(max(int(g.staged_bytes), 1), cp.uint8)
    copied = cp.empty(nbytes, cp.uint8)
    stream = cp.cuda.get_current_stream()
    rt = cp.cuda.runtime

    def pack() -> None:
        _core.device_pack(g, local.data.ptr, packed.data.ptr, stream.ptr)

    def copy() -> None:
        rt.memcpyAsync(copied.data.ptr, local.data.ptr, nbytes, _D2D, stream.ptr)

    t_pack = _event_seconds(cp, pack, reps)
    t_copy = _event_seconds(cp, copy, reps)
    # the packed bytes are the send blocks, one after another at 4 KiB aligned offsets
    ok, off = True, 0
    flat = packed
    for _, start, ext in sends:
        sl = tuple(slice(a, a + e) for a, e in zip(start, ext))
        blk = cp.ascontiguousarray(local[sl])
        ok = ok and bool(cp.array_equal(_bytes(blk), flat[off : off + blk.nbytes]))
        off = (off + blk.nbytes + 4095) // 4096 * 4096
    return {
        "bytes": int(nbytes),
        "blocks": len(sends),
        "pack_s": t_pack,
        "copy_s": t_copy,
        "pack_GBps": nbytes / t_pack / 1e9,
        "copy_GBps": nbytes / t_copy / 1e9,
        "fraction": t_copy / t_pack,
        "check": ok,
    }


def _fmt_cuda_row(r: Dict[str, Any]) -> str:
    shape = "x".join(map(str, r["shape"]))
    pl = r["placements"]
    src, dst = pl[: pl.index("->")], pl[pl.index("->") + 1 :]
    return (
        f"cuda {r['case']} {shape} {r['dtype']} {','.join(src)}->{','.join(dst)}, "
        f"{r['ranks']} ranks, {r['algorithm']}, {r['transport']}: pyshard "
        f"({r['pyshard_collective']}) {r['median_s'] * 1e3:.3f} ms | by hand "
        f"({r['hand_collective']}) {r['hand_median_s'] * 1e3:.3f} ms "
        f"(x{r['ratio_to_hand']:.2f}) | raw collective {r['floor_median_s'] * 1e3:.3f} ms "
        f"(x{r['ratio_to_floor']:.2f}) | {r['gbps']:.2f} GB/s/rank | "
        f"{'ok' if r['check'] else 'WRONG'}"
    )


def _fmt_pack_row(r: Dict[str, Any]) -> str:
    if r.get("fraction") is None:
        state = "FAILED" if r.get("check") is False else "n/a"
        return f"cuda pack kernel: {state} ({r.get('why', '?')})"
    verdict = "ok" if r["fraction"] >= PACK_TARGET else "BELOW TARGET"
    return (
        f"cuda pack kernel (transpose geometry at rank 0, {r['blocks']} block(s)): "
        f"{r['bytes'] / 2**20:.1f} MiB in {r['pack_s'] * 1e3:.3f} ms = {r['pack_GBps']:.0f} GB/s; "
        f"device copy {r['copy_s'] * 1e3:.3f} ms = {r['copy_GBps']:.0f} GB/s; "
        f"{100 * r['fraction']:.0f}% of the copy (target >= {100 * PACK_TARGET:.0f}%) {verdict}"
        f"{'' if r['check'] else '; packed bytes WRONG'}"
    )


def _use_local_gpu(cp: Any, comm: MPI.Comm) -> int:
    """Ranks of one node take its GPUs round robin (all share GPU 0 on a one-GPU machine)."""
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    local_rank = node.Get_rank()
    node.Free()
    dev = local_rank % max(cp.cuda.runtime.getDeviceCount(), 1)
    cp.cuda.Device(dev).use()
    return dev


def main_cuda(args: argparse.Namespace) -> int:
    """``python -m pyshard bench --device cuda``: the GPU cases, one line each, a summary
    line; exit status 2 without a usable GPU, 1 when a result is wrong."""
    comm = MPI.COMM_WORLD
    rank, p = comm.Get_rank(), comm.Get_size()
    why = cuda_unavailable()
    if why is not None:
        if rank == 0:
            print(
                f"python -m pyshard bench --device cuda: cannot run here: {why}. Run it on a "
                "machine with a GPU, or without --device cuda for the host benchmark.",
                file=sys.stderr,
                flush=True,
            )
        return 2
    names = [n for n in args.cases.split(",") if n]
    if args.cases == ",".join(CASES):  # the default list: the GPU cases
        names = list(CUDA_CASES)
    bad = [n for n in names if n not in CUDA_CASES]
    if bad:
        if rank == 0:
            print(
                f"python -m pyshard bench --device cuda: cases {bad} do not run on the GPU; "
                f"GPU cases are {CUDA_CASES}",
                file=sys.stderr,
                flush=True,
            )
        return 2
    cp = _backend.cupy()
    dev = _use_local_gpu(cp, comm)
    shape = tuple(int(s) for s in args.shape.lower().split("x"))
    dtype = np.dtype(args.dtype)
    algos = [a for a in args.algorithm.split(",") if a]
    info = _backend.build_info()
    aware = info["cuda_aware_mpi"]
    transport = info["transport"]["cuda"]
    if rank == 0:
        name = cp.cuda.runtime.getDeviceProperties(dev)["name"]
        name = name.decode() if isinstance(name, bytes) else str(name)
        print(
            f"pyshard bench --device cuda: {p} ranks, {args.shape} {dtype}, reps {args.reps}, "
            f"warmup {args.warmup}; {name}; CUDA {info['cuda']}; "
            f"{_mpi.library_line()}; CUDA-aware MPI: {aware}; "
            f"GPU transport: {transport}",
            flush=True,
        )
    rows: List[Dict] = []
    for case in make_cases(names, shape, p):
        for algo in algos:
            if rank == 0:
                print(f"[bench] cuda {case.name} {algo} ...", file=sys.stderr, flush=True)
            r = run_case_cuda(cp, case, comm, dtype, args.reps, args.warmup, algo)
            rows.append(r)
            if rank == 0:
                print(_fmt_cuda_row(r), flush=True)
    if rank == 0:
        print("[bench] cuda pack kernel ...", file=sys.stderr, flush=True)
    pack = bench_pack_cuda(cp, comm, shape, dtype)
    rows.append(pack)
    ok = all(r["check"] for r in rows if r is not pack)
    pack_ok = pack.get("check", True)
    if rank == 0:
        print(_fmt_pack_row(pack), flush=True)
        parts = [
            f"{r['case']} {r['algorithm']} x{r['ratio_to_hand']:.2f} of hand"
            for r in rows
            if r is not pack
        ]
        frac = pack.get("fraction")
        if not pack_ok:
            parts.append("pack kernel FAILED")
        elif frac is None:
            parts.append("pack kernel n/a")
        else:
            verdict = "ok" if frac >= PACK_TARGET else "BELOW TARGET"
            parts.append(f"pack kernel {100 * frac:.0f}% of a device copy ({verdict})")
        print(
            f"pyshard bench --device cuda: {p} ranks, transport {transport} (CUDA-aware MPI: "
            f"{aware}): {', '.join(parts)}; results {'ok' if ok else 'WRONG'}",
            flush=True,
        )
        if args.json:
            append_json(args.json, rows)
    return 0 if ok and pack_ok else 1


