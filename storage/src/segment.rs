//! Segment files: names, and the sparse offset index kept beside each one.
//!
//! A segment is `<base_offset:020>.log` inside its generation directory
//! `gen-<generation:020>`. Sealed segments also get `<base_offset:020>.idx`,
//! written once at seal; it is a cache, rebuilt from the log when missing or
//! invalid. The active segment's index lives in memory and is rebuilt from
//! the log at open.
//!
//! Every segment file also has three frontier record slots ([`FrontierSlot`])
//! of one block each, right after its data capacity: every
//! `FRONTIER_SLOT_EVERY_FLUSHES`-th flush (and each checkpoint) writes one
//! (round robin) beside its data write, recording how far the log was
//! already durable; that flush's fdatasync covers it.
//! Recovery trusts the newest valid slot of the live active segment as the
//! durable frontier (see `store/open.rs`). Since most flushes write no
//! slot, each flush also carries a [`FlushTrailer`] in the zero padding of
//! its own data write.

use std::path::{Path, PathBuf};

use ringlog_protocol::{checksum, Hasher};

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
/// Version 1 (the field was reserved, 0, before) is the first whose chunk
/// checksums are the ones the version 2 superblock's segment checksum is
/// computed from. An index of another version is rebuilt.
const INDEX_VERSION: u32 = 1;
const INDEX_HEADER_LEN: usize = 40;
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

    fn from_entries(entries: Vec<IndexEntry>) -> Option<SparseIndex> {
        let ordered = entries
            .windows(2)
            .all(|w| w[0].relative_offset < w[1].relative_offset && w[0].position < w[1].position);
        ordered.then(|| SparseIndex {
            last_position: entries.last().map(|e| e.position),
            entries,
        })
    }
}

/// Hashes a segment as it grows: the xxh3 of every `chunk_size_bytes` slice
/// (state transfer verifies each chunk on arrival with it) and, from those,
/// the segment checksum recorded at seal: the xxh3 of the chunk checksums.
/// One pass over the bytes, and no reread at seal.
#[derive(Clone)]
pub struct SegmentHasher {
    chunk: Hasher,
    chunk_size_bytes: u32,
    chunk_filled_bytes: u32,
    chunk_checksums: Vec<u64>,
}

impl SegmentHasher {
    pub fn new(chunk_size_bytes: u32) -> Self {
        assert!(chunk_size_bytes > 0);
        Self {
            chunk: Hasher::new(),
            chunk_size_bytes,
            chunk_filled_bytes: 0,
            chunk_checksums: Vec::new(),
        }
    }

    pub fn update(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let room = (self.chunk_size_bytes - self.chunk_filled_bytes) as usize;
            let (head, rest) = bytes.split_at(room.min(bytes.len()));
            self.chunk.update(head);
            self.chunk_filled_bytes += head.len() as u32;
            if self.chunk_filled_bytes == self.chunk_size_bytes {
                self.chunk_checksums.push(self.chunk.finish());
                self.chunk = Hasher::new();
                self.chunk_filled_bytes = 0;
            }
            bytes = rest;
        }
    }

    /// The segment checksum so far: xxh3 over the little-endian chunk
    /// checksums (the partial last chunk included).
    pub fn checksum(&self) -> u64 {
        segment_checksum(&self.chunk_checksums())
    }

    /// Checksums of every chunk so far, the partial last one included.
    pub fn chunk_checksums(&self) -> Vec<u64> {
        let mut sums = self.chunk_checksums.clone();
        if self.chunk_filled_bytes > 0 {
            sums.push(self.chunk.finish());
        }
        sums
    }
}

/// The segment checksum from its chunk checksums.
pub fn segment_checksum(chunk_checksums: &[u64]) -> u64 {
    let bytes: Vec<u8> = chunk_checksums
        .iter()
        .flat_map(|c| c.to_le_bytes())
        .collect();
    checksum(&bytes)
}

/// What a sealed segment's `.idx` file holds: its sparse index and the chunk
/// checksums computed while it was written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SealedIndex {
    pub index: SparseIndex,
    pub chunk_size_bytes: u32,
    pub chunk_checksums: Vec<u64>,
}

impl SealedIndex {
    /// Header (magic, base offset, entry count, chunk count and size,
    /// version, checksum of the rest), then index entries, then chunk checksums.
    pub fn encode(&self, base_offset: u64) -> Vec<u8> {
        let mut body = Vec::with_capacity(
            self.index.entries.len() * INDEX_ENTRY_LEN + self.chunk_checksums.len() * 8,
        );
        for e in &self.index.entries {
            body.extend_from_slice(&e.relative_offset.to_le_bytes());
            body.extend_from_slice(&e.position.to_le_bytes());
            body.extend_from_slice(&e.timestamp_ms.to_le_bytes());
        }
        for c in &self.chunk_checksums {
            body.extend_from_slice(&c.to_le_bytes());
        }
        let mut out = Vec::with_capacity(INDEX_HEADER_LEN + body.len());
        out.extend_from_slice(&INDEX_MAGIC.to_le_bytes());
        out.extend_from_slice(&base_offset.to_le_bytes());
        out.extend_from_slice(&(self.index.entries.len() as u32).to_le_bytes());
        out.extend_from_slice(&(self.chunk_checksums.len() as u32).to_le_bytes());
        out.extend_from_slice(&self.chunk_size_bytes.to_le_bytes());
        out.extend_from_slice(&INDEX_VERSION.to_le_bytes());
        out.extend_from_slice(&checksum(&body).to_le_bytes());
        out.extend_from_slice(&body);
        out
    }

    /// Parses an index file's bytes (trailing padding allowed). `None` when
    /// it is not a valid index of this segment: the caller rebuilds it.
    pub fn decode(bytes: &[u8], base_offset: u64) -> Option<SealedIndex> {
        let header = bytes.get(..INDEX_HEADER_LEN)?;
        let u64_at = |i: usize| u64::from_le_bytes(header[i..i + 8].try_into().expect("8 bytes"));
        let u32_at = |i: usize| u32::from_le_bytes(header[i..i + 4].try_into().expect("4 bytes"));
        if u64_at(0) != INDEX_MAGIC || u64_at(8) != base_offset || u32_at(28) != INDEX_VERSION {
            return None;
        }
        let entries_len = (u32_at(16) as usize).checked_mul(INDEX_ENTRY_LEN)?;
        let chunks_len = (u32_at(20) as usize).checked_mul(8)?;
        let body_end = INDEX_HEADER_LEN
            .checked_add(entries_len)?
            .checked_add(chunks_len)?;
        let body = bytes.get(INDEX_HEADER_LEN..body_end)?;
        if checksum(body) != u64_at(32) {
            return None;
        }
        let (entries, chunks) = body.split_at(entries_len);
        let entries = entries
            .chunks_exact(INDEX_ENTRY_LEN)
            .map(|c| IndexEntry {
                relative_offset: u32::from_le_bytes(c[0..4].try_into().expect("4 bytes")),
                position: u32::from_le_bytes(c[4..8].try_into().expect("4 bytes")),
                timestamp_ms: u64::from_le_bytes(c[8..16].try_into().expect("8 bytes")),
            })
            .collect();
        Some(SealedIndex {
            index: SparseIndex::from_entries(entries)?,
            chunk_size_bytes: u32_at(24),
            chunk_checksums: chunks
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
                .collect(),
        })
    }
}

/// Size of one frontier record slot.
pub const SLOT_BYTES: u64 = 4096;
/// Frontier record slots per segment file.
pub const SLOTS: u64 = 3;
const SLOT_MAGIC: u64 = u64::from_le_bytes(*b"RLGFRONT");
const SLOT_VERSION: u16 = 1;
const SLOT_LEN: usize = 96;

/// Offset of frontier record slot `slot` in a segment of `capacity_bytes`.
pub fn slot_offset(capacity_bytes: u64, slot: u64) -> u64 {
    debug_assert!(slot < SLOTS);
    capacity_bytes + slot * SLOT_BYTES
}

/// One frontier record: the active segment's durable end as of some flush.
/// The identity fields (partition, generation, base, capacity) make a slot
/// left in a recycled file, or by an earlier segment, never match.
///
/// Layout (little-endian): magic u64, version u16, reserved u16+u32,
/// checksum u64 (xxh3 of the first 96 bytes with this field zero),
/// partition_id u32, reserved u32, live_generation, active_base,
/// capacity_bytes, sequence, position, next_offset, last_checksum, last_op
/// (u64 each); the rest of the block is zero.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FrontierSlot {
    pub partition_id: u32,
    pub live_generation: u64,
    pub active_base: u64,
    pub capacity_bytes: u64,
    /// Counts the slots written into this segment; slot `sequence % 3`.
    pub sequence: u64,
    /// Byte position in the segment below which every batch is durable.
    pub position: u64,
    pub next_offset: u64,
    pub last_checksum: u64,
    pub last_op: u64,
}

impl FrontierSlot {
    /// Encodes into `out` (one slot block, zero-filled past the record).
    pub fn encode(&self, out: &mut [u8]) {
        assert_eq!(out.len() as u64, SLOT_BYTES);
        out.fill(0);
        let mut at = 0;
        let mut put = |bytes: &[u8]| {
            out[at..at + bytes.len()].copy_from_slice(bytes);
            at += bytes.len();
        };
        put(&SLOT_MAGIC.to_le_bytes());
        put(&SLOT_VERSION.to_le_bytes());
        put(&[0; 6]);
        put(&[0; 8]); // checksum
        put(&self.partition_id.to_le_bytes());
        put(&[0; 4]);
        for v in [
            self.live_generation,
            self.active_base,
            self.capacity_bytes,
            self.sequence,
            self.position,
            self.next_offset,
            self.last_checksum,
            self.last_op,
        ] {
            put(&v.to_le_bytes());
        }
        debug_assert_eq!(at, SLOT_LEN);
        let sum = checksum(&out[..SLOT_LEN]);
        out[16..24].copy_from_slice(&sum.to_le_bytes());
    }

    /// Decodes one slot block; `None` unless it is a whole, valid record.
    pub fn decode(block: &[u8]) -> Option<FrontierSlot> {
        let block = block.get(..SLOT_BYTES as usize)?;
        let u64_at = |i: usize| u64::from_le_bytes(block[i..i + 8].try_into().expect("8 bytes"));
        let version = u16::from_le_bytes([block[8], block[9]]);
        if u64_at(0) != SLOT_MAGIC || version != SLOT_VERSION {
            return None;
        }
        let mut zeroed = [0u8; SLOT_LEN];
        zeroed.copy_from_slice(&block[..SLOT_LEN]);
        zeroed[16..24].fill(0);
        let reserved_zero = block[10..16].iter().all(|&b| b == 0)
            && block[28..32].iter().all(|&b| b == 0)
            && block[SLOT_LEN..].iter().all(|&b| b == 0);
        if checksum(&zeroed) != u64_at(16) || !reserved_zero {
            return None;
        }
        Some(FrontierSlot {
            partition_id: u32::from_le_bytes(block[24..28].try_into().expect("4 bytes")),
            live_generation: u64_at(32),
            active_base: u64_at(40),
            capacity_bytes: u64_at(48),
            sequence: u64_at(56),
            position: u64_at(64),
            next_offset: u64_at(72),
            last_checksum: u64_at(80),
            last_op: u64_at(88),
        })
    }
}

/// Size of a flush trailer: one sector, the unit a torn write keeps or
/// loses whole.
pub const TRAILER_BYTES: u64 = 512;
const TRAILER_MAGIC: u64 = u64::from_le_bytes(*b"RLGTRAIL");
const TRAILER_VERSION: u16 = 1;
const TRAILER_LEN: usize = 128;
const _: () = assert!(TRAILER_LEN <= TRAILER_BYTES as usize);
const _: () = assert!(SLOT_LEN <= SLOT_BYTES as usize);
const _: () = assert!((crate::io::BLOCK_SIZE as u64).is_multiple_of(TRAILER_BYTES));

/// Where the trailer of a flush whose data ends at `end_position` goes: the
/// first sector boundary at or past it, inside the flush's zero padding.
pub fn trailer_position(end_position: u64) -> u64 {
    end_position.next_multiple_of(TRAILER_BYTES)
}

/// Where the data write of a flush ending at `end_position` ends when it
/// carries its trailer: the block boundary past the trailer (one block more
/// than the padding when the trailer does not fit in it).
pub fn trailer_write_end(end_position: u64) -> u64 {
    crate::io::align_up(trailer_position(end_position) + TRAILER_BYTES)
}

/// The frontier record a flush carries in its own data write, in the
/// padding past its last batch (see `store/open.rs`). It names the durable
/// end as it was when the flush was prepared (what earlier, completed
/// fdatasyncs made durable) and this flush's own end. Only the newest
/// flush's trailer survives: the next flush rewrites that block.
///
/// The identity fields, and the segment's random `nonce` (from the
/// superblock, new for every segment), make a trailer left in a recycled
/// file, or one a producer wrote inside a batch's bytes, never match.
///
/// Layout (little-endian): magic u64, version u16, reserved u16+u32,
/// checksum u64 (xxh3 of the first 128 bytes with this field zero),
/// partition_id u32, reserved u32, then u64 each: live_generation,
/// active_base, capacity_bytes, nonce, slot_sequence, durable_position,
/// durable_next_offset, durable_last_checksum, durable_last_op,
/// end_position, end_next_offset, end_last_checksum; the rest of the
/// sector is zero.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlushTrailer {
    pub partition_id: u32,
    pub live_generation: u64,
    pub active_base: u64,
    pub capacity_bytes: u64,
    pub nonce: u64,
    /// The next frontier slot's sequence when the flush was prepared: a
    /// trailer below the newest slot record is older than that record.
    pub slot_sequence: u64,
    /// Byte position below which every batch was durable.
    pub durable_position: u64,
    pub durable_next_offset: u64,
    pub durable_last_checksum: u64,
    pub durable_last_op: u64,
    /// Where this flush's data ends, and the chain there.
    pub end_position: u64,
    pub end_next_offset: u64,
    pub end_last_checksum: u64,
}

impl FlushTrailer {
    /// Encodes into `out` (one trailer sector, zero-filled past the record).
    pub fn encode(&self, out: &mut [u8]) {
        assert_eq!(out.len() as u64, TRAILER_BYTES);
        out.fill(0);
        out[0..8].copy_from_slice(&TRAILER_MAGIC.to_le_bytes());
        out[8..10].copy_from_slice(&TRAILER_VERSION.to_le_bytes());
        out[24..28].copy_from_slice(&self.partition_id.to_le_bytes());
        let fields = [
            self.live_generation,
            self.active_base,
            self.capacity_bytes,
            self.nonce,
            self.slot_sequence,
            self.durable_position,
            self.durable_next_offset,
            self.durable_last_checksum,
            self.durable_last_op,
            self.end_position,
            self.end_next_offset,
            self.end_last_checksum,
        ];
        for (i, v) in fields.iter().enumerate() {
            out[32 + 8 * i..40 + 8 * i].copy_from_slice(&v.to_le_bytes());
        }
        debug_assert_eq!(32 + 8 * fields.len(), TRAILER_LEN);
        let sum = checksum(&out[..TRAILER_LEN]);
        out[16..24].copy_from_slice(&sum.to_le_bytes());
    }

    /// Decodes one sector; `None` unless it is a whole, valid trailer.
    pub fn decode(sector: &[u8]) -> Option<FlushTrailer> {
        let sector = sector.get(..TRAILER_BYTES as usize)?;
        let u64_at = |i: usize| u64::from_le_bytes(sector[i..i + 8].try_into().expect("8 bytes"));
        // The magic first: this runs on every sector a recovery scan reads.
        if u64_at(0) != TRAILER_MAGIC || sector[8..10] != TRAILER_VERSION.to_le_bytes() {
            return None;
        }
        let mut zeroed = [0u8; TRAILER_LEN];
        zeroed.copy_from_slice(&sector[..TRAILER_LEN]);
        zeroed[16..24].fill(0);
        let reserved_zero = sector[10..16].iter().all(|&b| b == 0)
            && sector[28..32].iter().all(|&b| b == 0)
            && sector[TRAILER_LEN..].iter().all(|&b| b == 0);
        if checksum(&zeroed) != u64_at(16) || !reserved_zero {
            return None;
        }
        let field = |i: usize| u64_at(32 + 8 * i);
        Some(FlushTrailer {
            partition_id: u32::from_le_bytes(sector[24..28].try_into().expect("4 bytes")),
            live_generation: field(0),
            active_base: field(1),
            capacity_bytes: field(2),
            nonce: field(3),
            slot_sequence: field(4),
            durable_position: field(5),
            durable_next_offset: field(6),
            durable_last_checksum: field(7),
            durable_last_op: field(8),
            end_position: field(9),
            end_next_offset: field(10),
            end_last_checksum: field(11),
        })
    }
}

/// A fresh random 64-bit value for a new segment's trailers (see
/// [`FlushTrailer`]): producer bytes cannot predict it.
pub fn new_nonce() -> std::io::Result<u64> {
    getrandom::u64().map_err(std::io::Error::from)
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
        let sealed = SealedIndex {
            index: idx,
            chunk_size_bytes: 4096,
            chunk_checksums: vec![1, 2, 3],
        };
        let mut bytes = sealed.encode(7);
        bytes.resize(8192, 0);
        assert_eq!(SealedIndex::decode(&bytes, 7).unwrap(), sealed);
        assert!(SealedIndex::decode(&bytes, 8).is_none());
        bytes[50] ^= 1;
        assert!(SealedIndex::decode(&bytes, 7).is_none());
        assert!(SealedIndex::decode(&bytes[..20], 7).is_none());
    }

    #[test]
    fn index_of_another_version_is_rejected() {
        let sealed = SealedIndex {
            index: SparseIndex::default(),
            chunk_size_bytes: 4096,
            chunk_checksums: vec![9],
        };
        let mut bytes = sealed.encode(0);
        assert_eq!(SealedIndex::decode(&bytes, 0).unwrap(), sealed);
        bytes[28..32].copy_from_slice(&0u32.to_le_bytes());
        assert!(SealedIndex::decode(&bytes, 0).is_none());
    }

    #[test]
    fn frontier_slot_round_trip_and_damage() {
        let slot = FrontierSlot {
            partition_id: 3,
            live_generation: 2,
            active_base: 100,
            capacity_bytes: 65536,
            sequence: 7,
            position: 12288,
            next_offset: 140,
            last_checksum: 0xdead_beef,
            last_op: 141,
        };
        let mut block = vec![0u8; SLOT_BYTES as usize];
        slot.encode(&mut block);
        assert_eq!(FrontierSlot::decode(&block), Some(slot));
        for i in (0..SLOT_LEN).chain([SLOT_LEN, 4095]) {
            let mut bad = block.clone();
            bad[i] ^= 0x04;
            assert_eq!(FrontierSlot::decode(&bad), None, "flip at {i} accepted");
        }
        assert_eq!(FrontierSlot::decode(&block[..100]), None);
        assert_eq!(FrontierSlot::decode(&[0u8; 4096]), None);
        assert_eq!(slot_offset(65536, 1), 65536 + 4096);
    }

    #[test]
    fn flush_trailer_round_trip_and_damage() {
        let trailer = FlushTrailer {
            partition_id: 3,
            live_generation: 2,
            active_base: 100,
            capacity_bytes: 65536,
            nonce: 0x0123_4567_89ab_cdef,
            slot_sequence: 4,
            durable_position: 12288,
            durable_next_offset: 140,
            durable_last_checksum: 0xdead_beef,
            durable_last_op: 141,
            end_position: 13000,
            end_next_offset: 150,
            end_last_checksum: 0xfeed,
        };
        let mut sector = vec![0u8; TRAILER_BYTES as usize];
        trailer.encode(&mut sector);
        assert_eq!(FlushTrailer::decode(&sector), Some(trailer));
        // Every single bit flip anywhere in the sector is rejected.
        for bit in 0..TRAILER_BYTES as usize * 8 {
            let mut bad = sector.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            assert_eq!(
                FlushTrailer::decode(&bad),
                None,
                "flip of bit {bit} accepted"
            );
        }
        for len in [0, 8, TRAILER_LEN, TRAILER_BYTES as usize - 1] {
            assert_eq!(FlushTrailer::decode(&sector[..len]), None, "{len} bytes");
        }
        assert_eq!(FlushTrailer::decode(&[0u8; 512]), None);
        // Not a frontier slot, and a slot is not a trailer.
        assert_eq!(FrontierSlot::decode(&sector), None);
        let mut slot = vec![0u8; SLOT_BYTES as usize];
        FrontierSlot::default().encode(&mut slot);
        assert_eq!(FlushTrailer::decode(&slot), None);
    }

    #[test]
    fn trailer_goes_in_the_padding_or_one_block_past_it() {
        assert_eq!((trailer_position(0), trailer_write_end(0)), (0, 4096));
        assert_eq!((trailer_position(1), trailer_write_end(1)), (512, 4096));
        assert_eq!(
            (trailer_position(3584), trailer_write_end(3584)),
            (3584, 4096)
        );
        assert_eq!(
            (trailer_position(3585), trailer_write_end(3585)),
            (4096, 8192)
        );
        assert_eq!(
            (trailer_position(4096), trailer_write_end(4096)),
            (4096, 8192)
        );
        assert_ne!(new_nonce().unwrap(), new_nonce().unwrap());
    }

    #[test]
    fn segment_hasher_matches_one_shot_hashes() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 256) as u8).collect();
        let mut h = SegmentHasher::new(4096);
        for piece in data.chunks(333) {
            h.update(piece);
        }
        let expected: Vec<u64> = data.chunks(4096).map(checksum).collect();
        assert_eq!(h.chunk_checksums(), expected);
        assert_eq!(h.checksum(), segment_checksum(&expected));
        assert_ne!(h.checksum(), segment_checksum(&expected[1..]));
    }
}
