"""The numpy.fft/scipy.fft-style front end: :func:`fftn`, :func:`ifftn`, :func:`rfftn`,
:func:`irfftn`, :func:`hfftn`, :func:`ihfftn`, their 1-D and 2-D forms, :func:`dctn`,
:func:`idctn`, :func:`dstn`, :func:`idstn` and their 1-D forms, :func:`plan` (the cached
:class:`~pyshard.fft.FFTPlan` of a layout) and :func:`tune_mesh`; re-exported by
:mod:`pyshard.fft`, whose docstring says how a transform runs and where its result is laid
out.

The names numpy.fft has (``fft`` ... ``irfftn``, ``hfft``, ``ihfft``) raise numpy's errors
and numpy 2.x's DeprecationWarnings; the scipy.fft-only names (``hfft2`` ... ``ihfftn``, the
DCT/DST) raise scipy's. Every function takes scipy's ``overwrite_x=`` (accepted; the input
is never overwritten), ``workers=`` (checked as scipy checks it, then passed to the local
transforms) and numpy's ``out=`` (a :class:`~pyshard.ShardedArray` of the result's layout);
the FFTs take scipy's ``plan=`` (``NotImplementedError`` for anything but None, as
scipy.fft raises) and the DCT/DST scipy's ``orthogonalize=``.
"""

from __future__ import annotations

import numbers
import warnings
from typing import Any, Dict, Optional, Sequence, Tuple, Union

import numpy as np

from .. import _backend as bk
from .. import _validate
from .._cache import memoize
from ..array import ShardedArray
from ..layout import Layout, Placement, Replicate, Shard, check_placements, sizes_key
from . import fftplan
from .engine import have_scipy
from .fftplan import FFTPlan, run_passes
from .kinds import (
    PLAN_NOT_SUPPORTED,
    R2C,
    R2R,
    check_args,
    check_workers,
    out_lengths,
    real_dtype,
    result_dtype,
    warnings_of,
)
from .planner import reduced_first
from .tune import mesh_shapes
from .tune import tune_mesh as _tune

PlacementsOut = Union[None, str, Sequence[Placement]]
SizesOut = Optional[Dict[int, Sequence[int]]]


@memoize
def _cached(layout: Layout, kind: str, axes: Tuple[int, ...], ns: Tuple[int, ...],
            norm: Optional[str], type_: int, target: Optional[Tuple],
            orthogonalize: Optional[bool]) -> FFTPlan:
    return FFTPlan(layout, kind, axes, ns, norm, type_, target, orthogonalize)


def _orthogonalize(v: object) -> Optional[bool]:
    """scipy's ``orthogonalize`` (None: True with ``norm="ortho"``, else False) as a bool."""
    if v is None:
        return None
    if isinstance(v, (np.bool_, numbers.Number)):  # scipy takes any number's truth
        return bool(v)
    # scipy.fft raises RuntimeError (a failed cast to C++ bool) for anything else
    raise RuntimeError(f"orthogonalize must be None, True or False, got {v!r}")


def _plan(layout: Layout, kind: str, axes: Any, s: Any, norm: Any, placements: PlacementsOut,
          sizes: SizesOut, type_: Any, orthogonalize: Optional[bool], api: Optional[str],
          one: bool) -> FFTPlan:
    ax, ns, norm, t = check_args(layout.shape, layout.dtype, kind, axes, s, norm, type_,
                                 api=api, one=one)
    if kind in R2R and not have_scipy():
        raise ImportError(
            f"pyshard.fft.{kind} needs scipy (pip install 'pyshard[fft]' or pip install scipy)"
        )
    out_shape = out_lengths(kind, layout.shape, ax, ns)
    if isinstance(placements, str):
        if placements != "any":
            raise ValueError(f"placements must be a list, None or 'any', got {placements!r}")
        if sizes is not None:
            raise ValueError("sizes= needs placements (not 'any')")
        target = None
    else:
        if placements is None:
            red = reduced_first(layout.placements, layout.dtype)
            pl = tuple(Replicate() if m in red else p for m, p in enumerate(layout.placements))
            if sizes is None:  # keep the input's extents along axes whose length stays
                sizes = {
                    d: ext for d, ext in layout.sizes.items() if out_shape[d] == layout.shape[d]
                }
        else:
            pl = check_placements(placements, len(layout.mesh_shape), len(layout.shape))
        key = sizes_key(sizes) or None
        # the result layout must be valid: check it now (the same error on every rank)
        Layout(out_shape, result_dtype(kind, layout.dtype), layout.mesh_shape, pl,
               dict(key) if key else None)
        target = (pl, key)
    # scipy's default (True with norm="ortho") is the local transform's own: kept as None
    orth = None if kind not in R2R or orthogonalize == (norm == "ortho") else orthogonalize
    return _cached(layout, kind, ax, ns, norm, t, target, orth)


def plan(
    layout: Layout,
    kind: str,
    axes: Optional[Sequence[int]] = None,
    s: Optional[Sequence[int]] = None,
    norm: Optional[str] = None,
    placements: PlacementsOut = None,
    sizes: SizesOut = None,
    type: Optional[int] = None,  # noqa: A002 - scipy's name
    *,
    orthogonalize: Optional[bool] = None,
) -> FFTPlan:
    """The (cached, reusable) plan of transform ``kind`` (one of :data:`KINDS`) of arrays
    laid out as ``layout``; pure Python, no communication. ``placements``/``sizes`` as in
    :func:`fftn` (``"any"``: wherever the last pass ends); ``type`` and ``orthogonalize``
    (scipy's) for the DCT/DST."""
    if isinstance(layout, ShardedArray):
        layout = layout.layout
    if not isinstance(layout, Layout):
        raise TypeError(f"pyshard.fft.plan: layout must be a pyshard.Layout, got {layout!r}")
    return _plan(layout, kind, axes, s, norm, placements, sizes, type,
                 _orthogonalize(orthogonalize), None, False)


# ----------------------------------------------------------------------------- out=

# numpy's 1-D function of each kind (the ufunc whose output numpy.fft casts into out=);
# numpy.fft.hfft ignores out=, and the others are scipy's alone
_NUMPY_1D = {"fftn": "fft", "ifftn": "ifft", "rfftn": "rfft", "irfftn": "irfft",
             "ihfftn": "ihfft"}


def _cast_error(p: FFTPlan, name: str, api: Optional[str], to: np.dtype) -> TypeError:
    """The TypeError numpy.fft raises for an ``out=`` its result cannot be cast into
    (``same_kind``): numpy's own, from the same call on a few points, for the names numpy
    has; the same message naming ``name`` for the others."""
    f = _NUMPY_1D.get(p.kind) if api == "numpy" else None
    if f is not None:
        n = p.s[-1]
        dt = p.dst.dtype
        nin, nout = n, n
        if p.kind in R2C:
            dt, nout = real_dtype(dt), n // 2 + 1
        elif p.kind == "irfftn":
            dt, nin = np.result_type(dt, np.complex64), n // 2 + 1
        try:
            getattr(np.fft, f)(np.zeros(nin, dt), n=n, out=np.empty(nout, to))
        except TypeError as e:
            return e
    return TypeError(f"Cannot cast {name} output from {p.dst.dtype!r} to {to!r} with casting "
                     "rule 'same_kind'")


def _run(p: FFTPlan, x: ShardedArray, out: Any, workers: Any, name: str,
         api: Optional[str]) -> ShardedArray:
    """``p.forward(x)``, written into ``out`` where given: a ShardedArray of the result's
    shape and layout whose dtype the result casts to (``same_kind``, as numpy's ``out=``),
    or this rank's shard of the result (``FFTPlan.forward``'s ``out=``). Every check of a
    ShardedArray ``out`` reads only what every rank shares (shapes, dtypes, layouts); a plain
    array is a rank-local fact, agreed by one small allreduce (``FFTPlan.forward``): every
    rank raises the same. So is a ShardedArray out's local array (its layout is checked
    first): the same allreduce agrees that it is writeable and of its layout's shape."""
    if out is None:
        return p.forward(x, workers=workers)
    if not isinstance(out, ShardedArray):
        if isinstance(out, np.ndarray) or bk.is_device(out):
            return p.forward(x, out=out, workers=workers)
        raise TypeError(f"return arrays must be of ArrayType: out must be a pyshard."
                        f"ShardedArray, got {type(out).__name__}")
    dst = p.dst
    if tuple(out.shape) != tuple(dst.shape):
        raise ValueError(f"output array has wrong shape. (out of pyshard.fft.{name} has "
                         f"shape {tuple(out.shape)}, the result {tuple(dst.shape)})")
    if not np.can_cast(dst.dtype, out.dtype, "same_kind"):
        raise _cast_error(p, name, api, out.dtype)
    if out.mesh is not x.mesh:  # (another mesh of the same shape would place its shards
        # elsewhere: the same layout, other ranks)
        raise ValueError(f"out lies on another mesh than the input of pyshard.fft.{name}: "
                         "out= must be a ShardedArray on the input's Mesh")
    lay = out.layout
    if (lay.mesh_shape != dst.mesh_shape or tuple(lay.placements) != tuple(dst.placements)
            or lay.sizes != dst.sizes):
        raise ValueError(
            f"out is laid out as {lay}, the result of pyshard.fft.{name} as {dst} "
            "(placements= and sizes= choose the result's layout)"
        )
    loc = out.local
    # out's local array on each rank (replaced, or made read-only, on one?): agreed by one
    # small allreduce, so every rank raises or none does
    fftplan.agree_out(fftplan.out_problem(loc, out.layout, x), loc, out.layout, x, True)
    xp = bk.xp_of(loc)
    direct = (out.dtype == dst.dtype and loc.flags.c_contiguous
              and bk.is_device(loc) == bk.is_device(x.local)
              and not xp.may_share_memory(loc, x.local))
    if direct:
        run_passes(p.passes, x, loc, p.norm, p.type, workers, None,
                   orthogonalize=p.orthogonalize)
    else:  # another dtype, or out is (a view of) the input: transform, then cast into out
        # (run_passes, not p.forward: whether out shares x's memory is this rank's fact (an
        # empty shard never does), and p.forward's validation check would then run on some
        # ranks only; _go's check already covered the call)
        res = run_passes(p.passes, x, None, p.norm, p.type, workers, None,
                         orthogonalize=p.orthogonalize)
        xp.copyto(loc, res.local, casting="same_kind")
    return out


# ----------------------------------------------------------------------------- functions


def _check_x(x: object, name: str) -> ShardedArray:
    if not isinstance(x, ShardedArray):
        raise TypeError(f"pyshard.fft.{name}: x must be a pyshard.ShardedArray, got "
                        f"{type(x).__name__}")
    return x


def _go(name: str, kind: str, x: ShardedArray, s: Any, axes: Any, norm: Any, placements: Any,
        sizes: Any, type_: Any = None, *, api: str, one: bool = False, out: Any = None,
        workers: Any = None, plan_: Any = None, orthogonalize: Any = None) -> ShardedArray:
    """Check the arguments (every error before any communication, the same on every rank),
    warn as numpy 2.x does (``api="numpy"``), plan and run."""
    x = _check_x(x, name)
    if plan_ is not None:
        raise NotImplementedError(PLAN_NOT_SUPPORTED)
    if api == "numpy" and not one and isinstance(s, numbers.Integral):
        # numpy.fft's n-D forms iterate s (scipy.fft's take a scalar as one length)
        raise TypeError(f"'{type(s).__name__}' object is not iterable")
    if kind in R2R and type_ is None:  # scipy.fft's DCT/DST take no None for type
        raise TypeError(f"pyshard.fft.{name}: type must be an integer, 1 to 4, got None")
    try:
        workers = check_workers(workers)
        orth = _orthogonalize(orthogonalize)
    except (TypeError, ValueError) as e:  # (validation mode: the others wait in agree)
        _validate.refused(x.mesh.comm, f"pyshard.fft.{name}", e)
        raise
    if _validate.enabled:  # one small Allgather: ranks that disagree raise on every rank
        _validate.agree(x.mesh.comm, f"pyshard.fft.{name}", {
            "layout": repr(x.layout),
            # (spelled alike where they mean the same: a list or a tuple of axes or of s,
            # and norm=None or "backward")
            "arguments": repr((_as_tuple(axes), _as_tuple(s),
                               "backward" if norm is None else norm, type_, orth)),
            "result layout": repr((placements, sizes)),
            "local shard": x.local_problem() or "fits the layout",
            "out": "None" if out is None else (
                "a ShardedArray" if isinstance(out, ShardedArray) else "a plain array"),
        })
    p = _plan(x.layout, kind, axes, s, norm, placements, sizes, type_, orth, api, one)
    if api == "numpy":  # after the checks: an invalid call raises its error
        for msg in warnings_of(s, axes, len(x.shape)):
            warnings.warn(msg, DeprecationWarning, stacklevel=3)
    return _run(p, x, out, workers, name, api)


def _one(n: Optional[int]) -> Optional[Tuple[int]]:
    return None if n is None else (n,)


Axes = Optional[Sequence[int]]
Lengths = Optional[Sequence[int]]


def fftn(x: ShardedArray, s: Lengths = None, axes: Axes = None, norm: Optional[str] = None,
         placements: PlacementsOut = None, sizes: SizesOut = None, *, out: Any = None,
         overwrite_x: bool = False, workers: Optional[int] = None,
         plan: Any = None) -> ShardedArray:
    """``numpy.fft.fftn`` (``scipy.fft.fftn``) of the global array of ``x``; collective (see
    the module doc)."""
    return _go("fftn", "fftn", x, s, axes, norm, placements, sizes, api="numpy", out=out,
               workers=workers, plan_=plan)


def ifftn(x: ShardedArray, s: Lengths = None, axes: Axes = None, norm: Optional[str] = None,
          placements: PlacementsOut = None, sizes: SizesOut = None, *, out: Any = None,
          overwrite_x: bool = False, workers: Optional[int] = None,
          plan: Any = None) -> ShardedArray:
    """``numpy.fft.ifftn`` of the global array of ``x``; collective."""
    return _go("ifftn", "ifftn", x, s, axes, norm, placements, sizes, api="numpy", out=out,
               workers=workers, plan_=plan)


def rfftn(x: ShardedArray, s: Lengths = None, axes: Axes = None, norm: Optional[str] = None,
          placements: PlacementsOut = None, sizes: SizesOut = None, *, out: Any = None,
          overwrite_x: bool = False, workers: Optional[int] = None,
          plan: Any = None) -> ShardedArray:
    """``numpy.fft.rfftn`` of the (real) global array of ``x``; collective."""
    return _go("rfftn", "rfftn", x, s, axes, norm, placements, sizes, api="numpy", out=out,
               workers=workers, plan_=plan)


def irfftn(x: ShardedArray, s: Lengths = None, axes: Axes = None, norm: Optional[str] = None,
           placements: PlacementsOut = None, sizes: SizesOut = None, *, out: Any = None,
           overwrite_x: bool = False, workers: Optional[int] = None,
           plan: Any = None) -> ShardedArray:
    """``numpy.fft.irfftn`` of the global array of ``x``; collective."""
    return _go("irfftn", "irfftn", x, s, axes, norm, placements, sizes, api="numpy", out=out,
               workers=workers, plan_=plan)


def hfftn(x: ShardedArray, s: Lengths = None, axes: Axes = None, norm: Optional[str] = None,
          placements: PlacementsOut = None, sizes: SizesOut = None, *, out: Any = None,
          overwrite_x: bool = False, workers: Optional[int] = None,
          plan: Any = None) -> ShardedArray:
    """``scipy.fft.hfftn`` of the (Hermitian-symmetric) global array of ``x``: real, of
    length ``s[-1]`` (default ``2 (m - 1)``) along the last axis; ``fftn`` over the other
    axes, then ``hfft`` along the last; collective."""
    return _go("hfftn", "hfftn", x, s, axes, norm, placements, sizes, api="scipy", out=out,
               workers=workers, plan_=plan)


def ihfftn(x: ShardedArray, s: Lengths = None, axes: Axes = None, norm: Optional[str] = None,
           placements: PlacementsOut = None, sizes: SizesOut = None, *, out: Any = None,
           overwrite_x: bool = False, workers: Optional[int] = None,
           plan: Any = None) -> ShardedArray:
    """``scipy.fft.ihfftn`` of the (real) global array of ``x``: ``ihfft`` along the last
    axis (``n // 2 + 1`` bins), then ``ifftn`` over the others; collective."""
    return _go("ihfftn", "ihfftn", x, s, axes, norm, placements, sizes, api="scipy", out=out,
               workers=workers, plan_=plan)


def fft(x: ShardedArray, n: Optional[int] = None, axis: int = -1, norm: Optional[str] = None,
        placements: PlacementsOut = None, sizes: SizesOut = None, *, out: Any = None,
        overwrite_x: bool = False, workers: Optional[int] = None,
        plan: Any = None) -> ShardedArray:
    """``numpy.fft.fft`` along one axis of the global array; collective."""
    return _go("fft", "fftn", x, _one(n), (axis,), norm, placements, sizes, api="numpy",
               one=True, out=out, workers=workers, plan_=plan)


def ifft(x: ShardedArray, n: Optional[int] = None, axis: int = -1, norm: Optional[str] = None,
         placements: PlacementsOut = None, sizes: SizesOut = None, *, out: Any = None,
         overwrite_x: bool = False, workers: Optional[int] = None,
         plan: Any = None) -> ShardedArray:
    """``numpy.fft.ifft`` along one axis of the global array; collective."""
    return _go("ifft", "ifftn", x, _one(n), (axis,), norm, placements, sizes, api="numpy",
               one=True, out=out, workers=workers, plan_=plan)


def rfft(x: ShardedArray, n: Optional[int] = None, axis: int = -1, norm: Optional[str] = None,
         placements: PlacementsOut = None, sizes: SizesOut = None, *, out: Any = None,
         overwrite_x: bool = False, workers: Optional[int] = None,
         plan: Any = None) -> ShardedArray:
    """``numpy.fft.rfft`` along one axis of the global array; collective."""
    return _go("rfft", "rfftn", x, _one(n), (axis,), norm, placements, sizes, api="numpy",
               one=True, out=out, workers=workers, plan_=plan)


def irfft(x: ShardedArray, n: Optional[int] = None, axis: int = -1, norm: Optional[str] = None,
          placements: PlacementsOut = None, sizes: SizesOut = None, *, out: Any = None,
          overwrite_x: bool = False, workers: Optional[int] = None,
          plan: Any = None) -> ShardedArray:
    """``numpy.fft.irfft`` along one axis of the global array; collective."""
    return _go("irfft", "irfftn", x, _one(n), (axis,), norm, placements, sizes, api="numpy",
               one=True, out=out, workers=workers, plan_=plan)


def hfft(x: ShardedArray, n: Optional[int] = None, axis: int = -1, norm: Optional[str] = None,
         placements: PlacementsOut = None, sizes: SizesOut = None, *, out: Any = None,
         overwrite_x: bool = False, workers: Optional[int] = None,
         plan: Any = None) -> ShardedArray:
    """``numpy.fft.hfft`` along one axis of the global array (the real spectrum of a
    Hermitian-symmetric signal: ``irfft`` of the conjugate, unscaled); collective."""
    return _go("hfft", "hfftn", x, _one(n), (axis,), norm, placements, sizes, api="numpy",
               one=True, out=out, workers=workers, plan_=plan)


def ihfft(x: ShardedArray, n: Optional[int] = None, axis: int = -1, norm: Optional[str] = None,
          placements: PlacementsOut = None, sizes: SizesOut = None, *, out: Any = None,
          overwrite_x: bool = False, workers: Optional[int] = None,
          plan: Any = None) -> ShardedArray:
    """``numpy.fft.ihfft`` along one axis of the (real) global array (the conjugate of
    ``rfft``, scaled by ``1/n``); collective."""
    return _go("ihfft", "ihfftn", x, _one(n), (axis,), norm, placements, sizes, api="numpy",
               one=True, out=out, workers=workers, plan_=plan)


def fft2(x: ShardedArray, s: Lengths = None, axes: Axes = (-2, -1),
         norm: Optional[str] = None, placements: PlacementsOut = None,
         sizes: SizesOut = None, *, out: Any = None, overwrite_x: bool = False,
         workers: Optional[int] = None, plan: Any = None) -> ShardedArray:
    """``numpy.fft.fft2``; collective."""
    return _go("fft2", "fftn", x, s, axes, norm, placements, sizes, api="numpy", out=out,
               workers=workers, plan_=plan)


def ifft2(x: ShardedArray, s: Lengths = None, axes: Axes = (-2, -1),
          norm: Optional[str] = None, placements: PlacementsOut = None,
          sizes: SizesOut = None, *, out: Any = None, overwrite_x: bool = False,
          workers: Optional[int] = None, plan: Any = None) -> ShardedArray:
    """``numpy.fft.ifft2``; collective."""
    return _go("ifft2", "ifftn", x, s, axes, norm, placements, sizes, api="numpy", out=out,
               workers=workers, plan_=plan)


def rfft2(x: ShardedArray, s: Lengths = None, axes: Axes = (-2, -1),
          norm: Optional[str] = None, placements: PlacementsOut = None,
          sizes: SizesOut = None, *, out: Any = None, overwrite_x: bool = False,
          workers: Optional[int] = None, plan: Any = None) -> ShardedArray:
    """``numpy.fft.rfft2``; collective."""
    return _go("rfft2", "rfftn", x, s, axes, norm, placements, sizes, api="numpy", out=out,
               workers=workers, plan_=plan)


def irfft2(x: ShardedArray, s: Lengths = None, axes: Axes = (-2, -1),
           norm: Optional[str] = None, placements: PlacementsOut = None,
           sizes: SizesOut = None, *, out: Any = None, overwrite_x: bool = False,
           workers: Optional[int] = None, plan: Any = None) -> ShardedArray:
    """``numpy.fft.irfft2``; collective."""
    return _go("irfft2", "irfftn", x, s, axes, norm, placements, sizes, api="numpy", out=out,
               workers=workers, plan_=plan)


def hfft2(x: ShardedArray, s: Lengths = None, axes: Axes = (-2, -1),
          norm: Optional[str] = None, placements: PlacementsOut = None,
          sizes: SizesOut = None, *, out: Any = None, overwrite_x: bool = False,
          workers: Optional[int] = None, plan: Any = None) -> ShardedArray:
    """``scipy.fft.hfft2``; collective."""
    return _go("hfft2", "hfftn", x, s, axes, norm, placements, sizes, api="scipy", out=out,
               workers=workers, plan_=plan)


def ihfft2(x: ShardedArray, s: Lengths = None, axes: Axes = (-2, -1),
           norm: Optional[str] = None, placements: PlacementsOut = None,
           sizes: SizesOut = None, *, out: Any = None, overwrite_x: bool = False,
           workers: Optional[int] = None, plan: Any = None) -> ShardedArray:
    """``scipy.fft.ihfft2``; collective."""
    return _go("ihfft2", "ihfftn", x, s, axes, norm, placements, sizes, api="scipy", out=out,
               workers=workers, plan_=plan)


def dctn(x: ShardedArray, type: int = 2, s: Lengths = None,  # noqa: A002 - scipy's name
         axes: Axes = None, norm: Optional[str] = None, placements: PlacementsOut = None,
         sizes: SizesOut = None, *, out: Any = None, overwrite_x: bool = False,
         workers: Optional[int] = None, orthogonalize: Optional[bool] = None) -> ShardedArray:
    """``scipy.fft.dctn`` of the global array; collective."""
    return _go("dctn", "dctn", x, s, axes, norm, placements, sizes, type, api="scipy",
               out=out, workers=workers, orthogonalize=orthogonalize)


def idctn(x: ShardedArray, type: int = 2, s: Lengths = None,  # noqa: A002
          axes: Axes = None, norm: Optional[str] = None, placements: PlacementsOut = None,
          sizes: SizesOut = None, *, out: Any = None, overwrite_x: bool = False,
          workers: Optional[int] = None, orthogonalize: Optional[bool] = None) -> ShardedArray:
    """``scipy.fft.idctn`` of the global array; collective."""
    return _go("idctn", "idctn", x, s, axes, norm, placements, sizes, type, api="scipy",
               out=out, workers=workers, orthogonalize=orthogonalize)


def dstn(x: ShardedArray, type: int = 2, s: Lengths = None,  # noqa: A002
         axes: Axes = None, norm: Optional[str] = None, placements: PlacementsOut = None,
         sizes: SizesOut = None, *, out: Any = None, overwrite_x: bool = False,
         workers: Optional[int] = None, orthogonalize: Optional[bool] = None) -> ShardedArray:
    """``scipy.fft.dstn`` of the global array; collective."""
    return _go("dstn", "dstn", x, s, axes, norm, placements, sizes, type, api="scipy",
               out=out, workers=workers, orthogonalize=orthogonalize)


def idstn(x: ShardedArray, type: int = 2, s: Lengths = None,  # noqa: A002
          axes: Axes = None, norm: Optional[str] = None, placements: PlacementsOut = None,
          sizes: SizesOut = None, *, out: Any = None, overwrite_x: bool = False,
          workers: Optional[int] = None, orthogonalize: Optional[bool] = None) -> ShardedArray:
    """``scipy.fft.idstn`` of the global array; collective."""
    return _go("idstn", "idstn", x, s, axes, norm, placements, sizes, type, api="scipy",
               out=out, workers=workers, orthogonalize=orthogonalize)


def dct(x: ShardedArray, type: int = 2, n: Optional[int] = None, axis: int = -1,  # noqa: A002
        norm: Optional[str] = None, placements: PlacementsOut = None,
        sizes: SizesOut = None, *, out: Any = None, overwrite_x: bool = False,
        workers: Optional[int] = None, orthogonalize: Optional[bool] = None) -> ShardedArray:
    """``scipy.fft.dct`` along one axis; collective."""
    return _go("dct", "dctn", x, _one(n), (axis,), norm, placements, sizes, type, api="scipy",
               one=True, out=out, workers=workers, orthogonalize=orthogonalize)


def idct(x: ShardedArray, type: int = 2, n: Optional[int] = None, axis: int = -1,  # noqa: A002
         norm: Optional[str] = None, placements: PlacementsOut = None,
         sizes: SizesOut = None, *, out: Any = None, overwrite_x: bool = False,
         workers: Optional[int] = None, orthogonalize: Optional[bool] = None) -> ShardedArray:
    """``scipy.fft.idct`` along one axis; collective."""
    return _go("idct", "idctn", x, _one(n), (axis,), norm, placements, sizes, type,
               api="scipy", one=True, out=out, workers=workers, orthogonalize=orthogonalize)


def dst(x: ShardedArray, type: int = 2, n: Optional[int] = None, axis: int = -1,  # noqa: A002
        norm: Optional[str] = None, placements: PlacementsOut = None,
        sizes: SizesOut = None, *, out: Any = None, overwrite_x: bool = False,
        workers: Optional[int] = None, orthogonalize: Optional[bool] = None) -> ShardedArray:
    """``scipy.fft.dst`` along one axis; collective."""
    return _go("dst", "dstn", x, _one(n), (axis,), norm, placements, sizes, type, api="scipy",
               one=True, out=out, workers=workers, orthogonalize=orthogonalize)


def idst(x: ShardedArray, type: int = 2, n: Optional[int] = None, axis: int = -1,  # noqa: A002
         norm: Optional[str] = None, placements: PlacementsOut = None,
         sizes: SizesOut = None, *, out: Any = None, overwrite_x: bool = False,
         workers: Optional[int] = None, orthogonalize: Optional[bool] = None) -> ShardedArray:
    """``scipy.fft.idst`` along one axis; collective."""
    return _go("idst", "idstn", x, _one(n), (axis,), norm, placements, sizes, type,
               api="scipy", one=True, out=out, workers=workers, orthogonalize=orthogonalize)


def tune_mesh(comm: Any, shape: Sequence[int], kind: str = "fftn",
              axes: Optional[Sequence[int]] = None, dtype: Any = None, trials: int = 3,
              max_ndim: int = 2) -> Any:
    """The :class:`~pyshard.Mesh` (a 1-D slab or a pencil mesh of up to ``max_ndim`` dims,
    sharding the leading axes, no size-1 mesh dims) on which ``kind`` over ``axes`` of a
    global array of ``shape`` runs fastest (forward + backward, ``placements="any"``; the
    slowest rank, median of ``trials``); collective, the same mesh on every rank, kept in
    ``PYSHARD_TUNE_FILE`` (see :func:`pyshard.tune_mesh`)."""
    shape = tuple(int(n) for n in shape)
    dt = np.dtype(np.float64 if kind in R2C else np.complex128) if dtype is None else (
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


def _as_tuple(v: Any) -> Any:
    """A list as a tuple (validation mode's spelling of ``axes=`` and ``s=``), else ``v``."""
    return tuple(v) if isinstance(v, list) else v
