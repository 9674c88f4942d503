//! Reads by offset: whole, verified batches from durable data only, from
//! the shard's read cache when it holds the whole answer (see `cache.rs`),
//! else from the device (O_DIRECT, the shard's one read buffer, or the
//! buffer of a read queued ahead of this fetch, see `readahead.rs`).

use ringlog_protocol::{BatchHeader, HEADER_LEN};

use super::cache::CacheRead;
use super::readahead::{ReadAheadAt, ReadAheadPlan};
use super::walk::{Visit, WalkStop, Walker};
use super::{PartitionStore, StoreError};
use crate::io::{align_down, align_up, AlignedBuf, FileId, IoBackend, Op, Sqe};
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
        let (base, file, limit, position) = self.locate(from_offset);
        let chunk_bytes = self.chunk_bytes(max_bytes);
        let at = ReadAheadAt {
            key: self.cache_key,
            from_offset,
            segment_base: base,
            file,
        };
        let mut next_offset = from_offset;
        let mut walk_from = u64::from(position);
        // A read-ahead's buffer stands for the walker's first read; past
        // it (a batch it cut, a limit that grew), the walker reads itself.
        let mut walker = match self.pool.read_ahead_take(&at) {
            Some(ra) => {
                // It starts at the batch holding `from_offset` exactly.
                debug_assert!(ra.position >= walk_from);
                walk_from = ra.position;
                // The read after this one goes first, so the device does
                // not idle while this one is verified and copied.
                let walk = (walk_from, limit);
                if let Some(end) = reply_end(&ra.buf, ra.start, walk, from_offset, max_bytes) {
                    self.read_ahead(io, end, max_bytes);
                }
                Walker::with_read(file, chunk_bytes, ra.buf, ra.start)
            }
            None => Walker::with_buf(file, chunk_bytes, self.pool.take_read(chunk_bytes)),
        };
        // Shared by both callbacks: bytes taken so far.
        let taken_bytes = std::cell::Cell::new(0usize);
        let walked = walker.walk_until(
            io,
            walk_from,
            limit,
            |h| taken_bytes.get() > 0 && taken_bytes.get() + h.total_len() > max_bytes,
            |_, view| {
                let h = view.header();
                if h.next_offset() <= from_offset {
                    return Visit::Continue;
                }
                if out.is_empty() && h.base_offset > from_offset {
                    return Visit::Reject("the first batch starts past the offset".into());
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
        let (end_position, stop) = walked.map_err(|e| {
            StoreError::io(
                pid,
                "read",
                segment::log_path(&self.generation_dir, base),
                e,
            )
        })?;
        if let WalkStop::Invalid { position, reason } = stop {
            // Durable data that fails verification: report, never skip.
            let e = StoreError::Corruption {
                partition_id: pid,
                segment: segment::log_path(&self.generation_dir, base),
                position,
                detail: reason,
            };
            // Only a sealed segment: it is immutable, while the active
            // segment's last block may be rewritten under a read.
            if base < self.active.base_offset && self.corruption_seen.is_none() {
                tracing::error!(partition = pid, error = %e, "a read found durable bytes that fail verification");
                self.corruption_seen = Some(e.to_string());
            }
            return Err(e);
        }
        // Stopped by `max_bytes`: the next batch is at `end_position`.
        let exact = matches!(stop, WalkStop::Visitor).then_some(end_position);
        self.read_ahead(io, ReplyEnd { next_offset, exact }, max_bytes);
        Ok(Fetched {
            bytes: out,
            next_offset,
        })
    }

    /// The segment holding `from_offset` (below the durable end): its base
    /// offset, file, the end of its durable bytes, and the position of the
    /// indexed batch a read of it starts walking from.
    fn locate(&self, from_offset: u64) -> (u64, FileId, u64, u32) {
        debug_assert!(from_offset < self.durable.next_offset);
        if from_offset >= self.active.base_offset {
            let a = &self.active;
            let relative = (from_offset - a.base_offset) as u32;
            return (
                a.base_offset,
                a.file,
                a.durable_position,
                a.index.position_for(relative),
            );
        }
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
    }

    /// What one read covers: the distance from the indexed batch and the
    /// bytes wanted, in the common case.
    fn chunk_bytes(&self, max_bytes: usize) -> usize {
        max_bytes.max(64 * 1024) + self.config.index_interval_bytes as usize
    }

    /// After a read from the device: queues the first read of the next
    /// sequential fetch (from `end`, up to `max_bytes`) on the ring
    /// without waiting, within the pool's read-ahead bounds, so the device
    /// works while the reply is sent. Durable bytes only; nothing at the
    /// durable end. The pool's reaper hands the completion back
    /// ([`StorePool::complete_read_ahead`]).
    ///
    /// [`StorePool::complete_read_ahead`]: super::StorePool::complete_read_ahead
    fn read_ahead(&mut self, io: &mut impl IoBackend, end: ReplyEnd, max_bytes: usize) {
        let from_offset = end.next_offset;
        if !self.pool.read_ahead_enabled() || from_offset >= self.durable.next_offset {
            return;
        }
        let (base, file, limit, indexed) = self.locate(from_offset);
        // From the exact batch the next read starts with, when known: the
        // read is then one fetch and a header, not an index interval more.
        let position = end.exact.unwrap_or(u64::from(indexed));
        debug_assert!(position >= u64::from(indexed) && position < limit);
        let start = align_down(position);
        let want = align_up(position + (max_bytes + HEADER_LEN) as u64);
        let len_bytes = (want.min(align_up(limit)) - start) as usize;
        let plan = ReadAheadPlan {
            at: ReadAheadAt {
                key: self.cache_key,
                from_offset,
                segment_base: base,
                file,
            },
            start,
            position,
            limit,
            len_bytes,
        };
        let Some(buf) = self.pool.read_ahead_reserve(&plan) else {
            return;
        };
        let read = Op::Read {
            file,
            offset: start,
            len: len_bytes,
            buf,
        };
        let batch = io.submit_nowait(vec![Sqe::new(read)]);
        self.pool.read_ahead_submitted(batch, plan);
    }

    /// Whether a read-ahead for a fetch from `from_offset` is in flight: a
    /// caller that can wait for it (the shard) lets that fetch wait rather
    /// than read the same bytes again.
    pub fn read_ahead_pending(&self, from_offset: u64) -> bool {
        self.pool.read_ahead_pending(self.cache_key, from_offset)
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

/// Where a read ends: the next fetch's offset and, if the read stopped at
/// `max_bytes` (the next batch is in the same segment), that batch's file
/// position.
#[derive(Clone, Copy, Debug)]
struct ReplyEnd {
    next_offset: u64,
    exact: Option<u64>,
}

/// Where a read answering a fetch from `from_offset` of up to `max_bytes`,
/// walking `(position, limit)`, ends, by the batch headers in `buf` (file
/// bytes from `start`) alone, unverified (the walk verifies); None if `buf`
/// ends first. Mirrors the walk in [`PartitionStore::read_into`].
fn reply_end(
    buf: &[u8],
    start: u64,
    (mut position, limit): (u64, u64),
    from_offset: u64,
    max_bytes: usize,
) -> Option<ReplyEnd> {
    let mut taken_bytes = 0usize;
    let mut next_offset = from_offset;
    loop {
        if position + HEADER_LEN as u64 > limit {
            let exact = None;
            return Some(ReplyEnd { next_offset, exact });
        }
        let at = usize::try_from(position.checked_sub(start)?).ok()?;
        let h = BatchHeader::decode(buf.get(at..)?).ok()?;
        let total = h.total_len();
        if taken_bytes > 0 && taken_bytes + total > max_bytes {
            let exact = Some(position);
            return Some(ReplyEnd { next_offset, exact });
        }
        if h.next_offset() > from_offset {
            taken_bytes += total;
            next_offset = h.next_offset();
        }
        position += total as u64;
        debug_assert!(total > 0, "a batch has a header");
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
