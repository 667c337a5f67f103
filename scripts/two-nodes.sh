#!/usr/bin/env bash
# Two hosts on one machine: run COMMAND under mpiexec across two Linux hosts made of
# namespaces, so that the multi-node path (node-shared memory within a host, MPI over TCP
# between hosts) runs for real on one machine.
#
#   bash scripts/two-nodes.sh [-n N] [-ppn K] [--] COMMAND...
#
# runs `mpiexec -n N -ppn K COMMAND...` (default 4 ranks, 2 a host) with the ranks on two hosts,
# pyshard-h0 and pyshard-h1. Each host is:
# - a network namespace, the two joined by a veth pair (the interface is psh0 on both sides,
#   10.36.0.1/24 and 10.36.0.2/24, no default route: no traffic leaves the pair), with its own
#   /etc/netns/NAME/{hosts,nsswitch.conf,resolv.conf} naming both hosts (files only, no DNS);
# - and, per host, `unshare --uts --ipc --pid --fork --kill-child --mount-proc`: its own host
#   name, System V IPC, process ids (the ranks' pids repeat across hosts), a private tmpfs on
#   /dev/shm and its own boot id (a random file bind-mounted over
#   /proc/sys/kernel/random/boot_id: with a shared one UCX takes the hosts for one and uses
#   shared memory between them, and so would pyshard's machine key).
# mpiexec (PYSHARD_MPIEXEC, default the venv's: pip's MPICH, Hydra) runs on pyshard-h0's
# network (in a pid namespace of its own) and starts each host's proxy through `-launcher ssh
# -launcher-exec` this script's launcher, which makes that host's namespaces instead of ssh:
# the two hosts' pid namespaces are siblings, each sees only its own processes, and the ranks'
# pids repeat across hosts.
#
# Everything is torn down whatever happens (trap): the hosts' processes killed, the namespaces
# and their /etc/netns files deleted, /run/netns unmounted when no namespace is left. Prints
# the bytes that crossed the veth each way and warns of anything left in a host's /dev/shm
# (PYSHARD_TWO_NODES_SHM_STRICT=1: that fails the run). Exits with COMMAND's status (mpiexec's),
# or 77 with a message where the hosts cannot be made here (not root, no `ip`/`unshare`, no
# network namespaces), or 2 on bad arguments.
#
# Needs root and iproute2 (`ip`) and util-linux (`unshare`, `mount`); PYSHARD_TWO_NODES_INSTALL=1
# installs iproute2 with apt-get where `ip` is missing (CI's fresh Debian machine).
set -uo pipefail
SKIP=77
usage() {
  echo "usage: $0 [-n N] [-ppn K] [--] COMMAND..." >&2
  exit 2
}
N=4
PPN=2
while [ $# -gt 0 ]; do
  case $1 in
    -n) [ $# -ge 2 ] || usage; N=$2; shift 2 ;;
    -ppn) [ $# -ge 2 ] || usage; PPN=$2; shift 2 ;;
    --) shift; break ;;
    -*) usage ;;
    *) break ;;  # COMMAND (the -- is optional)
  esac
done
[ $# -gt 0 ] || usage
case "$N$PPN" in *[!0-9]*) usage ;; esac
[ "$N" -ge 1 ] && [ "$PPN" -ge 1 ] || usage
skip() {
  echo "two-nodes: SKIPPED: $*" >&2
  exit $SKIP
}

ROOT=$(cd "$(dirname "$0")/.." && pwd)
MPIEXEC=${PYSHARD_MPIEXEC:-$ROOT/.venv/bin/mpiexec}
[ -x "$MPIEXEC" ] || { echo "two-nodes: no mpiexec at $MPIEXEC (run scripts/setup.sh)" >&2; exit 2; }
[ "$(id -u)" = 0 ] || skip "needs root to make network namespaces (running as uid $(id -u))"
if ! command -v ip >/dev/null && [ "${PYSHARD_TWO_NODES_INSTALL:-0}" = 1 ] &&
  command -v apt-get >/dev/null; then
  echo "two-nodes: installing iproute2" >&2
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2; } \
    >/dev/null 2>&1
fi
for tool in ip unshare mount hostname; do
  command -v "$tool" >/dev/null || skip "no \`$tool\` here (iproute2, util-linux)"
done

ID=psh$$  # this run's namespaces and veth names: several runs can go on at once
HOSTS=(pyshard-h0 pyshard-h1)
NS=("${ID}h0" "${ID}h1")
ADDR=(10.36.0.1 10.36.0.2)
IFACE=psh0
STATE=$(mktemp -d "${TMPDIR:-/tmp}/pyshard-two-nodes.XXXXXX")
MADE_ETC_NETNS=0
[ -d /etc/netns ] || MADE_ETC_NETNS=1

cleanup() {
  trap - EXIT INT TERM HUP
  local i pids left
  for i in 0 1; do  # every process of either host (they are the ones in its network)
    pids=$(ip netns pids "${NS[$i]}" 2>/dev/null)
    [ -n "$pids" ] && kill -9 $pids 2>/dev/null
  done
  for i in 0 1; do
    ip netns del "${NS[$i]}" 2>/dev/null  # the veth pair goes with it
    rm -rf "/etc/netns/${NS[$i]}"
  done
  [ $MADE_ETC_NETNS = 1 ] && rmdir /etc/netns 2>/dev/null
  left=$(ls -A /run/netns 2>/dev/null)
  if [ -d /run/netns ] && [ -z "$left" ]; then
    umount /run/netns 2>/dev/null
    rmdir /run/netns 2>/dev/null
  fi
  ip link del "${ID}a" 2>/dev/null  # where setup stopped before moving it
  rm -rf "$STATE"
}
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
trap 'exit 129' HUP

# --- the network: two namespaces and a veth pair between them
ip netns add "${NS[0]}" 2>"$STATE/err" ||
  skip "cannot make a network namespace: $(cat "$STATE/err")"
ip netns add "${NS[1]}" || exit 1
fail() {
  echo "two-nodes: setup failed: $*" >&2
  exit 1
}
ip link add "${ID}a" type veth peer name "${ID}b" || fail "no veth pair"
for i in 0 1; do
  dev=$([ $i = 0 ] && echo "${ID}a" || echo "${ID}b")
  ip link set "$dev" netns "${NS[$i]}" || fail "veth into ${NS[$i]}"
  ip -n "${NS[$i]}" link set "$dev" name "$IFACE" || fail "veth name"
  ip netns exec "${NS[$i]}" sysctl -qw "net.ipv6.conf.$IFACE.disable_ipv6=1" 2>/dev/null
  ip -n "${NS[$i]}" addr add "${ADDR[$i]}/24" dev "$IFACE" || fail "address"
  ip -n "${NS[$i]}" link set lo up || fail "lo up"
  ip -n "${NS[$i]}" link set "$IFACE" up || fail "veth up"
  mkdir -p "/etc/netns/${NS[$i]}"
  {
    echo "127.0.0.1 localhost"
    echo "${ADDR[0]} ${HOSTS[0]}"
    echo "${ADDR[1]} ${HOSTS[1]}"
  } >"/etc/netns/${NS[$i]}/hosts"
  sed -e 's/^hosts:.*/hosts: files/' /etc/nsswitch.conf >"/etc/netns/${NS[$i]}/nsswitch.conf" \
    2>/dev/null || echo "hosts: files" >"/etc/netns/${NS[$i]}/nsswitch.conf"
  echo "# two-nodes: no DNS" >"/etc/netns/${NS[$i]}/resolv.conf"
  cat /proc/sys/kernel/random/uuid >"$STATE/boot_id.${HOSTS[$i]}"
done
# both ends UP (an interface still coming up is skipped by UCX)
for _ in $(seq 100); do
  up=0
  for i in 0 1; do
    ip -n "${NS[$i]}" -o link show "$IFACE" | grep -q 'state UP' && up=$((up + 1))
  done
  [ $up = 2 ] && break
  sleep 0.1
done
[ $up = 2 ] || fail "the veth pair did not come up"

# --- a host: the namespaces of one host around a command (run inside its network namespace)
cat >"$STATE/host.sh" <<'EOF'
# host.sh STATE HOST COMMAND...: become HOST (in a fresh uts/ipc/pid/mount namespace), run
# COMMAND, say what it left in this host's /dev/shm
state=$1 h=$2
shift 2
hostname "$h" || exit 1
mount -t tmpfs -o mode=1777 tmpfs /dev/shm || exit 1
mount --bind "$state/boot_id.$h" /proc/sys/kernel/random/boot_id || exit 1
"$@"
rc=$?
left=$(ls -A /dev/shm)
if [ -n "$left" ]; then
  echo "two-nodes: $h: left in /dev/shm:" $left >&2
  echo "$h:" $left >>"$state/shm-left"
fi
exit $rc
EOF
# the launcher Hydra runs instead of ssh: [-x] HOST COMMAND... (the words as ssh would pass
# them to a remote shell)
cat >"$STATE/launch.sh" <<EOF
#!/bin/sh
[ "\$1" = -x ] && shift
case \$1 in
  ${HOSTS[0]}) ns=${NS[0]} ;;
  ${HOSTS[1]}) ns=${NS[1]} ;;
  *) echo "two-nodes: no host \$1" >&2; exit 255 ;;
esac
h=\$1
shift
exec ip netns exec "\$ns" unshare --uts --ipc --pid --fork --kill-child --mount-proc \\
  sh "$STATE/host.sh" "$STATE" "\$h" sh -c "\$*"
EOF
chmod +x "$STATE/launch.sh"

bytes() { # the bytes host i's end of the veth sent and received
  local d=/sys/class/net/$IFACE/statistics
  ip netns exec "${NS[$1]}" sh -c "echo \$(cat $d/tx_bytes) \$(cat $d/rx_bytes)"
}
read -r tx0 rx0 < <(bytes 0)

echo "two-nodes: $N ranks, $PPN a host, on ${HOSTS[0]} (${ADDR[0]}) and ${HOSTS[1]} (${ADDR[1]})" >&2
# mpiexec on the first host's network, in a pid namespace of its own (named as that host, for
# the proxies dial back to it by name); HYDRA_LAUNCHER_AUTOFORK=0: it starts the proxy of its
# own host through the launcher too, so that the two hosts' pid namespaces are siblings (no
# host sees the other's processes) with the same process tree (the ranks' pids repeat)
ip netns exec "${NS[0]}" unshare --uts --pid --fork --kill-child --mount-proc \
  sh -c 'hostname "$0" && exec "$@"' "${HOSTS[0]}" \
  env HYDRA_LAUNCHER_AUTOFORK=0 "$MPIEXEC" -launcher ssh -launcher-exec "$STATE/launch.sh" \
  -hosts "${HOSTS[0]},${HOSTS[1]}" -n "$N" -ppn "$PPN" "$@" &
wait $!
rc=$?

read -r tx1 rx1 < <(bytes 0)
echo "two-nodes: bytes crossed the veth: $((tx1 - tx0)) ${HOSTS[0]} -> ${HOSTS[1]}," \
  "$((rx1 - rx0)) ${HOSTS[1]} -> ${HOSTS[0]}" >&2
if [ -s "$STATE/shm-left" ] && [ "${PYSHARD_TWO_NODES_SHM_STRICT:-0}" = 1 ] && [ $rc = 0 ]; then
  echo "two-nodes: FAILED: files left in a host's /dev/shm" >&2
  rc=1
fi
exit $rc
