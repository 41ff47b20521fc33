# shellcheck shell=bash
# shellcheck disable=SC2154 # ready_timeout, node_*, pause_image, REGISTRY, NODE_*: set by the scripts that source this
# Starting the real nodes (scripts/lib/node.sh sources it): kube-scheduler on the host, then
# each node's containerd (the pause image imported), kubelet and kube-proxy in its network
# namespace, DIR/node.env, and the wait until every node is Ready and its kube-proxy healthy.
#
# Needs: variables ready_timeout, node_gates, node_restart_gate, node_label, node_taint,
#   node_count, node_grace, pause_image, REGISTRY; functions die, fail, start, alive, wait_for,
#   free_port (scripts/lib/supervise.sh), kubeconfig (scripts/lib/pki.sh), node_dirs, node_load,
#   in_node (scripts/lib/node-network.sh), the config writers of scripts/lib/node-config.sh;
#   kubectl, ctr, nsenter, curl; DIR/kubeconfig, DIR/pki and the nodes' state (node_network).
# Provides: node_up DIR BIN API_PORT, node_start_one DIR ND BIN API_PORT GATE_VALUE,
#   node_wait_ready DIR, node_env DIR.

# kube-scheduler, then every node of DIR (their network made: node_network), DIR/node.env; waits
# until they are Ready.
node_up() {
  local dir="$1" bin="$2" api_port="$3" node_restart_gate_value
  case "$node_restart_gate" in
    on) node_restart_gate_value=true ;;
    off) node_restart_gate_value=false ;;
    *) die "JOBSET_INPLACE_NODE_RESTART_GATE must be on or off, not $node_restart_gate" ;;
  esac
  local sched_port
  sched_port="$(free_port)"
  echo "kube-scheduler=$sched_port" >>"$dir/ports"
  node_scheduler_config "$dir"
  start "$dir" kube-scheduler "$bin/kube-scheduler" --config "$dir/kube-scheduler.yaml" \
    --authentication-kubeconfig "$dir/kubeconfig" --authorization-kubeconfig "$dir/kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$sched_port" \
    --feature-gates "$node_gates" --profiling=false
  wait_for "$dir" kube-scheduler -k "https://127.0.0.1:$sched_port/healthz"

  local nd
  for nd in $(node_dirs "$dir"); do
    node_load "$nd"
    node_start_one "$dir" "$nd" "$bin" "$api_port" "$node_restart_gate_value"
  done
  node_env "$dir"
  node_wait_ready "$dir"
}

# Ready: every node Ready with only our taint (--taint) or none left (the node lifecycle
# controller takes not-ready off), the `kubernetes` Service programmed by each kube-proxy.
node_wait_ready() {
  local dir="$1" nd
  local kubectl=(kubectl --kubeconfig "$dir/kubeconfig")
  local deadline=$((SECONDS + ready_timeout)) want=""
  [[ -z "$node_taint" ]] || want="$node_label"
  for nd in $(node_dirs "$dir"); do
    node_load "$nd"
    local k="node-$NODE_INDEX"
    until [[ "$("${kubectl[@]}" get node "$NODE_NAME" -o \
      'jsonpath={.status.conditions[?(@.type=="Ready")].status}/{.spec.taints[*].key}' 2>/dev/null)" == "True/$want" ]]; do
      alive "$dir" "$k/kubelet" || fail "$dir" "$k/kubelet" "exited"
      alive "$dir" "$k/containerd" || fail "$dir" "$k/containerd" "exited"
      ((SECONDS < deadline)) || fail "$dir" "$k/kubelet" "node $NODE_NAME not Ready${want:+ with only its taint} within ${ready_timeout}s"
      sleep 0.5
    done
    until in_node curl -sf --max-time 2 http://127.0.0.1:10256/healthz >/dev/null 2>&1; do
      alive "$dir" "$k/kube-proxy" || fail "$dir" "$k/kube-proxy" "exited"
      ((SECONDS < deadline)) || fail "$dir" "$k/kube-proxy" "not healthy within ${ready_timeout}s"
      sleep 0.5
    done
  done
}

# DIR/node.env: the first node as NODE_* (as with one node), every node as NODE_K_*, their names
# in NODES.
node_env() {
  local dir="$1" nd first=1
  {
    # shellcheck disable=SC1091
    source "$dir/nodes.state"
    echo "NODES=\"$NODE_NAMES\""
    echo "NODE_COUNT=$node_count"
    echo "HUB_NETNS=$HUB_NETNS"
    echo "PAUSE_IMAGE=$pause_image"
    echo "NODE_TAINT=${node_taint:+$node_label=true:NoSchedule}"
    echo "NODE_RESTART_GATE=$node_restart_gate"
    echo "NODE_GRACE=${node_grace:-}"
    echo "REGISTRY=$REGISTRY"
    for nd in $(node_dirs "$dir"); do
      node_load "$nd"
      local fields=(
        "NAME=$NODE_NAME"
        "CONTAINERD_ADDRESS=$nd/containerd.sock"
        "CTR=\"ctr --address $nd/containerd.sock -n k8s.io\""
        "NETNS=$NODE_NETNS" "IP=$NODE_IP" "HOST_IP=$NODE_HOST_IP" "POD_CIDR=$NODE_POD_CIDR"
        "DIR=$nd" "CGROUP=$NODE_CGROUP")
      # The first node also as NODE_NAME, CONTAINERD_ADDRESS, CTR, NODE_IP, ... (one node's names).
      if ((first)); then
        printf '%s\n' "${fields[@]}" | sed -E 's/^(NAME|NETNS|IP|HOST_IP|POD_CIDR|DIR|CGROUP)=/NODE_\1=/'
      fi
      printf "NODE_${NODE_INDEX}_%s\n" "${fields[@]}"
      first=0
    done
  } >"$dir/node.env"
}

# Starts one node (ND's state loaded): its cgroup root, containerd, the pause image, kubelet and
# kube-proxy.
node_start_one() {
  local dir="$1" nd="$2" bin="$3" api_port="$4" node_restart_gate_value="$5" pki="$1/pki" k="node-$NODE_INDEX"
  mkdir -p "$nd"/{containerd,cni/net.d,cni/ipam,kubelet,pod-logs,volume-plugins,runc}
  node_cgroup_root
  node_containerd_config "$nd"
  node_registry_hosts "$nd"
  node_cni_config "$nd"
  start "$dir" "$k/containerd" nsenter --net="/run/netns/$NODE_NETNS" containerd --config "$nd/containerd/config.toml"
  local deadline=$((SECONDS + ready_timeout))
  until ctr --address "$nd/containerd.sock" version >/dev/null 2>&1; do
    alive "$dir" "$k/containerd" || fail "$dir" "$k/containerd" "exited"
    ((SECONDS < deadline)) || fail "$dir" "$k/containerd" "not ready within ${ready_timeout}s"
    sleep 0.2
  done
  ctr --address "$nd/containerd.sock" -n k8s.io images import "$bin/pause.tar" >/dev/null ||
    fail "$dir" "$k/containerd" "did not import the pause image"

  kubeconfig "$pki" "$api_port" "$API_HOST" "node-$NODE_INDEX" >"$nd/kubelet.kubeconfig"
  kubeconfig "$pki" "$api_port" "$API_HOST" kube-proxy >"$nd/kube-proxy.kubeconfig"
  chmod 600 "$nd"/*.kubeconfig
  node_kubelet_config "$nd" "$node_restart_gate_value" "$pki"
  start "$dir" "$k/kubelet" nsenter --net="/run/netns/$NODE_NETNS" "$bin/kubelet" --config "$nd/kubelet.yaml" \
    --kubeconfig "$nd/kubelet.kubeconfig" --root-dir "$nd/kubelet" --cert-dir "$nd/kubelet/pki" \
    --hostname-override "$NODE_NAME" --node-ip "$NODE_IP" --node-labels "$node_label=true" --v=1
  node_kube_proxy_config "$nd"
  start "$dir" "$k/kube-proxy" nsenter --net="/run/netns/$NODE_NETNS" "$bin/kube-proxy" --config "$nd/kube-proxy.yaml"
}
