#!/usr/bin/env bash
# The device check: one prepared script for a GPU machine (an H200, 16 cores, no
# package registry; Python 3.12, CUDA 13 with nvcc, cupy-cuda13x, mpi4py, pybind11,
# scikit-build-core, cmake, ninja, pytest). Run from anywhere as `bash scripts/gpu-check.sh`.
#
# Beforehand, on a machine with PyPI: `bash scripts/gpu-wheels.sh` puts the cp312 wheels of
# mpich and mpi4py into .whl/ (gitignored); they travel with the working tree. Then this:
#   1. prints the GPU (nvidia-smi -L), nvcc, and which MPI the image's own mpi4py loads;
#   2. installs .whl/*.whl under /tmp/pyshard-mpi (--prefix: pip's --target would drop the
#      mpich wheel's lib/ with libmpi) and puts them first on PYTHONPATH and PATH, so the job
#      knows its MPI; prints the MPI that mpi4py then loads;
#   3. builds pyshard with CUDA (sm_90) against that MPI's mpicc into /tmp/pyshard-site;
#   4. runs tests/gpu under mpiexec at 1, 2, 3 and 4 ranks (redistributes, checkpoints, halo
#      updates through the CUDA pack kernel, redistributes in flight, the heat example on
#      cupy arrays bit for bit against numpy: test_gpu_halo.py);
#   5. runs `python -m pyshard bench --device cuda --shape 8192x8192` at 2 and 4 ranks, and
#      scripts/gpu_halo_time.py (halo updates on cupy against numpy) at 2 and 4 ranks;
#   6. if time is left, all of tests/gpu at 8 ranks (the 2x2x2 mesh cases);
# and prints one summary line. GPU_CHECK_THEN=FILE runs the bash script FILE after the build
# (with the same MPI, PYTHONPATH and mpiexec; GPU_CHECK_THEN_MAX seconds, default 300) instead
# of steps 4-6. Every step runs under a timeout inside an overall budget
# (GPU_CHECK_BUDGET seconds, default 450: done in under 8 minutes); a failing step is reported
# and the script goes on to the summary. Exit status 0 when every step passed.
# Logs: $OUT (when set; else /tmp/pyshard-gpu-check): gpu-check.log (everything),
# build-full.log, bench-cuda.jsonl; one log per step in /tmp/pyshard-gpu-check-steps.
# shellcheck disable=SC2317  # the step functions run through `bash -c NAME` (exported)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
T0=$SECONDS
BUDGET=${GPU_CHECK_BUDGET:-450}
PFX=/tmp/pyshard-mpi
PSD=/tmp/pyshard-site
PY=${PYTHON:-python3}
LOGDIR=${OUT:-/tmp/pyshard-gpu-check}
# one log per step beside, outside $OUT (the device tool brings back at most 8 files; all of
# the steps' output is in gpu-check.log too)
STEPLOGS=/tmp/pyshard-gpu-check-steps
mkdir -p "$LOGDIR" "$STEPLOGS"

SUMMARY=()
FAILED=0
# step NAME MAX_SECONDS RESERVE_SECONDS CMD...: run CMD (a command, or one of the functions
# below, exported) under a timeout of at most MAX seconds that leaves RESERVE seconds of the
# budget for later steps; log to $LOGDIR/NAME.log.
step() {
  local name=$1 max=$2 reserve=$3
  shift 3
  if declare -F "$1" >/dev/null; then set -- bash -c "$1"; fi
  local left=$((BUDGET - (SECONDS - T0) - reserve))
  local t=$((max < left ? max : left))
  if [ "$t" -lt 20 ]; then
    echo "=== $name: SKIPPED (time budget spent)"
    SUMMARY+=("$name SKIPPED")
    FAILED=1
    return 1
  fi
  echo
  echo "=== $name (timeout ${t}s): $*"
  local s0=$SECONDS
  timeout -k 10 "$t" "$@" 2>&1 | tee "$STEPLOGS/$name.log"
  local rc=${PIPESTATUS[0]}
  local dt=$((SECONDS - s0))
  if [ "$rc" -eq 0 ]; then
    SUMMARY+=("$name ok ${dt}s")
  elif [ "$rc" -eq 5 ]; then  # pytest: no test ran (every module skipped: no GPU?)
    SUMMARY+=("$name NO TESTS RAN ${dt}s")
    FAILED=1
  elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    SUMMARY+=("$name TIMEOUT ${dt}s")
    FAILED=1
  else
    SUMMARY+=("$name FAILED rc=$rc ${dt}s")
    FAILED=1
  fi
  echo "=== $name: rc=$rc in ${dt}s"
  return "$rc"
}

# pytest's counts line ("12 passed, 3 skipped in 40.1s") of a step's log, for the summary
counts() {
  grep -E '[0-9]+ (passed|failed|skipped|error)' "$STEPLOGS/$1.log" 2>/dev/null | tail -1 |
    sed -E 's/^=+ //; s/ =+$//; s/ in [0-9.]+s.*//'
}

info() {
  nvidia-smi -L || echo "(nvidia-smi failed)"
  nvidia-smi --query-gpu=name,memory.total,driver_version,compute_mode --format=csv,noheader ||
    true
  "$PY" --version
  NVCC=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null || true)
  echo "nvcc: ${NVCC:-none}"; [ -n "$NVCC" ] && "$NVCC" --version | tail -2
  df -h /dev/shm | tail -1
  echo "the image's mpi4py (before the wheels):"
  "$PY" -c 'import mpi4py; from mpi4py import MPI
print(" ", mpi4py.__version__, mpi4py.__file__)
print(" ", MPI.Get_library_version().splitlines()[0].strip())' || echo "  (mpi4py does not load)"
  "$PY" -c 'import cupy; print("cupy", cupy.__version__, "CUDA runtime",
cupy.cuda.runtime.runtimeGetVersion(), "devices", cupy.cuda.runtime.getDeviceCount())' ||
    echo "(cupy does not load)"
}

wheels() {
  shopt -s nullglob
  local whl=(.whl/*.whl)
  shopt -u nullglob
  if [ ${#whl[@]} -eq 0 ]; then
    echo "no wheels in .whl/ (run scripts/gpu-wheels.sh on a machine with PyPI); using the"
    echo "image's mpi4py and the mpicc on PATH"
    return 1
  fi
  rm -rf "$PFX"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --ignore-installed --prefix "$PFX" "${whl[@]}" ||
    return 1
  ls "$PFX/lib"/libmpi.so* "$PFX/bin/mpicc" "$PFX/bin/mpiexec" || return 1
}

build() {
  rm -rf "$PSD"
  local nvcc
  nvcc=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null || true)
  echo "MPICC=$MPICC nvcc=${nvcc:-none}"
  local args=(--no-index --no-build-isolation --no-deps --no-compile
    -Ccmake.define.PYSHARD_CUDA=ON -Ccmake.define.CMAKE_CUDA_ARCHITECTURES=90
    -Ccmake.define.MPI_C_COMPILER="$MPICC" -Cbuild-dir=build/gpu-check --target "$PSD")
  [ -n "$nvcc" ] && args+=(-Ccmake.define.CMAKE_CUDA_COMPILER="$nvcc")
  CMAKE_BUILD_PARALLEL_LEVEL=16 "$PY" -m pip install -v "${args[@]}" . >"$LOGDIR/build-full.log" 2>&1
  local rc=$?
  grep -E "pyshard:|CUDA|MPI|error|Error|warning: |Successfully" "$LOGDIR/build-full.log" |
    tail -40
  [ "$rc" -eq 0 ] || { tail -30 "$LOGDIR/build-full.log"; return 1; }
  ldd "$PSD"/pyshard/_core*.so | grep -E "mpi|cuda" || true
  "$PY" -c 'import json, pyshard as ps
print("pyshard from", ps.__file__)
print(json.dumps(ps.build_info()))
print("cuda_available:", ps.cuda_available())
import importlib.util
if importlib.util.find_spec("jax") is not None:  # (ml_dtypes after the core: a crash once)
    import jax
    print("jax", jax.__version__, "imports after pyshard and cupy")
raise SystemExit(0 if ps.cuda_available() else 3)'
}

SHOW_MPI='import mpi4py; from mpi4py import MPI
print("mpi4py", mpi4py.__version__, "from", mpi4py.__file__)
print("MPI mpi4py loads:", MPI.Get_library_version().splitlines()[0].strip())'

main() {
  export PY PFX PSD LOGDIR STEPLOGS
  export -f info wheels build
  echo "=== pyshard gpu-check: $(date -u +%FT%TZ) on $(hostname), budget ${BUDGET}s, logs in $LOGDIR"
  step info 60 0 info

  # MPI: the wheels' mpich + mpi4py first, else whatever the image has
  SITE=""
  if step wheels 90 0 wheels; then
    # --ignore-installed: the image's own mpi4py (same version, linked to its Open MPI) would
    # otherwise count as installed and the wheel be skipped
    SITE=$(find "$PFX" -type d -name site-packages | head -1)
    export PATH="$PFX/bin:$PATH"
    export LD_LIBRARY_PATH="$PFX/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export MPI4PY_LIBMPI="$PFX/lib/libmpi.so.12"
    export MPICC="$PFX/bin/mpicc"
    echo "mpi4py and mpich from $SITE and $PFX"
  else
    export MPICC=${MPICC:-$(command -v mpicc || true)}
  fi
  # pyshard from its install dir, never the source tree in the working directory
  export PYTHONPATH="$PSD${SITE:+:$SITE}${PYTHONPATH:+:$PYTHONPATH}"
  export PYTHONSAFEPATH=1
  export HYDRA_LAUNCHER=${HYDRA_LAUNCHER:-fork}
  MPIEXEC=$(command -v mpiexec || echo mpiexec)
  "$PY" -c "$SHOW_MPI" || echo "mpi4py does not load"
  echo "mpiexec: $MPIEXEC"

  step build 240 200 build
  BUILD_OK=$?

  if [ -n "${GPU_CHECK_THEN:-}" ]; then  # a given script instead of the standard steps
    step then "${GPU_CHECK_THEN_MAX:-300}" 0 bash "$GPU_CHECK_THEN"
    echo "gpu-check (then $GPU_CHECK_THEN only): $(printf '%s; ' "${SUMMARY[@]}")"
    return $FAILED
  fi
  if [ -n "${GPU_CHECK_ONLY_HALO:-}" ]; then  # the halo timings alone (a short lease)
    for n in 1 2 4; do
      step "halo-n$n" 120 0 "$MPIEXEC" -n "$n" "$PY" scripts/gpu_halo_time.py
    done
    echo "gpu-check (halo timings only): $(printf '%s; ' "${SUMMARY[@]}")"
    return $FAILED
  fi
  for n in 1 2 3 4; do
    step "tests-n$n" 150 150 "$MPIEXEC" -n "$n" "$PY" -m pytest tests/gpu -q -p no:cacheprovider --with-mpi
  done

  rm -f "$LOGDIR/bench-cuda.jsonl"
  for n in 2 4; do
    step "bench-n$n" 200 0 "$MPIEXEC" -n "$n" "$PY" -m pyshard bench --device cuda \
      --shape 8192x8192 --json "$LOGDIR/bench-cuda.jsonl"
  done
  for n in 2 4; do
    step "halo-n$n" 120 0 "$MPIEXEC" -n "$n" "$PY" scripts/gpu_halo_time.py
  done

  # extra, while time is left: all of tests/gpu at 8 ranks (the 2x2x2 mesh cases need 8)
  if [ $((BUDGET - (SECONDS - T0))) -ge 100 ]; then
    step tests-n8 150 0 "$MPIEXEC" -n 8 "$PY" -m pytest --with-mpi tests/gpu -q -p no:cacheprovider
  else
    SUMMARY+=("tests-n8 not run (no time left)")
  fi

  BENCH_LINE=$(cat "$STEPLOGS"/bench-n*.log 2>/dev/null |
    grep -E '^pyshard bench --device cuda: [0-9]+ ranks, transport' | tr '\n' ' ')
  TESTS=""
  for n in 1 2 3 4; do TESTS+=" n$n: $(counts "tests-n$n");"; done
  TESTS+=" n8: $(counts tests-n8)"
  echo
  STEPS=$(printf '%s; ' "${SUMMARY[@]}")
  echo "=== steps: ${STEPS%; }"
  [ "$BUILD_OK" -eq 3 ] && echo "=== the build imports but pyshard.cuda_available() is False"
  echo "gpu-check: $([ $FAILED -eq 0 ] && echo PASS || echo FAIL) in $((SECONDS - T0))s |" \
    "${STEPS%; } | tests:$TESTS | ${BENCH_LINE:-bench: no summary line}"
  return $FAILED
}

main 2>&1 | tee -a "$LOGDIR/gpu-check.log"
exit "${PIPESTATUS[0]}"
