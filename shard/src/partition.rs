//! One partition on its owning shard: the store plus the sequencing logic.
//!
//! This is the per-partition hook replication drops into. Today the node is
//! the only replica and the primary of view 0: [`Partition::produce`] stamps
//! offsets, the op number and the hash chain, and appends. With replication,
//! a VSR state machine takes over here (input: message, tick or completion;
//! output: messages and I/O for the shard to execute); the shard's turn
//! loop already treats "append now, acknowledge after the group commit's
//! fdatasync" as separate steps, which is where PrepareOk quorums slot in.

use std::path::{Path, PathBuf};

use ringlog_protocol::wire::{ErrorCode, FetchReply};
use ringlog_protocol::{encode_header, BatchView, HEADER_LEN};
use ringlog_storage::io::IoBackend;
use ringlog_storage::store::{Appended, PartitionStore, StoreConfig, StoreError};

use crate::mailbox::{OpError, PartitionStatus};

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
}

impl Partition {
    /// Opens the partition in `dir`; with `create`, a missing (or, for a
    /// topic still being created, unreadable) directory is created afresh.
    /// Failures leave the partition Unavailable, reported by every request.
    pub fn open(
        io: &mut impl IoBackend,
        dir: &Path,
        topic: &str,
        index: u32,
        id: u32,
        config: StoreConfig,
        create: bool,
    ) -> Partition {
        let state = match open_or_create(io, dir, id, config, create) {
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
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn store_mut(&mut self) -> Option<&mut PartitionStore> {
        match &mut self.state {
            State::Open(s) => Some(s),
            State::Unavailable(_) => None,
        }
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

    pub fn purge(&mut self, io: &mut impl IoBackend) -> Result<(), OpError> {
        self.store_or_err()?.purge(io).map_err(store_error)
    }

    pub fn apply_retention(&mut self, io: &mut impl IoBackend, now_ms: u64) {
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

    /// Flushes, checkpoints the superblock and closes the files.
    pub fn close(self, io: &mut impl IoBackend) -> Result<(), StoreError> {
        match self.state {
            State::Open(s) if s.fenced().is_none() => s.close(io),
            // A fenced store is fail-stop: recover from durable state on
            // restart, write nothing more.
            _ => Ok(()),
        }
    }
}

fn open_or_create(
    io: &mut impl IoBackend,
    dir: &Path,
    id: u32,
    config: StoreConfig,
    create: bool,
) -> Result<PartitionStore, String> {
    if dir.exists() {
        match PartitionStore::open(io, dir, id, config.clone()) {
            Ok(s) => return Ok(s),
            Err(e) if !create => return Err(format!("open {}: {e}", dir.display())),
            Err(e) => {
                // Only a topic that never finished creation gets here: its
                // partitions never acknowledged anything.
                tracing::warn!(dir = %dir.display(), error = %e, "recreating partition of an unfinished topic");
                std::fs::remove_dir_all(dir)
                    .map_err(|e| format!("remove {}: {e}", dir.display()))?;
            }
        }
    } else if !create {
        return Err(format!("partition directory {} is missing", dir.display()));
    }
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent).map_err(|e| format!("mkdir {}: {e}", parent.display()))?;
        if let Some(grand) = parent.parent() {
            crate::catalog::sync_dir(grand).map_err(|e| e.to_string())?;
        }
        crate::catalog::sync_dir(parent).map_err(|e| e.to_string())?;
    }
    PartitionStore::create(io, dir, id, config)
        .map_err(|e| format!("create {}: {e}", dir.display()))
}

/// The client-visible code of a store error.
pub fn store_error(e: StoreError) -> OpError {
    let code = match &e {
        StoreError::Fenced { .. } => ErrorCode::PartitionFenced,
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
