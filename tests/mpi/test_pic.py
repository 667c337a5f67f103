"""examples/pic.py (cloud-in-cell charge deposition, then a halo fold) at small sizes: the
total charge is conserved to round-off and the grid equals the serial numpy deposit of the
same particles within 1e-12 relative (another summation order), blocking and overlapped
(the interior deposit runs while the fold is in flight), 2-D and 3-D, every method."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

import pyshard as ps

pytestmark = [pytest.mark.mpi, pytest.mark.numerics]  # numerics: not rerun per MPI library

_spec = importlib.util.spec_from_file_location(
    "pic_example", Path(__file__).resolve().parents[2] / "examples" / "pic.py"
)
pic = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pic)

TOL = 1e-12  # relative to the largest cell charge


@pytest.mark.parametrize("dim,n", [(2, 9), (3, 5)])
@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("method", ["persistent", "neighbor", "datatype"])
def test_deposit_equals_serial_and_conserves_charge(comm, dim, n, overlap, method):
    mesh = ps.Mesh(comm, MPI.Compute_dims(comm.size, dim))
    count = 400
    rho, _ = pic.run(mesh, n, dim, count, overlap=overlap, seed=4, method=method)
    x, q = pic.particles(n, dim, count, 4)
    total = comm.allreduce(float(rho.local.sum()))
    assert abs(total - q.sum()) <= 1e-12 * q.sum()
    ref = pic.serial(n, dim, x, q)
    np.testing.assert_allclose(rho.local, ref[rho.box], rtol=0, atol=TOL * ref.max())
    mesh.free()


def test_overlapped_equals_blocking(comm):
    mesh = ps.Mesh(comm, MPI.Compute_dims(comm.size, 2))
    a, _ = pic.run(mesh, 10, 2, 300, overlap=False, seed=1)
    b, _ = pic.run(mesh, 10, 2, 300, overlap=True, seed=1)
    np.testing.assert_allclose(a.local, b.local, rtol=0, atol=TOL * max(a.local.max(), 1))
    mesh.free()


def test_main_checks(comm):
    assert pic.main(["--n", "8", "--dim", "2", "--particles", "200", "--overlap"]) == 0
