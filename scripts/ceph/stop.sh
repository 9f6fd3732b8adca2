#!/bin/bash
# Stops a cluster started by scripts/ceph/start.sh: every daemon by the pid file in DIR/run
# (TERM, then KILL after 10 s), then the watchdog, then removes DIR unless --keep is given.
# Never kills by name, so other clusters on the host are left alone.
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: $0 DIR [--keep]" >&2; exit 2; }
DIR=$1
KEEP=${2:-}
[ -d "$DIR/run" ] || { [ "$KEEP" = --keep ] || rm -rf "$DIR"; exit 0; }
alive() { kill -0 "$1" 2>/dev/null; }
pids=()
for f in "$DIR"/run/osd.*.pid "$DIR"/run/mgr.*.pid "$DIR"/run/mon.*.pid; do
  [ -f "$f" ] || continue
  pid=$(cat "$f")
  # Only a ceph daemon of this cluster: the pid may have been reused since.
  if alive "$pid" && grep -qa -- "$DIR/ceph.conf" "/proc/$pid/cmdline" 2>/dev/null; then
    kill -TERM "$pid" && pids+=("$pid")
  fi
done
for _ in $(seq 1 100); do
  left=()
  for pid in "${pids[@]}"; do alive "$pid" && left+=("$pid"); done
  [ ${#left[@]} -eq 0 ] && break
  sleep 0.1
done
for pid in "${pids[@]}"; do
  if alive "$pid"; then echo "pid $pid did not stop on TERM within 10 s: KILL" >&2; kill -KILL "$pid"; fi
done
if [ -f "$DIR/run/watchdog.pid" ]; then
  w=$(cat "$DIR/run/watchdog.pid")
  # The watchdog runs this script itself when its owner exits: do not kill the caller.
  if [ "$w" != "$PPID" ] && [ "$w" != "$$" ] && alive "$w" && grep -qa watchdog "/proc/$w/cmdline" 2>/dev/null; then
    kill -TERM "$w" 2>/dev/null
  fi
fi
[ "$KEEP" = --keep ] || rm -rf "$DIR"
