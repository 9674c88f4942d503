//! One report for every job: settings and notes, the repetitions (our run
//! and, with a comparison, theirs), the ratios over the reps; as text and
//! fio-style JSON. Each job's result type says only what is its own
//! ([`Measured`]: its detail lines and JSON fields).

use std::fmt::Write as _;

use serde_json::{json, Map, Value};

use crate::fio::{FioFetchResult, FioResult, FioTransferResult};
use crate::jobs::append::AppendResult;
use crate::jobs::consume::ConsumeResult;
use crate::jobs::fetch::FetchResult;
use crate::jobs::partitions::PartitionsOutcome;
use crate::jobs::produce::ProduceResult;
use crate::jobs::transfer::{Mode, TransferResult};
use crate::plot::Series;
use crate::size::Bytes;
use crate::stats::{LatencySummary, RunSummary, Spread, HEADLINE_PERCENTILES, PERCENTILES};

/// How fio's ack latency is derived; printed with every comparison.
pub const FIO_ACK_NOTE: &str = "fio ack latency = write lat + fdatasync lat, each statistic summed \
     (fio reports the two separately and has no combined view; summing percentiles is an approximation)";

/// How ringlog's ack latency is measured.
pub const RINGLOG_ACK_NOTE: &str =
    "ringlog ack latency = append() of a batch to the completion (reaped) of the group commit (write + fdatasync) that made it durable";

/// What the CPU per MiB figures count, on both sides.
pub const CPU_PER_MIB_NOTE: &str = "cpu per MiB = user + system CPU time over the timed run / MiB \
     written; ringlog: the whole process (getrusage, io_uring workers included); fio: its job's \
     usr_cpu + sys_cpu";

/// How the transfer job's chunk latencies are measured, on both sides.
pub const TRANSFER_LAT_NOTE: &str =
    "ringlog chunk latency = its request sent to its staged write done (read, delay line both \
     ways, verify, write); fio chunk latency = read lat + write lat at iodepth=--window, \
     each statistic summed (an approximation; fio's per-I/O latency includes queueing behind the \
     other I/Os in flight)";

/// How the transfer job's throughput is computed, on both sides.
pub const TRANSFER_BW_NOTE: &str = "throughput = log bytes / time; ringlog: the receiver's first \
     request through commit_install; fio: read job runtime + write job runtime (the write job's \
     includes its end fsync)";

/// What the transfer job's lockstep comparison compares.
pub const TRANSFER_LOCKSTEP_NOTE: &str = "windowed = the transfer machines with --window chunks \
     requested at once; lockstep = one 256KiB chunk requested, read, sent back and written before \
     the next (Apache Iggy's design); both over the same in-process delay line (--delay-ms each \
     way), throughput = log bytes / (first request .. commit), chunk latency = request .. staged";

/// How the produce job's ack latency is measured.
pub const PRODUCE_ACK_NOTE: &str =
    "produce ack latency = sending a produce request to reading its \
     reply, which the server sends once the batch is durable (fdatasync done); retries of \
     backpressure refusals are included";

/// What the produce/append comparison compares.
pub const PRODUCE_VS_APPEND_NOTE: &str = "append = the storage-level job in this process: one \
     partition per connection, one batch each per group commit (write + fdatasync), no network, \
     no server";

/// How the consume job's fetch latency is measured.
pub const FETCH_LAT_NOTE: &str = "fetch latency = sending a fetch request to reading its reply \
     (no long-poll wait); throughput = fetched bytes / time for all connections to reach the \
     high watermark of every partition";

/// How the fetch job's read latency is measured, on both sides.
pub const FETCH_READ_LAT_NOTE: &str = "ringlog read latency = one PartitionStore::read(offset, \
     max_bytes) call (I/O, batch verification, copy out); fio read latency = one bs-sized \
     O_DIRECT read at iodepth=1 (lat_ns: submit to completion)";

/// One side of a repetition: what a job's run adds to the generic report.
pub trait Measured {
    /// fio's `jobname` of the run.
    const JOBNAME: &'static str;
    /// The JSON section holding [`Measured::summary`] (fio's `write`/`read`).
    const SECTION: &'static str;
    /// `engine` in the JSON.
    const ENGINE: &'static str;
    /// The timed run that throughput, the plot and the ratios use; None for
    /// a run that is not one timed stream of I/O.
    fn summary(&self) -> Option<&RunSummary>;
    /// The latency the p99 ratio compares.
    fn ratio_lat(&self) -> Option<&LatencySummary> {
        self.summary().map(|s| &s.lat)
    }
    /// The run whose CPU use the JSON job carries.
    fn cpu_run(&self) -> Option<&RunSummary> {
        self.summary()
    }
    /// Text lines after the `label: bw=...` line.
    fn details(&self, out: &mut String);
    /// JSON fields beside jobname, engine, rep, error, the section and CPU.
    fn fields(&self) -> Value;
    /// fio's `job options` of the run; None: the report's settings.
    fn job_options(&self) -> Option<Map<String, Value>> {
        None
    }
}

/// The side of a job without a comparison run.
#[derive(Debug, Clone)]
pub enum Never {}

impl Measured for Never {
    const JOBNAME: &'static str = "";
    const SECTION: &'static str = "";
    const ENGINE: &'static str = "";
    fn summary(&self) -> Option<&RunSummary> {
        match *self {}
    }
    fn details(&self, _: &mut String) {
        match *self {}
    }
    fn fields(&self) -> Value {
        match *self {}
    }
}

/// What a job compares with what: the ratio lines' names and notes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Comparison {
    /// `ringlog/fio`, `produce/append`.
    pub pair: &'static str,
    /// The latency the p99 ratio names: `ack`, `chunk`, `read`.
    pub latency: &'static str,
    /// Whether a CPU per MiB ratio is reported (both sides measured).
    pub cpu: bool,
    /// Printed after the ratios.
    pub notes: &'static [&'static str],
}

/// One A/B repetition: ours first, then (with a comparison) theirs.
#[derive(Debug, Clone)]
pub struct Rep<A, B> {
    pub ours: A,
    pub theirs: Option<B>,
}

/// Everything a report prints.
#[derive(Debug, Clone)]
pub struct Report<A, B = Never> {
    /// The job's name: `ringlog-bench <job>: settings`.
    pub job: &'static str,
    /// `name=value` settings of the run, in print order.
    pub settings: Vec<(&'static str, String)>,
    /// fio's version, when it ran.
    pub fio_version: Option<String>,
    /// Notes on the run's setup, printed after the settings.
    pub notes: Vec<String>,
    /// Text labels of our run and theirs.
    pub labels: [&'static str; 2],
    pub comparison: Option<Comparison>,
    pub reps: Vec<Rep<A, B>>,
}

/// Median/min/max over reps of ours/theirs throughput, p99 latency and
/// (when both sides measured it) CPU per MiB.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ratios {
    pub throughput: Spread,
    pub p99_latency: Spread,
    pub cpu_per_mib: Option<Spread>,
}

impl<A: Measured, B: Measured> Report<A, B> {
    /// `None` without a comparison or unless every rep has theirs.
    pub fn ratios(&self) -> Option<Ratios> {
        let cmp = self.comparison?;
        let (mut bw, mut p99, mut cpu) = (Vec::new(), Vec::new(), Vec::new());
        for rep in &self.reps {
            let (ours, theirs) = (rep.ours.summary()?, rep.theirs.as_ref()?.summary()?);
            bw.push(ratio(ours.bw_bytes, theirs.bw_bytes));
            let (a, b) = (rep.ours.ratio_lat()?, rep.theirs.as_ref()?.ratio_lat()?);
            p99.push(ratio(a.p99_ns() as f64, b.p99_ns() as f64));
            if let (Some(a), Some(b)) = (ours.cpu_ms_per_mib(), theirs.cpu_ms_per_mib()) {
                cpu.push(ratio(a, b));
            }
        }
        Some(Ratios {
            throughput: Spread::of(&bw)?,
            p99_latency: Spread::of(&p99)?,
            cpu_per_mib: (cmp.cpu && cpu.len() == self.reps.len())
                .then(|| Spread::of(&cpu))
                .flatten(),
        })
    }

    pub fn text(&self) -> String {
        let mut out = String::new();
        let settings: Vec<String> = self
            .settings
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let _ = writeln!(out, "ringlog-bench {}: {}", self.job, settings.join(" "));
        if let Some(v) = &self.fio_version {
            let _ = writeln!(out, "fio: {v}");
        }
        for note in &self.notes {
            let _ = writeln!(out, "note: {note}");
        }
        let n = self.reps.len();
        for (i, rep) in self.reps.iter().enumerate() {
            let _ = writeln!(out);
            if n > 1 {
                let _ = writeln!(out, "rep {}/{n}", i + 1);
            }
            run_text(&mut out, self.labels[0], &rep.ours);
            if let Some(theirs) = &rep.theirs {
                run_text(&mut out, self.labels[1], theirs);
            }
        }
        if let (Some(r), Some(cmp)) = (self.ratios(), self.comparison) {
            let _ = writeln!(out);
            ratio_line(&mut out, "throughput", cmp.pair, &r.throughput);
            let lat = format!("p99 {} latency", cmp.latency);
            ratio_line(&mut out, &lat, cmp.pair, &r.p99_latency);
            if let Some(cpu) = &r.cpu_per_mib {
                ratio_line(&mut out, "cpu per MiB", cmp.pair, cpu);
            }
            for note in cmp.notes {
                let _ = writeln!(out, "note: {note}");
            }
        }
        out
    }

    /// fio-compatible JSON: `jobs[]` with fio's `jobname`, a `write`/`read`
    /// section (`io_bytes`, `bw_bytes`, `iops`, `runtime`, `total_ios`,
    /// `lat_ns`), `usr_cpu`/`sys_cpu`, plus `ratios`.
    pub fn json(&self) -> Value {
        let settings: Map<String, Value> = self
            .settings
            .iter()
            .map(|(k, v)| ((*k).to_owned(), Value::from(v.as_str())))
            .collect();
        let mut jobs = Vec::new();
        for (i, rep) in self.reps.iter().enumerate() {
            jobs.push(run_json(&rep.ours, i + 1, &settings));
            if let Some(theirs) = &rep.theirs {
                jobs.push(run_json(theirs, i + 1, &settings));
            }
        }
        // Tools reading fio's JSON look for "fio version": fio's own when it
        // ran, else this harness's.
        let fio_version = self
            .fio_version
            .clone()
            .unwrap_or_else(|| format!("ringlog-bench-{}", env!("CARGO_PKG_VERSION")));
        let mut root = json!({
            "fio version": fio_version,
            "ringlog-bench version": env!("CARGO_PKG_VERSION"),
            "global options": settings,
            "notes": self.notes,
            "jobs": jobs,
        });
        if let (Some(r), Some(cmp)) = (self.ratios(), self.comparison) {
            root["ratios"] = json!({
                "throughput": spread_json(&r.throughput),
                format!("p99_{}_latency", cmp.latency): spread_json(&r.p99_latency),
                "notes": cmp.notes,
            });
            if let Some(cpu) = &r.cpu_per_mib {
                root["ratios"]["cpu_per_mib"] = spread_json(cpu);
            }
        }
        root
    }

    /// The runs to plot: label (with the rep when there are several), the
    /// timeline, and the latency the ratios compare (fio append: write +
    /// fdatasync, not the write alone).
    pub fn series(&self) -> Vec<Series<'_>> {
        let n = self.reps.len();
        let label = |name: &str, i: usize| match n {
            1 => name.to_owned(),
            _ => format!("{name} rep {}", i + 1),
        };
        fn one<'a, M: Measured>(label: String, run: &'a M) -> Option<Series<'a>> {
            Some(Series {
                label,
                timeline: &run.summary()?.timeline,
                lat: run.ratio_lat()?,
            })
        }
        let mut out = Vec::new();
        for (i, rep) in self.reps.iter().enumerate() {
            out.extend(one(label(self.labels[0], i), &rep.ours));
            if let Some(theirs) = &rep.theirs {
                out.extend(one(label(self.labels[1], i), theirs));
            }
        }
        out
    }
}

/// What the output needs of any job's report: text, fio-style JSON, and
/// the runs to plot.
pub trait JobReport {
    fn text(&self) -> String;
    fn json(&self) -> Value;
    fn series(&self) -> Vec<Series<'_>>;
}

impl<A: Measured, B: Measured> JobReport for Report<A, B> {
    fn text(&self) -> String {
        Report::text(self)
    }
    fn json(&self) -> Value {
        Report::json(self)
    }
    fn series(&self) -> Vec<Series<'_>> {
        Report::series(self)
    }
}

fn run_text<M: Measured>(out: &mut String, label: &str, run: &M) {
    if let Some(s) = run.summary() {
        run_line(out, label, s);
    }
    run.details(out);
}

fn run_json<M: Measured>(run: &M, rep: usize, settings: &Map<String, Value>) -> Value {
    let mut job = run.fields();
    job["jobname"] = Value::from(M::JOBNAME);
    job["job options"] = Value::Object(run.job_options().unwrap_or_else(|| settings.clone()));
    job["engine"] = Value::from(M::ENGINE);
    job["rep"] = Value::from(rep);
    job["error"] = Value::from(0);
    if let Some(s) = run.summary() {
        job[M::SECTION] = write_json(s);
    }
    if let Some(run) = run.cpu_run() {
        if let Some(cpu) = run.cpu {
            job["usr_cpu"] = Value::from(cpu.usr_pct);
            job["sys_cpu"] = Value::from(cpu.sys_pct);
            job["ctx"] = Value::from(cpu.ctx);
            if let Some(ms) = run.cpu_ms_per_mib() {
                job["cpu_ms_per_mib"] = Value::from(ms);
            }
        }
    }
    job
}

/// `records/s=N: ` of a run.
fn records_per_sec(records: u64, run: &RunSummary) -> f64 {
    let secs = run.runtime.as_secs_f64();
    if secs > 0.0 {
        records as f64 / secs
    } else {
        0.0
    }
}

impl Measured for AppendResult {
    const JOBNAME: &'static str = "append";
    const SECTION: &'static str = "write";
    const ENGINE: &'static str = "ringlog";
    fn summary(&self) -> Option<&RunSummary> {
        Some(&self.summary)
    }
    fn details(&self, out: &mut String) {
        let s = &self.summary;
        let _ = writeln!(
            out,
            "    records/s={:.0}: {} records in {} batches of {} ({} records each)",
            records_per_sec(self.records, s),
            self.records,
            s.ios,
            Bytes(batch_bytes(s)),
            self.records_per_batch
        );
        lat_lines(out, "ack lat", &s.lat);
    }
    fn fields(&self) -> Value {
        json!({
            "records": self.records,
            "records_per_sec": records_per_sec(self.records, &self.summary),
            "records_per_batch": self.records_per_batch,
        })
    }
}

impl Measured for FioResult {
    const JOBNAME: &'static str = "append";
    const SECTION: &'static str = "write";
    const ENGINE: &'static str = "fio";
    fn summary(&self) -> Option<&RunSummary> {
        Some(&self.write)
    }
    fn ratio_lat(&self) -> Option<&LatencySummary> {
        Some(&self.ack_lat)
    }
    fn details(&self, out: &mut String) {
        let field = format!("write lat ({})", self.write_lat_field);
        lat_lines(out, &field, &self.write.lat);
        lat_lines(out, "sync lat", &self.sync_lat);
        lat_lines(out, "ack lat ~ write+sync", &self.ack_lat);
        let _ = writeln!(out, "    command: {}", self.command);
    }
    fn fields(&self) -> Value {
        json!({
            "command": self.command,
            "write_lat_field": self.write_lat_field,
            "sync": { "lat_ns": lat_json(&self.sync_lat) },
            "ack_lat_ns": lat_json(&self.ack_lat),
        })
    }
    fn job_options(&self) -> Option<Map<String, Value>> {
        Some(crate::fio::job_options(&self.args))
    }
}

impl Measured for TransferResult {
    const JOBNAME: &'static str = "transfer";
    const SECTION: &'static str = "transfer";
    const ENGINE: &'static str = "ringlog";
    fn summary(&self) -> Option<&RunSummary> {
        Some(&self.summary)
    }
    fn details(&self, out: &mut String) {
        let mode = match self.mode {
            Mode::Windowed => format!("windowed, {} chunks in flight", self.window),
            Mode::Lockstep => "lockstep, one chunk at a time".to_owned(),
        };
        let _ = writeln!(
            out,
            "    {mode} of {}, delay {} ms each way (in process, not TCP)",
            Bytes(u64::from(self.chunk_size)),
            self.delay.as_millis()
        );
        let _ = writeln!(
            out,
            "    {} artifacts in {} chunks; open {:.1} ms, chunks {:.3} s, commit {:.3} s",
            self.artifacts,
            self.summary.ios,
            self.phases.open.as_secs_f64() * 1000.0,
            self.phases.chunks.as_secs_f64(),
            self.phases.commit.as_secs_f64()
        );
        let _ = writeln!(
            out,
            "    receiver memory: peak {} in chunk buffers (measured), bound {} (window x chunk \
             size + 1 chunk); {} chunks re-requested",
            Bytes(self.receiver_peak_bytes),
            Bytes(self.receiver_bound_bytes),
            self.chunks_rerequested
        );
        lat_lines(out, "chunk lat (request..staged)", &self.summary.lat);
        lat_lines(out, "read_chunks lat", &self.read_lat);
        lat_lines(out, "stage (verify+write) lat", &self.write_lat);
    }
    fn fields(&self) -> Value {
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1000.0;
        json!({
            "artifacts": self.artifacts,
            "mode": match self.mode { Mode::Windowed => "windowed", Mode::Lockstep => "lockstep" },
            "window": self.window,
            "chunk_size": self.chunk_size,
            "delay_ms": ms(self.delay),
            "receiver_peak_bytes": self.receiver_peak_bytes,
            "receiver_bound_bytes": self.receiver_bound_bytes,
            "chunks_rerequested": self.chunks_rerequested,
            "phases_ms": {
                "open": ms(self.phases.open),
                "chunks": ms(self.phases.chunks),
                "commit": ms(self.phases.commit),
            },
            "read_chunk": { "lat_ns": lat_json(&self.read_lat) },
            "accept_chunk": { "lat_ns": lat_json(&self.write_lat) },
        })
    }
}

/// The comparison run of the transfer job: fio's copy, or the lockstep
/// pull.
#[derive(Debug, Clone)]
pub enum TransferBaseline {
    Fio(FioTransferResult),
    Lockstep(TransferResult),
}

impl Measured for TransferBaseline {
    const JOBNAME: &'static str = "transfer";
    const SECTION: &'static str = "transfer";
    const ENGINE: &'static str = "baseline";
    fn summary(&self) -> Option<&RunSummary> {
        match self {
            TransferBaseline::Fio(f) => f.summary(),
            TransferBaseline::Lockstep(l) => l.summary(),
        }
    }
    fn cpu_run(&self) -> Option<&RunSummary> {
        match self {
            TransferBaseline::Fio(f) => f.cpu_run(),
            TransferBaseline::Lockstep(l) => l.cpu_run(),
        }
    }
    fn details(&self, out: &mut String) {
        match self {
            TransferBaseline::Fio(f) => f.details(out),
            TransferBaseline::Lockstep(l) => l.details(out),
        }
    }
    fn fields(&self) -> Value {
        let (kind, mut fields) = match self {
            TransferBaseline::Fio(f) => ("fio", f.fields()),
            TransferBaseline::Lockstep(l) => ("lockstep", l.fields()),
        };
        fields["baseline"] = json!(kind);
        fields
    }
    fn job_options(&self) -> Option<Map<String, Value>> {
        match self {
            TransferBaseline::Fio(f) => f.job_options(),
            TransferBaseline::Lockstep(_) => None,
        }
    }
}

impl Measured for FioTransferResult {
    const JOBNAME: &'static str = "transfer";
    const SECTION: &'static str = "transfer";
    const ENGINE: &'static str = "fio";
    fn summary(&self) -> Option<&RunSummary> {
        Some(&self.transfer)
    }
    fn cpu_run(&self) -> Option<&RunSummary> {
        Some(&self.read)
    }
    fn details(&self, out: &mut String) {
        run_line(out, "    fio read", &self.read);
        lat_lines(
            out,
            &format!("read lat ({})", self.lat_field),
            &self.read.lat,
        );
        run_line(out, "    fio write+end_fsync", &self.write);
        lat_lines(
            out,
            &format!("write lat ({})", self.lat_field),
            &self.write.lat,
        );
        lat_lines(out, "chunk lat ~ read+write", &self.transfer.lat);
        let _ = writeln!(out, "    command: {}", self.command);
    }
    fn fields(&self) -> Value {
        json!({
            "command": self.command,
            "lat_field": self.lat_field,
            "read": write_json(&self.read),
            "write": write_json(&self.write),
        })
    }
    fn job_options(&self) -> Option<Map<String, Value>> {
        Some(crate::fio::job_options(&self.args))
    }
}

impl Measured for ProduceResult {
    const JOBNAME: &'static str = "produce";
    const SECTION: &'static str = "write";
    const ENGINE: &'static str = "ringlog-server";
    fn summary(&self) -> Option<&RunSummary> {
        Some(&self.summary)
    }
    fn details(&self, out: &mut String) {
        let s = &self.summary;
        let _ = writeln!(
            out,
            "    records/s={:.0}: {} records in {} batches of {} ({} records each), {} retries",
            records_per_sec(self.records, s),
            self.records,
            s.ios,
            Bytes(batch_bytes(s)),
            self.records_per_batch,
            self.retries
        );
        lat_lines(out, "ack lat", &s.lat);
    }
    fn fields(&self) -> Value {
        json!({
            "records": self.records,
            "records_per_sec": records_per_sec(self.records, &self.summary),
            "records_per_batch": self.records_per_batch,
            "retries": self.retries,
        })
    }
}

impl Measured for ConsumeResult {
    const JOBNAME: &'static str = "consume";
    const SECTION: &'static str = "read";
    const ENGINE: &'static str = "ringlog-server";
    fn summary(&self) -> Option<&RunSummary> {
        Some(&self.summary)
    }
    fn details(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "    records/s={:.0}: {} records in {} batches, {} fetches",
            records_per_sec(self.records, &self.summary),
            self.records,
            self.batches,
            self.summary.ios
        );
        lat_lines(out, "fetch lat", &self.summary.lat);
    }
    fn fields(&self) -> Value {
        json!({
            "records": self.records,
            "records_per_sec": records_per_sec(self.records, &self.summary),
            "batches": self.batches,
        })
    }
}

impl Measured for FetchResult {
    const JOBNAME: &'static str = "fetch";
    const SECTION: &'static str = "read";
    const ENGINE: &'static str = "ringlog";
    fn summary(&self) -> Option<&RunSummary> {
        Some(&self.summary)
    }
    fn details(&self, out: &mut String) {
        let s = &self.summary;
        let _ = writeln!(
            out,
            "    reads/s={:.1}, records/s={:.0}: {} records in {} reads of {} on average",
            s.iops,
            records_per_sec(self.records, s),
            self.records,
            s.ios,
            Bytes(batch_bytes(s))
        );
        lat_lines(out, "read lat", &s.lat);
    }
    fn fields(&self) -> Value {
        json!({
            "records": self.records,
            "records_per_sec": records_per_sec(self.records, &self.summary),
            "empty_reads": self.empty_reads,
        })
    }
}

impl Measured for FioFetchResult {
    const JOBNAME: &'static str = "fetch";
    const SECTION: &'static str = "read";
    const ENGINE: &'static str = "fio";
    fn summary(&self) -> Option<&RunSummary> {
        Some(&self.read)
    }
    fn details(&self, out: &mut String) {
        lat_lines(
            out,
            &format!("read lat ({})", self.lat_field),
            &self.read.lat,
        );
        let _ = writeln!(out, "    command: {}", self.command);
    }
    fn fields(&self) -> Value {
        json!({ "command": self.command, "lat_field": self.lat_field })
    }
    fn job_options(&self) -> Option<Map<String, Value>> {
        Some(crate::fio::job_options(&self.args))
    }
}

impl Measured for PartitionsOutcome {
    const JOBNAME: &'static str = "partitions";
    const SECTION: &'static str = "";
    const ENGINE: &'static str = "ringlog-server";
    fn summary(&self) -> Option<&RunSummary> {
        None
    }
    fn details(&self, out: &mut String) {
        self.text(out);
    }
    fn fields(&self) -> Value {
        self.json()
    }
}

/// The append job against fio's write + fdatasync job.
pub const APPEND_VS_FIO: Comparison = Comparison {
    pair: "ringlog/fio",
    latency: "ack",
    cpu: true,
    notes: &[RINGLOG_ACK_NOTE, FIO_ACK_NOTE, CPU_PER_MIB_NOTE],
};

/// The transfer job against fio reading one file and writing another.
pub const TRANSFER_VS_FIO: Comparison = Comparison {
    pair: "ringlog/fio",
    latency: "chunk",
    cpu: false,
    notes: &[TRANSFER_BW_NOTE, TRANSFER_LAT_NOTE],
};

/// The transfer job against the lockstep pull at the same delay.
pub const TRANSFER_VS_LOCKSTEP: Comparison = Comparison {
    pair: "windowed/lockstep",
    latency: "chunk",
    cpu: false,
    notes: &[TRANSFER_LOCKSTEP_NOTE],
};

/// The fetch job against fio's read/randread job.
pub const FETCH_VS_FIO: Comparison = Comparison {
    pair: "ringlog/fio",
    latency: "read",
    cpu: false,
    notes: &[FETCH_READ_LAT_NOTE],
};

/// Produce through the server against the storage-level append job.
pub const PRODUCE_VS_APPEND: Comparison = Comparison {
    pair: "produce/append",
    latency: "ack",
    cpu: false,
    notes: &[PRODUCE_ACK_NOTE, RINGLOG_ACK_NOTE, PRODUCE_VS_APPEND_NOTE],
};

fn ratio(ours: f64, theirs: f64) -> f64 {
    if theirs > 0.0 {
        ours / theirs
    } else {
        f64::NAN
    }
}

fn batch_bytes(run: &RunSummary) -> u64 {
    run.bytes.checked_div(run.ios).unwrap_or(0)
}

const MIB: f64 = 1024.0 * 1024.0;
const GIB: f64 = 1024.0 * MIB;

fn run_line(out: &mut String, name: &str, run: &RunSummary) {
    let size = run.bytes as f64;
    let amount = if size >= GIB {
        format!("{:.2} GiB", size / GIB)
    } else {
        format!("{:.1} MiB", size / MIB)
    };
    let _ = writeln!(
        out,
        "{name}: bw={:.1} MiB/s, iops={:.1}, {amount} in {:.2} s",
        run.bw_bytes / MIB,
        run.iops,
        run.runtime.as_secs_f64()
    );
    if let Some(cpu) = run.cpu {
        let per_mib = run
            .cpu_ms_per_mib()
            .map_or(String::new(), |ms| format!(", {ms:.3} ms cpu per MiB"));
        let _ = writeln!(
            out,
            "    cpu: usr={:.1}%, sys={:.1}%, ctx={}{per_mib}",
            cpu.usr_pct, cpu.sys_pct, cpu.ctx
        );
    }
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

pub(crate) fn lat_lines(out: &mut String, name: &str, lat: &LatencySummary) {
    let _ = writeln!(
        out,
        "    {name} (usec): min={:.1}, avg={:.1}, stdev={:.1}, max={:.1}, samples={}",
        us(lat.min_ns),
        lat.mean_ns / 1000.0,
        lat.stddev_ns / 1000.0,
        us(lat.max_ns),
        lat.samples
    );
    let pcts: Vec<String> = HEADLINE_PERCENTILES
        .iter()
        .map(|p| format!("{p}={:.1}", us(lat.at(*p))))
        .collect();
    let _ = writeln!(out, "    {name} percentiles (usec): {}", pcts.join(", "));
}

/// `ratio <what> <pair> = x (median of n reps, min a, max b)`.
fn ratio_line(out: &mut String, what: &str, pair: &str, s: &Spread) {
    let _ = writeln!(
        out,
        "ratio {what} {pair} = {:.2} (median of {} rep{}, min {:.2}, max {:.2})",
        s.median,
        s.n,
        if s.n == 1 { "" } else { "s" },
        s.min,
        s.max
    );
}

fn lat_json(lat: &LatencySummary) -> Value {
    let percentile: Map<String, Value> = PERCENTILES
        .iter()
        .zip(lat.percentiles_ns)
        .map(|((_, key), v)| ((*key).to_owned(), Value::from(v)))
        .collect();
    json!({
        "min": lat.min_ns,
        "max": lat.max_ns,
        "mean": lat.mean_ns,
        "stddev": lat.stddev_ns,
        "N": lat.samples,
        "percentile": percentile,
    })
}

fn write_json(run: &RunSummary) -> Value {
    json!({
        "io_bytes": run.bytes,
        "bw_bytes": run.bw_bytes.round() as u64,
        "iops": run.iops,
        "runtime": run.runtime.as_millis() as u64,
        "total_ios": run.ios,
        "lat_ns": lat_json(&run.lat),
    })
}

fn spread_json(s: &Spread) -> Value {
    json!({ "median": s.median, "min": s.min, "max": s.max, "reps": s.n })
}

/// The structure tools reading fio JSON rely on, checked by every job's
/// tests: `fio version`, `jobs[].jobname` and `job options`, a `write`,
/// `read` or `transfer` section with `io_bytes`, `bw_bytes`, `iops`,
/// `runtime`, `total_ios` and `lat_ns` (`min`, `max`, `mean`, `stddev`,
/// `N`, `percentile` with fio's keys), job-level
/// `usr_cpu`/`sys_cpu` when `cpu`, and `ratios.<key>.{median,min,max,reps}`
/// for each of `ratios`. The document also parses back from its JSON text.
#[cfg(test)]
pub fn assert_fio_shape(v: &Value, cpu: bool, ratios: &[&str]) {
    let text = serde_json::to_string_pretty(v).unwrap();
    let back: Value = serde_json::from_str(&text).unwrap();
    // (Floats may differ in the last digit: serde_json's default parser.)
    assert_eq!(
        back["jobs"].as_array().map(Vec::len),
        v["jobs"].as_array().map(Vec::len)
    );
    assert!(v["fio version"].is_string(), "fio version: {text}");
    let jobs = v["jobs"].as_array().expect("jobs[]");
    assert!(!jobs.is_empty(), "{text}");
    for job in jobs {
        assert!(job["jobname"].is_string(), "jobname: {job}");
        assert_eq!(job["error"], 0, "{job}");
        let dir = ["write", "read", "transfer"]
            .into_iter()
            .find(|k| job.get(*k).is_some())
            .unwrap_or_else(|| panic!("no write/read/transfer section: {job}"));
        let d = &job[dir];
        for key in ["io_bytes", "bw_bytes", "runtime", "total_ios"] {
            assert!(d[key].is_u64(), "{dir}.{key}: {job}");
        }
        assert!(d["iops"].is_number(), "{dir}.iops: {job}");
        assert!(job["job options"].is_object(), "job options: {job}");
        let lat = &d["lat_ns"];
        for key in ["min", "max", "mean", "stddev", "N"] {
            assert!(lat[key].is_number(), "{dir}.lat_ns.{key}: {job}");
        }
        for (_, key) in PERCENTILES {
            assert!(
                lat["percentile"][key].is_u64(),
                "{dir}.lat_ns.percentile[{key}]: {job}"
            );
        }
        if cpu {
            for key in ["usr_cpu", "sys_cpu"] {
                assert!(job[key].is_f64(), "{key}: {job}");
            }
        }
    }
    for key in ratios {
        let r = &v["ratios"][key];
        for k in ["median", "min", "max"] {
            assert!(r[k].is_f64(), "ratios.{key}.{k}: {text}");
        }
        assert!(r["reps"].is_u64(), "ratios.{key}.reps: {text}");
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::fio::{parse_append, parse_transfer};
    use crate::jobs::transfer::Phases;
    use crate::stats::LatencyRecorder;
    use crate::testutil::assert_has;

    fn ringlog_run(bw_scale: u64, lat_us: u64) -> AppendResult {
        let mut rec = LatencyRecorder::new();
        for _ in 0..100 {
            rec.record(Duration::from_micros(lat_us));
        }
        AppendResult {
            summary: RunSummary::from_counts(
                bw_scale * (64 << 20),
                bw_scale * 1024,
                Duration::from_secs(1),
                rec.summary(),
            ),
            records: bw_scale * 1024 * 62,
            records_per_batch: 62,
        }
    }

    fn with<A, B>(
        job: &'static str,
        labels: [&'static str; 2],
        comparison: Comparison,
        fio_version: Option<String>,
        reps: Vec<Rep<A, B>>,
    ) -> Report<A, B> {
        Report {
            job,
            settings: vec![("size", "64MiB".into())],
            fio_version,
            notes: vec!["a note".into()],
            labels,
            comparison: Some(comparison),
            reps,
        }
    }

    fn report(with_fio: bool) -> Report<AppendResult, FioResult> {
        let fio = parse_append(include_str!("testdata/fio-3.33-append-64k.json")).unwrap();
        let reps = (1..=3)
            .map(|k| Rep {
                ours: ringlog_run(k, 1000),
                theirs: with_fio.then(|| fio.clone()),
            })
            .collect();
        let labels = ["ringlog append", "fio append"];
        let version = with_fio.then(|| fio.version.clone());
        with("append", labels, APPEND_VS_FIO, version, reps)
    }

    #[test]
    fn cpu_per_mib_ratio_needs_cpu_on_both_sides() {
        let mut r = report(true);
        assert!(r.ratios().unwrap().cpu_per_mib.is_none());
        assert!(!r.text().contains("ratio cpu per MiB"));
        let cpu = |pct: f64| crate::stats::CpuUsage {
            usr_pct: pct,
            sys_pct: 0.0,
            ctx: 0,
        };
        for rep in &mut r.reps {
            rep.ours.summary.cpu = Some(cpu(50.0));
            if let Some(f) = &mut rep.theirs {
                f.write.cpu = Some(cpu(10.0));
            }
        }
        let spread = r.ratios().unwrap().cpu_per_mib.unwrap();
        let ours = r.reps[1].ours.summary.cpu_ms_per_mib().unwrap();
        let theirs = r.reps[1].theirs.as_ref().unwrap().write.cpu_ms_per_mib();
        assert!((spread.median - ours / theirs.unwrap()).abs() < 1e-9);
        let text = r.text();
        assert_has(
            &text,
            &["ratio cpu per MiB ringlog/fio = ", " ms cpu per MiB"],
        );
        let json = r.json();
        assert!(json["ratios"]["cpu_per_mib"]["median"].is_number());
        assert!(json["jobs"][0]["cpu_ms_per_mib"].is_number());
    }

    #[test]
    fn ratios_are_median_min_max_over_reps() {
        let r = report(true).ratios().unwrap();
        let fio_bw = 111_662_003.0;
        let want = |k: f64| k * (64u64 << 20) as f64 / fio_bw;
        assert_eq!(r.throughput.n, 3);
        assert!((r.throughput.median - want(2.0)).abs() < 1e-9);
        assert!((r.throughput.min - want(1.0)).abs() < 1e-9);
        assert!((r.throughput.max - want(3.0)).abs() < 1e-9);
        // ringlog p99 = 1 ms (within histogram precision); fio ack p99 =
        // write p99 + sync p99 from the sample.
        let fio_p99 = (1_204_224 + 2_867_200) as f64;
        assert!((r.p99_latency.median - 1_000_000.0 / fio_p99).abs() < 0.001);
        assert!(report(false).ratios().is_none());
    }

    #[test]
    fn text_has_summary_and_ratio_lines() {
        let text = report(true).text();
        let head = "ringlog-bench append: size=64MiB\nfio: fio-3.33\nnote: a note\n";
        assert!(text.starts_with(head), "{text}");
        assert_has(
            &text,
            &[
                "ringlog append: bw=",
                "records/s=63488: 63488 records in 1024 batches of 64KiB",
                "fio append: bw=106.5 MiB/s, iops=1703.8",
                "    sync lat percentiles (usec): 50=",
                "ratio throughput ringlog/fio = ",
                "(median of 3 reps, min ",
                "ratio p99 ack latency ringlog/fio = ",
                &format!("note: {FIO_ACK_NOTE}"),
                "99.99=",
            ],
        );
        assert!(!report(false).text().contains("ratio"));
    }

    #[test]
    fn json_uses_fio_field_names() {
        let v = report(true).json();
        let job = &v["jobs"][0];
        assert_eq!(job["jobname"], "append");
        assert_eq!(job["write"]["bw_bytes"], 64u64 << 20);
        assert!(job["write"]["iops"].as_f64().is_some());
        for (_, key) in PERCENTILES {
            assert!(job["write"]["lat_ns"]["percentile"][key].is_u64(), "{key}");
        }
        for key in ["min", "max", "mean"] {
            assert!(job["write"]["lat_ns"][key].is_number(), "{key}");
        }
        assert_fio_shape(&v, false, &["throughput", "p99_ack_latency"]);
        assert_eq!(v["jobs"][1]["engine"], "fio");
        assert_eq!(v["jobs"][1]["write"]["bw_bytes"], 111_662_003u64);
        assert!(v["jobs"][1]["sync"]["lat_ns"]["N"].is_u64());
        assert_eq!(v["ratios"]["throughput"]["reps"], 3);
        assert_eq!(v["ratios"]["notes"][1], FIO_ACK_NOTE);
        assert_eq!(v["fio version"], "fio-3.33");
        assert!(report(false).json().get("ratios").is_none());
    }

    /// Our JSON has what fio's own has where tools read it: the root's
    /// `fio version`, each job's `job options`, and `lat_ns` with the same
    /// keys (stddev, fio's full percentile list), checked against the JSON
    /// fio 3.33 printed for the equivalent job.
    #[test]
    fn json_has_fios_own_field_names() {
        let fio: Value =
            serde_json::from_str(include_str!("testdata/fio-3.33-append-64k.json")).unwrap();
        let keys = |v: &Value| -> Vec<String> {
            let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
            k.sort();
            k
        };
        let fio_lat = &fio["jobs"][0]["write"]["lat_ns"];
        let ours = serde_json::to_string(&report(true).json()).unwrap();
        let v: Value = serde_json::from_str(&ours).unwrap();
        assert_eq!(v["fio version"], fio["fio version"]);
        for job in v["jobs"].as_array().unwrap() {
            let lat = &job["write"]["lat_ns"];
            assert_eq!(keys(lat), keys(fio_lat), "{job}");
            assert_eq!(keys(&lat["percentile"]), keys(&fio_lat["percentile"]));
            assert!(lat["stddev"].as_f64().unwrap() >= 0.0);
            assert!(job["job options"].is_object(), "{job}");
        }
        let ringlog = &v["jobs"][0];
        assert_eq!(ringlog["job options"]["size"], "64MiB");
        // fio's stddev comes through; the summed ack stddev is sqrt(w^2 + s^2).
        let fio_job = &v["jobs"][1];
        let w = fio_lat["stddev"].as_f64().unwrap();
        assert_eq!(fio_job["write"]["lat_ns"]["stddev"].as_f64().unwrap(), w);
        let sync = fio["jobs"][0]["sync"]["lat_ns"]["stddev"].as_f64().unwrap();
        let ack = fio_job["ack_lat_ns"]["stddev"].as_f64().unwrap();
        assert!((ack - w.hypot(sync)).abs() < 1e-6);
        // Without fio the document still names a version, the harness's.
        let plain = report(false).json();
        assert!(plain["fio version"]
            .as_str()
            .unwrap()
            .starts_with("ringlog-bench-"));
    }

    #[test]
    fn plot_series_carry_fios_write_plus_sync_latency() {
        let r = report(true);
        let series = r.series();
        assert_eq!(series.len(), 6);
        assert_eq!(series[1].label, "fio append rep 1");
        let fio = r.reps[0].theirs.as_ref().unwrap();
        assert_eq!(*series[1].lat, fio.ack_lat, "write + sync, not write alone");
        assert_ne!(fio.ack_lat, fio.write.lat);
        assert_eq!(*series[0].lat, r.reps[0].ours.summary.lat);
    }

    fn produce_report(with_append: bool) -> Report<ProduceResult, AppendResult> {
        let reps = (1..=3)
            .map(|k| Rep {
                ours: ProduceResult {
                    summary: RunSummary::from_counts(
                        k * (64 << 20),
                        k * 1024,
                        Duration::from_secs(1),
                        ringlog_run(1, 2000).summary.lat,
                    ),
                    records: k * 1024 * 62,
                    records_per_batch: 62,
                    retries: 0,
                },
                theirs: with_append.then(|| ringlog_run(k + 1, 1000)),
            })
            .collect();
        with(
            "produce",
            ["produce", "append"],
            PRODUCE_VS_APPEND,
            None,
            reps,
        )
    }

    #[test]
    fn produce_ratios_and_lines() {
        let r = produce_report(true).ratios().unwrap();
        // produce k, append k+1: ratios 1/2, 2/3, 3/4.
        assert!((r.throughput.median - 2.0 / 3.0).abs() < 1e-9);
        assert!((r.throughput.min - 0.5).abs() < 1e-9);
        assert!((r.throughput.max - 0.75).abs() < 1e-9);
        assert!((r.p99_latency.median - 2.0).abs() < 0.01);
        assert!(r.cpu_per_mib.is_none());
        let text = produce_report(true).text();
        assert!(text.contains("records/s=63488: 63488 records in 1024 batches of 64KiB"));
        assert!(
            text.contains(
                "ratio throughput produce/append = 0.67 (median of 3 reps, min 0.50, max 0.75)"
            ),
            "{text}"
        );
        let v = produce_report(true).json();
        assert_eq!(v["jobs"][0]["jobname"], "produce");
        assert_eq!(v["jobs"][1]["jobname"], "append");
        assert_fio_shape(&v, false, &["throughput", "p99_ack_latency"]);
        assert_eq!(v["ratios"]["throughput"]["reps"], 3);
        assert_eq!(
            v["fio version"],
            format!("ringlog-bench-{}", env!("CARGO_PKG_VERSION"))
        );
        let plain = produce_report(false);
        assert!(plain.ratios().is_none());
        assert!(!plain.text().contains("ratio"));
        assert!(plain.json().get("ratios").is_none());
        assert_eq!(plain.series().len(), 3);
        assert_eq!(produce_report(true).series()[1].label, "append rep 1");
    }

    fn transfer_run(bw_scale: u64) -> TransferResult {
        let mut rec = LatencyRecorder::new();
        for _ in 0..64 {
            rec.record(Duration::from_millis(4));
        }
        let lat = rec.summary();
        TransferResult {
            summary: RunSummary::from_counts(
                bw_scale * (64 << 20),
                bw_scale * 64,
                Duration::from_secs(1),
                lat,
            ),
            artifacts: 2,
            read_lat: lat,
            write_lat: lat,
            phases: Phases {
                open: Duration::from_millis(1),
                chunks: Duration::from_millis(800),
                commit: Duration::from_millis(199),
            },
            mode: Mode::Windowed,
            chunk_size: 1 << 20,
            window: 4,
            delay: Duration::ZERO,
            receiver_peak_bytes: 4 << 20,
            receiver_bound_bytes: 5 << 20,
            chunks_rerequested: 0,
        }
    }

    fn transfer_report(with_fio: bool) -> Report<TransferResult, FioTransferResult> {
        let fio = parse_transfer(include_str!("testdata/fio-3.33-transfer-1m-qd4.json")).unwrap();
        let reps = (1..=3)
            .map(|k| Rep {
                ours: transfer_run(k),
                theirs: with_fio.then(|| fio.clone()),
            })
            .collect();
        let labels = ["ringlog transfer", "fio transfer"];
        let version = with_fio.then(|| fio.version.clone());
        with("transfer", labels, TRANSFER_VS_FIO, version, reps)
    }

    #[test]
    fn transfer_ratios_use_the_summed_fio_runtime() {
        let r = transfer_report(true).ratios().unwrap();
        // fio: 64 MiB in 183 ms read + 209 ms write.
        let fio_bw = (64u64 << 20) as f64 / 0.392;
        let want = |k: f64| k * (64u64 << 20) as f64 / fio_bw;
        assert_eq!(r.throughput.n, 3);
        assert!((r.throughput.median - want(2.0)).abs() < 1e-6);
        assert!((r.throughput.min - want(1.0)).abs() < 1e-6);
        assert!((r.throughput.max - want(3.0)).abs() < 1e-6);
        let fio_p99 = (44_826_624 + 26_869_760) as f64;
        assert!((r.p99_latency.median - 4_000_000.0 / fio_p99).abs() < 0.001);
        assert!(transfer_report(false).ratios().is_none());
    }

    #[test]
    fn transfer_text_has_summary_phase_and_ratio_lines() {
        let text = transfer_report(true).text();
        assert!(
            text.starts_with("ringlog-bench transfer: size=64MiB\n"),
            "{text}"
        );
        assert_has(
            &text,
            &[
                "note: a note",
                "ringlog transfer: bw=",
                "2 artifacts in 64 chunks; open 1.0 ms",
                "chunk lat (request..staged) percentiles (usec)",
                "fio transfer: bw=163.3 MiB/s",
                "    fio read: bw=",
                "    fio write+end_fsync: bw=",
                "ratio throughput ringlog/fio = ",
                "ratio p99 chunk latency ringlog/fio = ",
            ],
        );
        assert!(!transfer_report(false).text().contains("ratio"));
    }

    #[test]
    fn transfer_json_has_sections_and_ratios() {
        let v = transfer_report(true).json();
        assert_fio_shape(&v, false, &["throughput", "p99_chunk_latency"]);
        let job = &v["jobs"][0];
        assert_eq!(job["jobname"], "transfer");
        assert_eq!(job["engine"], "ringlog");
        assert_eq!(job["transfer"]["io_bytes"], 64u64 << 20);
        assert!(job["transfer"]["lat_ns"]["percentile"]["99.000000"].is_u64());
        assert!(job["read_chunk"]["lat_ns"]["N"].is_u64());
        assert!(job["phases_ms"]["commit"].is_f64());
        let fio = &v["jobs"][1];
        assert_eq!(fio["engine"], "fio");
        assert_eq!(fio["read"]["runtime"], 183);
        assert_eq!(fio["write"]["runtime"], 209);
        assert_eq!(fio["transfer"]["runtime"], 392);
        assert_eq!(v["ratios"]["throughput"]["reps"], 3);
        assert!(v["ratios"]["p99_chunk_latency"]["median"].is_f64());
        assert_eq!(v["global options"]["size"], "64MiB");
        assert!(transfer_report(false).json().get("ratios").is_none());
    }
}
