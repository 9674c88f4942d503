//! The I/O backend trait the partition store runs on, and its two backends.
//!
//! The store never touches a file descriptor: it describes I/O as [`Op`]s,
//! hands a batch to a backend and reads back one [`Completion`] per op. The
//! io_uring backend ([`uring::UringBackend`]) submits a batch as one ring
//! submission; the sim backend ([`sim::SimBackend`]) runs it in memory, in a
//! seeded order, and can crash at any op or inject faults (EIO, bit flips,
//! ENOSPC), which is what the crash-point and fault tests are built on.
//!
//! Metadata calls (open, create, mkdir, fallocate, stat) are ops too
//! ([`Op::Open`], [`Op::Allocate`], [`Op::FileSize`], [`Op::Exists`],
//! [`Op::MakeDir`]), so a shard thread issues them through its ring instead
//! of making the syscall itself. The synchronous trait methods of the same
//! names remain for callers that wait anyway (recovery, tests); the io_uring
//! backend runs them as one-op ring submissions. Listing a directory has no
//! ring op: [`IoBackend::list_dir`] is a plain call, for startup and helper
//! threads only.

pub mod buf;
pub mod sim;
pub mod uring;

use std::io;
use std::path::{Path, PathBuf};

pub use buf::{
    align_down, align_up, AlignedBuf, BatchBuf, BufPool, FixedRegion, PoolExhausted, SharedBufPool,
    BLOCK_SIZE,
};

/// A file or directory opened through a backend. Only meaningful to the
/// backend that returned it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FileId(pub u32);

/// One I/O request. Buffers are moved into the op and handed back in its
/// [`Completion`], so nothing is copied and nothing dangles while the kernel
/// owns the memory.
#[derive(Debug)]
pub enum Op {
    /// Writes all of `buf[..buf.len()]` at `offset`; `offset` and the length
    /// must be multiples of [`BLOCK_SIZE`] (O_DIRECT). Short writes are
    /// completed by the backend; the result is the byte count written.
    Write {
        file: FileId,
        offset: u64,
        buf: AlignedBuf,
    },
    /// Reads `len` bytes at `offset` into `buf` (capacity >= len), both
    /// block-aligned. The result is the byte count read, short only at end of
    /// file; `buf.len()` is set to it.
    Read {
        file: FileId,
        offset: u64,
        len: usize,
        buf: AlignedBuf,
    },
    /// fdatasync(2) of a regular file.
    Fdatasync { file: FileId },
    /// fsync(2), used on directories to make names durable.
    Fsync { file: FileId },
    /// rename(2); the target is replaced atomically if it exists.
    Rename { from: PathBuf, to: PathBuf },
    /// unlink(2) of a file.
    Unlink { path: PathBuf },
    /// rmdir(2) of an empty directory.
    RemoveDir { path: PathBuf },
    /// Opens `path`: a regular file for O_DIRECT reads and writes (created
    /// if missing with [`OpenMode::Create`]; the name is durable only after
    /// a directory fsync), or with `dir` a directory, for [`Op::Fsync`]. The
    /// result is the new [`FileId`]'s number (see [`Completion::opened`]);
    /// the caller closes it.
    Open {
        path: PathBuf,
        mode: OpenMode,
        dir: bool,
    },
    /// fallocate(2) mode 0 of `[offset, offset + len_bytes)`: the size grows
    /// to cover it; ENOSPC when the filesystem has no room.
    Allocate {
        file: FileId,
        offset: u64,
        len_bytes: u64,
    },
    /// The size of an open file in bytes (statx), as the result.
    FileSize { file: FileId },
    /// Whether `path` exists (statx): result 1 if it does, 0 if not.
    Exists { path: PathBuf },
    /// mkdir(2), mode 0755 (durable after an fsync of its parent).
    MakeDir { path: PathBuf },
}

impl Op {
    /// Short name for error messages and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Op::Write { .. } => "write",
            Op::Read { .. } => "read",
            Op::Fdatasync { .. } => "fdatasync",
            Op::Fsync { .. } => "fsync",
            Op::Rename { .. } => "rename",
            Op::Unlink { .. } => "unlink",
            Op::RemoveDir { .. } => "rmdir",
            Op::Open { .. } => "open",
            Op::Allocate { .. } => "fallocate",
            Op::FileSize { .. } | Op::Exists { .. } => "stat",
            Op::MakeDir { .. } => "mkdir",
        }
    }

    /// Takes the buffer back out of a finished write or read.
    pub fn into_buf(self) -> Option<AlignedBuf> {
        match self {
            Op::Write { buf, .. } | Op::Read { buf, .. } => Some(buf),
            _ => None,
        }
    }
}

/// An op submitted as part of a batch. With `link_next`, the following op in
/// the batch starts only after this one completed (IOSQE_IO_LINK). As on the
/// kernel, a failed fsync, rename or unlink does NOT stop the chain: callers
/// must check every completion and never rely on a link for success.
#[derive(Debug)]
pub struct Sqe {
    pub op: Op,
    pub link_next: bool,
}

impl Sqe {
    pub fn new(op: Op) -> Self {
        Self {
            op,
            link_next: false,
        }
    }

    pub fn linked(op: Op) -> Self {
        Self {
            op,
            link_next: true,
        }
    }
}

/// The outcome of one [`Op`], with the op (and its buffer) handed back.
#[derive(Debug)]
pub struct Completion {
    pub op: Op,
    /// Bytes transferred for reads and writes, 0 for the others.
    pub result: io::Result<usize>,
}

impl Completion {
    /// The file an [`Op::Open`] opened (its error otherwise, or
    /// InvalidInput for any other op).
    pub fn opened(self) -> io::Result<FileId> {
        match (self.op, self.result) {
            (Op::Open { .. }, Ok(id)) => u32::try_from(id)
                .map(FileId)
                .map_err(|_| io::Error::other(format!("file id {id} out of range"))),
            (_, Err(e)) => Err(e),
            (op, Ok(_)) => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} completion holds no file", op.kind()),
            )),
        }
    }
}

/// The single completion of a one-op submission (an error if the backend
/// handed back none, which it never should).
pub fn only(completions: Vec<Completion>) -> io::Result<Completion> {
    let n = completions.len();
    let mut it = completions.into_iter();
    match (it.next(), n) {
        (Some(c), 1) => Ok(c),
        _ => Err(io::Error::other(format!(
            "a one-op submission completed with {n} completions"
        ))),
    }
}

/// Names a batch handed to [`IoBackend::submit_nowait`];
/// [`IoBackend::reap`] returns it with the batch's completions. Unique per
/// backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BatchId(pub u64);

/// How to open a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenMode {
    /// Open an existing file; NotFound if it does not exist.
    Existing,
    /// Create it if missing (the name is durable only after a directory fsync).
    Create,
}

/// A storage I/O backend: one per thread (shard), never shared.
pub trait IoBackend {
    /// Opens a regular file for O_DIRECT reads and writes.
    fn open_file(&mut self, path: &Path, mode: OpenMode) -> io::Result<FileId>;
    /// Opens a directory, for [`Op::Fsync`].
    fn open_dir(&mut self, path: &Path) -> io::Result<FileId>;
    fn close(&mut self, file: FileId);
    /// Creates a directory (durable after an fsync of its parent).
    fn create_dir(&mut self, path: &Path) -> io::Result<()>;
    /// The names in a directory, unordered. Only for finding garbage: state is
    /// never derived from a listing.
    fn list_dir(&mut self, path: &Path) -> io::Result<Vec<String>>;
    fn exists(&mut self, path: &Path) -> io::Result<bool>;
    fn file_size(&mut self, file: FileId) -> io::Result<u64>;
    /// Reserves `len_bytes` from offset 0 (fallocate mode 0: the size grows).
    fn allocate(&mut self, file: FileId, len_bytes: u64) -> io::Result<()> {
        self.allocate_range(file, 0, len_bytes)
    }
    /// Reserves `[offset, offset + len_bytes)` (fallocate mode 0: the size
    /// grows to cover it); ENOSPC when the filesystem has no room.
    fn allocate_range(&mut self, file: FileId, offset: u64, len_bytes: u64) -> io::Result<()>;
    /// Submits a batch and waits for all of it; one completion per op, in
    /// submission order.
    fn submit(&mut self, batch: Vec<Sqe>) -> Vec<Completion>;
    /// Queues a batch without waiting for it and names it. The backend owns
    /// the ops (and their buffers) until [`IoBackend::reap`] hands the batch
    /// back; the caller must keep calling `reap` until it did. Nothing orders
    /// it against other batches (only links order ops).
    fn submit_nowait(&mut self, batch: Vec<Sqe>) -> BatchId;
    /// Never blocks: hands back every batch of [`IoBackend::submit_nowait`]
    /// whose ops have all finished (batches in any order), each with one
    /// completion per op in the batch's order.
    fn reap(&mut self) -> Vec<(BatchId, Vec<Completion>)>;
    /// [`IoBackend::reap`], but when nothing has finished it may first wait
    /// up to `timeout` for the ops in flight (the io_uring backend waits in
    /// the ring) instead of returning at once: for a caller that must wait
    /// for its own batches and would otherwise spin.
    fn reap_waiting(&mut self, timeout: std::time::Duration) -> Vec<(BatchId, Vec<Completion>)> {
        let _ = timeout;
        self.reap()
    }
    /// Batches of [`IoBackend::submit_nowait`] not handed back by `reap` yet.
    fn batches_running(&self) -> usize;
}
