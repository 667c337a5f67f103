"""examples/spmv.py and examples/gnn.py at tiny sizes, at whatever rank count the suite runs:

- spmv: the product through the gather plan equals scipy.sparse's to 1e-14 relative, the
  conjugate gradient takes scipy's cg's iterations and reaches its solution to 1e-10, with
  uneven rows (an empty rank from 3 ranks on) and the balanced split; ghost rows cross ranks
  where P > 1; the matrix is symmetric positive definite and randomly numbered;
- gnn: after a few SGD steps the loss per step and every weight equal the single-process
  model's to 1e-10, and the weights are the same bits on every rank;
- both mains exit 0 with their checks on.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

import pyshard as ps

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.mpi(min_size=1), pytest.mark.numerics]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load(name):
    spec = importlib.util.spec_from_file_location(f"{name}_example", EXAMPLES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


spmv = load("spmv")
gnn = load("gnn")


@pytest.fixture(scope="module")
def mesh():
    m = ps.Mesh(MPI.COMM_WORLD, (MPI.COMM_WORLD.size,))
    yield m
    m.free()


def test_matrix_and_split():
    a = spmv.laplacian(7, seed=1)
    assert a.shape == (25, 25)
    d = a.toarray()
    np.testing.assert_allclose(d, d.T, rtol=0, atol=1e-14)
    assert np.linalg.eigvalsh(d).min() > 0
    # randomly numbered: the entries are not a band around the diagonal
    rows, cols = a.nonzero()
    assert np.abs(rows - cols).max() > 10
    assert spmv.row_sizes(25, 1) == [25]
    s = spmv.row_sizes(25, 5)
    assert sum(s) == 25 and s[2] == 0 and len(set(s)) > 2
    assert spmv.row_sizes(25, 5, "balanced") is None


@pytest.mark.parametrize("split", ["uneven", "balanced"])
def test_spmv_and_cg_equal_scipy(mesh, split):
    r = spmv.run(mesh, m=8, split=split, products=1, seed=2)
    assert r["spmv_err"] <= spmv.SPMV_TOL, r
    assert r["serial_info"] == 0 and r["iterations"] == r["serial_iterations"] > 5, r
    assert r["solution_err"] <= spmv.SOLUTION_TOL, r
    assert r["ok"]
    assert sum(r["sizes"]) == r["n"] == 36
    if split == "uneven" and mesh.size > 2:
        assert 0 in r["sizes"]
    assert (r["ghosts"] > 0) == (mesh.size > 1)


def test_gnn_equals_single_process(mesh):
    r = gnn.run(mesh, nodes=40, blocks=3, p_in=0.3, p_out=0.05, features=4, hidden=6,
                steps=3, seed=1)
    assert len(r["losses"]) == 3
    np.testing.assert_allclose(r["losses"], r["serial_losses"], rtol=0, atol=gnn.TOL)
    assert r["weight_err"] <= gnn.TOL, r
    assert r["across_ranks"] == 0.0, r
    assert r["losses"][-1] < r["losses"][0]  # it trains
    assert r["ok"]


def test_mains_check(comm, capsys):
    assert spmv.main(["--m", "6", "--products", "1"]) == 0
    assert gnn.main(["--nodes", "24", "--steps", "1", "--hidden", "4"]) == 0
    out = capsys.readouterr().out
    assert comm.rank != 0 or out.count("checks pass: True") == 2


def test_spmv_matches_scipy_apart_from_converging(mesh, capsys):
    """One CG iteration: the same as scipy's one iteration ("matches"), but not converged:
    the run fails for that reason, not for a mismatch (it said "checks pass: False" as a
    mismatch, and with 0 iterations "True")."""
    r = spmv.run(mesh, m=8, maxiter=1, products=1, seed=2)
    assert r["matches"] and not r["converged"] and not r["ok"], r
    assert spmv.main(["--m", "6", "--products", "1", "--maxiter", "1"]) == 1
    out = capsys.readouterr().out
    assert mesh.rank != 0 or "matches scipy: True" in out


@pytest.mark.parametrize("name,argv", [
    ("spmv", ["--seed", "-1"]), ("spmv", ["--maxiter", "0"]), ("spmv", ["--rtol", "0"]),
    ("spmv", ["--rtol", "nan"]), ("spmv", ["--m", "2"]),
    ("gnn", ["--hidden", "0"]), ("gnn", ["--features", "0"]), ("gnn", ["--seed", "-1"]),
    ("gnn", ["--nodes", "3", "--blocks", "2"]),  # no training node
])  # fmt: skip
def test_bad_options_are_argparse_errors(comm, capsys, name, argv):
    main = {"spmv": spmv.main, "gnn": gnn.main}[name]
    with pytest.raises(SystemExit) as e:
        main(["--steps", "1", *argv] if name == "gnn" else ["--products", "1", *argv])
    assert e.value.code == 2
    assert argv[0] in capsys.readouterr().err
