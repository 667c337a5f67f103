"""Gradients through pyshard.torch: redistribute, redistribute_many and halo_pad, checked
bit for bit against single-process torch autograd on the global tensors; halo_pad on the
route's method.

The loss of a case is global: each rank sums over the cells it holds, ``sum(w[box] *
f(y.local))`` with a deterministic global weight ``w``; on a Replicate mesh dim every replica
computes the same sum, counted once (the convention, docs/adjoints.md); on a Partial(sum)
result ``f`` is linear, so the ranks' sums add up to the global loss. The reference builds
the global tensor (the sum or mean of the addends, for Partial sources) as a torch leaf, runs
the same chain of local operations on it and backpropagates. Data are small integers, so
every gradient is exact and compared with ``torch.equal``.
"""

from __future__ import annotations

import random
import warnings
from math import prod

import numpy as np
import pytest
from oracle import halo_cells
from test_halo import expected_method
from test_redistribute_nd import MESHES, counts_since

import pyshard as ps
from pyshard import Partial, Replicate, Shard
from pyshard.layout import ravel

torch = pytest.importorskip("torch")
pst = pytest.importorskip("pyshard.torch")

pytestmark = [pytest.mark.mpi, pytest.mark.numerics, pytest.mark.mesh3d]  # mesh3d: 2x2x2 at 8 ranks

R, P = Replicate(), Partial("sum")

MESHES_3D = {1: (1, 1, 1), 2: (1, 2, 1), 3: (3, 1, 1), 4: (2, 1, 2), 6: (1, 2, 3),
             7: (1, 1, 7), 8: (2, 2, 2)}  # fmt: skip


def all_meshes(n):
    """1-D, the 2-D (and 3-D) meshes test_redistribute_nd uses, and one 3-D mesh."""
    out = [(n,)] + [m for m in MESHES.get(n, []) if len(m) <= 3]
    m3 = MESHES_3D.get(n, (1, 1, n))
    return out + ([m3] if m3 not in out else [])


def tdtype(name):
    return getattr(torch, name)


def global_tensor(shape, dtype, seed):
    """Small integers, exact in every dtype used here (|v| <= 4)."""
    n = prod(shape)
    v = (np.arange(n, dtype=np.int64) * 7919 + 31 * seed) % 9 - 4
    return torch.tensor(v.reshape(shape), dtype=torch.float64).to(tdtype(dtype))


def cut(rng, n, parts):
    """Random extents (zeros allowed) of ``parts`` shards summing to ``n``."""
    pts = sorted(rng.randint(0, n) for _ in range(parts - 1))
    return [b - a for a, b in zip([0] + pts, pts + [n])]


def random_placements(rng, ndim, mesh_shape, partial=True, ops=("sum",)):
    choices = [Shard(d) for d in range(ndim)] + [R] + ([Partial(o) for o in ops] if partial else [])
    pl = [rng.choice(choices) for _ in mesh_shape]
    # one Partial op per layout keeps the sources simple (the reference reduces once)
    seen = [p.op for p in pl if isinstance(p, Partial)]
    if len(set(seen)) > 1:
        pl = [Partial(seen[0]) if isinstance(p, Partial) else p for p in pl]
    return pl


def random_sizes(rng, shape, mesh_shape, pl):
    """Uneven (and empty) shards half the time."""
    if rng.random() < 0.5:
        return None
    sizes = {}
    for d, n in enumerate(shape):
        mdims = [m for m, p in enumerate(pl) if p == Shard(d)]
        if mdims:
            sizes[d] = cut(rng, n, prod(mesh_shape[m] for m in mdims))
    return sizes or None


def source(g_parts, op, mesh, pl, sizes, dtype):
    """This rank's leaf tensor for layout (pl, sizes) of the global array whose Partial
    addends are ``g_parts`` (one addend, the array itself, without Partial dims)."""
    layout = ps.Layout(tuple(g_parts.shape[1:]), np.float64, mesh.shape, pl, sizes)
    pdims = [m for m, p in enumerate(pl) if isinstance(p, Partial)]
    q = ravel([mesh.coords[m] for m in pdims], [mesh.shape[m] for m in pdims]) if pdims else 0
    leaf = g_parts[q][layout.box(mesh.coords)].detach().clone().requires_grad_()
    x = pst.from_local(leaf, mesh, pl, global_shape=layout.shape, sizes=sizes)
    return x, leaf, q


def local_op(t):
    """The elementwise step between hops on a non-Partial layout (exact on small ints)."""
    return t * 2 - 1


def run_chain(mesh, shape, dtype, src, hops, op="sum", seed=0, algorithm=None, last_grad=None):
    """Run a chain of redistributes from ``src`` = (placements, sizes) through ``hops``;
    return (this rank's gradient of the source leaf, the reference's)."""
    pl0, sz0 = src
    pdims = [m for m, p in enumerate(pl0) if isinstance(p, Partial)]
    nq = prod(mesh.shape[m] for m in pdims) if pdims else 1
    parts = torch.stack([global_tensor(shape, dtype, seed + 5 * k) for k in range(nq)])
    x, leaf, q = source(parts, op, mesh, pl0, sz0, dtype)
    w = global_tensor(shape, dtype, seed + 1000)
    # distributed
    cur = x
    for pl, sz in hops:
        cur = pst.redistribute(cur, pl, sz, algorithm=algorithm,
                               grad_placements=last_grad if (pl, sz) is hops[-1] else None)
        if not any(isinstance(p, Partial) for p in pl):
            cur = pst.ShardedTensor(local_op(cur.local), cur.layout, cur.mesh)
    linear = any(isinstance(p, Partial) for p in cur.placements)
    yl = cur.local
    loss = (w[cur.box] * (yl if linear else yl * yl)).sum()
    # a Partial("avg") result's value is the mean of the ranks' addends: the loss of the value
    # is the ranks' losses of their addends over their count
    n_avg = prod(mesh.shape[m] for m, p in enumerate(cur.placements) if p == Partial("avg"))
    if n_avg > 1:
        loss = loss / n_avg
    loss.backward()
    # reference: the same on the global tensors
    ref_parts = parts.detach().clone().requires_grad_()
    if pdims:
        X = ref_parts.sum(0) if op == "sum" else ref_parts.mean(0)
    else:
        X = ref_parts[0]
    Y = X
    for pl, _ in hops:
        if not any(isinstance(p, Partial) for p in pl):
            Y = local_op(Y)
    (w * (Y if linear else Y * Y)).sum().backward()
    want = ref_parts.grad[q][x.box]
    return leaf.grad, want


def random_cases(rng, mesh_shape, shapes, ncases, ops=("sum",), hop_ops=("sum",)):
    out = []
    for k in range(ncases):
        shape = shapes[k % len(shapes)]
        nd = len(shape)
        pl0 = random_placements(rng, nd, mesh_shape, ops=ops)
        src = (pl0, random_sizes(rng, shape, mesh_shape, pl0))
        hops = []
        for _ in range(rng.randint(1, 3)):
            pl = random_placements(rng, nd, mesh_shape, ops=hop_ops)
            hops.append((pl, random_sizes(rng, shape, mesh_shape, pl)))
        out.append((shape, src, hops))
    return out


SHAPES = [(5, 3), (4, 0), (7,), (3, 4, 2), (2, 1, 5)]


def same(got, want, op):
    """Bitwise, except after Partial("avg"): a hop from it to Partial("sum") divides each
    rank's addend by n before the sum, where the serial reference divides the sum (mean), so
    the values (and the gradients through them) may differ in the last bits where n is not a
    power of two (1 ulp seen at 5 ranks); there, within a few ulps."""
    if op != "avg":
        return torch.equal(got, want)
    scale = float(want.abs().max()) if want.numel() else 0.0
    return torch.allclose(got, want, rtol=8 * torch.finfo(want.dtype).eps,
                          atol=8 * torch.finfo(want.dtype).eps * scale)


def check_cases(comm, dtype, ncases, seed, ops=("sum",), algorithm=None, hop_ops=("sum",)):
    failures = []
    for mesh_shape in all_meshes(comm.size):
        mesh = ps.Mesh(comm, mesh_shape)
        rng = random.Random(seed + len(mesh_shape))  # the same on every rank
        for shape, src, hops in random_cases(rng, mesh_shape, SHAPES, ncases, ops, hop_ops):
            op = next((p.op for p in src[0] if isinstance(p, Partial)), "sum")
            got, want = run_chain(mesh, shape, dtype, src, hops, op=op, algorithm=algorithm)
            tol = "avg" if any(p == Partial("avg") for pl, _ in hops for p in pl) else op
            if got is None or got.dtype != want.dtype or not same(got, want, tol):
                failures.append(f"{mesh_shape} {shape} {src} -> {hops}: {got} vs {want}")
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:5])


def test_random_chains_float64(comm):
    """Random sources (Shard, Replicate, Partial(sum), uneven and empty shards) through one to
    three random hops, on 1-D to 3-D meshes."""
    check_cases(comm, "float64", 14, seed=1)


def test_random_chains_partial_avg(comm):
    check_cases(comm, "float64", 6, seed=2, ops=("avg",))


def test_random_chains_through_partial_avg(comm):
    """Hops to Partial("avg") in the middle of a chain: the gradient arriving at such a
    result is its addends' (the value's divided by n), so its backward multiplies by n before
    the reverse redistribute (it once handed the source 1/n of its gradient)."""
    check_cases(comm, "float64", 10, seed=4, ops=("sum", "avg"), hop_ops=("sum", "avg"))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_random_chains_low_precision(comm, dtype):
    if dtype == "bfloat16":
        pytest.importorskip("ml_dtypes")
    check_cases(comm, dtype, 6, seed=3)


def test_named_changes(comm):
    """The rows of the docs' table on a 1-D mesh: each forward change and the collectives its
    backward runs."""
    n = comm.size
    mesh = ps.Mesh(comm, (n,))
    shape = (2 * n + 1, 3)
    cases = [  # (source, target, collectives of the backward)
        ([Shard(0)], [Shard(1)], {"alltoallv", "alltoall", "p2p", "shm"}),
        ([Shard(0)], [R], set()),  # a local slice
        ([R], [Shard(0)], {"allgatherv", "allgather", "shm"}),
        ([P], [R], set()),  # identity
        ([P], [Shard(0)], {"allgatherv", "allgather", "shm"}),
        ([R], [P], set()),
        ([Shard(0)], [P], set()),
    ]
    for src, dst, kinds in cases:
        got, want = run_chain(mesh, shape, "float64", (src, None), [(dst, None)])
        assert torch.equal(got, want), (src, dst)
        # the backward alone: count its collectives
        x, leaf, _ = source(torch.stack([global_tensor(shape, "float64", 0)] * (n if P in src
                            else 1)), "sum", mesh, src, None, "float64")  # fmt: skip
        y = pst.redistribute(x, dst)
        before = ps.comm_stats()
        y.local.backward(torch.ones_like(y.local))
        used = {k for k, v in ps.comm_stats().items() if v != before.get(k, 0)}
        if n == 1 or not kinds:
            assert used == set(), (src, dst, used)
        else:
            assert len(used) == 1 and used <= kinds, (src, dst, used)


def test_grad_placements_partial_sums_the_ranks(comm):
    """A replicated result whose ranks compute different losses: grad_placements=[Partial]
    sums their gradients (one Allreduce, or a Reduce_scatter onto a sharded source)."""
    for mesh_shape in all_meshes(comm.size):
        mesh = ps.Mesh(comm, mesh_shape)
        g = global_tensor((5, 4), "float64", 7)
        for src in ([Shard(0)] + [R] * (mesh.ndim - 1), [R] * mesh.ndim):
            x, leaf, _ = source(g[None], "sum", mesh, src, None, "float64")
            y = pst.redistribute(x, [R] * mesh.ndim, grad_placements=[P] * mesh.ndim)
            wr = global_tensor((5, 4), "float64", 100 + comm.rank)  # differs per rank
            before = ps.comm_stats()
            (wr * y.local).sum().backward()
            used = {k for k, v in ps.comm_stats().items() if v != before.get(k, 0)}
            if comm.size > 1 and mesh_shape == (comm.size,):
                want = {"reduce_scatter", "reduce_scatter_block"} if src[0] != R else {
                    "allreduce"}  # fmt: skip
                assert len(used) == 1 and used <= want | {"shm"}, (src, used)
            total = sum(global_tensor((5, 4), "float64", 100 + r) for r in range(comm.size))
            assert torch.equal(leaf.grad, total[x.box]), (mesh_shape, src)


def test_max_min_sources_have_no_gradient(comm):
    mesh = ps.Mesh(comm, (comm.size,))
    t = torch.zeros(3, 2, dtype=torch.float64, requires_grad=True)
    x = pst.from_local(t, mesh, [Partial("max")], global_shape=(3, 2))
    with pytest.raises(NotImplementedError, match="max"):
        pst.redistribute(x, [R])
    with torch.no_grad():  # outside the graph it is an ordinary reduction
        assert pst.redistribute(x, [R]).local.shape == (3, 2)
    with pytest.raises(ValueError, match="grad_placements"):
        pst.redistribute(pst.from_local(t, mesh, [R], global_shape=(3, 2)), [R],
                         grad_placements=[Partial("max")])


def test_grad_placements_that_split_otherwise_raise_in_the_forward(comm):
    """The gradient arriving at a result has the result's local shape, so grad_placements
    that give another local shape on some rank raise ValueError in the forward, on every
    rank, before any communication (they were accepted, then the backward raised on the
    ranks whose shapes differed and hung the others, or failed on every rank)."""
    p = comm.size
    mesh = ps.Mesh(comm, (p,))
    g = global_tensor((6, 2), "float64", 3)
    S0, S1 = Shard(0), Shard(1)
    x = pst.distribute(g.clone().requires_grad_(), mesh, [R])
    cases = [([S0], [R], None)] if p > 1 else []  # a split result, its gradient said whole
    if p > 1:
        # uneven: only rank 0's shape differs under the balanced split of the gradient
        cases.append(([S0], [Partial()], {0: [6] + [0] * (p - 1)}))
        cases.append(([S0], [S1], None))
    before = ps.comm_stats()
    for pl, gp, sizes in cases:
        for many in (False, True):
            with pytest.raises(ValueError, match="grad_placements.*local shape"):
                if many:
                    pst.redistribute_many([x], pl, [sizes], grad_placements=gp)
                else:
                    pst.redistribute(x, pl, sizes, grad_placements=gp)
    assert counts_since(before) == {}
    # the same local shapes: accepted (Replicate <-> Partial, or the result's own split)
    for pl, gp in (([R], [Partial()]), ([S0], [S0])):
        y = pst.redistribute(x, pl, grad_placements=gp)
        y.local.sum().backward()
    assert x.local.grad is not None


def test_second_derivatives_raise(comm):
    """A backward with create_graph=True through pyshard's functions raises (they are first
    derivatives only) instead of silently dropping the second-order term."""
    mesh = ps.Mesh(comm, (comm.size,))
    g = global_tensor((6, 2), "float64", 4)
    x = pst.distribute(g.clone().requires_grad_(), mesh, [Shard(0)])
    for step in (lambda t: pst.redistribute(t, [R]),
                 lambda t: pst.redistribute_many([t], [R])[0],
                 lambda t: pst.halo_pad(t, 1)):
        y = step(x)
        yl = y if isinstance(y, torch.Tensor) else y.local  # halo_pad gives the padded tensor
        (gr,) = torch.autograd.grad((yl ** 2).sum(), x.local, create_graph=True)
        with pytest.raises(RuntimeError, match="once_differentiable"):
            (gr ** 2).sum().backward()


def test_gradcheck(comm):
    """torch.autograd.gradcheck of X -> [Replicate] -> src -> dst -> [Replicate] (every rank
    perturbs the same replicated input, so every rank makes the same calls)."""
    for mesh_shape in all_meshes(comm.size)[:2]:
        mesh = ps.Mesh(comm, mesh_shape)
        nd = len(mesh_shape)
        for src, dst in [
            ([Shard(0)] + [R] * (nd - 1), [Shard(1)] + [R] * (nd - 1)),
            ([P] + [Shard(1)] * (nd - 1), [Shard(0)] * nd),
            ([R] * (nd - 1) + [Shard(1)], [P] * nd),
        ]:

            def f(t, src=src, dst=dst, mesh=mesh, nd=nd):
                a = pst.from_local(t, mesh, [R] * nd, global_shape=tuple(t.shape))
                b = pst.redistribute(a, src)
                c = pst.redistribute(pst.ShardedTensor(b.local * 3, b.layout, mesh), dst)
                return pst.redistribute(c, [R] * nd).local

            t = torch.linspace(-1, 1, 3 * 4, dtype=torch.float64).reshape(3, 4).requires_grad_()
            assert torch.autograd.gradcheck(f, (t,), eps=1e-6, atol=1e-8), (mesh_shape, src, dst)


def test_shared_memory_and_mpi_give_the_same_gradients(comm):
    """The same chains with every exchange through node-shared memory and through MPI:
    bit for bit the same gradients (non-integer float32 data: rounding would show)."""
    mesh = ps.Mesh(comm, (comm.size,))
    shape = (2 * comm.size + 3, 5)
    gen = torch.Generator().manual_seed(4)
    g = torch.randn(shape, generator=gen, dtype=torch.float32)
    w = torch.randn(shape, generator=gen, dtype=torch.float32)
    grads = {}
    for alg in ("shm", "alltoallv"):
        x = pst.distribute(g, mesh, [Shard(0)], sizes={0: cut(random.Random(5), shape[0],
                                                                comm.size)})  # fmt: skip
        leaf = x.local.detach().clone().requires_grad_()
        x = pst.from_local(leaf, mesh, [Shard(0)], global_shape=shape, sizes=x.layout.sizes)
        y = pst.redistribute(x, [Shard(1)], algorithm=alg)
        z = pst.redistribute(y, [R], algorithm=alg)
        u = pst.redistribute(pst.ShardedTensor(torch.sin(z.local), z.layout, mesh), [Shard(1)],
                             algorithm=alg)  # fmt: skip
        (w[u.box] * u.local).sum().backward()
        grads[alg] = leaf.grad
    assert torch.equal(grads["shm"], grads["alltoallv"])
    ref = g.clone().requires_grad_()
    (w * torch.sin(ref)).sum().backward()
    assert torch.equal(grads["shm"], ref.grad[x.box])


def test_redistribute_many(comm):
    mesh = ps.Mesh(comm, (comm.size,))
    shapes = [(5, 3), (comm.size + 2, 4), (0, 2)]
    leaves, xs, gs = [], [], []
    for k, shape in enumerate(shapes):
        g = global_tensor(shape, "float64", k)
        x = pst.distribute(g, mesh, [Shard(0)])
        leaf = x.local.detach().clone().requires_grad_()
        leaves.append(leaf)
        xs.append(pst.from_local(leaf, mesh, [Shard(0)], global_shape=shape))
        gs.append(g)
    ys = pst.redistribute_many(xs, [Shard(1)])
    loss = sum((global_tensor(s, "float64", 50 + k)[y.box] * y.local ** 2).sum()
               for k, (s, y) in enumerate(zip(shapes, ys)))  # fmt: skip
    loss.backward()
    for k, (s, x, leaf) in enumerate(zip(shapes, xs, leaves)):
        want = 2 * global_tensor(s, "float64", 50 + k) * gs[k]
        assert torch.equal(leaf.grad, want[x.box]), k
        assert torch.equal(ys[k].local.detach(), gs[k][ys[k].box])


def test_redistribute_many_max_source_beside_one_that_requires_grad(comm):
    """A Partial('max') and a Partial('min') tensor that need no gradient move with one that
    does: the reduced values, and the gradient of the one that requires it; only a max
    source that itself requires grad raises NotImplementedError."""
    mesh = ps.Mesh(comm, (comm.size,))
    shape = (comm.size + 2, 3)
    g = global_tensor(shape, "float64", 3)
    leaf = g[pst.distribute(g, mesh, [Shard(0)]).box].clone().requires_grad_()
    a = pst.from_local(leaf, mesh, [Shard(0)], global_shape=shape)
    parts = [global_tensor((4,), "float64", 20 + r) for r in range(comm.size)]
    b = pst.from_local(parts[comm.rank], mesh, [Partial("max")], global_shape=(4,))
    c = pst.from_local(parts[comm.rank], mesh, [Partial("min")], global_shape=(4,))
    ya, yb, yc = pst.redistribute_many([a, b, c], [R])
    assert torch.equal(yb.local, torch.stack(parts).amax(0))
    assert torch.equal(yc.local, torch.stack(parts).amin(0))
    assert not yb.local.requires_grad and not yc.local.requires_grad
    w = global_tensor(shape, "float64", 7)
    (w * ya.local).sum().backward()
    assert torch.equal(leaf.grad, w[a.box])
    bg = pst.from_local(parts[comm.rank].clone().requires_grad_(), mesh, [Partial("max")],
                        global_shape=(4,))
    with pytest.raises(NotImplementedError, match="max"):
        pst.redistribute_many([a, bg], [R])


@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
def test_conjugate_and_negative_views(comm, dtype):
    """A local tensor with the conjugate or the negative bit set (a lazy ``.conj()`` view, and
    ``.conj().imag``) redistributes as its values; a gradient that arrives as a conjugate view
    (a loss through ``.conj()``) goes back as torch's serial gradient; and a plain contiguous
    tensor is still read in place (no copy)."""
    mesh = ps.Mesh(comm, (comm.size,))
    shape = (comm.size + 2, 3)
    cdt = tdtype(dtype)
    z = (global_tensor(shape, "float64", 1) + 1j * global_tensor(shape, "float64", 2)).to(cdt)
    box = pst.distribute(z, mesh, [Shard(0)]).box
    x = pst.from_local(z[box].clone().conj(), mesh, [Shard(0)], global_shape=shape)
    assert x.local.is_conj()
    assert torch.equal(pst.redistribute(x, [R]).local, z.conj().resolve_conj())
    im = z[box].clone().conj().imag
    assert im.is_neg()
    xi = pst.from_local(im, mesh, [Shard(0)], global_shape=shape)
    assert torch.equal(pst.redistribute(xi, [Shard(1)]).local, -z.imag[xi.redistribute(
        [Shard(1)]).box])
    plain = z[box].clone()
    assert pst.from_local(plain, mesh, [Shard(0)], global_shape=shape).to_pyshard(
        ).local.ctypes.data == plain.data_ptr() or plain.numel() == 0
    w = (global_tensor(shape, "float64", 5) - 2j * global_tensor(shape, "float64", 6)).to(cdt)
    for many in (False, True):
        leaf = z[box].clone().requires_grad_()
        xs = pst.from_local(leaf, mesh, [Shard(0)], global_shape=shape)
        y = pst.redistribute_many([xs], [R])[0] if many else pst.redistribute(xs, [Shard(1)])
        (y.local.conj() * w[y.box]).real.sum().backward()
        ref = z.clone().requires_grad_()
        (ref.conj() * w).real.sum().backward()
        assert torch.equal(leaf.grad, ref.grad[box]), many


def test_sharded_tensor_checks_the_dtype(comm):
    """A local tensor whose dtype is not the layout's is refused (ValueError), when wrapped and
    when swapped in later, before any communication; bfloat16 maps to ml_dtypes' bfloat16."""
    mesh = ps.Mesh(comm, (comm.size,))
    x = pst.from_local(torch.arange(4.0) + 4 * comm.rank, mesh, [Shard(0)],
                       global_shape=(4 * comm.size,))
    assert x.layout.dtype == np.dtype("float32")
    for bad in (x.local.double(), x.local.to(torch.bfloat16), x.local.int()):
        with pytest.raises(ValueError, match="dtype"):
            pst.ShardedTensor(bad, x.layout, mesh)
    xb = pst.from_local(x.local.to(torch.bfloat16), mesh, [Shard(0)],
                        global_shape=(4 * comm.size,))
    assert pst.ShardedTensor(xb.local, xb.layout, mesh).redistribute([R]).local.dtype == \
        torch.bfloat16
    x.local = x.local.double()
    with pytest.raises(ValueError, match="dtype"):
        pst.redistribute(x, [R])
    with pytest.raises(ValueError, match="dtype"):
        pst.redistribute_many([x], [R])


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("case", ["complex32", "not a tensor"])
@pytest.mark.parametrize("how", ["infer", "validate"])
def test_from_local_one_bad_rank_raises_everywhere(comm, case, how):
    """pyshard.torch.from_local where it communicates (global_shape=None, validate=True): a
    tensor one rank alone cannot take (a dtype numpy lacks, not a tensor) travels in the
    Allgather as pyshard.from_local's problems do, so every rank raises the same TypeError
    naming it (that rank raised alone: the others hung in the Allgather); the message is
    pyshard's, not torch's "unsupported ScalarType"."""
    p, r = comm.size, comm.rank
    mesh = ps.Mesh(comm, (p,))
    good = torch.zeros((2, 3))
    def complex32():
        with warnings.catch_warnings():  # torch: "ComplexHalf support is experimental"
            warnings.simplefilter("ignore", UserWarning)
            return torch.zeros((2, 3), dtype=torch.complex32)

    bad = {"complex32": complex32, "not a tensor": lambda: np.zeros((2, 3), np.float32)}[case]
    local = bad() if r == p - 1 else good
    kw = {"global_shape": (2 * p, 3), "validate": True} if how == "validate" else {}
    with pytest.raises(TypeError) as e:
        pst.from_local(local, mesh, [Shard(0)], **kw)
    msg = str(e.value)
    assert comm.allgather(msg) == [msg] * p, msg
    assert f"rank {p - 1}" in msg and ("torch.Tensor" if case == "not a tensor" else
                                        "pyshard moves") in msg, msg
    x = pst.from_local(good, mesh, [Shard(0)], **kw)  # still in step
    assert x.layout.shape == (2 * p, 3)
    if r == 0 and not ps.config.get("PYSHARD_VALIDATE"):  # alone: raises, no collective
        with pytest.raises(TypeError, match="pyshard moves"):
            pst.from_local(complex32(), mesh, [Shard(0)],
                           global_shape=(2 * p, 3))
    mesh.free()


def test_from_local_and_distribute_keep_the_tensor(comm):
    mesh = ps.Mesh(comm, (comm.size,))
    g = global_tensor((comm.size + 3, 2), "float32", 9).requires_grad_()
    x = pst.distribute(g, mesh, [Shard(0)])
    assert x.global_shape == (comm.size + 3, 2) and x.placements == (Shard(0),)
    assert torch.equal(x.local.detach(), g.detach()[x.box]) and x.local.requires_grad
    x.local.sum().backward()  # distribute is Replicate -> Shard: every rank gets all of it
    assert torch.equal(g.grad, torch.ones_like(g))
    t = torch.ones(3, 2)
    y = pst.from_local(t, mesh, [R], global_shape=(3, 2))
    assert y.local is t and y.mesh is mesh and y.layout.shape == (3, 2)
    z = pst.from_local(t, mesh, [Shard(0)])  # shapes learned by one Allgather
    assert z.global_shape == (3 * comm.size, 2) and z.box[0] == slice(3 * comm.rank,
                                                                      3 * comm.rank + 3)


def test_import_error_without_torch(monkeypatch):
    import importlib.util
    import os
    import sys

    monkeypatch.setitem(sys.modules, "torch", None)
    path = os.path.join(os.path.dirname(ps.__file__), "torch.py")
    spec = importlib.util.spec_from_file_location("pyshard._torch_probe", path)
    mod = importlib.util.module_from_spec(spec)
    with pytest.raises(ImportError, match="pip install torch"):
        spec.loader.exec_module(mod)


# ----------------------------------------------------------------------------- halo_pad


def padded_reference(X, lo, hi, width, periodic, corners):
    """The padded block [lo, hi) of the global torch tensor X as halo_pad fills it, by the
    semantics (pyshard.halo_plan; tests/mpi/oracle.halo_expected), differentiable in X."""
    idx, ghost, outside = halo_cells(tuple(X.shape), lo, hi, width, periodic, corners)
    shape = ghost.shape
    write = ghost | (outside == 0)
    if not all(shape) or not X.numel():
        return torch.zeros(shape, dtype=X.dtype)
    ix = np.ix_(*[np.mod(i, X.shape[d]) for d, i in enumerate(idx)])
    vals = X[tuple(torch.from_numpy(np.ascontiguousarray(a)) for a in ix)]
    return torch.where(torch.from_numpy(write), vals, torch.zeros((), dtype=X.dtype))


def halo_cases(rng, mesh_shape, n):
    out = []
    for k in range(n):
        shape = [(6, 5), (4, 7), (5,), (3, 4, 3)][k % 4]
        nd = len(shape)
        # Replicate on about a third of the mesh dims, of any size (data parallel x domain)
        pl = [R if rng.random() < 0.35 else Shard(rng.randrange(nd)) for _ in mesh_shape]
        sizes = random_sizes(rng, shape, mesh_shape, pl)
        width = tuple(rng.randint(0, min(2, shape[d])) for d in range(nd))
        periodic = tuple(rng.random() < 0.5 for _ in range(nd))
        out.append((shape, pl, sizes, width, periodic, rng.random() < 0.6))
    return out


def pad_loss(p, dtype, seed):
    """A halo_pad case's loss on one padded block ``p``: ``(w * p * p).sum()``, ``w`` from
    ``seed``."""
    return (global_tensor(tuple(p.shape), dtype, seed) * p * p).sum()


def block_seed(placements, mesh_shape, coords):
    """The loss's seed of the block the rank at ``coords`` holds: 200 plus the index of its
    coords on the mesh dims that are not Replicate (the same on every replica of a block;
    without Replicate dims, 200 plus the rank)."""
    keep = [m for m, p in enumerate(placements) if not isinstance(p, Replicate)]
    return 200 + ravel([coords[m] for m in keep], [mesh_shape[m] for m in keep])


def halo_loss(X, layout, width, periodic, corners, dtype, per_rank=False):
    """The global loss of a halo_pad case, on the global tensor ``X``: every block's
    ``pad_loss`` counted once, as the replicas of a block compute it (the convention on
    Replicate dims: the replica at coords 0 on those dims stands for all); ``per_rank``:
    every rank's, seeded by its rank (replicas computing different losses)."""
    rep = [m for m, p in enumerate(layout.placements) if isinstance(p, Replicate)]
    total = 0
    for c in np.ndindex(*layout.mesh_shape):
        if not per_rank and any(c[m] for m in rep):
            continue  # a replica of a block counted already
        iv = [layout.interval(d, c) for d in range(layout.ndim)]
        p = padded_reference(X, [a for a, _ in iv], [b for _, b in iv], width, periodic, corners)
        seed = 200 + ravel(c, layout.mesh_shape) if per_rank else block_seed(
            layout.placements, layout.mesh_shape, c)  # fmt: skip
        total = total + pad_loss(p, dtype, seed)
    return total


def interior_of(t, width):
    return t[tuple(slice(w, t.shape[d] - w) for d, w in enumerate(width))]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_halo_pad_gradient(comm, dtype):
    """halo_pad's values are update()'s (zeros where update never writes) and its backward
    (a fold of the gradient) is torch's gradient of the same padding done globally, over
    uneven and empty shards, periodic dims, box and star stencils, and Replicate mesh dims
    (every replica computes its block's loss, counted once; each replica group's ghosts and
    folds stay in the group, and every replica gets the block's whole gradient)."""
    failures = []
    for mesh_shape in all_meshes(comm.size):
        mesh = ps.Mesh(comm, mesh_shape)
        rng = random.Random(11 + len(mesh_shape))
        for shape, pl, sizes, width, periodic, corners in halo_cases(rng, mesh_shape, 8):
            g = global_tensor(shape, dtype, 3)
            x, leaf, _ = source(g[None], "sum", mesh, pl, sizes, dtype)
            pad = pst.halo_pad(x, width, periodic, corners)
            lo = [b.start for b in x.box]
            hi = [b.stop for b in x.box]
            want_pad = padded_reference(g, lo, hi, width, periodic, corners)
            pad_loss(pad, dtype, block_seed(pl, mesh_shape, mesh.coords)).backward()
            X = g.clone().requires_grad_()
            halo_loss(X, x.layout, width, periodic, corners, dtype).backward()
            case = f"{mesh_shape} {shape} {pl} {sizes} w{width} p{periodic} c{corners}"
            if not torch.equal(pad.detach(), want_pad):
                failures.append(f"values {case}")
            elif not torch.equal(leaf.grad, X.grad[x.box]):
                failures.append(f"grad {case}: {leaf.grad} vs {X.grad[x.box]}")
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:5])


def test_halo_pad_takes_the_route(comm):
    """halo_pad's update and its backward's fold run on the method the route picks for
    ``method`` (``"auto"``: node-shared memory between ranks of a node for large enough
    faces, else persistent requests; the rule computed here from the settings alone), each
    one exchange; the values and gradients are those of ``method="persistent"``, bit for bit.
    The methods whose exchange cannot be set up at every call are refused."""
    mesh = ps.Mesh(comm, (comm.size,))
    g = global_tensor((3 * comm.size + 1, 6), "float64", 5)
    x0 = pst.distribute(g, mesh, [Shard(0)])
    results = {}
    for method in ("persistent", "auto", "shm", "p2p"):
        leaf = x0.local.clone().requires_grad_()
        x = pst.ShardedTensor(leaf, x0.layout, mesh)
        suffix = "_shm" if expected_method(x, method, 1, True, True) == "shm" else ""
        before = ps.comm_stats()
        pad = pst.halo_pad(x, 1, periodic=True, method=method)
        assert counts_since(before) == {"halo" + suffix: 1}, method
        before = ps.comm_stats()
        pad_loss(pad, "float64", 200 + mesh.rank).backward()
        assert counts_since(before) == {"halo_fold" + suffix: 1}, method
        results[method] = (pad.detach(), leaf.grad)
    for method, (pad, grad) in results.items():
        assert torch.equal(pad, results["persistent"][0]), method
        assert torch.equal(grad, results["persistent"][1]), method
    lo = [b.start for b in x0.box]
    hi = [b.stop for b in x0.box]
    assert torch.equal(results["auto"][0], padded_reference(g, lo, hi, (1, 1), (True, True),
                                                            True))
    for bad in ("neighbor", "tune", "mail"):
        with pytest.raises(ValueError, match="halo_pad: method must be one of"):
            pst.halo_pad(x0, 1, method=bad)
    mesh.free()


def replicated_meshes(n):
    """(mesh shape, placements) with Replicate mesh dims: all replicas on a 1-D mesh, and data
    parallel x domain parallel on 2-D and 3-D meshes."""
    out = [((n,), [R])]
    a = next((a for a in range(2, n + 1) if n % a == 0), None)  # the smallest factor
    if a is not None:
        out += [((a, n // a), [R, Shard(0)]), ((n // a, a), [Shard(1), R])]
    if n % 2 == 0 and n > 2:
        out.append(((2, n // 2, 1), [R, Shard(0), Shard(1)]))
    return out


def test_halo_pad_gradient_on_replicas(comm):
    """Named data-parallel x domain-parallel layouts: the gradient of the same loss on every
    replica is the gradient of the block, counted once, on every replica; it differs from the
    padded gradient's interior (no fold) and from the replicas' sum. With
    ``grad_placements=[Partial(), ...]`` on the Replicate dims before halo_pad, replicas
    computing different losses get the sum of their gradients."""
    shape, width, periodic = (2 * comm.size + 1, 5), (1, 2), (True, False)
    failures = []  # asserted at the end: a rank failing early would leave the others waiting
    for mesh_shape, pl in replicated_meshes(comm.size):
        mesh = ps.Mesh(comm, mesh_shape)
        nrep = prod(s for s, p in zip(mesh_shape, pl) if isinstance(p, Replicate))
        g = global_tensor(shape, "float64", 3)
        for corners in (True, False):
            case = f"{mesh_shape} {pl} c{corners}"
            x, leaf, _ = source(g[None], "sum", mesh, pl, None, "float64")
            pad = pst.halo_pad(x, width, periodic, corners)
            pad.retain_grad()
            pad_loss(pad, "float64", block_seed(pl, mesh_shape, mesh.coords)).backward()
            X = g.clone().requires_grad_()
            halo_loss(X, x.layout, width, periodic, corners, "float64").backward()
            want = X.grad[x.box]
            if not torch.equal(leaf.grad, want):
                failures.append(f"grad {case}: {leaf.grad} vs {want}")
            # the case tells the fold from no fold (periodic: even one rank wraps onto itself)
            # and from a sum over the replicas (a gradient not zero somewhere)
            unfolded = comm.allreduce(int(not torch.equal(interior_of(pad.grad, width), want)))
            nonzero = comm.allreduce(int(bool(want.any())))
            if not unfolded or (nrep > 1 and not nonzero):
                failures.append(f"the case does not tell the wrong gradients apart: {case}")
            # replicas computing different losses: grad_placements says so, the gradients add
            x, leaf, _ = source(g[None], "sum", mesh, pl, None, "float64")
            gp = [P if isinstance(p, Replicate) else p for p in pl]
            y = pst.redistribute(x, pl, grad_placements=gp)
            pad = pst.halo_pad(y, width, periodic, corners)
            pad_loss(pad, "float64", 200 + comm.rank).backward()
            X = g.clone().requires_grad_()
            halo_loss(X, x.layout, width, periodic, corners, "float64", per_rank=True).backward()
            if not torch.equal(leaf.grad, X.grad[x.box]):
                failures.append(f"grad_placements {case}: {leaf.grad} vs {X.grad[x.box]}")
        mesh.free()
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:5])


def test_redistribute_then_halo_pad(comm):
    """Random chains: a random source (Shard, Replicate, Partial(sum), uneven and empty
    shards) redistributed to a random layout with Replicate mesh dims, halo_pad on it, a loss
    each block counts once: the source's gradient is single-process torch's."""
    failures = []
    for mesh_shape in all_meshes(comm.size):
        mesh = ps.Mesh(comm, mesh_shape)
        rng = random.Random(17 + len(mesh_shape))
        for shape, pl, sizes, width, periodic, corners in halo_cases(rng, mesh_shape, 4):
            pl0 = random_placements(rng, len(shape), mesh_shape)
            sz0 = random_sizes(rng, shape, mesh_shape, pl0)
            pdims = [m for m, p in enumerate(pl0) if isinstance(p, Partial)]
            nq = prod(mesh_shape[m] for m in pdims) if pdims else 1
            parts = torch.stack([global_tensor(shape, "float64", 5 * k) for k in range(nq)])
            x, leaf, q = source(parts, "sum", mesh, pl0, sz0, "float64")
            y = pst.redistribute(x, pl, sizes)
            pad = pst.halo_pad(pst.ShardedTensor(local_op(y.local), y.layout, mesh), width,
                               periodic, corners)  # fmt: skip
            pad_loss(pad, "float64", block_seed(pl, mesh_shape, mesh.coords)).backward()
            ref = parts.detach().clone().requires_grad_()
            halo_loss(local_op(ref.sum(0)), y.layout, width, periodic, corners,
                      "float64").backward()  # fmt: skip
            if not torch.equal(leaf.grad, ref.grad[q][x.box]):
                failures.append(f"{mesh_shape} {shape} {pl0} {sz0} -> {pl} {sizes} w{width} "
                                f"p{periodic} c{corners}: {leaf.grad} vs {ref.grad[q][x.box]}")
        mesh.free()
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:5])


def test_sharded_tensor_of_another_mesh_shape_raises(comm):
    """A layout made for another mesh shape than the mesh's raises ValueError naming both
    shapes (as ShardedArray does), not a late error about coords or communicators."""
    mesh = ps.Mesh(comm, (comm.size,))
    lay = ps.Layout((4, 2), "float64", (comm.size, 1), [Replicate(), Replicate()])
    with pytest.raises(ValueError, match="mesh of shape"):
        pst.ShardedTensor(torch.zeros(4, 2, dtype=torch.float64), lay, mesh)


@pytest.mark.parametrize("many", [False, True])
def test_same_layout_result_is_the_tensor_itself(comm, many):
    """A redistribute (or redistribute_many) to the source's own layout without gradients
    returns the input tensor itself, so an in-place change of the result is seen by
    autograd: torch raises where a saved tensor was changed (a new tensor over the same
    memory, with its own version counter, gave w.grad off by the change, silently)."""
    n = comm.size
    mesh = ps.Mesh(comm, (n,))
    d = torch.arange(6.0).reshape(3, 2) + comm.rank
    w = torch.ones(3, 2, requires_grad=True)
    z = (w * d).sum()  # autograd saves d
    x = pst.from_local(d, mesh, [Shard(0)], global_shape=(3 * n, 2))
    y = pst.redistribute_many([x], [Shard(0)])[0] if many else pst.redistribute(x, [Shard(0)])
    assert y.local is d
    y.local.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        z.backward()
    mesh.free()


def test_torch_func_transforms_are_refused_clearly(comm):
    """torch.func.grad and vmap of a function calling pyshard.torch: NotImplementedError
    naming torch.func on every rank (torch's "Cannot access data pointer of Tensor that
    doesn't have storage" named neither)."""
    func = pytest.importorskip("torch.func")
    n = comm.size
    mesh = ps.Mesh(comm, (n,))

    def f(t):
        x = pst.from_local(t, mesh, [Shard(0)], global_shape=(3 * n, 2))
        return pst.redistribute(x, [R]).local.sum()

    layout = ps.Layout((3 * n, 2), np.float32, (n,), [Shard(0)])

    def g(t):  # the tensor wrapped by the constructor: torch's own error came from apply
        return pst.redistribute(pst.ShardedTensor(t, layout, mesh), [R]).local.sum()

    def h(t):
        return pst.halo_pad(pst.ShardedTensor(t, layout, mesh), 1).sum()

    t = torch.ones(3, 2)
    for call in (lambda: func.grad(f)(t), lambda: func.vmap(f)(torch.stack([t, t])),
                 lambda: func.grad(g)(t), lambda: func.grad(h)(t)):
        with pytest.raises(NotImplementedError, match="torch.func"):
            call()
    assert f(t).item() == 6.0 * n  # (plain autograd still works)
    mesh.free()
