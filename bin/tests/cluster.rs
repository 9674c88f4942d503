//! A replicated partition across three real server processes on
//! 127.0.0.1: produce is acknowledged at a quorum, every node serves the
//! same bytes up to its commit, a SIGKILLed backup catches up by repair
//! after a restart, and a SIGKILLed primary is replaced by a view change.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;
use ringlog_protocol::wire::ErrorCode;
use ringlog_shard::client::{batch_of, records, Client, ClientError};

const TOPIC: &str = "replicated";
const PARTITIONS: u32 = 2;
/// Records per produced batch.
const PER_BATCH: usize = 4;
/// A new primary must take over within this after the old one is killed
/// (the replicas' primary-silent timeout is 30 ticks of 20 ms; the rest is
/// the view change and reconnects).
const FAILOVER_MAX: Duration = Duration::from_secs(10);

/// A free port below the kernel's ephemeral range (32768 and up by
/// default): a peer port freed by a SIGKILL must not be taken meanwhile by
/// some connection's source port, or the node could not restart on it.
fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let salt = (std::process::id() % 100) as u16 * 50;
    loop {
        // At most 20_000 + 4_950 + 6_999 < 32_768.
        let port = 20_000 + salt + NEXT.fetch_add(1, Ordering::Relaxed) % 7_000;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

struct Cluster {
    dir: tempfile::TempDir,
    secret: PathBuf,
    peers: Vec<String>,
    nodes: BTreeMap<u32, Server>,
    /// More flags for every node.
    extra: Vec<String>,
}

impl Cluster {
    fn start(n: u32) -> Cluster {
        Cluster::start_with(n, &[])
    }

    /// [`Cluster::start`] with `extra` flags on every node.
    fn start_with(n: u32, extra: &[&str]) -> Cluster {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, "k".repeat(40)).unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
        let peers = (1..=n)
            .map(|id| format!("{id}=127.0.0.1:{}", free_port()))
            .collect();
        let mut c = Cluster {
            dir,
            secret,
            peers,
            nodes: BTreeMap::new(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        for id in 1..=n {
            c.boot(id);
        }
        c
    }

    fn data_dir(&self, id: u32) -> PathBuf {
        self.dir.path().join(format!("n{id}"))
    }

    /// Starts (or restarts, on its data dir) node `id`.
    fn boot(&mut self, id: u32) {
        self.boot_with(id, &[]);
    }

    /// [`Cluster::boot`] with `extra` server flags.
    fn boot_with(&mut self, id: u32, extra: &[&str]) {
        self.wait_peer_port_free(id);
        let data = self.data_dir(id);
        std::fs::create_dir_all(&data).unwrap();
        let id_text = id.to_string();
        let mut args = vec![
            "--cluster-id",
            "test",
            "--node-id",
            &id_text,
            "--cluster-secret-file",
            self.secret.to_str().unwrap(),
        ];
        for p in &self.peers {
            args.extend(["--peer", p.as_str()]);
        }
        args.extend(self.extra.iter().map(String::as_str));
        args.extend(extra);
        self.nodes.insert(id, Server::start(&data, &args));
    }

    /// A SIGKILLed node's listener can outlive its reaped process for a
    /// moment (its io_uring is torn down after it exits, holding the
    /// socket of a pending accept): a restart on its peer port waits for
    /// it, at most 10 s, as `cluster up` does.
    fn wait_peer_port_free(&self, id: u32) {
        let prefix = format!("{id}=");
        let addr = self
            .peers
            .iter()
            .find_map(|p| p.strip_prefix(&prefix))
            .expect("the node is in the peer list");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpListener::bind(addr).is_err() {
            assert!(Instant::now() < deadline, "peer address {addr} still taken");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn addr(&self, id: u32) -> Option<String> {
        self.nodes.get(&id).map(|s| s.addr.clone())
    }

    fn kill(&mut self, id: u32) {
        if let Some(mut s) = self.nodes.remove(&id) {
            s.kill9();
        }
    }
}

/// Produces `batch` to the partition's primary: starts at `*at`, follows
/// a not-primary refusal to the node it names, and rotates through the
/// live nodes on a connection failure or an unknown outcome. Returns the
/// acknowledged (base, next) offsets and whether an earlier attempt's
/// outcome is unknown (the connection broke, or the primary lost its view
/// with the op in flight): such a batch may be stored twice, as any
/// producer without idempotence sees.
fn produce_following(
    cluster: &Cluster,
    at: &mut u32,
    partition: u32,
    batch: &[u8],
    deadline: Instant,
) -> (u64, u64, bool) {
    let mut uncertain = false;
    let ids: Vec<u32> = cluster.nodes.keys().copied().collect();
    let mut last = String::new();
    loop {
        if Instant::now() > deadline {
            for (id, n) in &cluster.nodes {
                let log = n.stderr();
                let tail: Vec<&str> = log.lines().rev().take(30).collect();
                eprintln!(
                    "--- node {id} log tail (newest first):\n{}",
                    tail.join("\n")
                );
            }
            panic!("no primary took the produce in time; last error: {last}");
        }
        let Some(addr) = cluster.addr(*at) else {
            *at = next_node(&ids, *at);
            continue;
        };
        let result =
            Client::connect(&addr).and_then(|mut c| c.produce(TOPIC, partition, batch.to_vec()));
        let e = match result {
            Ok(ack) => return (ack.base_offset, ack.next_offset, uncertain),
            Err(e) => e,
        };
        last = format!("node {at}: {e}");
        match e.primary_node() {
            Some(node) if node != *at && cluster.nodes.contains_key(&node) => *at = node,
            _ => {
                if !(e.is_retryable() || e.code() == Some(ErrorCode::NotPrimary) || transient(&e)) {
                    panic!("produce to node {at}: {e}");
                }
                uncertain |= !matches!(e, ClientError::Connect { .. })
                    && e.code() != Some(ErrorCode::NotPrimary)
                    && !e.is_retryable();
                *at = next_node(&ids, *at);
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// Errors a produce may meet while nodes die and views change.
fn transient(e: &ClientError) -> bool {
    matches!(e, ClientError::Connect { .. } | ClientError::Io(_))
        || e.code() == Some(ErrorCode::PartitionUnavailable)
            && e.to_string().contains("outcome unknown")
}

fn next_node(ids: &[u32], at: u32) -> u32 {
    let i = ids
        .iter()
        .position(|&n| n == at)
        .map_or(0, |i| (i + 1) % ids.len());
    ids[i]
}

/// The partition's raw batches from offset 0 up to `end`, as node `addr`
/// serves them, waiting (bounded) until its high watermark reaches `end`.
fn read_up_to(addr: &str, partition: u32, end: u64, limit: Duration) -> Vec<u8> {
    read_range(addr, partition, 0, end, limit)
}

/// [`read_up_to`] from offset `from`.
fn read_range(addr: &str, partition: u32, from: u64, end: u64, limit: Duration) -> Vec<u8> {
    let deadline = Instant::now() + limit;
    let mut client = Client::connect(addr).unwrap();
    loop {
        let page = client.fetch(TOPIC, partition, from, 1, 0).unwrap();
        if page.high_watermark >= end {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{addr} partition {partition}: high watermark {} never reached {end}",
            page.high_watermark
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut out = Vec::new();
    let mut offset = from;
    while offset < end {
        let page = client.fetch(TOPIC, partition, offset, 1 << 20, 0).unwrap();
        assert!(
            page.next_offset > offset,
            "fetch made no progress at {offset}"
        );
        out.extend_from_slice(&page.batches);
        offset = page.next_offset;
    }
    out
}

/// What each acknowledged produce was: partition -> base offset ->
/// (values, whether an earlier attempt's outcome was unknown).
type Acks = BTreeMap<u32, BTreeMap<u64, (Vec<Vec<u8>>, bool)>>;

/// Every acknowledged record is in `bytes` at its offset with its value,
/// and only there unless an earlier attempt of its batch had an unknown
/// outcome; returns the number of records `bytes` holds.
fn check_acked(bytes: &[u8], acked: &BTreeMap<u64, (Vec<Vec<u8>>, bool)>) -> usize {
    let got: BTreeMap<u64, Vec<u8>> = records(bytes)
        .unwrap()
        .into_iter()
        .map(|r| (r.offset, r.value))
        .collect();
    let mut seen = std::collections::HashSet::new();
    for (base, (values, uncertain)) in acked {
        for (i, v) in values.iter().enumerate() {
            let at = base + i as u64;
            assert_eq!(
                got.get(&at),
                Some(v),
                "acknowledged record at {at} missing or wrong"
            );
            if !uncertain {
                assert!(seen.insert(v.clone()), "record {at} acknowledged twice");
            }
        }
    }
    // No acknowledged value appears at a second offset.
    let mut count = BTreeMap::new();
    for v in got.values() {
        *count.entry(v.clone()).or_insert(0) += 1;
    }
    for v in &seen {
        assert_eq!(
            count.get(v),
            Some(&1),
            "an acknowledged record is stored twice"
        );
    }
    got.len()
}

/// Produces batches `range` (following the primary); returns when and by
/// which node each was acknowledged.
fn produce_batches(
    cluster: &Cluster,
    at: &mut u32,
    acks: &mut Acks,
    range: std::ops::Range<usize>,
) -> Vec<(Instant, u32)> {
    produce_sized(cluster, at, acks, range, 100)
}

/// [`produce_batches`] with records of `value_bytes`.
fn produce_sized(
    cluster: &Cluster,
    at: &mut u32,
    acks: &mut Acks,
    range: std::ops::Range<usize>,
    value_bytes: usize,
) -> Vec<(Instant, u32)> {
    let mut times = Vec::with_capacity(range.len());
    for b in range {
        let partition = (b % PARTITIONS as usize) as u32;
        let values: Vec<Vec<u8>> = (0..PER_BATCH)
            .map(|i| value(0, b, i, value_bytes))
            .collect();
        let refs: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
        let batch = batch_of(&refs).unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        let (base, next, uncertain) = produce_following(cluster, at, partition, &batch, deadline);
        assert_eq!(next - base, PER_BATCH as u64);
        let prev = acks
            .entry(partition)
            .or_default()
            .insert(base, (values, uncertain));
        assert!(prev.is_none(), "offset {base} acknowledged twice");
        times.push((Instant::now(), *at));
    }
    times
}

/// The commit end every live node must reach: the highest acknowledged.
fn acked_end(acks: &Acks, partition: u32) -> u64 {
    acks.get(&partition)
        .and_then(|m| m.iter().next_back())
        .map_or(0, |(base, (v, _))| base + v.len() as u64)
}

/// Every live node serves byte-identical batches up to the acknowledged
/// end, holding every acknowledged record exactly once.
fn check_identical(cluster: &Cluster, acks: &Acks, limit: Duration) {
    for p in 0..PARTITIONS {
        let end = acked_end(acks, p);
        let mut first: Option<(u32, Vec<u8>)> = None;
        for (&id, node) in &cluster.nodes {
            let bytes = read_up_to(&node.addr, p, end, limit);
            let n = check_acked(&bytes, &acks[&p]);
            assert_eq!(
                n as u64, end,
                "node {id} partition {p}: records up to {end}"
            );
            match &first {
                None => first = Some((id, bytes)),
                Some((other, b)) => assert!(
                    *b == bytes,
                    "partition {p}: node {id} differs from node {other}"
                ),
            }
        }
    }
}

/// Creates the topic once, through node 1 (the metadata group makes it
/// every node's), and waits until every live node lists it.
fn create_topic(cluster: &Cluster) {
    cluster.nodes[&1]
        .client()
        .create_topic(TOPIC, PARTITIONS)
        .unwrap();
    let ids: Vec<u32> = cluster.nodes.keys().copied().collect();
    wait_listed(cluster, &ids, true);
}

/// Waits (bounded) until each node of `ids` lists the topic (`listed`)
/// or no longer does.
fn wait_listed(cluster: &Cluster, ids: &[u32], listed: bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    for id in ids {
        loop {
            let topics = cluster.nodes[id].client().list_topics().unwrap();
            if topics.iter().any(|t| t.topic == TOPIC) == listed {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "node {id}: topic listed is not {listed} after 30 s: {topics:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// SIGKILLs node `id` after `delay`, from another thread, so the kill
/// lands while the caller is producing.
fn kill_later(cluster: &Cluster, id: u32, delay: Duration) -> std::thread::JoinHandle<()> {
    let pid = cluster.nodes[&id].child.as_ref().unwrap().id() as i32;
    std::thread::spawn(move || {
        std::thread::sleep(delay);
        // SAFETY: plain kill(2) on a child process of this test.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
        }
    })
}

/// SIGKILLs node `id` at a seeded moment while `produce` runs, then
/// reaps it.
fn kill_during(cluster: &mut Cluster, id: u32, seed: u64, produce: impl FnOnce(&Cluster)) {
    let killer = kill_later(cluster, id, moment(seed, u64::from(id)));
    produce(cluster);
    killer.join().unwrap();
    cluster.kill(id);
}

/// A kill moment derived from `seed`: 0-45 ms into a produce run (one
/// run of 100 produces takes longer than that even on an idle machine).
fn moment(seed: u64, salt: u64) -> Duration {
    Duration::from_millis((seed.wrapping_mul(0x9e37_79b9) ^ salt) % 10 * 5)
}

fn run_seed(seed: u64) {
    let mut cluster = Cluster::start(3);
    create_topic(&cluster);
    let mut acks = Acks::new();
    // Node 1 is replica 0: the primary of view 0.
    let mut at = 1;
    produce_batches(&cluster, &mut at, &mut acks, 0..40);
    assert_eq!(at, 1, "the first primary is node 1");
    check_identical(&cluster, &acks, Duration::from_secs(10));

    // A produce to a backup is refused, naming the primary.
    let batch = batch_of(&[b"to a backup".as_slice()]).unwrap();
    let e = cluster.nodes[&2]
        .client()
        .produce(TOPIC, 0, batch)
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::NotPrimary), "{e}");
    assert_eq!(e.primary_node(), Some(1), "{e}");
    if seed == 1 {
        // The CLI's produce follows the refusal to the primary, says so,
        // and the record is acknowledged like the others.
        use std::io::Write as _;
        let mut child = std::process::Command::new(BIN)
            .args(["produce", TOPIC, "--addr", &cluster.nodes[&2].addr])
            .stdin(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"via the cli\n").unwrap();
        drop(stdin);
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        let went = format!(
            "produced to the primary at {} (1 redirect(s))",
            cluster.nodes[&1].addr
        );
        assert!(stderr.contains(&went), "{stderr}");
        let offsets = format!("{TOPIC}/0 offsets ");
        let line = stderr.lines().find(|l| l.starts_with(&offsets));
        let range = &line.unwrap_or_else(|| panic!("{stderr}"))[offsets.len()..];
        let base: u64 = range.split("..").next().unwrap().parse().unwrap();
        let prev = acks
            .entry(0)
            .or_default()
            .insert(base, (vec![b"via the cli".to_vec()], false));
        assert!(prev.is_none(), "offset {base} acknowledged twice");
    }

    // SIGKILL a backup mid-produce: a quorum of 2 goes on.
    let killer = kill_later(&cluster, 3, moment(seed, 1));
    let started = Instant::now();
    produce_batches(&cluster, &mut at, &mut acks, 40..140);
    let took = started.elapsed();
    assert!(
        took > moment(seed, 1),
        "the backup died after the run ({took:?})"
    );
    killer.join().unwrap();
    cluster.kill(3);
    produce_batches(&cluster, &mut at, &mut acks, 140..150);
    assert_eq!(at, 1, "the primary stayed");
    check_identical(&cluster, &acks, Duration::from_secs(10));

    // It restarts, learns the view, repairs what it missed.
    cluster.boot(3);
    produce_batches(&cluster, &mut at, &mut acks, 150..160);
    check_identical(&cluster, &acks, Duration::from_secs(30));

    // SIGKILL the primary mid-produce: a view change elects another and
    // produce resumes through it.
    let killer = kill_later(&cluster, 1, moment(seed, 2));
    let started = Instant::now();
    let mut times = produce_batches(&cluster, &mut at, &mut acks, 160..260);
    assert!(
        started.elapsed() > moment(seed, 2),
        "the primary died after the run"
    );
    killer.join().unwrap();
    let killed_at = started + moment(seed, 2);
    cluster.kill(1);
    times.extend(produce_batches(&cluster, &mut at, &mut acks, 260..261));
    assert_ne!(at, 1);
    // The first acknowledgement by another node.
    let (first, node) = times.iter().find(|(_, n)| *n != 1).copied().unwrap();
    let failover = first.saturating_duration_since(killed_at);
    eprintln!("seed {seed}: first produce acknowledged by node {node} {failover:?} after the primary was killed");
    assert!(failover < FAILOVER_MAX, "failover took {failover:?}");
    produce_batches(&cluster, &mut at, &mut acks, 261..300);
    check_identical(&cluster, &acks, Duration::from_secs(10));

    // The old primary rejoins (its uncommitted tail, if any, cut) and
    // serves the same bytes.
    cluster.boot(1);
    produce_batches(&cluster, &mut at, &mut acks, 300..310);
    check_identical(&cluster, &acks, Duration::from_secs(30));
}

/// SIGKILL every node at once mid-produce, restart them all: they agree on
/// a view among themselves (no replica is Normal to learn it from) and
/// every acknowledged record is still there, identical on every node.
#[test]
fn a_cluster_killed_whole_restarts_with_every_acknowledged_record() {
    for seed in 1..=3 {
        killed_whole(seed);
    }
}

/// One seed of [`a_cluster_killed_whole_restarts_with_every_acknowledged_record`]:
/// the three kills land at the same seeded moment.
fn killed_whole(seed: u64) {
    let mut cluster = Cluster::start(3);
    create_topic(&cluster);
    let mut acks = Acks::new();
    let mut at = 1;
    produce_batches(&cluster, &mut at, &mut acks, 0..30);
    let at_once = moment(seed, 0);
    let killers: Vec<_> = (1..=3)
        .map(|id| kill_later(&cluster, id, at_once))
        .collect();
    // Whatever this run gets acknowledged before the kills must survive.
    let partial = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let at = 1;
        let mut acks = Acks::new();
        let deadline = Instant::now() + Duration::from_millis(500);
        for b in 30..1000 {
            if Instant::now() > deadline {
                break;
            }
            let partition = (b % PARTITIONS as usize) as u32;
            let values: Vec<Vec<u8>> = (0..PER_BATCH).map(|i| value(1, b, i, 100)).collect();
            let refs: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
            let Ok(mut c) = Client::connect(cluster.addr(at).unwrap()) else {
                break;
            };
            match c.produce(TOPIC, partition, batch_of(&refs).unwrap()) {
                Ok(a) => {
                    acks.entry(partition)
                        .or_default()
                        .insert(a.base_offset, (values, false));
                }
                Err(_) => break,
            }
        }
        acks
    }))
    .unwrap();
    for k in killers {
        k.join().unwrap();
    }
    for id in 1..=3 {
        cluster.kill(id);
    }
    for (p, m) in partial {
        acks.entry(p).or_default().extend(m);
    }
    let restarted = Instant::now();
    for id in 1..=3 {
        cluster.boot(id);
    }
    produce_batches(&cluster, &mut at, &mut acks, 1000..1010);
    eprintln!(
        "whole-cluster restart: producing again {:?} after the boots began",
        restarted.elapsed()
    );
    check_identical(&cluster, &acks, Duration::from_secs(30));
}

#[test]
fn a_replicated_partition_survives_a_killed_backup_and_a_killed_primary() {
    for seed in [1, 2, 3] {
        run_seed(seed);
    }
}

/// A node whose data dir is lost restarts with `--recover` and gets its
/// topic back from the metadata group: its replicas boot wiped, repair every
/// committed op from the primary (by repair: the gap is within what a wiped
/// replica repairs, `vsr::WIPED_REPAIR_OPS_MAX`; beyond it, see
/// `a_wiped_node_rejoins_by_state_transfer_...`), and then count in a quorum: with the primary killed, node 2 and
/// the recovered node 3 elect a primary and still serve every
/// acknowledged record exactly once.
#[test]
fn a_wiped_node_recovers_by_repair_and_the_cluster_then_survives_losing_another() {
    for seed in 1..=3 {
        wiped_and_repaired(seed);
    }
}

/// One seed of [`a_wiped_node_recovers_by_repair_and_the_cluster_then_survives_losing_another`]:
/// node 3 is SIGKILLed at a seeded moment of a produce run.
fn wiped_and_repaired(seed: u64) {
    let mut cluster = Cluster::start(3);
    create_topic(&cluster);
    let mut acks = Acks::new();
    let mut at = 1;
    produce_batches(&cluster, &mut at, &mut acks, 0..40);
    check_identical(&cluster, &acks, Duration::from_secs(10));
    kill_during(&mut cluster, 3, seed, |c| {
        produce_batches(c, &mut at, &mut acks, 40..45);
    });
    std::fs::remove_dir_all(cluster.data_dir(3)).unwrap();
    produce_batches(&cluster, &mut at, &mut acks, 45..50);
    cluster.boot_with(3, &["--recover"]);
    assert!(cluster.data_dir(3).join("RECOVER").exists());
    // Its metadata replica boots wiped, repairs the group's log, and the
    // applied create makes the topic's replicas here (wiped too).
    wait_listed(&cluster, &[3], true);
    produce_batches(&cluster, &mut at, &mut acks, 50..60);
    check_identical(&cluster, &acks, Duration::from_secs(30));
    // ctl partitions on the recovered node: a backup of view 0, caught
    // up, after repairing.
    let parts = cluster.nodes[&3].ctl(&["partitions", "--local"]);
    for p in data_partitions(&parts) {
        assert_eq!(p["role"], "backup", "{p}");
        assert_eq!(p["view"], 0, "{p}");
        assert!(p["repairs"].as_u64().unwrap() > 0, "{p}");
        assert_eq!(p["lag_ops"], 0, "{p}");
    }
    cluster.kill(1);
    produce_batches(&cluster, &mut at, &mut acks, 60..80);
    assert_ne!(at, 1);
    check_identical(&cluster, &acks, Duration::from_secs(30));
    // ctl cluster on node 2: node 1 is gone, node 3 reachable.
    let view = cluster.nodes[&2].ctl(&["cluster"]);
    let nodes = view["result"]["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 3, "{view}");
    assert_eq!(nodes[0]["reachable"], false, "{view}");
    assert_eq!(nodes[1]["self"], true, "{view}");
    assert_eq!(nodes[2]["reachable"], true, "{view}");
    assert!(nodes[2]["incarnation"].as_u64().is_some(), "{view}");
    assert!(
        nodes[2]["last_seen_ms_ago"].as_u64().unwrap() < 5_000,
        "{view}"
    );
    // Caught up by repair: no transfer runs, and ctl transfers says so.
    let transfers = cluster.nodes[&2].ctl(&["transfers"]);
    assert_eq!(transfers["result"], serde_json::json!([]), "{transfers}");
    // The view changed on the survivors, and the metrics say so.
    for id in [2, 3] {
        let parts = cluster.nodes[&id].ctl(&["partitions", "--local"]);
        for p in data_partitions(&parts) {
            assert!(p["view"].as_u64().unwrap() >= 1, "node {id}: {p}");
            assert!(p["view_changes"].as_u64().unwrap() >= 1, "node {id}: {p}");
        }
    }
    let metrics = cluster.nodes[&2].ctl(&["metrics"]);
    let text = metrics["result"]["text"].as_str().unwrap();
    assert!(
        text.contains("ringlog_partition_view_changes_total{topic=\"replicated\",partition=\"0\"}"),
        "{text}"
    );
}

/// The sum of `name`'s series on node `id` whose labels hold `label`.
fn counter_labelled(cluster: &Cluster, id: u32, name: &str, label: &str) -> u64 {
    let m = cluster.nodes[&id].ctl(&["metrics"]);
    let text = m["result"]["text"].as_str().unwrap().to_owned();
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with('{'))
        .filter(|l| l.contains(label))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap() as u64)
        .sum()
}

/// 256 KiB segments (about 8 batches of 4 x 8 KiB records), so snapshots
/// hold sealed segments.
const SMALL_SEGMENTS: &[&str] = &[
    "--set",
    "segment_size_bytes=262144",
    "--set",
    "write_buffer_bytes=65536",
];

/// Batches `from..from + 10` reach every live node identically; then,
/// node 1 SIGKILLed, batches up to `from + 30` still commit on the others
/// and reach both identically.
fn survives_losing_node_1(
    cluster: &mut Cluster,
    at: &mut u32,
    acks: &mut Acks,
    from: usize,
    value_bytes: usize,
) {
    produce_sized(cluster, at, acks, from..from + 10, value_bytes);
    check_identical(cluster, acks, Duration::from_secs(60));
    cluster.kill(1);
    produce_sized(cluster, at, acks, from + 10..from + 30, value_bytes);
    check_identical(cluster, acks, Duration::from_secs(60));
}

/// Issue 11 item 6 with state transfer (issue 10): node 3's data dir is
/// lost while it is down and the group is more ops ahead than a wiped
/// replica repairs (`vsr::WIPED_REPAIR_OPS_MAX`, 256); restarted with
/// `--recover`, its data replicas boot wiped and install a snapshot of
/// the sealed segments instead of repairing op by op (counted under
/// `trigger="new_or_wiped"`), repair the tail, and then count in a
/// quorum: node 1 SIGKILLed, nodes 2 and 3 still commit produces, every
/// acknowledged record present once with identical bytes on both.
#[test]
fn a_wiped_node_rejoins_by_state_transfer_and_the_cluster_then_survives_losing_another() {
    for seed in 1..=3 {
        wiped_and_transferred(seed);
    }
}

/// One seed of [`a_wiped_node_rejoins_by_state_transfer_and_the_cluster_then_survives_losing_another`]:
/// node 3 is SIGKILLed at a seeded moment of the first produce run.
fn wiped_and_transferred(seed: u64) {
    let mut cluster = Cluster::start_with(3, SMALL_SEGMENTS);
    create_topic(&cluster);
    let (mut at, mut acks) = (1, Acks::new());
    const VALUE_BYTES: usize = 8 << 10;
    // 300 ops per partition.
    let batches = 300 * PARTITIONS as usize;
    kill_during(&mut cluster, 3, seed, |c| {
        produce_sized(c, &mut at, &mut acks, 0..8, VALUE_BYTES);
    });
    std::fs::remove_dir_all(cluster.data_dir(3)).unwrap();
    produce_sized(&cluster, &mut at, &mut acks, 8..batches, VALUE_BYTES);
    cluster.boot_with(3, &["--recover"]);
    wait_listed(&cluster, &[3], true);
    let wiped = |c: &Cluster| {
        counter_labelled(
            c,
            3,
            "ringlog_transfer_started_total",
            "trigger=\"new_or_wiped\"",
        )
    };
    let deadline = Instant::now() + Duration::from_secs(90);
    while counter(&cluster, 3, "ringlog_transfer_installs_total") < u64::from(PARTITIONS) {
        assert!(
            Instant::now() < deadline,
            "node 3 installed {} snapshots ({} new_or_wiped transfers), want {PARTITIONS}",
            counter(&cluster, 3, "ringlog_transfer_installs_total"),
            wiped(&cluster)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(wiped(&cluster) >= u64::from(PARTITIONS), "not new_or_wiped");
    survives_losing_node_1(&mut cluster, &mut at, &mut acks, batches, VALUE_BYTES);
}

/// SIGSTOP the primary past its timeout, then SIGCONT: the others elect a
/// new primary meanwhile, and the old one, continued, acknowledges
/// nothing from its old view (a produce sent to it right after SIGCONT
/// is refused as not_primary once it learned the view, or fails); every
/// acknowledged record is then on all three nodes exactly once, with
/// identical bytes.
#[test]
fn a_primary_stopped_past_its_timeout_acknowledges_nothing_from_its_old_view() {
    for seed in 1..=3 {
        stopped_past_its_timeout(seed);
    }
}

/// Produces to `addr` only (no following), from batch `from` on, until a
/// produce fails: what it acknowledged.
fn produce_to_until_refused(addr: String, from: usize) -> Acks {
    let mut acks = Acks::new();
    for b in from.. {
        let partition = (b % PARTITIONS as usize) as u32;
        let values: Vec<Vec<u8>> = (0..PER_BATCH).map(|i| value(2, b, i, 100)).collect();
        let refs: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
        let sent = Client::connect(&addr)
            .and_then(|mut c| c.produce(TOPIC, partition, batch_of(&refs).unwrap()));
        let Ok(a) = sent else { break };
        acks.entry(partition)
            .or_default()
            .insert(a.base_offset, (values, false));
    }
    acks
}

/// One seed of [`a_primary_stopped_past_its_timeout_acknowledges_nothing_from_its_old_view`]:
/// the SIGSTOP lands at a seeded moment while a producer streams to the
/// primary; whatever that producer got acknowledged, before the stop or
/// after the SIGCONT, must be on every node exactly once.
fn stopped_past_its_timeout(seed: u64) {
    let mut cluster = Cluster::start(3);
    create_topic(&cluster);
    let mut acks = Acks::new();
    let mut at = 1;
    produce_batches(&cluster, &mut at, &mut acks, 0..20);
    assert_eq!(at, 1);
    let streaming = {
        let addr = cluster.addr(1).unwrap();
        std::thread::spawn(move || produce_to_until_refused(addr, 1000))
    };
    std::thread::sleep(moment(seed, 9));
    let stopped = cluster.nodes.remove(&1).unwrap();
    let pid = stopped.child.as_ref().unwrap().id() as i32;
    // SAFETY: kill(2) on a server this test started.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let started = Instant::now();
    at = 2;
    produce_batches(&cluster, &mut at, &mut acks, 20..40);
    assert_ne!(at, 1);
    eprintln!(
        "new primary node {at} took produces {:?} after the SIGSTOP",
        started.elapsed()
    );
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    let streamed = streaming.join().unwrap();
    eprintln!(
        "seed {seed}: the producer streaming to node 1 got {} batches acknowledged",
        streamed.values().map(BTreeMap::len).sum::<usize>()
    );
    for (p, m) in streamed {
        acks.entry(p).or_default().extend(m);
    }
    let stale = batch_of(&[b"sent to the old primary".as_slice()]).unwrap();
    let outcome =
        Client::connect(stopped.addr.as_str()).and_then(|mut c| c.produce(TOPIC, 0, stale));
    match &outcome {
        Ok(a) => panic!("the old primary acknowledged {a:?} after SIGCONT"),
        Err(e) => eprintln!("the old primary answered: {e}"),
    }
    cluster.nodes.insert(1, stopped);
    // It learns the new view: a refusal naming the new primary, in time.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let batch = batch_of(&[b"probe".as_slice()]).unwrap();
        let e = cluster.nodes[&1]
            .client()
            .produce(TOPIC, 0, batch)
            .expect_err("node 1 is no longer the primary");
        if e.code() == Some(ErrorCode::NotPrimary) {
            assert_ne!(e.primary_node(), Some(1), "{e}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "node 1 never learned the view: {e}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    produce_batches(&cluster, &mut at, &mut acks, 40..50);
    check_identical(&cluster, &acks, Duration::from_secs(30));
}

/// The sum over shards of counter `name` in node `id`'s metrics.
fn counter(cluster: &Cluster, id: u32, name: &str) -> u64 {
    let m = cluster.nodes[&id].ctl(&["metrics"]);
    let text = m["result"]["text"].as_str().unwrap().to_owned();
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap() as u64)
        .sum()
}

/// The rows of `ctl partitions` output for the test's topic (the node's
/// metadata replica, topic `__meta`, is listed too).
fn data_partitions(parts: &serde_json::Value) -> Vec<&serde_json::Value> {
    parts["result"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["topic"] == TOPIC)
        .collect()
}

/// Each node's log start of `partition` (ctl partitions).
fn log_start(cluster: &Cluster, id: u32, partition: u32) -> u64 {
    let parts = cluster.nodes[&id].ctl(&["partitions", "--local"]);
    let p = data_partitions(&parts)
        .into_iter()
        .find(|p| p["partition"] == partition)
        .unwrap_or_else(|| panic!("node {id}: no partition {partition}: {parts}"));
    p["log_start_offset"].as_u64().unwrap()
}

/// Produces 8 batches, SIGKILLs node 3 at a seeded moment of that run, produces up to batch `batches`
/// and waits (bounded) until retention on nodes 1 and 2 retired what
/// node 3 lacks (it holds offsets below 16 of each partition).
fn leave_node_3_behind_retention(
    cluster: &mut Cluster,
    (at, acks): (&mut u32, &mut Acks),
    seed: u64,
    batches: usize,
    value_bytes: usize,
) {
    kill_during(cluster, 3, seed, |c| {
        produce_sized(c, at, acks, 0..8, value_bytes);
    });
    produce_sized(cluster, at, acks, 8..batches, value_bytes);
    let deadline = Instant::now() + Duration::from_secs(30);
    while [1, 2]
        .iter()
        .any(|&id| (0..PARTITIONS).any(|p| log_start(cluster, id, p) <= 16))
    {
        assert!(Instant::now() < deadline, "retention retired nothing");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Issue 11 item 6: a backup is SIGKILLed, the others produce on and
/// retention retires segments it lacks; restarted, it cannot repair those
/// ops from anyone, so it installs a snapshot from a peer by state
/// transfer (counted), repairs past it, and then serves, from the common
/// log start on, the same bytes as the others with every acknowledged
/// record there exactly once.
#[test]
fn retention_while_a_backup_is_down_forces_a_transfer_when_it_returns() {
    for seed in 1..=3 {
        left_behind_retention(seed);
    }
}

/// One seed of [`retention_while_a_backup_is_down_forces_a_transfer_when_it_returns`].
fn left_behind_retention(seed: u64) {
    // 256 KiB segments (a roll every ~6 batches of 4 x 8 KiB records),
    // retention keeping ~256 KiB, checked every 100 ms.
    let mut cluster = Cluster::start_with(
        3,
        &[
            "--set",
            "segment_size_bytes=262144",
            "--set",
            "write_buffer_bytes=65536",
            "--set",
            "retention_bytes=262144",
            "--set",
            "retention_check_ms=100",
        ],
    );
    create_topic(&cluster);
    let (mut at, mut acks) = (1, Acks::new());
    const VALUE_BYTES: usize = 8 << 10;
    leave_node_3_behind_retention(&mut cluster, (&mut at, &mut acks), seed, 160, VALUE_BYTES);
    assert_eq!(acked_end(&acks, 0), 80 * PER_BATCH as u64);
    cluster.boot(3);
    let deadline = Instant::now() + Duration::from_secs(60);
    while counter(&cluster, 3, "ringlog_transfer_installs_total") < u64::from(PARTITIONS) {
        assert!(
            Instant::now() < deadline,
            "node 3 installed {} snapshots, want {PARTITIONS}",
            counter(&cluster, 3, "ringlog_transfer_installs_total")
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    check_from_common_start(&cluster, &acks);
}

/// Every node serves, from the highest log start among them up to the
/// acknowledged end, the same bytes, holding every acknowledged record of
/// that range exactly once.
fn check_from_common_start(cluster: &Cluster, acks: &Acks) {
    // Retention may still be retiring what the last produce pushed past
    // it: the log starts must hold still (nothing more is produced).
    let starts = || -> Vec<u64> {
        (1..=3)
            .flat_map(|id| (0..PARTITIONS).map(move |p| (id, p)))
            .map(|(id, p)| log_start(cluster, id, p))
            .collect()
    };
    let (mut last, mut still) = (starts(), 0);
    let deadline = Instant::now() + Duration::from_secs(30);
    while still < 5 {
        assert!(Instant::now() < deadline, "log starts never settled");
        std::thread::sleep(Duration::from_millis(100));
        let now = starts();
        still = if now == last { still + 1 } else { 0 };
        last = now;
    }
    for p in 0..PARTITIONS {
        let from = (1..=3).map(|id| log_start(cluster, id, p)).max().unwrap();
        let end = acked_end(acks, p);
        let kept: BTreeMap<u64, (Vec<Vec<u8>>, bool)> = acks[&p]
            .range(from..)
            .map(|(k, v)| (*k, v.clone()))
            .collect();
        assert!(
            !kept.is_empty(),
            "partition {p}: nothing acknowledged past {from}"
        );
        let mut first: Option<Vec<u8>> = None;
        for (&id, node) in &cluster.nodes {
            let bytes = read_range(&node.addr, p, from, end, Duration::from_secs(30));
            let n = check_acked(&bytes, &kept) as u64;
            assert_eq!(
                n,
                end - from,
                "node {id} partition {p}: records {from}..{end}"
            );
            match &first {
                None => first = Some(bytes),
                Some(b) => assert!(*b == bytes, "partition {p}: node {id} differs"),
            }
        }
    }
}

/// Waits (bounded) until node `id`'s log of every partition starts at
/// `starts[p]`, its commit at least there.
fn wait_log_starts(cluster: &Cluster, id: u32, starts: &[u64]) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let now: Vec<u64> = (0..PARTITIONS).map(|p| log_start(cluster, id, p)).collect();
        if now == starts {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "node {id}: log starts {now:?}, want {starts:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Issue 11 item 3: a replicated topic purged through a backup (of the
/// metadata group and of both partitions) while node 3 is SIGKILLed.
/// The purge is answered once both partitions' purge ops committed: each
/// live node's log then starts at the same purge point, past every record
/// acknowledged before, and serves none of them. Records produced after
/// it are kept; node 3, restarted, learns the purge from its group (by
/// state transfer: no live store holds the purge op any more), starts at
/// the same points and serves the same bytes, every record acknowledged
/// after the purge exactly once. A second purge moves every node on
/// again: one generation, one purge. Without a quorum, a typed timeout.
#[test]
fn a_replicated_topic_purged_through_a_backup_is_purged_alike_on_every_node() {
    let mut cluster = Cluster::start(3);
    create_topic(&cluster);
    let (mut at, mut before) = (1, Acks::new());
    produce_batches(&cluster, &mut at, &mut before, 0..20);
    let primary = primary_of(&cluster, 0);
    let backup = if primary == 2 { 1 } else { 2 };
    cluster.kill(3);
    let single = cluster.nodes[&backup].ctl(&["purge", TOPIC, "--partition", "0"]);
    assert_eq!(
        single["ok"], false,
        "one partition of a replicated topic: {single}"
    );
    assert!(single.to_string().contains("purged whole"), "{single}");
    let started = Instant::now();
    let out = cluster.nodes[&backup].ctl(&["purge", TOPIC]);
    assert_eq!(out["ok"], true, "{out}");
    eprintln!(
        "purge through node {backup} answered in {:?}",
        started.elapsed()
    );
    // Answered once purged on the node asked: its starts are the points.
    let points: Vec<u64> = (0..PARTITIONS)
        .map(|p| log_start(&cluster, backup, p))
        .collect();
    for p in 0..PARTITIONS {
        assert!(
            points[p as usize] >= acked_end(&before, p),
            "partition {p}: purge point {} below the acknowledged end {}",
            points[p as usize],
            acked_end(&before, p)
        );
    }
    for &id in cluster.nodes.keys() {
        wait_log_starts(&cluster, id, &points);
    }
    let mut after = Acks::new();
    produce_batches(&cluster, &mut at, &mut after, 20..40);
    cluster.boot(3);
    wait_log_starts(&cluster, 3, &points);
    // Every live store dropped the purge op with what it purged, so node 3
    // could not repair it: it installed each partition from a peer, the
    // snapshot carrying the purge generation.
    let installs = counter(&cluster, 3, "ringlog_transfer_installs_total");
    assert!(
        installs >= u64::from(PARTITIONS),
        "node 3: {installs} installs"
    );
    let parts = cluster.nodes[&3].ctl(&["partitions", "--local"]);
    for p in data_partitions(&parts) {
        assert_eq!(p["purge_generation"], 1, "{p}");
    }
    for (&id, node) in &cluster.nodes {
        for p in 0..PARTITIONS {
            // Below the purge point nothing is served, from offset 0 on.
            let e = node.client().fetch(TOPIC, p, 0, 1 << 20, 0).unwrap_err();
            assert_eq!(
                e.code(),
                Some(ErrorCode::OffsetOutOfRange),
                "node {id}: {e}"
            );
            let page = node
                .client()
                .fetch(TOPIC, p, points[p as usize], 1 << 20, 0)
                .unwrap();
            let got = records(&page.batches).unwrap();
            assert!(
                !got.is_empty(),
                "node {id} partition {p}: nothing after the purge"
            );
            assert!(got.iter().all(|r| r.offset >= points[p as usize]));
        }
    }
    check_from_common_start(&cluster, &after);
    // The second purge: every node again, from the same new points.
    let out = cluster.nodes[&3].ctl(&["purge", TOPIC]);
    assert_eq!(out["ok"], true, "{out}");
    let again: Vec<u64> = (0..PARTITIONS).map(|p| log_start(&cluster, 3, p)).collect();
    for p in 0..PARTITIONS {
        assert!(again[p as usize] >= acked_end(&after, p), "{again:?}");
    }
    for &id in cluster.nodes.keys() {
        wait_log_starts(&cluster, id, &again);
    }
    // Without a quorum a purge is answered, typed, after the controller's
    // 10 s bound (outcome unknown), and nothing is purged.
    cluster.kill(1);
    cluster.kill(2);
    let started = Instant::now();
    let out = cluster.nodes[&3].ctl(&["purge", TOPIC]);
    let took = started.elapsed();
    assert_eq!(out["ok"], false, "{out}");
    assert!(out.to_string().contains("outcome is unknown"), "{out}");
    assert!(
        took >= Duration::from_secs(9) && took < Duration::from_secs(25),
        "{took:?}"
    );
    wait_log_starts(&cluster, 3, &again);
}

/// Each data partition's purge generation on node `id`, by partition.
fn purge_generations(cluster: &Cluster, id: u32) -> Vec<u64> {
    let parts = cluster.nodes[&id].ctl(&["partitions", "--local"]);
    let mut rows: Vec<(u64, u64)> = data_partitions(&parts)
        .iter()
        .map(|p| {
            let index = p["partition"].as_u64().unwrap();
            (index, p["purge_generation"].as_u64().unwrap())
        })
        .collect();
    rows.sort_unstable();
    rows.into_iter().map(|(_, g)| g).collect()
}

/// Node 1 (the primary of both partitions and of the metadata group) is
/// SIGKILLed at a seeded moment (0-45 ms) into a purge sent through node
/// 2. The purge is answered done or with a typed error; an error is
/// retried until one purge is answered done. Every partition then
/// reaches the cluster's generation on nodes 2 and 3 under their new
/// primary (the purge is driven again there, never twice per
/// generation), node 1 restarted catches up, and all three serve the same
/// bytes from one log start, every record acknowledged after the purge
/// exactly once.
fn purged_while_the_primary_dies(seed: u64) {
    let mut cluster = Cluster::start(3);
    create_topic(&cluster);
    let (mut at, mut before) = (1, Acks::new());
    produce_batches(&cluster, &mut at, &mut before, 0..10);
    let killer = kill_later(&cluster, 1, moment(seed, 11));
    let started = Instant::now();
    let mut answers = Vec::new();
    loop {
        let out = cluster.nodes[&2].ctl(&["purge", TOPIC]);
        answers.push(out.clone());
        if out["ok"] == true {
            break;
        }
        assert!(
            answers.len() < 6,
            "seed {seed}: purge never done: {answers:?}"
        );
    }
    killer.join().unwrap();
    cluster.kill(1);
    let generations = purge_generations(&cluster, 2);
    eprintln!(
        "seed {seed}: node 1 killed {:?} in; purge answered after {:?}: {answers:?}; \
         generations {generations:?}",
        moment(seed, 11),
        started.elapsed()
    );
    assert!(generations.iter().all(|&g| g == generations[0] && g >= 1));
    let points: Vec<u64> = (0..PARTITIONS).map(|p| log_start(&cluster, 2, p)).collect();
    for p in 0..PARTITIONS {
        assert!(points[p as usize] >= acked_end(&before, p), "{points:?}");
    }
    wait_log_starts(&cluster, 3, &points);
    let mut after = Acks::new();
    at = 2;
    produce_batches(&cluster, &mut at, &mut after, 10..20);
    cluster.boot(1);
    wait_log_starts(&cluster, 1, &points);
    for id in [1, 3] {
        assert_eq!(purge_generations(&cluster, id), generations, "node {id}");
    }
    check_from_common_start(&cluster, &after);
}

#[test]
fn a_purge_through_a_backup_survives_its_primary_killed_mid_purge() {
    for seed in 1..=3 {
        purged_while_the_primary_dies(seed);
    }
}

/// Node `of`'s client address as node `on`'s `ctl cluster` shows it.
fn client_address_seen(cluster: &Cluster, on: u32, of: u32) -> Option<String> {
    let view = cluster.nodes[&on].ctl(&["cluster"]);
    let nodes = view["result"]["nodes"].as_array().unwrap().clone();
    let node = nodes.iter().find(|n| n["id"] == of)?;
    node["client_address"].as_str().map(str::to_string)
}

/// Issue 11 item 3: a cluster node bound to an unspecified address
/// (0.0.0.0) without `advertise_client_address` refuses to start, naming
/// the key; with one, its Hello announces it: its peers list it, and a
/// backup's not-primary refusal names it as `primary_addr=` (which the
/// bound 0.0.0.0 could never be for a client on another host).
#[test]
fn a_node_bound_to_every_interface_announces_its_advertised_client_address() {
    let mut cluster = Cluster::start(3);
    let port = free_port();
    let wild = format!("listen=0.0.0.0:{port}");
    // A boot without an address to announce stops, typed, at the config.
    let mut args = vec![
        "server".to_string(),
        "--data-dir".into(),
        cluster.dir.path().join("refused").display().to_string(),
        "--cluster-id".into(),
        "test".into(),
        "--node-id".into(),
        "1".into(),
        "--cluster-secret-file".into(),
        cluster.secret.display().to_string(),
        "--set".into(),
        wild.clone(),
    ];
    for p in &cluster.peers {
        args.extend(["--peer".to_string(), p.clone()]);
    }
    let out = std::process::Command::new(BIN)
        .args(&args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "started bound to 0.0.0.0: {stderr}");
    assert!(
        stderr.contains("`advertise_client_address`") && stderr.contains("0.0.0.0"),
        "{stderr}"
    );
    // Node 1 again, bound to every interface, announcing loopback.
    let advertised = format!("127.0.0.1:{port}");
    cluster.kill(1);
    cluster.boot_with(
        1,
        &["--set", &wild, "--advertise-client-address", &advertised],
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    for on in [1, 2, 3] {
        while client_address_seen(&cluster, on, 1).as_deref() != Some(advertised.as_str()) {
            assert!(
                Instant::now() < deadline,
                "node {on} shows node 1 at {:?}, not {advertised}",
                client_address_seen(&cluster, on, 1)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    create_topic(&cluster);
    assert_eq!(primary_of(&cluster, 0), 1, "view 0's primary is replica 0");
    let batch = batch_of(&[b"to a backup".as_slice()]).unwrap();
    let e = cluster.nodes[&2]
        .client()
        .produce(TOPIC, 0, batch)
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::NotPrimary), "{e}");
    assert_eq!(
        e.primary_addr().map(|a| a.to_string()),
        Some(advertised),
        "{e}"
    );
}

/// The first running transfer on node `id` whose peer is known and which
/// received at least `chunks_min` chunks: (partition, peer node).
fn transfer_from_peer(cluster: &Cluster, id: u32, chunks_min: u64) -> Option<(u32, u32)> {
    let rows = cluster.nodes[&id].ctl(&["transfers"]);
    rows["result"].as_array()?.iter().find_map(|t| {
        let peer = t["peer_node"].as_u64()?;
        (t["chunks_received"].as_u64()? >= chunks_min)
            .then(|| (t["partition"].as_u64().unwrap() as u32, peer as u32))
    })
}

/// Issue 11 item 6: the peer serving a transfer is SIGKILLed mid-transfer.
/// The receiver's node is behind retention (as in the test above); once
/// its transfer from peer P has received a seeded number of chunks, P is
/// stopped at once (SIGSTOP, so the transfer cannot finish before the
/// kill lands), checked to have left the install unfinished, and then
/// SIGKILLed: the receiver rotates to the other peer (counted) and
/// installs. P is restarted, and every node then holds the same bytes
/// from the common log start, every acknowledged record once.
fn serving_peer_killed_mid_transfer(seed: u64) {
    let mut cluster = Cluster::start_with(
        3,
        &[
            "--set",
            "segment_size_bytes=1048576",
            "--set",
            "write_buffer_bytes=524288",
            "--set",
            "retention_bytes=16777216",
            "--set",
            "retention_check_ms=100",
        ],
    );
    create_topic(&cluster);
    let (mut at, mut acks) = (1, Acks::new());
    // 20 MiB more per partition while node 3 is down.
    const VALUE_BYTES: usize = 64 << 10;
    leave_node_3_behind_retention(&mut cluster, (&mut at, &mut acks), seed, 168, VALUE_BYTES);
    cluster.boot(3);
    let chunks_min = moment(seed, 7).as_millis() as u64 % 6;
    let deadline = Instant::now() + Duration::from_secs(60);
    let (partition, serving) = loop {
        if let Some(found) = transfer_from_peer(&cluster, 3, chunks_min) {
            break found;
        }
        assert!(
            Instant::now() < deadline,
            "node 3 never pulled {chunks_min} chunks"
        );
    };
    let stopped = cluster.nodes.remove(&serving).unwrap();
    let pid = stopped.child.as_ref().unwrap().id() as i32;
    // SAFETY: kill(2) on a server this test started.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let installs = counter(&cluster, 3, "ringlog_transfer_installs_total");
    eprintln!(
        "seed {seed}: node {serving} stopped serving partition {partition} after {chunks_min}+ chunks; \
         node 3 had {installs} installs"
    );
    assert!(
        installs < u64::from(PARTITIONS),
        "an install was left unfinished by the stop"
    );
    cluster.nodes.insert(serving, stopped);
    cluster.kill(serving);
    let deadline = Instant::now() + Duration::from_secs(60);
    while counter(&cluster, 3, "ringlog_transfer_rotations_total") == 0 {
        assert!(
            Instant::now() < deadline,
            "node 3 never rotated off node {serving}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Back, so both partitions have a quorum whatever P was.
    cluster.boot(serving);
    let deadline = Instant::now() + Duration::from_secs(60);
    while counter(&cluster, 3, "ringlog_transfer_installs_total") < u64::from(PARTITIONS) {
        assert!(
            Instant::now() < deadline,
            "node 3 did not install every partition"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    produce_sized(&cluster, &mut at, &mut acks, 168..176, VALUE_BYTES);
    check_from_common_start(&cluster, &acks);
}

#[test]
fn the_peer_serving_a_transfer_is_killed_mid_transfer_and_the_receiver_rotates() {
    for seed in 1..=3 {
        serving_peer_killed_mid_transfer(seed);
    }
}

/// A topic created through node 2 (a backup of the metadata group, which
/// forwards to its primary) while node 3 is SIGKILLed at a seeded moment
/// (0-45 ms in): node 2 lists it when it answers, every live node then
/// holds and serves it, and node 3, restarted, catches up by repair of
/// the metadata log and holds the same bytes.
fn created_while_a_node_dies(seed: u64) -> Cluster {
    let mut cluster = Cluster::start(3);
    let killer = kill_later(&cluster, 3, moment(seed, 3));
    cluster.nodes[&2]
        .client()
        .create_topic(TOPIC, PARTITIONS)
        .unwrap();
    // Answered once applied on node 2: listed there at once.
    let topics = cluster.nodes[&2].client().list_topics().unwrap();
    assert!(topics.iter().any(|t| t.topic == TOPIC), "{topics:?}");
    killer.join().unwrap();
    cluster.kill(3);
    wait_listed(&cluster, &[1, 2], true);
    let mut acks = Acks::new();
    let mut at = 1;
    produce_batches(&cluster, &mut at, &mut acks, 0..10);
    cluster.boot(3);
    wait_listed(&cluster, &[1, 2, 3], true);
    produce_batches(&cluster, &mut at, &mut acks, 10..20);
    check_identical(&cluster, &acks, Duration::from_secs(30));
    cluster
}

/// Topics are cluster metadata (a VSR group of its own): created once
/// through any node, on every node (3 seeds of a node killed during the
/// create, see [`created_while_a_node_dies`]); a second create of the name
/// through another node is refused by the table; deleted through node 3
/// it is gone everywhere, and a client on any node is told so; created
/// again through a control socket it starts empty; without a quorum a
/// create gets a typed timeout.
#[test]
fn a_topic_created_or_deleted_through_any_node_takes_effect_on_every_node() {
    for seed in 1..3 {
        drop(created_while_a_node_dies(seed));
    }
    let mut cluster = created_while_a_node_dies(3);

    let e = cluster.nodes[&3]
        .client()
        .create_topic(TOPIC, 1)
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::TopicExists), "{e}");

    cluster.nodes[&3].client().delete_topic(TOPIC).unwrap();
    wait_listed(&cluster, &[1, 2, 3], false);
    for (id, node) in &cluster.nodes {
        let e = node.client().fetch(TOPIC, 0, 0, 1 << 10, 0).unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::UnknownTopic), "node {id}: {e}");
    }
    // Created again through node 3's control socket (new partition ids),
    // it starts empty on every node.
    let made = cluster.nodes[&3].ctl(&["create-topic", TOPIC, &PARTITIONS.to_string()]);
    assert_eq!(made["ok"], true, "{made}");
    wait_listed(&cluster, &[1, 2, 3], true);
    let fresh = cluster.nodes[&1]
        .client()
        .fetch(TOPIC, 0, 0, 1 << 10, 0)
        .unwrap();
    assert_eq!(fresh.high_watermark, 0);

    // Without a metadata quorum a create is answered, typed, after the
    // controller's 10 s bound: its outcome unknown, nothing created.
    cluster.kill(2);
    cluster.kill(3);
    let started = Instant::now();
    let e = cluster.nodes[&1]
        .client()
        .create_topic("alone", 1)
        .unwrap_err();
    let took = started.elapsed();
    assert_eq!(e.code(), Some(ErrorCode::PartitionUnavailable), "{e}");
    assert!(e.to_string().contains("outcome is unknown"), "{e}");
    assert!(
        took >= Duration::from_secs(9) && took < Duration::from_secs(20),
        "{took:?}"
    );
    let topics = cluster.nodes[&1].client().list_topics().unwrap();
    assert!(topics.iter().all(|t| t.topic != "alone"), "{topics:?}");
}

/// The node whose replica of `partition` is primary, once one is (bounded).
fn primary_of(cluster: &Cluster, partition: u32) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        for (&id, node) in &cluster.nodes {
            let parts = node.ctl(&["partitions", "--local"]);
            let primary = data_partitions(&parts)
                .iter()
                .any(|p| p["partition"] == partition && p["role"] == "primary");
            if primary {
                return id;
            }
        }
        assert!(
            Instant::now() < deadline,
            "no primary of partition {partition}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Issue 11 item 4: a produce to a backup reaches the primary. Each node
/// learns the others' client addresses from their peer Hello (ctl cluster
/// shows them); a backup's not-primary refusal names the primary's, and
/// the Rust client's `FollowingClient` and the CLI's produce follow it.
#[test]
fn a_produce_to_a_backup_is_followed_to_the_primary_by_the_client_and_the_cli() {
    use ringlog_shard::client::FollowingClient;
    let cluster = Cluster::start(3);
    create_topic(&cluster);
    let primary = primary_of(&cluster, 0);
    let primary_addr = cluster.addr(primary).unwrap();
    let backup = *cluster.nodes.keys().find(|&&n| n != primary).unwrap();
    let backup_addr = cluster.addr(backup).unwrap();
    // ctl cluster on the backup names every node's client address (its
    // own bound one, the peers' from their Hello) once sessions are up.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let view = cluster.nodes[&backup].ctl(&["cluster"]);
        let nodes = view["result"]["nodes"].as_array().unwrap().clone();
        let named: Vec<Option<String>> = nodes
            .iter()
            .map(|n| n["client_address"].as_str().map(str::to_string))
            .collect();
        let want: Vec<Option<String>> = cluster
            .nodes
            .values()
            .map(|s| Some(s.addr.clone()))
            .collect();
        if named == want {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "client addresses never learned: {view}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // A plain client gets the refusal, naming the primary's client address.
    let batch = batch_of(&[b"one", b"two"]).unwrap();
    let e = cluster.nodes[&backup]
        .client()
        .produce(TOPIC, 0, batch.clone())
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::NotPrimary), "{e}");
    assert_eq!(
        e.primary_addr().map(|a| a.to_string()),
        Some(primary_addr.clone()),
        "{e}"
    );
    // The following client is acknowledged by the primary, and stays there.
    let mut f = FollowingClient::connect(&backup_addr).unwrap();
    let got = f.produce(TOPIC, 0, batch).unwrap();
    assert_eq!(
        (got.addr.as_str(), got.redirects),
        (primary_addr.as_str(), 1)
    );
    assert_eq!((got.ack.base_offset, got.ack.next_offset), (0, 2));
    let again = f.produce(TOPIC, 0, batch_of(&[b"three"]).unwrap()).unwrap();
    assert_eq!((again.redirects, again.ack.base_offset), (0, 2));
    // The CLI's produce through the backup says where it went.
    let out = std::process::Command::new(BIN)
        .args([
            "produce",
            TOPIC,
            "--addr",
            &backup_addr,
            "--count",
            "5",
            "--partition",
            "0",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "produced to the primary at {primary_addr} (1 redirect(s))"
        )),
        "{stderr}"
    );
    assert!(stderr.contains("offsets 3..7"), "{stderr}");
    // Issue 11 item 5: the primary timed each of the 3 acknowledged
    // produces from its client append to its commit; backups timed none.
    let timed = |id: u32| -> u64 {
        let m = cluster.nodes[&id].ctl(&["metrics"]);
        let series = format!(
            "ringlog_partition_prepare_commit_duration_seconds_count\
             {{topic=\"{TOPIC}\",partition=\"0\"}} "
        );
        let text = m["result"]["text"].as_str().unwrap().to_owned();
        let line = text.lines().find(|l| l.starts_with(&series));
        let line = line.unwrap_or_else(|| panic!("node {id}: no {series:?} in\n{text}"));
        line[series.len()..].parse().unwrap()
    };
    assert_eq!(timed(primary), 3);
    assert_eq!(timed(backup), 0);
    // Acknowledged means committed: every replica serves the 8 records.
    for (id, node) in &cluster.nodes {
        let bytes = read_up_to(&node.addr, 0, 8, Duration::from_secs(30));
        let values: Vec<Vec<u8>> = records(&bytes)
            .unwrap()
            .into_iter()
            .map(|r| r.value)
            .collect();
        assert_eq!(values.len(), 8, "node {id}");
        assert_eq!(
            values[..3],
            [b"one".to_vec(), b"two".to_vec(), b"three".to_vec()],
            "node {id}"
        );
    }
}

/// The sealed segments (all but the highest base offset) of `partition`'s
/// newest generation on node `id`, lowest first.
fn sealed_segment_files(cluster: &Cluster, id: u32, partition: u32) -> Vec<PathBuf> {
    let part = cluster
        .data_dir(id)
        .join("topics")
        .join(TOPIC)
        .join(partition.to_string());
    let sorted = |dir: &Path, keep: &dyn Fn(&str) -> bool| {
        let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| keep(&p.file_name().unwrap().to_string_lossy()))
            .collect();
        v.sort();
        v
    };
    let generation = sorted(&part, &|n| n.starts_with("gen-"))
        .pop()
        .expect("a generation directory");
    let mut logs = sorted(&generation, &|n| n.ends_with(".log"));
    logs.pop(); // the active segment
    logs
}

/// Issue 10's CorruptSegment trigger on real processes: a byte of node 3's
/// oldest sealed segment of partition 0 flips while it is down (its index
/// kept, so open does not reread it). Restarted, node 3 never serves the
/// bad bytes (a fetch of them is an error); the first read of them, by its
/// restart's recovery or by a fetch, makes the replica set the store aside
/// and install a good copy (counted under `trigger="corrupt_segment"`); then every
/// node serves every acknowledged record once, byte-identical, and node 3
/// counts in a quorum again (node 1 SIGKILLed, produces still commit).
#[test]
fn a_sealed_segment_gone_bad_on_a_node_is_found_by_a_read_and_installed_from_a_peer() {
    let mut cluster = Cluster::start_with(3, SMALL_SEGMENTS);
    create_topic(&cluster);
    let (mut at, mut acks) = (1, Acks::new());
    const VALUE_BYTES: usize = 8 << 10;
    // 100 ops per partition: the oldest sealed segment's ops are below the
    // 64 a restart reads.
    let batches = 100 * PARTITIONS as usize;
    produce_sized(&cluster, &mut at, &mut acks, 0..batches, VALUE_BYTES);
    cluster.kill(3);
    let sealed = sealed_segment_files(&cluster, 3, 0);
    assert!(sealed.len() >= 2, "too few sealed segments: {sealed:?}");
    let mut bytes = std::fs::read(&sealed[0]).unwrap();
    bytes[5000] ^= 0x5a;
    std::fs::write(&sealed[0], bytes).unwrap();
    cluster.boot(3);
    wait_listed(&cluster, &[3], true);

    let corrupt = |c: &Cluster| {
        counter_labelled(
            c,
            3,
            "ringlog_transfer_started_total",
            "trigger=\"corrupt_segment\"",
        )
    };
    let mut client = Client::connect(&cluster.nodes[&3].addr).unwrap();
    let mut refused = 0;
    let deadline = Instant::now() + Duration::from_secs(90);
    while corrupt(&cluster) == 0 || counter(&cluster, 3, "ringlog_transfer_installs_total") == 0 {
        assert!(
            Instant::now() < deadline,
            "node 3: {} corrupt_segment transfers, {} installs, {refused} fetches refused",
            corrupt(&cluster),
            counter(&cluster, 3, "ringlog_transfer_installs_total")
        );
        match client.fetch(TOPIC, 0, 0, 1 << 20, 0) {
            Ok(page) => {
                // Whatever it serves is good: the bad bytes never go out.
                check_acked_prefix(&page.batches, &acks[&0]);
            }
            Err(_) => refused += 1,
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let part = cluster.data_dir(3).join("topics").join(TOPIC).join("0");
    assert!(part.with_extension("corrupt").exists(), "not set aside");
    survives_losing_node_1(&mut cluster, &mut at, &mut acks, batches, VALUE_BYTES);
}

/// Every record `bytes` holds is the acknowledged one at its offset.
fn check_acked_prefix(bytes: &[u8], acked: &BTreeMap<u64, (Vec<Vec<u8>>, bool)>) {
    let by_offset: BTreeMap<u64, &Vec<u8>> = acked
        .iter()
        .flat_map(|(base, (values, _))| (*base..).zip(values))
        .collect();
    for r in records(bytes).unwrap() {
        assert_eq!(
            by_offset.get(&r.offset).copied(),
            Some(&r.value),
            "record {} differs from the acknowledged one",
            r.offset
        );
    }
}

/// The partition indexes of the test's topic node `id` holds (ctl
/// partitions), with their partition ids.
fn held_partitions(cluster: &Cluster, id: u32) -> BTreeMap<u32, u32> {
    let parts = cluster.nodes[&id].ctl(&["partitions", "--local"]);
    data_partitions(&parts)
        .iter()
        .map(|p| {
            let index = p["partition"].as_u64().unwrap() as u32;
            (index, p["partition_id"].as_u64().unwrap() as u32)
        })
        .collect()
}

/// Issue 11 item 3: replicas placed on a subset of the nodes. Five nodes,
/// `replication_factor = 3`, a topic of five partitions: each partition is
/// held by exactly the three nodes `placement::replicas_of` names; a node
/// holding none of it refuses a fetch as not-primary, naming a holder's
/// address, and the following client's produce and fetch through any node
/// reach a holder. One holder SIGKILLed, every partition still commits
/// (two of three); then every acknowledged record is on each live holder
/// exactly once, byte-identical among them.
#[test]
fn a_topic_of_three_replicas_on_five_nodes_lives_on_its_placed_nodes() {
    use ringlog_shard::client::FollowingClient;
    const TOPIC5: u32 = 5;
    let mut cluster = Cluster::start_with(5, &["--set", "replication_factor=3"]);
    cluster.nodes[&1]
        .client()
        .create_topic(TOPIC, TOPIC5)
        .unwrap();
    let ids: Vec<u32> = (1..=5).collect();
    wait_listed(&cluster, &ids, true);
    // Each node opens what the table placed on it.
    let deadline = Instant::now() + Duration::from_secs(30);
    let holders = loop {
        let held: BTreeMap<u32, BTreeMap<u32, u32>> = ids
            .iter()
            .map(|&n| (n, held_partitions(&cluster, n)))
            .collect();
        let mut holders: BTreeMap<u32, (u32, Vec<u32>)> = BTreeMap::new();
        for (&n, parts) in &held {
            for (&index, &pid) in parts {
                holders.entry(index).or_insert((pid, Vec::new())).1.push(n);
            }
        }
        if holders.values().map(|(_, h)| h.len()).sum::<usize>() == 15 {
            break holders;
        }
        assert!(
            Instant::now() < deadline,
            "placement never complete: {held:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(holders.len(), TOPIC5 as usize);
    for (index, (pid, nodes)) in &holders {
        let want = ringlog_shard::placement::replicas_of(&ids, *pid, 3);
        assert_eq!(nodes, &want, "partition {index} (id {pid})");
    }

    let mut acks = Acks::new();
    let produce = |cluster: &Cluster, b: usize, acks: &mut Acks| {
        let partition = (b % TOPIC5 as usize) as u32;
        let values: Vec<Vec<u8>> = (0..PER_BATCH).map(|i| value(5, b, i, 300)).collect();
        let refs: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
        let batch = batch_of(&refs).unwrap();
        let live: Vec<u32> = cluster.nodes.keys().copied().collect();
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut uncertain = false;
        let base = loop {
            let via = live[b % live.len()];
            let mut c = FollowingClient::connect(&cluster.nodes[&via].addr).unwrap();
            match c.produce(TOPIC, partition, batch.clone()) {
                Ok(f) => break f.ack.base_offset,
                Err(e) => {
                    uncertain |= !transient(&e);
                    assert!(Instant::now() < deadline, "batch {b}: {e}");
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        };
        let prev = acks
            .entry(partition)
            .or_default()
            .insert(base, (values, uncertain));
        assert!(prev.is_none(), "offset {base} acknowledged twice");
    };
    for b in 0..40 {
        produce(&cluster, b, &mut acks);
    }
    // A node holding none of partition 0 names a holder; following reads.
    let (_, zero) = &holders[&0];
    let outside = *ids.iter().find(|n| !zero.contains(n)).unwrap();
    let addr = cluster.nodes[&outside].addr.clone();
    let e = Client::connect(&addr)
        .unwrap()
        .fetch(TOPIC, 0, 0, 1 << 20, 0)
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::NotPrimary), "{e}");
    let named = e.primary_addr().expect("a holder's address").to_string();
    let holder_addrs: Vec<String> = zero.iter().map(|n| cluster.nodes[n].addr.clone()).collect();
    assert!(holder_addrs.contains(&named), "{named} holds no replica");
    let page = FollowingClient::connect(&addr)
        .unwrap()
        .fetch(TOPIC, 0, 0, 1 << 20, 0)
        .unwrap();
    check_acked_prefix(&page.batches, &acks[&0]);
    assert!(!page.batches.is_empty());

    let killed = zero[0];
    cluster.kill(killed);
    for b in 40..80 {
        produce(&cluster, b, &mut acks);
    }
    for (index, (_, nodes)) in &holders {
        let end = acked_end(&acks, *index);
        let mut first: Option<(u32, Vec<u8>)> = None;
        for n in nodes.iter().filter(|&&n| n != killed) {
            let bytes = read_up_to(&cluster.nodes[n].addr, *index, end, Duration::from_secs(60));
            assert_eq!(
                check_acked(&bytes, &acks[index]) as u64,
                end,
                "node {n} partition {index}"
            );
            match &first {
                None => first = Some((*n, bytes)),
                Some((other, b)) => assert!(
                    *b == bytes,
                    "partition {index}: node {n} differs from {other}"
                ),
            }
        }
    }
}

/// `ctl partitions` on node `on` (cluster-wide), polled (bounded) until
/// `ready` holds of its rows; returns them.
fn cluster_table(
    cluster: &Cluster,
    on: u32,
    ready: impl Fn(&[serde_json::Value]) -> bool,
) -> Vec<serde_json::Value> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let reply = cluster.nodes[&on].ctl(&["partitions"]);
        assert_eq!(reply["ok"], true, "{reply}");
        let rows = reply["result"].as_array().unwrap().clone();
        if ready(&rows) {
            return rows;
        }
        assert!(
            Instant::now() < deadline,
            "node {on}: table not as expected after 30 s: {rows:#?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The data partitions' rows of `rows` held by node `id`.
fn rows_of(rows: &[serde_json::Value], id: u32) -> Vec<&serde_json::Value> {
    rows.iter()
        .filter(|r| r["node"] == id && r["topic"] == TOPIC)
        .collect()
}

/// Every node of `ids` lists each partition once, and each is caught up:
/// lag 0 (against the highest commit any replica reports), one primary.
fn all_caught_up(rows: &[serde_json::Value], ids: &[u32]) -> bool {
    (0..PARTITIONS).all(|p| {
        let of_p: Vec<_> = rows
            .iter()
            .filter(|r| r["topic"] == TOPIC && r["partition"] == p)
            .collect();
        let primaries = of_p.iter().filter(|r| r["role"] == "primary").count();
        ids.iter()
            .all(|&id| of_p.iter().filter(|r| r["node"] == id).count() == 1)
            && of_p.len() == ids.len()
            && primaries == 1
            && of_p.iter().all(|r| r["lag_ops"] == 0)
    })
}

/// Issue 11 item 5: `ctl partitions` on any node shows every node's
/// replicas (role, view, commit, frontier, lag); a SIGKILLed node is one
/// `unreachable` row while the others go on; restarted, its rows come
/// back and catch up, seen from another node.
#[test]
fn ctl_partitions_shows_every_replica_on_every_node_and_a_killed_node_as_unreachable() {
    let mut cluster = Cluster::start(3);
    create_topic(&cluster);
    let mut acks = Acks::new();
    let mut at = 1;
    produce_batches(&cluster, &mut at, &mut acks, 0..20);
    check_identical(&cluster, &acks, Duration::from_secs(10));
    for on in 1..=3 {
        let rows = cluster_table(&cluster, on, |r| all_caught_up(r, &[1, 2, 3]));
        // Every node reports the same commit and frontier of a partition.
        for p in 0..PARTITIONS {
            let of_p = rows
                .iter()
                .filter(|r| r["topic"] == TOPIC && r["partition"] == p);
            let figures: std::collections::BTreeSet<String> = of_p
                .map(|r| format!("{} {} {}", r["commit"], r["frontier"], r["commit_op"]))
                .collect();
            assert_eq!(figures.len(), 1, "node {on}, partition {p}: {figures:?}");
        }
    }

    cluster.kill(3);
    produce_batches(&cluster, &mut at, &mut acks, 20..30);
    let rows = cluster_table(&cluster, 1, |r| all_caught_up(r, &[1, 2]));
    let of_3: Vec<_> = rows.iter().filter(|r| r["node"] == 3).collect();
    assert_eq!(of_3.len(), 1, "{of_3:#?}");
    assert_eq!(of_3[0]["role"], "unreachable", "{of_3:#?}");
    assert!(of_3[0]["fault"].as_str().unwrap().contains("127.0.0.1"));
    let killed_at = rows_of(&rows, 1)[0]["commit_op"].as_u64().unwrap();

    cluster.boot(3);
    produce_batches(&cluster, &mut at, &mut acks, 30..34);
    let rows = cluster_table(&cluster, 2, |r| all_caught_up(r, &[1, 2, 3]));
    for r in rows_of(&rows, 3) {
        assert!(r["commit_op"].as_u64().unwrap() > killed_at, "{r}");
        assert_eq!(r["role"], "backup", "{r}");
    }
    check_identical(&cluster, &acks, Duration::from_secs(30));
}
