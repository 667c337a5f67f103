"""An electrostatic particle-in-cell code on a sharded periodic 2-D or 3-D grid: cloud-in-cell
deposit and halo fold, a Poisson solve through pyshard.fft, the field with a halo update,
a leapfrog push, and ``pyshard.migrate`` of the particles that crossed into another box.

    mpiexec -n 4 python examples/pic.py --dim 2 --n 16 --ppc 8 --steps 5 [--overlap]

The grid: n^dim cells of unit size, periodic, cell i at [i, i+1), split over a mesh of the
ranks (``--mesh``, default ``MPI.Compute_dims(P, dim)``) as ``[Shard(0), ..., Shard(k-1)]`` on a
mesh of k <= dim dims (``--mesh 4`` on a 3-D grid: slabs).

The particles (an electron plasma on a neutralising background; units with eps0 = 1,
q/m = -1 and the plasma frequency 1): ``--ppc`` particles per cell, particle ``id = cell *
ppc + j`` for the cells in C order, so the set does not depend on the rank count. Every
random number of a particle is a counter-based hash (splitmix64) of ``(seed, id, stream)``,
vectorised: its offset in its cell (uniform in [0, 1)^dim), its weight w (uniform in
[0.5, 1.5)), its velocity (Maxwellian, ``--vth`` per component, by Box-Muller). Charge
``q = -w / ppc`` and mass ``-q``. Each rank creates only the ids of the cells in its own
box. Each holds the columns ``(x, v, q, ids)``.

One step (dt = ``--dt``):

1. deposit: cloud-in-cell (particle x gives ``prod((1 - f) or f)`` of its charge to each of
   the 2^dim cells ``floor(x) + {0, 1}``, ``f = x - floor(x)``) into a HaloArray of width 1,
   periodic (a particle in the last cell of a box reaches the ghost layer), then
   ``fold("sum")`` adds the ghosts into their owners' cells;
2. Poisson: ``-lap(phi) = rho - mean(rho)`` with the finite-difference Green's function:
   ``phi_hat = rho_hat / K2``, ``K2 = sum_d (2 sin(pi m_d / n))^2`` (the eigenvalues of the
   second-order (2 dim + 1)-point Laplacian), ``phi_hat[0] = 0`` (drops the mean), through
   ``pyshard.fft.plan(layout, "rfftn", placements="any")``: forward, multiply by ``1/K2`` at
   the spectral array's box, backward (a transpose per mesh dim of size > 1 each way);
3. field: ``E_d = -(phi[i + e_d] - phi[i - e_d]) / 2`` on phi with a halo update (width 1,
   periodic), into one array of shape ``(n,)*dim + (dim,)`` whose halo (width 1 on the grid
   axes) is updated in turn;
4. gather: E at each particle with the same cloud-in-cell weights (the cells ``floor(x)``
   and ``floor(x) + 1``: the interior and the upper ghost layer);
5. leapfrog push: ``v += (q/m) E dt``, ``x += v dt``, x wrapped into [0, n) per dim;
6. migrate: ``ps.migrate((x, v, q, ids), ps.owner(x, rho, periodic=True), mesh)``: each
   particle goes to the rank whose box holds its cell; then the next step's deposit.

``--cluster W`` starts a Gaussian bunch of width W cells instead of the uniform plasma, and
``--balance K`` rebalances after every K-th step: ``ps.particle_cost`` (particles per cell),
``ps.balance`` (new extents; kept when the gain is under 2%), the charge redistributed to
them, every grid built on them and the particles migrated to their new owners; the run
prints the imbalance (largest / mean particle count per rank) before and after each.

The deposit of step 1 happens before the loop and at the end of each step, after the
migration. ``--overlap`` starts the migration with ``wait=False`` and deposits the particles
that stay while the rows fly; after ``wait()`` it deposits the arrivals whose cloud reaches a
ghost cell, starts the fold (``start_fold()``) and deposits the other arrivals (interior
cells only) while the fold flies: deposit = staying + arrivals, as without ``--overlap``.

A serial numpy run of the same steps (the whole grid, all particles, numpy.fft) is the
reference: after ``--steps`` steps the positions (periodic distance) and velocities, sorted by
id, agree within 1e-9 of their largest magnitude (n, max |v|): the summation orders differ;
every id is held by exactly one rank; the charge deposited each step equals the particles'
total (1e-12 relative). Prints per step the particles that crossed to another rank (summed
over ranks) and the energy (field ``sum |E|^2 / 2`` plus kinetic ``sum m v^2 / 2``, the
velocities at the half step); exits non-zero when a check fails.
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
import time
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
from mpi4py import MPI

import pyshard as ps
from pyshard import fft as pf
from pyshard.bench.cli import count_arg, shape_arg
from pyshard.collectives import all_true
from pyshard.config import HALO_METHODS

QM = -1.0  # charge / mass of every particle
TOL = 1e-9  # positions and velocities against the serial run, relative to n and max |v|
CHARGE_TOL = 1e-12  # the deposited charge against the particles' total, relative

_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on uint64 (wraps modulo 2^64, as intended)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _uniform(seed: int, ids: np.ndarray, stream: int) -> np.ndarray:
    """Uniform [0, 1) doubles, one per id: a counter-based hash of (seed, id, stream)."""
    key = ids.astype(np.uint64) * np.uint64(64) + np.uint64(stream)
    z = _mix(key + _mix(np.full(1, seed, np.uint64) * np.uint64(0x9E3779B97F4A7C15)))
    return (_mix(z) >> np.uint64(11)).astype(np.float64) * 2.0**-53


def particles(n: int, dim: int, ppc: int, seed: int = 0, vth: float = 1.0,
              box: Optional[Sequence[slice]] = None, cluster: float = 0.0
              ) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The particles of the cells in ``box`` (all cells by default): positions ``(m, dim)``
    in [0, n), velocities ``(m, dim)``, charges ``(m,)`` and ids ``(m,)`` (int64), ids
    increasing. Particle ``id`` lies in cell ``id // ppc`` (C order); its values depend on
    ``(seed, id)`` only. ``cluster > 0``: a Gaussian bunch of that width (cells) at ``n/4`` along
    every axis: cell ``c`` keeps its particles ``j < 1 + floor((ppc - 1) exp(-|c + 1/2 -
    n/4|^2 / (2 cluster^2)))`` (ids keep their values)."""
    box = tuple(box) if box is not None else (slice(0, n),) * dim
    cells = np.stack(np.meshgrid(*[np.arange(b.start, b.stop) for b in box], indexing="ij"),
                     axis=-1).reshape(-1, dim)
    lin = np.ravel_multi_index(tuple(cells.T), (n,) * dim) if len(cells) else np.zeros(0, int)
    ids = (lin[:, None] * ppc + np.arange(ppc)).reshape(-1).astype(np.int64)
    cell = np.repeat(cells, ppc, axis=0).astype(np.float64)
    x = np.empty((len(ids), dim))
    v = np.empty((len(ids), dim))
    for d in range(dim):
        x[:, d] = cell[:, d] + _uniform(seed, ids, d)
        u1 = 1.0 - _uniform(seed, ids, 8 + 2 * d)  # (0, 1]
        u2 = _uniform(seed, ids, 9 + 2 * d)
        v[:, d] = vth * np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)
    x = np.minimum(x, np.nextafter(cell + 1.0, 0.0))  # stays in its cell
    q = -(0.5 + _uniform(seed, ids, 7)) / ppc
    if cluster > 0.0:
        r2 = np.sum((cell + 0.5 - n / 4.0) ** 2, axis=1)
        keep = ids % ppc < 1 + np.floor((ppc - 1) * np.exp(-r2 / (2.0 * cluster**2)))
        return x[keep], v[keep], q[keep], ids[keep]
    return x, v, q, ids


def _corners(x: np.ndarray, origin: Sequence[int], wrap: Optional[Sequence[int]]
             ) -> Iterator[Tuple[Tuple[np.ndarray, ...], np.ndarray]]:
    """Cloud-in-cell: for each of the 2^dim corners, the index tuple of its cell (``cell -
    origin``, modulo ``wrap`` per dim when given) and each particle's weight there."""
    dim = x.shape[1]
    base = np.floor(x).astype(np.int64)
    frac = x - base
    for corner in itertools.product((0, 1), repeat=dim):
        w = np.ones(len(x))
        idx = []
        for d, c in enumerate(corner):
            w *= frac[:, d] if c else 1.0 - frac[:, d]
            i = base[:, d] + c
            if wrap is not None:
                i = np.mod(i, wrap[d])
            idx.append(i - origin[d])
        yield tuple(idx), w


def deposit(grid: np.ndarray, x: np.ndarray, q: np.ndarray, origin: Sequence[int],
            wrap: Optional[Sequence[int]] = None) -> None:
    """Cloud-in-cell: add each particle's charge into the 2^dim cells around it, cell
    ``c`` at ``grid[c - origin]`` (modulo ``wrap`` per dim when given)."""
    if not len(q):
        return
    for idx, w in _corners(x, origin, wrap):
        np.add.at(grid, idx, q * w)


def gather(field: np.ndarray, x: np.ndarray, origin: Sequence[int],
           wrap: Optional[Sequence[int]] = None) -> np.ndarray:
    """Cloud-in-cell interpolation of ``field`` (grid dims, then a component axis) at the
    particles, with :func:`deposit`'s weights: ``(m, components)``."""
    out = np.zeros((len(x), field.shape[-1]))
    if len(x):
        for idx, w in _corners(x, origin, wrap):
            out += w[:, None] * field[idx]
    return out


def wrap_positions(x: np.ndarray, n: int) -> np.ndarray:
    """x modulo n into [0, n) (``np.mod`` of a tiny negative gives n itself: that is 0)."""
    x = np.mod(x, n)
    x[x >= n] = 0.0
    return x


def green(n: int, dim: int, box: Sequence[slice]) -> np.ndarray:
    """``1 / K2`` at the rfftn array's ``box`` (0 at the zero mode), ``K2 = sum_d (2
    sin(pi m_d / n))^2``: the periodic finite-difference Laplacian's eigenvalues (even in
    m_d, so the index serves for the signed wavenumber)."""
    k2 = 0.0
    for d, b in enumerate(box):
        s = (2.0 * np.sin(np.pi * np.arange(b.start, b.stop) / n)) ** 2
        k2 = k2 + s.reshape([-1 if i == d else 1 for i in range(dim)])
    k2 = np.broadcast_to(k2, tuple(b.stop - b.start for b in box))
    with np.errstate(divide="ignore"):
        return np.where(k2 == 0.0, 0.0, 1.0 / np.where(k2 == 0.0, 1.0, k2))


def _grad(p: np.ndarray, dim: int, interior: Optional[Tuple[slice, ...]], out: np.ndarray
          ) -> None:
    """``out[..., d] = -(p[i + e_d] - p[i - e_d]) / 2`` on ``interior`` of the padded ``p``
    (width 1), or, with ``interior=None``, on the whole periodic ``p``."""
    for d in range(dim):
        if interior is None:
            out[..., d] = -(np.roll(p, -1, axis=d) - np.roll(p, 1, axis=d)) / 2.0
        else:
            hi = list(interior)
            lo = list(interior)
            hi[d] = slice(interior[d].start + 1, interior[d].stop + 1)
            lo[d] = slice(interior[d].start - 1, interior[d].stop - 1)
            out[..., d] = -(p[tuple(hi)] - p[tuple(lo)]) / 2.0


def _energy(e: np.ndarray, v: np.ndarray, q: np.ndarray) -> Tuple[float, float]:
    """(field, kinetic) energy of this part: sum |E|^2 / 2 and sum m |v|^2 / 2 (m = q/QM)."""
    return 0.5 * float(np.sum(e * e)), 0.5 * float(np.sum((q / QM) * np.sum(v * v, axis=1)))


def _sum(comm: MPI.Comm, values: List[float]) -> np.ndarray:
    """The sums over the ranks of a few numbers, in one ``MPI_Allreduce``."""
    out = np.empty(len(values))
    comm.Allreduce(np.asarray(values, np.float64), out, op=MPI.SUM)
    return out


def serial(n: int, dim: int, ppc: int, steps: int, dt: float = 0.25, vth: float = 1.0,
           seed: int = 0, cluster: float = 0.0) -> Dict[str, Any]:
    """The same k steps on the whole periodic grid with all particles, serially (numpy,
    numpy.fft): the final ``x, v, q, ids`` (ids increasing), ``rho`` (the last deposit),
    ``energy`` (field, kinetic) and ``charge`` (deposited) per step."""
    shape = (n,) * dim
    zero = (0,) * dim
    x, v, q, ids = particles(n, dim, ppc, seed, vth, cluster=cluster)
    g = green(n, dim, [slice(0, m) for m in shape[:-1] + (n // 2 + 1,)])

    def dep(x: np.ndarray) -> np.ndarray:
        rho = np.zeros(shape)
        deposit(rho, x, q, zero, wrap=shape)
        return rho

    rho = dep(x)
    e = np.empty(shape + (dim,))
    energy, charge = [], [float(rho.sum())]
    for _ in range(steps):
        phi = np.fft.irfftn(np.fft.rfftn(rho) * g, s=shape, axes=tuple(range(dim)))
        _grad(phi, dim, None, e)
        energy.append(_energy(e, v, q))
        v += QM * dt * gather(e, x, zero, wrap=shape)
        x = wrap_positions(x + dt * v, n)
        rho = dep(x)
        charge.append(float(rho.sum()))
    return {"x": x, "v": v, "q": q, "ids": ids, "rho": rho, "energy": energy,
            "charge": charge}


def with_room(cols: Tuple[np.ndarray, ...]) -> Tuple[np.ndarray, ...]:
    """The columns copied into arrays with room for a quarter more rows (and 16): what
    ``migrate(..., inplace=True)`` fills."""
    n = len(cols[0])
    out = []
    for a in cols:
        b = np.empty((n + n // 4 + 16,) + a.shape[1:], a.dtype)
        b[:n] = a
        out.append(b)
    return tuple(out)


def run(mesh: ps.Mesh, n: int, dim: int, ppc: int, steps: int, dt: float = 0.25,
        vth: float = 1.0, seed: int = 0, overlap: bool = False, method: Optional[str] = None,
        cluster: float = 0.0, balance: int = 0, inplace: bool = False) -> Dict[str, Any]:
    """The k steps on the sharded grid. Returns this rank's final ``x, v, q, ids`` (in the
    migrations' order), ``rho`` (the last deposit, a ShardedArray), and the global
    ``crossed`` (particles that changed rank, per step), ``energy`` (field, kinetic per
    step), ``charge`` (deposited, per deposit) and ``total`` (the particles' charge); and
    this rank's ``times`` (seconds per phase, summed over the steps). ``balance=K``: after
    every K-th step, ``ps.particle_cost`` counts the particles per cell, ``ps.balance``
    chooses new extents, and unless it keeps them the charge is redistributed to them and
    the particles migrate to their new owners; ``balances`` lists the ``Balance`` results.
    ``inplace``: the particles live in columns with room (``with_room``), the push writes
    into them and ``migrate(..., inplace=True)`` copies only the particles that leave (the
    blocking migration; ``overlap`` takes precedence)."""
    comm = mesh.comm
    shape = (n,) * dim
    if len(mesh.shape) > dim:
        raise ValueError(f"pic: a {dim}-D grid takes a mesh of at most {dim} dims, got "
                         f"{tuple(mesh.shape)}")
    placements = [ps.Shard(d) for d in range(len(mesh.shape))]  # the first axes

    def grids(sizes: Optional[Dict[int, Tuple[int, ...]]]) -> Tuple[Any, ...]:
        """The layout of these extents and everything built on it."""
        lay = ps.Layout(shape, np.float64, tuple(mesh.shape), placements, sizes)
        box = lay.box(mesh.coords)
        lo = np.array([b.start for b in box])
        hi = np.array([b.stop for b in box])
        rho_h = ps.ShardedArray(np.zeros(lay.local_shape(mesh.coords)), lay, mesh).with_halo(
            1, periodic=True, method=method)
        phi_h = ps.ShardedArray(np.zeros(lay.local_shape(mesh.coords)), lay, mesh).with_halo(
            1, periodic=True, method=method)
        elay = ps.Layout(shape + (dim,), np.float64, tuple(mesh.shape), placements, sizes)
        e_h = ps.ShardedArray(np.zeros(elay.local_shape(mesh.coords)), elay, mesh).with_halo(
            (1,) * dim + (0,), periodic=True, method=method)
        fplan = pf.plan(lay, "rfftn", placements="any")
        g = green(n, dim, fplan.dst.box(mesh.coords))
        inner = tuple(slice(1, 1 + b.stop - b.start) for b in box)
        # origin: the padded arrays' first cell (width 1)
        return lay, box, lo, hi, lo - 1, rho_h, phi_h, e_h, fplan, g, inner

    lay, box, lo, hi, origin, rho_h, phi_h, e_h, fplan, g, inner = grids(None)
    balances: List[Any] = []

    x, v, q, ids = particles(n, dim, ppc, seed, vth, box, cluster)
    store = None
    if inplace and not overlap:  # the columns with room; x, v, q, ids: views of their rows
        store = with_room((x, v, q, ids))
        x, v, q, ids = (a[:len(q)] for a in store)
    total = comm.allreduce(float(q.sum()))
    t = dict.fromkeys(("deposit", "fold", "poisson", "field", "push", "migrate", "balance"), 0.0)

    def clock(key: str, t0: float) -> float:
        t1 = time.perf_counter()
        t[key] += t1 - t0
        return t1

    def fold(t0: float) -> float:
        t0 = clock("deposit", t0)
        rho_h.fold("sum")
        return clock("fold", t0)

    t0 = time.perf_counter()
    rho_h.padded.fill(0.0)
    deposit(rho_h.padded, x, q, origin)
    t0 = fold(t0)
    charge = [comm.allreduce(float(rho_h.interior.sum()))]
    energy: List[Tuple[float, float]] = []
    crossed: List[int] = []
    me = comm.rank
    for step in range(steps):
        t0 = time.perf_counter()
        rho = ps.ShardedArray(np.ascontiguousarray(rho_h.interior), lay, mesh)
        rh = fplan.forward(rho)
        ph = ps.ShardedArray(np.ascontiguousarray(rh.local * g), rh.layout, rh.mesh)
        phi_h.interior[...] = fplan.backward(ph).local
        t0 = clock("poisson", t0)
        phi_h.update()
        _grad(phi_h.padded, dim, inner, e_h.interior)
        e_h.update()
        t0 = clock("field", t0)
        fe, ke = _energy(e_h.interior, v, q)
        if store is not None:  # in place: into the columns migrate() will fill
            v += QM * dt * gather(e_h.padded, x, origin)
            x[...] = wrap_positions(x + dt * v, n)
        else:
            v = v + QM * dt * gather(e_h.padded, x, origin)
            x = wrap_positions(x + dt * v, n)
        # (field, kinetic, ranks with a non-finite position): owner() would raise on those
        # ranks only, and the others would wait in migrate() for them
        sums = _sum(comm, [fe, ke, float(not np.isfinite(x).all())])
        energy.append((float(sums[0]), float(sums[1])))
        if sums[2]:
            raise FloatingPointError(f"pic: non-finite positions on {int(sums[2])} rank(s) "
                                     f"after step {step} (dt {dt} too large?)")
        t0 = clock("push", t0)
        dest = ps.owner(x, rho_h.array, periodic=True)
        rho_h.padded.fill(0.0)
        if overlap:
            pend = ps.migrate((x, v, q, ids), dest, mesh, wait=False)
            t0 = clock("migrate", t0)
            stay = dest == me
            deposit(rho_h.padded, x[stay], q[stay], origin)  # while the rows fly
            t0 = clock("deposit", t0)
            r = pend.wait()
            t0 = clock("migrate", t0)
            x, v, q, ids = r.rows
            off = int(r.counts[:me].sum())
            new = np.ones(len(q), bool)
            new[off:off + int(r.counts[me])] = False  # this rank's own rows: deposited
            # the arrivals whose cloud reaches a ghost cell, then the fold, and the others
            # (interior cells only) while the fold flies
            edge = new & np.any(np.floor(x).astype(np.int64) == hi - 1, axis=1)
            deposit(rho_h.padded, x[edge], q[edge], origin)
            t0 = clock("deposit", t0)
            rho_h.start_fold("sum")
            new &= ~edge
            deposit(rho_h.padded, x[new], q[new], origin)
            rho_h.wait()
            t0 = clock("fold", t0)
        elif store is not None:
            r = ps.migrate(store, dest, mesh, inplace=True)
            t0 = clock("migrate", t0)
            store = r.storage  # the same columns, or new ones where they had no room
            x, v, q, ids = r.rows
            deposit(rho_h.padded, x, q, origin)
            t0 = fold(t0)
        else:
            r = ps.migrate((x, v, q, ids), dest, mesh)
            t0 = clock("migrate", t0)
            x, v, q, ids = r.rows
            deposit(rho_h.padded, x, q, origin)
            t0 = fold(t0)
        sums = _sum(comm, [float(r.n - r.sent[me]), float(rho_h.interior.sum())])
        crossed.append(int(sums[0]))
        charge.append(float(sums[1]))
        if balance and (step + 1) % balance == 0:
            b = ps.balance(ps.particle_cost(x, rho_h.array, periodic=True))
            balances.append(b)
            if not b.kept:  # move the charge to the new extents, the particles to their owners
                rho = rho_h.array.redistribute(b.placements, sizes=b.sizes)
                lay, box, lo, hi, origin, rho_h, phi_h, e_h, fplan, g, inner = grids(b.sizes)
                rho_h.interior[...] = rho.local
                r = ps.migrate((x, v, q, ids), ps.owner(x, rho, periodic=True), mesh)
                x, v, q, ids = r.rows
                if store is not None:
                    store = with_room((x, v, q, ids))
                    x, v, q, ids = (a[:len(q)] for a in store)
            t0 = clock("balance", t0)
    return {"x": x, "v": v, "q": q, "ids": ids, "rho": rho_h.array, "crossed": crossed,
            "energy": energy, "charge": charge, "total": total, "times": t,
            "balances": balances}


def check(comm: MPI.Comm, res: Dict[str, Any], ref: Dict[str, Any], n: int
          ) -> Dict[str, Any]:
    """The parallel result against the serial one (the same on every rank): ``ids_ok`` (each
    id on exactly one rank), ``in_box`` (every particle on the rank that owns its cell),
    ``x_err`` (max periodic distance / n), ``v_err`` (max |dv| / max |v|), ``rho_err`` (the
    last deposit, max |d| / max |rho|), ``charge_err`` (max over the deposits of |deposited -
    total| / |total|), ``ok`` (every rank's verdict and-ed: a NaN anywhere fails it; the
    errors keep a NaN too)."""
    rho = res["rho"]
    dest = ps.owner(res["x"], rho, periodic=True)
    in_box = comm.allreduce(bool(np.all(dest == comm.rank)), op=MPI.LAND)
    parts = comm.allgather((res["ids"], res["x"], res["v"]))
    ids = np.concatenate([p[0] for p in parts])
    order = np.argsort(ids, kind="stable")
    ids = ids[order]
    ids_ok = bool(len(ids) == len(ref["ids"]) and np.array_equal(ids, ref["ids"]))
    x_err = v_err = float("inf")
    if ids_ok:
        x = np.concatenate([p[1] for p in parts])[order]
        v = np.concatenate([p[2] for p in parts])[order]
        dx = np.abs(x - ref["x"])
        dx = np.minimum(dx, n - dx)  # periodic: 1e-17 and n - 1e-17 are neighbours
        x_err = float(dx.max(initial=0.0)) / n
        vmax = max(float(np.abs(ref["v"]).max(initial=0.0)), 1e-300)
        v_err = float(np.abs(v - ref["v"]).max(initial=0.0)) / vmax
    rmax = float(np.max([np.abs(ref["rho"]).max(), 1e-300]))
    my_rho_err = float(np.abs(rho.local - ref["rho"][rho.box]).max(initial=0.0)) / rmax
    # numpy's max over the ranks keeps a NaN (an MPI MAX reduction, or Python's max(), may
    # drop it)
    rho_err = float(np.max(comm.allgather(my_rho_err)))
    tot = abs(res["total"])
    charge_err = float(np.max([abs(c - res["total"]) / tot for c in res["charge"]]
                              + [abs(res["total"] - float(ref["q"].sum())) / tot]))
    mine = (ids_ok and in_box and x_err <= TOL and v_err <= TOL and my_rho_err <= TOL
            and charge_err <= CHARGE_TOL)  # False for a NaN
    ok = all_true(comm, mine)
    return {"ids_ok": ids_ok, "in_box": in_box, "x_err": x_err, "v_err": v_err,
            "rho_err": rho_err, "charge_err": charge_err, "ok": ok}


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=count_arg(1), default=16, help="cells per grid dim (default 16)")
    ap.add_argument("--dim", type=int, default=2, choices=[2, 3])
    ap.add_argument("--ppc", type=count_arg(1), default=None,
                    help="particles per cell (default 8 in 2-D, 1 in 3-D)")
    ap.add_argument("--steps", type=count_arg(0), default=5)
    ap.add_argument("--dt", type=float, default=0.25)
    ap.add_argument("--vth", type=float, default=1.0, help="thermal velocity (cells / time)")
    ap.add_argument("--seed", type=count_arg(0), default=0, help="0 <= seed < 2^64")
    ap.add_argument("--overlap", action="store_true")
    ap.add_argument("--inplace", action="store_true",
                    help="migrate in place (columns with room; only leavers copied)")
    ap.add_argument("--mesh", default=None, type=shape_arg((1, 2, 3)),
                    help="e.g. 2x2: at most --dim dims, the rank count in all "
                    "(default: MPI.Compute_dims)")
    ap.add_argument("--method", default=None, choices=("auto", *HALO_METHODS, "tune"),
                    help="halo method (default: PYSHARD_HALO_METHOD)")
    ap.add_argument("--check", default="yes", choices=["yes", "no"])
    ap.add_argument("--cluster", type=float, default=0.0,
                    help="a Gaussian bunch of this width in cells (default 0: uniform)")
    ap.add_argument("--balance", type=count_arg(0), default=0, metavar="K",
                    help="rebalance every K steps (ps.balance on the particle counts; "
                    "default 0: never)")
    args = ap.parse_args(argv)
    if args.seed >= 2**64:
        ap.error(f"argument --seed: must be below 2^64, got {args.seed}")
    if not (math.isfinite(args.cluster) and args.cluster >= 0.0):
        ap.error(f"argument --cluster: must be a finite width >= 0 (0: uniform), got "
                 f"{args.cluster}")
    for name in ("dt", "vth"):
        if not math.isfinite(getattr(args, name)):
            ap.error(f"argument --{name}: must be finite, got {getattr(args, name)}")
    ppc = args.ppc if args.ppc is not None else (8 if args.dim == 2 else 1)
    if args.cluster > 0.0 and ppc < 2:
        ap.error(f"argument --cluster: the bunch thins each cell's particles, so it needs "
                 f"--ppc 2 or more (got {ppc}{', the 3-D default' if args.ppc is None else ''}"
                 f"): with one particle per cell every cell keeps it, a uniform plasma")
    comm = MPI.COMM_WORLD
    if args.mesh:
        mesh_shape = tuple(int(m) for m in args.mesh.split("x"))
        if len(mesh_shape) > args.dim or math.prod(mesh_shape) != comm.size:
            ap.error(f"argument --mesh: {args.mesh} is not a mesh of at most {args.dim} dims "
                     f"holding the run's {comm.size} ranks")
    else:
        mesh_shape = tuple(MPI.Compute_dims(comm.size, args.dim))
    mesh = ps.Mesh(comm, mesh_shape)
    t0 = time.perf_counter()
    res = run(mesh, args.n, args.dim, ppc, args.steps, args.dt, args.vth, args.seed,
              args.overlap, args.method, args.cluster, args.balance, args.inplace)
    elapsed = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
    times = {k: comm.allreduce(s, op=MPI.MAX) for k, s in res["times"].items()}
    count = comm.allreduce(len(res["ids"]))
    if comm.rank == 0:
        print(f"pic {args.dim}-D, {args.n}^{args.dim} grid, {count} particles, mesh "
              f"{'x'.join(map(str, mesh_shape))}, {args.steps} steps of dt {args.dt} "
              f"({'overlapped' if args.overlap else 'in place' if args.inplace else 'blocking'}"
              f" migration): {elapsed:.3f} s")
        print("  step  crossed  field energy  kinetic energy  total energy")
        for s, (c, (fe, ke)) in enumerate(zip(res["crossed"], res["energy"])):
            print(f"  {s:4d}  {c:7d}  {fe:12.6e}  {ke:14.6e}  {fe + ke:12.6e}")
        for k, b in enumerate(res["balances"]):
            print(f"  rebalance after step {(k + 1) * args.balance - 1}: imbalance "
                  f"{b.before:.3f} -> {b.after:.3f}" + (" (kept)" if b.kept else ""))
        print("  slowest rank's seconds: " + ", ".join(f"{k} {v:.4f}" for k, v in
                                                       times.items()))
    ok = None
    if args.check == "yes":
        ref = serial(args.n, args.dim, ppc, args.steps, args.dt, args.vth, args.seed,
                     args.cluster)
        c = check(comm, res, ref, args.n)
        ok = c["ok"]
        if comm.rank == 0:
            print(f"  serial numpy run: x {c['x_err']:.1e} (of n), v {c['v_err']:.1e} (of max "
                  f"|v|), rho {c['rho_err']:.1e} (tolerance {TOL:g}); every id on one rank: "
                  f"{c['ids_ok']}; every particle in its owner's box: {c['in_box']}; charge "
                  f"{res['total']:.12g} conserved to {c['charge_err']:.1e} "
                  f"(tolerance {CHARGE_TOL:g})")
            fe, ke = ref["energy"][-1] if ref["energy"] else (0.0, 0.0)
            print(f"  serial final energy {fe + ke:.6e}; checks pass: {ok}")
    mesh.free()
    return 0 if ok is not False else 1


if __name__ == "__main__":
    sys.exit(main())
