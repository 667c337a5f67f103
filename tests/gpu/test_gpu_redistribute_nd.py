"""Redistribution of cupy arrays on 2-D and 3-D meshes against the numpy oracle.

Which meshes run depends on the communicator size (4: 2x2, 1x4, 4x1; 8: 2x2x2, 4x2, 2x4;
2 and 3: 1xN and Nx1; ...); a size with no mesh of a case skips it (by size, never by rank).
Both transports where available, exact collective counts. Skipped without a GPU.
"""

from __future__ import annotations

import itertools
from math import prod

import numpy as np
import pytest
from gpu_helpers import DTYPES, counts_since, skip_reason, split_counts, with_transport
from oracle import is_ml, make_global, reduce_once
from test_redistribute_nd import EXCHANGES, S, meshes_for

import pyshard as ps
from pyshard import Partial, Replicate

if skip_reason():
    pytest.skip(skip_reason(), allow_module_level=True)
cp = pytest.importorskip("cupy")

pytestmark = pytest.mark.mpi

R, P = Replicate(), Partial("sum")


def make_source(g, mesh, placements, sizes=None):
    """``(x, ref)``: a ShardedArray ``x`` on the GPU and the global array it holds. Partial(sum)
    mesh dims hold distinct contributions (differences for numbers, subsets for bool) that
    reduce to ``g``; for bfloat16, whose sums round, independent contributions whose
    reduction is their float32 sum rounded once (as tests/mpi/test_redistribute_nd.py)."""
    pdims = [m for m, p in enumerate(placements) if isinstance(p, Partial)]
    if not pdims:
        return ps.distribute(cp.asarray(g), mesh, placements, sizes), g
    layout = ps.Layout(g.shape, g.dtype, mesh.shape, placements, sizes)
    nq = prod(mesh.shape[m] for m in pdims)
    if is_ml(g.dtype):
        parts = [make_global(g.shape, g.dtype, seed=17 * (q + 1)) for q in range(nq)]
        g = reduce_once(np.stack(parts), "sum", g.dtype)
    else:
        others = [make_global(g.shape, g.dtype, seed=17 * (q + 1)) for q in range(nq - 1)]
        if g.dtype.kind == "b":
            parts = [g] + [o & g for o in others]
        else:
            parts = [g - sum(others) if others else g] + others
    q = 0
    for m in pdims:
        q = q * mesh.shape[m] + mesh.coords[m]
    local = cp.asarray(np.ascontiguousarray(parts[q][layout.box(mesh.coords)]))
    x = ps.from_local(local, mesh, placements, global_shape=g.shape, sizes=sizes)
    return x, g


def check(y, g, where=""):
    assert isinstance(y.local, cp.ndarray), type(y.local)
    assert not any(isinstance(p, Partial) for p in y.placements)
    assert y.local.dtype == g.dtype and y.local.flags.c_contiguous
    np.testing.assert_array_equal(cp.asnumpy(y.local), g[y.box], err_msg=where)


def check_counts(got, n_collectives, transport, kinds=None):
    """Exactly ``n_collectives`` collectives (of ``kinds`` if given), each counted once on
    the transport's path."""
    coll, paths = split_counts(got)
    assert sum(coll.values()) == n_collectives, (got, n_collectives)
    assert kinds is None or set(coll) <= kinds, (got, kinds)
    assert got == with_transport(coll, transport), got


def sweep(comm, transport, mesh_shape, shape, sources, targets, dtype="int32"):
    mesh = ps.Mesh(comm, mesh_shape)
    g = make_global(shape, dtype, seed=5)
    failures = []
    for src in sources:
        x, ref = make_source(g, mesh, list(src))
        for dst in targets:
            p = x.plan_to(list(dst))
            before = ps.comm_stats()
            try:
                y = x.redistribute(list(dst))
                got = counts_since(before)
                check_counts(got, p.collectives, transport)
                if not any(isinstance(q, Partial) for q in src):
                    assert p.collectives <= 1, str(p)
                if R not in dst:
                    assert "allgatherv" not in got, str(p)
                check(y, ref)
            except AssertionError as e:
                failures.append(f"{mesh_shape} {shape} {dtype} {src}->{dst}: {e}")
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:8])


@pytest.mark.parametrize("shape", [(7, 10), (3, 5)])
def test_exhaustive_2d(comm, transport, shape):
    """Every source in {R,S0,S1,P}^2 to every target in {R,S0,S1}^2."""
    for mesh_shape in meshes_for(comm, 2):
        sources = list(itertools.product([R, S(0), S(1), P], repeat=2))
        targets = list(itertools.product([R, S(0), S(1)], repeat=2))
        sweep(comm, transport, mesh_shape, shape, sources, targets)


@pytest.mark.parametrize("dtype", DTYPES)
def test_small_meshes_2d_dtypes(comm, transport, dtype):
    for mesh_shape in meshes_for(comm, 2):
        # Partial(sum): exact differences; for bfloat16, contributions rounded once (make_source)
        sources = [(S(0), S(1)), (S(1), S(0)), (R, S(1)), (P, S(0)), (S(0), S(0))]
        targets = list(itertools.product([R, S(0), S(1)], repeat=2))
        sweep(comm, transport, mesh_shape, (5, 9), sources, targets, dtype)


ISSUE_CASES = {
    (2, 2): [
        ([S(0), S(1)], [S(1), S(0)]),
        ([S(0), S(0)], [S(1), S(1)]),
        ([S(0), R], [S(1), R]),
    ],
    (2, 3): [([S(1), S(0)], [S(0), S(1)])],
}


@pytest.mark.parametrize("dtype", DTYPES)
def test_issue_counts_2x2(comm, transport, dtype):
    """The named 2x2 cases: one exchange where DTensor needs two."""
    ran = False
    for mesh_shape in meshes_for(comm):
        for src, dst in ISSUE_CASES.get(mesh_shape, []):
            ran = True
            mesh = ps.Mesh(comm, mesh_shape)
            g = make_global((9, 7), dtype)
            x = ps.distribute(cp.asarray(g), mesh, src)
            before = ps.comm_stats()
            y = x.redistribute(dst)
            check_counts(counts_since(before), 1, transport, EXCHANGES)
            check(y, g, f"{src}->{dst}")
            back = y.redistribute(src)
            assert cp.asnumpy(back.local).tobytes() == cp.asnumpy(x.local).tobytes()
    if not ran:
        pytest.skip("needs 4 or 6 ranks")


@pytest.mark.parametrize("dtype", ["float64", "float16", "complex64", "bool"])
def test_3d_mesh_permutations(comm, transport, dtype):
    """The named 2x2x2 cases: every permutation of [S0, S1, S2] in one Alltoallv."""
    if comm.size != 8:
        pytest.skip("2x2x2 needs 8 ranks")
    mesh = ps.Mesh(comm, (2, 2, 2))
    g = make_global((8, 6, 5), dtype)
    base = [S(0), S(1), S(2)]
    x = ps.distribute(cp.asarray(g), mesh, base)
    for perm in itertools.permutations(base):
        before = ps.comm_stats()
        y = x.redistribute(list(perm))
        check_counts(counts_since(before), int(list(perm) != base), transport, EXCHANGES)
        check(y, g, str(perm))


def test_3d_mesh_mixed(comm, transport):
    if comm.size != 8:
        pytest.skip("2x2x2 needs 8 ranks")
    sources = [(S(0), R, S(2)), (P, S(1), S(0)), (S(0), S(0), R), (R, P, S(2)), (S(2), S(2), S(2))]
    targets = [(R, R, R), (S(1), S(0), R), (S(0), S(0), S(0)), (R, S(2), S(1)), (S(2), R, S(0))]
    sweep(comm, transport, (2, 2, 2), (7, 5, 3), sources, targets)


def test_empty_shard_on_one_dim_uneven_on_other(comm, transport):
    for mesh_shape in meshes_for(comm, 2):
        mesh = ps.Mesh(comm, mesh_shape)
        for dtype in DTYPES:
            g = make_global((1, 7), dtype)  # dim 0: one row over mesh dim 0 (empty shards)
            for src, dst in [
                ([S(0), S(1)], [S(1), S(0)]),
                ([S(0), S(1)], [R, S(0)]),
                ([S(1), S(0)], [S(0), S(1)]),
                ([S(0), S(1)], [S(1), R]),
            ]:
                x = ps.distribute(cp.asarray(g), mesh, src)
                before = ps.comm_stats()
                y = x.redistribute(dst)
                check_counts(counts_since(before), x.plan_to(dst).collectives, transport)
                check(y, g, f"{mesh_shape} {dtype} {src}->{dst}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_round_trip_is_bitwise(comm, transport, dtype):
    for mesh_shape in meshes_for(comm, 2):
        mesh = ps.Mesh(comm, mesh_shape)
        g = make_global((11, 13), dtype)
        a = ps.distribute(cp.asarray(g), mesh, [S(0), S(1)])
        b = a.redistribute([S(1), S(0)])
        c = b.redistribute([S(0), S(1)])
        assert c.layout == a.layout
        assert cp.asnumpy(c.local).tobytes() == cp.asnumpy(a.local).tobytes()


def test_explicit_uneven_sizes_nested(comm, transport):
    for mesh_shape in meshes_for(comm, 2):
        mesh = ps.Mesh(comm, mesh_shape)
        n = prod(mesh_shape)
        sizes = [0] * n
        sizes[-1] = 9
        sizes[0] += 3
        g = make_global((12, 4), "float64")
        x = ps.distribute(cp.asarray(g), mesh, [S(0), S(0)], sizes={0: sizes})
        check(x, g)
        for dst in ([S(1), S(0)], [S(0), S(0)], [R, S(0)], [S(0), R]):
            check(x.redistribute(dst), g, str(dst))


def test_physicsnemo_arbitrary_extents(comm, transport):
    """Local extents (6, 4(r0+1)+2 r0, 4(r1+2)+2 r1, 5) on [S1, S2], learned by from_local
    from cupy shards (one Allgather of shapes, on the host)."""
    for mesh_shape in meshes_for(comm, 2):
        mesh = ps.Mesh(comm, mesh_shape)
        e1 = [4 * (a + 1) + 2 * a for a in range(mesh_shape[0])]
        e2 = [4 * (b + 2) + 2 * b for b in range(mesh_shape[1])]
        g = make_global((6, sum(e1), sum(e2), 5), "float32")
        r0, r1 = mesh.coords
        o1, o2 = sum(e1[:r0]), sum(e2[:r1])
        local = cp.asarray(g[:, o1 : o1 + e1[r0], o2 : o2 + e2[r1], :])
        before = ps.comm_stats()
        x = ps.from_local(local, mesh, [S(1), S(2)])
        assert counts_since(before) == {"allgather": 1}  # shapes only: never staged
        assert x.layout.sizes == {1: tuple(e1), 2: tuple(e2)}
        for dst in ([R, S(2)], [S(2), S(1)], [S(3), R], [R, R]):
            before = ps.comm_stats()
            y = x.redistribute(dst)
            check_counts(counts_since(before), x.plan_to(dst).collectives, transport)
            check(y, g, f"{mesh_shape} {dst}")


def test_shard_to_partial_needs_no_communication(comm, transport):
    for mesh_shape in meshes_for(comm, 2):
        mesh = ps.Mesh(comm, mesh_shape)
        g = make_global((7, 10), "int32", seed=3)
        for src, dst in [
            ([S(0), S(1)], [Partial("sum"), S(1)]),
            ([S(0), S(1)], [S(0), Partial("max")]),
            ([S(1), S(0)], [Partial("min"), Partial("min")]),
            ([S(0), R], [Partial("sum"), R]),
        ]:
            x = ps.distribute(cp.asarray(g), mesh, src)
            before = ps.comm_stats()
            y = x.redistribute(dst)
            assert counts_since(before) == {}, (src, dst)
            np.testing.assert_array_equal(cp.asnumpy(y.full()), g, err_msg=f"{src}->{dst}")
            back = y.redistribute(src)
            check(back, g, f"{dst}->{src}")
