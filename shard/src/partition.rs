//! One partition on its owning shard: the store plus the sequencing logic.
//!
//! This is the per-partition hook replication drops into. Today the node is
//! the only replica and the primary of view 0: [`Partition::produce`] stamps
//! offsets, the op number and the hash chain, and appends. With replication,
//! a VSR state machine takes over here (input: message, tick or completion;
//! output: messages and I/O for the shard to execute); the shard's turn
//! loop already treats "append now, acknowledge after the group commit's
//! fdatasync" as separate steps, which is where PrepareOk quorums slot in.
//!
//! Flushes run asynchronously on the shard's storage ring: at most one per
//! partition is in flight ([`Partition::prepare_flush`] until
//! [`Partition::complete_flush`]). Appends may go on meanwhile as long as
//! they cannot make the store flush on its own (a full write buffer or a
//! segment roll flushes synchronously, which would be a second flush of the
//! same bytes): [`Partition::append_must_wait`] tells the shard to hold such
//! an append until the flush completed.

use std::path::{Path, PathBuf};

use ringlog_protocol::wire::{ErrorCode, FetchReply};
use ringlog_protocol::{encode_header, BatchView, HEADER_LEN};
use ringlog_storage::io::{align_down, Completion, IoBackend, Op, Sqe};
use ringlog_storage::store::{Appended, PartitionStore, StoreConfig, StoreError, StorePool};

use crate::ops::{OpError, PartitionStatus};

enum State {
    Open(Box<PartitionStore>),
    /// Could not be opened or created; every request gets an error.
    Unavailable(String),
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
        let state = match open_or_create(io, pool, dir, id, config, create) {
            Ok(store) => State::Open(Box::new(store)),
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
    /// [`Partition::complete_flush`], in order. Fails only when fenced.
    pub fn prepare_flush(&mut self, sqes: &mut Vec<Sqe>) -> Result<usize, StoreError> {
        if self.flush_end.is_some() {
            return Ok(0);
        }
        let State::Open(store) = &mut self.state else {
            return Ok(0);
        };
        let end = active_end(store);
        let n = store.prepare_flush(sqes)?;
        if n > 0 {
            self.flush_end = Some(end);
        }
        Ok(n)
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
        let State::Open(store) = &mut self.state else {
            return Ok(0);
        };
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

    /// Takes back the completions of the flush in flight. A failure fences
    /// the store (fail-stop) and is returned.
    pub fn complete_flush(
        &mut self,
        completions: impl IntoIterator<Item = Completion>,
    ) -> Result<(), StoreError> {
        let was = self.flush_end.take();
        debug_assert!(was.is_some(), "complete_flush without a flush in flight");
        match &mut self.state {
            State::Open(store) => store.complete_flush(completions),
            State::Unavailable(_) => Ok(()),
        }
    }

    /// Whether appending a batch of `len` bytes now would make the store
    /// flush synchronously (its write buffer would overflow, or the segment
    /// would roll) while a flush is in flight: such an append waits for the
    /// completion. The buffer holds `[align_down(flush end), end)` plus the
    /// batch and flushes when that exceeds `write_buffer_bytes`.
    pub fn append_must_wait(&self, len: usize) -> bool {
        let (Some(flush_end), State::Open(store)) = (self.flush_end, &self.state) else {
            return false;
        };
        let config = store.config();
        let end = active_end(store);
        let len = len as u64;
        let buffered = end.saturating_sub(align_down(flush_end));
        buffered + len > config.write_buffer_bytes as u64
            || (end > 0 && end + len > store.active_capacity_bytes())
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn store(&self) -> Result<&PartitionStore, OpError> {
        match &self.state {
            State::Open(s) => Ok(s),
            State::Unavailable(m) => Err(OpError::new(ErrorCode::PartitionUnavailable, m.clone())),
        }
    }

    fn store_or_err(&mut self) -> Result<&mut PartitionStore, OpError> {
        match &mut self.state {
            State::Open(s) => Ok(s),
            State::Unavailable(m) => Err(OpError::new(ErrorCode::PartitionUnavailable, m.clone())),
        }
    }

    /// The primary's sequencing step: validates the producer's batch (header,
    /// body checksum, record structure), stamps partition id, base offset,
    /// op, view and chain link into its header, and appends it. Not durable
    /// until the shard's group commit completes.
    pub fn produce(
        &mut self,
        io: &mut impl IoBackend,
        mut batch: Vec<u8>,
    ) -> Result<Appended, OpError> {
        let id = self.id;
        let store = self.store_or_err()?;
        let max = store.config().batch_bytes_max();
        let view = BatchView::parse(&batch)
            .map_err(|e| OpError::new(ErrorCode::InvalidBatch, e.to_string()))?;
        if view.as_bytes().len() != batch.len() {
            return Err(OpError::new(
                ErrorCode::InvalidBatch,
                format!(
                    "{} bytes after the batch (one batch per produce)",
                    batch.len() - view.as_bytes().len()
                ),
            ));
        }
        if batch.len() > max {
            return Err(OpError::new(
                ErrorCode::BatchTooLarge,
                format!("batch of {} bytes exceeds {max}", batch.len()),
            ));
        }
        let mut header = *view.header();
        let chain = store.chain();
        header.partition_id = id;
        header.base_offset = chain.next_offset;
        header.vsr_op = chain.last_op + 1;
        header.vsr_view = 0;
        header.prev_checksum = chain.last_checksum;
        if header
            .base_offset
            .checked_add(u64::from(header.record_count))
            .is_none()
        {
            return Err(OpError::new(ErrorCode::Internal, "offset space exhausted"));
        }
        let head = batch
            .first_chunk_mut::<HEADER_LEN>()
            .ok_or_else(|| OpError::new(ErrorCode::InvalidBatch, "truncated batch"))?;
        encode_header(&header, head);
        store.append(io, &batch).map_err(store_error)
    }

    /// Durable batches from `offset`.
    pub fn fetch(
        &mut self,
        io: &mut impl IoBackend,
        offset: u64,
        max_bytes: u32,
    ) -> Result<FetchReply, OpError> {
        let index = self.index;
        let store = self.store_or_err()?;
        let fetched = store
            .read(io, offset, max_bytes as usize)
            .map_err(store_error)?;
        Ok(FetchReply {
            partition: index,
            next_offset: fetched.next_offset,
            log_start_offset: store.log_start_offset(),
            high_watermark: store.durable().next_offset,
            batches: fetched.bytes,
        })
    }

    /// An empty fetch result at the current end (long-poll timeout).
    pub fn empty_fetch(&self, offset: u64) -> FetchReply {
        let (start, hwm) = match &self.state {
            State::Open(s) => (s.log_start_offset(), s.durable().next_offset),
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
            State::Open(s) => Some(s.durable().next_offset),
            State::Unavailable(_) => None,
        }
    }

    /// Drops every stored batch (flushes first). The caller lets a flush in
    /// flight complete first.
    pub fn purge(&mut self, io: &mut impl IoBackend) -> Result<(), OpError> {
        debug_assert!(self.flush_end.is_none(), "purge with a flush in flight");
        self.store_or_err()?.purge(io).map_err(store_error)
    }

    /// Maintenance; skipped while a flush is in flight (next tick).
    pub fn apply_retention(&mut self, io: &mut impl IoBackend, now_ms: u64) {
        if self.flush_end.is_some() {
            return;
        }
        if let State::Open(s) = &mut self.state {
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
            State::Open(s) => {
                st.log_start_offset = s.log_start_offset();
                st.frontier = s.chain().next_offset;
                st.commit = s.durable().next_offset;
                st.sealed_segments = s.sealed_segments().count();
                st.size_bytes = s.size_bytes();
                st.purge_generation = s.superblock().purge_generation;
                st.fault = s.fenced().map(str::to_string);
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
            State::Open(s) => {
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
                p.complete_flush(completions).unwrap();
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
            let app = p.produce(&mut io, b).unwrap();
            assert_eq!(app.base_offset, records_in);
            records_in += n as u64;
            match flight {
                None if next(3) == 0 => {
                    let mut sqes = Vec::new();
                    if p.prepare_flush(&mut sqes).unwrap() > 0 {
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
                        assert_eq!(p.prepare_flush(&mut sqes).unwrap(), 0);
                        assert!(sqes.is_empty());
                    }
                }
            }
        }
        if let Some(id) = flight.take() {
            complete(&mut io, &mut p, id);
        }
        let mut sqes = Vec::new();
        if p.prepare_flush(&mut sqes).unwrap() > 0 {
            let id = io.submit_nowait(sqes);
            complete(&mut io, &mut p, id);
        }
        assert!(waited > 0 && behind > 0, "waited {waited}, behind {behind}");
        assert_eq!(p.high_watermark(), Some(records_in));
        assert!(p.status(0).sealed_segments > 0, "segments rolled");

        let mut offset = 0;
        let mut seen = 0u64;
        while offset < records_in {
            let f = p.fetch(&mut io, offset, 1 << 20).unwrap();
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
            assert!(p.prepare_flush(&mut sqes).unwrap() > 0);
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
        p.produce(&mut io, batch(3, 100, 1)).unwrap();
        let mut sqes = Vec::new();
        assert_eq!(p.prepare_flush(&mut sqes).unwrap(), 2);
        // Appends behind the flush go on...
        p.produce(&mut io, batch(2, 100, 2)).unwrap();
        let mut completions = io.submit(sqes);
        completions[1].result = Err(std::io::Error::from_raw_os_error(libc::EIO));
        let err = p.complete_flush(completions).unwrap_err();
        assert!(matches!(err, StoreError::Fenced { .. }), "{err}");
        assert!(!p.flush_in_flight());
        // ...but nothing became durable, and the partition is fail-stop.
        assert_eq!(p.high_watermark(), Some(0));
        let fault = p.status(0).fault.expect("fenced");
        assert!(fault.contains("fdatasync"), "{fault}");
        let e = p.produce(&mut io, batch(1, 10, 3)).unwrap_err();
        assert_eq!(e.code, ErrorCode::PartitionFenced);
        assert!(p.prepare_flush(&mut Vec::new()).is_err());
    }
}
