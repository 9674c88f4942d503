//! ringlog-bench: fio-style benchmark harness for ringlog.
//!
//! `ringlog-bench append` drives partition stores directly (no server) and,
//! with `--vs-fio`, runs the equivalent fio job on the same filesystem in
//! alternation (ringlog, fio, ringlog, fio, ...) and reports the ratios.
//!
//! `ringlog-bench transfer` moves a partition log from one store to an empty
//! one through the snapshot API (state transfer) and, with `--vs-fio`,
//! compares it with fio reading the same bytes from one file and writing
//! them to another. `transfer --processes` does it between real server
//! processes over loopback TCP, with `--delay-ms` added by delay proxies
//! ([`transfer_processes`]).
//!
//! `ringlog-bench produce` and `ringlog-bench consume` drive a `ringlog
//! server` over TCP with blocking clients (one thread and connection each):
//! a server at `--addr`, or one they start from the `ringlog` binary next to
//! their own. `produce --vs-append` alternates with the storage-level append
//! job and reports the produce/append ratios.
//!
//! `ringlog-bench fetch` fills a partition store (un-timed) and times reads
//! by offset (`PartitionStore::read`), sequential or random, optionally
//! against fio reading a pre-written file with the same block size.
//!
//! Every job has the one shape of [`harness::Job`] and prints the one
//! [`report::Report`].
//!
//! `ringlog-bench --job-file FILE` runs the jobs of an fio-style ini file
//! ([`jobfile`]) in order; `--plot FILE.svg` draws throughput over time and
//! latency percentiles of every run ([`plot`]).

mod cluster_bench;
mod delay_proxy;
mod fio;
mod group_commit;
mod harness;
mod interrupt;
mod jobfile;
mod jobs;
mod plot;
mod report;
mod server_bench;
mod size;
mod stats;
mod status;
mod transfer_processes;

use std::fs;
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};

use crate::fio::{FioError, FioFetchResult, FioResult, FioTransferResult};
use crate::harness::{remove_if_exists, FioFile, Header, Job, RepNo, Workspace};
use crate::jobs::append::{AppendConfig, AppendError, AppendResult};
use crate::jobs::fetch::{FetchConfig, FetchJobError, FetchResult, Pattern};
use crate::jobs::produce::ClientJobError;
use crate::jobs::server::ServerError;
use crate::jobs::transfer::{Source, TransferConfig, TransferJobError, TransferResult};
use crate::report::{
    Comparison, JobReport, Report, TransferBaseline, APPEND_VS_FIO, FETCH_VS_FIO, TRANSFER_VS_FIO,
    TRANSFER_VS_LOCKSTEP,
};
use crate::server_bench::{consume_report, partitions_report, produce_report};
use crate::size::{parse_duration, parse_positive_duration, parse_size, Bytes, Secs};

#[derive(Debug, Parser)]
#[command(
    name = "ringlog-bench",
    version,
    about = "fio-style benchmarks for ringlog",
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true
)]
struct Cli {
    /// Run the jobs of an fio-style ini job file in order: a [global]
    /// section of options for every job, then one section per job, whose
    /// name (or `job=`) is the job (append, fetch, transfer, produce,
    /// consume); keys are the job's long options (`batch-size=64k`,
    /// `vs-fio`).
    #[arg(long, required = true)]
    job_file: Option<PathBuf>,
    /// Also draw throughput over time (per second) and latency percentiles
    /// of every run into this SVG file.
    #[arg(long, global = true)]
    plot: Option<PathBuf>,
    /// Print the status line (elapsed, throughput, ETA) to stderr also when
    /// it is not a terminal (on a terminal it is always shown).
    #[arg(long, global = true)]
    status: bool,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Group-committed appends into partition stores (write + fdatasync per
    /// flush), optionally against the equivalent fio job.
    Append(AppendArgs),
    /// State transfer of a whole partition log into an empty store
    /// (open_snapshot .. commit_install), optionally against fio reading
    /// the same bytes from one file and writing them to another.
    Transfer(TransferArgs),
    /// Produce requests to a running server over TCP (one blocking client
    /// per connection thread): throughput and ack latency, optionally
    /// against the storage-level append job.
    Produce(ProduceArgs),
    /// Consumers reading back everything produced (un-timed) into a running
    /// server: throughput and per-fetch latency.
    Consume(ConsumeArgs),
    /// Storage-level reads by offset from a filled partition store
    /// (sequential or random), optionally against fio reading a
    /// pre-written file.
    Fetch(FetchArgs),
    /// What many partitions cost a server: creates empty partitions,
    /// restarts it and times boot to ready, reads its RSS and the data
    /// directory's disk use, produces to every partition round-robin
    /// (checking every ack); fails if a target is missed.
    Partitions(PartitionsArgs),
    /// Group commit at scale: small batches from N producers into N
    /// partitions against the same into one partition, on one started
    /// server: throughput, batches per fdatasync, device flushes per second.
    GroupCommit(GroupCommitArgs),
}

/// Where a job's data goes, and whether it stays.
#[derive(Debug, clap::Args)]
pub(crate) struct DataArgs {
    /// Directory for the data (created; removed at the end unless --keep).
    /// Put it on the filesystem you want to measure.
    #[arg(long, default_value = "./bench-data")]
    dir: PathBuf,
    /// Keep the data directory: what the last rep wrote, fio's files (and,
    /// against a server, the topics).
    #[arg(long)]
    keep: bool,
}

/// How many times a job runs, and how it reports.
#[derive(Debug, clap::Args)]
pub(crate) struct RepArgs {
    /// Repetitions; with a comparison (--vs-fio, --vs-append) they
    /// alternate ours, theirs, ours, ...
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
    reps: u32,
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    output_format: OutputFormat,
}

/// The batches a job writes.
#[derive(Debug, clap::Args)]
pub(crate) struct BatchArgs {
    /// Encoded bytes of each batch (header included): 4096, 64k, 1m.
    #[arg(long, default_value = "64k", value_parser = parse_size)]
    batch_size: u64,
    /// Value bytes of each record in a batch.
    #[arg(long, default_value = "1k", value_parser = parse_size)]
    record_size: u64,
}

/// The comparison with fio of a job that writes.
#[derive(Debug, clap::Args)]
struct FioArgs {
    /// Also run the equivalent fio job and report ringlog/fio ratios.
    #[arg(long)]
    vs_fio: bool,
    /// With --vs-fio, how the file fio writes is prepared (a file it reads
    /// is always written beforehand).
    #[arg(long, value_enum, default_value_t = FioLayout::Prewritten)]
    fio_layout: FioLayout,
}

#[derive(Debug, clap::Args)]
pub(crate) struct PartitionsArgs {
    #[command(flatten)]
    data: DataArgs,
    /// The `ringlog` binary to start [default: next to ringlog-bench].
    #[arg(long)]
    server_bin: Option<PathBuf>,
    /// Shards of the server (0: one per core).
    #[arg(long, default_value_t = 0)]
    shards: u32,
    /// Partitions created (all on this one node).
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    partitions: u32,
    /// Partitions per topic (a topic holds at most 4096).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=4096))]
    topic_partitions: u32,
    /// Client connections producing in parallel, one thread each.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=1024))]
    connections: u32,
    /// Encoded bytes of each produced batch.
    #[arg(long, default_value = "4k", value_parser = parse_size)]
    batch_size: u64,
    /// Value bytes of each record in a batch.
    #[arg(long, default_value = "100", value_parser = parse_size)]
    record_size: u64,
    /// Rounds of one produce to every partition.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=1000))]
    rounds: u32,
    /// Fail if the restarted server takes longer than this to be ready.
    #[arg(long, default_value_t = 2000)]
    boot_ms_max: u64,
    /// Fail if the booted server's RSS (all partitions empty) exceeds this.
    #[arg(long, default_value = "1g", value_parser = parse_size)]
    rss_max: u64,
    /// Fail if the data directory (all partitions empty) takes more disk.
    #[arg(long, default_value = "1g", value_parser = parse_size)]
    disk_max: u64,
    /// RLIMIT_NOFILE for the server [default: inherited].
    #[arg(long)]
    files_max: Option<u64>,
    /// Extra server flags, e.g. --server-arg=--set --server-arg=k=v.
    #[arg(long = "server-arg", allow_hyphen_values = true)]
    server_args: Vec<String>,
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    output_format: OutputFormat,
}

/// Where each fetch read starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ReadPattern {
    /// Where the previous read ended (fio rw=read).
    Seq,
    /// At a uniformly random offset (fio rw=randread).
    Rand,
}

#[derive(Debug, clap::Args)]
struct FetchArgs {
    #[command(flatten)]
    data: DataArgs,
    #[command(flatten)]
    rep: RepArgs,
    #[command(flatten)]
    batch: BatchArgs,
    /// Bytes of log appended (un-timed, rounded up to whole batches) before
    /// reading; fio reads a file of this size.
    #[arg(long, default_value = "256m", value_parser = parse_size)]
    size: u64,
    /// Segment size of the store.
    #[arg(long, default_value = "256m", value_parser = parse_size)]
    segment_size: u64,
    /// max_bytes of each read (fio's bs, rounded up to 4 KiB).
    #[arg(long, default_value = "1m", value_parser = parse_size)]
    read_size: u64,
    /// Offsets read: seq or rand.
    #[arg(long, value_enum, default_value_t = ReadPattern::Seq)]
    pattern: ReadPattern,
    /// Length of each run, ringlog and fio each (5s, 500ms, 2m; a bare
    /// number is seconds).
    #[arg(long, default_value = "10", value_parser = parse_positive_duration)]
    duration: Duration,
    /// Stop a run after reading this many bytes, if that comes before
    /// --duration (fio's io_size).
    #[arg(long, value_parser = parse_size)]
    io_size: Option<u64>,
    /// Un-timed reads before each timed run (fio's ramp_time; units as for
    /// --duration).
    #[arg(long, default_value = "0", value_parser = parse_duration)]
    ramp_time: Duration,
    /// Also run the equivalent fio job and report ringlog/fio ratios.
    #[arg(long)]
    vs_fio: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum OutputFormat {
    Text,
    Json,
}

/// State of fio's file before each timed fio run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum FioLayout {
    /// Written once beforehand (un-timed), so fio overwrites written blocks,
    /// as ringlog does with recycled segment files.
    Prewritten,
    /// Deleted before each run, so fio writes into fresh space, as ringlog
    /// does with newly created segment files.
    Fresh,
}

#[derive(Debug, clap::Args)]
struct AppendArgs {
    #[command(flatten)]
    data: DataArgs,
    #[command(flatten)]
    rep: RepArgs,
    #[command(flatten)]
    batch: BatchArgs,
    #[command(flatten)]
    fio: FioArgs,
    /// Partitions appended to in each group commit.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=4096))]
    partitions: u32,
    /// Length of each run, ringlog and fio each (5s, 500ms, 2m; a bare
    /// number is seconds).
    #[arg(long, default_value = "10", value_parser = parse_positive_duration)]
    duration: Duration,
    /// Stop a ringlog run after this many bytes (over all partitions) if that
    /// comes before --duration. fio writes the same amount (at least 64 MiB).
    #[arg(long, value_parser = parse_size)]
    size: Option<u64>,
    /// Segment size of each partition.
    #[arg(long, default_value = "256m", value_parser = parse_size)]
    segment_size: u64,
    /// Per-partition retention: sealed segments beyond this size are removed
    /// after each group commit and their files recycled for new segments.
    #[arg(long, value_parser = parse_size)]
    retention: Option<u64>,
    /// Bytes (over all partitions) appended un-timed before each ringlog run.
    /// With --retention, about retention + 2 segments per partition makes
    /// every timed segment a recycled (already written) file.
    #[arg(long, default_value = "0", value_parser = parse_size)]
    warmup: u64,
    /// Un-timed appends (after --warmup) before each timed ringlog run
    /// (fio's ramp_time, units as for --duration; fio's append overwrites a
    /// laid-out file and runs without one).
    #[arg(long, default_value = "0", value_parser = parse_duration)]
    ramp_time: Duration,
}

#[derive(Debug, clap::Args)]
struct TransferArgs {
    #[command(flatten)]
    data: DataArgs,
    #[command(flatten)]
    rep: RepArgs,
    #[command(flatten)]
    fio: FioArgs,
    /// Bytes of log to transfer (appended to the source un-timed, rounded up
    /// to whole batches).
    #[arg(long, default_value = "512m", value_parser = parse_size)]
    size: u64,
    /// Segment size of both stores.
    #[arg(long, default_value = "256m", value_parser = parse_size)]
    segment_size: u64,
    /// Transfer chunk size (StoreConfig::transfer_chunk_bytes, both sides;
    /// fio's bs): a multiple of 4096, at most 16m.
    #[arg(long, default_value = "1m", value_parser = parse_size)]
    chunk_size: u64,
    /// Chunks the receiver keeps requested, on the wire or being written,
    /// 2..=256 (fio's iodepth) [default: 4; with --processes the server's
    /// default window, 8, set on every node as transfer_window_chunks].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
    window: Option<u32>,
    /// Encoded bytes of each batch of the source's log.
    #[arg(long, default_value = "1m", value_parser = parse_size)]
    batch_size: u64,
    /// Value bytes of each record in a batch.
    #[arg(long, default_value = "1k", value_parser = parse_size)]
    record_size: u64,
    /// Milliseconds every request and reply between the serving and the
    /// receiving machine is held, each way (a round trip costs twice this):
    /// an in-process delay line, or with --processes a TCP delay proxy
    /// holding every segment of bytes, both ways (at 0 there is no proxy:
    /// node 3 and its peers connect directly).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=10_000))]
    delay_ms: u64,
    /// Compare with a lockstep pull at the same delay: one 256KiB chunk
    /// requested, read, sent back and written before the next (the design
    /// Apache Iggy ships), instead of fio; with --processes over loopback
    /// TCP through a delay proxy, from a file served by this process.
    #[arg(long, conflicts_with = "vs_fio")]
    vs_lockstep: bool,
    /// Transfer between real `ringlog server` processes over loopback TCP:
    /// a local 3-node cluster keeping --size per partition by retention;
    /// node 3 is killed, falls behind the others' retention, is booted and
    /// installs a snapshot of one partition, timed from its side.
    /// --chunk-size and --window set every server's transfer_chunk_bytes
    /// and transfer_window_chunks (defaults 1m and 8).
    #[arg(long)]
    processes: bool,
    /// With --processes: the `ringlog` binary [default: next to
    /// ringlog-bench].
    #[arg(long, requires = "processes")]
    server_bin: Option<PathBuf>,
    /// With --processes: shards of each server.
    #[arg(long, default_value_t = 1, requires = "processes")]
    shards: u32,
}

/// The server and client settings shared by `produce` and `consume`.
#[derive(Debug, clap::Args)]
struct ServerClientArgs {
    #[command(flatten)]
    data: DataArgs,
    #[command(flatten)]
    rep: RepArgs,
    #[command(flatten)]
    batch: BatchArgs,
    /// Use the server at HOST:PORT instead of starting one.
    #[arg(long)]
    addr: Option<String>,
    /// The `ringlog` binary to start [default: next to ringlog-bench].
    #[arg(long, conflicts_with = "addr")]
    server_bin: Option<PathBuf>,
    /// Shards of the started server (0: one per core).
    #[arg(long, default_value_t = 0, conflicts_with = "addr")]
    shards: u32,
    /// Segment size of the started server's partitions.
    #[arg(long, default_value = "256m", value_parser = parse_size)]
    segment_size: u64,
    /// Topic name (produce: one topic per rep, `<topic>-<rep>`).
    #[arg(long, default_value = "bench")]
    topic: String,
    /// Partitions of the topic [default: --connections].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4096))]
    partitions: Option<u32>,
    /// Client connections, one thread each (produce: --in-flight requests
    /// each; consume: one fetch each).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    connections: u32,
}

impl ServerClientArgs {
    fn partitions(&self) -> u32 {
        self.partitions.unwrap_or(self.connections)
    }

    fn server_dir(&self) -> PathBuf {
        self.data.dir.join("server")
    }
}

#[derive(Debug, clap::Args)]
struct ProduceArgs {
    #[command(flatten)]
    common: ServerClientArgs,
    /// Length of each run, produce and append each (5s, 500ms, 2m; a bare
    /// number is seconds).
    #[arg(long, default_value = "10", value_parser = parse_positive_duration)]
    duration: Duration,
    /// Stop a run after this many bytes (over all connections) if that comes
    /// before --duration.
    #[arg(long, value_parser = parse_size)]
    size: Option<u64>,
    /// Also run the storage-level append job (one partition per connection,
    /// same batch size and duration, in --dir) alternately with produce and
    /// report produce/append ratios.
    #[arg(long)]
    vs_append: bool,
    /// Produce requests each connection keeps in flight (pipelined: the
    /// next is sent before the last ack; the server reads up to its
    /// requests_in_flight_max, 16 by default, at once).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    in_flight: u32,
    /// Start a local cluster of N nodes (127.0.0.1; N odd, 3 to 7) and produce to a topic
    /// replicated on all of them, against the same produce to a single node
    /// started alongside (reps alternated).
    #[arg(long, value_name = "N", conflicts_with_all = ["vs_append", "addr"])]
    cluster: Option<u32>,
}

#[derive(Debug, clap::Args)]
struct GroupCommitArgs {
    /// --connections is the producers; the partitions are set per side.
    #[command(flatten)]
    common: ServerClientArgs,
    /// Length of each run, spread and one each (5s, 500ms; a bare number
    /// is seconds).
    #[arg(long, default_value = "5", value_parser = parse_positive_duration)]
    duration: Duration,
    /// Records per batch (of --record-size each); sets the batch size
    /// (--batch-size is not used).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    records: u32,
    /// The started server's `group_commit` mode [default: the server's].
    #[arg(long, value_parser = ["journal", "partition"])]
    group_commit: Option<String>,
    /// More config overrides for the started server (KEY=VALUE, as
    /// `ringlog server --set`; repeatable), e.g. journal_bytes=256m.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    sets: Vec<String>,
}

#[derive(Debug, clap::Args)]
struct ConsumeArgs {
    #[command(flatten)]
    common: ServerClientArgs,
    /// Bytes produced (un-timed, rounded up to whole batches) before the
    /// consumers read everything back.
    #[arg(long, default_value = "256m", value_parser = parse_size)]
    size: u64,
    /// max_bytes of each fetch (the server caps it at its read_bytes_max).
    #[arg(long, default_value = "1m", value_parser = parse_size)]
    fetch_bytes: u64,
    /// Also run a baseline alternately with the consume and report the
    /// ratios (needs a started server, not --addr).
    #[arg(long, value_enum, conflicts_with = "addr")]
    vs: Option<ConsumeVs>,
}

/// The baseline of `consume --vs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ConsumeVs {
    /// The consume reads from memory (its server's read cache holds all of
    /// --size), the baseline is the same consume from a second server,
    /// filled alike, with its read cache off (every fetch reads the device).
    Cold,
    /// The consume reads the device (read cache off), the baseline is fio
    /// reading --size sequentially, bs = --fetch-bytes, iodepth 1, O_DIRECT.
    Fio,
}

#[derive(Debug, thiserror::Error)]
enum BenchError {
    #[error(transparent)]
    Fio(#[from] FioError),
    #[error(transparent)]
    Append(#[from] AppendError),
    #[error(transparent)]
    Transfer(#[from] TransferJobError),
    #[error(transparent)]
    Server(#[from] ServerError),
    #[error(transparent)]
    Client(#[from] ClientJobError),
    #[error(transparent)]
    Fetch(#[from] FetchJobError),
    #[error(transparent)]
    Partitions(#[from] crate::jobs::partitions::PartitionsError),
    #[error("{report}\ntarget missed: {missed}")]
    TargetMissed { report: String, missed: String },
    #[error("{what} {path}: {source}")]
    Fs {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{0}")]
    Usage(String),
    #[error("{0}")]
    Mismatch(String),
    #[error("server metrics: {0}")]
    Metrics(String),
    #[error("writing the report: {0}")]
    Output(#[source] io::Error),
}

fn fs_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> BenchError + 'a {
    move |source| BenchError::Fs {
        what,
        path: path.to_owned(),
        source,
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    status::FORCED.store(cli.status, std::sync::atomic::Ordering::Relaxed);
    if let Err(e) = interrupt::install() {
        eprintln!("ringlog-bench: warning: no Ctrl-C cleanup (installing the handler: {e})");
    }
    let result = match (cli.command, &cli.job_file) {
        (Some(command), _) => run_command(command).and_then(|(format, report)| {
            let runs = [jobfile::Run {
                section: None,
                format,
                report,
            }];
            output(&runs, cli.plot.as_deref())
        }),
        (None, Some(file)) => {
            jobfile::run_file(file).and_then(|runs| output(&runs, cli.plot.as_deref()))
        }
        (None, None) => Err(BenchError::Usage("give a job or --job-file".into())),
    };
    interrupt::wait_if_interrupted();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let mut msg = format!("ringlog-bench: error: {e}");
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                msg.push_str(&format!(": {s}"));
                source = s.source();
            }
            eprintln!("{msg}");
            ExitCode::FAILURE
        }
    }
}

/// Runs one job to its report (not printed) and the output format it asked
/// for.
fn run_command(command: Command) -> Result<(OutputFormat, Box<dyn JobReport>), BenchError> {
    Ok(match command {
        Command::Append(a) => (a.rep.output_format, Box::new(append_report(&a)?)),
        Command::Transfer(a) if a.processes => (
            a.rep.output_format,
            Box::new(transfer_processes::ProcessesReport(processes_report(&a)?)),
        ),
        Command::Transfer(a) => (a.rep.output_format, Box::new(transfer_report(&a)?)),
        Command::Produce(a) => match a.cluster {
            Some(n) => (
                a.common.rep.output_format,
                Box::new(cluster_bench::ClusterReport(
                    cluster_bench::cluster_produce_report(&a, n)?,
                )),
            ),
            None => (a.common.rep.output_format, Box::new(produce_report(&a)?)),
        },
        Command::Consume(a) => (a.common.rep.output_format, Box::new(consume_report(&a)?)),
        Command::Fetch(a) => (a.rep.output_format, Box::new(fetch_report(&a)?)),
        Command::Partitions(a) => (a.output_format, Box::new(partitions_report(&a)?)),
        Command::GroupCommit(a) => (
            a.common.rep.output_format,
            Box::new(group_commit::group_commit_report(&a)?),
        ),
    })
}

/// Prints the runs' reports (one JSON document for all of them) and draws
/// the plot, if asked for.
fn output(runs: &[jobfile::Run], plot_file: Option<&Path>) -> Result<(), BenchError> {
    let format = runs.first().map_or(OutputFormat::Text, |r| r.format);
    if runs.iter().any(|r| r.format != format) {
        return Err(BenchError::Usage(
            "every job of a job file must use the same --output-format".into(),
        ));
    }
    if let Some(file) = plot_file {
        let series: Vec<plot::Series> = runs
            .iter()
            .flat_map(|r| {
                r.report.series().into_iter().map(move |mut s| {
                    if let Some(section) = &r.section {
                        s.label = format!("[{section}] {}", s.label);
                    }
                    s
                })
            })
            .collect();
        fs::write(file, plot::svg(&series)).map_err(fs_err("write", file))?;
    }
    let (text, json) = match runs {
        [run] if run.section.is_none() => (run.report.text(), run.report.json()),
        _ => (jobfile::text(runs), jobfile::json(runs)),
    };
    let out = match format {
        OutputFormat::Text => text,
        OutputFormat::Json => {
            let mut s =
                serde_json::to_string_pretty(&json).expect("serde_json::Value always serialises");
            s.push('\n');
            s
        }
    };
    io::stdout()
        .lock()
        .write_all(out.as_bytes())
        .map_err(BenchError::Output)
}

fn to_usize(what: &str, v: u64) -> Result<usize, BenchError> {
    usize::try_from(v).map_err(|_| BenchError::Usage(format!("{what} {v} is too large")))
}

/// A store's segments must hold a whole batch.
fn check_segment_size(segment_size: u64, batch_size: u64) -> Result<(), BenchError> {
    if segment_size < batch_size {
        return Err(BenchError::Usage(format!(
            "--segment-size {} is smaller than --batch-size {}",
            Bytes(segment_size),
            Bytes(batch_size)
        )));
    }
    Ok(())
}

/// fio's version when the comparison is asked for: fails before any work
/// when fio is missing.
fn fio_version(vs_fio: bool) -> Result<Option<String>, BenchError> {
    Ok(if vs_fio { Some(fio::version()?) } else { None })
}

/// Why a job's setup state is there in a rep: [`harness::run`] calls
/// `start` first and runs no rep when it fails.
const STARTED: &str = "Job::start ran before the reps";

fn layout_name(layout: FioLayout) -> String {
    format!("{layout:?}").to_lowercase()
}

/// Runs the append job (and fio) and cleans up; the report is not printed.
fn append_report(args: &AppendArgs) -> Result<Report<AppendResult, FioResult>, BenchError> {
    check_segment_size(args.segment_size, args.batch.batch_size)?;
    let fio_version = fio_version(args.fio.vs_fio)?;
    let dir = &args.data.dir;
    let cfg = AppendConfig {
        dir: dir.clone(),
        partitions: args.partitions,
        batch_size: to_usize("--batch-size", args.batch.batch_size)?,
        record_size: to_usize("--record-size", args.batch.record_size)?,
        duration: args.duration,
        total_bytes: args.size,
        segment_size: args.segment_size,
        retention_bytes: args.retention,
        warmup_bytes: args.warmup,
        ramp: args.ramp_time,
    };
    let fio_file = FioFile::new(dir.join("fio.dat"));
    let mut paths: Vec<PathBuf> = (0..cfg.partitions).map(|p| cfg.partition_dir(p)).collect();
    paths.push(fio_file.path.clone());
    let ws = Workspace::create(dir, args.data.keep, paths)?;
    let job = AppendJob {
        args,
        cfg,
        fio_version,
        fio_file,
    };
    harness::run(job, ws, args.rep.reps, args.fio.vs_fio)
}

struct AppendJob<'a> {
    args: &'a AppendArgs,
    cfg: AppendConfig,
    fio_version: Option<String>,
    fio_file: FioFile,
}

impl Job for AppendJob<'_> {
    type Ours = AppendResult;
    type Theirs = FioResult;
    const NAME: &'static str = "append";
    const LABELS: [&'static str; 2] = ["ringlog append", "fio append"];
    const COMPARISON: Option<Comparison> = Some(APPEND_VS_FIO);

    fn planned(&self) -> Option<Duration> {
        Some(self.cfg.ramp + self.cfg.duration)
    }

    fn ours(&mut self, rep: RepNo) -> Result<AppendResult, BenchError> {
        let result = jobs::append::run(&self.cfg)?;
        if !(rep.last() && self.args.data.keep) {
            for p in 0..self.cfg.partitions {
                remove_if_exists(&self.cfg.partition_dir(p))?;
            }
        }
        Ok(result)
    }

    fn theirs(&mut self, _: RepNo, ours: &AppendResult) -> Result<FioResult, BenchError> {
        let file = self.fio_file.path.clone();
        let job = fio::AppendJob {
            file: &file,
            block_size_bytes: self.args.batch.batch_size,
            size_bytes: self.args.size.unwrap_or(ours.summary.bytes),
            runtime: self.cfg.duration,
        };
        self.fio_file
            .prepare(self.args.fio.fio_layout, job.effective_size_bytes())?;
        Ok(job.run()?)
    }

    fn header(&self) -> Header {
        let (args, cfg) = (self.args, &self.cfg);
        let mut settings = vec![
            ("dir", cfg.dir.display().to_string()),
            ("partitions", cfg.partitions.to_string()),
            ("batch_size", Bytes(args.batch.batch_size).to_string()),
            ("record_size", Bytes(args.batch.record_size).to_string()),
            ("segment_size", Bytes(args.segment_size).to_string()),
            ("duration", Secs(args.duration).to_string()),
        ];
        if let Some(size) = args.size {
            settings.push(("size", Bytes(size).to_string()));
        }
        if let Some(r) = args.retention {
            settings.push(("retention", Bytes(r).to_string()));
        }
        if args.warmup > 0 {
            settings.push(("warmup", Bytes(args.warmup).to_string()));
        }
        if !args.ramp_time.is_zero() {
            settings.push(("ramp_time", Secs(args.ramp_time).to_string()));
        }
        settings.push(("reps", args.rep.reps.to_string()));
        let mut notes = Vec::new();
        if args.fio.vs_fio {
            settings.push(("fio_layout", layout_name(args.fio.fio_layout)));
            notes.push(match args.fio.fio_layout {
                FioLayout::Prewritten if args.retention.is_some() && args.warmup > 0 => {
                    "fio overwrites a pre-written file (laid out un-timed); ringlog writes recycled \
                     segment files once the warm-up has filled its recycle pool through retention"
                        .to_owned()
                }
                FioLayout::Prewritten => "fio overwrites a pre-written file (laid out un-timed), but \
                    ringlog writes into newly created segment files (no --retention/--warmup): \
                    overwrites run up to ~2x faster than fresh writes here, so the throughput ratio \
                    understates ringlog"
                    .to_owned(),
                FioLayout::Fresh => "fio writes into a freshly created file each rep; \
                    ringlog writes into segment files it creates"
                    .to_owned(),
            });
            if cfg.partitions > 1 {
                notes.push(format!(
                    "fio runs one file with one write+fdatasync per I/O; ringlog groups {} \
                     partitions per commit (one write+fdatasync each, one submission)",
                    cfg.partitions
                ));
            }
        }
        notes.push(
            "ringlog pipelines like the shard's group commit: the next round's batches are \
             appended (restamped in place in a lent write buffer, checked, hashed; not copied) \
             while the current round's write+fdatasync is in \
             the kernel, and submitted the moment it completes, so each partition's file sees one \
             write+fdatasync at a time, as fio's does (qd1), with ringlog's CPU per batch off the \
             device's critical path"
                .to_owned(),
        );
        Header {
            settings,
            fio_version: self.fio_version.clone(),
            notes,
        }
    }
}

/// Runs `transfer --processes` and cleans up; the report is not printed.
fn processes_report(
    args: &TransferArgs,
) -> Result<
    Report<transfer_processes::ProcessResult, transfer_processes::ProcessBaseline>,
    BenchError,
> {
    use transfer_processes::{server_window_chunks, Baseline, ProcessesConfig, ProcessesJob};
    // The servers check both (transfer_chunk_bytes, transfer_window_chunks);
    // only the conversions are checked here.
    let chunk_bytes = u32::try_from(args.chunk_size)
        .map_err(|_| BenchError::Usage(format!("--chunk-size {} is too large", args.chunk_size)))?;
    let window_chunks = args.window.map_or(server_window_chunks(), |w| w as usize);
    if !(2..=256).contains(&window_chunks) {
        return Err(BenchError::Usage(format!(
            "--window {window_chunks} must be in 2..=256 (the server's transfer_window_chunks)"
        )));
    }
    check_segment_size(args.segment_size, args.batch_size)?;
    if !args.segment_size.is_multiple_of(4096) || args.size < 2 * args.segment_size {
        return Err(BenchError::Usage(format!(
            "--processes: --segment-size {} must be a multiple of 4KiB, and --size {} (the \
             retention) at least two segments",
            Bytes(args.segment_size),
            Bytes(args.size)
        )));
    }
    let vs = match (args.fio.vs_fio, args.vs_lockstep) {
        (true, _) => Some(Baseline::Fio),
        (_, true) => Some(Baseline::Lockstep),
        _ => None,
    };
    let fio_version = fio_version(args.fio.vs_fio)?;
    let cfg = ProcessesConfig {
        dir: args.data.dir.clone(),
        bytes: args.size,
        segment_size: args.segment_size,
        batch_size: to_usize("--batch-size", args.batch_size)?,
        record_size: to_usize("--record-size", args.record_size)?,
        delay: Duration::from_millis(args.delay_ms),
        chunk_bytes,
        window_chunks,
        server_bin: args.server_bin.clone(),
        shards: args.shards,
        vs,
        fio_layout: args.fio.fio_layout,
    };
    let ws = Workspace::create(&args.data.dir, args.data.keep, ProcessesJob::paths(&cfg))?;
    let job = ProcessesJob::new(cfg, "xfer", fio_version);
    harness::run(job, ws, args.rep.reps, vs.is_some())
}

/// Runs the transfer job (and fio or the lockstep pull) and cleans up; the
/// report is not printed.
fn transfer_report(
    args: &TransferArgs,
) -> Result<Report<TransferResult, TransferBaseline>, BenchError> {
    let chunk_size = u32::try_from(args.chunk_size)
        .ok()
        .filter(|c| *c > 0 && c % 4096 == 0 && *c <= 16 << 20)
        .ok_or_else(|| {
            BenchError::Usage(format!(
                "--chunk-size {} must be a positive multiple of 4KiB, at most 16MiB",
                Bytes(args.chunk_size)
            ))
        })?;
    check_segment_size(args.segment_size, args.batch_size)?;
    if args.size == 0 {
        return Err(BenchError::Usage("--size must be positive".into()));
    }
    let window = args.window.unwrap_or(4);
    if !(2..=256).contains(&window) {
        return Err(BenchError::Usage(format!(
            "--window {window} must be in 2..=256 (a window is never lockstep; --vs-lockstep runs that)"
        )));
    }
    let fio_version = fio_version(args.fio.vs_fio)?;
    let dir = &args.data.dir;
    let cfg = TransferConfig {
        dir: dir.clone(),
        total_bytes: args.size,
        segment_size: args.segment_size,
        chunk_size,
        window: to_usize("--window", u64::from(window))?,
        batch_size: to_usize("--batch-size", args.batch_size)?,
        record_size: to_usize("--record-size", args.record_size)?,
        delay: Duration::from_millis(args.delay_ms),
    };
    let lockstep = args.vs_lockstep.then(|| cfg.lockstep());
    let read = FioFile::new(dir.join("fio-read.dat"));
    let write = FioFile::new(dir.join("fio-write.dat"));
    let mut paths = vec![
        cfg.source_dir(),
        cfg.receiver_dir(),
        read.path.clone(),
        write.path.clone(),
    ];
    paths.extend(lockstep.as_ref().map(|l| l.dir.clone()));
    let ws = Workspace::create(dir, args.data.keep, paths)?;
    let job = TransferJob {
        args,
        cfg,
        fio_version,
        read,
        write,
        source: None,
        lockstep,
        lockstep_source: None,
    };
    if args.vs_lockstep {
        harness::run(job, ws, args.rep.reps, true)
    } else {
        harness::run(TransferVsFio(job), ws, args.rep.reps, args.fio.vs_fio)
    }
}

/// The transfer job compared with the lockstep pull (`--vs-lockstep`).
struct TransferJob<'a> {
    args: &'a TransferArgs,
    cfg: TransferConfig,
    fio_version: Option<String>,
    read: FioFile,
    write: FioFile,
    /// Filled by `start`.
    source: Option<Source>,
    /// The lockstep pull's config and (if its chunk size differs from
    /// ours) its own source, filled by `start`.
    lockstep: Option<TransferConfig>,
    lockstep_source: Option<Source>,
}

/// The transfer job compared with fio's copy (`--vs-fio`, or alone).
struct TransferVsFio<'a>(TransferJob<'a>);

impl TransferJob<'_> {
    fn fill(&mut self) -> Result<(), BenchError> {
        eprintln!(
            "ringlog-bench: filling the source with {} (un-timed)",
            Bytes(self.args.size)
        );
        self.source = Some(Source::fill(&self.cfg)?);
        if let Some(l) = &self.lockstep {
            if l.chunk_size != self.cfg.chunk_size {
                eprintln!(
                    "ringlog-bench: filling the lockstep source ({} chunks) with {} (un-timed)",
                    Bytes(u64::from(l.chunk_size)),
                    Bytes(self.args.size)
                );
                self.lockstep_source = Some(Source::fill(l)?);
            }
        }
        Ok(())
    }

    fn windowed(&mut self, rep: RepNo) -> Result<TransferResult, BenchError> {
        let source = self.source.as_mut().expect(STARTED);
        let result = source.transfer(&self.cfg)?;
        if !(rep.last() && self.args.data.keep) {
            remove_if_exists(&self.cfg.receiver_dir())?;
        }
        Ok(result)
    }

    fn fio(&mut self) -> Result<FioTransferResult, BenchError> {
        let size_bytes = self.source.as_ref().expect(STARTED).bytes();
        let (read_file, write_file) = (self.read.path.clone(), self.write.path.clone());
        let job = fio::TransferJob {
            read_file: &read_file,
            write_file: &write_file,
            block_size_bytes: self.args.chunk_size,
            size_bytes,
            iodepth: self.cfg.window as u32,
        };
        let need = job.effective_size_bytes();
        self.read.prepare(FioLayout::Prewritten, need)?;
        self.write.prepare(self.args.fio.fio_layout, need)?;
        Ok(job.run()?)
    }

    fn close(&mut self) -> Result<(), BenchError> {
        let lockstep = self.lockstep_source.take().map(Source::close);
        let main = self.source.take().map(Source::close);
        lockstep.transpose()?;
        main.transpose()?;
        Ok(())
    }
}

impl Job for TransferJob<'_> {
    type Ours = TransferResult;
    type Theirs = TransferBaseline;
    const NAME: &'static str = "transfer";
    const LABELS: [&'static str; 2] = ["ringlog windowed transfer", "lockstep transfer"];
    const COMPARISON: Option<Comparison> = Some(TRANSFER_VS_LOCKSTEP);

    fn start(&mut self) -> Result<(), BenchError> {
        self.fill()
    }

    fn ours(&mut self, rep: RepNo) -> Result<TransferResult, BenchError> {
        self.windowed(rep)
    }

    fn theirs(&mut self, rep: RepNo, _: &TransferResult) -> Result<TransferBaseline, BenchError> {
        let cfg = self.lockstep.as_ref().expect("--vs-lockstep sets it");
        let source = match self.lockstep_source.as_mut() {
            Some(own) => own,
            None => self.source.as_mut().expect(STARTED),
        };
        let result = source.lockstep(cfg)?;
        if !(rep.last() && self.args.data.keep) {
            remove_if_exists(&cfg.receiver_dir())?;
        }
        Ok(TransferBaseline::Lockstep(result))
    }

    fn stop(&mut self) -> Result<(), BenchError> {
        self.close()
    }

    fn header(&self) -> Header {
        self.transfer_header()
    }
}

impl Job for TransferVsFio<'_> {
    type Ours = TransferResult;
    type Theirs = TransferBaseline;
    const NAME: &'static str = "transfer";
    const LABELS: [&'static str; 2] = ["ringlog transfer", "fio transfer"];
    const COMPARISON: Option<Comparison> = Some(TRANSFER_VS_FIO);

    fn start(&mut self) -> Result<(), BenchError> {
        self.0.fill()
    }

    fn ours(&mut self, rep: RepNo) -> Result<TransferResult, BenchError> {
        self.0.windowed(rep)
    }

    fn theirs(&mut self, _: RepNo, _: &TransferResult) -> Result<TransferBaseline, BenchError> {
        Ok(TransferBaseline::Fio(self.0.fio()?))
    }

    fn stop(&mut self) -> Result<(), BenchError> {
        self.0.close()
    }

    fn header(&self) -> Header {
        self.0.transfer_header()
    }
}

impl TransferJob<'_> {
    fn transfer_header(&self) -> Header {
        let args = self.args;
        let mut settings = vec![
            ("dir", self.cfg.dir.display().to_string()),
            ("size", Bytes(args.size).to_string()),
            ("segment_size", Bytes(args.segment_size).to_string()),
            ("chunk_size", Bytes(args.chunk_size).to_string()),
            ("window", self.cfg.window.to_string()),
            ("batch_size", Bytes(args.batch_size).to_string()),
            ("record_size", Bytes(args.record_size).to_string()),
            ("delay_ms", args.delay_ms.to_string()),
            ("reps", args.rep.reps.to_string()),
        ];
        let mut notes = vec![
            "the source is filled once, un-timed, committed and its active segment sealed; each \
             rep transfers into a freshly created receiver (creation and close un-timed)"
                .to_owned(),
            format!(
                "ringlog runs the replica's transfer machines (receiver and server) over the \
                 pipelined executor, both stores on one io_uring ring: up to --window {} chunks \
                 requested at once; the server reads the next chunks while earlier ones are on \
                 the wire and being written",
                self.cfg.window
            ),
            format!(
                "delay line: every request and reply is held {} ms each way in process (round \
                 trip {} ms); not TCP (`transfer --processes` runs one between server \
                 processes over loopback TCP)",
                args.delay_ms,
                2 * args.delay_ms
            ),
            "receiver memory = peak bytes of chunk buffers the receiver held (its install's \
             staging buffers: parked, being written, idle; plus a delivered chunk not yet \
             staged), sampled after every staging op; a run over window x chunk size + 1 chunk \
             fails"
                .to_owned(),
        ];
        if args.vs_lockstep {
            notes.push(
                "lockstep: one 256KiB chunk requested, read, sent back and written before the \
                 next, over the same delay line (filled into a source of its own when \
                 --chunk-size differs)"
                    .to_owned(),
            );
        }
        if args.fio.vs_fio {
            settings.push(("fio_layout", layout_name(args.fio.fio_layout)));
            notes.push(format!(
                "fio keeps iodepth={} I/Os in flight and reads everything before it writes; \
                 ringlog also hashes every chunk on both sides and parses every batch on the \
                 receiver",
                self.cfg.window
            ));
            notes.push(match args.fio.fio_layout {
                FioLayout::Prewritten => "fio's write job overwrites a pre-written file (laid out \
                    un-timed), while ringlog's receiver writes newly created staging files: \
                    overwrites run up to ~2x faster than fresh writes here, so the throughput \
                    ratio understates ringlog"
                    .to_owned(),
                FioLayout::Fresh => "fio's write file is deleted before each rep, so both sides \
                    write into fresh space"
                    .to_owned(),
            });
        }
        Header {
            settings,
            fio_version: self.fio_version.clone(),
            notes,
        }
    }
}

/// Runs the fetch job (and fio) and cleans up; the report is not printed.
fn fetch_report(args: &FetchArgs) -> Result<Report<FetchResult, FioFetchResult>, BenchError> {
    check_segment_size(args.segment_size, args.batch.batch_size)?;
    if args.size == 0 || args.read_size == 0 {
        return Err(BenchError::Usage(
            "--size and --read-size must be positive".into(),
        ));
    }
    let fio_version = fio_version(args.vs_fio)?;
    let dir = &args.data.dir;
    let cfg = FetchConfig {
        dir: dir.clone(),
        total_bytes: args.size,
        batch_size: to_usize("--batch-size", args.batch.batch_size)?,
        record_size: to_usize("--record-size", args.batch.record_size)?,
        segment_size: args.segment_size,
        read_bytes: to_usize("--read-size", args.read_size)?,
        pattern: match args.pattern {
            ReadPattern::Seq => Pattern::Sequential,
            ReadPattern::Rand => Pattern::Random,
        },
        duration: args.duration,
        read_total_bytes: args.io_size,
        ramp: args.ramp_time,
        seed: 0x5EED,
    };
    let fio_file = FioFile::new(dir.join("fio-fetch.dat"));
    let paths = vec![cfg.store_dir(), fio_file.path.clone()];
    let ws = Workspace::create(dir, args.data.keep, paths)?;
    let job = FetchJob {
        args,
        cfg,
        fio_version,
        fio_file,
        store: None,
    };
    harness::run(job, ws, args.rep.reps, args.vs_fio)
}

struct FetchJob<'a> {
    args: &'a FetchArgs,
    cfg: FetchConfig,
    fio_version: Option<String>,
    fio_file: FioFile,
    /// Filled by `start`.
    store: Option<jobs::fetch::Store>,
}

impl Job for FetchJob<'_> {
    type Ours = FetchResult;
    type Theirs = FioFetchResult;
    const NAME: &'static str = "fetch";
    const LABELS: [&'static str; 2] = ["ringlog fetch", "fio fetch"];
    const COMPARISON: Option<Comparison> = Some(FETCH_VS_FIO);

    fn planned(&self) -> Option<Duration> {
        Some(self.cfg.ramp + self.cfg.duration)
    }

    fn start(&mut self) -> Result<(), BenchError> {
        eprintln!(
            "ringlog-bench: filling the store with {} (un-timed)",
            Bytes(self.args.size)
        );
        self.store = Some(jobs::fetch::Store::fill(&self.cfg)?);
        Ok(())
    }

    fn ours(&mut self, _: RepNo) -> Result<FetchResult, BenchError> {
        let store = self.store.as_mut().expect(STARTED);
        Ok(store.run(&self.cfg)?)
    }

    fn theirs(&mut self, _: RepNo, _: &FetchResult) -> Result<FioFetchResult, BenchError> {
        let size_bytes = self.store.as_ref().expect(STARTED).log_bytes();
        let file = self.fio_file.path.clone();
        let job = fio::FetchJob {
            file: &file,
            block_size_bytes: self.args.read_size,
            size_bytes,
            random: self.args.pattern == ReadPattern::Rand,
            runtime: self.cfg.duration,
            io_bytes: self.args.io_size,
            ramp: self.cfg.ramp,
        };
        self.fio_file
            .prepare(FioLayout::Prewritten, job.effective_size_bytes())?;
        Ok(job.run()?)
    }

    fn stop(&mut self) -> Result<(), BenchError> {
        match self.store.take() {
            Some(store) => Ok(store.close()?),
            None => Ok(()),
        }
    }

    fn header(&self) -> Header {
        let args = self.args;
        let mut settings = vec![
            ("dir", self.cfg.dir.display().to_string()),
            ("size", Bytes(args.size).to_string()),
            ("batch_size", Bytes(args.batch.batch_size).to_string()),
            ("record_size", Bytes(args.batch.record_size).to_string()),
            ("segment_size", Bytes(args.segment_size).to_string()),
            ("read_size", Bytes(args.read_size).to_string()),
            ("pattern", format!("{:?}", args.pattern).to_lowercase()),
            ("duration", Secs(args.duration).to_string()),
        ];
        if let Some(n) = args.io_size {
            settings.push(("io_size", Bytes(n).to_string()));
        }
        if !args.ramp_time.is_zero() {
            settings.push(("ramp_time", Secs(args.ramp_time).to_string()));
        }
        settings.push(("reps", args.rep.reps.to_string()));
        let mut notes = vec![
            "the store is filled once, un-timed, and flushed; every rep reads it \
             (O_DIRECT, no page cache on either side)"
                .to_owned(),
        ];
        if args.vs_fio {
            notes.push(
                "fio reads a file laid out once (un-timed) with bs = --read-size rounded up to \
                 4KiB, iodepth=1; ringlog returns whole batches up to --read-size, verifying each"
                    .to_owned(),
            );
        }
        Header {
            settings,
            fio_version: self.fio_version.clone(),
            notes,
        }
    }
}

#[cfg(test)]
mod testutil;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{append, assert_has, data_dir, fetch, transfer};
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn append_defaults_and_sizes() {
        let a = append("append");
        assert_eq!(a.data.dir, PathBuf::from("./bench-data"));
        assert_eq!(a.partitions, 1);
        assert_eq!(a.batch.batch_size, 64 << 10);
        assert_eq!(a.batch.record_size, 1 << 10);
        assert_eq!(a.duration, Duration::from_secs(10));
        assert_eq!(a.size, None);
        assert_eq!(a.segment_size, 256 << 20);
        assert!(!a.fio.vs_fio && !a.data.keep);
        assert_eq!(a.rep.reps, 1);
        assert_eq!(a.rep.output_format, OutputFormat::Text);

        let a = append("append --batch-size 1m --size 1g --vs-fio --reps 3 --output-format json");
        assert_eq!(a.batch.batch_size, 1 << 20);
        assert_eq!(a.size, Some(1 << 30));
        assert!(a.fio.vs_fio);
        assert_eq!(a.rep.reps, 3);
        assert_eq!(a.rep.output_format, OutputFormat::Json);
    }

    #[test]
    fn bad_sizes_are_rejected_by_the_cli() {
        let err = Cli::try_parse_from(["ringlog-bench", "append", "--batch-size", "64x"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown suffix"), "{err}");
        assert!(Cli::try_parse_from(["ringlog-bench", "append", "--partitions", "0"]).is_err());
        for bad in ["0", "0s", "5x", "1.5s"] {
            let argv = ["ringlog-bench", "append", "--duration", bad];
            let err = Cli::try_parse_from(argv).unwrap_err().to_string();
            assert!(err.contains("duration"), "{bad}: {err}");
        }
        let a = append("append --duration 500ms --ramp-time 2m");
        assert_eq!(a.duration, Duration::from_millis(500));
        assert_eq!(a.ramp_time, Duration::from_secs(120));
    }

    /// End to end on the real disk: ringlog append, fio layout and fio run,
    /// report in both formats. Needs fio (ci/install-deps).
    #[test]
    fn append_vs_fio_smoke() {
        let (_tmp, dir) = data_dir();
        let args = append(&format!(
            "append --dir {} --duration 1 --size 4m --segment-size 1m --retention 2m \
             --warmup 4m --vs-fio --reps 2",
            dir.display()
        ));
        let report = append_report(&args).unwrap();
        assert!(!dir.exists(), "data dir is removed without --keep");
        let v = report.json();
        report::assert_fio_shape(&v, true, &["throughput", "p99_ack_latency"]);
        // The kernel splits CPU time into usr and sys by tick samples, so a
        // short run may show all of it as sys; only their sum is exact.
        let cpu = |k: &str| v["jobs"][0][k].as_f64().unwrap();
        assert!(cpu("usr_cpu") >= 0.0 && cpu("sys_cpu") >= 0.0);
        assert!(cpu("usr_cpu") + cpu("sys_cpu") > 0.0);
        assert!(v["jobs"][0]["write"]["io_bytes"].as_u64().unwrap() > 0);
        assert_eq!(v["jobs"][1]["engine"], "fio");
        assert!(v["jobs"][1]["sync"]["lat_ns"]["N"].as_u64().unwrap() > 0);
        assert_has(
            &report.text(),
            &["    cpu: usr=", "rep 2/2", "fio append: bw="],
        );
    }

    #[test]
    fn transfer_defaults_and_sizes() {
        let t = transfer("transfer");
        assert_eq!(t.data.dir, PathBuf::from("./bench-data"));
        assert_eq!(t.size, 512 << 20);
        assert_eq!(t.segment_size, 256 << 20);
        assert_eq!(t.chunk_size, 1 << 20);
        assert_eq!(t.window, None);
        assert_eq!(t.batch_size, 1 << 20);
        assert_eq!(t.rep.reps, 1);
        assert!(!t.fio.vs_fio && !t.data.keep);
        assert_eq!(t.fio.fio_layout, FioLayout::Prewritten);
        assert_eq!(t.rep.output_format, OutputFormat::Text);
        assert_eq!(t.delay_ms, 0);
        assert!(!t.vs_lockstep);

        let t = transfer(
            "transfer --size 1g --chunk-size 256k --window 8 --vs-fio --output-format json",
        );
        assert_eq!(t.size, 1 << 30);
        assert_eq!(t.chunk_size, 256 << 10);
        assert_eq!(t.window, Some(8));
        assert!(t.fio.vs_fio);
        assert_eq!(t.rep.output_format, OutputFormat::Json);
        assert!(Cli::try_parse_from(["ringlog-bench", "transfer", "--window", "0"]).is_err());
    }

    #[test]
    fn bad_transfer_settings_are_usage_errors() {
        let (_tmp, dir) = data_dir();
        for bad in [
            "--chunk-size 5000",
            "--chunk-size 32m",
            "--segment-size 4m --batch-size 8m",
            "--window 1",
            "--window 257",
        ] {
            let t = transfer(&format!("transfer --dir {} {bad}", dir.display()));
            let got = transfer_report(&t);
            assert!(matches!(got, Err(BenchError::Usage(_))), "{bad}");
        }
        assert!(!dir.exists(), "nothing is created for a usage error");
    }

    /// End to end on the real disk: a small transfer against fio, text and
    /// JSON reports with the ratios. Needs fio (ci/install-deps).
    #[test]
    fn transfer_vs_fio_smoke() {
        let (_tmp, dir) = data_dir();
        let args = transfer(&format!(
            "transfer --dir {} --size 16m --segment-size 4m --chunk-size 256k --batch-size 64k \
             --vs-fio --reps 2",
            dir.display()
        ));
        let report = transfer_report(&args).unwrap();
        assert!(!dir.exists(), "data dir is removed without --keep");

        assert_eq!(report.reps.len(), 2);
        for rep in &report.reps {
            assert_eq!(rep.ours.summary.bytes, 16 << 20);
            assert_eq!(rep.ours.artifacts, 4);
            assert_eq!(rep.ours.summary.ios, 64);
            let Some(TransferBaseline::Fio(fio)) = rep.theirs.as_ref() else {
                panic!("fio ran");
            };
            assert_eq!(fio.read.bytes, 16 << 20);
            assert_eq!(fio.write.bytes, 16 << 20);
            assert!(rep.ours.receiver_peak_bytes <= rep.ours.receiver_bound_bytes);
        }
        assert_has(
            &report.text(),
            &[
                "ringlog transfer: bw=",
                "fio transfer: bw=",
                "ratio throughput ringlog/fio = ",
                "(median of 2 reps, min ",
                "ratio p99 chunk latency ringlog/fio = ",
            ],
        );
        let v = report.json();
        assert_eq!(v["ratios"]["throughput"]["reps"], 2);
        assert_eq!(v["jobs"][0]["transfer"]["io_bytes"], 16u64 << 20);
        assert_eq!(v["jobs"][1]["baseline"], "fio");
        assert!(v["jobs"][0]["receiver_peak_bytes"].is_u64());
        report::assert_fio_shape(&v, true, &["throughput", "p99_chunk_latency"]);
    }

    /// End to end with the delay line: the windowed transfer against the
    /// lockstep 256 KiB pull at 2 ms each way (the CI smoke of
    /// `--delay-ms` and `--vs-lockstep`).
    #[test]
    fn transfer_vs_lockstep_with_delay_smoke() {
        let (_tmp, dir) = data_dir();
        let args = transfer(&format!(
            "transfer --dir {} --size 8m --segment-size 4m --chunk-size 512k --window 4 \
             --batch-size 64k --delay-ms 10 --vs-lockstep --reps 1",
            dir.display()
        ));
        let report = transfer_report(&args).unwrap();
        assert!(!dir.exists(), "data dir is removed without --keep");
        let rep = &report.reps[0];
        assert_eq!(rep.ours.summary.bytes, 8 << 20);
        assert_eq!(rep.ours.summary.ios, 16);
        let Some(TransferBaseline::Lockstep(l)) = rep.theirs.as_ref() else {
            panic!("the lockstep pull ran");
        };
        // Its own source, of 256 KiB chunks.
        assert_eq!(l.summary.ios, 32);
        assert_eq!(l.chunk_size, 256 << 10);
        // 32 round trips of 20 ms against 4 of 2 MiB each: the window wins
        // by far more than the noise of a shared machine.
        let ratio = report.ratios().unwrap().throughput.median;
        assert!(ratio > 2.0, "windowed/lockstep {ratio}");
        assert_has(
            &report.text(),
            &[
                "ringlog windowed transfer: bw=",
                "lockstep transfer: bw=",
                "delay 10 ms each way (in process, not TCP)",
                "receiver memory: peak ",
                "ratio throughput windowed/lockstep = ",
            ],
        );
        assert_eq!(report.json()["jobs"][1]["baseline"], "lockstep");
        assert!(
            Cli::try_parse_from(["ringlog-bench", "transfer", "--vs-fio", "--vs-lockstep"])
                .is_err()
        );
    }

    #[test]
    fn fetch_defaults() {
        let f = fetch("fetch");
        assert_eq!(f.size, 256 << 20);
        assert_eq!(f.batch.batch_size, 64 << 10);
        assert_eq!(f.read_size, 1 << 20);
        assert_eq!(f.pattern, ReadPattern::Seq);
        assert!(f.ramp_time.is_zero());
        assert!(!f.vs_fio);
        let f = fetch("fetch --pattern rand --ramp-time 2 --io-size 1g --duration 1500ms");
        assert_eq!(f.pattern, ReadPattern::Rand);
        assert_eq!(f.ramp_time, Duration::from_secs(2));
        assert_eq!(f.duration, Duration::from_millis(1500));
        assert_eq!(f.io_size, Some(1 << 30));
    }

    /// End to end on the real disk: sequential reads against fio's
    /// sequential reads, then random reads with a ramp. Needs fio.
    #[test]
    fn fetch_vs_fio_smoke() {
        let (_tmp, dir) = data_dir();
        let args = fetch(&format!(
            "fetch --dir {} --size 8m --segment-size 4m --read-size 256k --duration 1s \
             --io-size 32m --vs-fio --reps 2",
            dir.display()
        ));
        let report = fetch_report(&args).unwrap_or_else(|e| panic!("{e}"));
        assert!(!dir.exists(), "data dir is removed without --keep");
        assert_eq!(report.reps.len(), 2);
        for rep in &report.reps {
            let r = &rep.ours;
            assert!(r.summary.bytes >= 32 << 20 || r.summary.runtime.as_secs() >= 1);
            assert_eq!(r.empty_reads, 0);
            // Whole 64 KiB batches, up to 256 KiB per read.
            assert_eq!(r.summary.bytes % (64 << 10), 0);
            assert!(r.summary.bytes <= r.summary.ios * (256 << 10));
            assert!(r.records > 0);
            assert!(!r.summary.timeline.is_empty());
            let f = rep.theirs.as_ref().unwrap();
            assert!(f.read.bytes > 0 && f.read.cpu.is_some());
        }
        assert_has(
            &report.text(),
            &[
                "ringlog-bench fetch: dir=",
                "ringlog fetch: bw=",
                "reads/s=",
                "read lat percentiles (usec): 50=",
                "fio fetch: bw=",
                "--rw=read",
                "ratio throughput ringlog/fio = ",
                "ratio p99 read latency ringlog/fio = ",
                "    cpu: usr=",
            ],
        );
        let v = report.json();
        assert_eq!(v["jobs"][0]["jobname"], "fetch");
        assert_eq!(v["jobs"][1]["engine"], "fio");
        report::assert_fio_shape(&v, true, &["throughput", "p99_read_latency"]);

        let args = fetch(&format!(
            "fetch --dir {} --size 4m --segment-size 1m --batch-size 16k --read-size 64k \
             --pattern rand --duration 700ms --ramp-time 300ms",
            dir.display()
        ));
        let report = fetch_report(&args).unwrap_or_else(|e| panic!("{e}"));
        let r = &report.reps[0].ours;
        assert!(r.summary.ios > 0 && r.empty_reads == 0);
        assert_has(
            &report.text(),
            &["pattern=rand", "duration=700ms ramp_time=300ms"],
        );
        assert!(report.ratios().is_none());
        assert!(!dir.exists());
    }

    /// A job file with two jobs (append, then fetch) runs both in order;
    /// one JSON document holds both jobs' results; --plot draws them.
    #[test]
    fn job_file_runs_every_job_and_plots() {
        let (tmp, dir) = data_dir();
        let file = tmp.path().join("jobs.ini");
        fs::write(
            &file,
            format!(
                "; append, then fetch\n[global]\ndir={}\nduration=1\nsegment_size=1m\n\
                 output-format=json\n\n[append]\nsize=2m\nramp-time=1\n\n\
                 [fetch-seq]\njob=fetch\nsize=2m\nread-size=128k\nio-size=8m\n",
                dir.display()
            ),
        )
        .unwrap();
        let runs = jobfile::run_file(&file).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(runs.len(), 2);
        assert_eq!(runs[0].section.as_deref(), Some("append"));
        assert_eq!(runs[1].section.as_deref(), Some("fetch-seq"));
        assert!(runs.iter().all(|r| r.format == OutputFormat::Json));
        let v = jobfile::json(&runs);
        report::assert_fio_shape(&v, true, &[]);
        assert_eq!(v["jobs"][0]["jobname"], "append");
        assert_eq!(v["jobs"][0]["section"], "append");
        assert_eq!(v["jobs"][1]["jobname"], "fetch");
        assert_eq!(v["jobs"][1]["section"], "fetch-seq");
        assert_eq!(v["reports"][0]["global options"]["ramp_time"], "1s");
        assert_eq!(v["reports"][1]["global options"]["read_size"], "128KiB");
        let text = jobfile::text(&runs);
        assert!(
            text.starts_with("[append]\nringlog-bench append: "),
            "{text}"
        );
        assert_has(&text, &["\n[fetch-seq]\nringlog-bench fetch: "]);

        let svg = tmp.path().join("plot.svg");
        output(&runs, Some(&svg)).unwrap();
        let svg = fs::read_to_string(&svg).unwrap();
        assert!(svg.starts_with("<svg "), "{svg}");
        assert!(svg.trim_end().ends_with("</svg>"));
        assert_has(
            &svg,
            &["[append] ringlog append", "[fetch-seq] ringlog fetch"],
        );
        assert!(!dir.exists(), "data dir is removed without --keep");

        // The CLI takes --job-file and --plot (before or after a job).
        let cli = Cli::try_parse_from(["ringlog-bench", "--job-file", "x.ini", "--plot", "p.svg"])
            .unwrap();
        assert!(cli.command.is_none() && cli.plot.is_some());
        let cli = Cli::try_parse_from(["ringlog-bench", "fetch", "--plot", "p.svg"]).unwrap();
        assert!(cli.plot.is_some());
        assert!(Cli::try_parse_from(["ringlog-bench"]).is_err());
        assert!(Cli::try_parse_from(["ringlog-bench", "--job-file", "x", "fetch"]).is_err());
    }

    #[test]
    fn transfer_keep_leaves_the_stores_and_fio_files() {
        let (_tmp, dir) = data_dir();
        let args = transfer(&format!(
            "transfer --dir {} --size 2m --segment-size 1m --batch-size 64k --chunk-size 64k \
             --keep",
            dir.display()
        ));
        let report = transfer_report(&args).unwrap();
        assert!(report.ratios().is_none());
        assert!(dir.join("src").is_dir() && dir.join("dst").is_dir());
        // A second run refuses to reuse them.
        assert!(matches!(transfer_report(&args), Err(BenchError::Usage(_))));
    }
}
