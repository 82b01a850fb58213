#!/usr/bin/env bash
# Peer benchmark for docs/BENCHMARKS.md: sectorcrypt's cipher core against OpenSSL (openssl speed)
# and Crypto++ (XTS_Mode<LEA>) in one run on this machine, printed as Markdown with the ratios the
# cipher-core issue asks for. Needs scripts/install-test-deps.sh. Takes about two minutes.
# Usage: scripts/bench-peers.sh [SECONDS_PER_CASE]
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-2}"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

cargo build --release --locked -q -p sectorcrypt
sc=./target/release/sectorcrypt
g++ -O2 -std=c++17 -o "$out/cryptopp_xts_speed" crates/bench/peers/cryptopp_xts_speed.cpp -lcryptopp

# Run the peers and sectorcrypt back to back, so they see the same machine state.
openssl speed -evp aes-256-xts -bytes 65536 -seconds "$secs" 2>/dev/null | grep '^AES-256-XTS' > "$out/openssl-64k"
openssl speed -evp aes-256-xts -bytes 512 -seconds "$secs" 2>/dev/null | grep '^AES-256-XTS' > "$out/openssl-512"
"$out/cryptopp_xts_speed" 4096 "$secs" > "$out/cryptopp.jsonl"
{
  $sc benchmark --json --seconds "$secs" -c aes-xts-plain64 -s 512 --sector-size 512 --sector-size 4096 \
    --request-size 4096 --request-size 65536
  $sc benchmark --json --seconds "$secs" -c lea-xts-plain64 -s 256 -s 512 --sector-size 4096 --request-size 65536
  $sc benchmark --json --seconds "$secs" -c aes-xts-plain64 -s 512 --request-size 1048576 --threads 1
  $sc benchmark --json --seconds "$secs" -c aes-xts-plain64 -s 512 --request-size 1048576 --threads 2
} > "$out/sectorcrypt.jsonl"

python3 - "$out" <<'PY'
import json, sys, pathlib, platform, subprocess
d = pathlib.Path(sys.argv[1])
def openssl(f):
    return float(d.joinpath(f).read_text().split()[1].rstrip('k')) * 1000
ours = [json.loads(l) for l in d.joinpath("sectorcrypt.jsonl").read_text().splitlines()]
cpp = [json.loads(l) for l in d.joinpath("cryptopp.jsonl").read_text().splitlines()]
def get(cipher, bits, ss, rs, op, threads=1):
    for m in ours:
        if (m["cipher"], m["key_bits"], m["sector_size"], m["request_size"], m["op"], m["threads"]) == (cipher, bits, ss, rs, op, threads):
            return m
    raise SystemExit(f"missing measurement {cipher} {bits} {ss} {rs} {op} {threads}")
def peer(cipher, bits, op):
    return next(m for m in cpp if (m["cipher"], m["key_bits"], m["op"]) == (cipher, bits, op))["bytes_per_sec"]
gb = lambda v: f"{v/1e9:.2f}"
cpu = next((l.split(":",1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
print(f"Machine: {cpu}, {subprocess.run(['nproc'],capture_output=True,text=True).stdout.strip()} cores; "
      f"{subprocess.run(['openssl','version'],capture_output=True,text=True).stdout.strip()}; Crypto++ (Debian libcrypto++-dev).\n")
o64, o512 = openssl("openssl-64k"), openssl("openssl-512")
print("| measurement | sectorcrypt GB/s | backend | peer | peer GB/s | ratio | target |")
print("|---|---|---|---|---|---|---|")
for op in ("encrypt", "decrypt"):
    m = get("aes-xts-plain64", 512, 512, 65536, op)
    print(f"| AES-XTS-512, 512 B sectors, 64 KiB requests, {op} | {gb(m['bytes_per_sec'])} | {m['backend']} | `openssl speed -evp aes-256-xts -bytes 65536` (encrypt) | {gb(o64)} | {m['bytes_per_sec']/o64:.2f}x | >= 2.0x |")
for op in ("encrypt", "decrypt"):
    m = get("aes-xts-plain64", 512, 512, 4096, op)
    print(f"| AES-XTS-512, 512 B sectors, 4 KiB requests, {op} | {gb(m['bytes_per_sec'])} | {m['backend']} | `openssl speed -evp aes-256-xts -bytes 512` (encrypt) | {gb(o512)} | {m['bytes_per_sec']/o512:.2f}x | |")
for rs, target in ((65536, "0.95x"), (4096, "0.9x")):
    for op in ("encrypt", "decrypt"):
        a, b = get("aes-xts-plain64", 512, 512, rs, op), get("aes-xts-plain64", 512, 4096, rs, op)
        print(f"| AES-XTS-512, {rs//1024} KiB requests, {op}: 512 B vs 4096 B sectors | {gb(a['bytes_per_sec'])} | {a['backend']} | same, 4096 B sectors | {gb(b['bytes_per_sec'])} | {a['bytes_per_sec']/b['bytes_per_sec']:.2f}x | >= {target} |")
for bits in (256, 512):
    for op in ("encrypt", "decrypt"):
        m = get("lea-xts-plain64", bits, 4096, 65536, op)
        p = peer("lea-xts-plain64", bits, op)
        print(f"| LEA-XTS-{bits}, 4096 B units, {op} | {gb(m['bytes_per_sec'])} | {m['backend']} | Crypto++ `XTS_Mode<LEA>` | {gb(p)} | {m['bytes_per_sec']/p:.2f}x | >= 6x |")
for op in ("encrypt", "decrypt"):
    one, two = get("aes-xts-plain64", 512, 512, 1048576, op, 1), get("aes-xts-plain64", 512, 512, 1048576, op, 2)
    print(f"| AES-XTS-512, 1 MiB requests, {op}: 2 threads vs 1 | {gb(two['bytes_per_sec'])} | {two['backend']} | same, 1 thread | {gb(one['bytes_per_sec'])} | {two['bytes_per_sec']/one['bytes_per_sec']:.2f}x | >= 1.8x |")
PY
