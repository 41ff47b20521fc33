# shellcheck shell=bash
# shellcheck disable=SC2154 # ready_timeout: set by scripts/control-plane.sh, which sources this
# Process supervision for scripts/control-plane.sh (sourced by it): free ports, components
# started in the background each in its own session (DIR/NAME.pid, DIR/NAME.log), readiness
# waits that fail `up` with the component's log, and stopping everything `up` started.
#
# Needs: variable ready_timeout; functions die, node_down (scripts/lib/node-down.sh); ss, curl,
#   setsid.
# Provides: free_port, start DIR NAME COMMAND..., alive DIR NAME, fail DIR NAME WHY,
#   wait_for DIR NAME CURL-ARGS..., stop_pid PID, stop_all DIR (sets nodes_left=1 when the nodes'
#   remains could not all be removed).

# A TCP port nothing listens on now, below the kernel's ephemeral range (where outgoing
# connections would take it between this check and the component's bind).
free_port() {
  local port low=32768
  if [[ -r /proc/sys/net/ipv4/ip_local_port_range ]]; then
    read -r low _ </proc/sys/net/ipv4/ip_local_port_range
  fi
  ((low > 11000)) || die "the ephemeral port range starts at $low; no room below it"
  for _ in $(seq 1 200); do
    port=$((10000 + RANDOM % (low - 10000)))
    if ! ss -Htln "sport = :$port" | grep -q .; then
      echo "$port"
      return
    fi
  done
  die "no free port found"
}

# Starts NAME in the background in its own session, logging to DIR/NAME.log, PID in DIR/NAME.pid.
start() {
  local dir="$1" name="$2"
  shift 2
  setsid "$@" >"$dir/$name.log" 2>&1 </dev/null &
  echo $! >"$dir/$name.pid"
}

alive() {
  local pid
  pid="$(cat "$1/$2.pid")"
  kill -0 "$pid" 2>/dev/null
}

# Fails `up` with the component's log tail, after stopping what was started.
fail() {
  local dir="$1" name="$2" why="$3"
  echo "control-plane: $name $why; last lines of $dir/$name.log:" >&2
  tail -n 40 "$dir/$name.log" >&2 || true
  stop_all "$dir"
  die "$name $why (logs left in $dir)"
}

# Waits until `curl ARGS` succeeds or NAME dies or the timeout passes.
wait_for() {
  local dir="$1" name="$2"
  shift 2
  local deadline=$((SECONDS + ready_timeout))
  until curl -sf --max-time 5 "$@" >/dev/null 2>&1; do
    alive "$dir" "$name" || fail "$dir" "$name" "exited"
    ((SECONDS < deadline)) || fail "$dir" "$name" "not ready within ${ready_timeout}s"
    sleep 0.5
  done
}

# Stops PID if it runs: SIGTERM, then SIGKILL after 10 s.
stop_pid() {
  local pid="$1"
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
  fi
}

# Stops what `up DIR` started: the nodes, then the components in reverse start order.
stop_all() {
  local dir="$1" name
  # The nodes first (they delete their pods through the API server while that still runs).
  if [[ -f "$dir/nodes.state" ]]; then
    # shellcheck disable=SC2034 # read by scripts/control-plane.sh's down
    node_down "$dir" || nodes_left=1
  fi
  # Reverse start order: the controller manager, the API server, then etcd.
  for name in registry trainer kueue kube-scheduler jobset kube-controller-manager kube-apiserver etcd; do
    [[ -f "$dir/$name.pid" ]] || continue
    stop_pid "$(cat "$dir/$name.pid")"
    rm -f "$dir/$name.pid"
  done
}
