"""Every ``PYSHARD_*`` setting in one place: its type, default and effect, one parser per type
and one error style (naming the variable, the value and what it accepts).

A setting's value is the environment variable's (read when first needed, and again whenever
the variable changes), unless Python set it. Every value is parsed and checked, whatever its
type (a string as the environment's would be): one it cannot take raises ValueError naming
the setting, the value and what it accepts. A change takes effect at the next call, on every
entry point, in one of two ways:

- what is built under the settings (executors and bindings per mesh, whose core steps carry
  the transport they were built with; the batch plans of ``redistribute_many``) is keyed on
  :func:`generation`, which every change made here (set, reset, override) and every changed
  variable :func:`get` or :func:`refresh` reads moves on: it is rebuilt at its next use;
- what the process holds (the core's count limit and peer timeout, the cache limit, the
  result pools' bound, the validation mode) is applied at once, at import and at every change
  of its value, by the module that owns it (:func:`apply_with`): no call reads it again.

Variables changed in ``os.environ`` after a mesh's first call reach its repeated calls once
:func:`refresh` reads them::

    import pyshard as ps

    ps.config.get("PYSHARD_SHM_MIN_BYTES")           # None: the measured default
    ps.config.set("PYSHARD_SHM_MIN_BYTES", 0)        # every exchange on node-shared memory
    with ps.config.override(PYSHARD_SHM="off"):      # for a block (tests use this)
        ...
    ps.config.reset("PYSHARD_SHM_MIN_BYTES")         # back to the environment

``PYSHARD_TRANSPORT`` is the single older spelling of two choices, node-shared memory
(``PYSHARD_SHM``) and how MPI takes the arrays' memory (``PYSHARD_MPI_TRANSPORT``); it is
still accepted, and decides each of the two that is not set itself (:data:`TRANSPORT_SPELLINGS`);
a bad value of it raises at every read of either, whether or not it decides.

Every rank must see the same settings (they choose collectives). There are no test hooks
among them: pyshard's tests inject their faults themselves (monkeypatch, or by wrapping the
core). ``docs/configuration.md`` is generated from this table (:func:`table`).
"""

from __future__ import annotations

import contextlib
import math
import numbers
import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np

__all__ = ["ALGORITHMS", "HALO_METHODS", "HALO_MPI", "SETTINGS", "THREAD_VARIABLES",
           "TRANSPORT_SPELLINGS", "apply_with", "check_applied", "generation", "get",
           "override", "refresh", "reset", "set", "table", "threads_note"]


@dataclass(frozen=True)
class Setting:
    name: str
    kind: str  # what it accepts, in words (the error says it)
    default: Any
    effect: str
    parse: Callable[[Any], Any]  # an environment string or a Python value -> the value, or _Bad


class _Bad(ValueError):
    pass


def _int(minimum: int, maximum: int = (1 << 63) - 1) -> Callable[[Any], int]:
    # (the default bound: the core's int64; past it pybind11 refused the value with its own
    # TypeError, after the setting was set)
    def parse(raw: Any) -> int:
        if isinstance(raw, str):
            try:
                v = int(raw)
            except ValueError:
                raise _Bad from None
        elif isinstance(raw, numbers.Integral) and not isinstance(raw, bool):
            v = int(raw)
        else:
            raise _Bad
        if v < minimum or v > maximum:
            raise _Bad
        return v

    return parse


def _bool(raw: Any) -> bool:
    if isinstance(raw, (bool, np.bool_)):
        return bool(raw)
    if isinstance(raw, numbers.Integral) and raw in (0, 1):
        return bool(raw)
    if not isinstance(raw, str):
        raise _Bad
    v = raw.lower()
    if v in ("0", "false", "no", "off"):
        return False
    if v in ("1", "true", "yes", "on"):
        return True
    raise _Bad


def _choice(*names: str) -> Callable[[Any], str]:
    def parse(raw: Any) -> str:
        if not isinstance(raw, str) or raw.lower() not in names:
            raise _Bad
        return raw.lower()

    return parse


def _text(raw: Any) -> str:
    if isinstance(raw, os.PathLike):
        raw = os.fspath(raw)
    if not isinstance(raw, str):
        raise _Bad
    return raw


def _seconds(raw: Any) -> float:
    if isinstance(raw, str):
        try:
            v = float(raw)
        except ValueError:
            raise _Bad from None
    elif isinstance(raw, numbers.Real) and not isinstance(raw, bool):
        v = float(raw)
    else:
        raise _Bad
    if not v > 0 or math.isinf(v):
        raise _Bad
    return v


_BOOL = "0/1, false/true, no/yes or off/on"
# The names the settings accept, and the one list of them: pyshard.route takes these
# exchange algorithms and halo methods from here.
ALGORITHMS = ("alltoallv", "alltoall", "p2p", "alltoallw", "shm")  # redistribute(algorithm=)
HALO_MPI = ("persistent", "p2p", "datatype", "neighbor")  # halo methods by MPI (cpp/halo.h)
HALO_METHODS = HALO_MPI + ("shm",)  # ... and by node-shared memory
_ALGORITHMS = ("auto", "tune", *ALGORITHMS)
_HALO = ("auto", "shm", *HALO_MPI, "tune")

SETTINGS: Dict[str, Setting] = {s.name: s for s in (
    Setting("PYSHARD_ALGORITHM", "one of " + ", ".join(_ALGORITHMS), "auto",
            "the exchange algorithm of redistribute() calls that pass none",
            _choice(*_ALGORITHMS)),
    Setting("PYSHARD_SHM", "auto or off", "auto",
            "auto: host exchanges, gathers, reductions and halos between ranks of a node "
            "through node-shared memory where pyshard's rule takes it (PYSHARD_SHM_MIN_BYTES); "
            "off: every step through MPI. Unset: as PYSHARD_TRANSPORT says",
            _choice("auto", "off")),
    Setting("PYSHARD_MPI_TRANSPORT", "auto, direct or staged", "auto",
            "how the MPI paths take the arrays' memory: direct (host and GPU memory passed to "
            "MPI as it is), staged (through pinned host buffers), auto (host memory direct; "
            "GPU memory direct where the MPI library is CUDA-aware, see PYSHARD_CUDA_AWARE, "
            "else staged). Unset: as PYSHARD_TRANSPORT says",
            _choice("auto", "direct", "staged")),
    Setting("PYSHARD_TRANSPORT", "auto, shm, mpi, direct or staged", "auto",
            "the single older spelling of PYSHARD_SHM and PYSHARD_MPI_TRANSPORT, still "
            "accepted; it decides each of them that is not set itself: auto and shm mean "
            "PYSHARD_SHM=auto, mpi means PYSHARD_SHM=off, direct and staged mean "
            "PYSHARD_SHM=off with PYSHARD_MPI_TRANSPORT=direct or staged",
            _choice("auto", "shm", "mpi", "direct", "staged")),
    Setting("PYSHARD_SHM_MIN_BYTES", "an integer >= 0 (below 2^63)", None,
            "auto takes node-shared memory for steps whose largest block has at least this "
            "many bytes (default: 16 KiB, 256 KiB where ranks outnumber cores)", _int(0)),
    Setting("PYSHARD_NODE_SIZE", "an integer >= 1 (below 2^63)", None,
            "split each node into simulated nodes of this many consecutive world ranks (the "
            "mixed path of a cluster on one machine; read when a Mesh is built)", _int(1)),
    Setting("PYSHARD_CUDA_AWARE", _BOOL, None,
            "override whether the MPI library takes GPU memory (default: as it says)", _bool),
    Setting("PYSHARD_COUNT_LIMIT", "an integer in [8, 2^31-1]", None,
            "lower the largest count passed to one MPI call (tests of the large-count path)",
            _int(8, (1 << 31) - 1)),
    Setting("PYSHARD_VALIDATE", _BOOL, False,
            "check with one small Allgather per call that every rank passed the same layouts "
            "and arguments and sees the same settings that choose the collectives", _bool),
    Setting("PYSHARD_HALO_METHOD", "one of " + ", ".join(_HALO), "auto",
            "how halo updates and folds move their ghost cells when HaloArray gets no method "
            "(auto: node-shared memory between ranks of a node, for every face where each "
            "rank has a core and for faces of at least PYSHARD_SHM_MIN_BYTES where ranks "
            "outnumber cores; else persistent requests)",
            _choice(*_HALO)),
    Setting("PYSHARD_CACHE_LIMIT", "an integer >= 1 (below 2^63)", 256,
            "entries kept per plan and executor cache", _int(1)),
    Setting("PYSHARD_RESULT_POOL_BYTES", "an integer >= 0 (below 2^63)", 1 << 30,
            "bytes of freed host results kept for reuse (0: off): the private pool, and "
            "each node transport's pool of results in node-shared memory", _int(0)),
    Setting("PYSHARD_MANY_FUSE_MAX_BYTES", "an integer >= 1 (below 2^63)", 256 << 10,
            "redistribute_many fuses arrays of fewer bytes per rank than this", _int(1)),
    Setting("PYSHARD_MANY_BATCH_BYTES", "an integer >= 1 (below 2^63)", 4 << 20,
            "bytes per rank of one fused MPI exchange of redistribute_many", _int(1)),
    Setting("PYSHARD_MANY_SHM_BATCH_BYTES", "an integer >= 1 (below 2^63)", 64 << 20,
            "bytes per rank of one node-shared-memory batch of redistribute_many", _int(1)),
    Setting("PYSHARD_LOAD_DIRECT_BYTES", "an integer >= 0 (below 2^63)", 4096,
            "load() copies an array stored whole in one file (.npy, HDF5 contiguous, "
            "safetensors) straight into each rank's box where every box is made of runs of at "
            "least this many contiguous bytes of the file (0: always); shorter runs are read as "
            "row blocks and redistributed (.npy: one collective MPI-IO read)", _int(0)),
    Setting("PYSHARD_POOL_MIN_BYTES", "an integer >= 0 (below 2^63)", 1 << 20,
            "host results of at least this many bytes come from the core's result pool (a loop "
            "of calls reuses pages instead of faulting in fresh ones); smaller ones are plain "
            "numpy arrays", _int(0)),
    Setting("PYSHARD_LOAD_FUSE", _BOOL, True,
            "load() reads the arrays below PYSHARD_MANY_FUSE_MAX_BYTES as row blocks and moves "
            "them to their targets in one redistribute_many per batch (off: each array by "
            "its own read of its target boxes)", _bool),
    Setting("PYSHARD_ZARR_DIRECT", _BOOL, True,
            "load() reads Zarr shards and chunks straight from their files, decoded by "
            "zarr-python's codecs (off: through a zarr-python Array)", _bool),
    Setting("PYSHARD_ZARR_NUMCODECS_ZSTD", _BOOL, True,
            "Zarr chunks whose codecs are bytes (native order) then zstd are compressed and "
            "decompressed by numcodecs' Zstd, configured from the ZstdCodec (the same bytes; "
            "off: zarr-python's codec pipeline, a thread per chunk)", _bool),
    Setting("PYSHARD_ZARR_DECODE_BYTES", "an integer >= 1 (below 2^63)", 64 << 20,
            "bytes of decoded Zarr chunks asked of zarr-python's codec pipeline in one call, "
            "at most", _int(1)),
    Setting("PYSHARD_FFT_BACKEND", "auto, scipy, numpy, pyfftw or pyfftw-measure", "auto",
            "pyshard.fft's local transforms of numpy arrays: auto is scipy.fft where it "
            "imports, else numpy.fft; pyfftw (FFTW_ESTIMATE plans) and pyfftw-measure "
            "(FFTW_MEASURE: seconds per new shape, then cached) take pyFFTW",
            _choice("auto", "scipy", "numpy", "pyfftw", "pyfftw-measure")),
    Setting("PYSHARD_JAX_UNTESTED", _BOOL, False,
            "import pyshard.jax under a jax outside the tested versions (a warning, then "
            "on) instead of raising ImportError", _bool),
    Setting("PYSHARD_JAX_CUDA", _BOOL, False,
            "lower pyshard.jax's collectives and halo updates for a GPU (the CUDA "
            "registration of its custom call): experimental, its GPU runs gave wrong results on "
            "some ranks and the fix has not run on a GPU yet (docs/jax.md); off raises "
            "NotImplementedError saying so. "
            "Read when a function is lowered", _bool),
    Setting("PYSHARD_JAX_FFT", "auto, scipy or jnp", "auto",
            "pyshard.jax's local c2c FFT passes on CPU: auto is scipy.fft in place on XLA's "
            "buffer (a custom call) where scipy imports, else jnp.fft; jnp: always jnp.fft. "
            "Read when a function is traced", _choice("auto", "scipy", "jnp")),
    Setting("PYSHARD_PEER_TIMEOUT", "a finite number of seconds > 0", 300.0,
            "the longest a rank waits for a node peer in node-shared memory (mesh setup, an "
            "exchange, a halo update or fold), and in the validation mode's check for the "
            "other ranks; past it every waiting rank raises RuntimeError naming what it "
            "waited for (and the rank where it knows), instead of hanging", _seconds),
    Setting("PYSHARD_CMA", _BOOL, True,
            "a node-shared exchange into a rank's private memory (out=, pyshard.jax's buffers) "
            "has its node peers write their blocks straight into it by cross-memory attach "
            "(process_vm_writev) where every rank of the node can; off: into node-shared "
            "memory first, then copied over. Each rank decides for its own result. On at "
            "a mesh's build where Yama's ptrace_scope is not 0: the rank lets node peers "
            "attach to it (prctl PR_SET_PTRACER_ANY), as Open MPI's single copy does", _bool),
    Setting("PYSHARD_TUNE_FILE", "a file path", "",
            "where algorithm='tune' keeps its choices between jobs (empty: nowhere)", _text),
)}  # fmt: skip

# PYSHARD_TRANSPORT's values as (PYSHARD_SHM, PYSHARD_MPI_TRANSPORT)
TRANSPORT_SPELLINGS: Dict[str, Tuple[str, str]] = {
    "auto": ("auto", "auto"),
    "shm": ("auto", "auto"),
    "mpi": ("off", "auto"),
    "direct": ("off", "direct"),
    "staged": ("off", "staged"),
}
_SPELLED = {"PYSHARD_SHM": 0, "PYSHARD_MPI_TRANSPORT": 1}  # which of the two, by name
_UNSET = object()  # the parsed value of a variable that is not set (PYSHARD_SHM, ..._MPI_...)

_set: Dict[str, Any] = {}  # values set from Python
_parsed: Dict[str, Tuple[Optional[str], Any]] = {}  # name -> (raw value, parsed)
_generation = 0  # moves on at every change of a setting: cache keys compare it
_appliers: Dict[str, List[Callable[[Any], None]]] = {}  # name -> what carries it (apply_with)
_applied: Dict[str, Any] = {}  # name -> the value the appliers were last given
# applied settings whose value was refused where no call could raise it (at import, at the
# end of an override): their appliers hold the default meanwhile, and check_applied() (every
# Mesh's build, a mesh's next call after a change) raises the error while the value stands
_refused: Dict[str, ValueError] = {}


def generation() -> int:
    """A number that changes whenever a setting may have changed (set, reset, override, a
    changed environment variable read by :func:`get` or :func:`refresh`); whatever was built
    under the settings of another generation is rebuilt at its next use."""
    return _generation


def _changed() -> None:
    global _generation
    _generation += 1


def apply_with(name: str, fn: Callable[[Any], None]) -> None:
    """Carry setting ``name`` into state the process holds (the core's, a module's):
    ``fn(value)`` runs now, and again whenever the setting's value changes (set, reset,
    override, or a changed variable :func:`get` or :func:`refresh` reads), so that every
    entry point sees the change with no per-call cost. The module that owns the state calls
    this when it is imported; registering the same ``fn`` again only applies it again.

    A value the setting refuses does not fail the import (``python -m pyshard doctor`` and
    ``config`` must run to report it): ``fn`` gets the default, and the ValueError is raised
    by :func:`check_applied`, at the next Mesh's build, and by every :func:`get` of it."""
    _setting(name)
    fns = _appliers.setdefault(name, [])
    if fn not in fns:
        fns.append(fn)
    try:
        v = get(name)
    except ValueError as e:
        _defer(name, e)
        return
    fn(v)
    _applied[name] = v


def _defer(name: str, err: ValueError) -> None:
    """``name``'s value was refused where no call can raise it: its appliers get the default,
    and :func:`check_applied` raises ``err`` while the value stands."""
    _refused[name] = err
    d = SETTINGS[name].default
    for fn in _appliers[name]:
        fn(d)
    _applied[name] = d


def check_applied() -> None:
    """Raise the ValueError of an applied setting whose value was refused at import (or at
    the end of an :func:`override`) and is still what the setting reads; one that is good now
    is applied. Every :class:`~pyshard.Mesh` calls this when it is built, so that no call
    runs on a default that stands in for a refused value."""
    for name in list(_refused):
        _apply(name)


def _apply(name: str) -> None:
    """Give ``name``'s appliers its value where it differs from what they were last given
    (state set directly, e.g. the core's count limit by a test, stays until the setting
    itself changes)."""
    if name not in _appliers:
        return
    v = get(name)
    _refused.pop(name, None)
    if name in _applied and _applied[name] == v:
        return
    for fn in _appliers[name]:
        fn(v)
    _applied[name] = v


def refresh() -> None:
    """Read every setting's environment variable again (after ``os.environ`` changed in this
    process): a changed one takes effect at the next call, cached paths included. Every
    changed setting is applied (and one refused earlier, now good) before the first refused
    value's ValueError is raised; the refused one holds its default meanwhile and is raised
    again at the next Mesh's build while it stands (as a value refused at import)."""
    changed = [name for name, (raw, _) in _parsed.items() if os.environ.get(name) != raw]
    for name in changed:
        del _parsed[name]
        _changed()
    first: Optional[ValueError] = None
    for name in dict.fromkeys(changed + list(_refused)):
        try:
            _apply(name)
        except ValueError as e:  # (the others still applied: none left on a stale value)
            if name in _appliers:
                _defer(name, e)
            first = first or e
    if first is not None:
        raise first


def _setting(name: str) -> Setting:
    s = SETTINGS.get(name)
    if s is None:
        raise KeyError(f"pyshard.config: no setting named {name!r}; the settings are "
                       f"{', '.join(SETTINGS)}")  # fmt: skip
    return s


def _parse(s: Setting, value: Any) -> Any:
    """``value`` (an environment string, stripped, or a Python value) as setting ``s``
    takes it, or ValueError naming the setting, what it accepts and the value."""
    try:
        return s.parse(value.strip() if isinstance(value, str) else value)
    except _Bad:
        raise ValueError(f"{s.name} must be {s.kind}, got {value!r}") from None


def get(name: str) -> Any:
    """The value of setting ``name``: set from Python, else from the environment (parsed),
    else the default (``PYSHARD_SHM`` and ``PYSHARD_MPI_TRANSPORT``: as ``PYSHARD_TRANSPORT``
    says). A bad value raises ValueError naming the variable, the value and what it
    accepts; a bad ``PYSHARD_TRANSPORT`` raises at every read of the two it spells, whether
    or not they are set themselves (as it does where they are not)."""
    # the older spelling is read first, whether it decides or not: its bad value raises alike
    older = get("PYSHARD_TRANSPORT") if name in _SPELLED else None
    if name in _set:
        v = _set[name]
    else:
        raw = os.environ.get(name)
        hit = _parsed.get(name)
        if hit is None or hit[0] != raw:
            s = _setting(name)
            v = _unset_value(s) if raw is None or not raw.strip() else _parse(s, raw)
            _parsed[name] = (raw, v)
            if hit is not None:  # the variable changed since it was read: so may the paths
                _changed()
                _apply(name)
        else:
            v = hit[1]
    if v is _UNSET:
        return TRANSPORT_SPELLINGS[older][_SPELLED[name]]
    return v


def _unset_value(s: Setting) -> Any:
    """What setting ``s`` is where its variable is not set: its default, or (``PYSHARD_SHM``
    and ``PYSHARD_MPI_TRANSPORT``) whatever ``PYSHARD_TRANSPORT`` says at each read."""
    return _UNSET if s.name in _SPELLED else s.default


def set(name: str, value: Any) -> None:  # noqa: A001 - the module's verb
    """Set ``name`` for this process (every rank must do the same): a string is parsed as
    the environment's value would be, any other value checked against what the setting
    accepts (ValueError naming both). None sets the value the setting has where its variable
    is not set, whatever the environment says: its default (``PYSHARD_SHM`` and
    ``PYSHARD_MPI_TRANSPORT``: as ``PYSHARD_TRANSPORT`` says, as it changes)."""
    s = _setting(name)
    had, before = name in _set, _set.get(name)
    _set[name] = _unset_value(s) if value is None else _parse(s, value)
    _changed()
    try:
        _apply(name)
    except Exception:  # the value left as it was
        if had:
            _set[name] = before
        else:
            _set.pop(name, None)
        _changed()
        _apply(name)
        raise


def reset(name: str) -> None:
    """Back to the environment's value."""
    _setting(name)
    _set.pop(name, None)
    _changed()
    _apply(name)


@contextlib.contextmanager
def override(**values: Any) -> Iterator[None]:
    """Set settings for a block, then restore them: ``override(PYSHARD_SHM="off")``. Every
    value is checked before any is set."""
    for k, v in values.items():
        if v is not None:
            _parse(_setting(k), v)
    before = {k: _set[k] for k in values if k in _set}
    try:
        for k, v in values.items():
            set(k, v)
        yield
    finally:
        for k in values:
            _set.pop(k, None)
        _set.update(before)
        _changed()
        for k in values:
            try:
                _apply(k)
            except ValueError as e:  # the environment's value, refused: as at import, the
                _defer(k, e)  # next Mesh or call raises it, not the end of the block


def table() -> str:
    """The settings as a Markdown table (docs/configuration.md)."""

    def rows(settings: Dict[str, Setting]) -> str:
        out = ["| variable | accepts | default | effect |", "|---|---|---|---|"]
        for s in settings.values():
            d = "(see effect)" if s.default is None else repr(s.default)
            out.append(f"| `{s.name}` | {s.kind} | {d} | {s.effect} |")
        return "\n".join(out)

    return rows(SETTINGS) + "\n"


# The variables that bound the threads of numpy's BLAS (OpenBLAS, MKL) and torch in a process
# The settings that choose which collectives and paths a call runs: every rank must see the
# same (the validation mode compares them at every validated call; doctor reports ranks
# that differ). The others (timeouts, cache sizes, backends of local work, attach) may differ.
COLLECTIVE_SETTINGS = (
    "PYSHARD_ALGORITHM", "PYSHARD_SHM", "PYSHARD_MPI_TRANSPORT", "PYSHARD_TRANSPORT",
    "PYSHARD_SHM_MIN_BYTES", "PYSHARD_NODE_SIZE", "PYSHARD_CUDA_AWARE", "PYSHARD_COUNT_LIMIT",
    "PYSHARD_HALO_METHOD", "PYSHARD_MANY_FUSE_MAX_BYTES", "PYSHARD_MANY_BATCH_BYTES",
    "PYSHARD_MANY_SHM_BATCH_BYTES", "PYSHARD_LOAD_DIRECT_BYTES", "PYSHARD_POOL_MIN_BYTES",
    "PYSHARD_LOAD_FUSE",
)


def own_error(name: str, err: ValueError) -> bool:
    """Is ``err``, raised by a read of ``name``, about ``name``'s own value? (A bad
    ``PYSHARD_TRANSPORT`` raises at the reads of ``PYSHARD_SHM`` and
    ``PYSHARD_MPI_TRANSPORT`` too: reported under its own name only.)"""
    return str(err).startswith(f"{name} ")


def collective_settings() -> str:
    """The :data:`COLLECTIVE_SETTINGS` that differ from their defaults, as ``NAME=value``
    (an invalid value as what it is); ``"defaults"`` where none does."""
    out = []
    for name in COLLECTIVE_SETTINGS:
        try:
            v = get(name)
        except ValueError as e:
            if not own_error(name, e):
                continue
            v = f"invalid {os.environ.get(name)!r}"
        if v != SETTINGS[name].default:
            out.append(f"{name}={v}")
    return ", ".join(out) or "defaults"


THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def threads_note(ranks: int, cores: int,
                 environ: Optional[Dict[str, str]] = None) -> Optional[str]:
    """What a :class:`~pyshard.Mesh` logs (a warning, once a process, on the first of a
    machine's ranks) where ``ranks`` ranks of it share a machine of ``cores`` cores and none
    of :data:`THREAD_VARIABLES` is set in ``environ`` (``os.environ`` by default); else None.

    Unbounded, numpy's BLAS and torch start a thread per core in every rank, and the threads
    spin for a while after each call, on the cores the other ranks need to reach their
    messages. Measured (examples/spmv.py ``--m 400``, 2 cores): its conjugate gradient took
    16.1 ms an iteration at 2 ranks and 49.7 at 4, against 1.95 and 4.0 with
    ``OMP_NUM_THREADS=1``; the product alone (no BLAS call) the same either way."""
    env = os.environ if environ is None else environ
    if ranks < 2 or any(env.get(v) for v in THREAD_VARIABLES):
        return None
    per = max(1, cores // ranks) if cores > 0 else 1
    on = f"this machine's {cores} cores" if cores > 0 else "this machine"
    return (f"pyshard: {ranks} ranks share {on} and none of {', '.join(THREAD_VARIABLES)} "
            f"is set: numpy's BLAS and torch start a thread per core in every rank, whose "
            f"spinning after each call takes the cores the other ranks need for their "
            f"messages (examples/spmv.py's conjugate gradient: 8x slower at 2 ranks on 2 "
            f"cores). Set OMP_NUM_THREADS={per} in the job's environment (mpiexec and srun "
            f"pass it on to every rank); docs/performance.md, \"Threads\"")
