#!/usr/bin/env bash
# Set up (see setup.sh), lint, and run the whole test suite on the CPU build: the serial tests
# (pytest-mpi skips the MPI-marked ones without --with-mpi), then tests/mpi under mpiexec
# with --with-mpi at 1, 2, 3, 4 and 7 ranks (plus 6 and 8 for 2-D and 3-D meshes), each under
# a hard timeout so a hang fails fast; then at 3 ranks with node-shared memory taken for every
# step however small (PYSHARD_SHM_MIN_BYTES=0), and at 4 ranks twice more: on simulated nodes
# of two ranks (PYSHARD_NODE_SIZE=2) and with node-shared memory off (PYSHARD_TRANSPORT=mpi).
# Between the two builds: scripts/sdist-check.sh (the sdist in a fresh environment) and
# scripts/docs.sh (the docs, against the CPU build).
#
# Then the CUDA variant (nvcc, or NVIDIA's compiler wheels) replaces the core in .venv, and
# only what that build changes runs again: its build_info, the core's own tests and the CUDA
# kernels on the host (tests/test_core.py, tests/test_kernels_on_host.py), the staged
# transport at 2 ranks (tests/mpi/test_staged.py) and tests/gpu. The rest of the suite is
# the same Python over the same host packer, already run above. With no GPU here
# cuda_available() is False and tests/gpu skips. PYSHARD_TEST_CUDA=0 skips the CUDA variant.
#
# Then the MPI matrix: scripts/test-mpi.sh builds pyshard from a clean state against each
# other MPI library in a venv of its own (PYSHARD_TEST_MPIS, default: pip's Open MPI 5, pip's
# Intel MPI, Debian's Open MPI 4.1 from apt-get) and runs tests/mpi at 1, 2, 3 and 4 ranks and
# the demo; impi-plain: a plain `pip install .` against pip's Intel MPI with no I_MPI_ROOT,
# test_redistribute_1d.py at 2 ranks and the demo; the 2^31-byte message at 2 ranks on both Open MPIs (no MPI-4 large-count calls:
# the datatype path). CI runs as root, which Open MPI refuses unless its documented variables
# say so: they are set here for that case only (OMPI_ALLOW_RUN_AS_ROOT=1
# OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1), never as launcher flags. PYSHARD_TEST_MPIS="" skips it.
#
# At the end: a table of every stage's wall time and result, and the MPI matrix (library,
# version, run, tests passed / skipped / failed, seconds). Exit status non-zero when any
# stage failed; the last line says whether every run passed.
set -uo pipefail
cd "$(dirname "$0")/.."
VENV=${PYSHARD_VENV:-.venv}
PY="$VENV/bin/python"
MPIEXEC="$VENV/bin/mpiexec"
T=${PYSHARD_TEST_TIMEOUT:-600}  # a stage's hard limit (tests/mpi at 8 ranks on 2 cores: about 4 minutes)
fail=0
# shellcheck source=scripts/mpi-runs.sh
. scripts/mpi-runs.sh
export MATRIX_FILE
NAMES=()
SECS=()
RESULTS=()
START=$EPOCHREALTIME

elapsed() { # seconds since $1 (an $EPOCHREALTIME), one decimal
  awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'
}

# stage NAME COMMAND...: run it, record its time and result
stage() {
  local name=$1
  shift
  echo
  echo "=== $name: $*"
  local t0=$EPOCHREALTIME
  "$@"
  local rc=$?
  NAMES+=("$name")
  SECS+=("$(elapsed "$t0")")
  if [ $rc -eq 0 ]; then
    RESULTS+=("pass")
  else
    RESULTS+=("FAIL (exit $rc)")
    echo "=== FAILED (exit $rc): $name: $*"
    fail=$((fail + 1))
  fi
  return $rc
}

summary() {
  echo
  echo "=== stage times"
  printf '%-34s %9s  %s\n' "stage" "seconds" "result"
  local i
  for i in "${!NAMES[@]}"; do
    printf '%-34s %9s  %s\n' "${NAMES[$i]}" "${SECS[$i]}" "${RESULTS[$i]}"
  done
  printf '%-34s %9s\n' "total" "$(elapsed "$START")"
  matrix_table
  echo
}

if ! stage "setup (CPU build)" env PYSHARD_CUDA=OFF bash scripts/setup.sh; then
  summary
  echo "pyshard tests: setup FAILED"
  exit 1
fi
stage "ruff" "$VENV/bin/ruff" check pyshard tests examples
stage "serial tests" timeout "$T" "$PY" -m pytest tests -q -p no:cacheprovider
MPICH_LIB=$("$PY" -c 'import pyshard as ps; print(ps.build_info()["mpi_library"])')
for n in ${PYSHARD_TEST_RANKS:-1 2 3 4 6 7 8}; do
  stage "tests/mpi at $n rank(s)" mpi_run "${MPICH_LIB% *}" "${MPICH_LIB##* }" \
    "tests/mpi at $n rank(s)" "$T" "$MPIEXEC" -n "$n" "$PY" -- tests/mpi --with-mpi
done
# The node-local transport (pyshard/_shm.py) serves the runs above (one node) for blocks of
# 16 KiB and more. Three more: at 3 ranks on one node, every exchange, gather and reduction
# taking it however small (PYSHARD_SHM_MIN_BYTES=0: the suite's arrays are small); at 4 ranks
# on simulated nodes of 2 ranks (shared memory within a node, MPI between: the mixed path of
# a cluster; reductions take MPI there), again however small; and at 4 ranks with the
# transport off (every auto exchange through MPI).
stage "tests/mpi at 3 ranks, all shared" mpi_run "${MPICH_LIB% *}" "${MPICH_LIB##* }" \
  "tests/mpi at 3 ranks, PYSHARD_SHM_MIN_BYTES=0" "$T" "$MPIEXEC" -n 3 env \
  PYSHARD_SHM_MIN_BYTES=0 "$PY" -- tests/mpi --with-mpi
stage "tests/mpi at 4 ranks, nodes of 2" mpi_run "${MPICH_LIB% *}" "${MPICH_LIB##* }" \
  "tests/mpi at 4 ranks, PYSHARD_NODE_SIZE=2" "$T" "$MPIEXEC" -n 4 env PYSHARD_NODE_SIZE=2 \
  PYSHARD_SHM_MIN_BYTES=0 "$PY" -- tests/mpi --with-mpi
stage "tests/mpi at 4 ranks, MPI only" mpi_run "${MPICH_LIB% *}" "${MPICH_LIB##* }" \
  "tests/mpi at 4 ranks, PYSHARD_TRANSPORT=mpi" "$T" "$MPIEXEC" -n 4 env PYSHARD_TRANSPORT=mpi \
  "$PY" -- tests/mpi --with-mpi
# Packaging and docs: the sdist installed (not editable) into a fresh environment with only
# pip's MPICH, mpi4py and numpy, and the demo run from outside the checkout; then the docs
# (Sphinx, warnings as errors; every example in them run). Both before the CUDA variant
# replaces the core in .venv, so the docs build against the CPU build.
stage "sdist check" timeout "${PYSHARD_SDIST_TIMEOUT:-600}" bash scripts/sdist-check.sh
stage "docs" timeout "${PYSHARD_DOCS_TIMEOUT_ALL:-300}" bash scripts/docs.sh
# The MPI matrix: each library from a clean state in its own venv (scripts/test-mpi.sh)
if [ "$(id -u)" = 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1  # CI runs as root
fi
for name in ${PYSHARD_TEST_MPIS-openmpi impi impi-plain openmpi-debian}; do
  large=0
  case $name in openmpi*) large=1 ;; esac
  stage "mpi: $name" env PYSHARD_TEST_CLEAN=1 PYSHARD_TEST_LARGE=$large \
    bash scripts/test-mpi.sh "$name"
done
if [ "${PYSHARD_TEST_CUDA:-1}" = 1 ]; then
  if stage "cuda: setup (CUDA build)" env PYSHARD_CUDA=ON bash scripts/setup.sh; then
    stage "cuda: build_info" "$PY" -c "import pyshard as ps; i = ps.build_info(); \
print('build_info:', i); assert i['cuda'] is not None, 'the CUDA variant has no CUDA'; \
assert ps.cuda_available() == (i['cuda_device'] and ps._backend.cupy() is not None)"
    # the kernels-on-host tests, where the checkout has them
    serial=(tests/test_core.py)
    [ -e tests/test_kernels_on_host.py ] && serial+=(tests/test_kernels_on_host.py)
    stage "cuda: core tests" timeout "$T" "$PY" -m pytest "${serial[@]}" -q -p no:cacheprovider
    stage "cuda: staged + gpu at 2 ranks" timeout "$T" "$MPIEXEC" -n 2 "$PY" -m pytest \
      tests/mpi/test_staged.py tests/gpu -q -p no:cacheprovider --with-mpi
  fi
fi
summary
if [ $fail -ne 0 ]; then
  echo "pyshard tests: $fail run(s) FAILED"
  exit 1
fi
echo "pyshard tests: every run passed"
