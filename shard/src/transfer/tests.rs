//! Scenario tests, each named for the failure it guards. The machines run
//! against real stores on the sim backend through [`super::io::execute`],
//! and every message crosses the real codec (so a corrupted body is a real
//! decode failure).

use std::collections::VecDeque;
use std::path::Path;
use std::sync::Arc;

use ringlog_protocol::manifest::Manifest;
use ringlog_protocol::replication::{
    self as wire, ChunkKey, Envelope, Header, Offer, Refusal, ReplicationLimits, SnapshotOffer,
    HEADER_LEN,
};
use ringlog_protocol::{BatchBuilder, BatchHeader, BatchView, Record, Stamp};
use ringlog_storage::io::sim::{Fault as DiskFault, FaultOp, SimBackend};
use ringlog_storage::store::{InstallBudget, PartitionStore, StoreConfig};
use ringlog_storage::superblock::VsrState;

use super::budget::BACKOFF_EXPONENT_MAX;
use super::io::{execute, Installs};
use super::*;
use crate::vsr::timeout::Rng;

const PID: u32 = 7;
const NOW_MS: u64 = 1_000_000;
const ME: u8 = 0;

fn store_config() -> StoreConfig {
    StoreConfig {
        segment_size_bytes: 32 * 1024,
        write_buffer_bytes: 8 * 1024,
        index_interval_bytes: 1024,
        transfer_chunk_bytes: 4096,
        transfer_window_chunks: 8,
        uncommitted_headroom_bytes: Some(8 * 1024),
        recycled_files_max: 2,
        ..StoreConfig::default()
    }
}

fn budgets() -> Budgets {
    Budgets {
        window_chunks: 4,
        chunk_timeout_ticks: 4,
        offer_timeout_ticks: 6,
        stall_ticks_max: 20,
        backoff_base_ticks: 2,
        retry_ticks: 3,
        transient_retries_max: 3,
        charges_max: 4,
        quarantine_ticks: 200,
        artifacts_max: 64,
        artifact_bytes_max: 32 * 1024,
        total_bytes_max: 4 << 20,
        chunk_size_bytes: 4096,
    }
}

/// One replica's disk: a store on its own sim backend, and its shard's
/// installs.
struct Disk {
    io: SimBackend,
    store: PartitionStore,
    installs: Installs,
}

impl Disk {
    fn new(seed: u64, dir: &str) -> Self {
        Self::with(seed, dir, PID, store_config())
    }

    fn with(seed: u64, dir: &str, pid: u32, config: StoreConfig) -> Self {
        let mut io = SimBackend::new(seed);
        let store = PartitionStore::create(&mut io, Path::new(dir), pid, config).expect("store");
        Self {
            io,
            store,
            installs: Installs::new(2, InstallBudget::new(1 << 20)),
        }
    }

    /// Appends `n` ops continuing the log, ~`len` value bytes each.
    fn append(&mut self, n: u64, len: usize, seed: u64) {
        for i in 0..n {
            let c = self.store.chain();
            let pid = self.store.partition_id();
            let batch = make_batch(
                pid,
                c.next_offset,
                c.last_op + 1,
                c.last_checksum,
                len,
                seed + i,
            );
            self.store.append(&mut self.io, &batch).expect("append");
        }
        self.store.flush(&mut self.io).expect("flush");
    }

    /// Commits up to `op` (noted, so rolls may seal, and durable).
    fn commit(&mut self, op: u64) {
        self.store.note_commit(op);
        let vsr = VsrState {
            view: 0,
            log_view: 0,
            commit: op,
            op: self.store.durable().last_op,
            wiped: false,
            view_lost: false,
        };
        self.store.set_vsr(&mut self.io, vsr).expect("set vsr");
    }

    /// Appends `n` committed ops, then `tail` uncommitted ones.
    fn grow(&mut self, n: u64, tail: u64, seed: u64) {
        for i in 0..n {
            self.append(1, 700, seed * 10_000 + i);
            let op = self.store.chain().last_op;
            self.store.note_commit(op);
        }
        let op = self.store.chain().last_op;
        self.commit(op);
        self.append(tail, 700, seed * 10_000 + n);
    }

    fn local(&self) -> Local {
        let d = self.store.durable();
        Local {
            partition_id: self.store.partition_id(),
            view: 0,
            commit: self.store.superblock().vsr.commit,
            purge_generation: self.store.superblock().purge_generation,
            frontier: Frontier {
                next_offset: d.next_offset,
                last_op: d.last_op,
                last_checksum: d.last_checksum,
            },
        }
    }

    fn serving(&self) -> ServingState {
        ServingState {
            available: true,
            normal: true,
            commit: self.store.commit_known(),
            commit_max: self.store.commit_known(),
        }
    }

    fn run(&mut self, op: &TransferOp) -> Result<IoOutcome, Fault> {
        execute(
            &mut self.store,
            &mut self.io,
            &mut self.installs,
            op,
            NOW_MS,
        )
    }

    /// Every durable batch, in order.
    fn batches(&mut self) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut offset = self.store.log_start_offset();
        let end = self.store.durable().next_offset;
        while offset < end {
            let f = self
                .store
                .read(&mut self.io, offset, 1 << 20)
                .expect("read");
            let mut rest = &f.bytes[..];
            while !rest.is_empty() {
                let v = BatchView::parse(rest).expect("stored batch");
                let len = v.as_bytes().len();
                out.push(rest[..len].to_vec());
                rest = &rest[len..];
            }
            assert!(f.next_offset > offset);
            offset = f.next_offset;
        }
        out
    }
}

fn make_batch(
    pid: u32,
    base_offset: u64,
    op: u64,
    prev_checksum: u64,
    len: usize,
    seed: u64,
) -> Vec<u8> {
    let mut b = BatchBuilder::new(pid);
    let value: Vec<u8> = (0..len).map(|j| (seed as usize * 31 + j) as u8).collect();
    let record = Record {
        key: b"k",
        headers: &[],
        value: &value,
        timestamp_ms: 1000 + op,
    };
    b.push(&record).expect("fits");
    let stamp = Stamp {
        base_offset,
        vsr_op: op,
        vsr_view: 0,
        prev_checksum,
    };
    b.finish(&stamp).expect("valid batch")
}

/// How a serving peer misbehaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Behavior {
    Honest,
    /// Answers nothing.
    Silent,
    /// Chunks with one byte flipped (the codec passes them, the manifest
    /// checksum does not).
    GarbageChunks,
    /// Offers whose manifest fails to decode (the envelope is intact).
    UndecodableManifest,
    /// Each offer sent again, and again with other nonces.
    ReOffers,
}

struct Peer {
    server: Server,
    disk: Disk,
    behavior: Behavior,
    alive: bool,
    /// Serves as a replica that is not Normal (a transient refusal).
    not_normal: bool,
}

/// A receiver (replica 0) and its serving peers (1, 2), over a seeded
/// network that can lose and reorder.
struct Cluster {
    receiver: Receiver,
    disk: Disk,
    peers: Vec<Peer>,
    wire: VecDeque<(u8, u8, Vec<u8>)>,
    rng: Rng,
    loss_percent: u64,
    /// Messages delivered twice (the network replays).
    duplicate_percent: u64,
    reorder: bool,
    events: Vec<(u64, Event)>,
    ops: Vec<&'static str>,
    in_flight_max: usize,
    ticks: u64,
}

fn envelope(from: u8) -> Envelope {
    Envelope {
        cluster_id: 1,
        partition_id: PID,
        replica: from,
        view: 0,
    }
}

fn encode(from: u8, msg: &Message) -> Vec<u8> {
    let env = envelope(from);
    let mut out = Vec::new();
    msg.to_wire(env.cluster_id, env.partition_id, from, env.view)
        .encode(&mut out)
        .expect("the machines emit valid messages");
    out
}

fn decode(bytes: &[u8]) -> Option<(u8, Message)> {
    let m = wire::Message::decode(bytes, &ReplicationLimits::default()).ok()?;
    Message::from_wire(&m)
}

/// Guards against: a transfer message reaching the replica, or a VSR one
/// the transfer machines (a frame routed to neither would be lost), and a
/// message that does not survive the codec.
#[test]
fn every_command_routes_to_one_side_and_round_trips() {
    let transfer = [
        Message::RequestSnapshot(wire::RequestSnapshot {
            nonce: 3,
            commit: 4,
            purge_generation: 1,
        }),
        Message::RequestChunks(wire::RequestChunks {
            snapshot_id: 9,
            keys: vec![wire::ChunkKey {
                artifact: 0,
                chunk: 2,
            }],
        }),
        Message::Chunk {
            snapshot_id: 9,
            key: wire::ChunkKey {
                artifact: 0,
                chunk: 2,
            },
            data: ChunkData::from(&b"bytes"[..]),
        },
        Message::ReleaseSnapshot(wire::ReleaseSnapshot { snapshot_id: 9 }),
    ];
    for msg in transfer {
        let bytes = encode(2, &msg);
        let m = wire::Message::decode(&bytes, &ReplicationLimits::default()).expect("decodes");
        let routed = crate::transfer::route(&m).expect("routed");
        assert_eq!(
            routed,
            crate::transfer::Routed::Transfer {
                from: 2,
                msg: msg.clone()
            }
        );
        assert_eq!(msg.for_receiver(), matches!(msg, Message::Chunk { .. }));
    }
    let vsr_msg = crate::vsr::Message {
        view: 0,
        body: crate::vsr::Body::StartViewChange,
    };
    let env = envelope(1);
    let mut bytes = Vec::new();
    vsr_msg
        .to_wire(env.cluster_id, env.partition_id, 1)
        .expect("maps")
        .encode(&mut bytes)
        .expect("encodes");
    let m = wire::Message::decode(&bytes, &ReplicationLimits::default()).expect("decodes");
    assert!(Message::from_wire(&m).is_none(), "not a transfer message");
    assert_eq!(
        crate::transfer::route(&m),
        Some(crate::transfer::Routed::Vsr {
            from: 1,
            msg: vsr_msg
        })
    );
}

/// Re-seals a message whose body was edited (the header layout of
/// `ringlog_protocol::replication`: header checksum at 8, body checksum at
/// 16): the envelope checks pass, so only the body's decoding can refuse it.
fn reseal(bytes: &mut [u8]) {
    let body_sum = ringlog_protocol::checksum(&bytes[HEADER_LEN..]);
    bytes[16..24].copy_from_slice(&body_sum.to_le_bytes());
    bytes[8..16].fill(0);
    let head_sum = ringlog_protocol::checksum(&bytes[..HEADER_LEN]);
    bytes[8..16].copy_from_slice(&head_sum.to_le_bytes());
    assert!(Header::decode(bytes, &ReplicationLimits::default()).is_ok());
}

impl Cluster {
    fn new(disk: Disk, sources: Vec<(Disk, Behavior)>, seed: u64) -> Self {
        let cfg = ReceiverConfig {
            replica_count: sources.len() as u8 + 1,
            replica: ME,
            budgets: budgets(),
        };
        let peers = sources
            .into_iter()
            .map(|(disk, behavior)| Peer {
                server: Server::new(ServerConfig::default()),
                disk,
                behavior,
                alive: true,
                not_normal: false,
            })
            .collect();
        Self {
            receiver: Receiver::new(cfg, seed).expect("budgets"),
            disk,
            peers,
            wire: VecDeque::new(),
            rng: Rng::new(seed ^ 0x5eed),
            loss_percent: 0,
            duplicate_percent: 0,
            reorder: false,
            events: Vec::new(),
            ops: Vec::new(),
            in_flight_max: 0,
            ticks: 0,
        }
    }

    fn start(&mut self, trigger: Trigger) {
        let local = self.disk.local();
        self.receiver_step(ReceiverInput::Start { trigger, local });
    }

    fn receiver_step(&mut self, input: ReceiverInput) {
        let mut out = Outbox::new();
        self.receiver.step(input, &mut out);
        self.in_flight_max = self.in_flight_max.max(self.receiver.in_flight_chunks());
        let outputs: Vec<Output> = out.drain().collect();
        for o in outputs {
            match o {
                Output::Send { to, msg } => self.wire.push_back((ME, to, encode(ME, &msg))),
                Output::Io { id, op } => {
                    self.ops.push(op.name());
                    let result = self.disk.run(&op);
                    self.receiver_step(ReceiverInput::IoDone { id, result });
                }
                Output::Event(e) => self.events.push((self.ticks, e)),
            }
        }
    }

    fn peer_step(&mut self, p: usize, input: ServerInput) {
        let mut out = Outbox::new();
        self.peers[p].server.step(input, &mut out);
        let outputs: Vec<Output> = out.drain().collect();
        let from = p as u8 + 1;
        for o in outputs {
            match o {
                Output::Send { to, msg } => {
                    for bytes in self.misbehave(p, &msg) {
                        self.wire.push_back((from, to, bytes));
                    }
                }
                Output::Io { id, op } => {
                    let result = self.peers[p].disk.run(&op);
                    self.peer_step(p, ServerInput::IoDone { id, result });
                }
                Output::Event(_) => {}
            }
        }
    }

    /// What peer `p` puts on the wire for `msg`.
    fn misbehave(&mut self, p: usize, msg: &Message) -> Vec<Vec<u8>> {
        let from = p as u8 + 1;
        match (self.peers[p].behavior, msg) {
            (Behavior::Silent, _) => vec![],
            (
                Behavior::GarbageChunks,
                Message::Chunk {
                    snapshot_id,
                    key,
                    data,
                },
            ) => {
                let mut bad = data.to_vec();
                bad[data.len() / 2] ^= 0x40;
                let msg = Message::Chunk {
                    snapshot_id: *snapshot_id,
                    key: *key,
                    data: bad.into(),
                };
                vec![encode(from, &msg)]
            }
            (Behavior::UndecodableManifest, Message::SnapshotOffer(o))
                if matches!(o.offer, Offer::Snapshot(_)) =>
            {
                let mut bytes = encode(from, msg);
                // The manifest's magic, just after the offer's fixed part.
                bytes[HEADER_LEN + 32] ^= 0xff;
                reseal(&mut bytes);
                vec![bytes]
            }
            (Behavior::ReOffers, Message::SnapshotOffer(o))
                if matches!(o.offer, Offer::Snapshot(_)) =>
            {
                let mut copies = vec![encode(from, msg), encode(from, msg)];
                for k in 1..4 {
                    let other = SnapshotOffer {
                        nonce: o.nonce.wrapping_add(2 * k) | 1,
                        ..o.clone()
                    };
                    copies.push(encode(from, &Message::SnapshotOffer(other)));
                }
                copies
            }
            _ => vec![encode(from, msg)],
        }
    }

    fn deliver(&mut self) {
        let mut batch: Vec<_> = Vec::new();
        for m in self.wire.drain(..).collect::<Vec<_>>() {
            if self.rng.below(100) < self.duplicate_percent {
                batch.push(m.clone());
            }
            batch.push(m);
        }
        if self.reorder {
            // A seeded Fisher-Yates shuffle.
            for i in (1..batch.len()).rev() {
                let j = self.rng.below(i as u64 + 1) as usize;
                batch.swap(i, j);
            }
        }
        for (from, to, bytes) in batch {
            if self.rng.below(100) < self.loss_percent {
                continue;
            }
            if to == ME {
                match decode(&bytes) {
                    Some((from, msg)) => self.receiver_step(ReceiverInput::Message { from, msg }),
                    None => self.receiver_step(ReceiverInput::Undecodable { from }),
                }
                continue;
            }
            let p = usize::from(to - 1);
            if !self.peers[p].alive {
                continue;
            }
            let (from, msg) = decode(&bytes).expect("the receiver sends valid messages");
            let mut state = self.peers[p].disk.serving();
            state.normal = !self.peers[p].not_normal;
            self.peer_step(p, ServerInput::Message { from, msg, state });
        }
    }

    fn tick(&mut self) {
        self.deliver();
        self.ticks += 1;
        self.receiver_step(ReceiverInput::Tick);
        for p in 0..self.peers.len() {
            if self.peers[p].alive {
                self.peer_step(p, ServerInput::Tick);
            }
        }
    }

    /// Ticks until the receiver is idle (installed), at most `ticks_max`.
    fn run(&mut self, ticks_max: u64) -> bool {
        for _ in 0..ticks_max {
            self.tick();
            if !self.receiver.is_active() {
                return true;
            }
        }
        false
    }

    fn installed(&self) -> Option<(u8, Frontier)> {
        self.events.iter().find_map(|(_, e)| match e {
            Event::Installed { peer, frontier } => Some((*peer, *frontier)),
            _ => None,
        })
    }

    fn refusals(&self) -> Vec<Stale> {
        self.events
            .iter()
            .filter_map(|(_, e)| match e {
                Event::OfferRefused { why, .. } => Some(*why),
                _ => None,
            })
            .collect()
    }
}

/// A source with several sealed segments and an uncommitted tail.
fn source(seed: u64, dir: &str) -> Disk {
    let mut d = Disk::new(seed, dir);
    d.grow(150, 3, 1);
    assert!(
        d.store.sealed_segments().count() >= 3,
        "the source needs several sealed segments"
    );
    d
}

/// The source's batches up to (excluding) `next_offset`.
fn batches_below(d: &mut Disk, next_offset: u64) -> Vec<Vec<u8>> {
    d.batches()
        .into_iter()
        .filter(|b| BatchHeader::decode(b).expect("batch").next_offset() <= next_offset)
        .collect()
}

fn assert_installed_copy(c: &mut Cluster, from: usize) -> Frontier {
    let (_, frontier) = c.installed().expect("installed");
    let durable = c.disk.store.durable();
    assert_eq!(frontier.next_offset, durable.next_offset);
    assert_eq!(frontier.last_checksum, durable.last_checksum);
    assert_eq!(c.receiver.frontier(), frontier);
    let want = batches_below(&mut c.peers[from].disk, frontier.next_offset);
    assert_eq!(c.disk.batches(), want, "the receiver's bytes differ");
    frontier
}

#[test]
fn transfer_copies_a_partition_with_several_sealed_segments_byte_for_byte() {
    let src = source(1, "/src");
    let sealed = src.store.sealed_segments().count();
    let commit = src.store.commit_known();
    let mut c = Cluster::new(Disk::new(2, "/dst"), vec![(src, Behavior::Honest)], 3);
    c.start(Trigger::NewOrWiped);
    assert!(c.run(2000), "no install: {:?}", c.events);
    let frontier = assert_installed_copy(&mut c, 0);
    assert!(
        frontier.last_op <= commit,
        "an op above the commit was offered"
    );
    let src_end = c.peers[0].disk.store.durable();
    assert!(
        frontier.next_offset < src_end.next_offset,
        "the uncommitted tail was offered"
    );
    assert!(c.disk.store.sealed_segments().count() >= sealed);
    // Windowed, never lockstep, never beyond the window.
    assert_eq!(c.in_flight_max, budgets().window_chunks);
    let counters = c.receiver.counters();
    assert_eq!(counters.installs, 1);
    assert_eq!(counters.failures_consecutive, 0);
    assert!(counters.chunks_received > 20, "{counters:?}");
    // The serving peer released the snapshot.
    c.tick();
    assert_eq!(c.peers[0].server.snapshots_open(), 0);
}

#[test]
fn transfer_under_loss_duplication_and_reorder_converges_without_charging_the_peer() {
    for seed in 0..4 {
        let src = source(10 + seed, "/src");
        let mut c = Cluster::new(
            Disk::new(20 + seed, "/dst"),
            vec![(src, Behavior::Honest)],
            seed,
        );
        c.loss_percent = 20;
        c.duplicate_percent = 20;
        c.reorder = true;
        c.start(Trigger::NewOrWiped);
        assert!(
            c.run(20_000),
            "seed {seed}: no install: {:?}",
            c.receiver.counters()
        );
        assert_installed_copy(&mut c, 0);
        let counters = c.receiver.counters();
        assert!(counters.chunks_rerequested > 0 && counters.chunks_late > 0);
        assert_eq!(
            counters.quarantines, 0,
            "seed {seed}: an honest peer quarantined"
        );
        assert_eq!(counters.charges, 0, "seed {seed}: an honest peer charged");
    }
}

impl Cluster {
    fn count(&self, pred: impl Fn(&Event) -> bool) -> usize {
        self.events.iter().filter(|(_, e)| pred(e)).count()
    }

    fn ticks_of(&self, pred: impl Fn(&Event) -> bool) -> Vec<u64> {
        self.events
            .iter()
            .filter(|(_, e)| pred(e))
            .map(|(t, _)| *t)
            .collect()
    }

    fn receiver_config(&self) -> ReceiverConfig {
        ReceiverConfig {
            replica_count: self.peers.len() as u8 + 1,
            replica: ME,
            budgets: budgets(),
        }
    }
}

/// A wiped replica's state.
fn wiped() -> Local {
    Local {
        partition_id: PID,
        ..Local::default()
    }
}

// ---- Triggers -------------------------------------------------------------

#[test]
fn trigger_range_evicted_installs_past_the_retired_segments() {
    let config = StoreConfig {
        retention_bytes: Some(64 * 1024),
        ..store_config()
    };
    let mut src = Disk::with(30, "/src", PID, config);
    src.grow(150, 3, 1);
    src.store
        .apply_retention(&mut src.io, NOW_MS)
        .expect("retention");
    let log_start = src.store.log_start_offset();
    let mut dst = Disk::new(31, "/dst");
    dst.grow(10, 0, 1);
    assert!(
        dst.store.durable().next_offset < log_start,
        "nothing retired"
    );
    let mut c = Cluster::new(dst, vec![(src, Behavior::Honest)], 32);
    c.start(Trigger::RangeEvicted);
    assert!(c.run(2000), "no install: {:?}", c.receiver.counters());
    assert_installed_copy(&mut c, 0);
    assert_eq!(c.disk.store.log_start_offset(), log_start);
}

#[test]
fn trigger_purged_installs_the_peers_purge_generation() {
    let mut src = Disk::new(40, "/src");
    src.grow(60, 0, 1);
    src.store.purge(&mut src.io).expect("purge");
    src.grow(100, 2, 2);
    let mut dst = Disk::new(41, "/dst");
    dst.grow(60, 0, 1);
    let mut c = Cluster::new(dst, vec![(src, Behavior::Honest)], 42);
    c.start(Trigger::Purged);
    assert!(c.run(2000), "no install: {:?}", c.receiver.counters());
    assert_installed_copy(&mut c, 0);
    assert_eq!(c.disk.store.superblock().purge_generation, 1);
}

#[test]
fn trigger_repair_stuck_replaces_a_lagging_prefix() {
    let src = source(50, "/src");
    let mut dst = Disk::new(51, "/dst");
    dst.grow(30, 0, 1);
    let mut c = Cluster::new(dst, vec![(src, Behavior::Honest)], 52);
    c.start(Trigger::RepairStuck);
    assert!(c.run(2000), "no install: {:?}", c.receiver.counters());
    assert_installed_copy(&mut c, 0);
}

/// A receiver whose own sealed segment is corrupt takes an offer ending
/// where it ends (a level offer), and gets the good bytes back.
#[test]
fn trigger_corrupt_segment_takes_a_level_offer_and_restores_the_bytes() {
    let mut src = Disk::new(60, "/src");
    src.grow(150, 0, 1);
    let mut dst = Disk::new(61, "/dst");
    dst.grow(150, 0, 1);
    let good = dst.batches();
    let first = *dst
        .store
        .sealed_segments()
        .next()
        .expect("a sealed segment");
    let gen_dir = ringlog_storage::segment::generation_dir(
        Path::new("/dst"),
        dst.store.superblock().live_generation,
    );
    let path = ringlog_storage::segment::log_path(&gen_dir, first.base_offset);
    dst.io.corrupt(&path, 200, &[0xAB; 16]);
    assert_eq!(dst.local().frontier, src.local().frontier);
    let mut c = Cluster::new(dst, vec![(src, Behavior::Honest)], 62);
    c.start(Trigger::CorruptSegment);
    assert!(c.run(2000), "no install: {:?}", c.events);
    assert_installed_copy(&mut c, 0);
    assert_eq!(c.disk.batches(), good);
}

// ---- Refusals -------------------------------------------------------------

/// A receiver asking peer 1 for `trigger`, and the nonce it asked with.
fn asking(local: Local, trigger: Trigger, budgets: Budgets) -> (Receiver, u64) {
    let cfg = ReceiverConfig {
        replica_count: 3,
        replica: ME,
        budgets,
    };
    let mut r = Receiver::new(cfg, 77).expect("budgets");
    let mut out = Outbox::new();
    r.step(ReceiverInput::Start { trigger, local }, &mut out);
    let nonce = out
        .as_slice()
        .iter()
        .find_map(|o| match o {
            Output::Event(Event::Asked { peer: 1, nonce }) => Some(*nonce),
            _ => None,
        })
        .expect("asked peer 1");
    (r, nonce)
}

fn offered(r: &mut Receiver, from: u8, offer: SnapshotOffer) -> Vec<Output> {
    let mut out = Outbox::new();
    let msg = Message::SnapshotOffer(offer);
    r.step(ReceiverInput::Message { from, msg }, &mut out);
    out.drain().collect()
}

fn snapshot_of(d: &mut Disk) -> Manifest {
    let commit = d.store.commit_known();
    match d.run(&TransferOp::OpenSnapshot { commit }) {
        Ok(IoOutcome::Snapshot(m)) => Manifest::clone(&m),
        other => panic!("no snapshot: {other:?}"),
    }
}

#[test]
fn every_stale_or_oversized_offer_is_refused_charged_and_released() {
    let mut src = source(70, "/src");
    let m = snapshot_of(&mut src);
    let mut dst = Disk::new(71, "/dst");
    dst.grow(20, 0, 1);
    let base = dst.local();
    let b = budgets();
    type Case = (&'static str, Local, Budgets, Manifest, u64, Trigger);
    let case = |name, local, budgets, m: &Manifest, commit_max, t| -> Case {
        (name, local, budgets, m.clone(), commit_max, t)
    };
    let t = Trigger::RepairStuck;
    let cm = m.commit;
    let mut cases: Vec<(Case, Stale)> = Vec::new();
    let mut l = base;
    l.purge_generation = m.purge_generation + 1;
    cases.push((
        case("purge", l, b, &m, cm, t),
        Stale::PurgeGeneration {
            offered: 0,
            ours: 1,
        },
    ));
    let mut l = base;
    l.commit = m.commit + 1;
    l.frontier.last_op = m.commit + 1;
    let stale_commit = Stale::Commit {
        offered: m.commit,
        ours: m.commit + 1,
    };
    cases.push((case("commit", l, b, &m, cm, t), stale_commit));
    let mut l = base;
    l.frontier.next_offset = m.next_offset + 1;
    let stale_frontier = Stale::Frontier {
        offered: m.next_offset,
        ours: m.next_offset + 1,
    };
    cases.push((case("frontier", l, b, &m, cm, t), stale_frontier));
    let mut l = base;
    l.view = m.view + 1;
    let stale_view = Stale::View {
        offered: m.view,
        ours: m.view + 1,
    };
    cases.push((case("view", l, b, &m, cm, t), stale_view));
    let above = Stale::CommitAboveMax {
        commit: m.commit,
        commit_max: m.commit - 1,
    };
    cases.push((case("commit_max", base, b, &m, cm - 1, t), above));
    let mut uncommitted = m.clone();
    uncommitted.last_op = m.commit + 1;
    let why = Stale::UncommittedOps {
        last_op: m.commit + 1,
        commit: m.commit,
    };
    cases.push((case("uncommitted", base, b, &uncommitted, cm, t), why));
    let sizes = [
        (
            "chunk size",
            Budgets {
                chunk_size_bytes: 8192,
                ..b
            },
        ),
        (
            "artifacts",
            Budgets {
                artifacts_max: 1,
                ..b
            },
        ),
        (
            "artifact bytes",
            Budgets {
                artifact_bytes_max: 1000,
                ..b
            },
        ),
        (
            "total bytes",
            Budgets {
                total_bytes_max: 1000,
                ..b
            },
        ),
    ];
    let total = m.total_length_bytes();
    let whys = [
        Stale::ChunkSize {
            offered: 4096,
            ours: 8192,
        },
        Stale::TooManyArtifacts {
            offered: m.artifacts.len() as u64,
            max: 1,
        },
        Stale::ArtifactTooLarge {
            offered: m.artifacts[0].length_bytes,
            max: 1000,
        },
        Stale::TooManyBytes {
            offered: total,
            max: 1000,
        },
    ];
    for ((name, budgets), why) in sizes.into_iter().zip(whys) {
        cases.push((case(name, base, budgets, &m, cm, t), why));
    }
    let mut other = m.clone();
    other.partition_id = PID + 1;
    let wrong = Stale::WrongPartition {
        offered: PID + 1,
        ours: PID,
    };
    cases.push((case("partition", base, b, &other, cm, t), wrong));
    let mut level = base;
    level.frontier = Frontier::of_manifest(&m);
    cases.push((case("no progress", level, b, &m, cm, t), Stale::NoProgress));

    for ((name, local, budgets, m, commit_max, trigger), why) in cases {
        let (mut r, nonce) = asking(local, trigger, budgets);
        let snapshot_id = m.snapshot_id;
        let offer = SnapshotOffer {
            nonce,
            snapshot_id,
            commit_max,
            offer: Offer::Snapshot(m),
        };
        let outs = offered(&mut r, 1, offer);
        assert!(
            outs.contains(&Output::Event(Event::OfferRefused { peer: 1, why })),
            "{name}: {outs:?}"
        );
        let release = Message::ReleaseSnapshot(wire::ReleaseSnapshot { snapshot_id });
        assert!(
            outs.contains(&Output::Send {
                to: 1,
                msg: release
            }),
            "{name}"
        );
        assert!(
            !outs.iter().any(|o| matches!(o, Output::Io { .. })),
            "{name}: a refused offer reached storage"
        );
        // A level offer is an honest peer's (nothing to give): not charged.
        let charged = u32::from(why != Stale::NoProgress);
        assert_eq!(r.charges(1), charged, "{name}: charges");
        assert_eq!(r.counters().offers_stale, 1, "{name}");
        assert_eq!(r.counters().attempts_failed, 1, "{name}");
        assert_eq!(r.frontier(), local.frontier, "{name}: frontier moved");
    }
}

/// Starts an install of `m` (op `id`) through `rx` on `dst` (nothing of it
/// in flight): its begin runs a step per reaped batch, never at once.
fn begins_through(
    rx: &mut super::io::Pipeline,
    dst: &mut Disk,
    m: &Manifest,
    id: IoId,
    done: &mut Vec<(IoId, Result<IoOutcome, Fault>)>,
) {
    let begin = TransferOp::BeginInstall {
        manifest: Arc::new(m.clone()),
    };
    let (store, disk_io) = (&mut dst.store, &mut dst.io);
    rx.start(
        store,
        disk_io,
        &mut dst.installs,
        (id, &begin),
        NOW_MS,
        done,
    );
    assert!(done.is_empty(), "the begin was answered before its I/O");
    assert!(rx.ends_install() && rx.in_flight() == 1, "a step queued");
    reap_until_answered(rx, dst, id, done);
    assert_eq!(done.pop(), Some((id, Ok(IoOutcome::Done))));
    assert!(!rx.ends_install(), "the begin is over");
}

/// Whether the receiver's answer to an offer begins an install.
fn begins_install(outs: &[Output]) -> bool {
    outs.iter().any(|o| {
        matches!(
            o,
            Output::Io {
                op: TransferOp::BeginInstall { .. },
                ..
            }
        )
    })
}

#[test]
fn a_level_offer_is_taken_only_when_the_trigger_needs_it() {
    let mut src = source(80, "/src");
    let m = snapshot_of(&mut src);
    let mut local = src.local();
    local.frontier = Frontier::of_manifest(&m);
    local.commit = m.commit;
    for (trigger, taken) in [
        (Trigger::CorruptSegment, true),
        (Trigger::NewOrWiped, true),
        (Trigger::RepairStuck, false),
        (Trigger::RangeEvicted, false),
        (Trigger::Purged, false),
    ] {
        let (mut r, nonce) = asking(local, trigger, budgets());
        let offer = SnapshotOffer {
            nonce,
            snapshot_id: m.snapshot_id,
            commit_max: m.commit,
            offer: Offer::Snapshot(m.clone()),
        };
        let outs = offered(&mut r, 1, offer);
        let began = begins_install(&outs);
        assert_eq!(began, taken, "{trigger:?}: {outs:?}");
    }
}

/// Guards against (sim seed 7000104): a replica whose superblock commit is
/// above its log's end (learned in a view change) asking for, and refusing
/// offers below, that commit. The primary had committed less, could commit
/// more only with our ack, and refused us as not ahead: neither moved.
#[test]
fn a_commit_above_our_log_is_not_asked_of_an_offer() {
    let mut src = source(85, "/src");
    let m = snapshot_of(&mut src);
    let mut dst = Disk::new(86, "/dst");
    dst.grow(20, 0, 1);
    let mut local = dst.local();
    local.commit = m.commit + 5;
    assert!(
        local.frontier.last_op < m.commit,
        "the offer is ahead of our log"
    );
    let cfg = ReceiverConfig {
        replica_count: 3,
        replica: ME,
        budgets: budgets(),
    };
    let mut r = Receiver::new(cfg, 78).expect("budgets");
    let mut out = Outbox::new();
    let trigger = Trigger::RangeEvicted;
    r.step(ReceiverInput::Start { trigger, local }, &mut out);
    let asked = out.as_slice().iter().find_map(|o| match o {
        Output::Send {
            msg: Message::RequestSnapshot(q),
            ..
        } => Some(*q),
        _ => None,
    });
    let asked = asked.expect("a request was sent");
    assert_eq!(
        asked.commit, local.frontier.last_op,
        "asked for what we hold"
    );
    let nonce = asked.nonce;
    let offer = SnapshotOffer {
        nonce,
        snapshot_id: m.snapshot_id,
        commit_max: m.commit + 5,
        offer: Offer::Snapshot(m.clone()),
    };
    let outs = offered(&mut r, 1, offer);
    let began = begins_install(&outs);
    assert!(began, "the offer holds more than our log: {outs:?}");
}

#[test]
fn an_offer_not_echoing_the_request_is_never_taken() {
    let mut src = source(90, "/src");
    let m = snapshot_of(&mut src);
    let (mut r, nonce) = asking(wiped(), Trigger::NewOrWiped, budgets());
    let offer = |nonce| SnapshotOffer {
        nonce,
        snapshot_id: m.snapshot_id,
        commit_max: m.commit,
        offer: Offer::Snapshot(m.clone()),
    };
    // Another nonce, then the right nonce from the wrong peer.
    for (from, nonce) in [(1, nonce ^ 2), (2, nonce)] {
        let outs = offered(&mut r, from, offer(nonce));
        assert!(
            !outs.iter().any(|o| matches!(o, Output::Io { .. })),
            "{outs:?}"
        );
        let release = Message::ReleaseSnapshot(wire::ReleaseSnapshot {
            snapshot_id: m.snapshot_id,
        });
        assert!(outs.contains(&Output::Send {
            to: from,
            msg: release
        }));
        assert_eq!(r.charges(from), 1);
    }
    assert_eq!(r.counters().offers_unsolicited, 2);
    assert_eq!(
        r.phase_name(),
        "asking",
        "the request in flight still stands"
    );
    // The echo is taken.
    let outs = offered(&mut r, 1, offer(nonce));
    assert!(outs.iter().any(|o| matches!(o, Output::Io { .. })));
}

#[test]
fn a_final_refusal_rotates_and_a_transient_one_retries_the_same_peer() {
    let (mut r, nonce) = asking(wiped(), Trigger::NewOrWiped, budgets());
    let refusal = |nonce, why| SnapshotOffer {
        nonce,
        snapshot_id: 0,
        commit_max: 0,
        offer: Offer::Refused(why),
    };
    offered(&mut r, 1, refusal(nonce, Refusal::Busy));
    assert_eq!(
        r.counters().attempts_failed,
        0,
        "a transient refusal is no failure"
    );
    let mut asked = None;
    for _ in 0..budgets().retry_ticks {
        let mut out = Outbox::new();
        r.step(ReceiverInput::Tick, &mut out);
        asked = asked.or(out.as_slice().iter().find_map(|o| match o {
            Output::Event(Event::Asked { peer, nonce }) => Some((*peer, *nonce)),
            _ => None,
        }));
    }
    let (peer, nonce) = asked.expect("asked again after the flat interval");
    assert_eq!(peer, 1, "a transient refusal keeps the peer");
    let outs = offered(&mut r, 1, refusal(nonce, Refusal::NotAhead));
    assert!(outs
        .iter()
        .any(|o| matches!(o, Output::Event(Event::AttemptFailed { .. }))));
    assert_eq!(r.counters().refusals_final, 1);
    let mut rotated = false;
    for _ in 0..budgets().backoff_ticks_max() {
        let mut out = Outbox::new();
        r.step(ReceiverInput::Tick, &mut out);
        rotated |= out
            .as_slice()
            .contains(&Output::Event(Event::Rotated { from: 1, to: 2 }));
    }
    assert!(rotated, "a final refusal rotates to the other peer");
}

// ---- Budgets --------------------------------------------------------------

fn two_sources(seed: u64, first: Behavior, second: Behavior) -> Cluster {
    let a = source(seed, "/a");
    let b = source(seed + 1, "/b");
    Cluster::new(
        Disk::new(seed + 2, "/dst"),
        vec![(a, first), (b, second)],
        seed + 3,
    )
}

#[test]
fn a_silent_peer_costs_one_offer_timeout_then_the_receiver_rotates() {
    let mut c = two_sources(100, Behavior::Silent, Behavior::Honest);
    c.start(Trigger::NewOrWiped);
    assert!(c.run(2000), "no install: {:?}", c.receiver.counters());
    assert_eq!(c.installed().map(|(p, _)| p), Some(2));
    assert_installed_copy(&mut c, 1);
    let counters = c.receiver.counters();
    assert_eq!(counters.stalls, 1, "{counters:?}");
    assert_eq!(c.count(|e| *e == Event::Rotated { from: 1, to: 2 }), 1);
}

#[test]
fn the_serving_peer_dying_mid_transfer_costs_the_stall_budget_then_rotation() {
    let mut c = two_sources(110, Behavior::Honest, Behavior::Honest);
    c.start(Trigger::NewOrWiped);
    while c.receiver.counters().chunks_received < 8 {
        c.tick();
        assert!(c.ticks < 500, "no chunks");
    }
    c.peers[0].alive = false;
    let died = c.ticks;
    assert!(c.run(5000), "no install: {:?}", c.receiver.counters());
    assert_eq!(c.installed().map(|(p, _)| p), Some(2));
    assert_installed_copy(&mut c, 1);
    let counters = c.receiver.counters();
    assert_eq!(counters.stalls, 1);
    assert_eq!(counters.aborts, 1, "the half-staged install was aborted");
    let rotated = c.ticks_of(|e| *e == Event::Rotated { from: 1, to: 2 });
    let waited = rotated[0] - died;
    let bound = budgets().stall_ticks_max + budgets().backoff_ticks_max() + 2;
    assert!(
        waited <= bound,
        "rotation after {waited} ticks, bound {bound}"
    );
    // No staging left behind by the aborted attempt.
    assert!(c
        .disk
        .io
        .paths()
        .iter()
        .all(|p| !p.to_string_lossy().contains("staging")));
}

#[test]
fn consecutive_failures_back_off_exponentially_and_only_an_install_resets_them() {
    let mut c = two_sources(120, Behavior::Silent, Behavior::Silent);
    c.start(Trigger::NewOrWiped);
    for _ in 0..6000 {
        c.tick();
    }
    let b = budgets();
    let backoffs: Vec<u64> = c
        .events
        .iter()
        .filter_map(|(_, e)| match e {
            Event::AttemptFailed { backoff_ticks, .. } => Some(*backoff_ticks),
            _ => None,
        })
        .collect();
    assert!(
        backoffs.len() as u32 > BACKOFF_EXPONENT_MAX + 2,
        "{backoffs:?}"
    );
    for (k, &wait) in backoffs.iter().enumerate() {
        let base = b.backoff_base_ticks << (k as u32).min(BACKOFF_EXPONENT_MAX);
        assert!(
            (base..2 * base).contains(&wait),
            "failure {}: waited {wait}, expected [{base}, {})",
            k + 1,
            2 * base
        );
    }
    let capped = &backoffs[BACKOFF_EXPONENT_MAX as usize..];
    assert!(capped.iter().all(|&w| w <= b.backoff_ticks_max()));
    assert!(
        capped.windows(2).any(|w| w[0] != w[1]),
        "no jitter: {capped:?}"
    );
    let failures = c.receiver.counters().failures_consecutive;
    assert_eq!(failures as usize, backoffs.len());
    // Rotation alone does not reset the count; an install does.
    c.peers[1].behavior = Behavior::Honest;
    c.peers[0].behavior = Behavior::Honest;
    assert!(c.run(5000), "no install");
    assert_eq!(c.receiver.counters().failures_consecutive, 0);
}

#[test]
fn transient_refusals_retry_on_a_flat_interval_and_never_back_off() {
    let mut c = two_sources(130, Behavior::Honest, Behavior::Honest);
    c.peers[0].not_normal = true;
    c.peers[1].not_normal = true;
    c.start(Trigger::NewOrWiped);
    for _ in 0..200 {
        c.tick();
    }
    let counters = c.receiver.counters();
    assert!(counters.refusals_transient > 20, "{counters:?}");
    assert_eq!(counters.attempts_failed, 0);
    assert_eq!(
        counters.failures_consecutive, 0,
        "backoff pinned by refusals"
    );
    let asked = c.ticks_of(|e| matches!(e, Event::Asked { .. }));
    let gaps: Vec<u64> = asked.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(gaps.windows(2).all(|w| w[0] == w[1]), "not flat: {gaps:?}");
    assert!(gaps[0] <= budgets().retry_ticks + 2);
    // Every transient_retries_max + 1 refusals it tries the other peer.
    let rotations = c.count(|e| matches!(e, Event::Rotated { .. }));
    let per = u64::from(budgets().transient_retries_max) + 1;
    assert!(rotations as u64 >= counters.refusals_transient / per - 1);
    c.peers[1].not_normal = false;
    assert!(c.run(2000));
    assert_eq!(c.installed().map(|(p, _)| p), Some(2));
}

#[test]
fn garbage_chunks_are_charged_and_the_peer_quarantined() {
    let mut c = two_sources(140, Behavior::GarbageChunks, Behavior::Honest);
    c.start(Trigger::NewOrWiped);
    assert!(c.run(5000), "no install: {:?}", c.receiver.counters());
    assert_eq!(c.installed().map(|(p, _)| p), Some(2));
    assert_installed_copy(&mut c, 1);
    let counters = c.receiver.counters();
    assert!(counters.chunks_garbage >= u64::from(budgets().charges_max));
    assert_eq!(counters.quarantines, 1);
    assert!(c.receiver.is_quarantined(1));
    // No garbage reached storage: every chunk was checked first.
    let staged = c.ops.iter().filter(|&&op| op == "accept_chunks").count();
    assert_eq!(staged as u64, counters.chunks_received);
}

#[test]
fn unrequested_chunks_are_charged_and_duplicates_dropped_never_staged() {
    let mut c = two_sources(150, Behavior::Honest, Behavior::Honest);
    c.start(Trigger::NewOrWiped);
    while c.receiver.counters().chunks_received < 2 {
        c.tick();
        assert!(c.ticks < 500);
    }
    let Some(Event::OfferTaken { snapshot_id, .. }) = c
        .events
        .iter()
        .map(|(_, e)| e.clone())
        .find(|e| matches!(e, Event::OfferTaken { .. }))
    else {
        panic!("no offer taken");
    };
    let ops_before = c.ops.len();
    let charges_before = c.receiver.charges(1);
    let key = |artifact, chunk| ChunkKey { artifact, chunk };
    let forged = [
        (1, key(0, 0)),  // a duplicate of a staged chunk: dropped
        (1, key(2, 3)),  // far ahead of the window: never requested
        (1, key(99, 0)), // not in the manifest
        (2, key(0, 1)),  // from a peer not serving this pull
    ];
    for (from, k) in forged {
        let msg = Message::Chunk {
            snapshot_id,
            key: k,
            data: ChunkData::from(&[7u8; 4096][..]),
        };
        c.receiver_step(ReceiverInput::Message { from, msg });
    }
    assert_eq!(c.ops.len(), ops_before, "a forged chunk reached storage");
    assert_eq!(c.receiver.counters().chunks_unrequested, 3);
    assert_eq!(c.receiver.counters().chunks_late, 1);
    assert_eq!(c.receiver.charges(1), charges_before + 2);
    assert_eq!(c.receiver.charges(2), 1);
    assert!(c.run(2000));
    assert_installed_copy(&mut c, 0);
}

#[test]
fn endless_re_offers_are_charged_until_the_peer_is_quarantined() {
    let mut c = two_sources(160, Behavior::ReOffers, Behavior::Honest);
    c.start(Trigger::NewOrWiped);
    assert!(c.run(5000), "no install: {:?}", c.receiver.counters());
    assert_eq!(c.installed().map(|(p, _)| p), Some(2));
    let counters = c.receiver.counters();
    assert!(counters.offers_unsolicited >= u64::from(budgets().charges_max));
    assert_eq!(counters.quarantines, 1);
    // Each re-offered snapshot was released (the peer's leases go).
    c.tick();
    assert_eq!(c.peers[0].server.snapshots_open(), 0, "{:?}", c.events);
}

/// Iggy's review: a peer whose manifest fails to decode was re-pulled in
/// full, without bound. Here each decode failure is charged, re-asking
/// waits the offer timeout and the backoff, and the peer is quarantined.
#[test]
fn iggy_undecodable_manifest_re_pull_is_bounded_by_the_budget() {
    let mut c = two_sources(
        170,
        Behavior::UndecodableManifest,
        Behavior::UndecodableManifest,
    );
    c.start(Trigger::NewOrWiped);
    let ticks = 2000;
    for _ in 0..ticks {
        c.tick();
    }
    let b = budgets();
    let counters = c.receiver.counters();
    assert!(counters.decode_failures > 0);
    assert_eq!(counters.offers_taken, 0);
    assert!(counters.quarantines >= 2, "{counters:?}");
    // Per peer: at most charges_max asks per quarantine period.
    let periods = ticks / b.quarantine_ticks + 1;
    let bound = 2 * u64::from(b.charges_max) * periods;
    assert!(
        counters.requests_sent <= bound,
        "{} requests in {ticks} ticks, bound {bound}",
        counters.requests_sent
    );
    // An unbounded re-pull would ask once per round trip (2 ticks).
    assert!(counters.requests_sent * 20 < ticks, "{counters:?}");
}

/// Iggy's review: an offer made before a purge, delivered after the
/// receiver restarted, was installed. Here the restart draws a new nonce
/// (the old offer echoes none in flight) and the purge generation refuses
/// the peer's fresh pre-purge offer too.
#[test]
fn iggy_stale_pre_purge_offer_after_a_restart_is_refused() {
    for purged in [false, true] {
        stale_offer_after_restart(purged);
    }
}

/// The offer a peer made before the receiver restarted (and, if `purged`,
/// before the receiver's partition was purged) is never taken.
fn stale_offer_after_restart(purged: bool) {
    let src = source(180, "/src");
    let mut dst = Disk::new(181, "/dst");
    dst.grow(20, 0, 1);
    let mut c = Cluster::new(dst, vec![(src, Behavior::Honest)], 182);
    c.start(Trigger::RepairStuck);
    c.tick(); // the request reaches the peer, its offer goes on the wire
    let held: Vec<_> = c.wire.drain(..).collect();
    let old = held
        .iter()
        .find(|(from, to, _)| (*from, *to) == (1, ME))
        .and_then(|(_, _, bytes)| decode(bytes))
        .expect("the peer's offer");
    if purged {
        c.disk.store.purge(&mut c.disk.io).expect("purge");
    }
    let before = c.disk.local();
    c.receiver = Receiver::new(c.receiver_config(), 183).expect("budgets");
    c.start(Trigger::RepairStuck);
    // The old offer arrives first, on its own.
    c.receiver_step(ReceiverInput::Message {
        from: old.0,
        msg: old.1,
    });
    let counters = c.receiver.counters();
    assert_eq!(
        counters.offers_unsolicited, 1,
        "purged {purged}: {counters:?}"
    );
    assert_eq!(
        counters.offers_taken, 0,
        "purged {purged}: the old offer was taken"
    );
    assert!(!c.ops.contains(&"begin_install"), "{:?}", c.ops);
    if !purged {
        continue_to_install(&mut c);
        return;
    }
    // The peer's fresh offer is still from before the purge: refused.
    for _ in 0..100 {
        c.tick();
    }
    assert!(
        c.refusals().contains(&Stale::PurgeGeneration {
            offered: 0,
            ours: 1
        }),
        "{:?}",
        c.refusals()
    );
    assert!(!c.ops.contains(&"begin_install"), "{:?}", c.ops);
    assert_eq!(c.disk.local(), before, "the purged log changed");
    assert_eq!(c.receiver.frontier(), before.frontier);
}

/// Without a purge, the answer to the new request installs.
fn continue_to_install(c: &mut Cluster) {
    assert!(c.run(2000), "no install: {:?}", c.receiver.counters());
    assert_installed_copy(c, 0);
}

/// Iggy's review: after a failed install a replica re-stamped offsets from
/// a zeroed counter. Here a failed attempt reports the frontier the log
/// still has, the store agrees, and a batch stamped there is accepted.
#[test]
fn iggy_a_failed_install_reports_the_old_frontier_never_zero() {
    let src = source(190, "/src");
    let mut dst = Disk::new(191, "/dst");
    dst.grow(20, 0, 1);
    let old = dst.local().frontier;
    assert!(old.next_offset > 0);
    let mut c = Cluster::new(dst, vec![(src, Behavior::Honest)], 192);
    c.start(Trigger::RepairStuck);
    // The third staged write from here fails (EIO).
    let nth = c.disk.io.op_count(FaultOp::Write) + 2;
    c.disk.io.inject(FaultOp::Write, nth, DiskFault::Errno(5));
    let mut failed = None;
    for _ in 0..500 {
        c.tick();
        failed = c.events.iter().find_map(|(_, e)| match e {
            Event::AttemptFailed { frontier, .. } => Some(*frontier),
            _ => None,
        });
        if failed.is_some() {
            break;
        }
    }
    assert_eq!(failed, Some(old), "{:?}", c.events);
    assert_eq!(c.receiver.frontier(), old);
    let durable = c.disk.store.durable();
    assert_eq!(
        (durable.next_offset, durable.last_op),
        (old.next_offset, old.last_op)
    );
    assert!(c
        .disk
        .io
        .paths()
        .iter()
        .all(|p| !p.to_string_lossy().contains("staging")));
    // The retry installs; the first repaired batch must link to it.
    assert!(c.run(3000), "no install: {:?}", c.receiver.counters());
    let frontier = assert_installed_copy(&mut c, 0);
    assert_eq!(c.receiver.counters().failures_consecutive, 0);
    let next = c.peers[0]
        .disk
        .batches()
        .into_iter()
        .map(|b| BatchHeader::decode(&b).expect("batch"))
        .find(|h| h.base_offset == frontier.next_offset)
        .expect("the source holds the batch after the snapshot");
    assert!(frontier.closes_chain(&next));
    let forged = BatchHeader {
        prev_checksum: next.prev_checksum ^ 1,
        ..next
    };
    assert!(!frontier.closes_chain(&forged));
    let gap = BatchHeader {
        vsr_op: next.vsr_op + 1,
        ..next
    };
    assert!(!frontier.closes_chain(&gap));
}

#[test]
fn at_most_k_installs_run_per_shard() {
    let mut installs = Installs::new(1, InstallBudget::new(1 << 20));
    let mut offers = Vec::new();
    let mut dsts = Vec::new();
    for (i, pid) in [PID, PID + 1].into_iter().enumerate() {
        let mut src = Disk::with(200 + i as u64, "/src", pid, store_config());
        src.grow(60, 0, 1);
        offers.push(snapshot_of(&mut src));
        dsts.push(Disk::with(210 + i as u64, "/dst", pid, store_config()));
    }
    let begin = |d: &mut Disk, installs: &mut Installs, m: &Manifest| {
        let op = TransferOp::BeginInstall {
            manifest: Arc::new(m.clone()),
        };
        execute(&mut d.store, &mut d.io, installs, &op, NOW_MS)
    };
    assert_eq!(
        begin(&mut dsts[0], &mut installs, &offers[0]),
        Ok(IoOutcome::Done)
    );
    let refused = begin(&mut dsts[1], &mut installs, &offers[1]).expect_err("over K");
    assert_eq!(refused.kind, FaultKind::Transient, "{refused}");
    assert_eq!(installs.active(), 1);
    let d = &mut dsts[0];
    let abort = execute(
        &mut d.store,
        &mut d.io,
        &mut installs,
        &TransferOp::AbortInstall,
        NOW_MS,
    );
    assert_eq!(abort, Ok(IoOutcome::Done));
    assert_eq!(
        begin(&mut dsts[1], &mut installs, &offers[1]),
        Ok(IoOutcome::Done)
    );
}

/// Drives a server alone: each output's storage op runs at once unless
/// `hold_reads`.
fn serve(
    server: &mut Server,
    disk: &mut Disk,
    from: u8,
    msg: Message,
    hold_reads: bool,
) -> Vec<Output> {
    let mut out = Outbox::new();
    let state = disk.serving();
    server.step(ServerInput::Message { from, msg, state }, &mut out);
    let mut sent = Vec::new();
    let mut queue: Vec<Output> = out.drain().collect();
    while let Some(o) = queue.pop() {
        match o {
            Output::Io {
                op: TransferOp::ReadChunks { .. },
                ..
            } if hold_reads => sent.push(o),
            Output::Io { id, op } => {
                let result = disk.run(&op);
                server.step(ServerInput::IoDone { id, result }, &mut out);
                queue.extend(out.drain());
            }
            o => sent.push(o),
        }
    }
    sent
}

fn offer_in(outs: &[Output]) -> Option<&SnapshotOffer> {
    outs.iter().find_map(|o| match o {
        Output::Send {
            msg: Message::SnapshotOffer(o),
            ..
        } => Some(o),
        _ => None,
    })
}

#[test]
fn at_most_s_snapshots_open_per_partition_then_busy() {
    let mut disk = source(220, "/src");
    let cfg = ServerConfig {
        snapshots_max: 2,
        ..ServerConfig::default()
    };
    let mut server = Server::new(cfg);
    let ask = |nonce| {
        Message::RequestSnapshot(wire::RequestSnapshot {
            nonce,
            commit: 0,
            purge_generation: 0,
        })
    };
    let mut ids = Vec::new();
    for peer in [1, 2] {
        let outs = serve(&mut server, &mut disk, peer, ask(11), false);
        let o = offer_in(&outs).expect("an offer");
        assert!(matches!(o.offer, Offer::Snapshot(_)));
        ids.push(o.snapshot_id);
    }
    let outs = serve(&mut server, &mut disk, 3, ask(13), false);
    assert_eq!(
        offer_in(&outs).map(|o| &o.offer),
        Some(&Offer::Refused(Refusal::Busy))
    );
    assert_eq!(server.counters().refused_busy, 1);
    assert_eq!(server.snapshots_open(), 2);
    // A peer asking again gives up its older snapshot: still two open.
    let outs = serve(&mut server, &mut disk, 1, ask(15), false);
    assert!(matches!(
        offer_in(&outs).map(|o| &o.offer),
        Some(Offer::Snapshot(_))
    ));
    assert_eq!(server.snapshots_open(), 2);
    // A release makes room.
    let release = Message::ReleaseSnapshot(wire::ReleaseSnapshot {
        snapshot_id: ids[1],
    });
    serve(&mut server, &mut disk, 2, release, false);
    let outs = serve(&mut server, &mut disk, 3, ask(17), false);
    assert!(matches!(
        offer_in(&outs).map(|o| &o.offer),
        Some(Offer::Snapshot(_))
    ));
    // The store's own cap answers Busy too (its snapshots_max is 4).
    let mut wide = Server::new(ServerConfig {
        snapshots_max: 8,
        ..ServerConfig::default()
    });
    let mut refused = 0;
    for peer in 1..=6 {
        let outs = serve(&mut wide, &mut disk, peer, ask(21), false);
        refused +=
            usize::from(offer_in(&outs).map(|o| &o.offer) == Some(&Offer::Refused(Refusal::Busy)));
    }
    assert!(refused >= 2, "the store's cap was not hit");
}

#[test]
fn the_server_offers_only_committed_sealed_data_and_bounds_its_reads() {
    let mut disk = source(230, "/src");
    let commit = disk.store.commit_known();
    assert!(
        disk.store.durable().last_op > commit,
        "the source needs an uncommitted tail"
    );
    let cfg = ServerConfig {
        reads_keys_max: 3,
        lease_ticks: 5,
        ..ServerConfig::default()
    };
    let mut server = Server::new(cfg);
    let ask = Message::RequestSnapshot(wire::RequestSnapshot {
        nonce: 5,
        commit: 0,
        purge_generation: 0,
    });
    let outs = serve(&mut server, &mut disk, 1, ask, false);
    let o = offer_in(&outs).expect("an offer").clone();
    let Offer::Snapshot(m) = &o.offer else {
        panic!("refused: {o:?}");
    };
    assert!(m.last_op <= m.commit && m.commit == commit);
    let sealed_end = disk.store.sealed_segments().last().map(|s| s.end_offset);
    assert_eq!(
        Some(m.next_offset),
        sealed_end,
        "the active tail was offered"
    );
    // Keys past the cut manifest (the tail's artifact) are refused; reads
    // beyond reads_keys_max wait for the receiver to ask again.
    let tail = m.artifacts.len() as u32;
    let keys = vec![
        ChunkKey {
            artifact: 0,
            chunk: 0,
        },
        ChunkKey {
            artifact: 0,
            chunk: 1,
        },
        ChunkKey {
            artifact: 0,
            chunk: 2,
        },
        ChunkKey {
            artifact: 0,
            chunk: 3,
        },
        ChunkKey {
            artifact: tail,
            chunk: 0,
        },
    ];
    let chunks = Message::RequestChunks(wire::RequestChunks {
        snapshot_id: o.snapshot_id,
        keys,
    });
    let outs = serve(&mut server, &mut disk, 1, chunks.clone(), true);
    let read = outs.iter().find_map(|o| match o {
        Output::Io {
            op: TransferOp::ReadChunks { keys, .. },
            ..
        } => Some(keys.len()),
        _ => None,
    });
    assert_eq!(read, Some(3));
    assert_eq!(server.counters().keys_refused, 2);
    // The reads are still out: nothing more is read for this snapshot.
    let outs = serve(&mut server, &mut disk, 1, chunks, true);
    assert!(
        outs.iter().all(|o| !matches!(o, Output::Io { .. })),
        "{outs:?}"
    );
    // Unused past its lease, the snapshot goes.
    let mut out = Outbox::new();
    for _ in 0..7 {
        server.step(ServerInput::Tick, &mut out);
    }
    assert!(out.as_slice().iter().any(|o| matches!(
        o,
        Output::Io {
            op: TransferOp::ReleaseSnapshot { .. },
            ..
        }
    )));
    assert_eq!(server.counters().expired, 1);
    let again = Message::RequestChunks(wire::RequestChunks {
        snapshot_id: o.snapshot_id,
        keys: vec![ChunkKey {
            artifact: 0,
            chunk: 0,
        }],
    });
    let outs = serve(&mut server, &mut disk, 1, again, false);
    assert_eq!(
        offer_in(&outs).map(|o| &o.offer),
        Some(&Offer::Refused(Refusal::UnknownSnapshot))
    );
}

/// Guards against: a server whose replica's commit lags what its store
/// sealed (after a restart the replica starts from the superblock's
/// commit, which may be older than the rolls it saw) refusing every
/// request as transient for good once retention retired everything at or
/// below that commit (seed 9100137: the only holder of the ops two
/// receivers needed answered Busy for ~2800 ticks, "no committed prefix
/// to offer below op 122"). Sealed segments hold only committed ops, so
/// the committed prefix reaches the op before the active segment: with
/// sealed segments left they are offered, with all retired an empty
/// snapshot at that op is.
#[test]
fn a_server_whose_commit_lags_its_sealed_segments_offers_them() {
    for (seed, retention_bytes) in [(240, 64 * 1024), (241, 1)] {
        let config = StoreConfig {
            retention_bytes: Some(retention_bytes),
            ..store_config()
        };
        let mut disk = Disk::with(seed, "/src", PID, config);
        // 150 ops committed as they came (noted: rolls seal them), the
        // superblock's commit written once, early, at op 1.
        for i in 0..150 {
            disk.append(1, 700, 10_000 + i);
            if i == 0 {
                disk.commit(1);
            }
            let op = disk.store.chain().last_op;
            disk.store.note_commit(op);
        }
        disk.append(3, 700, 20_000);
        disk.store
            .apply_retention(&mut disk.io, NOW_MS)
            .expect("retention");
        assert!(disk.store.log_start_offset() > 1, "nothing retired");
        let f = disk.store.superblock().frontier;
        let sealed = disk.store.sealed_segments().count();
        assert_eq!(sealed == 0, retention_bytes == 1, "{sealed} sealed left");
        // The replica's commit (op 1): below every op the store still holds.
        let outcome = disk.run(&TransferOp::OpenSnapshot { commit: 1 });
        let Ok(IoOutcome::Snapshot(m)) = outcome else {
            panic!("no offer at a lagging commit: {outcome:?}");
        };
        assert_eq!(m.next_offset, f.active_base, "not up to the active segment");
        assert_eq!((m.last_op, m.commit), (f.active_prev_op, f.active_prev_op));
        assert_eq!(m.artifacts.len(), sealed);
        // The uncommitted tail (the active segment) is still not offered.
        assert!(disk.store.durable().last_op > m.last_op);
    }
}

/// Guards against: a serve flushing or reading on the shard thread to cut
/// its snapshot (a blocking fdatasync of the tail, or a read of the batch
/// before it). The snapshot opens with no I/O at all: a tail holding an op
/// above the commit is left out even while it is not durable, and a fully
/// committed tail not yet durable is refused as transient, then offered
/// once its flush landed.
#[test]
fn a_snapshot_opens_with_no_io_and_offers_a_committed_tail_only_once_durable() {
    let mut disk = source(242, "/src");
    disk.grow(3, 0, 7);
    let sealed = disk.store.sealed_segments().count();
    assert!(sealed > 0, "the source rolled");
    let committed = disk.store.chain().last_op;
    // Accepted, not flushed: one op above the commit.
    let c = disk.store.chain();
    let batch = make_batch(PID, c.next_offset, c.last_op + 1, c.last_checksum, 700, 5);
    disk.store.append(&mut disk.io, &batch).expect("append");
    let ops_before = disk.io.ops_count();
    let outcome = disk.run(&TransferOp::OpenSnapshot { commit: committed });
    let Ok(IoOutcome::Snapshot(m)) = outcome else {
        panic!("no offer: {outcome:?}");
    };
    assert_eq!(disk.io.ops_count(), ops_before, "opening did I/O");
    let f = disk.store.superblock().frontier;
    assert_eq!(
        (m.next_offset, m.last_op),
        (f.active_base, f.active_prev_op)
    );
    assert_eq!(
        m.artifacts.len(),
        sealed,
        "the uncommitted tail is left out"
    );
    disk.run(&TransferOp::ReleaseSnapshot {
        snapshot_id: m.snapshot_id,
    })
    .expect("released");

    // Now every accepted op is committed, but the tail is not durable.
    let all = disk.store.chain().last_op;
    let outcome = disk.run(&TransferOp::OpenSnapshot { commit: all });
    let Err(fault) = outcome else {
        panic!("a tail not durable was offered: {outcome:?}");
    };
    assert_eq!(fault.kind, FaultKind::Transient, "{}", fault.reason);
    assert_eq!(disk.io.ops_count(), ops_before, "refusing did I/O");
    disk.store.flush(&mut disk.io).expect("flush");
    let outcome = disk.run(&TransferOp::OpenSnapshot { commit: all });
    let Ok(IoOutcome::Snapshot(m)) = outcome else {
        panic!("no offer once durable: {outcome:?}");
    };
    assert_eq!((m.last_op, m.commit), (all, all));
    assert_eq!(m.next_offset, disk.store.durable().next_offset);
    assert_eq!(
        m.artifacts.len(),
        sealed + 1,
        "the committed tail is offered"
    );
}

#[test]
fn a_not_normal_or_behind_server_refuses() {
    let mut disk = source(240, "/src");
    let mut server = Server::new(ServerConfig::default());
    let commit = disk.store.commit_known();
    let ask = |commit| {
        Message::RequestSnapshot(wire::RequestSnapshot {
            nonce: 9,
            commit,
            purge_generation: 0,
        })
    };
    let outs = serve(&mut server, &mut disk, 1, ask(commit + 1), false);
    assert_eq!(
        offer_in(&outs).map(|o| &o.offer),
        Some(&Offer::Refused(Refusal::NotAhead))
    );
    let mut out = Outbox::new();
    let state = ServingState {
        normal: false,
        ..disk.serving()
    };
    server.step(
        ServerInput::Message {
            from: 1,
            msg: ask(0),
            state,
        },
        &mut out,
    );
    assert_eq!(
        offer_in(out.as_slice()).map(|o| &o.offer),
        Some(&Offer::Refused(Refusal::NotNormal))
    );
    let state = ServingState {
        available: false,
        ..disk.serving()
    };
    let mut out = Outbox::new();
    server.step(
        ServerInput::Message {
            from: 1,
            msg: ask(0),
            state,
        },
        &mut out,
    );
    assert_eq!(
        offer_in(out.as_slice()).map(|o| &o.offer),
        Some(&Offer::Refused(Refusal::Unavailable))
    );
    assert!(!out
        .as_slice()
        .iter()
        .any(|o| matches!(o, Output::Io { .. })));
}

#[test]
fn budgets_refuse_a_lockstep_window_and_zero_timeouts() {
    let b = budgets();
    assert!(b.validate().is_ok());
    for bad in [
        Budgets {
            window_chunks: 1,
            ..b
        },
        Budgets {
            window_chunks: 257,
            ..b
        },
        Budgets {
            stall_ticks_max: b.chunk_timeout_ticks,
            ..b
        },
        Budgets {
            retry_ticks: 0,
            ..b
        },
        Budgets {
            charges_max: 0,
            ..b
        },
    ] {
        assert!(bad.validate().is_err(), "{bad:?}");
    }
}

/// The network repeats an offer: the copy of the offer being pulled, and a
/// repeated refusal, are neither charged nor answered with a release (which
/// would drop the snapshot being pulled).
#[test]
fn a_repeated_offer_or_refusal_is_not_charged_and_releases_nothing() {
    let mut src = source(250, "/src");
    let m = snapshot_of(&mut src);
    let (mut r, nonce) = asking(wiped(), Trigger::NewOrWiped, budgets());
    let offer = SnapshotOffer {
        nonce,
        snapshot_id: m.snapshot_id,
        commit_max: m.commit,
        offer: Offer::Snapshot(m.clone()),
    };
    let outs = offered(&mut r, 1, offer.clone());
    assert!(outs.iter().any(|o| matches!(o, Output::Io { .. })));
    let outs = offered(&mut r, 1, offer);
    assert!(outs.is_empty(), "{outs:?}");
    assert_eq!(r.charges(1), 0);
    assert_eq!(r.counters().offers_repeated, 1);
    // A repeated transient refusal, while waiting out the first.
    let (mut r, nonce) = asking(wiped(), Trigger::NewOrWiped, budgets());
    let busy = SnapshotOffer {
        nonce,
        snapshot_id: 0,
        commit_max: 0,
        offer: Offer::Refused(Refusal::Busy),
    };
    offered(&mut r, 1, busy.clone());
    let outs = offered(&mut r, 1, busy);
    assert!(outs.is_empty(), "{outs:?}");
    assert_eq!(r.charges(1), 0);
}

/// A repeated RequestSnapshot gets the same offer again, not a second
/// snapshot (which, one per peer, would drop the first one's lease).
#[test]
fn a_repeated_snapshot_request_is_answered_with_the_same_offer() {
    let mut disk = source(260, "/src");
    let mut server = Server::new(ServerConfig::default());
    let ask = Message::RequestSnapshot(wire::RequestSnapshot {
        nonce: 41,
        commit: 0,
        purge_generation: 0,
    });
    let first = serve(&mut server, &mut disk, 1, ask.clone(), false);
    let again = serve(&mut server, &mut disk, 1, ask, false);
    let (a, b) = (
        offer_in(&first).expect("offer"),
        offer_in(&again).expect("offer"),
    );
    assert_eq!(a, b);
    assert!(
        !again.iter().any(|o| matches!(o, Output::Io { .. })),
        "{again:?}"
    );
    assert_eq!(server.snapshots_open(), 1);
}

/// A receiver that crashes at an I/O of its install (staging, commit or
/// the cleanup after it), restarts with a new nonce from what its disk
/// holds, and transfers again: its frontier is never lower than before,
/// and it ends with the peer's bytes.
#[test]
fn a_receiver_crash_during_an_install_restarts_from_its_disk_and_completes() {
    let prefix = |seed| {
        let mut d = Disk::new(seed, "/dst");
        d.grow(20, 0, 1);
        d
    };
    // A clean run counts the install's I/Os.
    let mut c = Cluster::new(
        prefix(271),
        vec![(source(270, "/src"), Behavior::Honest)],
        272,
    );
    let setup_ops = c.disk.io.ops_count();
    c.start(Trigger::RepairStuck);
    assert!(c.run(2000));
    let install_ops = c.disk.io.ops_count() - setup_ops;
    let installed = assert_installed_copy(&mut c, 0);
    let (mut points, mut committed) = (0, 0);
    for (k, tear) in (0..install_ops).flat_map(|k| [(k, false), (k, true)]) {
        let mut c = Cluster::new(
            prefix(271),
            vec![(source(270, "/src"), Behavior::Honest)],
            272,
        );
        let before = c.disk.local().frontier;
        c.disk.io.set_crash_at(setup_ops + k, tear);
        c.start(Trigger::RepairStuck);
        for _ in 0..2000 {
            c.tick();
            if c.disk.io.is_crashed() || !c.receiver.is_active() {
                break;
            }
        }
        let crashed = std::mem::replace(&mut c.disk.io, SimBackend::new(0));
        let mut io = crashed.reboot();
        let store = PartitionStore::open(&mut io, Path::new("/dst"), PID, store_config())
            .unwrap_or_else(|e| panic!("crash at install I/O {k}: recovery: {e}"));
        c.disk = Disk {
            io,
            store,
            installs: Installs::new(2, InstallBudget::new(1 << 20)),
        };
        let after = c.disk.local().frontier;
        assert!(
            after == before || after == installed,
            "crash at install I/O {k}: frontier {after:?}, before {before:?}"
        );
        c.receiver = Receiver::new(c.receiver_config(), 300 + k).expect("budgets");
        c.events.clear();
        c.wire.clear();
        c.start(Trigger::RepairStuck);
        if after == installed {
            // Installed before the crash: the same offer moves it no
            // further, and is refused.
            c.run(200);
            let counters = c.receiver.counters();
            assert_eq!(counters.offers_taken, 0, "crash at install I/O {k}");
            assert!(c.refusals().contains(&Stale::NoProgress), "crash at {k}");
            committed += 1;
            continue;
        }
        assert!(
            c.run(3000),
            "crash at install I/O {k}: no install after restart"
        );
        assert_installed_copy(&mut c, 0);
        points += 1;
    }
    println!(
        "{install_ops} install I/Os: {points} crashes reinstalled, {committed} after the commit"
    );
    assert!(
        points >= install_ops,
        "only {points} crash points reinstalled"
    );
    assert!(committed >= 1, "no crash after the commit point");
}

/// Reaps `disk`'s ring into `p` until op `id` is answered.
fn reap_until_answered(
    p: &mut super::io::Pipeline,
    disk: &mut Disk,
    id: IoId,
    done: &mut Vec<(IoId, Result<IoOutcome, super::Fault>)>,
) {
    use ringlog_storage::io::IoBackend;
    for _ in 0..100_000 {
        if done.iter().any(|d| d.0 == id) {
            return;
        }
        for (batch, c) in disk.io.reap() {
            assert!(p.owns(batch), "only the pipeline's batches are on the ring");
            let (store, io) = (&mut disk.store, &mut disk.io);
            p.complete(store, io, &mut disk.installs, (batch, c), NOW_MS, done);
        }
    }
    panic!("op {id} was never answered");
}

/// Guards against: a partition closed while its install's begin has its
/// create batch on the ring leaking the descriptors that batch opened (the
/// shard forgets a batch whose partition is gone).
#[test]
fn a_forgotten_begin_step_closes_the_files_it_opened() {
    use super::io::Pipeline;
    use ringlog_storage::io::{IoBackend, Op};
    let mut src = Disk::new(307, "/src");
    src.grow(40, 0, 1);
    let m = snapshot_of(&mut src);
    let mut dst = Disk::new(308, "/dst");
    let mut rx = Pipeline::new(m.chunk_size_bytes, 0);
    let begin = TransferOp::BeginInstall {
        manifest: Arc::new(m.clone()),
    };
    let mut done = Vec::new();
    let (store, io) = (&mut dst.store, &mut dst.io);
    rx.start(store, io, &mut dst.installs, (1, &begin), NOW_MS, &mut done);
    let staged_open = |io: &SimBackend| {
        io.open_paths()
            .iter()
            .filter(|p| p.to_string_lossy().contains("staging"))
            .count()
    };
    let mut forgotten = 0;
    for _ in 0..10_000 {
        for (batch, c) in dst.io.reap() {
            if c.iter().any(|c| matches!(c.op, Op::Open { .. })) {
                assert!(staged_open(&dst.io) > m.artifacts.len(), "opened");
                assert_eq!(dst.installs.forget(&mut dst.io, (batch, c)), Some(PID));
                forgotten += 1;
            } else {
                let (store, io) = (&mut dst.store, &mut dst.io);
                rx.complete(store, io, &mut dst.installs, (batch, c), NOW_MS, &mut done);
            }
        }
        if forgotten > 0 {
            break;
        }
    }
    assert_eq!(forgotten, 1, "the create step ran");
    assert!(done.is_empty(), "never answered: its batch was forgotten");
    assert_eq!(staged_open(&dst.io), 0, "descriptors leaked");
}

/// Guards against: an install's commit running synchronously on the
/// caller's thread (it must be queued on the ring and answered from the
/// reaping), or a commit started while the install's writes are in flight.
#[test]
fn the_pipeline_commits_an_install_a_step_per_reaped_batch() {
    use super::io::Pipeline;
    let mut src = Disk::new(303, "/src");
    src.grow(40, 0, 1);
    let m = snapshot_of(&mut src);
    let want = src.batches();
    let mut dst = Disk::new(304, "/dst");
    dst.grow(2, 0, 2);
    let chunk = store_config().transfer_chunk_bytes;
    let mut rx = Pipeline::new(chunk, 0);
    let mut done = Vec::new();
    begins_through(&mut rx, &mut dst, &m, 1, &mut done);
    let keys: Vec<ChunkKey> = m
        .artifacts
        .iter()
        .enumerate()
        .flat_map(|(a, art)| {
            (0..art.chunk_checksums.len() as u32).map(move |c| ChunkKey {
                artifact: a as u32,
                chunk: c,
            })
        })
        .collect();
    let pairs: Vec<(u32, u32)> = keys.iter().map(|k| (k.artifact, k.chunk)).collect();
    let bufs = src
        .store
        .read_chunks(&mut src.io, m.snapshot_id, &pairs, NOW_MS)
        .unwrap();
    let mut id = 2;
    let window = store_config().transfer_window_chunks;
    for (ks, bs) in keys.chunks(window).zip(bufs.chunks(window)) {
        let chunks = ks
            .iter()
            .zip(bs)
            .map(|(k, b)| (*k, ChunkData::from(&b[..])))
            .collect();
        let accept = TransferOp::AcceptChunks { chunks };
        let (store, disk_io) = (&mut dst.store, &mut dst.io);
        rx.start(
            store,
            disk_io,
            &mut dst.installs,
            (id, &accept),
            NOW_MS,
            &mut done,
        );
        if id == 2 {
            // The commit below must wait for this window's writes.
            assert!(rx.in_flight() == 1 && done.is_empty(), "{done:?}");
        }
        reap_until_answered(&mut rx, &mut dst, id, &mut done);
        assert!(matches!(done.pop(), Some((i, Ok(IoOutcome::Done))) if i == id));
        id += 1;
    }
    let commit = TransferOp::CommitInstall;
    let (store, disk_io) = (&mut dst.store, &mut dst.io);
    rx.start(
        store,
        disk_io,
        &mut dst.installs,
        (id, &commit),
        NOW_MS,
        &mut done,
    );
    assert!(done.is_empty(), "the commit is queued on the ring, not run");
    assert!(rx.ends_install() && rx.in_flight() == 1);
    reap_until_answered(&mut rx, &mut dst, id, &mut done);
    assert_eq!(done.pop(), Some((id, Ok(IoOutcome::Done))));
    assert!(!rx.ends_install() && rx.in_flight() == 0);
    assert_eq!(dst.installs.active(), 0);
    assert_eq!(dst.batches(), want, "the receiver holds the source's log");
}

/// The pipelined executor: serving reads and staged writes stay in flight
/// until reaped; an abort is held, without waiting, until the writes
/// queued before it are reaped (their answers come first); a failed staged write in flight fails its accept
/// and poisons the install, and the receiver's log stays as it was.
#[test]
fn the_pipeline_answers_queued_io_when_reaped_and_aborts_after_it() {
    use super::io::Pipeline;
    let mut src = Disk::new(300, "/src");
    src.grow(60, 0, 1);
    let m = snapshot_of(&mut src);
    let mut dst = Disk::new(301, "/dst");
    dst.grow(3, 0, 2);
    let old = dst.batches();
    let chunk = store_config().transfer_chunk_bytes;
    let (mut srv, mut rx) = (Pipeline::new(chunk, 4), Pipeline::new(chunk, 0));
    let mut done = Vec::new();
    let keys: Vec<ChunkKey> = (0..3)
        .map(|c| ChunkKey {
            artifact: 0,
            chunk: c,
        })
        .collect();
    let read = TransferOp::ReadChunks {
        snapshot_id: m.snapshot_id,
        keys: keys.clone(),
    };
    let (store, disk_io) = (&mut src.store, &mut src.io);
    srv.start(
        store,
        disk_io,
        &mut src.installs,
        (1, &read),
        NOW_MS,
        &mut done,
    );
    assert!(done.is_empty(), "a read waits for its batch");
    assert_eq!(srv.in_flight(), 1);
    let mut chunks = Vec::new();
    reap_until_answered(&mut srv, &mut src, 1, &mut done);
    if let Some((1, Ok(IoOutcome::Chunks(bufs)))) = done.pop() {
        chunks = bufs;
    }
    assert_eq!(chunks.len(), 3);
    begins_through(&mut rx, &mut dst, &m, 1, &mut done);
    // Chunk 0 staged, its write in flight; then the abort.
    let accept = |i: usize| TransferOp::AcceptChunks {
        chunks: vec![(keys[i], chunks[i].clone())],
    };
    let (store, disk_io) = (&mut dst.store, &mut dst.io);
    rx.start(
        store,
        disk_io,
        &mut dst.installs,
        (2, &accept(0)),
        NOW_MS,
        &mut done,
    );
    assert!(done.is_empty() && rx.in_flight() == 1);
    let (store, disk_io) = (&mut dst.store, &mut dst.io);
    let abort = TransferOp::AbortInstall;
    rx.start(
        store,
        disk_io,
        &mut dst.installs,
        (3, &abort),
        NOW_MS,
        &mut done,
    );
    // Held behind the write in flight: nothing waited for it.
    assert!(done.is_empty() && rx.ends_install(), "{done:?}");
    reap_until_answered(&mut rx, &mut dst, 3, &mut done);
    let ids: Vec<IoId> = done.iter().map(|(id, _)| *id).collect();
    assert_eq!(ids, vec![2, 3], "the write's answer before the abort's");
    assert!(done.iter().all(|(_, r)| r.is_ok()), "{done:?}");
    assert!(rx.in_flight() == 0 && !rx.ends_install());
    assert_eq!(dst.installs.active(), 0);
    done.clear();

    // Again, with the staged write failing on the disk.
    begins_through(&mut rx, &mut dst, &m, 4, &mut done);
    let nth = dst.io.op_count(FaultOp::Write);
    dst.io.inject(FaultOp::Write, nth, DiskFault::Errno(5));
    let (store, disk_io) = (&mut dst.store, &mut dst.io);
    rx.start(
        store,
        disk_io,
        &mut dst.installs,
        (5, &accept(0)),
        NOW_MS,
        &mut done,
    );
    reap_until_answered(&mut rx, &mut dst, 5, &mut done);
    let (id, failed) = done.pop().expect("answered");
    assert_eq!(id, 5);
    assert_eq!(failed.expect_err("EIO").kind, FaultKind::Local);
    let (store, disk_io) = (&mut dst.store, &mut dst.io);
    rx.start(
        store,
        disk_io,
        &mut dst.installs,
        (6, &accept(1)),
        NOW_MS,
        &mut done,
    );
    let (_, poisoned) = done.pop().expect("refused at once");
    assert!(poisoned
        .expect_err("poisoned")
        .reason
        .contains("install abandoned"));
    let commit = TransferOp::CommitInstall;
    let (store, disk_io) = (&mut dst.store, &mut dst.io);
    rx.start(
        store,
        disk_io,
        &mut dst.installs,
        (7, &commit),
        NOW_MS,
        &mut done,
    );
    reap_until_answered(&mut rx, &mut dst, 7, &mut done);
    assert!(done.pop().expect("answered").1.is_err(), "never commits");
    assert_eq!(dst.batches(), old, "the receiver's log is unchanged");
}
