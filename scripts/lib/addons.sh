# shellcheck shell=bash
# shellcheck disable=SC2154 # repo: set by scripts/control-plane.sh, which sources this
# The controllers of scripts/control-plane.sh `up` beside the control plane (sourced by it):
# JobSet's always, and the addons of `--with`: Kueue's and Kubeflow Trainer v2's controller
# managers, each with its CRDs and its webhook configurations from its module's manifests, the
# webhooks' client configs pointed at 127.0.0.1 and the test CA.
#
# Needs: variable repo; functions fail, die, free_port, start, wait_for (scripts/lib/supervise.sh),
#   addon_certs (scripts/lib/pki.sh), module_dir (scripts/lib/builds.sh); kubectl; DIR/kubeconfig
#   and DIR/pki of a running API server.
# Provides: start_jobset DIR BIN, start_kueue DIR BIN, start_trainer DIR BIN (each appends its
#   ports to DIR/ports, writes DIR/NAME/), render_loopback SRC PORT CA OUT,
#   wait_established DIR FILE.

# JobSet: its CRD (the released one of fixtures/, as tests/real_cluster/ installs it), its
# controller manager (as the admin; InPlaceRestart feature gate on, leader election off, no
# metrics), and its webhook configurations from its module's config/ pointed at 127.0.0.1.
start_jobset() {
  local dir="$1" bin="$2" pki="$1/pki" webhook_port health_port src ca
  local kubectl=(kubectl --kubeconfig "$dir/kubeconfig")
  "${kubectl[@]}" apply --server-side --field-manager control-plane.sh \
    -f "$repo/fixtures/jobset-v0.12/jobset.x-k8s.io_jobsets.yaml" >/dev/null
  # (`kubectl wait` fails, rather than waits, while the new CRD has no conditions yet.)
  local deadline=$((SECONDS + 60))
  until "${kubectl[@]}" get crd jobsets.jobset.x-k8s.io \
      -o 'jsonpath={.status.conditions[?(@.type=="Established")].status}' 2>/dev/null |
      grep -q True; do
    ((SECONDS < deadline)) || fail "$dir" kube-apiserver "did not establish the JobSet CRD"
    sleep 0.5
  done
  webhook_port="$(free_port)"
  health_port="$(free_port)"
  printf 'jobset-webhook=%s\njobset-health=%s\n' "$webhook_port" "$health_port" >>"$dir/ports"
  mkdir -p "$dir/jobset/certs"
  cp "$pki/jobset-webhook.crt" "$dir/jobset/certs/tls.crt"
  cp "$pki/jobset-webhook.key" "$dir/jobset/certs/tls.key"
  cat >"$dir/jobset/config.yaml" <<EOF
apiVersion: config.jobset.x-k8s.io/v1alpha1
kind: Configuration
leaderElection:
  leaderElect: false
internalCertManagement:
  enable: false
webhook:
  host: 127.0.0.1
  port: $webhook_port
  certDir: $dir/jobset/certs
metrics:
  bindAddress: "0"
health:
  healthProbeBindAddress: 127.0.0.1:$health_port
featureGates:
  InPlaceRestart: ${JOBSET_INPLACE_JOBSET_IN_PLACE_RESTART:-true}
EOF
  start "$dir" jobset env KUBECONFIG="$dir/kubeconfig" "$bin" --config "$dir/jobset/config.yaml"
  wait_for "$dir" jobset "http://127.0.0.1:$health_port/readyz"

  # The webhook configurations as JobSet's config/components/webhook makes them, but for the
  # Service: the client config is the loopback URL and our CA.
  src="$(module_dir sigs.k8s.io/jobset)/config/components/webhook"
  mkdir -p "$dir/jobset/webhook/patches"
  cp "$src/manifests.yaml" "$dir/jobset/webhook/"
  cp "$src"/patches/*.yaml "$dir/jobset/webhook/patches/"
  chmod -R u+w "$dir/jobset/webhook"
  cat >"$dir/jobset/webhook/kustomization.yaml" <<EOF
resources:
- manifests.yaml
namePrefix: jobset-
patches:
- path: patches/mutating-patch.yaml
  target: {kind: MutatingWebhookConfiguration, name: mutating-webhook-configuration}
- path: patches/validating-patch.yaml
  target: {kind: ValidatingWebhookConfiguration, name: validating-webhook-configuration}
EOF
  ca="$(base64 -w0 "$pki/ca.crt")"
  kubectl kustomize "$dir/jobset/webhook" |
    awk -v base="https://127.0.0.1:$webhook_port" -v ca="$ca" '
      /^ *service:$/ { indent = substr($0, 1, index($0, "s") - 1); service = 1; next }
      service && /^ *(name|namespace|port):/ { next }
      service && /^ *path:/ { print indent "url: " base $2; print indent "caBundle: " ca; service = 0; next }
      { print }' >"$dir/jobset/webhook/rendered.yaml"
  grep -q "url: https://127.0.0.1" "$dir/jobset/webhook/rendered.yaml" ||
    fail "$dir" jobset "webhook configurations not rendered"
  "${kubectl[@]}" apply --server-side --field-manager control-plane.sh \
    -f "$dir/jobset/webhook/rendered.yaml" >/dev/null
}

# Renders the kustomization at SRC with every webhook client config (admission and CRD
# conversion) pointed at https://127.0.0.1:PORT and the test CA, the way JobSet's are. Only a
# `service:` right under `clientConfig:` is one (CRD schemas have `service` properties: gRPC
# probes').
render_loopback() {
  local src="$1" port="$2" ca="$3" out="$4" configs urls
  kubectl kustomize "$src" |
    awk -v base="https://127.0.0.1:$port" -v ca="$ca" '
      /^ *service:$/ && prev ~ /^ *clientConfig:$/ {
        indent = substr($0, 1, index($0, "s") - 1); service = 1; prev = $0; next }
      { prev = $0 }
      service && /^ *(name|namespace|port):/ { next }
      service && /^ *path:/ { print indent "url: " base $2; print indent "caBundle: " ca; service = 0; next }
      { print }' >"$out"
  configs="$(grep -c '^ *clientConfig:$' "$out" || true)"
  urls="$(grep -c "^ *url: https://127.0.0.1:$port/" "$out" || true)"
  [[ "$configs" == "$urls" ]] || die "$out: $urls of $configs client configs pointed at loopback"
}

# Waits until every CRD in FILE is established.
wait_established() {
  local dir="$1" file="$2" name deadline=$((SECONDS + 60))
  local kubectl=(kubectl --kubeconfig "$dir/kubeconfig")
  for name in $("${kubectl[@]}" get -f "$file" -o name); do
    until "${kubectl[@]}" get "$name" \
        -o 'jsonpath={.status.conditions[?(@.type=="Established")].status}' 2>/dev/null |
        grep -q True; do
      ((SECONDS < deadline)) || fail "$dir" kube-apiserver "did not establish $name"
      sleep 0.5
    done
  done
}

# Kueue: its CRDs (conversion webhooks included) and webhook configurations from its module's
# config/components, pointed at 127.0.0.1; its controller manager as the admin in namespace
# kueue-system: leader election off, no metrics, no visibility server, the Job, JobSet and TrainJob
# integrations only (a queue-name label required; without batch/job its Job webhook panics on the
# Jobs JobSet creates), waitForPodsReady on with a short recoveryTimeout
# (JOBSET_INPLACE_KUEUE_RECOVERY_TIMEOUT, default 20s) and a short requeuing backoff, so that
# tests see an eviction and a requeue within seconds. That configuration is also written where
# Kueue's release keeps it: ConfigMap kueue-system/kueue-manager-config.
start_kueue() {
  local dir="$1" bin="$2" src webhook_port health_port ca
  local kubectl=(kubectl --kubeconfig "$dir/kubeconfig")
  src="$(module_dir sigs.k8s.io/kueue)/config/components"
  [[ -d "$src" ]] || fail "$dir" kube-apiserver "no Kueue module in the module cache ($src)"
  webhook_port="$(free_port)"
  health_port="$(free_port)"
  printf 'kueue-webhook=%s\nkueue-health=%s\n' "$webhook_port" "$health_port" >>"$dir/ports"
  mkdir -p "$dir/kueue/webhook"
  addon_certs "$dir" kueue "$dir/kueue/certs"
  # With its own certificate management off, Kueue reads a metrics certificate from this fixed
  # path at start, even with metrics off (cmd/kueue/main.go). Any pair does: it is never served.
  local metrics_certs=/etc/kueue/metrics/certs
  if [[ ! -s "$metrics_certs/tls.key" ]]; then
    mkdir -p /etc/kueue/metrics 2>/dev/null ||
      fail "$dir" kube-apiserver "Kueue needs $metrics_certs (run as root, or create it)"
    local staged
    staged="$(mktemp -d /etc/kueue/metrics/.certs.XXXXXX)"
    cp "$dir/kueue/certs/tls.crt" "$dir/kueue/certs/tls.key" "$staged/"
    mv -T "$staged" "$metrics_certs" 2>/dev/null || rm -rf "$staged"
  fi
  ca="$(base64 -w0 "$dir/pki/ca.crt")"
  render_loopback "$src/crd" "$webhook_port" "$ca" "$dir/kueue/crds.yaml"
  "${kubectl[@]}" apply --server-side --field-manager control-plane.sh \
    -f "$dir/kueue/crds.yaml" >/dev/null
  wait_established "$dir" "$dir/kueue/crds.yaml"
  "${kubectl[@]}" create namespace kueue-system >/dev/null
  cat >"$dir/kueue/config.yaml" <<EOF
apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
namespace: kueue-system
leaderElection:
  leaderElect: false
internalCertManagement:
  enable: false
webhook:
  host: 127.0.0.1
  port: $webhook_port
  certDir: $dir/kueue/certs
metrics:
  bindAddress: "0"
health:
  healthProbeBindAddress: 127.0.0.1:$health_port
manageJobsWithoutQueueName: false
waitForPodsReady:
  timeout: 10m
  recoveryTimeout: ${JOBSET_INPLACE_KUEUE_RECOVERY_TIMEOUT:-20s}
  requeuingStrategy:
    timestamp: Eviction
    backoffBaseSeconds: 1
    backoffMaxSeconds: 2
integrations:
  frameworks:
  - batch/job
  - jobset.x-k8s.io/jobset
  - trainer.kubeflow.org/trainjob
EOF
  # The same configuration where Kueue's release keeps it (doctor reads it there).
  "${kubectl[@]}" -n kueue-system create configmap kueue-manager-config \
    --from-file=controller_manager_config.yaml="$dir/kueue/config.yaml" >/dev/null
  start "$dir" kueue env KUBECONFIG="$dir/kubeconfig" "$bin" --config "$dir/kueue/config.yaml" \
    --feature-gates VisibilityOnDemand=false
  wait_for "$dir" kueue "http://127.0.0.1:$health_port/readyz"
  cp "$src/webhook/manifests.yaml" "$dir/kueue/webhook/"
  chmod u+w "$dir/kueue/webhook/manifests.yaml"
  printf 'resources:\n- manifests.yaml\nnamePrefix: kueue-\n' >"$dir/kueue/webhook/kustomization.yaml"
  render_loopback "$dir/kueue/webhook" "$webhook_port" "$ca" "$dir/kueue/webhooks.yaml"
  "${kubectl[@]}" apply --server-side --field-manager control-plane.sh \
    -f "$dir/kueue/webhooks.yaml" >/dev/null
}

# Kubeflow Trainer v2: its CRDs and webhook configurations from its module's manifests/base,
# pointed at 127.0.0.1; its controller manager as the admin: leader election and its own
# certificate management off (it then serves the pair in $TMPDIR/k8s-webhook-server/serving-certs,
# controller-runtime's default), no metrics.
start_trainer() {
  local dir="$1" bin="$2" src webhook_port health_port ca
  local kubectl=(kubectl --kubeconfig "$dir/kubeconfig")
  src="$(module_dir github.com/kubeflow/trainer/v2)/manifests/base"
  [[ -d "$src" ]] || fail "$dir" kube-apiserver "no Trainer module in the module cache ($src)"
  webhook_port="$(free_port)"
  health_port="$(free_port)"
  printf 'trainer-webhook=%s\ntrainer-health=%s\n' "$webhook_port" "$health_port" >>"$dir/ports"
  addon_certs "$dir" trainer "$dir/trainer/tmp/k8s-webhook-server/serving-certs"
  ca="$(base64 -w0 "$dir/pki/ca.crt")"
  kubectl kustomize "$src/crds" >"$dir/trainer/crds.yaml"
  "${kubectl[@]}" apply --server-side --field-manager control-plane.sh \
    -f "$dir/trainer/crds.yaml" >/dev/null
  wait_established "$dir" "$dir/trainer/crds.yaml"
  cat >"$dir/trainer/config.yaml" <<EOF
apiVersion: config.trainer.kubeflow.org/v1alpha1
kind: Configuration
leaderElection:
  leaderElect: false
certManagement:
  enable: false
webhook:
  host: 127.0.0.1
  port: $webhook_port
metrics:
  bindAddress: "0"
health:
  healthProbeBindAddress: 127.0.0.1:$health_port
EOF
  start "$dir" trainer env KUBECONFIG="$dir/kubeconfig" TMPDIR="$dir/trainer/tmp" "$bin" \
    --config "$dir/trainer/config.yaml"
  wait_for "$dir" trainer "http://127.0.0.1:$health_port/readyz"
  render_loopback "$src/webhook" "$webhook_port" "$ca" "$dir/trainer/webhooks.yaml"
  "${kubectl[@]}" apply --server-side --field-manager control-plane.sh \
    -f "$dir/trainer/webhooks.yaml" >/dev/null
}
