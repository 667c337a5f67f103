"""pyshard.jax against numpy and serial JAX: redistributes and halos inside ``jax.jit`` on 1-D
and 2-D meshes with uneven and empty shards, their gradients against the serial program's,
dot-product (adjoint) identities, ``vmap``, two independent collectives in one ``jit``, and
the errors raised at trace time. Every case is checked on every rank; failures are gathered
and asserted at the end of a test (a rank failing early would leave the others waiting).
"""

from __future__ import annotations

import importlib.util
import os
import random
from math import prod

import launch
import numpy as np
import pytest
from mpi4py import MPI
from test_redistribute_nd import MESHES

import pyshard as ps
from pyshard import Partial, Replicate, Shard

jax = pytest.importorskip("jax")
psj = pytest.importorskip("pyshard.jax")
import jax.numpy as jnp  # noqa: E402

jax.config.update("jax_enable_x64", True)
# what these tests pay for is XLA compiling a program per case on every rank (2 cores shared
# by up to 4 ranks): XLA's optimisations change no bit of a redistribute or a halo
jax.config.update("jax_disable_most_optimizations", True)

pytestmark = [pytest.mark.mpi, pytest.mark.jax, pytest.mark.numerics]  # not per MPI library

R = Replicate()
DTYPES = ["float64", "float32", "bfloat16", "int32"]


def meshes(n):
    """The 1-D mesh and the first 2-D one test_redistribute_nd takes (2x2 at 4 ranks)."""
    return [(n,)] + [m for m in MESHES.get(n, []) if len(m) == 2][:1]


def global_array(shape, dtype, seed):
    """Small integers, exact in every dtype used here (|v| <= 4)."""
    n = prod(shape)
    v = (np.arange(n, dtype=np.int64) * 7919 + 31 * seed) % 9 - 4
    return np.asarray(jnp.asarray(v.reshape(shape), dtype=dtype))


def cut(rng, n, parts):
    pts = sorted(rng.randint(0, n) for _ in range(parts - 1))
    return [b - a for a, b in zip([0] + pts, pts + [n])]


def random_layout(rng, shape, mesh_shape, partial=False):
    choices = [Shard(d) for d in range(len(shape))] + [R] + ([Partial()] if partial else [])
    pl = [rng.choice(choices) for _ in mesh_shape]
    sizes = None
    if rng.random() < 0.6:  # uneven, empty shards allowed
        sizes = {}
        for d, n in enumerate(shape):
            mdims = [m for m, p in enumerate(pl) if p == Shard(d)]
            if mdims:
                sizes[d] = cut(rng, n, prod(mesh_shape[m] for m in mdims))
        sizes = sizes or None
    return pl, sizes


def layout_of(shape, dtype, mesh, pl, sizes):
    return ps.Layout(tuple(shape), np.dtype(dtype), mesh.shape, pl, sizes)


def sharded(g_parts, mesh, pl, sizes):
    """This rank's Sharded for layout (pl, sizes) of the array whose Partial addends are
    ``g_parts`` (one addend without Partial dims)."""
    lay = layout_of(g_parts.shape[1:], g_parts.dtype, mesh, pl, sizes)
    pdims = [m for m, p in enumerate(pl) if isinstance(p, Partial)]
    q = int(np.ravel_multi_index([mesh.coords[m] for m in pdims],
                                 [mesh.shape[m] for m in pdims])) if pdims else 0
    local = jnp.asarray(g_parts[q][lay.box(mesh.coords)])
    return psj.from_local(local, mesh, pl, lay.shape, sizes), q


def load_example(name):
    path = os.path.join(os.path.dirname(__file__), "..", "..", "examples", f"{name}.py")
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def agree(comm, failures):
    everyone = comm.allgather(failures)
    bad = [f"rank {r}: {f}" for r, fs in enumerate(everyone) for f in fs]
    assert not bad, f"{len(bad)} failures:\n" + "\n".join(bad[:8])


# ----------------------------------------------------------------------------- values


@pytest.mark.parametrize("dtype", DTYPES)
def test_redistribute_matches_numpy(comm, dtype):
    """Random layout pairs (Partial sum sources among them) under jit: every rank's result
    is the numpy slice of the global array (the sum of the addends for Partial sources)."""
    failures = []
    for ms in meshes(comm.size):
        mesh = ps.Mesh(comm, ms)
        rng = random.Random(7 + len(ms))
        for k in range(6 if dtype == "float64" else 2):
            shape = [(7, 5), (6, 3, 4), (1, 9), (0, 4)][k % 4]
            pl0, sz0 = random_layout(rng, shape, ms, partial=True)
            pl1, sz1 = random_layout(rng, shape, ms)
            pdims = [m for m, p in enumerate(pl0) if isinstance(p, Partial)]
            nq = prod(ms[m] for m in pdims) if pdims else 1
            parts = np.stack([global_array(shape, dtype, 5 * k + j) for j in range(nq)])
            x, _ = sharded(parts, mesh, pl0, sz0)
            y = jax.jit(lambda x, pl1=pl1, sz1=sz1: psj.redistribute(x, pl1, sz1))(x)
            want = parts.astype(np.float64).sum(0)[y.layout.box(mesh.coords)]
            got = np.asarray(y.local).astype(np.float64)
            if y.local.dtype != np.dtype(dtype) or not np.array_equal(got, want):
                failures.append(f"{ms} {shape} {pl0} {sz0} -> {pl1} {sz1}")
        mesh.free()
    agree(comm, failures)


@pytest.mark.parametrize("algorithm", ["shm", "auto"])
def test_exchanges_through_node_shared_memory(comm, algorithm):
    """Exchange steps on host buffers take node-shared memory where the route does
    (``shm``: wherever usable; ``auto``: with PYSHARD_SHM_MIN_BYTES=0, every block): node
    peers write their blocks straight into XLA's buffer by cross-memory attach where the node
    can (``shm_cma``; else into a segment of the receiver's, copied over), this rank's own
    blocks straight into it. Under jit and eagerly, uneven and empty shards, 1-D and 2-D
    meshes: every rank's result is the numpy slice, and the node path ran (``comm_stats()``'s
    ``shm``) exactly as often as the numpy route sends those exchanges through it."""
    from pyshard.planner import plan
    from pyshard.route import route

    failures, able = [], 0
    with ps.config.override(PYSHARD_SHM_MIN_BYTES=0):
        for ms in meshes(comm.size):
            mesh = ps.Mesh(comm, ms)
            nt = mesh.node_transport((0,))
            able |= nt is not None and nt.cma
            rng = random.Random(11 + len(ms))
            for k in range(5):
                shape = [(10, 7), (9, 7), (5, 8, 3), (0, 6), (13, 2)][k]
                if k == 0:  # a transpose on mesh dim 0, the first dim of a 2-D mesh split too
                    pl0 = [Shard(0)] + [Shard(1)] * (len(ms) - 1)
                    pl1 = [Shard(1)] + [Shard(0)] * (len(ms) - 1)
                    sz0 = sz1 = None
                else:
                    pl0, sz0 = random_layout(rng, shape, ms)
                    pl1, sz1 = random_layout(rng, shape, ms)
                g = global_array(shape, "float64", 40 + k)
                x, _ = sharded(g[None], mesh, pl0, sz0)
                dst = layout_of(shape, g.dtype, mesh, pl1, sz1)
                node = sum(st.kind == "alltoallv" and route(st, mesh, algorithm).path == "shm"
                           for st in plan(x.layout, dst).steps)
                f = jax.jit(lambda x, pl1=pl1, sz1=sz1: psj.redistribute(
                    x, pl1, sz1, algorithm=algorithm))
                f.lower(x)  # compiled before the count: tracing runs no step
                before = ps.comm_stats().get("shm", 0)
                for how, y in (("jit", f(x)), ("eager", psj.redistribute(
                        x, pl1, sz1, algorithm=algorithm))):
                    if not np.array_equal(np.asarray(y.local), g[y.layout.box(mesh.coords)]):
                        failures.append(f"{how} {ms} {shape} {pl0} {sz0} -> {pl1} {sz1}")
                ran = ps.comm_stats().get("shm", 0) - before
                if ran != 2 * node:
                    failures.append(f"{ms} {pl0} -> {pl1}: {ran} node-path runs, {2 * node} "
                                    "expected")
            mesh.free()
        # rows of 2 KiB, 16 of them a block (pyshard.geometry.attach_runs): node peers
        # write them straight into XLA's buffer where the node can
        p = comm.size
        mesh = ps.Mesh(comm, (p,))
        g = global_array((16 * p + 1, 512 * p), "float32", 60)
        x, _ = sharded(g[None], mesh, [Shard(0)], None)
        f = jax.jit(lambda x: psj.redistribute(x, [Shard(1)]))
        f.lower(x)
        cma = ps.comm_stats().get("shm_cma", 0)
        y = f(x)
        if not np.array_equal(np.asarray(y.local), g[y.layout.box(mesh.coords)]):
            failures.append("2 KiB rows: wrong values")
        cma = ps.comm_stats().get("shm_cma", 0) - cma
        mesh.free()
    if p > 1 and comm.allreduce(int(able)) == p and cma != 1:  # every rank calls it
        failures.append(f"2 KiB rows: {cma} writes into XLA's buffer by cross-memory attach")
    agree(comm, failures)


def test_distribute_takes_jax_dtype_rules(comm):
    """Without jax_enable_x64, distribute of a float64 array gives float32 shards and a
    float32 layout (what jnp.asarray holds), so a redistribute takes them; before, the layout
    said float64 and the redistribute raised."""
    mesh = ps.Mesh(comm, (comm.size,))
    g = global_array((3 * comm.size + 1, 4), "float64", 1)
    with jax.enable_x64(False):
        x = psj.distribute(g, mesh, [Shard(0)])
        assert x.local.dtype == np.float32 and x.layout.dtype == np.float32
        y = jax.jit(lambda x: psj.redistribute(x, [Shard(1)]))(x)
        np.testing.assert_array_equal(np.asarray(y.local),
                                      g.astype(np.float32)[y.layout.box(mesh.coords)])
    x = psj.distribute(g, mesh, [Shard(0)])  # (x64 on, as in this module: float64 stays)
    assert x.local.dtype == np.float64 and x.layout.dtype == np.float64
    mesh.free()


def test_eager_and_jit_agree_and_the_program_holds_no_pointer(comm):
    """Outside jit the same call runs eagerly; the lowered program names the step by a small
    id (no pointer, no communicator handle): lowering twice gives the same text."""
    mesh = ps.Mesh(comm, (comm.size,))
    g = global_array((2 * comm.size + 1, 3), "float64", 1)
    x = psj.distribute(g, mesh, [Shard(0)])
    eager = psj.redistribute(x, [Shard(1)])
    f = jax.jit(lambda x: psj.redistribute(x, [Shard(1)]))
    compiled = f(x)
    failures = []
    if not np.array_equal(np.asarray(eager.local), np.asarray(compiled.local)):
        failures.append("eager != jit")
    text = f.lower(x).as_text()
    if comm.size > 1 and "pyshard_step" not in text:
        failures.append("no pyshard_step custom call in the lowered program")
    if f.lower(x).as_text() != text:
        failures.append("lowering twice gave two programs")
    mesh.free()
    agree(comm, failures)


# ----------------------------------------------------------------------------- gradients


@pytest.mark.parametrize("dtype", ["float64"])
def test_gradient_equals_the_serial_gradient(comm, dtype):
    """jax.grad of a loss through two redistributes (an elementwise step between) equals the
    serial JAX program's gradient, sliced to this rank's source block; Partial sum sources
    get the gradient of the sum on every addend."""
    failures = []
    for ms in meshes(comm.size):
        mesh = ps.Mesh(comm, ms)
        rng = random.Random(31 + len(ms))
        for k in range(3):
            shape = [(7, 5), (5, 2, 3), (9, 1)][k % 3]
            pl0, sz0 = random_layout(rng, shape, ms, partial=True)
            hops = [random_layout(rng, shape, ms) for _ in range(2)]
            pdims = [m for m, p in enumerate(pl0) if isinstance(p, Partial)]
            nq = prod(ms[m] for m in pdims) if pdims else 1
            parts = np.stack([global_array(shape, dtype, 3 * k + j) for j in range(nq)])
            w = global_array(shape, dtype, 100 + k)
            x, q = sharded(parts, mesh, pl0, sz0)

            def loss(local, x=x, hops=hops, mesh=mesh, w=w):
                cur = psj.Sharded(local, x.layout, x.mesh)
                cur = psj.redistribute(cur, *hops[0])
                cur = psj.Sharded(cur.local * 2 - 1, cur.layout, cur.mesh)
                cur = psj.redistribute(cur, *hops[1])
                box = cur.layout.box(mesh.coords)
                return jnp.sum(jnp.asarray(w[box]) * cur.local * cur.local)

            got = np.asarray(jax.jit(jax.grad(loss))(x.local))

            def serial(X, w=w):
                Y = X.sum(0) * 2 - 1
                return jnp.sum(jnp.asarray(w) * Y * Y)

            ref = np.asarray(jax.grad(serial)(jnp.asarray(parts)))[q][x.layout.box(mesh.coords)]
            tol = 0 if dtype == "float64" else 1e-5
            if not np.allclose(got, ref, rtol=tol, atol=tol):
                failures.append(f"{ms} {shape} {pl0} {sz0} {hops}")
        mesh.free()
    agree(comm, failures)


def test_gradient_through_a_partial_avg_result(comm):
    """A hop to Partial("avg") inside a differentiated chain (Shard -> P(avg) -> Replicate,
    and from a P(avg) source through another P(avg)): the gradient arriving at a P(avg)
    result is its addends' (the value's over n), so its backward multiplies by n; the
    source's gradient equals the serial one (it was once 1/n of it)."""
    failures = []
    for ms in meshes(comm.size):
        mesh = ps.Mesh(comm, ms)
        shape = (7, 5)
        avg = [Partial("avg")] * len(ms)
        n = prod(ms)
        for src_avg in (False, True):
            pl0 = avg if src_avg else [Shard(0)] + [R] * (len(ms) - 1)
            nq = n if src_avg else 1
            parts = np.stack([global_array(shape, "float64", 11 + j) for j in range(nq)])
            w = global_array(shape, "float64", 99)
            x, q = sharded(parts, mesh, pl0, None)

            def loss(local, x=x, mesh=mesh, w=w, avg=avg, ms=ms):
                cur = psj.Sharded(local, x.layout, x.mesh)
                cur = psj.redistribute(cur, avg)
                cur = psj.redistribute(cur, [R] * len(ms))
                return jnp.sum(jnp.asarray(w) * cur.local * cur.local)

            got = np.asarray(jax.jit(jax.grad(loss))(x.local))

            def serial(X, w=w, src_avg=src_avg):
                Y = X.mean(0) if src_avg else X[0]
                return jnp.sum(jnp.asarray(w) * Y * Y)

            ref = np.asarray(jax.grad(serial)(jnp.asarray(parts)))[q][x.layout.box(mesh.coords)]
            if not np.allclose(got, ref, rtol=1e-12, atol=1e-12):
                failures.append(f"{ms} source {pl0}: {got.ravel()[:4]} vs {ref.ravel()[:4]}")
        mesh.free()
    agree(comm, failures)


@pytest.mark.parametrize("op", ["max", "min"])
def test_partial_max_min_source_redistributes_and_raises_only_in_the_backward(comm, op):
    """A Partial('max'/'min') source redistributes like the numpy path (eagerly, under jit,
    and through an FFT, which reduces it first); only a gradient through it raises
    NotImplementedError, on every rank alike (the layout is every rank's)."""
    failures = []
    mesh = ps.Mesh(comm, (comm.size,))
    shape = (3, 2 * comm.size + 1)
    parts = np.stack([global_array(shape, "float64", 11 + r) for r in range(comm.size)])
    want = getattr(parts, op)(0)
    x = psj.from_local(jnp.asarray(parts[comm.rank]), mesh, [Partial(op)], shape)
    for tag, f in [("eager", lambda x: psj.redistribute(x, [Shard(1)])),
                   ("jit", jax.jit(lambda x: psj.redistribute(x, [Shard(1)])))]:
        try:
            y = f(x)
            if not np.array_equal(np.asarray(y.local), want[y.layout.box(mesh.coords)]):
                failures.append(f"{tag}: {np.asarray(y.local)}")
        except Exception as e:  # noqa: BLE001 - every rank reports, then asserts
            failures.append(f"{tag}: {type(e).__name__}: {e}")
    try:
        y = jax.jit(lambda x: psj.fftn(x.redistribute([Shard(0)]), axes=(1,)))(x)
        ref = np.fft.fftn(want, axes=(1,))[y.layout.box(mesh.coords)]
        if not np.allclose(np.asarray(y.local), ref, rtol=1e-12, atol=1e-12):
            failures.append("fftn: values")
    except Exception as e:  # noqa: BLE001
        failures.append(f"fftn: {type(e).__name__}: {e}")

    def loss(local):
        y = psj.redistribute(psj.Sharded(local, x.layout, mesh), [Replicate()])
        return jnp.sum(y.local)

    try:
        jax.grad(loss)(x.local)
        failures.append("grad: no error")
    except NotImplementedError as e:
        if f"Partial({op!r})" not in str(e):
            failures.append(f"grad: {e}")
    mesh.free()
    agree(comm, failures)


def f64dot(a, b):
    return float(np.vdot(np.asarray(a).astype(np.float64), np.asarray(b).astype(np.float64)))


@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
def test_redistribute_adjoint_dot_product(comm, dtype):
    """<R x, y> = <x, R^T y> summed over the ranks, R^T from jax.vjp, for Shard layouts
    (every element held once) with uneven and empty shards; small integers, exact in every
    dtype here, the products summed in float64."""
    failures = []
    for ms in meshes(comm.size):
        mesh = ps.Mesh(comm, ms)
        rng = random.Random(5)
        for k in range(2):
            shape = [(7, 6), (3, 5, 4)][k % 2]
            pls = []
            for _ in range(2):
                dims = rng.sample(range(len(shape)), len(ms))
                pl = [Shard(d) for d in dims]
                sizes = {d: cut(rng, shape[d], ms[m]) for m, d in enumerate(dims)}
                pls.append((pl, sizes))
            gx = global_array(shape, dtype, k)
            gy = global_array(shape, dtype, 50 + k)
            x, _ = sharded(gx[None], mesh, *pls[0])
            y_lay = layout_of(shape, dtype, mesh, *pls[1])
            y = jnp.asarray(gy[y_lay.box(mesh.coords)])

            def f(local, x=x, pl=pls[1]):
                return psj.redistribute(psj.Sharded(local, x.layout, x.mesh), *pl).local

            rx, vjp = jax.vjp(f, x.local)
            (rty,) = vjp(y)
            lhs = comm.allreduce(f64dot(rx, y))
            rhs = comm.allreduce(f64dot(x.local, rty))
            if lhs != rhs or lhs != f64dot(gx, gy):
                failures.append(f"{ms} {pls}: {lhs} vs {rhs}")
        mesh.free()
    agree(comm, failures)


# ----------------------------------------------------------------------------- halos


def padded_reference(g, lo, hi, width, periodic, corners):
    """This rank's padded block of ``g`` (block [lo, hi)) as an update leaves it: ghosts
    from their owners (wrapped on periodic dims), zeros outside a non-periodic boundary and,
    without corners, where more than one dim is outside the block."""
    idx, ok, outside = [], [], []
    for d, (a, b) in enumerate(zip(lo, hi)):
        i = np.arange(a - width[d], b + width[d])
        inside = (i >= 0) & (i < g.shape[d])
        if periodic[d]:
            i, inside = i % g.shape[d], np.ones_like(inside)
        idx.append(np.clip(i, 0, max(g.shape[d] - 1, 0)))
        ok.append(inside)
        outside.append((i < a) | (i >= b) if not periodic[d] else
                       (np.arange(a - width[d], b + width[d]) < a) |
                       (np.arange(a - width[d], b + width[d]) >= b))
    mask = np.ones([len(i) for i in idx], bool)
    n_out = np.zeros(mask.shape, int)
    for d in range(g.ndim):
        sh = [1] * g.ndim
        sh[d] = -1
        mask &= ok[d].reshape(sh)
        n_out = n_out + outside[d].reshape(sh)
    if not corners:
        mask &= n_out <= 1
    out = np.zeros(mask.shape, g.dtype)
    if mask.size:
        vals = g[np.ix_(*idx)] if g.size else out
        out[mask] = vals[mask]
    return out


def halo_cases(rng, ms, n):
    out = []
    for k in range(n):
        shape = [(9, 7), (6, 5, 4), (5, 8)][k % 3]
        dims = rng.sample(range(len(shape)), len(ms))
        pl = [Shard(d) for d in dims]
        sizes = {d: cut(rng, shape[d], ms[m]) for m, d in enumerate(dims)} if k % 2 else None
        width = tuple(rng.randint(0, 2) for _ in shape)
        periodic = tuple(rng.random() < 0.5 for _ in shape)
        out.append((shape, pl, sizes, width, periodic, k % 3 != 2))
    return out


@pytest.mark.parametrize("dtype", ["float64", "bfloat16"])
def test_halo_pad_values_and_fold_adjoint(comm, dtype):
    """halo_pad under jit is the padded numpy block; fold is its adjoint:
    <halo_pad(x), P> = <x, fold(P)> summed over ranks, and fold's result equals the numpy sum
    of every rank's padded cells into their owners (update-written cells only)."""
    failures = []
    for ms in meshes(comm.size):
        mesh = ps.Mesh(comm, ms)
        rng = random.Random(13 + len(ms))
        for shape, pl, sizes, width, periodic, corners in halo_cases(
                rng, ms, 4 if dtype == "float64" else 2):
            if any(w > 0 and p and s > shape[d] for d, (w, p, s) in
                   enumerate(zip(width, periodic, shape))):
                continue
            case = f"{ms} {shape} {pl} {sizes} w{width} p{periodic} c{corners}"
            g = global_array(shape, dtype, 3)
            x, _ = sharded(g[None], mesh, pl, sizes)
            box = x.layout.box(mesh.coords)
            lo, hi = [b.start for b in box], [b.stop for b in box]
            pad = jax.jit(lambda x, a=(width, periodic, corners): psj.halo_pad(x, *a))(x)
            want = padded_reference(g, lo, hi, width, periodic, corners)
            if not np.array_equal(np.asarray(pad).astype(np.float64), want.astype(np.float64)):
                failures.append(f"values {case}")
                continue
            # fold: each rank's padded P from a seed of its rank; the reference adds every
            # rank's P into a global accumulator through the same index map
            P = global_array(pad.shape, dtype, 77 + mesh.rank)
            folded = jax.jit(lambda P, x, a=(width, periodic, corners): psj.fold(P, x, *a))(
                jnp.asarray(P), x)
            acc = np.zeros(shape, np.float64)
            for r in range(comm.size):
                c = np.unravel_index(r, ms)
                rb = x.layout.box(tuple(int(v) for v in c))
                rlo, rhi = [b.start for b in rb], [b.stop for b in rb]
                Pr = global_array(tuple(b - a + 2 * w for a, b, w in zip(rlo, rhi, width)),
                                  dtype, 77 + r).astype(np.float64)
                ones = np.ones(shape, np.float64)
                written = padded_reference(ones, rlo, rhi, width, periodic, corners) > 0
                interior = tuple(slice(w, w + b - a) for a, b, w in zip(rlo, rhi, width))
                written[interior] = True
                idx = np.nonzero(written)
                gi = tuple((ix + a - w) % n for ix, a, w, n in zip(idx, rlo, width, shape))
                np.add.at(acc, gi, Pr[idx])
            if not np.array_equal(np.asarray(folded.local).astype(np.float64), acc[box]):
                failures.append(f"fold {case}")
            lhs = comm.allreduce(f64dot(pad, P))
            rhs = comm.allreduce(f64dot(x.local, folded.local))
            if lhs != rhs:
                failures.append(f"dot {case}: {lhs} vs {rhs}")
        mesh.free()
    agree(comm, failures)


def test_halo_pad_gradient_is_fold(comm):
    """jax.grad through halo_pad (a 5-point stencil) equals the serial gradient of the same
    stencil on the globally padded array."""
    failures = []
    shape = (3 * comm.size + 2, 6)
    for ms in meshes(comm.size):
        mesh = ps.Mesh(comm, ms)
        dims = [0, 1][: len(ms)]
        pl = [Shard(d) for d in dims]
        rng = random.Random(2)
        sizes = {d: cut(rng, shape[d], ms[m]) for m, d in enumerate(dims)}
        g = global_array(shape, "float64", 9)
        w = global_array(shape, "float64", 10)
        x, _ = sharded(g[None], mesh, pl, sizes)
        box = x.layout.box(mesh.coords)

        def stencil(p):
            return (p[1:-1, 1:-1] * 4 - p[:-2, 1:-1] - p[2:, 1:-1] - p[1:-1, :-2]
                    - p[1:-1, 2:])

        def loss(local, x=x, mesh=mesh, w=w, box=box):
            p = psj.halo_pad(psj.Sharded(local, x.layout, mesh), 1, periodic=(True, False))
            s = stencil(p)
            return jnp.sum(jnp.asarray(w[box]) * s * s)

        def serial(G, w=w):
            p = jnp.pad(G, ((1, 1), (0, 0)), mode="wrap")
            p = jnp.pad(p, ((0, 0), (1, 1)))
            s = stencil(p)
            return jnp.sum(jnp.asarray(w) * s * s)

        got = np.asarray(jax.jit(jax.grad(loss))(x.local))
        ref = np.asarray(jax.grad(serial)(jnp.asarray(g)))[box]
        if not np.array_equal(got, ref):
            failures.append(f"{ms} {sizes}")
        mesh.free()
    agree(comm, failures)


# ----------------------------------------------------------------------------- transforms


def test_vmap_adds_a_leading_unsharded_dim(comm):
    """vmap of redistribute and halo_pad over a batch equals the calls one by one."""
    mesh = ps.Mesh(comm, (comm.size,))
    rng = random.Random(4)
    shape = (2 * comm.size + 1, 5)
    sizes = {0: cut(rng, shape[0], comm.size)}
    gs = np.stack([global_array(shape, "float64", s) for s in range(3)])
    lay = layout_of(shape, "float64", mesh, [Shard(0)], sizes)
    locs = jnp.asarray(gs[(slice(None), *lay.box(mesh.coords))])

    def f(local):
        x = psj.Sharded(local, lay, mesh)
        return psj.redistribute(x, [Shard(1)]).local, psj.halo_pad(x, 1, periodic=True)

    got = jax.jit(jax.vmap(f))(locs)
    failures = []
    for b in range(3):
        one = f(locs[b])
        if not (np.array_equal(np.asarray(got[0][b]), np.asarray(one[0]))
                and np.array_equal(np.asarray(got[1][b]), np.asarray(one[1]))):
            failures.append(f"batch {b}")
    mesh.free()
    agree(comm, failures)


def test_two_independent_collectives_in_one_jit_keep_their_order(comm):
    """Two redistributes with no data dependence in one jit, repeated: the ordered effect
    makes every rank run them in program order (without it XLA:CPU may run them on two
    threads in either order, and ranks deadlock); and the results are right."""
    mesh = ps.Mesh(comm, (comm.size,))
    a = global_array((4 * comm.size + 3, 9), "float64", 1)
    b = global_array((5, 3 * comm.size + 1), "float32", 2)
    xa = psj.distribute(a, mesh, [Shard(0)])
    xb = psj.distribute(b, mesh, [Shard(1)])

    @jax.jit
    def f(xa, xb):
        ya = psj.redistribute(xa, [Shard(1)])
        yb = psj.redistribute(xb, [Shard(0)])
        za = psj.redistribute(ya, [R])
        return yb, za

    failures = []
    for _ in range(30):
        yb, za = f(xa, xb)
        if not (np.array_equal(np.asarray(za.local), a)
                and np.array_equal(np.asarray(yb.local), b[yb.layout.box(mesh.coords)])):
            failures.append("wrong result")
            break
    mesh.free()
    agree(comm, failures)


def test_scan_loop(comm):
    """A time loop under lax.scan with halo_pad inside equals the serial loop."""
    mesh = ps.Mesh(comm, (comm.size,))
    shape = (2 * comm.size + 3, 4)
    rng = random.Random(8)
    sizes = {0: cut(rng, shape[0], comm.size)}
    g = global_array(shape, "float64", 5)
    x, _ = sharded(g[None], mesh, [Shard(0)], sizes)

    def step(local, _):
        p = psj.halo_pad(psj.Sharded(local, x.layout, mesh), (1, 0), periodic=True)
        return local + 0.25 * (p[:-2] + p[2:] - 2 * local), None

    got, _ = jax.jit(lambda u: jax.lax.scan(step, u, None, length=5))(x.local)
    G = jnp.asarray(g)
    for _ in range(5):
        G = G + 0.25 * (jnp.roll(G, 1, 0) + jnp.roll(G, -1, 0) - 2 * G)
    failures = [] if np.allclose(np.asarray(got), np.asarray(G)[x.layout.box(mesh.coords)],
                                 rtol=0, atol=1e-12) else ["scan"]
    mesh.free()
    agree(comm, failures)


# ----------------------------------------------------------------------------- errors


def test_errors_at_trace_time(comm):
    """A local array that is not the layout's shard, a wrong padded shape, a non-Sharded:
    clear errors while tracing, before any communication."""
    mesh = ps.Mesh(comm, (comm.size,))
    g = global_array((2 * comm.size + 1, 3), "float64", 1)
    x = psj.distribute(g, mesh, [Shard(0)])
    bad = psj.Sharded(jnp.zeros((x.local.shape[0] + 1, 3)), x.layout, mesh)
    with pytest.raises(ValueError, match="local shape"):
        jax.jit(lambda x: psj.redistribute(x, [Shard(1)]))(bad)
    with pytest.raises(ValueError, match="layout gives"):
        psj.from_local(jnp.zeros((x.local.shape[0] + 1, 3)), mesh, [Shard(0)], g.shape)
    with pytest.raises(TypeError, match="pyshard.jax.Sharded"):
        psj.redistribute(x.local, [Shard(1)])
    with pytest.raises(ValueError, match="padded"):
        psj.fold(jnp.zeros((1, 1)), x, 1)
    padded = psj.halo_pad(x, 1)  # the right shape, another dtype: not cast silently
    with pytest.raises(ValueError, match="dtype complex128"):
        psj.fold(padded.astype(jnp.complex128), x, 1)
    with pytest.raises(ValueError, match="width"):
        psj.halo_pad(x, -1)
    mesh.free()


@pytest.mark.parametrize("what", ["redistribute", "halo"])
def test_a_compiled_function_after_its_mesh_is_freed(comm, what):
    """A function compiled on a mesh and called after Mesh.free() fails on every rank with an
    error naming the freed mesh (before: MPI's "Invalid communicator" stack), and the same
    function called with arrays on a new mesh runs and is right."""
    if comm.size == 1 and what == "redistribute":
        pytest.skip("one rank: a redistribute runs no MPI step")
    g = global_array((2 * comm.size + 1, 3), "float64", 2)

    def f(x):
        if what == "halo":
            return psj.halo_pad(x, 1, periodic=True)
        return psj.redistribute(x, [Shard(1)])

    step = jax.jit(f)
    mesh = ps.Mesh(comm, (comm.size,))
    x = psj.distribute(g, mesh, [Shard(0)])
    step(x)
    mesh.free()
    with pytest.raises(Exception, match=r"the mesh of an? .* was freed \(Mesh.free\(\)\)"):
        jax.block_until_ready(step(x))
    mesh = ps.Mesh(comm, (comm.size,))
    x = psj.distribute(g, mesh, [Shard(0)])
    y = step(x)
    if what == "halo":
        rows = x.layout.box(mesh.coords)[0]
        want = np.pad(g, 1, mode="wrap")[rows.start : rows.stop + 2]
        np.testing.assert_array_equal(np.asarray(y), want)
    else:
        np.testing.assert_array_equal(np.asarray(y.local), g[y.layout.box(mesh.coords)])
    mesh.free()


# ----------------------------------------------------------------------------- FFTs


@pytest.mark.parametrize("kind", ["fftn", "ifftn", "rfftn", "irfftn"])
def test_fft_matches_numpy(comm, kind):
    """pyshard.jax's FFTs under jit equal numpy.fft on every rank's block, from random uneven
    layouts on 1-D and 2-D meshes, to the input's layout and to "any"."""
    failures = []
    for ms in meshes(comm.size):
        mesh = ps.Mesh(comm, ms)
        rng = random.Random(17 + len(ms))
        for k in range(2):
            shape = [(6, 5, 4), (7, 6)][k]
            g = np.random.default_rng(k).standard_normal(shape)
            s = axes = None
            if kind == "irfftn":
                g = np.fft.rfftn(g)
                s, axes = shape, tuple(range(len(shape)))
            elif kind in ("fftn", "ifftn"):
                g = g + 1j * np.random.default_rng(k + 9).standard_normal(shape)
            pl, sizes = random_layout(rng, g.shape, ms)
            x, _ = sharded(g[None], mesh, pl, sizes)
            for out in (None, "any"):
                y = jax.jit(lambda x, out=out, s=s, axes=axes: getattr(psj, kind)(
                    x, s=s, axes=axes, placements=out))(x)
                ref = getattr(np.fft, kind)(g, s=s, axes=axes)
                got = np.asarray(y.local)
                if got.shape != tuple(y.layout.local_shape(mesh.coords)) or not np.allclose(
                        got, ref[y.layout.box(mesh.coords)], rtol=1e-12, atol=1e-12):
                    failures.append(f"{ms} {shape} {pl} {sizes} -> {out}")
                if out is None and y.layout.placements != x.layout.placements:
                    failures.append(f"{ms} {pl} {sizes}: placements=None ended {y.placements}")
        mesh.free()
    agree(comm, failures)


def fft_case(kind, shape, seed):
    """The input of ``kind`` whose output has the real ``shape``, and its s and axes."""
    rng = np.random.default_rng(seed)
    g = rng.standard_normal(shape)
    if kind == "irfftn":
        return np.fft.rfftn(g), shape, tuple(range(len(shape)))
    if kind in ("fftn", "ifftn"):
        g = g + 1j * rng.standard_normal(shape)
    return g, None, None


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("kind", ["fftn", "ifftn", "rfftn", "irfftn"])
def test_fft_gradient_with_empty_shards(comm, kind):
    """jax.grad through an FFT whose input or intermediate layouts leave a rank no data: every
    rank's gradient program runs the same collectives (an empty rank's local passes still
    depend on its input, so JAX keeps the backward of the redistributes before them), and
    the gradient, eager and under jit, equals serial jax.grad of jnp.fft on the whole array."""
    n = comm.size
    failures = []
    mesh = ps.Mesh(comm, (n,))
    cases = [((4, 6), [Shard(0)], {0: [0] * (n - 1) + [4]}, None),  # all but the last empty
             ((n - 1, 6), [Shard(0)], None, "any"),  # the last rank empty, balanced
             ((5, 4, 2), [Shard(1)], {1: [4] + [0] * (n - 1)}, None)]
    for shape, pl, sizes, out in cases:
        g, s, axes = fft_case(kind, shape, len(shape))
        x, _ = sharded(g[None], mesh, pl, sizes)
        ref_out = getattr(np.fft, kind)(g, s=s, axes=axes)
        w = 1.0 + np.arange(ref_out.size).reshape(ref_out.shape) % 3

        def loss(local, x=x, s=s, axes=axes, out=out, w=w):
            y = getattr(psj, kind)(psj.Sharded(local, x.layout, mesh), s=s, axes=axes,
                                   placements=out)
            wy = jnp.asarray(w[y.layout.box(mesh.coords)])
            return jnp.sum(wy * jnp.abs(y.local) ** 2)

        steps = str(jax.make_jaxpr(jax.grad(loss))(x.local)).count("pyshard_step")
        if len(set(comm.allgather(steps))) != 1:  # running it would hang
            failures.append(f"{shape} {pl} {sizes}: pyshard_step calls {steps}")
            continue

        def serial(A, s=s, axes=axes, w=w):
            return jnp.sum(jnp.asarray(w) * jnp.abs(getattr(jnp.fft, kind)(A, s=s, axes=axes)) ** 2)

        ref = np.asarray(jax.grad(serial)(jnp.asarray(g)))[x.layout.box(mesh.coords)]
        for tag, f in [("eager", jax.grad(loss)), ("jit", jax.jit(jax.grad(loss)))]:
            got = np.asarray(f(x.local))
            if got.shape != ref.shape or not np.allclose(got, ref, rtol=1e-10, atol=1e-10):
                failures.append(f"{shape} {pl} {sizes} {tag}: gradient")
    mesh.free()
    agree(comm, failures)


@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
def test_local_fft_pass_matches_jnp(comm, dtype):
    """The c2c pass through scipy.fft in place on XLA's buffer (pyshard_fft) against jnp.fft:
    every axes choice, both directions, every norm; its VJP and JVP against jnp.fft's; vmap;
    the source intact where it is used again after the pass; the custom call in the lowered
    program, and not under PYSHARD_JAX_FFT=jnp. On COMM_SELF: the same at every rank count."""
    launch.one_rank_only(comm)
    one = ps.Mesh(MPI.COMM_SELF, (1,))  # every axis local: the passes alone, no transpose

    def local_fft(a, axes, inverse, norm):
        f = psj.ifftn if inverse else psj.fftn
        return f(psj.from_local(a, one, [Replicate()], a.shape), axes=axes, norm=norm).local

    rng = np.random.default_rng(3)
    x = (rng.standard_normal((6, 5, 8)) + 1j * rng.standard_normal((6, 5, 8))).astype(dtype)
    g = (rng.standard_normal(x.shape) + 1j * rng.standard_normal(x.shape)).astype(dtype)
    tol = 1e-5 if dtype == "complex64" else 1e-12
    for axes in [(0,), (1, 2), (0, 2), (2, 0, 1)]:
        for inverse in (False, True):
            for norm in (None, "ortho", "forward"):
                f = jnp.fft.ifftn if inverse else jnp.fft.fftn

                def mine(a, axes=axes, inverse=inverse, norm=norm):
                    return local_fft(a, axes, inverse, norm)

                def ref(a, axes=axes, f=f, norm=norm):
                    return f(a, axes=axes, norm=norm)

                what = f"{dtype} {axes} inverse={inverse} {norm}"
                np.testing.assert_allclose(jax.jit(mine)(x), ref(x), rtol=tol, atol=10 * tol,
                                           err_msg=what)
                np.testing.assert_allclose(mine(jnp.asarray(x)), ref(x), rtol=tol,
                                           atol=10 * tol, err_msg=what)
                v1 = jax.vjp(mine, jnp.asarray(x))[1](jnp.asarray(g))[0]
                v2 = jax.vjp(ref, jnp.asarray(x))[1](jnp.asarray(g))[0]
                np.testing.assert_allclose(v1, v2, rtol=tol, atol=10 * tol, err_msg=what)
                t1 = jax.jvp(mine, (jnp.asarray(x),), (jnp.asarray(g),))[1]
                np.testing.assert_allclose(t1, ref(g), rtol=tol, atol=10 * tol, err_msg=what)
                xb = np.stack([x, g])
                np.testing.assert_allclose(jax.vmap(mine)(xb)[1], ref(g), rtol=tol,
                                           atol=10 * tol, err_msg=what)
    y, same = jax.jit(lambda a: (local_fft(a, (0,), False, None), a * 1))(x)
    np.testing.assert_array_equal(same, x)
    np.testing.assert_allclose(y, jnp.fft.fft(x, axis=0), rtol=tol, atol=10 * tol)
    text = jax.jit(lambda a: local_fft(a, (0,), False, None)).lower(x).as_text()
    assert "pyshard_fft" in text
    one.free()


def test_fft_passes_take_the_custom_call_unless_told(comm, monkeypatch):
    """A c2c FFT of a Sharded array lowers its passes to pyshard_fft; PYSHARD_JAX_FFT=jnp
    lowers them to XLA's own fft; both give numpy's result."""
    mesh = ps.Mesh(comm, (comm.size,))
    # every rank's shard non-empty on both sharded axes (an empty one has no pass to lower)
    shape = (max(6, comm.size), max(5, comm.size), 4)
    g = np.random.default_rng(5).standard_normal(shape) * (1 + 1j)
    x = psj.distribute(g, mesh, [Shard(0)])
    for choice, custom in (("auto", True), ("jnp", False)):
        monkeypatch.setenv("PYSHARD_JAX_FFT", choice)
        f = jax.jit(lambda x: psj.fftn(x, placements="any"))
        text = f.lower(x).as_text()
        assert ("pyshard_fft" in text) == custom, choice
        y = f(x)
        np.testing.assert_allclose(np.asarray(y.local), np.fft.fftn(g)[y.layout.box(mesh.coords)],
                                   rtol=1e-12, atol=1e-12)
    mesh.free()


def test_cuda_lowering_or_a_clear_error(comm):
    """Lowered for CUDA (no GPU needed: JAX lowers for a named platform). By default a
    collective step and a halo raise NotImplementedError (the CUDA registration is
    experimental) naming PYSHARD_JAX_CUDA; with it on, a core built with CUDA lowers them,
    and a halo fold (halo_pad's gradient), to the pyshard_step custom call, and a core built
    without CUDA raises NotImplementedError for each, saying what to do.
    An FFT's local pass lowers to XLA's own fft there, not to pyshard_fft."""
    mesh = ps.Mesh(comm, (comm.size,))
    x = psj.distribute(np.zeros((2 * comm.size, 4), np.float32), mesh, [Shard(0)])
    calls = [lambda x: psj.redistribute(x, [Shard(1)]),
             lambda x: psj.halo_pad(x, 1, periodic=True)]
    cuda = ps.build_info()["cuda"] is not None
    for f in calls if comm.size > 1 else calls[1:]:  # (one rank: the redistribute moves none)
        with pytest.raises(NotImplementedError, match="experimental and off.*"
                           "PYSHARD_JAX_CUDA=1.*lowered for cuda.*JAX_PLATFORMS=cpu"):
            jax.jit(f).trace(x).lower(lowering_platforms=("cuda",))
        with ps.config.override(PYSHARD_JAX_CUDA=True):
            if cuda:
                text = jax.jit(f).trace(x).lower(lowering_platforms=("cuda",)).as_text()
                assert "pyshard_step" in text
            else:
                with pytest.raises(NotImplementedError, match="needs pyshard's core built "
                                   "with CUDA.*lowered for cuda.*JAX_PLATFORMS=cpu"):
                    jax.jit(f).trace(x).lower(lowering_platforms=("cuda",))

    def loss(x):
        return (psj.halo_pad(x, 1, periodic=True) ** 2).sum()

    with ps.config.override(PYSHARD_JAX_CUDA=True):
        if cuda:  # the update forward, the fold backward: two calls
            text = jax.jit(jax.grad(loss)).trace(x).lower(lowering_platforms=("cuda",)).as_text()
            assert text.count("pyshard_step") >= 2
        else:
            with pytest.raises(NotImplementedError, match="built with CUDA"):
                jax.jit(jax.grad(loss)).trace(x).lower(lowering_platforms=("cuda",))
    one = ps.Mesh(MPI.COMM_SELF, (1,))
    y = psj.distribute(np.zeros((4, 4), np.complex64), one, [Replicate()])
    text = jax.jit(lambda y: psj.fftn(y)).trace(y).lower(lowering_platforms=("cuda",)).as_text()
    assert "pyshard_fft" not in text and "fft" in text
    one.free()
    mesh.free()


def test_spectral_example_gradient_matches_the_serial_run(comm):
    """examples/jax_spectral.py at a small size: rfftn -> decay -> irfftn steps on an uneven
    2-D mesh, and jax.grad through them, equal the one-process jnp.fft run."""
    ex = load_example("jax_spectral")
    r = ex.run(comm, n=8, steps=2)
    assert r["max_diff_state"] < 1e-10 and r["max_diff_grad"] < 1e-10, r


# ----------------------------------------------------------------------------- example


@pytest.mark.parametrize("mesh_ndim", [1, 2])
def test_heat_example_matches_the_serial_run(comm, mesh_ndim):
    """examples/jax_heat.py at a small size: the state after a lax.scan time loop and the
    gradient of its energy with respect to the initial state equal the one-process run's."""
    ex = load_example("jax_heat")
    r = ex.run(comm, n=2 * comm.size + 6, steps=4, mesh_ndim=mesh_ndim)
    assert r["max_diff_state"] < 1e-12 and r["max_diff_grad"] < 1e-12, r


@pytest.mark.mpi(min_size=2)
def test_a_rank_that_fails_to_trace_makes_every_rank_raise_under_validation(comm):
    """Rank 0 alone passes a local array that is not its shard. Without validation only rank 0
    would raise (and the others wait in the first collective); with PYSHARD_VALIDATE on, the
    trace-time check agrees across the ranks first: every rank raises the same ValueError,
    before any exchange."""
    mesh = ps.Mesh(comm, (comm.size,))
    g = global_array((2 * comm.size + 1, 3), "float64", 1)
    x = psj.distribute(g, mesh, [Shard(0)])
    local = x.local if comm.rank else jnp.zeros((x.local.shape[0] + 1, 3))
    ps.set_validation(True)
    try:
        with pytest.raises(ValueError) as e:
            jax.jit(lambda x: psj.redistribute(x, [Shard(1)]))(psj.Sharded(local, x.layout, mesh))
    finally:
        ps.config.reset("PYSHARD_VALIDATE")
    msgs = comm.allgather(str(e.value))
    assert len(set(msgs)) == 1 and "redistribute" in msgs[0], msgs
    mesh.free()


def test_validation_agrees_a_layout_of_another_mesh_shape(comm):
    """Under PYSHARD_VALIDATE, one rank's Sharded whose layout has another mesh shape than
    its mesh ((1, P) on a (P,) mesh): every rank raises the same ValueError (that rank
    raised before the agreement, the others waited PYSHARD_PEER_TIMEOUT and the mesh was
    unusable after)."""
    if comm.size < 2:
        pytest.skip("one rank: nothing to differ")
    mesh = ps.Mesh(comm, (comm.size,))
    g = global_array((comm.size + 1, 4), "float64", 1)
    x = psj.distribute(g, mesh, [Shard(0)])
    lay = x.layout if comm.rank != comm.size - 1 else ps.Layout(
        x.layout.shape, x.layout.dtype, (1, comm.size), [Replicate(), Shard(0)])
    ps.set_validation(True)
    try:
        with pytest.raises(ValueError) as e:
            psj.redistribute(psj.Sharded(x.local, lay, mesh), [Replicate()])
        msgs = comm.allgather(str(e.value))
        assert len(set(msgs)) == 1 and "is not the mesh's" in msgs[0], msgs
        y = psj.redistribute(x, [Replicate()])  # the mesh is still in step
    finally:
        ps.config.reset("PYSHARD_VALIDATE")
    np.testing.assert_array_equal(np.asarray(y.local), g)
    mesh.free()


def test_validation_compares_the_call_arguments(comm):
    """Under PYSHARD_VALIDATE, arguments that differ on one rank (the target sizes, a halo's
    periodic, the algorithm, an FFT's axes) raise the same ValueError on every rank, naming
    the argument, before any exchange (the source layout alone was compared: they hung);
    the same target spelt two ways (sizes given as the balanced split, or left out) agrees."""
    if comm.size < 2:
        pytest.skip("one rank: nothing to differ")
    mesh = ps.Mesh(comm, (comm.size,))
    p = comm.size
    g = global_array((2 * p + 1, 2 * p), "float64", 1)
    x = psj.distribute(g, mesh, [Shard(0)])
    odd = comm.rank == 0
    cases = [
        ("target", lambda x: psj.redistribute(x, [Shard(1)], {1: [2 * p] + [0] * (p - 1)}
                                                if odd else None)),
        ("halo", lambda x: psj.halo_pad(x, 1, periodic=odd)),
        ("algorithm", lambda x: psj.redistribute(x, [Shard(1)],
                                                   algorithm="p2p" if odd else "auto")),
        ("transform", lambda x: psj.fftn(x, axes=(0,) if odd else (1,))),
    ]
    ps.set_validation(True)
    try:
        for name, f in cases:
            with pytest.raises(ValueError, match=name) as e:
                jax.jit(f)(x)
            msgs = comm.allgather(str(e.value))
            assert len(set(msgs)) == 1, msgs
        # equal targets spelt differently: no error, the right shards
        even = {1: list(x.layout.replace([Shard(1)]).table[1][1])}  # the balanced split
        y = jax.jit(lambda x: psj.redistribute(x, [Shard(1)], even if odd else None))(x)
        np.testing.assert_array_equal(np.asarray(y.local), g[y.layout.box(mesh.coords)])
    finally:
        ps.config.reset("PYSHARD_VALIDATE")
    mesh.free()


def test_from_local_of_a_numpy_float64_without_x64(comm):
    """Without jax_enable_x64 a numpy float64 local is what JAX holds, float32, and so is
    the layout (it said float64: eager calls lost precision silently, jit raised)."""
    mesh = ps.Mesh(comm, (comm.size,))
    g = global_array((2 * comm.size + 1, 3), "float64", 2)
    lay = ps.Layout(g.shape, "float64", (comm.size,), [Shard(0)])
    with jax.enable_x64(False):
        x = psj.from_local(g[lay.box(mesh.coords)], mesh, [Shard(0)], g.shape)
        assert x.layout.dtype == np.float32 and x.local.dtype == np.float32
        y = jax.jit(lambda x: psj.redistribute(x, [Shard(1)]))(x)
        np.testing.assert_array_equal(np.asarray(y.local),
                                      g.astype(np.float32)[y.layout.box(mesh.coords)])
        # the same numpy local wrapped by the constructor with a float64 layout: refused
        # before any communication, naming x64 (eager calls failed inside the custom call,
        # "a halo update got 168 -> 168 bytes, planned 336 -> 336", or ran in float32)
        s = psj.Sharded(g[lay.box(mesh.coords)], lay, mesh)
        for call in (lambda: psj.redistribute(s, [Shard(1)]), lambda: psj.halo_pad(s, 1),
                     lambda: psj.fftn(s)):
            with pytest.raises(ValueError, match="jax_enable_x64 is off"):
                call()
    mesh.free()


@pytest.mark.parametrize("dtype", ["int32", "bool"])
def test_fft_of_integers_without_x64(comm, dtype):
    """fftn/rfftn of an integer or bool array with JAX's default settings (no x64): JAX
    computes in float32, so the plan must too (it planned numpy's float64 buffers, and every
    exchange refused the half-size ones: "an exchange got 120 -> 144 bytes"); the result is
    jnp.fft's dtype and numpy's values, on uneven and empty shards."""
    n = comm.size
    mesh = ps.Mesh(comm, (n,))
    failures = []
    g = (global_array((2 * n + 1, 6), "int32", 4) % 2).astype(dtype)
    with jax.enable_x64(False):
        for sizes in (None, {0: [2 * n + 1] + [0] * (n - 1)}):
            lay = ps.Layout(g.shape, dtype, (n,), [Shard(0)], sizes)
            x = psj.from_local(jnp.asarray(g[lay.box(mesh.coords)]), mesh, [Shard(0)],
                               g.shape, sizes)
            for kind in ("fftn", "rfftn"):
                y = jax.jit(lambda x, kind=kind: getattr(psj, kind)(x, placements="any"))(x)
                want_dt = getattr(jnp.fft, kind)(jnp.asarray(g)).dtype
                ref = getattr(np.fft, kind)(g.astype(np.float64))[y.layout.box(mesh.coords)]
                got = np.asarray(y.local)
                if y.local.dtype != want_dt or y.layout.dtype != want_dt:
                    failures.append(f"{kind} {sizes}: dtype {y.local.dtype}/{y.layout.dtype},"
                                    f" jnp.fft {want_dt}")
                elif got.shape != ref.shape or not np.allclose(got, ref, atol=1e-4):
                    failures.append(f"{kind} {sizes}: values")
    mesh.free()
    agree(comm, failures)


def test_remat_over_complex_exchanges(comm):
    """jax.checkpoint (remat) over a distributed FFT: its transposes move complex arrays, and
    their results, saved as residuals, met JAX's reduce_precision pass, which refuses
    complex dtypes (every rank raised TypeError). The gradient equals serial jax.grad."""
    n = comm.size
    mesh = ps.Mesh(comm, (n,))
    g = global_array((2 * n + 1, 5), "float64", 6)
    x = psj.distribute(g, mesh, [Shard(0)])
    w = 1.0 + np.arange(g.size).reshape(g.shape) % 3

    def loss(local):
        y = psj.fftn(psj.Sharded(local, x.layout, mesh), placements="any")
        return jnp.sum(jnp.asarray(w[y.layout.box(mesh.coords)]) * jnp.abs(y.local) ** 2)

    ref = np.asarray(jax.grad(lambda A: jnp.sum(jnp.asarray(w) * jnp.abs(jnp.fft.fftn(A)) ** 2))(
        jnp.asarray(g)))[x.layout.box(mesh.coords)]
    failures = []
    for policy in (None, jax.checkpoint_policies.nothing_saveable):
        f = jax.jit(jax.grad(jax.checkpoint(loss, policy=policy)))
        got = np.asarray(f(x.local))
        if got.shape != ref.shape or not np.allclose(got, ref, rtol=1e-10, atol=1e-10):
            failures.append(f"policy {policy}: gradient")
    mesh.free()
    agree(comm, failures)


@pytest.mark.parametrize("untested", [False, True])
def test_jax_outside_the_tested_versions(comm, untested):
    """A jax outside the tested range: ImportError naming the versions and the override; with
    PYSHARD_JAX_UNTESTED=1 a warning and the import goes on (a fresh interpreter, where
    jax.__version__ is set before pyshard.jax reads it)."""
    import subprocess
    import sys

    launch.one_rank_only(comm)
    code = ("import logging, jax; logging.basicConfig(); jax.__version__ = '0.99.0'\n"
            "import pyshard.jax\nprint('imported')")  # fmt: skip
    env = launch.child_env()  # a singleton MPI, not a rank of this job
    env.pop("PYSHARD_JAX_UNTESTED", None)
    if untested:
        env["PYSHARD_JAX_UNTESTED"] = "1"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=120)  # fmt: skip
    if untested:
        assert r.returncode == 0 and "imported" in r.stdout, r.stderr
        assert "jax 0.99.0 is outside the tested 0.10.x" in r.stderr
    else:
        assert r.returncode != 0 and "imported" not in r.stdout
        assert "this is jax 0.99.0" in r.stderr and "PYSHARD_JAX_UNTESTED=1" in r.stderr


def test_halo_pad_of_a_0d_array(comm):
    """A 0-d array has no ghosts: halo_pad(x, ()) gives its value, as with_halo(()) does
    (jnp.pad raised on the empty pad list), eagerly and under jit."""
    mesh = ps.Mesh(comm, (comm.size,))
    x = psj.distribute(np.float32(2.5), mesh, [Replicate()])
    for f in (lambda x: psj.halo_pad(x, ()), jax.jit(lambda x: psj.halo_pad(x, ()))):
        assert float(f(x)) == 2.5
    mesh.free()
