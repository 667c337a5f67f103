"""A sparse matrix-vector product and a conjugate-gradient solve on a row-partitioned sparse
matrix, its ghost columns read through a pyshard gather plan.

    mpiexec -n 4 python examples/spmv.py --m 40 [--split uneven|balanced] [--rtol 1e-8]

The matrix: the finite-element (P1) Laplacian of an unstructured 2-D triangle mesh, the
Delaunay triangulation of an ``m x m`` grid of points in the unit square, each interior point
moved at random by up to 0.3 of the spacing; the boundary points are held at zero (Dirichlet:
their rows and columns dropped), so the matrix of the ``(m - 2)^2`` interior points is
symmetric positive definite. The interior points are numbered in a random order (``--seed``),
as a mesh generator or a graph would number them: a rank's rows then need columns from all
over the index space. Every rank builds the same matrix (it is small) and keeps its rows.

The rows are split over the ranks with uneven counts (``--split uneven``, the default: rank
``r`` gets a share in proportion to ``1 + r % 3``, and with more than two ranks the middle
rank gets none) or pyshard's balanced split. Each rank's rows, in CSR, name the global columns
they touch: :func:`pyshard.csr_plan` builds one gather plan for them (once), and
relabels the columns to the positions of the gathered vector. Then ``y = A x`` is
``local_rows @ plan.gather(x)``: the ghost entries of ``x`` arrive in one message from each
rank that owns some (from a rank of the same node, through node-shared memory instead: no
message), this rank's own are copied, no collective runs.

Conjugate gradient (no preconditioner, ``x0 = 0``, stop when ``||r|| < rtol ||b||``, as
``scipy.sparse.linalg.cg`` does) runs on the distributed vectors: one gather per iteration and
two global dot products, each an Allgather of this rank's partial sum added in rank order
(the same bits on every rank, so every rank takes the same branch).

``--check yes`` (the default) compares with ``scipy.sparse`` serially: the product to 1e-14
relative (the same sums in the same order: the local rows keep scipy's entry order), the
iteration count equal to ``scipy.sparse.linalg.cg``'s and the solution to 1e-10 relative
("matches scipy"; scipy's own convergence does not enter it). Apart from that, the solve
must converge (``||r|| < rtol ||b||`` within ``--maxiter`` iterations). Prints the matrix, the
plan (ghost rows, messages), the time per product and per iteration (slowest rank), whether
CG converged and the check; exits non-zero when CG did not converge or a check fails.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla
from mpi4py import MPI
from scipy.spatial import Delaunay

import pyshard as ps
from pyshard import Shard
from pyshard.bench.cli import count_arg
from pyshard.collectives import all_true, allgather_rows, max_all

SPMV_TOL = 1e-14  # the product against scipy's, relative to max |y|
SOLUTION_TOL = 1e-10  # the CG solution against scipy's cg, relative (2-norm)


def laplacian(m: int, seed: int = 0) -> sp.csr_matrix:
    """The P1 finite-element Laplacian (stiffness matrix) of the Delaunay triangulation of a
    jittered ``m x m`` grid in the unit square, boundary points dropped (Dirichlet), the
    ``(m - 2)^2`` interior points numbered in a random order: CSR, indices sorted."""
    if m < 3:
        raise ValueError(f"spmv: m must be at least 3 (one interior point), got {m}")
    rng = np.random.default_rng([seed, m])
    h = 1.0 / (m - 1)
    i, j = np.meshgrid(np.arange(m), np.arange(m), indexing="ij")
    pts = np.stack([i.ravel() * h, j.ravel() * h], axis=1)
    inner = ((i > 0) & (i < m - 1) & (j > 0) & (j < m - 1)).ravel()
    pts[inner] += rng.uniform(-0.3 * h, 0.3 * h, size=(int(inner.sum()), 2))
    tri = Delaunay(pts).simplices
    p = pts[tri]  # (triangles, 3 corners, 2)
    b = np.stack([p[:, 1, 1] - p[:, 2, 1], p[:, 2, 1] - p[:, 0, 1], p[:, 0, 1] - p[:, 1, 1]], 1)
    c = np.stack([p[:, 2, 0] - p[:, 1, 0], p[:, 0, 0] - p[:, 2, 0], p[:, 1, 0] - p[:, 0, 0]], 1)
    area = 0.5 * np.abs(b[:, 0] * c[:, 1] - b[:, 1] * c[:, 0])
    ke = (b[:, :, None] * b[:, None, :] + c[:, :, None] * c[:, None, :]) / (4 * area[:, None, None])
    n = m * m
    rows = np.repeat(tri, 3, axis=1).ravel()
    cols = np.tile(tri, (1, 3)).ravel()
    k = sp.coo_matrix((ke.ravel(), (rows, cols)), shape=(n, n)).tocsr()
    keep = np.flatnonzero(inner)
    a = k[keep][:, keep]
    perm = rng.permutation(len(keep))  # row i of the result is interior point perm[i]
    a = sp.csr_matrix(a[perm][:, perm])
    a.sort_indices()
    return a


def row_sizes(n: int, P: int, split: str = "uneven") -> Optional[List[int]]:
    """Rows per rank: ``uneven`` (in proportion to ``1 + r % 3``; the middle rank none when
    P > 2) or ``balanced`` (None: pyshard's split)."""
    if split == "balanced":
        return None
    if split != "uneven":
        raise ValueError(f"spmv: split must be 'uneven' or 'balanced', got {split!r}")
    w = np.array([1.0 + r % 3 for r in range(P)])
    if P > 2:
        w[P // 2] = 0.0
    cuts = np.rint(n * np.cumsum(w) / w.sum()).astype(np.int64)
    return [int(s) for s in np.diff(np.concatenate(([0], cuts)))]


class DistMatrix:
    """This rank's rows of a square sparse matrix and the plan that reads their columns."""

    def __init__(self, a: sp.csr_matrix, mesh: ps.Mesh, sizes: Optional[List[int]]) -> None:
        n = a.shape[0]
        self.mesh = mesh
        self.layout = ps.Layout((n,), np.float64, mesh.shape, [Shard(0)],
                                None if sizes is None else {0: sizes})
        self.box = self.layout.box(mesh.coords)[0]
        like = ps.ShardedArray.wrap(np.zeros(self.box.stop - self.box.start), self.layout, mesh)
        self.plan, self.local = ps.csr_plan(a[self.box], like)

    def vector(self, local: np.ndarray) -> ps.ShardedArray:
        """This rank's entries as a distributed vector of the matrix's rows."""
        return ps.ShardedArray.wrap(np.ascontiguousarray(local), self.layout, self.mesh)

    def matvec(self, x: np.ndarray) -> np.ndarray:
        """This rank's rows of ``A x`` (``x``: this rank's entries)."""
        return self.local @ self.plan.gather(self.vector(x))


def global_sum(mesh: ps.Mesh, value: float) -> float:
    """The sum over the ranks of one number: every rank's, in rank order (the same bits
    everywhere)."""
    return float(np.sum(allgather_rows(mesh.comm, np.array([value], np.float64))[:, 0]))


def cg(a: DistMatrix, b: np.ndarray, rtol: float, maxiter: int
       ) -> Tuple[np.ndarray, int, float]:
    """Conjugate gradient from zero, scipy's iteration: this rank's part of the solution, the
    iterations, and the final residual norm."""
    mesh = a.mesh
    x = np.zeros_like(b)
    r = b.copy()
    atol = rtol * np.sqrt(global_sum(mesh, float(b @ b)))
    p = np.zeros_like(b)
    rho_prev = 1.0
    it = 0
    rr = global_sum(mesh, float(r @ r))
    while np.sqrt(rr) >= atol and it < maxiter:
        if it:
            p *= rr / rho_prev
            p += r
        else:
            p[:] = r
        q = a.matvec(p)
        alpha = rr / global_sum(mesh, float(p @ q))
        x += alpha * p
        r -= alpha * q
        rho_prev = rr
        it += 1
        rr = global_sum(mesh, float(r @ r))
    return x, it, float(np.sqrt(rr))


def serial_cg(a: sp.csr_matrix, b: np.ndarray, rtol: float, maxiter: int
              ) -> Tuple[np.ndarray, int, int]:
    """scipy.sparse.linalg.cg from zero: the solution, its iterations and its info."""
    its = [0]

    def count(_: Any) -> None:
        its[0] += 1

    x, info = spla.cg(a, b, rtol=rtol, atol=0.0, maxiter=maxiter, callback=count)
    return x, its[0], int(info)


def run(mesh: ps.Mesh, m: int = 40, split: str = "uneven", rtol: float = 1e-8,
        maxiter: int = 10000, products: int = 20, seed: int = 0, check: bool = True
        ) -> Dict[str, Any]:
    """Build, multiply, solve and (``check``) compare with scipy. Returns the sizes, the
    plan's counts, times (slowest rank) and, with ``check``, the errors and ``ok``: the same
    on every rank."""
    comm = mesh.comm
    a = laplacian(m, seed)
    n = a.shape[0]
    sizes = row_sizes(n, mesh.size, split)
    t0 = time.perf_counter()
    dm = DistMatrix(a, mesh, sizes)
    t_setup = time.perf_counter() - t0
    rng = np.random.default_rng([seed, 1])
    xg, bg = rng.standard_normal(n), rng.standard_normal(n)
    x, b = xg[dm.box], bg[dm.box]
    y = dm.matvec(x)
    t0 = time.perf_counter()
    for _ in range(products):
        dm.matvec(x)
    t_product = (time.perf_counter() - t0) / max(products, 1)
    t0 = time.perf_counter()
    sol, its, res = cg(dm, b, rtol, maxiter)
    t_cg = time.perf_counter() - t0
    # cg's own test (the same bits on every rank: global_sum adds in rank order)
    converged = bool(res < rtol * np.sqrt(global_sum(mesh, float(b @ b))))
    stats = dm.plan.comm_stats()
    own = dm.box.stop - dm.box.start
    ghosts = int(dm.plan.n - int(dm.plan.counts[mesh.rank]))
    out: Dict[str, Any] = {
        "n": n, "nnz": int(a.nnz), "sizes": [int(s) for s in dm.layout.table[0][1]],
        "ghosts": int(global_sum(mesh, ghosts)),
        "messages": int(global_sum(mesh, stats["messages_sent"] / max(stats["gather"], 1))),
        "iterations": its, "residual": res, "converged": converged,
        "setup_s": max_all(comm, t_setup), "product_s": max_all(comm, t_product),
        "iteration_s": max_all(comm, t_cg / max(its, 1)), "rows": own,
    }
    if check:
        y_full = dm.vector(y).redistribute([ps.Replicate()]).local
        s_full = dm.vector(sol).redistribute([ps.Replicate()]).local
        y_ref = a @ xg
        x_ref, its_ref, info = serial_cg(a, bg, rtol, maxiter)
        spmv_err = float(np.abs(y_full - y_ref).max()) / max(float(np.abs(y_ref).max()), 1e-300)
        sol_err = float(np.linalg.norm(s_full - x_ref)) / max(float(np.linalg.norm(x_ref)),
                                                              1e-300)
        # matches scipy (whether or not either converged; False for a NaN)
        matches = spmv_err <= SPMV_TOL and its == its_ref and sol_err <= SOLUTION_TOL
        matches = all_true(comm, matches)
        out.update({"spmv_err": spmv_err, "serial_iterations": its_ref, "serial_info": info,
                    "solution_err": sol_err, "matches": matches,
                    "ok": matches and converged})
    return out


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=count_arg(3), default=40,
                    help="grid points per side (default 40, at least 3)")
    ap.add_argument("--split", default="uneven", choices=["uneven", "balanced"])
    ap.add_argument("--rtol", type=float, default=1e-8, help="CG's relative residual (> 0)")
    ap.add_argument("--maxiter", type=count_arg(1), default=10000)
    ap.add_argument("--products", type=count_arg(0), default=20, help="products timed")
    ap.add_argument("--seed", type=count_arg(0), default=0)
    ap.add_argument("--check", default="yes", choices=["yes", "no"])
    args = ap.parse_args(argv)
    if not 0.0 < args.rtol < float("inf"):
        ap.error(f"argument --rtol: must be a finite number > 0, got {args.rtol}")
    comm = MPI.COMM_WORLD
    mesh = ps.Mesh(comm, (comm.size,))
    r = run(mesh, args.m, args.split, args.rtol, args.maxiter, args.products, args.seed,
            args.check == "yes")
    if comm.rank == 0:
        print(f"spmv: P1 Laplacian of a {args.m}x{args.m}-point Delaunay mesh, {r['n']} rows "
              f"(randomly numbered), {r['nnz']} entries, on {comm.size} rank(s), rows "
              f"{r['sizes']}")
        print(f"  gather plan: {r['ghosts']} ghost rows and {r['messages']} MPI messages per "
              f"product over all ranks (node peers: node-shared memory); setup "
              f"{r['setup_s'] * 1e3:.2f} ms")
        print(f"  y = A x: {r['product_s'] * 1e6:.1f} us per product; CG: {r['iterations']} "
              f"iterations to ||r|| = {r['residual']:.3e}, {r['iteration_s'] * 1e6:.1f} us "
              f"per iteration (slowest rank); converged (||r|| < rtol ||b||): "
              f"{r['converged']}")
        if "ok" in r:
            print(f"  scipy.sparse: product {r['spmv_err']:.1e} (tolerance {SPMV_TOL:g}); cg "
                  f"{r['serial_iterations']} iterations (info {r['serial_info']}), solution "
                  f"{r['solution_err']:.1e} (tolerance {SOLUTION_TOL:g}); matches scipy: "
                  f"{r['matches']}; checks pass: {r['ok']}")
        if not r["converged"]:
            print(f"  FAILED: CG did not converge in {args.maxiter} iterations", file=sys.stderr)
    mesh.free()
    return 0 if r["converged"] and r.get("ok", True) else 1


if __name__ == "__main__":
    sys.exit(main())
