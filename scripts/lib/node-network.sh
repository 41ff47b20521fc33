# shellcheck shell=bash
# shellcheck disable=SC2154 # node_count, node_name, node_outside, node_sysctls: scripts/lib/node.sh
# The real nodes' network and state (scripts/lib/node.sh sources it): free slots, the hub and
# node network namespaces with their links and routes, DIR/nodes.state and DIR/node-K/state
# (the NODE_* variables of each node), the host's pod namespaces and iptables chains as `up`
# found them.
#
# Needs: variables node_count, node_name, node_outside, node_sysctls (scripts/lib/node.sh);
#   function die; ip, nsenter, iptables, sysctl.
# Provides: node_network DIR (sets API_HOST and node 1's NODE_*), node_write_state, node_links,
#   in_node COMMAND..., node_dirs DIR, node_load ND, node_slot_free, node_cni_netns,
#   node_host_chains.

# Runs a command in the current node's network namespace (and nothing else of it: mounts and
# cgroups are the host's).
in_node() {
  nsenter --net="/run/netns/$NODE_NETNS" "$@"
}

# The directories of DIR's nodes, DIR/node-1 .. DIR/node-N (those `up` began).
node_dirs() {
  local d
  for d in "$1"/node-[0-9]*; do
    [[ -f "$d/state" ]] && echo "$d"
  done | sort -V
}

# Sets the NODE_* variables of the node whose directory is ND.
node_load() {
  # shellcheck disable=SC1091 # written by node_network
  source "$1/state"
}

# A slot S is free when nothing of ours or anyone's uses its names and addresses.
node_slot_free() {
  local n="$1"
  [[ ! -e "/run/netns/jobset-inplace-node-$n" && ! -e "/run/netns/jobset-inplace-hub-$n" ]] &&
    ! ip link show "jsinode$n" >/dev/null 2>&1 &&
    ! ip -4 route show | grep -qE "^(172\.31\.$n\.|172\.30\.$n\.|10\.244\.$n\.)"
}

# Chooses N free slots, creates the hub, each node's namespace and links, and writes
# DIR/nodes.state and DIR/node-K/state (before making anything: `down` reads them, also after a
# failed `up`). Sets API_HOST (the first node's host end) and the NODE_* variables of node 1.
node_network() {
  local dir="$1" n slots=()
  for n in $(seq 1 250); do
    ((${#slots[@]} < node_count)) || break
    node_slot_free "$n" && slots+=("$n")
  done
  ((${#slots[@]} == node_count)) || die "no $node_count free node slots"
  node_write_state "$dir" "${slots[@]}"
  node_links "$dir" "jobset-inplace-hub-${slots[0]}"
  node_load "$dir/node-1"
}

# DIR/nodes.state, what `down` compares the host with (DIR/nodes.*), and DIR/node-K/state for the
# nodes in SLOT...; sets API_HOST.
node_write_state() {
  local dir="$1" n k
  shift
  local slots=("$@")
  local hub="jobset-inplace-hub-${slots[0]}" hub_net="172.30.${slots[0]}"
  API_HOST="172.31.${slots[0]}.1"
  cat >"$dir/nodes.state" <<EOF2
HUB_NETNS=$hub
API_HOST=$API_HOST
NODE_SLOTS="${slots[*]}"
EOF2
  # What of the outside paths existed before (those are only cleaned, not removed), the pod
  # network namespaces and host iptables chains there were (`down` checks it left no more).
  local p s
  for p in "${node_outside[@]}"; do
    [[ ! -e "$p" ]] || echo "$p"
  done >"$dir/nodes.preexisting"
  node_cni_netns >"$dir/nodes.podns"
  node_host_chains >"$dir/nodes.chains"
  for s in "${node_sysctls[@]}"; do
    echo "$s=$(sysctl -n "$s")"
  done >"$dir/nodes.sysctls"

  local names=()
  for k in $(seq 1 "$node_count"); do
    n="${slots[$((k - 1))]}"
    if ((node_count == 1)); then names+=("$node_name"); else names+=("$node_name-$k"); fi
    mkdir -p "$dir/node-$k"
    cat >"$dir/node-$k/state" <<EOF2
NODE_INDEX=$k
NODE_SLOT=$n
NODE_NAME=${names[$((k - 1))]}
NODE_NETNS=jobset-inplace-node-$n
NODE_HOST_VETH=jsinode$n
NODE_HUB_VETH=node$n
NODE_HOST_IP=172.31.$n.1
NODE_IP=172.31.$n.2
NODE_HUB_IP=$hub_net.$n
NODE_POD_CIDR=10.244.$n.0/24
NODE_CGROUP=jobset-inplace-node-$n
HUB_NETNS=$hub
EOF2
  done
  echo "NODE_NAMES=\"${names[*]}\"" >>"$dir/nodes.state"
}

# The hub namespace HUB with its bridge, each node's namespace, its two veth pairs and routes.
node_links() {
  local dir="$1" hub="$2"
  ip netns add "$hub"
  ip -n "$hub" link add hub type bridge
  ip -n "$hub" link set lo up
  ip -n "$hub" link set hub up
  local nd
  for nd in $(node_dirs "$dir"); do
    node_load "$nd"
    ip netns add "$NODE_NETNS"
    ip link add "$NODE_HOST_VETH" type veth peer name eth0 netns "$NODE_NETNS"
    ip addr add "$NODE_HOST_IP/30" dev "$NODE_HOST_VETH"
    ip link set "$NODE_HOST_VETH" up
    ip route add "$NODE_POD_CIDR" via "$NODE_IP" dev "$NODE_HOST_VETH"
    ip -n "$NODE_NETNS" addr add "$NODE_IP/30" dev eth0
    ip -n "$NODE_NETNS" link set lo up
    ip -n "$NODE_NETNS" link set eth0 up
    # The API server's address, when it is another node's host end: through this node's.
    [[ "$NODE_HOST_IP" == "$API_HOST" ]] ||
      ip -n "$NODE_NETNS" route add "$API_HOST/32" via "$NODE_HOST_IP" dev eth0
    # The hub link.
    ip -n "$hub" link add "$NODE_HUB_VETH" type veth peer name eth1 netns "$NODE_NETNS"
    ip -n "$hub" link set "$NODE_HUB_VETH" master hub
    ip -n "$hub" link set "$NODE_HUB_VETH" up
    ip -n "$NODE_NETNS" addr add "$NODE_HUB_IP/24" dev eth1
    ip -n "$NODE_NETNS" link set eth1 up
    # Routing between the pods' bridge and the links (per namespace; the host's stays as it is).
    in_node sysctl -qw net.ipv4.ip_forward=1
    in_node sysctl -qw net.bridge.bridge-nf-call-iptables=1 2>/dev/null || true
  done
  # Every node routes every other node's pod CIDR through that node's hub address.
  local other
  for nd in $(node_dirs "$dir"); do
    node_load "$nd"
    local netns="$NODE_NETNS" self="$NODE_INDEX"
    for other in $(node_dirs "$dir"); do
      node_load "$other"
      [[ "$NODE_INDEX" != "$self" ]] || continue
      ip -n "$netns" route add "$NODE_POD_CIDR" via "$NODE_HUB_IP" dev eth1
    done
  done
}

# The names of the pod network namespaces (containerd's /run/netns/cni-*) there are.
node_cni_netns() {
  local f
  for f in /run/netns/cni-*; do
    [[ -e "$f" ]] && echo "${f##*/}"
  done
  return 0
}

# The host's iptables chains named KUBE-* or CNI-* (kube-proxy and the CNI plugins write theirs
# inside the node namespaces only; `down` checks that the host has no more than before `up`).
node_host_chains() {
  local t
  for t in filter nat mangle; do
    iptables -t "$t" -S 2>/dev/null | awk -v t="$t" '$1 == "-N" && $2 ~ /^(KUBE|CNI)-/ { print t " " $2 }'
  done | sort
}
