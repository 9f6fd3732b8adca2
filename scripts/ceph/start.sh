#!/bin/bash
# Starts a throw-away single-host Ceph cluster for kura's tests and benches: one monitor, one
# manager and three OSDs, all on 127.0.0.1 with cephx, no systemd, every file under DIR.
# The pool `rbd` gets size 3 / min_size 2, so one OSD may die without losing a write.
#
#   scripts/ceph/start.sh DIR [--owner PID]     # last line of stdout: the path of DIR/ceph.conf
#   scripts/ceph/stop.sh DIR                    # stops what this started, by pid file
#
# --owner PID: a watchdog (its pid in DIR/run/watchdog.pid) runs stop.sh when PID exits, so a
# test process that dies without cleaning up still leaves nothing running.
# Environment: OBJECTSTORE=memstore (default, RAM) or bluestore (sparse files in DIR);
# OSD_BYTES (per OSD, default 2 GiB); OSDS (default 3); PG_NUM (default 32).
# Progress goes to stderr with seconds since start; the whole log is DIR/start.log.
set -euo pipefail

usage() { echo "usage: $0 DIR [--owner PID]" >&2; exit 2; }
[ $# -ge 1 ] || usage
DIR=$1; shift
OWNER=
while [ $# -gt 0 ]; do
  case $1 in
    --owner) OWNER=${2:-}; [ -n "$OWNER" ] || usage; shift 2 ;;
    *) usage ;;
  esac
done
HERE=$(cd "$(dirname "$0")" && pwd)
OBJECTSTORE=${OBJECTSTORE:-memstore}
OSD_BYTES=${OSD_BYTES:-$((2 << 30))}
OSDS=${OSDS:-3}
PG_NUM=${PG_NUM:-32}
for tool in ceph-mon ceph-mgr ceph-osd ceph ceph-authtool monmaptool rbd; do
  command -v "$tool" >/dev/null || { echo "$tool not found: apt-get install ceph-mon ceph-mgr ceph-osd ceph-common" >&2; exit 3; }
done
if [ -e "$DIR" ] && [ -n "$(ls -A "$DIR" 2>/dev/null)" ]; then
  echo "$DIR exists and is not empty; stop.sh it or pick another directory" >&2; exit 1
fi
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
mkdir -p "$DIR"/{run,log,mon,mgr,osd,crash}
exec 3>&2 2>>"$DIR/start.log"
t0=$(date +%s.%N)
say() { local t; t=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}'); echo "[$t s] $*" >&3; echo "[$t s] $*" >&2; }
fail() { say "FAILED: $*"; "$HERE/stop.sh" "$DIR" --keep >&2 || true; exit 1; }

# Two free TCP ports on 127.0.0.1 for the monitor (v2 and v1), picked at random so that several
# clusters (parallel test binaries) never collide. They come from below the kernel's ephemeral
# range (ip_local_port_range, 32768 up by default), where no outgoing connection can be holding
# one between the check and ceph-mon's bind (that made ceph-mon fail to start once in CI), and a
# port in any state, not only listening, counts as taken.
EPHEMERAL_LOW=$(awk '{print $1}' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
[ "$EPHEMERAL_LOW" -gt 20100 ] 2>/dev/null || EPHEMERAL_LOW=32768
port_in_use() { ss -Hatn "( sport = :$1 or dport = :$1 )" 2>/dev/null | grep -q .; }
pick_port() {
  local p
  for _ in $(seq 1 50); do
    p=$((20000 + RANDOM % (EPHEMERAL_LOW - 20000)))
    port_in_use "$p" || { echo "$p"; return; }
  done
  fail "no free port found"
}
V2=$(pick_port); V1=$(pick_port); [ "$V1" != "$V2" ] || V1=$((V2 + 1))

CONF=$DIR/ceph.conf
FSID=$(cat /proc/sys/kernel/random/uuid)
cat >"$CONF" <<CONF
[global]
fsid = $FSID
mon initial members = a
mon host = [v2:127.0.0.1:$V2,v1:127.0.0.1:$V1]
public addr = 127.0.0.1
public network = 127.0.0.1/32
cluster network = 127.0.0.1/32
ms bind ipv4 = true
ms bind ipv6 = false
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
auth allow insecure global id reclaim = false
run dir = $DIR/run
pid file = $DIR/run/\$name.pid
admin socket = $DIR/run/\$name.asok
log file = $DIR/log/\$name.log
crash dir = $DIR/crash
osd pool default size = 3
osd pool default min size = 2
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon allow pool delete = true
mon data avail warn = 2
mon data avail crit = 1
mon osd down out interval = 600

[client]
keyring = $DIR/keyring
# Many clients run at once (tests, benches): no admin socket to fight over.
admin socket =

[mon]
mon data = $DIR/mon/\$cluster-\$id
keyring = \$mon_data/keyring
mon cluster log file = $DIR/log/cluster.log

[mgr]
mgr data = $DIR/mgr/\$cluster-\$id
keyring = \$mgr_data/keyring
mgr initial modules = iostat

[osd]
osd data = $DIR/osd/\$cluster-\$id
keyring = \$osd_data/keyring
osd objectstore = $OBJECTSTORE
memstore device bytes = $OSD_BYTES
bluestore block path = $DIR/osd/\$cluster-\$id.block
bluestore block create = true
bluestore block size = $OSD_BYTES
bluestore block db create = false
bluestore block wal create = false
bluestore fsck on mount = false
osd memory target = 939524096
osd max object name len = 460
osd max object namespace len = 64
CONF
say "config $CONF (mon v2 $V2, v1 $V1, $OSDS $OBJECTSTORE OSDs)"

if [ -n "$OWNER" ]; then
  # setsid: the watchdog outlives the owner's process group being killed.
  setsid bash -c 'while kill -0 "$1" 2>/dev/null; do sleep 1; done; exec "$2/stop.sh" "$3"' \
    watchdog "$OWNER" "$HERE" "$DIR" </dev/null >>"$DIR/log/watchdog.log" 2>&1 3>&- &
  echo $! >"$DIR/run/watchdog.pid"
fi

ceph-authtool --create-keyring "$DIR/mon.keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
ceph-authtool --create-keyring "$DIR/keyring" --gen-key -n client.admin \
  --cap mon 'allow *' --cap osd 'allow *' --cap mds 'allow *' --cap mgr 'allow *' >/dev/null
ceph-authtool "$DIR/mon.keyring" --import-keyring "$DIR/keyring" >/dev/null
monmaptool --create --fsid "$FSID" --addv a "[v2:127.0.0.1:$V2,v1:127.0.0.1:$V1]" "$DIR/monmap" >/dev/null
ceph-mon -c "$CONF" --mkfs -i a --monmap "$DIR/monmap" --keyring "$DIR/mon.keyring" || fail "ceph-mon --mkfs"
# Daemons get none of this script's output descriptors: a caller reading them to EOF must not
# wait for the daemons' lifetime.
ceph-mon -c "$CONF" -i a </dev/null >>"$DIR/log/daemons.out" 2>&1 3>&- || fail "ceph-mon"
c() { ceph -c "$CONF" --connect-timeout 10 "$@"; }
timeout 60 bash -c "until ceph -c '$CONF' --connect-timeout 2 mon stat >/dev/null 2>&1; do sleep 0.2; done" \
  || fail "the monitor did not answer within 60 s (see $DIR/log/mon.a.log)"
say "monitor up"

mkdir -p "$DIR/mgr/ceph-x"
c auth get-or-create mgr.x mon 'allow profile mgr' osd 'allow *' mds 'allow *' -o "$DIR/mgr/ceph-x/keyring" \
  || fail "mgr key"
ceph-mgr -c "$CONF" -i x </dev/null >>"$DIR/log/daemons.out" 2>&1 3>&- || fail "ceph-mgr"

# The OSDs are created and started in parallel: mkfs dominates.
make_osd() {
  local uuid id data
  uuid=$(cat /proc/sys/kernel/random/uuid)
  id=$(c osd new "$uuid") || return 1
  data=$DIR/osd/ceph-$id
  mkdir -p "$data"
  c auth get-or-create "osd.$id" mon 'allow profile osd' mgr 'allow profile osd' osd 'allow *' \
    -o "$data/keyring" || return 1
  ceph-osd -c "$CONF" -i "$id" --mkfs --osd-uuid "$uuid" >"$DIR/log/osd.$id-mkfs.log" 2>&1 || return 1
  ceph-osd -c "$CONF" -i "$id" </dev/null >>"$DIR/log/daemons.out" 2>&1 3>&-
}
pids=()
for _ in $(seq 1 "$OSDS"); do make_osd & pids+=($!); done
for p in "${pids[@]}"; do wait "$p" || fail "an OSD did not start (see $DIR/log/osd.*)"; done
say "$OSDS OSDs started"
timeout 120 bash -c "until ceph -c '$CONF' osd stat 2>/dev/null | grep -q '$OSDS up.*$OSDS in'; do sleep 0.3; done" \
  || fail "the OSDs did not come up within 120 s"
say "OSDs up and in"

c osd pool create rbd "$PG_NUM" "$PG_NUM" replicated >/dev/null || fail "pool create"
c osd pool set rbd size 3 >/dev/null && c osd pool set rbd min_size 2 >/dev/null || fail "pool size"
rbd -c "$CONF" pool init rbd || fail "rbd pool init"
timeout 120 bash -c "until ceph -c '$CONF' pg stat 2>/dev/null | grep -qE '^([0-9]+) pgs: \\1 active\+clean;'; do sleep 0.3; done" \
  || fail "PGs not active+clean within 120 s: $(c pg stat)"
say "pool rbd (size 3, min_size 2, $PG_NUM PGs): every PG active+clean"
timeout 60 bash -c "until ceph -c '$CONF' health 2>/dev/null | grep -q HEALTH_OK; do sleep 0.5; done" \
  || fail "not HEALTH_OK within 60 s: $(c health detail)"
say "HEALTH_OK"
echo "$CONF"
