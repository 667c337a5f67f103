"""The pencil 3-D FFT with pyshard.fft (the fft3d bench case, examples/fft3d.py) against
numpy.fft.fftn on every 2-D mesh of the communicator (1xP, Px1 and the square-ish one), even
and uneven shapes, complex64 and complex128, every pencil order: ``pf.fftn(x,
placements=<last pencil>)`` takes one transpose per mesh dim of size > 1, each one collective
on that mesh dim alone, in mesh-dim order; the plan's ``out=`` buffer is reused.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from mpi4py import MPI

import pyshard as ps
from pyshard import Replicate, Shard
from pyshard import fft as pf
from pyshard.bench.fft3d import (
    DEFAULT_ORDER,
    ORDERS,
    bench_fft3d,
    order_of,
    pencils,
    sample_array,
    time_fft3d,
)
from pyshard.fft.planner import Move

pytestmark = [pytest.mark.mpi, pytest.mark.numerics]  # numerics: not rerun per MPI library

NOT_COLLECTIVES = {"staged", "device_direct"}
TOL = {np.complex64: 1e-4, np.complex128: 1e-10}


def meshes(size):
    out = [(1, size), (size, 1), tuple(int(d) for d in MPI.Compute_dims(size, 2))]
    return list(dict.fromkeys(out))


def collectives_since(before):
    now = ps.comm_stats()
    return sum(v - before.get(k, 0) for k, v in now.items() if k not in NOT_COLLECTIVES)


def assert_fft(y, shape, dtype, where, order=DEFAULT_ORDER):
    ref = np.fft.fftn(sample_array(shape, np.complex128))
    assert y.placements == pencils(order)[2], where
    assert y.local.dtype == dtype, where
    got, want = y.local, ref[y.box]
    err = float(np.max(np.abs(got - want))) if got.size else 0.0
    assert err <= TOL[dtype] * float(np.max(np.abs(ref))), f"{where}: max error {err}"


@pytest.mark.parametrize("dtype", [np.complex128, np.complex64])
@pytest.mark.parametrize("shape", [(8, 6, 10), (9, 7, 5)])
def test_fft3d_matches_numpy(comm, shape, dtype):
    g = sample_array(shape, dtype)
    for ms in meshes(comm.size):
        mesh = ps.Mesh(comm, ms)
        for order in ORDERS:
            where = f"mesh {ms}, order {order}, rank {comm.rank}"
            src = list(pencils(order)[0])
            assert order_of(src) == order
            box = ps.Layout(shape, dtype, ms, src).box(mesh.coords)
            x = ps.from_local(np.ascontiguousarray(g[box]), mesh, src, global_shape=shape)
            before = ps.comm_stats()
            y = pf.fftn(x, placements=list(pencils(order)[2]))
            moved = sum(m > 1 for m in ms)  # a transpose along a size-1 mesh dim moves nothing
            assert collectives_since(before) == moved, where
            assert_fft(y, shape, dtype, where, order)
            np.testing.assert_array_equal(x.local, g[x.box])  # the input is left alone
        mesh.free()


@pytest.mark.parametrize("order", ORDERS)
def test_each_transpose_is_one_collective_on_one_mesh_dim(comm, order):
    shape = (8, 6, 10)
    first, _, last = pencils(order)
    for ms in meshes(comm.size):
        lay = ps.Layout(shape, np.complex128, ms, first)
        p = pf.plan(lay, "fftn", placements=list(last))
        assert p.dst.placements == last
        moves = [q.plan for q in p.passes if isinstance(q, Move) and q.plan.collectives]
        # transpose k runs on mesh dim k, none where that dim has size 1
        assert [q.steps[0].mesh_dims for q in moves] == [(k,) for k in range(2) if ms[k] > 1]
        assert all(q.collectives == 1 and len(q.steps) == 1 for q in moves), p.explain()
        assert p.transposes == len(moves) == sum(m > 1 for m in ms)


def test_plan_reuses_its_out_buffer(comm):
    shape = (9, 7, 5)
    ms = meshes(comm.size)[-1]
    mesh = ps.Mesh(comm, ms)
    first, _, last = pencils(DEFAULT_ORDER)
    lay = ps.Layout(shape, np.complex128, ms, first)
    p = pf.plan(lay, "fftn", placements=list(last))
    assert pf.plan(lay, "fftn", placements=list(last)) is p  # cached
    x = ps.from_local(sample_array(shape, box=lay.box(mesh.coords)), mesh, list(first),
                      global_shape=shape)
    out = np.empty(p.dst.local_shape(mesh.coords), p.dst.dtype)
    y1 = p.forward(x, out=out)
    assert y1.local is out
    assert_fft(y1, shape, np.complex128, f"mesh {ms}")
    y2 = p.forward(x, out=out)  # same buffer, same answer
    assert y2.local is out
    assert_fft(y2, shape, np.complex128, f"mesh {ms}, second call")
    with pytest.raises(ValueError, match="FFTPlan.forward: expected"):
        p.forward(y2)  # its output pencil is not its input layout
    with pytest.raises(ValueError, match="out must be"):
        p.forward(x, out=np.empty(out.shape, np.complex64))
    mesh.free()


def test_other_input_layouts(comm):
    shape = (6, 5, 7)
    g = sample_array(shape)
    ms = meshes(comm.size)[-1]
    mesh = ps.Mesh(comm, ms)
    for src in ([Replicate(), Replicate()], [Shard(0), Replicate()], [Shard(2), Shard(2)]):
        x = ps.distribute(g, mesh, src)
        for order in (DEFAULT_ORDER, "xyz"):
            y = pf.fftn(x, placements=list(pencils(order)[2]))
            assert_fft(y, shape, np.complex128, f"mesh {ms}, input {src}, {order}", order)
    mesh.free()


def test_time_fft3d(comm):
    """The bench's timing helper on a pencil and on another layout (redistributed first)."""
    shape = (6, 5, 7)
    ms = meshes(comm.size)[-1]
    mesh = ps.Mesh(comm, ms)
    for src in (list(pencils("xyz")[0]), [Shard(0), Replicate()]):
        x = ps.distribute(sample_array(shape), mesh, src)
        t = time_fft3d(x, reps=1, warmup=0)
        assert t["total_ms"] > 0 and t["transposes_ms"] >= 0
        if comm.size > 1:  # the pencils change hands: the transposes take time
            assert t["transposes_ms"] > 0
    mesh.free()
    mesh1 = ps.Mesh(comm, (comm.size,))
    with pytest.raises(ValueError, match="2-D"):
        time_fft3d(ps.distribute(sample_array(shape), mesh1, [Shard(0)]), reps=1, warmup=0)
    mesh1.free()


def test_pencils():
    assert pencils("xyz") == ((Shard(1), Shard(2)), (Shard(0), Shard(2)), (Shard(0), Shard(1)))
    assert pencils("zxy") == ((Shard(0), Shard(1)), (Shard(2), Shard(1)), (Shard(2), Shard(0)))
    firsts = {pencils(o)[0] for o in ORDERS}
    assert len(firsts) == len(ORDERS) == 6  # every ordered pair of axes starts one order
    assert order_of([Shard(0), Shard(0)]) is None
    with pytest.raises(ValueError, match="order"):
        pencils("xxy")


def test_sample_array_boxes_agree():
    shape = (5, 4, 3)
    g = sample_array(shape)
    box = (slice(1, 4), slice(0, 4), slice(2, 3))
    np.testing.assert_array_equal(sample_array(shape, box=box), g[box])
    assert np.all(np.abs(g.real) <= 0.5) and np.all(np.abs(g.imag) <= 0.5)
    assert len(np.unique(g)) == g.size


def test_bench_row(comm):
    row = bench_fft3d(comm, n=8, reps=1, warmup=0)
    json.dumps(row)
    assert row["case"] == "fft3d" and row["ranks"] == comm.size
    assert row["shape"] == [8, 8, 8] and row["dtype"] == "complex128"
    assert row["check"] and row["pyshard_check"]
    assert row["pyshard_total_ms"] > 0 and row["pyshard_transposes_ms"] >= 0
    if comm.size > 1:
        assert row["pyshard_transposes_ms"] > 0
    if row["pfft_total_ms"] is None:
        assert row["pfft_check"] is None and row["pfft"]  # says why
    else:
        assert row["pfft_check"] and row["pfft_transposes_ms"] >= 0
