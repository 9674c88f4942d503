//! The partition superblock: the single commit point of a partition's state.
//!
//! One file, [`COPIES`] copies of [`COPY_SIZE_BYTES`] each (4096-aligned), all
//! carrying the same state. Every copy has a checksum that excludes its copy
//! index, so all copies of one state share a checksum, and the next state
//! records it as its `parent`. Each new state is written to one half of the
//! copies ([`half_for`]), alternating, then fdatasynced: a crash can tear
//! only the half in flight, and the other half still holds the previous
//! state whole. One fsync per update keeps seals and installs cheap.
//!
//! At open, [`choose`] picks the highest valid sequence, refusing a fork:
//! a state whose parent matches none of the valid copies one sequence below,
//! or two valid copies with the same sequence and different contents (only
//! a write that bypassed fail-stop can make those, and picking one would be
//! arbitrary). Copies that are invalid or older are repaired by rewriting
//! them.
//!
//! Layout of a copy (little-endian), version 6. A decoder accepts exactly
//! [`VERSION`]; a later version bumps it.
//! ```text
//!   0 magic u64            8 version u16        10 copy_index u16
//!  12 reserved u32        16 checksum u64       24 sequence u64
//!  32 parent u64          40 cluster_id u128    56 partition_id u32
//!  60 replica_index u8    61 vsr_flags u8 (bit 0: wiped, bit 1: view_lost; see `VsrState`)
//!  62 reserved [u8;2]     64 view u32
//!  68 log_view u32        72 commit u64         80 op u64
//!  88 next_offset u64     96 last_op u64       104 last_checksum u64
//! 112 active_base u64    120 active_position u64
//! 128 active_prev_checksum u64 (chain anchor before the active segment)
//! 136 purge_generation u64  144 live_generation u64
//! 152 table_id u64       160 table_first u64   168 table_count u64
//! 176 table_anchor u64   184 table_last u64
//! 192 active_capacity u64 (the active segment's size bound, fixed when it
//!     was created: recovery scans to it, whatever the configuration says)
//! 200 active_prev_op u64 (VSR op of the batch before the active segment)
//! 208 slot_floor u64     216 cut_pending_end u64 (see `Frontier`)
//! 224 active_nonce u64 (random, new for each active segment: its flush
//!     trailers carry it, see `segment::FlushTrailer`)
//! 232 zero to the end of the copy
//! ```
//! Version 1 held the sealed segments inside the copy (at most 338 of them)
//! and its segment checksum was over the segment's bytes; since version 2
//! it is the xxh3 of the chunk checksums (see `segment::SegmentHasher`) and
//! the segments are in the segment table file the `table_*` fields name and
//! commit (see `store::table`), so a copy is one fixed-size block. Version 3
//! adds `active_capacity`; version 4 the fields of a tail cut
//! (`store::truncate`); version 5 `active_nonce`; version 6 `vsr_flags`
//! (a reserved byte before). There is no migration: a
//! partition written by an older version does not open (its copies are
//! refused as another version).

use std::path::Path;

use ringlog_protocol::checksum;
use thiserror::Error;

/// Size of one copy: one block, whatever the number of segments.
pub const COPY_SIZE_BYTES: usize = 4096;
/// Number of copies in the superblock file.
pub const COPIES: usize = 4;
/// Size of the whole superblock file.
pub const FILE_SIZE_BYTES: usize = COPY_SIZE_BYTES * COPIES;
/// "RLGSUPER"
const MAGIC: u64 = u64::from_le_bytes(*b"RLGSUPER");
pub const VERSION: u16 = 6;
/// `vsr_flags` bit: [`VsrState::wiped`].
const VSR_FLAG_WIPED: u8 = 1;
/// `vsr_flags` bit: [`VsrState::view_lost`] (only beside `VSR_FLAG_WIPED`).
const VSR_FLAG_VIEW_LOST: u8 = 2;
const FIXED_LEN: usize = 232;

/// The two copies that receive the state with this sequence number.
pub fn half_for(sequence: u64) -> [usize; 2] {
    if sequence.is_multiple_of(2) {
        [0, 1]
    } else {
        [2, 3]
    }
}

/// Viewstamped Replication state, durable before any message depending on it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VsrState {
    pub view: u32,
    pub log_view: u32,
    pub commit: u64,
    pub op: u64,
    /// The replica's disk was lost and this store was made anew for it; set
    /// until its log is repaired. A replica booted from a store with this
    /// set must not vote or lead, also after a crash mid-repair (its host
    /// cannot remember the wipe; only this can).
    pub wiped: bool,
    /// Set with `wiped` when the disk was lost (not by an install, which
    /// keeps the superblock's view): the view the replica promised before
    /// is unknown, so it must learn the view from a quorum before it acks
    /// or votes. Never set without `wiped`.
    pub view_lost: bool,
}

/// The durable frontier checkpoint: everything below it is known to be on
/// disk and verified; recovery scans only past it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Frontier {
    /// The offset the next batch will get.
    pub next_offset: u64,
    /// VSR op of the last batch (0 when none).
    pub last_op: u64,
    /// Header checksum of the last batch (0 when none): the hash chain anchor.
    pub last_checksum: u64,
    /// Base offset of the active (unsealed) segment.
    pub active_base: u64,
    /// Byte position in the active segment up to which batches are durable.
    pub active_position: u64,
    /// Header checksum of the batch before the active segment's first batch.
    pub active_prev_checksum: u64,
    /// Size bound of the active segment's data, fixed when it was created
    /// (the frontier record slots sit right after it).
    pub active_capacity_bytes: u64,
    /// VSR op of the batch before the active segment's first one (0 when
    /// none): a tail cut never goes below it (sealed data is never cut).
    pub active_prev_op: u64,
    /// Frontier records and flush trailers of the active segment with a
    /// slot sequence below this are void: they were written before a tail
    /// cut and may name positions above it. 0 for a segment never cut.
    pub slot_floor: u64,
    /// A cut to `active_position` is not finished while this is non-zero:
    /// `[active_position, cut_pending_end)` may still hold cut bytes, so
    /// recovery ends the log at `active_position` whatever follows, zeroes
    /// that range and commits a frontier without it before appending.
    pub cut_pending_end: u64,
    /// The active segment's random trailer nonce (see
    /// `segment::FlushTrailer`), drawn when the segment was created.
    pub active_nonce: u64,
}

/// Names and commits the live part of the segment table file: entries
/// `[first, first + count)` of `gen-<live_generation>/segments-<id>.tbl`,
/// whose chained checksum runs from `anchor` (the chain value before entry
/// `first`) to `last` (the value after the last live entry; `anchor` when
/// there is none).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TableRef {
    pub id: u64,
    pub first: u64,
    pub count: u64,
    pub anchor: u64,
    pub last: u64,
}

/// A sealed segment as recorded once, at seal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SealedSegment {
    pub base_offset: u64,
    /// One past the last offset in the segment.
    pub end_offset: u64,
    pub length_bytes: u64,
    /// xxh3 over the xxh3 of each transfer chunk of `[0, length_bytes)`
    /// (see `segment::SegmentHasher`).
    pub checksum: u64,
    /// Header checksum of the segment's last batch (chain anchor).
    pub last_batch_checksum: u64,
    /// Largest batch timestamp in the segment (for retention by age).
    pub max_timestamp_ms: u64,
}

/// The decoded state of one superblock.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Superblock {
    pub sequence: u64,
    /// Checksum of the state this one replaced (0 for the first).
    pub parent: u64,
    pub cluster_id: u128,
    pub partition_id: u32,
    pub replica_index: u8,
    pub vsr: VsrState,
    pub frontier: Frontier,
    pub purge_generation: u64,
    /// The generation directory holding the live segments. An install
    /// commits by naming the generation it staged; recovery finishes its
    /// rename if needed.
    pub live_generation: u64,
    /// The sealed segments, oldest first, in the segment table file.
    pub table: TableRef,
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum SuperblockError {
    #[error("superblock {path}: no valid copy among {COPIES} ({reasons})")]
    NoValidCopy { path: String, reasons: String },
    #[error("superblock {path}: sequence {sequence} does not chain to any copy of sequence {}", sequence - 1)]
    Forked { path: String, sequence: u64 },
    #[error("superblock {path}: two valid copies of sequence {sequence} differ (copies {copies:?}): a write bypassed fail-stop; refusing to pick one, restore the partition from a replica or a backup")]
    SameSequenceFork {
        path: String,
        sequence: u64,
        copies: [usize; 2],
    },
    #[error("superblock {path}: file is {len} bytes, expected {FILE_SIZE_BYTES}")]
    Short { path: String, len: usize },
}

/// Why a single copy was rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CopyError {
    BadMagic,
    UnsupportedVersion(u16),
    BadChecksum,
    BadCopyIndex(u16),
    NonZeroReserved,
}

impl Superblock {
    /// The state that replaces `self`: next sequence, chained to it.
    pub fn successor(&self) -> Superblock {
        Superblock {
            sequence: self.sequence + 1,
            parent: self.checksum(),
            ..self.clone()
        }
    }

    /// The checksum shared by every copy of this state.
    pub fn checksum(&self) -> u64 {
        let mut copy = vec![0u8; COPY_SIZE_BYTES];
        self.encode(0, &mut copy)
    }

    /// Encodes copy `copy_index` into `out` (`COPY_SIZE_BYTES` long) and
    /// returns the checksum.
    pub fn encode(&self, copy_index: u16, out: &mut [u8]) -> u64 {
        assert_eq!(out.len(), COPY_SIZE_BYTES);
        out.fill(0);
        let mut w = Writer { out, at: 0 };
        w.u64(MAGIC);
        w.u16(VERSION);
        w.u16(0); // copy index, filled after the checksum
        w.u32(0);
        w.u64(0); // checksum
        w.u64(self.sequence);
        w.u64(self.parent);
        w.bytes(&self.cluster_id.to_le_bytes());
        w.u32(self.partition_id);
        assert!(
            self.vsr.wiped || !self.vsr.view_lost,
            "view_lost only when wiped"
        );
        let flags = if self.vsr.wiped { VSR_FLAG_WIPED } else { 0 }
            | if self.vsr.view_lost {
                VSR_FLAG_VIEW_LOST
            } else {
                0
            };
        w.bytes(&[self.replica_index, flags, 0, 0]);
        w.u32(self.vsr.view);
        w.u32(self.vsr.log_view);
        w.u64(self.vsr.commit);
        w.u64(self.vsr.op);
        let f = &self.frontier;
        let t = &self.table;
        for v in [
            f.next_offset,
            f.last_op,
            f.last_checksum,
            f.active_base,
            f.active_position,
            f.active_prev_checksum,
            self.purge_generation,
            self.live_generation,
            t.id,
            t.first,
            t.count,
            t.anchor,
            t.last,
            f.active_capacity_bytes,
            f.active_prev_op,
            f.slot_floor,
            f.cut_pending_end,
            f.active_nonce,
        ] {
            w.u64(v);
        }
        debug_assert_eq!(w.at, FIXED_LEN);
        let sum = checksum(out);
        out[16..24].copy_from_slice(&sum.to_le_bytes());
        out[10..12].copy_from_slice(&copy_index.to_le_bytes());
        sum
    }

    /// Decodes one copy; returns the state, its checksum and its copy index.
    pub fn decode(copy: &[u8]) -> Result<(Superblock, u64, u16), CopyError> {
        assert_eq!(copy.len(), COPY_SIZE_BYTES);
        let mut r = Reader { bytes: copy, at: 0 };
        if r.u64() != MAGIC {
            return Err(CopyError::BadMagic);
        }
        let version = r.u16();
        if version != VERSION {
            return Err(CopyError::UnsupportedVersion(version));
        }
        let copy_index = r.u16();
        let reserved = r.u32();
        let stored = r.u64();
        let mut zeroed = copy.to_vec();
        zeroed[10..12].fill(0);
        zeroed[16..24].fill(0);
        if checksum(&zeroed) != stored {
            return Err(CopyError::BadChecksum);
        }
        if usize::from(copy_index) >= COPIES {
            return Err(CopyError::BadCopyIndex(copy_index));
        }
        if reserved != 0 {
            return Err(CopyError::NonZeroReserved);
        }
        let sequence = r.u64();
        let parent = r.u64();
        let cluster_id = u128::from_le_bytes(r.take(16).try_into().expect("16 bytes"));
        let partition_id = r.u32();
        let replica = r.take(4);
        let flags = replica[1];
        let known = VSR_FLAG_WIPED | VSR_FLAG_VIEW_LOST;
        if replica[2..] != [0, 0] || flags & !known != 0 || flags == VSR_FLAG_VIEW_LOST {
            return Err(CopyError::NonZeroReserved);
        }
        let replica_index = replica[0];
        let wiped = flags & VSR_FLAG_WIPED != 0;
        let view_lost = flags & VSR_FLAG_VIEW_LOST != 0;
        let vsr = VsrState {
            view: r.u32(),
            log_view: r.u32(),
            commit: r.u64(),
            op: r.u64(),
            wiped,
            view_lost,
        };
        let frontier = Frontier {
            next_offset: r.u64(),
            last_op: r.u64(),
            last_checksum: r.u64(),
            active_base: r.u64(),
            active_position: r.u64(),
            active_prev_checksum: r.u64(),
            ..Frontier::default()
        };
        let purge_generation = r.u64();
        let live_generation = r.u64();
        let table = TableRef {
            id: r.u64(),
            first: r.u64(),
            count: r.u64(),
            anchor: r.u64(),
            last: r.u64(),
        };
        let frontier = Frontier {
            active_capacity_bytes: r.u64(),
            active_prev_op: r.u64(),
            slot_floor: r.u64(),
            cut_pending_end: r.u64(),
            active_nonce: r.u64(),
            ..frontier
        };
        debug_assert_eq!(r.at, FIXED_LEN);
        // Folded, not `any`: a branch per byte over most of a 16 KiB copy
        // was a third of boot time with thousands of partitions.
        if copy[r.at..].iter().fold(0u8, |acc, &b| acc | b) != 0 {
            return Err(CopyError::NonZeroReserved);
        }
        Ok((
            Superblock {
                sequence,
                parent,
                cluster_id,
                partition_id,
                replica_index,
                vsr,
                frontier,
                purge_generation,
                live_generation,
                table,
            },
            stored,
            copy_index,
        ))
    }
}

/// The outcome of reading all copies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chosen {
    pub superblock: Superblock,
    /// Copies that must be rewritten (invalid, misplaced or older).
    pub copies_to_repair: Vec<usize>,
}

/// Picks the state to trust from the whole superblock file's bytes.
pub fn choose(file: &[u8], path: &Path) -> Result<Chosen, SuperblockError> {
    let path_str = path.display().to_string();
    if file.len() < FILE_SIZE_BYTES {
        return Err(SuperblockError::Short {
            path: path_str,
            len: file.len(),
        });
    }
    let decoded: Vec<Result<(Superblock, u64, u16), CopyError>> = file
        .chunks_exact(COPY_SIZE_BYTES)
        .take(COPIES)
        .map(Superblock::decode)
        .collect();
    let best = decoded
        .iter()
        .filter_map(|d| d.as_ref().ok())
        .max_by_key(|(sb, _, _)| sb.sequence);
    let Some((best, best_sum, _)) = best else {
        let reasons = decoded
            .iter()
            .enumerate()
            .map(|(i, d)| format!("copy {i}: {:?}", d.as_ref().err()))
            .collect::<Vec<_>>()
            .join(", ");
        return Err(SuperblockError::NoValidCopy {
            path: path_str,
            reasons,
        });
    };
    refuse_same_sequence_fork(&decoded, &path_str)?;
    let parents: Vec<u64> = decoded
        .iter()
        .filter_map(|d| d.as_ref().ok())
        .filter(|(sb, _, _)| sb.sequence + 1 == best.sequence)
        .map(|(_, sum, _)| *sum)
        .collect();
    if !parents.is_empty() && !parents.contains(&best.parent) {
        return Err(SuperblockError::Forked {
            path: path_str,
            sequence: best.sequence,
        });
    }
    let copies_to_repair = decoded
        .iter()
        .enumerate()
        .filter(|(i, d)| match d {
            Ok((_, sum, index)) => sum != best_sum || usize::from(*index) != *i,
            Err(_) => true,
        })
        .map(|(i, _)| i)
        .collect();
    Ok(Chosen {
        superblock: best.clone(),
        copies_to_repair,
    })
}

/// Two valid copies of one sequence must hold one state: each state is
/// written whole to one half, so differing copies mean a second state was
/// written under the same sequence (a write after fail-stop, or a bug).
fn refuse_same_sequence_fork(
    decoded: &[Result<(Superblock, u64, u16), CopyError>],
    path: &str,
) -> Result<(), SuperblockError> {
    for (i, a) in decoded.iter().enumerate() {
        let Ok((sa, suma, _)) = a else { continue };
        for (j, b) in decoded.iter().enumerate().skip(i + 1) {
            let Ok((sb, sumb, _)) = b else { continue };
            if sa.sequence == sb.sequence && suma != sumb {
                return Err(SuperblockError::SameSequenceFork {
                    path: path.to_string(),
                    sequence: sa.sequence,
                    copies: [i, j],
                });
            }
        }
    }
    Ok(())
}

struct Writer<'a> {
    out: &'a mut [u8],
    at: usize,
}

impl Writer<'_> {
    fn bytes(&mut self, b: &[u8]) {
        self.out[self.at..self.at + b.len()].copy_from_slice(b);
        self.at += b.len();
    }
    fn u16(&mut self, v: u16) {
        self.bytes(&v.to_le_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.bytes(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.bytes(&v.to_le_bytes());
    }
}

/// Reads fixed fields; the caller guarantees the copy is long enough
/// (`COPY_SIZE_BYTES` always covers the fixed part).
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> &'a [u8] {
        let s = &self.bytes[self.at..self.at + n];
        self.at += n;
        s
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.take(2).try_into().expect("2 bytes"))
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take(4).try_into().expect("4 bytes"))
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take(8).try_into().expect("8 bytes"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Superblock {
        Superblock {
            sequence: 7,
            parent: 99,
            cluster_id: 0x1234_5678_9abc_def0_1122_3344_5566_7788,
            partition_id: 3,
            replica_index: 1,
            vsr: VsrState {
                view: 2,
                log_view: 2,
                commit: 10,
                op: 11,
                wiped: false,
                view_lost: false,
            },
            frontier: Frontier {
                next_offset: 500,
                last_op: 11,
                last_checksum: 42,
                active_base: 400,
                active_position: 8192,
                active_prev_checksum: 41,
                active_capacity_bytes: 65536,
                active_prev_op: 9,
                slot_floor: 4,
                cut_pending_end: 12288,
                active_nonce: 0x5eed_0000_0000_0001,
            },
            purge_generation: 1,
            live_generation: 2,
            table: TableRef {
                id: 3,
                first: 17,
                count: 5,
                anchor: 0xabcd,
                last: 0x1234,
            },
        }
    }

    fn file_of(states: [&Superblock; COPIES]) -> Vec<u8> {
        let mut file = vec![0u8; FILE_SIZE_BYTES];
        for (i, sb) in states.iter().enumerate() {
            sb.encode(
                i as u16,
                &mut file[i * COPY_SIZE_BYTES..(i + 1) * COPY_SIZE_BYTES],
            );
        }
        file
    }

    #[test]
    fn round_trip_and_shared_checksum() {
        let sb = sample();
        let mut a = vec![0u8; COPY_SIZE_BYTES];
        let mut b = vec![0u8; COPY_SIZE_BYTES];
        let sa = sb.encode(0, &mut a);
        let sbs = sb.encode(3, &mut b);
        assert_eq!(sa, sbs);
        assert_eq!(sa, sb.checksum());
        let (decoded, sum, index) = Superblock::decode(&b).unwrap();
        assert_eq!(decoded, sb);
        assert_eq!((sum, index), (sa, 3));
    }

    /// Guards against: the wiped flag lost on its way through a copy (a
    /// wiped replica rebooting as intact), and a copy with a VSR flag this
    /// version does not know read as if it had none.
    #[test]
    fn vsr_wiped_flag_round_trips_and_unknown_flags_are_refused() {
        let mut sb = sample();
        sb.vsr.wiped = true;
        let mut copy = vec![0u8; COPY_SIZE_BYTES];
        sb.encode(0, &mut copy);
        assert_eq!(copy[61], VSR_FLAG_WIPED);
        assert!(Superblock::decode(&copy).unwrap().0.vsr.wiped);
        sb.vsr.view_lost = true;
        sb.encode(0, &mut copy);
        assert_eq!(copy[61], VSR_FLAG_WIPED | VSR_FLAG_VIEW_LOST);
        let vsr = Superblock::decode(&copy).unwrap().0.vsr;
        assert!(vsr.wiped && vsr.view_lost);
        sample().encode(0, &mut copy);
        assert!(!Superblock::decode(&copy).unwrap().0.vsr.wiped);
        // view_lost without wiped, then a flag bit this version does not
        // know, each with a valid checksum.
        for flags in [VSR_FLAG_VIEW_LOST, 4] {
            copy[61] = flags;
            let mut zeroed = copy.clone();
            zeroed[16..24].fill(0);
            let sum = checksum(&zeroed);
            copy[16..24].copy_from_slice(&sum.to_le_bytes());
            assert_eq!(
                Superblock::decode(&copy).unwrap_err(),
                CopyError::NonZeroReserved,
                "flags {flags}"
            );
        }
    }

    #[test]
    fn every_bit_flip_in_the_used_part_is_rejected() {
        let mut copy = vec![0u8; COPY_SIZE_BYTES];
        sample().encode(0, &mut copy);
        let used = FIXED_LEN;
        for i in (0..used).chain([used + 1, COPY_SIZE_BYTES - 1]) {
            let mut bad = copy.clone();
            bad[i] ^= 0x10;
            if (10..12).contains(&i) {
                // The copy index is outside the checksum by design; a flip
                // there gives an out-of-range index or a misplaced copy.
                if let Ok((_, _, index)) = Superblock::decode(&bad) {
                    assert_ne!(index, 0);
                }
                continue;
            }
            assert!(Superblock::decode(&bad).is_err(), "flip at {i} accepted");
        }
    }

    #[test]
    fn one_corrupt_copy_is_repaired() {
        let sb = sample();
        let mut file = file_of([&sb, &sb, &sb, &sb]);
        file[2 * COPY_SIZE_BYTES + 100] ^= 1;
        let chosen = choose(&file, Path::new("sb")).unwrap();
        assert_eq!(chosen.superblock, sb);
        assert_eq!(chosen.copies_to_repair, vec![2]);
    }

    #[test]
    fn torn_latest_copy_falls_back_to_previous_sequence() {
        let old = sample();
        let new = Superblock {
            frontier: Frontier {
                next_offset: 900,
                ..old.frontier
            },
            ..old.successor()
        };
        // Copy 0 of the new state was being written when power failed.
        let mut file = file_of([&new, &old, &old, &old]);
        file[COPY_SIZE_BYTES - 600..COPY_SIZE_BYTES].fill(0xAA);
        let chosen = choose(&file, Path::new("sb")).unwrap();
        assert_eq!(chosen.superblock, old);
        assert_eq!(chosen.copies_to_repair, vec![0]);
        // Had copy 0 landed whole, the new state chains to the old and wins.
        let file = file_of([&new, &old, &old, &old]);
        let chosen = choose(&file, Path::new("sb")).unwrap();
        assert_eq!(chosen.superblock, new);
        assert_eq!(chosen.copies_to_repair, vec![1, 2, 3]);
    }

    #[test]
    fn all_copies_corrupt_is_a_clear_error() {
        let sb = sample();
        let mut file = file_of([&sb, &sb, &sb, &sb]);
        for i in 0..COPIES {
            file[i * COPY_SIZE_BYTES + 30] ^= 0xFF;
        }
        let err = choose(&file, Path::new("/data/p0/superblock")).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("/data/p0/superblock"), "{msg}");
        assert!(matches!(err, SuperblockError::NoValidCopy { .. }));
    }

    #[test]
    fn a_fork_is_refused() {
        let old = sample();
        let mut stranger = old.successor();
        stranger.parent = 12345;
        let file = file_of([&stranger, &old, &old, &old]);
        assert!(matches!(
            choose(&file, Path::new("sb")),
            Err(SuperblockError::Forked { .. })
        ));
    }

    #[test]
    fn other_versions_are_refused() {
        // Version 1 listed the segments inside the copy, version 2 had no
        // active capacity, version 3 no cut fields, version 4 no nonce,
        // version 5 no VSR flags; reading any of them as version 6 would
        // lose state.
        let mut copy = vec![0u8; COPY_SIZE_BYTES];
        sample().encode(0, &mut copy);
        for version in [1u16, 2, 3, 4, 5, VERSION + 1] {
            let mut bad = copy.clone();
            bad[8..10].copy_from_slice(&version.to_le_bytes());
            assert_eq!(
                Superblock::decode(&bad).unwrap_err(),
                CopyError::UnsupportedVersion(version)
            );
        }
    }

    #[test]
    fn two_copies_of_one_sequence_with_different_contents_are_refused() {
        let old = sample();
        let new = old.successor();
        let mut other = new.clone();
        other.vsr.commit += 1;
        let file = file_of([&new, &other, &old, &old]);
        let err = choose(&file, Path::new("/d/superblock")).unwrap_err();
        assert_eq!(
            err,
            SuperblockError::SameSequenceFork {
                path: "/d/superblock".into(),
                sequence: new.sequence,
                copies: [0, 1],
            }
        );
        let msg = err.to_string();
        assert!(
            msg.contains("/d/superblock") && msg.contains("fail-stop"),
            "{msg}"
        );
        // The same state in both copies of a half is the normal case.
        assert_eq!(
            choose(&file_of([&new, &new, &old, &old]), Path::new("sb"))
                .unwrap()
                .superblock,
            new
        );
    }
}
