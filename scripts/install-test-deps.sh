#!/usr/bin/env bash
# Installs everything the tests and peer benchmarks need on a fresh Debian 12 machine (run as root,
# or with sudo available): the Rust toolchain's components, the independent implementations the
# tests cross-check against (OpenSSL through Python's `cryptography`, Crypto++), the real clients
# and peers of the NBD and FUSE exports (qemu-img, libnbd's nbdcopy/nbdinfo, fio, nbdkit with its
# luks filter, fuse3, e2fsprogs and fuse2fs), mtd-utils, squashfs-tools and ubi_reader for raw flash (ubinize,
# mkfs.ubifs and the readers that check exported images), Ceph (a monitor, an OSD, rbd, librbd and
# python3-rbd) for the RBD tests, SoftHSM, opensc, p11-kit, systemd, clevis, tang, swtpm and
# tpm2-tools for the token tests, the kernel oracle (QEMU and Debian's kernel package), and
# openssl(1) for the peer benchmarks and the TLS tests' certificates. Two tools
# keep the suite independent of the host's speed: qemu-user runs qemu-img emulated when the CPU is
# too fast for qemu's PBKDF2 calibration, and strace stops processes at an exact write (the
# SIGKILL/SIGINT tests) instead of at a moment in time. Safe to run again: it only installs what
# is missing.
set -euo pipefail

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

debs=(libssl-dev pkg-config g++ libcrypto++-dev libcrypto++-utils openssl python3 cryptsetup-bin qemu-utils
  qemu-user strace nbdkit libnbd-bin fio fuse3 e2fsprogs fuse2fs util-linux mount mtd-utils
  squashfs-tools fdisk linux-libc-dev
  # gdb for gcore: the core of a server that holds keys is searched for them.
  gdb
  # The kernel oracle (kernel-oracle.sh): QEMU to boot Debian's kernel under TCG, busybox for its
  # initramfs, kmod for the guest's modprobe.
  qemu-system-x86 busybox-static kmod
  # Ceph RBD: a monitor and an OSD for scripts/ceph-cluster.sh, the rbd tool, librbd to link
  # against, and librbd's own LUKS encryption as the oracle (qemu's rbd driver, python3-rbd).
  ceph-mon ceph-osd ceph-common librbd-dev qemu-block-extra python3-rbd
  # Tokens: SoftHSM as a PKCS#11 security token (pkcs11-tool from opensc fills it), p11-kit's
  # proxy module, and systemd's cryptenroll and cryptsetup token plugins on the other side;
  # clevis (with its LUKS commands) and a tang server for the network-bound tokens; swtpm as the
  # TPM 2.0, tpm2-tools (and the TSS's swtpm transport) to check sealed objects independently.
  softhsm2 opensc p11-kit-modules systemd clevis clevis-luks clevis-tpm2 tang swtpm tpm2-tools
  libtss2-tcti-swtpm0)
missing=()
for p in "${debs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-test-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

if ! command -v cargo >/dev/null 2>&1; then
  echo "install-test-deps: cargo is missing; install Rust (rustup) first" >&2
  exit 1
fi
rustup component add rustfmt clippy >/dev/null 2>&1 || true
# cargo-deb builds the Debian package that the test command installs and removes.
if ! command -v cargo-deb >/dev/null 2>&1; then
  echo "install-test-deps: installing cargo-deb"
  cargo install --locked --quiet cargo-deb
fi

# The Python that the tests run (python3 on PATH, or $SECTORCRYPT_PYTHON) needs `cryptography`.
py="${SECTORCRYPT_PYTHON:-python3}"
if ! "$py" -c 'import cryptography' 2>/dev/null; then
  echo "install-test-deps: installing Python cryptography for $py"
  "$py" -m pip install -q cryptography || $SUDO apt-get install -y -q python3-cryptography
fi
"$py" -c 'import cryptography; from cryptography.hazmat.primitives.ciphers import modes; modes.XTS'

# python-fido2 (Yubico's CTAP2 client) is the independent implementation the FIDO2 token's CBOR
# and PIN/UV protocols are checked against (no software FIDO2 key exists to test against).
if ! "$py" -c 'import fido2.ctap2.pin' 2>/dev/null; then
  echo "install-test-deps: installing python-fido2 for $py"
  "$py" -m pip install -q 'fido2>=1.1'
fi

# ubi_reader reads UBI images and UBIFS the way embedded developers do (the raw-flash tests check
# exported images with it).
if ! command -v ubireader_display_info >/dev/null 2>&1; then
  echo "install-test-deps: installing ubi_reader for $py"
  "$py" -m pip install -q ubi_reader
fi
# The real Linux kernel as the tests' oracle (UBI and UBIFS on nandsim for the raw-flash tests):
# Debian's kernel package in QEMU under TCG, fetched once and kept (kernel-oracle.sh).
bash "$(dirname "$0")/kernel-oracle.sh" prepare "${SECTORCRYPT_KERNEL_DIR:-/var/tmp/sectorcrypt-kernel}" >/dev/null
echo "install-test-deps: ok"
