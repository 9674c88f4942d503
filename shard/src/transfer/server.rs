//! The serving side: offers snapshots (at most `snapshots_max` open per
//! partition, each leased in ticks), reads the chunks asked for and sends
//! them, several reads in flight while earlier chunks are on the wire.
//! A purge replicated in the log does not wait for leases: it invalidates
//! the store's open snapshots, and the next read of one answers the
//! receiver with a final refusal (`UnknownSnapshot`); so does an install.
//! A snapshot is cut to the committed prefix: the replica's commit, or the
//! store's sealed floor when that is higher (a restarted replica's commit
//! can lag what its store sealed).

use std::collections::BTreeMap;
use std::sync::Arc;

use ringlog_protocol::manifest::Manifest;
use ringlog_protocol::replication::{self as wire, ChunkKey, Offer, Refusal, SnapshotOffer};

use super::types::{
    Event, Fault, FaultKind, IoId, IoOutcome, Message, Outbox, Output, ServerCounters, TransferOp,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerConfig {
    /// Snapshots open (or opening) per partition; beyond, Busy. At most
    /// the store's `snapshots_max`.
    pub snapshots_max: usize,
    /// Ticks a snapshot stays open without a request naming it.
    pub lease_ticks: u64,
    /// Chunk keys read or being read per snapshot at once; keys beyond it
    /// are dropped (the receiver asks again), so one receiver cannot queue
    /// unbounded reads.
    pub reads_keys_max: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            snapshots_max: 4,
            lease_ticks: 300,
            reads_keys_max: 64,
        }
    }
}

/// What the replica is when a request arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServingState {
    /// The replica serves this partition and is not fenced.
    pub available: bool,
    /// Normal status (not in a view change, recovering or installing).
    pub normal: bool,
    pub commit: u64,
    pub commit_max: u64,
}

#[derive(Debug, Clone)]
pub enum ServerInput {
    Message {
        from: u8,
        msg: Message,
        state: ServingState,
    },
    Tick,
    IoDone {
        id: IoId,
        result: Result<IoOutcome, Fault>,
    },
}

#[derive(Debug)]
struct Served {
    peer: u8,
    /// The request it answered, and the commit_max it was offered with.
    nonce: u64,
    commit_max: u64,
    manifest: Arc<Manifest>,
    used_tick: u64,
    reading_keys: usize,
}

#[derive(Debug)]
enum Pending {
    Open {
        peer: u8,
        nonce: u64,
        commit_max: u64,
    },
    Read {
        peer: u8,
        snapshot_id: u64,
        keys: Vec<ChunkKey>,
    },
    Release,
}

pub struct Server {
    cfg: ServerConfig,
    now_tick: u64,
    next_io: IoId,
    open: BTreeMap<u64, Served>,
    pending: BTreeMap<IoId, Pending>,
    counters: ServerCounters,
}

impl Server {
    pub fn new(cfg: ServerConfig) -> Self {
        assert!(cfg.snapshots_max > 0 && cfg.lease_ticks > 0 && cfg.reads_keys_max > 0);
        Self {
            cfg,
            now_tick: 0,
            next_io: 0,
            open: BTreeMap::new(),
            pending: BTreeMap::new(),
            counters: ServerCounters::default(),
        }
    }

    pub fn counters(&self) -> ServerCounters {
        self.counters
    }

    /// Snapshots open or being opened.
    pub fn snapshots_open(&self) -> usize {
        let opening = self
            .pending
            .values()
            .filter(|p| matches!(p, Pending::Open { .. }))
            .count();
        self.open.len() + opening
    }

    pub fn step(&mut self, input: ServerInput, out: &mut Outbox) {
        match input {
            ServerInput::Message { from, msg, state } => match msg {
                Message::RequestSnapshot(r) => self.on_request(from, r, state, out),
                Message::RequestChunks(r) => self.on_chunks(from, r, state, out),
                Message::ReleaseSnapshot(r) => {
                    if self
                        .open
                        .get(&r.snapshot_id)
                        .is_some_and(|s| s.peer == from)
                    {
                        self.release(r.snapshot_id, out);
                        self.counters.released += 1;
                    }
                }
                Message::SnapshotOffer(_) | Message::Chunk { .. } => out.event(Event::Dropped {
                    what: "message",
                    reason: "a receiving message reached the server",
                }),
            },
            ServerInput::Tick => self.on_tick(out),
            ServerInput::IoDone { id, result } => self.on_io_done(id, result, out),
        }
        assert!(self.snapshots_open() <= self.cfg.snapshots_max);
    }

    fn io(&mut self, op: TransferOp, pending: Pending, out: &mut Outbox) {
        self.next_io += 1;
        self.pending.insert(self.next_io, pending);
        out.push(Output::Io {
            id: self.next_io,
            op,
        });
    }

    fn refuse(&mut self, to: u8, nonce: u64, commit_max: u64, why: Refusal, out: &mut Outbox) {
        let counter = match why {
            Refusal::Busy => &mut self.counters.refused_busy,
            Refusal::NotNormal => &mut self.counters.refused_not_normal,
            Refusal::NotAhead => &mut self.counters.refused_not_ahead,
            Refusal::Unavailable => &mut self.counters.refused_unavailable,
            Refusal::UnknownSnapshot => &mut self.counters.unknown_snapshot,
        };
        *counter += 1;
        let snapshot_id = 0;
        let offer = Offer::Refused(why);
        out.send(
            to,
            Message::SnapshotOffer(SnapshotOffer {
                nonce,
                snapshot_id,
                commit_max,
                offer,
            }),
        );
    }

    fn on_request(
        &mut self,
        from: u8,
        r: wire::RequestSnapshot,
        state: ServingState,
        out: &mut Outbox,
    ) {
        self.counters.requests += 1;
        if let Some(offer) = self.repeat_offer(from, r.nonce) {
            // A repeated request (the network repeats): the same answer.
            return out.send(from, Message::SnapshotOffer(offer));
        }
        // A receiver asks again after a failed attempt: its older
        // snapshot is done with, so one peer holds at most one.
        let held: Vec<u64> = self
            .open
            .iter()
            .filter(|(_, s)| s.peer == from)
            .map(|(&id, _)| id)
            .collect();
        for id in held {
            self.release(id, out);
        }
        // Below (not at) the receiver's commit: one whose own bytes are
        // corrupt, or a wiped one, needs a snapshot at the same commit.
        let why = if !state.available {
            Some(Refusal::Unavailable)
        } else if !state.normal {
            Some(Refusal::NotNormal)
        } else if state.commit < r.commit {
            Some(Refusal::NotAhead)
        } else if self.snapshots_open() >= self.cfg.snapshots_max {
            Some(Refusal::Busy)
        } else {
            None
        };
        if let Some(why) = why {
            return self.refuse(from, r.nonce, state.commit_max, why, out);
        }
        let pending = Pending::Open {
            peer: from,
            nonce: r.nonce,
            commit_max: state.commit_max,
        };
        self.io(
            TransferOp::OpenSnapshot {
                commit: state.commit,
            },
            pending,
            out,
        );
    }

    /// The offer already made for `peer`'s request `nonce`, if any.
    fn repeat_offer(&mut self, peer: u8, nonce: u64) -> Option<SnapshotOffer> {
        let now_tick = self.now_tick;
        let (&snapshot_id, served) = self
            .open
            .iter_mut()
            .find(|(_, s)| s.peer == peer && s.nonce == nonce)?;
        served.used_tick = now_tick;
        Some(SnapshotOffer {
            nonce,
            snapshot_id,
            commit_max: served.commit_max,
            offer: Offer::Snapshot((*served.manifest).clone()),
        })
    }

    fn unknown(&mut self, to: u8, snapshot_id: u64, commit_max: u64, out: &mut Outbox) {
        self.counters.unknown_snapshot += 1;
        let offer = Offer::Refused(Refusal::UnknownSnapshot);
        out.send(
            to,
            Message::SnapshotOffer(SnapshotOffer {
                nonce: 0,
                snapshot_id,
                commit_max,
                offer,
            }),
        );
    }

    fn on_chunks(
        &mut self,
        from: u8,
        r: wire::RequestChunks,
        state: ServingState,
        out: &mut Outbox,
    ) {
        self.counters.chunk_requests += 1;
        let Some(served) = self.open.get_mut(&r.snapshot_id).filter(|s| s.peer == from) else {
            return self.unknown(from, r.snapshot_id, state.commit_max, out);
        };
        served.used_tick = self.now_tick;
        let room = self.cfg.reads_keys_max - served.reading_keys;
        let m = &served.manifest;
        let in_manifest = |k: &ChunkKey| {
            m.artifacts
                .get(k.artifact as usize)
                .is_some_and(|a| (k.chunk as usize) < a.chunk_checksums.len())
        };
        let asked = r.keys.len();
        let keys: Vec<ChunkKey> = r.keys.into_iter().filter(in_manifest).take(room).collect();
        self.counters.keys_refused += (asked - keys.len()) as u64;
        if keys.is_empty() {
            return;
        }
        served.reading_keys += keys.len();
        let snapshot_id = r.snapshot_id;
        let op = TransferOp::ReadChunks {
            snapshot_id,
            keys: keys.clone(),
        };
        let pending = Pending::Read {
            peer: from,
            snapshot_id,
            keys,
        };
        self.io(op, pending, out);
    }

    fn release(&mut self, snapshot_id: u64, out: &mut Outbox) {
        if self.open.remove(&snapshot_id).is_some() {
            self.io(
                TransferOp::ReleaseSnapshot { snapshot_id },
                Pending::Release,
                out,
            );
        }
    }

    fn on_tick(&mut self, out: &mut Outbox) {
        self.now_tick += 1;
        let expired: Vec<u64> = self
            .open
            .iter()
            .filter(|(_, s)| self.now_tick - s.used_tick > self.cfg.lease_ticks)
            .map(|(&id, _)| id)
            .collect();
        self.counters.expired += expired.len() as u64;
        for id in expired {
            self.release(id, out);
        }
    }

    fn on_io_done(&mut self, id: IoId, result: Result<IoOutcome, Fault>, out: &mut Outbox) {
        let Some(pending) = self.pending.remove(&id) else {
            return;
        };
        match (pending, result) {
            (
                Pending::Open {
                    peer,
                    nonce,
                    commit_max,
                },
                result,
            ) => self.opened(peer, nonce, commit_max, result, out),
            (
                Pending::Read {
                    peer,
                    snapshot_id,
                    keys,
                },
                result,
            ) => self.read_done(peer, snapshot_id, keys, result, out),
            (Pending::Release, _) => {}
        }
    }

    fn opened(
        &mut self,
        peer: u8,
        nonce: u64,
        commit_max: u64,
        result: Result<IoOutcome, Fault>,
        out: &mut Outbox,
    ) {
        let manifest = match result {
            Ok(IoOutcome::Snapshot(m)) => m,
            Ok(_) => return self.refuse(peer, nonce, commit_max, Refusal::Unavailable, out),
            Err(Fault {
                kind: FaultKind::Transient,
                ..
            }) => return self.refuse(peer, nonce, commit_max, Refusal::Busy, out),
            Err(_) => return self.refuse(peer, nonce, commit_max, Refusal::Unavailable, out),
        };
        let snapshot_id = manifest.snapshot_id;
        self.counters.offers += 1;
        let commit_max = commit_max.max(manifest.commit);
        let offer = SnapshotOffer {
            nonce,
            snapshot_id,
            commit_max,
            offer: Offer::Snapshot((*manifest).clone()),
        };
        self.open.insert(
            snapshot_id,
            Served {
                peer,
                nonce,
                commit_max,
                manifest,
                used_tick: self.now_tick,
                reading_keys: 0,
            },
        );
        out.send(peer, Message::SnapshotOffer(offer));
    }

    fn read_done(
        &mut self,
        peer: u8,
        snapshot_id: u64,
        keys: Vec<ChunkKey>,
        result: Result<IoOutcome, Fault>,
        out: &mut Outbox,
    ) {
        let commit_max = self.open.get(&snapshot_id).map_or(0, |s| s.manifest.commit);
        if let Some(served) = self.open.get_mut(&snapshot_id) {
            served.reading_keys -= keys.len();
        }
        match result {
            Ok(IoOutcome::Chunks(bufs)) if bufs.len() == keys.len() => {
                for (key, data) in keys.into_iter().zip(bufs) {
                    self.counters.chunks_served += 1;
                    self.counters.bytes_served += data.len() as u64;
                    let msg = Message::Chunk {
                        snapshot_id,
                        key,
                        data,
                    };
                    out.send(peer, msg);
                }
            }
            Err(Fault {
                kind: FaultKind::Gone,
                ..
            }) => {
                self.release(snapshot_id, out);
                self.unknown(peer, snapshot_id, commit_max, out);
            }
            // A failed read: the receiver asks again after its timeout.
            _ => out.event(Event::Dropped {
                what: "read_chunks",
                reason: "the read failed",
            }),
        }
    }
}
