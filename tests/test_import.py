"""Import-time checks: the core and mpi4py must use the same MPI library."""

from __future__ import annotations

import numpy as np
import pytest

import pyshard
from pyshard import _core


def test_same_mpi_passes():
    pyshard._check_same_mpi()
    assert _core.library_version().splitlines()[0]
    assert "libmpi" in _core.library_path()


def test_mismatched_mpi_is_a_clear_import_error(monkeypatch):
    monkeypatch.setattr(
        pyshard._core, "library_version", lambda: "Open MPI v5.0.0, package: Open MPI"
    )
    with pytest.raises(ImportError, match="different MPI libraries") as e:
        pyshard._check_same_mpi()
    assert "Open MPI" in str(e.value) and "mpi4py" in str(e.value)


def test_public_namespace():
    for name in pyshard.__all__:
        assert getattr(pyshard, name).__doc__, f"{name} has no docstring"


def test_copy_box_kernel():
    """The core's strided box copy against numpy slicing, contiguous and not."""
    a = np.arange(5 * 6 * 7, dtype=np.int16).reshape(5, 6, 7)
    cases = [
        ((0, 0, 0), (5, 6, 7)),
        ((1, 2, 3), (2, 3, 4)),
        ((4, 0, 0), (1, 6, 7)),
        ((0, 5, 0), (5, 1, 7)),
        ((2, 1, 6), (3, 5, 1)),
        ((0, 0, 0), (0, 6, 7)),
    ]
    for start, ext in cases:
        out = np.full((6, 8, 9), -1, np.int16)
        _core.copy_box(a, list(start), out, [1, 2, 0], list(ext))
        ref = np.full_like(out, -1)
        ref[1 : 1 + ext[0], 2 : 2 + ext[1], 0 : ext[2]] = a[
            tuple(slice(s, s + e) for s, e in zip(start, ext))
        ]
        np.testing.assert_array_equal(out, ref)
    with pytest.raises(IndexError):
        _core.copy_box(a, [4, 0, 0], np.empty((2, 6, 7), np.int16), [0, 0, 0], [2, 6, 7])
