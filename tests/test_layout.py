"""Serial tests of pyshard.layout: split rules, placements and layouts (no MPI needed)."""

from __future__ import annotations

import dataclasses
import itertools
from math import prod

import numpy as np
import pytest

from pyshard.layout import Layout, Partial, Replicate, Shard, split_sizes

# ----------------------------------------------------------------------------- references


def ref_balanced(n, parts):
    """numpy.array_split's part lengths."""
    return tuple(len(a) for a in np.array_split(np.arange(n), parts))


def ref_chunk(n, parts):
    """torch.chunk's part lengths (chunks of ceil(n / parts), the rest last), padded with 0."""
    c = -(-n // parts) if n else 0
    return tuple(max(0, min(c, n - i * c)) for i in range(parts))


def box_lengths(box):
    return tuple(s.stop - s.start for s in box)


def all_coords(mesh_shape):
    return itertools.product(*[range(m) for m in mesh_shape])


def coverage(layout):
    """How many ranks hold each element of the global array (marks a counter array)."""
    counter = np.zeros(layout.shape, dtype=np.int64)
    for c in all_coords(layout.mesh_shape):
        box = layout.box(c)
        assert all(isinstance(s, slice) and s.step is None for s in box)
        assert all(0 <= s.start <= s.stop <= n for s, n in zip(box, layout.shape))
        assert layout.local_shape(c) == box_lengths(box)
        counter[box] += 1
    return counter


def multiplicity(placements, mesh_shape):
    """Copies of each element: the product of the mesh dims that do not shard."""
    return prod(m for m, p in zip(mesh_shape, placements) if not isinstance(p, Shard))


# ----------------------------------------------------------------------------- split_sizes


@pytest.mark.parametrize(
    "args, expected",
    [
        ((10, 4), (3, 3, 2, 2)),
        ((10, 4, "balanced"), (3, 3, 2, 2)),
        ((10, 4, "chunk"), (3, 3, 3, 1)),
        ((101, 2), (51, 50)),
        ((101, 2, "chunk"), (51, 50)),
        ((3, 4), (1, 1, 1, 0)),
        ((3, 4, "chunk"), (1, 1, 1, 0)),
        ((2, 7), (1, 1, 0, 0, 0, 0, 0)),
        ((2, 7, "chunk"), (1, 1, 0, 0, 0, 0, 0)),
        ((0, 3), (0, 0, 0)),
        ((0, 3, "chunk"), (0, 0, 0)),
        ((0, 1), (0,)),
        ((7, 1), (7,)),
        ((5, 4, "chunk"), (2, 2, 1, 0)),
        ((6, 4, "chunk"), (2, 2, 2, 0)),
        ((6, 4), (2, 2, 1, 1)),
        ((9, 4, "chunk"), (3, 3, 3, 0)),
        ((130, 2, "balanced", 64), (64, 66)),
        ((130, 2, "chunk", 64), (64, 66)),
        ((10, 4, "balanced", 64), (0, 0, 0, 10)),
        ((10, 4, "chunk", 64), (0, 0, 0, 10)),
        ((256, 3, "balanced", 64), (128, 64, 64)),
        ((256, 3, "chunk", 64), (128, 128, 0)),
        ((300, 3, "chunk", 64), (128, 128, 44)),
        ((0, 2, "balanced", 8), (0, 0)),
    ],
)
def test_split_sizes_anchors(args, expected):
    assert split_sizes(*args) == expected


def test_split_sizes_keywords_and_numpy_ints():
    out = split_sizes(n=np.int64(10), parts=np.int32(4), rule="chunk", grain=np.int16(1))
    assert out == (3, 3, 3, 1)
    assert all(type(v) is int for v in out)
    assert all(type(v) is int for v in split_sizes(np.uint8(200), 3, grain=np.int64(7)))


def test_split_sizes_property_loop():
    ns = list(range(0, 41)) + [63, 64, 65, 127, 128, 129, 1000, 4095, 4097]
    checked = 0
    for n, parts, rule, grain in itertools.product(
        ns, [1, 2, 3, 4, 5, 7, 8, 16], ["balanced", "chunk"], [1, 2, 3, 8, 64]
    ):
        out = split_sizes(n, parts, rule, grain)
        assert isinstance(out, tuple)
        assert len(out) == parts, (n, parts, rule, grain)
        assert sum(out) == n, (n, parts, rule, grain)
        assert all(type(v) is int and v >= 0 for v in out), (n, parts, rule, grain, out)
        assert all(v % grain == 0 for v in out[:-1]), (n, parts, rule, grain, out)
        # the split is made in whole grains; the remainder n % grain goes to the last part
        units = [v // grain for v in out[:-1]] + [(out[-1] - n % grain) // grain]
        assert (out[-1] - n % grain) % grain == 0
        ref = ref_balanced if rule == "balanced" else ref_chunk
        assert tuple(units) == ref(n // grain, parts), (n, parts, rule, grain, out)
        if grain == 1:
            assert out == ref(n, parts)
            if rule == "balanced":
                assert out == tuple(len(a) for a in np.array_split(range(n), parts))
                assert max(out) - min(out) <= 1
            else:
                assert list(out) == sorted(out, reverse=True)
        checked += 1
    assert checked == len(ns) * 8 * 2 * 5


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(n=-1, parts=4), ValueError, r"split_sizes\(n\)"),
        (dict(n=10, parts=0), ValueError, r"split_sizes\(parts\)"),
        (dict(n=10, parts=-3), ValueError, r"split_sizes\(parts\)"),
        (dict(n=10, parts=4, grain=0), ValueError, r"split_sizes\(grain\)"),
        (dict(n=10, parts=4, grain=-2), ValueError, r"split_sizes\(grain\)"),
        (dict(n=10, parts=4, rule="even"), ValueError, r"split_sizes\(rule\)"),
        (dict(n=10, parts=4, rule="Balanced"), ValueError, r"split_sizes\(rule\)"),
        (dict(n=10, parts=4, rule=None), ValueError, r"split_sizes\(rule\)"),
        (dict(n=10.0, parts=4), TypeError, r"split_sizes\(n\)"),
        (dict(n=10.5, parts=4), TypeError, r"split_sizes\(n\)"),
        (dict(n="10", parts=4), TypeError, r"split_sizes\(n\)"),
        (dict(n=10, parts=4.0), TypeError, r"split_sizes\(parts\)"),
        (dict(n=10, parts=4, grain=1.0), TypeError, r"split_sizes\(grain\)"),
        (dict(n=True, parts=4), TypeError, r"split_sizes\(n\)"),
        (dict(n=10, parts=True), TypeError, r"split_sizes\(parts\)"),
        (dict(n=10, parts=4, grain=True), TypeError, r"split_sizes\(grain\)"),
        (dict(n=np.bool_(True), parts=4), TypeError, r"split_sizes\(n\)"),
        (dict(n=None, parts=4), TypeError, r"split_sizes\(n\)"),
    ],
)
def test_split_sizes_bad_arguments(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        split_sizes(**kwargs)


# ----------------------------------------------------------------------------- placements


def test_placement_repr_and_str():
    assert repr(Shard(0)) == "Shard(dim=0)"
    assert repr(Shard(-1)) == "Shard(dim=-1)"
    assert str(Shard(0)) == "S(0)"
    assert str(Shard(3)) == "S(3)"
    assert repr(Replicate()) == "Replicate()"
    assert str(Replicate()) == "R"
    assert repr(Partial()) == "Partial(op='sum')"
    assert str(Partial()) == "P(sum)"
    assert str(Partial("avg")) == "P(avg)"
    assert str(Partial("max")) == "P(max)"
    assert str(Partial(op="min")) == "P(min)"


def test_placements_are_frozen():
    s, p = Shard(0), Partial("sum")
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.dim = 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.op = "max"
    assert s.dim == 0 and p.op == "sum"


@pytest.mark.parametrize(
    "make, exc, match",
    [
        (lambda: Partial("bogus"), ValueError, r"Partial\(op\)"),
        (lambda: Partial("SUM"), ValueError, r"Partial\(op\)"),
        (lambda: Partial(None), ValueError, r"Partial\(op\)"),
        (lambda: Shard("x"), TypeError, r"Shard\(dim\)"),
        (lambda: Shard(1.0), TypeError, r"Shard\(dim\)"),
        (lambda: Shard(True), TypeError, r"Shard\(dim\)"),
        (lambda: Shard(None), TypeError, r"Shard\(dim\)"),
    ],
)
def test_placement_bad_arguments(make, exc, match):
    with pytest.raises(exc, match=match):
        make()


def test_shard_numpy_int_becomes_int():
    s = Shard(np.int64(2))
    assert s.dim == 2 and type(s.dim) is int
    assert s == Shard(2) and hash(s) == hash(Shard(2))


def test_placement_equality_and_hash():
    assert Shard(0) == Shard(0) and hash(Shard(0)) == hash(Shard(0))
    assert Shard(0) != Shard(1)
    assert Replicate() == Replicate() and hash(Replicate()) == hash(Replicate())
    assert Partial() == Partial("sum") and hash(Partial()) == hash(Partial("sum"))
    assert Partial("sum") != Partial("max")
    assert Shard(0) != Replicate()
    assert Replicate() != Partial()
    assert Shard(0) != 0 and Shard(0) != "S(0)"
    distinct = {Shard(0), Shard(0), Shard(1), Replicate(), Replicate(), Partial(), Partial("sum")}
    assert len(distinct) == 4
    assert {Shard(1): "a"}[Shard(1)] == "a"


# ----------------------------------------------------------------------------- tiling


def _placement_choices(ndim):
    return [Shard(d) for d in range(ndim)] + [Replicate(), Partial()]


TILING_CASES = []
for _mesh, _shapes in [
    ((1,), [(5,), (0,), (3, 4), ()]),
    ((4,), [(10,), (3,), (0,), (4, 1), (7, 5), (0, 9)]),
    ((7,), [(10,), (3,), (0,), (7, 5), (13, 2)]),
    ((2, 3), [(10,), (1,), (0,), (7, 5), (2, 0), (5, 1, 3)]),
]:
    for _shape in _shapes:
        for _pl in itertools.product(*[_placement_choices(len(_shape))] * len(_mesh)):
            TILING_CASES.append((_mesh, _shape, list(_pl)))


def test_tiling_case_count():
    # guard against the parametrisation silently shrinking
    assert len(TILING_CASES) == 134


@pytest.mark.parametrize("rule", ["balanced", "chunk"])
def test_boxes_tile_the_global_array(rule):
    for mesh, shape, pls in TILING_CASES:
        layout = Layout(shape, "float32", mesh, pls, rule=rule)
        counter = coverage(layout)
        want = multiplicity(pls, mesh)
        assert (counter == want).all(), (mesh, shape, pls, rule, counter)
        # the layout's own facts agree with the placements
        assert layout.mesh_size == prod(mesh)
        assert layout.ndim == len(shape)


@pytest.mark.parametrize(
    "mesh, shape, pls",
    [
        ((4096,), (5000,), [Shard(0)]),
        ((4096,), (100,), [Shard(0)]),
        ((4096,), (0, 3), [Shard(0)]),
        ((4096,), (3, 7), [Shard(1)]),
        ((4096,), (50,), [Replicate()]),
        ((64, 64), (100, 70), [Shard(0), Shard(1)]),
        ((64, 64), (100, 70), [Shard(1), Shard(0)]),
        ((64, 64), (100, 70), [Shard(0), Replicate()]),
        ((64, 64), (100, 70), [Replicate(), Shard(1)]),
        ((64, 64), (5000, 2), [Shard(0), Shard(0)]),
        ((64, 64), (30, 3), [Shard(0), Shard(0)]),
        ((64, 64), (10, 7), [Partial(), Shard(1)]),
    ],
)
def test_boxes_tile_on_large_meshes(mesh, shape, pls):
    layout = Layout(shape, "float64", mesh, pls)
    counter = coverage(layout)
    assert (counter == multiplicity(pls, mesh)).all()


def test_4096_rank_extents_match_array_split():
    layout = Layout((5000,), "int32", (4096,), [Shard(0)])
    lengths = [layout.local_shape((r,))[0] for r in range(4096)]
    assert tuple(lengths) == ref_balanced(5000, 4096)
    assert lengths.count(2) == 5000 - 4096 and lengths.count(1) == 2 * 4096 - 5000
    # intervals are contiguous and in rank order
    starts = np.array([layout.box((r,))[0].start for r in range(4096)])
    assert (starts == np.concatenate(([0], np.cumsum(lengths)[:-1]))).all()
    small = Layout((100,), "int32", (4096,), [Shard(0)], rule="chunk")
    assert sum(small.local_shape((r,))[0] for r in range(4096)) == 100
    assert small.local_shape((99,)) == (1,) and small.local_shape((100,)) == (0,)


def test_64x64_mesh_boxes_by_hand():
    layout = Layout((100, 70), "float32", (64, 64), [Shard(0), Shard(1)])
    rows, cols = ref_balanced(100, 64), ref_balanced(70, 64)
    roff = np.concatenate(([0], np.cumsum(rows)))
    coff = np.concatenate(([0], np.cumsum(cols)))
    for i, j in [(0, 0), (35, 5), (36, 6), (63, 63), (10, 40)]:
        assert layout.box((i, j)) == (
            slice(int(roff[i]), int(roff[i + 1])),
            slice(int(coff[j]), int(coff[j + 1])),
        )


# ----------------------------------------------------------------------------- nested


def test_nested_sharding_earlier_mesh_dim_splits_first():
    layout = Layout((10,), "float64", (2, 3), [Shard(0), Shard(0)])
    # 10 over 2 = (5, 5); each 5 over 3 = (2, 2, 1)
    assert layout.table[0][0] == (0, 1)
    assert layout.table[0][1] == (2, 2, 1, 2, 2, 1)
    assert layout.table[0][2] == (0, 2, 4, 5, 7, 9)
    expect = {
        (0, 0): (0, 2),
        (0, 1): (2, 4),
        (0, 2): (4, 5),
        (1, 0): (5, 7),
        (1, 1): (7, 9),
        (1, 2): (9, 10),
    }
    for c, (lo, hi) in expect.items():
        assert layout.box(c) == (slice(lo, hi),)
    assert (coverage(layout) == 1).all()


def test_nested_sharding_matches_repeated_array_split():
    for shape, mesh, pls, d in [
        ((11, 4), (3, 2), [Shard(0), Shard(0)], 0),
        ((4, 17), (2, 2, 2), [Shard(1), Replicate(), Shard(1)], 1),
        ((4, 17), (2, 2, 3), [Shard(1), Shard(0), Shard(1)], 1),
        ((23,), (2, 3, 2), [Shard(0), Shard(0), Shard(0)], 0),
    ]:
        layout = Layout(shape, "float32", mesh, pls)
        mdims = tuple(m for m, p in enumerate(pls) if p == Shard(d))
        pieces = [np.arange(shape[d])]
        for m in mdims:
            pieces = [q for piece in pieces for q in np.array_split(piece, mesh[m])]
        assert layout.table[d][0] == mdims
        assert layout.table[d][1] == tuple(len(q) for q in pieces)
        for c in all_coords(mesh):
            k = 0
            for m in mdims:
                k = k * mesh[m] + c[m]
            box = layout.box(c)[d]
            piece = pieces[k]
            assert (box.start, box.stop) == (
                (int(piece[0]), int(piece[-1]) + 1) if len(piece) else (box.start, box.start)
            )
        assert (coverage(layout) == multiplicity(pls, mesh)).all()


# ----------------------------------------------------------------------------- explicit sizes


def test_explicit_sizes_uneven():
    layout = Layout((101,), "float32", (4,), [Shard(0)], sizes={0: [98, 1, 1, 1]})
    assert layout.table[0] == ((0,), (98, 1, 1, 1), (0, 98, 99, 100))
    assert [layout.box((r,)) for r in range(4)] == [
        (slice(0, 98),),
        (slice(98, 99),),
        (slice(99, 100),),
        (slice(100, 101),),
    ]
    assert layout.sizes == {0: (98, 1, 1, 1)}
    assert (coverage(layout) == 1).all()


def test_explicit_sizes_with_zeros():
    layout = Layout((6, 3), "int64", (4,), [Shard(0)], sizes={0: (0, 4, 0, 2)})
    assert [layout.local_shape((r,)) for r in range(4)] == [(0, 3), (4, 3), (0, 3), (2, 3)]
    assert layout.box((1,)) == (slice(0, 4), slice(0, 3))
    assert layout.box((3,)) == (slice(4, 6), slice(0, 3))
    assert (coverage(layout) == 1).all()
    all_on_one = Layout((5,), "int64", (4,), [Shard(0)], sizes={0: [0, 0, 5, 0]})
    assert [all_on_one.local_shape((r,)) for r in range(4)] == [(0,), (0,), (5,), (0,)]


def test_explicit_sizes_nested_dim():
    layout = Layout((21, 2), "float64", (2, 3), [Shard(0), Shard(0)], sizes={0: [1, 2, 3, 4, 5, 6]})
    offs = np.concatenate(([0], np.cumsum([1, 2, 3, 4, 5, 6])))
    for i, j in all_coords((2, 3)):
        k = i * 3 + j
        assert layout.box((i, j)) == (slice(int(offs[k]), int(offs[k + 1])), slice(0, 2))
    assert (coverage(layout) == 1).all()


def test_explicit_sizes_forms():
    base = Layout((10, 4), "float32", (4,), [Shard(0)], sizes={0: [4, 3, 2, 1]})
    assert Layout((10, 4), "float32", (4,), [Shard(0)], sizes={0: (4, 3, 2, 1)}) == base
    assert Layout((10, 4), "float32", (4,), [Shard(0)], sizes={0: np.array([4, 3, 2, 1])}) == base
    assert Layout((10, 4), "float32", (4,), [Shard(0)], sizes={-2: [4, 3, 2, 1]}) == base
    # sizes equal to the default split give the same layout as no sizes
    default = Layout((10, 4), "float32", (4,), [Shard(0)])
    assert Layout((10, 4), "float32", (4,), [Shard(0)], sizes={0: [3, 3, 2, 2]}) == default
    # the sizes property is a valid sizes argument
    assert Layout((10, 4), "float32", (4,), [Shard(0)], sizes=base.sizes) == base
    assert default.sizes == {0: (3, 3, 2, 2)}
    assert Layout((10, 4), "float32", (4,), [Replicate()]).sizes == {}


# ----------------------------------------------------------------------------- bad input


def _mk(shape=(10, 4), dtype="float32", mesh=(4,), pls=None, sizes=None):
    return Layout(shape, dtype, mesh, [Shard(0)] if pls is None else pls, sizes)


@pytest.mark.parametrize(
    "make, exc, match",
    [
        # placements
        (lambda: _mk(mesh=(2, 2), pls=[Shard(0)]), ValueError, r"placements has 1 entries"),
        (lambda: _mk(pls=[Shard(0), Replicate()]), ValueError, r"placements has 2 entries"),
        (lambda: _mk(pls=[]), ValueError, r"placements has 0 entries"),
        (lambda: _mk(pls=[Shard(2)]), ValueError, r"placements\[0\].*out of range"),
        (lambda: _mk(pls=[Shard(-3)]), ValueError, r"placements\[0\].*out of range"),
        (
            lambda: _mk(mesh=(2, 2), pls=[Replicate(), Shard(5)]),
            ValueError,
            r"placements\[1\].*out of range",
        ),
        (lambda: _mk(shape=(), pls=[Shard(0)]), ValueError, r"placements\[0\].*out of range"),
        (lambda: _mk(pls=["S0"]), TypeError, r"placements\[0\]"),
        (lambda: _mk(pls=[0]), TypeError, r"placements\[0\]"),
        (lambda: _mk(mesh=(2, 2), pls=[Shard(0), None]), TypeError, r"placements\[1\]"),
        (lambda: _mk(pls=Shard(0)), TypeError, r"placements must be a list"),
        (lambda: _mk(pls=Replicate()), TypeError, r"placements must be a list"),
        (lambda: _mk(pls="S0"), TypeError, r"placements must be a list"),
        (lambda: _mk(pls=[Partial("bogus")]), ValueError, r"Partial\(op\)"),
        # sizes
        (lambda: _mk(sizes={0: [3, 3, 3, 3]}), ValueError, r"sizes\[0\] sums to 12"),
        (lambda: _mk(sizes={0: [1, 1, 1, 1]}), ValueError, r"sizes\[0\] sums to 4"),
        (lambda: _mk(sizes={0: [-1, 5, 3, 3]}), ValueError, r"sizes\[0\] has a negative"),
        (lambda: _mk(sizes={0: [2.5, 2.5, 2.5, 2.5]}), TypeError, r"sizes\[0\] entry"),
        (lambda: _mk(sizes={0: ["3", 3, 2, 2]}), TypeError, r"sizes\[0\] entry"),
        (lambda: _mk(sizes={0: [True, 3, 3, 3]}), TypeError, r"sizes\[0\] entry"),
        (lambda: _mk(sizes={0: "3322"}), TypeError, r"sizes\[0\] must be a sequence"),
        (lambda: _mk(sizes={0: 10}), TypeError, r"sizes\[0\] must be a sequence"),
        (lambda: _mk(sizes={0: [4, 3, 3]}), ValueError, r"sizes\[0\] has 3 extents"),
        (lambda: _mk(sizes={0: [2, 2, 2, 2, 2]}), ValueError, r"sizes\[0\] has 5 extents"),
        (
            lambda: _mk(mesh=(2, 3), pls=[Shard(0), Shard(0)], sizes={0: [5, 5]}),
            ValueError,
            r"sizes\[0\] has 2 extents .* 6 shards",
        ),
        (lambda: _mk(sizes={1: [1, 1, 1, 1]}), ValueError, r"sizes\[1\].*not sharded"),
        (lambda: _mk(pls=[Replicate()], sizes={0: [10]}), ValueError, r"sizes\[0\].*not sharded"),
        (lambda: _mk(sizes={2: [1, 1, 1, 1]}), ValueError, r"sizes\[2\].*out of range"),
        (lambda: _mk(sizes={"0": [3, 3, 2, 2]}), TypeError, r"sizes key"),
        (lambda: _mk(sizes=[3, 3, 2, 2]), TypeError, r"sizes must be a dict"),
        # dtype
        (lambda: _mk(dtype=object), TypeError, r"dtype"),
        (lambda: _mk(dtype="U4"), TypeError, r"dtype"),
        (lambda: _mk(dtype=str), TypeError, r"dtype"),
        (lambda: _mk(dtype="S8"), TypeError, r"dtype"),
        (lambda: _mk(dtype="datetime64[s]"), TypeError, r"dtype"),
        (lambda: _mk(dtype=[("a", "f4"), ("b", "i4")]), TypeError, r"dtype"),
        (lambda: _mk(dtype="not-a-dtype"), TypeError, r"dtype"),
        # reductions the dtype cannot do
        (lambda: _mk(dtype="int32", pls=[Partial("avg")]), ValueError, r"avg"),
        (lambda: _mk(dtype=bool, pls=[Partial("avg")]), ValueError, r"avg"),
        (lambda: _mk(dtype="complex128", pls=[Partial("max")]), ValueError, r"max.*complex"),
        (lambda: _mk(dtype="complex64", pls=[Partial("min")]), ValueError, r"min.*complex"),
        *([(lambda: _mk(dtype=np.longdouble, pls=[Partial("sum")]), ValueError,
            r"pyshard reduces no float128"),
           (lambda: _mk(dtype=np.clongdouble, pls=[Partial("sum")]), ValueError,
            r"pyshard reduces no complex256")] if np.dtype(np.longdouble).itemsize > 8 else []),
        # shapes
        (lambda: _mk(shape=(-1, 4)), ValueError, r"global_shape"),
        (lambda: _mk(shape=(2.0, 4)), TypeError, r"global_shape"),
        (lambda: _mk(shape="ab"), TypeError, r"global_shape"),
        (lambda: _mk(mesh=(0,)), ValueError, r"mesh shape"),
        (lambda: _mk(mesh=(), pls=[]), ValueError, r"mesh shape"),
        (lambda: _mk(mesh=(-2,)), ValueError, r"mesh shape"),
        (lambda: _mk(mesh=(4.0,)), TypeError, r"mesh shape"),
    ],
)
def test_layout_bad_input(make, exc, match):
    with pytest.raises(exc, match=match):
        make()


def test_layout_good_reductions_and_dtypes():
    assert _mk(dtype="float32", pls=[Partial("avg")]).placements == (Partial("avg"),)
    assert _mk(dtype="complex64", pls=[Partial("avg")]).dtype == np.complex64
    assert _mk(dtype="int8", pls=[Partial("max")]).dtype == np.int8
    assert _mk(dtype="complex128", pls=[Partial("sum")]).dtype == np.complex128
    assert _mk(dtype=bool, pls=[Partial("min")]).dtype == np.bool_
    assert _mk(dtype="float16").dtype == np.float16
    assert _mk(dtype=np.uint64).dtype == np.uint64


@pytest.mark.parametrize("coords", [(4,), (-1,), (0, 0), ()])
def test_box_rejects_coords_outside_the_mesh(coords):
    layout = _mk()
    with pytest.raises(ValueError, match=r"coords"):
        layout.box(coords)


@pytest.mark.parametrize(
    "pls, sizes",
    [([Replicate()], None), ([Partial()], None), ([Shard(0)], {0: [3, 3, 2, 2]})],
)
def test_layout_rejects_unknown_rule_even_when_unused(pls, sizes):
    with pytest.raises(ValueError, match=r"rule"):
        Layout((10,), "float32", (4,), pls, sizes, rule="bogus")


def test_layout_rejects_unknown_rule_when_used():
    with pytest.raises(ValueError, match=r"rule"):
        Layout((10,), "float32", (4,), [Shard(0)], rule="bogus")


# ----------------------------------------------------------------------------- identity


def test_layout_equality_and_hash():
    a = Layout((10, 4), "float32", (2, 2), [Shard(0), Replicate()])
    b = Layout([10, 4], np.float32, [2, 2], (Shard(0), Replicate()))
    assert a == b and hash(a) == hash(b)
    assert {a: 1}[b] == 1
    assert len({a, b}) == 1
    assert a != Layout((10, 4), "float64", (2, 2), [Shard(0), Replicate()])
    assert a != Layout((10, 5), "float32", (2, 2), [Shard(0), Replicate()])
    assert a != Layout((10, 4), "float32", (2, 2), [Replicate(), Shard(0)])
    assert a != Layout((10, 4), "float32", (4, 1), [Shard(0), Replicate()])
    assert a != Layout((10, 4), "float32", (2, 2), [Shard(0), Partial()])
    assert a != "Layout" and a != (10, 4)


def test_layout_different_sizes_not_equal():
    a = Layout((10,), "float32", (4,), [Shard(0)], sizes={0: [4, 3, 2, 1]})
    b = Layout((10,), "float32", (4,), [Shard(0)], sizes={0: [1, 2, 3, 4]})
    c = Layout((10,), "float32", (4,), [Shard(0)])
    assert a != b and a != c and b != c
    assert a == Layout((10,), "float32", (4,), [Shard(0)], sizes={0: [4, 3, 2, 1]})
    chunk = Layout((10,), "float32", (4,), [Shard(0)], rule="chunk")
    assert chunk.table[0][1] == (3, 3, 3, 1)
    assert chunk != c
    assert chunk == Layout((10,), "float32", (4,), [Shard(0)], sizes={0: [3, 3, 3, 1]})


def test_negative_shard_dims_normalise():
    neg = Layout((6, 8), "float32", (2,), [Shard(-1)])
    pos = Layout((6, 8), "float32", (2,), [Shard(1)])
    assert neg == pos and hash(neg) == hash(pos)
    assert neg.placements == (Shard(1),)
    assert neg.box((1,)) == (slice(0, 6), slice(4, 8))
    neg2 = Layout((6, 8, 2), "float32", (2, 2), [Shard(-3), Shard(-2)])
    assert neg2 == Layout((6, 8, 2), "float32", (2, 2), [Shard(0), Shard(1)])
    # negative sizes keys normalise too
    assert Layout((6, 8), "float32", (2,), [Shard(-1)], sizes={-1: [1, 7]}) == Layout(
        (6, 8), "float32", (2,), [Shard(1)], sizes={1: [1, 7]}
    )


def test_layout_derived_facts():
    layout = Layout((9, 4), "float32", (2, 3, 2), [Shard(1), Partial("max"), Shard(0)])
    assert layout.ndim == 2 and layout.mesh_size == 12
    assert layout.sharding_mesh_dims() == (0, 2)
    assert layout.partial_mesh_dims() == (1,)
    assert layout.sizes == {0: (5, 4), 1: (2, 2)}
    assert layout.interval(0, (0, 2, 1)) == (5, 9)
    assert layout.interval(1, (1, 0, 0)) == (2, 4)
    assert layout.shard_index(0, (1, 1, 1)) == 1
    assert "S(1), P(max), S(0)" in repr(layout) and "2x3x2" in repr(layout)
    # repr names uneven sizes
    assert "sizes={0: (5, 4)}" in repr(layout)


@pytest.mark.parametrize(
    "coords, exc",
    [((0.9, 2.7), TypeError), ((1.0, 0), TypeError), (("1", "2"), TypeError),
     ((True, False), TypeError), ((np.bool_(True), 0), TypeError), (1, TypeError),
     ("12", TypeError), ((np.float64(1), 0), TypeError), ((2, 0), ValueError)],
)
def test_box_takes_integer_coords_only(coords, exc):
    """int() would make (0.9, 2.7) the box of (0, 2), True that of 1: refused instead."""
    layout = Layout((10, 6), "float32", (2, 3), [Shard(0), Shard(1)])
    with pytest.raises(exc, match="coords"):
        layout.box(coords)
    with pytest.raises(exc, match="coords"):
        layout.local_shape(coords)


def test_box_takes_numpy_integer_coords():
    layout = Layout((10, 6), "float32", (2, 3), [Shard(0), Shard(1)])
    want = layout.box((1, 2))
    assert layout.box((np.int64(1), np.int32(2))) == want == layout.box([1, np.uint8(2)])
    assert layout.box(np.array([1, 2])) == want
    assert layout.local_shape((np.int16(1), 2)) == (5, 2)


def test_placements_only_the_three_kinds():
    """The bare base class and a caller's subclass would act as Replicate: refused."""
    from pyshard.layout import Placement

    class Mine(Placement):
        pass

    class MyShard(Shard):
        pass

    for bad in (Placement(), Mine(), MyShard(0)):
        with pytest.raises(TypeError, match=r"placements\[0\] must be Shard"):
            Layout((4,), "float32", (2,), [bad])


_PICKLED_LAYOUT = """
import pickle, sys
import numpy as np
from pyshard.layout import Layout, Partial, Replicate, Shard
lay = Layout((10, 6), np.float32, (2, 3), [Shard(0), Partial("max")], sizes={0: [7, 3]})
sys.stdout.buffer.write(pickle.dumps([lay, hash(lay)]))
"""


def test_unpickled_layout_hash_is_this_process(tmp_path):
    """The hash of a layout hashes strings (seeded per process): a layout pickled in another
    process (mpi4py's bcast pickles) must hash as an equal one built here, or dicts, sets and
    the plan cache miss it."""
    import os
    import pickle
    import subprocess
    import sys

    here = Layout((10, 6), np.float32, (2, 3), [Shard(0), Partial("max")], sizes={0: [7, 3]})
    seen = set()
    for seed in ("1", "2", "3"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        blob = subprocess.run([sys.executable, "-c", _PICKLED_LAYOUT], env=env, check=True,
                              capture_output=True).stdout
        got, their_hash = pickle.loads(blob)
        seen.add(their_hash)
        assert got == here and hash(got) == hash(here)
        assert got in {here} and {here: 1}[got] == 1
        assert got.box((1, 2)) == here.box((1, 2))
    assert len(seen) > 1  # (the seeds did change the hash: the test tests something)


@pytest.mark.parametrize("dtype", [">f8", ">i4", ">c16", "<f8" if np.little_endian else ">f8"])
def test_partial_needs_native_byte_order(dtype):
    """A Partial of a byte-swapped dtype is refused (MPI's and the node path's reductions
    read native values: a >i4 sum gave -33554454 for -24); moving such data is fine."""
    dt = np.dtype(dtype)
    shape = (6, 4)
    if dt.isnative:
        Layout(shape, dt, (2,), [Partial("sum")])
        return
    with pytest.raises(ValueError, match="byte order"):
        Layout(shape, dt, (2,), [Partial("sum")])
    Layout(shape, dt, (2,), [Shard(0)])  # no reduction: accepted


def test_layout_is_immutable():
    """A reassigned attribute would leave the key and hash (and every plan cached under them)
    describing the old layout; it raises instead. Pickling and copies still work."""
    import copy
    import pickle

    lay = Layout((6, 4), "float32", (2,), [Shard(0)])
    for name, value in (("shape", (3, 4)), ("table", ()), ("_hash", 0), ("new", 1)):
        with pytest.raises(AttributeError, match="immutable"):
            setattr(lay, name, value)
    with pytest.raises(AttributeError, match="immutable"):
        del lay.shape
    assert lay.shape == (6, 4) and lay == Layout((6, 4), "float32", (2,), [Shard(0)])
    for other in (pickle.loads(pickle.dumps(lay)), copy.copy(lay), copy.deepcopy(lay)):
        assert other == lay and hash(other) == hash(lay) and other.table == lay.table
