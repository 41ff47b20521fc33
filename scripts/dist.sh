#!/usr/bin/env bash
# Makes the release artifacts in dist/ (build output, not committed):
#   install-<variant>.yaml   one per overlay in deploy/overlays/, for `kubectl apply -f`, rendered
#                            with `kubectl kustomize`, every image pinned to IMAGE:<version>
#   monitoring.yaml          the monitoring component (ServiceMonitors, PrometheusRule), to
#                            apply next to an install manifest where the Prometheus Operator runs
#   grafana-dashboard.json   deploy/grafana/jobset-inplace.json
#   jobset-inplace-<version>-x86_64-unknown-linux-musl, ...-aarch64-unknown-linux-musl
#                            the static binaries, exactly the container image's (built by
#                            scripts/check-image.sh, which replays the Dockerfile for both
#                            architectures and runs them, the aarch64 one under qemu-user)
#   jobset-inplace-<version>-oci.tar   the container image for linux/amd64 and linux/arm64: an
#                            OCI image layout archive of one multi-arch index
#                            (scripts/image-archive.sh, from the rootfs-ARCH/ check-image.sh
#                            checked), checked and pushed to a loopback registry by
#                            scripts/check-oci-archive.sh (skopeo, the test kit's registry)
#   jobset-inplace-<version>-oci.digest   that index's digest (sha256:...): what a registry
#                            serves for IMAGE:<version> after the push, and what a pod pulled
#                            from it runs (its containerStatuses[].imageID is REPO@this digest)
#   jobset-inplace-<version>-<target>.cdx.json   per binary, the SBOM (CycloneDX JSON) of the
#                            crates it links, from Cargo.lock by cargo-cyclonedx (pinned;
#                            installed when missing)
#   jobset-inplace-<version>.tgz   the Helm chart charts/jobset-inplace (`helm package`), the one
#                            source of deploy/'s objects (checked first: scripts/render-deploy.sh)
#   kubectl-jobset_inplace-<version>-<machine>-unknown-linux-musl.tar.gz
#                            the kubectl plugin: the same binary as kubectl-jobset_inplace (put it
#                            on the PATH, then `kubectl jobset-inplace doctor`), krew's layout
#   SHA256SUMS               of everything above
# and checks them: every image reference is the pinned one, every object of every manifest
# validates against Kubernetes 1.35's schema (scripts/validate-manifests.py with the PyPI package
# kubernetes-validate in a virtualenv; custom resources against their CRD or skipped with the
# reason printed), and each binary is static and for its machine.
#
# <version> is the jobset-inplace package's version in Cargo.toml. Env: IMAGE (default
# ghcr.io/jobset-inplace/jobset-inplace), KUBERNETES_VERSION (default 1.35).
#
# Usage: scripts/dist.sh [--reuse-image-build]
#        scripts/dist.sh --push REGISTRY [--plain-http]
#   --reuse-image-build: take the binaries scripts/check-image.sh has just built (as .ci/run
#   does, right after running it) instead of running it again.
#   --push REGISTRY (HOST[:PORT][/PATH]): push the dist/ made before (nothing is built) to an
#   OCI registry, as a release is published: the image's multi-arch index with
#   `skopeo copy --all` to REGISTRY/<IMAGE's path>:<version> (ghcr.io/jobset-inplace/jobset-inplace
#   -> REGISTRY/jobset-inplace/jobset-inplace), the chart with `helm push` to
#   oci://REGISTRY/<IMAGE's path without its last element>/charts (-> .../charts/jobset-inplace);
#   then reads both back: the index digest must be dist/'s jobset-inplace-<version>-oci.digest,
#   the chart's version <version>. Credentials: skopeo's and helm's own (`skopeo login`,
#   `helm registry login`). --plain-http: the registry speaks HTTP, not HTTPS (the test kit's).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
reuse=0
push=""
plain_http=0
case "${1:-}" in
  --reuse-image-build) reuse=1 ;;
  --push)
    [[ $# -ge 2 && -n "$2" ]] || { echo "dist: --push REGISTRY [--plain-http]" >&2; exit 2; }
    push=$2
    [[ "${3:-}" == --plain-http ]] && plain_http=1
    [[ $# -le 2 || "${3:-}" == --plain-http ]] || { echo "dist: --push REGISTRY [--plain-http]" >&2; exit 2; }
    ;;
  "") ;;
  *) echo "dist: unknown option $1 (--reuse-image-build, --push REGISTRY [--plain-http])" >&2; exit 2 ;;
esac

start=$(date +%s)
step() { printf '\n== %s (%ss)\n' "$*" "$(($(date +%s) - start))"; }
fail() {
  echo "dist: FAILED: $*" >&2
  exit 1
}

# shellcheck source=scripts/lib/install-manifest.sh
source scripts/lib/install-manifest.sh
version=$(install_manifest_version "$repo") ||
  fail "cannot read the jobset-inplace package's version with cargo metadata"
image_name=${IMAGE:-ghcr.io/jobset-inplace/jobset-inplace}
image="$image_name:$version"
kubernetes=${KUBERNETES_VERSION:-1.35}
dist="$repo/dist"
work="$repo/target/dist"

# --push: the release in dist/ to REGISTRY (see the header); dist/ is not touched.
if [[ -n "$push" ]]; then
  start=$(date +%s)
  oci="$dist/jobset-inplace-$version-oci.tar"
  chart="$dist/jobset-inplace-$version.tgz"
  for f in "$oci" "$chart" "$dist/jobset-inplace-$version-oci.digest" "$dist/SHA256SUMS"; do
    [[ -f "$f" ]] || fail "$f is missing: run scripts/dist.sh first"
  done
  (cd "$dist" && sha256sum --quiet -c SHA256SUMS) || fail "dist/ does not match its SHA256SUMS"
  digest=$(cat "$dist/jobset-inplace-$version-oci.digest")
  command -v skopeo >/dev/null || fail "skopeo is missing (Debian's skopeo)"
  path=${image_name#*/}
  target="$push/$path:$version"
  charts="oci://$push/${path%/*}/charts"
  tls=()
  helm_tls=()
  if [[ $plain_http -eq 1 ]]; then
    tls=(--dest-tls-verify=false)
    helm_tls=(--plain-http)
  fi
  step "push the image index to $target"
  timeout 300 skopeo copy -q --all "${tls[@]}" "oci-archive:$oci" "docker://$target" ||
    fail "skopeo copy to docker://$target"
  got="sha256:$(timeout 60 skopeo inspect --raw "${tls[@]/dest-/}" "docker://$target" | sha256sum | cut -d' ' -f1)"
  [[ "$got" == "$digest" ]] || fail "the registry serves $target as $got, dist/ recorded $digest"
  echo "$target: $digest (dist/'s)"
  step "push the chart to $charts"
  # Helm's own state in a temp dir: its registry config (logins) stays the caller's unless
  # HELM_REGISTRY_CONFIG names one.
  helm_home=$(mktemp -d)
  trap 'rm -rf "$helm_home"' EXIT
  HELM_CACHE_HOME="$helm_home/cache" HELM_CONFIG_HOME="$helm_home/config" HELM_DATA_HOME="$helm_home/data" \
    timeout 120 scripts/helm.sh push "$chart" "$charts" "${helm_tls[@]}" || fail "helm push $chart $charts"
  shown=$(HELM_CACHE_HOME="$helm_home/cache" HELM_CONFIG_HOME="$helm_home/config" HELM_DATA_HOME="$helm_home/data" \
    timeout 120 scripts/helm.sh show chart "$charts/jobset-inplace" --version "$version" "${helm_tls[@]}") ||
    fail "helm show chart $charts/jobset-inplace --version $version"
  grep -qx "version: $version" <<<"$shown" || fail "$charts/jobset-inplace reads back without version $version"
  step "pushed: image $push/$path:$version@$digest, chart $charts/jobset-inplace $version"
  exit 0
fi

rm -rf "$dist" "$work"
mkdir -p "$dist" "$work"
echo "jobset-inplace $version, image $image"

command -v kubectl >/dev/null || fail "kubectl is missing (its built-in kustomize renders deploy/)"

# `kubectl kustomize` of a kustomization in target/dist/NAME/ that takes `what` (a resources or
# components entry, a path relative to deploy/) and pins the image (scripts/lib/install-manifest.sh,
# shared with `control-plane.sh up DIR --node --install`); the output goes to $2.
render() {
  local name=$1 out=$2 field=$3 path=$4
  local dir="$work/$name"
  mkdir -p "$dir" # before the redirection below (install_manifest_render makes it too late for that)
  install_manifest_render "$repo" "$dir" "$field" "$path" "$image_name" "$version" >"$dir/rendered.yaml"
  {
    echo "$header"
    cat "$dir/rendered.yaml"
  } >"$out"
}

step "deploy/ is the chart's rendering"
# The install manifests below come from deploy/, the chart from charts/jobset-inplace: the same
# objects only while deploy/'s generated files are what the chart renders (scripts/render-deploy.sh;
# tests/helm/ checks the same).
scripts/render-deploy.sh --out "$work/render-deploy"
while read -r path; do
  cmp "$work/render-deploy/$path" "deploy/$path" ||
    fail "deploy/$path is not what charts/jobset-inplace renders: run scripts/render-deploy.sh"
done < <(scripts/render-deploy.sh --list)

step "install manifests"
variants=()
for overlay in deploy/overlays/*/; do
  variant=$(basename "$overlay")
  variants+=("$variant")
  header="# jobset-inplace $version, $variant variant (deploy/overlays/$variant): kubectl apply -f install-$variant.yaml
# Prerequisites and the steps before and after: deploy/README.md."
  render "$variant" "$dist/install-$variant.yaml" resources "overlays/$variant"
  echo "dist/install-$variant.yaml: $(grep -c '^kind:' "$dist/install-$variant.yaml") objects"
done
[[ ${#variants[@]} -gt 0 ]] || fail "no overlay in deploy/overlays/"
# The epoch dialect's JobSet CRD patch (the default variant needs it; the CRD is JobSet's, not in
# the install manifests): `kubectl patch crd jobsets.jobset.x-k8s.io --type json --patch-file`.
{
  echo "# jobset-inplace $version: the epoch dialect's status fields for JobSet's CRD, needed by install-epoch.yaml
# and install-cert-manager.yaml (deploy/components/epoch-status-fields). Apply after JobSet, and again after
# every JobSet upgrade:
#   kubectl patch crd jobsets.jobset.x-k8s.io --type json --patch-file jobset-crd-epoch-status-fields.yaml"
  grep -v '^#' deploy/components/epoch-status-fields/crd-status-fields.yaml
} >"$dist/jobset-crd-epoch-status-fields.yaml"
echo "dist/jobset-crd-epoch-status-fields.yaml: the JobSet CRD patch of the epoch dialect"

step "monitoring.yaml and the dashboard"
header="# jobset-inplace $version monitoring (deploy/components/monitoring): ServiceMonitors and a
# PrometheusRule for the Prometheus Operator. Apply next to an install manifest."
render monitoring "$dist/monitoring.yaml" components components/monitoring
echo "dist/monitoring.yaml: $(grep -c '^kind:' "$dist/monitoring.yaml") objects"
cp deploy/grafana/jobset-inplace.json "$dist/grafana-dashboard.json"

step "tools: kubernetes-validate in target/tools-venv"
venv="$repo/target/tools-venv"
# Pinned: its schemas are what the manifests are checked against (update it by hand).
kubernetes_validate_version=1.37.0
if [[ ! -x "$venv/bin/python" ]] ||
  [[ "$("$venv/bin/python" -c 'import kubernetes_validate as k; print(k.__version__)' 2>/dev/null)" != "$kubernetes_validate_version" ]]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "kubernetes-validate==$kubernetes_validate_version"
fi
"$venv/bin/python" -c 'import kubernetes_validate as k; print("kubernetes-validate", k.__version__)'

step "every image is $image"
# Every container's image and every env value that names an image of ours (the webhook's
# JOBSET_INPLACE_AGENT_IMAGE, the agent it injects).
"$venv/bin/python" - "$image" "$dist"/install-*.yaml <<'PY' || fail "image references"
import collections, sys, yaml
image, paths = sys.argv[1], sys.argv[2:]
bad = 0
for path in paths:
    refs = collections.Counter()
    agent = None
    for o in yaml.safe_load_all(open(path)):
        pod = ((o or {}).get("spec") or {}).get("template", {}).get("spec") or {}
        for c in pod.get("initContainers", []) + pod.get("containers", []):
            refs[c["image"]] += 1
            for e in c.get("env", []):
                if e["name"] == "JOBSET_INPLACE_AGENT_IMAGE":
                    agent = e.get("value")
                    refs[agent] += 1
    print(f"{path.rsplit('/', 1)[-1]}: {dict(refs)}")
    if set(refs) != {image} or agent != image:
        print(f"  not all {image}, or no agent image", file=sys.stderr)
        bad += 1
sys.exit(1 if bad else 0)
PY

step "Kubernetes $kubernetes schema validation"
"$venv/bin/python" scripts/validate-manifests.py --kubernetes "$kubernetes" \
  --crd fixtures/jobset-v0.12/jobset.x-k8s.io_jobsets.yaml \
  "$dist"/install-*.yaml "$dist/monitoring.yaml" || fail "schema validation"

step "binaries"
if [[ $reuse -eq 0 ]]; then
  scripts/check-image.sh
fi
for pair in amd64:x86_64 arm64:aarch64; do
  arch=${pair%%:*}
  machine=${pair##*:}
  bin="$repo/target/check-image/rootfs-$arch/jobset-inplace"
  [[ -x "$bin" ]] || fail "$bin is missing: run scripts/check-image.sh (or drop --reuse-image-build)"
  out="$dist/jobset-inplace-$version-$machine-unknown-linux-musl"
  cp "$bin" "$out"
  file "$out"
  file "$out" | grep -Eq 'statically linked|static-pie linked' || fail "$out is not static"
  case "$machine" in
  x86_64) file "$out" | grep -q 'x86-64' || fail "$out is not for x86-64" ;;
  aarch64) file "$out" | grep -q 'ARM aarch64' || fail "$out is not for aarch64" ;;
  esac
done

step "OCI image archive (linux/amd64, linux/arm64)"
# The image of the binaries above (the same rootfs-ARCH/ trees), tagged IMAGE:<version> for
# `ctr images import`; its checks and a push to a registry on loopback: scripts/check-oci-archive.sh.
oci="$dist/jobset-inplace-$version-oci.tar"
IMAGE="$image_name" scripts/image-archive.sh "$oci" amd64 arm64
scripts/check-oci-archive.sh "$oci" "$version" amd64 arm64 || fail "the OCI image archive"
# The index's digest (check-oci-archive.sh checked that skopeo and a registry serve it as is).
tar -xOf "$oci" index.json | python3 -c 'import json, sys
print(json.load(sys.stdin)["manifests"][0]["digest"])' >"$dist/jobset-inplace-$version-oci.digest"
echo "dist/jobset-inplace-$version-oci.digest: $(cat "$dist/jobset-inplace-$version-oci.digest")"

step "SBOM (cargo-cyclonedx)"
# The crates each shipped binary links, from Cargo.lock: cargo-cyclonedx (CycloneDX's own tool)
# resolves the jobset-inplace package for that musl target, without dev- and build-dependencies
# (one SBOM per target: x86_64 links cpufeatures and core_detect, aarch64 does not). Pinned, so
# that a new release cannot change the output (scripts/cargo-tool.sh holds the pin).
scripts/cargo-tool.sh cyclonedx
for target in x86_64-unknown-linux-musl aarch64-unknown-linux-musl; do
  sbom="$dist/jobset-inplace-$version-$target.cdx.json"
  # It writes <name>.json beside each Cargo.toml of the workspace: moved out at once.
  SOURCE_DATE_EPOCH=0 cargo cyclonedx --manifest-path Cargo.toml --format json --spec-version 1.5 \
    --target "$target" --no-build-deps --override-filename "sbom-$target" -qq ||
    fail "cargo cyclonedx --target $target"
  mv "sbom-$target.json" "$sbom"
  find . -name "sbom-$target.json" -not -path './target/*' -delete
  "$venv/bin/python" - "$sbom" "$version" <<'PY' || fail "the SBOM $sbom"
import json, sys
path, version = sys.argv[1:3]
bom = json.load(open(path))
names = {c["name"] for c in bom.get("components", [])}
top = bom["metadata"]["component"]
errors = []
if (top["name"], top.get("version")) != ("jobset-inplace", version):
    errors.append(f"describes {top['name']} {top.get('version')}, not jobset-inplace {version}")
for want in ("kube", "kube-client", "rustls", "tokio", "k8s-openapi"):
    if want not in names:
        errors.append(f"{want} (linked by the binary) missing")
for dev in ("jobset-inplace-testkit", "proptest", "stateright", "rstest"):
    if dev in names:
        errors.append(f"{dev} is dev-only, yet listed")
if errors:
    sys.exit("\n".join(errors))
print(f"{path.rsplit('/', 1)[-1]}: {len(names)} crates, CycloneDX {bom['specVersion']}: "
      "kube, kube-client, rustls, tokio, k8s-openapi in; testkit, proptest, stateright, rstest out")
PY
done

step "Helm chart"
# charts/jobset-inplace packaged as is (its version and appVersion are the crate's: tests/helm/);
# helm is built from its pinned Go module by scripts/helm.sh (cached).
scripts/helm.sh lint --strict charts/jobset-inplace
scripts/helm.sh package charts/jobset-inplace --destination "$dist"
[[ -f "$dist/jobset-inplace-$version.tgz" ]] || fail "helm package did not write dist/jobset-inplace-$version.tgz"

step "kubectl plugin"
# The binary is the plugin: kubectl runs `kubectl-jobset_inplace` for `kubectl jobset-inplace`.
for machine in x86_64 aarch64; do
  name="kubectl-jobset_inplace-$version-$machine-unknown-linux-musl"
  mkdir -p "$work/$name"
  cp "$dist/jobset-inplace-$version-$machine-unknown-linux-musl" "$work/$name/kubectl-jobset_inplace"
  tar -C "$work/$name" --owner=0 --group=0 --numeric-owner -czf "$dist/$name.tar.gz" .
  tar -tzf "$dist/$name.tar.gz" | grep -qx './kubectl-jobset_inplace' || fail "$name.tar.gz has no plugin"
done
# The host's plugin answers through kubectl (tests/it/cli/offline.rs does the same with the debug build).
if [[ "$(uname -m)" == x86_64 ]]; then
  plugin_dir="$work/plugin-path"
  mkdir -p "$plugin_dir"
  tar -C "$plugin_dir" -xzf "$dist/kubectl-jobset_inplace-$version-x86_64-unknown-linux-musl.tar.gz" ./kubectl-jobset_inplace
  # `jobset-inplace VERSION (commit C, built D)`: the build's commit and day follow (build.rs).
  PATH="$plugin_dir:$PATH" kubectl jobset-inplace --version | grep -Eq "^jobset-inplace ${version//./\\.}( |$)" ||
    fail "kubectl jobset-inplace --version does not run the plugin"
fi

step "SHA256SUMS"
(cd "$dist" && sha256sum -- * >SHA256SUMS && cat SHA256SUMS)

step "dist/ done: ${#variants[@]} install manifests (${variants[*]}), monitoring, dashboard, 2 binaries, 2 kubectl plugins, the OCI image and its digest, 2 SBOMs, the Helm chart"
ls -l "$dist"
