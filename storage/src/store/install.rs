//! Installing a snapshot from a peer: staged, verified, committed atomically.
//!
//! 1. [`PartitionStore::begin_install`] refuses stale or oversized offers
//!    (purge generation, frontier or commit below ours; more artifacts or
//!    bigger ones than we could hold; another chunk size), then creates the
//!    staging directory with one empty file per artifact, as a step machine
//!    ([`PartitionStore::start_begin`]) the shard runs on its ring. Disk is
//!    reserved a window at a time, as chunks come due, within the caller's
//!    [`InstallBudget`] (the first window by the begin), and fallocated in
//!    the batch of the writes it covers: an offer reserves nothing it has
//!    not begun to deliver.
//! 2. [`Install::accept_chunks`] verifies each chunk against its manifest
//!    checksum, then, in order, verifies its bytes as a log (batches,
//!    offsets, hash chain; a streaming verifier that also builds the index)
//!    and writes it straight to its place in the staged file; a window of
//!    chunks is written in one submission. Chunks that arrive ahead of the
//!    next one due wait in memory, at most `transfer_window_chunks` of them:
//!    memory is bounded by the window, whatever the segment size.
//!    A chunk is consumed once verified, so a failed staged write (or a
//!    failed verification) poisons the install: only an abort is left.
//!    [`Install::stage_chunks`] queues the writes without waiting (finished
//!    by [`Install::finish_staged`]), so the next window can be pulled
//!    while this one is written; chunks being written count against the
//!    window as parked ones do.
//! 3. [`PartitionStore::commit_install`] writes the indexes and the segment
//!    table, fsyncs the staged files, renames the staging directory to the
//!    next generation and fsyncs the partition directory (a submission of
//!    its own: a link chain does not stop at a failed rename), then writes
//!    the superblock. Every completion is checked; the superblock write is
//!    the commit point.
//!
//! Recovery needs nothing but the superblock: if it names a generation whose
//! directory is still called `staging` (the rename did not land), the rename
//! is rolled forward; otherwise `staging` is garbage and rolled back.

mod begin;
mod finish;

pub use begin::{BeginStep, Beginning};
pub use finish::{FinishStep, Finishing};

/// What the caller of a step machine (an install's begin, commit or
/// abort) does next.
#[derive(Debug)]
pub enum Step<T> {
    /// Submit these (one batch) and feed their completions back.
    Submit(Vec<Sqe>),
    /// The machine is done: its result.
    Done(Result<T, StoreError>),
}

/// Runs a step machine to its end, submitting each step and waiting for
/// it (`resume` feeds the completions back): for tools and tests; the
/// shard drives the steps on its ring without waiting.
fn run_steps<I: IoBackend, T>(
    io: &mut I,
    mut step: Step<T>,
    mut resume: impl FnMut(&mut I, Vec<Completion>) -> Step<T>,
) -> Result<T, StoreError> {
    loop {
        match step {
            Step::Submit(sqes) => {
                debug_assert!(!sqes.is_empty(), "a step submits something");
                let completions = io.submit(sqes);
                step = resume(io, completions);
            }
            Step::Done(result) => return result,
        }
    }
}

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use ringlog_protocol::checksum;
use ringlog_protocol::manifest::{Manifest, ManifestLimits};

use super::open::list;
use super::verify::LogVerifier;
use super::{PartitionStore, StoreError, TransferError};
use crate::io::{align_up, AlignedBuf, BatchId, BufPool, Completion, FileId, IoBackend, Op, Sqe};
use crate::segment::{self, SparseIndex};
use crate::superblock::{Frontier, Superblock, TableRef};

/// Disk that installs may hold reserved (fallocated) ahead of the verified
/// chunks written into it: one per shard, shared by its partitions' installs.
/// Each install holds at most one window of chunks beyond its written
/// bytes; a reservation over the budget is refused with
/// [`TransferError::ReserveBudget`] (the install may retry once others
/// progress). Bytes are returned as the chunks they were reserved for are
/// written, or when the install ends (commit, abort or drop).
#[derive(Clone, Debug)]
pub struct InstallBudget(Arc<BudgetState>);

#[derive(Debug)]
struct BudgetState {
    reserved_bytes: AtomicU64,
    reserve_bytes_max: u64,
}

impl InstallBudget {
    pub fn new(reserve_bytes_max: u64) -> Self {
        Self(Arc::new(BudgetState {
            reserved_bytes: AtomicU64::new(0),
            reserve_bytes_max,
        }))
    }

    /// Bytes reserved now by all installs sharing this budget.
    pub fn reserved_bytes(&self) -> u64 {
        self.0.reserved_bytes.load(Ordering::Relaxed)
    }

    pub fn reserve_bytes_max(&self) -> u64 {
        self.0.reserve_bytes_max
    }

    fn refusal(&self, needed_bytes: u64, reserved_bytes: u64) -> TransferError {
        TransferError::ReserveBudget {
            needed_bytes,
            free_bytes: self.0.reserve_bytes_max.saturating_sub(reserved_bytes),
        }
    }

    fn take(&self, bytes: u64) -> Result<(), TransferError> {
        let max = self.0.reserve_bytes_max;
        self.0
            .reserved_bytes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |r| {
                r.checked_add(bytes).filter(|&n| n <= max)
            })
            .map(|_| ())
            .map_err(|reserved| self.refusal(bytes, reserved))
    }

    fn give_back(&self, bytes: u64) {
        let before = self.0.reserved_bytes.fetch_sub(bytes, Ordering::Relaxed);
        debug_assert!(before >= bytes, "budget returned more than it lent");
    }
}

/// One install's share of an [`InstallBudget`], returned when dropped.
#[derive(Debug)]
struct Reservation {
    budget: InstallBudget,
    bytes: u64,
}

impl Reservation {
    fn take(&mut self, bytes: u64) -> Result<(), TransferError> {
        self.budget.take(bytes)?;
        self.bytes += bytes;
        Ok(())
    }

    fn give_back(&mut self, bytes: u64) {
        let bytes = bytes.min(self.bytes);
        self.bytes -= bytes;
        self.budget.give_back(bytes);
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.give_back(self.bytes);
    }
}

/// What the store keeps of its install in progress, so it notices one that
/// was dropped without a commit or abort (and closes its files).
pub(super) struct InstallSlot {
    alive: Weak<()>,
    /// The staged files and the staging directory.
    files: Vec<FileId>,
}

impl InstallSlot {
    /// Closes the staged files: the install is over (dropped, or its store
    /// is closing).
    pub(super) fn close_files(self, io: &mut impl IoBackend) {
        for file in self.files {
            io.close(file);
        }
    }
}

/// An install in progress: the offer and what has arrived of it.
pub struct Install {
    partition_id: u32,
    manifest: Manifest,
    staging_dir: PathBuf,
    staging_dir_file: FileId,
    /// One staged file per artifact.
    files: Vec<FileId>,
    /// The next chunk to verify and write, as (artifact, chunk); artifacts
    /// are verified in order, so the hash chain runs across them.
    cursor: (u32, u32),
    /// Chunks verified against their checksum that arrived ahead of the
    /// cursor, bounded by `window_chunks`.
    ahead: BTreeMap<(u32, u32), AlignedBuf>,
    window_chunks: usize,
    verifier: Option<LogVerifier>,
    /// Per verified artifact: its index.
    indexes: Vec<SparseIndex>,
    chain: Option<u64>,
    batch_bytes_max: usize,
    index_interval_bytes: u32,
    /// Aligned chunk buffers, reused.
    pool: BufPool,
    /// Staged writes that completed; the commit needs every chunk's.
    chunks_written: u64,
    /// Batches of staged writes queued by [`Install::stage_chunks`] and
    /// not finished yet. Their chunks count against the window like parked
    /// ones.
    writes_in_flight: BTreeMap<BatchId, Staged>,
    /// Why the install can no longer commit (a failed staged write or
    /// verification), once it cannot.
    poisoned: Option<String>,
    /// Held while the install lives: the store sees it dropped.
    _alive: Arc<()>,
    /// Per staged file: bytes reserved from its start (allocated, or
    /// queued in `allocations_due`).
    allocated: Vec<u64>,
    /// Fallocates of reserved windows not submitted yet: they go into the
    /// next batch of staged writes, unlinked (a fallocate, mode 0, never
    /// changes bytes already written, so it and the writes may run in any
    /// order; a failed one poisons the install like a failed write). At
    /// most one per window reserved.
    allocations_due: Vec<Sqe>,
    /// Allocated bytes not yet written, lent by the budget.
    reservation: Reservation,
    /// The commit's superblock marks the replica wiped ([`Install::mark_wiped`]).
    mark_wiped: bool,
}

/// A batch of staged writes in flight: its ops (the writes, and the
/// fallocate of a window coming due), chunks and chunk buffer bytes.
#[derive(Debug, Clone, Copy)]
struct Staged {
    ops: usize,
    chunks: usize,
    bytes: u64,
}

/// Whether [`Install::stage_chunks`] hashes each chunk against its manifest
/// checksum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkCheck {
    /// Hash it here (as [`Install::accept_chunks`] always does).
    Checksum,
    /// The caller did, against this install's manifest, before handing it
    /// over (the shard's transfer receiver does for every chunk it
    /// stages): hashing it again would hash every byte twice. Range,
    /// length and window are still checked, and the bytes still verified
    /// as a log (batch checksums, offsets, hash chain) before they are
    /// written.
    VerifiedByCaller,
}

impl Install {
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Has the superblock that commits this install mark the replica
    /// wiped (`VsrState::wiped`), in the same write: a crash before it
    /// reopens the old log unmarked, one after it the installed log
    /// marked, never one log with the other's mark. A superblock already
    /// marked stays marked either way.
    pub fn mark_wiped(&mut self, wiped: bool) {
        self.mark_wiped = wiped;
    }

    /// Chunks still to deliver, as (artifact, chunk), in order.
    pub fn missing(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        let (a0, c0) = self.cursor;
        self.manifest
            .artifacts
            .iter()
            .enumerate()
            .skip(a0 as usize)
            .flat_map(move |(a, artifact)| {
                let first = if a == a0 as usize { c0 } else { 0 };
                (first..artifact.chunk_checksums.len() as u32).map(move |c| (a as u32, c))
            })
            .filter(|key| !self.ahead.contains_key(key))
    }

    pub fn missing_count(&self) -> u64 {
        self.missing().count() as u64
    }

    /// Why this install can only be aborted, if it can.
    pub fn poisoned(&self) -> Option<&str> {
        self.poisoned.as_deref()
    }

    /// Chunks that may be delivered ahead of the next one due.
    pub fn window_chunks(&self) -> usize {
        self.window_chunks
    }

    /// Every chunk verified and its staged write completed.
    fn complete(&self) -> bool {
        let chunks: usize = self
            .manifest
            .artifacts
            .iter()
            .map(|a| a.chunk_checksums.len())
            .sum();
        self.cursor.0 as usize == self.manifest.artifacts.len()
            && self.chunks_written == chunks as u64
            && self.writes_in_flight.is_empty()
    }

    /// One chunk; see [`Install::accept_chunks`].
    pub fn accept_chunk(
        &mut self,
        io: &mut impl IoBackend,
        artifact: u32,
        chunk: u32,
        bytes: &[u8],
    ) -> Result<(), StoreError> {
        self.accept_chunks(io, &[(artifact, chunk, bytes)])
    }

    /// Takes delivered chunks: each is checked against the manifest (range,
    /// length, checksum) and the window; then every chunk now due is
    /// verified as log bytes and written, all writes in one submission.
    /// Duplicates of chunks already taken are ignored.
    ///
    /// A chunk is consumed once verified (the verifier's state moves past
    /// it), so a failed staged write or a failed verification poisons the
    /// install: every later call and the commit refuse it with
    /// [`TransferError::Poisoned`]; only an abort is left.
    pub fn accept_chunks(
        &mut self,
        io: &mut impl IoBackend,
        chunks: &[(u32, u32, &[u8])],
    ) -> Result<(), StoreError> {
        let (sqes, refusal) = self.due_writes(chunks, ChunkCheck::Checksum)?;
        // Chunks verified above are past the cursor: write them even if a
        // later one failed, so every buffer goes back to the pool.
        let written = if sqes.is_empty() {
            Ok(())
        } else {
            self.finish_writes(io.submit(sqes))
        };
        match (refusal, written) {
            (Some(e), _) | (None, Err(e)) => Err(e),
            (None, Ok(())) => Ok(()),
        }
    }

    /// [`accept_chunks`](Install::accept_chunks) without waiting for the
    /// staged writes: they are queued on the ring in one batch, returned
    /// (None if no chunk came due), and the caller hands the batch's
    /// completions, once reaped, to [`Install::finish_staged`]. Until then
    /// the chunks count against the window as parked ones do, so a
    /// receiver pulling the next window while this one is written holds at
    /// most `window_chunks` chunk buffers. A refusal after some chunks were
    /// verified writes those (blocking) before it returns, as
    /// `accept_chunks` does. `check` says whether each chunk's checksum is
    /// verified here or was by the caller ([`ChunkCheck`]).
    pub fn stage_chunks(
        &mut self,
        io: &mut impl IoBackend,
        chunks: &[(u32, u32, &[u8])],
        check: ChunkCheck,
    ) -> Result<Option<BatchId>, StoreError> {
        let (sqes, refusal) = self.due_writes(chunks, check)?;
        if let Some(e) = refusal {
            if !sqes.is_empty() {
                // The refusal is the error to report; a failed write of
                // these poisons the install as well.
                let _ = self.finish_writes(io.submit(sqes));
            }
            return Err(e);
        }
        if sqes.is_empty() {
            return Ok(None);
        }
        let (chunks, bytes) = sqes.iter().fold((0, 0), |(n, b), s| match &s.op {
            Op::Write { buf, .. } => (n + 1, b + buf.capacity() as u64),
            _ => (n, b),
        });
        debug_assert!(chunks > 0, "a staged batch writes a chunk");
        let ops = sqes.len();
        let batch = io.submit_nowait(sqes);
        let staged = Staged { ops, chunks, bytes };
        self.writes_in_flight.insert(batch, staged);
        Ok(Some(batch))
    }

    /// Finishes a batch of [`Install::stage_chunks`] with its reaped
    /// completions: counts the writes that landed; the first failure
    /// poisons the install and is returned.
    pub fn finish_staged(
        &mut self,
        batch: BatchId,
        completions: Vec<Completion>,
    ) -> Result<(), StoreError> {
        let Some(Staged { ops: count, .. }) = self.writes_in_flight.remove(&batch) else {
            let e = std::io::Error::other(format!("batch {} is not a staged write", batch.0));
            return Err(StoreError::io(
                self.partition_id,
                "staged write",
                &self.staging_dir,
                e,
            ));
        };
        if completions.len() != count {
            let reason = format!(
                "{} completions for {count} staged writes",
                completions.len()
            );
            self.poisoned.get_or_insert(reason.clone());
            let e = std::io::Error::other(reason);
            return Err(StoreError::io(
                self.partition_id,
                "staged write",
                &self.staging_dir,
                e,
            ));
        }
        self.finish_writes(completions)
    }

    /// Staged write batches queued and not finished.
    pub fn writes_in_flight(&self) -> usize {
        self.writes_in_flight.len()
    }

    /// Chunk buffer bytes the install holds now, counted from the buffers:
    /// parked chunks, staged writes in flight and the pool's idle buffers.
    pub fn buffered_bytes(&self) -> u64 {
        let parked: u64 = self.ahead.values().map(|b| b.capacity() as u64).sum();
        let writing: u64 = self.writes_in_flight.values().map(|s| s.bytes).sum();
        let idle = (self.pool.idle() * self.pool.buf_size_bytes()) as u64;
        parked + writing + idle
    }

    /// Takes `chunks` and verifies every chunk now due, returning their
    /// writes and the refusal that stopped it, if any.
    fn due_writes(
        &mut self,
        chunks: &[(u32, u32, &[u8])],
        check: ChunkCheck,
    ) -> Result<(Vec<Sqe>, Option<StoreError>), StoreError> {
        self.check_poisoned()?;
        for &(artifact, chunk, bytes) in chunks {
            self.take(artifact, chunk, bytes, check)?;
        }
        let mut sqes = Vec::new();
        let mut refusal = None;
        while self.ahead.contains_key(&self.cursor) {
            // Before the chunk is consumed: a refused reservation leaves it
            // parked, to be retried by a later call.
            if let Err(e) = self.reserve_due() {
                refusal = Some(e);
                break;
            }
            let Some(buf) = self.ahead.remove(&self.cursor) else {
                break;
            };
            match self.verify_due(buf) {
                Ok(sqe) => sqes.push(sqe),
                Err(e) => {
                    self.poisoned = Some(e.to_string());
                    refusal = Some(e);
                    break;
                }
            }
        }
        if !sqes.is_empty() {
            // The reserved windows' fallocates go with the first writes.
            sqes.splice(0..0, self.allocations_due.drain(..));
        }
        Ok((sqes, refusal))
    }

    /// Counts the staged writes of `completions` that landed; the first
    /// failure poisons the install and is returned.
    fn finish_writes(&mut self, completions: Vec<Completion>) -> Result<(), StoreError> {
        let mut failure = None;
        for c in completions {
            match (&c.result, &c.op) {
                (Ok(_), Op::Write { buf, .. }) => {
                    // Written: these bytes are staged data, no longer a
                    // reservation ahead of it.
                    self.reservation.give_back(buf.len() as u64);
                    self.chunks_written += 1;
                }
                (Ok(_), Op::Allocate { .. }) => {}
                (Err(e), Op::Write { file, offset, .. } | Op::Allocate { file, offset, .. }) => {
                    let what = c.op.kind();
                    let reason = format!("staged {what} at {offset} failed: {e}");
                    self.poisoned.get_or_insert(reason);
                    let path = self.staged_path(*file);
                    let e = std::io::Error::new(e.kind(), e.to_string());
                    failure.get_or_insert(StoreError::io(self.partition_id, what, path, e));
                }
                (_, op) => debug_assert!(false, "only writes and fallocates are staged: {op:?}"),
            }
            if let Some(buf) = c.op.into_buf() {
                self.pool.put(buf);
            }
        }
        failure.map_or(Ok(()), Err)
    }

    /// The staged file `file`'s path, for errors.
    fn staged_path(&self, file: FileId) -> PathBuf {
        self.files
            .iter()
            .position(|&f| f == file)
            .and_then(|i| self.manifest.artifacts.get(i))
            .map(|a| segment::log_path(&self.staging_dir, a.base_offset))
            .unwrap_or_else(|| self.staging_dir.clone())
    }

    /// Makes sure the chunk at the cursor lands in allocated space: if it
    /// does not, reserves its file up to a window of chunks further (or
    /// its end), within the budget, and queues the fallocate for the batch
    /// that writes it (see `allocations_due`).
    fn reserve_due(&mut self) -> Result<(), StoreError> {
        let (artifact, chunk) = self.cursor;
        let i = artifact as usize;
        let (Some(a), Some(&file), Some(&allocated)) = (
            self.manifest.artifacts.get(i),
            self.files.get(i),
            self.allocated.get(i),
        ) else {
            return Err(self.refusal(TransferError::ChunkOutOfRange { artifact, chunk }));
        };
        let chunk_bytes = u64::from(self.manifest.chunk_size_bytes);
        let start = u64::from(chunk) * chunk_bytes;
        let file_end = align_up(a.length_bytes);
        let need_end = (start + chunk_bytes).min(file_end);
        if need_end <= allocated {
            return Ok(());
        }
        // One window for the whole install, also where it spans two files
        // (the chunk itself is always covered).
        let window_bytes = chunk_bytes * self.window_chunks as u64;
        let room = window_bytes.saturating_sub(self.reservation.bytes);
        let window_end = (start + window_bytes)
            .min(file_end)
            .min(allocated + room)
            .max(need_end);
        let bytes = window_end - allocated;
        self.reservation.take(bytes).map_err(|e| self.refusal(e))?;
        self.allocated[i] = window_end;
        debug_assert!(bytes > 0, "only a chunk past the allocation reserves");
        self.allocations_due.push(Sqe::new(Op::Allocate {
            file,
            offset: allocated,
            len_bytes: bytes,
        }));
        Ok(())
    }

    fn check_poisoned(&self) -> Result<(), StoreError> {
        match &self.poisoned {
            Some(reason) => Err(self.refusal(TransferError::Poisoned {
                reason: reason.clone(),
            })),
            None => Ok(()),
        }
    }

    /// Checks one delivered chunk and parks it until it is due.
    fn take(
        &mut self,
        artifact: u32,
        chunk: u32,
        bytes: &[u8],
        check: ChunkCheck,
    ) -> Result<(), StoreError> {
        let Some(a) = self.manifest.artifacts.get(artifact as usize) else {
            return Err(self.refusal(TransferError::ChunkOutOfRange { artifact, chunk }));
        };
        let Some(&expected) = a.chunk_checksums.get(chunk as usize) else {
            return Err(self.refusal(TransferError::ChunkOutOfRange { artifact, chunk }));
        };
        let chunk_bytes = u64::from(self.manifest.chunk_size_bytes);
        let start = u64::from(chunk) * chunk_bytes;
        let len = chunk_bytes.min(a.length_bytes.saturating_sub(start)) as usize;
        if bytes.len() != len {
            let reason = format!("{} bytes, expected {len}", bytes.len());
            return Err(self.refusal(TransferError::BadChunk {
                artifact,
                chunk,
                reason,
            }));
        }
        if check == ChunkCheck::Checksum && checksum(bytes) != expected {
            let reason = "checksum mismatch".to_string();
            return Err(self.refusal(TransferError::BadChunk {
                artifact,
                chunk,
                reason,
            }));
        }
        if (artifact, chunk) < self.cursor || self.ahead.contains_key(&(artifact, chunk)) {
            return Ok(());
        }
        // Chunks being written hold buffers too: together with the parked
        // ones, at most a window.
        let writing: usize = self.writes_in_flight.values().map(|s| s.chunks).sum();
        if self.ahead.len() + writing >= self.window_chunks {
            return Err(self.refusal(TransferError::OutsideWindow {
                artifact,
                chunk,
                window_chunks: self.window_chunks,
            }));
        }
        let mut buf = self.pool.get(len);
        buf.extend_from_slice(bytes);
        self.ahead.insert((artifact, chunk), buf);
        Ok(())
    }

    /// Verifies the chunk at the cursor as log bytes, advances the cursor
    /// and returns the write that stages it.
    fn verify_due(&mut self, mut buf: AlignedBuf) -> Result<Sqe, StoreError> {
        let (artifact, chunk) = self.cursor;
        // The cursor only reaches chunks `take` found in the manifest.
        let (Some(a), Some(&file)) = (
            self.manifest.artifacts.get(artifact as usize),
            self.files.get(artifact as usize),
        ) else {
            return Err(self.refusal(TransferError::ChunkOutOfRange { artifact, chunk }));
        };
        let verifier = self.verifier.get_or_insert_with(|| {
            LogVerifier::new(
                self.partition_id,
                a.base_offset,
                self.chain,
                self.batch_bytes_max,
                self.index_interval_bytes,
            )
        });
        let fed = verifier.feed(&buf);
        let last_chunk = chunk as usize + 1 == a.chunk_checksums.len();
        let finished = match fed {
            Ok(()) if last_chunk => match self.verifier.take() {
                Some(verifier) => match verifier.finish(a.length_bytes, a.end_offset) {
                    Ok((_, last)) if last != Some(a.last_batch_checksum) => {
                        Err("last batch differs from the manifest".to_string())
                    }
                    other => other.map(Some),
                },
                None => Err("verifier lost".to_string()),
            },
            Ok(()) => Ok(None),
            Err(e) => Err(e),
        };
        let finished = finished
            .map_err(|reason| self.refusal(TransferError::Verification { artifact, reason }))?;
        let offset = u64::from(chunk) * u64::from(self.manifest.chunk_size_bytes);
        if let Some((index, last)) = finished {
            self.indexes.push(index);
            self.chain = last;
            self.cursor = (artifact + 1, 0);
        } else {
            self.cursor = (artifact, chunk + 1);
        }
        // O_DIRECT writes whole blocks: a short last chunk is padded with
        // zeros, and the artifact's length says where it ends.
        let len = buf.len();
        let padded = crate::io::align_up(len as u64) as usize;
        buf.full_mut()[len..padded].fill(0);
        buf.set_len(padded);
        Ok(Sqe::new(Op::Write { file, offset, buf }))
    }

    fn refusal(&self, source: TransferError) -> StoreError {
        StoreError::Transfer {
            partition_id: self.partition_id,
            source,
        }
    }
}

impl PartitionStore {
    /// Checks an offer and prepares to stage it: the loop that submits and
    /// waits for each step of [`PartitionStore::start_begin`]. The first
    /// window of disk must fit `budget` (taken by the first staged write).
    /// Refusals are typed [`TransferError`]s; nothing on disk changes for a
    /// refused offer, and a begin that fails half-way closes what it opened
    /// and removes its staging directory.
    pub fn begin_install(
        &mut self,
        io: &mut impl IoBackend,
        manifest: Manifest,
        budget: &InstallBudget,
    ) -> Result<Install, StoreError> {
        let (mut b, sqes) = self.start_begin(io, manifest, budget)?;
        run_steps(io, Step::Submit(sqes), |io, completions| {
            self.resume_begin(io, &mut b, completions)
        })
        .map(|install| *install)
    }

    /// Refuses a second install while one is alive; one dropped without a
    /// commit or abort is over: its files are closed here (its staging
    /// directory is removed by the begin that follows).
    fn clear_dropped_install(&mut self, io: &mut impl IoBackend) -> Result<(), StoreError> {
        match self.installing.take() {
            Some(slot) if slot.alive.strong_count() > 0 => {
                self.installing = Some(slot);
                Err(self.transfer_error(TransferError::InstallInProgress))
            }
            Some(slot) => {
                tracing::warn!(
                    partition = self.partition_id,
                    "clearing an install dropped without commit or abort"
                );
                slot.close_files(io);
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// Drops an unfinished install and its staged files: the loop that
    /// submits and waits for each step of [`PartitionStore::start_abort`].
    pub fn abort_install(
        &mut self,
        io: &mut impl IoBackend,
        install: Install,
    ) -> Result<(), StoreError> {
        let (mut finishing, step) = self.start_abort(io, install);
        run_steps(io, step, |io, completions| {
            self.resume_finish(io, &mut finishing, completions)
        })
    }

    /// Verifies the staged snapshot and makes it this partition's state:
    /// the loop that submits and waits for each step of
    /// [`PartitionStore::start_commit`] (for recovery tools and tests; the
    /// shard drives the steps on its ring without waiting).
    pub fn commit_install(
        &mut self,
        io: &mut impl IoBackend,
        install: Install,
    ) -> Result<(), StoreError> {
        let (mut finishing, step) = self.start_commit(io, install);
        run_steps(io, step, |io, completions| {
            self.resume_finish(io, &mut finishing, completions)
        })
    }

    /// The superblock that makes the installed snapshot this partition's
    /// state: its generation and table, an empty active segment at its end.
    fn installed_superblock(
        &self,
        install: &Install,
        generation: u64,
        table: TableRef,
        nonce: u64,
    ) -> Superblock {
        let m = &install.manifest;
        let mut next = self.sb.successor();
        next.vsr.wiped |= install.mark_wiped;
        debug_assert!(next.vsr.wiped || !next.vsr.view_lost);
        next.live_generation = generation;
        next.purge_generation = next.purge_generation.max(m.purge_generation);
        next.vsr.commit = next.vsr.commit.max(m.commit);
        next.table = table;
        next.frontier = Frontier {
            next_offset: m.next_offset,
            last_op: m.last_op,
            last_checksum: m.last_checksum,
            active_base: m.next_offset,
            active_position: 0,
            active_prev_checksum: m.last_checksum,
            active_capacity_bytes: self.config.segment_size_bytes,
            active_prev_op: m.last_op,
            active_nonce: nonce,
            ..Frontier::default()
        };
        next
    }

    /// The refusals of a finished install: poisoned, incomplete, overtaken
    /// by the local log, or not ending where the offer said.
    fn check_committable(&self, install: &Install) -> Result<(), StoreError> {
        // Fail-stop: a fenced partition commits nothing.
        self.check_fenced()?;
        install.check_poisoned()?;
        if !install.complete() {
            let missing = install.missing_count();
            return Err(self.transfer_error(TransferError::Incomplete { missing }));
        }
        // The log may have moved (a purge, appends) since the offer arrived.
        self.check_offer(&install.manifest)?;
        if install
            .chain
            .is_some_and(|c| c != install.manifest.last_checksum)
        {
            return Err(self.transfer_error(TransferError::Verification {
                artifact: 0,
                reason: "the log does not end at the offered last checksum".into(),
            }));
        }
        Ok(())
    }

    /// The refusals that protect the local log from stale or hostile offers.
    fn check_offer(&self, m: &Manifest) -> Result<(), StoreError> {
        let refuse = |e| Err(self.transfer_error(e));
        if m.partition_id != self.partition_id {
            return refuse(TransferError::WrongPartition {
                offered: m.partition_id,
            });
        }
        if m.purge_generation < self.sb.purge_generation {
            return refuse(TransferError::StalePurgeGeneration {
                offered: m.purge_generation,
                ours: self.sb.purge_generation,
            });
        }
        if m.next_offset < self.chain.next_offset {
            return refuse(TransferError::StaleFrontier {
                offered: m.next_offset,
                ours: self.chain.next_offset,
            });
        }
        // Only the committed ops we hold: the superblock's commit may be
        // above the log's end, and the commit below keeps the higher one.
        let commit_held = self.sb.vsr.commit.min(self.chain.last_op);
        if m.commit < commit_held {
            return refuse(TransferError::StaleCommit {
                offered: m.commit,
                ours: commit_held,
            });
        }
        if m.chunk_size_bytes != self.config.transfer_chunk_bytes {
            return refuse(TransferError::ChunkSize {
                offered: m.chunk_size_bytes,
                ours: self.config.transfer_chunk_bytes,
            });
        }
        // The staged files are held open: at most what a manifest may list.
        let artifacts_max = ManifestLimits::default().artifacts_max;
        if m.artifacts.len() > artifacts_max as usize {
            return refuse(TransferError::OfferTooLarge {
                what: "artifact count",
                value: m.artifacts.len() as u64,
                max: u64::from(artifacts_max),
            });
        }
        if let Some(a) = m
            .artifacts
            .iter()
            .find(|a| a.length_bytes > self.config.segment_size_bytes)
        {
            return refuse(TransferError::OfferTooLarge {
                what: "artifact length",
                value: a.length_bytes,
                max: self.config.segment_size_bytes,
            });
        }
        // The caller's manifest decode already checked contiguity and chunk
        // counts; an offer built in-process is checked here as well.
        let mut expected = m.artifacts.first().map(|a| a.base_offset);
        for (i, a) in m.artifacts.iter().enumerate() {
            if Some(a.base_offset) != expected || a.end_offset <= a.base_offset {
                return refuse(TransferError::NotContiguous {
                    base_offset: a.base_offset,
                });
            }
            let chunks = Manifest::chunk_count(a.length_bytes, m.chunk_size_bytes);
            if a.length_bytes == 0 || a.chunk_checksums.len() as u64 != chunks {
                return refuse(TransferError::BadChunk {
                    artifact: i as u32,
                    chunk: a.chunk_checksums.len() as u32,
                    reason: format!(
                        "artifact at offset {} lists {} chunks for {} bytes",
                        a.base_offset,
                        a.chunk_checksums.len(),
                        a.length_bytes
                    ),
                });
            }
            expected = Some(a.end_offset);
        }
        if let Some(end) = expected.filter(|&end| end != m.next_offset) {
            return refuse(TransferError::FrontierMismatch {
                artifacts_end: end,
                next_offset: m.next_offset,
            });
        }
        if self.active.end_position > self.active.durable_position || self.flushing.is_some() {
            return refuse(TransferError::Busy);
        }
        Ok(())
    }

    /// The removals of a directory and the files in it. Listing has no
    /// ring op: a plain getdents call, the one metadata call an install's
    /// end makes outside the ring.
    fn tree_removals(&self, io: &mut impl IoBackend, dir: &Path) -> Result<Vec<Op>, StoreError> {
        let mut ops: Vec<Op> = list(io, self.partition_id, dir)?
            .into_iter()
            .map(|path| Op::Unlink { path })
            .collect();
        ops.push(Op::RemoveDir { path: dir.into() });
        Ok(ops)
    }
}
