"""Helpers shared by the GPU tests; importing this module never imports cupy."""

from __future__ import annotations

import pyshard as ps

# the dtypes the GPU tests sweep, and bfloat16 where cupy can hold it (cupy >= 14 with
# ml_dtypes; no cupy release holds float8: docs/site/dtypes.md)
DTYPES = ["float16", "float32", "float64", "complex64", "int32", "bool"]


def _cupy_holds(name):
    try:
        import cupy as cp
        import ml_dtypes

        cp.zeros(1, getattr(ml_dtypes, name)).view(cp.uint8)
        return True
    except Exception:  # noqa: BLE001 - no cupy, no GPU, no ml_dtypes, or no such dtype in cupy
        return False


if _cupy_holds("bfloat16"):
    DTYPES.append("bfloat16")


def skip_reason():
    """Why the GPU tests cannot run here, or None when they can."""
    if ps.cuda_available():
        return None
    info = ps.build_info()
    why = []
    if info["cuda"] is None:
        why.append("pyshard's core was built without CUDA")
    if not info["cuda_device"]:
        why.append("no CUDA GPU or driver")
    try:
        import cupy  # noqa: F401
    except Exception:  # noqa: BLE001 - not installed, or no CUDA libraries for it
        why.append("cupy does not import")
    return "GPU tests: " + ("; ".join(why) or "pyshard.cuda_available() is False")


def counts_since(before):
    now = ps.comm_stats()
    return {k: v - before.get(k, 0) for k, v in now.items() if v - before.get(k, 0)}


def with_transport(base, transport):
    """The exact counters a GPU call bumps: ``base`` (collectives by name) plus one
    "staged" or "device_direct" per collective."""
    out = dict(base)
    n = sum(base.values())
    if n:
        out["staged" if transport == "staged" else "device_direct"] = n
    return out


def split_counts(got):
    """(collectives by name, {"staged": n, "device_direct": n} parts) of a counts diff."""
    paths = {k: got[k] for k in ("staged", "device_direct") if k in got}
    return {k: v for k, v in got.items() if k not in paths}, paths


def to_device(cp, x):
    """A host ShardedArray's copy on the GPU, in the same layout (no communication)."""
    return ps.from_local(
        cp.asarray(x.local), x.mesh, list(x.placements), global_shape=x.global_shape,
        sizes=x.layout.sizes or None,
    )  # fmt: skip
