#!/usr/bin/env bash
# Set up (see setup.sh), lint, and run the whole test suite: serially (one rank) and under
# mpiexec at 2, 3, 4 and 7 ranks (plus 6 and 8 for 2-D and 3-D meshes), each under a hard
# timeout so a hang fails fast.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
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
run "$VENV/bin/ruff" check pyshard tests
run timeout "$T" "$PY" -m pytest tests -p no:cacheprovider
for n in ${PYSHARD_TEST_RANKS:-2 3 4 6 7 8}; do
  run timeout "$T" "$MPIEXEC" -n "$n" "$PY" -m pytest tests/mpi -q -p no:cacheprovider
done
echo
if [ $fail -ne 0 ]; then
  echo "pyshard tests: $fail run(s) FAILED"
  exit 1
fi
echo "pyshard tests: every run passed"
