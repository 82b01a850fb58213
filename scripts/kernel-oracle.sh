#!/usr/bin/env bash
# The real Linux kernel as the tests' oracle, without root, KVM or anything from the host kernel:
# Debian's own kernel package (linux-image-amd64: nandsim, MTD, UBI, UBIFS, dm-crypt and
# dm-integrity as modules) booted in QEMU under TCG emulation. TCG emulates one fixed CPU model
# whatever the host is, so the guest does not depend on the host's vendor, XSAVE size (AMX) or
# kernel; a User-Mode-Linux kernel did, and died on Intel hosts with AMX.
#
# The guest's root is the host's / over 9p, read-only, so the host's mtd-utils, cryptsetup and
# the project's binaries run inside; the kernel's modules come over a second share; WORK (a host
# folder) is shared writable at its own path. A busybox initramfs loads the 9p modules, mounts
# that root and runs scripts/kernel-oracle-guest.sh as PID 1, which runs the caller's script.
#
#   kernel-oracle.sh prepare DIR
#       downloads the newest linux-image-amd64 kernel into DIR and builds its initramfs (kept: a
#       second call is quick); installs qemu-system-x86 and busybox-static if missing; prints DIR
#   kernel-oracle.sh run DIR WORK SCRIPT [ARG...]
#       boots the kernel prepared in DIR and runs `SCRIPT ARG...` inside as root, its working
#       folder WORK; prints its output and exits with its status. If the guest does not get that
#       far, exits 125 with one line saying why (the kernel's panic message, or a timeout) and
#       leaves the console log in WORK/kernel-oracle/console.log. A script may end the guest
#       like a power cut (`echo b >/proc/sysrq-trigger`: no sync, no orderly shutdown) once it
#       has written its exit status to the file $ORACLE_STATUS_FILE (set in the guest): run then
#       reports that status and the output so far as usual.
#
# Environment: SECTORCRYPT_ORACLE_TIMEOUT (seconds, default 900: only a hang's limit, TCG speed
# follows the host's), SECTORCRYPT_ORACLE_MEMORY (MiB, default 1024), SECTORCRYPT_ORACLE_APPEND
# (more kernel parameters; the boot check's test breaks the boot with it), SECTORCRYPT_ORACLE_TPM
# (the control socket of a `swtpm socket --tpm2 --ctrl type=unixio,path=SOCKET` the caller runs:
# the guest then has it as a TIS TPM 2.0, /dev/tpmrm0).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

need_debs() {
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >&2
    apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
  fi
}

# The modules that must be in the initramfs to mount a 9p root over virtio, dependencies first
# (modules.dep lists a module's dependencies so that loading them from last to first works).
module_order() {
  local moddir=$1 m
  shift
  for m in "$@"; do
    awk -v m="$m" '
      { name = $1; sub(/:$/, "", name); n = split(name, parts, "/"); base = parts[n];
        sub(/\.ko(\.[a-z]+)?$/, "", base); gsub(/-/, "_", base) }
      base == m { for (i = NF; i >= 2; i--) print $i; print name; exit }' "$moddir/modules.dep"
  done | awk '!seen[$0]++'
}

fetch_kernel() {
  local dir=$1 pkg
  mkdir -p "$dir"
  pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-/ { print $2; exit }')
  if [ -z "$pkg" ]; then
    apt-get update -q >&2
    pkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-/ { print $2; exit }')
  fi
  echo "kernel-oracle: fetching $pkg into $dir" >&2
  local tmp="$dir/tmp"
  rm -rf "$tmp" "$dir/root"
  mkdir -p "$tmp"
  # apt's download sandbox user must be able to write the folder.
  chmod 777 "$tmp"
  (cd "$tmp" && apt-get download -q "$pkg" >&2)
  dpkg-deb -x "$tmp"/"$pkg"_*.deb "$dir/root"
  rm -rf "$tmp"
  local release
  release=$(basename "$(ls -d "$dir"/root/lib/modules/*)")
  # The package leaves modules.dep to its postinst; the guest's modprobe needs it.
  depmod -b "$dir/root" "$release"
  cp "$dir/root/boot/vmlinuz-$release" "$dir/vmlinuz"
  echo "$release" >"$dir/release"
}

prepare() {
  local dir
  dir=$(realpath -m "$1")
  # kmod: depmod here, modprobe in the guest (whose root is this host's /).
  need_debs qemu-system-x86 busybox-static kmod
  # The kernel is fetched once and kept; the initramfs is small and rebuilt every time, so that
  # it always matches this script.
  if [ ! -f "$dir/release" ]; then fetch_kernel "$dir"; fi
  local release moddir
  release=$(cat "$dir/release")
  moddir="$dir/root/lib/modules/$release"

  local initramfs="$dir/initramfs"
  rm -rf "$initramfs"
  mkdir -p "$initramfs"/{bin,dev,proc,sys,newroot,modules}
  cp /bin/busybox "$initramfs/bin/busybox"
  local order=()
  mapfile -t order < <(module_order "$moddir" virtio_pci 9pnet_virtio 9p overlay)
  case "${order[*]}" in *fs/9p/9p.ko*) ;; *)
    echo "kernel-oracle: the kernel $release has no 9p module: ${order[*]}" >&2
    exit 1
    ;;
  esac
  local m
  for m in "${order[@]}"; do
    cp "$moddir/$m" "$initramfs/modules/"
    basename "$m" >>"$initramfs/modules/order"
  done
  cat >"$initramfs/init" <<'EOF'
#!/bin/busybox sh
# Loads virtio, 9p and overlayfs, mounts the host's / (read-only, under an overlay), the kernel's
# modules and the writable share, then hands PID 1 to kernel-oracle-guest.sh inside that root.
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
echo "kernel-oracle: initramfs up" >/dev/console
for m in $(cat /modules/order); do insmod "/modules/$m" || echo "kernel-oracle: insmod $m failed" >/dev/console; done
opts=trans=virtio,version=9p2000.L,msize=262144,cache=none
# The root: the host's / read-only under a tmpfs overlay, so the guest may write anywhere
# (/lib/modules, /etc, /var) and nothing of it reaches the host.
mkdir -p /host /rw
mount -t 9p -o "$opts,ro" hostroot /host || { echo "kernel-oracle: cannot mount the host's root" >/dev/console; poweroff -f; }
mount -t tmpfs rw /rw
mkdir -p /rw/upper /rw/work
mount -t overlay -o lowerdir=/host,upperdir=/rw/upper,workdir=/rw/work root /newroot ||
  { echo "kernel-oracle: cannot mount the overlay root" >/dev/console; poweroff -f; }
mkdir -p "/newroot/lib/modules/$(uname -r)"
mount -t 9p -o "$opts,ro" modules "/newroot/lib/modules/$(uname -r)"
# /tmp and /run stay the host's under the overlay (the repository itself may be below /tmp).
mkdir -p "/newroot$oracle_work"
mount -t 9p -o "$opts" work "/newroot$oracle_work"
mount --move /dev /newroot/dev
mount --move /proc /newroot/proc
mount --move /sys /newroot/sys
exec switch_root /newroot /bin/sh "$oracle_guest"
EOF
  chmod +x "$initramfs/init"
  (cd "$initramfs" && find . | busybox cpio -o -H newc 2>/dev/null | gzip -1) >"$dir/initrd.img.new"
  mv "$dir/initrd.img.new" "$dir/initrd.img"
  echo "$dir"
}

run() {
  local dir work script
  dir=$(realpath "$1")
  work=$(realpath "$2")
  script=$(realpath "$3")
  shift 3
  local release
  release=$(cat "$dir/release" 2>/dev/null) || {
    echo "kernel-oracle: no kernel in $dir: run scripts/kernel-oracle.sh prepare $dir" >&2
    exit 125
  }
  local ctl="$work/kernel-oracle"
  rm -rf "$ctl"
  mkdir -p "$ctl"
  # The command and its arguments, one per line, for the guest to read back (the kernel command
  # line cannot carry arbitrary strings).
  printf '%s\n' "$script" "$@" >"$ctl/command"
  case "$work" in *[[:space:]]*)
    echo "kernel-oracle: WORK must not contain white space: $work" >&2
    exit 125
    ;;
  esac
  local share="security_model=none,multidevs=remap"
  local tpm=()
  if [ -n "${SECTORCRYPT_ORACLE_TPM:-}" ]; then
    tpm=(-chardev "socket,id=chrtpm,path=$SECTORCRYPT_ORACLE_TPM" -tpmdev emulator,id=tpm0,chardev=chrtpm
      -device tpm-tis,tpmdev=tpm0)
  fi
  local status=0
  timeout "${SECTORCRYPT_ORACLE_TIMEOUT:-900}" qemu-system-x86_64 \
    -accel tcg -cpu max -smp 1 -m "${SECTORCRYPT_ORACLE_MEMORY:-1024}" \
    -nodefaults -no-user-config -nographic -no-reboot \
    -serial "file:$ctl/console.log" -monitor none \
    -kernel "$dir/vmlinuz" -initrd "$dir/initrd.img" \
    -append "console=ttyS0 panic=-1 loglevel=4 oracle_work=$work oracle_guest=$here/kernel-oracle-guest.sh ${SECTORCRYPT_ORACLE_APPEND:-}" \
    -virtfs "local,path=/,mount_tag=hostroot,readonly=on,$share" \
    -virtfs "local,path=$dir/root/lib/modules/$release,mount_tag=modules,readonly=on,$share" \
    -virtfs "local,path=$work,mount_tag=work,$share" \
    "${tpm[@]}" \
    </dev/null >"$ctl/qemu.log" 2>&1 || status=$?
  if [ -f "$ctl/output" ]; then cat "$ctl/output"; fi
  if [ -f "$ctl/status" ]; then
    exit "$(cat "$ctl/status")"
  fi
  local why
  why=$(grep -a -m1 -o 'Kernel panic.*' "$ctl/console.log" 2>/dev/null | tr -d '\r' || true)
  if [ -z "$why" ] && [ "$status" -eq 124 ]; then
    why="no answer within ${SECTORCRYPT_ORACLE_TIMEOUT:-900} s"
  fi
  if [ -z "$why" ]; then
    why="qemu exited with status $status: $(tail -n 1 "$ctl/qemu.log" 2>/dev/null)"
  fi
  echo "kernel-oracle: the guest kernel did not run the script: $why (console: $ctl/console.log)" >&2
  exit 125
}

case "${1:-}" in
  prepare) prepare "${2:?prepare DIR}" ;;
  run) run "${2:?run DIR WORK SCRIPT [ARG...]}" "${3:?}" "${4:?}" "${@:5}" ;;
  *) echo "usage: kernel-oracle.sh prepare DIR | run DIR WORK SCRIPT [ARG...]" >&2; exit 2 ;;
esac
