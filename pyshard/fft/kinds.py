"""What a transform is, decided from its arguments alone: the kinds and their inverses, the
norms and their factors, the dtypes a pass takes and gives, and the checked arguments
(axes, lengths, norm, type, sizes) of :func:`pyshard.fft.plan`.

Pure functions of shapes, dtypes and arguments (no arrays, no MPI), so every rank gets the
same answer and raises the same error before any communication. The bottom of the package:
:mod:`~pyshard.fft.engine`, :mod:`~pyshard.fft.planner` and :mod:`~pyshard.fft.api` use it.
"""

from __future__ import annotations

import numbers
import operator
import os
from math import prod
from typing import List, Optional, Sequence, Tuple

import numpy as np

from .. import _dtypes

try:
    from numpy.exceptions import AxisError
except ImportError:  # pragma: no cover - numpy < 1.25
    AxisError = np.AxisError  # type: ignore[attr-defined,misc]

__all__ = [
    "C2R",
    "INVERSE",
    "KINDS",
    "NORMS",
    "R2C",
    "R2R",
    "SCALED",
    "check_args",
    "PLAN_NOT_SUPPORTED",
    "ZeroLengthError",
    "check_workers",
    "complex_dtype",
    "norm_factor",
    "out_lengths",
    "pass_in_dtype",
    "pass_out_dtype",
    "real_dtype",
    "result_dtype",
    "unscaled",
    "warnings_of",
]

KINDS = ("fftn", "ifftn", "rfftn", "irfftn", "hfftn", "ihfftn", "dctn", "idctn", "dstn",
         "idstn")
"""The transforms :func:`pyshard.fft.plan` takes."""

INVERSE = {
    "fftn": "ifftn",
    "ifftn": "fftn",
    "rfftn": "irfftn",
    "irfftn": "rfftn",
    "hfftn": "ihfftn",
    "ihfftn": "hfftn",
    "dctn": "idctn",
    "idctn": "dctn",
    "dstn": "idstn",
    "idstn": "dstn",
}
"""Each kind's inverse transform."""

NORMS = (None, "backward", "ortho", "forward")
R2R = ("dctn", "idctn", "dstn", "idstn")
class EmptyAxesError(ValueError, IndexError):
    """``axes=()``: numpy's ``rfftn``/``irfftn`` raise an IndexError, scipy's a ValueError
    (their c2c transforms return the input; pyshard raises in every function)."""


R2C = ("rfftn", "ihfftn")  # real input, last axis to n // 2 + 1 bins
C2R = ("irfftn", "hfftn")  # Hermitian input, last axis to n real values (default 2 (m - 1))
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
    if func in ("fftn", "ifftn", "rfft", "ihfft"):
        return complex_dtype(dt)
    if func in ("irfft", "hfft"):
        return real_dtype(dt)
    return complex_dtype(dt) if dt.kind == "c" else real_dtype(dt)  # DCT/DST keep real/complex


def pass_in_dtype(func: str, dt: np.dtype) -> np.dtype:
    """The dtype the local array is cast to before ``func`` runs on it."""
    if func in ("irfft", "hfft"):
        return complex_dtype(dt)
    if func in ("rfft", "ihfft"):
        return real_dtype(dt)
    return complex_dtype(dt) if dt.kind == "c" else real_dtype(dt)


def result_dtype(kind: str, dt: np.dtype) -> np.dtype:
    """The dtype of transform ``kind`` (one of :data:`KINDS`) of input ``dt``."""
    if kind in ("fftn", "ifftn") or kind in R2C:
        return complex_dtype(dt)
    if kind in C2R:
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
#
# ``api`` names whose errors a front end reproduces: "numpy" for the names numpy.fft has
# (fft ... irfftn, hfft, ihfft: numpy's exception types and messages), "scipy" for the
# scipy.fft-only names (hfft2 ... ihfftn, the DCT/DST: scipy's), None for
# :func:`pyshard.fft.plan` (scipy's messages). ``one``: a 1-D form (``n``, ``axis``).
# Where numpy or scipy raise from an internal step (an index into ``a.shape``, a ufunc
# loop, a pybind11 cast), the type is theirs and the message says what is wrong.


class ZeroLengthError(ValueError, RuntimeError):
    """A DCT-I of fewer than 2 points: scipy.fft raises ``RuntimeError("zero-length FFT
    requested")``; a ``ValueError`` too, as the argument is out of range."""


_NP_NORM = 'Invalid norm value {}; should be "backward","ortho" or "forward".'
_NP_NORM_INVERSE = 'Invalid norm value {}; should be "backward", "ortho" or "forward".'
_SP_NORM = 'Invalid norm value {!r}, should be "backward", "ortho" or "forward"'
_NP_S_NONE = (
    "Passing an array containing `None` values to `s` is deprecated in NumPy 2.0 and will "
    "raise an error in a future version of NumPy. To use the default behaviour of the "
    "corresponding 1-D transform, pass the value matching the default for its `n` "
    "parameter. To use the default behaviour for every axis, the `s` argument can be "
    "omitted."
)
_NP_AXES_NONE = (
    "`axes` should not be `None` if `s` is not `None` (Deprecated in NumPy 2.0). In a "
    "future version of NumPy, this will raise an error and `s[i]` will correspond to the "
    "size along the transformed axis specified by `axes[i]`. To retain current behaviour, "
    "pass a sequence [0, ..., k-1] to `axes` for an array of dimension k."
)
PLAN_NOT_SUPPORTED = "Passing a precomputed plan is not yet supported by scipy.fft functions"


def warnings_of(s: object, axes: object, ndim: int) -> List[str]:
    """numpy 2.x's DeprecationWarning messages for ``s`` with ``axes=None`` and for
    ``None`` entries in ``s``; the result is numpy's (the last ``len(s)`` axes; a ``None``
    entry takes that axis's default length). ``s`` with ``axes=None`` warns where
    ``len(s) < ndim``: there numpy's announced meaning (``s[i]`` for axis ``i``) gives another
    result; with one entry per axis both meanings agree, and that call stays silent."""
    if s is None or isinstance(s, numbers.Integral):
        return []
    out = []
    if axes is None and len(s) < ndim:  # type: ignore[arg-type]
        out.append(_NP_AXES_NONE)
    if any(n is None for n in s):  # type: ignore[union-attr]
        out.append(_NP_S_NONE)
    return out


def check_workers(workers: object) -> object:
    """``workers`` as scipy.fft checks it (None, or a nonzero int not below ``-cpu_count``;
    negative counts from the number of cores), or scipy's error."""
    if workers is None:
        return None
    if workers < 0:  # type: ignore[operator]  # a str raises scipy's TypeError here
        cpus = os.cpu_count() or 1
        if workers < -cpus:  # type: ignore[operator]
            raise ValueError(
                f"workers value out of range; got {workers}, must not be less than {-cpus}"
            )
    elif workers == 0:
        raise ValueError("workers must not be zero")
    if not isinstance(workers, numbers.Integral):
        raise TypeError(f"workers must be an integer, got {workers!r}")
    return workers


def _axis(a: object, ndim: int, api: Optional[str], one: bool) -> int:
    if not isinstance(a, numbers.Integral):  # (a bool is an axis for numpy and scipy alike)
        if api != "numpy" and not one:
            raise ValueError("axes must be a scalar or iterable of integers")
        raise TypeError(f"axes must be integers, got {a!r}")
    a = int(a)
    if not -ndim <= a < ndim:
        if api != "numpy" and not one:
            raise AxisError(a, ndim, "axes exceeds dimensionality of input")
        raise AxisError(a, ndim)
    return a % ndim


def _length(n: object, api: Optional[str], one: bool) -> int:
    """One entry of ``s`` (or ``n``) as an int, or the TypeError/ValueError numpy or scipy
    give for it."""
    if api == "numpy" and isinstance(n, (bool, np.bool_)):
        raise TypeError("an integer is required")
    if api != "numpy" and not one and not isinstance(n, (numbers.Integral, np.bool_)):
        raise ValueError("shape must be a scalar or iterable of integers")  # (True is 1)
    return operator.index(n)  # type: ignore[arg-type]


def _first_bad(kind: str, ns: Sequence[int]) -> int:
    """The entry of ``ns`` below 1 numpy meets first: numpy.fft transforms the last axis
    first (fftn, ifftn), the real axis first and then the others in order (rfftn), or the
    others in order and then the real axis (irfftn)."""
    idx = list(range(len(ns)))
    if kind in R2C:
        order = idx[-1:] + idx[:-1]
    elif kind in C2R:
        order = idx
    else:
        order = idx[::-1]
    return next(ns[i] for i in order if ns[i] < 1)


def check_args(
    shape: Tuple[int, ...], dtype: np.dtype, kind: str, axes: object, s: object, norm: object,
    type_: object, api: Optional[str] = None, one: bool = False,
) -> Tuple[Tuple[int, ...], Tuple[int, ...], Optional[str], int]:
    """Checked (axes, output lengths along them, norm, type), or the error numpy/scipy give
    (``api``: whose, see above; ``one``: ``s`` is a 1-D form's ``n``, where ``-1`` is out of
    range); from the layout alone, so every rank raises the same before any communication."""
    if kind not in KINDS:
        raise ValueError(f"pyshard.fft.plan: kind must be one of {KINDS}, got {kind!r}")
    ndim = len(shape)
    # a scalar s or axes is one entry: any number for scipy's names (a float then raises
    # scipy's ValueError below), an integer for numpy's
    scalar = numbers.Integral if api == "numpy" else numbers.Number
    if s is not None:
        if isinstance(s, scalar):
            s = (s,)
        s = tuple(s)  # type: ignore[arg-type]
    if axes is None:
        if s is not None and len(s) > ndim:
            if api == "numpy":  # the first axis numpy's loop meets: fftn, ifftn and rfftn
                # run from the last of the len(s) axes (-ndim - 1 is out first), irfftn from
                # the first (-len(s))
                raise AxisError(-len(s) if kind in C2R else -(ndim + 1), ndim)
            raise AxisError("shape requires more axes than are present")
        ax = tuple(range(ndim)) if s is None else tuple(range(ndim - len(s), ndim))
    else:
        if isinstance(axes, scalar):
            axes = (axes,)
        ax = tuple(_axis(a, ndim, api, one) for a in axes)  # type: ignore[union-attr]
    if not ax:  # (numpy's r-family raises IndexError here, scipy's ValueError: both)
        raise EmptyAxesError("axes must name at least one axis (at least 1 axis must be "
                             "transformed)")
    if len(set(ax)) != len(ax):
        raise ValueError("all axes must be unique")
    if s is not None and len(s) != len(ax):
        if api == "numpy":
            raise ValueError(
                f"Shape and axes have different lengths. (s has {len(s)} entries, axes "
                f"{len(ax)}: they must have the same length)"
            )
        raise ValueError("when given, axes and shape arguments have to be of the same length")
    if norm not in NORMS:
        if api == "numpy":
            raise ValueError((_NP_NORM if kind in ("fftn", "rfftn") else _NP_NORM_INVERSE)
                             .format(norm))
        raise ValueError(_SP_NORM.format(norm))
    if kind in R2C and dtype.kind == "c":
        raise TypeError("x must be a real sequence")
    t = 2
    if kind in R2R:
        if type_ is not None:
            try:
                t = operator.index(type_)  # type: ignore[arg-type]
            except TypeError:
                raise TypeError(
                    f"invalid {'DCT' if kind in ('dctn', 'idctn') else 'DST'} type "
                    f"{type_!r}: type must be an integer, 1 to 4"
                ) from None
        if t not in (1, 2, 3, 4):
            raise ValueError("invalid DCT type" if kind.startswith(("dct", "idct"))
                             else "invalid DST type")
    elif type_ is not None:
        raise TypeError(f"{kind} takes no type argument")
    ns = []
    for i, a in enumerate(ax):
        n = None if s is None else s[i]
        if n is None or (n == -1 and not one and not isinstance(n, bool)):
            if n is None and kind in C2R and i == len(ax) - 1:
                n = 2 * (shape[a] - 1)
            else:
                n = shape[a]
        ns.append(_length(n, api, one))
    if any(n < 1 for n in ns):
        if api == "numpy":
            raise ValueError(
                f"Invalid number of FFT data points ({_first_bad(kind, ns)}) specified."
            )
        raise ValueError(f"invalid number of data points ({ns[0] if one else ns}) specified")
    if kind in R2R and t == 1 and any(n < 2 for n in ns) and kind.startswith(("dct", "idct")):
        raise ZeroLengthError("zero-length FFT requested (DCT-I is not defined for size < 2)")
    return ax, tuple(ns), norm, t  # type: ignore[return-value]


def out_lengths(kind: str, shape: Tuple[int, ...], axes: Tuple[int, ...],
                ns: Tuple[int, ...]) -> Tuple[int, ...]:
    """The global shape of transform ``kind`` of an array of ``shape``."""
    out = list(shape)
    for a, n in zip(axes, ns):
        out[a] = n
    if kind in R2C:
        out[axes[-1]] = ns[-1] // 2 + 1
    return tuple(out)
