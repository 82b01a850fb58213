#!/bin/sh
# PID 1 inside the guest of kernel-oracle.sh: its root is the host's / under a tmpfs overlay
# (writes stay in the guest), $oracle_work is the host's WORK, writable. Runs the command that
# kernel-oracle.sh wrote to WORK/kernel-oracle/command (one argument per line) as root in WORK,
# records its output and exit status beside it, and powers the guest off (PID 1 must not exit).
# A script that cuts the power itself (sysrq b) writes its status to $ORACLE_STATUS_FILE first.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root
ctl="$oracle_work/kernel-oracle"
set --
while IFS= read -r arg; do set -- "$@" "$arg"; done <"$ctl/command"
echo "kernel-oracle: running $*" >/dev/console
cd "$oracle_work"
export ORACLE_STATUS_FILE="$ctl/status"
status=0
if [ -x "$1" ]; then "$@"; else sh "$@"; fi >"$ctl/output" 2>&1 </dev/null || status=$?
dmesg >"$ctl/dmesg.txt" 2>&1
echo "$status" >"$ctl/status"
sync
echo o >/proc/sysrq-trigger
sleep 60
