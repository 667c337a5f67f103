"""pyshard.fft against numpy.fft / scipy.fft applied to the global array.

Every rank builds the same deterministic global array (oracle.make_global) and the same
seeded random cases: layouts (Shard on any dims, nested, Replicate, uneven and empty shards),
axes, s, norms, DCT/DST types, dtypes and result placements; each rank compares its result
shard with the oracle at its box. Meshes: tests/mpi/test_redistribute_nd.MESHES.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
from oracle import contributions, make_global
from test_redistribute_nd import MESHES

import pyshard as ps
from pyshard import Partial, Replicate, Shard
from pyshard import fft as pf
from pyshard.fft import engine, planner

sf = pytest.importorskip("scipy.fft")  # pyshard[fft]

pytestmark = [pytest.mark.mpi, pytest.mark.numerics, pytest.mark.mesh3d]  # mesh3d: 2x2x2 at 8 ranks

NOT_COLLECTIVES = {"staged", "device_direct"}
PRIMES = (1, 2, 3, 5, 7, 13)
KINDS = ("fftn", "ifftn", "rfftn", "irfftn", "dctn", "idctn", "dstn", "idstn")
NORMS = (None, "backward", "ortho", "forward")


def collectives_since(before):
    now = ps.comm_stats()
    return sum(v - before.get(k, 0) for k, v in now.items() if k not in NOT_COLLECTIVES)


def meshes(comm):
    out = list(MESHES.get(comm.size, []))
    out.append((comm.size,))
    return out


def oracle(kind, g, s, axes, norm, type_):
    if kind in ("dctn", "idctn", "dstn", "idstn"):
        return getattr(sf, kind)(g, type=type_, s=s, axes=axes, norm=norm)
    return getattr(np.fft, kind)(g, s=s, axes=axes, norm=norm)


def tol(dtype):
    return 1e-5 if np.dtype(dtype) in (np.float32, np.complex64) else 1e-12


def expect_dtype(kind, dtype):
    dt = np.dtype(dtype)
    single = dt in (np.float32, np.complex64)
    if kind in ("fftn", "ifftn", "rfftn"):
        return np.dtype(np.complex64 if single else np.complex128)
    if kind == "irfftn":
        return np.dtype(np.float32 if single else np.float64)
    return dt


def check(y, ref, dtype, where, comm):
    got = y.local
    want = ref[y.box]
    assert got.shape == want.shape, where
    scale = max(float(np.max(np.abs(ref))) if ref.size else 0.0, 1.0)
    err = float(np.max(np.abs(got - want))) if got.size else 0.0
    # every rank asserts the same outcome (no rank leaves the others waiting)
    worst = comm.allreduce(err, op=__import__("mpi4py").MPI.MAX)
    assert worst <= tol(dtype) * scale * 10, f"{where}: max error {worst} (scale {scale})"


def random_sizes(rng, n, parts):
    """A random split of n into parts extents (zeros allowed)."""
    cuts = np.sort(rng.integers(0, n + 1, size=parts - 1))
    return [int(v) for v in np.diff(np.concatenate(([0], cuts, [n])))]


def random_layout(rng, mesh_shape, shape):
    nd = len(shape)
    pl = []
    for _ in mesh_shape:
        pl.append(Replicate() if rng.random() < 0.25 else Shard(int(rng.integers(nd))))
    sizes = {}
    if rng.random() < 0.5:
        for d in range(nd):
            mdims = [m for m, p in enumerate(pl) if p == Shard(d)]
            if mdims:
                parts = int(np.prod([mesh_shape[m] for m in mdims]))
                sizes[d] = random_sizes(rng, shape[d], parts)
    return pl, sizes or None


def random_case(rng, mesh_shape):
    nd = int(rng.integers(1, 5)) if rng.random() < 0.2 else int(rng.integers(2, 4))
    shape = tuple(int(rng.choice(PRIMES[2:] if i == 0 else PRIMES)) for i in range(nd))
    kind = str(rng.choice(KINDS))
    naxes = int(rng.integers(1, nd + 1))
    axes = [int(a) for a in rng.permutation(nd)[:naxes]]
    if kind in ("rfftn", "irfftn", "dctn", "idctn", "dstn", "idstn"):
        # DCT-I needs n >= 2; irfftn's default last length 2(m-1) needs m >= 2
        axes = [a for a in axes if shape[a] >= 2] or None
        if axes is None:
            shape = (5,) + shape[1:]
            axes = [0]
    s = None
    if rng.random() < 0.3:
        s = [int(rng.integers(2, 9)) for _ in axes]
    norm = NORMS[int(rng.integers(4))]
    type_ = int(rng.integers(1, 5)) if kind in ("dctn", "idctn", "dstn", "idstn") else None
    if kind == "rfftn":
        dtype = str(rng.choice(["float32", "float64"]))
    elif kind == "irfftn":
        dtype = str(rng.choice(["complex64", "complex128"]))
    else:
        dtype = str(rng.choice(["float32", "float64", "complex64", "complex128"]))
    return shape, kind, axes, s, norm, type_, dtype


@pytest.mark.parametrize("seed", range(2))
def test_random_cases(comm, seed):
    rng = np.random.default_rng(1234 + seed)
    for ms in meshes(comm):
        mesh = ps.Mesh(comm, ms)
        for case in range(14):
            shape, kind, axes, s, norm, type_, dtype = random_case(rng, ms)
            g = make_global(shape, dtype, seed=case)
            if np.dtype(dtype).kind == "c":
                g = g / 16
            pl, sizes = random_layout(rng, ms, shape)
            r = rng.random()
            ref = oracle(kind, g, s, axes, norm, type_)
            if r < 0.3:
                out_pl, out_sizes = None, None
            elif r < 0.55:
                out_pl, out_sizes = "any", None
            else:
                out_pl, out_sizes = random_layout(rng, ms, ref.shape)
            where = (f"mesh {ms} case {seed}/{case}: {kind} {shape} {dtype} {pl} {sizes} "
                     f"axes {axes} s {s} norm {norm} type {type_} -> {out_pl} {out_sizes}")
            x = ps.distribute(g, mesh, pl, sizes)
            y = getattr(pf, kind)(
                x, s=s, axes=axes, norm=norm, placements=out_pl, sizes=out_sizes,
                **({} if type_ is None else {"type": type_}),
            )
            assert y.dtype == expect_dtype(kind, dtype), where
            assert y.shape == ref.shape, where
            if out_pl is None:
                assert list(y.placements) == list(x.placements), where
                for d, ext in x.layout.sizes.items():
                    if ref.shape[d] == shape[d]:
                        assert y.layout.sizes[d] == ext, where  # extents kept
            elif out_pl != "any":
                assert list(y.placements) == list(out_pl), where
            check(y, ref, dtype, where, comm)
            np.testing.assert_array_equal(x.local, g[x.box])  # the input is left alone
        mesh.free()


def transposes_by_table(mesh_shape, kind, out):
    """The transposes of a 3-D transform of an array laid out ``[Shard(m % 3) for each mesh
    dim m]``, by docs/fft.md's table ("transposes with placements="any" / None"): one per
    mesh dim of more than one rank (a slab 1, a pencil 2, all three axes sharded 3), one more
    for irfftn on a pencil (its c2r axis, the whole one, goes last), and with
    ``placements=None`` one more, back to the input's layout; none where no mesh dim of more
    than one rank shards the array. Each is one collective."""
    k = sum(1 for n in mesh_shape if n > 1)
    if k == 0:
        return 0
    return k + (kind == "irfftn" and k == 2) + (out is None)


@pytest.mark.parametrize("kind", KINDS)
def test_round_trip_backward(comm, kind):
    """plan.backward undoes forward, from any result layout back to the input layout, with
    the forward's transposes in reverse: as many collectives as the forward ran, and as
    docs/fft.md's table gives (transposes_by_table)."""
    shape = (7, 13, 5)
    dtype = np.complex128 if kind in ("fftn", "ifftn", "irfftn") else np.float64
    g = make_global(shape, dtype, seed=3) / 8
    type_ = 3 if kind in ("dctn", "idctn", "dstn", "idstn") else None
    for ms in meshes(comm):
        mesh = ps.Mesh(comm, ms)
        pl = [Shard(m % 3) for m in range(len(ms))]
        x = ps.distribute(g, mesh, pl)
        for out in (None, "any"):
            s = (7, 13, 8) if kind == "irfftn" else None
            p = pf.plan(x.layout, kind, axes=(0, 1, 2), s=s, norm="ortho", placements=out,
                        type=type_)
            before = ps.comm_stats()
            y = p.forward(x)
            forward = collectives_since(before)
            want = transposes_by_table(ms, kind, out)
            before = ps.comm_stats()
            z = p.backward(y)
            backward = collectives_since(before)
            assert forward == want and backward == want, (forward, backward, want, ms, out)
            assert z.layout.placements == x.layout.placements
            assert z.layout.sizes == x.layout.sizes and z.shape == x.shape
            want = g
            if kind == "irfftn":  # the bins rfftn keeps, of a Hermitian spectrum
                back = np.fft.irfftn(g, s=s, axes=(0, 1, 2), norm="ortho")
                want = np.fft.rfftn(back, norm="ortho")
            check(z, want, dtype, f"{kind} {ms} {out}", comm)
        mesh.free()


def _fit(a, shape):
    """``a`` truncated or zero-padded to ``shape`` (from index 0 on every axis)."""
    out = np.zeros(shape, a.dtype)
    sl = tuple(slice(0, min(p, q)) for p, q in zip(a.shape, shape))
    out[sl] = a[sl]
    return out


def _inverse_of(kind, y, s, axes, norm, type_):
    """scipy's inverse of ``kind`` at the forward's lengths ``s`` (what undoes a transform
    whose s= padded): ``ifftn(fftn(x, s), s)`` and so on."""
    inv = {"fftn": "ifftn", "ifftn": "fftn", "rfftn": "irfftn", "irfftn": "rfftn",
           "hfftn": "ihfftn", "ihfftn": "hfftn", "dctn": "idctn", "idctn": "dctn",
           "dstn": "idstn", "idstn": "dstn"}[kind]
    kw = {} if type_ is None else {"type": type_}
    return getattr(sf, inv)(y, s=s, axes=axes, norm=norm, **kw)


@pytest.mark.parametrize("pool", [False, True])
def test_backward_of_padded_and_truncated_s(comm, pool):
    """plan.backward of a plan whose s= zero-pads (or truncates) runs the inverse at the
    forward's lengths, then truncates (pads) to the input's: backward(forward(x)) is x again
    where s pads (numpy's ifft(fft(x, n), n)[:len(x)]), and scipy's inverse at s cut to the
    input's shape where s truncates; every kind (c2c, r2c/c2r, the Hermitian family, every
    DCT/DST type), every layout, through pyshard's result pool (numpy's out=) or not."""
    shape = (6, 5)
    cases = [("fftn", None), ("ifftn", None), ("rfftn", None), ("irfftn", None),
             ("hfftn", None), ("ihfftn", None)]
    cases += [(k, t) for k in ("dctn", "dstn") for t in (1, 2, 3, 4)]
    cases += [("idctn", 3), ("idstn", 1)]
    # (axes, s): pad one axis, pad both, truncate one and pad the other, truncate both
    sizes_ = [((1,), (8,)), ((0, 1), (9, 7)), ((0, 1), (4, 8)), ((1, 0), (3, 4))]
    with ps.config.override(PYSHARD_POOL_MIN_BYTES=0 if pool else 1 << 40):
        for ms in meshes(comm):
            mesh = ps.Mesh(comm, ms)
            # (input placements, result placements)
            pls = [([Shard(m % 2) for m in range(len(ms))], None),
                   ([Shard((m + 1) % 2) for m in range(len(ms))], "any")]
            for kind, type_ in cases:
                real = kind in ("rfftn", "ihfftn", "dctn", "dstn", "idctn", "idstn")
                dtype = np.float64 if real else np.complex128
                g = make_global(shape, dtype, seed=11) / 8
                kw = {} if type_ is None else {"type": type_}
                for pl, target in pls:
                    x = ps.distribute(g, mesh, pl)
                    for axes, s in sizes_:
                        p = pf.plan(x.layout, kind, axes=axes, s=s, norm="ortho",
                                    placements=target, **kw)
                        z = p.backward(p.forward(x))
                        assert z.layout.placements == x.layout.placements
                        assert z.shape == x.shape and z.layout.sizes == x.layout.sizes
                        y = getattr(sf, kind)(g, s=s, axes=axes, norm="ortho", **kw)
                        want = _fit(_inverse_of(kind, y, s, axes, "ortho", type_), shape)
                        where = f"{kind} type {type_} {ms} {pl} {axes} s={s} {target}"
                        check(z, want, dtype, where, comm)
                        if all(n >= shape[a] for a, n in zip(axes, s)) and kind not in (
                                "irfftn", "hfftn"):  # s pads: x again
                            check(z, g, dtype, where + " (x again)", comm)
            mesh.free()


def test_no_transpose_where_axes_are_whole(comm):
    """Batched 2-D FFTs with the batch axis sharded: no communication at all."""
    g = make_global((comm.size * 2 + 1, 6, 5), np.complex128) / 8
    mesh = ps.Mesh(comm, (comm.size,))
    x = ps.distribute(g, mesh, [Shard(0)])
    p = pf.plan(x.layout, "fftn", axes=(1, 2))
    assert p.transposes == 0 and p.collectives == 0
    before = ps.comm_stats()
    y = pf.fftn(x, axes=(1, 2))
    assert collectives_since(before) == 0
    check(y, np.fft.fftn(g, axes=(1, 2)), np.complex128, "batched", comm)
    assert "0 transpose(s)" in p.explain()
    mesh.free()


def test_pencil_and_slab_transposes(comm):
    """A 3-D FFT of a pencil takes one transpose per mesh dim of size > 1, each one exchange
    on that mesh dim's sub-communicator; with placements="any" nothing else moves."""
    g = make_global((8, 6, 10), np.complex128) / 8
    for ms in meshes(comm):
        if len(ms) > 2:
            continue
        mesh = ps.Mesh(comm, ms)
        pl = [Shard(0), Shard(1)][: len(ms)]
        x = ps.distribute(g, mesh, pl)
        p = pf.plan(x.layout, "fftn", placements="any")
        moved = sum(m > 1 for m in ms)
        assert p.transposes == moved, p.explain()
        for q in p.passes:
            if isinstance(q, planner.Move):
                assert len(q.plan.steps) == 1 and len(q.plan.steps[0].mesh_dims) == 1
        before = ps.comm_stats()
        y = p.forward(x)
        assert collectives_since(before) == moved
        check(y, np.fft.fftn(g), np.complex128, f"pencil {ms}", comm)
        text = p.explain()
        assert "local fftn" in text and "peak memory" in text
        if moved:
            assert "alltoallv" in text
        mesh.free()


def test_one_dimensional_arrays(comm):
    g = make_global((13,), np.complex128) / 8
    mesh = ps.Mesh(comm, (comm.size,))
    x = ps.distribute(g, mesh, [Shard(0)], {0: [13] + [0] * (comm.size - 1)})
    y = pf.fft(x, n=16)
    check(y, np.fft.fft(g, n=16), np.complex128, "1-D", comm)
    y = pf.irfft(ps.distribute(g, mesh, [Shard(0)]))
    check(y, np.fft.irfft(g), np.float64, "1-D irfft", comm)
    y = pf.dct(ps.distribute(g.real.copy(), mesh, [Replicate()]), type=4)
    check(y, sf.dct(g.real, type=4), np.float64, "1-D dct", comm)
    mesh.free()


def test_halo_arrays_interior_as_input(comm):
    """``HaloArray.array`` (a view of the padded array's interior, not contiguous) as the
    input of every transform whose first pass is a transpose: the transform of the interior
    (it raised "source must be C-contiguous" on the ranks with cells, and a rank with none
    went on into the exchange and waited for ever). Uneven shards with an empty one."""
    P = comm.size
    g = make_global((5, P + 3, 2 * P + 4), np.float64)
    for mshape in meshes(comm):
        mesh = ps.Mesh(comm, mshape)
        m = mshape[-1]  # the last axis sharded (the first pass a transpose), its first empty
        sizes = {2: [0] + list(ps.split_sizes(2 * P + 4, m - 1))} if m > 1 else None
        pl = [Shard(3 - len(mshape) + i) for i in range(len(mshape))]  # (1-D to 3-D meshes)
        x = ps.distribute(g, mesh, pl, sizes)
        h = x.with_halo(1, periodic=True)
        h.update()
        v = h.array  # (rank 0's local a view across the padded dims)
        check(pf.rfftn(v), np.fft.rfftn(g), np.complex128, f"rfftn {mshape}", comm)
        check(pf.fftn(v, axes=(1, 2)), np.fft.fftn(g, axes=(1, 2)), np.complex128,
              f"fftn {mshape}", comm)
        check(pf.dctn(v, type=2), sf.dctn(g, type=2), np.float64, f"dctn {mshape}", comm)
        check(pf.plan(v, "rfftn").forward(v), np.fft.rfftn(g), np.complex128,
              f"plan {mshape}", comm)
        mesh.free()


def test_thin_wrappers(comm):
    g = make_global((5, 7, 6), np.float64)
    mesh = ps.Mesh(comm, (comm.size,))
    x = ps.distribute(g, mesh, [Shard(2)])
    c = ps.distribute(g.astype(np.complex128), mesh, [Shard(1)])
    cases = [
        (pf.fft(c, axis=1), np.fft.fft(g, axis=1)),
        (pf.ifft(c, n=4, axis=0), np.fft.ifft(g, n=4, axis=0)),
        (pf.rfft(x, axis=2), np.fft.rfft(g, axis=2)),
        (pf.irfft(c, axis=1, norm="ortho"), np.fft.irfft(g, axis=1, norm="ortho")),
        (pf.fft2(c), np.fft.fft2(g)),
        (pf.ifft2(c, axes=(0, 2)), np.fft.ifft2(g, axes=(0, 2))),
        (pf.rfft2(x, s=(6, 9)), np.fft.rfft2(g, s=(6, 9))),
        (pf.irfft2(c), np.fft.irfft2(g)),
        (pf.dst(x, type=1, axis=0), sf.dst(g, type=1, axis=0)),
        (pf.idst(x, axis=2), sf.idst(g, axis=2)),
        (pf.idct(x, type=3, n=9, axis=1), sf.idct(g, type=3, n=9, axis=1)),
    ]
    for i, (y, ref) in enumerate(cases):
        check(y, ref, np.float64, f"wrapper {i}", comm)
    mesh.free()


def test_integer_and_float16_inputs(comm):
    mesh = ps.Mesh(comm, (comm.size,))
    g = make_global((6, 5), np.int64)
    y = pf.fftn(ps.distribute(g, mesh, [Shard(0)]))
    assert y.dtype == np.complex128
    check(y, np.fft.fftn(g), np.float64, "int64", comm)
    h = make_global((6, 5), np.float16)
    y = pf.dctn(ps.distribute(h, mesh, [Shard(1)]))
    assert y.dtype == np.float32
    check(y, sf.dctn(h.astype(np.float32)), np.float32, "float16", comm)
    mesh.free()


def test_bad_arguments_raise_on_every_rank_before_any_communication(comm):
    mesh = ps.Mesh(comm, (comm.size,))
    g = make_global((6, 5), np.complex128)
    x = ps.distribute(g, mesh, [Shard(0)])
    r = ps.distribute(g.real.copy(), mesh, [Shard(0)])
    before = ps.comm_stats()
    bad = [
        (ValueError, "out of bounds", lambda: pf.fftn(x, axes=(0, 2))),
        (IndexError, "out of bounds", lambda: pf.fft(x, axis=-3)),
        (ValueError, "same length", lambda: pf.fftn(x, s=(4,), axes=(0, 1))),
        (ValueError, "Invalid norm", lambda: pf.fftn(x, norm="bogus")),
        (TypeError, "real sequence", lambda: pf.rfftn(x)),
        (ValueError, "invalid DCT type", lambda: pf.dctn(r, type=5)),
        (ValueError, "invalid DST type", lambda: pf.dstn(r, type=0)),
        (ValueError, "unique", lambda: pf.fftn(x, axes=(0, 0))),
        (ValueError, "data points", lambda: pf.fftn(x, s=(0, 5))),
        (ValueError, "placements", lambda: pf.fftn(x, placements=[Shard(0), Shard(1)])),
        (ValueError, "placements", lambda: pf.fftn(x, placements="anywhere")),
        (ValueError, "sizes", lambda: pf.fftn(x, placements=[Shard(0)], sizes={0: [1]})),
        (TypeError, "ShardedArray", lambda: pf.fftn(g)),
        (ValueError, "kind", lambda: pf.plan(x.layout, "hilbert")),
        (ValueError, "expected", lambda: pf.plan(x.layout, "fftn").forward(r)),
    ]
    for exc, msg, fn in bad:
        with pytest.raises(exc, match=msg):
            fn()
    assert collectives_since(before) == 0
    mesh.free()


def test_plans_are_cached_and_reused(comm):
    mesh = ps.Mesh(comm, (comm.size,))
    g = make_global((7, 6), np.complex128) / 8
    x = ps.distribute(g, mesh, [Shard(1)])
    p = pf.plan(x.layout, "fftn")
    assert pf.plan(x.layout, "fftn", axes=(0, 1), norm=None) is p
    assert pf.plan(x.layout, "fftn", norm="ortho") is not p
    ref = np.fft.fftn(g)
    for _ in range(3):
        y = p.forward(x)
        check(y, ref, np.complex128, "reuse", comm)
    out = np.empty_like(y.local)
    y2 = p.forward(x, out=out, workers=1)
    assert y2.local is out
    check(y2, ref, np.complex128, "out=", comm)
    back = np.empty(x.local.shape, np.complex128)
    assert p.backward(y2, out=back).local is back
    check(ps.ShardedArray(back, x.layout, mesh), g, np.complex128, "backward out=", comm)
    before = ps.comm_stats()
    with pytest.raises(ValueError, match="out must be"):
        p.forward(x, out=np.empty(y.local.shape, np.complex64))
    assert collectives_since(before) == 0


def test_validation_mode(comm):
    """With pyshard.set_validation(True), ranks that pass different arguments raise the
    same error on every rank instead of hanging."""
    mesh = ps.Mesh(comm, (comm.size,))
    g = make_global((6, 5), np.complex128)
    x = ps.distribute(g, mesh, [Shard(0)])
    ps.set_validation(True)
    try:
        check(pf.fftn(x), np.fft.fftn(g), np.complex128, "validated", comm)
        if comm.size > 1:
            norm = "ortho" if comm.rank == 0 else None
            with pytest.raises(ValueError, match="different arguments"):
                pf.fftn(x, norm=norm)
    finally:
        ps.config.reset("PYSHARD_VALIDATE")
    mesh.free()
    mesh.free()


def test_partial_input(comm):
    """Partial(sum) stays Partial (every transform is linear); Partial(max) is reduced first."""
    two = [m for m in MESHES.get(comm.size, []) if len(m) == 2]
    ms = two[0] if two else (1, comm.size)
    mesh = ps.Mesh(comm, ms)
    shape = (6, 7)
    for op in ("sum", "max"):
        parts, total = contributions(shape, np.float64, ms[0], op, seed=5)
        pl = [Partial(op), Shard(0)]
        lay = ps.Layout(shape, np.float64, ms, pl)
        local = np.ascontiguousarray(parts[mesh.coords[0]][lay.box(mesh.coords)])
        x = ps.from_local(local, mesh, pl, global_shape=shape)
        y = pf.rfftn(x)
        ref = np.fft.rfftn(total)
        if op == "sum":
            assert y.placements == (Partial("sum"), Shard(0))
            y = y.redistribute([Replicate(), Shard(0)])
        else:
            assert y.placements == (Replicate(), Shard(0))
        check(y, ref, np.float64, f"Partial({op})", comm)
    mesh.free()


def test_partial_sum_of_bool_and_integers_is_reduced_first(comm):
    """pyshard's Partial("sum") of bool is a logical or and of integers wraps in their dtype:
    not linear, so reduced first (as max/min) and Replicate in the default result; the
    transform is numpy's of that reduced global array. Float sums stay Partial."""
    two = [m for m in MESHES.get(comm.size, []) if len(m) == 2]
    for ms in [(comm.size,)] + two[:1]:
        mesh = ps.Mesh(comm, ms)
        pl = [Partial("sum")] + [Shard(0)] * (len(ms) - 1)
        shape = (6, 5)
        for dtype in (np.bool_, np.int8, np.uint8, np.int64):
            rng = np.random.default_rng(7)
            if dtype == np.bool_:
                parts = rng.random((ms[0],) + shape) < 0.6
                total = np.logical_or.reduce(parts, axis=0)
            else:  # 100s: int8/uint8 sums wrap from two ranks on
                parts = rng.integers(90, 128, (ms[0],) + shape).astype(dtype)
                total = np.sum(parts, axis=0, dtype=dtype)
            lay = ps.Layout(shape, dtype, ms, pl)
            local = np.ascontiguousarray(parts[mesh.coords[0]][lay.box(mesh.coords)])
            x = ps.from_local(local, mesh, pl, global_shape=shape)
            np.testing.assert_array_equal(
                x.redistribute([Replicate()] * len(ms)).local, total)  # pyshard's reduction
            for kind in ("fftn", "rfftn", "dctn", "hfftn"):
                y = getattr(pf, kind)(x)
                assert y.placements == (Replicate(),) + tuple(pl[1:]), (kind, dtype)
                ref = getattr(sf, kind)(total.astype(np.float64))
                check(y, ref, np.float64, f"Partial(sum) {np.dtype(dtype)} {kind} {ms}", comm)
            p = pf.plan(x.layout, "fftn", placements=[Partial("sum")] + pl[1:])
            y = p.forward(x).redistribute([Replicate()] * len(ms))
            check(y, np.fft.fftn(total), np.float64, f"to Partial {np.dtype(dtype)} {ms}", comm)
        f = ps.from_local(np.ones((6, 5)), mesh, [Partial("sum")] + [Replicate()] * (len(ms) - 1))
        assert pf.fftn(f).placements[0] == Partial("sum")  # float: stays Partial
        mesh.free()


def test_any_then_inverse_with_placements(comm):
    """The inverse of an "any" result, asked to land in the input's placements."""
    g = make_global((6, 5, 7), np.float64)
    for ms in meshes(comm):
        mesh = ps.Mesh(comm, ms)
        pl = [Shard(d % 3) for d in range(len(ms))]
        x = ps.distribute(g, mesh, pl)
        y = pf.rfftn(x, placements="any")
        z = pf.irfftn(y, s=g.shape, placements=pl, sizes=x.layout.sizes)
        assert z.layout == x.layout
        check(z, g, np.float64, f"any inverse {ms}", comm)
        mesh.free()


@pytest.mark.parametrize("seed", range(1))
def test_pooled_paths(comm, seed):
    """Every pass through pyshard's result pool (in-place c2c, numpy's out=), as large
    arrays take it."""
    with ps.config.override(PYSHARD_POOL_MIN_BYTES=0):  # every result from the pool
        rng = np.random.default_rng(99 + seed)
        for ms in meshes(comm):
            mesh = ps.Mesh(comm, ms)
            for case in range(10):
                shape, kind, axes, s, norm, type_, dtype = random_case(rng, ms)
                g = make_global(shape, dtype, seed=case)
                pl, sizes = random_layout(rng, ms, shape)
                ref = oracle(kind, g, s, axes, norm, type_)
                x = ps.distribute(g, mesh, pl, sizes)
                kw = {} if type_ is None else {"type": type_}
                p = pf.plan(x.layout, kind, axes=axes, s=s, norm=norm, placements="any", **kw)
                y = p.forward(x)
                check(y, ref, dtype, f"pooled {kind} {shape} {pl} {axes} {s}", comm)
                np.testing.assert_array_equal(x.local, g[x.box])
                out = np.empty_like(y.local)
                assert p.forward(x, out=out).local is out
                check(p.forward(x, out=out), ref, dtype, "pooled out=", comm)
            mesh.free()


def test_tune_mesh(comm, tmp_path, monkeypatch):
    """The fastest candidate mesh, the same on every rank, kept in PYSHARD_TUNE_FILE: a
    second call with the same key times nothing."""
    import json

    from pyshard.fft.tune import mesh_shapes, tune_mesh

    path = comm.bcast(str(tmp_path / "tune.json"), root=0)  # rank 0 reads and writes it
    monkeypatch.setenv("PYSHARD_TUNE_FILE", path)
    assert sorted(mesh_shapes(6, 2)) == [(1, 6), (2, 3), (3, 2), (6, 1)]
    m = pf.tune_mesh(comm, (8, 6, 4), "rfftn", trials=1)
    assert m.size == comm.size and comm.allgather(m.shape) == [m.shape] * comm.size
    m.free()
    calls = []

    def work(mesh):
        calls.append(mesh.shape)
        g = make_global((6, 5), np.complex128)
        pf.fftn(ps.distribute(g, mesh, [Shard(0)] + [Replicate()] * (mesh.ndim - 1)))

    m = tune_mesh(comm, 2, work, key="test", trials=1)
    assert len(calls) == 2 * len(mesh_shapes(comm.size, 2))  # warm-up + 1 trial each
    shape = m.shape
    m.free()
    calls.clear()
    m = tune_mesh(comm, 2, work, key="test", trials=1)
    assert calls == [] and m.shape == shape
    m.free()
    if comm.rank == 0:
        with open(path) as f:
            data = json.load(f)
        assert any(k.startswith("mesh|") and k.endswith("|test") for k in data)
    with pytest.raises(ValueError, match="ranks"):
        tune_mesh(comm, 1, work, candidates=[(comm.size + 1,)])


def test_bench_row(comm, monkeypatch):
    """The fft bench row: every pyshard backend and, where mpi4py_fft imports, PFFT's FFTW
    and numpy backends in the same run, each round trip checked; PFFT skipped cleanly
    (with the reason) where it does not import."""
    import json

    from pyshard.bench import fft as bf

    row = bf.bench_fft(comm, n=8, reps=1, warmup=0, batch=comm.size + 1, batch_n=8)
    json.dumps(row)
    assert row["case"] == "fft" and row["check"]
    assert {(c["kind"], c["decomp"]) for c in row["cases"]} == {
        (k, d) for k in ("c2c", "r2c") for d in ("slab", "pencil")
    }
    assert all(c["round_trip_ok"] and c["forward"]["total"] > 0 for c in row["cases"])
    assert row["batched"]["transposes"] == 0
    assert "per transform" in bf.format_fft(row)
    have_pfft = bf.import_pfft()[0] is not None
    for c in row["cases"]:
        assert set(c["impls"]) >= {f"pyshard-{b}" for b in bf.pyshard_backends()}
        assert all(v < 1e-9 for v in c["errors"].values())
        assert c["mpi_floor_ms"]["forward"] >= 0
        if comm.size > 1:  # the floor runs the raw collectives: they take time
            assert c["mpi_floor_ms"]["forward"] > 0
        if have_pfft:
            assert {"pfft-fftw", "pfft-numpy"} <= set(c["impls"]), c["notes"]
            assert c["vs_pfft-fftw"]["per_transform"] > 0
    monkeypatch.setattr(bf, "import_pfft", lambda: (None, "mpi4py_fft does not import (test)"))
    row = bf.bench_fft(comm, n=8, reps=1, warmup=0, batch=0, decomps=("pencil",), kinds=("r2c",))
    (c,) = row["cases"]
    assert not any(k.startswith("pfft") for k in c["impls"]) and row["check"]
    assert c["notes"]["pfft-fftw"] == "mpi4py_fft does not import (test)"
    assert "pfft-fftw: mpi4py_fft does not import (test)" in bf.format_fft(row)


def _pyfftw_or_skip(backend):
    if backend.startswith("pyfftw"):
        pytest.importorskip("pyfftw")


@pytest.mark.parametrize("backend", ["scipy", "numpy", "pyfftw",
                                     pytest.param("pyfftw-measure", marks=pytest.mark.slow)])
def test_backends(comm, backend):
    """Every local-transform backend (PYSHARD_FFT_BACKEND) against numpy.fft/scipy.fft on
    the gathered global array: random c2c/r2c/c2r (and DCT/DST: scipy under every backend)
    cases on every mesh, the input left alone, out=, and plan.backward round trips."""
    _pyfftw_or_skip(backend)
    rng = np.random.default_rng(4321)
    with ps.config.override(PYSHARD_FFT_BACKEND=backend):
        assert pf.backend() == backend
        for ms in meshes(comm):
            mesh = ps.Mesh(comm, ms)
            for case in range(8):
                shape, kind, axes, s, norm, type_, dtype = random_case(rng, ms)
                if case < 6 and kind in ("dctn", "idctn", "dstn", "idstn"):
                    kind, type_ = ("rfftn", None) if "f" in dtype else ("irfftn", None)
                    if kind == "rfftn" and dtype not in ("float32", "float64"):
                        dtype = "float64"
                g = make_global(shape, dtype, seed=case)
                pl, sizes = random_layout(rng, ms, shape)
                ref = oracle(kind, g, s, axes, norm, type_)
                x = ps.distribute(g, mesh, pl, sizes)
                kw = {} if type_ is None else {"type": type_}
                where = f"{backend} mesh {ms}: {kind} {shape} {dtype} {pl} {axes} s {s} {norm}"
                p = pf.plan(x.layout, kind, axes=axes, s=s, norm=norm, placements="any", **kw)
                y = p.forward(x)
                assert y.dtype == expect_dtype(kind, dtype), where
                check(y, ref, dtype, where, comm)
                np.testing.assert_array_equal(x.local, g[x.box])  # the input is left alone
                out = np.empty_like(y.local)
                assert p.forward(x, out=out).local is out
                check(ShardedArray_of(out, y), ref, dtype, where + " out=", comm)
                if s is None:  # the inverse of a transform that keeps every length
                    z = p.backward(y)
                    want = g.astype(z.dtype) if z.dtype.kind == "c" else g
                    if kind == "irfftn":  # what rfftn keeps of the spectrum
                        want = np.fft.rfftn(ref, axes=axes, norm=norm)
                    check(z, want, dtype, where + " backward", comm)
            mesh.free()


def ShardedArray_of(local, like):
    return ps.ShardedArray(local, like.layout, like.mesh)


def test_backend_setting(comm, monkeypatch):
    """auto is scipy (pocketfft: faster than pyFFTW at 256^3 here, docs/fft.md), numpy
    without scipy; a backend that does not import raises ImportError on every rank before
    any communication; a bad value ValueError."""
    with ps.config.override(PYSHARD_FFT_BACKEND="auto"):
        assert pf.backend() == "scipy"
    select = engine.select_backend  # (value, scipy imports, pyfftw imports)
    assert select("auto", False, True) == "numpy"  # as where scipy does not import
    assert select("auto", True, False) == "scipy"  # as where pyfftw does not import
    assert select("pyfftw-measure", False, True) == "pyfftw-measure"
    with pytest.raises(ImportError, match="needs scipy"):
        select("scipy", False, True)
    with pytest.raises(ImportError, match="needs pyFFTW"):
        select("pyfftw", True, False)
    monkeypatch.setitem(sys.modules, "pyfftw", None)  # as where pyfftw does not import
    mesh = ps.Mesh(comm, (comm.size,))
    x = ps.distribute(make_global((6, 4), np.complex128), mesh, [Shard(0)])
    before = ps.comm_stats()
    for name in ("pyfftw", "pyfftw-measure"):
        with ps.config.override(PYSHARD_FFT_BACKEND=name):
            with pytest.raises(ImportError, match="pyfftw"):
                pf.fftn(x, axes=(0,))  # a transpose first: raised before it, on every rank
    assert collectives_since(before) == 0
    with pytest.raises(ValueError, match="PYSHARD_FFT_BACKEND"):
        ps.config.set("PYSHARD_FFT_BACKEND", "mkl")
    with ps.config.override(PYSHARD_FFT_BACKEND="numpy"):  # numpy.fft has no DCT: scipy's
        y = pf.dctn(x, axes=(1,))
        check(
            y,
            sf.dctn(make_global((6, 4), np.complex128), axes=(1,)),
            np.complex128,
            "dct under numpy",
            comm,
        )
    mesh.free()
