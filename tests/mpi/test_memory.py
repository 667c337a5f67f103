"""Memory stays bounded: caches are LRUs of metadata, workspaces come from one pool per mesh
(a memory test, not a timing test)."""

from __future__ import annotations

import resource

import numpy as np
import pytest
from oracle import make_global

import pyshard as ps
from pyshard import Shard
from pyshard.geometry import geometry

pytestmark = [pytest.mark.mpi, pytest.mark.numerics]  # numerics: not rerun per MPI library


def _peak_rss_mib(comm):
    return comm.allreduce(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, op=max)


def test_400_shapes_level_off(comm):
    """The loop of ``bench --cases memory``: a (1000 + 7 i) x 2048 float32 shard per rank,
    Shard(0) -> Shard(1) once per shape, results dropped. Peak RSS after 400 shapes is within
    64 MiB of the peak after 300 (with unbounded caches, every shape keeping its executor and
    buffers, it grows by 3.6 GiB: docs/performance.md): the cache holds cache_limit() = 256
    executors, so it is full by then, and the shapes grow by some 20 MiB of arrays and buffers
    in those 100 (measured against shape 40, their growth of 60 MiB would leave the bound to
    the peak that earlier tests of the same process set)."""
    if comm.size != 2:
        pytest.skip("runs at 2 ranks (memory and time)")
    mesh = ps.Mesh(comm, (2,))
    peak300 = None
    for i in range(400):
        rows = 1000 + 7 * i
        local = np.ones((rows, 2048), np.float32)
        x = ps.from_local(local, mesh, [Shard(0)], global_shape=(2 * rows, 2048))
        y = x.redistribute([Shard(1)])
        assert y.local.shape == (2 * rows, 1024)
        del x, y, local
        if i == 299:
            peak300 = _peak_rss_mib(comm)
    peak400 = _peak_rss_mib(comm)
    assert len(mesh.cache.execs) <= ps.cache_limit()
    msg = f"peak RSS {peak300:.1f} MiB after 300 shapes, {peak400:.1f} after 400"
    assert peak400 - peak300 <= 64, msg
    mesh.free()


def test_caches_are_bounded_and_trimmed(comm):
    old = ps.cache_limit()
    ps.set_cache_limit(4)
    try:
        mesh = ps.Mesh(comm, (comm.size,))
        for i in range(12):
            g = make_global((3 * comm.size + i, 5 + i), "float64")
            x = ps.distribute(g, mesh, [Shard(0)])
            y = x.redistribute([Shard(1)])
            np.testing.assert_array_equal(y.local, g[y.box])
            assert len(mesh.cache.execs) <= 4 and len(mesh.cache.fast) <= 4
        need = mesh.cache.need()
        held = mesh.cache.workspace.held
        assert held <= 2 * (need + need // 4 + 4096), (held, need)
        ps.clear_caches()
        assert len(mesh.cache.execs) == 0 and mesh.cache.workspace.held == 0
        mesh.free()
    finally:
        ps.config.reset("PYSHARD_CACHE_LIMIT")
        assert ps.cache_limit() == old


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("shape", [(12, 10), (13, 7)])
def test_workspace_is_what_explain_reports(comm, shape):
    """The pool grows to exactly the step's workspace (4 KiB aligned), the number that
    explain() reports as pack/unpack memory: one rule in the core (on MPI: node-shared memory
    needs no pack buffers, test_shm.py)."""
    mesh = ps.Mesh(comm, (comm.size,))
    g = make_global(shape, "float32")
    x = ps.distribute(g, mesh, [Shard(0)])
    p = x.plan_to([Shard(1)])
    y = x.redistribute([Shard(1)], algorithm="alltoallv")
    np.testing.assert_array_equal(y.local, g[y.box])
    want = geometry(p.steps[0], mesh.coords).workspace_bytes
    aligned = (want + 4095) // 4096 * 4096
    assert mesh.cache.workspace.held == aligned
    assert p.peak_extra_bytes(mesh.coords) == want + y.local.nbytes
    mesh.free()
    assert mesh.cache.workspace.held == 0
