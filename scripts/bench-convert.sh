#!/usr/bin/env bash
# In-place conversion benchmark for docs/BENCHMARKS.md: sectorcrypt's encrypt / decrypt /
# reencrypt against cryptsetup's offline `reencrypt` on the same file, in one run. Each round
# runs both tools back to back on fresh copies of the same input, checks every output (decrypts
# to the original, or opens with cryptsetup), and prints wall times as Markdown with the median
# ratio. Needs scripts/install-test-deps.sh (cryptsetup-bin). Usage:
#   scripts/bench-convert.sh [ROUNDS] [MIB]      (defaults: 3 rounds, 512 MiB)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-3}"
mib="${2:-512}"
cargo build --release --locked -q -p sectorcrypt
sc="$PWD/target/release/sectorcrypt"
work="$(mktemp -d -p "$PWD" bench-convert.XXXXXX)"
trap 'rm -rf "$work"' EXIT
cd "$work"
printf 'benchmark passphrase' > pass
fast=(--pbkdf pbkdf2 --pbkdf-force-iterations 1000)
cs_re=(cryptsetup reencrypt --force-offline-reencrypt --batch-mode --key-file pass)
head -c $((mib << 20)) /dev/urandom > plain
keep=$(((mib - 32) << 20)) # what survives --reduce-device-size 32M

# Seconds taken by a command (its output discarded).
t() { local a b; a=$(date +%s.%N); "$@" > /dev/null; b=$(date +%s.%N); echo "$b - $a" | bc; }
same() { cmp -s -n "$3" "$1" "$2" || { echo "bench-convert: $4: output differs from the original" >&2; exit 1; }; }
fresh() { rm -f "$@"; cp plain d; }

declare -A T
for r in $(seq "$rounds"); do
  # Encryption, detached header.
  fresh d h; T[enc_sc_$r]=$(t "$sc" encrypt d --header h --key-file pass "${fast[@]}" -q)
  cp d enc_detached; cp h enc_detached.hdr
  fresh d h; T[enc_cs_$r]=$(t "${cs_re[@]}" --encrypt --type luks2 --header h "${fast[@]}" d)
  # Decryption, detached header (both from our encryption).
  cp enc_detached d; cp enc_detached.hdr h
  T[dec_sc_$r]=$(t "$sc" decrypt d --header h --key-file pass -q); same d plain $((mib << 20)) "decrypt"
  cp enc_detached d; cp enc_detached.hdr h
  T[dec_cs_$r]=$(t "${cs_re[@]}" --decrypt --header h d); same d plain $((mib << 20)) "cryptsetup decrypt"
  # Reencryption (new volume key), detached header.
  cp enc_detached d; cp enc_detached.hdr h
  T[re_sc_$r]=$(t "$sc" reencrypt d --header h --key-file pass "${fast[@]}" -q)
  cryptsetup open --test-passphrase --header h --key-file pass d
  cp enc_detached d; cp enc_detached.hdr h
  T[re_cs_$r]=$(t "${cs_re[@]}" --header h "${fast[@]}" d)
  # Encryption with the header on the device (--reduce-device-size 32M).
  fresh d; T[sen_sc_$r]=$(t "$sc" encrypt d --reduce-device-size 32M --key-file pass "${fast[@]}" -q)
  cp d enc_shifted
  fresh d; T[sen_cs_$r]=$(t "${cs_re[@]}" --encrypt --type luks2 --reduce-device-size 32M "${fast[@]}" d)
  # Decryption of it, header exported (both from our encryption).
  cp enc_shifted d; rm -f x.hdr
  T[sde_sc_$r]=$(t "$sc" decrypt d --header x.hdr --key-file pass -q); same d plain "$keep" "shifted decrypt"
  cp enc_shifted d; rm -f x.hdr
  T[sde_cs_$r]=$(t "${cs_re[@]}" --decrypt --header x.hdr d); same d plain "$keep" "cryptsetup shifted decrypt"
done

python3 - "$rounds" "$mib" <<PY
import statistics, subprocess, sys
rounds, mib = int(sys.argv[1]), int(sys.argv[2])
T = {$(for k in "${!T[@]}"; do printf '"%s": %s, ' "$k" "${T[$k]}"; done)}
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
cs = subprocess.run(["cryptsetup", "--version"], capture_output=True, text=True).stdout.strip()
print(f"Machine: {cpu}, {subprocess.run(['nproc'], capture_output=True, text=True).stdout.strip()} cores; {cs}; "
      f"{mib} MiB of random bytes, {rounds} rounds, medians (range).\n")
print("| conversion | sectorcrypt | cryptsetup | time ratio (sectorcrypt / cryptsetup) |")
print("|---|---|---|---|")
rows = [("enc", "encrypt, detached header"), ("dec", "decrypt, detached header"),
        ("re", "reencrypt (new key), detached header"),
        ("sen", "encrypt, header on the device (--reduce-device-size 32M)"),
        ("sde", "decrypt of that, header exported (--header NEWFILE)")]
med = statistics.median
for key, label in rows:
    a = [T[f"{key}_sc_{r}"] for r in range(1, rounds + 1)]
    b = [T[f"{key}_cs_{r}"] for r in range(1, rounds + 1)]
    q = [x / y for x, y in zip(a, b)]
    print(f"| {label} | {med(a):.2f} s ({min(a):.2f}-{max(a):.2f}) | {med(b):.2f} s ({min(b):.2f}-{max(b):.2f}) "
          f"| {med(q):.2f}x ({min(q):.2f}-{max(q):.2f}) |")
PY
