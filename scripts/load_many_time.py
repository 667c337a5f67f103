"""Time ``pyshard.load`` of a checkpoint of many small arrays saved in one layout and loaded
into another: the fused path (``redistribute_many`` where it helps) against direct reads.

    mpiexec -n 4 python scripts/load_many_time.py [--arrays 200] [--reps 5] [--target S(1)]

Saves ``--arrays`` float32 arrays of (64..256) x (64..256) (deterministic shapes) as Shard(0)
on a 1-D mesh of every rank, then loads them as ``--target`` ``--reps`` times; prints the
median (slowest rank, between barriers) with and without verification, and the collectives
one load ran (``comm_stats``). ``--compare`` times, in the same run, the fused path (small
arrays read as row blocks, one ``redistribute_many`` per batch) and the direct reads of
every target box (``PYSHARD_LOAD_FUSE=0``: each array by its own
reads).
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile

import numpy as np
from mpi4py import MPI

import pyshard as ps
from pyshard.bench.timing import timed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arrays", type=int, default=200)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--target", default="S(1)")
    ap.add_argument("--compare", action="store_true", help="time the direct reads too")
    a = ap.parse_args()
    comm = MPI.COMM_WORLD
    mesh = ps.Mesh(comm, (comm.size,))
    rng = np.random.default_rng(19)
    shapes = [tuple(int(v) for v in rng.integers(64, 257, 2)) for _ in range(a.arrays)]
    arrays = {}
    for k, sh in enumerate(shapes):
        g = np.arange(sh[0] * sh[1], dtype=np.float32).reshape(sh) + k
        arrays[f"a{k:03d}"] = ps.distribute(g, mesh, [ps.Shard(0)])
    nbytes = sum(sh[0] * sh[1] * 4 for sh in shapes)
    root = comm.bcast(tempfile.mkdtemp(prefix="pyshard-loadmany-") if comm.rank == 0 else None)
    ckpt = os.path.join(root, "ckpt")
    try:
        ps.save(ckpt, arrays, sync=False)
        targets = {n: [a.target] for n in arrays}
        modes = [("fused", True), ("direct", False)] if a.compare else [("default", None)]
        rows = []
        for verify in (False, True):
            first, got, ts = {}, {}, {label: [] for label, _ in modes}

            def once(fuse: object, verify: bool = verify) -> float:
                if fuse is not None:
                    ps.config.set("PYSHARD_LOAD_FUSE", fuse)
                return timed(lambda: ps.load(ckpt, mesh, targets, verify=verify), comm, 1, 0)[0]

            for label, fuse in modes:  # the first load of each (the first fused one is cold)
                before = ps.comm_stats()
                first[label] = once(fuse)
                after = ps.comm_stats()
                got[label] = {k: v - before.get(k, 0) for k, v in after.items()}
            for _ in range(a.reps):  # the modes interleaved, so that load on the machine is shared
                for label, fuse in modes:
                    ts[label].append(once(fuse))
            for label, _ in modes:
                count = {k: v for k, v in got[label].items() if v}
                rows.append((label, verify, first[label], ts[label], count))
        out = ps.load(ckpt, mesh, targets)
        ok = all(np.array_equal(out[n].local, arrays[n].full()[out[n].box]) for n in arrays)
        ok = comm.allreduce(ok, op=MPI.LAND)
        if comm.rank == 0:
            print(
                f"{a.arrays} arrays, {nbytes / 2**20:.1f} MiB float32, S(0) -> {a.target}, "
                f"{comm.size} ranks, reps={a.reps}, correct={ok}"
            )
            for label, verify, first, ts, got in rows:
                print(
                    f"  {label:7s} verify={int(verify)}: median {np.median(ts) * 1e3:8.1f} ms "
                    f"(reps {' '.join(f'{t * 1e3:.1f}' for t in ts)}; first load "
                    f"{first * 1e3:.1f})  core collectives {got}"
                )
    finally:
        comm.Barrier()
        if comm.rank == 0:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
