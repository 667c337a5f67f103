"""bfloat16 and float8 across ranks: every Partial reduction equals float32
accumulation rounded once, bit for bit, and a step-by-step bfloat16 sum of the same data
drifts; checkpoints save, load into another layout, name the dtype, and stay numpy-readable.

Runs at any communicator size; skipped where ml_dtypes (the extra pyshard[ml]) is missing.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from oracle import reduce_once
from test_checkpoint import shared_dir  # noqa: F401 - a fixture

import pyshard as ps
from pyshard import Partial, Replicate, Shard

md = pytest.importorskip("ml_dtypes", reason="ml_dtypes (the extra pyshard[ml]) not installed")

pytestmark = pytest.mark.mpi

FORMATS = ["bfloat16", "float8_e4m3fn", "float8_e5m2"]


def parts_of(p, shape, dtype, seed=0):
    """Every rank's contribution, the same on every rank: standard normal values on a grid of
    2**-7 (so that their float32 sums are exact whatever order MPI adds them in), rounded to
    ``dtype``."""
    rng = np.random.default_rng(seed)
    # (+ 0.0: no negative zeros, which a one-rank "sum" keeps and numpy's sum does not)
    return [
        (np.round(rng.standard_normal(shape) * 128) / 128 + 0.0).astype(dtype) for _ in range(p)
    ]


def bits(a):
    return np.ascontiguousarray(a).view(f"u{a.dtype.itemsize}")


@pytest.mark.parametrize("op", ["sum", "avg", "max", "min"])
@pytest.mark.parametrize("name", FORMATS)
def test_reduction_is_float32_rounded_once(comm, name, op):
    dt = np.dtype(getattr(md, name))
    mesh = ps.Mesh(comm, (comm.size,))
    shape = (37, 11)
    parts = parts_of(comm.size, shape, dt, seed=len(name))
    want = reduce_once(np.stack(parts), op, dt)
    for dst in ([Shard(0)], [Shard(1)], [Replicate()]):
        x = ps.from_local(parts[comm.rank], mesh, [Partial(op)], global_shape=shape)
        y = x.redistribute(dst)
        assert y.local.dtype == dt
        assert np.array_equal(bits(y.local), bits(want[y.box])), (name, op, dst)


def test_bfloat16_sum_drift(comm):
    """The sum pyshard gives against a ring that rounds to bfloat16 after every addition
    (as a bfloat16 allreduce does), on the same contributions: pyshard's is the exact sum
    correctly rounded; the ring's drifts once there are three or more ranks."""
    dt = np.dtype(md.bfloat16)
    p = comm.size
    mesh = ps.Mesh(comm, (p,))
    shape = (128, 128)
    parts = parts_of(p, shape, dt, seed=18)
    got = ps.from_local(parts[comm.rank], mesh, [Partial("sum")], global_shape=shape).full()
    exact = np.stack(parts).astype(np.float64).sum(0)
    assert np.array_equal(bits(got), bits(exact.astype(np.float32).astype(dt)))
    step = parts[0]
    for q in parts[1:]:
        step = (step.astype(np.float32) + q.astype(np.float32)).astype(dt)

    def err(a):
        return float(np.linalg.norm(a.astype(np.float64) - exact) / np.linalg.norm(exact))

    differ = float(np.mean(bits(step) != bits(got)))
    if comm.rank == 0:
        print(f"\n[drift] bfloat16 sum over {p} rank(s): pyshard {err(got):.2e}, step by step "
              f"{err(step):.2e}, {100 * differ:.0f}% of elements differ")  # fmt: skip
    if p >= 3:
        assert differ > 0.01 and err(step) > err(got)
    else:  # one addition: one rounding either way
        assert differ == 0


def test_partial_max_from_a_shard_fills_with_the_identity(comm):
    """Shard -> Partial(max / min) fills the rest of the array with the identity (-inf, or
    the lowest value in a format without infinities), so the reduction gives the array."""
    mesh = ps.Mesh(comm, (comm.size,))
    for name in FORMATS:
        dt = np.dtype(getattr(md, name))
        g = parts_of(1, (9, 4), dt, seed=5)[0]
        x = ps.distribute(g, mesh, [Shard(0)])
        for op in ("max", "min"):
            assert np.array_equal(bits(x.redistribute([Partial(op)]).full()), bits(g)), (name, op)


def test_checkpoint_round_trip(comm, shared_dir):  # noqa: F811 - the fixture
    mesh = ps.Mesh(comm, (comm.size,))
    path = os.path.join(shared_dir, "ml")
    g = {
        n: parts_of(1, (13, 7), np.dtype(getattr(md, n)), seed=i)[0] for i, n in enumerate(FORMATS)
    }
    arrays = {n: ps.distribute(a, mesh, [Shard(0)]) for n, a in g.items()}
    # a Partial(sum) array is saved reduced: float32 sum rounded once
    parts = parts_of(comm.size, (6, 5), np.dtype(md.bfloat16), seed=9)
    arrays["partial"] = ps.from_local(parts[comm.rank], mesh, [Partial("sum")], global_shape=(6, 5))
    g["partial"] = reduce_once(np.stack(parts), "sum", np.dtype(md.bfloat16))
    ps.save(path, arrays)
    back = ps.load(path, mesh, {n: [Shard(1)] for n in g})
    for n, a in g.items():
        y = back[n]
        assert y.dtype == a.dtype and y.placements == (Shard(1),)
        assert np.array_equal(bits(y.local), bits(a[y.box])), n
    info = ps.checkpoint_info(path)
    assert {n: str(e["dtype"]) for n, e in info["arrays"].items()} == {
        **{n: n for n in FORMATS}, "partial": "bfloat16"
    }
    if comm.rank == 0:
        with open(os.path.join(path, "manifest.json"), encoding="utf-8") as f:
            m = json.load(f)
        assert m["arrays"]["bfloat16"]["dtype"] == "bfloat16"
        for n, a in g.items():  # plain numpy (ml_dtypes imported) reads the files
            b = np.load(os.path.join(path, info["arrays"][n]["file"]))
            assert b.dtype == a.dtype and np.array_equal(bits(b), bits(a)), n
