"""pyshard: redistribute N-D arrays sharded over an MPI mesh, in the fewest collectives."""

from __future__ import annotations

# mpi4py loads (and initialises) the MPI library first; the core must use the same one.
from mpi4py import MPI as _MPI  # noqa: F401

from . import _mpi

_mpi.preload_ml_dtypes()

try:
    from . import _core
except ImportError as _e:  # pragma: no cover - depends on the build
    raise ImportError(_mpi.core_import_error(_e)) from _e


def _check_same_mpi() -> None:
    _mpi.check_same_mpi(_core.library_version(), _core.library_path())


_check_same_mpi()

from . import config  # noqa: E402
from . import route as route  # noqa: E402 (advanced: see __all__)
from ._backend import build_info, cuda_available, to_dlpack  # noqa: E402
from ._cache import cache_limit, clear_caches, set_cache_limit  # noqa: E402
from ._validate import reset_validation_stats as _reset_validation_stats  # noqa: E402
from ._validate import set_validation, validation, validation_stats  # noqa: E402
from .array import ShardedArray, distribute, from_local  # noqa: E402
from .balancing import Balance, balance, balance_array, particle_cost  # noqa: E402
from .checkpoint import checkpoint_info, load, save  # noqa: E402
from .executor import Pending  # noqa: E402
from .halo import HaloArray  # noqa: E402
from .halo_planner import HaloPlan, halo_plan, halo_spec  # noqa: E402
from .layout import Layout, Partial, Placement, Replicate, Shard, split_sizes  # noqa: E402
from .many import ManyPlan, plan_many, redistribute_many  # noqa: E402
from .mesh import Mesh  # noqa: E402
from .migration import Migrated, PendingMigration, migrate, owner  # noqa: E402
from .planner import Plan, plan  # noqa: E402
from .planner import Step as Step  # noqa: E402 (advanced: see __all__)
from .planner import StepKind as StepKind  # noqa: E402 (advanced: see __all__)
from .unstructured import (  # noqa: E402
    GatherPlan,
    PendingIndex,
    csr_plan,
    gather_plan,
    scatter_add,
    take,
)


def __getattr__(name: str) -> object:
    """``pyshard.tune_mesh``, imported on first use: it lives in :mod:`pyshard.fft.tune`,
    and importing that runs the ``pyshard.fft`` package (which imports scipy.fft), so
    ``import pyshard`` itself leaves it for later."""
    if name == "tune_mesh":
        from .fft.tune import tune_mesh

        globals()["tune_mesh"] = tune_mesh
        return tune_mesh
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def comm_stats() -> dict:
    """Collectives the core has run in this process, by kind (e.g. ``{"alltoallv": 3}``,
    ``"p2p"``, ``"allgatherv"``, ...), plus ``"staged"``: collectives whose data went
    through host bounce buffers (GPU arrays with an MPI that is not CUDA-aware), and
    ``"device_direct"``: collectives that handed GPU memory to a CUDA-aware MPI, ``"shm"``:
    exchanges, gathers and reductions through node-shared memory, and ``"shm_cma"``: those
    exchanges into a private result (``out=``, pyshard.jax's buffers) that node peers wrote
    into by cross-memory attach (``PYSHARD_CMA``). The small collectives pyshard's Python runs
    to agree on a value (``balance`` and ``particle_cost``, whose ``collectives`` attribute
    counts them, the validation mode: :func:`validation_stats`, checkpoint commits, tuning,
    a new mesh's node map) are not counted here."""
    return dict(_core.stats())


def reset_comm_stats() -> None:
    """Zero the counters of :func:`comm_stats`, :func:`large_count_stats` and
    :func:`validation_stats`."""
    _core.reset_stats()
    _core.reset_large_count_stats()
    _reset_validation_stats()


def large_count_stats() -> dict:
    """How often this process's MPI calls took a way past the count limit other than the
    MPI-4 large-count calls (``build_info()["large_count"] == "datatype"``, or a limit lowered
    by ``PYSHARD_COUNT_LIMIT``), by way: ``"bytes"`` (a block past the limit as one datatype
    of its bytes), ``"alltoallw"`` (a v-collective as MPI_Alltoallw, or a neighbourhood one
    as ``"neighbor_alltoallw"``), ``"per_peer"`` (a datatype per peer block whose offset is
    past the limit), ``"split"`` (a reduction in rounds). Empty when every call fitted."""
    return dict(_core.large_count_stats())


def result_pool_bytes() -> int:
    """Bytes of freed host results the result pool holds for the next call to reuse (at most
    ``PYSHARD_RESULT_POOL_BYTES``; :func:`clear_caches` hands them back)."""
    return int(_core.result_pool_held())


__version__ = _core.__version__

# The public API: ``from pyshard import *`` and docs/site/api.rst. The advanced names
# (``route``: the module of the path rules; ``Step`` and ``StepKind``: the items of
# ``Plan.steps``) stay importable from ``pyshard`` and are documented in api.rst's "Advanced"
# section, outside this list: they describe how pyshard runs a call, not what it computes.
__all__ = [
    "Balance",
    "HaloArray",
    "HaloPlan",
    "GatherPlan",
    "Layout",
    "ManyPlan",
    "Mesh",
    "Migrated",
    "Partial",
    "Pending",
    "PendingIndex",
    "PendingMigration",
    "Placement",
    "Plan",
    "Replicate",
    "Shard",
    "ShardedArray",
    "balance",
    "balance_array",
    "build_info",
    "cache_limit",
    "checkpoint_info",
    "clear_caches",
    "config",
    "comm_stats",
    "cuda_available",
    "distribute",
    "from_local",
    "csr_plan",
    "gather_plan",
    "halo_plan",
    "halo_spec",
    "large_count_stats",
    "load",
    "migrate",
    "owner",
    "particle_cost",
    "plan",
    "plan_many",
    "redistribute_many",
    "reset_comm_stats",
    "result_pool_bytes",
    "save",
    "scatter_add",
    "set_cache_limit",
    "set_validation",
    "split_sizes",
    "take",
    "to_dlpack",
    "tune_mesh",
    "validation",
    "validation_stats",
]
