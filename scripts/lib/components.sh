# shellcheck shell=bash
# shellcheck disable=SC2154 # node_grace: set by scripts/control-plane.sh, which sources this
# The components of the control plane scripts/control-plane.sh `up` starts (sourced by it), each
# with its command line and its readiness wait: etcd, kube-apiserver, kube-controller-manager
# (their command lines also in DIR/NAME.cmd, for scripts/lib/restart.sh), the controllers
# (JobSet's and the addons', scripts/lib/addons.sh) and the test kit's registry.
#
# Needs: variable node_grace; functions start, wait_for, free_port (scripts/lib/supervise.sh),
#   kubeconfig (scripts/lib/pki.sh), start_jobset and start_ADDON (scripts/lib/addons.sh);
#   DIR/pki.
# Provides: start_etcd DIR BIN ETCD_PORT PEER_PORT, start_apiserver DIR BIN NODE HOST PORT
#   ETCD_PORT (writes DIR/kubeconfig), start_controller_manager DIR BIN NODE HOST PORT,
#   start_controllers DIR BIN [ADDON...] (writes DIR/addons), start_registry DIR BIN HOST (sets
#   REGISTRY to its HOST:PORT).

# etcd on loopback (test data only: no fsync).
start_etcd() {
  local dir="$1" bin="$2" etcd_port="$3" peer_port="$4"
  start "$dir" etcd "$bin/etcd" \
    --name default --data-dir "$dir/etcd-data" \
    --listen-client-urls "http://127.0.0.1:$etcd_port" \
    --advertise-client-urls "http://127.0.0.1:$etcd_port" \
    --listen-peer-urls "http://127.0.0.1:$peer_port" \
    --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
    --initial-cluster "default=http://127.0.0.1:$peer_port" \
    --unsafe-no-fsync --log-level warn
  wait_for "$dir" etcd "http://127.0.0.1:$etcd_port/health"
}

# kube-apiserver at HOST:PORT (with a node, the first node's veth host end; else loopback), its
# command line in DIR/kube-apiserver.cmd and its address in DIR/kube-apiserver.address; then
# DIR/kubeconfig, the admin's.
start_apiserver() {
  local dir="$1" bin="$2" node="$3" api_host="$4" api_port="$5" etcd_port="$6"
  local pki="$dir/pki"
  # The feature gates of README "Compatibility" for 1.35: the RestartAllContainers rule (alpha),
  # which in 1.35 depends on NodeDeclaredFeatures (alpha) and ContainerRestartRules (beta, on by
  # default; named so that a rename fails loudly).
  # Without a node nothing serves the `kubernetes` Service (no endpoints: loopback is not a valid
  # endpoint address); with one, the API server writes its veth address there and calls the
  # kubelet and webhook Services' endpoints (pods) directly.
  local node_flags=(--endpoint-reconciler-type none)
  local version_flags=()
  [[ -z "${JOBSET_INPLACE_APISERVER_EMULATED_VERSION:-}" ]] ||
    version_flags=(--emulated-version "$JOBSET_INPLACE_APISERVER_EMULATED_VERSION")
  [[ -z "$node" ]] || node_flags=(--endpoint-reconciler-type lease --enable-aggregator-routing=true
    --kubelet-client-certificate "$pki/apiserver-kubelet-client.crt"
    --kubelet-client-key "$pki/apiserver-kubelet-client.key"
    --kubelet-preferred-address-types InternalIP)
  printf '%s\0' "$bin/kube-apiserver" \
    --bind-address "$api_host" --advertise-address "$api_host" --secure-port "$api_port" \
    --etcd-servers "http://127.0.0.1:$etcd_port" \
    --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
    --client-ca-file "$pki/ca.crt" \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "$pki/sa.pub" \
    --service-account-signing-key-file "$pki/sa.key" \
    --service-cluster-ip-range 10.0.0.0/24 \
    --authorization-mode Node,RBAC \
    --enable-admission-plugins MutatingAdmissionWebhook,ValidatingAdmissionWebhook,ValidatingAdmissionPolicy \
    --feature-gates "${JOBSET_INPLACE_APISERVER_FEATURE_GATES:-RestartAllContainersOnContainerExits=true,NodeDeclaredFeatures=true,ContainerRestartRules=true}" \
    --profiling=false "${node_flags[@]}" "${version_flags[@]}" >"$dir/kube-apiserver.cmd"
  printf '%s\n' "$api_host" "$api_port" >"$dir/kube-apiserver.address"
  local apiserver=()
  mapfile -d '' -t apiserver <"$dir/kube-apiserver.cmd"
  start "$dir" kube-apiserver "${apiserver[@]}"
  wait_for "$dir" kube-apiserver --cacert "$pki/ca.crt" --cert "$pki/admin.crt" --key "$pki/admin.key" \
    "https://$api_host:$api_port/readyz"
  kubeconfig "$pki" "$api_port" "$api_host" >"$dir/kubeconfig"
  chmod 600 "$dir/kubeconfig"
}

# kube-controller-manager as the admin, with JOBSET_INPLACE_CONTROLLER_MANAGER_ARGS after its
# command line of DIR/kube-controller-manager.cmd.
start_controller_manager() {
  local dir="$1" bin="$2" node="$3" api_host="$4" api_port="$5" pki="$1/pki"
  # The job, garbage-collector, namespace (deletes test namespaces), pod-garbage-collector (ends
  # deleted pods that no kubelet will: their job-tracking finalizers), service-account and
  # admission-policy status (type checking) controllers; no scheduler, no kubelet. It talks to the
  # API server as the admin; no serving port.
  # With a node also: the kube-root-ca.crt publisher (pods' service-account volumes), node
  # lifecycle (takes off the not-ready taint the kubelet registers with; a grace of an hour, so
  # that the test kit's nodes of tests/real_cluster/, which send no heartbeat, stay Ready), taint
  # eviction (on in every cluster: a NoExecute taint, `unreachable` after its 300 s
  # tolerationSeconds or `out-of-service` at once, marks the node's pods terminating; the row
  # node_modes::the_fenced_default_fails_a_lost_nodes_pods_once_an_operator_fences_it times
  # JobSet's recreation through it), the endpoint slices of Services (kube-proxy, webhook Services),
  # deployments and replica sets (installed products).
  local controllers=job-controller,garbage-collector-controller,namespace-controller,pod-garbage-collector-controller,serviceaccount-token-controller,serviceaccount-controller,validatingadmissionpolicy-status-controller
  local node_controller_flags=()
  if [[ -n "$node" ]]; then
    controllers+=,root-ca-certificate-publisher-controller,node-lifecycle-controller,taint-eviction-controller,endpointslice-controller,endpoints-controller,deployment-controller,replicaset-controller
    if [[ "$node_grace" == default ]]; then
      # As a cluster runs it: the node lifecycle controller's own periods (a silent node Unknown
      # after 50 s; its NoExecute `unreachable` taint evicts the node's pods after their
      # tolerationSeconds, 300 s by DefaultTolerationSeconds).
      :
    else
      node_controller_flags=(--node-monitor-grace-period "$node_grace" --node-startup-grace-period 1h
        --node-monitor-period 2s)
    fi
  fi
  local extra=()
  read -r -a extra <<<"${JOBSET_INPLACE_CONTROLLER_MANAGER_ARGS:-}"
  # Its command line, NUL-separated, for restart-controller-manager.
  printf '%s\0' "$bin/kube-controller-manager" \
    --kubeconfig "$dir/kubeconfig" \
    --controllers "$controllers" "${node_controller_flags[@]}" \
    --service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.crt" \
    --leader-elect=false --secure-port 0 --profiling=false >"$dir/kube-controller-manager.cmd"
  local kcm=()
  mapfile -d '' -t kcm <"$dir/kube-controller-manager.cmd"
  start "$dir" kube-controller-manager "${kcm[@]}" "${extra[@]}"
  # Ready when the `default` service account of `default` exists (the serviceaccount controller
  # made it).
  wait_for "$dir" kube-controller-manager --cacert "$pki/ca.crt" --cert "$pki/admin.crt" \
    --key "$pki/admin.key" "https://$api_host:$api_port/api/v1/namespaces/default/serviceaccounts/default"
}

# JobSet's controller manager, then each ADDON's.
start_controllers() {
  local dir="$1" controller_bin="$2" addon
  shift 2
  start_jobset "$dir" "$controller_bin/jobset"
  # The addons, and DIR/addons naming them (tests/real_cluster/: required where named).
  : >"$dir/addons"
  for addon in "$@"; do
    "start_$addon" "$dir" "$controller_bin/$addon"
    echo "$addon" >>"$dir/addons"
  done
}

# The registry (--registry): on the API server's address HOST (the first node's host end, which
# every node reaches), a free port, blobs under DIR/registry; before the nodes, whose
# containerd configurations name it (scripts/lib/node-config.sh).
start_registry() {
  local dir="$1" registry_bin="$2" api_host="$3"
  REGISTRY="$api_host:$(free_port)"
  mkdir -p "$dir/registry"
  start "$dir" registry "$registry_bin" registry serve --address "$REGISTRY" --disk "$dir/registry"
  wait_for "$dir" registry "http://$REGISTRY/v2/"
  echo "$REGISTRY" >"$dir/registry.address"
  echo "registry=${REGISTRY##*:}" >>"$dir/ports"
}
