//! Opening a partition: recovery from the superblock plus verified log bytes.
//!
//! 1. Read the superblock by quorum; repair stale or corrupt copies.
//! 2. Read the segment table file it names, verified against the range and
//!    chained checksum it records (a mismatch is corruption); open the sealed
//!    segments listed there; load each `.idx`, or rebuild it from the log
//!    (verifying the segment against its recorded checksum).
//! 3. Scan the active segment from its start, up to its capacity as the
//!    superblock recorded it (never the configured segment size, which may
//!    have changed): batches below the durable frontier record must all
//!    verify and the log must meet the record exactly (a failure there is
//!    corruption, reported, never truncated); past it, the scan stops at the
//!    first batch that fails its checksum, offset or hash chain, and what
//!    that stop is depends on the flush trailers (see below).
//!    The record is the newest of the superblock frontier and the segment's
//!    three frontier record slots (see `segment::FrontierSlot`); slots and
//!    flush trailers below the superblock's `slot_floor` are void (written
//!    before a tail cut: the trailer scan takes only those at or past the
//!    record's sequence, which is at least the floor).
//!    The block the log ends in is kept for the next flush to rewrite; it
//!    comes from a second read whose batches verify again
//!    (`verified_tail`), so a bit flipped in a read is never written back.
//!    While the superblock marks a cut pending, the log ends at the cut
//!    whatever follows, and open finishes the cut (zeroes the cut bytes,
//!    commits a superblock without the mark) before it returns; see
//!    `truncate.rs`.
//! 4. Files the superblock does not reference are garbage: recycled or
//!    removed. An install whose superblock committed but whose staging
//!    rename did not land is rolled forward; any other staging is garbage.
//!
//! ## The torn-tail bound
//!
//! Every flush is one data write and one fdatasync, linked. The data write
//! carries a trailer (`segment::FlushTrailer`, one 512-byte sector in the
//! zero padding past its last batch, or in one more block when the padding
//! has no room) naming the durable end as it was when the flush was
//! prepared (what earlier, completed fdatasyncs made durable) and the
//! flush's own end. Every `FRONTIER_SLOT_EVERY_FLUSHES`-th flush (32), a
//! flush whose trailer would not fit below the capacity, an idle
//! checkpoint and close also record the durable end in a frontier record
//! slot (or the superblock). Neither record ever names the flush's own
//! bytes as durable, so a torn flush cannot make one claim torn data.
//!
//! Where the walk stops, at W (W is at or past the record):
//! a. the trailer at `trailer_position(W)` is this segment's (partition,
//!    generation, base, capacity and the segment's random nonce match), its
//!    flush ended at W and its chain point is the walk's: the last flush
//!    ended here; nothing more is read;
//! b. zeros where a header was due, and W is the record itself: nothing
//!    was written past the record (a new segment, or a recycled one, whose
//!    first block the roll zeroed);
//! c. otherwise the rest of the segment, up to its recorded capacity (or
//!    the file's end), is read in `SCAN_CHUNK_BYTES` pieces and every
//!    sector decoded as a trailer: one of this segment, no older than the
//!    record, naming a durable end past W proves acknowledged data past W:
//!    Corruption. Without one, W is a torn tail (after the second read,
//!    `batch_reads_whole`, rules out an unstable device).
//!
//! Let flush N be the active segment's last flush that completed before the
//! crash: every acknowledged append ends at or below end(N), and at most
//! flush N+1 is in flight (one flush per partition at a time). Flush N's
//! trailer names end(N-1) and is durable; flush N+1 rewrites the block
//! holding it, and its own trailer, if it landed, names end(N). Hence:
//! - a crash with no damage never loses an acknowledged batch: end(N) is
//!   durable and every batch below it is valid, so the walk passes it;
//! - with damage but no torn write, every batch below end(N-1) verifies or
//!   is Corruption, reported with partition, segment and position: flush
//!   N's trailer (or N+1's) names end(N-1) or more and case c finds it;
//!   what can be dropped as torn is past end(N-1): flush N+1 (in flight,
//!   never acknowledged) and flush N, at most `write_buffer_bytes`
//!   acknowledged bytes, only if they are damaged too;
//! - the one weaker case: power loss tore flush N+1 so that it overwrote
//!   flush N's trailer sector and left no trailer of its own, and batches
//!   are damaged too: then only the newest slot record holds, so at most
//!   the `FRONTIER_SLOT_EVERY_FLUSHES` flushes since it (each at most
//!   `write_buffer_bytes`) can be dropped as torn;
//! - an idle partition closes the window with a checkpoint
//!   (`PartitionStore::prepare_checkpoint`: a slot record of end(N) linked
//!   to an fdatasync, which the shard issues for partitions idle for a
//!   tick); `close` does the same through the superblock.
//!
//! Known limits: a header zeroed whole exactly at the record's position is
//! taken for the log's end (case b); a producer cannot forge a trailer
//! inside a batch without the segment's nonce (random, never sent out), and
//! case c's scan can cost a read of the rest of the segment at the open
//! after a crash that tore a flush.
//!
//! The trailer costs no I/O of its own: one more block on the data write at
//! most, and no fsync.

use std::path::{Path, PathBuf};

use ringlog_protocol::BatchHeader;

use super::walk::{TailFrom, Visit, WalkStop, Walker};
use super::{
    create_segment_file, open_dir, submit_checked, table, write_new_file, ActiveSegment,
    ChainPoint, PartitionStore, SealedFile, StoreConfig, StoreError, StorePool, RECYCLE_DIR,
    STAGING_DIR, SUPERBLOCK_FILE,
};
use crate::io::{
    align_down, align_up, AlignedBuf, FileId, IoBackend, Op, OpenMode, Sqe, BLOCK_SIZE,
};
use crate::journal::ReplayRecord;
use crate::segment::{self, FlushTrailer, FrontierSlot, SealedIndex, SegmentHasher, SparseIndex};
use crate::superblock::{
    choose, half_for, SealedSegment, Superblock, COPY_SIZE_BYTES, FILE_SIZE_BYTES,
};

/// Read size while scanning segments at open.
pub(super) const SCAN_CHUNK_BYTES: usize = 1024 * 1024;

impl PartitionStore {
    /// Opens partition `partition_id` in `dir` and recovers it, with a
    /// private pool (see [`StorePool`]).
    pub fn open(
        io: &mut impl IoBackend,
        dir: &Path,
        partition_id: u32,
        config: StoreConfig,
    ) -> Result<Self, StoreError> {
        let pool = StorePool::private(dir, &config);
        Self::open_in(io, dir, partition_id, config, pool)
    }

    /// Opens partition `partition_id` in `dir` and recovers it, drawing on
    /// `pool`. Holds no write buffer until the first append.
    pub fn open_in(
        io: &mut impl IoBackend,
        dir: &Path,
        partition_id: u32,
        config: StoreConfig,
        pool: StorePool,
    ) -> Result<Self, StoreError> {
        config.validate()?;
        let pid = partition_id;
        let sb_path = dir.join(SUPERBLOCK_FILE);
        let sb_bytes = match pool.take_prefetched(&sb_path) {
            Some(bytes) => bytes,
            None => {
                let sb_file = io
                    .open_file(&sb_path, OpenMode::Existing)
                    .map_err(|e| StoreError::io(pid, "open", &sb_path, e))?;
                let read = read_range(io, sb_file, 0, FILE_SIZE_BYTES);
                // Opened again for each state change: an idle partition
                // keeps only its active segment open.
                io.close(sb_file);
                read.map_err(|e| StoreError::io(pid, "read", &sb_path, e))?
            }
        };
        let chosen = choose(&sb_bytes, &sb_path)?;
        let sb = chosen.superblock;
        if sb.partition_id != pid {
            return Err(corruption(
                pid,
                &sb_path,
                0,
                format!("superblock belongs to partition {}", sb.partition_id),
            ));
        }
        let generation_dir = segment::generation_dir(dir, sb.live_generation);
        roll_install_forward(io, pid, dir, &generation_dir, &sb)?;

        let sealed = open_sealed(io, pid, &generation_dir, &sb, (&config, &pool))?;
        replay_journal(io, pid, &generation_dir, &sb, &pool)?;
        let (active, chain) = recover_active(io, pid, &generation_dir, &sb, (&config, &pool))?;

        let mut store = PartitionStore {
            partition_id,
            config,
            dir: dir.into(),
            sb: sb.clone(),
            generation_dir,
            sealed,
            active,
            chain,
            durable: chain,
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
            spare: super::spare::Spare::Absent,
            reserving: None,
        };
        let repair = copies_worth_repairing(&sb_bytes, &sb, chosen.copies_to_repair);
        if !repair.is_empty() {
            tracing::info!(
                partition = pid,
                copies = ?repair,
                "rewriting stale or damaged superblock copies"
            );
            store.write_superblock_copies(io, &sb, &repair)?;
        }
        if sb.frontier.cut_pending_end != 0 {
            // Recovery ended the log at the cut: its verified tail is the
            // cut block's bytes below the cut.
            let head = store.active.tail.clone();
            store.finish_cut(io, &head)?;
        }
        store.collect_garbage(io)?;
        Ok(store)
    }

    /// Recycles or removes every file the superblock does not reference:
    /// segments created by a roll or purge that did not commit, generations a
    /// purge left behind, surplus recycled files. Removals need no fsync: a
    /// file whose removal is lost is garbage again at the next open.
    /// A private pool's recycle directory is loaded here; a shared one is
    /// loaded once by its owner, and a partition's own `recycle/` left from
    /// before pools were shared is emptied into it.
    fn collect_garbage(&mut self, io: &mut impl IoBackend) -> Result<(), StoreError> {
        let pid = self.partition_id;
        let mut referenced: Vec<PathBuf> = vec![
            segment::log_path(&self.generation_dir, self.active.base_offset),
            table::path(&self.generation_dir, self.sb.table.id),
        ];
        for s in &self.sealed {
            referenced.push(segment::log_path(&self.generation_dir, s.meta.base_offset));
            referenced.push(segment::index_path(
                &self.generation_dir,
                s.meta.base_offset,
            ));
        }
        let recycle_dir = self.dir.join(RECYCLE_DIR);
        let mut ops = Vec::new();
        if self.pool.recycle_dir() == recycle_dir {
            self.pool
                .load_recycled(io)
                .map_err(|e| StoreError::io(pid, "list", &recycle_dir, e))?;
        } else {
            match list(io, pid, &recycle_dir) {
                Ok(files) => {
                    for file in files {
                        self.dispose(&file, &mut ops);
                    }
                    ops.push(Op::RemoveDir { path: recycle_dir });
                }
                Err(StoreError::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }

        let garbage: Vec<PathBuf> = list(io, pid, &self.generation_dir)?
            .into_iter()
            .filter(|p| !referenced.contains(p))
            .collect();
        for path in garbage {
            self.dispose(&path, &mut ops);
        }
        let live_name = self.generation_dir.file_name().map(|n| n.to_owned());
        for path in list(io, pid, &self.dir)? {
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
            let Some(name) = name else { continue };
            let old_generation =
                name.starts_with("gen-") && Some(path.file_name()) != Some(live_name.as_deref());
            // A staging directory the superblock does not name: an install
            // that never committed, rolled back here.
            let staging = name == STAGING_DIR;
            if old_generation || staging {
                for file in list(io, pid, &path)? {
                    if staging {
                        ops.push(Op::Unlink { path: file });
                    } else {
                        self.dispose(&file, &mut ops);
                    }
                }
                ops.push(Op::RemoveDir { path });
            }
        }
        if !ops.is_empty() {
            tracing::info!(
                partition = pid,
                ops = ops.len(),
                "removing unreferenced files"
            );
            self.run_removals(io, ops);
        }
        Ok(())
    }
}

/// Of the copies that do not hold the chosen state `sb`, those to rewrite:
/// every damaged or misplaced copy, and any copy of `sb`'s own half. The
/// other half holding the previous state is how every superblock write
/// leaves the file (see `half_for`), and the next write replaces it:
/// rewriting it at each open would cost an fdatasync per partition at boot
/// and protect nothing.
fn copies_worth_repairing(file: &[u8], sb: &Superblock, candidates: Vec<usize>) -> Vec<usize> {
    let current = half_for(sb.sequence);
    candidates
        .into_iter()
        .filter(|&c| {
            let copy = file.get(c * COPY_SIZE_BYTES..(c + 1) * COPY_SIZE_BYTES);
            let intact = copy
                .and_then(|bytes| Superblock::decode(bytes).ok())
                .is_some_and(|(_, _, index)| usize::from(index) == c);
            current.contains(&c) || !intact
        })
        .collect()
}

/// If the superblock names a generation whose directory is still called
/// `staging`, the install committed but its rename did not land: finish it.
/// Total over what a crash or an older build can leave: a directory with the
/// named generation's name that lacks the files the superblock references,
/// while `staging` holds them all, is a stale attempt (an older build wrote
/// the superblock after a failed rename): it is removed, then the rename is
/// rolled forward. Otherwise `staging` is garbage, removed later.
fn roll_install_forward(
    io: &mut impl IoBackend,
    pid: u32,
    dir: &Path,
    generation_dir: &Path,
    sb: &Superblock,
) -> Result<(), StoreError> {
    let staging = dir.join(STAGING_DIR);
    if !exists(io, pid, &staging)? {
        return Ok(());
    }
    if exists(io, pid, generation_dir)? {
        if holds_generation(io, pid, generation_dir, sb)?
            || !holds_generation(io, pid, &staging, sb)?
        {
            return Ok(());
        }
        tracing::warn!(partition = pid, dir = %generation_dir.display(), "removing a stale generation the committed install replaces");
        // Its files, then the directory itself; no fsync needed: a removal
        // that is lost leaves the same stale state for the next open.
        let unlinks = list(io, pid, generation_dir)?
            .into_iter()
            .map(|path| Sqe::new(Op::Unlink { path }))
            .collect();
        let rmdir = Sqe::new(Op::RemoveDir {
            path: generation_dir.into(),
        });
        for sqes in [unlinks, vec![rmdir]] {
            submit_checked(io, sqes)
                .map_err(|(kind, e)| StoreError::io(pid, kind, generation_dir, e))?;
        }
    }
    tracing::warn!(partition = pid, "rolling an interrupted install forward");
    let dir_file = open_dir(io, pid, dir)?;
    let sqes = vec![
        Sqe::linked(Op::Rename {
            from: staging.clone(),
            to: generation_dir.into(),
        }),
        Sqe::new(Op::Fsync { file: dir_file }),
    ];
    let submitted = submit_checked(io, sqes);
    io.close(dir_file);
    submitted
        .map(|_| ())
        .map_err(|(kind, e)| StoreError::io(pid, kind, &staging, e))
}

fn exists(io: &mut impl IoBackend, pid: u32, path: &Path) -> Result<bool, StoreError> {
    io.exists(path)
        .map_err(|e| StoreError::io(pid, "stat", path, e))
}

/// Whether `dir` holds the segment table the superblock references (whole:
/// it verifies against the superblock) and every segment log it lists.
fn holds_generation(
    io: &mut impl IoBackend,
    pid: u32,
    dir: &Path,
    sb: &Superblock,
) -> Result<bool, StoreError> {
    let metas = match table::load(io, pid, dir, &sb.table) {
        Ok(metas) => metas,
        Err(StoreError::Corruption { .. }) => return Ok(false),
        Err(StoreError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            return Ok(false)
        }
        Err(e) => return Err(e),
    };
    let bases = metas.iter().map(|s| s.base_offset);
    for base in bases.chain([sb.frontier.active_base]) {
        if !exists(io, pid, &segment::log_path(dir, base))? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Opens every sealed segment and loads (or rebuilds) its index.
fn open_sealed(
    io: &mut impl IoBackend,
    pid: u32,
    generation_dir: &Path,
    sb: &Superblock,
    (config, pool): (&StoreConfig, &StorePool),
) -> Result<Vec<SealedFile>, StoreError> {
    let metas = table::load(io, pid, generation_dir, &sb.table)?;
    let mut sealed = Vec::with_capacity(metas.len());
    let mut expected_base = metas.first().map(|s| s.base_offset);
    for (i, meta) in metas.iter().enumerate() {
        let path = segment::log_path(generation_dir, meta.base_offset);
        if Some(meta.base_offset) != expected_base || meta.end_offset <= meta.base_offset {
            return Err(corruption(
                pid,
                &path,
                0,
                "segment table is not contiguous".into(),
            ));
        }
        expected_base = Some(meta.end_offset);
        let file = io
            .open_file(&path, OpenMode::Existing)
            .map_err(|e| StoreError::io(pid, "open sealed segment", &path, e))?;
        let prev = i.checked_sub(1).map(|p| metas[p].last_batch_checksum);
        let loaded = load_index(io, generation_dir, meta)
            .filter(|l| l.chunk_size_bytes == config.transfer_chunk_bytes);
        let loaded = match loaded {
            Some(loaded) => loaded,
            None => {
                tracing::warn!(partition = pid, segment = %path.display(), "rebuilding index");
                let rebuilt_index =
                    rebuild_index(io, pid, &path, file, meta, prev, (config, pool))?;
                let idx_path = segment::index_path(generation_dir, meta.base_offset);
                write_new_file(io, pid, &idx_path, &rebuilt_index.encode(meta.base_offset))?;
                rebuilt_index
            }
        };
        sealed.push(SealedFile {
            meta: *meta,
            file,
            index: loaded.index,
            chunk_checksums: loaded.chunk_checksums,
            index_persisted: true,
        });
    }
    if let Some(end) = expected_base {
        if end != sb.frontier.active_base {
            let path = segment::log_path(generation_dir, sb.frontier.active_base);
            return Err(corruption(
                pid,
                &path,
                0,
                "active segment does not follow the sealed ones".into(),
            ));
        }
    }
    Ok(sealed)
}

/// The segment's `.idx`, if present and valid.
fn load_index(
    io: &mut impl IoBackend,
    generation_dir: &Path,
    meta: &SealedSegment,
) -> Option<SealedIndex> {
    let path = segment::index_path(generation_dir, meta.base_offset);
    let file = io.open_file(&path, OpenMode::Existing).ok()?;
    let bytes = io
        .file_size(file)
        .and_then(|size| read_range(io, file, 0, size as usize));
    io.close(file);
    let loaded = SealedIndex::decode(&bytes.ok()?, meta.base_offset)?;
    // An index pointing past the segment is stale, whatever its checksum.
    let fits = loaded
        .index
        .entries()
        .iter()
        .all(|e| u64::from(e.position) < meta.length_bytes);
    let chunks = meta
        .length_bytes
        .div_ceil(u64::from(loaded.chunk_size_bytes.max(1)));
    // The chunk checksums are what transfers verify chunks against: they
    // must be the ones the superblock's segment checksum was computed from
    // (the `.idx` checksum only says the file is whole, not that it is this
    // segment's, nor of this checksum format).
    let matches_segment = segment::segment_checksum(&loaded.chunk_checksums) == meta.checksum;
    (fits && loaded.chunk_checksums.len() as u64 == chunks && matches_segment).then_some(loaded)
}

/// Rebuilds a sealed segment's index from its log, verifying every batch, the
/// offset range and the whole-segment checksum recorded at seal.
fn rebuild_index(
    io: &mut impl IoBackend,
    pid: u32,
    path: &Path,
    file: FileId,
    meta: &SealedSegment,
    prev_checksum: Option<u64>,
    (config, pool): (&StoreConfig, &StorePool),
) -> Result<SealedIndex, StoreError> {
    let mut index = SparseIndex::default();
    let mut hasher = SegmentHasher::new(config.transfer_chunk_bytes);
    let mut next_offset = meta.base_offset;
    let mut last_checksum = prev_checksum;
    let buf = pool.take_read(SCAN_CHUNK_BYTES);
    let mut walker = Walker::with_buf(file, SCAN_CHUNK_BYTES, buf);
    let walked = walker.walk(io, 0, meta.length_bytes, |position, view| {
        let h = view.header();
        if h.base_offset != next_offset {
            return Visit::Reject(format!(
                "offset {} where {next_offset} was due",
                h.base_offset
            ));
        }
        if last_checksum.is_some_and(|c| c != h.prev_checksum) {
            return Visit::Reject("hash chain broken".into());
        }
        index.observe(
            (h.base_offset - meta.base_offset) as u32,
            position as u32,
            h.max_timestamp_ms,
            config.index_interval_bytes,
        );
        hasher.update(view.as_bytes());
        next_offset = h.next_offset();
        last_checksum = Some(h.header_checksum);
        Visit::Continue
    });
    pool.put_read(walker.into_buf());
    let (end, stop) = walked.map_err(|e| StoreError::io(pid, "read", path, e))?;
    let corrupt = |position: u64, detail: String| StoreError::SealedSegmentCorrupt {
        partition_id: pid,
        segment: path.to_path_buf(),
        base_offset: meta.base_offset,
        detail: format!("at byte {position}: {detail}"),
    };
    if let WalkStop::Invalid { position, reason } = stop {
        return Err(corrupt(position, reason));
    }
    if end != meta.length_bytes
        || next_offset != meta.end_offset
        || hasher.checksum() != meta.checksum
    {
        return Err(corrupt(
            end,
            format!(
                "sealed segment does not match its table entry (length {end} of {}, next offset {next_offset} of {})",
                meta.length_bytes, meta.end_offset
            ),
        ));
    }
    Ok(SealedIndex {
        index,
        chunk_size_bytes: config.transfer_chunk_bytes,
        chunk_checksums: hasher.chunk_checksums(),
    })
}

/// The durable frontier the active segment is held to at open: the
/// superblock's, or the newest frontier record slot past it.
struct Record {
    position: u64,
    next_offset: u64,
    last_checksum: u64,
    /// The next slot write's sequence: never the newest valid slot's.
    slot_sequence: u64,
}

/// Reads the active segment's frontier record slots and picks the newest one
/// that belongs to this very segment (partition, generation, base and
/// capacity match) and is not behind the superblock frontier. Slots that do
/// not decode (torn, never written, or data of a recycled file) are ignored.
fn frontier_record(
    io: &mut impl IoBackend,
    pid: u32,
    (path, file): (&Path, FileId),
    sb: &Superblock,
) -> Result<Record, StoreError> {
    let f = sb.frontier;
    let capacity = f.active_capacity_bytes;
    let bytes = read_range(
        io,
        file,
        capacity,
        (segment::SLOTS * segment::SLOT_BYTES) as usize,
    )
    .map_err(|e| StoreError::io(pid, "read frontier record", path, e))?;
    let owned: Vec<FrontierSlot> = bytes
        .chunks(segment::SLOT_BYTES as usize)
        .enumerate()
        .filter_map(|(i, block)| FrontierSlot::decode(block).map(|s| (i as u64, s)))
        .filter(|(i, s)| {
            s.sequence % segment::SLOTS == *i
                // Written before a tail cut: may name cut positions.
                && s.sequence >= f.slot_floor
                && s.partition_id == pid
                && s.live_generation == sb.live_generation
                && s.active_base == f.active_base
                && s.capacity_bytes == capacity
        })
        .map(|(_, s)| s)
        .collect();
    // Every record of this segment counts toward the sequence in effect,
    // one the checkpoint passed too: a later cut's `slot_floor` (one past
    // that sequence) must void each record that may name cut positions.
    let slot_sequence = owned
        .iter()
        .map(|s| s.sequence + 1)
        .max()
        .unwrap_or(f.slot_floor);
    let newest = owned
        .iter()
        .filter(|s| {
            s.position <= capacity
                && s.position >= f.active_position
                && s.next_offset >= f.next_offset
        })
        .max_by_key(|s| s.sequence);
    debug_assert!(newest.is_none_or(|s| s.sequence < slot_sequence));
    Ok(match newest {
        Some(s) if s.position > f.active_position => Record {
            position: s.position,
            next_offset: s.next_offset,
            last_checksum: s.last_checksum,
            slot_sequence,
        },
        _ => Record {
            position: f.active_position,
            next_offset: f.next_offset,
            last_checksum: f.last_checksum,
            slot_sequence,
        },
    })
}

/// Opens the active segment's file; recreates it if it is a lost empty one.
/// Writes the shard journal's live records of this partition's active
/// segment (as the superblock names it: same superblock sequence, segment
/// base and nonce) into the segment, in sequence order, and fdatasyncs it:
/// after this the segment holds every append the journal made durable, and
/// recovery proceeds as if it had been flushed directly. Records naming an
/// older superblock state were made durable in the segment before that
/// superblock was written, or were cut, purged or replaced on purpose: they
/// are skipped. On failure the records go back to the pool (the next open
/// tries again; a journal checkpoint cannot pass them meanwhile).
fn replay_journal(
    io: &mut impl IoBackend,
    pid: u32,
    generation_dir: &Path,
    sb: &Superblock,
    pool: &StorePool,
) -> Result<usize, StoreError> {
    let records = pool.take_journal_replay(pid);
    if records.is_empty() {
        return Ok(0);
    }
    let f = sb.frontier;
    let mine: Vec<&ReplayRecord> = records
        .iter()
        .filter(|r| {
            r.key.sb_sequence == sb.sequence
                && r.key.nonce == f.active_nonce
                && r.key.active_base == f.active_base
        })
        .collect();
    let result = apply_journal(io, pid, generation_dir, sb, &mine);
    match &result {
        Ok(n) => tracing::info!(
            partition = pid,
            replayed = n,
            skipped = records.len() - n,
            "journal replayed"
        ),
        Err(_) => pool.return_journal_replay(pid, records),
    }
    result
}

fn apply_journal(
    io: &mut impl IoBackend,
    pid: u32,
    generation_dir: &Path,
    sb: &Superblock,
    records: &[&ReplayRecord],
) -> Result<usize, StoreError> {
    if records.is_empty() {
        return Ok(0);
    }
    let capacity = sb.frontier.active_capacity_bytes;
    let path = segment::log_path(generation_dir, sb.frontier.active_base);
    if let Some(r) = records
        .iter()
        .find(|r| r.position + r.bytes.len() as u64 > capacity)
    {
        let detail = format!(
            "journal record {} of {} bytes at {} passes the segment's capacity {capacity}",
            r.seq,
            r.bytes.len(),
            r.position
        );
        return Err(corruption(pid, &path, r.position, detail));
    }
    let (path, file) = open_active_file(io, pid, generation_dir, sb)?;
    let written = write_runs(io, file, records)
        .and_then(|()| submit_checked(io, vec![Sqe::new(Op::Fdatasync { file })]).map(|_| ()))
        .map_err(|(kind, e)| StoreError::io(pid, kind, &path, e));
    io.close(file);
    written.map(|()| records.len())
}

/// Writes each run of contiguous records with one read-modify-write of the
/// blocks it covers (records are byte ranges; O_DIRECT writes whole blocks).
fn write_runs(
    io: &mut impl IoBackend,
    file: FileId,
    records: &[&ReplayRecord],
) -> Result<(), (&'static str, std::io::Error)> {
    let mut i = 0;
    while i < records.len() {
        let start = records[i].position;
        let mut end = start + records[i].bytes.len() as u64;
        let mut j = i + 1;
        while j < records.len() && records[j].position == end {
            end += records[j].bytes.len() as u64;
            j += 1;
        }
        let from = align_down(start);
        let len = (align_up(end) - from) as usize;
        let mut buf = read_range(io, file, from, len).map_err(|e| ("read", e))?;
        // Past the end of the file reads as zeros (the buffer was zeroed).
        buf.set_len(len);
        for r in &records[i..j] {
            let at = (r.position - from) as usize;
            buf[at..at + r.bytes.len()].copy_from_slice(&r.bytes);
        }
        let write = Op::Write {
            file,
            offset: from,
            buf,
        };
        submit_checked(io, vec![Sqe::new(write)])?;
        i = j;
    }
    Ok(())
}

fn open_active_file(
    io: &mut impl IoBackend,
    pid: u32,
    generation_dir: &Path,
    sb: &Superblock,
) -> Result<(PathBuf, FileId), StoreError> {
    let frontier = sb.frontier;
    let path = segment::log_path(generation_dir, frontier.active_base);
    match io.open_file(&path, OpenMode::Existing) {
        Ok(file) => Ok((path, file)),
        // A roll or purge commits its new, still empty active segment in
        // the superblock after fsyncing its directory entry, so a missing
        // file can only be a lost empty one if nothing was checkpointed in
        // it; anything else is damage.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && frontier.active_position == 0 => {
            tracing::warn!(partition = pid, segment = %path.display(), "recreating empty active segment");
            // Created empty: appends allocate as they go.
            let file = create_segment_file(io, pid, &path, 0)?;
            // Appends will land in it: its name must be durable first.
            let dir_file = open_dir(io, pid, generation_dir)?;
            let synced = submit_checked(io, vec![Sqe::new(Op::Fsync { file: dir_file })]);
            io.close(dir_file);
            synced.map_err(|(kind, e)| StoreError::io(pid, kind, generation_dir, e))?;
            Ok((path, file))
        }
        Err(e) => Err(StoreError::io(pid, "open active segment", &path, e)),
    }
}

/// Recovers the active segment: every batch below the durable frontier
/// record must verify and the log must meet the record exactly (else
/// Corruption); past it, the first bad batch ends the log unless a flush
/// trailer proves acknowledged data past it (see `check_tail` and the bound
/// at the top of this file). Every read is bounded by the segment's
/// recorded capacity, never by the current configuration.
pub(super) fn recover_active(
    io: &mut impl IoBackend,
    pid: u32,
    generation_dir: &Path,
    sb: &Superblock,
    (config, pool): (&StoreConfig, &StorePool),
) -> Result<(ActiveSegment, ChainPoint), StoreError> {
    let frontier = sb.frontier;
    let capacity = frontier.active_capacity_bytes;
    let block = BLOCK_SIZE as u64;
    if capacity == 0 || !capacity.is_multiple_of(block) || capacity > u64::from(u32::MAX) + 1 {
        let path = segment::log_path(generation_dir, frontier.active_base);
        let detail = format!("superblock records an active segment capacity of {capacity} bytes");
        return Err(corruption(pid, &path, 0, detail));
    }
    let (path, file) = open_active_file(io, pid, generation_dir, sb)?;
    let record = frontier_record(io, pid, (&path, file), sb)?;
    let mut chain = ChainPoint {
        next_offset: frontier.active_base,
        last_checksum: frontier.active_prev_checksum,
        last_op: frontier.last_op,
    };
    let mut index = SparseIndex::default();
    let mut hasher = SegmentHasher::new(config.transfer_chunk_bytes);
    let mut max_timestamp_ms = 0;
    let meets = |c: &ChainPoint| {
        c.next_offset == record.next_offset && c.last_checksum == record.last_checksum
    };
    let mut met_record = record.position == 0;
    let mut tail_from = TailFrom { position: 0, chain };
    // The pool's read buffer: opening thousands of partitions allocates no
    // scan buffer each. Nothing lies past the end of the file: an empty one
    // (a new or idle partition) is not read at all.
    let mut walker = Walker::with_buf(file, SCAN_CHUNK_BYTES, pool.take_read(SCAN_CHUNK_BYTES));
    let file_bytes = io
        .file_size(file)
        .map_err(|e| StoreError::io(pid, "stat", &path, e))?;
    // An unfinished cut: the log ends at the cut whatever follows (cut
    // bytes, and their frontier records, may remain past it until
    // `finish_cut` zeroes them): no torn-tail check applies past it.
    let limit = if frontier.cut_pending_end != 0 {
        frontier.active_position
    } else {
        capacity.min(file_bytes)
    };
    let walked = walker.walk(io, 0, limit, |position, view| {
        let h = view.header();
        if position == record.position {
            met_record = meets(&chain);
            if !met_record {
                return Visit::Reject("log disagrees with the durable frontier record".into());
            }
        }
        if let Some(reason) = chain_break(h, pid, &chain) {
            return Visit::Reject(reason);
        }
        index.observe(
            (h.base_offset - frontier.active_base) as u32,
            position as u32,
            h.max_timestamp_ms,
            config.index_interval_bytes,
        );
        hasher.update(view.as_bytes());
        tail_from.observe(position, view.as_bytes().len(), &chain);
        max_timestamp_ms = max_timestamp_ms.max(h.max_timestamp_ms);
        chain = ChainPoint {
            next_offset: h.next_offset(),
            last_checksum: h.header_checksum,
            last_op: h.vsr_op,
        };
        Visit::Continue
    });
    let (end, stop) = match walked {
        Ok(walked) => walked,
        Err(e) => {
            pool.put_read(walker.into_buf());
            return Err(StoreError::io(pid, "read", &path, e));
        }
    };
    // Zeros where a header was due are where the log ends (fresh or
    // zeroed space): no single flipped bit makes a header read as zeros.
    let stopped_at_zeros = walker
        .buffered(end, ringlog_protocol::HEADER_LEN)
        .is_some_and(|b| b.iter().all(|&x| x == 0));
    let trailer_at_end = walker
        .buffered(
            segment::trailer_position(end),
            segment::TRAILER_BYTES as usize,
        )
        .map(FlushTrailer::decode);
    pool.put_read(walker.into_buf());
    if end == record.position {
        met_record = meets(&chain);
    }
    if end < record.position || !met_record {
        let reason = match stop {
            WalkStop::Invalid { reason, .. } => reason,
            _ => "log ends below the durable frontier record".into(),
        };
        return Err(corruption(pid, &path, end, reason));
    }
    // A pending cut ends the log at the cut whatever follows (see above).
    if frontier.cut_pending_end == 0 {
        let tail = Tail {
            end,
            chain: &chain,
            stop: &stop,
            stopped_at_zeros,
            limit,
        };
        let trailer_at_end = match trailer_at_end {
            Some(decoded) => decoded,
            None => read_trailer(io, pid, (&path, file), end, limit)?,
        };
        let segment = TrailerOwner::of(pid, sb);
        check_tail(
            io,
            (&path, file),
            &segment,
            &record,
            trailer_at_end,
            &tail,
            pool,
        )?;
    }
    debug_assert!(chain.next_offset >= frontier.next_offset);
    // No write buffer until the first append: only the partial tail block,
    // which the next flush writes back, so taken from a verified read.
    let tail = verified_tail(io, pid, (&path, file), tail_from, (end, &chain), pool)?;
    let active = ActiveSegment {
        base_offset: frontier.active_base,
        file,
        prev_checksum: frontier.active_prev_checksum,
        prev_op: frontier.active_prev_op,
        hasher,
        index,
        max_timestamp_ms,
        end_position: end,
        durable_position: end,
        pending: None,
        tail,
        // Unknown (the file may hold written, preallocated or sparse
        // space): the first append's fallocate covers whatever is missing.
        allocated_bytes: 0,
        overwrite_end: 0,
        capacity_bytes: capacity,
        slot_sequence: record.slot_sequence,
        slot_floor: frontier.slot_floor,
        flushes_since_slot: 0,
        recorded_position: record.position,
        nonce: frontier.active_nonce,
    };
    Ok((active, chain))
}

/// Where the recovery walk of the active segment stopped.
struct Tail<'a> {
    end: u64,
    chain: &'a ChainPoint,
    stop: &'a WalkStop,
    stopped_at_zeros: bool,
    /// Where the segment's bytes end: its recorded capacity or the file's
    /// end, whichever is first.
    limit: u64,
}

/// Who a flush trailer must name to belong to the live active segment.
struct TrailerOwner {
    partition_id: u32,
    live_generation: u64,
    active_base: u64,
    capacity_bytes: u64,
    nonce: u64,
}

impl TrailerOwner {
    fn of(pid: u32, sb: &Superblock) -> Self {
        Self {
            partition_id: pid,
            live_generation: sb.live_generation,
            active_base: sb.frontier.active_base,
            capacity_bytes: sb.frontier.active_capacity_bytes,
            nonce: sb.frontier.active_nonce,
        }
    }

    /// Whether `t`, found at byte `position`, is a trailer this segment's
    /// flush wrote there: its owner, and the place its own end puts it.
    fn wrote(&self, t: &FlushTrailer, position: u64) -> bool {
        t.partition_id == self.partition_id
            && t.live_generation == self.live_generation
            && t.active_base == self.active_base
            && t.capacity_bytes == self.capacity_bytes
            && t.nonce == self.nonce
            && segment::trailer_position(t.end_position) == position
            && t.durable_position <= t.end_position
    }
}

/// Decides what the stop at `tail.end` is, past the durable frontier
/// record (see "The torn-tail bound" at the top of this file):
/// a. the flush trailer right there names this very end: the last flush
///    ended here, whole; nothing more is read;
/// b. zeros where a header was due, exactly at the record: nothing was
///    ever written past it (a new or recycled segment, zeroed at roll);
/// c. otherwise the segment's remaining bytes, up to `tail.limit`, are
///    scanned for trailers: one of this segment (newer than the record)
///    naming a durable end past `tail.end` proves acknowledged data there:
///    Corruption. Without one the stop is a torn tail, unless a second
///    read finds a whole batch there (an unstable device: refused).
fn check_tail(
    io: &mut impl IoBackend,
    (path, file): (&Path, FileId),
    segment: &TrailerOwner,
    record: &Record,
    trailer_at_end: Option<FlushTrailer>,
    tail: &Tail,
    pool: &StorePool,
) -> Result<(), StoreError> {
    let pid = segment.partition_id;
    let end = tail.end;
    let clean = trailer_at_end.is_some_and(|t| {
        segment.wrote(&t, segment::trailer_position(end))
            && t.end_position == end
            && t.end_next_offset == tail.chain.next_offset
            && t.end_last_checksum == tail.chain.last_checksum
    });
    if clean || (tail.stopped_at_zeros && end == record.position) {
        return Ok(());
    }
    let range = (end, tail.limit);
    if let Some((at, t)) = scan_trailers(io, (path, file), segment, record, range, pool)? {
        let detail = format!(
            "the log stops here, but the flush trailer at byte {at} records it durable up to byte {} (next offset {})",
            t.durable_position, t.durable_next_offset
        );
        return Err(corruption(pid, path, end, detail));
    }
    let WalkStop::Invalid { position, reason } = tail.stop else {
        return Ok(());
    };
    if !tail.stopped_at_zeros
        && batch_reads_whole(
            io,
            pid,
            (path, file),
            (*position, tail.limit),
            tail.chain,
            pool,
        )?
    {
        // A second read found a whole batch where the first saw a torn
        // one: a transient read fault, not a torn write. Cutting the log
        // here could drop acknowledged batches, so refuse instead.
        return Err(StoreError::io(
            pid,
            "read",
            path,
            std::io::Error::other(format!(
                "the batch at byte {position} read differently twice ({reason} the first time): unstable device, not opened"
            )),
        ));
    }
    tracing::info!(partition = pid, position, %reason, "log ends at torn or stale tail");
    Ok(())
}

/// The trailer sector at `trailer_position(end)`, read on its own (when the
/// walk's buffer did not hold it); None past `limit` or when it does not
/// decode.
fn read_trailer(
    io: &mut impl IoBackend,
    pid: u32,
    (path, file): (&Path, FileId),
    end: u64,
    limit: u64,
) -> Result<Option<FlushTrailer>, StoreError> {
    let at = segment::trailer_position(end);
    if at + segment::TRAILER_BYTES > limit {
        return Ok(None);
    }
    let block = read_range(io, file, align_down(at), BLOCK_SIZE)
        .map_err(|e| StoreError::io(pid, "read", path, e))?;
    let from = (at - align_down(at)) as usize;
    Ok(block.get(from..).and_then(FlushTrailer::decode))
}

/// Reads `[from, limit)` in [`SCAN_CHUNK_BYTES`] pieces and returns the
/// first trailer (and its position) that `segment` wrote, no older than
/// `record`, whose durable end lies past `from`. Bounded by `limit`: at
/// most the segment's recorded capacity.
fn scan_trailers(
    io: &mut impl IoBackend,
    (path, file): (&Path, FileId),
    segment: &TrailerOwner,
    record: &Record,
    (from, limit): (u64, u64),
    pool: &StorePool,
) -> Result<Option<(u64, FlushTrailer)>, StoreError> {
    let sector = segment::TRAILER_BYTES as usize;
    let first = segment::trailer_position(from);
    let mut at = align_down(first);
    let mut buf = pool.take_read(SCAN_CHUNK_BYTES);
    while at < limit {
        let len = (SCAN_CHUNK_BYTES as u64).min(limit - at) as usize;
        let read = Op::Read {
            file,
            offset: at,
            len: align_up(len as u64) as usize,
            buf,
        };
        let mut done = submit_checked(io, vec![Sqe::new(read)])
            .map_err(|(_, e)| StoreError::io(segment.partition_id, "read", path, e))?;
        buf = done
            .pop()
            .and_then(|c| c.op.into_buf())
            .expect("a read returns its buffer");
        let got = buf.len().min(len);
        let found = buf[..got]
            .chunks_exact(sector)
            .enumerate()
            .map(|(i, bytes)| (at + (i * sector) as u64, bytes))
            .filter(|(position, _)| *position >= first)
            .find_map(|(position, bytes)| {
                FlushTrailer::decode(bytes)
                    .filter(|t| {
                        segment.wrote(t, position)
                            && t.slot_sequence >= record.slot_sequence
                            && t.durable_position > from
                    })
                    .map(|t| (position, t))
            });
        if found.is_some() || got < len {
            pool.put_read(buf);
            return Ok(found);
        }
        at += got as u64;
    }
    pool.put_read(buf);
    Ok(None)
}

/// Why a batch with header `h` cannot follow `chain` in partition `pid`'s
/// active segment, if it cannot.
fn chain_break(h: &BatchHeader, pid: u32, chain: &ChainPoint) -> Option<String> {
    if h.partition_id != pid || h.base_offset != chain.next_offset {
        return Some(format!(
            "offset {} where {} was due",
            h.base_offset, chain.next_offset
        ));
    }
    (h.prev_checksum != chain.last_checksum).then(|| "hash chain broken".into())
}

/// Reads the batch at `position` a second time (fresh I/O) and says whether
/// it is whole and continues `chain`: recovery asks before taking the first
/// bad batch past the frontier record for a torn tail.
fn batch_reads_whole(
    io: &mut impl IoBackend,
    pid: u32,
    (path, file): (&Path, FileId),
    (position, limit): (u64, u64),
    chain: &ChainPoint,
    pool: &StorePool,
) -> Result<bool, StoreError> {
    debug_assert!(position <= limit);
    let mut whole = false;
    let mut walker = Walker::with_buf(file, BLOCK_SIZE, pool.take_read(SCAN_CHUNK_BYTES));
    let walked = walker.walk(io, position, limit, |_, view| {
        whole = chain_break(view.header(), pid, chain).is_none();
        Visit::Reject(String::new())
    });
    pool.put_read(walker.into_buf());
    walked.map_err(|e| StoreError::io(pid, "read", path, e))?;
    Ok(whole)
}

/// Reads for [`verified_tail`] before it gives up on the device.
const TAIL_READ_ATTEMPTS: usize = 3;

/// The bytes `[align_down(end), end)` of the block the log ends in, for a
/// write that puts them back (the next flush, a cut's head block): taken
/// from one read of `[align_down(from.position), end)` whose batches verify
/// again (checksums, and a chain from `from.chain` meeting `end_chain` at
/// `end`), so a bit flipped in that read is never written down. Bounded:
/// under one batch plus two blocks (`from` is the first batch overlapping
/// the end block, see [`TailFrom`]). A read that does not verify is retried, at
/// most [`TAIL_READ_ATTEMPTS`] reads in all; then a typed I/O error
/// (unstable device), nothing written.
pub(super) fn verified_tail(
    io: &mut impl IoBackend,
    pid: u32,
    (path, file): (&Path, FileId),
    from: TailFrom,
    (end, end_chain): (u64, &ChainPoint),
    pool: &StorePool,
) -> Result<Vec<u8>, StoreError> {
    let block_start = align_down(end);
    if end == block_start {
        return Ok(Vec::new());
    }
    debug_assert!(from.position <= block_start);
    let span_bytes = (align_up(end) - align_down(from.position)) as usize;
    for attempt in 1..=TAIL_READ_ATTEMPTS {
        let mut chain = from.chain;
        let mut walker = Walker::with_buf(file, span_bytes, pool.take_read(span_bytes));
        let walked = walker.walk(io, from.position, end, |_, view| {
            let h = view.header();
            if let Some(reason) = chain_break(h, pid, &chain) {
                return Visit::Reject(reason);
            }
            chain = ChainPoint {
                next_offset: h.next_offset(),
                last_checksum: h.header_checksum,
                last_op: h.vsr_op,
            };
            Visit::Continue
        });
        let tail = walker
            .buffered(block_start, (end - block_start) as usize)
            .map(<[u8]>::to_vec);
        pool.put_read(walker.into_buf());
        let (at, stop) = walked.map_err(|e| StoreError::io(pid, "read", path, e))?;
        match tail {
            Some(tail) if at == end && chain == *end_chain => return Ok(tail),
            _ => tracing::warn!(
                partition = pid,
                attempt,
                at,
                ?stop,
                "the log's last block read differently than before"
            ),
        }
    }
    Err(StoreError::io(
        pid,
        "read",
        path,
        std::io::Error::other(format!(
            "the batches from byte {} to the log's end at byte {end} read differently {TAIL_READ_ATTEMPTS} times: unstable device",
            from.position
        )),
    ))
}

/// Reads `[offset, offset + len)` (len rounded up to a block); short at EOF.
pub(super) fn read_range(
    io: &mut impl IoBackend,
    file: FileId,
    offset: u64,
    len: usize,
) -> std::io::Result<AlignedBuf> {
    let buf = AlignedBuf::new(len);
    let len = buf.capacity();
    let read = Op::Read {
        file,
        offset,
        len,
        buf,
    };
    let mut completions = submit_checked(io, vec![Sqe::new(read)]).map_err(|(_, e)| e)?;
    let c = completions.pop().expect("one completion per op");
    Ok(c.op.into_buf().expect("read returns its buffer"))
}

pub(super) fn list(
    io: &mut impl IoBackend,
    pid: u32,
    dir: &Path,
) -> Result<Vec<PathBuf>, StoreError> {
    let names = io
        .list_dir(dir)
        .map_err(|e| StoreError::io(pid, "list", dir, e))?;
    Ok(names.into_iter().map(|n| dir.join(n)).collect())
}

fn corruption(pid: u32, path: &Path, position: u64, detail: String) -> StoreError {
    StoreError::Corruption {
        partition_id: pid,
        segment: path.into(),
        position,
        detail,
    }
}
