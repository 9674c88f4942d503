//! Typed errors of the partition store.

use std::io;
use std::path::PathBuf;

use ringlog_protocol::BatchError;
use thiserror::Error;

use crate::superblock::SuperblockError;

#[derive(Debug, Error)]
pub enum StoreError {
    #[error("partition {partition_id}: {what} {path}: {source}")]
    Io {
        partition_id: u32,
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// A write or fsync failed: the partition stops (fail-stop) and recovers
    /// from durable state on restart. Never cleared in-process.
    #[error("partition {partition_id} is fenced after an I/O failure: {cause}")]
    Fenced { partition_id: u32, cause: String },
    #[error(transparent)]
    Superblock(#[from] SuperblockError),
    /// Bytes below the durable frontier (or in a sealed segment) fail
    /// verification: never truncated, reported for repair.
    #[error("partition {partition_id}: corruption in {segment} at byte {position}: {detail}")]
    Corruption {
        partition_id: u32,
        segment: PathBuf,
        position: u64,
        detail: String,
    },
    #[error("partition {partition_id}: invalid batch: {source}")]
    InvalidBatch {
        partition_id: u32,
        #[source]
        source: BatchError,
    },
    #[error("partition {partition_id}: batch for partition {batch_partition_id}")]
    WrongPartition {
        partition_id: u32,
        batch_partition_id: u32,
    },
    #[error("partition {partition_id}: batch base offset {actual}, expected {expected}")]
    OffsetMismatch {
        partition_id: u32,
        expected: u64,
        actual: u64,
    },
    #[error(
        "partition {partition_id}: batch prev checksum {actual:#x} does not chain to {expected:#x}"
    )]
    ChainMismatch {
        partition_id: u32,
        expected: u64,
        actual: u64,
    },
    #[error("partition {partition_id}: batch of {len_bytes} bytes exceeds the limit {max_bytes}")]
    BatchTooLarge {
        partition_id: u32,
        len_bytes: usize,
        max_bytes: usize,
    },
    #[error("partition {partition_id}: offset {offset} is outside the log [{start}, {end})")]
    OffsetOutOfRange {
        partition_id: u32,
        offset: u64,
        start: u64,
        end: u64,
    },
    #[error("partition directory {path} already exists")]
    AlreadyExists { path: PathBuf },
    #[error("invalid store config: {0}")]
    Config(String),
}

impl StoreError {
    pub(crate) fn io(
        partition_id: u32,
        what: &'static str,
        path: impl Into<PathBuf>,
        source: io::Error,
    ) -> Self {
        StoreError::Io {
            partition_id,
            what,
            path: path.into(),
            source,
        }
    }
}
