//! `ringlog-bench produce`, `consume` and `partitions`: the jobs against a
//! `ringlog server`, and the server they run against.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};

use crate::fio::{self, FioFetchResult};
use crate::harness::{self, remove_if_exists, FioFile, Header, Job, RepNo, Workspace};
use crate::jobs::append::{self, AppendConfig, AppendResult};
use crate::jobs::consume::{self, ConsumeConfig, ConsumeResult};
use crate::jobs::partitions::{self, PartitionsConfig, PartitionsOutcome, Targets};
use crate::jobs::produce::{self, ProduceConfig, ProduceResult};
use crate::jobs::server::{self, ServerProcess};
use crate::report::{Comparison, Measured, Never, Report, FETCH_LAT_NOTE, PRODUCE_VS_APPEND};
use crate::size::{Bytes, Secs};
use crate::stats::RunSummary;
use crate::{
    fs_err, to_usize, BenchError, ConsumeArgs, ConsumeVs, FioLayout, PartitionsArgs, ProduceArgs,
    ServerClientArgs, STARTED,
};

/// How long the un-timed fill before a consume run may take at most.
const FILL_TIME_MAX: Duration = Duration::from_secs(24 * 3600);

/// The server a run talks to: one at `--addr`, or one started here.
pub(crate) struct Target {
    pub(crate) addr: String,
    started: Option<ServerProcess>,
}

impl Target {
    /// Connects to `--addr` or starts a server in `dir` (`--dir`/server
    /// unless a job runs two), with the config overrides `sets`
    /// (`key=value`, as `ringlog server --set` takes them).
    pub(crate) fn new(
        a: &ServerClientArgs,
        dir: &Path,
        sets: &[String],
    ) -> Result<Target, BenchError> {
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
            dir.display()
        );
        let extra = server_flags(a, sets)?;
        let s = ServerProcess::start(&bin, dir, a.shards, &extra)?;
        let pid = s.pid().map_or(String::new(), |p| format!(" (pid {p})"));
        eprintln!("ringlog-bench: server ready at {}{pid}", s.addr);
        Ok(Target {
            addr: s.addr.clone(),
            started: Some(s),
        })
    }

    /// The started server's control socket (None with `--addr`).
    pub(crate) fn control_socket(&self) -> Option<PathBuf> {
        self.started.as_ref().map(ServerProcess::control_socket)
    }

    /// Stops a started server (SIGTERM, exit status checked).
    pub(crate) fn stop(self) -> Result<(), BenchError> {
        match self.started {
            Some(s) => Ok(s.stop()?),
            None => Ok(()),
        }
    }
}

/// The flags of a started server: the append job's store settings (same
/// segment size and write buffer), then the config overrides `sets`.
pub(crate) fn server_flags(
    a: &ServerClientArgs,
    sets: &[String],
) -> Result<Vec<String>, BenchError> {
    let batch_size = to_usize("--batch-size", a.batch.batch_size)?;
    let store = append::store_config_for(batch_size, a.segment_size);
    let mut extra = vec![
        "--segment-size-bytes".to_owned(),
        a.segment_size.to_string(),
        "--set".to_owned(),
        format!("write_buffer_bytes={}", store.write_buffer_bytes),
    ];
    for set in sets {
        extra.extend(["--set".to_owned(), set.clone()]);
    }
    Ok(extra)
}

/// Checks the settings both jobs share; creates `--dir` and the workspace
/// holding the started server's directory and `extra`.
pub(crate) fn workspace(
    a: &ServerClientArgs,
    extra: Option<&std::path::Path>,
) -> Result<Workspace, BenchError> {
    crate::check_segment_size(a.segment_size, a.batch.batch_size)?;
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
    let mut paths = Vec::new();
    if a.addr.is_none() {
        paths.push(a.server_dir());
    }
    paths.extend(extra.map(|p| p.to_owned()));
    Workspace::create(&a.data.dir, a.data.keep, paths)
}

/// The produce config of `a`, its batch checked: a batch that cannot be
/// built is a usage error, found before anything starts.
pub(crate) fn produce_config(
    a: &ServerClientArgs,
    duration: Duration,
    total_bytes: Option<u64>,
    in_flight: u32,
) -> Result<ProduceConfig, BenchError> {
    let cfg = ProduceConfig {
        in_flight,
        addr: String::new(),
        topic: a.topic.clone(),
        partitions: a.partitions(),
        connections: a.connections,
        batch_size: to_usize("--batch-size", a.batch.batch_size)?,
        record_size: to_usize("--record-size", a.batch.record_size)?,
        duration,
        total_bytes,
    };
    match append::build_batch(0, cfg.batch_size, cfg.record_size, 0) {
        Err(e @ append::AppendError::BatchTooSmall { .. }) => Err(BenchError::Usage(e.to_string())),
        Err(e) => Err(e.into()),
        Ok(_) => Ok(cfg),
    }
}

/// Settings both jobs print.
pub(crate) fn common_settings(a: &ServerClientArgs) -> Vec<(&'static str, String)> {
    let mut settings = Vec::new();
    match &a.addr {
        Some(addr) => settings.push(("addr", addr.clone())),
        None => {
            settings.push(("dir", a.data.dir.display().to_string()));
            settings.push(("shards", a.shards.to_string()));
            settings.push(("segment_size", Bytes(a.segment_size).to_string()));
        }
    }
    settings.extend([
        ("topic", a.topic.clone()),
        ("partitions", a.partitions().to_string()),
        ("connections", a.connections.to_string()),
        ("batch_size", Bytes(a.batch.batch_size).to_string()),
        ("record_size", Bytes(a.batch.record_size).to_string()),
    ]);
    settings
}

pub(crate) fn common_notes(a: &ServerClientArgs) -> Vec<String> {
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
    notes
}

pub(crate) fn connection_note(in_flight: u32) -> String {
    match in_flight {
        1 => "each connection is one thread with one blocking client and one request in flight"
            .to_owned(),
        k => format!(
            "each connection is one thread with one blocking client keeping {k} produce \
             requests in flight (pipelined, acks in request order)"
        ),
    }
}

/// Runs the produce job (and the append job) and cleans up; the report is
/// not printed.
pub(crate) fn produce_report(
    args: &ProduceArgs,
) -> Result<Report<ProduceResult, AppendResult>, BenchError> {
    let a = &args.common;
    let cfg = produce_config(a, args.duration, args.size, args.in_flight)?;
    let append_cfg = args.vs_append.then(|| AppendConfig {
        dir: a.data.dir.join("append"),
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
    let ws = workspace(a, append_cfg.as_ref().map(|c| c.dir.as_path()))?;
    let job = ProduceJob {
        args,
        cfg,
        append_cfg,
        target: None,
    };
    harness::run(job, ws, a.rep.reps, args.vs_append)
}

struct ProduceJob<'a> {
    args: &'a ProduceArgs,
    cfg: ProduceConfig,
    append_cfg: Option<AppendConfig>,
    /// Set by `start`.
    target: Option<Target>,
}

impl Job for ProduceJob<'_> {
    type Ours = ProduceResult;
    type Theirs = AppendResult;
    const NAME: &'static str = "produce";
    const LABELS: [&'static str; 2] = ["produce", "append"];
    const COMPARISON: Option<Comparison> = Some(PRODUCE_VS_APPEND);

    fn planned(&self) -> Option<Duration> {
        Some(self.cfg.duration)
    }

    fn start(&mut self) -> Result<(), BenchError> {
        if let Some(c) = &self.append_cfg {
            fs::create_dir(&c.dir).map_err(fs_err("create", &c.dir))?;
        }
        let a = &self.args.common;
        let target = Target::new(a, &a.server_dir(), &[])?;
        self.cfg.addr = target.addr.clone();
        self.target = Some(target);
        Ok(())
    }

    /// Each rep produces into a new topic, like the append job's new
    /// partitions.
    fn ours(&mut self, rep: RepNo) -> Result<ProduceResult, BenchError> {
        let a = &self.args.common;
        let topic = format!("{}-{}", a.topic, rep.n);
        produce::create_topic(&self.cfg.addr, &topic, self.cfg.partitions)?;
        let result = produce::run(&ProduceConfig {
            topic: topic.clone(),
            ..self.cfg.clone()
        });
        if !a.data.keep {
            produce::delete_topic(&self.cfg.addr, &topic)?;
        }
        Ok(result?)
    }

    fn theirs(&mut self, rep: RepNo, _: &ProduceResult) -> Result<AppendResult, BenchError> {
        let c = self
            .append_cfg
            .as_ref()
            .expect("--vs-append sets append_cfg");
        let result = append::run(c)?;
        if !(self.args.common.data.keep && rep.last()) {
            for p in 0..c.partitions {
                remove_if_exists(&c.partition_dir(p))?;
            }
        }
        Ok(result)
    }

    fn stop(&mut self) -> Result<(), BenchError> {
        self.target.take().map_or(Ok(()), Target::stop)
    }

    fn header(&self) -> Header {
        let (args, a) = (self.args, &self.args.common);
        let mut settings = common_settings(a);
        settings.push(("duration", Secs(args.duration).to_string()));
        if let Some(size) = args.size {
            settings.push(("size", Bytes(size).to_string()));
        }
        settings.push(("reps", a.rep.reps.to_string()));
        if args.in_flight > 1 {
            settings.push(("in_flight", args.in_flight.to_string()));
        }
        let mut notes = common_notes(a);
        notes.push(connection_note(args.in_flight));
        notes.push(format!(
            "each rep produces into a new topic {}-<rep> with {} partitions (created before and \
             deleted after the timed run{})",
            a.topic,
            a.partitions(),
            if a.data.keep {
                "; kept with --keep"
            } else {
                ""
            }
        ));
        if let Some(c) = &self.append_cfg {
            settings.push(("vs_append", "true".to_owned()));
            notes.push(format!(
                "reps alternate produce, append, produce, ...; append writes {} partitions in {} \
                 (new segment files, like the server's new topic)",
                c.partitions,
                c.dir.display()
            ));
        }
        Header {
            settings,
            fio_version: None,
            notes,
        }
    }
}

/// Fills a topic (un-timed), reads it back --reps times (alternately with
/// the `--vs` baseline), cleans up; the report is not printed.
pub(crate) fn consume_report(
    args: &ConsumeArgs,
) -> Result<Report<ConsumeResult, ConsumeBaseline>, BenchError> {
    let a = &args.common;
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
    let fill = produce_config(a, FILL_TIME_MAX, Some(args.size), 1)?;
    let fio_version = match args.vs {
        Some(ConsumeVs::Fio) => Some(fio::version()?),
        _ => None,
    };
    let fio_file = FioFile::new(a.data.dir.join("fio-consume.dat"));
    let extra = match args.vs {
        Some(ConsumeVs::Cold) => Some(cold_server_dir(a)),
        Some(ConsumeVs::Fio) => Some(fio_file.path.clone()),
        None => None,
    };
    let ws = workspace(a, extra.as_deref())?;
    let job = ConsumeJob {
        args,
        fill,
        fetch_bytes,
        target: None,
        topic_created: false,
        filled: None,
        cold: None,
        fio_file,
        fio_version,
    };
    harness::run(job, ws, a.rep.reps, args.vs.is_some())
}

/// The `--set` of a read cache of `bytes` per shard, if given.
fn read_cache_set(bytes: Option<u64>) -> Vec<String> {
    bytes
        .map(|n| format!("read_cache_bytes={n}"))
        .into_iter()
        .collect()
}

/// Where `consume --vs cold` starts its second server.
fn cold_server_dir(a: &ServerClientArgs) -> PathBuf {
    a.data.dir.join("server-cold")
}

/// The read cache per shard of the server `consume` reads from: with
/// `--vs cold`, room for the whole topic (its capacity and bookkeeping
/// too), so every fetch is served from memory; with `--vs fio`, none.
fn consume_read_cache_bytes(vs: Option<ConsumeVs>, size: u64) -> Option<u64> {
    match vs {
        Some(ConsumeVs::Cold) => Some(size + size / 4 + (64 << 20)),
        Some(ConsumeVs::Fio) => Some(0),
        None => None,
    }
}

/// The fio baseline reads at most this long (it stops after the topic's
/// bytes first).
const FIO_CONSUME_RUNTIME_MAX: Duration = Duration::from_secs(3600);

/// `consume --vs cold`: the second server, read cache off, filled alike.
struct ColdServer {
    target: Target,
    topic_created: bool,
    filled: Option<ProduceResult>,
}

struct ConsumeJob<'a> {
    args: &'a ConsumeArgs,
    fill: ProduceConfig,
    fetch_bytes: u32,
    /// Set by `start`, which also creates the topic and fills it.
    target: Option<Target>,
    topic_created: bool,
    filled: Option<ProduceResult>,
    cold: Option<ColdServer>,
    fio_file: FioFile,
    fio_version: Option<String>,
}

impl ConsumeJob<'_> {
    /// Creates the topic on `addr` and fills it (un-timed).
    fn fill(&self, addr: &str, created: &mut bool) -> Result<ProduceResult, BenchError> {
        produce::create_topic(addr, &self.fill.topic, self.fill.partitions)?;
        *created = true;
        eprintln!(
            "ringlog-bench: filling {} at {addr} with {} (un-timed)",
            self.fill.topic,
            Bytes(self.args.size)
        );
        Ok(produce::run(&ProduceConfig {
            addr: addr.to_owned(),
            ..self.fill.clone()
        })?)
    }

    /// Reads the whole topic from `addr`, checked against what `filled`.
    fn consume(&self, addr: &str, filled: &ProduceResult) -> Result<ConsumeResult, BenchError> {
        let fill = &self.fill;
        let r = consume::run(&ConsumeConfig {
            addr: addr.to_owned(),
            topic: fill.topic.clone(),
            partitions: fill.partitions,
            connections: fill.connections,
            fetch_bytes: self.fetch_bytes,
        })?;
        if r.records != filled.records || r.summary.bytes != filled.summary.bytes {
            return Err(BenchError::Mismatch(format!(
                "read back {} records ({} bytes) of {} produced ({} bytes): is something \
                 else writing to or purging topic {}?",
                r.records, r.summary.bytes, filled.records, filled.summary.bytes, fill.topic
            )));
        }
        Ok(r)
    }
}

impl Job for ConsumeJob<'_> {
    type Ours = ConsumeResult;
    type Theirs = ConsumeBaseline;
    const NAME: &'static str = "consume";
    const LABELS: [&'static str; 2] = ["consume", "baseline"];
    const COMPARISON: Option<Comparison> = Some(CONSUME_VS_BASELINE);

    fn start(&mut self) -> Result<(), BenchError> {
        let a = &self.args.common;
        let cache = consume_read_cache_bytes(self.args.vs, self.args.size);
        let target = Target::new(a, &a.server_dir(), &read_cache_set(cache))?;
        self.fill.addr = target.addr.clone();
        self.target = Some(target);
        let mut created = false;
        let filled = self.fill(&self.fill.addr, &mut created);
        self.topic_created = created;
        self.filled = Some(filled?);
        if self.args.vs == Some(ConsumeVs::Cold) {
            let target = Target::new(a, &cold_server_dir(a), &read_cache_set(Some(0)))?;
            let addr = target.addr.clone();
            self.cold = Some(ColdServer {
                target,
                topic_created: false,
                filled: None,
            });
            let mut created = false;
            let filled = self.fill(&addr, &mut created);
            let cold = self.cold.as_mut().expect("set above");
            cold.topic_created = created;
            cold.filled = Some(filled?);
        }
        Ok(())
    }

    fn ours(&mut self, _: RepNo) -> Result<ConsumeResult, BenchError> {
        let filled = self.filled.as_ref().expect(STARTED);
        self.consume(&self.fill.addr, filled)
    }

    fn theirs(&mut self, _: RepNo, _: &ConsumeResult) -> Result<ConsumeBaseline, BenchError> {
        if let Some(cold) = &self.cold {
            let filled = cold.filled.as_ref().expect(STARTED);
            return Ok(ConsumeBaseline::Cold(
                self.consume(&cold.target.addr, filled)?,
            ));
        }
        let bytes = self.filled.as_ref().expect(STARTED).summary.bytes;
        let file = self.fio_file.path.clone();
        let job = fio::FetchJob {
            file: &file,
            block_size_bytes: self.args.fetch_bytes,
            size_bytes: bytes,
            random: false,
            runtime: FIO_CONSUME_RUNTIME_MAX,
            io_bytes: Some(bytes),
            ramp: Duration::ZERO,
        };
        self.fio_file
            .prepare(FioLayout::Prewritten, job.effective_size_bytes())?;
        Ok(ConsumeBaseline::Fio(job.run()?))
    }

    fn stop(&mut self) -> Result<(), BenchError> {
        let keep = self.args.common.data.keep;
        let topic = &self.fill.topic;
        let deleted = if self.topic_created && !keep {
            produce::delete_topic(&self.fill.addr, topic)
        } else {
            Ok(())
        };
        let stopped = self.target.take().map_or(Ok(()), Target::stop);
        let cold = self.cold.take().map_or(Ok(()), |c| {
            let deleted = if c.topic_created && !keep {
                produce::delete_topic(&c.target.addr, topic)
            } else {
                Ok(())
            };
            let stopped = c.target.stop();
            deleted?;
            stopped
        });
        deleted?;
        stopped?;
        cold
    }

    fn header(&self) -> Header {
        let (args, a) = (self.args, &self.args.common);
        let mut settings = common_settings(a);
        settings.push(("size", Bytes(args.size).to_string()));
        settings.push(("fetch_bytes", Bytes(args.fetch_bytes).to_string()));
        settings.push(("reps", a.rep.reps.to_string()));
        if let Some(vs) = args.vs {
            settings.push(("vs", format!("{vs:?}").to_lowercase()));
        }
        if let Some(n) = consume_read_cache_bytes(args.vs, args.size) {
            settings.push(("read_cache_bytes", Bytes(n).to_string()));
        }
        let mut notes = common_notes(a);
        notes.push(connection_note(1));
        if let Some(filled) = &self.filled {
            notes.push(format!(
                "the topic was filled un-timed with {} in {} produces ({} records, {:.1} MiB/s); \
                 every rep reads all of it from offset 0, each connection its own partitions, \
                 and parses and verifies every batch",
                Bytes(filled.summary.bytes),
                filled.summary.ios,
                filled.records,
                filled.summary.bw_bytes / (1024.0 * 1024.0),
            ));
        }
        notes.push(FETCH_LAT_NOTE.to_owned());
        Header {
            settings,
            fio_version: self.fio_version.clone(),
            notes,
        }
    }
}

/// What `consume --vs` compares.
const CONSUME_VS_BASELINE: Comparison = Comparison {
    pair: "consume/baseline",
    latency: "fetch",
    cpu: false,
    notes: &[CONSUME_VS_NOTE],
};

const CONSUME_VS_NOTE: &str = "--vs cold: consume = a server whose read cache (read_cache_bytes \
     per shard) holds the whole topic, so no fetch reads the device; baseline = the same consume \
     from a second server, filled alike, with its read cache off (every fetch an O_DIRECT read). \
     --vs fio: consume = read cache off; baseline = fio rw=read, bs = --fetch-bytes (4KiB \
     blocks), iodepth=1, O_DIRECT, over as many bytes as the topic holds (fio's latency is one \
     read, ours one fetch request over loopback)";

/// The baseline run of `consume --vs`.
#[derive(Debug, Clone)]
pub(crate) enum ConsumeBaseline {
    /// The same consume from the server with its read cache off.
    Cold(ConsumeResult),
    /// fio's sequential read of a file as large as the topic.
    Fio(FioFetchResult),
}

impl Measured for ConsumeBaseline {
    const JOBNAME: &'static str = "consume-baseline";
    const SECTION: &'static str = "read";
    const ENGINE: &'static str = "baseline";
    fn summary(&self) -> Option<&RunSummary> {
        match self {
            ConsumeBaseline::Cold(c) => c.summary(),
            ConsumeBaseline::Fio(f) => f.summary(),
        }
    }
    fn details(&self, out: &mut String) {
        match self {
            ConsumeBaseline::Cold(c) => {
                let _ = writeln!(out, "    baseline: the same consume, read cache off");
                c.details(out);
            }
            ConsumeBaseline::Fio(f) => {
                let _ = writeln!(out, "    baseline: fio sequential read");
                f.details(out);
            }
        }
    }
    fn fields(&self) -> Value {
        let (kind, mut fields) = match self {
            ConsumeBaseline::Cold(c) => ("cold", c.fields()),
            ConsumeBaseline::Fio(f) => ("fio", f.fields()),
        };
        fields["baseline"] = json!(kind);
        fields
    }
}

/// Runs the partitions job and cleans up; fails (with the figures) if a
/// target is missed.
pub(crate) fn partitions_report(
    args: &PartitionsArgs,
) -> Result<Report<PartitionsOutcome>, BenchError> {
    let bin = server::locate_binary(args.server_bin.as_deref())?;
    let dir = args.data.dir.join("server");
    let ws = Workspace::create(&args.data.dir, args.data.keep, vec![dir.clone()])?;
    let cfg = PartitionsConfig {
        bin,
        dir,
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
    let report = harness::run(PartitionsJob { args, cfg }, ws, 1, false)?;
    let missed: Vec<String> = report.reps.iter().flat_map(|r| r.ours.missed()).collect();
    if !missed.is_empty() {
        return Err(BenchError::TargetMissed {
            report: report.text(),
            missed: missed.join("; "),
        });
    }
    Ok(report)
}

struct PartitionsJob<'a> {
    args: &'a PartitionsArgs,
    cfg: PartitionsConfig,
}

impl Job for PartitionsJob<'_> {
    type Ours = PartitionsOutcome;
    type Theirs = Never;
    const NAME: &'static str = "partitions";
    const LABELS: [&'static str; 2] = ["partitions", ""];

    fn ours(&mut self, _: RepNo) -> Result<PartitionsOutcome, BenchError> {
        let (args, cfg) = (self.args, &self.cfg);
        eprintln!(
            "ringlog-bench: {} partitions on {} --shards {} in {}",
            args.partitions,
            cfg.bin.display(),
            args.shards,
            cfg.dir.display()
        );
        Ok(PartitionsOutcome {
            result: partitions::run(cfg)?,
            targets: Targets {
                boot_time_max: Duration::from_millis(args.boot_ms_max),
                rss_bytes_max: args.rss_max,
                disk_bytes_max: args.disk_max,
            },
        })
    }

    fn header(&self) -> Header {
        let args = self.args;
        Header {
            settings: vec![
                ("dir", args.data.dir.display().to_string()),
                ("shards", args.shards.to_string()),
                ("partitions", args.partitions.to_string()),
                ("topic_partitions", args.topic_partitions.to_string()),
                ("connections", args.connections.to_string()),
                ("batch_size", Bytes(args.batch_size).to_string()),
                ("rounds", args.rounds.to_string()),
            ],
            fio_version: None,
            notes: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    //! Smoke tests against a real `ringlog` server. They need the binary
    //! built in this target directory and profile (ci/test's `cargo test
    //! --workspace` builds it; alone: `cargo build -p ringlog` first).

    use clap::Parser;

    use super::*;
    use crate::report::assert_fio_shape;
    use crate::testutil::{assert_has, consume, data_dir, partitions, produce};
    use crate::Cli;

    #[test]
    fn produce_defaults() {
        let a = produce("produce");
        assert_eq!(a.common.addr, None);
        assert_eq!(a.common.connections, 1);
        assert_eq!(a.common.partitions(), 1);
        assert_eq!(a.common.batch.batch_size, 64 << 10);
        assert_eq!(a.common.topic, "bench");
        assert_eq!(a.duration, Duration::from_secs(10));
        assert!(!a.vs_append);
        let a = produce("produce --connections 3 --duration 2m");
        assert_eq!(a.common.partitions(), 3);
        assert_eq!(a.duration, Duration::from_secs(120));
        let argv = "ringlog-bench produce --addr 127.0.0.1:1 --server-bin x";
        assert!(Cli::try_parse_from(argv.split(' ')).is_err());
        let c = consume("consume --fetch-bytes 256k");
        assert_eq!(c.size, 256 << 20);
        assert_eq!(c.fetch_bytes, 256 << 10);
    }

    #[test]
    fn usage_errors_create_nothing() {
        let (_tmp, dir) = data_dir();
        let d = dir.display();
        let c = consume(&format!("consume --dir {d} --connections 3 --partitions 2"));
        assert!(matches!(consume_report(&c), Err(BenchError::Usage(_))));
        let p = produce(&format!("produce --dir {d} --topic no.spaces?"));
        assert!(matches!(produce_report(&p), Err(BenchError::Usage(_))));
        let p = produce(&format!(
            "produce --dir {d} --batch-size 1k --record-size 4k"
        ));
        assert!(matches!(produce_report(&p), Err(BenchError::Usage(_))));
        assert!(!dir.exists());
    }

    /// Starts a server, produces 2 MiB per rep over two connections,
    /// alternating with the append job; checks the report's fields.
    #[test]
    fn produce_vs_append_smoke() {
        let (_tmp, dir) = data_dir();
        let args = produce(&format!(
            "produce --dir {} --shards 2 --connections 2 --partitions 3 --segment-size 1m \
             --duration 5 --size 2m --reps 2 --vs-append",
            dir.display()
        ));
        let report = produce_report(&args).unwrap_or_else(|e| panic!("{e}"));
        assert!(!dir.exists(), "data dir is removed without --keep");
        assert_eq!(report.reps.len(), 2);
        for rep in &report.reps {
            let p = &rep.ours;
            assert_eq!(p.summary.bytes, 2 << 20);
            assert_eq!(p.summary.ios, 32);
            assert_eq!(p.records, 32 * u64::from(p.records_per_batch));
            assert_eq!(p.summary.lat.samples, 32);
            assert!(p.summary.lat.p99_ns() > 0);
            let a = rep.theirs.as_ref().unwrap();
            assert_eq!(a.summary.bytes, 2 << 20);
        }
        assert_has(
            &report.text(),
            &[
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
                "    cpu: usr=",
            ],
        );
        let v = report.json();
        let job = &v["jobs"][0];
        assert_eq!(job["jobname"], "produce");
        assert_eq!(job["write"]["io_bytes"], 2u64 << 20);
        assert_eq!(job["write"]["total_ios"], 32);
        assert!(job["write"]["bw_bytes"].as_u64().unwrap() > 0);
        assert!(job["records_per_sec"].as_f64().unwrap() > 0.0);
        let p99 = &job["write"]["lat_ns"]["percentile"]["99.000000"];
        assert!(p99.as_u64().unwrap() > 0);
        assert_eq!(v["jobs"][1]["jobname"], "append");
        assert_eq!(v["ratios"]["throughput"]["reps"], 2);
        assert!(v["ratios"]["throughput"]["median"].as_f64().unwrap() > 0.0);
        assert_eq!(v["global options"]["connections"], "2");
        assert_fio_shape(&v, true, &["throughput", "p99_ack_latency"]);
    }

    /// `--in-flight 4`: each connection pipelines; the byte total, the
    /// acks and the settings come out as without it.
    #[test]
    fn produce_pipelined_smoke() {
        let (_tmp, dir) = data_dir();
        let args = produce(&format!(
            "produce --dir {} --shards 1 --connections 2 --segment-size 1m --duration 5 \
             --size 2m --in-flight 4",
            dir.display()
        ));
        assert_eq!(args.in_flight, 4);
        let report = produce_report(&args).unwrap_or_else(|e| panic!("{e}"));
        let p = &report.reps[0].ours;
        assert_eq!(p.summary.bytes, 2 << 20);
        assert_eq!(p.summary.ios, 32);
        assert_eq!(p.summary.lat.samples, 32);
        assert_eq!(p.records, 32 * u64::from(p.records_per_batch));
        assert_has(
            &report.text(),
            &[
                "in_flight=4",
                "keeping 4 produce requests in flight (pipelined, acks in request order)",
            ],
        );
        assert_eq!(report.json()["global options"]["in_flight"], "4");
    }

    /// Fills a topic on a started server and reads it back twice.
    #[test]
    fn consume_smoke() {
        let (_tmp, dir) = data_dir();
        let args = consume(&format!(
            "consume --dir {} --shards 2 --connections 2 --partitions 3 --segment-size 1m \
             --size 2m --fetch-bytes 256k --reps 2 --output-format json",
            dir.display()
        ));
        let report = consume_report(&args).unwrap_or_else(|e| panic!("{e}"));
        assert!(!dir.exists(), "data dir is removed without --keep");
        assert_eq!(report.reps.len(), 2);
        for c in report.reps.iter().map(|r| &r.ours) {
            assert_eq!(c.summary.bytes, 2 << 20);
            assert_eq!(c.batches, 32);
            assert!(c.records >= 32);
            // 256 KiB fetches return at most 256 KiB: at least 2 MiB / 256 KiB
            // of them (more where a partition's tail is a partial fetch).
            assert!(c.summary.ios >= 8, "{} fetches", c.summary.ios);
            assert_eq!(c.summary.lat.samples, c.summary.ios);
        }
        assert_has(
            &report.text(),
            &[
                "ringlog-bench consume: dir=",
                "fetch_bytes=256KiB",
                "consume: bw=",
                "records/s=",
                "in 32 batches",
                "fetch lat percentiles (usec): 50=",
                "note: the topic was filled un-timed with 2MiB",
            ],
        );
        let v = report.json();
        assert_eq!(v["jobs"][1]["jobname"], "consume");
        assert_eq!(v["jobs"][1]["read"]["io_bytes"], 2u64 << 20);
        assert!(v["jobs"][1]["read"]["lat_ns"]["percentile"]["50.000000"].is_u64());
        assert_fio_shape(&v, true, &[]);
    }

    /// Both baselines of consume on a small topic: the hot consume against
    /// a cold server, and a cold consume against fio.
    #[test]
    fn consume_vs_cold_and_fio_smoke() {
        for (vs, baseline) in [
            ("cold", "the same consume, read cache off"),
            ("fio", "fio sequential read"),
        ] {
            let (_tmp, dir) = data_dir();
            let args = consume(&format!(
                "consume --dir {} --shards 2 --connections 2 --segment-size 1m --size 2m \
                 --fetch-bytes 256k --reps 2 --vs {vs} --output-format json",
                dir.display()
            ));
            let report = consume_report(&args).unwrap_or_else(|e| panic!("{vs}: {e}"));
            assert!(!dir.exists(), "data dir is removed without --keep");
            assert_eq!(report.reps.len(), 2);
            for rep in &report.reps {
                assert_eq!(rep.ours.summary.bytes, 2 << 20);
                let theirs = rep.theirs.as_ref().expect("a baseline each rep");
                assert_eq!(theirs.summary().unwrap().bytes, 2 << 20, "{vs}");
            }
            assert_has(
                &report.text(),
                &[
                    &format!("vs={vs}"),
                    "consume/baseline",
                    &format!("baseline: {baseline}"),
                ],
            );
            let v = report.json();
            let jobs = v["jobs"].as_array().unwrap();
            let baselines: Vec<&Value> = jobs
                .iter()
                .filter(|j| j["jobname"] == "consume-baseline")
                .collect();
            assert_eq!(baselines.len(), 2, "{v}");
            assert!(baselines.iter().all(|j| j["baseline"] == vs), "{v}");
            assert!(v["ratios"]["throughput"]["median"].as_f64().unwrap() > 0.0);
        }
    }

    /// The CI-sized partitions job: 1,000 empty partitions on two shards,
    /// restarted, then two produces to each. Targets scaled to 1,000: boot
    /// in 2 s, 256 MiB of RSS, 128 MiB of disk (issue 8 item 9: before the
    /// fix each empty partition took 256 MiB of disk and 4 MiB of memory).
    #[test]
    fn partitions_smoke() {
        let (_tmp, dir) = data_dir();
        let args = partitions(&format!(
            "partitions --dir {} --shards 2 --partitions 1000 --topic-partitions 500 \
             --connections 4 --rss-max 256m --disk-max 128m --output-format json",
            dir.display()
        ));
        let report = partitions_report(&args).unwrap_or_else(|e| panic!("{e}"));
        print!("{}", report.text());
        assert!(!dir.exists(), "data dir is removed without --keep");
        let r = &report.reps[0].ours.result;
        assert_eq!(r.produces, 2000, "every partition acknowledged twice");
        assert!(r.booted.rss_bytes > 0 && r.booted.disk_bytes > 0);
        assert!(
            r.produced.disk_bytes > r.booted.disk_bytes,
            "disk grows with data"
        );
        let v = report.json();
        let job = &v["jobs"][0];
        assert_eq!(job["jobname"], "partitions");
        assert_eq!(job["produces"], 2000);
        assert!(job["targets_missed"].as_array().unwrap().is_empty());
        // A target missed fails the job, with the figures.
        let strict = partitions(&format!(
            "partitions --dir {} --partitions 10 --rounds 1 --disk-max 4k",
            dir.display()
        ));
        match partitions_report(&strict) {
            Err(BenchError::TargetMissed { report, missed }) => {
                assert!(missed.starts_with("disk "), "{missed}");
                assert_has(&report, &["boot to ready: ", "TARGETS MISSED: disk "]);
            }
            other => panic!(
                "expected a missed target, got {:?}",
                other.map(|r| r.text())
            ),
        }
        assert!(!dir.exists(), "removed after a missed target too");
    }

    /// --addr: the job uses a server it did not start and deletes the topics
    /// it created.
    #[test]
    fn produce_against_a_running_server() {
        let (tmp, unused) = data_dir();
        let bin = server::locate_binary(None).unwrap_or_else(|e| panic!("{e}"));
        let srv = ServerProcess::start(&bin, &tmp.path().join("srv"), 1, &[])
            .unwrap_or_else(|e| panic!("{e}"));
        let args = produce(&format!(
            "produce --addr {} --dir {} --topic t.x --duration 1 --batch-size 4k \
             --record-size 100",
            srv.addr,
            unused.display()
        ));
        let report = produce_report(&args).unwrap_or_else(|e| panic!("{e}"));
        let p = &report.reps[0].ours;
        assert!(p.summary.ios > 0);
        assert_eq!(p.summary.bytes, p.summary.ios * 4096);
        assert!(report.text().contains("ringlog-bench produce: addr="));
        let mut c = ringlog_shard::client::Client::connect(&srv.addr).unwrap();
        assert!(c.list_topics().unwrap().is_empty(), "topic t.x-1 deleted");
        srv.stop().unwrap();
    }
}
