//! Cutting the uncommitted tail of the log (VSR: an old primary's ops that
//! the new view does not hold), and the rule that keeps that tail cuttable:
//! only committed data is sealed.
//!
//! ## The cut, and why a crash at any of its I/Os is safe
//!
//! A cut to position X (the first batch whose op is above the cut op) is
//! three durable steps, each its own submission:
//! 1. a superblock naming X as the frontier, with `slot_floor` S (one past
//!    the slot sequence in effect: every slot record and flush trailer
//!    written before, which may name positions above X, is void, even if
//!    it survives the zeroing) and `cut_pending_end` Z (the cut bytes may
//!    still be on disk up to Z);
//! 2. zeros over `[X, Z)` (the block holding X is rewritten with its bytes
//!    below X kept), then an fdatasync;
//! 3. a superblock without `cut_pending_end` (same frontier, same floor).
//!
//! A crash before step 1's superblock is durable opens the old log (the
//! superblock half in flight is torn, the other half is the old state); one
//! after it opens the cut log: while `cut_pending_end` is set, recovery ends
//! the log at X whatever follows (cut batches still chain there) and `open`
//! finishes steps 2 and 3 before it returns, so nothing is appended above a
//! cut whose bytes may remain. After step 3 the zeros are durable, so
//! recovery's usual scan stops at X (or at what was appended after the cut).
//! Bytes below X are never written except with their own values (from a
//! read whose batches verify again, `verified_tail`), so no batch at or
//! below the cut is lost.
//!
//! Z is the old accepted end's block plus one write buffer and one block (a
//! flush torn at an earlier crash wrote at most that far past the end
//! recovery kept, its trailer included), within the capacity and the file:
//! no stale batch past Z can chain onto a later log, and no flush trailer
//! written before the cut remains to claim cut bytes as durable.
//!
//! ## Seal only committed data
//!
//! With [`StoreConfig::uncommitted_headroom_bytes`] set (VSR), an append past
//! `capacity - headroom` rolls the segment only if every accepted op is
//! committed (the superblock's VSR commit or one given to
//! [`PartitionStore::note_commit`]); otherwise the batch goes into the
//! headroom, and one that does not fit the capacity is refused with
//! [`StoreError::UncommittedTail`] (nothing changes; it fits once the tail
//! commits). So sealed segments hold committed ops only and a cut never
//! reaches them. The roll needs the whole accepted tail committed at one
//! moment: a primary stops admitting client ops while
//! [`PartitionStore::seal_waits_for_commit`] holds, so its pipeline drains.
//!
//! ## For the VSR executor
//!
//! - `StorageOp::TruncateAbove { op }` is [`PartitionStore::truncate_above`]
//!   (`op` is the batch header's `vsr_op`); its `Ok` is the new log end. A
//!   [`StoreError::Cut`] means the replica asked for something it must never
//!   ask (a cut of committed or sealed ops, past its log, or with a flush of
//!   its own in flight): a bug, reported as the I/O failure it fences on.
//! - Every committed op goes to [`PartitionStore::note_commit`] (the
//!   replica's `Event::Committed`), so rolls can seal it; `PersistVsr` is
//!   [`PartitionStore::set_vsr`], which makes the commit durable too.
//! - With a headroom configured, rolls come before the capacity: predict
//!   them with [`PartitionStore::append_rolls`], not the capacity.
//!
//! [`StoreConfig::uncommitted_headroom_bytes`]: super::StoreConfig::uncommitted_headroom_bytes

use super::open::{recover_active, verified_tail, SCAN_CHUNK_BYTES};
use super::walk::{TailFrom, Visit, WalkStop, Walker};
use super::{submit_checked, ChainPoint, CutError, PartitionStore, StoreError};
use crate::io::{align_down, align_up, AlignedBuf, FileId, IoBackend, Op, Sqe, BLOCK_SIZE};
use crate::segment;
use crate::superblock::half_for;

/// Where a cut lands: the first batch above the cut op, and the log's end
/// just before it.
struct CutPoint {
    position: u64,
    chain: ChainPoint,
    /// Where a verified read of the cut's block starts.
    tail_from: TailFrom,
}

impl PartitionStore {
    /// Cuts every batch whose VSR op (`BatchHeader::vsr_op`) is above `op`,
    /// durably: when this returns Ok, no reopen (after a clean close or any
    /// later crash) shows a cut batch again. Returns the new end of the log
    /// (accepted and durable alike); appends continue from it.
    ///
    /// For the VSR executor's `StorageOp::TruncateAbove { op }`: everything
    /// appended before it is covered (accepted, unflushed batches are
    /// flushed first, then cut). It costs a scan of the active segment up to
    /// the cut, two superblock writes, zeroing writes (one write buffer
    /// each, so the memory is one buffer) and one fdatasync, and a rescan of
    /// the kept part (the index and checksums are rebuilt from disk, as at
    /// open).
    ///
    /// `op` equal to the last op cuts nothing: Ok with the accepted end, no
    /// I/O (unflushed batches stay unflushed). Refused with
    /// [`StoreError::Cut`], nothing changed, when: `op` is below the commit
    /// (the durable VSR commit or a noted one, see
    /// [`note_commit`](PartitionStore::note_commit)): the cut would remove
    /// a committed op; `op` is above the last op; `op` is below the active
    /// segment's first op (sealed data is never cut); or a flush is in
    /// flight ([`complete_flush`](PartitionStore::complete_flush) it first).
    /// A fenced partition refuses with [`StoreError::Fenced`]. A failed
    /// write or fsync once the cut began fences the partition (fail-stop;
    /// the reopen finishes or undoes the cut as above). Open snapshots that
    /// serve the active segment are invalidated (their bytes change).
    pub fn truncate_above(
        &mut self,
        io: &mut impl IoBackend,
        op: u64,
    ) -> Result<ChainPoint, StoreError> {
        self.check_fenced()?;
        self.check_cut(op)?;
        if op == self.chain.last_op {
            return Ok(self.chain);
        }
        self.flush(io)?;
        let cut = self.find_cut(io, op)?;
        tracing::info!(
            partition = self.partition_id,
            op,
            position = cut.position,
            next_offset = cut.chain.next_offset,
            "cutting the log tail"
        );
        let result = self.commit_cut(io, &cut);
        self.fence_on_err(result)?;
        Ok(self.chain)
    }

    /// Tells the store that every op up to `op` is committed (the replica's
    /// commit; not made durable here, see
    /// [`set_vsr`](PartitionStore::set_vsr)): rolls may seal them, and a cut
    /// below `op` is refused. Never moves back.
    pub fn note_commit(&mut self, op: u64) {
        self.commit_noted = self.commit_noted.max(op);
    }

    /// The highest op known committed: durable or noted.
    pub fn commit_known(&self) -> u64 {
        self.sb.vsr.commit.max(self.commit_noted)
    }

    /// With an uncommitted headroom, the op before the active segment:
    /// committed, as a roll seals only committed ops and an install or a
    /// purge starts the active segment after a committed op. 0 without a
    /// headroom (a roll seals whatever fills the segment). The superblock's
    /// commit can lag it (it is written lazily, rolls are not).
    pub fn committed_floor(&self) -> u64 {
        if self.config.uncommitted_headroom_bytes.is_none() {
            return 0;
        }
        self.sb.frontier.active_prev_op
    }

    /// Whether appending a batch of `len_bytes` now rolls the segment first
    /// (a roll flushes, so a caller with a flush in flight completes it
    /// before such an append). Without a headroom: when the batch does not
    /// fit the capacity. With one: when it passes the roll point and every
    /// accepted op is committed; while a flush is in flight the roll waits
    /// for a later append (the batch goes into the headroom), unless the
    /// batch does not fit the capacity, so a caller that waits only for
    /// batches past the capacity never meets a roll with a flush in flight.
    pub fn append_rolls(&self, len_bytes: usize) -> bool {
        let end = self.active.end_position;
        let past = end + len_bytes as u64;
        let fits = past <= self.active.capacity_bytes;
        end > 0
            && past > self.roll_at_bytes()
            && self.seal_allowed()
            && (!fits || self.flushing.is_none())
    }

    /// Why a batch of `len_bytes` that neither fits nor rolls is refused:
    /// larger than an empty segment, or held back by the uncommitted tail.
    pub(super) fn no_room_error(&self, len_bytes: usize) -> StoreError {
        if self.active.end_position == 0 {
            // Only when the segment was created under a smaller segment
            // size than the batch limit allows now.
            return StoreError::BatchTooLarge {
                partition_id: self.partition_id,
                len_bytes,
                max_bytes: self.active.capacity_bytes as usize,
            };
        }
        debug_assert!(!self.seal_allowed());
        StoreError::UncommittedTail {
            partition_id: self.partition_id,
            last_op: self.chain.last_op,
            commit: self.commit_known(),
            capacity_bytes: self.active.capacity_bytes,
        }
    }

    /// Whether the active segment is past its roll point holding ops above
    /// the commit: its roll waits for them to commit, and appends use the
    /// headroom meanwhile. The roll needs every accepted op committed at
    /// once, so a primary should admit no new client ops while this holds
    /// (its pipeline then drains); under a pipeline that never drains the
    /// headroom runs out and appends are refused with
    /// [`StoreError::UncommittedTail`].
    pub fn seal_waits_for_commit(&self) -> bool {
        self.active.end_position > self.roll_at_bytes() && !self.seal_allowed()
    }

    /// The active segment's end past which an append rolls it (when
    /// [`seal_allowed`](Self::seal_allowed)): its capacity less the
    /// configured headroom for uncommitted ops.
    pub(super) fn roll_at_bytes(&self) -> u64 {
        let headroom = self.config.uncommitted_headroom_bytes.unwrap_or(0);
        self.active.capacity_bytes.saturating_sub(headroom)
    }

    /// Whether a roll now would seal only committed ops.
    pub(super) fn seal_allowed(&self) -> bool {
        self.config.uncommitted_headroom_bytes.is_none()
            || self.chain.last_op <= self.commit_known()
    }

    /// The refusals that change nothing (see `truncate_above`).
    fn check_cut(&self, op: u64) -> Result<(), StoreError> {
        let refuse = |source| {
            Err(StoreError::Cut {
                partition_id: self.partition_id,
                source,
            })
        };
        let commit = self.commit_known();
        if op < commit {
            return refuse(CutError::BelowCommit { op, commit });
        }
        if op > self.chain.last_op {
            return refuse(CutError::AboveEnd {
                op,
                last_op: self.chain.last_op,
            });
        }
        if op < self.active.prev_op {
            return refuse(CutError::IntoSealed {
                op,
                sealed_last_op: self.active.prev_op,
            });
        }
        if self.flushing.is_some() {
            return refuse(CutError::FlushInFlight);
        }
        Ok(())
    }

    /// Walks the durable active segment to the first batch above `op`.
    fn find_cut(&mut self, io: &mut impl IoBackend, op: u64) -> Result<CutPoint, StoreError> {
        debug_assert_eq!(self.active.end_position, self.active.durable_position);
        let active = &self.active;
        let mut chain = ChainPoint {
            next_offset: active.base_offset,
            last_checksum: active.prev_checksum,
            last_op: active.prev_op,
        };
        let mut tail_from = TailFrom { position: 0, chain };
        let buf = self.pool.take_read(SCAN_CHUNK_BYTES);
        let mut walker = Walker::with_buf(active.file, SCAN_CHUNK_BYTES, buf);
        let walked = walker.walk_until(
            io,
            0,
            active.durable_position,
            |h| h.vsr_op > op,
            |position, view| {
                let h = view.header();
                tail_from.observe(position, view.as_bytes().len(), &chain);
                chain = ChainPoint {
                    next_offset: h.next_offset(),
                    last_checksum: h.header_checksum,
                    last_op: h.vsr_op,
                };
                Visit::Continue
            },
        );
        self.pool.put_read(walker.into_buf());
        let path = segment::log_path(&self.generation_dir, active.base_offset);
        let (position, stop) =
            walked.map_err(|e| StoreError::io(self.partition_id, "read", &path, e))?;
        match stop {
            WalkStop::Visitor => Ok(CutPoint {
                position,
                chain,
                tail_from,
            }),
            // Every batch below the durable end verified at open or append:
            // not finding the op there is damage.
            other => Err(StoreError::Corruption {
                partition_id: self.partition_id,
                segment: path,
                position,
                detail: format!("no batch above op {op} below the durable end ({other:?})"),
            }),
        }
    }

    /// Steps 1 to 3 (see the module docs), then the in-memory state rebuilt
    /// from disk as an open would. Any error leaves memory and disk out of
    /// step: the caller fences.
    fn commit_cut(&mut self, io: &mut impl IoBackend, cut: &CutPoint) -> Result<(), StoreError> {
        let active = &self.active;
        let file_bytes = io.file_size(active.file).map_err(|e| {
            let path = segment::log_path(&self.generation_dir, active.base_offset);
            StoreError::io(self.partition_id, "stat", path, e)
        })?;
        // One block more: a flush's trailer may take a block past its data
        // (see `segment::trailer_write_end`).
        let zero_end = (align_up(active.end_position)
            + self.config.write_buffer_bytes as u64
            + BLOCK_SIZE as u64)
            .min(active.capacity_bytes)
            .min(align_up(file_bytes));
        debug_assert!(cut.position < active.end_position && active.end_position <= zero_end);
        // The cut block's bytes below the cut are written back: verified
        // ones, read before anything is written.
        let path = segment::log_path(&self.generation_dir, active.base_offset);
        let head = verified_tail(
            io,
            self.partition_id,
            (&path, active.file),
            cut.tail_from,
            (cut.position, &cut.chain),
            &self.pool,
        )?;
        let mut next = self.sb.successor();
        next.frontier = self.frontier_now();
        next.frontier.next_offset = cut.chain.next_offset;
        next.frontier.last_checksum = cut.chain.last_checksum;
        next.frontier.last_op = cut.chain.last_op;
        next.frontier.active_position = cut.position;
        // Past the sequence in effect: flush trailers carry that one, so
        // every slot record and trailer written before the cut is void.
        next.frontier.slot_floor = active.slot_sequence + 1;
        next.frontier.cut_pending_end = zero_end;
        self.write_superblock_copies(io, &next, &half_for(next.sequence))?;
        self.sb = next;
        self.invalidate_active_snapshots(cut.position);
        // Cut batches leave the read cache: other bytes may follow there.
        self.pool.cache_cut(self.cache_key, cut.chain.next_offset);
        self.finish_cut(io, &head)?;
        // The kept log as recovery sees it: index, checksums, tail block.
        let (active, chain) = recover_active(
            io,
            self.partition_id,
            &self.generation_dir,
            &self.sb,
            (&self.config, &self.pool),
        )?;
        if chain != cut.chain {
            return Err(StoreError::Corruption {
                partition_id: self.partition_id,
                segment: segment::log_path(&self.generation_dir, active.base_offset),
                position: active.end_position,
                detail: format!("the log reads {chain:?} after a cut to {:?}", cut.chain),
            });
        }
        let old = std::mem::replace(&mut self.active, active);
        io.close(old.file);
        if let Some(buf) = old.pending {
            self.pool.put_write(buf);
        }
        self.chain = chain;
        self.durable = chain;
        Ok(())
    }

    /// Steps 2 and 3 of the cut the superblock records as pending: zeros
    /// over `[active_position, cut_pending_end)` (the bytes below the cut in
    /// its block kept), an fdatasync, then the superblock without the
    /// pending mark. `head` is the cut block's bytes below the cut, from a
    /// verified read (`verified_tail`). Also run by `open` when a crash
    /// interrupted a cut.
    pub(super) fn finish_cut(
        &mut self,
        io: &mut impl IoBackend,
        head: &[u8],
    ) -> Result<(), StoreError> {
        let f = self.sb.frontier;
        debug_assert!(f.cut_pending_end > f.active_position);
        let pid = self.partition_id;
        let file = self.active.file;
        let path = segment::log_path(&self.generation_dir, f.active_base);
        let start = align_down(f.active_position);
        if head.len() as u64 != f.active_position - start {
            return Err(StoreError::Corruption {
                partition_id: pid,
                segment: path,
                position: f.active_position,
                detail: format!(
                    "a cut here keeps {} bytes of its block, {} given",
                    f.active_position - start,
                    head.len()
                ),
            });
        }
        let buf = self.pool.take_write(self.config.write_buffer_bytes);
        let (zeroed, buf) = zero_range(io, file, (start, f.cut_pending_end), (head, buf));
        if let Some(buf) = buf {
            self.pool.put_write(buf);
        }
        zeroed
            .and_then(|()| submit_checked(io, vec![Sqe::new(Op::Fdatasync { file })]).map(|_| ()))
            .map_err(|(kind, e)| StoreError::io(pid, kind, &path, e))?;
        let mut next = self.sb.successor();
        next.frontier.cut_pending_end = 0;
        self.write_superblock_copies(io, &next, &half_for(next.sequence))?;
        self.sb = next;
        Ok(())
    }
}

/// Writes `[start, end)` of `file`: `head`, then zeros. One buffer's worth
/// (`buf`, a pool write buffer) at a time, each its own submission, so a cut
/// takes one buffer of memory however long the tail. Returns the first
/// failure, and the buffer unless a write failed.
fn zero_range(
    io: &mut impl IoBackend,
    file: FileId,
    (start, end): (u64, u64),
    (head, mut buf): (&[u8], AlignedBuf),
) -> (
    Result<(), (&'static str, std::io::Error)>,
    Option<AlignedBuf>,
) {
    debug_assert!(start.is_multiple_of(BLOCK_SIZE as u64) && end.is_multiple_of(BLOCK_SIZE as u64));
    let piece_max = buf.capacity() as u64;
    let mut at = start;
    while at < end {
        let len = piece_max.min(end - at) as usize;
        buf.set_len(len);
        buf.full_mut()[..len].fill(0);
        if at == start {
            buf[..head.len()].copy_from_slice(head);
        }
        let write = Op::Write {
            file,
            offset: at,
            buf,
        };
        match submit_checked(io, vec![Sqe::new(write)]) {
            Ok(mut done) => {
                buf = done
                    .pop()
                    .and_then(|c| c.op.into_buf())
                    .unwrap_or_else(|| AlignedBuf::new(piece_max as usize));
            }
            Err(failed) => return (Err(failed), None),
        }
        at += len as u64;
    }
    (Ok(()), Some(buf))
}
