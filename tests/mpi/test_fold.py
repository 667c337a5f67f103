"""HaloArray.fold (the reverse halo exchange) under MPI against a numpy oracle: every rank
generates every rank's padded array from its coords, so each rank computes, serially, what
its interior must hold after the fold (its own values combined with every ghost cell of its
replica that an update writes, at the cell's global index), and compares bitwise; on the
1-D to 3-D meshes of test_halo.py's cases (uneven, empty, nested, replicated shards), box
and star stencils, periodic or not, widths 1, 2 and wider than a neighbour's block, every
method (node-shared memory, "shm", among them), ops sum/max/min. Plus: the dot-product test
that fold is update's adjoint, the same bits with every method (shm's folds bit for bit those
of persistent requests, also on simulated nodes: the mixed path), start_fold/wait with the
interior written in flight, dtypes the core does not combine (float16, bfloat16) folding
through persistent requests on an array whose updates go through shm, many folds and updates
with ranks at different paces, refresh=True, bad input raised on every rank before any
communication."""

from __future__ import annotations

import time

import numpy as np
import pytest
from oracle import ML_DTYPES, halo_cells, halo_expected
from test_count_limit import limited, ran  # noqa: F401 - the fixture
from test_halo import (
    HALO_MPI,
    all_agree,
    cases,
    check_split,
    counted,
    expected_method,
    mixed_cases,
    padded_mismatch,
    sharded_case,
)
from test_redistribute_nd import counts_since
from test_staged import staged  # noqa: F401 - the fixture

import pyshard as ps
from pyshard import Replicate

pytestmark = pytest.mark.mpi  # run under mpiexec with --with-mpi (pytest-mpi)

METHODS = [*HALO_MPI, "shm"]
# the dtypes the core combines (cpp/halo.h FoldKind): their folds take node-shared memory where
# updates do; the others (float16, bool, the ml_dtypes floats) fold through persistent requests
NATIVE = {np.dtype(t) for t in ("float32", "float64", "int8", "int16", "int32", "int64", "uint8",
                                "uint16", "uint32", "uint64", "complex64", "complex128")}


def expected_fold_method(x, method, dtype, width=1, periodic=False, corners=True):
    """h.fold_chosen after the first fold of a halo array of ``x`` built now with ``method``."""
    m = expected_method(x, method, width, periodic, corners)
    return "persistent" if m == "shm" and np.dtype(dtype) not in NATIVE else m


def widths_for(shape):
    nd = len(shape)
    return [1, tuple(min(2, n) for n in shape),
            tuple(min(n, 3) * (d % 2) for d, n in enumerate(shape))] if nd else [0]


def periodics(nd):
    return [False, True, tuple(d == 0 for d in range(nd))]


def layout_of(shape, dtype, mesh, placements, sizes):
    return ps.Layout(shape, dtype, mesh.shape, placements, sizes)


def padded_of(layout, width, coords, dtype, seed, lo=-4, hi=5):
    """Rank ``coords``'s padded array: small integers (exact sums in every dtype)."""
    shape = tuple(b.stop - b.start + 2 * w for b, w in zip(layout.box(coords), width))
    rng = np.random.default_rng([seed, *coords])
    v = rng.integers(lo, hi, size=shape)
    dt = np.dtype(dtype)
    if dt.kind == "c":
        v = v + 1j * rng.integers(lo, hi, size=shape)
    return v.astype(dt)


def written(layout, width, periodic, corners, coords):
    """(global wrapped indices per dim, mask) of the ghost cells an update writes on the rank
    at ``coords``: halo_expected's rule."""
    box = layout.box(coords)
    lo, hi = [b.start for b in box], [b.stop for b in box]
    idx, mask, _ = halo_cells(layout.shape, lo, hi, width, periodic, corners)
    gidx = [np.mod(i, layout.shape[d]) if layout.shape[d] else i for d, i in enumerate(idx)]
    return gidx, mask


def replica(layout, coords):
    """Mesh coords of the ranks in the replica of ``coords`` (same coords on every
    Replicate mesh dim)."""
    rep = [m for m, p in enumerate(layout.placements) if isinstance(p, Replicate)]
    out = []
    for q in np.ndindex(*layout.mesh_shape):
        if all(q[m] == coords[m] for m in rep):
            out.append(q)
    return out


def fold_expected(layout, width, periodic, corners, coords, op, gen):
    """This rank's interior after the fold, computed serially; ``gen(q)`` gives rank q's
    padded array (before the fold)."""
    box = layout.box(coords)
    lo, hi = [b.start for b in box], [b.stop for b in box]
    mine = gen(coords)
    interior = mine[tuple(slice(w, w + h - lo_) for w, lo_, h in zip(width, lo, hi))]
    dt = interior.dtype
    acc_dt = np.complex128 if dt.kind == "c" else np.float64 if dt.kind == "f" or \
        dt.type.__module__.startswith("ml_dtypes") else np.int64
    acc = interior.astype(acc_dt)
    ufunc = {"sum": np.add, "max": np.maximum, "min": np.minimum}[op]
    for q in replica(layout, coords):
        gidx, mask = written(layout, width, periodic, corners, q)
        if not mask.any():
            continue
        grids = np.meshgrid(*gidx, indexing="ij")
        inside = mask.copy()
        for d, gr in enumerate(grids):
            inside &= (gr >= lo[d]) & (gr < hi[d])
        if not inside.any():
            continue
        where = tuple(gr[inside] - lo[d] for d, gr in enumerate(grids))
        ufunc.at(acc, where, gen(q)[inside].astype(acc_dt))
    return acc.astype(dt)


def run_case(comm, shape, mshape, placements, sizes, width, periodic, corners, method, op,
             dtype, seed=0, split=False, mesh=None):
    """One fold of a fresh halo array against the oracle. ``mesh``: a mesh of ``mshape`` the
    caller built (and frees) for several cases; building one is a collective with the node
    setup, the larger part of a case's time at 7 ranks on 2 cores. Without it, one is built
    and freed here."""
    own = mesh is None
    if own:
        mesh = ps.Mesh(comm, mshape)
    assert mesh.shape == tuple(mshape)
    lay = layout_of(shape, dtype, mesh, placements, sizes)
    x = ps.ShardedArray(np.zeros(lay.local_shape(mesh.coords), dtype), lay, mesh)
    h = x.with_halo(width, periodic=periodic, corners=corners, method=method)

    def gen(q):
        return padded_of(lay, h.width, q, dtype, seed)

    h.padded[...] = gen(mesh.coords)
    ghosts = h.padded.copy()
    before = ps.comm_stats()
    if split:
        h.start_fold(op)
        h.wait()
    else:
        h.fold(op)
    counts = counts_since(before)
    counts.pop("staged", None)  # under the staged fixture
    assert h.fold_chosen == expected_fold_method(x, method, dtype, width, periodic, corners)
    assert counts == {counted(h, fold=True): 1}
    if h.fold_chosen == "shm":
        check_split(h, fold=True)
    want = fold_expected(lay, h.width, h.periodic, h.corners, mesh.coords, op, gen)
    what = (f"{shape} {mshape} {placements} w={width} p={periodic} c={corners} {method} {op} "
            f"{dtype} rank {comm.rank}")
    assert h.interior.dtype == want.dtype
    np.testing.assert_array_equal(h.interior.view(np.uint8), want.view(np.uint8), err_msg=what)
    # the ghost cells are left as they were
    inner = tuple(slice(w, w + n) for w, n in zip(h.width, h.interior.shape))
    h.padded[inner] = ghosts[inner]
    np.testing.assert_array_equal(h.padded.view(np.uint8), ghosts.view(np.uint8), err_msg=what)
    if own:
        mesh.free()


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("corners", [True, False])
def test_fold_matches_oracle(comm, method, corners):
    for shape, mshape, placements, sizes in cases(comm.size):
        mesh = ps.Mesh(comm, mshape)  # one mesh for the case's halo arrays
        # each (width, periodic) folds with one op, in a Latin square: every op meets every
        # width and every periodicity, in a third of the full product's folds (the op is the
        # combine kernel's template argument, the geometry its descriptors: two independent
        # code paths; test_fold_dtypes crosses every op with every dtype)
        combos = [(w, p) for w in widths_for(shape) for p in periodics(len(shape))]
        for i, (width, periodic) in enumerate(combos):
            op = ("sum", "max", "min")[(i + i // 3) % 3]
            run_case(comm, shape, mshape, placements, sizes, width, periodic, corners,
                     method, op, "float64", seed=len(shape), split=op == "max", mesh=mesh)
        mesh.free()


@pytest.mark.numerics  # the combine of each dtype: the core's own code, whatever the MPI
@pytest.mark.parametrize("dtype", ["int64", "float32", "float16", "int8", "complex128",
                                   *ML_DTYPES])
def test_fold_dtypes(comm, dtype):
    if comm.size > 4:  # the combine per dtype does not depend on the rank count
        pytest.skip("dtype combines run at 1-4 ranks (the geometry at every count: "
                    "test_fold_matches_oracle)")
    ops = ("sum",) if np.dtype(dtype).kind == "c" else ("sum", "max", "min")
    for shape, mshape, placements, sizes in cases(comm.size):
        mesh = ps.Mesh(comm, mshape)
        for width in widths_for(shape)[:2]:
            for periodic in (False, True):
                for op in ops:
                    for method in ("persistent", "datatype", "shm"):
                        run_case(comm, shape, mshape, placements, sizes, width, periodic,
                                 True, method, op, dtype, seed=3, mesh=mesh)
        mesh.free()


@pytest.mark.skipif(not ML_DTYPES, reason="ml_dtypes not installed")
def test_bfloat16_accumulates_in_float32_rounded_once(comm):
    """Every ghost cell holds 2**-8 and every interior cell 1: a cell with k >= 2
    contributions ends at bfloat16(1 + k 2**-8) (rounded once), where rounding after each
    addition would leave 1 (1 + 2**-8 is a tie, rounded to the even 1)."""
    import ml_dtypes

    bf = np.dtype(ml_dtypes.bfloat16)
    mshape = (comm.size,)
    mesh = ps.Mesh(comm, mshape)
    lay = ps.Layout((2 * comm.size, 3), bf, mshape, [ps.Shard(0)])
    x = ps.ShardedArray(np.zeros(lay.local_shape(mesh.coords), bf), lay, mesh)
    for method in METHODS:
        h = x.with_halo(2, periodic=True, method=method)
        h.padded[...] = bf.type(2.0 ** -8)
        h.interior[...] = bf.type(1.0)

        def gen(q, h=h):
            shape = tuple(b.stop - b.start + 2 * w for b, w in zip(lay.box(q), h.width))
            p = np.full(shape, 2.0 ** -8)
            p[tuple(slice(w, s - w) for w, s in zip(h.width, shape))] = 1.0
            return p.astype(bf)

        want = fold_expected(lay, h.width, h.periodic, h.corners, mesh.coords, "sum", gen)
        h.fold()
        np.testing.assert_array_equal(h.interior.view(np.uint16), want.view(np.uint16))
        assert (h.interior.astype(np.float32) > 1).all()  # every cell got >= 2 contributions
    mesh.free()


def test_dot_product_adjoint(comm):
    """<update(a), b> over the written ghost cells == <a, fold(b) - b> over the interiors,
    exactly (integer-valued float64), for random layouts, widths and stencils."""
    rng = np.random.default_rng(7)  # the same draws on every rank
    for shape, mshape, placements, sizes in cases(comm.size):
        for trial in range(3):
            nd = len(shape)
            width = tuple(int(rng.integers(0, min(3, n) + 1)) for n in shape)
            periodic = tuple(bool(v) for v in rng.integers(0, 2, size=nd))
            corners = bool(rng.integers(0, 2))
            mesh = ps.Mesh(comm, mshape)
            lay = layout_of(shape, "float64", mesh, placements, sizes)
            x = ps.ShardedArray(np.zeros(lay.local_shape(mesh.coords)), lay, mesh)
            ha = x.with_halo(width, periodic=periodic, corners=corners)
            hb = x.with_halo(width, periodic=periodic, corners=corners)
            a = padded_of(lay, ha.width, mesh.coords, "float64", 100 + trial, -50, 50)
            b = padded_of(lay, ha.width, mesh.coords, "float64", 200 + trial, -50, 50)
            _, mask = written(lay, ha.width, ha.periodic, ha.corners, mesh.coords)
            ha.padded[...] = a
            ha.update()
            lhs = float((ha.padded[mask] * b[mask]).sum())
            hb.padded[...] = b
            inner = tuple(slice(w, w + n) for w, n in zip(hb.width, hb.interior.shape))
            hb.fold()
            rhs = float((a[inner] * (hb.interior - b[inner])).sum())
            lhs, rhs = comm.allreduce(lhs), comm.allreduce(rhs)
            assert lhs == rhs, (shape, mshape, placements, width, periodic, corners)
            mesh.free()


def test_same_bits_with_every_method_and_run(comm):
    """Non-integer data (the sum's rounding depends on its order): every method, tune and
    repeated runs give the same bits."""
    for shape, mshape, placements, sizes in cases(comm.size):
        for dtype in ["float64", "float32", *ML_DTYPES[:1]]:
            mesh = ps.Mesh(comm, mshape)
            lay = layout_of(shape, dtype, mesh, placements, sizes)
            x = ps.ShardedArray(np.zeros(lay.local_shape(mesh.coords), dtype), lay, mesh)
            width = widths_for(shape)[1]
            results = []
            for method in METHODS + ["tune", "persistent"]:
                h = x.with_halo(width, periodic=True, method=method)
                rng = np.random.default_rng([5, *mesh.coords])
                h.padded[...] = (rng.standard_normal(h.padded.shape) * 1e3).astype(dtype)
                h.fold()
                results.append(h.interior.copy())
            for method, r in zip(METHODS + ["tune", "again"], results):
                np.testing.assert_array_equal(r.view(np.uint8), results[0].view(np.uint8),
                                              err_msg=f"{method} {dtype} {shape} {mshape}")
            mesh.free()


def test_start_fold_wait_interior_written_in_flight(comm):
    shape, mshape, placements, sizes = cases(comm.size)[-1]
    for method in METHODS:
        mesh = ps.Mesh(comm, mshape)
        lay = layout_of(shape, "float64", mesh, placements, sizes)
        x = ps.ShardedArray(np.zeros(lay.local_shape(mesh.coords)), lay, mesh)
        h = x.with_halo(1, periodic=True, method=method)

        def gen(q, h=h, lay=lay):
            return padded_of(lay, h.width, q, "float64", 11)

        h.padded[...] = gen(mesh.coords)
        want = fold_expected(lay, h.width, h.periodic, h.corners, mesh.coords, "sum", gen)
        h.start_fold("sum")
        # in flight: the ghost cells may be read, the interior read and written (the
        # contributions combine into what it holds at wait())
        ghost_sum = float(h.padded.sum())
        h.interior[...] += 10
        h.wait()
        assert np.isfinite(ghost_sum)
        np.testing.assert_array_equal(h.interior, want + 10, err_msg=method)
        with pytest.raises(RuntimeError, match="no exchange in flight"):
            h.wait()
        mesh.free()


@pytest.mark.parametrize("method", ["persistent", "shm", "auto"])
def test_two_folds_in_flight(comm, method):
    """Two folds in flight, started in the same order on every rank and waited in any order,
    the same or (the last round) different on neighbouring ranks: through node-shared memory
    a fold's wait() waits for its peers to read its ghosts in their own wait() of that array,
    so ranks that waited in different orders hung there until PYSHARD_PEER_TIMEOUT (now each
    wait serves the other folds in flight)."""
    mesh = ps.Mesh(comm, (comm.size,))
    lay = ps.Layout((3 * comm.size + 1, 4), "float64", (comm.size,), [ps.Shard(0)])
    x = ps.ShardedArray(np.zeros(lay.local_shape(mesh.coords)), lay, mesh)
    hs = [x.with_halo((2, 1), periodic=p, method=method) for p in (True, (True, False))]
    wants = []
    for k, h in enumerate(hs):
        def gen(q, h=h, k=k):
            return padded_of(lay, h.width, q, "float64", 20 + k)

        h.padded[...] = gen(mesh.coords)
        wants.append(fold_expected(lay, h.width, h.periodic, h.corners, mesh.coords, "sum",
                                   gen))
    keep = [h.padded.copy() for h in hs]
    by_rank = (0, 1) if comm.rank % 2 else (1, 0)
    # waited in the other order than started, then in it, then each rank as its parity says
    for order in ((1, 0), (0, 1), by_rank, by_rank):
        for h, k in zip(hs, keep):
            h.padded[...] = k
        hs[0].start_fold()
        hs[1].start_fold("sum")
        for i in order:
            hs[i].wait()
        for h, want in zip(hs, wants):
            np.testing.assert_array_equal(h.interior, want, err_msg=f"{method} {order}")
            assert h.fold_chosen == expected_fold_method(x, method, "float64")
    mesh.free()


@pytest.mark.parametrize("method", ["persistent", "neighbor", "shm"])
def test_refresh_fills_the_ghosts_with_the_new_values(comm, method):
    for shape, mshape, placements, sizes in cases(comm.size):
        mesh = ps.Mesh(comm, mshape)
        lay = layout_of(shape, "float64", mesh, placements, sizes)
        x = ps.ShardedArray(np.zeros(lay.local_shape(mesh.coords)), lay, mesh)
        h = x.with_halo(1, periodic=True, method=method)

        def gen(q, h=h, lay=lay):
            return padded_of(lay, h.width, q, "float64", 31)

        h.padded[...] = gen(mesh.coords)
        want = fold_expected(lay, h.width, h.periodic, h.corners, mesh.coords, "sum", gen)
        before = ps.comm_stats()
        h.fold(refresh=True)
        assert counts_since(before) == {counted(h, fold=True): 1, counted(h): 1}
        np.testing.assert_array_equal(h.interior, want)
        g = h.array.full()
        box = lay.box(mesh.coords)
        exp = halo_expected(g, [b.start for b in box], [b.stop for b in box], h.width,
                            h.periodic, h.corners, 0)
        _, mask = written(lay, h.width, h.periodic, h.corners, mesh.coords)
        np.testing.assert_array_equal(h.padded[mask], exp[mask])
        mesh.free()


@pytest.mark.usefixtures("staged")
def test_staged_transport(comm):
    for shape, mshape, placements, sizes in cases(comm.size):
        mesh = ps.Mesh(comm, mshape)
        for method in ("persistent", "p2p", "neighbor", "shm"):  # (shm: persistent here)
            run_case(comm, shape, mshape, placements, sizes, 2, True, True, method, "sum",
                     "float64", seed=9, mesh=mesh)
        mesh.free()


@pytest.mark.usefixtures("limited")
@pytest.mark.parametrize("method", HALO_MPI)
def test_large_counts(comm, method):
    """Fold messages over the core's lowered count limit (the path of libraries without
    large-count calls: derived datatypes), as test_count_limit.py runs the update."""
    P = comm.size
    mshape = (2, P // 2) if P % 2 == 0 else (P, 1)
    shape = (2 * mshape[0] + 40, 1100 * mshape[1] + 3)  # padded rows over the limit
    S0, S1 = ps.Shard(0), ps.Shard(1)
    run_case(comm, shape, mshape, [S0, S1], None, (2, 3), True, True, method, "sum",
             "float64", seed=5)
    if P > 1:
        need = {"datatype": "subarray", "neighbor": "neighbor_alltoallw"}.get(method, "bytes")
        assert need in ran(comm)


def test_width_of_the_whole_extent(comm):
    for n in (1, 5):
        for op in ("sum", "min"):
            run_case(comm, (n,), (comm.size,), [ps.Shard(0)], None, n, True, True,
                     "persistent", op, "float64", seed=n)


def test_bad_input_raises_on_every_rank_before_communication(comm):
    mesh = ps.Mesh(comm, (comm.size,))
    lay = ps.Layout((2 * comm.size + 1, 3), "complex128", (comm.size,), [ps.Shard(0)])
    x = ps.ShardedArray(np.zeros(lay.local_shape(mesh.coords), np.complex128), lay, mesh)
    h = x.with_halo(1, periodic=True)
    before = ps.comm_stats()
    with pytest.raises(ValueError, match="op must be one of"):
        h.fold("prod")
    with pytest.raises(ValueError, match="op must be one of"):
        h.start_fold(None)
    with pytest.raises(ValueError, match="complex"):
        h.fold("max")
    with pytest.raises(ValueError, match="complex"):
        h.start_fold("min")
    assert counts_since(before) == {}
    h.start()
    with pytest.raises(RuntimeError, match="update is in flight"):
        h.fold()
    with pytest.raises(RuntimeError, match="update is in flight"):
        h.start_fold()
    h.wait()
    h.start_fold()
    with pytest.raises(RuntimeError, match="fold is in flight"):
        h.fold()
    with pytest.raises(RuntimeError, match="fold is in flight"):
        h.start_fold()
    with pytest.raises(RuntimeError, match="in flight"):
        h.update()
    with pytest.raises(RuntimeError, match="already started"):
        h.start()
    h.wait()
    assert counts_since(before) == {counted(h): 1, counted(h, fold=True): 1}
    mesh.free()


def test_explain_names_the_fold(comm):
    mesh = ps.Mesh(comm, (comm.size,))
    x = ps.distribute(np.zeros((4 * comm.size, 3)), mesh, [ps.Shard(0)])
    h = x.with_halo((1, 0), periodic=True)
    text = h.explain()
    p = h.plan
    assert (f"fold (the reverse, HaloArray.fold): the same {len(p.peers)} peer(s) and bytes "
            f"with the directions swapped: sends {p.recv_bytes} B") in text
    assert f"receives {p.send_bytes} B" in text
    mesh.free()


# ----------------------------------------------------------------------------- node-shared memory


def random_fold(x, width, periodic, corners, method, op, dtype, seed):
    """A fold of random non-integer data (its rounding depends on the combine order) on a
    halo array of ``x`` built with ``method``: (the interior after it, the array)."""
    h = x.with_halo(width, periodic=periodic, corners=corners, method=method)
    rng = np.random.default_rng([seed, *x.mesh.coords])
    v = rng.standard_normal(h.padded.shape) * 1e3
    dt = np.dtype(dtype)
    if dt.kind == "c":
        v = v + 1j * rng.standard_normal(h.padded.shape) * 1e3
    elif dt.kind in "iu":
        v = rng.integers(-1000, 1000, size=h.padded.shape)
    h.padded[...] = v.astype(dt)
    h.fold(op)
    return h.interior.copy(), h


def bits_equal_shm_persistent(comm, what_nodes):
    bad = []
    for shape, mshape, placements, sizes in cases(comm.size):
        mesh = ps.Mesh(comm, mshape)
        for dtype in ("float64", "float32", "int32", "complex128"):
            lay = layout_of(shape, dtype, mesh, placements, sizes)
            x = ps.ShardedArray(np.zeros(lay.local_shape(mesh.coords), dtype), lay, mesh)
            ops = ("sum",) if dtype == "complex128" else ("sum", "max", "min")
            for width in widths_for(shape)[1:]:  # 2 (and wider than a block), 3 on odd dims
                for periodic in (True, False):
                    corners = periodic  # box where periodic, star where not
                    for op in ops:
                        if dtype == "float32" and op != "sum":
                            continue
                        ref, _ = random_fold(x, width, periodic, corners, "persistent", op,
                                             dtype, 17)
                        got, h = random_fold(x, width, periodic, corners, "shm", op, dtype, 17)
                        case = (f"{what_nodes}: {shape} {mshape} {placements} {dtype} w={width} "
                                f"p={periodic} {op} rank {comm.rank}")
                        if h.fold_chosen != expected_fold_method(x, "shm", dtype):
                            bad.append(f"{case}: ran {h.fold_chosen}")
                        if got.view(np.uint8).tobytes() != ref.view(np.uint8).tobytes():
                            bad.append(f"{case}: not the bits of persistent")
        mesh.free()
    assert not bad, "\n".join(bad[:10])


def test_shm_folds_bit_for_bit_those_of_persistent(comm):
    """The fold's combine order is fixed: through node-shared memory (node peers read from
    their ghost regions, this rank's own wraps at its own place) the same bits as persistent
    requests, for sum/max/min, float64, float32, int32 and complex128 (sum), widths wider
    than a neighbour's block, periodic and not, box and star."""
    bits_equal_shm_persistent(comm, "one node")


def test_shm_folds_bit_for_bit_on_simulated_nodes(comm):
    """As above on simulated nodes (PYSHARD_NODE_SIZE, set before the meshes are built): the
    combine order mixes MPI messages and node peers."""
    if comm.size < 3:
        pytest.skip("nodes of 2 with a rank on another node need 3 ranks")
    with ps.config.override(PYSHARD_NODE_SIZE=2, PYSHARD_TRANSPORT="auto"):
        bits_equal_shm_persistent(comm, "nodes of 2")


def test_fold_simulated_nodes_matches_oracle(comm):
    """PYSHARD_NODE_SIZE=k before the mesh is built: folds through shm (node peers) and MPI
    (the others) in one step against the oracle; the split as the plan says; some ranks'
    peers by MPI where the mesh spans nodes."""
    if comm.size < 2:
        pytest.skip("one rank: no peers")
    for k in mixed_cases(comm.size):
        with ps.config.override(PYSHARD_NODE_SIZE=k, PYSHARD_TRANSPORT="auto"):
            # (nodes of 1: no node peers, shm falls back to persistent; one case is enough)
            for shape, mshape, placements, sizes in cases(comm.size)[: None if k > 1 else 1]:
                mesh = ps.Mesh(comm, mshape)  # built under the override: its nodes are k
                for width in widths_for(shape)[:2]:
                    for periodic in (False, True):  # star where not periodic
                        op = "max" if periodic and width == 1 else "sum"
                        run_case(comm, shape, mshape, placements, sizes, width, periodic,
                                 not periodic, "shm", op, "float64", seed=k, split=periodic,
                                 mesh=mesh)
                mesh.free()


@pytest.mark.parametrize("dtype", ["float16", *ML_DTYPES[:1]])
def test_low_precision_fold_on_a_shm_array_takes_persistent(comm, dtype):
    """float16 (and bfloat16) fold in Python from an MPI step's buffer: on an array whose
    updates go through node-shared memory, its folds take persistent requests (fold_chosen),
    counted as "halo_fold", with the oracle's values; updates stay on shm."""
    for shape, mshape, placements, sizes in cases(comm.size)[:3] + cases(comm.size)[-1:]:
        mesh = ps.Mesh(comm, mshape)
        lay = layout_of(shape, dtype, mesh, placements, sizes)
        x = ps.ShardedArray(np.zeros(lay.local_shape(mesh.coords), dtype), lay, mesh)
        h = x.with_halo(2, periodic=True, method="shm")

        def gen(q, h=h, lay=lay):
            return padded_of(lay, h.width, q, dtype, 41)

        before = ps.comm_stats()
        h.update()
        assert h.chosen == expected_method(x, "shm")
        h.padded[...] = gen(mesh.coords)
        h.start_fold("sum")
        h.wait()
        assert h.fold_chosen == "persistent"
        want = fold_expected(lay, h.width, h.periodic, h.corners, mesh.coords, "sum", gen)
        np.testing.assert_array_equal(h.interior.view(np.uint8), want.view(np.uint8),
                                      err_msg=f"{shape} {mshape} {dtype} rank {comm.rank}")
        h.update()
        assert counts_since(before) == {counted(h): 2, "halo_fold": 1}
        mesh.free()


@pytest.mark.parametrize("method", ["persistent", "shm"])
def test_start_fold_interior_written_ghosts_rewritten_after_wait(comm, method):
    """start_fold(), the interior written in flight (the contributions combine into what it
    holds at wait()), the ranks at different paces: even ranks wait at once and then write
    their ghost cells (allowed once wait() returns: the node peers that read them are done),
    odd ranks sleep before wait(); every rank's interior is the oracle's."""
    for shape, mshape, placements, sizes in cases(comm.size)[:1] + cases(comm.size)[-1:]:
        mesh = ps.Mesh(comm, mshape)
        lay = layout_of(shape, "float64", mesh, placements, sizes)
        x = ps.ShardedArray(np.zeros(lay.local_shape(mesh.coords)), lay, mesh)
        h = x.with_halo(2, periodic=True, method=method)

        def gen(q, h=h, lay=lay):
            return padded_of(lay, h.width, q, "float64", 13)

        h.padded[...] = gen(mesh.coords)
        want = fold_expected(lay, h.width, h.periodic, h.corners, mesh.coords, "sum", gen)
        h.start_fold()
        h.interior[...] += 0.5
        if comm.rank % 2:
            time.sleep(0.01)
        h.wait()
        inner = tuple(slice(w, w + n) for w, n in zip(h.width, h.interior.shape))
        got = h.interior.copy()
        keep = h.padded[inner].copy()
        h.padded[...] = -1e9  # the ghosts (and interior) overwritten at once
        h.padded[inner] = keep
        np.testing.assert_array_equal(got, want + 0.5, err_msg=f"{method} rank {comm.rank}")
        assert h.fold_chosen == expected_fold_method(x, method, "float64")
        comm.Barrier()
        mesh.free()


def updated(lay, h, gen, mshape):
    """Every rank's padded array after an update of the padded arrays ``gen(q)``: the
    written ghost cells hold the global array the interiors make up (halo_expected)."""
    g = np.zeros(lay.shape)
    for q in np.ndindex(*mshape):
        box = lay.box(q)
        g[tuple(box)] = gen(q)[tuple(slice(w, w + b.stop - b.start)
                                     for w, b in zip(h.width, box))]
    out = {}
    for q in np.ndindex(*mshape):
        box = lay.box(q)
        exp = halo_expected(g, [b.start for b in box], [b.stop for b in box], h.width,
                            h.periodic, h.corners, 0)
        _, mask = written(lay, h.width, h.periodic, h.corners, q)
        out[q] = gen(q).copy()
        out[q][mask] = exp[mask]
    return out


@pytest.mark.parametrize("method", ["persistent", "shm"])
def test_many_folds_and_updates(comm, method):
    """Rounds of update, fold (split or not) and fold(refresh=True) on one array, the ranks
    at different paces (seeded sleeps), the ghost cells rewritten right after each wait():
    every round's interior is the oracle's (the handshake's update and fold counters apart)."""
    shape, mshape, placements, sizes = sharded_case(comm.size)
    mesh = ps.Mesh(comm, mshape)
    lay = layout_of(shape, "float64", mesh, placements, sizes)
    x = ps.ShardedArray(np.zeros(lay.local_shape(mesh.coords)), lay, mesh)
    h = x.with_halo(tuple(min(2, n) for n in shape), periodic=True, method=method)
    rng = np.random.default_rng(100 + comm.rank)
    for k in range(12):
        def gen(q, h=h, k=k):
            return padded_of(lay, h.width, q, "float64", 50 + k)

        if rng.random() < 0.5:
            time.sleep(rng.random() * 0.002)
        h.padded[...] = gen(mesh.coords)
        h.update()  # the ghosts now hold the owners' values of round k
        after = updated(lay, h, gen, mshape)
        want = fold_expected(lay, h.width, h.periodic, h.corners, mesh.coords, "sum",
                             after.__getitem__)
        if k % 3 == 0:
            h.fold()
        elif k % 3 == 1:
            h.start_fold()
            if rng.random() < 0.5:
                time.sleep(rng.random() * 0.002)
            h.wait()
        else:
            h.fold(refresh=True)
        all_agree(comm, padded_mismatch(h.interior, want, f"round {k} rank {comm.rank}"))
        h.padded[tuple(slice(0, w) for w in h.width)] = np.nan  # a ghost corner, at once
    assert h.chosen == expected_method(x, method)
    assert h.fold_chosen == expected_fold_method(x, method, "float64")
    mesh.free()


@pytest.mark.parametrize("method", ["persistent", "shm"])
def test_folds_and_updates_waited_in_random_orders(comm, method):
    """Three halo arrays of one layout, each round an update or a fold (the same on every
    rank), started in the same order everywhere and waited in an order of each rank's own
    (the docs: any order); right after each wait() the rank overwrites what it may then
    write (a fold's ghost cells: its peers must be done reading them, however they read
    them). Every update's ghosts and every fold's interior are the oracle's."""
    shape, mshape, placements, sizes = sharded_case(comm.size)
    mesh = ps.Mesh(comm, mshape)
    lay = layout_of(shape, "float64", mesh, placements, sizes)
    x = ps.ShardedArray(np.zeros(lay.local_shape(mesh.coords)), lay, mesh)
    hs = [x.with_halo(tuple(min(w, n) for n in shape), periodic=True, method=method)
          for w in (1, 2, 1)]
    shared = np.random.default_rng(7)  # the same kinds on every rank
    mine = np.random.default_rng(70 + comm.rank)  # each rank's own wait order
    for k in range(10):
        kinds = shared.integers(0, 2, len(hs))  # 0 update, 1 fold
        wants = []
        for i, (h, kind) in enumerate(zip(hs, kinds)):
            def gen(q, h=h, i=i, k=k):
                return padded_of(lay, h.width, q, "float64", 300 + 10 * k + i)

            h.padded[...] = gen(mesh.coords)
            if kind:
                wants.append(fold_expected(lay, h.width, h.periodic, h.corners, mesh.coords,
                                           "sum", gen))
                h.start_fold()
            else:
                wants.append(updated(lay, h, gen, mshape)[mesh.coords])
                h.start()
        bad = []
        for i in mine.permutation(len(hs)):
            h = hs[i]
            h.wait()
            got = h.interior if kinds[i] else h.padded
            bad += padded_mismatch(got, wants[i], f"round {k} array {i} rank {comm.rank}")
            if kinds[i]:  # the ghosts are this rank's to write again, at once
                saved = h.interior.copy()
                h.padded[...] = np.nan
                h.interior[...] = saved
        all_agree(comm, bad)
    for h in hs:
        assert h.chosen == expected_method(x, method)
    mesh.free()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("between", ["first update", "redistribute"])
def test_fold_in_flight_beside_other_node_shared_steps(comm, between):
    """A fold in flight through node-shared memory; rank 0 waits for it, then runs another
    node-shared step (the first update of another halo array: its mapping handshake; a
    redistribute through node-shared memory); the other ranks run that step first, then wait
    (the docs: any wait order). Both hung until PYSHARD_PEER_TIMEOUT: rank 0's wait waited
    for its neighbours to read its ghosts, they waited in the step's handshake for rank 0.
    Every node-shared wait now serves the folds in flight. The fold's interior and the
    step's result are the oracle's."""
    shape, mshape, placements, sizes = sharded_case(comm.size)
    mesh = ps.Mesh(comm, mshape)
    lay = layout_of(shape, "float64", mesh, placements, sizes)
    x = ps.ShardedArray(np.zeros(lay.local_shape(mesh.coords)), lay, mesh)
    h1 = x.with_halo(1, periodic=True, method="shm")
    if expected_method(x, "shm") != "shm":
        pytest.skip("no node-shared memory here (PYSHARD_TRANSPORT=mpi)")

    def gen(q):
        return padded_of(lay, h1.width, q, "float64", 41)

    with ps.config.override(PYSHARD_SHM_MIN_BYTES=0):  # the redistribute through it too
        for rnd in range(3):
            h1.padded[...] = gen(mesh.coords)
            want = fold_expected(lay, h1.width, h1.periodic, h1.corners, mesh.coords, "sum",
                                 gen)
            g = np.arange(float(np.prod(shape))).reshape(shape) + rnd
            x.local[...] = g[x.box]
            y_box = None

            def step(g=g):
                nonlocal y_box
                if between == "first update":
                    z = ps.distribute(g, mesh, placements, sizes)
                    h2 = z.with_halo(1, periodic=True, method="shm")  # fresh: its handshake
                    h2.update()
                    assert np.array_equal(h2.interior, g[z.box])
                else:
                    y = x.redistribute([Replicate()] * mesh.ndim)
                    y_box = y.local.copy()

            h1.start_fold()
            if comm.rank == 0:
                h1.wait()
                step()
            else:
                step()
                h1.wait()
            bad = padded_mismatch(h1.interior, want, f"round {rnd} rank {comm.rank}")
            if y_box is not None:
                if not np.array_equal(y_box, g):
                    bad.append(f"round {rnd} rank {comm.rank}: the redistribute's result")
            all_agree(comm, bad)
    mesh.free()


def test_widths_that_differ_between_ranks_through_shm_raise(comm):
    """Ranks that disagree on a halo array (even ranks a width of 1, odd ones 2: every rank
    has a neighbour of the other kind) through node-shared memory: each rank checks what its
    node peers' padded arrays hold against its own plan and raises before copying anything
    (a rank whose peers all agree with it would wait for them until PYSHARD_PEER_TIMEOUT);
    they wrote past the peers' arrays (wrong ghosts, or a segfault for wide ones). Ranks on
    one node only."""
    if comm.size < 2:
        pytest.skip("one rank: no peers")
    mesh = ps.Mesh(comm, (comm.size,))
    groups = mesh.node_groups((0,))
    if mesh.node_transport((0,)) is None or len(set(groups.values())) != 1:
        pytest.skip("ranks on several nodes, or no node-shared memory")
    x = ps.distribute(np.arange(8.0 * comm.size * 3).reshape(8 * comm.size, 3), mesh,
                      [ps.Shard(0)])
    if expected_method(x, "shm") != "shm":  # (PYSHARD_TRANSPORT=mpi: MPI's own errors)
        pytest.skip("node-shared memory off")
    h = x.with_halo(1 + comm.rank % 2, periodic=True, method="shm")
    with pytest.raises(RuntimeError, match="disagree on the halo array"):
        h.update()
    with pytest.raises(RuntimeError, match="disagree on the halo array"):
        h.fold()
    comm.Barrier()
