"""GPU tests (cupy arrays): the oracle helpers of tests/mpi, and the transport fixture.

Every module here skips itself at collection where :func:`pyshard.cuda_available` is False
(no GPU or driver, a core built without CUDA, or no cupy), so collection never needs cupy.
The MPI plumbing (quiet ranks, agreeing outcome, ``comm``) is tests/conftest.py's.
"""

from __future__ import annotations

import os
import sys

import pytest

import pyshard as ps

_MPI_TESTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "mpi")
if _MPI_TESTS not in sys.path:
    sys.path.insert(0, _MPI_TESTS)  # oracle.py, ckpt_worker.py

from test_checkpoint import shared_dir  # noqa: E402, F401 - the fixture, for the GPU checkpoints


@pytest.fixture(params=["staged", "direct"])
def transport(request):
    """Run the test with GPU arrays going through host bounce buffers ("staged", always) or
    handed to the MPI library as device memory ("direct", only where the MPI is CUDA-aware:
    the same answer on every rank, so this never skips by rank)."""
    name = request.param
    if name == "direct" and ps.build_info()["cuda_aware_mpi"] is not True:
        pytest.skip("device-direct needs a CUDA-aware MPI (build_info()['cuda_aware_mpi'])")
    # PYSHARD_CUDA_AWARE names the GPU transport alone (host arrays keep theirs); the steps
    # built under it keep it. PYSHARD_TRANSPORT=direct|staged would name both: MPI instead.
    pins = {"PYSHARD_CUDA_AWARE": name == "direct"}
    if ps.config.get("PYSHARD_TRANSPORT") in ("direct", "staged"):
        pins["PYSHARD_TRANSPORT"] = "mpi"
    with ps.config.override(**pins):
        yield name
