#!/usr/bin/env bash
# Linux's own UBI and UBIFS as the oracle for the raw-flash tests: a User-Mode-Linux kernel built
# from Debian's linux-source-6.1 with nandsim, UBI and UBIFS runs as an ordinary process; it
# writes a decrypted flash dump (sectorcrypt flash export) onto its simulated NAND as ubiformat
# would, attaches it with the kernel's UBI, copies every volume out and mounts the UBIFS ones.
# ubi_reader is lenient; the kernel is the reader the images are for.
#
#   kernel-oracle.sh build DIR          build the kernel into DIR (kept: a second call is quick);
#                                        prints the kernel's path
#   kernel-oracle.sh check KERNEL DUMP OUT
#       boots KERNEL on a 64 MiB nandsim (128 KiB eraseblocks, 2 KiB pages, 512-byte sub-pages),
#       ubiformat -f DUMP, ubiattach, then for each volume NAME: OUT/vol-NAME.bin (its contents,
#       through /dev/ubi0_N) and, if it mounts as UBIFS, OUT/files-NAME/ (its files); OUT/ubinfo.txt
#       and OUT/guest.log say what happened; exits non-zero unless the guest finished.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

build() {
  local dir kernel
  dir=$(realpath -m "$1")
  kernel="$dir/linux-source-6.1/linux"
  if [ -x "$kernel" ]; then echo "$kernel"; return; fi
  local debs=(linux-source-6.1 build-essential flex bison libelf-dev bc xz-utils mtd-utils)
  local missing=()
  for p in "${debs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >&2
    apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
  fi
  mkdir -p "$dir"
  cd "$dir"
  rm -rf linux-source-6.1
  tar xf /usr/src/linux-source-6.1.tar.xz
  cd linux-source-6.1
  local log="$dir/build.log"
  echo "kernel-oracle: building a User-Mode-Linux kernel with nandsim, UBI and UBIFS in $dir" >&2
  {
    make ARCH=um defconfig &&
      ./scripts/config -e MTD -e MTD_BLOCK -e MTD_RAW_NAND -e MTD_NAND_NANDSIM \
        -e MTD_NAND_ECC_SW_HAMMING -e MTD_NAND_ECC_SW_BCH -e MTD_UBI -e UBIFS_FS \
        -e UBIFS_FS_XATTR -e HOSTFS &&
      make ARCH=um olddefconfig &&
      make ARCH=um -j"$(($(nproc) + 1))" linux
  } >"$log" 2>&1 || { tail -40 "$log" >&2; echo "kernel-oracle: build failed ($log)" >&2; exit 1; }
  echo "$kernel"
}

check() {
  local kernel=$1 dump out
  dump=$(realpath "$2")
  out=$(realpath -m "$3")
  rm -rf "$out"
  mkdir -p "$out"
  # The guest's root is the host's / (hostfs); its init is the guest half of this script, its
  # parameters come as environment variables (unknown kernel parameters go to init).
  timeout 600 "$kernel" mem=256M rootfstype=hostfs rootflags=/ rw \
    init="$here/kernel-oracle-guest.sh" oracle_dump="$dump" oracle_out="$out" \
    nandsim.id_bytes=0x20,0xa2,0x00,0x15 con0=fd:0,fd:1 con=null </dev/null >"$out/console.log" 2>&1 || true
  if [ "$(cat "$out/status" 2>/dev/null)" != done ]; then
    echo "kernel-oracle: the guest did not finish; see $out/guest.log and $out/console.log" >&2
    tail -20 "$out/guest.log" "$out/console.log" >&2 || true
    exit 1
  fi
}

case "${1:-}" in
  build) build "${2:?build DIR}" ;;
  check) check "${2:?check KERNEL DUMP OUT}" "${3:?}" "${4:?}" ;;
  *) echo "usage: kernel-oracle.sh build DIR | check KERNEL DUMP OUT" >&2; exit 2 ;;
esac
