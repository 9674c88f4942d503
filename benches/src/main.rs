//! ringlog-bench: fio-style benchmark harness for ringlog.
//!
//! `ringlog-bench append` drives partition stores directly (no server) and,
//! with `--vs-fio`, runs the equivalent fio job on the same filesystem in
//! alternation (ringlog, fio, ringlog, fio, ...) and reports the ratios.

mod fio;
mod jobs;
mod report;
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
use crate::report::{Rep, Report};
use crate::size::{parse_size, Bytes};

#[derive(Debug, Parser)]
#[command(
    name = "ringlog-bench",
    version,
    about = "fio-style benchmarks for ringlog"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Group-committed appends into partition stores (write + fdatasync per
    /// flush), optionally against the equivalent fio job.
    Append(AppendArgs),
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

#[derive(Debug, thiserror::Error)]
enum BenchError {
    #[error(transparent)]
    Fio(#[from] FioError),
    #[error(transparent)]
    Append(#[from] AppendError),
    #[error("{what} {path}: {source}")]
    Fs {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{0}")]
    Usage(String),
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
    let result = match cli.command {
        Command::Append(args) => append(&args),
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

fn to_usize(what: &str, v: u64) -> Result<usize, BenchError> {
    usize::try_from(v).map_err(|_| BenchError::Usage(format!("{what} {v} is too large")))
}

fn append(args: &AppendArgs) -> Result<(), BenchError> {
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

    let out = match args.output_format {
        OutputFormat::Text => report.text(),
        OutputFormat::Json => {
            let mut s = serde_json::to_string_pretty(&report.json())
                .expect("serde_json::Value always serialises");
            s.push('\n');
            s
        }
    };
    io::stdout()
        .lock()
        .write_all(out.as_bytes())
        .map_err(BenchError::Output)
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
        let Command::Append(a) = cli.command;
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
        let Command::Append(a) = cli.command;
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
        let Command::Append(args) = cli.command;
        append(&args).unwrap();
        assert!(!dir.exists(), "data dir is removed without --keep");
    }
}
