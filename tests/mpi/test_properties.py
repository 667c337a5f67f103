"""Property tests (hypothesis) under MPI: random meshes over the communicator, random global
shapes (zero extents, extents smaller than the mesh), random placements (Partial and nested
Shard included) and random sizes. Each example: the result equals the numpy oracle,
A -> B -> A is bitwise the source, and the collectives counted equal the count planning.md's
rules give for the pair of layouts (``oracle.collectives_by_rule``), and the plan's.

Every rank must draw the same examples: the seed comes from rank 0 (or
``PYSHARD_HYPOTHESIS_SEED``), there is no deadline and no example database, and each
example ends with an agreement between the ranks, so a failure on any rank fails (and
shrinks) on every rank at once. A failure prints the seed that reproduces it.
"""

from __future__ import annotations

import os
import random
from math import prod

import numpy as np
import pytest
from mpi4py import MPI
from oracle import collectives_by_rule, make_global

import pyshard as ps
from pyshard import Partial, Replicate, Shard

hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies

pytestmark = [pytest.mark.mpi, pytest.mark.numerics]  # numerics: not rerun per MPI library

COMM = MPI.COMM_WORLD
SEED = COMM.bcast(
    int(os.environ.get("PYSHARD_HYPOTHESIS_SEED") or random.SystemRandom().randrange(2**31)),
    root=0,
)
EXAMPLES = int(os.environ.get("PYSHARD_HYPOTHESIS_EXAMPLES", "25"))
SETTINGS = hypothesis.settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    derandomize=False,
    suppress_health_check=list(hypothesis.HealthCheck),
    print_blob=False,
)


def _factorizations(n, parts):
    if parts == 1:
        return [(n,)]
    out = []
    for a in range(1, n + 1):
        if n % a == 0:
            out += [(a,) + rest for rest in _factorizations(n // a, parts - 1)]
    return out


MESHES = [m for k in (1, 2, 3) for m in _factorizations(COMM.size, k)]


@st.composite
def cases(draw):
    mesh = draw(st.sampled_from(MESHES))
    ndim = draw(st.integers(1, 3))
    size = prod(mesh)
    shape = tuple(draw(st.integers(0, size + 3)) for _ in range(ndim))
    dtype = draw(st.sampled_from(["int64", "float64"]))
    op = draw(st.sampled_from(["sum", "max", "min"]))  # one Partial op per example

    def placements(allow_partial):
        opts = [Replicate()] + [Shard(d) for d in range(ndim)]
        if allow_partial:
            opts.append(Partial(op))
        return [draw(st.sampled_from(opts)) for _ in mesh]

    src, dst = placements(True), placements(True)
    sizes = {}
    for d in range(ndim):  # sometimes explicit (uneven, empty) extents for a sharded dim
        parts = prod(mesh[m] for m, p in enumerate(dst) if p == Shard(d))
        if parts > 1 and draw(st.booleans()):
            cuts = sorted(draw(st.lists(st.integers(0, shape[d]), min_size=parts - 1,
                                        max_size=parts - 1)))  # fmt: skip
            sizes[d] = [b - a for a, b in zip([0] + cuts, cuts + [shape[d]])]
    return mesh, shape, dtype, src, dst, sizes or None


def _source(g, mesh, placements):
    """``g`` laid out as ``placements``; Partial mesh dims hold contributions that reduce to
    ``g`` exactly (sum: integer parts adding up; max / min: ``g`` at one rank, lower / higher
    values elsewhere)."""
    pdims = [m for m, p in enumerate(placements) if isinstance(p, Partial)]
    if not pdims:
        return ps.distribute(g, mesh, placements)
    op = placements[pdims[0]].op
    layout = ps.Layout(g.shape, g.dtype, mesh.shape, placements)
    nq = prod(mesh.shape[m] for m in pdims)
    q = 0
    for m in pdims:
        q = q * mesh.shape[m] + mesh.coords[m]
    if op == "sum":
        parts = [make_global(g.shape, g.dtype, seed=17 * (k + 1)) for k in range(nq - 1)]
        part = parts[q] if q < nq - 1 else g - sum(parts) if parts else g
    else:
        part = g if q == 0 else (g - q if op == "max" else g + q)
    local = np.ascontiguousarray(np.asarray(part, g.dtype)[layout.box(mesh.coords)])
    return ps.from_local(local, mesh, placements, global_shape=g.shape)


def _counts_since(before):
    now = ps.comm_stats()
    return {k: v - before.get(k, 0) for k, v in now.items() if v - before.get(k, 0)}


def _agree(comm, fn):
    """Run ``fn`` on every rank; if it fails anywhere, fail everywhere (same message)."""
    try:
        fn()
        err = ""
    except Exception as e:  # noqa: BLE001 - reported below, on every rank
        err = f"{type(e).__name__}: {e}"
    errs = comm.allgather(err)
    bad = [(r, e) for r, e in enumerate(errs) if e]
    if bad:
        r, e = bad[0]
        raise AssertionError(
            f"ranks {[r for r, _ in bad]} failed (first, rank {r}: {e[:2000]}); "
            f"reproduce with PYSHARD_HYPOTHESIS_SEED={SEED}"
        )


def _report(comm, capsys, name, n):
    """Say on rank 0 how many examples ran (CI's log shows it), and insist that some did."""
    assert n > 0
    if comm.rank == 0:
        with capsys.disabled():
            print(f"\n[hypothesis] {name}: {n} examples at {comm.size} rank(s), seed {SEED}")


def test_random_redistributions(comm, capsys):
    ran = []

    @hypothesis.seed(SEED)
    @SETTINGS
    @hypothesis.given(cases())
    def run(case):
        ran.append(1)
        mesh_shape, shape, dtype, src, dst, sizes = case
        mesh = ps.Mesh(comm, mesh_shape)
        g = make_global(shape, dtype, seed=len(shape))
        try:
            x = _source(g, mesh, src)

            # every collective first, on every rank; then the local checks, agreed on
            p = x.plan_to(dst, sizes)
            want = collectives_by_rule(x.layout, ps.Layout(shape, dtype, mesh_shape, dst, sizes))
            before = ps.comm_stats()
            y = x.redistribute(dst, sizes=sizes)
            got = _counts_since(before)
            back = y.redistribute(src, sizes=dict(x.layout.sizes) or None)
            partial_y = any(isinstance(q, Partial) for q in dst)
            partial_x = any(isinstance(q, Partial) for q in src)
            full_y = y.full() if partial_y else None
            full_back = back.full() if partial_x else None

            def body():
                assert sum(got.values()) == want == p.collectives, (str(p), got, want)
                if partial_y:
                    np.testing.assert_array_equal(full_y, g)
                else:
                    np.testing.assert_array_equal(y.local, g[y.box])
                if partial_x:
                    np.testing.assert_array_equal(full_back, g)
                else:  # bitwise: the same bytes as the source shard
                    assert back.local.tobytes() == x.local.tobytes()

            _agree(comm, body)
        finally:
            mesh.free()

    run()
    _report(comm, capsys, "redistributions", len(ran))


def test_random_layout_pairs_plan_like_the_core(comm, capsys):
    """Serial planning facts for random pairs: explain() runs, the bytes a rank sends equal
    the bytes its peers receive from it (summed over ranks), and collectives <= 3."""
    ran = []

    @hypothesis.seed(SEED)
    @SETTINGS
    @hypothesis.given(cases())
    def run(case):
        ran.append(1)
        mesh_shape, shape, dtype, src, dst, sizes = case

        def body():
            a = ps.Layout(shape, dtype, mesh_shape, src)
            b = ps.Layout(shape, dtype, mesh_shape, dst, sizes)
            p = ps.plan(a, b)
            assert p.collectives <= 3, str(p)
            coords = [tuple(c) for c in np.ndindex(*mesh_shape)]
            sent = sum(sum(s for s, _ in p.rank_bytes(c)) for c in coords)
            recvd = sum(sum(r for _, r in p.rank_bytes(c)) for c in coords)
            if all(s.kind in ("alltoallv", "allgatherv") for s in p.steps):
                assert sent == recvd, (str(p), sent, recvd)
            assert p.explain()

        _agree(comm, body)

    run()
    _report(comm, capsys, "plans", len(ran))
