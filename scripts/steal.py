"""Hypervisor steal around a measurement, for the benchmark scripts.

On a shared virtual machine the host sometimes runs other guests on this guest's CPUs. The guest
kernel counts that time as "steal" in /proc/stat. A server measured while a fifth of the CPU time
is stolen moves far less than the same server a minute later, and both the bandwidth and the CPU
per GiB of a fio run follow the steal (docs/BENCHMARKS.md, "Steal: what makes a round on a shared
host worthless"). Ratios between contenders measured under different steal say nothing about the
contenders.

So a measurement is taken with the steal during it. One taken above the limit is taken again, a
few times, and the attempt with the least steal is kept, with its steal, so that a report can
say what it rests on.
"""

import statistics
import time

# Fields of /proc/stat's "cpu" line, in order (proc(5)); guest time is already in user and nice.
_FIELDS = ["user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal"]


def cpu_ticks():
    """The machine's CPU time so far, per field of /proc/stat's `cpu` line, in clock ticks."""
    with open("/proc/stat") as f:
        line = f.readline().split()
    if line[0] != "cpu":
        raise RuntimeError("steal: /proc/stat does not start with the cpu line")
    values = [int(v) for v in line[1:1 + len(_FIELDS)]]
    values += [0] * (len(_FIELDS) - len(values))  # kernels without a steal field
    return dict(zip(_FIELDS, values))


def steal_fraction(before, after):
    """The share of all CPU time between two `cpu_ticks()` readings that was stolen."""
    delta = {k: after[k] - before[k] for k in _FIELDS}
    total = sum(delta.values())
    return delta["steal"] / total if total > 0 else 0.0


def measured(take, max_steal, attempts, prepare=None, ticks=cpu_ticks, pause=1.0):
    """Call `take()` until the steal during a call is at most `max_steal` (a fraction), at most
    `attempts` times, each after `prepare()` (not counted). Returns the result and steal of the
    call with the least steal, and the number of calls made. (`ticks` and `pause` are for
    tests.)"""
    best = None  # (result, steal)
    for tries in range(1, max(attempts, 1) + 1):
        if prepare:
            prepare()
        before = ticks()
        result = take()
        steal = steal_fraction(before, ticks())
        if best is None or steal < best[1]:
            best = (result, steal)
        if steal <= max_steal:
            break
        # A burst of steal often lasts a few seconds: let it pass before trying again.
        if tries < attempts:
            time.sleep(pause)
    return best[0], best[1], tries


def summary(samples, max_steal):
    """One sentence on the steal behind a run's samples (dicts with `steal` and `attempts`, as
    the scripts record them), for a report."""
    steals = [s["steal"] for s in samples if "steal" in s]
    if not steals:
        return "Hypervisor steal was not recorded for these samples."
    retried = sum(1 for s in samples if s.get("attempts", 1) > 1)
    above = sum(1 for v in steals if v > max_steal)
    text = (f"Hypervisor steal during the samples: median {100 * statistics.median(steals):.1f}%, "
            f"at most {100 * max(steals):.1f}% (limit {100 * max_steal:g}%); {retried} of "
            f"{len(steals)} samples were taken again because the steal exceeded the limit")
    if above:
        return (text + f", and {above} stayed above it: those measure the host as much as the "
                "servers.")
    return text + "."
