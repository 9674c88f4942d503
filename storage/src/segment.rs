//! Segment files: names, and the sparse offset index kept beside each one.
//!
//! A segment is `<base_offset:020>.log` inside its generation directory
//! `gen-<generation:020>`. Sealed segments also get `<base_offset:020>.idx`,
//! written once at seal; it is a cache, rebuilt from the log when missing or
//! invalid. The active segment's index lives in memory and is rebuilt from
//! the log at open.

use std::path::{Path, PathBuf};

use ringlog_protocol::checksum;

/// Directory of a generation inside a partition directory.
pub fn generation_dir(partition_dir: &Path, generation: u64) -> PathBuf {
    partition_dir.join(format!("gen-{generation:020}"))
}

pub fn log_path(generation_dir: &Path, base_offset: u64) -> PathBuf {
    generation_dir.join(format!("{base_offset:020}.log"))
}

pub fn index_path(generation_dir: &Path, base_offset: u64) -> PathBuf {
    generation_dir.join(format!("{base_offset:020}.idx"))
}

/// One sparse index entry: where a batch starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexEntry {
    /// Batch base offset minus the segment base offset.
    pub relative_offset: u32,
    /// Byte position of the batch in the segment.
    pub position: u32,
    /// The batch's max timestamp.
    pub timestamp_ms: u64,
}

const INDEX_MAGIC: u64 = u64::from_le_bytes(*b"RLGINDEX");
const INDEX_HEADER_LEN: usize = 32;
const INDEX_ENTRY_LEN: usize = 16;

/// A segment's sparse index: one entry per `interval_bytes` of log, always
/// including the first batch.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SparseIndex {
    entries: Vec<IndexEntry>,
    /// Position of the last entry, to space entries by `interval_bytes`.
    last_position: Option<u32>,
}

impl SparseIndex {
    /// Records a batch starting at `position` if it is far enough from the
    /// previous entry.
    pub fn observe(
        &mut self,
        relative_offset: u32,
        position: u32,
        timestamp_ms: u64,
        interval_bytes: u32,
    ) {
        let due = match self.last_position {
            None => true,
            Some(last) => position >= last.saturating_add(interval_bytes),
        };
        if due {
            debug_assert!(self
                .entries
                .last()
                .is_none_or(|e| e.relative_offset < relative_offset && e.position < position));
            self.entries.push(IndexEntry {
                relative_offset,
                position,
                timestamp_ms,
            });
            self.last_position = Some(position);
        }
    }

    /// The position of the last indexed batch starting at or before
    /// `relative_offset` (0 when none).
    pub fn position_for(&self, relative_offset: u32) -> u32 {
        let i = self
            .entries
            .partition_point(|e| e.relative_offset <= relative_offset);
        if i == 0 {
            0
        } else {
            self.entries[i - 1].position
        }
    }

    pub fn entries(&self) -> &[IndexEntry] {
        &self.entries
    }

    /// Serialized form: header (magic, base offset, count, checksum of the
    /// entries), then the entries.
    pub fn encode(&self, base_offset: u64) -> Vec<u8> {
        let mut body = Vec::with_capacity(self.entries.len() * INDEX_ENTRY_LEN);
        for e in &self.entries {
            body.extend_from_slice(&e.relative_offset.to_le_bytes());
            body.extend_from_slice(&e.position.to_le_bytes());
            body.extend_from_slice(&e.timestamp_ms.to_le_bytes());
        }
        let mut out = Vec::with_capacity(INDEX_HEADER_LEN + body.len());
        out.extend_from_slice(&INDEX_MAGIC.to_le_bytes());
        out.extend_from_slice(&base_offset.to_le_bytes());
        out.extend_from_slice(&(self.entries.len() as u64).to_le_bytes());
        out.extend_from_slice(&checksum(&body).to_le_bytes());
        out.extend_from_slice(&body);
        out
    }

    /// Parses an index file's bytes (trailing padding allowed). `None` when
    /// it is not a valid index of this segment: the caller rebuilds it.
    pub fn decode(bytes: &[u8], base_offset: u64) -> Option<SparseIndex> {
        let header = bytes.get(..INDEX_HEADER_LEN)?;
        let word =
            |i: usize| u64::from_le_bytes(header[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
        if word(0) != INDEX_MAGIC || word(1) != base_offset {
            return None;
        }
        let count = usize::try_from(word(2)).ok()?;
        let body_len = count.checked_mul(INDEX_ENTRY_LEN)?;
        let body = bytes.get(INDEX_HEADER_LEN..INDEX_HEADER_LEN.checked_add(body_len)?)?;
        if checksum(body) != word(3) {
            return None;
        }
        let entries: Vec<IndexEntry> = body
            .chunks_exact(INDEX_ENTRY_LEN)
            .map(|c| IndexEntry {
                relative_offset: u32::from_le_bytes(c[0..4].try_into().expect("4 bytes")),
                position: u32::from_le_bytes(c[4..8].try_into().expect("4 bytes")),
                timestamp_ms: u64::from_le_bytes(c[8..16].try_into().expect("8 bytes")),
            })
            .collect();
        let ordered = entries
            .windows(2)
            .all(|w| w[0].relative_offset < w[1].relative_offset && w[0].position < w[1].position);
        if !ordered {
            return None;
        }
        Some(SparseIndex {
            last_position: entries.last().map(|e| e.position),
            entries,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_sort_by_offset() {
        let g = generation_dir(Path::new("/d"), 3);
        assert_eq!(g, Path::new("/d/gen-00000000000000000003"));
        assert_eq!(
            log_path(&g, 42),
            Path::new("/d/gen-00000000000000000003/00000000000000000042.log")
        );
    }

    #[test]
    fn sparse_lookup_and_round_trip() {
        let mut idx = SparseIndex::default();
        for i in 0..100u32 {
            idx.observe(i * 10, i * 1000, u64::from(i), 4096);
        }
        assert_eq!(idx.entries().len(), 20);
        assert_eq!(idx.position_for(0), 0);
        assert_eq!(idx.position_for(55), 5000);
        assert_eq!(
            idx.position_for(10_000),
            idx.entries().last().unwrap().position
        );
        let mut bytes = idx.encode(7);
        bytes.resize(8192, 0);
        assert_eq!(SparseIndex::decode(&bytes, 7).unwrap(), idx);
        assert!(SparseIndex::decode(&bytes, 8).is_none());
        bytes[40] ^= 1;
        assert!(SparseIndex::decode(&bytes, 7).is_none());
        assert!(SparseIndex::decode(&bytes[..20], 7).is_none());
    }
}
