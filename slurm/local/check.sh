#!/usr/bin/env bash
# End-to-end check of the Slurm scripts on a single-node cluster on this machine.
#
#   bash slurm/local/check.sh          # from the repository root (needs root or passwordless sudo)
#
# Starts the local cluster (slurm/local/start.sh), submits strong_scaling.sbatch and
# weak_scaling.sbatch with small sizes at -n 2 and -n 4, stencil_scaling.sbatch at -n 4 (halo
# and stencil rows at 2 and 4 ranks, CHECK_PER_RANK per rank), plus one job with srun --mpi=none
# that must fail the rank check, waits for them (polling squeue), reads their exit codes with
# `scontrol show job`, checks the JSON lines they wrote, plots them if matplotlib is there,
# prints a summary and `slurm check: N passed, M failed`, and stops the cluster again.
#
# Environment:
#   PYSHARD_PYTHON   python with pyshard (default: <repo>/.venv/bin/python)
#   CHECK_SHAPE      strong-scaling global shape (default 1024x1024)
#   CHECK_PER_RANK   weak-scaling block per rank (default 256x1024)
#   CHECK_BENCH_ARGS extra bench arguments (default "--reps 3 --warmup 1")
#   CHECK_TIMEOUT    seconds to wait for all jobs (default 900)
#   CHECK_DIR        where job output and JSON go (default: a new /tmp/pyshard-slurm-check.*)
#   KEEP_CLUSTER=1   leave the daemons running at the end
#   SLURM_LOCAL_DIR  see start.sh
# If `python -m pyshard bench` does not exist yet, the jobs run `pyshard demo` instead and the
# JSON and plot checks are skipped (reported as such).
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
cd "$repo" || exit 1
export PYSHARD_PYTHON=${PYSHARD_PYTHON:-$repo/.venv/bin/python}
PY=$PYSHARD_PYTHON
export SLURM_LOCAL_DIR=${SLURM_LOCAL_DIR:-${TMPDIR:-/tmp}/pyshard-slurm}
CHECK_DIR=${CHECK_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/pyshard-slurm-check.XXXXXX")}
mkdir -p "$CHECK_DIR/out"
SHAPE_S=${CHECK_SHAPE:-1024x1024}
PER_RANK_W=${CHECK_PER_RANK:-256x1024}
TIMEOUT=${CHECK_TIMEOUT:-900}
t_start=$SECONDS

passed=0
failed=0
summary=()
record() { # PASS|FAIL|SKIP name detail
    local what=$1 name=$2 detail=${3:-}
    case $what in
        PASS) passed=$((passed + 1)) ;;
        FAIL) failed=$((failed + 1)) ;;
    esac
    summary+=("$(printf '%-4s  %-26s %s' "$what" "$name" "$detail")")
    printf '[check] %-4s %s: %s\n' "$what" "$name" "$detail"
}

finish() {
    local rc=$?
    if [ "${KEEP_CLUSTER:-0}" = 1 ]; then
        echo "[check] KEEP_CLUSTER=1: daemons left running (stop: bash slurm/local/stop.sh)"
    else
        bash "$here/stop.sh" >/dev/null 2>&1 || echo "[check] stop.sh failed" >&2
    fi
    echo
    echo "=== summary (job output and JSON in $CHECK_DIR; $((SECONDS - t_start)) s in all)"
    local line
    for line in "${summary[@]}"; do echo "$line"; done
    echo "slurm check: $passed passed, $failed failed"
    if [ "$failed" -gt 0 ]; then exit 1; fi
    exit "$rc"
}
trap finish EXIT
trap 'echo "[check] interrupted"; failed=$((failed + 1)); exit 130' INT TERM

# --- cluster ----------------------------------------------------------------------------------
t0=$SECONDS
if bash "$here/start.sh"; then
    record PASS "cluster start" "$((SECONDS - t0)) s"
else
    record FAIL "cluster start" "start.sh failed"
    exit 1
fi
export SLURM_CONF=$SLURM_LOCAL_DIR/slurm.conf
PATH=$PATH:/usr/sbin:/sbin

# --- what to run ------------------------------------------------------------------------------
[ -x "$PY" ] || command -v "$PY" >/dev/null || { record FAIL "python" "$PY not found"; exit 1; }
if "$PY" -m pyshard bench --help >/dev/null 2>&1; then
    mode=bench
    export PYSHARD_CMD=bench
    export BENCH_ARGS=${CHECK_BENCH_ARGS:---reps 3 --warmup 1}
    echo "[check] running 'pyshard bench $BENCH_ARGS' with $PY"
else
    mode=demo
    export PYSHARD_CMD=demo
    export BENCH_ARGS=${CHECK_BENCH_ARGS:---reps 2}
    echo "[check] 'pyshard bench' not found in $PY: using 'pyshard demo' as the stand-in" \
        "(no JSON; JSON and plot checks skipped)"
fi
unset RANKS SHAPE PER_RANK OUT_DIR PYSHARD_SRUN_MPI SRUN_ARGS DTYPE PREFLIGHT

# The rank counts a job runs: the scripts' default sweep (2, 4, ..., n).
sweep() {
    local n=$1 r=2 list=()
    while [ "$r" -lt "$n" ]; do list+=("$r"); r=$((r * 2)); done
    list+=("$n")
    (IFS=,; echo "${list[*]}")
}

# --- submit -----------------------------------------------------------------------------------
declare -A job_of job_kind job_n job_ranks job_expect
labels=()
submit() { # label kind n expect(ok|fail) [VAR=value...]
    local label=$1 kind=$2 n=$3 expect=$4
    shift 4
    local ranks
    ranks=$(sweep "$n")
    [ "$expect" = fail ] && ranks=$n
    local id
    if id=$(env OUT_DIR="$CHECK_DIR/out" SHAPE="$SHAPE_S" PER_RANK="$PER_RANK_W" \
        RANKS="$ranks" "$@" \
        sbatch --parsable -n "$n" -J "pyshard-$label" -o "$CHECK_DIR/$label-%j.out" \
        --time=00:15:00 "$repo/slurm/${kind}_scaling.sbatch" 2>&1); then
        id=${id%%;*}
        job_of[$label]=$id
        job_kind[$label]=$kind
        job_n[$label]=$n
        job_ranks[$label]=$ranks
        job_expect[$label]=$expect
        labels+=("$label")
        echo "[check] submitted $label: job $id (${kind}, -n $n, ranks $ranks)"
    else
        record FAIL "submit $label" "sbatch: $id"
    fi
}
t_submit=$SECONDS
submit strong-n2 strong 2 ok
submit strong-n4 strong 4 ok
submit weak-n2 weak 2 ok
submit weak-n4 weak 4 ok
submit stencil-n4 stencil 4 ok
submit mpi-none-n2 strong 2 fail PYSHARD_SRUN_MPI=none

# A job that can never run is refused at submit (EnforcePartLimits=ALL), not left pending.
if out=$(sbatch --parsable -n 4096 -o /dev/null --wrap true 2>&1); then
    record FAIL "oversized job refused" "sbatch accepted -n 4096 (job ${out%%;*})"
    scancel "${out%%;*}" 2>/dev/null
else
    record PASS "oversized job refused" "$(echo "$out" | tail -1)"
fi

# --- wait -------------------------------------------------------------------------------------
echo "[check] waiting for ${#labels[@]} job(s) (timeout ${TIMEOUT} s)"
while :; do
    pending=0
    for label in "${labels[@]}"; do
        [ -n "$(squeue -h -j "${job_of[$label]}" -o %T 2>/dev/null)" ] && pending=$((pending + 1))
    done
    [ "$pending" -eq 0 ] && break
    if [ $((SECONDS - t_submit)) -ge "$TIMEOUT" ]; then
        echo "[check] timeout: $pending job(s) still queued or running:"
        squeue
        break
    fi
    sleep 0.5
done
echo "[check] jobs finished after $((SECONDS - t_submit)) s"

# --- check each job ---------------------------------------------------------------------------
jfield() { echo "$2" | tr ' ' '\n' | sed -n "s/^$1=//p" | head -1; }

check_json() { # file kind n ranks
    "$PY" - "$@" "$SHAPE_S" "$PER_RANK_W" <<'EOF'
import json, math, sys
path, kind, n, ranks, shape_s, per_rank = sys.argv[1:7]
want_ranks = sorted(int(r) for r in ranks.split(","))
keys = ("case shape dtype ranks mesh algorithm median_s min_s floor_median_s ratio_to_floor "
        "baseline_median_s ratio_to_baseline bytes_per_rank peak_extra_bytes gbps").split()
def shp(v):
    if isinstance(v, str):
        return [int(x) for x in v.lower().split("x")]
    return [int(x) for x in v]
errs, recs = [], []
try:
    lines = open(path).read().splitlines()
except OSError as e:
    print(f"cannot read {path}: {e}")
    sys.exit(1)
if kind == "stencil":  # halo and stencil rows of their own (pyshard.bench.halo)
    seen = {}
    for i, line in enumerate(lines, 1):
        o = json.loads(line)
        seen.setdefault(int(o["ranks"]), set()).add(o["case"])
        if o["case"] == "halo":
            for row in o["rows"]:
                t = row["times_s"]
                if not all(t[k] > 0 for k in ("pyshard-persistent", "floor")):
                    errs.append(f"line {i}: halo times {t}")
        elif o["case"] == "stencil":
            if not all(o[s]["blocking_s"] > 0 and o[s]["overlapped_s"] > 0 for s in ("star", "box")):
                errs.append(f"line {i}: stencil times")
        else:
            errs.append(f"line {i}: unexpected case {o['case']}")
    if sorted(seen) != want_ranks or any(v != {"halo", "stencil"} for v in seen.values()):
        errs.append(f"ranks/cases {seen} != {want_ranks} x halo, stencil")
    if errs:
        print("; ".join(errs[:5]))
        sys.exit(1)
    print(f"{len(lines)} records: halo and stencil x ranks {sorted(seen)}")
    sys.exit(0)
for i, line in enumerate(lines, 1):
    try:
        o = json.loads(line)
    except ValueError as e:
        errs.append(f"line {i}: not JSON ({e})")
        continue
    if not isinstance(o, dict):
        errs.append(f"line {i}: not a JSON object")
        continue
    miss = [k for k in keys if k not in o]
    if miss:
        errs.append(f"line {i}: missing keys {miss}")
        continue
    recs.append(o)
    m = o["median_s"]
    if not isinstance(m, (int, float)) or not math.isfinite(m) or m <= 0:
        errs.append(f"line {i}: median_s={m!r}")
    if o.get("check") is False:
        errs.append(f"line {i}: {o['case']} at {o['ranks']} ranks: check is false (wrong result)")
    try:
        ok = math.prod(int(x) for x in o["mesh"]) == int(o["ranks"]) and shp(o["shape"])
    except (TypeError, ValueError):
        ok = False
    if not ok:
        errs.append(f"line {i}: mesh {o['mesh']} / shape {o['shape']} / ranks {o['ranks']} malformed or inconsistent")
        recs.pop()
# The benchmarked global shape: every rank count has cases at exactly that shape (some cases,
# such as small or transpose_uneven, use shapes of their own); for strong scaling each case
# keeps its shape at every rank count.
def want_shape(r):
    if kind == "strong":
        return shp(shape_s)
    pr = shp(per_rank)
    return [pr[0] * r] + pr[1:]
for r in sorted(set(int(o["ranks"]) for o in recs)):
    if not any(shp(o["shape"]) == want_shape(r) for o in recs if int(o["ranks"]) == r):
        errs.append(f"no case at {r} ranks has the shape {want_shape(r)}")
if kind == "strong":
    per_case = {}
    for o in recs:
        per_case.setdefault(o["case"], set()).add(tuple(shp(o["shape"])))
    for c, v in per_case.items():
        if len(v) > 1:
            errs.append(f"strong scaling: case {c} has shapes {sorted(v)}")
got = sorted(set(int(o["ranks"]) for o in recs))
if got != want_ranks:
    errs.append(f"rank counts {got} != expected {want_ranks}")
cases = {}
for o in recs:
    cases.setdefault(int(o["ranks"]), set()).add(o["case"])
if len(set(map(frozenset, cases.values()))) > 1:
    errs.append(f"the rank counts ran different cases: { {k: sorted(v) for k, v in cases.items()} }")
if not recs:
    errs.append("no records")
if errs:
    print("; ".join(errs[:5]) + (f" (+{len(errs) - 5} more)" if len(errs) > 5 else ""))
    sys.exit(1)
ncase = len(next(iter(cases.values())))
print(f"{len(recs)} records, {ncase} cases x ranks {got}")
EOF
}

for label in "${labels[@]}"; do
    id=${job_of[$label]}
    info=$(scontrol show job -o "$id" 2>&1)
    state=$(jfield JobState "$info")
    code=$(jfield ExitCode "$info")
    runtime=$(jfield RunTime "$info")
    outf="$CHECK_DIR/$label-$id.out"
    if [ "${job_expect[$label]}" = fail ]; then
        # srun --mpi=none starts separate 1-rank jobs; the script must notice and fail.
        if [ "$state" = FAILED ] && grep -q 'expected ranks=' "$outf" 2>/dev/null; then
            record PASS "$label detected" "job $id $state exit $code: $(grep -m1 -o 'expected ranks=[^(]*' "$outf")"
        else
            record FAIL "$label detected" "job $id state=$state exit=$code; no rank-check failure in $outf"
            tail -n 20 "$outf" 2>/dev/null | sed 's/^/    /'
        fi
        continue
    fi
    if [ "$state" = COMPLETED ] && [ "$code" = 0:0 ]; then
        record PASS "$label job" "job $id COMPLETED in $runtime (ranks ${job_ranks[$label]})"
    else
        record FAIL "$label job" "job $id state=$state exit=$code (output: $outf)"
        tail -n 30 "$outf" 2>/dev/null | sed 's/^/    /'
        continue
    fi
    # The script's own rank checks: the preflight and one per run.
    nok=$(grep -c '^ranks check ok' "$outf" 2>/dev/null)
    nwant=$(($(echo "${job_ranks[$label]}" | tr ',' '\n' | wc -l) + 1))
    if [ "$nok" = "$nwant" ]; then
        record PASS "$label rank checks" "$nok of $nwant (preflight + each run)"
    else
        record FAIL "$label rank checks" "$nok 'ranks check ok' lines, expected $nwant"
    fi
    json="$CHECK_DIR/out/${job_kind[$label]}_$id.jsonl"
    if [ "$mode" = demo ]; then
        record SKIP "$label JSON" "pyshard bench not available (demo writes no JSON)"
    elif res=$(check_json "$json" "${job_kind[$label]}" "${job_n[$label]}" "${job_ranks[$label]}"); then
        record PASS "$label JSON" "$res"
    else
        record FAIL "$label JSON" "$json: $res"
    fi
done

# --- plot -------------------------------------------------------------------------------------
if [ "$mode" = demo ]; then
    record SKIP "plot" "no JSON (demo stand-in)"
elif ! "$PY" -c 'import matplotlib' 2>/dev/null; then
    record SKIP "plot" "matplotlib is not importable by $PY"
else
    t0=$SECONDS
    if plog=$(OUT_DIR="$CHECK_DIR/out" bash "$repo/slurm/plot.sh" 2>&1); then
        pngs=$(cd "$CHECK_DIR/out" && for f in *_scaling.png; do [ -f "$f" ] && printf '%s ' "$f"; done)
        if [ -s "$CHECK_DIR/out/strong_scaling.png" ] && [ -s "$CHECK_DIR/out/weak_scaling.png" ]; then
            record PASS "plot" "$pngs($((SECONDS - t0)) s)"
        else
            record FAIL "plot" "plot.sh ran but wrote: ${pngs:-nothing}"
        fi
    else
        record FAIL "plot" "plot.sh failed: $(echo "$plog" | tail -3 | tr '\n' ' ')"
    fi
fi
