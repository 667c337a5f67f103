"""pyshard.torch.gather and pyshard.torch.scatter (rows by global index through a
pyshard.GatherPlan, differentiable), at any rank count, on layouts with uneven and empty
shards and indices with duplicates (none at all on some ranks):

- forward: gather is ``X[indices]`` exactly; scatter (sum of exact quarter values, so any
  order gives the same bits) is the oracle's ``np.add.at`` over every rank's rows, on top of
  ``into`` where given, which is left as it was; ``op="max"`` outside the graph;
- adjoint: ``<gather(x), y> == <x, scatter(y)>`` summed over the ranks (float64 random
  values, 1e-12 relative), and autograd's gradients are those very operators: the gradient of
  ``sum(gather(x) * y)`` in x is ``scatter(y)``, of ``sum(scatter(v) * w)`` in v is
  ``gather(w)`` and in ``into`` is ``w``, bit for bit, in float64, float32 and bfloat16;
- torch.autograd.gradcheck of distribute -> gather -> sin -> scatter(into=) -> full;
- a 2-D mesh (both dims sharding the rows), and the errors (raised on the rank at fault
  before any message: every rank passes the same wrong argument here).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from mpi4py import MPI
from oracle import make_global

import pyshard as ps
from pyshard import Shard
from pyshard.collectives import allgather

torch = pytest.importorskip("torch")
pst = pytest.importorskip("pyshard.torch")

pytestmark = [pytest.mark.mpi(min_size=1), pytest.mark.numerics]

N = 13  # rows of the index space


@pytest.fixture(scope="module")
def mesh():
    m = ps.Mesh(MPI.COMM_WORLD, (MPI.COMM_WORLD.size,))
    yield m
    m.free()


def sizes_of(kind, n, P):
    """Rows per rank: ``balanced`` (None), ``uneven`` (random cuts, every rank ``r % 3 == 1``
    empty), ``last`` (every row on the last rank)."""
    if kind == "balanced":
        return None
    if kind == "last":
        return [0] * (P - 1) + [n]
    rng = np.random.default_rng([n, P, 11])
    sizes = np.diff(np.concatenate(([0], np.sort(rng.integers(0, n + 1, P - 1)), [n])))
    for r in range(1, P, 3):
        sizes[r - 1] += sizes[r]
        sizes[r] = 0
    return [int(s) for s in sizes]


def indices_of(seed, rank, n=N):
    """Duplicates, any order; none on ranks ``r % 3 == 2``."""
    rng = np.random.default_rng([seed, rank])
    if rank % 3 == 2:
        return np.zeros(0, np.int64)
    return rng.integers(0, n, size=int(rng.integers(1, 2 * n)))


def sharded(g, mesh, sizes, dtype=torch.float64, grad=False):
    """The global numpy ``g`` as a ShardedTensor of ``dtype`` (this rank's rows, a leaf)."""
    pl = [Shard(0)] * mesh.ndim
    sz = None if sizes is None else {0: sizes}
    box = ps.Layout(g.shape, np.float64, mesh.shape, pl, sz).box(mesh.coords)
    local = torch.from_numpy(np.ascontiguousarray(g[box])).to(dtype).requires_grad_(grad)
    return pst.from_local(local, mesh, pl, global_shape=g.shape, sizes=sz)


def bits(t):
    """A tensor's bits as numpy (bfloat16: int16 words)."""
    t = t.detach()
    return (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy()


def global_sum(mesh, value):
    """The sum over the ranks, in rank order (math.fsum: the same on every rank)."""
    return math.fsum(allgather(mesh.comm, float(value)))


def plan_for(idx, x):
    return ps.gather_plan(idx, like=x.to_pyshard())


CASES = [("uneven", (3,)), ("last", ()), ("balanced", (2, 2))]


@pytest.mark.parametrize("layout,trail", CASES)
def test_forward_equals_oracle(mesh, layout, trail):
    P, me = mesh.size, mesh.rank
    sizes = sizes_of(layout, N, P)
    G = make_global((N,) + trail, "float64", seed=2)
    x = sharded(G, mesh, sizes)
    idx = indices_of(4, me)
    plan = plan_for(idx, x)
    got = pst.gather(x, plan)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.float64
    np.testing.assert_array_equal(got.numpy(), G[idx])
    # scatter: exact quarter values, so every order of the sums gives the same bits
    vals = [make_global((len(indices_of(4, r)),) + trail, "float64", seed=10 + r)
            for r in range(P)]
    want = np.zeros((N,) + trail)
    for r in range(P):
        np.add.at(want, indices_of(4, r), vals[r])
    s = pst.scatter(torch.from_numpy(vals[me]), plan)
    assert isinstance(s, pst.ShardedTensor) and s.global_shape == (N,) + trail
    assert s.layout.table[0] == x.layout.table[0] and s.dtype == torch.float64
    np.testing.assert_array_equal(s.local.numpy(), want[s.box])
    # into=: a new tensor, into + scatter; into itself unchanged
    before = x.local.clone()
    s2 = pst.scatter(torch.from_numpy(vals[me]), plan, into=x)
    np.testing.assert_array_equal(s2.local.numpy(), (G + want)[s2.box])
    assert torch.equal(x.local, before) and s2.layout == x.layout
    # max outside the graph: each row the largest of 0 and what every rank sends it
    wmax = np.zeros((N,) + trail)
    for r in range(P):
        np.maximum.at(wmax, indices_of(4, r), vals[r])
    m = pst.scatter(torch.from_numpy(vals[me]), plan, op="max")
    np.testing.assert_array_equal(m.local.numpy(), wmax[m.box])


@pytest.mark.parametrize("layout,trail", CASES)
def test_adjoint(mesh, layout, trail):
    """<gather(x), y> == <x, scatter(y)>, and autograd's gradients are those operators."""
    me = mesh.rank
    sizes = sizes_of(layout, N, mesh.size)
    rng = np.random.default_rng(5)
    x = sharded(rng.standard_normal((N,) + trail), mesh, sizes, grad=True)
    idx = indices_of(6, me)
    plan = plan_for(idx, x)
    y = torch.from_numpy(np.random.default_rng([7, me]).standard_normal((len(idx),) + trail))
    gx = pst.gather(x, plan)
    sy = pst.scatter(y, plan)
    lhs = global_sum(mesh, (gx.detach() * y).sum())
    rhs = global_sum(mesh, (x.local.detach() * sy.local).sum())
    assert abs(lhs - rhs) <= 1e-12 * max(1.0, abs(lhs)), (lhs, rhs)
    assert lhs != 0.0 or all(not len(indices_of(6, r)) for r in range(mesh.size))
    # the gradient of <gather(x), y> in x is scatter(y), bit for bit
    (gx * y).sum().backward()
    assert torch.equal(x.local.grad, sy.local)
    # the gradient of <scatter(v), w> in v is gather(w), in into= it is w itself
    v = y.clone().requires_grad_(True)
    base = x.local.detach().clone().requires_grad_(True)
    into = pst.ShardedTensor(base, x.layout, mesh)
    w = sharded(np.random.default_rng(8).standard_normal((N,) + trail), mesh, sizes)
    (pst.scatter(v, plan, into=into).local * w.local).sum().backward()
    assert torch.equal(v.grad, pst.gather(w, plan))
    assert torch.equal(base.grad, w.local)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gradients_in_other_dtypes(mesh, dtype):
    """The gradient keeps the tensor's dtype and is the plan's own scatter of the incoming
    gradient (bfloat16 accumulates in float32, rounded once); float32 sums quarter values
    exactly: the oracle's."""
    P, me = mesh.size, mesh.rank
    sizes = sizes_of("uneven", N, P)
    G = make_global((N, 2), "float64", seed=3)
    x = sharded(G, mesh, sizes, dtype=dtype, grad=True)
    plan = plan_for(indices_of(9, me), x)
    ys = [make_global((len(indices_of(9, r)), 2), "float64", seed=20 + r) for r in range(P)]
    y = torch.from_numpy(ys[me]).to(dtype)
    g = pst.gather(x, plan)
    assert g.dtype == dtype
    assert torch.equal(g, torch.from_numpy(G[indices_of(9, me)]).to(dtype))
    (g * y).sum().backward()
    grad = x.local.grad
    assert grad.dtype == dtype
    want = ps.ShardedArray.wrap(np.zeros(tuple(grad.shape), x.layout.dtype), x.layout, mesh)
    yv = y.view(torch.int16).numpy().view(x.layout.dtype) if dtype == torch.bfloat16 \
        else y.numpy()
    plan.scatter(yv, into=want, op="sum")
    np.testing.assert_array_equal(bits(grad), want.local.view(bits(grad).dtype))
    oracle = np.zeros((N, 2))
    for r in range(P):
        np.add.at(oracle, indices_of(9, r), ys[r])
    rtol = 0 if dtype == torch.float32 else 1e-2
    np.testing.assert_allclose(grad.double().numpy(), oracle[x.box], rtol=rtol, atol=0)


def test_gradcheck(mesh):
    """distribute -> gather -> sin * c -> scatter(into=x) -> full: every rank perturbs the
    same replicated input and reads the same replicated output, so the ranks' calls stay in
    step."""
    sizes = sizes_of("uneven", 5, mesh.size)
    idx = indices_of(11, mesh.rank, n=5)
    like = sharded(np.zeros((5, 2)), mesh, sizes)
    plan = plan_for(idx, like)
    c = torch.from_numpy(np.random.default_rng([12, mesh.rank]).standard_normal((len(idx), 2)))

    def f(xg):
        x = pst.distribute(xg, mesh, [Shard(0)], {0: sizes} if sizes else None)
        h = torch.sin(pst.gather(x, plan)) * c
        return pst.scatter(h, plan, into=x).full()

    xg = torch.from_numpy(np.random.default_rng(13).standard_normal((5, 2)))
    assert torch.autograd.gradcheck(f, (xg.requires_grad_(True),), eps=1e-6, atol=1e-8)


def test_two_dim_mesh(comm):
    """A (1, P) mesh, both dims sharding the rows ([Shard(0), Shard(0)]): scatter without
    into= lays the result out as the plan's rows; the adjoint pair's gradients as on 1-D."""
    m = ps.Mesh(comm, (1, comm.size))
    try:
        G = make_global((N, 2), "float64", seed=1)
        x = sharded(G, m, sizes_of("uneven", N, comm.size), grad=True)
        assert x.layout.placements == (Shard(0), Shard(0))
        idx = indices_of(14, m.rank)
        plan = plan_for(idx, x)
        y = torch.from_numpy(make_global((len(idx), 2), "float64", seed=30 + m.rank))
        s = pst.scatter(y, plan)
        assert s.layout.placements == x.layout.placements
        assert s.layout.table[0] == x.layout.table[0]
        (pst.gather(x, plan) * y).sum().backward()
        assert torch.equal(x.local.grad, s.local)
    finally:
        m.free()


def test_errors(mesh):
    sizes = sizes_of("uneven", N, mesh.size)
    x = sharded(np.zeros((N, 2)), mesh, sizes, grad=True)
    idx = indices_of(15, mesh.rank)
    plan = plan_for(idx, x)
    v = torch.zeros((len(idx), 2), dtype=torch.float64, requires_grad=True)
    with pytest.raises(TypeError, match="ShardedTensor"):
        pst.gather(x.local, plan)
    with pytest.raises(TypeError, match="GatherPlan"):
        pst.gather(x, idx)
    with pytest.raises(TypeError, match="GatherPlan"):
        pst.scatter(v, None)
    with pytest.raises(TypeError, match="torch.Tensor"):
        pst.scatter(v.detach().numpy(), plan)
    with pytest.raises(ValueError, match="op must be one of"):
        pst.scatter(v, plan, op="prod")
    with pytest.raises(NotImplementedError, match="op='max'"):
        pst.scatter(v, plan, op="max")
    with pytest.raises(NotImplementedError, match="op='min'"):
        pst.scatter(v.detach(), plan, into=x, op="min")  # into requires grad
    with pytest.raises(ValueError, match="values must have shape"):
        pst.scatter(torch.zeros((len(idx) + 1, 2), dtype=torch.float64), plan)
    with pytest.raises(ValueError, match="first dim"):
        pst.scatter(torch.tensor(1.0, dtype=torch.float64), plan)
    other = sharded(np.zeros((N + 1, 2)), mesh, None)  # another index space
    with pytest.raises(ValueError, match="laid out differently"):
        pst.gather(other, plan)
    # the plan is intact: a gather and a scatter after the errors
    assert pst.gather(x, plan).shape == (len(idx), 2)


def test_values_bad_on_one_rank_raise_without_a_hang(mesh):
    """values that only the last rank cannot scatter (a numpy array there, a meta tensor)
    made the ranks it sends to wait for ever (its error came before the exchange): it now
    takes part without values, so each owner of one of its indices raises "rank q's values
    or into were bad", it raises its own error, the others complete, and the plan runs on."""
    P, me = mesh.size, mesh.rank
    if P < 2:
        pytest.skip("needs a peer")
    sizes = sizes_of("uneven", N, P)
    x = sharded(np.zeros((N, 2)), mesh, sizes)
    last = P - 1
    idx = np.arange(N) if me == last else indices_of(16, me)  # the last rank reads every row
    plan = plan_for(idx, x)
    owners = {r for r in range(P) if r != last and (sizes is None or sizes[r] > 0)}
    for bad in ("numpy", "meta"):
        v = torch.ones((len(idx), 2), dtype=torch.float64)
        if me == last:
            v = v.numpy() if bad == "numpy" else torch.ones((len(idx), 2), device="meta")
        try:
            pst.scatter(v, plan)
            got = "ok"
        except (TypeError, ValueError, NotImplementedError) as e:
            got = f"{type(e).__name__}: {e}"
        if me == last:
            assert got.startswith("TypeError: scatter: values must be a torch.Tensor"
                                  if bad == "numpy" else "NotImplementedError: pyshard.torch: "
                                  "a meta tensor has no data"), got
        elif me in owners:
            assert got.startswith(f"ValueError: pyshard: scatter: rank {last}'s values or "
                                  f"into were bad"), got
        else:
            assert got == "ok", got
    y = pst.scatter(torch.ones((len(idx), 2), dtype=torch.float64), plan)  # runs on
    assert y.local.shape == x.local.shape


def test_x_bad_on_one_rank_raises_without_a_hang(mesh):
    """An x that only the last rank owning rows cannot gather from (a numpy array, a local of
    another dtype) made every rank reading its rows wait for ever (its error came before the
    exchange): it now takes part without rows, so each reader of one of its rows raises
    "rank q's x could not be used", it raises its own error, and the plan runs on."""
    P, me = mesh.size, mesh.rank
    if P < 2:
        pytest.skip("needs a peer")
    sizes = sizes_of("uneven", N, P)
    g = make_global((N, 2), "float64")
    x = sharded(g, mesh, sizes)
    last = max(q for q in range(P) if sizes is None or sizes[q])  # (it owns rows)
    idx = np.arange(N) if me != last else indices_of(17, me)  # the others read every row
    plan = plan_for(idx, x)
    for bad in ("numpy", "dtype"):
        mine = x
        if me == last:
            mine = x.local.numpy() if bad == "numpy" else pst.ShardedTensor(x.local, x.layout,
                                                                             mesh)
            if bad == "dtype":  # (.local replaced since)
                mine.local = x.local.to(torch.float32)
        try:
            pst.gather(mine, plan)
            got = "ok"
        except (TypeError, ValueError) as e:
            got = f"{type(e).__name__}: {e}"
        if me == last:
            assert got.startswith("TypeError: gather: expected a pyshard.torch.ShardedTensor"
                                  if bad == "numpy" else "ValueError"), got
        else:
            assert got.startswith(f"ValueError: pyshard: gather: rank {last}'s x could not "
                                  f"be used"), got
    y = pst.gather(x, plan)  # runs on
    np.testing.assert_array_equal(y.numpy(), g[np.asarray(idx, np.int64)])
