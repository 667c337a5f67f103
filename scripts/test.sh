#!/usr/bin/env bash
# Set up (see setup.sh), lint, and run the whole test suite on the CPU build: the serial tests
# (pytest-mpi skips the MPI-marked ones without --with-mpi), then tests/mpi under mpiexec
# with --with-mpi at 1, 2, 3, 4 and 7 ranks (plus 6 and 8 for 2-D and 3-D meshes), each under
# a hard timeout so a hang fails fast. Then build the CUDA variant (nvcc, or NVIDIA's
# compiler wheels), import it, and run the serial tests and the MPI tests at 2 ranks against
# it: with no GPU here cuda_available() is False and everything else behaves as the CPU
# build (tests/gpu skips). PYSHARD_TEST_CUDA=0 skips the CUDA variant. Between the two:
# scripts/sdist-check.sh (the sdist in a fresh environment) and scripts/docs.sh (the docs).
set -uo pipefail
cd "$(dirname "$0")/.."
PYSHARD_CUDA=OFF bash scripts/setup.sh || exit 1
VENV=${PYSHARD_VENV:-.venv}
PY="$VENV/bin/python"
MPIEXEC="$VENV/bin/mpiexec"
T=${PYSHARD_TEST_TIMEOUT:-300}
fail=0
run() {
  echo
  echo "=== $*"
  "$@"
  local rc=$?
  if [ $rc -ne 0 ]; then
    echo "=== FAILED (exit $rc): $*"
    fail=$((fail + 1))
  fi
}
run "$VENV/bin/ruff" check pyshard tests examples
run timeout "$T" "$PY" -m pytest tests -p no:cacheprovider
for n in ${PYSHARD_TEST_RANKS:-1 2 3 4 6 7 8}; do
  run timeout "$T" "$MPIEXEC" -n "$n" "$PY" -m pytest tests/mpi -q -p no:cacheprovider --with-mpi
done
# Packaging and docs: the sdist installed (not editable) into a fresh environment with only
# pip's MPICH, mpi4py and numpy, and the demo run from outside the checkout; then the docs
# (Sphinx, warnings as errors; every example in them run). Both before the CUDA variant
# replaces the core in .venv, so the docs build against the CPU build.
run timeout "${PYSHARD_SDIST_TIMEOUT:-600}" bash scripts/sdist-check.sh
run timeout "${PYSHARD_DOCS_TIMEOUT_ALL:-300}" bash scripts/docs.sh
if [ "${PYSHARD_TEST_CUDA:-1}" = 1 ]; then
  echo
  echo "=== the CUDA variant"
  if PYSHARD_CUDA=ON bash scripts/setup.sh; then
    run "$PY" -c "import pyshard as ps; i = ps.build_info(); print('build_info:', i); \
assert i['cuda'] is not None, 'the CUDA variant has no CUDA'; \
assert ps.cuda_available() == (i['cuda_device'] and ps._backend.cupy() is not None)"
    run timeout "$T" "$PY" -m pytest tests -q -p no:cacheprovider
    run timeout "$T" "$MPIEXEC" -n 2 "$PY" -m pytest tests/mpi tests/gpu -q -p no:cacheprovider \
      --with-mpi
  else
    echo "=== FAILED: PYSHARD_CUDA=ON bash scripts/setup.sh"
    fail=$((fail + 1))
  fi
fi
echo
if [ $fail -ne 0 ]; then
  echo "pyshard tests: $fail run(s) FAILED"
  exit 1
fi
echo "pyshard tests: every run passed"
