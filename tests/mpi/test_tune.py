"""algorithm="tune", the default algorithm from the environment, pooled results, sparse
exchanges: results against the numpy oracle, collective counts, and agreement between ranks."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from oracle import auto_exchange, make_global

import pyshard as ps
from pyshard import Replicate, Shard
from pyshard.exchange import default_algorithm

pytestmark = [pytest.mark.mpi, pytest.mark.numerics]  # numerics: not rerun per MPI library

EXCHANGES = {"alltoallv", "alltoall", "p2p", "alltoallw", "shm"}  # shm: pyshard/_shm.py


def counts_since(before):
    now = ps.comm_stats()
    return {k: v - before.get(k, 0) for k, v in now.items() if v - before.get(k, 0)}


@pytest.fixture
def tune_file(comm, tmp_path, monkeypatch):
    path = comm.bcast(str(tmp_path / "tune.json") if comm.rank == 0 else None, root=0)
    monkeypatch.setenv("PYSHARD_TUNE_FILE", path)
    return path


@pytest.mark.parametrize("shape", [(12, 10), (13, 7)])
def test_tune_picks_one_winner_everywhere(comm, tune_file, shape):
    mesh = ps.Mesh(comm, (comm.size,))
    g = make_global(shape, "float64")
    x = ps.distribute(g, mesh, [Shard(0)])
    before = ps.comm_stats()
    y = x.redistribute([Shard(1)], algorithm="tune")
    np.testing.assert_array_equal(y.local, g[y.box])
    tuned = mesh.cache.tuned
    if comm.size == 1:
        assert counts_since(before) == {}
        return
    assert len(tuned) == 1
    choice = next(iter(tuned.values()))
    assert choice in EXCHANGES
    assert comm.allgather(choice) == [choice] * comm.size  # every rank adopted the same
    # a second call runs the winner once; the choice survives the executor caches
    ps.clear_caches()
    before = ps.comm_stats()
    y = x.redistribute([Shard(1)], algorithm="tune")
    np.testing.assert_array_equal(y.local, g[y.box])
    assert counts_since(before) == {choice: 1}
    comm.Barrier()
    with open(tune_file) as f:
        assert json.load(f) == tuned
    # a new mesh (a new job) starts from the file: no trials
    mesh2 = ps.Mesh(comm, (comm.size,))
    x2 = ps.distribute(g, mesh2, [Shard(0)])
    before = ps.comm_stats()
    y2 = x2.redistribute([Shard(1)], algorithm="tune")
    assert counts_since(before) == {choice: 1}
    np.testing.assert_array_equal(y2.local, g[y2.box])
    mesh.free()
    mesh2.free()


@pytest.mark.mpi(min_size=2)
def test_tune_file_keeps_every_meshs_choices(comm, tune_file):
    """Two meshes over the same ranks, then two disjoint meshes (halves of the ranks, their
    rank 0s writing at once), each tuning other sizes: the file keeps every choice. It kept
    the saving mesh's own choices only (and tune_mesh's), so the other mesh's were lost."""
    g = {n: make_global((n, 8), "float64") for n in (8 * comm.size, 64 * comm.size)}

    def tune(mesh, n):
        x = ps.distribute(g[n], mesh, [Shard(0)])
        y = x.redistribute([Shard(1)], algorithm="tune")
        np.testing.assert_array_equal(y.local, g[n][y.box])

    a, b = ps.Mesh(comm, (comm.size,)), ps.Mesh(comm, (comm.size,))
    small, big = sorted(g)
    tune(a, small)
    tune(b, big)
    tune(a, big)  # (a read the file before b wrote its choice: it tunes big's again)
    want = dict(b.cache.tuned)
    want.update(a.cache.tuned)  # (a wrote last: its choice for big's key stands)
    comm.Barrier()
    with open(tune_file) as f:
        assert json.load(f) == want
    half = comm.Split(comm.rank % 2, comm.rank)
    c = ps.Mesh(half, (half.size,))
    tune(c, small if comm.rank % 2 else big)  # (two sizes of group: other keys too)
    comm.Barrier()
    for tuned in comm.allgather(dict(c.cache.tuned or {})):  # (none on one rank)
        want.update(tuned)
    with open(tune_file) as f:
        assert json.load(f) == want
    for m in (a, b, c):
        m.free()
    half.Free()


@pytest.mark.mpi(min_size=2)
def test_default_algorithm_from_environment(comm, monkeypatch):
    monkeypatch.setenv("PYSHARD_ALGORITHM", "p2p")
    mesh = ps.Mesh(comm, (comm.size,))
    g = make_global((4 * comm.size, 3 * comm.size), "int32")
    x = ps.distribute(g, mesh, [Shard(0)])
    before = ps.comm_stats()
    y = x.redistribute([Shard(1)])
    assert counts_since(before) == {"p2p": 1}
    np.testing.assert_array_equal(y.local, g[y.box])
    mesh.free()


def test_bad_default_algorithm_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("PYSHARD_ALGORITHM", "fastest")
    with pytest.raises(ValueError, match="PYSHARD_ALGORITHM must be one of auto, tune, "):
        default_algorithm()
    with ps.config.override(PYSHARD_ALGORITHM="p2p"):  # Python's setting wins
        assert default_algorithm() == "p2p"


@pytest.mark.mpi(min_size=2)  # one rank: no exchange, the result is a local copy
def test_plain_results_come_from_the_pool(comm):
    """Results of 1 MiB or more return to the pool when freed and are reused."""
    mesh = ps.Mesh(comm, (comm.size,))
    n = 512 * comm.size
    g = make_global((n, 640), "float32")
    x = ps.distribute(g, mesh, [Shard(0)])
    ps.clear_caches()
    y = x.redistribute([Shard(1)], algorithm="alltoallv")  # MPI (test_shm.py: shared memory)
    np.testing.assert_array_equal(y.local, g[y.box])
    if y.local.nbytes < ps.config.get("PYSHARD_POOL_MIN_BYTES"):
        pytest.skip("result below the pool's threshold at this size")
    del y
    held = ps.result_pool_bytes()
    assert held >= 512 * 640 * 4 // comm.size
    y = x.redistribute([Shard(1)], algorithm="alltoallv")  # takes the pooled buffer back
    assert ps.result_pool_bytes() == 0  # the only idle buffer was reused
    np.testing.assert_array_equal(y.local, g[y.box])
    z = y.local[::2]  # a view keeps the memory alive
    del y
    assert ps.result_pool_bytes() == 0
    del z
    assert ps.result_pool_bytes() == held
    mesh.free()


@pytest.mark.parametrize("n", [0, 1, 2])
def test_sparse_targets_use_point_to_point(comm, n):
    """A target whose shards are mostly empty (n rows over the ranks): each rank sends to at
    most n peers, point-to-point once that is at most a quarter of the ranks."""
    p = comm.size
    mesh = ps.Mesh(comm, (p,))
    g = make_global((4 * p, n), "float64")
    x = ps.distribute(g, mesh, [Shard(0)])
    step = x.plan_to([Shard(1)]).steps
    before = ps.comm_stats()
    y = x.redistribute([Shard(1)])
    np.testing.assert_array_equal(y.local, g[y.box])
    if p == 1:
        return
    peers = min(n, p - 1)
    assert step[0].max_peers() == peers
    want = {("p2p" if 4 * peers <= p else "alltoallv"): 1}
    assert counts_since(before) == auto_exchange(mesh, want, step=step[0])
    assert f"at most {peers} peers per rank" in x.plan_to([Shard(1)]).explain()
    mesh.free()


def test_regular_gather_lands_in_place(comm):
    """Shard(0) -> Replicate with equal shards is one MPI_Allgather straight into the
    output; with unequal shards one Allgatherv (an MPI algorithm named: auto gathers through
    node-shared memory, test_shm.py)."""
    p = comm.size
    mesh = ps.Mesh(comm, (p,))
    for rows, want in ((3 * p, "allgather"), (3 * p + 1, "allgatherv")):
        g = make_global((rows, 5), "int64")
        x = ps.distribute(g, mesh, [Shard(0)])
        before = ps.comm_stats()
        y = x.redistribute([Replicate()], algorithm="alltoallv")
        np.testing.assert_array_equal(y.local, g)
        if p > 1:
            assert counts_since(before) == {want: 1}
    mesh.free()


def test_tune_file_that_is_garbage_is_ignored(comm, tune_file):
    if comm.rank == 0:
        with open(tune_file, "w") as f:
            f.write("{not json")
    comm.Barrier()
    mesh = ps.Mesh(comm, (comm.size,))
    g = make_global((6, 4 * comm.size), "float32")
    x = ps.distribute(g, mesh, [Shard(1)])
    y = x.redistribute([Shard(0)], algorithm="tune")
    np.testing.assert_array_equal(y.local, g[y.box])
    assert os.path.exists(tune_file)
    mesh.free()


# (source, target, global shape from the mesh shape): steps over one dim of a 2-D mesh whose
# communicators differ in whether some block goes between two ranks of one node (a (1, n)
# array's one row lives on mesh rank 0, so only its column's communicator moves anything)
TUNE_2D = [
    ([Shard(0), Shard(0)], [Shard(1), Shard(0)], lambda d: (1, d[1])),
    ([Shard(0), Shard(0)], [Shard(1), Shard(0)], lambda d: (1, d[0])),
    ([Shard(0), Shard(1)], [Shard(1), Shard(0)], lambda d: (2 * d[0] + 1, 2 * d[1] + 1)),
    ([Shard(1), Shard(0)], [Shard(0), Shard(1)], lambda d: (d[1] + 1, d[0])),
    ([Shard(0), Replicate()], [Shard(1), Shard(1)], lambda d: (3 * d[0], 3 * d[1])),
]


@pytest.mark.mpi(min_size=4)
@pytest.mark.parametrize("case", range(len(TUNE_2D)))
def test_tune_on_a_2d_mesh_agrees_on_the_candidates(comm, monkeypatch, case):
    """algorithm="tune" on a 2-D mesh built from the rank count (2x2 at 4 ranks, 2x3 at 6,
    4x2 at 8): its timings are combined over the whole mesh, so every rank lists the same
    candidates (route()) and every rank gets the numpy result, from redistribute and from a
    redistribute_many that runs the array on its own."""
    from mpi4py import MPI

    from pyshard.route import route

    monkeypatch.delenv("PYSHARD_TUNE_FILE", raising=False)  # every mesh tunes afresh
    dims = tuple(MPI.Compute_dims(comm.size, 2))
    if min(dims) < 2:
        pytest.skip(f"no 2-D mesh with both dims > 1 at {comm.size} ranks")
    src, dst, shape = TUNE_2D[case]
    g = make_global(shape(dims), "float32", seed=case)
    mesh = ps.Mesh(comm, dims)
    x = ps.distribute(g, mesh, src)
    cands = [route(s, mesh, "tune").candidates for s in x.plan_to(dst).steps
             if s.kind == "alltoallv"]
    every = comm.allgather(cands)
    assert every == [cands] * comm.size, every  # before any trial: no rank left waiting
    y = x.redistribute(dst, algorithm="tune")
    np.testing.assert_array_equal(y.local, g[y.box])
    chosen = sorted(mesh.cache.tuned.items())
    assert comm.allgather(chosen) == [chosen] * comm.size
    mesh.free()
    mesh = ps.Mesh(comm, dims)  # a new mesh: tuned again, from redistribute_many
    x = ps.distribute(g, mesh, src)
    with ps.config.override(PYSHARD_MANY_FUSE_MAX_BYTES=1):  # the array on its own
        (y,) = ps.redistribute_many([x], dst, algorithm="tune")
    np.testing.assert_array_equal(y.local, g[y.box])
    mesh.free()


@pytest.mark.mpi(min_size=2)
def test_a_choice_made_without_node_shared_memory_is_not_reused_with_it(comm, monkeypatch):
    """A step tuned under PYSHARD_SHM=off chose among MPI's exchanges alone; once node-shared
    memory is on again the same step is tuned afresh (its own key), with "shm" among the
    candidates, and both results equal numpy's."""
    from pyshard.route import route

    monkeypatch.delenv("PYSHARD_TUNE_FILE", raising=False)
    mesh = ps.Mesh(comm, (comm.size,))
    g = make_global((4 * comm.size + 1, 3 * comm.size), "float64", seed=7)
    x = ps.distribute(g, mesh, [Shard(0)])
    (step,) = x.plan_to([Shard(1)]).steps
    if "shm" not in route(step, mesh, "tune").candidates:
        pytest.skip("node-shared memory is not a candidate here (no node peers, or turned off)")
    with ps.config.override(PYSHARD_SHM="off"):
        assert "shm" not in route(step, mesh, "tune").candidates
        y = x.redistribute([Shard(1)], algorithm="tune")
        np.testing.assert_array_equal(y.local, g[y.box])
    off = dict(mesh.cache.tuned)
    assert len(off) == 1 and "shm" not in off.values()
    y = x.redistribute([Shard(1)], algorithm="tune")
    np.testing.assert_array_equal(y.local, g[y.box])
    tuned = mesh.cache.tuned
    assert len(tuned) == 2, tuned  # tuned again: the first choice was not reused
    (new,) = set(tuned) - set(off)
    assert new.endswith("|shm")
    chosen = sorted(tuned.items())
    assert comm.allgather(chosen) == [chosen] * comm.size
    mesh.free()


@pytest.mark.mpi(min_size=2)
def test_a_tuning_file_set_after_a_first_tuned_call_holds(comm, tmp_path, monkeypatch):
    """PYSHARD_TUNE_FILE set (config.set) after the mesh's first tuned calls: the next tuned
    call reads it (its choice for a key wins over the mesh's own), and the choices the mesh
    made before that the file lacks are added to it, not lost."""
    monkeypatch.delenv("PYSHARD_TUNE_FILE", raising=False)
    mesh = ps.Mesh(comm, (comm.size,))
    small = make_global((4 * comm.size + 3, 2 * comm.size + 1), "float64", seed=11)
    big = make_global((64 * comm.size, 64 * comm.size), "float64", seed=12)  # another bucket
    xs = ps.distribute(small, mesh, [Shard(0)])
    xb = ps.distribute(big, mesh, [Shard(0)])
    with ps.config.override(PYSHARD_SHM="off"):
        xs.redistribute([Shard(1)], algorithm="tune")
        (k, chosen), = mesh.cache.tuned.items()
        xb.redistribute([Shard(1)], algorithm="tune")
        (kb, chosen_b), = ((kk, v) for kk, v in mesh.cache.tuned.items() if kk != k)
        other = "p2p" if chosen != "p2p" else "alltoall"
        path = comm.bcast(str(tmp_path / "later.json") if comm.rank == 0 else None, root=0)
        if comm.rank == 0:
            with open(path, "w") as f:
                json.dump({"another|key": "alltoallv", k: other}, f)
        comm.Barrier()
        with ps.config.override(PYSHARD_TUNE_FILE=path):
            before = ps.comm_stats()
            y = xs.redistribute([Shard(1)], algorithm="tune")
            np.testing.assert_array_equal(y.local, small[y.box])
            assert counts_since(before) == {other: 1}
            tuned = {k: other, kb: chosen_b, "another|key": "alltoallv"}
            assert mesh.cache.tuned == tuned
            comm.Barrier()
            with open(path) as f:
                assert json.load(f) == tuned
    mesh.free()
