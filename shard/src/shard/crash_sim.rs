//! Shard-level crash points: the shard's real turn loop and asynchronous
//! group commit ([`Shard::run_turn`], [`Shard::on_storage_completions`]) over
//! the sim backend, with several partitions and producers.
//!
//! For each seed the workload runs once without a crash to count its I/Os;
//! then, for every I/O index, it runs again with the same seed (so the run is
//! identical up to that I/O) three ways: losing power there with no unsynced
//! sector surviving, losing power there with any subset surviving, and
//! failing that I/O with EIO and losing power at the end. After every run:
//! - every produce got exactly one reply (nobody is left hanging);
//! - after a reboot, every partition opens, and every acknowledged produce is
//!   present at its acknowledged offset with identical records;
//! - the recovered shard accepts (and acknowledges) further produces.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use ringlog_protocol::{BatchBuilder, BatchView, Record, Stamp, HEADER_LEN};
use ringlog_storage::io::sim::{SimBackend, SimRng};
use ringlog_storage::io::{IoBackend, Op as IoOp, Sqe};

use super::*;
use crate::catalog::TopicMeta;
use crate::mailbox::mailbox;

const TOPIC: &str = "t";
const PARTITIONS: u32 = 3;
pub(super) const FIRST_ID: u32 = 1;
const PRODUCERS: u64 = 4;
const ROUNDS: usize = 20;
/// Bounds the drain loop: far more turns than the workload ever needs.
const DRAIN_TURNS_MAX: usize = 10_000;

fn config() -> ServerConfig {
    ServerConfig {
        data_dir: "/data".into(),
        // Small, so the workload rolls segments and overflows the write
        // buffer (appends parked behind a flush in flight).
        segment_size_bytes: 32 * 1024,
        write_buffer_bytes: 8 * 1024,
        group_commit_appends_max: 6,
        // Small, so the workload checkpoints the journal.
        journal_bytes: 256 * 1024,
        journal_append_bytes_max: 16 * 1024,
        ..ServerConfig::default()
    }
}

/// A shard over `io` owning every partition of the topic.
fn shard(io: SimBackend, state: TopicState) -> Shard<SimBackend> {
    shard_with(io, state, PARTITIONS, config())
}

/// A shard over `io` owning `partitions` partitions of the topic.
pub(super) fn shard_with(
    io: SimBackend,
    state: TopicState,
    partitions: u32,
    config: ServerConfig,
) -> Shard<SimBackend> {
    let mut table = TopicTable {
        format: 1,
        next_partition_id: FIRST_ID + partitions,
        ..TopicTable::default()
    };
    table.topics.insert(
        TOPIC.into(),
        TopicMeta {
            partitions,
            first_partition_id: FIRST_ID,
            state,
            replication_factor: 1,
        },
    );
    let (tx, rx) = mailbox(16, 1 << 20, 16).expect("mailbox");
    let setup = ShardSetup {
        id: 0,
        config: Arc::new(config),
        catalog: Arc::new(Catalog::new(table)),
        peers: Arc::new(vec![tx]),
        rx,
        metrics: Arc::default(),
        shutdown: Arc::default(),
        listener: std::net::TcpListener::bind("127.0.0.1:0").expect("bind"),
        core: None,
        ready: crossbeam_channel::bounded(1).0,
        trash: crate::trash::channel().0,
        meta_io: crate::meta_io::channel().0,
        peer: None,
        peer_stats: None,
        reply_pool: Arc::new(crate::reply_pool::ReplyPool::for_shards(1)),
    };
    Shard::new(setup, io, EventFd::new().expect("eventfd")).0
}

/// A producer's batch: `records` values derived from `tag`, fixed
/// timestamps, so every run of a seed builds the same bytes.
pub(super) fn batch(tag: u64, records: u64, value_len: usize) -> Vec<u8> {
    let mut b = BatchBuilder::new(0);
    for r in 0..records {
        let value: Vec<u8> = (0..value_len)
            .map(|j| (tag.wrapping_mul(131) + r * 7 + j as u64) as u8)
            .collect();
        let key = format!("p{}-{tag}-{r}", tag % PRODUCERS);
        b.push(&Record {
            key: key.as_bytes(),
            headers: &[],
            value: &value,
            timestamp_ms: 1_000 + tag,
        })
        .expect("record fits");
    }
    b.finish(&Stamp::default()).expect("valid batch")
}

/// One produce of the workload and where its reply goes.
struct Sent {
    partition_id: u32,
    batch: Vec<u8>,
    reply: crossbeam_channel::Receiver<Outcome>,
}

/// An acknowledged produce.
struct Acked {
    base_offset: u64,
    next_offset: u64,
    batch: Vec<u8>,
}

/// Creates the data dir and the partitions (nothing acknowledged yet).
pub(super) fn setup(seed: u64) -> Shard<SimBackend> {
    let s = shard(data_dir(seed), TopicState::Creating);
    assert_eq!(s.open_owned_partitions(), PARTITIONS as usize);
    s
}

/// A sim disk holding an empty, durable `/data`.
pub(super) fn data_dir(seed: u64) -> SimBackend {
    let mut io = SimBackend::new(seed);
    io.create_dir(Path::new("/data")).expect("mkdir");
    // What the server makes before the shards start (the journal's dir).
    io.create_dir(&Path::new("/data").join(super::JOURNAL_DIR))
        .expect("mkdir");
    for dir in ["/", "/data"] {
        let root = io.open_dir(Path::new(dir)).expect("open dir");
        let done = io.submit(vec![Sqe::new(IoOp::Fsync { file: root })]);
        assert!(done.iter().all(|c| c.result.is_ok()));
        io.close(root);
    }
    io
}

/// Drives the workload: rounds of produces from several producers to
/// random partitions, each round one turn (group commit submitted, not
/// awaited), with a seeded number of storage wake-ups between rounds; then
/// drains every flight. Returns every produce sent.
fn drive(s: &Shard<SimBackend>, seed: u64) -> Vec<Sent> {
    let mut rng = SimRng::new(seed ^ 0x5eed);
    let mut sent = Vec::new();
    let mut tag = 0;
    for _ in 0..ROUNDS {
        for _ in 0..1 + rng.below(5) {
            tag += 1;
            let partition_id = FIRST_ID + rng.below(u64::from(PARTITIONS)) as u32;
            let b = batch(tag, 1 + rng.below(6), 50 + rng.below(1500) as usize);
            let (tx, rx) = crossbeam_channel::bounded(1);
            s.queue.borrow_mut().push_back(Work {
                op: Op::Produce {
                    partition_id,
                    batch: b.clone().into(),
                },
                reply: Responder::Thread(tx),
            });
            sent.push(Sent {
                partition_id,
                batch: b,
                reply: rx,
            });
        }
        while s.run_turn(Instant::now()) > 0 {}
        for _ in 0..rng.below(3) {
            s.on_storage_completions(Instant::now());
        }
    }
    let mut turns = 0;
    while s.core.borrow().storage_busy() {
        turns += 1;
        assert!(turns < DRAIN_TURNS_MAX, "flushes never finish");
        s.on_storage_completions(Instant::now());
        while s.run_turn(Instant::now()) > 0 {}
    }
    sent
}

/// Every produce got one reply; the acknowledged ones by partition.
fn collect(sent: Vec<Sent>, label: &str) -> BTreeMap<u32, Vec<Acked>> {
    let mut acked: BTreeMap<u32, Vec<Acked>> = BTreeMap::new();
    for (i, s) in sent.into_iter().enumerate() {
        match s.reply.try_recv() {
            Ok(Ok(OpReply::Produced(r))) => acked.entry(s.partition_id).or_default().push(Acked {
                base_offset: r.base_offset,
                next_offset: r.next_offset,
                batch: s.batch,
            }),
            Ok(Ok(other)) => panic!("{label}: produce {i} got {other:?}"),
            Ok(Err(_)) => {}
            Err(e) => panic!("{label}: produce {i} got no reply ({e})"),
        }
    }
    acked
}

/// Every durable batch of a partition, by base offset.
fn read_back(s: &Shard<SimBackend>, pid: u32, label: &str) -> BTreeMap<u64, Vec<u8>> {
    let mut core = s.core.borrow_mut();
    let Core { io, partitions, .. } = &mut *core;
    let p = partitions.get_mut(&pid).expect("partition is owned");
    let end = p
        .high_watermark()
        .unwrap_or_else(|| panic!("{label}: partition {pid} unavailable after recovery"));
    let mut out = BTreeMap::new();
    let mut offset = p.store().map(|st| st.log_start_offset()).unwrap_or(0);
    while offset < end {
        let f = p
            .fetch(io, offset, 1 << 20, Vec::new())
            .unwrap_or_else(|e| panic!("{label}: fetch {pid}@{offset}: {e:?}"));
        assert!(f.next_offset > offset, "{label}: fetch made no progress");
        let mut rest = &f.batches[..];
        while !rest.is_empty() {
            let view = BatchView::parse(rest).expect("fetch returns valid batches");
            let len = view.as_bytes().len();
            out.insert(view.header().base_offset, rest[..len].to_vec());
            rest = &rest[len..];
        }
        offset = f.next_offset;
    }
    out
}

/// Reboots, recovers through the shard and checks every acknowledged produce,
/// then that the recovered shard acknowledges a new produce per partition.
fn check_recovery(io: SimBackend, acked: &BTreeMap<u32, Vec<Acked>>, label: &str) {
    let s = shard(io.reboot(), TopicState::Ready);
    s.open_owned_partitions();
    for pid in FIRST_ID..FIRST_ID + PARTITIONS {
        let stored = read_back(&s, pid, label);
        for a in acked.get(&pid).into_iter().flatten() {
            let got = stored.get(&a.base_offset).unwrap_or_else(|| {
                panic!("{label}: acknowledged batch {pid}@{} lost", a.base_offset)
            });
            let view = BatchView::parse(got).expect("stored batch parses");
            assert_eq!(
                view.header().next_offset(),
                a.next_offset,
                "{label}: batch {pid}@{} changed length",
                a.base_offset
            );
            // The shard stamps the header; the records are the producer's.
            assert!(
                got[HEADER_LEN..] == a.batch[HEADER_LEN..],
                "{label}: batch {pid}@{} has other bytes",
                a.base_offset
            );
        }
    }
    let mut replies = Vec::new();
    for pid in FIRST_ID..FIRST_ID + PARTITIONS {
        let (tx, rx) = crossbeam_channel::bounded(1);
        s.queue.borrow_mut().push_back(Work {
            op: Op::Produce {
                partition_id: pid,
                batch: batch(999, 2, 100).into(),
            },
            reply: Responder::Thread(tx),
        });
        replies.push(rx);
    }
    while s.run_turn(Instant::now()) > 0 {}
    let mut turns = 0;
    while s.core.borrow().storage_busy() {
        turns += 1;
        assert!(turns < DRAIN_TURNS_MAX, "{label}: flushes never finish");
        s.on_storage_completions(Instant::now());
    }
    for rx in replies {
        match rx.try_recv() {
            Ok(Ok(OpReply::Produced(_))) => {}
            other => panic!("{label}: produce after recovery: {other:?}"),
        }
    }
}

/// What happens at the chosen I/O.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    /// Power fails; nothing unsynced survives.
    Crash,
    /// Power fails; any subset of unsynced sectors survives.
    CrashTorn,
    /// The I/O fails with EIO (a failed fsync loses the file's unsynced
    /// data); the run goes on, then power fails.
    Eio,
}

/// What a clean run of a seed exercised.
#[derive(Default)]
struct Coverage {
    acked: usize,
    parked: u64,
    sealed_segments: usize,
}

/// Runs one seed: a clean run to count I/Os, then a crash at each of them.
/// Returns the crash points checked and what the clean run covered.
fn crash_everywhere(seed: u64) -> (u64, Coverage) {
    let s = setup(seed);
    assert!(
        s.core.borrow().journal.is_some(),
        "the journal is what this runs"
    );
    let setup_ops = s.core.borrow().io.ops_count();
    let acked = collect(drive(&s, seed), "clean run");
    let coverage = Coverage {
        acked: acked.values().map(Vec::len).sum(),
        parked: s.metrics.parked_total.load(Ordering::Relaxed),
        sealed_segments: s
            .core
            .borrow()
            .partitions
            .values()
            .filter_map(|p| p.store().ok())
            .map(|st| st.sealed_segments().count())
            .sum(),
    };
    let io = s.core.into_inner().io;
    let total_ops = io.ops_count();
    check_recovery(io, &acked, &format!("seed={seed} no crash"));
    let mut points = 0;
    for crash_at in setup_ops..total_ops {
        for fault in [Fault::Crash, Fault::CrashTorn, Fault::Eio] {
            let label = format!("seed={seed} at={crash_at} {fault:?}");
            let s = setup(seed);
            {
                let io = &mut s.core.borrow_mut().io;
                match fault {
                    Fault::Crash => io.set_crash_at(crash_at, false),
                    Fault::CrashTorn => io.set_crash_at(crash_at, true),
                    Fault::Eio => io.set_fail_at(crash_at),
                }
            }
            let acked = collect(drive(&s, seed), &label);
            let io = s.core.into_inner().io;
            assert!(
                io.is_crashed() == (fault != Fault::Eio),
                "{label}: the crash never happened"
            );
            // After an EIO the workload ran to its end; the power then
            // fails with whatever is unsynced torn.
            check_recovery(io, &acked, &label);
            points += 1;
        }
    }
    (points, coverage)
}

#[test]
fn shard_group_commit_survives_a_crash_at_every_io() {
    let mut points = 0;
    let mut total = Coverage::default();
    for seed in 1..=6 {
        let (p, c) = crash_everywhere(seed);
        assert!(
            c.acked > 30,
            "seed {seed}: only {} produces acknowledged",
            c.acked
        );
        points += p;
        total.acked += c.acked;
        total.parked += c.parked;
        total.sealed_segments += c.sealed_segments;
    }
    println!(
        "shard group commit: {points} crash points recovered and checked \
         ({} produces acknowledged, {} parked behind a flush, {} segment rolls in the clean runs)",
        total.acked, total.parked, total.sealed_segments
    );
    // The workload reaches appends parked behind a flush in flight and
    // segment rolls, not only plain group commits.
    assert!(total.parked > 0 && total.sealed_segments > 0);
    assert!(points >= 500, "only {points} crash points");
}
