#!/usr/bin/env bash
# Stop the single-node Slurm cluster that slurm/local/start.sh started.
#
#   bash slurm/local/stop.sh               # cancel its jobs, stop slurmd and slurmctld, and
#                                          # munged if start.sh started it
#   bash slurm/local/stop.sh --keep-munge  # leave munged running
#   bash slurm/local/stop.sh --clean       # also delete $SLURM_LOCAL_DIR (state and logs)
#
# Stops only the processes named in its own pid files (never by process name).
set -uo pipefail

DIR=${SLURM_LOCAL_DIR:-${TMPDIR:-/tmp}/pyshard-slurm}
CONF=$DIR/slurm.conf
keep_munge=0
clean=0
for a in "$@"; do
    case $a in
        --keep-munge) keep_munge=1 ;;
        --clean) clean=1 ;;
        *) echo "usage: $0 [--keep-munge] [--clean]" >&2; exit 2 ;;
    esac
done
log() { echo "[slurm-local] $*"; }
PATH=$PATH:/usr/sbin:/sbin
if [ "$(id -u)" -eq 0 ]; then SUDO=(); else SUDO=(sudo -n); fi

alive_pid() { [ -n "$1" ] && [ "$1" != unknown ] && kill -0 "$1" 2>/dev/null; }

stop_pid() { # name pid
    local name=$1 pid=$2
    alive_pid "$pid" || return 0
    log "stopping $name (pid $pid)"
    "${SUDO[@]}" kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 100); do alive_pid "$pid" || return 0; sleep 0.1; done
    log "$name did not exit in 10 s; sending SIGKILL"
    "${SUDO[@]}" kill -KILL "$pid" 2>/dev/null || true
}

if [ -f "$CONF" ] && [ -s "$DIR/run/slurmctld.pid" ] && alive_pid "$(cat "$DIR/run/slurmctld.pid")"; then
    jobs=$(SLURM_CONF=$CONF squeue -h -o %i 2>/dev/null || true)
    if [ -n "$jobs" ]; then
        log "cancelling jobs: $(echo "$jobs" | tr '\n' ' ')"
        # shellcheck disable=SC2086
        SLURM_CONF=$CONF "${SUDO[@]}" scancel $jobs 2>/dev/null || true
        for _ in $(seq 50); do
            [ -z "$(SLURM_CONF=$CONF squeue -h -o %i 2>/dev/null)" ] && break
            sleep 0.2
        done
    fi
fi

for d in slurmd slurmctld; do
    f=$DIR/run/$d.pid
    [ -s "$f" ] && stop_pid "$d" "$(cat "$f")"
    rm -f "$f"
done

if [ "$keep_munge" -eq 0 ] && [ -f "$DIR/run/munged.started" ]; then
    pid=$(cat "$DIR/run/munged.started")
    [ "$pid" = unknown ] && pid=$(cat /run/munge/munged.pid 2>/dev/null || true)
    stop_pid munged "$pid"
    rm -f "$DIR/run/munged.started"
fi

if [ "$clean" -eq 1 ] && [ -d "$DIR" ]; then
    log "removing $DIR"
    "${SUDO[@]}" rm -rf "$DIR"
fi
log "stopped"
