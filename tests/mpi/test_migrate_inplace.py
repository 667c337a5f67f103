"""pyshard.migrate(..., inplace=True): the result in the input's own columns, only the moving
rows copied. Each rank builds the in-place arrangement its rule names (staying rows keep their
places, arrivals by source rank take the leavers' places in increasing order then rows n,
n+1, ..., the last staying rows fill what is left) from the same generated rows as
test_migrate.py's grouped oracle, and the result must equal it bit for bit; back() must give
the input back; bad input must raise on every rank."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI
from test_migrate import PATTERNS, columns_spec, expected, rows_of, same, spin

import pyshard as ps

pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module")
def mesh():
    m = ps.Mesh(MPI.COMM_WORLD, (MPI.COMM_WORLD.size,))
    yield m
    m.free()


def with_room(cols, room):
    """The columns copied into arrays of ``len + room`` rows (the rows first)."""
    out = {}
    for k, a in cols.items():
        b = np.zeros((a.shape[0] + room,) + a.shape[1:], a.dtype)
        b[:a.shape[0]] = a
        out[k] = b
    return out


def inplace_oracle(cols, dest, me, grouped, counts):
    """The rule, written out row by row: what the first m rows must hold."""
    n = dest.shape[0]
    m = int(counts.sum())
    stay = np.flatnonzero(dest == me)
    holes = [int(i) for i in np.flatnonzero(dest != me)]
    before = int(counts[:me].sum())
    arrivals = list(range(before)) + list(range(before + len(stay), m))  # grouped rows
    places = {}
    for k, g in enumerate(arrivals):
        places[holes[k] if k < len(holes) else n + k - len(holes)] = g
    if len(arrivals) < len(holes):
        left = holes[len(arrivals):]
        for j, i in enumerate(int(i) for i in stay if i >= m):
            places[left[j]] = ("stay", i)
    out = {}
    for key, a in cols.items():
        res = np.empty((m,) + a.shape[1:], a.dtype)
        for i in stay:  # staying rows keep their places (below m)
            if i < m:
                res[i] = a[i]
        for at, g in places.items():
            res[at] = a[g[1]] if isinstance(g, tuple) else grouped[key][g]
        out[key] = res
    return out


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("algorithm", ["alltoall", "nbx", "auto", "peers"])
@pytest.mark.parametrize("room", ["none", "some", "short"])
@pytest.mark.parametrize("seed", [0, 1])
def test_inplace_equals_the_rule(mesh, pattern, algorithm, room, seed):
    P, me = mesh.size, mesh.rank
    spec = columns_spec(seed + 10 * PATTERNS.index(pattern))
    cols, dest = rows_of(seed, me, P, pattern, spec)
    grouped, counts = expected(seed, me, P, pattern, spec)
    n, m = dest.shape[0], int(counts.sum())
    # "none": room for max(n, m) rows exactly; "some": more; "short": room for the n rows
    # only, so ranks that gain rows get new columns
    extra = {"none": max(m - n, 0), "some": 40 * P, "short": 0}[room]
    buf = with_room(cols, extra)
    orig = {k: a.copy() for k, a in buf.items()}
    peers = range(P) if algorithm == "peers" else None  # (every rank: a superset)
    r = ps.migrate(buf, dest, mesh, algorithm=algorithm, inplace=True, peers=peers)
    b = r.back(r.rows)  # (the collective calls first: a failed assert then stops no peer)
    for k in cols:
        same(b[k], cols[k])
    assert r.inplace and list(r.rows) == list(grouped)
    want = inplace_oracle(cols, dest, me, grouped, counts)
    fits = m <= n + extra
    assert r.storage_is_input is fits
    for k in grouped:
        same(r.rows[k], want[k])
        # the grouped order through `order`
        same(r.rows[k][r.order], grouped[k])
        if fits:  # the caller's own arrays, and nothing past row max(n, m) touched
            assert r.storage[k] is buf[k]
            assert m == 0 or np.shares_memory(r.rows[k], buf[k])
            same(buf[k][max(n, m):], orig[k][max(n, m):])
        else:
            assert r.storage[k].shape[0] >= m and not np.shares_memory(r.storage[k], buf[k])
    np.testing.assert_array_equal(r.counts, counts)
    assert "in place" in r.explain()


def test_inplace_steps_and_wait_false(mesh):
    """A particle loop: storage passed on step after step, with wait=False and test()."""
    P, me = mesh.size, mesh.rank
    rng = np.random.default_rng([5, me])
    n = 50
    store = {"id": np.zeros(400, np.int64), "x": np.zeros((400, 3))}
    store["id"][:n] = np.arange(n) + 1000 * me
    store["x"][:n] = store["id"][:n, None] * np.array([1.0, 2.0, 3.0])
    total = mesh.comm.allreduce(n)
    for step in range(4):
        dest = rng.integers(0, P, size=n) if step % 2 else (me + 1 + np.zeros(n, int)) % P
        h = ps.migrate(store, dest, mesh, inplace=True, wait=False)
        spin(h)
        r = h.wait()
        store, n = r.storage, r.m
        ids = r.rows["id"]
        np.testing.assert_array_equal(r.rows["x"], ids[:, None] * np.array([1.0, 2.0, 3.0]))
        assert mesh.comm.allreduce(n) == total
        everyone = np.sort(np.concatenate(mesh.comm.allgather(ids)))
        np.testing.assert_array_equal(everyone, np.sort(np.concatenate(
            [np.arange(50) + 1000 * s for s in range(P)])))


BAD = ["strided", "readonly", "list", "long_dest"]


@pytest.mark.parametrize("kind", BAD)
def test_inplace_bad_input_raises_on_every_rank(mesh, kind):
    P, me = mesh.size, mesh.rank
    culprit = P - 1
    x = {"a": np.arange(24.0).reshape(12, 2)}
    dest = np.arange(6) % P
    detail = None
    if me == culprit:
        if kind == "strided":
            x, detail = {"a": np.arange(48.0).reshape(12, 4)[:, ::2]}, "not C-contiguous"
        elif kind == "readonly":
            x["a"].flags.writeable = False
            detail = "read-only"
        elif kind == "list":
            x, detail = {"a": x["a"].tolist()}, "must be a numpy array"
        else:
            dest, detail = np.arange(13) % P, "13 entries for columns with room for 12 rows"
    with pytest.raises(ValueError) as e:
        ps.migrate(x, dest, mesh, inplace=True)
    assert f"rank {culprit}'s input is bad" in str(e.value)
    if me == culprit:
        assert detail in str(e.value), str(e.value)
    with pytest.raises(ValueError, match="tune"):
        ps.migrate(np.zeros((4, 1)), np.zeros(2, int), mesh, algorithm="tune", inplace=True)
    # the mesh works after the error
    y = np.arange(8.0) + me
    r = ps.migrate(y, np.full(4, (me + 1) % P), mesh, inplace=True)
    np.testing.assert_array_equal(r.rows, np.arange(4.0) + (me - 1) % P)
    np.testing.assert_array_equal(y[4:], np.arange(4.0, 8.0) + me)



ALIAS = ["dest_is_column", "dest_strided_column", "overlapping_columns"]


@pytest.mark.parametrize("kind", ALIAS)
def test_inplace_aliasing_raises_on_every_rank(mesh, kind):
    """A dest that is a view of a column (a column holding each row's rank), or columns that
    overlap in memory, would be scrambled by the rows written in place: refused on every
    rank before any row moves, and nothing written."""
    P, me = mesh.size, mesh.rank
    culprit = P - 1
    n, cap = 6, 12
    buf = np.zeros(cap + 1, np.int64)
    buf[:n + 1] = np.arange(n + 1) + 100 * me
    x = {"id": buf[:cap].copy(), "rank": np.zeros(cap, np.int64),
         "pair": np.zeros((cap, 2), np.int64)}
    x["rank"][:n] = x["pair"][:n, 0] = (np.arange(n) + me + 1) % P
    dest = x["rank"][:n].copy()
    detail = None
    if me == culprit:
        if kind == "dest_is_column":
            dest, detail = x["rank"][:n], "dest shares memory with rows['rank']"
        elif kind == "dest_strided_column":  # migrate converts it (a copy); still refused
            dest, detail = x["pair"][:n, 0], "dest shares memory with rows['pair']"
        else:
            x["id"], x["rank"] = buf[:cap], buf[1:cap + 1]
            detail = "rows['id'] and rows['rank'] overlap in memory"
    before = {k: a.copy() for k, a in x.items()}
    d0 = dest.copy()
    with pytest.raises(ValueError) as e:
        ps.migrate(x, dest, mesh, inplace=True)
    assert f"rank {culprit}'s input is bad" in str(e.value)
    assert "overlap in memory" in str(e.value)
    if me == culprit:
        assert detail in str(e.value), str(e.value)
    for k in x:  # nothing moved
        np.testing.assert_array_equal(x[k], before[k])
    np.testing.assert_array_equal(dest, d0)
    # the same array as two columns is fine: both get the same rows
    a = np.zeros(cap, np.int64)
    a[:n] = np.arange(n) + 100 * me
    d = (np.arange(n) + me) % P
    r = ps.migrate({"a": a, "b": a}, d, mesh, inplace=True)
    grouped = np.concatenate([np.arange(n)[(np.arange(n) + s) % P == me] + 100 * s
                              for s in range(P)])
    np.testing.assert_array_equal(r.rows["a"][r.order], grouped)
    np.testing.assert_array_equal(r.rows["b"][r.order], grouped)
    np.testing.assert_array_equal(r.back(r.rows)["a"], np.arange(n) + 100 * me)
