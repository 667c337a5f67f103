"""Redistributes in flight: ``redistribute(..., wait=False)`` returns a Pending whose
``wait()`` gives the same result as the blocking call (against the numpy oracle); several in
flight at once, started in the same order and waited in any order, with blocking calls and
halo updates in between; multi-step plans; both exchange algorithms; forced staging."""

from __future__ import annotations

import numpy as np
import pytest
from oracle import make_global
from test_redistribute_nd import MESHES, counts_since
from test_staged import staged  # noqa: F401 - the fixture

import pyshard as ps
from pyshard import Pending, Replicate, Shard

pytestmark = pytest.mark.mpi  # run under mpiexec with --with-mpi (pytest-mpi)

S0, S1, R = Shard(0), Shard(1), Replicate()


def check(y, g):
    np.testing.assert_array_equal(y.local, g[y.box])


@pytest.mark.parametrize("algorithm", ["alltoallv", "p2p", "auto"])
def test_one_in_flight(comm, algorithm):
    mesh = ps.Mesh(comm, (comm.size,))
    g = make_global((3 * comm.size + 2, 2 * comm.size + 1), "float64")
    x = ps.distribute(g, mesh, [S0])
    before = ps.comm_stats()
    p = x.redistribute([S1], algorithm=algorithm, wait=False)
    assert isinstance(p, Pending)
    y = p.wait()
    check(y, g)
    assert y.placements == (S1,)
    if comm.size > 1:
        assert sum(counts_since(before).values()) == 1
    assert p.wait() is y  # waiting again returns the same result
    mesh.free()


def test_many_in_flight_waited_in_any_order(comm):
    mesh = ps.Mesh(comm, (comm.size,))
    gs = [make_global((2 * comm.size + k, comm.size + 3), "float32", seed=k) for k in range(3)]
    xs = [ps.distribute(g, mesh, [S0]) for g in gs]
    sizes = {0: tuple([0] * (comm.size - 1) + [gs[2].shape[0]])}  # everything on the last rank
    pending = [
        xs[0].redistribute([S1], wait=False),
        xs[1].redistribute([S1], algorithm="p2p", wait=False),
        xs[2].redistribute([S0], sizes=sizes, wait=False),  # a rebalance
    ]
    # a blocking redistribute and a halo update while they are in flight
    z = xs[0].redistribute([R])
    h = xs[1].with_halo(1, periodic=True)
    h.update()
    check(z, gs[0])
    for k in (2, 0, 1):  # waited in another order than started
        check(pending[k].wait(), gs[k])
    mesh.free()


def test_multi_step_plan_and_out(comm):
    for mshape in MESHES.get(comm.size, [(comm.size,)]):
        if len(mshape) != 2:
            continue
        mesh = ps.Mesh(comm, mshape)
        g = make_global((2 * mshape[0] + 3, 3 * mshape[1] + 1), "int64")
        x = ps.distribute(g, mesh, [S0, S1])
        for target in ([S1, S0], [R, S0], [S1, R]):
            p = x.plan_to(target)
            pend = x.redistribute(target, wait=False)
            check(pend.wait(), g)
            out = np.empty(p.dst.local_shape(mesh.coords), g.dtype)
            y = x.redistribute(target, out=out, wait=False).wait()
            assert y.local is out
            check(y, g)
        mesh.free()


def test_plan_that_cannot_fly_still_works(comm):
    mesh = ps.Mesh(comm, (comm.size,))
    g = make_global((comm.size + 2, 3), "float64")
    x = ps.distribute(g, mesh, [S0])
    check(x.redistribute([R], wait=False).wait(), g)  # an Allgatherv: runs when started
    check(x.redistribute([S0], wait=False).wait(), g)  # nothing to do
    mesh.free()


@pytest.mark.usefixtures("staged")
def test_staged(comm):
    mesh = ps.Mesh(comm, (comm.size,))
    g = make_global((2 * comm.size + 1, comm.size + 2), "complex128")
    x = ps.distribute(g, mesh, [S0])
    for algorithm in ("alltoallv", "p2p"):
        before = ps.comm_stats()
        a = x.redistribute([S1], algorithm=algorithm, wait=False)
        b = x.redistribute([S1], algorithm=algorithm, wait=False)
        check(b.wait(), g)
        check(a.wait(), g)
        got = counts_since(before)
        if comm.size > 1:
            assert got.get("staged") == 2, got
    mesh.free()
