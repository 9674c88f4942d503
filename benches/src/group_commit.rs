//! `ringlog-bench group-commit`: small batches from N producers spread
//! over N partitions against the same N producers into one partition, on
//! one started server, with what group commit did: batches per fdatasync
//! (the server's counters) and device flushes per second (the disk's).
//! Issue 12 item 4's target is spread/one >= 0.9.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ringlog_protocol::HEADER_LEN;
use serde_json::{json, Value};

use crate::harness::{self, Header, Job, RepNo};
use crate::jobs::append::RECORD_OVERHEAD_BYTES;
use crate::jobs::produce::{self, ProduceConfig, ProduceResult};
use crate::report::{Comparison, Measured, Report};
use crate::server_bench::{common_notes, common_settings, produce_config, workspace, Target};
use crate::size::Secs;
use crate::stats::RunSummary;
use crate::{BenchError, GroupCommitArgs};

/// How long one control request for the server's metrics may take.
const METRICS_TIMEOUT: Duration = Duration::from_secs(10);

/// The un-timed warm-up before each run stops after this long at most (it
/// stops after one batch per partition first).
const WARMUP_TIME_MAX: Duration = Duration::from_secs(120);

pub const SPREAD_VS_ONE: Comparison = Comparison {
    pair: "spread/one",
    latency: "ack",
    cpu: false,
    notes: &[
        "spread = N producers into N partitions (one each); one = the same N producers into one \
         partition; target (issue 12 item 4): throughput spread/one >= 0.9",
        "batches per fdatasync = batches appended / fdatasyncs the server issued in the run \
         (ringlog_appends_total, ringlog_fsyncs_total: journal, direct and checkpoint syncs)",
        "device flushes/s = flush requests the data directory's disk completed \
         (/proc/diskstats), the whole disk's: other processes' syncs count too",
    ],
};

/// One side's run: the produce run and the counters around it.
#[derive(Debug, Clone)]
pub struct GroupCommitRun {
    pub produce: ProduceResult,
    pub partitions: u32,
    /// Batches the server appended during the run (all shards).
    pub appends: u64,
    /// fdatasyncs the server issued during the run (all shards).
    pub fsyncs: u64,
    /// Flushes the data directory's disk completed, if the kernel says.
    pub device_flushes: Option<u64>,
}

impl GroupCommitRun {
    pub fn batches_per_fsync(&self) -> f64 {
        ratio(self.appends, self.fsyncs)
    }

    fn per_sec(&self, n: u64) -> f64 {
        let secs = self.produce.summary.runtime.as_secs_f64();
        if secs > 0.0 {
            n as f64 / secs
        } else {
            f64::NAN
        }
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b > 0 {
        a as f64 / b as f64
    } else {
        f64::NAN
    }
}

impl Measured for GroupCommitRun {
    const JOBNAME: &'static str = "group-commit";
    const SECTION: &'static str = "write";
    const ENGINE: &'static str = "ringlog-server";
    fn summary(&self) -> Option<&RunSummary> {
        Some(&self.produce.summary)
    }
    fn details(&self, out: &mut String) {
        self.produce.details(out);
        let device = self
            .device_flushes
            .map_or("unknown".to_owned(), |n| format!("{:.0}", self.per_sec(n)));
        let _ = writeln!(
            out,
            "    group commit: {} partitions, {:.1} batches per fdatasync, {:.0} fdatasyncs/s, \
             device flushes/s={device}",
            self.partitions,
            self.batches_per_fsync(),
            self.per_sec(self.fsyncs),
        );
    }
    fn fields(&self) -> Value {
        let mut v = self.produce.fields();
        v["partitions"] = json!(self.partitions);
        v["appends"] = json!(self.appends);
        v["fsyncs"] = json!(self.fsyncs);
        v["batches_per_fsync"] = json!(self.batches_per_fsync());
        v["device_flushes"] = json!(self.device_flushes);
        v
    }
}

/// The encoded size of a batch of `records` records of `record_size`.
pub fn batch_size_of(records: u32, record_size: usize) -> usize {
    HEADER_LEN + records as usize * (record_size + RECORD_OVERHEAD_BYTES)
}

/// Runs the job and cleans up; the report is not printed.
pub(crate) fn group_commit_report(
    args: &GroupCommitArgs,
) -> Result<Report<GroupCommitRun, GroupCommitRun>, BenchError> {
    let a = &args.common;
    if a.addr.is_some() || a.partitions.is_some() {
        return Err(BenchError::Usage(
            "group-commit starts its own server (no --addr) and sets the partitions itself \
             (--connections, then 1; no --partitions)"
                .into(),
        ));
    }
    let mut cfg = produce_config(a, args.duration, None, 1)?;
    cfg.batch_size = batch_size_of(args.records, cfg.record_size);
    let ws = workspace(a, None)?;
    let job = GroupCommitJob {
        args,
        cfg,
        target: None,
    };
    harness::run(job, ws, a.rep.reps, true)
}

struct GroupCommitJob<'a> {
    args: &'a GroupCommitArgs,
    cfg: ProduceConfig,
    /// Set by `start`.
    target: Option<Target>,
}

impl GroupCommitJob<'_> {
    /// One run into a new topic of `partitions` partitions.
    fn run(&self, rep: RepNo, partitions: u32, side: &str) -> Result<GroupCommitRun, BenchError> {
        let target = self.target.as_ref().expect("start sets the target");
        let control = target
            .control_socket()
            .expect("group-commit starts its server");
        let topic = format!("{}-{}-{side}", self.args.common.topic, rep.n);
        produce::create_topic(&target.addr, &topic, partitions)?;
        // Un-timed: every partition's first append provisions its segment.
        produce::run(&ProduceConfig {
            topic: topic.clone(),
            partitions,
            duration: WARMUP_TIME_MAX,
            total_bytes: Some(u64::from(partitions) * self.cfg.batch_size as u64),
            ..self.cfg.clone()
        })?;
        let disk = DiskFlushes::of(&self.args.common.data.dir);
        let (before, flushes_before) = (ServerCounters::read(&control)?, disk.read());
        let produced = produce::run(&ProduceConfig {
            topic: topic.clone(),
            partitions,
            ..self.cfg.clone()
        });
        let (after, flushes_after) = (ServerCounters::read(&control)?, disk.read());
        if !self.args.common.data.keep {
            produce::delete_topic(&target.addr, &topic)?;
        }
        Ok(GroupCommitRun {
            produce: produced?,
            partitions,
            appends: after.appends.saturating_sub(before.appends),
            fsyncs: after.fsyncs.saturating_sub(before.fsyncs),
            device_flushes: flushes_before
                .zip(flushes_after)
                .map(|(b, a)| a.saturating_sub(b)),
        })
    }
}

impl Job for GroupCommitJob<'_> {
    type Ours = GroupCommitRun;
    type Theirs = GroupCommitRun;
    const NAME: &'static str = "group-commit";
    const LABELS: [&'static str; 2] = ["spread", "one"];
    const COMPARISON: Option<Comparison> = Some(SPREAD_VS_ONE);

    fn planned(&self) -> Option<Duration> {
        Some(self.cfg.duration)
    }

    fn start(&mut self) -> Result<(), BenchError> {
        let a = &self.args.common;
        let sets: Vec<String> = self
            .args
            .group_commit
            .iter()
            .map(|m| format!("group_commit={m}"))
            .chain(self.args.sets.iter().cloned())
            .collect();
        let target = Target::new(a, &a.server_dir(), &sets)?;
        self.cfg.addr = target.addr.clone();
        self.target = Some(target);
        Ok(())
    }

    fn ours(&mut self, rep: RepNo) -> Result<GroupCommitRun, BenchError> {
        self.run(rep, self.cfg.connections, "spread")
    }

    fn theirs(&mut self, rep: RepNo, _: &GroupCommitRun) -> Result<GroupCommitRun, BenchError> {
        self.run(rep, 1, "one")
    }

    fn stop(&mut self) -> Result<(), BenchError> {
        self.target.take().map_or(Ok(()), Target::stop)
    }

    fn header(&self) -> Header {
        let (args, a) = (self.args, &self.args.common);
        let mut settings: Vec<_> = common_settings(a)
            .into_iter()
            .filter(|(k, _)| !["partitions", "connections", "batch_size"].contains(k))
            .collect();
        settings.extend([
            ("producers", a.connections.to_string()),
            ("records", args.records.to_string()),
            ("batch_bytes", self.cfg.batch_size.to_string()),
            (
                "group_commit",
                args.group_commit
                    .clone()
                    .unwrap_or_else(|| "default".into()),
            ),
            ("duration", Secs(args.duration).to_string()),
            ("reps", a.rep.reps.to_string()),
        ]);
        if !args.sets.is_empty() {
            settings.push(("set", args.sets.join(",")));
        }
        let mut notes = common_notes(a);
        notes.push(format!(
            "each producer is one thread with one blocking client and one request in flight; \
             each run produces into a new topic {}-<rep>-spread ({} partitions) or \
             {}-<rep>-one (1 partition), created before and deleted after it",
            a.topic, a.connections, a.topic
        ));
        notes.push(
            "before each timed run, an un-timed warm-up of about one batch per partition \
             (a new partition's first append provisions its segment file on the shard thread)"
                .to_owned(),
        );
        Header {
            settings,
            fio_version: None,
            notes,
        }
    }
}

/// The server's counters the job reads, summed over shards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ServerCounters {
    appends: u64,
    fsyncs: u64,
}

impl ServerCounters {
    fn read(control: &Path) -> Result<ServerCounters, BenchError> {
        let reply = ringlog_shard::control::client::request(
            control,
            &json!({"cmd": "metrics"}),
            METRICS_TIMEOUT,
        )
        .map_err(|e| BenchError::Metrics(e.to_string()))?;
        let text = reply["result"]["text"]
            .as_str()
            .ok_or_else(|| BenchError::Metrics(format!("no metrics text in {reply}")))?;
        Ok(ServerCounters {
            appends: counter_sum(text, "ringlog_appends_total")?,
            fsyncs: counter_sum(text, "ringlog_fsyncs_total")?,
        })
    }
}

/// The sum of counter `name` over its labelled series in Prometheus text.
pub(crate) fn counter_sum(text: &str, name: &str) -> Result<u64, BenchError> {
    let mut sum = 0u64;
    let mut found = false;
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        if !(rest.starts_with('{') || rest.starts_with(' ')) {
            continue;
        }
        let value = rest.rsplit(' ').next().unwrap_or("");
        let n: f64 = value
            .parse()
            .map_err(|_| BenchError::Metrics(format!("{name}: bad value in {line:?}")))?;
        sum += n as u64;
        found = true;
    }
    if !found {
        return Err(BenchError::Metrics(format!("no {name} in the metrics")));
    }
    Ok(sum)
}

/// The disk holding a directory, as /proc/diskstats names it.
struct DiskFlushes {
    /// `major minor`, or None when the device is unknown.
    dev: Option<(u64, u64)>,
}

impl DiskFlushes {
    fn of(dir: &Path) -> DiskFlushes {
        use std::os::unix::fs::MetadataExt;
        let dev = fs::metadata(dir).ok().map(|m| {
            let d = m.dev();
            // glibc's gnu_dev_major / gnu_dev_minor.
            let major = ((d >> 8) & 0xfff) | ((d >> 32) & !0xfff);
            let minor = (d & 0xff) | ((d >> 12) & !0xff);
            (major, minor)
        });
        DiskFlushes { dev }
    }

    /// Flushes completed so far, if the kernel reports them for the disk.
    fn read(&self) -> Option<u64> {
        let dev = self.dev?;
        let stats = fs::read_to_string(PathBuf::from("/proc/diskstats")).ok()?;
        flushes_completed(&stats, dev)
    }
}

/// The 16th statistic of the disk's /proc/diskstats line (after major,
/// minor and name): flush requests completed (kernels 5.5 and later).
fn flushes_completed(stats: &str, (major, minor): (u64, u64)) -> Option<u64> {
    stats.lines().find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        let ours =
            f.first()?.parse::<u64>().ok()? == major && f.get(1)?.parse::<u64>().ok()? == minor;
        if !ours {
            return None;
        }
        f.get(18)?.parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{assert_has, data_dir};
    use crate::{Cli, Command};
    use clap::Parser;

    fn group_commit(line: &str) -> GroupCommitArgs {
        let argv = std::iter::once("ringlog-bench").chain(line.split_whitespace());
        match Cli::try_parse_from(argv).unwrap().command {
            Some(Command::GroupCommit(a)) => a,
            other => panic!("not group-commit: {other:?}"),
        }
    }

    #[test]
    fn counters_sum_over_shards_and_a_missing_one_is_an_error() {
        let text = "# HELP ringlog_appends Batches appended\n\
                    ringlog_appends_total{shard=\"0\"} 12\n\
                    ringlog_appends_total{shard=\"1\"} 30\n\
                    ringlog_append_bytes_total{shard=\"0\"} 999\n";
        assert_eq!(counter_sum(text, "ringlog_appends_total").unwrap(), 42);
        assert!(matches!(
            counter_sum(text, "ringlog_fsyncs_total"),
            Err(BenchError::Metrics(_))
        ));
        let bad = "ringlog_fsyncs_total{shard=\"0\"} many\n";
        assert!(counter_sum(bad, "ringlog_fsyncs_total").is_err());
    }

    #[test]
    fn device_flushes_come_from_the_disks_diskstats_line() {
        let stats = " 254       0 vda 1 2 3 4 5 6 7 8 0 9 10 11 12 13 14 200471 18211\n \
                     254       1 vda1 1 2 3 4 5 6 7 8 0 9 10 11 12 13 14 77 1\n   \
                     7       0 loop0 1 2 3 4 5 6 7 8 0 9 10\n";
        assert_eq!(flushes_completed(stats, (254, 0)), Some(200471));
        assert_eq!(flushes_completed(stats, (254, 1)), Some(77));
        assert_eq!(
            flushes_completed(stats, (7, 0)),
            None,
            "an old kernel's line"
        );
        assert_eq!(flushes_completed(stats, (8, 0)), None);
    }

    #[test]
    fn batches_are_sized_by_their_records() {
        let one = batch_size_of(1, 1024);
        assert_eq!(one, HEADER_LEN + 1024 + RECORD_OVERHEAD_BYTES);
        let (bytes, records) = crate::jobs::append::build_batch(0, one, 1024, 0).unwrap();
        assert_eq!((bytes.len(), records), (one, 1));
        let ten = batch_size_of(10, 100);
        let (_, records) = crate::jobs::append::build_batch(0, ten, 100, 0).unwrap();
        assert_eq!(records, 10);
    }

    #[test]
    fn it_refuses_addr_and_partitions() {
        for bad in ["--addr 127.0.0.1:1", "--partitions 3"] {
            let (_tmp, dir) = data_dir();
            let a = group_commit(&format!("group-commit --dir {} {bad}", dir.display()));
            assert!(matches!(group_commit_report(&a), Err(BenchError::Usage(_))));
            assert!(!dir.exists());
        }
    }

    /// The CI smoke of the job: 4 producers, 1-record batches, both sides,
    /// both group commit modes, against a started server.
    #[test]
    fn group_commit_smoke() {
        for mode in ["journal", "partition"] {
            let (_tmp, dir) = data_dir();
            let args = group_commit(&format!(
                "group-commit --dir {} --shards 1 --connections 4 --records 1 --segment-size 1m \
                 --duration 1 --reps 1 --group-commit {mode}",
                dir.display()
            ));
            let report = group_commit_report(&args).unwrap_or_else(|e| panic!("{e}"));
            assert!(!dir.exists(), "data dir is removed without --keep");
            let rep = &report.reps[0];
            let one = rep.theirs.as_ref().expect("the one-partition side ran");
            for (run, partitions) in [(&rep.ours, 4), (one, 1)] {
                assert_eq!(run.partitions, partitions);
                assert!(run.produce.summary.ios > 0);
                assert_eq!(run.produce.records_per_batch, 1);
                // Every acknowledged batch was appended in the run, and
                // acknowledged only after an fdatasync (maintenance may
                // add some: frontier records of idle partitions).
                assert!(run.appends >= run.produce.summary.ios, "{run:?}");
                assert!(run.fsyncs > 0, "{run:?}");
                assert!(run.batches_per_fsync().is_finite(), "{run:?}");
            }
            assert_has(
                &report.text(),
                &[
                    "ringlog-bench group-commit: dir=",
                    "producers=4 records=1",
                    &format!("group_commit={mode}"),
                    "spread: bw=",
                    "one: bw=",
                    "group commit: 4 partitions, ",
                    "group commit: 1 partitions, ",
                    "batches per fdatasync",
                    "device flushes/s=",
                    "ratio throughput spread/one = ",
                ],
            );
            let v = report.json();
            assert_eq!(v["jobs"][0]["jobname"], "group-commit");
            assert!(v["jobs"][0]["fsyncs"].as_u64().unwrap() > 0);
        }
    }
}
