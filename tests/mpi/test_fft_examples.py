"""The pyshard.fft examples: examples/poisson.py's three solves (periodic FFT, Neumann
DCT-II/III, Dirichlet DST-I) match their analytic solutions on every mesh of the run."""

from __future__ import annotations

import importlib.util
import os

import numpy as np
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


def test_navier_stokes_nan_fails_the_check(comm):
    """A time step so large that the run blows up to NaN: the check fails (Python's max()
    dropped the NaN differences: "max relative difference 1.9e-16", exit 0), and so does a
    run without --check."""
    ns = _load("navier_stokes")
    with np.errstate(all="ignore"):
        got, ref, diff = ns.compare(comm, n=8, steps=2, dt=1e6)
        assert not np.all(np.isfinite(got))
        assert not diff < 1e-12, diff
        assert ns.main(["--n", "8", "--steps", "2", "--dt", "1e6", "--check"]) == 1
        assert ns.main(["--n", "8", "--steps", "2", "--dt", "1e300"]) == 1
    # nu = 0: the dissipation is 0 on both sides (it divided by it)
    assert ns.main(["--n", "8", "--steps", "1", "--nu", "0", "--check"]) == 0


def test_poisson_nan_on_another_rank_fails(comm, monkeypatch):
    """A NaN in the last rank's solution only: its error is NaN on every rank and the run
    fails (an MPI MAX reduction of the errors dropped it)."""
    poisson = _load("poisson")
    solve = poisson.solve

    def bad(*args, **kw):
        got = solve(*args, **kw)
        if comm.rank == comm.size - 1 and got.local.size:
            got.local.flat[0] = np.nan
        return got

    monkeypatch.setattr(poisson, "solve", bad)
    errs = poisson.solve_all(comm, 8)
    assert all(np.isnan(v) for v in errs.values()), errs
    assert poisson.main(["--n", "8"]) == 1


@pytest.mark.parametrize("name,argv", [
    ("poisson", ["--n", "7"]), ("poisson", ["--mesh", "abc"]), ("poisson", ["--mesh", "2,2"]),
    ("poisson", ["--mesh", "1x1x1"]), ("poisson", ["--mesh", "3x5"]),
    ("navier_stokes", ["--steps", "0", "--check"]), ("navier_stokes", ["--n", "1"]),
    ("navier_stokes", ["--mesh", "2,2"]), ("navier_stokes", ["--mesh", "3x5"]),
    ("fft3d", ["--reps", "0"]), ("fft3d", ["--mesh", "4"]), ("fft3d", ["--mesh", "3x5"]),
])  # fmt: skip
def test_bad_options_are_argparse_errors(comm, capsys, name, argv):
    with pytest.raises(SystemExit) as e:
        _load(name).main(["--n", "8", *argv] if argv[0] != "--n" else argv)
    assert e.value.code == 2
    assert argv[0] in capsys.readouterr().err


def test_poisson_rejects_a_grid_that_aliases(comm):
    with pytest.raises(ValueError, match="at least 8"):
        _load("poisson").solve_all(comm, 7)
