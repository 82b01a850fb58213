//! The P/E study as a report (`sectorcrypt flash study --report DIR`): Markdown with its tables,
//! SVG figures ([`crate::svg`]) and the raw rows as JSON, written into one directory.
//!
//! - `report.md`: what was run (command, machine, traces and their chips, stacks), a table per
//!   trace of erases per eraseblock (workload and whole run, ratio to plain UBI, erases per GiB
//!   written), the thesis' reference figures, the throughput table, the figures embedded.
//! - `pe-per-peb-<trace>.svg`: each stack's erases per eraseblock during the workload, the
//!   eraseblocks sorted from the most erased (a logarithmic axis when the stacks' ranges differ
//!   by 10x or more).
//! - `ratio-by-workload.svg`: each encrypted stack's mean erases per eraseblock over plain UBI's,
//!   by trace (bars: the workload; rings: the whole run), with the 1.1x target and the thesis'
//!   24.43x.
//! - `throughput.svg`: LEB write and read throughput by request size, and relative to plain.
//! - `results.json`: every row, the per-eraseblock counts included.
//!
//! Each stack keeps its color and dash pattern in every figure. Any stacks and any number of
//! them: the ratios are to the stack called `plain` on the same trace (or request size), and
//! are left out where there is none.

use std::collections::HashSet;
use std::io;
use std::path::Path;

use sectorcrypt_flash::Geometry;
use serde_json::{json, Value};

use crate::flash::{FlashMeasurement, Stack, SLC_TIMES};
use crate::svg::{self, Anchor, Area, Axis, Labels, Scale, Style, Svg};
use crate::wear::Wear;

/// The thesis' mean erases per eraseblock under iozone: encrypted, plain.
pub const THESIS_MEAN: (f64, f64) = (41.28, 1.69);
/// The thesis' maximum erases per eraseblock under iozone: encrypted, plain.
pub const THESIS_MAX: (u64, u64) = (68, 2);
/// The thesis' ratio of the means.
pub const THESIS_RATIO: f64 = 24.43;
/// The P/E cost a policy that hides free space aims at: this ratio to plain UBI's mean.
pub const TARGET_RATIO: f64 = 1.1;

/// One trace replayed on every stack.
#[derive(Clone, Debug)]
pub struct TraceWear {
    /// The trace's name (its file name).
    pub name: String,
    /// The chip it was recorded on.
    pub geometry: Geometry,
    /// Bytes the workload wrote into UBI's data areas.
    pub workload_bytes: u64,
    /// One row per stack.
    pub rows: Vec<Wear>,
}

/// The throughput measurements and how they were made.
#[derive(Clone, Debug)]
pub struct Throughput {
    /// Bytes written and read per measurement.
    pub bytes: usize,
    /// Fresh stacks per measurement (the median reported).
    pub rounds: usize,
    /// One row per stack and request size.
    pub rows: Vec<FlashMeasurement>,
}

/// Everything a report shows.
#[derive(Clone, Debug)]
pub struct Report {
    /// The command line that made it.
    pub command: Vec<String>,
    /// The traces, in the order they were given.
    pub traces: Vec<TraceWear>,
    /// The throughput part.
    pub throughput: Throughput,
}

/// Write the report's files into `dir` (which must exist), replacing files of the same names;
/// returns their names, `report.md` first.
///
/// Errors: what writing a file answers.
pub fn write(dir: &Path, report: &Report) -> io::Result<Vec<String>> {
    let palette = Palette::new(
        report
            .traces
            .iter()
            .flat_map(|t| t.rows.iter().map(|r| r.stack.as_str()))
            .chain(report.throughput.rows.iter().map(|m| m.stack.as_str())),
    );
    let mut figures = Vec::new();
    let mut taken = HashSet::new();
    for t in &report.traces {
        let base = format!("pe-per-peb-{}", slug(&t.name));
        let mut name = format!("{base}.svg");
        for n in 2.. {
            if taken.insert(name.clone()) {
                break;
            }
            name = format!("{base}-{n}.svg");
        }
        figures.push((name, pe_figure(t, &palette)));
    }
    let per_trace: Vec<String> = figures.iter().map(|(n, _)| n.clone()).collect();
    figures.push((
        "ratio-by-workload.svg".into(),
        ratio_figure(&report.traces, &palette),
    ));
    figures.push((
        "throughput.svg".into(),
        throughput_figure(&report.throughput.rows, &palette),
    ));
    std::fs::write(dir.join("report.md"), markdown(report, &per_trace))?;
    std::fs::write(
        dir.join("results.json"),
        serde_json::to_string_pretty(&results(report)).expect("serializable") + "\n",
    )?;
    let mut names = vec!["report.md".to_string(), "results.json".to_string()];
    for (name, text) in figures {
        std::fs::write(dir.join(&name), text)?;
        names.push(name);
    }
    Ok(names)
}

/// Each stack's style, by first appearance: colors that stay apart for color-blind readers
/// (Okabe and Ito), and dash patterns so that equal curves drawn over each other still show.
struct Palette(Vec<String>);

const COLORS: [&str; 8] = [
    "#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#8C564B",
];
const DASHES: [&str; 4] = ["", "8 3", "2 3", "10 3 2 3"];

impl Palette {
    fn new<'a>(names: impl Iterator<Item = &'a str>) -> Palette {
        let mut seen = Vec::<String>::new();
        for name in names {
            if !seen.iter().any(|s| s == name) {
                seen.push(name.to_string());
            }
        }
        Palette(seen)
    }

    fn style(&self, stack: &str) -> Style {
        let i = self.0.iter().position(|s| s == stack).unwrap_or(0);
        Style {
            color: COLORS[i % COLORS.len()],
            dash: DASHES[i % DASHES.len()],
        }
    }
}

/// The name of the plain stack, which ratios are taken to.
fn plain() -> String {
    Stack::Plain.name()
}

/// `a / b`, if `b` is not 0.
fn ratio(a: f64, b: f64) -> Option<f64> {
    (b > 0.0).then(|| a / b)
}

/// A trace's name without `.xz` and `.trace`.
fn short(name: &str) -> &str {
    let name = name.strip_suffix(".xz").unwrap_or(name);
    name.strip_suffix(".trace").unwrap_or(name)
}

/// A trace's short name with what is not a letter, digit, `.`, `_` or `-` replaced by `_`.
fn slug(name: &str) -> String {
    short(name)
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Text for a figure or a table: a ratio.
fn times(r: f64) -> String {
    if r >= 100.0 {
        format!("{r:.0}x")
    } else {
        format!("{r:.2}x")
    }
}

/// A ratio, or `n/a` where there is none.
fn shown(r: Option<f64>) -> String {
    r.map_or_else(|| "n/a".to_string(), times)
}

fn pe_figure(t: &TraceWear, palette: &Palette) -> String {
    let (width, height) = (900.0, 470.0);
    let area = Area {
        left: 80.0,
        top: 64.0,
        right: 600.0,
        bottom: height - 64.0,
    };
    let mut svg = Svg::new(
        width,
        height,
        &format!("Erases per eraseblock during the workload: {}", t.name),
    );
    let maxes: Vec<f64> = t
        .rows
        .iter()
        .map(|r| r.per_peb.iter().copied().max().unwrap_or(0) as f64)
        .collect();
    let top = maxes.iter().copied().fold(0.0, f64::max);
    let least = maxes
        .iter()
        .copied()
        .filter(|&m| m > 0.0)
        .fold(top, f64::min);
    let scale = if top >= 10.0 * least.max(1.0) {
        Scale::LogPlusOne
    } else {
        Scale::Linear
    };
    let blocks = t.rows.iter().map(|r| r.per_peb.len()).max().unwrap_or(0);
    let x = Axis::new(
        Scale::Linear,
        0.0,
        blocks.max(1) as f64,
        area.left,
        area.right,
    );
    let y = Axis::covering(scale, maxes.iter().copied(), area.bottom, area.top);
    let x_ticks: Vec<(f64, String)> = x
        .ticks()
        .into_iter()
        .map(|v| (x.at(v), svg::short_number(v)))
        .collect();
    let y_label = if scale == Scale::Linear {
        "erases per eraseblock"
    } else {
        "erases per eraseblock (log scale of 1 + erases)"
    };
    svg::axes(
        &mut svg,
        area,
        &Labels {
            title: &format!(
                "{} eraseblocks of {} KiB{}",
                t.geometry.peb_count,
                t.geometry.peb_size >> 10,
                if blocks > t.geometry.peb_count as usize {
                    ", and the layer's journal where it has one"
                } else {
                    ""
                }
            ),
            x: "eraseblocks, the most erased first",
            y: y_label,
        },
        &x_ticks,
        &y,
        svg::short_number,
    );
    for r in &t.rows {
        let mut counts = r.per_peb.clone();
        counts.sort_unstable_by(|a, b| b.cmp(a));
        // A step for each run of equal counts.
        let mut points = Vec::new();
        let mut start = 0;
        for (i, &c) in counts.iter().enumerate() {
            if i + 1 == counts.len() || counts[i + 1] != c {
                let py = y.at(c as f64);
                points.push((x.at(start as f64), py));
                points.push((x.at((i + 1) as f64), py));
                start = i + 1;
            }
        }
        svg.polyline(&points, palette.style(&r.stack), 2.0);
    }
    let entries: Vec<(&str, Style)> = t
        .rows
        .iter()
        .map(|r| (r.stack.as_str(), palette.style(&r.stack)))
        .collect();
    svg::legend(&mut svg, area.right + 24.0, area.top + 10.0, &entries);
    let mut note_y = area.top + 10.0 + entries.len() as f64 * 18.0 + 14.0;
    svg.text(
        area.right + 24.0,
        note_y,
        Anchor::Start,
        11.0,
        "mean / max erases per eraseblock:",
    );
    for r in &t.rows {
        note_y += 15.0;
        svg.text(
            area.right + 24.0,
            note_y,
            Anchor::Start,
            11.0,
            &format!("{}: {:.2} / {}", r.stack, r.workload.mean, r.workload.max),
        );
    }
    svg.finish()
}

/// A row and its means over plain UBI's on the same trace (none without a plain row of non-zero
/// means).
struct Ratios<'a> {
    row: &'a Wear,
    workload: Option<f64>,
    whole: Option<f64>,
}

fn ratios(t: &TraceWear) -> Vec<Ratios<'_>> {
    let base = t.rows.iter().find(|r| r.stack == plain());
    t.rows
        .iter()
        .map(|row| Ratios {
            row,
            workload: base.and_then(|b| ratio(row.workload.mean, b.workload.mean)),
            whole: base.and_then(|b| ratio(row.whole.mean, b.whole.mean)),
        })
        .collect()
}

fn ratio_figure(traces: &[TraceWear], palette: &Palette) -> String {
    let all: Vec<Vec<Ratios>> = traces
        .iter()
        .map(|t| {
            let mut r = ratios(t);
            r.retain(|r| r.row.stack != plain());
            r
        })
        .collect();
    let mut stacks: Vec<&str> = Vec::new();
    for r in all.iter().flatten() {
        if !stacks.contains(&r.row.stack.as_str()) {
            stacks.push(&r.row.stack);
        }
    }
    let group = (28.0 * stacks.len() as f64 + 24.0).max(120.0);
    let area = Area {
        left: 80.0,
        top: 64.0,
        right: 80.0 + group * traces.len().max(1) as f64,
        bottom: 420.0,
    };
    let (width, height) = (area.right + 460.0, 490.0);
    let mut svg = Svg::new(
        width,
        height,
        "Mean erases per eraseblock: encrypted / plain UBI, by trace",
    );
    let values: Vec<f64> = all
        .iter()
        .flatten()
        .flat_map(|r| [r.workload, r.whole])
        .flatten()
        .filter(|v| v.is_finite() && *v > 0.0)
        .chain([1.0, TARGET_RATIO, THESIS_RATIO])
        .collect();
    let (lo, hi) = values.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), &v| {
        (lo.min(v), hi.max(v))
    });
    let y = Axis::new(
        Scale::Log,
        10f64.powf((lo / 2.0).log10().floor()),
        10f64.powf((hi * 1.3).log10().ceil()),
        area.bottom,
        area.top,
    );
    let x_ticks: Vec<(f64, String)> = traces
        .iter()
        .enumerate()
        .map(|(g, t)| {
            (
                area.left + group * (g as f64 + 0.5),
                short(&t.name).to_string(),
            )
        })
        .collect();
    svg::axes(
        &mut svg,
        area,
        &Labels {
            title: "log scale; plain UBI = 1x",
            x: "trace",
            y: "mean erases per eraseblock, stack / plain (log scale)",
        },
        &x_ticks,
        &y,
        |v| format!("{}x", svg::short_number(v)),
    );
    let bar = (group - 24.0) / stacks.len().max(1) as f64;
    for (g, (t, rows)) in traces.iter().zip(&all).enumerate() {
        for r in rows {
            let name = r.row.stack.as_str();
            let i = stacks.iter().position(|s| *s == name).unwrap_or(0);
            let x = area.left + group * g as f64 + 12.0 + bar * i as f64;
            let style = palette.style(name);
            let tip = format!(
                "{}, {name}: {} during the workload, {} over the whole run",
                t.name,
                shown(r.workload),
                shown(r.whole)
            );
            if let Some(r) = r.workload {
                let top = y.at(r);
                svg.rect(
                    (x + 1.0, top),
                    (bar - 2.0, y.base() - top),
                    style.color,
                    &tip,
                );
                if bar >= 24.0 {
                    let label = if r >= 10.0 {
                        format!("{r:.0}x")
                    } else {
                        format!("{r:.1}x")
                    };
                    svg.text(x + bar / 2.0, top - 3.0, Anchor::Middle, 10.0, &label);
                }
            }
            if let Some(r) = r.whole {
                svg.dot((x + bar / 2.0, y.at(r)), "#000", true, &tip);
            }
        }
    }
    svg::reference(
        &mut svg,
        area,
        y.at(TARGET_RATIO),
        Style {
            color: "#555",
            dash: "2 3",
        },
        &format!("target {TARGET_RATIO}x"),
    );
    svg::reference(
        &mut svg,
        area,
        y.at(THESIS_RATIO),
        Style {
            color: "#000",
            dash: "8 3",
        },
        &format!("thesis, iozone: {THESIS_RATIO}x"),
    );
    let entries: Vec<(&str, Style)> = stacks.iter().map(|s| (*s, palette.style(s))).collect();
    let lx = area.right + 160.0;
    svg::legend(&mut svg, lx, area.top + 10.0, &entries);
    let below = area.top + 10.0 + entries.len() as f64 * 18.0;
    svg.dot((lx + 14.0, below - 4.0), "#000", true, "whole run");
    svg.text(lx + 34.0, below, Anchor::Start, 12.0, "whole run");
    for (i, note) in [
        "bars: during the workload",
        "rings: the whole run (attach, format,",
        "unmount included)",
    ]
    .into_iter()
    .enumerate()
    {
        svg.text(
            lx,
            below + 24.0 + 15.0 * i as f64,
            Anchor::Start,
            11.0,
            note,
        );
    }
    svg.finish()
}

/// A request size as a tick label.
fn size_label(bytes: usize) -> String {
    if bytes.is_multiple_of(1024) {
        format!("{} KiB", bytes / 1024)
    } else {
        format!("{bytes} B")
    }
}

fn throughput_figure(rows: &[FlashMeasurement], palette: &Palette) -> String {
    let (width, height) = (1080.0, 720.0);
    let mut svg = Svg::new(
        width,
        height,
        "UBI LEB throughput on a simulated chip in memory, by request size",
    );
    let mut stacks: Vec<&str> = Vec::new();
    let mut sizes: Vec<usize> = Vec::new();
    for m in rows {
        if !stacks.contains(&m.stack.as_str()) {
            stacks.push(&m.stack);
        }
        if !sizes.contains(&m.request_size) {
            sizes.push(m.request_size);
        }
    }
    let base = |m: &FlashMeasurement| {
        rows.iter()
            .find(|p| p.stack == plain() && p.request_size == m.request_size)
    };
    type Metric = fn(&FlashMeasurement) -> f64;
    let write: Metric = |m| m.write_bytes_per_sec / 1e6;
    let read: Metric = |m| m.read_bytes_per_sec / 1e6;
    let panels: [(&str, Metric, bool); 4] = [
        ("writes", write, false),
        ("reads", read, false),
        ("writes, relative to plain", write, true),
        ("reads, relative to plain", read, true),
    ];
    let (lo, hi) = (
        sizes.iter().copied().min().unwrap_or(2048) as f64,
        sizes.iter().copied().max().unwrap_or(2048) as f64,
    );
    for (k, (title, metric, relative)) in panels.into_iter().enumerate() {
        let (left, top) = (90.0 + 420.0 * (k % 2) as f64, 70.0 + 330.0 * (k / 2) as f64);
        let area = Area {
            left,
            top,
            right: left + 320.0,
            bottom: top + 230.0,
        };
        let value = |m: &FlashMeasurement| -> Option<f64> {
            if relative {
                base(m).and_then(|b| ratio(metric(m), metric(b)))
            } else {
                Some(metric(m))
            }
        };
        let x = Axis::new(Scale::Log, lo / 1.3, hi * 1.3, area.left, area.right);
        let y = Axis::covering(
            Scale::Log,
            rows.iter().filter_map(value).chain(relative.then_some(1.0)),
            area.bottom,
            area.top,
        );
        let x_ticks: Vec<(f64, String)> = sizes
            .iter()
            .map(|&s| (x.at(s as f64), size_label(s)))
            .collect();
        svg::axes(
            &mut svg,
            area,
            &Labels {
                title,
                x: "request size",
                y: if relative {
                    "stack / plain (log scale)"
                } else {
                    "MB/s (log scale)"
                },
            },
            &x_ticks,
            &y,
            |v| {
                if relative {
                    format!("{}x", svg::short_number(v))
                } else {
                    svg::short_number(v)
                }
            },
        );
        for stack in &stacks {
            let style = palette.style(stack);
            let mut points: Vec<(usize, f64)> = rows
                .iter()
                .filter(|m| m.stack == *stack)
                .filter_map(|m| value(m).map(|v| (m.request_size, v)))
                .collect();
            points.sort_by_key(|&(s, _)| s);
            let at: Vec<(f64, f64)> = points
                .iter()
                .map(|&(s, v)| (x.at(s as f64), y.at(v)))
                .collect();
            svg.polyline(&at, style, 2.0);
            for (&(s, v), &p) in points.iter().zip(&at) {
                let shown = if relative {
                    times(v)
                } else {
                    format!("{v:.1} MB/s")
                };
                svg.dot(p, style.color, false, &format!("{stack}, {s} B: {shown}"));
            }
        }
    }
    let entries: Vec<(&str, Style)> = stacks.iter().map(|s| (*s, palette.style(s))).collect();
    svg::legend(&mut svg, 860.0, 80.0, &entries);
    svg.finish()
}

/// Cheap facts about this machine: CPU model, CPUs available, kernel, memory.
fn machine() -> Vec<(&'static str, String)> {
    let proc = |path: &str| std::fs::read_to_string(path).unwrap_or_default();
    let field = |text: &str, key: &str| -> Option<String> {
        text.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim() == key).then(|| v.trim().to_string())
        })
    };
    let cpuinfo = proc("/proc/cpuinfo");
    let mut facts = vec![
        (
            "CPU",
            field(&cpuinfo, "model name")
                .or_else(|| field(&cpuinfo, "Hardware"))
                .unwrap_or_else(|| std::env::consts::ARCH.to_string()),
        ),
        (
            "CPUs available",
            std::thread::available_parallelism()
                .map_or(1, |n| n.get())
                .to_string(),
        ),
    ];
    let kernel = proc("/proc/sys/kernel/osrelease");
    if !kernel.trim().is_empty() {
        facts.push((
            "kernel",
            format!("{} {}", std::env::consts::OS, kernel.trim()),
        ));
    }
    if let Some(kib) = field(&proc("/proc/meminfo"), "MemTotal")
        .and_then(|v| v.trim_end_matches("kB").trim().parse::<f64>().ok())
    {
        facts.push(("memory", format!("{:.1} GiB", kib / f64::from(1u32 << 20))));
    }
    facts
}

/// A Markdown table.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let cell = |s: &str| s.replace('|', "\\|");
    let line = |cells: &mut dyn Iterator<Item = String>| {
        format!("| {} |\n", cells.collect::<Vec<_>>().join(" | "))
    };
    let mut out = line(&mut header.iter().map(|h| cell(h)));
    out += &line(&mut header.iter().map(|_| "---".to_string()));
    for r in rows {
        out += &line(&mut r.iter().map(|c| cell(c)));
    }
    out
}

/// The command line as one would type it (arguments with spaces or quotes single-quoted).
fn shell_line(args: &[String]) -> String {
    args.iter()
        .map(|a| {
            if !a.is_empty()
                && a.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c))
            {
                a.clone()
            } else {
                format!("'{}'", a.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn spread(s: &crate::wear::Spread) -> String {
    format!("{} / {:.2} / {}", s.min, s.mean, s.max)
}

fn markdown(report: &Report, per_trace: &[String]) -> String {
    let mut md = what_was_run(report);
    md += &erases_section(report, per_trace);
    md += &against_the_thesis();
    md += &throughput_section(&report.throughput);
    md += "\n## Files\n\n- `results.json`: every row above, with each stack's erases of every \
           eraseblock during the workload (`per_peb`, by PEB number: UBI's, then the layer's journal's \
           where it has one) and the machine facts.\n";
    md
}

/// The report's title, command, machine, traces and stacks.
fn what_was_run(report: &Report) -> String {
    let mut md = String::from(
        "# Flash study: erases per eraseblock with and without the encryption layer\n\n",
    );
    md += &format!(
        "Written by sectorcrypt {} with:\n\n```sh\n{}\n```\n\n",
        env!("CARGO_PKG_VERSION"),
        shell_line(&report.command)
    );
    md += "## What was run\n\n";
    for (key, value) in machine() {
        md += &format!("- {key}: {value}\n");
    }
    md += "\nEach trace (the flash operations UBI issued, in order) is replayed on a fresh \
           simulated chip of its geometry once per stack; the erase counts are the chip's own, so \
           every erase the encryption layer adds is counted.\n\n";
    let traces: Vec<Vec<String>> = report
        .traces
        .iter()
        .map(|t| {
            let g = &t.geometry;
            vec![
                t.name.clone(),
                format!("{} x {} KiB", g.peb_count, g.peb_size >> 10),
                format!(
                    "{} B ({} B sub-pages, NOP {})",
                    g.page_size, g.sub_page_size, g.nop
                ),
                format!("{:.1} MiB", t.workload_bytes as f64 / f64::from(1u32 << 20)),
            ]
        })
        .collect();
    md += &table(
        &["trace", "eraseblocks", "pages", "workload wrote"],
        &traces,
    );
    let stacks = Palette::new(
        report
            .traces
            .iter()
            .flat_map(|t| t.rows.iter().map(|r| r.stack.as_str())),
    );
    md += &format!(
        "\nStacks: {}.\n\n",
        stacks
            .0
            .iter()
            .map(|s| format!("`{s}`"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    md
}

/// Erases per eraseblock: one table and figure per trace.
fn erases_section(report: &Report, per_trace: &[String]) -> String {
    let mut md = String::new();
    md += "## Erases per eraseblock\n\n\"Workload\": after the trace's `# workload starts`; \
           \"whole run\": attach, format and unmount included. \"vs plain\": the ratio of the \
           means to plain UBI's on the same trace. Erases per GiB: the workload's erases over \
           the bytes it wrote into UBI's data areas.\n";
    for (t, figure) in report.traces.iter().zip(per_trace) {
        let rows: Vec<Vec<String>> = ratios(t)
            .iter()
            .map(|r| {
                vec![
                    r.row.stack.clone(),
                    spread(&r.row.workload),
                    shown(r.workload),
                    spread(&r.row.whole),
                    shown(r.whole),
                    format!("{:.0}", r.row.erases_per_gib),
                ]
            })
            .collect();
        md += &format!("\n### {}\n\n", t.name);
        md += &table(
            &[
                "stack",
                "workload min / mean / max",
                "vs plain",
                "whole run min / mean / max",
                "vs plain",
                "erases per GiB written",
            ],
            &rows,
        );
        md += &format!(
            "\n![Erases per eraseblock during the workload, {}, by stack]({figure})\n",
            t.name
        );
    }
    md
}

/// The thesis' own numbers, and the figure that sets them beside the run's.
fn against_the_thesis() -> String {
    format!(
        "\n## Against the thesis\n\nThe thesis measured, under iozone on UBIFS: mean {} vs {} \
         erases per eraseblock ({}x), maximum {} vs {} (encrypted vs plain UBI). The dashed \
         line marks its {}x, the dotted one the {}x target.\n\n\
         ![Mean erases per eraseblock, encrypted over plain UBI, by trace and stack](ratio-by-workload.svg)\n",
        THESIS_MEAN.0, THESIS_MEAN.1, THESIS_RATIO, THESIS_MAX.0, THESIS_MAX.1, THESIS_RATIO, TARGET_RATIO
    )
}

/// LEB write and read throughput by stack and request size.
fn throughput_section(th: &Throughput) -> String {
    let mut md = String::new();
    let g = crate::flash::geometry();
    md += &format!(
        "\n## Throughput\n\nUBI's LEB writes and reads on a simulated chip in memory ({} \
         eraseblocks of {} KiB, {} B pages), as `sectorcrypt flash benchmark` measures them: {:.2} \
         MiB per measurement, the median of {} round(s). The SLC columns time the same chip \
         operations as a typical SLC chip would take them (read {:.0} us per page, program {:.0} \
         us, erase {:.0} ms).\n\n",
        g.peb_count,
        g.peb_size >> 10,
        g.page_size,
        th.bytes as f64 / f64::from(1u32 << 20),
        th.rounds,
        SLC_TIMES.0 * 1e6,
        SLC_TIMES.1 * 1e6,
        SLC_TIMES.2 * 1e3,
    );
    let rows: Vec<Vec<String>> = th
        .rows
        .iter()
        .map(|m| {
            let base = th
                .rows
                .iter()
                .find(|p| p.stack == plain() && p.request_size == m.request_size);
            let vs = |f: fn(&FlashMeasurement) -> f64| shown(base.and_then(|b| ratio(f(m), f(b))));
            vec![
                m.stack.clone(),
                m.request_size.to_string(),
                format!("{:.1}", m.write_bytes_per_sec / 1e6),
                vs(|m| m.write_bytes_per_sec),
                format!("{:.1}", m.read_bytes_per_sec / 1e6),
                vs(|m| m.read_bytes_per_sec),
                format!("{:.2}", m.slc_write_bytes_per_sec / 1e6),
                format!("{:.2}", m.slc_read_bytes_per_sec / 1e6),
                format!("{:.2}", m.erases_per_peb),
                format!("{:.1}", m.cipher_calls_per_peb),
                format!("{:.1}%", m.cipher_share_of_write * 100.0),
            ]
        })
        .collect();
    md += &table(
        &[
            "stack",
            "request (B)",
            "write MB/s",
            "vs plain",
            "read MB/s",
            "vs plain",
            "SLC write MB/s",
            "SLC read MB/s",
            "erases per PEB",
            "cipher calls per PEB",
            "cipher share of write",
        ],
        &rows,
    );
    md += "\n![LEB write and read throughput by request size and stack, and relative to plain](throughput.svg)\n";
    md
}

fn geometry_json(g: &Geometry) -> Value {
    json!({
        "peb_size": g.peb_size,
        "page_size": g.page_size,
        "sub_page_size": g.sub_page_size,
        "oob_size": g.oob_size,
        "peb_count": g.peb_count,
        "nop": g.nop,
    })
}

fn results(report: &Report) -> Value {
    let traces: Vec<Value> = report
        .traces
        .iter()
        .map(|t| {
            let rows: Vec<Value> = t
                .rows
                .iter()
                .map(|r| {
                    let mut v = serde_json::to_value(r).expect("serializable");
                    v["per_peb"] = json!(r.per_peb);
                    v
                })
                .collect();
            json!({
                "trace": t.name,
                "geometry": geometry_json(&t.geometry),
                "workload_bytes": t.workload_bytes,
                "rows": rows,
            })
        })
        .collect();
    json!({
        "command": report.command,
        "machine": machine().into_iter().map(|(k, v)| (k.to_string(), Value::from(v))).collect::<serde_json::Map<_, _>>(),
        "thesis": {
            "mean_erases_per_peb": {"encrypted": THESIS_MEAN.0, "plain": THESIS_MEAN.1},
            "max_erases_per_peb": {"encrypted": THESIS_MAX.0, "plain": THESIS_MAX.1},
            "ratio": THESIS_RATIO,
        },
        "traces": traces,
        "throughput": {
            "bytes": report.throughput.bytes,
            "rounds": report.throughput.rounds,
            "chip": geometry_json(&crate::flash::geometry()),
            "rows": report.throughput.rows,
        },
    })
}

#[cfg(test)]
mod tests {
    use sectorcrypt_flash::trace::Trace;
    use sectorcrypt_testkit::xml;

    use super::*;
    use crate::wear::{replay, study_stacks};

    /// A small trace: 8 blocks formatted, then a workload writing into two of them, erasing one
    /// and writing it again.
    fn trace() -> Trace {
        let mut text = String::from(
            "# peb_size 131072 leb_size 129024 peb_count 8 page 2048 subpage 512 vid_hdr_offset 512 data_offset 2048\n",
        );
        for peb in 0..8 {
            text += &format!("E {peb} 0 131072\nW {peb} 0 512\n");
        }
        text += "# workload starts\nW 1 512 512\nW 1 2048 2048\nW 1 4096 2048\nW 2 512 512\n\
                 W 2 2048 4096\nE 1 0 131072\nW 1 0 512\nW 1 512 512\nW 1 2048 2048\n";
        Trace::parse(&text).unwrap()
    }

    fn measurement(stack: &str, request_size: usize, write: f64) -> FlashMeasurement {
        FlashMeasurement {
            stack: stack.into(),
            request_size,
            write_bytes_per_sec: write,
            read_bytes_per_sec: 2.0 * write,
            slc_write_bytes_per_sec: 1e7,
            slc_read_bytes_per_sec: 8e7,
            erases_per_peb: 0.0,
            cipher_calls_per_peb: 0.0,
            cipher_bytes_per_peb: 0.0,
            cipher_share_of_write: 0.0,
        }
    }

    /// Every file written, each figure well-formed XML naming every stack, the Markdown
    /// embedding every figure with the numbers in its tables, the JSON holding every row with
    /// its per-eraseblock counts; a trace without a plain row gets no ratios, and names that
    /// need escaping stay well-formed.
    #[test]
    fn the_report_has_every_file_figure_and_number() {
        let t = trace();
        let rows = |name: &str| -> Vec<Wear> {
            study_stacks()
                .into_iter()
                .map(|s| replay(&t, name, s).unwrap())
                .collect()
        };
        let odd = "odd <&> 'name'.trace.xz";
        let report = Report {
            command: vec!["sectorcrypt".into(), "flash".into(), "it's here".into()],
            traces: vec![
                TraceWear {
                    name: "small.trace".into(),
                    geometry: t.geometry,
                    workload_bytes: t.workload_data_bytes(),
                    rows: rows("small.trace"),
                },
                TraceWear {
                    name: odd.into(),
                    geometry: t.geometry,
                    workload_bytes: t.workload_data_bytes(),
                    rows: rows(odd).split_off(1),
                },
            ],
            throughput: Throughput {
                bytes: 1 << 20,
                rounds: 1,
                rows: vec![
                    measurement("plain", 2048, 4e9),
                    measurement("a <b> & c", 2048, 1e9),
                    measurement("plain", 129_024, 4e9),
                    measurement("a <b> & c", 129_024, 2e9),
                ],
            },
        };
        let dir = sectorcrypt_testkit::scratch("bench-report");
        let files = write(&dir, &report).unwrap();
        assert_eq!(
            files,
            [
                "report.md",
                "results.json",
                "pe-per-peb-small.svg",
                "pe-per-peb-odd______name_.svg",
                "ratio-by-workload.svg",
                "throughput.svg"
            ]
        );
        let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap();
        let md = read("report.md");
        let stacks: Vec<String> = study_stacks().into_iter().map(Stack::name).collect();
        for (svg_name, names) in [
            ("pe-per-peb-small.svg", &stacks[..]),
            ("pe-per-peb-odd______name_.svg", &stacks[1..]),
            ("ratio-by-workload.svg", &stacks[1..]),
            (
                "throughput.svg",
                &["plain".to_string(), "a <b> & c".to_string()][..],
            ),
        ] {
            let text = read(svg_name);
            let elements = xml::elements(&text).unwrap_or_else(|e| panic!("{svg_name}: {e}"));
            assert_eq!(elements[0], "svg");
            for name in names {
                assert!(text.contains(&svg::escape(name)), "{name} in {svg_name}");
            }
            assert!(
                md.contains(&format!("]({svg_name})")),
                "{svg_name} in the Markdown"
            );
        }
        assert!(
            read("pe-per-peb-odd______name_.svg").contains("odd &lt;&amp;&gt; &apos;name&apos;")
        );
        let ratio = read("ratio-by-workload.svg");
        assert!(ratio.contains("24.43x") && ratio.contains("target 1.1x"));
        // The tables: the plain row of the first trace, a thesis ratio, n/a without plain,
        // throughput relative to plain.
        let small = &report.traces[0].rows;
        let thesis = small.iter().find(|r| r.stack.ends_with(" thesis")).unwrap();
        assert!(thesis.workload.mean > small[0].workload.mean);
        assert!(md.contains(&format!(
            "| plain | {} / {:.2} / {} | 1.00x |",
            small[0].workload.min, small[0].workload.mean, small[0].workload.max
        )));
        assert!(md.contains(&format!(
            "| {:.2}x |",
            thesis.workload.mean / small[0].workload.mean
        )));
        assert!(md.contains("| n/a |"));
        assert!(md.contains("| a <b> & c | 2048 | 1000.0 | 0.25x | 2000.0 | 0.25x |"));
        assert!(md.contains("| a <b> & c | 129024 | 2000.0 | 0.50x |"));
        assert!(md.contains("sectorcrypt flash 'it'\\''s here'"));
        assert!(md.contains("24.43x") && md.contains("41.28") && md.contains("68 vs 2"));
        let json: Value = serde_json::from_str(&read("results.json")).unwrap();
        let first = json["traces"][0]["rows"].as_array().unwrap();
        assert_eq!(first.len(), stacks.len());
        for (row, wear) in first.iter().zip(small) {
            assert_eq!(row["stack"], wear.stack.as_str());
            assert_eq!(row["per_peb"], json!(wear.per_peb));
            assert!(wear.per_peb.len() >= 8);
        }
        assert_eq!(
            json["traces"][1]["rows"].as_array().unwrap().len(),
            stacks.len() - 1
        );
        assert_eq!(json["throughput"]["rows"].as_array().unwrap().len(), 4);
    }
}
