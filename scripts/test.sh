#!/usr/bin/env bash
# The README's test command: set up (see setup.sh), lint, and run the whole test suite on the
# CPU build against pip's MPICH; then the sdist, the docs and the CUDA variant of the core.
# The other MPI libraries are scripts/test-matrix.sh; .ci/run runs this, then that.
#
# Stages:
# - setup, ruff, the serial tests (pytest-mpi skips the MPI-marked ones without --with-mpi);
# - tests/mpi under mpiexec with --with-mpi, each run under a hard timeout so a hang fails
#   fast, and each covering a path the others do not. On 2 cores every run past 2 ranks is
#   oversubscribed, so a run is a rank count (the meshes it builds) and a transport:
#     1 rank                      no peers: every exchange a local copy
#     2 ranks                     auto (node-shared memory from 16 KiB, MPI below), a core a
#                                 rank; also the `slow` tests and the 2^31-byte message;
#                                 without the `jax` tests (they run at 1, 3 and 4 ranks)
#     3 ranks, all shared         PYSHARD_SHM_MIN_BYTES=0: every exchange, gather and reduction
#                                 through node-shared memory however small (uneven, odd)
#     4 ranks, two hosts          2 a host on two hosts of this machine (scripts/two-nodes.sh:
#                                 network namespaces, MPI over TCP), every size shared: shared
#                                 memory within a host, MPI between (2x2 meshes); where root
#                                 cannot make the hosts, simulated nodes of 2 instead
#                                 (PYSHARD_NODE_SIZE=2)
#     4 ranks, jax                tests/mpi/test_jax.py alone, on one host (pyshard.jax takes MPI
#                                 whatever the node map; in the two-host run above its compiles
#                                 and TCP messages cost 2-3x as much)
#     6 ranks, MPI only           PYSHARD_TRANSPORT=mpi: every auto exchange through MPI (2x3);
#                                 without the `numerics` (FFT, torch, PIC...: the same Python
#                                 over the exchanges this run checks, run at every other count)
#     6 ranks, two hosts          3 a host, tests/mpi/test_two_hosts.py only (2x3 meshes: node
#                                 peers along one dim, MPI along the other; the whole suite
#                                 again at 6 ranks would cost about 140 s of CI's budget)
#     7 ranks, nodes of 2, 2, 2, 1  a prime: auto, uneven and empty shards everywhere, a rank alone
#                                 on its node; without the
#                                 `jax` tests (pyshard.jax runs at 1, 3, 4 ranks: importing jax and
#                                 compiling each case costs seconds a rank on 2 cores)
#     8 ranks                     auto on the 3-D 2x2x2 mesh (and 4x2, 2x4): the files that
#                                 build meshes of their own (the others are 1-D at 8 ranks,
#                                 run at 7 and 12); of the numerics only the `mesh3d` ones
#                                 (FFTs and torch gradients on 2x2x2)
#   The `slow` tests (FFTW_MEASURE plans, the 64^3 Navier-Stokes run) run at 2 ranks only.
#   PYSHARD_TEST_RANKS="2 7" keeps only the runs at those rank counts.
# - the sdist (scripts/sdist-check.sh: built, installed into a fresh environment, the demo)
#   and the docs (scripts/docs.sh), both against the CPU build;
# - the CUDA variant (nvcc, or NVIDIA's compiler wheels) replaces the core in .venv, and only
#   what that build changes runs again: its build_info, the core's own tests and the CUDA
#   kernels on the host (tests/test_core.py, tests/test_kernels_on_host.py), the staged
#   transport at 2 ranks (tests/mpi/test_staged.py) and tests/gpu. With no GPU here
#   cuda_available() is False and tests/gpu skips. PYSHARD_TEST_CUDA=0 skips the CUDA variant.
#
# Every pytest prints its 10 slowest tests (--durations). At the end: a table of every
# stage's wall time and result, and the MPI runs (library, version, run, tests passed /
# skipped / failed, seconds). Exit status non-zero when any stage failed; the last line says
# whether every run passed.
set -uo pipefail
cd "$(dirname "$0")/.."
VENV=${PYSHARD_VENV:-.venv}
PY="$VENV/bin/python"
MPIEXEC="$VENV/bin/mpiexec"
T=${PYSHARD_TEST_TIMEOUT:-600}  # a stage's hard limit (tests/mpi at 8 ranks on 2 cores: 2-4 minutes)
# shellcheck source=scripts/mpi-runs.sh
. scripts/mpi-runs.sh
export MATRIX_FILE

summary() {
  stage_table
  matrix_table
  echo
}

if ! stage "setup (CPU build)" env PYSHARD_CUDA=OFF bash scripts/setup.sh; then
  summary
  echo "pyshard tests: setup FAILED"
  exit 1
fi
stage "ruff" "$VENV/bin/ruff" check pyshard tests examples
# pyshard/_core.pyi against the stub generated from the CPU build just made (a missing
# generator fails here; tests/test_stubs.py skips without it)
stage "stubs" "$PY" scripts/stubs.py --check
stage "serial tests" timeout "$T" "$PY" -m pytest tests -q -p no:cacheprovider --durations=10
MPICH_LIB=$("$PY" -c 'import pyshard as ps; print(ps.build_info()["mpi_library"])')
# mpich_run N LABEL MARKS [VAR=VALUE...]: tests/mpi at N ranks under those settings
mpich_run() {
  local n=$1 label=$2 marks=$3
  shift 3
  case " ${PYSHARD_TEST_RANKS:-$n} " in *" $n "*) ;; *) return 0 ;; esac
  stage "tests/mpi at $label" mpi_run "${MPICH_LIB% *}" "${MPICH_LIB##* }" "tests/mpi at $label" \
    "$T" "$MPIEXEC" -n "$n" env "$@" "$PY" -- tests/mpi --with-mpi ${marks:+-m "$marks"}
}
# Two hosts of this machine (scripts/two-nodes.sh): can root make them here? (if not, its
# message says why); first, for the 1-rank run's tests start two-host jobs of their own
export PYSHARD_TWO_NODES_SHM_STRICT=1  # a file left in a host's /dev/shm fails the run
TWO_HOSTS=0
PYSHARD_TWO_NODES_INSTALL=1 bash scripts/two-nodes.sh -n 2 -ppn 1 true && TWO_HOSTS=1
mpich_run 1 "1 rank" "not slow"
mpich_run 2 "2 ranks (+ slow)" "not jax"
mpich_run 3 "3 ranks, all shared" "not slow" PYSHARD_SHM_MIN_BYTES=0
# two_hosts_run N LABEL MARKS PATHS [VAR=VALUE...]: PATHS at N ranks, N/2 a host, on two hosts
two_hosts_run() {
  local n=$1 label=$2 marks=$3 paths=$4
  shift 4
  case " ${PYSHARD_TEST_RANKS:-$n} " in *" $n "*) ;; *) return 0 ;; esac
  # shellcheck disable=SC2086 # PATHS: words
  stage "tests/mpi at $label" mpi_run "${MPICH_LIB% *}" "${MPICH_LIB##* }" "tests/mpi at $label" \
    "$T" bash scripts/two-nodes.sh -n "$n" -ppn $((n / 2)) env "$@" "$PY" -- $paths --with-mpi \
    ${marks:+-m "$marks"}
}
if [ $TWO_HOSTS = 1 ]; then
  two_hosts_run 4 "4 ranks, two hosts" "not slow and not jax" tests/mpi PYSHARD_SHM_MIN_BYTES=0
else
  mpich_run 4 "4 ranks, nodes of 2" "not slow and not jax" PYSHARD_NODE_SIZE=2 PYSHARD_SHM_MIN_BYTES=0
fi
mpich_run 4 "4 ranks, jax" "jax"
mpich_run 6 "6 ranks, MPI only" "not slow and not numerics" PYSHARD_TRANSPORT=mpi
if [ $TWO_HOSTS = 1 ]; then
  two_hosts_run 6 "6 ranks, two hosts (its tests)" "not slow" "tests/mpi/test_two_hosts.py" \
    PYSHARD_SHM_MIN_BYTES=0
fi
# 7 ranks on simulated nodes of 2, 2, 2 and 1: a prime, auto with uneven and empty shards, and
# a rank alone on its node beside nodes of two. It took in a run of 5 ranks on nodes of 2, 2, 1
# (all shared; 79 s beside 136 s for 7 ranks on 2026-12-07; together 176 s)
mpich_run 7 "7 ranks, nodes of 2, 2, 2, 1" "not slow and not jax" PYSHARD_NODE_SIZE=2
# 8 ranks: the files with meshes of their own at 8 ranks (2x2x2, 4x2, 2x4); their 1-D-only
# files ran at 7 and 12 (all of tests/mpi here took 213 s, and .ci/run 2418 s on 2026-12-07)
IGNORE8=$(for f in tests/mpi/test_*.py; do
  grep -q 'meshes_for\|MESHES\|mesh3d\|(2, 2, 2)' "$f" || printf -- '--ignore=%s ' "$f"
done)
mpich_run 8 "8 ranks, its meshes' files" "not slow and (not numerics or mesh3d)" \
  "PYTEST_ADDOPTS=$IGNORE8"
# 12 ranks on simulated nodes of 3 (each row of the 4x3 mesh a node): 4x3 and 3x2x2 meshes,
# more ranks than the small arrays' rows. It replaced two runs, 9 ranks on nodes of 3 and 12 on
# nodes of 4 (six minutes between them on a slow day): every failure they showed on 2026-12-05
# (the bench floor, test_balance, test_fft_padded, test_migrate, test_redistribute_1d,
# examples/torch_bf16.py) fails here too with its fix reverted. The staged transport's sweep of every 1-D pair (an
# oracle that grows as the square of the rank count: 25 s here) runs at 1-8 ranks only.
# 4-5 minutes (271 and 307 s in two fresh-clone runs on 2026-12-07). Without the 1-D files
# whose work does not change with the rank count (file formats, dtypes, the count limit's
# rounds, argument checks, the fast path's cache, tune's choice: 46 s of its 190 on
# 2026-12-08); they run at 1-7 ranks, and none of the failures above was in them.
IGNORE12="--deselect=tests/mpi/test_staged.py::test_1d_pairs_staged"
for f in checkpoint_formats checkpoint_interop count_limit ml_dtypes fastpath validate errors \
  settings tune; do
  IGNORE12+=" --ignore=tests/mpi/test_$f.py"
done
mpich_run 12 "12 ranks, nodes of 3" "not slow and not jax" PYSHARD_NODE_SIZE=3 \
  PYSHARD_SHM_MIN_BYTES=0 "PYTEST_ADDOPTS=$IGNORE12"
# Packaging and docs: the sdist installed (not editable) into a fresh environment with only
# pip's MPICH, mpi4py and numpy, and the demo run from outside the checkout; then the docs
# (Sphinx, warnings as errors; every example in them run). Both before the CUDA variant
# replaces the core in .venv, so the docs build against the CPU build.
stage "sdist check" timeout "${PYSHARD_SDIST_TIMEOUT:-600}" bash scripts/sdist-check.sh
stage "docs" timeout "${PYSHARD_DOCS_TIMEOUT_ALL:-300}" bash scripts/docs.sh
if [ "${PYSHARD_TEST_CUDA:-1}" = 1 ]; then
  if stage "cuda: setup (CUDA build)" env PYSHARD_CUDA=ON bash scripts/setup.sh; then
    stage "cuda: build_info" "$PY" -c "import pyshard as ps; i = ps.build_info(); \
print('build_info:', i); assert i['cuda'] is not None, 'the CUDA variant has no CUDA'; \
assert ps.cuda_available() == (i['cuda_device'] and ps._backend.cupy() is not None)"
    # the kernels-on-host tests, where the checkout has them
    serial=(tests/test_core.py)
    [ -e tests/test_kernels_on_host.py ] && serial+=(tests/test_kernels_on_host.py)
    stage "cuda: core tests" timeout "$T" "$PY" -m pytest "${serial[@]}" -q -p no:cacheprovider \
      --durations=10
    stage "cuda: staged + gpu at 2 ranks" timeout "$T" "$MPIEXEC" -n 2 "$PY" -m pytest \
      tests/mpi/test_staged.py tests/gpu -q -p no:cacheprovider --with-mpi --durations=10
  fi
fi
summary
if [ $FAILS -ne 0 ]; then
  echo "pyshard tests: $FAILS run(s) FAILED"
  exit 1
fi
echo "pyshard tests: every run passed"
