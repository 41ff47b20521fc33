# shellcheck shell=bash
# shellcheck disable=SC2154 # node_label, node_taint, node_grace, pause_image, NODE_*: set by the scripts that source this
# The real nodes' configuration files (scripts/lib/node.sh sources it), each written for the
# current node (its NODE_* variables loaded, scripts/lib/node-network.sh): its cgroup root,
# containerd's config.toml, the registry's hosts.toml, the CNI network, the kubelet's and
# kube-proxy's configurations; and kube-scheduler's.
#
# Needs: variables node_label, node_taint, node_grace, pause_image, REGISTRY, the NODE_*
#   variables of the current node.
# Provides: node_cgroup_root, node_containerd_config ND, node_registry_hosts ND, node_cni_config
#   ND, node_kubelet_config ND GATE_VALUE, node_kube_proxy_config ND,
#   node_scheduler_config DIR (DIR/kube-scheduler.yaml).

# The scheduler: on the host, as the admin, no leader election, serving on loopback only. It
# places pods on the real nodes only (the label the kubelet gives itself): the test kit's nodes
# of tests/real_cluster/ bind their namespaces' pods themselves, and must not race it.
node_scheduler_config() {
  local dir="$1"
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
}

# Our cgroup root in every v1 hierarchy (and the unified one): everything of the node's pods
# lives under it, and `down` removes it.
node_cgroup_root() {
  local h
  for h in /sys/fs/cgroup/*/; do
    [[ -d "$h" ]] || continue
    mkdir -p "$h$NODE_CGROUP"
    if [[ -f "${h}cpuset.cpus" ]]; then
      cat "${h}cpuset.cpus" >"$h$NODE_CGROUP/cpuset.cpus"
      cat "${h}cpuset.mems" >"$h$NODE_CGROUP/cpuset.mems"
    fi
  done
}

# containerd 1.6 (CRI config version 2): state and root of its own, a private socket, runc's
# state under DIR, the local pause image; restrict_oom_score_adj because root here lacks
# CAP_SYS_RESOURCE (otherwise runc fails the pause container's oom_score_adj=-998: "can't get
# final child's PID from pipe: EOF").
node_containerd_config() {
  local nd="$1"
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
}

# The test kit's registry (up --registry), plain HTTP: containerd's hosts.toml for its
# HOST:PORT (pull and resolve; other registries stay unreachable from the node network).
node_registry_hosts() {
  local nd="$1"
  mkdir -p "$nd/containerd/certs.d"
  if [[ -n "${REGISTRY:-}" ]]; then
    mkdir -p "$nd/containerd/certs.d/$REGISTRY"
    cat >"$nd/containerd/certs.d/$REGISTRY/hosts.toml" <<EOF
server = "http://$REGISTRY"

[host."http://$REGISTRY"]
  capabilities = ["pull", "resolve"]
EOF
  fi
}

# The pod network: one bridge in the node's namespace, addresses from the node's pod CIDR,
# no masquerading (the API server sees pod addresses, and answers them through its route).
node_cni_config() {
  local nd="$1"
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
}

# The kubelet: cgroup v1 with the cgroupfs driver (no systemd here), our cgroup root, the gates,
# every directory it is told of under DIR; serving on the node address (the API server calls
# it for logs and exec), authenticating clients by the CA and authorizing them through the API
# server; no DNS (none runs).
node_kubelet_config() {
  local nd="$1" node_restart_gate_value="$2" pki="$3"
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
}

# kube-proxy: iptables mode, inside the node's namespace only; leaves conntrack sysctls alone
# (host-wide, and not settable from a namespace).
node_kube_proxy_config() {
  local nd="$1"
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
}
