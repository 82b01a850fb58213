#!/bin/sh
# PID 1 inside the User-Mode-Linux guest of kernel-oracle.sh (root = the host's / via hostfs).
# oracle_dump and oracle_out come from the kernel command line. Writes the dump onto nandsim as
# ubiformat -f does, attaches it with the kernel's UBI, copies every volume out, mounts the UBIFS
# ones and copies their files out, then powers the guest off.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev 2>/dev/null
O=$oracle_out
exec >"$O/guest.log" 2>&1
set -x
cat /proc/mtd
ubiformat /dev/mtd0 -y -f "$oracle_dump" &&
  ubiattach -m 0 -d 0 &&
  ubinfo -a >"$O/ubinfo.txt" &&
  for v in /sys/class/ubi/ubi0/ubi0_*; do
    n=$(cat "$v/name")
    dev=/dev/$(basename "$v")
    dd if="$dev" of="$O/vol-$n.bin" bs=128k
    mkdir -p "$O/mnt"
    if mount -t ubifs "ubi0:$n" "$O/mnt"; then
      mkdir -p "$O/files-$n"
      cp -a "$O/mnt/." "$O/files-$n/"
      umount "$O/mnt"
    fi
  done &&
  ubidetach -d 0 &&
  echo done >"$O/status"
dmesg >"$O/dmesg.txt"
echo o >/proc/sysrq-trigger
