# Sourced by scripts/test.sh, scripts/test-matrix.sh and scripts/test-mpi.sh: run pytest under
# mpiexec and keep one row per run (library, version, ranks, passed, skipped, failed, seconds)
# for the matrix table; time stages and print their table.
#
#   MATRIX_FILE    where the rows go (tab-separated; created if missing)
#   mpi_run LIB VERSION LABEL TIMEOUT MPIEXEC... -- PYTEST_ARGS...
#       runs `timeout TIMEOUT MPIEXEC... python -m pytest PYTEST_ARGS -q --color=no
#       --durations=10` (MPIEXEC names the launcher, its flags, -n N and the python), prints
#       its output, appends a row and returns pytest's status (124: the timeout ended it)
#   matrix_table [FIRST]   prints the rows (from row FIRST on) as a table
#   stage NAME COMMAND...  runs COMMAND, records its wall time and result (FAILS counts)
#   stage_table            prints every stage's time and result, and the total since sourcing
#
# Bytecode is written (PYTHONDONTWRITEBYTECODE unset): every rank of every run would otherwise
# compile pyshard and rewrite the test modules' asserts again (about 2 s of CPU a rank).
unset PYTHONDONTWRITEBYTECODE
# One BLAS/torch thread a rank unless the caller chose (ranks fill the cores here; threads per
# core in every rank spin where other ranks wait: docs/performance.md, "Threads").
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

MATRIX_FILE=${MATRIX_FILE:-$(mktemp "${TMPDIR:-/tmp}/pyshard-matrix.XXXXXX")}

_mpi_runs_elapsed() { # seconds since $1 (an $EPOCHREALTIME), one decimal
  awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'
}

mpi_run() {
  local lib=$1 version=$2 label=$3 limit=$4
  shift 4
  local launch=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    launch+=("$1")
    shift
  done
  shift
  local log t0 rc
  log=$(mktemp "${TMPDIR:-/tmp}/pyshard-run.XXXXXX")
  t0=$EPOCHREALTIME
  timeout "$limit" "${launch[@]}" -m pytest "$@" -q -p no:cacheprovider --color=no \
    --durations=10 2>&1 |
    tr -d '\000' | tee "$log"
  rc=${PIPESTATUS[0]}
  local secs count
  secs=$(_mpi_runs_elapsed "$t0")
  # pytest's last summary line, e.g. "3 failed, 160 passed, 7 skipped in 12.34s"
  local last passed=0 skipped=0 failed=0
  last=$(grep -E '^[=]* ?[0-9]+ (passed|failed|skipped|error|errors|deselected)' "$log" | tail -1)
  for kind in passed skipped failed error errors; do
    count=$(grep -oE "[0-9]+ $kind\b" <<<"$last" | grep -oE '^[0-9]+' || true)
    [ -n "$count" ] || continue
    case $kind in
      passed) passed=$count ;;
      skipped) skipped=$count ;;
      *) failed=$((failed + count)) ;;
    esac
  done
  if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then
    failed="exit $rc"  # a crash, a hang ended by the timeout, or no test ran
  fi
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$lib" "$version" "$label" "$passed" "$skipped" \
    "$failed" "$secs" >>"$MATRIX_FILE"
  rm -f "$log"
  return "$rc"
}

matrix_table() {
  echo
  echo "=== MPI matrix"
  printf '%-18s %-10s %-26s %7s %8s %8s %9s\n' library version run passed skipped failed seconds
  local lib version label passed skipped failed secs
  while IFS=$'\t' read -r lib version label passed skipped failed secs; do
    printf '%-18s %-10s %-26s %7s %8s %8s %9s\n' "$lib" "$version" "$label" "$passed" \
      "$skipped" "$failed" "$secs"
  done < <(tail -n "+${1:-1}" "$MATRIX_FILE")
}

STAGE_NAMES=()
STAGE_SECS=()
STAGE_RESULTS=()
FAILS=0
STAGES_START=$EPOCHREALTIME

stage() { # NAME COMMAND...: run it, record its time and result
  local name=$1
  shift
  echo
  echo "=== $name: $*"
  local t0=$EPOCHREALTIME
  "$@"
  local rc=$?
  STAGE_NAMES+=("$name")
  STAGE_SECS+=("$(_mpi_runs_elapsed "$t0")")
  if [ $rc -eq 0 ]; then
    STAGE_RESULTS+=("pass")
  else
    STAGE_RESULTS+=("FAIL (exit $rc)")
    echo "=== FAILED (exit $rc): $name: $*"
    FAILS=$((FAILS + 1))
  fi
  return $rc
}

stage_table() {
  echo
  echo "=== stage times"
  printf '%-40s %9s  %s\n' "stage" "seconds" "result"
  local i
  for i in "${!STAGE_NAMES[@]}"; do
    printf '%-40s %9s  %s\n' "${STAGE_NAMES[$i]}" "${STAGE_SECS[$i]}" "${STAGE_RESULTS[$i]}"
  done
  printf '%-40s %9s\n' "total" "$(_mpi_runs_elapsed "$STAGES_START")"
}
