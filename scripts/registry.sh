#!/usr/bin/env bash
# The test kit's OCI registry: go-containerregistry's `crane registry serve` (the registry of its
# pkg/registry: OCI image manifests and indexes, Helm's OCI chart artifacts, the referrers API;
# blobs on disk, manifests in memory), built once from its upstream Go module
# (github.com/google/go-containerregistry/cmd/crane, pinned in the controllers' graph
# scripts/tools/go.mod + go.sum; no Go source of ours) by go_tool_build (scripts/lib/go-tool.sh)
# and cached under
# ${JOBSET_INPLACE_REGISTRY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/jobset-inplace/registry}/<version+key>/.
# Plain HTTP: `crane registry serve` has no TLS option (clients: skopeo --dest-tls-verify=false,
# helm --plain-http, containerd through a hosts.toml `server = "http://..."`).
#
#   scripts/registry.sh build                  build if needed, print the binary's path
#   scripts/registry.sh start ADDR:PORT DIR    start it on ADDR:PORT (blobs in DIR/storage, its
#                                              log DIR/registry.log), wait until /v2/ answers
#                                              (at most 20 s), write its PID to DIR/registry.pid
#   scripts/registry.sh stop DIR               stop the one DIR/registry.pid names (TERM, then
#                                              KILL after 5 s), remove DIR/storage and the PID file
#
# Needs: go (>= the go.mod's version; the module proxy or a filled module cache), curl.
set -Eeuo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=scripts/lib/go-tool.sh
source "$here/lib/go-tool.sh"
module="$here/tools"
cache_root="${JOBSET_INPLACE_REGISTRY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/jobset-inplace/registry}"

die() {
  echo "registry.sh: $*" >&2
  exit 1
}

build() {
  command -v go >/dev/null 2>&1 || die "go is required (Go toolchain, to build crane from its module)"
  local version dir
  version="$(cd "$module" && go list -m -f '{{.Version}}' github.com/google/go-containerregistry)"
  dir="$(go_tool_build "$module" "$cache_root" "crane-$version" "-s -w" \
    crane=github.com/google/go-containerregistry/cmd/crane)"
  echo "$dir/crane"
}

start() {
  local addr="$1" dir="$2" crane pid
  [[ "$addr" == *:* ]] || die "start: ADDR:PORT, not '$addr'"
  crane="$(build)"
  mkdir -p "$dir/storage"
  if [[ -f "$dir/registry.pid" ]] && kill -0 "$(cat "$dir/registry.pid")" 2>/dev/null; then
    die "a registry runs already for $dir (pid $(cat "$dir/registry.pid"))"
  fi
  # setsid: its own session, so that the caller's job control and signals do not reach it; it
  # runs until `stop`.
  setsid "$crane" registry serve --address "$addr" --disk "$dir/storage" \
    </dev/null >"$dir/registry.log" 2>&1 &
  pid=$!
  echo "$pid" >"$dir/registry.pid"
  local deadline=$((SECONDS + 20))
  until curl -sf --max-time 2 "http://$addr/v2/" >/dev/null; do
    if ! kill -0 "$pid" 2>/dev/null; then
      cat "$dir/registry.log" >&2
      rm -f "$dir/registry.pid"
      die "the registry on $addr exited (log above)"
    fi
    if ((SECONDS >= deadline)); then
      cat "$dir/registry.log" >&2
      stop "$dir"
      die "the registry (pid $pid) did not answer on http://$addr/v2/ within 20 s"
    fi
    sleep 0.1
  done
  echo "registry.sh: crane registry serve, pid $pid, on http://$addr" >&2
}

stop() {
  local dir="$1" pid
  if [[ -f "$dir/registry.pid" ]]; then
    pid="$(cat "$dir/registry.pid")"
    # Only our process: the PID must still be a crane serving this DIR's storage.
    if [[ "$pid" =~ ^[0-9]+$ ]] && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null |
      grep -qF -- "--disk $dir/storage"; then
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 1 50); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
      done
      if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null || true; fi
    fi
    rm -f "$dir/registry.pid"
  fi
  rm -rf "$dir/storage"
}

[[ $# -gt 0 ]] || { sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
case "$1" in
  build) build ;;
  start)
    [[ $# -eq 3 ]] || die "usage: start ADDR:PORT DIR"
    start "$2" "$3"
    ;;
  stop)
    [[ $# -eq 2 ]] || die "usage: stop DIR"
    stop "$2"
    ;;
  *) die "unknown command '$1' (build, start, stop)" ;;
esac
