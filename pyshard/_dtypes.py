"""The dtypes pyshard moves, reduces and checkpoints: numpy's numbers and bool, and the
low-precision floats of ``ml_dtypes`` (bfloat16, the float8, float6 and float4 formats), which
numpy holds as extension dtypes once ml_dtypes is imported.

ml_dtypes is optional (``pip install 'pyshard[ml]'``): nothing here imports it until a name,
an array or a DLPack tensor asks for one of its dtypes, and without it those raise a
TypeError naming the extra. Also here: the dtype a reduction accumulates in (float32 for
float16 and every ml_dtypes float, rounded once at the end, to nearest even), the identity of
each reduction, the names a checkpoint manifest records, the DLPack type codes of these
dtypes, and casts between them and float32 written with array-module operations only
(numpy's or cupy's), which the CUDA path uses because cupy cannot cast these dtypes itself.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import numpy as np

from ._optional import OptionalModule

# ml_dtypes' floating formats pyshard takes (its sub-byte integers int2/int4/uint2/uint4 are
# refused: a float32 accumulator would not give their wrap-around sums)
ML_FLOATS = (
    "bfloat16",
    "float8_e3m4",
    "float8_e4m3",
    "float8_e4m3b11fnuz",
    "float8_e4m3fn",
    "float8_e4m3fnuz",
    "float8_e5m2",
    "float8_e5m2fnuz",
    "float8_e8m0fnu",
    "float6_e2m3fn",
    "float6_e3m2fn",
    "float4_e2m1fn",
)

INSTALL = "pip install 'pyshard[ml]' (or pip install ml_dtypes)"

# DLPack's type codes (dlpack.h 1.1+) of the ml_dtypes formats it names with whole bytes per
# element; float6 and float4 (codes 15-17) are packed below a byte there and are not taken
DLPACK_CODES: Dict[int, str] = {
    4: "bfloat16",
    7: "float8_e3m4",
    8: "float8_e4m3",
    9: "float8_e4m3b11fnuz",
    10: "float8_e4m3fn",
    11: "float8_e4m3fnuz",
    12: "float8_e5m2",
    13: "float8_e5m2fnuz",
    14: "float8_e8m0fnu",
}
DLPACK_UINT = 1

ml_dtypes = OptionalModule("ml_dtypes")
"""The ml_dtypes module, or None when it is not installed."""


class NeedsMLDtypes(TypeError):
    """An ml_dtypes dtype was asked for where ml_dtypes is not installed."""


def missing(dtype_name: str, what: str) -> NeedsMLDtypes:
    """The error for an ml_dtypes dtype asked for where ml_dtypes is not installed."""
    return NeedsMLDtypes(f"{what}: {dtype_name} needs the ml_dtypes package: {INSTALL}")


def ml_dtype(dtype_name: str, what: str = "dtype") -> np.dtype:
    """The numpy dtype of ml_dtypes' format ``dtype_name`` (imports ml_dtypes), or TypeError."""
    md = ml_dtypes()
    if md is None or not hasattr(md, dtype_name):
        raise missing(dtype_name, what)
    return np.dtype(getattr(md, dtype_name))


def is_ml_float(dt: np.dtype) -> bool:
    """Is ``dt`` one of ml_dtypes' floating formats (bfloat16, float8_*, ...)?"""
    return dt.name in ML_FLOATS and _from_ml(dt)


def sum_zero(dt: np.dtype) -> Any:
    """The identity of a sum in ``dt``, what a ``Partial("sum")`` rank that holds nothing
    holds: IEEE's -0.0 for floating and complex dtypes (``x + -0.0`` is ``x`` for every
    ``x``; ``+0.0`` turned a ``-0.0`` into ``+0.0``), 0 otherwise."""
    if dt.kind == "c":
        return dt.type(complex(-0.0, -0.0))
    if dt.kind == "f" or is_ml_float(dt):
        return dt.type(-0.0)
    return dt.type(0)


def _from_ml(dt: np.dtype) -> bool:
    return getattr(dt.type, "__module__", "").split(".")[0] == "ml_dtypes"


def is_ml(dt: np.dtype) -> bool:
    """Is ``dt`` any ml_dtypes dtype (its floats or its sub-byte integers)?"""
    return _from_ml(dt)


def resolve(obj: object, what: str = "dtype") -> np.dtype:
    """``np.dtype(obj)``, where a name of an ml_dtypes float (``"bfloat16"``) imports ml_dtypes
    first, or raises TypeError naming the extra to install."""
    if isinstance(obj, str) and obj in ML_FLOATS:
        return ml_dtype(obj, what)
    return np.dtype(obj)  # type: ignore[call-overload]


def name(dt: np.dtype) -> str:
    """The string that names ``dt`` in a checkpoint manifest and in cache keys: numpy's
    ``dtype.str`` (``"<f4"``) for its own dtypes, the ml_dtypes name (``"bfloat16"``)
    otherwise (their ``dtype.str`` is a void ``"<V2"`` shared by several formats)."""
    return dt.name if is_ml(dt) else dt.str


def accumulator(dt: np.dtype) -> np.dtype:
    """The dtype a reduction of ``dt`` runs in: float32 for float16 and the ml_dtypes floats
    (one rounding to ``dt`` at the end, to nearest even), ``dt`` itself otherwise."""
    if dt == np.float16 or is_ml_float(dt):
        return np.dtype(np.float32)
    return dt


def has_zero(dt: np.dtype) -> bool:
    """Does ``dt`` hold a zero? (float8_e8m0fnu, a scale format of powers of two, does not.)"""
    return float(np.zeros((), np.float32).astype(dt)) == 0.0


def identity(dt: np.dtype, op: str) -> Any:
    """The identity of reduction ``op`` in ml_dtypes float ``dt``: 0 for sum, the lowest value
    for max (-inf where the format has it), the highest for min."""
    if op in ("sum", "avg"):
        return dt.type(0)
    fi = ml_dtypes().finfo(dt)
    inf = float(np.array(np.inf, np.float32).astype(dt))
    if inf == np.inf:
        return dt.type(-np.inf if op == "max" else np.inf)
    return dt.type(fi.min if op == "max" else fi.max)


def word(dt: np.dtype) -> np.dtype:
    """The unsigned integer dtype of ``dt``'s size, whose view carries its bits unchanged."""
    return np.dtype(f"u{dt.itemsize}")


def dlpack_code(dt: np.dtype) -> Optional[Tuple[int, int]]:
    """DLPack's (type code, bits) of ml_dtypes float ``dt``; None where DLPack has none."""
    for code, n in DLPACK_CODES.items():
        if n == dt.name:
            return code, 8 * dt.itemsize
    return None


# ----------------------------------------------------------------------------- casts
#
# Written with array-module operations that numpy and cupy share (view, astype, shifts,
# searchsorted, where, take), so the same code runs on a GPU, where cupy cannot cast these
# dtypes, and under test on the host, against ml_dtypes' own casts.

_tables: Dict[Tuple[str, Any], Any] = {}


def widen(words: Any, dt: np.dtype, xp: Any) -> Any:
    """float32 values of ``words`` (an unsigned-int view of an array of ml_dtypes float
    ``dt``), exactly."""
    if dt.itemsize == 2:  # bfloat16: the top half of a float32
        return (words.astype(np.uint32) << np.uint32(16)).view(np.float32)
    return xp.take(_table(dt, xp, "values"), words.astype(np.intp))


def narrow(f: Any, dt: np.dtype, xp: Any) -> Any:
    """float32 (or float64) array ``f`` rounded to ml_dtypes float ``dt``, to nearest even as
    ml_dtypes' astype rounds (overflow to inf, NaN or the largest value, as the format does);
    the result is an unsigned-int view (``word(dt)``) of the rounded values."""
    if dt.itemsize == 2:
        return _narrow_bf16(f.astype(np.float32, copy=False), xp)
    return _narrow_8bit(f, dt, xp)


def _narrow_bf16(f: Any, xp: Any) -> Any:
    u = f.view(np.uint32)
    lsb = (u >> np.uint32(16)) & np.uint32(1)
    # round to nearest even on the top 16 bits; the carry runs into the exponent (to inf)
    r = (u + (np.uint32(0x7FFF) + lsb)) >> np.uint32(16)
    nan = (u >> np.uint32(16)) | np.uint32(0x0040)  # a quiet NaN, sign kept
    return xp.where(xp.isnan(f), nan, r).astype(np.uint16)


def _narrow_8bit(f: Any, dt: np.dtype, xp: Any) -> Any:
    x = f.astype(np.float64)  # exact differences below, even at float8_e8m0fnu's 2**128
    vals = _table(dt, xp, "pos_values")  # non-negative finite values, sorted, + overflow
    codes = _table(dt, xp, "pos_codes")
    even = _table(dt, xp, "pos_even")
    ax = xp.abs(x)
    n = int(vals.shape[0])
    hi = xp.clip(xp.searchsorted(vals, ax, side="left"), 0, n - 1)
    lo = xp.clip(hi - 1, 0, n - 1)
    vlo = xp.take(vals, lo)
    vhi = xp.take(vals, hi)
    dlo = ax - vlo
    dhi = vhi - ax
    up = (dhi < dlo) | ((dhi == dlo) & xp.take(even, hi))
    pick = xp.where(ax <= vlo, lo, xp.where(up, hi, lo))
    pos = xp.take(codes, pick)
    neg = xp.take(_table(dt, xp, "negate"), pos)
    out = xp.where(xp.signbit(x), neg, pos)
    return xp.where(xp.isnan(x), _table(dt, xp, "nan"), out).astype(np.uint8)


def _table(dt: np.dtype, xp: Any, what: str) -> Any:
    key = (f"{dt.name}:{what}", xp)
    t = _tables.get(key)
    if t is None:
        t = xp.asarray(_host_tables(dt)[what])
        _tables[key] = t
    return t


def _host_tables(dt: np.dtype) -> Dict[str, np.ndarray]:
    """An 8-bit format's lookup tables, built from ml_dtypes' own values on the host."""
    codes = np.arange(256, dtype=np.uint8)
    values = codes.view(dt).astype(np.float32)
    v64 = values.astype(np.float64)
    canonical = values.astype(dt).view(np.uint8) == codes  # float6/float4 use low bits only
    ok = canonical & np.isfinite(v64) & (v64 >= 0) & ~((v64 == 0) & np.signbit(v64))
    order = np.argsort(v64[ok], kind="stable")
    pos_vals = v64[ok][order]
    pos_codes = codes[ok][order]
    # the value one step past the largest, as if the exponent went on: ties and beyond
    # round to what the format gives on overflow (inf, NaN, or the largest value)
    top = float(pos_vals[-1])
    nmant = int(ml_dtypes().finfo(dt).nmant)
    step = 2.0 ** (np.floor(np.log2(top)) - nmant)
    over = np.array([np.float32(3e38)]).astype(dt).view(np.uint8)[0]
    pos_vals = np.append(pos_vals, top + step)
    pos_codes = np.append(pos_codes, over)
    if nmant:  # ties to the even mantissa; past the largest, the next code flips its parity
        even = (pos_codes & 1) == 0
        even[-1] = not bool(pos_codes[-2] & 1)
    else:  # no mantissa (float8_e8m0fnu, powers of two): ties round up, as ml_dtypes does
        even = np.ones(len(pos_codes), bool)
    # the code of -v for each code of v (+0 where the format has no negative zero)
    negate = (-values).astype(dt).view(np.uint8)
    nan = np.array([np.float32(np.nan)]).astype(dt).view(np.uint8)[0]
    return {
        "values": values,
        "pos_values": pos_vals,
        "pos_codes": pos_codes.astype(np.uint8),
        "pos_even": even,
        "negate": negate,
        "nan": np.uint8(nan),
    }
