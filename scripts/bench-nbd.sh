#!/usr/bin/env bash
# NBD benchmark for docs/BENCHMARKS.md (issue: volume layer and exports), printed as Markdown.
#
# 1. Server CPU seconds per GiB for a sequential 1 GiB write and read with nbdcopy (1 MiB requests,
#    8 in flight, one connection): plain `nbdkit file`, sectorcrypt (LUKS2 aes-xts-plain64 with
#    4096-byte sectors, and the LUKS1 image with 512-byte sectors), nbdkit's luks filter and
#    qemu-nbd with LUKS (both LUKS1-only, so on the LUKS1 image). CPU is the server process's
#    whole-life user+system time from wait4's rusage (all threads, microseconds; /proc's clock
#    ticks are too coarse), one server per copy, less the same server's cost of starting,
#    unlocking and stopping with no copy.
# 2. fio through its nbd engine: sectorcrypt with aes-xts-plain64 against the same server with
#    cipher_null-ecb (same format, sector size and code path): 4 KiB QD1 random read/write
#    latency, 4 KiB QD64 random 70/30, 128 KiB QD8 sequential read and write.
#
# Every round runs each contender back to back; tables show medians over rounds (ratios per
# round, then their median). All images live on one file system (BENCH_DIR, default
# target/bench-nbd) and are written once before measuring, so no run pays for block allocation.
# Needs scripts/install-test-deps.sh. Usage: scripts/bench-nbd.sh [ROUNDS] [FIO_SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-3}"
secs="${2:-10}"
dir="${BENCH_DIR:-target/bench-nbd}"
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"
out="$dir/results"
rm -rf "$out"
mkdir -p "$out"
sock="$dir/nbd.sock"
uri="nbd+unix:///?socket=$sock"
server=""
trap 'if [ -n "$server" ]; then kill "$server" 2>/dev/null || true; fi' EXIT

cargo build --release --locked -q -p sectorcrypt
sc="$PWD/target/release/sectorcrypt"
key="$dir/passphrase"
printf 'benchmark passphrase' >"$key"
fmt=(--key-file "$key" --pbkdf pbkdf2 --pbkdf-force-iterations 1000 -q)

gib=$((1 << 30))
if [ ! -f "$dir/source.raw" ]; then head -c "$gib" /dev/urandom >"$dir/source.raw"; fi
make_image() { # name, then format options (none = plain)
  local img="$dir/$1.img"
  shift
  rm -f "$img"
  if [ $# -eq 0 ]; then
    truncate -s "$gib" "$img"
  else
    # 16 MiB covers any header; the payload is then at least 1 GiB.
    truncate -s $((gib + (16 << 20))) "$img"
    "$sc" format "$img" "${fmt[@]}" "$@"
  fi
}
make_image plain
make_image luks2 --cipher aes-xts-plain64 --sector-size 4096
make_image null2 --cipher cipher_null-ecb --sector-size 4096
make_image luks1 --type luks1 --cipher aes-xts-plain64

bench=bench-nbd
# shellcheck source=scripts/bench-server.sh
source scripts/bench-server.sh
server_cmd() { # contender name -> command
  case "$1" in
  nbdkit-file) echo "nbdkit -f -U $sock file $dir/plain.img" ;;
  sectorcrypt-luks2) echo "$sc serve $dir/luks2.img --key-file $key --socket $sock" ;;
  sectorcrypt-luks1) echo "$sc serve $dir/luks1.img --key-file $key --socket $sock" ;;
  nbdkit-luks) echo "nbdkit -f -U $sock --filter=luks file $dir/luks1.img passphrase=+$key" ;;
  qemu-nbd-luks) echo "qemu-nbd -t -k $sock --cache=writeback --object secret,id=sec0,file=$key --image-opts driver=luks,key-secret=sec0,file.driver=file,file.filename=$dir/luks1.img" ;;
  sectorcrypt-null2) echo "$sc serve $dir/null2.img --key-file $key --socket $sock" ;;
  esac
}
copy=(nbdcopy -C 1 --requests=8 --request-size=1048576)

contenders=(nbdkit-file sectorcrypt-luks2 sectorcrypt-luks1 nbdkit-luks qemu-nbd-luks)
# Write every image once, unmeasured.
for c in "${contenders[@]}" sectorcrypt-null2; do
  # shellcheck disable=SC2046
  start $(server_cmd "$c")
  "${copy[@]}" --flush "$dir/source.raw" "$uri"
  stop
done

for r in $(seq "$rounds"); do
  for c in "${contenders[@]}"; do
    # shellcheck disable=SC2046
    idle $(server_cmd "$c")
    idle=$cpu
    # shellcheck disable=SC2046
    start $(server_cmd "$c")
    "${copy[@]}" --flush "$dir/source.raw" "$uri"
    stop
    write=$cpu
    # shellcheck disable=SC2046
    start $(server_cmd "$c")
    "${copy[@]}" "$uri" null:
    stop
    read=$cpu
    echo "{\"round\":$r,\"server\":\"$c\",\"idle\":$idle,\"write\":$write,\"read\":$read}" >>"$out/cpu.jsonl"
  done
  for c in sectorcrypt-luks2 sectorcrypt-null2; do
    # shellcheck disable=SC2046
    start $(server_cmd "$c")
    for w in "randread 4k 1" "randwrite 4k 1" "randrw 4k 64" "read 128k 8" "write 128k 8"; do
      set -- $w
      fio --name=bench --ioengine=nbd --uri="$uri" --rw="$1" --rwmixread=70 --bs="$2" \
        --iodepth="$3" --size=1g --time_based --runtime="$secs" --ramp_time=1 \
        --output-format=json >"$out/fio.$r.$c.$1-$2-$3.json"
    done
    stop
  done
done

python3 - "$out" "$rounds" <<'PY'
import json, sys, pathlib, statistics, subprocess
out, rounds = pathlib.Path(sys.argv[1]), int(sys.argv[2])
med = statistics.median
cpu = [json.loads(l) for l in (out / "cpu.jsonl").read_text().splitlines()]
def sec(server, op, r):
    m = next(m for m in cpu if m["server"] == server and m["round"] == r)
    return m[op] - m["idle"]
model = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
nproc = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
print(f"Machine: {model}, {nproc} cores; {rounds} rounds.\n")
print("Server CPU seconds per GiB, nbdcopy 1 GiB, 1 MiB requests, 8 in flight (median; ratio to nbdkit file, median of per-round ratios):\n")
print("| server | image | write s/GiB | x nbdkit file | read s/GiB | x nbdkit file |")
print("|---|---|---|---|---|---|")
images = {"nbdkit-file": "raw", "sectorcrypt-luks2": "LUKS2 aes-xts-plain64, 4096-byte sectors",
          "sectorcrypt-luks1": "LUKS1 aes-xts-plain64, 512-byte sectors",
          "nbdkit-luks": "same LUKS1 image", "qemu-nbd-luks": "same LUKS1 image"}
for s, img in images.items():
    cells = []
    for op in ("write", "read"):
        v = [sec(s, op, r) for r in range(1, rounds + 1)]
        base = [sec("nbdkit-file", op, r) for r in range(1, rounds + 1)]
        ratios = [a / b for a, b in zip(v, base)]
        cells += [f"{med(v):.3f}", f"{med(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"]
    print(f"| {s} | {img} | " + " | ".join(cells) + " |")

def fio(r, c, w):
    text = (out / f"fio.{r}.{c}.{w}.json").read_text()
    # fio's nbd engine prints a line of its own before the JSON.
    return json.loads(text[text.index("{"):])["jobs"][0]
print("\nfio nbd engine, sectorcrypt aes-xts-plain64 against the same server with cipher_null-ecb (LUKS2, 4096-byte sectors; median over rounds, ratio = median of per-round ratios):\n")
print("| workload | metric | aes-xts-plain64 | cipher_null-ecb | ratio | target |")
print("|---|---|---|---|---|---|")
def row(w, label, get, unit, target):
    a = [get(fio(r, "sectorcrypt-luks2", w)) for r in range(1, rounds + 1)]
    n = [get(fio(r, "sectorcrypt-null2", w)) for r in range(1, rounds + 1)]
    ratios = [x / y for x, y in zip(a, n)]
    print(f"| {w} | {label} | {med(a):.1f} {unit} | {med(n):.1f} {unit} | {med(ratios):.3f}x ({min(ratios):.3f}-{max(ratios):.3f}) | {target} |")
for w, op in (("randread-4k-1", "read"), ("randwrite-4k-1", "write")):
    row(w, "latency mean", lambda j: j[op]["lat_ns"]["mean"] / 1000, "µs", "<= 1.1x")
    row(w, "latency p99", lambda j: j[op]["clat_ns"]["percentile"]["99.000000"] / 1000, "µs", "<= 1.1x")
row("randrw-4k-64", "IOPS (read+write)", lambda j: j["read"]["iops"] + j["write"]["iops"], "", ">= 0.9x")
row("read-128k-8", "bandwidth", lambda j: j["read"]["bw_bytes"] / 2**20, "MiB/s", ">= 0.9x")
row("write-128k-8", "bandwidth", lambda j: j["write"]["bw_bytes"] / 2**20, "MiB/s", ">= 0.9x")
PY
