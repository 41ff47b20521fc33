# shellcheck shell=bash
# The real nodes of scripts/control-plane.sh `up DIR --node [--nodes N] [--taint]` (sourced by
# it): their settings, and their parts, one job each, sourced from here:
# node-build.sh (the packages and binaries), node-network.sh (slots, namespaces, links, the
# nodes' state files), node-config.sh (containerd, CNI, kubelet, kube-proxy, kube-scheduler
# configurations), node-start.sh (starting them, node.env, the wait until Ready), node-image.sh
# (load-image), node-power.sh (killing a node's processes, node-kill), node-down.sh (removing
# everything, and the check that nothing is left). The nodes' client certificates are
# scripts/lib/pki.sh's node_pki.
#
# Needs: variables module, cache_root, ready_timeout, node_grace, REGISTRY
#   (scripts/control-plane.sh); its helpers die, need, start, alive, fail, wait_for, free_port
#   (scripts/lib/supervise.sh), issue, kubeconfig (scripts/lib/pki.sh), versions,
#   control_plane_ldflags (scripts/lib/builds.sh), go_tool_build, image_archive.
# Provides: the settings below (node_count and node_taint keep the values they had when this was
#   sourced), and through its parts node_need, node_build, node_network, node_up, node_env,
#   load_image, node_power_off, node_down, node_leftovers (each part's header lists all).
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
# The gates of README "Compatibility" (the same as the API server's).
node_gates="RestartAllContainersOnContainerExits=true,NodeDeclaredFeatures=true,ContainerRestartRules=true"
# JOBSET_INPLACE_NODE_RESTART_GATE=off: the kubelet alone runs without
# RestartAllContainersOnContainerExits, and without NodeDeclaredFeatures (with it, its admission
# rejects every pod using the rule: PodFeatureUnsupported), as a kubelet that predates both does
# (docs/protocol.md "A node without the feature"). The API server and the scheduler keep every
# gate: pods meant to meet that kubelet are bound by nodeName. node.env says NODE_RESTART_GATE=off.
node_restart_gate="${JOBSET_INPLACE_NODE_RESTART_GATE:-on}"

here_node="$(dirname "${BASH_SOURCE[0]}")"
# shellcheck source=scripts/lib/node-build.sh
source "$here_node/node-build.sh"
# shellcheck source=scripts/lib/node-network.sh
source "$here_node/node-network.sh"
# shellcheck source=scripts/lib/node-config.sh
source "$here_node/node-config.sh"
# shellcheck source=scripts/lib/node-start.sh
source "$here_node/node-start.sh"
# shellcheck source=scripts/lib/node-image.sh
source "$here_node/node-image.sh"
# shellcheck source=scripts/lib/node-power.sh
source "$here_node/node-power.sh"
# shellcheck source=scripts/lib/node-down.sh
source "$here_node/node-down.sh"
unset here_node
