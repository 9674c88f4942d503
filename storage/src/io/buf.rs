//! 4096-aligned, pre-touched I/O buffers and bounded pools of them.
//!
//! O_DIRECT needs sector-aligned memory, and touching fresh pages costs about
//! 8 us a page on these machines, so buffers are allocated once, zeroed (which
//! touches every page) and recycled through [`BufPool`] (one thread) or
//! [`SharedBufPool`] (any thread; a buffer goes home when dropped).
//!
//! [`BatchBuf`] is a buffer holding one batch at the position in its block
//! where the batch will be written, so a store can write it as it is (no copy;
//! see `PartitionStore::append_owned`).

use std::alloc::{self, Layout};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, MutexGuard};

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
    /// The [`SharedBufPool`] the memory returns to when dropped, if any.
    home: Option<Home>,
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
            home: None,
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

impl AlignedBuf {
    /// Ends the lend of a buffer from [`SharedBufPool::try_lend`]: it no
    /// longer counts against `lent_max` (it still goes home when dropped).
    /// For a holder that keeps a lent buffer past the use the lend bounds:
    /// the read cache keeping a flushed write buffer.
    pub fn end_lend(&mut self) {
        let Some(home) = self.home.as_mut().filter(|h| h.lent) else {
            return;
        };
        let mut state = home.pool.lock();
        debug_assert!(state.lent > 0);
        state.lent -= 1;
        drop(state);
        home.lent = false;
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
        if let Some(home) = self.home.take() {
            // The allocation moves into `bare`; `self` must not free it.
            let bare = AlignedBuf {
                ptr: self.ptr,
                capacity: self.capacity,
                len: 0,
                home: None,
            };
            home.give_back(bare);
            return;
        }
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

    /// Frees the idle buffers (a pool its owner stopped using holds none).
    pub fn drop_idle(&mut self) {
        self.free.clear();
    }

    /// Returns a buffer to the pool (dropped if the pool is full or the buffer
    /// has a foreign size).
    pub fn put(&mut self, buf: AlignedBuf) {
        if buf.capacity() == self.buf_size_bytes && self.free.len() < self.count_max {
            self.free.push(buf);
        }
    }
}

/// Where a [`SharedBufPool`] buffer returns when dropped, and whether it
/// counts against the pool's lending bound.
struct Home {
    pool: Arc<Shared>,
    lent: bool,
}

impl Home {
    fn give_back(self, buf: AlignedBuf) {
        let mut state = self.pool.lock();
        if self.lent {
            debug_assert!(state.lent > 0);
            state.lent -= 1;
        }
        debug_assert!(state.out > 0, "a buffer came home that never left");
        state.out -= 1;
        if self.pool.arena.as_ref().is_some_and(|a| a.holds(&buf)) {
            // Arena memory is never freed on its own: always kept.
            state.fixed_free.push(buf);
        } else if state.keeps_idle(self.pool.idle_max) {
            state.free.push(buf);
        }
        // Else `buf` is dropped here (home None): freed.
    }
}

/// Takes over which a pool's demand (its peak of buffers out) is measured:
/// idle buffers beyond the peak of the last full window and the current one
/// are freed as they come back, so a pool whose load fell gives its memory
/// back within two windows of takes.
pub const DEMAND_WINDOW_TAKES: u32 = 4096;

struct Shared {
    buf_size_bytes: usize,
    idle_max: usize,
    lent_max: usize,
    /// Buffers carved from one allocation that an io_uring backend may
    /// register (see [`SharedBufPool::with_fixed`]); freed with the pool.
    arena: Option<Arena>,
    state: Mutex<SharedState>,
}

struct SharedState {
    /// The arena's buffers ready for reuse (all of them when none is out).
    fixed_free: Vec<AlignedBuf>,
    /// Heap buffers ready for reuse; at most `idle_max`.
    free: Vec<AlignedBuf>,
    /// Buffers out through [`SharedBufPool::try_lend`]; at most `lent_max`.
    lent: usize,
    /// Fresh buffers allocated (and zeroed, touching every page) so far:
    /// what a warm pool must not keep doing.
    allocated_total: u64,
    /// Buffers handed out (taken or lent) and not back yet.
    out: usize,
    /// The most buffers out at once in the current demand window, and in
    /// the last full one (see [`DEMAND_WINDOW_TAKES`]).
    out_peak: usize,
    out_peak_last: usize,
    /// Takes since the current window began.
    window_takes: u32,
}

impl SharedState {
    fn new(fixed_free: Vec<AlignedBuf>) -> Self {
        Self {
            fixed_free,
            free: Vec::new(),
            lent: 0,
            allocated_total: 0,
            out: 0,
            out_peak: 0,
            out_peak_last: 0,
            window_takes: 0,
        }
    }

    /// Books a buffer handed out: the demand peak, the window.
    fn hand_out(&mut self) {
        self.out += 1;
        self.out_peak = self.out_peak.max(self.out);
        self.window_takes += 1;
        if self.window_takes >= DEMAND_WINDOW_TAKES {
            self.out_peak_last = self.out_peak;
            self.out_peak = self.out;
            self.window_takes = 0;
        }
        debug_assert!(self.out <= self.out_peak);
    }

    /// Whether a heap buffer coming back is kept idle: at most `idle_max`
    /// are, and no more than the recent peak out would need again (every
    /// buffer of the pool, idle or out, counted).
    fn keeps_idle(&self, idle_max: usize) -> bool {
        let demand = self.out_peak.max(self.out_peak_last);
        let held = self.free.len() + self.fixed_free.len() + self.out;
        self.free.len() < idle_max && held < demand
    }
}

impl Drop for SharedState {
    fn drop(&mut self) {
        // The arena's buffers are slices of one allocation, freed by the
        // arena itself: never one by one.
        for buf in self.fixed_free.drain(..) {
            std::mem::forget(buf);
        }
    }
}

/// One aligned allocation split into a pool's fixed buffers.
struct Arena {
    ptr: NonNull<u8>,
    len_bytes: usize,
}

// SAFETY: the arena is plain memory owned by its pool; the buffers carved
// from it are owned one at a time (see SharedBufPool::with_fixed).
unsafe impl Send for Arena {}
// SAFETY: the arena itself is never read or written through `&Arena`.
unsafe impl Sync for Arena {}

impl Arena {
    fn holds(&self, buf: &AlignedBuf) -> bool {
        let start = self.ptr.as_ptr() as usize;
        let at = buf.as_ptr() as usize;
        at >= start && at + buf.capacity() <= start + self.len_bytes
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: allocated in `with_fixed` with exactly this layout; every
        // buffer carved from it held an `Arc` to the pool, so none is left.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), AlignedBuf::layout(self.len_bytes)) }
    }
}

/// A pool's arena, as an io_uring backend registers it (fixed buffers):
/// holding it keeps the memory allocated, so a registration never outlives
/// the pages it names.
#[derive(Clone)]
pub struct FixedRegion(Arc<Shared>);

impl FixedRegion {
    /// Start and length of the region.
    pub fn as_raw(&self) -> (*const u8, usize) {
        let arena = self.0.arena.as_ref().expect("a FixedRegion has an arena");
        (arena.ptr.as_ptr(), arena.len_bytes)
    }

    /// Whether `len_bytes` from `ptr` lie inside the region.
    pub fn contains(&self, ptr: *const u8, len_bytes: usize) -> bool {
        let (start, len) = self.as_raw();
        let (start, at) = (start as usize, ptr as usize);
        at >= start && at + len_bytes <= start + len
    }
}

impl std::fmt::Debug for FixedRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (ptr, len) = self.as_raw();
        f.debug_struct("FixedRegion")
            .field("ptr", &ptr)
            .field("len_bytes", &len)
            .finish()
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, SharedState> {
        // A panic while holding the lock cannot leave the free list or the
        // count half-updated (each is one push/pop or one add), so the
        // state is usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The lending bound of a [`SharedBufPool`] was hit: `lent_max` buffers are
/// out. One comes back when a holder drops it (for a batch appended with
/// `PartitionStore::append_owned`, when the flush that wrote it completed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("all {lent_max} lendable I/O buffers are in use: wait for a flush to complete")]
pub struct PoolExhausted {
    pub lent_max: usize,
}

/// A pool of equally sized, pre-touched buffers that any thread may take
/// from; every buffer it hands out goes back to it when dropped, wherever
/// that happens (a completed write, an error path, a dropped request).
///
/// Bounds: at most `idle_max` buffers are kept idle, and no more than the
/// pool's recent peak of buffers out needs (the rest are freed on return;
/// see [`DEMAND_WINDOW_TAKES`]), so a warm pool serves a steady load
/// without allocating yet gives memory back when the load falls. At most
/// `lent_max` are out through [`SharedBufPool::try_lend`] at once (the next
/// one is refused with [`PoolExhausted`]), so callers that fill buffers
/// from outside (a connection reading request bodies) hold at most
/// `lent_max * buf_size_bytes`. [`SharedBufPool::take`] is for the
/// owner's own bounded use (a store's write buffers) and never refuses.
#[derive(Clone)]
pub struct SharedBufPool(Arc<Shared>);

impl std::fmt::Debug for SharedBufPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.0.lock();
        f.debug_struct("SharedBufPool")
            .field("buf_size_bytes", &self.0.buf_size_bytes)
            .field("idle", &state.free.len())
            .field("lent", &state.lent)
            .finish()
    }
}

impl SharedBufPool {
    /// An empty pool of `buf_size_bytes` buffers (rounded up to a block):
    /// buffers are allocated when first needed and kept once returned.
    pub fn new(buf_size_bytes: usize, idle_max: usize, lent_max: usize) -> Self {
        Self(Arc::new(Shared {
            buf_size_bytes: align_up(buf_size_bytes as u64) as usize,
            idle_max,
            lent_max,
            arena: None,
            state: Mutex::new(SharedState::new(Vec::new())),
        }))
    }

    /// [`SharedBufPool::new`] whose first `fixed_count` buffers are carved
    /// from one allocation made now ([`SharedBufPool::fixed_region`]), which
    /// an io_uring backend can register so writes from them skip pinning
    /// pages per I/O. They are handed out first and never freed before the
    /// pool; past them the pool allocates as `new` does. The arena's pages
    /// are touched when the backend registers it (pinning faults them in)
    /// or on first use.
    pub fn with_fixed(
        buf_size_bytes: usize,
        fixed_count: usize,
        idle_max: usize,
        lent_max: usize,
    ) -> Self {
        let buf_size_bytes = align_up(buf_size_bytes as u64) as usize;
        let len_bytes = buf_size_bytes * fixed_count.max(1);
        let layout = AlignedBuf::layout(len_bytes);
        // SAFETY: layout has non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            alloc::handle_alloc_error(layout)
        };
        let fixed_free = (0..fixed_count)
            .map(|i| AlignedBuf {
                // SAFETY: slot i lies inside the arena (i < fixed_count).
                ptr: unsafe { NonNull::new_unchecked(ptr.as_ptr().add(i * buf_size_bytes)) },
                capacity: buf_size_bytes,
                len: 0,
                home: None,
            })
            .collect();
        Self(Arc::new(Shared {
            buf_size_bytes,
            idle_max,
            lent_max,
            arena: Some(Arena { ptr, len_bytes }),
            state: Mutex::new(SharedState::new(fixed_free)),
        }))
    }

    /// The arena of [`SharedBufPool::with_fixed`], for a backend to register.
    pub fn fixed_region(&self) -> Option<FixedRegion> {
        self.0
            .arena
            .as_ref()
            .map(|_| FixedRegion(Arc::clone(&self.0)))
    }

    pub fn buf_size_bytes(&self) -> usize {
        self.0.buf_size_bytes
    }

    pub fn lent_max(&self) -> usize {
        self.0.lent_max
    }

    /// Buffers held idle (at most `idle_max`).
    pub fn idle(&self) -> usize {
        self.0.lock().free.len()
    }

    /// Buffers out through [`SharedBufPool::try_lend`] (at most `lent_max`).
    pub fn lent(&self) -> usize {
        self.0.lock().lent
    }

    /// Fresh heap buffers allocated so far (not reused from the pool).
    pub fn allocated_total(&self) -> u64 {
        self.0.lock().allocated_total
    }

    /// A cleared buffer of `buf_size_bytes`, for the owner's bounded use;
    /// it returns here when dropped.
    pub fn take(&self) -> AlignedBuf {
        self.get(false)
    }

    /// A cleared buffer of `buf_size_bytes` that counts against `lent_max`
    /// until dropped; refused when `lent_max` are out.
    pub fn try_lend(&self) -> Result<AlignedBuf, PoolExhausted> {
        {
            let mut state = self.0.lock();
            if state.lent >= self.0.lent_max {
                return Err(PoolExhausted {
                    lent_max: self.0.lent_max,
                });
            }
            state.lent += 1;
        }
        Ok(self.get(true))
    }

    /// [`SharedBufPool::try_lend`] as a [`BatchBuf`] for a batch that starts
    /// `lead_bytes` into its block (the store's `batch_lead_bytes`).
    pub fn try_lend_batch(&self, lead_bytes: usize) -> Result<BatchBuf, PoolExhausted> {
        Ok(BatchBuf::new(self.try_lend()?, lead_bytes))
    }

    fn get(&self, lent: bool) -> AlignedBuf {
        let reused = {
            let mut state = self.0.lock();
            let reused = state.fixed_free.pop().or_else(|| state.free.pop());
            state.allocated_total += u64::from(reused.is_none());
            state.hand_out();
            reused
        };
        // Allocating (and zeroing) happens outside the lock.
        let mut buf = reused.unwrap_or_else(|| AlignedBuf::new(self.0.buf_size_bytes));
        buf.clear();
        buf.home = Some(Home {
            pool: Arc::clone(&self.0),
            lent,
        });
        buf
    }
}

/// One batch in an aligned buffer, starting `lead_bytes` into it: where in
/// its block the batch will sit on disk. A store whose log ends at that
/// position in a block writes the buffer as it is, after copying the
/// partial block before the batch (under a block) into the lead; otherwise
/// it copies the batch (see `PartitionStore::append_owned`).
#[derive(Debug)]
pub struct BatchBuf {
    /// `[0, lead_bytes)` is the lead, `[lead_bytes, len)` the batch.
    buf: AlignedBuf,
    lead_bytes: usize,
}

impl BatchBuf {
    /// An empty batch in `buf`, to start `lead_bytes` (under a block) in.
    pub fn new(mut buf: AlignedBuf, lead_bytes: usize) -> Self {
        assert!(
            lead_bytes < BLOCK_SIZE,
            "lead {lead_bytes} is not under a block"
        );
        assert!(lead_bytes <= buf.capacity());
        buf.set_len(lead_bytes);
        Self { buf, lead_bytes }
    }

    pub fn lead_bytes(&self) -> usize {
        self.lead_bytes
    }

    /// The most batch bytes the buffer holds.
    pub fn batch_capacity(&self) -> usize {
        self.buf.capacity() - self.lead_bytes
    }

    /// The batch bytes so far.
    pub fn batch(&self) -> &[u8] {
        &self.buf[self.lead_bytes..]
    }

    /// Sets the batch's length (bytes past the old length are zero or
    /// stale, to be filled through [`BatchBuf::batch_mut`]); panics past
    /// [`BatchBuf::batch_capacity`].
    pub fn set_batch_len(&mut self, len_bytes: usize) {
        self.buf.set_len(self.lead_bytes + len_bytes);
    }

    pub fn batch_mut(&mut self) -> &mut [u8] {
        let lead = self.lead_bytes;
        &mut self.buf[lead..]
    }

    /// Appends `bytes` to the batch; panics if they do not fit.
    pub fn extend_from_slice(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The whole buffer: the lead, then the batch.
    pub fn into_buf(self) -> AlignedBuf {
        self.buf
    }
}

/// The batch bytes (as [`BatchBuf::batch`]), so a verified batch can own
/// its buffer (`ringlog_protocol::VerifiedBatch<BatchBuf>`).
impl AsRef<[u8]> for BatchBuf {
    fn as_ref(&self) -> &[u8] {
        self.batch()
    }
}

impl AsMut<[u8]> for BatchBuf {
    fn as_mut(&mut self) -> &mut [u8] {
        self.batch_mut()
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

    #[test]
    fn shared_pool_refuses_past_its_lending_bound_until_a_buffer_is_dropped() {
        let pool = SharedBufPool::new(8192, 1, 2);
        let a = pool.try_lend().unwrap();
        let b = pool.try_lend_batch(100).unwrap();
        assert_eq!(pool.try_lend().unwrap_err(), PoolExhausted { lent_max: 2 });
        // The owner's own takes are not lent: never refused.
        let own = pool.take();
        assert_eq!(pool.lent(), 2);
        let b_ptr = b.batch().as_ptr() as usize - b.lead_bytes();
        drop(b);
        assert_eq!(pool.lent(), 1);
        let c = pool
            .try_lend()
            .expect("a dropped buffer frees a lending slot");
        assert_eq!(c.as_ptr() as usize, b_ptr, "reused, not reallocated");
        drop((a, c, own));
        assert_eq!(pool.lent(), 0);
        assert_eq!(pool.idle(), 1, "idle buffers capped at idle_max");
    }

    #[test]
    fn shared_pool_buffers_go_home_from_another_thread() {
        let pool = SharedBufPool::new(4096, 4, 4);
        let bufs: Vec<_> = (0..3).map(|_| pool.try_lend().unwrap()).collect();
        std::thread::spawn(move || drop(bufs)).join().unwrap();
        assert_eq!(pool.lent(), 0);
        assert_eq!(pool.idle(), 3);
        let reused = pool.take();
        assert!(reused.is_empty());
        assert_eq!(reused.capacity(), 4096);
    }

    #[test]
    fn fixed_buffers_come_first_and_always_go_home() {
        let pool = SharedBufPool::with_fixed(4096, 2, 0, 4);
        let region = pool.fixed_region().unwrap();
        let a = pool.take();
        let b = pool.try_lend().unwrap();
        let heap = pool.take();
        assert!(region.contains(a.as_ptr(), a.capacity()));
        assert!(region.contains(b.as_ptr(), b.capacity()));
        assert!(
            !region.contains(heap.as_ptr(), heap.capacity()),
            "past the arena: heap"
        );
        drop((a, b, heap));
        // idle_max 0 frees the heap buffer, never an arena one.
        assert_eq!(pool.idle(), 0);
        let again = [pool.take(), pool.take()];
        assert!(again
            .iter()
            .all(|x| region.contains(x.as_ptr(), x.capacity())));
        // The region keeps the arena alive past the pool and its buffers.
        drop(again);
        drop(pool);
        assert_eq!(region.as_raw().1, 2 * 4096);
    }

    /// Ten buffers out at once, all back: all ten kept (the peak needs
    /// them), reused by the next ten takes, no fresh allocation; a pool
    /// bounded at four keeps four and frees the rest.
    #[test]
    fn shared_pool_keeps_what_its_peak_needs_up_to_idle_max() {
        for (idle_max, kept) in [(100, 10), (4, 4)] {
            let pool = SharedBufPool::new(4096, idle_max, 0);
            let bufs: Vec<_> = (0..10).map(|_| pool.take()).collect();
            assert_eq!(pool.allocated_total(), 10);
            drop(bufs);
            assert_eq!(pool.idle(), kept, "idle_max {idle_max}");
            let again: Vec<_> = (0..10).map(|_| pool.take()).collect();
            assert_eq!(pool.allocated_total(), 10 + (10 - kept) as u64);
            drop(again);
        }
    }

    /// After a peak of ten, a load of one buffer at a time for two demand
    /// windows: the pool frees the idle buffers it no longer needs, one a
    /// return, down to the one it does.
    #[test]
    fn shared_pool_gives_idle_buffers_back_when_its_demand_falls() {
        let pool = SharedBufPool::new(4096, 100, 0);
        drop((0..10).map(|_| pool.take()).collect::<Vec<_>>());
        assert_eq!(pool.idle(), 10);
        for _ in 0..DEMAND_WINDOW_TAKES {
            drop(pool.take());
        }
        assert_eq!(pool.idle(), 10, "the last window's peak still counts");
        for _ in 0..DEMAND_WINDOW_TAKES + 10 {
            drop(pool.take());
        }
        assert_eq!(pool.idle(), 1);
        assert_eq!(pool.allocated_total(), 10, "the one-at-a-time load reused");
    }

    #[test]
    fn batch_buf_places_the_batch_after_its_lead() {
        let pool = SharedBufPool::new(8192, 1, 1);
        let mut b = pool.try_lend_batch(300).unwrap();
        assert_eq!(b.batch_capacity(), 8192 - 300);
        b.extend_from_slice(b"batch");
        assert_eq!(b.batch(), b"batch");
        b.set_batch_len(2);
        b.batch_mut().copy_from_slice(b"xy");
        let buf = b.into_buf();
        assert_eq!(buf.len(), 302);
        assert_eq!(&buf[300..], b"xy");
    }

    #[test]
    fn an_ended_lend_frees_its_place_and_the_buffer_still_goes_home() {
        let pool = SharedBufPool::new(8192, 4, 1);
        let mut b = pool.try_lend().unwrap();
        assert_eq!(pool.try_lend().unwrap_err(), PoolExhausted { lent_max: 1 });
        b.end_lend();
        b.end_lend();
        assert_eq!(pool.lent(), 0);
        let other = pool.try_lend().unwrap();
        assert_eq!(pool.lent(), 1);
        drop(b);
        assert_eq!((pool.lent(), pool.idle()), (1, 1));
        drop(other);
        assert_eq!((pool.lent(), pool.idle()), (0, 2));
    }
}
