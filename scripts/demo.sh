#!/usr/bin/env bash
# Set up (see setup.sh) and run the demo on 4 ranks: a few redistributions of a 64 MiB
# array, each checked against numpy, printed as a table. Extra arguments go to the demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
VENV=${PYSHARD_VENV:-.venv}
NP=${NP:-4}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}  # one BLAS thread a rank: docs/performance.md, "Threads"
# under `python -m mpi4py`: a rank that raises aborts the whole job (no rank left waiting)
exec timeout 600 "$VENV/bin/mpiexec" -n "$NP" "$VENV/bin/python" -m mpi4py -m pyshard demo "$@"
