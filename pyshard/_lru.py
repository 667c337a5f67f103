"""Bounded memo tables with no dependency: the LRU, the FIFO of the one-lookup fast path and
``memoize``, all bounded by one limit (:func:`limit`, :func:`set_limit`). The pure layout
algebra (``layout``, ``plan``, ``halo_plan``) memoises through this module alone;
:mod:`pyshard._cache` sets the limit from ``PYSHARD_CACHE_LIMIT`` and owns the executor
caches and the workspace pools.
"""

from __future__ import annotations

import functools
import weakref
from collections import OrderedDict
from typing import Any, Callable, List, Optional

__all__ = ["LRU", "Fifo", "limit", "memoize", "set_limit", "tables"]

DEFAULT_LIMIT = 256


_limit: int = DEFAULT_LIMIT  # pyshard._cache sets it from PYSHARD_CACHE_LIMIT at import
_caches: weakref.WeakSet[LRU] = weakref.WeakSet()
_fifos: weakref.WeakSet[Fifo] = weakref.WeakSet()


class LRU:
    """A dict with at most ``cache_limit()`` entries; the least recently used go first.

    ``on_evict(value)`` is called for each entry pushed out (not for :meth:`clear`).
    """

    __slots__ = ("_d", "_on_evict", "__weakref__")

    def __init__(self, on_evict: Optional[Callable[[Any], None]] = None) -> None:
        self._d: OrderedDict[Any, Any] = OrderedDict()
        self._on_evict = on_evict
        _caches.add(self)

    def get(self, key: Any) -> Any:
        v = self._d.get(key)
        if v is not None:
            self._d.move_to_end(key)
        return v

    def put(self, key: Any, value: Any) -> None:
        self._d[key] = value
        self._d.move_to_end(key)
        self.shrink(_limit)

    def shrink(self, n: int) -> None:
        while len(self._d) > n:
            _, v = self._d.popitem(last=False)
            if self._on_evict is not None:
                self._on_evict(v)

    def values(self) -> List[Any]:
        return list(self._d.values())

    def clear(self) -> None:
        self._d.clear()

    def __len__(self) -> int:
        return len(self._d)


class Fifo(dict):
    """A dict of at most ``cache_limit()`` entries, the oldest out first: ``get`` is the plain
    dict lookup (one hash, no bookkeeping), for the one-lookup fast path."""

    def __init__(self) -> None:
        super().__init__()
        _fifos.add(self)

    def put(self, key: Any, value: Any) -> None:
        self[key] = value
        self.shrink(_limit)

    def shrink(self, n: int) -> None:
        while len(self) > n:
            del self[next(iter(self))]

    __hash__ = object.__hash__  # weak-referencable and hashable like any object


def memoize(fn: Callable) -> Callable:
    """Like ``functools.lru_cache``, bounded by :func:`limit` (hashable arguments)."""
    cache = LRU()

    @functools.wraps(fn)
    def wrapper(*args: Any) -> Any:
        v = cache.get(args)
        if v is None:
            v = fn(*args)
            cache.put(args, v)
        return v

    wrapper.cache = cache  # type: ignore[attr-defined]
    return wrapper


def limit() -> int:
    """The most entries each table keeps."""
    return _limit


def set_limit(n: int) -> None:
    """Bound every table to ``n`` entries; larger tables shrink now (no check: the caller's)."""
    global _limit
    _limit = n
    for c in tables():
        c.shrink(n)


def tables() -> List[Any]:
    """Every live LRU and FIFO."""
    return list(_caches) + list(_fifos)


def lrus() -> List[LRU]:
    """Every live LRU (``clear_caches`` empties them)."""
    return list(_caches)
