"""The 2-D heat equation under ``jax.jit`` on an uneven decomposition, and its gradient.

Each rank holds a block of the grid (rows split unevenly over a 1-D mesh, or rows and columns
over a 2-D mesh: uneven shards, even empty ones, are just per-rank local shapes). A time loop
runs under ``jax.lax.scan`` inside ``jax.jit``: every step pads the block with one ghost cell
a side from its neighbours (``pyshard.jax.halo_pad``, periodic in x, zero Dirichlet in y) and
applies the 5-point stencil. Then ``jax.grad`` of the final state's weighted energy with
respect to the initial state runs backwards through every step: the halo's VJP is the fold,
ghost-cell cotangents summed into their owners.

Both are checked against the same program run by one process on the whole grid.

    mpiexec -n 4 python examples/jax_heat.py --n 96 --steps 50
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
from mpi4py import MPI

import pyshard as ps
import pyshard.jax as psj
from pyshard import Shard
from pyshard.bench.cli import count_arg
from pyshard.collectives import all_true

TOL = 1e-12  # state and gradient against the serial run

jax.config.update("jax_enable_x64", True)


def initial(n: int) -> np.ndarray:
    y, x = np.meshgrid(np.linspace(0, 1, n), np.linspace(0, 1, n), indexing="ij")
    return np.exp(-40 * ((x - 0.3) ** 2 + (y - 0.6) ** 2)) + 0.5 * np.sin(2 * np.pi * x) * y


def uneven(n: int, parts: int) -> list:
    """A deliberately uneven split of n (the first shard twice the others; empty ones when
    n is small)."""
    w = np.array([2.0] + [1.0] * (parts - 1))
    cuts = np.floor(np.cumsum(w) / w.sum() * n).astype(int)
    return list(np.diff(np.concatenate([[0], cuts])))


def stencil(p: jnp.ndarray, nu: float) -> jnp.ndarray:
    """One explicit step from a padded block."""
    c = p[1:-1, 1:-1]
    return c + nu * (p[:-2, 1:-1] + p[2:, 1:-1] + p[1:-1, :-2] + p[1:-1, 2:] - 4 * c)


def serial_pad(u: jnp.ndarray) -> jnp.ndarray:
    return jnp.pad(jnp.pad(u, ((0, 0), (1, 1)), mode="wrap"), ((1, 1), (0, 0)))


def run(comm: MPI.Comm, n: int = 48, steps: int = 20, mesh_ndim: int = 1,
        nu: float = 0.2) -> dict:  # fmt: skip
    """Run the distributed and the serial program; returns the largest differences (over
    the ranks, a NaN kept) and ``ok``: every rank's within ``TOL`` (False for a NaN)."""
    if mesh_ndim == 1:
        mesh = ps.Mesh(comm, (comm.size,))
        pl, sizes = [Shard(0)], {0: uneven(n, comm.size)}
    else:
        dims = MPI.Compute_dims(comm.size, 2)
        mesh = ps.Mesh(comm, tuple(dims))
        pl, sizes = [Shard(0), Shard(1)], {0: uneven(n, dims[0]), 1: uneven(n, dims[1])}
    g = initial(n)
    w = np.cos(np.linspace(0, 3, n))[:, None] * np.ones((1, n))  # the energy's weights
    u0 = psj.distribute(g, mesh, pl, sizes)
    box = u0.layout.box(mesh.coords)
    wl = jnp.asarray(w[box])

    def evolve(local: jnp.ndarray) -> jnp.ndarray:
        def step(u: jnp.ndarray, _: None) -> tuple:
            p = psj.halo_pad(psj.Sharded(u, u0.layout, mesh), 1, periodic=(False, True))
            return stencil(p, nu), None

        return jax.lax.scan(step, local, None, length=steps)[0]

    def energy(local: jnp.ndarray) -> jnp.ndarray:
        u = evolve(local)
        return jnp.sum(wl * u * u)  # this rank's part; the loss is the sum over ranks

    t0 = time.perf_counter()
    final = jax.jit(evolve)(u0.local).block_until_ready()
    t1 = time.perf_counter()
    grad = jax.jit(jax.grad(energy))(u0.local).block_until_ready()
    t2 = time.perf_counter()

    def serial_evolve(u: jnp.ndarray) -> jnp.ndarray:
        def step(u: jnp.ndarray, _: None) -> tuple:
            return stencil(serial_pad(u), nu), None

        return jax.lax.scan(step, u, None, length=steps)[0]

    ref = jax.jit(serial_evolve)(jnp.asarray(g))
    ref_grad = jax.grad(lambda u: jnp.sum(jnp.asarray(w) * serial_evolve(u) ** 2))(jnp.asarray(g))
    d_state = float(np.max(np.abs(np.asarray(final) - np.asarray(ref)[box]), initial=0.0))
    d_grad = float(np.max(np.abs(np.asarray(grad) - np.asarray(ref_grad)[box]), initial=0.0))
    out = {
        "ranks": comm.size, "mesh": tuple(mesh.shape), "n": n, "steps": steps,
        "local_shape": tuple(u0.local.shape),
        # numpy's max over the ranks keeps a NaN (an MPI MAX reduction may drop it)
        "max_diff_state": float(np.max(comm.allgather(d_state))),
        "max_diff_grad": float(np.max(comm.allgather(d_grad))),
        "ok": all_true(comm, d_state < TOL and d_grad < TOL),
        "seconds_evolve": comm.allreduce(t1 - t0, op=MPI.MAX),
        "seconds_grad": comm.allreduce(t2 - t1, op=MPI.MAX),
    }
    mesh.free()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=count_arg(1), default=96)
    ap.add_argument("--steps", type=count_arg(0), default=50)
    ap.add_argument("--mesh-ndim", type=int, default=1, choices=(1, 2))
    a = ap.parse_args()
    comm = MPI.COMM_WORLD
    r = run(comm, a.n, a.steps, a.mesh_ndim)
    gathered = comm.gather(r["local_shape"])
    if comm.rank == 0:
        print(f"heat {a.n}x{a.n}, {a.steps} steps, {comm.size} ranks, mesh {r['mesh']}, "
              f"local blocks {gathered}")
        print(f"  state vs serial: max |diff| {r['max_diff_state']:.2e}   "
              f"(compile + run {r['seconds_evolve']:.2f} s)")
        print(f"  grad  vs serial: max |diff| {r['max_diff_grad']:.2e}   "
              f"(compile + run {r['seconds_grad']:.2f} s)")
        print("matches the serial run" if r["ok"] else "DIFFERS from the serial run")
    raise SystemExit(0 if r["ok"] else 1)


if __name__ == "__main__":
    main()
