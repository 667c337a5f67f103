"""jaxDecomp's FFT round trip, for docs/jax.md's comparison: ``pfft3d`` then ``pifft3d`` of an
``N^3`` complex64 array under ``jax.jit``, on ``P`` host devices forced in one process
(jaxDecomp's pure-JAX backend; JAX's model, no MPI), on a ``P x 1`` device mesh (``2 x P/2``
from 4 devices). jaxDecomp is not among pyshard's dependencies::

    pip install jaxdecomp            # 0.3.1 ran with jax 0.10.2 here
    python scripts/jaxdecomp_bench.py P [N]

Prints the median of 7 round trips and whether the round trip gave the input back.
"""

from __future__ import annotations

import os
import sys
import time


def main(argv: list) -> int:
    P = int(argv[0])
    n = int(argv[1]) if len(argv) > 1 else 256
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={P}"
    import jax
    import jax.numpy as jnp
    import jaxdecomp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as Ps

    shape = (P, 1) if P < 4 else (2, P // 2)
    mesh = Mesh(np.array(jax.devices()).reshape(shape), ("x", "y"))
    g = np.random.default_rng(0).random((n, n, n)).astype(np.complex64)
    x = jax.device_put(jnp.asarray(g), NamedSharding(mesh, Ps("x", "y")))
    fwd = jax.jit(jaxdecomp.fft.pfft3d)
    back = jax.jit(jaxdecomp.fft.pifft3d)

    def trip():
        return back(fwd(x)).block_until_ready()

    ok = bool(np.allclose(np.asarray(trip()), g, atol=1e-3))
    ts = []
    for _ in range(7):
        t0 = time.perf_counter()
        trip()
        ts.append(time.perf_counter() - t0)
    print(f"jaxdecomp {jaxdecomp.__version__}, jax {jax.__version__}: pfft3d + pifft3d of "
          f"{n}^3 complex64 on {P} devices {shape}: {1e3 * float(np.median(ts)):.1f} ms; "
          f"round trip {'ok' if ok else 'WRONG'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
