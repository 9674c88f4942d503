//! `--plot FILE.svg`: a hand-written SVG with two panels, throughput over
//! time (MiB/s per one-second bucket; runs that record a timeline) and the
//! latency percentile curve (min, p1 .. p99.99, max on a log scale) of
//! every run, both with ticks at round values.

use std::fmt::Write as _;

use crate::stats::{LatencySummary, HEADLINE_PERCENTILES, PERCENTILES};

/// One run to draw.
#[derive(Debug, Clone)]
pub struct Series<'a> {
    pub label: String,
    /// Bytes per second of the run (empty: not drawn in the first panel).
    pub timeline: &'a [u64],
    /// The run's latency: for fio's append job write + fdatasync, what
    /// ringlog's ack latency compares with.
    pub lat: &'a LatencySummary,
}

const WIDTH: f64 = 900.0;
const PANEL_HEIGHT: f64 = 300.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 260.0;
const TOP: f64 = 40.0;
const GAP: f64 = 80.0;
const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn color(i: usize) -> &'static str {
    COLORS[i % COLORS.len()]
}

/// Ticks for a linear axis from 0 to at least `max`: a round step (1, 2 or
/// 5 times a power of ten) giving about five intervals. Returns the axis end
/// and the ticks as (fraction of the axis, label).
fn linear_ticks(max: f64, step_min: f64) -> (f64, Vec<(f64, String)>) {
    let max = if max.is_finite() && max > 0.0 {
        max
    } else {
        1.0
    };
    let rough = max / 5.0;
    let p = 10f64.powf(rough.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * p)
        .find(|s| *s >= rough)
        .unwrap_or(10.0 * p)
        .max(step_min);
    let intervals = (max / step).ceil().max(1.0);
    let end = intervals * step;
    let decimals = (-step.log10().floor()).max(0.0) as usize;
    let ticks = (0..=intervals as u32)
        .map(|i| {
            let v = f64::from(i) * step;
            (v / end, format!("{v:.decimals$}"))
        })
        .collect();
    (end, ticks)
}

/// The SVG document for `series` (label and run).
pub fn svg(series: &[Series]) -> String {
    let plot_w = WIDTH - LEFT - RIGHT;
    let height = TOP + PANEL_HEIGHT + GAP + PANEL_HEIGHT + 50.0;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        out,
        r#"<rect x="0" y="0" width="{WIDTH}" height="{height}" fill="white"/>"#
    );

    // Panel 1: throughput over time.
    let y0 = TOP;
    let secs = series.iter().map(|r| r.timeline.len()).max().unwrap_or(0);
    let (max_secs, xticks) = linear_ticks(secs as f64, 1.0);
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    let peak = series
        .iter()
        .flat_map(|r| r.timeline.iter().map(|b| mib(*b)))
        .fold(0.0, f64::max);
    let (max_bw, yticks) = linear_ticks(peak, 0.0);
    axes(
        &mut out,
        y0,
        "throughput over time (MiB/s per second)",
        "seconds",
        &yticks,
        &xticks,
    );
    for (i, run) in series.iter().enumerate() {
        if run.timeline.is_empty() {
            continue;
        }
        // The last bucket is usually partial: plot whole seconds only,
        // unless that is all there is.
        let n = if run.timeline.len() > 1 {
            run.timeline.len() - 1
        } else {
            1
        };
        let points: Vec<String> = run.timeline[..n]
            .iter()
            .enumerate()
            .map(|(s, b)| {
                let x = LEFT + (s as f64 + 0.5) / max_secs * plot_w;
                let y = y0 + PANEL_HEIGHT - mib(*b) / max_bw * PANEL_HEIGHT;
                format!("{x:.1},{y:.1}")
            })
            .collect();
        let _ = writeln!(
            out,
            r#"<polyline fill="none" stroke="{}" stroke-width="2" points="{}"/>"#,
            color(i),
            points.join(" ")
        );
    }

    // Panel 2: latency percentiles, log scale.
    let y0 = TOP + PANEL_HEIGHT + GAP;
    // Every percentile is a point; the axis names min, the headline ones
    // and max (all 19 labels would overlap).
    let mut labels = vec!["min".to_owned()];
    labels.extend(
        PERCENTILES
            .iter()
            .map(|(p, _)| match HEADLINE_PERCENTILES.contains(p) {
                true => format!("p{p}"),
                false => String::new(),
            }),
    );
    labels.push("max".into());
    let values = |lat: &LatencySummary| -> Vec<f64> {
        let mut v = vec![lat.min_ns as f64];
        v.extend(lat.percentiles_ns.iter().map(|n| *n as f64));
        v.push(lat.max_ns as f64);
        v.into_iter().map(|ns| (ns / 1000.0).max(0.1)).collect()
    };
    let all: Vec<f64> = series
        .iter()
        .filter(|r| r.lat.samples > 0)
        .flat_map(|r| values(r.lat))
        .collect();
    let lo = all.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = all.iter().copied().fold(0.0, f64::max);
    let (lo, hi) = if all.is_empty() {
        (1.0, 10.0)
    } else {
        (
            10f64.powf(lo.log10().floor()),
            10f64.powf(hi.log10().ceil().max(lo.log10().floor() + 1.0)),
        )
    };
    let decades = (hi / lo).log10();
    let mut yticks = Vec::new();
    let mut t = lo;
    while t <= hi * 1.0001 {
        yticks.push(((t / lo).log10() / decades, format!("{t}")));
        t *= 10.0;
    }
    let xn = (labels.len() - 1) as f64;
    let xticks: Vec<(f64, String)> = labels
        .iter()
        .enumerate()
        .map(|(i, l)| (i as f64 / xn, l.clone()))
        .collect();
    axes(
        &mut out,
        y0,
        "latency percentiles (usec, log scale)",
        "percentile",
        &yticks,
        &xticks,
    );
    for (i, run) in series.iter().enumerate() {
        if run.lat.samples == 0 {
            continue;
        }
        let points: Vec<String> = values(run.lat)
            .iter()
            .enumerate()
            .map(|(k, us)| {
                let x = LEFT + k as f64 / xn * plot_w;
                let f = ((us / lo).log10() / decades).clamp(0.0, 1.0);
                let y = y0 + PANEL_HEIGHT - f * PANEL_HEIGHT;
                format!("{x:.1},{y:.1}")
            })
            .collect();
        let _ = writeln!(
            out,
            r#"<polyline fill="none" stroke="{}" stroke-width="2" points="{}"/>"#,
            color(i),
            points.join(" ")
        );
    }

    // Legend.
    for (i, Series { label: name, .. }) in series.iter().enumerate() {
        let x = WIDTH - RIGHT + 20.0;
        let y = TOP + 10.0 + i as f64 * 18.0;
        let _ = writeln!(
            out,
            r#"<rect x="{x}" y="{:.1}" width="12" height="12" fill="{}"/><text x="{:.1}" y="{:.1}">{}</text>"#,
            y - 10.0,
            color(i),
            x + 18.0,
            y,
            esc(name)
        );
    }
    out.push_str("</svg>\n");
    out
}

/// A panel's frame, title and ticks; tick positions are fractions of the
/// axis (0 = origin).
fn axes(
    out: &mut String,
    y0: f64,
    title: &str,
    xlabel: &str,
    yticks: &[(f64, String)],
    xticks: &[(f64, String)],
) {
    let plot_w = WIDTH - LEFT - RIGHT;
    let _ = writeln!(
        out,
        r#"<text x="{LEFT}" y="{:.1}" font-weight="bold">{}</text>"#,
        y0 - 12.0,
        esc(title)
    );
    let _ = writeln!(
        out,
        r##"<rect x="{LEFT}" y="{y0}" width="{plot_w}" height="{PANEL_HEIGHT}" fill="none" stroke="#444"/>"##
    );
    for (f, label) in yticks {
        let y = y0 + PANEL_HEIGHT - f * PANEL_HEIGHT;
        let _ = writeln!(
            out,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT + plot_w,
            LEFT - 6.0,
            y + 4.0,
            esc(label)
        );
    }
    for (f, label) in xticks {
        let x = LEFT + f * plot_w;
        let y = y0 + PANEL_HEIGHT;
        let _ = writeln!(
            out,
            r##"<line x1="{x:.1}" y1="{y:.1}" x2="{x:.1}" y2="{:.1}" stroke="#444"/>"##,
            y + 5.0
        );
        if !label.is_empty() {
            let _ = writeln!(
                out,
                r#"<text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
                y + 16.0,
                esc(label)
            );
        }
    }
    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
        LEFT + plot_w / 2.0,
        y0 + PANEL_HEIGHT + 34.0,
        esc(xlabel)
    );
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;
    use crate::stats::{LatencyRecorder, RunSummary, Timeline};

    #[test]
    fn ticks_are_round_and_cover_the_data() {
        let (end, ticks) = linear_ticks(437.0, 0.0);
        assert_eq!(end, 500.0);
        let labels: Vec<&str> = ticks.iter().map(|(_, l)| l.as_str()).collect();
        assert_eq!(labels, ["0", "100", "200", "300", "400", "500"]);
        assert_eq!(ticks.last().unwrap().0, 1.0);
        let (end, ticks) = linear_ticks(0.7, 0.0);
        assert_eq!(end, 0.8);
        assert_eq!(ticks[1].1, "0.2");
        // Seconds: whole steps, at least one interval.
        let (end, ticks) = linear_ticks(3.0, 1.0);
        assert_eq!((end, ticks.len()), (3.0, 4));
        assert_eq!(linear_ticks(0.0, 1.0).0, 1.0);
        assert_eq!(linear_ticks(f64::NAN, 0.0).0, 1.0);
    }

    #[test]
    fn svg_is_well_formed_and_has_both_panels() {
        let mut rec = LatencyRecorder::new();
        for us in 1..=100 {
            rec.record(Duration::from_micros(us * 10));
        }
        let t0 = Instant::now();
        let mut tl = Timeline::starting(t0);
        for s in 0..4 {
            tl.record(t0 + Duration::from_secs(s), (s + 1) << 20);
        }
        let lat = rec.summary();
        let run =
            RunSummary::from_counts(10 << 20, 100, Duration::from_secs(4), lat).with_timeline(tl);
        let timeline = run.timeline;
        let svg = svg(&[
            Series {
                label: "ringlog <a&b>".into(),
                timeline: &timeline,
                lat: &lat,
            },
            Series {
                label: "fio".into(),
                timeline: &[],
                lat: &lat,
            },
        ]);
        assert!(svg.starts_with("<svg "), "{svg}");
        assert!(svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("ringlog &lt;a&amp;b&gt;"));
        assert_eq!(svg.matches("<polyline").count(), 3, "{svg}");
        assert!(svg.contains(">p99.99<") && svg.contains(">p50<"));
        assert!(
            !svg.contains(">p95<"),
            "only headline percentiles are named"
        );
        // Throughput ticks: 0..4 MiB/s at round steps, seconds 0..4.
        for tick in [">0<", ">1<", ">2<", ">3<", ">4<"] {
            assert!(svg.contains(tick), "{tick}: {svg}");
        }
        assert!(!svg.contains("NaN") && !svg.contains("inf"));
        // Every opened element is closed: tags balance.
        let opens = svg.matches("<text").count();
        assert_eq!(opens, svg.matches("</text>").count());
        // Empty input still gives a document.
        let empty = super::svg(&[]);
        assert!(empty.starts_with("<svg ") && empty.trim_end().ends_with("</svg>"));
    }
}
