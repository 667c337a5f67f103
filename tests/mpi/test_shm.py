"""The node-local transport (pyshard/_shm.py, cpp/shm.h): exchanges between ranks of one node
write each block straight into the receiver's result in node-shared memory; ranks on other
nodes are reached by MPI in the same step. ``PYSHARD_NODE_SIZE`` splits this machine into
simulated nodes so that the mixed path runs here. Every result is compared with a slice of a
numpy reference array."""

from __future__ import annotations

import itertools
import logging
import os
import subprocess
import sys
import time

import launch
import numpy as np
import pytest
from mpi4py import MPI
from oracle import (
    DTYPES,
    agree,
    check,
    collectives_by_rule,
    contributions,
    make_global,
    node_blocks,
    node_groups,
    reducible,
    shares_node,
    world_hosts,
)
from test_redistribute_nd import MESHES

import pyshard as ps
from pyshard import Partial, Replicate, Shard
from pyshard.explain import explain
from pyshard.geometry import ATTACH_MIN_PIECE, ATTACH_MIN_RUN, attach_runs
from pyshard.memory import failing_node_setup, is_node_shared
from pyshard.route import route

pytestmark = pytest.mark.mpi

HERE = os.path.dirname(os.path.abspath(__file__))
R = Replicate()


@pytest.fixture(autouse=True)
def _shm_on(monkeypatch):
    """These tests run the transport whatever the suite's environment says (CI also runs the
    suite with PYSHARD_TRANSPORT=mpi and with PYSHARD_NODE_SIZE=2); each sets what it tests."""
    monkeypatch.setenv("PYSHARD_TRANSPORT", "auto")
    monkeypatch.delenv("PYSHARD_NODE_SIZE", raising=False)
    monkeypatch.setenv("PYSHARD_SHM_MIN_BYTES", "0")  # small test arrays take it too


def counts_since(before):
    now = ps.comm_stats()
    return {k: v - before.get(k, 0) for k, v in now.items() if v - before.get(k, 0)}


def node_of(mesh):
    """The node transport the exchanges over mesh dim 0 take: None where PYSHARD_SHM turns it
    off, or no two ranks share a node, or it is not usable."""
    return mesh.node_transport((0,)) if ps.config.get("PYSHARD_SHM") == "auto" else None


def meshes(p):
    return [(p,)] + [m for m in MESHES.get(p, []) if m != (p,)]


def uneven(n, p, zeros):
    """Extents of n cells over p shards: some empty when ``zeros``."""
    if not zeros or p == 1:
        return None
    sizes = [0] * p
    for i in range(n):
        sizes[(2 * i) % p if p > 2 else p - 1] += 1
    return sizes


@pytest.mark.parametrize("node_size", [0, 2, 3])
def test_every_exchange_through_shared_memory(comm, monkeypatch, node_size):
    """Every Shard/Replicate source to every Shard target whose plan is an exchange, on 1-D to
    3-D meshes, even, uneven and empty shards, on one node (0) or simulated nodes of 2 or 3
    ranks (the mixed path: shared memory within a node, MPI between): bitwise the numpy
    reference, and "shm" counted where some block of the step goes between two ranks of one
    node (oracle.node_blocks). (Nodes of one
    rank are MPI alone: every other test with PYSHARD_TRANSPORT=mpi.)"""
    if node_size:
        monkeypatch.setenv("PYSHARD_NODE_SIZE", str(node_size))
    p = comm.size
    failures, used = [], 0
    for mesh_shape in meshes(p)[: 2 if p >= 6 else None]:  # 6-8 ranks on 2 cores: keep it short
        mesh = ps.Mesh(comm, mesh_shape)
        nd = len(mesh_shape)
        shape = (13, 7, 3)[: max(nd, 2)]
        g = make_global(shape, "float64", seed=nd)
        opts = [R] + [Shard(d) for d in range(len(shape))]
        for zeros in (False, True):
            srcs = list(itertools.product(opts, repeat=nd))
            dsts = list(itertools.product(opts[1:], repeat=nd))
            if nd == 3:  # 64 x 27 pairs: every 5th source, every 2nd target
                srcs, dsts = srcs[::5], dsts[::2]
            for src in srcs:
                sizes = None
                if zeros and isinstance(src[0], Shard):
                    s = uneven(shape[src[0].dim], mesh_shape[0], True)
                    sizes = {src[0].dim: s} if s and nd == 1 else None
                x = ps.distribute(g, mesh, list(src), sizes=sizes)
                for dst in dsts:
                    plan = x.plan_to(list(dst))
                    if [s.kind for s in plan.steps] != ["alltoallv"]:
                        continue
                    shared = node_blocks(mesh, plan.steps[0])
                    before = ps.comm_stats()
                    y = x.redistribute(list(dst))
                    got = counts_since(before)
                    want = {"shm": 1} if shared else None
                    try:
                        np.testing.assert_array_equal(y.local, g[y.box])
                        if want is not None:
                            assert got == want, got
                            assert is_node_shared(y.local)
                            used += 1
                        else:
                            assert "shm" not in got, got
                    except AssertionError as e:
                        failures.append(f"{mesh_shape} {src}->{dst} zeros={zeros}: {e}")
        mesh.free()
    assert not failures, "\n".join(failures[:8])
    if p > 1:
        assert used > 0  # groups of 2 or 3 ranks on a (simulated) node: the path ran


@pytest.mark.parametrize("node_size", [0, 2])
def test_gathers_through_shared_memory(comm, monkeypatch, node_size):
    """Every source to Replicate (gathers, and exchange + gather plans) on 1-D to 3-D meshes
    with uneven and empty shards: each collective step on a communicator with ranks sharing
    a node is counted as "shm", the others as MPI's; the result is the whole array."""
    if node_size:
        monkeypatch.setenv("PYSHARD_NODE_SIZE", str(node_size))
    p = comm.size
    failures = []
    for mesh_shape in meshes(p)[:2]:
        mesh = ps.Mesh(comm, mesh_shape)
        nd = len(mesh_shape)
        shape = (13, 7, 3)[: max(nd, 2)]
        g = make_global(shape, "int32", seed=7)
        opts = [R] + [Shard(d) for d in range(len(shape))]
        for src in list(itertools.product(opts, repeat=nd))[:: 3 if nd == 3 else 1]:
            for sizes in (None, "zeros"):
                sz = None
                if sizes and nd == 1 and isinstance(src[0], Shard):
                    s = uneven(shape[src[0].dim], p, True)
                    sz = {src[0].dim: s} if s else None
                x = ps.distribute(g, mesh, list(src), sizes=sz)
                plan = x.plan_to([R] * nd)
                target = ps.Layout(shape, g.dtype, mesh_shape, [R] * nd)
                want = collectives_by_rule(x.layout, target)
                shm_steps = sum(
                    1 for st in plan.steps if st.is_collective and shares_node(mesh, st.mesh_dims)
                )
                before = ps.comm_stats()
                y = x.redistribute([R] * nd)
                got = counts_since(before)
                try:
                    np.testing.assert_array_equal(y.local, g)
                    assert got.get("shm", 0) == shm_steps, (got, str(plan))
                    assert sum(got.values()) == want, (got, want, str(plan))
                except AssertionError as e:
                    failures.append(f"{mesh_shape} {src} sizes={sz}: {e}")
        mesh.free()
    assert not failures, "\n".join(failures[:8])


def test_nodes_as_simulated(comm, monkeypatch):
    """PYSHARD_NODE_SIZE=2: nodes of two consecutive ranks; a communicator whose ranks all sit
    on different nodes gets no node transport (nothing to share)."""
    monkeypatch.setenv("PYSHARD_NODE_SIZE", "2")
    p = comm.size
    mesh = ps.Mesh(comm, (p,))
    node = node_of(mesh)
    if p == 1:
        assert node is None
        return
    assert node is not None and node.nodes == (p + 1) // 2
    first = comm.rank // 2 * 2
    assert list(node.node_ranks) == list(range(first, min(first + 2, p))), node.why_not
    mesh.free()


def test_an_exchange_with_no_block_between_node_peers_takes_mpi(comm, monkeypatch):
    """Nodes of 2 ranks under a 2x2 mesh of the first 4 ranks (world ranks 0-1 and 2-3: mesh
    rows): the 2-D swap [S0,S1] -> [S1,S0] sends each rank's one block to its transpose
    partner on the other node, so no byte would go through node-shared memory: auto takes
    MPI (point-to-point, as without node-shared memory), explain() says why and tune measures
    no shm; a transpose whose node peers do trade blocks still takes node-shared memory.
    Both bitwise the numpy reference; algorithm="shm" still forces the node path."""
    monkeypatch.setenv("PYSHARD_NODE_SIZE", "2")
    if comm.size < 4:
        pytest.skip("needs 4 ranks")
    world_hosts()  # its one collective, on every rank of the world (cached for node_groups)
    sub = comm.Split(0 if comm.rank < 4 else MPI.UNDEFINED, comm.rank)
    if sub == MPI.COMM_NULL:
        return  # the ranks past the mesh have nothing to do
    mesh = ps.Mesh(sub, (2, 2))
    groups = node_groups(mesh, (0, 1))
    if len(set(groups)) != 2 or groups[0] != groups[1]:  # e.g. 3 ranks a host on two hosts
        mesh.free()
        sub.Free()
        pytest.skip(f"the nodes are not the mesh rows here: {groups}")
    g = make_global((8, 6), "float64", seed=5)
    bad = []
    for src, dst, want, why in (
        ([Shard(0), Shard(1)], [Shard(1), Shard(0)], {"p2p": 1}, True),  # the 2-D swap
        ([Shard(0), Shard(0)], [Shard(1), Shard(1)], {"shm": 1}, False),  # a transpose
    ):
        x = ps.distribute(g, mesh, src)
        (step,) = x.plan_to(dst).steps
        r = route(step, mesh, "auto")
        said = explain(x.plan_to(dst), mesh=mesh)
        before = ps.comm_stats()
        y = x.redistribute(dst)
        got = counts_since(before)
        case = f"{src} -> {dst}"
        if got != want:
            bad.append(f"{case}: ran {got}, expected {want}")
        if (r.path, r.algorithm) != (("mpi", "p2p") if why else ("shm", "shm")):
            bad.append(f"{case}: route {r}")
        if ("no block of this step goes between two ranks of one node" in said) != why:
            bad.append(f"{case}: explain says\n{said}")
        if ("shm" in route(step, mesh, "tune").candidates) == why:
            bad.append(f"{case}: tune candidates {route(step, mesh, 'tune').candidates}")
        if not np.array_equal(y.local, g[y.box]) or is_node_shared(y.local) == why:
            bad.append(f"{case}: wrong result (or memory)")
        before = ps.comm_stats()
        z = x.redistribute(dst, algorithm="shm")  # forced: the node path, MPI to the others
        if counts_since(before) != {"shm": 1} or not np.array_equal(z.local, g[z.box]):
            bad.append(f"{case}: algorithm=shm ran {counts_since(before)}")
    mesh.free()
    sub.Free()
    assert not bad, "\n".join(bad)


def same(y, ref):
    np.testing.assert_array_equal(y.local, ref[y.box])


@pytest.mark.parametrize("dtype", ["bool", "int8", "float16", "complex128", "bfloat16"])
def test_dtypes_and_private_out(comm, dtype):
    """Bytes are bytes: every dtype, into a result in shared memory and into ``out=`` in
    private memory (written there by node peers, or landed in shared memory first and
    copied)."""
    p = comm.size
    mesh = ps.Mesh(comm, (p,))
    g = make_global((3 * p + 1, 2 * p + 3), dtype)
    x = ps.distribute(g, mesh, [Shard(0)])
    failures = []
    check(failures, "shared", same, x.redistribute([Shard(1)]), g)
    check(failures, "private out=", into_private_out, x, [Shard(1)], g)
    mesh.free()
    agree(comm, failures)


def takes_shm(mesh, step):
    """Does ``step`` take node-shared memory on ``mesh`` by the rule (from the environment and
    the hosts alone, oracle.node_groups): a gather where two ranks of its communicator share
    a node, an exchange where some block of it goes between two such ranks
    (oracle.node_blocks), a reduction where all of them do (on a job across two hosts, a
    reduction over ranks of both takes MPI)."""
    groups = node_groups(mesh, step.mesh_dims)
    if groups is None or len(groups) < 2:
        return False
    if step.kind in ("reduce_scatter", "allreduce"):
        return len(set(groups)) == 1
    if step.kind == "alltoallv":
        return node_blocks(mesh, step)
    return len(set(groups)) < len(groups)


def writes_into_private(mesh, step):
    """Do node peers write this rank's blocks of exchange ``step`` straight into its private
    ``out=`` (cross-memory attach): where PYSHARD_CMA is on here, its node can (the transport's
    probe, cma), some block comes to it from a node peer (oracle.node_blocks) and the blocks
    come in runs long enough (pyshard.geometry.attach_runs)."""
    node = mesh.node_transport(step.mesh_dims)
    return bool(ps.config.get("PYSHARD_CMA") and node is not None and node.cma
                and node_blocks(mesh, step, receiver=mesh.coords)
                and attach_runs(step, mesh.coords))


def into_private_out(x, target, ref):
    """``x.redistribute(target, out=...)`` into a private numpy array: the reference's box,
    and one step through node-shared memory (where there are two ranks and the rule says so:
    takes_shm; else MPI), whose node peers wrote into ``out`` by cross-memory attach where
    writes_into_private says so (``shm_cma``)."""
    out = np.empty(x.layout.replace(target).local_shape(x.mesh.coords), ref.dtype)
    before = ps.comm_stats()
    y = x.redistribute(target, out=out)
    assert y.local is out
    np.testing.assert_array_equal(out, ref[y.box])
    if x.mesh.size > 1:  # (one rank: a Partial source's plan is a relabel and a local copy)
        (step,) = x.plan_to(target).steps
        got = counts_since(before)
        if takes_shm(x.mesh, step):
            want = {"shm": 1}
            if writes_into_private(x.mesh, step):
                want["shm_cma"] = 1
            assert got == want, (got, want)
        else:
            assert "shm" not in got and sum(got.values()) == 1, got


@pytest.mark.parametrize("even", [True, False])
def test_long_runs_and_outer_loops(comm, even):
    """The copy's two orders (cpp/shm_copy.cpp copy_interleaved): every piece with the same source
    loops (an even split of dim 1: pieces of 2 looped dims, row by row) and pieces with
    different loops (an uneven split), with runs of over 4 KiB that start off a 16-byte
    boundary (streaming stores) and short ones, into shared results and a private ``out=``."""
    p = comm.size
    mesh = ps.Mesh(comm, (p,))
    ny = 2 * p if even else 2 * p + 1
    g = make_global((3, ny, 1030 * p + 3), "float32", seed=5)
    pairs = [(2, 1), (1, 2), (0, 2), (2, 0), (1, 0), (0, 1)]
    failures = []

    def shared(y, before):
        same(y, g)
        if p > 1:
            assert counts_since(before) == {"shm": 1}
            assert is_node_shared(y.local)

    for a, b in pairs:
        x = ps.distribute(g, mesh, [Shard(a)])
        before = ps.comm_stats()
        check(failures, f"S({a}) -> S({b})", shared, x.redistribute([Shard(b)]), before)
        check(failures, f"S({a}) -> S({b}) out=", into_private_out, x, [Shard(b)], g)
    mesh.free()
    agree(comm, failures)


@pytest.mark.parametrize("node_size", [0, 2])
def test_private_out_written_by_node_peers(comm, monkeypatch, node_size):
    """Node peers write their blocks straight into a rank's private ``out=`` by cross-memory
    attach, in exchanges and gathers (PYSHARD_CMA, each rank deciding for its own result: on
    everywhere, off everywhere, on at even ranks only), on one node and on simulated nodes of
    two ranks (the blocks from other nodes by MPI in the same step): 2-D and 3-D arrays,
    uneven and empty shards, 1-byte and 16-byte items, and blocks of more runs than one
    process_vm_writev takes (1024), runs long enough for it and too short (through a
    segment); every result the numpy slice, and ``shm_cma`` counted exactly where
    writes_into_private says."""
    if node_size:
        monkeypatch.setenv("PYSHARD_NODE_SIZE", str(node_size))
    p = comm.size
    mesh = ps.Mesh(comm, (p,))
    node = node_of(mesh)
    if p > 1 and node_size == 0:
        if node is None or not node.cma:
            pytest.skip("this machine refuses cross-memory attach between the ranks")
    cases = [  # runs of 2 KiB and more (attach_runs), then short ones (through a segment)
        ((5, 16 * p + 1, 300 * p), "int64", [Shard(1)], [Shard(2)], None),
        ((8 * p + 1, 600 * p), "complex128", [Shard(0)], [Shard(1)],
         uneven(8 * p + 1, p, True)),
        ((20 * p + 3, 512), "float32", [Shard(0)], [R], None),  # a gather: each shard whole
        ((20, 64 * p + 1), "float64", [Shard(1)], [R], None),  # pieces of 512 B: a segment
        ((7 * p + 3, 5, 3 * p + 2), "int8", [Shard(2)], [Shard(0)], None),
        ((4, 3 * p + 1, 6), "complex128", [Shard(1)], [Shard(2)], None),
    ]
    if p <= 2:  # more runs a peer than one process_vm_writev takes (1024)
        cases.append(((1100 * p, 512 * p), "float32", [Shard(0)], [Shard(1)], None))
    failures, cma = [], 0
    for mode in ("on", "off", "even"):
        on = mode == "on" or (mode == "even" and comm.rank % 2 == 0)
        with ps.config.override(PYSHARD_CMA=on):
            for k, (shape, dtype, a, b, sizes) in enumerate(cases):
                g = make_global(shape, dtype, seed=k)
                x = ps.distribute(g, mesh, a, sizes={a[0].dim: sizes} if sizes else None)
                before = ps.comm_stats()
                check(failures, f"{mode} {shape} {dtype} {a}->{b}", into_private_out, x, b, g)
                cma += counts_since(before).get("shm_cma", 0)
    mesh.free()
    agree(comm, failures)
    able = comm.allreduce(int(node is not None and node.cma))  # every rank calls it
    if p > 1 and able:
        assert comm.allreduce(cma) > 0  # the path ran somewhere


def random_case(rng, p, mesh_shape):
    """A random array (1-3 dims of 1 to 3p+5 cells, one of six dtypes) and a source and target
    of Shard/Replicate placements, the source's shards uneven or empty half the time; or None
    where a placement shards one array dim twice."""
    nd = int(rng.integers(1, 4))
    shape = tuple(int(v) for v in rng.integers(1, 3 * p + 6, nd))
    dtype = ["int8", "int16", "float32", "float64", "complex128", "bool"][rng.integers(6)]
    opts = [R] + [Shard(d) for d in range(nd)]
    a, b = ([opts[rng.integers(len(opts))] for _ in mesh_shape] for _ in range(2))
    for pl in (a, b):
        dims = [q.dim for q in pl if isinstance(q, Shard)]
        if len(dims) != len(set(dims)):
            return None
    sizes = None
    if rng.random() < 0.5:
        sizes = {}
        for m, q in enumerate(a):
            if isinstance(q, Shard):
                cuts = np.sort(rng.integers(0, shape[q.dim] + 1, mesh_shape[m] - 1))
                ext = np.diff(np.concatenate(([0], cuts, [shape[q.dim]])))
                sizes[q.dim] = tuple(int(v) for v in ext)
    return shape, dtype, a, b, sizes


@pytest.mark.parametrize("node_size", [0, 2])
def test_private_out_random_layouts(comm, monkeypatch, node_size):
    """Cross-memory attach on every block however short (the attach rule's bounds set to one
    byte) and node-shared memory for every exchange however small: 40 random arrays, layouts
    and dtypes on 1-D and 2-D meshes, uneven and empty shards, each redistributed into a
    private ``out=`` and compared with the numpy slice; on one node and on simulated nodes of
    two (blocks from the other node by MPI in the same step)."""
    import pyshard.geometry

    monkeypatch.setattr(pyshard.geometry, "ATTACH_MIN_RUN", 1)
    monkeypatch.setattr(pyshard.geometry, "ATTACH_MIN_PIECE", 1)
    if node_size:
        monkeypatch.setenv("PYSHARD_NODE_SIZE", str(node_size))
    p = comm.size
    rng = np.random.default_rng(11 + node_size)
    shapes = meshes(p)[:2]
    failures, cma, able = [], 0, 0
    with ps.config.override(PYSHARD_SHM_MIN_BYTES=0):
        for k in range(40):
            mesh_shape = shapes[k % len(shapes)]
            case = random_case(rng, p, mesh_shape)
            if case is None:
                continue
            shape, dtype, a, b, sizes = case
            mesh = ps.Mesh(comm, mesh_shape)
            node = node_of(mesh)
            able |= int(node is not None and node.cma)
            g = make_global(shape, dtype, seed=k)
            x = ps.distribute(g, mesh, a, sizes=sizes)
            out = np.empty(x.layout.replace(b).local_shape(mesh.coords), g.dtype)
            before = ps.comm_stats()
            where = f"{mesh_shape} {shape} {dtype} {a}->{b} sizes {sizes}"
            try:
                y = x.redistribute(b, out=out)
                check(failures, where, np.testing.assert_array_equal, out, g[y.box])
            except Exception as e:  # noted, not raised: every rank goes on to the same calls
                failures.append(f"{where}: {e!r}")
            cma += counts_since(before).get("shm_cma", 0)
            mesh.free()
    agree(comm, failures)
    if p > 1 and comm.allreduce(able):
        assert comm.allreduce(cma) > 0  # the path ran


def test_attach_takes_long_runs_only(comm):
    """attach_runs, from the layouts: blocks in rows of ATTACH_MIN_RUN bytes or more, each
    landing as a piece of ATTACH_MIN_PIECE bytes or more, qualify; shorter rows or smaller
    pieces do not, and a rank that receives nothing from another never does."""
    p = comm.size
    mesh = ps.Mesh(comm, (p,))
    w = ATTACH_MIN_RUN // 4  # float32 elements of one minimal run
    r = -(-ATTACH_MIN_PIECE // ATTACH_MIN_RUN)  # rows of one minimal piece
    for rows, cols, want in ((r, w, True), (r, w - 1, False), (r - 1, w, False), (r, 4, False)):
        x = ps.distribute(make_global((rows * p, cols * p), "float32"), mesh, [Shard(0)])
        (step,) = x.plan_to([Shard(1)]).steps
        assert attach_runs(step, mesh.coords) == (want and p > 1), (rows, cols, want)
    mesh.free()


def test_a_rank_that_cannot_attach_makes_its_node_copy(comm, monkeypatch):
    """One rank's probe of cross-memory attach fails (failing_node_setup("cma"), as where
    ptrace is refused): every rank of its node learns it from the control segments (no MPI
    call) and lands private results in node-shared memory and copies them over; results
    exact, nothing counted as ``shm_cma`` there. On simulated nodes of two ranks (4 ranks or
    more) the other nodes keep writing into private memory."""
    p = comm.size
    if p == 1:
        pytest.skip("needs two ranks")
    if p >= 4:
        monkeypatch.setenv("PYSHARD_NODE_SIZE", "2")
    with failing_node_setup("cma" if comm.rank == 1 else None):
        mesh = ps.Mesh(comm, (p,))
    node = node_of(mesh)
    assert node is not None
    mine = comm.rank in (0, 1)  # rank 1's node
    if mine:
        assert not node.cma
    g = make_global((16 * p + 1, 300 * p + 2), "float64")  # pieces attach_runs takes
    x = ps.distribute(g, mesh, [Shard(0)])
    failures = []
    for _ in range(2):
        before = ps.comm_stats()
        check(failures, "out=", into_private_out, x, [Shard(1)], g)
        if mine and "shm_cma" in counts_since(before):
            failures.append("written by cross-memory attach on a node that cannot")
    mesh.free()
    agree(comm, failures)


def test_results_return_to_the_pool_and_outlive_free(comm):
    """A result's segment goes back to the rank's pool when the array goes and is reused;
    Mesh.free() empties the pool and the peer mappings, and a live result stays readable."""
    p = comm.size
    if p == 1:
        pytest.skip("one rank: no exchange")
    mesh = ps.Mesh(comm, (p,))
    g = make_global((64 * p, 48 * p), "float32")
    x = ps.distribute(g, mesh, [Shard(0)])
    y = x.redistribute([Shard(1)])
    node = node_of(mesh)
    assert node is not None and node.held == 0
    nbytes = y.local.nbytes
    del y
    held = node.held
    assert held >= nbytes
    y = x.redistribute([Shard(1)])
    assert node.held < held  # the idle segment was taken back
    np.testing.assert_array_equal(y.local, g[y.box])
    want = g[y.box][1:]
    keep = y.local[1:]  # a view keeps the segment
    del y
    assert node.mapped_bytes > 0  # the peers' results, mapped here to write into
    mesh.free()
    assert node.held == 0 and node.mapped_bytes == 0
    np.testing.assert_array_equal(keep, want)  # a live result outlives Mesh.free()


@pytest.mark.parametrize("hook", ["segment", "map"])
def test_a_rank_that_cannot_share_makes_every_rank_use_mpi(comm, caplog, hook):
    """One rank fails its setup (pyshard.memory.failing_node_setup, the core's own failure
    paths): "segment", it cannot make its segment (the mesh's Allgather tells every rank);
    "map", it cannot map its peers' (its node learns it from the control segments, with no
    MPI call). Every rank takes MPI, the same choice everywhere, logged once as a warning;
    results stay exact."""
    p = comm.size
    with pytest.raises(ValueError, match="stage must be one of"):
        with failing_node_setup("1"):
            pass
    if p == 1:
        pytest.skip("needs two ranks")
    with failing_node_setup(hook if comm.rank == 1 else None):
        mesh = ps.Mesh(comm, (p,))
        g = make_global((5 * p, 3 * p), "int32")
        x = ps.distribute(g, mesh, [Shard(0)])
        before = ps.comm_stats()
        with caplog.at_level(logging.WARNING, logger="pyshard"):
            y = x.redistribute([Shard(1)])
    np.testing.assert_array_equal(y.local, g[y.box])
    got = counts_since(before)
    if hook == "map" and len(set(node_groups(mesh, (0,)))) > 1:
        # ranks on two hosts: rank 1's node reaches its ranks by MPI, the other keeps
        # node-shared memory (test_a_node_that_cannot_share_reaches_its_ranks_by_mpi)
        assert node_of(mesh) is not None and sum(got.values()) == 1, got
        mesh.free()
        return
    assert "shm" not in got and sum(got.values()) == 1, got
    assert node_of(mesh) is None
    assert any("not usable" in r.getMessage() for r in caplog.records)
    mesh.free()


def test_a_node_that_cannot_share_reaches_its_ranks_by_mpi(comm, monkeypatch):
    """Simulated nodes of two ranks; rank 1 cannot map its peers' segments: its node's ranks
    exchange by MPI messages among themselves, the other nodes keep node-shared memory, in
    the same step (the choice is the same on both ranks of each node, made with no MPI call);
    every result exact, for exchanges, gathers and several calls in a row."""
    p = comm.size
    if p < 4:
        pytest.skip("needs two simulated nodes of two ranks")
    monkeypatch.setenv("PYSHARD_NODE_SIZE", "2")
    with failing_node_setup("map" if comm.rank == 1 else None):
        mesh = ps.Mesh(comm, (p,))
        node = node_of(mesh)
    assert node is not None
    healthy = comm.rank >= 2
    want = [comm.rank // 2 * 2, comm.rank // 2 * 2 + 1] if healthy else [comm.rank]
    assert list(node.node_ranks) == [r for r in want if r < p]
    g = make_global((5 * p + 1, 3 * p + 2), "float64")
    x = ps.distribute(g, mesh, [Shard(0)])
    for target in ([Shard(1)], [R], [Shard(0)]):
        for _ in range(2):
            y = x.redistribute(target)
            np.testing.assert_array_equal(y.local, g[y.box], err_msg=str(target))
    mesh.free()


def test_auto_keeps_small_exchanges_on_mpi(comm, monkeypatch):
    """Below PYSHARD_SHM_MIN_BYTES per block (the layouts say so, the same on every rank)
    auto takes MPI; algorithm="shm" takes node-shared memory whatever the size."""
    monkeypatch.setenv("PYSHARD_SHM_MIN_BYTES", str(1 << 20))
    p = comm.size
    mesh = ps.Mesh(comm, (p,))
    g = make_global((8 * p, 8 * p), "float32")
    x = ps.distribute(g, mesh, [Shard(0)])
    for algorithm, shm in (("auto", False), ("shm", p > 1)):
        before = ps.comm_stats()
        y = x.redistribute([Shard(1)], algorithm=algorithm)
        np.testing.assert_array_equal(y.local, g[y.box])
        assert ("shm" in counts_since(before)) == shm
    mesh.free()


def test_mpi_transport_turns_it_off(comm, monkeypatch):
    monkeypatch.setenv("PYSHARD_TRANSPORT", "mpi")
    p = comm.size
    mesh = ps.Mesh(comm, (p,))
    g = make_global((4 * p, 3), "float32")
    x = ps.distribute(g, mesh, [Shard(0)])
    before = ps.comm_stats()
    y = x.redistribute([Shard(1)])
    np.testing.assert_array_equal(y.local, g[y.box])
    assert "shm" not in counts_since(before)
    assert node_of(mesh) is None
    mesh.free()


@pytest.mark.spawns  # starts mpiexec jobs of its own (the matrix's 1-rank run)
def test_a_killed_job_leaves_nothing_in_dev_shm(comm):
    """Segments are memfds, reachable only through the processes' own /proc/<pid>/fd: a job
    killed while it exchanges leaves no file of pyshard's in /dev/shm, and no process."""
    launch.require(comm)
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")

    def ours():
        return {f for f in os.listdir("/dev/shm") if "pyshard" in f.lower()}

    before, files = ours(), launch.shm_files()
    proc = subprocess.Popen(
        launch.command(3, [sys.executable, os.path.join(HERE, "shm_worker.py")]),
        env=launch.child_env({"PYSHARD_TRANSPORT": "auto", "PYSHARD_SHM_MIN_BYTES": "0"}),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        line = ""
        t0 = time.monotonic()
        while time.monotonic() - t0 < 90:
            line = proc.stdout.readline()
            if not line or line.startswith("running"):
                break
        assert line.startswith("running"), line
        shm_calls, memfds = map(int, line.split()[1:3])
        assert shm_calls >= 2 and memfds >= 2, line  # the transport ran, on memfd segments
        time.sleep(0.5)  # mid-loop
    finally:
        left = launch.kill_job(proc)  # the launcher and every rank, as a scheduler's kill does
        proc.stdout.close()
    assert not left, f"processes of the killed job still alive: {left}"
    time.sleep(0.5)
    assert ours() == before, ours() - before
    # the MPI library's own segments of the killed job (not pyshard's): removed, so that test
    # runs do not fill /dev/shm on a developer's machine
    launch.remove_unused_shm(launch.shm_files() - files)


DTYPES_MANY = ["float32", "float64", "int16", "complex128", "bool", "uint8"]


def many_arrays(comm, mesh, n, zeros=False):
    """``n`` arrays of assorted shapes (some smaller than the mesh, some with empty shards)
    and dtypes, Shard(0) over mesh dim 0 and replicated over the others, with their global
    values."""
    p = mesh.shape[0]
    gs, xs = [], []
    for k in range(n):
        shape = (1 + (7 * k + 3) % (3 * comm.size + 2), 1 + (5 * k) % 9)
        g = make_global(shape, DTYPES_MANY[k % len(DTYPES_MANY)], seed=k)
        sizes = None
        if zeros and k % 3 == 1 and p > 1:
            sizes = {0: uneven(shape[0], p, True)}
        xs.append(ps.distribute(g, mesh, [Shard(0)] + [R] * (mesh.ndim - 1), sizes=sizes))
        gs.append(g)
    return gs, xs


@pytest.mark.parametrize("node_size", [0, 2, 3])
def test_many_arrays_in_one_handshake(comm, monkeypatch, node_size):
    """redistribute_many through node-shared memory: every array whose plan is one exchange
    (small and large alike) in one batch, one handshake ("shm" counted once), each result a
    view into the batch's one segment at the offset every rank computes from the layouts;
    uneven and empty shards, mixed dtypes, a list and a dict, on one node or simulated nodes
    of 2 and 3 ranks (the others reached by MPI in the same step). Bitwise the reference."""
    if node_size:
        monkeypatch.setenv("PYSHARD_NODE_SIZE", str(node_size))
    p = comm.size
    mesh = ps.Mesh(comm, (p,))
    node = node_of(mesh)
    for zeros in (False, True):
        gs, xs = many_arrays(comm, mesh, 14, zeros)
        for container in (list, dict):
            inp = xs if container is list else {f"w{k}": x for k, x in enumerate(xs)}
            before = ps.comm_stats()
            out = ps.redistribute_many(inp, [Shard(1)])
            got = counts_since(before)
            ys = out if container is list else [out[f"w{k}"] for k in range(len(xs))]
            for y, g in zip(ys, gs):
                assert y.placements == (Shard(1),)
                np.testing.assert_array_equal(y.local, g[y.box])
            if node is not None:
                assert got == {"shm": 1}, got
                assert all(is_node_shared(y.local) for y in ys)
                assert all(y.local.ctypes.data % 64 == 0 for y in ys if y.local.size)
            else:
                assert "shm" not in got, got
    mesh.free()


def test_many_mixed_plans_and_batches(comm, monkeypatch):
    """Arrays whose plans are not one exchange (a gather, a reduction, nothing to do) run on
    their own; the exchanges split into several batches (PYSHARD_MANY_SHM_BATCH_BYTES), one
    handshake each; results of a batch outlive the others and later calls (the batch's
    segment is shared), and algorithm="alltoallv" keeps every exchange on MPI."""

    p = comm.size
    mesh = ps.Mesh(comm, (p,))
    gs, xs = many_arrays(comm, mesh, 9)
    targets = [[Shard(1)], [R], [Shard(1)], [Shard(0)], [Shard(1)], [Shard(1)], [R],
               [Shard(1)], [Shard(1)]]  # fmt: skip
    ps.clear_caches()
    monkeypatch.setenv("PYSHARD_MANY_SHM_BATCH_BYTES", "1")  # every array its own batch
    try:
        mp = ps.plan_many(xs, targets)
        batches = [ix for _, ix in mp.shm_batches]
        before = ps.comm_stats()
        out = ps.redistribute_many(xs, targets)
        got = counts_since(before)
    finally:
        ps.clear_caches()
    exchanges = [k for k, t in enumerate(targets) if t == [Shard(1)]]
    for y, g in zip(out, gs):
        np.testing.assert_array_equal(y.local if y.placements != (R,) else y.full(), g[y.box])
    if p > 1:  # a handshake per batch, and one per gather (two of them)
        assert batches == [(k,) for k in exchanges]
        assert got == {"shm": len(exchanges) + 2}, got
    keep = [(out[k], gs[k]) for k in exchanges[:2]]
    del out
    again = ps.redistribute_many(xs, targets)  # the pool hands the freed batches out again
    for y, g in keep:
        np.testing.assert_array_equal(y.local, g[y.box])
    for k in exchanges:
        np.testing.assert_array_equal(again[k].local, gs[k][again[k].box])
    before = ps.comm_stats()
    mpi = ps.redistribute_many(xs, targets, algorithm="alltoallv")
    assert "shm" not in counts_since(before)
    for k in exchanges:
        np.testing.assert_array_equal(mpi[k].local, gs[k][mpi[k].box])
    mesh.free()


def test_many_on_a_2d_mesh(comm):
    """On an N-D mesh the exchanges group by communicator (mesh dims): each group's batch is
    one handshake on that communicator's node transport."""
    for mshape in MESHES.get(comm.size, []):
        if len(mshape) != 2:
            continue
        mesh = ps.Mesh(comm, mshape)
        gs = [
            make_global((2 * mshape[0] + k, 3 * mshape[1] + 1), "float64", seed=k)
            for k in range(5)
        ]
        xs = [ps.distribute(g, mesh, [Shard(0), Shard(1)]) for g in gs]
        targets = [[Shard(1), Shard(0)], [Shard(1), Shard(0)], [Shard(0), R], [Shard(1), Shard(0)],
                   [R, Shard(0)]]  # fmt: skip
        before = ps.comm_stats()
        out = ps.redistribute_many(xs, targets)
        got = counts_since(before)
        for y, g in zip(out, gs):
            np.testing.assert_array_equal(y.local, g[y.box])
        plans = ps.plan_many(xs, targets).plans
        one = [k for k, p in enumerate(plans) if [s.kind for s in p.steps] == ["alltoallv"]]
        groups = {plans[k].steps[0].mesh_dims for k in one}
        shared = [d for d in groups if shares_node(mesh, d)]
        assert got.get("shm", 0) >= len(shared), got
        for k in one:  # each exchange's result in its batch's node-shared segment
            if shares_node(mesh, plans[k].steps[0].mesh_dims):
                assert is_node_shared(out[k].local)
        mesh.free()


def partial_source(mesh, shape, dtype, op, seed, mdim=0):
    """Partial(op) over mesh dim ``mdim`` (replicated over the others): this rank's
    contribution, and the reduction of all of them (the oracle)."""
    n = mesh.shape[mdim]
    parts, ref = contributions(shape, dtype, n, op, seed)
    pl = [Partial(op) if m == mdim else R for m in range(mesh.ndim)]
    x = ps.from_local(parts[mesh.coords[mdim]].copy(), mesh, pl, global_shape=shape)
    return x, ref, pl


@pytest.mark.parametrize("dtype", DTYPES + ["int16", "uint8"])
def test_reductions_through_shared_memory(comm, dtype):
    """Partial(op) -> Shard(d) is one Reduce_scatter, Partial(op) -> Replicate one Allreduce;
    with every rank on one node both go through node-shared memory (each piece copied once
    into its owner's staging segment, reduced there in rank order; an Allreduce's reduced
    chunks then copied from their owners into every result), including a 1 x 1 array (chunks
    of no element on most ranks): every op the dtype has, Shard(0) (each piece contiguous)
    and Shard(1) (strided pieces), uneven shapes and empty pieces, on a 1-D mesh and on each
    dim of a 2-D one; bitwise the oracle (float16, bfloat16 and float8 accumulate in float32
    and round once), and "shm" counted once (MPI where the ranks span two hosts)."""
    p = comm.size
    for mesh_shape in [(p,)] + [m for m in MESHES.get(p, []) if len(m) == 2][:1]:
        mesh = ps.Mesh(comm, mesh_shape)
        for mdim in range(mesh.ndim):
            if mesh_shape[mdim] == 1:
                continue
            for op in ("sum", "avg", "max", "min"):
                if not reducible([op], dtype):
                    continue
                cases = ((0, (3 * p + 1, 5)), (1, (4, 2 * p + 3)), (0, (max(p - 2, 1), 3)),
                         (None, (2 * p + 1, 3)), (None, (1, 1)))  # fmt: skip
                for d, shape in cases:  # (0, (p - 2, 3)): some ranks' pieces are empty
                    x, ref, pl = partial_source(mesh, shape, dtype, op, 7 * (d or 0) + mdim, mdim)
                    target = list(pl)
                    target[mdim] = R if d is None else Shard(d)
                    kinds = [st.kind for st in x.plan_to(target).steps]
                    want = ["allreduce"] if d is None else ["reduce_scatter"]
                    before = ps.comm_stats()
                    y = x.redistribute(target)
                    got = counts_since(before)
                    if op == "avg" and as_float(dtype):
                        np.testing.assert_allclose(
                            y.local.astype(np.float64), ref[y.box].astype(np.float64),
                            rtol=1e-2 if np.dtype(y.local.dtype).itemsize <= 2 else 1e-6,
                        )
                    else:
                        np.testing.assert_array_equal(y.local, ref[y.box])
                    assert y.local.dtype == ref.dtype
                    assert kinds == want, (mesh_shape, mdim, op, d, kinds)
                    if takes_shm(mesh, x.plan_to(target).steps[0]):
                        assert got == {"shm": 1}, (mesh_shape, mdim, op, d, got)
                    else:  # ranks of two hosts (a job across hosts): MPI
                        assert "shm" not in got and sum(got.values()) == 1, got
                    assert not is_node_shared(y.local)  # the result is private memory
        mesh.free()


def as_float(dtype):
    from oracle import is_floating

    return is_floating(dtype)


def test_reductions_take_mpi_across_nodes_and_on_request(comm, monkeypatch):
    """Ranks on several (simulated) nodes reduce through MPI (no mixed path for reductions);
    algorithm="alltoallv" keeps a reduction on MPI; out= receives the reduction; explain()
    says where a reduction goes."""
    p = comm.size
    mesh = ps.Mesh(comm, (p,))
    x, ref, _ = partial_source(mesh, (2 * p + 1, 6), "float64", "sum", seed=3)
    into_private_out(x, [Shard(0)], ref)
    before = ps.comm_stats()
    y = x.redistribute([Shard(0)], algorithm="alltoallv")
    np.testing.assert_array_equal(y.local, ref[y.box])
    assert "shm" not in counts_since(before)
    if p > 1:
        assert "shares one node" in explain(x.plan_to([Shard(0)]))
    mesh.free()
    if p < 3:
        return
    monkeypatch.setenv("PYSHARD_NODE_SIZE", "2")
    mesh = ps.Mesh(comm, (p,))
    x, ref, _ = partial_source(mesh, (2 * p + 1, 6), "int32", "max", seed=4)
    before = ps.comm_stats()
    y = x.redistribute([Shard(0)], algorithm="shm")
    np.testing.assert_array_equal(y.local, ref[y.box])
    got = counts_since(before)
    assert "shm" not in got and sum(got.values()) == 1, got
    mesh.free()


def test_node_info_is_what_every_rank_reported(comm):
    """Mesh.node_info: per mesh rank its pid, world rank and CPU count, and a machine key
    equal exactly where the hosts are; None on a mesh of one rank."""
    one = ps.Mesh(MPI.COMM_SELF, (1,))
    assert one.node_info() is None
    one.free()
    mesh = ps.Mesh(comm, (comm.size,))
    info = mesh.node_info()
    if comm.size == 1:
        assert info is None
    else:
        hosts = [world_hosts()[w] for w in comm.allgather(MPI.COMM_WORLD.rank)]
        assert info["pid"] == comm.allgather(os.getpid())
        assert info["world_rank"] == comm.allgather(MPI.COMM_WORLD.rank)
        assert info["cores"][comm.rank] == os.cpu_count()
        assert info["shm"][comm.rank] in (0, 1)
        for r in range(comm.size):
            same = hosts[r] == hosts[comm.rank]
            assert (info["machine"][r] == info["machine"][comm.rank]) == same, info
            assert (info["cores"][r] == info["cores"][comm.rank]) or not same
        node = mesh.node_transport((0,))
        if all(info["shm"]):  # every rank could set up node-shared memory: its node's ranks
            k = ps.config.get("PYSHARD_NODE_SIZE") or 0  # simulated nodes of k world ranks
            w = info["world_rank"]
            mine = [r for r in range(comm.size) if hosts[r] == hosts[comm.rank]
                    and (not k or w[r] // k == w[comm.rank] // k)]
            if len(mine) > 1:
                assert node is not None and list(node.node_ranks) == mine, (mine, info)
            else:  # no other rank on this node: no node transport
                assert node is None, info
    mesh.free()


def _pmd_kib(addr):
    """kB of the mapping holding ``addr`` that are mapped by huge pages (ShmemPmdMapped)."""
    with open("/proc/self/smaps") as f:
        inside = False
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(v, 16) for v in head.split("-"))
                inside = lo <= addr < hi
            elif inside and head == "ShmemPmdMapped:":
                return int(line.split()[1])
    return 0


def test_results_on_huge_pages_where_the_kernel_gives_them(comm):
    """A result in node-shared memory asks for huge pages before its pages are faulted in
    (cpp/shm_segment.cpp): where shared memory gets them on request (shmem_enabled advise, or
    always/within_size unasked), a 16 MiB result is mapped by huge pages, on the rank that
    owns it, and the values are right. Skips where the kernel gives shared memory none
    ("never", Debian's default) or no node-shared memory is there."""
    if comm.size < 2:
        pytest.skip("needs two ranks")
    mesh = ps.Mesh(comm, (comm.size,))
    try:
        setting = None
        path = "/sys/kernel/mm/transparent_hugepage/shmem_enabled"
        if os.path.exists(path):
            with open(path) as f:
                text = f.read().split()
            setting = next((w[1:-1] for w in text if w.startswith("[")), None)
        # rank 0 decides for every rank (the nodes of one job run one kernel setting each)
        setting, shm = comm.bcast((setting, mesh.node_transport((0,)) is not None), root=0)
        if setting not in ("advise", "always", "within_size") or not shm:
            pytest.skip(f"shared memory gets no huge pages here (shmem_enabled={setting}) or "
                        "no node-shared memory")
        n = 1024 * comm.size  # a result of 1024 x 2048 float64 a rank: 16 MiB
        g = make_global((n, 2048), np.float64)
        y = ps.distribute(g, mesh, [Shard(0)]).redistribute([Shard(1)])
        ok = np.array_equal(y.local, g[y.box]) and is_node_shared(y.local)
        pmd = _pmd_kib(y.local.ctypes.data)
        agree(comm, [] if ok and pmd >= 2048 else
              [f"{pmd} kB mapped by huge pages (want 2048 at least), values right: {ok}"])
    finally:
        mesh.free()


@pytest.mark.mpi(min_size=2)
def test_dtypes_that_differ_between_ranks_write_nothing_past_a_peer():
    """from_local with another dtype on the last rank (no communication checks it): the
    node path's writes are bounded by each node peer's segment, so every rank of the node
    raises instead of the last rank writing its float64 blocks past its peers' float32
    results (it did: wrong zeros on the peers, or a segfault where it went far enough).
    A mesh of its own: its node pool holds no larger segment."""
    comm = MPI.COMM_WORLD
    P, me = comm.size, comm.rank
    mesh = ps.Mesh(comm, (P,))
    try:
        dt = np.float64 if me == P - 1 else np.float32
        local = np.full((16, 512 * P), me + 1, dtype=dt)
        x = ps.from_local(local, mesh, [Shard(0)], global_shape=(16 * P, 512 * P))
        # (node peers: the node's error; peers on other nodes, PYSHARD_NODE_SIZE runs: MPI's
        # truncated message)
        with pytest.raises(RuntimeError, match="node-shared memory|truncated"):
            x.redistribute([Shard(1)], algorithm="shm")
        g = np.arange(16 * P * 8, dtype=np.float32).reshape(16 * P, 8)
        y = ps.distribute(g, mesh, [Shard(0)]).redistribute([Shard(1)], algorithm="shm")
        same(y, g)  # and the next exchange of agreeing arrays is exact
    finally:
        mesh.free()
