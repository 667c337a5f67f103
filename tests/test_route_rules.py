"""pyshard.route decides every path, folds and batches included (no MPI: a stand-in mesh
whose node transport is given): a fold of a dtype the core does not combine (or of another
byte order) never takes node-shared memory, a batch of redistribute_many goes where one step
of its size goes, and tune lists the same candidates on every rank of a 2-D mesh."""

from __future__ import annotations

import itertools
from math import prod
from types import SimpleNamespace

import numpy as np
import pytest

import pyshard as ps
from pyshard import Replicate, Shard
from pyshard.halo_planner import halo_spec
from pyshard.planner import plan
from pyshard.route import batch_route, halo_route, route

CORES = SimpleNamespace(oversubscribed=False, nodes=1, node_ranks=[0, 1])
TWO_NODES = SimpleNamespace(oversubscribed=False, nodes=2, node_ranks=[0, 1])


class FakeMesh:
    """What the rules ask of a mesh: its ndim and the node transport over some dims."""

    def __init__(self, ndim, node):
        self.ndim, self.node = ndim, node

    def node_transport(self, dims):
        return self.node


# the dtypes cpp/halo.h FoldKind combines, written out here (not taken from pyshard)
CORE_COMBINES = ["float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16",
                 "uint32", "uint64", "complex64", "complex128"]
PYTHON_COMBINES = ["float16", "bool"]


def halo_case(dtype):
    lay = ps.Layout((8, 4), dtype, (2,), [Shard(0)])
    return lay, halo_spec(lay, 1)


@pytest.mark.parametrize("dtype", CORE_COMBINES + PYTHON_COMBINES)
def test_a_fold_takes_shm_only_for_the_dtypes_the_core_combines(dtype):
    lay, spec = halo_case(dtype)
    mesh = FakeMesh(1, CORES)
    with ps.config.override(PYSHARD_TRANSPORT="auto", PYSHARD_SHM_MIN_BYTES=0):
        for method in ("auto", "shm"):
            up = halo_route(lay, spec, mesh, method)
            fold = halo_route(lay, spec, mesh, method, fold=True)
            assert up.path == "shm"  # the update: node-shared memory whatever the dtype
            if dtype in CORE_COMBINES:
                assert (fold.path, fold.algorithm) == ("shm", "shm"), dtype
            else:
                assert (fold.path, fold.algorithm) == ("mpi", "persistent"), dtype
        up = halo_route(lay, spec, mesh, "tune")
        fold = halo_route(lay, spec, mesh, "tune", fold=True)
        assert "shm" in up.candidates
        assert ("shm" in fold.candidates) == (dtype in CORE_COMBINES)
        assert fold.path == "tune"
        assert set(fold.candidates) - {"shm"} == set(up.candidates) - {"shm"}
        # an MPI method by name: the same for both
        for method in ("persistent", "p2p", "datatype", "neighbor"):
            assert halo_route(lay, spec, mesh, method, fold=True).algorithm == method


def test_ml_dtype_folds_take_mpi():
    md = pytest.importorskip("ml_dtypes")
    lay, spec = halo_case(np.dtype(md.bfloat16))
    with ps.config.override(PYSHARD_TRANSPORT="auto", PYSHARD_SHM_MIN_BYTES=0):
        assert halo_route(lay, spec, FakeMesh(1, CORES), "auto", fold=True).path == "mpi"


def test_a_batch_goes_where_one_step_of_its_block_goes():
    mesh = FakeMesh(1, CORES)
    with ps.config.override(PYSHARD_TRANSPORT="auto", PYSHARD_SHM_MIN_BYTES=1000):
        # auto: node-shared memory from 1000 B, MPI below (the threshold as set)
        assert batch_route("alltoallv", (0,), 1000, mesh, "auto").path == "shm"
        assert batch_route("alltoallv", (0,), 999, mesh, "auto").path == "mpi"
        # shm: whatever the size; tune: as auto; an MPI algorithm by name: MPI
        assert batch_route("alltoallv", (0,), 8, mesh, "shm").path == "shm"
        assert batch_route("alltoallv", (0,), 1000, mesh, "tune").path == "shm"
        assert batch_route("alltoallv", (0,), 1 << 30, mesh, "p2p").path == "mpi"
        # no node peer: MPI; GPU arrays: never node-shared memory
        assert batch_route("alltoallv", (0,), 1 << 30, FakeMesh(1, None), "auto").path == "mpi"
        assert batch_route("alltoallv", (0,), 1 << 30, mesh, "shm", device=True).path != "shm"
        # a reduction needs every rank on one node
        assert batch_route("reduce_scatter", (0,), 1 << 30, mesh, "auto").path == "shm"
        two = FakeMesh(1, TWO_NODES)
        assert batch_route("reduce_scatter", (0,), 1 << 30, two, "auto").path == "mpi"
        assert batch_route("alltoallv", (0,), 1 << 30, two, "auto").path == "shm"
    with ps.config.override(PYSHARD_TRANSPORT="mpi"):
        assert batch_route("alltoallv", (0,), 1 << 30, mesh, "shm").path == "mpi"


@pytest.mark.parametrize("dtype", [">f8", ">f4", ">i4", ">c16", ">u2"])
def test_a_fold_of_another_byte_order_takes_mpi(dtype):
    """The core combines a fold in native byte order only (its wait asks FOLD_KIND for the
    dtype itself): ">f8", named "float64" like "<f8", folds by persistent requests, and tune
    leaves shm out, as for the dtypes the core does not combine (docs/halo.md)."""
    lay, spec = halo_case(dtype)
    native = halo_case(np.dtype(dtype).newbyteorder("="))[0]
    mesh = FakeMesh(1, CORES)
    with ps.config.override(PYSHARD_TRANSPORT="auto", PYSHARD_SHM_MIN_BYTES=0):
        for method in ("auto", "shm"):
            assert halo_route(lay, spec, mesh, method).path == "shm"  # an update copies bytes
            fold = halo_route(lay, spec, mesh, method, fold=True)
            assert (fold.path, fold.algorithm) == ("mpi", "persistent"), (dtype, method)
            assert halo_route(native, spec, mesh, method, fold=True).path == "shm"
        fold = halo_route(lay, spec, mesh, "tune", fold=True)
        assert fold.path == "tune" and "shm" not in fold.candidates
        assert "shm" in halo_route(native, spec, mesh, "tune", fold=True).candidates


class RankMesh:
    """A 2-D mesh as rank ``rank`` of it sees it, every rank on one node: the node transport
    and node groups of this rank's communicator over some dims (as pyshard.Mesh gives them),
    and the whole mesh's node facts."""

    def __init__(self, shape, rank):
        self.shape, self.ndim, self.size, self.rank = shape, len(shape), prod(shape), rank
        self.coords = tuple(int(c) for c in np.unravel_index(rank, shape))

    def members(self, dims):
        ranges = [range(n) if d in dims else (c,)
                  for d, (n, c) in enumerate(zip(self.shape, self.coords))]
        return [int(np.ravel_multi_index(c, self.shape)) for c in itertools.product(*ranges)]

    def node_transport(self, dims):
        n = len(self.members(dims))
        return SimpleNamespace(oversubscribed=False, nodes=1, node_ranks=list(range(n))) \
            if n > 1 else None  # fmt: skip

    def node_groups(self, dims):
        return {r: (0, 0) for r in self.members(dims)}

    def node_info(self):
        return {"shm": [1] * self.size}


@pytest.mark.parametrize("mesh_shape", [(2, 2), (2, 3), (4, 2)])
@pytest.mark.parametrize("shape, src, dst", [
    ((1, 3), [Shard(0), Shard(0)], [Shard(1), Shard(0)]),  # one row, on mesh rank 0 only
    ((1, 2), [Shard(0), Shard(0)], [Shard(1), Shard(0)]),
    ((5, 7), [Shard(0), Shard(1)], [Shard(1), Shard(0)]),
    ((3, 2), [Shard(1), Shard(0)], [Shard(0), Shard(1)]),
    ((6, 6), [Shard(0), Replicate()], [Shard(1), Shard(1)]),
])
def test_tune_lists_the_same_candidates_on_every_rank(mesh_shape, shape, src, dst):
    """algorithm="tune" combines its timings over the whole mesh (pyshard._tune), so every
    rank of the mesh must list the same candidates for a step, although the communicators of
    a step over one dim of a 2-D mesh differ in whether some block goes between node peers
    (here: the one row of a (1, n) array lives on mesh rank 0, so only its column moves)."""
    x = ps.Layout(shape, "float32", mesh_shape, src)
    steps = plan(x, ps.Layout(shape, "float32", mesh_shape, dst)).steps
    P = prod(mesh_shape)
    with ps.config.override(PYSHARD_TRANSPORT="auto"):
        for s in steps:
            if s.kind != "alltoallv":
                continue
            got = {route(s, RankMesh(mesh_shape, r), "tune").candidates for r in range(P)}
            assert len(got) == 1, (s, got)
            (cands,) = got
            # each candidate is usable on every rank, "shm" too: where a rank's communicator
            # has no node transport it runs as route() takes it there (MPI)
            for r in range(P):
                for c in cands:
                    assert route(s, RankMesh(mesh_shape, r), c).path in ("shm", "mpi"), (r, c)
