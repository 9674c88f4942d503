//! One partition on its owning shard: its store and its replica.
//!
//! Replicated (a [`Replication`]: a topic of a cluster), the replica is one
//! of R: created fresh it starts in view 0, reopened it restarts
//! Recovering ([`replica_io::recover`]); messages from peers come in
//! through [`Partition::deliver`] (checked: group id, sender, limits) and
//! go out through [`Partition::take_sends`]; a produce is answered at
//! commit, a backup refuses it naming the primary (`not_primary`), and
//! reads stop at the commit ([`Partition::high_watermark`]). The store
//! then keeps an uncommitted headroom, so rolls seal committed ops only.
//!
//! Alone, the replica ([`crate::vsr::Replica`], a cluster of one, booted by
//! [`replica_io::recover_lone`]) sequences: [`Partition::produce`] checks
//! what it can from the header, stamps the partition id and hands the
//! batch to the replica, which stamps offset, op, view and chain link and
//! emits an append and a flush. This host runs them: appends (and any other
//! storage op) through the executor shared with the simulator
//! ([`replica_io`]); a flush does not run on its own but waits for the
//! partition's next group commit, whose completion
//! ([`Partition::complete_flush`]) answers every flush it made durable, so
//! many appends in one turn share one fdatasync. The replica's replies
//! come back from [`Partition::take_replies`], keyed by the token
//! `produce` returned.
//!
//! Flushes run asynchronously on the shard's storage ring: at most one per
//! partition is in flight ([`Partition::prepare_flush`] until
//! [`Partition::complete_flush`]). Appends may go on meanwhile as long as
//! they cannot make the store flush on its own (a full write buffer or a
//! segment roll flushes synchronously, which would be a second flush of the
//! same bytes): [`Partition::append_must_wait`] tells the shard to hold such
//! an append until the flush completed.

mod transfer_host;
#[cfg(test)]
mod transfer_tests;

use std::path::{Path, PathBuf};

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;

use ringlog_protocol::replication::{self as wire, ReplicationLimits};
use ringlog_protocol::wire::{ErrorCode, FetchReply};
use ringlog_protocol::{encode_header, BatchHeader, HEADER_LEN};
use ringlog_storage::io::{Completion, IoBackend, Op, Sqe, BLOCK_SIZE};
use ringlog_storage::journal::Journal;
use ringlog_storage::store::{PartitionStore, StoreConfig, StoreError, StorePool};
use ringlog_storage::superblock;

use crate::ops::{LatencyCounts, OpError, PartitionStatus};
use crate::peer_buf::{Outgoing, PeerPayload, SELF_CHECKED_COVERED_BYTES};
use crate::replica_io::{self, AppendFailure};
use crate::transfer::io::Installs;
use crate::transfer::{ChunkData, Message as TransferMessage};
use crate::vsr::{
    AppendError, Appended, Body, ClientBatch, Config as ReplicaConfig, Event, Input, IoFailure,
    IoId, IoOutcome, Message, Outbox, Output, Replica, Status as ReplicaStatus, StorageOp, Token,
    Trigger,
};
pub use transfer_host::{TransferCounters, TransferHost, TransferProgress};

/// A replicated partition's place in its replica group (absent: a cluster
/// of one).
#[derive(Clone, Debug)]
pub struct Replication {
    /// The node id of each replica, by replica index (ascending node ids).
    pub nodes: Vec<u32>,
    /// This node's replica index.
    pub replica: u8,
    /// Stamped in every message this replica sends and required of every
    /// message it steps (`placement::group_id`).
    pub group_id: u128,
    /// Peer addresses, to name the primary in a not-primary refusal.
    pub addrs: BTreeMap<u32, SocketAddr>,
    /// Client addresses as the peer transport learned them, so a
    /// not-primary refusal names where to produce (`primary_addr=`).
    pub client_addrs: ClientAddrs,
    /// This node lost its disk (`ServerConfig::recover`): a store created
    /// here, or one created here that never held anything, boots wiped
    /// ([`Replica::wiped`]) instead of as a fresh view-0 member, which
    /// could vote with an empty log and lose committed ops.
    pub boot_wiped: bool,
}

/// Where a node serves clients, if this node knows (the peer Hello).
#[derive(Clone, Default)]
pub struct ClientAddrs(Option<std::sync::Arc<ClientAddrOf>>);

type ClientAddrOf = dyn Fn(u32) -> Option<SocketAddr> + Send + Sync;

impl ClientAddrs {
    pub fn new(of: impl Fn(u32) -> Option<SocketAddr> + Send + Sync + 'static) -> ClientAddrs {
        ClientAddrs(Some(std::sync::Arc::new(of)))
    }

    pub fn of(&self, node: u32) -> Option<SocketAddr> {
        self.0.as_ref().and_then(|f| f(node))
    }
}

impl std::fmt::Debug for ClientAddrs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "ClientAddrs(..)"
        } else {
            "ClientAddrs(none)"
        })
    }
}

impl Replication {
    /// Replica settings of a replicated partition: the defaults, with the
    /// primary draining its pipeline every third of the store's
    /// uncommitted headroom (see `Config::drain_every_bytes`).
    fn replica_config(&self, id: u32, store: &StoreConfig) -> ReplicaConfig {
        let mut cfg = ReplicaConfig::new(id, self.nodes.len() as u8, self.replica);
        cfg.drain_every_bytes = store.uncommitted_headroom_bytes.map(|h| h / 3);
        // A restarted replica asks for the view with backoff (10, 20, 40
        // ticks, plus jitter): after 3 unanswered rounds (1.4-2.8 s at the
        // shard's 20 ms tick) it joins a view change itself. The default 8
        // rounds take 16-32 s, which a cluster restarted whole (nobody
        // Normal to answer) would wait out.
        cfg.recovering_attempts_max = RECOVERING_ATTEMPTS_MAX;
        cfg
    }

    /// The store settings of a replicated partition: rolls seal only
    /// committed ops, so a view change's cut never reaches a sealed
    /// segment (`StoreConfig::uncommitted_headroom_bytes`); a quarter of
    /// the segment, far above a pipeline of the largest batches at the
    /// default segment size.
    pub fn store_config(mut config: StoreConfig) -> StoreConfig {
        config.uncommitted_headroom_bytes = Some(config.segment_size_bytes / 4);
        config
    }

    /// The node id of replica `index`.
    fn node(&self, index: u8) -> Option<u32> {
        self.nodes.get(usize::from(index)).copied()
    }
}

/// Why a peer's frame was not stepped (each is counted by the shard).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PeerDrop {
    #[error("partition is not replicated here")]
    NotReplicated,
    #[error("partition is unavailable")]
    Unavailable,
    #[error("undecodable message: {0}")]
    Undecodable(String),
    /// Another cluster, topic, partition index or replica count: the nodes
    /// disagree about this partition (see `placement::group_id`).
    #[error("message of replica group {got:#x}, this partition is group {want:#x}")]
    WrongGroup { got: u128, want: u128 },
    #[error("message claims replica {claimed} but came from node {node}")]
    WrongSender { node: u32, claimed: u8 },
    /// A command neither the replica nor the transfer machines take.
    #[error("message of unknown command {0:?}")]
    Unrouted(wire::Command),
}

/// Unanswered RequestStartView rounds before a restarted replica joins a
/// view change (see `Replication::replica_config`).
const RECOVERING_ATTEMPTS_MAX: u32 = 3;

/// Committed ops a restarted replicated partition keeps in its journal
/// (headers read at boot; the rest is read from the segments on repair).
const BOOT_COMMITTED_OPS_KEPT: u64 = 64;

enum State {
    Open(Box<Hosted>),
    /// Could not be opened or created; every request gets an error.
    Unavailable(String),
}

/// A produce's outcome, for the token [`Partition::produce`] returned.
pub type Reply = (Token, Result<Appended, OpError>);

/// An open partition: its store and the replica that sequences into it.
struct Hosted {
    store: PartitionStore,
    replica: Replica,
    /// Reused by every step (no allocation per append).
    outbox: Outbox,
    /// Inputs produced while running outputs (storage completions), fed
    /// back in order.
    inputs: VecDeque<Input>,
    /// The replica's flushes waiting for a group commit: (id, the last op
    /// appended when it was emitted), ops ascending. At most one per
    /// uncommitted op, so bounded by the replica's pipeline.
    flushes: VecDeque<(IoId, u64)>,
    /// Replies not yet taken by the shard; at most one per token given out.
    replies: Vec<Reply>,
    next_token: Token,
    /// Present for a replicated partition.
    repl: Option<Replication>,
    /// Messages the replica sent since the shard last took them
    /// ([`Partition::take_sends`], after every turn, tick and completion
    /// that stepped it): bounded by what those steps emit, O(pipeline x
    /// replicas) each.
    sends: Vec<(u8, Message)>,
    /// View changes the replica entered, and repair requests it sent,
    /// since it booted here (`ctl partitions`, metrics).
    view_changes: u64,
    repairs: u64,
    /// Prepare-to-commit latency of the ops this replica acknowledged as
    /// primary, timed by the shard ([`Partition::record_commit_latency`]).
    commit_latency: LatencyCounts,
    /// State transfer beside the replica (replicated partitions only).
    xfer: Option<Box<TransferHost>>,
    /// The purge this replica submitted ([`Partition::purge_to`]) until
    /// the replica answered it (every client token is answered: at
    /// commit, or when the replica stops being primary).
    purge_token: Option<Token>,
}

/// Where [`Partition::purge_to`] stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PurgeState {
    /// The store applied a committed purge reaching the generation.
    Done,
    /// Not yet (submitted, or waiting for the commit to reach here).
    Waiting,
}

pub struct Partition {
    pub topic: String,
    pub index: u32,
    pub id: u32,
    dir: PathBuf,
    state: State,
    /// The active segment's end position the flush in flight covers, if one
    /// is in flight.
    flush_end: Option<u64>,
    /// The durable end seen at the last idle check: unchanged for a whole
    /// tick means idle, and an idle partition's frontier record is brought
    /// up to its durable end (see [`Partition::prepare_checkpoint`]).
    idle_seen: Option<u64>,
    /// The store was replaced since the shard last asked
    /// ([`Partition::take_replaced`]): the old replica's produces in
    /// flight get no answer from the new one.
    replaced: bool,
}

impl Partition {
    /// Opens the partition in `dir`; with `create`, a missing (or, for a
    /// topic still being created, unreadable) directory is created afresh.
    /// Failures leave the partition Unavailable, reported by every request.
    #[allow(clippy::too_many_arguments)]
    pub fn open(
        io: &mut impl IoBackend,
        pool: &StorePool,
        dir: &Path,
        topic: &str,
        index: u32,
        id: u32,
        config: StoreConfig,
        create: bool,
    ) -> Partition {
        Self::open_replicated(io, pool, dir, topic, index, id, config, create, None)
    }

    /// [`Partition::open`] of a partition replicated by `repl` (None: a
    /// cluster of one). A store created here starts a fresh group member
    /// (view 0, Normal); one that existed restarts Recovering and learns
    /// the view from its peers before it acts.
    #[allow(clippy::too_many_arguments)]
    pub fn open_replicated(
        io: &mut impl IoBackend,
        pool: &StorePool,
        dir: &Path,
        topic: &str,
        index: u32,
        id: u32,
        config: StoreConfig,
        create: bool,
        repl: Option<Replication>,
    ) -> Partition {
        let config = match &repl {
            Some(_) => Replication::store_config(config),
            None => config,
        };
        let opened = open_or_create(io, pool, dir, id, config, create, repl.is_some())
            .and_then(|(store, opened)| Hosted::boot(io, store, id, repl, opened));
        let state = match opened {
            Ok(hosted) => State::Open(Box::new(hosted)),
            Err(message) => {
                tracing::error!(topic, index, partition_id = id, %message, "partition unavailable");
                State::Unavailable(message)
            }
        };
        Partition {
            topic: topic.to_string(),
            index,
            id,
            dir: dir.to_path_buf(),
            state,
            flush_end: None,
            idle_seen: None,
            replaced: false,
        }
    }

    /// A partition that cannot be hosted here (`why`): every request gets
    /// PartitionUnavailable with the reason.
    pub fn unavailable(dir: &Path, topic: &str, index: u32, id: u32, why: String) -> Partition {
        tracing::error!(topic, index, partition_id = id, %why, "partition unavailable");
        Partition {
            topic: topic.to_string(),
            index,
            id,
            dir: dir.to_path_buf(),
            state: State::Unavailable(why),
            flush_end: None,
            idle_seen: None,
            replaced: false,
        }
    }

    /// Whether a flush of this partition is in flight.
    pub fn flush_in_flight(&self) -> bool {
        self.flush_end.is_some()
    }

    /// Queues this partition's flush (one write, one fdatasync) onto `sqes`
    /// unless one is in flight already or nothing awaits flushing. Returns
    /// how many entries it queued; their completions go to
    /// [`Partition::complete_flush`], in order. Fails only when fenced (the
    /// replica's flushes waiting for it then fail too: see `take_replies`).
    pub fn prepare_flush(
        &mut self,
        io: &mut impl IoBackend,
        sqes: &mut Vec<Sqe>,
    ) -> Result<usize, StoreError> {
        self.prepare_flush_via(io, sqes, None)
    }

    /// [`Partition::prepare_flush`] through the shard's journal: small
    /// bytes become a journal record and the segment write goes without an
    /// fdatasync (see `PartitionStore::prepare_flush_journaled`); the
    /// completions then need [`Journal::durable_completion`] appended.
    pub fn prepare_flush_journaled(
        &mut self,
        io: &mut impl IoBackend,
        sqes: &mut Vec<Sqe>,
        journal: &mut Journal,
    ) -> Result<usize, StoreError> {
        self.prepare_flush_via(io, sqes, Some(journal))
    }

    /// Bytes accepted but not yet in a flush (0 while one is in flight or
    /// the partition is unavailable).
    pub fn unflushed_bytes(&self) -> u64 {
        match (&self.state, self.flush_end) {
            (State::Open(h), None) => h.store.unflushed_bytes(),
            _ => 0,
        }
    }

    /// The fdatasync of the active segment a journal checkpoint needs; None
    /// when unavailable or fenced (its journal records must stay).
    pub fn segment_sync_sqe(&self) -> Option<Sqe> {
        match &self.state {
            State::Open(h) => h.store.segment_sync_sqe(),
            State::Unavailable(_) => None,
        }
    }

    /// A journal checkpoint's fdatasync of this segment failed: fail-stop.
    pub fn fence_segment_sync(&mut self, cause: &str) {
        if let State::Open(h) = &mut self.state {
            let e = h.store.fence_segment_sync(cause);
            tracing::error!(partition_id = self.id, error = %e, "partition fenced");
        }
    }

    fn prepare_flush_via(
        &mut self,
        io: &mut impl IoBackend,
        sqes: &mut Vec<Sqe>,
        journal: Option<&mut Journal>,
    ) -> Result<usize, StoreError> {
        if self.flush_end.is_some() {
            return Ok(0);
        }
        let State::Open(h) = &mut self.state else {
            return Ok(0);
        };
        let end = active_end(&h.store);
        let prepared = match journal {
            Some(j) => h.store.prepare_flush_journaled(sqes, j),
            None => h.store.prepare_flush(sqes),
        };
        match prepared {
            Ok(n) if n > 0 => self.flush_end = Some(end),
            // Nothing to write: whatever the replica waits for is durable
            // (a synchronous flush inside an append, say); or fenced.
            _ => h.answer_flushes(io),
        }
        prepared
    }

    /// Queues a frontier checkpoint (record write plus fdatasync) if the
    /// partition was idle since the previous call and its durable frontier
    /// record lags its durable end; the completions go to
    /// [`Partition::complete_flush`] like a flush's. Called once per tick:
    /// the record of an idle partition catches up within about two ticks,
    /// and a busy one never pays for it (its next flush writes the record).
    pub fn prepare_checkpoint(&mut self, sqes: &mut Vec<Sqe>) -> Result<usize, StoreError> {
        if self.flush_end.is_some() {
            return Ok(0);
        }
        let State::Open(h) = &mut self.state else {
            return Ok(0);
        };
        let store = &mut h.store;
        if store.fenced().is_some() || store.frontier_lag_bytes() == 0 {
            return Ok(0);
        }
        let durable = store.durable().next_offset;
        let idle = store.chain().next_offset == durable && self.idle_seen == Some(durable);
        self.idle_seen = Some(durable);
        if !idle {
            return Ok(0);
        }
        let end = active_end(store);
        let n = store.prepare_checkpoint(sqes)?;
        if n > 0 {
            self.flush_end = Some(end);
        }
        Ok(n)
    }

    /// Takes back the completions of the flush in flight and answers the
    /// replica's flushes it made durable (a group commit answers every
    /// flush of the appends it covered). A failure fences the store
    /// (fail-stop), fails the replica's waiting flushes, which fences the
    /// replica, and is returned.
    pub fn complete_flush(
        &mut self,
        io: &mut impl IoBackend,
        completions: impl IntoIterator<Item = Completion>,
    ) -> Result<(), StoreError> {
        let was = self.flush_end.take();
        debug_assert!(was.is_some(), "complete_flush without a flush in flight");
        match &mut self.state {
            State::Open(h) => {
                let done = h.store.complete_flush(completions);
                h.answer_flushes(io);
                done
            }
            State::Unavailable(_) => Ok(()),
        }
    }

    /// Whether appending a batch of `len` bytes now must wait for the flush
    /// in flight: the store's own rule ([`PartitionStore::append_waits_for_flush`]),
    /// so the shard holds exactly the appends the store would refuse.
    pub fn append_must_wait(&self, len: usize) -> bool {
        match &self.state {
            State::Open(h) => h.store.append_waits_for_flush(len),
            State::Unavailable(_) => false,
        }
    }

    /// Whether a replication message may be delivered while this
    /// partition's flush is in flight rather than wait for it: a Prepare,
    /// PrepareOk or Commit the replica can step beside a flush
    /// ([`Replica::steps_beside_flush`]), a Prepare whose batch the store
    /// takes without flushing on its own, and no transfer running. Reads
    /// only the message header (checked); delivery decodes it all.
    pub fn peer_message_beside_flush(&self, payload: &[u8]) -> bool {
        let State::Open(h) = &self.state else {
            return false;
        };
        if h.repl.is_none()
            || h.xfer
                .as_ref()
                .is_some_and(|x| x.needs_tick() || x.is_frozen())
        {
            return false;
        }
        let Ok(header) = wire::Header::decode(payload, &ReplicationLimits::default()) else {
            return false;
        };
        let fits = match header.command {
            wire::Command::Prepare => !h.store.append_waits_for_flush(header.body_len as usize),
            wire::Command::PrepareOk | wire::Command::Commit => true,
            _ => false,
        };
        fits && h.replica.steps_beside_flush(header.envelope.view)
    }

    /// Whether the next segment should be prepared now, in the background
    /// (see [`PartitionStore::spare_due`]).
    pub fn spare_due(&self) -> bool {
        matches!(&self.state, State::Open(h) if h.store.spare_due())
    }

    /// Whether an op preparing the next segment is in flight (at most one).
    pub fn spare_in_flight(&self) -> bool {
        matches!(&self.state, State::Open(h) if h.store.spare_in_flight())
    }

    /// The first batch preparing the next segment, if one is due; its
    /// completions go to [`Partition::complete_spare`].
    pub fn prepare_spare(&mut self) -> Option<Vec<Sqe>> {
        match &mut self.state {
            State::Open(h) if h.store.spare_due() => Some(h.store.prepare_spare()),
            _ => None,
        }
    }

    /// Applies a spare batch's completions; returns the next batch to
    /// submit, if any. A failure only drops the spare (the roll then
    /// provisions its segment itself) and is logged here.
    pub fn complete_spare(
        &mut self,
        io: &mut impl IoBackend,
        completions: Vec<Completion>,
    ) -> Option<Vec<Sqe>> {
        let State::Open(h) = &mut self.state else {
            close_opened(io, completions);
            return None;
        };
        if !h.store.spare_in_flight() {
            tracing::warn!(
                partition_id = self.id,
                "spare completion with none in flight"
            );
            close_opened(io, completions);
            return None;
        }
        match h.store.complete_spare(io, completions) {
            Ok(next) => next,
            Err(e) => {
                tracing::warn!(partition_id = self.id, error = %e, "next segment not prepared ahead");
                None
            }
        }
    }

    /// The active segment's next reservation step, if one is due ahead of
    /// the appends; its completion goes to [`Partition::complete_reserve_ahead`].
    pub fn prepare_reserve_ahead(&mut self) -> Option<Vec<Sqe>> {
        match &mut self.state {
            State::Open(h) if h.store.reserve_ahead_due() => Some(h.store.prepare_reserve_ahead()),
            _ => None,
        }
    }

    /// Applies a reservation ahead; a failure changes nothing (an append
    /// needing the room reserves it itself) and is logged here.
    pub fn complete_reserve_ahead(&mut self, completions: Vec<Completion>) {
        let State::Open(h) = &mut self.state else {
            return;
        };
        if !h.store.reserve_ahead_in_flight() {
            tracing::warn!(
                partition_id = self.id,
                "reservation completion with none in flight"
            );
            return;
        }
        if let Err(e) = h.store.complete_reserve_ahead(completions) {
            tracing::warn!(partition_id = self.id, error = %e, "segment not reserved ahead");
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn store(&self) -> Result<&PartitionStore, OpError> {
        match &self.state {
            State::Open(h) => Ok(&h.store),
            State::Unavailable(m) => Err(OpError::new(ErrorCode::PartitionUnavailable, m.clone())),
        }
    }

    fn store_or_err(&mut self) -> Result<&mut PartitionStore, OpError> {
        Ok(&mut self.hosted()?.store)
    }

    fn hosted(&mut self) -> Result<&mut Hosted, OpError> {
        match &mut self.state {
            State::Open(h) => Ok(h),
            State::Unavailable(m) => Err(OpError::new(ErrorCode::PartitionUnavailable, m.clone())),
        }
    }

    /// Hands a producer's batch to the replica, which sequences it (offset,
    /// op, view, chain link) and appends it; returns the token its outcome
    /// comes back with from [`Partition::take_replies`], once the group
    /// commit made it durable. Checked here, from the header alone: one
    /// batch exactly, within the size limit; the partition id is stamped
    /// here. The replica verifies the body (checksum, records) once.
    pub fn produce(
        &mut self,
        io: &mut impl IoBackend,
        mut batch: ClientBatch,
    ) -> Result<Token, OpError> {
        let id = self.id;
        let h = self.hosted()?;
        let max = h.store.config().batch_bytes_max();
        let invalid = |e: String| OpError::new(ErrorCode::InvalidBatch, e);
        let len = batch.as_ref().len();
        let mut header = BatchHeader::decode(batch.as_ref()).map_err(|e| invalid(e.to_string()))?;
        if header.total_len() < len {
            let extra = len - header.total_len();
            return Err(invalid(format!(
                "{extra} bytes after the batch (one batch per produce)"
            )));
        }
        if len > max {
            return Err(OpError::new(
                ErrorCode::BatchTooLarge,
                format!("batch of {len} bytes exceeds {max}"),
            ));
        }
        if header.partition_id != id {
            header.partition_id = id;
            let head = batch
                .as_mut()
                .first_chunk_mut::<HEADER_LEN>()
                .ok_or_else(|| invalid("truncated batch".into()))?;
            encode_header(&header, head);
        }
        let token = h.next_token;
        h.next_token += 1;
        h.run(io, Input::ClientAppend { token, batch });
        h.answer_flushes(io);
        // Refused at once (invalid body, busy, fenced): the caller answers.
        let at_once = h.replies.iter().rposition(|(t, _)| *t == token);
        match at_once.map(|i| h.replies.swap_remove(i)) {
            Some((_, Err(e))) => Err(e),
            Some(ok) => {
                h.replies.push(ok);
                Ok(token)
            }
            None => Ok(token),
        }
    }

    /// The outcomes of produces since the last call, by token.
    pub fn take_replies(&mut self) -> impl Iterator<Item = Reply> + '_ {
        let replies = match &mut self.state {
            State::Open(h) => {
                h.take_purge_reply();
                Some(h.replies.drain(..))
            }
            State::Unavailable(_) => None,
        };
        replies.into_iter().flatten()
    }

    /// Whether the replica has a timeout armed ([`Partition::tick`] can do
    /// something). A cluster of one that is Normal never has.
    pub fn needs_tick(&self) -> bool {
        match &self.state {
            State::Open(h) => {
                h.replica.needs_tick()
                    || h.xfer.as_ref().is_some_and(|x| x.needs_tick())
                    || (h.xfer.is_some() && h.store.corruption_seen().is_some())
            }
            State::Unavailable(_) => false,
        }
    }

    /// One tick of the replica's clock and of its transfer machines
    /// (`installs`: the shard's; `now_ms` for snapshot leases).
    pub fn tick(&mut self, io: &mut impl IoBackend, installs: &mut Installs, now_ms: u64) {
        debug_assert!(self.flush_end.is_none(), "ticked with a flush in flight");
        if self.corrupt_store_replaceable() {
            self.replace_corrupt_store(io);
        }
        if let State::Open(h) = &mut self.state {
            h.run(io, Input::Tick);
            h.answer_flushes(io);
            h.transfer_check_needed(io, installs, now_ms);
            h.transfer_tick(io, installs, now_ms);
        }
    }

    /// Whether the store of this replicated partition read a sealed
    /// segment that fails verification, and nothing of it is in flight
    /// (a flush, spare, reservation or transfer I/O) or being installed:
    /// an install replaces the bad generation itself.
    fn corrupt_store_replaceable(&self) -> bool {
        let State::Open(h) = &self.state else {
            return false;
        };
        let Some(x) = h.xfer.as_ref() else {
            return false; // a cluster of one has no peer to copy from
        };
        h.store.corruption_seen().is_some()
            && self.flush_end.is_none()
            && !h.store.spare_in_flight()
            && !h.store.reserve_ahead_in_flight()
            && x.io_in_flight().0 == 0
            && x.progress().is_none()
    }

    /// Sets the corrupt store aside and boots the replica wiped on an empty
    /// one, which installs a good copy from a peer
    /// (`Trigger::CorruptSegment`), as a corrupt store found at open does:
    /// every sealed op is committed, so a quorum of peers holds it. Replies
    /// the old replica gave are kept; its produces still in flight are
    /// failed by the shard ([`Partition::take_replaced`]).
    fn replace_corrupt_store(&mut self, io: &mut impl IoBackend) {
        let placeholder = State::Unavailable("replacing a corrupt store".into());
        let State::Open(old) = std::mem::replace(&mut self.state, placeholder) else {
            unreachable!("checked by corrupt_store_replaceable");
        };
        let Hosted {
            store,
            repl,
            replies,
            next_token,
            ..
        } = *old;
        let id = self.id;
        self.state = match Hosted::boot_replacing_corrupt(io, store, id, repl) {
            Ok(mut h) => {
                h.replies = replies;
                h.next_token = next_token;
                State::Open(Box::new(h))
            }
            Err(message) => {
                tracing::error!(partition_id = id, %message, "partition unavailable");
                State::Unavailable(message)
            }
        };
        self.idle_seen = None;
        self.replaced = true;
    }

    /// Whether the store was replaced since the last call: the produces
    /// the shard still waits on were the old replica's, and their outcome
    /// is unknown (they may commit in the group without this replica).
    pub fn take_replaced(&mut self) -> bool {
        std::mem::take(&mut self.replaced)
    }

    /// Batches of this partition's transfer I/O the shard reaped (those
    /// `installs` names it the owner of): answered to the transfer
    /// machines; an install's begin, commit or abort they lead to waits
    /// while a flush or spare of the partition is in flight.
    pub fn transfer_reaped(
        &mut self,
        io: &mut impl IoBackend,
        installs: &mut Installs,
        now_ms: u64,
        reaped: crate::transfer::io::Reaped,
    ) {
        let quiet = !self.flush_in_flight() && !self.spare_in_flight();
        match &mut self.state {
            State::Open(h) => h.transfer_reaped(io, installs, now_ms, reaped, quiet),
            State::Unavailable(_) => {
                for reaped in reaped {
                    installs.forget(io, reaped);
                }
            }
        }
    }

    /// The partition's transfer machines (replicated partitions only).
    pub fn transfer(&self) -> Option<&TransferHost> {
        match &self.state {
            State::Open(h) => h.xfer.as_deref(),
            State::Unavailable(_) => None,
        }
    }

    /// The replica, if open (its role, for the metadata group's host).
    pub fn replica(&self) -> Option<&Replica> {
        match &self.state {
            State::Open(h) => Some(&h.replica),
            State::Unavailable(_) => None,
        }
    }

    pub fn is_replicated(&self) -> bool {
        matches!(&self.state, State::Open(h) if h.repl.is_some())
    }

    /// Records one acknowledged op's latency from its client append (its
    /// Prepare goes out in that step, or when the pipeline has room) to
    /// its commit, as the host's clock read them; the replica has no clock.
    pub fn record_commit_latency(&mut self, us: u64) {
        if let State::Open(h) = &mut self.state {
            debug_assert!(h.repl.is_some(), "only a replicated op has a commit");
            h.commit_latency.record(us);
        }
    }

    /// Steps the replica (or, for a state transfer command, its transfer
    /// machines, see `transfer::route`) with a message from node `from`:
    /// one replication message (`ringlog_protocol::replication`), decoded
    /// within the protocol's limits, of this partition's replica group,
    /// claiming the sender's own replica index. The caller holds it while a
    /// flush is in flight: a message may make the replica cut or persist,
    /// which the store runs synchronously, one flush at a time. A frame
    /// that does not decode while a transfer runs is charged to the
    /// sender's replica by the receiver. Copies `payload`: see
    /// [`Partition::deliver_payload`].
    pub fn deliver(
        &mut self,
        io: &mut impl IoBackend,
        installs: &mut Installs,
        now_ms: u64,
        from: u32,
        payload: &[u8],
    ) -> Result<(), PeerDrop> {
        let payload = PeerPayload::from(payload.to_vec());
        self.deliver_payload(io, installs, now_ms, from, payload)
    }

    /// [`Partition::deliver`] of a payload still in the frame it arrived
    /// in: a transfer Chunk's data stays there until it is staged.
    pub fn deliver_payload(
        &mut self,
        io: &mut impl IoBackend,
        installs: &mut Installs,
        now_ms: u64,
        from: u32,
        payload: PeerPayload,
    ) -> Result<(), PeerDrop> {
        debug_assert!(
            self.flush_end.is_none() || self.peer_message_beside_flush(&payload),
            "a peer message that must wait for the flush in flight"
        );
        let State::Open(h) = &mut self.state else {
            return Err(PeerDrop::Unavailable);
        };
        let Some(repl) = &h.repl else {
            return Err(PeerDrop::NotReplicated);
        };
        let decoded = match wire::Message::decode(&payload, &ReplicationLimits::default()) {
            Ok(d) => d,
            Err(e) => {
                if let Some(index) = repl.nodes.iter().position(|&n| n == from) {
                    h.transfer_undecodable(io, installs, now_ms, index as u8);
                }
                return Err(PeerDrop::Undecodable(e.to_string()));
            }
        };
        let env = decoded.envelope;
        if env.cluster_id != repl.group_id || env.partition_id != self.id {
            return Err(PeerDrop::WrongGroup {
                got: env.cluster_id,
                want: repl.group_id,
            });
        }
        if repl.node(env.replica) != Some(from) || env.replica == repl.replica {
            return Err(PeerDrop::WrongSender {
                node: from,
                claimed: env.replica,
            });
        }
        if let wire::Body::Chunk(c) = &decoded.body {
            // Where the data lies in the payload (both borrow one buffer).
            let offset = c.data.as_ptr() as usize - payload.as_ptr() as usize;
            let (snapshot_id, key, len) = (c.snapshot_id, c.key, c.data.len());
            debug_assert!(offset + len <= payload.len());
            let (body, start) = payload.into_parts();
            let data = ChunkData::in_buffer(body, start + offset..start + offset + len);
            let msg = TransferMessage::Chunk {
                snapshot_id,
                key,
                data,
            };
            h.deliver_transfer(io, installs, now_ms, env.replica, msg);
            return Ok(());
        }
        match crate::transfer::route(&decoded) {
            Some(crate::transfer::Routed::Vsr { from, msg }) => {
                h.run(io, Input::Message { from, msg });
                h.answer_flushes(io);
                h.transfer_check_needed(io, installs, now_ms);
            }
            Some(crate::transfer::Routed::Transfer { from, msg }) => {
                h.deliver_transfer(io, installs, now_ms, from, msg);
            }
            None => return Err(PeerDrop::Unrouted(decoded.command())),
        }
        Ok(())
    }

    /// Encodes the messages the replica sent since the last call, as
    /// (destination node, payload) onto `out`. A message the encoder
    /// refuses (a bug: the replica made it from verified batches) is
    /// logged and dropped; the protocol retransmits.
    pub fn take_sends(&mut self, out: &mut Vec<(u32, Outgoing)>) {
        let id = self.id;
        let State::Open(h) = &mut self.state else {
            return;
        };
        let Some(repl) = &h.repl else {
            return;
        };
        for (to, msg) in h.sends.drain(..) {
            let Some(node) = repl.node(to) else {
                tracing::error!(
                    partition_id = id,
                    to,
                    "message to a replica index out of range"
                );
                continue;
            };
            let mut payload = Outgoing::with_capacity(0);
            let encoded = msg
                .to_wire(repl.group_id, id, repl.replica)
                .map_err(|e| e.to_string())
                .and_then(|m| m.encode(payload.append()).map_err(|e| e.to_string()));
            match encoded {
                Ok(()) => out.push((node, payload)),
                Err(e) => {
                    tracing::error!(partition_id = id, to = node, what = msg.body.name(), error = %e, "replication message not encoded");
                }
            }
        }
        let view = h.store.superblock().vsr.view;
        if let Some(x) = h.xfer.as_mut() {
            for (to, msg) in x.sends.drain(..) {
                if let Some(payload) = encode_transfer(repl, id, view, to, &msg) {
                    out.push(payload);
                }
            }
        }
    }

    /// Where reads end: the durable end; for a replicated partition, the
    /// end of its commit (a backup's durable tail may still be cut by a
    /// view change, and nothing uncommitted is ever served).
    fn readable_end(&self) -> Option<u64> {
        let State::Open(h) = &self.state else {
            return None;
        };
        let durable = h.store.durable().next_offset;
        if h.repl.is_none() {
            return Some(durable);
        }
        let commit = h.replica.commit_next_offset().unwrap_or(0);
        Some(commit.min(durable))
    }
    /// Durable batches from `offset`, in `buf` (a reused reply buffer).
    pub fn fetch(
        &mut self,
        io: &mut impl IoBackend,
        offset: u64,
        max_bytes: u32,
        buf: Vec<u8>,
    ) -> Result<FetchReply, OpError> {
        let index = self.index;
        let end = self.readable_end();
        let store = self.store_or_err()?;
        let end = end.unwrap_or(0);
        let durable = store.durable().next_offset;
        if offset >= end && offset <= durable {
            // Durable here but not committed yet (a replicated partition).
            // The reply keeps the pooled buffer, so it goes back to its pool.
            let mut buf = buf;
            buf.clear();
            return Ok(FetchReply {
                batches: buf,
                ..self.empty_fetch(offset)
            });
        }
        let fetched = store
            .read_into(io, offset, max_bytes as usize, buf)
            .map_err(store_error)?;
        let (mut bytes, mut next_offset) = (fetched.bytes, fetched.next_offset);
        if next_offset > end {
            (bytes, next_offset) = committed_prefix(bytes, end)?;
        }
        Ok(FetchReply {
            partition: index,
            next_offset,
            log_start_offset: store.log_start_offset(),
            high_watermark: end,
            batches: bytes,
        })
    }

    /// Whether the read of a fetch from `offset` was queued ahead and is
    /// still in flight (see `PartitionStore::read_ahead_pending`).
    pub fn read_ahead_pending(&self, offset: u64) -> bool {
        match &self.state {
            State::Open(h) => h.store.read_ahead_pending(offset),
            State::Unavailable(_) => false,
        }
    }

    /// An empty fetch result at the current end (long-poll timeout).
    pub fn empty_fetch(&self, offset: u64) -> FetchReply {
        let (start, hwm) = match &self.state {
            State::Open(h) => (h.store.log_start_offset(), self.readable_end().unwrap_or(0)),
            State::Unavailable(_) => (0, 0),
        };
        FetchReply {
            partition: self.index,
            next_offset: offset,
            log_start_offset: start,
            high_watermark: hwm,
            batches: Vec::new(),
        }
    }

    /// Where in its block the next batch handed to [`Partition::produce`]
    /// will start on disk, unless a roll or a refusal moves it: the store's
    /// end plus the batches the replica queued. None if not open.
    pub fn next_batch_lead_bytes(&self) -> Option<usize> {
        match &self.state {
            State::Open(h) => {
                let queued = h.replica.queued_bytes();
                Some((h.store.batch_lead_bytes() + queued) % BLOCK_SIZE)
            }
            State::Unavailable(_) => None,
        }
    }

    /// Where reads end, if open: the durable end (a replicated partition:
    /// its commit's end).
    pub fn high_watermark(&self) -> Option<u64> {
        self.readable_end()
    }

    /// Drops every stored batch (flushes first). The caller lets a flush in
    /// flight complete first.
    pub fn purge(&mut self, io: &mut impl IoBackend) -> Result<(), OpError> {
        debug_assert!(self.flush_end.is_none(), "purge with a flush in flight");
        let h = self.hosted()?;
        let purged = h.store.purge(io).map_err(store_error);
        // It flushed first: the replica's waiting flushes are answered.
        h.answer_flushes(io);
        purged
    }

    /// Drives this replicated partition's purge to purge generation
    /// `generation` (its topic's in the metadata table): Done once the
    /// store applied a committed purge reaching it. The primary, Normal,
    /// with no purge op in its log or its client queue, submits one
    /// ([`Input::ClientPurge`]); everything else waits for the commit to
    /// reach this replica. Asking again is always safe: at most one purge
    /// op is in flight per partition, so each generation purges once
    /// and records produced after it committed are never dropped.
    pub fn purge_to(
        &mut self,
        io: &mut impl IoBackend,
        generation: u64,
    ) -> Result<PurgeState, OpError> {
        let id = self.id;
        let h = self.hosted()?;
        if h.repl.is_none() {
            return Err(OpError::new(
                ErrorCode::Internal,
                format!("partition {id} is not replicated: purged by the store directly"),
            ));
        }
        h.take_purge_reply();
        let have = h.store.superblock().purge_generation;
        if have >= generation {
            return Ok(PurgeState::Done);
        }
        let r = &h.replica;
        let primary = r.status() == ReplicaStatus::Normal && r.is_primary();
        if !primary || r.purge_pending() || h.purge_token.is_some() {
            return Ok(PurgeState::Waiting);
        }
        let token = h.next_token;
        h.next_token += 1;
        h.purge_token = Some(token);
        tracing::info!(
            partition_id = id,
            have,
            generation,
            "submitting a replicated purge"
        );
        h.run(io, Input::ClientPurge { token });
        h.answer_flushes(io);
        h.take_purge_reply();
        debug_assert!(h.purge_token.is_none() || h.replies.iter().all(|(t, _)| *t != token));
        Ok(PurgeState::Waiting)
    }

    /// Maintenance; skipped while a flush is in flight (next tick).
    pub fn apply_retention(&mut self, io: &mut impl IoBackend, now_ms: u64) {
        if self.flush_end.is_some() {
            return;
        }
        if let State::Open(h) = &mut self.state {
            let s = &mut h.store;
            if s.fenced().is_some() {
                return;
            }
            match s.apply_retention(io, now_ms) {
                Ok(o) if o.segments_removed > 0 => tracing::info!(
                    topic = %self.topic,
                    partition = self.index,
                    segments = o.segments_removed,
                    bytes = o.bytes_removed,
                    "retention removed segments"
                ),
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(topic = %self.topic, partition = self.index, error = %e, "retention failed")
                }
            }
        }
    }

    pub fn status(&self, shard: usize) -> PartitionStatus {
        let mut st = PartitionStatus {
            topic: self.topic.clone(),
            partition: self.index,
            partition_id: self.id,
            shard,
            role: "primary",
            log_start_offset: 0,
            frontier: 0,
            commit: 0,
            sealed_segments: 0,
            size_bytes: 0,
            purge_generation: 0,
            fault: None,
            view: None,
            op: None,
            commit_op: None,
            lag_ops: None,
            view_changes: None,
            repairs: None,
            transfer: None,
            commit_latency: None,
        };
        match &self.state {
            State::Open(h) => {
                let s = &h.store;
                st.log_start_offset = s.log_start_offset();
                st.frontier = s.chain().next_offset;
                st.commit = self.readable_end().unwrap_or(0);
                if h.repl.is_some() {
                    st.role = match h.replica.status() {
                        // Lost its disk: neither votes nor leads until its
                        // log is whole again.
                        _ if h.replica.is_wiped() => "wiped",
                        ReplicaStatus::Normal if h.replica.is_primary() => "primary",
                        ReplicaStatus::Normal => "backup",
                        ReplicaStatus::ViewChange => "view_change",
                        ReplicaStatus::Recovering => "recovering",
                        ReplicaStatus::Fenced => "fenced",
                    };
                    let r = &h.replica;
                    st.view = Some(r.view());
                    st.op = Some(r.op());
                    st.commit_op = Some(r.commit());
                    st.lag_ops = Some(r.commit_max().saturating_sub(r.commit()));
                    st.view_changes = Some(h.view_changes);
                    st.repairs = Some(h.repairs);
                    st.commit_latency = Some(h.commit_latency.clone());
                    st.transfer = h.transfer_status();
                }
                st.sealed_segments = s.sealed_segments().count();
                st.size_bytes = s.size_bytes();
                st.purge_generation = s.superblock().purge_generation;
                st.fault = s.fenced().map(str::to_string);
                if st.fault.is_none() && h.replica.status() == ReplicaStatus::Fenced {
                    st.fault = Some("replica fenced after a storage failure".into());
                }
            }
            State::Unavailable(m) => {
                st.role = "unavailable";
                st.fault = Some(m.clone());
            }
        }
        st
    }

    /// Flushes, checkpoints the superblock and closes the files. The caller
    /// lets a flush in flight complete first.
    pub fn close(self, io: &mut impl IoBackend) -> Result<(), StoreError> {
        debug_assert!(self.flush_end.is_none(), "close with a flush in flight");
        match self.state {
            State::Open(h) => {
                let s = h.store;
                // A fenced store is fail-stop: it writes nothing more (its
                // close only releases the files) and recovers from durable
                // state on restart.
                let fenced = s.fenced().is_some();
                let closed = s.close(io);
                if fenced {
                    Ok(())
                } else {
                    closed
                }
            }
            State::Unavailable(_) => Ok(()),
        }
    }
}

impl Hosted {
    /// The replica of a cluster of one over `store`: Normal at once in its
    /// persisted view, its durable end committed, nothing read.
    fn boot(
        io: &mut impl IoBackend,
        mut store: PartitionStore,
        id: u32,
        repl: Option<Replication>,
        opened: Opened,
    ) -> Result<Self, String> {
        let err = |e: String| format!("replica of partition {id}: {e}");
        let created = opened != Opened::Existing;
        let replica = match &repl {
            None => {
                let rec =
                    replica_io::recover_lone(&mut store, io, 0).map_err(|e| err(e.to_string()))?;
                let cfg = ReplicaConfig::new(id, 1, 0);
                Replica::restart(cfg, u64::from(id), rec.durable, rec.base, &rec.headers)
            }
            Some(r) => {
                let cfg = r.replica_config(id, store.config());
                // Replicas' timeouts jitter apart (seeded, no clock).
                let seed = seed_of(id, r);
                if opened == Opened::ReplacedCorrupt {
                    // Its acks may have been on the lost bytes: wiped, it
                    // never votes, leads or acks until whole again.
                    mark_wiped(io, &mut store).map_err(err)?;
                    Replica::wiped_for(cfg, seed, Trigger::CorruptSegment)
                } else if r.boot_wiped && (created || never_written(&store)) {
                    mark_wiped(io, &mut store).map_err(err)?;
                    Replica::wiped(cfg, seed)
                } else if created {
                    Replica::new(cfg, seed)
                } else {
                    let rec = match replica_io::recover(&mut store, io, BOOT_COMMITTED_OPS_KEPT) {
                        Ok(rec) => rec,
                        // Its recovery read a sealed segment failing
                        // verification (open checks only those it reindexes).
                        Err(_) if store.corruption_seen().is_some() => {
                            return Self::boot_replacing_corrupt(io, store, id, repl);
                        }
                        Err(e) => return Err(err(e.to_string())),
                    };
                    Replica::restart(cfg, seed, rec.durable, rec.base, &rec.headers)
                }
            }
        }
        .map_err(|e| err(e.to_string()))?;
        let chunk_bytes = store.config().transfer_chunk_bytes;
        Ok(Hosted {
            store,
            replica,
            outbox: Outbox::new(),
            inputs: VecDeque::new(),
            flushes: VecDeque::new(),
            replies: Vec::new(),
            next_token: 1,
            xfer: repl
                .as_ref()
                .map(|r| Box::new(TransferHost::new(seed_of(id, r), chunk_bytes))),
            repl,
            sends: Vec::new(),
            view_changes: 0,
            repairs: 0,
            commit_latency: LatencyCounts::default(),
            purge_token: None,
        })
    }

    /// Sets aside `store`, a replicated partition's whose read found a
    /// sealed segment failing verification, and boots the replica wiped on
    /// an empty store in its place (as [`open_or_create`] does for one
    /// found at open): every sealed op is committed, so a quorum of peers
    /// holds it, and the replica installs it (`Trigger::CorruptSegment`).
    fn boot_replacing_corrupt(
        io: &mut impl IoBackend,
        store: PartitionStore,
        id: u32,
        repl: Option<Replication>,
    ) -> Result<Self, String> {
        assert!(repl.is_some(), "a cluster of one has no peer to copy from");
        let why = store.corruption_seen().unwrap_or_default().to_string();
        debug_assert!(!why.is_empty(), "only a store that saw corruption");
        tracing::error!(partition_id = id, cause = %why, "a sealed segment fails verification: the partition's data is set aside and its replica installs a copy from a peer");
        let (config, pool) = (store.config().clone(), store.pool().clone());
        let dir = store.dir().to_path_buf();
        if let Err(e) = store.close(io) {
            tracing::warn!(partition_id = id, error = %e, "closing the corrupt store");
        }
        set_aside_corrupt(io, &dir).map_err(|e| format!("set aside {}: {e}", dir.display()))?;
        let store = PartitionStore::create_in(io, &dir, id, config, pool)
            .map_err(|e| format!("create {}: {e}", dir.display()))?;
        Self::boot(io, store, id, repl, Opened::ReplacedCorrupt)
    }

    /// Takes the replica's answer to the purge it was given, if in: it is
    /// nobody's produce (its outcome shows in the purge generation).
    fn take_purge_reply(&mut self) {
        let Some(token) = self.purge_token else {
            return;
        };
        if let Some(i) = self.replies.iter().position(|(t, _)| *t == token) {
            let (_, result) = self.replies.remove(i);
            self.purge_token = None;
            match result {
                Ok(a) => tracing::info!(next_offset = a.next_offset, "replicated purge committed"),
                Err(e) => tracing::warn!(error = %e, "replicated purge not committed here"),
            }
        }
    }

    /// Steps the replica with `input` and runs what it emits, feeding the
    /// completions of storage ops back in, until it is quiet. Flushes wait
    /// for the group commit ([`Hosted::answer_flushes`]).
    fn run(&mut self, io: &mut impl IoBackend, input: Input) {
        if self.xfer.as_ref().is_some_and(|x| x.freezes(&input)) {
            // An install replaces this replica's log: it takes nothing
            // but completions (see `transfer_host`).
            if let Input::ClientAppend { token, .. } = input {
                let e = OpError::new(
                    ErrorCode::PartitionUnavailable,
                    "the replica is installing a state transfer".to_string(),
                );
                self.replies.push((token, Err(e)));
            }
            return;
        }
        self.inputs.push_back(input);
        self.drive(io);
    }

    fn drive(&mut self, io: &mut impl IoBackend) {
        // Appends the store refused in the last step, in op order.
        let mut refused: Vec<(IoId, u64, OpError)> = Vec::new();
        loop {
            for output in self.outbox.drain() {
                match output {
                    Output::Io {
                        id,
                        op: StorageOp::Flush,
                    } => self.flushes.push_back((id, self.store.chain().last_op)),
                    Output::Io {
                        id,
                        op: StorageOp::Append { op, batch },
                    } => {
                        if let Some((.., first)) = refused.first() {
                            // Behind a refused op: cannot link; refused too.
                            let again = first.clone();
                            refused.push((id, op, again));
                            continue;
                        }
                        let result = replica_io::append_owned(&mut self.store, io, op, batch);
                        match result {
                            Ok(()) => self.inputs.push_back(Input::IoDone {
                                id,
                                result: Ok(IoOutcome::Done),
                            }),
                            Err(AppendFailure::Store { source, .. })
                                if self.store.fenced().is_none() =>
                            {
                                tracing::warn!(
                                    partition_id = self.store.partition_id(),
                                    op,
                                    error = %source,
                                    "the store refused an append"
                                );
                                refused.push((id, op, store_error(source)));
                            }
                            Err(e) => self.inputs.push_back(Input::IoDone {
                                id,
                                result: Err(IoFailure {
                                    reason: e.to_string(),
                                }),
                            }),
                        }
                    }
                    Output::Io { id, op } => {
                        let result = replica_io::execute(&mut self.store, io, &op);
                        self.inputs.push_back(Input::IoDone { id, result });
                    }
                    Output::Reply { token, result } => {
                        let result =
                            result.map_err(|e| client_error(&self.store, self.repl.as_ref(), e));
                        self.replies.push((token, result));
                    }
                    Output::Send { to, msg } if self.repl.is_some() => {
                        if matches!(msg.body, Body::RequestPrepares(_)) {
                            self.repairs += 1;
                        }
                        self.sends.push((to, msg))
                    }
                    Output::Event(event) => {
                        if let Event::StatusChanged {
                            status: ReplicaStatus::ViewChange,
                            ..
                        } = event
                        {
                            self.view_changes += 1;
                        }
                        if let (Some(x), Event::TransferNeeded { trigger, .. }) =
                            (self.xfer.as_mut(), &event)
                        {
                            x.want(*trigger);
                        }
                        replica_io::note_event(&mut self.store, &event);
                        if let Event::Fenced { reason } = &event {
                            // Fail-stop: the operator must see why.
                            tracing::error!(
                                partition_id = self.store.partition_id(),
                                %reason,
                                "replica fenced: the partition stops serving"
                            );
                        }
                        tracing::trace!(
                            partition_id = self.store.partition_id(),
                            ?event,
                            "replica"
                        );
                    }
                    Output::Send { to, msg } => {
                        // A cluster of one has no peer to send to.
                        let what = msg.body.name();
                        tracing::error!(
                            partition_id = self.store.partition_id(),
                            to,
                            what,
                            "a lone replica sent a message"
                        );
                        debug_assert!(false, "a lone replica sent {what} to {to}");
                    }
                }
            }
            // The store accepted nothing of these (disk full): the replica
            // takes them back, last op first, and their producers get the
            // store's error, retryable as before replication.
            if let Some((id, op, error)) = refused.pop() {
                if let Some(token) = self.replica.refuse_append(id, op, &mut self.outbox) {
                    self.replies.push((token, Err(error)));
                }
                continue;
            }
            let Some(input) = self.inputs.pop_front() else {
                break;
            };
            self.replica.step(input, &mut self.outbox);
        }
    }

    /// Answers the replica's waiting flushes the store made durable; if the
    /// store is fenced, fails the rest (which fences the replica and fails
    /// its clients).
    fn answer_flushes(&mut self, io: &mut impl IoBackend) {
        let fenced = self.store.fenced().map(str::to_string);
        let durable_op = self.store.durable().last_op;
        while let Some(&(id, op)) = self.flushes.front() {
            let result = match &fenced {
                _ if op <= durable_op => Ok(IoOutcome::Done),
                Some(cause) => Err(IoFailure {
                    reason: format!("flush: {cause}"),
                }),
                None => break,
            };
            self.flushes.pop_front();
            self.inputs.push_back(Input::IoDone { id, result });
        }
        self.drive(io);
    }
}

/// A transfer message for replica `to` as (node, payload); None (logged)
/// for an index out of range or a message the encoder refuses. A Chunk
/// goes self-checked: its frame's checksum covers the replication header
/// and the Chunk's fixed fields (which their own checksums cover too), not
/// its data, which the receiving partition's `transfer::Receiver` checks
/// against the manifest's chunk checksum before it stages it.
fn encode_transfer(
    repl: &Replication,
    id: u32,
    view: u32,
    to: u8,
    msg: &TransferMessage,
) -> Option<(u32, Outgoing)> {
    let Some(node) = repl.node(to) else {
        tracing::error!(
            partition_id = id,
            to,
            "transfer message to a replica index out of range"
        );
        return None;
    };
    let (mut payload, self_checked) = match msg {
        TransferMessage::Chunk { data, .. } => {
            let capacity = wire::HEADER_LEN + CHUNK_FIXED_BYTES + data.len();
            (Outgoing::with_capacity(capacity), true)
        }
        _ => (Outgoing::with_capacity(0), false),
    };
    match msg
        .to_wire(repl.group_id, id, repl.replica, view)
        .encode(payload.append())
    {
        Ok(()) if self_checked => Some((node, payload.self_checked())),
        Ok(()) => Some((node, payload)),
        Err(e) => {
            tracing::error!(partition_id = id, to = node, error = %e, "transfer message not encoded");
            None
        }
    }
}

/// A Chunk body's fixed fields (snapshot id, artifact, chunk), which its
/// body checksum covers (`ringlog_protocol::replication::body_checksum_len`).
const CHUNK_FIXED_BYTES: usize = 16;
// What a self-checked frame's checksum covers holds the Chunk's header and
// fixed fields.
const _: () = assert!(wire::HEADER_LEN + CHUNK_FIXED_BYTES <= SELF_CHECKED_COVERED_BYTES);

/// A replica's seed: timeouts of one group's replicas jitter apart.
fn seed_of(id: u32, repl: &Replication) -> u64 {
    u64::from(id) << 8 | u64::from(repl.replica)
}

/// What a producer sees for a replica's refusal.
fn client_error(store: &PartitionStore, repl: Option<&Replication>, e: AppendError) -> OpError {
    match e {
        // The pipeline and client queue are full: retry later.
        AppendError::Busy { .. } => OpError::new(ErrorCode::Backpressure, e.to_string()),
        AppendError::InvalidBatch(_) => OpError::new(ErrorCode::InvalidBatch, e.to_string()),
        // Replicated: the primary lost its view with the op in flight; the
        // op may or may not commit in the next view (not a fence).
        AppendError::OutcomeUnknown { .. } if repl.is_some() => {
            OpError::new(ErrorCode::PartitionUnavailable, e.to_string())
        }
        // At R = 1 only a fence loses the view.
        AppendError::Fenced | AppendError::OutcomeUnknown { .. } => {
            let cause = store.fenced().map_or_else(|| e.to_string(), str::to_string);
            OpError::new(ErrorCode::PartitionFenced, cause)
        }
        AppendError::NotPrimary { view, primary } => match repl.and_then(|r| r.node(primary)) {
            Some(node) => {
                let addr = repl
                    .and_then(|r| r.addrs.get(&node))
                    .map_or_else(|| "unknown".to_string(), SocketAddr::to_string);
                // Clients follow `primary_addr=` (client::ClientError::primary_addr).
                let client = repl
                    .and_then(|r| r.client_addrs.of(node))
                    .map_or_else(String::new, |a| format!(" primary_addr={a}"));
                OpError::new(
                    ErrorCode::NotPrimary,
                    format!(
                        "this node holds a backup of partition {}: produce to primary_node={node}\
                         {client} (peer address {addr}, view {view})",
                        store.partition_id()
                    ),
                )
            }
            None => OpError::new(ErrorCode::PartitionUnavailable, e.to_string()),
        },
        // The partition id is stamped here: a mismatch is a bug.
        AppendError::WrongPartition { .. } => OpError::new(ErrorCode::Internal, e.to_string()),
    }
}

/// The whole batches of `bytes` (back to back, as stored) below offset
/// `end`, and the offset after them. Batches end on op boundaries, so the
/// commit's end is always a batch boundary.
fn committed_prefix(mut bytes: Vec<u8>, end: u64) -> Result<(Vec<u8>, u64), OpError> {
    let mut at = 0;
    let mut next = None;
    while at < bytes.len() {
        let header = BatchHeader::decode(&bytes[at..])
            .map_err(|e| OpError::new(ErrorCode::Corruption, format!("stored batch: {e}")))?;
        if header.base_offset >= end {
            break;
        }
        next = Some(header.next_offset());
        at += header.total_len();
    }
    debug_assert!(at <= bytes.len());
    bytes.truncate(at.min(bytes.len()));
    let next = next.unwrap_or(end);
    Ok((bytes, next))
}

/// End position of the active segment's accepted bytes.
/// Closes the files a spare batch opened for a partition that can no
/// longer take them (closed, unavailable): the files are garbage for the
/// next open.
pub fn close_opened(io: &mut impl IoBackend, completions: Vec<Completion>) {
    for c in completions {
        if matches!(c.op, Op::Open { .. }) {
            if let Ok(file) = c.opened() {
                io.close(file);
            }
        }
    }
}

fn active_end(store: &PartitionStore) -> u64 {
    let sealed: u64 = store.sealed_segments().map(|s| s.length_bytes).sum();
    store.size_bytes() - sealed
}

/// How a partition's store came to be at open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Opened {
    Existing,
    Created,
    /// A replicated partition's sealed segment failed verification: its
    /// directory was set aside (see [`set_aside_corrupt`]) and the store
    /// created empty; the replica boots wiped and installs a good copy
    /// from a peer (`Trigger::CorruptSegment`).
    ReplacedCorrupt,
}

#[allow(clippy::too_many_arguments)]
fn open_or_create(
    io: &mut impl IoBackend,
    pool: &StorePool,
    dir: &Path,
    id: u32,
    config: StoreConfig,
    create: bool,
    replicated: bool,
) -> Result<(PartitionStore, Opened), String> {
    let exists = io
        .exists(dir)
        .map_err(|e| format!("stat {}: {e}", dir.display()))?;
    let mut opened = Opened::Created;
    if exists {
        match PartitionStore::open_in(io, dir, id, config.clone(), pool.clone()) {
            Ok(s) => return Ok((s, Opened::Existing)),
            Err(e @ StoreError::SealedSegmentCorrupt { .. }) if replicated => {
                // Not served, not lost: every sealed op is committed, so a
                // quorum of peers holds it.
                tracing::error!(dir = %dir.display(), error = %e, "a sealed segment fails verification: the partition's data is set aside and its replica installs a copy from a peer");
                set_aside_corrupt(io, dir)
                    .map_err(|e| format!("set aside {}: {e}", dir.display()))?;
                opened = Opened::ReplacedCorrupt;
            }
            Err(e) if !create => return Err(format!("open {}: {e}", dir.display())),
            Err(e) => {
                // Only a topic that never finished creation gets here: its
                // partitions never acknowledged anything.
                tracing::warn!(dir = %dir.display(), error = %e, "recreating partition of an unfinished topic");
                remove_tree(io, dir).map_err(|e| format!("remove {}: {e}", dir.display()))?;
            }
        }
    } else if !create {
        return Err(format!("partition directory {} is missing", dir.display()));
    }
    if let Some(parent) = dir.parent() {
        create_dirs(io, parent).map_err(|e| format!("mkdir {}: {e}", parent.display()))?;
    }
    PartitionStore::create_in(io, dir, id, config, pool.clone())
        .map(|s| (s, opened))
        .map_err(|e| format!("create {}: {e}", dir.display()))
}

/// Moves a partition directory whose data failed verification to
/// `<dir>.corrupt` (replacing an older one there) for the operator to
/// inspect: never read again, not a partition directory (its name is no
/// index), and the name is free for the new store.
fn set_aside_corrupt(io: &mut impl IoBackend, dir: &Path) -> std::io::Result<()> {
    let mut name = dir.as_os_str().to_owned();
    name.push(".corrupt");
    let to = PathBuf::from(name);
    if io.exists(&to)? {
        remove_tree(io, &to)?;
    }
    crate::trash::move_in(io, dir, &to)
}

/// A store holding nothing, its VSR state untouched since creation: on a
/// recovering node, one whose wiped flag a crash kept from being written
/// right after its creation (booting it wiped is never unsafe: a wiped
/// replica only waits longer before it votes).
fn never_written(store: &PartitionStore) -> bool {
    let sb = store.superblock();
    sb.vsr == superblock::VsrState::default() && store.durable().last_op == 0
}

/// The host's first write for a wiped replica (see [`Replica::wiped`]):
/// durable before the replica steps, so a crash reboots it wiped again.
fn mark_wiped(io: &mut impl IoBackend, store: &mut PartitionStore) -> Result<(), String> {
    debug_assert_eq!(
        store.durable().last_op,
        0,
        "only an empty store boots wiped"
    );
    let vsr = superblock::VsrState {
        wiped: true,
        view_lost: true,
        ..superblock::VsrState::default()
    };
    store
        .set_vsr(io, vsr)
        .map_err(|e| format!("mark the store wiped: {e}"))?;
    debug_assert!(store.superblock().vsr.wiped);
    Ok(())
}

/// Creates `dir` and its missing ancestors through the backend, fsyncing
/// each directory that got a new entry and `dir` itself, so the path is
/// durable before the partition is created inside it.
fn create_dirs(io: &mut impl IoBackend, dir: &Path) -> std::io::Result<()> {
    let mut missing = Vec::new();
    let mut at = Some(dir);
    while let Some(path) = at.filter(|p| !p.as_os_str().is_empty()) {
        if io.exists(path)? {
            break;
        }
        missing.push(path);
        at = path.parent();
    }
    let mut to_sync: Vec<&Path> = Vec::new();
    for &path in missing.iter().rev() {
        io.create_dir(path)?;
        to_sync.extend(path.parent());
    }
    to_sync.push(dir);
    for path in to_sync {
        let handle = io.open_dir(path)?;
        let done = run_op(io, Op::Fsync { file: handle });
        io.close(handle);
        done?;
    }
    Ok(())
}

/// Removes `dir` and everything under it through the backend.
fn remove_tree(io: &mut impl IoBackend, dir: &Path) -> std::io::Result<()> {
    for name in io.list_dir(dir)? {
        let path = dir.join(name);
        // Listing fails on anything but a directory.
        if io.list_dir(&path).is_ok() {
            remove_tree(io, &path)?;
        } else {
            run_op(io, Op::Unlink { path })?;
        }
    }
    run_op(io, Op::RemoveDir { path: dir.into() })
}

/// Runs one op and returns its result.
fn run_op(io: &mut impl IoBackend, op: Op) -> std::io::Result<()> {
    let completion = io.submit(vec![Sqe::new(op)]).pop();
    match completion {
        Some(c) => c.result.map(drop),
        None => Err(std::io::Error::other("backend returned no completion")),
    }
}

/// The client-visible code of a store error.
pub fn store_error(e: StoreError) -> OpError {
    let code = match &e {
        StoreError::Fenced { .. } => ErrorCode::PartitionFenced,
        // Retryable: nothing was accepted, reads go on.
        StoreError::DiskFull { .. } => ErrorCode::DiskFull,
        StoreError::InvalidBatch { .. } => ErrorCode::InvalidBatch,
        StoreError::BatchTooLarge { .. } => ErrorCode::BatchTooLarge,
        StoreError::OffsetOutOfRange { .. } => ErrorCode::OffsetOutOfRange,
        StoreError::Corruption { .. } => ErrorCode::Corruption,
        // The server stamps offsets and the chain itself: a mismatch is a bug.
        StoreError::WrongPartition { .. }
        | StoreError::OffsetMismatch { .. }
        | StoreError::ChainMismatch { .. } => ErrorCode::Internal,
        _ => ErrorCode::Storage,
    };
    OpError::new(code, e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::{batch_of, records};

    #[test]
    fn disk_full_reaches_the_client_as_retryable_disk_full() {
        let e = store_error(StoreError::DiskFull {
            partition_id: 4,
            path: "/d/topics/t/0/00000000000000000000.log".into(),
        });
        assert_eq!(e.code, ErrorCode::DiskFull, "{e}");
        assert!(e.code.is_retryable());
        assert!(e.message.contains("disk full"), "{e}");
    }
    use crate::config::ServerConfig;
    use ringlog_storage::io::uring::UringBackend;
    use ringlog_storage::io::BatchId;

    fn open(dir: &Path, io: &mut UringBackend) -> Partition {
        let config = ServerConfig {
            segment_size_bytes: 32 * 1024,
            write_buffer_bytes: 8192,
            ..ServerConfig::default()
        }
        .store_config();
        let pool = StorePool::new(
            dir.join("recycle"),
            ringlog_storage::store::PoolConfig::private(&config),
        );
        let p = Partition::open(io, &pool, &dir.join("t").join("0"), "t", 0, 7, config, true);
        assert!(p.status(0).fault.is_none());
        p
    }

    fn batch(records: usize, value_len: usize, seed: usize) -> Vec<u8> {
        let values: Vec<Vec<u8>> = (0..records)
            .map(|r| vec![(seed + r) as u8; value_len])
            .collect();
        let refs: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
        batch_of(&refs).unwrap()
    }

    /// Spins on `reap` until `id` finished, then completes the flush.
    fn complete(io: &mut UringBackend, p: &mut Partition, id: BatchId) {
        loop {
            if let Some((got, completions)) = io.reap().pop() {
                assert_eq!(got, id);
                p.complete_flush(io, completions).unwrap();
                return;
            }
            std::thread::sleep(std::time::Duration::from_micros(100));
        }
    }

    /// Appends while a flush is in flight whenever `append_must_wait` allows
    /// it, across write-buffer overflows and segment rolls. The store asserts
    /// one flush at a time: a wrong answer would panic there.
    #[test]
    fn appends_continue_behind_a_flush_unless_they_must_wait() {
        let dir = tempfile::tempdir().unwrap();
        let mut io = UringBackend::new(64).unwrap();
        let mut p = open(dir.path(), &mut io);
        let mut flight: Option<BatchId> = None;
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        let (mut waited, mut behind, mut records_in) = (0, 0, 0u64);
        // Token -> records, in order; acknowledged offsets must follow on.
        let mut sent: Vec<(Token, u64)> = Vec::new();
        let mut acked = std::collections::BTreeMap::new();
        for i in 0..1500 {
            let n = 1 + next(8) as usize;
            let b = batch(n, 16 + next(400) as usize, i);
            if p.append_must_wait(b.len()) {
                waited += 1;
                let id = flight.take().expect("waits only behind a flush");
                complete(&mut io, &mut p, id);
                assert!(!p.append_must_wait(b.len()));
            } else if flight.is_some() {
                behind += 1;
            }
            let token = p.produce(&mut io, b.into()).unwrap();
            sent.push((token, n as u64));
            records_in += n as u64;
            for (token, result) in p.take_replies() {
                assert!(acked.insert(token, result.unwrap()).is_none());
            }
            match flight {
                None if next(3) == 0 => {
                    let mut sqes = Vec::new();
                    if p.prepare_flush(&mut io, &mut sqes).unwrap() > 0 {
                        assert!(p.flush_in_flight());
                        flight = Some(io.submit_nowait(sqes));
                    }
                }
                Some(id) if next(4) == 0 => {
                    complete(&mut io, &mut p, id);
                    flight = None;
                }
                _ => {
                    // A second flush is never queued while one is in flight.
                    let mut sqes = Vec::new();
                    if flight.is_some() {
                        assert_eq!(p.prepare_flush(&mut io, &mut sqes).unwrap(), 0);
                        assert!(sqes.is_empty());
                    }
                }
            }
        }
        if let Some(id) = flight.take() {
            complete(&mut io, &mut p, id);
        }
        let mut sqes = Vec::new();
        if p.prepare_flush(&mut io, &mut sqes).unwrap() > 0 {
            let id = io.submit_nowait(sqes);
            complete(&mut io, &mut p, id);
        }
        for (token, result) in p.take_replies() {
            assert!(acked.insert(token, result.unwrap()).is_none());
        }
        // Every produce acknowledged once durable, at consecutive offsets.
        assert_eq!(acked.len(), sent.len());
        let mut next = 0;
        for (token, n) in sent {
            let app = acked[&token];
            assert_eq!((app.base_offset, app.next_offset), (next, next + n));
            next += n;
        }
        assert!(waited > 0 && behind > 0, "waited {waited}, behind {behind}");
        assert_eq!(p.high_watermark(), Some(records_in));
        assert!(p.status(0).sealed_segments > 0, "segments rolled");

        let mut offset = 0;
        let mut seen = 0u64;
        while offset < records_in {
            let f = p.fetch(&mut io, offset, 1 << 20, Vec::new()).unwrap();
            for r in records(&f.batches).unwrap() {
                assert_eq!(r.offset, seen);
                seen += 1;
            }
            offset = f.next_offset;
        }
        assert_eq!(seen, records_in);
        p.close(&mut io).unwrap();
    }

    /// An idle partition's frontier record catches up on the second idle
    /// check; a busy one's is left to its next flush.
    #[test]
    fn an_idle_partition_checkpoints_its_frontier_record_once() {
        let dir = tempfile::tempdir().unwrap();
        let mut io = UringBackend::new(64).unwrap();
        let mut p = open(dir.path(), &mut io);
        let flush = |io: &mut UringBackend, p: &mut Partition| {
            let mut sqes = Vec::new();
            assert!(p.prepare_flush(io, &mut sqes).unwrap() > 0);
            let id = io.submit_nowait(sqes);
            complete(io, p, id);
        };
        for i in 0..2 {
            p.produce(&mut io, batch(2, 100, i).into()).unwrap();
            flush(&mut io, &mut p);
        }
        let lag = |p: &Partition| p.store().unwrap().frontier_lag_bytes();
        assert!(lag(&p) > 0, "the record trails by the last flush");
        let mut sqes = Vec::new();
        assert_eq!(
            p.prepare_checkpoint(&mut sqes).unwrap(),
            0,
            "first sighting"
        );
        // Appends since the last check: not idle.
        p.produce(&mut io, batch(2, 100, 3).into()).unwrap();
        flush(&mut io, &mut p);
        assert_eq!(p.prepare_checkpoint(&mut sqes).unwrap(), 0);
        assert_eq!(p.prepare_checkpoint(&mut sqes).unwrap(), 2);
        assert!(p.flush_in_flight());
        let id = io.submit_nowait(std::mem::take(&mut sqes));
        complete(&mut io, &mut p, id);
        assert_eq!(lag(&p), 0);
        assert_eq!(p.prepare_checkpoint(&mut sqes).unwrap(), 0);
        assert!(sqes.is_empty());
        p.close(&mut io).unwrap();
    }

    #[test]
    fn a_failed_flush_fences_the_partition() {
        let dir = tempfile::tempdir().unwrap();
        let mut io = UringBackend::new(64).unwrap();
        let mut p = open(dir.path(), &mut io);
        let first = p.produce(&mut io, batch(3, 100, 1).into()).unwrap();
        let mut sqes = Vec::new();
        assert_eq!(p.prepare_flush(&mut io, &mut sqes).unwrap(), 2);
        // Appends behind the flush go on...
        let second = p.produce(&mut io, batch(2, 100, 2).into()).unwrap();
        let mut completions = io.submit(sqes);
        completions[1].result = Err(std::io::Error::from_raw_os_error(libc::EIO));
        let err = p.complete_flush(&mut io, completions).unwrap_err();
        assert!(matches!(err, StoreError::Fenced { .. }), "{err}");
        assert!(!p.flush_in_flight());
        // ...but nothing became durable, and the partition is fail-stop.
        assert_eq!(p.high_watermark(), Some(0));
        let fault = p.status(0).fault.expect("fenced");
        assert!(fault.contains("fdatasync"), "{fault}");
        // Both producers, the flushed one and the one behind it, are told
        // the partition is fenced, with the cause.
        let mut failed: Vec<(Token, OpError)> =
            p.take_replies().map(|(t, r)| (t, r.unwrap_err())).collect();
        failed.sort_by_key(|(t, _)| *t);
        let tokens: Vec<Token> = failed.iter().map(|(t, _)| *t).collect();
        assert_eq!(tokens, [first, second]);
        for (_, e) in &failed {
            assert_eq!(e.code, ErrorCode::PartitionFenced, "{e}");
            assert!(e.message.contains("fdatasync"), "{e}");
        }
        let e = p.produce(&mut io, batch(1, 10, 3).into()).unwrap_err();
        assert_eq!(e.code, ErrorCode::PartitionFenced);
        assert!(p.prepare_flush(&mut io, &mut Vec::new()).is_err());
    }
}

#[cfg(test)]
mod replicated_tests {
    use super::*;
    use crate::client::{batch_of, records};
    use crate::config::ServerConfig;
    use ringlog_storage::io::uring::UringBackend;

    const GROUP: u128 = 0xfeed;

    fn replication(replica: u8, group_id: u128) -> Replication {
        let addrs = (1..=3u32)
            .map(|n| (n, SocketAddr::from(([127, 0, 0, 1], 7000 + n as u16))))
            .collect();
        Replication {
            nodes: vec![1, 2, 3],
            replica,
            group_id,
            addrs,
            client_addrs: ClientAddrs::new(|n| {
                (n != 2).then(|| SocketAddr::from(([127, 0, 0, 1], 8000 + n as u16)))
            }),
            boot_wiped: false,
        }
    }

    /// Replica `replica` of a fresh three-node group in `dir`.
    fn open(dir: &Path, io: &mut UringBackend, replica: u8, group_id: u128) -> Partition {
        let config = ServerConfig::default().store_config();
        open_with(dir, io, replication(replica, group_id), config)
    }

    /// Replica `repl.replica` over its dir in `dir` (created if missing),
    /// with the store settings `config`.
    fn open_with(
        dir: &Path,
        io: &mut UringBackend,
        repl: Replication,
        config: StoreConfig,
    ) -> Partition {
        open_with_id(dir, io, repl, config, 7)
    }

    /// [`open_with`] of partition id `id`.
    fn open_with_id(
        dir: &Path,
        io: &mut UringBackend,
        repl: Replication,
        config: StoreConfig,
        id: u32,
    ) -> Partition {
        let replica = repl.replica;
        let pool = StorePool::new(
            dir.join(format!("recycle{replica}")),
            ringlog_storage::store::PoolConfig::private(&config),
        );
        let pdir = dir.join(format!("r{replica}"));
        let p = Partition::open_replicated(io, &pool, &pdir, "t", 0, id, config, true, Some(repl));
        assert!(p.status(0).fault.is_none(), "{:?}", p.status(0).fault);
        p
    }

    /// Runs `p`'s flush to completion, if it has one to run.
    fn flush(io: &mut UringBackend, p: &mut Partition) {
        let mut sqes = Vec::new();
        if p.prepare_flush(io, &mut sqes).unwrap() > 0 {
            let completions = io.submit(sqes);
            p.complete_flush(io, completions).unwrap();
        }
    }

    /// Flushes every partition and carries their messages, until quiet.
    /// `cut` (node) receives nothing while set.
    fn pump(io: &mut UringBackend, parts: &mut [Partition], cut: Option<u32>) -> usize {
        let mut carried = 0;
        loop {
            let mut mail = Vec::new();
            for (i, p) in parts.iter_mut().enumerate() {
                flush(io, p);
                let mut sends = Vec::new();
                p.take_sends(&mut sends);
                mail.extend(
                    sends
                        .into_iter()
                        .map(|(to, m)| (i as u32 + 1, to, m.payload().to_vec())),
                );
            }
            if mail.is_empty() {
                return carried;
            }
            for (from, to, payload) in mail {
                if Some(to) == cut {
                    continue;
                }
                carried += 1;
                parts[to as usize - 1]
                    .deliver(io, &mut installs(), 0, from, &payload)
                    .unwrap();
            }
        }
    }

    /// Replica `replica` of the group over its dir in `dir` (created if
    /// missing), booting a created store wiped if `boot_wiped`.
    fn reopen(dir: &Path, io: &mut UringBackend, replica: u8, boot_wiped: bool) -> Partition {
        let mut repl = replication(replica, GROUP);
        repl.boot_wiped = boot_wiped;
        open_with(dir, io, repl, ServerConfig::default().store_config())
    }

    /// One round among the live replicas (`parts[i]` is node i + 1; None
    /// is down): every live one ticks, then messages are carried until
    /// quiet. Returns each message carried as (from node, command, whether
    /// the sender was wiped when it sent it).
    fn round(
        io: &mut UringBackend,
        parts: &mut [Option<Partition>],
    ) -> Vec<(u32, wire::Command, bool)> {
        let mut seen = Vec::new();
        for p in parts.iter_mut().flatten() {
            p.tick(io, &mut installs(), 0);
        }
        loop {
            let mut mail = Vec::new();
            for (i, p) in parts.iter_mut().enumerate() {
                let Some(p) = p else { continue };
                flush(io, p);
                let wiped = p.status(0).role == "wiped";
                let mut sends = Vec::new();
                p.take_sends(&mut sends);
                mail.extend(
                    sends
                        .into_iter()
                        .map(|(to, m)| (i as u32 + 1, to, m.payload().to_vec(), wiped)),
                );
            }
            if mail.is_empty() {
                return seen;
            }
            for (from, to, payload, wiped) in mail {
                let decoded =
                    wire::Message::decode(&payload, &ReplicationLimits::default()).unwrap();
                seen.push((from, decoded.command(), wiped));
                if let Some(p) = parts[to as usize - 1].as_mut() {
                    p.deliver(io, &mut installs(), 0, from, &payload).unwrap();
                }
            }
        }
    }

    fn all_records(io: &mut UringBackend, p: &mut Partition) -> Vec<u8> {
        let mut batches = Vec::new();
        let mut at = 0;
        loop {
            let f = p.fetch(io, at, 1 << 20, Vec::new()).unwrap();
            if f.batches.is_empty() {
                return batches;
            }
            at = f.next_offset;
            batches.extend_from_slice(&f.batches);
        }
    }

    /// Three replicas that committed `batches` batches, every one's commit
    /// known to all.
    fn committed_group(dir: &Path, io: &mut UringBackend, batches: u8) -> Vec<Option<Partition>> {
        let mut parts: Vec<Option<Partition>> =
            (0..3).map(|r| Some(reopen(dir, io, r, false))).collect();
        for seed in 0..batches {
            parts[0]
                .as_mut()
                .unwrap()
                .produce(io, one_batch(seed).into())
                .unwrap();
            round(io, &mut parts);
        }
        for _ in 0..10 {
            round(io, &mut parts);
        }
        let end = 2 * u64::from(batches);
        for p in parts.iter().flatten() {
            assert_eq!(p.high_watermark(), Some(end), "{:?}", p.status(0));
        }
        assert_eq!(
            parts[0].as_mut().unwrap().take_replies().count(),
            usize::from(batches)
        );
        parts
    }

    /// Replica 2's disk is lost: closed, its dir removed, reopened.
    fn wipe_replica_2(
        dir: &Path,
        io: &mut UringBackend,
        parts: &mut [Option<Partition>],
        boot_wiped: bool,
    ) {
        parts[2].take().unwrap().close(io).unwrap();
        std::fs::remove_dir_all(dir.join("r2")).unwrap();
        parts[2] = Some(reopen(dir, io, 2, boot_wiped));
    }

    /// A node that lost its disk and boots with `--recover`: its replica
    /// acknowledges no prepare and joins no view change while wiped. With
    /// node 2 down it repairs every committed op from the primary, yet
    /// stays wiped: only node 2 could tell it of a view it promised before
    /// the loss (a quorum of answers is needed), so the produce waits.
    /// Once node 2 answers, it takes part, with bytes identical to the
    /// primary's.
    #[test]
    fn a_wiped_replica_acknowledges_nothing_until_it_repaired_the_commits() {
        let dir = tempfile::tempdir().unwrap();
        let mut io = UringBackend::new(64).unwrap();
        let mut parts = committed_group(dir.path(), &mut io, 3);
        wipe_replica_2(dir.path(), &mut io, &mut parts, true);
        let wiped = parts[2].as_ref().unwrap().status(0);
        assert_eq!(wiped.role, "wiped");
        assert_eq!(
            (wiped.op, wiped.commit_op, wiped.repairs),
            (Some(0), Some(0), Some(0))
        );
        let superblock = parts[2].as_ref().unwrap().store().unwrap().superblock().vsr;
        assert!(
            superblock.wiped && superblock.view_lost,
            "the wiped flag is durable first: {superblock:?}"
        );
        // Node 2 is down: a produce now needs the wiped replica's vote.
        let node2 = parts[1].take();
        let token = parts[0]
            .as_mut()
            .unwrap()
            .produce(&mut io, one_batch(9).into())
            .unwrap();
        let mut seen = Vec::new();
        for _ in 0..20 {
            seen.extend(round(&mut io, &mut parts));
        }
        let is_vote = |cmd: &wire::Command| {
            matches!(
                cmd,
                wire::Command::PrepareOk
                    | wire::Command::StartViewChange
                    | wire::Command::DoViewChange
            )
        };
        let wiped_votes: Vec<_> = (seen.iter())
            .filter(|(from, cmd, wiped)| *from == 3 && *wiped && is_vote(cmd))
            .collect();
        assert!(wiped_votes.is_empty(), "{wiped_votes:?}");
        assert!(
            seen.iter().any(|(from, cmd, wiped)| *from == 3
                && *wiped
                && *cmd == wire::Command::RequestPrepares),
            "it repairs: {seen:?}"
        );
        let waiting = parts[2].as_ref().unwrap().status(0);
        assert_eq!(waiting.role, "wiped", "its view is unknown: {waiting:?}");
        assert_eq!(waiting.op, Some(4), "the 3 committed ops and the new one");
        assert_eq!(parts[0].as_mut().unwrap().take_replies().count(), 0);
        parts[1] = node2;
        for _ in 0..20 {
            round(&mut io, &mut parts);
        }
        let repaired = parts[2].as_ref().unwrap().status(0);
        assert_eq!(repaired.role, "backup", "{repaired:?}");
        let primary = parts[0].as_ref().unwrap().status(0);
        assert_eq!(repaired.view, primary.view);
        assert_eq!(repaired.commit_op, primary.commit_op);
        assert_eq!(repaired.op, Some(4));
        assert!(repaired.repairs.unwrap() > 0, "{repaired:?}");
        assert_eq!(repaired.lag_ops, Some(0));
        let vsr = parts[2].as_ref().unwrap().store().unwrap().superblock().vsr;
        assert!(!vsr.wiped && !vsr.view_lost, "{vsr:?}");
        let replies: Vec<Reply> = parts[0].as_mut().unwrap().take_replies().collect();
        assert_eq!(replies.len(), 1);
        assert_eq!(replies[0].0, token);
        assert_eq!(replies[0].1.as_ref().unwrap().next_offset, 8);
        let primary = all_records(&mut io, parts[0].as_mut().unwrap());
        assert_eq!(
            primary.len(),
            all_records(&mut io, parts[1].as_mut().unwrap()).len()
        );
        assert_eq!(primary, all_records(&mut io, parts[2].as_mut().unwrap()));
    }

    /// The failure a wiped boot prevents: after the wipe the primary dies,
    /// leaving {node 2, wiped node 3}. The wiped replica joins no view
    /// change, so none completes (a fresh view-0 boot would vote with its
    /// empty log: shown last); once node 1 is back, every committed op is
    /// there, identical, on all three.
    #[test]
    fn a_wiped_replica_forms_no_view_change_quorum_and_nothing_committed_is_lost() {
        let dir = tempfile::tempdir().unwrap();
        let mut io = UringBackend::new(64).unwrap();
        let mut parts = committed_group(dir.path(), &mut io, 3);
        let committed = all_records(&mut io, parts[0].as_mut().unwrap());
        wipe_replica_2(dir.path(), &mut io, &mut parts, true);
        parts[0].take().unwrap().close(&mut io).unwrap();
        // Well past the primary-silent timeout (30 ticks) and several
        // view-change rounds.
        let mut seen = Vec::new();
        for _ in 0..300 {
            seen.extend(round(&mut io, &mut parts));
        }
        assert!(
            seen.iter()
                .any(|(from, cmd, _)| *from == 2 && *cmd == wire::Command::StartViewChange),
            "node 2 tried: {seen:?}"
        );
        assert!(
            !seen.iter().any(|(from, _, wiped)| *from == 3 && !wiped),
            "node 3 stayed wiped"
        );
        assert!(!seen.iter().any(|(from, cmd, _)| *from == 3
            && matches!(
                cmd,
                wire::Command::StartViewChange | wire::Command::DoViewChange
            )));
        for p in parts.iter().flatten() {
            let st = p.status(0);
            assert!(
                st.role != "primary" && st.role != "backup",
                "no view completed: {st:?}"
            );
        }
        let node2 = parts[1].as_ref().unwrap().status(0);
        assert!(node2.view_changes.unwrap() >= 1, "{node2:?}");
        assert_eq!(node2.commit_op, Some(3), "its commits kept: {node2:?}");
        // Node 1 returns from its disk: a view change completes and the
        // wiped replica repairs; nothing committed is lost.
        parts[0] = Some(reopen(dir.path(), &mut io, 0, false));
        for _ in 0..300 {
            round(&mut io, &mut parts);
            if parts
                .iter()
                .flatten()
                .all(|p| p.high_watermark() == Some(6) && p.status(0).role != "wiped")
            {
                break;
            }
        }
        for p in parts.iter_mut().flatten() {
            assert_eq!(p.high_watermark(), Some(6), "{:?}", p.status(0));
            assert_eq!(all_records(&mut io, p), committed);
        }
        // The bug, for contrast: booted as a fresh view-0 member the same
        // empty replica joins the view change at once.
        let other = tempfile::tempdir().unwrap();
        let mut parts = committed_group(other.path(), &mut io, 3);
        wipe_replica_2(other.path(), &mut io, &mut parts, false);
        parts[0].take().unwrap().close(&mut io).unwrap();
        let mut seen = Vec::new();
        for _ in 0..300 {
            seen.extend(round(&mut io, &mut parts));
        }
        assert!(
            seen.iter()
                .any(|(from, cmd, _)| *from == 3 && *cmd == wire::Command::DoViewChange),
            "a fresh empty replica votes"
        );
    }

    /// A crash between a recovering node's store creation and its wiped
    /// flag leaves a store that never held anything: with the marker it
    /// boots wiped too; one that holds ops restarts as itself.
    #[test]
    fn a_recovering_node_boots_a_never_written_store_wiped_and_keeps_a_written_one() {
        let dir = tempfile::tempdir().unwrap();
        let mut io = UringBackend::new(64).unwrap();
        let empty = reopen(dir.path(), &mut io, 2, false);
        assert_eq!(empty.status(0).role, "backup");
        empty.close(&mut io).unwrap();
        let again = reopen(dir.path(), &mut io, 2, true);
        assert_eq!(again.status(0).role, "wiped");
        assert!(again.store().unwrap().superblock().vsr.wiped);
        again.close(&mut io).unwrap();
        // The flag is durable: it boots wiped without the marker too.
        let rebooted = reopen(dir.path(), &mut io, 2, false);
        assert_eq!(rebooted.status(0).role, "wiped");
        rebooted.close(&mut io).unwrap();
        let other = tempfile::tempdir().unwrap();
        let mut parts = committed_group(other.path(), &mut io, 2);
        parts[2].take().unwrap().close(&mut io).unwrap();
        let kept = reopen(other.path(), &mut io, 2, true);
        assert_ne!(kept.status(0).role, "wiped");
        assert!(!kept.store().unwrap().superblock().vsr.wiped);
        assert_eq!(kept.store().unwrap().durable().last_op, 2);
    }

    /// A shard's install slots (these tests run no transfer).
    fn installs() -> Installs {
        Installs::new(1, ringlog_storage::store::InstallBudget::new(1 << 30))
    }

    fn one_batch(seed: u8) -> Vec<u8> {
        batch_of(&[[seed; 50].as_slice(), [seed; 60].as_slice()]).unwrap()
    }

    /// The host's part of replication: a produce is answered only once a
    /// quorum holds it durably; backups serve only committed records; a
    /// backup refuses a produce naming the primary's node.
    #[test]
    fn a_produce_is_acknowledged_at_a_quorum_and_backups_serve_only_commits() {
        let dir = tempfile::tempdir().unwrap();
        let mut io = UringBackend::new(64).unwrap();
        let mut parts: Vec<Partition> = (0..3)
            .map(|r| open(dir.path(), &mut io, r, GROUP))
            .collect();
        assert_eq!(parts[0].status(0).role, "primary");
        assert_eq!(parts[1].status(0).role, "backup");
        let token = parts[0].produce(&mut io, one_batch(1).into()).unwrap();
        // Durable on the primary alone: not acknowledged.
        flush(&mut io, &mut parts[0]);
        assert_eq!(parts[0].take_replies().count(), 0);
        let mut sends = Vec::new();
        parts[0].take_sends(&mut sends);
        assert_eq!(sends.iter().map(|(to, _)| *to).collect::<Vec<_>>(), [2, 3]);
        // Node 2 takes the prepare; node 3 is cut off.
        parts[1]
            .deliver(&mut io, &mut installs(), 0, 1, sends[0].1.payload())
            .unwrap();
        flush(&mut io, &mut parts[1]);
        assert!(parts[1].store().unwrap().durable().next_offset == 2);
        assert_eq!(parts[1].high_watermark(), Some(0), "durable, not committed");
        assert!(parts[1]
            .fetch(&mut io, 0, 1 << 20, Vec::new())
            .unwrap()
            .batches
            .is_empty());
        pump(&mut io, &mut parts, Some(3));
        let replies: Vec<Reply> = parts[0].take_replies().collect();
        assert_eq!(replies.len(), 1);
        assert_eq!(replies[0].0, token);
        let app = replies[0].1.clone().unwrap();
        assert_eq!((app.base_offset, app.next_offset), (0, 2));
        assert_eq!(parts[0].high_watermark(), Some(2));
        // The commit reaches the backup with the next heartbeat.
        for _ in 0..10 {
            parts[0].tick(&mut io, &mut installs(), 0);
            pump(&mut io, &mut parts, Some(3));
        }
        assert_eq!(parts[1].high_watermark(), Some(2));
        let f = parts[1].fetch(&mut io, 0, 1 << 20, Vec::new()).unwrap();
        assert_eq!(
            f.batches,
            parts[0]
                .fetch(&mut io, 0, 1 << 20, Vec::new())
                .unwrap()
                .batches
        );
        assert_eq!(f.next_offset, 2);
        // A backup refuses, naming the primary.
        let e = parts[1].produce(&mut io, one_batch(2).into()).unwrap_err();
        assert_eq!(e.code, ErrorCode::NotPrimary, "{e}");
        assert!(e.message.contains("primary_node=1"), "{e}");
        assert!(e.message.contains("primary_addr=127.0.0.1:8001 "), "{e}");
        assert!(e.message.contains("127.0.0.1:7001"), "{e}");
    }

    /// Each replica's purge generation, log start and readable bytes.
    fn purge_state(
        io: &mut UringBackend,
        parts: &mut [Option<Partition>],
    ) -> Vec<(u64, u64, Vec<u8>)> {
        parts
            .iter_mut()
            .flatten()
            .map(|p| {
                let st = p.status(0);
                let start = st.log_start_offset;
                let mut bytes = Vec::new();
                let mut at = start;
                while let Ok(f) = p.fetch(io, at, 1 << 20, Vec::new()) {
                    if f.batches.is_empty() {
                        break;
                    }
                    at = f.next_offset;
                    bytes.extend_from_slice(&f.batches);
                }
                (st.purge_generation, start, bytes)
            })
            .collect()
    }

    /// `Partition::purge_to`, the cluster purge's entry point: a backup
    /// submits nothing; the primary submits one purge op however often it
    /// is asked while that op is queued behind a full pipeline or in the
    /// log (guards against: a second purge op queued behind the first,
    /// which would drop a batch acknowledged after the first committed);
    /// every replica then reports Done at the same log start, the later
    /// batch kept; asked again, nothing more is purged; the next
    /// generation purges once more.
    #[test]
    fn purge_to_purges_each_generation_once_on_every_replica() {
        let dir = tempfile::tempdir().unwrap();
        let mut io = UringBackend::new(64).unwrap();
        let mut parts = committed_group(dir.path(), &mut io, 3);
        let backup = parts[1].as_mut().unwrap();
        assert_eq!(backup.purge_to(&mut io, 1), Ok(PurgeState::Waiting));
        round(&mut io, &mut parts);
        let fresh = purge_state(&mut io, &mut parts);
        assert!(fresh
            .iter()
            .all(|(g, s, b)| (*g, *s, b.len()) == (0, 0, fresh[0].2.len())));
        let primary = parts[0].as_mut().unwrap();
        // A full pipeline (8 ops): the purge waits in the client queue.
        for seed in 10..18 {
            primary.produce(&mut io, one_batch(seed).into()).unwrap();
        }
        for _ in 0..3 {
            assert_eq!(primary.purge_to(&mut io, 1), Ok(PurgeState::Waiting));
        }
        let later = primary.produce(&mut io, one_batch(9).into()).unwrap();
        assert_eq!(primary.purge_to(&mut io, 1), Ok(PurgeState::Waiting));
        for _ in 0..20 {
            round(&mut io, &mut parts);
        }
        let acked: Vec<Reply> = parts[0].as_mut().unwrap().take_replies().collect();
        assert_eq!(acked.len(), 9, "only the produces are answered: {acked:?}");
        let (token, result) = acked.last().unwrap().clone();
        let app = result.unwrap();
        assert_eq!(token, later);
        // 6 + 16 records, the purge op's one, then the later batch's two.
        assert_eq!((app.base_offset, app.next_offset), (23, 25));
        for p in parts.iter_mut().flatten() {
            assert_eq!(p.purge_to(&mut io, 1), Ok(PurgeState::Done));
        }
        let state = purge_state(&mut io, &mut parts);
        for (g, start, bytes) in &state {
            assert_eq!((*g, *start), (1, 23), "one purge, through the purge op");
            assert_eq!(*bytes, state[0].2, "replicas identical");
            let kept = records(bytes).unwrap();
            let offsets: Vec<u64> = kept.iter().map(|r| r.offset).collect();
            assert_eq!(offsets, [23, 24]);
        }
        for _ in 0..3 {
            let p = parts[0].as_mut().unwrap();
            assert_eq!(p.purge_to(&mut io, 1), Ok(PurgeState::Done));
            round(&mut io, &mut parts);
        }
        let again = purge_state(&mut io, &mut parts);
        assert_eq!(again, state, "asked again, nothing purged");
        let p = parts[0].as_mut().unwrap();
        assert_eq!(p.purge_to(&mut io, 2), Ok(PurgeState::Waiting));
        for _ in 0..10 {
            round(&mut io, &mut parts);
        }
        for (g, start, bytes) in purge_state(&mut io, &mut parts) {
            assert_eq!((g, start, bytes.len()), (2, 26, 0));
        }
    }

    /// Guards against: a backup appending a prepare before taking the
    /// commit the prepare carries. Its store then never saw its whole tail
    /// committed when a batch crossed the roll point, so it never rolled,
    /// filled the segment's headroom, refused the next append
    /// (`UncommittedTail`) and fenced: every backup of a real cluster
    /// fenced at its first segment end (found by `ringlog-bench produce
    /// --cluster 3`, 256 MiB into the run).
    #[test]
    fn backups_roll_segments_with_the_primary_and_stay_identical() {
        let mut io = UringBackend::new(64).unwrap();
        let (_dir, mut parts) = small_segment_group(&mut io);
        let value = vec![7u8; 60 << 10];
        let batch = batch_of(&[value.as_slice()]).unwrap();
        // 64 batches of 60 KiB: almost 4 segments of 1 MiB each.
        for i in 0..64u64 {
            let token = parts[0].produce(&mut io, batch.clone().into()).unwrap();
            pump(&mut io, &mut parts, None);
            let replies: Vec<Reply> = parts[0].take_replies().collect();
            assert_eq!(replies.len(), 1, "batch {i}");
            assert_eq!(replies[0].0, token);
            let app = replies[0]
                .1
                .clone()
                .unwrap_or_else(|e| panic!("batch {i}: {e}"));
            assert_eq!(app.base_offset, i);
        }
        for _ in 0..10 {
            parts[0].tick(&mut io, &mut installs(), 0);
            pump(&mut io, &mut parts, None);
        }
        let primary = all_records(&mut io, &mut parts[0]);
        for (r, p) in parts.iter_mut().enumerate() {
            let st = p.status(0);
            assert!(st.fault.is_none(), "replica {r}: {:?}", st.fault);
            let segments = p.store().unwrap().sealed_segments().count();
            assert!(segments >= 3, "replica {r} rolled: {segments} segments");
            assert_eq!(p.high_watermark(), Some(64), "replica {r}");
            assert_eq!(all_records(&mut io, p), primary, "replica {r}");
        }
    }

    /// Three replicas of `GROUP` on 1 MiB segments (256 KiB write
    /// buffers), so a few large batches cross segment ends.
    fn small_segment_group(io: &mut UringBackend) -> (tempfile::TempDir, Vec<Partition>) {
        let dir = tempfile::tempdir().unwrap();
        let config = StoreConfig {
            segment_size_bytes: 1 << 20,
            write_buffer_bytes: 256 << 10,
            ..ServerConfig::default().store_config()
        };
        let parts = (0..3)
            .map(|r| open_with(dir.path(), io, replication(r, GROUP), config.clone()))
            .collect();
        (dir, parts)
    }

    /// A backup that missed ops repairs them in answers of up to 16
    /// batches; it took each answer's commit only after appending every
    /// batch, so 16 batches of 120 KiB stood uncommitted at once, past a
    /// 1 MiB segment's end and its headroom (a quarter of it): the append was
    /// refused (`UncommittedTail`) and the backup fenced (found by
    /// bin/tests/cluster.rs, the serving peer killed mid-transfer, whose
    /// receiver repairs past its install).
    #[test]
    fn a_backup_repairs_a_run_of_large_ops_across_segment_ends() {
        let mut io = UringBackend::new(64).unwrap();
        let (_dir, mut parts) = small_segment_group(&mut io);
        let value = vec![5u8; 120 << 10];
        let batch = batch_of(&[value.as_slice()]).unwrap();
        // Replica 3 is cut off for 40 batches (about 4.7 MiB).
        for i in 0..40u64 {
            parts[0].produce(&mut io, batch.clone().into()).unwrap();
            pump(&mut io, &mut parts, Some(3));
            let replies: Vec<Reply> = parts[0].take_replies().collect();
            assert!(replies[0].1.is_ok(), "batch {i}: {:?}", replies[0].1);
        }
        assert_eq!(parts[2].high_watermark(), Some(0));
        for _ in 0..200 {
            if parts[2].high_watermark() == Some(40) {
                break;
            }
            for p in parts.iter_mut() {
                p.tick(&mut io, &mut installs(), 0);
            }
            pump(&mut io, &mut parts, None);
        }
        let st = parts[2].status(0);
        assert!(st.fault.is_none(), "the backup fenced: {:?}", st.fault);
        assert_eq!(parts[2].high_watermark(), Some(40));
        assert!(st.repairs.is_some_and(|n| n > 0), "it caught up by repair");
        let primary = all_records(&mut io, &mut parts[0]);
        assert_eq!(all_records(&mut io, &mut parts[2]), primary);
        assert!(parts[2].store().unwrap().sealed_segments().count() >= 4);
    }

    /// A message of another replica group, from a node other than the one
    /// the sender claims to be, or that does not decode, is not stepped.
    #[test]
    fn messages_of_another_group_sender_or_garbage_are_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let mut io = UringBackend::new(64).unwrap();
        let mut primary = open(dir.path(), &mut io, 0, GROUP);
        let mut backup = open(dir.path(), &mut io, 1, GROUP);
        let other = tempfile::tempdir().unwrap();
        let mut stranger = open(other.path(), &mut io, 1, GROUP + 1);
        primary.produce(&mut io, one_batch(3).into()).unwrap();
        let mut sends = Vec::new();
        primary.take_sends(&mut sends);
        let prepare = sends[0].1.payload().to_vec();
        assert!(matches!(
            stranger.deliver(&mut io, &mut installs(), 0, 1, &prepare),
            Err(PeerDrop::WrongGroup { got: GROUP, .. })
        ));
        assert!(matches!(
            backup.deliver(&mut io, &mut installs(), 0, 3, &prepare),
            Err(PeerDrop::WrongSender {
                node: 3,
                claimed: 0
            })
        ));
        let mut garbled = prepare.clone();
        let last = garbled.len() - 1;
        garbled[last] ^= 1;
        assert!(matches!(
            backup.deliver(&mut io, &mut installs(), 0, 1, &garbled),
            Err(PeerDrop::Undecodable(_))
        ));
        // None of those reached the replica: its log is empty still.
        assert_eq!(backup.store().unwrap().chain().next_offset, 0);
        backup
            .deliver(&mut io, &mut installs(), 0, 1, &prepare)
            .unwrap();
        assert_eq!(backup.store().unwrap().chain().next_offset, 2);
        // A cluster-of-one partition takes no peer messages at all.
        let lone_dir = tempfile::tempdir().unwrap();
        let config = ServerConfig::default().store_config();
        let pool = StorePool::new(
            lone_dir.path().join("recycle"),
            ringlog_storage::store::PoolConfig::private(&config),
        );
        let mut lone = Partition::open(
            &mut io,
            &pool,
            &lone_dir.path().join("p"),
            "t",
            0,
            7,
            config,
            true,
        );
        assert_eq!(
            lone.deliver(&mut io, &mut installs(), 0, 1, &prepare),
            Err(PeerDrop::NotReplicated)
        );
    }

    /// Replica `replica` of a three-node metadata group in `dir`.
    fn open_meta(dir: &Path, io: &mut UringBackend, replica: u8) -> Partition {
        let config = ServerConfig::default().store_config();
        let id = crate::meta_hosted::META_PARTITION_ID;
        open_with_id(dir, io, replication(replica, GROUP), config, id)
    }

    /// Applies every committed batch of `p` past `g`'s applied offset;
    /// returns the local actions, in op order.
    fn apply_committed(
        io: &mut UringBackend,
        p: &mut Partition,
        g: &mut crate::meta_hosted::MetaGroup,
    ) -> Vec<crate::meta::LocalAction> {
        let mut actions = Vec::new();
        loop {
            let f = p
                .fetch(io, g.applied_offset(), 1 << 20, Vec::new())
                .unwrap();
            if f.batches.is_empty() {
                return actions;
            }
            let mut at = 0;
            while at < f.batches.len() {
                let len = BatchHeader::decode(&f.batches[at..]).unwrap().total_len();
                actions.extend(g.apply(&f.batches[at..at + len]).unwrap().1);
                at += len;
            }
        }
    }

    /// The metadata group over three hosted replicas (as each node's shard
    /// 0 runs it): a create submitted to the primary commits; each
    /// replica's committed log, applied to its node's `MetaGroup`, gives
    /// the same table and the same local creates; the same request id
    /// submitted again (a forwarder's retransmission) commits but applies
    /// nothing; a replica whose log is lost rejoins with an empty log,
    /// repairs every op and rebuilds the same table.
    #[test]
    fn metadata_commands_commit_and_apply_alike_on_every_replica() {
        use crate::meta::{command_batch, Command, LocalAction};
        use crate::meta_hosted::{MetaGroup, META_PARTITION_ID};
        let dir = tempfile::tempdir().unwrap();
        let mut io = UringBackend::new(64).unwrap();
        let mut parts: Vec<Option<Partition>> = (0..3)
            .map(|r| Some(open_meta(dir.path(), &mut io, r)))
            .collect();
        let group = |node| MetaGroup::new(node, &[1, 2, 3], 1, 0).unwrap();
        let mut groups: Vec<MetaGroup> = (1..=3).map(group).collect();
        let id = groups[1].start_request().unwrap();
        let create = Command::CreateTopic {
            name: "orders".into(),
            partitions: 2,
            replication_factor: 3,
        };
        let delete = Command::DeleteTopic {
            name: "orders".into(),
        };
        let create = command_batch(META_PARTITION_ID, &[(id, create)]).unwrap();
        let delete = command_batch(META_PARTITION_ID, &[(id + 1, delete)]).unwrap();
        // The create's retransmission commits after the delete: applied
        // again it would bring the topic back.
        for batch in [&create, &delete, &create] {
            let primary = parts[0].as_mut().unwrap();
            primary.produce(&mut io, batch.clone().into()).unwrap();
            for _ in 0..5 {
                round(&mut io, &mut parts);
            }
        }
        let mut digests = Vec::new();
        for (p, g) in parts.iter_mut().zip(&mut groups) {
            let actions = apply_committed(&mut io, p.as_mut().unwrap(), g);
            let done: Vec<(char, u32)> = actions
                .iter()
                .map(|a| match a {
                    LocalAction::Create(lp) => ('c', lp.partition_id),
                    LocalAction::Delete(lp) => ('d', lp.partition_id),
                    other => panic!("{other:?}"),
                })
                .collect();
            assert_eq!(done, [('c', 0), ('c', 1), ('d', 0), ('d', 1)]);
            assert_eq!(g.host().table().version(), 3, "every op applied");
            assert!(g.host().table().topics().is_empty());
            digests.push(g.host().table().digest());
        }
        assert!(digests.windows(2).all(|w| w[0] == w[1]));
        groups[1].release_outcomes();
        assert!(matches!(
            groups[1].take_outcome(id),
            Some(Ok(crate::meta::Change::Created { .. }))
        ));
        parts[2].take().unwrap().close(&mut io).unwrap();
        std::fs::remove_dir_all(dir.path().join("r2")).unwrap();
        parts[2] = Some(open_meta(dir.path(), &mut io, 2));
        let fresh = parts[2].as_mut().unwrap();
        assert_eq!(fresh.high_watermark(), Some(0), "an empty log");
        for _ in 0..40 {
            round(&mut io, &mut parts);
        }
        let mut rebuilt = group(3);
        let actions = apply_committed(&mut io, parts[2].as_mut().unwrap(), &mut rebuilt);
        assert_eq!(actions.len(), 4);
        assert_eq!(rebuilt.host().table().digest(), digests[0]);
    }
}
