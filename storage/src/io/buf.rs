//! 4096-aligned, pre-touched I/O buffers and a bounded pool of them.
//!
//! O_DIRECT needs sector-aligned memory, and touching fresh pages costs about
//! 8 us a page on these machines, so buffers are allocated once, zeroed (which
//! touches every page) and recycled through [`BufPool`].

use std::alloc::{self, Layout};
use std::ptr::NonNull;

/// Alignment of every I/O buffer, file offset and O_DIRECT length.
pub const BLOCK_SIZE: usize = 4096;

/// Rounds `n` up to a multiple of [`BLOCK_SIZE`].
pub const fn align_up(n: u64) -> u64 {
    (n + BLOCK_SIZE as u64 - 1) & !(BLOCK_SIZE as u64 - 1)
}

/// Rounds `n` down to a multiple of [`BLOCK_SIZE`].
pub const fn align_down(n: u64) -> u64 {
    n & !(BLOCK_SIZE as u64 - 1)
}

/// An owned, zero-initialised, [`BLOCK_SIZE`]-aligned byte buffer with a fixed
/// capacity and a logical length (`len <= capacity`).
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    capacity: usize,
    len: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared references only allow reads, like &Vec<u8>.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// Allocates a zeroed buffer of `capacity` bytes rounded up to a block.
    pub fn new(capacity: usize) -> Self {
        let capacity = align_up(capacity.max(1) as u64) as usize;
        let layout = Self::layout(capacity);
        // SAFETY: layout has non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            alloc::handle_alloc_error(layout)
        };
        Self {
            ptr,
            capacity,
            len: 0,
        }
    }

    fn layout(capacity: usize) -> Layout {
        // Capacity is a non-zero multiple of BLOCK_SIZE, a power of two.
        Layout::from_size_align(capacity, BLOCK_SIZE).expect("aligned buffer layout")
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Sets the logical length. Bytes up to `capacity` are always initialised.
    pub fn set_len(&mut self, len: usize) {
        assert!(
            len <= self.capacity,
            "len {len} > capacity {}",
            self.capacity
        );
        self.len = len;
    }

    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Appends `bytes`; panics if they do not fit (callers size buffers first).
    pub fn extend_from_slice(&mut self, bytes: &[u8]) {
        let end = self.len + bytes.len();
        assert!(
            end <= self.capacity,
            "buffer overflow: {end} > {}",
            self.capacity
        );
        let start = self.len;
        self.full_mut()[start..end].copy_from_slice(bytes);
        self.len = end;
    }

    /// The whole capacity, initialised bytes, regardless of `len`.
    pub fn full_mut(&mut self) -> &mut [u8] {
        // SAFETY: the allocation is `capacity` initialised bytes owned by self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.capacity) }
    }

    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `len <= capacity` bytes are initialised and owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` guarantees exclusivity.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with exactly this layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.capacity)) }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlignedBuf")
            .field("capacity", &self.capacity)
            .field("len", &self.len)
            .finish()
    }
}

/// A bounded pool of equally sized, pre-touched buffers.
///
/// `get` never blocks: when the pool is empty it allocates a fresh buffer, and
/// `put` drops buffers beyond `count_max`, so memory held idle is bounded by
/// `count_max * buf_size_bytes`.
pub struct BufPool {
    buf_size_bytes: usize,
    count_max: usize,
    free: Vec<AlignedBuf>,
}

impl BufPool {
    /// Creates a pool and pre-touches `count_max` buffers up front so the hot
    /// path never pays for fresh pages.
    pub fn new(buf_size_bytes: usize, count_max: usize) -> Self {
        let buf_size_bytes = align_up(buf_size_bytes as u64) as usize;
        let free = (0..count_max)
            .map(|_| AlignedBuf::new(buf_size_bytes))
            .collect();
        Self {
            buf_size_bytes,
            count_max,
            free,
        }
    }

    /// A pool that starts empty: buffers are allocated as first needed and
    /// kept (up to `count_max`) once returned, so a pool that is never used
    /// costs nothing.
    pub fn lazy(buf_size_bytes: usize, count_max: usize) -> Self {
        Self {
            buf_size_bytes: align_up(buf_size_bytes as u64) as usize,
            count_max,
            free: Vec::new(),
        }
    }

    /// Buffers held idle (at most `count_max`).
    pub fn idle(&self) -> usize {
        self.free.len()
    }

    pub fn buf_size_bytes(&self) -> usize {
        self.buf_size_bytes
    }

    /// Returns a cleared buffer of at least `size_bytes`.
    pub fn get(&mut self, size_bytes: usize) -> AlignedBuf {
        if size_bytes <= self.buf_size_bytes {
            if let Some(mut buf) = self.free.pop() {
                buf.clear();
                return buf;
            }
            return AlignedBuf::new(self.buf_size_bytes);
        }
        AlignedBuf::new(size_bytes)
    }

    /// Returns a buffer to the pool (dropped if the pool is full or the buffer
    /// has a foreign size).
    pub fn put(&mut self, buf: AlignedBuf) {
        if buf.capacity() == self.buf_size_bytes && self.free.len() < self.count_max {
            self.free.push(buf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_aligned_and_zeroed() {
        let mut b = AlignedBuf::new(5000);
        assert_eq!(b.capacity(), 8192);
        assert_eq!(b.as_ptr() as usize % BLOCK_SIZE, 0);
        assert!(b.full_mut().iter().all(|&x| x == 0));
        b.extend_from_slice(b"abc");
        assert_eq!(&b[..], b"abc");
    }

    #[test]
    fn pool_is_bounded() {
        let mut pool = BufPool::new(4096, 2);
        let a = pool.get(10);
        let b = pool.get(10);
        let c = pool.get(10);
        pool.put(a);
        pool.put(b);
        pool.put(c);
        assert_eq!(pool.free.len(), 2);
        let big = pool.get(10_000);
        assert!(big.capacity() >= 10_000);
    }

    #[test]
    fn lazy_pool_allocates_on_demand_and_keeps_at_most_its_bound() {
        let mut pool = BufPool::lazy(4096, 1);
        assert_eq!(pool.idle(), 0);
        let a = pool.get(4096);
        let b = pool.get(4096);
        pool.put(a);
        pool.put(b);
        assert_eq!(pool.idle(), 1);
    }
}
