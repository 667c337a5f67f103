"""The one allocator of results: every array an exchange writes comes from :func:`allocate`.

Where the memory comes from, in order: the array's own device (a cupy array's results are
cupy arrays on its device); this rank's node-shared memory where a node transport writes the
result straight from its peers (``node``: the communicator's node transport); the core's result
pool for host results of ``PYSHARD_POOL_MIN_BYTES`` or more (a loop of calls reuses pages
instead of faulting in fresh ones); else plain numpy memory.
"""

from __future__ import annotations

from contextlib import contextmanager
from math import prod
from typing import Any, Iterator, Optional, Tuple

import numpy as np

from . import _backend as bk
from . import _core, _shm, config

__all__ = [
    "allocate",
    "failing_node_setup",
    "is_node_shared",
    "pool_min_bytes",
    "pooled",
    "pooled_empty",
]

_pool_min = [1 << 20]  # PYSHARD_POOL_MIN_BYTES, applied at every change of the setting


def _follow(value: int) -> None:
    _pool_min[0] = max(int(value), 1)  # an empty result never comes from the pool


config.apply_with("PYSHARD_POOL_MIN_BYTES", _follow)


def pool_min_bytes() -> int:
    """Host results of at least this many bytes (and at least one) come from the result
    pool."""
    return _pool_min[0]


def pooled(nbytes: int) -> bool:
    """Does a host result of ``nbytes`` come from the result pool?"""
    return nbytes >= _pool_min[0]


def pooled_empty(shape: Tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An uninitialised array whose memory comes from the core's result pool and returns to
    it when the array (and every view of it) is freed."""
    buf = _core.PooledBuffer(prod(shape) * dtype.itemsize)
    return np.frombuffer(buf, dtype=dtype).reshape(shape)


def allocate(shape: Tuple[int, ...], dtype: np.dtype, like: Any = None, node: Any = None) -> Any:
    """An uninitialised result of ``shape`` and ``dtype``: like ``like`` (a cupy array: on its
    device), in this rank's node-shared memory where a node transport writes into it
    (``node``), from the result pool for host results of :func:`pool_min_bytes` or more, else
    plain."""
    if like is not None and bk.is_device(like):
        return bk.xp_of(like).empty(shape, dtype)
    if node is not None:
        return _shm.empty(node, shape, dtype)
    if prod(shape) * dtype.itemsize >= _pool_min[0]:
        return pooled_empty(shape, dtype)
    return np.empty(shape, dtype)


def is_node_shared(a: Any) -> bool:
    """Does ``a`` (a numpy array or a view of one) live in this rank's node-shared memory: a
    result the node-local transport wrote straight from its peers (pyshard/_shm.py)?"""
    while isinstance(a, (np.ndarray, memoryview)):
        a = a.obj if isinstance(a, memoryview) else a.base
    return isinstance(a, _core.ShmBuffer)


_STAGES = (None, "segment", "map", "cma")


@contextmanager
def failing_node_setup(stage: Optional[str]) -> Iterator[None]:
    """Fault injection, for tests of the way back to MPI: meshes built inside fail their
    node-shared memory setup on this rank at ``stage``: ``"segment"`` (it cannot make its
    control segment; the mesh's one Allgather tells every rank) or ``"map"`` (it cannot map
    its peers' segments; its node's ranks take MPI among themselves), ``"cma"`` (it cannot
    write into its peers' private memory, as where ptrace is refused: its node's ranks copy
    results meant for private memory through node-shared memory, ``PYSHARD_CMA``), ``None``
    (no failure on this rank). Every rank should enter it: inside, the warning that
    node-shared memory is not usable (logged once a process) is logged again at its next
    occasion."""
    if stage not in _STAGES:
        raise ValueError(f"stage must be one of {_STAGES}, got {stage!r}")
    old, was = _shm.fail_setup, _shm.set_warned(False)
    _shm.fail_setup = stage
    try:
        yield
    finally:
        _shm.fail_setup = old
        _shm.set_warned(was)
