"""pyshard.jax on a GPU: the local arrays are JAX arrays on the CUDA device, and every
collective step and halo update runs through the ``pyshard_step`` custom call registered for
the CUDA platform (the core's pack kernels on XLA's stream, then MPI, staged or CUDA-aware),
switched on by PYSHARD_JAX_CUDA (experimental: docs/jax.md).

The value tests are tests/mpi/test_jax.py's own, run here with JAX's default device a GPU
(they build their arrays with ``jnp.asarray``): redistributes of random uneven layouts
(Partial sources among them) against numpy, the adjoint dot product of a redistribute, the
gradient against the serial program's, two independent collectives in one ``jit``, ``vmap``,
``lax.scan``, the FFTs, and halo folds (``fold`` against numpy's accumulation and its adjoint
dot product, ``jax.grad`` through ``halo_pad`` against the serial gradient: the fold's
combine runs in the core's combine kernel on the GPU). Added here: halo updates against
numpy's padded blocks, and that results stay on the GPU and that the program calls
pyshard_step. Skipped without a GPU, without pyshard's CUDA core or without a JAX with a CUDA
backend."""

from __future__ import annotations

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # ranks share one GPU

import random  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from gpu_helpers import skip_reason  # noqa: E402

import pyshard as ps  # noqa: E402
from pyshard import Shard, _core  # noqa: E402

if skip_reason():
    pytest.skip(skip_reason(), allow_module_level=True)
jax = pytest.importorskip("jax")
psj = pytest.importorskip("pyshard.jax")
if jax.default_backend() != "gpu":
    pytest.skip(f"JAX's default backend is {jax.default_backend()}, not a GPU",
                allow_module_level=True)

from test_jax import (  # noqa: E402, F401 - the value tests, collected here on the GPU
    agree,
    global_array,
    halo_cases,
    meshes,
    padded_reference,
    sharded,
    test_fft_matches_numpy,
    test_gradient_equals_the_serial_gradient,
    test_halo_pad_gradient_is_fold,
    test_halo_pad_values_and_fold_adjoint,
    test_redistribute_adjoint_dot_product,
    test_redistribute_matches_numpy,
    test_scan_loop,
    test_two_independent_collectives_in_one_jit_keep_their_order,
    test_vmap_adds_a_leading_unsharded_dim,
)

pytestmark = [pytest.mark.mpi, pytest.mark.jax]


@pytest.fixture(autouse=True)
def _cuda_lowering():
    """The CUDA registration is experimental: on for these tests (PYSHARD_JAX_CUDA)."""
    with ps.config.override(PYSHARD_JAX_CUDA=True):
        yield


def on_gpu(a):
    return all(d.platform == "gpu" for d in a.devices())


def test_results_stay_on_the_gpu_and_call_the_custom_call(comm):
    """A redistribute's and a halo's results are JAX arrays on the GPU, the compiled
    program calls pyshard_step, and the values equal numpy's."""
    mesh = ps.Mesh(comm, (comm.size,))
    g = global_array((3 * comm.size + 2, 7), "float32", 1)
    x = psj.distribute(g, mesh, [Shard(0)])
    assert on_gpu(x.local)
    f = jax.jit(lambda x: psj.redistribute(x, [Shard(1)]))
    if comm.size > 1:
        assert "pyshard_step" in f.lower(x).as_text()
    y = f(x)
    assert on_gpu(y.local)
    np.testing.assert_array_equal(np.asarray(y.local), g[y.layout.box(mesh.coords)])
    h = jax.jit(lambda x: psj.halo_pad(x, 1, periodic=True))
    assert "pyshard_step" in h.lower(x).as_text()
    p = h(x)
    assert on_gpu(p)
    box = x.layout.box(mesh.coords)
    want = padded_reference(g, [b.start for b in box], [b.stop for b in box], (1, 1),
                            (True, True), True)
    np.testing.assert_array_equal(np.asarray(p), want)
    mesh.free()


@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
def test_halo_pad_values_on_the_gpu(comm, dtype):
    """halo_pad under jit on the GPU is the padded numpy block, on 1-D and 2-D meshes with
    uneven shards, periodic and not, with and without corners."""
    failures = []
    for ms in meshes(comm.size):
        mesh = ps.Mesh(comm, ms)
        rng = random.Random(13 + len(ms))
        for shape, pl, sizes, width, periodic, corners in halo_cases(rng, ms, 4):
            if any(w > 0 and p and s > shape[d] for d, (w, p, s) in
                   enumerate(zip(width, periodic, shape))):
                continue
            g = global_array(shape, dtype, 3)
            x, _ = sharded(g[None], mesh, pl, sizes)
            box = x.layout.box(mesh.coords)
            pad = jax.jit(lambda x, a=(width, periodic, corners): psj.halo_pad(x, *a))(x)
            want = padded_reference(g, [b.start for b in box], [b.stop for b in box], width,
                                    periodic, corners)
            if not on_gpu(pad) or not np.array_equal(np.asarray(pad).astype(np.float64),
                                                     want.astype(np.float64)):
                failures.append(f"{ms} {shape} {pl} {sizes} w{width} p{periodic} c{corners}")
        mesh.free()
    agree(comm, failures)


def test_zz_handler_calls_never_overlap(comm):
    """Run last: no two calls of the CUDA handler ran at once in this process (two steps in
    flight together could each meet the other's messages; the handler counts them)."""
    info = _core.jax_last_cuda_call()
    failures = []
    if info["overlaps"]:
        failures.append(f"rank {comm.rank}: {info['overlaps']} of {info['calls']} calls began "
                        f"while another ran (threads {info['tids']})")
    agree(comm, failures)
