"""examples/torch_domain_parallel.py at a small size: domain-parallel SGD steps of a conv net
(halo_pad before each convolution, a Partial -> Replicate pooling) end with the parameters
of a single-process run, on 1-D and 2-D meshes, with the gradients summed by autograd
(grad_placements) or by MPI_Allreduce; without the sum they do not."""

from __future__ import annotations

import importlib.util
import os

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.mpi, pytest.mark.numerics]  # numerics: not rerun per MPI library

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples",
                       "torch_domain_parallel.py")  # fmt: skip


def load_example():
    spec = importlib.util.spec_from_file_location("torch_domain_parallel", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("mesh_ndim,sync,dtype", [
    (1, "pyshard", "float64"), (2, "pyshard", "float64"), (2, "allreduce", "float64"),
    (2, "pyshard", "float32"),
])  # fmt: skip
def test_domain_parallel_training_matches_one_process(comm, mesh_ndim, sync, dtype):
    ex = load_example()
    r = ex.run(comm, mesh_ndim=mesh_ndim, steps=2, size=2 * comm.size + 2, batch=2, sync=sync,
               dtype=dtype)  # fmt: skip
    assert r["max_diff"] <= r["tol"], r
    assert r["across_ranks"] == 0.0, r


def test_without_the_gradient_sum_it_drifts(comm):
    if comm.size == 1:
        pytest.skip("one rank holds every pixel")
    r = load_example().run(comm, mesh_ndim=1, steps=2, size=2 * comm.size + 2, batch=2,
                           sync="none")  # fmt: skip
    assert r["max_diff"] > 1e-6, r


def test_main_prints_one_line(comm, capsys):
    assert load_example().main(["--steps", "1", "--size", str(comm.size + 3)]) == 0
    out = capsys.readouterr().out
    assert comm.rank != 0 or "ok" in out


@pytest.mark.parametrize("mesh_ndim", [1, 2])
def test_an_empty_block_matches_one_process(comm, mesh_ndim):
    """Fewer image rows than ranks along the mesh: a rank holds an empty block (its padded
    block, 2 rows, is too small for conv2d). It runs no convolution but joins every
    collective; the parameters still equal the single-process run's (it hung: the empty
    rank raised alone and the others waited for it)."""
    if comm.size == 1:
        pytest.skip("one rank holds every pixel")
    ex = load_example()
    rows = ex.mesh_shape(comm.size, mesh_ndim)[0]
    r = ex.run(comm, mesh_ndim=mesh_ndim, steps=2, size=rows - 1 if rows > 1 else 1,
               batch=2)  # fmt: skip
    assert r["max_diff"] <= r["tol"], r
    assert r["across_ranks"] == 0.0, r


@pytest.mark.parametrize("argv", [["--steps", "0"], ["--size", "0"], ["--size", "x"]])
def test_bad_options_are_argparse_errors(comm, argv, capsys):
    with pytest.raises(SystemExit) as e:
        load_example().main(argv)
    assert e.value.code == 2
    assert argv[0] in capsys.readouterr().err
