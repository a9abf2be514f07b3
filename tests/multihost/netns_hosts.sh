#!/bin/bash
# netns_hosts.sh — two "hosts" on this machine for multi-host MPI runs: two
# network namespaces joined by a veth pair, so the ranks on them cannot use
# shared memory between them and talk over Open MPI's TCP BTL, as ranks on
# two nodes do.
#
#   netns_hosts.sh up NAME        namespaces NAME-a (10.77.0.1) and NAME-b (10.77.0.2)
#   netns_hosts.sh down NAME      removes them (and the veth pair with them)
#   netns_hosts.sh mpirun NAME [mpirun args...]
#                                 mpirun inside NAME-a with one slot per host; Open MPI
#                                 starts the daemon of "host" 10.77.0.2 in NAME-b through
#                                 netns_agent.sh (its ssh), and both the out-of-band
#                                 channel and the BTL use the veth subnet
#
# `up` exits 77 (skip) where namespaces cannot be made (no root, no iproute2,
# a container without CAP_NET_ADMIN), with the reason on stderr.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cmd=${1:-}
name=${2:-}
[ -n "$cmd" ] && [ -n "$name" ] || { echo "usage: $0 up|down|mpirun NAME [args]" >&2; exit 2; }
a=$name-a
b=$name-b
subnet=10.77.0

case "$cmd" in
up)
  command -v ip >/dev/null || { echo "netns_hosts: skipping: ip (iproute2) not found" >&2; exit 77; }
  ip netns add "$a" 2>/dev/null || { echo "netns_hosts: skipping: cannot create a network namespace (needs root / CAP_NET_ADMIN)" >&2; exit 77; }
  if ! { ip netns add "$b" && ip link add "$name-va" type veth peer name "$name-vb" &&
         ip link set "$name-va" netns "$a" && ip link set "$name-vb" netns "$b" &&
         ip -n "$a" addr add $subnet.1/24 dev "$name-va" && ip -n "$b" addr add $subnet.2/24 dev "$name-vb" &&
         ip -n "$a" link set "$name-va" up && ip -n "$b" link set "$name-vb" up &&
         ip -n "$a" link set lo up && ip -n "$b" link set lo up; } 2>/dev/null; then
    ip netns del "$a" 2>/dev/null; ip netns del "$b" 2>/dev/null
    echo "netns_hosts: skipping: cannot make the veth pair between the namespaces" >&2
    exit 77
  fi
  ;;
down)
  ip netns del "$a" 2>/dev/null
  ip netns del "$b" 2>/dev/null
  exit 0
  ;;
mpirun)
  shift 2
  hosts=$(mktemp)
  printf '%s.1 slots=1\n%s.2 slots=1\n' $subnet $subnet >"$hosts"
  MPIRPC_NETNS_MAP="$subnet.1=$a $subnet.2=$b" ip netns exec "$a" mpirun --hostfile "$hosts" \
    --mca plm_rsh_agent "$here/netns_agent.sh" --mca oob_tcp_if_include $subnet.0/24 \
    --mca btl self,tcp --mca btl_tcp_if_include $subnet.0/24 "$@"
  rc=$?
  rm -f "$hosts"
  exit $rc
  ;;
*) echo "usage: $0 up|down|mpirun NAME [args]" >&2; exit 2 ;;
esac
