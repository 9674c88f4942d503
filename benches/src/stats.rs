//! Latency and throughput summaries shared by ringlog jobs and fio results.

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

/// The percentiles every summary carries, with fio's JSON key for each:
/// fio's default `percentile_list`, so the JSON has the same keys as fio's.
pub const PERCENTILES: [(f64, &str); 17] = [
    (1.0, "1.000000"),
    (5.0, "5.000000"),
    (10.0, "10.000000"),
    (20.0, "20.000000"),
    (30.0, "30.000000"),
    (40.0, "40.000000"),
    (50.0, "50.000000"),
    (60.0, "60.000000"),
    (70.0, "70.000000"),
    (80.0, "80.000000"),
    (90.0, "90.000000"),
    (95.0, "95.000000"),
    (99.0, "99.000000"),
    (99.5, "99.500000"),
    (99.9, "99.900000"),
    (99.95, "99.950000"),
    (99.99, "99.990000"),
];

/// The percentiles the text report and the plot's axis name.
pub const HEADLINE_PERCENTILES: [f64; 5] = [50.0, 90.0, 99.0, 99.9, 99.99];

/// min/avg/stddev/max and [`PERCENTILES`] of a latency distribution, in
/// nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LatencySummary {
    pub samples: u64,
    pub min_ns: u64,
    pub mean_ns: f64,
    /// Standard deviation (fio's `stddev`).
    pub stddev_ns: f64,
    pub max_ns: u64,
    /// Values at [`PERCENTILES`], same order.
    pub percentiles_ns: [u64; PERCENTILES.len()],
}

impl LatencySummary {
    /// The value at percentile `p`, one of [`PERCENTILES`].
    pub fn at(&self, p: f64) -> u64 {
        let i = PERCENTILES.iter().position(|(q, _)| *q == p);
        let i = i.unwrap_or_else(|| panic!("{p} is not one of PERCENTILES"));
        self.percentiles_ns[i]
    }

    pub fn p99_ns(&self) -> u64 {
        self.at(99.0)
    }

    /// Adds two distributions field by field (min+min, p99+p99, ...). This is
    /// NOT the distribution of the sum of two latencies; it is the stated
    /// approximation for fio's ack latency (write + fdatasync, reported
    /// separately by fio). The stddev is that of a sum of independent
    /// latencies, sqrt(a^2 + b^2), under the same caveat.
    pub fn sum_fieldwise(&self, other: &LatencySummary) -> LatencySummary {
        let mut percentiles_ns = self.percentiles_ns;
        for (p, o) in percentiles_ns.iter_mut().zip(other.percentiles_ns) {
            *p = p.saturating_add(o);
        }
        LatencySummary {
            samples: self.samples.min(other.samples),
            min_ns: self.min_ns.saturating_add(other.min_ns),
            mean_ns: self.mean_ns + other.mean_ns,
            stddev_ns: self.stddev_ns.hypot(other.stddev_ns),
            max_ns: self.max_ns.saturating_add(other.max_ns),
            percentiles_ns,
        }
    }
}

/// Records latencies into an HDR histogram (1 ns .. 1 h, 3 significant
/// digits: 0.1% resolution at every scale).
pub struct LatencyRecorder {
    hist: Histogram<u64>,
}

const HIST_MAX_NS: u64 = 3_600 * 1_000_000_000;

impl LatencyRecorder {
    pub fn new() -> Self {
        let hist = Histogram::new_with_bounds(1, HIST_MAX_NS, 3)
            .expect("static histogram bounds are valid");
        Self { hist }
    }

    pub fn record(&mut self, latency: Duration) {
        let ns = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        self.hist.saturating_record(ns.clamp(1, HIST_MAX_NS));
    }

    /// Adds every sample of `other` (e.g. another thread's recorder).
    pub fn merge(&mut self, other: &LatencyRecorder) {
        self.hist
            .add(&other.hist)
            .expect("recorders share the same bounds");
    }

    pub fn summary(&self) -> LatencySummary {
        if self.hist.is_empty() {
            return LatencySummary {
                samples: 0,
                min_ns: 0,
                mean_ns: 0.0,
                stddev_ns: 0.0,
                max_ns: 0,
                percentiles_ns: [0; PERCENTILES.len()],
            };
        }
        let mut percentiles_ns = [0; PERCENTILES.len()];
        for (slot, (p, _)) in percentiles_ns.iter_mut().zip(PERCENTILES) {
            *slot = self.hist.value_at_percentile(p);
        }
        LatencySummary {
            samples: self.hist.len(),
            min_ns: self.hist.min(),
            mean_ns: self.hist.mean(),
            stddev_ns: self.hist.stdev(),
            max_ns: self.hist.max(),
            percentiles_ns,
        }
    }
}

impl Default for LatencyRecorder {
    fn default() -> Self {
        Self::new()
    }
}

/// One timed run of a write job: what fio calls a job's `write` section.
#[derive(Debug, Clone, PartialEq)]
pub struct RunSummary {
    /// Bytes written in the timed region.
    pub bytes: u64,
    /// Writes (batches) acknowledged in the timed region.
    pub ios: u64,
    pub runtime: Duration,
    /// Bytes per second (fio's `bw_bytes`).
    pub bw_bytes: f64,
    pub iops: f64,
    /// Per-write latency; for ringlog, append() to durable ack.
    pub lat: LatencySummary,
    /// CPU time of this process over the timed region, when measured.
    pub cpu: Option<CpuUsage>,
    /// Bytes completed in each second of the timed region (empty when not
    /// recorded, e.g. for fio).
    pub timeline: Vec<u64>,
}

impl RunSummary {
    /// Derives bandwidth and IOPS from the counts.
    pub fn from_counts(bytes: u64, ios: u64, runtime: Duration, lat: LatencySummary) -> Self {
        Self {
            bytes,
            ios,
            runtime,
            bw_bytes: per_second(bytes, runtime),
            iops: per_second(ios, runtime),
            lat,
            cpu: None,
            timeline: Vec::new(),
        }
    }

    pub fn with_cpu(mut self, cpu: CpuUsage) -> Self {
        self.cpu = Some(cpu);
        self
    }

    pub fn with_timeline(mut self, timeline: Timeline) -> Self {
        self.timeline = timeline.buckets;
        self
    }

    /// CPU time (user + system) per MiB of `bytes`, in milliseconds: the
    /// cost per byte, which other load on the machine shifts less than the
    /// throughput. None without a CPU measurement or bytes.
    pub fn cpu_ms_per_mib(&self) -> Option<f64> {
        let cpu = self.cpu?;
        if self.bytes == 0 {
            return None;
        }
        let cpu_ms = (cpu.usr_pct + cpu.sys_pct) / 100.0 * self.runtime.as_secs_f64() * 1000.0;
        Some(cpu_ms / (self.bytes as f64 / (1024.0 * 1024.0)))
    }
}

/// User and system CPU time of this process (all threads) over a region,
/// from getrusage(RUSAGE_SELF), as percentages of the region's wall time
/// (fio's `usr_cpu`/`sys_cpu`; 100 = one core busy).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CpuUsage {
    pub usr_pct: f64,
    pub sys_pct: f64,
    /// Voluntary + involuntary context switches (fio's `ctx`).
    pub ctx: u64,
}

/// A getrusage snapshot; [`CpuMeter::usage`] gives the usage since it.
#[derive(Debug, Clone, Copy)]
pub struct CpuMeter {
    at: Instant,
    usr: Duration,
    sys: Duration,
    ctx: u64,
}

fn rusage_self() -> (Duration, Duration, u64) {
    // SAFETY: getrusage writes a plain C struct we own; zeroed is valid.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_SELF with a valid out-pointer cannot fail.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    if rc != 0 {
        return (Duration::ZERO, Duration::ZERO, 0);
    }
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec.max(0) as u64) + Duration::from_micros(t.tv_usec.max(0) as u64)
    };
    let ctx = (ru.ru_nvcsw.max(0) + ru.ru_nivcsw.max(0)) as u64;
    (tv(ru.ru_utime), tv(ru.ru_stime), ctx)
}

impl CpuMeter {
    pub fn start() -> Self {
        let (usr, sys, ctx) = rusage_self();
        Self {
            at: Instant::now(),
            usr,
            sys,
            ctx,
        }
    }

    /// Usage since [`CpuMeter::start`], relative to the wall time since then.
    pub fn usage(&self) -> CpuUsage {
        let wall = self.at.elapsed().as_secs_f64();
        let (usr, sys, ctx) = rusage_self();
        let pct = |d: Duration| {
            if wall > 0.0 {
                d.as_secs_f64() / wall * 100.0
            } else {
                0.0
            }
        };
        CpuUsage {
            usr_pct: pct(usr.saturating_sub(self.usr)),
            sys_pct: pct(sys.saturating_sub(self.sys)),
            ctx: ctx.saturating_sub(self.ctx),
        }
    }
}

/// Bytes completed per second of a timed region, for throughput-over-time
/// plots.
#[derive(Debug, Clone)]
pub struct Timeline {
    start: Instant,
    buckets: Vec<u64>,
}

impl Timeline {
    pub fn starting(start: Instant) -> Self {
        Self {
            start,
            buckets: Vec::new(),
        }
    }

    /// Counts `bytes` completed at `at` into its one-second bucket.
    pub fn record(&mut self, at: Instant, bytes: u64) {
        let i = at.saturating_duration_since(self.start).as_secs() as usize;
        if self.buckets.len() <= i {
            self.buckets.resize(i + 1, 0);
        }
        self.buckets[i] += bytes;
        crate::status::PROGRESS_BYTES.fetch_add(bytes, std::sync::atomic::Ordering::Relaxed);
    }

    /// Adds another timeline with the same start (e.g. another thread's).
    pub fn merge(&mut self, other: &Timeline) {
        if self.buckets.len() < other.buckets.len() {
            self.buckets.resize(other.buckets.len(), 0);
        }
        for (a, b) in self.buckets.iter_mut().zip(&other.buckets) {
            *a += b;
        }
    }
}

fn per_second(count: u64, runtime: Duration) -> f64 {
    let secs = runtime.as_secs_f64();
    if secs > 0.0 {
        count as f64 / secs
    } else {
        0.0
    }
}

/// Median, min and max of a set of ratios (one per rep).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub n: usize,
}

impl Spread {
    /// `None` for an empty set or one containing NaN.
    pub fn of(values: &[f64]) -> Option<Spread> {
        if values.is_empty() || values.iter().any(|v| v.is_nan()) {
            return None;
        }
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let median = if n % 2 == 1 {
            sorted[n / 2]
        } else {
            (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
        };
        Some(Spread {
            median,
            min: sorted[0],
            max: sorted[n - 1],
            n,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recorder_summarises_min_mean_max_and_percentiles() {
        let mut rec = LatencyRecorder::new();
        for us in 1..=1000u64 {
            rec.record(Duration::from_micros(us));
        }
        let s = rec.summary();
        assert_eq!(s.samples, 1000);
        // 3 significant digits: buckets are at most 2/2048 of the value wide.
        let close = |got: u64, want: u64| got.abs_diff(want) <= want / 500 + 1;
        assert!(close(s.min_ns, 1_000));
        assert!(close(s.max_ns, 1_000_000));
        assert!((s.mean_ns - 500_500.0).abs() < 1_000.0);
        assert!(close(s.at(50.0), 500_000));
        assert!(close(s.at(90.0), 900_000));
        assert!(close(s.p99_ns(), 990_000));
        assert!(close(s.at(99.9), 999_000));
        assert!(close(s.at(99.99), 1_000_000));
        assert!(close(s.at(1.0), 10_000));
        // Uniform 1..1000 us: stddev = 1000 / sqrt(12) us.
        assert!((s.stddev_ns - 288_675.0).abs() < 2_000.0, "{}", s.stddev_ns);
    }

    #[test]
    fn empty_recorder_is_all_zero() {
        let s = LatencyRecorder::new().summary();
        assert_eq!(s.samples, 0);
        assert_eq!(s.p99_ns(), 0);
    }

    #[test]
    fn spread_of_odd_and_even_sets() {
        let s = Spread::of(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.n), (2.0, 1.0, 3.0, 3));
        let s = Spread::of(&[4.0, 1.0, 2.0, 3.0]).unwrap();
        assert_eq!(s.median, 2.5);
        assert!(Spread::of(&[]).is_none());
        assert!(Spread::of(&[1.0, f64::NAN]).is_none());
    }

    #[test]
    fn timeline_buckets_by_second_and_merges() {
        let t0 = Instant::now();
        let mut a = Timeline::starting(t0);
        a.record(t0, 10);
        a.record(t0 + Duration::from_millis(2500), 5);
        let mut b = Timeline::starting(t0);
        b.record(t0 + Duration::from_millis(999), 1);
        a.merge(&b);
        let run = RunSummary::from_counts(
            16,
            3,
            Duration::from_secs(3),
            LatencyRecorder::new().summary(),
        )
        .with_timeline(a);
        assert_eq!(run.timeline, vec![11, 0, 5]);
    }

    #[test]
    fn cpu_per_mib_is_cpu_time_over_bytes() {
        let run = RunSummary::from_counts(
            512 << 20,
            512,
            Duration::from_secs(2),
            LatencyRecorder::new().summary(),
        );
        assert_eq!(run.cpu_ms_per_mib(), None);
        let run = run.with_cpu(CpuUsage {
            usr_pct: 30.0,
            sys_pct: 20.0,
            ctx: 0,
        });
        // 50% of a core for 2 s = 1000 ms over 512 MiB.
        let got = run.cpu_ms_per_mib().unwrap();
        assert!((got - 1000.0 / 512.0).abs() < 1e-9, "{got}");
    }

    #[test]
    fn cpu_meter_sees_busy_time() {
        let meter = CpuMeter::start();
        let t = Instant::now();
        let mut x = 0u64;
        while t.elapsed() < Duration::from_millis(50) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let cpu = meter.usage();
        assert!(cpu.usr_pct + cpu.sys_pct > 10.0, "{cpu:?}");
        assert!(cpu.usr_pct + cpu.sys_pct < 250.0, "{cpu:?}");
    }

    #[test]
    fn throughput_from_bytes_and_runtime() {
        let run = RunSummary::from_counts(
            10 << 20,
            160,
            Duration::from_secs(2),
            LatencyRecorder::new().summary(),
        );
        assert_eq!(run.bw_bytes, (5 << 20) as f64);
        assert_eq!(run.iops, 80.0);
        let idle = RunSummary::from_counts(1, 1, Duration::ZERO, run.lat);
        assert_eq!(idle.bw_bytes, 0.0);
    }
}
