#!/bin/sh
# The test image's worker (scripts/test-image.sh): records every start into a volume, then runs
# until told to exit with a code, or until stopped.
#
#   RECORDS         directory to record into (a volume; default /records): one line per event
#                   appended to RECORDS/records, `EVENT ms=<unix ms> pod=<POD_NAME>
#                   container=<CONTAINER_NAME> epoch=<EPOCH> [more key=value]`
#   POD_NAME, CONTAINER_NAME, EPOCH   what the records name (the downward API gives them)
#   SCRATCH         optional directory (an emptyDir): starts are counted there too, and the count
#                   seen at start is recorded (seen=N): it shows the volume survived a restart
#   EXIT_AFTER      optional: exit by itself after this many seconds, with EXIT_CODE (default 0)
#
# Told to exit: a file RECORDS/exit-<POD_NAME>-<CONTAINER_NAME> holding the exit code (read and
# removed). SIGTERM: records `stop` and exits 143.
set -u
records="${RECORDS:-/records}"
pod="${POD_NAME:-unknown}"
container="${CONTAINER_NAME:-unknown}"
exit_file="$records/exit-$pod-$container"

# The wall clock in ms, once (touch + stat: two processes): the boot time, so that each record
# below reads the time without starting a process (a SIGTERM's `stop` must be written within the
# kubelet's 2 s grace however loaded the machine is).
wall_ms() {
  touch /tmp/.now
  # "SECONDS YYYY-MM-DD hh:mm:ss.NNNNNNNNN +0000": whole seconds and the fraction of one stamp.
  # shellcheck disable=SC2046 # split on purpose
  set -- $(stat -c '%Y %y' /tmp/.now)
  frac="${3#*.}"
  echo "$1${frac%??????}"
}

# Sets `ms` from /proc/uptime (a shell builtin read, 10 ms resolution) and the boot time.
now_ms() {
  read -r up _ </proc/uptime
  cs="${up#*.}"
  cs="${cs#0}"
  ms=$((boot_ms + ${up%.*} * 1000 + cs * 10))
}

read -r up _ </proc/uptime
cs="${up#*.}"
cs="${cs#0}"
boot_ms=$(($(wall_ms) - ${up%.*} * 1000 - cs * 10))

record() {
  event="$1"
  shift
  now_ms
  echo "$event ms=$ms pod=$pod container=$container epoch=${EPOCH:-} $*" >>"$records/records"
}

seen=0
if [ -n "${SCRATCH:-}" ]; then
  [ -f "$SCRATCH/starts" ] && seen=$(wc -l <"$SCRATCH/starts")
  echo start >>"$SCRATCH/starts"
fi
trap 'record stop signal=TERM; exit 143' TERM
trap 'record stop signal=INT; exit 130' INT
record start "seen=$seen"

started=$(date +%s)
while :; do
  if [ -f "$exit_file" ]; then
    code=$(cat "$exit_file")
    rm -f "$exit_file"
    record exit "code=$code"
    exit "$code"
  fi
  if [ -n "${EXIT_AFTER:-}" ] && [ $(($(date +%s) - started)) -ge "$EXIT_AFTER" ]; then
    record exit "code=${EXIT_CODE:-0}"
    exit "${EXIT_CODE:-0}"
  fi
  # In the background, so that a signal is handled at once.
  sleep 0.1 &
  wait $!
done
