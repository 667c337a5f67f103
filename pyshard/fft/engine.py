"""The local engine: one pass of a plan on this rank's array, no communication.

:func:`local_pass` runs ``func`` (c2c ``fftn``/``ifftn``, r2c ``rfft``, c2r ``irfft``, or a
DCT/DST) along axes that are whole here, on the backend :func:`backend` selects
(``PYSHARD_FFT_BACKEND``): scipy.fft where scipy imports (``workers=`` passed through),
else numpy.fft (the DCT/DST then need scipy anyway); pyFFTW for the c2c and r2c/c2r passes
in float32/float64 where named (``FFTW_ESTIMATE``, or ``FFTW_MEASURE`` planned once per
problem on aligned scratch arrays); cupy arrays through cupyx.scipy.fft. Host results come
from pyshard's result pool (:func:`pyshard.executor.pooled_empty`): c2c in place where the
plan owns the array, rfft/irfft with numpy's ``out=``, so a loop faults in no fresh pages.
"""

from __future__ import annotations

import inspect
import logging
import os
import time
from math import prod
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from .. import _backend as bk
from .. import config
from ..memory import allocate, pooled, pooled_empty
from .kinds import R2R, norm_factor, pass_in_dtype

try:  # pragma: no cover - depends on the environment
    import scipy.fft as _sfft
except ImportError:  # pragma: no cover
    _sfft = None

__all__ = ["backend", "have_scipy", "inplace_pass", "local_pass", "ptr", "select_backend"]

# numpy >= 2: numpy.fft takes out= (rfft/irfft write straight into pooled memory)
_NP_OUT = "out" in inspect.signature(np.fft.rfft).parameters

log = logging.getLogger("pyshard.fft")


def _pyfftw() -> Any:
    """pyfftw, or None where it does not import (an import statement each call: a lookup in
    ``sys.modules`` once it has imported; ``sys.modules["pyfftw"] = None`` hides it)."""
    try:
        import pyfftw
    except Exception as e:  # ImportError, or a broken build
        log.debug("pyshard.fft: pyfftw does not import (%s: %s)", type(e).__name__, e)
        return None
    return pyfftw


def have_scipy() -> bool:
    """Whether scipy.fft imports here (the DCT/DST need it)."""
    return _sfft is not None


def backend() -> str:
    """The local-transform backend of numpy arrays that ``PYSHARD_FFT_BACKEND`` selects now
    (:func:`select_backend` with what imports here; pyFFTW is imported only when named)."""
    v = config.get("PYSHARD_FFT_BACKEND")
    return select_backend(v, _sfft is not None, v.startswith("pyfftw") and _pyfftw() is not None)


def select_backend(value: str, scipy: bool, pyfftw: bool) -> str:
    """The backend the ``PYSHARD_FFT_BACKEND`` value ``value`` selects where scipy.fft imports
    (``scipy``) and pyFFTW imports (``pyfftw``): ``"scipy"`` or ``"numpy"`` (pocketfft),
    ``"pyfftw"`` or ``"pyfftw-measure"`` (pyFFTW; the c2c and r2c/c2r passes in float32 and
    float64, the others through scipy.fft). ``auto``: scipy where it imports, else numpy;
    pyFFTW only when named (measured: faster at 128^3 on 2 ranks, slower at 256^3 on 2 and 4
    ranks, docs/fft.md). Naming a backend that does not import raises ImportError."""
    if value == "auto":
        return "scipy" if scipy else "numpy"
    if value.startswith("pyfftw") and not pyfftw:
        raise ImportError(
            f"PYSHARD_FFT_BACKEND={value} needs pyFFTW (pip install 'pyshard[pyfftw]' or pip "
            "install pyfftw)"
        )
    if value == "scipy" and not scipy:
        raise ImportError("PYSHARD_FFT_BACKEND=scipy needs scipy (pip install 'pyshard[fft]')")
    return value


def _module(a: Any, func: str, sfft: Any = _sfft) -> Tuple[Any, bool]:
    """(the module whose ``func`` transforms ``a``, whether it takes workers/overwrite_x);
    ``sfft``: scipy.fft, or None to take numpy.fft (the DCT/DST take scipy.fft anyway)."""
    if bk.is_device(a):
        import cupyx.scipy.fft as cfft

        return cfft, False
    if sfft is not None:
        return sfft, True
    if func in R2R:
        if _sfft is not None:
            return _sfft, True
        raise ImportError(
            f"pyshard.fft.{func} needs scipy (pip install 'pyshard[fft]' or pip install scipy); "
            "numpy.fft has no DCT/DST"
        )
    return np.fft, False


def ptr(a: Any) -> int:
    """The address of ``a``'s data (host or device)."""
    return int(a.data.ptr) if bk.is_device(a) else int(a.ctypes.data)


# ----------------------------------------------------------------------------- pyFFTW


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
    inplace = ptr(a) == ptr(out)
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
        ptr(a) % 64,
        ptr(out) % 64,
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
    scale: one more sweep over the array, which :func:`pyshard.fft.run_passes` saves by
    running every pass unscaled and scaling once at the end); None where it does not apply
    (other dtypes, zero-padding or truncation: then scipy/numpy run it)."""
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
    f = norm_factor(func, ns, norm)
    if f != 1.0:
        out *= f
    return out


# ----------------------------------------------------------------------------- one pass


def inplace_pass(v: np.ndarray, func: str, axes: Tuple[int, ...], ns: Tuple[int, ...],
                 norm: Optional[str], workers: Optional[int], type_: int = 2,
                 orthogonalize: Optional[bool] = None) -> np.ndarray:
    """A c2c pass (``fftn``/``ifftn``) or a DCT/DST (``type_``, scipy's ``orthogonalize``
    where not None) in place in the host view ``v`` (any strides: a padded storage's view)
    through scipy.fft, whose result is ``v`` itself."""
    if v.size == 0:
        return v
    kw: Dict[str, Any] = {"norm": norm, "overwrite_x": True}
    if workers is not None:
        kw["workers"] = workers
    if func in R2R:
        kw["type"] = type_
        if orthogonalize is not None:
            kw["orthogonalize"] = orthogonalize
    r = getattr(_sfft, func)(v, s=ns, axes=axes, **kw)
    if ptr(r) != ptr(v) or r.strides != v.strides:
        np.copyto(v, r)
    return v


def local_pass(
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
    orthogonalize: Optional[bool] = None,
) -> Any:
    """One local pass: ``func`` along ``axes`` (each whole here) with lengths ``ns``, then
    pad/truncate to ``outs`` where they differ (the backward of an irfft). ``owned``: the
    plan made ``a`` (it may be overwritten). ``func``: c2c ``fftn``/``ifftn``, r2c ``rfft``
    and ``ihfft``, c2r ``irfft`` and ``hfft`` (1-D, as numpy.fft/scipy.fft define them), or a
    DCT/DST (``orthogonalize``: scipy's, passed where not None)."""
    xp = bk.xp_of(a)
    if orthogonalize is not None and bk.is_device(a):  # before the empty-shard return
        raise NotImplementedError(
            f"pyshard.fft: cupyx.scipy.fft has no orthogonalize= (here {orthogonalize} with "
            f"norm={norm!r}); leave it at its default for cupy arrays"
        )
    want = pass_in_dtype(func, a.dtype)
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
    if not bk.is_device(a) and pooled(prod(shape) * out_dtype.itemsize):
        r = _pooled(a, func, axes, ns, shape, norm, out_dtype, owned, workers, sfft)
        if r is not None:
            return r
    mod, full = _module(a, func, sfft)
    kw: Dict[str, Any] = {"norm": norm}
    if full:
        kw["overwrite_x"] = owned
        if workers is not None:
            kw["workers"] = workers
    if func in ("rfft", "irfft", "hfft", "ihfft"):
        r = getattr(mod, func)(a, n=ns[0], axis=axes[0], **kw)
    elif func in R2R:
        if orthogonalize is not None:
            kw["orthogonalize"] = orthogonalize
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


def _pooled(a: np.ndarray, func: str, axes: Tuple[int, ...], ns: Tuple[int, ...],
            shape: List[int], norm: Optional[str], out_dtype: np.dtype, owned: bool,
            workers: Optional[int], sfft: Any = _sfft) -> Optional[np.ndarray]:
    """A host pass into memory from pyshard's result pool (no fresh pages to fault in on
    every call): c2c in place (in ``a`` when this plan owns it, else in a pooled copy), and
    rfft/irfft with numpy's ``out=``; None where neither applies (then scipy allocates)."""
    one = len(axes) == 1 and _NP_OUT and workers in (None, 1)
    # out= (and the in-place c2c) take the transform's full length: none where the pass
    # then crops or pads (the backward of a plan whose s= pads: ns != outs)
    if func in ("fftn", "ifftn", "irfft") and any(shape[x] != n for x, n in zip(axes, ns)):
        return None
    if func == "rfft" and shape[axes[0]] != ns[0] // 2 + 1:
        return None
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
        if r.dtype == out_dtype and ptr(r) == ptr(a) and r.flags.c_contiguous:
            return a
        np.copyto(a, r)
        return a
    if func in ("rfft", "irfft") and _NP_OUT and workers in (None, 1):
        buf = pooled_empty(tuple(shape), out_dtype)
        getattr(np.fft, func)(a, n=ns[0], axis=axes[0], norm=norm, out=buf)
        return buf
    return None
