//! Progress of a long operation as people and scripts want it: a bar on a terminal (indicatif),
//! one JSON line per step with `--json`, nothing otherwise; for work counted in steps rather
//! than bytes (trace replays, measurements), a bar naming the current step.

use std::io::{IsTerminal, Write};
use std::time::Instant;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use sectorcrypt_volume::reencrypt::Progress;

/// A bar on standard error in `template`'s style when standard error is a terminal (none
/// otherwise: nothing is drawn into a pipe or a file).
pub(crate) fn terminal_bar(template: &str) -> Option<ProgressBar> {
    std::io::stderr().is_terminal().then(|| {
        let style = ProgressStyle::with_template(template)
            .map(|s| s.progress_chars("#."))
            .unwrap_or_else(|_| ProgressStyle::default_bar());
        ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr()).with_style(style)
    })
}

/// Progress: a bar on a terminal (indicatif), JSON lines with `--json`, nothing otherwise.
pub(crate) struct Reporter {
    json: bool,
    bar: Option<ProgressBar>,
    /// The first step seen in this run: rates count from there (a resumed run starts part way).
    first: Option<(Instant, u64)>,
}

impl Reporter {
    pub(crate) fn new(json: bool) -> Self {
        let bar = if json {
            None
        } else {
            terminal_bar(
                "[{bar:30}] {percent:>3}%  {bytes} / {total_bytes}  {bytes_per_sec}  ETA {eta}",
            )
        };
        Reporter {
            json,
            bar,
            first: None,
        }
    }

    pub(crate) fn step(&mut self, p: Progress) {
        let resumed_here = self.first.is_none();
        let (t0, d0) = *self.first.get_or_insert((Instant::now(), p.done));
        if let Some(bar) = &self.bar {
            bar.set_length(p.total);
            bar.set_position(p.done);
            if resumed_here {
                // What earlier runs converted is no part of this run's rate.
                bar.reset_eta();
            }
        }
        if self.json {
            let secs = t0.elapsed().as_secs_f64();
            let rate = if secs > 0.0 {
                (p.done - d0) as f64 / secs
            } else {
                0.0
            };
            let eta = (rate > 0.0).then(|| (p.total - p.done) as f64 / rate);
            let line = serde_json::json!({
                "done": p.done,
                "total": p.total,
                "bytes_per_sec": rate.round(),
                "eta_sec": eta.map(f64::round),
            });
            let _ = writeln!(std::io::stdout(), "{line}");
        }
    }

    pub(crate) fn done(&self) {
        if let Some(bar) = &self.bar {
            bar.finish();
        }
    }
}

/// Work counted in steps (replays, measurements): on a terminal, a bar with the steps done, the
/// time so far and what runs now; nothing otherwise. The bar goes when this is dropped.
pub(crate) struct Steps(Option<ProgressBar>);

impl Steps {
    pub(crate) fn new(total: u64) -> Self {
        let bar = terminal_bar("[{bar:30}] {pos}/{len}  {elapsed}  {wide_msg}");
        if let Some(bar) = &bar {
            bar.set_length(total);
        }
        Steps(bar)
    }

    /// Run `f`, one step, showing `what` meanwhile.
    pub(crate) fn step<T>(&self, what: String, f: impl FnOnce() -> T) -> T {
        if let Some(bar) = &self.0 {
            bar.set_message(what);
        }
        let result = f();
        if let Some(bar) = &self.0 {
            bar.inc(1);
        }
        result
    }

    /// Run `f`, which prints, with the bar out of the way.
    pub(crate) fn print<T>(&self, f: impl FnOnce() -> T) -> T {
        match &self.0 {
            Some(bar) => bar.suspend(f),
            None => f(),
        }
    }
}

impl Drop for Steps {
    fn drop(&mut self) {
        if let Some(bar) = &self.0 {
            bar.finish_and_clear();
        }
    }
}
