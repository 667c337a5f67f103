"""The pyshard.fft examples: examples/poisson.py's three solves (periodic FFT, Neumann
DCT-II/III, Dirichlet DST-I) match their analytic solutions on every mesh of the run."""

from __future__ import annotations

import importlib.util
import os

import pytest

pytestmark = [pytest.mark.mpi, pytest.mark.numerics]  # numerics: not rerun per MPI library

_EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples")


def _load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(_EXAMPLES, f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("n", [8, 13])
def test_poisson_matches_analytic(comm, n):
    poisson = _load("poisson")
    for ms in [(comm.size,), (1, comm.size), None]:
        errs = poisson.solve_all(comm, n, ms)
        assert set(errs) == {"periodic (fftn)", "Neumann (DCT-II/III)", "Dirichlet (DST-I)"}
        for k, v in errs.items():
            assert v < 1e-10, (ms, k, v)


@pytest.mark.parametrize("n", [32, pytest.param(64, marks=pytest.mark.slow)])
def test_navier_stokes_equals_serial(comm, n):
    """The Taylor-Green vortex at 32^3 and 64^3: kinetic energy and dissipation after each of
    2 RK4 steps equal a serial numpy.fft run of the same code to 1e-12 (relative)."""
    ns = _load("navier_stokes")
    got, ref, diff = ns.compare(comm, n=n, steps=2)
    assert diff < 1e-12, (got, ref)
    assert abs(got[0][0] - 0.125) < 1e-3  # the TGV's energy starts at 1/8 and decays
    assert got[1][0] < got[0][0]
