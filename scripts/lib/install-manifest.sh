# shellcheck shell=bash
# How an install manifest is rendered: `kubectl kustomize` of a kustomization that takes one
# entry of deploy/ and pins every image of ours (the webhook's JOBSET_INPLACE_AGENT_IMAGE too,
# deploy/base/image-fields.yaml) to IMAGE_NAME:VERSION. Sourced by scripts/dist.sh (the release's
# dist/install-VARIANT.yaml) and scripts/control-plane.sh (`up DIR --node --install VARIANT`), so
# that both render the same bytes.
#
#   install_manifest_render REPO WORKDIR FIELD PATH IMAGE_NAME VERSION > rendered.yaml
#     FIELD: resources or components; PATH: relative to REPO/deploy (e.g. overlays/epoch).
#     WORKDIR (created) gets the kustomization.yaml.
#
# Needs: kubectl; cargo and python3 (install_manifest_version).
# Provides: install_manifest_render, install_manifest_version REPO.

install_manifest_render() {
  local repo=$1 dir=$2 field=$3 path=$4 image_name=$5 version=$6
  mkdir -p "$dir"
  cat >"$dir/kustomization.yaml" <<EOK
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
$field:
- $(realpath --relative-to="$dir" "$repo/deploy/$path")
images:
- name: ghcr.io/jobset-inplace/jobset-inplace
  newName: $image_name
  newTag: "$version"
EOK
  kubectl kustomize "$dir"
}

# The jobset-inplace package's version (Cargo.toml), what the image tag and the manifests carry.
install_manifest_version() {
  local repo=$1
  (cd "$repo" && cargo metadata --no-deps --format-version 1 --offline 2>/dev/null) |
    python3 -c 'import json,sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"] == "jobset-inplace"))'
}
