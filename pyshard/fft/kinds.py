"""What a transform is, decided from its arguments alone: the kinds and their inverses, the
norms and their factors, the dtypes a pass takes and gives, and the checked arguments
(axes, lengths, norm, type, sizes) of :func:`pyshard.fft.plan`.

Pure functions of shapes, dtypes and arguments (no arrays, no MPI), so every rank gets the
same answer and raises the same error before any communication. The bottom of the package:
:mod:`~pyshard.fft.engine`, :mod:`~pyshard.fft.planner` and :mod:`~pyshard.fft.api` use it.
"""

from __future__ import annotations

import numbers
from math import prod
from typing import Optional, Tuple

import numpy as np

from .. import _dtypes

try:
    from numpy.exceptions import AxisError
except ImportError:  # pragma: no cover - numpy < 1.25
    AxisError = np.AxisError  # type: ignore[attr-defined,misc]

__all__ = [
    "INVERSE",
    "KINDS",
    "NORMS",
    "R2R",
    "SCALED",
    "check_args",
    "complex_dtype",
    "norm_factor",
    "out_lengths",
    "pass_in_dtype",
    "pass_out_dtype",
    "real_dtype",
    "result_dtype",
    "unscaled",
]

KINDS = ("fftn", "ifftn", "rfftn", "irfftn", "dctn", "idctn", "dstn", "idstn")
"""The transforms :func:`pyshard.fft.plan` takes."""

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
"""Each kind's inverse transform."""

NORMS = (None, "backward", "ortho", "forward")
R2R = ("dctn", "idctn", "dstn", "idstn")
SCALED = ("fftn", "ifftn", "rfft", "irfft")  # local passes whose norm is a plain factor

# ----------------------------------------------------------------------------- dtypes


def real_dtype(dt: np.dtype) -> np.dtype:
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


def complex_dtype(dt: np.dtype) -> np.dtype:
    """The complex working dtype of ``dt`` (complex of :func:`real_dtype`)."""
    return np.result_type(real_dtype(dt), np.complex64)


def pass_out_dtype(func: str, dt: np.dtype) -> np.dtype:
    """The dtype a local pass ``func`` gives for input ``dt``."""
    if func in ("fftn", "ifftn", "rfft"):
        return complex_dtype(dt)
    if func == "irfft":
        return real_dtype(dt)
    return complex_dtype(dt) if dt.kind == "c" else real_dtype(dt)  # DCT/DST keep real/complex


def pass_in_dtype(func: str, dt: np.dtype) -> np.dtype:
    """The dtype the local array is cast to before ``func`` runs on it."""
    if func == "irfft":
        return complex_dtype(dt)
    if func == "rfft":
        return real_dtype(dt)
    return complex_dtype(dt) if dt.kind == "c" else real_dtype(dt)


def result_dtype(kind: str, dt: np.dtype) -> np.dtype:
    """The dtype of transform ``kind`` (one of :data:`KINDS`) of input ``dt``."""
    if kind in ("fftn", "ifftn", "rfftn"):
        return complex_dtype(dt)
    if kind == "irfftn":
        return real_dtype(dt)
    return complex_dtype(dt) if dt.kind == "c" else real_dtype(dt)


# ----------------------------------------------------------------------------- norms


def norm_factor(func: str, ns: Tuple[int, ...], norm: Optional[str]) -> float:
    """The factor ``norm`` applies to the unnormalised ``func`` (one of :data:`SCALED`)."""
    n = prod(ns)
    if norm == "ortho":
        return 1.0 / float(np.sqrt(n))
    if (norm == "forward") != (func in ("ifftn", "irfft")):  # backward: the inverse scales
        return 1.0 / n
    return 1.0


def unscaled(func: str) -> str:
    """The norm under which ``func`` (one of :data:`SCALED`) does not scale."""
    return "forward" if func in ("ifftn", "irfft") else "backward"


# ----------------------------------------------------------------------------- arguments


def _axis(a: object, ndim: int) -> int:
    if isinstance(a, bool) or not isinstance(a, numbers.Integral):
        raise TypeError(f"axes must be integers, got {a!r}")
    a = int(a)
    if not -ndim <= a < ndim:
        raise AxisError(a, ndim)
    return a % ndim


def check_args(
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
    if norm not in NORMS:
        raise ValueError(f'Invalid norm value {norm!r}, should be "backward", "ortho" or "forward"')
    if kind == "rfftn" and dtype.kind == "c":
        raise TypeError("x must be a real sequence")
    t = 2
    if kind in R2R:
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
    if kind in R2R and t == 1 and any(n < 2 for n in ns) and kind.startswith(("dct", "idct")):
        raise ValueError("DCT-I is not defined for size < 2")
    return ax, tuple(ns), norm, t  # type: ignore[return-value]


def out_lengths(kind: str, shape: Tuple[int, ...], axes: Tuple[int, ...],
                ns: Tuple[int, ...]) -> Tuple[int, ...]:
    """The global shape of transform ``kind`` of an array of ``shape``."""
    out = list(shape)
    for a, n in zip(axes, ns):
        out[a] = n
    if kind == "rfftn":
        out[axes[-1]] = ns[-1] // 2 + 1
    return tuple(out)
