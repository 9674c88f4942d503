//! One partition on its owning shard: its store and its replica.
//!
//! The replica ([`crate::vsr::Replica`], a cluster of one here, booted by
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

use std::path::{Path, PathBuf};

use std::collections::VecDeque;

use ringlog_protocol::wire::{ErrorCode, FetchReply};
use ringlog_protocol::{encode_header, BatchHeader, HEADER_LEN};
use ringlog_storage::io::{Completion, IoBackend, Op, Sqe};
use ringlog_storage::journal::Journal;
use ringlog_storage::store::{PartitionStore, StoreConfig, StoreError, StorePool};

use crate::ops::{OpError, PartitionStatus};
use crate::replica_io::{self, AppendFailure};
use crate::vsr::{
    AppendError, Appended, Config as ReplicaConfig, Input, IoFailure, IoId, IoOutcome, Outbox,
    Output, Replica, Status as ReplicaStatus, StorageOp, Token,
};

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
        let opened = open_or_create(io, pool, dir, id, config, create)
            .and_then(|store| Hosted::boot(io, store, id));
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
        mut batch: Vec<u8>,
    ) -> Result<Token, OpError> {
        let id = self.id;
        let h = self.hosted()?;
        let max = h.store.config().batch_bytes_max();
        let invalid = |e: String| OpError::new(ErrorCode::InvalidBatch, e);
        let mut header = BatchHeader::decode(&batch).map_err(|e| invalid(e.to_string()))?;
        if header.total_len() < batch.len() {
            let extra = batch.len() - header.total_len();
            return Err(invalid(format!(
                "{extra} bytes after the batch (one batch per produce)"
            )));
        }
        if batch.len() > max {
            return Err(OpError::new(
                ErrorCode::BatchTooLarge,
                format!("batch of {} bytes exceeds {max}", batch.len()),
            ));
        }
        if header.partition_id != id {
            header.partition_id = id;
            let head = batch
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
            State::Open(h) => Some(h.replies.drain(..)),
            State::Unavailable(_) => None,
        };
        replies.into_iter().flatten()
    }

    /// Whether the replica has a timeout armed ([`Partition::tick`] can do
    /// something). A cluster of one that is Normal never has.
    pub fn needs_tick(&self) -> bool {
        match &self.state {
            State::Open(h) => h.replica.needs_tick(),
            State::Unavailable(_) => false,
        }
    }

    /// One tick of the replica's clock.
    pub fn tick(&mut self, io: &mut impl IoBackend) {
        if let State::Open(h) = &mut self.state {
            h.run(io, Input::Tick);
            h.answer_flushes(io);
        }
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
        let store = self.store_or_err()?;
        let fetched = store
            .read_into(io, offset, max_bytes as usize, buf)
            .map_err(store_error)?;
        Ok(FetchReply {
            partition: index,
            next_offset: fetched.next_offset,
            log_start_offset: store.log_start_offset(),
            high_watermark: store.durable().next_offset,
            batches: fetched.bytes,
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
            State::Open(h) => (h.store.log_start_offset(), h.store.durable().next_offset),
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

    /// The durable end, if open.
    pub fn high_watermark(&self) -> Option<u64> {
        match &self.state {
            State::Open(h) => Some(h.store.durable().next_offset),
            State::Unavailable(_) => None,
        }
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
        };
        match &self.state {
            State::Open(h) => {
                let s = &h.store;
                st.log_start_offset = s.log_start_offset();
                st.frontier = s.chain().next_offset;
                st.commit = s.durable().next_offset;
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
    fn boot(io: &mut impl IoBackend, mut store: PartitionStore, id: u32) -> Result<Self, String> {
        let rec = replica_io::recover_lone(&mut store, io, 0)
            .map_err(|e| format!("replica of partition {id}: {e}"))?;
        let cfg = ReplicaConfig::new(id, 1, 0);
        let replica = Replica::restart(cfg, u64::from(id), rec.durable, rec.base, &rec.headers)
            .map_err(|e| format!("replica of partition {id}: {e}"))?;
        Ok(Hosted {
            store,
            replica,
            outbox: Outbox::new(),
            inputs: VecDeque::new(),
            flushes: VecDeque::new(),
            replies: Vec::new(),
            next_token: 1,
        })
    }

    /// Steps the replica with `input` and runs what it emits, feeding the
    /// completions of storage ops back in, until it is quiet. Flushes wait
    /// for the group commit ([`Hosted::answer_flushes`]).
    fn run(&mut self, io: &mut impl IoBackend, input: Input) {
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
                        let result = replica_io::append(&mut self.store, io, op, &batch);
                        match result {
                            Ok(()) => self.inputs.push_back(Input::IoDone {
                                id,
                                result: Ok(IoOutcome::Done),
                            }),
                            Err(AppendFailure::Store { source, .. })
                                if self.store.fenced().is_none() =>
                            {
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
                        let result = result.map_err(|e| client_error(&self.store, e));
                        self.replies.push((token, result));
                    }
                    Output::Event(event) => {
                        replica_io::note_event(&mut self.store, &event);
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

/// What a producer sees for a replica's refusal.
fn client_error(store: &PartitionStore, e: AppendError) -> OpError {
    match e {
        // The pipeline and client queue are full: retry later.
        AppendError::Busy { .. } => OpError::new(ErrorCode::Backpressure, e.to_string()),
        AppendError::InvalidBatch(_) => OpError::new(ErrorCode::InvalidBatch, e.to_string()),
        // At R = 1 only a fence loses the view.
        AppendError::Fenced | AppendError::OutcomeUnknown { .. } => {
            let cause = store.fenced().map_or_else(|| e.to_string(), str::to_string);
            OpError::new(ErrorCode::PartitionFenced, cause)
        }
        AppendError::NotPrimary { .. } => {
            OpError::new(ErrorCode::PartitionUnavailable, e.to_string())
        }
        // The partition id is stamped here: a mismatch is a bug.
        AppendError::WrongPartition { .. } => OpError::new(ErrorCode::Internal, e.to_string()),
    }
}

/// End position of the active segment's accepted bytes.
fn active_end(store: &PartitionStore) -> u64 {
    let sealed: u64 = store.sealed_segments().map(|s| s.length_bytes).sum();
    store.size_bytes() - sealed
}

fn open_or_create(
    io: &mut impl IoBackend,
    pool: &StorePool,
    dir: &Path,
    id: u32,
    config: StoreConfig,
    create: bool,
) -> Result<PartitionStore, String> {
    let exists = io
        .exists(dir)
        .map_err(|e| format!("stat {}: {e}", dir.display()))?;
    if exists {
        match PartitionStore::open_in(io, dir, id, config.clone(), pool.clone()) {
            Ok(s) => return Ok(s),
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
        .map_err(|e| format!("create {}: {e}", dir.display()))
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
            let token = p.produce(&mut io, b).unwrap();
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
            p.produce(&mut io, batch(2, 100, i)).unwrap();
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
        p.produce(&mut io, batch(2, 100, 3)).unwrap();
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
        let first = p.produce(&mut io, batch(3, 100, 1)).unwrap();
        let mut sqes = Vec::new();
        assert_eq!(p.prepare_flush(&mut io, &mut sqes).unwrap(), 2);
        // Appends behind the flush go on...
        let second = p.produce(&mut io, batch(2, 100, 2)).unwrap();
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
        let e = p.produce(&mut io, batch(1, 10, 3)).unwrap_err();
        assert_eq!(e.code, ErrorCode::PartitionFenced);
        assert!(p.prepare_flush(&mut io, &mut Vec::new()).is_err());
    }
}
