"""GPU arrays: the same calls with cupy arrays; results stay on the device.

Run: mpiexec -n 2 python -m mpi4py docs/examples/gpu.py
On a machine without a GPU (or without cupy) it runs the same code on numpy arrays, so the
example is exercised everywhere; scripts/gpu-check.sh runs the GPU tests on a GPU machine.
"""

import numpy as np
from mpi4py import MPI

import pyshard as ps
from pyshard import Replicate, Shard
from pyshard.explain import explain

comm = MPI.COMM_WORLD
mesh = ps.Mesh(comm, (comm.size,))
on_gpu = ps.cuda_available()  # a CUDA build, a GPU and its driver, and cupy
if on_gpu:
    import cupy as xp

    xp.cuda.Device(comm.rank % xp.cuda.runtime.getDeviceCount()).use()
else:
    xp = np

g = xp.arange(64 * 32, dtype=xp.float32).reshape(64, 32)
x = ps.distribute(g, mesh, [Shard(0)])  # x.local is a cupy array on a GPU
y = x.redistribute([Shard(1)])  # pack kernel, MPI (direct or staged), unpack kernel
assert type(y.local) is type(g) and bool((y.local == g[y.box]).all())

# Plans do not care where the data lives; explain(plan, device="cuda") adds how GPU arrays
# reach MPI: device pointers with a CUDA-aware MPI, else staged through pinned host buffers.
if comm.rank == 0:
    info = ps.build_info()
    print(f"GPU arrays: {on_gpu}; CUDA build: {info['cuda']}; transport: {info['transport']}")
    print(explain(x.plan_to([Replicate()]), device="cuda"))
