#!/usr/bin/env bash
# A real Kubernetes control plane on loopback for tests/real_cluster/: etcd, kube-apiserver and
# kube-controller-manager built from their upstream Go modules (pinned in
# scripts/control-plane/go.mod), JobSet's controller manager with its webhooks (pinned in the
# controllers' graph scripts/tools/go.mod) and the JobSet CRD, a throwaway PKI, service-account
# signing keys.
#
#   scripts/control-plane.sh build [--node] [--with kueue,trainer]
#                                            build the binaries once (cached)
#   scripts/control-plane.sh up DIR [--node [--nodes N] [--taint] [--registry]
#                                [--install [helm:]VARIANT]] [--with kueue,trainer]
#                                            build if needed, start everything, write DIR/kubeconfig;
#                                            --node: one real node, --nodes N: N of them (names in
#                                            DIR/node.env NODES); --taint: taint them NoSchedule
#                                            (jobset-inplace.dev/real-node=true; only tolerating
#                                            pods run there); --node-grace DURATION: a node whose
#                                            kubelet is silent that long turns Ready=Unknown (1h;
#                                            `default`: kube-controller-manager's and the kubelets'
#                                            own periods, 50 s; taint eviction runs with
#                                            every node);
#                                            --install: also the product (epoch or jobset-native)
#                                            as dist/install-VARIANT.yaml installs it, or with
#                                            helm:VARIANT by `helm install` of the chart (dist/'s
#                                            tgz, else charts/jobset-inplace) with dialect=VARIANT
#                                            (env PRODUCT_IMAGE_ARCHIVE: dist/'s OCI image archive);
#                                            --registry: an OCI registry on the node network
#                                            (DIR/node.env REGISTRY=HOST:PORT, every node's
#                                            containerd pulls from it); --install then pushes
#                                            dist/ there (scripts/dist.sh --push) and installs
#                                            from it: chart by oci://, image pulled, no import
#   scripts/control-plane.sh install DIR [helm:]VARIANT   the same on the node of an `up DIR --node`
#   scripts/control-plane.sh down DIR        stop what `up DIR` started, remove DIR
#   scripts/control-plane.sh restart-controller-manager DIR [ARG...]
#                                            start the kube-controller-manager of `up DIR` again
#                                            with its flags of `up` and ARGs after them (e.g.
#                                            --kube-api-qps 200 --kube-api-burst 300)
#   scripts/control-plane.sh load-image DIR ARCHIVE   import a docker-archive or OCI archive
#                                            into every node of `up DIR --node`
#   scripts/control-plane.sh node-kill DIR NODE   the node vanishes as on a power loss: its
#                                            links cut, its kubelet, containerd and containers
#                                            SIGKILLed, nothing graceful
#   scripts/control-plane.sh restart-apiserver DIR   stop the API server (SIGKILL) and start it
#                                            again with its flags of `up` (etcd kept)
#
# --with kueue,trainer also starts Kueue v0.17's and Kubeflow Trainer v2.3's controller managers,
# their CRDs and webhook configurations from their modules' manifests pointed at loopback, and
# writes DIR/addons naming them (tests/real_cluster/ runs the addons' tests where it names them).
#
# Two Go module graphs, each built by go_tool_build (scripts/lib/go-tool.sh) into a cache
# directory keyed by its go.mod + go.sum: the control plane's (scripts/control-plane/go.mod:
# k8s.io/kubernetes pins its Kubernetes libraries at v0.35) under
# ${JOBSET_INPLACE_CONTROL_PLANE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/jobset-inplace/control-plane}/<versions+key>/,
# and the controllers' (scripts/tools/go.mod: JobSet, Kueue, Trainer, and helm for scripts/helm.sh,
# on one set of Kubernetes libraries, v0.36, and one controller-runtime, so that those compile once)
# under ${JOBSET_INPLACE_CONTROLLERS_CACHE:-<that cache's parent>/controllers}/<versions+key>/.
# Everything listens on 127.0.0.1 (ports chosen free at start-up, written to DIR/ports). No
# kubelet and no scheduler: pods exist but never run.
#
# With --node (scripts/lib/node.sh): also kube-scheduler and one real node (--nodes N: N), each a
# kubelet and kube-proxy built from the same pinned k8s.io/kubernetes module, its own containerd +
# runc + the CNI plugins from Debian's packages (installed when missing), a pause image built from
# the module's pause.c, all inside a network namespace of its own joined to the host by a veth
# pair and to the other nodes by a bridge in a namespace of ours; the API server then listens on
# the first node's veth host address (DIR/kubeconfig points there) so that pods reach it through
# the `kubernetes` Service. DIR/node.env tells tests where everything is.
# JOBSET_INPLACE_NODE_RESTART_GATE=off starts that kubelet without
# RestartAllContainersOnContainerExits and NodeDeclaredFeatures (the API server and the scheduler
# keep them): tests/real_node/ then checks what docs/protocol.md says of such a node.
#
# For doctor's failing cases: JOBSET_INPLACE_APISERVER_FEATURE_GATES replaces the API server's
# --feature-gates, JOBSET_INPLACE_JOBSET_IN_PLACE_RESTART=false turns JobSet's gate off, and
# JOBSET_INPLACE_APISERVER_EMULATED_VERSION=1.34 starts the API server as that older release
# (`--emulated-version`: its APIs and feature gates; pass gates that release has, e.g.
# JOBSET_INPLACE_APISERVER_FEATURE_GATES=ContainerRestartRules=true).
# JOBSET_INPLACE_CONTROLLER_MANAGER_ARGS (split on blanks) is added to kube-controller-manager's
# flags at `up`, e.g. "--kube-api-qps 200 --kube-api-burst 300" (its default client rate is 20
# QPS, burst 30).
#
#
# This file is the command front: the options, the subcommands, `up` and `down` as sequences of
# steps. The steps are sourced from scripts/lib/, one job each (each file's header says what it
# needs and provides): builds.sh (the Go builds), pki.sh, supervise.sh (starting, waiting for and
# stopping processes), components.sh (etcd, kube-apiserver, kube-controller-manager, the
# controllers, the registry), addons.sh (JobSet, Kueue, Trainer), restart.sh, install.sh (the
# product), node.sh and its node-*.sh (the real nodes), with go-tool.sh, image-archive.sh and
# install-manifest.sh.
#
# Needs: go (>= the go.mods' versions; the module proxy or a filled module cache), openssl, curl,
# kubectl; with --node also gcc (static libc), iproute2, nsenter, apt-get.
set -Eeuo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
module="$here/control-plane"
tools_module="$here/tools"
repo="$(cd "$here/.." && pwd)"
cache_root="${JOBSET_INPLACE_CONTROL_PLANE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/jobset-inplace/control-plane}"
# The controllers (scripts/tools/go.mod): JobSet's always, and the addons of `--with`
# (Kueue's and Kubeflow Trainer v2's controller managers), cached under the module's own key in
# .../jobset-inplace/controllers/ (a new pin rebuilds them, not the control plane).
controllers_root="${JOBSET_INPLACE_CONTROLLERS_CACHE:-${cache_root%/*}/controllers}"
# How long `up` waits for each component to become ready.
ready_timeout="${JOBSET_INPLACE_CONTROL_PLANE_TIMEOUT:-180}"
# --node-grace: the node lifecycle controller's --node-monitor-grace-period (an hour by default,
# so that the test kit's nodes, which send no heartbeat, stay Ready; node-loss tests pass 8s: the
# kubelets renew their leases every 2 s). `default`: no flag of ours, as a cluster runs it (the
# controller's 50 s, the kubelets' 40 s leases and 10 s status updates, taint eviction on): the
# node-loss measurements of docs/benchmarks.md.
node_grace=1h
# Set by stop_all when the nodes' remains could not all be removed (`down` then keeps DIR).
nodes_left=0

# shellcheck source=scripts/lib/go-tool.sh
source "$here/lib/go-tool.sh"
# shellcheck source=scripts/lib/image-archive.sh
source "$here/lib/image-archive.sh"
# shellcheck source=scripts/lib/install-manifest.sh
source "$here/lib/install-manifest.sh"
# shellcheck source=scripts/lib/builds.sh
source "$here/lib/builds.sh"
# shellcheck source=scripts/lib/pki.sh
source "$here/lib/pki.sh"
# shellcheck source=scripts/lib/supervise.sh
source "$here/lib/supervise.sh"
# shellcheck source=scripts/lib/components.sh
source "$here/lib/components.sh"
# shellcheck source=scripts/lib/addons.sh
source "$here/lib/addons.sh"
# shellcheck source=scripts/lib/restart.sh
source "$here/lib/restart.sh"
# shellcheck source=scripts/lib/install.sh
source "$here/lib/install.sh"
# shellcheck source=scripts/lib/node.sh
source "$here/lib/node.sh"

die() {
  echo "control-plane: $*" >&2
  exit 1
}

usage() {
  # The header up to the end of its list of subcommands (the third line that is only `#`).
  awk 'NR > 1 { print } /^#$/ && ++n == 3 { exit }' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

need() {
  command -v "$1" >/dev/null 2>&1 || die "$1 is required ($2)"
}

# Refuses what `up DIR` cannot do before anything starts: options that need --node, a DIR that
# holds a control plane, a missing tool, a second real node on this machine.
up_check() {
  local dir="$1" node="$2" variant="$3"
  [[ -z "$variant" || -n "$node" ]] || die "--install needs --node"
  [[ -z "$registry" || -n "$node" ]] || die "--registry needs --node"
  [[ -z "$variant" || -d "$repo/deploy/overlays/${variant#helm:}" ]] || die "--install $variant: no deploy/overlays/${variant#helm:}"
  need openssl "the throwaway PKI (apt-get install openssl)"
  need curl "the readiness checks (apt-get install curl)"
  need ss "finding free ports (apt-get install iproute2)"
  need kubectl "installing the JobSet CRD and webhook configurations"
  [[ ! -e "$dir/kubeconfig" ]] || die "$dir already holds a control plane (run down first)"
  [[ -z "$node" ]] || node_need
  # One `up --node` per machine: the kubelets' device-plugin directory and the outside paths are
  # shared, and a second `down` would take them from the first.
  if [[ -n "$node" ]] && ip netns list 2>/dev/null | grep -qE '^jobset-inplace-(node|hub)-'; then
    die "a real node is already up on this machine ($(ip netns list | grep -oE '^jobset-inplace-(node|hub)-[0-9]*' | head -n 1)): down its DIR first"
  fi
}

up() {
  local dir="$1" node="${2:-}" variant="${3:-}"
  shift 3
  local addons=("$@")
  up_check "$dir" "$node" "$variant"
  local bin controller_bin
  bin="$(build "$node")"
  controller_bin="$(build_controllers "${addons[@]}")"
  local registry_bin=""
  [[ -z "$registry" ]] || registry_bin="$("$here/registry.sh" build)"
  mkdir -p "$dir"
  dir="$(cd "$dir" && pwd)"
  touch "$dir/.jobset-inplace-control-plane"
  # Whatever fails from here on, nothing that was started keeps running.
  # shellcheck disable=SC2064 # $dir now, not at the time of the trap
  trap "echo 'control-plane: up failed; stopping what it started' >&2; stop_all '$dir'" ERR
  local start=$SECONDS
  # Where the API server listens: loopback, or with a node the host end of the node's veth
  # (pods reach it there; loopback is not theirs).
  local api_host=127.0.0.1
  if [[ -n "$node" ]]; then
    node_network "$dir"
    api_host="$API_HOST"
  fi
  pki "$dir/pki" "${node:+$api_host}"
  [[ -z "$node" ]] || node_pki "$dir"

  local etcd_port peer_port api_port
  etcd_port="$(free_port)"
  peer_port="$(free_port)"
  api_port="$(free_port)"
  printf 'etcd=%s\netcd-peer=%s\nkube-apiserver=%s\n' "$etcd_port" "$peer_port" "$api_port" >"$dir/ports"
  start_etcd "$dir" "$bin" "$etcd_port" "$peer_port"
  start_apiserver "$dir" "$bin" "$node" "$api_host" "$api_port" "$etcd_port"
  start_controller_manager "$dir" "$bin" "$node" "$api_host" "$api_port"
  start_controllers "$dir" "$controller_bin" "${addons[@]}"
  [[ -z "$registry" ]] || start_registry "$dir" "$registry_bin" "$api_host"
  [[ -z "$node" ]] || node_up "$dir" "$bin" "$api_port"
  [[ -z "$variant" ]] || install_stops_all=1 install_product "$dir" "$variant"
  trap - ERR

  up_report "$dir" "$node" "$((SECONDS - start))" "https://$api_host:$api_port" "${addons[@]}"
}

# What `up` started, and how to use it.
up_report() {
  local dir="$1" node="$2" took="$3" url="$4"
  shift 4
  local addons=("$@")
  local node_names=""
  # shellcheck disable=SC1091
  [[ -z "$node" ]] || node_names="$(source "$dir/nodes.state" && echo "$NODE_NAMES")"
  echo "control-plane: up in $took s: kube-apiserver $url, etcd, kube-controller-manager, jobset${addons[*]:+, ${addons[*]}}${node:+, kube-scheduler and node(s) $node_names (DIR/node.env)}" >&2
  echo "control-plane: export KUBECONFIG=$dir/kubeconfig JOBSET_INPLACE_KUBECONFIG=$dir/kubeconfig" >&2
  if [[ -n "$node" ]]; then
    if [[ -n "$node_taint" ]]; then
      echo "control-plane: the nodes are tainted $node_label=true:NoSchedule (--taint): pods need the toleration {key: $node_label, operator: Equal, value: \"true\", effect: NoSchedule}" >&2
    else
      if [[ -n "$registry" ]]; then
        echo "control-plane: the nodes take any pod (no taint); images: the registry http://$REGISTRY (push with skopeo --dest-tls-verify=false, helm --plain-http), or scripts/control-plane.sh load-image $dir IMAGE.tar" >&2
      else
        echo "control-plane: the nodes take any pod (no taint); images come from no registry: scripts/control-plane.sh load-image $dir IMAGE.tar, then imagePullPolicy: IfNotPresent (or Never)" >&2
      fi
    fi
    echo "control-plane: scripts/control-plane.sh node-kill $dir NODE cuts a node off as a power loss does; down $dir removes everything" >&2
  fi
}

down() {
  local dir="$1"
  [[ -d "$dir" ]] || return 0
  [[ -f "$dir/.jobset-inplace-control-plane" ]] || die "$dir was not made by $0 up; not removing it"
  stop_all "$dir"
  # Something of the nodes left (node_down listed it): DIR may still hold mounts; kept.
  ((nodes_left == 0)) || die "down: the nodes' remains are listed above; $dir kept"
  rm -rf "$dir"
}

# The options of build and up: --node, --registry, --with ADDON[,ADDON]; sets node, registry and
# addons.
node=""
variant=""
registry=""
# The registry's HOST:PORT when `up --registry` started one (scripts/lib/node.sh reads it).
REGISTRY=""
addons=()
parse_options() {
  while (($#)); do
    case "$1" in
      --node) node=node ;;
      --nodes)
        [[ $# -ge 2 && "$2" =~ ^[1-9][0-9]?$ ]] || usage
        node=node
        node_count="$2"
        shift
        ;;
      --taint) node_taint=1 ;;
      --registry) registry=1 ;;
      --node-grace)
        [[ $# -ge 2 && "$2" =~ ^([0-9]+(s|m|h)|default)$ ]] || usage
        node_grace="$2"
        shift
        ;;
      --install)
        [[ $# -ge 2 ]] || usage
        variant="$2"
        shift
        ;;
      --with)
        [[ $# -ge 2 ]] || usage
        local a
        IFS=, read -r -a a <<<"$2"
        for name in "${a[@]}"; do
          addon_package "$name" >/dev/null
          addons+=("$name")
        done
        shift
        ;;
      *) usage ;;
    esac
    shift
  done
}

case "${1:-}" in
  build)
    shift
    parse_options "$@"
    build "$node" >/dev/null
    build_controllers "${addons[@]}" >/dev/null
    [[ -z "$registry" ]] || "$here/registry.sh" build >/dev/null
    ;;
  up)
    [[ $# -ge 2 ]] || usage
    dir="$2"
    shift 2
    parse_options "$@"
    up "$dir" "$node" "$variant" "${addons[@]}"
    ;;
  down) [[ $# -eq 2 ]] || usage; down "$2" ;;
  restart-controller-manager)
    [[ $# -ge 2 ]] || usage
    dir="$(cd "$2" && pwd)"
    shift 2
    restart_controller_manager "$dir" "$@"
    ;;
  load-image) [[ $# -eq 3 ]] || usage; load_image "$(cd "$2" && pwd)" "$3" ;;
  node-kill) [[ $# -eq 3 ]] || usage; node_power_off "$(cd "$2" && pwd)" "$3" ;;
  restart-apiserver) [[ $# -eq 2 ]] || usage; restart_apiserver "$(cd "$2" && pwd)" ;;
  install)
    [[ $# -eq 3 && -f "$2/node.env" ]] || usage
    [[ -d "$repo/deploy/overlays/${3#helm:}" ]] || die "install $3: no deploy/overlays/${3#helm:}"
    install_product "$(cd "$2" && pwd)" "$3"
    ;;
  *) usage ;;
esac
