"""pyshard.route decides every path, folds and batches included (no MPI: a stand-in mesh
whose node transport is given): a fold of a dtype the core does not combine never takes
node-shared memory, and a batch of redistribute_many goes where one step of its size goes."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import pyshard as ps
from pyshard import Shard
from pyshard.halo_planner import halo_spec
from pyshard.route import batch_route, halo_route

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
