"""The few mpi4py collectives that pyshard's Python makes, in one place.

Data moves through the C++ core (``cpp/mpi_calls.cpp`` holds every MPI call it makes). What is
left for Python is small and rare: agreeing a verdict, a time or a small object across the
ranks of a communicator (validation, tuning, checkpoint commits, the node map). Every such call
goes through a function here, so ``tests/test_structure.py`` can check that no other library
module calls mpi4py's collectives, and a reader finds every Python collective on one page.

Each function is collective over ``comm``: every rank of it must call it, in the same order.
"""

from __future__ import annotations

from typing import Any, List, Optional, TypeVar

import numpy as np
from mpi4py import MPI

T = TypeVar("T")


def allgather(comm: Any, obj: T) -> List[T]:
    """Every rank's ``obj`` (pickled), in rank order, on every rank."""
    return comm.allgather(obj)


def gather(comm: Any, obj: T, root: int = 0) -> Any:
    """Every rank's ``obj`` in rank order on ``root``; None elsewhere."""
    return comm.gather(obj, root=root)


def bcast(comm: Any, obj: T, root: int = 0) -> T:
    """``root``'s ``obj`` on every rank."""
    return comm.bcast(obj, root=root)


def max_all(comm: Any, value: T) -> T:
    """The largest ``value`` (a Python number) over the ranks, on every rank."""
    return comm.allreduce(value, op=MPI.MAX)


def all_true(comm: Any, flag: bool) -> bool:
    """True on every rank where ``flag`` is true on every rank."""
    return bool(comm.allreduce(bool(flag), op=MPI.LAND))


def max_all_array(comm: Any, values: np.ndarray) -> np.ndarray:
    """The elementwise maximum of ``values`` (same shape and dtype on every rank)."""
    out = np.empty_like(values)
    comm.Allreduce(values, out, op=MPI.MAX)
    return out


def sum_all_array(comm: Any, values: np.ndarray) -> np.ndarray:
    """The elementwise sum of ``values`` (same shape and dtype on every rank)."""
    out = np.empty_like(values)
    comm.Allreduce(np.ascontiguousarray(values), out, op=MPI.SUM)
    return out


def allgather_rows(comm: Any, row: np.ndarray) -> np.ndarray:
    """Every rank's 1-D ``row`` (same length and dtype on every rank) as the rows of a
    ``(comm size, len(row))`` array, in rank order."""
    rows = np.empty((comm.Get_size(), row.size), dtype=row.dtype)
    comm.Allgather(np.ascontiguousarray(row), rows)
    return rows


def world_ranks(comm: Any, ranks: List[int]) -> Optional[List[int]]:
    """``ranks`` of ``comm`` as ranks of ``MPI.COMM_WORLD``, or None where they are the same
    (``comm`` is the world's ranks in the world's order). Local (group arithmetic, no
    communication): for error messages of a mesh on a sub-communicator."""
    if comm.Get_size() == MPI.COMM_WORLD.Get_size() and MPI.Comm.Compare(
            comm, MPI.COMM_WORLD) in (MPI.IDENT, MPI.CONGRUENT):
        return None
    mine, world = comm.Get_group(), MPI.COMM_WORLD.Get_group()
    try:
        return [int(r) for r in MPI.Group.Translate_ranks(mine, list(ranks), world)]
    finally:
        mine.Free()
        world.Free()


def rank_name(comm: Any, rank: int) -> str:
    """``"rank 1"``, or ``"rank 1 (world rank 3)"`` where ``comm``'s ranks are not the
    world's (see :func:`world_ranks`)."""
    w = world_ranks(comm, [rank]) if rank >= 0 else None
    return f"rank {rank}" if w is None else f"rank {rank} (world rank {w[0]})"


def barrier(comm: Any) -> None:
    """Every rank of ``comm`` has reached this call (timing loops line their ranks up here)."""
    comm.Barrier()


def check_finalized() -> None:
    """RuntimeError once MPI is finalized (``MPI.Finalize()``): before any MPI call, which
    MPICH answers by ending the process with its own message. ``MPI_Finalized`` itself may
    be called at any time (about 30 ns)."""
    if MPI.Is_finalized():
        raise RuntimeError("MPI was finalized (MPI.Finalize()): pyshard cannot communicate "
                           "any more")
