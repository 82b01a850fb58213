#!/usr/bin/env python3
"""Same-run A/B of two sectorcrypt builds' `serve`, against nbdkit's `file` plugin on the same
machine: fio's nbd engine, writes and reads (4 KiB random by default) at queue depth 32 (or
--iodepth) for SECONDS each, the three servers alternating within every round (each one first in one
round of three: use a multiple of 3 rounds), each measurement after a sync and a drop of the page
cache (with --cached: after a sync and a read of both images, so that every read is served from the
page cache, as in the study, whose images are written in full first); medians over the rounds, with
their ratios, of bandwidth and of the server's CPU time per GiB. With --cpus S:F the servers run on
CPU S and fio on CPU F: at queue depth 1 on a small VM, where the scheduler puts the two decides
more than either program does ("1:0" makes every request wake the other CPU, "0:0" never). A
measurement during which the hypervisor stole more than --max-steal percent of the CPU time is taken
again (scripts/steal.py).

    scripts/bench-server-ab.py BEFORE_BINARY AFTER_BINARY [--cipher SPEC] [--rounds R]
        [--seconds S] [--bs SIZE] [--pattern rand|seq] [--iodepth N] [--cached] [--cpus S:F]
        [--dir DIR] [--max-steal PERCENT] [--attempts N]

The volume is a 1 GiB LUKS2 file (`--cipher`, default cipher_null-ecb: the server's own cost);
nbdkit serves a plain 1 GiB file. Build the "before" binary from an older commit (see
scripts/bench-ab.sh).
"""

import argparse
import json
import os
import statistics
import subprocess
import time

from steal import measured, summary as steal_summary


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--cipher", default="cipher_null-ecb")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--bs", default="4k")
    ap.add_argument("--pattern", choices=["rand", "seq"], default="rand")
    ap.add_argument("--iodepth", type=int, default=32)
    ap.add_argument("--cpus", metavar="S:F", help="pin the servers to CPU S and fio to CPU F")
    ap.add_argument("--cached", action="store_true",
                    help="measure with both images in the page cache")
    ap.add_argument("--dir", default="target/bench-server-ab")
    ap.add_argument("--max-steal", type=float, default=5.0, metavar="PERCENT")
    ap.add_argument("--attempts", type=int, default=4)
    a = ap.parse_args()
    pin = {}
    if a.cpus:
        server_cpu, fio_cpu = (int(c) for c in a.cpus.split(":"))
        pin = {"server": lambda: os.sched_setaffinity(0, {server_cpu}),
               "fio": lambda: os.sched_setaffinity(0, {fio_cpu})}
    d = os.path.abspath(a.dir)
    os.makedirs(d, exist_ok=True)
    with open(f"{d}/pass", "w") as f:
        f.write("bench passphrase")
    for name in ["v.img", "raw.img"]:
        with open(f"{d}/{name}", "wb") as f:
            f.truncate(1 << 30)
    subprocess.run([os.path.abspath(a.after), "format", "-q", "--key-file", f"{d}/pass",
                    "--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000",
                    "--cipher", a.cipher, f"{d}/v.img"], check=True)
    servers = {"before": os.path.abspath(a.before), "after": os.path.abspath(a.after),
               "nbdkit file": None}

    def start(name):
        sock = f"{d}/{name.replace(' ', '-')}.sock"
        if os.path.exists(sock):
            os.remove(sock)
        if servers[name] is None:
            cmd = ["nbdkit", "-f", "-U", sock, "file", f"{d}/raw.img"]
        else:
            cmd = [servers[name], "serve", f"{d}/v.img", "--key-file", f"{d}/pass",
                   "--socket", sock]
        proc = subprocess.Popen(cmd, stderr=subprocess.DEVNULL, preexec_fn=pin.get("server"))
        while not os.path.exists(sock):
            time.sleep(0.05)
        return proc, f"nbd+unix:///?socket={sock}"

    def cpu_seconds(pid):
        # utime + stime: fields 14 and 15 of /proc/PID/stat, after the parenthesised name.
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def fio(uri, rw, pid):
        job = (f"[global]\nioengine=nbd\nuri={uri}\nbs={a.bs}\ntime_based=1\nruntime={a.seconds}\n"
               f"size=900m\niodepth={a.iodepth}\nrw={rw}\nrandrepeat=0\n[j]\n")
        with open(f"{d}/ab.fio", "w") as f:
            f.write(job)
        cpu = cpu_seconds(pid)
        out = subprocess.run(["fio", "--output-format=json", f"{d}/ab.fio"], check=True,
                             capture_output=True, text=True, preexec_fn=pin.get("fio")).stdout
        cpu = cpu_seconds(pid) - cpu
        j = json.loads(out[out.index("{"):])["jobs"][0]
        moved = j["write" if rw.endswith("write") else "read"]
        # MiB/s, and the server's CPU seconds per GiB moved.
        return moved["bw_bytes"] / (1 << 20), cpu / max(moved["io_bytes"] / (1 << 30), 1e-9)

    def settle():
        # Each measurement starts from the same state: nothing dirty, nothing cached (as root;
        # otherwise only the sync) or, with --cached, everything cached, so that one server's
        # writes are not another's writeback.
        subprocess.run(["sync"], check=True)
        if a.cached:
            for name in ["v.img", "raw.img"]:
                with open(f"{d}/{name}", "rb") as f:
                    while f.read(1 << 24):
                        pass
            return
        try:
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")
        except OSError:
            pass

    # fio's names: randread/randwrite, and read/write for sequential.
    prefix = "rand" if a.pattern == "rand" else ""
    jobs = [prefix + "read", prefix + "write"]
    res = {}
    taken = []
    for r in range(a.rounds):
        # The order rotates, so that each server goes first in one round of three: the first
        # reads of a round, right after the last round's writes, are slow whoever makes them
        # (an A/A run of one binary in a fixed order read 1.57x faster as "after").
        names = list(servers)
        order = names[r % len(names):] + names[:r % len(names)]
        for rw in jobs:
            for name in order:
                proc, uri = start(name)
                try:
                    (mib, cpu), steal, attempts = measured(
                        lambda: fio(uri, rw, proc.pid), a.max_steal / 100, a.attempts,
                        prepare=settle)
                    res.setdefault((name, rw), []).append(mib)
                    res.setdefault((name, rw, "cpu"), []).append(cpu)
                    taken.append({"steal": steal, "attempts": attempts})
                finally:
                    proc.terminate()
                    proc.wait()
    cache = (", cached" if a.cached else "") + (f", CPUs {a.cpus}" if a.cpus else "")
    print(f"| {a.bs} QD{a.iodepth}{cache}, {a.cipher} | before | after | nbdkit file | after / before | "
          "before / nbdkit | after / nbdkit |")
    print("|---|---|---|---|---|---|---|")
    rows = [(rw, "MiB/s", (), "{:.0f}") for rw in reversed(jobs)]
    rows += [(rw, "server CPU-s/GiB", ("cpu",), "{:.3f}") for rw in reversed(jobs)]
    for rw, unit, key, fmt in rows:
        m = {n: statistics.median(res[(n, rw, *key)]) for n in servers}
        each = {n: ", ".join(fmt.format(v) for v in res[(n, rw, *key)]) for n in servers}
        print(f"| {rw} {unit} | {fmt.format(m['before'])} ({each['before']}) | "
              f"{fmt.format(m['after'])} ({each['after']}) | {fmt.format(m['nbdkit file'])} "
              f"({each['nbdkit file']}) | {m['after'] / m['before']:.2f}x | "
              f"{m['before'] / m['nbdkit file']:.2f}x | {m['after'] / m['nbdkit file']:.2f}x |")
    print()
    print(steal_summary(taken, a.max_steal / 100))
    for name in ["v.img", "raw.img"]:
        os.remove(f"{d}/{name}")


if __name__ == "__main__":
    main()
