"""PETSc's PetscSF on the graph of ``python -m pyshard bench --cases unstructured``.

    mpiexec -n 4 python3 scripts/petsc_sf.py [--rows 1000000] [--reps 10] [--warmup 2]

For where petsc4py and pyshard cannot share one Python (Debian's python3-petsc4py is built
for Debian's python3, its numpy and Open MPI and its mpi4py 3.1, which must be installed as
well: ``apt-get install python3-petsc4py python3-mpi4py``): run this with that Python and
that MPI's mpiexec, next to the pyshard bench (as scripts/petsc_swarm.py does for DMSwarm).
Debian 12 sets no /usr/lib/petsc link without libpetsc-real-dev, so ``export
PETSC_DIR=/usr/lib/petscdir/petsc3.18/x86_64-linux-gnu-real`` first when ``from petsc4py
import PETSc`` fails; Open MPI run as root needs ``OMPI_ALLOW_RUN_AS_ROOT=1
OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1``, and more ranks than cores ``--oversubscribe``.

The same graph as the bench: ``--rows`` owned rows a rank of 8 float64 (64 B), each rank
reading 10% of its row count, distinct and sorted, in the patterns ``mesh`` and ``random``:
the bench's own generators, ``pyshard/bench/ghosts.py`` (numpy only), loaded by its path, so
the seeds and rows are the bench's. The star forest: the roots are a rank's owned rows, the
leaves the rows it reads, each leaf pointing at (owner, row on the owner); the unit one row,
``MPI_DOUBLE`` contiguous x 8. This is what a ``VecScatter`` from a global vector of block
size 8 into a local ghost vector runs (PETSc 3.18's VecScatter is a PetscSF).

Timed, each the median over reps of the slowest rank's time:

- ``setup``: ``setGraph`` and ``setUp`` of a new SF (created before the clock starts; the
  (owner, row) pairs computed before it too);
- ``bcast``: ``bcastBegin``/``bcastEnd`` with ``MPI.REPLACE``, roots to leaves: pyshard's
  gather;
- ``reduce``: ``reduceBegin``/``reduceEnd`` with ``MPI.SUM``, leaves into roots: pyshard's
  scatter (sum);
- ``pack``: the memory work alone (``np.take`` of the rows every rank, this one included,
  reads of this rank), and ``floor_pack``: the floor plus it, as in the bench;
- ``floor``: the bench's floor under this MPI (the same bytes already packed, through one raw
  ``Alltoallv`` or ``Irecv``/``Isend`` to the same peers, the faster, plus a memcpy of the
  rows a rank reads of its own), so that PETSc's ratio to the floor compares with pyshard's
  when the two run on different MPI libraries.

Check: the leaves after ``bcast`` are exactly the rows read (each row's values encode its
global index); the roots after one ``reduce`` equal every rank's values added in (recomputed
locally from every rank's seeds; to 1e-12, as PETSc's order of adding is its own). Prints a
table and one JSON line (``"case": "petsc_sf"``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path
from typing import Callable, Optional

import numpy as np
from mpi4py import MPI
from petsc4py import PETSc

WIDTH = 8


def _generators():
    """pyshard/bench/ghosts.py (numpy only), loaded by its path: this Python need not import
    pyshard."""
    path = Path(__file__).resolve().parents[1] / "pyshard" / "bench" / "ghosts.py"
    spec = importlib.util.spec_from_file_location("pyshard_bench_ghosts", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


ghosts = _generators()


def values_of(rank: int, m: int) -> np.ndarray:
    """The values rank ``rank`` adds into the rows it reads (the bench's seeds)."""
    return np.random.default_rng([5, rank]).standard_normal((m, WIDTH))


class Floor:
    """The exchange's bytes already packed, the counts known (the bench's floor)."""

    def __init__(self, idx: np.ndarray, n: int, comm: MPI.Comm, reverse: bool = False) -> None:
        P, me = comm.Get_size(), comm.Get_rank()
        row = 8 * WIDTH
        reads = np.bincount(ghosts.owners(idx, n), minlength=P).astype(np.int64)
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


def median_ms(fn: Callable[..., object], comm: MPI.Comm, reps: int, warmup: int,
              before: Optional[Callable[[], object]] = None) -> float:
    """The median over ``reps`` of the slowest rank's time of ``fn`` (``before`` run
    untimed ahead of each call, a barrier after it)."""
    out = []
    for i in range(warmup + reps):
        arg = before() if before else None
        comm.Barrier()
        t0 = time.perf_counter()
        fn(arg) if before else fn()
        t = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
        if i >= warmup:
            out.append(t)
    return 1e3 * float(np.median(out))


def run_pattern(pat: str, n: int, frac: float, comm: MPI.Comm, unit: MPI.Datatype, reps: int,
                warmup: int) -> dict:
    P, me = comm.Get_size(), comm.Get_rank()
    idx = ghosts.read_rows(n, P, me, pat, frac)
    own = ghosts.owners(idx, n)
    remote = np.empty((idx.shape[0], 2), PETSc.IntType)
    remote[:, 0] = own
    remote[:, 1] = idx - own * n
    remote = remote.reshape(-1)
    root = ghosts.row_values(n, me, WIDTH)
    leaf = np.empty((idx.shape[0], WIDTH))

    def new_sf() -> PETSc.SF:
        sf = PETSc.SF().create(comm=PETSc.COMM_WORLD)
        sf.setFromOptions()
        return sf

    made = []

    def setup(sf: PETSc.SF) -> None:
        sf.setGraph(n, None, remote)
        sf.setUp()
        made.append(sf)

    t = {"setup": median_ms(setup, comm, reps, warmup, before=new_sf)}
    sf = made.pop()
    for s in made:
        s.destroy()

    def bcast() -> None:
        sf.bcastBegin(unit, root, leaf, MPI.REPLACE)
        sf.bcastEnd(unit, root, leaf, MPI.REPLACE)

    vals = values_of(me, idx.shape[0])
    acc = root.copy()

    def reduce(into: np.ndarray) -> None:
        sf.reduceBegin(unit, vals, into, MPI.SUM)
        sf.reduceEnd(unit, vals, into, MPI.SUM)

    # check: one bcast, one reduce into a fresh copy of the roots
    bcast()
    want = idx[:, None].astype(np.float64) + np.arange(WIDTH) / (2 * WIDTH)
    ok = np.array_equal(leaf, want)
    got = root.copy()
    reduce(got)
    exp = root.copy()
    for r in range(P):  # every rank's reads and values, recomputed here
        ir = ghosts.read_rows(n, P, r, pat, frac)
        mine = ghosts.owners(ir, n) == me
        np.add.at(exp, ir[mine] - me * n, values_of(r, ir.shape[0])[mine])
    ok = ok and np.allclose(got, exp, rtol=1e-12, atol=1e-12)
    ok = bool(comm.allreduce(bool(ok), op=MPI.LAND))
    fwd, rev = Floor(idx, n, comm), Floor(idx, n, comm, reverse=True)
    served = [ir[ghosts.owners(ir, n) == me] - me * n for ir in
              (ghosts.read_rows(n, P, r, pat, frac) for r in range(P))]
    packed = [np.empty((rows.shape[0], WIDTH)) for rows in served]

    def pack() -> None:  # the memory work alone: the rows read of this rank, taken from x
        for rows, out in zip(served, packed):
            np.take(root, rows, axis=0, out=out)

    t["bcast"] = median_ms(bcast, comm, reps, warmup)
    t["reduce"] = median_ms(lambda: reduce(acc), comm, reps, warmup)
    t["floor_a2a"] = median_ms(fwd.a2a, comm, reps, warmup)
    t["floor_p2p"] = median_ms(fwd.p2p, comm, reps, warmup)
    t["scatter_floor_a2a"] = median_ms(rev.a2a, comm, reps, warmup)
    t["scatter_floor_p2p"] = median_ms(rev.p2p, comm, reps, warmup)
    t["floor"] = min(t["floor_a2a"], t["floor_p2p"])
    t["scatter_floor"] = min(t["scatter_floor_a2a"], t["scatter_floor_p2p"])
    t["pack"] = median_ms(pack, comm, reps, warmup)
    t["floor_pack"] = t["floor"] + t["pack"]
    sf.destroy()
    return {"pattern": pat, "reads": int(comm.allreduce(idx.shape[0], op=MPI.MAX)),
            "max_peers": int(comm.allreduce(len(fwd.frm), op=MPI.MAX)), "check": ok, "ms": t}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--frac", type=float, default=0.1)
    ap.add_argument("--patterns", default=",".join(ghosts.PATTERNS))
    args, _ = ap.parse_known_args()  # the rest: PETSc's options (-sf_type, -build_twosided)
    comm = MPI.COMM_WORLD
    P, me = comm.Get_size(), comm.Get_rank()
    unit = MPI.DOUBLE.Create_contiguous(WIDTH).Commit()
    rows = [run_pattern(p, args.rows, args.frac, comm, unit, args.reps, args.warmup)
            for p in args.patterns.split(",")]
    unit.Free()
    if me == 0:
        lib = MPI.Get_library_version().split("\0", 1)[0].splitlines()[0].strip()
        ver = ".".join(map(str, PETSc.Sys.getVersion()))
        print(f"PETSc {ver} PetscSF, {P} ranks, {args.rows} rows of 64 B a rank, "
              f"{args.frac:.0%} read, {lib}; ms, median of {args.reps}, slowest rank")
        print(f"  {'pattern':>7} {'floor':>7} {'bcast':>7} {'/floor':>6} {'+pack':>6} "
              f"{'/+pack':>6} | {'floor':>7} "
              f"{'reduce':>7} {'/floor':>6} | {'setup':>7} peers ok")
        for r in rows:
            m = r["ms"]
            print(f"  {r['pattern']:>7} {m['floor']:7.2f} {m['bcast']:7.2f} "
                  f"{m['bcast'] / m['floor']:6.2f} {m['floor_pack']:6.2f} "
                  f"{m['bcast'] / m['floor_pack']:6.2f} | {m['scatter_floor']:7.2f} "
                  f"{m['reduce']:7.2f} {m['reduce'] / m['scatter_floor']:6.2f} | "
                  f"{m['setup']:7.2f} {r['max_peers']:>5} {r['check']}")
        print(json.dumps({"case": "petsc_sf", "ranks": P, "rows_per_rank": args.rows,
                          "row_bytes": 8 * WIDTH, "frac": args.frac, "petsc": ver, "mpi": lib,
                          "reps": args.reps, "check": all(r["check"] for r in rows),
                          "rows": rows}))
    return 0 if all(r["check"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
