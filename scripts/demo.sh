#!/usr/bin/env bash
# A group restart on a real node, for a newcomer to watch (README "See it"): brings up the test
# kit's real control plane and node with the product installed (`scripts/control-plane.sh up DIR
# --node --install epoch`), runs a JobSet of 3 workers (the test image of scripts/test-image.sh),
# makes one worker exit with code 42 and shows the group restart as `jobset-inplace status -w`
# sees it: every pod restarted in place (same pods, restarts +1), the epoch one up. Then it cleans
# up everything it started (`control-plane.sh down`), also on Ctrl-C or failure.
#
# Usage: scripts/demo.sh [--keep]
#   --keep   leave the control plane running at the end and print how to use and remove it
#
# Needs what `control-plane.sh up --node` needs (root, go, gcc, kubectl, ...; its header). The
# first run builds the control plane and the node and the product's image (scripts/check-image.sh
# for this machine's architecture), the two at once (the image in the background, at most an
# hour, stopped by its PID if the demo ends first; the product installed once both are there):
# 21 minutes cold on 2 cores when they ran one after the other, seconds when cached. What it
# installs on the host when missing (apt-get): containerd, runc, iptables, conntrack, Debian's CNI
# plugins (README.md says so).
set -Eeuo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
keep=0
[[ "${1:-}" == "--keep" ]] && keep=1

dir="$(mktemp -d "${TMPDIR:-/tmp}/jobset-inplace-demo.XXXXXX")"
records="$dir/records"
watcher=""
image_pid=""

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

cleanup() {
  local rc=$?
  [[ -n "$watcher" ]] && kill "$watcher" 2>/dev/null && wait "$watcher" 2>/dev/null
  # The image build, if still running: its whole process group (setsid below), by its PID.
  if [[ -n "$image_pid" ]] && kill -0 "$image_pid" 2>/dev/null; then
    kill -TERM -- "-$image_pid" 2>/dev/null || true
    wait "$image_pid" 2>/dev/null || true
  fi
  if [[ $keep == 1 && $rc == 0 ]]; then
    say "left running: export KUBECONFIG=$dir/kubeconfig; remove it with: scripts/control-plane.sh down $dir"
    return
  fi
  say "cleaning up (scripts/control-plane.sh down $dir)"
  "$repo/scripts/control-plane.sh" down "$dir" >/dev/null 2>&1 || true
  rm -rf "$dir"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

arch="$(dpkg --print-architecture 2>/dev/null || echo amd64)"
if [[ ! -x "$repo/target/check-image/rootfs-$arch/jobset-inplace" ]]; then
  say "the product's image (scripts/check-image.sh, $arch) builds in the background (log: $dir/check-image.log)"
  setsid env ARCHES="$arch" "$repo/scripts/check-image.sh" --no-lint >"$dir/check-image.log" 2>&1 </dev/null &
  image_pid=$!
fi
say "control plane and a real node (kubelet v1.35, containerd, runc)"
"$repo/scripts/control-plane.sh" up "$dir" --node
if [[ -n "$image_pid" ]]; then
  say "waiting for the image build (at most an hour; log: $dir/check-image.log)"
  deadline=$((SECONDS + 3600))
  while kill -0 "$image_pid" 2>/dev/null; do
    ((SECONDS < deadline)) || { echo "demo: the image build took over an hour" >&2; exit 1; }
    sleep 2
  done
  wait "$image_pid" || { tail -n 30 "$dir/check-image.log" >&2; echo "demo: scripts/check-image.sh failed" >&2; exit 1; }
  image_pid=""
fi
say "jobset-inplace (epoch variant) installed on the node"
"$repo/scripts/control-plane.sh" install "$dir" epoch
export KUBECONFIG="$dir/kubeconfig"
bin="$repo/target/check-image/rootfs-$arch/jobset-inplace"
[[ -x "$bin" ]] || bin="$(command -v jobset-inplace)" || {
  echo "demo: no jobset-inplace binary" >&2
  exit 1
}

say "the workers' image (scripts/test-image.sh), loaded into the node"
"$repo/scripts/test-image.sh" "$dir/test-image.tar" localhost/jobset-inplace/test-worker:1 >/dev/null
"$repo/scripts/control-plane.sh" load-image "$dir" "$dir/test-image.tar" >/dev/null

mkdir -p "$records"
kubectl create namespace demo >/dev/null
say "a plain JobSet of 3 workers with InPlaceRestart: the webhook injects the agent"
kubectl -n demo create -f - <<EOF
apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata:
  name: train
spec:
  failurePolicy:
    maxRestarts: 10
    restartStrategy: InPlaceRestart
  replicatedJobs:
  - name: workers
    replicas: 1
    template:
      spec:
        parallelism: 3
        completions: 3
        backoffLimit: 2147483647
        podReplacementPolicy: Failed
        template:
          spec:
            restartPolicy: Never
            tolerations:
            - {key: jobset-inplace.dev/real-node, operator: Exists, effect: NoSchedule}
            containers:
            - name: worker
              image: localhost/jobset-inplace/test-worker:1
              imagePullPolicy: Never
              restartPolicy: Never
              restartPolicyRules:
              - action: RestartAllContainers
                exitCodes: {operator: NotIn, values: [0]}
              env:
              - {name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}
              - {name: CONTAINER_NAME, value: worker}
              - {name: RECORDS, value: /records}
              volumeMounts:
              - {name: records, mountPath: /records}
            volumes:
            - name: records
              hostPath: {path: $records, type: Directory}
EOF
kubectl -n demo get jobset train -o jsonpath='{range .spec.replicatedJobs[0].template.spec.template.spec.initContainers[*]}injected: {.name} ({.image}){"\n"}{end}'

say "waiting for the 3 workers to run"
for _ in $(seq 1 150); do
  running=$(kubectl -n demo get pods -l jobset.sigs.k8s.io/jobset-name=train \
    -o jsonpath='{range .items[*]}{.status.containerStatuses[?(@.name=="worker")].state.running.startedAt}{"\n"}{end}' |
    grep -c . || true)
  [[ "$running" == 3 ]] && break
  sleep 1
done
[[ "$running" == 3 ]] || {
  kubectl -n demo get pods -o wide
  echo "demo: the workers did not start within 150 s" >&2
  exit 1
}
kubectl -n demo get pods -o wide

say "jobset-inplace status -w (below), then worker 0 exits with code 42"
"$bin" status -n demo train -w &
watcher=$!
sleep 4
pod=$(kubectl -n demo get pods -l jobset.sigs.k8s.io/jobset-name=train -o jsonpath='{.items[0].metadata.name}')
echo 42 >"$records/exit-$pod-worker"
sleep 12
kill "$watcher" 2>/dev/null || true
wait "$watcher" 2>/dev/null || true
watcher=""

say "after the group restart: the same 3 pods, every one restarted in place"
kubectl -n demo get pods -o wide
kubectl -n demo get pods -o jsonpath='{range .items[*]}{.metadata.name} (uid {.metadata.uid}): restarts {.status.initContainerStatuses[0].restartCount} (agent) {.status.containerStatuses[0].restartCount} (worker){"\n"}{end}'
say "what each worker recorded (start/exit/stop, unix ms)"
cat "$records/records"
