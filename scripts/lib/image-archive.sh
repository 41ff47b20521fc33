# shellcheck shell=bash
# Writes a one-layer image as a docker-archive (what `docker save` writes, and what
# `ctr images import` reads) from a root file system directory, with standard tools only: no
# Docker daemon, no registry. Sourced by scripts/control-plane.sh (the pause image) and
# scripts/test-image.sh.
#
#   image_archive OUT.tar TAG ROOTFS 'ENTRYPOINT-JSON-ARRAY' ['ENV-JSON-ARRAY']
#
# The layer is reproducible (sorted names, owner 0, mtime 0), so the same ROOTFS gives the same
# image ID.
#
# Needs: tar, sha256sum.
# Provides: image_archive.

image_archive() {
  local out="$1" tag="$2" rootfs="$3" entrypoint="$4" env="${5:-[\"PATH=/bin\"]}"
  local work layer_sha config config_sha arch
  arch="$(uname -m)"
  case "$arch" in
    x86_64) arch=amd64 ;;
    aarch64) arch=arm64 ;;
  esac
  work="$(mktemp -d)"
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$rootfs" -cf "$work/layer.tar" .
  layer_sha="$(sha256sum "$work/layer.tar" | cut -d' ' -f1)"
  mkdir "$work/$layer_sha"
  mv "$work/layer.tar" "$work/$layer_sha/layer.tar"
  config="{\"architecture\":\"$arch\",\"os\":\"linux\",\"created\":\"1970-01-01T00:00:00Z\",\
\"config\":{\"Entrypoint\":$entrypoint,\"Env\":$env,\"WorkingDir\":\"/\"},\
\"rootfs\":{\"type\":\"layers\",\"diff_ids\":[\"sha256:$layer_sha\"]}}"
  config_sha="$(printf '%s' "$config" | sha256sum | cut -d' ' -f1)"
  printf '%s' "$config" >"$work/$config_sha.json"
  printf '[{"Config":"%s.json","RepoTags":["%s"],"Layers":["%s/layer.tar"]}]' \
    "$config_sha" "$tag" "$layer_sha" >"$work/manifest.json"
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$work" -cf "$out" \
    manifest.json "$config_sha.json" "$layer_sha"
  rm -rf "$work"
}
