//! The segment table file: a generation's sealed segments, oldest first.
//!
//! `gen-<generation>/segments-<id:020>.tbl` holds fixed-size records,
//! record `i` at byte `i * RECORD_BYTES` (little-endian):
//! ```text
//!  0 base_offset  8 end_offset  16 length_bytes  24 checksum
//! 32 last_batch_checksum  40 max_timestamp_ms  48 index  56 chain
//! ```
//! `chain` is xxh3 over the previous record's chain and bytes `0..56`, so it
//! covers the record's content, its index and everything before it. The
//! superblock commits the live range, entries `[first, first + count)`, with
//! the chain value before it (`anchor`) and after it (`last`): open reads the
//! range, recomputes the chain and refuses any mismatch as corruption.
//!
//! A roll appends a record by rewriting the block that holds it: the bytes
//! before the new record are read back and written unchanged, so a torn write
//! cannot damage a committed record. The write and its fdatasync complete
//! before the superblock that counts the record is written. Retention moves
//! `first` (and `anchor`) only; once dead records fill a block and outnumber
//! the live ones, the live ones are compacted into a new file (the next id)
//! that the superblock then names, so the file stays within about twice the
//! live records plus a block. Purge and install start a generation with a
//! fresh table.

use std::path::{Path, PathBuf};

use ringlog_protocol::checksum;

use super::open::read_range;
use super::{submit_checked, write_new_file, PartitionStore, StoreError};
use crate::io::{align_down, AlignedBuf, FileId, IoBackend, Op, OpenMode, Sqe, BLOCK_SIZE};
use crate::superblock::{SealedSegment, TableRef};

const RECORD_BYTES: usize = 64;
/// Bytes of a record the chain covers (all but the chain itself).
const CHAINED_BYTES: usize = 56;
const RECORDS_PER_BLOCK: u64 = (BLOCK_SIZE / RECORD_BYTES) as u64;
/// Read size when loading a table at open: memory stays bounded whatever
/// the number of segments.
const READ_CHUNK_BYTES: usize = 256 * 1024;

/// Where the table with this id lives in a generation directory.
pub(super) fn path(generation_dir: &Path, id: u64) -> PathBuf {
    generation_dir.join(format!("segments-{id:020}.tbl"))
}

/// Encodes record `index` into `out` (`RECORD_BYTES` long); returns its chain.
fn encode(meta: &SealedSegment, index: u64, prev_chain: u64, out: &mut [u8]) -> u64 {
    debug_assert_eq!(out.len(), RECORD_BYTES);
    let fields = [
        meta.base_offset,
        meta.end_offset,
        meta.length_bytes,
        meta.checksum,
        meta.last_batch_checksum,
        meta.max_timestamp_ms,
        index,
    ];
    for (slot, v) in out.chunks_exact_mut(8).zip(fields) {
        slot.copy_from_slice(&v.to_le_bytes());
    }
    let chain = chain_over(prev_chain, &out[..CHAINED_BYTES]);
    out[CHAINED_BYTES..].copy_from_slice(&chain.to_le_bytes());
    chain
}

fn chain_over(prev_chain: u64, bytes: &[u8]) -> u64 {
    let mut input = [0u8; 8 + CHAINED_BYTES];
    input[..8].copy_from_slice(&prev_chain.to_le_bytes());
    input[8..].copy_from_slice(bytes);
    checksum(&input)
}

/// The chain value after `record`, if it is entry `index` and chains from
/// `prev_chain` (its stored chain matches).
fn verified_chain(record: &[u8], index: u64, prev_chain: u64) -> Option<u64> {
    let expected = chain_over(prev_chain, &record[..CHAINED_BYTES]);
    (field(record, 6) == index && field(record, 7) == expected).then_some(expected)
}

fn chain_next(prev_chain: u64, index: u64, meta: &SealedSegment) -> u64 {
    encode(meta, index, prev_chain, &mut [0u8; RECORD_BYTES])
}

fn field(record: &[u8], i: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&record[i * 8..i * 8 + 8]);
    u64::from_le_bytes(v)
}

/// The table once `dropped` (its oldest live entries) are no longer live.
pub(super) fn advanced(t: &TableRef, dropped: &[SealedSegment]) -> TableRef {
    let n = dropped.len() as u64;
    assert!(n <= t.count, "dropping more entries than are live");
    let anchor = dropped
        .iter()
        .zip(t.first..)
        .fold(t.anchor, |chain, (meta, index)| {
            chain_next(chain, index, meta)
        });
    TableRef {
        first: t.first + n,
        count: t.count - n,
        anchor,
        last: if n == t.count { anchor } else { t.last },
        ..*t
    }
}

/// Whether the dead records should be compacted away.
pub(super) fn wants_compaction(t: &TableRef) -> bool {
    t.first >= t.count.max(RECORDS_PER_BLOCK)
}

/// Creates table `id` in `dir` holding `entries` from index 0, durable once
/// this returns (its name is durable after the caller fsyncs `dir`).
pub(super) fn write_fresh(
    io: &mut impl IoBackend,
    pid: u32,
    dir: &Path,
    id: u64,
    entries: &[SealedSegment],
) -> Result<TableRef, StoreError> {
    let path = path(dir, id);
    let (bytes, table) = fresh(id, entries);
    if bytes.is_empty() {
        // Nothing to write: the file only has to exist for the next roll.
        let file = io
            .open_file(&path, OpenMode::Create)
            .map_err(|e| StoreError::io(pid, "create", &path, e))?;
        io.close(file);
    } else {
        write_new_file(io, pid, &path, &bytes)?;
    }
    Ok(table)
}

/// The bytes of a new table `id` holding `entries` (none for no entries)
/// and the reference that names it.
pub(super) fn fresh(id: u64, entries: &[SealedSegment]) -> (Vec<u8>, TableRef) {
    let mut bytes = vec![0u8; entries.len() * RECORD_BYTES];
    let mut chain = 0;
    for ((meta, out), index) in entries
        .iter()
        .zip(bytes.chunks_exact_mut(RECORD_BYTES))
        .zip(0..)
    {
        chain = encode(meta, index, chain, out);
    }
    let table = TableRef {
        id,
        first: 0,
        count: entries.len() as u64,
        anchor: 0,
        last: chain,
    };
    (bytes, table)
}

/// Reads and verifies the live entries `t` names in `generation_dir`.
pub(super) fn load(
    io: &mut impl IoBackend,
    pid: u32,
    generation_dir: &Path,
    t: &TableRef,
) -> Result<Vec<SealedSegment>, StoreError> {
    let path = path(generation_dir, t.id);
    let file = io
        .open_file(&path, OpenMode::Existing)
        .map_err(|e| StoreError::io(pid, "open segment table", &path, e))?;
    let loaded = load_from(io, pid, &path, file, t);
    io.close(file);
    loaded
}

fn load_from(
    io: &mut impl IoBackend,
    pid: u32,
    path: &Path,
    file: FileId,
    t: &TableRef,
) -> Result<Vec<SealedSegment>, StoreError> {
    let corrupt = |position: u64, detail: String| StoreError::Corruption {
        partition_id: pid,
        segment: path.into(),
        position,
        detail,
    };
    let size = io
        .file_size(file)
        .map_err(|e| StoreError::io(pid, "stat", path, e))?;
    let record = RECORD_BYTES as u64;
    let start = t.first.checked_mul(record);
    let end = t
        .first
        .checked_add(t.count)
        .and_then(|n| n.checked_mul(record));
    // Bounds from the superblock are checked against the file before
    // anything is allocated for them.
    let (Some(start), Some(end)) = (start, end) else {
        return Err(corrupt(0, format!("superblock names entries {t:?}")));
    };
    if end > size {
        return Err(corrupt(
            size,
            format!("table is {size} bytes; the superblock names entries up to byte {end}"),
        ));
    }
    let mut entries = Vec::with_capacity(t.count as usize);
    let mut chain = t.anchor;
    let mut index = t.first;
    let mut at = align_down(start);
    while at < end {
        let want = (end - at).min(READ_CHUNK_BYTES as u64) as usize;
        let buf =
            read_range(io, file, at, want).map_err(|e| StoreError::io(pid, "read", path, e))?;
        if buf.len() < want {
            let position = at + buf.len() as u64;
            return Err(corrupt(position, "segment table read short".into()));
        }
        let skip = (start.max(at) - at) as usize;
        for r in buf[skip..want].chunks_exact(RECORD_BYTES) {
            let position = index * record;
            let Some(expected) = verified_chain(r, index, chain) else {
                return Err(corrupt(
                    position,
                    format!("segment table entry {index} fails its checksum"),
                ));
            };
            entries.push(SealedSegment {
                base_offset: field(r, 0),
                end_offset: field(r, 1),
                length_bytes: field(r, 2),
                checksum: field(r, 3),
                last_batch_checksum: field(r, 4),
                max_timestamp_ms: field(r, 5),
            });
            chain = expected;
            index += 1;
        }
        at += want as u64;
    }
    if chain != t.last || entries.len() as u64 != t.count {
        return Err(corrupt(
            end,
            "segment table does not match the superblock".into(),
        ));
    }
    Ok(entries)
}

impl PartitionStore {
    /// Appends `meta` to the live table and makes it durable (not yet
    /// committed: the caller's superblock names the returned range). Any
    /// failure fences: the table file may be half-written.
    pub(super) fn append_table_entry(
        &mut self,
        io: &mut impl IoBackend,
        meta: &SealedSegment,
    ) -> Result<TableRef, StoreError> {
        let result = append_entry(
            io,
            self.partition_id,
            &path(&self.generation_dir, self.sb.table.id),
            &self.sb.table,
            meta,
        );
        match result {
            // The entry goes past the committed range: a write that found
            // no space changed no state, so the roll is refused, not fenced.
            Err(StoreError::Io { source, path, .. }) if super::is_enospc(&source) => {
                Err(StoreError::DiskFull {
                    partition_id: self.partition_id,
                    path,
                })
            }
            other => self.fence_on_err(other),
        }
    }

    /// Writes the live entries into a new table file (the next id), durable
    /// with its name, for the caller's superblock to name.
    pub(super) fn compact_table(
        &mut self,
        io: &mut impl IoBackend,
        live: &[SealedSegment],
    ) -> Result<TableRef, StoreError> {
        let id = self.sb.table.id + 1;
        let written = write_fresh(io, self.partition_id, &self.generation_dir, id, live);
        let table = self.fence_on_err(written)?;
        let generation_dir = self.generation_dir.clone();
        self.sync_dirs(io, &[&generation_dir])?;
        Ok(table)
    }
}

fn append_entry(
    io: &mut impl IoBackend,
    pid: u32,
    path: &Path,
    t: &TableRef,
    meta: &SealedSegment,
) -> Result<TableRef, StoreError> {
    let index = t.first + t.count;
    let position = index * RECORD_BYTES as u64;
    let block_at = align_down(position);
    let file = io
        .open_file(path, OpenMode::Existing)
        .map_err(|e| StoreError::io(pid, "open segment table", path, e))?;
    let result = read_live_block(io, (pid, path, file), t, block_at).and_then(|mut buf| {
        // Records past the new one belong to no committed state.
        let from = (position - block_at) as usize;
        buf.set_len(BLOCK_SIZE);
        buf.full_mut()[from..].fill(0);
        let chain = encode(meta, index, t.last, &mut buf[from..from + RECORD_BYTES]);
        let sqes = vec![
            Sqe::linked(Op::Write {
                file,
                offset: block_at,
                buf,
            }),
            Sqe::new(Op::Fdatasync { file }),
        ];
        submit_checked(io, sqes)
            .map_err(|(kind, e)| StoreError::io(pid, kind, path, e))
            .map(|_| TableRef {
                count: t.count + 1,
                last: chain,
                ..*t
            })
    });
    io.close(file);
    result
}

/// Reads of the table's last block tried before the device is taken for
/// unstable.
const BLOCK_READS_MAX: usize = 3;

/// Reads the block at `block_at` (where the next entry goes) and verifies
/// the live entries in it against `t` before the caller writes them back: a
/// flipped bit in that read would otherwise become durable damage. The
/// first live entry in the block chains from `t.anchor` or from the entry
/// before it, which may sit in the block before (then read too: at most two
/// blocks). A read that does not verify is retried, then is an I/O error.
fn read_live_block(
    io: &mut impl IoBackend,
    (pid, path, file): (u32, &Path, FileId),
    t: &TableRef,
    block_at: u64,
) -> Result<AlignedBuf, StoreError> {
    let record = RECORD_BYTES as u64;
    let end = (t.first + t.count) * record;
    debug_assert!(block_at <= end && end < block_at + BLOCK_SIZE as u64);
    let live_from = (t.first * record).max(block_at);
    // The stored chain of the entry before `live_from`, unless that is the anchor.
    let from = if live_from > t.first * record && live_from == block_at {
        block_at - BLOCK_SIZE as u64
    } else {
        block_at
    };
    for _ in 0..BLOCK_READS_MAX {
        let mut buf = read_range(io, file, from, (block_at - from) as usize + BLOCK_SIZE)
            .map_err(|e| StoreError::io(pid, "read", path, e))?;
        let at = |position: u64| (position - from) as usize;
        let mut chain = if live_from == t.first * record {
            t.anchor
        } else {
            field(&buf[at(live_from - record)..at(live_from)], 7)
        };
        let mut whole = buf.len() >= at(end);
        let mut position = live_from;
        while whole && position < end {
            let r = &buf[at(position)..at(position + record)];
            match verified_chain(r, position / record, chain) {
                Some(next) => chain = next,
                None => whole = false,
            }
            position += record;
        }
        if whole && chain == t.last {
            if from < block_at {
                // Keep only the block the caller rewrites (short at the
                // file's end: the caller zeroes past the live entries).
                let shift = (block_at - from) as usize;
                let kept = buf.len().saturating_sub(shift).min(BLOCK_SIZE);
                buf.copy_within(shift..shift + kept, 0);
                buf.set_len(kept);
            }
            return Ok(buf);
        }
    }
    Err(StoreError::io(
        pid,
        "read",
        path,
        std::io::Error::other(format!(
            "the segment table's entries below byte {end} failed verification in {BLOCK_READS_MAX} reads: unstable device, nothing written"
        )),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(i: u64) -> SealedSegment {
        SealedSegment {
            base_offset: i * 10,
            end_offset: i * 10 + 10,
            length_bytes: 4096 + i,
            checksum: i ^ 0x55,
            last_batch_checksum: i + 7,
            max_timestamp_ms: 1_000 + i,
        }
    }

    #[test]
    fn advancing_keeps_the_chain_of_the_remaining_entries() {
        let metas: Vec<SealedSegment> = (0..5).map(meta).collect();
        let mut t = TableRef::default();
        for (i, m) in metas.iter().enumerate() {
            t.count += 1;
            t.last = chain_next(t.last, i as u64, m);
        }
        let a = advanced(&t, &metas[..2]);
        assert_eq!((a.first, a.count, a.last), (2, 3, t.last));
        let recomputed = metas[2..]
            .iter()
            .zip(2..)
            .fold(a.anchor, |c, (m, i)| chain_next(c, i, m));
        assert_eq!(recomputed, t.last);
        let all = advanced(&t, &metas);
        assert_eq!((all.count, all.anchor), (0, all.last));
    }

    #[test]
    fn compaction_waits_for_a_block_of_dead_records_outnumbering_live_ones() {
        let t = |first, count| TableRef {
            first,
            count,
            ..TableRef::default()
        };
        assert!(!wants_compaction(&t(10, 0)));
        assert!(!wants_compaction(&t(
            RECORDS_PER_BLOCK,
            RECORDS_PER_BLOCK + 1
        )));
        assert!(wants_compaction(&t(RECORDS_PER_BLOCK, 3)));
        assert!(wants_compaction(&t(500, 500)));
    }
}
