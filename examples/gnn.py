"""Full-graph training of a two-layer graph convolutional network (GCN) on a partitioned random
graph, with pyshard.torch.gather and pyshard.torch.scatter; after a few optimizer steps the
loss and the weights equal a single-process torch model's.

    mpiexec -n 4 python examples/gnn.py --nodes 200 --steps 5 [--split uneven|balanced]

The graph: a stochastic block model (``--blocks`` groups of nodes, an edge inside a group with
probability ``--p-in``, between groups ``--p-out``), its nodes numbered at random. Each node's
features are its group's mean (random) plus noise; its label is its group; about half the
nodes are the training set. The model (Kipf and Welling's GCN, float64):

    H = relu(Â X W1 + b1),  logits = Â H W2 + b2,  Â = D^-1/2 (A + I) D^-1/2,

and the loss is the cross entropy over the training nodes (their mean). Every rank builds the
same graph (it is small) and keeps its rows: the nodes are split with uneven counts
(``--split uneven``: rank ``r`` in proportion to ``1 + r % 3``, the middle rank none when
P > 2) and each rank holds its nodes' features, labels and rows of Â.

The two propagations, the two ways an index exchange runs:

- layer 1 pulls: ``X W1`` is computed on the owned rows; :func:`pyshard.torch.gather` reads
  the rows of every column of this rank's rows of Â (one plan, built once: the neighbours,
  ghosts included), and each row sums its neighbours' rows times Â's entries
  (``index_add``). Its backward scatters the gradients of the ghost rows back to their owners.
- layer 2 pushes: each owned node j sends ``Â_ij (H W2)_j`` to each neighbour i (Â is
  symmetric: the entries of j's own row), :func:`pyshard.torch.scatter` adds the messages into
  their owners' rows (one plan over the entries' columns, duplicates combined before they are
  sent). Its backward gathers the gradient of each neighbour's row.

The weights are replicated; each enters the graph through ``redistribute([Replicate()],
grad_placements=[Partial()])`` (identity forward, the ranks' gradients summed backward), and
the loss is the ``[Partial()] -> [Replicate()]`` sum of the ranks' parts, so
``loss.backward()`` on every rank gives every rank the whole gradient, and an optimizer step
(SGD with momentum) keeps the weights the same everywhere.

The check (``--check yes``, the default): per step the loss, and after the steps every
weight, equal the single-process model's (dense Â, the same initial weights and optimizer)
to 1e-10; only the order of the sums differs. Prints the loss per step, the time per step
(slowest rank) and the check; exits non-zero when it fails.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, Dict, List, Optional

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F
from mpi4py import MPI

import pyshard as ps
import pyshard.torch as pst
from pyshard import Partial, Replicate, Shard
from pyshard.bench.cli import count_arg
from pyshard.collectives import all_true, allgather_rows, max_all

TOL = 1e-10  # loss and weights against the single-process model (float64)


def sbm_graph(nodes: int, blocks: int, p_in: float, p_out: float, features: int,
              seed: int = 0) -> Dict[str, Any]:
    """A stochastic block model, nodes numbered at random: ``a_hat`` (Â as scipy CSR,
    indices sorted), ``x`` (features), ``y`` (labels: the blocks) and ``train`` (a mask)."""
    rng = np.random.default_rng([seed, nodes, blocks])
    block = rng.permutation(np.arange(nodes) * blocks // nodes)
    p = np.where(block[:, None] == block[None, :], p_in, p_out)
    upper = np.triu(rng.random((nodes, nodes)) < p, 1)
    a = sp.csr_matrix((upper | upper.T).astype(np.float64)) + sp.identity(nodes, format="csr")
    d = 1.0 / np.sqrt(np.asarray(a.sum(axis=1)).ravel())
    a_hat = sp.csr_matrix(sp.diags(d) @ a @ sp.diags(d))
    a_hat.sort_indices()
    means = rng.standard_normal((blocks, features))
    x = means[block] + 1.5 * rng.standard_normal((nodes, features))
    train = rng.random(nodes) < 0.5
    return {"a_hat": a_hat, "x": x, "y": block.astype(np.int64), "train": train}


class NoTrainingNodes(ValueError):
    """The graph's training mask is empty (too few nodes)."""


def row_sizes(n: int, P: int, split: str = "uneven") -> Optional[List[int]]:
    """Nodes per rank: ``uneven`` (in proportion to ``1 + r % 3``; the middle rank none when
    P > 2) or ``balanced`` (None: pyshard's split)."""
    if split == "balanced":
        return None
    if split != "uneven":
        raise ValueError(f"gnn: split must be 'uneven' or 'balanced', got {split!r}")
    w = np.array([1.0 + r % 3 for r in range(P)])
    if P > 2:
        w[P // 2] = 0.0
    cuts = np.rint(n * np.cumsum(w) / w.sum()).astype(np.int64)
    return [int(s) for s in np.diff(np.concatenate(([0], cuts)))]


class GCN(torch.nn.Module):
    """Two graph convolutions: ``relu(Â X W1 + b1)``, then ``Â H W2 + b2``."""

    def __init__(self, features: int, hidden: int, classes: int, seed: int = 0) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        dt = torch.float64
        self.w1 = torch.nn.Parameter(torch.randn(features, hidden, generator=g, dtype=dt)
                                     / features**0.5)
        self.b1 = torch.nn.Parameter(torch.zeros(hidden, dtype=dt))
        self.w2 = torch.nn.Parameter(torch.randn(hidden, classes, generator=g, dtype=dt)
                                     / hidden**0.5)
        self.b2 = torch.nn.Parameter(torch.zeros(classes, dtype=dt))

    def forward(self, a: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The single-process model on the whole graph (``a``: Â, dense)."""
        h = torch.relu(a @ (x @ self.w1) + self.b1)
        return a @ (h @ self.w2) + self.b2


class Partitioned:
    """This rank's nodes of the graph and the two plans of the propagations."""

    def __init__(self, graph: Dict[str, Any], mesh: ps.Mesh, sizes: Optional[List[int]]
                 ) -> None:
        a = graph["a_hat"]
        n = a.shape[0]
        self.mesh, self.n = mesh, n
        self.sizes = None if sizes is None else {0: sizes}
        lay = ps.Layout((n,), np.float64, mesh.shape, [Shard(0)], self.sizes)
        self.box = lay.box(mesh.coords)[0]
        local = a[self.box]
        like = ps.ShardedArray.wrap(np.zeros(local.shape[0]), lay, mesh)
        rows = np.repeat(np.arange(local.shape[0]), np.diff(local.indptr))
        self.rows = torch.from_numpy(rows)  # each entry's local row
        self.weights = torch.from_numpy(local.data.copy())[:, None]  # Â's entries
        # layer 1 (pull): each distinct column of this rank's rows, once
        self.pull, slot = ps.csr_plan(local.indices, like=like)
        self.slot = torch.from_numpy(slot)
        # layer 2 (push): one message per entry (j, i) of the owned rows j, to row i
        self.push = ps.gather_plan(local.indices, like=like)
        self.x = torch.from_numpy(np.ascontiguousarray(graph["x"][self.box]))
        self.y = torch.from_numpy(graph["y"][self.box])
        self.train = torch.from_numpy(graph["train"][self.box])
        self.n_train = int(graph["train"].sum())

    def propagate_pull(self, hw: torch.Tensor) -> torch.Tensor:
        """This rank's rows of ``Â (HW)``: the neighbours' rows gathered, then summed."""
        t = pst.from_local(hw, self.mesh, [Shard(0)], global_shape=(self.n, hw.shape[1]),
                           sizes=self.sizes)
        z = pst.gather(t, self.pull)
        out = torch.zeros_like(hw)
        return out.index_add(0, self.rows, self.weights * z[self.slot])

    def propagate_push(self, hw: torch.Tensor) -> torch.Tensor:
        """This rank's rows of ``Â (HW)``: every owned row's messages scattered to their
        neighbours' owners and added there."""
        return pst.scatter(self.weights * hw[self.rows], self.push).local


def replicated(p: torch.Tensor, mesh: ps.Mesh) -> torch.Tensor:
    """``p`` itself forward; backward, the sum of every rank's gradient (one Allreduce)."""
    rep = pst.from_local(p, mesh, [Replicate()], global_shape=tuple(p.shape))
    return pst.redistribute(rep, [Replicate()], grad_placements=[Partial()]).local


def sharded_loss(net: GCN, part: Partitioned) -> torch.Tensor:
    """The model on this rank's nodes; the loss summed over the ranks (on every rank)."""
    mesh = part.mesh
    w1, b1, w2, b2 = (replicated(p, mesh) for p in (net.w1, net.b1, net.w2, net.b2))
    h = torch.relu(part.propagate_pull(part.x @ w1) + b1)
    logits = part.propagate_push(h @ w2) + b2
    mine = F.cross_entropy(logits[part.train], part.y[part.train], reduction="sum")
    loss = pst.from_local((mine / part.n_train).reshape(1), mesh, [Partial()],
                          global_shape=(1,))
    return pst.redistribute(loss, [Replicate()]).local[0]


def run(mesh: ps.Mesh, nodes: int = 200, blocks: int = 4, p_in: float = 0.1,
        p_out: float = 0.01, features: int = 8, hidden: int = 16, steps: int = 5,
        lr: float = 0.2, split: str = "uneven", seed: int = 0, check: bool = True
        ) -> Dict[str, Any]:
    """Train the partitioned model (and, with ``check``, the single-process one) for
    ``steps`` steps. Returns the losses, the time per step (slowest rank), and with
    ``check`` the serial losses, ``loss_err``, ``weight_err`` (largest over the ranks),
    ``across_ranks`` (the weights' largest difference from rank 0's) and ``ok``."""
    comm = mesh.comm
    graph = sbm_graph(nodes, blocks, p_in, p_out, features, seed)
    if not graph["train"].any():  # the same graph on every rank: every rank raises
        raise NoTrainingNodes(f"no training node among the {nodes} nodes (seed {seed}): the "
                              f"loss would be 0/0; take more --nodes")
    part = Partitioned(graph, mesh, row_sizes(nodes, mesh.size, split))
    net = GCN(features, hidden, blocks, seed)
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    losses = []
    t0 = time.perf_counter()
    for _ in range(steps):
        opt.zero_grad()
        loss = sharded_loss(net, part)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    per_step = max_all(comm, (time.perf_counter() - t0) / max(steps, 1))
    out: Dict[str, Any] = {"losses": losses, "step_s": per_step,
                           "edges": int((graph["a_hat"].nnz - nodes) // 2),
                           "sizes": [int(s) for s in part.pull.layout.table[0][1]]}
    if not check:
        return out
    ref = GCN(features, hidden, blocks, seed)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=lr, momentum=0.9)
    a = torch.from_numpy(graph["a_hat"].toarray())
    x, y = torch.from_numpy(graph["x"]), torch.from_numpy(graph["y"])
    train = torch.from_numpy(graph["train"])
    ref_losses = []
    for _ in range(steps):
        opt_ref.zero_grad()
        loss = F.cross_entropy(ref(a, x)[train], y[train])
        loss.backward()
        opt_ref.step()
        ref_losses.append(float(loss.detach()))
    # numpy's max keeps a NaN (Python's max() and an MPI MAX reduction may drop it)
    loss_err = float(np.max(np.abs(np.subtract(losses, ref_losses)), initial=0.0))
    weight_err = float(np.max([float((p - q).detach().abs().max())
                               for p, q in zip(net.parameters(), ref.parameters())]))
    flat = torch.cat([p.detach().reshape(-1) for p in net.parameters()]).numpy()
    every = allgather_rows(comm, flat)
    out.update({"serial_losses": ref_losses, "loss_err": float(np.max(comm.allgather(loss_err))),
                "weight_err": float(np.max(comm.allgather(weight_err))),
                "across_ranks": float(np.abs(every - every[0]).max()),
                "ok": all_true(comm, loss_err <= TOL and weight_err <= TOL)})
    return out


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=count_arg(1), default=200)
    ap.add_argument("--blocks", type=count_arg(1), default=4,
                    help="groups, and classes (default 4)")
    ap.add_argument("--p-in", type=float, default=0.1)
    ap.add_argument("--p-out", type=float, default=0.01)
    ap.add_argument("--features", type=count_arg(1), default=8)
    ap.add_argument("--hidden", type=count_arg(1), default=16)
    ap.add_argument("--steps", type=count_arg(1), default=5)
    ap.add_argument("--lr", type=float, default=0.2)
    ap.add_argument("--split", default="uneven", choices=["uneven", "balanced"])
    ap.add_argument("--seed", type=count_arg(0), default=0)
    ap.add_argument("--check", default="yes", choices=["yes", "no"])
    args = ap.parse_args(argv)
    comm = MPI.COMM_WORLD
    mesh = ps.Mesh(comm, (comm.size,))
    try:
        r = run(mesh, args.nodes, args.blocks, args.p_in, args.p_out, args.features,
                args.hidden, args.steps, args.lr, args.split, args.seed, args.check == "yes")
    except NoTrainingNodes as e:
        mesh.free()
        ap.error(f"argument --nodes: {e}")
    if comm.rank == 0:
        print(f"gnn: two-layer GCN on a {args.blocks}-block random graph, {args.nodes} nodes, "
              f"{r['edges']} edges, on {comm.size} rank(s), nodes {r['sizes']}: "
              f"{r['step_s'] * 1e3:.2f} ms per step (slowest rank)")
        ref = r.get("serial_losses", [None] * len(r["losses"]))
        for s, (loss, want) in enumerate(zip(r["losses"], ref)):
            tail = "" if want is None else f"  (single process {want:.12f})"
            print(f"  step {s}: loss {loss:.12f}{tail}")
        if "ok" in r:
            print(f"  against the single-process model: loss {r['loss_err']:.1e}, weights "
                  f"{r['weight_err']:.1e} (tolerance {TOL:g}); across ranks "
                  f"{r['across_ranks']:.1e}; checks pass: {r['ok']}")
    mesh.free()
    return 0 if r.get("ok", True) else 1


if __name__ == "__main__":
    sys.exit(main())
