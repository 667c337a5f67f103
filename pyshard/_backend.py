"""Array backends: numpy on the host, cupy on a GPU, and the transport a step is built with.

Arrays from other producers are viewed zero-copy: ``__cuda_array_interface__`` and
``__dlpack__`` on a CUDA device become cupy arrays, ``__dlpack__`` on the CPU (and numpy
scalars) become numpy arrays. Nothing here imports cupy until a device array shows up.

bfloat16 and float8 tensors (torch, jax) cross DLPack with type codes numpy and cupy do not
take: their capsule is retagged as unsigned words of the same size, consumed, and the result
viewed as the ml_dtypes dtype (no copy). :func:`to_dlpack` does the reverse for results.
"""

from __future__ import annotations

import ctypes
import logging
from typing import Any, Callable, Dict, Optional, Tuple

import numpy as np

from . import _core, _dtypes, _mpi, config
from ._optional import OptionalModule

log = logging.getLogger("pyshard")

MAX_COUNT = (1 << 31) - 1  # the core's count limit unless PYSHARD_COUNT_LIMIT lowers it
_DLPACK_CPU, _DLPACK_CUDA, _DLPACK_CUDA_HOST, _DLPACK_CUDA_MANAGED = 1, 2, 3, 13
# any failure to import cupy (a missing CUDA library too) means "no cupy"
cupy = OptionalModule("cupy", catch=(Exception,))
"""The cupy module, or None when it does not import."""


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
    cp = cupy.module
    return cp is not None and isinstance(a, cp.ndarray)


def as_array(obj: Any, name: str) -> Any:
    """``obj`` as a numpy or cupy array without copying, or TypeError naming ``name``."""
    if type(obj) is np.ndarray:
        return obj
    if isinstance(obj, np.ndarray):  # a subclass: its memory as a plain array
        if isinstance(obj, np.ma.MaskedArray):  # its mask would be dropped without a word
            raise TypeError(
                f"{name} is a numpy masked array: pyshard moves plain arrays, and its mask "
                f"would be lost; pass {name}.filled(value) or {name}.data (and move the mask "
                f"as a bool array of its own)"
            )
        return obj.view(np.ndarray)
    if isinstance(obj, np.generic):
        return np.asarray(obj)
    if is_device(obj):
        return obj
    if hasattr(obj, "__cuda_array_interface__"):
        return _need_cupy(name).asarray(obj)
    if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        dev = int(obj.__dlpack_device__()[0])
        if dev == _DLPACK_CPU:
            return _from_dlpack(obj, name, np.from_dlpack, "numpy")
        if dev in (_DLPACK_CUDA, _DLPACK_CUDA_MANAGED, _DLPACK_CUDA_HOST):
            return _from_dlpack(obj, name, _need_cupy(name).from_dlpack, "cupy")
        raise TypeError(f"{name} lives on DLPack device type {dev}; pyshard takes CPU and CUDA")
    raise TypeError(
        f"{name} must be a numpy array, a cupy array, or an object with __dlpack__ or "
        f"__cuda_array_interface__; got {type(obj).__name__}"
    )


# ----------------------------------------------------------------------------- DLPack dtypes
#
# A DLPack capsule holds a DLManagedTensor ("dltensor") or a DLManagedTensorVersioned
# ("dltensor_versioned", whose DLTensor starts after version, manager_ctx, deleter and flags:
# 32 bytes); in the DLTensor the DLDataType (code u8, bits u8, lanes u16) follows data (8),
# device (8) and ndim (4): 20 bytes in. Each __dlpack__ call makes a fresh capsule, so
# rewriting its type code before a consumer takes it touches nothing the producer keeps.

_capsule_name = ctypes.pythonapi.PyCapsule_GetName
_capsule_name.restype = ctypes.c_char_p
_capsule_name.argtypes = [ctypes.py_object]
_capsule_ptr = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_ptr.restype = ctypes.c_void_p
_capsule_ptr.argtypes = [ctypes.py_object, ctypes.c_char_p]
_DTYPE_AT = {b"dltensor": 20, b"dltensor_versioned": 32 + 20}


class _DLType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


def dltype(capsule: Any) -> _DLType:
    """The DLDataType inside a fresh DLPack capsule, writable in place."""
    if ctypes.sizeof(ctypes.c_void_p) != 8:  # the offsets above are those of a 64-bit ABI
        raise TypeError("pyshard reads DLPack capsules on 64-bit platforms only")
    cname = _capsule_name(capsule)
    if cname not in _DTYPE_AT:
        raise TypeError(f"not an unused DLPack capsule (its name is {cname!r})")
    return _DLType.from_address(_capsule_ptr(capsule, cname) + _DTYPE_AT[cname])


class _Retagged:
    """A DLPack producer that hands out ``obj``'s capsules with a bfloat16 / float8 type code
    rewritten as unsigned words of the same size (which numpy and cupy take); ``seen`` is the
    (code, bits, lanes) the producer gave."""

    def __init__(self, obj: Any) -> None:
        self.obj = obj
        self.seen: Optional[Tuple[int, int, int]] = None

    def __dlpack_device__(self) -> Any:
        return self.obj.__dlpack_device__()

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        cap = self.obj.__dlpack__(*args, **kwargs)
        t = dltype(cap)
        self.seen = (int(t.code), int(t.bits), int(t.lanes))
        if t.code in _dtypes.DLPACK_CODES and t.lanes == 1 and t.bits in (8, 16):
            t.code = _dtypes.DLPACK_UINT
        return cap


def _from_dlpack(obj: Any, name: str, consume: Callable[[Any], Any], module: str) -> Any:
    """``consume(obj)`` (numpy's or cupy's from_dlpack); a tensor of a dtype that module
    cannot take is retagged (see :class:`_Retagged`) and viewed as its ml_dtypes dtype."""
    try:
        return consume(obj)
    except (TypeError, ValueError, RuntimeError, BufferError) as err:
        first = err
    wrapped = _Retagged(obj)
    try:
        words = consume(wrapped)
    except (TypeError, ValueError, RuntimeError, BufferError):
        words = None
    seen = wrapped.seen
    dname = _dtypes.DLPACK_CODES.get(seen[0]) if seen and seen[2] == 1 else None
    if dname is None or words is None:
        what = f"DLPack dtype (code {seen[0]}, bits {seen[1]}, lanes {seen[2]})" if seen else ""
        raise TypeError(
            f"{name}: {module} cannot take this tensor{' of ' + what if what else ''} ({first}); "
            f"pyshard moves numeric, bool, bfloat16 and float8 arrays"
        ) from first
    dt = _dtypes.ml_dtype(dname, name)  # TypeError naming the extra without ml_dtypes
    try:
        return words.view(dt)
    except (TypeError, ValueError) as e:
        raise TypeError(
            f"{name} is a {dname} CUDA tensor, but this {module} cannot hold {dname} arrays "
            f"({e}); cupy >= 14 holds bfloat16 (with ml_dtypes), no cupy holds float8 yet: "
            f"move such tensors as host arrays, or view them as unsigned words of the same size"
        ) from None


def cupy_from_dlpack(obj: Any, name: str) -> Any:
    """A CUDA array or tensor as a cupy array through DLPack, without a copy; one of a dtype
    cupy cannot take (bfloat16, float8) is retagged and viewed as its ml_dtypes dtype."""
    return _from_dlpack(obj, name, _need_cupy(name).from_dlpack, "cupy")


def to_dlpack(array: Any) -> Any:
    """``array`` (numpy or cupy) as a DLPack producer any consumer takes, without a copy:
    ``torch.from_dlpack(pyshard.to_dlpack(y.local))``. numpy and cupy refuse to export
    bfloat16 and float8 arrays; these are exported as their unsigned-word view with DLPack's
    own type code (``kDLBfloat``, ``kDLFloat8_*``) written in. Other arrays come back as they
    are (they export themselves)."""
    a = as_array(array, "array")
    if not _dtypes.is_ml_float(a.dtype):
        return a
    code = _dtypes.dlpack_code(a.dtype)
    if code is None:
        raise TypeError(f"DLPack has no type code for {a.dtype}")
    return _Exported(a, code)


class _Exported:
    """A DLPack producer of ``a``'s unsigned-word view with ``code`` written in."""

    def __init__(self, a: Any, code: Tuple[int, int]) -> None:
        self.array = a
        self.words = a.view(_dtypes.word(a.dtype))
        self.code = code

    def __dlpack_device__(self) -> Any:
        return self.words.__dlpack_device__()

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        cap = self.words.__dlpack__(*args, **kwargs)
        t = dltype(cap)
        t.code, t.bits = self.code
        return cap


# ----------------------------------------------------------------------------- casts


def astype(a: Any, dtype: np.dtype) -> Any:
    """``a.astype(dtype)``; on a GPU, casts to or from an ml_dtypes float run through
    :mod:`pyshard._dtypes`' word-level casts (cupy has none for them; round to nearest even)."""
    dtype = np.dtype(dtype)
    if not is_device(a) or not (_dtypes.is_ml_float(a.dtype) or _dtypes.is_ml_float(dtype)):
        return a.astype(dtype)
    xp = cupy.module
    if _dtypes.is_ml_float(a.dtype):
        f = _dtypes.widen(a.view(_dtypes.word(a.dtype)), a.dtype, xp)
        return f if dtype == np.float32 else astype(f, dtype)
    return _dtypes.narrow(a, dtype, xp).view(dtype)


def copy_cast(out: Any, a: Any) -> None:
    """Write ``a`` into ``out``, cast to ``out``'s dtype (as :func:`astype` casts)."""
    xp = xp_of(out)
    if is_device(out) and (_dtypes.is_ml_float(out.dtype) or _dtypes.is_ml_float(a.dtype)):
        xp.copyto(out, astype(a, out.dtype))
    else:
        xp.copyto(out, a, casting="unsafe")


def kind(a: Any) -> str:
    return "cuda" if is_device(a) else "host"


def xp_of(a: Any) -> Any:
    """numpy or cupy, whichever ``a`` belongs to."""
    return cupy.module if is_device(a) else np


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
    return int(cupy.module.cuda.get_current_stream().ptr)


def to_host(a: Any) -> np.ndarray:
    """A C-contiguous host copy of a device array; a host array as it is (made C-contiguous
    if it is a strided view, e.g. a HaloArray's interior)."""
    return cupy.module.asnumpy(a, order="C") if is_device(a) else np.ascontiguousarray(a)


# ----------------------------------------------------------------------------- transports

_announced = False


_library_aware: Dict[str, int] = {}  # what the MPI library says, asked once


def cuda_aware() -> Optional[bool]:
    """Does the MPI library take CUDA device pointers? ``PYSHARD_CUDA_AWARE=0|1`` overrides
    what the library says (``MPIX_Query_cuda_support`` on Open MPI, ``MPIX_GPU_query_support``
    on MPICH); None when it has no way to say (taken as no)."""
    forced = config.get("PYSHARD_CUDA_AWARE")
    if forced is not None:
        return bool(forced)
    if "v" not in _library_aware:
        _library_aware["v"] = int(_core.cuda_aware_mpi())
    v = _library_aware["v"]
    return None if v < 0 else bool(v)


def transport(device: bool) -> str:
    """How a step built now hands arrays in host (``device=False``) or GPU memory to MPI:
    ``"direct"`` (the array's own memory) or ``"staged"`` (through pinned host bounce
    buffers), from the settings: ``PYSHARD_MPI_TRANSPORT=direct|staged`` (or the older
    ``PYSHARD_TRANSPORT=direct|staged``) names it for both; otherwise host memory is direct,
    and GPU memory direct where the MPI library is CUDA-aware (:func:`cuda_aware`,
    ``PYSHARD_CUDA_AWARE`` overriding), else staged.

    Only :func:`pyshard.route.route` reads this, when a step is built: the route's
    ``transport`` is a constructor argument of the core's step, which runs on it for its whole
    life whatever the settings say later (a changed setting reaches the next call through the
    executors built again under it, ``pyshard._cache``)."""
    forced = config.get("PYSHARD_MPI_TRANSPORT")
    if forced != "auto":
        return forced
    if not device:
        return "direct"
    return "direct" if cuda_aware() else "staged"


def _count_limit(limit: Optional[int]) -> None:
    _core.set_count_limit(MAX_COUNT if limit is None else limit)


# The core's process-wide settings, given to it now and at every change (pyshard.config):
# the count limit (PYSHARD_COUNT_LIMIT, tests: see build_info), the peer timeout
# (PYSHARD_PEER_TIMEOUT) and cross-memory attach (PYSHARD_CMA). The transports are no state
# of the core: each step carries its own (transport()).
config.apply_with("PYSHARD_COUNT_LIMIT", _count_limit)
config.apply_with("PYSHARD_PEER_TIMEOUT", _core.set_peer_timeout)
config.apply_with("PYSHARD_CMA", _core.set_cma_enabled)


def transports() -> Dict[str, str]:
    """The transport a step built now takes, per memory kind (:func:`transport`)."""
    return {"host": transport(False), "cuda": transport(True)}


def announce() -> None:
    """Log once which path GPU arrays take."""
    global _announced
    if _announced:
        return
    _announced = True
    t = transports()["cuda"]
    why = {True: "the MPI library is CUDA-aware", False: "the MPI library is not CUDA-aware",
           None: "the MPI library cannot say whether it is CUDA-aware"}[cuda_aware()]
    forced = config.get("PYSHARD_MPI_TRANSPORT") != "auto"
    if forced or config.get("PYSHARD_CUDA_AWARE") is not None:
        why += " (as set in the environment)"
    log.info(
        "pyshard: GPU arrays: MPI %s (%s)",
        "on device memory" if t == "direct" else "staged through pinned host buffers",
        why,
    )


def cuda_available() -> bool:
    """True when the core has CUDA kernels, a GPU and its driver are present, and cupy imports."""
    return bool(_core.cuda_built() and _core.cuda_device_present() and cupy() is not None)


def malloc_name() -> str:
    """Which ``malloc`` serves this process: ``"tcmalloc"`` or ``"jemalloc"`` (preloaded,
    say ``LD_PRELOAD=libtcmalloc_minimal.so.4``), ``"glibc"``, or ``"other"``. It matters
    where another library allocates large buffers at every call (XLA:CPU's results under
    ``pyshard.jax``): glibc returns a freed block of 32 MiB or more to the system, so the next
    one is fresh pages, faulted in as they are written; tcmalloc keeps them (docs/jax.md)."""
    try:
        lib = ctypes.CDLL(None)
    except OSError:
        return "other"
    for name, symbol in (("tcmalloc", "tc_malloc"), ("jemalloc", "mallctl")):
        if hasattr(lib, symbol):
            return name
    return "glibc" if hasattr(lib, "mallinfo") else "other"


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
    (tests) lowers the limit to N so that the non-native path runs on small arrays.
    ``transport``: per memory kind (``host``, ``cuda``), the transport of the steps built now
    (:func:`transport`: ``"direct"`` or ``"staged"``); a step built earlier keeps its own.
    ``count_limit``: the largest count the core passes to one MPI call (2^31-1, or
    ``PYSHARD_COUNT_LIMIT``); ``peer_timeout``: the seconds a rank waits for a node peer
    (``PYSHARD_PEER_TIMEOUT``): both as the core holds them now. ``malloc``: the process's
    allocator (:func:`malloc_name`). After ``MPI.Finalize()``, RuntimeError (the CUDA-aware
    query is an MPI call)."""
    from .collectives import check_finalized

    check_finalized()
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
        "count_limit": int(_core.count_limit()),
        "peer_timeout": float(_core.peer_timeout()),
        "malloc": malloc_name(),
    }
