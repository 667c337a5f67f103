"""torch bfloat16 and float8 tensors in and out through DLPack, at any size: the
steps of examples/torch_bf16.py (distribute, transpose, gather, reduce from Partial("sum"),
save and load into other layouts), each checked against torch on rank 0; and float8 tensors
in and out without a copy.

CI runs it: requirements/dev.txt pins torch (``torch==2.13.0``, whose CPU build the CI
machines' local wheel directory holds; PyPI's own Linux wheel is the CUDA build, about 0.55 GB
plus about 2.2 GB of NVIDIA libraries). Skipped where torch is not installed; by hand:
``mpiexec -n 4 python -m pytest tests/mpi/test_torch_dtypes.py --with-mpi``.
"""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest
from test_checkpoint import shared_dir  # noqa: F401 - a fixture

import pyshard as ps
from pyshard import Partial, Shard

pytest.importorskip("ml_dtypes", reason="ml_dtypes (the extra pyshard[ml]) not installed")
torch = pytest.importorskip(
    "torch", reason="torch is not installed (requirements/dev.txt pins its CPU build for CI)"
)

pytestmark = [pytest.mark.mpi, pytest.mark.numerics]  # numerics: not rerun per MPI library

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "torch_bf16.py")


def load_example():
    spec = importlib.util.spec_from_file_location("torch_bf16", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_torch_bfloat16_end_to_end(comm, shared_dir):  # noqa: F811 - the fixture
    rows = load_example().run(comm, os.path.join(shared_dir, "ckpt"))
    if comm.rank == 0:
        print(f"\n[torch {torch.__version__}, {comm.size} rank(s)]")
        for what, ok, detail in rows:
            print(f"  {what:42s} {'ok' if ok else 'FAILED'}  {detail}")
    assert len(rows) == 5 and all(ok for _, ok, _ in rows), rows


@pytest.mark.parametrize("tdt", ["float8_e4m3fn", "float8_e5m2"])
def test_torch_float8_in_and_out(comm, tdt):
    mesh = ps.Mesh(comm, (comm.size,))
    t = torch.linspace(-3, 3, 7 * 5).reshape(7, 5).to(getattr(torch, tdt))
    x = ps.distribute(t, mesh, [Shard(0)])
    assert x.dtype == np.dtype(tdt)
    full = x.redistribute([Shard(1)]).full()
    back = torch.from_dlpack(ps.to_dlpack(full))
    assert back.dtype == t.dtype and back.data_ptr() == full.ctypes.data
    assert torch.equal(back.view(torch.uint8), t.view(torch.uint8))
    # a reduction: float32 sum rounded once, as torch rounds float32 to float8 (to nearest even)
    part = ps.from_local(t, mesh, [Partial("sum")], global_shape=tuple(t.shape)).full()
    want = (t.float() * comm.size).to(t.dtype)
    got = torch.from_dlpack(ps.to_dlpack(part))
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    # and through pyshard.torch (its results from numpy arrays: float8_e5m2 is kind "f" in
    # ml_dtypes, and torch.from_numpy refused it)
    import pyshard.torch as pst

    y = pst.distribute(t, mesh, [Shard(0)])
    start, stop = y.layout.box(mesh.coords)[0].start, y.layout.box(mesh.coords)[0].stop
    assert y.local.dtype == t.dtype and torch.equal(y.local.view(torch.uint8),
                                                    t[start:stop].view(torch.uint8))
    z = y.redistribute([Shard(1)]).full()
    assert z.dtype == t.dtype and torch.equal(z.view(torch.uint8), t.view(torch.uint8))
    padded = y.halo_pad(1, periodic=True)
    rows = [r % 7 for r in range(start - 1, stop + 1)]  # (both dims periodic, width 1)
    cols = [c % 5 for c in range(-1, 6)]
    assert torch.equal(padded.view(torch.uint8), t[rows][:, cols].view(torch.uint8))


def test_host_numpy_does_not_export_bfloat16():
    """Why results go back through pyshard.to_dlpack on the host: numpy refuses to export an
    ml_dtypes array over DLPack (the docs say so; this notices the day it stops)."""
    a = np.zeros(3, np.dtype("bfloat16"))
    with pytest.raises(BufferError):
        torch.from_dlpack(a)
    assert torch.from_dlpack(ps.to_dlpack(a)).dtype == torch.bfloat16
