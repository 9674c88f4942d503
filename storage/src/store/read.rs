//! Reads by offset: whole, verified batches from durable data only, from
//! the shard's read cache when it holds the whole answer (see `cache.rs`),
//! else from the device (O_DIRECT, the shard's one read buffer).

use super::cache::CacheRead;
use super::walk::{Visit, WalkStop, Walker};
use super::{PartitionStore, StoreError};
use crate::io::{align_down, AlignedBuf, IoBackend};
use crate::segment;

/// Batches read from the log.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Fetched {
    /// Whole batches, back to back, exactly as stored.
    pub bytes: Vec<u8>,
    /// The offset after the last returned batch (where the next read starts).
    pub next_offset: u64,
}

impl PartitionStore {
    /// Returns whole batches starting with the one holding `from_offset`, up
    /// to `max_bytes` (capped by `read_bytes_max`; at least one batch is
    /// returned whatever its size), from one segment, durable data only.
    /// Reading at the durable end returns nothing. The bytes are the same
    /// whether the read cache or the device serves them.
    pub fn read(
        &mut self,
        io: &mut impl IoBackend,
        from_offset: u64,
        max_bytes: usize,
    ) -> Result<Fetched, StoreError> {
        self.read_into(io, from_offset, max_bytes, Vec::new())
    }

    /// [`read`](PartitionStore::read) into `out` (cleared first): the
    /// batches are copied once, from the read cache or the read buffer,
    /// into the caller's buffer, which comes back as `Fetched::bytes`. A
    /// server reuses these buffers, so a reply does not fault in fresh
    /// pages; `out` grows only if the answer does not fit its capacity.
    pub fn read_into(
        &mut self,
        io: &mut impl IoBackend,
        from_offset: u64,
        max_bytes: usize,
        mut out: Vec<u8>,
    ) -> Result<Fetched, StoreError> {
        out.clear();
        self.check_fenced()?;
        let pid = self.partition_id;
        let start = self.log_start_offset();
        let end = self.durable.next_offset;
        if from_offset < start || from_offset > end {
            return Err(StoreError::OffsetOutOfRange {
                partition_id: pid,
                offset: from_offset,
                start,
                end,
            });
        }
        if from_offset == end {
            return Ok(Fetched {
                bytes: out,
                next_offset: end,
            });
        }
        let max_bytes = max_bytes.min(self.config.read_bytes_max);
        if let Some(next_offset) = self.read_cached(from_offset, max_bytes, &mut out) {
            return Ok(Fetched {
                bytes: out,
                next_offset,
            });
        }
        let (base, file, limit, position) = if from_offset >= self.active.base_offset {
            let a = &self.active;
            let relative = (from_offset - a.base_offset) as u32;
            (
                a.base_offset,
                a.file,
                a.durable_position,
                a.index.position_for(relative),
            )
        } else {
            let i = self
                .sealed
                .partition_point(|s| s.meta.end_offset <= from_offset);
            let s = &self.sealed[i];
            let relative = (from_offset - s.meta.base_offset) as u32;
            (
                s.meta.base_offset,
                s.file,
                s.meta.length_bytes,
                s.index.position_for(relative),
            )
        };
        let mut next_offset = from_offset;
        // One read covers the distance from the indexed batch and the bytes
        // wanted, in the common case.
        let chunk_bytes = max_bytes.max(64 * 1024) + self.config.index_interval_bytes as usize;
        // The shard's one read buffer: reads run one at a time on its thread.
        let buf = self.pool.take_read(chunk_bytes);
        let mut walker = Walker::with_buf(file, chunk_bytes, buf);
        // Shared by both callbacks: bytes taken so far.
        let taken_bytes = std::cell::Cell::new(0usize);
        let walked = walker.walk_until(
            io,
            u64::from(position),
            limit,
            |h| taken_bytes.get() > 0 && taken_bytes.get() + h.total_len() > max_bytes,
            |_, view| {
                let h = view.header();
                if h.next_offset() <= from_offset {
                    return Visit::Continue;
                }
                if h.base_offset != next_offset && !out.is_empty() {
                    return Visit::Reject("offsets not contiguous".into());
                }
                out.extend_from_slice(view.as_bytes());
                taken_bytes.set(out.len());
                next_offset = h.next_offset();
                Visit::Continue
            },
        );
        // Kept for the next read unless a huge batch grew it past the cap.
        self.pool.put_read(walker.into_buf());
        let (_, stop) = walked.map_err(|e| {
            StoreError::io(
                pid,
                "read",
                segment::log_path(&self.generation_dir, base),
                e,
            )
        })?;
        if let WalkStop::Invalid { position, reason } = stop {
            // Durable data that fails verification: report, never skip.
            return Err(StoreError::Corruption {
                partition_id: pid,
                segment: segment::log_path(&self.generation_dir, base),
                position,
                detail: reason,
            });
        }
        Ok(Fetched {
            bytes: out,
            next_offset,
        })
    }

    /// The read from the read cache into the empty `out`, if it holds
    /// every batch of it (the next offset; else None, `out` left empty); it
    /// stops where a disk read would: at the end of the segment holding
    /// `from_offset` (the durable end for the active one).
    fn read_cached(&self, from_offset: u64, max_bytes: usize, out: &mut Vec<u8>) -> Option<u64> {
        if !self.pool.cache_enabled() {
            return None;
        }
        let end_offset = if from_offset >= self.active.base_offset {
            self.durable.next_offset
        } else {
            let i = self
                .sealed
                .partition_point(|s| s.meta.end_offset <= from_offset);
            self.sealed[i].meta.end_offset
        };
        let read = CacheRead {
            key: self.cache_key,
            from_offset,
            end_offset,
            max_bytes,
        };
        self.pool.cache_read(&read, out)
    }

    /// Hands the batches a completed flush made durable to the read cache,
    /// then lets go of `buf`, the flush's data write (from the block holding
    /// the previous durable end up to `end_position`, padding and trailer
    /// after it). A large flush's buffer becomes the cache entry as it is
    /// (see `cache::WRITTEN_SHARE_MIN`); a small one's batches are copied
    /// and the buffer goes back to the pool. Called before the durable end
    /// moves.
    pub(super) fn cache_flushed(&self, buf: AlignedBuf, end_position: u64) {
        if !self.pool.cache_enabled() {
            self.pool.put_write(buf);
            return;
        }
        let durable = self.active.durable_position;
        let start = align_down(durable);
        let from = (durable - start) as usize;
        let to = (end_position - start) as usize;
        debug_assert!(to <= buf.len(), "the flush wrote up to its end");
        let base = self.durable.next_offset;
        let new_bytes = to.saturating_sub(from);
        let keep_whole = new_bytes >= buf.capacity() / super::cache::WRITTEN_SHARE_MIN;
        if keep_whole && to <= buf.len() {
            self.pool
                .cache_insert_written(self.cache_key, base, buf, from..to);
            return;
        }
        if let Some(bytes) = buf.get(from..to) {
            self.pool.cache_insert(self.cache_key, base, bytes);
        }
        self.pool.put_write(buf);
    }
}

impl PartitionStore {
    /// The counters of the read cache this store shares with its pool's
    /// other partitions.
    pub fn read_cache_stats(&self) -> super::ReadCacheStats {
        self.pool.read_cache_stats()
    }
}

impl Drop for PartitionStore {
    /// A store's cached batches die with it: its key is never used again.
    fn drop(&mut self) {
        self.pool.cache_forget(self.cache_key);
    }
}
