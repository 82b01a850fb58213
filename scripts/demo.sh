#!/usr/bin/env bash
# The main job on its embedded default: no root, no device, everything under ./demo.
# Builds sectorcrypt, encrypts a 256 MiB volume file and reads it back (checking every byte),
# then prints this machine's cipher speed table.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --release --locked --workspace --bins --examples
cargo run --release --locked -q -p sectorcrypt-cipher --example volume_roundtrip -- demo "${DEMO_MIB:-256}"
echo
./target/release/sectorcrypt benchmark
