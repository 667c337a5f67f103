"""``tune_mesh``: time candidate mesh shapes for a piece of work and keep the fastest.

:func:`tune_mesh` (``pyshard.tune_mesh``) runs ``work(mesh)`` on a mesh of every
factorisation of the communicator's size into ``ndim`` dims (one warm-up, then ``trials``
timed runs, each the slowest rank), and returns a :class:`~pyshard.Mesh` of the fastest on
every rank (the times are combined with one Allreduce, so every rank picks the same). With
``key`` and ``PYSHARD_TUNE_FILE`` set the choice is kept in that file (the wisdom
:mod:`pyshard._tune` keeps its algorithm choices in, under ``"mesh|..."`` keys), read by rank
0 and broadcast, so the next job skips the timing.
``pyshard.fft.tune_mesh`` (:mod:`pyshard.fft.api`) does this for a transform of
``pyshard.fft``: candidates are the slab and pencil meshes sharding the leading axes, timed
on the forward and backward of a cached plan with ``placements="any"``. This module imports
nothing else of :mod:`pyshard.fft` (``import pyshard`` takes :func:`tune_mesh` from here
without loading scipy).
"""

from __future__ import annotations

import json
import logging
import os
import time
from itertools import product
from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np
from mpi4py import MPI

from .. import collectives, config
from .._tune import update_file
from ..mesh import Mesh

__all__ = ["mesh_shapes", "tune_mesh"]

log = logging.getLogger("pyshard")


def mesh_shapes(size: int, ndim: int) -> List[Tuple[int, ...]]:
    """Every ordered factorisation of ``size`` into ``ndim`` positive factors."""
    divs = [d for d in range(1, size + 1) if size % d == 0]
    out = []
    for combo in product(divs, repeat=ndim - 1):
        rest = size
        ok = True
        for c in combo:
            if rest % c:
                ok = False
                break
            rest //= c
        if ok:
            out.append(tuple(combo) + (rest,))
    return out


def _library() -> str:
    return " ".join(MPI.Get_library_version().strip().splitlines()[0].split())


def _ranks_per_node(comm: MPI.Comm) -> int:
    """The most ranks of ``comm`` on one node (collective): the same on every rank."""
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return int(collectives.max_all(comm, node.Get_size()))
    finally:
        node.Free()


def _load(comm: MPI.Comm, key: str) -> Optional[Tuple[int, ...]]:
    path = config.get("PYSHARD_TUNE_FILE")
    found = None
    if comm.rank == 0 and path and os.path.exists(path):
        try:
            with open(path) as f:
                v = json.load(f).get(key)
            if isinstance(v, str):
                found = tuple(int(p) for p in v.split("x"))
        except (OSError, ValueError, AttributeError) as e:
            log.warning("pyshard: ignoring the tuning file %s: %s", path, e)
    return collectives.bcast(comm, found)


def _save(comm: MPI.Comm, key: str, shape: Tuple[int, ...]) -> None:
    path = config.get("PYSHARD_TUNE_FILE")
    if comm.rank != 0 or not path:
        return
    try:
        update_file(path, {key: "x".join(map(str, shape))})
    except (OSError, ValueError) as e:
        log.warning("pyshard: cannot write the tuning file %s: %s", path, e)


def tune_mesh(
    comm: MPI.Comm,
    ndim: int,
    work: Callable[[Mesh], Any],
    key: Optional[str] = None,
    trials: int = 3,
    candidates: Optional[Sequence[Sequence[int]]] = None,
) -> Mesh:
    """The :class:`~pyshard.Mesh` over ``comm`` of ``ndim`` dims on which ``work(mesh)``
    runs fastest (median of ``trials``, slowest rank; one warm-up each); collective over
    ``comm``, the same mesh on every rank. ``candidates``: the mesh shapes to try (default
    every factorisation into ``ndim`` dims, :func:`mesh_shapes`; given, they may have any
    number of dims). ``key``: where to keep the choice in
    ``PYSHARD_TUNE_FILE`` (then a later call with that key times nothing)."""
    if ndim < 1:
        raise ValueError(f"tune_mesh: ndim must be >= 1, got {ndim}")
    shapes = [tuple(int(m) for m in c) for c in candidates] if candidates else mesh_shapes(
        comm.size, ndim)
    for s in shapes:
        if int(np.prod(s)) != comm.size:
            raise ValueError(f"tune_mesh: candidate mesh {s} does not have {comm.size} ranks")
    full = None
    if key is not None:  # the MPI library, ranks and ranks per node, then the caller's key
        full = f"mesh|{_library()}|{comm.size}|{_ranks_per_node(comm)}|{key}"
    if full is not None:
        hit = _load(comm, full)
        if hit is not None and hit in shapes:
            return Mesh(comm, hit)
    times = np.empty(len(shapes))
    for i, s in enumerate(shapes):
        mesh = Mesh(comm, s)
        try:
            work(mesh)  # warm-up: plans, executors, pages
            ts = []
            for _ in range(trials):
                collectives.barrier(comm)
                t0 = time.perf_counter()
                work(mesh)
                ts.append(collectives.max_all(comm, time.perf_counter() - t0))
            times[i] = float(np.median(ts))
        finally:
            mesh.free()
    best = shapes[int(np.argmin(times))]  # every rank has the same times (the allreduce)
    if comm.rank == 0:
        log.info("pyshard: tune_mesh %s: %s (%s ms)", key, best, ", ".join(
            f"{'x'.join(map(str, s))} {1e3 * t:.2f}" for s, t in zip(shapes, times)))
    if full is not None:
        _save(comm, full, best)
    return Mesh(comm, best)
