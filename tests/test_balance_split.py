"""pyshard.balance in one process: the exact 1-D split against brute force over every split
(with multiple_of and min_size), the 2-D rectilinear refinement against brute force within
5%, the tie-break (uniform costs give numpy.array_split's extents, DeepSpeed's uneven head
split), the tolerance, and the errors."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import pyshard as ps
from pyshard.balancing import split


def brute_1d(c, p, g=1, m=0):
    n = len(c)
    s = np.concatenate(([0.0], np.cumsum(c)))
    best = np.inf
    for cuts in itertools.combinations_with_replacement(range(0, n + 1, g), p - 1):
        o = [0, *cuts, n]
        if all(b - a >= m for a, b in zip(o[:-1], o[1:])):
            best = min(best, max(s[b] - s[a] for a, b in zip(o[:-1], o[1:])))
    return best


def brute_2d(c, p0, p1):
    n0, n1 = c.shape
    s = np.zeros((n0 + 1, n1 + 1))
    s[1:, 1:] = c.cumsum(0).cumsum(1)
    bs = np.array([[0, *b, n1] for b in itertools.combinations_with_replacement(range(n1 + 1),
                                                                               p1 - 1)])
    best = np.inf
    for a in itertools.combinations_with_replacement(range(n0 + 1), p0 - 1):
        oa = [0, *a, n0]
        m = np.zeros(len(bs))
        for i in range(p0):
            row = s[oa[i + 1]] - s[oa[i]]
            for j in range(p1):
                m = np.maximum(m, row[bs[:, j + 1]] - row[bs[:, j]])
        best = min(best, float(m.min()))
    return best


def test_1d_equals_brute_force():
    rng = np.random.default_rng(1)
    done = 0
    for _ in range(300):
        n, p = int(rng.integers(1, 11)), int(rng.integers(1, 5))
        g, m = int(rng.integers(1, 4)), int(rng.integers(0, 3))
        if (p - 1) * -(-m // g) * g + m > n:
            continue
        c = rng.integers(0, 10, n).astype(float)
        c[rng.random(n) < 0.3] = 0.0
        sizes, b = split(c, p, g, m)
        o = np.concatenate(([0], np.cumsum(sizes)))
        assert len(sizes) == p and sum(sizes) == n
        assert all(s >= m for s in sizes) and all(x % g == 0 for x in o[1:-1])
        assert b == max(c[a:e].sum() for a, e in zip(o[:-1], o[1:]))  # what it reports
        assert b == brute_1d(c, p, g, m), (c, p, g, m, sizes)
        done += 1
    assert done > 150


def test_min_size_needs_more_than_the_greedy_sweep():
    """Greedy parts as long as they fit would take 3 cells first and leave the two heavy
    cells to one part of 2: the exact split is (2, 2, 3)."""
    sizes, b = split([0, 0, 0, 1, 1, 0, 0], 3, min_size=2)
    assert b == 1 and sizes == (2, 2, 3)


@pytest.mark.parametrize("n,p", [(10, 4), (7, 3), (12, 5), (3, 5)])
def test_uniform_costs_give_array_split(n, p):
    assert split(np.ones(n), p)[0] == ps.split_sizes(n, p)


def test_uniform_costs_with_multiple_of_give_split_sizes():
    """Every n <= 40, 1-8 parts, multiples 1-8 that fit: split_sizes' extents (whole
    multiples as array_split deals them, the rest to the last part); the tie-break once
    rounded each even share up to the next allowed cut, so 13 cells in 3 parts by 3 gave
    (6, 6, 1) where split_sizes gives (6, 3, 4)."""
    bad = []
    for n, p, g in itertools.product(range(41), range(1, 9), range(1, 9)):
        try:
            got = split(np.ones(n), p, multiple_of=g)[0]
        except ValueError:
            continue
        if got != ps.split_sizes(n, p, grain=g):
            bad.append((n, p, g, got, ps.split_sizes(n, p, grain=g)))
    assert not bad, bad[:5]
    assert split(np.ones(13), 3, multiple_of=3)[0] == (6, 3, 4)


def test_uneven_head_split_is_deepspeeds():
    """hidden 384, 6 heads of 64 on tp 4: get_shard_size_list gives [128, 128, 64, 64]."""
    assert split(np.ones(384), 4, multiple_of=64) == ((128, 128, 64, 64), 128.0)


def test_2d_within_five_percent_of_brute_force():
    rng = np.random.default_rng(7)
    ratios = []
    for t in range(12):
        n = 8
        p0, p1 = int(rng.integers(2, 4)), int(rng.integers(2, 4))
        if t % 3 == 0:
            c = rng.integers(0, 10, (n, n)).astype(float)
        elif t % 3 == 1:
            c = np.floor(rng.exponential(1, (n, n)) ** 3 * 3)
        else:
            x, y = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
            cx, cy = rng.uniform(0, n, 2)
            c = np.floor(1 + 20 * np.exp(-((x - cx) ** 2 + (y - cy) ** 2) / 3.0))
        lay = ps.Layout((n, n), np.float64, (p0, p1), [ps.Shard(0), ps.Shard(1)])
        r = ps.balance_array(c, lay, tolerance=0.0)
        o0 = np.concatenate(([0], np.cumsum(r.found[0])))
        o1 = np.concatenate(([0], np.cumsum(r.found[1])))
        real = max(c[o0[i]:o0[i + 1], o1[j]:o1[j + 1]].sum() for i in range(p0)
                   for j in range(p1))
        assert real == r.found_max
        best = brute_2d(c, p0, p1)
        assert r.lower_bound <= best <= r.found_max
        ratios.append(r.found_max / best)
    assert max(ratios) <= 1.05, ratios


@pytest.mark.parametrize("mesh_shape", [(3, 1), (1, 3), (1, 1)])
def test_a_dim_of_one_shard_leaves_the_exact_1d_split(mesh_shape):
    """A 2-D layout whose mesh cuts one dim only (a dim of one shard keeps its extent) gets
    the exact 1-D split of the other, with no refinement sweep (balance: no collective past
    the first two)."""
    rng = np.random.default_rng(11)
    for _ in range(20):
        c = rng.integers(0, 10, (7, 6)).astype(float)
        lay = ps.Layout(c.shape, np.float64, mesh_shape, [ps.Shard(0), ps.Shard(1)])
        r = ps.balance_array(c, lay, tolerance=0.0)
        cut = 0 if mesh_shape[0] > 1 else 1
        profile = c.sum(axis=1 - cut)
        assert r.sweeps == 0 and r.passes == []
        assert r.found[1 - cut] == (c.shape[1 - cut],)
        assert r.found_max == brute_1d(profile, mesh_shape[cut])
        assert r.found_max == max(profile[a:b].sum() for a, b in zip(
            np.concatenate(([0], np.cumsum(r.found[cut])))[:-1], np.cumsum(r.found[cut])))


def test_result_and_tolerance():
    c = np.zeros((8, 4))
    c[:2] = 10.0  # all the work in the first quarter of dim 0
    lay = ps.Layout(c.shape, np.float64, (4,), [ps.Shard(0)])
    r = ps.balance_array(c, lay)
    assert r.current == {0: (2, 2, 2, 2)} and not r.kept and r.sizes == r.found
    assert r.before == pytest.approx(4.0) and r.after == pytest.approx(2.0)
    assert r.predicted_gain == pytest.approx(0.5)
    assert "imbalance 4.000 -> 2.000" in r.explain()
    assert r.measure(2.0, 1.5) == pytest.approx(0.25) and "measured gain 25.0%" in r.explain()
    flat = ps.balance_array(np.ones((8, 4)), lay)  # already even: nothing to gain
    assert flat.kept and flat.sizes == flat.current and flat.after == flat.before == 1.0
    nested = ps.Layout((8, 6), np.float64, (2, 2), [ps.Shard(0), ps.Shard(0)])
    r = ps.balance_array(c[:, :1].repeat(6, 1), nested, tolerance=0.0)
    assert len(r.sizes[0]) == 4 and sum(r.sizes[0]) == 8 and r.after == pytest.approx(2.0)


def test_multiple_of_and_min_size_per_dim():
    c = np.random.default_rng(3).integers(0, 9, (24, 20)).astype(float)
    lay = ps.Layout(c.shape, np.float64, (3, 2), [ps.Shard(0), ps.Shard(1)])
    r = ps.balance_array(c, lay, multiple_of={0: 4}, min_size={1: 6}, tolerance=0.0)
    assert all(s % 4 == 0 for s in r.found[0][:-1]) and sum(r.found[0]) == 24
    assert min(r.found[1]) >= 6 and sum(r.found[1]) == 20


def test_errors():
    lay = ps.Layout((8,), np.float64, (4,), [ps.Shard(0)])
    with pytest.raises(ValueError, match="negative"):
        ps.balance_array(np.array([1, -1, 0, 0, 0, 0, 0, 0.0]), lay)
    with pytest.raises(ValueError, match="non-finite"):
        ps.balance_array(np.array([1, np.nan, 0, 0, 0, 0, 0, 0.0]), lay)
    with pytest.raises(ValueError, match="total overflows float64"):  # each finite
        ps.balance_array(np.full(8, 1e308), lay)
    with pytest.raises(ValueError, match="min_size"):
        ps.balance_array(np.ones(8), lay, min_size=3)
    with pytest.raises(ValueError, match="multiple_of"):
        ps.balance_array(np.ones(8), lay, multiple_of=0)
    with pytest.raises(ValueError, match="tolerance"):
        ps.balance_array(np.ones(8), lay, tolerance=-1)
    with pytest.raises(ValueError, match="shape"):
        ps.balance_array(np.ones(9), lay)
    with pytest.raises(ValueError, match="Partial"):
        ps.balance_array(np.ones((8, 2)), ps.Layout((8, 2), np.float64, (2, 2),
                                                    [ps.Shard(0), ps.Partial()]))
    with pytest.raises(ValueError, match="ShardedArray"):
        ps.balance(np.ones(8))
    with pytest.raises(ValueError, match="pyshard.balance takes a ShardedArray"):
        ps.balance_array(ps.ShardedArray.wrap(np.ones(8), ps.Layout((8,), np.float64, (1,),
                                                                   [ps.Shard(0)]), None), lay)
    b = ps.balance_array(np.ones(8), lay)
    for before, after in ((0.0, 1.0), (float("nan"), 1.0), (1.0, float("nan")), (1.0, -1.0)):
        with pytest.raises(ValueError, match="seconds_"):
            b.measure(before, after)
