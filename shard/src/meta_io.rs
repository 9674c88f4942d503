//! The meta I/O thread: the controller's file work (replacing topics.json,
//! removing an emptied topic directory), done off the shard threads.
//!
//! The controller runs on shard 0, whose thread must never block; a
//! durable topics.json replace waits for an fdatasync and a directory
//! fsync (milliseconds on a busy disk). So the controller hands the work to
//! this thread as a [`Task`] and awaits the completion on its own runtime:
//! the thread sends the result on the job's channel, then wakes the job's
//! eventfd, which the controller's task awaits.
//!
//! The thread does its I/O through an [`IoBackend`] (its own io_uring ring
//! in the server), so the sim backend's crash points and injected faults
//! test the exact sequence: see [`store_table`].
//!
//! Bound: at most [`JOBS_MAX`] jobs are queued. Only the controller submits,
//! one topic operation at a time, so one job is queued in practice; a full
//! queue is [`MetaIoError::Busy`], which reaches the ctl caller as a
//! retryable backpressure error.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender, TryRecvError, TrySendError};
use ringlog_storage::io::uring::UringBackend;
use ringlog_storage::io::{align_up, AlignedBuf, Completion, IoBackend, Op, OpenMode, Sqe};
use thiserror::Error;

use crate::catalog::{CatalogError, TopicTable, TOPICS_FILE};
use crate::eventfd::EventFd;

/// Jobs queued for the thread at once (see the module docs).
pub const JOBS_MAX: usize = 4;
/// Ring size of the thread's backend: its longest batch is 2 ops.
const RING_ENTRIES: u32 = 8;

/// Work the thread does.
#[derive(Debug)]
pub enum Task {
    /// Replaces `<data_dir>/topics.json` durably with `table`.
    StoreTable {
        data_dir: PathBuf,
        table: TopicTable,
    },
    /// rmdir(2) of an empty directory.
    RemoveDir { path: PathBuf },
}

#[derive(Debug, Error)]
pub enum MetaIoError {
    #[error("the meta I/O queue is full ({JOBS_MAX} jobs); retry")]
    Busy,
    #[error("the meta I/O thread stopped")]
    Stopped,
    #[error("waiting for the meta I/O thread: {0}")]
    Wait(io::Error),
    #[error(transparent)]
    Catalog(#[from] CatalogError),
}

impl MetaIoError {
    /// The OS error behind a failed file operation, if that is what it was.
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            MetaIoError::Catalog(CatalogError::Io { source, .. }) => source.raw_os_error(),
            _ => None,
        }
    }
}

/// Where a job's result goes. Dropping it wakes the waiting task, so a job
/// dropped unanswered (the thread stopped) ends the wait too.
struct Reply {
    tx: Sender<Result<(), MetaIoError>>,
    wake: Arc<EventFd>,
}

impl Reply {
    fn send(self, result: Result<(), MetaIoError>) {
        // The waiter may have gone (its task was dropped): nothing to tell.
        let _ = self.tx.send(result);
    }
}

impl Drop for Reply {
    fn drop(&mut self) {
        self.wake.wake();
    }
}

/// A queued task and where its result goes.
pub struct Job {
    task: Task,
    reply: Reply,
}

/// Hands tasks to the thread (cloned into every shard; used by shard 0's
/// controller).
#[derive(Clone)]
pub struct Client {
    tx: Sender<Job>,
}

/// The queue between clients and the thread (bounded by [`JOBS_MAX`]).
pub fn channel() -> (Client, Receiver<Job>) {
    let (tx, rx) = crossbeam_channel::bounded(JOBS_MAX);
    (Client { tx }, rx)
}

impl Client {
    /// Runs `task` on the thread and waits for it without blocking this
    /// thread: call it from a task of a shard's monoio runtime.
    pub async fn run(&self, task: Task) -> Result<(), MetaIoError> {
        let wake = Arc::new(EventFd::new().map_err(MetaIoError::Wait)?);
        let reader = wake.reader().map_err(MetaIoError::Wait)?;
        let (tx, rx) = crossbeam_channel::bounded(1);
        let job = Job {
            task,
            reply: Reply { tx, wake },
        };
        match self.tx.try_send(job) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => return Err(MetaIoError::Busy),
            Err(TrySendError::Disconnected(_)) => return Err(MetaIoError::Stopped),
        }
        loop {
            match rx.try_recv() {
                Ok(result) => return result,
                Err(TryRecvError::Disconnected) => return Err(MetaIoError::Stopped),
                Err(TryRecvError::Empty) => reader.wait().await.map_err(MetaIoError::Wait)?,
            }
        }
    }
}

/// The running thread.
pub struct MetaIo {
    client: Client,
    /// Told once, by [`MetaIo::stop`] (clients in shards may outlive them).
    stop: Sender<()>,
    thread: JoinHandle<()>,
}

impl MetaIo {
    /// Starts the thread on its own io_uring ring.
    pub fn start() -> io::Result<MetaIo> {
        Self::start_with(|| UringBackend::new(RING_ENTRIES))
    }

    /// Starts the thread on the backend `make` builds there (a ring binds
    /// to the thread that first uses it). Fails if `make` does.
    pub fn start_with<B, F>(make: F) -> io::Result<MetaIo>
    where
        B: IoBackend,
        F: FnOnce() -> io::Result<B> + Send + 'static,
    {
        let (client, jobs) = channel();
        let (stop, stopped) = crossbeam_channel::bounded(1);
        let (ready_tx, ready_rx) = crossbeam_channel::bounded(1);
        let thread = std::thread::Builder::new()
            .name("ringlog-meta-io".into())
            .spawn(move || {
                let mut io = match make() {
                    Ok(io) => io,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let _ = ready_tx.send(Ok(()));
                serve(&mut io, &jobs, &stopped);
            })?;
        let started = ready_rx
            .recv()
            .unwrap_or_else(|_| Err(io::Error::other("the meta I/O thread died at start")));
        if let Err(e) = started {
            let _ = thread.join();
            return Err(e);
        }
        Ok(MetaIo {
            client,
            stop,
            thread,
        })
    }

    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// Stops the thread after the job it is running and waits for it; jobs
    /// still queued are answered [`MetaIoError::Stopped`].
    pub fn stop(self) {
        let MetaIo {
            client,
            stop,
            thread,
        } = self;
        drop(client);
        // A full or closed channel means the thread is stopping already.
        let _ = stop.try_send(());
        if thread.join().is_err() {
            tracing::error!("the meta I/O thread panicked");
        }
    }
}

/// Runs jobs until every client is gone or stop is told; then answers
/// what is still queued.
fn serve(io: &mut impl IoBackend, jobs: &Receiver<Job>, stopped: &Receiver<()>) {
    loop {
        let job = crossbeam_channel::select! {
            recv(jobs) -> job => job,
            recv(stopped) -> _ => break,
        };
        let Ok(Job { task, reply }) = job else { break };
        reply.send(run_task(io, task));
    }
    refuse_queued(jobs);
}

/// Answers every queued job [`MetaIoError::Stopped`]: a channel keeps its
/// messages while a sender lives, so dropping the receiver would leave
/// their waiters waiting.
fn refuse_queued(jobs: &Receiver<Job>) {
    for job in jobs.try_iter() {
        job.reply.send(Err(MetaIoError::Stopped));
    }
}

/// Does `task` on `io` (blocking: only on the meta I/O thread, or a test).
pub fn run_task(io: &mut impl IoBackend, task: Task) -> Result<(), MetaIoError> {
    match task {
        Task::StoreTable { data_dir, table } => store_table(io, &data_dir, &table)?,
        Task::RemoveDir { path } => {
            let done = io.submit(vec![Sqe::new(Op::RemoveDir { path: path.clone() })]);
            check(done, &[&path])?;
        }
    }
    Ok(())
}

fn io_err(what: &'static str, path: &Path, source: io::Error) -> CatalogError {
    CatalogError::Io {
        what,
        path: path.into(),
        source,
    }
}

/// Every completion of a batch succeeded (`paths`: what each op works on);
/// else the first failure, named by its op and path (a failed write makes
/// its linked fdatasync fail as cancelled: the write's error is reported).
fn check(done: Vec<Completion>, paths: &[&Path]) -> Result<(), CatalogError> {
    if done.len() != paths.len() {
        let lost = format!("{} of {} completions", done.len(), paths.len());
        return Err(io_err("complete", paths[0], io::Error::other(lost)));
    }
    for (c, path) in done.into_iter().zip(paths) {
        if let Err(e) = c.result {
            return Err(io_err(c.op.kind(), path, e));
        }
    }
    Ok(())
}

/// topics.json's text, padded with spaces and a final newline to whole
/// blocks: the backend writes O_DIRECT, and JSON ignores the whitespace.
fn padded_json(table: &TopicTable, path: &Path) -> Result<AlignedBuf, CatalogError> {
    let text = serde_json::to_string_pretty(table).map_err(|e| CatalogError::Corrupt {
        path: path.into(),
        message: e.to_string(),
    })?;
    let used = text.len() + 1;
    let len = usize::try_from(align_up(used as u64)).map_err(|_| CatalogError::Corrupt {
        path: path.into(),
        message: format!("{used} bytes do not fit in memory"),
    })?;
    let mut buf = AlignedBuf::new(len);
    buf.extend_from_slice(text.as_bytes());
    buf.extend_from_slice(&vec![b' '; len - used]);
    buf.extend_from_slice(b"\n");
    debug_assert_eq!(buf.len(), len);
    Ok(buf)
}

/// Replaces `<data_dir>/topics.json` atomically and durably, every step's
/// completion checked: write a temp file and fdatasync it, rename it over
/// topics.json, fsync the directory. A crash at any point leaves the old
/// file or the new one, never a torn one; an error before the rename leaves
/// the old one in place.
pub fn store_table(
    io: &mut impl IoBackend,
    data_dir: &Path,
    table: &TopicTable,
) -> Result<(), CatalogError> {
    let path = data_dir.join(TOPICS_FILE);
    let tmp = data_dir.join(format!("{TOPICS_FILE}.tmp"));
    let buf = padded_json(table, &path)?;
    // A temp file a crash left behind may be longer than this one, and
    // whole-block writes cannot truncate it: start from a fresh file.
    let removed = io.submit(vec![Sqe::new(Op::Unlink { path: tmp.clone() })]);
    match removed.into_iter().next().map(|c| c.result) {
        Some(Ok(_)) => {}
        Some(Err(e)) if e.kind() == io::ErrorKind::NotFound => {}
        Some(Err(e)) => return Err(io_err("unlink", &tmp, e)),
        None => return Err(io_err("unlink", &tmp, io::Error::other("no completion"))),
    }
    let file = io
        .open_file(&tmp, OpenMode::Create)
        .map_err(|e| io_err("create", &tmp, e))?;
    let written = io.submit(vec![
        Sqe::linked(Op::Write {
            file,
            offset: 0,
            buf,
        }),
        Sqe::new(Op::Fdatasync { file }),
    ]);
    io.close(file);
    check(written, &[&tmp, &tmp])?;
    let dir = io
        .open_dir(data_dir)
        .map_err(|e| io_err("open directory", data_dir, e))?;
    let renamed = io.submit(vec![
        Sqe::linked(Op::Rename {
            from: tmp,
            to: path.clone(),
        }),
        Sqe::new(Op::Fsync { file: dir }),
    ]);
    io.close(dir);
    check(renamed, &[&path, data_dir])
}

#[cfg(test)]
mod tests;
