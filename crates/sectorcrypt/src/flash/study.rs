//! The measurements: `flash benchmark` (LEB throughput with and without the encryption layer) and `flash study` (erases per eraseblock on recorded traces).

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::exit::{CliError, Code};
use crate::progress::Steps;
use sectorcrypt_storage::units::parse_size;

#[derive(clap::Args, Debug)]
pub(crate) struct BenchArgs {
    #[command(flatten)]
    measure: MeasureArgs,
    /// One JSON object per measurement, one per line.
    #[arg(long)]
    json: bool,
}

/// How UBI's throughput is measured: `flash benchmark`'s options, and `flash study --report`'s.
#[derive(clap::Args, Debug)]
pub(crate) struct MeasureArgs {
    /// Bytes per LEB write or read (repeatable; default one page to a whole LEB).
    #[arg(long = "request-size", value_name = "BYTES", value_parser = parse_size)]
    request_sizes: Vec<u64>,
    /// Bytes written and read per measurement.
    #[arg(long, value_name = "BYTES", default_value = "8MiB", value_parser = parse_size)]
    bytes: u64,
    /// Fresh stacks per measurement (the median is reported).
    #[arg(long, value_name = "N", default_value_t = 3)]
    rounds: usize,
}

impl MeasureArgs {
    /// The request sizes to measure, checked.
    fn sizes(&self) -> Result<Vec<usize>, CliError> {
        let sizes: Vec<usize> = if self.request_sizes.is_empty() {
            sectorcrypt_bench::flash::DEFAULT_REQUESTS.to_vec()
        } else {
            self.request_sizes.iter().map(|&s| s as usize).collect()
        };
        if let Some(bad) = sizes
            .iter()
            .find(|&&s| s == 0 || s % 2048 != 0 && s != 129_024)
        {
            return Err(CliError::usage(format!(
                "--request-size {bad}: LEB writes go in whole 2048-byte pages (or a whole LEB, 129024)"
            )));
        }
        Ok(sizes)
    }
}

pub(super) fn benchmark(args: BenchArgs) -> Result<(), CliError> {
    use sectorcrypt_bench::flash::{default_stacks, measure};
    let sizes = args.measure.sizes()?;
    let mut rows = Rows::new(args.json);
    rows.header(format!(
            "# UBI on a simulated 2 KiB-page SLC chip in memory, {} MiB per measurement; 'SLC' columns: the same\n# chip operations timed as a typical SLC chip (read 25 us/page, program 200 us/page, erase 2 ms)\n#{:>27} {:>8} {:>10} {:>10} {:>8} {:>9} {:>9} {:>8} {:>9} {:>9} {:>12} {:>7}\n",
            args.measure.bytes >> 20,
            "stack", "request", "write MB/s", "read MB/s", "vs plain", "SLC write", "SLC read", "vs plain", "erase/PEB", "calls/PEB", "cipher B/PEB", "cipher%"
        ))?;
    for &size in &sizes {
        let mut plain = None;
        for stack in default_stacks() {
            let m = measure(
                stack,
                size,
                args.measure.bytes as usize,
                args.measure.rounds,
            );
            let (base, slc_base) =
                *plain.get_or_insert((m.write_bytes_per_sec, m.slc_write_bytes_per_sec));
            rows.row(&m, || {
                format!(
                    "{:>28} {:>8} {:>10.1} {:>10.1} {:>7.2}x {:>9.2} {:>9.2} {:>7.3}x {:>9.2} {:>9.1} {:>12.0} {:>6.1}%\n",
                    m.stack,
                    size,
                    m.write_bytes_per_sec / 1e6,
                    m.read_bytes_per_sec / 1e6,
                    m.write_bytes_per_sec / base,
                    m.slc_write_bytes_per_sec / 1e6,
                    m.slc_read_bytes_per_sec / 1e6,
                    m.slc_write_bytes_per_sec / slc_base,
                    m.erases_per_peb,
                    m.cipher_calls_per_peb,
                    m.cipher_bytes_per_peb,
                    m.cipher_share_of_write * 100.0
                )
            })?;
        }
    }
    Ok(())
}

#[derive(clap::Args, Debug)]
#[command(group(
    clap::ArgGroup::new("throughput")
        .args(["request_sizes", "bytes", "rounds"])
        .multiple(true)
        .requires("report")
))]
pub(crate) struct StudyArgs {
    /// Trace files (`R|W|E pnum offset len` lines, xz-compressed or not).
    #[arg(value_name = "TRACE", required_unless_present = "synthetic")]
    traces: Vec<PathBuf>,
    /// Also replay the synthetic workloads (sequential and random LEB writes, UBIFS-like
    /// journal appends, small synced writes, volume updates; run on this UBI, with syncs).
    #[arg(long)]
    synthetic: bool,
    /// One JSON object per trace and stack, one per line.
    #[arg(long)]
    json: bool,
    /// Also measure the throughput (as flash benchmark) and write a report into DIR (made if
    /// missing; files of the same names replaced): report.md with the tables and the figures,
    /// an SVG figure per trace, ratio-by-workload.svg, throughput.svg, results.json.
    #[arg(long, value_name = "DIR")]
    report: Option<PathBuf>,
    #[command(
        flatten,
        next_help_heading = "Throughput in the report (with --report)"
    )]
    measure: MeasureArgs,
}

/// Measurement output: a text table (with its header), or one JSON object per row (`--json`).
struct Rows {
    out: std::io::StdoutLock<'static>,
    json: bool,
}

impl Rows {
    fn new(json: bool) -> Rows {
        Rows {
            out: std::io::stdout().lock(),
            json,
        }
    }

    fn write(&mut self, text: &str) -> Result<(), CliError> {
        self.out
            .write_all(text.as_bytes())
            .map_err(|e| CliError::io("cannot write the output", e))
    }

    /// The table's header (not in JSON).
    fn header(&mut self, text: String) -> Result<(), CliError> {
        if self.json {
            return Ok(());
        }
        self.write(&text)
    }

    /// One row: `value` as a JSON line, or `text` as a table line.
    fn row(
        &mut self,
        value: &impl serde::Serialize,
        text: impl FnOnce() -> String,
    ) -> Result<(), CliError> {
        let line = if self.json {
            format!("{}\n", serde_json::to_string(value).expect("serializable"))
        } else {
            text()
        };
        self.write(&line)
    }
}

/// `DIR` made if missing; refused if it is something else.
fn report_dir(dir: &Path) -> Result<(), CliError> {
    if dir.exists() && !dir.is_dir() {
        return Err(CliError::usage(format!(
            "--report {}: exists and is not a directory",
            dir.display()
        )));
    }
    std::fs::create_dir_all(dir)
        .map_err(|e| CliError::io(format!("cannot make {}", dir.display()), e))
}

pub(super) fn study(args: StudyArgs) -> Result<(), CliError> {
    use sectorcrypt_bench::flash::{default_stacks, measure};
    use sectorcrypt_bench::report::{Report, Throughput, TraceWear};
    use sectorcrypt_bench::wear::{replay, study_stacks};
    let sizes = args.measure.sizes()?;
    if let Some(dir) = &args.report {
        report_dir(dir)?;
    }
    let measured = if args.report.is_some() {
        sizes.len() * default_stacks().len()
    } else {
        0
    };
    let mut workloads = Vec::new();
    for path in &args.traces {
        let trace = sectorcrypt_flash::trace::Trace::read(path).map_err(|e| CliError {
            code: Code::Device,
            message: format!("{}: {e}", path.display()),
        })?;
        let name = path
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        workloads.push((name, trace));
    }
    if args.synthetic {
        workloads.extend(sectorcrypt_bench::synthetic::synthetic_traces(false)?);
    }
    let steps = Steps::new((workloads.len() * study_stacks().len() + measured) as u64);
    let mut traces = Vec::new();
    let mut rows = Rows::new(args.json);
    steps.print(|| rows.header(format!(
            "# erases per eraseblock, replayed on a simulated chip (the chip's own counts)\n#{:>29} {:>28} {:>22} {:>8} {:>22} {:>10}\n",
            "trace", "stack", "workload min/mean/max", "vs plain", "whole run min/mean/max", "erases/GiB"
        )))?;
    for (name, trace) in workloads {
        let mut plain = None;
        let mut wear = Vec::new();
        for stack in study_stacks() {
            let w = steps.step(format!("replaying {name}"), || replay(&trace, &name, stack))?;
            let base = *plain.get_or_insert(w.workload.mean);
            steps.print(|| {
                rows.row(&w, || {
                    format!(
                        "{:>30} {:>28} {:>6}/{:>7.2}/{:>6} {:>7.2}x {:>6}/{:>7.2}/{:>6} {:>10.0}\n",
                        w.trace,
                        w.stack,
                        w.workload.min,
                        w.workload.mean,
                        w.workload.max,
                        w.workload.mean / base.max(f64::MIN_POSITIVE),
                        w.whole.min,
                        w.whole.mean,
                        w.whole.max,
                        w.erases_per_gib
                    )
                })
            })?;
            wear.push(w);
        }
        traces.push(TraceWear {
            name,
            geometry: trace.geometry,
            workload_bytes: trace.workload_data_bytes(),
            rows: wear,
        });
    }
    let Some(dir) = args.report else {
        return Ok(());
    };
    let (bytes, rounds) = (args.measure.bytes as usize, args.measure.rounds);
    let mut measurements = Vec::new();
    for &size in &sizes {
        for stack in default_stacks() {
            measurements.push(steps.step(format!("throughput, {size}-byte requests"), || {
                measure(stack, size, bytes, rounds)
            }));
        }
    }
    let report = Report {
        command: std::iter::once("sectorcrypt".to_string())
            .chain(
                std::env::args_os()
                    .skip(1)
                    .map(|a| a.to_string_lossy().into_owned()),
            )
            .collect(),
        traces,
        throughput: Throughput {
            bytes,
            rounds,
            rows: measurements,
        },
    };
    sectorcrypt_bench::report::write(&dir, &report)
        .map_err(|e| CliError::io(format!("cannot write the report into {}", dir.display()), e))?;
    Ok(())
}
