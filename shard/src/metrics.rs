//! Per-shard counters and histograms, written by the owning shard (relaxed
//! atomics, no locks) and rendered as Prometheus text for the control socket.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::mailbox::MailboxTx;

type CounterRow = (&'static str, &'static str, fn(&ShardMetrics) -> &AtomicU64);
type GaugeRow = (
    &'static str,
    &'static str,
    fn(&ShardMetrics, &MailboxTx) -> u64,
);
type HistRow = (&'static str, &'static str, fn(&ShardMetrics) -> &Histogram);

/// A fixed-bucket histogram (Prometheus semantics: cumulative `le` buckets).
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [u64],
    /// One counter per bound plus +Inf.
    buckets: Vec<AtomicU64>,
    sum: AtomicU64,
    count: AtomicU64,
}

/// fdatasync latency buckets, microseconds.
pub const FSYNC_US_BOUNDS: &[u64] = &[
    50, 100, 200, 300, 500, 750, 1_000, 2_000, 5_000, 10_000, 25_000, 50_000, 100_000,
];
/// Appends per group commit.
pub const GROUP_BOUNDS: &[u64] = &[1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024];

impl Histogram {
    pub fn new(bounds: &'static [u64]) -> Histogram {
        Histogram {
            bounds,
            buckets: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }

    pub fn record(&self, value: u64) {
        let i = self.bounds.partition_point(|&b| b < value);
        if let Some(b) = self.buckets.get(i) {
            b.fetch_add(1, Ordering::Relaxed);
        }
        self.sum.fetch_add(value, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let mut cumulative = 0;
        for (i, bound) in self.bounds.iter().enumerate() {
            cumulative += self.buckets[i].load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{bound}\"}} {cumulative}");
        }
        cumulative += self.buckets[self.bounds.len()].load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {cumulative}");
        let _ = writeln!(
            out,
            "{name}_sum{{{labels}}} {}",
            self.sum.load(Ordering::Relaxed)
        );
        let _ = writeln!(out, "{name}_count{{{labels}}} {cumulative}");
    }
}

#[derive(Debug)]
pub struct ShardMetrics {
    pub appends_total: AtomicU64,
    pub append_bytes_total: AtomicU64,
    pub append_errors_total: AtomicU64,
    pub fsyncs_total: AtomicU64,
    pub fsync_latency_us: Histogram,
    pub group_commit_appends: Histogram,
    pub fetches_total: AtomicU64,
    pub fetch_bytes_total: AtomicU64,
    pub forwards_total: AtomicU64,
    pub backpressure_total: AtomicU64,
    pub connections_open: AtomicU64,
    pub connections_total: AtomicU64,
    pub connections_refused_total: AtomicU64,
    pub bad_frames_total: AtomicU64,
    pub parked_total: AtomicU64,
    pub idle_timeouts_total: AtomicU64,
    pub header_timeouts_total: AtomicU64,
    pub over_budget_total: AtomicU64,
    pub write_timeouts_total: AtomicU64,
}

impl Default for ShardMetrics {
    fn default() -> Self {
        Self {
            appends_total: AtomicU64::new(0),
            append_bytes_total: AtomicU64::new(0),
            append_errors_total: AtomicU64::new(0),
            fsyncs_total: AtomicU64::new(0),
            fsync_latency_us: Histogram::new(FSYNC_US_BOUNDS),
            group_commit_appends: Histogram::new(GROUP_BOUNDS),
            fetches_total: AtomicU64::new(0),
            fetch_bytes_total: AtomicU64::new(0),
            forwards_total: AtomicU64::new(0),
            backpressure_total: AtomicU64::new(0),
            connections_open: AtomicU64::new(0),
            connections_total: AtomicU64::new(0),
            connections_refused_total: AtomicU64::new(0),
            bad_frames_total: AtomicU64::new(0),
            parked_total: AtomicU64::new(0),
            idle_timeouts_total: AtomicU64::new(0),
            header_timeouts_total: AtomicU64::new(0),
            over_budget_total: AtomicU64::new(0),
            write_timeouts_total: AtomicU64::new(0),
        }
    }
}

pub fn inc(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

pub fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// Renders every shard's metrics as Prometheus text exposition.
pub fn render(shards: &[(&ShardMetrics, &MailboxTx)], uptime_s: u64) -> String {
    let mut out = String::new();
    let counters: &[CounterRow] = &[
        ("ringlog_appends_total", "Batches appended", |m| {
            &m.appends_total
        }),
        ("ringlog_append_bytes_total", "Bytes appended", |m| {
            &m.append_bytes_total
        }),
        (
            "ringlog_append_errors_total",
            "Appends rejected or failed",
            |m| &m.append_errors_total,
        ),
        (
            "ringlog_fsyncs_total",
            "Group commits (one fdatasync per touched partition)",
            |m| &m.fsyncs_total,
        ),
        ("ringlog_fetches_total", "Fetches served", |m| {
            &m.fetches_total
        }),
        ("ringlog_fetch_bytes_total", "Bytes fetched", |m| {
            &m.fetch_bytes_total
        }),
        (
            "ringlog_forwards_total",
            "Requests forwarded to another shard",
            |m| &m.forwards_total,
        ),
        (
            "ringlog_backpressure_total",
            "Requests refused with Backpressure",
            |m| &m.backpressure_total,
        ),
        (
            "ringlog_connections_total",
            "Client connections accepted",
            |m| &m.connections_total,
        ),
        (
            "ringlog_connections_refused_total",
            "Client connections refused (limit)",
            |m| &m.connections_refused_total,
        ),
        ("ringlog_bad_frames_total", "Client frames rejected", |m| {
            &m.bad_frames_total
        }),
        (
            "ringlog_parked_total",
            "Requests held until their partition's flush in flight completed",
            |m| &m.parked_total,
        ),
        (
            "ringlog_idle_timeouts_total",
            "Client connections closed after idle_timeout_ms without a request",
            |m| &m.idle_timeouts_total,
        ),
        (
            "ringlog_header_timeouts_total",
            "Client connections closed because a started frame stalled (header_timeout_ms)",
            |m| &m.header_timeouts_total,
        ),
        (
            "ringlog_over_budget_total",
            "Requests refused with Backpressure over shard_request_bytes_max",
            |m| &m.over_budget_total,
        ),
        (
            "ringlog_write_timeouts_total",
            "Client connections closed because a reply took no bytes for header_timeout_ms",
            |m| &m.write_timeouts_total,
        ),
    ];
    let _ = writeln!(out, "# HELP ringlog_uptime_seconds Seconds since start");
    let _ = writeln!(out, "# TYPE ringlog_uptime_seconds gauge");
    let _ = writeln!(out, "ringlog_uptime_seconds {uptime_s}");
    for (name, help, get) in counters {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} counter");
        for (i, (m, _)) in shards.iter().enumerate() {
            let _ = writeln!(
                out,
                "{name}{{shard=\"{i}\"}} {}",
                get(m).load(Ordering::Relaxed)
            );
        }
    }
    let gauges: &[GaugeRow] = &[
        (
            "ringlog_connections_open",
            "Open client connections",
            |m, _| m.connections_open.load(Ordering::Relaxed),
        ),
        (
            "ringlog_mailbox_depth",
            "Requests waiting in the shard mailbox",
            |_, t| t.depth() as u64,
        ),
        (
            "ringlog_mailbox_capacity",
            "Shard mailbox capacity",
            |_, t| t.capacity() as u64,
        ),
    ];
    for (name, help, get) in gauges {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} gauge");
        for (i, (m, t)) in shards.iter().enumerate() {
            let _ = writeln!(out, "{name}{{shard=\"{i}\"}} {}", get(m, t));
        }
    }
    let name = "ringlog_mailbox_rejections_total";
    let _ = writeln!(
        out,
        "# HELP {name} Sends refused because the mailbox was full"
    );
    let _ = writeln!(out, "# TYPE {name} counter");
    for (i, (_, t)) in shards.iter().enumerate() {
        let v = t.stats().rejected.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}{{shard=\"{i}\"}} {v}");
    }
    let hists: &[HistRow] = &[
        (
            "ringlog_fsync_latency_us",
            "Group commit write+fdatasync latency, microseconds",
            |m| &m.fsync_latency_us,
        ),
        (
            "ringlog_group_commit_appends",
            "Appends made durable per group commit",
            |m| &m.group_commit_appends,
        ),
    ];
    for (name, help, get) in hists {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} histogram");
        for (i, (m, _)) in shards.iter().enumerate() {
            get(m).render(&mut out, name, &format!("shard=\"{i}\""));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let h = Histogram::new(&[10, 100]);
        for v in [1, 10, 11, 100, 1000] {
            h.record(v);
        }
        let mut out = String::new();
        h.render(&mut out, "x", "a=\"1\"");
        assert!(out.contains("x_bucket{a=\"1\",le=\"10\"} 2"), "{out}");
        assert!(out.contains("x_bucket{a=\"1\",le=\"100\"} 4"), "{out}");
        assert!(out.contains("x_bucket{a=\"1\",le=\"+Inf\"} 5"), "{out}");
        assert!(out.contains("x_sum{a=\"1\"} 1122"), "{out}");
    }
}
