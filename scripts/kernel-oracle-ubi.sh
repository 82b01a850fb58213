#!/bin/sh
# Run inside the kernel oracle (kernel-oracle.sh run DIR WORK kernel-oracle-ubi.sh DUMP OUT):
# writes DUMP (a decrypted flash image, as `sectorcrypt flash export` writes it) onto a 64 MiB
# nandsim (128 KiB eraseblocks, 2 KiB pages, 512-byte sub-pages) as `ubiformat -f` does,
# attaches it with the kernel's UBI, and for each volume NAME writes OUT/vol-NAME.bin (its
# contents through /dev/ubi0_N) and, if it mounts as UBIFS, OUT/files-NAME/ (its files);
# OUT/ubinfo.txt is `ubinfo -a`. Exits non-zero at the first step that fails.
set -eux
dump=$1
out=$2
rm -rf "$out"
mkdir -p "$out"
modprobe nandsim id_bytes=0x20,0xa2,0x00,0x15
modprobe ubi
modprobe ubifs
cat /proc/mtd
ubiformat /dev/mtd0 -y -f "$dump"
ubiattach -m 0 -d 0
ubinfo -a >"$out/ubinfo.txt"
for v in /sys/class/ubi/ubi0/ubi0_*; do
  n=$(cat "$v/name")
  dd if="/dev/$(basename "$v")" of="$out/vol-$n.bin" bs=128k
  mkdir -p /tmp/mnt
  if mount -t ubifs "ubi0:$n" /tmp/mnt; then
    mkdir -p "$out/files-$n"
    cp -a /tmp/mnt/. "$out/files-$n/"
    umount /tmp/mnt
  fi
done
ubidetach -d 0
