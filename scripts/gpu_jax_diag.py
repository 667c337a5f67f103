"""A first look at pyshard.jax on a GPU when tests/gpu/test_jax_gpu.py fails (scripts/gpu-check.sh
with GPU_CHECK_THEN): one redistribute, one halo update and one FFT per line, eager and under
jit, each rank's largest difference from numpy. ``mpiexec -n 2 python scripts/gpu_jax_diag.py``."""

from __future__ import annotations

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import threading  # noqa: E402
import time  # noqa: E402
from typing import Any, Callable, Tuple  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

import pyshard as ps  # noqa: E402
import pyshard.jax as psj  # noqa: E402
from pyshard import Shard  # noqa: E402

jax.config.update("jax_enable_x64", True)


def _device_sync() -> None:
    """Wait for every stream of the GPU (cupy's runtime call), where cupy imports."""
    try:
        import cupy

        cupy.cuda.runtime.deviceSynchronize()
    except Exception:  # noqa: BLE001 - a diagnostic: without cupy, the sleep alone
        pass


def main() -> None:
    ps.config.set("PYSHARD_JAX_CUDA", True)  # (experimental: docs/jax.md)
    comm = MPI.COMM_WORLD
    mesh = ps.Mesh(comm, (comm.size,))
    r = comm.rank
    g = np.arange(6 * comm.size * 5, dtype=np.float64).reshape(6 * comm.size, 5)
    x = psj.distribute(g, mesh, [Shard(0)])
    lines = [f"rank {r}: x on {list(x.local.devices())}"]

    def check(name: str, fn: Callable[[], Tuple[Any, np.ndarray]]) -> None:
        try:
            y = fn()
            got, want = y
            # where the handler's last call wrote against where the result JAX hands back is
            where = ""
            last = getattr(ps._core, "jax_last_cuda_call", lambda: {"calls": 0})()
            if last["calls"]:
                try:
                    gp = int(got.unsafe_buffer_pointer())
                except Exception:  # noqa: BLE001 - a diagnostic
                    gp = -1
                where = (f" [handler calls {last['calls']}, step {last['step']}, thread "
                         f"{last['tid']} (python {threading.get_native_id()}; all "
                         f"{last['tids']}), overlaps {last['overlaps']}, stream "
                         f"{last['stream']:#x}, wrote {last['dst']:#x}, result at {gp:#x}"
                         f"{'' if gp == last['dst'] else ' DIFFERENT'}]")
            d = float(np.max(np.abs(np.asarray(got) - want))) if np.size(want) else 0.0
            # the same result read again after the whole device is idle, through a fresh
            # copy (JAX keeps the first host copy): right only now means writes that landed
            # after XLA called the result ready
            late = d
            if d >= 1e-9:
                time.sleep(0.05)
                _device_sync()
                late = float(np.max(np.abs(np.asarray(jnp.copy(got)) - want)))
            lines.append(f"rank {r}: {name}: max diff {d:.3g}{where}" + (
                "" if d < 1e-9 else f", read again after a device sync {late:.3g}"
                f"\n  got {np.asarray(got).ravel()[:12]}\n  want "
                f"{np.asarray(want).ravel()[:12]}"))
        except Exception as e:  # noqa: BLE001 - a diagnostic: report and go on
            lines.append(f"rank {r}: {name}: {type(e).__name__}: {str(e)[:300]}")

    for how, wrap in (("eager", lambda f: f), ("jit", jax.jit)):
        def red(x: Any = x, wrap: Any = wrap) -> Tuple[Any, np.ndarray]:
            y = wrap(lambda x: psj.redistribute(x, [Shard(1)]))(x)
            return y.local, g[y.layout.box(mesh.coords)]
        check(f"{how} redistribute S0->S1", red)

        def rep(x: Any = x, wrap: Any = wrap) -> Tuple[Any, np.ndarray]:
            y = wrap(lambda x: psj.redistribute(x, [ps.Replicate()]))(x)
            return y.local, g
        check(f"{how} redistribute S0->R", rep)

        def halo(x: Any = x, wrap: Any = wrap) -> Tuple[Any, np.ndarray]:
            p = wrap(lambda x: psj.halo_pad(x, (1, 0), periodic=True))(x)
            box = x.layout.box(mesh.coords)
            rows = np.arange(box[0].start - 1, box[0].stop + 1) % g.shape[0]
            return p, g[rows]
        check(f"{how} halo_pad", halo)

        gc = g + 1j * g[::-1]
        xc = psj.distribute(gc, mesh, [Shard(0)])
        for out in ("any", None):
            def fft(xc: Any = xc, wrap: Any = wrap, out: Any = out,
                    gc: np.ndarray = gc) -> Tuple[Any, np.ndarray]:  # fmt: skip
                y = wrap(lambda x: psj.fftn(x, placements=out))(xc)
                return y.local, np.fft.fftn(gc)[y.layout.box(mesh.coords)]
            check(f"{how} fftn -> {out}", fft)
    for rr in range(comm.size):
        if rr == r:
            print("\n".join(lines), flush=True)
        comm.Barrier()
    mesh.free()


if __name__ == "__main__":
    main()
