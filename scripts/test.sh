#!/usr/bin/env bash
# The test command: installs what the tests need, then runs formatting, lint and every test, builds
# the Debian package and checks that it installs and removes cleanly, and ends with one line
# totalling the test results of every test binary (the package check counting as one). `--no-fail-fast`: a failing
# test binary never hides whether the ones after it pass.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-test-deps.sh
# One build from scratch: incremental-compilation caches would only take gigabytes of disk.
export CARGO_INCREMENTAL=0
cargo fmt --all -- --check
# `rbd`: Ceph RBD devices (librbd-dev is installed above); builds without it work too.
cargo clippy --workspace --all-targets --locked --features sectorcrypt/rbd -- -D warnings
cargo clippy --workspace --all-targets --locked -- -D warnings

log="$(mktemp)"
trap 'rm -f "$log"' EXIT
status=0
cargo test --workspace --locked --no-fail-fast --features sectorcrypt/rbd 2>&1 | tee "$log" || status=$?
# The stack each cipher call leaves, measured again as users' builds inline it (release: one
# codegen unit and LTO inline differently from the test profile, and reached up to 3 KiB deeper).
cargo test --release --locked -p sectorcrypt-cipher --lib stays_within_the_stack_its_wipe_clears 2>&1 \
    | tee -a "$log" || status=$?
cargo test --release --locked -p sectorcrypt-integrity --test integrity \
    stays_within_the_stack_its_wipe_clears 2>&1 | tee -a "$log" || status=$?
# The Debian package, as a user installs it: built, installed, used, removed (counted as one test).
deb=0
if bash scripts/build-deb.sh --check; then deb=1; else status=1; fi
# CI keeps only the beginning and the end of this output: repeat each failing test's panic
# (its first lines, cut short) here at the end, where it survives.
awk '/^---- .* stdout ----$/ { name = $2 } /panicked at/ && name != "" && shown < 60 { print "why " name " failed:"; n = 12 }
     n > 0 && shown < 60 { print "  " substr($0, 1, 300); n--; shown++ }' "$log"
awk -v deb="$deb" '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed;/) p += $i; if ($(i+1) ~ /^failed;/) f += $i } }
     END { printf "tests: %d passed, %d failed\n", p + deb, f + 1 - deb }' "$log"
exit "$status"
