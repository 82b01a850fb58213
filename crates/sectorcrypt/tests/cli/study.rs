//! The encryption-at-rest study (`scripts/study.py`, issue 15) in quick mode: the whole pipeline
//! (images, every contender's server, fio's nbd engine, CPU from /proc, the report) runs and its
//! report is complete and well-formed. A check of the pipeline, not a measurement: nothing here
//! asserts a speed.

use std::path::Path;
use std::process::Command;

use crate::common::{ok, p, python, run, scratch};

fn script() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/study.py")
}

#[test]
fn the_quick_study_writes_a_complete_report() {
    let dir = scratch("study-quick");
    let out = run(Command::new(python()).args([
        p(&script()),
        p(&dir),
        "--quick",
        "--sectorcrypt",
        env!("CARGO_BIN_EXE_sectorcrypt"),
    ]));
    let out = ok(out, "scripts/study.py --quick");
    assert!(String::from_utf8_lossy(&out.stdout).contains("report.md"));

    let results: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("results.json")).unwrap()).unwrap();
    let contenders: Vec<&str> = results["contenders"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    for wanted in [
        "plain (nbdkit file)",
        "sectorcrypt cipher_null",
        "sectorcrypt aes-xts-512",
        "sectorcrypt lea-xts-512",
        "nbdkit luks filter (LUKS1 aes-xts)",
        "qemu-nbd luks (LUKS1 aes-xts)",
    ] {
        assert!(
            contenders.contains(&wanted),
            "{wanted} missing: {contenders:?}"
        );
    }
    // Six tests of the matrix, three latencies, four sweeps at jobs 1 and 2, per contender.
    let samples = results["samples"].as_array().unwrap();
    assert_eq!(samples.len(), contenders.len() * (6 + 3 + 4 * 2));
    for s in samples {
        let what = format!("{} {}", s["contender"], s["workload"]);
        assert!(s["bytes"].as_f64().unwrap() > 0.0, "{what}: nothing moved");
        assert!(s["bandwidth_mib_s"].as_f64().unwrap() > 0.0, "{what}");
        assert!(s["lat_mean_us"].as_f64().unwrap() > 0.0, "{what}");
        assert!(s["server_cpu_s"].as_f64().unwrap() >= 0.0, "{what}");
        let steal = s["steal"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&steal), "{what}: steal {steal}");
        assert_eq!(
            s["attempts"], 1,
            "{what}: quick mode takes each sample once"
        );
    }
    // Key per I/O: 1 and 64 keys, both directions, 4 KiB and 128 KiB requests; one key is the
    // baseline of each.
    let kpio = results["kpio"].as_array().unwrap();
    assert_eq!(kpio.len(), 2 * 2 * 2);
    for r in kpio {
        assert!(r["requests_per_sec"].as_f64().unwrap() > 0.0, "{r}");
        let steal = r["steal_max"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&steal), "{r}");
        if r["keys"] == 1 {
            assert_eq!(r["vs_baseline"], 1.0, "{r}");
        }
    }
    // The dm-crypt line says whether it ran, and why not.
    let dm = &results["dm_crypt"];
    assert!(dm["measured"].as_bool().unwrap() || !dm["why_not"].as_str().unwrap().is_empty());

    let report = std::fs::read_to_string(dir.join("report.md")).unwrap();
    for section in [
        "## Bandwidth",
        "## CPU",
        "## Latency at queue depth 1",
        "## Bandwidth and CPU against the number of jobs",
        "## What this means",
        "## Key per I/O in software",
        "dm-crypt:",
        "3.29x",
        "Hypervisor steal during the samples",
        "The hypervisor stole at most",
    ] {
        assert!(report.contains(section), "the report lacks {section}");
    }
    for c in &contenders {
        assert!(report.contains(c), "the report does not name {c}");
    }
    // Every figure the report shows exists and is well-formed XML.
    let figures: Vec<&str> = report
        .split("](")
        .skip(1)
        .map(|rest| &rest[..rest.find(')').unwrap()])
        .collect();
    assert_eq!(figures.len(), 2 + 4 * 2 + 1, "{figures:?}");
    let check = "import sys, xml.etree.ElementTree as E\nfor f in sys.argv[1:]: E.parse(f)";
    let mut cmd = Command::new(python());
    cmd.args(["-c", check]);
    for f in &figures {
        assert!(f.ends_with(".svg"), "{f}");
        cmd.arg(dir.join(f));
    }
    ok(run(&mut cmd), "parsing the figures");
    // The report is a function of the results: rewritten from them, it is the same.
    ok(
        run(Command::new(python()).args([p(&script()), p(&dir), "--report-only"])),
        "--report-only",
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("report.md")).unwrap(),
        report
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The steal gate of the benchmark scripts (`scripts/steal.py`): a sample taken while the
/// hypervisor stole more than the limit is taken again, the least stolen attempt is kept, and
/// the report's sentence counts both. Fed made-up /proc/stat readings, so the outcome is fixed.
#[test]
fn a_sample_taken_under_steal_is_taken_again_and_the_least_stolen_is_kept() {
    let check = r#"
import sys
sys.path.insert(0, sys.argv[1])
from steal import cpu_ticks, measured, steal_fraction, summary

def readings(shares):
    # Before and after each call: 1000 ticks of which `share` stolen.
    t = dict.fromkeys(["user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal"], 0)
    out = []
    for share in shares:
        out.append(dict(t))
        t["steal"] += round(1000 * share)
        t["user"] += 1000 - round(1000 * share)
        out.append(dict(t))
    it = iter(out)
    return lambda: next(it)

def run(shares, attempts):
    calls = []
    def take():
        calls.append(len(calls) + 1)
        return calls[-1]
    got = measured(take, 0.05, attempts, ticks=readings(shares), pause=0)
    return got, len(calls)

# Under the limit at the third call: it is kept, and nothing more is taken.
(result, steal, tries), n = run([0.30, 0.10, 0.02, 0.0], 4)
assert (result, round(steal, 3), tries, n) == (3, 0.02, 3, 3), (result, steal, tries, n)
# Never under it: the least stolen call is kept, not the last.
(result, steal, tries), n = run([0.30, 0.10, 0.20, 0.40], 4)
assert (result, round(steal, 3), tries, n) == (2, 0.1, 4, 4), (result, steal, tries, n)
# One attempt: measured, not repeated.
(result, steal, tries), n = run([0.50], 1)
assert (result, tries, n) == (1, 1, 1)
# Prepared before each call, outside the measured window.
order = []
measured(lambda: order.append("take"), 0.05, 2, prepare=lambda: order.append("prepare"),
         ticks=readings([0.5, 0.5]), pause=0)
assert order == ["prepare", "take", "prepare", "take"], order

text = summary([{"steal": 0.01, "attempts": 1}, {"steal": 0.09, "attempts": 3}], 0.05)
assert "1 of 2 samples were taken again" in text and "1 stayed above it" in text, text
assert "at most 9.0%" in text, text
assert "not recorded" in summary([{"bytes": 1}], 0.05)
# This machine's own counters read, and a share is a share.
now = cpu_ticks()
assert 0.0 <= steal_fraction(now, cpu_ticks()) <= 1.0
print("ok")
"#;
    let scripts = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts");
    let out = ok(
        run(Command::new(python()).args(["-c", check, p(&scripts)])),
        "scripts/steal.py",
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok");
}
