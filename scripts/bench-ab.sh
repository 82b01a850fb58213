#!/usr/bin/env bash
# Same-run A/B of two sectorcrypt builds' cipher kernels, for changes that must not cost speed
# (a refactoring of a kernel, a new compiler): both binaries run `sectorcrypt benchmark` on every
# SIMD backend this CPU has and on the CBC and XTS modes, alternating per round, and the medians
# over rounds are printed as a Markdown table with their ratio (after/before).
#
# Usage: scripts/bench-ab.sh BEFORE_BINARY AFTER_BINARY [ROUNDS] [SECONDS_PER_CASE]
# Build the "before" binary from an older commit, e.g.
#   git worktree add /tmp/before <rev> && CARGO_TARGET_DIR=/tmp/before-target \
#     cargo build --release -p sectorcrypt --manifest-path /tmp/before/Cargo.toml
set -euo pipefail
before=${1:?before binary}
after=${2:?after binary}
rounds=${3:-3}
seconds=${4:-0.4}

# Kernel functions (sectorcrypt_cipher::aes::*, ::lea::*) whose instructions differ.
kernels() {
  objdump -d --no-show-raw-insn -C "$1" | awk '
    /^[0-9a-f]+ <.*sectorcrypt_cipher::(aes|lea)::/ { p = 1; sub(/^[0-9a-f]+ /, ""); print; next }
    /^[0-9a-f]+ </ { p = 0 }
    p { $1 = ""; print }' |
    sed -E 's/\b[0-9a-f]{5,}\b/ADDR/g; s/\+0x[0-9a-f]+>/>/g; s/-?0x[0-9a-f]+\(%rip\)/RIP/g;
            s/anon\.ADDR\.[0-9]+\.llvm/anon/g'
}
python3 - <(kernels "$before") <(kernels "$after") <<'PY'
import sys

def functions(path):
    out, name = {}, None
    for line in open(path):
        if line.startswith("<"):
            name = line.strip()
            out[name] = []
        elif name:
            out[name].append(line)
    return out

old, new = functions(sys.argv[1]), functions(sys.argv[2])
changed = [n for n in sorted(set(old) | set(new)) if old.get(n) != new.get(n)]
print(f"Cipher kernel functions: {len(new)}; machine code changed in {len(changed)}:")
for n in changed:
    print(f"- {n.strip('<>:')}: {len(old.get(n, []))} -> {len(new.get(n, []))} instructions")
print()
PY

jobs=()
for be in aesni vaes256 vaes512; do
  if "$after" benchmark --backend "$be" -c aes-ecb --seconds 0.01 >/dev/null 2>&1; then
    jobs+=("$be|aes-xts-plain64 -s 256 -s 512" "$be|aes-cbc-essiv:sha256 -s 128 -s 256")
  fi
done
for be in avx2 avx512; do
  if "$after" benchmark --backend "$be" -c lea-ecb --seconds 0.01 >/dev/null 2>&1; then
    jobs+=("$be|lea-xts-plain64 -s 256 -s 512" "$be|lea-cbc-essiv:sha256 -s 256")
  fi
done

out=$(mktemp)
trap 'rm -f "$out"' EXIT
for ((round = 1; round <= rounds; round++)); do
  for which in before after; do
    bin=$before
    [ "$which" = after ] && bin=$after
    for job in "${jobs[@]}"; do
      be=${job%%|*}
      # shellcheck disable=SC2086 # the spec carries its own -s options
      "$bin" benchmark --json --seconds "$seconds" --backend "$be" -c ${job#*|} \
        --sector-size 512 --sector-size 4096 | sed "s/^/$which /" >>"$out"
    done
  done
done

python3 - "$out" <<'PY'
import collections, json, statistics, sys

runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    which, row = line.split(" ", 1)
    r = json.loads(row)
    key = (r["backend"], r["cipher"], r["key_bits"], r["sector_size"], r["op"])
    runs[key + (which,)].append(r["bytes_per_sec"] / 2**20)
print("| backend | cipher | key bits | sector | op | before MiB/s | after MiB/s | after/before |")
print("|---|---|---|---|---|---|---|---|")
ratios = []
for key in sorted({k[:5] for k in runs}):
    b = statistics.median(runs[key + ("before",)])
    a = statistics.median(runs[key + ("after",)])
    ratios.append(a / b)
    print("| " + " | ".join(map(str, key)) + f" | {b:.0f} | {a:.0f} | {a / b:.3f} |")
print(f"\nafter/before: median {statistics.median(ratios):.3f}, "
      f"range {min(ratios):.3f}-{max(ratios):.3f} over {len(ratios)} cases")
PY
