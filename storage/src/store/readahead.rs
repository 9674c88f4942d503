//! Sequential read-ahead on the cold path: after a fetch read the device,
//! the store queues the read the next sequential fetch (starting where the
//! reply ended) would make, on the shard's ring without waiting, so the
//! device reads while the reply is sent (see `read.rs`).
//!
//! The data lands in a per-partition buffer, not the read cache: the cache
//! may be off (the cold path is exactly the case it does not cover), it
//! would copy the bytes once more, and a buffer is handed straight to the
//! next fetch's walker, which parses and verifies it as it would its own
//! read. Bounds: per partition, one read-ahead in flight or held, of one
//! fetch from the batch it starts with (`max_bytes`, at most
//! `read_bytes_max`, and the next batch's header, aligned); per pool (shard), `bytes_max` counting reads in
//! flight and buffers held, so memory stays bounded with any number of
//! consumers; plus at most [`IDLE_BUFFERS_MAX`] spare buffers kept for reuse.
//! Only bytes below the durable end at the time of the read are ever used
//! (a flush meanwhile rewrites the block holding it with the same bytes
//! below it), and a tail cut, a generation switch, retention or a closed store drops
//! the partition's read-ahead (a read in flight then completes as wasted).

use std::collections::HashMap;

use crate::io::{AlignedBuf, BatchId, Completion, FileId};

/// Spare read-ahead buffers kept pre-touched (a fresh 1 MiB buffer costs
/// 256 page faults); more are freed.
const IDLE_BUFFERS_MAX: usize = 2;

/// Counters of one pool's read-ahead (monotonic except the two sizes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadAheadStats {
    /// Reads queued ahead of a fetch.
    pub issued: u64,
    /// Fetches whose first read a read-ahead served.
    pub hits: u64,
    /// Read-aheads no fetch used (another offset came, or they were
    /// invalidated).
    pub wasted: u64,
    /// Read-aheads not issued because the pool's bound was reached.
    pub refused: u64,
    /// Read-aheads that failed (the fetch then reads the device itself).
    pub errors: u64,
    /// Memory in flight or held now, at most `bytes_max`.
    pub held_bytes: u64,
    /// The bound.
    pub bytes_max: u64,
}

/// Where a read-ahead's bytes belong: the store, the next fetch's offset,
/// and the segment file and durable limit the read was planned against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct ReadAheadAt {
    pub(super) key: u64,
    pub(super) from_offset: u64,
    pub(super) segment_base: u64,
    pub(super) file: FileId,
}

/// A planned read: file position of its first byte, of the batch the
/// fetch starts with, the durable limit (bytes past it are not used), and
/// its length.
#[derive(Clone, Copy, Debug)]
pub(super) struct ReadAheadPlan {
    pub(super) at: ReadAheadAt,
    pub(super) start: u64,
    pub(super) position: u64,
    pub(super) limit: u64,
    pub(super) len_bytes: usize,
}

/// A read-ahead's buffer handed to a fetch: `buf[0]` is file position
/// `start`, and it holds only bytes below the limit it was read against;
/// the fetch's first batch is at `position`.
pub(super) struct ReadAheadBuf {
    pub(super) buf: AlignedBuf,
    pub(super) start: u64,
    pub(super) position: u64,
}

struct Ticket {
    plan: ReadAheadPlan,
    sequence: u64,
}

enum Slot {
    InFlight {
        sequence: u64,
        from_offset: u64,
    },
    Ready {
        plan: ReadAheadPlan,
        buf: AlignedBuf,
    },
}

pub(super) struct ReadAheads {
    bytes_max: usize,
    held_bytes: usize,
    /// At most one per store key.
    slots: HashMap<u64, Slot>,
    /// Reads queued on the ring, by batch; at most one per slot, plus
    /// invalidated ones not reaped yet (their bytes stay counted).
    in_flight: HashMap<BatchId, Ticket>,
    idle: Vec<AlignedBuf>,
    next_sequence: u64,
    stats: ReadAheadStats,
}

impl ReadAheads {
    pub(super) fn new(bytes_max: usize) -> Self {
        Self {
            bytes_max,
            held_bytes: 0,
            slots: HashMap::new(),
            in_flight: HashMap::new(),
            idle: Vec::new(),
            next_sequence: 0,
            stats: ReadAheadStats::default(),
        }
    }

    pub(super) fn enabled(&self) -> bool {
        self.bytes_max > 0
    }

    pub(super) fn stats(&self) -> ReadAheadStats {
        ReadAheadStats {
            held_bytes: self.held_bytes as u64,
            bytes_max: self.bytes_max as u64,
            ..self.stats
        }
    }

    /// Reads queued and not reaped yet.
    pub(super) fn running(&self) -> usize {
        self.in_flight.len()
    }

    /// A buffer for `plan`, its bytes reserved, if the store has no read
    /// ahead in flight and the bound allows it (a held, unused one is
    /// dropped as wasted first). The caller queues the read and names its
    /// batch with [`ReadAheads::submitted`].
    pub(super) fn reserve(&mut self, plan: &ReadAheadPlan) -> Option<AlignedBuf> {
        debug_assert!(plan.len_bytes > 0);
        if !self.enabled() {
            return None;
        }
        match self.slots.get(&plan.at.key) {
            Some(Slot::InFlight { .. }) => return None,
            Some(Slot::Ready { .. }) => self.drop_slot(plan.at.key),
            None => {}
        }
        if self.held_bytes + plan.len_bytes > self.bytes_max {
            self.stats.refused += 1;
            return None;
        }
        self.held_bytes += plan.len_bytes;
        let sequence = self.next_sequence;
        self.next_sequence += 1;
        self.slots.insert(
            plan.at.key,
            Slot::InFlight {
                sequence,
                from_offset: plan.at.from_offset,
            },
        );
        self.stats.issued += 1;
        let at = self
            .idle
            .iter()
            .position(|b| b.capacity() >= plan.len_bytes);
        let buf = match at {
            Some(i) => self.idle.swap_remove(i),
            None => AlignedBuf::new(plan.len_bytes),
        };
        debug_assert!(self.held_bytes <= self.bytes_max);
        Some(buf)
    }

    /// The read for the last [`ReadAheads::reserve`] of `plan` was queued
    /// as `batch`.
    pub(super) fn submitted(&mut self, batch: BatchId, plan: ReadAheadPlan) {
        let sequence = match self.slots.get(&plan.at.key) {
            Some(Slot::InFlight { sequence, .. }) => *sequence,
            _ => unreachable!("a read-ahead is submitted right after its reserve"),
        };
        let old = self.in_flight.insert(batch, Ticket { plan, sequence });
        debug_assert!(old.is_none(), "batch ids are unique");
    }

    /// Whether `batch` is a read-ahead's read.
    pub(super) fn owns(&self, batch: BatchId) -> bool {
        self.in_flight.contains_key(&batch)
    }

    /// Whether store `key` has a read-ahead for `from_offset` in flight.
    pub(super) fn pending(&self, key: u64, from_offset: u64) -> bool {
        matches!(self.slots.get(&key),
            Some(Slot::InFlight { from_offset: f, .. }) if *f == from_offset)
    }

    /// Takes a reaped batch if it is a read-ahead: the read's bytes become
    /// the store's held read-ahead, unless it failed or was invalidated
    /// meanwhile (its bytes are released). Returns false for other batches.
    pub(super) fn complete(&mut self, batch: BatchId, completions: Vec<Completion>) -> bool {
        let Some(ticket) = self.in_flight.remove(&batch) else {
            return false;
        };
        let plan = ticket.plan;
        let current = matches!(self.slots.get(&plan.at.key),
            Some(Slot::InFlight { sequence, .. }) if *sequence == ticket.sequence);
        let mut completions = completions.into_iter();
        let (result, buf) = match completions.next() {
            Some(c) => (c.result, c.op.into_buf()),
            None => (Err(std::io::Error::other("no completion")), None),
        };
        match (current, result, buf) {
            (true, Ok(n), Some(mut buf)) => {
                // Bytes past the durable limit of the time may change.
                let usable = (plan.limit - plan.start) as usize;
                buf.set_len(n.min(usable).min(buf.len()));
                self.slots.insert(plan.at.key, Slot::Ready { plan, buf });
            }
            (current, result, buf) => {
                if result.is_err() {
                    self.stats.errors += 1;
                } else {
                    self.stats.wasted += 1;
                }
                if current {
                    self.slots.remove(&plan.at.key);
                }
                self.held_bytes -= plan.len_bytes;
                if let Some(b) = buf {
                    self.recycle(b);
                }
            }
        }
        true
    }

    /// The held read-ahead for `at`, if there is one (a hit); a held one for
    /// anything else is dropped as wasted. One in flight stays.
    pub(super) fn take(&mut self, at: &ReadAheadAt) -> Option<ReadAheadBuf> {
        match self.slots.get(&at.key) {
            Some(Slot::Ready { plan, .. }) if plan.at == *at => {}
            Some(Slot::Ready { .. }) => {
                self.drop_slot(at.key);
                return None;
            }
            _ => return None,
        }
        let Some(Slot::Ready { plan, buf }) = self.slots.remove(&at.key) else {
            unreachable!("matched above");
        };
        self.held_bytes -= plan.len_bytes;
        self.stats.hits += 1;
        Some(ReadAheadBuf {
            buf,
            start: plan.start,
            position: plan.position,
        })
    }

    /// Drops store `key`'s read-ahead: held bytes at once, a read in flight
    /// when it is reaped (as wasted).
    pub(super) fn invalidate(&mut self, key: u64) {
        match self.slots.get(&key) {
            Some(Slot::Ready { .. }) => self.drop_slot(key),
            Some(Slot::InFlight { .. }) => {
                self.slots.remove(&key);
            }
            None => {}
        }
    }

    fn drop_slot(&mut self, key: u64) {
        if let Some(Slot::Ready { plan, buf }) = self.slots.remove(&key) {
            self.held_bytes -= plan.len_bytes;
            self.stats.wasted += 1;
            self.recycle(buf);
        }
    }

    /// Keeps a spare buffer for the next read-ahead, if there is room.
    pub(super) fn recycle(&mut self, mut buf: AlignedBuf) {
        if self.idle.len() < IDLE_BUFFERS_MAX && self.enabled() {
            buf.clear();
            self.idle.push(buf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::Op;

    fn plan(key: u64, from_offset: u64, len_bytes: usize) -> ReadAheadPlan {
        ReadAheadPlan {
            at: ReadAheadAt {
                key,
                from_offset,
                segment_base: 0,
                file: FileId(1),
            },
            start: 0,
            position: 0,
            limit: len_bytes as u64 - 100,
            len_bytes,
        }
    }

    /// A read's completion as a backend hands it back (`len` set to the
    /// bytes read).
    fn done(mut buf: AlignedBuf, result: std::io::Result<usize>) -> Vec<Completion> {
        let len = buf.capacity();
        if let Ok(n) = &result {
            buf.set_len(*n);
        }
        vec![Completion {
            op: Op::Read {
                file: FileId(1),
                offset: 0,
                len,
                buf,
            },
            result,
        }]
    }

    /// Reads in flight count against the bound as much as held ones: with
    /// room for two, a third partition is refused until one is used.
    #[test]
    fn the_pool_bound_counts_reads_in_flight_and_held() {
        let mut r = ReadAheads::new(2 * 8192);
        let a = r.reserve(&plan(1, 10, 8192)).unwrap();
        r.submitted(BatchId(1), plan(1, 10, 8192));
        let b = r.reserve(&plan(2, 10, 8192)).unwrap();
        r.submitted(BatchId(2), plan(2, 10, 8192));
        assert!(r.reserve(&plan(3, 10, 8192)).is_none());
        assert_eq!(r.stats().refused, 1);
        assert_eq!(r.stats().held_bytes, 2 * 8192);
        assert!(r.complete(BatchId(1), done(a, Ok(8192))));
        // Held, not used yet: still counted.
        assert!(r.reserve(&plan(3, 10, 8192)).is_none());
        let got = r.take(&plan(1, 10, 8192).at).unwrap();
        // Bytes past the limit of the time are not handed out.
        assert_eq!(got.buf.len(), 8192 - 100);
        assert!(r.reserve(&plan(3, 10, 8192)).is_some());
        assert!(r.stats().held_bytes <= r.stats().bytes_max);
        assert!(r.complete(BatchId(2), done(b, Ok(8192))));
        assert_eq!(r.stats().hits, 1);
    }

    /// An invalidated read completes as wasted: its bytes are released and
    /// never served; a failed read is counted and leaves no slot behind.
    #[test]
    fn invalidated_and_failed_reads_are_never_served() {
        let mut r = ReadAheads::new(1 << 20);
        let buf = r.reserve(&plan(1, 10, 8192)).unwrap();
        r.submitted(BatchId(7), plan(1, 10, 8192));
        assert!(r.pending(1, 10));
        r.invalidate(1);
        assert!(!r.pending(1, 10));
        assert!(r.complete(BatchId(7), done(buf, Ok(8192))));
        assert!(r.take(&plan(1, 10, 8192).at).is_none());
        assert_eq!((r.stats().wasted, r.stats().held_bytes), (1, 0));
        let buf = r.reserve(&plan(1, 10, 8192)).unwrap();
        r.submitted(BatchId(8), plan(1, 10, 8192));
        let eio = std::io::Error::from_raw_os_error(libc::EIO);
        assert!(r.complete(BatchId(8), done(buf, Err(eio))));
        assert!(r.take(&plan(1, 10, 8192).at).is_none());
        assert_eq!((r.stats().errors, r.stats().held_bytes), (1, 0));
        assert!(!r.complete(BatchId(9), Vec::new()), "not a read-ahead");
    }
}
