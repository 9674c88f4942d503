//! The transfer's storage executor: runs each [`TransferOp`] on a
//! [`PartitionStore`] and an [`IoBackend`], for the shard (io_uring) and
//! the simulator alike. The caller passes its clock (`now_ms`, for the
//! store's snapshot leases) and runs one partition's operations in
//! emission order.
//!
//! A replicated serve offers only what is at or below the commit (DESIGN.md
//! section 7): `open_snapshot` describes the durable log, the active tail
//! included, so [`execute`] cuts every trailing artifact holding an op
//! above the commit off the manifest (sealed segments hold only committed
//! ops, so at most the active tail goes) and names the frontier before it.
//! The lease still pins what the store opened; the server checks every
//! requested key against the cut manifest, so the tail is never read.
//!
//! [`Pipeline`] runs a partition's chunk reads and staged writes without
//! waiting for them (the ring's batches, reaped by the caller), so the
//! serving side reads the next window while earlier chunks are on the
//! wire, and the receiver pulls the next window while this one is being
//! written. An install's begin, commit and abort wait, without blocking,
//! for the partition's I/O in flight: held, they start when its last batch
//! is reaped. The commit and abort then run as the store's step machine
//! ([`Finishing`]) on the ring, a batch per step; the begin still runs
//! synchronously once nothing is in flight.

use std::collections::BTreeMap;
use std::sync::Arc;

use ringlog_protocol::manifest::Manifest;
use ringlog_protocol::BatchHeader;
use ringlog_storage::io::{BatchId, BufPool, Completion, IoBackend};
use ringlog_storage::store::{
    ChunkCheck, ChunkReads, FinishStep, Finishing, Install, InstallBudget, PartitionStore,
    StoreError, TransferError,
};

use super::types::{ChunkData, Fault, FaultKind, IoId, IoOutcome, TransferOp};

/// A shard's installs: at most `installs_max` at once (one per partition),
/// within one disk reservation budget; and which partition's [`Pipeline`]
/// each transfer batch on the shard's ring belongs to, so the shard's
/// reaping hands it back there.
pub struct Installs {
    installs_max: usize,
    budget: InstallBudget,
    active: BTreeMap<u32, Install>,
    /// Transfer batches in flight, by owning partition: at most what the
    /// shard's pipelines hold (a window of each machine's I/O, or one step
    /// of an install's end).
    owners: BTreeMap<BatchId, u32>,
    /// Partitions whose install's commit or abort is running on the ring:
    /// still installs, against `installs_max`.
    ending: std::collections::BTreeSet<u32>,
}

impl Installs {
    pub fn new(installs_max: usize, budget: InstallBudget) -> Self {
        assert!(installs_max > 0, "a shard must allow an install");
        Self {
            installs_max,
            budget,
            active: BTreeMap::new(),
            owners: BTreeMap::new(),
            ending: std::collections::BTreeSet::new(),
        }
    }

    /// The partition whose pipeline started `batch`, if one did.
    pub fn owner(&self, batch: BatchId) -> Option<u32> {
        self.owners.get(&batch).copied()
    }

    /// Transfer batches of the shard's pipelines in flight.
    pub fn batches_in_flight(&self) -> usize {
        self.owners.len()
    }

    /// A batch whose partition is gone: forgotten (its buffers dropped).
    pub fn forget(&mut self, batch: BatchId) -> Option<u32> {
        self.owners.remove(&batch)
    }

    /// Installs in progress on the shard, those whose commit or abort is
    /// running included.
    pub fn active(&self) -> usize {
        self.active.len() + self.ending.len()
    }

    pub fn budget(&self) -> &InstallBudget {
        &self.budget
    }

    /// Chunk buffer bytes the shard's installs hold now (see
    /// [`Install::buffered_bytes`]).
    pub fn buffered_bytes(&self) -> u64 {
        self.active.values().map(Install::buffered_bytes).sum()
    }
}

/// Runs `op` for `store`'s partition.
pub fn execute(
    store: &mut PartitionStore,
    io: &mut impl IoBackend,
    installs: &mut Installs,
    op: &TransferOp,
    now_ms: u64,
) -> Result<IoOutcome, Fault> {
    let pid = store.partition_id();
    match op {
        TransferOp::OpenSnapshot { commit } => open_committed(store, io, *commit, now_ms),
        TransferOp::ReadChunks { snapshot_id, keys } => {
            let pairs: Vec<(u32, u32)> = keys.iter().map(|k| (k.artifact, k.chunk)).collect();
            let bufs = store
                .read_chunks(io, *snapshot_id, &pairs, now_ms)
                .map_err(fault)?;
            let chunks: Vec<ChunkData> = bufs.iter().map(|b| ChunkData::from(&b[..])).collect();
            Ok(IoOutcome::Chunks(chunks))
        }
        TransferOp::ReleaseSnapshot { snapshot_id } => {
            store.release_snapshot(*snapshot_id);
            Ok(IoOutcome::Done)
        }
        TransferOp::BeginInstall { manifest } => {
            if installs.active() >= installs.installs_max {
                return Err(Fault {
                    kind: FaultKind::Transient,
                    reason: format!("{} installs running, the limit", installs.active()),
                });
            }
            let install = store
                .begin_install(io, Manifest::clone(manifest), &installs.budget)
                .map_err(fault)?;
            installs.active.insert(pid, install);
            Ok(IoOutcome::Done)
        }
        TransferOp::AcceptChunks { chunks } => {
            let install = installs.active.get_mut(&pid).ok_or_else(no_install)?;
            let chunks: Vec<(u32, u32, &[u8])> = chunks
                .iter()
                .map(|(k, data)| (k.artifact, k.chunk, &data[..]))
                .collect();
            install.accept_chunks(io, &chunks).map_err(fault)?;
            Ok(IoOutcome::Done)
        }
        TransferOp::CommitInstall => {
            let install = installs.active.remove(&pid).ok_or_else(no_install)?;
            store.commit_install(io, install).map_err(fault)?;
            Ok(IoOutcome::Done)
        }
        TransferOp::AbortInstall => {
            if let Some(install) = installs.active.remove(&pid) {
                store.abort_install(io, install).map_err(fault)?;
            }
            Ok(IoOutcome::Done)
        }
    }
}

/// Batches the shard reaped, with their completions, for their owners.
pub type Reaped = Vec<(BatchId, Vec<Completion>)>;

/// What one of a [`Pipeline`]'s batches is.
enum InFlight {
    Read {
        id: IoId,
        reads: ChunkReads,
    },
    Stage {
        id: IoId,
    },
    /// A step of an install's commit or abort.
    Finish {
        id: IoId,
        finishing: Box<Finishing>,
    },
}

/// One partition's transfer I/O on the shard's ring: chunk reads
/// (serving) and staged writes (receiving) are queued without waiting and
/// answered when their batch is reaped ([`Pipeline::complete`]). An
/// install's begin, commit or abort never overtakes its writes: with I/O
/// in flight it is held (one at most: the receiver emits one at a time)
/// and started by the completion of the partition's last batch; the
/// commit and abort then run a step per batch. While one is held or
/// running the caller starts no other op ([`Pipeline::ends_install`]). In
/// flight: at most what the machines ask for (the server's
/// `reads_keys_max` keys per snapshot, the receiver's window of chunks),
/// or one step.
pub struct Pipeline {
    in_flight: BTreeMap<BatchId, InFlight>,
    /// The most batches ever in flight at once (1 would mean lockstep).
    in_flight_peak: usize,
    /// Read buffers, reused once a chunk is copied out to the wire.
    pool: BufPool,
    /// The begin, commit or abort waiting for the I/O in flight.
    held: Option<(IoId, TransferOp)>,
}

impl Pipeline {
    /// Keeps up to `buffers_max` idle read buffers of `chunk_bytes`.
    pub fn new(chunk_bytes: u32, buffers_max: usize) -> Self {
        Self {
            in_flight: BTreeMap::new(),
            in_flight_peak: 0,
            pool: BufPool::lazy(chunk_bytes as usize, buffers_max),
            held: None,
        }
    }

    /// Frees the idle read buffers: for when nothing is being served.
    pub fn drop_idle_buffers(&mut self) {
        self.pool.drop_idle();
    }

    /// Idle read buffers held.
    pub fn idle_buffers(&self) -> usize {
        self.pool.idle()
    }

    /// Batches in flight.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// The most batches that were in flight at once.
    pub fn in_flight_peak(&self) -> usize {
        self.in_flight_peak
    }

    pub fn owns(&self, batch: BatchId) -> bool {
        self.in_flight.contains_key(&batch)
    }

    /// An install's begin, commit or abort is held or running: the caller
    /// starts nothing else of the partition until it is answered.
    pub fn ends_install(&self) -> bool {
        self.held.is_some()
            || self
                .in_flight
                .values()
                .any(|w| matches!(w, InFlight::Finish { .. }))
    }

    /// Runs, queues or holds `op` (id `id`) of `store`'s partition;
    /// results ready now go to `done`.
    pub fn start(
        &mut self,
        store: &mut PartitionStore,
        io: &mut impl IoBackend,
        installs: &mut Installs,
        (id, op): (IoId, &TransferOp),
        now_ms: u64,
        done: &mut Vec<(IoId, Result<IoOutcome, Fault>)>,
    ) {
        assert!(
            !self.ends_install(),
            "nothing starts beside an install's begin, commit or abort"
        );
        let pid = store.partition_id();
        match op {
            TransferOp::ReadChunks { snapshot_id, keys } => {
                let pairs: Vec<(u32, u32)> = keys.iter().map(|k| (k.artifact, k.chunk)).collect();
                match store.start_read_chunks(io, *snapshot_id, &pairs, now_ms, &mut self.pool) {
                    Ok(reads) => {
                        let batch = reads.batch();
                        self.queue(installs, pid, batch, InFlight::Read { id, reads }, done)
                    }
                    Err(e) => done.push((id, Err(fault(e)))),
                }
            }
            TransferOp::AcceptChunks { chunks } => {
                let Some(install) = installs.active.get_mut(&pid) else {
                    return done.push((id, Err(no_install())));
                };
                let chunks: Vec<(u32, u32, &[u8])> = chunks
                    .iter()
                    .map(|(k, data)| (k.artifact, k.chunk, &data[..]))
                    .collect();
                // The receiver checked each against the manifest before it
                // emitted them (`Receiver::on_chunk`): not hashed again.
                match install.stage_chunks(io, &chunks, ChunkCheck::VerifiedByCaller) {
                    // Parked ahead of the cursor: taken, nothing to write.
                    Ok(None) => done.push((id, Ok(IoOutcome::Done))),
                    Ok(Some(batch)) => {
                        self.queue(installs, pid, Some(batch), InFlight::Stage { id }, done)
                    }
                    Err(e) => done.push((id, Err(fault(e)))),
                }
            }
            TransferOp::OpenSnapshot { .. } | TransferOp::ReleaseSnapshot { .. } => {
                // Leases only: reads in flight finish on their own.
                done.push((id, execute(store, io, installs, op, now_ms)));
            }
            TransferOp::BeginInstall { .. }
            | TransferOp::CommitInstall
            | TransferOp::AbortInstall => {
                if self.in_flight.is_empty() {
                    self.end_install(store, io, installs, (id, op), now_ms, done);
                } else {
                    self.held = Some((id, op.clone()));
                }
            }
        }
    }

    /// Runs an install's begin (synchronously), or starts its commit or
    /// abort on the ring; nothing of the partition is in flight.
    fn end_install(
        &mut self,
        store: &mut PartitionStore,
        io: &mut impl IoBackend,
        installs: &mut Installs,
        (id, op): (IoId, &TransferOp),
        now_ms: u64,
        done: &mut Vec<(IoId, Result<IoOutcome, Fault>)>,
    ) {
        assert!(
            self.in_flight.is_empty(),
            "an install's end overtakes no I/O"
        );
        let pid = store.partition_id();
        let started = match op {
            TransferOp::CommitInstall => match installs.active.remove(&pid) {
                Some(install) => store.start_commit(io, install),
                None => return done.push((id, Err(no_install()))),
            },
            TransferOp::AbortInstall => match installs.active.remove(&pid) {
                Some(install) => store.start_abort(io, install),
                None => return done.push((id, Ok(IoOutcome::Done))),
            },
            _ => return done.push((id, execute(store, io, installs, op, now_ms))),
        };
        let (finishing, step) = started;
        let new = installs.ending.insert(pid);
        assert!(new, "one install per partition");
        self.finish_step(io, installs, (pid, id), Box::new(finishing), step, done);
    }

    /// Submits the next step of an install's end, or answers its result.
    fn finish_step(
        &mut self,
        io: &mut impl IoBackend,
        installs: &mut Installs,
        (pid, id): (u32, IoId),
        finishing: Box<Finishing>,
        step: FinishStep,
        done: &mut Vec<(IoId, Result<IoOutcome, Fault>)>,
    ) {
        match step {
            FinishStep::Submit(sqes) => {
                debug_assert!(!sqes.is_empty(), "a step submits something");
                let batch = io.submit_nowait(sqes);
                let what = InFlight::Finish { id, finishing };
                self.queue(installs, pid, Some(batch), what, done);
            }
            FinishStep::Done(result) => {
                let ended = installs.ending.remove(&pid);
                debug_assert!(ended, "an install's end was started");
                let result = result.map(|()| IoOutcome::Done).map_err(fault);
                done.push((id, result));
            }
        }
    }

    fn queue(
        &mut self,
        installs: &mut Installs,
        pid: u32,
        batch: Option<BatchId>,
        what: InFlight,
        done: &mut Vec<(IoId, Result<IoOutcome, Fault>)>,
    ) {
        match batch {
            Some(batch) => {
                let replaced = self.in_flight.insert(batch, what);
                debug_assert!(replaced.is_none(), "batch ids are unique per backend");
                let owned = installs.owners.insert(batch, pid);
                debug_assert!(owned.is_none(), "one owner per batch");
                self.in_flight_peak = self.in_flight_peak.max(self.in_flight.len());
            }
            None => {
                let id = match what {
                    InFlight::Read { id, .. }
                    | InFlight::Stage { id }
                    | InFlight::Finish { id, .. } => id,
                };
                done.push((id, Err(local("a queued window has no batch"))));
            }
        }
    }

    /// Answers the op of a reaped `batch` of this pipeline (or submits its
    /// next step), and starts the held begin, commit or abort once nothing
    /// is in flight; false (the completions dropped) for another owner's
    /// batch: check [`Pipeline::owns`] first.
    #[allow(clippy::too_many_arguments)]
    pub fn complete(
        &mut self,
        store: &mut PartitionStore,
        io: &mut impl IoBackend,
        installs: &mut Installs,
        (batch, completions): (BatchId, Vec<Completion>),
        now_ms: u64,
        done: &mut Vec<(IoId, Result<IoOutcome, Fault>)>,
    ) -> bool {
        let Some(what) = self.in_flight.remove(&batch) else {
            return false;
        };
        let owner = installs.owners.remove(&batch);
        debug_assert_eq!(owner, Some(store.partition_id()), "registered when queued");
        match what {
            InFlight::Read { id, reads } => {
                let result = reads.finish(completions).map(|bufs| {
                    let chunks = bufs.iter().map(|b| ChunkData::from(&b[..])).collect();
                    for buf in bufs {
                        self.pool.put(buf);
                    }
                    IoOutcome::Chunks(chunks)
                });
                done.push((id, result.map_err(fault)));
            }
            InFlight::Stage { id } => {
                let pid = store.partition_id();
                let result = match installs.active.get_mut(&pid) {
                    Some(install) => install
                        .finish_staged(batch, completions)
                        .map(|()| IoOutcome::Done)
                        .map_err(fault),
                    // Cannot happen: aborts and commits wait for these.
                    None => Err(no_install()),
                };
                done.push((id, result));
            }
            InFlight::Finish { id, mut finishing } => {
                let step = store.resume_finish(io, &mut finishing, completions);
                let pid = store.partition_id();
                self.finish_step(io, installs, (pid, id), finishing, step, done);
            }
        }
        if self.in_flight.is_empty() {
            if let Some((id, op)) = self.held.take() {
                self.end_install(store, io, installs, (id, &op), now_ms, done);
            }
        }
        true
    }
}

fn local(reason: &str) -> Fault {
    Fault {
        kind: FaultKind::Local,
        reason: reason.into(),
    }
}

fn no_install() -> Fault {
    Fault {
        kind: FaultKind::Local,
        reason: "no install in progress for the partition".into(),
    }
}

/// Whose fault a store error is.
pub fn fault(e: StoreError) -> Fault {
    let kind = match &e {
        StoreError::Transfer { source, .. } => match source {
            TransferError::Busy
            | TransferError::InstallInProgress
            | TransferError::ReserveBudget { .. }
            | TransferError::TooManySnapshots { .. }
            | TransferError::Pinned { .. } => FaultKind::Transient,
            TransferError::UnknownSnapshot { .. } | TransferError::SnapshotGone { .. } => {
                FaultKind::Gone
            }
            TransferError::Poisoned { .. } | TransferError::Incomplete { .. } => FaultKind::Local,
            _ => FaultKind::Peer,
        },
        _ => FaultKind::Local,
    };
    Fault {
        kind,
        reason: e.to_string(),
    }
}

/// Opens a snapshot and cuts it to what is at or below `commit`.
fn open_committed(
    store: &mut PartitionStore,
    io: &mut impl IoBackend,
    commit: u64,
    now_ms: u64,
) -> Result<IoOutcome, Fault> {
    let mut m = store.open_snapshot(io, now_ms).map_err(fault)?;
    // The replica's commit can lag its store's sealed floor (after a
    // restart it starts from the superblock's), and retention may have
    // retired every op at or below it: nothing would be left to offer.
    m.commit = m.commit.max(commit).max(store.committed_floor());
    while m.last_op > m.commit {
        let Some(a) = m.artifacts.pop() else {
            break;
        };
        match batch_before(store, io, a.base_offset) {
            Ok((last_op, last_checksum)) => {
                m.next_offset = a.base_offset;
                m.last_op = last_op;
                m.last_checksum = last_checksum;
            }
            Err(e) => {
                store.release_snapshot(m.snapshot_id);
                return Err(e);
            }
        }
    }
    if m.last_op > m.commit {
        store.release_snapshot(m.snapshot_id);
        return Err(Fault {
            kind: FaultKind::Transient,
            reason: format!("no committed prefix to offer below op {}", m.last_op),
        });
    }
    Ok(IoOutcome::Snapshot(Arc::new(m)))
}

/// The op and checksum of the batch ending right before `offset`.
fn batch_before(
    store: &mut PartitionStore,
    io: &mut impl IoBackend,
    offset: u64,
) -> Result<(u64, u64), Fault> {
    let transient = |reason: String| Fault {
        kind: FaultKind::Transient,
        reason,
    };
    if offset <= store.log_start_offset() {
        // Nothing before it is held: the frontier the active segment
        // starts from names it.
        let f = store.superblock().frontier;
        if f.active_base == offset {
            return Ok((f.active_prev_op, f.active_prev_checksum));
        }
        return Err(transient(format!(
            "the batch before offset {offset} is not held"
        )));
    }
    let fetched = store.read(io, offset - 1, 1).map_err(fault)?;
    let h = BatchHeader::decode(&fetched.bytes).map_err(|e| Fault {
        kind: FaultKind::Local,
        reason: format!("batch before offset {offset} does not decode: {e}"),
    })?;
    if h.next_offset() != offset {
        return Err(transient(format!(
            "the batch before offset {offset} ends at {}",
            h.next_offset()
        )));
    }
    Ok((h.vsr_op, h.header_checksum))
}
