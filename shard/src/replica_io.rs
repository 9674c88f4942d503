//! The replica's storage executor: turns each [`StorageOp`] the pure
//! replica ([`crate::vsr`]) emits into [`PartitionStore`] calls on an
//! [`IoBackend`], and boots a replica from what a store holds.
//!
//! Shared by the shard (io_uring) and the simulator (sim backend), so the
//! simulator runs the same code the server does. The API is three calls:
//! - [`execute`]: one operation, its result for `Input::IoDone`;
//! - [`note_event`]: each replica event (commits let the store seal, and
//!   make it refuse cuts below them);
//! - [`recover`]: the durable VSR state and the journal tail for
//!   `Replica::restart` ([`recover_lone`] for a cluster of one).
//!
//! Stores of replicated partitions are configured with
//! `StoreConfig::uncommitted_headroom_bytes`, so a roll never seals ops a
//! view change may still cut (see `storage/src/store/truncate.rs`).
//!
//! Ops are the batch headers' `vsr_op`; the store is indexed by offset.
//! Ops and offsets grow together (one batch per op, dense offsets), so an
//! op is found by a binary search over offsets: at most ~64 single-batch
//! reads, no op index to keep or rebuild. The caller runs operations of
//! one replica in emission order (see [`StorageOp`]).

use ringlog_protocol::batch::BatchError;
use ringlog_protocol::replication as wire;
use ringlog_protocol::{BatchHeader, BatchView};
use ringlog_storage::io::IoBackend;
use ringlog_storage::store::{PartitionStore, StoreError};
use ringlog_storage::superblock;

use crate::vsr::{
    Anchor, BatchBytes, ClientBatch, Event, IoFailure, IoOutcome, StorageOp, VsrState,
};

/// Bytes one [`StorageOp::ReadBatches`] returns at most (it stops after the
/// batch that crosses it; the replica asks again for the rest).
pub const REPAIR_READ_BYTES_MAX: usize = 1024 * 1024;

/// Runs `op` on `store`. A failure is the replica's to handle (a failed
/// write, flush, truncation or VSR write fences it); the store fences
/// itself on a failed write or fsync, so nothing is retried here.
pub fn execute(
    store: &mut PartitionStore,
    io: &mut impl IoBackend,
    op: &StorageOp,
) -> Result<IoOutcome, IoFailure> {
    match op {
        StorageOp::Append { op, batch } => append(store, io, *op, batch)
            .map(|()| IoOutcome::Done)
            .map_err(|e| IoFailure {
                reason: e.to_string(),
            }),
        StorageOp::Flush => store
            .flush(io)
            .map(|()| IoOutcome::Done)
            .map_err(|e| failure("flush", e)),
        StorageOp::PersistVsr(state) => {
            let vsr = superblock::VsrState {
                view: state.view,
                log_view: state.log_view,
                commit: state.commit,
                op: store.durable().last_op,
                wiped: state.wiped,
                view_lost: state.view_lost,
            };
            store
                .set_vsr(io, vsr)
                .map(|()| IoOutcome::Done)
                .map_err(|e| failure("persist vsr", e))
        }
        StorageOp::TruncateAbove { op } => store
            .truncate_above(io, *op)
            .map(|_| IoOutcome::Done)
            .map_err(|e| failure(&format!("truncate above op {op}"), e)),
        StorageOp::ReadBatches { op_min, op_max } => {
            if let Some(evicted) = evicted(store, io, *op_min, *op_max)? {
                return Ok(IoOutcome::Evicted(evicted));
            }
            read_batches(store, io, *op_min, *op_max).map(IoOutcome::Batches)
        }
        StorageOp::Purge { through_op } => purge(store, io, *through_op).map(|_| IoOutcome::Done),
    }
}

/// Runs `StorageOp::Purge { through_op }`; true if it purged now, false
/// if the store had applied it already (it no longer holds the op: a
/// purge drops every batch through it, and later appends continue its
/// chain above it). The replica emits it before any append above the
/// purge op, so a store that holds it ends at it. Open snapshots are
/// invalidated, not waited for: their readers get `SnapshotGone` and the
/// serving side answers with a final refusal (`UnknownSnapshot`), as for
/// an install; a purge that waited for leases would stall the replica's
/// storage ops (its appends run after it) for up to a lease.
pub fn purge(
    store: &mut PartitionStore,
    io: &mut impl IoBackend,
    through_op: u64,
) -> Result<bool, IoFailure> {
    let last_op = store.chain().last_op;
    let held_min = op_held_min(store, io)?.unwrap_or(1);
    if through_op > last_op || through_op < held_min {
        return Ok(false);
    }
    if through_op != last_op {
        return Err(IoFailure {
            reason: format!(
                "purge through op {through_op}: the store holds ops up to {last_op} above it"
            ),
        });
    }
    store
        .purge_over_snapshots(io)
        .map(|()| true)
        .map_err(|e| failure(&format!("purge through op {through_op}"), e))
}

/// Passes what the store must know of a replica event: a commit (rolls
/// seal only committed ops; a cut below the commit is refused). Call it
/// at once, except while a `TruncateAbove` emitted before the event is
/// still to run: then after it (a view change emits a cut, then repairs
/// and commits ops above it; that commit must not reach the store before
/// the cut, which would refuse it).
pub fn note_event(store: &mut PartitionStore, event: &Event) {
    if let Event::Committed { op } = event {
        store.note_commit(*op);
    }
}

fn failure(what: &str, e: StoreError) -> IoFailure {
    IoFailure {
        reason: format!("{what}: {e}"),
    }
}

/// Why [`append`] failed.
#[derive(Debug, thiserror::Error)]
pub enum AppendFailure {
    #[error("append of op {op}: batch holds op {held}, store ends at op {last_op}")]
    OpMismatch { op: u64, held: u64, last_op: u64 },
    #[error("append of op {op}: invalid batch: {source}")]
    Header { op: u64, source: BatchError },
    /// The store's own error: it fenced itself, or (disk full) it accepted
    /// nothing and changed nothing; `PartitionStore::fenced` tells which.
    #[error("append of op {op}: {source}")]
    Store { op: u64, source: StoreError },
}

/// Runs `StorageOp::Append { op, batch }`: `batch` must hold op `op`, the
/// one after the store's last. Only the header is decoded here: the store
/// verifies the whole batch (body checksum and records) as it accepts it,
/// unless the replica verified it already (a client's batch the primary
/// sequenced carries the proof), so the body is checked once.
pub fn append(
    store: &mut PartitionStore,
    io: &mut impl IoBackend,
    op: u64,
    batch: &BatchBytes,
) -> Result<(), AppendFailure> {
    check_op(store, op, batch)?;
    let appended = match batch.verified() {
        Some(verified) => store.append_verified(io, verified),
        None => store.append(io, batch),
    };
    appended
        .map(drop)
        .map_err(|source| AppendFailure::Store { op, source })
}

/// [`append`] taking the batch: one read into a lent aligned buffer, held
/// by nothing else, is written by the store from that buffer (no copy).
pub fn append_owned(
    store: &mut PartitionStore,
    io: &mut impl IoBackend,
    op: u64,
    batch: BatchBytes,
) -> Result<(), AppendFailure> {
    let verified = match batch.into_verified() {
        Ok(v) => v,
        Err(shared) => return append(store, io, op, &shared),
    };
    check_op(store, op, verified.as_bytes())?;
    let appended = match verified.try_map(ClientBatch::into_aligned) {
        Ok(aligned) => store
            .append_owned_verified(io, aligned)
            .map_err(|refused| refused.error),
        Err(heap) => store.append_verified(io, heap.borrowed()),
    };
    appended
        .map(drop)
        .map_err(|source| AppendFailure::Store { op, source })
}

/// `batch` holds op `op`, the one after the store's last.
fn check_op(store: &PartitionStore, op: u64, batch: &[u8]) -> Result<(), AppendFailure> {
    let last_op = store.chain().last_op;
    let held = BatchHeader::decode(batch)
        .map_err(|source| AppendFailure::Header { op, source })?
        .vsr_op;
    if held != op || op != last_op + 1 {
        return Err(AppendFailure::OpMismatch { op, held, last_op });
    }
    Ok(())
}

/// The durable batch holding `op` or, if none does, the first one above
/// it: its base offset and header. None when every durable op is below.
fn seek_op(
    store: &mut PartitionStore,
    io: &mut impl IoBackend,
    op: u64,
) -> Result<Option<BatchHeader>, IoFailure> {
    let (mut lo, mut hi) = (store.log_start_offset(), store.durable().next_offset);
    let mut found = None;
    // Invariant: every batch starting below `lo` holds an op below `op`;
    // `found` (if any) starts at `hi` and holds an op at or above it.
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        let h = read_one(store, io, mid)?;
        if h.vsr_op < op {
            lo = h.next_offset();
        } else {
            hi = h.base_offset;
            found = Some(h);
        }
    }
    Ok(found)
}

/// The header of the durable batch holding `offset`.
fn read_one(
    store: &mut PartitionStore,
    io: &mut impl IoBackend,
    offset: u64,
) -> Result<BatchHeader, IoFailure> {
    let fetched = store
        .read(io, offset, 1)
        .map_err(|e| failure(&format!("read at offset {offset}"), e))?;
    BatchHeader::decode(&fetched.bytes).map_err(|e| IoFailure {
        reason: format!("read at offset {offset}: stored batch does not decode: {e}"),
    })
}

/// The lowest op the store still holds, once retention, a purge or an
/// install moved its log start past op 1 (None before: every op is held);
/// one above the durable end when nothing is held.
fn op_held_min(
    store: &mut PartitionStore,
    io: &mut impl IoBackend,
) -> Result<Option<u64>, IoFailure> {
    let start = store.log_start_offset();
    if start == 0 {
        return Ok(None);
    }
    let end = store.durable();
    if start < end.next_offset {
        return Ok(Some(read_one(store, io, start)?.vsr_op));
    }
    Ok(Some(end.last_op + 1))
}

/// Some when `op_min` is below the lowest op the store still holds
/// (retention or a purge moved the log start past it, or an install
/// started the log above it): the asker must transfer state.
fn evicted(
    store: &mut PartitionStore,
    io: &mut impl IoBackend,
    op_min: u64,
    op_max: u64,
) -> Result<Option<wire::RangeEvicted>, IoFailure> {
    let Some(op_held_min) = op_held_min(store, io)? else {
        return Ok(None);
    };
    if op_min >= op_held_min {
        return Ok(None);
    }
    let start = store.log_start_offset();
    let purge_generation = store.superblock().purge_generation;
    let reason = if purge_generation > 0 {
        wire::EvictedReason::Purged
    } else {
        wire::EvictedReason::Retired
    };
    Ok(Some(wire::RangeEvicted {
        op_min,
        op_max,
        op_held_min,
        log_start_offset: start,
        purge_generation,
        reason,
    }))
}

/// Durable ops `op_min..=op_max` (or a prefix of them: up to the durable
/// end, or [`REPAIR_READ_BYTES_MAX`]), as stored.
fn read_batches(
    store: &mut PartitionStore,
    io: &mut impl IoBackend,
    op_min: u64,
    op_max: u64,
) -> Result<Vec<BatchBytes>, IoFailure> {
    let Some(first) = seek_op(store, io, op_min)? else {
        return Ok(Vec::new());
    };
    if first.vsr_op != op_min {
        return Ok(Vec::new()); // not held (cut or never written)
    }
    read_run(store, io, first.base_offset, op_min, op_max).map(|(out, _)| out)
}

/// Ops `op_min..=op_max` (or a prefix, as [`read_batches`]) read on from
/// `offset`, where op `op_min` starts; and the offset after the last one.
fn read_run(
    store: &mut PartitionStore,
    io: &mut impl IoBackend,
    mut offset: u64,
    op_min: u64,
    op_max: u64,
) -> Result<(Vec<BatchBytes>, u64), IoFailure> {
    debug_assert!(op_min <= op_max, "a run of at least one op");
    let (mut out, start) = (Vec::new(), offset);
    let mut taken_bytes = 0;
    let mut after = offset;
    let end = store.durable().next_offset;
    'reads: while offset < end && taken_bytes < REPAIR_READ_BYTES_MAX {
        let fetched = store
            .read(io, offset, REPAIR_READ_BYTES_MAX - taken_bytes)
            .map_err(|e| failure(&format!("read of ops {op_min}..={op_max}"), e))?;
        let mut rest = &fetched.bytes[..];
        while !rest.is_empty() {
            let view = BatchView::parse(rest).map_err(|e| IoFailure {
                reason: format!("read of ops {op_min}..={op_max}: stored batch: {e}"),
            })?;
            let h = view.header();
            let expected = op_min + out.len() as u64;
            if h.vsr_op != expected {
                return Err(IoFailure {
                    reason: format!(
                        "read of ops {op_min}..={op_max}: found op {} where op {expected} belongs",
                        h.vsr_op
                    ),
                });
            }
            out.push(view.as_bytes().into());
            taken_bytes += view.as_bytes().len();
            after = h.next_offset();
            if h.vsr_op == op_max {
                break 'reads;
            }
            rest = &rest[h.total_len()..];
        }
        if fetched.next_offset <= offset {
            break;
        }
        offset = fetched.next_offset;
    }
    debug_assert!(out.is_empty() || after > start, "ends past what it took");
    Ok((out, after))
}

/// What a replica restarts from: `Replica::restart(cfg, seed, durable,
/// base, &headers)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recovered {
    pub durable: VsrState,
    pub base: Anchor,
    /// Every durable op above `base`, in order.
    pub headers: Vec<BatchHeader>,
    /// A committed purge op was applied first ([`apply_committed_purge`]).
    pub purged: bool,
}

/// Reads the superblock's VSR state and the headers of the ops above the
/// commit point less `committed_ops_kept` (the journal a restarted replica
/// starts with; every uncommitted op is in it). The anchor is never above
/// the durable commit, so a restart never claims an op committed that the
/// superblock did not.
/// Committed ops a replica keeps in its journal when it reboots on a
/// snapshot it just installed: none. Every installed op is committed and
/// is read from the segments when a peer asks for it; reading a journal
/// of them back would cost a read of that many batches (64 MiB of 1 MiB
/// batches at the boot's 64) on the shard thread.
pub const INSTALLED_COMMITTED_OPS_KEPT: u64 = 0;

pub fn recover(
    store: &mut PartitionStore,
    io: &mut impl IoBackend,
    committed_ops_kept: u64,
) -> Result<Recovered, IoFailure> {
    let commit = store.superblock().vsr.commit.max(store.committed_floor());
    let purged = apply_committed_purge(store, io, commit)?;
    // Ops through the sealed floor are committed even where the
    // superblock's (lazily written) commit is older: a replica booted at
    // that older commit would wait, as primary, for acks of ops its
    // backups may hold only as an installed anchor. Anchored there, it
    // boots committed through them (and keeps no committed journal, unless
    // asked for every header: `u64::MAX`, a reader of the whole log).
    let sb_commit = store.superblock().vsr.commit;
    let floor = store.committed_floor();
    let (commit, kept) = if floor > sb_commit && committed_ops_kept != u64::MAX {
        (floor, 0)
    } else {
        (sb_commit, committed_ops_kept)
    };
    let rec = recover_above(store, io, commit, kept)?;
    Ok(Recovered { purged, ..rec })
}

/// A purge op committed (at or below `commit`) but not applied: the
/// replica crashed between its commit and its [`StorageOp::Purge`], or
/// installed a snapshot ending at it from a peer that had not applied it.
/// Only the store's last op can be one (nothing is appended above an
/// unapplied purge op); applied here, once (a purged store no longer
/// holds it). Returns whether it purged.
pub fn apply_committed_purge(
    store: &mut PartitionStore,
    io: &mut impl IoBackend,
    commit: u64,
) -> Result<bool, IoFailure> {
    let last_op = store.durable().last_op;
    if last_op == 0 || last_op > commit {
        return Ok(false);
    }
    // None: every op is held; else nothing is held when it is above.
    if op_held_min(store, io)?.is_some_and(|h| h > last_op) {
        return Ok(false);
    }
    purge_if_head_is_purge(store, io, last_op)
}

fn purge_if_head_is_purge(
    store: &mut PartitionStore,
    io: &mut impl IoBackend,
    last_op: u64,
) -> Result<bool, IoFailure> {
    let head = seek_op(store, io, last_op)?.filter(|h| h.vsr_op == last_op);
    match head {
        Some(h) if h.is_purge() => purge(store, io, last_op),
        _ => Ok(false),
    }
}

/// [`recover`] for a replica of a cluster of one: every durable op was
/// flushed by the only replica, its quorum, so the durable end is the
/// commit point (the superblock's commit lags: nothing writes it at
/// R = 1). Reads only the `committed_ops_kept` batches asked for; with 0
/// the anchor is the store's durable end and nothing is read, so a boot
/// does not read whole logs.
pub fn recover_lone(
    store: &mut PartitionStore,
    io: &mut impl IoBackend,
    committed_ops_kept: u64,
) -> Result<Recovered, IoFailure> {
    let commit = store.durable().last_op;
    // With no journal kept nothing is read (see above), so a purge op at
    // the head is not seen: a host sequencing purges keeps one at least.
    let purged = committed_ops_kept > 0 && apply_committed_purge(store, io, commit)?;
    let rec = recover_above(store, io, commit, committed_ops_kept)?;
    Ok(Recovered { purged, ..rec })
}

fn recover_above(
    store: &mut PartitionStore,
    io: &mut impl IoBackend,
    commit: u64,
    committed_ops_kept: u64,
) -> Result<Recovered, IoFailure> {
    let sb = store.superblock().vsr;
    let durable = VsrState {
        view: sb.view,
        log_view: sb.log_view,
        commit: sb.commit,
        wiped: sb.wiped,
        view_lost: sb.view_lost,
    };
    let end = store.durable();
    let last_op = end.last_op;
    let mut base_op = commit.min(last_op).saturating_sub(committed_ops_kept);
    let mut headers = Vec::new();
    let mut base = Anchor::default();
    let held_min = op_held_min(store, io)?;
    let f = store.superblock().frontier;
    let start = store.log_start_offset();
    if held_min.is_some_and(|h| base_op < h) && f.active_base == start {
        // Every sealed segment was retired (or installed over): the
        // journal starts at the active segment, on the op before it.
        base_op = f.active_prev_op;
        base = Anchor {
            op: f.active_prev_op,
            checksum: f.active_prev_checksum,
            next_offset: start,
        };
    } else if let Some(h) = held_min.filter(|h| base_op < *h) {
        // The journal cannot reach below what retention left: anchor it
        // on the first op of the oldest sealed segment (committed: a
        // segment seals only committed ops).
        base_op = h;
    }
    if base.op > 0 {
        // Anchored on the active segment's predecessor above.
    } else if base_op > 0 && base_op == last_op {
        // The durable end is the anchor: the store tracks it, no read.
        base = Anchor {
            op: last_op,
            checksum: end.last_checksum,
            next_offset: end.next_offset,
        };
    } else if base_op > 0 {
        let h = seek_op(store, io, base_op)?.filter(|h| h.vsr_op == base_op);
        let Some(h) = h else {
            return Err(IoFailure {
                reason: format!("recover: op {base_op} is not in the store"),
            });
        };
        base = Anchor {
            op: h.vsr_op,
            checksum: h.header_checksum,
            next_offset: h.next_offset(),
        };
    }
    if last_op > base_op {
        for b in read_batches_all(store, io, base_op + 1, last_op)? {
            let h = BatchHeader::decode(&b).map_err(|e| IoFailure {
                reason: format!("recover: stored batch: {e}"),
            })?;
            headers.push(h);
        }
    }
    Ok(Recovered {
        durable,
        base,
        headers,
        purged: false,
    })
}

/// Like [`read_batches`] without the per-call byte bound (recovery reads
/// the whole uncommitted tail, which the pipeline bounds). One search for
/// `op_min`, then each piece reads on from where the last ended: a search
/// per piece cost a restart a read per probe per batch of about
/// [`REPAIR_READ_BYTES_MAX`].
fn read_batches_all(
    store: &mut PartitionStore,
    io: &mut impl IoBackend,
    op_min: u64,
    op_max: u64,
) -> Result<Vec<BatchBytes>, IoFailure> {
    let unreadable = |next: u64| IoFailure {
        reason: format!("recover: op {next} of {op_min}..={op_max} is not readable"),
    };
    let first = seek_op(store, io, op_min)?.filter(|h| h.vsr_op == op_min);
    let mut offset = first.ok_or_else(|| unreadable(op_min))?.base_offset;
    let mut all = Vec::new();
    let mut next = op_min;
    while next <= op_max {
        let (chunk, after) = read_run(store, io, offset, next, op_max)?;
        if chunk.is_empty() {
            return Err(unreadable(next));
        }
        next += chunk.len() as u64;
        offset = after;
        all.extend(chunk);
    }
    debug_assert_eq!(all.len() as u64, op_max - op_min + 1, "every op, once");
    Ok(all)
}

#[cfg(test)]
mod tests;
