"""One peer message over 2^31 bytes: the MPI-4 large-count path (2 ranks, ~4.3 GB in all)."""

from __future__ import annotations

import os

import numpy as np
import pytest

import pyshard as ps
from pyshard import Shard

pytestmark = pytest.mark.mpi  # run under mpiexec with --with-mpi (pytest-mpi)

N = 2**31 + 4099  # bytes in the one message, past INT_MAX


@pytest.mark.skipif(os.environ.get("PYSHARD_SKIP_LARGE") == "1", reason="PYSHARD_SKIP_LARGE=1")
def test_message_over_2_31_bytes(comm):
    if comm.size != 2:
        pytest.skip("runs at 2 ranks only (memory)")
    mesh = ps.Mesh(comm, (2,))
    # rank 0 holds every byte, rank 1 none; the rebalance sends it all in one message
    n0 = N if comm.rank == 0 else 0
    local = np.empty((1, n0), np.uint8)
    if n0:
        local[0, :] = 7
        local[0, ::4096] = (np.arange(local[0, ::4096].size) % 251).astype(np.uint8)
    x = ps.from_local(local, mesh, [Shard(1)], global_shape=(1, N), sizes={1: [N, 0]})
    del local
    before = ps.comm_stats().get("alltoallv", 0)
    y = x.redistribute([Shard(1)], sizes={1: [0, N]}, algorithm="alltoallv")
    assert ps.comm_stats()["alltoallv"] == before + 1
    check(comm, y)
    del y
    # the same message through a subarray datatype (MPI_Alltoallw_c)
    y = x.redistribute([Shard(1)], sizes={1: [0, N]}, algorithm="alltoallw")
    check(comm, y)


def check(comm, y):
    if comm.rank == 1:
        assert y.local.shape == (1, N)
        probe = y.local[0, ::4096]
        np.testing.assert_array_equal(probe, (np.arange(probe.size) % 251).astype(np.uint8))
        assert y.local[0, 1] == 7 and y.local[0, -1] == 7  # (N - 1) % 4096 != 0: not a probe
    else:
        assert y.local.shape == (1, 0)
