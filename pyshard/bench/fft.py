"""The ``fft`` bench case: :mod:`pyshard.fft` on 3-D arrays, c2c (``fftn``/``ifftn``) and r2c
(``rfftn``/``irfftn``), slab (a 1-D mesh, ``[Shard(0)]``) and pencil (a 2-D mesh,
``[Shard(0), Shard(1)]``), forward and backward (``plan.backward``), with every installed
local-transform backend (``PYSHARD_FFT_BACKEND``: scipy, pyfftw, pyfftw-measure), in the same
run as mpi4py-fft's ``PFFT`` on the same grid (``grid=(P,)`` slab, ``(P0, P1, 1)`` pencil), the
same ranks and axes, with its FFTW backend (``backend="fftw"``, FFTW_MEASURE plans) and its
numpy backend, when mpi4py_fft imports (``pip install mpi4py-fft`` after ``apt-get install
libfftw3-dev``; it is skipped cleanly otherwise); and a batched 2-D transform (``B x M x M``
complex128 over axes (1, 2), the batch axis sharded: no transpose) against serial
``scipy.fft.fftn`` of one rank's share and PFFT on the same slabs.

Every implementation runs once per repetition in turn (forward, then backward), so a change in
machine load hits all alike; times are medians over ``reps`` of the slowest rank (a barrier
before each run): ``total`` is the whole call, ``fft`` and ``transpose`` the slowest rank's
sums of its local transforms and of its transposes within that call (PFFT: its serial
transform objects and its ``Transfer`` objects, called in the order ``PFFT.forward`` calls
them). ``mpi_floor``: pyshard's transposes of the call as raw MPI collectives (mpi4py, the
same per-peer bytes from pre-packed buffers: :class:`~pyshard.bench.floors.HostReference`);
what a transpose takes beyond it is packing and unpacking (copies).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
from mpi4py import MPI

from .. import collectives, config
from .. import fft as pf
from ..array import ShardedArray
from ..layout import Layout, Shard
from ..mesh import Mesh
from .fft3d import sample_array
from .floors import HostReference

__all__ = ["bench_fft", "format_fft", "pyshard_backends"]

Times = Dict[str, float]  # total, fft, transpose (ms)


def _mesh2d(p: int) -> Tuple[int, int]:
    a, b = MPI.Compute_dims(p, 2)
    return int(a), int(b)


def pyshard_backends() -> List[str]:
    """The local-transform backends that import here: scipy, and pyfftw and pyfftw-measure
    where pyFFTW imports (numpy.fft is the same pocketfft as scipy's, one axis per call)."""
    out = ["scipy"]
    try:
        import pyfftw  # noqa: F401

        out += ["pyfftw", "pyfftw-measure"]
    except Exception:  # ImportError, or a broken build
        pass
    return out


def _slowest(comm: MPI.Comm, t: Sequence[float]) -> List[float]:
    out = collectives.max_all_array(comm, np.asarray(t, dtype=np.float64))
    return [float(v) for v in out]


class _Ours:
    """pyshard.fft's plan on one backend: ``run(direction)`` -> [total, fft, transpose] s."""

    def __init__(self, backend: str, plan: Any, x: ShardedArray, keep: bool = True) -> None:
        self.name = f"pyshard-{backend}"
        self.keep = keep  # keep the forward's result (for the backward)
        self.backend = backend
        self.plan = plan
        self.x = x
        self.y: Optional[ShardedArray] = None
        self.z: Optional[ShardedArray] = None

    def run(self, direction: str) -> List[float]:
        times = [0.0, 0.0]
        with config.override(PYSHARD_FFT_BACKEND=self.backend):
            t0 = time.perf_counter()
            if direction == "forward" or self.y is None:
                y = pf.run_passes(self.plan.passes, self.x, None, None, 2, None, None, times)
                dt = time.perf_counter() - t0
                self.y = y if self.keep else None
                del y
            else:
                self.z = pf.run_passes(
                    self.plan.backward_passes, self.y, None, None, 2, None, None, times
                )
                dt = time.perf_counter() - t0
        return [dt, times[0], times[1]]

    def round_trip_error(self) -> float:
        if self.z is None or self.z.local.size == 0:
            return 0.0
        return float(np.max(np.abs(self.z.local - self.x.local)))

    def free(self) -> None:
        self.y = self.z = None


class _Pfft:
    """mpi4py-fft's PFFT on one backend, its forward and backward run as ``PFFT.forward``
    and ``PFFT.backward`` run them (serial transform, Transfer, serial transform, ...),
    each part timed."""

    def __init__(
        self,
        PFFT: Any,
        comm: MPI.Comm,
        shape: Tuple[int, ...],
        grid: Tuple[int, ...],
        dtype: Any,
        backend: str,
        axes: Optional[Tuple[int, ...]],
        box: Callable[[Any], np.ndarray],
    ) -> None:
        self.name = f"pfft-{backend}"
        kw: Dict[str, Any] = {} if axes is None else {"axes": axes}
        with np.errstate(all="ignore"):  # it plans on uninitialised arrays
            self.p = PFFT(comm, shape, grid=grid, dtype=dtype, backend=backend, **kw)
        self.u = self.p.forward.input_array
        # the same values as pyshard's input: PFFT's input box on this rank
        self.u[...] = box(self.p.local_slice(False))
        self.u0 = self.u.copy()

    def _run(self, direction: str) -> List[float]:
        # what PFFT.forward / PFFT.backward run (mpi4py_fft.mpifft.Transform), in its order:
        # the serial transforms and Transfer objects of PFFT.xfftn and PFFT.transfer
        ff = [getattr(o, direction) for o in self.p.xfftn]
        tt = [getattr(o, direction) for o in self.p.transfer]
        if direction == "backward":
            ff, tt = ff[::-1], tt[::-1]
        tf = tx = 0.0
        t0 = time.perf_counter()
        for i in range(len(tt)):
            a = time.perf_counter()
            ff[i]()
            b = time.perf_counter()
            tt[i](ff[i].output_array, ff[i + 1].input_array)
            tf += b - a
            tx += time.perf_counter() - b
        a = time.perf_counter()
        ff[-1]()
        tf += time.perf_counter() - a
        return [time.perf_counter() - t0, tf, tx]

    def run(self, direction: str) -> List[float]:
        if direction == "forward":
            self.p.forward.input_array[...] = self.u0  # its c2r may have destroyed it
        else:
            self.p.backward.input_array[...] = self.p.forward.output_array
        return self._run(direction)

    def round_trip_error(self) -> float:
        back = self.p.backward.output_array
        return float(np.max(np.abs(back - self.u0))) if back.size else 0.0

    def free(self) -> None:
        self.p.destroy()


def import_pfft() -> Tuple[Any, str]:
    try:
        import mpi4py_fft
        from mpi4py_fft import PFFT
    except Exception as e:  # ImportError, or a broken build
        return None, f"mpi4py_fft does not import ({type(e).__name__}: {e})"
    return PFFT, f"mpi4py-fft {getattr(mpi4py_fft, '__version__', '?')}"


def _pfft_impls(
    comm: MPI.Comm,
    backends: Sequence[str],
    shape: Tuple[int, ...],
    grid: Tuple[int, ...],
    dtype: Any,
    axes: Optional[Tuple[int, ...]],
    box: Callable[[Any], np.ndarray],
) -> Tuple[List[_Pfft], Dict[str, str]]:
    """PFFT on each backend that builds on every rank; (implementations, why per backend)."""
    PFFT, why = import_pfft()
    out: List[_Pfft] = []
    notes: Dict[str, str] = {}
    if not collectives.all_true(comm, PFFT is not None):
        for b in backends:
            notes[f"pfft-{b}"] = why if PFFT is None else "mpi4py_fft does not import everywhere"
        return out, notes
    for b in backends:
        try:
            impl: Optional[_Pfft] = _Pfft(PFFT, comm, shape, grid, dtype, b, axes, box)
            err = ""
        except Exception as e:  # a backend that is not built (pyfftw, mkl_fft missing)
            impl, err = None, f"{type(e).__name__}: {e}"
        if collectives.all_true(comm, impl is not None):
            out.append(impl)  # type: ignore[arg-type]
            notes[f"pfft-{b}"] = why
        else:
            if impl is not None:
                impl.free()
            notes[f"pfft-{b}"] = f"PFFT(backend={b!r}) failed: {err or 'on another rank'}"
    return out, notes


def _interleaved(
    comm: MPI.Comm, impls: Sequence[Any], reps: int, warmup: int
) -> Dict[str, Dict[str, Times]]:
    """Each implementation's median forward and backward (total, fft, transpose) ms, run in
    turn within every repetition."""
    raw: Dict[str, Dict[str, List[List[float]]]] = {
        i.name: {"forward": [], "backward": []} for i in impls
    }
    for r in range(warmup + reps):
        for impl in impls:
            for d in ("forward", "backward"):
                collectives.barrier(comm)
                t = _slowest(comm, impl.run(d))
                if r >= warmup:
                    raw[impl.name][d].append(t)
    out: Dict[str, Dict[str, Times]] = {}
    for name, dirs in raw.items():
        out[name] = {}
        for d, ts in dirs.items():
            med = np.median(np.asarray(ts), axis=0) * 1e3
            out[name][d] = {
                "total": float(med[0]),
                "fft": float(med[1]),
                "transpose": float(med[2]),
            }
    return out


def _mpi_floor(comm: MPI.Comm, passes: Sequence[Any], x: ShardedArray, reps: int) -> float:
    """ms: the slowest rank's sum over the transposes in ``passes`` of the fastest raw MPI
    collective that moves the same bytes (median of ``reps``)."""
    total = 0.0
    local = x.local
    mesh = x.mesh
    for p in passes:
        if getattr(p, "plan", None) is None or not p.plan.steps:  # a local pass, or no move
            continue
        for step in p.plan.steps:
            src = np.zeros(step.src.local_shape(mesh.coords), step.src.dtype)
            ref = HostReference(step, mesh, src)
            best = None
            for fn in ref.floors.values():
                ts = []
                for _ in range(reps + 1):
                    collectives.barrier(comm)
                    t0 = time.perf_counter()
                    fn()
                    ts.append(collectives.max_all(comm, time.perf_counter() - t0))
                m = float(np.median(ts[1:]))
                best = m if best is None else min(best, m)
            total += best or 0.0
    del local
    return total * 1e3


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
    backends: Optional[Sequence[str]] = None,
    pfft_backends: Sequence[str] = ("fftw", "numpy"),
    progress: Optional[Callable[[Dict[str, Any]], None]] = None,
) -> Dict[str, Any]:
    """The ``fft`` bench row (JSON-able; collective over ``comm``). ``backends``: pyshard's
    local-transform backends to run (default :func:`pyshard_backends`); ``pfft_backends``:
    PFFT's (``pfft=False`` or empty: none); ``progress(row)`` is called after each case."""
    p = comm.size
    backends = list(backends) if backends is not None else pyshard_backends()
    pfft_backends = list(pfft_backends) if pfft else []
    row: Dict[str, Any] = {
        "case": "fft",
        "ranks": p,
        "n": n,
        "reps": reps,
        "cases": [],
        "check": True,
        "backends": backends,
        "default": pf.backend(),
        "pfft_backends": pfft_backends,
    }
    for decomp in decomps:
        ms = (p,) if decomp == "slab" else _mesh2d(p)
        pl = [Shard(0)] if decomp == "slab" else [Shard(0), Shard(1)]
        grid = (p,) if decomp == "slab" else (*ms, 1)
        mesh = Mesh(comm, ms)
        try:
            for kind in kinds:
                dtype = np.complex128 if kind == "c2c" else np.float64
                name = "fftn" if kind == "c2c" else "rfftn"
                shape = (n, n, n)
                lay = Layout(shape, dtype, ms, pl)

                def box(sl: Any, kind: str = kind, shape: Tuple[int, ...] = shape) -> np.ndarray:
                    a = sample_array(shape, np.complex128, tuple(sl))
                    return a if kind == "c2c" else np.ascontiguousarray(a.real)

                x = ShardedArray(box(lay.box(mesh.coords)), lay, mesh)
                plan = pf.plan(lay, name, placements="any")
                impls: List[Any] = [_Ours(b, plan, x) for b in backends]
                more, notes = _pfft_impls(comm, pfft_backends, shape, grid, dtype, None, box)
                impls += more
                res = _interleaved(comm, impls, reps, warmup)
                errs = {i.name: collectives.max_all(comm, i.round_trip_error()) for i in impls}
                ok = all(e < 1e-9 for e in errs.values())
                row["check"] = row["check"] and ok
                for i in impls:
                    res[i.name]["per_transform_ms"] = (  # type: ignore[assignment]
                        res[i.name]["forward"]["total"] + res[i.name]["backward"]["total"]
                    ) / 2
                floor = {"forward": _mpi_floor(comm, plan.passes, x, reps)}
                y = impls[0].y
                floor["backward"] = _mpi_floor(comm, plan.backward_passes, y, reps)
                default = res.get(f"pyshard-{pf.backend()}") or res[impls[0].name]
                case: Dict[str, Any] = {
                    "kind": kind,
                    "decomp": decomp,
                    "mesh": list(ms),
                    "placements": [str(q) for q in pl],
                    "result": [str(q) for q in plan.dst.placements],
                    "transposes": plan.transposes,
                    "forward": default["forward"],
                    "backward": default["backward"],
                    "per_transform_ms": default["per_transform_ms"],
                    "impls": res,
                    "errors": errs,
                    "notes": notes,
                    "mpi_floor_ms": floor,
                    "round_trip_ok": ok,
                }
                ours = [k for k in res if k.startswith("pyshard-")]
                best = min(ours, key=lambda k: res[k]["per_transform_ms"])  # type: ignore[arg-type,return-value]
                case["best"] = best
                for ref in ("pfft-fftw", "pfft-numpy"):
                    if ref in res:
                        case[f"vs_{ref}"] = {
                            "per_transform": res[best]["per_transform_ms"]
                            / res[ref]["per_transform_ms"],  # type: ignore[operator]
                            "transpose": sum(
                                res[best][d]["transpose"] for d in ("forward", "backward")
                            )
                            / sum(res[ref][d]["transpose"] for d in ("forward", "backward")),
                        }
                row["cases"].append(case)
                for impl in impls:
                    impl.free()
                del x, impls, more, y, impl
                if progress is not None:
                    progress(row)
        finally:
            mesh.free()
    if batch:
        row["batched"] = _bench_batched(comm, batch, batch_n, reps, warmup, backends, pfft_backends)
        if progress is not None:
            progress(row)
        row["check"] = row["check"] and row["batched"]["transposes"] == 0
    return row


class _Serial:
    """Serial scipy.fft.fftn (or pyfftw's) of one rank's share, as a user without pyshard
    would call it (a fresh result each call)."""

    def __init__(self, name: str, fn: Callable[[], Any]) -> None:
        self.name = name
        self.fn = fn
        self.y: Any = None

    def run(self, direction: str) -> List[float]:
        if direction == "backward":
            return [0.0, 0.0, 0.0]
        t0 = time.perf_counter()
        self.fn()
        dt = time.perf_counter() - t0
        return [dt, dt, 0.0]

    def free(self) -> None:
        self.y = None


def _bench_batched(
    comm: MPI.Comm,
    batch: int,
    m: int,
    reps: int,
    warmup: int,
    backends: Sequence[str],
    pfft_backends: Sequence[str],
) -> Dict[str, Any]:
    import scipy.fft as sf

    mesh = Mesh(comm, (comm.size,))
    shape = (batch, m, m)
    try:
        lay = Layout(shape, np.complex128, mesh.shape, [Shard(0)])

        def box(sl: Any) -> np.ndarray:
            sl = tuple(sl)
            rng = np.random.default_rng(sl[0].start)
            shp = tuple(s.stop - s.start for s in sl)
            return rng.standard_normal(shp) + 1j * rng.standard_normal(shp)

        local = box(lay.box(mesh.coords))
        x = ShardedArray(local, lay, mesh)
        plan = pf.plan(lay, "fftn", axes=(1, 2))
        serial = _Serial("serial-scipy", lambda: sf.fftn(local, axes=(1, 2)))
        ours: List[Any] = [_Ours(b, plan, x, keep=False) for b in backends]
        # memory: one group per PFFT backend (PFFT holds ~4 copies of the share), each
        # interleaving it with pyshard's fastest backend and the serial call
        res = _interleaved(comm, ours + [serial], reps, warmup)
        groups = {"pyshard": sorted(res)}
        first = min(ours, key=lambda o: res[o.name]["forward"]["total"])
        notes: Dict[str, str] = {}
        for pb in pfft_backends:
            more, why = _pfft_impls(comm, [pb], shape, (comm.size,), np.complex128, (1, 2), box)
            notes.update(why)
            if more:
                sub = _interleaved(comm, [first, serial] + more, reps, warmup)
                res[more[0].name] = sub[more[0].name]
                res[f"{first.name} (beside {more[0].name})"] = sub[first.name]
                res[f"serial-scipy (beside {more[0].name})"] = sub["serial-scipy"]
                groups[more[0].name] = sorted(sub)
                for impl in more:
                    impl.free()
                del more
        fwd = {k: v["forward"]["total"] for k, v in res.items()}
        best = min(backends, key=lambda b: fwd[f"pyshard-{b}"])
        out = {
            "shape": list(shape),
            "transposes": plan.transposes,
            "forward_ms": fwd,
            "split": {k: v["forward"] for k, v in res.items()},
            "notes": notes,
            "groups": groups,
            "best": f"pyshard-{best}",
            "pyshard_ms": fwd[f"pyshard-{best}"],
            "serial_scipy_ms": fwd["serial-scipy"],
            "ratio": fwd[f"pyshard-{best}"] / fwd["serial-scipy"],
        }
        return out
    finally:
        mesh.free()


def format_fft(row: Dict[str, Any]) -> str:
    """Human-readable lines for a :func:`bench_fft` row."""
    n = row["n"]
    lines = [
        f"fft {n}^3 on {row['ranks']} ranks, median of {row['reps']} (slowest rank, ms; "
        f"implementations run in turn; default backend {row.get('default')})",
        f"{'case':<14}{'mesh':>6} {'implementation':<22}{'fwd':>8}{'(fft':>8}{'+ tr)':>8}"
        f"{'bwd':>8}{'(fft':>8}{'+ tr)':>8}{'per transform':>15}",
    ]
    for c in row["cases"]:
        label = f"{c['kind']} {c['decomp']}"
        mesh = "x".join(map(str, c["mesh"]))
        for name, r in c["impls"].items():
            f, b = r["forward"], r["backward"]
            lines.append(
                f"{label:<14}{mesh:>6} {name:<22}{f['total']:>8.1f}{f['fft']:>8.1f}"
                f"{f['transpose']:>8.1f}{b['total']:>8.1f}{b['fft']:>8.1f}{b['transpose']:>8.1f}"
                f"{r['per_transform_ms']:>15.1f}"
            )
        fl = c["mpi_floor_ms"]
        extra = [
            f"{c['transposes']} transposes; MPI floor of pyshard's transposes "
            f"fwd {fl['forward']:.1f} bwd {fl['backward']:.1f}; best {c['best']}"
        ]
        for ref in ("pfft-fftw", "pfft-numpy"):
            v = c.get(f"vs_{ref}")
            if v:
                extra.append(
                    f"{v['per_transform']:.2f}x {ref} per transform, "
                    f"{v['transpose']:.2f}x its transposes"
                )
        for k, why in c.get("notes", {}).items():
            if not why.startswith("mpi4py-fft "):
                extra.append(f"{k}: {why}")
        lines.append(f"{'':<20}" + "; ".join(extra))
    bt = row.get("batched")
    if bt:
        lines.append(
            f"batched 2-D {'x'.join(map(str, bt['shape']))} complex128, axes (1, 2), batch "
            f"sharded, {bt['transposes']} transposes; forward ms: "
            + ", ".join(f"{k} {v:.1f}" for k, v in bt["forward_ms"].items())
            + f"; best pyshard {bt['best']} / serial scipy of one rank's share "
            f"{bt['ratio']:.2f}x"
        )
    return "\n".join(lines)
