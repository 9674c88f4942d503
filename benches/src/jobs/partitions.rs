//! The partitions job: what many partitions cost a node. It starts a
//! `ringlog server`, creates `partitions` empty partitions (spread over
//! topics of at most `topic_partitions` each), restarts the server and times
//! boot to ready, reads the server's resident memory and the data
//! directory's disk use, then produces to every partition round-robin and
//! checks every acknowledgement.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ringlog_shard::client::Client;

use crate::jobs::append::{build_batch, AppendError};
use crate::jobs::produce::{create_topic, ClientJobError};
use crate::jobs::server::{ServerError, ServerProcess};

#[derive(Debug, thiserror::Error)]
pub enum PartitionsError {
    #[error(transparent)]
    Server(#[from] ServerError),
    #[error(transparent)]
    Client(#[from] ClientJobError),
    #[error(transparent)]
    Batch(#[from] AppendError),
    #[error("{what} {path}: {source}")]
    Fs {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("reading the server's memory use: {0}")]
    Rss(String),
}

#[derive(Debug, Clone)]
pub struct PartitionsConfig {
    /// The `ringlog` binary.
    pub bin: PathBuf,
    /// The server's directory (created; must not exist).
    pub dir: PathBuf,
    pub shards: u32,
    pub partitions: u32,
    /// Partitions per topic (the protocol caps a topic's count).
    pub topic_partitions: u32,
    /// Client connections producing in parallel, one thread each.
    pub connections: u32,
    /// Encoded bytes of each produced batch.
    pub batch_size: usize,
    pub record_size: usize,
    /// Rounds of one produce to every partition.
    pub rounds: u32,
    /// Extra server flags.
    pub extra: Vec<String>,
    /// RLIMIT_NOFILE the server runs with, if set.
    pub files_max: Option<u64>,
}

/// Resources in use at one point.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Figures {
    /// The server's VmRSS.
    pub rss_bytes: u64,
    /// Blocks allocated under the data directory (not apparent sizes).
    pub disk_bytes: u64,
}

#[derive(Debug, Clone)]
pub struct PartitionsResult {
    pub create_time: Duration,
    pub created: Figures,
    /// From spawning the restarted server to its first client handshake.
    pub boot_time: Duration,
    pub booted: Figures,
    pub produce_time: Duration,
    pub produces: u64,
    pub produced: Figures,
}

/// The topics holding `partitions` partitions, at most `per_topic` each:
/// (name, partition count).
pub fn topics(partitions: u32, per_topic: u32) -> Vec<(String, u32)> {
    let per_topic = per_topic.max(1);
    (0..partitions.div_ceil(per_topic))
        .map(|t| {
            let count = per_topic.min(partitions - t * per_topic);
            (format!("parts-{t}"), count)
        })
        .collect()
}

/// Runs the job; the server is stopped (its data left in `cfg.dir`).
pub fn run(cfg: &PartitionsConfig) -> Result<PartitionsResult, PartitionsError> {
    let topics = topics(cfg.partitions, cfg.topic_partitions);
    fs::create_dir(&cfg.dir).map_err(|source| PartitionsError::Fs {
        what: "create",
        path: cfg.dir.clone(),
        source,
    })?;
    let launch =
        || ServerProcess::launch(&cfg.bin, &cfg.dir, cfg.shards, &cfg.extra, cfg.files_max);
    let server = launch()?;
    let started = Instant::now();
    for (name, count) in &topics {
        create_topic(&server.addr, name, *count)?;
    }
    let create_time = started.elapsed();
    let created = figures(&server, &cfg.dir)?;
    server.stop()?;

    let booting = Instant::now();
    let server = launch()?;
    let boot_time = booting.elapsed();
    let booted = figures(&server, &cfg.dir)?;

    let producing = Instant::now();
    let produces = produce_all(cfg, &server.addr, &topics)?;
    let produce_time = producing.elapsed();
    let produced = figures(&server, &cfg.dir)?;
    server.stop()?;
    Ok(PartitionsResult {
        create_time,
        created,
        boot_time,
        booted,
        produce_time,
        produces,
        produced,
    })
}

fn figures(server: &ServerProcess, dir: &Path) -> Result<Figures, PartitionsError> {
    let pid = server
        .pid()
        .ok_or_else(|| PartitionsError::Rss("the server is not running".into()))?;
    Ok(Figures {
        rss_bytes: rss_bytes(pid)?,
        disk_bytes: disk_bytes(&dir.join("data"))?,
    })
}

/// VmRSS of process `pid`.
pub fn rss_bytes(pid: u32) -> Result<u64, PartitionsError> {
    let path = format!("/proc/{pid}/status");
    let status =
        fs::read_to_string(&path).map_err(|e| PartitionsError::Rss(format!("{path}: {e}")))?;
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .ok_or_else(|| PartitionsError::Rss(format!("no VmRSS line in {path}")))?;
    Ok(kib * 1024)
}

/// Bytes allocated to everything under `dir` (st_blocks, like `du`).
pub fn disk_bytes(dir: &Path) -> Result<u64, PartitionsError> {
    use std::os::unix::fs::MetadataExt as _;
    let fs_err = |path: &Path| {
        let path = path.to_owned();
        move |source| PartitionsError::Fs {
            what: "stat",
            path,
            source,
        }
    };
    let mut total = 0;
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        total += fs::symlink_metadata(&d).map_err(fs_err(&d))?.blocks() * 512;
        for entry in fs::read_dir(&d).map_err(fs_err(&d))? {
            let entry = entry.map_err(fs_err(&d))?;
            let meta = entry.metadata().map_err(fs_err(&entry.path()))?;
            if meta.is_dir() {
                stack.push(entry.path());
            } else {
                total += meta.blocks() * 512;
            }
        }
    }
    Ok(total)
}

/// `cfg.rounds` rounds of one produce to every partition, the partitions
/// dealt round-robin to the connections; checks that each acknowledgement
/// continues its partition's log. Returns the produces acknowledged.
fn produce_all(
    cfg: &PartitionsConfig,
    addr: &str,
    topics: &[(String, u32)],
) -> Result<u64, PartitionsError> {
    let targets: Vec<(&str, u32)> = topics
        .iter()
        .flat_map(|(name, count)| (0..*count).map(move |i| (name.as_str(), i)))
        .collect();
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let (batch, records) = build_batch(0, cfg.batch_size, cfg.record_size, now_ms)?;
    let acked = AtomicU64::new(0);
    let connections = cfg.connections.max(1) as usize;
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..connections)
            .map(|conn| {
                let mine: Vec<(&str, u32)> = targets
                    .iter()
                    .skip(conn)
                    .step_by(connections)
                    .copied()
                    .collect();
                let (batch, acked) = (&batch, &acked);
                s.spawn(move || {
                    produce_conn(conn as u32, addr, &mine, batch, records, cfg.rounds, acked)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect::<Result<Vec<()>, ClientJobError>>()
    })?;
    Ok(acked.load(Ordering::Relaxed))
}

fn produce_conn(
    conn: u32,
    addr: &str,
    targets: &[(&str, u32)],
    batch: &[u8],
    records: u32,
    rounds: u32,
    acked: &AtomicU64,
) -> Result<(), ClientJobError> {
    let mut client = Client::connect(addr).map_err(|source| ClientJobError::Client {
        conn,
        what: format!("connecting to {addr}"),
        source,
    })?;
    for round in 0..u64::from(rounds) {
        for &(topic, partition) in targets {
            let reply = client
                .produce(topic, partition, batch.to_vec())
                .map_err(|source| ClientJobError::Client {
                    conn,
                    what: format!("producing to {topic}/{partition}"),
                    source,
                })?;
            let want = round * u64::from(records);
            if reply.partition != partition
                || reply.base_offset != want
                || reply.next_offset != want + u64::from(records)
            {
                return Err(ClientJobError::Check {
                    conn,
                    what: format!(
                        "{topic}/{partition}: acknowledged {reply:?}, expected base offset {want}"
                    ),
                });
            }
            acked.fetch_add(1, Ordering::Relaxed);
        }
    }
    Ok(())
}

/// Limits the run must stay within (with every partition empty, after the
/// restart).
#[derive(Debug, Clone, Copy)]
pub struct Targets {
    pub boot_time_max: Duration,
    pub rss_bytes_max: u64,
    pub disk_bytes_max: u64,
}

/// A run's figures and the targets they are held to.
#[derive(Debug, Clone)]
pub struct PartitionsOutcome {
    pub result: PartitionsResult,
    pub targets: Targets,
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1 << 20)
}

impl PartitionsOutcome {
    /// The targets the run missed, if any.
    pub fn missed(&self) -> Vec<String> {
        let (r, t) = (&self.result, &self.targets);
        let mut missed = Vec::new();
        if r.boot_time > t.boot_time_max {
            missed.push(format!(
                "boot to ready {} ms > {} ms",
                r.boot_time.as_millis(),
                t.boot_time_max.as_millis()
            ));
        }
        if r.booted.rss_bytes > t.rss_bytes_max {
            missed.push(format!(
                "RSS {:.1} MiB > {:.1} MiB",
                mib(r.booted.rss_bytes),
                mib(t.rss_bytes_max)
            ));
        }
        if r.booted.disk_bytes > t.disk_bytes_max {
            missed.push(format!(
                "disk {:.1} MiB > {:.1} MiB",
                mib(r.booted.disk_bytes),
                mib(t.disk_bytes_max)
            ));
        }
        missed
    }

    /// The report's lines for this run.
    pub fn text(&self, out: &mut String) {
        let r = &self.result;
        let line = |what: &str, f: &Figures| {
            format!(
                "  {what:<22} rss={:.1}MiB disk={:.1}MiB\n",
                mib(f.rss_bytes),
                mib(f.disk_bytes)
            )
        };
        *out += &format!("  created in {:.1} s\n", r.create_time.as_secs_f64());
        *out += &line("after create:", &r.created);
        *out += &format!("  boot to ready: {} ms\n", r.boot_time.as_millis());
        *out += &line("after restart (empty):", &r.booted);
        *out += &format!(
            "  produced {} batches (every partition, round-robin) in {:.1} s, every ack checked\n",
            r.produces,
            r.produce_time.as_secs_f64()
        );
        *out += &line("after produce:", &r.produced);
        let missed = self.missed();
        *out += &if missed.is_empty() {
            "  targets met: boot, RSS and disk within limits\n".to_owned()
        } else {
            format!("  TARGETS MISSED: {}\n", missed.join("; "))
        };
    }

    /// The report's JSON fields for this run.
    pub fn json(&self) -> serde_json::Value {
        let r = &self.result;
        let fig =
            |f: &Figures| serde_json::json!({"rss_bytes": f.rss_bytes, "disk_bytes": f.disk_bytes});
        serde_json::json!({
            "create_ms": r.create_time.as_millis() as u64,
            "created": fig(&r.created),
            "boot_ms": r.boot_time.as_millis() as u64,
            "booted": fig(&r.booted),
            "produces": r.produces,
            "produce_ms": r.produce_time.as_millis() as u64,
            "produced": fig(&r.produced),
            "targets_missed": self.missed(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topics_cover_every_partition() {
        assert_eq!(
            topics(2500, 1000),
            vec![
                ("parts-0".to_owned(), 1000),
                ("parts-1".to_owned(), 1000),
                ("parts-2".to_owned(), 500)
            ]
        );
        assert_eq!(topics(3, 1000), vec![("parts-0".to_owned(), 3)]);
    }

    #[test]
    fn disk_counts_allocated_blocks_not_sizes() {
        let tmp = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let sub = tmp.path().join("a");
        fs::create_dir(&sub).unwrap();
        let f = fs::File::create(sub.join("sparse")).unwrap();
        f.set_len(64 << 20).unwrap();
        fs::write(sub.join("dense"), vec![1u8; 1 << 20]).unwrap();
        let used = disk_bytes(tmp.path()).unwrap();
        assert!((1 << 20..8 << 20).contains(&used), "{used}");
        let me = rss_bytes(std::process::id()).unwrap();
        assert!(me > 1 << 20, "{me}");
    }
}
