# shellcheck shell=bash
# Builds binaries from a Go tool module of ours (a go.mod + go.sum whose `tool` directives pin
# upstream programs; no Go source of ours) into a cache directory keyed by that module: the one
# Go build of scripts/control-plane.sh (the control plane's graph, the controllers' graph) and
# scripts/helm.sh (helm, in the controllers' graph). Sourced; needs `die`.
#
#   go_tool_build MODULE ROOT PREFIX LDFLAGS NAME=PACKAGE...
#
# prints ROOT/KEY, the directory holding each NAME (built from PACKAGE), building those it lacks
# in one `go build` (so that the packages they share compile once): CGO off (static binaries, no C
# toolchain), -mod=readonly (the go.sum is the pin), -trimpath and LDFLAGS (callers pass -s -w to
# keep them small). KEY is PREFIX_go-<go version>_<hash of MODULE's go.mod and go.sum, these build
# flags and LDFLAGS>: a changed pin, Go or flag builds again. ROOT is this build's alone: its
# other directories (older keys) are removed after a build. Progress goes to stderr. Calls on one
# ROOT take turns (flock on ROOT/.lock): one that waited finds the binaries the other built
# (.ci/run builds helm in the background while tests/helm/ may ask for it).
# Go's module and build caches are Go's own (GOMODCACHE, GOCACHE): the graphs share them.
#
# Needs: function die; go, flock, sha256sum.
# Provides: go_tool_build (and its helpers go_tool_build_locked, go_tool_key,
#   go_tool_default_name, go_tool_flags).

go_tool_flags="CGO_ENABLED=0 go build -mod=readonly -trimpath"

# The key of MODULE's build with LDFLAGS (the directory's name without PREFIX).
go_tool_key() {
  local module="$1" ldflags="$2"
  echo "go-$(go env GOVERSION)_$( (cat "$module/go.mod" "$module/go.sum"
    echo "$go_tool_flags -ldflags=$ldflags") | sha256sum | cut -c1-12)"
}

# The file name `go build -o DIR/` gives PACKAGE's binary: its last path element, or the one
# before a major-version suffix (go.etcd.io/etcd/server/v3 -> server).
go_tool_default_name() {
  local pkg="$1" base
  base="${pkg##*/}"
  if [[ "$base" =~ ^v[0-9]+$ ]]; then
    base="${pkg%/*}"
    base="${base##*/}"
  fi
  echo "$base"
}

go_tool_build() {
  local module="$1" root="$2" prefix="$3" ldflags="$4"
  shift 4
  command -v go >/dev/null 2>&1 || die "go is required (Go toolchain, to build from $module)"
  local key lock_fd
  key="${prefix}_$(go_tool_key "$module" "$ldflags")"
  mkdir -p "$root"
  exec {lock_fd}>"$root/.lock"
  flock "$lock_fd"
  local rc=0
  go_tool_build_locked "$module" "$root" "$key" "$ldflags" "$@" || rc=$?
  exec {lock_fd}>&-
  return "$rc"
}

# go_tool_build's work, under its lock: KEY instead of PREFIX.
go_tool_build_locked() {
  local module="$1" root="$2" key="$3" ldflags="$4"
  shift 4
  local dir spec name pkg tmp start missing=() pkgs=()
  dir="$root/$key"
  for spec in "$@"; do
    name="${spec%%=*}"
    pkg="${spec#*=}"
    [[ -x "$dir/$name" ]] || { missing+=("$spec"); pkgs+=("$pkg"); }
  done
  if ((${#missing[@]} == 0)); then
    echo "$dir"
    return
  fi
  tmp="$(mktemp -d "$root/.build.XXXXXX")"
  start=$SECONDS
  echo "go-tool: building ${missing[*]%%=*} into $dir (cold: long on 2 cores) ..." >&2
  if ! (cd "$module" && CGO_ENABLED=0 go build -mod=readonly -trimpath -ldflags="$ldflags" \
      -o "$tmp/" "${pkgs[@]}") >&2; then
    rm -rf "$tmp"
    die "go build in $module failed (above)"
  fi
  mkdir -p "$dir"
  for spec in "${missing[@]}"; do
    name="${spec%%=*}"
    mv "$tmp/$(go_tool_default_name "${spec#*=}")" "$dir/$name"
  done
  rmdir "$tmp"
  echo "go-tool: built ${missing[*]%%=*} in $((SECONDS - start)) s" >&2
  # Keep disk lean: older builds go.
  find "$root" -mindepth 1 -maxdepth 1 -type d ! -name "$key" ! -name '.build.*' \
    -exec rm -rf {} +
  echo "$dir"
}
