# shellcheck shell=bash
# shellcheck disable=SC2154 # module, tools_module, cache_root, controllers_root: set by scripts/control-plane.sh, which sources this
# The Go builds of scripts/control-plane.sh (sourced by it): the control plane's module graph
# (scripts/control-plane/go.mod: etcd, kube-apiserver, kube-controller-manager; with --node also
# the node's binaries, scripts/lib/node-build.sh) and the controllers' (scripts/tools/go.mod:
# JobSet, Kueue, Trainer), each by go_tool_build (scripts/lib/go-tool.sh) into a cache directory
# keyed by its go.mod + go.sum.
#
# Needs: variables module, tools_module, cache_root, controllers_root; functions die, need,
#   go_tool_build, node_build.
# Provides: build [node], build_controllers [ADDON...], k8s_version, versions, version_ldflags,
#   control_plane_ldflags, addon_package ADDON, addon_main ADDON, module_dir MODULE.

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

# The addons of `--with` (Kueue's and Kubeflow Trainer v2's controller managers): each one's
# module, and its main package.
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
