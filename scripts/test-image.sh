#!/usr/bin/env bash
# The test image of tests/real_node/: Debian's busybox-static and scripts/test-image/worker.sh
# (records each start into a volume, runs until told to exit with a code), one layer, written as
# a docker-archive for `scripts/control-plane.sh load-image DIR OUT.tar`.
#
#   scripts/test-image.sh OUT.tar [TAG]     (TAG default localhost/jobset-inplace/test-worker:1)
#
# Installs busybox-static (apt-get) when /bin/busybox is missing or not static.
set -Eeuo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=scripts/lib/image-archive.sh
source "$here/lib/image-archive.sh"

[[ $# -ge 1 && $# -le 2 ]] || { sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
out="$1"
tag="${2:-localhost/jobset-inplace/test-worker:1}"

static() { [[ -x /bin/busybox ]] && ! ldd /bin/busybox >/dev/null 2>&1; }
if ! static; then
  echo "test-image: installing busybox-static (apt-get)" >&2
  DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends busybox-static >&2
  static || { echo "test-image: /bin/busybox is not a static binary" >&2; exit 1; }
fi

root="$(mktemp -d)"
trap 'rm -rf "$root"' EXIT
mkdir -p "$root/bin" "$root/tmp" "$root/records"
chmod 1777 "$root/tmp"
cp /bin/busybox "$root/bin/busybox"
for applet in $(/bin/busybox --list); do
  [[ "$applet" == busybox || -e "$root/bin/$applet" ]] || ln -s busybox "$root/bin/$applet"
done
install -m 0755 "$here/test-image/worker.sh" "$root/worker"
image_archive "$out" "$tag" "$root" '["/bin/sh", "/worker"]'
echo "test-image: $out ($tag)" >&2
