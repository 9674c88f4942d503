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
    /// The filesystem has no room for the append (fallocate or creating a
    /// segment failed with ENOSPC). Nothing was accepted and nothing is
    /// fenced: reads go on, and appends succeed again once space is freed.
    #[error("partition {partition_id}: disk full, append refused ({path})")]
    DiskFull { partition_id: u32, path: PathBuf },
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
    /// A sealed segment (all committed ops) fails verification at open:
    /// its batches, offsets or chain, or the checksum its table entry
    /// recorded at seal. The store does not open, so nothing of it is
    /// served; a replica of it can install a good copy from a peer.
    /// `detail` names the byte position (kept no larger than
    /// [`StoreError::Corruption`]: appends return this type).
    #[error("partition {partition_id}: sealed segment {segment} (from offset {base_offset}) fails verification: {detail}")]
    SealedSegmentCorrupt {
        partition_id: u32,
        segment: PathBuf,
        base_offset: u64,
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
    #[error("partition {partition_id}: {source}")]
    Transfer {
        partition_id: u32,
        #[source]
        source: TransferError,
    },
    /// A tail cut refused before it changed anything.
    #[error("partition {partition_id}: tail cut refused: {source}")]
    Cut {
        partition_id: u32,
        #[source]
        source: CutError,
    },
    /// The append would have to flush first (its write buffer is full, or
    /// it rolls the segment, which flushes) while this partition's flush is
    /// in flight. Nothing was accepted: complete the flush
    /// (`PartitionStore::complete_flush`) and append again;
    /// `PartitionStore::append_waits_for_flush` tells in advance.
    #[error("partition {partition_id}: append must flush first, but a flush is in flight: complete it and append again")]
    FlushInFlight { partition_id: u32 },
    /// Seal only committed data: the active segment is full up to its
    /// capacity and a roll would seal ops above the commit. Nothing was
    /// accepted; the append fits once the tail commits
    /// (`PartitionStore::note_commit`) or is cut.
    #[error("partition {partition_id}: active segment full ({capacity_bytes} bytes) with ops up to {last_op} above the commit {commit}: a roll would seal uncommitted ops")]
    UncommittedTail {
        partition_id: u32,
        last_op: u64,
        commit: u64,
        capacity_bytes: u64,
    },
}

/// Why `PartitionStore::truncate_above` refused a cut (nothing changed).
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum CutError {
    /// The cut would remove committed ops (above `op`, at or below `commit`).
    #[error("cut above op {op} would remove ops up to the commit {commit}")]
    BelowCommit { op: u64, commit: u64 },
    #[error("cut above op {op} is past the log's last op {last_op}")]
    AboveEnd { op: u64, last_op: u64 },
    /// Sealed segments are never cut (only committed ops are sealed).
    #[error("cut above op {op} reaches sealed data (ops up to {sealed_last_op})")]
    IntoSealed { op: u64, sealed_last_op: u64 },
    #[error("a flush is in flight; complete it first")]
    FlushInFlight,
}

/// State transfer refusals and faults, each charged to whoever caused it:
/// the offering peer for stale or malformed offers and bad chunks, the local
/// caller for unknown snapshots.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum TransferError {
    #[error("stale offer: purge generation {offered} below ours {ours}")]
    StalePurgeGeneration { offered: u64, ours: u64 },
    #[error("stale offer: frontier {offered} below ours {ours}")]
    StaleFrontier { offered: u64, ours: u64 },
    #[error("stale offer: commit {offered} below ours {ours}")]
    StaleCommit { offered: u64, ours: u64 },
    #[error("offer is for partition {offered}")]
    WrongPartition { offered: u32 },
    #[error("offer {what} {value} exceeds the cap {max}")]
    OfferTooLarge {
        what: &'static str,
        value: u64,
        max: u64,
    },
    #[error("offered artifact at offset {base_offset} overlaps or leaves a gap")]
    NotContiguous { base_offset: u64 },
    #[error("offered artifacts end at {artifacts_end}, the offered frontier is {next_offset}")]
    FrontierMismatch {
        artifacts_end: u64,
        next_offset: u64,
    },
    #[error("offer chunk size {offered} differs from ours {ours}")]
    ChunkSize { offered: u32, ours: u32 },
    #[error("snapshot {id} is unknown or expired")]
    UnknownSnapshot { id: u64 },
    #[error("already serving {open} snapshots, the limit")]
    TooManySnapshots { open: usize },
    #[error("segments are pinned by {open} open snapshots")]
    Pinned { open: usize },
    #[error("artifact {artifact} chunk {chunk} is outside the manifest")]
    ChunkOutOfRange { artifact: u32, chunk: u32 },
    #[error("artifact {artifact} chunk {chunk}: {reason}")]
    BadChunk {
        artifact: u32,
        chunk: u32,
        reason: String,
    },
    #[error(
        "artifact {artifact} chunk {chunk} is beyond the window of {window_chunks} chunks ahead"
    )]
    OutsideWindow {
        artifact: u32,
        chunk: u32,
        window_chunks: usize,
    },
    #[error("install incomplete: {missing} chunks missing")]
    Incomplete { missing: u64 },
    #[error("staged artifact {artifact} fails verification: {reason}")]
    Verification { artifact: u32, reason: String },
    #[error("appends or a flush are pending; this needs the log idle")]
    Busy,
    #[error(
        "no committed prefix to offer: op {last_op} ends the sealed log, above commit {commit}"
    )]
    NoCommittedPrefix { last_op: u64, commit: u64 },
    #[error("an install is already in progress")]
    InstallInProgress,
    /// A staged write failed or staged bytes failed verification: what is on
    /// disk no longer matches what was verified, so the install can only be
    /// aborted (and started again).
    #[error("install abandoned: {reason}")]
    Poisoned { reason: String },
    /// The snapshot's segments were replaced (an install landed) while it
    /// was served: the peer must open a new one.
    #[error("snapshot {id} is gone: the log it described was replaced")]
    SnapshotGone { id: u64 },
    /// The shard's install budget cannot reserve the next window of disk.
    #[error("install budget: {needed_bytes} bytes to reserve, {free_bytes} free")]
    ReserveBudget { needed_bytes: u64, free_bytes: u64 },
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

/// [`PartitionStore::append_owned`] refused a batch: why, and the batch,
/// untouched (nothing was accepted; retry after a `FlushInFlight`, or drop
/// it, which sends a pooled buffer home).
///
/// [`PartitionStore::append_owned`]: super::PartitionStore::append_owned
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct AppendRefused {
    #[source]
    pub error: StoreError,
    pub batch: crate::io::BatchBuf,
}
