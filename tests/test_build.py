"""The build explains itself: configuring without an MPI stops with a message that says
what to do."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)


def _cmake():
    return shutil.which("cmake", path=BIN) or shutil.which("cmake")


def test_configure_without_mpi_says_what_to_do(tmp_path):
    cmake = _cmake()
    if cmake is None:
        pytest.skip("no cmake")
    try:
        import pybind11
    except ImportError:
        pytest.skip("no pybind11")
    env = {k: v for k, v in os.environ.items() if k not in ("MPICC", "MPI_HOME", "CUDA_HOME")}
    env["PATH"] = "/usr/bin:/bin"  # no mpicc from the venv or /usr/local
    cmd = [
        cmake, "-S", ROOT, "-B", str(tmp_path / "b"),
        "-DSKBUILD_PROJECT_NAME=pyshard", "-DSKBUILD_PROJECT_VERSION=0.0.0",
        f"-DPython_EXECUTABLE={sys.executable}", f"-Dpybind11_DIR={pybind11.get_cmake_dir()}",
        "-DMPI_C_COMPILER=/nonexistent/mpicc", "-DPYSHARD_CUDA=OFF",
    ]  # fmt: skip
    if shutil.which("mpicc", path="/usr/bin:/bin"):
        pytest.skip("a system MPI is installed: cannot configure without one")
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert "pyshard: no MPI found" in out, out
    assert "pip install mpich" in out and "MPICC=" in out and "MPI_HOME=" in out, out
