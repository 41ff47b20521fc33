#!/usr/bin/env bash
# The scale measurement in one command: a group restart in place, then JobSet's own recreation of
# the same JobSet, on the real control plane, for each size.
#
#   scripts/scale.sh SIZES          e.g. scripts/scale.sh 1000,5000 (else
#                                   JOBSET_INPLACE_REAL_SCALE_SIZES)
#
# Brings up scripts/control-plane.sh's control plane (no --node: the pods run on the test kit's
# in-process node) in a temporary directory, runs tests/real_cluster/measure.rs's
# measure_a_group_restart_on_the_real_api_server (built --release) against it, and stops and
# removes everything it started, however it ends. Per size, in place (the reconciler and the
# agents); then the floor (the same JobSet's pods restarted in place by the node with nothing of
# the product in the loop; JOBSET_INPLACE_REAL_SCALE_SKIP_FLOOR=1 leaves it out); then, unless
# JOBSET_INPLACE_REAL_SCALE_SKIP_RECREATE=1, JobSet's `Recreate` (Job backoffLimit 0, no
# injection) with kube-controller-manager at its default client rate, and
# again with --kube-api-qps 200 --kube-api-burst 300 (JOBSET_INPLACE_REAL_SCALE_TUNED_ARGS).
# The JobSet's group-restart deadline is 10 minutes (JOBSET_INPLACE_REAL_SCALE_GROUP_RESTART_TIMEOUT):
# the product's 2-minute default would recreate pods mid-measurement at 5,000 on 2 cores.
# For each size it prints one line `SCALE_RESULT {json}` (docs/benchmarks.md says what each
# field is); the test's whole report goes to stderr. The other JOBSET_INPLACE_REAL_SCALE_*
# variables of the test pass through (docs/testing.md). JOBSET_INPLACE_SCALE_PROFILE=dev builds
# the test without --release (quick checks at small sizes; figures are taken --release).
set -Eeuo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/.." && pwd)"

usage() {
  sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

sizes="${1:-${JOBSET_INPLACE_REAL_SCALE_SIZES:-}}"
[[ $# -le 1 && -n "$sizes" ]] || usage
[[ "$sizes" =~ ^[0-9]+(,[0-9]+)*$ ]] || usage

dir="$(mktemp -d "${TMPDIR:-/tmp}/jobset-inplace-scale.XXXXXX")"
test_pid=""
# shellcheck disable=SC2317,SC2329 # run by the EXIT trap
cleanup() {
  local rc=$?
  # The test and what it started (its reconcilers): its own process group, by its PID.
  if [[ -n "$test_pid" ]] && kill -0 "$test_pid" 2>/dev/null; then
    kill -TERM -- "-$test_pid" 2>/dev/null || true
    wait "$test_pid" 2>/dev/null || true
  fi
  if [[ -f "$dir/.jobset-inplace-control-plane" ]]; then
    "$here/control-plane.sh" down "$dir" || true
  fi
  rm -rf "$dir"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

"$here/control-plane.sh" up "$dir"

cd "$repo"
# The group-restart deadline through the JobSet's annotation: 2 minutes (the product's default)
# is shorter than a group restart of 5,000 pods on one 2-core machine, and the deadline would
# delete and recreate pods in the middle of the measurement (a run at 5,000 did).
export JOBSET_INPLACE_REAL_SCALE_GROUP_RESTART_TIMEOUT="${JOBSET_INPLACE_REAL_SCALE_GROUP_RESTART_TIMEOUT:-10m}"
profile="${JOBSET_INPLACE_SCALE_PROFILE:-release}"
# The test binary first, so that its build is not in the measurement's time.
cargo test --profile "$profile" --test real_cluster --no-run >&2
JOBSET_INPLACE_KUBECONFIG="$dir/kubeconfig" JOBSET_INPLACE_REAL_SCALE_SIZES="$sizes" \
  setsid cargo test --profile "$profile" --test real_cluster measure_a_group_restart_on_the_real_api_server \
  -- --ignored --nocapture >"$dir/report" </dev/null &
test_pid=$!
rc=0
wait "$test_pid" || rc=$?
test_pid=""
grep -v '^SCALE_RESULT ' "$dir/report" >&2 || true
grep '^SCALE_RESULT ' "$dir/report" || { echo "scale: no SCALE_RESULT line (rc $rc)" >&2; rc=1; }
exit "$rc"
