"""What every format's save shares: the check that all ranks describe one checkpoint, the
one replica that writes a box, the one check of the save target, and the prepare and commit
around the data: rank 0 makes the temporary file or directory (:func:`prepare`), every rank
writes its part, and :func:`finish` agrees the verdicts and lets rank 0 commit (write the
metadata last, fsync, rename into place) or remove what was written."""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import zlib
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from mpi4py import MPI

from .. import collectives
from ..layout import Layout, Shard
from .driver import Format
from .errors import Failure, error, on_root

log = logging.getLogger(__name__)

__all__ = [
    "check_nested",
    "check_same",
    "check_target",
    "differing_ranks",
    "finish",
    "fsync_dir",
    "is_writer",
    "prepare",
    "remove",
    "replace_file",
    "swap_in",
    "temporary",
    "write_error",
]


def is_writer(layout: Layout, coords: Sequence[int]) -> bool:
    """The one replica that writes a box: coordinate 0 on every mesh dim that does not shard."""
    return all(c == 0 for c, p in zip(coords, layout.placements) if not isinstance(p, Shard))


def _digest(what: Any) -> int:
    """A checksum of ``what`` (JSON data) that ranks compare."""
    return zlib.crc32(json.dumps(what, sort_keys=True).encode())


def differing_ranks(comm: Any, what: Any) -> List[int]:
    """One small allgather of a checksum of ``what`` (JSON data): the ranks whose ``what``
    differs from rank 0's (the same list on every rank)."""
    digests = collectives.allgather(comm, _digest(what))
    return [r for r, d in enumerate(digests) if d != digests[0]]


def check_same(comm: Any, path: str, tag: str, entries: Dict[str, Any],
               local: Optional[str] = None) -> None:
    """Every rank must describe the same checkpoint (``tag``: the metadata, format and
    options, ``sync`` included; ``entries``: the arrays): one small allgather agrees on it.
    ``local``: what is wrong with this rank's local arrays (a ``.local`` replaced by one of
    another shape or dtype, which would be written as raw bytes), or None; the same
    allgather carries it, so every rank raises naming the first rank at fault."""
    everyone = collectives.allgather(comm, (_digest([path, tag, entries]), local))
    at_fault = [(r, p) for r, (_, p) in enumerate(everyone) if p is not None]
    if at_fault:
        r, p = at_fault[0]
        more = f" (and {len(at_fault) - 1} more rank(s))" if len(at_fault) > 1 else ""
        raise ValueError(
            f"save({path!r}): {collectives.rank_name(comm, r)}{more}: {p}; nothing was "
            f"written; every rank raises this")
    bad = [r for r, (d, _) in enumerate(everyone) if d != everyone[0][0]]
    if bad:
        raise ValueError(
            f"save({path!r}): ranks {bad} pass other names, layouts, path, metadata, format, "
            f"compression or sync than rank 0; every rank must pass the same"
        )


def write_error(path: str, name: str, rank: int, e: Exception) -> str:
    """The message of a write error that rank ``rank`` met writing array ``name`` (agreed in
    :func:`finish`): an MPI error by its error string (its repr is only a code)."""
    why = f"MPI error: {' '.join(str(e).split())}" if isinstance(e, MPI.Exception) else repr(e)
    return f"save({path!r}): array {name!r}: rank {rank}: {why}"


def check_nested(names: Sequence[str], label: str) -> None:
    """Before any communication (the names are the same on every rank): ValueError where a
    name is also the group of another (``"a"`` and ``"a/b"``): an array is no group, so
    ``label`` (``"HDF5"``, ``"Zarr"``) could store one of them only."""
    have = set(names)
    for name in sorted(names):
        parts = name.split("/")
        for k in range(1, len(parts)):
            group = "/".join(parts[:k])
            if group in have:
                raise ValueError(
                    f"save(arrays[{name!r}]): {group!r} is an array, so it cannot also be the "
                    f"{label} group holding {name!r}; rename one of them"
                )


def check_target(path: str, fmt: Format) -> str:
    """Rank 0: the parent directory of ``path``, where a save of ``fmt`` may write: the
    parent exists, and ``path`` is missing or something ``fmt`` may replace
    (:meth:`~pyshard.checkpoint.driver.Format.replaceable`)."""
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise Failure(
            error("FileNotFoundError", f"save: parent directory {parent!r} of {path!r} not found")
        )
    if os.path.lexists(path) and not fmt.replaceable(path):
        raise Failure(
            error(
                "ValueError",
                f"save: refusing to replace {path!r}: it exists and is not {fmt.target}",
            )
        )
    return parent


def temporary(path: str) -> Tuple[str, str]:
    """(``path.tmp-<token>``, token): the name a save writes under until its rename."""
    token = secrets.token_hex(6)
    return f"{path}.tmp-{token}", token


def remove(tmp: str) -> None:
    """Remove the temporary file or directory ``tmp`` of a save that failed (if any)."""
    if os.path.isdir(tmp) and not os.path.islink(tmp):
        shutil.rmtree(tmp, ignore_errors=True)
    elif os.path.lexists(tmp):
        os.remove(tmp)


def os_kind(e: BaseException) -> str:
    """The class every rank raises for rank 0's error ``e`` in a save's file-system steps:
    PermissionError or OSError for the file system's refusals (a read-only directory, a
    full disk), so that ``except OSError`` catches them; ValueError for anything else."""
    if isinstance(e, PermissionError):
        return "PermissionError"
    return "OSError" if isinstance(e, OSError) else "ValueError"


def prepare(comm: Any, path: str, step: Callable[[], Any]) -> Any:
    """Rank 0 runs ``step`` (check the target, make the temporary file or directory, write
    what goes before the data); every rank returns its result or raises its error, the same
    on every rank (one bcast)."""
    return on_root(
        comm, step, lambda e: error(os_kind(e), f"save({path!r}): cannot prepare {path!r}: {e}")
    )


def finish(
    comm: Any,
    path: str,
    tmp: str,
    bad: Optional[str],
    payload: Any,
    commit: Callable[[List[Any]], None],
) -> None:
    """Every rank has written its part and closed its files; collective over ``comm``.

    Rank 0 gathers every rank's verdict ``bad`` (None, or the message of its write error) and
    ``payload`` (one gather); where a rank failed it raises that rank's error, else it runs
    ``commit(payloads)`` (metadata last, fsync, rename); a failure removes ``tmp``. Every rank
    returns or raises the same (one bcast)."""
    gathered = collectives.gather(comm, (bad, payload))

    def step() -> None:
        try:
            first = next((b for b, _ in gathered if b is not None), None)
            if first is not None:
                raise Failure(error("ValueError", first))
            commit([p for _, p in gathered])
        except BaseException:
            remove(tmp)
            raise

    on_root(
        comm, step, lambda e: error(os_kind(e), f"save({path!r}): cannot write or rename: {e}")
    )


def fsync_dir(d: str) -> None:
    """fsync directory ``d`` (its new entries); nothing where directories cannot be opened."""
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def swap_in(tmp: str, path: str, parent: str, token: str, sync: bool) -> None:
    """Rename the finished checkpoint directory ``tmp`` to ``path``: a previous one there is
    moved aside first and put back if the rename fails, and removed once the new one is in
    place."""
    old = None
    if os.path.lexists(path):
        old = f"{path}.old-{token}"
        os.rename(path, old)
    try:
        os.rename(tmp, path)
    except OSError:
        if old is not None:
            os.rename(old, path)  # put the previous checkpoint back
        raise
    if sync:
        fsync_dir(parent)
    if old is not None:
        if os.path.islink(old) or not os.path.isdir(old):
            os.unlink(old)  # (a link at path: the link goes, what it pointed at stays)
        else:
            shutil.rmtree(old, ignore_errors=True)
        if os.path.lexists(old):
            log.warning("save: could not remove the previous checkpoint set aside at %s; "
                        "delete it by hand", old)


def replace_file(tmp: str, path: str, parent: str, sync: bool) -> None:
    """Rename the finished one-file checkpoint ``tmp`` over ``path`` (fsynced first with
    ``sync``): atomic, the previous file stays whole until this instant."""
    if sync:
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    os.rename(tmp, path)
    if sync:
        fsync_dir(parent)
