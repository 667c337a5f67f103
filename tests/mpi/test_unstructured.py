"""pyshard.unstructured (gather_plan, GatherPlan.gather/scatter, take, scatter_add) against
an oracle every rank computes alone: the global array is deterministic, and every rank's
indices and values come from (seed, rank), so each rank knows what every other rank asks.

- gather: ``G[indices]`` exactly, on 1-D layouts with uneven and empty shards, indices with
  duplicates, in any order, of different lengths (0 on some ranks), for float64, float32,
  int64, complex128, float16 and bool rows of 0, 1 and 2 trailing dims; ``out=``;
  ``wait=False`` with a ``test()`` loop.
- scatter: the module doc's order rule written out in numpy (per source rank ``q``
  ascending, ``c_q`` = q's values for the row combined in q's index order; then
  ``row op c_0 op c_1 ...``; float16 in float32 rounded once; bool's sum a logical or),
  compared bit for bit, with values whose sums depend on the order.
- errors on every rank naming the first rank at fault (setup), and local ones (values, out,
  into) raised before any message; the plan works afterwards.
- explain() and comm_stats() against the counts the oracle knows; the steady calls run no
  collective (pyshard's counters here, every MPI call in test_index_calls_by_pmpi).
"""

from __future__ import annotations

import json
import os
import sys
from itertools import product

import launch
import numpy as np
import pytest
from count_worker import COLLECTIVE
from mpi4py import MPI
from oracle import agree, make_global
from test_first_call import shim  # noqa: F401  (the fixture that builds the shim)

import pyshard as ps
from pyshard import Replicate, Shard, ShardedArray
from pyshard.memory import is_node_shared
from pyshard.unstructured import NODE_RESULT_MIN_BYTES

pytestmark = pytest.mark.mpi(min_size=1)

HERE = os.path.dirname(os.path.abspath(__file__))
N = 23  # rows of the index space
LAYOUTS = ["balanced", "uneven", "last"]
PATTERNS = ["random", "runs"]
GATHER_DTYPES = ["float64", "float32", "int64", "complex128", "float16", "bool"]
TRAILS = [(), (3,), (2, 2)]


@pytest.fixture(scope="module")
def mesh():
    m = ps.Mesh(MPI.COMM_WORLD, (MPI.COMM_WORLD.size,))
    yield m
    m.free()


def layout_sizes(kind, n, P):
    """Rows per rank: ``balanced`` (None: pyshard's even split), ``uneven`` (random cuts, every
    rank ``r % 3 == 1`` empty), ``last`` (every row on the last rank)."""
    if kind == "balanced":
        return None
    if kind == "last":
        return [0] * (P - 1) + [n]
    rng = np.random.default_rng([n, P, 5])
    cuts = np.sort(rng.integers(0, n + 1, size=P - 1))
    sizes = np.diff(np.concatenate(([0], cuts, [n]))).astype(int)
    for r in range(1, P, 3):
        sizes[r - 1] += sizes[r]
        sizes[r] = 0
    return [int(s) for s in sizes]


def offsets_of(sizes, n, P):
    """The first row of every rank's shard, and n: from the layout itself."""
    if sizes is None:
        sizes = ps.Layout((n,), np.float64, (P,), [Shard(0)]).table[0][1]
    return np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)


def dist(g, mesh, sizes):
    return ps.distribute(g, mesh, [Shard(0)], sizes=None if sizes is None else {0: sizes})


def indices_of(pattern, seed, rank, n=N):
    """Rank ``rank``'s indices: ``random`` (duplicates, any order, int32 on odd ranks, none on
    ranks ``r % 3 == 2``) or ``runs`` (an ascending slice of the rows, so that every group of
    rows is one run at both ends; an empty list on ranks ``r % 3 == 2``)."""
    rng = np.random.default_rng([seed, rank])
    if rank % 3 == 2:
        return np.zeros(0, np.int64) if pattern == "random" else []
    if pattern == "random":
        k = int(rng.integers(1, 2 * n))
        return rng.integers(0, n, size=k).astype(np.int32 if rank % 2 else np.int64)
    start = (5 * rank + seed) % n
    return np.arange(start, min(n, start + 9), dtype=np.int64)


def owner_of(rows, offsets):
    return np.searchsorted(offsets[:-1], np.asarray(rows, np.int64), side="right") - 1


def wait_by_test(p):
    """Drive a pending exchange with test() alone, then wait()."""
    for _ in range(10**7):
        if p.test():
            break
    else:
        raise AssertionError("test() never returned True")
    assert p.test()
    return p.wait()


# --- gather -------------------------------------------------------------------------------

CASES = [(lay, pat) for lay in LAYOUTS for pat in PATTERNS]


@pytest.mark.parametrize("layout,pattern", CASES)
def test_gather_equals_oracle(mesh, layout, pattern):
    """One plan, gathers of every dtype and trailing shape: plain, into out=, and wait=False
    driven by test(); each equals G[indices] exactly."""
    P, me = mesh.size, mesh.rank
    sizes = layout_sizes(layout, N, P)
    seed = 3
    idx = indices_of(pattern, seed, me)
    algorithm = "alltoall" if layout == "last" else "auto"
    plan = ps.gather_plan(idx, like=dist(np.zeros(N), mesh, sizes), algorithm=algorithm)
    assert plan.n == len(idx)
    want_idx = np.asarray(idx, np.int64)
    failures = []  # noted, not raised: every rank goes on to the same calls (agree)
    for i, (dtype, trail) in enumerate(product(GATHER_DTYPES, TRAILS)):
        g = make_global((N,) + trail, dtype, seed=i)
        x = dist(g, mesh, sizes)
        want = g[want_idx]
        mode = i % 3
        if mode == 0:
            got = plan.gather(x)
        elif mode == 1:
            out = np.full(want.shape, 1, dtype=want.dtype)
            got = plan.gather(x, out=out)
            if got is not out:
                failures.append(f"{dtype} {trail}: not out")
        else:
            got = wait_by_test(plan.gather(x, wait=False))
        if got.shape != want.shape or got.dtype != want.dtype:
            failures.append(f"{dtype} {trail}: {got.shape} {got.dtype}")
        elif not np.array_equal(got, want, equal_nan=got.dtype.kind in "fc"):
            failures.append(f"{dtype} {trail} mode {mode}")
    agree(mesh.comm, failures)
    # rows of no bytes, and an index space of no rows (every rank reads nothing)
    g = make_global((N, 0), "float64")
    assert plan.gather(dist(g, mesh, sizes)).shape == (len(idx), 0)
    empty = ps.gather_plan(np.zeros(0, np.int64), like=dist(np.zeros((0, 2)), mesh, None))
    got = empty.gather(dist(np.zeros((0, 2)), mesh, None))
    assert got.shape == (0, 2)


# --- scatter ------------------------------------------------------------------------------

def values_of(seed, rank, n, dtype, trail, op):
    """Rank ``rank``'s values: float64 and complex mix 1e16 with ones and fractions (a sum
    depends on its order); float16 mixes 2048 with 1 and 0.5 (float16 sums would lose them,
    float32 does not); a NaN in rank 0's float64 max/min values."""
    rng = np.random.default_rng([seed, rank, 7])
    shape = (n,) + trail
    if dtype == "bool":
        return rng.random(shape) < 0.3
    if dtype == "int64":
        return rng.integers(-1000, 1000, size=shape)
    if dtype == "float16":
        mags = np.array([2048.0, 1.0, 0.5, -2048.0, 0.25, -1.0])
        return (rng.choice(mags, size=shape) * rng.integers(1, 4, size=shape)).astype(np.float16)
    mags = np.array([1e16, 1.0, -1e16, 0.75, 3e-3, -2.5])
    if dtype == "float32":
        mags = np.array([1e8, 1.0, -1e8, 0.75, 3e-3, -2.5])
    v = rng.choice(mags, size=shape) * rng.integers(1, 4, size=shape)
    if dtype == "complex128":
        v = v + 1j * rng.choice(mags, size=shape)
    v = v.astype(dtype)
    if dtype == "float64" and op in ("max", "min") and rank == 0 and n > 1:
        v[1] = np.nan
    return v


def combine(op, a, b):
    if op == "replace":
        return b
    if a.dtype == np.bool_:
        return {"sum": np.logical_or, "max": np.logical_or, "min": np.logical_and}[op](a, b)
    return {"sum": np.add, "max": np.maximum, "min": np.minimum}[op](a, b)


def scatter_expected(g, idxs, vals, op):
    """The order rule: for q = 0, 1, ...: c_q[row] = q's values for row combined in q's index
    order, then row = row op c_q. float16 (not replace) in float32, rounded once."""
    wide = g.dtype == np.float16 and op != "replace"
    acc = g.astype(np.float32) if wide else g.copy()
    for idx, v in zip(idxs, vals):
        if wide:
            v = v.astype(np.float32)
        c = {}
        for k, row in enumerate(np.asarray(idx, np.int64).tolist()):
            c[row] = np.array(v[k]) if row not in c else combine(op, c[row], v[k])
        for row, part in c.items():
            acc[row] = combine(op, np.array(acc[row]), part)
    return acc.astype(g.dtype) if wide else acc


SCATTERS = [
    ("float64", (), "sum"), ("float64", (2,), "max"), ("float64", (), "min"),
    ("float64", (2,), "replace"), ("float16", (2,), "sum"), ("float16", (), "max"),
    ("float16", (), "replace"), ("float32", (2, 2), "sum"), ("int64", (2,), "sum"),
    ("int64", (), "min"), ("complex128", (), "sum"), ("complex128", (2,), "replace"),
    ("bool", (2,), "sum"), ("bool", (), "min"), ("bool", (), "replace"),
]  # fmt: skip


@pytest.mark.parametrize("layout,pattern", CASES)
def test_scatter_equals_order_rule(mesh, layout, pattern):
    """One plan, scatters of every op and dtype, compared bit for bit with the order rule."""
    P, me = mesh.size, mesh.rank
    sizes = layout_sizes(layout, N, P)
    seed = 4
    idxs = [indices_of(pattern, seed, q) for q in range(P)]
    plan = ps.gather_plan(idxs[me], like=dist(np.zeros(N), mesh, sizes))
    for i, (dtype, trail, op) in enumerate(SCATTERS):
        g = make_global((N,) + trail, dtype, seed=i)
        vals = [values_of(seed + i, q, len(idxs[q]), dtype, trail, op) for q in range(P)]
        want = scatter_expected(g, idxs, vals, op)
        x = dist(g, mesh, sizes)
        if i % 2:
            assert wait_by_test(plan.scatter(vals[me], into=x, op=op, wait=False)) is None
        else:
            assert plan.scatter(vals[me], into=x, op=op) is None
        np.testing.assert_array_equal(x.local, want[x.box], err_msg=f"{dtype} {trail} {op}")


def test_the_order_rule_is_what_is_checked():
    """The scatter oracle's values make the order matter: at 2 and 3 ranks, summing float64
    in global index order (np.add.at), or float16 in float16, gives other bits than the rule,
    and the rule's own pieces are what its code says."""
    for P in (2, 3):
        idxs = [indices_of("random", 4, q) for q in range(P)]
        g = make_global((N,), "float64")
        vals = [values_of(4, q, len(idxs[q]), "float64", (), "sum") for q in range(P)]
        naive = g.copy()
        np.add.at(naive, np.concatenate([np.asarray(i, np.int64) for i in idxs]),
                  np.concatenate(vals))
        assert not np.array_equal(naive, scatter_expected(g, idxs, vals, "sum"))
        h = make_global((N,), "float16")
        v16 = [values_of(9, q, len(idxs[q]), "float16", (), "sum") for q in range(P)]
        narrow = h.copy()
        np.add.at(narrow, np.concatenate([np.asarray(i, np.int64) for i in idxs]),
                  np.concatenate(v16))
        assert not np.array_equal(narrow, scatter_expected(h, idxs, v16, "sum"))
    g = np.zeros(2)
    # rank 0 adds 1e16 then -1e16 to row 0 (c_0 = 0), rank 1 adds 1: 1; other orders give 0
    assert scatter_expected(g, [[0, 0], [0]], [np.array([1e16, -1e16]), np.array([1.0])],
                            "sum")[0] == 1.0
    # replace: the highest rank's last occurrence
    assert scatter_expected(g, [[1, 1], [1, 1]], [np.array([1.0, 2.0]), np.array([3.0, 4.0])],
                            "replace")[1] == 4.0


def test_plan_reused(mesh):
    """gather, scatter, gather, ... with one plan: each gather sees the scatters before it."""
    P, me = mesh.size, mesh.rank
    sizes = layout_sizes("uneven", N, P)
    idxs = [indices_of("random", 11, q) for q in range(P)]
    g = make_global((N, 2), "float64")
    x = dist(g, mesh, sizes)
    plan = ps.gather_plan(idxs[me], like=x)
    for step in range(3):
        np.testing.assert_array_equal(plan.gather(x), g[np.asarray(idxs[me], np.int64)])
        vals = [values_of(20 + step, q, len(idxs[q]), "float64", (2,), "sum") for q in range(P)]
        plan.scatter(vals[me], into=x)
        g = scatter_expected(g, idxs, vals, "sum")
        np.testing.assert_array_equal(x.local, g[x.box])
    st = plan.comm_stats()
    assert st["gather"] == 3 and st["scatter"] == 3


@pytest.mark.parametrize("form", ["strided", "int32", "readonly"])
def test_increasing_indices_in_any_form(mesh, form):
    """Strictly increasing indices skip the sort and are sent from where they lie (the setup's
    own= path): as a strided view, as int32 and read-only, each gathers G[indices]."""
    P, me = mesh.size, mesh.rank
    sizes = layout_sizes("uneven", N, P)
    base = np.arange((3 * me) % 4, N, dtype=np.int64)  # ascending, every rank's start differs
    idx = {"strided": base[::2], "int32": base[::3].astype(np.int32), "readonly": base.copy()}[form]
    if form == "readonly":
        idx.flags.writeable = False
    g = make_global((N, 3), "float64", seed=8)
    x = dist(g, mesh, sizes)
    plan = ps.gather_plan(idx, like=x)
    np.testing.assert_array_equal(plan.gather(x), g[np.asarray(idx, np.int64)])
    np.testing.assert_array_equal(idx, {"strided": base[::2], "int32": base[::3],
                                        "readonly": base}[form])  # the input left as it was


@pytest.mark.parametrize("layout,pattern", CASES)
def test_touched_rows_are_every_local_row_read(mesh, layout, pattern):
    """plan.touched (the rows a cupy array's device pack copies out: docs/unstructured.md) is
    every local row that any rank reads, this one included, each once and ascending: from
    every rank's indices, the ones that fall in this rank's shard."""
    P, me = mesh.size, mesh.rank
    sizes = layout_sizes(layout, N, P)
    idxs = [np.asarray(indices_of(pattern, 5, q), np.int64) for q in range(P)]
    x = dist(np.zeros(N), mesh, sizes)
    plan = ps.gather_plan(idxs[me], like=x)
    lo, hi = x.box[0].start, x.box[0].stop
    allrows = np.concatenate(idxs)
    want = np.unique(allrows[(allrows >= lo) & (allrows < hi)]) - lo
    np.testing.assert_array_equal(plan.touched, want)
    assert plan.touched.dtype == np.int64


@pytest.mark.parametrize("method", ["p2p", "persistent", "neighbor", "shm", "auto"])
@pytest.mark.parametrize("layout,pattern", [("uneven", "random"), ("balanced", "runs")])
def test_every_method_gives_the_same_rows(mesh, method, layout, pattern):
    """Each way of moving the rows (fresh messages, persistent requests, a neighbourhood
    all-to-all, node-shared memory between ranks of a node, and auto's gathers through
    node-shared memory with scatters by fresh messages) gives G[indices] and the order
    rule's bits, through repeated calls with new buffers (persistent requests bound again),
    out=, and wait=False driven by test()."""
    P, me = mesh.size, mesh.rank
    sizes = layout_sizes(layout, N, P)
    idxs = [indices_of(pattern, 13, q) for q in range(P)]
    g = make_global((N, 3), "float64")
    x = dist(g, mesh, sizes)
    plan = ps.gather_plan(idxs[me], like=x, method=method)
    r = plan.route
    if method in ("shm", "auto"):
        # every rank of these jobs shares a node with another (two hosts: two each)
        want = "local" if P == 1 else "mpi" if ps.config.get("PYSHARD_SHM") == "off" else "shm"
        assert r.path == want and r.method == "p2p", r
        assert ("node-shared memory" in plan.explain()) == (want == "shm"), plan.explain()
        assert plan.exchange.core.on_node_transport == (want == "shm")
        split = method == "auto" and want == "shm"  # auto: scatters by p2p
        assert r.scatter_by == ("p2p" if split else ""), r
        assert ("scatters: point-to-point by p2p" in plan.explain()) == split, plan.explain()
    else:
        assert r.method == method and f"by {method}" in plan.explain()
    want_idx = np.asarray(idxs[me], np.int64)
    failures = []  # noted, not raised: every rank goes on to the same calls (agree)
    for step in range(3):
        out = np.full((len(idxs[me]), 3), -1.0)
        if step == 1:
            got = wait_by_test(plan.gather(x, out=out, wait=False))
        else:
            got = plan.gather(x, out=out)
        if not np.array_equal(got, g[want_idx]):
            failures.append(f"{method} gather {step}")
        vals = [values_of(30 + step, q, len(idxs[q]), "float64", (3,), "sum") for q in range(P)]
        if step == 2:
            if wait_by_test(plan.scatter(vals[me].copy(), into=x, wait=False)) is not None:
                failures.append("scatter's wait returned something")
        else:
            plan.scatter(vals[me].copy(), into=x)
        g = scatter_expected(g, idxs, vals, "sum")
        if not np.array_equal(x.local, g[x.box]):
            failures.append(f"{method} scatter {step}")
    agree(mesh.comm, failures)


@pytest.mark.parametrize("pattern", ["runs", "random"])
@pytest.mark.parametrize("dtype,feat", [("float64", (3,)), ("int64", (2,)), ("float32", ())])
def test_shm_gather_results_owners_write(mesh, pattern, dtype, feat):
    """On node-shared memory a gather without out= returns a result that node owners wrote
    into (every group that lands as one run: the runs pattern has some on each reading rank);
    each result is its own array, 64-byte aligned, and keeps its rows through later gathers
    and scatters. Results below NODE_RESULT_MIN_BYTES (512 KiB) stay plain numpy arrays."""
    if mesh.size > 1:
        # at the threshold (row 0 read k times: k float64 rows), and one row under it
        x0 = dist(np.arange(N, dtype=np.float64), mesh, None)
        k = NODE_RESULT_MIN_BYTES // 8
        for reads, shared in ((k, True), (k - 1, False)):
            plan = ps.gather_plan(np.zeros(reads, np.int64), like=x0, method="shm")
            got = plan.gather(x0)
            assert np.all(got == 0.0) and got.shape == (reads,)
            want = shared and plan.exchange.core.on_node_transport
            assert is_node_shared(got) == want, (reads, want)
    with ps.config.override(PYSHARD_POOL_MIN_BYTES=1):
        owners_write_results(mesh, pattern, dtype, feat)


def owners_write_results(mesh, pattern, dtype, feat):
    P, me = mesh.size, mesh.rank
    sizes = layout_sizes("uneven", N, P)
    idxs = [indices_of(pattern, 7, q) for q in range(P)]
    g = make_global((N,) + feat, dtype)
    x = dist(g, mesh, sizes)
    plan = ps.gather_plan(idxs[me], like=x, method="shm")
    core = plan.exchange.core
    want_idx = np.asarray(idxs[me], np.int64)
    if core.on_node_transport and pattern == "runs":
        node_peers = set(owner_of(want_idx, np.cumsum([0] + list(sizes)))) - {me}
        node_peers &= set(core.node.node_ranks)  # (two hosts: the others come by MPI)
        assert core.node_groups_direct == len(node_peers), (me, core.node_groups_direct)
    kept, failures = [], []
    for step in range(3):
        got = wait_by_test(plan.gather(x, wait=False)) if step == 1 else plan.gather(x)
        if got.shape != (len(want_idx),) + feat or got.dtype != np.dtype(dtype):
            failures.append(f"{pattern} gather {step}: {got.shape} {got.dtype}")
        elif not np.array_equal(got, g[want_idx]):
            failures.append(f"{pattern} gather {step}")
        if got.size and core.on_node_transport:
            if got.ctypes.data % 64 != 0 or not is_node_shared(got):
                failures.append(f"{pattern} gather {step}: at {got.ctypes.data}, not shared")
        kept.append((got, g[want_idx].copy()))
        vals = [values_of(50 + step, q, len(idxs[q]), dtype, feat, "sum") for q in range(P)]
        plan.scatter(vals[me].copy(), into=x)
        g = scatter_expected(g, idxs, vals, "sum")
        if not np.array_equal(x.local, g[x.box]):
            failures.append(f"{pattern} scatter {step}")
    for step, (got, want) in enumerate(kept):
        if not np.array_equal(got, want):
            failures.append(f"{pattern} kept result {step}")
    agree(mesh.comm, failures)


def test_tune_picks_one_method_on_every_rank(mesh):
    """method="tune": the first gather and the first scatter each time every candidate and
    keep the fastest, the same on every rank; the results are the oracle's, and the scatter's
    trials (on a copy) leave into= changed once."""
    P, me = mesh.size, mesh.rank
    sizes = layout_sizes("uneven", N, P)
    idxs = [indices_of("random", 17, q) for q in range(P)]
    g = make_global((N, 2), "float64")
    x = dist(g, mesh, sizes)
    plan = ps.gather_plan(idxs[me], like=x, method="tune")
    assert plan.route.path == ("tune" if P > 1 else "local")
    want_idx = np.asarray(idxs[me], np.int64)
    np.testing.assert_array_equal(plan.gather(x), g[want_idx])
    vals = [values_of(40, q, len(idxs[q]), "float64", (2,), "sum") for q in range(P)]
    plan.scatter(vals[me].copy(), into=x)
    g = scatter_expected(g, idxs, vals, "sum")
    np.testing.assert_array_equal(x.local, g[x.box])
    if P > 1:
        chosen = MPI.COMM_WORLD.allgather(dict(plan.chosen))
        assert all(c == chosen[0] for c in chosen), chosen
        assert set(chosen[0]) == {"gather", "scatter"}
        # never neighbor (its collective cannot carry a rank's bad values or x: a later bad
        # call would hang every other rank)
        assert "neighbor" not in plan.route.candidates
        assert set(chosen[0].values()) <= {"p2p", "persistent", "shm"}
        assert f"tune: gather by {chosen[0]['gather']}, scatter by " in plan.explain()
    else:
        assert plan.chosen == {}
    np.testing.assert_array_equal(wait_by_test(plan.gather(x, wait=False)), g[want_idx])
    plan.scatter(vals[me].copy(), into=x)
    np.testing.assert_array_equal(x.local, scatter_expected(g, idxs, vals, "sum")[x.box])


def test_take_and_scatter_add(mesh):
    P, me = mesh.size, mesh.rank
    sizes = layout_sizes("uneven", N, P)
    idxs = [indices_of("random", 12, q) for q in range(P)]
    g = make_global((N, 3), "int64")
    x = dist(g, mesh, sizes)
    np.testing.assert_array_equal(ps.take(x, idxs[me]), g[np.asarray(idxs[me], np.int64)])
    h = make_global((N,), "float64", seed=1)
    y = dist(h, mesh, sizes)
    vals = [values_of(13, q, len(idxs[q]), "float64", (), "sum") for q in range(P)]
    assert ps.scatter_add(y, idxs[me], vals[me]) is None
    np.testing.assert_array_equal(y.local, scatter_expected(h, idxs, vals, "sum")[y.box])


def sparse_global(n, seed):
    """A deterministic n x n sparse matrix (scipy CSR): a few entries a row at random columns,
    duplicates summed, values whose sums depend on their order; empty rows included."""
    sp = pytest.importorskip("scipy.sparse")
    rng = np.random.default_rng([seed, n])
    k = rng.integers(0, 5, size=n)
    k[::7] = 0
    rows = np.repeat(np.arange(n), k)
    cols = rng.integers(0, n, size=rows.size)
    vals = rng.standard_normal(rows.size) * 10.0 ** rng.integers(-8, 8, size=rows.size)
    return sp.csr_matrix((vals, (rows, cols)), shape=(n, n))


@pytest.mark.parametrize("form", ["csr", "coo", "csr_array", "indices"])
@pytest.mark.parametrize("layout", ["balanced", "uneven", "last"])
def test_csr_plan_products_equal_scipy(mesh, form, layout):
    """csr_plan: ``local @ plan.gather(x)`` is scipy's serial ``A @ x`` on this rank's rows,
    bit for bit (each row summed in its entries' order); the plan reads each column once,
    ascending; ``plan.scatter(local.T @ v)`` gives ``A.T @ v``; the index-array form gives
    positions with ``cols[pos] == indices``."""
    sp = pytest.importorskip("scipy.sparse")
    P, me = mesh.size, mesh.rank
    n = 3 * N
    sizes = layout_sizes(layout, n, P)
    a = sparse_global(n, 3)
    xg = make_global((n,), "float64", seed=2) * 1.000001 ** np.arange(n)
    x = dist(xg, mesh, sizes)
    rows = a[x.box]
    if form == "indices":
        plan, pos = ps.csr_plan(rows.indices, like=x)
        assert pos.dtype == np.int64
        np.testing.assert_array_equal(plan.indices[pos], rows.indices)
    else:
        given = {"csr": rows, "coo": rows.tocoo(), "csr_array": sp.csr_array(rows)}[form]
        plan, local = ps.csr_plan(given, like=x)
        assert local.shape == (rows.shape[0], plan.n)
        if form == "csr_array":
            assert isinstance(local, sp.csr_array)
        y = local @ plan.gather(x)
        np.testing.assert_array_equal(y, rows @ xg)
        # the transpose: each rank's contributions added into the columns' owners
        v = make_global((rows.shape[0],), "float64", seed=me + 4)
        out = dist(np.zeros(n), mesh, sizes)
        plan.scatter(local.T @ v, into=out)
        vg = np.concatenate([make_global((b.stop - b.start,), "float64", seed=q + 4)
                             for q, b in enumerate(boxes_of(sizes, n, P))])
        np.testing.assert_allclose(out.local, (a.T @ vg)[out.box], rtol=1e-12, atol=1e-300)
    np.testing.assert_array_equal(plan.indices, np.unique(rows.indices))


def boxes_of(sizes, n, P):
    off = offsets_of(sizes, n, P)
    return [slice(int(off[q]), int(off[q + 1])) for q in range(P)]


def test_csr_plan_wrong_columns_raises_on_every_rank(mesh):
    """One rank's matrix has a column too many: every rank raises in the same call (that rank
    says what was wrong, the others name it), and a plan works afterwards."""
    pytest.importorskip("scipy.sparse")
    P, me = mesh.size, mesh.rank
    a = sparse_global(N, 5)
    x = dist(make_global((N,), "float64"), mesh, None)
    rows = a[x.box]
    bad = P - 1
    if me == bad:
        rows = type(rows)((rows.data, rows.indices, rows.indptr), shape=(rows.shape[0], N + 1))
    with pytest.raises(ValueError) as e:
        ps.csr_plan(rows, like=x)
    msg = str(e.value)
    assert msg.startswith(f"pyshard.csr_plan: rank {bad}'s matrix is bad (a column count "
                          "other than like's rows)"), msg
    assert (f"{N} columns needed" in msg) == (me == bad), msg  # the detail where it was wrong
    plan, local = ps.csr_plan(a[x.box], like=x)
    np.testing.assert_array_equal(local @ plan.gather(x),
                                  a[x.box] @ make_global((N,), "float64"))


# --- errors -------------------------------------------------------------------------------

REASON = {"range": "an index outside [0, N)", "negative": "an index outside [0, N)",
          "float": "indices not integers", "2d": "indices not 1-D",
          "sorted_high": "an index outside [0, N)", "sorted_low": "an index outside [0, N)"}


def bad_indices(kind, rank, good):
    if kind == "range":
        return np.concatenate([good, [N]]).astype(np.int64), f"indices[{len(good)}] = {N} is " \
            f"outside [0, {N})"
    if kind == "negative":
        return np.array([0, -1, 2], np.int64), f"indices[1] = -1 is outside [0, {N})"
    if kind == "sorted_high":  # increasing: the check's fast path reads the ends
        return np.array([0, 1, N + 4], np.int64), f"indices[2] = {N + 4} is outside [0, {N})"
    if kind == "sorted_low":
        return np.array([-3, 0, 1], np.int64), f"indices[0] = -3 is outside [0, {N})"
    if kind == "float":
        return np.array([0.0, 1.5]), "indices must be integers, got dtype float64"
    return np.zeros((2, 2), np.int64), "indices must be 1-D, got shape (2, 2)"


@pytest.mark.parametrize("kind,algorithm", [("range", "auto"), ("negative", "auto"),
                                            ("sorted_high", "auto"), ("sorted_low", "alltoall"),
                                            ("float", "alltoall"), ("2d", "auto"),
                                            ("mixed", "auto"), ("mixed", "alltoall")])
def test_bad_indices_raise_on_every_rank(mesh, kind, algorithm):
    """``range``: rank P-1 alone is bad; the others: every rank from P//2 up is bad
    (``mixed``: each of its own kind); every rank raises, naming the first."""
    P, me = mesh.size, mesh.rank
    sizes = layout_sizes("uneven", N, P)
    x = dist(make_global((N, 2), "float64"), mesh, sizes)
    good = np.asarray(indices_of("random", 5, me), np.int64)
    first = P - 1 if kind == "range" else P // 2
    kinds = ["range", "float", "2d", "negative"]
    mine = kinds[(me - first) % 4] if kind == "mixed" else kind
    bad = me == P - 1 if kind == "range" else me >= P // 2
    idx, detail = bad_indices(mine, me, good) if bad else (good, None)
    with pytest.raises(ValueError) as e:
        ps.gather_plan(idx, like=x, algorithm=algorithm)
    msg = str(e.value)
    reason = REASON["range" if kind == "mixed" else kind]
    assert f"rank {first}'s indices are bad ({reason})" in msg, msg
    if me == first:
        assert detail in msg, msg
    # the mesh works afterwards, on every rank
    plan = ps.gather_plan(good, like=x, algorithm=algorithm)
    np.testing.assert_array_equal(plan.gather(x), make_global((N, 2), "float64")[good])


def no_messages(fn, exc, match, plan):
    before, mine = ps.comm_stats(), plan.comm_stats()
    with pytest.raises(exc, match=match):
        fn()
    assert ps.comm_stats() == before and plan.comm_stats() == mine


def test_local_errors(mesh):
    """Every rank passes the same kind of bad argument to a run of the plan: each raises
    before any message, and the plan runs afterwards."""
    P, me = mesh.size, mesh.rank
    sizes = layout_sizes("uneven", N, P)
    g = make_global((N, 2), "float64")
    x = dist(g, mesh, sizes)
    idx = np.asarray(indices_of("random", 6, me), np.int64)
    plan = ps.gather_plan(idx, like=x)
    n = len(idx)
    # a rank's bad values or out: it takes part without them (so a peer never waits) and
    # raises its own error; here every rank does, so each names its own fault
    before = x.local.copy()
    for fn, match in [
            (lambda: plan.scatter(np.zeros((n + 1, 2)), into=x), r"values must have shape"),
            (lambda: plan.scatter(np.zeros((n, 2), np.float32), into=x), r"dtype float64"),
            (lambda: plan.scatter(np.zeros((n, 3)), into=x), "values must"),
            (lambda: plan.gather(x, out=np.zeros((n + 1, 2))), "out must"),
            (lambda: plan.gather(x, out=np.zeros((n, 2), np.float32)), "out must"),
            # out over x's own memory (its rows read as they are overwritten: wrong rows)
            # (a rank that cannot alias it, with no rows or too few, passes a bad shape)
            (lambda: plan.gather(x, out=x.local[:n] if 0 < n <= x.local.shape[0] else
                                 np.zeros((n + 1, 2))), "out")]:
        with pytest.raises(ValueError, match=match):
            fn()
        np.testing.assert_array_equal(x.local, before)  # nothing combined
    no_messages(lambda: plan.scatter(np.zeros((n, 2)), into=x, op="prod"), ValueError,
                "op must be one of", plan)
    no_messages(lambda: plan.scatter(np.zeros((n, 2), np.longdouble),
                                     into=dist(g.astype(np.longdouble), mesh, sizes)),
                ValueError, "does not combine", plan)
    xc = dist(make_global((N, 2), "complex128"), mesh, sizes)
    no_messages(lambda: plan.scatter(np.zeros((n, 2), np.complex128), into=xc, op="max"),
                ValueError, "not defined for complex", plan)
    if all(len(indices_of("random", 6, q)) > 1 for q in range(P)):  # an empty out is both
        with pytest.raises(ValueError, match="out must"):
            plan.gather(x, out=np.zeros((2, n)).T)
    # into= laid out differently from like=: more rows, another split, another placement
    other = [dist(make_global((N + 1, 2), "float64"), mesh, None),
             ps.distribute(g, mesh, [Replicate()])]
    if P > 1:
        other.append(dist(g, mesh, layout_sizes("last", N, P)))
    for y in other:
        no_messages(lambda y=y: plan.scatter(np.zeros((n, 2)), into=y), ValueError,
                    "laid out differently", plan)
        # a gather's x: each rank takes part without rows (a rank alone at fault leaves
        # none of its readers waiting: test_bad_x_on_one_rank), then raises its own error
        calls = plan.comm_stats()["gather"]
        with pytest.raises(ValueError, match="laid out differently"):
            plan.gather(y)
        assert plan.comm_stats()["gather"] == calls  # (a failed call is not counted)
    with pytest.raises(TypeError, match="ShardedArray"):
        plan.gather(g)
    # one exchange in flight at a time
    p = plan.gather(x, wait=False)
    with pytest.raises(RuntimeError, match="in flight"):
        plan.scatter(np.zeros((n, 2)), into=x)
    np.testing.assert_array_equal(p.wait(), g[idx])
    # the plan works after all of it
    np.testing.assert_array_equal(plan.gather(x), g[idx])
    with pytest.raises(ValueError, match="algorithm must be"):
        ps.gather_plan(idx, like=x, algorithm="fast")
    with pytest.raises(ValueError, match="method must be"):
        ps.gather_plan(idx, like=x, method="rdma")
    with pytest.raises(ValueError, match="index space"):
        ps.gather_plan(idx, like=ps.distribute(g, mesh, [Replicate()]))


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("method", ["p2p", "persistent", "shm"])
@pytest.mark.parametrize("fault", ["rows", "dtype", "into"])
def test_bad_values_on_one_rank(mesh, method, fault):
    """One rank's scatter values are bad (or its into is read-only): it raises its own error,
    every owner it sends rows to raises naming it and combines nothing, the other ranks'
    rows get what the order rule gives without it, and the next scatter is exact: no rank
    waits, no message is left over (by messages, persistent requests and node-shared
    memory). A gather with one rank's out wrong: that rank raises, the others get their
    rows."""
    P, me = mesh.size, mesh.rank
    sizes = layout_sizes("uneven", N, P)
    offsets = offsets_of(sizes, N, P)
    idxs = [indices_of("random", 21, q) for q in range(P)]
    f = max(q for q in range(P) if len(idxs[q]))  # the rank at fault: it sends values
    g = make_global((N, 2), "float64")
    x = dist(g, mesh, sizes)
    plan = ps.gather_plan(idxs[me], like=x, method=method)
    vals = [values_of(22, q, len(idxs[q]), "float64", (2,), "sum") for q in range(P)]
    mine = vals[me]
    into = x
    if me == f:
        if fault == "rows":
            mine = np.zeros((len(idxs[me]), 3))
        elif fault == "dtype":
            mine = mine.astype(np.float32)
        else:
            ro = x.local.copy()
            ro.flags.writeable = False
            into = ps.ShardedArray.wrap(ro, x.layout, mesh)
    hit = {int(o) for o in owner_of(np.asarray(idxs[f], np.int64), offsets)} - {f}
    failures = []
    try:
        plan.scatter(mine, into=into)
        if me == f or me in hit:
            failures.append("no error")
    except ValueError as e:
        want = ("values must" if fault != "into" else "into's local array") if me == f \
            else f"rank {f}'s values or into were bad"
        if want not in str(e) or (me != f and me not in hit):
            failures.append(f"error {e}")
    kept = [v if q != f else np.zeros((0, 2)) for q, v in enumerate(vals)]
    ids = [i if q != f else [] for q, i in enumerate(idxs)]
    want = g if me == f or me in hit else scatter_expected(g, ids, kept, "sum")
    if not np.array_equal(x.local, want[x.box]):
        failures.append("rows after the failed scatter")
    # the next scatter and gather are exact on every rank
    x = dist(g, mesh, sizes)
    plan.scatter(vals[me], into=x)
    if not np.array_equal(x.local, scatter_expected(g, idxs, vals, "sum")[x.box]):
        failures.append("the next scatter")
    h = scatter_expected(g, idxs, vals, "sum")[np.asarray(idxs[me], np.int64)]
    n = len(idxs[me])
    try:
        got = plan.gather(x, out=np.zeros((n + 1, 2)) if me == f else None)
        if me == f:
            failures.append("gather: no error")
        elif not np.array_equal(got, h):
            failures.append("gather beside a wrong out")
    except ValueError as e:
        if me != f or "out must" not in str(e):
            failures.append(f"gather error {e}")
    if not np.array_equal(plan.gather(x), h):
        failures.append("the next gather")
    agree(mesh.comm, failures)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("method", ["p2p", "persistent", "shm", "tune"])
@pytest.mark.parametrize("fault", ["layout", "type", "rows", "dtype"])
def test_bad_x_on_one_rank(mesh, method, fault):
    """One rank's gather gets an x it cannot use (another layout, no ShardedArray, or its
    .local replaced by one of another row count or dtype): it takes part without rows and
    raises its own error; every rank that reads rows it owns raises ValueError naming it
    (they waited for ever: the core's forward path had no mark; a replaced .local was
    blamed on "different gather plans" or, the dtype's item size the same, sent as the
    layout's), the others get their rows; the next gather is exact on every rank."""
    P, me = mesh.size, mesh.rank
    sizes = layout_sizes("uneven", N, P)
    offsets = offsets_of(sizes, N, P)
    idxs = [indices_of("random", 23, q) for q in range(P)]
    f = P - 1 if sizes[P - 1] else max(q for q in range(P) if sizes[q])  # owns rows
    g = make_global((N, 2), "float64")
    x = dist(g, mesh, sizes)
    plan = ps.gather_plan(idxs[me], like=x, method=method)
    mine = x
    if me == f:
        mine = {"layout": lambda: ps.distribute(g, mesh, [Replicate()]),
                "type": lambda: x.local,
                "rows": lambda: ShardedArray.wrap(x.local[:-1], x.layout, mesh),
                "dtype": lambda: ShardedArray.wrap(x.local.astype(np.int64), x.layout,
                                                   mesh)}[fault]()
    readers = {q for q in range(P) if q != f and
               (owner_of(np.asarray(idxs[q], np.int64), offsets) == f).any()}
    want = g[np.asarray(idxs[me], np.int64)]
    failures = []
    try:
        got = plan.gather(mine)
        if me == f or me in readers:
            failures.append("no error")
        elif not np.array_equal(got, want):
            failures.append("rows of a rank that reads none of the bad rank's")
    except (TypeError, ValueError) as e:
        mine_err = {"layout": "laid out differently", "type": "expected a ShardedArray"}.get(
            fault, "was .local replaced")
        if me == f:
            if mine_err not in str(e):
                failures.append(f"own error {e}")
        elif me not in readers or f"rank {f}'s x could not be used" not in str(e):
            failures.append(f"error {e}")
    if not np.array_equal(plan.gather(x), want):
        failures.append("the next gather")
    p = plan.gather(x, wait=False)
    if not np.array_equal(p.wait(), want):
        failures.append("a gather after it, wait=False")
    agree(mesh.comm, failures)


@pytest.mark.mpi(min_size=2)
def test_like_laid_out_differently_on_one_rank(mesh):
    """One rank's like= has another split of the rows: the setup raises on every rank."""
    P, me = mesh.size, mesh.rank
    sizes = layout_sizes("last" if me == P - 1 else "balanced", N, P)
    x = dist(make_global((N,), "float64"), mesh, sizes)
    with pytest.raises(ValueError, match="like= is laid out differently"):
        ps.gather_plan(np.arange(min(N, 4)), like=x)
    y = dist(make_global((N,), "float64"), mesh, None)
    np.testing.assert_array_equal(ps.take(y, [1, 0, 1]), make_global((N,), "float64")[[1, 0, 1]])


# --- explain, comm_stats ------------------------------------------------------------------

def peers(idxs, offsets, me):
    """What the plan of rank ``me`` must hold: distinct rows read per owner, the owners read
    (others), the readers served and the rows they read from ``me``."""
    P = len(idxs)
    distinct = [np.unique(np.asarray(i, np.int64)) for i in idxs]
    counts = np.bincount(owner_of(distinct[me], offsets), minlength=P)
    owners = [p for p in range(P) if p != me and counts[p]]
    served = [int((owner_of(distinct[q], offsets) == me).sum()) if q != me else 0
              for q in range(P)]
    readers = [q for q in range(P) if served[q]]
    return counts, owners, readers, sum(served)


@pytest.mark.parametrize("layout,algorithm", [("uneven", "auto"), ("balanced", "alltoall")])
def test_explain_and_comm_stats(mesh, layout, algorithm):
    P, me = mesh.size, mesh.rank
    sizes = layout_sizes(layout, N, P)
    offsets = offsets_of(sizes, N, P)
    idxs = [indices_of("random", 8, q) for q in range(P)]
    g = make_global((N, 3), "float64")
    x = dist(g, mesh, sizes)
    before = ps.comm_stats()
    plan = ps.gather_plan(idxs[me], like=x, algorithm=algorithm, method="p2p")
    setup = {k: v - before.get(k, 0) for k, v in ps.comm_stats().items()
             if v != before.get(k, 0)}
    assert setup.get("index_setup") == 1
    assert set(setup) <= {"index_setup", "migrate_nbx" if algorithm == "auto"
                          else "migrate_alltoall"}, setup
    counts, owners, readers, rows_out = peers(idxs, offsets, me)
    rows_in = int(counts.sum() - counts[me])
    n, distinct = len(idxs[me]), int(counts.sum())
    np.testing.assert_array_equal(plan.counts, counts)
    text = plan.explain()
    assert f"on {P} ranks, rank {me}: {n} indices ({distinct} distinct rows, " \
        f"{n - distinct} duplicates) into {N} rows" in text, text
    assert f"path {'mpi' if P > 1 else 'local'}" in text, text
    assert f"setup {'nbx' if algorithm == 'auto' else 'alltoall'}" in text, text
    assert f"own rows read locally: {int(counts[me])}" in text, text
    assert f"gather: {len(owners)} groups of rows in from {owners} ({rows_in} rows), " \
        f"{len(readers)} out to {readers} ({rows_out} rows)" in text, text
    assert plan.route.path == ("mpi" if P > 1 else "local")
    before = ps.comm_stats()
    vals = np.ones((n, 3))
    plan.gather(x)
    plan.scatter(vals, into=x)
    wait_by_test(plan.gather(x, wait=False))
    steady = {k: v - before.get(k, 0) for k, v in ps.comm_stats().items()
              if v != before.get(k, 0)}
    sent = 2 * len(readers) + len(owners)
    assert steady == ({"index_messages": sent} if sent else {}), steady  # no collective
    rb = 3 * 8
    assert plan.comm_stats() == {
        "gather": 2, "scatter": 1, "setup_messages": len(owners),
        "messages_sent": sent, "messages_received": 2 * len(owners) + len(readers),
        "bytes_sent": (2 * rows_out + rows_in) * rb,
        "bytes_received": (2 * rows_in + rows_out) * rb,
    }


# --- every MPI call, by a PMPI shim -------------------------------------------------------

P2P = {"Isend", "Irecv", "Isend_c", "Irecv_c"}


@pytest.mark.spawns  # starts mpiexec jobs of its own (the matrix's 1-rank run)
@pytest.mark.parametrize("method", [
    "p2p",
    # numerics: no MPI call at all on node-shared memory, whatever the library (the matrix's
    # 1-rank run keeps p2p and auto, which make them)
    pytest.param("shm", marks=pytest.mark.numerics),
    "auto",
])
def test_index_calls_by_pmpi(comm, shim, method):  # noqa: F811
    """4 ranks with the PMPI shim preloaded (index_worker.py): the setup's one collective is
    the NBX reduction; a steady gather (blocking, and wait=False driven by test()) and
    scatter make only Isend and Irecv, one per peer the plan names, and no collective. With
    method shm on one node (node-shared memory between its ranks) they make no MPI call;
    with auto the gathers make none and the scatters their messages."""
    launch.require(comm)
    r = launch.run(4, ["env", f"LD_PRELOAD={shim}", sys.executable,
                       os.path.join(HERE, "index_worker.py"), method],
                   env={"PYSHARD_TEST_PMPI": shim}, timeout=240)  # fmt: skip
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    ranks = json.loads([ln for ln in r.stdout.splitlines() if ln.startswith("[")][-1])
    assert len(ranks) == 4
    assert any(o["owners"] for o in ranks) and any(not o["owners"] for o in ranks)
    for me, o in enumerate(ranks):
        assert o["ok"], me
        assert o["path"] == ("mpi" if method == "p2p" else "shm"), (me, o["path"])
        owners, readers = o["owners"], o["readers"]
        s = o["setup"]
        assert {k: v for k, v in s.items() if k in COLLECTIVE} == {"Iallreduce": 1}, (me, s)
        assert s.get("Issend", 0) == len(owners), (me, s)  # the counts, to the owners read
        assert s.get("Isend", 0) + s.get("Isend_c", 0) == len(owners), (me, s)  # the rows
        assert s.get("Irecv", 0) + s.get("Irecv_c", 0) == len(readers), (me, s)
        for call, out, into in (("gather", readers, owners), ("pending", readers, owners),
                                ("scatter", owners, readers)):
            c = o[call]
            if method == "shm" or (method == "auto" and call != "scatter"):
                assert not c, (me, call, c)  # every peer on this node: no MPI call at all
                continue
            assert set(c) <= P2P, (me, call, c)  # no collective, no other message
            assert c.get("Isend", 0) + c.get("Isend_c", 0) == len(out), (me, call, c, out)
            assert c.get("Irecv", 0) + c.get("Irecv_c", 0) == len(into), (me, call, c, into)


@pytest.mark.spawns  # starts mpiexec jobs of its own (the matrix's 1-rank run)
def test_setup_rounds_agree_after_communicators_are_reused(comm):
    """nbx_worker.py at 2 and 3 ranks: meshes made and freed, rank 0 alone holding a
    communicator of its own in between, so each rank's next communicator handle differs; the
    NBX setups on the new meshes still agree on their message tags (a job that hangs is
    killed at the timeout and fails here)."""
    launch.require(comm)
    for n in (2, 3):
        r = launch.run(n, [sys.executable, os.path.join(HERE, "nbx_worker.py")], timeout=120)
        assert r.returncode == 0 and r.stdout.strip().endswith("ok"), (
            n, r.stdout[-2000:] + r.stderr[-2000:])


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("method", ["p2p", "persistent", "shm"])
def test_rows_that_differ_between_ranks(method):
    """Ranks that disagree on the rows (the last rank's are 64 wide, the others' 1, on one
    dim-0 table): every rank raises, none waits, and nothing is written past a node peer's
    segment (the shm path wrote there: wrong rows, or a segfault where it went far enough);
    then a gather of agreeing arrays is exact. On a mesh of its own, so that its node pool
    holds no segment larger than this plan's."""
    comm = MPI.COMM_WORLD
    P, me = comm.size, comm.rank
    mesh = ps.Mesh(comm, (P,))
    try:
        # shm: each owner's rows for a reader 32 x 504 bytes more than it expects (past any
        # page of slack); by messages 2 columns against 1, within the eager limit: a longer
        # message past it (a rendezvous) crashed Open MPI 4.1.4 and 5.0.11 (MPI_Wait's error
        # path; plain mpi4py too: a library fault, MPICH and Intel MPI raise)
        n = 32 * P
        w = (64 if method == "shm" else 2) if me == P - 1 else 1
        rows = np.arange(32 * me, 32 * me + 32, dtype=np.float64)
        x = ps.from_local(np.repeat(rows[:, None], w, axis=1), mesh, [Shard(0)],
                          global_shape=(n, w))
        idx = np.arange(n)  # every rank reads every row: every pair exchanges
        plan = ps.gather_plan(idx, like=x, method=method)
        raised = ""
        try:
            plan.gather(x)
        except (ValueError, RuntimeError) as e:
            raised = f"{type(e).__name__}: {e}"
        assert raised, "a gather of rows that differ between ranks returned"
        g = make_global((n, 3), "float64")
        y = dist(g, mesh, None)
        plan2 = ps.gather_plan(idx, like=y, method=method)
        np.testing.assert_array_equal(plan2.gather(y), g[idx])
    finally:
        mesh.free()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("direction", ["gather", "scatter"])
def test_two_plans_started_in_another_order(mesh, direction):
    """Two plans in flight, started A then B on rank 0 and B then A on the others (a user
    error): every rank raises, and each error says the ranks disagree; none blames another
    rank's values (a shorter message was taken for a reader's empty bad-values mark, which
    told the owner "rank q's values were bad"). The plans work afterwards."""
    P, me = mesh.size, mesh.rank
    n = 8 * P
    x = dist(make_global((n, 2), "float64"), mesh, None)
    peer = (me + 1) % P  # 8 rows each: peer's first k rows
    idx = {k: np.arange(8 * peer, 8 * peer + k) for k in (3, 5)}
    plans = {k: ps.gather_plan(idx[k], like=x, method="p2p") for k in (3, 5)}
    order = (3, 5) if me == 0 else (5, 3)
    intos = {k: dist(np.zeros((n, 2)), mesh, None) for k in (3, 5)}
    if direction == "gather":
        pending = [plans[k].gather(x, wait=False) for k in order]
    else:
        pending = [plans[k].scatter(np.ones((k, 2)), into=intos[k], wait=False) for k in order]
    failures, raised = [], 0
    for h in pending:
        try:
            h.wait()
        except (ValueError, RuntimeError) as e:
            raised += 1
            if "values or into were bad" in str(e) or "disagree" not in str(e):
                failures.append(f"{type(e).__name__}: {e}")
    # the receivers whose sender started the plans in the other order: rank 0's rows go to
    # rank P - 1 (gathers), rank 0's values to rank 1 (scatters), and rank 0 hears from both
    if me in (0, P - 1 if direction == "gather" else 1) and not raised:
        failures.append("no error")
    g = make_global((n, 2), "float64")
    for k in (3, 5):
        got = plans[k].gather(x)
        if not np.array_equal(got, g[idx[k]]):
            failures.append(f"the plan of {k} rows afterwards")
    agree(mesh.comm, failures)


def test_array_on_an_equal_mesh_is_named(mesh):
    """An array of the plan's layout on another, equal Mesh object (a restart that made a new
    mesh): the error names the mesh object, not a layout that differs (it read "laid out
    differently ... same shard table", though the tables were equal)."""
    other = ps.Mesh(MPI.COMM_WORLD, (MPI.COMM_WORLD.size,))
    try:
        g = make_global((N, 2), "float64")
        plan = ps.gather_plan(np.arange(3), like=dist(g, mesh, None))
        y = dist(g, other, None)
        with pytest.raises(ValueError, match="another Mesh object than the plan's"):
            plan.gather(y)
        with pytest.raises(ValueError, match="another Mesh object than the plan's"):
            plan.scatter(np.ones((3, 2)), into=y)
    finally:
        other.free()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("method", ["p2p", "shm"])
def test_plan_after_mesh_free_raises(method):
    """A plan kept past its mesh's free(): gather and scatter raise the freed mesh's
    RuntimeError on every rank, before any communication (the shm path's node memory was
    released: it segfaulted; then a scatter still ran, and the plan kept the mesh's
    communicator: a loop that kept its plans ran out of communicators though it freed every
    mesh)."""
    comm = MPI.COMM_WORLD
    mesh = ps.Mesh(comm, (comm.size,))
    g = make_global((N, 2), "float64")
    x = dist(g, mesh, None)
    idx = indices_of("random", 31, mesh.rank)
    plan = ps.gather_plan(idx, like=x, method=method)
    np.testing.assert_array_equal(plan.gather(x), g[idx])
    mesh.free()
    with pytest.raises(RuntimeError, match="mesh was freed"):
        plan.gather(x)
    with pytest.raises(RuntimeError, match="mesh was freed"):
        plan.scatter(np.ones((len(idx), 2)), into=x)


def test_plan_keeps_its_indices_and_validation_names_plans_out_of_order(mesh):
    """plan.indices is the plan's own copy (the caller's buffer reused afterwards changed
    it); under PYSHARD_VALIDATE, two plans started in different orders on different ranks
    raise on every rank, naming the plans (without it they exchange each other's rows where
    the sizes match: the docs ask for the same order everywhere)."""
    P, me = mesh.size, mesh.rank
    g = make_global((N, 2), "float64")
    x = dist(g, mesh, layout_sizes("balanced", N, P))
    buf = np.asarray(indices_of("random", 5, me), np.int64)
    want = buf.copy()
    a = ps.gather_plan(buf, like=x)
    buf[...] = 0
    np.testing.assert_array_equal(a.indices, want)
    np.testing.assert_array_equal(a.gather(x), g[want])
    b = ps.gather_plan(want[::-1].copy(), like=x)
    if P < 2:
        return
    ps.set_validation(True)
    try:
        first, second = (a, b) if me % 2 == 0 else (b, a)
        with pytest.raises(ValueError, match="gather plan #"):
            first.gather(x, wait=False)
        msgs = MPI.COMM_WORLD.allgather(str(ps.config.get("PYSHARD_VALIDATE")))
        assert len(set(msgs)) == 1
        del second
    finally:
        ps.config.reset("PYSHARD_VALIDATE")
    np.testing.assert_array_equal(b.gather(x), g[want[::-1]])  # the plans still run


@pytest.mark.parametrize("kind", ["gather", "scatter"])
def test_plans_started_in_different_orders_through_shm_raise(mesh, kind):
    """Two gather plans in flight, started in different orders on different ranks, through
    node-shared memory, where the plans read different numbers of rows from a node peer:
    every rank of the node raises (the docs: "an error where the sizes do not match"); they
    wrote past the peer's group (into rows another peer had delivered) and returned wrong
    rows silently. Each rank's table now carries the bytes it expects from each node peer,
    checked before anything is written. The plans still run in order afterwards."""
    P, me = mesh.size, mesh.rank
    if P < 2:
        pytest.skip("one rank: no peers")
    groups = mesh.node_groups((0,))
    if mesh.node_transport((0,)) is None or len(set(groups.values())) != 1:
        pytest.skip("ranks on several nodes, or no node-shared memory")
    n = 8 * P
    g = make_global((n, 3), "float64")
    owners = [1] + [0] * (P - 2) + [n - 1]  # rank 0 owns row 0, the last rank the rest
    x = dist(g, mesh, owners)
    rows = np.arange(1, n)
    i1 = rows[:3 + me] if me == 0 else rows[:1]  # rank 0 reads 3 rows of the last rank, then 4
    i2 = rows[:4] if me == 0 else rows[1:2]
    p1 = ps.gather_plan(np.asarray(i1, np.int64), like=x, method="shm")
    p2 = ps.gather_plan(np.asarray(i2, np.int64), like=x, method="shm")
    if p1.route.path != "shm":
        pytest.skip("no node-shared memory for gathers here (PYSHARD_TRANSPORT=mpi)")
    first, second = (p1, p2) if me == 0 else (p2, p1)

    def run(p):
        if kind == "gather":
            return p.gather(x, wait=False)
        return p.scatter(np.ones((len(p.indices), 3)), into=x, wait=False)

    err = None
    try:
        a = run(first)
        b = run(second)
        a.wait()
        b.wait()
    except RuntimeError as e:
        err = str(e)
    errs = MPI.COMM_WORLD.allgather(err)
    assert all(e is not None for e in errs), errs  # every rank of the node raised
    assert any("different gather plans" in e for e in errs), errs
    x = dist(g, mesh, owners)
    np.testing.assert_array_equal(p1.gather(x), g[i1])  # in step: the plans still run
    np.testing.assert_array_equal(p2.gather(x), g[i2])


def test_a_dropped_handle_is_waited_for_through_the_plan(mesh):
    """A PendingIndex dropped without wait() left its plan refusing every later call ("still
    in flight") with no handle to wait on: plan.pending is that handle."""
    P, me = mesh.size, mesh.rank
    g = make_global((N, 2), "float64")
    x = dist(g, mesh, layout_sizes("balanced", N, P))
    idx = np.asarray(indices_of("random", 6, me), np.int64)
    plan = ps.gather_plan(idx, like=x)
    assert plan.pending is None
    plan.gather(x, wait=False)  # dropped
    with pytest.raises(RuntimeError, match="plan.pending"):
        plan.gather(x)
    np.testing.assert_array_equal(plan.pending.wait(), g[idx])
    assert plan.pending is None
    np.testing.assert_array_equal(plan.gather(x), g[idx])

