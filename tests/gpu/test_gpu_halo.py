"""Halo updates and redistributes in flight of cupy arrays (CUDA pack kernel, staged or
device-direct transport) against the oracles, and the heat example on the GPU bit for bit
equal to the serial numpy run. Skipped without a GPU."""

from __future__ import annotations

import numpy as np
import pytest
from gpu_helpers import counts_since, skip_reason, with_transport
from oracle import halo_expected, make_global
from test_halo import cases

import pyshard as ps

if skip_reason():
    pytest.skip(skip_reason(), allow_module_level=True)
cp = pytest.importorskip("cupy")

pytestmark = pytest.mark.mpi

FILL = 77


@pytest.mark.parametrize("corners", [True, False])
@pytest.mark.parametrize("method", ["persistent", "p2p"])
def test_gpu_halo_matches_oracle(comm, transport, corners, method):
    for shape, mshape, placements, sizes in cases(comm.size):
        mesh = ps.Mesh(comm, mshape)
        g = make_global(shape, "float32")
        x = ps.distribute(cp.asarray(g), mesh, placements, sizes)
        for periodic in (False, True):
            h = x.with_halo(1, periodic=periodic, corners=corners, method=method)
            assert isinstance(h.padded, cp.ndarray)
            inner = h.interior.copy()
            h.padded[...] = FILL
            h.interior[...] = inner
            before = ps.comm_stats()
            h.start()
            h.wait()
            cp.cuda.get_current_stream().synchronize()
            box = x.layout.box(mesh.coords)
            want = halo_expected(g, [b.start for b in box], [b.stop for b in box], h.width,
                                 h.periodic, h.corners, FILL)
            np.testing.assert_array_equal(cp.asnumpy(h.padded), want)
            assert counts_since(before) == with_transport({"halo": 1}, transport)
        mesh.free()


def test_gpu_heat_bitwise(comm, transport):
    from mpi4py import MPI

    from pyshard.apps.heat import initial, run, serial

    mesh = ps.Mesh(comm, MPI.Compute_dims(comm.size, 2))
    u0 = initial((17, 13))
    ref = serial(u0, 5, "box", True)
    for overlap in (False, True):
        u, _ = run(mesh, u0.shape, 5, "box", True, overlap, u0=cp.asarray(u0))
        np.testing.assert_array_equal(cp.asnumpy(u.local), ref[u.box])
    mesh.free()


def test_gpu_redistribute_in_flight(comm, transport):
    mesh = ps.Mesh(comm, (comm.size,))
    g = make_global((3 * comm.size + 1, 2 * comm.size + 3), "float32")
    x = ps.distribute(cp.asarray(g), mesh, [ps.Shard(0)])
    a = x.redistribute([ps.Shard(1)], wait=False)
    b = x.redistribute([ps.Shard(1)], algorithm="p2p", wait=False)
    for p in (b, a):
        y = p.wait()
        assert isinstance(y.local, cp.ndarray)
        np.testing.assert_array_equal(cp.asnumpy(y.local), g[y.box])
    mesh.free()


@pytest.mark.parametrize("method", ["persistent", "neighbor"])
def test_gpu_fold_matches_oracle(comm, transport, method):
    """HaloArray.fold of cupy arrays (pack kernel, then the combine as cupy operations)
    against test_fold.py's serial oracle, bitwise."""
    from test_fold import fold_expected, padded_of

    for shape, mshape, placements, sizes in cases(comm.size):
        mesh = ps.Mesh(comm, mshape)
        for dtype in ("float32", "int64"):
            lay = ps.Layout(shape, dtype, mesh.shape, placements, sizes)
            x = ps.ShardedArray(cp.zeros(lay.local_shape(mesh.coords), dtype), lay, mesh)
            for periodic in (False, True):
                for op in ("sum", "max"):
                    h = x.with_halo(2, periodic=periodic, method=method)

                    def gen(q, h=h, lay=lay, dtype=dtype):
                        return padded_of(lay, h.width, q, dtype, 5)

                    h.padded[...] = cp.asarray(gen(mesh.coords))
                    before = ps.comm_stats()
                    h.start_fold(op)
                    h.wait()
                    cp.cuda.get_current_stream().synchronize()
                    want = fold_expected(lay, h.width, h.periodic, h.corners, mesh.coords, op,
                                         gen)
                    np.testing.assert_array_equal(cp.asnumpy(h.interior), want)
                    assert counts_since(before) == with_transport({"halo_fold": 1}, transport)
        mesh.free()
