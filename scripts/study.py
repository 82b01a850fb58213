#!/usr/bin/env python3
"""The cost of encryption at rest, measured on this machine: the experiment of the paper
"Performance Study of Software-based Encrypting Data at Rest" (fio on a plain and an encrypted
device) with user-space servers behind NBD, as a report with figures.

    python3 scripts/study.py DIR [--quick] [--rounds N] [--seconds S] [--size-mib M]
                                 [--sectorcrypt PATH] [--max-steal PERCENT] [--attempts N]

Contenders, all on the file system of DIR and all reached through fio's nbd engine over a Unix
socket: a plain `nbdkit file` export (the paper's unencrypted partition, which also stands in for a
drive that encrypts inline, Key Per I/O), sectorcrypt with cipher_null-ecb (the same server and
format without a cipher), sectorcrypt with aes-xts-plain64 (512-bit key) and with lea-xts-plain64,
nbdkit's luks filter and qemu-nbd with LUKS1 (aes-xts-plain64), and dm-crypt where the running
kernel has device-mapper's crypt target (detected; the report says when it is absent).

Workloads (the paper's): random read, write and 70/30 at 4 KiB QD64; sequential read, write and
read/write at 128 KiB QD8; QD1 4 KiB random read, write and 70/30 latency (its Table 1, mean and
p99); and bandwidth and CPU against the number of jobs at 128 KiB QD64 for sequential and random
read and write (its Figures 5-8); and Key Per I/O in software: requests under a key tag drawn
at random per request from tables of 1 to 65,536 keys against the same requests under one key
(`sectorcrypt kpio benchmark`, in process, 4 KiB and 128 KiB requests). Server CPU is the server process's user+system time read from
/proc before and after each workload (all threads); client CPU is fio's. Every round runs every
contender; the report shows medians with their range over rounds, and every ratio against the
plain export and against cipher_null of the same round. Each sample records the hypervisor's steal
during it (scripts/steal.py); one taken while more than --max-steal percent of the machine's CPU
time was stolen is taken again, up to --attempts times, keeping the least stolen, and the report
says how much steal its samples rest on.

Output in DIR: report.md (tables, figures, "what this means"), *.svg (figures), results.json (every
sample). --quick (for the test suite: tiny sizes, one short round, jobs 1 and 2) checks the whole
pipeline in well under a minute; the default is the benchmark. A progress line is drawn on a
terminal.
"""

import argparse
import math
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from steal import measured, summary as steal_summary

PAPER = {
    "bandwidth_loss": "33% (random 70/30) to 50% (random write) less throughput",
    "cpu": "up to 9.5x the CPU (30-40x with many jobs)",
    "latency": {"randread": (87, 110, 1.26), "randwrite": (21, 69, 3.29), "randrw": (75, 94, 1.25)},
}

MATRIX = [  # name, rw, block size, queue depth
    ("rand-read-4k-qd64", "randread", "4k", 64),
    ("rand-write-4k-qd64", "randwrite", "4k", 64),
    ("rand-rw-4k-qd64", "randrw", "4k", 64),
    ("seq-read-128k-qd8", "read", "128k", 8),
    ("seq-write-128k-qd8", "write", "128k", 8),
    ("seq-rw-128k-qd8", "rw", "128k", 8),
]
LATENCY = [
    ("lat-randread-4k-qd1", "randread", "4k", 1),
    ("lat-randwrite-4k-qd1", "randwrite", "4k", 1),
    ("lat-randrw-4k-qd1", "randrw", "4k", 1),
]
KPIO_REQUESTS = [4096, 131072]
SWEEP = [("seq-read", "read"), ("seq-write", "write"), ("rand-read", "randread"), ("rand-write", "randwrite")]
COLORS = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c"]


class Progress:
    """A one-line progress display on a terminal (nothing otherwise)."""

    def __init__(self, total):
        self.total, self.done, self.start = total, 0, time.time()
        self.tty = sys.stderr.isatty()

    def step(self, what):
        self.done += 1
        if self.tty:
            width = 30
            filled = width * self.done // max(self.total, 1)
            line = f"\r[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} " \
                   f"{time.time() - self.start:5.0f}s  {what}"
            sys.stderr.write(line[:150].ljust(150))
            sys.stderr.flush()

    def finish(self):
        if self.tty:
            sys.stderr.write("\r" + " " * 150 + "\r")


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def cpu_seconds(pid):
    """User+system seconds of a whole process (every thread), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def dm_crypt_available():
    """Whether device-mapper's crypt target can be used here, and why not."""
    if shutil.which("dmsetup") is None or shutil.which("losetup") is None:
        return False, "dmsetup or losetup is not installed"
    try:
        out = run(["dmsetup", "targets"]).stdout.decode()
    except (subprocess.CalledProcessError, OSError) as e:
        err = getattr(e, "stderr", b"") or b""
        return False, "the running kernel offers no device-mapper (" + \
            (err.decode().strip().splitlines() or [str(e)])[0] + ")"
    if "crypt" not in out:
        return False, "the kernel's device-mapper has no crypt target"
    return True, ""


class Server:
    """One NBD server on a Unix socket, started and stopped around a round's workloads."""

    def __init__(self, argv, sock, log, setup=None, teardown=None):
        self.argv, self.sock, self.log = argv, sock, log
        self.setup, self.teardown = setup, teardown
        self.proc = None

    def __enter__(self):
        if self.setup:
            self.setup()
        if self.sock.exists():
            self.sock.unlink()
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL,
                                     stderr=open(self.log, "ab"))
        uri = f"nbd+unix:///?socket={self.sock}"
        for _ in range(400):
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {' '.join(self.argv)} (see {self.log})")
            if self.sock.exists() and subprocess.run(
                    ["nbdinfo", "--size", uri], stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL).returncode == 0:
                return self
            time.sleep(0.05)
        raise RuntimeError(f"server did not start: {' '.join(self.argv)} (see {self.log})")

    def __exit__(self, *exc):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.teardown:
            self.teardown()


def fio(uri, rw, bs, qd, jobs, seconds, size):
    cmd = ["fio", "--name=study", "--ioengine=nbd", f"--uri={uri}", f"--rw={rw}", f"--bs={bs}",
           f"--iodepth={qd}", f"--numjobs={jobs}", "--group_reporting", "--rwmixread=70",
           f"--size={size}", "--time_based", f"--runtime={int(seconds * 1000)}ms",
           "--output-format=json"]
    text = run(cmd).stdout.decode()
    job = json.loads(text[text.index("{"):])["jobs"][0]  # the nbd engine prints a line first
    moved = job["read"]["io_bytes"] + job["write"]["io_bytes"]
    lat = [job[d] for d in ("read", "write") if job[d]["total_ios"] > 0]
    ios = sum(d["total_ios"] for d in lat)
    mean = sum(d["lat_ns"]["mean"] * d["total_ios"] for d in lat) / max(ios, 1) / 1000
    p99 = max(d["clat_ns"].get("percentile", {}).get("99.000000", 0) for d in lat) / 1000
    runtime = max(job["job_runtime"] / 1000, 1e-9) / jobs
    return {
        "bytes": moved,
        "bandwidth_mib_s": moved / runtime / 2**20,
        "iops": ios / runtime,
        "lat_mean_us": mean,
        "lat_p99_us": p99,
        "client_cpu_s": (job["usr_cpu"] + job["sys_cpu"]) / 100 * runtime * jobs,
        "runtime_s": runtime,
    }


def build_images(d, sc, size, key, dm):
    """The images of every contender, each written once in full through its own server."""
    fmt = ["--key-file", str(key), "--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000", "-q"]
    header = 16 << 20

    def image(name, *options):
        img = d / f"{name}.img"
        img.unlink(missing_ok=True)
        with open(img, "wb") as f:
            f.truncate(size + (header if options else 0))
        if options:
            run([sc, "format", str(img), *fmt, *options])
        return img

    image("plain")
    image("null", "--cipher", "cipher_null-ecb", "--sector-size", "4096")
    image("aes", "--cipher", "aes-xts-plain64", "--key-size", "512", "--sector-size", "4096")
    image("lea", "--cipher", "lea-xts-plain64", "--key-size", "512", "--sector-size", "4096")
    image("luks1", "--type", "luks1", "--cipher", "aes-xts-plain64", "--key-size", "512")
    if dm:
        image("dm", "--cipher", "aes-xts-plain64", "--key-size", "512", "--sector-size", "4096")


def contenders(d, sc, key, sock, dm):
    log = d / "servers.log"
    serve = lambda img: [sc, "serve", str(d / img), "--key-file", str(key), "--socket", str(sock)]
    c = {
        "plain (nbdkit file)": ["nbdkit", "-f", "-U", str(sock), "file", str(d / "plain.img")],
        "sectorcrypt cipher_null": serve("null.img"),
        "sectorcrypt aes-xts-512": serve("aes.img"),
        "sectorcrypt lea-xts-512": serve("lea.img"),
        "nbdkit luks filter (LUKS1 aes-xts)": [
            "nbdkit", "-f", "-U", str(sock), "--filter=luks", "file", str(d / "luks1.img"),
            f"passphrase=+{key}"],
        "qemu-nbd luks (LUKS1 aes-xts)": [
            "qemu-nbd", "-t", "--shared=0", "-k", str(sock), "--cache=writeback",
            "--object", f"secret,id=sec0,file={key}", "--image-opts",
            f"driver=luks,key-secret=sec0,file.driver=file,file.filename={d / 'luks1.img'}"],
    }
    servers = {name: Server(argv, sock, log) for name, argv in c.items()}
    if dm:
        state = {}

        def setup():
            loop = run(["losetup", "--find", "--show", str(d / "dm.img")]).stdout.decode().strip()
            state["loop"] = loop
            run(["cryptsetup", "open", "--key-file", str(key), loop, "sectorcrypt-study"])

        def teardown():
            subprocess.run(["cryptsetup", "close", "sectorcrypt-study"])
            subprocess.run(["losetup", "-d", state.pop("loop", "")])

        servers["dm-crypt aes-xts-512"] = Server(
            ["nbdkit", "-f", "-U", str(sock), "file", "/dev/mapper/sectorcrypt-study"],
            sock, log, setup, teardown)
    return servers


def measure(args):
    d = Path(args.dir).resolve()
    d.mkdir(parents=True, exist_ok=True)
    sc = str(Path(args.sectorcrypt).resolve()) if args.sectorcrypt else None
    if sc is None:
        root = Path(__file__).resolve().parent.parent
        run(["cargo", "build", "--release", "--locked", "-q", "-p", "sectorcrypt"], cwd=root)
        sc = str(root / "target" / "release" / "sectorcrypt")
    for tool in ("fio", "nbdkit", "qemu-nbd", "nbdinfo", "nbdcopy"):
        if shutil.which(tool) is None:
            sys.exit(f"study: {tool} is not installed (scripts/install-test-deps.sh installs it)")
    key = d / "passphrase"
    key.write_bytes(b"study passphrase")
    sock = d / "nbd.sock"
    size = args.size_mib << 20
    dm, dm_why = dm_crypt_available()
    build_images(d, sc, size, key, dm)
    servers = contenders(d, sc, key, sock, dm)
    uri = f"nbd+unix:///?socket={sock}"
    jobs_list = [1, 2] if args.quick else [1, 2, 4, 8, 16]
    work = [(n, rw, bs, qd, 1) for n, rw, bs, qd in MATRIX + LATENCY]
    work += [(f"jobs-{n}-{j}", rw, "128k", 64, j) for n, rw in SWEEP for j in jobs_list]
    progress = Progress(len(servers) * (1 + args.rounds * len(work)) + len(KPIO_REQUESTS))
    # Every image written once in full, unmeasured, so no run pays for block allocation.
    source = d / "source.raw"
    with open(source, "wb") as f:
        f.write(os.urandom(size))
    for name, server in servers.items():
        progress.step(f"writing {name}")
        with server:
            run(["nbdcopy", "--flush", str(source), uri])
    source.unlink()
    samples = []
    for r in range(1, args.rounds + 1):
        for name, server in servers.items():
            with server:
                pid = server.proc.pid
                for wname, rw, bs, qd, jobs in work:
                    progress.step(f"round {r}: {name}: {wname}")

                    def take():
                        before, t0 = cpu_seconds(pid), time.time()
                        s = fio(uri, rw, bs, qd, jobs, args.seconds, size // jobs)
                        s["server_cpu_s"] = cpu_seconds(pid) - before
                        s["wall_s"] = time.time() - t0
                        return s

                    s, steal, attempts = measured(take, args.max_steal / 100, args.attempts)
                    s.update(steal=steal, attempts=attempts, round=r, contender=name,
                             workload=wname, jobs=jobs, rw=rw, bs=bs, qd=qd)
                    samples.append(s)
    kpio = []
    for request in KPIO_REQUESTS:
        progress.step(f"key per I/O, {request}-byte requests")
        out = run([sc, "kpio", "benchmark", "--json", "--request-size", str(request),
                   "--keys", "1,64" if args.quick else "1,16,256,4096,65536",
                   "--seconds", str(0.05 if args.quick else min(args.seconds, 5))],
                  text=True)
        kpio += [json.loads(line) for line in out.stdout.splitlines()]
    progress.finish()
    for p in d.glob("*.img"):
        p.unlink()
    return {
        "machine": {
            "cpu": next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                         if l.startswith("model name")), platform.processor()),
            "cpus": os.cpu_count(),
            "kernel": platform.release(),
        },
        "parameters": {"rounds": args.rounds, "seconds": args.seconds, "size_mib": args.size_mib,
                       "quick": args.quick, "jobs": jobs_list, "max_steal_pct": args.max_steal,
                       "attempts": args.attempts},
        "dm_crypt": {"measured": dm, "why_not": dm_why},
        "contenders": list(servers),
        "samples": samples,
        "kpio": kpio,
    }


# ---- the report ----

def per_gib(s, key):
    return s[key] / max(s["bytes"] / 2**30, 1e-12)


def metric(res, contender, workload, f):
    return [f(s) for s in res["samples"] if s["contender"] == contender and s["workload"] == workload]


def ratio(res, contender, base, workload, f):
    """Per-round ratios contender/base (the same round's base)."""
    out = []
    for r in range(1, res["parameters"]["rounds"] + 1):
        a = [f(s) for s in res["samples"] if s["contender"] == contender
             and s["workload"] == workload and s["round"] == r]
        b = [f(s) for s in res["samples"] if s["contender"] == base
             and s["workload"] == workload and s["round"] == r]
        if a and b and b[0] > 0:
            out.append(a[0] / b[0])
    return out


def cell(values, fmt="{:.1f}"):
    if not values:
        return "-"
    m = statistics.median(values)
    if len(values) == 1:
        return fmt.format(m)
    return f"{fmt.format(m)} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def xml(text):
    return (str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace('"', "&quot;"))


def nice_top(values):
    """An axis top at a round value (1, 2 or 5 times a power of ten per tick) over the largest
    value, and its tick step."""
    top = max([v for row in values for v in row if v is not None] + [1e-9])
    raw = top / 5
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    ticks = int(-(-top // step))
    return step * ticks, step, ticks


def tick(v):
    return f"{v:g}" if v >= 0.01 or v == 0 else f"{v:.2g}"


class Chart:
    """The frame shared by the figures: title, y axis with round ticks over `values`, and (at
    `finish`) the plot's border, a legend of `series` and the closing tag."""

    W, LEFT, TOP, LEGEND = 1080, 70, 50, 300

    def __init__(self, title, ylabel, height, bottom, values):
        self.plot_w = self.W - self.LEFT - self.LEGEND
        self.plot_h = height - self.TOP - bottom
        self.height = height
        self.top_v, step, ticks = nice_top(values)
        left, top = self.LEFT, self.TOP
        self.out = [
            f'<?xml version="1.0" encoding="UTF-8"?>\n<svg xmlns="http://www.w3.org/2000/svg" '
            f'width="{self.W}" height="{height}" font-family="sans-serif" font-size="12">',
            f'<title>{xml(title)}</title><rect width="{self.W}" height="{height}" fill="white"/>',
            f'<text x="{self.W / 2}" y="24" text-anchor="middle" font-size="15">{xml(title)}</text>',
            f'<text transform="translate(18,{top + self.plot_h / 2}) rotate(-90)" '
            f'text-anchor="middle">{xml(ylabel)}</text>']
        for i in range(ticks + 1):
            y = top + self.plot_h - self.plot_h * i / ticks
            self.out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + self.plot_w}" '
                            f'y2="{y:.1f}" stroke="#ddd"/>')
            self.out.append(f'<text x="{left - 6}" y="{y + 4:.1f}" '
                            f'text-anchor="end">{tick(step * i)}</text>')

    def y(self, v):
        return self.TOP + self.plot_h - self.plot_h * v / self.top_v

    def finish(self, series):
        left, top = self.LEFT, self.TOP
        self.out.append(f'<rect x="{left}" y="{top}" width="{self.plot_w}" '
                        f'height="{self.plot_h}" fill="none" stroke="black"/>')
        for si, s in enumerate(series):
            y = top + 10 + si * 18
            self.out.append(f'<rect x="{left + self.plot_w + 16}" y="{y}" width="12" height="12" '
                            f'fill="{COLORS[si % len(COLORS)]}"/>')
            self.out.append(f'<text x="{left + self.plot_w + 34}" y="{y + 10}">{xml(s)}</text>')
        self.out.append("</svg>\n")
        return "\n".join(self.out)


def svg_bars(title, ylabel, groups, series, values):
    """Grouped bars: values[series][group] = median."""
    c = Chart(title, ylabel, 430, 90, values)
    gw = c.plot_w / max(len(groups), 1)
    bw = gw * 0.8 / max(len(series), 1)
    for gi, g in enumerate(groups):
        x0 = c.LEFT + gi * gw + gw * 0.1
        for si, s in enumerate(series):
            v = values[si][gi]
            if v is None:
                continue
            c.out.append(f'<rect x="{x0 + si * bw:.1f}" y="{c.y(v):.1f}" width="{bw:.1f}" '
                         f'height="{c.y(0) - c.y(v):.1f}" fill="{COLORS[si % len(COLORS)]}">'
                         f'<title>{xml(s)}, {xml(g)}: {v:.3g}</title></rect>')
        c.out.append(f'<text transform="translate({c.LEFT + gi * gw + gw / 2:.1f},'
                     f'{c.y(0) + 14}) rotate(20)" text-anchor="start">{xml(g)}</text>')
    return c.finish(series)


def svg_lines(title, ylabel, xs, series, values, xlabel="jobs"):
    """Lines over evenly spaced x values: values[series][i] = median at xs[i]."""
    c = Chart(title, ylabel, 420, 60, values)
    c.out.append(f'<text x="{c.LEFT + c.plot_w / 2}" y="{c.height - 14}" '
                 f'text-anchor="middle">{xml(xlabel)}</text>')
    px = lambda i: c.LEFT + (c.plot_w * i / max(len(xs) - 1, 1))
    for i, x in enumerate(xs):
        c.out.append(f'<text x="{px(i):.1f}" y="{c.y(0) + 16}" text-anchor="middle">{x}</text>')
    for si, s in enumerate(series):
        pts = [(px(i), c.y(v)) for i, v in enumerate(values[si]) if v is not None]
        color = COLORS[si % len(COLORS)]
        c.out.append(f'<polyline points="{" ".join(f"{x:.1f},{y:.1f}" for x, y in pts)}" '
                     f'fill="none" stroke="{color}" stroke-width="2"/>')
        for x, y in pts:
            c.out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{color}"/>')
    return c.finish(series)


def report(res, d):
    cs = res["contenders"]
    plain, null, aes = cs[0], "sectorcrypt cipher_null", "sectorcrypt aes-xts-512"
    bw = lambda s: s["bandwidth_mib_s"]
    scpu = lambda s: per_gib(s, "server_cpu_s")
    ccpu = lambda s: per_gib(s, "client_cpu_s")
    spct = lambda s: 100 * s["server_cpu_s"] / max(s["wall_s"], 1e-9)
    med = lambda v: statistics.median(v) if v else None
    names = [n for n, *_ in MATRIX]
    figs = {
        "bandwidth.svg": svg_bars("Bandwidth per test (median over rounds)", "MiB/s", names, cs,
                                  [[med(metric(res, c, n, bw)) for n in names] for c in cs]),
        "cpu.svg": svg_bars("Server CPU per GiB moved (median over rounds)", "CPU-seconds per GiB",
                            names, cs, [[med(metric(res, c, n, scpu)) for n in names] for c in cs]),
    }
    jobs = res["parameters"]["jobs"]
    for n, _ in SWEEP:
        figs[f"jobs-{n}-bandwidth.svg"] = svg_lines(
            f"{n}, 128 KiB QD64: bandwidth vs jobs", "MiB/s", jobs, cs,
            [[med(metric(res, c, f"jobs-{n}-{j}", bw)) for j in jobs] for c in cs])
        figs[f"jobs-{n}-cpu.svg"] = svg_lines(
            f"{n}, 128 KiB QD64: server CPU vs jobs", "server CPU, % of one core", jobs, cs,
            [[med(metric(res, c, f"jobs-{n}-{j}", spct)) for j in jobs] for c in cs])
    for name, text in figs.items():
        (d / name).write_text(text)

    p = res["parameters"]
    L = [f"# The cost of encryption at rest on this machine\n",
         f"Machine: {res['machine']['cpu']}, {res['machine']['cpus']} CPUs, Linux "
         f"{res['machine']['kernel']}. {p['rounds']} round(s) of {p['seconds']} s per workload on "
         f"{p['size_mib']} MiB images{' (quick mode: a check of the pipeline, not a measurement)' if p['quick'] else ''}. "
         f"Command: `python3 scripts/study.py DIR{' --quick' if p['quick'] else ''} --rounds "
         f"{p['rounds']} --seconds {p['seconds']} --size-mib {p['size_mib']}`.\n",
         steal_summary(res["samples"], p.get("max_steal_pct", 5.0) / 100) + "\n",
         "Every contender is an NBD server on a Unix socket, driven by fio's nbd engine on the same "
         "machine (client and server share its CPUs). Values are medians over rounds with their "
         "range; ratios are medians of per-round ratios. The plain export stands in for the "
         "paper's unencrypted partition and for a drive that encrypts inline (Key Per I/O).\n",
         f"dm-crypt: {'measured' if res['dm_crypt']['measured'] else 'not measured: ' + res['dm_crypt']['why_not']}.\n",
         "## Bandwidth\n", "![bandwidth](bandwidth.svg)\n",
         "| test | " + " | ".join(cs) + " |", "|---" * (len(cs) + 1) + "|"]
    for n in names:
        L.append(f"| {n} | " + " | ".join(cell(metric(res, c, n, bw)) for c in cs) + " |")
    L += ["\nMiB/s. Ratio to the plain export and to cipher_null:\n",
          "| test | " + " | ".join(f"{c} / plain" for c in cs[1:]) + f" | aes-xts / cipher_null |",
          "|---" * (len(cs) + 1) + "|"]
    for n in names:
        L.append(f"| {n} | " + " | ".join(cell(ratio(res, c, plain, n, bw), "{:.2f}") for c in cs[1:])
                 + f" | {cell(ratio(res, aes, null, n, bw), '{:.3f}')} |")
    L += ["\n## CPU\n", "![cpu](cpu.svg)\n",
          "Server CPU-seconds per GiB moved (client CPU-seconds per GiB in brackets, fio's):\n",
          "| test | " + " | ".join(cs) + " |", "|---" * (len(cs) + 1) + "|"]
    for n in names:
        L.append(f"| {n} | " + " | ".join(
            f"{cell(metric(res, c, n, scpu), '{:.3f}')} [{cell(metric(res, c, n, ccpu), '{:.3f}')}]"
            for c in cs) + " |")
    L += ["\n## Latency at queue depth 1 (the paper's Table 1)\n",
          "| test | " + " | ".join(f"{c} mean / p99 (µs)" for c in cs) + " | aes-xts / plain (mean) | paper: plain, encrypted, ratio |",
          "|---" * (len(cs) + 3) + "|"]
    for n, rw, _, _ in LATENCY:
        mean = lambda s: s["lat_mean_us"]
        p99 = lambda s: s["lat_p99_us"]
        pp = PAPER["latency"][rw]
        L.append(f"| {n} | " + " | ".join(
            f"{cell(metric(res, c, n, mean))} / {cell(metric(res, c, n, p99))}" for c in cs)
            + f" | {cell(ratio(res, aes, plain, n, mean), '{:.2f}')} | {pp[0]} µs, {pp[1]} µs, {pp[2]}x |")
    L.append("\n## Bandwidth and CPU against the number of jobs (the paper's Figures 5-8)\n")
    for n, _ in SWEEP:
        L.append(f"![{n} bandwidth](jobs-{n}-bandwidth.svg)\n![{n} cpu](jobs-{n}-cpu.svg)\n")
        L.append("| jobs | " + " | ".join(f"{c} MiB/s, server CPU %" for c in cs) + " |")
        L.append("|---" * (len(cs) + 1) + "|")
        for j in jobs:
            w = f"jobs-{n}-{j}"
            L.append(f"| {j} | " + " | ".join(
                f"{cell(metric(res, c, w, bw))}, {cell(metric(res, c, w, spct), '{:.0f}')}" for c in cs) + " |")
        L.append("")
    # What this means, from the numbers.
    loss = [1 - statistics.median(r) for n in names if (r := ratio(res, aes, plain, n, bw))]
    vs_null = [statistics.median(r) for n in names if (r := ratio(res, aes, null, n, bw))]
    def cpu_of(contender, prefix):
        v = [statistics.median(m) for n in names if n.startswith(prefix)
             and (m := metric(res, contender, n, scpu))]
        return statistics.median(v) if v else None
    lat = [statistics.median(r) for n, *_ in LATENCY
           if (r := ratio(res, aes, plain, n, lambda s: s["lat_mean_us"]))]
    L.append("## What this means\n")
    seq = [cpu_of(c, "seq") for c in (aes, plain)]
    rnd = [cpu_of(c, "rand") for c in (aes, plain)]
    if loss and vs_null and lat and None not in seq + rnd:
        L.append(
            f"- Against the plain export, sectorcrypt with AES-XTS moves {min(loss) * 100:.0f}% to "
            f"{max(loss) * 100:.0f}% less data per second over the six tests (negative: more); the "
            f"paper measured {PAPER['bandwidth_loss']} for dm-crypt on NVMe.\n"
            f"- Against the same server without a cipher (cipher_null), AES-XTS reaches "
            f"{min(vs_null):.2f}x to {max(vs_null):.2f}x of its bandwidth: what the cipher itself "
            f"costs here, the rest being the cost of a user-space server.\n"
            f"- Server CPU per GiB, AES-XTS against the plain export (medians over the tests): "
            f"{seq[0]:.3f} against {seq[1]:.3f} CPU-seconds for the 128 KiB sequential tests "
            f"({seq[0] / seq[1]:.1f}x), {rnd[0]:.3f} against {rnd[1]:.3f} for the 4 KiB random "
            f"ones ({rnd[0] / rnd[1]:.1f}x, where per-request costs dominate); the paper measured "
            f"{PAPER['cpu']}.\n"
            f"- Queue-depth-1 latency is {min(lat):.2f}x to {max(lat):.2f}x the plain export's; the "
            f"paper's Table 1 has 1.25x to 3.29x.\n")
    L += kpio_section(res, d)
    L.append("Raw samples: `results.json` (one object per round, contender and workload; "
             "`kpio`: one object per key count, request size and direction).\n")
    (d / "report.md").write_text("\n".join(L))


def kpio_section(res, d):
    """Key Per I/O: throughput with a random tag per request against one key, as a figure, a
    table and a sentence."""
    rows = res.get("kpio") or []
    if not rows:
        return []
    keys = sorted({r["keys"] for r in rows})
    series = [(rs, op) for rs in KPIO_REQUESTS for op in ("write", "read")]
    label = lambda rs, op: f"{rs // 1024} KiB {op}"
    at = {(r["request_size"], r["op"], r["keys"]): r for r in rows}
    values = [[at[(rs, op, k)]["vs_baseline"] if (rs, op, k) in at else None for k in keys]
              for rs, op in series]
    (d / "kpio.svg").write_text(svg_lines(
        "Key per I/O: throughput with a random key per request, relative to one key",
        "throughput / one key's", keys, [label(*s) for s in series], values,
        xlabel="keys in the table (each request names one at random)"))
    L = ["## Key per I/O in software\n",
         "The paper proposes Key Per I/O (the host loads many keys into the drive and names one "
         "per command) as the way to make the cost of encryption vanish. `sectorcrypt kpio serve` "
         "does it in software: a table of keys over one store, one NBD export per key tag. What "
         "choosing the key per request costs is measured in process (`sectorcrypt kpio "
         "benchmark`: AES-XTS-512, random offsets in a 256 MiB store, a file in memory served as "
         "`kpio serve` serves a file, the tag drawn at random per request, medians of 5 rounds "
         "that alternate between table sizes):\n",
         "![kpio](kpio.svg)\n",
         "| keys | " + " | ".join(f"{label(*s)}: requests/s (vs one key)" for s in series)
         + " | table memory per key |", "|---" * (len(series) + 2) + "|"]
    for k in keys:
        cells = []
        for rs, op in series:
            r = at.get((rs, op, k))
            cells.append(f"{r['requests_per_sec']:.0f} ({r['vs_baseline']:.2f}x)" if r else "-")
        mem = next((r["table_bytes_per_key"] for r in rows
                    if r["keys"] == k and r.get("table_bytes_per_key")), None)
        L.append(f"| {k} | " + " | ".join(cells) + f" | {f'{mem:.0f} B' if mem else '-'} |")
    stolen = [r["steal_max"] for r in rows if r.get("steal_max") is not None]
    if stolen:
        L.append(f"\nThe hypervisor stole at most {100 * max(stolen):.1f}% of the CPU time during "
                 "a counted round (a round above 5% was taken again, up to 4 times).")
    small = [r["vs_baseline"] for r in rows if r["request_size"] == KPIO_REQUESTS[0]]
    most = max(keys)
    worst = [r["vs_baseline"] for r in rows
             if r["request_size"] == KPIO_REQUESTS[0] and r["keys"] == most]
    large = [r["vs_baseline"] for r in rows
             if r["request_size"] == KPIO_REQUESTS[1] and r["keys"] == most]
    mid = [r["vs_baseline"] for r in rows if r["request_size"] == KPIO_REQUESTS[0]
           and 1 < r["keys"] <= 256]
    if small and worst and large:
        L.append(
            f"\nKeys are expanded once, when loaded, so switching costs no key schedule; what it "
            f"costs is cache misses on the round keys and the table. With {most} keys, 4 KiB "
            f"requests run at {min(worst):.2f}x to {max(worst):.2f}x of one key's rate and 128 KiB "
            f"requests at {min(large):.2f}x to {max(large):.2f}x (the misses are paid once per "
            f"request, so large requests hide them)"
            + (f"; up to 256 keys, whose round keys stay in the caches, 4 KiB requests keep "
               f"{min(mid):.2f}x or more" if mid else "") + ".\n")
    return L


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--quick", action="store_true", help="seconds, not a measurement (tests)")
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--seconds", type=float)
    ap.add_argument("--size-mib", type=int)
    ap.add_argument("--sectorcrypt", help="the sectorcrypt binary (default: a release build)")
    ap.add_argument("--max-steal", type=float, default=5.0, metavar="PERCENT",
                    help="take a sample again when the hypervisor stole more of the CPU time "
                    "during it (default: 5)")
    ap.add_argument("--attempts", type=int,
                    help="samples taken at most per measurement (default: 4; 1 with --quick)")
    ap.add_argument("--report-only", action="store_true",
                    help="rewrite report.md and the figures from DIR/results.json")
    args = ap.parse_args()
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.seconds = args.seconds or (0.3 if args.quick else 10)
    args.size_mib = args.size_mib or (32 if args.quick else 1024)
    args.attempts = args.attempts or (1 if args.quick else 4)
    d = Path(args.dir)
    if args.report_only:
        res = json.loads((d / "results.json").read_text())
    else:
        res = measure(args)
        (d / "results.json").write_text(json.dumps(res, indent=1))
    report(res, d)
    print(f"study: report in {d / 'report.md'}")


if __name__ == "__main__":
    main()
