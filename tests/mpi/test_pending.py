"""Redistributes in flight: ``redistribute(..., wait=False)`` returns a Pending whose
``wait()`` gives the same result as the blocking call (against the numpy oracle); several in
flight at once, started in the same order and waited in any order, with blocking calls and
halo updates in between; multi-step plans; both exchange algorithms; forced staging. And
``test()``: on a Pending and on a HaloArray's update and fold (every method), a loop
``while not h.test()`` ends, the result is there when it returns True (against the oracle),
and ``wait()`` then returns it without communicating."""

from __future__ import annotations

import time

import numpy as np
import pytest
from oracle import make_global
from test_halo import HALO_MPI, check_halo, counted, padded_with_fill
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


def test_dropped_handles_completed_by_free(comm):
    """Handles dropped without wait() (on the MPI path; a node-shared start also stays in
    the list): Mesh.free() completes them (they stayed in mesh.pending with their buffers
    and requests after free(), for good); a handle kept completes and gives its result."""
    mesh = ps.Mesh(comm, (comm.size,))
    g = make_global((2 * comm.size + 1, comm.size + 2), "float64", seed=4)
    x = ps.distribute(g, mesh, [S0])
    kept = x.redistribute([S1], algorithm="p2p", wait=False)
    for _ in range(5):
        x.redistribute([S1], algorithm="p2p", wait=False)  # dropped
    assert len(mesh.pending) == (6 if comm.size > 1 else len(mesh.pending))
    mesh.free()
    assert mesh.pending == []
    check(kept.wait(), g)


def test_many_dropped_handles_warn(comm, caplog):
    """PENDING_WARN handles in flight on one mesh (dropped without wait(): each keeps its
    buffers and requests, 21 KB a handle in a review's run, 500 MB after 20,000 calls, and
    nothing said so) log one warning naming wait(); free() completes them all."""
    from pyshard.executor import PENDING_WARN

    mesh = ps.Mesh(comm, (comm.size,))
    g = make_global((2 * comm.size + 1, comm.size + 2), "float64", seed=5)
    x = ps.distribute(g, mesh, [S0])
    with caplog.at_level("WARNING", logger="pyshard"):
        for _ in range(PENDING_WARN + 5):
            x.redistribute([S1], algorithm="p2p", wait=False)  # dropped
    said = [r for r in caplog.records if "in flight" in r.getMessage()]
    if comm.size > 1:  # (one rank: nothing stays in flight)
        assert len(mesh.pending) == PENDING_WARN + 5
        assert len(said) == 1 and "wait for every handle" in said[0].getMessage(), said
    else:
        assert not said
    mesh.free()
    assert mesh.pending == []


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


# ----------------------------------------------------------------------------- test()


def spin(handle, seconds=60.0):
    """``while not handle.test(): compute()``: the loop must end (within ``seconds``)."""
    deadline = time.monotonic() + seconds
    work = 0.0
    while not handle.test():
        work += float(np.sum(np.arange(100.0)))  # the caller's compute
        assert time.monotonic() < deadline, "test() never completed the operation"
    assert handle.test() is True  # and stays True


@pytest.mark.parametrize("algorithm", ["alltoallv", "p2p", "auto"])
def test_test_completes_a_redistribute(comm, algorithm):
    """test() completes the redistribute (its one collective counted by then), wait() then
    returns the result without communicating, and both keep returning the same."""
    mesh = ps.Mesh(comm, (comm.size,))
    g = make_global((3 * comm.size + 2, 2 * comm.size + 1), "float64")
    x = ps.distribute(g, mesh, [S0])
    before = ps.comm_stats()
    p = x.redistribute([S1], algorithm=algorithm, wait=False)
    spin(p)
    done = counts_since(before)
    if comm.size > 1:
        assert sum(done.values()) == 1, done
    y = p.wait()
    assert counts_since(before) == done  # wait() after test(): no communication
    check(y, g)
    assert p.test() is True and p.wait() is y
    mesh.free()


@pytest.mark.parametrize("algorithm", ["alltoallv", "p2p"])
def test_test_does_not_block(comm, algorithm):
    """test() never waits for the peers: rank 0 starts the transpose while the last rank has
    not (it waits for rank 0's word, at most 20 s), so rank 0's first test() is False (no
    message from the last rank can have arrived); then it lets the last rank start, and its
    loop of test() ends with the result."""
    if comm.size < 2:
        pytest.skip("needs a peer")
    mesh = ps.Mesh(comm, (comm.size,))
    g = make_global((3 * comm.size + 1, 2 * comm.size + 3), "float64")
    x = ps.distribute(g, mesh, [S0])
    last = comm.size - 1
    first = None
    if comm.rank == last:
        req = comm.irecv(source=0, tag=77)
        deadline = time.monotonic() + 20.0
        while not req.Test() and time.monotonic() < deadline:
            time.sleep(0.001)
        if time.monotonic() >= deadline:
            req.Cancel()
    p = x.redistribute([S1], algorithm=algorithm, wait=False)
    if comm.rank == 0:
        first = p.test()
        comm.send(None, dest=last, tag=77)
    spin(p)
    check(p.wait(), g)
    ok = comm.bcast(first is False, root=0)
    assert ok, "test() waited for a rank that had not started (it must not block)"
    mesh.free()


def test_test_with_several_in_flight(comm):
    """test() on the last one started completes those started before it too (in start
    order, as wait() does); each then waits at once."""
    mesh = ps.Mesh(comm, (comm.size,))
    gs = [make_global((2 * comm.size + k, comm.size + 3), "int32", seed=k) for k in range(3)]
    xs = [ps.distribute(g, mesh, [S0]) for g in gs]
    pending = [x.redistribute([S1], algorithm=a, wait=False)
               for x, a in zip(xs, ("alltoallv", "p2p", "alltoallv"))]
    spin(pending[2])
    before = ps.comm_stats()
    for k in (1, 0, 2):
        assert pending[k].test() is True
        check(pending[k].wait(), gs[k])
    assert counts_since(before) == {}
    mesh.free()


def test_test_of_a_plan_that_ran_when_started(comm):
    """A gather runs whole when it starts: test() is True at once, with no communication."""
    mesh = ps.Mesh(comm, (comm.size,))
    g = make_global((comm.size + 2, 3), "float64")
    x = ps.distribute(g, mesh, [S0])
    p = x.redistribute([R], wait=False)
    before = ps.comm_stats()
    assert p.test() is True
    assert counts_since(before) == {}
    check(p.wait(), g)
    mesh.free()


@pytest.mark.usefixtures("staged")
def test_test_staged(comm):
    mesh = ps.Mesh(comm, (comm.size,))
    g = make_global((2 * comm.size + 1, comm.size + 2), "complex128")
    x = ps.distribute(g, mesh, [S0])
    for algorithm in ("alltoallv", "p2p"):
        p = x.redistribute([S1], algorithm=algorithm, wait=False)
        spin(p)
        check(p.wait(), g)
    mesh.free()


# ----------------------------------------------------------------------------- HaloArray.test()

HALO_METHODS = [*HALO_MPI, "shm", "auto"]


@pytest.mark.parametrize("method", HALO_METHODS)
def test_halo_test_completes_an_update(comm, method):
    """start(), then test() until True: the ghost cells are filled (against the oracle)
    before wait(), which then returns at once without communicating."""
    mesh = ps.Mesh(comm, (comm.size,))
    g = make_global((3 * comm.size + 1, 5), "float64", seed=4)
    x = ps.distribute(g, mesh, [S0])
    h = x.with_halo(1, periodic=(True, False), method=method)
    for k in range(2):  # the second exchange after the owners changed their interiors
        padded_with_fill(h)
        before = ps.comm_stats()
        h.start()
        spin(h)
        check_halo(g + k, x, h, f"update {k} by test()")
        done = counts_since(before)
        assert done == {counted(h): 1}, done
        h.wait()
        assert counts_since(before) == done  # wait() after test(): no communication
        assert h.test() is True
        h.interior[...] += 1
    with pytest.raises(RuntimeError, match="no exchange in flight"):
        h.wait()  # the exchange test() completed was waited for already
    mesh.free()


def test_halo_test_without_an_exchange(comm):
    """test() with nothing in flight is True (as MPI_Test on an inactive request); wait()
    still says nothing was started; a new exchange may start after test() completed one."""
    mesh = ps.Mesh(comm, (comm.size,))
    g = make_global((2 * comm.size + 1, 4), "float32", seed=5)
    x = ps.distribute(g, mesh, [S0])
    h = x.with_halo(1, periodic=True)
    assert h.test() is True
    with pytest.raises(RuntimeError, match="no exchange in flight"):
        h.wait()
    h.start()
    spin(h)  # test() never blocks on the MPI methods: True once the messages are in
    h.start()  # completed by test(): no wait() needed before the next start
    h.wait()
    padded_with_fill(h)
    h.start()
    spin(h)
    h.update()  # a blocking update after test(): wait() has nothing left to return
    check_halo(g, x, h, "update after test()")
    with pytest.raises(RuntimeError, match="no exchange in flight"):
        h.wait()
    mesh.free()


def fold_reference(g, boxes, seed_rows):
    """``g`` after every rank's ghost rows (width 1 on dim 0, periodic) fold into their
    owners with op sum: rank q's top ghost row (global row lo - 1) holds ``seed_rows(q)[0]``,
    its bottom one (global row hi) ``seed_rows(q)[1]``."""
    out = g.copy()
    n = g.shape[0]
    for q, (lo, hi) in enumerate(boxes):
        top, bottom = seed_rows(q)
        out[(lo - 1) % n] += top
        out[hi % n] += bottom
    return out


@pytest.mark.parametrize("method", HALO_METHODS)
def test_halo_test_completes_a_fold(comm, method):
    """start_fold(), then test() until True: the ghost rows are summed into their owners'
    rows (against a numpy reference) before wait(), which then returns at once."""
    mesh = ps.Mesh(comm, (comm.size,))
    g = make_global((3 * comm.size + 1, 4), "float64", seed=6)
    x = ps.distribute(g, mesh, [S0])
    h = x.with_halo((1, 0), periodic=True, method=method)
    boxes = [x.layout.interval(0, (q,)) for q in range(comm.size)]

    def seed_rows(q):
        col = np.arange(4.0)
        return 10.0 * (q + 1) + col, 1000.0 * (q + 1) + col

    top, bottom = seed_rows(mesh.rank)
    h.padded[0], h.padded[-1] = top, bottom
    want = fold_reference(g, boxes, seed_rows)
    before = ps.comm_stats()
    h.start_fold("sum")
    spin(h)
    np.testing.assert_array_equal(h.interior, want[x.box])
    done = counts_since(before)
    assert done == {counted(h, fold=True): 1}, done
    h.wait()
    assert counts_since(before) == done
    np.testing.assert_array_equal(h.interior, want[x.box])
    mesh.free()
