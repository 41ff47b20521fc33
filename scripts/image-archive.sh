#!/usr/bin/env bash
# The product's container image as an OCI image layout archive, from the final stage's files that
# scripts/check-image.sh assembled (target/check-image/rootfs-ARCH/: the same bytes it checks),
# without Docker and without a registry. `ctr images import` loads it (scripts/control-plane.sh
# `up DIR --node --install VARIANT` does), as do `docker load` (>= 25), skopeo
# (`oci-archive:OUT.tar`) and `crane push`.
#
#   scripts/image-archive.sh OUT.tar [ARCH ...]      (default: $ARCHES, else amd64)
#
# The archive: oci-layout, index.json naming one image index (annotations
# `io.containerd.image.name` = IMAGE:<version>, `org.opencontainers.image.ref.name` = <version>),
# which lists one image manifest per ARCH (platform linux/ARCH), each with its config and one
# gzip layer. One arch or both, the same shape: the release's multi-arch index is the same call
# with `amd64 arm64`. The config takes USER, ENTRYPOINT and LABELs from the Dockerfile's final
# stage, plus the OCI labels org.opencontainers.image.source, .version and .revision (the commit,
# `-dirty` when the work tree has changes). Reproducible: the same files and commit give the same
# digests (files owned by 0:0 as COPY makes them, mtime 0, gzip without name or time).
#
# Env: IMAGE (default ghcr.io/jobset-inplace/jobset-inplace, as scripts/dist.sh), ROOTFS_ROOT
#      (default target/check-image: where rootfs-ARCH/ are),
#      SOURCE (default https://github.com/jobset-inplace/jobset-inplace).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
[[ $# -ge 1 ]] || { sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
out=$1
shift
if [[ $# -gt 0 ]]; then
  arches=("$@")
else
  read -r -a arches <<<"${ARCHES:-amd64}"
fi

# shellcheck source=scripts/lib/install-manifest.sh
source scripts/lib/install-manifest.sh
version=$(install_manifest_version "$repo") || {
  echo "image-archive: cannot read the jobset-inplace package's version (cargo metadata)" >&2
  exit 1
}
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
if [[ "$revision" != unknown ]] && ! git diff --quiet HEAD -- Dockerfile Cargo.toml Cargo.lock src 2>/dev/null; then
  revision="$revision-dirty"
fi
rootfses=()
for arch in "${arches[@]}"; do
  rootfs="${ROOTFS_ROOT:-$repo/target/check-image}/rootfs-$arch"
  [[ -d "$rootfs" ]] || {
    echo "image-archive: $rootfs is missing: run ARCHES=$arch scripts/check-image.sh first" >&2
    exit 1
  }
  rootfses+=("$arch=$rootfs")
done

python3 - "$out" "${IMAGE:-ghcr.io/jobset-inplace/jobset-inplace}" "$version" "$revision" \
  "${SOURCE:-https://github.com/jobset-inplace/jobset-inplace}" Dockerfile "${rootfses[@]}" <<'PY'
import gzip, hashlib, io, json, os, re, sys, tarfile

out, image, version, revision, source, dockerfile = sys.argv[1:7]
rootfses = [a.split("=", 1) for a in sys.argv[7:]]
ref = f"{image}:{version}"

# The final stage of the Dockerfile: USER, ENTRYPOINT, LABELs (continuations joined).
lines, cont = [], ""
for raw in open(dockerfile):
    if raw.lstrip().startswith("#") or (not raw.strip() and not cont):
        continue
    line = cont + raw.rstrip("\n")
    if line.rstrip().endswith("\\"):
        cont = line.rstrip()[:-1] + " "
        continue
    cont = ""
    lines.append(line.strip())
stages = [i for i, l in enumerate(lines) if l.upper().startswith("FROM ")]
final = lines[stages[-1]:]
if not final[0].split()[1] == "scratch":
    sys.exit("image-archive: the Dockerfile's final stage is not FROM scratch")
user, entrypoint, labels = None, None, {}
for l in final:
    word, _, rest = l.partition(" ")
    word = word.upper()
    if word == "USER":
        user = rest.strip()
    elif word == "ENTRYPOINT":
        entrypoint = json.loads(rest)
    elif word == "LABEL":
        for k, v in re.findall(r'([\w.\-/]+)=("(?:[^"\\]|\\.)*"|\S+)', rest):
            labels[k] = json.loads(v) if v.startswith('"') else v
if not user or not entrypoint:
    sys.exit("image-archive: no USER or ENTRYPOINT in the Dockerfile's final stage")
labels.update({
    "org.opencontainers.image.source": source,
    "org.opencontainers.image.version": version,
    "org.opencontainers.image.revision": revision,
})

blobs = {}
def blob(data, media_type, **extra):
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    blobs[digest] = data
    return {"mediaType": media_type, "digest": digest, "size": len(data), **extra}

def canonical(obj):
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()

def layer(rootfs):
    # As COPY makes them: owned by 0:0, modes kept; sorted, mtime 0: reproducible.
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        paths = []
        for d, dirs, files in os.walk(rootfs):
            dirs.sort()
            for name in sorted(dirs + files):
                paths.append(os.path.join(d, name))
        for path in sorted(paths, key=lambda p: os.path.relpath(p, rootfs)):
            info = tar.gettarinfo(path, os.path.relpath(path, rootfs))
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0
            info.pax_headers = {}
            if info.isreg():
                with open(path, "rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
    plain = buf.getvalue()
    zipped = gzip.compress(plain, compresslevel=9, mtime=0)
    return plain, zipped

manifests = []
for arch, rootfs in rootfses:
    plain, zipped = layer(rootfs)
    diff_id = "sha256:" + hashlib.sha256(plain).hexdigest()
    config = {
        "architecture": arch,
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": {
            "User": user,
            "Entrypoint": entrypoint,
            "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            "WorkingDir": "/",
            "Labels": labels,
        },
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created": "1970-01-01T00:00:00Z",
                     "created_by": "scripts/image-archive.sh: the Dockerfile's final stage"}],
    }
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": blob(canonical(config), "application/vnd.oci.image.config.v1+json"),
        "layers": [blob(zipped, "application/vnd.oci.image.layer.v1.tar+gzip")],
        "annotations": {k: v for k, v in labels.items() if k.startswith("org.opencontainers.image.")},
    }
    manifests.append(blob(canonical(manifest), "application/vnd.oci.image.manifest.v1+json",
                          platform={"architecture": arch, "os": "linux"}))

annotations = {"io.containerd.image.name": ref, "org.opencontainers.image.ref.name": version}
image_index = {
    "schemaVersion": 2,
    "mediaType": "application/vnd.oci.image.index.v1+json",
    "manifests": manifests,
    "annotations": {k: v for k, v in labels.items() if k.startswith("org.opencontainers.image.")},
}
top = {
    "schemaVersion": 2,
    "mediaType": "application/vnd.oci.image.index.v1+json",
    "manifests": [blob(canonical(image_index), "application/vnd.oci.image.index.v1+json",
                       annotations=annotations)],
}

def add(tar, name, data):
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), 0, 0o644
    tar.addfile(info, io.BytesIO(data))

tmp = out + ".tmp"
with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as tar:
    add(tar, "oci-layout", canonical({"imageLayoutVersion": "1.0.0"}))
    add(tar, "index.json", canonical(top))
    for d in ("blobs", "blobs/sha256"):
        info = tarfile.TarInfo(d)
        info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
        tar.addfile(info)
    for digest in sorted(blobs):
        add(tar, "blobs/sha256/" + digest.split(":", 1)[1], blobs[digest])
os.replace(tmp, out)
print(f"image-archive: {out}: {ref}, index {top['manifests'][0]['digest']}, "
      f"{', '.join(a for a, _ in rootfses)}", file=sys.stderr)
PY
