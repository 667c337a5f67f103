"""A spectral diffusion solve under ``jax.jit`` on an uneven mesh, and ``jax.grad`` through it.

Each step takes the 3-D real field to Fourier space with ``pyshard.jax.rfftn`` (``jnp.fft``
along the axes a rank holds whole, one transpose per sharded axis), multiplies by the exact
diffusion factor ``exp(-nu |k|^2 dt)`` on the rank's block of wavenumbers (the result's
layout says which), and comes back with ``irfftn`` to the input's uneven layout. ``jax.grad``
of a weighted energy of the final field with respect to the initial one runs backwards
through every transform and transpose. Both are checked against the same program run by one
process with ``jnp.fft``.

    mpiexec -n 4 python examples/jax_spectral.py --n 32 --steps 4
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from mpi4py import MPI

import pyshard as ps
import pyshard.jax as psj
from pyshard import Shard
from pyshard.bench.cli import count_arg
from pyshard.collectives import all_true

TOL = 1e-10  # state and gradient against the serial run
MIN_N = 3  # the grid is n x (n + 2) x (n - 2): no empty axis

jax.config.update("jax_enable_x64", True)


def uneven(n: int, parts: int) -> list:
    w = np.array([2.0] + [1.0] * (parts - 1))
    cuts = np.floor(np.cumsum(w) / w.sum() * n).astype(int)
    return list(np.diff(np.concatenate([[0], cuts])))


def decay(shape: tuple, box: tuple, nu: float, dt: float) -> np.ndarray:
    """exp(-nu |k|^2 dt) on the block ``box`` of rfftn's output of a real ``shape`` array."""
    ks = [np.fft.fftfreq(n, 1.0 / n) for n in shape[:-1]] + [np.fft.rfftfreq(shape[-1],
                                                                             1.0 / shape[-1])]
    grids = np.meshgrid(*[k[b] for k, b in zip(ks, box)], indexing="ij")
    return np.exp(-nu * dt * sum(k * k for k in grids) * (2 * np.pi / shape[0]) ** 2)


def run(comm: MPI.Comm, n: int = 16, steps: int = 3, nu: float = 0.05,
        dt: float = 0.5) -> dict:  # fmt: skip
    """Run the distributed and the serial program on an ``n x (n + 2) x (n - 2)`` grid
    (``n >= MIN_N``); returns the largest differences (over the ranks, a NaN kept) and
    ``ok``: every rank's within ``TOL`` (False for a NaN)."""
    if n < MIN_N:
        raise ValueError(f"jax_spectral: n must be at least {MIN_N} (the grid is n x (n + 2) "
                         f"x (n - 2)), got {n}")
    shape = (n, n + 2, n - 2)
    dims = MPI.Compute_dims(comm.size, 2)
    mesh = ps.Mesh(comm, tuple(dims))
    pl, sizes = [Shard(0), Shard(1)], {0: uneven(shape[0], dims[0]), 1: uneven(shape[1], dims[1])}
    rng = np.random.default_rng(1)
    g = rng.standard_normal(shape)
    w = rng.random(shape)
    u0 = psj.distribute(g, mesh, pl, sizes)
    box = u0.layout.box(mesh.coords)
    wl = jnp.asarray(w[box])
    spec = jax.eval_shape(lambda u: psj.rfftn(u, placements="any"), u0)  # the spectral layout
    f = jnp.asarray(decay(shape, spec.layout.box(mesh.coords), nu, dt))

    def evolve(local: jnp.ndarray) -> jnp.ndarray:
        u = psj.Sharded(local, u0.layout, mesh)
        for _ in range(steps):
            uh = psj.rfftn(u, placements="any")
            uh = psj.Sharded(uh.local * f, uh.layout, mesh)
            u = psj.irfftn(uh, s=shape, placements=pl, sizes=sizes)
        return u.local

    def energy(local: jnp.ndarray) -> jnp.ndarray:
        v = evolve(local)
        return jnp.sum(wl * v * v)

    final = jax.jit(evolve)(u0.local)
    grad = jax.jit(jax.grad(energy))(u0.local)

    F = jnp.asarray(decay(shape, tuple(slice(None) for _ in shape), nu, dt))

    def serial_evolve(u: jnp.ndarray) -> jnp.ndarray:
        for _ in range(steps):
            u = jnp.fft.irfftn(jnp.fft.rfftn(u) * F, s=shape)
        return u

    ref = serial_evolve(jnp.asarray(g))
    ref_grad = jax.grad(lambda u: jnp.sum(jnp.asarray(w) * serial_evolve(u) ** 2))(jnp.asarray(g))
    d_state = float(np.max(np.abs(np.asarray(final) - np.asarray(ref)[box]), initial=0.0))
    d_grad = float(np.max(np.abs(np.asarray(grad) - np.asarray(ref_grad)[box]), initial=0.0))
    out = {
        "ranks": comm.size, "mesh": tuple(mesh.shape), "shape": shape,
        "spectral_placements": str(spec.layout.placements),
        # numpy's max over the ranks keeps a NaN (an MPI MAX reduction may drop it)
        "max_diff_state": float(np.max(comm.allgather(d_state))),
        "max_diff_grad": float(np.max(comm.allgather(d_grad))),
        "ok": all_true(comm, d_state < TOL and d_grad < TOL),
    }
    mesh.free()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=count_arg(MIN_N), default=32,
                    help=f"the grid is n x (n + 2) x (n - 2) (default 32, at least {MIN_N})")
    ap.add_argument("--steps", type=count_arg(0), default=4)
    a = ap.parse_args()
    comm = MPI.COMM_WORLD
    r = run(comm, a.n, a.steps)
    ok = r["ok"]
    if comm.rank == 0:
        print(f"spectral diffusion {r['shape']}, {a.steps} steps, {comm.size} ranks, mesh "
              f"{r['mesh']}, spectral layout {r['spectral_placements']}")
        print(f"  state vs serial: max |diff| {r['max_diff_state']:.2e}")
        print(f"  grad  vs serial: max |diff| {r['max_diff_grad']:.2e}")
        print("matches the serial run" if ok else "DIFFERS from the serial run")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
