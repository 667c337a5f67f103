"""The path past 2^31-1 that MPI libraries without large-count calls take (Open MPI 4 and 5),
run cheaply on every library: the core's count limit is lowered to LIMIT, so every count or
displacement above it travels as the non-native path moves it: derived datatypes (one type
of n bytes; v-collectives as MPI_Alltoallw with a type per peer block; a subarray built from
byte runs) and reductions in rounds. Every exchange algorithm, the
gathers, the reductions, the halo methods and the overlapped (nonblocking) exchange, against
numpy; the same collectives are counted as without the limit."""

from __future__ import annotations

import numpy as np
import pytest
from oracle import contributions, halo_expected, make_global, make_global_box

import pyshard as ps
from pyshard import Partial, Replicate, Shard

pytestmark = pytest.mark.mpi  # run under mpiexec with --with-mpi (pytest-mpi)

LIMIT = 1000  # bytes (elements for reductions); not a power of two: remainders everywhere
S0, S1, R = Shard(0), Shard(1), Replicate()


@pytest.fixture
def limited():
    old = ps.build_info()["count_limit"]
    with ps.config.override(PYSHARD_COUNT_LIMIT=LIMIT):
        ps.reset_comm_stats()  # and ps.large_count_stats()
        info = ps.build_info()
        assert info["count_limit"] == LIMIT
        assert (info["large_count"], info["large_count_reduce"]) == ("datatype", "split")
        yield
    assert ps.build_info()["count_limit"] == old


def ran(comm):
    """The non-native ways that ran on any rank."""
    return set().union(*comm.allgather(set(ps.large_count_stats())))


def counts_since(before):
    now = ps.comm_stats()
    return {k: v - before.get(k, 0) for k, v in now.items() if v - before.get(k, 0)}


def test_limit_bounds():
    """The setting takes [8, 2^31-1] (the core's own bounds: tests/test_core.py)."""
    old = ps.build_info()["count_limit"]
    for bad in (7, 2**31):
        with pytest.raises(ValueError, match=r"PYSHARD_COUNT_LIMIT must be an integer in \[8, "):
            ps.config.set("PYSHARD_COUNT_LIMIT", bad)
    assert ps.build_info()["count_limit"] == old


@pytest.mark.parametrize("algorithm", ["alltoallv", "alltoall", "p2p", "alltoallw"])
@pytest.mark.parametrize("dtype", ["uint8", "float64"])
def test_exchanges(comm, limited, algorithm, dtype):
    """Transposes, and rebalances onto rank 0 of a 1-D array: blocks and offsets over LIMIT
    bytes (one datatype per such block)."""
    mesh = ps.Mesh(comm, (comm.size,))
    P = comm.size
    onto0 = {0: [1001 * P - 1] + [0] * (P - 1)}
    cases = [((3 * P + 2, 1001), S1, None), ((37, 2 * P + 1), S1, None),
             ((1001 * P - 1,), S0, onto0)]  # fmt: skip
    for shape, dst, sizes in cases:
        g = make_global(shape, dtype, seed=shape[0])
        x = ps.distribute(g, mesh, [S0])
        before = ps.comm_stats()
        y = x.redistribute([dst], sizes=sizes, algorithm=algorithm)
        np.testing.assert_array_equal(y.local, g[y.box])
        if P > 1:
            want = "alltoallv" if algorithm == "alltoallw" else algorithm
            got = counts_since(before)
            assert got.get(algorithm, 0) + got.get(want, 0) >= 1, got
        z = y.redistribute([S0], algorithm=algorithm)
        np.testing.assert_array_equal(z.local, g[z.box])
    if P > 1:
        kinds = ran(comm)
        need = {"alltoallv": "per_peer", "alltoall": "bytes", "p2p": "bytes",
                "alltoallw": "subarray"}[algorithm]  # fmt: skip
        assert need in kinds, kinds


def test_overlapped_exchange(comm, limited):
    """Blocks of 1 MiB or more take the nonblocking Ialltoallv (own block copied meanwhile),
    as MPI_Ialltoallw with a datatype per peer block."""
    P = comm.size
    if P > 8:  # a block of 1 MiB between every pair: P^2 MiB, 12 s at 12 ranks on 2 cores
        pytest.skip("P^2 blocks of 1 MiB: the same path runs at 2-8 ranks")
    mesh = ps.Mesh(comm, (P,))
    small = (5, 7)  # the box generator is make_global's slice
    box = (slice(1, 4), slice(2, 7))
    np.testing.assert_array_equal(make_global_box(small, "uint8", box, 3),
                                  make_global(small, "uint8", seed=3)[box])
    for dtype, n in [("float32", 560), ("uint8", 1100)]:
        shape = (P * n, P * n + 1)  # each rank builds its own blocks, not the whole array
        lay = ps.Layout(shape, dtype, mesh.shape, [S0])
        mine = make_global_box(shape, dtype, lay.box(mesh.coords), seed=3)
        x = ps.from_local(mine, mesh, [S0], global_shape=shape)
        y = x.redistribute([S1], algorithm="alltoallv")
        np.testing.assert_array_equal(y.local, make_global_box(shape, dtype, y.box, seed=3))
    if P > 1:
        assert {"alltoallw", "per_peer"} <= ran(comm)


@pytest.mark.parametrize("dtype", ["uint8", "float32"])
def test_gathers(comm, limited, dtype):
    """Allgather (even blocks) and Allgatherv (uneven; with and without a common unit)."""
    P = comm.size
    mesh = ps.Mesh(comm, (P,))
    cases = [((3 * P, 401), None), ((3 * P + 1, 401), None),
             ((1001 * P + 1, 1001), {0: [1002] + [1001] * (P - 1)})]  # fmt: skip
    for shape, sizes in cases:
        g = make_global(shape, dtype, seed=shape[0])
        x = ps.distribute(g, mesh, [S0], sizes=sizes)
        y = x.redistribute([R], algorithm="alltoallv")  # an MPI algorithm: MPI's gathers
        np.testing.assert_array_equal(y.local, g)
    if P > 1:
        assert {"bytes", "alltoallw", "per_peer"} <= ran(comm)


@pytest.mark.parametrize("dtype", ["int32", "float64"])
def test_reductions(comm, limited, dtype):
    """Allreduce, Reduce_scatter_block and Reduce_scatter of more than LIMIT elements, in
    rounds; contributions whose sums are exact."""
    P = comm.size
    mesh = ps.Mesh(comm, (P,))
    for shape, dst in [((3, 701), R), ((3 * P, 401), S0), ((3 * P + 1, 401), S0)]:
        parts, ref = contributions(shape, dtype, P, "sum", seed=shape[0])
        x = ps.from_local(parts[mesh.rank].copy(), mesh, [Partial("sum")], global_shape=shape)
        y = x.redistribute([dst], algorithm="alltoallv")  # MPI's reductions, not the node's
        np.testing.assert_array_equal(y.local, ref[y.box])
    if P > 1:
        assert "split" in ran(comm)


@pytest.mark.parametrize("method", ["persistent", "p2p", "datatype", "neighbor"])
def test_halo(comm, limited, method):
    """Halo messages over LIMIT bytes on a 2-D mesh, periodic, with corners."""
    P = comm.size
    mshape = (2, P // 2) if P % 2 == 0 else (P, 1)
    mesh = ps.Mesh(comm, mshape)
    shape = (2 * mshape[0] + 40, 1100 * mshape[1] + 3)  # padded rows over LIMIT elements
    g = make_global(shape, "float64", seed=5)
    x = ps.distribute(g, mesh, [S0, S1])
    h = x.with_halo((2, 3), periodic=True, corners=True, method=method)
    inner = h.interior.copy()
    h.padded[...] = 77
    h.interior[...] = inner
    for _ in range(2):
        h.update()
        box = x.layout.box(mesh.coords)
        want = halo_expected(g, [b.start for b in box], [b.stop for b in box], h.width,
                             h.periodic, h.corners, 77)  # fmt: skip
        np.testing.assert_array_equal(h.padded, want)
    if P > 1:
        need = {"datatype": "subarray", "neighbor": "neighbor_alltoallw"}.get(method, "bytes")
        assert need in ran(comm)
