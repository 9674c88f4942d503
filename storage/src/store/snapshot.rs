//! Serving snapshots for state transfer.
//!
//! A snapshot is the partition's durable log at one instant: its sealed
//! segments plus the durable prefix of the active segment, described in a
//! [`Manifest`] with the checksums and chunk checksums computed as the bytes
//! were written (nothing is rehashed). The active segment is not sealed, so
//! a snapshot costs no segment, table entry or file: bytes below the durable
//! end never change (a flush rewrites the tail block with the same prefix),
//! and the lease keeps that prefix's length and chunk checksums, so its
//! chunks read as offered even after the segment rolled. Chunks are read
//! from the live segment files with O_DIRECT while appends go on. Until the
//! snapshot is
//! released or its lease runs out, retention will not remove its segments and
//! purge is refused. An install replaces the whole log: it invalidates the
//! open snapshots (their reads return [`TransferError::SnapshotGone`]) rather
//! than wait for their leases, as a lagging replica must catch up first.

use ringlog_protocol::checksum;
use ringlog_protocol::manifest::{Artifact, ArtifactKind, Manifest};

use std::path::PathBuf;

use super::{PartitionStore, StoreError, TransferError};
use crate::io::{align_up, AlignedBuf, BatchId, BufPool, Completion, FileId, IoBackend, Op, Sqe};
use crate::segment;
use crate::superblock::SealedSegment;

/// An open snapshot: the base offsets of the segments it pins.
pub(super) struct Lease {
    id: u64,
    bases: Vec<u64>,
    /// The active segment's prefix it serves, if any (its last artifact).
    tail: Option<TailPrefix>,
    expires_at_ms: u64,
    /// The segments it described were replaced by an install.
    gone: bool,
}

/// The part of the then active segment a snapshot describes.
struct TailPrefix {
    base_offset: u64,
    length_bytes: u64,
    chunk_checksums: Vec<u64>,
}

/// One chunk read planned: where, how long, what it must hash to.
#[derive(Debug)]
struct ChunkRead {
    file: FileId,
    base_offset: u64,
    chunk: u32,
    offset: u64,
    len: usize,
    expected: u64,
}

impl PartitionStore {
    /// Opens a snapshot of everything durable and returns its manifest,
    /// flushing what was accepted first (blocking: for tools and tests).
    /// `now_ms` is the caller's clock, for the lease.
    pub fn open_snapshot(
        &mut self,
        io: &mut impl IoBackend,
        now_ms: u64,
    ) -> Result<Manifest, StoreError> {
        self.check_snapshot_room(now_ms)?;
        // Everything accepted becomes durable, so the active segment's
        // hasher covers exactly the prefix offered; a group-commit flush in
        // flight must complete first.
        if self.flushing.is_some() {
            return Err(self.transfer_error(TransferError::Busy));
        }
        self.flush(io)?;
        self.lease_snapshot(None, now_ms)
    }

    /// Opens a snapshot of the committed log and returns its manifest, with
    /// no I/O (a replica serves this way from its shard thread): the sealed
    /// segments (a roll seals only committed ops), and the active segment's
    /// durable prefix if every op accepted there is at or below `commit`.
    /// The manifest's commit is the highest of `commit`, the superblock's
    /// and [`PartitionStore::committed_floor`]. Refused with
    /// [`TransferError::Busy`] while a fully committed tail is not durable
    /// yet, and [`TransferError::NoCommittedPrefix`] when the sealed log
    /// ends above the commit (only without an uncommitted headroom).
    pub fn open_committed_snapshot(
        &mut self,
        commit: u64,
        now_ms: u64,
    ) -> Result<Manifest, StoreError> {
        self.check_snapshot_room(now_ms)?;
        let commit = commit.max(self.sb.vsr.commit).max(self.committed_floor());
        self.lease_snapshot(Some(commit), now_ms)
    }

    fn check_snapshot_room(&mut self, now_ms: u64) -> Result<(), StoreError> {
        self.check_fenced()?;
        self.expire_snapshots(now_ms);
        if self.snapshots.len() >= self.config.snapshots_max {
            return Err(self.transfer_error(TransferError::TooManySnapshots {
                open: self.snapshots.len(),
            }));
        }
        Ok(())
    }

    /// Leases the sealed segments and, unless `commit` cuts it, the active
    /// segment's durable prefix; `commit` None offers everything durable.
    fn lease_snapshot(&mut self, commit: Option<u64>, now_ms: u64) -> Result<Manifest, StoreError> {
        let active = &self.active;
        let tail_kept = active.end_position > 0 && commit.is_none_or(|c| self.chain.last_op <= c);
        if tail_kept && (active.durable_position < active.end_position || self.flushing.is_some()) {
            return Err(self.transfer_error(TransferError::Busy));
        }
        let (next_offset, last_op, last_checksum) = if tail_kept {
            let d = &self.durable;
            (d.next_offset, d.last_op, d.last_checksum)
        } else {
            (active.base_offset, active.prev_op, active.prev_checksum)
        };
        if let Some(commit) = commit.filter(|&c| c < last_op) {
            return Err(self.transfer_error(TransferError::NoCommittedPrefix { last_op, commit }));
        }
        let commit = commit.unwrap_or(self.sb.vsr.commit);
        let mut artifacts: Vec<Artifact> = self
            .sealed
            .iter()
            .map(|s| segment_artifact(&s.meta, s.chunk_checksums.clone()))
            .collect();
        let tail = tail_kept.then(|| {
            debug_assert_eq!(active.durable_position, active.end_position);
            let chunk_checksums = active.hasher.chunk_checksums();
            let meta = self.durable_active_meta();
            artifacts.push(segment_artifact(&meta, chunk_checksums.clone()));
            TailPrefix {
                base_offset: active.base_offset,
                length_bytes: active.durable_position,
                chunk_checksums,
            }
        });
        debug_assert!(artifacts.last().is_none_or(|a| a.end_offset == next_offset));
        self.snapshot_seq += 1;
        // Unique across restarts too: the clock moves on, the sequence
        // separates snapshots opened in the same millisecond.
        let id = (now_ms << 16) | (self.snapshot_seq & 0xFFFF);
        self.snapshots.push(Lease {
            id,
            bases: artifacts.iter().map(|a| a.base_offset).collect(),
            tail,
            expires_at_ms: now_ms.saturating_add(self.config.snapshot_lease_ms),
            gone: false,
        });
        Ok(Manifest {
            partition_id: self.partition_id,
            view: self.sb.vsr.view,
            commit,
            next_offset,
            last_op,
            last_checksum,
            purge_generation: self.sb.purge_generation,
            snapshot_id: id,
            chunk_size_bytes: self.config.transfer_chunk_bytes,
            artifacts,
        })
    }

    /// Reads chunk `chunk` of artifact `artifact` of snapshot `id`; see
    /// [`read_chunks`](PartitionStore::read_chunks).
    pub fn read_chunk(
        &mut self,
        io: &mut impl IoBackend,
        id: u64,
        artifact: u32,
        chunk: u32,
        now_ms: u64,
    ) -> Result<AlignedBuf, StoreError> {
        let mut bufs = self.read_chunks(io, id, &[(artifact, chunk)], now_ms)?;
        bufs.pop()
            .ok_or_else(|| self.transfer_error(TransferError::ChunkOutOfRange { artifact, chunk }))
    }

    /// Reads a window of chunks of snapshot `id` in one submission, each
    /// verified against its recorded checksum, and renews the lease. Each
    /// buffer's length is its chunk's length.
    pub fn read_chunks(
        &mut self,
        io: &mut impl IoBackend,
        id: u64,
        chunks: &[(u32, u32)],
        now_ms: u64,
    ) -> Result<Vec<AlignedBuf>, StoreError> {
        let plan = self.plan_window(id, chunks, now_ms)?;
        let mut fresh = |len| AlignedBuf::new(len);
        let sqes = read_sqes(&plan, &mut fresh);
        let reads = ChunkReads {
            partition_id: self.partition_id,
            generation_dir: self.generation_dir.clone(),
            plan,
            batch: None,
        };
        reads.finish(io.submit(sqes))
    }

    /// [`read_chunks`](PartitionStore::read_chunks) without waiting: the
    /// window's reads are queued on the ring in one batch (into buffers of
    /// `pool`) and the caller hands the batch's completions, once reaped,
    /// to [`ChunkReads::finish`]. A serving peer reads its next window this
    /// way while the earlier chunks are on the wire and being written.
    ///
    /// The lease is renewed now; the segments stay pinned until it ends. A
    /// read in flight when an install replaces the log (or retention
    /// removes an unpinned segment) still completes (the ring holds the
    /// file); its checksum then decides.
    pub fn start_read_chunks(
        &mut self,
        io: &mut impl IoBackend,
        id: u64,
        chunks: &[(u32, u32)],
        now_ms: u64,
        pool: &mut BufPool,
    ) -> Result<ChunkReads, StoreError> {
        let plan = self.plan_window(id, chunks, now_ms)?;
        let sqes = read_sqes(&plan, &mut |len| pool.get(len));
        let batch = io.submit_nowait(sqes);
        Ok(ChunkReads {
            partition_id: self.partition_id,
            generation_dir: self.generation_dir.clone(),
            plan,
            batch: Some(batch),
        })
    }

    /// Checks snapshot `id` and renews its lease, then plans the reads of
    /// `chunks`.
    fn plan_window(
        &mut self,
        id: u64,
        chunks: &[(u32, u32)],
        now_ms: u64,
    ) -> Result<Vec<ChunkRead>, StoreError> {
        self.check_fenced()?;
        self.expire_snapshots(now_ms);
        let lease_ms = self.config.snapshot_lease_ms;
        let Some(li) = self.snapshots.iter().position(|l| l.id == id) else {
            return Err(self.transfer_error(TransferError::UnknownSnapshot { id }));
        };
        let lease = &mut self.snapshots[li];
        lease.expires_at_ms = now_ms.saturating_add(lease_ms);
        if lease.gone {
            return Err(self.transfer_error(TransferError::SnapshotGone { id }));
        }
        let mut plan = Vec::with_capacity(chunks.len());
        for &(artifact, chunk) in chunks {
            match self.plan_chunk(&self.snapshots[li], artifact, chunk) {
                Ok(read) => plan.push(read),
                Err(e) => return Err(self.transfer_error(e)),
            }
        }
        Ok(plan)
    }

    /// Where chunk `chunk` of the lease's artifact `artifact` is and what
    /// it must hash to.
    fn plan_chunk(
        &self,
        lease: &Lease,
        artifact: u32,
        chunk: u32,
    ) -> Result<ChunkRead, TransferError> {
        let out_of_range = TransferError::ChunkOutOfRange { artifact, chunk };
        let base_offset = *lease
            .bases
            .get(artifact as usize)
            .ok_or_else(|| out_of_range.clone())?;
        // Pinned segments stay in the table while the lease is live, so a
        // miss means the log changed under it: typed, never a panic.
        let gone = TransferError::SnapshotGone { id: lease.id };
        let sealed = || {
            self.sealed
                .binary_search_by_key(&base_offset, |s| s.meta.base_offset)
                .map(|i| &self.sealed[i])
                .map_err(|_| gone.clone())
        };
        let (file, length_bytes, sums) =
            match lease.tail.as_ref().filter(|t| t.base_offset == base_offset) {
                // The served prefix, in the active segment or (rolled since)
                // the sealed one that started at the same offset.
                Some(t) if self.active.base_offset == base_offset => {
                    (self.active.file, t.length_bytes, &t.chunk_checksums)
                }
                Some(t) => (sealed()?.file, t.length_bytes, &t.chunk_checksums),
                None => {
                    let s = sealed()?;
                    (s.file, s.meta.length_bytes, &s.chunk_checksums)
                }
            };
        let expected = *sums.get(chunk as usize).ok_or(out_of_range)?;
        let offset = u64::from(chunk) * u64::from(self.config.transfer_chunk_bytes);
        let len = u64::from(self.config.transfer_chunk_bytes)
            .min(length_bytes.saturating_sub(offset)) as usize;
        Ok(ChunkRead {
            file,
            base_offset,
            chunk,
            offset,
            len,
            expected,
        })
    }

    /// Snapshots open now (gone ones too, until released or expired).
    pub fn snapshots_open(&self) -> usize {
        self.snapshots.len()
    }

    /// Ends a snapshot, unpinning its segments.
    pub fn release_snapshot(&mut self, id: u64) {
        self.snapshots.retain(|l| l.id != id);
    }

    /// Marks every open snapshot gone: the log they describe is being
    /// replaced. They stay (counted against `snapshots_max`) until released
    /// or expired, so their readers get a typed answer.
    pub(super) fn invalidate_snapshots(&mut self) {
        for lease in &mut self.snapshots {
            lease.gone = true;
        }
    }

    /// Marks gone the snapshots serving active segment bytes at or past
    /// `position` (a tail cut there changes them).
    pub(super) fn invalidate_active_snapshots(&mut self, position: u64) {
        let base = self.active.base_offset;
        for lease in &mut self.snapshots {
            let served_past = lease
                .tail
                .as_ref()
                .is_some_and(|t| t.base_offset == base && t.length_bytes > position);
            lease.gone |= served_past;
        }
    }

    /// Drops snapshots whose lease ran out.
    pub fn expire_snapshots(&mut self, now_ms: u64) {
        self.snapshots.retain(|l| l.expires_at_ms >= now_ms);
    }

    /// Whether an open snapshot pins the segment starting at `base_offset`.
    pub(super) fn is_pinned(&self, base_offset: u64) -> bool {
        self.snapshots
            .iter()
            .any(|l| !l.gone && l.bases.contains(&base_offset))
    }

    /// Refuses a purge while snapshots are open (a gone one pins nothing).
    pub(super) fn check_unpinned(&self) -> Result<(), StoreError> {
        let open = self.snapshots.iter().filter(|l| !l.gone).count();
        if open == 0 {
            return Ok(());
        }
        Err(self.transfer_error(TransferError::Pinned { open }))
    }

    pub(super) fn transfer_error(&self, source: TransferError) -> StoreError {
        StoreError::Transfer {
            partition_id: self.partition_id,
            source,
        }
    }
}

/// A window of chunk reads queued by
/// [`PartitionStore::start_read_chunks`], to be finished with its batch's
/// completions.
#[derive(Debug)]
pub struct ChunkReads {
    partition_id: u32,
    generation_dir: PathBuf,
    plan: Vec<ChunkRead>,
    /// None for a window read by a blocking submit.
    batch: Option<BatchId>,
}

impl ChunkReads {
    /// The ring batch holding the reads.
    pub fn batch(&self) -> Option<BatchId> {
        self.batch
    }

    /// Chunks in the window.
    pub fn len(&self) -> usize {
        self.plan.len()
    }

    pub fn is_empty(&self) -> bool {
        self.plan.is_empty()
    }

    /// Checks every completion of the window (in submission order, as a
    /// backend returns them) and each chunk against its recorded checksum;
    /// each buffer's length is its chunk's length.
    pub fn finish(self, completions: Vec<Completion>) -> Result<Vec<AlignedBuf>, StoreError> {
        if completions.len() != self.plan.len() {
            let path = self.generation_dir.clone();
            let e = std::io::Error::other(format!(
                "{} completions for {} chunk reads",
                completions.len(),
                self.plan.len()
            ));
            return Err(StoreError::io(self.partition_id, "read", path, e));
        }
        let mut bufs = Vec::with_capacity(self.plan.len());
        for (c, r) in completions.into_iter().zip(&self.plan) {
            let (chunk, offset, len) = (r.chunk, r.offset, r.len);
            let path = segment::log_path(&self.generation_dir, r.base_offset);
            let n = c
                .result
                .map_err(|e| StoreError::io(self.partition_id, "read", &path, e))?;
            let corrupt = |detail: String| StoreError::Corruption {
                partition_id: self.partition_id,
                segment: path.clone(),
                position: offset,
                detail,
            };
            let Some(mut buf) = c.op.into_buf() else {
                return Err(corrupt(format!("chunk {chunk}: read returned no buffer")));
            };
            if n < len || checksum(&buf[..len]) != r.expected {
                return Err(corrupt(format!(
                    "chunk {chunk} does not match its recorded checksum"
                )));
            }
            buf.set_len(len);
            bufs.push(buf);
        }
        Ok(bufs)
    }
}

/// One read per planned chunk, into a buffer from `buf_for(len)`; whole
/// blocks (O_DIRECT), the chunk's checksum covers its length only.
fn read_sqes(plan: &[ChunkRead], buf_for: &mut impl FnMut(usize) -> AlignedBuf) -> Vec<Sqe> {
    plan.iter()
        .map(|r| {
            let buf = buf_for(r.len);
            let len = align_up(r.len as u64) as usize;
            debug_assert!(buf.capacity() >= len, "a read buffer holds its chunk");
            Sqe::new(Op::Read {
                file: r.file,
                offset: r.offset,
                len,
                buf,
            })
        })
        .collect()
}

/// A segment table entry as a manifest artifact.
fn segment_artifact(meta: &SealedSegment, chunk_checksums: Vec<u64>) -> Artifact {
    Artifact {
        kind: ArtifactKind::Segment,
        base_offset: meta.base_offset,
        end_offset: meta.end_offset,
        length_bytes: meta.length_bytes,
        checksum: meta.checksum,
        last_batch_checksum: meta.last_batch_checksum,
        max_timestamp_ms: meta.max_timestamp_ms,
        chunk_checksums,
    }
}
