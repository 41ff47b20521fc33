# shellcheck shell=bash
# shellcheck disable=SC2154 # repo, ready_timeout, node_label: set by the scripts that source this
# The product installed on the real nodes of scripts/control-plane.sh `up DIR --node --install
# [helm:]VARIANT` and `install DIR [helm:]VARIANT` (sourced by it): its image (an archive
# imported, or dist/ pushed to the test kit's registry), the install manifest or the Helm chart,
# the wait for the rollout. The details are below, above install_fail.
#
# Needs: variables repo, ready_timeout, node_label, install_stops_all (0 or unset: a failure
#   leaves the cluster up); functions die, stop_all (scripts/lib/supervise.sh), node_dirs
#   (scripts/lib/node-network.sh), load_image (scripts/lib/node-image.sh), install_manifest_render,
#   install_manifest_version (scripts/lib/install-manifest.sh); kubectl, ctr, tar, python3.
# Provides: install_product DIR [helm:]VARIANT, install_manifest, install_helm, install_wait,
#   install_fail DIR WHY.

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
