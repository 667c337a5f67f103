"""The JAX-native peer of scripts/jax_bench.py's transpose: ``shard_map`` + ``lax.all_to_all``
of an even 4096^2 float32 array, rows to columns, on P host devices forced in one process
(JAX's own model: one process, XLA's collectives; no MPI). Prints the median of 7 calls.

    python scripts/jax_shard_map_bench.py P
"""

from __future__ import annotations

import os
import sys
import time


def main() -> None:
    P, n = int(sys.argv[1]), 4096
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={P}"
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental.shard_map import shard_map
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as PS

    mesh = Mesh(np.array(jax.devices()), ("x",))
    g = np.random.default_rng(0).random((n, n), dtype=np.float32)
    x = jax.device_put(jnp.asarray(g), NamedSharding(mesh, PS("x", None)))

    def transpose(block: jax.Array) -> jax.Array:  # (n/P, n) -> (n, n/P)
        return jax.lax.all_to_all(block, "x", split_axis=1, concat_axis=0, tiled=True)

    f = jax.jit(shard_map(transpose, mesh=mesh, in_specs=PS("x", None), out_specs=PS(None, "x")))
    assert np.array_equal(np.asarray(f(x)), g)
    ts = []
    for _ in range(7):
        t0 = time.perf_counter()
        f(x).block_until_ready()
        ts.append(time.perf_counter() - t0)
    print(f"shard_map + lax.all_to_all, {P} host devices in one process, {n}^2 float32: "
          f"{np.median(ts) * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
