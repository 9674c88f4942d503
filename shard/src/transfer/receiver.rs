//! The receiving side of a transfer: ask, refuse stale offers, pull with a
//! window, stage, commit; every retry within [`Budgets`].

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use ringlog_protocol::manifest::Manifest;
use ringlog_protocol::replication::{self as wire, ChunkKey, Offer, Refusal, SnapshotOffer};

use super::budget::{Budgets, BudgetsError, Peers};
use super::types::{
    ChunkData, Event, Fault, FaultKind, Frontier, IoId, IoOutcome, Local, Message, Outbox, Output,
    ReceiverCounters, Stale, TransferOp, Trigger,
};
use crate::vsr::timeout::Rng;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReceiverConfig {
    pub replica_count: u8,
    /// This replica's index (never asked).
    pub replica: u8,
    pub budgets: Budgets,
}

#[derive(Debug, Clone)]
pub enum ReceiverInput {
    /// Arm a transfer (ignored while one runs). `local` is the replica's
    /// durable state: no offer below it is taken.
    Start {
        trigger: Trigger,
        local: Local,
    },
    /// A transfer message from replica `from`.
    Message {
        from: u8,
        msg: Message,
    },
    /// A message from `from` that failed to decode (charged to it).
    Undecodable {
        from: u8,
    },
    Tick,
    IoDone {
        id: IoId,
        result: Result<IoOutcome, Fault>,
    },
    /// The replica no longer needs the transfer: abort what is staged.
    Cancel,
}

/// A chunk pull: chunks are numbered in manifest order; the window is
/// `[low, low + window_chunks)`, `low` the first not yet staged.
#[derive(Debug)]
struct Pull {
    peer: u8,
    manifest: Arc<Manifest>,
    /// Per artifact: the number of its first chunk.
    starts: Vec<u64>,
    total: u64,
    low: u64,
    /// One past the highest chunk requested: requests go in order, so
    /// every chunk below it was asked for at least once.
    requested_end: u64,
    /// Requested, not arrived: chunk number -> tick it was (re)requested.
    in_flight: BTreeMap<u64, u64>,
    /// Arrived and checked, its AcceptChunks not yet done.
    arrived: BTreeSet<u64>,
    /// Staged, above `low`.
    accepted: BTreeSet<u64>,
    accepts: BTreeMap<IoId, Vec<u64>>,
    progress_tick: u64,
}

#[derive(Debug)]
enum Phase {
    Idle,
    /// Ask once `until_tick` is reached (rotating first if `rotate`).
    Waiting {
        until_tick: u64,
        rotate: bool,
    },
    Asking {
        peer: u8,
        nonce: u64,
        since_tick: u64,
    },
    Beginning {
        peer: u8,
        io: IoId,
        manifest: Arc<Manifest>,
    },
    Pulling(Box<Pull>),
    Committing {
        peer: u8,
        io: IoId,
        manifest: Arc<Manifest>,
    },
}

/// Why an attempt ended without an install (trace and tests).
struct Failure {
    reason: &'static str,
    rotate: bool,
}

pub struct Receiver {
    budgets: Budgets,
    rng: Rng,
    peers: Peers,
    now_tick: u64,
    next_io: IoId,
    trigger: Option<Trigger>,
    local: Local,
    phase: Phase,
    transient_in_row: u32,
    /// The snapshot of the attempt that ended last: its chunks still on
    /// the wire are dropped, not charged (a slow peer is not hostile).
    ended: Option<(u8, u64)>,
    /// The peer and nonce of the last request: a copy of its answer that
    /// arrives after the answer was handled is the network repeating.
    asked: Option<(u8, u64)>,
    counters: ReceiverCounters,
}

impl Receiver {
    /// `seed` must differ per boot: nonces come from it.
    pub fn new(cfg: ReceiverConfig, seed: u64) -> Result<Self, BudgetsError> {
        cfg.budgets.validate()?;
        if cfg.replica >= cfg.replica_count {
            return Err(BudgetsError("replica index outside the replica count"));
        }
        Ok(Self {
            budgets: cfg.budgets,
            rng: Rng::new(seed),
            peers: Peers::new(cfg.replica_count, cfg.replica),
            now_tick: 0,
            next_io: 0,
            trigger: None,
            local: Local::default(),
            phase: Phase::Idle,
            transient_in_row: 0,
            ended: None,
            asked: None,
            counters: ReceiverCounters::default(),
        })
    }

    pub fn counters(&self) -> ReceiverCounters {
        self.counters
    }

    /// The frontier the replica must repair from and stamp after: the
    /// installed one once an install committed, else the one it had.
    pub fn frontier(&self) -> Frontier {
        self.local.frontier
    }

    pub fn is_active(&self) -> bool {
        !matches!(self.phase, Phase::Idle)
    }

    pub fn trigger(&self) -> Option<Trigger> {
        self.trigger
    }

    pub fn phase_name(&self) -> &'static str {
        match self.phase {
            Phase::Idle => "idle",
            Phase::Waiting { .. } => "waiting",
            Phase::Asking { .. } => "asking",
            Phase::Beginning { .. } => "beginning",
            Phase::Pulling(_) => "pulling",
            Phase::Committing { .. } => "committing",
        }
    }

    pub fn charges(&self, peer: u8) -> u32 {
        self.peers.charges(peer)
    }

    pub fn is_quarantined(&self, peer: u8) -> bool {
        self.peers.is_quarantined(peer, self.now_tick)
    }

    /// Chunk requests in flight now (0 unless pulling).
    pub fn in_flight_chunks(&self) -> usize {
        match &self.phase {
            Phase::Pulling(p) => p.in_flight.len(),
            _ => 0,
        }
    }

    pub fn step(&mut self, input: ReceiverInput, out: &mut Outbox) {
        match input {
            ReceiverInput::Start { trigger, local } => self.on_start(trigger, local, out),
            ReceiverInput::Message { from, msg } => self.on_message(from, msg, out),
            ReceiverInput::Undecodable { from } => {
                // Never answered with a fresh request (Iggy re-pulled the
                // whole manifest on each): the offer timeout re-asks, with
                // backoff, and the charges quarantine the peer.
                self.counters.decode_failures += 1;
                self.charge(from, "undecodable message", out);
            }
            ReceiverInput::Tick => self.on_tick(out),
            ReceiverInput::IoDone { id, result } => self.on_io_done(id, result, out),
            ReceiverInput::Cancel => {
                self.end_attempt(out);
                self.phase = Phase::Idle;
                self.trigger = None;
            }
        }
        self.assert_invariants();
    }

    fn on_start(&mut self, trigger: Trigger, local: Local, out: &mut Outbox) {
        if self.is_active() {
            out.event(Event::Dropped {
                what: "start",
                reason: "a transfer is running",
            });
            return;
        }
        if self.peers.is_empty() {
            out.event(Event::Dropped {
                what: "start",
                reason: "no peer to transfer from",
            });
            return;
        }
        self.counters.starts += 1;
        self.trigger = Some(trigger);
        self.local = local;
        self.transient_in_row = 0;
        self.ask(false, out);
    }

    fn io_id(&mut self) -> IoId {
        self.next_io += 1;
        self.next_io
    }

    /// Sends a RequestSnapshot with a fresh nonce to the current peer (the
    /// next one not quarantined, if `rotate` or it is quarantined).
    fn ask(&mut self, rotate: bool, out: &mut Outbox) {
        let before = self.peers.current();
        let quarantined = before.is_some_and(|p| self.peers.is_quarantined(p, self.now_tick));
        let peer = if rotate || quarantined {
            self.peers.rotate(self.now_tick)
        } else {
            before
        };
        let Some(peer) = peer else {
            // All quarantined: wait for the first to come out.
            let until_tick = self.peers.next_free_tick().max(self.now_tick + 1);
            self.phase = Phase::Waiting {
                until_tick,
                rotate: true,
            };
            return;
        };
        if let Some(from) = before.filter(|&b| b != peer) {
            self.counters.rotations += 1;
            self.transient_in_row = 0;
            out.event(Event::Rotated { from, to: peer });
        }
        let nonce = self.rng.next_u64() | 1;
        let request = wire::RequestSnapshot {
            nonce,
            commit: self.local.commit_held(),
            purge_generation: self.local.purge_generation,
        };
        out.send(peer, Message::RequestSnapshot(request));
        out.event(Event::Asked { peer, nonce });
        self.counters.requests_sent += 1;
        self.asked = Some((peer, nonce));
        self.phase = Phase::Asking {
            peer,
            nonce,
            since_tick: self.now_tick,
        };
    }

    fn on_tick(&mut self, out: &mut Outbox) {
        self.now_tick += 1;
        let now = self.now_tick;
        match &mut self.phase {
            Phase::Waiting { until_tick, rotate } if now >= *until_tick => {
                let rotate = *rotate;
                self.ask(rotate, out);
            }
            Phase::Asking { since_tick, .. }
                if now - *since_tick >= self.budgets.offer_timeout_ticks =>
            {
                self.counters.stalls += 1;
                self.fail(
                    Failure {
                        reason: "no offer within the offer timeout",
                        rotate: true,
                    },
                    out,
                );
            }
            Phase::Pulling(pull) => {
                if now - pull.progress_tick > self.budgets.stall_ticks_max {
                    self.counters.stalls += 1;
                    self.fail(
                        Failure {
                            reason: "no chunk within the stall budget",
                            rotate: true,
                        },
                        out,
                    );
                    return;
                }
                let late: Vec<u64> = pull
                    .in_flight
                    .iter()
                    .filter(|(_, &sent)| now - sent >= self.budgets.chunk_timeout_ticks)
                    .map(|(&n, _)| n)
                    .collect();
                if !late.is_empty() {
                    self.counters.chunks_rerequested += late.len() as u64;
                    Self::request(pull, &late, now, &mut self.counters, out);
                }
            }
            _ => {}
        }
    }

    fn on_message(&mut self, from: u8, msg: Message, out: &mut Outbox) {
        match msg {
            Message::SnapshotOffer(offer) => self.on_offer(from, offer, out),
            Message::Chunk {
                snapshot_id,
                key,
                data,
            } => self.on_chunk(from, snapshot_id, key, data, out),
            Message::RequestSnapshot(_)
            | Message::RequestChunks(_)
            | Message::ReleaseSnapshot(_) => out.event(Event::Dropped {
                what: "message",
                reason: "a serving message reached the receiver",
            }),
        }
    }

    /// The peer and snapshot of the attempt, once an offer was taken.
    fn taken(&self) -> Option<(u8, u64)> {
        match &self.phase {
            Phase::Beginning { peer, manifest, .. } | Phase::Committing { peer, manifest, .. } => {
                Some((*peer, manifest.snapshot_id))
            }
            Phase::Pulling(p) => Some((p.peer, p.manifest.snapshot_id)),
            _ => None,
        }
    }

    fn on_offer(&mut self, from: u8, offer: SnapshotOffer, out: &mut Outbox) {
        if offer.offer == Offer::Refused(Refusal::UnknownSnapshot) {
            if self.taken() == Some((from, offer.snapshot_id)) {
                // Its lease ran out under us: ask again (the same peer).
                let reason = "the peer no longer knows the snapshot";
                self.fail(
                    Failure {
                        reason,
                        rotate: false,
                    },
                    out,
                );
            }
            return;
        }
        let Phase::Asking { peer, nonce, .. } = self.phase else {
            if self.is_repeat(from, &offer) {
                self.counters.offers_repeated += 1;
                return;
            }
            return self.unsolicited(from, &offer, out);
        };
        if from != peer || offer.nonce != nonce {
            return self.unsolicited(from, &offer, out);
        }
        match offer.offer {
            Offer::Refused(reason) if reason.is_transient() => {
                self.counters.refusals_transient += 1;
                self.retry_transient(out);
            }
            Offer::Refused(_) => {
                self.counters.refusals_final += 1;
                let reason = "the peer refused";
                self.fail(
                    Failure {
                        reason,
                        rotate: true,
                    },
                    out,
                );
            }
            Offer::Snapshot(ref m) => match self.check_offer(&offer, m) {
                Ok(()) => self.take(peer, m.clone(), out),
                Err(why) => self.refuse(peer, m.snapshot_id, why, out),
            },
        }
    }

    /// A copy of the answer to the last request, already handled: the same
    /// refusal, or the same snapshot (the one taken or just ended). A copy
    /// naming another snapshot is no repeat (a server offers one snapshot
    /// per request).
    fn is_repeat(&self, from: u8, offer: &SnapshotOffer) -> bool {
        if self.asked != Some((from, offer.nonce)) {
            return false;
        }
        match &offer.offer {
            Offer::Refused(_) => true,
            Offer::Snapshot(m) => {
                let copy = Some((from, m.snapshot_id));
                self.taken() == copy || self.ended == copy
            }
        }
    }

    /// An offer not echoing the request in flight (a stale one from before
    /// a restart, a duplicate, an endless re-offer): charged, and its
    /// snapshot released so the peer's lease goes.
    fn unsolicited(&mut self, from: u8, offer: &SnapshotOffer, out: &mut Outbox) {
        self.counters.offers_unsolicited += 1;
        if let Offer::Snapshot(m) = &offer.offer {
            let release = wire::ReleaseSnapshot {
                snapshot_id: m.snapshot_id,
            };
            out.send(from, Message::ReleaseSnapshot(release));
        }
        self.charge(from, "offer echoes no request in flight", out);
    }

    fn refuse(&mut self, peer: u8, snapshot_id: u64, why: Stale, out: &mut Outbox) {
        self.counters.offers_stale += 1;
        out.event(Event::OfferRefused { peer, why });
        out.send(
            peer,
            Message::ReleaseSnapshot(wire::ReleaseSnapshot { snapshot_id }),
        );
        // A peer level with us answered honestly (it has nothing we lack,
        // as when a repair is stuck on ops nobody holds): rotated, never
        // charged, so honest peers are not quarantined for it.
        if why != Stale::NoProgress {
            self.charge(peer, "stale or oversized offer", out);
        }
        if matches!(self.phase, Phase::Asking { .. }) {
            let reason = "stale or oversized offer";
            self.fail(
                Failure {
                    reason,
                    rotate: true,
                },
                out,
            );
        }
    }

    /// The receiver's refusals (issue 10 item 2), before anything is
    /// staged; storage checks its own durable state again at begin.
    pub fn check_offer(&self, offer: &SnapshotOffer, m: &Manifest) -> Result<(), Stale> {
        let ours = &self.local;
        if m.partition_id != ours.partition_id {
            return Err(Stale::WrongPartition {
                offered: m.partition_id,
                ours: ours.partition_id,
            });
        }
        let below = [
            (m.purge_generation, ours.purge_generation, 0),
            (m.commit, ours.commit_held(), 1),
            (m.next_offset, ours.frontier.next_offset, 2),
            (u64::from(m.view), u64::from(ours.view), 3),
        ];
        #[cfg(feature = "planted-bugs")]
        let purge_unchecked =
            crate::vsr::planted::active(crate::vsr::planted::Plant::InstallIgnoresPurgeGeneration);
        #[cfg(not(feature = "planted-bugs"))]
        let purge_unchecked = false;
        let skipped = |which: usize| which == 0 && purge_unchecked;
        if let Some(&(offered, ours, which)) = below
            .iter()
            .find(|&&(o, ours, which)| o < ours && !skipped(which))
        {
            return Err(match which {
                0 => Stale::PurgeGeneration { offered, ours },
                1 => Stale::Commit { offered, ours },
                2 => Stale::Frontier { offered, ours },
                _ => Stale::View {
                    offered: offered as u32,
                    ours: ours as u32,
                },
            });
        }
        if m.commit > offer.commit_max {
            return Err(Stale::CommitAboveMax {
                commit: m.commit,
                commit_max: offer.commit_max,
            });
        }
        if m.last_op > m.commit {
            return Err(Stale::UncommittedOps {
                last_op: m.last_op,
                commit: m.commit,
            });
        }
        self.check_sizes(m)?;
        let level = m.next_offset == ours.frontier.next_offset
            && m.purge_generation == ours.purge_generation;
        if level && !self.trigger.is_some_and(Trigger::takes_level_offer) {
            return Err(Stale::NoProgress);
        }
        Ok(())
    }

    fn check_sizes(&self, m: &Manifest) -> Result<(), Stale> {
        let b = &self.budgets;
        if m.chunk_size_bytes != b.chunk_size_bytes {
            return Err(Stale::ChunkSize {
                offered: m.chunk_size_bytes,
                ours: b.chunk_size_bytes,
            });
        }
        if m.artifacts.len() as u64 > b.artifacts_max {
            return Err(Stale::TooManyArtifacts {
                offered: m.artifacts.len() as u64,
                max: b.artifacts_max,
            });
        }
        if let Some(a) = m
            .artifacts
            .iter()
            .find(|a| a.length_bytes > b.artifact_bytes_max)
        {
            return Err(Stale::ArtifactTooLarge {
                offered: a.length_bytes,
                max: b.artifact_bytes_max,
            });
        }
        let total = m.total_length_bytes();
        if total > b.total_bytes_max {
            return Err(Stale::TooManyBytes {
                offered: total,
                max: b.total_bytes_max,
            });
        }
        Ok(())
    }

    fn take(&mut self, peer: u8, manifest: Manifest, out: &mut Outbox) {
        self.counters.offers_taken += 1;
        self.transient_in_row = 0;
        let manifest = Arc::new(manifest);
        let io = self.io_id();
        out.event(Event::OfferTaken {
            peer,
            snapshot_id: manifest.snapshot_id,
        });
        out.push(Output::Io {
            id: io,
            op: TransferOp::BeginInstall {
                manifest: manifest.clone(),
            },
        });
        self.phase = Phase::Beginning { peer, io, manifest };
    }

    fn retry_transient(&mut self, out: &mut Outbox) {
        self.end_attempt(out);
        self.transient_in_row += 1;
        let rotate = self.transient_in_row > self.budgets.transient_retries_max;
        if rotate {
            self.transient_in_row = 0;
        }
        self.phase = Phase::Waiting {
            until_tick: self.now_tick + self.budgets.retry_ticks,
            rotate,
        };
    }
}

impl Pull {
    fn new(peer: u8, manifest: Arc<Manifest>, now_tick: u64) -> Self {
        let mut starts = Vec::with_capacity(manifest.artifacts.len());
        let mut total = 0u64;
        for a in &manifest.artifacts {
            starts.push(total);
            total += a.chunk_checksums.len() as u64;
        }
        Self {
            peer,
            manifest,
            starts,
            total,
            low: 0,
            requested_end: 0,
            in_flight: BTreeMap::new(),
            arrived: BTreeSet::new(),
            accepted: BTreeSet::new(),
            accepts: BTreeMap::new(),
            progress_tick: now_tick,
        }
    }

    fn key_of(&self, n: u64) -> ChunkKey {
        let artifact = self.starts.partition_point(|&s| s <= n) - 1;
        ChunkKey {
            artifact: artifact as u32,
            chunk: (n - self.starts[artifact]) as u32,
        }
    }

    /// The chunk's number, if the manifest has it.
    fn number_of(&self, key: ChunkKey) -> Option<u64> {
        let a = self.manifest.artifacts.get(key.artifact as usize)?;
        ((key.chunk as usize) < a.chunk_checksums.len())
            .then(|| self.starts[key.artifact as usize] + u64::from(key.chunk))
    }

    /// Whether `data` is the chunk `key` names: its length and checksum.
    fn matches(&self, key: ChunkKey, data: &[u8]) -> bool {
        let Some(a) = self.manifest.artifacts.get(key.artifact as usize) else {
            return false;
        };
        let chunk_bytes = u64::from(self.manifest.chunk_size_bytes);
        let start = u64::from(key.chunk) * chunk_bytes;
        let len = chunk_bytes.min(a.length_bytes.saturating_sub(start));
        a.chunk_checksums.get(key.chunk as usize).copied() == Some(ringlog_protocol::checksum(data))
            && data.len() as u64 == len
    }

    /// Chunks of the window not requested, arrived or staged.
    fn requestable(&self, window_chunks: usize) -> Vec<u64> {
        let end = (self.low + window_chunks as u64).min(self.total);
        (self.low..end)
            .filter(|n| {
                !self.in_flight.contains_key(n)
                    && !self.arrived.contains(n)
                    && !self.accepted.contains(n)
            })
            .collect()
    }

    fn assert_invariants(&self, window_chunks: usize) {
        let end = self.low + window_chunks as u64;
        let held = self
            .in_flight
            .keys()
            .chain(&self.arrived)
            .chain(&self.accepted);
        for &n in held {
            assert!(
                n >= self.low && n < end && n < self.total,
                "chunk {n} outside the window [{}, {end})",
                self.low
            );
        }
        assert!(self.low <= self.total);
        assert!(self.in_flight.len() + self.arrived.len() + self.accepted.len() <= window_chunks);
        assert!(!self.accepted.contains(&self.low), "low not advanced");
    }
}

impl Receiver {
    /// Requests chunks `numbers` (increasing) of the pull, in one message.
    fn request(
        pull: &mut Pull,
        numbers: &[u64],
        now_tick: u64,
        counters: &mut ReceiverCounters,
        out: &mut Outbox,
    ) {
        debug_assert!(numbers.windows(2).all(|w| w[0] < w[1]));
        let keys: Vec<ChunkKey> = numbers.iter().map(|&n| pull.key_of(n)).collect();
        for &n in numbers {
            pull.in_flight.insert(n, now_tick);
        }
        pull.requested_end = pull.requested_end.max(numbers.last().map_or(0, |n| n + 1));
        counters.chunk_requests_sent += 1;
        counters.chunks_requested += keys.len() as u64;
        let request = wire::RequestChunks {
            snapshot_id: pull.manifest.snapshot_id,
            keys,
        };
        out.send(pull.peer, Message::RequestChunks(request));
    }

    /// Requests what the window has room for; commits once all is staged.
    fn fill_window(&mut self, out: &mut Outbox) {
        let Phase::Pulling(pull) = &mut self.phase else {
            return;
        };
        if pull.low == pull.total {
            let (peer, manifest) = (pull.peer, pull.manifest.clone());
            let io = self.io_id();
            out.push(Output::Io {
                id: io,
                op: TransferOp::CommitInstall,
            });
            self.phase = Phase::Committing { peer, io, manifest };
            return;
        }
        let numbers = pull.requestable(self.budgets.window_chunks);
        if !numbers.is_empty() {
            Self::request(pull, &numbers, self.now_tick, &mut self.counters, out);
        }
    }

    fn on_chunk(
        &mut self,
        from: u8,
        snapshot_id: u64,
        key: ChunkKey,
        data: ChunkData,
        out: &mut Outbox,
    ) {
        if self.ended == Some((from, snapshot_id)) {
            self.counters.chunks_late += 1;
            return;
        }
        let Phase::Pulling(pull) = &mut self.phase else {
            self.counters.chunks_unrequested += 1;
            return self.charge(from, "chunk while not pulling", out);
        };
        if from != pull.peer || snapshot_id != pull.manifest.snapshot_id {
            self.counters.chunks_unrequested += 1;
            return self.charge(from, "chunk of another peer or snapshot", out);
        }
        let Some(n) = pull.number_of(key) else {
            self.counters.chunks_unrequested += 1;
            return self.charge(from, "chunk outside the manifest", out);
        };
        if !pull.in_flight.contains_key(&n) {
            if n < pull.requested_end {
                // Asked for once and already here: a network duplicate or
                // the answer to a re-request; costs a lookup, no storage.
                self.counters.chunks_late += 1;
                return;
            }
            self.counters.chunks_unrequested += 1;
            return self.charge(from, "chunk never requested", out);
        }
        if !pull.matches(key, &data) {
            // Stays in flight: asked again when it times out.
            self.counters.chunks_garbage += 1;
            return self.charge(from, "chunk fails its manifest checksum", out);
        }
        pull.in_flight.remove(&n);
        pull.arrived.insert(n);
        pull.progress_tick = self.now_tick;
        self.counters.chunks_received += 1;
        self.counters.bytes_received += data.len() as u64;
        self.next_io += 1;
        let io = self.next_io;
        pull.accepts.insert(io, vec![n]);
        out.push(Output::Io {
            id: io,
            op: TransferOp::AcceptChunks {
                chunks: vec![(key, data)],
            },
        });
    }

    fn on_io_done(&mut self, id: IoId, result: Result<IoOutcome, Fault>, out: &mut Outbox) {
        match (&mut self.phase, result) {
            (Phase::Beginning { io, peer, manifest }, Ok(_)) if *io == id => {
                let pull = Pull::new(*peer, manifest.clone(), self.now_tick);
                self.phase = Phase::Pulling(Box::new(pull));
                self.fill_window(out);
            }
            (Phase::Pulling(pull), Ok(_)) if pull.accepts.contains_key(&id) => {
                for n in pull.accepts.remove(&id).unwrap_or_default() {
                    pull.arrived.remove(&n);
                    pull.accepted.insert(n);
                }
                while pull.accepted.remove(&pull.low) {
                    pull.low += 1;
                }
                self.fill_window(out);
            }
            (Phase::Committing { io, peer, manifest }, Ok(_)) if *io == id => {
                let (peer, manifest) = (*peer, manifest.clone());
                self.installed(peer, &manifest, out);
            }
            (phase, Err(fault)) if Self::pending(phase, id) => self.on_fault(fault, out),
            // Aborts, and answers to ops of an attempt that already ended.
            _ => {}
        }
    }

    fn pending(phase: &Phase, id: IoId) -> bool {
        match phase {
            Phase::Beginning { io, .. } | Phase::Committing { io, .. } => *io == id,
            Phase::Pulling(pull) => pull.accepts.contains_key(&id),
            _ => false,
        }
    }

    fn on_fault(&mut self, fault: Fault, out: &mut Outbox) {
        let peer = self.taken().map(|(p, _)| p);
        match fault.kind {
            FaultKind::Transient => self.retry_transient(out),
            FaultKind::Peer => {
                if let Some(peer) = peer {
                    self.charge(peer, "storage refused the offer or its chunks", out);
                }
                if self.taken().is_some() {
                    let reason = "storage refused the offer or its chunks";
                    self.fail(
                        Failure {
                            reason,
                            rotate: true,
                        },
                        out,
                    );
                }
            }
            FaultKind::Local | FaultKind::Gone => {
                let reason = "local storage failed";
                self.fail(
                    Failure {
                        reason,
                        rotate: false,
                    },
                    out,
                );
            }
        }
    }

    fn installed(&mut self, peer: u8, manifest: &Manifest, out: &mut Outbox) {
        let frontier = Frontier::of_manifest(manifest);
        self.local.frontier = frontier;
        self.local.commit = self.local.commit.max(manifest.commit);
        self.local.purge_generation = self.local.purge_generation.max(manifest.purge_generation);
        self.local.view = self.local.view.max(manifest.view);
        let release = wire::ReleaseSnapshot {
            snapshot_id: manifest.snapshot_id,
        };
        out.send(peer, Message::ReleaseSnapshot(release));
        out.event(Event::Installed { peer, frontier });
        self.ended = Some((peer, manifest.snapshot_id));
        self.counters.installs += 1;
        // Only a completed install resets the backoff.
        self.counters.failures_consecutive = 0;
        self.transient_in_row = 0;
        self.phase = Phase::Idle;
        self.trigger = None;
    }

    /// Aborts what the attempt staged and releases its snapshot.
    fn end_attempt(&mut self, out: &mut Outbox) {
        if let Some((peer, snapshot_id)) = self.taken() {
            self.ended = Some((peer, snapshot_id));
            out.send(
                peer,
                Message::ReleaseSnapshot(wire::ReleaseSnapshot { snapshot_id }),
            );
            let io = self.io_id();
            out.push(Output::Io {
                id: io,
                op: TransferOp::AbortInstall,
            });
            self.counters.aborts += 1;
        }
    }

    /// Ends the attempt and waits out the backoff of one more consecutive
    /// failure. The replica keeps the frontier it had (never a zeroed one).
    fn fail(&mut self, failure: Failure, out: &mut Outbox) {
        let peer = match &self.phase {
            Phase::Asking { peer, .. } => Some(*peer),
            _ => self.taken().map(|(p, _)| p),
        };
        self.end_attempt(out);
        self.counters.attempts_failed += 1;
        self.counters.failures_consecutive = self.counters.failures_consecutive.saturating_add(1);
        let backoff_ticks = self
            .budgets
            .backoff_ticks(self.counters.failures_consecutive, &mut self.rng);
        self.counters.backoff_ticks_last = backoff_ticks;
        out.event(Event::AttemptFailed {
            peer: peer.unwrap_or(u8::MAX),
            reason: failure.reason,
            frontier: self.local.frontier,
            backoff_ticks,
        });
        self.phase = Phase::Waiting {
            until_tick: self.now_tick + backoff_ticks,
            rotate: failure.rotate,
        };
    }

    /// Charges `peer`; one put over its limit is quarantined, and an
    /// attempt against it ends.
    fn charge(&mut self, peer: u8, reason: &'static str, out: &mut Outbox) {
        self.counters.charges += 1;
        out.event(Event::Dropped {
            what: "charged",
            reason,
        });
        let Some(until_tick) = self.peers.charge(peer, self.now_tick, &self.budgets) else {
            return;
        };
        self.counters.quarantines += 1;
        out.event(Event::Quarantined { peer, until_tick });
        let current = match &self.phase {
            Phase::Asking { peer, .. } => Some(*peer),
            _ => self.taken().map(|(p, _)| p),
        };
        if current == Some(peer) {
            let reason = "peer quarantined";
            self.fail(
                Failure {
                    reason,
                    rotate: true,
                },
                out,
            );
        }
    }

    fn assert_invariants(&self) {
        if let Phase::Pulling(pull) = &self.phase {
            pull.assert_invariants(self.budgets.window_chunks);
        }
        if let Phase::Waiting { until_tick, .. } = self.phase {
            let wait_max = self
                .budgets
                .backoff_ticks_max()
                .max(self.budgets.retry_ticks)
                .max(self.budgets.quarantine_ticks);
            assert!(
                until_tick <= self.now_tick + wait_max,
                "wait beyond its bound"
            );
        }
        debug_assert!(self.is_active() || self.trigger.is_none());
    }
}
