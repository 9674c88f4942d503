//! Purge and retention: the superblock forgets data first, files go after.
//!
//! Both commit the new state (a purge also bumps the durable purge
//! generation and moves to a fresh generation directory) before any file is
//! touched, so a crash at any point leaves either the old state or the new
//! one; files left behind are garbage that the next open removes, which is
//! also why removals need no directory fsync. Removed
//! segment files are recycled (renamed into the pool's recycle directory)
//! while the pool is under its bound, else unlinked: the space is freed. Neither runs on the append path: the
//! shard calls them from its own maintenance turn. Retention drops entries
//! from the front of the segment table by moving its committed range, and
//! compacts the table file when dead entries dominate (see `table.rs`).

use std::path::{Path, PathBuf};

use super::{
    new_nonce, table, ActiveSegment, ChainPoint, PartitionStore, Provisioned, SealedFile,
    StoreError,
};
use crate::io::{Completion, IoBackend, Op, Sqe};
use crate::segment;
use crate::superblock::{Frontier, SealedSegment};

/// What retention removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RetentionOutcome {
    pub segments_removed: usize,
    pub bytes_removed: u64,
}

impl PartitionStore {
    /// Drops every stored batch. Offsets are never reused: the log continues
    /// at the same next offset, in a new generation.
    /// Refused while snapshots are open (see `expire_snapshots`).
    pub fn purge(&mut self, io: &mut impl IoBackend) -> Result<(), StoreError> {
        self.check_fenced()?;
        self.check_unpinned()?;
        self.flush(io)?;
        let pid = self.partition_id;
        let generation = self.sb.live_generation + 1;
        let new_dir = segment::generation_dir(&self.dir, generation);
        // Drawn before anything changes: a failure here leaves no trace.
        let nonce = new_nonce(pid, &new_dir)?;
        let created = io
            .create_dir(&new_dir)
            .map_err(|e| StoreError::io(pid, "mkdir", &new_dir, e));
        self.fence_on_err(created)?;
        let base = self.durable.next_offset;
        let new_segment = self.provision_segment(io, &segment::log_path(&new_dir, base))?;
        let fresh = table::write_fresh(io, pid, &new_dir, self.sb.table.id + 1, &[]);
        let table = self.fence_on_err(fresh)?;
        let dir = self.dir.clone();
        self.sync_dirs(io, &[&new_dir, &dir])?;
        let old_table_id = self.sb.table.id;

        let mut next = self.sb.successor();
        next.purge_generation += 1;
        next.live_generation = generation;
        next.table = table;
        next.frontier = Frontier {
            next_offset: base,
            last_op: self.durable.last_op,
            last_checksum: self.durable.last_checksum,
            active_base: base,
            active_position: 0,
            active_prev_checksum: self.durable.last_checksum,
            active_capacity_bytes: self.config.segment_size_bytes,
            active_prev_op: self.durable.last_op,
            active_nonce: nonce,
            ..Frontier::default()
        };
        self.write_superblock(io, next)?;

        // Committed: switch to the new generation, then remove the old one.
        let prev = self.durable;
        self.switch_generation(io, (new_dir, old_table_id), Vec::new(), (new_segment, prev));
        Ok(())
    }

    /// [`PartitionStore::purge`] for a purge replicated in the log: open
    /// snapshots do not hold it up, they are invalidated (their reads
    /// return [`super::TransferError::SnapshotGone`]), as an install does.
    pub fn purge_over_snapshots(&mut self, io: &mut impl IoBackend) -> Result<(), StoreError> {
        self.check_fenced()?;
        self.invalidate_snapshots();
        self.purge(io)
    }

    /// After a commit that named a new generation: makes it the live one in
    /// memory (its directory, sealed segments and empty active segment at
    /// `(file, prev)`, starting after `prev`) and removes the old
    /// generation's files, its segment table being `old_table_id`.
    pub(super) fn switch_generation(
        &mut self,
        io: &mut impl IoBackend,
        dir: (PathBuf, u64),
        sealed: Vec<SealedFile>,
        active: (Provisioned, ChainPoint),
    ) {
        let ops = self.switch_generation_ops(io, dir, sealed, active);
        self.run_removals(io, ops);
    }

    /// [`PartitionStore::switch_generation`] but for the removals of the old
    /// generation's files, returned for the caller to run.
    pub(super) fn switch_generation_ops(
        &mut self,
        io: &mut impl IoBackend,
        (dir, old_table_id): (PathBuf, u64),
        sealed: Vec<SealedFile>,
        (segment, prev): (Provisioned, ChainPoint),
    ) -> Vec<Op> {
        if let Some(buf) = self.active.pending.take() {
            self.pool.put_write(buf);
        }
        // The new generation's bytes at any offset may differ (install).
        self.pool.cache_forget(self.cache_key);
        // The bytes that failed verification are gone with the old one.
        self.corruption_seen = None;
        // Called after the commit that names the new active segment.
        debug_assert_eq!(self.sb.frontier.active_base, prev.next_offset);
        let active = ActiveSegment::empty(
            segment,
            prev,
            (
                self.config.transfer_chunk_bytes,
                self.config.segment_size_bytes,
            ),
            self.sb.frontier.active_nonce,
        );
        let old_active = std::mem::replace(&mut self.active, active);
        let old_sealed = std::mem::replace(&mut self.sealed, sealed);
        let mut ops = Vec::new();
        // Before the directory changes: the spare is named in the old one.
        self.abandon_spare(io, Some(&mut ops));
        let old_dir = std::mem::replace(&mut self.generation_dir, dir);
        io.close(old_active.file);
        for s in old_sealed {
            io.close(s.file);
            self.dispose(&segment::log_path(&old_dir, s.meta.base_offset), &mut ops);
            ops.push(Op::Unlink {
                path: segment::index_path(&old_dir, s.meta.base_offset),
            });
        }
        self.dispose(
            &segment::log_path(&old_dir, old_active.base_offset),
            &mut ops,
        );
        // The old generation's segment table, by name: no listing (getdents
        // has no ring op). A live store holds no other table there (a failed
        // compaction fences); anything else left makes the rmdir fail and is
        // garbage for the next open.
        ops.push(Op::Unlink {
            path: table::path(&old_dir, old_table_id),
        });
        ops.push(Op::RemoveDir { path: old_dir });
        ops
    }

    /// Maintenance: persists pending indexes, then removes the oldest sealed
    /// segments beyond the size or age limits,
    /// stopping at the first one an open snapshot pins. `now_ms` is the
    /// caller's clock (the store has none).
    pub fn apply_retention(
        &mut self,
        io: &mut impl IoBackend,
        now_ms: u64,
    ) -> Result<RetentionOutcome, StoreError> {
        self.check_fenced()?;
        self.persist_indexes(io)?;
        self.expire_snapshots(now_ms);
        let mut size = self.size_bytes();
        let mut count = 0;
        for s in &self.sealed {
            if self.is_pinned(s.meta.base_offset) {
                break;
            }
            let too_big = self.config.retention_bytes.is_some_and(|max| size > max);
            let too_old = self
                .config
                .retention_ms
                .is_some_and(|age| s.meta.max_timestamp_ms.saturating_add(age) < now_ms);
            if !too_big && !too_old {
                break;
            }
            size -= s.meta.length_bytes;
            count += 1;
        }
        if count == 0 {
            return Ok(RetentionOutcome::default());
        }
        let dropped: Vec<SealedSegment> = self.sealed[..count].iter().map(|s| s.meta).collect();
        let mut next = self.sb.successor();
        next.table = table::advanced(&self.sb.table, &dropped);
        if table::wants_compaction(&next.table) {
            let live: Vec<SealedSegment> = self.sealed[count..].iter().map(|s| s.meta).collect();
            next.table = self.compact_table(io, &live)?;
        }
        let old_table = table::path(&self.generation_dir, self.sb.table.id);
        next.frontier = self.frontier_now();
        self.write_superblock(io, next)?;

        let mut outcome = RetentionOutcome::default();
        let mut ops = Vec::new();
        if old_table != table::path(&self.generation_dir, self.sb.table.id) {
            ops.push(Op::Unlink { path: old_table });
        }
        for s in self.sealed.drain(..count).collect::<Vec<_>>() {
            io.close(s.file);
            outcome.segments_removed += 1;
            outcome.bytes_removed += s.meta.length_bytes;
            self.dispose(
                &segment::log_path(&self.generation_dir, s.meta.base_offset),
                &mut ops,
            );
            ops.push(Op::Unlink {
                path: segment::index_path(&self.generation_dir, s.meta.base_offset),
            });
        }
        self.pool
            .cache_drop_below(self.cache_key, self.log_start_offset());
        self.run_removals(io, ops);
        Ok(outcome)
    }

    /// Queues the removal of an unreferenced file: a segment log is recycled
    /// while the pool has room, anything else is unlinked.
    pub(super) fn dispose(&mut self, path: &Path, ops: &mut Vec<Op>) {
        let is_log = path.extension().is_some_and(|e| e == "log");
        if is_log {
            // Unique in a pool shared by partitions: a partition id is never
            // reused and a generation never reuses a base offset.
            let generation = path
                .parent()
                .and_then(|p| p.file_name())
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
            let name = format!(
                "p{}-{generation}-{}",
                self.partition_id,
                name.unwrap_or_default()
            );
            if let Some(to) = self.pool.offer_recycled(&name) {
                ops.push(Op::Rename {
                    from: path.into(),
                    to,
                });
                return;
            }
        }
        ops.push(Op::Unlink { path: path.into() });
    }

    /// Runs removals of unreferenced files. A failure only leaves garbage
    /// behind, which the next open removes, so it is logged, not fatal.
    pub(super) fn run_removals(&mut self, io: &mut impl IoBackend, ops: Vec<Op>) {
        let (files, dirs) = removal_batches(ops);
        let completions = io.submit(files.into_iter().map(Sqe::new).collect());
        self.note_removals(completions);
        let completions = io.submit(dirs.into_iter().map(Sqe::new).collect());
        self.note_removals(completions);
    }

    /// Logs the removals that failed and forgets recycled files whose
    /// rename did not land.
    pub(super) fn note_removals(&mut self, completions: Vec<Completion>) {
        for c in completions {
            if let Err(e) = c.result {
                if let Op::Rename { to, .. } = &c.op {
                    self.pool.forget_recycled(to);
                }
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!(partition = self.partition_id, op = ?c.op, error = %e, "removal failed");
                }
            }
        }
    }
}

/// Removals as two submissions: the files first, then the directories, once their files are gone (ops of one submission may
/// run in any order).
pub(super) fn removal_batches(ops: Vec<Op>) -> (Vec<Op>, Vec<Op>) {
    ops.into_iter()
        .partition(|op| !matches!(op, Op::RemoveDir { .. }))
}
