# shellcheck shell=bash
# Killing a real node's processes (scripts/lib/node.sh sources it): one process, the node's
# cgroups, its containerd's shims; `node-kill DIR NODE` (node_power_off), the node vanishing as a
# machine that loses power; the pod network namespaces of a node.
#
# Needs: the NODE_* variables of the current node (node_load, scripts/lib/node-network.sh);
#   functions die, node_dirs, node_load; ip, stat, find.
# Provides: node_kill PID, node_stop DIR NAME, node_cgroup_pids, node_shim_pids ND,
#   node_kill_cgroups, node_power_off DIR NAME, node_pod_netns.

# Kills PID (TERM, then KILL after 10 s) and waits until it is gone.
node_kill() {
  local pid="$1"
  kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 100); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
  for _ in $(seq 1 50); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
}

node_stop() {
  local dir="$1" name="$2"
  [[ -f "$dir/$name.pid" ]] || return 0
  node_kill "$(cat "$dir/$name.pid")"
  rm -f "$dir/$name.pid"
}

# The PIDs in the current node's cgroup tree (every process of every pod of the node).
node_cgroup_pids() {
  local root
  for root in /sys/fs/cgroup/*/"$NODE_CGROUP"; do
    [[ -d "$root" ]] || continue
    find "$root" -name cgroup.procs -exec cat {} + 2>/dev/null
  done | sort -un
}

# The shims of the current node's containerd (ND): found by its socket in their command lines.
node_shim_pids() {
  local nd="$1" pid
  # shellcheck disable=SC2013 # file names /proc/PID/cmdline, one a line
  for pid in $(grep -lsz -- "$nd/containerd.sock" /proc/[0-9]*/cmdline | cut -d/ -f3); do
    [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" == containerd-shim* ]] && echo "$pid"
  done
  return 0
}

# SIGKILLs every process in the current node's cgroups until none is left (at most 5 s).
node_kill_cgroups() {
  local pid pids
  for _ in $(seq 1 25); do
    pids="$(node_cgroup_pids)"
    [[ -n "$pids" ]] || return 0
    for pid in $pids; do
      kill -KILL "$pid" 2>/dev/null || true
    done
    sleep 0.2
  done
}

# `node-kill DIR NAME`: the node vanishes as a machine that loses power. Its links are cut (the
# node ends of both veth pairs down: neither the API server nor another node's pods reach it,
# nor it them), then its kubelet, kube-proxy, containerd, the shims of its containerd and every
# process in its cgroups get SIGKILL, nothing graceful. Its pods stay as they were in the API
# (Running) until something there acts; `down` removes what is left (mounts, pod namespaces,
# cgroups).
node_power_off() {
  local dir="$1" name="$2" nd found=""
  [[ -f "$dir/nodes.state" ]] || die "$dir has no nodes (up DIR --node)"
  for nd in $(node_dirs "$dir"); do
    node_load "$nd"
    if [[ "$NODE_NAME" == "$name" ]]; then
      found="$nd"
      break
    fi
  done
  [[ -n "$found" ]] || die "$dir has no node $name (node.env NODES)"
  [[ ! -e "$nd/killed" ]] || die "node $name was killed already"
  local k="node-$NODE_INDEX" pid pids=()
  # The pod network namespaces of the node, while its pause processes still hold them (down
  # removes them).
  node_pod_netns >"$nd/podns"
  ip -n "$NODE_NETNS" link set eth0 down
  ip -n "$NODE_NETNS" link set eth1 down
  for pid in kubelet kube-proxy containerd; do
    [[ -f "$dir/$k/$pid.pid" ]] && pids+=("$(cat "$dir/$k/$pid.pid")")
  done
  mapfile -t -O "${#pids[@]}" pids < <(node_shim_pids "$nd")
  kill -KILL "${pids[@]}" 2>/dev/null || true
  node_kill_cgroups
  for pid in "${pids[@]}"; do
    for _ in $(seq 1 50); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
  done
  touch "$nd/killed"
  echo "control-plane: node $name killed (links cut; kubelet, kube-proxy, containerd, ${#pids[@]} processes and its cgroups' SIGKILLed)" >&2
}

# The pod network namespaces (/run/netns/cni-*, containerd 1.6 bind-mounts them there) of the
# current node: the ones its pods' processes are in, or whose interfaces have an address of its
# pod CIDR.
node_pod_netns() {
  local nsinodes="" pid f prefix="${NODE_POD_CIDR%.0/24}."
  for pid in $(node_cgroup_pids); do
    nsinodes+=" $(stat -L -c %i "/proc/$pid/ns/net" 2>/dev/null || true)"
  done
  for f in /run/netns/cni-*; do
    [[ -e "$f" ]] || continue
    if [[ " $nsinodes " == *" $(stat -L -c %i "$f" 2>/dev/null || echo none) "* ]] ||
      ip -n "${f##*/}" -4 -o addr show 2>/dev/null | grep -qF " inet $prefix"; then
      echo "$f"
    fi
  done
}
