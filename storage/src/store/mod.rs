//! The partition store: one partition's log on disk.
//!
//! Layout of a partition directory:
//! ```text
//! superblock                      the commit point (see crate::superblock)
//! gen-<generation:020>/           the live generation: segments + indexes
//!     <base_offset:020>.log
//!     <base_offset:020>.idx       sealed segments only
//!     segments-<id:020>.tbl       the segment table (see `table.rs`)
//! recycle/                        unreferenced segment files kept for reuse
//! ```
//! Only the superblock defines state: files it does not reference are
//! garbage, cleaned (or recycled) at open.
//!
//! Write path: [`PartitionStore::append`] checks a batch (its offsets were
//! assigned by the caller: base offset and hash chain must continue the log)
//! (verifying its body checksum, once) and copies it into an aligned write
//! buffer that starts at the block holding the durable end, so the partially
//! filled tail block is rewritten with each flush and small batches waste no
//! disk; the segment's transfer checksums are computed from that copy while
//! it is in cache. A flush is one write and one fdatasync, linked;
//! [`flush_all`] submits the flushes of many partitions in one ring
//! submission (group commit). An append is durable, and may be acknowledged,
//! once a flush that covers it completed. Appends may go on while a flush is
//! in flight, except one that would have to flush first (see
//! [`PartitionStore::append_waits_for_flush`]).
//!
//! Disk grows with data: a segment file is created empty and grows by
//! fallocate in steps ahead of the write position (see
//! [`allocation_target`]); running out of space refuses the append with
//! [`StoreError::DiskFull`] and changes nothing. Write buffers, the read
//! buffer and recycled files come from a [`StorePool`] shared by a shard's
//! partitions, so an idle partition holds no buffer.
//!
//! The superblock's frontier is a checkpoint, written at seal, purge,
//! retention and close, not on every flush. Between checkpoints the durable
//! frontier is recorded in the active segment file itself: each flush's
//! data write carries a trailer in its padding (the durable end the
//! previous flush's completed fdatasync made durable, and its own end), and
//! every [`FRONTIER_SLOT_EVERY_FLUSHES`]-th flush also writes a frontier
//! record slot in its chain, so a flush costs one write and one fdatasync.
//! Recovery verifies every batch below the newest record and may drop as
//! torn only what no record or trailer shows acknowledged (the bound is
//! stated in `open.rs`).
//!
//! VSR: [`PartitionStore::truncate_above`] cuts the uncommitted tail of the
//! active segment durably, and with `uncommitted_headroom_bytes` a roll
//! seals only committed ops (see `truncate.rs`).

mod cache;
mod config;
mod error;
mod group;
mod install;
mod open;
mod pool;
mod read;
mod readahead;
mod retention;
mod snapshot;
mod spare;
mod table;
mod truncate;
mod verify;
mod walk;

use std::path::{Path, PathBuf};

use ringlog_protocol::{BatchHeader, BatchView, VerifiedBatch};

pub use cache::ReadCacheStats;
pub use config::StoreConfig;
pub use error::{AppendRefused, CutError, StoreError, TransferError};
pub use group::flush_all;
pub use install::{
    BeginStep, Beginning, ChunkCheck, FinishStep, Finishing, Install, InstallBudget, Step,
};
pub use pool::{PoolConfig, StorePool, PRIVATE_READ_CACHE_BYTES_MAX};
pub use read::Fetched;
pub use readahead::ReadAheadStats;
pub use retention::RetentionOutcome;
pub use snapshot::ChunkReads;
pub use spare::SPARE_FILE;

use crate::io::{
    align_down, align_up, AlignedBuf, BatchBuf, Completion, FileId, IoBackend, Op, OpenMode, Sqe,
    BLOCK_SIZE,
};
use crate::journal::{Journal, JournalKey};
use crate::segment::{self, FlushTrailer, FrontierSlot, SealedIndex, SegmentHasher, SparseIndex};
use crate::superblock::{
    half_for, Frontier, SealedSegment, Superblock, VsrState, COPIES, COPY_SIZE_BYTES,
};

/// Name of the superblock file in a partition directory.
pub const SUPERBLOCK_FILE: &str = "superblock";
const RECYCLE_DIR: &str = "recycle";
/// Where an install stages the next generation (one install at a time).
const STAGING_DIR: &str = "staging";
/// A segment file grows at least this much at a time...
const ALLOCATION_STEP_MIN_BYTES: u64 = 64 * 1024;
/// ...and at most this much: a step is the data already in the segment,
/// clamped to these bounds, so a nearly empty partition reserves little and
/// a busy one calls fallocate about once per 8 MiB.
const ALLOCATION_STEP_MAX_BYTES: u64 = 8 * 1024 * 1024;
/// An append copies a batch into the write buffer and hashes the copy in
/// pieces this large: small enough to stay in a core's cache between the
/// two (see [`copy_hashed`]).
const COPY_PIECE_BYTES: usize = 32 * 1024;
/// Every this many flushes of the active segment, the flush also writes a
/// frontier record slot (linked before its fdatasync); the others carry
/// their record in a trailer inside their data write (see `open.rs`).
pub const FRONTIER_SLOT_EVERY_FLUSHES: u64 = 32;
/// A journaled flush writes zeros this far ahead of its data (within the
/// allocation), so the small writes that follow overwrite written blocks:
/// an O_DIRECT write into a fallocated (unwritten) extent cannot complete
/// without waiting (ext4 converts the extent), so io_uring hands it to a
/// worker thread, about one small write in four at 1 KiB batches.
pub const ZERO_AHEAD_BYTES: u64 = 256 * 1024;

/// Where the log ends: the next offset and the hash chain anchor.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChainPoint {
    pub next_offset: u64,
    pub last_checksum: u64,
    pub last_op: u64,
}

/// What an append was given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Appended {
    pub base_offset: u64,
    pub next_offset: u64,
}

struct SealedFile {
    meta: SealedSegment,
    file: FileId,
    index: SparseIndex,
    /// Per-chunk xxh3 (chunks of `transfer_chunk_bytes`), for state transfer.
    chunk_checksums: Vec<u64>,
    /// Whether the `.idx` file holds this index (it is written off the
    /// append path; a missing one is rebuilt at open).
    index_persisted: bool,
}

/// A segment file made ready to be the active segment.
#[derive(Clone, Copy, Debug)]
pub(super) struct Provisioned {
    pub(super) file: FileId,
    /// Reserved from offset 0 up to here already (see `reserve`).
    pub(super) allocated_bytes: u64,
}

struct ActiveSegment {
    base_offset: u64,
    file: FileId,
    /// Chain anchor before this segment's first batch.
    prev_checksum: u64,
    /// VSR op of the batch before this segment's first batch.
    prev_op: u64,
    /// Whole and per-chunk xxh3 over `[0, end_position)`, so sealing never
    /// rereads the segment.
    hasher: SegmentHasher,
    index: SparseIndex,
    max_timestamp_ms: u64,
    /// End of the accepted bytes (durable or not).
    end_position: u64,
    /// End of the bytes a completed fdatasync covers.
    durable_position: u64,
    /// Bytes `[align_down(flushing or durable end), end_position)`, in a
    /// write buffer taken from the pool on the first append after a flush.
    /// None while nothing was appended since: the partially filled tail
    /// block is then in `tail`.
    pending: Option<AlignedBuf>,
    /// `[align_down(flushing or durable end), that end)` while `pending` is
    /// None: under a block, copied into the next write buffer.
    tail: Vec<u8>,
    /// The file is known to be allocated (fallocate or written) up to
    /// here; 0 until the first append's fallocate.
    allocated_bytes: u64,
    /// Blocks below here were written by this store (data or zeros ahead):
    /// a write there needs no extent conversion. 0 when unknown.
    overwrite_end: u64,
    /// Size bound of the data, fixed when the segment was created (from
    /// the superblock at open, never from the current configuration); the
    /// frontier record slots follow it.
    capacity_bytes: u64,
    /// Frontier records written into this segment so far; the next one
    /// goes to slot `slot_sequence % 3`, never over the last two written.
    slot_sequence: u64,
    /// Records below this sequence are void (written before a tail cut).
    slot_floor: u64,
    /// Flushes since the last one that wrote a slot record (see
    /// [`FRONTIER_SLOT_EVERY_FLUSHES`]).
    flushes_since_slot: u64,
    /// The segment's random trailer nonce (from the superblock frontier).
    nonce: u64,
    /// The position the newest frontier record known durable (superblock
    /// or slot) names: recovery verifies every batch below it.
    recorded_position: u64,
}

/// A flush (or frontier checkpoint) submitted but not completed.
struct Flushing {
    end_position: u64,
    chain: ChainPoint,
    /// The position its frontier record names, if it writes one (linked
    /// before the fdatasync, so durable once that completed).
    record: Option<u64>,
}

pub struct PartitionStore {
    partition_id: u32,
    config: StoreConfig,
    dir: PathBuf,
    /// The last state made durable.
    sb: Superblock,
    generation_dir: PathBuf,
    sealed: Vec<SealedFile>,
    active: ActiveSegment,
    /// Accepted (not necessarily durable) end of the log.
    chain: ChainPoint,
    /// Durable end of the log.
    durable: ChainPoint,
    flushing: Option<Flushing>,
    /// The frontier record's block buffer, reused by every flush.
    slot_buf: Option<AlignedBuf>,
    /// Write and read buffers, the read cache and recycled segment files
    /// (the shard's).
    pool: StorePool,
    /// This store instance's key in the pool's read cache.
    cache_key: u64,
    /// Set on the first write or fsync failure: fail-stop.
    fenced: Option<String>,
    /// Set when a read found durable bytes that fail verification (see
    /// [`PartitionStore::corruption_seen`]); cleared by a new generation
    /// (an install or a purge).
    corruption_seen: Option<String>,
    /// Snapshots being served; their segments are pinned.
    snapshots: Vec<snapshot::Lease>,
    /// Distinguishes snapshots opened in the same millisecond.
    snapshot_seq: u64,
    /// The install being staged, if any (at most one at a time).
    installing: Option<install::InstallSlot>,
    /// The highest op the replica said is committed (not durable; see
    /// `note_commit`).
    commit_noted: u64,
    /// Segment bytes were written behind the journal (no fdatasync of the
    /// segment yet): fdatasync before any superblock write or direct flush
    /// claims them (see [`PartitionStore::sync_behind`]).
    behind: bool,
    /// The next segment, prepared ahead of the roll (see `spare.rs`).
    spare: spare::Spare,
    /// The active segment's reservation ahead in flight (see `spare.rs`).
    reserving: Option<spare::ReserveAhead>,
}

impl PartitionStore {
    /// Creates an empty partition in `dir`, which must not exist, with a
    /// private pool (see [`StorePool`]).
    pub fn create(
        io: &mut impl IoBackend,
        dir: &Path,
        partition_id: u32,
        config: StoreConfig,
    ) -> Result<Self, StoreError> {
        let pool = StorePool::private(dir, &config);
        Self::create_in(io, dir, partition_id, config, pool)
    }

    /// Creates an empty partition in `dir`, which must not exist, drawing
    /// on `pool`. Its segment file starts empty: nothing is preallocated.
    pub fn create_in(
        io: &mut impl IoBackend,
        dir: &Path,
        partition_id: u32,
        config: StoreConfig,
        pool: StorePool,
    ) -> Result<Self, StoreError> {
        config.validate()?;
        let pid = partition_id;
        let exists = io
            .exists(dir)
            .map_err(|e| StoreError::io(pid, "stat", dir, e))?;
        if exists {
            return Err(StoreError::AlreadyExists { path: dir.into() });
        }
        io.create_dir(dir)
            .map_err(|e| StoreError::io(pid, "mkdir", dir, e))?;
        let recycle = dir.join(RECYCLE_DIR);
        if pool.recycle_dir() == recycle {
            io.create_dir(&recycle)
                .map_err(|e| StoreError::io(pid, "mkdir", &recycle, e))?;
        }
        let generation = 1;
        let generation_dir = segment::generation_dir(dir, generation);
        io.create_dir(&generation_dir)
            .map_err(|e| StoreError::io(pid, "mkdir", &generation_dir, e))?;
        let active_path = segment::log_path(&generation_dir, 0);
        let active_file = create_segment_file(io, pid, &active_path, 0)?;
        let table = table::write_fresh(io, pid, &generation_dir, 1, &[])?;
        let sb_path = dir.join(SUPERBLOCK_FILE);
        let sb_file = io
            .open_file(&sb_path, OpenMode::Create)
            .map_err(|e| StoreError::io(pid, "create", &sb_path, e))?;
        io.close(sb_file);
        let sb = Superblock {
            sequence: 1,
            partition_id,
            live_generation: generation,
            table,
            frontier: Frontier {
                active_capacity_bytes: config.segment_size_bytes,
                active_nonce: new_nonce(pid, &active_path)?,
                ..Frontier::default()
            },
            ..Superblock::default()
        };
        let active = ActiveSegment::empty(
            Provisioned {
                file: active_file,
                allocated_bytes: 0,
            },
            ChainPoint::default(),
            (config.transfer_chunk_bytes, config.segment_size_bytes),
            sb.frontier.active_nonce,
        );
        let mut store = PartitionStore {
            partition_id,
            config,
            dir: dir.into(),
            sb: sb.clone(),
            generation_dir: generation_dir.clone(),
            sealed: Vec::new(),
            active,
            chain: ChainPoint::default(),
            durable: ChainPoint::default(),
            flushing: None,
            slot_buf: None,
            cache_key: pool.new_cache_key(),
            pool,
            fenced: None,
            corruption_seen: None,
            snapshots: Vec::new(),
            snapshot_seq: 0,
            installing: None,
            commit_noted: 0,
            behind: false,
            spare: spare::Spare::Absent,
            reserving: None,
        };
        store.sync_dirs(io, &[&generation_dir])?;
        // No earlier state exists: all four copies at once.
        store.write_superblock_copies(io, &sb, &[0, 1, 2, 3])?;
        store.sync_dirs(io, &[dir])?;
        // The partition directory's own name.
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            store.sync_dirs(io, &[parent])?;
        }
        Ok(store)
    }

    pub fn partition_id(&self) -> u32 {
        self.partition_id
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn config(&self) -> &StoreConfig {
        &self.config
    }

    /// The end of the accepted log: the next append's base offset.
    pub fn next_offset(&self) -> u64 {
        self.chain.next_offset
    }

    /// The header checksum the next append's `prev_checksum` must carry.
    pub fn last_checksum(&self) -> u64 {
        self.chain.last_checksum
    }

    /// The accepted end of the log (durable or not).
    pub fn chain(&self) -> ChainPoint {
        self.chain
    }

    /// The durable end of the log: every offset below it may be acknowledged.
    pub fn durable(&self) -> ChainPoint {
        self.durable
    }

    /// The first offset still stored (purge and retention move it up).
    pub fn log_start_offset(&self) -> u64 {
        self.sealed
            .first()
            .map_or(self.active.base_offset, |s| s.meta.base_offset)
    }

    /// The active segment's data capacity: an append that would pass it
    /// rolls the segment first. Fixed when the segment was created, so it
    /// may differ from the configured segment size after a config change.
    pub fn active_capacity_bytes(&self) -> u64 {
        self.active.capacity_bytes
    }

    /// The last durable superblock state.
    pub fn superblock(&self) -> &Superblock {
        &self.sb
    }

    /// The sealed segments, oldest first.
    pub fn sealed_segments(&self) -> impl Iterator<Item = &SealedSegment> {
        self.sealed.iter().map(|s| &s.meta)
    }

    /// What the first read that found a sealed segment failing
    /// verification reported, until a new generation (an install, a purge)
    /// replaced the log: reads keep failing
    /// with [`StoreError::Corruption`] (bad bytes are never skipped), so a
    /// replicated partition replaces its store and installs a good copy
    /// from a peer.
    pub fn corruption_seen(&self) -> Option<&str> {
        self.corruption_seen.as_deref()
    }

    /// The pool the store draws on (the shard's, or its private one).
    pub fn pool(&self) -> &StorePool {
        &self.pool
    }

    /// Why the partition stopped, if it did.
    pub fn fenced(&self) -> Option<&str> {
        self.fenced.as_deref()
    }

    /// Whether the partition holds a write buffer now (only between an
    /// append and the start of the flush that takes it).
    pub fn holds_write_buffer(&self) -> bool {
        self.active.pending.is_some()
    }

    /// Whether an append of `len_bytes` must wait for the flush in flight:
    /// it would have to flush first (the write buffer, which holds the
    /// bytes since the in-flight flush's last block, would overflow, or the
    /// segment rolls), and a partition has one flush at a time. Such an
    /// append is refused with [`StoreError::FlushInFlight`]; false whenever
    /// no flush is in flight.
    pub fn append_waits_for_flush(&self, len_bytes: usize) -> bool {
        self.flushing.is_some()
            && (self.append_rolls(len_bytes)
                || self.active.buffered_len() + len_bytes > self.config.write_buffer_bytes)
    }

    /// Bytes stored: sealed segments plus the active segment's accepted end.
    pub fn size_bytes(&self) -> u64 {
        self.sealed.iter().map(|s| s.meta.length_bytes).sum::<u64>() + self.active.end_position
    }

    /// Accepts a batch whose offsets the caller assigned. Not durable until a
    /// flush covering it completes. May roll the segment first (which
    /// flushes), or flush when the write buffer is full. The batch is copied
    /// into the write buffer; [`PartitionStore::append_owned`] writes a
    /// batch built in place without the copy.
    pub fn append(
        &mut self,
        io: &mut impl IoBackend,
        batch: &[u8],
    ) -> Result<Appended, StoreError> {
        let h = self.admit(io, batch)?;
        self.copy_in(&batch[..h.total_len()]);
        Ok(self.accepted(&h))
    }

    /// [`PartitionStore::append`] of a batch the caller verified already
    /// (the server's replica, before it sequenced it): its body checksum
    /// and records are not checked again, so each byte is hashed once on
    /// its way to disk (the segment's transfer checksums aside). The header
    /// checks (partition, size, offset, chain) are the same.
    pub fn append_verified(
        &mut self,
        io: &mut impl IoBackend,
        batch: VerifiedBatch<&[u8]>,
    ) -> Result<Appended, StoreError> {
        let h = *batch.header();
        self.admit_header(io, &h)?;
        self.copy_in(batch.as_bytes());
        Ok(self.accepted(&h))
    }

    /// [`PartitionStore::append`] of a batch the caller built in place in
    /// an aligned buffer (one lent by [`StorePool::lend_batch`], for
    /// instance), `batch.lead_bytes()` into its block. When that is where
    /// the log ends in its block ([`PartitionStore::batch_lead_bytes`]) and
    /// no other append is waiting for the next flush, the buffer becomes the
    /// write buffer as it is: the partial block before the batch is copied
    /// into its lead, the batch is not copied. Otherwise (a roll moved the
    /// end, another append got there first) the batch is copied, as
    /// `append` does, and the buffer is dropped (a pooled one goes home).
    /// Bytes past the batch's encoded length are ignored. Refused batches
    /// come back with the error, untouched.
    pub fn append_owned(
        &mut self,
        io: &mut impl IoBackend,
        batch: BatchBuf,
    ) -> Result<Appended, AppendRefused> {
        let h = match self.admit(io, batch.batch()) {
            Ok(h) => h,
            Err(error) => return Err(AppendRefused { error, batch }),
        };
        Ok(self.place_owned(batch, &h))
    }

    /// [`PartitionStore::append_owned`] of a batch the caller verified
    /// (see [`PartitionStore::append_verified`]): no second check of its body.
    pub fn append_owned_verified(
        &mut self,
        io: &mut impl IoBackend,
        batch: VerifiedBatch<BatchBuf>,
    ) -> Result<Appended, AppendRefused> {
        let h = *batch.header();
        match self.admit_header(io, &h) {
            Ok(()) => Ok(self.place_owned(batch.into_inner(), &h)),
            Err(error) => Err(AppendRefused {
                error,
                batch: batch.into_inner(),
            }),
        }
    }

    /// The write-buffer half of `append_owned`, for an admitted batch.
    fn place_owned(&mut self, mut batch: BatchBuf, h: &BatchHeader) -> Appended {
        batch.set_batch_len(h.total_len());
        // Room for the batch and for whatever the copy path appends behind
        // it before the flush, trailer block included (see `prepare_flush`).
        let room = batch.lead_bytes() + batch.batch_capacity()
            >= self.config.write_buffer_bytes + BLOCK_SIZE;
        let active = &mut self.active;
        if active.pending.is_none() && batch.lead_bytes() == active.tail.len() && room {
            debug_assert_eq!(
                active.tail.len() as u64,
                active.end_position % BLOCK_SIZE as u64
            );
            active.hasher.update(batch.batch());
            let lead = batch.lead_bytes();
            let mut buf = batch.into_buf();
            buf.full_mut()[..lead].copy_from_slice(&active.tail);
            active.pending = Some(buf);
        } else {
            self.copy_in(batch.batch());
        }
        self.accepted(h)
    }

    /// Where in its block the next batch starts on disk (the log's end
    /// modulo [`BLOCK_SIZE`]): the lead a batch built in place for
    /// [`PartitionStore::append_owned`] should have. A roll before that
    /// append starts a segment at lead 0.
    pub fn batch_lead_bytes(&self) -> usize {
        (self.active.end_position % BLOCK_SIZE as u64) as usize
    }

    /// The checks of an append, and what must happen before its bytes go
    /// into the write buffer: a roll, a flush of a full write buffer, the
    /// file's reservation. Returns the batch's header.
    fn admit(&mut self, io: &mut impl IoBackend, batch: &[u8]) -> Result<BatchHeader, StoreError> {
        self.check_fenced()?;
        let pid = self.partition_id;
        let view = BatchView::parse(batch).map_err(|source| StoreError::InvalidBatch {
            partition_id: pid,
            source,
        })?;
        let h = *view.header();
        self.admit_header(io, &h)?;
        Ok(h)
    }

    /// [`PartitionStore::admit`] of a batch whose bytes were verified:
    /// everything but the parse.
    fn admit_header(&mut self, io: &mut impl IoBackend, h: &BatchHeader) -> Result<(), StoreError> {
        self.check_fenced()?;
        let pid = self.partition_id;
        let len_bytes = h.total_len();
        if h.partition_id != pid {
            return Err(StoreError::WrongPartition {
                partition_id: pid,
                batch_partition_id: h.partition_id,
            });
        }
        if len_bytes > self.config.batch_bytes_max() {
            return Err(StoreError::BatchTooLarge {
                partition_id: pid,
                len_bytes,
                max_bytes: self.config.batch_bytes_max(),
            });
        }
        if h.base_offset != self.chain.next_offset {
            return Err(StoreError::OffsetMismatch {
                partition_id: pid,
                expected: self.chain.next_offset,
                actual: h.base_offset,
            });
        }
        if h.prev_checksum != self.chain.last_checksum {
            return Err(StoreError::ChainMismatch {
                partition_id: pid,
                expected: self.chain.last_checksum,
                actual: h.prev_checksum,
            });
        }
        if self.append_waits_for_flush(len_bytes) {
            return Err(StoreError::FlushInFlight { partition_id: pid });
        }
        let len = len_bytes as u64;
        if self.append_rolls(len_bytes) {
            self.roll(io)?;
        } else if self.active.end_position + len > self.active.capacity_bytes {
            return Err(self.no_room_error(len_bytes));
        }
        if self.active.buffered_len() + len_bytes > self.config.write_buffer_bytes {
            self.flush(io)?;
        }
        // Room for this flush's trailer too (see `prepare_flush`).
        let end = self.active.end_position + len;
        self.reserve(
            io,
            segment::trailer_write_end(end).min(self.active.capacity_bytes),
        )?;
        Ok(())
    }

    /// Copies an admitted batch's bytes into the write buffer (taking one
    /// from the pool, with the partial tail block, if none is held) and
    /// hashes them into the segment's checksums.
    fn copy_in(&mut self, bytes: &[u8]) {
        let buffer_bytes = self.config.write_buffer_bytes;
        let active = &mut self.active;
        let pending = active.pending.get_or_insert_with(|| {
            let mut buf = self.pool.take_write(buffer_bytes);
            buf.extend_from_slice(&active.tail);
            buf
        });
        copy_hashed(pending, bytes, &mut active.hasher);
    }

    /// Books an admitted batch whose bytes are in the write buffer now: the
    /// index, the accepted end, the chain.
    fn accepted(&mut self, h: &BatchHeader) -> Appended {
        let len = h.total_len() as u64;
        let active = &mut self.active;
        // The write buffer starts at the block of the flushing (or durable) end.
        let start = self
            .flushing
            .as_ref()
            .map_or(active.durable_position, |f| f.end_position);
        debug_assert_eq!(
            active.pending.as_ref().map(|p| p.len() as u64),
            Some(active.end_position + len - align_down(start))
        );
        let position = active.end_position;
        debug_assert!(position + len <= active.capacity_bytes);
        let relative = h.base_offset - active.base_offset;
        debug_assert!(relative <= u64::from(u32::MAX));
        active.index.observe(
            relative as u32,
            position as u32,
            h.max_timestamp_ms,
            self.config.index_interval_bytes,
        );
        active.end_position += len;
        active.max_timestamp_ms = active.max_timestamp_ms.max(h.max_timestamp_ms);
        self.chain = ChainPoint {
            next_offset: h.next_offset(),
            last_checksum: h.header_checksum,
            last_op: h.vsr_op,
        };
        Appended {
            base_offset: h.base_offset,
            next_offset: h.next_offset(),
        }
    }

    /// Queues this partition's flush onto `sqes`: the data write, carrying
    /// a trailer ([`FlushTrailer`]) in its padding, and one fdatasync,
    /// linked. Every [`FRONTIER_SLOT_EVERY_FLUSHES`]-th flush, and one whose
    /// trailer would not fit below the segment's capacity, also writes a
    /// frontier record slot between the two. Returns how many entries it
    /// added (0: nothing to flush). The matching completions go to
    /// [`complete_flush`], in order.
    ///
    /// The trailer and the slot name only what an earlier, completed
    /// fdatasync made durable (plus, the trailer, where this flush ends),
    /// never this flush's bytes as durable: this flush may tear, a record
    /// must not claim torn bytes. Riding this flush's own fdatasync, they
    /// are durable once the flush completed (see the bound in `open.rs`).
    ///
    /// [`complete_flush`]: PartitionStore::complete_flush
    pub fn prepare_flush(&mut self, sqes: &mut Vec<Sqe>) -> Result<usize, StoreError> {
        self.prepare_write(sqes, None)
    }

    /// [`prepare_flush`] for group commit through the shard's journal: when
    /// the bytes accepted since the durable end fit `journal` (see
    /// [`Journal::fits`]), they become one journal record and the segment
    /// write goes without an fdatasync (written behind); the caller submits
    /// the journal's write and fdatasync with these entries and completes
    /// the flush with them plus [`Journal::durable_completion`]. Otherwise
    /// (too large, no room, journal busy or fenced) it is a plain flush
    /// with its own fdatasync.
    ///
    /// [`prepare_flush`]: PartitionStore::prepare_flush
    /// [`Journal::fits`]: crate::journal::Journal::fits
    /// [`Journal::durable_completion`]: crate::journal::Journal::durable_completion
    pub fn prepare_flush_journaled(
        &mut self,
        sqes: &mut Vec<Sqe>,
        journal: &mut Journal,
    ) -> Result<usize, StoreError> {
        let new_bytes = (self.active.end_position - self.active.durable_position) as usize;
        if new_bytes == 0 || !journal.fits(new_bytes) {
            return self.prepare_write(sqes, None);
        }
        self.prepare_write(sqes, Some(journal))
    }

    /// Bytes accepted since the durable end (what the next flush writes).
    pub fn unflushed_bytes(&self) -> u64 {
        self.active.end_position - self.active.durable_position
    }

    /// The active segment as journal records name it.
    pub fn journal_key(&self) -> JournalKey {
        JournalKey {
            partition_id: self.partition_id,
            sb_sequence: self.sb.sequence,
            active_base: self.active.base_offset,
            nonce: self.active.nonce,
        }
    }

    /// An fdatasync of the active segment, for a journal checkpoint (see
    /// `journal.rs`); None when fenced (its journal records must stay).
    /// Only while no flush of this partition is in flight: it must cover
    /// the completed writes behind the journal.
    pub fn segment_sync_sqe(&self) -> Option<Sqe> {
        (self.fenced.is_none()).then(|| {
            Sqe::new(Op::Fdatasync {
                file: self.active.file,
            })
        })
    }

    /// A journal checkpoint's fdatasync of this segment failed: fail-stop.
    pub fn fence_segment_sync(&mut self, cause: &str) -> StoreError {
        self.fence(format!(
            "segment fdatasync for a journal checkpoint failed: {cause}"
        ))
    }

    /// Makes the bytes written behind the journal durable in the segment
    /// itself: before a superblock names a frontier, a roll seals the
    /// segment, or a direct flush's records claim them. No-op when nothing
    /// was written behind since.
    fn sync_behind(&mut self, io: &mut impl IoBackend) -> Result<(), StoreError> {
        if !self.behind {
            return Ok(());
        }
        debug_assert!(self.flushing.is_none(), "sync behind a flush in flight");
        let file = self.active.file;
        match submit_checked(io, vec![Sqe::new(Op::Fdatasync { file })]) {
            Ok(_) => {
                self.behind = false;
                Ok(())
            }
            Err((kind, e)) => {
                Err(self.fence(format!("segment {kind} behind the journal failed: {e}")))
            }
        }
    }

    /// The flush's entries; with `journal`, its new bytes become a journal
    /// record and no fdatasync is queued (see `prepare_flush_journaled`).
    fn prepare_write(
        &mut self,
        sqes: &mut Vec<Sqe>,
        journal: Option<&mut Journal>,
    ) -> Result<usize, StoreError> {
        self.check_fenced()?;
        assert!(self.flushing.is_none(), "one flush at a time per partition");
        let before = sqes.len();
        if self.active.end_position == self.active.durable_position {
            return Ok(0);
        }
        let key = self.journal_key();
        let trailer = self.flush_trailer();
        let active = &mut self.active;
        let end = active.end_position;
        let start = align_down(active.durable_position);
        let len = (end - start) as usize;
        let mut buf = active
            .pending
            .take()
            .expect("accepted bytes past the durable end are in the write buffer");
        debug_assert_eq!(len, buf.len());
        // The next write buffer, taken on the next append, starts with the
        // tail block this write ends in (its data, not the trailer); the
        // partition holds no buffer until then.
        let tail_from = (align_down(end) - start) as usize;
        active.tail.clear();
        active.tail.extend_from_slice(&buf[tail_from..len]);
        let written = match &trailer {
            Some(t) => {
                let at = (segment::trailer_position(end) - start) as usize;
                let write_end = (segment::trailer_write_end(end) - start) as usize;
                // Write buffers hold a block more than `write_buffer_bytes`.
                assert!(write_end <= buf.capacity(), "no room for the trailer");
                buf.full_mut()[len..write_end].fill(0);
                t.encode(&mut buf.full_mut()[at..at + segment::TRAILER_BYTES as usize]);
                write_end
            }
            None => {
                let padded = align_up(len as u64) as usize;
                buf.full_mut()[len..padded].fill(0);
                padded
            }
        };
        buf.set_len(written);
        debug_assert!(start + written as u64 <= active.capacity_bytes);
        let journaled = journal.is_some();
        if let Some(journal) = journal {
            let from = (active.durable_position - start) as usize;
            journal.add(key, active.durable_position, &buf[from..len]);
        }
        sqes.push(Sqe::linked(Op::Write {
            file: active.file,
            offset: start,
            buf,
        }));
        active.flushes_since_slot += 1;
        let record = if self.slot_due(trailer.is_some()) {
            let recorded = self.active.recorded_position;
            self.push_record(sqes, recorded, true)
        } else {
            None
        };
        if record.is_some() {
            self.active.flushes_since_slot = 0;
        }
        debug_assert!(trailer.is_none_or(|t| t.slot_sequence == self.active.slot_sequence));
        if journaled {
            // The journal's fdatasync, not one of this segment, makes the
            // bytes durable: nothing of this flush links past it.
            if let Some(last) = sqes.last_mut() {
                last.link_next = false;
            }
            self.active.push_zero_ahead(sqes, start + written as u64);
            self.behind = true;
        } else {
            sqes.push(Sqe::new(Op::Fdatasync {
                file: self.active.file,
            }));
        }
        self.flushing = Some(Flushing {
            end_position: self.active.end_position,
            chain: self.chain,
            record,
        });
        Ok(sqes.len() - before)
    }

    /// Whether the flush being prepared (the `flushes_since_slot`-th since
    /// the last slot record) writes a slot record: every
    /// [`FRONTIER_SLOT_EVERY_FLUSHES`]-th, or when it has no trailer;
    /// never when the durable end is already recorded.
    fn slot_due(&self, has_trailer: bool) -> bool {
        let active = &self.active;
        let due = !has_trailer || active.flushes_since_slot >= FRONTIER_SLOT_EVERY_FLUSHES;
        due && active.durable_position > active.recorded_position
    }

    /// The trailer of the flush about to be prepared, or None when it would
    /// not fit below the segment's capacity (that flush writes a slot
    /// record instead). Its `slot_sequence` is the one in effect after this
    /// flush's slot record, if it writes one.
    fn flush_trailer(&self) -> Option<FlushTrailer> {
        let active = &self.active;
        let end = active.end_position;
        if segment::trailer_write_end(end) > active.capacity_bytes {
            return None;
        }
        // `prepare_flush` counts this flush after taking its trailer.
        let slot = active.flushes_since_slot + 1 >= FRONTIER_SLOT_EVERY_FLUSHES
            && active.durable_position > active.recorded_position;
        Some(FlushTrailer {
            partition_id: self.partition_id,
            live_generation: self.sb.live_generation,
            active_base: active.base_offset,
            capacity_bytes: active.capacity_bytes,
            nonce: active.nonce,
            slot_sequence: active.slot_sequence + u64::from(slot),
            durable_position: active.durable_position,
            durable_next_offset: self.durable.next_offset,
            durable_last_checksum: self.durable.last_checksum,
            durable_last_op: self.durable.last_op,
            end_position: end,
            end_next_offset: self.chain.next_offset,
            end_last_checksum: self.chain.last_checksum,
        })
    }

    /// Queues a frontier record slot of the durable end, with its
    /// fdatasync, if the newest slot record lags it: between slot records
    /// (every [`FRONTIER_SLOT_EVERY_FLUSHES`] flushes) only the last
    /// flush's trailer names the durable end, and it names the end before
    /// that flush. The shard's maintenance calls this for idle partitions,
    /// bounding the lag in time. Returns the entries added (0: the record is current);
    /// the completions go to [`complete_flush`], in order.
    ///
    /// [`complete_flush`]: PartitionStore::complete_flush
    pub fn prepare_checkpoint(&mut self, sqes: &mut Vec<Sqe>) -> Result<usize, StoreError> {
        self.check_fenced()?;
        assert!(self.flushing.is_none(), "one flush at a time per partition");
        let before = sqes.len();
        let recorded = self.active.recorded_position;
        let Some(record) = self.push_record(sqes, recorded, true) else {
            return Ok(0);
        };
        sqes.push(Sqe::new(Op::Fdatasync {
            file: self.active.file,
        }));
        self.flushing = Some(Flushing {
            end_position: self.active.durable_position,
            chain: self.durable,
            record: Some(record),
        });
        Ok(sqes.len() - before)
    }

    /// [`prepare_checkpoint`] and wait for it.
    ///
    /// [`prepare_checkpoint`]: PartitionStore::prepare_checkpoint
    pub fn checkpoint_frontier(&mut self, io: &mut impl IoBackend) -> Result<(), StoreError> {
        let mut sqes = Vec::with_capacity(2);
        if self.prepare_checkpoint(&mut sqes)? == 0 {
            return Ok(());
        }
        let completions = io.submit(sqes);
        self.complete_flush(completions)
    }

    /// Bytes of the active segment that are durable but not yet below the
    /// newest frontier record slot or superblock frontier (what a crash
    /// that also tore away the last flush's trailer, plus a bad byte there,
    /// could make recovery take for a torn tail; see `open.rs`).
    pub fn frontier_lag_bytes(&self) -> u64 {
        self.active.durable_position - self.active.recorded_position
    }

    /// Pushes a write of the frontier record for the durable end into the
    /// next slot (`linked` to what follows), if that end is past `after`;
    /// returns the position it records.
    fn push_record(&mut self, sqes: &mut Vec<Sqe>, after: u64, linked: bool) -> Option<u64> {
        let active = &mut self.active;
        if active.durable_position <= after {
            return None;
        }
        let slot = FrontierSlot {
            partition_id: self.partition_id,
            live_generation: self.sb.live_generation,
            active_base: active.base_offset,
            capacity_bytes: active.capacity_bytes,
            sequence: active.slot_sequence,
            position: active.durable_position,
            next_offset: self.durable.next_offset,
            last_checksum: self.durable.last_checksum,
            last_op: self.durable.last_op,
        };
        let mut buf = self
            .slot_buf
            .take()
            .unwrap_or_else(|| AlignedBuf::new(segment::SLOT_BYTES as usize));
        buf.set_len(segment::SLOT_BYTES as usize);
        slot.encode(&mut buf);
        let offset = segment::slot_offset(active.capacity_bytes, slot.sequence % segment::SLOTS);
        active.slot_sequence += 1;
        let write = Op::Write {
            file: active.file,
            offset,
            buf,
        };
        sqes.push(if linked {
            Sqe::linked(write)
        } else {
            Sqe::new(write)
        });
        Some(slot.position)
    }

    /// Takes the completions of the entries [`prepare_flush`] (or
    /// [`prepare_checkpoint`]) queued. Any failure fences the partition: a
    /// failed fsync is never retried.
    ///
    /// [`prepare_flush`]: PartitionStore::prepare_flush
    /// [`prepare_checkpoint`]: PartitionStore::prepare_checkpoint
    pub fn complete_flush(
        &mut self,
        completions: impl IntoIterator<Item = Completion>,
    ) -> Result<(), StoreError> {
        let flushing = self
            .flushing
            .take()
            .expect("complete_flush without prepare_flush");
        let mut failure = None;
        let mut written = None;
        for c in completions {
            let kind = c.op.kind();
            if let Err(e) = &c.result {
                failure.get_or_insert_with(|| format!("{kind} failed: {e}"));
            }
            if let Some(buf) = c.op.into_buf() {
                // Write buffers are at least two blocks (validated).
                if buf.capacity() == segment::SLOT_BYTES as usize {
                    self.slot_buf = Some(buf);
                } else if written.is_none() {
                    written = Some(buf);
                }
                // A later one is the zeros ahead (`push_zero_ahead`): freed.
            }
        }
        if let Some(buf) = written {
            // Only a flush that completed makes its batches cacheable.
            if failure.is_none() {
                self.cache_flushed(buf, flushing.end_position);
            } else {
                self.pool.put_write(buf);
            }
        }
        if let Some(cause) = failure {
            return Err(self.fence(cause));
        }
        let active = &mut self.active;
        active.durable_position = flushing.end_position;
        self.durable = flushing.chain;
        // The record was linked before this fdatasync: durable now.
        if let Some(position) = flushing.record {
            active.recorded_position = active.recorded_position.max(position);
        }
        Ok(())
    }

    /// Makes every accepted append durable.
    /// Bytes written behind the journal are made durable in the segment
    /// too (its fdatasync covers them), so a roll or close may rely on it.
    pub fn flush(&mut self, io: &mut impl IoBackend) -> Result<(), StoreError> {
        let mut sqes = Vec::with_capacity(2);
        if self.prepare_flush(&mut sqes)? == 0 {
            return self.sync_behind(io);
        }
        let completions = io.submit(sqes);
        self.complete_flush(completions)?;
        self.behind = false;
        Ok(())
    }

    /// Makes VSR state (view, log view, commit, op) durable in the
    /// superblock: it must be, before any message that depends on it is sent.
    pub fn set_vsr(&mut self, io: &mut impl IoBackend, vsr: VsrState) -> Result<(), StoreError> {
        self.check_fenced()?;
        assert!(vsr.view >= self.sb.vsr.view, "a view never goes back");
        let mut next = self.sb.successor();
        next.vsr = vsr;
        self.write_superblock(io, next)
    }

    /// Writes the `.idx` files of segments sealed since the last call. They
    /// are caches: losing one costs a rebuild at open, never data, so this
    /// runs off the append path (from maintenance and close).
    pub fn persist_indexes(&mut self, io: &mut impl IoBackend) -> Result<(), StoreError> {
        self.check_fenced()?;
        let chunk_size_bytes = self.config.transfer_chunk_bytes;
        for s in self.sealed.iter_mut().filter(|s| !s.index_persisted) {
            let bytes = SealedIndex {
                index: s.index.clone(),
                chunk_size_bytes,
                chunk_checksums: s.chunk_checksums.clone(),
            }
            .encode(s.meta.base_offset);
            let path = segment::index_path(&self.generation_dir, s.meta.base_offset);
            write_new_file(io, self.partition_id, &path, &bytes)?;
            s.index_persisted = true;
        }
        Ok(())
    }

    /// Flushes and checkpoints the frontier in the superblock, so the next
    /// open verifies instead of scanning; then closes the files. The files
    /// are closed whatever happened: a fenced partition writes nothing and
    /// returns its fence, but releases its handles.
    pub fn close(mut self, io: &mut impl IoBackend) -> Result<(), StoreError> {
        let checkpointed = self.checkpoint_for_close(io);
        for s in &self.sealed {
            io.close(s.file);
        }
        // An install left behind (its staging is garbage to the next open).
        if let Some(slot) = self.installing.take() {
            slot.close_files(io);
        }
        // A spare is garbage to the next open too.
        self.abandon_spare(io, None);
        io.close(self.active.file);
        checkpointed
    }

    fn checkpoint_for_close(&mut self, io: &mut impl IoBackend) -> Result<(), StoreError> {
        self.check_fenced()?;
        self.flush(io)?;
        if let Some(buf) = self.active.pending.take() {
            self.pool.put_write(buf);
        }
        self.persist_indexes(io)?;
        let mut next = self.sb.successor();
        next.frontier = self.frontier_now();
        self.write_superblock(io, next)
    }

    /// Seals the active segment and starts a new one at the log's end.
    fn roll(&mut self, io: &mut impl IoBackend) -> Result<(), StoreError> {
        self.flush(io)?;
        let active = &self.active;
        let meta = self.durable_active_meta();
        let chunk_checksums = active.hasher.chunk_checksums();
        let new_base = self.durable.next_offset;
        let new_path = segment::log_path(&self.generation_dir, new_base);
        // A spare prepared ahead only needs renaming into place (linked
        // before the directory fsync below); otherwise provision one now.
        let (new_segment, rename) = match self.take_spare(new_path.clone()) {
            Some((spare, rename)) => (spare, Some(rename)),
            None => (self.provision_segment(io, &new_path)?, None),
        };
        let mut next = self.sb.successor();
        // Durable before the superblock that counts it (a linked chain
        // would not stop at a failed fdatasync: this is its own submission).
        next.table = match self.append_table_entry(io, &meta) {
            Ok(table) => table,
            Err(e) => {
                // Not committed: the new file is garbage for the next open.
                io.close(new_segment.file);
                return Err(e);
            }
        };
        next.frontier = Frontier {
            next_offset: new_base,
            last_op: self.durable.last_op,
            last_checksum: self.durable.last_checksum,
            active_base: new_base,
            active_position: 0,
            active_prev_checksum: self.durable.last_checksum,
            active_capacity_bytes: self.config.segment_size_bytes,
            active_prev_op: self.durable.last_op,
            active_nonce: match new_nonce(self.partition_id, &new_path) {
                Ok(nonce) => nonce,
                Err(e) => {
                    io.close(new_segment.file);
                    return Err(e);
                }
            },
            ..Frontier::default()
        };
        // The superblock and the new segment's directory entry are made
        // durable side by side, in one submission: either may land first, as
        // recovery recreates a missing active segment that holds nothing, and
        // nothing is written into it before both completed. The sealed
        // segment's index is a cache written later (`persist_indexes`).
        let generation_dir = self.generation_dir.clone();
        let opened = self.open_superblock(io).and_then(|sb_file| {
            match open_dir(io, self.partition_id, &generation_dir) {
                Ok(dir_file) => Ok((sb_file, dir_file)),
                Err(e) => {
                    io.close(sb_file);
                    Err(e)
                }
            }
        });
        let (sb_file, dir_file) = match opened {
            Ok(files) => files,
            // Nothing changed yet: the new file is garbage for the next open.
            Err(e) => {
                io.close(new_segment.file);
                return Err(e);
            }
        };
        let mut sqes = self.superblock_sqes(sb_file, &next, &half_for(next.sequence));
        if let Some(rename) = rename {
            sqes.push(Sqe::linked(rename));
        }
        sqes.push(Sqe::new(Op::Fsync { file: dir_file }));
        let submitted = submit_checked(io, sqes);
        io.close(sb_file);
        io.close(dir_file);
        if let Err((kind, e)) = submitted {
            return Err(self.fence(format!("segment roll {kind} failed: {e}")));
        }
        // The flush above left nothing pending: no buffer moves over.
        debug_assert!(self.active.pending.is_none());
        let new_active = ActiveSegment::empty(
            new_segment,
            self.durable,
            (
                self.config.transfer_chunk_bytes,
                self.config.segment_size_bytes,
            ),
            next.frontier.active_nonce,
        );
        let old = std::mem::replace(&mut self.active, new_active);
        self.sb = next;
        self.sealed.push(SealedFile {
            meta,
            file: old.file,
            index: old.index,
            chunk_checksums,
            index_persisted: false,
        });
        Ok(())
    }

    /// The active segment's durable prefix as a segment table entry (what a
    /// seal records and a snapshot offers in place).
    fn durable_active_meta(&self) -> SealedSegment {
        let active = &self.active;
        SealedSegment {
            base_offset: active.base_offset,
            end_offset: self.durable.next_offset,
            length_bytes: active.durable_position,
            checksum: active.hasher.checksum(),
            last_batch_checksum: self.durable.last_checksum,
            max_timestamp_ms: active.max_timestamp_ms,
        }
    }

    /// The frontier as of the durable end of the log.
    fn frontier_now(&self) -> Frontier {
        Frontier {
            next_offset: self.durable.next_offset,
            last_op: self.durable.last_op,
            last_checksum: self.durable.last_checksum,
            active_base: self.active.base_offset,
            active_position: self.active.durable_position,
            active_prev_checksum: self.active.prev_checksum,
            active_capacity_bytes: self.active.capacity_bytes,
            active_prev_op: self.active.prev_op,
            slot_floor: self.active.slot_floor,
            // A cut finishes before it returns (or before open does).
            cut_pending_end: 0,
            active_nonce: self.active.nonce,
        }
    }

    /// Opens a segment file for a new active segment at `path`: a recycled
    /// file when the pool has one (its blocks are already written), else a
    /// fresh empty one that appends grow ([`PartitionStore::reserve`]). The
    /// caller fsyncs the directory. Running out of space here changes no
    /// state: [`StoreError::DiskFull`], not a fence.
    fn provision_segment(
        &mut self,
        io: &mut impl IoBackend,
        path: &Path,
    ) -> Result<Provisioned, StoreError> {
        let pid = self.partition_id;
        let capacity_bytes = self.config.segment_size_bytes;
        let result = match self.pool.take_recycled() {
            Some(from) => {
                let rename = Op::Rename {
                    from: from.clone(),
                    to: path.into(),
                };
                submit_checked(io, vec![Sqe::new(rename)])
                    .map_err(|(_, e)| StoreError::io(pid, "rename", &from, e))
                    .and_then(|_| {
                        io.open_file(path, OpenMode::Existing)
                            .map_err(|e| StoreError::io(pid, "open", path, e))
                    })
                    .and_then(|file| allocate_whole_segment(io, pid, path, file, capacity_bytes))
                    .and_then(|file| zero_first_block(io, pid, path, file))
                    .map(|file| Provisioned {
                        file,
                        allocated_bytes: capacity_bytes,
                    })
            }
            None => create_segment_file(io, pid, path, 0).map(|file| Provisioned {
                file,
                allocated_bytes: 0,
            }),
        };
        match result {
            Err(StoreError::Io { source, path, .. }) if is_enospc(&source) => {
                Err(StoreError::DiskFull {
                    partition_id: pid,
                    path,
                })
            }
            other => self.fence_on_err(other),
        }
    }

    /// Grows the active segment's file to cover `end`, a step ahead. Out of
    /// space: [`StoreError::DiskFull`], nothing accepted, nothing fenced
    /// (no acknowledged byte is at stake); the next append tries again.
    fn reserve(&mut self, io: &mut impl IoBackend, end: u64) -> Result<(), StoreError> {
        if end <= self.active.allocated_bytes {
            return Ok(());
        }
        let target = allocation_target(end, self.active.capacity_bytes);
        // The first reservation in a segment also covers its frontier record
        // slots past the capacity: a flush never writes into unreserved
        // space, so no flush of an accepted append can find the disk full.
        let file = self.active.file;
        let reserved = if self.active.allocated_bytes == 0 {
            let at = segment::slot_offset(self.active.capacity_bytes, 0);
            io.allocate_range(file, at, segment::SLOTS * segment::SLOT_BYTES)
        } else {
            Ok(())
        };
        match reserved.and_then(|()| io.allocate(file, target)) {
            Ok(()) => {
                self.active.allocated_bytes = target;
                Ok(())
            }
            Err(e) => {
                let path = segment::log_path(&self.generation_dir, self.active.base_offset);
                if is_enospc(&e) {
                    tracing::warn!(partition = self.partition_id, "disk full: append refused");
                    Err(StoreError::DiskFull {
                        partition_id: self.partition_id,
                        path,
                    })
                } else {
                    Err(StoreError::io(self.partition_id, "fallocate", path, e))
                }
            }
        }
    }

    /// Writes a new superblock state, copy by copy, each copy followed by an
    /// fdatasync, in one linked submission.
    fn write_superblock(
        &mut self,
        io: &mut impl IoBackend,
        next: Superblock,
    ) -> Result<(), StoreError> {
        debug_assert_eq!(next.sequence, self.sb.sequence + 1);
        debug_assert!(next.frontier.next_offset >= self.sb.frontier.next_offset);
        self.write_superblock_copies(io, &next, &half_for(next.sequence))?;
        self.superblock_written(next);
        Ok(())
    }

    /// `next` is durable: it is the superblock now.
    fn superblock_written(&mut self, next: Superblock) {
        // A superblock frontier is a frontier record too.
        if next.frontier.active_base == self.active.base_offset {
            let active = &mut self.active;
            active.recorded_position = active.recorded_position.max(next.frontier.active_position);
        }
        self.sb = next;
    }

    fn write_superblock_copies(
        &mut self,
        io: &mut impl IoBackend,
        sb: &Superblock,
        copies: &[usize],
    ) -> Result<(), StoreError> {
        // A frontier the superblock names must be durable in the segment,
        // and records naming the old superblock are skipped at replay.
        self.sync_behind(io)?;
        let sb_file = self.open_superblock(io)?;
        let sqes = self.superblock_sqes(sb_file, sb, copies);
        let result = submit_checked(io, sqes)
            .map(|_| ())
            .map_err(|(kind, e)| format!("superblock {kind} failed: {e}"));
        io.close(sb_file);
        match result {
            Ok(()) => Ok(()),
            Err(cause) => Err(self.fence(cause)),
        }
    }

    /// Writes `copies` of `sb` (linked), then one fdatasync. Callers never
    /// include every copy holding the last durable state, so a torn write
    /// leaves that state whole (see [`half_for`]).
    fn superblock_sqes(&self, sb_file: FileId, sb: &Superblock, copies: &[usize]) -> Vec<Sqe> {
        debug_assert!(copies.iter().all(|&c| c < COPIES));
        let mut sqes = Vec::with_capacity(copies.len() + 1);
        for &copy in copies {
            let mut buf = AlignedBuf::new(COPY_SIZE_BYTES);
            buf.set_len(COPY_SIZE_BYTES);
            sb.encode(copy as u16, &mut buf);
            sqes.push(Sqe::linked(Op::Write {
                file: sb_file,
                offset: (copy * COPY_SIZE_BYTES) as u64,
                buf,
            }));
        }
        sqes.push(Sqe::new(Op::Fdatasync { file: sb_file }));
        sqes
    }

    /// Opens the superblock file for one state change; the caller closes
    /// it after. Like the directories, it is not kept open: an idle
    /// partition holds one descriptor (its active segment's), so thousands
    /// of partitions fit a process's file limit.
    fn open_superblock(&self, io: &mut impl IoBackend) -> Result<FileId, StoreError> {
        let path = self.dir.join(SUPERBLOCK_FILE);
        io.open_file(&path, OpenMode::Existing)
            .map_err(|e| StoreError::io(self.partition_id, "open", path, e))
    }

    /// fsyncs directories (making names durable); a failed fsync fences,
    /// failing to open one changes nothing and does not.
    fn sync_dirs(&mut self, io: &mut impl IoBackend, dirs: &[&Path]) -> Result<(), StoreError> {
        let mut files = Vec::with_capacity(dirs.len());
        for dir in dirs {
            match open_dir(io, self.partition_id, dir) {
                Ok(file) => files.push(file),
                Err(e) => {
                    files.into_iter().for_each(|f| io.close(f));
                    return Err(e);
                }
            }
        }
        let sqes = files
            .iter()
            .map(|&file| Sqe::new(Op::Fsync { file }))
            .collect();
        let submitted = submit_checked(io, sqes);
        files.into_iter().for_each(|f| io.close(f));
        match submitted {
            Ok(_) => Ok(()),
            Err((kind, e)) => Err(self.fence(format!("directory {kind} failed: {e}"))),
        }
    }

    fn check_fenced(&self) -> Result<(), StoreError> {
        match &self.fenced {
            Some(cause) => Err(StoreError::Fenced {
                partition_id: self.partition_id,
                cause: cause.clone(),
            }),
            None => Ok(()),
        }
    }

    fn fence(&mut self, cause: String) -> StoreError {
        tracing::error!(partition = self.partition_id, %cause, "partition fenced");
        self.fenced.get_or_insert(cause.clone());
        StoreError::Fenced {
            partition_id: self.partition_id,
            cause,
        }
    }

    /// I/O that failed half-way through a state change leaves memory and
    /// disk out of step: stop the partition.
    fn fence_on_err<T>(&mut self, result: Result<T, StoreError>) -> Result<T, StoreError> {
        result.map_err(|e| match e {
            StoreError::Fenced { .. } => e,
            other => self.fence(other.to_string()),
        })
    }
}

impl ActiveSegment {
    /// Queues a write of zeros past `write_end` (the end of this flush's
    /// data write, trailer included) when the written region ends within
    /// half of [`ZERO_AHEAD_BYTES`] of it; never past the allocation or the
    /// capacity (the frontier slots follow it). The region holds no data:
    /// recovery reads zeros there as it reads an unwritten extent.
    fn push_zero_ahead(&mut self, sqes: &mut Vec<Sqe>, write_end: u64) {
        debug_assert_eq!(write_end % BLOCK_SIZE as u64, 0, "writes end on a block");
        self.overwrite_end = self.overwrite_end.max(write_end);
        if write_end + ZERO_AHEAD_BYTES / 2 <= self.overwrite_end {
            return;
        }
        let from = self.overwrite_end;
        let to = (from + ZERO_AHEAD_BYTES)
            .min(align_down(self.allocated_bytes))
            .min(align_down(self.capacity_bytes));
        if to <= from {
            return;
        }
        let mut buf = AlignedBuf::new((to - from) as usize);
        buf.set_len((to - from) as usize);
        debug_assert!(buf.iter().all(|&b| b == 0), "zeros ahead are zeros");
        sqes.push(Sqe::new(Op::Write {
            file: self.file,
            offset: from,
            buf,
        }));
        self.overwrite_end = to;
    }

    /// A new segment with nothing in it (and no write buffer), as the
    /// superblock `frontier` that names it records it (position 0), so no
    /// slot record is due yet. Its allocation is not known: the first
    /// append's fallocate covers whatever is missing.
    fn empty(
        provisioned: Provisioned,
        prev: ChainPoint,
        (chunk_size_bytes, capacity_bytes): (u32, u64),
        nonce: u64,
    ) -> Self {
        let Provisioned {
            file,
            allocated_bytes,
        } = provisioned;
        Self {
            base_offset: prev.next_offset,
            file,
            prev_checksum: prev.last_checksum,
            prev_op: prev.last_op,
            hasher: SegmentHasher::new(chunk_size_bytes),
            index: SparseIndex::default(),
            max_timestamp_ms: 0,
            end_position: 0,
            durable_position: 0,
            pending: None,
            tail: Vec::new(),
            allocated_bytes,
            overwrite_end: 0,
            capacity_bytes,
            slot_sequence: 0,
            slot_floor: 0,
            flushes_since_slot: 0,
            recorded_position: 0,
            nonce,
        }
    }

    /// Bytes the next write would carry: `[align_down(flushing or durable
    /// end), end_position)`.
    fn buffered_len(&self) -> usize {
        self.pending.as_ref().map_or(self.tail.len(), |p| p.len())
    }
}

/// Copies `bytes` to the end of `buf` and feeds the copy to `hasher`, piece
/// by piece: each piece is hashed from the write buffer while it is still in
/// the L1/L2 cache, so the batch is read from memory once (by the copy)
/// instead of once more by the hash. The hash covers exactly the bytes the
/// flush writes.
fn copy_hashed(buf: &mut AlignedBuf, bytes: &[u8], hasher: &mut SegmentHasher) {
    for piece in bytes.chunks(COPY_PIECE_BYTES) {
        let at = buf.len();
        buf.extend_from_slice(piece);
        hasher.update(&buf[at..]);
    }
}

/// Where a segment file that must cover `end` is allocated up to: one step
/// past it (the data so far, within the step bounds), in whole minimum
/// steps, never past the segment.
fn allocation_target(end: u64, segment_size_bytes: u64) -> u64 {
    let step = end.clamp(ALLOCATION_STEP_MIN_BYTES, ALLOCATION_STEP_MAX_BYTES);
    (end + step)
        .div_ceil(ALLOCATION_STEP_MIN_BYTES)
        .saturating_mul(ALLOCATION_STEP_MIN_BYTES)
        .min(segment_size_bytes)
}

/// Zeroes (durably) the first block of recycled segment file `file`, before
/// a superblock names it active: recovery then finds the log's end at once
/// (zeros where the first header was due) instead of scanning stale bytes
/// for trailers (see `open.rs`). Closes `file` on failure.
/// Reserves all of a recycled segment file, data and frontier record slots,
/// in one fallocate (the file held a segment already, so this mostly claims
/// blocks it has). Done here, before `zero_first_block`'s fdatasync makes
/// the inode change durable, so that no flush of the segment pays for an
/// inode write: on ext4 each fallocate dirties the inode, and the next
/// fdatasync then writes it synchronously, one more device round trip.
fn allocate_whole_segment(
    io: &mut impl IoBackend,
    pid: u32,
    path: &Path,
    file: FileId,
    capacity_bytes: u64,
) -> Result<FileId, StoreError> {
    let end = segment::slot_offset(capacity_bytes, segment::SLOTS - 1) + segment::SLOT_BYTES;
    match io.allocate(file, end) {
        Ok(()) => Ok(file),
        Err(e) => {
            io.close(file);
            Err(StoreError::io(pid, "fallocate", path, e))
        }
    }
}

fn zero_first_block(
    io: &mut impl IoBackend,
    pid: u32,
    path: &Path,
    file: FileId,
) -> Result<FileId, StoreError> {
    let mut buf = AlignedBuf::new(BLOCK_SIZE);
    buf.set_len(BLOCK_SIZE);
    let sqes = vec![
        Sqe::linked(Op::Write {
            file,
            offset: 0,
            buf,
        }),
        Sqe::new(Op::Fdatasync { file }),
    ];
    match submit_checked(io, sqes) {
        Ok(_) => Ok(file),
        Err((kind, e)) => {
            io.close(file);
            Err(StoreError::io(pid, kind, path, e))
        }
    }
}

/// A new segment's trailer nonce (see [`FlushTrailer`]); `path` names the
/// segment in the error.
fn new_nonce(partition_id: u32, path: &Path) -> Result<u64, StoreError> {
    segment::new_nonce().map_err(|e| StoreError::io(partition_id, "getrandom", path, e))
}

/// Opens a directory for an fsync; the caller closes it.
fn open_dir(io: &mut impl IoBackend, partition_id: u32, dir: &Path) -> Result<FileId, StoreError> {
    io.open_dir(dir)
        .map_err(|e| StoreError::io(partition_id, "open", dir, e))
}

fn is_enospc(e: &std::io::Error) -> bool {
    e.raw_os_error() == Some(libc::ENOSPC)
}

fn create_segment_file(
    io: &mut impl IoBackend,
    partition_id: u32,
    path: &Path,
    size_bytes: u64,
) -> Result<FileId, StoreError> {
    let file = io
        .open_file(path, OpenMode::Create)
        .map_err(|e| StoreError::io(partition_id, "create", path, e))?;
    if size_bytes > 0 {
        if let Err(e) = io.allocate(file, size_bytes) {
            io.close(file);
            return Err(StoreError::io(partition_id, "fallocate", path, e));
        }
    }
    Ok(file)
}

/// Creates `path` holding `bytes` (padded to a block) and fdatasyncs it.
/// The caller fsyncs the directory.
fn write_new_file(
    io: &mut impl IoBackend,
    partition_id: u32,
    path: &Path,
    bytes: &[u8],
) -> Result<(), StoreError> {
    let file = io
        .open_file(path, OpenMode::Create)
        .map_err(|e| StoreError::io(partition_id, "create", path, e))?;
    let mut sqes = small_file_sqes(file, bytes);
    if let Some(last) = sqes.last_mut() {
        last.link_next = false;
    }
    let result = submit_checked(io, sqes)
        .map(|_| ())
        .map_err(|(kind, e)| StoreError::io(partition_id, kind, path, e));
    io.close(file);
    result
}

/// Writes `bytes` (padded to a block) at offset 0 of `file`, then
/// fdatasyncs it; both linked to whatever the caller appends after them.
fn small_file_sqes(file: FileId, bytes: &[u8]) -> Vec<Sqe> {
    let mut buf = AlignedBuf::new(bytes.len());
    buf.extend_from_slice(bytes);
    buf.set_len(align_up(bytes.len() as u64) as usize);
    vec![
        Sqe::linked(Op::Write {
            file,
            offset: 0,
            buf,
        }),
        Sqe::linked(Op::Fdatasync { file }),
    ]
}

/// Submits a batch and checks every completion; on failure returns the kind
/// and error of the first failed op (all completions are still consumed).
fn submit_checked(
    io: &mut impl IoBackend,
    sqes: Vec<Sqe>,
) -> Result<Vec<Completion>, (&'static str, std::io::Error)> {
    let ops = sqes.len();
    check_completions(io.submit(sqes), ops)
}

/// Checks every completion of a batch of `ops` ops; on failure returns the
/// kind and error of the first failed op, or of a completion the backend
/// did not hand back.
fn check_completions(
    mut completions: Vec<Completion>,
    ops: usize,
) -> Result<Vec<Completion>, (&'static str, std::io::Error)> {
    if completions.len() != ops {
        let e = std::io::Error::other(format!("{} completions for {ops} ops", completions.len()));
        return Err(("submit", e));
    }
    let failed = completions.iter_mut().find_map(|c| match &mut c.result {
        Err(e) => Some((
            c.op.kind(),
            std::mem::replace(e, std::io::Error::other("reported")),
        )),
        Ok(_) => None,
    });
    match failed {
        Some(f) => Err(f),
        None => Ok(completions),
    }
}
