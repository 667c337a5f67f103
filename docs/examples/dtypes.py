"""bfloat16 and float8: move, reduce (float32 accumulation, one rounding) and checkpoint.

Run: mpiexec -n 2 python -m mpi4py docs/examples/dtypes.py   (needs pip install 'pyshard[ml]')
"""

import json
import os
import shutil
import tempfile

import ml_dtypes
import numpy as np
from mpi4py import MPI

import pyshard as ps
from pyshard import Partial, Shard

comm = MPI.COMM_WORLD
mesh = ps.Mesh(comm, (comm.size,))
bf16 = np.dtype(ml_dtypes.bfloat16)

# move: a bfloat16 array is sharded and transposed like any other (bytes through box copies)
g = (np.arange(13 * 7) / 4 - 10).reshape(13, 7).astype(bf16)
x = ps.distribute(g, mesh, [Shard(0)])
y = x.redistribute([Shard(1)])
assert y.local.dtype == bf16 and (y.full() == g).all()

# reduce: every rank holds a partial sum; pyshard accumulates in float32 and rounds once
rng = np.random.default_rng(comm.rank)
part = rng.standard_normal((13, 7)).astype(bf16)
s = ps.from_local(part, mesh, [Partial("sum")], global_shape=(13, 7)).full()
parts = comm.allgather(part)
once = np.stack(parts).astype(np.float32).sum(0).astype(bf16)  # ml_dtypes rounds to even
assert s.dtype == bf16 and (s.view(np.uint16) == once.view(np.uint16)).all()

# checkpoint: the manifest and the .npy header name the dtype
path = comm.bcast(tempfile.mkdtemp() if comm.rank == 0 else None) + "/ckpt"
ps.save(path, {"w": y})
back = ps.load(path, mesh, {"w": [Shard(0)]})["w"]
assert (back.local == g[back.box]).all()
if comm.rank == 0:
    print("layout:      ", y.layout)
    print("reduced:     ", s.dtype, "== float32 sum rounded once:", bool((s == once).all()))
    with open(os.path.join(path, "manifest.json")) as f:
        print("manifest:    ", json.load(f)["arrays"]["w"]["dtype"])
    print("np.load:     ", np.load(os.path.join(path, "w.npy")).dtype)
    print("info:        ", ps.checkpoint_info(path)["arrays"]["w"]["dtype"])
    # out to any DLPack consumer (torch.from_dlpack(...)): a producer with DLPack's code
    cap = ps.to_dlpack(s).__dlpack__()
    print("to_dlpack:   ", type(cap).__name__, "(kDLBfloat, 16 bits; no copy)")
    shutil.rmtree(os.path.dirname(path))
