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
