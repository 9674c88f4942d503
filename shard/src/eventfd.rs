//! An eventfd that any thread can signal and a shard's monoio runtime
//! awaits: how mailbox senders and the storage ring wake a shard.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// An eventfd: `wake` from any thread, awaited on a shard's runtime.
#[derive(Debug)]
pub struct EventFd {
    fd: OwnedFd,
}

impl EventFd {
    pub fn new() -> std::io::Result<EventFd> {
        // Blocking mode on purpose: io_uring polls it instead of failing
        // reads with EAGAIN.
        // SAFETY: plain syscall; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: eventfd returned a fresh descriptor nothing else owns.
        Ok(EventFd {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// Adds 1 to the counter, waking the reader.
    pub fn wake(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a valid buffer to an open descriptor.
        let n = unsafe { libc::write(self.fd.as_raw_fd(), one.as_ptr().cast(), one.len()) };
        if n != 8 {
            // Only possible if the counter would overflow, i.e. it is
            // already non-zero: the reader is woken anyway.
            tracing::trace!("eventfd write returned {n}");
        }
    }

    /// The descriptor, e.g. to register with an io_uring ring.
    pub fn raw_fd(&self) -> std::os::fd::RawFd {
        self.fd.as_raw_fd()
    }

    /// A monoio file reading this eventfd (call on the shard's thread).
    pub fn reader(&self) -> std::io::Result<EventFdReader> {
        let dup = self.fd.try_clone()?;
        let file = monoio::fs::File::from_std(std::fs::File::from(dup))?;
        Ok(EventFdReader { file })
    }
}

pub struct EventFdReader {
    file: monoio::fs::File,
}

impl EventFdReader {
    /// Waits until the eventfd was woken at least once since the last wait.
    pub async fn wait(&self) -> std::io::Result<()> {
        let buf = vec![0u8; 8];
        let (res, _buf) = self.file.read_at(buf, 0).await;
        res.map(|_| ())
    }
}
