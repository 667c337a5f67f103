"""pyshard.route's halo rule without MPI (no mesh, no node map): halo_face_bytes from the
shard table, and halo_route's decisions on a stand-in mesh whose node transport is given
(none, a node with a core per rank, an oversubscribed one), under the settings that move
them (PYSHARD_SHM_MIN_BYTES, PYSHARD_TRANSPORT), for every method and for device arrays.
Every expectation is written here from the docs (docs/halo.md): the face bytes from the
shapes, widths and itemsizes; the thresholds as numbers (every face where each rank has a
core, 256 KiB where ranks outnumber cores); the methods by name."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import pyshard as ps
from pyshard import Replicate, Shard
from pyshard.halo_planner import halo_spec
from pyshard.route import halo_face_bytes, halo_reason, halo_route

# docs/halo.md: the MPI methods, and "shm" on top where ranks of the mesh share a node
MPI_METHODS = ("persistent", "p2p", "datatype", "neighbor")
OVERSUBSCRIBED = 262144  # 256 KiB: the smallest face auto sends through shm there


class FakeMesh:
    """What halo_route asks of a mesh: its ndim and the node transport over its dims."""

    def __init__(self, ndim, node):
        self.ndim, self.node, self.asked = ndim, node, []

    def node_transport(self, dims):
        self.asked.append(dims)
        return self.node


CORES = SimpleNamespace(oversubscribed=False, nodes=1, node_ranks=[0, 1])
OVER = SimpleNamespace(oversubscribed=True, nodes=1, node_ranks=[0, 1, 2, 3])


def face(shape, dtype, mesh_shape, placements, width, sizes=None):
    lay = ps.Layout(shape, dtype, mesh_shape, placements, sizes)
    return lay, halo_spec(lay, width, True, True)


@pytest.mark.parametrize(
    "shape, dtype, mesh_shape, placements, width, sizes, want",
    [
        ((10, 20), "float64", (2,), [Shard(0)], (1, 0), None, 1 * 20 * 8),
        ((10, 20), "float64", (2,), [Shard(0)], (3, 5), None, 3 * 20 * 8),  # dim 1: unsharded
        ((10, 20), "float64", (2,), [Shard(0)], (0, 5), None, 0),  # no sharded dim has width
        ((10, 21), "float32", (2, 3), [Shard(0), Shard(1)], (2, 1), None, max(2 * 7, 1 * 5) * 4),
        ((10, 21), "float32", (2, 3), [Shard(0), Shard(1)], (1, 3), None, max(7, 3 * 5) * 4),
        # uneven: the largest shard's extents
        ((9, 6), "int16", (3,), [Shard(1)], (0, 2), {1: (1, 1, 4)}, 2 * 9 * 2),
        ((7, 6), "float64", (3,), [Shard(0)], 1, {0: (7, 0, 0)}, 6 * 8),  # empty shards
        ((6, 5), "complex128", (2, 2), [Replicate(), Shard(1)], 1, None, 6 * 16),
        ((9, 4), "float64", (2, 2), [Shard(0), Shard(0)], (2, 1), None, 2 * 4 * 8),  # nested
        ((5, 4, 6), "uint8", (2, 2, 2), [Shard(0), Shard(1), Shard(2)], (1, 2, 1), None,
         max(1 * 2 * 3, 2 * 3 * 3, 1 * 3 * 2)),  # extents 3, 2, 3
    ],
)
def test_halo_face_bytes(shape, dtype, mesh_shape, placements, width, sizes, want):
    lay, spec = face(shape, dtype, mesh_shape, placements, width, sizes)
    assert halo_face_bytes(lay, spec) == want


def small():
    return face((8, 4), "float64", (2,), [Shard(0)], 1)  # a 32 B face (1 x 4 x 8 B)


def big(n):
    """A face of exactly ``n`` float64 bytes (width 1 on dim 0, ``n // 8`` columns)."""
    return face((8, n // 8), "float64", (2,), [Shard(0)], (1, 0))


def test_no_node_peer_takes_mpi():
    lay, spec = small()
    assert halo_face_bytes(lay, spec) == 32
    for method in ("auto", "shm"):
        r = halo_route(lay, spec, FakeMesh(1, None), method)
        assert (r.path, r.algorithm, r.node) == ("mpi", "persistent", None)
    for method in MPI_METHODS:
        r = halo_route(lay, spec, FakeMesh(1, None), method)
        assert (r.path, r.algorithm) == ("mpi", method)
    r = halo_route(lay, spec, FakeMesh(1, None), "tune")
    assert r.path == "tune" and sorted(r.candidates) == sorted(MPI_METHODS)


def test_auto_by_the_largest_face():
    with ps.config.override(PYSHARD_SHM_MIN_BYTES=None, PYSHARD_TRANSPORT="auto"):
        lay, spec = small()
        m = FakeMesh(1, CORES)
        # a core per rank: every face takes node-shared memory
        r = halo_route(lay, spec, m, "auto")
        assert (r.path, r.algorithm, r.node) == ("shm", "shm", CORES)
        assert m.asked == [(0,)]  # the node transport over every mesh dim
        assert "(largest face 32 B >= 0 B)" in halo_reason(r, lay, spec, m, "auto")
        # ... of any size: no face at all, and faces around the transposes' 16 KiB and 256 KiB
        lay, spec = face((8, 4), "float64", (2,), [Shard(0)], (0, 1))  # 0 B
        assert halo_route(lay, spec, FakeMesh(1, CORES), "auto").path == "shm"
        for n in 8, 16384 - 8, 16384, OVERSUBSCRIBED - 8:
            lay, spec = big(n)
            assert halo_route(lay, spec, FakeMesh(1, CORES), "auto").path == "shm", n
        # ranks outnumber cores: 256 KiB faces and larger
        for n, path in (OVERSUBSCRIBED - 8, "mpi"), (OVERSUBSCRIBED, "shm"), (1 << 20, "shm"):
            lay, spec = big(n)
            assert halo_face_bytes(lay, spec) == n
            m = FakeMesh(1, OVER)
            r = halo_route(lay, spec, m, "auto")
            assert r.path == path, n
            assert r.algorithm == ("shm" if path == "shm" else "persistent")
            why = halo_reason(r, lay, spec, m, "auto")
            assert f"largest face {n} B {'>=' if path == 'shm' else '<'} 262144 B" in why, why
    with ps.config.override(PYSHARD_SHM_MIN_BYTES=1000):
        for n, path in (992, "mpi"), (1000, "shm"):
            lay, spec = big(n)
            for node in (CORES, OVER):
                assert halo_route(lay, spec, FakeMesh(1, node), "auto").path == path
    with ps.config.override(PYSHARD_SHM_MIN_BYTES=0):
        lay, spec = face((8, 4), "float64", (2,), [Shard(0)], (0, 1))  # no face at all
        assert halo_route(lay, spec, FakeMesh(1, OVER), "auto").path == "shm"


def test_shm_tune_and_mpi_methods_with_a_node():
    lay, spec = small()
    with ps.config.override(PYSHARD_SHM_MIN_BYTES=1 << 40, PYSHARD_TRANSPORT="auto"):
        r = halo_route(lay, spec, FakeMesh(1, OVER), "shm")  # whatever the size
        assert (r.path, r.algorithm) == ("shm", "shm")
        r = halo_route(lay, spec, FakeMesh(1, OVER), "tune")
        assert (r.path, r.algorithm, r.node) == ("tune", "tune", OVER)
        assert sorted(r.candidates) == sorted(MPI_METHODS + ("shm",))
        for method in MPI_METHODS:  # an MPI method by name takes MPI, node or not
            m = FakeMesh(1, CORES)
            r = halo_route(lay, spec, m, method)
            assert (r.path, r.algorithm, r.node) == ("mpi", method, None)
            assert m.asked == []


@pytest.mark.parametrize("transport", ["mpi", "direct", "staged"])
def test_transport_setting_turns_it_off(transport):
    """PYSHARD_TRANSPORT=mpi|direct|staged: MPI, staged through host buffers where the
    setting says so (read when the route is made: the step is built with it), and the
    datatype method, which needs MPI on the array's memory, not among staging's candidates."""
    lay, spec = small()
    path = "staged" if transport == "staged" else "mpi"
    with ps.config.override(PYSHARD_TRANSPORT=transport, PYSHARD_SHM_MIN_BYTES=0):
        for method in ("auto", "shm"):
            r = halo_route(lay, spec, FakeMesh(1, CORES), method)
            assert (r.path, r.algorithm, r.node) == (path, "persistent", None)
            assert r.transport == ("staged" if transport == "staged" else "direct")
        r = halo_route(lay, spec, FakeMesh(1, CORES), "tune")
        assert "shm" not in r.candidates and r.node is None
        want = [m for m in MPI_METHODS if not (transport == "staged" and m == "datatype")]
        assert sorted(r.candidates) == sorted(want)
        assert r.transport == ("staged" if transport == "staged" else "direct")


def test_device_arrays_never_take_node_shared_memory():
    lay, spec = small()
    with ps.config.override(PYSHARD_SHM_MIN_BYTES=0, PYSHARD_TRANSPORT="auto"):
        for method in ("auto", "shm"):
            m = FakeMesh(1, CORES)
            r = halo_route(lay, spec, m, method, device=True)
            assert r.path in ("device", "staged") and r.algorithm == "persistent"
            assert m.asked == []
        r = halo_route(lay, spec, FakeMesh(1, CORES), "tune", device=True)
        assert sorted(r.candidates) == ["neighbor", "p2p", "persistent"]  # host only: datatype
