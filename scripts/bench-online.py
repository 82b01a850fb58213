#!/usr/bin/env python3
"""Online key rotation (issue 31), measured: what the clients of `serve` keep while `reencrypt`
runs inside the server, and what the conversion keeps while clients load the server.

    scripts/bench-online.py [--dir DIR] [--gib N] [--seconds S] [--rounds R]

Each round, on a fresh N-GiB LUKS2 file (aes-xts-plain64, 4096-byte sectors):

1. idle clients: fio through `serve` for S seconds, two jobs on two connections at once:
   4 KiB random writes at queue depth 32 (bandwidth) and 4 KiB random reads at depth 1 (latency);
2. the same fio run while `sectorcrypt reencrypt` runs online (started 1 s before fio); the
   conversion's rate over fio's window comes from its `--json` progress lines;
3. the conversion alone: online with no client, offline (`sectorcrypt reencrypt` on the file), and
   cryptsetup 2.6's offline `reencrypt --force-offline-reencrypt` on the same file.

Prints a Markdown table (medians over the rounds, with each round's values) for
docs/BENCHMARKS.md. Ratios are taken within a round, so the machine's speed of the day cancels.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SC = os.path.join(ROOT, "target", "release", "sectorcrypt")
FAST = ["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"]


def run(args, **kw):
    return subprocess.run(args, check=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def fresh(d, gib):
    img = os.path.join(d, "v.img")
    if os.path.exists(img):
        os.remove(img)
    with open(img, "wb") as f:
        f.truncate(gib << 30)
    run([SC, "format", "-q", "--key-file", os.path.join(d, "pass"), *FAST,
         "--sector-size", "4096", img])
    return img


class Server:
    def __init__(self, d, img):
        self.sock = os.path.join(d, "s.sock")
        self.log = open(os.path.join(d, "serve.log"), "wb")
        self.proc = subprocess.Popen([SC, "serve", img, "--key-file", os.path.join(d, "pass"),
                                      "--socket", self.sock], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=self.log)
        for _ in range(600):
            if os.path.exists(self.sock):
                return
            time.sleep(0.05)
        raise SystemExit("serve did not start")

    @property
    def uri(self):
        return f"nbd+unix:///?socket={self.sock}"

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=120)


def fio(d, uri, seconds, gib):
    """Bandwidth (MiB/s) of 4 KiB random writes at QD 32 and mean latency (us) of 4 KiB random
    reads at QD 1, run at once on two connections."""
    half = (gib << 30) // 2
    job = (f"[global]\nioengine=nbd\nuri={uri}\nbs=4k\ntime_based=1\nruntime={seconds}\n"
           f"size={half - (32 << 20)}\nrandrepeat=0\n"
           f"[bw]\nrw=randwrite\niodepth=32\noffset=0\n"
           f"[lat]\nrw=randread\niodepth=1\noffset={half}\n")
    path = os.path.join(d, "bench.fio")
    with open(path, "w") as f:
        f.write(job)
    out = run(["fio", "--output-format=json", path]).stdout.decode()
    jobs = {j["jobname"]: j for j in json.loads(out[out.index("{"):])["jobs"]}
    bw = jobs["bw"]["write"]["bw_bytes"] / (1 << 20)
    lat = jobs["lat"]["read"]["clat_ns"]["mean"] / 1000
    return bw, lat


def reencrypt(d, img):
    """Run `sectorcrypt reencrypt --json` on img; returns (seconds, [(time, done)])."""
    points = []
    t0 = time.monotonic()
    proc = subprocess.Popen([SC, "reencrypt", "-q", "--key-file", os.path.join(d, "pass"),
                             *FAST, "--json", img], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in proc.stdout:
        try:
            points.append((time.monotonic(), json.loads(line)["done"]))
        except (ValueError, KeyError):
            pass
    if proc.wait() != 0:
        raise SystemExit("reencrypt failed: " + proc.stderr.read())
    return time.monotonic() - t0, points


def rate_within(points, start, end):
    """Bytes per second converted between two moments, from progress points."""
    inside = [(t, d) for t, d in points if start <= t <= end]
    if len(inside) < 2:
        return float("nan")
    (t1, d1), (t2, d2) = inside[0], inside[-1]
    return (d2 - d1) / (t2 - t1)


def round_(d, gib, seconds):
    size = gib << 30
    r = {}
    img = fresh(d, gib)
    s = Server(d, img)
    r["bw_idle"], r["lat_idle"] = fio(d, s.uri, seconds, gib)
    s.stop()

    img = fresh(d, gib)
    s = Server(d, img)
    result = {}
    conv = threading.Thread(target=lambda: result.update(out=reencrypt(d, img)))
    conv.start()
    time.sleep(1)
    f0 = time.monotonic()
    r["bw_busy"], r["lat_busy"] = fio(d, s.uri, seconds, gib)
    f1 = time.monotonic()
    conv.join()
    s.stop()
    secs, points = result["out"]
    r["conv_loaded"] = rate_within(points, f0, f1) / (1 << 20)

    img = fresh(d, gib)
    s = Server(d, img)
    secs, _ = reencrypt(d, img)
    r["conv_online_idle"] = size / secs / (1 << 20)
    s.stop()

    img = fresh(d, gib)
    secs, _ = reencrypt(d, img)
    r["conv_offline"] = size / secs / (1 << 20)

    img = fresh(d, gib)
    t0 = time.monotonic()
    run(["cryptsetup", "reencrypt", "--batch-mode", "--force-offline-reencrypt", "--key-file",
         os.path.join(d, "pass"), *FAST, img])
    r["conv_cryptsetup"] = size / (time.monotonic() - t0) / (1 << 20)
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default=os.path.join(ROOT, "target", "bench-online"))
    ap.add_argument("--gib", type=int, default=4)
    ap.add_argument("--seconds", type=int, default=15)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    run(["cargo", "build", "--release", "-q"], cwd=ROOT)
    os.makedirs(a.dir, exist_ok=True)
    with open(os.path.join(a.dir, "pass"), "w") as f:
        f.write("bench passphrase")
    rounds = []
    for i in range(a.rounds):
        r = round_(a.dir, a.gib, a.seconds)
        print(f"round {i + 1}: " + json.dumps({k: round(v, 1) for k, v in r.items()}),
              file=sys.stderr)
        rounds.append(r)
    os.remove(os.path.join(a.dir, "v.img"))

    def row(what, f, unit, goal=""):
        vals = [f(r) for r in rounds]
        each = ", ".join(f"{v:.2f}" for v in vals)
        print(f"| {what} | {statistics.median(vals):.2f} {unit} | {each} | {goal} |")

    print("| measure | median | rounds | goal |")
    print("|---|---|---|---|")
    row("client bandwidth, 4 KiB random writes QD 32, idle", lambda r: r["bw_idle"], "MiB/s")
    row("... during an online reencryption", lambda r: r["bw_busy"], "MiB/s")
    row("**ratio: during / idle**", lambda r: r["bw_busy"] / r["bw_idle"], "x", ">= 0.8")
    row("client latency, 4 KiB random reads QD 1, idle", lambda r: r["lat_idle"], "us")
    row("... during an online reencryption", lambda r: r["lat_busy"], "us")
    row("**ratio: during / idle**", lambda r: r["lat_busy"] / r["lat_idle"], "x")
    row("conversion, online, clients loading the server", lambda r: r["conv_loaded"], "MiB/s")
    row("conversion, online, no clients", lambda r: r["conv_online_idle"], "MiB/s")
    row("conversion, sectorcrypt offline", lambda r: r["conv_offline"], "MiB/s")
    row("conversion, cryptsetup 2.6 offline", lambda r: r["conv_cryptsetup"], "MiB/s")
    row("**ratio: online loaded / sectorcrypt offline**",
        lambda r: r["conv_loaded"] / r["conv_offline"], "x", ">= 0.5")
    row("**ratio: online loaded / cryptsetup offline**",
        lambda r: r["conv_loaded"] / r["conv_cryptsetup"], "x", ">= 0.5")


if __name__ == "__main__":
    main()
