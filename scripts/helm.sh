#!/usr/bin/env bash
# Runs helm, built once from its upstream Go module (helm.sh/helm/v3, pinned in the controllers'
# graph scripts/tools/go.mod + go.sum, beside JobSet, Kueue and Trainer, so that it shares their
# Kubernetes libraries; no Go source of ours) by go_tool_build (scripts/lib/go-tool.sh) and cached
# under ${JOBSET_INPLACE_HELM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/jobset-inplace/helm}/<versions+key>/.
#
#   scripts/helm.sh build            build if needed, print the binary's path
#   scripts/helm.sh ARGS...          build if needed, run `helm ARGS...`
#                                    (e.g. scripts/helm.sh lint --strict charts/jobset-inplace)
#
# Needs: go (>= the go.mod's version; the module proxy or a filled module cache).
set -Eeuo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=scripts/lib/go-tool.sh
source "$here/lib/go-tool.sh"
module="$here/tools"
cache_root="${JOBSET_INPLACE_HELM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/jobset-inplace/helm}"

die() {
  echo "helm.sh: $*" >&2
  exit 1
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
  local version dir
  version="$(cd "$module" && go list -m -f '{{.Version}}' helm.sh/helm/v3)"
  dir="$(go_tool_build "$module" "$cache_root" "helm-$version" "$(helm_ldflags "$version")" \
    helm=helm.sh/helm/v3/cmd/helm)"
  echo "$dir/helm"
}

[[ $# -gt 0 ]] || { sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
helm="$(build)"
[[ "$1" == build ]] && { echo "$helm"; exit 0; }
exec "$helm" "$@"
