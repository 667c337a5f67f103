"""Domain-parallel training of a small 2-D conv net with pyshard.torch: each rank holds a
spatial block of every image, and after a few SGD steps the parameters equal a
single-process run of the same model.

    mpiexec -n 4 python -m mpi4py examples/torch_domain_parallel.py [--mesh-ndim 2]
        [--steps 3] [--size 16] [--sync pyshard|allreduce] [--dtype float64|float32]

(``python -m mpi4py``: an uncaught exception on one rank aborts the whole job instead of
leaving the others waiting.)

The images ``(batch, channels, H, W)`` lie on a 1-D mesh as ``[Shard(2)]`` (row blocks) or
on a 2-D mesh as ``[Shard(2), Shard(3)]`` (tiles). Each 3x3 convolution runs on this rank's
block padded by :func:`pyshard.torch.halo_pad` (one ghost row/column from each neighbour,
zeros at the image's border: the same as the single-process model's ``padding=1``) with
``padding=0``. A rank whose block is empty (fewer image rows or columns than mesh ranks
along that dim) still joins every collective (the halo exchanges, the pooling, the
gradient sums) but runs no convolution: its output is the empty block, tied to the
parameters so that their backward runs there too. The global average pooling sums this
rank's pixels, a ``[Partial("sum")] -> [Replicate()]`` redistribute adds the ranks' sums
(one Allreduce), and the head and the loss then run, replicated, on every rank.
``loss.backward()`` on every rank runs the adjoints: the gradient of the replicated pooled
value reaches every rank's partial sum unchanged, each halo_pad's backward folds the ghost
cells' gradients into their owners.

The parameters are replicated, but each rank's convolutions saw only its own block: their
gradients must be summed over the ranks (the head's are already whole on every rank: it ran
on replicated values). ``--sync allreduce`` does that after ``backward()`` with one
``MPI_Allreduce`` per parameter (mpi4py); ``--sync pyshard`` (the default) lets autograd do
it: each convolution parameter enters the graph through
``redistribute([Replicate()], grad_placements=[Partial("sum")])`` (the identity forward;
its backward sums the ranks' gradients, one Allreduce each).

Tolerance: the parameters after the steps equal the single-process run's to 1e-12 (float64)
or 1e-5 (float32) in the largest absolute difference (only the order of the sums differs),
and are bit for bit the same on every rank.
"""

from __future__ import annotations

import argparse
import sys
from typing import Dict, List, Optional, Sequence

import torch
import torch.nn.functional as F
from mpi4py import MPI

import pyshard as ps
import pyshard.torch as pst
from pyshard import Partial, Replicate, Shard
from pyshard.bench.cli import count_arg

TOL = {"float64": 1e-12, "float32": 1e-5}


class Net(torch.nn.Module):
    """conv 3x3 -> tanh -> conv 3x3 -> tanh -> global average pool -> linear."""

    def __init__(self, channels: int = 4) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, channels, 3)
        self.conv2 = torch.nn.Conv2d(channels, channels, 3)
        self.head = torch.nn.Linear(channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The single-process model on whole images (zero padding 1)."""
        h = torch.tanh(F.conv2d(x, self.conv1.weight, self.conv1.bias, padding=1))
        h = torch.tanh(F.conv2d(h, self.conv2.weight, self.conv2.bias, padding=1))
        return self.head(h.mean(dim=(2, 3)))


def mesh_shape(p: int, ndim: int) -> tuple:
    if ndim == 1:
        return (p,)
    a = max(d for d in range(1, int(p**0.5) + 1) if p % d == 0)
    return (a, p // a)


def sharded_forward(net: Net, x: pst.ShardedTensor, sync: str) -> torch.Tensor:
    """The same model on this rank's block ``x`` (batch, channels, h, w)."""
    mesh, nd = x.mesh, x.mesh.ndim

    def param(p: torch.Tensor) -> torch.Tensor:
        if sync != "pyshard":
            return p
        # identity forward; backward: the sum of every rank's gradient (one Allreduce)
        rep = pst.from_local(p, mesh, [Replicate()] * nd, global_shape=tuple(p.shape))
        return pst.redistribute(rep, [Replicate()] * nd, grad_placements=[Partial()] * nd).local

    def conv(h: pst.ShardedTensor, layer: torch.nn.Conv2d) -> pst.ShardedTensor:
        padded = pst.halo_pad(h, (0, 0, 1, 1))  # ghosts from the neighbours, zeros at the border
        weight, bias = param(layer.weight), param(layer.bias)
        if h.local.shape[2] and h.local.shape[3]:
            out = torch.tanh(F.conv2d(padded, weight, bias))
        else:  # an empty block: conv2d refuses a padded block of 2 rows (or columns);
            # the empty output, still in the graph (halo_pad's and param's backward are
            # collective: this rank must run them too)
            inner = padded[:, :, 1:-1, 1:-1]  # (batch, in, h, w), h or w zero
            out = torch.tanh(torch.einsum("bihw,oi->bohw", inner, weight.sum(dim=(2, 3)))
                             + bias[None, :, None, None])
        shape = (h.global_shape[0], out.shape[1], *h.global_shape[2:])
        return pst.from_local(out, mesh, h.placements, global_shape=shape, sizes=h.layout.sizes)

    h = conv(conv(x, net.conv1), net.conv2)
    area = h.global_shape[2] * h.global_shape[3]
    part = pst.from_local(h.local.sum(dim=(2, 3)), mesh, [Partial()] * nd,
                          global_shape=tuple(h.global_shape[:2]))  # fmt: skip
    pooled = pst.redistribute(part, [Replicate()] * nd).local / area  # one Allreduce
    return net.head(pooled)


def run(
    comm: MPI.Comm,
    mesh_ndim: int = 2,
    steps: int = 3,
    size: int = 16,
    batch: int = 4,
    sync: str = "pyshard",
    dtype: str = "float64",
    lr: float = 0.1,
) -> Dict[str, float]:
    """Train both ways; return the largest parameter difference from the single-process
    run (on this rank) and across ranks (the same on every rank)."""
    tdt = getattr(torch, dtype)
    mesh = ps.Mesh(comm, mesh_shape(comm.size, mesh_ndim))
    placements = [Shard(2), Shard(3)][:mesh_ndim]
    gen = torch.Generator().manual_seed(7)
    images = torch.randn(steps, batch, 1, size, size + 3, generator=gen, dtype=tdt)
    targets = torch.randn(steps, batch, 1, generator=gen, dtype=tdt)

    def model() -> Net:
        torch.manual_seed(3)
        return Net().to(tdt)

    ref, net = model(), model()
    opt_ref = torch.optim.SGD(ref.parameters(), lr=lr)
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    losses: List[float] = []
    for s in range(steps):
        # single process, whole images
        opt_ref.zero_grad()
        F.mse_loss(ref(images[s]), targets[s]).backward()
        opt_ref.step()
        # domain parallel: this rank's block of the images (no gradient: data)
        opt.zero_grad()
        x = pst.distribute(images[s], mesh, [*placements])
        loss = F.mse_loss(sharded_forward(net, x, sync), targets[s])
        loss.backward()
        if sync == "allreduce":  # the convolutions' gradients: sum over the ranks
            for layer in (net.conv1, net.conv2):
                for p in layer.parameters():
                    comm.Allreduce(MPI.IN_PLACE, p.grad.numpy(), op=MPI.SUM)
        opt.step()
        losses.append(loss.item())
    # torch's max keeps a NaN (Python's max() and an MPI MAX reduction may drop it)
    diff = float(torch.stack([(a.detach() - b.detach()).abs().max()
                              for a, b in zip(net.parameters(), ref.parameters())]).max())
    flat = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
    root = flat.clone()
    comm.Bcast(root.numpy(), root=0)
    # the largest over the ranks, NaN kept (an MPI MAX reduction may drop a NaN)
    spread = float(torch.tensor(comm.allgather(float((flat - root).abs().max()))).max())
    return {"max_diff": diff, "across_ranks": spread, "tol": TOL[dtype], "loss": losses[-1]}


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mesh-ndim", type=int, choices=(1, 2), default=2)
    ap.add_argument("--steps", type=count_arg(1), default=3, help="SGD steps (>= 1)")
    ap.add_argument("--size", type=count_arg(1), default=16,
                    help="image height (width: size + 3); a rank may get an empty block")
    ap.add_argument("--sync", choices=("pyshard", "allreduce"), default="pyshard")
    ap.add_argument("--dtype", choices=tuple(TOL), default="float64")
    args = ap.parse_args(argv)
    comm = MPI.COMM_WORLD
    r = run(comm, args.mesh_ndim, args.steps, args.size, sync=args.sync, dtype=args.dtype)
    ok = r["max_diff"] <= r["tol"] and r["across_ranks"] == 0.0
    ok = comm.allreduce(int(ok), op=MPI.MIN) == 1
    if comm.rank == 0:
        print(f"{comm.size} rank(s), mesh {mesh_shape(comm.size, args.mesh_ndim)}, "
              f"{args.steps} SGD steps, sync={args.sync}, {args.dtype}: last loss "
              f"{r['loss']:.6f}; parameters vs single process: max |diff| {r['max_diff']:.2e} "
              f"(tolerance {r['tol']:.0e}), across ranks {r['across_ranks']:.1e}: "
              f"{'ok' if ok else 'FAILED'}")  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
