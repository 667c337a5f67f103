"""Every setting takes effect at the next call, on a mesh that has already run: a setting is
changed between two identical calls on one mesh (the second would otherwise be one lookup of
the binding the first kept), and the collectives that ran say the path changed."""

from __future__ import annotations

import os

import numpy as np
import pytest
from oracle import make_global

import pyshard as ps
from pyshard import Shard, _core

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
        assert _core.count_limit() == (1 << 31) - 1
        _core.reset_large_count_stats()
        with ps.config.override(PYSHARD_COUNT_LIMIT=64):  # blocks of 4 KiB: over it
            call(algorithm="alltoallv")
            assert _core.count_limit() == 64
            # blocks past the limit: a datatype per peer (on every library)
            assert "per_peer" in _core.large_count_stats()
        _core.reset_large_count_stats()
        call(algorithm="alltoallv")
        assert _core.count_limit() == (1 << 31) - 1
        assert "per_peer" not in _core.large_count_stats()


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
