#!/usr/bin/env bash
# RBD benchmark for docs/BENCHMARKS.md (issue 16), printed as Markdown. One run on the project's
# own single-node cluster (scripts/ceph-cluster.sh: one monitor, one OSD, same machine).
#
# 1. I/O through NBD with fio's nbd engine as the one client for every contender, 1 GiB volumes:
#    sequential 1 MiB writes and reads (8 in flight) and random 4 KiB writes and reads (32 in
#    flight), RUNTIME seconds each. Contenders:
#    - sectorcrypt-aes:  `sectorcrypt serve rbd:rbd/aes` (LUKS2 aes-xts-plain64, 4096-byte sectors);
#    - sectorcrypt-null: the same server on a cipher_null-ecb image (same format and code path);
#    - qemu-nbd-luks2:   qemu-nbd over qemu's rbd driver with `encrypt.format=luks2`: librbd's own
#                        encryption, on the very image sectorcrypt-aes serves;
#    - qemu-nbd-plain:   qemu-nbd over an unencrypted image (reference: what RBD gives).
#    Client CPU (the RBD client: the server process) per GiB moved: its whole-life user+system
#    time from wait4's rusage, one server per workload, less the same server's cost of starting,
#    unlocking and stopping with no I/O. Each image is written in full once before measuring.
# 2. Unlock of an image made by `rbd encryption format luks2` (librbd's defaults: Argon2id with
#    up to 1 GiB): wall time and peak RSS of `sectorcrypt test-passphrase rbd:...` against python3-rbd's
#    `encryption_load`, and the same Python process opening the image without loading.
#
# Every round runs each contender back to back; tables show medians over rounds. Needs
# scripts/install-test-deps.sh (Ceph, fio, qemu-block-extra, python3-rbd).
# Usage: scripts/bench-rbd.sh [ROUNDS] [RUNTIME]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-3}"
secs="${2:-10}"
dir="${BENCH_DIR:-target/bench-rbd}"
rm -rf "$dir"
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"
out="$dir/results"
mkdir -p "$out"
sock="$dir/nbd.sock"
uri="nbd+unix:///?socket=$sock"
server=""
cleanup() {
  if [ -n "$server" ]; then kill "$server" 2>/dev/null || true; fi
  bash scripts/ceph-cluster.sh stop "$dir/cluster" || true
}
trap cleanup EXIT

cargo build --release --locked -q -p sectorcrypt --features rbd
sc="$PWD/target/release/sectorcrypt"
# The cluster's daemons on the upper half of the CPUs, the client side (fio and the server
# under test) on the lower half, as on separate machines: the OSD does not take the cycles the
# encryption needs, nor the other way round.
cpus="$(nproc)"
pin_cluster=()
pin_client=()
if [ "$cpus" -ge 2 ]; then
  pin_client=(taskset -c "0-$((cpus / 2 - 1))")
  pin_cluster=(taskset -c "$((cpus / 2))-$((cpus - 1))")
fi
eval "$("${pin_cluster[@]}" bash scripts/ceph-cluster.sh start "$dir/cluster" "${BENCH_CEPH_PORT:-3320}")"
key="$dir/passphrase"
printf 'benchmark passphrase' >"$key"
fast=(--key-file "$key" --pbkdf-memory 65536 --iter-time 200 -q)

gib=$((1 << 30))
head -c "$gib" /dev/urandom >"$dir/source.raw"
# 16 MiB of header, then 1 GiB of data.
rbd create --size 1040M rbd/aes
rbd create --size 1040M rbd/null
rbd create --size 1G rbd/plain
"$sc" format rbd:rbd/aes "${fast[@]}" --cipher aes-xts-plain64 --sector-size 4096
"$sc" format rbd:rbd/null "${fast[@]}" --cipher cipher_null-ecb --sector-size 4096

bench=bench-rbd
# shellcheck source=scripts/bench-server.sh
source scripts/bench-server.sh
qemu_nbd() { # image-opts
  echo "qemu-nbd --persistent -k $sock --object secret,id=sec0,file=$key --image-opts driver=rbd,pool=rbd,conf=$CEPH_CONF,$1"
}
server_cmd() { # contender -> command
  case "$1" in
  sectorcrypt-aes) echo "$sc serve rbd:rbd/aes --key-file $key --socket $sock" ;;
  sectorcrypt-null) echo "$sc serve rbd:rbd/null --key-file $key --socket $sock" ;;
  qemu-nbd-luks2) qemu_nbd "image=aes,encrypt.format=luks2,encrypt.key-secret=sec0" ;;
  qemu-nbd-plain) qemu_nbd "image=plain" ;;
  esac
}
contenders=(sectorcrypt-aes sectorcrypt-null qemu-nbd-luks2 qemu-nbd-plain)
workloads=("write 1m 8" "read 1m 8" "randwrite 4k 32" "randread 4k 32")

# Write every image in full once, unmeasured (qemu-nbd-luks2 shares sectorcrypt-aes's image).
for c in sectorcrypt-aes sectorcrypt-null qemu-nbd-plain; do
  # shellcheck disable=SC2046
  start $(server_cmd "$c")
  "${pin_client[@]}" nbdcopy --flush --requests=8 --request-size=1048576 "$dir/source.raw" "$uri"
  stop
done

for r in $(seq "$rounds"); do
  for c in "${contenders[@]}"; do
    # shellcheck disable=SC2046
    idle $(server_cmd "$c")
    echo "{\"round\":$r,\"server\":\"$c\",\"workload\":\"idle\",\"cpu\":$cpu}" >>"$out/cpu.jsonl"
    for w in "${workloads[@]}"; do
      set -- $w
      # shellcheck disable=SC2046
      start $(server_cmd "$c")
      "${pin_client[@]}" fio --name=bench --ioengine=nbd --uri="$uri" --rw="$1" --bs="$2" --iodepth="$3" \
        --size=1g --time_based --runtime="$secs" --ramp_time=1 --randseed=16 \
        --output-format=json >"$out/fio.$r.$c.$1.json"
      stop
      echo "{\"round\":$r,\"server\":\"$c\",\"workload\":\"$1\",\"cpu\":$cpu}" >>"$out/cpu.jsonl"
    done
  done
done

# Unlock: librbd's own format (Argon2id, 1 GiB), opened here and by librbd.
rbd create --size 64M rbd/made-by-librbd
rbd encryption format rbd/made-by-librbd luks2 "$key"
"$sc" dump rbd:rbd/made-by-librbd | grep -E '^\s*(PBKDF|Memory|Time cost|Threads):' | head -4 >"$out/pbkdf.txt"
load_py='
import sys, rados, rbd
conf, key, load = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
with rados.Rados(conffile=conf) as c, c.open_ioctx("rbd") as io, rbd.Image(io, "made-by-librbd") as im:
    if load:
        im.encryption_load(rbd.RBD_ENCRYPTION_FORMAT_LUKS2, open(key, "rb").read())
'
timed() { # label, command... -> a JSON line with wall seconds and peak RSS (KiB)
  local label="$1"
  shift
  "${pin_client[@]}" /usr/bin/time -f "{\"what\":\"$label\",\"secs\":%e,\"kib\":%M}" -o "$out/time.json" "$@" >/dev/null
  cat "$out/time.json" >>"$out/unlock.jsonl"
}
for _ in $(seq "$rounds"); do
  timed sectorcrypt "$sc" test-passphrase rbd:rbd/made-by-librbd --key-file "$key"
  timed librbd /usr/bin/python3 -c "$load_py" "$CEPH_CONF" "$key" 1
  timed python-baseline /usr/bin/python3 -c "$load_py" "$CEPH_CONF" "$key" 0
done

/usr/bin/python3 - "$out" "$rounds" "$secs" <<'PY'
import json, sys, pathlib, statistics, subprocess
out, rounds, secs = pathlib.Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
med = statistics.median
cpu = [json.loads(l) for l in (out / "cpu.jsonl").read_text().splitlines()]
def cpu_of(c, w, r):
    get = lambda w: next(m["cpu"] for m in cpu if m["server"] == c and m["workload"] == w and m["round"] == r)
    return get(w) - get("idle")
def fio(r, c, w):
    text = (out / f"fio.{r}.{c}.{w}.json").read_text()
    # fio's nbd engine prints a line of its own before the JSON.
    job = json.loads(text[text.index("{"):])["jobs"][0]
    op = "read" if "read" in w else "write"
    return job[op]["bw_bytes"], job[op]["io_bytes"], job[op]["iops"]
model = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
nproc = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
ceph = subprocess.run(["ceph", "--version"], capture_output=True, text=True).stdout.split()[2]
pinned = int(nproc) >= 2
print(f"Machine: {model}, {nproc} cores; Ceph {ceph}, one monitor and one OSD on the same machine"
      + (f" (the cluster pinned to the upper half of the cores, fio and the server under test to the lower half)" if pinned else "")
      + f"; {rounds} rounds of {secs} s per workload.\n")
names = {"sectorcrypt-aes": "sectorcrypt, aes-xts-plain64", "sectorcrypt-null": "sectorcrypt, cipher_null-ecb",
         "qemu-nbd-luks2": "qemu-nbd + librbd LUKS2", "qemu-nbd-plain": "qemu-nbd + librbd, no encryption"}
rows = (("write", "sequential write, 1 MiB, QD8"), ("read", "sequential read, 1 MiB, QD8"),
        ("randwrite", "random write, 4 KiB, QD32"), ("randread", "random read, 4 KiB, QD32"))
print("| workload | contender | MiB/s | IOPS | client CPU s/GiB | x cipher_null (bandwidth) | x librbd LUKS2 (bandwidth) | x librbd LUKS2 (CPU/GiB) |")
print("|---|---|---|---|---|---|---|---|")
for w, label in rows:
    for c, name in names.items():
        R = range(1, rounds + 1)
        bw = [fio(r, c, w)[0] for r in R]
        iops = [fio(r, c, w)[2] for r in R]
        per_gib = [cpu_of(c, w, r) / (fio(r, c, w)[1] / 2**30) for r in R]
        def ratio(other, f):
            v = [f(r, c) / f(r, other) for r in R]
            return f"{med(v):.2f}x ({min(v):.2f}-{max(v):.2f})"
        bwf = lambda r, c: fio(r, c, w)[0]
        cpuf = lambda r, c: cpu_of(c, w, r) / (fio(r, c, w)[1] / 2**30)
        vs_null = ratio("sectorcrypt-null", bwf) if c == "sectorcrypt-aes" else ""
        vs_lib = ratio("qemu-nbd-luks2", bwf) if c.startswith("sectorcrypt") else ""
        vs_lib_cpu = ratio("qemu-nbd-luks2", cpuf) if c.startswith("sectorcrypt") else ""
        print(f"| {label} | {name} | {med(bw) / 2**20:.1f} | {med(iops):.0f} | {med(per_gib):.2f} | {vs_null} | {vs_lib} | {vs_lib_cpu} |")
pbkdf = ", ".join(" ".join(l.split()) for l in (out / "pbkdf.txt").read_text().splitlines())
print(f"\nUnlock of an image made by `rbd encryption format luks2` (its keyslot: {pbkdf}), "
      f"median of {rounds}:\n")
un = [json.loads(l) for l in (out / "unlock.jsonl").read_text().splitlines()]
get = lambda what, k: med([u[k] for u in un if u["what"] == what])
print("| opener | wall time, s | peak RSS, MiB |")
print("|---|---|---|")
for what, label in (("sectorcrypt", "`sectorcrypt test-passphrase rbd:...`"),
                    ("librbd", "python3-rbd `encryption_load`"),
                    ("python-baseline", "python3-rbd opening the image, no load (the baseline in the line above)")):
    print(f"| {label} | {get(what, 'secs'):.2f} | {get(what, 'kib') / 1024:.0f} |")
PY
