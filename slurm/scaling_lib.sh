# shellcheck shell=bash
# Shared by strong_scaling.sbatch and weak_scaling.sbatch (sourced, not run).
#
# scaling_run strong|weak|stencil|fft
#   fft: strong scaling of pyshard.fft: `pyshard bench --cases fft --fft-n FFT_N` (default 512:
#   c2c and r2c FFT_N^3, slab and pencil, every installed pyshard.fft backend beside
#   mpi4py-fft's PFFT where it imports, and the batched 2-D FFT_BATCH, default 64x1024).
#   stencil: weak scaling of halo updates and heat steps: a PER_RANK block (default
#   1024x1024) per rank on the 2-D mesh MPI.Compute_dims(r, 2) = a x b, so the grid is
#   (a*rows)x(b*cols); runs `pyshard bench --cases halo,stencil --halo-shape G --stencil-shape G`.
#   For each rank count r in the sweep, runs
#     srun --mpi=$PYSHARD_SRUN_MPI -n r -N nodes $SRUN_ARGS \
#         $PYSHARD_PYTHON -m mpi4py -m pyshard bench --shape S --dtype D --json PART $BENCH_ARGS
#   (strong and weak; stencil and fft pass the arguments above instead of --shape and --dtype),
#   checks that every JSON line it wrote says "ranks": r (so N independent 1-rank jobs, which
#   srun --mpi=none starts with pip's MPICH, fail loudly), and appends them to
#   $OUT_DIR/<kind>_<jobid>.jsonl. With PYSHARD_CMD=demo (a test mode) it runs
#   `pyshard demo --shape S --dtype D` instead (no bench arguments, no BENCH_ARGS, no JSON).
#   Before any run (strong, weak, fft), scaling_check_memory estimates the memory per rank of
#   the runs and stops when one exceeds what a rank has (MEM_PER_RANK_GB; MEM_CHECK=0 skips).

# One BLAS/torch thread per core a rank has (docs/performance.md, "Threads"), unless set.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-${SLURM_CPUS_PER_TASK:-1}}

scaling_die() {
    echo "ERROR: $*" >&2
    exit 1
}

# Rank counts to run: $RANKS ("sweep" = 2, 4, 8, ... and ntasks; "ntasks" = only ntasks;
# or a list such as "1,2,4"). The sweep starts at 2: at 1 rank there is no communication to
# time (`pyshard bench` then times local copies against a memcpy floor).
scaling_rank_list() {
    local ntasks=$1 spec=${RANKS:-sweep} r
    case $spec in
        sweep)
            r=2
            while [ "$r" -lt "$ntasks" ]; do
                echo "$r"
                r=$((r * 2))
            done
            echo "$ntasks"
            ;;
        ntasks | all) echo "$ntasks" ;;
        *)
            for r in $(echo "$spec" | tr ',' ' '); do
                case $r in
                    '' | *[!0-9]*) scaling_die "RANKS: '$r' is not a number" ;;
                esac
                if [ "$r" -lt 1 ] || [ "$r" -gt "$ntasks" ]; then
                    scaling_die "RANKS: $r is outside 1..$ntasks (the allocation's tasks)"
                fi
                echo "$r"
            done
            ;;
    esac
}

# Check the rank count of one run: mode json reads the JSON lines bench wrote, mode demo the
# header lines of demo's output, mode preflight the lines of the preflight below.
# Prints one line; returns non-zero when the rank count is wrong or nothing was written.
scaling_check_ranks() { # mode file want
    "$PY" - "$1" "$2" "$3" <<'EOF'
import json, re, sys
mode, path, want = sys.argv[1], sys.argv[2], int(sys.argv[3])
hint = ("srun started independent 1-rank jobs instead of one MPI job: is srun's --mpi "
        "(PYSHARD_SRUN_MPI) right for this MPI? pmi2 for MPICH builds (pip's mpich), pmix for "
        "Open MPI; --mpi=none never works with pip's MPICH")
try:
    text = open(path).read()
except OSError as e:
    print(f"ranks check FAILED: cannot read {path}: {e}")
    sys.exit(1)
if mode == "json":
    got, bad = [], 0
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            got.append(int(json.loads(line)["ranks"]))
        except (ValueError, KeyError, TypeError):
            bad += 1
    if bad:
        print(f"ranks check FAILED: {bad} line(s) of {path} are not JSON objects with 'ranks'")
        sys.exit(1)
else:
    pat = r"^pyshard demo: (\d+) ranks" if mode == "demo" else r"^pyshard-preflight-size (\d+)$"
    got = [int(m) for m in re.findall(pat, text, re.M)]
if not got:
    print(f"ranks check FAILED: the run wrote no results ({path})")
    sys.exit(1)
wrong = sorted(set(g for g in got if g != want))
if wrong:
    print(f"ranks check FAILED: expected ranks={want}, the results say ranks={wrong} "
          f"({len(got)} record(s)). {hint}")
    sys.exit(1)
if mode != "json" and len(got) != 1:
    print(f"ranks check FAILED: expected ranks={want} in one MPI job, got {len(got)} "
          f"jobs. {hint}")
    sys.exit(1)
print(f"ranks check ok: {len(got)} record(s), all ranks={want}")
EOF
}

# Estimate the memory per rank of each run and stop before any run when one cannot fit.
# Estimates (peak RSS growth measured with MPICH at 2 ranks): gather and reduce_scatter hold
# about 7 copies of the whole global array on every rank (the result, the out= buffer, the
# baseline's and the floor's buffers; reduce_scatter's Partial source is global-sized on every
# rank), rebalance about 5.5 on rank 0 (which holds 7/8 of the rows), the other cases about 10
# copies of the rank's share; fft about 12 copies of the rank's share of FFT_N^3 complex128
# (and of the batched FFT_BATCH). Available per rank: MEM_PER_RANK_GB (GiB) if set, else
# SLURM_MEM_PER_CPU x cpus per task, else SLURM_MEM_PER_NODE, else MemAvailable of this
# node's /proc/meminfo, over the ranks a node runs (up to the tasks per node). MEM_CHECK=0
# skips the check.
scaling_check_memory() { # kind dtype shape_spec tasks_per_node "rank list"
    if [ "${MEM_CHECK:-1}" = 0 ]; then
        echo "  memory: not checked (MEM_CHECK=0)"
        return 0
    fi
    "$PY" - "$@" "${BENCH_ARGS:-}" "${FFT_BATCH:-64x1024}" <<'PYEOF'
import math, os, sys
kind, dtype, spec, per_node, ranks, bench_args, fft_batch = sys.argv[1:8]
per_node, ranks = max(1, int(per_node)), sorted(int(r) for r in ranks.split())
GiB = 2.0**30
REDIST = ["transpose", "transpose_uneven", "gather", "reduce_scatter", "swap2d", "rebalance",
          "small"]
GLOBAL_COPIES = {"gather": 7.0, "reduce_scatter": 7.5, "rebalance": 5.5}  # x the global array
SHARE_COPIES = 10.0  # the other cases (small: 64x64, nothing): x the rank's share
BASE = 0.25  # GiB a rank: python, numpy, MPI
if kind not in ("strong", "weak", "fft"):
    sys.exit(0)
cases = REDIST
toks = bench_args.split()  # word split, as the batch script passes them; the last one counts
for i, t in enumerate(toks):
    if t in ("--cases", "--case") and i + 1 < len(toks):
        cases = toks[i + 1].split(",")
    elif t.startswith(("--cases=", "--case=")):
        cases = t.split("=", 1)[1].split(",")
try:
    import numpy as np
    item = np.dtype(dtype).itemsize
except Exception:
    item = 8
dims = [int(v) for v in spec.lower().split("x")]


def need(r):
    """(GiB a rank, what needs it) at r ranks, or None (no case with an estimate)."""
    if kind == "fft":
        n = dims[0]
        est = [(12 * 16.0 * n**3 / r, f"fft {n}^3 complex128: 12 x the rank's share")]
        b, _, m = fft_batch.lower().partition("x")
        if b.isdigit() and int(b) > 0:
            gb = 16.0 * int(b) * int(m or 1024) ** 2
            est.append((12 * gb / r, f"batched fft {fft_batch}: 12 x the rank's share"))
    else:
        g = float(item) * math.prod(dims) * (r if kind == "weak" else 1)
        est = [(GLOBAL_COPIES[c] * g, f"{c}: {GLOBAL_COPIES[c]:g} x the global array")
               for c in cases if c in GLOBAL_COPIES]
        est += [(SHARE_COPIES * g / r, f"{c}: {SHARE_COPIES:g} x the rank's share")
                for c in cases if c in REDIST and c not in GLOBAL_COPIES and c != "small"]
    if not est:
        return None
    b, what = max(est)
    return BASE + b / GiB, what


def available():
    """(GiB, where that comes from, per rank (True) or per node (False))."""
    env = os.environ
    if env.get("MEM_PER_RANK_GB"):
        return float(env["MEM_PER_RANK_GB"]), "MEM_PER_RANK_GB", True
    mb = env.get("SLURM_MEM_PER_CPU", "")
    if mb.isdigit() and int(mb) > 0:
        cpt = int(env.get("SLURM_CPUS_PER_TASK", "1") or 1)
        return int(mb) * cpt / 1024, f"SLURM_MEM_PER_CPU {mb} MiB x {cpt} cpus a task", True
    mb = env.get("SLURM_MEM_PER_NODE", "")
    if mb.isdigit() and int(mb) > 0:
        return int(mb) / 1024, f"SLURM_MEM_PER_NODE {mb} MiB", False
    with open("/proc/meminfo") as f:
        kb = {ln.split(":")[0]: int(ln.split()[1]) for ln in f if len(ln.split()) >= 2}
    return kb.get("MemAvailable", kb.get("MemTotal", 0)) / 2**20, "MemAvailable here", False


est = {r: need(r) for r in ranks}
if all(v is None for v in est.values()):
    print("  memory: not checked (no case here has an estimate)")
    sys.exit(0)
try:
    mem, src, per_rank = available()
except (ValueError, OSError) as e:
    print(f"  memory: not checked (cannot tell the memory a rank has: {e}; set MEM_PER_RANK_GB)")
    sys.exit(0)


def have(r):  # GiB a rank at r ranks: a node's memory over the ranks on it
    return mem if per_rank else mem / min(r, per_node)


where = src if per_rank else f"{src} {mem:.1f} GiB a node / up to {per_node} ranks on it"
worst = max((r for r in ranks if est[r]), key=lambda r: est[r][0] / have(r))
gb, what = est[worst]
print(f"  memory: about {gb:.1f} GiB a rank at {worst} ranks ({what}), {have(worst):.1f} GiB "
      f"a rank there ({where})")
bad = [r for r in ranks if est[r] and est[r][0] > have(r)]
if bad:
    how = ("lower FFT_N or FFT_BATCH (FFT_BATCH=0 skips the batched case), or drop PFFT "
           "(BENCH_ARGS=--fft-pfft=)") if kind == "fft" else (
           f"lower {'SHAPE' if kind == 'strong' else 'PER_RANK'}, or leave out the cases "
           "that hold the global array on every rank: "
           "BENCH_ARGS=\"--cases transpose,transpose_uneven,swap2d,small\"")
    print(f"ERROR: not enough memory: the runs at {', '.join(map(str, bad))} ranks need about "
          f"{', '.join(f'{est[r][0]:.1f}' for r in bad)} GiB a rank ({est[bad[-1]][1]}), more "
          f"than a rank has ({', '.join(f'{have(r):.1f}' for r in bad)} GiB; {where}). To fit: "
          f"{how}; or use fewer tasks a node. MEM_PER_RANK_GB sets the GiB a rank has, "
          "MEM_CHECK=0 skips this estimate.", file=sys.stderr)
    sys.exit(1)
PYEOF
}

scaling_run() {
    local kind=$1
    PY=${PYSHARD_PYTHON:-python}
    local mpi=${PYSHARD_SRUN_MPI:-pmi2}
    local cmd=${PYSHARD_CMD:-bench}
    local dtype=${DTYPE:-float32}
    local out_dir=${OUT_DIR:-results}
    local jobid=${SLURM_JOB_ID:-nojob}
    local shape_spec

    if [ "$kind" = strong ]; then
        shape_spec=${SHAPE:-8192x8192}
    elif [ "$kind" = stencil ]; then
        shape_spec=${PER_RANK:-1024x1024}
    elif [ "$kind" = fft ]; then
        shape_spec=${FFT_N:-512}
        case $shape_spec in
            '' | *[!0-9]*) scaling_die "FFT_N '$shape_spec' is not a number" ;;
        esac
        shape_spec="${shape_spec}x${shape_spec}"
    else
        shape_spec=${PER_RANK:-2048x4096}
    fi
    case $shape_spec in
        [0-9]*x[0-9]*) ;;
        *) scaling_die "shape '$shape_spec' is not like 8192x8192" ;;
    esac
    if [ "$kind" = stencil ]; then # a 2-D grid per rank (the stencil bench's mesh is 2-D)
        case $shape_spec in
            *x*x*) scaling_die "PER_RANK '$shape_spec': the stencil runs take a 2-D grid per rank, like 2048x2048" ;;
        esac
    fi

    # Tasks in the allocation: -n, or --ntasks-per-node x nodes, or one per node.
    local nnodes=${SLURM_JOB_NUM_NODES:-${SLURM_NNODES:-1}}
    local ntasks=${SLURM_NTASKS:-${SLURM_NPROCS:-}}
    if [ -z "$ntasks" ] && [ -n "${SLURM_NTASKS_PER_NODE:-}" ]; then
        local tpn=${SLURM_NTASKS_PER_NODE%%[!0-9]*}
        ntasks=$((nnodes * ${tpn:-1}))
    fi
    ntasks=${ntasks:-$nnodes}
    local per_node=$(((ntasks + nnodes - 1) / nnodes))

    mkdir -p "$out_dir" || scaling_die "cannot create OUT_DIR=$out_dir"
    local out="$out_dir/${kind}_${jobid}.jsonl"
    local mode=json
    [ "$cmd" = bench ] || mode=demo
    # the element type the runs use: DTYPE for strong and weak; stencil and fft have their own
    local run_dtype=$dtype
    if [ "$kind" = stencil ]; then
        run_dtype=float64
    elif [ "$kind" = fft ]; then
        run_dtype=complex128
    fi

    echo "pyshard ${kind} scaling: job ${jobid} on ${SLURM_JOB_NODELIST:-$(hostname -s)}," \
        "${nnodes} node(s), ${ntasks} task(s), $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "  python: $PY ($("$PY" -c 'import sys; print(sys.version.split()[0])' 2>&1))"
    echo "  MPI:    $("$PY" -c 'from mpi4py import MPI; print(MPI.Get_library_version().splitlines()[0].strip())' 2>&1)"
    if [ "$mode" = json ]; then
        echo "  srun --mpi=$mpi${SRUN_ARGS:+ $SRUN_ARGS}; command: pyshard $cmd${BENCH_ARGS:+ $BENCH_ARGS}"
        echo "  results: $out"
    else
        echo "  srun --mpi=$mpi${SRUN_ARGS:+ $SRUN_ARGS}; command: pyshard $cmd --shape S --dtype $run_dtype${BENCH_ARGS:+ (BENCH_ARGS not passed: bench only)}"
        echo "  (PYSHARD_CMD=$cmd writes no JSON; checking ranks from its output)"
    fi
    if [ "$run_dtype" != "$dtype" ] && [ -n "${DTYPE:-}" ]; then
        echo "  (DTYPE=$DTYPE is ignored by the $kind runs: they use $run_dtype)"
    fi
    command -v srun >/dev/null || scaling_die "srun not found (run this under sbatch/salloc)"

    local ranks
    ranks=$(scaling_rank_list "$ntasks") || exit 1
    [ -n "$ranks" ] || scaling_die "RANKS='${RANKS:-}' names no rank count (give sweep, ntasks or a list such as 1,2,4)"
    local r nodes shape rows rest part logf rc t0 rmax=0
    for r in $ranks; do [ "$r" -gt "$rmax" ] && rmax=$r; done
    if [ "$mode" = json ]; then
        scaling_check_memory "$kind" "$dtype" "$shape_spec" "$per_node" "$ranks" ||
            scaling_die "the runs would not fit in memory (see above); no run was started"
    fi

    # Preflight at the largest rank count: one MPI job of rmax ranks, or rmax 1-rank jobs?
    # (srun --mpi=none with pip's MPICH starts separate 1-rank jobs that all succeed.)
    if [ "${PREFLIGHT:-1}" != 0 ]; then
        nodes=$(((rmax + per_node - 1) / per_node))
        [ "$nodes" -le "$nnodes" ] || nodes=$nnodes
        logf=$(mktemp "${TMPDIR:-/tmp}/pyshard-${kind}-XXXXXX.log")
        echo
        echo "== preflight: srun -n $rmax -N $nodes, MPI_COMM_WORLD size"
        # shellcheck disable=SC2086
        srun --mpi="$mpi" -n "$rmax" -N "$nodes" ${SRUN_ARGS:-} "$PY" -c \
            'from mpi4py import MPI; c = MPI.COMM_WORLD; c.rank or print("pyshard-preflight-size", c.size)' \
            >"$logf" 2>&1
        rc=$?
        if [ "$rc" -ne 0 ]; then
            cat "$logf"
            rm -f "$logf"
            scaling_die "preflight srun -n $rmax failed with exit code $rc (output above)"
        fi
        scaling_check_ranks preflight "$logf" "$rmax" ||
            {
                sed 's/^/  | /' "$logf" | head -n 20
                rm -f "$logf"
                scaling_die "preflight: srun -n $rmax did not start one MPI job of $rmax ranks"
            }
        rm -f "$logf"
    fi

    for r in $ranks; do
        nodes=$(((r + per_node - 1) / per_node))
        [ "$nodes" -le "$nnodes" ] || nodes=$nnodes
        if [ "$kind" = strong ]; then
            shape=$shape_spec
        elif [ "$kind" = fft ]; then
            shape="${shape_spec}x${shape_spec%%x*}"
        elif [ "$kind" = stencil ]; then
            # the 2-D mesh a x b of MPI.Compute_dims(r, 2): b the largest divisor <= sqrt(r)
            local b=1 d=1
            while [ $((d * d)) -le "$r" ]; do
                [ $((r % d)) -eq 0 ] && b=$d
                d=$((d + 1))
            done
            rows=${shape_spec%%x*}
            rest=${shape_spec#*x}
            shape="$((rows * (r / b)))x$((rest * b))"
        else
            rows=${shape_spec%%x*}
            rest=${shape_spec#*x}
            shape="$((rows * r))x$rest"
        fi
        part="$out_dir/.${kind}_${jobid}_r${r}.part"
        logf=$(mktemp "${TMPDIR:-/tmp}/pyshard-${kind}-XXXXXX.log")
        rm -f "$part"
        local args=(--shape "$shape" --dtype "$dtype") extra=()
        if [ "$mode" = json ]; then # bench arguments: only for `pyshard bench`
            [ "$kind" = stencil ] &&
                args=(--cases "halo,stencil" --halo-shape "$shape" --stencil-shape "$shape" --reps 6)
            [ "$kind" = fft ] &&
                args=(--cases fft --fft-n "${shape_spec%%x*}" --fft-batch "${FFT_BATCH:-64x1024}" --reps 3 --warmup 1)
            args+=(--json "$part")
            # shellcheck disable=SC2206  # BENCH_ARGS is a word list
            extra=(${BENCH_ARGS:-})
        else # demo (a test mode): only its own arguments, the kind's shape and dtype
            [ "$kind" = fft ] && shape=$shape_spec
            args=(--shape "$shape" --dtype "$run_dtype")
        fi
        echo
        echo "== ${kind}: ${r} rank(s) on ${nodes} node(s), global shape ${shape} ${run_dtype}"
        t0=$SECONDS
        # shellcheck disable=SC2086  # SRUN_ARGS is a word list
        srun --mpi="$mpi" -n "$r" -N "$nodes" ${SRUN_ARGS:-} \
            "$PY" -m mpi4py -m pyshard "$cmd" "${args[@]}" "${extra[@]}" 2>&1 | tee "$logf"
        rc=${PIPESTATUS[0]}
        echo "-- srun exit code $rc after $((SECONDS - t0)) s"
        if [ "$rc" -ne 0 ]; then
            # Say whether it failed because srun started separate 1-rank jobs.
            local src=$logf
            [ "$mode" = json ] && src=$part
            [ -s "$src" ] && scaling_check_ranks "$mode" "$src" "$r" | grep 'expected ranks' >&2
            rm -f "$part" "$logf"
            scaling_die "srun -n $r failed with exit code $rc (output above)"
        fi
        if [ "$mode" = json ]; then
            scaling_check_ranks json "$part" "$r" || {
                echo "--- $part:" >&2
                head -n 20 "$part" >&2 || true
                rm -f "$part" "$logf"
                scaling_die "srun -n $r: wrong rank count in the results (see above); $out not updated"
            }
            cat "$part" >>"$out"
            rm -f "$part"
        else
            scaling_check_ranks demo "$logf" "$r" ||
                { rm -f "$logf"; scaling_die "srun -n $r: wrong rank count (see above)"; }
        fi
        rm -f "$logf"
    done
    echo
    if [ "$mode" = json ]; then
        echo "done: $(wc -l <"$out") record(s) in $out"
    else
        echo "done (no JSON written by '$cmd')"
    fi
}
