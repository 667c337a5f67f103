"""The validation mode: a rank that calls with other arguments than its peers gets an error,
on every rank, instead of a hang.

Off by default (no collective beyond the plan's). On (``PYSHARD_VALIDATE=1``, from the
environment or ``pyshard.config``: the next call follows every change of it; or
``pyshard.set_validation(True)``), ``Mesh``, ``redistribute``, ``from_local``, ``save``,
``load`` (and ``redistribute_many``, ``migrate``, halo updates and folds, gather plans, the
FFTs, ``balance``: the list is in docs/troubleshooting.md) first run one small collective
over the mesh: an ``MPI_Iallgather`` of twelve int64 per rank
(the call and checksums of its arguments: source and target layouts, algorithm, whether the
local shard fits the layout). When every rank agrees, that is all it costs. When they differ,
one more allgather of the readable descriptions follows and every rank raises the same
``ValueError`` naming the ranks that differ and what differs. ``migrate(..., peers=)`` also
checks that the ranks' peers form one symmetric relation (:func:`symmetric`).
"""

from __future__ import annotations

import time
import zlib
from typing import Dict, List, Optional, Tuple

import numpy as np
from mpi4py import MPI

from . import collectives, config

__all__ = ["set_validation", "validation", "validation_stats"]

WIDTH = 12  # int64 per rank: the call, then one checksum per item (at most WIDTH - 1)


enabled = False  # PYSHARD_VALIDATE as it is now (_follow): the calls read this flag


def _follow(on: bool) -> None:
    global enabled
    enabled = bool(on)


config.apply_with("PYSHARD_VALIDATE", _follow)  # now, and at every change of the setting


def set_validation(on: bool) -> None:
    """Turn the validation mode on or off (this process; every rank should do the same):
    ``pyshard.config.set("PYSHARD_VALIDATE", on)``, so that ``config.get``, ``config.set``
    and ``config.override`` see and change the same value.

    On: every collective call (``Mesh``, ``redistribute``, ``from_local``, ``save``,
    ``load``, ``redistribute_many``, halo updates and folds, gather plans, ``migrate``, the
    FFTs, ``balance``) first checks with one small Allgather that every rank passed the same
    layouts and arguments, and raises the same ``ValueError`` on every rank when they differ
    (instead of hanging in mismatched collectives). Off (the default): no collective beyond
    the plan's.
    """
    from . import config

    config.set("PYSHARD_VALIDATE", on)


def validation() -> bool:
    """Is the validation mode on?"""
    return enabled


_checks: Dict[str, int] = {}  # validation_stats: checks run, by call


def validation_stats() -> Dict[str, int]:
    """The validation mode's checks this process has run, by call (``{"redistribute": 2}``):
    one small Allgather each (:func:`set_validation`); ``reset_comm_stats`` zeroes them."""
    return dict(_checks)


def reset_validation_stats() -> None:
    """Zero the counts of :func:`validation_stats`."""
    _checks.clear()


def _crc(s: str) -> int:
    return zlib.crc32(s.encode())


def _live(comm: MPI.Comm) -> None:
    """RuntimeError, before any MPI call, where MPI was finalized or ``comm`` is a freed
    mesh's (``MPI.COMM_NULL``): the calls that agree first would end the process (MPICH) or
    raise the MPI library's own message about a null communicator."""
    collectives.check_finalized()
    if comm == MPI.COMM_NULL:
        raise RuntimeError("this mesh was freed (Mesh.free()): it has no communicators left; "
                           "make a new Mesh")


def agree(comm: MPI.Comm, call: str, items: Dict[str, str]) -> None:
    """Collective over ``comm``: every rank's ``items`` (name -> description) must be equal;
    else every rank raises the same ValueError naming the ranks that differ and how.
    Counted in :func:`validation_stats` under ``call``."""
    _live(comm)
    _checks[call] = _checks.get(call, 0) + 1
    # the settings that choose the collectives too: ranks that differ would wait for each
    # other in different calls
    items = {**items, "settings": config.collective_settings()}
    names = list(items)[: WIDTH - 1]
    mine = np.zeros(WIDTH, np.int64)
    mine[0] = _crc(call + "|" + ",".join(names))
    for i, n in enumerate(names):
        mine[i + 1] = _crc(items[n])
    rows = _gather_rows(comm, mine, call)
    if (rows == rows[0]).all():
        return
    everyone: List[tuple] = collectives.allgather(comm, (call, items))  # every rank saw it
    world = collectives.world_ranks(comm, list(range(len(everyone))))
    raise ValueError(_message(everyone, world))


def symmetric(comm: MPI.Comm, call: str, peers: Tuple[int, ...]) -> None:
    """Collective over ``comm``, after an :func:`agree` of the call: the ranks' ``peers``
    (each rank's others, ranks of ``comm``) must be one symmetric relation (q lists p where p
    lists q), else every rank raises the same ValueError naming the first pair that is not.
    One more small Allgather: every rank's bits, ``P / 8`` bytes each."""
    P = comm.Get_size()
    row = np.zeros(P, bool)
    row[list(peers)] = True
    rows = _gather_rows(comm, np.packbits(row), call)
    lists = np.unpackbits(rows, axis=1, count=P).astype(bool)
    bad = np.argwhere(lists != lists.T)
    if bad.size:
        p, q = (int(v) for v in bad[0])
        if not lists[p, q]:
            p, q = q, p
        raise ValueError(
            f"pyshard (validation mode): {call}: the peers= relation is not symmetric: rank "
            f"{p} lists rank {q} but rank {q} does not list rank {p} (every rank passes the "
            f"ranks it exchanges with, and each of them must list it back)")


def _gather_rows(comm: MPI.Comm, mine: np.ndarray, call: str) -> np.ndarray:
    """Every rank's checksums (an ``MPI_Iallgather``), waited for at most
    ``PYSHARD_PEER_TIMEOUT`` seconds: a rank that is not in this call (it skipped it, or
    raised before its check) makes the others raise instead of waiting for ever."""
    rows = np.empty((comm.Get_size(), mine.size), mine.dtype)
    req = comm.Iallgather(mine, rows)
    if req.Test():
        return rows
    limit = float(config.get("PYSHARD_PEER_TIMEOUT"))
    t0 = time.monotonic()
    pause = 1e-5
    while not req.Test():
        if time.monotonic() - t0 > limit:
            raise RuntimeError(
                f"pyshard (validation mode): waited {limit:g} s in the check of {call} for "
                f"the other ranks of the mesh (PYSHARD_PEER_TIMEOUT): some rank is not in this "
                f"call (it skipped it, raised before its check, computes for longer than that, "
                f"or runs with the validation mode off: it must be on on every rank); the job "
                f"cannot go on (the check stays posted)")
        time.sleep(pause)
        pause = min(2 * pause, 1e-3)
    return rows


def refused(comm: MPI.Comm, call: str, err: BaseException) -> None:
    """Validation mode, where this rank failed a call before its agreement (a setting with a
    value pyshard refuses, read first; an argument that only this rank has wrong): agree
    anyway, so that ranks that passed do not wait in their agreement for this one. Where
    the other ranks differ (their settings line or call shows it) every rank raises the
    agreement's error; where every rank failed alike, the caller raises ``err``. A no-op
    outside validation mode."""
    if enabled:
        agree(comm, call, {"refused": f"{type(err).__name__}: {err}"})


def _message(everyone: List[tuple], world: Optional[List[int]] = None) -> str:
    """What differs between the ranks' calls, the same text on every rank; ``world``: each
    rank's world rank where the mesh's ranks are not the world's (named beside them)."""

    def _ranks(rs: List[int]) -> str:
        text = ("rank " if len(rs) == 1 else "ranks ") + ", ".join(map(str, rs))
        if world is None:
            return text
        return f"{text} (world {'rank' if len(rs) == 1 else 'ranks'} " + ", ".join(
            str(world[r]) for r in rs) + ")"

    calls: Dict[str, List[int]] = {}
    for r, (call, _) in enumerate(everyone):
        calls.setdefault(call, []).append(r)
    if len(calls) > 1:
        where = "; ".join(f"{_ranks(rs)} in {c}" for c, rs in calls.items())
        return (
            f"pyshard (validation mode): the ranks are in different calls: {where}. Every "
            f"rank must make the same pyshard calls in the same order."
        )
    call = everyone[0][0]
    lines = [f"pyshard (validation mode): the ranks passed different arguments to {call}:"]
    names = list(dict.fromkeys(n for _, items in everyone for n in items))  # (every rank's)
    for n in names:
        groups: Dict[str, List[int]] = {}
        for r, (_, items) in enumerate(everyone):
            groups.setdefault(items.get(n, "?"), []).append(r)
        if len(groups) > 1:
            parts = "; ".join(f"{_ranks(rs)}: {v}" for v, rs in groups.items())
            lines.append(f"  {n}: {parts}")
    lines.append("Every rank must pass the same layouts and arguments, and see the same "
                 "settings that choose the collectives (pyshard.config.COLLECTIVE_SETTINGS).")
    return "\n".join(lines)
