#!/usr/bin/env bash
# Start a single-node Slurm cluster on localhost (for testing the pyshard batch scripts).
#
#   bash slurm/local/start.sh           # idempotent: does nothing if it is already up
#   source "${SLURM_LOCAL_DIR:-/tmp/pyshard-slurm}/env.sh"   # then sbatch/squeue/srun work
#
# Needs root (or passwordless sudo). Installs slurm-wlm and munge with apt-get if missing,
# starts munged, writes $SLURM_LOCAL_DIR/slurm.conf from slurm/local/slurm.conf.in, starts
# slurmctld and slurmd with it, and waits until the node is idle.
#
# Environment:
#   SLURM_LOCAL_DIR    state, logs and the generated config (default ${TMPDIR:-/tmp}/pyshard-slurm)
#   SLURM_LOCAL_CPUS   CPUs the node claims (default: max(8, real count))
#   SLURM_LOCAL_CTLD_PORT, SLURM_LOCAL_SLURMD_PORT   (default 6817, 6818)
#   SLURM_LOCAL_TIMEOUT  seconds to wait for the node to become idle (default 60)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DIR=${SLURM_LOCAL_DIR:-${TMPDIR:-/tmp}/pyshard-slurm}
CONF=$DIR/slurm.conf
TIMEOUT=${SLURM_LOCAL_TIMEOUT:-60}

log() { echo "[slurm-local] $*"; }
die() { echo "[slurm-local] ERROR: $*" >&2; exit 1; }

if [ "$(id -u)" -eq 0 ]; then
    SUDO=()
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    SUDO=(sudo -n)
else
    die "needs root or passwordless sudo (it installs packages and starts daemons as root)"
fi

# --- packages ---------------------------------------------------------------------------------
need=()
for pair in slurmctld:slurm-wlm slurmd:slurm-wlm munged:munge; do
    cmd=${pair%%:*}
    pkg=${pair#*:}
    if ! command -v "$cmd" >/dev/null && [ ! -x "/usr/sbin/$cmd" ]; then
        need+=("$pkg")
    fi
done
if [ ${#need[@]} -gt 0 ]; then
    mapfile -t need < <(printf '%s\n' "${need[@]}" | sort -u)
    command -v apt-get >/dev/null || die "missing ${need[*]} and no apt-get; install Slurm and munge yourself"
    log "installing ${need[*]} (apt-get)"
    t0=$SECONDS
    "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y "${need[@]}" >"${TMPDIR:-/tmp}/pyshard-slurm-apt.log" 2>&1 || {
        log "apt-get install failed; trying apt-get update first"
        "${SUDO[@]}" apt-get update >>"${TMPDIR:-/tmp}/pyshard-slurm-apt.log" 2>&1
        "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y "${need[@]}" \
            >>"${TMPDIR:-/tmp}/pyshard-slurm-apt.log" 2>&1 ||
            die "apt-get install ${need[*]} failed; see ${TMPDIR:-/tmp}/pyshard-slurm-apt.log"
    }
    log "installed in $((SECONDS - t0)) s"
fi
PATH=$PATH:/usr/sbin:/sbin
export PATH

# --- munge ------------------------------------------------------------------------------------
munge_ok() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }
mkdir -p "$DIR/run" "$DIR/log" "$DIR/state" "$DIR/spool"
if munge_ok; then
    log "munged already running"
else
    if [ ! -s /etc/munge/munge.key ]; then
        log "creating /etc/munge/munge.key"
        if command -v mungekey >/dev/null; then
            "${SUDO[@]}" mungekey --create --keyfile=/etc/munge/munge.key
        else
            "${SUDO[@]}" dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
        fi
        "${SUDO[@]}" chown munge:munge /etc/munge/munge.key
        "${SUDO[@]}" chmod 0400 /etc/munge/munge.key
    fi
    "${SUDO[@]}" mkdir -p /run/munge /var/log/munge /var/lib/munge
    "${SUDO[@]}" chown munge:munge /run/munge /var/log/munge /var/lib/munge
    "${SUDO[@]}" chmod 0755 /run/munge
    log "starting munged"
    "${SUDO[@]}" runuser -u munge -- /usr/sbin/munged
    for _ in $(seq 50); do munge_ok && break; sleep 0.1; done
    munge_ok || die "munged does not answer (see /var/log/munge/munged.log)"
    # Remember that we started it, so stop.sh stops it again.
    cat /run/munge/munged.pid >"$DIR/run/munged.started" 2>/dev/null || echo unknown >"$DIR/run/munged.started"
fi

# --- slurm.conf -------------------------------------------------------------------------------
node=$(hostname -s)
hw=$(slurmd -C | head -1)
field() { echo "$hw" | tr ' ' '\n' | sed -n "s/^$1=//p"; }
real_cpus=$(field CPUs)
sockets=$(field SocketsPerBoard)
sockets=${sockets:-$(field Sockets)}
threads=$(field ThreadsPerCore)
mem=$(field RealMemory)
want=${SLURM_LOCAL_CPUS:-8}
[ "$want" -ge "$real_cpus" ] || want=$real_cpus
# Keep CPUs = Sockets * CoresPerSocket * ThreadsPerCore when raising the CPU count.
cores=$(((want + sockets * threads - 1) / (sockets * threads)))
cpus=$((sockets * cores * threads))
user=$(id -un)
[ ${#SUDO[@]} -eq 0 ] || user=root
sed -e "s|@NODE@|$node|g" -e "s|@DIR@|$DIR|g" -e "s|@USER@|$user|g" \
    -e "s|@CPUS@|$cpus|g" -e "s|@SOCKETS@|$sockets|g" -e "s|@CORES@|$cores|g" \
    -e "s|@THREADS@|$threads|g" -e "s|@MEM@|${mem:-1000}|g" \
    -e "s|@CTLD_PORT@|${SLURM_LOCAL_CTLD_PORT:-6817}|g" \
    -e "s|@SLURMD_PORT@|${SLURM_LOCAL_SLURMD_PORT:-6818}|g" \
    "$here/slurm.conf.in" >"$CONF.new"
cat >"$DIR/env.sh" <<EOF
# source this to use the local cluster: sbatch, squeue, srun, scontrol
export SLURM_CONF=$CONF
EOF
export SLURM_CONF=$CONF

alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
ctld_pid=$DIR/run/slurmctld.pid
slurmd_pid=$DIR/run/slurmd.pid

if [ -f "$CONF" ] && ! cmp -s "$CONF" "$CONF.new" && { alive "$ctld_pid" || alive "$slurmd_pid"; }; then
    log "configuration changed; restarting the daemons"
    bash "$here/stop.sh" --keep-munge
fi
mv -f "$CONF.new" "$CONF"

# --- daemons ----------------------------------------------------------------------------------
if alive "$ctld_pid"; then
    log "slurmctld already running (pid $(cat "$ctld_pid"))"
else
    log "starting slurmctld"
    "${SUDO[@]}" slurmctld -f "$CONF" || die "slurmctld failed; see $DIR/log/slurmctld.log"
fi
if alive "$slurmd_pid"; then
    log "slurmd already running (pid $(cat "$slurmd_pid"))"
else
    log "starting slurmd"
    "${SUDO[@]}" slurmd -f "$CONF" || die "slurmd failed; see $DIR/log/slurmd.log"
fi

# --- wait for the node ------------------------------------------------------------------------
t0=$SECONDS
state=
while [ $((SECONDS - t0)) -lt "$TIMEOUT" ]; do
    state=$(sinfo -h -n "$node" -o %t 2>/dev/null | head -1 || true)
    case $state in
        idle | mix | alloc | comp) break ;;
        down* | drain* | drng*)
            # e.g. a node left down by an earlier slurmd; ReturnToService=2 usually handles it
            "${SUDO[@]}" scontrol update nodename="$node" state=resume 2>/dev/null || true ;;
    esac
    sleep 0.5
done
case $state in
    idle | mix | alloc | comp) ;;
    *)
        tail -n 20 "$DIR/log/slurmctld.log" "$DIR/log/slurmd.log" >&2 || true
        die "node $node is '${state:-unknown}' after ${TIMEOUT} s (logs above)" ;;
esac
log "node $node is $state: CPUs=$cpus (real $real_cpus) Sockets=$sockets CoresPerSocket=$cores ThreadsPerCore=$threads ($((SECONDS - t0)) s)"
log "use it with: export SLURM_CONF=$CONF   (or: source $DIR/env.sh)"
