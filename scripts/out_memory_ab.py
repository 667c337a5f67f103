"""Where pyshard.jax's CPU transpose loses to the numpy front end: the numpy path's 4096^2
S0->S1 transpose into each kind of result memory, alternated in one run.

    mpiexec -n 2 python scripts/out_memory_ab.py [--n 4096] [--reps 15] [--rounds 2]

- ``auto``: the result from pyshard's pool, in node-shared memory (node peers write into it
  with a plain copy);
- ``private``: ``out=`` a warm private array (node peers write into it by
  ``process_vm_writev``, as they write into XLA's buffers under ``jit``);
- ``private 4k`` / ``private huge``: the same in an ``mmap`` advised ``MADV_NOHUGEPAGE`` /
  ``MADV_HUGEPAGE``;
- ``fresh``: ``out=`` a new ``np.empty`` each call (its pages faulted in by the writes).

Each case once a round, in turn (pyshard.bench.timing.alternated); milliseconds, the median
of ``--reps`` rounds of the slowest rank's times; one line per ``--rounds`` on rank 0.
"""

from __future__ import annotations

import argparse
import mmap
from typing import Callable, Dict, Hashable

import numpy as np
from mpi4py import MPI

import pyshard as ps
from pyshard import Shard
from pyshard.bench.timing import alternated


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    comm = MPI.COMM_WORLD
    n = a.n
    mesh = ps.Mesh(comm, (comm.size,))
    lay = ps.Layout((n, n), np.float32, mesh.shape, [Shard(0)])
    local = np.random.default_rng(comm.rank).random(lay.local_shape(mesh.coords),
                                                     dtype=np.float32)
    x = ps.from_local(local, mesh, [Shard(0)], (n, n))
    shape = x.redistribute([Shard(1)]).local.shape
    maps = []

    def mapped(advice: int) -> np.ndarray:
        m = mmap.mmap(-1, int(np.prod(shape)) * 4)
        m.madvise(advice)
        maps.append(m)
        out = np.frombuffer(m, np.float32).reshape(shape)
        out[...] = 0
        return out

    private = np.zeros(shape, np.float32)
    p4k, phuge = mapped(mmap.MADV_NOHUGEPAGE), mapped(mmap.MADV_HUGEPAGE)
    cases: Dict[Hashable, Callable[[], object]] = {
        "auto": lambda: x.redistribute([Shard(1)]),
        "private": lambda: x.redistribute([Shard(1)], out=private),
        "private 4k": lambda: x.redistribute([Shard(1)], out=p4k),
        "private huge": lambda: x.redistribute([Shard(1)], out=phuge),
        "fresh": lambda: x.redistribute([Shard(1)], out=np.empty(shape, np.float32)),
    }

    for r in range(a.rounds):
        got = alternated(cases, comm, a.reps + 3)  # the first 3 rounds left out
        if comm.rank == 0:
            print(f"round {r}, {comm.size} ranks, {n}^2 float32, ms: "
                  + ", ".join(f"{k} {v * 1e3:.2f}" for k, v in got.items()), flush=True)
    mesh.free()


if __name__ == "__main__":
    main()
