//! The trash: directories of dropped partitions, removed off the shard
//! threads.
//!
//! A shard drops a partition by renaming its directory into
//! `<data_dir>/trash/<partition id>` on its storage ring (with both
//! directories fsynced, so the rename survives a crash): the name is free
//! at once for a topic created again, and the shard never waits for a
//! recursive removal. A [`Sweeper`] thread, started by the server, empties
//! the trash: at start (what a crash left midway) and whenever poked.
//!
//! Bound: at most [`POKES_MAX`] pokes are queued. A poke that finds the
//! queue full is dropped, which loses nothing: the queued poke makes the
//! sweeper list the trash after the poker's rename completed, so that
//! sweep sees the new entry too.

use std::io;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender, TrySendError};
use ringlog_storage::io::{Completion, IoBackend, Op, Sqe};

/// The trash directory under the data directory.
pub const TRASH_DIR: &str = "trash";
/// Pokes queued for the sweeper at once (see the module docs).
pub const POKES_MAX: usize = 1;

/// Where the directory of `partition_id` goes when dropped. Partition ids
/// are never reused, so the name is unique.
pub fn entry_path(data_dir: &Path, partition_id: u32) -> PathBuf {
    data_dir.join(TRASH_DIR).join(partition_id.to_string())
}

/// Moves `dir` to `to` (an entry of the trash) on the ring: the rename,
/// then an fsync of the directory it left and of the trash, so a crash
/// after this returned finds it in the trash, not back in place.
pub fn move_in(io: &mut impl IoBackend, dir: &Path, to: &Path) -> io::Result<()> {
    let parent = |p: &Path| {
        p.parent()
            .map(Path::to_path_buf)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no parent directory"))
    };
    let (from_parent, to_parent) = (parent(dir)?, parent(to)?);
    let from_file = io.open_dir(&from_parent)?;
    let to_file = match io.open_dir(&to_parent) {
        Ok(f) => f,
        Err(e) => {
            io.close(from_file);
            return Err(e);
        }
    };
    let done = io.submit(vec![
        Sqe::linked(Op::Rename {
            from: dir.into(),
            to: to.into(),
        }),
        Sqe::linked(Op::Fsync { file: from_file }),
        Sqe::new(Op::Fsync { file: to_file }),
    ]);
    io.close(from_file);
    io.close(to_file);
    let lost = || io::Error::other("completion missing");
    match done.len() {
        3 => done
            .into_iter()
            .try_for_each(|c: Completion| c.result.map(drop)),
        _ => Err(lost()),
    }
}

/// Result of [`Poker::poke`].
#[derive(Debug, PartialEq, Eq)]
pub enum Poked {
    /// A sweep was queued.
    Queued,
    /// A sweep was queued already; it covers this entry too.
    Pending,
    /// The sweeper stopped; the entry stays until the next start.
    Stopped,
}

/// Asks the sweeper to empty the trash (cloned into every shard).
#[derive(Clone)]
pub struct Poker {
    tx: Sender<()>,
}

impl Poker {
    /// Queues a sweep unless one is queued already; never blocks.
    pub fn poke(&self) -> Poked {
        match self.tx.try_send(()) {
            Ok(()) => Poked::Queued,
            Err(TrySendError::Full(())) => Poked::Pending,
            Err(TrySendError::Disconnected(())) => Poked::Stopped,
        }
    }
}

/// The queue between pokers and a sweeper (bounded by [`POKES_MAX`]).
pub fn channel() -> (Poker, Receiver<()>) {
    let (tx, rx) = crossbeam_channel::bounded(POKES_MAX);
    (Poker { tx }, rx)
}

/// Removes every entry of `trash`; returns how many it removed. A failed
/// removal is logged and left for the next sweep.
pub fn sweep(trash: &Path) -> usize {
    let entries = match std::fs::read_dir(trash) {
        Ok(e) => e,
        Err(e) => {
            tracing::warn!(dir = %trash.display(), error = %e, "listing the trash");
            return 0;
        }
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let path = entry.path();
        let gone = match entry.file_type() {
            Ok(t) if t.is_dir() => std::fs::remove_dir_all(&path),
            _ => std::fs::remove_file(&path),
        };
        match gone {
            Ok(()) => removed += 1,
            Err(e) => tracing::warn!(dir = %path.display(), error = %e, "emptying the trash"),
        }
    }
    removed
}

/// The thread emptying the trash.
pub struct Sweeper {
    poker: Poker,
    /// Told once, by [`Sweeper::stop`] (the shards' pokers may outlive
    /// their threads, so the end cannot wait for the last poker).
    stop: Sender<()>,
    thread: JoinHandle<()>,
}

impl Sweeper {
    /// Creates `trash` if missing and starts the thread, which sweeps at
    /// once (leftovers of a crash midway), then once per poke, and a last
    /// time when stopped.
    pub fn start(trash: PathBuf) -> io::Result<Self> {
        std::fs::create_dir_all(&trash)?;
        let (poker, pokes) = channel();
        let (stop, stopped) = crossbeam_channel::bounded(1);
        let thread = std::thread::Builder::new()
            .name("ringlog-trash".into())
            .spawn(move || {
                sweep(&trash);
                loop {
                    // Every poker gone or stop: one last sweep.
                    let last = crossbeam_channel::select! {
                        recv(pokes) -> poke => poke.is_err(),
                        recv(stopped) -> _ => true,
                    };
                    sweep(&trash);
                    if last {
                        break;
                    }
                }
            })?;
        Ok(Self {
            poker,
            stop,
            thread,
        })
    }

    pub fn poker(&self) -> Poker {
        self.poker.clone()
    }

    /// Stops the thread after one last sweep and waits for it: whatever
    /// was moved into the trash before this call is removed when it returns.
    pub fn stop(self) {
        let Self {
            poker: _,
            stop,
            thread,
        } = self;
        // A full or closed channel means the thread is stopping already.
        let _ = stop.try_send(());
        if thread.join().is_err() {
            tracing::error!("the trash sweeper panicked");
        }
    }
}

#[cfg(test)]
mod tests;
