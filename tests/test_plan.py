"""Serial tests of pyshard.plan: plan kinds, collective counts and exchange geometry.

Every rank's view is simulated in one process, so no MPI is needed.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter
from math import prod

import numpy as np
import pytest

import pyshard as ps
from pyshard.layout import Layout, Partial, Replicate, Shard
from pyshard.planner import plan

S, R, P = Shard, Replicate, Partial


def L(shape, mesh, pls, sizes=None, dtype="float32"):
    return Layout(shape, dtype, mesh, pls, sizes)


def all_coords(mesh_shape):
    return list(itertools.product(*[range(m) for m in mesh_shape]))


def kinds(p):
    return [s.kind for s in p.steps]


def box_of(layout, coords):
    """A layout's box at ``coords`` as ((lo, hi), ...), the form Step.sends/recvs use."""
    return tuple((s.start, s.stop) for s in layout.box(coords))


def inside(inner, outer):
    return all(o_lo <= lo < hi <= o_hi for (lo, hi), (o_lo, o_hi) in zip(inner, outer))


def volume(box):
    return prod(hi - lo for lo, hi in box)


def check_exchange(step):
    """Simulate every rank of an exchange step and check the data it moves is conserved.

    Returns the number of (sender, receiver, box) blocks, for callers that want to know
    something moved.
    """
    src, dst = step.src, step.dst
    mesh = src.mesh_shape
    coords_list = all_coords(mesh)
    global_array = np.arange(prod(src.shape), dtype=np.int64).reshape(src.shape)
    sent, received = Counter(), Counter()
    for c in coords_list:
        sbox = box_of(src, c)
        for peer, box in step.sends(c):
            assert len(box) == src.ndim
            assert volume(box) > 0, (c, peer, box)
            assert inside(box, sbox), (c, peer, box, sbox)
            assert len(peer) == len(mesh) and all(0 <= x < m for x, m in zip(peer, mesh))
            # a peer lies in the step's sub-communicator: it differs only on its mesh dims
            assert all(peer[m] == c[m] for m in range(len(mesh)) if m not in step.mesh_dims)
            sent[(c, peer, box)] += 1
    for c in coords_list:
        dbox = box_of(dst, c)
        lo = [a for a, _ in dbox]
        local = np.full(dst.local_shape(c), -1, dtype=np.int64)
        hits = np.zeros(dst.local_shape(c), dtype=np.int64)
        total = 0
        for peer, box in step.recvs(c):
            assert volume(box) > 0, (c, peer, box)
            assert inside(box, dbox), (c, peer, box, dbox)
            assert inside(box, box_of(src, peer)), (c, peer, box)
            assert all(peer[m] == c[m] for m in range(len(mesh)) if m not in step.mesh_dims)
            received[(peer, c, box)] += 1
            where = tuple(slice(a - o, b - o) for (a, b), o in zip(box, lo))
            # the sender's source shard is a view of the global array at its box
            local[where] = global_array[tuple(slice(a, b) for a, b in box)]
            hits[where] += 1
            total += volume(box)
        # the received blocks tile the destination box: each element exactly once
        assert total == prod(dst.local_shape(c)), (c, total)
        assert (hits == 1).all(), c
        np.testing.assert_array_equal(local, global_array[dst.box(c)])
    # every block sent is received, once, and nothing else is
    assert sent == received
    assert all(v == 1 for v in sent.values())
    return sum(sent.values())


def only_step(p, kind):
    found = [s for s in p.steps if s.kind == kind]
    assert len(found) == 1, kinds(p)
    return found[0]


# ----------------------------------------------------------------------------- kinds, 1-D


M4 = (4,)
A = (8, 6)

KIND_CASES = [
    # (src, dst, kinds, collectives)
    (L(A, M4, [S(0)]), L(A, M4, [S(1)]), ["alltoallv"], 1),
    (
        L(A, M4, [S(0)], {0: [1, 2, 3, 2]}),
        L(A, M4, [S(0)], {0: [4, 0, 0, 4]}),
        ["alltoallv"],
        1,
    ),
    (L(A, M4, [S(1)]), L(A, M4, [S(1)], {1: [0, 0, 6, 0]}), ["alltoallv"], 1),
    (L(A, M4, [S(0)]), L(A, M4, [R()]), ["allgatherv"], 1),
    (L(A, M4, [S(1)], {1: [0, 5, 1, 0]}), L(A, M4, [R()]), ["allgatherv"], 1),
    (L(A, M4, [R()]), L(A, M4, [S(0)]), ["local_copy"], 0),
    (L(A, M4, [R()]), L(A, M4, [S(1)], {1: [3, 0, 2, 1]}), ["local_copy"], 0),
    (L(A, M4, [P("sum")]), L(A, M4, [R()]), ["allreduce"], 1),
    (L(A, M4, [P("max")]), L(A, M4, [R()]), ["allreduce"], 1),
    (L(A, M4, [P("sum")]), L(A, M4, [S(1)]), ["reduce_scatter"], 1),
    (L(A, M4, [P("avg")]), L(A, M4, [S(0)], {0: [0, 3, 1, 4]}), ["reduce_scatter"], 1),
    (L(A, M4, [R()]), L(A, M4, [P("sum")]), ["make_partial"], 0),
    (L(A, M4, [R()]), L(A, M4, [P("max")]), ["make_partial"], 0),
    (L(A, M4, [P("sum")]), L(A, M4, [P("sum")]), [], 0),
    (L(A, M4, [S(0)]), L(A, M4, [S(0)]), [], 0),
    (L(A, M4, [R()]), L(A, M4, [R()]), [], 0),
    (L(A, M4, [S(0)], {0: [5, 1, 1, 1]}), L(A, M4, [S(0)], {0: (5, 1, 1, 1)}), [], 0),
    (L(A, (1,), [S(0)]), L(A, (1,), [S(1)]), ["local_copy"], 0),
]


def collectives_1d(src, dst):
    """The collectives a change costs on a 1-D mesh, by the table of docs/site/planning.md
    ("What each change costs on a 1-D mesh"), from the placements and sizes alone."""
    a, b = src.placements[0], dst.placements[0]
    if src.mesh_shape == (1,) or (a == b and src.sizes == dst.sizes):
        return 0  # one rank, or the same layout: nothing crosses ranks
    if isinstance(a, Partial):
        return 1  # -> Replicate: one Allreduce; -> Shard: one Reduce_scatter
    if isinstance(a, Shard):  # -> Shard (another dim or new sizes): one Alltoallv;
        # -> Replicate: one Allgatherv; -> Partial(sum|max|min): none (the shard inside the
        # op's identity)
        return 0 if isinstance(b, Partial) and b.op != "avg" else 1
    return 0  # Replicate -> Shard or Partial: a local copy


@pytest.mark.parametrize("src, dst, want_kinds, want_collectives", KIND_CASES)
def test_plan_kinds_1d(src, dst, want_kinds, want_collectives):
    p = plan(src, dst)
    assert kinds(p) == want_kinds
    assert p.collectives == want_collectives
    assert p.collectives == collectives_1d(src, dst)
    assert p.src == src and p.dst == dst
    for s in p.steps:
        assert s.is_collective == (s.kind not in ("local_copy", "make_partial"))
        if s.is_collective:
            assert s.mesh_dims == (0,)
            assert s.group_shape == (4,)


def test_reduction_steps_carry_their_op_and_land_on_the_target():
    dst = L(A, M4, [S(1)], {1: [0, 3, 1, 2]})
    step = only_step(plan(L(A, M4, [P("avg")]), dst), "reduce_scatter")
    assert step.op == "avg"
    assert step.dst == dst
    assert [step.dst.local_shape((r,)) for r in range(4)] == [(8, 0), (8, 3), (8, 1), (8, 2)]
    step = only_step(plan(L(A, M4, [P("min")]), L(A, M4, [R()])), "allreduce")
    assert step.op == "min"
    mp = only_step(plan(L(A, M4, [R()]), L(A, M4, [P("sum")])), "make_partial")
    assert mp.mesh_dims == (0,)


# ----------------------------------------------------------------------------- N-D meshes


@pytest.mark.parametrize(
    "shape, mesh, src_pl, dst_pl, want_dims",
    [
        ((8, 6), (2, 2), [S(0), S(1)], [S(1), S(0)], (0, 1)),
        ((8, 6), (2, 2), [S(0), S(0)], [S(1), S(1)], (0, 1)),
        ((8, 6), (2, 2), [S(0), R()], [S(1), R()], (0,)),
        ((8, 6), (2, 2), [R(), S(0)], [R(), S(1)], (1,)),
        ((8, 6), (2, 3), [S(1), S(0)], [S(0), S(1)], (0, 1)),
        ((7, 11), (2, 3), [S(1), S(0)], [S(0), S(1)], (0, 1)),
    ],
)
def test_nd_mesh_one_collective(shape, mesh, src_pl, dst_pl, want_dims):
    src, dst = L(shape, mesh, src_pl), L(shape, mesh, dst_pl)
    p = plan(src, dst)
    assert p.collectives == 1
    assert kinds(p) == ["alltoallv"]
    assert p.steps[0].mesh_dims == want_dims
    check_exchange(p.steps[0])


@pytest.mark.parametrize("perm", [q for q in itertools.permutations(range(3)) if q != (0, 1, 2)])
def test_3d_mesh_permutations_one_collective(perm):
    shape, mesh = (8, 6, 4), (2, 2, 2)
    src = L(shape, mesh, [S(0), S(1), S(2)])
    dst = L(shape, mesh, [S(d) for d in perm])
    p = plan(src, dst)
    assert p.collectives == 1
    assert kinds(p) == ["alltoallv"]
    # the even splits leave the mesh dims whose placement is unchanged out of the exchange
    assert p.steps[0].mesh_dims == tuple(m for m in range(3) if perm[m] != m)
    check_exchange(p.steps[0])


def test_shard_only_targets_never_allgather():
    meshes = [((4,), (9, 6, 5)), ((2, 3), (9, 6, 5)), ((2, 2, 2), (8, 6, 5))]
    choices = [S(0), S(1), S(2), R(), P("sum")]
    n = 0
    for mesh, shape in meshes:
        for src_pl in itertools.product(choices, repeat=len(mesh)):
            for dst_pl in itertools.product([S(0), S(1), S(2)], repeat=len(mesh)):
                p = plan(L(shape, mesh, list(src_pl)), L(shape, mesh, list(dst_pl)))
                assert "allgatherv" not in kinds(p), (src_pl, dst_pl, kinds(p))
                # at most one collective per source Partial mesh dim, plus one exchange
                n_partial = sum(isinstance(x, Partial) for x in src_pl)
                assert p.collectives <= n_partial + 1, (src_pl, dst_pl, kinds(p))
                n += 1
    assert n == 5 * 3 + 25 * 9 + 125 * 27


def test_kept_partial_target_without_replicate_never_allgathers():
    shape, mesh = (8, 6), (2, 2)
    for a, b in [(S(0), S(1)), (S(1), S(0)), (R(), S(0))]:
        p = plan(L(shape, mesh, [P("sum"), a]), L(shape, mesh, [P("sum"), b]))
        assert "allgatherv" not in kinds(p) and p.collectives <= 1


# ----------------------------------------------------------------------------- conservation


CONSERVATION_CASES = [
    # mesh (4,)
    ((10, 6), (4,), [S(0)], None, [S(1)], None),
    ((10, 6), (4,), [S(0)], {0: [7, 0, 3, 0]}, [S(0)], {0: [1, 2, 3, 4]}),
    ((3, 5), (4,), [S(0)], None, [S(1)], None),  # 3 rows on 4 ranks: an empty shard
    ((5, 3), (4,), [S(1)], None, [S(0)], None),
    ((0, 5), (4,), [S(1)], None, [S(0)], None),  # nothing to move at all
    # mesh (7,)
    ((10, 13), (7,), [S(0)], None, [S(1)], None),
    ((5, 20), (7,), [S(1)], {1: [0, 0, 20, 0, 0, 0, 0]}, [S(0)], None),
    ((30,), (7,), [S(0)], None, [S(0)], {0: [10, 0, 0, 5, 5, 0, 10]}),
    # mesh (2, 3)
    ((8, 9), (2, 3), [S(0), S(1)], None, [S(1), S(0)], None),
    ((8, 9), (2, 3), [S(0), S(0)], None, [S(1), S(1)], None),
    ((6, 5), (2, 3), [R(), S(0)], None, [S(0), R()], None),  # replicated source
    ((6, 5), (2, 3), [S(1), R()], None, [R(), S(0)], None),
    ((7, 5), (2, 3), [S(0), R()], None, [S(1), S(0)], None),
    ((13, 4), (2, 3), [S(0), S(0)], None, [S(0), S(1)], None),  # nested source
    ((13, 4), (2, 3), [S(1), S(0)], None, [S(0), S(0)], None),  # nested target
    ((13, 4), (2, 3), [S(0), S(0)], {0: [0, 1, 2, 3, 4, 3]}, [S(1), S(1)], None),
    ((13, 4), (2, 3), [R(), S(0)], None, [S(0), S(0)], {0: [6, 0, 1, 0, 0, 6]}),
    ((2, 2), (2, 3), [S(0), S(1)], None, [S(1), S(0)], None),  # smaller than the mesh
    # mesh (2, 2, 2)
    ((8, 6, 4), (2, 2, 2), [S(0), S(1), S(2)], None, [S(2), S(0), S(1)], None),
    ((8, 6, 4), (2, 2, 2), [R(), S(0), R()], None, [S(1), S(1), S(0)], None),
    ((9, 5, 3), (2, 2, 2), [S(0), S(0), S(0)], None, [S(1), S(2), S(1)], None),
    ((9, 5, 3), (2, 2, 2), [S(2), R(), S(0)], None, [S(0), S(0), R()], None),
    ((8, 6), (2, 2, 2), [P("sum"), S(0), R()], None, [P("sum"), S(1), S(0)], None),
    ((3, 1, 2), (2, 2, 2), [S(0), S(1), S(2)], None, [S(2), S(0), S(0)], None),
]


@pytest.mark.parametrize("shape, mesh, src_pl, src_sz, dst_pl, dst_sz", CONSERVATION_CASES)
def test_alltoallv_conserves_data(shape, mesh, src_pl, src_sz, dst_pl, dst_sz):
    src, dst = L(shape, mesh, src_pl, src_sz), L(shape, mesh, dst_pl, dst_sz)
    p = plan(src, dst)
    assert kinds(p) == ["alltoallv"]
    step = p.steps[0]
    assert step.src == src and step.dst == dst
    blocks = check_exchange(step)
    if prod(shape):
        assert blocks > 0


def test_replicated_source_spreads_senders():
    # R on mesh dim 0: each receiver is served by the replica in its own mesh-dim-0 row.
    # Source rows by mesh dim 1: [0,2) [2,4) [4,6); target rows by mesh dim 0: [0,3) [3,6).
    src, dst = L((6, 5), (2, 3), [R(), S(0)]), L((6, 5), (2, 3), [S(0), R()])
    step = plan(src, dst).steps[0]
    assert step.mesh_dims == (1,)
    want = {
        0: {0: ((0, 2), (0, 5)), 1: ((2, 3), (0, 5))},
        1: {1: ((3, 4), (0, 5)), 2: ((4, 6), (0, 5))},
    }
    for c in all_coords((2, 3)):
        got = sorted(step.recvs(c))
        assert got == sorted(((c[0], j), box) for j, box in want[c[0]].items()), (c, got)
    # so each source rank serves both target rows only through its own replica row
    for c in all_coords((2, 3)):
        assert {peer[0] for peer, _ in step.sends(c)} <= {c[0]}


def test_nothing_crosses_ranks_in_local_copy():
    for src, dst in [
        (L((10, 6), (4,), [R()]), L((10, 6), (4,), [S(1)])),
        (L((10, 6), (2, 3), [R(), R()]), L((10, 6), (2, 3), [S(0), S(1)])),
        (L((10, 6), (2, 3), [S(0), R()]), L((10, 6), (2, 3), [S(0), S(1)])),
    ]:
        step = only_step(plan(src, dst), "local_copy")
        check_exchange(step)
        for c in all_coords(src.mesh_shape):
            assert all(peer == c for peer, _ in step.recvs(c))
            assert inside(box_of(dst, c), box_of(src, c)) or prod(dst.local_shape(c)) == 0


def test_allgatherv_receivers_get_every_group_member_shard():
    for src, dst in [
        (L((10, 6), (4,), [S(0)]), L((10, 6), (4,), [R()])),
        (L((10, 6), (2, 3), [S(0), S(1)]), L((10, 6), (2, 3), [S(0), R()])),
        (L((13,), (2, 3), [S(0), S(0)]), L((13,), (2, 3), [S(0), R()])),
    ]:
        step = only_step(plan(src, dst), "allgatherv")
        check_exchange(step)
        for c in all_coords(src.mesh_shape):
            members = {step.member(c, g) for g in range(prod(step.group_shape))}
            senders = {peer for peer, _ in step.recvs(c)}
            assert senders == {m for m in members if prod(src.local_shape(m))}


def test_random_exchanges_conserve_data():
    rng = random.Random(20240611)
    meshes = [(4,), (7,), (2, 3), (3, 2), (2, 2, 2)]
    seen = Counter()
    for _ in range(250):
        mesh = rng.choice(meshes)
        shape = tuple(rng.choice([1, 2, 3, 5, 8, 11]) for _ in range(rng.choice([1, 2, 3])))
        layouts = []
        for _ in range(2):
            pls = [rng.choice([S(d) for d in range(len(shape))] + [R()]) for _ in mesh]
            sizes = None
            if rng.random() < 0.4:
                sizes = {}
                for d, ext in L(shape, mesh, pls).sizes.items():
                    cuts = sorted(rng.randint(0, shape[d]) for _ in range(len(ext) - 1))
                    sizes[d] = [b - a for a, b in zip([0, *cuts], [*cuts, shape[d]])]
            layouts.append(L(shape, mesh, pls, sizes))
        p = plan(*layouts)
        assert p.collectives <= 1
        for step in p.steps:
            seen[step.kind] += 1
            check_exchange(step)
    assert seen["alltoallv"] > 50 and seen["allgatherv"] > 5 and seen["local_copy"] > 5


# ----------------------------------------------------------------------------- steps chain


@pytest.mark.parametrize(
    "shape, mesh, src_pl, dst_pl",
    [
        ((8, 6), (4,), [P("sum")], [S(1)]),
        ((8, 6), (2, 2), [P("sum"), P("max")], [S(0), R()]),
        ((8, 6), (2, 2), [P("sum"), P("sum")], [S(1), S(0)]),
        ((8, 6), (2, 2), [P("sum"), S(0)], [S(1), P("max")]),
        ((8, 6), (2, 3), [S(0), P("avg")], [R(), P("sum")]),
    ],
)
def test_steps_chain_from_source_to_target(shape, mesh, src_pl, dst_pl):
    src, dst = L(shape, mesh, src_pl), L(shape, mesh, dst_pl)
    p = plan(src, dst)
    assert p.steps
    assert p.steps[0].src == src
    for a, b in zip(p.steps, p.steps[1:]):
        assert a.dst == b.src
    assert p.steps[-1].dst == dst


def test_steps_chain_with_size_one_partial_dim_after_reduce_scatter():
    src = L((6, 2), (3, 1), [P("max"), P("max")])
    dst = L((6, 2), (3, 1), [S(0), R()])
    p = plan(src, dst)
    assert kinds(p) == ["reduce_scatter", "relabel"]
    assert p.collectives == 1
    assert p.steps[0].src == src and p.steps[0].dst == p.steps[1].src
    assert p.steps[-1].dst == dst


# ----------------------------------------------------------------------------- bytes, explain


def _diagonal_volume(n, parts):
    ext = [len(a) for a in np.array_split(np.arange(n), parts)]
    return sum(e * e for e in ext)


@pytest.mark.parametrize("n, parts", [(8, 4), (10, 4), (13, 7), (5, 8), (64, 3), (1, 2)])
def test_bytes_moved_transpose_is_off_diagonal(n, parts):
    mesh = (parts,)
    p = plan(L((n, n), mesh, [S(0)]), L((n, n), mesh, [S(1)]))
    # rank i keeps rows_i x cols_i; every other element moves once, 4 bytes each
    want = 4 * (n * n - _diagonal_volume(n, parts))
    assert p.bytes_moved == want
    per_rank = [p.rank_bytes((r,)) for r in range(parts)]
    assert sum(s for rb in per_rank for s, _ in rb) == want
    assert sum(r for rb in per_rank for _, r in rb) == want


def test_bytes_moved_simple_cases():
    a = L((10, 6), (4,), [S(0)], dtype="float64")
    assert plan(a, a).bytes_moved == 0
    assert plan(L((10, 6), (4,), [R()], dtype="float64"), a).bytes_moved == 0
    # allgatherv: every rank sends its rows to the 3 others
    assert plan(a, L((10, 6), (4,), [R()], dtype="float64")).bytes_moved == 3 * 60 * 8


def test_explain_mentions_the_collectives():
    a = L((8, 6), (4,), [S(0)])
    text = plan(a, L((8, 6), (4,), [S(1)])).explain()
    assert "alltoallv" in text and "[S(0)] -> [S(1)]" in text
    assert "1 collective(s)" in text
    assert f"{4 * (48 - 12)} B" in text  # bytes moved over all ranks
    assert "allgatherv" in plan(a, L((8, 6), (4,), [R()])).explain()
    assert "allreduce" in plan(L((8, 6), (4,), [P()]), L((8, 6), (4,), [R()])).explain()
    text = plan(L((8, 6), (4,), [P("max")]), L((8, 6), (4,), [S(1)])).explain(coords=(2,))
    assert "reduce_scatter" in text and "op=max" in text and "rank (2,)" in text
    assert "0 collective(s)" in plan(a, a).explain()
    assert "alltoallv" in str(plan(a, L((8, 6), (4,), [S(1)])))


# ----------------------------------------------------------------------------- cache, errors


def test_plan_is_cached_for_equal_layouts():
    a1, b1 = L((9, 4), (2, 2), [S(0), R()]), L((9, 4), (2, 2), [S(1), S(0)])
    a2, b2 = L([9, 4], [2, 2], (S(0), R())), L((9, 4), (2, 2), [S(-1), S(-2)])
    assert a1 is not a2 and b1 is not b2
    assert plan(a1, b1) is plan(a2, b2)
    assert plan(a1, b1) is not plan(b1, a1)
    b3 = L((9, 4), (2, 2), [S(1), S(0)], {0: [9, 0]})
    assert plan(a1, b3) is not plan(a1, b1)


@pytest.mark.parametrize(
    "src, dst, match",
    [
        (L((8, 6), (4,), [S(0)]), L((8, 7), (4,), [S(0)]), r"differ"),
        (L((8, 6), (4,), [S(0)]), L((8,), (4,), [S(0)]), r"differ"),
        (L((8, 6), (4,), [S(0)]), L((8, 6), (4,), [S(0)], dtype="float64"), r"differ"),
        (L((8, 6), (4,), [S(0)]), L((8, 6), (2, 2), [S(0), R()]), r"mesh shapes differ"),
        (L((8, 6), (4,), [S(0)]), L((8, 6), (5,), [S(0)]), r"mesh shapes differ"),
    ],
)
def test_plan_rejects_mismatched_layouts(src, dst, match):
    with pytest.raises(ValueError, match=match):
        plan(src, dst)


@pytest.mark.parametrize("bad", ["layout", None, 3, (8, 6)])
def test_plan_rejects_non_layouts(bad):
    a = L((8, 6), (4,), [S(0)])
    with pytest.raises(TypeError, match=r"Layout"):
        plan(a, bad)
    with pytest.raises(TypeError, match=r"Layout"):
        plan(bad, a)


# ----------------------------------------------------------------------------- explain, workspace


def test_plan_explain_says_what_the_plan_says():
    """Plan.explain() is the plan alone (no route, no GPU line: those depend on the settings
    and the core); ``notes`` go under their step, ``tail`` last."""
    p = plan(L((8, 6), (4,), [S(0)]), L((8, 6), (4,), [S(1)]))
    text = p.explain()
    assert "host arrays" not in text and "GPU arrays" not in text
    assert p.explain(notes=[None]) == text
    lines = p.explain(notes=["under step 0"], tail=["last"]).splitlines()
    step = [i for i, ln in enumerate(lines) if ln.startswith("  step 0: alltoallv")]
    assert step and lines[step[0] + 1].startswith("    rank (0,): sends")
    assert lines[step[0] + 2] == "    messages: at most 3 peers per rank"
    assert lines[step[0] + 3] == "    under step 0"
    assert lines[-1] == "  last"
    assert [ln for ln in lines if ln not in ("    under step 0", "  last")] == text.splitlines()


def test_execution_side_explain_adds_the_route_and_gpu_lines():
    """pyshard.explain.explain: the plan's text with, under each collective step, the rule in
    words (pyshard.route.describe) and with device="cuda" how GPU arrays reach MPI."""
    from pyshard.explain import explain
    from pyshard.route import describe

    a = L((8, 6), (2, 2), [P("sum"), S(0)])
    p = plan(a, a.replace([R(), S(1)]))
    assert kinds(p) == ["allreduce", "alltoallv"]
    notes = [f"host arrays, algorithm auto: {describe(s)}" for s in p.steps]
    text = explain(p, coords=(1, 0))
    assert text == p.explain((1, 0), notes) and text != p.explain((1, 0))
    cuda = explain(p, coords=(1, 0), device="cuda").splitlines()
    assert cuda[:-1] == text.splitlines() and cuda[-1].startswith("  GPU arrays: pack kernel")
    # nothing crosses ranks: no route line, no GPU line
    assert explain(plan(a, a), device="cuda") == plan(a, a).explain()
    with pytest.raises(ValueError, match="device"):
        explain(p, device="tpu")


def test_explain_follows_the_algorithm_and_the_settings():
    """explain() without a mesh names the path a call takes under the settings as they are:
    PYSHARD_ALGORITHM (or algorithm=), PYSHARD_SHM=off, a staged MPI transport (it said
    "node-shared memory ..." and "algorithm auto" under all of them)."""
    from pyshard.explain import explain

    a = L((512, 512), (4,), [S(0)])
    p = plan(a, a.replace([S(1)]))
    text = explain(p)
    assert "algorithm auto: node-shared memory between ranks of one node" in text
    assert "algorithm p2p: MPI (p2p)" in explain(p, algorithm="p2p")
    with ps.config.override(PYSHARD_ALGORITHM="alltoallw"):
        assert "algorithm alltoallw: MPI (alltoallw)" in explain(p)
    with ps.config.override(PYSHARD_SHM="off"):
        assert "algorithm auto: MPI (PYSHARD_SHM=off: no node-shared memory)" in explain(p)
    with ps.config.override(PYSHARD_TRANSPORT="staged"):
        assert "MPI staged through pinned host buffers (PYSHARD_SHM=off" in explain(p)
    assert "algorithm shm: node-shared memory where ranks" in explain(p, algorithm="shm")
    assert "measured at the first call" in explain(p, algorithm="tune")


def _aligned(n):
    return -(-n // 4096) * 4096


def test_workspace_rule_is_the_core_rule():
    """What Plan.peak_extra_bytes counts as pack/unpack memory (pyshard.blocks, pure Python)
    is the workspace the core's geometry of the same step reports (pyshard.geometry), on
    random steps of every collective kind, dtype and size split, and on a block that only
    its misalignment sends through the workspace."""
    from pyshard.blocks import workspace_bytes
    from pyshard.geometry import geometry

    rng = random.Random(41)
    meshes = [(2,), (3,), (4,), (2, 3), (3, 2), (2, 2, 2)]
    steps = []
    for _ in range(300):
        mesh = rng.choice(meshes)
        shape = tuple(rng.choice([1, 2, 3, 5, 8, 11]) for _ in range(rng.choice([1, 2, 3])))
        dtype = rng.choice(["float32", "float64", "float16", "int8", "complex128"])
        shards = [S(d) for d in range(len(shape))]
        layouts = []
        for choices in (shards + [R(), P("sum"), P("max")], shards + [R()]):
            pls = [rng.choice(choices) for _ in mesh]
            if dtype == "complex128":
                pls = [R() if p == P("max") else p for p in pls]
            sizes = None
            if rng.random() < 0.4:
                sizes = {}
                for d, ext in L(shape, mesh, pls, dtype=dtype).sizes.items():
                    cuts = sorted(rng.randint(0, shape[d]) for _ in range(len(ext) - 1))
                    sizes[d] = [b - a for a, b in zip([0, *cuts], [*cuts, shape[d]])]
            layouts.append(L(shape, mesh, pls, sizes, dtype=dtype))
        steps.extend(plan(*layouts).steps)
    # a contiguous 1.2 MB block at byte 4 of the source (misaligned: through the workspace)
    # and the same at byte 64 (aligned: straight from the array)
    n = 600_000
    for lo in (1, 16):
        src = L((n,), (2,), [S(0)], {0: [300_000 + lo, 300_000 - lo]})
        steps.extend(plan(src, src.replace([S(0)], {0: [lo, n - lo]})).steps)
    # a gather whose blocks are each contiguous and of one size, landed out of the group's
    # rank order (the group spans mesh dims 0 and 2; mesh dim 2 shards the outer array dim)
    # (blocks of two sizes: Allgatherv lands each where it goes, no workspace)
    src = L((2, 12, 4), (2, 2, 2), [S(1), R(), S(0)])
    (out_of_order,) = plan(src, src.replace([R(), R(), R()])).steps
    src = L((2, 11, 4), (2, 2, 2), [S(1), R(), S(0)])
    (uneven,) = plan(src, src.replace([R(), R(), R()])).steps
    steps += [out_of_order, uneven]
    nonzero, zero = Counter(), Counter()
    for s in steps:
        for c in all_coords(s.src.mesh_shape):
            g = geometry(s, c)
            want = 0 if g is None else int(g.workspace_bytes)
            assert workspace_bytes(s, c) == want, (s, c)
            (nonzero if want else zero)[str(s.kind)] += 1
    for kind in ("alltoallv", "allgatherv", "reduce_scatter"):
        assert nonzero[kind] > 5 and zero[kind] > 5, (kind, nonzero, zero)
    assert zero["allreduce"] > 5
    misaligned, aligned = steps[-4], steps[-3]
    assert workspace_bytes(misaligned, (0,)) == _aligned(300_000 * 4)
    assert workspace_bytes(aligned, (0,)) == 0
    assert out_of_order.kind == "allgatherv"
    assert workspace_bytes(out_of_order, (0, 0, 0)) == 2 * 12 * 4 * 4
    assert uneven.kind == "allgatherv" and workspace_bytes(uneven, (0, 0, 0)) == 0


# ----------------------------------------------------------------------------- scale, accounting


def _enumerated_bytes(p):
    total = 0
    for coords in itertools.product(*[range(m) for m in p.src.mesh_shape]):
        for s in p.steps:
            if s.kind == "alltoallv":
                total += (
                    sum(
                        prod(hi - lo for lo, hi in box) for r, box in s.sends(coords) if r != coords
                    )
                    * s.src.dtype.itemsize
                )
    return total


@pytest.mark.parametrize(
    "mesh,src,dst,shape",
    [
        ((4,), [S(0)], [S(1)], (13, 7)),
        ((2, 3), [S(0), S(1)], [S(1), S(0)], (7, 10)),
        ((2, 3), [R(), S(1)], [S(0), S(0)], (11, 5)),
        ((2, 2, 2), [S(0), S(1), S(2)], [S(2), S(0), S(1)], (5, 6, 7)),
        ((3, 2), [S(1), R()], [S(0), S(1)], (3, 2)),
    ],
)
def test_bytes_moved_matches_enumeration(mesh, src, dst, shape):
    p = plan(L(shape, mesh, src), L(shape, mesh, dst))
    assert p.bytes_moved == _enumerated_bytes(p)
    for coords in itertools.product(*[range(m) for m in mesh]):
        for s in p.steps:
            assert s.send_volume(coords) == sum(
                prod(hi - lo for lo, hi in b) for _, b in s.sends(coords)
            )


@pytest.mark.parametrize("src,dst", [([S(0), S(0)], [S(1), S(1)]), ([S(0), S(1)], [S(1), S(0)])])
def test_plan_4096_ranks_bytes_add_up(src, dst):
    """S0 -> S1 on a 64x64 mesh (4096 ranks), serially: bytes add up exactly, fast."""
    import time

    t0 = time.perf_counter()
    shape = (5003, 4099)
    a, b = L(shape, (64, 64), src), L(shape, (64, 64), dst)
    p = plan(a, b)
    assert p.collectives == 1 and p.steps[0].kind == "alltoallv"
    assert p.steps[0].mesh_dims == (0, 1)
    item = 4
    coords = list(itertools.product(range(64), range(64)))
    # every rank receives its whole target box except what it already holds
    held = 0
    for c in coords:
        ov = 1
        for d in range(2):
            (alo, ahi), (blo, bhi) = a.interval(d, c), b.interval(d, c)
            ov *= max(0, min(ahi, bhi) - max(alo, blo))
        held += ov
    assert p.bytes_moved == (5003 * 4099 - held) * item
    # what the senders send adds up to what the receivers receive
    sent = sum(p.rank_bytes(c)[0][0] for c in coords)
    recvd = sum(p.rank_bytes(c)[0][1] for c in coords)
    assert sent == recvd == p.bytes_moved
    assert time.perf_counter() - t0 < 10


def test_many_plan_fuses_single_exchanges_per_communicator():
    from pyshard import ManyPlan

    def lay(shape, placements, mesh=(2, 3)):
        return Layout(shape, "float32", mesh, placements)

    s0, s1, r = Shard(0), Shard(1), Replicate()
    plans = [
        plan(lay((6, 9), [s0, s1]), lay((6, 9), [s1, s0])),  # one whole-mesh exchange
        plan(lay((5, 7), [s0, r]), lay((5, 7), [s1, r])),  # one exchange on mesh dim 0
        plan(lay((8, 3), [s0, s1]), lay((8, 3), [s1, s0])),  # whole mesh again
        plan(lay((4, 4), [s0, r]), lay((4, 4), [r, r])),  # a gather: on its own
        plan(lay((7, 2), [r, s0]), lay((7, 2), [r, s1])),  # mesh dim 1
    ]
    mp = ManyPlan(plans)
    assert [(dims, ix) for dims, ix in mp.fused] == [((0,), (1,)), ((0, 1), (0, 2)), ((1,), (4,))]
    assert mp.single == (3,)
    # one fused exchange per communicator (mesh dims 0; 0 and 1; 1), and the gather of array 3
    # ([S(0), R] -> [R, R]: one Allgatherv over mesh dim 0)
    assert mp.collectives == 4
    text = mp.explain((1, 2))
    assert "5 array(s)" in text and "for 2 array(s) [0, 2]" in text and "array 3:" in text
