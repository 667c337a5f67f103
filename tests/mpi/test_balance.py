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
    mesh.free()
