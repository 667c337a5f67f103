"""Halo plans without MPI: every rank of a simulated mesh runs its plan (the messages
delivered by hand, box by box in message order), and every padded array must equal the
oracle of the halo semantics. Also argument errors and setup at 65,536 simulated ranks."""

from __future__ import annotations

import itertools
import sys
from math import prod
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent / "mpi"))
from oracle import halo_expected, make_global  # noqa: E402

from pyshard import Layout, Partial, Replicate, Shard, halo_plan, halo_spec  # noqa: E402

FILL = -999.0


def _slices(boxspec):
    start, ext = boxspec
    return tuple(slice(s, s + e) for s, e in zip(start, ext))


def simulate(g, layout, spec):
    """Run every rank's halo plan on padded arrays and return them by coords."""
    coords_all = list(itertools.product(*[range(m) for m in layout.mesh_shape]))
    plans = {c: halo_plan(layout, spec, c) for c in coords_all}
    by_rank = {p.rank: p for p in plans.values()}
    padded = {}
    for c, p in plans.items():
        a = np.full(p.padded_shape, FILL, dtype=g.dtype)
        inner = tuple(slice(w, w + b.stop - b.start) for w, b in zip(spec.width, layout.box(c)))
        a[inner] = g[layout.box(c)]
        padded[c] = a
        # sends read the interior only
        mask = np.zeros(p.padded_shape, bool)
        mask[inner] = True
        for _, _, boxes in p.sends:
            for b in boxes:
                assert mask[_slices(b)].all(), "a send box reaches outside the interior"
    before = {c: a.copy() for c, a in padded.items()}
    for c, p in plans.items():
        for r, qc, boxes in p.recvs:
            q = by_rank[r]
            assert q.coords == qc
            sent = [b for rr, _, bs in q.sends if rr == p.rank for b in bs]
            assert [e for _, e in sent] == [e for _, e in boxes], "message boxes disagree"
            for sb, rb in zip(sent, boxes):
                padded[c][_slices(rb)] = before[q.coords][_slices(sb)]
        for src, dst, ext in p.local:
            padded[c][_slices((dst, ext))] = before[c][_slices((src, ext))]
        # every send has a matching receive
        for r, _, _ in p.sends:
            assert any(rr == p.rank for rr, _, _ in by_rank[r].recvs)
    return plans, padded


def check(shape, mesh_shape, placements, width, periodic=False, corners=True, sizes=None):
    g = make_global(shape, "float64", seed=3)
    layout = Layout(shape, g.dtype, mesh_shape, placements, sizes)
    spec = halo_spec(layout, width, periodic, corners)
    plans, padded = simulate(g, layout, spec)
    for c, a in padded.items():
        box = layout.box(c)
        want = halo_expected(
            g, [b.start for b in box], [b.stop for b in box], spec.width, spec.periodic,
            spec.corners, FILL,
        )
        np.testing.assert_array_equal(a, want, err_msg=f"rank at {c}")
    return plans


S0, S1, S2, R = Shard(0), Shard(1), Shard(2), Replicate()

CASES = [
    # shape, mesh, placements, sizes
    ((11,), (1,), [S0], None),
    ((11,), (3,), [S0], None),
    ((10,), (4,), [S0], {0: (3, 0, 6, 1)}),  # an empty shard, and blocks narrower than w
    ((7, 9), (2, 2), [S0, S1], None),
    ((7, 9), (2, 3), [S1, S0], None),
    ((9, 5), (2, 2), [S0, S0], None),  # nested sharding
    ((6, 7), (2, 2), [S0, R], None),  # Replicate: a replica group per coordinate
    ((5, 6), (4, 1), [S0, S1], {0: (2, 0, 0, 3)}),
    ((3, 4), (2, 3), [S1, S0], {1: (0, 4), 0: (1, 0, 2)}),
    ((4, 5, 6), (2, 2, 2), [S0, S1, S2], None),
    ((5, 4, 3), (2, 1, 3), [S2, R, S0], None),
]


@pytest.mark.parametrize("shape,mesh,placements,sizes", CASES)
@pytest.mark.parametrize("corners", [True, False])
def test_simulated_meshes(shape, mesh, placements, sizes, corners):
    nd = len(shape)
    for width in (1, 2, tuple(min(3, n) for n in shape), tuple(d % 2 for d in range(nd))):
        for periodic in (False, True, tuple(d % 2 == 0 for d in range(nd))):
            check(shape, mesh, placements, width, periodic, corners, sizes)


def test_width_equal_to_extent_wraps_twice():
    # width = the global extent on a periodic dim: every ghost cell still has one writer
    check((4, 3), (2, 1), [S0, R], (4, 3), periodic=True)
    check((4, 3), (3, 1), [S0, R], (4, 3), periodic=(True, False), corners=False)


def test_message_per_peer_and_corner_peers():
    layout = Layout((8, 8), "float64", (3, 3), [S0, S1])
    box = halo_plan(layout, halo_spec(layout, 1, True, True), (1, 1))
    star = halo_plan(layout, halo_spec(layout, 1, True, False), (1, 1))
    assert len(box.peers) == 8 and len(star.peers) == 4
    assert all(len(b) == 1 for _, _, b in box.recvs)  # one box per message here
    # widths wider than a neighbour's block reach two ranks away
    wide = halo_plan(layout, halo_spec(layout, (4, 0), False, True), (0, 0))
    assert {c for _, c, _ in wide.recvs} == {(1, 0), (2, 0)}


def test_replicated_dim_wraps_onto_itself():
    layout = Layout((6, 4), "float32", (2,), [R])
    p = halo_plan(layout, halo_spec(layout, 1, (False, True)), (1,))
    assert not p.recvs and not p.sends and len(p.local) == 2


def test_setup_grows_with_neighbours_not_ranks():
    for m in (16, 256):  # 256 x 256 = 65,536 simulated ranks
        layout = Layout((8192, 8192), "float64", (m, m), [S0, S1])
        spec = halo_spec(layout, 1, True, True)
        p = halo_plan(layout, spec, (m // 2, m // 3))
        assert len(p.peers) == 8
        assert p.recv_bytes == p.send_bytes == 8 * (4 * (8192 // m) + 4)


def test_explain_names_peers_and_bytes():
    layout = Layout((8, 6), "float32", (2, 2), [S0, S1])
    text = halo_plan(layout, halo_spec(layout, 1, False, True), (0, 0)).explain()
    assert "3 peer(s)" in text and "peer rank 3 at (1, 1): receives 4 B" in text


@pytest.mark.parametrize(
    "kw,exc,msg",
    [
        (dict(width=-1), ValueError, "widths must be >= 0"),
        (dict(width=(1, 7)), ValueError, "larger than the global extent 6"),
        (dict(width=(1, 1, 1)), ValueError, "has 3 entries"),
        (dict(width=1.5), TypeError, "width must be an int"),
        (dict(width=1, periodic="yes"), TypeError, "periodic must be a bool"),
        (dict(width=1, corners=None), TypeError, "corners must be a bool"),
    ],
)
def test_bad_arguments(kw, exc, msg):
    layout = Layout((5, 6), "float32", (2,), [S0])
    with pytest.raises(exc, match=msg):
        halo_spec(layout, **kw)


def test_numpy_arrays_per_dim():
    """One width / periodic flag per dim given as a 1-D numpy array, as a list would be."""
    layout = Layout((5, 6), "float32", (2,), [S0])
    spec = halo_spec(layout, np.array([1, 2]), periodic=np.array([True, False]))
    assert spec == halo_spec(layout, (1, 2), periodic=(True, False))
    with pytest.raises(ValueError, match="has 3 entries"):
        halo_spec(layout, np.array([1, 1, 1]))


def test_partial_is_refused():
    layout = Layout((5, 6), "float32", (2,), [Partial("sum")])
    with pytest.raises(ValueError, match="Partial on mesh dim"):
        halo_spec(layout, 1)


def test_oracle_can_fail():
    g = make_global((4, 4), "float64")
    a = halo_expected(g, [0, 0], [2, 2], (1, 1), (False, False), True, FILL)
    b = halo_expected(g, [0, 0], [2, 2], (1, 1), (False, False), False, FILL)
    assert a[3, 3] == g[2, 2] and b[3, 3] == FILL and a[0, 1] == FILL
    assert prod(a.shape) == 16
