"""Every redistribution on a 1-D mesh, against a numpy oracle, with exact collective counts.

Runs at any communicator size (1, 2, 3, 4, 7, ...): each rank compares its shard with
``global[box]`` of a deterministically generated global array.
"""

from __future__ import annotations

import numpy as np
import pytest
from oracle import DTYPES, auto_exchange, contributions, make_global, reducible

import pyshard as ps
from pyshard import Partial, Replicate, Shard

pytestmark = pytest.mark.mpi  # run under mpiexec with --with-mpi (pytest-mpi)

S0, S1, R = Shard(0), Shard(1), Replicate()


def shapes_for(p):
    return [
        (13, 7),  # uneven
        (4 * p, 2 * p),  # even
        (3, 5),  # smaller than the mesh on dim 0 (when p > 3)
        (2, 1),  # smaller than the mesh on both dims
        (0, 5),  # zero-size
    ]


def expected_counts(src, dst, p, shape, algorithm="auto"):
    """Collectives the planner runs for a 1-D mesh of size p: regular collectives
    (Allgather, Reduce_scatter_block) where every block has the same size (the dims involved
    divide evenly), the v-variants where they do not; exchanges as choose_algorithm says."""

    def even(d):  # every shard along array dim d has the same extent (or every block is empty)
        return shape[d] % p == 0 or 0 in shape

    if p == 1 or src == dst:
        return {}
    if isinstance(src, Partial):
        if isinstance(dst, Shard):
            return {"reduce_scatter_block" if even(dst.dim) else "reduce_scatter": 1}
        return {"allreduce": 1}
    if isinstance(src, Shard):
        if isinstance(dst, Shard):
            if algorithm != "auto":
                return {ALGO_KEY[algorithm]: 1}
            # point-to-point when a rank sends to at most a quarter of the ranks; else
            # Alltoallv (measured faster than a regular Alltoall here even for equal blocks)
            peers = min(p - 1, min(shape[dst.dim], p) if shape[src.dim] else 0)
            return {"p2p" if 4 * peers <= p else "alltoallv": 1}
        if isinstance(dst, Partial) and dst.op != "avg":
            return {}  # the shard inside the op's identity: no communication
        # to Replicate, or Partial(avg) (gather, then keep)
        return {"allgather" if even(src.dim) else "allgatherv": 1}
    return {}  # Replicate -> Shard / Partial: local


def counts_since(before):
    now = ps.comm_stats()
    return {k: v - before.get(k, 0) for k, v in now.items() if v - before.get(k, 0)}


def make_source(g, mesh, src, dtype, seed):
    """A ShardedArray of global value ``g`` (or partial contributions summing to it)."""
    if isinstance(src, Partial):
        parts, ref = contributions(g.shape, dtype, mesh.size, src.op, seed)
        x = ps.from_local(parts[mesh.rank].copy(), mesh, [src], global_shape=g.shape)
        return x, ref
    return ps.distribute(g, mesh, [src]), g


def check_result(y, ref, dst, mesh, approx=False, from_replicate=True):
    """Compare this rank's shard with the oracle; for Partial targets, check the reduction.

    ``approx``: an average rounds differently from the float64 oracle; compare to 1e-6.
    """
    assert y.placements == (dst,)
    assert y.local.flags.c_contiguous
    same = np.testing.assert_array_equal
    if approx:

        def same(a, b):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)

    if isinstance(dst, Partial):
        same(y.full(), ref)
        if dst.op == "sum" and mesh.coords[0] != 0 and from_replicate:
            assert not np.any(y.local)
    else:
        same(y.local, ref[y.box])
        assert y.local.dtype == ref.dtype


PAIRS = [
    (S0, S1),
    (S1, S0),
    (S0, R),
    (S1, R),
    (R, S0),
    (R, S1),
    (Partial("sum"), R),
    (Partial("sum"), S0),
    (Partial("sum"), S1),
    (Partial("max"), R),
    (Partial("min"), S1),
    (Partial("avg"), S0),
    (R, Partial("sum")),
    (R, Partial("max")),
    (S0, Partial("sum")),
    (S1, Partial("max")),
    (S0, Partial("min")),
    (S1, Partial("avg")),
    (Partial("sum"), Partial("max")),
    (S0, S0),
    (R, R),
]


ALGO_KEY = {
    "alltoallv": "alltoallv",
    "alltoall": "alltoall",
    "p2p": "p2p",
    "alltoallw": "alltoallw",
}


@pytest.mark.parametrize("algorithm", ["alltoall", "p2p", "alltoallw"])
@pytest.mark.parametrize("src,dst", [(S0, S1), (S1, S0)], ids=["S0->S1", "S1->S0"])
def test_exchange_algorithms(comm, src, dst, algorithm):
    """The padded Alltoall and point-to-point exchanges give the same shards."""
    test_pair_all_shapes_and_dtypes(comm, src, dst, algorithm)


@pytest.mark.parametrize("src,dst", PAIRS, ids=[f"{a}->{b}" for a, b in PAIRS])
def test_pair_all_shapes_and_dtypes(comm, src, dst, algorithm="auto"):
    failures = sweep_pair(comm, src, dst, algorithm)
    assert not failures, "\n".join(failures[:10])


def sweep_pair(
    comm, src, dst, algorithm="auto", dtypes=DTYPES, want=expected_counts,
    make=make_source, check=check_result,
):  # fmt: skip
    """``src -> dst`` for every shape of ``shapes_for`` and every dtype its ops can reduce:
    the collectives counted against ``want(src, dst, p, shape, algorithm)`` and the shard
    against the oracle (``make`` builds the source, ``check`` compares). The failures."""
    mesh = ps.Mesh(comm, (comm.size,))
    failures = []
    ops = [p.op for p in (src, dst) if isinstance(p, Partial)]
    for shape in shapes_for(comm.size):
        for dtype in dtypes:
            if not reducible(ops, dtype):
                continue
            g = make_global(shape, dtype, seed=len(shape))
            x, ref = make(g, mesh, src, dtype, seed=3)
            before = ps.comm_stats()
            y = x.redistribute([dst], algorithm=algorithm)
            got = counts_since(before)
            ex = [s for s in x.plan_to([dst]).steps if s.kind == "alltoallv"]
            w = auto_exchange(
                mesh,
                want(src, dst, comm.size, shape, algorithm),
                algorithm,
                step=ex[0] if ex else None,
            )
            try:
                assert got == w, f"collectives {got} != {w}"
                check(y, ref, dst, mesh, approx="avg" in ops, from_replicate=src == R)
            except AssertionError as e:
                failures.append(f"{src}->{dst} {shape} {dtype}: {e}")
    return failures


def test_unsupported_reductions_are_clear_errors(comm):
    mesh = ps.Mesh(comm, (comm.size,))
    z = ps.distribute(np.zeros((4, 3), np.complex128), mesh, [R])
    with pytest.raises(ValueError, match="complex"):
        z.redistribute([Partial("max")])
    i = ps.distribute(np.zeros((4, 3), np.int32), mesh, [R])
    with pytest.raises(ValueError, match="avg"):
        i.redistribute([Partial("avg")])


@pytest.mark.parametrize("rule", ["explicit", "chunk"])
def test_rebalance_uneven_sizes_with_zeros(comm, rule):
    """Shard(0) with sizes A -> Shard(0) with sizes B: one Alltoallv, exact shards."""
    p = comm.size
    mesh = ps.Mesh(comm, (p,))
    n = 5 * p + 3
    a = [0] * p
    a[0] = n  # everything on rank 0
    if rule == "chunk":
        b = list(ps.split_sizes(n, p, "chunk"))
    else:
        b = [0] * p
        b[-1] = n - (p - 1)  # everything but a row each on the last rank
        for i in range(p - 1):
            b[i] = 1
    g = make_global((n, 6), "float64")
    x = ps.distribute(g, mesh, [S0], sizes={0: a})
    assert x.layout.sizes == {0: tuple(a)}
    before = ps.comm_stats()
    y = x.redistribute([S0], sizes={0: b})
    ex = [s for s in x.plan_to([S0], sizes={0: b}).steps if s.kind == "alltoallv"]
    want = auto_exchange(
        mesh, {"alltoallv": 1} if p > 1 and a != b else {}, step=ex[0] if ex else None
    )
    assert counts_since(before) == want
    np.testing.assert_array_equal(y.local, g[y.box])
    assert y.local.shape[0] == b[mesh.rank]
    # and back
    z = y.redistribute([S1], sizes={1: [6] + [0] * (p - 1)})
    np.testing.assert_array_equal(z.local, g[z.box])


def test_out_buffer(comm):
    mesh = ps.Mesh(comm, (comm.size,))
    # a row a rank at least: an empty shard overlaps nothing (the overlap check below)
    g = make_global((max(10, comm.size), 6), "float64")
    x = ps.distribute(g, mesh, [S0])
    for dst in ([S1], [R], [S0]):
        out = np.full(x.layout.replace(dst).local_shape(mesh.coords), -1.0)
        y = x.redistribute(dst, out=out)
        assert y.local is out
        np.testing.assert_array_equal(out, g[y.box])
    with pytest.raises(ValueError, match="out has shape"):
        x.redistribute([S1], out=np.empty((99, 1)))
    with pytest.raises(ValueError, match="overlap"):
        x.redistribute([S0], out=x.local)


def test_same_layout_shares_memory(comm):
    mesh = ps.Mesh(comm, (comm.size,))
    # a row a rank at least: an empty shard shares memory with nothing
    g = make_global((max(9, comm.size), 4), "float32")
    x = ps.distribute(g, mesh, [S0])
    before = ps.comm_stats()
    y = x.redistribute([S0])
    assert counts_since(before) == {}
    assert np.shares_memory(x.local, y.local)
    z = x.redistribute([S1])
    assert not np.shares_memory(x.local, z.local)


def test_physicsnemo_anchor_uneven_to_empty_shards(comm):
    """PhysicsNeMo's crash: local (8, (r+1)*4, 2), Shard(1) -> Shard(2); target shards of
    an extent-2 dim over more than 2 ranks are empty."""
    p, r = comm.size, comm.rank
    mesh = ps.Mesh(comm, (p,))
    widths = [(k + 1) * 4 for k in range(p)]
    g = make_global((8, sum(widths), 2), "float32")
    off = sum(widths[:r])
    local = g[:, off : off + widths[r], :].copy()
    before = ps.comm_stats()
    x = ps.from_local(local, mesh, [S1])  # learns the extents: one Allgather
    assert counts_since(before) == ({"allgather": 1} if p > 1 else {"allgather": 1})
    assert x.global_shape == g.shape
    assert x.layout.sizes == {1: tuple(widths)}
    before = ps.comm_stats()
    y = x.redistribute([Shard(2)])
    # every rank sends to the (at most 2) ranks of a non-empty target shard: point-to-point
    # once that is at most a quarter of the ranks (pyshard.route.choose_algorithm)
    want = {} if p == 1 else {"p2p" if 4 * min(2, p - 1) <= p else "alltoallv": 1}
    step = x.plan_to([Shard(2)]).steps[-1]
    assert counts_since(before) == auto_exchange(mesh, want, step=step)
    np.testing.assert_array_equal(y.local, g[y.box])
    if p > 2:
        assert any(e == 0 for e in y.layout.sizes[2])
    # the same, with the shapes given: no communication to build it
    before = ps.comm_stats()
    x2 = ps.from_local(local, mesh, [S1], global_shape=g.shape, sizes={1: widths})
    assert counts_since(before) == {}
    assert x2.layout == x.layout


def test_vocabulary_and_anchor_splits(comm):
    mesh = ps.Mesh(comm, (comm.size,))
    g = make_global((101, 3), "float32")
    x = ps.distribute(g, mesh, [S0])
    assert sum(x.layout.sizes[0]) == 101
    if comm.size == 2:
        assert x.layout.sizes[0] == (51, 50)
    y = x.redistribute([S1]).redistribute([R])
    np.testing.assert_array_equal(y.local, g)
    assert np.array_equal(x.full(), g)


def test_chain_round_trip_is_bitwise(comm):
    mesh = ps.Mesh(comm, (comm.size,))
    g = make_global((11, 5, 3), "complex128")
    x = ps.distribute(g, mesh, [S0])
    y = x.redistribute([Shard(2)]).redistribute([S1]).redistribute([R]).redistribute([S0])
    assert y.layout == x.layout
    assert x.local.tobytes() == y.local.tobytes()


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "complex128"])
@pytest.mark.parametrize("path", ["shm", "mpi"])
def test_through_partial_sum_keeps_negative_zero(comm, dtype, path):
    """Shard or Replicate -> Partial("sum") -> Shard/Replicate gives every value back bit for
    bit, -0.0 included: the other ranks hold the sum's identity, IEEE's -0.0 (they held
    +0.0, and -0.0 + 0.0 is +0.0)."""
    mesh = ps.Mesh(comm, (comm.size,))
    g = make_global((4 * comm.size + 3, 3), dtype, seed=2)
    g[::2, 1] = -0.0 if dtype != "complex128" else complex(-0.0, -0.0)
    g[1::3, 0] = complex(-0.0, 1.0) if dtype == "complex128" else 0.0
    setting = {"PYSHARD_SHM_MIN_BYTES": 0} if path == "shm" else {"PYSHARD_SHM": "off"}
    with ps.config.override(**setting):
        for src in ([S0], [R]):
            x = ps.distribute(g, mesh, src)
            p = x.redistribute([Partial("sum")])
            for dst in ([R], [S0], [S1]):
                y = p.redistribute(dst)
                assert y.local.tobytes() == np.ascontiguousarray(g[y.box]).tobytes(), (src, dst)
    mesh.free()


def test_full_reduces_partial(comm):
    mesh = ps.Mesh(comm, (comm.size,))
    parts, ref = contributions((6, 5), "int64", comm.size, "sum", seed=9)
    x = ps.from_local(parts[comm.rank], mesh, [Partial("sum")], global_shape=(6, 5))
    np.testing.assert_array_equal(x.full(), ref)


@pytest.mark.parametrize("algorithm", ["auto", "alltoallv", "p2p", "alltoallw", "alltoall"])
def test_large_skewed_blocks(comm, algorithm):
    """Blocks of a few MiB on some ranks and a few KiB on others: every path that depends
    on block size must still make every rank call the same collective (a rank-local choice
    between Alltoallv and Ialltoallv once hung here)."""
    p = comm.size
    mesh = ps.Mesh(comm, (p,))
    n, m = 1031, 700  # float32: ~2.8 MiB in all, 7/8 of it on rank 0
    rest = n // 8
    tail = [rest // (p - 1) + (i < rest % (p - 1)) for i in range(p - 1)] if p > 1 else []
    sizes = [n - sum(tail)] + tail
    g = make_global((n, m), "float32", seed=4)
    x = ps.distribute(g, mesh, [S0], sizes={0: sizes})
    for dst, dsizes in [([S0], None), ([S1], None), ([S0], {0: sizes[::-1]})]:
        y = x.redistribute(dst, dsizes, algorithm=algorithm)
        np.testing.assert_array_equal(y.local, g[y.box])
        back = y.redistribute([S0], {0: sizes}, algorithm=algorithm)
        assert back.local.tobytes() == x.local.tobytes()


@pytest.mark.parametrize("path", ["shm", "mpi"])
@pytest.mark.parametrize("dtype", ["float64", "float32", "float16"])
def test_max_min_with_nan_as_numpy(comm, path, dtype):
    """Partial(max/min) with NaN in some contributions gives numpy.maximum/minimum.reduce of
    them: NaN wins, whichever rank holds it. MPI's builtin MPI_MAX/MPI_MIN (MPICH's kept or
    dropped a NaN by the rank that held it and the algorithm's pairing) and the node-shared
    reduce's ``a < b ? b : a`` both lost NaNs, on every size; sizes here cross the MPI
    libraries' algorithm switches (short, medium, long messages)."""
    p = comm.size
    mesh = ps.Mesh(comm, (p,))
    setting = {"PYSHARD_SHM_MIN_BYTES": 0} if path == "shm" else {"PYSHARD_SHM": "off"}
    # the NaN's rank: every one up to 4 ranks; past that, the ends, the second and the middle
    # (every rank builds every rank's part: p^2 parts, 15 s a run at 12 ranks on 2 cores)
    ats = range(p) if p <= 4 else sorted({0, 1, p // 2, p - 1})
    with ps.config.override(**setting):
        for n in (5, 3001, 70001):
            for op, ufunc in (("max", np.maximum), ("min", np.minimum)):
                for at in ats:
                    parts = [make_global((n,), dtype, seed=20 + k) for k in range(p)]
                    parts[at][1] = np.nan  # one rank's NaN
                    parts[(at + 1) % p][n // 2] = np.nan  # another's (the same rank at p=1)
                    parts[at][n - 1] = np.inf if op == "max" else -np.inf  # not lost either
                    ref = ufunc.reduce(np.stack(parts), axis=0)
                    x = ps.from_local(parts[comm.rank], mesh, [Partial(op)], global_shape=(n,))
                    for dst in (R, S0):
                        y = x.redistribute([dst])
                        np.testing.assert_array_equal(y.local, ref[y.box])
