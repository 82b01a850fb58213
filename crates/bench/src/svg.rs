//! Hand-written SVG for the report's figures ([`crate::report`]): a few shapes, axes (linear,
//! logarithmic, or logarithmic in `1 + value` for counts that may be 0) and a legend. The text is
//! escaped, so any trace or stack name gives well-formed XML.

use std::fmt::Write;

/// `text` with XML's five special characters escaped (for text and attribute values).
pub(crate) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

/// How a line or a legend entry is drawn: its color and dash pattern (empty: solid).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Style {
    pub(crate) color: &'static str,
    pub(crate) dash: &'static str,
}

/// Where a text is anchored.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Anchor {
    Start,
    Middle,
    End,
}

/// An SVG document being written.
pub(crate) struct Svg {
    out: String,
}

impl Svg {
    /// A `width` x `height` document on a white background, `title` as its tooltip and its
    /// heading.
    pub(crate) fn new(width: f64, height: f64, title: &str) -> Svg {
        let mut svg = Svg {
            out: format!(
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" \
                 width=\"{width}\" height=\"{height}\" viewBox=\"0 0 {width} {height}\" \
                 font-family=\"sans-serif\" font-size=\"12\">\n<title>{}</title>\n\
                 <rect width=\"{width}\" height=\"{height}\" fill=\"white\"/>\n",
                escape(title)
            ),
        };
        svg.text(width / 2.0, 22.0, Anchor::Middle, 15.0, title);
        svg
    }

    /// One line of text with its baseline at `y`.
    pub(crate) fn text(&mut self, x: f64, y: f64, anchor: Anchor, size: f64, text: &str) {
        let anchor = match anchor {
            Anchor::Start => "start",
            Anchor::Middle => "middle",
            Anchor::End => "end",
        };
        let _ = writeln!(
            self.out,
            "<text x=\"{x:.1}\" y=\"{y:.1}\" text-anchor=\"{anchor}\" font-size=\"{size}\">{}</text>",
            escape(text)
        );
    }

    /// Text read bottom to top, centred on (`x`, `y`) (a vertical axis' label).
    pub(crate) fn vertical_text(&mut self, x: f64, y: f64, text: &str) {
        let _ = writeln!(
            self.out,
            "<text transform=\"translate({x:.1},{y:.1}) rotate(-90)\" text-anchor=\"middle\">{}</text>",
            escape(text)
        );
    }

    /// A straight line.
    pub(crate) fn line(&mut self, from: (f64, f64), to: (f64, f64), style: Style, width: f64) {
        self.polyline(&[from, to], style, width);
    }

    /// Connected line segments.
    pub(crate) fn polyline(&mut self, points: &[(f64, f64)], style: Style, width: f64) {
        let mut at = String::new();
        for (x, y) in points {
            let _ = write!(at, "{x:.1},{y:.1} ");
        }
        let _ = writeln!(
            self.out,
            "<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"{width}\"{}/>",
            at.trim_end(),
            style.color,
            dash(style.dash)
        );
    }

    /// A filled rectangle with `tooltip` as its title.
    pub(crate) fn rect(
        &mut self,
        (x, y): (f64, f64),
        (w, h): (f64, f64),
        fill: &str,
        tooltip: &str,
    ) {
        let _ = writeln!(
            self.out,
            "<rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{w:.1}\" height=\"{h:.1}\" fill=\"{fill}\"><title>{}</title></rect>",
            escape(tooltip)
        );
    }

    /// An empty rectangle (a plot's frame).
    pub(crate) fn frame(&mut self, area: Area) {
        let _ = writeln!(
            self.out,
            "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"none\" stroke=\"#333\"/>",
            area.left,
            area.top,
            area.right - area.left,
            area.bottom - area.top
        );
    }

    /// A dot (a measured point) with `tooltip` as its title; `hollow` draws a ring.
    pub(crate) fn dot(&mut self, (x, y): (f64, f64), color: &str, hollow: bool, tooltip: &str) {
        let fill = if hollow { "white" } else { color };
        let _ = writeln!(
            self.out,
            "<circle cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"3.5\" fill=\"{fill}\" stroke=\"{color}\" stroke-width=\"1.5\"><title>{}</title></circle>",
            escape(tooltip)
        );
    }

    /// The document's text.
    pub(crate) fn finish(mut self) -> String {
        self.out.push_str("</svg>\n");
        self.out
    }
}

fn dash(pattern: &str) -> String {
    if pattern.is_empty() {
        String::new()
    } else {
        format!(" stroke-dasharray=\"{pattern}\"")
    }
}

/// A plot's rectangle in the document, in pixels (y grows downwards).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Area {
    pub(crate) left: f64,
    pub(crate) top: f64,
    pub(crate) right: f64,
    pub(crate) bottom: f64,
}

/// How values map onto an axis.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Scale {
    Linear,
    /// Logarithmic; values at or below the lower end sit on it.
    Log,
    /// Logarithmic in `1 + value`: counts from 0 on, with a tick at 0.
    LogPlusOne,
}

/// An axis: the values from `lo` to `hi` on the pixels from `from` to `to`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Axis {
    scale: Scale,
    lo: f64,
    hi: f64,
    from: f64,
    to: f64,
}

impl Axis {
    /// An axis over `values` (non-finite ones ignored): from 0 to a round number above the
    /// largest for [`Scale::Linear`] and [`Scale::LogPlusOne`]; whole decades around the
    /// positive ones for [`Scale::Log`]. With nothing to show, 0 (or 1) to 10.
    pub(crate) fn covering(
        scale: Scale,
        values: impl IntoIterator<Item = f64>,
        from: f64,
        to: f64,
    ) -> Axis {
        let values: Vec<f64> = values.into_iter().filter(|v| v.is_finite()).collect();
        let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let (lo, hi) = match scale {
            Scale::Linear => {
                let step = nice_step(max.max(1e-9) / 5.0);
                (0.0, ((max / step).ceil() * step).max(step))
            }
            Scale::LogPlusOne => (0.0, decade_above(max.max(1.0))),
            Scale::Log => {
                let min = values
                    .iter()
                    .copied()
                    .filter(|&v| v > 0.0)
                    .fold(f64::INFINITY, f64::min);
                if min.is_finite() {
                    let lo = 10f64.powf(min.log10().floor());
                    (lo, decade_above(max).max(lo * 10.0))
                } else {
                    (1.0, 10.0)
                }
            }
        };
        Axis::new(scale, lo, hi, from, to)
    }

    /// An axis with exactly these ends (`lo` < `hi`, both positive on a log scale).
    pub(crate) fn new(scale: Scale, lo: f64, hi: f64, from: f64, to: f64) -> Axis {
        Axis {
            scale,
            lo,
            hi,
            from,
            to,
        }
    }

    fn t(&self, v: f64) -> f64 {
        match self.scale {
            Scale::Linear => v,
            Scale::Log => v.max(self.lo).ln(),
            Scale::LogPlusOne => v.max(0.0).ln_1p(),
        }
    }

    /// The pixel of value `v` (clamped to the axis).
    pub(crate) fn at(&self, v: f64) -> f64 {
        let (a, b) = (self.t(self.lo), self.t(self.hi));
        let f = ((self.t(v) - a) / (b - a)).clamp(0.0, 1.0);
        self.from + f * (self.to - self.from)
    }

    /// The lower end's pixel (where bars start).
    pub(crate) fn base(&self) -> f64 {
        self.from
    }

    /// Tick values: round steps (linear), decades, with 2x and 5x when there are few of them.
    pub(crate) fn ticks(&self) -> Vec<f64> {
        match self.scale {
            Scale::Linear => {
                let step = nice_step((self.hi - self.lo) / 5.0);
                let n = ((self.hi - self.lo) / step + 1e-9).floor() as usize;
                (0..=n).map(|i| self.lo + i as f64 * step).collect()
            }
            Scale::Log | Scale::LogPlusOne => {
                let (lo, hi) = if self.scale == Scale::Log {
                    (self.lo, self.hi)
                } else {
                    (1.0, self.hi)
                };
                let decades = (hi / lo).log10().round().max(1.0) as i32;
                let steps: &[f64] = if decades <= 2 {
                    &[1.0, 2.0, 5.0]
                } else {
                    &[1.0]
                };
                let mut ticks = if self.scale == Scale::LogPlusOne {
                    vec![0.0]
                } else {
                    Vec::new()
                };
                for d in 0..=decades {
                    for &s in steps {
                        let v = lo * 10f64.powi(d) * s;
                        if v <= hi * (1.0 + 1e-9) {
                            ticks.push(v);
                        }
                    }
                }
                ticks
            }
        }
    }
}

/// 1, 2 or 5 times a power of ten, at least `raw`.
fn nice_step(raw: f64) -> f64 {
    let p = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * p)
        .find(|&s| s >= raw * (1.0 - 1e-9))
        .unwrap_or(10.0 * p)
}

/// The smallest power of ten at or above `v` (> 0).
fn decade_above(v: f64) -> f64 {
    10f64.powf(v.log10().ceil())
}

/// A number as a tick label: no trailing zeros, `k` and `M` for thousands and millions.
pub(crate) fn short_number(v: f64) -> String {
    let (v, unit) = match v.abs() {
        a if a >= 1e6 => (v / 1e6, "M"),
        a if a >= 1e4 => (v / 1e3, "k"),
        _ => (v, ""),
    };
    let text = format!("{v:.3}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    format!("{text}{unit}")
}

/// The names of a plot: its title and its axes'.
pub(crate) struct Labels<'a> {
    pub(crate) title: &'a str,
    pub(crate) x: &'a str,
    pub(crate) y: &'a str,
}

const GRID: Style = Style {
    color: "#ddd",
    dash: "",
};
const INK: Style = Style {
    color: "#333",
    dash: "",
};

/// A plot's frame, horizontal grid lines at `y`'s ticks, tick labels (`x_ticks`: pixel and
/// label), the title above and the axis labels.
pub(crate) fn axes(
    svg: &mut Svg,
    area: Area,
    labels: &Labels<'_>,
    x_ticks: &[(f64, String)],
    y: &Axis,
    y_format: impl Fn(f64) -> String,
) {
    for v in y.ticks() {
        let py = y.at(v);
        svg.line((area.left, py), (area.right, py), GRID, 1.0);
        svg.line((area.left - 4.0, py), (area.left, py), INK, 1.0);
        svg.text(area.left - 6.0, py + 4.0, Anchor::End, 11.0, &y_format(v));
    }
    for (px, label) in x_ticks {
        svg.line((*px, area.bottom), (*px, area.bottom + 4.0), INK, 1.0);
        svg.text(*px, area.bottom + 17.0, Anchor::Middle, 11.0, label);
    }
    svg.frame(area);
    let middle = (area.left + area.right) / 2.0;
    svg.text(middle, area.top - 8.0, Anchor::Middle, 13.0, labels.title);
    svg.text(middle, area.bottom + 36.0, Anchor::Middle, 12.0, labels.x);
    svg.vertical_text(area.left - 52.0, (area.top + area.bottom) / 2.0, labels.y);
}

/// A horizontal reference line across `area` at pixel `py`, labelled right of the frame.
pub(crate) fn reference(svg: &mut Svg, area: Area, py: f64, style: Style, label: &str) {
    svg.line((area.left, py), (area.right, py), style, 1.5);
    svg.text(area.right + 6.0, py + 4.0, Anchor::Start, 11.0, label);
}

/// A legend from (`x`, `y`) down: a short line in each entry's style, then its name.
pub(crate) fn legend(svg: &mut Svg, x: f64, y: f64, entries: &[(&str, Style)]) {
    for (i, (name, style)) in entries.iter().enumerate() {
        let py = y + i as f64 * 18.0;
        svg.line((x, py - 4.0), (x + 28.0, py - 4.0), *style, 2.5);
        svg.text(x + 34.0, py, Anchor::Start, 12.0, name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_escaped() {
        assert_eq!(
            escape(r#"a<b & "c" 'd'>"#),
            "a&lt;b &amp; &quot;c&quot; &apos;d&apos;&gt;"
        );
    }

    #[test]
    fn axes_cover_their_values_with_round_ticks() {
        let lin = Axis::covering(Scale::Linear, [0.0, 3.66, 6.0], 0.0, 100.0);
        assert_eq!(lin.ticks(), [0.0, 2.0, 4.0, 6.0]);
        assert_eq!(lin.at(0.0), 0.0);
        assert_eq!(lin.at(6.0), 100.0);
        let log = Axis::covering(Scale::Log, [0.012, 1.0, f64::NAN], 300.0, 0.0);
        let labels: Vec<String> = log.ticks().into_iter().map(short_number).collect();
        assert_eq!(labels, ["0.01", "0.02", "0.05", "0.1", "0.2", "0.5", "1"]);
        assert_eq!(log.at(1.0), 0.0);
        assert_eq!(log.at(0.001), 300.0);
        let wide = Axis::covering(Scale::Log, [3.0, 4269.4], 300.0, 0.0);
        assert_eq!(wide.ticks(), [1.0, 10.0, 100.0, 1000.0, 10000.0]);
        let counts = Axis::covering(Scale::LogPlusOne, [0.0, 1.0, 396.0], 200.0, 0.0);
        assert_eq!(counts.ticks(), [0.0, 1.0, 10.0, 100.0, 1000.0]);
        assert_eq!(counts.at(0.0), 200.0);
        assert_eq!(short_number(0.1), "0.1");
        assert_eq!(short_number(129_024.0), "129.024k");
        assert_eq!(short_number(1000.0), "1000");
    }
}
