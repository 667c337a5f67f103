#!/usr/bin/env bash
# The sdist builds and works on its own: build the sdist with `python -m build`, check its
# file list, build a wheel from it (pip's isolated build) in a fresh virtual environment that
# has only pip's MPICH, mpi4py and numpy (requirements/mpich.txt), `twine check` both, install
# the wheel (not editable), and run the demo at 2 ranks from a directory outside the checkout.
# A file missing from the sdist (pyproject.toml [tool.scikit-build] sdist.include) fails here.
#
#   bash scripts/sdist-check.sh            # about 1-2 minutes; needs PyPI (or a pip cache)
#   KEEP=1 bash scripts/sdist-check.sh     # keep the temporary directory (printed at the end)
#
# Two environments in one temporary directory: tools/ (build, twine) makes and checks the
# files; env/ is the user's environment. The wheel is built the way `pip install
# pyshard-X.tar.gz` builds it (isolated: scikit-build-core and pybind11 from PyPI; CMake
# finds the mpicc beside env/'s python), so pip installing the sdist and installing this
# wheel are the same thing. MPICC and MPI_HOME are cleared: this checks pip's MPICH.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/pyshard-sdist.XXXXXX")
cleanup() {
  if [ "${KEEP:-0}" = 1 ]; then echo "[sdist-check] kept $TMP"; else rm -rf "$TMP"; fi
}
trap cleanup EXIT
unset MPICC MPI_HOME PYTHONPATH PYSHARD_CUDA CUDA_HOME
export PIP_DISABLE_PIP_VERSION_CHECK=1

mkvenv() { # dir: a venv with pip (Debian without python3-venv: bootstrap pip, as setup.sh)
  if ! "$PY" -m venv "$1" 2>/dev/null; then
    rm -rf "$1"
    "$PY" -m venv --without-pip "$1"
    "$PY" -m pip --python "$1/bin/python" install -q pip
  fi
}

t0=$SECONDS
echo "[sdist-check] tools: build, twine ($TMP/tools)"
mkvenv "$TMP/tools"
"$TMP/tools/bin/python" -m pip install -q build twine

echo "[sdist-check] python -m build --sdist"
"$TMP/tools/bin/python" -m build --sdist --outdir "$TMP/dist" "$ROOT" >"$TMP/sdist.log" 2>&1 || {
  cat "$TMP/sdist.log"
  echo "[sdist-check] FAILED: python -m build --sdist"
  exit 1
}
SDIST=$(ls "$TMP"/dist/pyshard-*.tar.gz)

echo "[sdist-check] contents of $(basename "$SDIST")"
"$TMP/tools/bin/python" - "$SDIST" <<'EOF'
import sys, tarfile

names = tarfile.open(sys.argv[1]).getnames()
top = names[0].split("/")[0]
rel = sorted(n[len(top) + 1:] for n in names if n.startswith(top + "/"))
need = ["pyproject.toml", "CMakeLists.txt", "README.md", "PKG-INFO", "pyshard/__init__.py",
        "pyshard/_core.pyi", "pyshard/py.typed", "pyshard/checkpoint/__init__.py",
        "pyshard/bench/cli.py", "pyshard/fft/__init__.py", "cpp/bindings.cpp",
        "cpp/cuda_packer.cu"]
missing = [n for n in need if n not in rel]
banned = (".venv/", "build/", "dist/", ".whl/", "docs/", "tests/", ".git/", "__pycache__/")
extra = [n for n in rel if n.startswith(banned) or "/__pycache__/" in n or n.endswith((".so", ".pyc"))]
dirs = sorted({n.split("/")[0] + ("/" if "/" in n else "") for n in rel})
print(f"  {len(rel)} files: {' '.join(dirs)}")
if missing or extra:
    sys.exit(f"sdist check FAILED: missing {missing}, should not be there {extra}")
EOF

echo "[sdist-check] fresh environment: pip's MPICH, mpi4py, numpy ($TMP/env)"
mkvenv "$TMP/env"
"$TMP/env/bin/python" -m pip install -q -r requirements/mpich.txt numpy

echo "[sdist-check] building the wheel from the sdist (isolated, as pip install of the sdist does)"
# -O1 (the default Release build is -O3): this checks what the sdist holds and that it builds
# and runs, not its speed, and saves about 30 s of CI's 2 cores
"$TMP/env/bin/python" -m pip wheel -q --no-deps -w "$TMP/dist" \
  "-Ccmake.define.CMAKE_CXX_FLAGS_RELEASE=${PYSHARD_CXX_OPT:--O1} -DNDEBUG" "$SDIST" \
  >"$TMP/wheel.log" 2>&1 || {
  cat "$TMP/wheel.log"
  echo "[sdist-check] FAILED: pip wheel $(basename "$SDIST")"
  exit 1
}
WHEEL=$(ls "$TMP"/dist/pyshard-*.whl)
"$TMP/tools/bin/python" - "$WHEEL" <<'EOF'
import sys, zipfile

names = set(zipfile.ZipFile(sys.argv[1]).namelist())
need = ["pyshard/__init__.py", "pyshard/checkpoint/reader.py", "pyshard/bench/cli.py",
        "pyshard/bench/gpu.py", "pyshard/fft/__init__.py", "pyshard/jax/__init__.py",
        "pyshard/py.typed"]
missing = [n for n in need if n not in names]
pkgs = sorted({n.rsplit("/", 1)[0] for n in names if n.startswith("pyshard/") and n.endswith(".py")})
print(f"  wheel: {len(names)} files; packages {' '.join(pkgs)}")
if missing or not any(n.startswith("pyshard/_core") for n in names):
    sys.exit(f"wheel check FAILED: missing {missing or 'the compiled pyshard/_core'}")
EOF

echo "[sdist-check] twine check"
"$TMP/tools/bin/python" -m twine check --strict "$SDIST" "$WHEEL"

"$TMP/env/bin/python" -m pip install -q --no-deps "$WHEEL"
mkdir -p "$TMP/run"
cd "$TMP/run"  # outside the checkout: only the installed package can be imported
"$TMP/env/bin/python" -c "import pyshard, sys; f = pyshard.__file__; print('[sdist-check] imported', f); \
sys.exit(0 if f.startswith('$TMP/env/') else 'pyshard was not imported from the fresh environment')"
echo "[sdist-check] mpiexec -n 2 python -m mpi4py -m pyshard demo --shape 256x128"
"$TMP/env/bin/mpiexec" -n 2 "$TMP/env/bin/python" -m mpi4py -m pyshard demo --shape 256x128 \
  --reps 2 | tee "$TMP/demo.log"
grep -q "all results equal the numpy reference" "$TMP/demo.log" || {
  echo "[sdist-check] FAILED: the demo did not report that all results equal the numpy reference"
  exit 1
}
size() { du -k "$1" | cut -f1; }
echo "[sdist-check] sdist $(basename "$SDIST") $(size "$SDIST") KiB, wheel $(basename "$WHEEL")" \
  "$(size "$WHEEL") KiB; $((SECONDS - t0)) s"
echo "[sdist-check] ok"
