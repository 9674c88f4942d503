//! `ringlog-bench produce --cluster N`: produce to a replicated topic on a
//! local N-node cluster this job starts (real processes on 127.0.0.1,
//! peers over loopback TCP), against the same produce to a single node
//! started alongside, reps alternated. Issue 11 item 7's targets: at least
//! 390 MB/s of 1 KB records replicated on 3 nodes, and a p50 ack latency
//! within the single node's + 0.3 ms.

use std::fs;
use std::io::Read as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::harness::{self, Header, Job, RepNo};
use crate::jobs::produce::{self, ProduceConfig, ProduceResult};
use crate::jobs::server::{self, ServerProcess};
use serde_json::{json, Value};

use crate::plot::Series;
use crate::report::{Comparison, JobReport, Report, PRODUCE_ACK_NOTE};
use crate::server_bench::{common_notes, common_settings, produce_config, server_flags, workspace};
use crate::size::Secs;
use crate::{fs_err, BenchError, ProduceArgs};

/// A topic created (or deleted) through one node reaches the others by
/// the metadata group's commit and apply: well within this.
const LISTED_TIMEOUT: Duration = Duration::from_secs(30);

/// Replicated throughput target, bytes per second (issue 11 item 7).
pub const CLUSTER_BYTES_PER_SEC_MIN: f64 = 390e6;
/// The cluster's p50 ack latency may exceed the single node's by this.
pub const CLUSTER_P50_EXTRA_NS_MAX: u64 = 300_000;
/// Nodes a local cluster may have (the server's peer table is small).
pub const CLUSTER_NODES_MAX: u32 = 7;

pub const CLUSTER_VS_SINGLE: Comparison = Comparison {
    pair: "cluster/single",
    latency: "ack",
    cpu: false,
    notes: &[
        "cluster = produce to a topic replicated on every node of the started cluster (R = \
         nodes): acknowledged once durable (fdatasync) on a quorum; single = the same produce \
         to one node started alongside (R = 1); all servers share this machine's disk and cores",
        "targets (issue 11 item 7): cluster throughput >= 390 MB/s, cluster p50 ack latency <= \
         single p50 + 0.3 ms; see the targets line",
    ],
};

/// A started local cluster: node `i + 1` is `nodes[i]` (None while it is
/// killed).
pub(crate) struct LocalCluster {
    nodes: Vec<Option<ServerProcess>>,
    bin: PathBuf,
    dir: PathBuf,
    shards: u32,
    /// Each node's flags, kept to boot it again.
    args: Vec<Vec<String>>,
}

impl LocalCluster {
    /// Starts `n` nodes in `dir/n<id>` with a generated secret and derived
    /// peer ports; each node runs `--shards shards` with `flags`.
    fn start(
        bin: &Path,
        dir: &Path,
        n: u32,
        shards: u32,
        flags: &[String],
    ) -> Result<LocalCluster, BenchError> {
        let listen = peer_addrs(n)?;
        Self::start_routed(bin, dir, shards, flags, &listen, &|_, to| {
            listen[to as usize - 1]
        })
    }

    /// As [`LocalCluster::start`], node `i + 1` taking peer connections on
    /// `listen[i]` and dialling node `to` at `route(from, to)` (a proxy in
    /// between, or `listen` itself); a node's own entry is its `listen`.
    pub(crate) fn start_routed(
        bin: &Path,
        dir: &Path,
        shards: u32,
        flags: &[String],
        listen: &[SocketAddr],
        route: &dyn Fn(u32, u32) -> SocketAddr,
    ) -> Result<LocalCluster, BenchError> {
        let n = listen.len() as u32;
        assert!(
            (2..=CLUSTER_NODES_MAX).contains(&n),
            "checked by the caller"
        );
        fs::create_dir(dir).map_err(fs_err("create", dir))?;
        let secret = dir.join("secret");
        write_secret(&secret)?;
        let mut cluster = LocalCluster {
            nodes: Vec::new(),
            bin: bin.to_owned(),
            dir: dir.to_owned(),
            shards,
            args: Vec::new(),
        };
        for id in 1..=n {
            let mut args: Vec<String> = vec![
                "--cluster-id".into(),
                "bench".into(),
                "--node-id".into(),
                id.to_string(),
                "--cluster-secret-file".into(),
                secret.display().to_string(),
                // Every node's shard i would pin to core i: all on the same
                // cores of this one machine. Unpinned, the kernel spreads
                // them (as `ringlog cluster up` does).
                "--set".into(),
                "pin_cores=false".into(),
            ];
            for to in 1..=n {
                let addr = if to == id {
                    listen[id as usize - 1]
                } else {
                    route(id, to)
                };
                args.extend(["--peer".to_owned(), format!("{to}={addr}")]);
            }
            args.extend(flags.iter().cloned());
            let node = ServerProcess::start(bin, &cluster.node_dir(id), shards, &args)?;
            eprintln!("ringlog-bench: cluster node {id} ready at {}", node.addr);
            cluster.nodes.push(Some(node));
            cluster.args.push(args);
        }
        Ok(cluster)
    }

    fn node_dir(&self, id: u32) -> PathBuf {
        self.dir.join(format!("n{id}"))
    }

    /// Node `id`, while it runs.
    pub(crate) fn node(&self, id: u32) -> Option<&ServerProcess> {
        self.nodes.get(id as usize - 1)?.as_ref()
    }

    /// SIGKILLs node `id` (and reaps it); its data stays.
    pub(crate) fn kill(&mut self, id: u32) {
        if let Some(slot) = self.nodes.get_mut(id as usize - 1) {
            drop(slot.take());
        }
    }

    /// Starts killed node `id` again over its data, with its flags.
    pub(crate) fn boot(&mut self, id: u32) -> Result<&ServerProcess, BenchError> {
        let i = id as usize - 1;
        assert!(self.nodes[i].is_none(), "boot a killed node");
        let node = ServerProcess::launch(
            &self.bin,
            &self.node_dir(id),
            self.shards,
            &self.args[i],
            None,
        )?;
        Ok(self.nodes[i].insert(node))
    }

    /// Creates `topic` once, through the first live node (the cluster's
    /// metadata group carries it to the others), and waits until every
    /// live node lists it.
    pub(crate) fn create_topic(&self, topic: &str, partitions: u32) -> Result<(), BenchError> {
        let first = self.nodes.iter().flatten().next();
        if let Some(n) = first {
            produce::create_topic(&n.addr, topic, partitions)?;
        }
        self.wait_listed(topic, true)
    }

    /// Deletes `topic` once, through the first live node, and waits until
    /// no live node lists it.
    pub(crate) fn delete_topic(&self, topic: &str) -> Result<(), BenchError> {
        if let Some(n) = self.nodes.iter().flatten().next() {
            produce::delete_topic(&n.addr, topic)?;
        }
        self.wait_listed(topic, false)
    }

    /// Waits (at most [`LISTED_TIMEOUT`]) until every live node lists
    /// `topic` (`listed`) or none does.
    fn wait_listed(&self, topic: &str, listed: bool) -> Result<(), BenchError> {
        let deadline = std::time::Instant::now() + LISTED_TIMEOUT;
        for n in self.nodes.iter().flatten() {
            while produce::topic_listed(&n.addr, topic)? != listed {
                if std::time::Instant::now() > deadline {
                    let what = if listed { "listed" } else { "gone" };
                    return Err(BenchError::Mismatch(format!(
                        "topic {topic:?} not {what} at {} within {LISTED_TIMEOUT:?}",
                        n.addr
                    )));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Ok(())
    }

    /// The primary of a new topic's view 0: the node with the smallest id.
    pub(crate) fn primary_addr(&self) -> &str {
        self.node(1).map_or("", |n| n.addr.as_str())
    }

    pub(crate) fn stop(self) -> Result<(), BenchError> {
        let mut first = Ok(());
        for n in self.nodes.into_iter().flatten() {
            if let Err(e) = n.stop() {
                first = first.and(Err(e.into()));
            }
        }
        first
    }
}

/// 32 random bytes, hex, mode 0600 from creation (as `cluster up` makes).
fn write_secret(path: &Path) -> Result<(), BenchError> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt;
    let mut raw = [0u8; 32];
    fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut raw))
        .map_err(fs_err("read", Path::new("/dev/urandom")))?;
    let hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| f.write_all(hex.as_bytes()))
        .map_err(fs_err("write", path))
}

/// `n` peer addresses on 127.0.0.1, free now.
pub(crate) fn peer_addrs(n: u32) -> Result<Vec<SocketAddr>, BenchError> {
    (0..n)
        .map(|_| Ok(SocketAddr::from(([127, 0, 0, 1], free_port()?))))
        .collect()
}

/// A port free now, below the kernel's ephemeral range (32768 and up by
/// default), so no outgoing connection's source port takes it meanwhile.
fn free_port() -> Result<u16, BenchError> {
    use std::sync::atomic::{AtomicU16, Ordering};
    // Each call moves on: a port just probed is free again at once.
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let salt = (std::process::id() % 97) as u16 * 60;
    for _ in 0..6_000u16 {
        // At most 21_000 + 5_760 + 5_999 < 32_768.
        let port = 21_000 + salt + NEXT.fetch_add(1, Ordering::Relaxed) % 6_000;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    Err(BenchError::Usage(
        "no free peer port in 21000-32767 on 127.0.0.1".into(),
    ))
}

/// Runs the job and cleans up; the report is not printed.
pub(crate) fn cluster_produce_report(
    args: &ProduceArgs,
    nodes: u32,
) -> Result<Report<ProduceResult, ProduceResult>, BenchError> {
    let a = &args.common;
    if a.addr.is_some() || args.vs_append {
        return Err(BenchError::Usage(
            "--cluster starts its own servers (no --addr) and compares with a single node \
             (no --vs-append)"
                .into(),
        ));
    }
    if !(2..=CLUSTER_NODES_MAX).contains(&nodes) || nodes.is_multiple_of(2) {
        return Err(BenchError::Usage(format!(
            "--cluster {nodes}: a local cluster has 3, 5 or {CLUSTER_NODES_MAX} nodes \
             (a replica group is odd)"
        )));
    }
    let cfg = produce_config(a, args.duration, args.size, args.in_flight)?;
    let cluster_dir = a.data.dir.join("cluster");
    let ws = workspace(a, Some(&cluster_dir))?;
    let job = ClusterJob {
        args,
        nodes,
        cfg,
        cluster_dir,
        cluster: None,
        single: None,
    };
    harness::run(job, ws, a.rep.reps, true)
}

struct ClusterJob<'a> {
    args: &'a ProduceArgs,
    nodes: u32,
    cfg: ProduceConfig,
    cluster_dir: PathBuf,
    /// Set by `start`.
    cluster: Option<LocalCluster>,
    single: Option<ServerProcess>,
}

impl ClusterJob<'_> {
    /// One timed produce into a new topic at `addr`.
    fn produce(&self, addr: &str, topic: &str) -> Result<ProduceResult, BenchError> {
        Ok(produce::run(&ProduceConfig {
            addr: addr.to_owned(),
            topic: topic.to_owned(),
            ..self.cfg.clone()
        })?)
    }
}

impl Job for ClusterJob<'_> {
    type Ours = ProduceResult;
    type Theirs = ProduceResult;
    const NAME: &'static str = "produce-cluster";
    const LABELS: [&'static str; 2] = ["cluster", "single"];
    const COMPARISON: Option<Comparison> = Some(CLUSTER_VS_SINGLE);

    fn planned(&self) -> Option<Duration> {
        Some(self.cfg.duration)
    }

    fn start(&mut self) -> Result<(), BenchError> {
        let a = &self.args.common;
        let bin = server::locate_binary(a.server_bin.as_deref())?;
        let flags = server_flags(a, &[])?;
        self.cluster = Some(LocalCluster::start(
            &bin,
            &self.cluster_dir,
            self.nodes,
            a.shards,
            &flags,
        )?);
        let single = ServerProcess::start(&bin, &a.server_dir(), a.shards, &flags)?;
        eprintln!("ringlog-bench: single node ready at {}", single.addr);
        self.single = Some(single);
        Ok(())
    }

    fn ours(&mut self, rep: RepNo) -> Result<ProduceResult, BenchError> {
        let c = self.cluster.as_ref().expect("start sets the cluster");
        let topic = format!("{}-{}-cluster", self.args.common.topic, rep.n);
        c.create_topic(&topic, self.cfg.partitions)?;
        let result = self.produce(c.primary_addr(), &topic);
        if !self.args.common.data.keep {
            c.delete_topic(&topic)?;
        }
        result
    }

    fn theirs(&mut self, rep: RepNo, _: &ProduceResult) -> Result<ProduceResult, BenchError> {
        let addr = self.single.as_ref().expect("start sets it").addr.clone();
        let topic = format!("{}-{}-single", self.args.common.topic, rep.n);
        produce::create_topic(&addr, &topic, self.cfg.partitions)?;
        let result = self.produce(&addr, &topic);
        if !self.args.common.data.keep {
            produce::delete_topic(&addr, &topic)?;
        }
        result
    }

    fn stop(&mut self) -> Result<(), BenchError> {
        let cluster = self.cluster.take().map_or(Ok(()), LocalCluster::stop);
        let single = self.single.take().map_or(Ok(()), |s| Ok(s.stop()?));
        cluster.and(single)
    }

    fn header(&self) -> Header {
        let (args, a) = (self.args, &self.args.common);
        let mut settings = common_settings(a);
        settings.extend([
            ("cluster", self.nodes.to_string()),
            ("duration", Secs(args.duration).to_string()),
            ("in_flight", args.in_flight.to_string()),
            ("reps", a.rep.reps.to_string()),
        ]);
        let mut notes = common_notes(a);
        notes.push(format!(
            "{} nodes (each --shards {}, unpinned: pin_cores=false) and one single node \
             (pinned, as by default), started by ringlog-bench on 127.0.0.1; each rep produces into a new topic on each side (created on every node \
             by hand, deleted after), to the cluster's view-0 primary (node 1)",
            self.nodes, a.shards
        ));
        notes.push(PRODUCE_ACK_NOTE.to_owned());
        Header {
            settings,
            fio_version: None,
            notes,
        }
    }
}

/// The job's report with its targets line (text) and field (JSON).
pub struct ClusterReport(pub Report<ProduceResult, ProduceResult>);

impl JobReport for ClusterReport {
    fn text(&self) -> String {
        let mut out = self.0.text();
        out.push_str(&targets_line(&self.0));
        out.push('\n');
        out
    }
    fn json(&self) -> Value {
        let mut v = self.0.json();
        v["targets"] = json!(targets_line(&self.0));
        v
    }
    fn series(&self) -> Vec<Series<'_>> {
        self.0.series()
    }
}

/// The targets line: the medians over the reps of the cluster's MB/s and
/// of its p50 excess over the single node, against issue 11 item 7.
pub fn targets_line(report: &Report<ProduceResult, ProduceResult>) -> String {
    let mut mbps = Vec::new();
    let mut extra = Vec::new();
    for rep in &report.reps {
        let c = &rep.ours.summary;
        mbps.push(c.bytes as f64 / c.runtime.as_secs_f64().max(1e-9));
        if let Some(s) = &rep.theirs {
            extra.push(c.lat.at(50.0) as f64 - s.summary.lat.at(50.0) as f64);
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
    };
    let (bw, lat) = (median(&mut mbps), median(&mut extra));
    format!(
        "targets: cluster {:.1} MB/s (median; target >= {:.0}) {}; cluster p50 - single p50 = \
         {:.3} ms (median; target <= {:.1}) {}",
        bw / 1e6,
        CLUSTER_BYTES_PER_SEC_MIN / 1e6,
        if bw >= CLUSTER_BYTES_PER_SEC_MIN {
            "met"
        } else {
            "MISSED"
        },
        lat / 1e6,
        CLUSTER_P50_EXTRA_NS_MAX as f64 / 1e6,
        if lat <= CLUSTER_P50_EXTRA_NS_MAX as f64 {
            "met"
        } else {
            "MISSED"
        },
    )
}

#[cfg(test)]
mod tests {
    //! Against real `ringlog` servers (ci/test's `cargo test --workspace`
    //! builds the binary; alone: `cargo build -p ringlog` first).

    use super::*;
    use crate::testutil::{data_dir, produce};

    #[test]
    fn a_cluster_needs_an_odd_three_to_seven_nodes_and_its_own_servers() {
        let (_tmp, dir) = data_dir();
        let d = dir.display();
        for line in [
            format!("produce --dir {d} --cluster 1"),
            format!("produce --dir {d} --cluster 4"),
            format!("produce --dir {d} --cluster 8"),
        ] {
            let a = produce(&line);
            let n = a.cluster.unwrap();
            let e = cluster_produce_report(&a, n).err();
            assert!(matches!(e, Some(BenchError::Usage(_))), "{line}: {e:?}");
        }
        assert!(!dir.exists(), "a usage error creates nothing");
        let argv = "ringlog-bench produce --cluster 3 --vs-append";
        assert!(<crate::Cli as clap::Parser>::try_parse_from(argv.split(' ')).is_err());
    }

    /// Starts 3 nodes and a single node, produces 1 MiB to each side per
    /// rep (past a 256 KiB segment's end, so backups roll), and checks the
    /// report and its targets line.
    #[test]
    fn produce_to_a_local_cluster_smoke() {
        let (_tmp, dir) = data_dir();
        let a = produce(&format!(
            "produce --dir {} --cluster 3 --shards 1 --segment-size 256k --batch-size 16k \
             --duration 30 --size 1m --reps 2",
            dir.display()
        ));
        let report = cluster_produce_report(&a, 3).unwrap_or_else(|e| panic!("{e}"));
        assert!(!dir.exists(), "data dir is removed without --keep");
        assert_eq!(report.reps.len(), 2);
        for rep in &report.reps {
            for side in [&rep.ours, rep.theirs.as_ref().unwrap()] {
                assert_eq!(side.summary.bytes, 1 << 20);
                assert_eq!(side.summary.lat.samples, 64);
            }
        }
        let text = ClusterReport(report).text();
        assert!(text.contains("ratio throughput cluster/single"), "{text}");
        assert!(text.contains("targets: cluster "), "{text}");
    }
}
