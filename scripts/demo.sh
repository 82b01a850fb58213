#!/usr/bin/env bash
# The main job on its embedded default: no root, no device, everything under ./demo.
# Builds sectorcrypt, encrypts a 256 MiB volume file and reads it back (checking every byte),
# formats a LUKS2 image that cryptsetup can open, serves it over NBD (when libnbd's nbdcopy and
# nbdinfo are installed: scripts/install-test-deps.sh) and copies data through it, and prints this
# machine's cipher speed table.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --release --locked --workspace --bins --examples
sc=./target/release/sectorcrypt
cargo run --release --locked -q -p sectorcrypt-cipher --example volume_roundtrip -- demo "${DEMO_MIB:-256}"

echo
echo "== a LUKS2 image, demo/luks.img (passphrase in demo/passphrase, mode 0600)"
rm -f demo/luks.img demo/passphrase
(umask 077 && head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > demo/passphrase)
truncate -s 64M demo/luks.img
# A fast PBKDF for the demo only; without these options format calibrates argon2id to 2 s.
$sc format -q --pbkdf pbkdf2 --pbkdf-force-iterations 1000 --key-file demo/passphrase demo/luks.img
$sc dump demo/luks.img
$sc test-passphrase --key-file demo/passphrase demo/luks.img
if command -v cryptsetup >/dev/null 2>&1; then
  if cmp -s <($sc dump demo/luks.img) <(cryptsetup luksDump demo/luks.img); then
    echo "cryptsetup luksDump prints the same header"
  else
    echo "cryptsetup luksDump differs" >&2
    exit 1
  fi
fi

echo
echo "== the decrypted volume over NBD (sectorcrypt serve, Unix socket demo/nbd.sock)"
if command -v nbdcopy >/dev/null 2>&1 && command -v nbdinfo >/dev/null 2>&1; then
  rm -f demo/nbd.sock
  $sc serve demo/luks.img --key-file demo/passphrase --socket demo/nbd.sock &
  server=$!
  uri="nbd+unix:///?socket=$PWD/demo/nbd.sock"
  for _ in $(seq 100); do [ -S demo/nbd.sock ] && break; sleep 0.05; done
  nbdinfo "$uri" | grep -E 'export-size|block_size|can_multi_conn'
  head -c $((16 << 20)) /dev/urandom > demo/payload.bin
  nbdcopy demo/payload.bin "$uri"
  nbdcopy "$uri" demo/readback.bin
  kill -TERM "$server"
  wait "$server"
  if cmp -s demo/payload.bin <(head -c $((16 << 20)) demo/readback.bin); then
    echo "16 MiB written and read back through NBD: identical"
  else
    echo "the data read back through NBD differs" >&2
    exit 1
  fi
  rm -f demo/payload.bin demo/readback.bin
else
  echo "(skipped: nbdcopy/nbdinfo not installed; scripts/install-test-deps.sh installs them)"
fi

echo
$sc benchmark
