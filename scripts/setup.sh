#!/usr/bin/env bash
# Set up a virtual environment in .venv with MPI (pip's mpich, unless MPICC/MPI_HOME point at
# a site MPI), mpi4py, numpy and the test tools, and build pyshard's C++ core into it.
# Idempotent: a second run only rebuilds what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${PYSHARD_VENV:-.venv}

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV"
  if ! "$PY" -m venv "$VENV" 2>/dev/null; then
    # Debian without python3-venv: a venv without pip, then pip bootstrapped into it
    rm -rf "$VENV"
    "$PY" -m venv --without-pip "$VENV"
    "$PY" -m pip --python "$VENV/bin/python" install -q pip
  fi
fi
PIP="$VENV/bin/python -m pip"
$PIP install -q --upgrade pip >/dev/null 2>&1 || true
if [ -z "${MPICC:-}${MPI_HOME:-}" ]; then
  echo "[setup] installing MPI (pip's mpich) and Python dependencies"
  $PIP install -q -r requirements/mpich.txt
else
  echo "[setup] using the site MPI (MPICC=${MPICC:-} MPI_HOME=${MPI_HOME:-}); building mpi4py against it"
  $PIP install -q --no-binary=mpi4py mpi4py
fi
$PIP install -q -r requirements/dev.txt
echo "[setup] building pyshard (C++ core via scikit-build-core)"
$PIP install -q --no-build-isolation -e .
"$VENV/bin/python" -c "import pyshard, pyshard._core as c; print('[setup] pyshard', pyshard.__version__, 'core built with', c.built_with)"
