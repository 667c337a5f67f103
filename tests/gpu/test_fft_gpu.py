"""pyshard.fft on cupy arrays (cupyx.scipy.fft for the local transforms) against numpy.fft /
scipy.fft on the host; results stay on the device. Skipped without a GPU."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.fft as sf
from gpu_helpers import skip_reason
from oracle import make_global

import pyshard as ps
from pyshard import Replicate, Shard
from pyshard import fft as pf

if skip_reason():
    pytest.skip(skip_reason(), allow_module_level=True)
cp = pytest.importorskip("cupy")

pytestmark = pytest.mark.mpi


def check(y, ref, tol):
    assert isinstance(y.local, cp.ndarray)
    got = cp.asnumpy(y.local)
    scale = max(float(np.max(np.abs(ref))), 1.0)
    err = float(np.max(np.abs(got - ref[y.box]))) if got.size else 0.0
    assert err <= tol * scale, err


@pytest.mark.parametrize("dtype", ["complex128", "complex64"])
def test_fftn_pencil_and_slab(comm, dtype):
    g = make_global((7, 6, 5), dtype) / 8
    tol = 1e-5 if dtype == "complex64" else 1e-12
    for ms, pl in (((comm.size,), [Shard(0)]), ((1, comm.size), [Replicate(), Shard(1)])):
        mesh = ps.Mesh(comm, ms)
        x = ps.distribute(cp.asarray(g), mesh, pl)
        p = pf.plan(x.layout, "fftn", placements="any")
        y = p.forward(x)
        check(y, np.fft.fftn(g), tol)
        check(p.backward(y), g, tol)
        mesh.free()


def test_rfftn_and_dct(comm):
    g = make_global((6, 7, 5), np.float64)
    mesh = ps.Mesh(comm, (comm.size,))
    x = ps.distribute(cp.asarray(g), mesh, [Shard(1)])
    check(pf.rfftn(x), np.fft.rfftn(g), 1e-12)
    check(pf.irfftn(pf.rfftn(x), s=g.shape), g, 1e-12)
    check(pf.dctn(x, type=2, axes=(0, 1)), sf.dctn(g, type=2, axes=(0, 1)), 1e-12)
    mesh.free()
