"""Distributed FFTs and real-to-real transforms of the GLOBAL array of a ShardedArray.

The names and arguments are numpy.fft's and scipy.fft's: :func:`fftn`, :func:`ifftn`,
:func:`rfftn`, :func:`irfftn`, :func:`hfftn`, :func:`ihfftn` (``s``, ``axes``, ``norm``),
their 1-D and 2-D forms (:func:`fft`, :func:`ifft`, :func:`rfft`, :func:`irfft`,
:func:`hfft`, :func:`ihfft`, :func:`fft2`, :func:`ifft2`, :func:`rfft2`, :func:`irfft2`,
:func:`hfft2`, :func:`ihfft2`) and :func:`dctn`, :func:`idctn`, :func:`dstn`, :func:`idstn`
(``type`` 1-4, ``s``, ``axes``, ``norm``, ``orthogonalize``; 1-D :func:`dct`, :func:`idct`,
:func:`dst`, :func:`idst`). Each takes ``placements=None, sizes=None`` for the result's
layout, numpy's ``out=`` (a ShardedArray of the result's layout) and scipy's
``overwrite_x=``, ``workers=`` (and ``plan=`` for the FFTs), and returns a
:class:`~pyshard.ShardedArray`. The names numpy.fft has raise numpy's errors and numpy
2.x's DeprecationWarnings, the scipy.fft-only names scipy's (:mod:`~pyshard.fft.api`).

How a transform runs (:func:`plan`, pure Python, cached like redistribution plans): every
transformed axis that is whole on each rank (no mesh dim shards it) is transformed locally
(one scipy.fft call for all of them); for each transformed axis still sharded, one pyshard
redistribute moves its Shard onto an axis that is done or a batch axis, on the same mesh dims
(one exchange on that sub-communicator), and so on; at the end one redistribute to the
requested layout unless ``placements="any"``. ``rfftn`` and ``ihfftn`` transform their last
axis first (real to complex), ``irfftn`` and ``hfftn`` last (``hfftn``: ``fftn`` over the
other axes, then scipy's/numpy's ``hfft`` along the last, as scipy.fft computes it).
``s=`` pads or truncates an axis when it is whole. Replicate mesh dims just compute;
``Partial("sum")`` and ``Partial("avg")`` inputs of floating or complex dtype stay Partial
(every transform here is linear over the reals); ``Partial("max"/"min")``, and
``Partial("sum")`` of bool (a logical or) or integers (wrapping), are reduced first
(Replicate in the result's default placements).

Result layout: ``placements=None`` keeps the input's placements, and its shard extents
along every axis whose length does not change (rfftn's last axis, ``s=`` axes are balanced).
``placements="any"``: the layout the last pass ended in (fewest transposes, like FFTW-MPI's
``TRANSPOSED_OUT``); ``.placements``/``.box`` of the result say where the data is, and
``plan(...).backward`` returns to the input layout with no extra moves.

Repeated axes raise ``ValueError`` (as scipy.fft does; numpy transforms twice).
Local transforms: scipy.fft where scipy is installed (``workers=`` passed through), else
numpy.fft (DCT/DST then raise ImportError); pyFFTW for the c2c and r2c/c2r passes where
``PYSHARD_FFT_BACKEND`` names it (:func:`backend`); cupy arrays go through cupyx.scipy.fft.

The package, by role (heFFTe-style; each imports only those above it):
:mod:`~pyshard.fft.kinds` (the kinds, norms, dtype rules and argument checks: pure),
:mod:`~pyshard.fft.engine` (the local engine: backends, scratch and pooled output),
:mod:`~pyshard.fft.planner` (the passes of a transform, from the layout alone),
:mod:`~pyshard.fft.fftplan` (:class:`FFTPlan`, :func:`run_passes`),
:mod:`~pyshard.fft.api` (this front end, re-exported here) and :mod:`~pyshard.fft.tune`
(``tune_mesh``, which imports no other module of the package).
"""

from __future__ import annotations

from .api import PlacementsOut as PlacementsOut  # the argument types of the signatures
from .api import SizesOut as SizesOut
from .api import (
    dct,
    dctn,
    dst,
    dstn,
    fft,
    fft2,
    fftn,
    hfft,
    hfft2,
    hfftn,
    idct,
    idctn,
    idst,
    idstn,
    ifft,
    ifft2,
    ifftn,
    ihfft,
    ihfft2,
    ihfftn,
    irfft,
    irfft2,
    irfftn,
    plan,
    rfft,
    rfft2,
    rfftn,
    tune_mesh,
)
from .engine import backend
from .fftplan import FFTPlan
from .fftplan import run_passes as run_passes  # the benchmark's timed split of the passes
from .kinds import INVERSE as INVERSE
from .kinds import KINDS as KINDS

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
    "hfft",
    "hfft2",
    "hfftn",
    "idct",
    "idctn",
    "idst",
    "idstn",
    "ifft",
    "ifft2",
    "ifftn",
    "ihfft",
    "ihfft2",
    "ihfftn",
    "irfft",
    "irfft2",
    "irfftn",
    "plan",
    "rfft",
    "rfft2",
    "rfftn",
    "tune_mesh",
]

