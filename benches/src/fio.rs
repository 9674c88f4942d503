//! Runs fio for the baseline side of a comparison and parses its JSON.
//!
//! The append baseline is one sequential writer doing O_DIRECT writes of one
//! batch each, every write followed by fdatasync (`--fdatasync=1`), through
//! io_uring: the same durable-ack contract as a ringlog append with one batch
//! per flush. It runs over a file that was fully written beforehand (see
//! [`layout_args`]), because ringlog recycles its segment files and O_DIRECT
//! overwrites run about twice as fast as writes into fresh space.
//!
//! The transfer baseline ([`TransferJob`]) reads the log's bytes from one
//! pre-written file and then writes them to another, as a snapshot transfer
//! reads a segment on the source and writes it on the receiver.

use std::io;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::stats::{CpuUsage, LatencySummary, RunSummary, PERCENTILES};

/// fio's append runs write at least this much, whatever ringlog wrote, so
/// short runs still give fio enough samples for its percentiles.
pub const APPEND_MIN_SIZE_BYTES: u64 = 64 << 20;

/// Block size of the un-timed layout pass.
const LAYOUT_BLOCK_BYTES: u64 = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum FioError {
    #[error("fio is not installed (not found on PATH); run ci/install-deps")]
    NotInstalled,
    #[error("could not run fio: {0}")]
    Spawn(#[source] io::Error),
    #[error("fio {args} failed ({status}): {stderr}")]
    Failed {
        args: String,
        status: ExitStatus,
        stderr: String,
    },
    #[error("fio output is not valid JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("fio JSON has no field {0}")]
    MissingField(String),
    #[error("fio JSON field {path} is not {expected}")]
    WrongType {
        path: String,
        expected: &'static str,
    },
    #[error("fio job {jobname} reported error {code}")]
    JobError { jobname: String, code: i64 },
    #[error("fio path {0:?} is not valid UTF-8")]
    NonUtf8Path(std::path::PathBuf),
}

/// Returns `fio --version` (e.g. `fio-3.33`), or [`FioError::NotInstalled`].
pub fn version() -> Result<String, FioError> {
    let out = Command::new("fio")
        .arg("--version")
        .output()
        .map_err(spawn_error)?;
    if !out.status.success() {
        return Err(FioError::Failed {
            args: "--version".into(),
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn spawn_error(e: io::Error) -> FioError {
    if e.kind() == io::ErrorKind::NotFound {
        FioError::NotInstalled
    } else {
        FioError::Spawn(e)
    }
}

/// fio splits `--filename` on ':'; escape it.
fn filename_arg(file: &Path) -> Result<String, FioError> {
    let s = file
        .to_str()
        .ok_or_else(|| FioError::NonUtf8Path(file.to_owned()))?;
    Ok(format!("--filename={}", s.replace(':', "\\:")))
}

/// The append baseline: `bs`-sized O_DIRECT writes, each followed by
/// fdatasync, over `size_bytes` of a pre-written file, capped at `runtime`.
#[derive(Debug, Clone)]
pub struct AppendJob<'a> {
    pub file: &'a Path,
    pub block_size_bytes: u64,
    pub size_bytes: u64,
    pub runtime: Duration,
}

impl AppendJob<'_> {
    /// Bytes fio is asked to write: `size_bytes` raised to
    /// [`APPEND_MIN_SIZE_BYTES`] and rounded up to whole blocks.
    pub fn effective_size_bytes(&self) -> u64 {
        let bs = self.block_size_bytes.max(1);
        self.size_bytes.max(APPEND_MIN_SIZE_BYTES).div_ceil(bs) * bs
    }

    pub fn args(&self) -> Result<Vec<String>, FioError> {
        Ok(vec![
            "--name=append".into(),
            filename_arg(self.file)?,
            "--rw=write".into(),
            format!("--bs={}", self.block_size_bytes),
            "--ioengine=io_uring".into(),
            "--direct=1".into(),
            "--fdatasync=1".into(),
            format!("--size={}", self.effective_size_bytes()),
            format!("--runtime={}", fio_time(self.runtime)),
            "--time_based=0".into(),
            // Percentiles for total (submit + completion) latency, not just clat.
            "--lat_percentiles=1".into(),
            "--output-format=json".into(),
        ])
    }

    /// Runs the timed job (the file must already be laid out: [`layout`]).
    pub fn run(&self) -> Result<FioResult, FioError> {
        let args = self.args()?;
        let json = run_fio(&args)?;
        let mut result = parse_append(&json)?;
        result.command = command_line(&args);
        result.args = args;
        Ok(result)
    }
}

/// The transfer baseline, in one fio invocation: a `read` job reading
/// `size_bytes` of a pre-written file, then (`--stonewall`) a `write` job
/// overwriting `size_bytes` of another file ending with an fsync
/// (`--end_fsync=1`, inside the job's runtime); both sequential, O_DIRECT,
/// io_uring, `bs` = chunk size, `iodepth` = window. Both files must be laid
/// out first ([`layout`]); the read file always, the write file when it is
/// to be overwritten.
#[derive(Debug, Clone)]
pub struct TransferJob<'a> {
    pub read_file: &'a Path,
    pub write_file: &'a Path,
    pub block_size_bytes: u64,
    pub size_bytes: u64,
    pub iodepth: u32,
}

impl TransferJob<'_> {
    /// Bytes each job moves: `size_bytes` rounded up to whole blocks.
    pub fn effective_size_bytes(&self) -> u64 {
        let bs = self.block_size_bytes.max(1);
        self.size_bytes.max(1).div_ceil(bs) * bs
    }

    pub fn args(&self) -> Result<Vec<String>, FioError> {
        Ok(vec![
            // Global options, before the first --name.
            "--ioengine=io_uring".into(),
            "--direct=1".into(),
            format!("--bs={}", self.block_size_bytes),
            format!("--iodepth={}", self.iodepth.max(1)),
            format!("--size={}", self.effective_size_bytes()),
            "--lat_percentiles=1".into(),
            "--output-format=json".into(),
            "--name=read".into(),
            filename_arg(self.read_file)?,
            "--rw=read".into(),
            "--name=write".into(),
            "--stonewall".into(),
            filename_arg(self.write_file)?,
            "--rw=write".into(),
            "--end_fsync=1".into(),
        ])
    }

    pub fn run(&self) -> Result<FioTransferResult, FioError> {
        let args = self.args()?;
        let json = run_fio(&args)?;
        let mut result = parse_transfer(&json)?;
        result.command = command_line(&args);
        result.args = args;
        Ok(result)
    }
}

/// The fetch baseline: `bs`-sized O_DIRECT reads (sequential or random,
/// iodepth 1, io_uring) of a pre-written file of `size_bytes`, time-based
/// for `runtime` (or `io_bytes` in all, if set), after `ramp` un-timed.
#[derive(Debug, Clone)]
pub struct FetchJob<'a> {
    pub file: &'a Path,
    pub block_size_bytes: u64,
    pub size_bytes: u64,
    pub random: bool,
    pub runtime: Duration,
    pub io_bytes: Option<u64>,
    pub ramp: Duration,
}

impl FetchJob<'_> {
    /// `bs`: the read size rounded up to whole 4 KiB blocks.
    pub fn block_size(&self) -> u64 {
        self.block_size_bytes.max(1).div_ceil(4096) * 4096
    }

    /// Bytes of file the reads range over: whole blocks, at least one.
    pub fn effective_size_bytes(&self) -> u64 {
        let bs = self.block_size();
        self.size_bytes.max(bs).div_ceil(bs) * bs
    }

    pub fn args(&self) -> Result<Vec<String>, FioError> {
        let mut args = vec![
            "--name=fetch".into(),
            filename_arg(self.file)?,
            format!("--rw={}", if self.random { "randread" } else { "read" }),
            format!("--bs={}", self.block_size()),
            "--ioengine=io_uring".into(),
            "--direct=1".into(),
            "--iodepth=1".into(),
            format!("--size={}", self.effective_size_bytes()),
            format!("--runtime={}", fio_time(self.runtime)),
        ];
        match self.io_bytes {
            Some(n) => {
                args.push("--time_based=0".into());
                args.push(format!("--io_size={n}"));
            }
            None => args.push("--time_based=1".into()),
        }
        if !self.ramp.is_zero() {
            args.push(format!("--ramp_time={}", fio_time(self.ramp)));
        }
        args.push("--lat_percentiles=1".into());
        args.push("--output-format=json".into());
        Ok(args)
    }

    /// Runs the timed job (the file must be laid out first: [`layout`]).
    pub fn run(&self) -> Result<FioFetchResult, FioError> {
        let args = self.args()?;
        let json = run_fio(&args)?;
        let mut result = parse_fetch(&json)?;
        result.command = command_line(&args);
        result.args = args;
        Ok(result)
    }
}

/// What the comparison needs from one fio fetch run.
#[derive(Debug, Clone, PartialEq)]
pub struct FioFetchResult {
    pub version: String,
    /// `jobs[0].read`.
    pub read: RunSummary,
    /// `lat_ns` or `clat_ns` (see [`FioResult::write_lat_field`]).
    pub lat_field: &'static str,
    pub command: String,
    /// Its arguments (empty when parsed from captured output).
    pub args: Vec<String>,
}

/// Parses the JSON of a [`FetchJob`] run (first job's `read` section).
pub fn parse_fetch(output: &str) -> Result<FioFetchResult, FioError> {
    let (root, version) = parse_root(output)?;
    let (job, jp) = job_at(&root, |_| true, "jobs[0]")?;
    let (read, lat_field) = parse_direction(job, "read", &jp)?;
    Ok(FioFetchResult {
        version,
        read,
        lat_field,
        command: String::new(),
        args: Vec::new(),
    })
}

/// What the comparison needs from one fio transfer run.
#[derive(Debug, Clone, PartialEq)]
pub struct FioTransferResult {
    pub version: String,
    /// The `read` job's `read` section.
    pub read: RunSummary,
    /// The `write` job's `write` section; its runtime includes the end fsync.
    pub write: RunSummary,
    /// Which fio latency field `read` and `write` came from (`lat_ns` or
    /// `clat_ns`, see [`FioResult::write_lat_field`]).
    pub lat_field: &'static str,
    /// The transfer as a whole: bytes and I/Os of the read job, runtime =
    /// read runtime + write runtime, bw = bytes / that runtime; lat = read
    /// lat + write lat, each statistic summed (an approximation, as for
    /// [`FioResult::ack_lat`]).
    pub transfer: RunSummary,
    pub command: String,
    /// Its arguments (empty when parsed from captured output).
    pub args: Vec<String>,
}

/// Parses the JSON of a [`TransferJob`] run: the jobs named `read` and
/// `write`, in any order.
pub fn parse_transfer(output: &str) -> Result<FioTransferResult, FioError> {
    let (root, version) = parse_root(output)?;
    let (job, jp) = job_at(&root, |n| n == "read", "jobs[jobname=read]")?;
    let (read, read_field) = parse_direction(job, "read", &jp)?;
    let (job, jp) = job_at(&root, |n| n == "write", "jobs[jobname=write]")?;
    let (write, write_field) = parse_direction(job, "write", &jp)?;
    let lat_field = if read_field == write_field {
        read_field
    } else {
        "clat_ns"
    };
    let transfer = RunSummary::from_counts(
        read.bytes,
        read.ios,
        read.runtime + write.runtime,
        read.lat.sum_fieldwise(&write.lat),
    );
    Ok(FioTransferResult {
        version,
        read,
        write,
        lat_field,
        transfer,
        command: String::new(),
        args: Vec::new(),
    })
}

/// The un-timed pass that writes `size_bytes` (rounded up to 1 MiB) of the
/// file once, so the timed run overwrites written blocks.
pub fn layout_args(file: &Path, size_bytes: u64) -> Result<Vec<String>, FioError> {
    Ok(vec![
        "--name=layout".into(),
        filename_arg(file)?,
        "--rw=write".into(),
        format!("--bs={LAYOUT_BLOCK_BYTES}"),
        "--ioengine=io_uring".into(),
        "--direct=1".into(),
        format!("--size={}", layout_size_bytes(size_bytes)),
        "--end_fsync=1".into(),
        "--output-format=json".into(),
    ])
}

pub fn layout_size_bytes(size_bytes: u64) -> u64 {
    size_bytes.max(1).div_ceil(LAYOUT_BLOCK_BYTES) * LAYOUT_BLOCK_BYTES
}

/// Runs the layout pass; returns the bytes laid out.
pub fn layout(file: &Path, size_bytes: u64) -> Result<u64, FioError> {
    let args = layout_args(file, size_bytes)?;
    run_fio(&args)?;
    Ok(layout_size_bytes(size_bytes))
}

/// A time option's value as fio reads it: whole seconds bare (fio's default
/// unit), else milliseconds; at least 1 ms (fio takes 0 as "no limit").
fn fio_time(d: Duration) -> String {
    let ms = d.as_millis().max(1);
    if ms.is_multiple_of(1000) {
        format!("{}", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

/// fio's `job options` of a run: its `--key=value` arguments as a map
/// (`--key` alone is `1`), as fio lists them per job in its JSON.
pub fn job_options(args: &[String]) -> serde_json::Map<String, Value> {
    args.iter()
        .filter_map(|a| a.strip_prefix("--"))
        .map(|kv| match kv.split_once('=') {
            Some((k, v)) => (k.to_owned(), Value::from(v)),
            None => (kv.to_owned(), Value::from("1")),
        })
        .collect()
}

/// `fio ARGS...` as one shell-pasteable line.
pub fn command_line(args: &[String]) -> String {
    let mut line = String::from("fio");
    for a in args {
        line.push(' ');
        if a.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_=./:,+@%\\".contains(c))
        {
            line.push_str(a);
        } else {
            line.push('\'');
            line.push_str(&a.replace('\'', "'\\''"));
            line.push('\'');
        }
    }
    line
}

fn run_fio(args: &[String]) -> Result<String, FioError> {
    let child = Command::new("fio")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(spawn_error)?;
    // Ctrl-C stops fio too, also when the signal came to ringlog-bench alone.
    let pid = child.id();
    crate::interrupt::register_child(pid);
    let out = child.wait_with_output();
    crate::interrupt::unregister_child(pid);
    let out = out.map_err(spawn_error)?;
    if !out.status.success() {
        return Err(FioError::Failed {
            args: args.join(" "),
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// What the comparison needs from one fio append run.
#[derive(Debug, Clone, PartialEq)]
pub struct FioResult {
    /// `fio version`, e.g. `fio-3.33`.
    pub version: String,
    /// `jobs[0].write`: bytes, writes, runtime, fio's own bw_bytes/iops and
    /// per-write latency (excluding the fdatasync that follows each write).
    pub write: RunSummary,
    /// Which fio field [`FioResult::write`]'s latency came from: `lat_ns`
    /// (submit to completion) when fio ran with `--lat_percentiles=1`,
    /// otherwise `clat_ns`.
    pub write_lat_field: &'static str,
    /// `jobs[0].sync.lat_ns`: the fdatasync after each write.
    pub sync_lat: LatencySummary,
    /// Ack-equivalent latency: write + fdatasync, each statistic summed
    /// (fio has no combined view; see [`LatencySummary::sum_fieldwise`]).
    pub ack_lat: LatencySummary,
    /// The fio command line that produced this result (empty when parsed
    /// from captured output).
    pub command: String,
    /// Its arguments (empty when parsed from captured output).
    pub args: Vec<String>,
}

/// Parses the JSON of a `--fdatasync=1` write job (first job only). Text
/// before the JSON object (fio warnings on stdout) is skipped.
pub fn parse_append(output: &str) -> Result<FioResult, FioError> {
    let (root, version) = parse_root(output)?;
    let (job, jp) = job_at(&root, |_| true, "jobs[0]")?;
    let (write, write_lat_field) = parse_direction(job, "write", &jp)?;

    let sp = format!("{jp}.sync");
    let sync = get(job, "sync", &jp)?;
    let sync_lat = parse_latency(get(sync, "lat_ns", &sp)?, &join(&sp, "lat_ns"))?;
    let ack_lat = write.lat.sum_fieldwise(&sync_lat);

    Ok(FioResult {
        version,
        write,
        write_lat_field,
        sync_lat,
        ack_lat,
        command: String::new(),
        args: Vec::new(),
    })
}

/// fio's per-job `usr_cpu`/`sys_cpu` (percent) and `ctx`, when present.
fn job_cpu(job: &Value) -> Option<CpuUsage> {
    Some(CpuUsage {
        usr_pct: job.get("usr_cpu")?.as_f64()?,
        sys_pct: job.get("sys_cpu")?.as_f64()?,
        ctx: job.get("ctx").and_then(Value::as_u64).unwrap_or(0),
    })
}

/// The JSON root and its `fio version`.
fn parse_root(output: &str) -> Result<(Value, String), FioError> {
    let start = json_start(output);
    let root: Value = serde_json::from_str(&output[start..])?;
    let version = get(&root, "fio version", "")?
        .as_str()
        .ok_or_else(|| wrong_type("fio version", "a string"))?
        .to_owned();
    Ok((root, version))
}

/// The first job whose name passes `pick` (`missing` names it in the error
/// when there is none), with its path (`jobs[i]`); a job that reported an
/// error is [`FioError::JobError`].
fn job_at<'a>(
    root: &'a Value,
    pick: impl Fn(&str) -> bool,
    missing: &str,
) -> Result<(&'a Value, String), FioError> {
    let jobs = get(root, "jobs", "")?
        .as_array()
        .ok_or_else(|| wrong_type("jobs", "an array"))?;
    for (i, job) in jobs.iter().enumerate() {
        let jp = format!("jobs[{i}]");
        let jobname = get_str(job, "jobname", &jp)?;
        if !pick(jobname) {
            continue;
        }
        let code = get_i64(job, "error", &jp)?;
        if code != 0 {
            return Err(FioError::JobError {
                jobname: jobname.to_owned(),
                code,
            });
        }
        return Ok((job, jp));
    }
    Err(FioError::MissingField(missing.to_owned()))
}

/// One direction (`read` or `write`) of a job: bytes, I/Os, runtime, fio's
/// own bw_bytes/iops, and latency from `lat_ns` (submit to completion) when
/// it has percentiles (`--lat_percentiles=1`), otherwise `clat_ns`. Returns
/// which field the latency came from.
fn parse_direction(
    job: &Value,
    dir: &str,
    jp: &str,
) -> Result<(RunSummary, &'static str), FioError> {
    let d = get(job, dir, jp)?;
    let dp = join(jp, dir);
    let bytes = get_u64(d, "io_bytes", &dp)?;
    let ios = get_u64(d, "total_ios", &dp)?;
    let runtime_ms = get_u64(d, "runtime", &dp)?;
    let bw_bytes = get_f64(d, "bw_bytes", &dp)?;
    let iops = get_f64(d, "iops", &dp)?;
    let lat = get(d, "lat_ns", &dp)?;
    let (lat, field) = if lat.get("percentile").is_some() {
        (parse_latency(lat, &join(&dp, "lat_ns"))?, "lat_ns")
    } else {
        let clat = get(d, "clat_ns", &dp)?;
        (parse_latency(clat, &join(&dp, "clat_ns"))?, "clat_ns")
    };
    Ok((
        RunSummary {
            bytes,
            ios,
            runtime: Duration::from_millis(runtime_ms),
            bw_bytes,
            iops,
            lat,
            cpu: job_cpu(job),
            timeline: Vec::new(),
        },
        field,
    ))
}

fn json_start(output: &str) -> usize {
    if output.trim_start().starts_with('{') {
        return 0;
    }
    output.find("\n{").map_or(0, |i| i + 1)
}

fn join(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_owned()
    } else {
        format!("{parent}.{key}")
    }
}

fn wrong_type(path: &str, expected: &'static str) -> FioError {
    FioError::WrongType {
        path: path.to_owned(),
        expected,
    }
}

fn get<'a>(v: &'a Value, key: &str, parent: &str) -> Result<&'a Value, FioError> {
    v.get(key)
        .ok_or_else(|| FioError::MissingField(join(parent, key)))
}

fn get_str<'a>(v: &'a Value, key: &str, parent: &str) -> Result<&'a str, FioError> {
    get(v, key, parent)?
        .as_str()
        .ok_or_else(|| wrong_type(&join(parent, key), "a string"))
}

fn get_i64(v: &Value, key: &str, parent: &str) -> Result<i64, FioError> {
    get(v, key, parent)?
        .as_i64()
        .ok_or_else(|| wrong_type(&join(parent, key), "an integer"))
}

fn get_u64(v: &Value, key: &str, parent: &str) -> Result<u64, FioError> {
    get(v, key, parent)?
        .as_u64()
        .ok_or_else(|| wrong_type(&join(parent, key), "an unsigned integer"))
}

fn get_f64(v: &Value, key: &str, parent: &str) -> Result<f64, FioError> {
    get(v, key, parent)?
        .as_f64()
        .ok_or_else(|| wrong_type(&join(parent, key), "a number"))
}

/// Parses one of fio's `*_ns` latency objects.
fn parse_latency(v: &Value, path: &str) -> Result<LatencySummary, FioError> {
    let samples = get_u64(v, "N", path)?;
    let min_ns = get_u64(v, "min", path)?;
    let max_ns = get_u64(v, "max", path)?;
    let mean_ns = get_f64(v, "mean", path)?;
    let stddev_ns = get_f64(v, "stddev", path)?;
    let pct_path = join(path, "percentile");
    let pct = get(v, "percentile", path)?;
    let mut percentiles_ns = [0u64; PERCENTILES.len()];
    for (slot, (_, key)) in percentiles_ns.iter_mut().zip(PERCENTILES) {
        *slot = get_u64(pct, key, &pct_path)?;
    }
    Ok(LatencySummary {
        samples,
        min_ns,
        mean_ns,
        stddev_ns,
        max_ns,
        percentiles_ns,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// fio 3.33 on this machine class (ext4 on virtio, kernel 6.18):
    /// 64 KiB `--fdatasync=1` writes over a pre-written 64 MiB file, trimmed
    /// to the fields fio normally prints for such a job.
    const SAMPLE: &str = include_str!("testdata/fio-3.33-append-64k.json");

    #[test]
    fn parses_captured_append_run() {
        let r = parse_append(SAMPLE).unwrap();
        assert_eq!(r.version, "fio-3.33");
        assert_eq!(r.write.bytes, 64 << 20);
        assert_eq!(r.write.ios, 1024);
        assert_eq!(r.write.runtime, Duration::from_millis(601));
        assert_eq!(r.write.bw_bytes, 111_662_003.0);
        assert!((r.write.iops - 1703.826955).abs() < 1e-6);
        assert_eq!(r.write_lat_field, "lat_ns");
        assert_eq!(r.write.lat.p99_ns(), 1_204_224);
        assert_eq!(r.write.lat.at(50.0), 166_912);
        assert_eq!(r.write.lat.at(99.99), 19_791_872);
        assert_eq!(r.sync_lat.samples, 1023);
        assert_eq!(r.sync_lat.p99_ns(), 2_867_200);
        assert_eq!(r.ack_lat.p99_ns(), 1_204_224 + 2_867_200);
        assert_eq!(r.ack_lat.min_ns, r.write.lat.min_ns + r.sync_lat.min_ns);
    }

    #[test]
    fn falls_back_to_clat_without_lat_percentiles() {
        let mut v: Value = serde_json::from_str(SAMPLE).unwrap();
        let write = &mut v["jobs"][0]["write"];
        write["lat_ns"]
            .as_object_mut()
            .unwrap()
            .remove("percentile");
        let clat_p99 = write["clat_ns"]["percentile"]["99.000000"]
            .as_u64()
            .unwrap();
        let r = parse_append(&v.to_string()).unwrap();
        assert_eq!(r.write_lat_field, "clat_ns");
        assert_eq!(r.write.lat.p99_ns(), clat_p99);
    }

    #[test]
    fn skips_warnings_before_json() {
        let noisy = format!("fio: some warning\n{SAMPLE}");
        assert!(parse_append(&noisy).is_ok());
    }

    #[test]
    fn missing_and_mistyped_fields_are_typed_errors() {
        let mut v: Value = serde_json::from_str(SAMPLE).unwrap();
        v["jobs"][0].as_object_mut().unwrap().remove("sync");
        match parse_append(&v.to_string()) {
            Err(FioError::MissingField(f)) => assert_eq!(f, "jobs[0].sync"),
            other => panic!("unexpected {other:?}"),
        }

        let mut v: Value = serde_json::from_str(SAMPLE).unwrap();
        v["jobs"][0]["sync"]["lat_ns"]["percentile"]
            .as_object_mut()
            .unwrap()
            .remove("99.990000");
        match parse_append(&v.to_string()) {
            Err(FioError::MissingField(f)) => {
                assert_eq!(f, "jobs[0].sync.lat_ns.percentile.99.990000")
            }
            other => panic!("unexpected {other:?}"),
        }

        let mut v: Value = serde_json::from_str(SAMPLE).unwrap();
        v["jobs"][0]["write"]["bw_bytes"] = Value::from("fast");
        assert!(matches!(
            parse_append(&v.to_string()),
            Err(FioError::WrongType { path, .. }) if path == "jobs[0].write.bw_bytes"
        ));

        let mut v: Value = serde_json::from_str(SAMPLE).unwrap();
        v["jobs"] = Value::Array(vec![]);
        assert!(matches!(
            parse_append(&v.to_string()),
            Err(FioError::MissingField(f)) if f == "jobs[0]"
        ));

        let mut v: Value = serde_json::from_str(SAMPLE).unwrap();
        v["jobs"][0]["error"] = Value::from(5);
        assert!(matches!(
            parse_append(&v.to_string()),
            Err(FioError::JobError { code: 5, .. })
        ));

        assert!(matches!(parse_append("not json"), Err(FioError::Json(_))));
    }

    #[test]
    fn append_args_match_the_baseline_contract() {
        let job = AppendJob {
            file: Path::new("/d/fio.dat"),
            block_size_bytes: 64 << 10,
            size_bytes: 1 << 20,
            runtime: Duration::from_secs(10),
        };
        // Raised to the 64 MiB floor.
        assert_eq!(job.effective_size_bytes(), 64 << 20);
        let args = job.args().unwrap();
        for want in [
            "--filename=/d/fio.dat",
            "--rw=write",
            "--bs=65536",
            "--ioengine=io_uring",
            "--direct=1",
            "--fdatasync=1",
            "--size=67108864",
            "--runtime=10",
            "--time_based=0",
            "--output-format=json",
        ] {
            assert!(args.iter().any(|a| a == want), "missing {want} in {args:?}");
        }
        let odd = AppendJob {
            size_bytes: (100 << 20) + 1,
            ..job
        };
        assert_eq!(odd.effective_size_bytes(), (100 << 20) + (64 << 10));
        let short = AppendJob {
            runtime: Duration::from_millis(1500),
            ..job.clone()
        };
        assert!(short
            .args()
            .unwrap()
            .contains(&"--runtime=1500ms".to_owned()));
        assert_eq!(
            fio_time(Duration::ZERO),
            "1ms",
            "0 would mean no limit to fio"
        );
        assert_eq!(layout_size_bytes((100 << 20) + 1), 101 << 20);
        assert_eq!(
            filename_arg(Path::new("/a:b/f")).unwrap(),
            "--filename=/a\\:b/f"
        );
    }

    const TRANSFER_SAMPLE: &str = include_str!("testdata/fio-3.33-transfer-1m-qd4.json");

    #[test]
    fn parses_captured_transfer_run() {
        let r = parse_transfer(TRANSFER_SAMPLE).unwrap();
        assert_eq!(r.version, "fio-3.33");
        assert_eq!(r.read.bytes, 64 << 20);
        assert_eq!(r.read.ios, 64);
        assert_eq!(r.read.runtime, Duration::from_millis(183));
        assert_eq!(r.read.bw_bytes, 366_715_103.0);
        assert_eq!(r.read.lat.p99_ns(), 44_826_624);
        assert_eq!(r.write.bytes, 64 << 20);
        assert_eq!(r.write.runtime, Duration::from_millis(209));
        assert_eq!(r.write.lat.p99_ns(), 26_869_760);
        assert_eq!(r.lat_field, "lat_ns");
        // The transfer: 64 MiB in 183 + 209 ms.
        assert_eq!(r.transfer.bytes, 64 << 20);
        assert_eq!(r.transfer.ios, 64);
        assert_eq!(r.transfer.runtime, Duration::from_millis(392));
        assert!((r.transfer.bw_bytes - (64u64 << 20) as f64 / 0.392).abs() < 1.0);
        assert_eq!(r.transfer.lat.p99_ns(), 44_826_624 + 26_869_760);
    }

    #[test]
    fn transfer_jobs_are_found_by_name_and_errors_are_typed() {
        let mut v: Value = serde_json::from_str(TRANSFER_SAMPLE).unwrap();
        v["jobs"].as_array_mut().unwrap().reverse();
        let r = parse_transfer(&v.to_string()).unwrap();
        assert_eq!(r.read.runtime, Duration::from_millis(183));

        let mut v: Value = serde_json::from_str(TRANSFER_SAMPLE).unwrap();
        v["jobs"].as_array_mut().unwrap().pop();
        assert!(matches!(
            parse_transfer(&v.to_string()),
            Err(FioError::MissingField(f)) if f == "jobs[jobname=write]"
        ));

        let mut v: Value = serde_json::from_str(TRANSFER_SAMPLE).unwrap();
        v["jobs"][1]["error"] = Value::from(5);
        assert!(matches!(
            parse_transfer(&v.to_string()),
            Err(FioError::JobError { code: 5, .. })
        ));

        let mut v: Value = serde_json::from_str(TRANSFER_SAMPLE).unwrap();
        v["jobs"][0]["read"]
            .as_object_mut()
            .unwrap()
            .remove("runtime");
        assert!(matches!(
            parse_transfer(&v.to_string()),
            Err(FioError::MissingField(f)) if f == "jobs[0].read.runtime"
        ));
    }

    #[test]
    fn transfer_args_match_the_baseline_contract() {
        let job = TransferJob {
            read_file: Path::new("/d/fio-read.dat"),
            write_file: Path::new("/d/fio-write.dat"),
            block_size_bytes: 1 << 20,
            size_bytes: (512 << 20) + 1,
            iodepth: 4,
        };
        assert_eq!(job.effective_size_bytes(), 513 << 20);
        let args = job.args().unwrap();
        let pos = |want: &str| {
            args.iter()
                .position(|a| a == want)
                .unwrap_or_else(|| panic!("missing {want} in {args:?}"))
        };
        for want in [
            "--ioengine=io_uring",
            "--direct=1",
            "--bs=1048576",
            "--iodepth=4",
            "--size=537919488",
            "--output-format=json",
        ] {
            // Global: before the first job.
            assert!(pos(want) < pos("--name=read"), "{want}");
        }
        assert!(pos("--name=read") < pos("--filename=/d/fio-read.dat"));
        assert!(pos("--filename=/d/fio-read.dat") < pos("--rw=read"));
        assert!(pos("--rw=read") < pos("--name=write"));
        for want in [
            "--stonewall",
            "--filename=/d/fio-write.dat",
            "--rw=write",
            "--end_fsync=1",
        ] {
            assert!(pos(want) > pos("--name=write"), "{want}");
        }
    }

    #[test]
    fn command_line_quotes_only_when_needed() {
        let args = vec!["--name=append".to_owned(), "--filename=/x y/f".to_owned()];
        assert_eq!(command_line(&args), "fio --name=append '--filename=/x y/f'");
    }
}
