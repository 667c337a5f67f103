#!/usr/bin/env bash
# Download, on a machine with PyPI, the cp312 manylinux x86_64 wheels that the GPU machine
# (no package registry) lacks, into .whl/ (gitignored); scripts/gpu-check.sh installs them there.
#
#   bash scripts/gpu-wheels.sh            # mpich + mpi4py (the job then controls its MPI), pytest-mpi
#   bash scripts/gpu-wheels.sh NAME==VER  # ... plus more pinned wheels, e.g. pytest pieces
#
# The GPU image already has Python 3.12, CUDA 13, cupy-cuda13x, mpi4py, pybind11,
# scikit-build-core, cmake, ninja and pytest; only MPI is brought along, so that the check
# knows which MPI it builds and runs against. The working tree plus these wheels must stay
# under 64 MiB (they travel with it). PYTHON picks the interpreter that runs pip (default
# python3; any version: pip downloads for 3.12 whatever it runs on).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -m pip --version >/dev/null 2>&1; then
  if [ -x .venv/bin/python ] && .venv/bin/python -m pip --version >/dev/null 2>&1; then
    PY=.venv/bin/python
  else
    echo "gpu-wheels: no pip for $PY (set PYTHON=/path/to/python with pip)" >&2
    exit 2
  fi
fi
WANT=("mpich==5.0.2" "mpi4py==4.1.2" "pytest-mpi==0.6" "$@")
DEST=.whl
mkdir -p "$DEST"
for spec in "${WANT[@]}"; do
  echo "gpu-wheels: $spec"
  "$PY" -m pip download -q --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$DEST" "$spec"
done
# one wheel per project: drop other versions left over from earlier runs
for spec in "${WANT[@]}"; do
  name=${spec%%[=<>!~ ]*}
  norm=$(echo "$name" | tr '[:upper:]-.' '[:lower:]__')
  ver=${spec##*==}
  for f in "$DEST"/*.whl; do
    base=$(basename "$f")
    fname=$(echo "${base%%-*}" | tr '[:upper:]-.' '[:lower:]__')
    fver=$(echo "$base" | cut -d- -f2)
    if [ "$fname" = "$norm" ] && [ "$spec" != "$name" ] && [ "$fver" != "$ver" ]; then
      echo "gpu-wheels: removing $base (not $ver)"
      rm -f "$f"
    fi
  done
done
echo
ls -l "$DEST"/*.whl
wheels=$(du -cb "$DEST"/*.whl | tail -1 | cut -f1)
tree=$(git ls-files -co --exclude-standard -z | xargs -0 du -cb 2>/dev/null | grep total$ |
  awk '{s += $1} END {print s + 0}')
limit=$((64 * 1024 * 1024))
echo "gpu-wheels: wheels $((wheels / 1024)) KiB, working tree $((tree / 1024)) KiB," \
  "together $(((wheels + tree) / 1024)) KiB of $((limit / 1024)) KiB"
if [ $((wheels + tree)) -ge $limit ]; then
  echo "gpu-wheels: over the 64 MiB that may travel to the GPU machine" >&2
  exit 1
fi
