"""Bounded caches: the one owner of everything pyshard memoises.

Layouts and plans are cached per process, executors (the core's per-step objects) per mesh.
Every cache is an LRU of at most :func:`cache_limit` entries (``PYSHARD_CACHE_LIMIT``, default
256; :func:`set_cache_limit` changes it until the setting next changes) and holds
metadata only: counts, block lists, descriptor tables. The pack/unpack and staging buffers
live in one workspace pool per mesh, shared by its steps, trimmed to what the live executors
need whenever an executor is evicted, and released by ``Mesh.free()`` or :func:`clear_caches`.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Dict, NamedTuple, Optional, Tuple

from . import _lru, config
from ._lru import DEFAULT_LIMIT, LRU, Fifo, memoize

__all__ = ["DEFAULT_LIMIT", "LRU", "Fifo", "cache_limit", "clear_caches", "memoize",
           "set_cache_limit"]

config.apply_with("PYSHARD_CACHE_LIMIT", _lru.set_limit)  # now, and at every change


class FastEntry(NamedTuple):
    """A repeated redistribute's one lookup (``pyshard.executor.bind``): the call to make,
    the core binding it calls (or None), the target layout, the source's local shape (the
    fast path checks ``local`` against it), and the executors it runs."""

    call: Callable[[Any, Optional[Any]], Any]
    binding: Any
    target: Any
    shape: Tuple[int, ...]
    execs: list


class ExecCache:
    """A mesh's executors: ``(plan, algorithm, memory kind) -> [executor per step]`` and the
    one-lookup fast path ``(layout, *placements, algorithm, array type) -> (call, core
    binding, target, executors)`` (``pyshard.executor.bind``), both bounded, plus the
    workspace pool their core steps share."""

    __slots__ = ("execs", "fast", "workspace", "tuned", "tuned_file", "gen", "_keep",
                 "__weakref__")

    def __init__(self, workspace: Any) -> None:
        # (a mesh's build: a setting refused at import raises here, before any call runs on
        # the default that stands in for it)
        config.check_applied()
        self.workspace = workspace
        self.gen = config.generation()  # the settings its executors and bindings were built under
        # algorithm="tune" decisions (pyshard._tune): never evicted, so that a rebuilt
        # executor finds its choice without communicating
        self.tuned: Optional[Dict[str, str]] = None
        self.tuned_file = ""  # the PYSHARD_TUNE_FILE ``tuned`` was read from
        self.execs = LRU(self._evicted)
        self.fast = Fifo()
        self._keep = 0

    def _evicted(self, execs: list) -> None:
        # the fast path may still point at an evicted executor: drop those entries too
        dead = {id(e) for e in execs}
        for k, hit in list(self.fast.items()):
            if any(id(e) in dead for e in hit.execs):
                del self.fast[k]
        if any(_need(e) >= self._keep for e in execs):
            self.trim()

    def current(self) -> ExecCache:
        """This cache, emptied first of the executors and bindings built under other settings
        (:func:`pyshard.config.generation` moved on: a setting changed; what the process
        holds from the settings is applied when they change, :func:`pyshard.config.apply_with`)."""
        g = config.generation()
        if g != self.gen:
            config.check_applied()  # (one refused at the end of an override, say)
            self.gen = g
            self.execs.clear()
            self.fast.clear()
            self.trim()
        return self

    def need(self) -> int:
        """The largest workspace any live executor needs (bytes)."""
        return max((_need(e) for execs in self.execs.values() for e in execs), default=0)

    def note(self, execs: list) -> None:
        self._keep = max([self._keep] + [_need(e) for e in execs])

    def trim(self) -> None:
        """Shrink the workspace pool to what the live executors need."""
        self._keep = self.need()
        self.workspace.trim(self._keep)

    def clear(self) -> None:
        self.execs.clear()
        self.fast.clear()
        self._keep = 0
        self.workspace.release()


def _need(e: Any) -> int:
    return int(getattr(e, "need", 0))


_exec_caches: weakref.WeakSet[ExecCache] = weakref.WeakSet()


def register(c: ExecCache) -> ExecCache:
    _exec_caches.add(c)
    return c


def cache_limit() -> int:
    """The most entries each of pyshard's caches keeps (layouts, plans, executors per mesh)."""
    return _lru.limit()


def set_cache_limit(n: int) -> None:
    """Bound every pyshard cache to ``n`` entries (>= 1); larger caches shrink now.

    The default is 256, or ``PYSHARD_CACHE_LIMIT``: this is
    ``pyshard.config.set("PYSHARD_CACHE_LIMIT", n)`` (``config.get`` and ``config.set`` see
    and change the same value). A loop over many distinct shapes keeps at most ``n`` plans
    and executors per mesh, and the workspace pool shrinks to what those need.
    """
    from . import config

    if isinstance(n, (bool, str)):  # (config.set would parse a string as the environment's)
        raise ValueError(f"set_cache_limit: n must be an int >= 1, got {n!r}")
    config.set("PYSHARD_CACHE_LIMIT", n)


def clear_caches() -> None:
    """Drop every cached layout, plan and executor, release the meshes' workspaces and the
    result pool's idle buffers.

    Local (no communication); safe at any time between redistributions.
    """
    from . import _core

    for c in _lru.lrus():
        c.clear()
    for e in list(_exec_caches):
        e.clear()
    _core.result_pool_clear()


def _bound_result_pool(limit: int) -> None:
    """Bound the result pool (``PYSHARD_RESULT_POOL_BYTES``, default 1 GiB; 0 turns it off):
    host results of 1 MiB or more come from it and go back to it when freed."""
    from . import _core

    _core.set_result_pool_limit(limit)


config.apply_with("PYSHARD_RESULT_POOL_BYTES", _bound_result_pool)  # now, and at every change


def stats() -> Dict[str, int]:
    """Entries per kind of cache and workspace bytes held (for tests and the bench)."""
    return {
        "caches": len(_lru.lrus()),
        "entries": sum(len(c) for c in _lru.lrus()),
        "workspace_bytes": sum(int(e.workspace.held) for e in _exec_caches),
    }
