"""Cross-memory attach against the segment path by run length (the evidence for
``pyshard.geometry.ATTACH_MIN_RUN``): S0->S2 and S2->S0 of 3-D float32 arrays of 32 MiB into a
private ``out=``, the last dim W so that each block's runs are W/P*4 bytes, ``PYSHARD_CMA``
off and on alternated in one process (each the slowest rank's median of 9 calls, two
rounds, ms). Since attach_runs decides, short runs take the segment either way; set
``ATTACH_MIN_RUN`` to 0 in pyshard/geometry.py to see what attach costs on them.

    mpiexec -n 2 python scripts/cma_runs_ab.py
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

import pyshard as ps
from pyshard.bench.timing import median_s


def main() -> int:
    comm = MPI.COMM_WORLD
    p = comm.size
    mesh = ps.Mesh(comm, (p,))
    for w in (8, 64, 256, 1024, 4096):
        n01 = int((8 * 2**20 // w) ** 0.5)
        shape = (n01, n01, w)
        for a, b in ((0, 2), (2, 0)):
            lay = ps.Layout(shape, np.float32, mesh.shape, [ps.Shard(a)])
            x = ps.from_local(np.ones(lay.local_shape(mesh.coords), np.float32), mesh,
                              [ps.Shard(a)], shape)  # fmt: skip
            out = np.empty(x.layout.replace([ps.Shard(b)]).local_shape(mesh.coords), np.float32)
            res: dict = {False: [], True: []}
            for _ in range(2):
                for on in (False, True):
                    with ps.config.override(PYSHARD_CMA=on):
                        t = median_s(lambda x=x, b=b, out=out: x.redistribute(
                            [ps.Shard(b)], out=out), comm, 9, warmup=2)  # fmt: skip
                        res[on].append(round(t * 1e3, 2))
            if comm.rank == 0:
                print(f"{shape} S{a}->S{b}, runs of {w // p * 4} B: segment {res[False]}, "
                      f"attach {res[True]} ms", flush=True)  # fmt: skip
    mesh.free()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
