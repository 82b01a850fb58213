#!/bin/bash
# Run inside the kernel oracle (kernel-oracle.sh run DIR WORK kernel-oracle-mtd.sh SECTORCRYPT
# IN OUT [GEOMETRY...]): `sectorcrypt flash ...` on the kernel's own MTD character device
# /dev/mtd0, a nandsim chip, in three geometries (or those named), one after the other in one
# boot:
#
#   slc2k  2 KiB pages, 512-byte sub-pages, 128 KiB eraseblocks (32 MiB), two blocks bad from
#          the start (badblocks=), one that fails its first erase (weakblocks=) and a page that
#          fails every program (weakpages=): format, import of a ubinize image (IN/slc2k.ubi),
#          mkvol, update, then attach with NBD (qemu-io, nbdcopy) and FUSE, reads and writes;
#          the raw chip with its spare areas exported.
#   4k     4 KiB pages, 1 KiB sub-pages, 256 KiB eraseblocks (64 MiB), random bit-flips on reads
#          (bitflips=1): ubiformat, the kernel's UBI writes a volume, `convert` encrypts it, an
#          attach writes it, another only reads until the kernel counted corrected bits (UBI
#          must scrub), `convert --decrypt`, and the kernel's UBI reads the volume back.
#   nop1   an MLC chip, so no sub-pages (NOP 1: the kernel refuses partial-page programs), 2 KiB
#          pages, 128 KiB eraseblocks (32 MiB): format, mkvol, update, and a power cut: the
#          attached flash is SIGKILLed while a client's writes are in flight, after a flushed
#          write; the chip (nandsim's RAM) is kept and the flash attached again.
#
# A power cut is modelled by SIGKILL: a NAND program or erase is durable once its call returns
# and none is torn by a signal, so the chip then holds what a cut between two calls leaves.
#
# Results go to OUT/GEOMETRY/ (volume contents, `flash info --json`, the kernel's counters) for
# the test to compare with what it wrote; IN holds the passphrase (IN/key) and the data. Exits
# non-zero at the first step that fails.
set -Eeuxo pipefail
# Each traced step with its time, for the test's failure report.
PS4='+ $EPOCHREALTIME '
# The step that failed and the kernel's last words, last, where a shortened report still shows
# them (a report keeps the start and the end of a long trace).
trap 'status=$?; { set +x; } 2>/dev/null; echo "kernel-oracle-mtd.sh: line $LINENO: \"$BASH_COMMAND\" exited with $status" >&2; dmesg | tail -n 20 >&2' ERR
sc=$1
in=$2
out=$3
rm -rf "$out"
mkdir -p "$out"
fast=(--pbkdf pbkdf2 --pbkdf-force-iterations 1000)
key=(--key-file "$in/key")
modprobe fuse
modprobe ubi

# load_chip ARGS...: nandsim with ARGS as /dev/mtd0.
load_chip() {
  modprobe nandsim "$@"
  test -c /dev/mtd0
  mtdinfo /dev/mtd0
}

unload_chip() {
  rmmod nandsim
}

# wait_for PATH: until PATH exists (a socket or a mount the attach makes).
wait_for() {
  { set +x; } 2>/dev/null
  local tries=0
  until [ -e "$1" ]; do
    tries=$((tries + 1))
    [ "$tries" -lt 3000 ] || { echo "no $1"; return 1; }
    sleep 0.1
  done
  set -x
}

# sysfs NAME: the chip's MTD attribute NAME.
sysfs() {
  cat "/sys/class/mtd/mtd0/$1"
}

# bad_blocks: the eraseblocks the kernel answers MEMGETBADBLOCK for with "bad", one a line.
bad_blocks() {
  python3 - /dev/mtd0 "$(sysfs erasesize)" "$(sysfs size)" <<'PY'
import fcntl, struct, sys
MEMGETBADBLOCK = 0x40084D0B  # _IOW('M', 11, __kernel_loff_t)
device, erasesize, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with open(device, "rb") as f:
    for block in range(size // erasesize):
        offset = bytearray(struct.pack("q", block * erasesize))
        if fcntl.ioctl(f.fileno(), MEMGETBADBLOCK, offset, True) > 0:
            print(block)
PY
}

# info FILE: `flash info --json` into FILE.
info() {
  "$sc" flash info /dev/mtd0 "${key[@]}" --json >"$1"
}

# attach DIR VOLUME: `flash attach` of /dev/mtd0 with FUSE at DIR/mnt and NBD in DIR/sock, in
# the background (its PID in $attached); returns once VOLUME's socket is there.
attach() {
  local dir=$1 volume=$2
  mkdir -p "$dir/mnt" "$dir/sock"
  "$sc" flash attach /dev/mtd0 "$dir/mnt" --socket-dir "$dir/sock" "${key[@]}" &
  attached=$!
  wait_for "$dir/sock/$volume.sock"
}

detach() {
  kill -TERM "$attached"
  wait "$attached"
}

nbd() {
  echo "nbd+unix:///$2?socket=$1/sock/$2.sock"
}

geometry_slc2k() {
  local o=$out/slc2k s=/tmp/slc2k
  mkdir -p "$o" "$s"
  # Page 210 * 64 = 13440 is the first page of eraseblock 210 (both weak blocks lie in UBI's part:
  # the header area's are not replaced when they fail).
  load_chip id_bytes=0x20,0xa2,0x00,0x15 overridesize=8 badblocks=5,100 weakblocks=200:0 weakpages=13440:0
  bad_blocks >"$o/bad-before"
  "$sc" flash format /dev/mtd0 "${key[@]}" -q "${fast[@]}"
  info "$o/info-format.json"
  "$sc" flash import /dev/mtd0 "$in/slc2k.ubi" "${key[@]}" -q
  "$sc" flash read /dev/mtd0 -N img "$o/img.bin" "${key[@]}"
  "$sc" flash mkvol /dev/mtd0 -N data -S 8 "${key[@]}"
  "$sc" flash update /dev/mtd0 -N data "$in/data.bin" "${key[@]}"
  "$sc" flash read /dev/mtd0 -N data "$o/data.bin" "${key[@]}"
  attach "$s" data
  # NBD writes data, FUSE reads it; FUSE writes img, NBD reads it.
  nbdcopy "$in/nbd.bin" "$(nbd "$s" data)"
  cp "$s/mnt/data" "$o/data-fuse.bin"
  dd if="$in/fuse.bin" of="$s/mnt/img" bs=64k conv=notrunc,fsync
  nbdcopy "$(nbd "$s" img)" "$o/img-nbd.bin"
  qemu-io -f raw "$(nbd "$s" data)" -c "write -P 0x5a 4096 8192" -c flush
  detach
  "$sc" flash read /dev/mtd0 -N data "$o/data-after.bin" "${key[@]}"
  "$sc" flash read /dev/mtd0 -N img "$o/img-after.bin" "${key[@]}"
  info "$o/info-after.json"
  bad_blocks >"$o/bad-blocks"
  # Every page and its spare area (MEMREADOOB64), as nanddump --oob reads them.
  "$sc" flash export /dev/mtd0 "$o/raw-oob.bin" --raw --oob
  unload_chip
}

geometry_4k() {
  local o=$out/4k s=/tmp/4k
  mkdir -p "$o" "$s"
  # A 128 MiB chip whose fourth ID byte says 4 KiB pages, 128 spare bytes, 256 KiB eraseblocks;
  # overridesize only within 128 MiB, where nandsim and the kernel agree on the address cycles.
  load_chip id_bytes=0x20,0xf1,0x00,0x26 overridesize=8 bitflips=1
  ubiformat /dev/mtd0 -y -q
  ubiattach -m 0 -d 0
  ubimkvol /dev/ubi0 -N kvol -s 2MiB
  ubiupdatevol /dev/ubi0_0 "$in/kvol.bin"
  ubidetach -d 0
  "$sc" flash convert /dev/mtd0 "${key[@]}" -q "${fast[@]}"
  "$sc" flash read /dev/mtd0 -N kvol "$o/kvol.bin" "${key[@]}"
  attach "$s" kvol
  nbdcopy "$in/kvol2.bin" "$(nbd "$s" kvol)"
  detach
  info "$o/info-written.json"
  # Reads only, until the kernel's ECC corrected bits it flipped: the PEBs read with bit-flips
  # are scrubbed (moved, with a new sequence number).
  attach "$s" kvol
  sysfs corrected_bits >"$o/corrected-before"
  local rounds=0
  while [ "$(sysfs corrected_bits)" = "$(cat "$o/corrected-before")" ] && [ "$rounds" -lt 40 ]; do
    nbdcopy "$(nbd "$s" kvol)" "$o/kvol-read.bin"
    cmp "$in/kvol2.bin" "$o/kvol-read.bin" -n "$(stat -c %s "$in/kvol2.bin")"
    rounds=$((rounds + 1))
  done
  detach
  sysfs corrected_bits >"$o/corrected-after"
  info "$o/info-scrubbed.json"
  "$sc" flash convert --decrypt /dev/mtd0 "${key[@]}" -q
  ubiattach -m 0 -d 0
  dd if=/dev/ubi0_0 of="$o/kvol-kernel.bin" bs=256k
  ubidetach -d 0
  unload_chip
}

geometry_nop1() {
  local o=$out/nop1 s=/tmp/nop1
  mkdir -p "$o" "$s"
  # The third ID byte's cell type (bits 2-3) makes it MLC: the kernel then allows no sub-pages.
  load_chip id_bytes=0x20,0xa2,0x04,0x15 overridesize=8
  sysfs subpagesize >"$o/subpagesize"
  "$sc" flash format /dev/mtd0 "${key[@]}" -q "${fast[@]}"
  "$sc" flash mkvol /dev/mtd0 -N data -S 16 "${key[@]}"
  "$sc" flash update /dev/mtd0 -N data "$in/data.bin" "${key[@]}"
  "$sc" flash read /dev/mtd0 -N data "$o/data.bin" "${key[@]}"
  info "$o/info.json"
  local leb
  leb=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["ubi"]["leb_size"])' "$o/info.json")
  attach "$s" data
  # Synced: LEBs 0-3 hold 0x11.
  qemu-io -f raw "$(nbd "$s" data)" -c "write -P 0x11 0 $((4 * leb))" -c flush
  # In flight: LEB by LEB, 0x22 into LEBs 4-15; the flash is killed once two are acknowledged.
  local writes=()
  for i in $(seq 4 15); do writes+=(-c "write -P 0x22 $((i * leb)) $leb"); done
  stdbuf -oL qemu-io -f raw "$(nbd "$s" data)" "${writes[@]}" >"$s/writes.log" 2>&1 &
  local writer=$!
  until [ "$(grep -c '^wrote' "$s/writes.log")" -ge 2 ] || ! kill -0 "$writer"; do sleep 0.01; done
  kill -KILL "$attached"
  wait "$attached" || true
  # How many writes were acknowledged when the cut came (for the test's messages: what must
  # hold does not depend on it).
  grep -c '^wrote' "$s/writes.log" >"$o/acknowledged-at-cut" || true
  wait "$writer" || true
  "$sc" flash read /dev/mtd0 -N data "$o/data-cut.bin" "${key[@]}"
  info "$o/info-cut.json"
  # The flash works on after the cut.
  "$sc" flash update /dev/mtd0 -N data "$in/nbd.bin" "${key[@]}"
  "$sc" flash read /dev/mtd0 -N data "$o/data-recovered.bin" "${key[@]}"
  unload_chip
}

# The geometries named after OUT (all three if none).
shift 3
[ $# -gt 0 ] || set -- slc2k 4k nop1
for geometry in "$@"; do
  "geometry_$geometry"
done
