"""Every setting takes effect at the next call, on a mesh that has already run: a setting is
changed between two identical calls on one mesh (the second would otherwise be one lookup of
the binding the first kept), and the collectives that ran say the path changed, or the core
says it holds the new value (through entry points that never reach ``Mesh.cache`` too:
migrate, halo updates, ``from_local``)."""

from __future__ import annotations

import os

import numpy as np
import pytest
from mpi4py import MPI
from oracle import make_global

import pyshard as ps
from pyshard import Shard

pytestmark = pytest.mark.mpi  # run under mpiexec with --with-mpi (pytest-mpi)

S0, S1 = Shard(0), Shard(1)


@pytest.fixture
def transpose(comm):
    """(mesh, source, call): ``call()`` runs the same S(0) -> S(1) transpose (blocks of 4 KiB
    per pair) and returns the counters it moved, after checking the result."""
    P = comm.size
    mesh = ps.Mesh(comm, (P,))
    shape = (32 * P, 16 * P)
    g = make_global(shape, "float64", seed=7)
    x = ps.distribute(g, mesh, [S0])

    def call(**kw):
        before = ps.comm_stats()
        y = x.redistribute([S1], **kw)
        np.testing.assert_array_equal(y.local, g[y.box])
        now = ps.comm_stats()
        return {k: v - before.get(k, 0) for k, v in now.items() if v - before.get(k, 0)}

    yield mesh, x, call
    mesh.free()


def needs_peers(comm):
    if comm.size < 2:
        pytest.skip("one rank: nothing is exchanged")


def test_transport_and_threshold_after_the_first_call(comm, transpose):
    needs_peers(comm)
    _, _, call = transpose
    with ps.config.override(PYSHARD_TRANSPORT="auto", PYSHARD_SHM_MIN_BYTES=0):
        assert "shm" in call() and "shm" in call()  # the second: the kept binding
        with ps.config.override(PYSHARD_TRANSPORT="mpi"):
            got = call()
            assert "shm" not in got and got.get("alltoallv", 0) + got.get("p2p", 0) == 1, got
        assert "shm" in call()  # back
        with ps.config.override(PYSHARD_SHM_MIN_BYTES=1 << 40):
            assert "shm" not in call()
        assert "shm" in call()


def test_staged_host_transport_after_the_first_call(comm, transpose):
    needs_peers(comm)
    _, _, call = transpose
    with ps.config.override(PYSHARD_TRANSPORT="direct"):
        assert "staged" not in call()
        with ps.config.override(PYSHARD_TRANSPORT="staged"):
            assert ps.build_info()["transport"]["host"] == "staged"
            assert call().get("staged") == 1
        assert "staged" not in call()
        assert ps.build_info()["transport"]["host"] == "direct"


def test_algorithm_after_the_first_call(comm, transpose):
    needs_peers(comm)
    _, _, call = transpose
    with ps.config.override(PYSHARD_TRANSPORT="mpi", PYSHARD_ALGORITHM="alltoallv"):
        assert call() == {"alltoallv": 1}
        with ps.config.override(PYSHARD_ALGORITHM="alltoall"):
            assert call() == {"alltoall": 1}
        assert call() == {"alltoallv": 1}


def test_count_limit_after_the_first_call(comm, transpose):
    needs_peers(comm)
    _, _, call = transpose
    with ps.config.override(PYSHARD_TRANSPORT="mpi"):
        call(algorithm="alltoallv")
        assert ps.build_info()["count_limit"] == (1 << 31) - 1
        ps.reset_comm_stats()
        with ps.config.override(PYSHARD_COUNT_LIMIT=64):  # blocks of 4 KiB: over it
            call(algorithm="alltoallv")
            assert ps.build_info()["count_limit"] == 64
            # blocks past the limit: a datatype per peer (on every library)
            assert "per_peer" in ps.large_count_stats()
        ps.reset_comm_stats()
        call(algorithm="alltoallv")
        assert ps.build_info()["count_limit"] == (1 << 31) - 1
        assert "per_peer" not in ps.large_count_stats()


def test_cuda_aware_after_the_first_call(comm, transpose):
    _, _, call = transpose
    call()
    with ps.config.override(PYSHARD_CUDA_AWARE=False, PYSHARD_TRANSPORT="auto"):
        call()
        assert ps.build_info()["transport"]["cuda"] == "staged"
        with ps.config.override(PYSHARD_CUDA_AWARE=True):
            call()
            assert ps.build_info()["transport"]["cuda"] == "direct"
        call()
        assert ps.build_info()["transport"]["cuda"] == "staged"


def test_cache_limit_after_the_first_call(comm, transpose):
    _, _, call = transpose
    call()
    before = ps.cache_limit()
    with ps.config.override(PYSHARD_CACHE_LIMIT=3):
        call()
        assert ps.cache_limit() == 3
    call()
    assert ps.cache_limit() == before


def test_environment_read_again_by_refresh(comm, transpose, monkeypatch):
    """A variable changed in os.environ after the first call: refresh() reads it, and the
    repeated call takes the new path."""
    needs_peers(comm)
    _, _, call = transpose
    with ps.config.override(PYSHARD_TRANSPORT="auto"):
        monkeypatch.setenv("PYSHARD_SHM_MIN_BYTES", "0")
        ps.config.refresh()
        if ps.config.get("PYSHARD_SHM_MIN_BYTES") != 0:  # set from Python by the run
            pytest.skip("PYSHARD_SHM_MIN_BYTES is set from Python here")
        assert "shm" in call()
        monkeypatch.setenv("PYSHARD_SHM_MIN_BYTES", str(1 << 40))
        ps.config.refresh()
        assert "shm" not in call()
        monkeypatch.setenv("PYSHARD_SHM_MIN_BYTES", os.environ.get("PYSHARD_SHM_MIN_BYTES", "0"))
    ps.config.refresh()


# ----------------------------------------------------------------------------- the split transport


def test_shm_setting_after_the_first_call(comm, transpose):
    """PYSHARD_SHM turns node-shared memory off and on again; it wins over the older
    PYSHARD_TRANSPORT where both are set."""
    needs_peers(comm)
    _, _, call = transpose
    with ps.config.override(PYSHARD_SHM="auto", PYSHARD_SHM_MIN_BYTES=0):
        first = call()
        if "shm" not in first:
            pytest.skip("no two ranks share a node here")
        with ps.config.override(PYSHARD_SHM="off"):
            got = call()
            assert "shm" not in got and got.get("alltoallv", 0) + got.get("p2p", 0) == 1, got
        assert "shm" in call()
        with ps.config.override(PYSHARD_TRANSPORT="mpi"):  # the older spelling: PYSHARD_SHM
            assert "shm" in call()  # is set, and wins
    with ps.config.override(PYSHARD_TRANSPORT="auto", PYSHARD_SHM_MIN_BYTES=0):
        assert "shm" in call()
        with ps.config.override(PYSHARD_TRANSPORT="mpi"):  # ... where it is not set: off
            assert "shm" not in call()


def test_mpi_transport_setting_after_the_first_call(comm, transpose):
    needs_peers(comm)
    _, _, call = transpose
    with ps.config.override(PYSHARD_SHM="off", PYSHARD_MPI_TRANSPORT="direct"):
        assert "staged" not in call()
        with ps.config.override(PYSHARD_MPI_TRANSPORT="staged"):
            assert ps.build_info()["transport"] == {"host": "staged", "cuda": "staged"}
            assert call().get("staged") == 1
        assert "staged" not in call()
        assert ps.build_info()["transport"]["host"] == "direct"


# ----------------------------------------------------------------------------- redistribute_many


@pytest.fixture
def many(comm):
    """(mesh, call): ``call()`` runs the same redistribute_many of eight small arrays (each
    ARRAY_BYTES per rank) S(0) -> S(1) and returns the counters it moved, after checking
    them."""
    P = comm.size
    mesh = ps.Mesh(comm, (P,))
    gs = [make_global((16 * P, 8), "float64", seed=k) for k in range(8)]
    xs = [ps.distribute(g, mesh, [S0]) for g in gs]

    def call():
        before = ps.comm_stats()
        for y, g in zip(ps.redistribute_many(xs, [S1]), gs):
            np.testing.assert_array_equal(y.local, g[y.box])
        now = ps.comm_stats()
        return {k: v - before.get(k, 0) for k, v in now.items() if v - before.get(k, 0)}

    yield mesh, call
    mesh.free()


ARRAY_BYTES = 16 * 8 * 8


def exchanges(got):
    return got.get("alltoallv", 0) + got.get("p2p", 0) + got.get("alltoall", 0)


def test_many_fuse_and_batch_after_the_first_call(comm, many):
    """PYSHARD_MANY_FUSE_MAX_BYTES and PYSHARD_MANY_BATCH_BYTES change the batching of the
    next redistribute_many with the same arrays (whose plan and targets were kept)."""
    needs_peers(comm)
    _, call = many
    with ps.config.override(PYSHARD_SHM="off"):
        assert exchanges(call()) == 1 and exchanges(call()) == 1  # all eight fused
        with ps.config.override(PYSHARD_MANY_FUSE_MAX_BYTES=1):  # none small enough to fuse
            assert exchanges(call()) == 8
        assert exchanges(call()) == 1
        with ps.config.override(PYSHARD_MANY_BATCH_BYTES=1):  # one array per fused batch
            assert exchanges(call()) == 8
        with ps.config.override(PYSHARD_MANY_BATCH_BYTES=4 * ARRAY_BYTES):
            assert exchanges(call()) == 2  # four arrays per batch
        assert exchanges(call()) == 1


def test_many_shm_batch_after_the_first_call(comm, many):
    needs_peers(comm)
    _, call = many
    with ps.config.override(PYSHARD_SHM="auto", PYSHARD_SHM_MIN_BYTES=0):
        if call().get("shm") != 1:
            pytest.skip("no two ranks share a node here")
        assert call() == {"shm": 1}
        with ps.config.override(PYSHARD_MANY_SHM_BATCH_BYTES=1):  # one array per batch
            assert call() == {"shm": 8}
        assert call() == {"shm": 1}


# ----------------------------------------------------------------------------- process state


@pytest.fixture
def rows(comm):
    """(mesh, move): ``move()`` migrates 2^16 rows of 32 bytes (2 MiB per rank: results from
    the result pool) to the next rank and back by messages, freeing the results; migrate
    never reaches ``Mesh.cache``."""
    mesh = ps.Mesh(comm, (comm.size,))
    n = 1 << 16
    cols = np.arange(4 * n, dtype=np.float64).reshape(n, 4) + comm.rank

    def move():
        dest = np.full(n, (comm.rank + 1) % comm.size, dtype=np.int64)
        m = ps.migrate(cols, dest, mesh)
        got = m.rows
        assert got.shape == cols.shape
        assert got[0, 0] == (comm.rank - 1) % comm.size
        del m, got

    yield mesh, move
    mesh.free()


def test_result_pool_bytes_after_the_first_call(comm, rows):
    _, move = rows
    with ps.config.override(PYSHARD_SHM="off"):
        move()
        ps.clear_caches()  # the pool's idle buffers go
        move()
        assert ps.result_pool_bytes() > 0  # the freed result kept for the next call
        with ps.config.override(PYSHARD_RESULT_POOL_BYTES=0):
            ps.clear_caches()
            move()
            assert ps.result_pool_bytes() == 0  # off: the freed result went back
        move()
        assert ps.result_pool_bytes() > 0


def test_count_limit_and_peer_timeout_without_a_mesh_cache_call(comm, rows):
    """The core holds the new value as soon as the setting changes, whatever the next call
    (here a migrate, which never reaches Mesh.cache)."""
    _, move = rows
    move()
    with ps.config.override(PYSHARD_COUNT_LIMIT=4096, PYSHARD_PEER_TIMEOUT=12.5):
        info = ps.build_info()
        assert (info["count_limit"], info["peer_timeout"]) == (4096, 12.5)  # the core's values
        move()  # messages of 2 MiB past the limit: still right
    info = ps.build_info()
    assert info["count_limit"] == (1 << 31) - 1
    assert info["peer_timeout"] == ps.config.get("PYSHARD_PEER_TIMEOUT")


def test_cache_limit_without_a_mesh_cache_call(comm):
    before = ps.cache_limit()
    with ps.config.override(PYSHARD_CACHE_LIMIT=3):
        assert ps.cache_limit() == 3
    assert ps.cache_limit() == before


@pytest.mark.mpi(min_size=2)  # a mismatch needs two ranks
def test_validate_after_the_first_call(comm):
    """PYSHARD_VALIDATE set after the first call: the next from_local with a wrong shard on
    rank 0 raises the same error on every rank, instead of on rank 0 alone."""
    mesh = ps.Mesh(comm, (comm.size,))
    shape = (4 * comm.size, 3)

    def shard(wrong):
        rows = 4 + (1 if wrong and comm.rank == 0 else 0)
        return np.zeros((rows, 3))

    with ps.config.override(PYSHARD_VALIDATE=False):
        ps.from_local(shard(False), mesh, [S0], shape)
        if comm.rank == 0:
            with pytest.raises(ValueError):
                ps.from_local(shard(True), mesh, [S0], shape)
        else:
            ps.from_local(shard(True), mesh, [S0], shape)  # rank 0 alone sees it
        with ps.config.override(PYSHARD_VALIDATE=True):
            assert ps.validation()
            with pytest.raises(ValueError, match="rank 0 at mesh coords") as e:
                ps.from_local(shard(True), mesh, [S0], shape)
            msg = str(e.value)
            assert comm.allgather(msg) == [msg] * comm.size
        assert not ps.validation()
    mesh.free()


def test_a_gather_plan_keeps_the_route_it_was_built_with(comm):
    """A GatherPlan keeps its route (node-shared memory or MPI) after PYSHARD_SHM changes, as
    a HaloArray keeps its method: by design, and docs/configuration.md lists it among the
    exceptions; a plan built after the change follows it."""
    needs_peers(comm)
    P = comm.size
    mesh = ps.Mesh(comm, (P,))
    g = make_global((64 * P, 8), "float64", seed=3)
    x = ps.distribute(g, mesh, [S0])
    idx = np.arange(comm.rank, g.shape[0], 3)
    try:
        with ps.config.override(PYSHARD_SHM="auto", PYSHARD_SHM_MIN_BYTES=0):
            gp = ps.gather_plan(idx, x)
        if not comm.allreduce(gp.route.path == "shm", op=MPI.LAND):
            pytest.skip("node-shared memory not taken here (simulated nodes of one rank)")
        with ps.config.override(PYSHARD_SHM="off"):
            np.testing.assert_array_equal(gp.gather(x), g[idx])
            assert gp.route.path == "shm"
            assert ps.gather_plan(idx, x).route.path != "shm"
    finally:
        mesh.free()
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "docs", "configuration.md")) as f:
        doc = " ".join(f.read().split())
    assert "Exceptions, by design:" in doc and "a `GatherPlan` (`ps.gather_plan`" in doc
