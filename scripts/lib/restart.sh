# shellcheck shell=bash
# shellcheck disable=SC2154 # ready_timeout: set by scripts/control-plane.sh, which sources this
# Restarts of a running control plane's components (scripts/control-plane.sh
# `restart-controller-manager` and `restart-apiserver`; sourced by it): each started again with
# the command line `up` recorded (DIR/NAME.cmd, NUL-separated).
#
# Needs: variable ready_timeout; functions die, start, alive, stop_pid (scripts/lib/supervise.sh);
#   curl; DIR/pki, DIR/kube-apiserver.address.
# Provides: restart_controller_manager DIR [ARG...], restart_apiserver DIR.

# Stops DIR's kube-controller-manager (by its PID) and starts it again with the command line of
# `up` and ARGs after it; ready when it has run for 2 s.
restart_controller_manager() {
  local dir="$1"
  shift
  [[ -f "$dir/kube-controller-manager.cmd" && -f "$dir/kube-controller-manager.pid" ]] ||
    die "$dir: no kube-controller-manager of $0 up"
  stop_pid "$(cat "$dir/kube-controller-manager.pid")"
  local kcm=()
  mapfile -d '' -t kcm <"$dir/kube-controller-manager.cmd"
  start "$dir" kube-controller-manager "${kcm[@]}" "$@"
  sleep 2
  alive "$dir" kube-controller-manager || {
    tail -n 40 "$dir/kube-controller-manager.log" >&2 || true
    die "kube-controller-manager exited after its restart"
  }
  echo "control-plane: kube-controller-manager started again${*:+ with $*}" >&2
}

# Stops DIR's kube-apiserver at once (SIGKILL, as a crashed or rebooted control-plane machine)
# and starts it again with the command line of `up` (etcd keeps the state); ready when /readyz
# answers.
restart_apiserver() {
  local dir="$1"
  [[ -f "$dir/kube-apiserver.cmd" && -f "$dir/kube-apiserver.pid" ]] ||
    die "$dir: no kube-apiserver of $0 up"
  local pid host port
  pid="$(cat "$dir/kube-apiserver.pid")"
  { read -r host; read -r port; } <"$dir/kube-apiserver.address"
  kill -KILL "$pid" 2>/dev/null || true
  for _ in $(seq 1 100); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  local apiserver=()
  mapfile -d '' -t apiserver <"$dir/kube-apiserver.cmd"
  # The log of the previous run is kept beside.
  mv -f "$dir/kube-apiserver.log" "$dir/kube-apiserver.log.1" 2>/dev/null || true
  start "$dir" kube-apiserver "${apiserver[@]}"
  local pki="$dir/pki" deadline=$((SECONDS + ready_timeout))
  until curl -sf --max-time 5 --cacert "$pki/ca.crt" --cert "$pki/admin.crt" --key "$pki/admin.key" \
    "https://$host:$port/readyz" >/dev/null 2>&1; do
    alive "$dir" kube-apiserver || { tail -n 40 "$dir/kube-apiserver.log" >&2; die "kube-apiserver exited after its restart"; }
    ((SECONDS < deadline)) || die "kube-apiserver not ready within ${ready_timeout}s of its restart"
    sleep 0.2
  done
  echo "control-plane: kube-apiserver started again" >&2
}
