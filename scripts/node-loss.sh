#!/usr/bin/env bash
# The node-loss measurements of docs/benchmarks.md ("A node lost, as a cluster runs it"), in one
# command: tests/real_node/node_loss.rs's `#[ignore]` measurements, each cluster fresh.
#
#   scripts/node-loss.sh
#
# Two clusters, one after the other, each `scripts/control-plane.sh up DIR --nodes 3 --node-grace
# default --install epoch` (kube-controller-manager's and the kubelets' own node periods, taint
# eviction on; env PRODUCT_IMAGE_ARCHIVE passes through to `up`):
#   1. the matrix's worker-exit and eviction rows in place, then JobSet's own recreation of the
#      same (`MATRIX row=recreation-...`), side by side from one cluster; then
#      one node killed under three JobSets of 2: in place with the default group-restart
#      deadline, in place with it at 20 s, and JobSet's own `Recreate`, the reconciler in
#      `--node-lost force-after-grace` at 30 s (`--node-lost-grace 30s`: its default before
#      `--node-lost`; the fenced default waits for an operator's fence, which nobody sets here);
#   2. the reconciler's node-lost part off (`--node-lost-grace 0`): the node controller alone,
#      one JobSet in place.
# Prints the `MATRIX` and `NODE_LOSS {json}` lines on stdout (the tests' whole output on stderr),
# and stops and removes each cluster, however it ends. About 25 minutes on 2 cores.
set -Eeuo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/.." && pwd)"
[[ $# -eq 0 ]] || { sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

dir=""
report="$(mktemp "${TMPDIR:-/tmp}/jobset-inplace-node-loss.XXXXXX")"
# shellcheck disable=SC2317 # run by the EXIT trap
cleanup() {
  local rc=$?
  if [[ -n "$dir" && -f "$dir/.jobset-inplace-control-plane" ]]; then
    "$here/control-plane.sh" down "$dir" || rc=1
  fi
  rm -f "$report"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

cd "$repo"
cargo test --locked --test real_node --no-run >&2

# cluster ENV=VALUE... -- TEST...: a fresh cluster, the tests under ENV, `down`.
cluster() {
  local envs=() t
  while [[ "$1" != -- ]]; do envs+=("$1"); shift; done
  shift
  dir="$(mktemp -d "${TMPDIR:-/tmp}/jobset-inplace-node-loss.XXXXXX")"
  "$here/control-plane.sh" up "$dir" --nodes 3 --node-grace default --install epoch
  for t in "$@"; do
    env "${envs[@]}" JOBSET_INPLACE_KUBECONFIG="$dir/kubeconfig" JOBSET_INPLACE_REAL_NODE=required \
      cargo test --locked --test real_node -- --include-ignored --nocapture --exact "$t" 2>&1 |
      tee -a "$report" >&2
  done
  "$here/control-plane.sh" down "$dir"
  dir=""
}

cluster JOBSET_INPLACE_NODE_LOST_GRACE=30s -- matrix::the_matrix_a_worker_exits_non_zero_across_nodes matrix::the_matrix_a_pod_evicted \
  node_loss::measure_recreation_beside_the_matrix node_loss::measure_a_node_lost
cluster JOBSET_INPLACE_NODE_LOST_GRACE=0 JOBSET_INPLACE_NODE_LOSS_CASES=in-place -- node_loss::measure_a_node_lost
grep -E '^(MATRIX|MATRIX_TIMELINE|RECREATION|NODE_LOSS) ' "$report" || { echo "node-loss: no result line" >&2; exit 1; }
! grep -E '^test .* FAILED|panicked' "$report" >&2 || { echo "node-loss: a measurement failed (above)" >&2; exit 1; }
