#!/usr/bin/env bash
# The device check of issue 42's device pack and issue 43's CUDA registration, run by
# scripts/gpu-check.sh after its build (GPU_CHECK_THEN=scripts/gpu-then-jax.sh, with its MPI,
# PYTHONPATH and mpiexec): gather plans on cupy (tests and timings), then pyshard.jax on the
# GPU (tests/gpu/test_jax_gpu.py) at 2 and 4 ranks. JAX there is 0.11 (pyshard.jax is
# tested on 0.10): PYSHARD_JAX_UNTESTED=1. GPU_THEN_PARTS picks the parts (default
# "unstructured gather jax"; "diag": scripts/gpu_jax_diag.py). Each part under its own
# timeout; the last line says which parts passed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
PY=${PY:-python3}
export PYSHARD_JAX_UNTESTED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
# a test that hangs prints every rank's stacks and ends after 30 s (tests/conftest.py), not at
# its part's limit with nothing said (2026-12-05: two parts hung to their 150 s, unexplained)
export PYSHARD_TEST_TIMEOUT_EACH=${PYSHARD_TEST_TIMEOUT_EACH:-30}
# XLA's command buffers (CUDA graphs) off: a handler captured into a graph would run its MPI
# once, at capture (the *nocmdbuf parts)
NOCMDBUF="${XLA_FLAGS:-} --xla_gpu_enable_command_buffer="
RES=()
FAIL=0
part() {
  local name=$1 t=$2
  shift 2
  echo "--- $name"
  local s0=$SECONDS
  # the whole output in $LOGDIR/part-NAME.log (brought back with the others), its tail here
  local log=${LOGDIR:-/tmp}/part-$name.log
  timeout -k 5 "$t" "$@" >"$log" 2>&1
  local rc=$?
  grep -v "^$\|^MPI\|^MPICH\|^mpi4py\|^rank: \|^size: \|=== MPI" "$log" | tail -60
  RES+=("$name rc=$rc $((SECONDS - s0))s")
  [ "$rc" -eq 0 ] || FAIL=1
}
PARTS=${GPU_THEN_PARTS:-unstructured gather jax}  # which parts, e.g. "diag jax"
for p in $PARTS; do
  case $p in
    unstructured)
      part unstructured-n3 60 mpiexec -n 3 "$PY" -m pytest tests/gpu/test_gpu_unstructured.py \
        -q -p no:cacheprovider --with-mpi ;;
    gather)
      for n in 2 4; do part "gather-time-n$n" 40 mpiexec -n "$n" "$PY" scripts/gpu_gather_time.py; done ;;
    diag)  # one redistribute, halo and FFT each, eager and jit: every rank's difference
      part jax-diag-n2 60 mpiexec -n 2 "$PY" scripts/gpu_jax_diag.py
      part jax-diag-nocmdbuf-n2 60 env XLA_FLAGS="$NOCMDBUF" mpiexec -n 2 "$PY" \
        scripts/gpu_jax_diag.py ;;
    jax)
      for n in ${GPU_THEN_JAX_RANKS:-2 4}; do
        part "jax-n$n" 150 mpiexec -n "$n" "$PY" -m pytest tests/gpu/test_jax_gpu.py -q \
          -p no:cacheprovider --with-mpi -rf --tb=line ${GPU_THEN_PYTEST_ARGS:-}
      done ;;
    cupy-stream)  # cupy redistributes on a non-blocking stream (each plan's first call)
      part cupy-stream-n2 90 mpiexec -n 2 "$PY" -m pytest tests/gpu/test_gpu_redistribute_1d.py \
        -q -p no:cacheprovider --with-mpi -rf -k "non_blocking or non_default" ;;
    jax-nocmdbuf)  # the same tests with XLA's command buffers off
      for n in ${GPU_THEN_JAX_RANKS:-2 4}; do
        part "jax-nocmdbuf-n$n" 150 env XLA_FLAGS="$NOCMDBUF" mpiexec -n "$n" "$PY" -m pytest \
          tests/gpu/test_jax_gpu.py -q -p no:cacheprovider --with-mpi -rf --tb=line ${GPU_THEN_PYTEST_ARGS:-}
      done ;;
  esac
done
echo "gpu-then-jax: $(printf '%s; ' "${RES[@]}")"
exit $FAIL
