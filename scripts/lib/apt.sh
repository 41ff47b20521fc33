# shellcheck shell=bash
# apt_get ARGS...: apt-get with DEBIAN_FRONTEND=noninteractive, one at a time among this
# repository's scripts: .ci/run runs scripts/check-image.sh and scripts/control-plane.sh's node
# build side by side, and a second apt-get fails at once on dpkg's lock. A flock on a file in
# /run/lock (else TMPDIR), waited for up to 15 minutes. Sourced.
#
# Needs: apt-get, flock.
# Provides: apt_get ARGS...
apt_get() {
  local lock_dir=/run/lock
  [[ -d "$lock_dir" && -w "$lock_dir" ]] || lock_dir="${TMPDIR:-/tmp}"
  DEBIAN_FRONTEND=noninteractive flock -w 900 "$lock_dir/jobset-inplace-apt.lock" apt-get "$@"
}
