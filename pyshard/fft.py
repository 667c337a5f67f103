"""Distributed FFTs and real-to-real transforms of the GLOBAL array of a ShardedArray.

The names and arguments are numpy.fft's and scipy.fft's: :func:`fftn`, :func:`ifftn`,
:func:`rfftn`, :func:`irfftn` (``s``, ``axes``, ``norm``), their 1-D and 2-D forms
(:func:`fft`, :func:`ifft`, :func:`rfft`, :func:`irfft`, :func:`fft2`, :func:`ifft2`,
:func:`rfft2`, :func:`irfft2`) and :func:`dctn`, :func:`idctn`, :func:`dstn`, :func:`idstn`
(``type`` 1-4, ``s``, ``axes``, ``norm``; 1-D :func:`dct`, :func:`idct`, :func:`dst`,
:func:`idst`). Each takes ``placements=None, sizes=None`` for the result's layout and returns a
new :class:`~pyshard.ShardedArray`.

How a transform runs (:func:`plan`, pure Python, cached like redistribution plans): every
transformed axis that is whole on each rank (no mesh dim shards it) is transformed locally
(one scipy.fft call for all of them); for each transformed axis still sharded, one pyshard
redistribute moves its Shard onto an axis that is done or a batch axis, on the same mesh dims
(one exchange on that sub-communicator), and so on; at the end one redistribute to the
requested layout unless ``placements="any"``. ``rfftn`` transforms its last axis first (real
to complex), ``irfftn`` last. ``s=`` pads or truncates an axis when it is whole. Replicate
mesh dims just compute; ``Partial("sum")`` and ``Partial("avg")`` inputs stay Partial (every
transform here is linear); ``Partial("max"/"min")`` are reduced first (Replicate in the
result's default placements).

Result layout: ``placements=None`` keeps the input's placements, and its shard extents
along every axis whose length does not change (rfftn's last axis, ``s=`` axes are balanced).
``placements="any"``: the layout the last pass ended in (fewest transposes, like FFTW-MPI's
``TRANSPOSED_OUT``); ``.placements``/``.box`` of the result say where the data is, and
``plan(...).backward`` returns to the input layout with no extra moves.

Repeated axes raise ``ValueError`` (as scipy.fft does; numpy transforms twice).
Local transforms: scipy.fft where scipy is installed (``workers=`` passed through), else
numpy.fft (DCT/DST then raise ImportError); pyFFTW for the c2c and r2c/c2r passes where
``PYSHARD_FFT_BACKEND`` names it (:func:`backend`); cupy arrays go through cupyx.scipy.fft.
"""

from __future__ import annotations

import inspect
import logging
import numbers
import os
import time
from math import prod
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _backend as bk
from . import _dtypes, _validate, config
from ._cache import memoize
from .array import ShardedArray
from .executor import POOL_MIN_BYTES, allocate, executors, pooled_empty, run_steps
from .layout import Layout, Partial, Placement, Replicate, Shard, check_placements
from .plan import Plan
from .plan import plan as _rplan

try:  # pragma: no cover - depends on the environment
    import scipy.fft as _sfft
except ImportError:  # pragma: no cover
    _sfft = None

# numpy >= 2: numpy.fft takes out= (rfft/irfft write straight into pooled memory)
_NP_OUT = "out" in inspect.signature(np.fft.rfft).parameters

try:
    from numpy.exceptions import AxisError
except ImportError:  # pragma: no cover - numpy < 1.25
    AxisError = np.AxisError  # type: ignore[attr-defined,misc]

__all__ = [
    "FFTPlan",
    "backend",
    "dct",
    "dctn",
    "dst",
    "dstn",
    "fft",
    "fft2",
    "fftn",
    "idct",
    "idctn",
    "idst",
    "idstn",
    "ifft",
    "ifft2",
    "ifftn",
    "irfft",
    "irfft2",
    "irfftn",
    "plan",
    "rfft",
    "rfft2",
    "rfftn",
    "tune_mesh",
]

log = logging.getLogger("pyshard.fft")

KINDS = ("fftn", "ifftn", "rfftn", "irfftn", "dctn", "idctn", "dstn", "idstn")
INVERSE = {
    "fftn": "ifftn",
    "ifftn": "fftn",
    "rfftn": "irfftn",
    "irfftn": "rfftn",
    "dctn": "idctn",
    "idctn": "dctn",
    "dstn": "idstn",
    "idstn": "dstn",
}
_NORMS = (None, "backward", "ortho", "forward")
_R2R = ("dctn", "idctn", "dstn", "idstn")
PlacementsOut = Union[None, str, Sequence[Placement]]
SizesOut = Optional[Dict[int, Sequence[int]]]

# ----------------------------------------------------------------------------- dtypes


def _real_prec(dt: np.dtype) -> np.dtype:
    """The real working dtype of ``dt``: single for float16/bfloat16/float32/complex64,
    long double for long doubles, double for everything else (ints, bool)."""
    if _dtypes.is_ml(dt):
        return np.dtype(np.float32)
    if dt.kind in "fc":
        if dt.kind == "f" and dt.itemsize <= 4 or dt.kind == "c" and dt.itemsize <= 8:
            return np.dtype(np.float32)
        if dt.kind == "f" and dt.itemsize > 8 or dt.kind == "c" and dt.itemsize > 16:
            return np.dtype(np.longdouble)
    return np.dtype(np.float64)


def _cplx(dt: np.dtype) -> np.dtype:
    return np.result_type(_real_prec(dt), np.complex64)


def _out_dtype(func: str, dt: np.dtype) -> np.dtype:
    """The dtype a local pass ``func`` gives for input ``dt``."""
    if func in ("fftn", "ifftn", "rfft"):
        return _cplx(dt)
    if func == "irfft":
        return _real_prec(dt)
    return _cplx(dt) if dt.kind == "c" else _real_prec(dt)  # DCT/DST keep real or complex


def _in_dtype(func: str, dt: np.dtype) -> np.dtype:
    """The dtype the local array is cast to before ``func`` runs on it."""
    if func == "irfft":
        return _cplx(dt)
    if func == "rfft":
        return _real_prec(dt)
    return _cplx(dt) if dt.kind == "c" else _real_prec(dt)


# ----------------------------------------------------------------------------- backends


_PYFFTW: Any = None  # the pyfftw module once imported; False where it does not import


def _pyfftw() -> Any:
    """pyfftw, or None where it does not import (imported once, on first use)."""
    global _PYFFTW
    if _PYFFTW is None:
        try:
            import pyfftw

            _PYFFTW = pyfftw
        except Exception as e:  # ImportError, or a broken build
            log.debug("pyshard.fft: pyfftw does not import (%s: %s)", type(e).__name__, e)
            _PYFFTW = False
    return _PYFFTW or None


def backend() -> str:
    """The local-transform backend of numpy arrays that ``PYSHARD_FFT_BACKEND`` selects now:
    ``"scipy"`` or ``"numpy"`` (pocketfft), ``"pyfftw"`` or ``"pyfftw-measure"`` (pyFFTW; the
    c2c and r2c/c2r passes in float32 and float64, the others through scipy.fft). ``auto``:
    scipy where it imports, else numpy; pyFFTW only when named (measured: faster at 128^3 on
    2 ranks, slower at 256^3 on 2 and 4 ranks, docs/fft.md). Naming a backend that does not
    import raises ImportError."""
    v = config.get("PYSHARD_FFT_BACKEND")
    if v == "auto":
        return "scipy" if _sfft is not None else "numpy"
    if v.startswith("pyfftw") and _pyfftw() is None:
        raise ImportError(
            f"PYSHARD_FFT_BACKEND={v} needs pyFFTW (pip install 'pyshard[pyfftw]' or pip "
            "install pyfftw)"
        )
    if v == "scipy" and _sfft is None:
        raise ImportError("PYSHARD_FFT_BACKEND=scipy needs scipy (pip install 'pyshard[fft]')")
    return v


def _module(a: Any, func: str, sfft: Any = _sfft) -> Tuple[Any, bool]:
    """(the module whose ``func`` transforms ``a``, whether it takes workers/overwrite_x);
    ``sfft``: scipy.fft, or None to take numpy.fft (the DCT/DST take scipy.fft anyway)."""
    if bk.is_device(a):
        import cupyx.scipy.fft as cfft

        return cfft, False
    if sfft is not None:
        return sfft, True
    if func in _R2R:
        if _sfft is not None:
            return _sfft, True
        raise ImportError(
            f"pyshard.fft.{func} needs scipy (pip install 'pyshard[fft]' or pip install scipy); "
            "numpy.fft has no DCT/DST"
        )
    return np.fft, False


_FFTW_DTYPES = tuple(np.dtype(t) for t in (np.float32, np.float64, np.complex64, np.complex128))
_FFTW_PLANNED: Dict[tuple, bool] = {}  # FFTW_MEASURE problems planned (wisdom kept) -> ok


def _threads(workers: Optional[int]) -> int:
    if not workers:
        return 1
    if workers < 0:  # scipy's convention: -1 is every core
        return max(1, (os.cpu_count() or 1) + 1 + workers)
    return int(workers)


def _scratch(like: np.ndarray) -> np.ndarray:
    """An array of ``like``'s shape and dtype at the same address alignment (mod 64)."""
    pyfftw = _pyfftw()
    raw = pyfftw.empty_aligned(like.nbytes + 64, np.uint8, n=64)
    off = like.ctypes.data % 64
    return raw[off : off + like.nbytes].view(like.dtype).reshape(like.shape)


def _fftw_object(
    a: np.ndarray,
    out: np.ndarray,
    axes: Tuple[int, ...],
    direction: str,
    flags: Tuple[str, ...],
    threads: int,
    measure: bool,
) -> Any:
    """A pyfftw.FFTW over ``a`` -> ``out``. FFTW_ESTIMATE plans directly (it touches no
    data); FFTW_MEASURE plans once per problem on scratch arrays of the same geometry and
    alignment (measuring overwrites them), then builds from the wisdom it left
    (FFTW_WISDOM_ONLY, ~0.1 ms; the object holds no array past the call)."""
    pyfftw = _pyfftw()

    def make(x: Any, y: Any, how: Tuple[str, ...]) -> Any:
        return pyfftw.FFTW(
            x, y, axes=axes, direction=direction, flags=how + flags, threads=threads
        )

    if not measure:
        return make(a, out, ("FFTW_ESTIMATE",))
    inplace = _ptr(a) == _ptr(out)
    key = (
        a.shape,
        a.dtype.str,
        out.shape,
        out.dtype.str,
        axes,
        direction,
        flags,
        threads,
        inplace,
        _ptr(a) % 64,
        _ptr(out) % 64,
    )
    if key not in _FFTW_PLANNED:
        t0 = time.perf_counter()
        sa = _scratch(a)
        make(sa, sa if inplace else _scratch(out), ("FFTW_MEASURE",))
        _FFTW_PLANNED[key] = True
        log.debug(
            "pyshard.fft: FFTW_MEASURE planned %s %s axes %s in %.2f s",
            a.shape,
            a.dtype,
            axes,
            time.perf_counter() - t0,
        )
    try:
        return make(a, out, ("FFTW_MEASURE", "FFTW_WISDOM_ONLY"))
    except RuntimeError:  # no wisdom for this exact problem: FFTW_ESTIMATE instead
        log.debug("pyshard.fft: no FFTW wisdom for %s, planning FFTW_ESTIMATE", key)
        return make(a, out, ("FFTW_ESTIMATE",))


def _fftw(
    a: np.ndarray,
    func: str,
    axes: Tuple[int, ...],
    ns: Tuple[int, ...],
    shape: List[int],
    norm: Optional[str],
    out_dtype: np.dtype,
    owned: bool,
    workers: Optional[int],
    measure: bool,
) -> Optional[np.ndarray]:
    """One host pass through pyFFTW (c2c in place where this plan owns ``a``, else into
    pooled memory; r2c/c2r into pooled memory), scaled as ``norm`` says (FFTW does not
    scale: one more sweep over the array, which :func:`run_passes` saves by running every
    pass unscaled and scaling once at the end); None where it does not apply (other
    dtypes, zero-padding or truncation: then scipy/numpy run it)."""
    if a.dtype not in _FFTW_DTYPES or out_dtype not in _FFTW_DTYPES:
        return None
    if not a.flags.c_contiguous:
        return None
    if func in ("fftn", "ifftn"):
        if tuple(shape) != a.shape or any(a.shape[x] != n for x, n in zip(axes, ns)):
            return None
    elif func == "rfft":
        if a.shape[axes[0]] != ns[0] or shape[axes[0]] != ns[0] // 2 + 1:
            return None
    elif func == "irfft":
        if shape[axes[0]] != ns[0] or a.shape[axes[0]] != ns[0] // 2 + 1:
            return None
    else:
        return None
    if func in ("fftn", "ifftn") and a.dtype.kind != "c":  # real input: complex, in place
        buf = allocate(a.shape, out_dtype)
        np.copyto(buf, a)
        a, owned = buf, True
    inverse = func in ("ifftn", "irfft")
    out = a if (owned and func in ("fftn", "ifftn")) else allocate(tuple(shape), out_dtype)
    flags: Tuple[str, ...] = ()
    if func == "irfft":  # FFTW's c2r overwrites its input: a copy where it is the caller's
        if not owned:
            buf = allocate(a.shape, a.dtype)
            np.copyto(buf, a)
            a = buf
        flags = ("FFTW_DESTROY_INPUT",)
    obj = _fftw_object(
        a,
        out,
        axes,
        "FFTW_BACKWARD" if inverse else "FFTW_FORWARD",
        flags,
        _threads(workers),
        measure,
    )
    obj.execute()
    f = _norm_factor(func, ns, norm)
    if f != 1.0:
        out *= f
    return out


_SCALED = ("fftn", "ifftn", "rfft", "irfft")  # passes whose norm is a plain factor


def _norm_factor(func: str, ns: Tuple[int, ...], norm: Optional[str]) -> float:
    """The factor ``norm`` applies to the unnormalised ``func`` (one of :data:`_SCALED`)."""
    n = prod(ns)
    if norm == "ortho":
        return 1.0 / float(np.sqrt(n))
    if (norm == "forward") != (func in ("ifftn", "irfft")):  # backward: the inverse scales
        return 1.0 / n
    return 1.0


def _unscaled(func: str) -> str:
    """The norm under which ``func`` (one of :data:`_SCALED`) does not scale."""
    return "forward" if func in ("ifftn", "irfft") else "backward"


def _local(
    a: Any,
    func: str,
    axes: Tuple[int, ...],
    ns: Tuple[int, ...],
    outs: Tuple[int, ...],
    norm: Optional[str],
    type_: int,
    out_dtype: np.dtype,
    owned: bool,
    workers: Optional[int],
) -> Any:
    """One local pass: ``func`` along ``axes`` (each whole here) with lengths ``ns``, then
    pad/truncate to ``outs`` where they differ (the backward of an irfft)."""
    xp = bk.xp_of(a)
    want = _in_dtype(func, a.dtype)
    if a.dtype != want:
        a = a.astype(want)
        owned = True
    shape = list(a.shape)
    for ax, o in zip(axes, outs):
        shape[ax] = o
    if a.size == 0 or prod(shape) == 0:  # an empty shard: nothing to compute
        return xp.zeros(shape, out_dtype)
    sfft = _sfft
    if not bk.is_device(a):
        be = backend()
        if be.startswith("pyfftw") and func in ("fftn", "ifftn", "rfft", "irfft"):
            r = _fftw(
                a, func, axes, ns, shape, norm, out_dtype, owned, workers, be == "pyfftw-measure"
            )
            if r is not None:
                return r
        if be == "numpy":
            sfft = None
    if not bk.is_device(a) and prod(shape) * out_dtype.itemsize >= POOL_MIN_BYTES:
        r = _pooled(a, func, axes, ns, shape, norm, out_dtype, owned, workers, sfft)
        if r is not None:
            return r
    mod, full = _module(a, func, sfft)
    kw: Dict[str, Any] = {"norm": norm}
    if full:
        kw["overwrite_x"] = owned
        if workers is not None:
            kw["workers"] = workers
    if func in ("rfft", "irfft"):
        r = getattr(mod, func)(a, n=ns[0], axis=axes[0], **kw)
    elif func in _R2R:
        r = getattr(mod, func)(a, type=type_, s=ns, axes=axes, **kw)
    else:
        r = getattr(mod, func)(a, s=ns, axes=axes, **kw)
    if tuple(r.shape) != tuple(shape):  # resize (zero-pad or truncate) to the pass's output
        fixed = xp.zeros(shape, r.dtype)
        sl = tuple(slice(0, min(p, q)) for p, q in zip(r.shape, shape))
        fixed[sl] = r[sl]
        r = fixed
    if r.dtype != out_dtype:
        r = r.astype(out_dtype)
    if not r.flags.c_contiguous:
        r = xp.ascontiguousarray(r)
    return r


def _ptr(a: Any) -> int:
    return int(a.data.ptr) if bk.is_device(a) else int(a.ctypes.data)


def _pooled(a: np.ndarray, func: str, axes: Tuple[int, ...], ns: Tuple[int, ...],
            shape: List[int], norm: Optional[str], out_dtype: np.dtype, owned: bool,
            workers: Optional[int], sfft: Any = _sfft) -> Optional[np.ndarray]:
    """A host pass into memory from pyshard's result pool (no fresh pages to fault in on
    every call): c2c in place (in ``a`` when this plan owns it, else in a pooled copy), and
    rfft/irfft with numpy's ``out=``; None where neither applies (then scipy allocates)."""
    one = len(axes) == 1 and _NP_OUT and workers in (None, 1)
    if func in ("fftn", "ifftn") and tuple(shape) == a.shape and one and not owned:
        # out of place straight into pooled memory (numpy's out=): no copy of the input
        buf = pooled_empty(tuple(shape), out_dtype)
        getattr(np.fft, func[:-1])(a, n=ns[0], axis=axes[0], norm=norm, out=buf)
        return buf
    if func in ("fftn", "ifftn") and tuple(shape) == a.shape and sfft is not None:
        if not owned or a.dtype != out_dtype:
            buf = pooled_empty(tuple(shape), out_dtype)
            np.copyto(buf, a)
            a = buf
        kw: Dict[str, Any] = {"norm": norm, "overwrite_x": True}
        if workers is not None:
            kw["workers"] = workers
        r = getattr(sfft, func)(a, s=ns, axes=axes, **kw)
        if r.dtype == out_dtype and _ptr(r) == _ptr(a) and r.flags.c_contiguous:
            return a
        np.copyto(a, r)
        return a
    if func in ("rfft", "irfft") and _NP_OUT and workers in (None, 1):
        buf = pooled_empty(tuple(shape), out_dtype)
        getattr(np.fft, func)(a, n=ns[0], axis=axes[0], norm=norm, out=buf)
        return buf
    return None


# ----------------------------------------------------------------------------- passes


class _Local:
    """A local transform: no communication."""

    __slots__ = ("func", "axes", "ns", "outs", "src", "dst")

    def __init__(
        self, func: str, axes: Tuple[int, ...], ns: Tuple[int, ...], outs: Tuple[int, ...],
        src: Layout, dst: Layout,
    ) -> None:
        self.func, self.axes, self.ns, self.outs = func, axes, ns, outs
        self.src, self.dst = src, dst

    def describe(self) -> str:
        ax = ", ".join(map(str, self.axes))
        return (
            f"local {self.func} along axes ({ax}) n={list(self.ns)}: "
            f"{self.src.shape} {self.src.dtype} -> {self.dst.shape} {self.dst.dtype}"
        )


class _Move:
    """A redistribute (a pyshard Plan: one exchange on one sub-communicator, or nothing)."""

    __slots__ = ("plan", "src", "dst")

    def __init__(self, p: Plan) -> None:
        self.plan, self.src, self.dst = p, p.src, p.dst


def _sharded(lay: Layout, a: int) -> bool:
    return bool(lay.table[a][0]) and any(lay.mesh_shape[m] > 1 for m in lay.table[a][0])


def _with(
    lay: Layout,
    shape: Optional[Sequence[int]] = None,
    dtype: Optional[np.dtype] = None,
    placements: Optional[Sequence[Placement]] = None,
    sizes: Optional[Dict[int, Sequence[int]]] = None,
    keep: bool = True,
) -> Layout:
    """``lay`` with another shape, dtype or placements; with ``keep``, the shard extents of
    every dim whose length and sharding mesh dims are unchanged are kept (plus ``sizes``)."""
    shape = tuple(lay.shape if shape is None else shape)
    dtype = lay.dtype if dtype is None else dtype
    pl = tuple(lay.placements if placements is None else placements)
    out: Dict[int, Tuple[int, ...]] = {}
    if keep:
        for d, (mdims, ext, _) in enumerate(lay.table):
            nd = tuple(m for m, p in enumerate(pl) if p == Shard(d))
            if mdims and nd == mdims and shape[d] == lay.shape[d]:
                out[d] = ext
    if sizes:
        out.update({int(d): tuple(v) for d, v in sizes.items()})
    return Layout(shape, dtype, lay.mesh_shape, pl, out or None)


def _choose_move(
    cur: Layout, todo: Sequence[int], pending: Sequence[int], target: Optional[Tuple]
) -> Layout:
    """The next transpose: move the Shard of one transformed axis ``a`` in ``todo`` (all
    sharded) onto another axis ``b`` on the same mesh dims, preferring a ``b`` that is done or
    a batch axis (not in ``pending``), is where the target shards those mesh dims (else the
    final redistribute moves it again), holds a shard per rank, is not sharded yet, and is
    long. With no other axis (a 1-D array) the mesh dims
    replicate ``a`` (an Allgather). Decided from the layout alone: the same on every rank."""
    best = None
    for i, a in enumerate(todo):
        mdims = [m for m in cur.table[a][0]]
        parts = prod(cur.mesh_shape[m] for m in mdims)
        for b in range(cur.ndim):
            if b == a:
                continue
            on_target = target is not None and all(
                target[0][m] == Shard(b) for m in mdims
            )
            score = (
                b in pending,
                not on_target,  # else the final redistribute moves it again
                cur.shape[b] < parts,
                _sharded(cur, b),
                -cur.shape[b],
                i,
                b,
            )
            if best is None or score < best[0]:
                best = (score, a, b, mdims)
    pl = list(cur.placements)
    if best is None:  # 1-D: gather the axis on its mesh dims
        for a in todo:
            for m in cur.table[a][0]:
                pl[m] = Replicate()
        log.debug("pyshard.fft: no axis to move the shard onto; replicating %s", todo)
        return _with(cur, placements=pl)
    _, a, b, mdims = best
    for m in mdims:
        pl[m] = Shard(b)
    return _with(cur, placements=pl)


def _apply(cur: Layout, func: str, axes: Tuple[int, ...], ns: Tuple[int, ...],
           outs: Tuple[int, ...]) -> Tuple[_Local, Layout]:
    shape = list(cur.shape)
    for ax, o in zip(axes, outs):
        shape[ax] = o
    nxt = _with(cur, shape=shape, dtype=_out_dtype(func, cur.dtype))
    return _Local(func, axes, ns, outs, cur, nxt), nxt


def _groups(kind: str, axes: Tuple[int, ...], ns: Tuple[int, ...], src: Layout) -> list:
    """(func, axes, ns, outs) per group, in the order they run."""
    if kind == "rfftn":
        last = axes[-1]
        g = [("rfft", (last,), (ns[-1],), (ns[-1] // 2 + 1,))]
        if len(axes) > 1:
            g.append(("fftn", axes[:-1], ns[:-1], ns[:-1]))
        return g
    if kind == "irfftn":
        g = []
        if len(axes) > 1:
            g.append(("ifftn", axes[:-1], ns[:-1], ns[:-1]))
        g.append(("irfft", (axes[-1],), (ns[-1],), (ns[-1],)))
        return g
    return [(kind, axes, ns, ns)]


def _build(src: Layout, kind: str, axes: Tuple[int, ...], ns: Tuple[int, ...],
           target: Optional[Tuple]) -> List[Any]:
    """The passes of a forward transform from ``src``; ``target`` (placements, sizes) or
    None for "any"."""
    passes: List[Any] = []
    cur = src
    red = [
        m for m, p in enumerate(cur.placements)
        if isinstance(p, Partial) and p.op not in ("sum", "avg")
    ]
    if red:  # Partial max/min: not linear, reduce first
        pl = [Replicate() if m in red else p for m, p in enumerate(cur.placements)]
        nxt = _with(cur, placements=pl)
        passes.append(_Move(_rplan(cur, nxt)))
        cur = nxt
    groups = _groups(kind, axes, ns, src)
    for gi, (func, gaxes, gns, gouts) in enumerate(groups):
        later = [a for g in groups[gi + 1:] for a in g[1]]
        todo = list(gaxes)
        while todo:
            whole = [a for a in todo if not _sharded(cur, a)]
            if whole:
                sel = tuple(whole)
                idx = [gaxes.index(a) for a in sel]
                lp, cur = _apply(
                    cur, func, sel, tuple(gns[i] for i in idx), tuple(gouts[i] for i in idx)
                )
                passes.append(lp)
                todo = [a for a in todo if a not in whole]
                continue
            nxt = _choose_move(cur, todo, todo + later, target)
            passes.append(_Move(_rplan(cur, nxt)))
            cur = nxt
    if target is not None:
        pl, sizes = target
        dst = Layout(cur.shape, cur.dtype, cur.mesh_shape, pl, dict(sizes) if sizes else None)
        if dst != cur:
            passes.append(_Move(_rplan(cur, dst)))
    return passes


def _invert(passes: Sequence[Any], start: Layout, kind: str) -> List[Any]:
    """The passes of the inverse transform, from ``start`` (the forward's result) back to
    the forward's input placements and extents, each forward pass undone in reverse order."""
    out: List[Any] = []
    cur = start
    inv_func = {"rfft": "irfft", "irfft": "rfft", **INVERSE}
    for p in reversed(passes):
        if isinstance(p, _Move):
            dst = Layout(p.src.shape, cur.dtype, cur.mesh_shape, p.src.placements,
                         p.src.sizes or None)
            if dst != cur:
                out.append(_Move(_rplan(cur, dst)))
            cur = dst
        else:
            f = inv_func[p.func]
            outs = tuple(p.src.shape[a] for a in p.axes)
            if f == "rfft":  # the real length is this pass's input; bins resized to outs
                ns = tuple(cur.shape[a] for a in p.axes)
            else:
                ns = outs
            shape = list(cur.shape)
            for ax, o in zip(p.axes, outs):
                shape[ax] = o
            dst = Layout(shape, _out_dtype(f, cur.dtype), cur.mesh_shape, p.src.placements,
                         p.src.sizes or None)
            out.append(_Local(f, p.axes, ns, outs, cur, dst))
            cur = dst
    return out


# ----------------------------------------------------------------------------- the plan


class FFTPlan:
    """A distributed transform of arrays laid out as ``src``: ``forward(x)`` gives the
    transform laid out as ``dst``, ``backward(y)`` the inverse transform of a ``dst`` array
    laid out as ``src`` again (the same placements, extents and shape; the dtype is the
    inverse's: complex for fftn, real for rfftn and the DCT/DST of real input). Pure
    Python and cached (:func:`plan`); :meth:`explain` shows the passes."""

    def __init__(self, src: Layout, kind: str, axes: Tuple[int, ...], ns: Tuple[int, ...],
                 norm: Optional[str], type_: int, target: Optional[Tuple]) -> None:
        self.src = src
        self.kind = kind
        self.axes = axes
        self.s = ns
        self.norm = norm
        self.type = type_
        self.passes: Tuple[Any, ...] = tuple(_build(src, kind, axes, ns, target))
        self.dst = self.passes[-1].dst if self.passes else src
        self._back: Optional[Tuple[Any, ...]] = None

    @property
    def backward_passes(self) -> Tuple[Any, ...]:
        if self._back is None:
            self._back = tuple(_invert(self.passes, self.dst, self.kind))
        return self._back

    @property
    def transposes(self) -> int:
        """Redistributions that communicate, in one forward call."""
        return sum(1 for p in self.passes if isinstance(p, _Move) and p.plan.collectives)

    @property
    def collectives(self) -> int:
        return sum(p.plan.collectives for p in self.passes if isinstance(p, _Move))

    def __repr__(self) -> str:
        return (
            f"FFTPlan({self.kind}, axes {self.axes}, {self.src} -> {self.dst}, "
            f"{self.transposes} transpose(s))"
        )

    def forward(self, x: ShardedArray, out: Optional[Any] = None, workers: Optional[int] = None,
                algorithm: Optional[str] = None) -> ShardedArray:
        """The transform of ``x`` (laid out as :attr:`src`), laid out as :attr:`dst`;
        collective. ``out``: an array of the result's local shape and dtype to write into."""
        if not isinstance(x, ShardedArray) or x.layout != self.src:
            got = x.layout if isinstance(x, ShardedArray) else type(x).__name__
            raise ValueError(
                f"FFTPlan.forward: expected an array laid out as {self.src}, got {got}"
            )
        _check_out(out, self.dst, x)
        return run_passes(self.passes, x, out, self.norm, self.type, workers, algorithm)

    def backward(self, y: ShardedArray, out: Optional[Any] = None,
                 workers: Optional[int] = None, algorithm: Optional[str] = None) -> ShardedArray:
        """The inverse transform of ``y`` (laid out as :attr:`dst`), laid out as the input
        (:attr:`src`'s placements, extents and shape); collective."""
        back = self.backward_passes
        start = back[0].src if back else self.dst
        if not isinstance(y, ShardedArray) or y.layout != start:
            got = y.layout if isinstance(y, ShardedArray) else type(y).__name__
            raise ValueError(f"FFTPlan.backward: expected an array laid out as {start}, got {got}")
        _check_out(out, back[-1].dst, y)
        return run_passes(back, y, out, self.norm, self.type, workers, algorithm)

    def explain(self, coords: Optional[Sequence[int]] = None, backward: bool = False) -> str:
        """Readable text: every pass (local transforms and their axes; each transpose with
        pyshard's :meth:`Plan.explain`: collective, communicator, bytes) and the peak memory
        of the rank at ``coords`` (default mesh coords 0)."""
        passes = self.backward_passes if backward else self.passes
        coords = tuple(coords) if coords is not None else (0,) * len(self.src.mesh_shape)
        name = INVERSE[self.kind] if backward else self.kind
        src = passes[0].src if passes else self.src
        dst = passes[-1].dst if passes else self.src
        nt = sum(1 for p in passes if isinstance(p, _Move) and p.plan.collectives)
        lines = [
            f"fft plan {name} axes {self.axes} norm={self.norm or 'backward'}"
            + (f" type={self.type}" if self.kind in _R2R else "")
            + f" on mesh {'x'.join(map(str, self.src.mesh_shape))}",
            f"  from {src}",
            f"  to   {dst}",
            f"  {len(passes)} pass(es), {nt} transpose(s), "
            f"{sum(p.plan.collectives for p in passes if isinstance(p, _Move))} collective(s)",
        ]
        peak = 0
        for i, p in enumerate(passes):
            inb = prod(p.src.local_shape(coords)) * p.src.dtype.itemsize
            outb = prod(p.dst.local_shape(coords)) * p.dst.dtype.itemsize
            if isinstance(p, _Local):
                lines.append(f"  pass {i}: {p.describe()}")
                lines.append(f"    rank {coords}: {p.src.local_shape(coords)} -> "
                             f"{p.dst.local_shape(coords)}, no communication")
                peak = max(peak, inb + outb)
            else:
                sub = p.plan.explain(coords).splitlines()
                lines.append(f"  pass {i}: transpose " + sub[0])
                lines.extend("    " + s for s in sub[1:])
                peak = max(peak, inb + p.plan.peak_extra_bytes(coords))
        lines.append(f"  peak memory: rank {coords} {peak} B (a pass's input and what it "
                     f"allocates)")
        return "\n".join(lines)


def _check_out(out: Optional[Any], dst: Layout, x: ShardedArray) -> None:
    """``out`` fits the result's local shard (checked on this rank before communicating)."""
    if out is None:
        return
    want = dst.local_shape(x.mesh.coords)
    if (tuple(getattr(out, "shape", ())) != want or getattr(out, "dtype", None) != dst.dtype
            or bk.is_device(out) != bk.is_device(x.local)
            or not out.flags.c_contiguous):
        raise ValueError(
            f"out must be a C-contiguous {'device' if bk.is_device(x.local) else 'host'} array "
            f"of shape {want} and dtype {dst.dtype} (this rank's shard of {dst}), got "
            f"{getattr(out, 'shape', type(out).__name__)} {getattr(out, 'dtype', '')}"
        )


def run_passes(passes: Sequence[Any], x: ShardedArray, out: Optional[Any],
               norm: Optional[str], type_: int, workers: Optional[int],
               algorithm: Optional[str], times: Optional[List[float]] = None) -> ShardedArray:
    """Run a plan's ``passes`` on ``x`` (what ``FFTPlan.forward``/``backward`` do); ``times``:
    [local transform s, transpose s] accumulated (the benchmark's split)."""
    from . import executor

    mesh = x.mesh
    alg = algorithm or executor.default_algorithm()
    local = x.local
    # pyFFTW does not scale: every c2c/r2c/c2r pass runs unscaled and the product of their
    # factors (from the plan: the same on every rank, empty shards included) is applied
    # once at the end, one sweep instead of one per pass (the moves between are linear)
    defer = not bk.is_device(local) and backend().startswith("pyfftw")
    scale = 1.0
    owned = False
    last = len(passes) - 1
    # out= and a last pass that transforms in place after a transpose: the transpose writes
    # into out and the transform runs there (no copy)
    into = last
    if out is not None and last >= 1:
        lp, mv = passes[last], passes[last - 1]
        if (isinstance(lp, _Local) and isinstance(mv, _Move) and mv.plan.steps
                and lp.func in ("fftn", "ifftn") and lp.src.dtype == lp.dst.dtype
                and lp.src.shape == lp.dst.shape and not bk.is_device(local)):
            into = last - 1
    for i, p in enumerate(passes):
        o = out if i == into else None
        t0 = time.perf_counter() if times is not None else 0.0
        if isinstance(p, _Local):
            pnorm = norm
            if defer and p.func in _SCALED:
                scale *= _norm_factor(p.func, p.ns, norm)
                pnorm = _unscaled(p.func)
            local = _local(local, p.func, p.axes, p.ns, p.outs, pnorm, type_, p.dst.dtype,
                           owned, workers)
            if out is not None and i == last and local is not out:
                if local.shape == out.shape and _ptr(local) == _ptr(out):
                    local = out  # transformed in place
                else:
                    bk.xp_of(local).copyto(out, local)
                    local = out
        elif p.plan.steps:
            execs = executors(p.plan, mesh, alg, local)
            local = run_steps(execs, p.plan, mesh, local, o)
        else:
            continue
        if times is not None:
            times[isinstance(p, _Move)] += time.perf_counter() - t0
        owned = True
    if scale != 1.0:
        t0 = time.perf_counter() if times is not None else 0.0
        local *= scale  # owned: a scaled pass ran, and wrote a result of this plan's
        if times is not None:
            times[0] += time.perf_counter() - t0
    return ShardedArray(local, passes[-1].dst, mesh)


# ----------------------------------------------------------------------------- arguments


def _axis(a: object, ndim: int) -> int:
    if isinstance(a, bool) or not isinstance(a, numbers.Integral):
        raise TypeError(f"axes must be integers, got {a!r}")
    a = int(a)
    if not -ndim <= a < ndim:
        raise AxisError(a, ndim)
    return a % ndim


def _norm_args(
    shape: Tuple[int, ...], dtype: np.dtype, kind: str, axes: object, s: object, norm: object,
    type_: object,
) -> Tuple[Tuple[int, ...], Tuple[int, ...], Optional[str], int]:
    """Checked (axes, output lengths along them, norm, type), or the error numpy/scipy give;
    from the layout alone, so every rank raises the same before any communication."""
    if kind not in KINDS:
        raise ValueError(f"pyshard.fft.plan: kind must be one of {KINDS}, got {kind!r}")
    ndim = len(shape)
    if s is not None:
        if isinstance(s, numbers.Integral):
            s = (s,)
        s = tuple(s)  # type: ignore[arg-type]
    if axes is None:
        ax = tuple(range(ndim)) if s is None else tuple(range(ndim - len(s), ndim))
        if any(a < 0 for a in ax):
            raise ValueError(f"s has {len(s)} entries, more than the array's ndim {ndim}")
    else:
        if isinstance(axes, numbers.Integral):
            axes = (axes,)
        ax = tuple(_axis(a, ndim) for a in axes)  # type: ignore[union-attr]
    if not ax:
        raise ValueError("axes must name at least one axis")
    if len(set(ax)) != len(ax):
        raise ValueError("all axes must be unique")
    if s is not None and len(s) != len(ax):
        raise ValueError("when given, axes and shape arguments have to be of the same length")
    if norm not in _NORMS:
        raise ValueError(f'Invalid norm value {norm!r}, should be "backward", "ortho" or "forward"')
    if kind == "rfftn" and dtype.kind == "c":
        raise TypeError("x must be a real sequence")
    t = 2
    if kind in _R2R:
        t = 2 if type_ is None else type_
        if t not in (1, 2, 3, 4) or isinstance(t, bool):
            raise ValueError("invalid DCT type" if kind.startswith(("dct", "idct"))
                             else "invalid DST type")
    elif type_ is not None:
        raise TypeError(f"{kind} takes no type argument")
    ns = []
    for i, a in enumerate(ax):
        n = None if s is None else s[i]
        if n is None or n == -1:
            if kind == "irfftn" and i == len(ax) - 1:
                n = 2 * (shape[a] - 1)
            else:
                n = shape[a]
        if isinstance(n, bool) or not isinstance(n, numbers.Integral):
            raise TypeError(f"s must be a sequence of ints, got {s!r}")
        ns.append(int(n))
    if any(n < 1 for n in ns):
        raise ValueError(f"invalid number of data points ({ns}) specified")
    if kind in _R2R and t == 1 and any(n < 2 for n in ns) and kind.startswith(("dct", "idct")):
        raise ValueError("DCT-I is not defined for size < 2")
    if kind in ("dctn", "idctn", "dstn", "idstn") and _sfft is None:
        raise ImportError(
            f"pyshard.fft.{kind} needs scipy (pip install 'pyshard[fft]' or pip install scipy)"
        )
    return ax, tuple(ns), norm, t  # type: ignore[return-value]


def _out_lengths(kind: str, shape: Tuple[int, ...], axes: Tuple[int, ...],
                 ns: Tuple[int, ...]) -> Tuple[int, ...]:
    out = list(shape)
    for a, n in zip(axes, ns):
        out[a] = n
    if kind == "rfftn":
        out[axes[-1]] = ns[-1] // 2 + 1
    return tuple(out)


def _sizes_key(sizes: object) -> Optional[tuple]:
    if sizes is None:
        return None
    if not isinstance(sizes, dict):
        raise TypeError(f"sizes must be a dict {{array_dim: extents}}, got {sizes!r}")
    return tuple(sorted((int(d), tuple(int(e) for e in v)) for d, v in sizes.items()))


@memoize
def _cached(layout: Layout, kind: str, axes: Tuple[int, ...], ns: Tuple[int, ...],
            norm: Optional[str], type_: int, target: Optional[Tuple]) -> FFTPlan:
    return FFTPlan(layout, kind, axes, ns, norm, type_, target)


def plan(
    layout: Layout,
    kind: str,
    axes: Optional[Sequence[int]] = None,
    s: Optional[Sequence[int]] = None,
    norm: Optional[str] = None,
    placements: PlacementsOut = None,
    sizes: SizesOut = None,
    type: Optional[int] = None,  # noqa: A002 - scipy's name
) -> FFTPlan:
    """The (cached, reusable) plan of transform ``kind`` (one of :data:`KINDS`) of arrays
    laid out as ``layout``; pure Python, no communication. ``placements``/``sizes`` as in
    :func:`fftn` (``"any"``: wherever the last pass ends)."""
    if isinstance(layout, ShardedArray):
        layout = layout.layout
    if not isinstance(layout, Layout):
        raise TypeError(f"pyshard.fft.plan: layout must be a pyshard.Layout, got {layout!r}")
    ax, ns, norm, t = _norm_args(layout.shape, layout.dtype, kind, axes, s, norm, type)
    out_shape = _out_lengths(kind, layout.shape, ax, ns)
    if isinstance(placements, str):
        if placements != "any":
            raise ValueError(f"placements must be a list, None or 'any', got {placements!r}")
        if sizes is not None:
            raise ValueError("sizes= needs placements (not 'any')")
        target = None
    else:
        if placements is None:
            pl = tuple(
                Replicate() if isinstance(p, Partial) and p.op not in ("sum", "avg") else p
                for p in layout.placements
            )
            if sizes is None:  # keep the input's extents along axes whose length stays
                sizes = {
                    d: ext for d, ext in layout.sizes.items() if out_shape[d] == layout.shape[d]
                }
        else:
            pl = check_placements(placements, len(layout.mesh_shape), len(layout.shape))
        key = _sizes_key(sizes) or None
        # the result layout must be valid: check it now (the same error on every rank)
        Layout(out_shape, _final_dtype(kind, layout.dtype), layout.mesh_shape, pl,
               dict(key) if key else None)
        target = (pl, key)
    return _cached(layout, kind, ax, ns, norm, t, target)


def _final_dtype(kind: str, dt: np.dtype) -> np.dtype:
    if kind in ("fftn", "ifftn", "rfftn"):
        return _cplx(dt)
    if kind == "irfftn":
        return _real_prec(dt)
    return _cplx(dt) if dt.kind == "c" else _real_prec(dt)


# ----------------------------------------------------------------------------- functions


def _check_x(x: object, name: str) -> ShardedArray:
    if not isinstance(x, ShardedArray):
        raise TypeError(f"pyshard.fft.{name}: x must be a pyshard.ShardedArray, got "
                        f"{type(x).__name__}")
    return x


def _go(name: str, kind: str, x: ShardedArray, s: Any, axes: Any, norm: Any, placements: Any,
        sizes: Any, type_: Any = None, workers: Optional[int] = None,
        out: Optional[Any] = None) -> ShardedArray:
    x = _check_x(x, name)
    if _validate.enabled:  # one small Allgather: ranks that disagree raise on every rank
        _validate.agree(x.mesh.comm, f"pyshard.fft.{name}", {
            "layout": repr(x.layout),
            "arguments": repr((axes, s, norm, type_)),
            "result layout": repr((placements, sizes)),
        })
    p = plan(x.layout, kind, axes, s, norm, placements, sizes, type_)
    return p.forward(x, out=out, workers=workers)


def fftn(x: ShardedArray, s: Optional[Sequence[int]] = None,
         axes: Optional[Sequence[int]] = None, norm: Optional[str] = None,
         placements: PlacementsOut = None, sizes: SizesOut = None, *,
         workers: Optional[int] = None, out: Optional[Any] = None) -> ShardedArray:
    """``numpy.fft.fftn`` of the global array of ``x``; collective (see the module doc)."""
    return _go("fftn", "fftn", x, s, axes, norm, placements, sizes, None, workers, out)


def ifftn(x: ShardedArray, s: Optional[Sequence[int]] = None,
          axes: Optional[Sequence[int]] = None, norm: Optional[str] = None,
          placements: PlacementsOut = None, sizes: SizesOut = None, *,
          workers: Optional[int] = None, out: Optional[Any] = None) -> ShardedArray:
    """``numpy.fft.ifftn`` of the global array of ``x``; collective."""
    return _go("ifftn", "ifftn", x, s, axes, norm, placements, sizes, None, workers, out)


def rfftn(x: ShardedArray, s: Optional[Sequence[int]] = None,
          axes: Optional[Sequence[int]] = None, norm: Optional[str] = None,
          placements: PlacementsOut = None, sizes: SizesOut = None, *,
          workers: Optional[int] = None, out: Optional[Any] = None) -> ShardedArray:
    """``numpy.fft.rfftn`` of the (real) global array of ``x``; collective."""
    return _go("rfftn", "rfftn", x, s, axes, norm, placements, sizes, None, workers, out)


def irfftn(x: ShardedArray, s: Optional[Sequence[int]] = None,
           axes: Optional[Sequence[int]] = None, norm: Optional[str] = None,
           placements: PlacementsOut = None, sizes: SizesOut = None, *,
           workers: Optional[int] = None, out: Optional[Any] = None) -> ShardedArray:
    """``numpy.fft.irfftn`` of the global array of ``x``; collective."""
    return _go("irfftn", "irfftn", x, s, axes, norm, placements, sizes, None, workers, out)


def _one(n: Optional[int]) -> Optional[Tuple[int]]:
    return None if n is None else (n,)


def fft(x: ShardedArray, n: Optional[int] = None, axis: int = -1, norm: Optional[str] = None,
        placements: PlacementsOut = None, sizes: SizesOut = None, *,
        workers: Optional[int] = None) -> ShardedArray:
    """``numpy.fft.fft`` along one axis of the global array; collective."""
    return _go("fft", "fftn", x, _one(n), (axis,), norm, placements, sizes, None, workers)


def ifft(x: ShardedArray, n: Optional[int] = None, axis: int = -1, norm: Optional[str] = None,
         placements: PlacementsOut = None, sizes: SizesOut = None, *,
         workers: Optional[int] = None) -> ShardedArray:
    """``numpy.fft.ifft`` along one axis of the global array; collective."""
    return _go("ifft", "ifftn", x, _one(n), (axis,), norm, placements, sizes, None, workers)


def rfft(x: ShardedArray, n: Optional[int] = None, axis: int = -1, norm: Optional[str] = None,
         placements: PlacementsOut = None, sizes: SizesOut = None, *,
         workers: Optional[int] = None) -> ShardedArray:
    """``numpy.fft.rfft`` along one axis of the global array; collective."""
    return _go("rfft", "rfftn", x, _one(n), (axis,), norm, placements, sizes, None, workers)


def irfft(x: ShardedArray, n: Optional[int] = None, axis: int = -1, norm: Optional[str] = None,
          placements: PlacementsOut = None, sizes: SizesOut = None, *,
          workers: Optional[int] = None) -> ShardedArray:
    """``numpy.fft.irfft`` along one axis of the global array; collective."""
    return _go("irfft", "irfftn", x, _one(n), (axis,), norm, placements, sizes, None, workers)


def fft2(x: ShardedArray, s: Optional[Sequence[int]] = None, axes: Sequence[int] = (-2, -1),
         norm: Optional[str] = None, placements: PlacementsOut = None,
         sizes: SizesOut = None, *, workers: Optional[int] = None) -> ShardedArray:
    """``numpy.fft.fft2``; collective."""
    return _go("fft2", "fftn", x, s, axes, norm, placements, sizes, None, workers)


def ifft2(x: ShardedArray, s: Optional[Sequence[int]] = None, axes: Sequence[int] = (-2, -1),
          norm: Optional[str] = None, placements: PlacementsOut = None,
          sizes: SizesOut = None, *, workers: Optional[int] = None) -> ShardedArray:
    """``numpy.fft.ifft2``; collective."""
    return _go("ifft2", "ifftn", x, s, axes, norm, placements, sizes, None, workers)


def rfft2(x: ShardedArray, s: Optional[Sequence[int]] = None, axes: Sequence[int] = (-2, -1),
          norm: Optional[str] = None, placements: PlacementsOut = None,
          sizes: SizesOut = None, *, workers: Optional[int] = None) -> ShardedArray:
    """``numpy.fft.rfft2``; collective."""
    return _go("rfft2", "rfftn", x, s, axes, norm, placements, sizes, None, workers)


def irfft2(x: ShardedArray, s: Optional[Sequence[int]] = None, axes: Sequence[int] = (-2, -1),
           norm: Optional[str] = None, placements: PlacementsOut = None,
           sizes: SizesOut = None, *, workers: Optional[int] = None) -> ShardedArray:
    """``numpy.fft.irfft2``; collective."""
    return _go("irfft2", "irfftn", x, s, axes, norm, placements, sizes, None, workers)


def dctn(x: ShardedArray, type: int = 2, s: Optional[Sequence[int]] = None,  # noqa: A002
         axes: Optional[Sequence[int]] = None, norm: Optional[str] = None,
         placements: PlacementsOut = None, sizes: SizesOut = None, *,
         workers: Optional[int] = None, out: Optional[Any] = None) -> ShardedArray:
    """``scipy.fft.dctn`` of the global array; collective."""
    return _go("dctn", "dctn", x, s, axes, norm, placements, sizes, type, workers, out)


def idctn(x: ShardedArray, type: int = 2, s: Optional[Sequence[int]] = None,  # noqa: A002
          axes: Optional[Sequence[int]] = None, norm: Optional[str] = None,
          placements: PlacementsOut = None, sizes: SizesOut = None, *,
          workers: Optional[int] = None, out: Optional[Any] = None) -> ShardedArray:
    """``scipy.fft.idctn`` of the global array; collective."""
    return _go("idctn", "idctn", x, s, axes, norm, placements, sizes, type, workers, out)


def dstn(x: ShardedArray, type: int = 2, s: Optional[Sequence[int]] = None,  # noqa: A002
         axes: Optional[Sequence[int]] = None, norm: Optional[str] = None,
         placements: PlacementsOut = None, sizes: SizesOut = None, *,
         workers: Optional[int] = None, out: Optional[Any] = None) -> ShardedArray:
    """``scipy.fft.dstn`` of the global array; collective."""
    return _go("dstn", "dstn", x, s, axes, norm, placements, sizes, type, workers, out)


def idstn(x: ShardedArray, type: int = 2, s: Optional[Sequence[int]] = None,  # noqa: A002
          axes: Optional[Sequence[int]] = None, norm: Optional[str] = None,
          placements: PlacementsOut = None, sizes: SizesOut = None, *,
          workers: Optional[int] = None, out: Optional[Any] = None) -> ShardedArray:
    """``scipy.fft.idstn`` of the global array; collective."""
    return _go("idstn", "idstn", x, s, axes, norm, placements, sizes, type, workers, out)


def dct(x: ShardedArray, type: int = 2, n: Optional[int] = None, axis: int = -1,  # noqa: A002
        norm: Optional[str] = None, placements: PlacementsOut = None,
        sizes: SizesOut = None, *, workers: Optional[int] = None) -> ShardedArray:
    """``scipy.fft.dct`` along one axis; collective."""
    return _go("dct", "dctn", x, _one(n), (axis,), norm, placements, sizes, type, workers)


def idct(x: ShardedArray, type: int = 2, n: Optional[int] = None, axis: int = -1,  # noqa: A002
         norm: Optional[str] = None, placements: PlacementsOut = None,
         sizes: SizesOut = None, *, workers: Optional[int] = None) -> ShardedArray:
    """``scipy.fft.idct`` along one axis; collective."""
    return _go("idct", "idctn", x, _one(n), (axis,), norm, placements, sizes, type, workers)


def dst(x: ShardedArray, type: int = 2, n: Optional[int] = None, axis: int = -1,  # noqa: A002
        norm: Optional[str] = None, placements: PlacementsOut = None,
        sizes: SizesOut = None, *, workers: Optional[int] = None) -> ShardedArray:
    """``scipy.fft.dst`` along one axis; collective."""
    return _go("dst", "dstn", x, _one(n), (axis,), norm, placements, sizes, type, workers)


def idst(x: ShardedArray, type: int = 2, n: Optional[int] = None, axis: int = -1,  # noqa: A002
         norm: Optional[str] = None, placements: PlacementsOut = None,
         sizes: SizesOut = None, *, workers: Optional[int] = None) -> ShardedArray:
    """``scipy.fft.idst`` along one axis; collective."""
    return _go("idst", "idstn", x, _one(n), (axis,), norm, placements, sizes, type, workers)


def tune_mesh(comm: Any, shape: Sequence[int], kind: str = "fftn",
              axes: Optional[Sequence[int]] = None, dtype: Any = None, trials: int = 3,
              max_ndim: int = 2) -> Any:
    """The :class:`~pyshard.Mesh` (a 1-D slab or a pencil mesh of up to ``max_ndim`` dims,
    sharding the leading axes, no size-1 mesh dims) on which ``kind`` over ``axes`` of a
    global array of ``shape`` runs fastest (forward + backward, ``placements="any"``; the
    slowest rank, median of ``trials``); collective, the same mesh on every rank, kept in
    ``PYSHARD_TUNE_FILE`` (see :func:`pyshard.tune_mesh`)."""
    from .fft_tune import mesh_shapes
    from .fft_tune import tune_mesh as _tune

    shape = tuple(int(n) for n in shape)
    dt = np.dtype(np.float64 if kind == "rfftn" else np.complex128) if dtype is None else (
        np.dtype(dtype))
    nd = min(max_ndim, max(1, len(shape) - 1))
    cands = [m for k in range(1, nd + 1) for m in mesh_shapes(comm.size, k)
             if k == 1 or all(v > 1 for v in m)]

    def work(mesh: Any) -> None:
        lay = Layout(shape, dt, mesh.shape, [Shard(d) for d in range(mesh.ndim)])
        p = plan(lay, kind, axes=axes, placements="any")
        x = ShardedArray(np.zeros(lay.local_shape(mesh.coords), dt), lay, mesh)
        p.backward(p.forward(x))

    key = f"fft|{kind}|{shape}|{dt.name}|{None if axes is None else tuple(axes)}"
    return _tune(comm, nd, work, key=key, trials=trials, candidates=cands)
