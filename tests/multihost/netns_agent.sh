#!/bin/sh
# netns_agent.sh HOST COMMAND... — Open MPI's launch agent (plm_rsh_agent, its
# "ssh") for netns_hosts.sh: runs the daemon's command line in the network
# namespace that MPIRPC_NETNS_MAP ("ip=namespace ...") gives for HOST.
host=$1
shift
for pair in $MPIRPC_NETNS_MAP; do
  if [ "${pair%%=*}" = "$host" ]; then exec ip netns exec "${pair#*=}" sh -c "$*"; fi
done
echo "netns_agent: no namespace for host $host (MPIRPC_NETNS_MAP='$MPIRPC_NETNS_MAP')" >&2
exit 255
