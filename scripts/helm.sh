#!/usr/bin/env bash
# Runs helm, built once from its upstream Go module (helm.sh/helm/v3, pinned in
# scripts/helm/go.mod + go.sum; no Go source of ours) and cached by version under
# ${JOBSET_INPLACE_HELM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/jobset-inplace/helm}/<version+sum>/.
#
#   scripts/helm.sh build            build if needed, print the binary's path
#   scripts/helm.sh ARGS...          build if needed, run `helm ARGS...`
#                                    (e.g. scripts/helm.sh lint --strict charts/jobset-inplace)
#
# Built like scripts/control-plane.sh builds the control plane (CGO_ENABLED=0, -trimpath), sharing
# Go's module and build caches. Needs: go (>= the go.mod's version; the module proxy or a filled
# module cache).
set -Eeuo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
module="$here/helm"
cache_root="${JOBSET_INPLACE_HELM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/jobset-inplace/helm}"

die() {
  echo "helm.sh: $*" >&2
  exit 1
}

# How helm is built (part of the cache key: change it, and it is built again).
build_flags="CGO_ENABLED=0 -trimpath -ldflags=-s -w + helm_ldflags"

helm_version() {
  (cd "$module" && go list -m -f '{{.Version}}' helm.sh/helm/v3)
}

# What Helm's own Makefile stamps into its binary: its version (else `helm version` says
# v3.x-dev) and the Kubernetes version of its client-go (else `helm template` and `helm lint`
# assume Kubernetes 1.20 and a chart's kubeVersion constraint fails).
helm_ldflags() {
  local version="$1" k8s major minor flags
  k8s="$(cd "$module" && go list -m -f '{{.Version}}' k8s.io/client-go)"
  k8s="${k8s#v}"
  major=$((${k8s%%.*} + 1))
  minor="${k8s#*.}"
  minor="${minor%%.*}"
  flags="-s -w -X helm.sh/helm/v3/internal/version.version=$version"
  flags+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
  for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
    flags+=" -X $pkg.k8sVersionMajor=$major -X $pkg.k8sVersionMinor=$minor"
  done
  echo "$flags"
}

build() {
  command -v go >/dev/null 2>&1 || die "go is required (Go toolchain, to build helm from its module)"
  local version key dir tmp start
  version="$(helm_version)"
  key="helm-${version}_go-$(go env GOVERSION)_$( (cat "$module/go.mod" "$module/go.sum"
    echo "$build_flags") | sha256sum | cut -c1-12)"
  dir="$cache_root/$key"
  if [[ -x "$dir/helm" ]]; then
    echo "$dir/helm"
    return
  fi
  mkdir -p "$cache_root"
  tmp="$(mktemp -d "$cache_root/.build.XXXXXX")"
  start=$SECONDS
  echo "helm.sh: building $key ..." >&2
  if ! (cd "$module" && CGO_ENABLED=0 go build -mod=readonly -trimpath \
      -ldflags="$(helm_ldflags "$version")" \
      -o "$tmp/helm" helm.sh/helm/v3/cmd/helm) >&2; then
    rm -rf "$tmp"
    die "go build failed (above)"
  fi
  rm -rf "$dir"
  mv "$tmp" "$dir"
  echo "helm.sh: built in $((SECONDS - start)) s into $dir" >&2
  # Keep disk lean: builds of other versions go.
  find "$cache_root" -mindepth 1 -maxdepth 1 -type d ! -name "$key" ! -name '.build.*' \
    -exec rm -rf {} +
  echo "$dir/helm"
}

[[ $# -gt 0 ]] || { sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
helm="$(build)"
[[ "$1" == build ]] && { echo "$helm"; exit 0; }
exec "$helm" "$@"
