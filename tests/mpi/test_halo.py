"""Halo updates under MPI against the oracle of the halo semantics (tests/mpi/oracle.py):
every rank's padded array after ``update()`` (or ``start()``/``wait()``) must equal the
global array's values at its ghost cells, the user's values where nothing is written, and
its own interior untouched; on 1-D to 3-D meshes, uneven, empty, nested and replicated
shards, box and star stencils, periodic or not, both methods, host and forced staging."""

from __future__ import annotations

import numpy as np
import pytest
from oracle import ML_DTYPES, halo_expected, make_global
from test_redistribute_nd import MESHES, counts_since
from test_staged import staged  # noqa: F401 - the fixture

import pyshard as ps
from pyshard import Partial, Replicate, Shard

pytestmark = pytest.mark.mpi  # run under mpiexec with --with-mpi (pytest-mpi)

S0, S1, S2, R = Shard(0), Shard(1), Shard(2), Replicate()
FILL = 77


def padded_with_fill(h):
    inner = h.interior.copy()
    h.padded[...] = FILL
    h.interior[...] = inner


def check_halo(g, x, h, what=""):
    box = x.layout.box(x.mesh.coords)
    want = halo_expected(
        g, [b.start for b in box], [b.stop for b in box], h.width, h.periodic, h.corners,
        FILL,
    )
    np.testing.assert_array_equal(h.padded, want, err_msg=f"{what} rank {x.mesh.rank}")


def cases(size):
    """(global shape, mesh shape, placements, sizes) for this communicator size."""
    out = [((13,), (size,), [S0], None), ((5, 2 * size + 1), (size,), [S1], None)]
    # uneven with empty shards: everything on the first and last rank
    sizes = [0] * size
    sizes[0], sizes[-1] = 3, 4 if size > 1 else 0
    sizes[0] = 7 - sizes[-1]
    out.append(((7, 3), (size,), [S0], {0: tuple(sizes)}))
    for mesh in MESHES.get(size, []):
        if len(mesh) == 2:
            out.append(((2 * mesh[0] + 3, 3 * mesh[1] + 1), mesh, [S0, S1], None))
            out.append(((9, 4), mesh, [S0, S0], None))  # nested
            out.append(((6, 5), mesh, [R, S1], None))  # a replicated mesh dim
        else:
            out.append(((5, 4, 6), mesh, [S0, S1, S2], None))
    return out


@pytest.mark.parametrize("method", ["persistent", "p2p", "datatype", "neighbor"])
@pytest.mark.parametrize("corners", [True, False])
def test_update_matches_oracle(comm, method, corners):
    for shape, mshape, placements, sizes in cases(comm.size):
        mesh = ps.Mesh(comm, mshape)
        g = make_global(shape, "float64", seed=len(shape))
        x = ps.distribute(g, mesh, placements, sizes)
        nd = len(shape)
        widths = [1, tuple(min(2, n) for n in shape), tuple(min(n, 3) * (d % 2) for d, n in
                                                             enumerate(shape))]
        for width in widths:
            for periodic in (False, True, tuple(d == 0 for d in range(nd))):
                h = x.with_halo(width, periodic=periodic, corners=corners, method=method)
                padded_with_fill(h)
                before = ps.comm_stats()
                h.update()
                what = f"{shape} {mshape} {placements} w={width} p={periodic}:"
                check_halo(g, x, h, what)
                assert counts_since(before) == {"halo": 1}
                # a second update after the owners changed their interiors: new values
                h.interior[...] += 1
                padded_with_fill(h)
                h.update()
                check_halo(g + 1, x, h, what + " second update")
        mesh.free()


@pytest.mark.parametrize("dtype", ["float16", "int32", "bool", "complex128", "uint8", *ML_DTYPES])
def test_dtypes(comm, dtype):
    mshape = MESHES[comm.size][0] if comm.size in MESHES else (comm.size,)
    mesh = ps.Mesh(comm, mshape)
    shape = tuple(2 * m + 3 for m in mshape)
    g = make_global(shape, dtype)
    x = ps.distribute(g, mesh, [Shard(d) for d in range(len(mshape))])
    h = x.with_halo(2, periodic=True)
    padded_with_fill(h)
    h.update()
    check_halo(g, x, h, dtype)
    mesh.free()


def test_overlap_start_wait(comm):
    mesh = ps.Mesh(comm, (comm.size,))
    g = make_global((4 * comm.size + 1, 6), "float32")
    x = ps.distribute(g, mesh, [S0])
    h = x.with_halo((2, 1), periodic=(True, False))
    padded_with_fill(h)
    h.start()
    # the interior may change while the exchange is in flight: the sends were packed
    saved = h.interior.copy()
    h.interior[...] = -1
    h.wait()
    h.interior[...] = saved
    check_halo(g, x, h, "start/wait")
    with pytest.raises(RuntimeError, match="no exchange in flight"):
        h.wait()
    h.start()
    with pytest.raises(RuntimeError, match="already started"):
        h.start()
    with pytest.raises(RuntimeError, match="in flight"):
        h.update()
    h.wait()
    # two halo arrays in flight at once, started in the same order, waited in reverse
    h2 = ps.distribute(g * 2, mesh, [S0]).with_halo(1, periodic=True)
    padded_with_fill(h)
    padded_with_fill(h2)
    h.start()
    h2.start()
    h2.wait()
    h.wait()
    check_halo(g, x, h, "first of two")
    check_halo(g * 2, x, h2, "second of two")
    mesh.free()


@pytest.mark.usefixtures("staged")
def test_staged_transport(comm):
    for shape, mshape, placements, sizes in cases(comm.size):
        mesh = ps.Mesh(comm, mshape)
        g = make_global(shape, "int64")
        x = ps.distribute(g, mesh, placements, sizes)
        for method in ("persistent", "p2p", "neighbor"):
            h = x.with_halo(1, periodic=True, method=method)
            padded_with_fill(h)
            before = ps.comm_stats()
            h.start()
            h.wait()
            check_halo(g, x, h, f"staged {method}")
            assert counts_since(before) == {"halo": 1, "staged": 1}
        mesh.free()


def test_array_view_redistributes_and_saves(comm, tmp_path_factory):
    mesh = ps.Mesh(comm, (comm.size,))
    g = make_global((3 * comm.size + 2, 5), "float64")
    h = ps.distribute(g, mesh, [S0]).with_halo((1, 2))
    assert h.array.local.base is not None  # a view of the padded array, no copy
    np.testing.assert_array_equal(h.array.full(), g)
    y = h.array.redistribute([S1])
    np.testing.assert_array_equal(y.local, g[y.box])
    h.interior[...] *= 3  # the view follows the padded array
    np.testing.assert_array_equal(h.array.full(), 3 * g)
    path = comm.bcast(str(tmp_path_factory.mktemp("halo")) if comm.rank == 0 else None)
    ps.save(path + "/ckpt", {"u": h.array})
    z = ps.load(path + "/ckpt", mesh, {"u": [R]})["u"]
    np.testing.assert_array_equal(z.local, 3 * g)
    mesh.free()


def test_errors_on_every_rank_before_communication(comm):
    mesh = ps.Mesh(comm, (comm.size,))
    x = ps.distribute(make_global((6, 4), "float32"), mesh, [S0])
    before = ps.comm_stats()
    with pytest.raises(ValueError, match="larger than the global extent 4"):
        x.with_halo((1, 5))
    with pytest.raises(ValueError, match=">= 0"):
        x.with_halo(-1)
    p = ps.Layout((6, 4), "float32", (comm.size,), [Partial("sum")])
    xp = ps.ShardedArray(np.zeros(p.local_shape(mesh.coords), np.float32), p, mesh)
    with pytest.raises(ValueError, match="Partial"):
        xp.with_halo(1)
    with pytest.raises(ValueError, match="method must be one of"):
        x.with_halo(1, method="carrier-pigeon")
    assert counts_since(before) == {}
    mesh.free()


def test_explain_matches_what_moves(comm):
    mesh = ps.Mesh(comm, (comm.size,))
    x = ps.distribute(make_global((4 * comm.size, 3), "float64"), mesh, [S0])
    h = x.with_halo((1, 0), periodic=True)
    text = h.explain()
    n = 1 if comm.size > 2 else comm.size - 1
    assert f"receives {2 if comm.size > 1 else 0} message(s)" in text or n == 1
    assert "persistent point-to-point" in text
    assert h.plan.recv_bytes == (2 * 3 * 8 if comm.size > 1 else 0)
    mesh.free()


def test_zero_d_and_width_of_the_whole_extent(comm):
    mesh = ps.Mesh(comm, (comm.size,))
    x = ps.distribute(np.array(3.5), mesh, [R])
    h = x.with_halo(0)
    h.update()
    assert h.padded.shape == () and h.interior.shape == () and h.array.full() == 3.5
    g = np.arange(5.0)
    x = ps.distribute(g, mesh, [S0])
    h = x.with_halo(5, periodic=True)  # every ghost cell wraps, from up to every rank
    padded_with_fill(h)
    h.update()
    check_halo(g, x, h, "width 5 of 5")
    mesh.free()


def test_method_tune_measures_and_agrees(comm):
    mesh = ps.Mesh(comm, (comm.size,))
    g = make_global((4 * comm.size + 3, 7), "float64")
    x = ps.distribute(g, mesh, [S0])
    h = x.with_halo(2, periodic=True, method="tune")
    assert "tune" in h.explain() and h.chosen is None
    padded_with_fill(h)
    h.update()
    check_halo(g, x, h, "tuned")
    assert h.chosen in ("persistent", "p2p", "datatype", "neighbor")
    assert len(set(comm.allgather(h.chosen))) == 1  # one choice on every rank
    assert "chosen by measurement" in h.explain()
    mesh.free()
