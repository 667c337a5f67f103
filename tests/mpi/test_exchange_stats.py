"""Every exchange counts its own runs and bytes (``Exchange.comm_stats()``): a redistribute's
step (a first call, ``wait=False`` and the fast path of a repeated call), a halo update and
its fold, a migration and its way back, a gather plan. The expected bytes come from the shapes each
operation gives, not from the accounting under test."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import pyshard as ps
from pyshard import Replicate, Shard
from pyshard.executor import executors

pytestmark = pytest.mark.mpi(min_size=2)


@pytest.fixture
def mesh():
    m = ps.Mesh(MPI.COMM_WORLD, (MPI.COMM_WORLD.size,))
    yield m
    m.free()


def test_redistribute_counts_every_run(mesh):
    N, M = 3 * mesh.size + 1, 2 * mesh.size + 3
    g = np.arange(N * M, dtype=np.float64).reshape(N, M)
    x = ps.distribute(g, mesh, [Shard(0)])
    (e,) = executors(x.plan_to([Shard(1)]), mesh)
    before = e.comm_stats()["calls"]
    y = x.redistribute([Shard(1)])
    x.redistribute([Shard(1)], wait=False).wait()
    x.redistribute([Shard(1)])  # a repeated call: the fast path's binding runs it
    s = e.comm_stats()
    assert s["calls"] - before == 3
    rows, cols = x.local.shape[0], y.local.shape[1]
    assert s["bytes_sent"] == s["calls"] * rows * (M - cols) * 8
    assert s["bytes_received"] == s["calls"] * cols * (N - rows) * 8


def test_halo_and_fold_count_their_runs(mesh):
    P, M = mesh.size, 5
    g = np.arange(4 * P * M, dtype=np.float32).reshape(4 * P, M)
    h = ps.distribute(g, mesh, [Shard(0)]).with_halo((1, 0))
    h.update()
    h.update()
    h.fold()
    me = mesh.rank
    peers = (me > 0) + (me < P - 1)  # non-periodic: the ranks above and below
    u, f = h.exchange.comm_stats(), h.fold_exchange.comm_stats()
    assert u == {"calls": 2, "bytes_sent": 2 * peers * M * 4, "bytes_received": 2 * peers * M * 4}
    assert f == {"calls": 1, "bytes_sent": peers * M * 4, "bytes_received": peers * M * 4}


def test_migration_and_back_count_one_call(mesh):
    P, me = mesh.size, mesh.rank
    n = 6 + me
    dest = (np.arange(n) + me) % P
    rows = np.arange(3 * n, dtype=np.int64).reshape(n, 3)
    pend = ps.migrate(rows, dest, mesh, wait=False)
    r = pend.wait()
    s = pend.x.comm_stats()
    out = int((dest != me).sum())
    stay = int((dest == me).sum())
    assert s == {"calls": 1, "bytes_sent": out * 24, "bytes_received": (r.m - stay) * 24}
    bp = r.back(r.rows, wait=False)
    np.testing.assert_array_equal(bp.wait(), rows)
    assert bp.x.comm_stats() == {"calls": 1, "bytes_sent": s["bytes_received"],
                                 "bytes_received": s["bytes_sent"]}


def test_gather_plan_counts_both_directions(mesh):
    P, me = mesh.size, mesh.rank
    N = 4 * P + 1
    g = np.arange(2 * N, dtype=np.float64).reshape(N, 2)
    x = ps.distribute(g, mesh, [Shard(0)])
    def idx_of(q):
        return np.array([(q * 5 + 3 * k) % N for k in range(7)], np.int64)

    idx = idx_of(me)
    plan = ps.gather_plan(idx, like=x)
    np.testing.assert_array_equal(plan.gather(x), g[idx])
    plan.scatter(np.ones((len(idx), 2)), into=x)
    st = plan.comm_stats()
    assert plan.exchange.comm_stats() == {"calls": 2, "bytes_sent": st["bytes_sent"],
                                          "bytes_received": st["bytes_received"]}
    mine = set(range(int(plan.offsets[me]), int(plan.offsets[me + 1])))
    read_here = len(set(idx.tolist()) - mine)  # distinct remote rows this rank reads
    read_from_me = sum(len(set(idx_of(q).tolist()) & mine) for q in range(P) if q != me)
    # gather: in read_here rows, out read_from_me; scatter the reverse; 16 bytes a row
    assert st["bytes_received"] == st["bytes_sent"] == (read_here + read_from_me) * 16


def test_replicate_step_is_counted_too(mesh):
    g = np.arange(12.0)
    x = ps.distribute(g, mesh, [Shard(0)])
    (e,) = executors(x.plan_to([Replicate()]), mesh)
    before = e.comm_stats()["calls"]
    np.testing.assert_array_equal(x.redistribute([Replicate()]).local, g)
    assert e.comm_stats()["calls"] == before + 1
