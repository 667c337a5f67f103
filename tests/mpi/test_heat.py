"""The heat example's engine (pyshard.apps.heat) on halo exchanges equals the serial numpy
run bit for bit: 2-D and 3-D, star and box stencils, periodic and fixed boundaries,
blocking and overlapped steps."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import pyshard as ps
from pyshard.apps.heat import initial, run, serial

pytestmark = [pytest.mark.mpi, pytest.mark.numerics]  # numerics: not rerun per MPI library


@pytest.mark.parametrize("dim", [2, 3])
@pytest.mark.parametrize("stencil", ["star", "box"])
@pytest.mark.parametrize("periodic", [False, True])
def test_bitwise_equal_to_serial(comm, dim, stencil, periodic):
    mesh = ps.Mesh(comm, MPI.Compute_dims(comm.size, dim))
    shape = (11, 9) if dim == 2 else (7, 6, 5)
    u0 = initial(shape)
    ref = serial(u0, 6, stencil, periodic, boundary=1.5)
    for overlap in (False, True):
        u, _ = run(mesh, shape, 6, stencil, periodic, overlap, boundary=1.5, u0=u0)
        np.testing.assert_array_equal(u.local, ref[u.box])
    assert not np.array_equal(ref, u0)  # the steps did something
    mesh.free()


def test_one_mesh_dim_shards_a_3d_grid(comm):
    mesh = ps.Mesh(comm, (comm.size,))
    u0 = initial((2 * comm.size + 1, 4, 3))
    u, _ = run(mesh, u0.shape, 4, "box", True, True, u0=u0)
    np.testing.assert_array_equal(u.full(), serial(u0, 4, "box", True))
    mesh.free()


def test_u0_of_another_shape_raises(comm):
    """``u0`` of another shape than ``shape``: a ValueError naming both (it ran on u0's)."""
    mesh = ps.Mesh(comm, (comm.size,))
    with pytest.raises(ValueError, match=r"\(6, 5\).*\(8, 8\)"):
        run(mesh, (8, 8), 2, u0=initial((6, 5)))
    mesh.free()


def _load_example():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / "heat.py"
    spec = importlib.util.spec_from_file_location("heat_example", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("boundary", ["nan", "inf"])
def test_example_non_finite_boundary_still_equals_serial(comm, capsys, boundary):
    """NaNs in the same cells on both sides are equal (np.array_equal's equal_nan)."""
    with np.errstate(invalid="ignore"):
        assert _load_example().main(["--n", "6", "--steps", "2", "--boundary", boundary]) == 0
    assert comm.rank != 0 or "bit for bit: True" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["--n", "0"], ["--n", "-4"], ["--steps", "-3"],
                                  ["--mesh", "abc"], ["--mesh", "2,2"],
                                  ["--mesh", "1x1x1"], ["--mesh", "3x5"]])
def test_example_bad_options_are_argparse_errors(comm, capsys, argv):
    with pytest.raises(SystemExit) as e:
        _load_example().main(["--n", "6", "--steps", "1", *argv])
    assert e.value.code == 2
    assert argv[0] in capsys.readouterr().err
