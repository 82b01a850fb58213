#!/bin/sh
# Inside the kernel oracle's guest (scripts/kernel-oracle.sh): cryptsetup's *online* LUKS2
# reencryption, the kernel path (the mapping stays active; cryptsetup stacks hotzone and overlay
# devices under it and records the `online-reencrypt-v2` requirement, `-v3` when it exports the
# header), on loop devices over image files in DIR (direct I/O, so what a write completed is in
# the host's file).
#
#   kernel-oracle-reencrypt.sh interrupt MODE DIR KEY OPTIONS SEED...
#       MODE is reencrypt (new volume key), encrypt (header put on the device, data shifted by
#       --reduce-device-size 4M), decrypt (detached header) or decrypt-exported (header on the
#       device, exported to the file /hdr of the ext4 image BASE.fs, the data moved to the
#       start). DIR holds run-0 ... run-N (N the number of SEEDs), each an `.img` (and an `.hdr`
#       for decrypt, an `.fs` for decrypt-exported): copies of the same volume.
#       Run 0 goes to its end, its writes counted (TOTAL); run I is killed by strace on entry to
#       its write 1 + SEED_I % TOTAL. Then the guest's power is cut (sysrq b: no sync, no
#       teardown, the guest's page cache lost), so run-I.* hold what a crash at that write
#       leaves on the disk. Prints "total TOTAL" and "run I killed at write W" lines.
#   kernel-oracle-reencrypt.sh resume DIR KEY NAME:MODE...
#       DIR/NAME.img (its header DIR/NAME.hdr if that exists) is opened by cryptsetup and the
#       MODE conversion recorded there finished online (`reencrypt --resume-only` on the active
#       device); what the mapping then reads (the device, once a decryption has removed the
#       mapping) is copied to DIR/NAME.out.
#
# OPTIONS: more `cryptsetup reencrypt` options, one word each (e.g. "--resilience journal").
set -u
export DM_DISABLE_UDEV=1
modprobe loop && modprobe dm-crypt || exit 20
fast="--pbkdf pbkdf2 --pbkdf-force-iterations 1000"
# A reencryption that shifts the data writes a temporary header file in the working folder:
# the guest's tmpfs, not the share.
cd /run || exit 20

# attach FILE: a loop device over FILE with direct I/O (no page cache of the loop device's own).
attach() {
  losetup -f --show --direct-io=on "$1" || exit 21
}

# prepare MODE BASE NAME: sets dev to a loop device over BASE.img and header to the option
# naming a loop device over BASE.hdr (none without one: cryptsetup does not read a detached
# header file over 9p), activates what the mode needs first, and sets cmd to the cryptsetup
# command that then runs online.
prepare() {
  dev=$(attach "$2.img")
  header=
  if [ -f "$2.hdr" ]; then header="--header $(attach "$2.hdr")"; fi
  case $1 in
    reencrypt | decrypt*) cryptsetup open -q --key-file "$key" $header "$dev" "$3" || exit 22 ;;
  esac
  case $1 in
    reencrypt) cmd="cryptsetup reencrypt -q $fast --key-file $key --hotzone-size 512K $options $dev" ;;
    encrypt) cmd="cryptsetup reencrypt -q --encrypt --type luks2 --reduce-device-size 4M $fast --key-file $key $options $dev $3" ;;
    decrypt) cmd="cryptsetup reencrypt -q --decrypt $header --key-file $key --hotzone-size 512K $options $dev" ;;
    decrypt-exported)
      # The exported header must outlive the power cut: on BASE.fs (ext4), mounted synchronously.
      mkdir -p "/mnt/$3" && mount -o sync "$(attach "$2.fs")" "/mnt/$3" || exit 22
      cmd="cryptsetup reencrypt -q --decrypt --header /mnt/$3/hdr --key-file $key --hotzone-size 512K $options $dev"
      ;;
    *) echo "unknown mode $1" >&2; exit 2 ;;
  esac
}

interrupt() {
  mode=$1 dir=$2 key=$3 options=$4
  shift 4
  prepare "$mode" "$dir/run-0" vol0
  strace -f -qq -o /run/writes.log -e trace=write $cmd || { echo "run 0 failed: $cmd"; exit 23; }
  # The writes of the main thread (strace's kill counts per thread); lines read "PID write(...".
  total=$(awk 'NR == 1 { main = $1 } $1 == main && $2 ~ /^write\(/' /run/writes.log | wc -l)
  echo "total $total"
  [ "$total" -gt 0 ] || exit 24
  i=0
  for seed in "$@"; do
    i=$((i + 1))
    at=$((1 + seed % total))
    prepare "$mode" "$dir/run-$i" "vol$i"
    status=0
    strace -f -qq -o /dev/null -e trace=write -e inject=write:signal=SIGKILL:when=$at $cmd || status=$?
    # 137: strace passes on its tracee's death by SIGKILL.
    if [ "$status" -eq 137 ]; then echo "run $i killed at write $at"; else echo "run $i not killed at write $at: status $status"; fi
    # The killed run's devices stay as they are (suspended hotzone and all), as at a crash.
  done
  # The power cut: the status first (kernel-oracle.sh reports it), then reboot without syncing.
  echo 0 >"$ORACLE_STATUS_FILE"
  echo b >/proc/sysrq-trigger
  sleep 60
}

resume() {
  dir=$1 key=$2
  shift 2
  i=0
  for job in "$@"; do
    i=$((i + 1))
    name=${job%%:*} mode=${job#*:}
    base="$dir/$name"
    dev=$(attach "$base.img")
    header= header_dev=$dev
    if [ -f "$base.hdr" ]; then
      header_dev=$(attach "$base.hdr")
      header="--header $header_dev"
    fi
    cryptsetup open -q --key-file "$key" $header "$dev" "res$i" || { echo "$name: open failed"; continue; }
    # Opening runs the crash recovery, which may be the end (a crash in the last hotzone).
    if ! cryptsetup luksDump "$header_dev" | grep -q "^Requirements:.*online-reencrypt"; then
      echo "$name: finished by open ($mode)"
    elif cryptsetup reencrypt -q --resume-only --key-file "$key" $header "$dev"; then
      echo "$name: resumed ($mode)"
    else
      echo "$name: resume failed ($mode)"
    fi
    if [ -e "/dev/mapper/res$i" ]; then
      cat "/dev/mapper/res$i" >"$base.out" || echo "$name: reading the mapping failed"
      cryptsetup close "res$i" || echo "$name: close failed"
    else
      # A finished online decryption removes the mapping: the device itself is the plain data.
      cat "$dev" >"$base.out" || echo "$name: reading the device failed"
    fi
    losetup -D
  done
}

case "${1:-}" in
  interrupt) shift; interrupt "$@" ;;
  resume) shift; resume "$@" ;;
  *) echo "usage: kernel-oracle-reencrypt.sh interrupt MODE DIR KEY OPTIONS SEED... | resume DIR KEY NAME:MODE..." >&2; exit 2 ;;
esac
