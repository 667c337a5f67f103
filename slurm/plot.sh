#!/usr/bin/env bash
# Plot the JSON lines written by the batch scripts (strong_, weak_, stencil_, fft_scaling.sbatch).
#
#   bash slurm/plot.sh                       # $OUT_DIR (default results): strong_*.jsonl ->
#                                            # strong_scaling.png, weak_*, stencil_*, fft_* alike
#   bash slurm/plot.sh -o scaling.png FILE_OR_DIR...   # one plot of all the files given
#   bash slurm/plot.sh -o scaling.png        # $OUT_DIR: scaling_strong.png, scaling_weak.png, ...
#
# Runs `$PYSHARD_PYTHON -m pyshard plot FILE... -o OUT.png` (needs matplotlib in that python;
# PYSHARD_PYTHON defaults to python). PLOT_ARGS adds arguments to `pyshard plot`. It draws the
# redistribution cases, halo, stencil, fft and fft3d (time against ranks); rows of other cases
# (checkpoint, memory, sparse, many, migrate, unstructured) are skipped with a note.
set -euo pipefail

PY=${PYSHARD_PYTHON:-python}
OUT_DIR=${OUT_DIR:-results}
out=
inputs=()
while [ $# -gt 0 ]; do
    case $1 in
        -o | --output)
            [ $# -ge 2 ] || { echo "plot.sh: -o needs a file name" >&2; exit 2; }
            out=$2
            shift 2
            ;;
        -h | --help)
            sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
            exit 0
            ;;
        *)
            inputs+=("$1")
            shift
            ;;
    esac
done

if ! "$PY" -c 'import matplotlib' 2>/dev/null; then
    echo "plot.sh: matplotlib is not importable by $PY; install it (pip install matplotlib) or" \
        "set PYSHARD_PYTHON to a python that has it" >&2
    exit 3
fi

# Expand directories to the *.jsonl files in them; drop empty files.
collect() { # prints one file per line
    local p f
    for p in "$@"; do
        if [ -d "$p" ]; then
            for f in "$p"/*.jsonl; do [ -s "$f" ] && echo "$f"; done
        elif [ -s "$p" ]; then
            echo "$p"
        else
            echo "plot.sh: skipping $p (missing or empty)" >&2
        fi
    done
    return 0
}

plot() { # out files...
    local o=$1
    shift
    echo "plot.sh: $# file(s) -> $o"
    # shellcheck disable=SC2086  # PLOT_ARGS is a word list
    "$PY" -m pyshard plot "$@" -o "$o" ${PLOT_ARGS:-}
    [ -s "$o" ] || { echo "plot.sh: $o was not written" >&2; return 1; }
}

made=0
if [ ${#inputs[@]} -gt 0 ]; then
    mapfile -t files < <(collect "${inputs[@]}")
    [ ${#files[@]} -gt 0 ] || { echo "plot.sh: no non-empty JSON files in: ${inputs[*]}" >&2; exit 1; }
    plot "${out:-scaling.png}" "${files[@]}"
    made=1
else
    for kind in strong weak stencil fft; do
        mapfile -t files < <(collect "$OUT_DIR"/"$kind"_*.jsonl 2>/dev/null)
        if [ ${#files[@]} -eq 0 ]; then
            echo "plot.sh: no ${kind}_*.jsonl in $OUT_DIR (skipped)"
            continue
        fi
        if [ -n "$out" ]; then
            plot "${out%.png}_${kind}.png" "${files[@]}"
        else
            plot "$OUT_DIR/${kind}_scaling.png" "${files[@]}"
        fi
        made=$((made + 1))
    done
fi
[ "$made" -gt 0 ] || {
    echo "plot.sh: no strong_*, weak_*, stencil_* or fft_*.jsonl in $OUT_DIR" >&2
    exit 1
}
