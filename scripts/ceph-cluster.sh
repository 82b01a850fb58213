#!/usr/bin/env bash
# A throw-away single-node Ceph cluster for the RBD tests (issue 16): one monitor and one OSD on
# loopback, bluestore on a sparse file, everything (configuration, keyrings, stores, logs, admin
# sockets, pid files) in one directory. No systemd, no mgr, no root needed beyond the packages
# (scripts/install-test-deps.sh installs them).
#
#   scripts/ceph-cluster.sh start DIR [PORT]   # prints "export CEPH_CONF=DIR/ceph.conf"
#   scripts/ceph-cluster.sh stop DIR           # stops exactly the daemons it started
#   scripts/ceph-cluster.sh status DIR         # exit 0 if the cluster answers
#   scripts/ceph-cluster.sh osd-kill DIR       # the OSD dies as in a crash (SIGKILL), for fault tests
#   scripts/ceph-cluster.sh osd-start DIR      # ... and comes back (bluestore replays its journal;
#                                              # returns once every placement group answers)
#
# `eval "$(scripts/ceph-cluster.sh start DIR)"` makes every client (ceph, rbd, qemu's rbd driver,
# librbd programs) reach the cluster with nothing else set; the pool `rbd` exists. PORT (default
# 3300) is the monitor's msgr2 port: two clusters side by side need two ports. A start that fails
# stops what it started and keeps DIR's logs. The settings and their reasons are in
# docs/guide/rbd.md.
set -euo pipefail

usage() {
  echo "usage: $0 start DIR [PORT] | stop DIR | status DIR | osd-kill DIR | osd-start DIR" >&2
  exit 1
}

[ $# -ge 2 ] || usage
cmd="$1"
dir="$2"
port="${3:-3300}"

# Stop the daemons whose pid files are in DIR/run (those named NAME, default all), with SIGNAL
# (default TERM), checking that each pid is still that daemon (a recycled pid belongs to someone
# else), then wait for them to exit.
stop_daemons() {
  local run="$1/run" name_glob="${2:-*}" signal="${3:-TERM}" pids=() f pid name
  [ -d "$run" ] || return 0
  for f in "$run"/$name_glob.pid; do
    [ -e "$f" ] || continue
    pid="$(cat "$f")"
    name="$(basename "$f" .pid)"
    if [ -r "/proc/$pid/comm" ] && [[ "$(cat "/proc/$pid/comm")" == ceph-"${name%%.*}"* ]]; then
      kill -"$signal" "$pid" 2>/dev/null && pids+=("$pid")
    fi
    rm -f "$f"
  done
  local waited=0
  for pid in "${pids[@]}"; do
    while kill -0 "$pid" 2>/dev/null; do
      if [ "$waited" -ge 300 ]; then
        kill -KILL "$pid" 2>/dev/null || true
        break
      fi
      sleep 0.1
      waited=$((waited + 1))
    done
  done
}

case "$cmd" in
stop)
  stop_daemons "$dir"
  exit 0
  ;;
osd-kill)
  stop_daemons "$dir" osd.0 KILL
  exit 0
  ;;
osd-start)
  [ -f "$dir/ceph.conf" ] || { echo "ceph-cluster: no cluster in $dir" >&2; exit 4; }
  ceph-osd --conf "$dir/ceph.conf" -i 0 2>>"$dir/log/osd.0.start.log"
  # Back means serving: listing the pool asks every placement group, so it answers once all
  # are active again (booting, replaying and peering take as long as the host is slow; a client
  # with a short timeout must not race them). `ceph pg stat` would need a manager daemon.
  if timeout 120 rados --conf "$dir/ceph.conf" -p rbd ls >/dev/null; then
    exit 0
  fi
  echo "ceph-cluster: the OSD did not bring every placement group back within 120 s" >&2
  exit 1
  ;;
status)
  [ -f "$dir/ceph.conf" ] || exit 1
  exec timeout 20 ceph --conf "$dir/ceph.conf" --connect-timeout 10 health >/dev/null 2>&1
  ;;
start) ;;
*) usage ;;
esac

for tool in ceph-mon ceph-osd ceph ceph-authtool monmaptool rbd uuidgen; do
  command -v "$tool" >/dev/null || {
    echo "ceph-cluster: $tool is not installed (scripts/install-test-deps.sh installs it)" >&2
    exit 4
  }
done
if [ -e "$dir/ceph.conf" ] && timeout 20 ceph --conf "$dir/ceph.conf" --connect-timeout 5 health >/dev/null 2>&1; then
  echo "ceph-cluster: a cluster already runs in $dir" >&2
  exit 5
fi
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"
stop_daemons "$dir"
rm -rf "$dir/mon.a" "$dir/osd.0" "$dir/run" "$dir/log" "$dir"/*.keyring "$dir/monmap" "$dir/ceph.conf"
mkdir -p "$dir/run" "$dir/log" "$dir/osd.0"
# A failed start says why on stderr (the logs' last lines: CI keeps only what tests print).
start_failed() {
  echo "ceph-cluster: start failed; logs in $dir/log" >&2
  tail -n 4 "$dir"/log/*.log >&2 2>/dev/null || true
  stop_daemons "$dir"
}
trap start_failed ERR

fsid="$(uuidgen)"
conf="$dir/ceph.conf"
cat >"$conf" <<EOF
[global]
fsid = $fsid
mon host = v2:127.0.0.1:$port
public addr = 127.0.0.1
cluster addr = 127.0.0.1
ms bind msgr1 = false
run dir = $dir/run
pid file = $dir/run/\$name.pid
log file = $dir/log/\$name.log
keyring = $dir/keyring
mon data = $dir/\$name
osd data = $dir/\$name
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
auth allow insecure global id reclaim = false
osd pool default size = 1
osd pool default min size = 1
osd pool default pg autoscale mode = off
osd pool default pg num = 8
osd crush chooseleaf type = 0
mon allow pool size one = true
mon warn on pool no redundancy = false
# The monitor refuses to start at or below this share of free disk (default 5%): a test host's
# disk is often fuller than that, and the cluster needs only megabytes.
mon data avail crit = 0
[client]
# Clients (rbd, qemu, librbd programs) open no admin socket: several at once would collide.
admin socket =
[mon]
admin socket = $dir/run/\$name.asok
paxos propose interval = 0.1
paxos min wait = 0.01
[osd]
admin socket = $dir/run/\$name.asok
keyring = $dir/\$name/keyring
osd objectstore = bluestore
osd memory target = 1073741824
bluestore block create = true
bluestore block size = 10737418240
EOF
c=(--conf "$conf")

ceph-authtool --create-keyring "$dir/mon.keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
ceph-authtool --create-keyring "$dir/keyring" --gen-key -n client.admin \
  --cap mon 'allow *' --cap osd 'allow *' --cap mgr 'allow *' --cap mds 'allow *' >/dev/null
ceph-authtool "$dir/mon.keyring" --import-keyring "$dir/keyring" >/dev/null
monmaptool --create --fsid "$fsid" --addv a "[v2:127.0.0.1:$port]" "$dir/monmap" >/dev/null
ceph-mon "${c[@]}" -i a --mkfs --monmap "$dir/monmap" --keyring "$dir/mon.keyring"
ceph-mon "${c[@]}" -i a

osd_uuid="$(uuidgen)"
osd_key="$(ceph-authtool --gen-print-key)"
printf '{"cephx_secret": "%s"}' "$osd_key" >"$dir/osd.0/new.json"
osd_id="$(timeout 60 ceph "${c[@]}" osd new "$osd_uuid" -i "$dir/osd.0/new.json")"
rm -f "$dir/osd.0/new.json"
[ "$osd_id" = 0 ] || { echo "ceph-cluster: expected osd.0, got osd.$osd_id" >&2; false; }
ceph-authtool --create-keyring "$dir/osd.0/keyring" -n osd.0 --add-key "$osd_key" >/dev/null
ceph-osd "${c[@]}" -i 0 --mkfs --osd-uuid "$osd_uuid" 2>>"$dir/log/osd.0.mkfs.log"
ceph-osd "${c[@]}" -i 0 2>>"$dir/log/osd.0.start.log"

timeout 120 ceph "${c[@]}" osd pool create rbd 8 8 >/dev/null 2>&1
timeout 120 rbd "${c[@]}" pool init rbd
# Proof of a usable cluster: an image can be made and removed.
timeout 120 rbd "${c[@]}" create --size 16M rbd/ceph-cluster-probe
timeout 120 rbd "${c[@]}" rm --no-progress rbd/ceph-cluster-probe
trap - ERR
echo "export CEPH_CONF=$conf"
