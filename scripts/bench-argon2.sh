#!/usr/bin/env bash
# Argon2id against cryptsetup's (libargon2), in one run on this machine:
#   1. unlock at cryptsetup's cost: a volume cryptsetup formats with a fixed Argon2id cost
#      (time 4, MEMORY KiB, the parallelism cryptsetup picks here), opened by
#      `cryptsetup open --test-passphrase` and `sectorcrypt test-passphrase`, rounds interleaved;
#   2. `format` with each tool's defaults (calibrated to 2 s): wall time, and the memory cost the
#      calibration chose.
# Prints every round, then medians with their range and the ratios sectorcrypt / cryptsetup.
# Usage: scripts/bench-argon2.sh [ROUNDS (5)] [MEMORY_KIB (524288)]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-5}"
memory="${2:-524288}"
cargo build --release --quiet -p sectorcrypt
sc="$PWD/target/release/sectorcrypt"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
printf 'bench passphrase' >"$dir/pass"
parallel=$(($(nproc) < 4 ? $(nproc) : 4))

seconds() { # run "$@", print its wall time in seconds
    local start end
    start=$(date +%s.%N)
    "$@" >/dev/null 2>&1
    end=$(date +%s.%N)
    echo "$end - $start" | bc -l
}

summary() { # NAME VALUES...: median [min, max]
    local name="$1"
    shift
    printf '%s\n' "$@" | sort -g | awk -v n="$name" '{ v[NR] = $1 }
        END { m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2;
              printf "%-34s median %.3f  range [%.3f, %.3f]\n", n, m, v[1], v[NR]; print m > "/dev/stderr" }'
}

truncate -s 20M "$dir/fixed.img"
cryptsetup luksFormat -q --type luks2 --pbkdf argon2id --pbkdf-force-iterations 4 \
    --pbkdf-memory "$memory" --pbkdf-parallel "$parallel" --key-file "$dir/pass" "$dir/fixed.img"
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) CPUs"
echo "unlock: Argon2id time 4, memory $memory KiB, $parallel lanes (formatted by cryptsetup)"
cs_open=() sc_open=()
for r in $(seq "$rounds"); do
    a=$(seconds cryptsetup open --test-passphrase --key-file "$dir/pass" "$dir/fixed.img")
    b=$(seconds "$sc" test-passphrase --key-file "$dir/pass" "$dir/fixed.img")
    echo "  round $r: cryptsetup $a s, sectorcrypt $b s"
    cs_open+=("$a") sc_open+=("$b")
done

echo "format with the defaults (Argon2id calibrated to 2 s)"
cs_fmt=() sc_fmt=() cs_mem=() sc_mem=()
for r in $(seq "$rounds"); do
    rm -f "$dir/a.img" "$dir/b.img"
    truncate -s 20M "$dir/a.img" "$dir/b.img"
    a=$(seconds cryptsetup luksFormat -q --type luks2 --key-file "$dir/pass" "$dir/a.img")
    b=$(seconds "$sc" format -q --key-file "$dir/pass" "$dir/b.img")
    ma=$(cryptsetup luksDump "$dir/a.img" | awk '/Memory:/ { print $2; exit }')
    mb=$(cryptsetup luksDump "$dir/b.img" | awk '/Memory:/ { print $2; exit }')
    echo "  round $r: cryptsetup $a s ($ma KiB), sectorcrypt $b s ($mb KiB)"
    cs_fmt+=("$a") sc_fmt+=("$b") cs_mem+=("$ma") sc_mem+=("$mb")
done

{
    summary "unlock, cryptsetup (s)" "${cs_open[@]}"
    summary "unlock, sectorcrypt (s)" "${sc_open[@]}"
    summary "format, cryptsetup (s)" "${cs_fmt[@]}"
    summary "format, sectorcrypt (s)" "${sc_fmt[@]}"
    summary "calibrated memory, cryptsetup (KiB)" "${cs_mem[@]}"
    summary "calibrated memory, sectorcrypt (KiB)" "${sc_mem[@]}"
} 2>"$dir/medians"
mapfile -t m <"$dir/medians"
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2fx", a / b }'; }
echo "ratios sectorcrypt / cryptsetup (medians): unlock $(ratio "${m[1]}" "${m[0]}"), format" \
    "$(ratio "${m[3]}" "${m[2]}"), calibrated memory $(ratio "${m[5]}" "${m[4]}")"
