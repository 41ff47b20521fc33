# shellcheck shell=bash
# shellcheck disable=SC2154 # module, ready_timeout: set by control-plane.sh, which sources this
# One real node for scripts/control-plane.sh `up DIR --node` (sourced by it; uses its helpers
# die, need, start, alive, fail, free_port, issue, kubeconfig, version_ldflags, k8s_version).
#
# What runs, and where:
# - a network namespace of ours, `jobset-inplace-node-N` (N: the first free slot), joined to the
#   host by a veth pair: host end NODE_HOST_IP (172.31.N.1/30; the API server listens there),
#   node end NODE_IP (172.31.N.2/30). The host routes the pod CIDR (10.244.N.0/24) to the node
#   end, so the API server reaches pods (webhook Services, kubelet); the namespace has no default
#   route, so pods reach nothing but the node, each other and the host end of the link;
# - in it (nsenter --net: the host's mount namespace, so the cgroup file systems stay visible):
#   containerd (Debian's package) with runc and a CNI bridge network (Debian's
#   containernetworking-plugins: bridge, host-local, portmap, loopback), kubelet and kube-proxy
#   (iptables mode, inside the namespace only) built from the pinned k8s.io/kubernetes module;
# - on the host: kube-scheduler from the same module;
# - cgroups under a root of ours (`/jobset-inplace-node-N` in every hierarchy), kubelet state
#   under DIR/node; the kubelet's hard-coded /var/log/containers and
#   /var/lib/kubelet/device-plugins, containerd 1.6's shim sockets in /run/containerd/s and the
#   CNI result cache /var/lib/cni are removed again by `down` when `up` made them.
# - images: no registry. The pause image is built from the module's build/pause/linux/pause.c
#   (gcc -static) and imported from a docker-archive; `load-image` imports others.
#
# The node's identity is a client certificate `system:node:NAME` / `system:nodes` (the API
# server's Node authorizer), kube-proxy's `system:kube-proxy` (RBAC's system:node-proxier); the
# API server calls the kubelet as `system:masters` (kubelet webhook authorization).

node_name=jobset-inplace-node
# The label the real node gives itself; the scheduler places pods on such nodes only. The node is
# also tainted with it (NoSchedule): only pods that tolerate it run there, so that the pods of
# tests/real_cluster.rs stay unscheduled as without a node (the DELETE of an unscheduled pod is
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

# Runs a command in the node's network namespace (and nothing else of it: mounts and cgroups
# are the host's).
in_node() {
  nsenter --net="/run/netns/$NODE_NETNS" "$@"
}

# Chooses a free slot, creates the namespace and the veth pair, and writes DIR/node/state and
# DIR/node.env. Sets the NODE_* variables.
node_network() {
  local dir="$1" n
  mkdir -p "$dir/node"
  for n in $(seq 1 250); do
    if [[ ! -e "/run/netns/jobset-inplace-node-$n" ]] && ! ip link show "jsinode$n" >/dev/null 2>&1 &&
      ! ip -4 route show | grep -qE "^(172\.31\.$n\.|10\.244\.$n\.)"; then
      break
    fi
  done
  [[ ! -e "/run/netns/jobset-inplace-node-$n" ]] || die "no free node slot (250 namespaces?)"
  NODE_SLOT=$n
  NODE_NAME=$node_name
  NODE_NETNS="jobset-inplace-node-$n"
  NODE_HOST_VETH="jsinode$n"
  NODE_HOST_IP="172.31.$n.1"
  NODE_IP="172.31.$n.2"
  NODE_POD_CIDR="10.244.$n.0/24"
  NODE_CGROUP="jobset-inplace-node-$n"
  # `down` reads this (also after a failed `up`): write it before making anything.
  cat >"$dir/node/state" <<EOF
NODE_SLOT=$NODE_SLOT
NODE_NAME=$NODE_NAME
NODE_NETNS=$NODE_NETNS
NODE_HOST_VETH=$NODE_HOST_VETH
NODE_HOST_IP=$NODE_HOST_IP
NODE_IP=$NODE_IP
NODE_POD_CIDR=$NODE_POD_CIDR
NODE_CGROUP=$NODE_CGROUP
EOF
  # What of the outside paths existed before (those are only cleaned, not removed).
  local p
  for p in "${node_outside[@]}"; do
    [[ ! -e "$p" ]] || echo "$p"
  done >"$dir/node/preexisting"
  local s
  for s in "${node_sysctls[@]}"; do
    echo "$s=$(sysctl -n "$s")"
  done >"$dir/node/sysctls"

  ip netns add "$NODE_NETNS"
  ip link add "$NODE_HOST_VETH" type veth peer name eth0 netns "$NODE_NETNS"
  ip addr add "$NODE_HOST_IP/30" dev "$NODE_HOST_VETH"
  ip link set "$NODE_HOST_VETH" up
  ip route add "$NODE_POD_CIDR" via "$NODE_IP" dev "$NODE_HOST_VETH"
  ip -n "$NODE_NETNS" addr add "$NODE_IP/30" dev eth0
  ip -n "$NODE_NETNS" link set lo up
  ip -n "$NODE_NETNS" link set eth0 up
  # Routing between the pods' bridge and the link (per namespace; the host's stays as it is).
  in_node sysctl -qw net.ipv4.ip_forward=1
  in_node sysctl -qw net.bridge.bridge-nf-call-iptables=1 2>/dev/null || true
}

# The node's client certificates, and the API server's for calling kubelets.
node_pki() {
  local pki="$1" client="basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
  issue "$pki" node "/O=system:nodes/CN=system:node:$node_name" "$client"
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
  local dir="$1" bin="$2" api_port="$3" nd="$1/node" pki="$1/pki" node_restart_gate_value
  case "$node_restart_gate" in
    on) node_restart_gate_value=true ;;
    off) node_restart_gate_value=false ;;
    *) die "JOBSET_INPLACE_NODE_RESTART_GATE must be on or off, not $node_restart_gate" ;;
  esac
  local kubectl=(kubectl --kubeconfig "$dir/kubeconfig")
  mkdir -p "$nd"/{containerd,cni/net.d,cni/ipam,kubelet,pod-logs,volume-plugins,runc}

  # The scheduler: on the host, as the admin, no leader election, serving on loopback only. It
  # places pods on the real node only (the label the kubelet gives itself): the test kit's nodes
  # of tests/real_cluster.rs bind their namespaces' pods themselves, and must not race it.
  local sched_port
  sched_port="$(free_port)"
  echo "kube-scheduler=$sched_port" >>"$dir/ports"
  cat >"$nd/kube-scheduler.yaml" <<EOF
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
  start "$dir" kube-scheduler "$bin/kube-scheduler" --config "$nd/kube-scheduler.yaml" \
    --authentication-kubeconfig "$dir/kubeconfig" --authorization-kubeconfig "$dir/kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$sched_port" \
    --feature-gates "$node_gates" --profiling=false
  wait_for "$dir" kube-scheduler -k "https://127.0.0.1:$sched_port/healthz"

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
EOF
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
  start "$dir" containerd nsenter --net="/run/netns/$NODE_NETNS" containerd --config "$nd/containerd/config.toml"
  local deadline=$((SECONDS + ready_timeout))
  until ctr --address "$nd/containerd.sock" version >/dev/null 2>&1; do
    alive "$dir" containerd || fail "$dir" containerd "exited"
    ((SECONDS < deadline)) || fail "$dir" containerd "not ready within ${ready_timeout}s"
    sleep 0.2
  done
  ctr --address "$nd/containerd.sock" -n k8s.io images import "$bin/pause.tar" >/dev/null ||
    fail "$dir" containerd "did not import the pause image"

  cat >"$dir/node.env" <<EOF
NODE_NAME=$NODE_NAME
CONTAINERD_ADDRESS=$nd/containerd.sock
CTR="ctr --address $nd/containerd.sock -n k8s.io"
NODE_NETNS=$NODE_NETNS
NODE_IP=$NODE_IP
NODE_HOST_IP=$NODE_HOST_IP
NODE_POD_CIDR=$NODE_POD_CIDR
NODE_DIR=$nd
PAUSE_IMAGE=$pause_image
NODE_TAINT=$node_label=true:NoSchedule
NODE_RESTART_GATE=$node_restart_gate
EOF

  kubeconfig "$pki" "$api_port" "$NODE_HOST_IP" node >"$nd/kubelet.kubeconfig"
  kubeconfig "$pki" "$api_port" "$NODE_HOST_IP" kube-proxy >"$nd/kube-proxy.kubeconfig"
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
registerWithTaints:
- {key: $node_label, value: "true", effect: NoSchedule}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%"}
# A shared build machine's disk runs near full: a pressure taint must go as soon as it passes
# (the default holds it 5 minutes, and the node's pods stay unscheduled meanwhile).
evictionPressureTransitionPeriod: 10s
nodeStatusUpdateFrequency: 2s
syncFrequency: 10s
EOF
  start "$dir" kubelet nsenter --net="/run/netns/$NODE_NETNS" "$bin/kubelet" --config "$nd/kubelet.yaml" \
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
clusterCIDR: $NODE_POD_CIDR
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
EOF
  start "$dir" kube-proxy nsenter --net="/run/netns/$NODE_NETNS" "$bin/kube-proxy" --config "$nd/kube-proxy.yaml"

  # Ready: the node Ready and only our taint left (the node lifecycle controller takes not-ready
  # off), the `kubernetes` Service programmed by kube-proxy.
  deadline=$((SECONDS + ready_timeout))
  until [[ "$("${kubectl[@]}" get node "$NODE_NAME" -o \
    'jsonpath={.status.conditions[?(@.type=="Ready")].status}/{.spec.taints[*].key}' 2>/dev/null)" == "True/$node_label" ]]; do
    alive "$dir" kubelet || fail "$dir" kubelet "exited"
    alive "$dir" containerd || fail "$dir" containerd "exited"
    ((SECONDS < deadline)) || fail "$dir" kubelet "node not Ready and untainted within ${ready_timeout}s"
    sleep 0.5
  done
  until in_node curl -sf --max-time 2 http://127.0.0.1:10256/healthz >/dev/null 2>&1; do
    alive "$dir" kube-proxy || fail "$dir" kube-proxy "exited"
    ((SECONDS < deadline)) || fail "$dir" kube-proxy "not healthy within ${ready_timeout}s"
    sleep 0.5
  done
}

# Imports a docker-archive or OCI archive into the node's containerd (namespace k8s.io, where the
# kubelet's images are).
load_image() {
  local dir="$1" archive="$2"
  [[ -f "$dir/node.env" ]] || die "$dir has no node (up DIR --node)"
  [[ -f "$archive" ]] || die "$archive: no such file"
  local addr
  addr="$(sed -n 's/^CONTAINERD_ADDRESS=//p' "$dir/node.env")"
  ctr --address "$addr" -n k8s.io images import "$archive" >&2
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

# The PIDs in our cgroup tree (every process of every pod of the node).
node_cgroup_pids() {
  local root
  for root in /sys/fs/cgroup/pids/"$NODE_CGROUP" /sys/fs/cgroup/memory/"$NODE_CGROUP"; do
    [[ -d "$root" ]] || continue
    find "$root" -name cgroup.procs -exec cat {} + 2>/dev/null
  done | sort -un
}

# Removes everything of the node: pods, processes, mounts, cgroups, the network namespace,
# files outside DIR; puts back the host sysctls the kubelet changed. Safe to run again, and after
# a failed `up`.
node_down() {
  local dir="$1" nd="$1/node"
  # shellcheck disable=SC1091 # written by node_network
  source "$nd/state"
  local addr="$nd/containerd.sock" kubectl=(kubectl --kubeconfig "$dir/kubeconfig" --request-timeout 5s)

  # 1. While the kubelet and the API server run: let the kubelet stop its pods (sandboxes torn
  # down, CNI addresses released, pod network namespaces unmounted), at most 10 s; what is left
  # then (containers ignoring SIGTERM) is killed below.
  if [[ -f "$dir/kubelet.pid" ]] && alive "$dir" kubelet && [[ -f "$dir/kube-apiserver.pid" ]] &&
    alive "$dir" kube-apiserver; then
    "${kubectl[@]}" delete pods --all-namespaces --all --grace-period 0 --force --wait=false \
      >/dev/null 2>&1 || true
    local deadline=$((SECONDS + 10))
    while ((SECONDS < deadline)); do
      [[ -z "$(ctr --address "$addr" -n k8s.io tasks ls -q 2>/dev/null)" ]] && break
      sleep 0.5
    done
  fi

  # 2. The node's processes, then every process left in its cgroups (pods' containers), then the
  # shims of our containerd (found by its socket in their command lines), then containerd.
  node_stop "$dir" kube-proxy
  node_stop "$dir" kubelet
  # Pod network namespaces (containerd 1.6 bind-mounts them at /run/netns/cni-*): ours are the
  # ones our pods' processes are in.
  local nsinodes="" pid f
  for pid in $(node_cgroup_pids); do
    nsinodes+=" $(stat -L -c %i "/proc/$pid/ns/net" 2>/dev/null || true)"
  done
  local podns=()
  for f in /run/netns/cni-*; do
    [[ -e "$f" ]] || continue
    if [[ " $nsinodes " == *" $(stat -L -c %i "$f" 2>/dev/null || echo none) "* ]]; then
      podns+=("$f")
    fi
  done
  for _ in 1 2 3; do
    for pid in $(node_cgroup_pids); do
      kill -KILL "$pid" 2>/dev/null || true
    done
    sleep 0.2
  done
  for pid in $(grep -lsz -- "$addr" /proc/[0-9]*/cmdline | cut -d/ -f3); do
    [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" == containerd-shim* ]] && node_kill "$pid"
  done
  node_stop "$dir" containerd

  # 3. Mounts: pod namespaces of ours, then everything under DIR (deepest first).
  for f in "${podns[@]}"; do
    umount "$f" 2>/dev/null || umount -l "$f" 2>/dev/null || true
    rm -f "$f"
  done
  local m
  for m in $(awk -v d="$dir/" 'index($5, d) == 1 { print $5 }' /proc/self/mountinfo | sort -r); do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
  done

  # 4. Cgroups (leaves first).
  local h
  for h in /sys/fs/cgroup/*/"$NODE_CGROUP"; do
    [[ -d "$h" ]] || continue
    find "$h" -depth -type d -exec rmdir {} + 2>/dev/null || true
    [[ ! -d "$h" ]] || echo "control-plane: could not remove cgroup $h" >&2
  done

  # 5. The network: the namespace (its bridge, iptables rules and the veth pair go with it; the
  # host route with the veth).
  ip netns del "$NODE_NETNS" 2>/dev/null || true
  ip link del "$NODE_HOST_VETH" 2>/dev/null || true

  # 6. Paths outside DIR: removed when `up` made them, else only what is ours is taken out.
  for f in "${node_outside[@]}"; do
    if ! grep -qxF "$f" "$nd/preexisting" 2>/dev/null; then
      rm -rf "$f"
      continue
    fi
    case "$f" in
      /var/log/containers)
        find "$f" -maxdepth 1 -type l -lname "$nd/*" -delete 2>/dev/null || true ;;
      /var/lib/cni)
        rm -f "$f"/results/"$NODE_NETNS"-* 2>/dev/null || true ;;
    esac
  done

  # 7. Host sysctls the kubelet set.
  local line
  while IFS= read -r line; do
    if [[ -n "$line" ]]; then
      sysctl -qw "$line" 2>/dev/null || true
    fi
  done <"$nd/sysctls"
  rm -f "$nd/state" "$dir/node.env"
}
