"""pyshard.torch.migrate: the gradient of the rows is back() of the gradient of the result,
bit for bit against the gradient single-process autograd gives (each row's weight comes from
its global id, so the expected gradient is known on its source rank); back() is
differentiable too (its backward migrates the gradient forward); torch.autograd.gradcheck
on float64; the result is a pyshard.Migrated (one class for numpy and torch rows), and
back(wait=False) gives a complete handle."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import pyshard as ps

torch = pytest.importorskip("torch")
pst = pytest.importorskip("pyshard.torch")

pytestmark = [pytest.mark.mpi, pytest.mark.numerics]


@pytest.fixture(scope="module")
def mesh():
    m = ps.Mesh(MPI.COMM_WORLD, (MPI.COMM_WORLD.size,))
    yield m
    m.free()


def rows(mesh, seed, dtype=torch.float32, n=None):
    rng = np.random.default_rng([seed, mesh.rank])
    n = int(rng.integers(0, 25)) if n is None else n
    ids = np.arange(n) + 1000 * mesh.rank
    x = torch.tensor(rng.standard_normal((n, 3)), dtype=dtype, requires_grad=True)
    q = torch.tensor(rng.standard_normal(n), dtype=dtype, requires_grad=True)
    dest = rng.integers(0, mesh.size, size=n)
    return x, q, torch.from_numpy(ids), dest


def weight(ids, dtype):
    """A weight per global id: exact in float32 (small integers over 4)."""
    return torch.from_numpy(((ids.numpy() % 13) - 6) / 4.0).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_gradient_is_back_of_the_gradient(mesh, dtype):
    x, q, ids, dest = rows(mesh, 1, dtype)
    r = pst.migrate({"x": x, "q": q, "id": ids}, dest, mesh)
    y = r.rows
    w = weight(y["id"], dtype)
    loss = (y["x"] * w[:, None]).sum() + (y["q"] * w * 3).sum()
    loss.backward()
    # single-process autograd of the same loss: each row's weight from its own id
    w0 = weight(ids, dtype)
    assert x.grad.dtype == dtype
    assert torch.equal(x.grad, w0[:, None].expand_as(x).contiguous())
    assert torch.equal(q.grad, w0 * 3)


def test_back_is_differentiable(mesh):
    x, q, ids, dest = rows(mesh, 2)
    r = pst.migrate((x, ids), dest, mesh)
    y, rid = r.rows
    out = r.back(y * weight(rid, y.dtype)[:, None])  # back where each row came from
    torch.testing.assert_close(out, (x * weight(ids, x.dtype)[:, None]).detach(), rtol=0, atol=0)
    (out * 2).sum().backward()
    assert torch.equal(x.grad, 2 * weight(ids, x.dtype)[:, None].expand_as(x).contiguous())


def test_gradcheck(mesh):
    # gradcheck perturbs every element and differentiates every output element, each a
    # collective call: the same row count on every rank keeps the ranks' calls in step
    x, q, ids, dest = rows(mesh, 3, torch.float64, n=3)

    def f(a, b):
        r = pst.migrate((a, b), dest, mesh)
        ya, yb = r.rows
        z = torch.sin(ya) * yb[:, None]
        return r.back(z)

    assert torch.autograd.gradcheck(f, (x, q), eps=1e-6, atol=1e-8)


def test_one_migrated(mesh):
    """pyshard.torch.migrate returns a pyshard.Migrated (tensor rows, a differentiable back):
    the migration's counts, offsets, n, m and explain, as the numpy call gives them."""
    x, q, ids, dest = rows(mesh, 4)
    r = pst.migrate({"x": x, "id": ids}, dest, mesh)
    assert isinstance(r, ps.Migrated)
    assert pst.Migrated is ps.Migrated
    ref = ps.migrate({"x": x.detach().numpy(), "id": ids.numpy()}, dest, mesh)
    np.testing.assert_array_equal(r.counts, ref.counts)
    np.testing.assert_array_equal(r.sent, ref.sent)
    np.testing.assert_array_equal(r.offsets, ref.offsets)
    assert (r.n, r.m) == (ref.n, ref.m) == (len(ids), int(ref.counts.sum()))
    assert r.explain() == ref.explain()
    assert isinstance(r.rows["x"], torch.Tensor)
    assert np.array_equal(r.rows["x"].detach().numpy(), ref.rows["x"])
    assert np.array_equal(r.rows["id"].numpy(), ref.rows["id"])


def test_back_wait_false(mesh):
    """back(wait=False) of tensors: a handle whose test() is True and whose wait() gives what
    back() gives, still differentiable."""
    x, q, ids, dest = rows(mesh, 5)
    r = pst.migrate(x, dest, mesh)
    pb = r.back(r.rows * 3, wait=False)
    assert pb.test() is True
    out = pb.wait()
    assert pb.wait() is out and pb.test() is True
    assert torch.equal(out, (x * 3).detach())
    out.sum().backward()
    assert torch.equal(x.grad, torch.full_like(x, 3))


def test_dest_changed_after_the_forward(mesh):
    """A dest changed in place between the forward and backward() (numpy, or a CPU tensor
    whose numpy view shares its memory) sent the gradients elsewhere without a word: the
    forward keeps a copy."""
    for kind in ("numpy", "tensor"):
        x, q, ids, dest = rows(mesh, 5, n=9)
        d = torch.from_numpy(dest.copy()) if kind == "tensor" else dest
        r = pst.migrate({"x": x, "id": ids}, d, mesh)
        y = r.rows
        loss = (y["x"] * weight(y["id"], x.dtype)[:, None]).sum()
        if kind == "tensor":
            d.copy_(torch.flip(d, [0]))
        else:
            d[:] = d[::-1].copy()
        loss.backward()
        assert torch.equal(x.grad, weight(ids, x.dtype)[:, None].expand_as(x).contiguous())


@pytest.mark.mpi(min_size=2)
def test_a_column_bad_on_one_rank(mesh):
    """A column only the last rank cannot move (a meta tensor) raised there before the count
    exchange and the others waited for ever: its error travels with the counts, every other
    rank raises "rank q's input is bad", and the next migration runs."""
    last = mesh.size - 1
    x, q, ids, dest = rows(mesh, 6, n=4)
    col = torch.zeros(4, device="meta") if mesh.rank == last else q
    try:
        pst.migrate((x, col), dest, mesh)
        got = "ok"
    except (ValueError, NotImplementedError) as e:
        got = f"{type(e).__name__}: {e}"
    if mesh.rank == last:
        assert got.startswith("NotImplementedError: pyshard.torch: a meta tensor"), got
    else:
        assert got.startswith(f"ValueError: pyshard.migrate: rank {last}'s input is bad"), got
    r = pst.migrate((x, q), dest, mesh)
    assert r.rows[0].shape[1] == 3
