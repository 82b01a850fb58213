#!/usr/bin/env bash
# Authenticated encryption against plain AES-XTS through `sectorcrypt serve` (issue 34):
#
#   scripts/bench-integrity.sh [ROUNDS] [SECONDS] [CONTENDER...]   (defaults 2, 10 and all)
#
# The same 1 GiB payload in LUKS2 volumes with 4096-byte sectors: aes-xts-plain64, and with
# --integrity hmac-sha256 (over aes-xts-plain64), aead (aes-gcm-random) and poly1305
# (chacha20-random), each served with dm-integrity's journal and with --integrity-no-journal.
# Per round and contender, with fio's nbd engine: 1 GiB written (1 MiB requests, 8 in flight,
# flushed at the end) and read back, each under a server of its own whose CPU seconds are taken;
# then 128 KiB sequential reads and writes (8 in flight) for SECONDS each over that GiB. Each
# contender has an image of its own, so that what one leaves in the page cache (or, writing past
# it, does not) is not what the next one finds. Prints a Markdown table: medians, with the ratio
# to aes-xts of the same round. Images go to $BENCH_DIR (default target/bench-integrity), about
# 1.1 GiB per contender.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-2}"
secs="${2:-10}"
for c in "${@:3}"; do
  case "$c" in
  xts | hmac-journal | hmac-direct | gcm-journal | gcm-direct | chacha-journal | chacha-direct) ;;
  *)
    echo "bench-integrity.sh: no contender '$c' (xts, {hmac,gcm,chacha}-{journal,direct})" >&2
    exit 2
    ;;
  esac
done
dir="${BENCH_DIR:-target/bench-integrity}"
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
gib=$((1 << 30))
make_image() { # name, then format options; 1 GiB of payload at least
  local img="$dir/$1.img"
  shift
  rm -f "$img"
  truncate -s $((gib + (64 << 20))) "$img"
  "$sc" format "$img" --key-file "$key" --pbkdf pbkdf2 --pbkdf-force-iterations 1000 -q \
    --sector-size 4096 "$@"
}
contenders=(xts hmac-journal hmac-direct gcm-journal gcm-direct chacha-journal chacha-direct)
if [ $# -gt 2 ]; then # a subset: xts always, as the reference
  contenders=(xts)
  for c in "${@:3}"; do
    [ "$c" = xts ] || contenders+=("$c")
  done
fi
for c in "${contenders[@]}"; do
  case "$c" in
  xts) make_image xts ;;
  hmac-*) make_image "$c" --integrity hmac-sha256 --integrity-no-wipe ;;
  gcm-*) make_image "$c" --integrity aead --cipher aes-gcm-random --integrity-no-wipe ;;
  chacha-*) make_image "$c" --integrity poly1305 --cipher chacha20-random --integrity-no-wipe ;;
  esac
done

bench=bench-integrity
source scripts/bench-server.sh
server_cmd() { # contender -> command
  local serve="$sc serve --key-file $key --socket $sock $dir/$1.img"
  case "$1" in
  *-direct) echo "$serve --integrity-no-journal" ;;
  *) echo "$serve" ;;
  esac
}
fio_run() { # name, then fio options: one job on the served volume, JSON to $out/NAME.json
  local name=$1
  shift
  fio --name=bench --ioengine=nbd --uri="$uri" --iodepth=8 --size=1g "$@" \
    --output-format=json >"$out/$name.json"
}

for r in $(seq "$rounds"); do
  for c in "${contenders[@]}"; do
    # shellcheck disable=SC2046
    start $(server_cmd "$c")
    fio_run "gib.$r.$c.write" --rw=write --bs=1m --end_fsync=1
    stop
    write_cpu=$cpu
    # shellcheck disable=SC2046
    start $(server_cmd "$c")
    fio_run "gib.$r.$c.read" --rw=read --bs=1m
    stop
    read_cpu=$cpu
    # shellcheck disable=SC2046
    start $(server_cmd "$c")
    for w in read write; do
      fio_run "fio.$r.$c.$w" --rw="$w" --bs=128k --time_based --runtime="$secs" --ramp_time=1
    done
    stop
    echo "{\"round\":$r,\"contender\":\"$c\",\"write_cpu\":$write_cpu,\"read_cpu\":$read_cpu}" >>"$out/cpu.jsonl"
  done
done

python3 - "$out" "$rounds" "${contenders[@]}" <<'PY'
import json, pathlib, statistics, subprocess, sys
out, rounds, contenders = pathlib.Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
med = statistics.median
cpu = [json.loads(l) for l in (out / "cpu.jsonl").read_text().splitlines()]
def row(c, r):
    return next(m for m in cpu if m["contender"] == c and m["round"] == r)
def fio(c, r, w, kind="fio"):
    text = (out / f"{kind}.{r}.{c}.{w}.json").read_text()
    j = json.loads(text[text.index("{"):])["jobs"][0]  # after fio's "connected" line, if any
    return j[w]["bw"] / 1024  # MiB/s
model = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
nproc = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
print(f"Machine: {model}, {nproc} cores; {rounds} rounds; medians, ratio to aes-xts in the same round.\n")
print("| contender | 1 GiB write MiB/s | x xts | 1 GiB read MiB/s | x xts | server CPU s/GiB write | read | 128K read MiB/s | x xts | 128K write MiB/s | x xts |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for c in contenders:
    rs = range(1, rounds + 1)
    cells = []
    for w in ("write", "read"):
        bw = [fio(c, r, w, "gib") for r in rs]
        ratio = [fio(c, r, w, "gib") / fio("xts", r, w, "gib") for r in rs]
        cells += [f"{med(bw):.0f}", f"{med(ratio):.2f}x"]
    cells += [f"{med([row(c, r)['write_cpu'] for r in rs]):.2f}", f"{med([row(c, r)['read_cpu'] for r in rs]):.2f}"]
    for w in ("read", "write"):
        bw = [fio(c, r, w) for r in rs]
        ratio = [fio(c, r, w) / fio("xts", r, w) for r in rs]
        cells += [f"{med(bw):.0f}", f"{med(ratio):.2f}x"]
    print(f"| {c} | " + " | ".join(cells) + " |")
PY
