"""Import-time checks: the core and mpi4py must use the same MPI library; the public API is
``pyshard.__all__``, what docs/site/api.rst documents, and the advanced names stay importable
outside it."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

import pyshard
from pyshard import _core, _mpi


def test_same_mpi_passes():
    """The check ``import pyshard`` runs, on the core's own library version and path."""
    _mpi.check_same_mpi(_core.library_version(), _core.library_path())
    assert _core.library_version().splitlines()[0]
    assert "libmpi" in _core.library_path()


def test_mismatched_mpi_is_a_clear_import_error():
    with pytest.raises(ImportError, match="different MPI libraries") as e:
        _mpi.check_same_mpi("Open MPI v5.0.0, package: Open MPI", _core.library_path())
    assert "Open MPI" in str(e.value) and "mpi4py" in str(e.value)


def test_public_namespace():
    for name in pyshard.__all__:
        assert getattr(pyshard, name).__doc__, f"{name} has no docstring"


API_RST = Path(__file__).resolve().parents[1] / "docs" / "site" / "api.rst"
ADVANCED = ("Step", "StepKind", "route")  # importable from pyshard, outside __all__


def api_sections():
    """docs/site/api.rst split at its "Advanced" section: (the public part, the advanced)."""
    public, sep, advanced = API_RST.read_text().partition("\nAdvanced\n--------\n")
    assert sep, f"{API_RST} has no Advanced section"
    return public, advanced


def test_all_is_what_the_api_page_documents():
    """The public part of api.rst documents exactly pyshard.__all__ (docs/site/conf.py's check,
    run here without Sphinx); the internals are outside __all__."""
    public, _ = api_sections()
    documented = set(re.findall(r"^\.\. auto(?!module)\w+:: pyshard\.(\w+)", public, flags=re.M))
    assert documented == set(pyshard.__all__)
    assert len(pyshard.__all__) == len(set(pyshard.__all__))
    assert not set(ADVANCED) & set(pyshard.__all__)


def test_advanced_names_stay_importable_and_documented():
    _, advanced = api_sections()
    for name in ADVANCED:
        assert getattr(pyshard, name).__doc__, name
    assert pyshard.route is sys.modules["pyshard.route"]
    blocks = re.split(r"^\.\. currentmodule:: ", advanced, flags=re.M)[1:]
    entries = {
        (block.split()[0], name)
        for block in blocks
        for name in re.findall(r"^\.\. auto\w+:: (\w+)$", block, flags=re.M)
    }
    assert {("pyshard", "Step"), ("pyshard", "StepKind"), ("pyshard.route", "route")} <= entries
    for module, name in entries:
        assert getattr(sys.modules[module], name).__doc__, f"{module}.{name}"
    namespace: dict = {}
    exec("from pyshard import *", namespace)
    assert not set(ADVANCED) & set(namespace)


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


LIBRARY_TEXTS = [
    ("MPICH Version:      5.0.2\nMPICH Release date: Fri Sep 25 2026\n", "MPICH 5.0.2"),
    ("Open MPI v5.0.11, package: Open MPI user@localhost Distribution, ident: 5.0.11, "
     "repo rev: v5.0.11rc1, Sep 16, 2026\x00", "Open MPI 5.0.11"),
    ("Open MPI v4.1.4, package: Debian OpenMPI, ident: 4.1.4, repo rev: v4.1.4, May 26, "
     "2022\x00", "Open MPI 4.1.4"),
    ("Intel(R) MPI Library 2021.18.1 for Linux* OS\n", "Intel MPI 2021.18.1"),
    ("MPI VERSION    : CRAY MPICH version 8.1.28.2 (ANL base 3.4a2)\nMPI BUILD INFO : x",
     "Cray MPICH 8.1.28.2"),
    ("MVAPICH2 Version      :\t2.3.7\nMVAPICH2 Release date :\tWed March 02 2022",
     "MVAPICH2 2.3.7"),
    ("Some MPI 1.0\nmore", "Some MPI 1.0"),
]  # fmt: skip


@pytest.mark.parametrize("text,name", LIBRARY_TEXTS)
def test_library_name(text, name):
    assert _mpi.library_name(text) == name
    assert "\0" not in _mpi.clean(text)


def test_build_info_names_the_library():
    info = pyshard.build_info()
    assert "\0" not in info["mpi_library"] + info["mpi_library_version"]
    assert info["mpi_library"] == _mpi.library_name(_core.library_version())
    assert info["mpi_library"].split()[0] in ("MPICH", "Open", "Intel", "Cray", "MVAPICH2")
    major, minor = info["mpi_standard"].split(".")
    assert int(major) >= 3
    assert (int(major), int(minor)) == MPI.Get_version()  # the library's own answer
    assert info["large_count"] == ("native" if _core.large_count else "datatype")
    assert info["large_count_reduce"] == ("native" if _core.large_count else "split")
    assert info["mpi"] == _core.built_with and "MPICH 3.4a2" not in info["mpi"]


def test_the_core_says_what_it_was_built_with():
    path, built = _mpi.core_build_record()
    assert path and path.endswith(".so")
    assert built.startswith(_core.built_with + "; mpicc "), built


def test_import_failures_name_both_mpis_and_the_fix(monkeypatch):
    monkeypatch.setattr(_mpi, "mpi4py_library", lambda: "MPICH 5.0.2")
    built = _core.built_with
    err = ImportError("_core.so: undefined symbol: _ZN3MPI8Datatype4FreeEv")
    msg = _mpi.core_import_error(err)
    assert built in msg and "mpi4py loaded MPICH 5.0.2" in msg and "OMPI_SKIP_MPICXX" in msg
    msg = _mpi.core_import_error(ImportError("libmpi.so.40: cannot open shared object file"))
    assert "not on the library path" in msg and "module load" in msg
    monkeypatch.setattr(_mpi, "core_build_record", lambda: ("/x/_core.so", "Open MPI 4.1.4; m"))
    msg = _mpi.core_import_error(ImportError("undefined symbol: ompi_mpi_comm_world"))
    assert "rebuild pyshard against MPICH 5.0.2" in msg and "--no-binary=mpi4py" in msg
    monkeypatch.setattr(_mpi, "core_build_record", lambda: (None, ""))
    msg = _mpi.core_import_error(ImportError("No module named 'pyshard._core'"))
    assert "not built for this Python" in msg and "scripts/setup.sh" in msg
    assert "pip install mpich" not in msg


def shadowed(package) -> list:
    """Names of ``package`` whose attribute is not the submodule of the same name (a function
    or class hiding ``package/<name>.py``: ``import package.<name>`` then gives one object and
    ``package.<name>`` another)."""
    import pkgutil
    import types

    out = []
    for info in pkgutil.iter_modules(package.__path__):
        value = getattr(package, info.name, None)
        if value is not None and not isinstance(value, types.ModuleType):
            out.append(info.name)
    return sorted(out)


def test_no_function_shadows_a_submodule():
    import importlib

    for name in ("pyshard", "pyshard.fft", "pyshard.checkpoint"):
        assert shadowed(importlib.import_module(name)) == [], name


def test_the_shadow_check_fails_where_it_should(tmp_path, monkeypatch):
    pkg = tmp_path / "shadowpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from .plan import plan\nfrom . import other\n")
    (pkg / "plan.py").write_text("def plan():\n    pass\n")
    (pkg / "other.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib

    assert shadowed(importlib.import_module("shadowpkg")) == ["plan"]


def test_redistribute_overloads_type_the_result_by_wait():
    """``x.redistribute(...)`` types as ShardedArray, ``wait=False`` as Pending (mypy)."""
    import typing

    from pyshard.array import ShardedArray

    hints = [typing.get_type_hints(f)["return"]
             for f in typing.get_overloads(ShardedArray.redistribute)]
    assert hints[:2] == [ShardedArray, pyshard.Pending]
