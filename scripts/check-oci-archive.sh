#!/usr/bin/env bash
# Checks the release's OCI image archive (scripts/image-archive.sh's output, dist/'s
# jobset-inplace-VERSION-oci.tar) as a registry and its tools take it, with skopeo (Debian's
# `skopeo`, installed with apt-get when missing and running as root) and the test kit's registry
# (scripts/registry.sh: go-containerregistry's, built from its Go module):
#   1. `skopeo inspect --raw oci-archive:ARCHIVE` is one image index, its digest the one the
#      archive's index.json names, with exactly the platforms linux/ARCH asked for;
#   2. each platform's config (`skopeo inspect --config --raw --override-arch ARCH`): that
#      architecture, a non-root USER, the entrypoint, the OCI labels source, version (VERSION)
#      and revision;
#   3. `skopeo copy --all oci-archive:ARCHIVE oci:TMP:VERSION` round-trips to the same index digest;
#   4. the registry on loopback (127.0.0.1, a free port, storage in a temp dir; started and
#      stopped by its PID, scripts/registry.sh start/stop): `skopeo copy --all --dest-tls-verify=false oci-archive:ARCHIVE
#      docker://127.0.0.1:PORT/jobset-inplace:VERSION`, then read back: the same index digest,
#      both platforms, each platform's manifest there.
#
# Usage: scripts/check-oci-archive.sh ARCHIVE VERSION [ARCH ...]   (default: amd64 arm64)
set -euo pipefail
[[ $# -ge 2 ]] || { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
archive=$(realpath "$1")
version=$2
shift 2
arches=("$@")
[[ ${#arches[@]} -gt 0 ]] || arches=(amd64 arm64)

fail() {
  echo "check-oci-archive: FAILED: $*" >&2
  exit 1
}
[[ -f "$archive" ]] || fail "$archive: no such file"

start=$(date +%s)
step() { printf '== %s (%ss)\n' "$*" "$(($(date +%s) - start))"; }
tmp=$(mktemp -d)
registry="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/registry.sh"
cleanup() {
  "$registry" stop "$tmp/registry" || true
  rm -rf "$tmp"
}
trap cleanup EXIT

need=()
command -v skopeo >/dev/null || need+=(skopeo)
if [[ ${#need[@]} -gt 0 ]]; then
  if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null; then
    fail "missing: ${need[*]} (Debian packages)"
  fi
  # shellcheck source=scripts/lib/apt.sh
  source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib/apt.sh"
  if ! { apt_get update -qq && apt_get install -y -qq --no-install-recommends "${need[@]}"; } >"$tmp/apt.log" 2>&1; then
    tail -n 20 "$tmp/apt.log" >&2
    fail "apt-get install ${need[*]}"
  fi
fi
skopeo --version
"$registry" build >/dev/null || fail "the registry (scripts/registry.sh build)"

# The digest of the image index the archive's index.json names (exactly one).
index_digest=$(tar -xOf "$archive" index.json | python3 -c '
import json, sys
m = json.load(sys.stdin)["manifests"]
if len(m) != 1 or m[0]["mediaType"] != "application/vnd.oci.image.index.v1+json":
    sys.exit(f"index.json must name exactly one image index, it names {m}")
print(m[0]["digest"])') || fail "$archive: index.json"
echo "archive: index $index_digest"

# check_index WHAT: stdin is a raw image index; its digest must be $index_digest and its
# platforms exactly linux/ARCH for ARCH in $arches.
check_index() {
  local what=$1 digest
  cat >"$tmp/index.json"
  digest="sha256:$(sha256sum "$tmp/index.json" | cut -d' ' -f1)"
  [[ "$digest" == "$index_digest" ]] || fail "$what: index digest $digest, not the archive's $index_digest"
  python3 - "$tmp/index.json" "$what" "${arches[@]}" <<'PY' || fail "$what: the image index"
import json, sys
path, what, want = sys.argv[1], sys.argv[2], sorted("linux/" + a for a in sys.argv[3:])
index = json.load(open(path))
if index.get("mediaType") != "application/vnd.oci.image.index.v1+json":
    sys.exit(what + ": not an OCI image index: " + repr(index.get("mediaType")))
got = sorted(m["platform"]["os"] + "/" + m["platform"]["architecture"] for m in index["manifests"])
if got != want:
    sys.exit(f"{what}: platforms {got}, want {want}")
print(what + ": platforms " + " ".join(got))
PY
  echo "$what: digest $digest (the archive's)"
}

step "1. skopeo inspect --raw oci-archive:"
skopeo inspect --raw "oci-archive:$archive" | check_index "oci-archive"

step "2. each platform's config"
for arch in "${arches[@]}"; do
  skopeo inspect --config --raw --override-os linux --override-arch "$arch" "oci-archive:$archive" >"$tmp/config.json"
  python3 - "$tmp/config.json" "$arch" "$version" <<'PY' || fail "the linux/$arch image's config"
import json, sys
path, arch, version = sys.argv[1:4]
c = json.load(open(path))
cfg = c.get("config") or {}
labels = cfg.get("Labels") or {}
errors = []
if c.get("architecture") != arch or c.get("os") != "linux":
    errors.append("platform %s/%s" % (c.get("os"), c.get("architecture")))
if (cfg.get("User") or "").split(":")[0] in ("", "0", "root"):
    errors.append("USER %r is root" % cfg.get("User"))
if not cfg.get("Entrypoint"):
    errors.append("no entrypoint")
if labels.get("org.opencontainers.image.version") != version:
    errors.append("label version %r, want %s" % (labels.get("org.opencontainers.image.version"), version))
for k in ("source", "revision"):
    if not labels.get("org.opencontainers.image." + k):
        errors.append("no org.opencontainers.image.%s label" % k)
if errors:
    sys.exit("linux/%s: %s" % (arch, "; ".join(errors)))
print("linux/%s: USER %s, entrypoint %s, version %s, revision %s, source %s" % (
    arch, cfg["User"], cfg["Entrypoint"], version,
    labels["org.opencontainers.image.revision"], labels["org.opencontainers.image.source"]))
PY
done

step "3. skopeo copy --all oci-archive: oci: (round trip)"
skopeo copy -q --all "oci-archive:$archive" "oci:$tmp/layout:$version"
skopeo inspect --raw "oci:$tmp/layout:$version" | check_index "oci layout copy"

step "4. push to a registry on loopback"
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
mkdir -p "$tmp/registry"
"$registry" start "127.0.0.1:$port" "$tmp/registry" || fail "the registry on 127.0.0.1:$port"
echo "registry: pid $(cat "$tmp/registry/registry.pid") on 127.0.0.1:$port"
ref="docker://127.0.0.1:$port/jobset-inplace:$version"
push_start=$(date +%s.%N)
timeout 120 skopeo copy -q --all --dest-tls-verify=false "oci-archive:$archive" "$ref" ||
  { tail -n 20 "$tmp/registry/registry.log" >&2; fail "skopeo copy to $ref"; }
echo "pushed to $ref in $(python3 -c "import sys; print(round(float(sys.argv[2]) - float(sys.argv[1]), 1))" "$push_start" "$(date +%s.%N)") s"
timeout 60 skopeo inspect --raw --tls-verify=false "$ref" | check_index "registry"
# Each platform's manifest, by the digest the index names, as a pull by digest fetches it.
python3 -c 'import json, sys; [print(m["digest"]) for m in json.load(open(sys.argv[1]))["manifests"]]' "$tmp/index.json" >"$tmp/digests"
while read -r digest; do
  got="sha256:$(timeout 60 skopeo inspect --raw --tls-verify=false "docker://127.0.0.1:$port/jobset-inplace@$digest" | sha256sum | cut -d' ' -f1)"
  [[ "$got" == "$digest" ]] || fail "the registry's manifest $digest reads back as $got"
  echo "registry: manifest $digest there"
done <"$tmp/digests"
step "done"
echo "check-oci-archive: $archive: pushable as is (index $index_digest, ${arches[*]})"
