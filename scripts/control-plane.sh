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
#                                            own periods, 50 s, and taint eviction on);
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
# Needs: go (>= the go.mods' versions; the module proxy or a filled module cache), openssl, curl,
# kubectl; with --node also gcc (static libc), iproute2, nsenter, apt-get.
set -Eeuo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=scripts/lib/node.sh
source "$here/lib/node.sh"
# shellcheck source=scripts/lib/image-archive.sh
source "$here/lib/image-archive.sh"
# shellcheck source=scripts/lib/install-manifest.sh
source "$here/lib/install-manifest.sh"
# shellcheck source=scripts/lib/go-tool.sh
source "$here/lib/go-tool.sh"
module="$here/control-plane"
tools_module="$here/tools"
repo="$(cd "$here/.." && pwd)"
cache_root="${JOBSET_INPLACE_CONTROL_PLANE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/jobset-inplace/control-plane}"
# How long `up` waits for each component to become ready.
ready_timeout="${JOBSET_INPLACE_CONTROL_PLANE_TIMEOUT:-180}"

die() {
  echo "control-plane: $*" >&2
  exit 1
}

usage() {
  sed -n '2,40p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

need() {
  command -v "$1" >/dev/null 2>&1 || die "$1 is required ($2)"
}

# The control plane's graph (scripts/control-plane/go.mod: k8s.io/kubernetes pins its own
# Kubernetes libraries) and the controllers' (scripts/tools/go.mod, with helm's scripts/helm.sh:
# JobSet, Kueue, Trainer on one set of Kubernetes libraries), each built by go_tool_build
# (scripts/lib/go-tool.sh) into a cache directory keyed by its go.mod + go.sum.
k8s_version() {
  (cd "$module" && go list -m -f '{{.Version}}' k8s.io/kubernetes)
}

# The control plane's cache directory prefix: its pinned versions (the key adds Go's version and
# the hash of the go.mod/go.sum and build flags).
versions() {
  local etcd
  etcd="$(cd "$module" && go list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3)"
  echo "kubernetes-$(k8s_version)_etcd-${etcd}"
}

# What Kubernetes' own build stamps into its binaries (hack/lib/version.sh), so that /version
# answers v1.35.x rather than v0.0.0-master.
version_ldflags() {
  local v="$1" major minor pkg flags=""
  major="${v#v}"
  major="${major%%.*}"
  minor="${v#v*.}"
  minor="${minor%%.*}"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    flags+=" -X $pkg.gitVersion=$v -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
    flags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  echo "$flags"
}

# The control plane's link flags (-s -w: small binaries; Kubernetes' version stamp).
control_plane_ldflags() {
  echo "-s -w$(version_ldflags "$(k8s_version)")"
}

# Prints the directory holding etcd, kube-apiserver and kube-controller-manager, building them
# first when the cache does not have them (with --node also the node's binaries, into the same
# directory: scripts/lib/node.sh). Progress goes to stderr.
build() {
  need go "Go toolchain, to build the control plane from its modules"
  local node="${1:-}" dir
  dir="$(go_tool_build "$module" "$cache_root" "$(versions)" "$(control_plane_ldflags)" \
    etcd=go.etcd.io/etcd/server/v3 \
    kube-apiserver=k8s.io/kubernetes/cmd/kube-apiserver \
    kube-controller-manager=k8s.io/kubernetes/cmd/kube-controller-manager)"
  [[ -z "$node" ]] || node_build "$dir"
  # The caches that exist (on a fresh machine the controllers' is not there yet: du would fail
  # the pipeline, and with it `build`, as a first cold CI run with the builds in the background
  # found).
  local cache caches=()
  for cache in "$cache_root" "$controllers_root" "$(go env GOCACHE)" "$(go env GOMODCACHE)"; do
    [[ -d "$cache" ]] && caches+=("$cache")
  done
  du -sh "${caches[@]}" | sed 's/^/control-plane: disk: /' >&2
  echo "$dir"
}

# The controllers (scripts/tools/go.mod): JobSet's always, and the addons of `--with`
# (Kueue's and Kubeflow Trainer v2's controller managers), cached under the module's own key in
# .../jobset-inplace/controllers/ (a new pin rebuilds them, not the control plane).
controllers_root="${JOBSET_INPLACE_CONTROLLERS_CACHE:-${cache_root%/*}/controllers}"
addon_package() {
  case "$1" in
    kueue) echo sigs.k8s.io/kueue ;;
    trainer) echo github.com/kubeflow/trainer/v2 ;;
    *) die "unknown addon '$1' (kueue, trainer)" ;;
  esac
}
addon_main() {
  case "$1" in
    kueue) echo sigs.k8s.io/kueue/cmd/kueue ;;
    trainer) echo github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager ;;
  esac
}
# The module's own directory in the module cache (its config manifests), downloaded if missing.
module_dir() {
  (cd "$tools_module" && go mod download -json "$1" |
    sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
}

# Prints the directory holding `jobset` and each ADDON's binary, building what it lacks.
build_controllers() {
  need go "Go toolchain, to build the controllers from their modules"
  local specs=(jobset=sigs.k8s.io/jobset) addon prefix
  for addon in "$@"; do specs+=("$addon=$(addon_main "$addon")"); done
  local jobset kueue trainer
  read -r jobset kueue trainer < <(cd "$tools_module" && go list -m -f '{{.Version}}' \
    sigs.k8s.io/jobset sigs.k8s.io/kueue github.com/kubeflow/trainer/v2 | paste -sd' ')
  [[ -n "$trainer" ]] || die "go list -m in $tools_module failed"
  prefix="jobset-${jobset}_kueue-${kueue}_trainer-${trainer}"
  go_tool_build "$tools_module" "$controllers_root" "$prefix" "-s -w" "${specs[@]}"
}

# A TCP port nothing listens on now, below the kernel's ephemeral range (where outgoing
# connections would take it between this check and the component's bind).
free_port() {
  local port low=32768
  if [[ -r /proc/sys/net/ipv4/ip_local_port_range ]]; then
    read -r low _ </proc/sys/net/ipv4/ip_local_port_range
  fi
  ((low > 11000)) || die "the ephemeral port range starts at $low; no room below it"
  for _ in $(seq 1 200); do
    port=$((10000 + RANDOM % (low - 10000)))
    if ! ss -Htln "sport = :$port" | grep -q .; then
      echo "$port"
      return
    fi
  done
  die "no free port found"
}

# A certificate signed by the CA: name, subject, extensions.
issue() {
  local pki="$1" name="$2" subj="$3" ext="$4"
  openssl req -new -newkey rsa:2048 -nodes -keyout "$pki/$name.key" -subj "$subj" \
    -out "$pki/$name.csr" 2>/dev/null
  openssl x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 2 -sha256 -extfile <(printf '%s\n' "$ext") -out "$pki/$name.crt" 2>/dev/null
  rm -f "$pki/$name.csr"
}

pki() {
  local pki="$1" extra_san="${2:+,IP:$2}"
  mkdir -p "$pki"
  openssl req -x509 -newkey rsa:2048 -nodes -keyout "$pki/ca.key" -out "$pki/ca.crt" -days 2 \
    -subj "/CN=jobset-inplace-test-ca" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    2>/dev/null
  issue "$pki" apiserver "/CN=kube-apiserver" \
    "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,IP:10.0.0.1${extra_san},DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
  issue "$pki" admin "/O=system:masters/CN=jobset-inplace-test-admin" \
    "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
  # JobSet's webhook server, called by the API server at 127.0.0.1.
  issue "$pki" jobset-webhook "/CN=jobset-webhook" \
    "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1"
  # Service-account tokens: signed with sa.key, verified with sa.pub.
  openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
  openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
  chmod 600 "$pki"/*.key
}

# A kubeconfig for the client certificate NAME (default admin) of the PKI, server at HOST.
kubeconfig() {
  local pki="$1" port="$2" host="${3:-127.0.0.1}" user="${4:-admin}"
  cat <<EOF
apiVersion: v1
kind: Config
clusters:
- name: control-plane
  cluster:
    server: https://$host:$port
    certificate-authority-data: $(base64 -w0 "$pki/ca.crt")
users:
- name: admin
  user:
    client-certificate-data: $(base64 -w0 "$pki/$user.crt")
    client-key-data: $(base64 -w0 "$pki/$user.key")
contexts:
- name: control-plane
  context:
    cluster: control-plane
    user: admin
current-context: control-plane
EOF
}

# Starts NAME in the background in its own session, logging to DIR/NAME.log, PID in DIR/NAME.pid.
start() {
  local dir="$1" name="$2"
  shift 2
  setsid "$@" >"$dir/$name.log" 2>&1 </dev/null &
  echo $! >"$dir/$name.pid"
}

alive() {
  local pid
  pid="$(cat "$1/$2.pid")"
  kill -0 "$pid" 2>/dev/null
}

# Fails `up` with the component's log tail, after stopping what was started.
fail() {
  local dir="$1" name="$2" why="$3"
  echo "control-plane: $name $why; last lines of $dir/$name.log:" >&2
  tail -n 40 "$dir/$name.log" >&2 || true
  stop_all "$dir"
  die "$name $why (logs left in $dir)"
}

# Waits until `curl ARGS` succeeds or NAME dies or the timeout passes.
wait_for() {
  local dir="$1" name="$2"
  shift 2
  local deadline=$((SECONDS + ready_timeout))
  until curl -sf --max-time 5 "$@" >/dev/null 2>&1; do
    alive "$dir" "$name" || fail "$dir" "$name" "exited"
    ((SECONDS < deadline)) || fail "$dir" "$name" "not ready within ${ready_timeout}s"
    sleep 0.5
  done
}

stop_all() {
  local dir="$1" name pid
  # The nodes first (they delete their pods through the API server while that still runs).
  if [[ -f "$dir/nodes.state" ]]; then
    node_down "$dir" || nodes_left=1
  fi
  # Reverse start order: the controller manager, the API server, then etcd.
  for name in registry trainer kueue kube-scheduler jobset kube-controller-manager kube-apiserver etcd; do
    [[ -f "$dir/$name.pid" ]] || continue
    pid="$(cat "$dir/$name.pid")"
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid" 2>/dev/null || true
      for _ in $(seq 1 100); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
      done
      kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$dir/$name.pid"
  done
}

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

# A serving certificate for an addon's webhook at 127.0.0.1, as CERTS/tls.{crt,key}.
addon_certs() {
  local dir="$1" name="$2" certs="$3"
  issue "$dir/pki" "$name-webhook" "/CN=$name-webhook" \
    "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1"
  mkdir -p "$certs"
  cp "$dir/pki/$name-webhook.crt" "$certs/tls.crt"
  cp "$dir/pki/$name-webhook.key" "$certs/tls.key"
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

up() {
  local dir="$1" node="${2:-}" variant="${3:-}"
  shift 3
  local addons=("$@") addon
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

  # Test data only: no fsync.
  start "$dir" etcd "$bin/etcd" \
    --name default --data-dir "$dir/etcd-data" \
    --listen-client-urls "http://127.0.0.1:$etcd_port" \
    --advertise-client-urls "http://127.0.0.1:$etcd_port" \
    --listen-peer-urls "http://127.0.0.1:$peer_port" \
    --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
    --initial-cluster "default=http://127.0.0.1:$peer_port" \
    --unsafe-no-fsync --log-level warn
  wait_for "$dir" etcd "http://127.0.0.1:$etcd_port/health"

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

  # The job, garbage-collector, namespace (deletes test namespaces), pod-garbage-collector (ends
  # deleted pods that no kubelet will: their job-tracking finalizers), service-account and
  # admission-policy status (type checking) controllers; no scheduler, no kubelet. It talks to the
  # API server as the admin; no serving port.
  # With a node also: the kube-root-ca.crt publisher (pods' service-account volumes), node
  # lifecycle (takes off the not-ready taint the kubelet registers with; no taint eviction; a
  # grace of an hour, so that the test kit's nodes of tests/real_cluster/, which send no
  # heartbeat, stay Ready), the endpoint slices of Services (kube-proxy, webhook Services),
  # deployments and replica sets (installed products).
  local controllers=job-controller,garbage-collector-controller,namespace-controller,pod-garbage-collector-controller,serviceaccount-token-controller,serviceaccount-controller,validatingadmissionpolicy-status-controller
  local node_controller_flags=()
  if [[ -n "$node" ]]; then
    controllers+=,root-ca-certificate-publisher-controller,node-lifecycle-controller,endpointslice-controller,endpoints-controller,deployment-controller,replicaset-controller
    if [[ "$node_grace" == default ]]; then
      # As a cluster runs it: the node lifecycle controller's own periods (a silent node Unknown
      # after 50 s) and the taint-eviction controller (its NoExecute `unreachable` taint evicts
      # the node's pods after their tolerationSeconds, 300 s by DefaultTolerationSeconds).
      controllers+=,taint-eviction-controller
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

  start_jobset "$dir" "$controller_bin/jobset"
  # The addons, and DIR/addons naming them (tests/real_cluster/: required where named).
  : >"$dir/addons"
  for addon in "${addons[@]}"; do
    "start_$addon" "$dir" "$controller_bin/$addon"
    echo "$addon" >>"$dir/addons"
  done
  # The registry (--registry): on the API server's address (the first node's host end, which
  # every node reaches), a free port, blobs under DIR/registry; before the nodes, whose
  # containerd configurations name it (scripts/lib/node.sh).
  if [[ -n "$registry" ]]; then
    REGISTRY="$api_host:$(free_port)"
    mkdir -p "$dir/registry"
    start "$dir" registry "$registry_bin" registry serve --address "$REGISTRY" --disk "$dir/registry"
    wait_for "$dir" registry "http://$REGISTRY/v2/"
    echo "$REGISTRY" >"$dir/registry.address"
    echo "registry=${REGISTRY##*:}" >>"$dir/ports"
  fi
  [[ -z "$node" ]] || node_up "$dir" "$bin" "$api_port"
  [[ -z "$variant" ]] || install_stops_all=1 install_product "$dir" "$variant"
  trap - ERR

  local node_names=""
  # shellcheck disable=SC1091
  [[ -z "$node" ]] || node_names="$(source "$dir/nodes.state" && echo "$NODE_NAMES")"
  echo "control-plane: up in $((SECONDS - start)) s: kube-apiserver https://$api_host:$api_port, etcd, kube-controller-manager, jobset${addons[*]:+, ${addons[*]}}${node:+, kube-scheduler and node(s) $node_names (DIR/node.env)}" >&2
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

# --install VARIANT (with --node): the product as a user installs it, on the real node. The image:
# with env PRODUCT_IMAGE_ARCHIVE=dist/jobset-inplace-<version>-oci.tar, the release's own (as
# scripts/dist.sh wrote and checked it; .ci/run passes it), imported as is; without it (local use,
# no dist/), the Dockerfile's static binary as scripts/check-image.sh builds and checks it
# (target/check-image/rootfs-ARCH/, built here for this machine's arch when missing), packed by
# scripts/image-archive.sh into an OCI archive. Either way tagged as the install manifests name it
# (IMAGE:<crate version>) and imported into the node. The manifest is rendered as
# scripts/dist.sh renders dist/install-VARIANT.yaml (scripts/lib/install-manifest.sh: the same
# overlay, the same image pin; dist.sh itself also validates schemas and packs binaries, which
# `up` does not need), then applied with `kubectl apply --server-side -k` of a kustomization of
# DIR/install/ that adds what this cluster needs and a user's would not carry in deploy/:
# - the JobSet CRD patch of the epoch dialect (deploy/README.md's recipe: JobSet's CRD, which
#   `up` installed from fixtures/, patched by components/epoch-status-fields);
# - a toleration of the real nodes' taint on the two Deployments (with --taint the nodes keep it so
#   that the pods of tests/real_cluster/ stay unscheduled there).
# Then waits until the webhook and reconciler Deployments are rolled out (pods Ready on the node)
# and the webhook has set its caBundle.
# With helm:VARIANT the same image, and `helm install` of the chart in place of the manifest
# (install_helm). With `up --registry` (DIR/registry.address; PRODUCT_IMAGE_ARCHIVE is then not
# read) from that registry instead, as users install: no node may hold the image yet, dist/ of
# this version is pushed there (`scripts/dist.sh --push REGISTRY --plain-http`: the index, the
# chart), the manifest is rendered with the image REGISTRY/<IMAGE's path>:<version>, helm installs
# oci://REGISTRY/<...>/charts/jobset-inplace with image.registry=REGISTRY, and the kubelet pulls.
# DIR/node.env then says INSTALL_VARIANT, INSTALL_METHOD (manifest or helm), INSTALL_SOURCE
# (archive or registry) and PRODUCT_IMAGE.
# `up --install` stops what it started; `install` on a running node leaves the node up.
install_fail() {
  [[ "${install_stops_all:-0}" -eq 0 ]] || stop_all "$1"
  die "$2 (logs left in $1)"
}

install_product() {
  local dir="$1" variant="$2" inst="$1/install" arch image_name version method=manifest
  if [[ "$variant" == helm:* ]]; then
    method=helm
    variant="${variant#helm:}"
  fi
  [[ -d "$repo/deploy/overlays/$variant" ]] || install_fail "$dir" "--install $variant: no deploy/overlays/$variant"
  mkdir -p "$inst"
  case "$(uname -m)" in
    x86_64) arch=amd64 ;;
    aarch64) arch=arm64 ;;
    *) install_fail "$dir" "--install: no image for $(uname -m)" ;;
  esac
  image_name="${IMAGE:-ghcr.io/jobset-inplace/jobset-inplace}"
  version="$(install_manifest_version "$repo")" || install_fail "$dir" "cannot read the crate's version (cargo metadata)"
  local source=archive registry_host="" chart_ref=""
  if [[ -f "$dir/registry.address" ]]; then
    # From the registry, as users install: dist/ pushed there (scripts/dist.sh --push: the
    # image's multi-arch index, the chart), then the install names the registry's image and the
    # kubelet pulls it. Nothing is imported: the node must not hold the image before.
    source=registry
    registry_host="$(cat "$dir/registry.address")"
    [[ -f "$repo/dist/SHA256SUMS" && -f "$repo/dist/jobset-inplace-$version-oci.digest" ]] ||
      install_fail "$dir" "--registry --install: dist/ of $version is missing (run scripts/dist.sh first)"
    local nd present=""
    for nd in $(node_dirs "$dir"); do
      present+="$(ctr --address "$nd/containerd.sock" -n k8s.io images ls -q 2>/dev/null | grep -F "/${image_name#*/}" || true)"
    done
    [[ -z "$present" ]] || install_fail "$dir" "the nodes hold the product's image before the install: $present"
    echo "control-plane: pushing dist/ to the registry $registry_host (scripts/dist.sh --push)" >&2
    "$repo/scripts/dist.sh" --push "$registry_host" --plain-http >"$inst/push.log" 2>&1 ||
      { cat "$inst/push.log" >&2; install_fail "$dir" "scripts/dist.sh --push $registry_host failed"; }
    image_name="$registry_host/${image_name#*/}"
    chart_ref="oci://$registry_host/${image_name#*/}"
    chart_ref="${chart_ref%/*}/charts/jobset-inplace"
  elif [[ -n "${PRODUCT_IMAGE_ARCHIVE:-}" ]]; then
    # The release's image as dist.sh wrote it (both architectures; ctr unpacks this machine's):
    # it must be tagged as the manifests name it.
    local archive name
    archive="$(realpath "$PRODUCT_IMAGE_ARCHIVE")" || install_fail "$dir" "PRODUCT_IMAGE_ARCHIVE=$PRODUCT_IMAGE_ARCHIVE: no such file"
    [[ -f "$archive" ]] || install_fail "$dir" "PRODUCT_IMAGE_ARCHIVE=$PRODUCT_IMAGE_ARCHIVE: no such file"
    name="$(tar -xOf "$archive" index.json | python3 -c 'import json, sys
print(" ".join(m.get("annotations", {}).get("io.containerd.image.name", "") for m in json.load(sys.stdin)["manifests"]))')" ||
      install_fail "$dir" "$archive: no readable index.json (an OCI image archive of scripts/image-archive.sh?)"
    [[ "$name" == "$image_name:$version" ]] ||
      install_fail "$dir" "$archive is tagged '$name', the manifests name $image_name:$version"
    echo "control-plane: the product's image from $archive ($name)" >&2
    load_image "$dir" "$archive"
  else
    if [[ ! -x "$repo/target/check-image/rootfs-$arch/jobset-inplace" ]]; then
      echo "control-plane: building the image's binary (ARCHES=$arch scripts/check-image.sh --no-lint)" >&2
      ARCHES=$arch "$repo/scripts/check-image.sh" --no-lint >"$inst/check-image.log" 2>&1 ||
        { tail -n 30 "$inst/check-image.log" >&2; install_fail "$dir" "scripts/check-image.sh failed (log: $inst/check-image.log)"; }
    fi
    IMAGE="$image_name" "$repo/scripts/image-archive.sh" "$inst/image.tar" "$arch"
    load_image "$dir" "$inst/image.tar"
  fi

  if [[ "$method" == helm ]]; then
    install_helm "$dir" "$variant" "$image_name" "$version" "$chart_ref"
  else
    install_manifest "$dir" "$variant" "$image_name" "$version"
  fi
  install_wait "$dir"
  printf '%s\n' "INSTALL_VARIANT=$variant" "INSTALL_METHOD=$method" "INSTALL_SOURCE=$source" \
    "PRODUCT_IMAGE=$image_name:$version" >>"$dir/node.env"
  echo "control-plane: installed $variant ($image_name:$version) on the node with $method, the image from the $source" >&2
}

# The release's manifest, rendered as dist.sh renders it (DIR/install/install-VARIANT.yaml),
# applied with the CRD patch (epoch) and the node's toleration.
install_manifest() {
  local dir="$1" variant="$2" image_name="$3" version="$4" inst="$1/install"
  local kubectl=(kubectl --kubeconfig "$dir/kubeconfig")
  install_manifest_render "$repo" "$inst/render" resources "overlays/$variant" "$image_name" "$version" \
    >"$inst/install-$variant.yaml"
  local crd="" component=""
  if [[ "$variant" != jobset-native ]]; then
    cp "$repo/fixtures/jobset-v0.12/jobset.x-k8s.io_jobsets.yaml" "$inst/jobset-crd.yaml"
    crd="- jobset-crd.yaml"
    component="components:
- $(realpath --relative-to="$inst" "$repo/deploy/components/epoch-status-fields")"
  fi
  cat >"$inst/kustomization.yaml" <<EOF
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
$crd
- install-$variant.yaml
$component
patches:
- target: {group: apps, kind: Deployment, namespace: jobset-inplace-system}
  patch: |-
    apiVersion: apps/v1
    kind: Deployment
    metadata: {name: any}
    spec:
      template:
        spec:
          tolerations:
          - {key: $node_label, operator: Equal, value: "true", effect: NoSchedule}
EOF
  "${kubectl[@]}" apply --server-side --field-manager control-plane.sh -k "$inst" >"$inst/apply.log" ||
    { cat "$inst/apply.log" >&2; install_fail "$dir" "kubectl apply of the $variant install failed"; }
}

# The chart as a platform team installs it (deploy/README.md "With Helm"): dist/'s packaged chart
# dist/jobset-inplace-VERSION.tgz when there is one, else charts/jobset-inplace; epoch: the JobSet
# CRD patched first (the chart does not carry the patch); the namespace with its Pod Security
# labels; then `scripts/helm.sh install` with values naming the loaded image, the dialect and the
# node's toleration (DIR/install/values.yaml). Helm's own state goes under DIR/install/helm/.
install_helm() {
  local dir="$1" variant="$2" image_name="$3" version="$4" chart_ref="${5:-}" inst="$1/install"
  local kubectl=(kubectl --kubeconfig "$dir/kubeconfig") chart="$repo/dist/jobset-inplace-$version.tgz"
  [[ -f "$chart" ]] || chart="$repo/charts/jobset-inplace"
  # From a registry: the chart by its oci:// reference and version (plain HTTP: the test kit's
  # registry has no TLS).
  local from=()
  [[ -z "$chart_ref" ]] || { chart="$chart_ref"; from=(--version "$version" --plain-http); }
  if [[ "$variant" != jobset-native ]]; then
    mkdir -p "$inst/crd"
    cp "$repo/fixtures/jobset-v0.12/jobset.x-k8s.io_jobsets.yaml" "$inst/crd/jobset-crd.yaml"
    printf 'apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n- jobset-crd.yaml\ncomponents:\n- %s\n' \
      "$(realpath --relative-to="$inst/crd" "$repo/deploy/components/epoch-status-fields")" \
      >"$inst/crd/kustomization.yaml"
    "${kubectl[@]}" apply --server-side --field-manager control-plane.sh -k "$inst/crd" >"$inst/apply.log" ||
      { cat "$inst/apply.log" >&2; install_fail "$dir" "kubectl apply of the JobSet CRD's epoch patch failed"; }
  fi
  "${kubectl[@]}" create namespace jobset-inplace-system >/dev/null
  "${kubectl[@]}" label namespace jobset-inplace-system pod-security.kubernetes.io/enforce=restricted \
    pod-security.kubernetes.io/audit=restricted pod-security.kubernetes.io/warn=restricted >/dev/null
  local toleration="{key: $node_label, operator: Equal, value: \"true\", effect: NoSchedule}"
  # image.registry and image.repository as a user sets them: IMAGE_NAME's host (ghcr.io, or the
  # registry's HOST:PORT) and the rest.
  printf '%s\n' "dialect: $variant" "image:" "  registry: \"${image_name%%/*}\"" "  repository: ${image_name#*/}" \
    "  tag: \"$version\"" "webhook:" "  tolerations: [$toleration]" "reconciler:" \
    "  tolerations: [$toleration]" >"$inst/values.yaml"
  echo "control-plane: helm install jobset-inplace $chart (values: $inst/values.yaml)" >&2
  HELM_CACHE_HOME="$inst/helm/cache" HELM_CONFIG_HOME="$inst/helm/config" HELM_DATA_HOME="$inst/helm/data" \
    "$repo/scripts/helm.sh" install jobset-inplace "$chart" "${from[@]}" --kubeconfig "$dir/kubeconfig" \
    --namespace jobset-inplace-system -f "$inst/values.yaml" >"$inst/helm-install.log" 2>&1 ||
    { cat "$inst/helm-install.log" >&2; install_fail "$dir" "helm install of the $variant chart failed"; }
}

# Until the webhook and reconciler Deployments are rolled out and the webhook's caBundle is set.
install_wait() {
  local dir="$1" inst="$1/install" deadline=$((SECONDS + ready_timeout)) d
  local kubectl=(kubectl --kubeconfig "$dir/kubeconfig")
  for d in jobset-inplace-webhook jobset-inplace-reconciler; do
    "${kubectl[@]}" -n jobset-inplace-system rollout status "deploy/$d" \
      --timeout "$((deadline - SECONDS > 1 ? deadline - SECONDS : 1))s" >&2 || {
      "${kubectl[@]}" -n jobset-inplace-system get pods -o wide >&2 || true
      "${kubectl[@]}" -n jobset-inplace-system describe pods >"$inst/pods.txt" 2>&1 || true
      "${kubectl[@]}" -n jobset-inplace-system logs -l "app.kubernetes.io/name=$d" --tail 20 >&2 || true
      install_fail "$dir" "$d not rolled out within ${ready_timeout}s (pods: $inst/pods.txt)"
    }
  done
  # The self-signed webhook sets caBundle before it turns ready; check, as the API server needs it.
  until [[ -n "$("${kubectl[@]}" get mutatingwebhookconfiguration jobset-inplace \
    -o 'jsonpath={.webhooks[0].clientConfig.caBundle}' 2>/dev/null)" ]]; do
    ((SECONDS < deadline)) || install_fail "$dir" "the webhook's caBundle not set within ${ready_timeout}s"
    sleep 0.5
  done
}

# Stops DIR's kube-controller-manager (by its PID) and starts it again with the command line of
# `up` and ARGs after it; ready when it has run for 2 s.
restart_controller_manager() {
  local dir="$1" pid
  shift
  [[ -f "$dir/kube-controller-manager.cmd" && -f "$dir/kube-controller-manager.pid" ]] ||
    die "$dir: no kube-controller-manager of $0 up"
  pid="$(cat "$dir/kube-controller-manager.pid")"
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  local kcm=()
  mapfile -d '' -t kcm <"$dir/kube-controller-manager.cmd"
  start "$dir" kube-controller-manager "${kcm[@]}" "$@"
  sleep 2
  alive "$dir" kube-controller-manager || {
    tail -n 40 "$dir/kube-controller-manager.log" >&2 || true
    die "kube-controller-manager exited after its restart"
  }
  echo "control-plane: kube-controller-manager started again${*:+ with $*}" >&2
}

# Stops DIR's kube-apiserver at once (SIGKILL, as a crashed or rebooted control-plane machine)
# and starts it again with the command line of `up` (etcd keeps the state); ready when /readyz
# answers.
restart_apiserver() {
  local dir="$1"
  [[ -f "$dir/kube-apiserver.cmd" && -f "$dir/kube-apiserver.pid" ]] ||
    die "$dir: no kube-apiserver of $0 up"
  local pid host port
  pid="$(cat "$dir/kube-apiserver.pid")"
  { read -r host; read -r port; } <"$dir/kube-apiserver.address"
  kill -KILL "$pid" 2>/dev/null || true
  for _ in $(seq 1 100); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  local apiserver=()
  mapfile -d '' -t apiserver <"$dir/kube-apiserver.cmd"
  # The log of the previous run is kept beside.
  mv -f "$dir/kube-apiserver.log" "$dir/kube-apiserver.log.1" 2>/dev/null || true
  start "$dir" kube-apiserver "${apiserver[@]}"
  local pki="$dir/pki" deadline=$((SECONDS + ready_timeout))
  until curl -sf --max-time 5 --cacert "$pki/ca.crt" --cert "$pki/admin.crt" --key "$pki/admin.key" \
    "https://$host:$port/readyz" >/dev/null 2>&1; do
    alive "$dir" kube-apiserver || { tail -n 40 "$dir/kube-apiserver.log" >&2; die "kube-apiserver exited after its restart"; }
    ((SECONDS < deadline)) || die "kube-apiserver not ready within ${ready_timeout}s of its restart"
    sleep 0.2
  done
  echo "control-plane: kube-apiserver started again" >&2
}

nodes_left=0
# --node-grace: the node lifecycle controller's --node-monitor-grace-period (an hour by default,
# so that the test kit's nodes, which send no heartbeat, stay Ready; node-loss tests pass 8s: the
# kubelets renew their leases every 2 s). `default`: no flag of ours, as a cluster runs it (the
# controller's 50 s, the kubelets' 40 s leases and 10 s status updates, taint eviction on): the
# node-loss measurements of docs/benchmarks.md.
node_grace=1h
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
