#!/usr/bin/env bash
# Peer benchmark for docs/BENCHMARKS.md: sectorcrypt's cipher core against OpenSSL (openssl speed,
# and the newest release's XTS on single data units) and Crypto++ (XTS_Mode) on this machine,
# printed as Markdown with the ratios the cipher-core issue and issue 32 ask for. Every round runs
# the peers and sectorcrypt back to back; the table shows the median over rounds of each rate and
# of each per-round ratio, so a noisy neighbour moves it less.
# Debian's OpenSSL 3.0 has no VAES kernel for XTS; the newest OpenSSL has one, so it is built from
# the source crates.io's `openssl-src` carries (checked against its checksum), once, into
# target/peers/ (about 6 minutes on 2 cores).
# Needs scripts/install-test-deps.sh. Usage: scripts/bench-peers.sh [ROUNDS] [SECONDS_PER_CASE]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-3}"
secs="${2:-1}"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

cargo build --release --locked -q -p sectorcrypt
sc=./target/release/sectorcrypt
g++ -O2 -std=c++17 -o "$out/cryptopp_xts_speed" crates/bench/peers/cryptopp_xts_speed.cpp -lcryptopp

# The newest OpenSSL, static, from openssl-src's copy of its release.
newest_src=400.0.2+4.0.3
newest_sha256=d2093956673b8dbda85c87fa4fb78e70698ce6c5978a2837d1613f661d3bef76
newest=target/peers/openssl-src-$newest_src/openssl
if [ ! -f "$newest/libcrypto.a" ]; then
  echo "bench-peers: building OpenSSL from openssl-src $newest_src (once)" >&2
  mkdir -p target/peers
  curl -sSfL -o "target/peers/openssl-src-$newest_src.crate" \
    "https://static.crates.io/crates/openssl-src/openssl-src-$newest_src.crate"
  echo "$newest_sha256  target/peers/openssl-src-$newest_src.crate" | sha256sum -c --quiet
  tar -xzf "target/peers/openssl-src-$newest_src.crate" -C target/peers
  (cd "$newest" && ./Configure no-shared no-module no-tests no-docs no-legacy no-comp no-zlib \
    linux-x86_64 && make -j"$(nproc)" build_libs) > target/peers/openssl-build.log 2>&1 ||
    { tail -20 target/peers/openssl-build.log >&2; exit 1; }
fi
gcc -O2 -o "$out/newest_xts_speed" crates/bench/peers/openssl_xts_speed.c -I"$newest/include" \
  "$newest/libcrypto.a" -lpthread

for r in $(seq "$rounds"); do
  openssl speed -evp aes-256-xts -bytes 65536 -seconds "$secs" 2>/dev/null | grep '^AES-256-XTS' > "$out/openssl-64k.$r"
  openssl speed -evp aes-256-xts -bytes 512 -seconds "$secs" 2>/dev/null | grep '^AES-256-XTS' > "$out/openssl-512.$r"
  "$out/cryptopp_xts_speed" 4096 "$secs" > "$out/cryptopp.$r"
  for unit in 512 4096 1048576; do
    "$out/newest_xts_speed" "$unit" "$secs"
  done > "$out/newest.$r"
  {
    $sc benchmark --json --seconds "$secs" -c aes-xts-plain64 -s 512 --sector-size 512 --sector-size 4096 \
      --request-size 4096 --request-size 65536 --request-size 1048576
    $sc benchmark --json --seconds "$secs" -c lea-xts-plain64 -s 256 -s 512 --sector-size 4096 --request-size 65536
    $sc benchmark --json --seconds "$secs" -c serpent-xts-plain64 -c twofish-xts-plain64 -c camellia-xts-plain64 \
      -s 512 --sector-size 4096 --request-size 65536
    for t in 1 2; do
      $sc benchmark --json --seconds "$secs" -c aes-xts-plain64 -c lea-xts-plain64 --request-size 1048576 --threads "$t"
    done
  } > "$out/sectorcrypt.$r"
done

python3 - "$out" "$rounds" "$secs" <<'PY'
import json, sys, pathlib, statistics, subprocess
d, rounds, secs = pathlib.Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
def openssl(f):
    return float(d.joinpath(f).read_text().split()[1].rstrip('k')) * 1000
def lines(f):
    return [json.loads(l) for l in d.joinpath(f).read_text().splitlines()]
R = []
for r in range(1, rounds + 1):
    R.append({"o64": openssl(f"openssl-64k.{r}"), "o512": openssl(f"openssl-512.{r}"),
              "cpp": lines(f"cryptopp.{r}"), "ours": lines(f"sectorcrypt.{r}"),
              "newest": lines(f"newest.{r}")})
def ours(rd, cipher, bits, ss, rs, op, threads=1):
    for m in rd["ours"]:
        if (m["cipher"], m["key_bits"], m["sector_size"], m["request_size"], m["op"], m["threads"]) == (cipher, bits, ss, rs, op, threads):
            return m
    raise SystemExit(f"missing measurement {cipher} {bits} {ss} {rs} {op} {threads}")
def cpp(rd, cipher, bits, op):
    return next(m for m in rd["cpp"] if (m["cipher"], m["key_bits"], m["op"]) == (cipher, bits, op))["bytes_per_sec"]
def newest(rd, unit, op):
    return next(m for m in rd["newest"] if (m["sector_size"], m["op"]) == (unit, op))["bytes_per_sec"]
newest_version = R[0]["newest"][0]["version"]
size = lambda b: f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB" if b >= 1024 else f"{b} B"
med = statistics.median
gb = lambda v: f"{v/1e9:.2f}"
def row(label, a, b, peer, target):
    """a, b: per-round functions giving (ours, peer) rates; prints medians and median ratio."""
    ov = [a(rd) for rd in R]; pv = [b(rd) for rd in R]
    ratios = [x / y for x, y in zip(ov, pv)]
    print(f"| {label} | {gb(med(ov))} | {peer} | {gb(med(pv))} | {med(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}) | {target} |")
cpu = next((l.split(":",1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
backend = ours(R[0], "aes-xts-plain64", 512, 512, 65536, "encrypt")["backend"]
lbackend = ours(R[0], "lea-xts-plain64", 512, 4096, 65536, "encrypt")["backend"]
print(f"Machine: {cpu}, {subprocess.run(['nproc'],capture_output=True,text=True).stdout.strip()} cores; "
      f"{subprocess.run(['openssl','version'],capture_output=True,text=True).stdout.strip()}; Crypto++ 8.7 (Debian libcrypto++-dev). "
      f"{rounds} rounds of {secs} s per case; AES backend `{backend}`, LEA backend `{lbackend}`.\n")
print("| measurement (one thread unless stated) | sectorcrypt GB/s | peer | peer GB/s | ratio, median (range) | target |")
print("|---|---|---|---|---|---|")
for op in ("encrypt", "decrypt"):
    row(f"AES-XTS 512-bit key, 512 B sectors, 64 KiB requests, {op}",
        lambda rd: ours(rd, "aes-xts-plain64", 512, 512, 65536, op)["bytes_per_sec"], lambda rd: rd["o64"],
        "`openssl speed -evp aes-256-xts -bytes 65536`", ">= 2.0x")
for op in ("encrypt", "decrypt"):
    row(f"AES-XTS 512-bit key, 512 B sectors, 4 KiB requests, {op}",
        lambda rd: ours(rd, "aes-xts-plain64", 512, 512, 4096, op)["bytes_per_sec"], lambda rd: rd["o512"],
        "`openssl speed -evp aes-256-xts -bytes 512`", "")
for ss, rs, unit in ((4096, 1048576, 1048576), (512, 1048576, 1048576), (4096, 4096, 4096),
                     (512, 4096, 512)):
    for op in ("encrypt", "decrypt"):
        row(f"AES-XTS 512-bit key, {ss} B sectors, {size(rs)} requests, {op}",
            lambda rd: ours(rd, "aes-xts-plain64", 512, ss, rs, op)["bytes_per_sec"],
            lambda rd: newest(rd, unit, op),
            f"OpenSSL {newest_version} XTS, one {size(unit)} unit per call",
            "issue 32: at its rate")
for rs, target in ((1048576, "issue 32: 1.0x"), (65536, ">= 0.95x"), (4096, ">= 0.9x")):
    for op in ("encrypt", "decrypt"):
        row(f"AES-XTS 512-bit key, {size(rs)} requests, {op}: 512 B sectors vs 4096 B sectors",
            lambda rd: ours(rd, "aes-xts-plain64", 512, 512, rs, op)["bytes_per_sec"],
            lambda rd: ours(rd, "aes-xts-plain64", 512, 4096, rs, op)["bytes_per_sec"],
            "sectorcrypt, 4096 B sectors", target)
for bits in (256, 512):
    for op in ("encrypt", "decrypt"):
        row(f"LEA-XTS {bits}-bit key, 4096 B sectors, 64 KiB requests, {op}",
            lambda rd: ours(rd, "lea-xts-plain64", bits, 4096, 65536, op)["bytes_per_sec"],
            lambda rd: cpp(rd, "lea-xts-plain64", bits, op), "Crypto++ `XTS_Mode<LEA>`, 4096 B units", ">= 6x")
mb = lambda v: f"{v/1e6:.1f} MB/s"
for cipher in ("serpent-xts-plain64", "twofish-xts-plain64", "camellia-xts-plain64"):
    for op in ("encrypt", "decrypt"):
        ov = [ours(rd, cipher, 512, 4096, 65536, op)["bytes_per_sec"] for rd in R]
        pv = [cpp(rd, cipher, 512, op) for rd in R]
        ratios = [x / y for x, y in zip(ov, pv)]
        print(f"| {cipher} 512-bit key, 4096 B sectors, 64 KiB requests, {op} | {mb(med(ov))} | "
              f"Crypto++ `XTS_Mode`, 4096 B units | {mb(med(pv))} | {med(ratios):.2f}x "
              f"({min(ratios):.2f}-{max(ratios):.2f}) | (issue 14: none) |")
for cipher in ("aes-xts-plain64", "lea-xts-plain64"):
    for op in ("encrypt", "decrypt"):
        row(f"{cipher} 512-bit key, 1 MiB requests, {op}: 2 threads vs 1",
            lambda rd: ours(rd, cipher, 512, 512, 1048576, op, 2)["bytes_per_sec"],
            lambda rd: ours(rd, cipher, 512, 512, 1048576, op, 1)["bytes_per_sec"],
            "sectorcrypt, 1 thread", ">= 1.8x")
PY
