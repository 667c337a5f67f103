"""Redistribution on 2-D and 3-D meshes against the numpy oracle.

Which meshes run depends on the communicator size (4: 2x2, 1x4, 4x1; 6: 2x3, 3x2;
8: 2x2x2, 4x2; 7: 7x1; 2 and 3: 1xN and Nx1); a size with no mesh of a case skips it.
"""

from __future__ import annotations

import itertools
from math import prod

import numpy as np
import pytest
from oracle import ML_DTYPES, auto_exchange, is_ml, make_global, reduce_once

import pyshard as ps
from pyshard import Partial, Replicate, Shard

pytestmark = pytest.mark.mpi  # run under mpiexec with --with-mpi (pytest-mpi)

R, P = Replicate(), Partial("sum")


def S(d):
    return Shard(d)


MESHES = {
    1: [(1, 1)],
    2: [(1, 2), (2, 1)],
    3: [(1, 3), (3, 1)],
    4: [(2, 2), (1, 4), (4, 1)],
    6: [(2, 3), (3, 2)],
    7: [(7, 1)],
    8: [(2, 2, 2), (4, 2), (2, 4)],
}


EXCHANGES = {"alltoallv", "alltoall", "p2p", "shm"}  # shm: pyshard/_shm.py


def meshes_for(comm, ndim=None):
    out = [m for m in MESHES.get(comm.size, []) if ndim is None or len(m) == ndim]
    if not out:
        pytest.skip(f"no {ndim or ''}-D mesh case for {comm.size} ranks")
    return out


def counts_since(before):
    now = ps.comm_stats()
    return {k: v - before.get(k, 0) for k, v in now.items() if v - before.get(k, 0)}


def make_source(g, mesh, placements, sizes=None):
    """A ShardedArray of ``g``; Partial(sum) mesh dims hold distinct integer contributions.
    For bfloat16 and float8, whose sums are not exact, the contributions are independent and
    the array they reduce to is their float32 sum rounded once: ``(x, that global array)``."""
    pdims = [m for m, p in enumerate(placements) if isinstance(p, Partial)]
    if not pdims:
        return ps.distribute(g, mesh, placements, sizes), g
    layout = ps.Layout(g.shape, g.dtype, mesh.shape, placements, sizes)
    nq = prod(mesh.shape[m] for m in pdims)
    if is_ml(g.dtype):
        parts = [make_global(g.shape, g.dtype, seed=17 * (q + 1)) for q in range(nq)]
        g = reduce_once(np.stack(parts), "sum", g.dtype)
    else:
        parts = [make_global(g.shape, g.dtype, seed=17 * (q + 1)) for q in range(nq - 1)]
        parts.append(g - sum(parts) if parts else g)  # exact for integer dtypes
    q = 0
    for m in pdims:
        q = q * mesh.shape[m] + mesh.coords[m]
    local = np.ascontiguousarray(parts[q][layout.box(mesh.coords)])
    return ps.from_local(local, mesh, placements, global_shape=g.shape, sizes=sizes), g


def check(y, g, where=""):
    assert not any(isinstance(p, Partial) for p in y.placements)
    assert y.local.dtype == g.dtype, where
    np.testing.assert_array_equal(y.local, g[y.box], err_msg=where)


def moves(a, b):
    """Does going from layout ``a`` to ``b`` move data between ranks: does some rank's box
    in ``b`` hold an element outside its box in ``a`` (replicated dims: the whole dim)?"""
    for c in itertools.product(*[range(n) for n in a.mesh_shape]):
        inner, outer = b.box(c), a.box(c)
        if prod(i.stop - i.start for i in inner) and not all(
            o.start <= i.start and i.stop <= o.stop for i, o in zip(inner, outer)
        ):
            return True
    return False


def want_collectives(src, dst):
    """The collectives going from layout ``src`` to ``dst`` (no Partial target) costs, by
    docs/site/planning.md's rule for N-D meshes, from the placements and the boxes: each
    Partial mesh dim of more than one rank is reduced first, by one Reduce_scatter where the
    target shards along it (onto the target's array dim when no mesh dim shards that yet,
    else the largest array dim none shards, pyshard/planner.py's _rs_dim; no such dim: an
    Allreduce) and by one Allreduce for all those the target replicates (one op here); then
    one exchange where data still crosses ranks, none where every rank holds its target box."""
    pls, n, allreduce = list(src.placements), 0, False
    for m, p in enumerate(src.placements):
        if not isinstance(p, Partial):
            continue
        pls[m], t = R, dst.placements[m]
        if src.mesh_shape[m] == 1:  # one contribution: nothing to reduce
            continue
        free = [d for d in range(src.ndim) if Shard(d) not in pls]
        if isinstance(t, Shard) and free:
            pls[m] = S(t.dim if t.dim in free else max(free, key=lambda d: (src.shape[d], -d)))
            n += 1
        else:
            allreduce = True
    reduced = ps.Layout(src.shape, src.dtype, src.mesh_shape, pls)
    return n + allreduce + moves(reduced, dst)


def sweep(comm, mesh_shape, shape, sources, targets, dtype="int64"):
    mesh = ps.Mesh(comm, mesh_shape)
    failures = []
    for src in sources:
        x, g = make_source(make_global(shape, dtype, seed=5), mesh, list(src))
        for dst in targets:
            p = x.plan_to(list(dst))
            want = want_collectives(x.layout, ps.Layout(shape, dtype, mesh_shape, list(dst)))
            before = ps.comm_stats()
            try:
                y = x.redistribute(list(dst))
                got = counts_since(before)
                assert sum(got.values()) == want == p.collectives, (got, want, str(p))
                if not any(isinstance(q, Partial) for q in src):
                    assert p.collectives <= 1, str(p)
                if R not in dst:
                    assert "allgatherv" not in got, str(p)
                check(y, g)
            except AssertionError as e:
                failures.append(f"{mesh_shape} {shape} {dtype} {src}->{dst}: {e}")
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:8])


# int64 at both shapes; bfloat16 and float8 (where ml_dtypes is installed) at the uneven one
EXHAUSTIVE = [((7, 10), "int64"), ((3, 5), "int64")] + [((7, 10), d) for d in ML_DTYPES]


@pytest.mark.parametrize("shape,dtype", EXHAUSTIVE, ids=[f"{s}-{d}" for s, d in EXHAUSTIVE])
def test_exhaustive_2d(comm, shape, dtype):
    """Every source in {R,S0,S1,P}^2 to every target in {R,S0,S1}^2."""
    for mesh_shape in meshes_for(comm, 2):
        if mesh_shape not in [(2, 2), (4, 2), (2, 3), (3, 2), (1, 4), (4, 1)]:
            continue
        sources = list(itertools.product([R, S(0), S(1), P], repeat=2))
        targets = list(itertools.product([R, S(0), S(1)], repeat=2))
        sweep(comm, mesh_shape, shape, sources, targets, dtype)


@pytest.mark.parametrize("dtype", ["int64", *ML_DTYPES])
def test_small_meshes_2d(comm, dtype):
    for mesh_shape in meshes_for(comm, 2):
        sources = [(S(0), S(1)), (S(1), S(0)), (R, S(1)), (P, S(0)), (S(0), S(0))]
        targets = list(itertools.product([R, S(0), S(1)], repeat=2))
        sweep(comm, mesh_shape, (5, 9), sources, targets, dtype)


def test_3d_mesh_permutations(comm):
    if comm.size != 8:
        pytest.skip("2x2x2 needs 8 ranks")
    mesh = ps.Mesh(comm, (2, 2, 2))
    g = make_global((8, 6, 5), "float64")
    base = [S(0), S(1), S(2)]
    x = ps.distribute(g, mesh, base)
    for perm in itertools.permutations(base):
        before = ps.comm_stats()
        y = x.redistribute(list(perm))
        got = counts_since(before)
        if list(perm) == base:
            assert got == {}, perm
        else:  # one exchange; which one the auto rule picks is tested on 1-D meshes
            assert sum(got.values()) == 1 and set(got) <= EXCHANGES, (perm, got)
        check(y, g, str(perm))
    # a sample of mixed sources and targets, Partial and nested sharding included
    sources = [(S(0), R, S(2)), (P, S(1), S(0)), (S(0), S(0), R), (R, P, S(2)), (S(2), S(2), S(2))]
    targets = [(R, R, R), (S(1), S(0), R), (S(0), S(0), S(0)), (R, S(2), S(1)), (S(2), R, S(0))]
    for dtype in ["int64", *ML_DTYPES]:
        sweep(comm, (2, 2, 2), (7, 5, 3), sources, targets, dtype)


def test_issue_counts(comm):
    """One collective for the transposes DTensor needs two for."""
    cases = {
        (2, 2): [
            # a permutation: each rank sends to one peer, point-to-point (choose_algorithm)
            ([S(0), S(1)], [S(1), S(0)], {"p2p": 1}),
            ([S(0), S(0)], [S(1), S(1)], {"alltoallv": 1}),
            ([S(0), R], [S(1), R], {"alltoallv": 1}),
        ],
        (2, 3): [([S(1), S(0)], [S(0), S(1)], {"alltoallv": 1})],
    }
    ran = False
    for mesh_shape in meshes_for(comm):
        for src, dst, want in cases.get(mesh_shape, []):
            ran = True
            mesh = ps.Mesh(comm, mesh_shape)
            g = make_global((9, 7), "float32")
            x = ps.distribute(g, mesh, src)
            before = ps.comm_stats()
            y = x.redistribute(dst)
            (step,) = x.plan_to(dst).steps
            want = auto_exchange(mesh, want, dims=step.mesh_dims, step=step)
            assert counts_since(before) == want
            check(y, g)
            if dst == [S(1), R]:
                assert y.plan_to(dst).steps == () and x.plan_to(dst).steps[0].mesh_dims == (0,)
    if not ran:
        pytest.skip("needs 4 or 6 ranks")


PHYSICSNEMO_TARGETS = [
    [R, S(2)],
    [S(1), R],
    [R, R],
    [R, S(1)],
    [S(2), R],
    [S(2), S(1)],
    [S(3), R],
]


@pytest.mark.parametrize("dst", PHYSICSNEMO_TARGETS, ids=[str(d) for d in PHYSICSNEMO_TARGETS])
def test_physicsnemo_arbitrary_extents(comm, dst):
    """Local extents (6, 4(r0+1)+2 r0, 4(r1+2)+2 r1, 5) on [S1, S2], learned by from_local."""
    for mesh_shape in meshes_for(comm, 2):
        mesh = ps.Mesh(comm, mesh_shape)
        e1 = [4 * (a + 1) + 2 * a for a in range(mesh_shape[0])]
        e2 = [4 * (b + 2) + 2 * b for b in range(mesh_shape[1])]
        g = make_global((6, sum(e1), sum(e2), 5), "float32")
        r0, r1 = mesh.coords
        o1, o2 = sum(e1[:r0]), sum(e2[:r1])
        local = g[:, o1 : o1 + e1[r0], o2 : o2 + e2[r1], :].copy()
        x = ps.from_local(local, mesh, [S(1), S(2)])
        assert x.layout.sizes == {1: tuple(e1), 2: tuple(e2)}
        before = ps.comm_stats()
        y = x.redistribute(dst)
        assert sum(counts_since(before).values()) == moves(x.layout, y.layout)
        check(y, g, f"{mesh_shape} {dst}")


def test_empty_shard_on_one_dim_uneven_on_other(comm):
    for mesh_shape in meshes_for(comm, 2):
        mesh = ps.Mesh(comm, mesh_shape)
        g = make_global((1, 7), "int32")  # dim 0: one row over mesh dim 0 (empty shards)
        for src, dst in [
            ([S(0), S(1)], [S(1), S(0)]),
            ([S(0), S(1)], [R, S(0)]),
            ([S(1), S(0)], [S(0), S(1)]),
            ([S(0), S(1)], [S(1), R]),
        ]:
            x = ps.distribute(g, mesh, src)
            check(x.redistribute(dst), g, f"{mesh_shape} {src}->{dst}")


def test_round_trip_is_bitwise(comm):
    for mesh_shape in meshes_for(comm, 2):
        mesh = ps.Mesh(comm, mesh_shape)
        g = make_global((11, 13), "complex128")
        a = ps.distribute(g, mesh, [S(0), S(1)])
        b = a.redistribute([S(1), S(0)])
        c = b.redistribute([S(0), S(1)])
        assert c.layout == a.layout
        assert c.local.tobytes() == a.local.tobytes()


def test_explicit_uneven_sizes_nested(comm):
    for mesh_shape in meshes_for(comm, 2):
        mesh = ps.Mesh(comm, mesh_shape)
        n = prod(mesh_shape)
        sizes = [0] * n
        sizes[-1] = 9
        sizes[0] += 3
        g = make_global((12, 4), "float64")
        x = ps.distribute(g, mesh, [S(0), S(0)], sizes={0: sizes})
        check(x, g)
        for dst in ([S(1), S(0)], [S(0), S(0)], [R, S(0)], [S(0), R]):
            check(x.redistribute(dst), g, str(dst))


def test_shard_to_partial_needs_no_communication(comm):
    """[.., S(d) on m, ..] -> P(sum|max|min) on m: each rank keeps its shard inside the op's
    identity; the reduction of the partial values is the global array."""
    for mesh_shape in meshes_for(comm, 2):
        mesh = ps.Mesh(comm, mesh_shape)
        g = make_global((7, 10), "int64", seed=3)
        for src, dst in [
            ([S(0), S(1)], [Partial("sum"), S(1)]),
            ([S(0), S(1)], [S(0), Partial("max")]),
            ([S(1), S(0)], [Partial("min"), Partial("min")]),
            ([S(0), R], [Partial("sum"), R]),
        ]:
            x = ps.distribute(g, mesh, src)
            before = ps.comm_stats()
            y = x.redistribute(dst)
            assert counts_since(before) == {}, (src, dst)
            np.testing.assert_array_equal(y.full(), g, err_msg=f"{src}->{dst}")
            back = y.redistribute(src)
            np.testing.assert_array_equal(back.local, g[back.box])


@pytest.mark.parametrize("dtype", ["int8", "float32"])
def test_shard_to_partial_after_other_partial_dims(comm, dtype):
    """S(d) -> P(op) on mesh dim m where Partial dims reduce before m: the cells outside a
    rank's shard are reduced over those dims first, so they must come out as op's identity.
    Each rank filled them with it: summed over a P(sum) dim, n copies of an integer's lowest
    (highest) value wrapped to 0 (-2), which a later max (min) took (silently wrong; floats'
    infinities hid it). Every target's ranks' values, reduced in mesh-dim order by the
    oracle (in their dtype, as MPI reduces them), give the global array."""
    shapes = [m for m in MESHES.get(comm.size, []) if len(m) >= 2 and max(m) > 1]
    if not shapes:
        pytest.skip(f"no 2-D or 3-D mesh case for {comm.size} ranks")
    ops = ("sum", "max", "min")
    bad = []
    for mshape in shapes:
        mesh = ps.Mesh(comm, mshape)
        M = len(mshape)
        coords = [tuple(mesh.comm.Get_coords(r)) for r in range(comm.size)]
        g = make_global((9,), dtype, seed=5)
        others = [R] + [Partial(o) for o in ops]
        for m in range(M) if M == 2 else [M - 1]:  # 3-D: the shard on the last dim
            for rest in itertools.product(others, repeat=M - 1):
                src = list(rest[:m]) + [S(0)] + list(rest[m:])
                x = ps.distribute(g, mesh, src)
                for dst in itertools.product(ops, repeat=M):
                    y = x.redistribute([Partial(o) for o in dst])
                    got = _reduce_in_order(comm.allgather(y.local), coords, mshape, dst)
                    if not np.array_equal(got, g):
                        bad.append(f"{mshape} {src} -> {list(dst)}: {got}")
        mesh.free()
    assert not bad, bad[:5]


def test_cached_redistribute_builds_nothing(comm, monkeypatch):
    """Once a plan ran, repeating it builds no layout, plan or block list (work that grows
    with the number of ranks happens once)."""
    calls = []
    real_init = ps.Layout.__init__

    def counting_init(self, *a, **k):
        calls.append("Layout")
        real_init(self, *a, **k)

    for mesh_shape in meshes_for(comm, 2):
        mesh = ps.Mesh(comm, mesh_shape)
        g = make_global((9, 8), "float32")
        x = ps.distribute(g, mesh, [S(0), S(1)])
        x.redistribute([S(1), S(0)])  # builds and caches
        monkeypatch.setattr(ps.Layout, "__init__", counting_init)
        monkeypatch.setattr(ps.Step, "sends", lambda *a: calls.append("sends"))
        monkeypatch.setattr(ps.Step, "recvs", lambda *a: calls.append("recvs"))
        for _ in range(3):
            y = x.redistribute([S(1), S(0)])
        monkeypatch.undo()
        assert calls == []
        check(y, g)
        # the counter works: a new target builds a layout
        monkeypatch.setattr(ps.Layout, "__init__", counting_init)
        x.redistribute([R, S(0)], sizes={0: [9] + [0] * (mesh_shape[1] - 1)})
        monkeypatch.undo()
        assert "Layout" in calls
        calls.clear()


@pytest.mark.parametrize("ops", [("max", "sum"), ("sum", "max"), ("min", "sum"),
                                 ("avg", "max")])
def test_mixed_partial_ops_reduce_in_mesh_dim_order(comm, ops):
    """Partial mesh dims of different ops reduce in mesh-dim order (dim 0 first), whatever
    the target: one source, one global array (an allreduce deferred past a later dim's
    reduce_scatter gave [R, S(0)] the sum of the maxima, [R, R] the maximum of the sums)."""
    if comm.size != 4:
        pytest.skip("a 2x2 mesh")
    mesh = ps.Mesh(comm, (2, 2))
    shape = (4, 6)
    i, j = mesh.coords
    parts = {(a, b): make_global(shape, "float64", seed=7 + 2 * a + b) for a in (0, 1)
             for b in (0, 1)}
    red = {"sum": np.sum, "max": np.max, "min": np.min, "avg": np.mean}
    inner = [red[ops[0]](np.stack([parts[(0, b)], parts[(1, b)]]), axis=0) for b in (0, 1)]
    ref = red[ops[1]](np.stack(inner), axis=0)
    x = ps.from_local(parts[(i, j)], mesh, [Partial(ops[0]), Partial(ops[1])],
                      global_shape=shape)
    for dst in ([R, R], [R, S(0)], [S(0), R], [S(0), S(1)], [R, S(1)], [S(1), S(0)]):
        y = x.redistribute(dst)
        np.testing.assert_array_equal(y.local, ref[y.box], err_msg=f"{ops} -> {dst}")
    mesh.free()


def test_avg_divides_as_numpy_mean(comm):
    """Partial("avg") is the sum divided by the count (numpy's mean), not the sum times the
    reciprocal (two roundings: 0.7 x 3 came back as 0.6999999999999998). Integer
    contributions, so that every order of the sum is exact, with totals where the two
    differ (none where the count is a power of 2: its reciprocal is exact)."""
    P = comm.size
    mesh = ps.Mesh(comm, (P,))
    for dtype in (np.float64, np.float32):
        t = dtype
        apart = [s for s in range(P, 200 * P) if t(t(s) * t(1.0 / P)) != t(s) / t(P)]
        totals = np.array(((apart or [P]) * 6)[:6], dtype)
        mine = np.ones(6, dtype) if comm.rank < P - 1 else totals - (P - 1)
        x = ps.from_local(mine, mesh, [Partial("avg")], global_shape=(6,))
        np.testing.assert_array_equal(x.redistribute([R]).local, totals / t(P))
    # complex: each part divided by the count (numpy's complex / complex multiplied by
    # 1 / (P + 0j): 7 x (3 + 3j) / 7 came back as 3.0000002 + 3.0000002j in complex64)
    for dtype, t in ((np.complex64, np.float32), (np.complex128, np.float64)):
        k = np.arange(1, 2001, dtype=t)
        want = k + 1j * (k + 1)
        x = ps.from_local(want.astype(dtype), mesh, [Partial("avg")], global_shape=k.shape)
        for tgt in ([R], [S(0)]):
            y = x.redistribute(tgt)
            np.testing.assert_array_equal(y.local, want.astype(dtype)[y.box])
        # a 0-d one (a complex view of another item size raised for 0-d arrays)
        x0 = ps.from_local(np.array(3 + 5j, dtype), mesh, [Partial("avg")], global_shape=())
        assert x0.redistribute([R]).local == dtype(3 + 5j)
    mesh.free()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("dtype", ["float64", "float32", "float16"])
def test_max_min_ties_give_every_rank_the_same_bits(comm, dtype):
    """Partial max/min -> Replicate where ranks hold +0 and -0, or NaNs of either sign: MPI
    combines in another order on every rank, and each kept the other's zero (the replicas
    differed in their sign bits), the node path rank 0's. Now ties break one way on every
    path: max gives +0 and min -0 (IEEE 754-2019 maximum/minimum), and of two NaNs every
    rank keeps the same one."""
    P, me = comm.size, comm.rank
    mesh = ps.Mesh(comm, (P,))
    z = np.array([-0.0, 0.0, np.nan, -np.nan, 1.0], dtype)
    mine = z.copy()
    if me % 2:
        mine[:4] = z[[1, 0, 3, 2]]
    for op in ("max", "min"):
        x = ps.from_local(mine.copy(), mesh, [Partial(op)], global_shape=z.shape)
        seen = []
        for alg in ("alltoallv", "shm", None):
            y = x.redistribute([R], algorithm=alg)
            seen.append(y.local.tobytes())
            assert np.signbit(y.local[:2]).tolist() == [op == "min"] * 2, (op, alg)
            assert np.isnan(y.local[2:4]).all() and y.local[4] == 1
        everyone = comm.allgather(seen)
        assert all(s == everyone[0][0] for e in everyone for s in e), (op, everyone)
    mesh.free()


def test_only_the_same_layout_shares_memory(comm):
    """A redistribution to another layout returns new memory, a relabel too (a Partial mesh
    dim of size 1 read as Replicate): writing into the result leaves the source alone."""
    mesh = ps.Mesh(comm, (1, comm.size))
    g = make_global((2 * comm.size, 3), "float64")
    x = ps.from_local(g[x_box := ps.Layout(g.shape, g.dtype, (1, comm.size), [R, S(0)]).box(
        mesh.coords)].copy(), mesh, [Partial("sum"), S(0)], global_shape=g.shape)
    y = x.redistribute([R, S(0)])
    assert y.local.size == 0 or not np.shares_memory(y.local, x.local)
    y.local[...] = -1
    np.testing.assert_array_equal(x.local, g[x_box])
    assert x.redistribute([Partial("sum"), S(0)]).local is x.local  # the same layout: shared
    mesh.free()


# sums in the array's own dtype, as MPI's are (an integer's wraps)
OPS = {"sum": lambda s: s.sum(0, dtype=s.dtype), "avg": lambda s: s.mean(0),
       "max": lambda s: s.max(0), "min": lambda s: s.min(0)}


def _reduce_in_order(parts, coords, mshape, ops):
    """The global array of Partial mesh dims with ``ops`` (one per mesh dim, None: not
    Partial), reduced in mesh-dim order, dim 0 first; parts[r] at coords[r]."""
    cur = dict(zip(coords, parts))
    for m, op in enumerate(ops):
        if op is None:
            continue
        nxt = {}
        for c in {c[:m] + c[m + 1:] for c in cur}:
            group = [cur[k] for k in sorted(cur) if k[:m] + k[m + 1:] == c]
            nxt[c[:m] + (0,) + c[m:]] = OPS[op](np.stack(group))
        cur = nxt
    assert len({v.shape for v in cur.values()}) == 1
    return next(iter(cur.values()))


@pytest.mark.mpi(min_size=4)
def test_two_partial_dims_of_ops_that_do_not_commute(comm):
    """[P(o0), P(o1)] is o1 over mesh dim 1 of the o0-reductions over mesh dim 0
    (concepts.md: dim 0 first, whatever the target). Targets that keep P(o0) and reduce
    mesh dim 1 took o1 first (silently wrong where the ops do not commute); FFTs of such a
    source kept P(sum) past a later max likewise. Every rank holds its own random values
    (a distribute()d source fills the other replicas with the op's identity: the order never
    showed)."""
    mshape = next(m for m in MESHES[comm.size] if len(m) == 2 and min(m) > 1) \
        if any(len(m) == 2 and min(m) > 1 for m in MESHES.get(comm.size, [])) else None
    if mshape is None:
        pytest.skip("needs a 2-D mesh with both dims > 1")
    mesh = ps.Mesh(comm, mshape)
    rng = np.random.default_rng(comm.rank)
    loc = rng.integers(-5, 6, size=(4, 6)).astype(np.float64)
    parts = comm.allgather(loc)
    coords = [tuple(mesh.comm.Get_coords(r)) for r in range(comm.size)]
    bad = []
    for o0, o1 in itertools.permutations(OPS, 2):
        g = _reduce_in_order(parts, coords, mshape, (o0, o1))
        x = ps.from_local(loc, mesh, [Partial(o0), Partial(o1)], global_shape=(4, 6))
        for t in ([Partial(o0), Replicate()], [Partial(o0), Shard(0)], [Partial(o0), Shard(1)],
                  [Replicate(), Replicate()], [Shard(1), Partial(o1)]):
            y = x.redistribute(t)
            got = _reduce_in_order(comm.allgather(y.local), coords, mshape,
                                   tuple(p.op if isinstance(p, Partial) else None for p in t)) \
                if all(isinstance(p, (Partial, Replicate)) for p in t) else None
            if got is not None:
                ok = np.allclose(got, g)
            else:
                full = y.redistribute([Replicate(), Replicate()]).local
                ok = np.allclose(full, g)
            if not ok:
                bad.append(f"[P({o0}), P({o1})] -> {t}")
        from pyshard import fft as pf

        y = pf.fftn(x)
        if not np.allclose(y.redistribute([Replicate(), Replicate()]).local, np.fft.fftn(g)):
            bad.append(f"fftn of [P({o0}), P({o1})] ({y.placements})")
    assert not bad, bad
    mesh.free()
