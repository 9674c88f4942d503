//! The replica's in-memory view of the tail of its log: headers of the last
//! ops (bounded by `journal_ops_max` once committed) and the bytes of the
//! uncommitted ones. The segments on disk are the real journal; this is what
//! the protocol needs at hand (chain links, suffixes, resends).

use std::collections::VecDeque;

use ringlog_protocol::batch::BatchHeader;

use super::types::BatchBytes;

/// The op just below the journal's entries: what the next op chains to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Anchor {
    /// 0 for an empty log (op 0 is never prepared).
    pub op: u64,
    /// `header_checksum` of that op; 0 for an empty log.
    pub checksum: u64,
    pub next_offset: u64,
}

#[derive(Debug, Clone)]
pub(super) struct Entry {
    pub header: BatchHeader,
    /// Dropped once committed (repair then reads the segments).
    pub batch: Option<BatchBytes>,
    /// This op's fdatasync completed.
    pub durable: bool,
}

#[derive(Debug, Clone, Default)]
pub(super) struct Log {
    base: Anchor,
    /// Ops `base.op + 1 ..= op()`, consecutive and chained.
    entries: VecDeque<Entry>,
}

impl Log {
    pub fn new(base: Anchor) -> Self {
        Self {
            base,
            entries: VecDeque::new(),
        }
    }

    pub fn base(&self) -> Anchor {
        self.base
    }

    pub fn op(&self) -> u64 {
        self.base.op + self.entries.len() as u64
    }

    pub fn head(&self) -> Anchor {
        match self.entries.back() {
            Some(e) => Anchor {
                op: e.header.vsr_op,
                checksum: e.header.header_checksum,
                next_offset: e.header.next_offset(),
            },
            None => self.base,
        }
    }

    /// `op`'s header checksum and whether it is durable here: a journal
    /// entry, or the base (an installed frontier or an entry pruned only
    /// once durable, so always durable).
    pub fn held(&self, op: u64) -> Option<(u64, bool)> {
        if op == self.base.op && op > 0 {
            return Some((self.base.checksum, true));
        }
        self.get(op).map(|e| (e.header.header_checksum, e.durable))
    }

    pub fn get(&self, op: u64) -> Option<&Entry> {
        let index = op.checked_sub(self.base.op + 1)?;
        self.entries.get(usize::try_from(index).ok()?)
    }

    pub fn get_mut(&mut self, op: u64) -> Option<&mut Entry> {
        let index = op.checked_sub(self.base.op + 1)?;
        self.entries.get_mut(usize::try_from(index).ok()?)
    }

    /// Checksum of `op` if the log knows it (the anchor included).
    pub fn checksum_at(&self, op: u64) -> Option<u64> {
        if op == self.base.op {
            return Some(self.base.checksum);
        }
        self.get(op).map(|e| e.header.header_checksum)
    }

    /// Whether `h` is the next op of this log (op, offset and chain link).
    pub fn links(&self, h: &BatchHeader) -> bool {
        let head = self.head();
        h.vsr_op == head.op + 1
            && h.prev_checksum == head.checksum
            && h.base_offset == head.next_offset
    }

    /// Entries held (the journal's length).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn push(&mut self, entry: Entry) {
        assert!(self.links(&entry.header), "log push breaks the chain");
        self.entries.push_back(entry);
    }

    /// Cuts every op above `op`; returns whether anything was cut.
    pub fn truncate_above(&mut self, op: u64) -> bool {
        assert!(op >= self.base.op, "cut below the journal anchor");
        let keep = usize::try_from(op - self.base.op).unwrap_or(usize::MAX);
        let cut = self.entries.len() > keep;
        self.entries.truncate(keep);
        cut
    }

    /// Drops bytes of committed ops and headers beyond `keep_ops` entries.
    pub fn prune(&mut self, commit: u64, keep_ops: usize) {
        for e in self.entries.iter_mut() {
            if e.header.vsr_op > commit {
                break;
            }
            e.batch = None;
        }
        while self.entries.len() > keep_ops {
            match self.entries.front() {
                Some(e) if e.header.vsr_op <= commit && e.durable => {}
                _ => break,
            }
            if let Some(e) = self.entries.pop_front() {
                self.base = Anchor {
                    op: e.header.vsr_op,
                    checksum: e.header.header_checksum,
                    next_offset: e.header.next_offset(),
                };
            }
        }
    }

    pub fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.entries.iter()
    }

    pub fn headers(&self) -> Vec<BatchHeader> {
        self.entries.iter().map(|e| e.header).collect()
    }

    /// Consecutive ops, each chained to the previous (the anchor first).
    pub fn check_chain(&self) {
        let mut prev = self.base;
        for e in &self.entries {
            let h = &e.header;
            assert_eq!(h.vsr_op, prev.op + 1, "journal ops not consecutive");
            assert_eq!(
                h.prev_checksum, prev.checksum,
                "journal chain broken at op {}",
                h.vsr_op
            );
            assert_eq!(
                h.base_offset, prev.next_offset,
                "journal offsets not dense at op {}",
                h.vsr_op
            );
            prev = Anchor {
                op: h.vsr_op,
                checksum: h.header_checksum,
                next_offset: h.next_offset(),
            };
        }
    }
}
