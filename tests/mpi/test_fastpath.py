"""The fast path of a repeated redistribute : the second call with the same source
layout, target, algorithm and array type is one lookup and one call of a binding
(pyshard.executor.bind), gives the numpy oracle's result, and never reuses a binding for a
call that differs."""

from __future__ import annotations

import numpy as np
import pytest
from oracle import make_global

import pyshard as ps
from pyshard import Partial, Replicate, Shard
from pyshard import array as psarray

pytestmark = pytest.mark.mpi  # run under mpiexec with --with-mpi (pytest-mpi)


def counts_since(before):
    now = ps.comm_stats()
    return {k: v - before.get(k, 0) for k, v in now.items() if v - before.get(k, 0)}


@pytest.fixture
def no_planning(monkeypatch):
    """Inside ``with no_planning():`` a redistribute that plans or looks up executors fails:
    only the fast path may run."""

    def boom(*args, **kw):
        raise AssertionError("the general path ran on a repeated call")

    class _Ctx:
        def __enter__(self):
            monkeypatch.setattr(psarray, "plan", boom)
            monkeypatch.setattr(psarray, "executors", boom)

        def __exit__(self, *exc):
            monkeypatch.undo()

    return _Ctx


@pytest.fixture(autouse=True)
def _small_blocks_on_mpi():
    """The default threshold whatever the suite's environment (CI runs it once with
    PYSHARD_SHM_MIN_BYTES=0): these small exchanges take MPI and the core binding. (Not
    through monkeypatch: no_planning's undo() would take it back mid-test.)"""
    with ps.config.override(PYSHARD_SHM_MIN_BYTES=None):
        yield


def _binding(x, placements, algorithm="auto"):
    key = (x.layout, *placements, algorithm, type(x.local))
    return x.mesh.cache.fast.get(key)


CASES = [  # (global shape, source, target): exchanges, a gather, a slice, a reduction
    ((64, 64), [Shard(0)], [Shard(1)]),
    ((13, 7), [Shard(1)], [Shard(0)]),
    ((3, 5), [Shard(0)], [Shard(1)]),  # empty shards from 4 ranks on
    ((9, 4), [Shard(0)], [Replicate()]),
    ((9, 4), [Replicate()], [Shard(0)]),
    ((10, 6), [Partial("sum")], [Shard(0)]),
    ((6, 5), [Shard(0)], [Shard(0)]),  # the same layout: no steps
]


@pytest.mark.parametrize("shape,src,dst", CASES)
@pytest.mark.parametrize("dtype", ["float32", "int64", "complex128"])
def test_repeated_calls_match_the_oracle(comm, no_planning, shape, src, dst, dtype):
    mesh = ps.Mesh(comm, (comm.size,))
    g = make_global(shape, dtype)
    x = ps.distribute(g, mesh, src)
    first = x.redistribute(dst)  # plans and binds
    np.testing.assert_array_equal(first.local, g[first.box])
    assert _binding(x, dst) is not None
    with no_planning():
        for _ in range(3):
            y = x.redistribute(dst)
            assert y.layout is first.layout and y.mesh is mesh
            assert y.local.dtype == g.dtype and y.local.flags.c_contiguous
            np.testing.assert_array_equal(y.local, g[y.box])
            out = np.empty_like(first.local)
            z = x.redistribute(dst, out=out)
            assert z.local is out
            np.testing.assert_array_equal(out, g[z.box])
    mesh.free()


@pytest.mark.mpi(min_size=2)  # one rank: no exchange, a plan without collectives
def test_the_core_binding_runs_and_counts(comm, no_planning):
    """A host exchange binds the core step: its counter moves, one collective per call."""
    mesh = ps.Mesh(comm, (comm.size,))
    g = make_global((8 * comm.size, 4 * comm.size), "float32")
    x = ps.distribute(g, mesh, [Shard(0)])
    x.redistribute([Shard(1)])
    bound = _binding(x, [Shard(1)]).binding
    assert bound.kind == "exchange"
    assert bound.calls == 0  # the first call took the general path
    before = ps.comm_stats()
    with no_planning():
        for i in range(1, 4):
            y = x.redistribute([Shard(1)])  # a fresh list each time: equal, not identical
            assert bound.calls == i
    np.testing.assert_array_equal(y.local, g[y.box])
    assert counts_since(before) == {"alltoallv": 3}
    # a gather binds its core step too
    x.redistribute([Replicate()])
    gather = _binding(x, [Replicate()]).binding
    assert gather.kind == "allgatherv"
    with no_planning():
        r = x.redistribute([Replicate()])
    assert gather.calls == 1
    np.testing.assert_array_equal(r.local, g)
    mesh.free()


@pytest.mark.mpi(min_size=2)
def test_no_binding_is_reused_for_another_call(comm):
    mesh = ps.Mesh(comm, (comm.size,))
    g32 = make_global((16, 12), "float32")
    x = ps.distribute(g32, mesh, [Shard(0)])
    y = x.redistribute([Shard(1)])
    x.redistribute([Shard(1)])
    # another dtype, the same shape
    g64 = make_global((16, 12), "float64", seed=1)
    x64 = ps.distribute(g64, mesh, [Shard(0)])
    for _ in range(2):
        y64 = x64.redistribute([Shard(1)])
        assert y64.local.dtype == np.float64
        np.testing.assert_array_equal(y64.local, g64[y64.box])
    # another shape (layout)
    g2 = make_global((17, 12), "float32", seed=2)
    x2 = ps.distribute(g2, mesh, [Shard(0)])
    for _ in range(2):
        y2 = x2.redistribute([Shard(1)])
        np.testing.assert_array_equal(y2.local, g2[y2.box])
    # another target from the same source
    for _ in range(2):
        r = x.redistribute([Replicate()])
        np.testing.assert_array_equal(r.local, g32)
    # another algorithm: its own collective
    for algo in ("p2p", "alltoall", "alltoallv"):
        for _ in range(2):
            before = ps.comm_stats()
            z = x.redistribute([Shard(1)], algorithm=algo)
            assert counts_since(before) == {algo: 1}
            np.testing.assert_array_equal(z.local, g32[z.box])
    # out=: the right buffer is written; a wrong one raises the general path's error
    out = np.empty_like(y.local)
    assert x.redistribute([Shard(1)], out=out).local is out
    np.testing.assert_array_equal(out, g32[y.box])
    bad = [  # (the general path's error, out)
        ("out has shape", np.empty((y.local.shape[0] + 1, y.local.shape[1]), np.float32)),
        ("out has shape", np.empty(y.local.shape, np.float64)),
        ("writable", np.empty_like(y.local)),
    ]
    bad[-1][1].flags.writeable = False
    for match, b in bad:
        with pytest.raises(ValueError, match=match):
            x.redistribute([Shard(1)], out=b)
    # the failed calls left nothing behind: the binding still gives the oracle
    np.testing.assert_array_equal(x.redistribute([Shard(1)]).local, g32[y.box])
    mesh.free()


@pytest.mark.parametrize("wait", [True, False])
def test_a_strided_out_gets_the_result(comm, wait):
    """out= that is not C-contiguous (Fortran-ordered, every other column of a wider array)
    gets the result copied in, on every rank. It was refused on the ranks whose buffer was
    strided, while a rank whose one-column Fortran buffer counts as C-contiguous went into
    the exchange and waited for ever (11 x 6 over 4 ranks: shards 2, 2, 1, 1 wide)."""
    mesh = ps.Mesh(comm, (comm.size,))
    g = make_global((11, 6), "float64")
    x = ps.distribute(g, mesh, [Shard(0)])
    ref = x.redistribute([Shard(1)])
    shape = ref.local.shape
    for _ in range(2):  # the general path, then the fast path's binding (which declines)
        for out in (np.asfortranarray(np.zeros(shape)),
                    np.zeros((shape[0], 2 * shape[1]))[:, ::2]):
            r = x.redistribute([Shard(1)], out=out, wait=wait)
            y = r if wait else r.wait()
            assert y.local is out
            np.testing.assert_array_equal(out, g[ref.box])
    mesh.free()


def test_out_overlapping_the_source_raises(comm):
    """A square shard that is both source and out: refused before any communication."""
    mesh = ps.Mesh(comm, (comm.size,))
    n = 4 * comm.size
    g = make_global((n, n), "float32")
    x = ps.distribute(g, mesh, [Replicate()])
    x.redistribute([Replicate()])  # the same layout: bound, no steps
    for _ in range(2):
        with pytest.raises(ValueError, match="overlap"):
            x.redistribute([Replicate()], out=x.local)
    mesh.free()


def test_a_non_contiguous_source_takes_the_general_path(comm):
    """A ShardedArray over a strided view (as HaloArray.array is): the binding declines it,
    the general path copies it contiguous, the result is the oracle's."""
    mesh = ps.Mesh(comm, (comm.size,))
    g = make_global((6 * comm.size, 10), "float64")
    x = ps.distribute(g, mesh, [Shard(0)])
    padded = np.zeros((x.local.shape[0] + 2, x.local.shape[1] + 2))
    padded[1:-1, 1:-1] = x.local
    view = psarray.ShardedArray.wrap(padded[1:-1, 1:-1], x.layout, mesh)
    assert not view.local.flags.c_contiguous
    for _ in range(3):
        y = view.redistribute([Shard(1)])
        np.testing.assert_array_equal(y.local, g[y.box])
        z = x.redistribute([Shard(1)])  # the contiguous one, the same key
        np.testing.assert_array_equal(z.local, g[z.box])
    mesh.free()


@pytest.mark.mpi(min_size=2)
def test_large_results_come_from_the_pool(comm):
    """The core binding allocates results of 1 MiB or more from the result pool (on MPI:
    blocks this large take node-shared memory under auto, whose results come from its own
    pool, tests/mpi/test_shm.py)."""
    a = "alltoallv"
    mesh = ps.Mesh(comm, (comm.size,))
    g = make_global((512 * comm.size, 640), "float32")
    x = ps.distribute(g, mesh, [Shard(0)])
    x.redistribute([Shard(1)], algorithm=a)
    ps.clear_caches()
    x.redistribute([Shard(1)], algorithm=a)  # binds again
    y = x.redistribute([Shard(1)], algorithm=a)  # the binding's result
    assert _binding(x, [Shard(1)], a).binding.calls == 1
    np.testing.assert_array_equal(y.local, g[y.box])
    if y.local.nbytes < ps.config.get("PYSHARD_POOL_MIN_BYTES"):
        pytest.skip("result below the pool's threshold at this size")
    del y
    held = ps.result_pool_bytes()
    assert held > 0  # the freed result went back to the pool
    y = x.redistribute([Shard(1)], algorithm=a)
    assert ps.result_pool_bytes() == 0  # and was taken again
    np.testing.assert_array_equal(y.local, g[y.box])
    mesh.free()


def test_shm_steps_bind_the_python_call(comm, monkeypatch):
    """A step on node-shared memory binds the Python call over its executor (its result comes
    from the node's pool): repeated calls give the oracle and never plan again."""
    ps.config.set("PYSHARD_SHM_MIN_BYTES", 0)  # (the fixture's override restores it)
    monkeypatch.setenv("PYSHARD_TRANSPORT", "auto")
    p = comm.size
    mesh = ps.Mesh(comm, (p,))
    g = make_global((8 * p, 8 * p), "float32")
    x = ps.distribute(g, mesh, [Shard(0)])
    ps.clear_caches()
    for _ in range(3):
        before = ps.comm_stats()
        y = x.redistribute([Shard(1)])
        np.testing.assert_array_equal(y.local, g[y.box])
        if p > 1:
            assert counts_since(before) == {"shm": 1}
    call, core = _binding(x, [Shard(1)])[:2]
    assert callable(call) and (core is None or p == 1)
    mesh.free()


def test_evicted_executors_take_their_bindings_along(comm):
    old = ps.cache_limit()
    ps.set_cache_limit(2)
    try:
        mesh = ps.Mesh(comm, (comm.size,))
        for _ in range(2):
            for i in range(4):
                g = make_global((5 + i, 3 * comm.size), "float32", seed=i)
                x = ps.distribute(g, mesh, [Shard(0)])
                for _ in range(2):
                    y = x.redistribute([Shard(1)])
                    np.testing.assert_array_equal(y.local, g[y.box])
                assert len(mesh.cache.fast) <= 2
                live = {id(e) for execs in mesh.cache.execs.values() for e in execs}
                for *_, execs in mesh.cache.fast.values():
                    assert all(id(e) in live for e in execs)
        mesh.free()
    finally:
        ps.set_cache_limit(old)


@pytest.mark.mpi(min_size=2)  # a mismatch needs two ranks
def test_validation_mode_validates_repeated_calls(comm):
    """A call bound without validation is validated once validation is on: a rank with
    another target raises the same error everywhere instead of reaching the binding."""
    mesh = ps.Mesh(comm, (comm.size,))
    g = make_global((4 * comm.size, 6), "float64")
    x = ps.distribute(g, mesh, [Shard(0)])
    for _ in range(2):
        x.redistribute([Shard(1)])
        x.redistribute([Replicate()])
    ps.reset_comm_stats()
    ps.set_validation(False)
    x.redistribute([Shard(1)])  # validation off: no check
    assert ps.validation_stats() == {}
    ps.set_validation(True)
    try:
        y = x.redistribute([Shard(1)])  # agreeing: validated, then run
        np.testing.assert_array_equal(y.local, g[y.box])
        assert ps.validation_stats() == {"redistribute": 1}
        x.redistribute([Shard(1)])
        assert ps.validation_stats() == {"redistribute": 2}
        ps.reset_comm_stats()  # zeroes the validation counts too
        assert ps.validation_stats() == {}
        target = [Shard(1)] if comm.rank == 0 else [Replicate()]
        with pytest.raises(ValueError) as e:
            x.redistribute(target)
        msg = str(e.value)
        assert "target layout" in msg
        assert comm.allgather(msg) == [msg] * comm.size
    finally:
        ps.set_validation(False)
    mesh.free()


@pytest.mark.mpi(min_size=4)
def test_2d_mesh_repeated_calls(comm, no_planning):
    if comm.size % 2:
        pytest.skip("a 2 x n mesh")
    mesh = ps.Mesh(comm, (2, comm.size // 2))
    g = make_global((12, 10), "float32")
    for src, dst in [
        ([Shard(0), Shard(1)], [Shard(1), Shard(0)]),
        ([Shard(0), Replicate()], [Replicate(), Shard(1)]),
        ([Partial("sum"), Shard(0)], [Shard(1), Replicate()]),
    ]:
        x = ps.distribute(g, mesh, src)
        x.redistribute(dst)
        with no_planning():
            for _ in range(2):
                y = x.redistribute(dst)
                np.testing.assert_array_equal(y.local, g[y.box])
    mesh.free()
