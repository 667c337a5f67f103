"""Halo arrays through node-shared memory whose padded arrays are node-shared only where node
peers reach them (cpp/shm_halo.h, HaloBuffer): the pages of the ghost boxes node peers write
(an update) or read (a fold) come from the rank's memfd, the rest is private memory (huge
pages where the kernel gives them). Arrays large enough that those pages are at most half of
the array take that form; the tests in test_halo.py and test_fold.py mostly run small
arrays, wholly node-shared. Updates and folds against the oracle, on one node and on
simulated nodes, with writes in flight, and the whole-array form where ghost columns touch
every page."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI
from oracle import make_global
from test_fold import run_case
from test_halo import FILL, all_agree, check_halo, node_peers, padded_with_fill

import pyshard as ps
from pyshard import Replicate, Shard

pytestmark = pytest.mark.mpi

S0, S1, R = Shard(0), Shard(1), Replicate()


def sparse_cases(size):
    """(global shape, mesh shape, placements, sizes, dtype, width, sparse): ``sparse`` where
    each rank's node-peer ghost pages are at most half its padded array (rows sharded), else
    the whole array is node-shared (ghost columns on every row)."""
    uneven = [12] * size
    if size > 2:
        uneven[1] = 0  # an empty shard: its neighbours meet across it
        uneven[-1] = 20
    return [
        ((12 * size, 1000), (size,), [S0], None, "float64", 1, True),
        ((sum(uneven), 700), (size,), [S0], {0: tuple(uneven)}, "float64", 1, True),
        ((10 * size, 40, 68), (size, 1, 1), [S0, R, R], None, "float32", 2, True),
        ((600, 12 * size), (size,), [S1], None, "float64", 1, False),
    ]


def run_sparse(comm, node_size):
    bad = []
    with ps.config.override(PYSHARD_NODE_SIZE=node_size or None, PYSHARD_TRANSPORT="auto"):
        for shape, mshape, placements, sizes, dtype, width, sparse in sparse_cases(comm.size):
            mesh = ps.Mesh(comm, mshape)
            g = make_global(shape, dtype, seed=len(shape))
            x = ps.distribute(g, mesh, placements, sizes)
            for periodic in (True, False):
                what = f"{shape} {placements} w={width} p={periodic} nodes={node_size} " \
                       f"rank {comm.rank}"
                h = x.with_halo(width, periodic=periodic, method="shm")
                has_peers = bool(node_peers(mesh))
                if h.node_buffer is None:
                    if has_peers:
                        bad.append(f"{what}: no node-shared buffer")
                    continue
                nbytes, shared = h.node_buffer.nbytes, h.node_buffer.shared_bytes
                if f"padded array: {shared} of its {nbytes} B" not in h.explain():
                    bad.append(f"{what}: explain() does not say what is node-shared")
                if sparse and x.local.size and not 0 <= shared <= nbytes // 2:
                    bad.append(f"{what}: {shared} of {nbytes} bytes node-shared")
                if not sparse and has_peers and x.local.size and shared != nbytes:
                    bad.append(f"{what}: ghost columns, yet {shared} of {nbytes} shared")
                padded_with_fill(h)
                h.update()
                try:
                    check_halo(g, x, h, what)
                except AssertionError as e:
                    bad.append(str(e)[:300])
                # written in flight: the ghosts hold the values from before
                h.start()
                h.interior[...] += 1000
                h.wait()
                h.interior[...] -= 1000
                try:
                    check_halo(g, x, h, what + " (interior written in flight)")
                except AssertionError as e:
                    bad.append(str(e)[:300])
                # the ghosts of the next update: the owners' new interiors
                h.interior[...] *= 2
                h.update()
                try:
                    check_halo(g * 2, x, h, what + " (second update)")
                except AssertionError as e:
                    bad.append(str(e)[:300])
            mesh.free()
    all_agree(comm, bad)


def test_updates_on_one_node(comm):
    if comm.size < 2:
        pytest.skip("one rank: no node peers")
    run_sparse(comm, 0)


def test_updates_on_simulated_nodes(comm):
    if comm.size < 3:
        pytest.skip("nodes of 2 with a rank on another node need 3 ranks")
    run_sparse(comm, 2)


@pytest.mark.parametrize("node_size", [0, 2])
def test_folds(comm, node_size):
    """Folds on the sparse form (node peers read the ghost pages), against the oracle."""
    if comm.size < 2 or (node_size and comm.size < 3):
        pytest.skip("needs node peers (and, on nodes of 2, a rank on another node)")
    with ps.config.override(PYSHARD_NODE_SIZE=node_size or None, PYSHARD_TRANSPORT="auto"):
        for shape, mshape, placements, sizes, dtype, width, _ in sparse_cases(comm.size):
            for periodic in (True, False):
                bad = []
                try:
                    run_case(comm, shape, mshape, placements, sizes, width, periodic, True,
                             "shm", "sum", dtype, seed=3, split=periodic)
                except AssertionError as e:  # agreed on every rank: no rank runs on alone
                    bad.append(f"{shape} {placements} p={periodic}: {str(e)[:300]}")
                all_agree(comm, bad)


def test_fill_stays_where_nothing_is_written(comm):
    """A non-periodic edge's ghosts keep the user's values on the private pages."""
    if comm.size < 2:
        pytest.skip("one rank: no node peers")
    mesh = ps.Mesh(comm, (comm.size,))
    g = make_global((12 * comm.size, 1000), "float64", seed=5)
    x = ps.distribute(g, mesh, [S0])
    h = x.with_halo(1, periodic=False, method="shm")
    padded_with_fill(h)
    h.update()
    bad = []
    if mesh.rank == 0 and not (h.padded[0] == FILL).all():
        bad.append("rank 0's low ghost row was written")
    if mesh.rank == comm.size - 1 and not (h.padded[-1] == FILL).all():
        bad.append("the last rank's high ghost row was written")
    all_agree(comm, bad)
    mesh.free()
    MPI.COMM_WORLD.Barrier()


def expected_shared(h, on):
    """The node-shared bytes of ``h``'s padded array by the rule of cpp/shm_halo.h, computed
    here cell by cell: the 4 KiB pages holding any cell of a ghost box a node peer (``on``)
    writes; those alone where they are at most half the array's pages (in at most 1024
    ranges: these cases have far fewer), else all of it."""
    p, item = h.plan, h.padded.dtype.itemsize
    shape = p.padded_shape
    pages = set()
    for r, _, boxes in p.recvs:
        if r not in on:
            continue
        for start, ext in boxes:
            if not all(ext):
                continue
            idx = np.indices(ext).reshape(len(ext), -1) + np.array(start)[:, None]
            off = np.ravel_multi_index(tuple(idx), shape) * item
            pages |= set((off // 4096).tolist()) | set(((off + item - 1) // 4096).tolist())
    nbytes = int(np.prod(shape)) * item
    total = -(-max(nbytes, 1) // 4096)
    return min(len(pages) * 4096, nbytes) if 2 * len(pages) <= total else nbytes


def test_shared_pages_are_those_node_peers_reach(comm):
    """shared_bytes against the rule computed cell by cell, on every case above and on 2-D
    and 3-D meshes (their sharded inner dims share every page)."""
    if comm.size < 2:
        pytest.skip("one rank: no node peers")
    bad = []
    more = [((9 * comm.size, 300, 20), (comm.size, 1, 1), [S0, R, R], None, "float64", 1)]
    if comm.size == 4:
        more.append(((40, 40, 200), (2, 2, 1), [S0, S1, R], None, "float32", 2))
    for shape, mshape, placements, sizes, dtype, width, *_ in sparse_cases(comm.size) + more:
        mesh = ps.Mesh(comm, mshape)
        x = ps.distribute(make_global(shape, dtype, seed=1), mesh, placements, sizes)
        for periodic in (True, False):
            h = x.with_halo(width, periodic=periodic, method="shm")
            if h.node_buffer is None:
                continue
            want = expected_shared(h, node_peers(mesh))
            if h.node_buffer.shared_bytes != want:
                bad.append(f"{shape} {placements} p={periodic} rank {comm.rank}: "
                           f"{h.node_buffer.shared_bytes} B shared, the rule says {want}")
        mesh.free()
    all_agree(comm, bad)
