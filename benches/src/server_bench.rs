//! `ringlog-bench produce` and `ringlog-bench consume`: setup, reps and
//! cleanup around the client jobs, and the server they run against.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::jobs::append::{self, AppendConfig};
use crate::jobs::consume::{self, ConsumeConfig};
use crate::jobs::partitions::{self, PartitionsConfig, PartitionsReport, Targets};
use crate::jobs::produce::{self, ProduceConfig};
use crate::jobs::server::{self, ServerProcess};
use crate::report::{ConsumeReport, ProduceRep, ProduceReport};
use crate::size::Bytes;
use crate::{
    fs_err, remove_dir_if_exists, to_usize, BenchError, ConsumeArgs, PartitionsArgs, ProduceArgs,
    ServerClientArgs,
};

/// How long the un-timed fill before a consume run may take at most.
const FILL_TIME_MAX: Duration = Duration::from_secs(24 * 3600);

/// The server a run talks to: one at `--addr`, or one started here.
struct Target {
    addr: String,
    started: Option<ServerProcess>,
}

impl Target {
    /// Stops a started server (SIGTERM, exit status checked).
    fn stop(self) -> Result<(), BenchError> {
        match self.started {
            Some(s) => Ok(s.stop()?),
            None => Ok(()),
        }
    }
}

fn check_common(a: &ServerClientArgs) -> Result<(), BenchError> {
    if a.segment_size < a.batch_size {
        return Err(BenchError::Usage(format!(
            "--segment-size {} is smaller than --batch-size {}",
            Bytes(a.segment_size),
            Bytes(a.batch_size)
        )));
    }
    if a.segment_size & 4095 != 0 {
        return Err(BenchError::Usage(format!(
            "--segment-size {} must be a multiple of 4KiB",
            Bytes(a.segment_size)
        )));
    }
    if a.topic.is_empty()
        || a.topic.len() > 190
        || !a
            .topic
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
    {
        return Err(BenchError::Usage(format!(
            "--topic {:?}: use 1-190 of [A-Za-z0-9._-]",
            a.topic
        )));
    }
    if a.addr.is_none() && a.server_dir().exists() {
        return Err(BenchError::Usage(format!(
            "{} already exists (left by an earlier --keep run?); remove it or pick another --dir",
            a.server_dir().display()
        )));
    }
    Ok(())
}

/// Connects to `--addr` or starts a server in `--dir`/server.
fn target(a: &ServerClientArgs) -> Result<Target, BenchError> {
    if let Some(addr) = &a.addr {
        return Ok(Target {
            addr: addr.clone(),
            started: None,
        });
    }
    let bin = server::locate_binary(a.server_bin.as_deref())?;
    eprintln!(
        "ringlog-bench: starting {} server --shards {} in {}",
        bin.display(),
        a.shards,
        a.server_dir().display()
    );
    // The append job's store settings: same segment size and write buffer.
    let store = append::store_config_for(to_usize("--batch-size", a.batch_size)?, a.segment_size);
    let extra = vec![
        "--segment-size-bytes".to_owned(),
        a.segment_size.to_string(),
        "--set".to_owned(),
        format!("write_buffer_bytes={}", store.write_buffer_bytes),
    ];
    let s = ServerProcess::start(&bin, &a.server_dir(), a.shards, &extra)?;
    eprintln!("ringlog-bench: server ready at {}", s.addr);
    Ok(Target {
        addr: s.addr.clone(),
        started: Some(s),
    })
}

/// Settings both jobs print.
fn common_settings(a: &ServerClientArgs) -> Vec<(&'static str, String)> {
    let mut settings = Vec::new();
    match &a.addr {
        Some(addr) => settings.push(("addr", addr.clone())),
        None => {
            settings.push(("dir", a.dir.display().to_string()));
            settings.push(("shards", a.shards.to_string()));
            settings.push(("segment_size", Bytes(a.segment_size).to_string()));
        }
    }
    settings.extend([
        ("topic", a.topic.clone()),
        ("partitions", a.partitions().to_string()),
        ("connections", a.connections.to_string()),
        ("batch_size", Bytes(a.batch_size).to_string()),
        ("record_size", Bytes(a.record_size).to_string()),
    ]);
    settings
}

fn common_notes(a: &ServerClientArgs) -> Vec<String> {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mut notes = Vec::new();
    if a.addr.is_none() {
        notes.push(format!(
            "the server was started by ringlog-bench on 127.0.0.1 (--shards {}, 0 = one per \
             core), with the append job's segment size and write buffer; it shares this \
             machine's {cores} cores with the client threads",
            a.shards
        ));
    }
    notes.push(
        "each connection is one thread with one blocking client and one request in flight"
            .to_owned(),
    );
    notes
}

/// Creates `--dir` if needed; returns whether it was created here.
fn create_dir(dir: &Path) -> Result<bool, BenchError> {
    let created = !dir.exists();
    fs::create_dir_all(dir).map_err(fs_err("create", dir))?;
    Ok(created)
}

/// Removes the started server's directory, `extra` and `--dir` itself if
/// this run created it (and it is now empty).
fn cleanup(
    a: &ServerClientArgs,
    extra: Option<&PathBuf>,
    created_dir: bool,
) -> Result<(), BenchError> {
    if a.keep {
        return Ok(());
    }
    if a.addr.is_none() {
        remove_dir_if_exists(&a.server_dir())?;
    }
    if let Some(e) = extra {
        remove_dir_if_exists(e)?;
    }
    if created_dir {
        match fs::remove_dir(&a.dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(fs_err("remove", &a.dir)(e));
            }
            _ => {}
        }
    }
    Ok(())
}

/// Runs the produce job (and the append job) and cleans up; the report is
/// not printed.
pub(crate) fn produce_report(args: &ProduceArgs) -> Result<ProduceReport, BenchError> {
    let a = &args.common;
    check_common(a)?;
    let append_dir = a.dir.join("append");
    if args.vs_append && append_dir.exists() {
        return Err(BenchError::Usage(format!(
            "{} already exists (left by an earlier --keep run?); remove it or pick another --dir",
            append_dir.display()
        )));
    }
    let cfg = ProduceConfig {
        addr: String::new(),
        topic: a.topic.clone(),
        partitions: a.partitions(),
        connections: a.connections,
        batch_size: to_usize("--batch-size", a.batch_size)?,
        record_size: to_usize("--record-size", a.record_size)?,
        duration: Duration::from_secs(args.duration),
        total_bytes: args.size,
    };
    // A batch that cannot be built is a usage error; find out before
    // starting anything.
    append::build_batch(0, cfg.batch_size, cfg.record_size, 0).map_err(produce_batch_err)?;
    let append_cfg = args.vs_append.then(|| AppendConfig {
        dir: append_dir.clone(),
        partitions: a.connections,
        batch_size: cfg.batch_size,
        record_size: cfg.record_size,
        duration: cfg.duration,
        total_bytes: args.size,
        segment_size: a.segment_size,
        retention_bytes: None,
        warmup_bytes: 0,
        ramp: Duration::ZERO,
    });

    let created_dir = create_dir(&a.dir)?;
    let result: Result<_, BenchError> = (|| {
        if let Some(c) = &append_cfg {
            fs::create_dir(&c.dir).map_err(fs_err("create", &c.dir))?;
        }
        let target = target(a)?;
        let cfg = ProduceConfig {
            addr: target.addr.clone(),
            ..cfg
        };
        let reps = produce_reps(args, &cfg, append_cfg.as_ref());
        let stopped = target.stop();
        let reps = reps?;
        stopped?;
        Ok(reps)
    })();
    let cleaned = cleanup(a, args.vs_append.then_some(&append_dir), created_dir);
    let reps = result?;
    cleaned?;

    let mut settings = common_settings(a);
    settings.push(("duration", format!("{}s", args.duration)));
    if let Some(size) = args.size {
        settings.push(("size", Bytes(size).to_string()));
    }
    settings.push(("reps", a.reps.to_string()));
    if args.vs_append {
        settings.push(("vs_append", "true".to_owned()));
    }
    let mut notes = common_notes(a);
    notes.push(format!(
        "each rep produces into a new topic {}-<rep> with {} partitions (created before and \
         deleted after the timed run{})",
        a.topic,
        a.partitions(),
        if a.keep { "; kept with --keep" } else { "" }
    ));
    if args.vs_append {
        notes.push(format!(
            "reps alternate produce, append, produce, ...; append writes {} partitions in {} \
             (new segment files, like the server's new topic)",
            a.connections,
            append_dir.display()
        ));
    }
    Ok(ProduceReport {
        settings,
        notes,
        reps,
    })
}

fn produce_batch_err(e: append::AppendError) -> BenchError {
    match e {
        e @ append::AppendError::BatchTooSmall { .. } => BenchError::Usage(e.to_string()),
        e => e.into(),
    }
}

fn produce_reps(
    args: &ProduceArgs,
    cfg: &ProduceConfig,
    append_cfg: Option<&AppendConfig>,
) -> Result<Vec<ProduceRep>, BenchError> {
    let a = &args.common;
    let mut reps = Vec::with_capacity(a.reps as usize);
    for rep in 1..=a.reps {
        let topic = format!("{}-{rep}", a.topic);
        produce::create_topic(&cfg.addr, &topic, cfg.partitions)?;
        eprintln!(
            "ringlog-bench: rep {rep}/{}: produce to {topic} at {}",
            a.reps, cfg.addr
        );
        let result = produce::run(&ProduceConfig {
            topic: topic.clone(),
            ..cfg.clone()
        });
        if !a.keep {
            produce::delete_topic(&cfg.addr, &topic)?;
        }
        let produced = result?;

        let appended = match append_cfg {
            Some(c) => {
                eprintln!("ringlog-bench: rep {rep}/{}: append", a.reps);
                let r = append::run(c)?;
                if !(a.keep && rep == a.reps) {
                    for p in 0..c.partitions {
                        remove_dir_if_exists(&c.partition_dir(p))?;
                    }
                }
                Some(r)
            }
            None => None,
        };
        reps.push(ProduceRep {
            produce: produced,
            append: appended,
        });
    }
    Ok(reps)
}

/// Fills a topic (un-timed), reads it back --reps times, cleans up; the
/// report is not printed.
pub(crate) fn consume_report(args: &ConsumeArgs) -> Result<ConsumeReport, BenchError> {
    let a = &args.common;
    check_common(a)?;
    let partitions = a.partitions();
    if a.connections > partitions {
        return Err(BenchError::Usage(format!(
            "--connections {} is more than --partitions {partitions}: each consumer reads its own \
             partitions",
            a.connections
        )));
    }
    if args.size == 0 {
        return Err(BenchError::Usage("--size must be positive".into()));
    }
    let fetch_bytes = u32::try_from(args.fetch_bytes)
        .ok()
        .filter(|b| *b > 0)
        .ok_or_else(|| {
            BenchError::Usage(format!(
                "--fetch-bytes {} must be positive and below 4GiB",
                Bytes(args.fetch_bytes)
            ))
        })?;
    let fill = ProduceConfig {
        addr: String::new(),
        topic: a.topic.clone(),
        partitions,
        connections: a.connections,
        batch_size: to_usize("--batch-size", a.batch_size)?,
        record_size: to_usize("--record-size", a.record_size)?,
        duration: FILL_TIME_MAX,
        total_bytes: Some(args.size),
    };
    append::build_batch(0, fill.batch_size, fill.record_size, 0).map_err(produce_batch_err)?;

    let created_dir = create_dir(&a.dir)?;
    let result: Result<_, BenchError> = (|| {
        let target = target(a)?;
        let fill = ProduceConfig {
            addr: target.addr.clone(),
            ..fill
        };
        let reps = consume_reps(args, &fill, fetch_bytes);
        let stopped = target.stop();
        let reps = reps?;
        stopped?;
        Ok(reps)
    })();
    let cleaned = cleanup(a, None, created_dir);
    let (filled, reps) = result?;
    cleaned?;

    let mut settings = common_settings(a);
    settings.push(("size", Bytes(args.size).to_string()));
    settings.push(("fetch_bytes", Bytes(args.fetch_bytes).to_string()));
    settings.push(("reps", a.reps.to_string()));
    let mut notes = common_notes(a);
    notes.push(format!(
        "the topic was filled un-timed with {} in {} produces ({} records, {:.1} MiB/s); \
         every rep reads all of it from offset 0, each connection its own partitions, and \
         parses and verifies every batch",
        Bytes(filled.summary.bytes),
        filled.summary.ios,
        filled.records,
        filled.summary.bw_bytes / (1024.0 * 1024.0),
    ));
    Ok(ConsumeReport {
        settings,
        notes,
        reps,
    })
}

fn consume_reps(
    args: &ConsumeArgs,
    fill: &ProduceConfig,
    fetch_bytes: u32,
) -> Result<(produce::ProduceResult, Vec<consume::ConsumeResult>), BenchError> {
    let a = &args.common;
    produce::create_topic(&fill.addr, &fill.topic, fill.partitions)?;
    eprintln!(
        "ringlog-bench: filling {} with {} (un-timed)",
        fill.topic,
        Bytes(args.size)
    );
    let result: Result<_, BenchError> = (|| {
        let filled = produce::run(fill)?;
        let cfg = ConsumeConfig {
            addr: fill.addr.clone(),
            topic: fill.topic.clone(),
            partitions: fill.partitions,
            connections: fill.connections,
            fetch_bytes,
        };
        let mut reps = Vec::with_capacity(a.reps as usize);
        for rep in 1..=a.reps {
            eprintln!("ringlog-bench: rep {rep}/{}: consume {}", a.reps, cfg.topic);
            let r = consume::run(&cfg)?;
            if r.records != filled.records || r.summary.bytes != filled.summary.bytes {
                return Err(BenchError::Mismatch(format!(
                    "read back {} records ({} bytes) of {} produced ({} bytes): is something \
                     else writing to or purging topic {}?",
                    r.records, r.summary.bytes, filled.records, filled.summary.bytes, cfg.topic
                )));
            }
            reps.push(r);
        }
        Ok((filled, reps))
    })();
    if !a.keep {
        produce::delete_topic(&fill.addr, &fill.topic)?;
    }
    result
}

/// Runs the partitions job and cleans up; fails (with the figures) if a
/// target is missed.
pub(crate) fn partitions_report(args: &PartitionsArgs) -> Result<PartitionsReport, BenchError> {
    let bin = server::locate_binary(args.server_bin.as_deref())?;
    let dir = args.dir.join("server");
    if dir.exists() {
        return Err(BenchError::Usage(format!(
            "{} already exists (left by an earlier --keep run?); remove it or pick another --dir",
            dir.display()
        )));
    }
    let created_dir = create_dir(&args.dir)?;
    let cfg = PartitionsConfig {
        bin,
        dir: dir.clone(),
        shards: args.shards,
        partitions: args.partitions,
        topic_partitions: args.topic_partitions,
        connections: args.connections,
        batch_size: to_usize("--batch-size", args.batch_size)?,
        record_size: to_usize("--record-size", args.record_size)?,
        rounds: args.rounds,
        extra: args.server_args.clone(),
        files_max: args.files_max,
    };
    eprintln!(
        "ringlog-bench: {} partitions on {} --shards {} in {}",
        args.partitions,
        cfg.bin.display(),
        args.shards,
        dir.display()
    );
    let result = partitions::run(&cfg);
    if !args.keep {
        remove_dir_if_exists(&dir)?;
        if created_dir {
            let _ = fs::remove_dir(&args.dir);
        }
    }
    let report = PartitionsReport {
        settings: vec![
            ("dir", args.dir.display().to_string()),
            ("shards", args.shards.to_string()),
            ("partitions", args.partitions.to_string()),
            ("topic_partitions", args.topic_partitions.to_string()),
            ("connections", args.connections.to_string()),
            ("batch_size", Bytes(args.batch_size).to_string()),
            ("rounds", args.rounds.to_string()),
        ],
        result: result?,
        targets: Targets {
            boot_time_max: Duration::from_millis(args.boot_ms_max),
            rss_bytes_max: args.rss_max,
            disk_bytes_max: args.disk_max,
        },
    };
    let missed = report.missed();
    if !missed.is_empty() {
        return Err(BenchError::TargetMissed {
            report: report.text(),
            missed: missed.join("; "),
        });
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    //! Smoke tests against a real `ringlog` server. They need the binary
    //! built in this target directory and profile (ci/test's `cargo test
    //! --workspace` builds it; alone: `cargo build -p ringlog` first).

    use clap::Parser;

    use super::*;
    use crate::{Cli, Command};

    fn produce_args(argv: &[&str]) -> ProduceArgs {
        let mut full = vec!["ringlog-bench", "produce"];
        full.extend_from_slice(argv);
        match Cli::try_parse_from(full).unwrap().command {
            Some(Command::Produce(a)) => a,
            _ => panic!("not produce"),
        }
    }

    fn consume_args(argv: &[&str]) -> ConsumeArgs {
        let mut full = vec!["ringlog-bench", "consume"];
        full.extend_from_slice(argv);
        match Cli::try_parse_from(full).unwrap().command {
            Some(Command::Consume(a)) => a,
            _ => panic!("not consume"),
        }
    }

    /// A data dir on the repo's filesystem (O_DIRECT; a tmpfs /tmp would
    /// not do), with a short path for the control socket.
    fn tmp() -> tempfile::TempDir {
        tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap()
    }

    #[test]
    fn produce_defaults() {
        let a = produce_args(&[]);
        assert_eq!(a.common.addr, None);
        assert_eq!(a.common.connections, 1);
        assert_eq!(a.common.partitions(), 1);
        assert_eq!(a.common.batch_size, 64 << 10);
        assert_eq!(a.common.topic, "bench");
        assert_eq!(a.duration, 10);
        assert!(!a.vs_append);
        let a = produce_args(&["--connections", "3"]);
        assert_eq!(a.common.partitions(), 3);
        assert!(Cli::try_parse_from([
            "ringlog-bench",
            "produce",
            "--addr",
            "127.0.0.1:1",
            "--server-bin",
            "x"
        ])
        .is_err());
        let c = consume_args(&["--fetch-bytes", "256k"]);
        assert_eq!(c.size, 256 << 20);
        assert_eq!(c.fetch_bytes, 256 << 10);
    }

    #[test]
    fn usage_errors_create_nothing() {
        let tmp = tmp();
        let dir = tmp.path().join("data");
        let d = dir.to_str().unwrap();
        let c = consume_args(&["--dir", d, "--connections", "3", "--partitions", "2"]);
        assert!(matches!(consume_report(&c), Err(BenchError::Usage(_))));
        let p = produce_args(&["--dir", d, "--topic", "no spaces"]);
        assert!(matches!(produce_report(&p), Err(BenchError::Usage(_))));
        let p = produce_args(&["--dir", d, "--batch-size", "1k", "--record-size", "4k"]);
        assert!(matches!(produce_report(&p), Err(BenchError::Usage(_))));
        assert!(!dir.exists());
    }

    /// Starts a server, produces 2 MiB per rep over two connections,
    /// alternating with the append job; checks the report's fields.
    #[test]
    fn produce_vs_append_smoke() {
        let tmp = tmp();
        let dir = tmp.path().join("data");
        let args = produce_args(&[
            "--dir",
            dir.to_str().unwrap(),
            "--shards",
            "2",
            "--connections",
            "2",
            "--partitions",
            "3",
            "--segment-size",
            "1m",
            "--duration",
            "5",
            "--size",
            "2m",
            "--reps",
            "2",
            "--vs-append",
        ]);
        let report = produce_report(&args).unwrap_or_else(|e| panic!("{e}"));
        assert!(!dir.exists(), "data dir is removed without --keep");
        assert_eq!(report.reps.len(), 2);
        for rep in &report.reps {
            let p = &rep.produce;
            assert_eq!(p.summary.bytes, 2 << 20);
            assert_eq!(p.summary.ios, 32);
            assert_eq!(p.records, 32 * u64::from(p.records_per_batch));
            assert_eq!(p.summary.lat.samples, 32);
            assert!(p.summary.lat.p99_ns() > 0);
            let a = rep.append.as_ref().unwrap();
            assert_eq!(a.summary.bytes, 2 << 20);
        }
        let text = report.text();
        for want in [
            "ringlog-bench produce: dir=",
            "partitions=3 connections=2 batch_size=64KiB",
            "rep 2/2",
            "produce: bw=",
            "records/s=",
            "ack lat percentiles (usec): 50=",
            "append: bw=",
            "ratio throughput produce/append = ",
            "(median of 2 reps, min ",
            "ratio p99 ack latency produce/append = ",
        ] {
            assert!(text.contains(want), "{want:?} missing from:\n{text}");
        }
        let v = report.json();
        let job = &v["jobs"][0];
        assert_eq!(job["jobname"], "produce");
        assert_eq!(job["write"]["io_bytes"], 2u64 << 20);
        assert_eq!(job["write"]["total_ios"], 32);
        assert!(job["write"]["bw_bytes"].as_u64().unwrap() > 0);
        assert!(job["records_per_sec"].as_f64().unwrap() > 0.0);
        assert!(
            job["write"]["lat_ns"]["percentile"]["99.000000"]
                .as_u64()
                .unwrap()
                > 0
        );
        assert_eq!(v["jobs"][1]["jobname"], "append");
        assert_eq!(v["ratios"]["throughput"]["reps"], 2);
        assert!(v["ratios"]["throughput"]["median"].as_f64().unwrap() > 0.0);
        assert_eq!(v["global options"]["connections"], "2");
        crate::report::assert_fio_shape(&v, true, &["throughput", "p99_ack_latency"]);
        assert!(text.contains("    cpu: usr="), "{text}");
    }

    /// Fills a topic on a started server and reads it back twice.
    #[test]
    fn consume_smoke() {
        let tmp = tmp();
        let dir = tmp.path().join("data");
        let args = consume_args(&[
            "--dir",
            dir.to_str().unwrap(),
            "--shards",
            "2",
            "--connections",
            "2",
            "--partitions",
            "3",
            "--segment-size",
            "1m",
            "--size",
            "2m",
            "--fetch-bytes",
            "256k",
            "--reps",
            "2",
            "--output-format",
            "json",
        ]);
        let report = consume_report(&args).unwrap_or_else(|e| panic!("{e}"));
        assert!(!dir.exists(), "data dir is removed without --keep");
        assert_eq!(report.reps.len(), 2);
        for c in &report.reps {
            assert_eq!(c.summary.bytes, 2 << 20);
            assert_eq!(c.batches, 32);
            assert!(c.records >= 32);
            // 256 KiB fetches return at most 256 KiB: at least 2 MiB / 256 KiB
            // of them (more where a partition's tail is a partial fetch).
            assert!(c.summary.ios >= 8, "{} fetches", c.summary.ios);
            assert_eq!(c.summary.lat.samples, c.summary.ios);
        }
        let text = report.text();
        for want in [
            "ringlog-bench consume: dir=",
            "fetch_bytes=256KiB",
            "consume: bw=",
            "records/s=",
            "in 32 batches",
            "fetch lat percentiles (usec): 50=",
        ] {
            assert!(text.contains(want), "{want:?} missing from:\n{text}");
        }
        let v = report.json();
        assert_eq!(v["jobs"][1]["jobname"], "consume");
        assert_eq!(v["jobs"][1]["read"]["io_bytes"], 2u64 << 20);
        assert!(v["jobs"][1]["read"]["lat_ns"]["percentile"]["50.000000"].is_u64());
        crate::report::assert_fio_shape(&v, true, &[]);
    }

    fn partitions_args(argv: &[&str]) -> PartitionsArgs {
        let mut full = vec!["ringlog-bench", "partitions"];
        full.extend_from_slice(argv);
        match Cli::try_parse_from(full).unwrap().command {
            Some(Command::Partitions(a)) => a,
            _ => panic!("not partitions"),
        }
    }

    /// The CI-sized partitions job: 1,000 empty partitions on two shards,
    /// restarted, then two produces to each. Targets scaled to 1,000: boot
    /// in 2 s, 256 MiB of RSS, 128 MiB of disk (issue 8 item 9: before the
    /// fix each empty partition took 256 MiB of disk and 4 MiB of memory).
    #[test]
    fn partitions_smoke() {
        let tmp = tmp();
        let dir = tmp.path().join("data");
        let args = partitions_args(&[
            "--dir",
            dir.to_str().unwrap(),
            "--shards",
            "2",
            "--partitions",
            "1000",
            "--topic-partitions",
            "500",
            "--connections",
            "4",
            "--rss-max",
            "256m",
            "--disk-max",
            "128m",
            "--output-format",
            "json",
        ]);
        let report = partitions_report(&args).unwrap_or_else(|e| panic!("{e}"));
        print!("{}", report.text());
        assert!(!dir.exists(), "data dir is removed without --keep");
        let r = &report.result;
        assert_eq!(r.produces, 2000, "every partition acknowledged twice");
        assert!(r.booted.rss_bytes > 0 && r.booted.disk_bytes > 0);
        assert!(
            r.produced.disk_bytes > r.booted.disk_bytes,
            "disk grows with data"
        );
        let v = report.json();
        assert_eq!(v["jobname"], "partitions");
        assert_eq!(v["produces"], 2000);
        assert!(v["targets_missed"].as_array().unwrap().is_empty());
        // A target missed fails the job, with the figures.
        let strict = partitions_args(&[
            "--dir",
            dir.to_str().unwrap(),
            "--partitions",
            "10",
            "--rounds",
            "1",
            "--disk-max",
            "4k",
        ]);
        match partitions_report(&strict) {
            Err(BenchError::TargetMissed { report, missed }) => {
                assert!(missed.starts_with("disk "), "{missed}");
                assert!(report.contains("boot to ready: "), "{report}");
            }
            other => panic!(
                "expected a missed target, got {:?}",
                other.map(|r| r.text())
            ),
        }
    }

    /// --addr: the job uses a server it did not start and deletes the topics
    /// it created.
    #[test]
    fn produce_against_a_running_server() {
        let tmp = tmp();
        let bin = server::locate_binary(None).unwrap_or_else(|e| panic!("{e}"));
        let srv = ServerProcess::start(&bin, &tmp.path().join("srv"), 1, &[])
            .unwrap_or_else(|e| panic!("{e}"));
        let args = produce_args(&[
            "--addr",
            &srv.addr,
            "--dir",
            tmp.path().join("unused").to_str().unwrap(),
            "--topic",
            "t.x",
            "--duration",
            "1",
            "--batch-size",
            "4k",
            "--record-size",
            "100",
        ]);
        let report = produce_report(&args).unwrap_or_else(|e| panic!("{e}"));
        let p = &report.reps[0].produce;
        assert!(p.summary.ios > 0);
        assert_eq!(p.summary.bytes, p.summary.ios * 4096);
        assert!(report.text().contains("ringlog-bench produce: addr="));
        let mut c = ringlog_shard::client::Client::connect(&srv.addr).unwrap();
        assert!(c.list_topics().unwrap().is_empty(), "topic t.x-1 deleted");
        srv.stop().unwrap();
    }
}
