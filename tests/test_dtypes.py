"""bfloat16 and float8 (ml_dtypes) without MPI: which dtypes are taken, the casts the CUDA path
uses (checked against ml_dtypes' own on the host), DLPack in and out, the errors without
ml_dtypes, the .npy header, and how far a step-by-step bfloat16 sum drifts from pyshard's
float32 accumulation rounded once."""

from __future__ import annotations

import io

import numpy as np
import pytest

import pyshard as ps
from pyshard import _backend as bk
from pyshard import _dtypes
from pyshard.checkpoint import manifest

md = pytest.importorskip("ml_dtypes", reason="ml_dtypes (the extra pyshard[ml]) not installed")

FORMATS = [n for n in _dtypes.ML_FLOATS if hasattr(md, n)]
ZERO_FORMATS = [n for n in FORMATS if _dtypes.has_zero(np.dtype(getattr(md, n)))]


class Producer:
    """A DLPack producer of ``words`` (a numpy array) that tags its capsules with DLPack type
    ``code`` = (code, bits), as torch does for bfloat16 (4, 16) or complex32 (5, 32)."""

    def __init__(self, words, code):
        self.words, self.code = words, code

    def __dlpack_device__(self):
        return self.words.__dlpack_device__()

    def __dlpack__(self, *args, **kwargs):
        cap = self.words.__dlpack__(*args, **kwargs)
        t = bk.dltype(cap)
        t.code, t.bits = self.code
        return cap


@pytest.fixture
def without_ml_dtypes(monkeypatch):
    """pyshard as it behaves where ml_dtypes is not installed."""
    monkeypatch.setattr(_dtypes.ml_dtypes, "module", None)
    monkeypatch.setattr(_dtypes.ml_dtypes, "tried", True)


# ----------------------------------------------------------------------------- which dtypes


@pytest.mark.parametrize("name", FORMATS)
def test_ml_floats_are_taken_by_dtype_and_by_name(name):
    dt = np.dtype(getattr(md, name))
    for spec in (dt, name, getattr(md, name)):
        lay = ps.Layout((5, 3), spec, (1,), [ps.Shard(0)])
        assert lay.dtype == dt
    assert _dtypes.accumulator(dt) == np.float32


def test_float8_formats_are_distinct_layouts():
    """dtype.str is "<V1" for most float8 formats: the layout key must not confuse them."""
    a = ps.Layout((4,), md.float8_e4m3fn, (1,), [ps.Replicate()])
    b = ps.Layout((4,), md.float8_e4m3fnuz, (1,), [ps.Replicate()])
    assert a != b and a.dtype != b.dtype
    assert _dtypes.accumulator(np.dtype(np.float16)) == np.float32
    assert _dtypes.accumulator(np.dtype(np.float64)) == np.float64


def test_sub_byte_integers_and_objects_are_refused():
    with pytest.raises(TypeError, match="sub-byte integers"):
        ps.Layout((4,), md.int4, (1,), [ps.Replicate()])
    with pytest.raises(TypeError, match="numeric and bool arrays only"):
        ps.Layout((4,), object, (1,), [ps.Replicate()])


def test_sum_needs_a_zero():
    with pytest.raises(ValueError, match="has none"):
        ps.Layout((4,), md.float8_e8m0fnu, (2,), [ps.Partial("sum")])
    ps.Layout((4,), md.float8_e8m0fnu, (2,), [ps.Partial("max")])  # max needs no zero
    ps.Layout((4,), md.bfloat16, (2,), [ps.Partial("avg")])  # a floating dtype


@pytest.mark.parametrize("name", FORMATS)
def test_identities(name):
    dt = np.dtype(getattr(md, name))
    fi = md.finfo(dt)
    lo, hi = (float(_dtypes.identity(dt, op)) for op in ("max", "min"))
    assert lo <= float(fi.min) and hi >= float(fi.max)
    assert not np.isnan(lo) and not np.isnan(hi)


def test_without_ml_dtypes_the_error_names_the_extra(without_ml_dtypes):
    with pytest.raises(TypeError, match=r"pip install 'pyshard\[ml\]'"):
        ps.Layout((4,), "bfloat16", (1,), [ps.Replicate()])
    with pytest.raises(TypeError, match=r"pyshard\[ml\].*"):
        manifest.dtype_of({"dtype": "float8_e4m3fn"})
    bf16 = Producer(np.zeros(4, np.uint16), (4, 16))  # as torch hands out a bfloat16 tensor
    with pytest.raises(TypeError, match=r"global_array: bfloat16 needs .*pyshard\[ml\]"):
        bk.as_array(bf16, "global_array")
    # numpy's own dtypes are unaffected
    assert ps.Layout((4,), "float16", (1,), [ps.Replicate()]).dtype == np.float16


# ----------------------------------------------------------------------------- DLPack


@pytest.mark.parametrize("name", ["bfloat16", "float8_e4m3fn", "float8_e5m2"])
def test_dlpack_round_trip_is_zero_copy(name):
    a = np.arange(24, dtype=np.float32).reshape(4, 6).astype(getattr(md, name))
    p = ps.to_dlpack(a)
    code = dict((v, k) for k, v in _dtypes.DLPACK_CODES.items())[name]
    cap = p.__dlpack__()
    assert (bk.dltype(cap).code, bk.dltype(cap).bits) == (code, 8 * a.itemsize)
    del cap
    b = bk.as_array(ps.to_dlpack(a), "x")  # in through DLPack as torch would hand it
    assert b.dtype == a.dtype and np.shares_memory(a, b) and np.array_equal(a, b)
    assert ps.to_dlpack(np.zeros(3)) is not None  # numpy's own dtypes export themselves


def test_dlpack_dtypes_numpy_cannot_hold_keep_a_clear_error():
    complex32 = Producer(np.zeros(4, np.uint32), (5, 32))  # torch.complex32
    with pytest.raises(TypeError, match=r"code 5, bits 32.*numeric, bool, bfloat16 and float8"):
        bk.as_array(complex32, "x")


# ----------------------------------------------------------------------------- casts


def _inputs(dt):
    """Every value of ``dt``, every midpoint between neighbours and its float32 neighbours,
    overflow, NaN, signed zeros, and random float32 values over the format's range."""
    rng = np.random.default_rng(7)
    words = np.arange(1 << (8 * dt.itemsize), dtype=_dtypes.word(dt))
    vals = words.view(dt).astype(np.float32)
    v = np.unique(vals[np.isfinite(vals)].astype(np.float64))
    mid = ((v[:-1] + v[1:]) / 2).astype(np.float32)
    top = float(np.max(np.abs(v)))
    xs = [
        v.astype(np.float32),
        mid,
        np.nextafter(mid, np.float32(np.inf)),
        np.nextafter(mid, np.float32(-np.inf)),
        np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 3e38, -3e38, 1e-45, -1e-45], np.float32),
        (rng.standard_normal(20000) * min(top, 1e30) / 4).astype(np.float32),
    ]
    if dt.itemsize == 2:  # every float32 bit pattern class: random words
        xs.append(rng.integers(0, 1 << 32, 100000, dtype=np.uint64).astype(np.uint32).view("f4"))
    return words, np.concatenate(xs)


def _same(a, b):
    fa, fb = a.astype(np.float32), b.astype(np.float32)
    return (fa.view(np.uint32) == fb.view(np.uint32)) | (np.isnan(fa) & np.isnan(fb))


@pytest.mark.parametrize("name", FORMATS)
def test_word_casts_equal_ml_dtypes(name):
    """widen / narrow (the CUDA path's casts) give ml_dtypes' values and its round to nearest
    even, bit for bit, on every value, every tie and beyond the range."""
    dt = np.dtype(getattr(md, name))
    words, xs = _inputs(dt)
    assert np.array_equal(_dtypes.widen(words, dt, np), words.view(dt).astype(np.float32),
                          equal_nan=True)  # fmt: skip
    if not _dtypes.has_zero(dt):  # float8_e8m0fnu: exact values only
        xs = xs[np.isin(xs, words.view(dt).astype(np.float32))]
    with np.errstate(all="ignore"):
        want = xs.astype(dt)
    got = _dtypes.narrow(xs, dt, np).view(dt)
    bad = ~_same(got, want)
    assert not bad.any(), (xs[bad][:5], got[bad][:5], want[bad][:5])


def test_device_astype_path_on_the_host(monkeypatch):
    """_backend.astype's GPU branch, with numpy standing in for cupy."""
    monkeypatch.setattr(bk.cupy, "module", np)
    monkeypatch.setattr(bk.cupy, "tried", True)
    for name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        dt = np.dtype(getattr(md, name))
        x = np.random.default_rng(3).standard_normal((5, 7)).astype(np.float32) * 30
        with np.errstate(all="ignore"):
            low = bk.astype(x, dt)
            assert low.dtype == dt and _same(low, x.astype(dt)).all()
            up = bk.astype(low, np.float32)
            assert up.dtype == np.float32 and _same(up, low.astype(np.float32)).all()
            out = np.empty((5, 7), dt)
            bk.copy_cast(out, x)
            assert _same(out, x.astype(dt)).all()


# ----------------------------------------------------------------------------- checkpoints


def test_npy_header_names_the_dtype_and_numpy_loads_it():
    a = (np.arange(12, dtype=np.float32) / 4).reshape(3, 4).astype(md.bfloat16)
    bio = io.BytesIO(manifest.npy_header(a.shape, a.dtype) + a.tobytes())
    assert b"'descr': 'bfloat16'" in bio.getvalue()[:128]
    b = np.load(bio)
    assert b.dtype == md.bfloat16 and np.array_equal(a, b)
    assert manifest.dtype_str(a.dtype) == "bfloat16"
    assert manifest.dtype_str(np.dtype(np.float32)) == "<f4"  # numpy's own: as before


# ----------------------------------------------------------------------------- drift


def drift(k, n=1 << 14, seed=18):
    """``k`` contributions of n standard normal bfloat16 values: the normwise relative error
    of pyshard's sum (float32, rounded once) and of a step-by-step bfloat16 sum (a ring that
    rounds after every addition), against the exact sum; and the share of elements where
    the two differ."""
    bf = np.dtype(md.bfloat16)
    parts = np.random.default_rng(seed).standard_normal((k, n)).astype(bf)
    exact = parts.astype(np.float64).sum(0)
    once = parts.astype(np.float32).sum(0).astype(bf)
    step = parts[0]
    for p in parts[1:]:
        step = (step.astype(np.float32) + p.astype(np.float32)).astype(bf)

    def err(x):
        return float(np.linalg.norm(x.astype(np.float64) - exact) / np.linalg.norm(exact))

    return err(once), err(step), float(np.mean(once != step)), once, exact


@pytest.mark.parametrize("k", [8, 64])
def test_float32_accumulation_beats_a_bfloat16_ring(k):
    """The numbers docs/site/dtypes.md quotes (n = 16384, seed 18): 8 contributions: 1.65e-3
    vs 3.74e-3 (2.3x, 52% of elements differ), 64: 1.65e-3 vs 9.54e-3 (5.8x, 80% differ);
    the sum rounded once is the exact sum correctly rounded on every element."""
    once, step, differ, got, exact = drift(k)
    print(f"\n[drift] {k} contributions: rounded once {once:.2e}, step by step {step:.2e} "
          f"({step / once:.1f}x), {100 * differ:.0f}% of elements differ")  # fmt: skip
    assert once < 2.0e-3  # about a quarter of a bfloat16 ulp on average
    assert step > (2.0 if k == 8 else 5.0) * once
    assert np.array_equal(got, exact.astype(np.float32).astype(md.bfloat16))
