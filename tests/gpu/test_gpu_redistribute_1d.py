"""Redistribution of cupy arrays on a 1-D mesh against the numpy oracle (tests/mpi/oracle.py).

Every pair of placements (Shard(0), Shard(1), Replicate, Partial sum/avg/max/min), uneven,
small and empty shards, the GPU dtypes; each through host bounce buffers ("staged", always)
and device-direct (where the MPI is CUDA-aware), with exact collective counts. Each rank
compares ``cupy.asnumpy(y.local)`` with ``global[y.box]``. Skipped without a GPU.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from gpu_helpers import DTYPES, counts_since, skip_reason, split_counts, with_transport
from oracle import contributions, make_global
from test_redistribute_1d import expected_counts
from test_redistribute_1d import sweep_pair as host_sweep

import pyshard as ps
from pyshard import Partial, Replicate, Shard

if skip_reason():
    pytest.skip(skip_reason(), allow_module_level=True)
cp = pytest.importorskip("cupy")

pytestmark = pytest.mark.mpi

S0, S1, R = Shard(0), Shard(1), Replicate()
PLACEMENTS = [S0, S1, R, Partial("sum"), Partial("avg"), Partial("max"), Partial("min")]
PAIRS = list(itertools.product(PLACEMENTS, repeat=2))  # every 1-D pair, identities included


def device_counts(src, dst, p, shape, algorithm="auto"):
    """The host's collectives for this pair (tests/mpi/test_redistribute_1d.py's rule, so
    both follow the algorithm choice), with device arrays' Alltoallw run as Alltoallv."""
    want = expected_counts(src, dst, p, shape, algorithm)
    if "alltoallw" in want:
        want = {"alltoallv": want.pop("alltoallw"), **want}
    return want


def make_source(g, mesh, src, dtype, seed):
    """A ShardedArray on the GPU of global value ``g`` (or partial contributions of it)."""
    if isinstance(src, Partial):
        parts, ref = contributions(g.shape, dtype, mesh.size, src.op, seed)
        x = ps.from_local(cp.asarray(parts[mesh.rank]), mesh, [src], global_shape=g.shape)
        return x, ref
    return ps.distribute(cp.asarray(g), mesh, [src]), g


def check_result(y, ref, dst, mesh, approx=False, from_replicate=True):
    """This rank's shard against the oracle; for Partial targets, the reduction."""
    assert isinstance(y.local, cp.ndarray), type(y.local)
    assert y.placements == (dst,)
    assert y.local.flags.c_contiguous
    assert y.local.dtype == ref.dtype
    same = np.testing.assert_array_equal
    if approx:

        def same(a, b):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)

    if isinstance(dst, Partial):
        full = y.full()
        assert isinstance(full, cp.ndarray)
        same(cp.asnumpy(full), ref)
        if dst.op == "sum" and mesh.coords[0] != 0 and from_replicate:
            assert not cp.asnumpy(y.local).any()
    else:
        same(cp.asnumpy(y.local), ref[y.box])


def sweep_pair(comm, transport, src, dst, algorithm="auto", dtypes=DTYPES):
    def want(*args):
        return with_transport(device_counts(*args), transport)

    failures = host_sweep(comm, src, dst, algorithm, dtypes, want, make_source, check_result)
    assert not failures, "\n".join(failures[:10])


@pytest.mark.parametrize("src,dst", PAIRS, ids=[f"{a}->{b}" for a, b in PAIRS])
def test_pair_all_shapes_and_dtypes(comm, transport, src, dst):
    sweep_pair(comm, transport, src, dst)


@pytest.mark.parametrize("algorithm", ["alltoallv", "alltoall", "p2p", "alltoallw"])
@pytest.mark.parametrize("src,dst", [(S0, S1), (S1, S0)], ids=["S0->S1", "S1->S0"])
def test_exchange_algorithms(comm, transport, src, dst, algorithm):
    """Every exchange algorithm on device arrays (alltoallw runs as alltoallv there)."""
    sweep_pair(comm, transport, src, dst, algorithm)


@pytest.mark.parametrize("rule", ["explicit", "chunk"])
def test_rebalance_uneven_sizes_with_zeros(comm, transport, rule):
    """Shard(0) with sizes A -> sizes B (empty shards on most ranks): one Alltoallv."""
    p = comm.size
    mesh = ps.Mesh(comm, (p,))
    n = 5 * p + 3
    a = [0] * p
    a[0] = n
    if rule == "chunk":
        b = list(ps.split_sizes(n, p, "chunk"))
    else:
        b = [1] * (p - 1) + [n - (p - 1)]
    for dtype in DTYPES:
        g = make_global((n, 6), dtype)
        x = ps.distribute(cp.asarray(g), mesh, [S0], sizes={0: a})
        before = ps.comm_stats()
        y = x.redistribute([S0], sizes={0: b})
        want = {"alltoallv": 1} if p > 1 and a != b else {}
        assert counts_since(before) == with_transport(want, transport), dtype
        np.testing.assert_array_equal(cp.asnumpy(y.local), g[y.box])
        assert y.local.shape[0] == b[mesh.rank]
        z = y.redistribute([S1], sizes={1: [6] + [0] * (p - 1)})
        np.testing.assert_array_equal(cp.asnumpy(z.local), g[z.box])


@pytest.mark.parametrize("dtype", DTYPES)
def test_round_trip_is_bitwise(comm, transport, dtype):
    """A -> B -> ... -> A returns the very same bytes on every rank."""
    mesh = ps.Mesh(comm, (comm.size,))
    g = make_global((11, 5, 3), dtype)
    x = ps.distribute(cp.asarray(g), mesh, [S0])
    y = x.redistribute([Shard(2)]).redistribute([S1]).redistribute([R]).redistribute([S0])
    assert y.layout == x.layout
    assert cp.asnumpy(y.local).tobytes() == cp.asnumpy(x.local).tobytes()
    back = x.redistribute([S1]).redistribute([S0])
    assert cp.asnumpy(back.local).tobytes() == cp.asnumpy(x.local).tobytes()


def test_out_buffer(comm, transport):
    mesh = ps.Mesh(comm, (comm.size,))
    g = make_global((10, 6), "float64")
    x = ps.distribute(cp.asarray(g), mesh, [S0])
    for dst in ([S1], [R], [S0]):
        out = cp.full(x.layout.replace(dst).local_shape(mesh.coords), -1.0)
        for _ in range(2):  # the second call takes the cached fast path
            out[...] = -1.0
            y = x.redistribute(dst, out=out)
            assert y.local is out
            np.testing.assert_array_equal(cp.asnumpy(out), g[y.box])
    with pytest.raises(ValueError, match="out has shape"):
        x.redistribute([S1], out=cp.empty((99, 1)))
    with pytest.raises(ValueError, match="overlap"):
        x.redistribute([S0], out=x.local)


def test_mixing_host_and_device_is_a_type_error(comm):
    """numpy local + cupy out, and cupy local + numpy out: TypeError naming both; checked
    on each rank before any communication."""
    mesh = ps.Mesh(comm, (comm.size,))
    g = make_global((10, 6), "float32")
    xh = ps.distribute(g, mesh, [S0])
    xd = ps.distribute(cp.asarray(g), mesh, [S0])
    shape = xh.layout.replace([S1]).local_shape(mesh.coords)
    for x, out in [(xh, cp.empty(shape, np.float32)), (xd, np.empty(shape, np.float32))]:
        for _ in range(2):  # also once the plan is cached (the fast path)
            before = ps.comm_stats()
            with pytest.raises(TypeError) as e:
                x.redistribute([S1], out=out)
            msg = str(e.value)
            assert "numpy" in msg and "cupy" in msg, msg
            assert counts_since(before) == {}
            x.redistribute([S1])  # caches the plan for the second round


def test_same_layout_shares_memory(comm, transport):
    mesh = ps.Mesh(comm, (comm.size,))
    g = make_global((9, 4), "float32")
    x = ps.distribute(cp.asarray(g), mesh, [S0])
    before = ps.comm_stats()
    y = x.redistribute([S0])
    assert counts_since(before) == {}
    assert y.local is x.local or cp.shares_memory(x.local, y.local)
    z = x.redistribute([S1])
    assert not cp.shares_memory(x.local, z.local)


def test_full_reduces_partial(comm, transport):
    mesh = ps.Mesh(comm, (comm.size,))
    for dtype, op in [("int32", "sum"), ("float16", "sum"), ("float32", "max"), ("bool", "min")]:
        parts, ref = contributions((6, 5), dtype, comm.size, op, seed=9)
        x = ps.from_local(cp.asarray(parts[comm.rank]), mesh, [Partial(op)], global_shape=(6, 5))
        full = x.full()
        assert isinstance(full, cp.ndarray) and full.dtype == ref.dtype
        np.testing.assert_array_equal(cp.asnumpy(full), ref)


@pytest.mark.parametrize("algorithm", ["auto", "alltoallv", "p2p", "alltoallw", "alltoall"])
def test_large_skewed_blocks(comm, transport, algorithm):
    """Blocks of a few MiB on some ranks, a few KiB on others, odd widths (unaligned rows):
    the kernels' wide and narrow paths and every size-dependent branch of the core."""
    p = comm.size
    mesh = ps.Mesh(comm, (p,))
    n, m = 1031, 701
    rest = n // 8
    tail = [rest // (p - 1) + (i < rest % (p - 1)) for i in range(p - 1)] if p > 1 else []
    sizes = [n - sum(tail)] + tail
    for dtype in ("float32", "float16", "complex64"):
        g = make_global((n, m), dtype, seed=4)
        x = ps.distribute(cp.asarray(g), mesh, [S0], sizes={0: sizes})
        for dst, dsizes in [([S0], None), ([S1], None), ([S0], {0: sizes[::-1]})]:
            y = x.redistribute(dst, dsizes, algorithm=algorithm)
            np.testing.assert_array_equal(cp.asnumpy(y.local), g[y.box], err_msg=f"{dtype} {dst}")
            back = y.redistribute([S0], {0: sizes}, algorithm=algorithm)
            assert cp.asnumpy(back.local).tobytes() == cp.asnumpy(x.local).tobytes()


def test_result_ready_on_a_non_default_stream(comm, transport):
    """Kernels run on cupy's current stream and the result is ready on it when redistribute
    returns: build, redistribute and read back all inside one non-blocking stream."""
    mesh = ps.Mesh(comm, (comm.size,))
    g = make_global((517, 389), "float32", seed=2)
    with cp.cuda.Stream(non_blocking=True):
        gd = cp.asarray(g)
        x = ps.distribute(gd * 1, mesh, [S0])  # produced by a kernel on this stream
        for dst in ([S1], [R], [S0]):
            y = x.redistribute(dst)
            y.local *= 2  # consumed by a kernel on the same stream
            np.testing.assert_array_equal(cp.asnumpy(y.local), 2 * g[y.box])


def test_first_call_of_each_plan_on_a_non_blocking_stream(comm, transport):
    """Each new plan uploads its kernel table once; on a non-blocking stream its first
    kernel must still read the whole table (the upload once ran on the legacy default
    stream, unordered with such a stream: pyshard.jax's results were wrong on XLA's
    streams). Many fresh plans, each checked on its first call."""
    mesh = ps.Mesh(comm, (comm.size,))
    rng = np.random.default_rng(7)
    g = make_global((61, 43), "float64", seed=5)
    with cp.cuda.Stream(non_blocking=True):
        x = ps.distribute(cp.asarray(g), mesh, [S0])
        for case in range(24):
            cuts = np.sort(rng.integers(0, g.shape[1] + 1, comm.size - 1))
            sizes = np.diff(np.concatenate([[0], cuts, [g.shape[1]]])).tolist()
            y = x.redistribute([S1], {1: sizes})
            np.testing.assert_array_equal(cp.asnumpy(y.local), g[y.box],
                                          err_msg=f"case {case} sizes {sizes}")


class _DLPackOnly:
    """A producer that is not cupy: only the DLPack protocol (as torch or jax offer it)."""

    def __init__(self, a):
        self._a = a

    def __dlpack__(self, *args, **kwargs):
        return self._a.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


class _CudaArrayInterfaceOnly:
    """A producer that is not cupy: only ``__cuda_array_interface__`` (numba, older torch)."""

    def __init__(self, a):
        self._a = a

    @property
    def __cuda_array_interface__(self):
        return self._a.__cuda_array_interface__


@pytest.mark.parametrize("wrap", [_DLPackOnly, _CudaArrayInterfaceOnly], ids=["dlpack", "cai"])
def test_foreign_device_producers_are_zero_copy(comm, transport, wrap):
    """A device array through DLPack / the CUDA array interface (no torch needed): viewed as
    cupy without a copy, redistributed, and handed back through DLPack."""
    p = comm.size
    mesh = ps.Mesh(comm, (p,))
    g = make_global((4 * p + 3, 6), "float32")
    layout = ps.Layout(g.shape, g.dtype, mesh.shape, [S0])
    local = cp.asarray(g[layout.box(mesh.coords)])
    x = ps.from_local(wrap(local), mesh, [S0], global_shape=g.shape)
    assert isinstance(x.local, cp.ndarray)
    assert x.local.data.ptr == local.data.ptr  # a view, not a copy
    y = x.redistribute([S1])
    np.testing.assert_array_equal(cp.asnumpy(y.local), g[y.box])
    # and back out through DLPack, without a copy
    v = cp.from_dlpack(_DLPackOnly(y.local))
    assert v.data.ptr == y.local.data.ptr
    gx = ps.distribute(wrap(cp.asarray(g)), mesh, [S1])
    assert isinstance(gx.local, cp.ndarray)
    np.testing.assert_array_equal(cp.asnumpy(gx.local), g[gx.box])


def test_counters_name_the_path(comm, transport):
    """Each collective of a device array counts once as "staged" or "device_direct"; host
    arrays count neither."""
    p = comm.size
    mesh = ps.Mesh(comm, (p,))
    for shape in [(8, 6), (13, 7)]:
        g = make_global(shape, "float32")
        xh = ps.distribute(g, mesh, [S0])
        xd = ps.distribute(cp.asarray(g), mesh, [S0])
        before = ps.comm_stats()
        xh.redistribute([S1])
        xh.redistribute([R])
        coll_host, paths = split_counts(counts_since(before))
        assert paths == {}
        before = ps.comm_stats()
        xd.redistribute([S1])
        xd.redistribute([R])
        coll, paths = split_counts(counts_since(before))
        want = {}
        for dst in (S1, R):
            for k, v in device_counts(S0, dst, p, shape).items():
                want[k] = want.get(k, 0) + v
        assert coll == want == coll_host
        assert paths == {k: v for k, v in with_transport(want, transport).items() if k not in want}
