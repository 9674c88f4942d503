//! ringlog-bench: fio-style benchmark harness for ringlog.
//!
//! `ringlog-bench append` drives partition stores directly (no server) and,
//! with `--vs-fio`, runs the equivalent fio job on the same filesystem in
//! alternation (ringlog, fio, ringlog, fio, ...) and reports the ratios.
//!
//! `ringlog-bench transfer` moves a partition log from one store to an empty
//! one through the snapshot API (state transfer) and, with `--vs-fio`,
//! compares it with fio reading the same bytes from one file and writing
//! them to another.
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
//! `ringlog-bench --job-file FILE` runs the jobs of an fio-style ini file
//! ([`jobfile`]) in order; `--plot FILE.svg` draws throughput over time and
//! latency percentiles of every run ([`plot`]).

mod fio;
mod jobfile;
mod jobs;
mod plot;
mod report;
mod server_bench;
mod size;
mod stats;

use std::fs;
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};

use crate::fio::FioError;
use crate::jobs::append::{AppendConfig, AppendError};
use crate::jobs::fetch::{FetchConfig, FetchJobError, Pattern};
use crate::jobs::produce::ClientJobError;
use crate::jobs::server::ServerError;
use crate::jobs::transfer::{Source, TransferConfig, TransferJobError};
use crate::report::{FetchRep, FetchReport, JobReport, Rep, Report, TransferRep, TransferReport};
use crate::server_bench::{consume_report, produce_report};
use crate::size::{parse_size, Bytes};

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
}

#[derive(Debug, clap::Args)]
pub(crate) struct PartitionsArgs {
    /// The `ringlog` binary to start [default: next to ringlog-bench].
    #[arg(long)]
    server_bin: Option<PathBuf>,
    /// Shards of the server (0: one per core).
    #[arg(long, default_value_t = 0)]
    shards: u32,
    /// Directory for the server's data (created; removed at the end unless
    /// --keep). Put it on the filesystem you want to measure.
    #[arg(long, default_value = "./bench-data")]
    dir: PathBuf,
    /// Keep the data directory.
    #[arg(long)]
    keep: bool,
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
    /// Directory for the data (created; removed at the end unless --keep).
    /// Put it on the filesystem you want to measure.
    #[arg(long, default_value = "./bench-data")]
    dir: PathBuf,
    /// Keep the data directory (the store and fio's file).
    #[arg(long)]
    keep: bool,
    /// Bytes of log appended (un-timed, rounded up to whole batches) before
    /// reading; fio reads a file of this size.
    #[arg(long, default_value = "256m", value_parser = parse_size)]
    size: u64,
    /// Encoded bytes of each batch in the log.
    #[arg(long, default_value = "64k", value_parser = parse_size)]
    batch_size: u64,
    /// Value bytes of each record in a batch.
    #[arg(long, default_value = "1k", value_parser = parse_size)]
    record_size: u64,
    /// Segment size of the store.
    #[arg(long, default_value = "256m", value_parser = parse_size)]
    segment_size: u64,
    /// max_bytes of each read (fio's bs, rounded up to 4 KiB).
    #[arg(long, default_value = "1m", value_parser = parse_size)]
    read_size: u64,
    /// Offsets read: seq or rand.
    #[arg(long, value_enum, default_value_t = ReadPattern::Seq)]
    pattern: ReadPattern,
    /// Seconds per run (ringlog and fio each).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    duration: u64,
    /// Stop a run after reading this many bytes, if that comes before
    /// --duration (fio's io_size).
    #[arg(long, value_parser = parse_size)]
    io_size: Option<u64>,
    /// Seconds of un-timed reads before each timed run (fio's ramp_time).
    #[arg(long, default_value_t = 0)]
    ramp_time: u64,
    /// Also run the equivalent fio job and report ringlog/fio ratios.
    #[arg(long)]
    vs_fio: bool,
    /// Repetitions; with --vs-fio they alternate ringlog, fio, ringlog, ...
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
    reps: u32,
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    output_format: OutputFormat,
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
    /// Directory for the data (created; removed at the end unless --keep).
    /// Put it on the filesystem you want to measure.
    #[arg(long, default_value = "./bench-data")]
    dir: PathBuf,
    /// Keep the data directory (ringlog's last rep and fio's file).
    #[arg(long)]
    keep: bool,
    /// Partitions appended to in each group commit.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=4096))]
    partitions: u32,
    /// Encoded bytes of each batch (header included): 4096, 64k, 1m.
    #[arg(long, default_value = "64k", value_parser = parse_size)]
    batch_size: u64,
    /// Value bytes of each record in a batch.
    #[arg(long, default_value = "1k", value_parser = parse_size)]
    record_size: u64,
    /// Seconds per run (ringlog and fio each).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    duration: u64,
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
    /// Seconds of un-timed appends (after --warmup) before each timed
    /// ringlog run (fio's ramp_time; fio's append overwrites a laid-out
    /// file and runs without one).
    #[arg(long, default_value_t = 0)]
    ramp_time: u64,
    /// Also run the equivalent fio job and report ringlog/fio ratios.
    #[arg(long)]
    vs_fio: bool,
    /// With --vs-fio, how the fio file is prepared.
    #[arg(long, value_enum, default_value_t = FioLayout::Prewritten)]
    fio_layout: FioLayout,
    /// Repetitions; with --vs-fio they alternate ringlog, fio, ringlog, ...
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
    reps: u32,
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    output_format: OutputFormat,
}

#[derive(Debug, clap::Args)]
struct TransferArgs {
    /// Directory for the data (created; removed at the end unless --keep).
    /// Put it on the filesystem you want to measure.
    #[arg(long, default_value = "./bench-data")]
    dir: PathBuf,
    /// Keep the data directory (both stores and fio's files).
    #[arg(long)]
    keep: bool,
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
    /// Chunks in flight: up to N chunks are read from the source, then
    /// written into the receiver (fio's iodepth).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=1024))]
    window: u32,
    /// Encoded bytes of each batch of the source's log.
    #[arg(long, default_value = "1m", value_parser = parse_size)]
    batch_size: u64,
    /// Value bytes of each record in a batch.
    #[arg(long, default_value = "1k", value_parser = parse_size)]
    record_size: u64,
    /// Also run the equivalent fio jobs and report ringlog/fio ratios.
    #[arg(long)]
    vs_fio: bool,
    /// With --vs-fio, how fio's write file is prepared (its read file is
    /// always written beforehand).
    #[arg(long, value_enum, default_value_t = FioLayout::Prewritten)]
    fio_layout: FioLayout,
    /// Repetitions; with --vs-fio they alternate ringlog, fio, ringlog, ...
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
    reps: u32,
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    output_format: OutputFormat,
}

/// The server and client settings shared by `produce` and `consume`.
#[derive(Debug, clap::Args)]
struct ServerClientArgs {
    /// Use the server at HOST:PORT instead of starting one.
    #[arg(long)]
    addr: Option<String>,
    /// The `ringlog` binary to start [default: next to ringlog-bench].
    #[arg(long, conflicts_with = "addr")]
    server_bin: Option<PathBuf>,
    /// Shards of the started server (0: one per core).
    #[arg(long, default_value_t = 0, conflicts_with = "addr")]
    shards: u32,
    /// Directory for the started server's data (created; removed at the end
    /// unless --keep). Put it on the filesystem you want to measure.
    #[arg(long, default_value = "./bench-data")]
    dir: PathBuf,
    /// Keep the data directory and the topics.
    #[arg(long)]
    keep: bool,
    /// Segment size of the started server's partitions.
    #[arg(long, default_value = "256m", value_parser = parse_size)]
    segment_size: u64,
    /// Topic name (produce: one topic per rep, `<topic>-<rep>`).
    #[arg(long, default_value = "bench")]
    topic: String,
    /// Partitions of the topic [default: --connections].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4096))]
    partitions: Option<u32>,
    /// Client connections, one thread each, one request in flight each.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    connections: u32,
    /// Encoded bytes of each produced batch (header included).
    #[arg(long, default_value = "64k", value_parser = parse_size)]
    batch_size: u64,
    /// Value bytes of each record in a batch.
    #[arg(long, default_value = "1k", value_parser = parse_size)]
    record_size: u64,
    /// Repetitions.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
    reps: u32,
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    output_format: OutputFormat,
}

impl ServerClientArgs {
    fn partitions(&self) -> u32 {
        self.partitions.unwrap_or(self.connections)
    }

    fn server_dir(&self) -> PathBuf {
        self.dir.join("server")
    }
}

#[derive(Debug, clap::Args)]
struct ProduceArgs {
    #[command(flatten)]
    common: ServerClientArgs,
    /// Seconds per run (produce and append each).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    duration: u64,
    /// Stop a run after this many bytes (over all connections) if that comes
    /// before --duration.
    #[arg(long, value_parser = parse_size)]
    size: Option<u64>,
    /// Also run the storage-level append job (one partition per connection,
    /// same batch size and duration, in --dir) alternately with produce and
    /// report produce/append ratios.
    #[arg(long)]
    vs_append: bool,
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
        Command::Append(args) => (args.output_format, Box::new(append_report(&args)?)),
        Command::Transfer(args) => (args.output_format, Box::new(transfer_report(&args)?)),
        Command::Produce(args) => (args.common.output_format, Box::new(produce_report(&args)?)),
        Command::Consume(args) => (args.common.output_format, Box::new(consume_report(&args)?)),
        Command::Fetch(args) => (args.output_format, Box::new(fetch_report(&args)?)),
        Command::Partitions(args) => (
            args.output_format,
            Box::new(server_bench::partitions_report(&args)?),
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
        let series: Vec<(String, &stats::RunSummary)> = runs
            .iter()
            .flat_map(|r| {
                r.report.series().into_iter().map(move |(name, run)| {
                    let name = match &r.section {
                        Some(section) => format!("[{section}] {name}"),
                        None => name,
                    };
                    (name, run)
                })
            })
            .collect();
        fs::write(file, plot::svg(&series)).map_err(fs_err("write", file))?;
    }
    if let [run] = runs {
        if run.section.is_none() {
            return print_report(format, || run.report.text(), || run.report.json());
        }
    }
    print_report(format, || jobfile::text(runs), || jobfile::json(runs))
}

fn to_usize(what: &str, v: u64) -> Result<usize, BenchError> {
    usize::try_from(v).map_err(|_| BenchError::Usage(format!("{what} {v} is too large")))
}

/// Runs the append job (and fio) and cleans up; the report is not printed.
fn append_report(args: &AppendArgs) -> Result<Report, BenchError> {
    if args.segment_size < args.batch_size {
        return Err(BenchError::Usage(format!(
            "--segment-size {} is smaller than --batch-size {}",
            Bytes(args.segment_size),
            Bytes(args.batch_size)
        )));
    }
    // Fail before any work when fio is needed and missing.
    let fio_version = if args.vs_fio {
        Some(fio::version()?)
    } else {
        None
    };

    let dir = &args.dir;
    let created_dir = !dir.exists();
    fs::create_dir_all(dir).map_err(fs_err("create", dir))?;
    let cfg = AppendConfig {
        dir: dir.clone(),
        partitions: args.partitions,
        batch_size: to_usize("--batch-size", args.batch_size)?,
        record_size: to_usize("--record-size", args.record_size)?,
        duration: Duration::from_secs(args.duration),
        total_bytes: args.size,
        segment_size: args.segment_size,
        retention_bytes: args.retention,
        warmup_bytes: args.warmup,
        ramp: Duration::from_secs(args.ramp_time),
    };
    for p in 0..cfg.partitions {
        let pdir = cfg.partition_dir(p);
        if pdir.exists() {
            return Err(BenchError::Usage(format!(
                "{} already exists (left by an earlier --keep run?); remove it or pick another --dir",
                pdir.display()
            )));
        }
    }
    let fio_file = dir.join("fio.dat");

    let result = run_reps(args, &cfg, &fio_file, fio_version);
    let cleanup = if args.keep {
        Ok(())
    } else {
        cleanup(&cfg, &fio_file, created_dir)
    };
    let report = result?;
    cleanup?;
    Ok(report)
}

fn print_report(
    format: OutputFormat,
    text: impl FnOnce() -> String,
    json: impl FnOnce() -> serde_json::Value,
) -> Result<(), BenchError> {
    let out = match format {
        OutputFormat::Text => text(),
        OutputFormat::Json => {
            let mut s =
                serde_json::to_string_pretty(&json()).expect("serde_json::Value always serialises");
            s.push('\n');
            s
        }
    };
    io::stdout()
        .lock()
        .write_all(out.as_bytes())
        .map_err(BenchError::Output)
}

/// Runs the transfer job (and fio) and cleans up; the report is not printed.
fn transfer_report(args: &TransferArgs) -> Result<TransferReport, BenchError> {
    let chunk_size = u32::try_from(args.chunk_size)
        .ok()
        .filter(|c| *c > 0 && c % 4096 == 0 && *c <= 16 << 20)
        .ok_or_else(|| {
            BenchError::Usage(format!(
                "--chunk-size {} must be a positive multiple of 4KiB, at most 16MiB",
                Bytes(args.chunk_size)
            ))
        })?;
    if args.segment_size < args.batch_size {
        return Err(BenchError::Usage(format!(
            "--segment-size {} is smaller than --batch-size {}",
            Bytes(args.segment_size),
            Bytes(args.batch_size)
        )));
    }
    if args.size == 0 {
        return Err(BenchError::Usage("--size must be positive".into()));
    }
    let fio_version = if args.vs_fio {
        Some(fio::version()?)
    } else {
        None
    };

    let dir = &args.dir;
    let cfg = TransferConfig {
        dir: dir.clone(),
        total_bytes: args.size,
        segment_size: args.segment_size,
        chunk_size,
        window: to_usize("--window", u64::from(args.window))?,
        batch_size: to_usize("--batch-size", args.batch_size)?,
        record_size: to_usize("--record-size", args.record_size)?,
    };
    let fio_files = TransferFioFiles {
        read: dir.join("fio-read.dat"),
        write: dir.join("fio-write.dat"),
    };
    for path in [cfg.source_dir(), cfg.receiver_dir()] {
        if path.exists() {
            return Err(BenchError::Usage(format!(
                "{} already exists (left by an earlier --keep run?); remove it or pick another --dir",
                path.display()
            )));
        }
    }
    let created_dir = !dir.exists();
    fs::create_dir_all(dir).map_err(fs_err("create", dir))?;

    let result = run_transfer_reps(args, &cfg, &fio_files, fio_version);
    let cleanup = if args.keep {
        Ok(())
    } else {
        cleanup_transfer(&cfg, &fio_files, created_dir)
    };
    let report = result?;
    cleanup?;
    Ok(report)
}

struct TransferFioFiles {
    read: PathBuf,
    write: PathBuf,
}

fn run_transfer_reps(
    args: &TransferArgs,
    cfg: &TransferConfig,
    fio_files: &TransferFioFiles,
    fio_version: Option<String>,
) -> Result<TransferReport, BenchError> {
    let mut settings = vec![
        ("dir", cfg.dir.display().to_string()),
        ("size", Bytes(args.size).to_string()),
        ("segment_size", Bytes(args.segment_size).to_string()),
        ("chunk_size", Bytes(args.chunk_size).to_string()),
        ("window", args.window.to_string()),
        ("batch_size", Bytes(args.batch_size).to_string()),
        ("record_size", Bytes(args.record_size).to_string()),
        ("reps", args.reps.to_string()),
    ];
    let mut notes = vec![
        "the source is filled once, un-timed, and its active segment sealed; each rep transfers \
         into a freshly created receiver (creation and close un-timed)"
            .to_owned(),
        format!(
            "ringlog reads a window of --window {} chunks in one submission, then verifies and \
             writes them in one submission; reads and writes do not overlap",
            args.window
        ),
    ];
    if args.vs_fio {
        settings.push((
            "fio_layout",
            format!("{:?}", args.fio_layout).to_lowercase(),
        ));
        notes.push(format!(
            "fio keeps iodepth={} I/Os in flight; ringlog also hashes every chunk on both sides \
             and parses every batch on the receiver",
            args.window
        ));
        notes.push(match args.fio_layout {
            FioLayout::Prewritten => "fio's write job overwrites a pre-written file (laid out \
                un-timed), while ringlog's receiver writes newly created staging files: overwrites \
                run up to ~2x faster than fresh writes here, so the throughput ratio understates \
                ringlog"
                .to_owned(),
            FioLayout::Fresh => "fio's write file is deleted before each rep, so both sides \
                write into fresh space"
                .to_owned(),
        });
    }

    eprintln!(
        "ringlog-bench: filling the source with {} (un-timed)",
        Bytes(args.size)
    );
    let mut source = Source::fill(cfg)?;
    let result = transfer_reps(args, cfg, fio_files, &mut source);
    // Close the source even when a rep failed; the rep's error wins.
    let closed = source.close();
    let reps = result?;
    closed?;
    Ok(TransferReport {
        settings,
        fio_version,
        notes,
        reps,
    })
}

fn transfer_reps(
    args: &TransferArgs,
    cfg: &TransferConfig,
    fio_files: &TransferFioFiles,
    source: &mut Source,
) -> Result<Vec<TransferRep>, BenchError> {
    let job = fio::TransferJob {
        read_file: &fio_files.read,
        write_file: &fio_files.write,
        block_size_bytes: args.chunk_size,
        size_bytes: source.bytes(),
        iodepth: args.window,
    };
    let mut reps = Vec::with_capacity(args.reps as usize);
    for rep in 1..=args.reps {
        eprintln!("ringlog-bench: rep {rep}/{}: ringlog transfer", args.reps);
        let ringlog = source.transfer(cfg)?;
        let last = rep == args.reps;
        if !(last && args.keep) {
            remove_dir_if_exists(&cfg.receiver_dir())?;
        }

        let fio = if args.vs_fio {
            let need = job.effective_size_bytes();
            if rep == 1 {
                eprintln!(
                    "ringlog-bench: laying out {} for fio to read (un-timed)",
                    Bytes(fio::layout_size_bytes(need))
                );
                fio::layout(&fio_files.read, need)?;
            }
            match args.fio_layout {
                FioLayout::Prewritten if rep == 1 => {
                    eprintln!(
                        "ringlog-bench: laying out {} for fio to overwrite (un-timed)",
                        Bytes(fio::layout_size_bytes(need))
                    );
                    fio::layout(&fio_files.write, need)?;
                }
                FioLayout::Prewritten => {}
                FioLayout::Fresh => remove_file_if_exists(&fio_files.write)?,
            }
            eprintln!(
                "ringlog-bench: rep {rep}/{}: fio read, then write",
                args.reps
            );
            Some(job.run()?)
        } else {
            None
        };
        reps.push(TransferRep { ringlog, fio });
    }
    Ok(reps)
}

/// Runs the fetch job (and fio) and cleans up; the report is not printed.
fn fetch_report(args: &FetchArgs) -> Result<FetchReport, BenchError> {
    if args.segment_size < args.batch_size {
        return Err(BenchError::Usage(format!(
            "--segment-size {} is smaller than --batch-size {}",
            Bytes(args.segment_size),
            Bytes(args.batch_size)
        )));
    }
    if args.size == 0 || args.read_size == 0 {
        return Err(BenchError::Usage(
            "--size and --read-size must be positive".into(),
        ));
    }
    let fio_version = if args.vs_fio {
        Some(fio::version()?)
    } else {
        None
    };
    let dir = &args.dir;
    let cfg = FetchConfig {
        dir: dir.clone(),
        total_bytes: args.size,
        batch_size: to_usize("--batch-size", args.batch_size)?,
        record_size: to_usize("--record-size", args.record_size)?,
        segment_size: args.segment_size,
        read_bytes: to_usize("--read-size", args.read_size)?,
        pattern: match args.pattern {
            ReadPattern::Seq => Pattern::Sequential,
            ReadPattern::Rand => Pattern::Random,
        },
        duration: Duration::from_secs(args.duration),
        read_total_bytes: args.io_size,
        ramp: Duration::from_secs(args.ramp_time),
        seed: 0x5EED,
    };
    if cfg.store_dir().exists() {
        return Err(BenchError::Usage(format!(
            "{} already exists (left by an earlier --keep run?); remove it or pick another --dir",
            cfg.store_dir().display()
        )));
    }
    let fio_file = dir.join("fio-fetch.dat");
    let created_dir = !dir.exists();
    fs::create_dir_all(dir).map_err(fs_err("create", dir))?;

    let result = run_fetch_reps(args, &cfg, &fio_file, fio_version);
    let cleanup = if args.keep {
        Ok(())
    } else {
        remove_dir_if_exists(&cfg.store_dir())
            .and_then(|()| remove_file_if_exists(&fio_file))
            .and_then(|()| {
                if created_dir {
                    match fs::remove_dir(dir) {
                        Err(e) if e.kind() != io::ErrorKind::NotFound => {
                            return Err(fs_err("remove", dir)(e));
                        }
                        _ => {}
                    }
                }
                Ok(())
            })
    };
    let report = result?;
    cleanup?;
    Ok(report)
}

fn run_fetch_reps(
    args: &FetchArgs,
    cfg: &FetchConfig,
    fio_file: &Path,
    fio_version: Option<String>,
) -> Result<FetchReport, BenchError> {
    let mut settings = vec![
        ("dir", cfg.dir.display().to_string()),
        ("size", Bytes(args.size).to_string()),
        ("batch_size", Bytes(args.batch_size).to_string()),
        ("record_size", Bytes(args.record_size).to_string()),
        ("segment_size", Bytes(args.segment_size).to_string()),
        ("read_size", Bytes(args.read_size).to_string()),
        ("pattern", format!("{:?}", args.pattern).to_lowercase()),
        ("duration", format!("{}s", args.duration)),
    ];
    if let Some(n) = args.io_size {
        settings.push(("io_size", Bytes(n).to_string()));
    }
    if args.ramp_time > 0 {
        settings.push(("ramp_time", format!("{}s", args.ramp_time)));
    }
    settings.push(("reps", args.reps.to_string()));
    let mut notes = vec![
        "the store is filled once, un-timed, and flushed; every rep reads it (O_DIRECT, no page \
         cache on either side)"
            .to_owned(),
    ];
    if args.vs_fio {
        notes.push(
            "fio reads a file laid out once (un-timed) with bs = --read-size rounded up to 4KiB, \
             iodepth=1; ringlog returns whole batches up to --read-size, verifying each"
                .to_owned(),
        );
    }
    eprintln!(
        "ringlog-bench: filling the store with {} (un-timed)",
        Bytes(args.size)
    );
    let mut store = jobs::fetch::Store::fill(cfg)?;
    let result = (|| {
        let job = fio::FetchJob {
            file: fio_file,
            block_size_bytes: args.read_size,
            size_bytes: store.log_bytes(),
            random: args.pattern == ReadPattern::Rand,
            runtime: cfg.duration,
            io_bytes: args.io_size,
            ramp: cfg.ramp,
        };
        let mut reps = Vec::with_capacity(args.reps as usize);
        for rep in 1..=args.reps {
            eprintln!("ringlog-bench: rep {rep}/{}: ringlog fetch", args.reps);
            let ringlog = store.run(cfg)?;
            let fio = if args.vs_fio {
                if rep == 1 {
                    eprintln!(
                        "ringlog-bench: laying out {} for fio to read (un-timed)",
                        Bytes(fio::layout_size_bytes(job.effective_size_bytes()))
                    );
                    fio::layout(fio_file, job.effective_size_bytes())?;
                }
                eprintln!("ringlog-bench: rep {rep}/{}: fio fetch", args.reps);
                Some(job.run()?)
            } else {
                None
            };
            reps.push(FetchRep { ringlog, fio });
        }
        Ok::<_, BenchError>(reps)
    })();
    let closed = store.close();
    let reps = result?;
    closed?;
    Ok(FetchReport {
        settings,
        fio_version,
        notes,
        reps,
    })
}

fn remove_dir_if_exists(path: &Path) -> Result<(), BenchError> {
    match fs::remove_dir_all(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(fs_err("remove", path)(e)),
        _ => Ok(()),
    }
}

/// Removes what a transfer run created: both stores, fio's files, and the
/// data directory itself if this run created it (and it is now empty).
fn cleanup_transfer(
    cfg: &TransferConfig,
    fio_files: &TransferFioFiles,
    created_dir: bool,
) -> Result<(), BenchError> {
    remove_dir_if_exists(&cfg.source_dir())?;
    remove_dir_if_exists(&cfg.receiver_dir())?;
    remove_file_if_exists(&fio_files.read)?;
    remove_file_if_exists(&fio_files.write)?;
    if created_dir {
        match fs::remove_dir(&cfg.dir) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                return Err(fs_err("remove", &cfg.dir)(e));
            }
            _ => {}
        }
    }
    Ok(())
}

fn run_reps(
    args: &AppendArgs,
    cfg: &AppendConfig,
    fio_file: &Path,
    fio_version: Option<String>,
) -> Result<Report, BenchError> {
    let mut settings = vec![
        ("dir", cfg.dir.display().to_string()),
        ("partitions", cfg.partitions.to_string()),
        ("batch_size", Bytes(args.batch_size).to_string()),
        ("record_size", Bytes(args.record_size).to_string()),
        ("segment_size", Bytes(args.segment_size).to_string()),
        ("duration", format!("{}s", args.duration)),
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
    if args.ramp_time > 0 {
        settings.push(("ramp_time", format!("{}s", args.ramp_time)));
    }
    settings.push(("reps", args.reps.to_string()));
    let mut notes = Vec::new();
    if args.vs_fio {
        settings.push((
            "fio_layout",
            format!("{:?}", args.fio_layout).to_lowercase(),
        ));
        notes.push(match args.fio_layout {
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
                "fio runs one file with one write+fdatasync per I/O; ringlog groups {} partitions \
                 per commit (one write+fdatasync each, one submission)",
                cfg.partitions
            ));
        }
    }
    notes.push(
        "ringlog pipelines like the shard's group commit: the next round's batches are \
         appended (checked, copied, hashed) while the current round's write+fdatasync is in \
         the kernel, and submitted the moment it completes, so each partition's file sees one \
         write+fdatasync at a time, as fio's does (qd1), with ringlog's CPU per batch off the \
         device's critical path"
            .to_owned(),
    );

    let mut reps = Vec::with_capacity(args.reps as usize);
    let mut laid_out_bytes = 0u64;
    for rep in 1..=args.reps {
        eprintln!("ringlog-bench: rep {rep}/{}: ringlog append", args.reps);
        let ringlog = jobs::append::run(cfg)?;
        let last = rep == args.reps;
        if !(last && args.keep) {
            remove_partitions(cfg)?;
        }

        let fio = if args.vs_fio {
            let job = fio::AppendJob {
                file: fio_file,
                block_size_bytes: args.batch_size,
                size_bytes: args.size.unwrap_or(ringlog.summary.bytes),
                runtime: cfg.duration,
            };
            let need = job.effective_size_bytes();
            match args.fio_layout {
                FioLayout::Prewritten if laid_out_bytes < need => {
                    eprintln!(
                        "ringlog-bench: rep {rep}/{}: laying out {} for fio (un-timed)",
                        args.reps,
                        Bytes(fio::layout_size_bytes(need))
                    );
                    laid_out_bytes = fio::layout(fio_file, need)?;
                }
                FioLayout::Prewritten => {}
                FioLayout::Fresh => remove_file_if_exists(fio_file)?,
            }
            eprintln!("ringlog-bench: rep {rep}/{}: fio append", args.reps);
            Some(job.run()?)
        } else {
            None
        };
        reps.push(Rep { ringlog, fio });
    }
    Ok(Report {
        settings,
        fio_version,
        notes,
        reps,
    })
}

fn remove_partitions(cfg: &AppendConfig) -> Result<(), BenchError> {
    for p in 0..cfg.partitions {
        let pdir = cfg.partition_dir(p);
        match fs::remove_dir_all(&pdir) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                return Err(fs_err("remove", &pdir)(e));
            }
            _ => {}
        }
    }
    Ok(())
}

fn remove_file_if_exists(path: &Path) -> Result<(), BenchError> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(fs_err("remove", path)(e)),
        _ => Ok(()),
    }
}

/// Removes what this run created: partition directories, fio's file, and
/// the data directory itself if this run created it (and it is now empty).
fn cleanup(cfg: &AppendConfig, fio_file: &Path, created_dir: bool) -> Result<(), BenchError> {
    remove_partitions(cfg)?;
    remove_file_if_exists(fio_file)?;
    if created_dir {
        match fs::remove_dir(&cfg.dir) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                return Err(fs_err("remove", &cfg.dir)(e));
            }
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn append_defaults_and_sizes() {
        let cli = Cli::try_parse_from(["ringlog-bench", "append"]).unwrap();
        let Some(Command::Append(a)) = cli.command else {
            panic!("not append")
        };
        assert_eq!(a.dir, PathBuf::from("./bench-data"));
        assert_eq!(a.partitions, 1);
        assert_eq!(a.batch_size, 64 << 10);
        assert_eq!(a.record_size, 1 << 10);
        assert_eq!(a.duration, 10);
        assert_eq!(a.size, None);
        assert_eq!(a.segment_size, 256 << 20);
        assert!(!a.vs_fio && !a.keep);
        assert_eq!(a.reps, 1);
        assert_eq!(a.output_format, OutputFormat::Text);

        let cli = Cli::try_parse_from([
            "ringlog-bench",
            "append",
            "--batch-size",
            "1m",
            "--size",
            "1g",
            "--vs-fio",
            "--reps",
            "3",
            "--output-format",
            "json",
        ])
        .unwrap();
        let Some(Command::Append(a)) = cli.command else {
            panic!("not append")
        };
        assert_eq!(a.batch_size, 1 << 20);
        assert_eq!(a.size, Some(1 << 30));
        assert!(a.vs_fio);
        assert_eq!(a.reps, 3);
        assert_eq!(a.output_format, OutputFormat::Json);
    }

    #[test]
    fn bad_sizes_are_rejected_by_the_cli() {
        let err = Cli::try_parse_from(["ringlog-bench", "append", "--batch-size", "64x"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown suffix"), "{err}");
        assert!(Cli::try_parse_from(["ringlog-bench", "append", "--partitions", "0"]).is_err());
    }

    /// End to end on the real disk: ringlog append, fio layout and fio run,
    /// report in both formats. Needs fio (ci/install-deps).
    #[test]
    fn append_vs_fio_smoke() {
        // In the crate directory: on the repo's filesystem, which supports
        // O_DIRECT (a tmpfs /tmp would not).
        let tmp = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let dir = tmp.path().join("data");
        let cli = Cli::try_parse_from([
            "ringlog-bench",
            "append",
            "--dir",
            dir.to_str().unwrap(),
            "--duration",
            "1",
            "--size",
            "4m",
            "--segment-size",
            "1m",
            "--retention",
            "2m",
            "--warmup",
            "4m",
            "--vs-fio",
            "--reps",
            "2",
        ])
        .unwrap();
        let Some(Command::Append(args)) = cli.command else {
            panic!("not append")
        };
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
        let text = report.text();
        assert!(text.contains("    cpu: usr="), "{text}");
    }

    #[test]
    fn transfer_defaults_and_sizes() {
        let cli = Cli::try_parse_from(["ringlog-bench", "transfer"]).unwrap();
        let Some(Command::Transfer(t)) = cli.command else {
            panic!("not transfer")
        };
        assert_eq!(t.dir, PathBuf::from("./bench-data"));
        assert_eq!(t.size, 512 << 20);
        assert_eq!(t.segment_size, 256 << 20);
        assert_eq!(t.chunk_size, 1 << 20);
        assert_eq!(t.window, 4);
        assert_eq!(t.batch_size, 1 << 20);
        assert_eq!(t.reps, 1);
        assert!(!t.vs_fio && !t.keep);
        assert_eq!(t.fio_layout, FioLayout::Prewritten);
        assert_eq!(t.output_format, OutputFormat::Text);

        let cli = Cli::try_parse_from([
            "ringlog-bench",
            "transfer",
            "--size",
            "1g",
            "--chunk-size",
            "256k",
            "--window",
            "8",
            "--vs-fio",
            "--output-format",
            "json",
        ])
        .unwrap();
        let Some(Command::Transfer(t)) = cli.command else {
            panic!("not transfer")
        };
        assert_eq!(t.size, 1 << 30);
        assert_eq!(t.chunk_size, 256 << 10);
        assert_eq!(t.window, 8);
        assert!(t.vs_fio);
        assert_eq!(t.output_format, OutputFormat::Json);
        assert!(Cli::try_parse_from(["ringlog-bench", "transfer", "--window", "0"]).is_err());
    }

    #[test]
    fn bad_transfer_settings_are_usage_errors() {
        let tmp = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let dir = tmp.path().join("data");
        let dir = dir.to_str().unwrap();
        for bad in [
            &["--chunk-size", "5000"][..],
            &["--chunk-size", "32m"][..],
            &["--segment-size", "4m", "--batch-size", "8m"][..],
        ] {
            let mut argv = vec!["ringlog-bench", "transfer", "--dir", dir];
            argv.extend_from_slice(bad);
            let Some(Command::Transfer(t)) = Cli::try_parse_from(argv).unwrap().command else {
                panic!("not transfer")
            };
            assert!(
                matches!(transfer_report(&t), Err(BenchError::Usage(_))),
                "{bad:?}"
            );
        }
        assert!(
            !Path::new(dir).exists(),
            "nothing is created for a usage error"
        );
    }

    /// End to end on the real disk: a small transfer against fio, text and
    /// JSON reports with the ratios. Needs fio (ci/install-deps).
    #[test]
    fn transfer_vs_fio_smoke() {
        let tmp = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let dir = tmp.path().join("data");
        let cli = Cli::try_parse_from([
            "ringlog-bench",
            "transfer",
            "--dir",
            dir.to_str().unwrap(),
            "--size",
            "16m",
            "--segment-size",
            "4m",
            "--chunk-size",
            "256k",
            "--batch-size",
            "64k",
            "--vs-fio",
            "--reps",
            "2",
        ])
        .unwrap();
        let Some(Command::Transfer(args)) = cli.command else {
            panic!("not transfer")
        };
        let report = transfer_report(&args).unwrap();
        assert!(!dir.exists(), "data dir is removed without --keep");

        assert_eq!(report.reps.len(), 2);
        for rep in &report.reps {
            assert_eq!(rep.ringlog.summary.bytes, 16 << 20);
            assert_eq!(rep.ringlog.artifacts, 4);
            assert_eq!(rep.ringlog.summary.ios, 64);
            let fio = rep.fio.as_ref().unwrap();
            assert_eq!(fio.read.bytes, 16 << 20);
            assert_eq!(fio.write.bytes, 16 << 20);
        }
        let text = report.text();
        assert!(text.contains("ringlog transfer: bw="), "{text}");
        assert!(text.contains("fio transfer: bw="), "{text}");
        assert!(text.contains("ratio throughput ringlog/fio = "), "{text}");
        assert!(text.contains("(median of 2 reps, min "), "{text}");
        assert!(
            text.contains("ratio p99 chunk latency ringlog/fio = "),
            "{text}"
        );
        let v = report.json();
        assert_eq!(v["ratios"]["throughput"]["reps"], 2);
        for key in ["median", "min", "max"] {
            assert!(v["ratios"]["throughput"][key].is_f64(), "{key}");
        }
        assert_eq!(v["jobs"][0]["transfer"]["io_bytes"], 16u64 << 20);
        assert_eq!(v["jobs"][1]["engine"], "fio");
        report::assert_fio_shape(&v, true, &["throughput", "p99_chunk_latency"]);
    }

    fn fetch_args(argv: &[&str]) -> FetchArgs {
        let mut full = vec!["ringlog-bench", "fetch"];
        full.extend_from_slice(argv);
        let Some(Command::Fetch(f)) = Cli::try_parse_from(full).unwrap().command else {
            panic!("not fetch")
        };
        f
    }

    #[test]
    fn fetch_defaults() {
        let f = fetch_args(&[]);
        assert_eq!(f.size, 256 << 20);
        assert_eq!(f.batch_size, 64 << 10);
        assert_eq!(f.read_size, 1 << 20);
        assert_eq!(f.pattern, ReadPattern::Seq);
        assert_eq!(f.ramp_time, 0);
        assert!(!f.vs_fio);
        let f = fetch_args(&["--pattern", "rand", "--ramp-time", "2", "--io-size", "1g"]);
        assert_eq!(f.pattern, ReadPattern::Rand);
        assert_eq!(f.ramp_time, 2);
        assert_eq!(f.io_size, Some(1 << 30));
    }

    /// End to end on the real disk: sequential reads against fio's
    /// sequential reads, then random reads with a ramp. Needs fio.
    #[test]
    fn fetch_vs_fio_smoke() {
        let tmp = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let dir = tmp.path().join("data");
        let d = dir.to_str().unwrap();
        let args = fetch_args(&[
            "--dir",
            d,
            "--size",
            "8m",
            "--segment-size",
            "4m",
            "--read-size",
            "256k",
            "--duration",
            "1",
            "--io-size",
            "32m",
            "--vs-fio",
            "--reps",
            "2",
        ]);
        let report = fetch_report(&args).unwrap_or_else(|e| panic!("{e}"));
        assert!(!dir.exists(), "data dir is removed without --keep");
        assert_eq!(report.reps.len(), 2);
        for rep in &report.reps {
            let r = &rep.ringlog;
            assert!(r.summary.bytes >= 32 << 20 || r.summary.runtime.as_secs() >= 1);
            assert_eq!(r.empty_reads, 0);
            // Whole 64 KiB batches, up to 256 KiB per read.
            assert_eq!(r.summary.bytes % (64 << 10), 0);
            assert!(r.summary.bytes <= r.summary.ios * (256 << 10));
            assert!(r.records > 0);
            assert!(!r.summary.timeline.is_empty());
            let f = rep.fio.as_ref().unwrap();
            assert!(f.read.bytes > 0 && f.read.cpu.is_some());
        }
        let text = report.text();
        for want in [
            "ringlog-bench fetch: dir=",
            "ringlog fetch: bw=",
            "reads/s=",
            "read lat percentiles (usec): 50=",
            "fio fetch: bw=",
            "--rw=read",
            "ratio throughput ringlog/fio = ",
            "ratio p99 read latency ringlog/fio = ",
            "    cpu: usr=",
        ] {
            assert!(text.contains(want), "{want:?} missing from:\n{text}");
        }
        let v = report.json();
        assert_eq!(v["jobs"][0]["jobname"], "fetch");
        assert_eq!(v["jobs"][1]["engine"], "fio");
        report::assert_fio_shape(&v, true, &["throughput", "p99_read_latency"]);

        let args = fetch_args(&[
            "--dir",
            d,
            "--size",
            "4m",
            "--segment-size",
            "1m",
            "--batch-size",
            "16k",
            "--read-size",
            "64k",
            "--pattern",
            "rand",
            "--duration",
            "1",
            "--ramp-time",
            "1",
        ]);
        let report = fetch_report(&args).unwrap_or_else(|e| panic!("{e}"));
        let r = &report.reps[0].ringlog;
        assert!(r.summary.ios > 0 && r.empty_reads == 0);
        assert!(report.text().contains("pattern=rand"));
        assert!(report.ratios().is_none());
        assert!(!dir.exists());
    }

    /// A job file with two jobs (append, then fetch) runs both in order;
    /// one JSON document holds both jobs' results; --plot draws them.
    #[test]
    fn job_file_runs_every_job_and_plots() {
        let tmp = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let dir = tmp.path().join("data");
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
        assert!(
            text.contains("\n[fetch-seq]\nringlog-bench fetch: "),
            "{text}"
        );

        let svg = tmp.path().join("plot.svg");
        output(&runs, Some(&svg)).unwrap();
        let svg = fs::read_to_string(&svg).unwrap();
        assert!(svg.starts_with("<svg "), "{svg}");
        assert!(svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("[append] ringlog append"));
        assert!(svg.contains("[fetch-seq] ringlog fetch"));
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
        let tmp = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let dir = tmp.path().join("data");
        let cli = Cli::try_parse_from([
            "ringlog-bench",
            "transfer",
            "--dir",
            dir.to_str().unwrap(),
            "--size",
            "2m",
            "--segment-size",
            "1m",
            "--batch-size",
            "64k",
            "--chunk-size",
            "64k",
            "--keep",
        ])
        .unwrap();
        let Some(Command::Transfer(args)) = cli.command else {
            panic!("not transfer")
        };
        let report = transfer_report(&args).unwrap();
        assert!(report.ratios().is_none());
        assert!(dir.join("src").is_dir() && dir.join("dst").is_dir());
        // A second run refuses to reuse them.
        assert!(matches!(transfer_report(&args), Err(BenchError::Usage(_))));
    }
}
