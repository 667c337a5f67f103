"""pyshard.torch on CUDA tensors (moved through DLPack / cupy): redistribute chains and
halo_pad, forward and backward, bit for bit equal to the same run on CPU tensors in the same
test (tests/mpi/test_torch_grad.py checks the CPU run against global torch autograd), the
results and gradients on the tensors' own CUDA device. Skipped without a GPU, torch or a
CUDA torch.

Data are random but quantized (multiples of 1/64, |v| <= 4; small integers for bfloat16), so
the sums a Partial source reduces are exact whatever order the host or the GPU adds them in.
"""

from __future__ import annotations

import random

import pytest
from gpu_helpers import DTYPES, skip_reason

import pyshard as ps
from pyshard import Partial, Replicate, Shard

if skip_reason():
    pytest.skip(skip_reason(), allow_module_level=True)
cp = pytest.importorskip("cupy")
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("pyshard.torch GPU tests: torch.cuda.is_available() is False",
                allow_module_level=True)  # fmt: skip

from test_torch_grad import (  # noqa: E402
    SHAPES,
    all_meshes,
    global_tensor,
    halo_cases,
    local_op,
    random_cases,
    source,
    tdtype,
)

import pyshard.torch as pst  # noqa: E402

pytestmark = pytest.mark.mpi

R, P = Replicate(), Partial("sum")
CUDA = torch.device("cuda", torch.cuda.current_device())


def qdata(shape, dtype, seed):
    """Seeded random values (the same on every rank), multiples of 1/64 in [-4, 4]."""
    gen = torch.Generator().manual_seed(seed)
    v = torch.randn(tuple(shape), generator=gen, dtype=torch.float64)
    return (torch.round(v * 64) / 64).clamp(-4, 4).to(tdtype(dtype))


def chain(mesh, shape, dtype, src, hops, device, seed, data=qdata, step=True):
    """The chain of redistributes ``src -> hops`` on tensors on ``device``; returns (each
    hop's result, the source leaf after loss.backward())."""
    pl0, sz0 = src
    pdims = [m for m, p in enumerate(pl0) if isinstance(p, Partial)]
    nq = 1
    for m in pdims:
        nq *= mesh.shape[m]
    parts = torch.stack([data(shape, dtype, seed + 5 * k) for k in range(nq)]).to(device)
    x, leaf, _ = source(parts, "sum", mesh, pl0, sz0, dtype)
    assert x.local.device == device
    w = data(shape, dtype, seed + 1000).to(device)
    outs, cur = [], x
    for pl, sz in hops:
        cur = pst.redistribute(cur, pl, sz)
        outs.append(cur.local.detach())
        if step and not any(isinstance(p, Partial) for p in pl):
            cur = pst.ShardedTensor(local_op(cur.local), cur.layout, cur.mesh)
    yl = cur.local
    linear = any(isinstance(p, Partial) for p in cur.placements)
    (w[cur.box] * (yl if linear else yl * yl)).sum().backward()
    return outs, leaf


def compare(case, gpu, cpu, failures):
    """GPU run against CPU run: every forward result and the gradient, bit for bit, on the
    leaf's CUDA device."""
    (gouts, gleaf), (couts, cleaf) = gpu, cpu
    for k, (g, c) in enumerate(zip(gouts, couts)):
        if g.device != gleaf.device or g.dtype != c.dtype or not torch.equal(g.cpu(), c):
            failures.append(f"forward hop {k} {case}: {g} vs {c}")
            return
    gg, cg = gleaf.grad, cleaf.grad
    if gg is None or gg.device != gleaf.device or gg.dtype != cg.dtype:
        failures.append(f"grad {case}: {gg} (want on {gleaf.device}, {cg.dtype})")
    elif not torch.equal(gg.cpu(), cg):
        failures.append(f"grad {case}: {gg} vs {cg}")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_torch_gpu_chains_match_cpu(comm, transport, dtype):
    """Random sources (Shard, Replicate, Partial(sum), uneven and empty shards) through one to
    three random hops, on the CPU test's 1-D to 3-D meshes: CUDA equal to CPU."""
    failures = []
    for mesh_shape in all_meshes(comm.size):
        mesh = ps.Mesh(comm, mesh_shape)
        rng = random.Random(21 + len(mesh_shape))  # the same on every rank
        for k, (shape, src, hops) in enumerate(random_cases(rng, mesh_shape, SHAPES, 5)):
            gpu = chain(mesh, shape, dtype, src, hops, CUDA, seed=k)
            cpu = chain(mesh, shape, dtype, src, hops, torch.device("cpu"), seed=k)
            compare(f"{mesh_shape} {shape} {src} -> {hops}", gpu, cpu, failures)
        mesh.free()
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:5])


def halo_run(mesh, case, dtype, device, rank):
    shape, pl, sizes, width, periodic, corners = case
    g = qdata(shape, dtype, 3).to(device)
    x, leaf, _ = source(g[None], "sum", mesh, pl, sizes, dtype)
    pad = pst.halo_pad(x, width, periodic, corners)
    wr = qdata(tuple(pad.shape), dtype, 200 + rank).to(device)  # differs per rank
    (wr * pad * pad).sum().backward()
    return [pad.detach()], leaf


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_torch_gpu_halo_pad_matches_cpu(comm, transport, dtype):
    """halo_pad (a halo update through the CUDA pack kernel) and its backward (a fold of the
    gradient) on CUDA tensors: padded values and gradient equal to the CPU run's."""
    failures = []
    for mesh_shape in all_meshes(comm.size):
        mesh = ps.Mesh(comm, mesh_shape)
        rng = random.Random(31 + len(mesh_shape))
        for case in halo_cases(rng, mesh_shape, 4):
            gpu = halo_run(mesh, case, dtype, CUDA, comm.rank)
            cpu = halo_run(mesh, case, dtype, torch.device("cpu"), comm.rank)
            compare(f"{mesh_shape} {case}", gpu, cpu, failures)
        mesh.free()
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:5])


def test_torch_gpu_bfloat16_matches_cpu(comm, transport):
    """bfloat16 CUDA tensors (DLPack's kDLBfloat, retagged to words for cupy) through one
    redistribute: the docs' table on a 1-D mesh and random changes on the other meshes; small
    integers, exact in bfloat16."""
    pytest.importorskip("ml_dtypes")
    if "bfloat16" not in DTYPES:
        pytest.skip("this cupy cannot hold bfloat16 arrays (cupy >= 14 with ml_dtypes)")
    n = comm.size
    cases = [((2 * n + 1, 3), (src, None), [(dst, None)]) for src, dst in [
        ([Shard(0)], [Shard(1)]), ([Shard(0)], [R]), ([R], [Shard(0)]), ([P], [R]),
        ([P], [Shard(0)]), ([R], [P]), ([Shard(0)], [P]),
    ]]  # fmt: skip
    failures = []
    for mesh_shape in all_meshes(n):
        mesh = ps.Mesh(comm, mesh_shape)
        rng = random.Random(41 + len(mesh_shape))
        mine = cases if mesh_shape == (n,) else [
            (shape, src, hops[:1]) for shape, src, hops in random_cases(rng, mesh_shape, SHAPES, 3)
        ]  # fmt: skip
        for k, (shape, src, hops) in enumerate(mine):
            runs = [chain(mesh, shape, "bfloat16", src, hops, dev, seed=k, data=global_tensor,
                          step=False) for dev in (CUDA, torch.device("cpu"))]  # fmt: skip
            assert runs[0][0][0].dtype == torch.bfloat16
            compare(f"{mesh_shape} {shape} {src} -> {hops}", runs[0], runs[1], failures)
        mesh.free()
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:5])
