"""Halo and stencil benchmarks: ``python -m pyshard bench --cases halo,stencil``.

``halo``: one ghost-cell update of a 2-D or 3-D grid, in the same run and on the same ranks:

- ``pyshard``: ``HaloArray.update()`` with each method (``persistent`` requests on packed
  buffers; ``p2p``; ``datatype``: MPI subarray datatypes; ``neighbor``: a neighbourhood
  collective; ``shm``: node-shared memory, each ghost cell copied once from its owner), and
  ``auto`` (the default: what :func:`pyshard.route.halo_route` picks);
- ``floor``: raw mpi4py point-to-point of exactly the same bytes, already packed in
  contiguous buffers, to the same peers (one ``Irecv``/``Isend`` per peer each way, then
  ``Waitall``): the MPI floor of this exchange;
- ``copy`` (the copy floor): one strided copy of every ghost cell an update writes (the
  cells its peers send, and its periodic wraps onto itself), from a source array of the same
  shape at the same boxes, as the core copies, within each process, every rank at once: no
  update can go below it on this machine; ``wraps``: the wraps alone, which every method
  copies locally besides its messages (the MPI floor moves only the messages);
- ``mpi4py``: what an expert writes by hand: ``Create_cart``, ``Shift``, numpy slicing into
  contiguous buffers, ``Sendrecv`` per dim and direction, corners by exchanging dim by dim
  with the ghost layers of earlier dims included;
- ``petsc``: PETSc's DMDA ``globalToLocal`` on the same grid and ownership ranges, where
  ``petsc4py`` imports (on the MPI pyshard was built with).

Every column is timed interleaved with the others rep by rep (drift on a shared machine hits
all alike); each time is the median over reps of the slowest rank, each rep a loop of
``--halo-loop`` updates divided by its length, after one untimed loop of each.

``fold`` (every halo row): ``HaloArray.fold()`` (the reverse exchange: the ghost cells summed
into their owners' interiors) against ``update()`` on the same halo array, for the default
method and for ``persistent``, in the same interleaved loop; the same peers and bytes with
the directions swapped, plus the combine (an add per received element instead of a copy).
The target: fold <= 1.1x update.

``stencil``: the heat example (:mod:`pyshard.apps.heat`) per step, blocking (update, then
every cell) against overlapped (start, inner cells, wait, the shell), with the update and the
cell update alone for scale.
"""

from __future__ import annotations

import time
from math import prod
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
from mpi4py import MPI

from .._mpi import library_line
from ..apps.heat import alpha_for, initial, inner_and_shell, step, step_cells
from ..array import distribute, from_local
from ..halo import METHODS
from ..halo_planner import HaloPlan, halo_spec
from ..layout import Layout, Shard
from ..mesh import Mesh
from .timing import median_s, timed

__all__ = [
    "HALO_CASES", "bench_halo", "bench_stencil", "format_halo", "format_stencil", "halo_setup",
]

# (name, global shape, dtype, width, stencil) at full size; --halo-scale divides the extents
HALO_CASES = [
    ("2d-w1", (8192, 8192), "float64", 1, "box"),
    ("2d-w4", (8192, 8192), "float64", 4, "box"),
    ("3d-w2", (384, 384, 384), "float32", 2, "box"),
]


def _slowest(comm: MPI.Comm, fn: Callable[[], object], reps: int, loop: int) -> float:
    """Median over ``reps`` of the slowest rank's time per call of ``fn`` (a loop of
    ``loop`` calls per rep, one warm-up loop first)."""

    def calls() -> None:
        for _ in range(loop):
            fn()

    return median_s(calls, comm, reps, warmup=1) / loop


def _floor(comm: MPI.Comm, plan: Any) -> Callable[[], None]:
    """Pre-packed point-to-point of the plan's messages: the same bytes to the same peers."""
    rbufs = [(r, np.empty(sum(prod(e) for _, e in b) * plan.itemsize, np.uint8))
             for r, _, b in plan.recvs]
    sbufs = [(r, np.ones(sum(prod(e) for _, e in b) * plan.itemsize, np.uint8))
             for r, _, b in plan.sends]

    def run() -> None:
        reqs = [comm.Irecv(buf, source=r, tag=21) for r, buf in rbufs]
        reqs += [comm.Isend(buf, dest=r, tag=21) for r, buf in sbufs]
        MPI.Request.Waitall(reqs)

    return run


def _hand_written(comm: MPI.Comm, mesh_shape: Sequence[int], padded: np.ndarray,
                  width: int, periodic: bool) -> Callable[[], None]:
    """The expert's mpi4py halo update on a Cartesian communicator (even blocks): per grid
    dim and direction, numpy-slice the face into a contiguous buffer and Sendrecv it; dims
    in order, each including the ghost layers of the dims before it, so corners arrive in
    the later phases."""
    nd = padded.ndim
    dims = list(mesh_shape) + [1] * (nd - len(mesh_shape))
    cart = comm.Create_cart(dims=dims, periods=[periodic] * nd, reorder=False)
    w = width
    n = [s - 2 * w for s in padded.shape]
    phases = []
    for d in range(nd):
        lo_src, hi_src = cart.Shift(d, 1)
        rng = [slice(0, s) if e < d else slice(w, w + n[e]) for e, s in enumerate(padded.shape)]

        def face(a: int, b: int, d: int = d, rng: list = rng) -> tuple:
            r = list(rng)
            r[d] = slice(a, b)
            return tuple(r)

        # send my high interior face up, receive my low ghosts from below; then the reverse
        send_hi, recv_lo = face(n[d], n[d] + w), face(0, w)
        send_lo, recv_hi = face(w, 2 * w), face(n[d] + w, n[d] + 2 * w)
        shape = padded[send_hi].shape
        sbuf, rbuf = np.empty(shape, padded.dtype), np.empty(shape, padded.dtype)
        phases.append((lo_src, hi_src, send_hi, recv_lo, send_lo, recv_hi, sbuf, rbuf))

    def run() -> None:
        for lo, hi, send_hi, recv_lo, send_lo, recv_hi, sbuf, rbuf in phases:
            sbuf[...] = padded[send_hi]
            cart.Sendrecv(sbuf, dest=hi, sendtag=31, recvbuf=rbuf, source=lo, recvtag=31)
            if lo != MPI.PROC_NULL:
                padded[recv_lo] = rbuf
            sbuf[...] = padded[send_lo]
            cart.Sendrecv(sbuf, dest=lo, sendtag=32, recvbuf=rbuf, source=hi, recvtag=32)
            if hi != MPI.PROC_NULL:
                padded[recv_hi] = rbuf

    return run


def _petsc(comm: MPI.Comm, shape: Sequence[int], mesh_shape: Sequence[int], layout: Any,
           width: int, periodic: bool, dtype: str) -> Tuple[Optional[Callable[[], None]], str]:
    try:
        from petsc4py import PETSc  # type: ignore[import-not-found]
    except Exception as e:  # noqa: BLE001 - any import failure means "no PETSc row"
        return None, f"petsc4py does not import ({type(e).__name__})"
    if np.dtype(dtype) != np.dtype(PETSc.ScalarType):
        return None, f"PETSc scalars are {np.dtype(PETSc.ScalarType)}, the grid is {dtype}"
    nd = len(shape)
    dims = list(mesh_shape) + [1] * (nd - len(mesh_shape))
    ranges = [layout.table[d][1] if layout.table[d][0] else (shape[d],) for d in range(nd)]
    bt = PETSc.DM.BoundaryType.PERIODIC if periodic else PETSc.DM.BoundaryType.GHOSTED
    da = PETSc.DMDA().create(
        dim=nd, sizes=tuple(shape), proc_sizes=tuple(dims), ownership_ranges=tuple(ranges),
        boundary_type=(bt,) * nd, stencil_type=PETSc.DMDA.StencilType.BOX,
        stencil_width=width, dof=1, comm=PETSc.Comm(comm),
    )
    g, loc = da.createGlobalVec(), da.createLocalVec()
    g.set(1.0)
    return (lambda: da.globalToLocal(g, loc)), "DMDA globalToLocal (BOX)"


def halo_setup(sizes: Sequence[int] = (16, 64, 256), n: int = 8192) -> List[Dict[str, Any]]:
    """One rank's halo plan (2-D ``n x n`` float64, width 1, box stencil, periodic) on
    simulated ``m x m`` meshes, uncached, no MPI: seconds and peers. It grows with the
    neighbours (8 here), not with the ``m * m`` ranks."""
    out = []
    for m in sizes:
        layout = Layout((n, n), "float64", (m, m), [Shard(0), Shard(1)])
        spec = halo_spec(layout, 1, True, True)
        reps = 20
        t0 = time.perf_counter()
        for _ in range(reps):
            p = HaloPlan(layout, spec, (m // 2, m // 3))
        out.append({"ranks": m * m, "setup_s": (time.perf_counter() - t0) / reps,
                    "peers": len(p.peers)})
    return out


def _copy_floor(h: Any, wraps_only: bool = False) -> Callable[[], None]:
    """The copy floor: one strided copy of every ghost cell ``h``'s update writes: the cells
    its peers send, from a source array of the same shape at the same boxes (another
    process's array, in the exchange), and its periodic wraps onto itself within one array
    (as every method copies them); ``wraps_only``: the wraps alone. Copied as the core copies
    wraps: boxes of one shape in one walk."""
    from .. import _core

    p = h.plan
    shape = list(p.padded_shape)
    wraps = _core.HaloGeometry(p.itemsize, shape, [], [],
                               [(list(s), list(t), list(e)) for s, t, e in p.local])
    recv = _core.HaloGeometry(p.itemsize, shape, [], [], [
        (list(s), list(s), list(e)) for _, _, bs in p.recvs for s, e in bs
    ])
    src = np.ones(p.padded_shape, h.padded.dtype)
    dst = np.zeros_like(src)
    if wraps_only:
        return lambda: _core.halo_copy_local(wraps, dst, dst)

    def run() -> None:
        _core.halo_copy_local(recv, src, dst)
        _core.halo_copy_local(wraps, dst, dst)

    return run


def _interleaved(comm: MPI.Comm, fns: Dict[str, Callable[[], object]], reps: int,
                 loop: int) -> Dict[str, float]:
    """Seconds per call of each of ``fns`` (the slowest rank, median over ``reps``), timed
    round-robin rep by rep after one untimed loop of each."""

    def looped(fn: Callable[[], object]) -> Callable[[], None]:
        def run() -> None:
            for _ in range(loop):
                fn()

        return run

    runs = {k: looped(f) for k, f in fns.items()}
    for r in runs.values():
        r()
    t: Dict[str, List[float]] = {k: [] for k in runs}
    for _ in range(reps):
        for k, r in runs.items():
            t[k] += timed(r, comm, 1, 0)
    return {k: float(np.median(v)) / loop for k, v in t.items()}


def bench_halo(comm: MPI.Comm, scale: int = 1, reps: int = 5, loop: int = 20,
               cases: Optional[Sequence[str]] = None,
               shape: Optional[Sequence[int]] = None) -> Dict[str, Any]:
    """Time every halo case (see the module doc); collective over ``comm``. ``shape``: one
    grid of that shape (2-D or 3-D, width 1, not scaled by ``scale``) instead of the
    built-in cases."""
    rows: List[Dict[str, Any]] = []
    todo = list(HALO_CASES)
    given = shape is not None
    if shape is not None:
        todo = [(f"{len(shape)}d-w1", tuple(shape), "float64", 1, "box")]
    for name, full, dtype, width, stencil in todo:
        if cases and name not in cases:
            continue
        # the built-in grids scaled; a grid the caller gave runs as given
        shape = tuple(full) if given else tuple(max(2 * width, n // scale) for n in full)
        mesh_shape = tuple(MPI.Compute_dims(comm.size, 2))
        mesh = Mesh(comm, mesh_shape)
        placements = [Shard(0), Shard(1)]
        layout = Layout(shape, dtype, mesh_shape, placements)
        local = np.ones(layout.local_shape(mesh.coords), dtype)
        x = from_local(local, mesh, placements, global_shape=shape)
        even = all(n % m == 0 for n, m in zip(shape[:2], mesh_shape))
        corners = stencil == "box"
        notes: Dict[str, str] = {}
        fns: Dict[str, Callable[[], object]] = {}
        halos = {}
        for method in METHODS + ("auto",):
            h = halos[method] = x.with_halo(width, periodic=True, corners=corners, method=method)
            fns[f"pyshard-{method}"] = h.update
        h = halos["auto"]
        fns["floor"] = _floor(comm, h.plan)
        fns["copy"] = _copy_floor(h)
        fns["wraps"] = _copy_floor(h, wraps_only=True)
        if even:
            fns["mpi4py"] = _hand_written(comm, mesh_shape, h.padded.copy(), width, True)
        else:
            notes["mpi4py"] = "uneven blocks: the hand-written version assumes even ones"
        fn, why = _petsc(comm, shape, mesh_shape, x.layout, width, True, dtype)
        if fn is not None:
            fns["petsc"] = fn
        notes["petsc"] = why
        # fold against update on the same arrays (the default method's and persistent's)
        fns["fold"] = halos["auto"].fold
        fns["fold-persistent"] = halos["persistent"].fold
        times = _interleaved(comm, fns, reps, loop)
        times["update"] = times["pyshard-auto"]
        times["update-persistent"] = times["pyshard-persistent"]
        best = min(times[f"pyshard-{m}"] for m in METHODS)
        auto = times["pyshard-auto"]
        rows.append({
            "name": name, "shape": list(shape), "dtype": dtype, "width": width,
            "stencil": stencil, "mesh": list(mesh_shape), "times_s": times, "notes": notes,
            "peers": len(h.plan.peers), "bytes_per_rank": h.plan.recv_bytes,
            "auto_method": halos["auto"].chosen,
            "vs_floor": best / times["floor"],
            "auto_vs_floor": auto / times["floor"],
            "auto_vs_copy": auto / times["copy"],
            "vs_mpi4py": best / times["mpi4py"] if "mpi4py" in times else None,
            "vs_petsc": best / times["petsc"] if "petsc" in times else None,
            "fold_method": halos["auto"].fold_chosen,
            "fold_vs_update": times["fold"] / times["update"],
            "fold_vs_update_persistent": times["fold-persistent"] / times["update-persistent"],
        })
        del halos, h, fns
        mesh.free()
    return {"case": "halo", "ranks": comm.size,
            "mpi": library_line(), "rows": rows,
            "setup": halo_setup()}


def _time_steps(comm: MPI.Comm, x: Any, stencil: str, steps: int, reps: int,
                method: Optional[str] = None) -> Dict[str, Any]:
    a = x.with_halo(1, periodic=True, corners=stencil == "box", method=method)
    b = x.with_halo(1, periodic=True, corners=stencil == "box", method=method)
    alpha = alpha_for(x.layout.ndim, stencil)
    inner, shell = inner_and_shell(a.interior.shape)
    whole = [slice(0, k) for k in a.interior.shape]
    regions = (inner, shell, whole)
    fns = {
        "blocking": lambda: step(a, b, stencil, alpha, False, regions),
        "overlapped": lambda: step(a, b, stencil, alpha, True, regions),
        "update": a.update,
        "cells": lambda: step_cells(a.padded, b.interior, whole, stencil, alpha),
    }
    t: Dict[str, List[float]] = {k: [] for k in fns}
    for _ in range(2 * reps):  # interleaved: drift on a shared machine hits all alike
        for k, fn in fns.items():
            t[k].append(_slowest(comm, fn, 1, steps))
    med = {k: float(np.median(v)) for k, v in t.items()}
    return {"blocking_s": med["blocking"], "overlapped_s": med["overlapped"],
            "update_s": med["update"], "cells_s": med["cells"],
            "ratio": med["overlapped"] / med["blocking"],
            "halo_share": med["update"] / med["blocking"], "method": a.chosen}


def bench_stencil(comm: MPI.Comm, n: int = 2048, steps: int = 20, reps: int = 3,
                  dim: int = 2, shape: Optional[Sequence[int]] = None) -> Dict[str, Any]:
    """Heat steps on an ``n^dim`` grid (or ``shape``; mesh ``MPI.Compute_dims(ranks,
    ndim)``), periodic: per step, blocking (update, then every cell) against overlapped
    (start, inner cells, wait, shell), and the halo update and the cell update alone; the
    four interleaved on the same arrays, each the median over ``2 * reps`` loops of
    ``steps`` steps of the slowest rank."""
    shape = tuple(shape) if shape is not None else (n,) * dim
    mesh = Mesh(comm, tuple(MPI.Compute_dims(comm.size, len(shape))))
    out: Dict[str, Any] = {"case": "stencil", "ranks": comm.size, "shape": list(shape),
                           "mesh": list(mesh.shape), "steps": steps}
    x = distribute(initial(shape), mesh, [Shard(d) for d in range(mesh.ndim)])
    for stencil in ("star", "box"):  # the default (auto) path, and MPI's persistent requests
        out[stencil] = _time_steps(comm, x, stencil, steps, reps)
        out[f"{stencil}-persistent"] = _time_steps(comm, x, stencil, steps, reps, "persistent")
    mesh.free()
    return out


def format_halo(r: Dict[str, Any]) -> str:
    lines = [f"halo updates, {r['ranks']} ranks ({r['mpi']}); us per update, slowest rank"]
    names = list(METHODS) + ["auto", "floor", "copy", "wraps", "mpi4py", "petsc"]
    cols = [f"pyshard-{m}" for m in METHODS + ("auto",)] + names[len(METHODS) + 1:]
    lines.append(f"{'case':<8}{'shape':<16}{'w':>3}" + "".join(f"{c:>11}" for c in names)
                 + f"{'auto/floor':>11}{'auto/copy':>10}{'best/mpi4py':>12}")
    for row in r["rows"]:
        t = row["times_s"]
        cells = "".join(f"{t[c] * 1e6:>11.1f}" if c in t else f"{'-':>11}" for c in cols)
        mp = f"{row['vs_mpi4py']:.2f}x" if row["vs_mpi4py"] else "-"
        lines.append(
            f"{row['name']:<8}{'x'.join(map(str, row['shape'])):<16}{row['width']:>3}{cells}"
            f"{row['auto_vs_floor']:>10.2f}x{row['auto_vs_copy']:>9.2f}x{mp:>12}"
        )
        lines.append(f"        auto took {row.get('auto_method')}")
        if "petsc" not in t:
            lines.append(f"        petsc: {row['notes'].get('petsc', '')}")
        if "fold" in t:
            lines.append(
                f"        fold {t['fold'] * 1e6:.1f} us vs update {t['update'] * 1e6:.1f} us "
                f"on the same array ({row.get('fold_method')}): "
                f"{row['fold_vs_update']:.2f}x; persistent: "
                f"{row['fold_vs_update_persistent']:.2f}x"
            )
    lines.append("one rank's halo plan on simulated meshes (no MPI): " + ", ".join(
        f"{s['ranks']} ranks {s['setup_s'] * 1e3:.2f} ms ({s['peers']} peers)"
        for s in r.get("setup", ())))
    return "\n".join(lines)


def format_stencil(r: Dict[str, Any]) -> str:
    lines = [f"heat stencil {'x'.join(map(str, r['shape']))} on mesh "
             f"{'x'.join(map(str, r['mesh']))}, {r['steps']} steps; ms per step"]
    for s in ("star", "box", "star-persistent", "box-persistent"):
        v = r.get(s)
        if v is None:
            continue
        lines.append(f"  {s:<16} blocking {v['blocking_s'] * 1e3:8.3f}  overlapped "
                     f"{v['overlapped_s'] * 1e3:8.3f}  ratio {v['ratio']:.3f}  (update alone "
                     f"{v['update_s'] * 1e3:.3f}, cells alone {v['cells_s'] * 1e3:.3f}; "
                     f"halo {v.get('halo_share', 0) * 100:.0f}% of a blocking step, "
                     f"{v.get('method')})")
    return "\n".join(lines)
