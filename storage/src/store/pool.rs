//! What the partitions of one shard share: write buffers, the read buffer,
//! the read cache of recently durable batches (`cache.rs`) and the recycled
//! segment files.
//!
//! A partition takes a write buffer on its first append after a flush and
//! gives it back when that flush completed with nothing appended behind it,
//! so an idle partition holds none. The same buffers are lent, bounded, to
//! callers that build a batch in place for `PartitionStore::append_owned`
//! ([`StorePool::lend_batch`]; the buffer becomes the write buffer and
//! comes back when its flush completed); reads are synchronous on the shard's
//! thread, so one read buffer serves every partition. Recycled segment files
//! live in one directory per pool, bounded by a count per pool, not per
//! partition. A store used on its own gets a private pool (its directory's
//! `recycle/`, two idle write buffers), which behaves as before pools.
//!
//! The handle is an `Rc`: a shard's partitions live on one thread.

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use super::cache::{CacheRead, ReadCache, ReadCacheStats};
use super::readahead::{ReadAheadAt, ReadAheadBuf, ReadAheadPlan, ReadAheadStats, ReadAheads};
use super::StoreConfig;
use crate::io::{
    AlignedBuf, BatchBuf, BatchId, Completion, IoBackend, Op, OpenMode, PoolExhausted,
    SharedBufPool, Sqe, BLOCK_SIZE,
};
use crate::journal::ReplayRecord;
use crate::superblock::FILE_SIZE_BYTES;

/// Bounds of a pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolConfig {
    /// Data each pooled write buffer holds (the stores'
    /// `write_buffer_bytes`; a buffer is one block larger, for the flush
    /// trailer).
    pub write_buffer_bytes: usize,
    /// Write buffers kept (pre-touched) while no partition needs them;
    /// more are allocated on demand and dropped on return. Buffers in use
    /// are at most two per partition with appends not yet durable.
    pub write_buffers_idle_max: usize,
    /// Write buffers lent out at once for batches built in place
    /// ([`StorePool::lend_batch`]), counted from the lend until the flush
    /// that wrote the batch completed (or the buffer was dropped); one more
    /// is refused with [`PoolExhausted`]. Bounds what callers filling
    /// buffers from outside (request bodies) hold.
    pub batch_buffers_lent_max: usize,
    /// Write buffers carved from one arena made up front, which an io_uring
    /// backend can register as fixed buffers (`StorePool::write_buffers`,
    /// `SharedBufPool::fixed_region`); 0: none (all from the heap, on
    /// demand). They are kept for the pool's life, beyond
    /// `write_buffers_idle_max`.
    pub write_buffers_fixed: usize,
    /// Segment files kept for reuse in `recycle_dir`; the rest are unlinked.
    pub recycled_files_max: usize,
    /// A read buffer that grew past this (one huge batch) is not kept.
    pub read_buffer_bytes_max: usize,
    /// Memory the read cache of recently durable batches may hold, across
    /// the pool's partitions; 0 turns it off (every read goes to the device).
    pub read_cache_bytes_max: usize,
    /// Memory sequential read-ahead may hold, reads in flight included,
    /// across the pool's partitions (one read-ahead per partition, see
    /// `readahead.rs`); 0 turns it off. Only for callers that reap their
    /// ring through [`StorePool::complete_read_ahead`].
    pub read_ahead_bytes_max: usize,
}

/// A private pool has no read cache: a store used on its own (tools, the
/// simulator, whose seeds replay exact I/O sequences) reads the device as
/// before; a shard sizes its pool's cache (`read_cache_bytes`).
pub const PRIVATE_READ_CACHE_BYTES_MAX: usize = 0;

/// A private pool lends at most this many batch buffers at once: two per
/// pipelined partition (one in the flush in flight, one being appended)
/// and slack for a caller that builds ahead.
pub const PRIVATE_BATCH_BUFFERS_LENT_MAX: usize = 4;

impl PoolConfig {
    /// The bounds of a store's private pool.
    pub fn private(config: &StoreConfig) -> Self {
        Self {
            write_buffer_bytes: config.write_buffer_bytes,
            write_buffers_idle_max: 2,
            batch_buffers_lent_max: PRIVATE_BATCH_BUFFERS_LENT_MAX,
            write_buffers_fixed: 0,
            recycled_files_max: config.recycled_files_max,
            read_buffer_bytes_max: 2 * config.read_bytes_max,
            read_cache_bytes_max: PRIVATE_READ_CACHE_BYTES_MAX,
            // A store on its own waits for its own batches: nothing would
            // reap a read queued ahead.
            read_ahead_bytes_max: 0,
        }
    }
}

/// A shared handle to one pool (cheap to clone).
#[derive(Clone)]
pub struct StorePool(Rc<RefCell<Inner>>);

struct Inner {
    config: PoolConfig,
    recycle_dir: PathBuf,
    /// Write buffers (shared with threads that fill lent ones).
    write: SharedBufPool,
    read: Option<AlignedBuf>,
    /// Recycled files, all in `recycle_dir`; at most `recycled_files_max`.
    recycled: Vec<PathBuf>,
    /// Superblock files read ahead for partitions about to open (see
    /// [`StorePool::prefetch_superblocks`]); at most one batch.
    prefetched: HashMap<PathBuf, AlignedBuf>,
    read_cache: ReadCache,
    read_ahead: ReadAheads,
    /// The next store instance's cache key (never reused).
    next_cache_key: u64,
    /// Journal records found at the shard's boot, by partition, until that
    /// partition opens and replays them (see `journal.rs`); bounded by the
    /// journal's size.
    journal_replay: HashMap<u32, Vec<ReplayRecord>>,
}

impl std::fmt::Debug for StorePool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = self.0.borrow();
        f.debug_struct("StorePool")
            .field("recycle_dir", &inner.recycle_dir)
            .field("recycled", &inner.recycled.len())
            .finish()
    }
}

impl StorePool {
    /// An empty pool whose recycled files go to `recycle_dir` (see
    /// [`StorePool::load_recycled`]). No I/O.
    pub fn new(recycle_dir: PathBuf, config: PoolConfig) -> Self {
        // A block past the data: a flush's trailer may need one more block
        // than its padding (see `segment::trailer_write_end`).
        let size_bytes = config.write_buffer_bytes + BLOCK_SIZE;
        let write = match config.write_buffers_fixed {
            0 => SharedBufPool::new(
                size_bytes,
                config.write_buffers_idle_max,
                config.batch_buffers_lent_max,
            ),
            fixed => SharedBufPool::with_fixed(
                size_bytes,
                fixed,
                config.write_buffers_idle_max,
                config.batch_buffers_lent_max,
            ),
        };
        let read_cache = ReadCache::new(config.read_cache_bytes_max);
        let read_ahead = ReadAheads::new(config.read_ahead_bytes_max);
        Self(Rc::new(RefCell::new(Inner {
            read_cache,
            read_ahead,
            next_cache_key: 0,
            config,
            recycle_dir,
            write,
            read: None,
            recycled: Vec::new(),
            prefetched: HashMap::new(),
            journal_replay: HashMap::new(),
        })))
    }

    pub(super) fn private(dir: &Path, config: &StoreConfig) -> Self {
        Self::new(dir.join(super::RECYCLE_DIR), PoolConfig::private(config))
    }

    pub fn recycle_dir(&self) -> PathBuf {
        self.0.borrow().recycle_dir.clone()
    }

    /// Takes the files already in the recycle directory (creating it if
    /// missing), up to the bound; unlinks the rest. Called once, before the
    /// pool's partitions open. Files there are never referenced by any
    /// superblock, so any of them may go.
    pub fn load_recycled(&self, io: &mut impl IoBackend) -> std::io::Result<()> {
        let dir = self.recycle_dir();
        if !io.exists(&dir)? {
            io.create_dir(&dir)?;
        }
        let mut names = io.list_dir(&dir)?;
        names.sort();
        let mut inner = self.0.borrow_mut();
        let max = inner.config.recycled_files_max;
        let mut surplus = Vec::new();
        for name in names {
            let path = dir.join(name);
            if inner.recycled.len() < max && !inner.recycled.contains(&path) {
                inner.recycled.push(path);
            } else if !inner.recycled.contains(&path) {
                surplus.push(Sqe::new(Op::Unlink { path }));
            }
        }
        drop(inner);
        for c in io.submit(surplus) {
            if let Err(e) = c.result {
                tracing::warn!(op = ?c.op, error = %e, "removing a surplus recycled file failed");
            }
        }
        Ok(())
    }

    /// Reads the superblock files of the partitions in `dirs` in one
    /// submission and keeps them for their [`PartitionStore::open_in`]:
    /// opening thousands of partitions one read at a time waits on the
    /// device for each. Replaces the previous batch (memory: one superblock
    /// file per dir). A file that cannot be read is left to its open, which
    /// reports why.
    ///
    /// [`PartitionStore::open_in`]: super::PartitionStore::open_in
    pub fn prefetch_superblocks(&self, io: &mut impl IoBackend, dirs: &[&Path]) {
        let mut files = Vec::with_capacity(dirs.len());
        let mut sqes = Vec::with_capacity(dirs.len());
        for dir in dirs {
            let path = dir.join(super::SUPERBLOCK_FILE);
            let Ok(file) = io.open_file(&path, OpenMode::Existing) else {
                continue;
            };
            files.push((file, path));
            sqes.push(Sqe::new(Op::Read {
                file,
                offset: 0,
                len: FILE_SIZE_BYTES,
                buf: AlignedBuf::new(FILE_SIZE_BYTES),
            }));
        }
        let completions = io.submit(sqes);
        let mut inner = self.0.borrow_mut();
        inner.prefetched.clear();
        for (c, (file, path)) in completions.into_iter().zip(files) {
            io.close(file);
            if c.result.is_ok() {
                if let Some(buf) = c.op.into_buf() {
                    inner.prefetched.insert(path, buf);
                }
            }
        }
    }

    /// The bytes of superblock file `path` if they were read ahead.
    pub(super) fn take_prefetched(&self, path: &Path) -> Option<AlignedBuf> {
        self.0.borrow_mut().prefetched.remove(path)
    }

    /// Drops whatever a prefetch read that no open took.
    pub fn clear_prefetched(&self) {
        self.0.borrow_mut().prefetched.clear();
    }

    /// A cleared write buffer of at least `size_bytes`.
    pub(super) fn take_write(&self, size_bytes: usize) -> AlignedBuf {
        let inner = self.0.borrow();
        if size_bytes <= inner.write.buf_size_bytes() {
            return inner.write.take();
        }
        AlignedBuf::new(size_bytes)
    }

    /// Done with a write buffer: a pooled one goes home (to the pool that
    /// lent it, which may be another shard's), others are freed.
    pub(super) fn put_write(&self, buf: AlignedBuf) {
        drop(buf);
    }

    /// A write buffer lent for one batch built in place, to start
    /// `lead_bytes` into its block (`PartitionStore::batch_lead_bytes`);
    /// refused while [`PoolConfig::batch_buffers_lent_max`] are out.
    pub fn lend_batch(&self, lead_bytes: usize) -> Result<BatchBuf, PoolExhausted> {
        self.0.borrow().write.try_lend_batch(lead_bytes)
    }

    /// The write buffer pool itself, for lending from another thread (it
    /// is `Send + Sync`; its buffers return to it from anywhere).
    pub fn write_buffers(&self) -> SharedBufPool {
        self.0.borrow().write.clone()
    }

    /// The read buffer (or a new one) of at least `size_bytes`.
    pub(super) fn take_read(&self, size_bytes: usize) -> AlignedBuf {
        match self.0.borrow_mut().read.take() {
            Some(buf) if buf.capacity() >= size_bytes => buf,
            _ => AlignedBuf::new(size_bytes),
        }
    }

    /// Done with a read buffer: kept as the read buffer, or (after a read
    /// served from a read-ahead's buffer, the read buffer still kept) as a
    /// spare for the next read-ahead.
    pub(super) fn put_read(&self, buf: AlignedBuf) {
        let mut inner = self.0.borrow_mut();
        if buf.capacity() > inner.config.read_buffer_bytes_max {
            return;
        }
        if inner.read.is_none() {
            inner.read = Some(buf);
        } else {
            inner.read_ahead.recycle(buf);
        }
    }

    /// A recycled file to reuse, if any.
    pub(super) fn take_recycled(&self) -> Option<PathBuf> {
        self.0.borrow_mut().recycled.pop()
    }

    /// Where a disposed segment file named `name` goes if the pool has
    /// room (the caller renames it there), else None (unlink it).
    pub(super) fn offer_recycled(&self, name: &str) -> Option<PathBuf> {
        let mut inner = self.0.borrow_mut();
        let to = inner.recycle_dir.join(name);
        let full = inner.recycled.len() >= inner.config.recycled_files_max;
        if full || inner.recycled.contains(&to) {
            return None;
        }
        inner.recycled.push(to.clone());
        Some(to)
    }

    /// A rename into the pool failed: the file is not there.
    pub(super) fn forget_recycled(&self, path: &Path) {
        self.0.borrow_mut().recycled.retain(|p| p != path);
    }

    /// Recycled files held.
    pub fn recycled_count(&self) -> usize {
        self.0.borrow().recycled.len()
    }

    /// Write buffers kept idle.
    pub fn idle_write_buffers(&self) -> usize {
        self.0.borrow().write.idle()
    }

    /// A cache key for a store instance opening in this pool.
    pub(super) fn new_cache_key(&self) -> u64 {
        let mut inner = self.0.borrow_mut();
        inner.next_cache_key += 1;
        inner.next_cache_key
    }

    /// Whether reads may be served from memory at all.
    pub(super) fn cache_enabled(&self) -> bool {
        self.0.borrow().read_cache.enabled()
    }

    /// Newly durable whole batches of store `key` from offset `base`.
    pub(super) fn cache_insert(&self, key: u64, base: u64, bytes: &[u8]) {
        self.0.borrow_mut().read_cache.insert(key, base, bytes);
    }

    /// Newly durable whole batches `buf[range]` of store `key` from offset
    /// `base`, the write buffer kept as the cache entry (no copy).
    pub(super) fn cache_insert_written(
        &self,
        key: u64,
        base: u64,
        mut buf: AlignedBuf,
        range: std::ops::Range<usize>,
    ) {
        // Its flush completed: a lent batch buffer's lend is over.
        buf.end_lend();
        let mut inner = self.0.borrow_mut();
        inner.read_cache.insert_written(key, base, buf, range);
    }

    /// A read answered from memory into the empty `out`: its next offset,
    /// or None (`out` left empty).
    pub(super) fn cache_read(&self, r: &CacheRead, out: &mut Vec<u8>) -> Option<u64> {
        self.0.borrow_mut().read_cache.read(r, out)
    }

    /// A tail cut of store `key` at `offset`.
    pub(super) fn cache_cut(&self, key: u64, offset: u64) {
        let mut inner = self.0.borrow_mut();
        inner.read_cache.cut(key, offset);
        inner.read_ahead.invalidate(key);
    }

    /// Retention moved store `key`'s log start to `offset`.
    pub(super) fn cache_drop_below(&self, key: u64, offset: u64) {
        let mut inner = self.0.borrow_mut();
        inner.read_cache.drop_below(key, offset);
        // Its segment may be among the removed files.
        inner.read_ahead.invalidate(key);
    }

    /// Store `key` switched generation or closed.
    pub(super) fn cache_forget(&self, key: u64) {
        let mut inner = self.0.borrow_mut();
        inner.read_cache.forget(key);
        inner.read_ahead.invalidate(key);
    }

    /// Whether reads may be queued ahead at all.
    pub(super) fn read_ahead_enabled(&self) -> bool {
        self.0.borrow().read_ahead.enabled()
    }

    /// A buffer for the read-ahead `plan`, within the bounds (see
    /// `readahead.rs`), or None.
    pub(super) fn read_ahead_reserve(&self, plan: &ReadAheadPlan) -> Option<AlignedBuf> {
        self.0.borrow_mut().read_ahead.reserve(plan)
    }

    /// The reserved read-ahead `plan` was queued as `batch`.
    pub(super) fn read_ahead_submitted(&self, batch: BatchId, plan: ReadAheadPlan) {
        self.0.borrow_mut().read_ahead.submitted(batch, plan);
    }

    /// The held read-ahead for `at` (a hit), if any.
    pub(super) fn read_ahead_take(&self, at: &ReadAheadAt) -> Option<ReadAheadBuf> {
        self.0.borrow_mut().read_ahead.take(at)
    }

    pub(super) fn read_ahead_pending(&self, key: u64, from_offset: u64) -> bool {
        self.0.borrow().read_ahead.pending(key, from_offset)
    }

    /// Hands a reaped batch to read-ahead: None if it was one of its reads
    /// (taken), else the completions back (the caller's own batch).
    /// Whoever reaps the ring the pool's stores read from offers it every
    /// batch first.
    pub fn complete_read_ahead(
        &self,
        batch: BatchId,
        completions: Vec<Completion>,
    ) -> Option<Vec<Completion>> {
        let mut inner = self.0.borrow_mut();
        if !inner.read_ahead.owns(batch) {
            return Some(completions);
        }
        let taken = inner.read_ahead.complete(batch, completions);
        debug_assert!(taken);
        None
    }

    /// Read-ahead reads queued and not reaped yet (a shard waits for them
    /// before closing its partitions' files).
    pub fn read_aheads_running(&self) -> usize {
        self.0.borrow().read_ahead.running()
    }

    /// The read-ahead counters.
    pub fn read_ahead_stats(&self) -> ReadAheadStats {
        self.0.borrow().read_ahead.stats()
    }

    /// The read cache's counters.
    pub fn read_cache_stats(&self) -> ReadCacheStats {
        self.0.borrow().read_cache.stats()
    }

    /// Hands the journal's live records (from [`Journal::open`]) to the
    /// partitions that open from this pool: each replays its own before it
    /// recovers (see `open.rs`).
    ///
    /// [`Journal::open`]: crate::journal::Journal::open
    pub fn set_journal_replay(&self, records: Vec<ReplayRecord>) {
        let mut inner = self.0.borrow_mut();
        for r in records {
            inner
                .journal_replay
                .entry(r.key.partition_id)
                .or_default()
                .push(r);
        }
    }

    /// Whether some partition has not replayed its journal records yet: a
    /// journal checkpoint must not pass them.
    pub fn journal_replay_pending(&self) -> bool {
        !self.0.borrow().journal_replay.is_empty()
    }

    /// The partitions whose journal records wait for them to open.
    pub fn journal_replay_pids(&self) -> Vec<u32> {
        self.0.borrow().journal_replay.keys().copied().collect()
    }

    /// Forgets the journal records of a partition that is gone for good.
    pub fn discard_journal_replay(&self, partition_id: u32) {
        self.0.borrow_mut().journal_replay.remove(&partition_id);
    }

    pub(super) fn take_journal_replay(&self, partition_id: u32) -> Vec<ReplayRecord> {
        self.0
            .borrow_mut()
            .journal_replay
            .remove(&partition_id)
            .unwrap_or_default()
    }

    /// Gives back records a failed open did not replay (durably).
    pub(super) fn return_journal_replay(&self, partition_id: u32, records: Vec<ReplayRecord>) {
        if !records.is_empty() {
            self.0
                .borrow_mut()
                .journal_replay
                .insert(partition_id, records);
        }
    }

    pub fn config(&self) -> PoolConfig {
        self.0.borrow().config.clone()
    }
}
