"""redistribute_many: many arrays in one fused collective, against the numpy oracle; the
container comes back as it went in; arrays whose plans cannot be fused run on their own;
errors before any communication."""

from __future__ import annotations

import numpy as np
import pytest
from oracle import auto_exchange, make_global
from test_redistribute_nd import MESHES, counts_since
from test_staged import staged  # noqa: F401 - the fixture

import pyshard as ps
from pyshard import Partial, Replicate, Shard

pytestmark = pytest.mark.mpi  # run under mpiexec with --with-mpi (pytest-mpi)

S0, S1, R = Shard(0), Shard(1), Replicate()
DTYPES = ["float32", "float64", "int16", "complex128", "bool", "uint8"]


def arrays(comm, mesh, n=12):
    """``n`` arrays of assorted shapes (uneven, empty shards, smaller than the mesh) and
    dtypes, as Shard(0), with their global values."""
    gs, xs = [], []
    for k in range(n):
        shape = (1 + (7 * k + 3) % (3 * comm.size + 2), 1 + (5 * k) % 9)
        g = make_global(shape, DTYPES[k % len(DTYPES)], seed=k)
        gs.append(g)
        xs.append(ps.distribute(g, mesh, [S0] + [R] * (mesh.ndim - 1)))
    return gs, xs


def check(y, g):
    np.testing.assert_array_equal(y.local, g[y.box])


@pytest.mark.parametrize("container", [list, tuple, dict])
def test_one_collective_for_many_transposes(comm, container):
    mesh = ps.Mesh(comm, (comm.size,))
    gs, xs = arrays(comm, mesh)
    if container is dict:
        inp = {f"w{k}": x for k, x in enumerate(xs)}
    else:
        inp = container(xs)
    before = ps.comm_stats()
    out = ps.redistribute_many(inp, [S1])
    got = counts_since(before)
    assert type(out) is type(inp)
    ys = list(out.values()) if container is dict else list(out)
    if container is dict:
        assert list(out) == list(inp)
    for y, g in zip(ys, gs):
        assert y.placements == (S1,)
        check(y, g)
    if comm.size > 1:
        assert got == auto_exchange(mesh, {"alltoallv": 1}), got
    assert ps.plan_many(inp, [S1]).collectives == (1 if comm.size > 1 else 0)
    mesh.free()


def test_mixed_targets_fuse_what_can_be_fused(comm):
    mesh = ps.Mesh(comm, (comm.size,))
    gs, xs = arrays(comm, mesh, n=6)
    sizes = {0: tuple([0] * (comm.size - 1) + [gs[2].shape[0]])}
    targets = [[S1], [R], [S0], [S1], [Partial("max")], [S1]]
    xs[2] = ps.distribute(gs[2], mesh, [S0], sizes=sizes)  # a rebalance back to balanced
    mp = ps.plan_many(xs, targets)
    text = mp.explain()
    out = ps.redistribute_many(xs, targets)
    for k in (0, 1, 2, 3, 5):
        check(out[k], gs[k])
    np.testing.assert_array_equal(out[4].full(), gs[4])
    assert out[1].placements == (R,)
    if comm.size > 1:
        assert [ix for _, ix in mp.fused] == [(0, 2, 3, 5)]
        assert mp.single == (1, 4) and "one alltoallv" in text and "array 1:" in text
    mesh.free()


def test_nd_mesh_groups_by_communicator(comm):
    for mshape in MESHES.get(comm.size, []):
        if len(mshape) != 2:
            continue
        mesh = ps.Mesh(comm, mshape)
        gs = [
            make_global((2 * mshape[0] + k, 3 * mshape[1] + 1), "float64", seed=k) for k in range(4)
        ]
        xs = [ps.distribute(g, mesh, [S0, S1]) for g in gs]
        # swap the mesh dims (one whole-mesh exchange each) and a per-dim transpose
        targets = [[S1, S0], [S1, S0], [S0, R], [S1, S0]]
        out = ps.redistribute_many(xs, targets)
        for y, g in zip(out, gs):
            check(y, g)
        mesh.free()


@pytest.mark.parametrize("container", [list, dict])
def test_uneven_target_sizes(comm, container):
    """sizes= per array (uneven, empty shards; arrays left out are balanced): still one fused
    exchange, every shard the oracle's box."""
    p = comm.size
    mesh = ps.Mesh(comm, (p,))
    gs, xs = arrays(comm, mesh, n=6)
    per = [None] * len(xs)
    per[1] = {1: [gs[1].shape[1]] + [0] * (p - 1)}  # everything on the first shard
    per[4] = {1: [0] * (p - 1) + [gs[4].shape[1]]}  # everything on the last
    if container is dict:
        inp = {f"w{k}": x for k, x in enumerate(xs)}
        sizes = {f"w{k}": sz for k, sz in enumerate(per) if sz is not None}
    else:
        inp, sizes = xs, per
    before = ps.comm_stats()
    out = ps.redistribute_many(inp, [S1], sizes=sizes)
    got = counts_since(before)
    ys = list(out.values()) if container is dict else out
    for k, (y, g) in enumerate(zip(ys, gs)):
        check(y, g)
        if per[k] is not None:
            assert y.layout.sizes[1] == tuple(per[k][1])
    if p > 1:
        assert got == auto_exchange(mesh, {"alltoallv": 1}), got
        assert ps.plan_many(inp, [S1], sizes=sizes).collectives == 1
    # arrays that run on their own keep their sizes too
    out = ps.redistribute_many(xs[:2], [[R], [S1]], sizes=[None, per[1]])
    np.testing.assert_array_equal(out[0].full(), gs[0])
    check(out[1], gs[1])
    assert out[1].layout.sizes[1] == tuple(per[1][1])
    mesh.free()


@pytest.mark.usefixtures("staged")
def test_staged(comm):
    mesh = ps.Mesh(comm, (comm.size,))
    gs, xs = arrays(comm, mesh, n=5)
    before = ps.comm_stats()
    for y, g in zip(ps.redistribute_many(xs, [S1]), gs):
        check(y, g)
    if comm.size > 1:
        assert counts_since(before) == {"alltoallv": 1, "staged": 1}
    mesh.free()


def test_errors_before_communication(comm):
    mesh = ps.Mesh(comm, (comm.size,))
    other = ps.Mesh(comm, (comm.size,))
    gs, xs = arrays(comm, mesh, n=3)
    before = ps.comm_stats()
    with pytest.raises(ValueError, match="another mesh"):
        ps.redistribute_many([xs[0], ps.distribute(gs[1], other, [S0])], [S1])
    with pytest.raises(ValueError, match="2 placement lists for 3 arrays"):
        ps.redistribute_many(xs, [[S1], [S1]])
    with pytest.raises(ValueError, match="missing"):
        ps.redistribute_many({"a": xs[0], "b": xs[1]}, {"a": [S1]})
    with pytest.raises(TypeError, match="list, tuple or dict"):
        ps.redistribute_many(xs[0], [S1])
    with pytest.raises(ValueError):
        ps.redistribute_many(xs, [Shard(5)])
    with pytest.raises(ValueError, match="2 sizes for 3 arrays"):
        ps.redistribute_many(xs, [S1], sizes=[None, None])
    with pytest.raises(ValueError, match="not in arrays"):
        ps.redistribute_many({"a": xs[0]}, [S1], sizes={"b": {1: [1] * comm.size}})
    with pytest.raises(TypeError, match="expected a list"):
        ps.redistribute_many(xs, [S1], sizes={0: {1: [1] * comm.size}})
    with pytest.raises(ValueError):  # extents that do not add up
        ps.redistribute_many(xs, [S1], sizes=[{1: [99] * comm.size}, None, None])
    assert counts_since(before) == {}
    assert ps.redistribute_many([], [S1]) == []
    mesh.free()
    other.free()


@pytest.mark.parametrize("shm", ["auto", "off"])
def test_unknown_algorithm_raises_before_communication(comm, shm):
    """An unknown algorithm raises the ValueError redistribute raises, on every rank, before
    anything moves: whether the arrays would fuse, go through node-shared memory or run on
    their own, and for no arrays at all (whose placements are checked too)."""
    mesh = ps.Mesh(comm, (comm.size,))
    small = ps.distribute(make_global((6, 4), "float64"), mesh, [S0])
    big = ps.distribute(make_global((512, 256), "float64"), mesh, [S0])  # 1 MiB: on its own
    before = ps.comm_stats()
    with ps.config.override(PYSHARD_SHM=shm):
        for xs in ([small], [small, big], {"s": small, "b": big}, [big]):
            for bad in ("bogus", "", "SHM"):
                with pytest.raises(ValueError, match="algorithm must be"):
                    ps.redistribute_many(xs, [S1], algorithm=bad)
        with pytest.raises(ValueError, match="algorithm must be"):
            ps.redistribute_many([], [S1], algorithm="bogus")
        with pytest.raises(ValueError, match="algorithm must be"):
            ps.redistribute_many({}, [S1], algorithm="bogus")
    assert counts_since(before) == {}
    with pytest.raises(TypeError, match="placements"):
        ps.redistribute_many([], "S1")
    with pytest.raises(TypeError, match=r"placements\[0\]"):
        ps.redistribute_many([], [1])
    with pytest.raises(ValueError, match="1 placement lists for 0 arrays"):
        ps.redistribute_many([], [[S1]])
    with pytest.raises(ValueError, match="extra"):
        ps.redistribute_many({}, {"a": [S1]})
    with pytest.raises(ValueError, match="1 sizes for 0 arrays"):
        ps.redistribute_many([], [S1], sizes=[None])
    assert ps.redistribute_many([], [S1], algorithm="tune") == []
    assert ps.redistribute_many({}, {}) == {}
    mesh.free()


@pytest.mark.mpi(min_size=4)
def test_tune_keeps_ranks_in_step_where_only_some_communicators_share_a_node(
    comm, monkeypatch
):
    """algorithm="tune" on a 2-D mesh whose communicators over mesh dim 0 differ in whether
    their ranks share a node (simulated nodes, PYSHARD_NODE_SIZE): where they do, an array's
    exchange moves in a node-shared batch; where not, it runs on its own and is tuned, which
    is collective over the whole mesh, so the first ranks take part in that tuning too."""
    from mpi4py import MPI

    from pyshard.route import batch_route

    dims = tuple(MPI.Compute_dims(comm.size, 2))
    if min(dims) < 2 or comm.size != MPI.COMM_WORLD.size:
        pytest.skip(f"no 2-D mesh with both dims > 1 at {comm.size} ranks")

    def columns_share(k):  # per column of the mesh (dim 0's communicators), on one host
        return [len({(i * dims[1] + j) // k for i in range(dims[0])}) < dims[0]
                for j in range(dims[1])]

    ks = [k for k in range(2, comm.size) if len(set(columns_share(k))) == 2]
    if not ks:
        pytest.skip(f"no node size splits the columns of {dims}")
    monkeypatch.setenv("PYSHARD_NODE_SIZE", str(ks[0]))
    monkeypatch.delenv("PYSHARD_TUNE_FILE", raising=False)
    g = make_global((8 * dims[0], 6 * dims[1]), "float64", seed=3)
    with ps.config.override(PYSHARD_SHM_MIN_BYTES=0, PYSHARD_MANY_FUSE_MAX_BYTES=1):
        mesh = ps.Mesh(comm, dims)
        xs = [ps.distribute(g, mesh, [S0, R]), ps.distribute(g + 1, mesh, [S0, R])]
        mp = ps.plan_many(xs, [S1, R])
        paths = comm.allgather(
            batch_route("alltoallv", (0,), mp.block_bytes((0,)), mesh, "tune").path
        )
        if len(set(paths)) != 2:  # node-shared memory off, or several hosts
            mesh.free()
            pytest.skip(f"the columns take {paths}")
        for _ in range(2):  # tuned, then the choice kept
            ys = ps.redistribute_many(xs, [S1, R], algorithm="tune")
            check(ys[0], g)
            check(ys[1], g + 1)
        tuned = sorted(mesh.cache.tuned.items())
        assert tuned and comm.allgather(tuned) == [tuned] * comm.size
        mesh.free()


@pytest.mark.parametrize("algorithm", ["auto", "shm", "alltoallv"])
def test_a_local_of_another_dtype_raises_before_moving(comm, algorithm):
    """A .local replaced by an array of another dtype (on every rank here): TypeError naming
    the array, before any communication, as redistribute raises; the fused and node-shared
    batches moved the layout's bytes from it (garbage values; a segfault for large ones)."""
    mesh = ps.Mesh(comm, (comm.size,))
    g = make_global((4 * comm.size, 6), "float64")
    xs = [ps.distribute(g, mesh, [Shard(0)]) for _ in range(3)]
    xs[1].local = xs[1].local.astype(np.int8)
    before = ps.comm_stats()
    with pytest.raises(TypeError, match=r"arrays\[1\]'s local array has dtype int8, its layout "
                                        r"float64"):
        ps.redistribute_many(xs, [Shard(1)], algorithm=algorithm)
    assert ps.comm_stats() == before
    xs[1] = ps.distribute(g, mesh, [Shard(0)])
    for y in ps.redistribute_many(xs, [Shard(1)], algorithm=algorithm):
        np.testing.assert_array_equal(y.local, g[y.box])
    mesh.free()


@pytest.mark.mpi(min_size=2)
def test_validation_compares_the_resolved_algorithm(comm):
    """Under validation, algorithm=None on one rank and "auto" on the others (the same
    collectives) agree, as redistribute's do; they raised "algorithm: rank 0: None"."""
    mesh = ps.Mesh(comm, (comm.size,))
    g = make_global((4 * comm.size, 6), "float64")
    xs = [ps.distribute(g, mesh, [Shard(0)]) for _ in range(2)]
    with ps.config.override(PYSHARD_VALIDATE=True, PYSHARD_ALGORITHM=None):
        ys = ps.redistribute_many(xs, [Shard(1)], algorithm=None if comm.rank == 0 else "auto")
    for y in ys:
        np.testing.assert_array_equal(y.local, g[y.box])
    mesh.free()


@pytest.mark.parametrize("algorithm", ["auto", "shm", "alltoallv"])
def test_a_local_of_another_shape_names_the_array(comm, algorithm):
    """A .local replaced by an array of another shape (every rank here): ValueError naming the
    array and both shapes, as redistribute's (the core's said "a source has a shape that does
    not match the planned layout")."""
    mesh = ps.Mesh(comm, (comm.size,))
    g = make_global((4 * comm.size, 6), "float64")
    xs = [ps.distribute(g, mesh, [Shard(0)]) for _ in range(3)]
    xs[2].local = np.zeros((3, 4))
    # (one rank: no exchange to fuse, and redistribute's own message names the shapes)
    arr = r"arrays\[2\]'s " if comm.size > 1 else ""
    with pytest.raises(ValueError, match=arr + r"local array has shape \(3, 4\), (its|the) "
                                         r"layout puts \(4, 6\)"):
        ps.redistribute_many(xs, [Shard(1)], algorithm=algorithm)
    mesh.free()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("case", ["placement", "sizes", "notarray", "shape"])
def test_validation_catches_one_ranks_bad_batch(comm, case):
    """Validation mode: one rank's bad batch (a placement its arrays cannot take, a sizes list
    of the wrong length, an ndarray among the arrays, a .local replaced by one of another
    shape) raises on every rank. That rank raised alone and the others waited for it until
    PYSHARD_PEER_TIMEOUT, or (the shape) in the fused exchange for ever."""
    mesh = ps.Mesh(comm, (comm.size,))
    g = make_global((4 * comm.size, 6), "float64")
    xs = [ps.distribute(g, mesh, [Shard(0)]) for _ in range(2)]
    target, kw = [Shard(1)], {}
    if comm.rank == 0:
        if case == "placement":
            target = [Shard(5)]
        elif case == "sizes":
            kw = {"sizes": [None]}
        elif case == "notarray":
            xs[1] = xs[1].local
        else:
            xs[1].local = xs[1].local[:-1]
    with ps.config.override(PYSHARD_VALIDATE=True):
        with pytest.raises(ValueError) as e:
            ps.redistribute_many(xs, target, **kw)
    msg = str(e.value)
    assert "rank 0: " in msg and comm.allgather(msg) == [msg] * comm.size, msg
    mesh.free()


def test_containers_rebuilt_and_plan_many_checked(comm):
    """A defaultdict comes back a defaultdict and a namedtuple a namedtuple (both raised
    TypeError after the exchange had run); plan_many refuses arrays on two meshes or a
    non-array, as redistribute_many does (it planned them, and explain() then failed)."""
    import collections

    mesh = ps.Mesh(comm, (comm.size,))
    other = ps.Mesh(comm, (comm.size, 1))
    g = make_global((4 * comm.size, 6), "float64")
    a, b = (ps.distribute(g, mesh, [Shard(0)]) for _ in range(2))
    dd = collections.defaultdict(list, {"a": a, "b": b})
    out = ps.redistribute_many(dd, [Shard(1)])
    assert type(out) is collections.defaultdict and out.default_factory is list
    Pair = collections.namedtuple("Pair", "a b")
    out2 = ps.redistribute_many(Pair(a, b), [Shard(1)])
    assert type(out2) is Pair
    for y in (*out.values(), *out2):
        np.testing.assert_array_equal(y.local, g[y.box])
    c = ps.distribute(g, other, [Shard(0), Replicate()])
    with pytest.raises(ValueError, match="^plan_many: .*every array must share one Mesh"):
        ps.plan_many([a, c], [Shard(1)])
    with pytest.raises(TypeError, match=r"^plan_many: arrays\[0\] is a int"):
        ps.plan_many([3], [Shard(1)])
    with pytest.raises(TypeError, match=r"arrays\[0\] is a ndarray, not a ShardedArray"):
        ps.redistribute_many([a.local, b], [Shard(1)])
    mesh.free()
    other.free()
