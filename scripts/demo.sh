#!/usr/bin/env bash
# The main job on its embedded default: no root, no device, everything under ./demo.
# Builds sectorcrypt, encrypts a 256 MiB volume file and reads it back (checking every byte),
# formats a LUKS2 image that cryptsetup can open, and prints this machine's cipher speed table.
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
$sc benchmark
