#!/bin/bash
# The kernel's side of the dm-crypt interop matrix (crates/sectorcrypt/tests/cli/dmcrypt.rs),
# run as root inside the kernel oracle's guest (scripts/kernel-oracle.sh), in the shared WORK
# folder, which holds the passphrase file `key` and a CASES file, one case a line:
#   ID TYPE CIPHER KEY_BITS SECTOR_SIZE LAYOUT ALGORITHMS
# LAYOUT is attached, detached (header in its own file) or offset (cryptsetup puts the data 20
# MiB into the image); ALGORITHMS are the kernel's names of the algorithms the case needs, comma
# separated.
#
#   kernel-oracle-dmcrypt.sh write CASES
#       per case: whether the kernel has each algorithm (after asking modprobe for it); dm-crypt
#       opens sectorcrypt's sc-ID.img (header sc-ID.hdr if detached), if there is one, and
#       data-ID.bin is written through it; cryptsetup formats a new cs-ID.img (cs-ID.hdr)
#   kernel-oracle-dmcrypt.sh read CASES
#       per case: dm-crypt opens cs-ID.img and its first MiB is read into read-ID.bin
#
# Prints one line a step: `write|format|read ID ok` or `... ID failed REASON`; `lacks ID NAME`
# for an algorithm the kernel does not have; `table-sc|table-cs ID CIPHER SECTOR_SIZE` for each
# mapping as dm-crypt has it. A step that fails does not stop the others.
set -u
phase=$1
cases=$2
modprobe loop && modprobe dm-crypt || exit 2
pbkdf=(--pbkdf pbkdf2 --pbkdf-force-iterations 1000)
# Whether the kernel has an algorithm (yes or no), by its name, asked once.
declare -A has

# Every image and header file goes to cryptsetup as a loop device: on the 9p share itself its
# direct I/O fails ("IO error while decrypting keyslot", "not a valid LUKS device").
loop() { losetup -f --show "$1"; }

# open ID NAME IMAGE HEADER: cryptsetup opens IMAGE (with HEADER, unless empty) as
# /dev/mapper/NAME; prints `$step ID failed REASON` if it does not open.
open_volume() {
  local id=$1 name=$2 image=$3 header=$4 dev
  dev=$(loop "$image") || { echo "$step $id failed losetup"; return 1; }
  local with_header=()
  [ -n "$header" ] && with_header=(--header "$(loop "$header")")
  if ! cryptsetup open "${with_header[@]}" --key-file key "$dev" "$name" 2>err.txt; then
    echo "$step $id failed open: $(tail -n 1 err.txt)"
    losetup -D
    return 1
  fi
  # The mapping's cipher and sector size (512 unless the table says otherwise).
  local table sector=512
  table=$(dmsetup table "$name")
  case "$table" in *sector_size:*) sector=${table##*sector_size:} sector=${sector%% *} ;; esac
  echo "table-${name%%-*} $id $(echo "$table" | cut -d ' ' -f 4) $sector"
}

close_volume() {
  cryptsetup close "$1"
  losetup -D
}

# The cases come on descriptor 3, so that nothing in the loop can read them as its input.
while read -r -u 3 id type cipher bits sector layout algorithms; do
  case "$phase" in
  write)
    for a in ${algorithms//,/ }; do
      if [ -z "${has[$a]:-}" ]; then
        modprobe -q "crypto-$a" 2>/dev/null
        has[$a]=no
        grep -q "^name *: $a\$" /proc/crypto && has[$a]=yes
      fi
      [ "${has[$a]}" = yes ] || echo "lacks $id $a"
    done
    if [ -f "sc-$id.img" ]; then
      step=write
      header=
      [ "$layout" = detached ] && header=sc-$id.hdr
      if open_volume "$id" "sc-$id" "sc-$id.img" "$header"; then
        if dd if="data-$id.bin" of="/dev/mapper/sc-$id" bs=64k oflag=direct conv=nocreat,fsync status=none 2>err.txt; then
          echo "write $id ok"
        else
          echo "write $id failed dd: $(tail -n 1 err.txt)"
        fi
        close_volume "sc-$id"
      fi
    fi
    layout_options=()
    case "$layout" in
    attached) truncate -s 20M "cs-$id.img" ;;
    detached)
      truncate -s 2M "cs-$id.img"
      truncate -s 16M "cs-$id.hdr"
      layout_options=(--header "$(loop "cs-$id.hdr")")
      ;;
    offset)
      truncate -s 24M "cs-$id.img"
      layout_options=(--offset 40960)
      ;;
    esac
    sector_options=()
    [ "$type" = luks2 ] && sector_options=(--sector-size "$sector")
    if cryptsetup luksFormat -q --type "$type" --cipher "$cipher" --key-size "$bits" \
      "${sector_options[@]}" "${pbkdf[@]}" "${layout_options[@]}" --key-file key \
      "$(loop "cs-$id.img")" 2>err.txt; then
      echo "format $id ok"
    else
      echo "format $id failed $(tail -n 1 err.txt)"
    fi
    losetup -D
    ;;
  read)
    step=read
    header=
    [ "$layout" = detached ] && header=cs-$id.hdr
    if open_volume "$id" "cs-$id" "cs-$id.img" "$header"; then
      if dd if="/dev/mapper/cs-$id" of="read-$id.bin" bs=64k count=16 iflag=direct status=none 2>err.txt; then
        echo "read $id ok"
      else
        echo "read $id failed dd: $(tail -n 1 err.txt)"
      fi
      close_volume "cs-$id"
    fi
    ;;
  *)
    echo "unknown phase $phase" >&2
    exit 2
    ;;
  esac
done 3<"$cases"
