"""The numpy-style front end: :func:`fftn`, :func:`ifftn`, :func:`rfftn`, :func:`irfftn`,
their 1-D and 2-D forms, :func:`dctn`, :func:`idctn`, :func:`dstn`, :func:`idstn` and their
1-D forms, :func:`plan` (the cached :class:`~pyshard.fft.FFTPlan` of a layout) and
:func:`tune_mesh`; re-exported by :mod:`pyshard.fft`, whose docstring says how a transform
runs and where its result is laid out.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Tuple, Union

import numpy as np

from .. import _validate
from .._cache import memoize
from ..array import ShardedArray
from ..layout import Layout, Partial, Placement, Replicate, Shard, check_placements, sizes_key
from .engine import have_scipy
from .fftplan import FFTPlan
from .kinds import R2R, check_args, out_lengths, result_dtype
from .tune import mesh_shapes
from .tune import tune_mesh as _tune

PlacementsOut = Union[None, str, Sequence[Placement]]
SizesOut = Optional[Dict[int, Sequence[int]]]


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
    ax, ns, norm, t = check_args(layout.shape, layout.dtype, kind, axes, s, norm, type)
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
        key = sizes_key(sizes) or None
        # the result layout must be valid: check it now (the same error on every rank)
        Layout(out_shape, result_dtype(kind, layout.dtype), layout.mesh_shape, pl,
               dict(key) if key else None)
        target = (pl, key)
    return _cached(layout, kind, ax, ns, norm, t, target)


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
