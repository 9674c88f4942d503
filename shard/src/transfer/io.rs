//! The transfer's storage executor: runs each [`TransferOp`] on a
//! [`PartitionStore`] and an [`IoBackend`], for the shard (io_uring) and
//! the simulator alike. The caller passes its clock (`now_ms`, for the
//! store's snapshot leases) and runs one partition's operations in
//! emission order.
//!
//! A replicated serve offers only what is at or below the commit (DESIGN.md
//! section 7): `open_snapshot` describes the durable log, the active tail
//! included, so [`execute`] cuts every trailing artifact holding an op
//! above the commit off the manifest (sealed segments hold only committed
//! ops, so at most the active tail goes) and names the frontier before it.
//! The lease still pins what the store opened; the server checks every
//! requested key against the cut manifest, so the tail is never read.

use std::collections::BTreeMap;
use std::sync::Arc;

use ringlog_protocol::manifest::Manifest;
use ringlog_protocol::BatchHeader;
use ringlog_storage::io::IoBackend;
use ringlog_storage::store::{Install, InstallBudget, PartitionStore, StoreError, TransferError};

use super::types::{ChunkData, Fault, FaultKind, IoOutcome, TransferOp};

/// A shard's installs: at most `installs_max` at once (one per partition),
/// within one disk reservation budget.
pub struct Installs {
    installs_max: usize,
    budget: InstallBudget,
    active: BTreeMap<u32, Install>,
}

impl Installs {
    pub fn new(installs_max: usize, budget: InstallBudget) -> Self {
        assert!(installs_max > 0, "a shard must allow an install");
        Self {
            installs_max,
            budget,
            active: BTreeMap::new(),
        }
    }

    /// Installs in progress on the shard.
    pub fn active(&self) -> usize {
        self.active.len()
    }

    pub fn budget(&self) -> &InstallBudget {
        &self.budget
    }
}

/// Runs `op` for `store`'s partition.
pub fn execute(
    store: &mut PartitionStore,
    io: &mut impl IoBackend,
    installs: &mut Installs,
    op: &TransferOp,
    now_ms: u64,
) -> Result<IoOutcome, Fault> {
    let pid = store.partition_id();
    match op {
        TransferOp::OpenSnapshot { commit } => open_committed(store, io, *commit, now_ms),
        TransferOp::ReadChunks { snapshot_id, keys } => {
            let pairs: Vec<(u32, u32)> = keys.iter().map(|k| (k.artifact, k.chunk)).collect();
            let bufs = store
                .read_chunks(io, *snapshot_id, &pairs, now_ms)
                .map_err(fault)?;
            let chunks: Vec<ChunkData> = bufs.iter().map(|b| ChunkData::from(&b[..])).collect();
            Ok(IoOutcome::Chunks(chunks))
        }
        TransferOp::ReleaseSnapshot { snapshot_id } => {
            store.release_snapshot(*snapshot_id);
            Ok(IoOutcome::Done)
        }
        TransferOp::BeginInstall { manifest } => {
            if installs.active.len() >= installs.installs_max {
                return Err(Fault {
                    kind: FaultKind::Transient,
                    reason: format!("{} installs running, the limit", installs.active.len()),
                });
            }
            let install = store
                .begin_install(io, Manifest::clone(manifest), &installs.budget)
                .map_err(fault)?;
            installs.active.insert(pid, install);
            Ok(IoOutcome::Done)
        }
        TransferOp::AcceptChunks { chunks } => {
            let install = installs.active.get_mut(&pid).ok_or_else(no_install)?;
            let chunks: Vec<(u32, u32, &[u8])> = chunks
                .iter()
                .map(|(k, data)| (k.artifact, k.chunk, &data[..]))
                .collect();
            install.accept_chunks(io, &chunks).map_err(fault)?;
            Ok(IoOutcome::Done)
        }
        TransferOp::CommitInstall => {
            let install = installs.active.remove(&pid).ok_or_else(no_install)?;
            store.commit_install(io, install).map_err(fault)?;
            Ok(IoOutcome::Done)
        }
        TransferOp::AbortInstall => {
            if let Some(install) = installs.active.remove(&pid) {
                store.abort_install(io, install).map_err(fault)?;
            }
            Ok(IoOutcome::Done)
        }
    }
}

fn no_install() -> Fault {
    Fault {
        kind: FaultKind::Local,
        reason: "no install in progress for the partition".into(),
    }
}

/// Whose fault a store error is.
pub fn fault(e: StoreError) -> Fault {
    let kind = match &e {
        StoreError::Transfer { source, .. } => match source {
            TransferError::Busy
            | TransferError::InstallInProgress
            | TransferError::ReserveBudget { .. }
            | TransferError::TooManySnapshots { .. }
            | TransferError::Pinned { .. } => FaultKind::Transient,
            TransferError::UnknownSnapshot { .. } | TransferError::SnapshotGone { .. } => {
                FaultKind::Gone
            }
            TransferError::Poisoned { .. } | TransferError::Incomplete { .. } => FaultKind::Local,
            _ => FaultKind::Peer,
        },
        _ => FaultKind::Local,
    };
    Fault {
        kind,
        reason: e.to_string(),
    }
}

/// Opens a snapshot and cuts it to what is at or below `commit`.
fn open_committed(
    store: &mut PartitionStore,
    io: &mut impl IoBackend,
    commit: u64,
    now_ms: u64,
) -> Result<IoOutcome, Fault> {
    let mut m = store.open_snapshot(io, now_ms).map_err(fault)?;
    m.commit = m.commit.max(commit);
    while m.last_op > m.commit {
        let Some(a) = m.artifacts.pop() else {
            break;
        };
        match batch_before(store, io, a.base_offset) {
            Ok((last_op, last_checksum)) => {
                m.next_offset = a.base_offset;
                m.last_op = last_op;
                m.last_checksum = last_checksum;
            }
            Err(e) => {
                store.release_snapshot(m.snapshot_id);
                return Err(e);
            }
        }
    }
    if m.last_op > m.commit {
        store.release_snapshot(m.snapshot_id);
        return Err(Fault {
            kind: FaultKind::Transient,
            reason: format!("no committed prefix to offer below op {}", m.last_op),
        });
    }
    Ok(IoOutcome::Snapshot(Arc::new(m)))
}

/// The op and checksum of the batch ending right before `offset`.
fn batch_before(
    store: &mut PartitionStore,
    io: &mut impl IoBackend,
    offset: u64,
) -> Result<(u64, u64), Fault> {
    let transient = |reason: String| Fault {
        kind: FaultKind::Transient,
        reason,
    };
    if offset <= store.log_start_offset() {
        // Nothing before it is held: the frontier the active segment
        // starts from names it.
        let f = store.superblock().frontier;
        if f.active_base == offset {
            return Ok((f.active_prev_op, f.active_prev_checksum));
        }
        return Err(transient(format!(
            "the batch before offset {offset} is not held"
        )));
    }
    let fetched = store.read(io, offset - 1, 1).map_err(fault)?;
    let h = BatchHeader::decode(&fetched.bytes).map_err(|e| Fault {
        kind: FaultKind::Local,
        reason: format!("batch before offset {offset} does not decode: {e}"),
    })?;
    if h.next_offset() != offset {
        return Err(transient(format!(
            "the batch before offset {offset} ends at {}",
            h.next_offset()
        )));
    }
    Ok((h.vsr_op, h.header_checksum))
}
