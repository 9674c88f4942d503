//! Partition store settings, with their bounds.

use ringlog_protocol::HEADER_LEN;

use super::StoreError;
use crate::io::BLOCK_SIZE;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreConfig {
    /// A segment rolls when the next batch would not fit. Multiple of 4096,
    /// at most 4 GiB (index positions are u32), at least the write buffer.
    pub segment_size_bytes: u64,
    /// Appends collect in a buffer of this size between flushes; a batch must
    /// fit in it (less one block for the rewritten tail). Each partition holds
    /// two such buffers.
    pub write_buffer_bytes: usize,
    /// Distance between sparse index entries.
    pub index_interval_bytes: u32,
    /// Delete the oldest sealed segments while the log is larger than this.
    pub retention_bytes: Option<u64>,
    /// Delete sealed segments whose newest batch is older than this.
    pub retention_ms: Option<u64>,
    /// Segment files kept for reuse instead of unlinked: overwriting written
    /// blocks is about twice as fast as writing fresh ones.
    pub recycled_files_max: usize,
    /// Bytes a read may return beyond its first batch.
    pub read_bytes_max: usize,
    /// State transfer moves segments in chunks of this size, each with its
    /// own checksum computed as the segment is written. Multiple of 4096.
    pub transfer_chunk_bytes: u32,
    /// A snapshot not read from for this long is released, unpinning its
    /// segments.
    pub snapshot_lease_ms: u64,
    /// Snapshots served at once.
    pub snapshots_max: usize,
    /// Chunks an install holds that arrived ahead of the next one due: the
    /// receiver's memory bound is this many chunks.
    pub transfer_window_chunks: usize,
    /// VSR: seal only committed data. `Some(h)`: a segment rolls once an
    /// append passes its capacity less `h` and every accepted op is
    /// committed; until then appends use the last `h` bytes, and one that
    /// does not fit is refused (`StoreError::UncommittedTail`). Size it to
    /// the replica's uncommitted pipeline. `None` (no VSR): rolls seal
    /// whatever is accepted. Less than `segment_size_bytes`.
    pub uncommitted_headroom_bytes: Option<u64>,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            segment_size_bytes: 256 * 1024 * 1024,
            write_buffer_bytes: 4 * 1024 * 1024,
            index_interval_bytes: 64 * 1024,
            retention_bytes: None,
            retention_ms: None,
            recycled_files_max: 4,
            read_bytes_max: 16 * 1024 * 1024,
            transfer_chunk_bytes: 1024 * 1024,
            snapshot_lease_ms: 30_000,
            snapshots_max: 4,
            transfer_window_chunks: 8,
            uncommitted_headroom_bytes: None,
        }
    }
}

impl StoreConfig {
    pub fn validate(&self) -> Result<(), StoreError> {
        let block = BLOCK_SIZE as u64;
        let fail = |m: String| Err(StoreError::Config(m));
        if !self.segment_size_bytes.is_multiple_of(block)
            || self.segment_size_bytes > u64::from(u32::MAX) + 1
        {
            return fail(format!(
                "segment_size_bytes {} must be a multiple of {block} and at most 4 GiB",
                self.segment_size_bytes
            ));
        }
        if !self.write_buffer_bytes.is_multiple_of(BLOCK_SIZE)
            || self.write_buffer_bytes < 2 * BLOCK_SIZE
        {
            return fail(format!(
                "write_buffer_bytes {} must be a multiple of {BLOCK_SIZE} and at least {}",
                self.write_buffer_bytes,
                2 * BLOCK_SIZE
            ));
        }
        if (self.write_buffer_bytes as u64) > self.segment_size_bytes {
            return fail(format!(
                "write_buffer_bytes {} exceeds segment_size_bytes {}",
                self.write_buffer_bytes, self.segment_size_bytes
            ));
        }
        if self.index_interval_bytes == 0 {
            return fail("index_interval_bytes must be positive".into());
        }
        let chunk = self.transfer_chunk_bytes;
        if chunk == 0 || !chunk.is_multiple_of(BLOCK_SIZE as u32) || chunk > 16 * 1024 * 1024 {
            return fail(format!(
                "transfer_chunk_bytes {chunk} must be a positive multiple of {BLOCK_SIZE}, at most 16 MiB"
            ));
        }
        if self.transfer_window_chunks == 0 {
            return fail("transfer_window_chunks must be positive".into());
        }
        if let Some(h) = self.uncommitted_headroom_bytes {
            if h >= self.segment_size_bytes {
                return fail(format!(
                    "uncommitted_headroom_bytes {h} must be below segment_size_bytes {}",
                    self.segment_size_bytes
                ));
            }
        }
        if self.read_bytes_max < HEADER_LEN {
            return fail(format!("read_bytes_max must be at least {HEADER_LEN}"));
        }
        Ok(())
    }

    /// The largest batch an append accepts.
    pub fn batch_bytes_max(&self) -> usize {
        self.write_buffer_bytes - BLOCK_SIZE
    }
}
