//! Fetch reply buffers, shared by a server's shards. A fetch copies its
//! batches into one on the partition's shard (`PartitionStore::read_into`);
//! the connection's shard, which may be another, sends them straight from
//! it and gives it back. Kept buffers stay allocated and their pages
//! resident: a fresh ~1 MiB Vec per fetch faulted in every page and malloc
//! handed the memory back to the kernel after each reply (most of the
//! shard's CPU in the consume profile, benches/RESULTS.md).
//!
//! Bounds: at most `idle_max` buffers are kept, none of more than
//! `buffer_bytes_max` capacity (one that grew past it, for an outsized
//! batch, is dropped). Buffers in use are bounded elsewhere: each fetch
//! holds its reply room in the shard's byte budget until its reply is
//! written. A reply whose write was abandoned on a timeout is lost to the
//! pool (the runtime owns the buffer until the cancelled write completes);
//! the next take allocates instead.

use std::sync::Mutex;

/// Idle buffers kept per shard of the server.
pub const IDLE_PER_SHARD: usize = 4;
/// The largest buffer kept: a reply room of a few MiB covers the usual
/// fetch sizes; a larger fetch allocates its own.
pub const BUFFER_BYTES_MAX: usize = 4 << 20;

#[derive(Debug)]
pub struct ReplyPool {
    idle: Mutex<Vec<Vec<u8>>>,
    idle_max: usize,
    buffer_bytes_max: usize,
}

/// What [`ReplyPool::put`] did with a buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Put {
    Kept,
    /// Over `buffer_bytes_max`, or the pool held `idle_max` already.
    Dropped,
    /// Never allocated (an empty reply): nothing to keep.
    Empty,
}

impl ReplyPool {
    pub fn new(idle_max: usize, buffer_bytes_max: usize) -> Self {
        Self {
            idle: Mutex::new(Vec::with_capacity(idle_max)),
            idle_max,
            buffer_bytes_max,
        }
    }

    /// The pool of a server with `shards` shards.
    pub fn for_shards(shards: usize) -> Self {
        Self::new(IDLE_PER_SHARD * shards.max(1), BUFFER_BYTES_MAX)
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<Vec<u8>>> {
        // The list stays consistent whatever panicked while holding it.
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// An empty buffer with room for `bytes` (at most `buffer_bytes_max`
    /// reserved; it grows if a reply needs more), and whether it was newly
    /// allocated rather than kept.
    pub fn take(&self, bytes: usize) -> (Vec<u8>, bool) {
        // Last in, first out: the most recently written pages are warmest.
        let kept = self.idle().pop();
        let fresh = kept.is_none();
        let mut buf = kept.unwrap_or_default();
        debug_assert!(buf.is_empty());
        buf.reserve(bytes.min(self.buffer_bytes_max));
        (buf, fresh)
    }

    /// Gives a sent reply's buffer back.
    pub fn put(&self, mut buf: Vec<u8>) -> Put {
        if buf.capacity() == 0 {
            return Put::Empty;
        }
        if buf.capacity() > self.buffer_bytes_max {
            return Put::Dropped;
        }
        buf.clear();
        let mut idle = self.idle();
        if idle.len() >= self.idle_max {
            return Put::Dropped;
        }
        idle.push(buf);
        assert!(idle.len() <= self.idle_max, "reply pool over its bound");
        Put::Kept
    }

    /// Buffers kept now.
    pub fn idle_count(&self) -> usize {
        self.idle().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_comes_back_whole_and_is_reused_without_allocating() {
        let pool = ReplyPool::new(2, 1 << 20);
        let (mut buf, fresh) = pool.take(1000);
        assert!(fresh);
        buf.extend_from_slice(&[7; 1000]);
        let at = buf.as_ptr();
        assert_eq!(pool.put(buf), Put::Kept);
        let (again, fresh) = pool.take(1000);
        assert!(!fresh);
        assert!(again.is_empty(), "a kept buffer comes back cleared");
        assert_eq!(again.as_ptr(), at, "the same allocation");
        assert_eq!(pool.put(Vec::new()), Put::Empty);
        assert_eq!(pool.idle_count(), 0);
    }

    #[test]
    fn the_pool_keeps_at_most_idle_max_buffers_none_over_the_size_bound() {
        let pool = ReplyPool::new(3, 64 << 10);
        let taken: Vec<_> = (0..5).map(|_| pool.take(64 << 10).0).collect();
        let puts: Vec<_> = taken.into_iter().map(|b| pool.put(b)).collect();
        assert_eq!(puts.iter().filter(|p| **p == Put::Kept).count(), 3);
        assert_eq!(puts.iter().filter(|p| **p == Put::Dropped).count(), 2);
        assert_eq!(pool.idle_count(), 3);
        // A reply that grew past the size bound is not kept.
        let (mut big, _) = pool.take(1 << 20);
        assert!(big.capacity() >= 64 << 10);
        big.resize((64 << 10) + 1, 0);
        assert_eq!(pool.put(big), Put::Dropped);
        // A take never reserves past the size bound.
        let (small, _) = pool.take(16 << 20);
        assert!(small.capacity() <= 64 << 10, "{}", small.capacity());
        // Three kept, two taken since.
        assert_eq!(pool.idle_count(), 1);
    }
}
