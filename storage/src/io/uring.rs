//! io_uring backend: one ring per shard thread.
//!
//! [`UringBackend::submit`] turns a batch of [`Sqe`]s into ring entries, waits
//! for every one of them and hands back one [`Completion`] per op, in
//! submission order.
//!
//! # Ordering
//!
//! Only linked ops are ordered: an op with `link_next` starts after it
//! completed (IOSQE_IO_LINK). Unlinked ops of a batch, and separate chains,
//! may run concurrently and complete in any order.
//!
//! # What the backend completes on its own
//!
//! * Short writes are resubmitted for the remainder until the whole buffer is
//!   written; a write that makes no progress fails with `WriteZero`.
//! * Short reads are continued until `len` bytes were read or a read returns 0
//!   (end of file); the result is the total.
//! * `EINTR` and `EAGAIN` completions of reads and writes are resubmitted, at
//!   most [`RETRY_LIMIT`] times per op; after that the error is returned. The
//!   same errors from an fsync, fdatasync, rename, unlink or rmdir are returned
//!   at once: the kernel did not cancel the links behind such an op, so they
//!   already ran and a retry would complete it after them.
//! * The kernel cancels the rest of a link chain (`ECANCELED`) after a failed
//!   or short read/write (not after a failed fsync, rename or unlink, whose
//!   chains go on). When the cancelling read/write was only short or
//!   interrupted and the backend completes it, the cancelled remainder of the
//!   chain is resubmitted behind it, links preserved. After a genuine failure
//!   the cancelled ops complete with `ECANCELED`.
//!
//! # Bounds
//!
//! At most the ring's SQ size (`entries` rounded up to a power of two by the
//! kernel) ops are in flight at once; larger batches are submitted in pieces
//! as earlier ops complete. A chain is never split across pieces: a chain
//! longer than the SQ fails as a whole with `InvalidInput` without being
//! submitted (other ops of the batch still run). A single read or write
//! submission is capped at `u32::MAX` rounded down to a block (the kernel caps
//! it further, at about 2 GiB, and the rest goes through the short-I/O path).
//!
//! # Asynchronous batches
//!
//! [`IoBackend::submit_nowait`] queues a batch without waiting and returns
//! its [`BatchId`]; [`IoBackend::reap`] hands back the batches whose every
//! op has finished, in the same form as `submit` (one completion per op, in
//! submission order). Short writes and reads, `EINTR`/`EAGAIN` retries and
//! cancelled links are completed exactly as for `submit`: `reap` (and any
//! `submit` running meanwhile) resubmits them without blocking, so a batch is
//! only handed back once its final results are known. An eventfd registered
//! with [`UringBackend::register_eventfd`] is signalled whenever `reap` may
//! have something new: by the kernel when completions arrive, and by the
//! backend itself when a batch finishes without a kernel completion (an empty
//! batch, ops failed up front, a ring failure) or inside a blocking `submit`
//! (see below). Wake-ups can be spurious.
//!
//! Synchronous `submit` may run while asynchronous batches are in flight (on
//! the same thread): the in-flight bound below is shared, completions of the
//! asynchronous batches that `submit` reaps are set aside for `reap`, and
//! their retries are resubmitted. Nothing orders a synchronous batch against
//! the asynchronous ones: callers must not let them touch the same bytes.
//!
//! # Deferred completions and the thread that owns the ring
//!
//! Where the kernel allows it (6.1+), the ring is set up with DEFER_TASKRUN
//! and SINGLE_ISSUER (see [`UringBackend::new`]; otherwise the ring behaves as
//! before and nothing below applies): the kernel turns finished ops into CQEs
//! only when this thread enters the ring asking for events, instead of
//! interrupting the thread at each completion. Blocking `submit` does that
//! while it waits; `reap` does it before taking the CQ. Recent kernels run a
//! bounded number of deferred items per enter (IO_LOCAL_TW_DEFAULT_MAX, 20)
//! and keep the rest for the next enter, and they signal the eventfd only
//! when the list of deferred work goes from empty to non-empty or an enter
//! posts CQEs: an enter that leaves work behind without posting a CQE (it ran
//! only the submissions of linked ops) gets no further signal (seen on 6.18:
//! a reaper that entered once per signal stalled). So `reap` enters again while the kernel
//! flags work left over (IORING_SQ_TASKRUN), and a blocking `submit` that
//! finished an asynchronous batch signals the eventfd itself.
//!
//! Such a ring belongs to one thread: it is created disabled and bound to the
//! first thread that submits, reaps or registers the eventfd. The backend can
//! be built on one thread and moved to another before that; used from any
//! other thread afterwards, the kernel refuses with `EEXIST`, which fails the
//! batches like any ring failure.
//!
//! # Ring failures
//!
//! If `io_uring_enter` fails with anything but `EINTR` (retried), or `EBUSY` /
//! `EAGAIN` (retried at most [`ENTER_BUSY_LIMIT`] times in a row), every op
//! that has not completed gets that error: of the synchronous batch and of
//! every asynchronous batch not reaped yet (entries of all of them may sit
//! unsubmitted in the SQ). Buffers and paths of ops the kernel may still own
//! are kept by the backend (the [`Completion`] gets a fresh empty buffer in
//! their place) until their completion shows up later, or are leaked when the
//! backend is dropped, so the kernel never touches freed memory. Such an op
//! may still execute later. Asynchronous batches still running when the
//! backend is dropped are leaked the same way.
//!
//! # Fixed buffers
//!
//! [`UringBackend::register_fixed_buffers`] registers buffer pools' arenas
//! with the ring (IORING_REGISTER_BUFFERS: their pages are pinned once);
//! a write whose buffer lies in one then goes as WRITE_FIXED, which skips
//! pinning the pages per I/O (get_user_pages, ~14% of the storage-level
//! append job's CPU at 1 MiB writes). The backend keeps every registered
//! region alive ([`FixedRegion`]), so a registration never names freed
//! memory. If the kernel refuses the registration (an old kernel, the
//! locked-memory limit), writes stay plain, with a warning.

use std::collections::{HashMap, VecDeque};
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use io_uring::{opcode, squeue, types, IoUring};

use super::{
    align_down, AlignedBuf, BatchId, Completion, FileId, FixedRegion, IoBackend, Op, OpenMode, Sqe,
};

/// Ring size used by [`UringBackend::with_default_entries`].
pub const DEFAULT_ENTRIES: u32 = 256;

/// How many times one op is resubmitted after an `EINTR` or `EAGAIN`
/// completion before the error is returned.
pub const RETRY_LIMIT: u32 = 16;

/// How many `EBUSY`/`EAGAIN` results of `io_uring_enter` in a row are retried
/// before the batch is failed.
pub const ENTER_BUSY_LIMIT: u32 = 1024;

/// `io_uring_enter` flag: run deferred completions and wait for events.
const IORING_ENTER_GETEVENTS: u32 = 1;

/// Most regions one ring registers as fixed buffers (the kernel's buf_index
/// is a u16; a shard registers one per pool).
pub const FIXED_REGIONS_MAX: usize = 64;

/// Largest length put into a single read/write SQE.
const MAX_CHUNK: usize = align_down(u32::MAX as u64) as usize;

/// An [`IoBackend`] over one io_uring instance.
///
/// Meant to be owned by one shard thread (every method takes `&mut self`). It
/// can be built on one thread and moved to the thread that uses it.
pub struct UringBackend {
    ring: IoUring,
    /// SQ size; also the bound on ops in flight (the CQ is twice as large).
    capacity: usize,
    files: HashMap<u32, OwnedFd>,
    next_file: u32,
    /// Tags user_data so completions of different batches (and of an
    /// abandoned one) are told apart.
    generation: u32,
    /// Resources of ops abandoned after a ring failure that the kernel may
    /// still use, keyed by user_data.
    quarantine: HashMap<u64, Quarantined>,
    /// Ops in the kernel (submitted or queued in the SQ), over all batches.
    in_flight: usize,
    /// Batches of `submit_nowait` not reaped yet, in submission order.
    running: VecDeque<(BatchId, Batch)>,
    next_batch: u64,
    /// The registered eventfd (owned by the caller).
    eventfd: Option<RawFd>,
    /// Scratch for draining the CQ.
    cqes: Vec<(u64, i32)>,
    /// Waits in the kernel for completions that returned (see
    /// [`UringBackend::kernel_waits`]).
    kernel_waits: u64,
    /// Set up with DEFER_TASKRUN (see the module docs).
    defer: bool,
    /// Created disabled and not yet bound to the thread that uses it.
    disabled: bool,
    /// Regions registered as fixed buffers, by buffer index; kept alive
    /// while registered (see the module docs).
    fixed: Vec<FixedRegion>,
    /// Write submissions that went as WRITE_FIXED.
    fixed_writes: u64,
}

struct Quarantined {
    _buf: Option<AlignedBuf>,
    _paths: CPaths,
    _stat: Option<Box<libc::statx>>,
}

impl UringBackend {
    /// Creates a ring with `entries` SQ entries (rounded up to a power of two
    /// by the kernel; at most 32768).
    ///
    /// Tries, in order, the setups below and takes the first the kernel
    /// accepts (an older kernel refuses flags it does not know with `EINVAL`);
    /// other setup errors are returned.
    /// 1. SUBMIT_ALL (5.18: submission does not stop at the first SQE that
    ///    fails to prepare), DEFER_TASKRUN with SINGLE_ISSUER (6.1: fewer
    ///    wakeups and context switches per flush), TASKRUN_FLAG (the kernel
    ///    flags deferred work it left over, see the module docs) and
    ///    R_DISABLED (bound to the thread that first uses it).
    /// 2. SUBMIT_ALL and COOP_TASKRUN (5.19: no IPIs; fine because this
    ///    thread always enters the kernel to wait).
    /// 3. A plain ring.
    pub fn new(entries: u32) -> io::Result<Self> {
        let deferred = IoUring::builder()
            .setup_submit_all()
            .setup_coop_taskrun()
            .setup_taskrun_flag()
            .setup_single_issuer()
            .setup_defer_taskrun()
            .setup_r_disabled()
            .build(entries);
        let refused = |e: &io::Error| e.raw_os_error() == Some(libc::EINVAL) && entries > 0;
        let (ring, defer) = match deferred {
            Ok(ring) => (ring, true),
            Err(e) if refused(&e) => {
                match IoUring::builder()
                    .setup_submit_all()
                    .setup_coop_taskrun()
                    .build(entries)
                {
                    Ok(ring) => (ring, false),
                    Err(e) if refused(&e) => (IoUring::new(entries)?, false),
                    Err(e) => return Err(e),
                }
            }
            Err(e) => return Err(e),
        };
        let capacity = ring.params().sq_entries() as usize;
        Ok(Self {
            ring,
            capacity,
            files: HashMap::new(),
            next_file: 0,
            generation: 0,
            quarantine: HashMap::new(),
            in_flight: 0,
            running: VecDeque::new(),
            next_batch: 0,
            eventfd: None,
            cqes: Vec::new(),
            kernel_waits: 0,
            defer,
            disabled: defer,
            fixed: Vec::new(),
            fixed_writes: 0,
        })
    }

    /// Registers `regions` as the ring's fixed buffers (at most
    /// [`FIXED_REGIONS_MAX`]; once per ring), so writes from them skip
    /// per-I/O page pinning. Returns whether they were registered: when the
    /// kernel refuses (or the call comes too late: a registration exists,
    /// ops are in flight), writes stay plain and a warning says why.
    pub fn register_fixed_buffers(&mut self, regions: Vec<FixedRegion>) -> bool {
        let refused = if !self.fixed.is_empty() {
            Some("fixed buffers are registered already".to_owned())
        } else if self.in_flight > 0 || !self.running.is_empty() {
            Some("ops are in flight".to_owned())
        } else if regions.len() > FIXED_REGIONS_MAX {
            Some(format!(
                "{} regions, at most {FIXED_REGIONS_MAX}",
                regions.len()
            ))
        } else {
            let iovecs: Vec<libc::iovec> = regions
                .iter()
                .map(|r| {
                    let (ptr, len) = r.as_raw();
                    libc::iovec {
                        iov_base: ptr.cast_mut().cast(),
                        iov_len: len,
                    }
                })
                .collect();
            // SAFETY: every iovec names a live allocation that `self.fixed`
            // keeps alive (each FixedRegion holds its pool's arena) for as
            // long as the ring, which is what the registration needs.
            match unsafe { self.ring.submitter().register_buffers(&iovecs) } {
                Ok(()) => None,
                Err(e) => Some(format!("the kernel refused: {e}")),
            }
        };
        match refused {
            Some(reason) => {
                tracing::warn!(%reason, "fixed buffers not registered: writes pin pages per I/O");
                false
            }
            None => {
                self.fixed = regions;
                true
            }
        }
    }

    /// Write submissions that went as WRITE_FIXED (from a registered
    /// region) so far.
    pub fn fixed_writes(&self) -> u64 {
        self.fixed_writes
    }

    /// Whether the kernel defers completions to this thread's enters
    /// (DEFER_TASKRUN; see the module docs): false on kernels before 6.1.
    pub fn defers_completions(&self) -> bool {
        self.defer
    }

    /// Enables a ring created disabled, which binds it to this thread (the
    /// single issuer). Every path into the ring calls it first.
    fn enable(&mut self) -> io::Result<()> {
        if self.disabled {
            self.ring.submitter().register_enable_rings()?;
            self.disabled = false;
        }
        Ok(())
    }

    /// [`UringBackend::new`] with [`DEFAULT_ENTRIES`].
    pub fn with_default_entries() -> io::Result<Self> {
        Self::new(DEFAULT_ENTRIES)
    }

    /// The SQ size: the most ops in flight at once and the longest chain.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// How many times a blocking `submit` waited in the kernel for
    /// completions so far (each a sleep and a wakeup of this thread).
    pub fn kernel_waits(&self) -> u64 {
        self.kernel_waits
    }

    fn insert_fd(&mut self, fd: OwnedFd) -> FileId {
        while self.files.contains_key(&self.next_file) {
            self.next_file = self.next_file.wrapping_add(1);
        }
        let id = self.next_file;
        self.next_file = self.next_file.wrapping_add(1);
        self.files.insert(id, fd);
        FileId(id)
    }

    /// Takes the descriptors that completed [`Op::Open`]s into the table:
    /// their results become [`FileId`] numbers.
    fn adopt_opened(&mut self, completions: &mut [Completion]) {
        for c in completions.iter_mut() {
            let raw = match (&c.op, &c.result) {
                (Op::Open { .. }, Ok(raw)) => *raw,
                _ => continue,
            };
            c.result = match RawFd::try_from(raw) {
                Ok(fd) => {
                    // SAFETY: the kernel's openat returned this fresh
                    // descriptor to this ring; nothing else owns it.
                    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
                    Ok(self.insert_fd(fd).0 as usize)
                }
                Err(_) => Err(io::Error::other(format!("openat returned {raw}"))),
            };
        }
    }

    /// Runs one op as its own ring submission and waits for it: the
    /// synchronous metadata methods, so even they make no filesystem
    /// syscall on the calling thread.
    fn run_one(&mut self, op: Op) -> io::Result<Completion> {
        let c = super::only(self.submit(vec![Sqe::new(op)]))?;
        debug_assert!(!matches!(c.op, Op::Write { .. } | Op::Read { .. }));
        Ok(c)
    }

    /// Registers `fd` (an eventfd the caller keeps open while the backend
    /// lives) to be signalled when [`IoBackend::reap`] may have finished
    /// batches (see the module docs). At most one; registering again fails
    /// with `EBUSY`.
    pub fn register_eventfd(&mut self, fd: RawFd) -> io::Result<()> {
        self.enable()?;
        self.ring.submitter().register_eventfd(fd)?;
        self.eventfd = Some(fd);
        Ok(())
    }

    /// A user_data tag no running batch uses.
    fn next_tag(&mut self) -> u32 {
        loop {
            self.generation = self.generation.wrapping_add(1);
            let tag = self.generation;
            if !self.running.iter().any(|(_, b)| b.tag == tag) {
                return tag;
            }
        }
    }

    /// Adds one to the registered eventfd.
    fn signal(&self) {
        let Some(fd) = self.eventfd else { return };
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a valid buffer; the caller keeps the
        // descriptor open while it is registered.
        let n = unsafe { libc::write(fd, one.as_ptr().cast(), one.len()) };
        if n != 8 {
            // Only fails if the counter would overflow (already signalled).
            tracing::trace!("eventfd write returned {n}");
        }
    }

    /// Pushes `batch`'s waiting chains into the SQ while they fit under the
    /// in-flight bound. Returns whether every waiting chain was pushed.
    fn push_chains(&mut self, batch: &mut Batch) -> bool {
        let cap = self.capacity;
        // The SQ itself always has room: unconsumed SQEs are counted in flight.
        while let Some(members) = batch.pending.pop_front() {
            if self.in_flight + members.len() > cap {
                batch.pending.push_front(members);
                return false;
            }
            let tag = batch.tag;
            let entries: Vec<squeue::Entry> = members
                .iter()
                .enumerate()
                .map(|(pos, &i)| {
                    let link = pos + 1 < members.len();
                    let entry = build_entry(
                        (&self.files, &self.fixed),
                        &mut batch.slots[i],
                        user_data(tag, i),
                        link,
                    );
                    self.fixed_writes += u64::from(entry.1);
                    entry.0
                })
                .collect();
            // SAFETY: every pointer in `entries` points into memory owned by
            // `batch.slots` (the AlignedBuf inside the slot's Op, or the slot's
            // path CStrings), whose heap allocations do not move when a Slot
            // or the Batch moves. A slot is marked in flight below and its Op
            // is not handed out or dropped until its CQE has been reaped; if
            // the batch is abandoned first, `abandon` moves the memory into
            // `self.quarantine`, which lives until that CQE arrives or is
            // leaked on drop (running batches are leaked on drop too). File
            // descriptors are looked up now; the kernel takes its own
            // reference when it issues the op.
            let pushed = unsafe { self.ring.submission().push_multiple(&entries) };
            if pushed.is_err() {
                batch.pending.push_front(members);
                return false;
            }
            let chain = batch.chains.len();
            for &i in &members {
                batch.slots[i].in_flight = true;
                batch.slots[i].chain = chain;
            }
            batch.in_flight += members.len();
            self.in_flight += members.len();
            batch.chains.push(Chain {
                outstanding: members.len(),
                members,
            });
        }
        true
    }

    /// Pushes the waiting chains of the running batches, oldest first,
    /// stopping at the first that does not fit (no batch overtakes an older
    /// one). Returns whether everything waiting was pushed.
    fn push_running(&mut self) -> bool {
        let mut running = std::mem::take(&mut self.running);
        let mut all = true;
        for (_, batch) in running.iter_mut() {
            if !self.push_chains(batch) {
                all = false;
                break;
            }
        }
        debug_assert!(self.running.is_empty());
        self.running = running;
        all
    }

    /// Takes every CQE off the ring and applies it to its batch: `sync` (the
    /// batch a `submit` call runs) or a running one.
    fn drain_cq(&mut self, mut sync: Option<&mut Batch>) {
        let mut cqes = std::mem::take(&mut self.cqes);
        cqes.extend(
            self.ring
                .completion()
                .map(|cqe| (cqe.user_data(), cqe.result())),
        );
        for &(ud, res) in &cqes {
            let tag = (ud >> 32) as u32;
            let index = (ud & u64::from(u32::MAX)) as usize;
            let batch = match sync.as_deref_mut() {
                Some(b) if b.tag == tag => Some(b),
                _ => self
                    .running
                    .iter_mut()
                    .map(|(_, b)| b)
                    .find(|b| b.tag == tag),
            };
            match batch {
                Some(batch) => {
                    if batch.complete(index, res) {
                        self.in_flight -= 1;
                    } else {
                        tracing::warn!(user_data = ud, "unexpected io_uring completion");
                    }
                }
                None => {
                    // Late completion of an abandoned op: its memory is free now.
                    if self.quarantine.remove(&ud).is_none() {
                        tracing::warn!(user_data = ud, "unexpected io_uring completion");
                    }
                }
            }
        }
        cqes.clear();
        self.cqes = cqes;
    }

    /// Blocks in the ring until every op of the running batches that is in
    /// the kernel now has completed, or `timeout` passed (or a signal came),
    /// then does what [`IoBackend::reap`] does. One `io_uring_enter` instead
    /// of a sleep on the eventfd and a reap: with deferred completions the
    /// kernel runs the deferred work (e.g. submits the fdatasync linked
    /// behind a finished write) inside this wait, so the thread returns
    /// to user space once per group commit, not once per completion.
    ///
    /// Returns at once when nothing is in flight. A batch may still be
    /// unfinished afterwards (a short write resubmitted, chains waiting for
    /// room, a timeout): callers loop until `reap` handed theirs back.
    pub fn wait_and_reap(
        &mut self,
        timeout: std::time::Duration,
    ) -> Vec<(BatchId, Vec<Completion>)> {
        self.pump();
        // Every entry in the kernel posts exactly one CQE (none skips it).
        let want = self.in_flight;
        if want > 0 {
            let ts = types::Timespec::from(timeout);
            let args = types::SubmitArgs::new().timespec(&ts);
            match self.ring.submitter().submit_with_args(want, &args) {
                Ok(_) => self.kernel_waits += 1,
                // Timed out or interrupted: reap what there is.
                Err(e) if matches!(e.raw_os_error(), Some(libc::ETIME | libc::EINTR)) => {}
                // EBUSY/EAGAIN: the CQ is full; reaping below makes room.
                Err(e) if matches!(e.raw_os_error(), Some(libc::EBUSY | libc::EAGAIN)) => {}
                Err(e) => {
                    tracing::error!(error = %e, "io_uring_enter failed; failing the running batches");
                    self.abandon_running(&e);
                }
            }
        }
        self.reap()
    }

    /// Runs the completions the kernel deferred to this thread (DEFER_TASKRUN)
    /// and applies the CQEs they posted, entering again while the kernel
    /// flags work left over: it runs only a bounded number per enter and
    /// sends no further eventfd signal for the rest (see the module docs).
    ///
    /// Bound: every op in flight defers at most two items (its completion,
    /// and its own submission when it follows a link) and every enter runs at
    /// least one, so `2 * capacity` enters drain what ops in flight can
    /// produce; past twice that the backend stops and signals the eventfd so
    /// the reaper comes back instead of looping.
    fn run_deferred(&mut self) {
        if !self.defer {
            return;
        }
        let enters_max = 4 * self.capacity.max(1);
        let mut enters = 0usize;
        let mut busy = 0u32;
        while self.ring.submission().taskrun() {
            if enters == enters_max {
                tracing::warn!(
                    enters,
                    "io_uring: deferred work still pending; rescheduling the reaper"
                );
                self.signal();
                return;
            }
            enters += 1;
            // SAFETY: submits nothing (to_submit 0) and passes no argument;
            // min_complete 0 never sleeps.
            let res = unsafe {
                self.ring
                    .submitter()
                    .enter::<libc::sigset_t>(0, 0, IORING_ENTER_GETEVENTS, None)
            };
            if let Err(e) = res {
                match e.raw_os_error() {
                    Some(libc::EINTR) => {}
                    Some(libc::EBUSY) | Some(libc::EAGAIN) if busy < ENTER_BUSY_LIMIT => {
                        busy += 1;
                        std::thread::yield_now();
                    }
                    _ => {
                        tracing::error!(error = %e, "io_uring_enter failed; failing the running batches");
                        self.abandon_running(&e);
                        return;
                    }
                }
            }
            self.drain_cq(None);
        }
    }

    /// Submits what the running batches have waiting, without waiting for
    /// completions. A ring failure fails every running batch.
    fn pump(&mut self) {
        if let Err(e) = self.enable() {
            tracing::error!(error = %e, "io_uring: enabling the ring failed; failing the running batches");
            self.abandon_running(&e);
            return;
        }
        let mut busy = 0u32;
        loop {
            self.push_running();
            if self.ring.submission().is_empty() {
                return;
            }
            match self.ring.submit() {
                Ok(_) => busy = 0,
                Err(e) => match e.raw_os_error() {
                    Some(libc::EINTR) => {}
                    Some(libc::EBUSY) | Some(libc::EAGAIN) if busy < ENTER_BUSY_LIMIT => {
                        busy += 1;
                        std::thread::yield_now();
                        self.drain_cq(None);
                    }
                    _ => {
                        tracing::error!(error = %e, "io_uring_enter failed; failing the running batches");
                        self.abandon_running(&e);
                        return;
                    }
                },
            }
        }
    }

    /// Fails every running batch after a ring failure and wakes the reaper.
    fn abandon_running(&mut self, err: &io::Error) {
        let mut running = std::mem::take(&mut self.running);
        for (_, batch) in running.iter_mut() {
            self.abandon(batch, err);
        }
        self.running = running;
        self.signal();
    }

    /// Gives up on every unfinished op of the batch after a ring failure.
    fn abandon(&mut self, batch: &mut Batch, err: &io::Error) {
        let generation = batch.tag;
        for (i, slot) in batch.slots.iter_mut().enumerate() {
            if slot.result.is_some() {
                continue;
            }
            if slot.in_flight {
                // The kernel may still read or write this op's memory: keep it.
                let buf = match &mut slot.op {
                    Op::Write { buf, .. } | Op::Read { buf, .. } => {
                        Some(std::mem::replace(buf, AlignedBuf::new(0)))
                    }
                    _ => None,
                };
                let paths = std::mem::replace(&mut slot.paths, CPaths::None);
                self.quarantine.insert(
                    user_data(generation, i),
                    Quarantined {
                        _buf: buf,
                        _paths: paths,
                        _stat: slot.stat.take(),
                    },
                );
                slot.in_flight = false;
            }
            slot.result = Some(Err(copy_err(err)));
        }
        // Abandoned ops no longer count against the bound (as before the
        // failure, a later completion of theirs only frees their memory).
        self.in_flight = self.in_flight.saturating_sub(batch.in_flight);
        batch.in_flight = 0;
        batch.pending.clear();
    }
}

impl Drop for UringBackend {
    fn drop(&mut self) {
        // Ops the kernel may still be running: leak their memory rather than
        // let it be reused under them.
        for (_, batch) in std::mem::take(&mut self.running) {
            if batch.in_flight > 0 {
                std::mem::forget(batch);
            }
        }
        if !self.quarantine.is_empty() {
            std::mem::forget(std::mem::take(&mut self.quarantine));
        }
    }
}

impl IoBackend for UringBackend {
    fn open_file(&mut self, path: &Path, mode: OpenMode) -> io::Result<FileId> {
        self.run_one(Op::Open {
            path: path.into(),
            mode,
            dir: false,
        })?
        .opened()
    }

    fn open_dir(&mut self, path: &Path) -> io::Result<FileId> {
        self.run_one(Op::Open {
            path: path.into(),
            mode: OpenMode::Existing,
            dir: true,
        })?
        .opened()
    }

    fn close(&mut self, file: FileId) {
        // Dropping the OwnedFd closes it.
        self.files.remove(&file.0);
    }

    fn create_dir(&mut self, path: &Path) -> io::Result<()> {
        self.run_one(Op::MakeDir { path: path.into() })?
            .result
            .map(|_| ())
    }

    /// getdents has no ring op: a plain call, for startup and helper threads.
    fn list_dir(&mut self, path: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(path)? {
            let name = entry?.file_name();
            match name.into_string() {
                Ok(name) => names.push(name),
                Err(name) => tracing::warn!(?name, dir = ?path, "skipping non-UTF-8 name"),
            }
        }
        Ok(names)
    }

    fn exists(&mut self, path: &Path) -> io::Result<bool> {
        let found = self.run_one(Op::Exists { path: path.into() })?.result?;
        Ok(found != 0)
    }

    fn file_size(&mut self, file: FileId) -> io::Result<u64> {
        let size = self.run_one(Op::FileSize { file })?.result?;
        Ok(size as u64)
    }

    fn allocate_range(&mut self, file: FileId, offset: u64, len_bytes: u64) -> io::Result<()> {
        let too_large = |_| io::Error::new(io::ErrorKind::InvalidInput, "allocation too large");
        libc::off_t::try_from(len_bytes).map_err(too_large)?;
        libc::off_t::try_from(offset.saturating_add(len_bytes)).map_err(too_large)?;
        if len_bytes == 0 {
            return Ok(());
        }
        let op = Op::Allocate {
            file,
            offset,
            len_bytes,
        };
        self.run_one(op)?.result.map(|_| ())
    }

    fn submit(&mut self, batch: Vec<Sqe>) -> Vec<Completion> {
        if batch.is_empty() {
            return Vec::new();
        }
        let tag = self.next_tag();
        let mut batch = Batch::new(tag, batch, self.capacity);
        if let Err(e) = self.enable() {
            tracing::error!(error = %e, "io_uring: enabling the ring failed; failing the batch");
            self.abandon(&mut batch, &e);
            return batch.into_completions();
        }
        let mut busy = 0u32;
        loop {
            // Older (asynchronous) batches' waiting chains go first.
            let all_pushed = self.push_running() && self.push_chains(&mut batch);
            if batch.is_done() {
                break;
            }
            // Something is in flight: this batch's ops, or ops of running
            // batches that must finish before this batch's chains fit (a
            // chain never exceeds the ring, so it fits into an idle ring).
            debug_assert!(self.in_flight > 0);
            // Everything queued is in the kernel: one wait for all of this
            // batch (every entry in flight yields a CQE, a cancelled one
            // too), so a flush is one wakeup, not one per op. Otherwise the
            // first completion may make room for what waits.
            let wanted = if all_pushed {
                batch.in_flight.max(1)
            } else {
                1
            };
            match self.ring.submit_and_wait(wanted) {
                Ok(_) => {
                    busy = 0;
                    self.kernel_waits += 1;
                }
                Err(e) => match e.raw_os_error() {
                    Some(libc::EINTR) => {}
                    Some(libc::EBUSY) | Some(libc::EAGAIN) if busy < ENTER_BUSY_LIMIT => {
                        busy += 1;
                        std::thread::yield_now();
                    }
                    _ => {
                        tracing::error!(error = %e, "io_uring_enter failed; failing the batch");
                        self.abandon(&mut batch, &e);
                        self.abandon_running(&e);
                        break;
                    }
                },
            }
            self.drain_cq(Some(&mut batch));
        }
        // Continuations of running batches queued by the completions above.
        self.pump();
        // With deferred completions, the CQEs of asynchronous batches this
        // call took were posted by its own enters: tell the reaper rather
        // than rely on the kernel's signal for them.
        if self.defer && self.running.iter().any(|(_, b)| b.is_done()) {
            self.signal();
        }
        let mut completions = batch.into_completions();
        self.adopt_opened(&mut completions);
        completions
    }

    /// Queues `batch` and submits as much of it as the in-flight bound allows,
    /// without waiting for any of it. The rest, and every continuation or
    /// retry, is submitted by later [`IoBackend::reap`] (or `submit`) calls,
    /// so the caller must call `reap` when the eventfd fires (or regularly)
    /// until it returned this batch. The buffers and paths of the ops stay
    /// owned by the backend until then.
    fn submit_nowait(&mut self, batch: Vec<Sqe>) -> BatchId {
        let id = BatchId(self.next_batch);
        self.next_batch += 1;
        let tag = self.next_tag();
        let batch = Batch::new(tag, batch, self.capacity);
        let finished = batch.is_done();
        self.running.push_back((id, batch));
        if finished {
            // Nothing for the kernel to complete: wake the reaper ourselves.
            self.signal();
        } else {
            self.pump();
        }
        id
    }

    /// Batches may finish in any order; those of one call come in submission
    /// order. It reaps what the kernel completed, resubmits continuations and
    /// retries, and returns.
    fn reap_waiting(&mut self, timeout: std::time::Duration) -> Vec<(BatchId, Vec<Completion>)> {
        self.wait_and_reap(timeout)
    }

    fn reap(&mut self) -> Vec<(BatchId, Vec<Completion>)> {
        self.run_deferred();
        self.drain_cq(None);
        self.pump();
        let mut done = Vec::new();
        let mut keep = VecDeque::with_capacity(self.running.len());
        for (id, batch) in self.running.drain(..) {
            if batch.is_done() {
                done.push((id, batch.into_completions()));
            } else {
                keep.push_back((id, batch));
            }
        }
        self.running = keep;
        for (_, completions) in done.iter_mut() {
            self.adopt_opened(completions);
        }
        done
    }

    fn batches_running(&self) -> usize {
        self.running.len()
    }
}

/// One batch while it runs: its ops, the chains waiting to be (re)submitted
/// and the chains in the kernel.
struct Batch {
    /// High half of the user_data of its entries.
    tag: u32,
    slots: Vec<Slot>,
    /// Chains (whole, or continuations after a short or interrupted op)
    /// waiting for room in the ring, in order.
    pending: VecDeque<Vec<usize>>,
    chains: Vec<Chain>,
    /// Entries of this batch in the kernel.
    in_flight: usize,
}

impl Batch {
    fn new(tag: u32, batch: Vec<Sqe>, cap: usize) -> Self {
        let mut slots: Vec<Slot> = batch.into_iter().map(Slot::new).collect();
        let mut pending: VecDeque<Vec<usize>> = VecDeque::new();
        let mut start = 0;
        for i in 0..slots.len() {
            if !slots[i].link_next || i + 1 == slots.len() {
                plan_chain(&mut slots, (start..=i).collect(), cap, &mut pending);
                start = i + 1;
            }
        }
        Self {
            tag,
            slots,
            pending,
            chains: Vec::new(),
            in_flight: 0,
        }
    }

    /// Every op has its final result.
    fn is_done(&self) -> bool {
        self.in_flight == 0 && self.pending.is_empty()
    }

    /// Applies the CQE of entry `index`; once its chain has completed as a
    /// whole, finishes its ops or queues continuations. False if the entry
    /// is not in flight (unexpected completion).
    fn complete(&mut self, index: usize, res: i32) -> bool {
        let Some(slot) = self.slots.get_mut(index).filter(|s| s.in_flight) else {
            return false;
        };
        slot.in_flight = false;
        slot.cqe = Some(res);
        let c = slot.chain;
        self.in_flight -= 1;
        let chain = &mut self.chains[c];
        chain.outstanding -= 1;
        if chain.outstanding == 0 {
            let members = std::mem::take(&mut chain.members);
            process_chain(&mut self.slots, &members, &mut self.pending);
        }
        true
    }

    fn into_completions(self) -> Vec<Completion> {
        self.slots
            .into_iter()
            .map(|slot| Completion {
                op: slot.op,
                result: slot
                    .result
                    .unwrap_or_else(|| Err(io::Error::other("io_uring: op never completed"))),
            })
            .collect()
    }
}

/// Path arguments of an op as C strings, alive until the op completes.
enum CPaths {
    None,
    One(CString),
    Two(CString, CString),
}

/// Per-op state while a batch runs.
struct Slot {
    op: Op,
    link_next: bool,
    paths: CPaths,
    /// The statx buffer of [`Op::FileSize`] and [`Op::Exists`], alive until
    /// the op completes.
    stat: Option<Box<libc::statx>>,
    /// An error found before submission (bad argument); the op is not run.
    preset: Option<io::Error>,
    /// Bytes of a read/write done so far.
    done: usize,
    /// Length of the latest read/write submission.
    requested: usize,
    /// EINTR/EAGAIN resubmissions so far.
    tries: u32,
    in_flight: bool,
    chain: usize,
    /// Result of the latest submission, until its chain is processed.
    cqe: Option<i32>,
    result: Option<io::Result<usize>>,
}

impl Slot {
    fn new(sqe: Sqe) -> Self {
        let mut preset = None;
        let paths = match &sqe.op {
            Op::Rename { from, to } => match (c_path(from), c_path(to)) {
                (Ok(from), Ok(to)) => CPaths::Two(from, to),
                (Err(e), _) | (_, Err(e)) => {
                    preset = Some(e);
                    CPaths::None
                }
            },
            Op::Unlink { path }
            | Op::RemoveDir { path }
            | Op::Open { path, .. }
            | Op::Exists { path }
            | Op::MakeDir { path } => match c_path(path) {
                Ok(path) => CPaths::One(path),
                Err(e) => {
                    preset = Some(e);
                    CPaths::None
                }
            },
            Op::Read { len, buf, .. } if *len > buf.capacity() => {
                preset = Some(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("read of {len} bytes into a {} byte buffer", buf.capacity()),
                ));
                CPaths::None
            }
            // statx of the descriptor itself (AT_EMPTY_PATH).
            Op::FileSize { .. } => CPaths::One(CString::default()),
            _ => CPaths::None,
        };
        let stat = matches!(sqe.op, Op::FileSize { .. } | Op::Exists { .. })
            // SAFETY: statx is plain data; all zeroes is a valid value.
            .then(|| Box::new(unsafe { std::mem::zeroed::<libc::statx>() }));
        Self {
            op: sqe.op,
            link_next: sqe.link_next,
            paths,
            stat,
            preset,
            done: 0,
            requested: 0,
            tries: 0,
            in_flight: false,
            chain: 0,
            cqe: None,
            result: None,
        }
    }

    fn is_rw(&self) -> bool {
        matches!(self.op, Op::Write { .. } | Op::Read { .. })
    }
}

struct Chain {
    members: Vec<usize>,
    outstanding: usize,
}

fn user_data(generation: u32, index: usize) -> u64 {
    (u64::from(generation) << 32) | index as u64
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
}

fn copy_err(err: &io::Error) -> io::Error {
    match err.raw_os_error() {
        Some(code) => io::Error::from_raw_os_error(code),
        None => io::Error::new(err.kind(), err.to_string()),
    }
}

fn cancelled() -> io::Error {
    io::Error::from_raw_os_error(libc::ECANCELED)
}

/// Queues a chain of the batch, or fails it up front: too long for the ring,
/// or holding a read/write with a bad argument (which, like on the kernel,
/// cancels the links after it).
fn plan_chain(
    slots: &mut [Slot],
    mut members: Vec<usize>,
    cap: usize,
    pending: &mut VecDeque<Vec<usize>>,
) {
    if members.len() > cap {
        for &i in &members {
            slots[i].result = Some(Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "link chain of {} ops is longer than the ring ({cap} entries)",
                    members.len()
                ),
            )));
        }
        return;
    }
    if let Some(k) = members
        .iter()
        .position(|&i| slots[i].preset.is_some() && slots[i].is_rw())
    {
        let i = members[k];
        slots[i].result = slots[i].preset.take().map(Err);
        for &j in &members[k + 1..] {
            slots[j].result = Some(Err(cancelled()));
        }
        members.truncate(k);
    }
    if !members.is_empty() {
        pending.push_back(members);
    }
}

/// Builds the SQE for the next submission of `slot`, and whether it is a
/// WRITE_FIXED (from one of the `fixed` regions, by index).
fn build_entry(
    (files, fixed): (&HashMap<u32, OwnedFd>, &[FixedRegion]),
    slot: &mut Slot,
    user_data: u64,
    link: bool,
) -> (squeue::Entry, bool) {
    let mut is_fixed = false;
    // An unknown FileId becomes fd -1 so the kernel fails it with EBADF, with
    // the usual link semantics.
    let fd = |file: &FileId| types::Fd(files.get(&file.0).map_or(-1, |fd| fd.as_raw_fd()));
    let Slot {
        op,
        paths,
        stat,
        preset,
        done,
        requested,
        ..
    } = slot;
    let statx_buf = |stat: &mut Option<Box<libc::statx>>| {
        stat.as_mut().map_or(std::ptr::null_mut(), |b| {
            (&mut **b as *mut libc::statx).cast::<types::statx>()
        })
    };
    let entry = match (op, &*paths) {
        _ if preset.is_some() => opcode::Nop::new().build(),
        (Op::Write { file, offset, buf }, _) => {
            let len = (buf.len() - *done).min(MAX_CHUNK);
            *requested = len;
            // SAFETY: done <= buf.len(), so the pointer stays inside the buffer.
            let ptr = unsafe { buf.as_ptr().add(*done) };
            let offset = *offset + *done as u64;
            match fixed.iter().position(|r| r.contains(ptr, len)) {
                Some(index) => {
                    is_fixed = true;
                    // FIXED_REGIONS_MAX keeps the index in a u16.
                    opcode::WriteFixed::new(fd(file), ptr, len as u32, index as u16)
                        .offset(offset)
                        .build()
                }
                None => opcode::Write::new(fd(file), ptr, len as u32)
                    .offset(offset)
                    .build(),
            }
        }
        (
            Op::Read {
                file,
                offset,
                len,
                buf,
            },
            _,
        ) => {
            let want = (*len - *done).min(MAX_CHUNK);
            *requested = want;
            // SAFETY: done <= len <= buf.capacity(), so the pointer stays inside
            // the buffer and `want` more bytes fit.
            let ptr = unsafe { buf.as_mut_ptr().add(*done) };
            opcode::Read::new(fd(file), ptr, want as u32)
                .offset(*offset + *done as u64)
                .build()
        }
        (Op::Fdatasync { file }, _) => opcode::Fsync::new(fd(file))
            .flags(types::FsyncFlags::DATASYNC)
            .build(),
        (Op::Fsync { file }, _) => opcode::Fsync::new(fd(file)).build(),
        (Op::Rename { .. }, CPaths::Two(from, to)) => opcode::RenameAt::new(
            types::Fd(libc::AT_FDCWD),
            from.as_ptr(),
            types::Fd(libc::AT_FDCWD),
            to.as_ptr(),
        )
        .build(),
        (Op::Unlink { .. }, CPaths::One(path)) => {
            opcode::UnlinkAt::new(types::Fd(libc::AT_FDCWD), path.as_ptr()).build()
        }
        (Op::RemoveDir { .. }, CPaths::One(path)) => {
            opcode::UnlinkAt::new(types::Fd(libc::AT_FDCWD), path.as_ptr())
                .flags(libc::AT_REMOVEDIR)
                .build()
        }
        (Op::Open { mode, dir, .. }, CPaths::One(path)) => {
            opcode::OpenAt::new(types::Fd(libc::AT_FDCWD), path.as_ptr())
                .flags(open_flags(*mode, *dir))
                .mode(0o644)
                .build()
        }
        (
            Op::Allocate {
                file,
                offset,
                len_bytes,
            },
            _,
        ) => opcode::Fallocate::new(fd(file), *len_bytes)
            .offset(*offset)
            .build(),
        (Op::FileSize { file }, CPaths::One(empty)) => {
            opcode::Statx::new(fd(file), empty.as_ptr(), statx_buf(stat))
                .flags(libc::AT_EMPTY_PATH)
                .mask(libc::STATX_SIZE)
                .build()
        }
        (Op::Exists { .. }, CPaths::One(path)) => {
            opcode::Statx::new(types::Fd(libc::AT_FDCWD), path.as_ptr(), statx_buf(stat)).build()
        }
        (Op::MakeDir { .. }, CPaths::One(path)) => {
            opcode::MkDirAt::new(types::Fd(libc::AT_FDCWD), path.as_ptr())
                .mode(0o755)
                .build()
        }
        // Path ops always carry their paths unless they have a preset error.
        _ => opcode::Nop::new().build(),
    };
    let entry = if link {
        entry.flags(squeue::Flags::IO_LINK)
    } else {
        entry
    };
    (entry.user_data(user_data), is_fixed)
}

/// What to do with an op after one of its submissions completed.
#[derive(Debug, PartialEq)]
enum Next {
    /// Finished. `resubmit_run`: the kernel cancelled the links after it
    /// because it was short, but it succeeded (read up to end of file), so the
    /// cancelled ops go on.
    Done { resubmit_run: bool },
    /// Submit it again (a read or write: remainder or retry), with the links
    /// the kernel cancelled after it following it in the new chain.
    Again,
}

/// Applies one completion to `slot`; sets `slot.result` when it is final.
fn evaluate(slot: &mut Slot, res: i32) -> Next {
    if let Some(err) = slot.preset.take() {
        slot.result = Some(Err(err));
        return Next::Done {
            resubmit_run: false,
        };
    }
    let is_rw = slot.is_rw();
    if res == -libc::ENOENT && matches!(slot.op, Op::Exists { .. }) {
        slot.result = Some(Ok(0));
        return Next::Done {
            resubmit_run: false,
        };
    }
    if res < 0 {
        let errno = -res;
        // Only a read or write is retried: its failure cancelled the links
        // behind it, which go again after it, in order. A failed fsync,
        // rename or unlink did not cancel them, so they already ran; a retry
        // would complete out of order (and a retried fsync may report success
        // for dirty pages the failed one dropped). Those fail as they are.
        if is_rw && (errno == libc::EINTR || errno == libc::EAGAIN) && slot.tries < RETRY_LIMIT {
            slot.tries += 1;
            tracing::debug!(op = slot.op.kind(), errno, tries = slot.tries, "retrying");
            return Next::Again;
        }
        slot.result = Some(Err(io::Error::from_raw_os_error(errno)));
        return Next::Done {
            resubmit_run: false,
        };
    }
    let n = res as usize;
    let short = n < slot.requested;
    match &mut slot.op {
        Op::Write { buf, .. } => {
            slot.done += n;
            if slot.done >= buf.len() {
                slot.result = Some(Ok(buf.len()));
                Next::Done {
                    resubmit_run: false,
                }
            } else if n == 0 {
                slot.result = Some(Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    format!("write stopped after {} of {} bytes", slot.done, buf.len()),
                )));
                Next::Done {
                    resubmit_run: false,
                }
            } else {
                Next::Again
            }
        }
        Op::Read { len, buf, .. } => {
            slot.done += n;
            if slot.done >= *len || n == 0 {
                slot.done = slot.done.min(*len);
                buf.set_len(slot.done);
                slot.result = Some(Ok(slot.done));
                Next::Done {
                    resubmit_run: short,
                }
            } else {
                Next::Again
            }
        }
        // The raw descriptor: the backend adopts it into its table when it
        // hands the completion back (`UringBackend::adopt_opened`).
        Op::Open { .. } => {
            slot.result = Some(Ok(n));
            Next::Done {
                resubmit_run: false,
            }
        }
        Op::FileSize { .. } => {
            let size = slot.stat.as_ref().map(|st| st.stx_size);
            slot.result =
                Some(size.map(|s| s as usize).ok_or_else(|| {
                    io::Error::other("io_uring: statx completed without its buffer")
                }));
            Next::Done {
                resubmit_run: false,
            }
        }
        Op::Exists { .. } => {
            slot.result = Some(Ok(1));
            Next::Done {
                resubmit_run: false,
            }
        }
        _ => {
            slot.result = Some(Ok(0));
            Next::Done {
                resubmit_run: false,
            }
        }
    }
}

/// Flags of an [`Op::Open`] (and of the synchronous opens before it).
fn open_flags(mode: OpenMode, dir: bool) -> libc::c_int {
    if dir {
        return libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC;
    }
    let create = if mode == OpenMode::Create {
        libc::O_CREAT
    } else {
        0
    };
    libc::O_RDWR | libc::O_DIRECT | libc::O_CLOEXEC | create
}

/// The members at the start of `rest` that the kernel cancelled.
fn cancelled_run(slots: &mut [Slot], rest: &[usize]) -> Vec<usize> {
    let run: Vec<usize> = rest
        .iter()
        .copied()
        .take_while(|&j| slots[j].cqe == Some(-libc::ECANCELED))
        .collect();
    for &j in &run {
        slots[j].cqe = None;
    }
    run
}

/// Handles a chain whose every member has completed: finishes ops, and queues
/// continuations, retries and the links that were cancelled only because of a
/// short or interrupted read/write.
fn process_chain(slots: &mut [Slot], members: &[usize], pending: &mut VecDeque<Vec<usize>>) {
    let mut k = 0;
    while k < members.len() {
        let i = members[k];
        k += 1;
        let Some(res) = slots[i].cqe.take() else {
            slots[i].result = Some(Err(io::Error::other("io_uring: missing completion")));
            continue;
        };
        match evaluate(&mut slots[i], res) {
            Next::Done { resubmit_run } => {
                if resubmit_run {
                    let run = cancelled_run(slots, &members[k..]);
                    k += run.len();
                    if !run.is_empty() {
                        pending.push_back(run);
                    }
                }
            }
            Next::Again => {
                let mut chain = vec![i];
                let run = cancelled_run(slots, &members[k..]);
                k += run.len();
                chain.extend(run);
                pending.push_back(chain);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! The chain logic against synthetic completions (short writes and
    //! interrupted ops are hard to provoke on a real file system).

    use super::*;
    use std::path::PathBuf;

    fn write(len: usize, link: bool) -> Slot {
        let mut buf = AlignedBuf::new(len);
        buf.set_len(len);
        Slot::new(Sqe {
            op: Op::Write {
                file: FileId(0),
                offset: 0,
                buf,
            },
            link_next: link,
        })
    }

    fn read(len: usize, link: bool) -> Slot {
        Slot::new(Sqe {
            op: Op::Read {
                file: FileId(0),
                offset: 0,
                len,
                buf: AlignedBuf::new(len),
            },
            link_next: link,
        })
    }

    fn sync(link: bool) -> Slot {
        Slot::new(Sqe {
            op: Op::Fdatasync { file: FileId(0) },
            link_next: link,
        })
    }

    fn rename(link: bool) -> Slot {
        Slot::new(Sqe {
            op: Op::Rename {
                from: PathBuf::from("a"),
                to: PathBuf::from("b"),
            },
            link_next: link,
        })
    }

    /// Simulates submitting `members` and getting `results` back.
    fn complete(slots: &mut [Slot], members: &[usize], results: &[i32]) -> VecDeque<Vec<usize>> {
        let files = HashMap::new();
        for (pos, &i) in members.iter().enumerate() {
            let _ = build_entry((&files, &[]), &mut slots[i], 0, pos + 1 < members.len());
            slots[i].cqe = Some(results[pos]);
        }
        let mut pending = VecDeque::new();
        process_chain(slots, members, &mut pending);
        pending
    }

    fn errno(slot: &Slot) -> Option<i32> {
        slot.result.as_ref()?.as_ref().err()?.raw_os_error()
    }

    #[test]
    fn short_write_resubmits_remainder_with_cancelled_links() {
        let mut slots = vec![write(8192, true), sync(true), rename(false)];
        let cancel = -libc::ECANCELED;
        let pending = complete(&mut slots, &[0, 1, 2], &[4096, cancel, cancel]);
        assert_eq!(pending, [vec![0, 1, 2]]);
        assert!(slots.iter().all(|s| s.result.is_none()));
        assert_eq!(slots[0].done, 4096);
        let pending = complete(&mut slots, &[0, 1, 2], &[4096, 0, 0]);
        assert!(pending.is_empty());
        assert_eq!(slots[0].requested, 4096);
        assert_eq!(*slots[0].result.as_ref().unwrap().as_ref().unwrap(), 8192);
        assert!(slots[1].result.as_ref().unwrap().is_ok());
        assert!(slots[2].result.as_ref().unwrap().is_ok());
    }

    #[test]
    fn write_zero_fails_and_links_stay_cancelled() {
        let mut slots = vec![write(8192, true), sync(false)];
        let pending = complete(&mut slots, &[0, 1], &[0, -libc::ECANCELED]);
        assert!(pending.is_empty());
        let err = slots[0].result.as_ref().unwrap().as_ref().unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::WriteZero);
        assert_eq!(errno(&slots[1]), Some(libc::ECANCELED));
    }

    #[test]
    fn genuine_failure_cancels_links() {
        let mut slots = vec![write(4096, true), sync(true), rename(false)];
        let cancel = -libc::ECANCELED;
        let pending = complete(&mut slots, &[0, 1, 2], &[-libc::EIO, cancel, cancel]);
        assert!(pending.is_empty());
        assert_eq!(errno(&slots[0]), Some(libc::EIO));
        assert_eq!(errno(&slots[1]), Some(libc::ECANCELED));
        assert_eq!(errno(&slots[2]), Some(libc::ECANCELED));
    }

    #[test]
    fn interrupted_write_is_retried_with_links_then_gives_up() {
        let mut slots = vec![write(4096, true), sync(false)];
        let cancel = -libc::ECANCELED;
        for _ in 0..RETRY_LIMIT {
            let pending = complete(&mut slots, &[0, 1], &[-libc::EINTR, cancel]);
            assert_eq!(pending, [vec![0, 1]]);
        }
        let pending = complete(&mut slots, &[0, 1], &[-libc::EAGAIN, cancel]);
        assert!(pending.is_empty());
        assert_eq!(errno(&slots[0]), Some(libc::EAGAIN));
        assert_eq!(errno(&slots[1]), Some(libc::ECANCELED));
    }

    #[test]
    fn interrupted_fsync_fails_and_is_never_retried() {
        // The rename linked behind the fsync already ran when the EINTR came
        // back: retrying the fsync now would let it look as if the rename had
        // waited for it. The failure goes to the caller (who fences).
        for errno_in in [libc::EINTR, libc::EAGAIN] {
            let mut slots = vec![sync(true), rename(false)];
            let pending = complete(&mut slots, &[0, 1], &[-errno_in, 0]);
            assert!(pending.is_empty(), "fsync must not be resubmitted");
            assert_eq!(errno(&slots[0]), Some(errno_in));
            assert!(slots[1].result.as_ref().unwrap().is_ok());
        }
        // Alone in its chain too: a retried fsync may report success for
        // pages a failed one dropped.
        let mut slots = vec![sync(false)];
        let pending = complete(&mut slots, &[0], &[-libc::EINTR]);
        assert!(pending.is_empty());
        assert_eq!(errno(&slots[0]), Some(libc::EINTR));
    }

    #[test]
    fn interrupted_rename_fails_and_is_not_retried_after_its_links() {
        let mut slots = vec![rename(true), sync(false)];
        let pending = complete(&mut slots, &[0, 1], &[-libc::EAGAIN, 0]);
        assert!(pending.is_empty());
        assert_eq!(errno(&slots[0]), Some(libc::EAGAIN));
        assert!(slots[1].result.as_ref().unwrap().is_ok());
    }

    #[test]
    fn failed_rename_does_not_stop_the_chain() {
        let mut slots = vec![rename(true), write(4096, false)];
        let pending = complete(&mut slots, &[0, 1], &[-libc::ENOENT, 4096]);
        assert!(pending.is_empty());
        assert_eq!(errno(&slots[0]), Some(libc::ENOENT));
        assert!(slots[1].result.as_ref().unwrap().is_ok());
    }

    #[test]
    fn short_reads_continue_and_eof_releases_cancelled_links() {
        let mut slots = vec![read(12288, true), write(4096, false)];
        let cancel = -libc::ECANCELED;
        let pending = complete(&mut slots, &[0, 1], &[4096, cancel]);
        assert_eq!(pending, [vec![0, 1]]);
        // End of file: the read is done with 8192 bytes; the write still runs.
        let pending = complete(&mut slots, &[0, 1], &[4096, cancel]);
        assert_eq!(pending, [vec![0, 1]]);
        let pending = complete(&mut slots, &[0, 1], &[0, cancel]);
        assert_eq!(pending, [vec![1]]);
        assert_eq!(*slots[0].result.as_ref().unwrap().as_ref().unwrap(), 8192);
        let Op::Read { buf, .. } = &slots[0].op else {
            unreachable!()
        };
        assert_eq!(buf.len(), 8192);
        let pending = complete(&mut slots, &[1], &[4096]);
        assert!(pending.is_empty());
        assert!(slots[1].result.as_ref().unwrap().is_ok());
    }

    #[test]
    fn oversized_read_and_long_chain_fail_up_front() {
        let oversized = Slot::new(Sqe {
            op: Op::Read {
                file: FileId(0),
                offset: 0,
                len: 8192,
                buf: AlignedBuf::new(4096),
            },
            link_next: true,
        });
        let mut slots = vec![sync(true), oversized, sync(false)];
        let mut pending = VecDeque::new();
        plan_chain(&mut slots, vec![0, 1, 2], 8, &mut pending);
        assert_eq!(pending, [vec![0]]);
        let err = slots[1].result.as_ref().unwrap().as_ref().unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        assert_eq!(errno(&slots[2]), Some(libc::ECANCELED));

        let mut slots: Vec<Slot> = (0..3).map(|_| sync(true)).collect();
        let mut pending = VecDeque::new();
        plan_chain(&mut slots, vec![0, 1, 2], 2, &mut pending);
        assert!(pending.is_empty());
        for slot in &slots {
            let err = slot.result.as_ref().unwrap().as_ref().unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        }
    }
}
