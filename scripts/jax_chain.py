"""Where pyshard.jax's time over the numpy front end goes: one program with 1, 2 and 4
exchanges against the numpy call into a private ``out=`` (the same core step) and into a
pooled result, and a tiny call against a plain ``jit`` (the dispatch), alternated in one
process (docs/jax.md, "Several exchanges in one program").

    mpiexec -n P python scripts/jax_chain.py [--n 4096] [--small 64] [--rounds 25]

Each row: the slowest rank's median, ms. ``jitK``: ``jax.jit`` of K redistributes in a chain
(S0->S1->S0->...), so a cost paid once a call shows as jitK < K x jit1.
"""

from __future__ import annotations

import argparse
from typing import Callable, Dict

import jax
import jax.numpy as jnp
import numpy as np
from mpi4py import MPI

import pyshard as ps
import pyshard.jax as psj
from pyshard import Shard
from pyshard._backend import malloc_name
from pyshard.bench.timing import alternated


def chain(k: int) -> Callable:
    def f(x: psj.Sharded) -> psj.Sharded:
        for i in range(k):
            x = psj.redistribute(x, [Shard((i + 1) % 2)])
        return x

    return jax.jit(f)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--small", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=25)
    a = ap.parse_args()
    comm = MPI.COMM_WORLD
    P, n = comm.size, a.n
    mesh = ps.Mesh(comm, (P,))
    lay = ps.Layout((n, n), np.float32, mesh.shape, [Shard(0)])
    local = np.random.default_rng(comm.rank).random(lay.local_shape(mesh.coords),
                                                     dtype=np.float32)
    x = ps.from_local(local, mesh, [Shard(0)], (n, n))
    xj = psj.from_local(jnp.asarray(local), mesh, [Shard(0)], (n, n))
    s1 = [Shard(1)]
    out = np.empty(ps.Layout((n, n), np.float32, mesh.shape, s1).local_shape(mesh.coords),
                   np.float32)
    add = jax.jit(lambda v: v + 1.0)
    loc = xj.local
    f1, f2, f4 = chain(1), chain(2), chain(4)
    m = a.small
    xs = psj.distribute(np.arange(m * m, dtype=np.float32).reshape(m, m), mesh, [Shard(0)])
    ls = xs.local
    xn = ps.distribute(np.arange(m * m, dtype=np.float32).reshape(m, m), mesh, [Shard(0)])
    fns: Dict[str, Callable[[], object]] = {
        "numpy into out=": lambda: x.redistribute(s1, out=out),
        "numpy pooled": lambda: x.redistribute(s1),
        "jit1": lambda: f1(xj).local.block_until_ready(),
        "jit2": lambda: f2(xj).local.block_until_ready(),
        "jit4": lambda: f4(xj).local.block_until_ready(),
        "jit of an add (no pyshard)": lambda: add(loc).block_until_ready(),
        f"numpy {m}^2": lambda: xn.redistribute(s1),
        f"jit1 {m}^2": lambda: f1(xs).local.block_until_ready(),
        f"jit of an add {m}^2": lambda: add(ls).block_until_ready(),
    }
    for fn in fns.values():
        for _ in range(3):
            fn()
    r = alternated(fns, comm, a.rounds)
    if comm.rank == 0:
        print(f"{P} ranks, {n}^2 float32 S0->S1 (malloc: {malloc_name()}), ms:")
        for k, v in r.items():
            print(f"  {k:28s} {v * 1e3:8.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
