"""The pyshard.jax FFT round trip with its c2c passes through scipy.fft (``pyshard_fft``, the
default on CPU) against the same program with ``jnp.fft`` passes (``PYSHARD_JAX_FFT=jnp``),
both compiled in one process and called alternately, so that the machine's load falls on
both alike.

    mpiexec -n 4 python scripts/jax_fft_ab.py [--n 256] [--reps 12]

A 256^3 complex64 array, ``[Shard(0)]`` on a 1-D mesh: ``fftn`` to wherever its last pass
ends (``placements="any"``), then ``ifftn`` back to ``[Shard(0)]``, in one ``jax.jit``.
Prints, on rank 0, the slowest rank's median and its three fastest calls, in ms, per mode.
"""

from __future__ import annotations

import argparse
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from mpi4py import MPI

import pyshard as ps
import pyshard.jax as psj
from pyshard import Shard


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=256)
    ap.add_argument("--reps", type=int, default=12)
    a = ap.parse_args()
    comm = MPI.COMM_WORLD
    n = a.n
    mesh = ps.Mesh(comm, (comm.size,))
    shape = ps.Layout((n, n, n), np.complex64, (comm.size,), [Shard(0)]).local_shape(mesh.coords)
    rng = np.random.default_rng(comm.rank)
    local = (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(np.complex64)
    x = psj.from_local(jnp.asarray(local), mesh, [Shard(0)], (n, n, n))
    fs = {}
    for mode in ("jnp", "auto"):
        os.environ["PYSHARD_JAX_FFT"] = mode  # read when the function is traced (first call)
        f = jax.jit(lambda x: psj.ifftn(psj.fftn(x, placements="any"), placements=[Shard(0)]))
        y = jax.block_until_ready(f(x).local)
        assert np.allclose(np.asarray(y), local, atol=1e-4), mode
        fs[mode] = f
    ts: dict = {m: [] for m in fs}
    for i in range(a.reps):
        for m in (("jnp", "auto") if i % 2 else ("auto", "jnp")):
            comm.Barrier()
            t0 = time.perf_counter()
            jax.block_until_ready(fs[m](x).local)
            ts[m].append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
    if comm.rank == 0:
        for m, v in ts.items():
            best = ", ".join(f"{t * 1e3:.0f}" for t in sorted(v)[:3])
            print(f"jax fft round trip {n}^3 complex64, {comm.size} ranks, passes "
                  f"{'scipy (pyshard_fft)' if m == 'auto' else 'jnp.fft'}: median "
                  f"{np.median(v) * 1e3:.1f} ms (fastest {best})", flush=True)
    mesh.free()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
