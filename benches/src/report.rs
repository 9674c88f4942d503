//! Text and JSON output of a run, and the ringlog/fio ratio lines.

use std::fmt::Write as _;

use serde_json::{json, Map, Value};

use crate::fio::{FioFetchResult, FioResult, FioTransferResult};
use crate::jobs::append::AppendResult;
use crate::jobs::consume::ConsumeResult;
use crate::jobs::fetch::FetchResult;
use crate::jobs::produce::ProduceResult;
use crate::jobs::transfer::TransferResult;
use crate::size::Bytes;
use crate::stats::{LatencySummary, RunSummary, Spread, PERCENTILES};

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

/// One A/B repetition: ringlog first, then (with --vs-fio) fio.
#[derive(Debug, Clone)]
pub struct Rep {
    pub ringlog: AppendResult,
    pub fio: Option<FioResult>,
}

/// Everything a report prints.
#[derive(Debug, Clone)]
pub struct Report {
    /// `name=value` settings of the run, in print order.
    pub settings: Vec<(&'static str, String)>,
    /// fio's version, when it ran.
    pub fio_version: Option<String>,
    /// Notes on the run's setup, printed after the settings.
    pub notes: Vec<String>,
    pub reps: Vec<Rep>,
}

/// Median/min/max over reps of ringlog/fio throughput and p99 ack latency.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ratios {
    pub throughput: Spread,
    pub p99_ack_latency: Spread,
    /// None unless every rep measured CPU on both sides.
    pub cpu_per_mib: Option<Spread>,
}

impl Report {
    /// `None` unless every rep has a fio run.
    pub fn ratios(&self) -> Option<Ratios> {
        let mut throughput = Vec::with_capacity(self.reps.len());
        let mut p99 = Vec::with_capacity(self.reps.len());
        let mut cpu = Vec::with_capacity(self.reps.len());
        for rep in &self.reps {
            let fio = rep.fio.as_ref()?;
            let ours = &rep.ringlog.summary;
            throughput.push(ratio(ours.bw_bytes, fio.write.bw_bytes));
            p99.push(ratio(ours.lat.p99_ns() as f64, fio.ack_lat.p99_ns() as f64));
            if let (Some(a), Some(b)) = (ours.cpu_ms_per_mib(), fio.write.cpu_ms_per_mib()) {
                cpu.push(ratio(a, b));
            }
        }
        Some(Ratios {
            throughput: Spread::of(&throughput)?,
            p99_ack_latency: Spread::of(&p99)?,
            cpu_per_mib: if cpu.len() == self.reps.len() {
                Spread::of(&cpu)
            } else {
                None
            },
        })
    }

    pub fn text(&self) -> String {
        let mut out = String::new();
        header(
            &mut out,
            "append",
            &self.settings,
            self.fio_version.as_deref(),
            &self.notes,
        );
        let n = self.reps.len();
        for (i, rep) in self.reps.iter().enumerate() {
            let _ = writeln!(out);
            if n > 1 {
                let _ = writeln!(out, "rep {}/{n}", i + 1);
            }
            let r = &rep.ringlog;
            run_line(&mut out, "ringlog append", &r.summary);
            let _ = writeln!(
                out,
                "    {} records in {} batches of {} ({} records each)",
                r.records,
                r.summary.ios,
                Bytes(batch_bytes(&r.summary)),
                r.records_per_batch
            );
            lat_lines(&mut out, "ack lat", &r.summary.lat);
            if let Some(f) = &rep.fio {
                run_line(&mut out, "fio append", &f.write);
                lat_lines(
                    &mut out,
                    &format!("write lat ({})", f.write_lat_field),
                    &f.write.lat,
                );
                lat_lines(&mut out, "sync lat", &f.sync_lat);
                lat_lines(&mut out, "ack lat ~ write+sync", &f.ack_lat);
                let _ = writeln!(out, "    command: {}", f.command);
            }
        }
        if let Some(r) = self.ratios() {
            let _ = writeln!(out);
            ratio_line(&mut out, "throughput", &r.throughput);
            ratio_line(&mut out, "p99 ack latency", &r.p99_ack_latency);
            if let Some(cpu) = &r.cpu_per_mib {
                ratio_line(&mut out, "cpu per MiB", cpu);
            }
            let _ = writeln!(out, "note: {RINGLOG_ACK_NOTE}");
            let _ = writeln!(out, "note: {FIO_ACK_NOTE}");
            let _ = writeln!(out, "note: {CPU_PER_MIB_NOTE}");
        }
        out
    }

    /// fio-compatible JSON: `jobs[].write.{bw_bytes,iops,lat_ns}` as fio
    /// names them, plus `ratios`.
    pub fn json(&self) -> Value {
        let mut jobs = Vec::new();
        for (i, rep) in self.reps.iter().enumerate() {
            let r = &rep.ringlog;
            jobs.push(with_cpu(
                json!({
                    "jobname": "append",
                    "engine": "ringlog",
                    "rep": i + 1,
                    "error": 0,
                    "records": r.records,
                    "records_per_batch": r.records_per_batch,
                    "write": write_json(&r.summary),
                }),
                &r.summary,
            ));
            if let Some(f) = &rep.fio {
                jobs.push(with_cpu(
                    json!({
                        "jobname": "append",
                        "engine": "fio",
                        "rep": i + 1,
                        "error": 0,
                        "command": f.command,
                        "write_lat_field": f.write_lat_field,
                        "write": write_json(&f.write),
                        "sync": { "lat_ns": lat_json(&f.sync_lat) },
                        "ack_lat_ns": lat_json(&f.ack_lat),
                    }),
                    &f.write,
                ));
            }
        }
        let mut root = root_json(
            &self.settings,
            self.fio_version.as_deref(),
            &self.notes,
            jobs,
        );
        if let Some(r) = self.ratios() {
            root["ratios"] = json!({
                "throughput": spread_json(&r.throughput),
                "p99_ack_latency": spread_json(&r.p99_ack_latency),
                "notes": [RINGLOG_ACK_NOTE, FIO_ACK_NOTE, CPU_PER_MIB_NOTE],
            });
            if let Some(cpu) = &r.cpu_per_mib {
                root["ratios"]["cpu_per_mib"] = spread_json(cpu);
            }
        }
        root
    }
}

/// How the transfer job's chunk latencies are measured, on both sides.
pub const TRANSFER_LAT_NOTE: &str =
    "ringlog chunk latency = read_chunks + accept_chunks of the chunk's window \
     (one submission each); fio chunk latency = read lat + write lat at iodepth=--window, \
     each statistic summed (an approximation; fio's per-I/O latency includes queueing behind the \
     other I/Os in flight)";

/// How the transfer job's throughput is computed, on both sides.
pub const TRANSFER_BW_NOTE: &str = "throughput = log bytes / time; ringlog: open_snapshot through \
     commit_install; fio: read job runtime + write job runtime (the write job's includes its end fsync)";

/// One A/B repetition of the transfer job.
#[derive(Debug, Clone)]
pub struct TransferRep {
    pub ringlog: TransferResult,
    pub fio: Option<FioTransferResult>,
}

/// Everything the transfer job's report prints.
#[derive(Debug, Clone)]
pub struct TransferReport {
    pub settings: Vec<(&'static str, String)>,
    pub fio_version: Option<String>,
    pub notes: Vec<String>,
    pub reps: Vec<TransferRep>,
}

/// Median/min/max over reps of ringlog/fio transfer throughput and p99
/// chunk latency.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TransferRatios {
    pub throughput: Spread,
    pub p99_chunk_latency: Spread,
}

impl TransferReport {
    /// `None` unless every rep has a fio run.
    pub fn ratios(&self) -> Option<TransferRatios> {
        let mut throughput = Vec::with_capacity(self.reps.len());
        let mut p99 = Vec::with_capacity(self.reps.len());
        for rep in &self.reps {
            let fio = &rep.fio.as_ref()?.transfer;
            let ours = &rep.ringlog.summary;
            throughput.push(ratio(ours.bw_bytes, fio.bw_bytes));
            p99.push(ratio(ours.lat.p99_ns() as f64, fio.lat.p99_ns() as f64));
        }
        Some(TransferRatios {
            throughput: Spread::of(&throughput)?,
            p99_chunk_latency: Spread::of(&p99)?,
        })
    }

    pub fn text(&self) -> String {
        let mut out = String::new();
        header(
            &mut out,
            "transfer",
            &self.settings,
            self.fio_version.as_deref(),
            &self.notes,
        );
        let n = self.reps.len();
        for (i, rep) in self.reps.iter().enumerate() {
            let _ = writeln!(out);
            if n > 1 {
                let _ = writeln!(out, "rep {}/{n}", i + 1);
            }
            let r = &rep.ringlog;
            run_line(&mut out, "ringlog transfer", &r.summary);
            let _ = writeln!(
                out,
                "    {} artifacts in {} chunks; open {:.1} ms, chunks {:.3} s, commit {:.3} s",
                r.artifacts,
                r.summary.ios,
                r.phases.open.as_secs_f64() * 1000.0,
                r.phases.chunks.as_secs_f64(),
                r.phases.commit.as_secs_f64()
            );
            lat_lines(&mut out, "chunk lat (read+write)", &r.summary.lat);
            lat_lines(&mut out, "read_chunk lat", &r.read_lat);
            lat_lines(&mut out, "accept_chunk lat", &r.write_lat);
            if let Some(f) = &rep.fio {
                run_line(&mut out, "fio transfer", &f.transfer);
                run_line(&mut out, "    fio read", &f.read);
                lat_lines(
                    &mut out,
                    &format!("read lat ({})", f.lat_field),
                    &f.read.lat,
                );
                run_line(&mut out, "    fio write+end_fsync", &f.write);
                lat_lines(
                    &mut out,
                    &format!("write lat ({})", f.lat_field),
                    &f.write.lat,
                );
                lat_lines(&mut out, "chunk lat ~ read+write", &f.transfer.lat);
                let _ = writeln!(out, "    command: {}", f.command);
            }
        }
        if let Some(r) = self.ratios() {
            let _ = writeln!(out);
            ratio_line(&mut out, "throughput", &r.throughput);
            ratio_line(&mut out, "p99 chunk latency", &r.p99_chunk_latency);
            let _ = writeln!(out, "note: {TRANSFER_BW_NOTE}");
            let _ = writeln!(out, "note: {TRANSFER_LAT_NOTE}");
        }
        out
    }

    /// fio-style JSON: per job a `transfer` section shaped like fio's
    /// `read`/`write` sections (`io_bytes`, `bw_bytes`, `iops`, `runtime`,
    /// `total_ios`, `lat_ns`), fio's own `read` and `write` sections for fio
    /// runs, plus `ratios`.
    pub fn json(&self) -> Value {
        let mut jobs = Vec::new();
        for (i, rep) in self.reps.iter().enumerate() {
            let r = &rep.ringlog;
            jobs.push(with_cpu(
                json!({
                    "jobname": "transfer",
                    "engine": "ringlog",
                    "rep": i + 1,
                    "error": 0,
                    "artifacts": r.artifacts,
                    "phases_ms": {
                        "open": r.phases.open.as_secs_f64() * 1000.0,
                        "chunks": r.phases.chunks.as_secs_f64() * 1000.0,
                        "commit": r.phases.commit.as_secs_f64() * 1000.0,
                    },
                    "transfer": write_json(&r.summary),
                    "read_chunk": { "lat_ns": lat_json(&r.read_lat) },
                    "accept_chunk": { "lat_ns": lat_json(&r.write_lat) },
                }),
                &r.summary,
            ));
            if let Some(f) = &rep.fio {
                jobs.push(with_cpu(
                    json!({
                        "jobname": "transfer",
                        "engine": "fio",
                        "rep": i + 1,
                        "error": 0,
                        "command": f.command,
                        "lat_field": f.lat_field,
                        "transfer": write_json(&f.transfer),
                        "read": write_json(&f.read),
                        "write": write_json(&f.write),
                    }),
                    &f.read,
                ));
            }
        }
        let mut root = root_json(
            &self.settings,
            self.fio_version.as_deref(),
            &self.notes,
            jobs,
        );
        if let Some(r) = self.ratios() {
            root["ratios"] = json!({
                "throughput": spread_json(&r.throughput),
                "p99_chunk_latency": spread_json(&r.p99_chunk_latency),
                "notes": [TRANSFER_BW_NOTE, TRANSFER_LAT_NOTE],
            });
        }
        root
    }
}

/// How the produce job's ack latency is measured.
pub const PRODUCE_ACK_NOTE: &str =
    "produce ack latency = sending a produce request to reading its \
     reply, which the server sends once the batch is durable (fdatasync done); retries of \
     backpressure refusals are included";

/// What the produce/append comparison compares.
pub const PRODUCE_VS_APPEND_NOTE: &str = "append = the storage-level job in this process: one \
     partition per connection, one batch each per group commit (write + fdatasync), no network, \
     no server";

/// One repetition of the produce job: produce first, then (with
/// --vs-append) the storage-level append job.
#[derive(Debug, Clone)]
pub struct ProduceRep {
    pub produce: ProduceResult,
    pub append: Option<AppendResult>,
}

/// Everything the produce job's report prints.
#[derive(Debug, Clone)]
pub struct ProduceReport {
    pub settings: Vec<(&'static str, String)>,
    pub notes: Vec<String>,
    pub reps: Vec<ProduceRep>,
}

/// Median/min/max over reps of produce/append throughput and p99 ack
/// latency.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProduceRatios {
    pub throughput: Spread,
    pub p99_ack_latency: Spread,
}

fn per_sec(count: u64, run: &RunSummary) -> f64 {
    let secs = run.runtime.as_secs_f64();
    if secs > 0.0 {
        count as f64 / secs
    } else {
        0.0
    }
}

impl ProduceReport {
    /// `None` unless every rep has an append run.
    pub fn ratios(&self) -> Option<ProduceRatios> {
        let mut throughput = Vec::with_capacity(self.reps.len());
        let mut p99 = Vec::with_capacity(self.reps.len());
        for rep in &self.reps {
            let append = &rep.append.as_ref()?.summary;
            let ours = &rep.produce.summary;
            throughput.push(ratio(ours.bw_bytes, append.bw_bytes));
            p99.push(ratio(ours.lat.p99_ns() as f64, append.lat.p99_ns() as f64));
        }
        Some(ProduceRatios {
            throughput: Spread::of(&throughput)?,
            p99_ack_latency: Spread::of(&p99)?,
        })
    }

    pub fn text(&self) -> String {
        let mut out = String::new();
        header(&mut out, "produce", &self.settings, None, &self.notes);
        let n = self.reps.len();
        for (i, rep) in self.reps.iter().enumerate() {
            let _ = writeln!(out);
            if n > 1 {
                let _ = writeln!(out, "rep {}/{n}", i + 1);
            }
            let p = &rep.produce;
            run_line(&mut out, "produce", &p.summary);
            let _ = writeln!(
                out,
                "    records/s={:.0}: {} records in {} batches of {} ({} records each), {} retries",
                per_sec(p.records, &p.summary),
                p.records,
                p.summary.ios,
                Bytes(batch_bytes(&p.summary)),
                p.records_per_batch,
                p.retries
            );
            lat_lines(&mut out, "ack lat", &p.summary.lat);
            if let Some(a) = &rep.append {
                run_line(&mut out, "append", &a.summary);
                let _ = writeln!(
                    out,
                    "    records/s={:.0}: {} records in {} batches of {} ({} records each)",
                    per_sec(a.records, &a.summary),
                    a.records,
                    a.summary.ios,
                    Bytes(batch_bytes(&a.summary)),
                    a.records_per_batch
                );
                lat_lines(&mut out, "ack lat", &a.summary.lat);
            }
        }
        if let Some(r) = self.ratios() {
            let _ = writeln!(out);
            pair_ratio_line(&mut out, "throughput", "produce/append", &r.throughput);
            pair_ratio_line(
                &mut out,
                "p99 ack latency",
                "produce/append",
                &r.p99_ack_latency,
            );
            let _ = writeln!(out, "note: {PRODUCE_ACK_NOTE}");
            let _ = writeln!(out, "note: {RINGLOG_ACK_NOTE}");
            let _ = writeln!(out, "note: {PRODUCE_VS_APPEND_NOTE}");
        }
        out
    }

    /// fio-style JSON: per job a `write` section (`io_bytes`, `bw_bytes`,
    /// `iops`, `runtime`, `total_ios`, `lat_ns`), plus `ratios`.
    pub fn json(&self) -> Value {
        let mut jobs = Vec::new();
        for (i, rep) in self.reps.iter().enumerate() {
            let p = &rep.produce;
            jobs.push(with_cpu(
                json!({
                    "jobname": "produce",
                    "engine": "ringlog-server",
                    "rep": i + 1,
                    "error": 0,
                    "records": p.records,
                    "records_per_sec": per_sec(p.records, &p.summary),
                    "records_per_batch": p.records_per_batch,
                    "retries": p.retries,
                    "write": write_json(&p.summary),
                }),
                &p.summary,
            ));
            if let Some(a) = &rep.append {
                jobs.push(with_cpu(
                    json!({
                        "jobname": "append",
                        "engine": "ringlog",
                        "rep": i + 1,
                        "error": 0,
                        "records": a.records,
                        "records_per_sec": per_sec(a.records, &a.summary),
                        "records_per_batch": a.records_per_batch,
                        "write": write_json(&a.summary),
                    }),
                    &a.summary,
                ));
            }
        }
        let mut root = root_json(&self.settings, None, &self.notes, jobs);
        if let Some(r) = self.ratios() {
            root["ratios"] = json!({
                "throughput": spread_json(&r.throughput),
                "p99_ack_latency": spread_json(&r.p99_ack_latency),
                "notes": [PRODUCE_ACK_NOTE, RINGLOG_ACK_NOTE, PRODUCE_VS_APPEND_NOTE],
            });
        }
        root
    }
}

/// How the consume job's fetch latency is measured.
pub const FETCH_LAT_NOTE: &str = "fetch latency = sending a fetch request to reading its reply \
     (no long-poll wait); throughput = fetched bytes / time for all connections to reach the \
     high watermark of every partition";

/// Everything the consume job's report prints.
#[derive(Debug, Clone)]
pub struct ConsumeReport {
    pub settings: Vec<(&'static str, String)>,
    pub notes: Vec<String>,
    pub reps: Vec<ConsumeResult>,
}

impl ConsumeReport {
    pub fn text(&self) -> String {
        let mut out = String::new();
        header(&mut out, "consume", &self.settings, None, &self.notes);
        let n = self.reps.len();
        for (i, c) in self.reps.iter().enumerate() {
            let _ = writeln!(out);
            if n > 1 {
                let _ = writeln!(out, "rep {}/{n}", i + 1);
            }
            run_line(&mut out, "consume", &c.summary);
            let _ = writeln!(
                out,
                "    records/s={:.0}: {} records in {} batches, {} fetches",
                per_sec(c.records, &c.summary),
                c.records,
                c.batches,
                c.summary.ios
            );
            lat_lines(&mut out, "fetch lat", &c.summary.lat);
        }
        let _ = writeln!(out);
        let _ = writeln!(out, "note: {FETCH_LAT_NOTE}");
        out
    }

    /// fio-style JSON: per rep a `read` section (`io_bytes`, `bw_bytes`,
    /// `iops`, `runtime`, `total_ios`, `lat_ns`).
    pub fn json(&self) -> Value {
        let jobs = self
            .reps
            .iter()
            .enumerate()
            .map(|(i, c)| {
                with_cpu(
                    json!({
                        "jobname": "consume",
                        "engine": "ringlog-server",
                        "rep": i + 1,
                        "error": 0,
                        "records": c.records,
                        "records_per_sec": per_sec(c.records, &c.summary),
                        "batches": c.batches,
                        "read": write_json(&c.summary),
                    }),
                    &c.summary,
                )
            })
            .collect();
        let mut notes = self.notes.clone();
        notes.push(FETCH_LAT_NOTE.to_owned());
        root_json(&self.settings, None, &notes, jobs)
    }
}

/// How the fetch job's read latency is measured, on both sides.
pub const FETCH_READ_LAT_NOTE: &str = "ringlog read latency = one PartitionStore::read(offset, \
     max_bytes) call (I/O, batch verification, copy out); fio read latency = one bs-sized \
     O_DIRECT read at iodepth=1 (lat_ns: submit to completion)";

/// One A/B repetition of the fetch job.
#[derive(Debug, Clone)]
pub struct FetchRep {
    pub ringlog: FetchResult,
    pub fio: Option<FioFetchResult>,
}

/// Everything the fetch job's report prints.
#[derive(Debug, Clone)]
pub struct FetchReport {
    pub settings: Vec<(&'static str, String)>,
    pub fio_version: Option<String>,
    pub notes: Vec<String>,
    pub reps: Vec<FetchRep>,
}

/// Median/min/max over reps of ringlog/fio read throughput and p99 read
/// latency.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FetchRatios {
    pub throughput: Spread,
    pub p99_read_latency: Spread,
}

impl FetchReport {
    /// `None` unless every rep has a fio run.
    pub fn ratios(&self) -> Option<FetchRatios> {
        let mut throughput = Vec::with_capacity(self.reps.len());
        let mut p99 = Vec::with_capacity(self.reps.len());
        for rep in &self.reps {
            let fio = &rep.fio.as_ref()?.read;
            let ours = &rep.ringlog.summary;
            throughput.push(ratio(ours.bw_bytes, fio.bw_bytes));
            p99.push(ratio(ours.lat.p99_ns() as f64, fio.lat.p99_ns() as f64));
        }
        Some(FetchRatios {
            throughput: Spread::of(&throughput)?,
            p99_read_latency: Spread::of(&p99)?,
        })
    }

    pub fn text(&self) -> String {
        let mut out = String::new();
        header(
            &mut out,
            "fetch",
            &self.settings,
            self.fio_version.as_deref(),
            &self.notes,
        );
        let n = self.reps.len();
        for (i, rep) in self.reps.iter().enumerate() {
            let _ = writeln!(out);
            if n > 1 {
                let _ = writeln!(out, "rep {}/{n}", i + 1);
            }
            let r = &rep.ringlog;
            run_line(&mut out, "ringlog fetch", &r.summary);
            let _ = writeln!(
                out,
                "    reads/s={:.1}, records/s={:.0}: {} records in {} reads of {} on average",
                r.summary.iops,
                per_sec(r.records, &r.summary),
                r.records,
                r.summary.ios,
                Bytes(batch_bytes(&r.summary))
            );
            lat_lines(&mut out, "read lat", &r.summary.lat);
            if let Some(f) = &rep.fio {
                run_line(&mut out, "fio fetch", &f.read);
                lat_lines(
                    &mut out,
                    &format!("read lat ({})", f.lat_field),
                    &f.read.lat,
                );
                let _ = writeln!(out, "    command: {}", f.command);
            }
        }
        if let Some(r) = self.ratios() {
            let _ = writeln!(out);
            ratio_line(&mut out, "throughput", &r.throughput);
            ratio_line(&mut out, "p99 read latency", &r.p99_read_latency);
            let _ = writeln!(out, "note: {FETCH_READ_LAT_NOTE}");
        }
        out
    }

    /// fio-style JSON: per job a `read` section (`io_bytes`, `bw_bytes`,
    /// `iops`, `runtime`, `total_ios`, `lat_ns`), plus `ratios`.
    pub fn json(&self) -> Value {
        let mut jobs = Vec::new();
        for (i, rep) in self.reps.iter().enumerate() {
            let r = &rep.ringlog;
            jobs.push(with_cpu(
                json!({
                    "jobname": "fetch",
                    "engine": "ringlog",
                    "rep": i + 1,
                    "error": 0,
                    "records": r.records,
                    "records_per_sec": per_sec(r.records, &r.summary),
                    "empty_reads": r.empty_reads,
                    "read": write_json(&r.summary),
                }),
                &r.summary,
            ));
            if let Some(f) = &rep.fio {
                jobs.push(with_cpu(
                    json!({
                        "jobname": "fetch",
                        "engine": "fio",
                        "rep": i + 1,
                        "error": 0,
                        "command": f.command,
                        "lat_field": f.lat_field,
                        "read": write_json(&f.read),
                    }),
                    &f.read,
                ));
            }
        }
        let mut root = root_json(
            &self.settings,
            self.fio_version.as_deref(),
            &self.notes,
            jobs,
        );
        if let Some(r) = self.ratios() {
            root["ratios"] = json!({
                "throughput": spread_json(&r.throughput),
                "p99_read_latency": spread_json(&r.p99_read_latency),
                "notes": [FETCH_READ_LAT_NOTE],
            });
        }
        root
    }
}

/// What every job's report offers: text, fio-style JSON, and the runs to
/// plot (label and summary).
pub trait JobReport {
    fn text(&self) -> String;
    fn json(&self) -> Value;
    fn series(&self) -> Vec<(String, &RunSummary)>;
}

fn rep_label(name: &str, i: usize, n: usize) -> String {
    if n > 1 {
        format!("{name} rep {}", i + 1)
    } else {
        name.to_owned()
    }
}

impl JobReport for Report {
    fn text(&self) -> String {
        Report::text(self)
    }
    fn json(&self) -> Value {
        Report::json(self)
    }
    fn series(&self) -> Vec<(String, &RunSummary)> {
        let n = self.reps.len();
        let mut out = Vec::new();
        for (i, rep) in self.reps.iter().enumerate() {
            out.push((rep_label("ringlog append", i, n), &rep.ringlog.summary));
            if let Some(f) = &rep.fio {
                out.push((rep_label("fio append", i, n), &f.write));
            }
        }
        out
    }
}

impl JobReport for TransferReport {
    fn text(&self) -> String {
        TransferReport::text(self)
    }
    fn json(&self) -> Value {
        TransferReport::json(self)
    }
    fn series(&self) -> Vec<(String, &RunSummary)> {
        let n = self.reps.len();
        let mut out = Vec::new();
        for (i, rep) in self.reps.iter().enumerate() {
            out.push((rep_label("ringlog transfer", i, n), &rep.ringlog.summary));
            if let Some(f) = &rep.fio {
                out.push((rep_label("fio transfer", i, n), &f.transfer));
            }
        }
        out
    }
}

impl JobReport for ProduceReport {
    fn text(&self) -> String {
        ProduceReport::text(self)
    }
    fn json(&self) -> Value {
        ProduceReport::json(self)
    }
    fn series(&self) -> Vec<(String, &RunSummary)> {
        let n = self.reps.len();
        let mut out = Vec::new();
        for (i, rep) in self.reps.iter().enumerate() {
            out.push((rep_label("produce", i, n), &rep.produce.summary));
            if let Some(a) = &rep.append {
                out.push((rep_label("append", i, n), &a.summary));
            }
        }
        out
    }
}

impl JobReport for ConsumeReport {
    fn text(&self) -> String {
        ConsumeReport::text(self)
    }
    fn json(&self) -> Value {
        ConsumeReport::json(self)
    }
    fn series(&self) -> Vec<(String, &RunSummary)> {
        let n = self.reps.len();
        self.reps
            .iter()
            .enumerate()
            .map(|(i, c)| (rep_label("consume", i, n), &c.summary))
            .collect()
    }
}

impl JobReport for FetchReport {
    fn text(&self) -> String {
        FetchReport::text(self)
    }
    fn json(&self) -> Value {
        FetchReport::json(self)
    }
    fn series(&self) -> Vec<(String, &RunSummary)> {
        let n = self.reps.len();
        let mut out = Vec::new();
        for (i, rep) in self.reps.iter().enumerate() {
            out.push((rep_label("ringlog fetch", i, n), &rep.ringlog.summary));
            if let Some(f) = &rep.fio {
                out.push((rep_label("fio fetch", i, n), &f.read));
            }
        }
        out
    }
}

/// Adds fio's job-level `usr_cpu`, `sys_cpu` (percent of one core over the
/// timed region) and `ctx` to a job object, when the run measured them.
fn with_cpu(mut job: Value, run: &RunSummary) -> Value {
    if let Some(cpu) = run.cpu {
        job["usr_cpu"] = Value::from(cpu.usr_pct);
        job["sys_cpu"] = Value::from(cpu.sys_pct);
        job["ctx"] = Value::from(cpu.ctx);
        if let Some(ms) = run.cpu_ms_per_mib() {
            job["cpu_ms_per_mib"] = Value::from(ms);
        }
    }
    job
}

/// The text report's first lines: job and settings, fio version, notes.
fn header(
    out: &mut String,
    job: &str,
    settings: &[(&'static str, String)],
    fio_version: Option<&str>,
    notes: &[String],
) {
    let settings: Vec<String> = settings.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let _ = writeln!(out, "ringlog-bench {job}: {}", settings.join(" "));
    if let Some(v) = fio_version {
        let _ = writeln!(out, "fio: {v}");
    }
    for note in notes {
        let _ = writeln!(out, "note: {note}");
    }
}

/// The JSON report's root, without ratios.
fn root_json(
    settings: &[(&'static str, String)],
    fio_version: Option<&str>,
    notes: &[String],
    jobs: Vec<Value>,
) -> Value {
    let settings: Map<String, Value> = settings
        .iter()
        .map(|(k, v)| ((*k).to_owned(), Value::from(v.as_str())))
        .collect();
    let mut root = json!({
        "ringlog-bench version": env!("CARGO_PKG_VERSION"),
        "global options": settings,
        "notes": notes,
        "jobs": jobs,
    });
    if let Some(v) = fio_version {
        root["fio version"] = Value::from(v);
    }
    root
}

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

fn lat_lines(out: &mut String, name: &str, lat: &LatencySummary) {
    let _ = writeln!(
        out,
        "    {name} (usec): min={:.1}, avg={:.1}, max={:.1}, samples={}",
        us(lat.min_ns),
        lat.mean_ns / 1000.0,
        us(lat.max_ns),
        lat.samples
    );
    let pcts: Vec<String> = PERCENTILES
        .iter()
        .zip(lat.percentiles_ns)
        .map(|((p, _), v)| format!("{p}={:.1}", us(v)))
        .collect();
    let _ = writeln!(out, "    {name} percentiles (usec): {}", pcts.join(", "));
}

fn ratio_line(out: &mut String, what: &str, s: &Spread) {
    pair_ratio_line(out, what, "ringlog/fio", s);
}

/// `ratio <what> <pair> = x (median of n reps, min a, max b)`.
fn pair_ratio_line(out: &mut String, what: &str, pair: &str, s: &Spread) {
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
/// tests: `jobs[].jobname`, a `write`, `read` or `transfer` section with
/// `io_bytes`, `bw_bytes`, `iops`, `runtime`, `total_ios` and `lat_ns`
/// (`min`, `max`, `mean`, `N`, `percentile` with fio's keys), job-level
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
        let lat = &d["lat_ns"];
        for key in ["min", "max", "mean", "N"] {
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

    fn report(with_fio: bool) -> Report {
        let fio = parse_append(include_str!("testdata/fio-3.33-append-64k.json")).unwrap();
        Report {
            settings: vec![("batch_size", "64KiB".into())],
            fio_version: with_fio.then(|| fio.version.clone()),
            notes: vec![],
            reps: (1..=3)
                .map(|k| Rep {
                    ringlog: ringlog_run(k, 1000),
                    fio: with_fio.then(|| fio.clone()),
                })
                .collect(),
        }
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
            rep.ringlog.summary.cpu = Some(cpu(50.0));
            if let Some(f) = &mut rep.fio {
                f.write.cpu = Some(cpu(10.0));
            }
        }
        let spread = r.ratios().unwrap().cpu_per_mib.unwrap();
        let ours = r.reps[1].ringlog.summary.cpu_ms_per_mib().unwrap();
        let fio = r.reps[1]
            .fio
            .as_ref()
            .unwrap()
            .write
            .cpu_ms_per_mib()
            .unwrap();
        assert!((spread.median - ours / fio).abs() < 1e-9);
        let text = r.text();
        assert!(text.contains("ratio cpu per MiB ringlog/fio = "), "{text}");
        assert!(text.contains(" ms cpu per MiB"), "{text}");
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
        assert!((r.p99_ack_latency.median - 1_000_000.0 / fio_p99).abs() < 0.001);
        assert!(report(false).ratios().is_none());
    }

    #[test]
    fn text_has_summary_and_ratio_lines() {
        let text = report(true).text();
        assert!(text.contains("ringlog append: bw="), "{text}");
        assert!(
            text.contains("fio append: bw=106.5 MiB/s, iops=1703.8"),
            "{text}"
        );
        assert!(text.contains("ratio throughput ringlog/fio = "), "{text}");
        assert!(text.contains("(median of 3 reps, min "), "{text}");
        assert!(
            text.contains("ratio p99 ack latency ringlog/fio = "),
            "{text}"
        );
        assert!(text.contains("99.99="), "{text}");
        assert!(!report(false).text().contains("ratio"));
    }

    #[test]
    fn json_uses_fio_field_names() {
        let v = report(true).json();
        let job = &v["jobs"][0];
        assert_eq!(job["jobname"], "append");
        assert_eq!(job["write"]["bw_bytes"], 64u64 << 20);
        assert!(job["write"]["iops"].as_f64().is_some());
        for key in [
            "50.000000",
            "90.000000",
            "99.000000",
            "99.900000",
            "99.990000",
        ] {
            assert!(job["write"]["lat_ns"]["percentile"][key].is_u64(), "{key}");
        }
        for key in ["min", "max", "mean"] {
            assert!(job["write"]["lat_ns"][key].is_number(), "{key}");
        }
        assert_fio_shape(&v, false, &["throughput", "p99_ack_latency"]);
        assert_eq!(v["jobs"][1]["engine"], "fio");
        assert_eq!(v["jobs"][1]["write"]["bw_bytes"], 111_662_003u64);
        assert_eq!(v["ratios"]["throughput"]["reps"], 3);
        assert!(report(false).json().get("ratios").is_none());
    }

    fn produce_report(with_append: bool) -> ProduceReport {
        ProduceReport {
            settings: vec![("connections", "2".into())],
            notes: vec![],
            reps: (1..=3)
                .map(|k| {
                    let a = ringlog_run(k + 1, 1000);
                    ProduceRep {
                        produce: ProduceResult {
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
                        append: with_append.then_some(a),
                    }
                })
                .collect(),
        }
    }

    #[test]
    fn produce_ratios_and_lines() {
        let r = produce_report(true).ratios().unwrap();
        // produce k, append k+1: ratios 1/2, 2/3, 3/4.
        assert!((r.throughput.median - 2.0 / 3.0).abs() < 1e-9);
        assert!((r.throughput.min - 0.5).abs() < 1e-9);
        assert!((r.throughput.max - 0.75).abs() < 1e-9);
        assert!((r.p99_ack_latency.median - 2.0).abs() < 0.01);
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
        let plain = produce_report(false);
        assert!(plain.ratios().is_none());
        assert!(!plain.text().contains("ratio"));
        assert!(plain.json().get("ratios").is_none());
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
        }
    }

    fn transfer_report(with_fio: bool) -> TransferReport {
        let fio = parse_transfer(include_str!("testdata/fio-3.33-transfer-1m-qd4.json")).unwrap();
        TransferReport {
            settings: vec![("size", "64MiB".into())],
            fio_version: with_fio.then(|| fio.version.clone()),
            notes: vec!["a note".into()],
            reps: (1..=3)
                .map(|k| TransferRep {
                    ringlog: transfer_run(k),
                    fio: with_fio.then(|| fio.clone()),
                })
                .collect(),
        }
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
        assert!((r.p99_chunk_latency.median - 4_000_000.0 / fio_p99).abs() < 0.001);
        assert!(transfer_report(false).ratios().is_none());
    }

    #[test]
    fn transfer_text_has_summary_phase_and_ratio_lines() {
        let text = transfer_report(true).text();
        assert!(
            text.starts_with("ringlog-bench transfer: size=64MiB\n"),
            "{text}"
        );
        assert!(text.contains("note: a note"), "{text}");
        assert!(text.contains("ringlog transfer: bw="), "{text}");
        assert!(
            text.contains("2 artifacts in 64 chunks; open 1.0 ms"),
            "{text}"
        );
        assert!(
            text.contains("chunk lat (read+write) percentiles (usec)"),
            "{text}"
        );
        assert!(text.contains("fio transfer: bw=163.3 MiB/s"), "{text}");
        assert!(text.contains("    fio read: bw="), "{text}");
        assert!(text.contains("    fio write+end_fsync: bw="), "{text}");
        assert!(text.contains("ratio throughput ringlog/fio = "), "{text}");
        assert!(
            text.contains("ratio p99 chunk latency ringlog/fio = "),
            "{text}"
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
