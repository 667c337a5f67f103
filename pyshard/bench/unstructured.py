"""The ``unstructured`` bench case: rows read and accumulated by global index
(:func:`pyshard.gather_plan`), next to the floor and to what users write by hand, in one run.

The index space (``pyshard/bench/ghosts.py``): ``--unstructured-rows`` rows a rank (default
10^6) of 64 B (8 float64), each rank reading 10% of its row count, distinct and sorted, in
two patterns: ``mesh`` (a tenth its own rows, the rest from its two neighbours on a ring of
ranks) and ``random`` (uniform over every rank's rows). Timed, each the median over reps of
the slowest rank:

- ``gather``: ``plan.gather(x, out=buf)`` (a plan built once); ``gather_result``:
  ``plan.gather(x)``, the result pyshard's (on a node transport, node-shared memory its node
  owners write into: no copy at ``wait``); ``scatter``:
  ``plan.scatter(values, into=y)`` (sum); ``setup``: ``gather_plan(rows, like=x)`` (NBX),
  and ``setup_alltoall`` (the count exchange forced to one ``MPI_Alltoall``);
  ``gather_shm``/``scatter_shm``, ``gather_persistent``/``scatter_persistent`` and
  ``gather_neighbor``/``scatter_neighbor``: the same plan by ``method="shm"`` (node-shared
  memory between ranks of one node), ``"persistent"`` and ``"neighbor"`` (``auto`` is
  ``"p2p"``), and ``gather_tune``/``scatter_tune`` by ``"tune"`` (``tuned``: what it kept);
- ``floor``: the same bytes to and from the same peers, already packed, through one raw
  ``MPI_Alltoallv`` (``floor_a2a``), ``Irecv``/``Isend``/``Waitall`` (``floor_p2p``) or
  ``MPI_Neighbor_alltoallv`` on a distributed-graph communicator of the peers
  (``floor_nbr``), plus a memcpy of the rows this rank reads of its own; the fastest of the
  three is the floor.
  The scatter's floor is the same exchange reversed;
- ``by_hand``: what mpi4py users write every step: the owners by binary search, the counts
  by ``Alltoall``, the index lists by ``Alltoallv``, the rows by fancy indexing and a second
  ``Alltoallv`` (every rank's own rows through it too); ``by_hand_scatter``: the same index
  exchange, the values by ``Alltoallv`` and ``np.add.at``;
- ``pack``: the gather's memory work alone (``np.take`` of the rows others read and of
  this rank's own rows: rows spread over ``x``, a cache miss each), and ``floor_pack``, the
  floor plus it: the least any implementation does here;
- ``planned``/``planned_scatter``: :class:`Planned`, by hand with the index lists known;
- time splits: ``gather_start`` (packing, posting, the own rows copied) and ``gather_wait``
  (the messages, then the rows that did not land in place); ``scatter_start`` (the values
  combined per distinct row, posting) and ``scatter_wait`` (the messages, then every group
  combined into its rows of ``into``).

Both the gather and the scatter are checked against the by-hand results (the scatter bit for
bit: the by-hand ``np.add.at`` adds in ascending source rank, pyshard's order rule).

Also a simulated setup at 65,536 ranks (no MPI): the owners one rank reads from, by the
plan's own rule (a binary search of the shard offsets), for a 2-D mesh partitioned in
blocks and for a random graph, next to the 65,535 counts a dense count exchange carries.
PETSc's ``PetscSF`` on the same graph runs from ``scripts/petsc_sf.py`` (its own Python and
MPI).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Sequence, Tuple

import numpy as np
from mpi4py import MPI

from .. import collectives
from ..array import from_local
from ..layout import Shard
from ..mesh import Mesh
from ..unstructured import gather_plan
from .ghosts import PATTERNS, owners, read_rows, row_values
from .timing import median_s

WIDTH = 8  # float64 columns: 64 B a row


def by_hand_gather(local: np.ndarray, idx: np.ndarray, n: int, comm: MPI.Comm) -> np.ndarray:
    """``x_global[idx]`` the way mpi4py users write it, every step."""
    P, me = comm.Get_size(), comm.Get_rank()
    owner = np.searchsorted(np.arange(1, P + 1) * n, idx, side="right")
    order = np.argsort(owner, kind="stable")
    counts = np.bincount(owner, minlength=P).astype(np.int64)
    rcounts = np.empty(P, np.int64)
    comm.Alltoall(counts, rcounts)
    req = np.empty(int(rcounts.sum()), np.int64)
    comm.Alltoallv([idx[order], (counts, None), MPI.INT64_T], [req, (rcounts, None), MPI.INT64_T])
    rows = local[req - me * n]
    w = local.shape[1]
    recv = np.empty((idx.shape[0], w), local.dtype)
    comm.Alltoallv([rows, (rcounts * w, None), MPI.DOUBLE], [recv, (counts * w, None), MPI.DOUBLE])
    out = np.empty_like(recv)
    out[order] = recv
    return out


def by_hand_scatter(into: np.ndarray, idx: np.ndarray, values: np.ndarray, n: int,
                    comm: MPI.Comm) -> None:
    """``x_global[idx] += values`` the way mpi4py users write it, every step."""
    P, me = comm.Get_size(), comm.Get_rank()
    owner = np.searchsorted(np.arange(1, P + 1) * n, idx, side="right")
    order = np.argsort(owner, kind="stable")
    counts = np.bincount(owner, minlength=P).astype(np.int64)
    rcounts = np.empty(P, np.int64)
    comm.Alltoall(counts, rcounts)
    req = np.empty(int(rcounts.sum()), np.int64)
    comm.Alltoallv([idx[order], (counts, None), MPI.INT64_T], [req, (rcounts, None), MPI.INT64_T])
    w = into.shape[1]
    recv = np.empty((req.shape[0], w), into.dtype)
    comm.Alltoallv([np.ascontiguousarray(values[order]), (counts * w, None), MPI.DOUBLE],
                   [recv, (rcounts * w, None), MPI.DOUBLE])
    np.add.at(into, req - me * n, recv)


class Floor:
    """The exchange's bytes already packed, the counts known: ``a2a`` (one raw
    ``MPI_Alltoallv``), ``p2p`` (``Irecv``/``Isend`` to the same peers, ``Waitall``) and
    ``nbr`` (``MPI_Neighbor_alltoallv``; :meth:`free` its communicator), each plus a memcpy
    of the rows this rank reads of its own. ``reverse``: the scatter's direction (the bytes
    each way swapped)."""

    def __init__(self, idx: np.ndarray, n: int, comm: MPI.Comm, reverse: bool = False) -> None:
        P, me = comm.Get_size(), comm.Get_rank()
        row = 8 * WIDTH
        reads = np.bincount(owners(idx, n), minlength=P).astype(np.int64)
        served = np.empty(P, np.int64)
        comm.Alltoall(reads, served)
        own = int(reads[me])
        reads[me] = served[me] = 0
        sc, rc = (reads, served) if reverse else (served, reads)
        self.sc, self.rc = sc * row, rc * row
        self.sd = np.concatenate(([0], np.cumsum(self.sc)[:-1]))
        self.rd = np.concatenate(([0], np.cumsum(self.rc)[:-1]))
        self.send = np.ones(int(self.sc.sum()), np.uint8)
        self.recv = np.empty(int(self.rc.sum()), np.uint8)
        self.src = np.ones(own * row, np.uint8)
        self.dst = np.empty(own * row, np.uint8)
        self.comm = comm
        self.to = [int(p) for p in np.flatnonzero(self.sc)]
        self.frm = [int(p) for p in np.flatnonzero(self.rc)]
        self.graph = comm.Create_dist_graph_adjacent(self.frm, self.to, reorder=False)
        self.nb_s = ([int(self.sc[p]) for p in self.to], [int(self.sd[p]) for p in self.to])
        self.nb_r = ([int(self.rc[p]) for p in self.frm], [int(self.rd[p]) for p in self.frm])

    def nbr(self) -> None:
        """``MPI_Neighbor_alltoallv`` on a distributed-graph communicator of the peers."""
        self.graph.Neighbor_alltoallv([self.send, self.nb_s, MPI.BYTE],
                                      [self.recv, self.nb_r, MPI.BYTE])
        np.copyto(self.dst, self.src)

    def free(self) -> None:
        self.graph.Free()

    def a2a(self) -> None:
        self.comm.Alltoallv([self.send, (self.sc, self.sd), MPI.BYTE],
                            [self.recv, (self.rc, self.rd), MPI.BYTE])
        np.copyto(self.dst, self.src)

    def p2p(self) -> None:
        c = self.comm
        reqs = [c.Irecv([self.recv[self.rd[p]:self.rd[p] + self.rc[p]], MPI.BYTE], p, 43)
                for p in self.frm]
        reqs += [c.Isend([self.send[self.sd[p]:self.sd[p] + self.sc[p]], MPI.BYTE], p, 43)
                 for p in self.to]
        np.copyto(self.dst, self.src)
        MPI.Request.Waitall(reqs)


class Planned:
    """The exchange written by hand with the plan cached (what an expert writes once the index
    lists are known): the rows others read packed by ``np.take``, ``Irecv``/``Isend`` to the
    same peers straight into place, the own rows by ``np.take``; the scatter the reverse, each
    group added by fancy indexing in ascending rank (the order rule). The least work any
    implementation does: ``floor`` plus the packing and unpacking of rows spread over
    ``x``."""

    def __init__(self, idx: np.ndarray, n: int, size: int, rank: int, pat: str, frac: float,
                 comm: MPI.Comm) -> None:
        self.comm, self.me, self.n = comm, rank, n
        own = owners(idx, n)
        at = np.searchsorted(own, np.arange(size + 1))  # idx sorted: one run per owner
        self.groups = [(int(q), int(at[q]), int(at[q + 1])) for q in range(size)
                       if at[q + 1] > at[q]]
        served = []
        for r in range(size):  # every rank's reads, recomputed here (same seeds)
            ir = idx if r == rank else read_rows(n, size, r, pat, frac)
            rows = ir[owners(ir, n) == rank] - rank * n
            if rows.size:
                served.append((r, rows))
        self.served = served
        self.own = dict(served).get(rank, np.zeros(0, np.int64))
        self.sbuf = {r: np.empty((rows.shape[0], WIDTH)) for r, rows in served if r != rank}

    def gather(self, local: np.ndarray, out: np.ndarray) -> None:
        c, me = self.comm, self.me
        reqs = [c.Irecv(out[a:b], q, 44) for q, a, b in self.groups if q != me]
        for r, rows in self.served:
            if r != me:
                np.take(local, rows, axis=0, out=self.sbuf[r])
                reqs.append(c.Isend(self.sbuf[r], r, 44))
        for q, a, b in self.groups:
            if q == me:
                np.take(local, self.own, axis=0, out=out[a:b])
        MPI.Request.Waitall(reqs)

    def pack(self, local: np.ndarray, out: np.ndarray) -> None:
        """The gather's memory work alone, no message: the rows others read and this rank's
        own rows taken from ``local`` (rows spread over x: a cache miss each)."""
        for r, rows in self.served:
            if r != self.me:
                np.take(local, rows, axis=0, out=self.sbuf[r])
        for q, a, b in self.groups:
            if q == self.me:
                np.take(local, self.own, axis=0, out=out[a:b])

    def scatter(self, values: np.ndarray, into: np.ndarray) -> None:
        c, me = self.comm, self.me
        reqs = [c.Irecv(self.sbuf[r], r, 45) for r, _ in self.served if r != me]
        reqs += [c.Isend(values[a:b], q, 45) for q, a, b in self.groups if q != me]
        MPI.Request.Waitall(reqs)
        mine = {q: (a, b) for q, a, b in self.groups}
        for r, rows in self.served:  # ascending rank, this rank's own at its place
            if r == me:
                a, b = mine[me]
                into[self.own] += values[a:b]
            else:
                into[rows] += self.sbuf[r]


def _splits(start: Callable[[], Any], comm: MPI.Comm, reps: int) -> Tuple[float, float]:
    """``start()`` (a pending exchange) and its ``wait()``, each the median of the slowest
    rank's time."""
    a: List[float] = []
    b: List[float] = []
    for _ in range(reps):
        collectives.barrier(comm)
        t0 = time.perf_counter()
        p = start()
        t1 = time.perf_counter()
        p.wait()
        t2 = time.perf_counter()
        a.append(collectives.max_all(comm, t1 - t0))
        b.append(collectives.max_all(comm, t2 - t1))
    return float(np.median(a)), float(np.median(b))


def simulated_setup(side: int = 256, block: int = 64, seed: int = 7) -> Dict[str, Any]:
    """One rank of ``side x side`` ranks (65,536 at 256), no MPI: the owners it reads from
    by the plan's rule (``np.searchsorted`` of the shard offsets), for

    - ``mesh``: a 2-D grid of vertices split in ``block x block`` blocks, one a rank, each
      block's vertices numbered in a contiguous range; a rank reads the 9-point stencil's
      ghosts, its block's ring of width 1;
    - ``random``: a random graph, a tenth of the rank's row count read uniformly,

    with the messages the NBX setup sends from that rank (a count and a row list to each
    owner, and one nonblocking reduction), next to the ``side^2 - 1`` counts of a dense
    count exchange."""
    P = side * side
    n = block * block
    offsets = np.arange(P + 1, dtype=np.int64) * n
    cy, cx = side // 2, side // 3
    me = cy * side + cx

    def gid(gy: np.ndarray, gx: np.ndarray) -> np.ndarray:
        gy, gx = gy % (side * block), gx % (side * block)
        r = (gy // block) * side + gx // block
        return r * n + (gy % block) * block + gx % block

    y0, x0 = cy * block, cx * block
    ring = [(y, x) for y in range(y0 - 1, y0 + block + 1) for x in (x0 - 1, x0 + block)]
    ring += [(y, x) for y in (y0 - 1, y0 + block) for x in range(x0, x0 + block)]
    ys, xs = np.array(ring).T
    rng = np.random.default_rng(seed)
    out: Dict[str, Any] = {"ranks": P, "rows_per_rank": n, "dense_counts": P - 1}
    for name, rows in (("mesh", gid(ys, xs)),
                       ("random", rng.choice(P * n, size=n // 10, replace=False))):
        uniq = np.unique(rows)
        own = np.searchsorted(offsets[:-1], uniq, side="right") - 1  # gather_plan's rule
        peers = int(np.unique(own[own != me]).shape[0])
        out[name] = {"reads": int(uniq.shape[0]), "owners": peers,
                     "nbx_messages": 2 * peers}
    return out


def _timed(fns: Dict[str, Callable[[], object]], comm: MPI.Comm, reps: int,
           warmup: int) -> Dict[str, float]:
    return {k: median_s(f, comm, reps, warmup) for k, f in fns.items()}


def _pattern(pat: str, n: int, frac: float, x: Any, local: np.ndarray, mesh: Mesh, reps: int,
             warmup: int) -> Dict[str, Any]:
    """One pattern's check, times and messages."""
    comm, me = mesh.comm, mesh.rank
    idx = read_rows(n, mesh.size, me, pat, frac)
    plan = gather_plan(idx, like=x)
    buf = np.empty((idx.shape[0], WIDTH))
    want = idx[:, None].astype(np.float64) + np.arange(WIDTH) / (2 * WIDTH)
    ok = np.array_equal(plan.gather(x, out=buf), want)
    ok = ok and np.array_equal(plan.gather(x), want)
    ok = ok and np.array_equal(by_hand_gather(local, idx, n, comm), want)
    values = np.random.default_rng([5, me]).standard_normal((idx.shape[0], WIDTH))
    y1, y2 = local.copy(), local.copy()
    plan.scatter(values, into=from_local(y1, mesh, [Shard(0)], global_shape=x.shape))
    by_hand_scatter(y2, idx, values, n, comm)
    ok = bool(collectives.all_true(comm, ok and np.array_equal(y1, y2)))
    y = from_local(local.copy(), mesh, [Shard(0)], global_shape=x.shape)
    fwd, rev = Floor(idx, n, comm), Floor(idx, n, comm, reverse=True)
    hand = Planned(idx, n, mesh.size, me, pat, frac, comm)
    buf2, y3 = np.empty_like(buf), local.copy()
    hand.gather(local, buf2)
    hand.scatter(values, y3)
    ok = bool(collectives.all_true(comm, ok and np.array_equal(buf2, want)
                                   and np.array_equal(y3, y1)))
    # the same plan by the other methods: node-shared memory between ranks of a node,
    # persistent requests, one neighbourhood all-to-all (auto: fresh messages, p2p)
    by_method = {m: gather_plan(idx, like=x, method=m)
                 for m in ("shm", "persistent", "neighbor", "tune")}
    for pl in by_method.values():
        y4 = local.copy()
        pl.scatter(values, into=from_local(y4, mesh, [Shard(0)], global_shape=x.shape))
        ok = ok and np.array_equal(pl.gather(x, out=np.empty_like(buf)), want) and \
            np.array_equal(y4, y1)  # fmt: skip
    ok = bool(collectives.all_true(comm, ok))
    acc = local.copy()
    t = _timed({
        "floor_a2a": fwd.a2a,
        "floor_p2p": fwd.p2p,
        "floor_nbr": fwd.nbr,
        "gather": lambda: plan.gather(x, out=buf),
        "gather_result": lambda: plan.gather(x),
        "by_hand": lambda: by_hand_gather(local, idx, n, comm),
        "planned": lambda: hand.gather(local, buf2),
        "pack": lambda: hand.pack(local, buf2),
        "scatter_floor_a2a": rev.a2a,
        "scatter_floor_p2p": rev.p2p,
        "scatter_floor_nbr": rev.nbr,
        "scatter": lambda: plan.scatter(values, into=y),
        "by_hand_scatter": lambda: by_hand_scatter(acc, idx, values, n, comm),
        "planned_scatter": lambda: hand.scatter(values, y3),
        "setup": lambda: gather_plan(idx, like=x),
        "setup_alltoall": lambda: gather_plan(idx, like=x, algorithm="alltoall"),
        **{f"gather_{m}": (lambda pl=pl: pl.gather(x, out=buf)) for m, pl in by_method.items()},
        **{f"scatter_{m}": (lambda pl=pl: pl.scatter(values, into=y))
           for m, pl in by_method.items()},
    }, comm, reps, warmup)
    t["gather_start"], t["gather_wait"] = _splits(
        lambda: plan.gather(x, out=buf, wait=False), comm, reps)
    t["scatter_start"], t["scatter_wait"] = _splits(
        lambda: plan.scatter(values, into=y, wait=False), comm, reps)
    fwd.free()
    rev.free()
    t["floor"] = min(t["floor_a2a"], t["floor_p2p"], t["floor_nbr"])
    t["scatter_floor"] = min(t["scatter_floor_a2a"], t["scatter_floor_p2p"],
                             t["scatter_floor_nbr"])
    t["floor_pack"] = t["floor"] + t["pack"]
    st = plan.comm_stats()
    own = int((owners(idx, n) == me).sum())
    return {
        "pattern": pat,
        "path": plan.route.path,
        "scatter_by": plan.route.scatter_by,
        "tuned": dict(by_method["tune"].chosen),
        "reads": int(collectives.max_all(comm, idx.shape[0])),
        "own_reads": int(collectives.max_all(comm, own)),
        "max_peers": int(collectives.max_all(comm, len(fwd.frm))),
        "max_setup_messages": int(collectives.max_all(comm, st["setup_messages"])),
        "check": ok,
        "ms": {k: 1e3 * v for k, v in t.items()},
    }


def bench_unstructured(comm: MPI.Comm, rows: int = 1_000_000, reps: int = 10, warmup: int = 2,
                       patterns: Sequence[str] = PATTERNS, frac: float = 0.1) -> Dict[str, Any]:
    """The case on ``comm``: per pattern the times (milliseconds, each row's ``"ms"``: the
    median over ``reps`` of the slowest rank), the check and the messages; the simulated
    setup at 65,536 ranks."""
    P, me = comm.Get_size(), comm.Get_rank()
    n = rows
    mesh = Mesh(comm, (P,))
    local = row_values(n, me, WIDTH)
    x = from_local(local, mesh, [Shard(0)], global_shape=(n * P, WIDTH))
    out = [_pattern(pat, n, frac, x, local, mesh, reps, warmup) for pat in patterns]
    mesh.free()
    return {"case": "unstructured", "ranks": P, "rows_per_rank": n, "row_bytes": 8 * WIDTH,
            "frac": frac, "reps": reps, "check": all(o["check"] for o in out), "rows": out,
            "simulated": simulated_setup()}


def format_unstructured(r: Dict[str, Any]) -> str:
    """The table of a :func:`bench_unstructured` row."""
    lines = [f"unstructured: {r['ranks']} ranks, {r['rows_per_rank']} rows of {r['row_bytes']} "
             f"B a rank, {r['frac']:.0%} read (ms, median of {r['reps']}, slowest rank)"]
    lines.append(f"  {'pattern':>7} {'floor':>7} {'gather':>7} {'by hand':>8} {'/floor':>6} "
                 f"{'/hand':>6} {'planned':>7} {'+pack':>6} {'/+pack':>6} | {'floor':>7} "
                 f"{'scatter':>7} {'by hand':>8} "
                 f"{'planned':>7} {'/floor':>6} | "
                 f"{'setup':>7} {'a2a':>7} | {'start':>6} {'wait':>6} {'start':>6} "
                 f"{'wait':>6} peers ok")
    for o in r["rows"]:
        m = o["ms"]
        lines.append(
            f"  {o['pattern']:>7} {m['floor']:7.2f} {m['gather']:7.2f} {m['by_hand']:8.2f} "
            f"{m['gather'] / m['floor']:6.2f} {m['gather'] / m['by_hand']:6.3f} "
            f"{m['planned']:7.2f} {m['floor_pack']:6.2f} {m['gather'] / m['floor_pack']:6.2f} | "
            f"{m['scatter_floor']:7.2f} {m['scatter']:7.2f} "
            f"{m['by_hand_scatter']:8.2f} {m['planned_scatter']:7.2f} "
            f"{m['scatter'] / m['scatter_floor']:6.2f} | {m['setup']:7.2f} "
            f"{m['setup_alltoall']:7.2f} | {m['gather_start']:6.2f} {m['gather_wait']:6.2f} "
            f"{m['scatter_start']:6.2f} {m['scatter_wait']:6.2f} "
            f"{o['max_peers']:>5} {o['check']}")
    for o in r["rows"]:
        m = o["ms"]
        lines.append(
            f"  {o['pattern']:>7} by method (gather, scatter): auto ({o['path']}"
            f"{', scatters ' + o['scatter_by'] if o.get('scatter_by') else ''}) "
            f"{m['gather']:.2f}, {m['scatter']:.2f} (no out=: {m['gather_result']:.2f}); "
            f"shm {m['gather_shm']:.2f}, "
            f"{m['scatter_shm']:.2f}; persistent {m['gather_persistent']:.2f}, "
            f"{m['scatter_persistent']:.2f}; neighbor {m['gather_neighbor']:.2f}, "
            f"{m['scatter_neighbor']:.2f}; tune ({o['tuned'].get('gather', '-')}, "
            f"{o['tuned'].get('scatter', '-')}) {m['gather_tune']:.2f}, {m['scatter_tune']:.2f}")
    s = r["simulated"]
    lines.append(
        f"  simulated {s['ranks']} ranks, {s['rows_per_rank']} rows a rank: a 2-D mesh's "
        f"9-point ghosts ({s['mesh']['reads']} rows) come from {s['mesh']['owners']} owners, "
        f"NBX sends {s['mesh']['nbx_messages']} messages; a random graph "
        f"({s['random']['reads']} rows): {s['random']['owners']} owners, "
        f"{s['random']['nbx_messages']} messages; a dense count exchange carries "
        f"{s['dense_counts']} counts")
    return "\n".join(lines)
