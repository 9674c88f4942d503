//! The shard's read cache: batches recently made durable, kept in memory so
//! a consumer near the end of a partition is served without touching the
//! device (cold reads stay O_DIRECT, see `read.rs`).
//!
//! A completed flush hands its newly durable batches over: a large flush
//! its whole write buffer (kept as it is, no copy; it goes back to its pool
//! when evicted, so the next flush's buffer is a pre-touched one), a small
//! one a copy (small flushes coalesce; see [`WRITTEN_SHARE_MIN`]). Entries are
//! keyed by a store instance (a key no other store in the pool ever uses,
//! so a reopened partition never sees its predecessor's bytes) and a base
//! offset; a store's small flushes coalesce into one entry up to
//! [`ENTRY_BYTES_MAX`]. The whole cache is bounded by `bytes_max`, counting
//! allocated capacity, not just data; eviction takes the oldest entry
//! first. The store invalidates what a tail cut, a generation switch
//! (purge, install) or retention changes or removes, so only bytes equal to
//! the durable log at their offsets are ever held.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;

use ringlog_protocol::BatchHeader;

use crate::io::AlignedBuf;

/// A store's small flushes are appended to its newest entry until it holds
/// this much (or a quarter of the bound, if less); a flush at least this
/// large is an entry of its own.
pub(super) const ENTRY_BYTES_MAX: usize = 1 << 20;
/// Bookkeeping counted per entry beside its buffers (map nodes, header).
const ENTRY_OVERHEAD_BYTES: usize = 128;
/// A flush's write buffer is kept as the entry when its new batches fill at
/// least this share of it (1/n): the bound counts the buffer's whole
/// capacity, so a sparsely filled one would waste the cache. Below that
/// the batches are copied out (and coalesce with the store's last entry).
pub(super) const WRITTEN_SHARE_MIN: usize = 4;

/// Counters of one pool's cache (monotonic except the two sizes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadCacheStats {
    /// Reads answered from memory.
    pub hits: u64,
    /// Reads that went to the device.
    pub misses: u64,
    /// Bytes the hits returned.
    pub served_bytes: u64,
    /// Memory held now (capacity plus bookkeeping), at most `bytes_max`.
    pub held_bytes: u64,
    /// The bound.
    pub bytes_max: u64,
    /// Entries dropped to stay within the bound.
    pub evictions: u64,
}

/// One batch of an entry: where it ends, in offsets and in the entry's bytes.
#[derive(Clone, Copy, Debug)]
struct BatchEnd {
    next_offset: u64,
    end: u32,
}

/// An entry's batch bytes: copied, or a flush's write buffer kept whole.
enum Held {
    Copied(Vec<u8>),
    /// `buf[range]` are the batches (the rest: the block before, padding).
    Written {
        buf: AlignedBuf,
        range: Range<usize>,
    },
}

impl Held {
    fn bytes(&self) -> &[u8] {
        match self {
            Held::Copied(v) => v,
            Held::Written { buf, range } => &buf[range.clone()],
        }
    }

    fn capacity(&self) -> usize {
        match self {
            Held::Copied(v) => v.capacity(),
            Held::Written { buf, .. } => buf.capacity(),
        }
    }

    fn truncate(&mut self, len: usize) {
        match self {
            Held::Copied(v) => {
                v.truncate(len);
                v.shrink_to_fit();
            }
            Held::Written { range, .. } => range.end = range.end.min(range.start + len),
        }
    }
}

struct Entry {
    key: u64,
    base_offset: u64,
    bytes: Held,
    /// Back to back from `base_offset`, ascending.
    batches: Vec<BatchEnd>,
}

impl Entry {
    fn next_offset(&self) -> u64 {
        self.batches
            .last()
            .map_or(self.base_offset, |b| b.next_offset)
    }

    fn cost_bytes(&self) -> usize {
        self.bytes.capacity()
            + self.batches.capacity() * std::mem::size_of::<BatchEnd>()
            + ENTRY_OVERHEAD_BYTES
    }

    /// Batch `i`'s base offset and bytes.
    fn batch(&self, i: usize) -> (u64, &[u8]) {
        let (base, start) = match i.checked_sub(1) {
            Some(p) => (self.batches[p].next_offset, self.batches[p].end as usize),
            None => (self.base_offset, 0),
        };
        (
            base,
            &self.bytes.bytes()[start..self.batches[i].end as usize],
        )
    }

    /// Appends whole batches starting at offset `base` (the entry's end) to
    /// a copied entry. Returns false, changing nothing, if the bytes are
    /// not whole batches or the entry is a kept write buffer.
    fn extend(&mut self, base: u64, bytes: &[u8]) -> bool {
        debug_assert_eq!(base, self.next_offset());
        let Held::Copied(held) = &mut self.bytes else {
            return false;
        };
        let Some(ends) = batch_ends(base, bytes, held.len()) else {
            return false;
        };
        held.extend_from_slice(bytes);
        self.batches.extend(ends);
        true
    }

    /// Keeps only the batches below `offset` (a batch boundary).
    fn cut(&mut self, offset: u64) {
        let keep = self.batches.partition_point(|b| b.next_offset <= offset);
        self.batches.truncate(keep);
        let len = self.batches.last().map_or(0, |b| b.end as usize);
        self.bytes.truncate(len);
        self.batches.shrink_to_fit();
    }
}

/// The ends of the batches in `bytes` (whole batches from offset `base`),
/// positions counted from `at`; None if they do not parse as whole batches.
fn batch_ends(mut base: u64, bytes: &[u8], at: usize) -> Option<Vec<BatchEnd>> {
    let mut ends = Vec::new();
    let mut position = 0usize;
    while position < bytes.len() {
        let h = BatchHeader::decode(&bytes[position..]).ok()?;
        if h.base_offset != base || position + h.total_len() > bytes.len() {
            return None;
        }
        position += h.total_len();
        base = h.next_offset();
        ends.push(BatchEnd {
            next_offset: base,
            end: u32::try_from(at + position).ok()?,
        });
    }
    Some(ends)
}

/// What a read asks of the cache (the store's read, as on disk).
pub(super) struct CacheRead {
    pub(super) key: u64,
    pub(super) from_offset: u64,
    /// The end of the segment holding `from_offset` (a disk read stops
    /// there, so a cached one does too).
    pub(super) end_offset: u64,
    pub(super) max_bytes: usize,
}

pub(super) struct ReadCache {
    bytes_max: usize,
    held_bytes: usize,
    /// Entries by insertion sequence: the first is the oldest.
    entries: BTreeMap<u64, Entry>,
    /// Per store key: base offset -> sequence.
    by_key: HashMap<u64, BTreeMap<u64, u64>>,
    next_sequence: u64,
    stats: ReadCacheStats,
}

impl ReadCache {
    pub(super) fn new(bytes_max: usize) -> Self {
        Self {
            bytes_max,
            held_bytes: 0,
            entries: BTreeMap::new(),
            by_key: HashMap::new(),
            next_sequence: 0,
            stats: ReadCacheStats::default(),
        }
    }

    pub(super) fn enabled(&self) -> bool {
        self.bytes_max > 0
    }

    pub(super) fn stats(&self) -> ReadCacheStats {
        ReadCacheStats {
            held_bytes: self.held_bytes as u64,
            bytes_max: self.bytes_max as u64,
            ..self.stats
        }
    }

    /// Takes whole durable batches `bytes` of store `key`, starting at
    /// offset `base`. Bytes that do not continue the store's newest entry
    /// start a new one; an entry larger than the whole bound is not kept.
    pub(super) fn insert(&mut self, key: u64, base: u64, bytes: &[u8]) {
        if !self.enabled() || bytes.is_empty() {
            return;
        }
        if self.extend_newest(key, base, bytes) {
            self.evict_to_bound();
            return;
        }
        self.insert_held(key, base, Held::Copied(bytes.to_vec()));
    }

    /// Takes the whole durable batches `buf[range]` of store `key`, from
    /// offset `base`, keeping `buf` (a completed flush's write buffer) as
    /// the entry: no copy. Whether that is worth its capacity is the
    /// caller's call ([`WRITTEN_SHARE_MIN`]). Dropped (home to its pool)
    /// if it is over the whole bound, and when evicted.
    pub(super) fn insert_written(
        &mut self,
        key: u64,
        base: u64,
        buf: AlignedBuf,
        range: Range<usize>,
    ) {
        debug_assert!(range.start <= range.end && range.end <= buf.len());
        if !self.enabled() || range.is_empty() {
            return;
        }
        self.insert_held(key, base, Held::Written { buf, range });
    }

    fn insert_held(&mut self, key: u64, base: u64, bytes: Held) {
        let Some(batches) = batch_ends(base, bytes.bytes(), 0) else {
            debug_assert!(
                false,
                "durable bytes at offset {base} are not whole batches"
            );
            return;
        };
        let entry = Entry {
            key,
            base_offset: base,
            bytes,
            batches,
        };
        let cost = entry.cost_bytes();
        if cost > self.bytes_max {
            // Too large to keep: reads of it miss (the gap it leaves stops
            // a cached read from running past it).
            return;
        }
        let sequence = self.next_sequence;
        self.next_sequence += 1;
        self.by_key.entry(key).or_default().insert(base, sequence);
        self.entries.insert(sequence, entry);
        self.held_bytes += cost;
        self.evict_to_bound();
    }

    /// Appends to the store's newest entry if `bytes` continue it and fit.
    fn extend_newest(&mut self, key: u64, base: u64, bytes: &[u8]) -> bool {
        let Some(&sequence) = self.by_key.get(&key).and_then(|m| m.values().next_back()) else {
            return false;
        };
        let Some(entry) = self.entries.get_mut(&sequence) else {
            return false;
        };
        // A quarter of a small bound: eviction stays fine-grained.
        let entry_bytes_max = ENTRY_BYTES_MAX.min(self.bytes_max / 4);
        let len = entry.bytes.bytes().len();
        if entry.next_offset() != base || len + bytes.len() > entry_bytes_max {
            return false;
        }
        let before = entry.cost_bytes();
        if !entry.extend(base, bytes) {
            return false;
        }
        self.held_bytes = self.held_bytes - before + entry.cost_bytes();
        true
    }

    fn evict_to_bound(&mut self) {
        while self.held_bytes > self.bytes_max {
            let Some((_, entry)) = self.entries.pop_first() else {
                break;
            };
            self.unlink(&entry);
            self.stats.evictions += 1;
        }
        assert!(
            self.held_bytes <= self.bytes_max,
            "read cache over its bound"
        );
    }

    /// Forgets a removed entry's index and memory.
    fn unlink(&mut self, entry: &Entry) {
        self.held_bytes -= entry.cost_bytes();
        if let Some(m) = self.by_key.get_mut(&entry.key) {
            m.remove(&entry.base_offset);
            if m.is_empty() {
                self.by_key.remove(&entry.key);
            }
        }
    }

    /// Removes store `key`'s entries whose sequences `pick` chooses from
    /// its index (base offset -> sequence).
    fn remove_where(&mut self, key: u64, pick: impl Fn(u64, &Entry) -> bool) {
        let Some(m) = self.by_key.get(&key) else {
            return;
        };
        let doomed: Vec<u64> = m
            .values()
            .copied()
            .filter(|s| self.entries.get(s).is_some_and(|e| pick(e.base_offset, e)))
            .collect();
        for s in doomed {
            if let Some(entry) = self.entries.remove(&s) {
                self.unlink(&entry);
            }
        }
    }

    /// A tail cut: drops store `key`'s batches at and above `offset`.
    pub(super) fn cut(&mut self, key: u64, offset: u64) {
        self.remove_where(key, |base, _| base >= offset);
        let straddling = self
            .by_key
            .get(&key)
            .and_then(|m| m.range(..offset).next_back())
            .map(|(_, &s)| s);
        if let Some(entry) = straddling.and_then(|s| self.entries.get_mut(&s)) {
            if entry.next_offset() > offset {
                let before = entry.cost_bytes();
                entry.cut(offset);
                self.held_bytes = self.held_bytes - before + entry.cost_bytes();
            }
        }
    }

    /// Retention: drops store `key`'s entries wholly below `offset`.
    pub(super) fn drop_below(&mut self, key: u64, offset: u64) {
        self.remove_where(key, |_, e| e.next_offset() <= offset);
    }

    /// A generation switch or a closed store: drops all of `key`'s entries.
    pub(super) fn forget(&mut self, key: u64) {
        self.remove_where(key, |_, _| true);
    }

    /// The answer a disk read of `r` gives (whole batches from the one
    /// holding `from_offset`, at least one, then while they fit
    /// `max_bytes`, stopping at `end_offset`), written to the empty `out`
    /// (the caller's reused buffer) and its next offset, if every batch of
    /// it is held; None (a miss, `out` left empty) otherwise.
    pub(super) fn read(&mut self, r: &CacheRead, out: &mut Vec<u8>) -> Option<u64> {
        debug_assert!(r.from_offset < r.end_offset);
        debug_assert!(out.is_empty());
        let found = self.lookup(r, out);
        match found {
            Some(_) => {
                self.stats.hits += 1;
                self.stats.served_bytes += out.len() as u64;
            }
            None => {
                out.clear();
                self.stats.misses += 1;
            }
        }
        found
    }

    fn lookup(&self, r: &CacheRead, out: &mut Vec<u8>) -> Option<u64> {
        let index = self.by_key.get(&r.key)?;
        let mut next = r.from_offset;
        while next < r.end_offset {
            let (_, &sequence) = index.range(..=next).next_back()?;
            let entry = self.entries.get(&sequence)?;
            let mut i = entry.batches.partition_point(|b| b.next_offset <= next);
            if i == entry.batches.len() {
                return None;
            }
            while i < entry.batches.len() && next < r.end_offset {
                let (base, bytes) = entry.batch(i);
                debug_assert!(out.is_empty() || base == next);
                if !out.is_empty() && out.len() + bytes.len() > r.max_bytes {
                    return Some(next);
                }
                out.extend_from_slice(bytes);
                next = entry.batches[i].next_offset;
                i += 1;
            }
        }
        Some(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringlog_protocol::{BatchBuilder, Record, Stamp};

    /// Batches from `base`, `count` of them, each one record of `value_len`.
    fn batches(base: u64, count: u64, value_len: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for offset in base..base + count {
            let mut b = BatchBuilder::new(1);
            let value = vec![offset as u8; value_len];
            b.push(&Record {
                key: b"k",
                headers: &[],
                value: &value,
                timestamp_ms: 1,
            })
            .unwrap();
            let stamp = Stamp {
                base_offset: offset,
                vsr_op: offset + 1,
                vsr_view: 0,
                prev_checksum: 0,
            };
            out.extend_from_slice(&b.finish(&stamp).unwrap());
        }
        out
    }

    fn read(c: &mut ReadCache, key: u64, from: u64, end: u64) -> Option<(Vec<u8>, u64)> {
        read_max(c, key, from, end, 1 << 20)
    }

    fn read_max(
        c: &mut ReadCache,
        key: u64,
        from: u64,
        end: u64,
        max_bytes: usize,
    ) -> Option<(Vec<u8>, u64)> {
        let r = CacheRead {
            key,
            from_offset: from,
            end_offset: end,
            max_bytes,
        };
        let mut out = Vec::new();
        let next = c.read(&r, &mut out)?;
        Some((out, next))
    }

    #[test]
    fn the_cache_never_holds_more_than_its_bound_and_evicts_oldest_first() {
        let bytes_max = 256 * 1024;
        let mut c = ReadCache::new(bytes_max);
        let mut offset = 0;
        // Three stores, flushes of 40 KiB, many times the bound in all.
        for round in 0..200u64 {
            let b = batches(offset, 10, 4000);
            c.insert(round % 3, offset, &b);
            assert!(c.held_bytes <= bytes_max, "held {}", c.held_bytes);
            assert_eq!(c.stats().held_bytes as usize, c.held_bytes);
            offset += 10;
        }
        assert!(c.stats().evictions > 0);
        // The bound is nearly used, not left idle.
        assert!(c.held_bytes > bytes_max / 2, "held {}", c.held_bytes);
        // The newest flush is held, the oldest is gone.
        let last = offset - 10;
        assert!(read(&mut c, 199 % 3, last, offset).is_some());
        assert!(read(&mut c, 0, 0, 10).is_none());
        // Bookkeeping matches the entries.
        let sum: usize = c.entries.values().map(Entry::cost_bytes).sum();
        assert_eq!(sum, c.held_bytes);
    }

    #[test]
    fn an_entry_larger_than_the_bound_is_not_kept_and_reads_across_its_gap_miss() {
        let mut c = ReadCache::new(64 * 1024);
        c.insert(1, 0, &batches(0, 2, 1000));
        let held = c.held_bytes;
        c.insert(1, 2, &batches(2, 20, 4000));
        assert_eq!(c.held_bytes, held);
        c.insert(1, 22, &batches(22, 2, 1000));
        assert!(read(&mut c, 1, 0, 2).is_some());
        // A read from 0 to 24 would need the batches not kept.
        assert!(read(&mut c, 1, 0, 24).is_none());
        assert!(read(&mut c, 1, 2, 24).is_none());
        assert!(read(&mut c, 1, 22, 24).is_some());
    }

    #[test]
    fn a_read_spanning_entries_writes_them_back_to_back_into_the_callers_buffer() {
        // A 64 KiB bound: entries of at most 16 KiB, so these flushes of
        // about 11 KiB each make one entry apiece.
        let mut c = ReadCache::new(64 * 1024);
        for flush in 0..3 {
            c.insert(5, flush * 10, &batches(flush * 10, 10, 1000));
        }
        assert_eq!(c.entries.len(), 3);
        let r = CacheRead {
            key: 5,
            from_offset: 4,
            end_offset: 30,
            max_bytes: 1 << 20,
        };
        let mut out = Vec::with_capacity(64 * 1024);
        let at = out.as_ptr();
        assert_eq!(c.read(&r, &mut out), Some(30));
        assert_eq!(out, batches(4, 26, 1000));
        assert_eq!(out.as_ptr(), at, "the reply fits: no new buffer");
        // max_bytes stops it inside the second entry, at a batch boundary.
        let one = batches(0, 1, 1000).len();
        out.clear();
        let r = CacheRead {
            max_bytes: 8 * one,
            ..r
        };
        assert_eq!(c.read(&r, &mut out), Some(12));
        assert_eq!(out, batches(4, 8, 1000));
        // A miss (offsets past the held ones) leaves the buffer empty.
        out.clear();
        let r = CacheRead {
            from_offset: 25,
            end_offset: 40,
            ..r
        };
        assert_eq!(c.read(&r, &mut out), None);
        assert!(out.is_empty());
    }

    #[test]
    fn a_cut_keeps_the_batches_below_it_only() {
        let mut c = ReadCache::new(1 << 20);
        let b = batches(0, 10, 100);
        c.insert(1, 0, &b);
        c.cut(1, 4);
        let (got, next) = read(&mut c, 1, 0, 4).unwrap();
        assert_eq!(next, 4);
        assert_eq!(got, batches(0, 4, 100));
        assert!(read(&mut c, 1, 4, 10).is_none());
        let sum: usize = c.entries.values().map(Entry::cost_bytes).sum();
        assert_eq!(sum, c.held_bytes);
    }

    /// `bytes` in a pooled write buffer, after `lead` bytes of the block
    /// before them and with padding after, as a flush writes them.
    fn written(pool: &crate::io::SharedBufPool, lead: usize, bytes: &[u8]) -> AlignedBuf {
        let mut buf = pool.take();
        buf.extend_from_slice(&vec![0xee; lead]);
        buf.extend_from_slice(bytes);
        buf.extend_from_slice(&[0; 512]);
        buf
    }

    #[test]
    fn a_kept_write_buffer_is_served_counted_whole_and_goes_home_when_evicted() {
        let pool = crate::io::SharedBufPool::new(256 * 1024, 4, 4);
        let mut c = ReadCache::new(600 * 1024);
        let b = batches(0, 20, 4000);
        c.insert_written(1, 0, written(&pool, 100, &b), 100..100 + b.len());
        // The whole buffer counts against the bound, not only its batches.
        assert!(c.held_bytes >= 256 * 1024, "held {}", c.held_bytes);
        let sum: usize = c.entries.values().map(Entry::cost_bytes).sum();
        assert_eq!(sum, c.held_bytes);
        assert_eq!(read(&mut c, 1, 0, 20).unwrap(), (b.clone(), 20));
        // Small flushes behind it start an entry of their own.
        c.insert(1, 20, &batches(20, 2, 100));
        assert_eq!(c.entries.len(), 2);
        assert_eq!(
            read(&mut c, 1, 0, 22).unwrap().0.len(),
            b.len() + batches(20, 2, 100).len()
        );
        c.cut(1, 5);
        assert_eq!(read(&mut c, 1, 0, 5).unwrap(), (batches(0, 5, 4000), 5));
        assert!(read(&mut c, 1, 5, 6).is_none());
        assert_eq!(pool.idle(), 0);
        // Two more buffers pass the bound: the oldest goes home to its pool.
        let mut offset = 5;
        for _ in 0..2 {
            let b = batches(offset, 20, 4000);
            c.insert_written(1, offset, written(&pool, 0, &b), 0..b.len());
            offset += 20;
        }
        assert!(c.held_bytes <= 600 * 1024);
        assert!(c.stats().evictions >= 1);
        assert_eq!(pool.idle(), 1, "the evicted buffer went home");
        assert!(read(&mut c, 1, 0, 5).is_none());
        assert!(read(&mut c, 1, offset - 20, offset).is_some());
    }
}
