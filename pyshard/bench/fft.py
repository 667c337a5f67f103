"""The ``fft`` bench case: :mod:`pyshard.fft` on 3-D arrays, c2c (``fftn``/``ifftn``) and r2c
(``rfftn``/``irfftn``), slab (a 1-D mesh, ``[Shard(0)]``) and pencil (a 2-D mesh,
``[Shard(0), Shard(1)]``), forward and backward (``plan.backward``), each with its local-FFT
time and its transpose time; next to mpi4py-fft's ``PFFT`` when it imports (``pip install
.[bench-fft]``, which needs FFTW); and a batched 2-D transform (``B x M x M`` complex128 over
axes (1, 2), the batch axis sharded: no transpose) against serial ``scipy.fft.fftn`` of one
rank's share.

Times are medians over ``reps`` on the slowest rank (a barrier before each run): ``total`` is
the whole call, ``fft`` and ``transpose`` the slowest rank's sums of its local transforms and
of its redistributions within that call.
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Tuple

import numpy as np
from mpi4py import MPI

from .. import fft as pf
from ..apps.fft3d import sample_array
from ..array import ShardedArray
from ..layout import Layout, Shard
from ..mesh import Mesh

__all__ = ["bench_fft", "format_fft"]


def _mesh2d(p: int) -> Tuple[int, int]:
    a, b = MPI.Compute_dims(p, 2)
    return int(a), int(b)


def _time_passes(passes: Any, x: ShardedArray, comm: MPI.Comm, reps: int,
                 warmup: int) -> Tuple[Dict[str, float], ShardedArray]:
    """Median (total, fft, transpose) ms of running ``passes`` on ``x``; the last result."""
    y = x
    for _ in range(warmup):
        y = pf.run_passes(passes, x, None, None, 2, None, None)
    tot: List[float] = []
    loc: List[float] = []
    tra: List[float] = []
    for _ in range(reps):
        times = [0.0, 0.0]
        comm.Barrier()
        t0 = time.perf_counter()
        y = pf.run_passes(passes, x, None, None, 2, None, None, times)
        dt = time.perf_counter() - t0
        tot.append(comm.allreduce(dt, op=MPI.MAX))
        loc.append(comm.allreduce(times[0], op=MPI.MAX))
        tra.append(comm.allreduce(times[1], op=MPI.MAX))
    med = {k: float(np.median(v)) * 1e3 for k, v in (("total", tot), ("fft", loc),
                                                      ("transpose", tra))}
    return med, y


def _pfft_row(comm: MPI.Comm, n: int, mesh_shape: Tuple[int, ...], reps: int,
              warmup: int) -> Dict[str, Any]:
    """mpi4py-fft's PFFT (c2c complex128, numpy backend) forward+backward, or why not."""
    try:
        import mpi4py_fft
        from mpi4py_fft import PFFT

        why = f"mpi4py-fft {getattr(mpi4py_fft, '__version__', '?')}"
    except Exception as e:  # ImportError, or a broken build
        PFFT, why = None, f"mpi4py_fft does not import ({type(e).__name__}: {e})"
    if not comm.allreduce(PFFT is not None, op=MPI.LAND):
        return {"pfft": why if PFFT is None else "mpi4py_fft does not import on every rank"}
    try:  # pragma: no cover - mpi4py-fft is not installed in CI
        grid = tuple(mesh_shape) + (1,) * (3 - len(mesh_shape))
        p = PFFT(comm, (n, n, n), grid=grid, dtype=np.complex128, backend="numpy")
        from mpi4py_fft import newDistArray

        u = newDistArray(p, False)
        u[:] = 1.0  # the timing does not depend on the values
        uh = newDistArray(p, True)

        def both() -> None:
            p.forward(u, uh)
            p.backward(uh, u)

        for _ in range(warmup):
            both()
        ts = []
        for _ in range(reps):
            comm.Barrier()
            t0 = time.perf_counter()
            both()
            ts.append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
        p.destroy()
        return {"pfft": why, "pfft_fwd_bwd_ms": float(np.median(ts)) * 1e3}
    except Exception as e:  # a broken build
        return {"pfft": f"PFFT failed: {type(e).__name__}: {e}"}


def bench_fft(
    comm: MPI.Comm,
    n: int = 256,
    reps: int = 3,
    warmup: int = 1,
    batch: int = 64,
    batch_n: int = 1024,
    pfft: bool = True,
    decomps: Tuple[str, ...] = ("slab", "pencil"),
    kinds: Tuple[str, ...] = ("c2c", "r2c"),
) -> Dict[str, Any]:
    """The ``fft`` bench row (JSON-able; collective over ``comm``)."""
    p = comm.size
    row: Dict[str, Any] = {"case": "fft", "ranks": p, "n": n, "reps": reps, "cases": [],
                           "check": True}
    for decomp in decomps:
        ms = (p,) if decomp == "slab" else _mesh2d(p)
        pl = [Shard(0)] if decomp == "slab" else [Shard(0), Shard(1)]
        mesh = Mesh(comm, ms)
        try:
            for kind in kinds:
                dtype = np.complex128 if kind == "c2c" else np.float64
                name = "fftn" if kind == "c2c" else "rfftn"
                lay = Layout((n, n, n), dtype, ms, pl)
                local = sample_array((n, n, n), np.complex128, lay.box(mesh.coords))
                if kind == "r2c":
                    local = np.ascontiguousarray(local.real)
                x = ShardedArray(local, lay, mesh)
                plan = pf.plan(lay, name, placements="any")
                fwd, y = _time_passes(plan.passes, x, comm, reps, warmup)
                bwd, z = _time_passes(plan.backward_passes, y, comm, reps, warmup)
                err = float(np.max(np.abs(z.local - x.local))) if z.local.size else 0.0
                ok = comm.allreduce(err, op=MPI.MAX) < 1e-10
                row["check"] = row["check"] and ok
                row["cases"].append({
                    "kind": kind, "decomp": decomp, "mesh": list(ms),
                    "placements": [str(q) for q in pl],
                    "result": [str(q) for q in plan.dst.placements],
                    "transposes": plan.transposes,
                    "forward": fwd, "backward": bwd,
                    "per_transform_ms": (fwd["total"] + bwd["total"]) / 2,
                    "round_trip_ok": ok,
                })
                del x, y, z, local
        finally:
            mesh.free()
    if pfft:
        ms = _mesh2d(p)
        row.update(_pfft_row(comm, n, ms, reps, warmup))
        if row.get("pfft_fwd_bwd_ms"):
            for c in row["cases"]:
                if c["kind"] == "c2c" and c["decomp"] == "pencil":
                    c["vs_pfft"] = 2 * c["per_transform_ms"] / row["pfft_fwd_bwd_ms"]
    else:
        row["pfft"] = "not run"
    if batch:
        row["batched"] = _bench_batched(comm, batch, batch_n, reps, warmup)
        row["check"] = row["check"] and row["batched"]["transposes"] == 0
    return row


def _bench_batched(comm: MPI.Comm, batch: int, m: int, reps: int, warmup: int) -> Dict[str, Any]:
    import scipy.fft as sf

    mesh = Mesh(comm, (comm.size,))
    try:
        lay = Layout((batch, m, m), np.complex128, mesh.shape, [Shard(0)])
        shp = lay.local_shape(mesh.coords)
        rng = np.random.default_rng(comm.rank)
        local = rng.standard_normal(shp) + 1j * rng.standard_normal(shp)
        x = ShardedArray(local, lay, mesh)
        plan = pf.plan(lay, "fftn", axes=(1, 2))
        ours: List[float] = []
        ser: List[float] = []
        for _ in range(warmup):
            plan.forward(x)
            sf.fftn(local, axes=(1, 2))
        for _ in range(reps):  # in turn, so that a change in machine load hits both alike
            for fn, into in ((lambda: plan.forward(x), ours),
                             (lambda: sf.fftn(local, axes=(1, 2)), ser)):
                comm.Barrier()
                t0 = time.perf_counter()
                fn()
                into.append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
        t = {"total": float(np.median(ours)) * 1e3}
        serial = float(np.median(ser)) * 1e3
        return {"shape": [batch, m, m], "transposes": plan.transposes, "pyshard_ms": t["total"],
                "serial_scipy_ms": serial, "ratio": t["total"] / serial}
    finally:
        mesh.free()


def format_fft(row: Dict[str, Any]) -> str:
    """Human-readable lines for a :func:`bench_fft` row."""
    n = row["n"]
    lines = [f"fft {n}^3 on {row['ranks']} ranks, median of {row['reps']} (slowest rank, ms)",
             f"{'case':<20}{'mesh':>6}{'fwd':>9}{'(fft':>8}{'+ tr)':>8}{'bwd':>9}{'(fft':>8}"
             f"{'+ tr)':>8}{'per transform':>15}  transposes"]
    for c in row["cases"]:
        f, b = c["forward"], c["backward"]
        lines.append(
            f"{c['kind'] + ' ' + c['decomp']:<20}{'x'.join(map(str, c['mesh'])):>6}"
            f"{f['total']:>9.1f}{f['fft']:>8.1f}{f['transpose']:>8.1f}"
            f"{b['total']:>9.1f}{b['fft']:>8.1f}{b['transpose']:>8.1f}"
            f"{c['per_transform_ms']:>15.1f}  {c['transposes']}"
            + (f"  ({c['vs_pfft']:.2f}x PFFT)" if "vs_pfft" in c else "")
        )
    if row.get("pfft_fwd_bwd_ms"):
        lines.append(f"PFFT c2c pencil fwd+bwd: {row['pfft_fwd_bwd_ms']:.1f} ms ({row['pfft']})")
    else:
        lines.append(f"PFFT: {row.get('pfft')}")
    bt = row.get("batched")
    if bt:
        lines.append(
            f"batched 2-D {'x'.join(map(str, bt['shape']))} complex128, axes (1, 2), batch "
            f"sharded: {bt['pyshard_ms']:.1f} ms, {bt['transposes']} transposes; serial "
            f"scipy.fft of one rank's share {bt['serial_scipy_ms']:.1f} ms ({bt['ratio']:.2f}x)"
        )
    return "\n".join(lines)
