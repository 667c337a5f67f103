"""The ``migrate`` bench case: particles (7 float64 columns: position 3, velocity 3, charge;
plus an int64 id: 64 bytes a row) leaving for neighbours on a 2-D mesh (1%, 10%, 50% of the
rows) and uniform random, next to what users write by hand and the floor, in one run:

- ``pyshard``: :func:`pyshard.migrate` (auto, and each count exchange forced), and ``back``;
- ``by hand``: a stable argsort by dest, the counts by ``MPI_Alltoall``, then one
  ``MPI_Alltoallv`` per column (mpi4py);
- ``fused by hand``: the same with the rows gathered into one structured array and one
  ``MPI_Alltoallv``;
- ``floor``: one ``MPI_Alltoallv`` of the moving bytes already packed, the counts known, plus
  a copy of the staying rows by streaming stores (the fastest copy of them here);
  ``exchange``: that ``MPI_Alltoallv`` alone;
- ``inplace``: ``migrate(..., inplace=True)`` on columns with room (the staying rows do not
  move; the input restored before each call, untimed).

Also the messages per rank that NBX sends (``comm_stats``), and a simulated count at 65,536
ranks (no MPI): how many ranks one rank's particles go to when they move at most one cell.
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence

import numpy as np
from mpi4py import MPI

from .. import _core, collectives, comm_stats, reset_comm_stats
from ..layout import Layout, Shard
from ..mesh import Mesh
from ..migration import migrate, owner
from .particles import dests, particles
from .timing import median_s

COLUMNS = (("pos", (3,)), ("vel", (3,)), ("q", ()), ("id", ()))


def by_hand(cols: Dict[str, np.ndarray], dest: np.ndarray, comm: MPI.Comm) -> List[np.ndarray]:
    P = comm.Get_size()
    order = np.argsort(dest, kind="stable")
    counts = np.bincount(dest, minlength=P).astype(np.int64)
    rcounts = np.empty(P, np.int64)
    comm.Alltoall(counts, rcounts)
    out = []
    for a in cols.values():
        s = np.ascontiguousarray(a[order])
        w = a.itemsize * (a.size // max(a.shape[0], 1)) if a.shape[0] else a.itemsize
        r = np.empty((int(rcounts.sum()),) + a.shape[1:], a.dtype)
        comm.Alltoallv([s.view(np.uint8).reshape(-1), (counts * w, None), MPI.BYTE],
                       [r.view(np.uint8).reshape(-1), (rcounts * w, None), MPI.BYTE])
        out.append(r)
    return out


def fused_by_hand(cols: Dict[str, np.ndarray], dest: np.ndarray, comm: MPI.Comm) -> np.ndarray:
    P = comm.Get_size()
    dt = np.dtype([(k, a.dtype, a.shape[1:]) for k, a in cols.items()])
    order = np.argsort(dest, kind="stable")
    s = np.empty(len(dest), dt)
    for k, a in cols.items():
        s[k] = a[order]
    counts = np.bincount(dest, minlength=P).astype(np.int64)
    rcounts = np.empty(P, np.int64)
    comm.Alltoall(counts, rcounts)
    r = np.empty(int(rcounts.sum()), dt)
    comm.Alltoallv([s.view(np.uint8), (counts * dt.itemsize, None), MPI.BYTE],
                   [r.view(np.uint8), (rcounts * dt.itemsize, None), MPI.BYTE])
    return r


class Floor:
    """The moving bytes packed beforehand, the counts known: one Alltoallv of them, plus a
    copy of the staying rows (one contiguous block per column here, as if sorted) by
    streaming stores (``_core.stream_copy``: the fastest copy of those bytes here; glibc's
    memcpy streams only past 114 MiB on this VM, and measured 2x slower on them)."""

    def __init__(self, cols: Dict[str, np.ndarray], dest: np.ndarray, comm: MPI.Comm) -> None:
        P, me = comm.Get_size(), comm.Get_rank()
        row = sum(a.itemsize * (a.size // max(a.shape[0], 1)) for a in cols.values())
        counts = np.bincount(dest, minlength=P).astype(np.int64)
        rcounts = np.empty(P, np.int64)
        comm.Alltoall(counts, rcounts)
        self.sc, self.rc = counts * row, rcounts * row
        self.sc[me] = self.rc[me] = 0
        self.send = np.ones(int(self.sc.sum()), np.uint8)
        self.recv = np.empty(int(self.rc.sum()), np.uint8)
        keep = int(counts[me])
        self.stay = [(np.empty((keep,) + a.shape[1:], a.dtype), a[:keep])
                     for a in cols.values()]
        self.comm = comm

    def __call__(self) -> None:
        self.exchange()
        for dst, src in self.stay:
            _core.stream_copy(src, dst)

    def exchange(self) -> None:
        """The Alltoallv of the moving bytes alone (what an in-place migration's rows cost
        at least, the staying rows not copied)."""
        self.comm.Alltoallv([self.send, (self.sc, None), MPI.BYTE],
                            [self.recv, (self.rc, None), MPI.BYTE])


class InPlace:
    """``migrate(..., inplace=True)`` on columns with room for 10% more rows, the input
    restored before each call (untimed)."""

    def __init__(self, cols: Dict[str, np.ndarray], dest: np.ndarray, mesh: Mesh) -> None:
        n = dest.shape[0]
        self.orig, self.dest, self.mesh = cols, dest, mesh
        self.buf = {k: np.empty((n + n // 10 + 1024,) + a.shape[1:], a.dtype)
                    for k, a in cols.items()}

    def restore(self) -> None:
        n = self.dest.shape[0]
        for k, a in self.orig.items():
            self.buf[k][:n] = a

    def __call__(self) -> Any:
        return migrate(self.buf, self.dest, self.mesh, inplace=True)


def simulated_peers(side: int = 256, n: int = 4096, cells: int = 64) -> Dict[str, Any]:
    """One rank of a ``side x side`` mesh (65,536 ranks at 256), its particles spread over its
    box and moved up to one cell: the ranks they go to (what NBX messages), next to the P - 1
    counts a dense count exchange carries for every rank. No MPI."""

    class _Mesh:
        shape = (side, side)
        coords = (side // 2, side // 3)
        size = side * side

    layout = Layout((side * cells, side * cells), np.float64, (side, side), [Shard(0), Shard(1)])
    rng = np.random.default_rng(5)
    lo = np.array([_Mesh.coords[0] * cells, _Mesh.coords[1] * cells], float)
    x = lo + rng.random((n, 2)) * cells + rng.uniform(-1, 1, (n, 2))
    dest = owner(x, layout, periodic=True, mesh=_Mesh)
    me = _Mesh.coords[0] * side + _Mesh.coords[1]
    to = len(set(dest.tolist()) - {me})
    return {"ranks": side * side, "nbx_messages": to, "dense_counts": side * side - 1}


def _times(cols: Dict[str, np.ndarray], dest: np.ndarray, mesh: Mesh, r: Any, floor: Floor,
           reps: int, warmup: int) -> Dict[str, float]:
    comm = mesh.comm
    ip = InPlace(cols, dest, mesh)
    return {
        "floor": median_s(floor, comm, reps, warmup),
        "exchange": median_s(floor.exchange, comm, reps, warmup),
        "inplace": median_s(ip, comm, reps, warmup, ip.restore),
        "pyshard": median_s(lambda: migrate(cols, dest, mesh), comm, reps, warmup),
        "alltoall": median_s(lambda: migrate(cols, dest, mesh, "alltoall"), comm, reps, warmup),
        "nbx": median_s(lambda: migrate(cols, dest, mesh, "nbx"), comm, reps, warmup),
        "back": median_s(lambda: r.back(r.rows), comm, reps, warmup),
        "by_hand": median_s(lambda: by_hand(cols, dest, comm), comm, reps, warmup),
        "fused_by_hand": median_s(lambda: fused_by_hand(cols, dest, comm), comm, reps, warmup),
    }


def bench_migrate(comm: MPI.Comm, rows: int = 1_000_000, reps: int = 5, warmup: int = 1,
                  patterns: Sequence[str] = ("1%", "10%", "50%", "uniform")) -> Dict[str, Any]:
    P = comm.Get_size()
    mesh = Mesh(comm, tuple(MPI.Compute_dims(P, 2)))
    cols = particles(rows, mesh.rank)
    out: List[Dict[str, Any]] = []
    for pat in patterns:
        frac = float(pat[:-1]) / 100 if pat.endswith("%") else 0.0
        pattern = "uniform" if pat == "uniform" else "neighbours"
        dest = dests(rows, mesh.size, mesh.rank, mesh.shape, pattern, frac)
        r = migrate(cols, dest, mesh)
        # correctness next to the hand-written form (one column is enough: all share the order)
        ref = by_hand(cols, dest, mesh.comm)
        ok = all(np.array_equal(a, b) for a, b in zip(r.rows.values(), ref))
        back = r.back(r.rows)
        ok = ok and all(np.array_equal(back[k], cols[k]) for k in cols)
        ip = InPlace(cols, dest, mesh)  # in place: the grouped rows through `order`
        ip.restore()
        ri = ip()
        ok = ok and all(np.array_equal(ri.rows[k][ri.order], r.rows[k]) for k in cols)
        ok = bool(collectives.all_true(comm, ok))
        floor = Floor(cols, dest, mesh.comm)
        t = _times(cols, dest, mesh, r, floor, reps, warmup)
        reset_comm_stats()
        migrate(cols, dest, mesh, "nbx")
        msgs = collectives.max_all(comm, comm_stats().get("migrate_messages", 0))
        leaving = sum(collectives.allgather(comm, int((dest != mesh.rank).sum())))
        out.append({"pattern": pat, "leaving": leaving, "max_messages_per_rank": msgs,
                    "check": ok, "ms": {k: 1e3 * v for k, v in t.items()}})
    mesh.free()
    return {"case": "migrate", "ranks": P, "rows_per_rank": rows, "row_bytes": 64,
            "check": all(o["check"] for o in out), "rows": out, "simulated": simulated_peers()}


def format_migrate(r: Dict[str, Any]) -> str:
    lines = [f"migrate: {r['ranks']} ranks, {r['rows_per_rank']} rows of {r['row_bytes']} B a "
             "rank (ms, median; x: pyshard over the row)"]
    head = (f"  {'pattern':>8} {'floor':>8} {'pyshard':>8} {'alltoall':>8} {'nbx':>8} "
            f"{'back':>8} {'by hand':>8} {'fused':>8}  {'/floor':>6} {'/hand':>6} "
            f"{'back/fwd':>8} {'exchange':>8} {'inplace':>8} {'ip/floor':>8} {'ip/exch':>7}"
            " msgs ok")
    lines.append(head)
    for o in r["rows"]:
        m = o["ms"]
        lines.append(
            f"  {o['pattern']:>8} {m['floor']:8.2f} {m['pyshard']:8.2f} {m['alltoall']:8.2f} "
            f"{m['nbx']:8.2f} {m['back']:8.2f} {m['by_hand']:8.2f} {m['fused_by_hand']:8.2f}  "
            f"{m['pyshard'] / m['floor']:6.2f} {m['pyshard'] / m['by_hand']:6.3f} "
            f"{m['back'] / m['pyshard']:8.2f} {m['exchange']:8.2f} {m['inplace']:8.2f} "
            f"{m['inplace'] / m['floor']:8.2f} {m['inplace'] / m['exchange']:7.2f} "
            f"{o['max_messages_per_rank']:>4} {o['check']}"
        )
    s = r["simulated"]
    lines.append(f"  simulated {s['ranks']} ranks, particles moving up to one cell: NBX sends "
                 f"{s['nbx_messages']} messages from one rank; a dense count exchange carries "
                 f"{s['dense_counts']} counts")
    return "\n".join(lines)
