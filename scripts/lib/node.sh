# shellcheck shell=bash
# shellcheck disable=SC2154 # module, ready_timeout: set by control-plane.sh, which sources this
# The real nodes of scripts/control-plane.sh `up DIR --node [--nodes N] [--taint]` (sourced by it;
# uses its helpers die, need, start, alive, fail, free_port, issue, kubeconfig, version_ldflags,
# k8s_version).
#
# What runs, and where (K = 1..N, each node in a slot S_K: the first free ones):
# - per node a network namespace of ours, `jobset-inplace-node-S`, joined to the host by a veth
#   pair: host end NODE_HOST_IP (172.31.S.1/30), node end `eth0` NODE_IP (172.31.S.2/30). The host
#   routes the node's pod CIDR (10.244.S.0/24) to the node end, so the API server reaches pods
#   (webhook Services, kubelet). The API server listens on the first node's host end; every other
#   node routes that one address through its own host end;
# - one hub namespace of ours, `jobset-inplace-hub-S_1`, holding a bridge `hub`; every node has a
#   second veth pair from its `eth1` (172.30.S_1.S/24) to that bridge, and routes every other
#   node's pod CIDR through the other's `eth1`: pods of every node reach each other's pods, and
#   nothing of this traffic touches the host. The node namespaces have no default route: pods reach
#   nothing but their node, the other nodes' pods and the API server;
# - in each node's namespace (nsenter --net: the host's mount namespace, so the cgroup file systems
#   stay visible): containerd (Debian's package; its own root, state, socket) with runc and a CNI
#   bridge network (Debian's containernetworking-plugins: bridge, host-local, portmap, loopback),
#   kubelet and kube-proxy (iptables mode, inside the namespace only) built from the pinned
#   k8s.io/kubernetes module;
# - on the host: kube-scheduler from the same module;
# - cgroups under a root of ours per node (`/jobset-inplace-node-S` in every hierarchy), kubelet
#   state under DIR/node-K; the kubelet's hard-coded /var/log/containers and
#   /var/lib/kubelet/device-plugins (every kubelet takes it over at start; no device plugins run
#   here), containerd 1.6's shim sockets in /run/containerd/s (named by a hash of each containerd's
#   own socket) and the CNI result cache /var/lib/cni (named by each node's network) are shared by
#   the nodes, and removed again by `down` when `up` made them. Hence one `up --node` per machine.
# - images: the pause image is built from the module's build/pause/linux/pause.c (gcc -static)
#   and imported from a docker-archive; `load-image` imports others into every node. With
#   `up --registry` also an OCI registry (scripts/registry.sh's crane, plain HTTP) on the API
#   server's address: every node's containerd reaches it through its registry config_path
#   (NODE_DIR/containerd/certs.d/HOST:PORT/hosts.toml, `server = "http://HOST:PORT"`).
#
# Each node's identity is a client certificate `system:node:NAME` / `system:nodes` (the API
# server's Node authorizer), kube-proxy's `system:kube-proxy` (RBAC's system:node-proxier); the
# API server calls the kubelets as `system:masters` (kubelet webhook authorization).
#
# `node-kill DIR NODE` (node_power_off) makes one node vanish as a machine that loses power: its
# links cut, then its kubelet, kube-proxy, containerd, every shim of its containerd and every
# process in its cgroups SIGKILLed; nothing graceful. `down` removes what is left of it.

# Node names: one node is `jobset-inplace-node` (as it always was), N nodes
# `jobset-inplace-node-1` .. `-N`.
node_name=jobset-inplace-node
# How many nodes, and whether they are tainted (control-plane.sh's --nodes and --taint).
node_count="${node_count:-1}"
node_taint="${node_taint:-}"
# The label the real nodes give themselves; the scheduler places pods on such nodes only (the
# test kit's nodes of tests/real_cluster/ bind their own pods). With --taint the nodes are also
# tainted with it (NoSchedule): only pods that tolerate it run there, so that the pods of
# tests/real_cluster/ stay unscheduled as without a node (the DELETE of an unscheduled pod is
# immediate, of a scheduled one graceful: `the_test_api_server_answers_as_the_real_one`).
node_label=jobset-inplace.dev/real-node
# The pause image: the version pause.c's Makefile names, under a local name.
pause_tag=3.10.1
pause_image="localhost/jobset-inplace/pause:$pause_tag"
# Debian packages the node uses: binary -> package.
node_packages=(containerd:containerd ctr:containerd runc:runc iptables:iptables
  conntrack:conntrack /usr/lib/cni/bridge:containernetworking-plugins)
# Host sysctls the kubelet sets (protectKernelDefaults: false); `down` puts them back.
node_sysctls=(vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops
  kernel.keys.root_maxkeys kernel.keys.root_maxbytes)
# Paths outside DIR the kubelet, containerd 1.6 or the CNI plugins write whatever they are told.
node_outside=(/var/log/containers /var/lib/kubelet /run/containerd /var/lib/cni)

# Installs the Debian packages the node needs when their binaries are missing (CI starts on a
# fresh machine), and checks the rest.
node_need() {
  need gcc "building the pause image (apt-get install gcc libc6-dev)"
  need nsenter "running the node in its network namespace (apt-get install util-linux)"
  need ip "the node's network (apt-get install iproute2)"
  local entry bin pkg missing=()
  for entry in "${node_packages[@]}"; do
    bin="${entry%%:*}"
    pkg="${entry#*:}"
    if [[ "$bin" == /* ]]; then
      [[ -e "$bin" ]] || missing+=("$pkg")
    else
      command -v "$bin" >/dev/null 2>&1 || missing+=("$pkg")
    fi
  done
  ((${#missing[@]} == 0)) && return
  need apt-get "installing ${missing[*]}"
  echo "control-plane: installing ${missing[*]} (apt-get)" >&2
  # shellcheck source=scripts/lib/apt.sh
  source "$(dirname "${BASH_SOURCE[0]}")/apt.sh"
  apt_get update -qq >&2 ||
    die "apt-get update failed"
  # shellcheck disable=SC2046 # one word per package
  apt_get install -y -qq --no-install-recommends \
    $(printf '%s\n' "${missing[@]}" | sort -u) >&2 || die "apt-get install ${missing[*]} failed"
}

# Builds kubelet, kube-proxy, kube-scheduler and the pause image into the control plane's cache
# directory BIN (same module, same flags) when they are not there yet.
node_build() {
  local bin="$1" tmp start src
  if [[ -x "$bin/kubelet" && -x "$bin/kube-proxy" && -x "$bin/kube-scheduler" &&
    -f "$bin/pause.tar" ]]; then
    return
  fi
  start=$SECONDS
  echo "control-plane: building kubelet, kube-proxy, kube-scheduler and the pause image ..." >&2
  # Into the control plane's directory BIN: the same module, key and link flags.
  [[ "$(go_tool_build "$module" "$cache_root" "$(versions)" "$(control_plane_ldflags)" \
    kubelet=k8s.io/kubernetes/cmd/kubelet \
    kube-proxy=k8s.io/kubernetes/cmd/kube-proxy \
    kube-scheduler=k8s.io/kubernetes/cmd/kube-scheduler)" == "$bin" ]] ||
    die "the node's binaries were not built into $bin"
  [[ -f "$bin/pause.tar" ]] && return
  tmp="$(mktemp -d "$bin/.node.XXXXXX")"
  src="$(cd "$module" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)/build/pause/linux/pause.c"
  mkdir -p "$tmp/pause-root"
  gcc -Os -static -Wall -Werror -DVERSION="v$pause_tag-jobset-inplace" -o "$tmp/pause-root/pause" \
    "$src" >&2 || { rm -rf "$tmp"; die "gcc -static $src failed (apt-get install gcc libc6-dev)"; }
  strip "$tmp/pause-root/pause" 2>/dev/null || true
  image_archive "$tmp/pause.tar" "$pause_image" "$tmp/pause-root" '["/pause"]' '[]'
  rm -rf "$tmp/pause-root"
  mv "$tmp"/* "$bin/"
  rmdir "$tmp"
  echo "control-plane: node binaries built in $((SECONDS - start)) s" >&2
}

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
  local dir="$1" n k slots=()
  for n in $(seq 1 250); do
    ((${#slots[@]} < node_count)) || break
    node_slot_free "$n" && slots+=("$n")
  done
  ((${#slots[@]} == node_count)) || die "no $node_count free node slots"
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
  node_load "$dir/node-1"
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

# Each node's client certificates, and the API server's for calling kubelets.
node_pki() {
  local dir="$1" pki="$1/pki" nd client="basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
  for nd in $(node_dirs "$dir"); do
    node_load "$nd"
    # shellcheck disable=SC2153 # NODE_NAME: from node_load
    issue "$pki" "node-$NODE_INDEX" "/O=system:nodes/CN=system:node:$NODE_NAME" "$client"
  done
  issue "$pki" kube-proxy "/CN=system:kube-proxy" "$client"
  issue "$pki" apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" "$client"
  chmod 600 "$pki"/*.key
}

# The gates of README "Compatibility" (the same as the API server's).
node_gates="RestartAllContainersOnContainerExits=true,NodeDeclaredFeatures=true,ContainerRestartRules=true"
# JOBSET_INPLACE_NODE_RESTART_GATE=off: the kubelet alone runs without
# RestartAllContainersOnContainerExits, and without NodeDeclaredFeatures (with it, its admission
# rejects every pod using the rule: PodFeatureUnsupported), as a kubelet that predates both does
# (docs/protocol.md "A node without the feature"). The API server and the scheduler keep every
# gate: pods meant to meet that kubelet are bound by nodeName. node.env says NODE_RESTART_GATE=off.
node_restart_gate="${JOBSET_INPLACE_NODE_RESTART_GATE:-on}"

node_up() {
  local dir="$1" bin="$2" api_port="$3" pki="$1/pki" node_restart_gate_value
  case "$node_restart_gate" in
    on) node_restart_gate_value=true ;;
    off) node_restart_gate_value=false ;;
    *) die "JOBSET_INPLACE_NODE_RESTART_GATE must be on or off, not $node_restart_gate" ;;
  esac
  local kubectl=(kubectl --kubeconfig "$dir/kubeconfig")

  # The scheduler: on the host, as the admin, no leader election, serving on loopback only. It
  # places pods on the real nodes only (the label the kubelet gives itself): the test kit's nodes
  # of tests/real_cluster/ bind their namespaces' pods themselves, and must not race it.
  local sched_port
  sched_port="$(free_port)"
  echo "kube-scheduler=$sched_port" >>"$dir/ports"
  cat >"$dir/kube-scheduler.yaml" <<EOF
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: $dir/kubeconfig
leaderElection:
  leaderElect: false
profiles:
- schedulerName: default-scheduler
  pluginConfig:
  - name: NodeAffinity
    args:
      addedAffinity:
        requiredDuringSchedulingIgnoredDuringExecution:
          nodeSelectorTerms:
          - matchExpressions:
            - {key: $node_label, operator: In, values: ["true"]}
EOF
  start "$dir" kube-scheduler "$bin/kube-scheduler" --config "$dir/kube-scheduler.yaml" \
    --authentication-kubeconfig "$dir/kubeconfig" --authorization-kubeconfig "$dir/kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$sched_port" \
    --feature-gates "$node_gates" --profiling=false
  wait_for "$dir" kube-scheduler -k "https://127.0.0.1:$sched_port/healthz"

  local nd
  for nd in $(node_dirs "$dir"); do
    node_load "$nd"
    node_start_one "$dir" "$nd" "$bin" "$api_port"
  done
  node_env "$dir"

  # Ready: every node Ready with only our taint (--taint) or none left (the node lifecycle
  # controller takes not-ready off), the `kubernetes` Service programmed by each kube-proxy.
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
  local dir="$1" nd="$2" bin="$3" api_port="$4" pki="$1/pki" k="node-$NODE_INDEX"
  mkdir -p "$nd"/{containerd,cni/net.d,cni/ipam,kubelet,pod-logs,volume-plugins,runc}

  # Our cgroup root in every v1 hierarchy (and the unified one): everything of the node's pods
  # lives under it, and `down` removes it.
  local h
  for h in /sys/fs/cgroup/*/; do
    [[ -d "$h" ]] || continue
    mkdir -p "$h$NODE_CGROUP"
    if [[ -f "${h}cpuset.cpus" ]]; then
      cat "${h}cpuset.cpus" >"$h$NODE_CGROUP/cpuset.cpus"
      cat "${h}cpuset.mems" >"$h$NODE_CGROUP/cpuset.mems"
    fi
  done

  # containerd 1.6 (CRI config version 2): state and root of its own, a private socket, runc's
  # state under DIR, the local pause image; restrict_oom_score_adj because root here lacks
  # CAP_SYS_RESOURCE (otherwise runc fails the pause container's oom_score_adj=-998: "can't get
  # final child's PID from pipe: EOF").
  cat >"$nd/containerd/config.toml" <<EOF
version = 2
root = "$nd/containerd/root"
state = "$nd/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing"]
[grpc]
  address = "$nd/containerd.sock"
[ttrpc]
  address = "$nd/containerd.sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "$nd/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$pause_image"
  restrict_oom_score_adj = true
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "$nd/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$nd/cni/net.d"
    max_conf_num = 1
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "$nd/containerd/certs.d"
EOF
  # The test kit's registry (up --registry), plain HTTP: containerd's hosts.toml for its
  # HOST:PORT (pull and resolve; other registries stay unreachable from the node network).
  mkdir -p "$nd/containerd/certs.d"
  if [[ -n "${REGISTRY:-}" ]]; then
    mkdir -p "$nd/containerd/certs.d/$REGISTRY"
    cat >"$nd/containerd/certs.d/$REGISTRY/hosts.toml" <<EOF
server = "http://$REGISTRY"

[host."http://$REGISTRY"]
  capabilities = ["pull", "resolve"]
EOF
  fi
  # The pod network: one bridge in the node's namespace, addresses from the node's pod CIDR,
  # no masquerading (the API server sees pod addresses, and answers them through its route).
  cat >"$nd/cni/net.d/10-jobset-inplace.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "$NODE_NETNS",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "dataDir": "$nd/cni/ipam",
              "ranges": [[{"subnet": "$NODE_POD_CIDR"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
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

  # The kubelet: cgroup v1 with the cgroupfs driver (no systemd here), our cgroup root, the gates,
  # every directory it is told of under DIR; serving on the node address (the API server calls
  # it for logs and exec), authenticating clients by the CA and authorizing them through the API
  # server; no DNS (none runs).
  cat >"$nd/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /$NODE_CGROUP
featureGates:
  RestartAllContainersOnContainerExits: $node_restart_gate_value
  NodeDeclaredFeatures: $node_restart_gate_value
  ContainerRestartRules: true
containerRuntimeEndpoint: unix://$nd/containerd.sock
podLogsDir: $nd/pod-logs
volumePluginDir: $nd/volume-plugins
address: $NODE_IP
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $pki/ca.crt}
authorization:
  mode: Webhook
clusterDomain: cluster.local
resolvConf: ""
failSwapOn: false
serializeImagePulls: false
$(if [[ -n "$node_taint" ]]; then printf 'registerWithTaints:\n- {key: %s, value: "true", effect: NoSchedule}' "$node_label"; fi)
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%"}
# A shared build machine's disk runs near full: a pressure taint must go as soon as it passes
# (the default holds it 5 minutes, and the node's pods stay unscheduled meanwhile).
evictionPressureTransitionPeriod: 10s
$(if [[ "${node_grace:-}" != default ]]; then
  printf '%s\n' "nodeStatusUpdateFrequency: 2s" \
    "# The lease renewed every 2 s (a quarter of it): a short --node-grace finds a silent node soon." \
    "nodeLeaseDurationSeconds: 8"
fi)
syncFrequency: 10s
EOF
  start "$dir" "$k/kubelet" nsenter --net="/run/netns/$NODE_NETNS" "$bin/kubelet" --config "$nd/kubelet.yaml" \
    --kubeconfig "$nd/kubelet.kubeconfig" --root-dir "$nd/kubelet" --cert-dir "$nd/kubelet/pki" \
    --hostname-override "$NODE_NAME" --node-ip "$NODE_IP" --node-labels "$node_label=true" --v=1

  # kube-proxy: iptables mode, inside the node's namespace only; leaves conntrack sysctls alone
  # (host-wide, and not settable from a namespace).
  cat >"$nd/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: $nd/kube-proxy.kubeconfig
mode: iptables
hostnameOverride: $NODE_NAME
clusterCIDR: 10.244.0.0/16
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
EOF
  start "$dir" "$k/kube-proxy" nsenter --net="/run/netns/$NODE_NETNS" "$bin/kube-proxy" --config "$nd/kube-proxy.yaml"
}

# Imports a docker-archive or OCI archive into every node's containerd (namespace k8s.io, where
# the kubelets' images are).
# Imports are serialised per cluster (flock on DIR/load-image.lock, bounded): containerd refuses
# the second of two concurrent imports of the same image ("already exists"), which is what rows
# of the failure matrix running side by side do with the test image.
load_image() {
  local dir="$1" archive="$2" nd
  [[ -f "$dir/node.env" ]] || die "$dir has no node (up DIR --node)"
  [[ -f "$archive" ]] || die "$archive: no such file"
  (
    flock -w 300 9 || die "load-image: $dir/load-image.lock held for over 300 s"
    for nd in $(node_dirs "$dir"); do
      [[ ! -e "$nd/killed" ]] || continue
      ctr --address "$nd/containerd.sock" -n k8s.io images import "$archive" >&2 ||
        die "import of $archive into $nd failed"
    done
  ) 9>"$dir/load-image.lock"
}

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

# Removes everything of every node: pods, processes, mounts, cgroups, the network namespaces,
# files outside DIR; puts back the host sysctls the kubelets changed; then checks that nothing is
# left (node_leftovers) and fails if something is. Safe to run again, and after a failed `up`.
node_down() {
  local dir="$1" nd k
  local kubectl=(kubectl --kubeconfig "$dir/kubeconfig" --request-timeout 5s)
  # shellcheck disable=SC1091 # written by node_network
  source "$dir/nodes.state"

  # 1. While the kubelets and the API server run: let the kubelets stop their pods (sandboxes
  # torn down, CNI addresses released, pod network namespaces unmounted), at most 10 s; what is
  # left then (containers ignoring SIGTERM, nodes killed) is killed below.
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

  # 2. Each node's processes, its pod namespaces, every process left in its cgroups (pods'
  # containers), the shims of its containerd, then containerd.
  local podns=() pid f
  for nd in $(node_dirs "$dir"); do
    node_load "$nd"
    k="node-$NODE_INDEX"
    node_stop "$dir" "$k/kube-proxy"
    node_stop "$dir" "$k/kubelet"
    mapfile -t -O "${#podns[@]}" podns < <(node_pod_netns; cat "$nd/podns" 2>/dev/null || true)
    node_kill_cgroups
    for pid in $(node_shim_pids "$nd"); do
      node_kill "$pid"
    done
    node_stop "$dir" "$k/containerd"
  done

  # 3. Mounts: pod namespaces of ours, then everything under DIR (deepest first).
  for f in "${podns[@]}"; do
    [[ -e "$f" ]] || continue
    umount "$f" 2>/dev/null || umount -l "$f" 2>/dev/null || true
    rm -f "$f"
  done
  local m
  for m in $(awk -v d="$dir/" 'index($5, d) == 1 { print $5 }' /proc/self/mountinfo | sort -r); do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
  done

  # 4. Cgroups (leaves first), 5. the network: each node's namespace (its bridge, iptables rules
  # and veth pairs go with it; the host route with the veth), then the hub.
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

  # 6. Paths outside DIR: removed when `up` made them, else only what is ours is taken out.
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

  # 7. Host sysctls the kubelets set.
  local line
  while IFS= read -r line; do
    if [[ -n "$line" ]]; then
      sysctl -qw "$line" 2>/dev/null || true
    fi
  done <"$dir/nodes.sysctls"

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
