#!/usr/bin/env bash
# What the GPU machine's JAX (0.11 there; pyshard.jax is tested on 0.10) offers pyshard.jax:
# the private names _compat uses, the FFI headers, and pyshard.jax's CPU tests under that JAX
# (PYSHARD_JAX_UNTESTED=1). Run after scripts/gpu-check.sh (it uses that build and MPI).
# Brings back $OUT/jax-src.tgz (jax's Python sources) and $OUT/jax-probe.log.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
OUTD=${OUT:-/tmp/pyshard-gpu-check}
PY=${PYTHON:-python3}
{
"$PY" - <<'PYEOF'
import importlib, jax, jaxlib, os
print("jax", jax.__version__, "jaxlib", jaxlib.__version__, "from", jax.__file__)
print("devices", jax.devices())
for mod, name in [("jax._src.effects", "lowerable_effects"), ("jax._src.effects", "ordered_effects"),
                  ("jax._src.effects", "control_flow_allowed_effects"),
                  ("jax._src.effects", "custom_derivatives_allowed_effects"),
                  ("jax._src.effects", "remat_allowed_effects"), ("jax._src.core", "abstract_token"),
                  ("jax.core", "abstract_token"), ("jax._src.dispatch", "apply_primitive"),
                  ("jax.extend.core", "Primitive"), ("jax.interpreters.mlir", "TokenSet"),
                  ("jax._src.interpreters.mlir", "TokenSet"), ("jax.ffi", "include_dir"),
                  ("jax.ffi", "register_ffi_target"), ("jax.ffi", "ffi_lowering")]:
    try:
        m = importlib.import_module(mod)
        print(f"{mod}.{name}:", "yes" if hasattr(m, name) else "NO")
    except Exception as e:
        print(f"{mod}: import failed {e!r}")
print("include_dir", jax.ffi.include_dir())
PYEOF
} 2>&1 | tee "$OUTD/jax-probe.log"
JD=$("$PY" -c 'import jax, os; print(os.path.dirname(jax.__file__))')
INC=$("$PY" -c 'import jax; print(jax.ffi.include_dir())')
tar czf "$OUTD/jax-src.tgz" --exclude='*.pyc' --exclude='__pycache__' -C "$(dirname "$JD")" jax \
  -C "$(dirname "$(dirname "$INC")")" "$(basename "$(dirname "$INC")")/$(basename "$INC")" 2>&1 | tail -3
ls -l "$OUTD/jax-src.tgz"
# pyshard.jax's CPU tests under this JAX (the build and MPI that gpu-check set up)
SITE=$(find /tmp/pyshard-mpi -type d -name site-packages | head -1)
export PATH="/tmp/pyshard-mpi/bin:$PATH" LD_LIBRARY_PATH="/tmp/pyshard-mpi/lib:${LD_LIBRARY_PATH:-}"
export MPI4PY_LIBMPI=/tmp/pyshard-mpi/lib/libmpi.so.12 HYDRA_LAUNCHER=fork PYTHONSAFEPATH=1
export PYTHONPATH="/tmp/pyshard-site:$SITE" PYSHARD_JAX_UNTESTED=1 JAX_PLATFORMS=cpu
timeout 90 mpiexec -n 2 "$PY" -m pytest tests/mpi/test_jax.py --with-mpi -x -q -p no:cacheprovider 2>&1 |
  tail -40 | tee -a "$OUTD/jax-probe.log"
