# shellcheck shell=bash
# shellcheck disable=SC2154 # module, cache_root, node_packages, pause_tag, pause_image: set by the scripts that source this
# The real nodes' binaries (scripts/lib/node.sh sources it): the Debian packages a node needs
# (containerd, runc, iptables, conntrack, the CNI plugins; installed when missing) and kubelet,
# kube-proxy, kube-scheduler and the pause image built into the control plane's cache directory.
#
# Needs: variables module, cache_root (scripts/control-plane.sh), node_packages, pause_tag,
#   pause_image (scripts/lib/node.sh); functions die, need, go_tool_build
#   (scripts/lib/go-tool.sh), versions, control_plane_ldflags (scripts/lib/builds.sh),
#   image_archive (scripts/lib/image-archive.sh), apt_get (scripts/lib/apt.sh, sourced here);
#   gcc, strip.
# Provides: node_need, node_build BIN.

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
