//! The transfer's storage executor: runs each [`TransferOp`] on a
//! [`PartitionStore`] and an [`IoBackend`], for the shard (io_uring) and
//! the simulator alike. The caller passes its clock (`now_ms`, for the
//! store's snapshot leases) and runs one partition's operations in
//! emission order.
//!
//! A replicated serve offers only what is at or below the commit (DESIGN.md
//! section 7): the store's `open_committed_snapshot` leaves the active tail
//! out of the manifest unless every op in it is committed (sealed segments
//! hold only committed ops), with no I/O; the server checks every
//! requested key against the manifest.
//!
//! [`Pipeline`] runs a partition's chunk reads and staged writes without
//! waiting for them (the ring's batches, reaped by the caller), so the
//! serving side reads the next window while earlier chunks are on the
//! wire, and the receiver pulls the next window while this one is being
//! written. An install's begin, commit and abort wait, without blocking,
//! for the partition's I/O in flight: held, they start when its last batch
//! is reaped. They then run as the store's step machines ([`Beginning`],
//! [`Finishing`]) on the ring, a batch per step.

use std::collections::BTreeMap;
use std::sync::Arc;

use ringlog_protocol::manifest::Manifest;
use ringlog_storage::io::{BatchId, BufPool, Completion, IoBackend};
use ringlog_storage::store::{
    Beginning, ChunkCheck, ChunkReads, Finishing, Install, InstallBudget, PartitionStore, Step,
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
    /// Partitions whose install's begin, commit or abort is running on the
    /// ring: installs too, against `installs_max`.
    stepping: std::collections::BTreeSet<u32>,
}

impl Installs {
    pub fn new(installs_max: usize, budget: InstallBudget) -> Self {
        assert!(installs_max > 0, "a shard must allow an install");
        Self {
            installs_max,
            budget,
            active: BTreeMap::new(),
            owners: BTreeMap::new(),
            stepping: std::collections::BTreeSet::new(),
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

    /// A batch whose partition is gone: forgotten (its buffers dropped,
    /// and any file a step of an install's begin or end opened closed, so
    /// its descriptor does not leak).
    pub fn forget(
        &mut self,
        io: &mut impl IoBackend,
        (batch, completions): (BatchId, Vec<Completion>),
    ) -> Option<u32> {
        for c in completions {
            if matches!(c.op, ringlog_storage::io::Op::Open { .. }) {
                if let Ok(file) = c.opened() {
                    io.close(file);
                }
            }
        }
        self.owners.remove(&batch)
    }

    /// Installs in progress on the shard, those whose begin, commit or
    /// abort is running included.
    pub fn active(&self) -> usize {
        self.active.len() + self.stepping.len()
    }

    pub fn budget(&self) -> &InstallBudget {
        &self.budget
    }

    /// Before `partition_id`'s install commits: has the commit's superblock
    /// mark the replica wiped unless the installed log reaches `voter_op`,
    /// the op the frozen replica's log held (None: it was wiped already).
    /// Such an install dropped nothing the replica acked, so it reboots a
    /// voter that is behind (`vsr` module docs). One write carries the mark
    /// and the install, so a crash never leaves the old log marked. Returns
    /// the mark; None without an install.
    pub fn mark_for_commit(&mut self, partition_id: u32, voter_op: Option<u64>) -> Option<bool> {
        let install = self.active.get_mut(&partition_id)?;
        let last_op = install.manifest().last_op;
        let wiped = voter_op.is_none_or(|op| last_op < op);
        install.mark_wiped(wiped);
        Some(wiped)
    }

    /// Refuses a begin (transiently) with `installs_max` installs running.
    fn check_room(&self) -> Result<(), Fault> {
        if self.active() >= self.installs_max {
            return Err(Fault {
                kind: FaultKind::Transient,
                reason: format!("{} installs running, the limit", self.active()),
            });
        }
        Ok(())
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
        TransferOp::OpenSnapshot { commit } => store
            .open_committed_snapshot(*commit, now_ms)
            .map(|m| IoOutcome::Snapshot(Arc::new(m)))
            .map_err(fault),
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
            installs.check_room()?;
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
    /// A step of an install's begin.
    Begin {
        id: IoId,
        beginning: Box<Beginning>,
    },
    /// A step of an install's commit or abort.
    Finish {
        id: IoId,
        finishing: Box<Finishing>,
    },
}

/// A step machine of an install the pipeline drives: how it waits in
/// flight, and what its result does once it lands.
trait Stepping {
    type Output;
    fn in_flight(self: Box<Self>, id: IoId) -> InFlight;
    fn landed(installs: &mut Installs, pid: u32, out: Self::Output) -> IoOutcome;
}

impl Stepping for Beginning {
    type Output = Box<Install>;

    fn in_flight(self: Box<Self>, id: IoId) -> InFlight {
        InFlight::Begin {
            id,
            beginning: self,
        }
    }

    /// The begun install becomes the partition's active one.
    fn landed(installs: &mut Installs, pid: u32, install: Box<Install>) -> IoOutcome {
        let replaced = installs.active.insert(pid, *install);
        debug_assert!(replaced.is_none(), "one install per partition");
        IoOutcome::Done
    }
}

impl Stepping for Finishing {
    type Output = ();

    fn in_flight(self: Box<Self>, id: IoId) -> InFlight {
        InFlight::Finish {
            id,
            finishing: self,
        }
    }

    fn landed(_: &mut Installs, _: u32, (): ()) -> IoOutcome {
        IoOutcome::Done
    }
}

/// One partition's transfer I/O on the shard's ring: chunk reads
/// (serving) and staged writes (receiving) are queued without waiting and
/// answered when their batch is reaped ([`Pipeline::complete`]). An
/// install's begin, commit or abort never overtakes its writes: with I/O
/// in flight it is held (one at most: the receiver emits one at a time)
/// and started by the completion of the partition's last batch; each then
/// runs a step per batch. While one is held or
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
                .any(|w| matches!(w, InFlight::Begin { .. } | InFlight::Finish { .. }))
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

    /// Starts an install's begin, commit or abort on the ring; nothing of
    /// the partition is in flight.
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
            TransferOp::BeginInstall { manifest } => {
                return self.start_begin(store, io, installs, (id, manifest), done)
            }
            _ => return done.push((id, execute(store, io, installs, op, now_ms))),
        };
        let (finishing, step) = started;
        let new = installs.stepping.insert(pid);
        assert!(new, "one install per partition");
        self.step(io, installs, (pid, id), Box::new(finishing), step, done);
    }

    /// Checks room for the install and the offer, then submits its
    /// begin's first step.
    fn start_begin(
        &mut self,
        store: &mut PartitionStore,
        io: &mut impl IoBackend,
        installs: &mut Installs,
        (id, manifest): (IoId, &Manifest),
        done: &mut Vec<(IoId, Result<IoOutcome, Fault>)>,
    ) {
        if let Err(e) = installs.check_room() {
            return done.push((id, Err(e)));
        }
        let pid = store.partition_id();
        match store.start_begin(io, Manifest::clone(manifest), installs.budget()) {
            Ok((beginning, sqes)) => {
                let new = installs.stepping.insert(pid);
                assert!(new, "one install per partition");
                let step = Step::Submit(sqes);
                self.step(io, installs, (pid, id), Box::new(beginning), step, done);
            }
            Err(e) => done.push((id, Err(fault(e)))),
        }
    }

    /// Submits the next step of an install's begin, commit or abort
    /// (`machine` is held in flight meanwhile), or answers its result.
    fn step<M: Stepping>(
        &mut self,
        io: &mut impl IoBackend,
        installs: &mut Installs,
        (pid, id): (u32, IoId),
        machine: Box<M>,
        step: Step<M::Output>,
        done: &mut Vec<(IoId, Result<IoOutcome, Fault>)>,
    ) {
        match step {
            Step::Submit(sqes) => {
                debug_assert!(!sqes.is_empty(), "a step submits something");
                let batch = io.submit_nowait(sqes);
                let what = machine.in_flight(id);
                self.queue(installs, pid, Some(batch), what, done);
            }
            Step::Done(result) => {
                let stepped = installs.stepping.remove(&pid);
                debug_assert!(stepped, "a begin, commit or abort was started");
                let result = result.map(|out| M::landed(installs, pid, out));
                done.push((id, result.map_err(fault)));
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
                    | InFlight::Begin { id, .. }
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
            InFlight::Begin { id, mut beginning } => {
                let step = store.resume_begin(io, &mut beginning, completions);
                let pid = store.partition_id();
                self.step(io, installs, (pid, id), beginning, step, done);
            }
            InFlight::Finish { id, mut finishing } => {
                let step = store.resume_finish(io, &mut finishing, completions);
                let pid = store.partition_id();
                self.step(io, installs, (pid, id), finishing, step, done);
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
            | TransferError::NoCommittedPrefix { .. }
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
