"""pyshard.balance over MPI, at any rank count: the extents equal balance_array's (the same
algorithm in one process) on the same global integer cost, the data redistributed to them
equals the numpy reference's slices, particle_cost counts the particles of each cell, and a
bad cost raises on every rank. Tiny arrays: the whole file runs in a few seconds."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import pyshard as ps

pytestmark = pytest.mark.mpi(min_size=1)


def _cost(shape, seed):
    rng = np.random.default_rng(seed)
    c = rng.integers(0, 4, shape).astype(np.float64)
    c[: shape[0] // 3] *= 20  # a heavy band
    return c


@pytest.mark.parametrize("ndim", [1, 2])
def test_equals_serial_and_moves_the_data(comm, ndim):
    dims = MPI.Compute_dims(comm.size, ndim)
    shape = (12, 10)[:ndim] if ndim == 2 else (3 * comm.size + 5,)
    mesh = ps.Mesh(comm, dims)
    placements = [ps.Shard(d) for d in range(ndim)]
    c = _cost(shape, 4)
    cost = ps.distribute(c, mesh, placements)
    b = ps.balance(cost, tolerance=0.0)
    ref = ps.balance_array(c, cost.layout, tolerance=0.0)
    assert b.found == ref.found and b.found_max == ref.found_max
    if sum(n > 1 for n in dims) <= 1:  # one dim cut at most: the exact 1-D split alone
        assert b.collectives == 2 and b.sweeps == 0
    assert b.before_max == ref.before_max and b.total == ref.total
    data = np.arange(np.prod(shape), dtype=np.float64).reshape(shape)
    x = ps.distribute(data, mesh, placements).redistribute(b.placements, sizes=b.sizes)
    assert np.array_equal(x.local, data[x.box])
    moved = cost.redistribute(b.placements, sizes=b.sizes)
    top = comm.allreduce(float(moved.local.sum()), op=MPI.MAX)
    assert top == b.after_max
    mesh.free()


def test_particle_cost_counts_and_rebalances(comm):
    mesh = ps.Mesh(comm, (comm.size,))
    grid = ps.distribute(np.zeros((8, 3)), mesh, [ps.Shard(0)])
    box = grid.box
    rng = np.random.default_rng(comm.rank)
    # past 8 ranks some boxes are empty: no particle can lie in them
    n = 5 * comm.rank + 2 if box[0].stop > box[0].start else 0
    x = np.stack([rng.uniform(box[0].start, box[0].stop, n), rng.uniform(0, 3, n)], axis=1)
    cost = ps.particle_cost(x, grid, base=0.5)
    want = np.full(grid.local.shape, 0.5)
    np.add.at(want, (np.floor(x[:, 0]).astype(int) - box[0].start,
                     np.floor(x[:, 1]).astype(int)), 1.0)
    assert np.array_equal(cost.local, want)
    b = ps.balance(cost)
    assert b.after_max <= b.before_max
    bad = x + (8.0 if comm.rank == 0 else 0.0)
    with pytest.raises(ValueError, match="particle_cost"):
        ps.particle_cost(bad, grid)
    # a NaN has no cell: its rank says so (not "migrate them to their owner"), the others
    # name another rank
    nan = np.array([[np.nan, 1.0]]) if comm.rank == 0 else np.zeros((0, 2))
    with pytest.raises(ValueError, match="particle_cost") as e:
        ps.particle_cost(nan, grid)
    if comm.rank == 0:
        assert "not finite (NaN or inf)" in str(e.value) and "migrate" not in str(e.value)
    else:
        assert "another rank" in str(e.value)
    mesh.free()


@pytest.mark.parametrize("shape", [(0,), (0, 3)])
def test_a_dim_of_length_zero_balances_to_empty_shards(comm, shape):
    """A cost whose sharded dim has length 0 (every shard empty, a legal layout): empty
    extents on every rank (numpy's reshape error escaped before)."""
    mesh = ps.Mesh(comm, (comm.size,))
    cost = ps.distribute(np.ones(shape), mesh, [ps.Shard(0)])
    b = ps.balance(cost)
    assert b.sizes == {0: (0,) * comm.size}
    a = ps.balance_array(np.ones(shape), cost.layout)
    assert a.sizes == b.sizes
    mesh.free()


def test_bad_cost_raises_on_every_rank(comm):
    mesh = ps.Mesh(comm, (comm.size,))
    c = np.ones(2 * comm.size)
    c[-1] = -1.0  # on the last rank only
    cost = ps.distribute(c, mesh, [ps.Shard(0)])
    with pytest.raises(ValueError, match="1 negative"):
        ps.balance(cost)
    # every cell finite, the total not: the same error on every rank
    with pytest.raises(ValueError, match="total overflows float64"):
        ps.balance(ps.distribute(np.full(2 * comm.size, 1e308), mesh, [ps.Shard(0)]))
    with pytest.raises(ValueError, match="min_size"):
        ps.balance(ps.distribute(np.ones(2 * comm.size), mesh, [ps.Shard(0)]), min_size=3)
    # the last rank's .local replaced by one of another length: every rank raises (numpy's
    # broadcast error on that rank alone, the others waited in the allreduce); then the
    # same cost, put right, balances as before
    cost = ps.distribute(np.ones(2 * comm.size), mesh, [ps.Shard(0)])
    good = cost.local
    if comm.rank == comm.size - 1:
        cost.local = np.ones(3)
    with pytest.raises(ValueError, match=r"does not fit its layout on 1 rank\(s\)") as e:
        ps.balance(cost)
    assert ("was .local replaced" in str(e.value)) == (comm.rank == comm.size - 1)
    cost.local = good
    assert ps.balance(cost).sizes == ps.balance_array(np.ones(2 * comm.size), cost.layout).sizes
    mesh.free()


def _uneven(comm, n, sizes):
    """A cost of ones on the (P,) mesh with the current extents ``sizes``."""
    mesh = ps.Mesh(comm, (comm.size,))
    lay = ps.Layout((n,), np.float64, (comm.size,), [ps.Shard(0)], {0: sizes})
    c = np.ones(n)
    return mesh, c, ps.ShardedArray(c[lay.box(mesh.coords)].copy(), lay, mesh)


@pytest.mark.parametrize("option", ["multiple_of", "min_size"])
def test_current_extents_that_break_the_options_are_never_kept(comm, option):
    P = comm.size
    n = 4 * P
    # a first shard of 1 cell: offset 1 breaks multiple_of=2, the extent breaks min_size=2
    sizes = (4,) if P == 1 else (1, 7) + (4,) * (P - 2)
    mesh, c, cost = _uneven(comm, n, sizes)
    kw = {option: 2}
    # a tolerance no split reaches: only a current split that breaks the option moves
    b = ps.balance(cost, tolerance=0.9, **kw)
    ref = ps.balance_array(c, cost.layout, tolerance=0.9, **kw)
    assert (b.kept, b.sizes, b.breaks) == (ref.kept, ref.sizes, ref.breaks)
    everyone = comm.allgather((b.kept, b.sizes, b.breaks))
    assert all(e == everyone[0] for e in everyone)  # the same decision on every rank
    if P == 1:
        assert b.kept and b.sizes == {0: (4,)} and not b.breaks
    else:
        assert not b.kept and b.sizes == b.found
        assert b.breaks == f"{option} 2 on dim 0" and b.breaks in b.explain()
        offs = np.cumsum(b.sizes[0])[:-1]
        assert all(o % 2 == 0 for o in offs) and min(b.sizes[0]) >= 2
        moved = cost.redistribute(b.placements, sizes=b.sizes)
        assert comm.allreduce(float(moved.local.sum()), op=MPI.MAX) == b.after_max
    # extents that obey the options are kept below the tolerance
    again = ps.balance(cost.redistribute(b.placements, sizes=b.sizes), tolerance=0.9, **kw)
    assert again.kept and again.sizes == b.sizes and not again.breaks
    mesh.free()


def test_breaking_extents_move_even_to_a_costlier_split():
    """docs/balance.md: 384 unit columns on 4 ranks with multiple_of=64 give (128, 128, 64,
    64); the even split (96 each) breaks the option, so it moves though 128 > 96."""
    lay = ps.Layout((384,), np.float64, (4,), [ps.Shard(0)])
    b = ps.balance_array(np.ones(384), lay, multiple_of=64)
    assert not b.kept and b.sizes == {0: (128, 128, 64, 64)}
    assert b.after_max == 128.0 and b.before_max == 96.0 and b.predicted_gain < 0
    assert "multiple_of 64 on dim 0" in b.explain()


def test_particle_cost_sums_the_replicas(comm):
    """[Shard(0), Replicate()]: each replica group holds its own particles (owner keeps a
    group's migration within it); the cost is their sum, the same on every replica, and
    balance's total, before_max and after_max all come from it."""
    P = comm.size
    mshape = (2, P // 2) if P % 2 == 0 else (1, P)
    mesh = ps.Mesh(comm, mshape)
    n = 8
    grid = ps.distribute(np.zeros(n), mesh, [ps.Shard(0), ps.Replicate()])
    col = mesh.coords[1]
    # replica column c: 3 + 10 c particles a rank, in cell 1 (column 0) or 6 (the others)
    x = np.full((3 + 10 * col, 1), 1.5 if col == 0 else 6.5)
    r = ps.migrate(x, ps.owner(x, grid), mesh)
    cost = ps.particle_cost(r.rows, grid, base=0.5)
    want = np.full(n, 0.5 * mshape[1])  # base once per replica
    for cs in comm.allgather(col):
        want[1 if cs == 0 else 6] += 3 + 10 * cs
    assert np.array_equal(cost.local, want[grid.box])
    b = ps.balance(cost, tolerance=0.0)
    ref = ps.balance_array(want, cost.layout, tolerance=0.0)
    assert b.total == want.sum() == ref.total
    assert (b.found, b.found_max, b.before_max) == (ref.found, ref.found_max, ref.before_max)
    moved = cost.redistribute(b.placements, sizes=b.sizes)
    assert comm.allreduce(float(moved.local.sum()), op=MPI.MAX) == b.after_max
    mesh.free()


def test_not_a_sharded_array_raises(comm):
    # every rank passing one: every rank raises (one rank alone cannot tell the others)
    with pytest.raises(ValueError, match="ShardedArray"):
        ps.balance(np.ones(4))


def test_bad_grid_arguments_name_the_argument(comm):
    """particle_cost and owner with a spacing <= 0 or not finite, an origin of the wrong
    length: a ValueError naming the argument on every rank (it was "particles lie outside
    rank k's box", or numpy's broadcast error, or with periodic axes a mirrored grid)."""
    mesh = ps.Mesh(comm, (comm.size,))
    grid = ps.distribute(np.zeros((8, 3)), mesh, [ps.Shard(0)])
    box = grid.box
    x = np.array([[box[0].start + 0.5, 1.5]]) if box[0].stop > box[0].start else np.zeros((0, 2))
    for kw, match in (({"spacing": 0.0}, "spacing must be finite and > 0"),
                      ({"spacing": -1.0, "periodic": True}, "spacing must be finite and > 0"),
                      ({"spacing": [1.0, np.inf]}, "spacing must be finite and > 0"),
                      ({"origin": [0.0, 1.0, 2.0]}, "origin must be a scalar or one value"),
                      ({"origin": np.nan}, "origin must be finite")):
        for f in (ps.particle_cost, ps.owner):
            with pytest.raises(ValueError, match=match):
                f(x, grid, **kw)
    mesh.free()


def test_validation_reads_equal_options_as_equal(comm):
    """PYSHARD_VALIDATE=1 compares the options as read: multiple_of=2 on one rank and
    np.int64(2) or {0: 2} on another are the same call (they raised "different arguments");
    options that differ still raise on every rank."""
    mesh = ps.Mesh(comm, (comm.size,))
    cost = ps.distribute(np.ones(4 * comm.size), mesh, [ps.Shard(0)])
    spell = [2, np.int64(2), {0: 2}, {-1: 2}][comm.rank % 4]
    tol = [0.02, np.float64(0.02)][comm.rank % 2]
    with ps.config.override(PYSHARD_VALIDATE=1):
        b = ps.balance(cost, multiple_of=spell, tolerance=tol)
        assert b.sizes == {0: ps.split_sizes(4 * comm.size, comm.size, grain=2)}
        if comm.size > 1:
            with pytest.raises(ValueError, match="different"):
                ps.balance(cost, multiple_of=1 + (comm.rank == 0))
    mesh.free()
