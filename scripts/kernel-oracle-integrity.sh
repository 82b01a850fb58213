#!/bin/bash
# The kernel's side of the integrity interop tests (crates/integrity/tests/), run as root inside
# the kernel oracle's guest (scripts/kernel-oracle.sh) in the shared WORK folder, which holds the
# passphrase file `key` and a CASES file, one case a line:
#   ID CIPHER INTEGRITY KEY_BITS SECTOR_SIZE [FORMAT_OPTION...]
#
#   kernel-oracle-integrity.sh write CASES
#       per case: cryptsetup formats int-ID.img (an existing file) with `--integrity INTEGRITY`
#       (wiping it, as it does by default), opens it, writes data-ID.bin at its start through
#       dm-crypt and dm-integrity (direct I/O), then journal-ID.bin at 2 MiB (flushed: committed
#       to the journal, and too small to make the kernel copy it in place yet), copies the image
#       as it is then to snap-ID.img (a power cut at that point), and closes it
#   kernel-oracle-integrity.sh read CASES
#       per case: opens int-ID.img and reads it whole, block by block (direct I/O, SECTOR_SIZE
#       bytes), into read-ID.bin, a block the kernel refuses as zeros and named in a line
#       `bad ID N`
#
# Prints one line a step: `write|read ID ok`, `size ID BYTES` (the mapping's size), or
# `... ID failed REASON`. A case that fails does not stop the others.
set -u
phase=$1
cases=$2
modprobe loop && modprobe dm-crypt && modprobe dm-integrity || exit 2
# The images are worked on in the guest's own memory: a loop device over the 9p share, under
# dm-integrity, crashes this kernel in 9p's zero-copy writes (list_add double add).
mount -t tmpfs -o size=256m scratch /mnt || exit 2

# open_volume ID: /mnt/int-ID.img on a loop device, opened as /dev/mapper/int-ID; prints
# `$phase ID failed REASON` if it does not open.
open_volume() {
  local id=$1 dev
  dev=$(losetup -f --show "/mnt/int-$id.img") || { echo "$phase $id failed losetup"; return 1; }
  if ! cryptsetup open --key-file key "$dev" "int-$id" 2>err.txt; then
    echo "$phase $id failed open: $(tail -n 1 err.txt)"
    losetup -D
    return 1
  fi
  echo "size $id $(blockdev --getsize64 "/dev/mapper/int-$id")"
}

close_volume() {
  cryptsetup close "int-$1"
  losetup -D
}

# bring_in ID / bring_back ID: the image into the guest's memory and back to the share.
bring_in() { cp "int-$1.img" /mnt/; }
bring_back() {
  cp "/mnt/int-$1.img" "int-$1.img"
  rm -f "/mnt/int-$1.img"
}

# The cases come on descriptor 3, so that nothing in the loop can read them as its input.
while read -r -u 3 id cipher integrity bits sector options; do
  case "$phase" in
  write)
    bring_in "$id"
    dev=$(losetup -f --show "/mnt/int-$id.img") || { echo "write $id failed losetup"; continue; }
    # shellcheck disable=SC2086
    if ! cryptsetup luksFormat -q --type luks2 --cipher "$cipher" --integrity "$integrity" \
      --key-size "$bits" --sector-size "$sector" --pbkdf pbkdf2 --pbkdf-force-iterations 1000 \
      $options --key-file key "$dev" 2>err.txt; then
      echo "write $id failed format: $(tail -n 1 err.txt)"
      losetup -D
      rm -f "/mnt/int-$id.img"
      continue
    fi
    losetup -D
    open_volume "$id" || { rm -f "/mnt/int-$id.img"; continue; }
    # Opened again between the two writes: the second then goes to a journal with every entry
    # free, far from the watermark that would make the kernel copy it in place at once.
    if dd if="data-$id.bin" of="/dev/mapper/int-$id" bs=64k oflag=direct conv=fsync status=none 2>err.txt &&
      close_volume "$id" && open_volume "$id" >/dev/null &&
      dd if="journal-$id.bin" of="/dev/mapper/int-$id" bs=4k seek=512 oflag=direct conv=fsync,notrunc status=none 2>err.txt &&
      cp "/mnt/int-$id.img" "snap-$id.img"; then
      echo "write $id ok"
    else
      echo "write $id failed dd: $(tail -n 1 err.txt)"
    fi
    close_volume "$id"
    bring_back "$id"
    ;;
  read)
    bring_in "$id"
    open_volume "$id" || { rm -f "/mnt/int-$id.img"; continue; }
    python3 - "/dev/mapper/int-$id" "read-$id.bin" "$sector" "$id" <<'PY'
import mmap, os, sys
device, out, sector, case = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
fd = os.open(device, os.O_RDONLY | os.O_DIRECT)
size = os.lseek(fd, 0, os.SEEK_END)
buf = mmap.mmap(-1, sector)  # page-aligned, as O_DIRECT needs
with open(out, "wb") as f:
    for n in range(size // sector):
        try:
            os.preadv(fd, [buf], n * sector)
            f.write(buf[:])
        except OSError as e:
            print(f"bad {case} {n} {e.strerror}")
            f.write(bytes(sector))
PY
    echo "read $id ok"
    close_volume "$id"
    rm -f "/mnt/int-$id.img"
    ;;
  esac
done 3<"$cases"
