"""Array backends: numpy on the host, cupy on a GPU, and the transport a GPU step takes.

Arrays from other producers are viewed zero-copy: ``__cuda_array_interface__`` and
``__dlpack__`` on a CUDA device become cupy arrays, ``__dlpack__`` on the CPU (and numpy
scalars) become numpy arrays. Nothing here imports cupy until a device array shows up.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Dict, Optional

import numpy as np

from . import _core, _mpi

log = logging.getLogger("pyshard")

_DLPACK_CPU, _DLPACK_CUDA, _DLPACK_CUDA_HOST, _DLPACK_CUDA_MANAGED = 1, 2, 3, 13
_cupy: Any = None
_cupy_tried = False


def cupy() -> Any:
    """The cupy module, or None when it does not import."""
    global _cupy, _cupy_tried
    if not _cupy_tried:
        _cupy_tried = True
        try:
            import cupy as cp  # type: ignore[import-not-found]

            _cupy = cp
        except Exception:  # noqa: BLE001 - any failure means "no cupy"
            _cupy = None
    return _cupy


def _need_cupy(what: str) -> Any:
    cp = cupy()
    if cp is None:
        raise TypeError(
            f"{what} is a CUDA device array, but cupy does not import here; install cupy "
            f"(pip install cupy-cuda13x) to use GPU arrays"
        )
    return cp


def is_device(a: Any) -> bool:
    """Is ``a`` a cupy array (device memory)?"""
    cp = _cupy
    return cp is not None and isinstance(a, cp.ndarray)


def as_array(obj: Any, name: str) -> Any:
    """``obj`` as a numpy or cupy array without copying, or TypeError naming ``name``."""
    if isinstance(obj, np.ndarray):
        return obj
    if isinstance(obj, np.generic):
        return np.asarray(obj)
    if is_device(obj):
        return obj
    if hasattr(obj, "__cuda_array_interface__"):
        return _need_cupy(name).asarray(obj)
    if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        dev = int(obj.__dlpack_device__()[0])
        if dev == _DLPACK_CPU:
            return np.from_dlpack(obj)
        if dev in (_DLPACK_CUDA, _DLPACK_CUDA_MANAGED, _DLPACK_CUDA_HOST):
            return _need_cupy(name).from_dlpack(obj)
        raise TypeError(f"{name} lives on DLPack device type {dev}; pyshard takes CPU and CUDA")
    raise TypeError(
        f"{name} must be a numpy array, a cupy array, or an object with __dlpack__ or "
        f"__cuda_array_interface__; got {type(obj).__name__}"
    )


def kind(a: Any) -> str:
    return "cuda" if is_device(a) else "host"


def xp_of(a: Any) -> Any:
    """numpy or cupy, whichever ``a`` belongs to."""
    return _cupy if is_device(a) else np


def same_kind(a: Any, b: Any, what_a: str, what_b: str) -> None:
    """TypeError when one of two arrays is on the host and the other on a GPU."""
    if is_device(a) != is_device(b):
        raise TypeError(
            f"{what_a} is a {_desc(a)} but {what_b} is a {_desc(b)}; pass both on the host or "
            f"both on the GPU"
        )


def _desc(a: Any) -> str:
    return "cupy (GPU) array" if is_device(a) else f"{type(a).__module__}.{type(a).__name__}"


def stream_ptr() -> int:
    """cupy's current stream as an integer (0: the legacy default stream)."""
    return int(_cupy.cuda.get_current_stream().ptr)


def to_host(a: Any) -> np.ndarray:
    """A C-contiguous host copy of a device array; a host array as it is (made C-contiguous
    if it is a strided view, e.g. a HaloArray's interior)."""
    return _cupy.asnumpy(a, order="C") if is_device(a) else np.ascontiguousarray(a)


# ----------------------------------------------------------------------------- transports

_announced = False


def _env_transport() -> Optional[str]:
    raw = os.environ.get("PYSHARD_TRANSPORT", "").strip().lower()
    if raw in ("", "auto"):
        return None
    if raw not in ("direct", "staged"):
        raise ValueError(f"PYSHARD_TRANSPORT must be auto, direct or staged, got {raw!r}")
    return raw


def cuda_aware() -> Optional[bool]:
    """Does the MPI library take CUDA device pointers? ``PYSHARD_CUDA_AWARE=0|1`` overrides
    what the library says (``MPIX_Query_cuda_support`` on Open MPI, ``MPIX_GPU_query_support``
    on MPICH); None when it has no way to say (taken as no)."""
    raw = os.environ.get("PYSHARD_CUDA_AWARE", "").strip()
    if raw in ("0", "1"):
        return raw == "1"
    if raw:
        raise ValueError(f"PYSHARD_CUDA_AWARE must be 0 or 1, got {raw!r}")
    v = _core.cuda_aware_mpi()
    return None if v < 0 else bool(v)


def configure() -> None:
    """Set the core's transport per memory kind from the environment and the MPI library,
    and the count limit (``PYSHARD_COUNT_LIMIT``, for tests: see :func:`build_info`)."""
    raw = os.environ.get("PYSHARD_COUNT_LIMIT", "").strip()
    if raw:
        try:
            _core.set_count_limit(int(raw))
        except ValueError as e:
            raise ValueError(
                f"PYSHARD_COUNT_LIMIT must be an integer in [8, 2^31-1], got {raw!r}"
            ) from e
    forced = _env_transport()
    host = forced or "direct"
    cuda = forced or ("direct" if cuda_aware() else "staged")
    _core.set_transport(_core.Mem.host, getattr(_core.Transport, host))
    _core.set_transport(_core.Mem.cuda, getattr(_core.Transport, cuda))


def transports() -> Dict[str, str]:
    return {m: _core.transport(getattr(_core.Mem, m)).name for m in ("host", "cuda")}


def announce() -> None:
    """Log once which path GPU arrays take."""
    global _announced
    if _announced:
        return
    _announced = True
    t = transports()["cuda"]
    why = {True: "the MPI library is CUDA-aware", False: "the MPI library is not CUDA-aware",
           None: "the MPI library cannot say whether it is CUDA-aware"}[cuda_aware()]
    if os.environ.get("PYSHARD_TRANSPORT") or os.environ.get("PYSHARD_CUDA_AWARE"):
        why += " (as set in the environment)"
    log.info(
        "pyshard: GPU arrays: MPI %s (%s)",
        "on device memory" if t == "direct" else "staged through pinned host buffers",
        why,
    )


def cuda_available() -> bool:
    """True when the core has CUDA kernels, a GPU and its driver are present, and cupy imports."""
    return bool(_core.cuda_built() and _core.cuda_device_present() and cupy() is not None)


def build_info() -> Dict[str, Any]:
    """What this build of pyshard is and which paths it takes.

    ``mpi``: the MPI the core was compiled against (from its ``mpi.h``); ``mpi_library``:
    the library running, by its own name and version (``MPI_Get_library_version``, e.g.
    ``"Open MPI 4.1.4"``), ``mpi_library_version`` that text's first line, ``mpi_standard``
    the MPI standard it implements (``"3.1"``). ``large_count``: how messages and counts past
    2^31-1 travel, ``"native"`` (the MPI-4 ``MPI_*_c`` calls) or ``"datatype"`` (derived
    datatypes that bring every count under the limit, where the library has no large-count
    calls, e.g. Open MPI 4 and 5); ``large_count_reduce``: reductions, ``"native"`` or
    ``"split"`` (in rounds: a reduction needs its element type). ``PYSHARD_COUNT_LIMIT=N``
    (tests) lowers the limit to N so that the non-native path runs on small arrays."""
    v = _core.cuda_build_version()
    text = _mpi.clean(_core.library_version())
    major, minor = _core.library_standard()
    return {
        "version": _core.__version__,
        "mpi": _core.built_with,
        "mpi_library": _mpi.library_name(text),
        "mpi_library_version": text.splitlines()[0].strip() if text else "",
        "mpi_standard": f"{major}.{minor}",
        "large_count": _core.large_count_method(),
        "large_count_reduce": _core.large_count_reduce_method(),
        "cuda": None if v < 0 else f"{v // 1000}.{(v % 1000) // 10}",
        "cuda_device": bool(_core.cuda_device_present()),
        "cuda_aware_mpi": cuda_aware(),
        "transport": transports(),
    }
