//! `--plot FILE.svg`: a run's time series as a self-contained SVG.
//!
//! Three panels over the same time axis: ingress and consume rates; the
//! client's backlog, the broker's DescribeQueue count and (for `capacity`)
//! the model's predicted curve; enqueue latency percentiles per one-second
//! interval (log scale) with the end-to-end p99. Phase boundaries are
//! vertical lines. Written by hand (a few hundred bytes of markup per
//! series) rather than through a plotting crate: no fonts, no native
//! dependencies, output that diffs.

use std::fmt::Write as _;
use std::path::Path;

use crate::load::Sample;

const WIDTH: f64 = 960.0;
const PANEL_HEIGHT: f64 = 240.0;
const MARGIN_LEFT: f64 = 80.0;
const MARGIN_RIGHT: f64 = 150.0;
const MARGIN_TOP: f64 = 40.0;
const PANEL_GAP: f64 = 50.0;
const TICKS: usize = 5;
/// Latencies below this are drawn at it (log axis floor), ms.
const LATENCY_FLOOR_MS: f64 = 0.01;

/// One line of a panel.
struct Line<'a> {
    label: &'a str,
    color: &'a str,
    dashed: bool,
    points: Vec<(f64, f64)>,
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// A human tick label: 12k, 1.5M, 0.25.
fn label(value: f64) -> String {
    let magnitude = value.abs();
    if magnitude >= 1e6 {
        format!("{:.1}M", value / 1e6)
    } else if magnitude >= 1e4 {
        format!("{:.0}k", value / 1e3)
    } else if magnitude >= 10.0 || value == 0.0 {
        format!("{value:.0}")
    } else {
        format!("{value:.2}")
    }
}

struct Panel<'a> {
    title: &'a str,
    top: f64,
    t_max: f64,
    log: bool,
    lines: Vec<Line<'a>>,
}

impl Panel<'_> {
    fn draw(&self, out: &mut String, boundaries: &[(f64, &str)]) {
        let (left, right) = (MARGIN_LEFT, WIDTH - MARGIN_RIGHT);
        let (top, bottom) = (self.top, self.top + PANEL_HEIGHT);
        let values = self.lines.iter().flat_map(|line| line.points.iter().map(|(_, y)| *y));
        let (y_min, y_max) = if self.log {
            let max = values.fold(LATENCY_FLOOR_MS * 10.0, f64::max);
            (LATENCY_FLOOR_MS.log10(), max.log10().ceil())
        } else {
            (0.0, values.fold(1.0, f64::max) * 1.05)
        };
        let x = |t: f64| left + (right - left) * t / self.t_max.max(1e-9);
        let y = |value: f64| {
            let value = if self.log { value.max(LATENCY_FLOOR_MS).log10() } else { value };
            bottom - (bottom - top) * (value - y_min) / (y_max - y_min).max(1e-9)
        };
        let _ = writeln!(
            out,
            r##"<rect x="{left}" y="{top}" width="{}" height="{PANEL_HEIGHT}" fill="none" stroke="#888"/>"##,
            right - left
        );
        let _ = writeln!(
            out,
            r#"<text x="{left}" y="{}" font-size="14" font-weight="bold">{}</text>"#,
            top - 8.0,
            escape(self.title)
        );
        for tick in 0..=TICKS {
            let fraction = tick as f64 / TICKS as f64;
            let raw = y_min + (y_max - y_min) * fraction;
            let value = if self.log { 10f64.powf(raw) } else { raw };
            let ty = y(value);
            let _ = writeln!(
                out,
                r##"<line x1="{left}" y1="{ty:.1}" x2="{right}" y2="{ty:.1}" stroke="#eee"/><text x="{}" y="{:.1}" font-size="11" text-anchor="end">{}</text>"##,
                left - 6.0,
                ty + 4.0,
                label(value)
            );
            let t = self.t_max * fraction;
            let _ = writeln!(
                out,
                r#"<text x="{:.1}" y="{}" font-size="11" text-anchor="middle">{:.0} s</text>"#,
                x(t),
                bottom + 16.0,
                t
            );
        }
        for (t, name) in boundaries {
            let bx = x(*t);
            let _ = writeln!(
                out,
                r##"<line x1="{bx:.1}" y1="{top}" x2="{bx:.1}" y2="{bottom}" stroke="#999" stroke-dasharray="2,3"/><text x="{:.1}" y="{}" font-size="10" fill="#666">{}</text>"##,
                bx + 3.0,
                top + 12.0,
                escape(name)
            );
        }
        for (index, line) in self.lines.iter().enumerate() {
            if line.points.is_empty() {
                continue;
            }
            let points: Vec<String> = line
                .points
                .iter()
                .map(|(t, value)| format!("{:.1},{:.1}", x(*t), y(*value)))
                .collect();
            let dash = if line.dashed { r#" stroke-dasharray="6,4""# } else { "" };
            let _ = writeln!(
                out,
                r#"<polyline fill="none" stroke="{}" stroke-width="1.6"{dash} points="{}"/>"#,
                line.color,
                points.join(" ")
            );
            let ly = top + 14.0 + 16.0 * index as f64;
            let _ = writeln!(
                out,
                r#"<line x1="{}" y1="{ly}" x2="{}" y2="{ly}" stroke="{}" stroke-width="2"{dash}/><text x="{}" y="{}" font-size="11">{}</text>"#,
                right + 10.0,
                right + 30.0,
                line.color,
                right + 35.0,
                ly + 4.0,
                escape(line.label)
            );
        }
    }
}

/// The SVG document for `series`.
pub fn svg(title: &str, series: &[Sample]) -> String {
    let t_max = series.iter().map(|sample| sample.t_s).fold(1.0, f64::max);
    let points = |value: fn(&Sample) -> f64| -> Vec<(f64, f64)> {
        series.iter().map(|sample| (sample.t_s, value(sample))).collect()
    };
    let predicted: Vec<(f64, f64)> = series
        .iter()
        .filter_map(|sample| sample.predicted_backlog.map(|value| (sample.t_s, value)))
        .collect();
    let mut boundaries = Vec::new();
    for pair in series.windows(2) {
        if pair[0].phase != pair[1].phase {
            boundaries.push((pair[1].t_s, pair[1].phase.as_str()));
        }
    }
    let panel_top = |index: f64| MARGIN_TOP + 20.0 + index * (PANEL_HEIGHT + PANEL_GAP);
    let panels = [
        Panel {
            title: "rates (msgs/s, per 1 s interval)",
            top: panel_top(0.0),
            t_max,
            log: false,
            lines: vec![
                Line {
                    label: "enqueued",
                    color: "#1f77b4",
                    dashed: false,
                    points: points(|s| s.publish_rate),
                },
                Line {
                    label: "acked",
                    color: "#2ca02c",
                    dashed: false,
                    points: points(|s| s.consume_rate),
                },
            ],
        },
        Panel {
            title: "backlog (messages)",
            top: panel_top(1.0),
            t_max,
            log: false,
            lines: vec![
                Line {
                    label: "client: enq − acked",
                    color: "#1f77b4",
                    dashed: false,
                    points: points(|s| s.backlog_client as f64),
                },
                Line {
                    label: "broker: DescribeQueue",
                    color: "#ff7f0e",
                    dashed: true,
                    points: points(|s| s.backlog_broker as f64),
                },
                Line { label: "model (planner)", color: "#555", dashed: true, points: predicted },
            ],
        },
        Panel {
            title: "latency per 1 s interval (ms, log scale)",
            top: panel_top(2.0),
            t_max,
            log: true,
            lines: vec![
                Line {
                    label: "enqueue p50",
                    color: "#2ca02c",
                    dashed: false,
                    points: points(|s| s.publish_latency_ms.p50),
                },
                Line {
                    label: "enqueue p99",
                    color: "#1f77b4",
                    dashed: false,
                    points: points(|s| s.publish_latency_ms.p99),
                },
                Line {
                    label: "enqueue p99.9",
                    color: "#9467bd",
                    dashed: false,
                    points: points(|s| s.publish_latency_ms.p999),
                },
                Line {
                    label: "end-to-end p99",
                    color: "#d62728",
                    dashed: true,
                    points: points(|s| s.e2e_latency_ms.p99),
                },
            ],
        },
    ];
    let height = panel_top(3.0);
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif">"#
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        out,
        r#"<text x="{MARGIN_LEFT}" y="24" font-size="16" font-weight="bold">{}</text>"#,
        escape(title)
    );
    for panel in &panels {
        panel.draw(&mut out, &boundaries);
    }
    out.push_str("</svg>\n");
    out
}

/// Writes [`svg`] to `path`.
///
/// # Errors
/// The file cannot be written.
pub fn write(path: &Path, title: &str, series: &[Sample]) -> std::io::Result<()> {
    std::fs::write(path, svg(title, series))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::PercentilesMs;

    fn sample(t_s: f64, phase: &str, backlog: i64) -> Sample {
        Sample {
            t_s,
            phase: phase.to_owned(),
            publish_rate: 100.0,
            consume_rate: 80.0,
            backlog_client: backlog,
            ready_client: backlog,
            backlog_broker: backlog as u64,
            ready_broker: 0,
            claimed_broker: 0,
            oldest_ready_age_ms: 0,
            busy_slots: 1,
            held_slots: 1,
            slots: 2,
            predicted_backlog: Some(backlog as f64),
            publish_latency_ms: PercentilesMs {
                count: 1,
                p50: 0.5,
                p99: 2.0,
                p999: 3.0,
                max: 4.0,
                mean: 0.6,
            },
            e2e_latency_ms: PercentilesMs::default(),
            errors: 0,
        }
    }

    #[test]
    fn draws_every_series_and_the_phase_boundary_in_a_well_formed_document() {
        // Goal: each panel's lines are present (9 polylines: 2 rates, 3 backlog, 4 latency),
        // the phase change is marked, and text is escaped. Method: render three samples.
        let series = [sample(1.0, "burst", 10), sample(2.0, "burst", 20), sample(3.0, "drain", 5)];
        let document = svg("a < b & c", &series);
        assert!(document.starts_with("<svg "));
        assert!(document.trim_end().ends_with("</svg>"));
        assert_eq!(document.matches("<polyline").count(), 9);
        assert!(document.contains(">drain</text>"), "phase boundary label");
        assert!(document.contains("a &lt; b &amp; c"));
        assert!(!document.contains("NaN"));
    }

    #[test]
    fn an_empty_series_still_renders() {
        // Goal: a run that ended before its first sample gives an empty plot, not a panic or NaN.
        let document = svg("empty", &[]);
        assert!(document.contains("</svg>"));
        assert!(!document.contains("NaN"));
        assert_eq!(document.matches("<polyline").count(), 0);
    }
}
