"""examples/pic.py (an electrostatic particle-in-cell code: cloud-in-cell deposit and halo fold,
a Poisson solve through pyshard.fft, the field with halo updates, a leapfrog push and
pyshard.migrate) at small sizes, at whatever rank count the suite runs: after k steps the
particles, sorted by id, equal a serial numpy run of the same steps within 1e-9 (other
summation orders), every particle is held by exactly one rank and lies in its owner's box,
particles crossed boxes every step where P > 1, and the charge deposited each step equals the
particles' total to round-off; blocking and overlapped migration (the staying particles
deposited while the rows fly) and in place (only the leavers copied), 2-D and 3-D, a slab
mesh; and the deposit + fold alone (k = 0) with every halo method."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

import pyshard as ps

pytestmark = [pytest.mark.mpi, pytest.mark.numerics]  # numerics: not rerun per MPI library

_spec = importlib.util.spec_from_file_location(
    "pic_example", Path(__file__).resolve().parents[2] / "examples" / "pic.py"
)
pic = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pic)

# (dim, n, ppc): 256 and 216 particles; 3 steps of dt 0.25 at thermal velocity 1
SIZES = {2: (8, 4), 3: (6, 1)}
STEPS = 3

_serial_cache: dict = {}


def _serial(dim: int, steps: int, seed: int) -> dict:
    key = (dim, steps, seed)
    if key not in _serial_cache:
        n, ppc = SIZES[dim]
        _serial_cache[key] = pic.serial(n, dim, ppc, steps, seed=seed)
    return _serial_cache[key]


def _assert_equal_to_serial(comm, res, ref, n, steps):
    c = pic.check(comm, res, ref, n)
    assert c["ids_ok"], "the ids held, gathered, are not each id once"
    assert c["in_box"], "a particle is not on the rank that owns its cell"
    assert c["x_err"] <= pic.TOL, c
    assert c["v_err"] <= pic.TOL, c
    assert c["rho_err"] <= pic.TOL, c
    assert c["charge_err"] <= pic.CHARGE_TOL, c
    assert c["ok"]
    assert len(res["charge"]) == steps + 1 and len(res["crossed"]) == steps
    # the energy per step is the serial run's (field and kinetic)
    np.testing.assert_allclose(res["energy"], ref["energy"], rtol=1e-9, atol=0)


@pytest.mark.parametrize("dim", [2, 3])
@pytest.mark.parametrize("mode", ["blocking", "overlap", "inplace"])
def test_k_steps_equal_serial(comm, dim, mode):
    n, ppc = SIZES[dim]
    mesh = ps.Mesh(comm, MPI.Compute_dims(comm.size, dim))
    res = pic.run(mesh, n, dim, ppc, STEPS, seed=3, overlap=mode == "overlap",
                  inplace=mode == "inplace")
    _assert_equal_to_serial(comm, res, _serial(dim, STEPS, 3), n, STEPS)
    if comm.size > 1:  # every mesh dim here splits the grid: particles cross every step
        assert all(c > 0 for c in res["crossed"]), res["crossed"]
    else:
        assert res["crossed"] == [0] * STEPS
    mesh.free()


def test_slab_mesh_3d(comm):
    """A 1-D mesh on a 3-D grid: only axis 0 is sharded (owner() along the others: this
    rank's coordinate)."""
    n, ppc = SIZES[3]
    mesh = ps.Mesh(comm, (comm.size,))
    res = pic.run(mesh, n, 3, ppc, 2, seed=3, overlap=True)
    _assert_equal_to_serial(comm, res, _serial(3, 2, 3), n, 2)
    assert (sum(res["crossed"]) > 0) == (comm.size > 1)
    mesh.free()


@pytest.mark.parametrize("dim,method", [(2, "persistent"), (3, "neighbor"), (3, "datatype")])
def test_deposit_fold_equals_serial(comm, dim, method):
    """k = 0: the cloud-in-cell deposit and fold of the initial particles, each halo method."""
    n, ppc = SIZES[dim]
    mesh = ps.Mesh(comm, MPI.Compute_dims(comm.size, dim))
    res = pic.run(mesh, n, dim, ppc, 0, seed=5, method=method)
    ref = _serial(dim, 0, 5)
    rho = res["rho"]
    np.testing.assert_allclose(rho.local, ref["rho"][rho.box], rtol=0,
                               atol=1e-12 * np.abs(ref["rho"]).max())
    assert abs(res["charge"][0] - ref["q"].sum()) <= 1e-12 * abs(ref["q"].sum())
    assert comm.allreduce(len(res["ids"])) == n**dim * ppc
    mesh.free()


def test_particles_do_not_depend_on_the_split():
    """The particles of a box are the global set's rows of the cells in it, and in them."""
    n, dim, ppc = 6, 3, 2
    x, v, q, ids = pic.particles(n, dim, ppc, seed=9)
    box = (slice(2, 5), slice(0, 6), slice(1, 3))
    bx, bv, bq, bids = pic.particles(n, dim, ppc, seed=9, box=box)
    cell = np.floor(x).astype(int)
    inside = np.all([(cell[:, d] >= b.start) & (cell[:, d] < b.stop)
                     for d, b in enumerate(box)], axis=0)
    assert np.array_equal(bids, ids[inside])
    assert np.array_equal(bx, x[inside]) and np.array_equal(bv, v[inside])
    assert np.array_equal(bq, q[inside])
    assert np.array_equal(ids, np.arange(n**dim * ppc))
    assert np.all(np.floor(x).astype(int) == np.repeat(
        np.stack(np.unravel_index(np.arange(n**dim), (n,) * dim), axis=1), ppc, axis=0))
    assert np.all((q < 0) & (q >= -1.5 / ppc))
    assert abs(float(np.std(v)) - 1.0) < 0.1  # Maxwellian, vth = 1


def test_non_finite_position_raises_on_every_rank(comm, monkeypatch):
    """A NaN velocity on rank 0 only: every rank raises after the push, before owner() and
    migrate() (owner() alone would raise on rank 0 and leave the others in migrate())."""
    made = pic.particles

    def particles(*args, **kw):
        x, v, q, ids = made(*args, **kw)
        if comm.rank == 0 and len(v):
            v[0, 0] = np.nan
        return x, v, q, ids

    monkeypatch.setattr(pic, "particles", particles)
    mesh = ps.Mesh(comm, MPI.Compute_dims(comm.size, 2))
    with pytest.raises(FloatingPointError, match="non-finite positions on 1 rank"):
        pic.run(mesh, 8, 2, 1, 2, seed=3)
    mesh.free()


def test_main_checks(comm):
    assert pic.main(["--n", "6", "--dim", "2", "--ppc", "2", "--steps", "1",
                     "--overlap"]) == 0


def test_rebalanced_clustered_run_equals_serial(comm):
    """``--cluster 1.5 --balance 1``: a Gaussian bunch, rebalanced after every step (charge
    redistributed to the new extents, particles migrated to their owners), equals the
    serial run; at P > 1 the first rebalance moves and lowers the imbalance."""
    n, dim, ppc, steps = 8, 2, 4, 2
    mesh = ps.Mesh(comm, MPI.Compute_dims(comm.size, dim))
    res = pic.run(mesh, n, dim, ppc, steps, seed=3, cluster=1.5, balance=1)
    _assert_equal_to_serial(comm, res, pic.serial(n, dim, ppc, steps, seed=3, cluster=1.5),
                            n, steps)
    b = res["balances"][0]
    assert len(res["balances"]) == steps and b.after <= b.before
    if comm.size > 1:
        assert not b.kept and b.after < b.before
    mesh.free()


def test_check_fails_on_a_nan_of_another_rank(comm):
    """A NaN in the last rank's charge only: check() fails on every rank (an MPI MAX
    reduction of the errors dropped it: rho_err came out finite and ok True)."""
    n, ppc = SIZES[2]
    mesh = ps.Mesh(comm, MPI.Compute_dims(comm.size, 2))
    res = pic.run(mesh, n, 2, ppc, 1, seed=3)
    if comm.rank == comm.size - 1 and res["rho"].local.size:
        res["rho"].local.flat[0] = np.nan
    c = pic.check(comm, res, _serial(2, 1, 3), n)
    assert not c["ok"], c
    assert np.isnan(c["rho_err"]), c
    mesh.free()


@pytest.mark.parametrize("argv", [["--ppc", "0"], ["--seed", "-1"], ["--seed", str(2**64)],
                                  ["--balance", "-1"], ["--cluster", "-3"], ["--cluster", "nan"],
                                  ["--steps", "-1"], ["--mesh", "2,2"], ["--mesh", "1x1x1"],
                                  ["--mesh", "3x5"], ["--dt", "nan"], ["--vth", "inf"],
                                  # (one particle per cell: the bunch kept every one)
                                  ["--cluster", "2", "--dim", "3"],
                                  ["--cluster", "2", "--ppc", "1"]])
def test_main_bad_options_are_argparse_errors(comm, capsys, argv):
    with pytest.raises(SystemExit) as e:
        pic.main(["--n", "6", "--steps", "1", *argv])
    assert e.value.code == 2
    assert argv[0] in capsys.readouterr().err
