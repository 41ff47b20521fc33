# shellcheck shell=bash
# shellcheck disable=SC2154 # node_outside and the NODE_* variables: set by the scripts that source this
# Removing the real nodes (scripts/lib/node.sh sources it; stop_all calls node_down): their pods,
# processes, mounts, cgroups, network namespaces, links and routes, the paths outside DIR `up`
# made, the host sysctls the kubelets changed; then the check that nothing of them is left.
#
# Needs: variable node_outside (scripts/lib/node.sh); functions alive (scripts/lib/supervise.sh),
#   node_dirs, node_load, node_cni_netns, node_host_chains (scripts/lib/node-network.sh), node_stop,
#   node_kill, node_kill_cgroups, node_shim_pids, node_cgroup_pids, node_pod_netns
#   (scripts/lib/node-power.sh); kubectl, ctr, ip, umount, sysctl; DIR/nodes.state and the
#   other DIR/nodes.* files node_network wrote.
# Provides: node_down DIR (1 when something is left, listed on stderr), node_leftovers DIR, and
#   its steps node_down_pods, node_down_processes (sets node_down_podns), node_down_mounts,
#   node_down_network, node_down_paths, node_down_sysctls.

# Removes everything of every node: pods, processes, mounts, cgroups, the network namespaces,
# files outside DIR; puts back the host sysctls the kubelets changed; then checks that nothing is
# left (node_leftovers) and fails if something is. Safe to run again, and after a failed `up`.
node_down() {
  local dir="$1"
  # shellcheck disable=SC1091 # written by node_network
  source "$dir/nodes.state"
  node_down_pods "$dir"
  node_down_processes "$dir"
  node_down_mounts "$dir"
  node_down_network "$dir"
  node_down_paths "$dir"
  node_down_sysctls "$dir"

  # 8. Nothing may be left.
  local left
  left="$(node_leftovers "$dir")"
  if [[ -n "$left" ]]; then
    echo "control-plane: down left behind:" >&2
    printf '%s\n' "$left" | sed 's/^/control-plane:   /' >&2
    return 1
  fi
  echo "control-plane: down: nothing of the $(wc -w <<<"$NODE_SLOTS") node(s) is left (processes, mounts, cgroups, namespaces, links, routes, iptables chains, pod namespaces, paths)" >&2
  rm -f "$dir/nodes.state" "$dir/node.env"
}

# 1. While the kubelets and the API server run: let the kubelets stop their pods (sandboxes
# torn down, CNI addresses released, pod network namespaces unmounted), at most 10 s; what is
# left then (containers ignoring SIGTERM, nodes killed) is killed below.
node_down_pods() {
  local dir="$1" nd
  local kubectl=(kubectl --kubeconfig "$dir/kubeconfig" --request-timeout 5s)
  local live=()
  for nd in $(node_dirs "$dir"); do
    node_load "$nd"
    [[ -f "$dir/node-$NODE_INDEX/kubelet.pid" ]] && alive "$dir" "node-$NODE_INDEX/kubelet" &&
      live+=("$nd")
  done
  if ((${#live[@]})) && [[ -f "$dir/kube-apiserver.pid" ]] && alive "$dir" kube-apiserver; then
    "${kubectl[@]}" delete pods --all-namespaces --all --grace-period 0 --force --wait=false \
      >/dev/null 2>&1 || true
    local deadline=$((SECONDS + 10))
    for nd in "${live[@]}"; do
      while ((SECONDS < deadline)); do
        [[ -z "$(ctr --address "$nd/containerd.sock" -n k8s.io tasks ls -q 2>/dev/null)" ]] && break
        sleep 0.5
      done
    done
  fi
}

# 2. Each node's processes, its pod namespaces, every process left in its cgroups (pods'
# containers), the shims of its containerd, then containerd.
node_down_processes() {
  local dir="$1" nd k pid
  node_down_podns=()
  for nd in $(node_dirs "$dir"); do
    node_load "$nd"
    k="node-$NODE_INDEX"
    node_stop "$dir" "$k/kube-proxy"
    node_stop "$dir" "$k/kubelet"
    mapfile -t -O "${#node_down_podns[@]}" node_down_podns < <(node_pod_netns; cat "$nd/podns" 2>/dev/null || true)
    node_kill_cgroups
    for pid in $(node_shim_pids "$nd"); do
      node_kill "$pid"
    done
    node_stop "$dir" "$k/containerd"
  done
}

# 3. Mounts: pod namespaces of ours, then everything under DIR (deepest first).
node_down_mounts() {
  local dir="$1" f
  for f in "${node_down_podns[@]}"; do
    [[ -e "$f" ]] || continue
    umount "$f" 2>/dev/null || umount -l "$f" 2>/dev/null || true
    rm -f "$f"
  done
  local m
  # shellcheck disable=SC2013 # one mount point a line, with no blanks (mountinfo escapes them)
  for m in $(awk -v d="$dir/" 'index($5, d) == 1 { print $5 }' /proc/self/mountinfo | sort -r); do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
  done
}

# 4. Cgroups (leaves first), 5. the network: each node's namespace (its bridge, iptables rules
# and veth pairs go with it; the host route with the veth), then the hub.
node_down_network() {
  local dir="$1" nd
  local h
  for nd in $(node_dirs "$dir"); do
    node_load "$nd"
    for h in /sys/fs/cgroup/*/"$NODE_CGROUP"; do
      [[ -d "$h" ]] || continue
      find "$h" -depth -type d -exec rmdir {} + 2>/dev/null || true
    done
    ip netns del "$NODE_NETNS" 2>/dev/null || true
    ip link del "$NODE_HOST_VETH" 2>/dev/null || true
  done
  ip netns del "$HUB_NETNS" 2>/dev/null || true
}

# 6. Paths outside DIR: removed when `up` made them, else only what is ours is taken out.
node_down_paths() {
  local dir="$1" nd f
  for f in "${node_outside[@]}"; do
    if ! grep -qxF "$f" "$dir/nodes.preexisting" 2>/dev/null; then
      rm -rf "$f"
      continue
    fi
    case "$f" in
      /var/log/containers)
        find "$f" -maxdepth 1 -type l -lname "$dir/*" -delete 2>/dev/null || true ;;
      /var/lib/cni)
        for nd in $(node_dirs "$dir"); do
          node_load "$nd"
          rm -f "$f"/results/"$NODE_NETNS"-* 2>/dev/null || true
        done ;;
    esac
  done
}

# 7. Host sysctls the kubelets set.
node_down_sysctls() {
  local dir="$1"
  local line
  while IFS= read -r line; do
    if [[ -n "$line" ]]; then
      sysctl -qw "$line" 2>/dev/null || true
    fi
  done <"$dir/nodes.sysctls"
}

# What of DIR's nodes is still there, one line each (nothing: all gone): processes in their
# cgroups or naming DIR/node-* (outside this script's own session), mounts under DIR, cgroups, network
# namespaces, host links and routes, host iptables chains and pod network namespaces that were
# not there before `up`, outside paths `up` made.
node_leftovers() {
  local dir="$1" nd pid own_sid f h
  # shellcheck disable=SC1091
  source "$dir/nodes.state"
  own_sid="$(awk '{ print $6 }' /proc/$$/stat)"
  for f in /proc/[0-9]*/cmdline; do
    pid="${f#/proc/}"
    pid="${pid%/cmdline}"
    [[ "$(awk '{ print $6 }' "/proc/$pid/stat" 2>/dev/null)" != "$own_sid" ]] || continue
    if tr '\0' ' ' 2>/dev/null <"$f" | grep -qF -- "$dir/node-"; then
      echo "process $pid: $(tr '\0' ' ' 2>/dev/null <"$f" | cut -c1-120)"
    fi
  done
  awk -v d="$dir/" 'index($5, d) == 1 { print "mount " $5 }' /proc/self/mountinfo
  for nd in $(node_dirs "$dir"); do
    node_load "$nd"
    for pid in $(node_cgroup_pids); do echo "process $pid in cgroup $NODE_CGROUP"; done
    for h in /sys/fs/cgroup/*/"$NODE_CGROUP"; do
      [[ ! -d "$h" ]] || echo "cgroup $h"
    done
    [[ ! -e "/run/netns/$NODE_NETNS" ]] || echo "network namespace $NODE_NETNS"
    ! ip link show "$NODE_HOST_VETH" >/dev/null 2>&1 || echo "link $NODE_HOST_VETH"
    ip -4 route show | grep -E "^(${NODE_POD_CIDR%/24}|172\.31\.$NODE_SLOT\.)" | sed 's/^/route /' || true
  done
  [[ ! -e "/run/netns/$HUB_NETNS" ]] || echo "network namespace $HUB_NETNS"
  comm -13 "$dir/nodes.chains" <(node_host_chains) | sed 's/^/iptables chain /' || true
  comm -13 <(sort "$dir/nodes.podns") <(node_cni_netns | sort) |
    sed 's/^/pod network namespace /' || true
  for f in "${node_outside[@]}"; do
    grep -qxF "$f" "$dir/nodes.preexisting" 2>/dev/null || [[ ! -e "$f" ]] || echo "path $f"
  done
  return 0
}
