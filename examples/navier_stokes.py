"""The Taylor-Green vortex: incompressible Navier-Stokes on [0, 2pi)^3, pseudo-spectral with
pyshard.fft (rfftn/irfftn on pencils), RK4 in time, 2/3-rule dealiasing:

    mpiexec -n 4 python -m mpi4py examples/navier_stokes.py --n 32 --steps 10 [--no-check]

u0 = (sin x cos y cos z, -cos x sin y cos z, 0); the nonlinear term in rotational form
u x omega, projected onto divergence-free fields, viscosity ``--nu``. Each step prints the
kinetic energy <|u|^2>/2 and the dissipation nu <|omega|^2> (means over the grid). The same
code runs serially with numpy.fft on the whole grid (:class:`Serial`): by default
(``--check``) it runs both and compares every step's energy and dissipation (relative
difference < 1e-12; they differ by rounding only: the distributed sums add in another order;
a NaN fails it); ``--no-check`` skips the serial run and checks only that the energies are
finite. A run whose
energies are not finite (``--dt`` too large) says so and exits non-zero. The spectral
array's layout is whatever the forward plan ends in (``placements="any"``); its wavenumbers
come from its ``box``, and ``plan.backward`` brings fields back to the physical pencils.
"""

from __future__ import annotations

import argparse
import sys
from math import prod
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np
from mpi4py import MPI

import pyshard as ps
from pyshard import Shard
from pyshard import fft as pf
from pyshard.bench.cli import count_arg, shape_arg
from pyshard.collectives import all_true


class Serial:
    """The whole grid on one process (numpy.fft)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.box = tuple(slice(0, n) for _ in range(3))
        self.kbox = (slice(0, n), slice(0, n), slice(0, n // 2 + 1))

    def fwd(self, u: np.ndarray) -> np.ndarray:
        return np.fft.rfftn(u)

    def bwd(self, uh: np.ndarray) -> np.ndarray:
        return np.fft.irfftn(uh, s=(self.n,) * 3, axes=(0, 1, 2))

    def total(self, v: float) -> float:
        return v


class Distributed:
    """The grid in pencils ``[Shard(0), Shard(1)]`` on a 2-D mesh (pyshard.fft)."""

    def __init__(self, comm: MPI.Comm, n: int, mesh_shape: Optional[Sequence[int]] = None
                 ) -> None:
        self.n = n
        self.comm = comm
        ms = tuple(mesh_shape) if mesh_shape else tuple(MPI.Compute_dims(comm.size, 2))
        self.mesh = ps.Mesh(comm, ms)
        self.layout = ps.Layout((n,) * 3, np.float64, ms, [Shard(0), Shard(1)][: len(ms)])
        self.plan = pf.plan(self.layout, "rfftn", placements="any")
        self.box = self.layout.box(self.mesh.coords)
        self.kbox = self.plan.dst.box(self.mesh.coords)

    def fwd(self, u: np.ndarray) -> np.ndarray:
        return self.plan.forward(ps.ShardedArray(u, self.layout, self.mesh)).local

    def bwd(self, uh: np.ndarray) -> np.ndarray:
        return self.plan.backward(ps.ShardedArray(uh, self.plan.dst, self.mesh)).local

    def total(self, v: float) -> float:
        return self.comm.allreduce(v, op=MPI.SUM)


def _grid(box: Sequence[slice], n: int) -> List[np.ndarray]:
    h = 2 * np.pi / n
    out = []
    for d, s in enumerate(box):
        shape = [1, 1, 1]
        shape[d] = s.stop - s.start
        out.append((np.arange(s.start, s.stop) * h).reshape(shape))
    return out


def _wavenumbers(kbox: Sequence[slice], n: int) -> List[np.ndarray]:
    full = [np.fft.fftfreq(n, 1.0 / n), np.fft.fftfreq(n, 1.0 / n), np.fft.rfftfreq(n, 1.0 / n)]
    out = []
    for d, (k, s) in enumerate(zip(full, kbox)):
        shape = [1, 1, 1]
        shape[d] = s.stop - s.start
        out.append(k[s].reshape(shape))
    return out


def run(ops: Any, steps: int, nu: float, dt: float) -> List[Tuple[float, float]]:
    """(kinetic energy, dissipation) after each of ``steps`` RK4 steps, from the TGV."""
    n = ops.n
    x, y, z = _grid(ops.box, n)
    shp = tuple(s.stop - s.start for s in ops.box)
    u = [np.broadcast_to(np.sin(x) * np.cos(y) * np.cos(z), shp),
         np.broadcast_to(-np.cos(x) * np.sin(y) * np.cos(z), shp), np.zeros(shp)]
    uh = np.stack([ops.fwd(np.ascontiguousarray(c)) for c in u])
    k = _wavenumbers(ops.kbox, n)
    kk = k[0] ** 2 + k[1] ** 2 + k[2] ** 2
    kk_safe = np.where(kk == 0, 1.0, kk)
    cut = n / 3.0  # the 2/3 rule: keep |k_i| < n/3
    dealias = (np.abs(k[0]) < cut) & (np.abs(k[1]) < cut) & (np.abs(k[2]) < cut)

    def curl(vh: np.ndarray) -> List[np.ndarray]:
        return [1j * (k[1] * vh[2] - k[2] * vh[1]), 1j * (k[2] * vh[0] - k[0] * vh[2]),
                1j * (k[0] * vh[1] - k[1] * vh[0])]

    def rhs(vh: np.ndarray) -> np.ndarray:
        v = [ops.bwd(np.ascontiguousarray(c)) for c in vh]
        w = [ops.bwd(np.ascontiguousarray(c)) for c in curl(vh)]
        cross = [v[1] * w[2] - v[2] * w[1], v[2] * w[0] - v[0] * w[2], v[0] * w[1] - v[1] * w[0]]
        nh = np.stack([ops.fwd(np.ascontiguousarray(c)) for c in cross]) * dealias
        div = (k[0] * nh[0] + k[1] * nh[1] + k[2] * nh[2]) / kk_safe
        proj = np.stack([nh[i] - k[i] * div for i in range(3)])
        return proj - nu * kk * vh

    def stats(vh: np.ndarray) -> Tuple[float, float]:
        v = [ops.bwd(np.ascontiguousarray(c)) for c in vh]
        w = [ops.bwd(np.ascontiguousarray(c)) for c in curl(vh)]
        ke = ops.total(float(sum(np.sum(c * c) for c in v))) / (2 * n**3)
        ens = ops.total(float(sum(np.sum(c * c) for c in w))) / n**3
        return ke, nu * ens

    out = []
    for _ in range(steps):
        k1 = rhs(uh)
        k2 = rhs(uh + 0.5 * dt * k1)
        k3 = rhs(uh + 0.5 * dt * k2)
        k4 = rhs(uh + dt * k3)
        uh = uh + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
        out.append(stats(uh))
    return out


def compare(comm: MPI.Comm, n: int = 32, steps: int = 3, nu: float = 0.01, dt: float = 0.02,
            mesh_shape: Optional[Sequence[int]] = None) -> Tuple[list, list, float]:
    """(distributed stats, serial stats, the largest relative difference: NaN where a value
is NaN; 0 where both are 0, e.g. the dissipation at ``nu = 0``)."""
    d = Distributed(comm, n, mesh_shape)
    try:
        got = run(d, steps, nu, dt)
    finally:
        d.mesh.free()
    ref = run(Serial(n), steps, nu, dt)
    return got, ref, rel_diff(got, ref)


def rel_diff(got: list, ref: list) -> float:
    """The largest ``|a - b| / |b|`` over the pairs (0 where a == b, NaN kept: numpy's max,
    not Python's, which drops a NaN)."""
    a, b = np.asarray(got, float).ravel(), np.asarray(ref, float).ravel()
    with np.errstate(divide="ignore", invalid="ignore"):
        d = np.where(a == b, 0.0, np.abs(a - b) / np.abs(b))
    return float(np.max(d, initial=0.0))


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=count_arg(2), default=32, help="grid points per dim (>= 2)")
    ap.add_argument("--steps", type=count_arg(1), default=10)
    ap.add_argument("--nu", type=float, default=0.01)
    ap.add_argument("--dt", type=float, default=0.02)
    ap.add_argument("--mesh", default=None, type=shape_arg((1, 2)),
                    help="P or P0xP1, the rank count in all (default: MPI.Compute_dims, 2-D)")
    ap.add_argument("--check", action=argparse.BooleanOptionalAction, default=True,
                    help="also run serially and compare each step's energy and dissipation "
                    "(default; --no-check: only that they are finite)")
    args = ap.parse_args(argv)
    comm = MPI.COMM_WORLD
    ms = tuple(int(v) for v in args.mesh.split("x")) if args.mesh else None
    if ms and prod(ms) != comm.size:
        ap.error(f"argument --mesh: {args.mesh} holds {prod(ms)} ranks, the run has "
                 f"{comm.size}")
    if args.check:
        got, ref, diff = compare(comm, args.n, args.steps, args.nu, args.dt, ms)
    else:
        d = Distributed(comm, args.n, ms)
        got, ref, diff = run(d, args.steps, args.nu, args.dt), None, 0.0
        d.mesh.free()
    if comm.rank == 0:
        print(f"Taylor-Green vortex {args.n}^3, nu {args.nu}, dt {args.dt}, {comm.size} ranks")
        for i, (ke, eps) in enumerate(got):
            print(f"  step {i + 1:3d}: kinetic energy {ke:.12f}  dissipation {eps:.12f}")
        if ref is not None:
            print(f"  serial numpy run: max relative difference {diff:.1e}")
    finite = bool(np.all(np.isfinite(got)))
    ok = all_true(comm, finite and diff < 1e-12)  # False for a NaN difference
    if comm.rank == 0 and not finite:
        print(f"  FAILED: non-finite energies (dt {args.dt} too large?)", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
