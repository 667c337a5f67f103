"""Errors of a checkpoint call that every rank raises alike, and the path argument.

Rank 0 does the file-system work of a save or load (check a directory, write a manifest,
rename); :func:`on_root` broadcasts its result or its error so that every rank returns or
raises the same, and none waits in a collective that another rank skipped. Where every rank
does its own part, :func:`agree` gives every rank the first failing rank's error.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Optional, Tuple, Union

from mpi4py import MPI

from .. import collectives

PathArg = Union[str, "os.PathLike[str]"]
"""A checkpoint path argument: a str or an ``os.PathLike``."""

Error = Tuple[str, str]
"""An error as (exception class name, message): picklable, broadcast from rank 0."""


class Failure(Exception):
    """An error rank 0 found; its argument is an :data:`Error`, broadcast and raised on
    every rank by :func:`on_root`."""


def error(kind: str, msg: str) -> Error:
    """The :data:`Error` of exception class ``kind`` ("FileNotFoundError", "TypeError",
    "ImportError", "PermissionError", "OSError"; anything else raises ValueError) with
    message ``msg``."""
    return (kind, msg)


def raise_error(err: Optional[Error]) -> None:
    """Raise ``err`` (an :data:`Error`); nothing when it is None."""
    if err is None:
        return
    kind, msg = err
    exc = {
        "FileNotFoundError": FileNotFoundError,
        "TypeError": TypeError,
        "ImportError": ImportError,
        "PermissionError": PermissionError,
        "OSError": OSError,
    }.get(kind, ValueError)
    raise exc(msg)


def on_root(
    comm: MPI.Comm, step: Callable[[], Any], on_error: Callable[[Exception], Error]
) -> Any:
    """Rank 0 runs ``step``; every rank returns its result or raises the error rank 0 met.

    Collective over ``comm`` (one bcast) on every rank. A :class:`Failure` carries its own
    error; any other exception becomes ``on_error(exc)``, so the other ranks never wait.
    """
    res: Any = None
    if comm.Get_rank() == 0:
        try:
            res = ("ok", step())
        except Failure as f:
            res = ("err", f.args[0])
        except Exception as e:  # never leave the other ranks waiting: report anything
            res = ("err", on_error(e))
    res = collectives.bcast(comm, res)
    if res[0] == "err":
        raise_error(res[1])
    return res[1]


def agree(comm: MPI.Comm, bad: Optional[str]) -> Optional[str]:
    """The first failing rank's message, on every rank (one allgather of every rank's
    ``bad``: None where it did its part, else the message of its error)."""
    return next((v for v in collectives.allgather(comm, bad) if v is not None), None)


def norm_path(path: object, what: str) -> str:
    """``path`` as a normalised str; TypeError naming the call ``what`` unless it is a
    non-empty str or os.PathLike."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{what}: path must be a str or os.PathLike, got {type(path).__name__}")
    p = os.fspath(path)
    if not isinstance(p, str) or not p:
        raise TypeError(f"{what}: path must be a non-empty str path, got {path!r}")
    return os.path.normpath(p)
