"""The protocol every checkpoint format implements: :class:`Format`.

A format is one module holding one :class:`Format` subclass, registered in the table of
:mod:`~pyshard.checkpoint.formats`; :func:`~pyshard.checkpoint.save`,
:func:`~pyshard.checkpoint.load` and :func:`~pyshard.checkpoint.checkpoint_info` reach every
format through that table. The four steps:

- :meth:`Format.probe`: is the path this format's (no MPI; :meth:`Format.resembles`: does
  a file no format claims start like one of its own);
- :meth:`Format.describe`: its arrays, shapes and dtypes (rank 0, or any process: no MPI);
- :meth:`Format.save`: every rank writes its boxes (collective), through the shared prepare
  and commit of :mod:`~pyshard.checkpoint.saving`;
- :meth:`Format.read_block`: one rank's block of an array stored in chunks, through the
  format's library (arrays stored as plain bytes are read by the reader itself).

An array description (:data:`Arrays`) is a dict: ``shape`` (tuple), ``dtype`` (numpy dtype),
``nbytes``, ``file`` (the file its bytes are in, or the Zarr array's directory), ``kind``
and what reading it takes: ``"raw"`` (C-order bytes at ``offset`` of ``file``: read with
MPI-IO or a mapping), ``"fill"`` (never written: every element is the bytes ``fill``),
``"unsupported"`` (an entry pyshard cannot hold, a string dataset for example: ``reason``
says why; only a load that names it fails, the file's other arrays load; ``shape`` and
``dtype`` None), or anything else (read with :meth:`Format.read_block` in blocks of whole
stored chunks of shape ``grid``, each by one rank); the layout it was saved from where
pyshard saved it (``mesh_shape``, ``placements``, ``sizes``); and optionally
``info_file``, the file as :func:`~pyshard.checkpoint.checkpoint_info` reports it when
that is not ``file``.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ..array import ShardedArray

__all__ = ["Arrays", "Facts", "Format", "Items", "Unsupported", "unsupported"]

Arrays = Dict[str, Dict[str, Any]]
"""name -> array description (see the module's docstring)."""

Facts = Dict[str, Any]
"""``version``, ``ranks``, ``created`` (None for other tools' files) and ``metadata``."""

Items = List[Tuple[str, ShardedArray]]
"""The arrays of a save, (name, array) in name order."""


class Unsupported(ValueError):
    """An entry of a checkpoint that pyshard cannot hold (a string dtype, an unknown codec):
    recorded with :func:`unsupported`, so that the file's other entries still load. Its
    message is the reason, without the file or the entry's name."""


def unsupported(reason: str, file: str) -> Dict[str, Any]:
    """The description of an entry pyshard cannot hold, for ``reason``, in ``file``."""
    return {
        "kind": "unsupported",
        "reason": reason,
        "shape": None,
        "dtype": None,
        "nbytes": 0,
        "file": file,
        "offset": None,
        "mesh_shape": (),
        "placements": [],
        "sizes": {},
    }


class Format:
    """One checkpoint format. Subclasses set the class attributes and implement
    :meth:`probe`, :meth:`describe`, :meth:`replaceable` and :meth:`save`; the other methods
    have defaults that fit a format without them."""

    name: str = ""
    """``format=`` of :func:`~pyshard.checkpoint.save`, ``format`` of ``checkpoint_info``."""

    label: str = ""
    """The format as messages name it (``"HDF5"``)."""

    one_file: bool = False
    """A checkpoint is one file (else a directory)."""

    target: str = ""
    """What a save may replace, as its refusal names it (``"an HDF5 file"``)."""

    compressions: Tuple[Optional[str], ...] = (None,)
    """The ``compression=`` values a save takes."""

    row_reads: bool = False
    """Large raw arrays load as row blocks (one contiguous run of the file per rank, independent
    I/O) and a redistribute; else by one collective MPI-IO read of every rank's box."""

    def probe(self, path: str) -> bool:
        """Is ``path`` a checkpoint of this format (a cheap look: a signature, a file name)."""
        raise NotImplementedError

    def resembles(self, path: str) -> bool:
        """Does ``path``, which no format's :meth:`probe` claims, start like this format's
        file (a damaged one: its :meth:`describe` then names what is wrong)? Default: no."""
        return False

    def describe(self, path: str, what: str) -> Tuple[Arrays, Facts]:
        """(arrays, facts) of the checkpoint at ``path``; no MPI. Raises FileNotFoundError,
        ValueError (an untrustworthy file, named) or ImportError (the format's package is
        missing: the message names the extra), each message starting with ``what``."""
        raise NotImplementedError

    def lookup(self, path: str, name: str, what: str) -> Optional[Dict[str, Any]]:
        """The description of ``name``, which :meth:`describe` did not list, where the
        format's library resolves it to an array (HDF5: a path through a group reached by
        a second link), else None (the default)."""
        return None

    def replaceable(self, path: str) -> bool:
        """May a save of this format replace what is at ``path`` (it exists)?"""
        raise NotImplementedError

    def check_save(self, items: Items) -> None:
        """Before any communication: what this format cannot store (names, dtypes) or needs
        (a package) raises, naming the array."""

    def save(
        self,
        comm: Any,
        path: str,
        items: Items,
        meta_json: str,
        sync: bool,
        compression: Optional[str],
    ) -> None:
        """Write the checkpoint; collective over ``comm``. Every rank has passed the same
        arguments (checked before)."""
        raise NotImplementedError

    def check_arrays(self, path: str, arrays: Arrays, missing_as_fill: bool = False) -> Arrays:
        """Rank 0, before a load reads: check the named arrays' files and complete their
        descriptions (the default: as described). ``missing_as_fill``: ``load``'s option
        (a Zarr shard missing from pyshard's own checkpoint reads as the fill value)."""
        return arrays

    def verify(self, comm: Any, path: str, arrays: Arrays) -> None:
        """Collective: check the stored checksums of ``arrays`` and raise the same ValueError
        on every rank where one differs (the default: a format without checksums)."""

    def read_block(
        self, name: str, e: Dict[str, Any], d: int, r0: int, r1: int, dtype: np.dtype
    ) -> np.ndarray:
        """Indices ``r0:r1`` of dim ``d`` of array ``name`` (described by ``e``) as ``dtype``;
        a 0-d array: its value. For arrays of a kind other than ``"raw"`` and ``"fill"``."""
        raise NotImplementedError(f"{self.name}: array {name!r} of kind {e.get('kind')!r}")
