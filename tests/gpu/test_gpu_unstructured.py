"""Gather plans on cupy arrays (pyshard.unstructured): gather and scatter of a ShardedArray
whose local shard is a cupy array, against the same oracles as the numpy tests
(tests/mpi/test_unstructured.py): ``G[indices]`` exactly, and the scatter's order rule bit for
bit. The result of a gather is a cupy array; a scatter writes into the cupy shard. Skipped
without a GPU."""

from __future__ import annotations

import numpy as np
import pytest
from gpu_helpers import skip_reason
from oracle import make_global
from test_unstructured import (
    GATHER_DTYPES,
    LAYOUTS,
    PATTERNS,
    SCATTERS,
    TRAILS,
    N,
    indices_of,
    layout_sizes,
    scatter_expected,
    values_of,
)

import pyshard as ps
from pyshard import Shard

if skip_reason():
    pytest.skip(skip_reason(), allow_module_level=True)
cp = pytest.importorskip("cupy")

pytestmark = pytest.mark.mpi


def dist(g, mesh, sizes):
    return ps.distribute(cp.asarray(g), mesh, [Shard(0)],
                         sizes=None if sizes is None else {0: sizes})  # fmt: skip


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("pattern", PATTERNS)
def test_gpu_gather_equals_oracle(comm, layout, pattern):
    mesh = ps.Mesh(comm, (comm.size,))
    sizes = layout_sizes(layout, N, comm.size)
    idx = indices_of(pattern, 3, comm.rank)
    plan = ps.gather_plan(idx, like=dist(np.zeros(N), mesh, sizes))
    for i, dtype in enumerate(GATHER_DTYPES):
        trail = TRAILS[i % len(TRAILS)]
        g = make_global((N,) + trail, dtype, seed=i)
        x = dist(g, mesh, sizes)
        assert isinstance(x.local, cp.ndarray)
        want = g[np.asarray(idx, np.int64)]
        got = plan.gather(x) if i % 2 == 0 else plan.gather(x, wait=False).wait()
        assert isinstance(got, cp.ndarray), type(got)
        np.testing.assert_array_equal(cp.asnumpy(got), want, err_msg=f"{dtype} {trail}")
    mesh.free()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_gpu_scatter_equals_order_rule(comm, layout):
    mesh = ps.Mesh(comm, (comm.size,))
    P, me = comm.size, comm.rank
    sizes = layout_sizes(layout, N, P)
    idxs = [indices_of("random", 4, q) for q in range(P)]
    plan = ps.gather_plan(idxs[me], like=dist(np.zeros(N), mesh, sizes))
    for i, (dtype, trail, op) in enumerate(SCATTERS):
        g = make_global((N,) + trail, dtype, seed=i)
        vals = [values_of(4 + i, q, len(idxs[q]), dtype, trail, op) for q in range(P)]
        want = scatter_expected(g, idxs, vals, op)
        x = dist(g, mesh, sizes)
        v = cp.asarray(vals[me]) if i % 2 else vals[me]  # values on the device or the host
        assert plan.scatter(v, into=x, op=op) is None
        assert isinstance(x.local, cp.ndarray)
        np.testing.assert_array_equal(cp.asnumpy(x.local), want[x.box],
                                      err_msg=f"{dtype} {trail} {op}")  # fmt: skip
    mesh.free()


def test_gpu_gather_out_checked(comm):
    """A cupy x gathered into out=: a cupy out of the result's shape and dtype is written;
    one of another dtype or shape, or a numpy out, raises ValueError at wait() on that rank
    after its part ran (it was cast or broadcast silently at wait()); the others complete."""
    mesh = ps.Mesh(comm, (comm.size,))
    g = make_global((N, 3), "float32", seed=2)
    x = dist(g, mesh, None)
    idx = indices_of(PATTERNS[0], 3, comm.rank)
    plan = ps.gather_plan(idx, like=x)
    want = g[np.asarray(idx, np.int64)]
    out = cp.empty(want.shape, cp.float32)
    assert plan.gather(x, out=out) is out
    np.testing.assert_array_equal(cp.asnumpy(out), want)
    for bad in (cp.empty(want.shape, cp.float64), cp.empty((len(idx) + 1, 3), cp.float32),
                np.empty(want.shape, np.float32)):
        with pytest.raises(ValueError, match="out must be a cupy array"):
            plan.gather(x, out=bad)
    mesh.free()
