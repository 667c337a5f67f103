"""pyshard.fft checked as a drop-in for numpy.fft and scipy.fft, the way a user would check it.

A table of (function, shape, dtype, arguments, out=) cases runs on every layout of the run's
meshes (a 1-D mesh and a 2-D one; Shard on any axis, uneven and empty shards, Replicate),
each result gathered and compared with numpy.fft's (the names numpy has) or scipy.fft's (the
others) on the global array: within ``NUMPY_ULPS`` of the reference, and within
``LAYOUT_ULPS`` of the same call on every other layout (docs/fft.md: results can differ by
an ulp between layouts). Bad arguments raise numpy's or scipy's exception for the same call
(the same type; the same message, or one containing it) on every rank before any
communication; ``s`` with ``axes=None`` and ``None`` entries in ``s`` warn as numpy 2.x
does; ``out=``, ``workers=``, ``overwrite_x=``, ``plan=`` and ``orthogonalize=`` as numpy
and scipy take them; the Hermitian transforms round-trip through ``plan.backward``.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from test_redistribute_nd import MESHES

import pyshard as ps
from pyshard import Replicate, Shard
from pyshard import fft as pf

sf = pytest.importorskip("scipy.fft")  # pyshard[fft]

pytestmark = [pytest.mark.mpi, pytest.mark.numerics]

NOT_COLLECTIVES = {"staged", "device_direct"}
NUMPY_NAMES = {"fft", "ifft", "rfft", "irfft", "hfft", "ihfft", "fft2", "ifft2", "rfft2",
               "irfft2", "fftn", "ifftn", "rfftn", "irfftn"}
NUMPY_ULPS = 6  # max |pyshard - numpy/scipy|, in ulps of the reference's largest entry
LAYOUT_ULPS = 6  # max |layout A - layout B| of the same call, in the same ulps

C, Z, R, F = np.complex128, np.complex64, np.float64, np.float32

# (function, global shape, input dtype, arguments, out=: None, "same" dtype or "cast")
TABLE = [
    ("fft", (7, 6), C, dict(axis=0), "same"),
    ("fft", (7, 6), C, dict(n=9, norm="ortho"), None),
    ("ifft", (5, 8), C, dict(n=4, axis=0, norm="forward"), "cast"),
    ("rfft", (7, 6), R, dict(axis=0), None),
    ("rfft", (6, 5), R, dict(n=8, norm="ortho"), "same"),
    ("irfft", (7, 4), C, dict(axis=0), None),
    ("irfft", (5, 4), C, dict(n=7, axis=1, norm="forward"), "cast"),
    ("hfft", (7, 4), C, dict(axis=0), "same"),
    ("hfft", (6, 5), C, dict(n=9, norm="ortho"), None),
    ("hfft", (6, 5), Z, dict(n=1, axis=0, norm="forward"), None),
    ("ihfft", (7, 6), R, dict(axis=0), None),
    ("ihfft", (6, 5), R, dict(n=8, axis=1, norm="forward"), "same"),
    ("ihfft", (6, 5), F, dict(norm="ortho"), None),
    ("fft2", (6, 5, 4), C, dict(), None),
    ("ifft2", (6, 5, 4), C, dict(s=(3, 7), axes=(0, 2)), "same"),
    ("rfft2", (6, 5, 4), R, dict(norm="ortho"), None),
    ("irfft2", (6, 5, 4), C, dict(s=(5, 6)), None),
    ("hfft2", (6, 5, 4), C, dict(), "same"),
    ("hfft2", (6, 5, 4), C, dict(s=(4, 7), axes=(0, 1), norm="ortho"), None),
    ("ihfft2", (6, 5, 4), R, dict(axes=(2, 0), norm="forward"), None),
    ("ihfft2", (6, 5, 4), R, dict(s=(8, 3), axes=(1, 2)), "cast"),
    ("fftn", (6, 5, 4), C, dict(), "cast"),
    ("fftn", (6, 5, 4), R, dict(s=(4, -1, 6), axes=(0, 1, 2), norm="forward"), None),
    ("ifftn", (6, 5, 4), C, dict(axes=(1, 0)), None),
    ("rfftn", (6, 5, 4), R, dict(axes=(2, 0)), "same"),
    ("rfftn", (6, 5, 4), F, dict(), None),
    ("irfftn", (6, 5, 4), C, dict(s=(6, 5, -1), axes=(0, 1, 2)), None),
    ("irfftn", (6, 5, 4), C, dict(axes=(0, 2), norm="ortho"), "same"),
    ("hfftn", (6, 5, 4), C, dict(), None),
    ("hfftn", (6, 5, 4), C, dict(axes=(0, 1), norm="ortho"), "same"),
    ("hfftn", (6, 5, 4), Z, dict(s=(3, 8), axes=(2, 0)), None),
    ("ihfftn", (6, 5, 4), R, dict(), "same"),
    ("ihfftn", (6, 5, 4), R, dict(s=(7, 4), axes=(0, 1), norm="forward"), None),
    ("ihfftn", (6, 5, 4), F, dict(axes=(1,)), None),
    ("dctn", (6, 5, 4), R, dict(type=2, norm="ortho"), None),
    ("dctn", (6, 5, 4), R, dict(type=2, norm="ortho", orthogonalize=False), "same"),
    ("dctn", (6, 5, 4), R, dict(type=2, axes=(0, 2), orthogonalize=True), None),
    ("dctn", (6, 5, 4), R, dict(type=1, axes=(1,), norm="ortho", orthogonalize=True), None),
    ("dctn", (6, 5, 4), R, dict(type=4, s=(3, 5), axes=(2, 0)), None),
    ("idctn", (6, 5, 4), R, dict(type=3, norm="ortho", orthogonalize=False), None),
    ("idctn", (6, 5, 4), C, dict(type=3, orthogonalize=True), "cast"),
    ("dstn", (6, 5, 4), R, dict(type=2, norm="ortho", orthogonalize=False), None),
    ("dstn", (6, 5, 4), R, dict(type=3, axes=(1, 2), orthogonalize=True), None),
    ("idstn", (6, 5, 4), R, dict(type=3, orthogonalize=True), "same"),
    ("idstn", (6, 5, 4), R, dict(type=2, norm="ortho"), None),
    ("dct", (7, 6), R, dict(type=1, axis=0, orthogonalize=True), None),
    ("dct", (7, 6), R, dict(type=3, norm="ortho", orthogonalize=False), None),
    ("dst", (7, 6), C, dict(type=3, n=5, axis=0, norm="ortho", orthogonalize=False), None),
    ("idct", (7, 6), R, dict(type=2, axis=1, norm="ortho"), "same"),
    ("idst", (7, 6), R, dict(type=4, axis=0, norm="forward"), None),
]


def collectives_since(before):
    now = ps.comm_stats()
    return sum(v - before.get(k, 0) for k, v in now.items() if k not in NOT_COLLECTIVES)


def meshes(comm):
    """A 1-D mesh of every rank and the first 2-D mesh of test_redistribute_nd's."""
    two = [m for m in MESHES.get(comm.size, []) if len(m) == 2]
    return [(comm.size,)] + two[:1]


def uneven(n, parts):
    """Extents of n over parts, most on the last part (zeros where n is small)."""
    ext = [n // (parts + 1)] * parts
    ext[-1] += n - sum(ext)
    return ext


def layouts(ms, shape):
    """(placements, sizes) on mesh ``ms``: even and uneven shards of different axes, and
    Replicate."""
    nd = len(shape)
    if len(ms) == 1:
        return [([Shard(0)], None), ([Shard(nd - 1)], {nd - 1: uneven(shape[-1], ms[0])}),
                ([Replicate()], None)]
    return [([Shard(0), Shard(1)], None),
            ([Shard(1), Shard(0)], {1: uneven(shape[1], ms[0]), 0: uneven(shape[0], ms[1])}),
            ([Shard(nd - 1), Replicate()], None)]


def global_array(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    g = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        g = g + 1j * rng.standard_normal(shape)
    return g.astype(dtype)


def oracle(name):
    return getattr(np.fft if name in NUMPY_NAMES else sf, name)


def gathered(y):
    return y.redistribute([Replicate()] * len(y.placements)).local


def ulps(got, ref):
    """max |got - ref| in ulps of ref's largest entry (in ref's precision)."""
    big = np.abs(ref).max()
    one = np.spacing(np.asarray(big, dtype=np.finfo(ref.dtype).dtype))
    return float(np.abs(got.astype(ref.dtype) - ref).max() / one)


def out_like(y, dtype):
    """A ShardedArray of ``y``'s layout and ``dtype``, filled with a value no result has."""
    lay = ps.Layout(y.shape, dtype, y.layout.mesh_shape, y.placements, y.layout.sizes)
    return ps.ShardedArray(np.full(y.local.shape, 1234, dtype), lay, y.mesh)


@pytest.mark.parametrize("part", range(2))
def test_table_against_numpy_and_scipy(comm, part):
    """Every case of TABLE on every layout: the gathered result within NUMPY_ULPS of
    numpy/scipy on the global array (the same shape and dtype), within LAYOUT_ULPS of every
    other layout's, and with out= the same values written into out and out returned."""
    cases = TABLE[part::2]
    worst = {"numpy": 0.0, "layouts": 0.0}
    for ms in meshes(comm):
        mesh = ps.Mesh(comm, ms)
        for i, (name, shape, dtype, kw, out) in enumerate(cases):
            g = global_array(shape, dtype, seed=i)
            ref = oracle(name)(g, **kw)
            results = []
            for pl, sizes in layouts(ms, shape):
                where = f"{name} {shape} {np.dtype(dtype)} {kw} on {ms} {pl} {sizes}"
                x = ps.distribute(g, mesh, pl, sizes)
                y = getattr(pf, name)(x, **kw)
                assert y.shape == ref.shape and y.dtype == ref.dtype, (where, y.dtype)
                assert list(y.placements) == pl, where  # placements=None: the input's
                got = gathered(y)
                err = ulps(got, ref)
                worst["numpy"] = max(worst["numpy"], err)
                assert err <= NUMPY_ULPS, f"{where}: {err} ulps from {oracle(name).__module__}"
                for other in results:
                    d = ulps(got, other)
                    worst["layouts"] = max(worst["layouts"], d)
                    assert d <= LAYOUT_ULPS, f"{where}: {d} ulps between layouts"
                results.append(got)
                np.testing.assert_array_equal(x.local, g[x.box])  # the input is left alone
                if out is not None:
                    dt = y.dtype if out == "same" else (
                        np.dtype(F) if y.dtype.kind == "f" else np.dtype(Z))
                    o = out_like(y, dt)
                    assert getattr(pf, name)(x, out=o, **kw) is o, where
                    np.testing.assert_array_equal(o.local, y.local.astype(dt), err_msg=where)
        mesh.free()
    print(f"worst: {worst['numpy']:.2f} ulps from numpy/scipy, {worst['layouts']:.2f} ulps "
          "between layouts")


def test_hermitian_round_trips(comm):
    """hfftn/ihfftn plans: forward to "any" and back with plan.backward lands in the input's
    layout, equal to scipy's ihfftn(hfftn(.)) (and the reverse), on every layout."""
    shape = (6, 5, 4)
    for ms in meshes(comm):
        mesh = ps.Mesh(comm, ms)
        for pl, sizes in layouts(ms, shape):
            for kind, dtype, axes in (("hfftn", C, (0, 1, 2)), ("hfftn", C, (2, 0)),
                                      ("ihfftn", R, (0, 1, 2)), ("ihfftn", R, (1,))):
                g = global_array(shape, dtype, seed=3)
                x = ps.distribute(g, mesh, pl, sizes)
                for target in ("any", None):
                    p = pf.plan(x.layout, kind, axes=axes, norm="ortho", placements=target)
                    y = p.forward(x)
                    z = p.backward(y)
                    assert z.layout.placements == x.layout.placements
                    assert z.layout.sizes == x.layout.sizes and z.shape == x.shape
                    spec = getattr(sf, kind)(g, axes=axes, norm="ortho")
                    if kind == "hfftn":  # the bins ihfftn keeps of the real hfftn
                        want = sf.ihfftn(spec, axes=axes, norm="ortho")
                    else:  # the input's real lengths again
                        want = sf.hfftn(spec, s=[shape[a] for a in axes], axes=axes,
                                        norm="ortho")
                    assert ulps(gathered(z), want) <= NUMPY_ULPS, (kind, axes, ms, pl, target)
        mesh.free()


def _raised(fn):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # numpy warns before some of these errors
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - whatever numpy/scipy raise is the oracle
            return e
    raise AssertionError("the oracle raised nothing")


def test_errors_are_numpys_and_scipys(comm):
    """The same bad call to pyshard.fft and to numpy.fft/scipy.fft on the global array: the
    same exception type and (where the library raises it on purpose, not from an internal
    index or cast) a message containing theirs; every rank raises before communicating."""
    mesh = ps.Mesh(comm, (comm.size,))
    g = global_array((6, 5), C)
    gr = g.real.copy()
    x = ps.distribute(g, mesh, [Shard(0)])
    r = ps.distribute(gr, mesh, [Shard(0)])
    bad_out = ps.distribute(np.zeros((6, 4), C), mesh, [Shard(0)])
    real_out = ps.distribute(np.zeros((6, 5), R), mesh, [Shard(0)])
    big = np.empty((6, 4), C)
    npf = np.fft
    # (pyshard call, the same call to numpy/scipy, whether the message must be contained)
    cases = [
        (lambda: pf.fftn(x, norm="bogus"), lambda: npf.fftn(g, norm="bogus"), True),
        (lambda: pf.ifftn(x, norm="bogus"), lambda: npf.ifftn(g, norm="bogus"), True),
        (lambda: pf.irfft(x, norm="x"), lambda: npf.irfft(g, norm="x"), True),
        (lambda: pf.rfft2(r, norm=1), lambda: npf.rfft2(gr, norm=1), True),
        (lambda: pf.hfft(x, norm="x"), lambda: npf.hfft(g, norm="x"), True),
        (lambda: pf.ihfft(r, norm="x"), lambda: npf.ihfft(gr, norm="x"), True),
        (lambda: pf.fftn(x, s=(4,), axes=(0, 1)), lambda: npf.fftn(g, s=(4,), axes=(0, 1)),
         True),
        (lambda: pf.fft(x, n=0), lambda: npf.fft(g, n=0), True),
        (lambda: pf.fft(x, n=-1), lambda: npf.fft(g, n=-1), True),
        (lambda: pf.fftn(x, s=(3, -2), axes=(0, 1)), lambda: npf.fftn(g, s=(3, -2), axes=(0, 1)),
         True),
        (lambda: pf.rfftn(r, s=(0, -3), axes=(0, 1)),
         lambda: npf.rfftn(gr, s=(0, -3), axes=(0, 1)), True),
        (lambda: pf.irfftn(x, s=(0, -3), axes=(0, 1)),
         lambda: npf.irfftn(g, s=(0, -3), axes=(0, 1)), True),
        (lambda: pf.hfft(x, n=0), lambda: npf.hfft(g, n=0), True),
        (lambda: pf.ihfft(r, n=-1), lambda: npf.ihfft(gr, n=-1), True),
        (lambda: pf.fft(x, n=2.5), lambda: npf.fft(g, n=2.5), True),
        (lambda: pf.fftn(x, s=(2.5, 3), axes=(0, 1)), lambda: npf.fftn(g, s=(2.5, 3), axes=(0, 1)),
         True),
        (lambda: pf.fft(x, n=True), lambda: npf.fft(g, n=True), True),
        (lambda: pf.fftn(x, s=(2, 2, 2)), lambda: npf.fftn(g, s=(2, 2, 2)), True),
        # s longer than ndim + 1: the axis numpy's loop meets first (-3 here; irfftn -4)
        (lambda: pf.fftn(x, s=(2,) * 4), lambda: npf.fftn(g, s=(2,) * 4), True),
        (lambda: pf.ifftn(x, s=(2,) * 4), lambda: npf.ifftn(g, s=(2,) * 4), True),
        (lambda: pf.rfftn(r, s=(2,) * 4), lambda: npf.rfftn(gr, s=(2,) * 4), True),
        (lambda: pf.irfftn(x, s=(2,) * 4), lambda: npf.irfftn(g, s=(2,) * 4), True),
        (lambda: pf.irfftn(x, s=(2,) * 3), lambda: npf.irfftn(g, s=(2,) * 3), True),
        (lambda: pf.fftn(x, axes=(0, 2)), lambda: npf.fftn(g, axes=(0, 2)), False),
        (lambda: pf.fft(x, axis=-3), lambda: npf.fft(g, axis=-3), False),
        (lambda: pf.fft(x, axis=1.0), lambda: npf.fft(g, axis=1.0), False),
        (lambda: pf.rfft(x), lambda: npf.rfft(g), False),
        (lambda: pf.rfftn(x), lambda: npf.rfftn(g), False),
        (lambda: pf.ihfft(x), lambda: npf.ihfft(g), False),
        (lambda: pf.fftn(x, out=[1]), lambda: npf.fftn(g, out=[1]), True),
        (lambda: pf.fft(x, out=bad_out), lambda: npf.fft(g, out=big), True),
        (lambda: pf.fftn(x, out=real_out), lambda: npf.fftn(g, out=np.empty((6, 5))), True),
        (lambda: pf.rfftn(r, out=ps.distribute(np.zeros((6, 3)), mesh, [Shard(0)])),
         lambda: npf.rfftn(gr, out=np.empty((6, 3))), True),
        (lambda: pf.fft(x, plan=object()), lambda: sf.fft(g, plan=object()), True),
        (lambda: pf.fft(x, workers=0), lambda: sf.fft(g, workers=0), True),
        (lambda: pf.fftn(x, workers=-99), lambda: sf.fftn(g, workers=-99), True),
        (lambda: pf.fft(x, workers="2"), lambda: sf.fft(g, workers="2"), True),
        # repeated axes: scipy's ValueError (numpy transforms such an axis twice)
        (lambda: pf.fftn(x, axes=(0, 0)), lambda: sf.fftn(g, axes=(0, 0)), True),
        # the scipy.fft-only names
        (lambda: pf.hfftn(x, norm="b"), lambda: sf.hfftn(g, norm="b"), True),
        (lambda: pf.ihfft2(r, norm="b"), lambda: sf.ihfft2(gr, norm="b"), True),
        (lambda: pf.hfftn(x, s=(3,), axes=(0, 1)), lambda: sf.hfftn(g, s=(3,), axes=(0, 1)),
         True),
        (lambda: pf.hfftn(x, s=(0, 3), axes=(0, 1)), lambda: sf.hfftn(g, s=(0, 3), axes=(0, 1)),
         True),
        (lambda: pf.ihfftn(x), lambda: sf.ihfftn(g), True),
        (lambda: pf.hfft2(x, axes=(1, 1)), lambda: sf.hfft2(g, axes=(1, 1)), True),
        (lambda: pf.hfftn(x, axes=(0, 2)), lambda: sf.hfftn(g, axes=(0, 2)), True),
        (lambda: pf.hfftn(x, s=(2, 2, 2)), lambda: sf.hfftn(g, s=(2, 2, 2)), True),
        (lambda: pf.ihfftn(r, s=(2.5, 3)), lambda: sf.ihfftn(gr, s=(2.5, 3)), True),
        (lambda: pf.hfftn(x, axes=(1.0,)), lambda: sf.hfftn(g, axes=(1.0,)), True),
        (lambda: pf.hfftn(x, plan="p"), lambda: sf.hfftn(g, plan="p"), True),
        (lambda: pf.dct(r, type=5), lambda: sf.dct(gr, type=5), True),
        (lambda: pf.dstn(r, type=0), lambda: sf.dstn(gr, type=0), True),
        (lambda: pf.dct(r, type="2"), lambda: sf.dct(gr, type="2"), False),
        (lambda: pf.dct(r, type=2.0), lambda: sf.dct(gr, type=2.0), False),
        (lambda: pf.dct(r, norm="x"), lambda: sf.dct(gr, norm="x"), True),
        (lambda: pf.dct(r, n=0), lambda: sf.dct(gr, n=0), True),
        (lambda: pf.idst(r, n=-1), lambda: sf.idst(gr, n=-1), True),
        (lambda: pf.dctn(r, s=(0, 3)), lambda: sf.dctn(gr, s=(0, 3)), True),
        (lambda: pf.dct(r, type=1, n=1), lambda: sf.dct(gr, type=1, n=1), True),
        (lambda: pf.idctn(r, type=1, s=(1, 5)), lambda: sf.idctn(gr, type=1, s=(1, 5)), True),
        (lambda: pf.dct(r, axis=3), lambda: sf.dct(gr, axis=3), False),
        (lambda: pf.dctn(r, axes=(0, 3)), lambda: sf.dctn(gr, axes=(0, 3)), True),
        (lambda: pf.dstn(r, axes=(1, 1)), lambda: sf.dstn(gr, axes=(1, 1)), True),
        (lambda: pf.dctn(r, s=(3,), axes=(0, 1)), lambda: sf.dctn(gr, s=(3,), axes=(0, 1)), True),
        (lambda: pf.dct(r, orthogonalize="x"), lambda: sf.dct(gr, orthogonalize="x"), False),
        (lambda: pf.dct(r, workers=0), lambda: sf.dct(gr, workers=0), True),
        (lambda: pf.dct(r, workers=1.5), lambda: sf.dct(gr, workers=1.5), False),
        # a scalar s: numpy's n-D forms iterate it (scipy's take it as one length)
        (lambda: pf.fftn(x, s=5), lambda: npf.fftn(g, s=5), True),
        (lambda: pf.fft2(x, s=5), lambda: npf.fft2(g, s=5), True),
        (lambda: pf.irfftn(x, s=4), lambda: npf.irfftn(g, s=4), True),
        (lambda: pf.dct(r, type=None), lambda: sf.dct(gr, type=None), False),
        (lambda: pf.dstn(r, type=None), lambda: sf.dstn(gr, type=None), False),
        # a scalar float s or axes of scipy's n-D names: one entry, then scipy's ValueError
        (lambda: pf.dctn(r, s=2.0), lambda: sf.dctn(gr, s=2.0), True),
        (lambda: pf.dctn(r, axes=1.0), lambda: sf.dctn(gr, axes=1.0), True),
        (lambda: pf.hfftn(x, s=7.0), lambda: sf.hfftn(g, s=7.0), True),
        (lambda: pf.dct(r, orthogonalize=[1]), lambda: sf.dct(gr, orthogonalize=[1]), False),
    ]
    before = ps.comm_stats()
    for i, (ours, theirs, message) in enumerate(cases):
        want = _raised(theirs)
        with pytest.raises(Exception) as got:  # noqa: B017, PT011 - compared below
            ours()
        where = f"case {i}: pyshard {type(got.value).__name__}({got.value}) vs " \
                f"{type(want).__name__}({want})"
        assert isinstance(got.value, type(want)), where
        if message:
            assert str(want) in str(got.value), where
    assert collectives_since(before) == 0
    mesh.free()


def _messages(record):
    return [(w.category, str(w.message)) for w in record]


def test_numpy2_deprecations(comm):
    """``s`` with ``axes=None`` (fewer entries than axes) and ``None`` entries in ``s``: the
    DeprecationWarnings numpy 2.x gives, pointing at the caller, and numpy's result; the
    scipy.fft-only names take ``s`` without axes as scipy does, silently."""
    mesh = ps.Mesh(comm, (comm.size,))
    g = global_array((6, 5, 4), C)
    gr = g.real.copy()
    x = ps.distribute(g, mesh, [Shard(0)])
    r = ps.distribute(gr, mesh, [Shard(1)])
    cases = [
        ("fftn", x, g, dict(s=(4, 6))),
        ("rfftn", r, gr, dict(s=(7,))),
        ("irfftn", x, g, dict(s=(None, 7), axes=(0, 2))),
        ("fftn", x, g, dict(s=(None, 3), axes=(2, 0))),
        ("ifft2", x, g, dict(s=(3, None), axes=None)),
        ("irfft2", x, g, dict(s=(None, None))),
    ]
    for name, a, ga, kw in cases:
        with warnings.catch_warnings(record=True) as theirs:
            warnings.simplefilter("always")
            ref = getattr(np.fft, name)(ga, **kw)
        with pytest.warns(DeprecationWarning) as ours:
            y = getattr(pf, name)(a, **kw)
        assert _messages(ours) == _messages(theirs), (name, kw)
        assert all(w.filename == __file__ for w in ours), [w.filename for w in ours]
        assert ulps(gathered(y), ref) <= NUMPY_ULPS, (name, kw)
    # one entry of s per axis: numpy's announced meaning gives the same result, no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = pf.irfftn(x, s=(6, 5, 7))
        z = pf.hfftn(x, s=(3, 6))  # scipy: the last len(s) axes, no warning
        w = pf.dctn(r, s=(7,))
    assert ulps(gathered(y), np.fft.irfftn(g, s=(6, 5, 7), axes=(0, 1, 2))) <= NUMPY_ULPS
    assert ulps(gathered(z), sf.hfftn(g, s=(3, 6))) <= NUMPY_ULPS
    assert ulps(gathered(w), sf.dctn(gr, s=(7,))) <= NUMPY_ULPS
    mesh.free()


def test_out(comm):
    """out=: a ShardedArray of the result's layout, written and returned (the result's
    dtype, or one it casts to as numpy's out= does); "any" and given placements; out the
    input itself; a wrong layout raises on every rank before communicating; a rank's shard
    (FFTPlan.forward's out=) is still taken."""
    g = global_array((6, 5, 4), C, seed=7)
    for ms in meshes(comm):
        mesh = ps.Mesh(comm, ms)
        for pl, sizes in layouts(ms, g.shape):
            x = ps.distribute(g, mesh, pl, sizes)
            for target in (None, "any", [Replicate()] * len(ms)):
                y = pf.fftn(x, placements=target)
                for dt in (C, Z):
                    o = out_like(y, dt)
                    assert pf.fftn(x, placements=target, out=o) is o
                    np.testing.assert_array_equal(o.local, y.local.astype(dt))
            x2 = ps.distribute(g, mesh, pl, sizes)
            assert pf.fftn(x2, out=x2) is x2  # in place: out is the input
            assert ulps(gathered(x2), np.fft.fftn(g)) <= NUMPY_ULPS
            y = pf.irfft(x, axis=1)
            o = out_like(y, C)  # a real result into complex out: numpy casts, so do we
            pf.irfft(x, axis=1, out=o)
            np.testing.assert_array_equal(o.local, y.local)
            loc = np.empty(y.local.shape, y.dtype)
            assert pf.irfft(x, axis=1, out=loc).local is loc
            np.testing.assert_array_equal(loc, y.local)
        if len(ms) == 1:  # a result laid out [Shard(0)] into an out laid out [Replicate()]
            x = ps.distribute(g, mesh, [Shard(0)])
            wrong = out_like(pf.fftn(x, placements=[Replicate()]), C)
            before = ps.comm_stats()
            with pytest.raises(ValueError, match="laid out"):
                pf.fftn(x, out=wrong)
            assert collectives_since(before) == 0
        mesh.free()


@pytest.mark.mpi(min_size=2)
def test_plain_out_that_fits_on_some_ranks_only(comm, monkeypatch):
    """A plain out= (this rank's shard) that fits on some ranks only: every rank raises the
    same ValueError naming the ranks at fault, before any exchange (one small allreduce
    agrees on it, the only collective a plain out= costs); a ShardedArray out= costs the same
    one (its local arrays: test_out_refused_on_one_rank_raises_everywhere), no out= none;
    the ranks stay in step (the next call runs)."""
    calls = []
    agree = ps.collectives.max_all_array

    def counted(c, values):
        calls.append(1)
        return agree(c, values)

    monkeypatch.setattr(ps.collectives, "max_all_array", counted)
    mesh = ps.Mesh(comm, (comm.size,))
    g = global_array((4, 8), R, seed=5)
    # uneven shards: rank 0's input shard has its result shard's shape (the rfft's 5 bins
    # are balanced), the others' not
    w0 = pf.plan(ps.Layout(g.shape, R, (comm.size,), [Shard(1)]), "rfftn").dst.local_shape(
        (0,))[1]
    x = ps.distribute(g, mesh, [Shard(1)], {1: [w0] + uneven(8 - w0, comm.size - 1)})
    y = pf.rfft(x)
    p = pf.plan(x.layout, "rfftn", axes=(1,))
    fits = comm.allgather(x.local.shape == y.local.shape)
    mistake = {r for r, ok in enumerate(fits) if not ok}
    assert 0 not in mistake and mistake
    for bad_ranks in (mistake, {1}, set(range(1, comm.size)), {0, comm.size - 1}):
        def out(shape, dtype, rank=comm.rank, bad=bad_ranks):
            return np.empty(shape if rank not in bad else (shape[0], shape[1] + 1), dtype)

        tries = [
            lambda: pf.rfft(x, out=np.empty(x.local.shape, C)),  # the reviewer's mistake
            lambda: pf.rfft(x, out=out(y.local.shape, C)),
            lambda: p.forward(x, out=out(y.local.shape, C)),
            lambda: p.backward(y, out=out(x.local.shape, R)),
        ]
        for i, call in enumerate(tries):
            if (i == 0) != (bad_ranks is mistake):
                continue
            before = ps.comm_stats()
            del calls[:]
            with pytest.raises(ValueError, match="out must be") as e:
                call()
            assert collectives_since(before) == 0 and len(calls) == 1
            lo, hi = min(bad_ranks), max(bad_ranks)
            assert (f"rank {lo}" if lo == hi else f"ranks {lo} to {hi}") in str(e.value), \
                str(e.value)
            msgs = comm.allgather(str(e.value).split("; this rank")[0])
            assert len(set(msgs)) == 1, msgs  # the same error on every rank
    del calls[:]
    o = np.empty(y.local.shape, C)
    assert pf.rfft(x, out=o).local is o and len(calls) == 1  # in step: this call runs
    assert ulps(gathered(pf.rfft(x)), np.fft.rfft(g)) <= NUMPY_ULPS
    np.testing.assert_array_equal(o, y.local)
    del calls[:]
    so = out_like(y, C)
    assert pf.rfft(x, out=so) is so and pf.rfft(x) is not None
    assert p.forward(x).layout == y.layout
    so2 = out_like(y, C)
    assert p.forward(x, out=so2).local is so2.local  # the plan's own: the bench's loop form
    assert len(calls) == 2  # a ShardedArray out= agrees its local arrays (one each); none none
    np.testing.assert_array_equal(so.local, y.local)
    np.testing.assert_array_equal(so2.local, y.local)
    mesh.free()


def test_scipy_arguments(comm):
    """workers= (any valid count: the same values), overwrite_x= (accepted; the input is
    left alone), plan=None, and orthogonalize= on plans (cached apart, shown by explain)."""
    mesh = ps.Mesh(comm, (comm.size,))
    g = global_array((6, 5, 4), C, seed=2)
    x = ps.distribute(g, mesh, [Shard(0)])
    ref = pf.fftn(x)
    for workers in (1, 2, -1, True):
        y = pf.fftn(x, workers=workers, overwrite_x=True, plan=None)
        np.testing.assert_array_equal(y.local, ref.local)
        np.testing.assert_array_equal(x.local, g[x.box])
    gr = g.real.copy()
    r = ps.distribute(gr, mesh, [Shard(2)])
    for orth in (None, True, False, 1, np.bool_(False), 1.5, 0.0):  # scipy: any number
        y = pf.dctn(r, norm="ortho", orthogonalize=orth, workers=-1, overwrite_x=True)
        want = sf.dctn(gr, norm="ortho", orthogonalize=orth)
        assert ulps(gathered(y), want) <= NUMPY_ULPS, orth
        np.testing.assert_array_equal(r.local, gr[r.box])
    # bools are integers to scipy: an axis, or a length of 1
    for kw in ({"axes": (True,)}, {"s": (True, 3)}, {"axes": (0, True)}):
        y = pf.dctn(r, **kw)
        assert ulps(gathered(y), sf.dctn(gr, **kw)) <= NUMPY_ULPS, kw
    p = pf.plan(r.layout, "dctn", norm="ortho", orthogonalize=False)
    assert p is pf.plan(r.layout, "dctn", norm="ortho", orthogonalize=False)
    assert p is not pf.plan(r.layout, "dctn", norm="ortho")
    assert "orthogonalize=False" in p.explain()
    z = p.backward(p.forward(r))  # idctn with the same orthogonalize: back to the input
    assert ulps(gathered(z), gr) <= NUMPY_ULPS
    mesh.free()


def test_documented_differences(comm):
    """Where pyshard.fft differs from numpy/scipy on purpose (docs/fft.md): repeated axes and
    axes=() raise ValueError; the scipy.fft-only names take None entries in s as the
    default length; hfft writes into out= (numpy's hfft ignores it)."""
    mesh = ps.Mesh(comm, (comm.size,))
    g = global_array((6, 5, 4), C, seed=4)
    x = ps.distribute(g, mesh, [Shard(1)])
    gr = g.real.copy()
    r = ps.distribute(gr, mesh, [Shard(0)])
    with pytest.raises(ValueError, match="unique"):
        pf.fft2(x, axes=(1, 1))
    with pytest.raises(ValueError, match="at least one axis"):
        pf.fftn(x, axes=())
    # numpy's rfftn raises IndexError for no axes, scipy's ValueError: both catch it
    for exc, mod in ((IndexError, np.fft), (ValueError, sf)):
        with pytest.raises(exc):
            mod.rfftn(gr, axes=())
        with pytest.raises(exc, match="at least one axis"):
            pf.rfftn(r, axes=())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = pf.hfftn(x, s=(None, 7), axes=(0, 2))
        w = pf.dctn(r, type=3, s=(3, None), axes=(0, 1))
    assert ulps(gathered(y), sf.hfftn(g, s=(6, 7), axes=(0, 2))) <= NUMPY_ULPS
    assert ulps(gathered(w), sf.dctn(gr, type=3, s=(3, 5), axes=(0, 1))) <= NUMPY_ULPS
    y = pf.hfft(x, axis=0)
    o = out_like(y, R)
    assert pf.hfft(x, axis=0, out=o) is o
    np.testing.assert_array_equal(o.local, y.local)
    mesh.free()


def test_hermitian_partial_input(comm):
    """Partial("sum") input to hfftn/ihfftn stays Partial (both are linear over the reals):
    reduced, it is the transform of the sum."""
    from oracle import contributions

    two = [m for m in MESHES.get(comm.size, []) if len(m) == 2]
    ms = two[0] if two else (1, comm.size)
    mesh = ps.Mesh(comm, ms)
    shape = (6, 5)
    for kind, dtype in (("hfftn", C), ("ihfftn", R)):
        parts, total = contributions(shape, dtype, ms[0], "sum", seed=5)
        pl = [ps.Partial("sum"), Shard(0)]
        lay = ps.Layout(shape, dtype, ms, pl)
        local = np.ascontiguousarray(parts[mesh.coords[0]][lay.box(mesh.coords)])
        x = ps.from_local(local, mesh, pl, global_shape=shape)
        y = getattr(pf, kind)(x)
        assert y.placements == (ps.Partial("sum"), Shard(0))
        assert ulps(gathered(y), getattr(sf, kind)(total)) <= NUMPY_ULPS, kind
    mesh.free()


class _Sub(np.ndarray):
    """An ndarray subclass (numpy.memmap, numpy.matrix)."""


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("case", ["read-only", "subclass", "sharded read-only", "sharded cast"])
def test_out_refused_on_one_rank_raises_everywhere(comm, case):
    """An out= that one rank alone cannot take (read-only, an ndarray subclass; a ShardedArray
    out whose local array was made read-only there): every rank raises the same ValueError
    before any exchange (that rank raised alone, after its peers had entered the first
    transpose: they hung); the next call runs."""
    p, r = comm.size, comm.rank
    mesh = ps.Mesh(comm, (p,))
    g = global_array((2 * p + 1, 6), C, seed=9)
    x = ps.distribute(g, mesh, [Shard(0)])
    want = np.fft.fftn(g)
    bad = p - 1
    if case.startswith("sharded"):
        dt = Z if case == "sharded cast" else C
        out = ps.distribute(np.zeros(g.shape, dt), mesh, [Shard(1)])
        fresh = ps.distribute(np.zeros(g.shape, dt), mesh, [Shard(1)])
        if r == bad:
            out.local.setflags(write=False)
    else:
        shape = pf.fftn(x).local.shape
        out = np.zeros(shape, C)
        fresh = np.zeros(shape, C)
        if r == bad:
            out = out.view(_Sub) if case == "subclass" else out
            out.setflags(write=case == "subclass")
    before = ps.comm_stats()
    with pytest.raises(ValueError, match="out") as e:
        pf.fftn(x, out=out, placements=[Shard(1)] if case.startswith("sharded") else None)
    assert collectives_since(before) == 0
    assert f"rank {bad}" in str(e.value), str(e.value)
    msgs = comm.allgather(str(e.value).split("; this rank")[0])
    assert len(set(msgs)) == 1, msgs
    if r == bad:
        assert ("read-only" if case != "subclass" else "_Sub") in str(e.value), str(e.value)
    y = pf.fftn(x, out=fresh, placements=[Shard(1)] if case.startswith("sharded") else None)
    got = y if isinstance(y, ps.ShardedArray) else None
    if got is not None:
        full = got.redistribute([Replicate()]).local
        assert np.allclose(full, want.astype(full.dtype), rtol=1e-5, atol=1e-3)
    mesh.free()



@pytest.mark.mpi(min_size=2)
def test_out_on_another_mesh_of_the_same_shape_raises(comm):
    """out= on a mesh of the same shape over the ranks in another order: its layout reads the
    same, but its shards lie on other ranks, so writing each rank's shard into its local array
    would put them in the wrong places: every rank raises, for the functions' ShardedArray
    out= and FFTPlan.forward's, before communicating; on the input's own mesh it is written."""
    mesh = ps.Mesh(comm, (comm.size,))
    rev = comm.Split(0, comm.size - 1 - comm.rank)
    other = ps.Mesh(rev, (comm.size,))
    g = global_array((8, 5, 4), C, seed=11)
    gr = g.real.copy()
    x = ps.distribute(g, mesh, [Shard(0)])
    r = ps.distribute(gr, mesh, [Shard(0)])
    for call, ref, src in ((pf.fftn, np.fft.fftn, x), (pf.dctn, sf.dctn, r)):
        y = call(src)
        o = ps.distribute(np.zeros(y.shape, y.dtype), other, y.layout.placements,
                          y.layout.sizes)
        assert o.layout == y.layout  # the same layout, on other ranks
        before = ps.comm_stats()
        with pytest.raises(ValueError, match="another mesh"):
            call(src, out=o)
        with pytest.raises(ValueError, match="another mesh"):
            pf.plan(src.layout, call.__name__).forward(src, out=o)
        assert collectives_since(before) == 0
        mine = ps.distribute(np.zeros(y.shape, y.dtype), mesh, y.layout.placements,
                             y.layout.sizes)
        assert call(src, out=mine) is mine
        assert ulps(gathered(mine), ref(g if src is x else gr)) <= NUMPY_ULPS
    other.free()
    rev.Free()
    mesh.free()


@pytest.mark.parametrize("call", ["fftn", "forward", "backward", "out"])
def test_a_replaced_local_is_refused(comm, call):
    """A .local replaced by an array of another dtype of the same item size (float64 ->
    int64) is refused, not transformed as the layout's dtype (every call returned a wrong
    result). Alone on one rank and without the validation mode, the others wait in the
    exchange (tests/mpi/test_validate.py: with it, every rank raises): one rank here."""
    if comm.size != 1:
        pytest.skip("one rank: with peers, only the validation mode makes them raise too")
    mesh = ps.Mesh(comm, (1,))
    g = np.arange(24.0).reshape(4, 6)
    x = ps.distribute(g, mesh, [Shard(0)])
    p = pf.plan(x.layout, "fftn")
    if call == "backward":
        x = p.forward(x)
        x.local = x.local.astype(np.complex64)
    else:
        x.local = x.local.astype(np.int64)
    run = {"fftn": lambda: pf.fftn(x), "forward": lambda: p.forward(x),
           "backward": lambda: p.backward(x),
           "out": lambda: pf.fftn(x, out=ps.distribute(np.zeros((4, 6), complex), mesh,
                                                       [Shard(0)]))}[call]
    with pytest.raises(ValueError, match="was .local replaced"):
        run()
    mesh.free()


@pytest.mark.parametrize("op", ["max", "min", "sum"])
@pytest.mark.parametrize("kind", ["fftn", "rfftn", "dctn"])
def test_backward_of_a_partial_input(comm, op, kind):
    """A plan of a real input laid out Partial('max'|'min'): its backward is complex for
    fftn, which those ops cannot hold, so that mesh dim ends Replicate (the reduced value);
    plan.backward raised "Partial('max') is undefined for complex dtype". Real inverses keep
    the input's placements."""
    mesh = ps.Mesh(comm, (comm.size,))
    g = np.arange(12.0).reshape(3, 4) - 5
    x = ps.distribute(g, mesh, [ps.Partial(op)])
    p = pf.plan(x.layout, kind)
    y = p.forward(x)
    ref = {"fftn": np.fft.fftn, "rfftn": np.fft.rfftn, "dctn": sf.dctn}[kind](g)
    np.testing.assert_allclose(y.full(), ref, atol=1e-9)
    back = p.backward(y)
    complex_back = kind == "fftn"
    want = [Replicate()] if complex_back and op != "sum" else [ps.Partial(op)]
    assert list(back.placements) == want
    assert back.dtype == (np.complex128 if complex_back else np.float64)
    np.testing.assert_allclose(back.full(), g, atol=1e-9)
    mesh.free()
