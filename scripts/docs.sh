#!/usr/bin/env bash
# Build the guide and API reference into docs/_build/html (Sphinx + autodoc + MyST; sources in
# docs/site/, conf.py says why Sphinx) with warnings as errors, and run every code example in
# it: the scripts in docs/examples/ under mpiexec at 2 ranks (their output is what the pages
# show), the plot commands of the performance and Slurm pages, the tune-file command of the
# algorithms page, the no-MPI configure whose message the troubleshooting page shows, and
# the >>> examples with Sphinx's doctest builder at 1 rank.
#
#   bash scripts/docs.sh          # needs .venv from scripts/setup.sh; about 30-60 s
#
# Installs requirements/docs.txt into the venv (PYSHARD_VENV, default .venv) first.
set -euo pipefail
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}  # one BLAS thread a rank: docs/performance.md, "Threads"
cd "$(dirname "$0")/.."
VENV=${PYSHARD_VENV:-.venv}
PY="$VENV/bin/python"
MPIEXEC="$VENV/bin/mpiexec"
T=${PYSHARD_DOCS_TIMEOUT:-120}
[ -x "$PY" ] || { echo "docs.sh: no $PY: run bash scripts/setup.sh first" >&2; exit 1; }
"$PY" -m pip install -q -r requirements/docs.txt
OUT=docs/_build
rm -rf "$OUT"
mkdir -p "$OUT/examples" "$OUT/plots"
t0=$SECONDS
fail() { echo "docs.sh: FAILED: $*" >&2; exit 1; }

echo "[docs] ruff check docs/examples docs/site"
"$VENV/bin/ruff" check docs/examples docs/site || fail "ruff"

for ex in docs/examples/*.py; do
  name=$(basename "$ex" .py)
  echo "[docs] mpiexec -n 2 python -m mpi4py $ex"
  timeout "$T" "$MPIEXEC" -n 2 "$PY" -m mpi4py "$ex" >"$OUT/examples/$name.out" \
    2>"$OUT/examples/$name.err" || {
    cat "$OUT/examples/$name.out" "$OUT/examples/$name.err"
    fail "$ex"
  }
done

echo "[docs] PYSHARD_ALGORITHM=tune PYSHARD_TUNE_FILE=tune.json ... quickstart.py"
tune=$(mktemp -d)
(cd "$tune" && PYSHARD_ALGORITHM=tune PYSHARD_TUNE_FILE=tune.json timeout "$T" \
  "$OLDPWD/$MPIEXEC" -n 2 "$OLDPWD/$PY" -m mpi4py "$OLDPWD/docs/examples/quickstart.py" \
  >/dev/null) || fail "the tune-file example"
"$PY" -c "import json, sys; d = json.load(open(sys.argv[1])); assert d, 'empty tune file'; \
print(json.dumps(d, indent=1))" "$tune/tune.json" >"$OUT/examples/tune.json" ||
  fail "tune.json was not written"
rm -rf "$tune"

echo "[docs] plots"
"$PY" -m pyshard plot docs/bench-2ranks.jsonl -o "$OUT/plots/bench-2ranks.png" >/dev/null
for kind in strong weak; do
  PYSHARD_PYTHON=$PY bash slurm/plot.sh -o "$OUT/plots/scaling-$kind.png" \
    "docs/scaling-2core-$kind.jsonl" >/dev/null
done

echo "[docs] configure without MPI (the troubleshooting page shows the message)"
"$PY" - "$OUT/examples/no-mpi.out" <<'PYEOF'
import os, shutil, subprocess, sys, tempfile

import pybind11

cmake = shutil.which("cmake", path=os.path.dirname(sys.executable)) or shutil.which("cmake")
env = {k: v for k, v in os.environ.items() if k not in ("MPICC", "MPI_HOME", "CUDA_HOME")}
env["PATH"] = "/usr/bin:/bin"  # no mpicc from the venv
with tempfile.TemporaryDirectory() as b:
    r = subprocess.run(
        [cmake, "-S", ".", "-B", b, "-DSKBUILD_PROJECT_NAME=pyshard",
         "-DSKBUILD_PROJECT_VERSION=0.0.0", f"-DPython_EXECUTABLE={sys.executable}",
         f"-Dpybind11_DIR={pybind11.get_cmake_dir()}", "-DMPI_C_COMPILER=/nonexistent/mpicc",
         "-DPYSHARD_CUDA=OFF"],
        capture_output=True, text=True, env=env, timeout=120,
    )
out = r.stdout + r.stderr
lines = out.splitlines()
start = next((i for i, s in enumerate(lines) if s.startswith("CMake Error")), None)
if r.returncode == 0 or start is None or shutil.which("mpicc", path="/usr/bin:/bin"):
    text = "(a system MPI is installed where these docs were built: no message to show)\n"
else:
    stop = ("Configuring incomplete", "-- ")
    end = next((i for i in range(start, len(lines)) if lines[i].startswith(stop)), len(lines))
    text = "\n".join(lines[start:end]).strip() + "\n"
open(sys.argv[1], "w").write(text)
PYEOF

echo "[docs] sphinx-build -b doctest (the >>> examples, 1 rank)"
"$VENV/bin/sphinx-build" -q -W --keep-going -b doctest -d "$OUT/doctrees" docs/site \
  "$OUT/doctest" || fail "doctest"
echo "[docs] sphinx-build -b html -W"
"$VENV/bin/sphinx-build" -q -W --keep-going -b html -d "$OUT/doctrees" docs/site "$OUT/html" ||
  fail "html"
echo "[docs] ok: $OUT/html/index.html ($((SECONDS - t0)) s)"
