//! Cross-shard messaging: each shard has a bounded request mailbox and a
//! bounded reply mailbox (crossbeam channels) plus an eventfd that a task on
//! the shard's monoio runtime awaits.
//!
//! Bounds: the request mailbox holds `mailbox_capacity` envelopes and
//! `mailbox_bytes_max` bytes of produce batches (charged at send, released
//! when the owner takes the envelope); a full one is reported to the sender
//! ([`SendError::Full`]), which answers its client with a retryable
//! Backpressure error: nothing queues without limit and nothing
//! acknowledged is dropped. The reply mailbox holds
//! `forward_inflight_max` replies, and a shard never has more forwarded
//! requests outstanding than that (it checks before forwarding), so a reply
//! always fits.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender, TrySendError};
use ringlog_protocol::wire::{ErrorCode, FetchReply, ProduceReply};
use serde::Serialize;

/// A failed operation, as the client will see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpError {
    pub code: ErrorCode,
    pub message: String,
}

impl OpError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> OpError {
        OpError {
            code,
            message: message.into(),
        }
    }
}

impl std::fmt::Display for OpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

/// One partition as the control socket and Describe show it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PartitionStatus {
    pub topic: String,
    pub partition: u32,
    pub partition_id: u32,
    pub shard: usize,
    pub role: &'static str,
    pub log_start_offset: u64,
    /// Accepted end of the log.
    pub frontier: u64,
    /// Durable (acknowledgeable) end of the log; single node: the commit.
    pub commit: u64,
    pub sealed_segments: usize,
    pub size_bytes: u64,
    pub purge_generation: u64,
    /// Why the partition is stopped, if it is.
    pub fault: Option<String>,
}

/// What a shard reports to `status`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ShardStatus {
    pub shard: usize,
    pub core: Option<usize>,
    pub partitions: usize,
    pub connections: u64,
    pub mailbox_depth: usize,
}

#[derive(Debug)]
pub enum OpReply {
    Empty,
    Produced(ProduceReply),
    Fetched(FetchReply),
    Partitions(Vec<PartitionStatus>),
    Shard(ShardStatus),
}

pub type Outcome = Result<OpReply, OpError>;

/// Topic-level operations, run by the controller (shard 0), one at a time.
#[derive(Debug)]
pub enum MetaOp {
    CreateTopic { topic: String, partitions: u32 },
    DeleteTopic { topic: String },
}

/// Work for a shard.
#[derive(Debug)]
pub enum Op {
    Produce {
        partition_id: u32,
        batch: Vec<u8>,
    },
    Fetch {
        partition_id: u32,
        offset: u64,
        max_bytes: u32,
        wait_ms: u32,
    },
    Purge {
        partition_id: u32,
    },
    /// Status of some (or, with `None`, all) partitions of this shard.
    Describe {
        partition_ids: Option<Vec<u32>>,
    },
    /// Opens (or with `create`, creates) a partition on its owner.
    OpenPartition {
        topic: String,
        index: u32,
        partition_id: u32,
        create: bool,
    },
    /// Closes a partition and removes its directory (topic deleted).
    DropPartition {
        partition_id: u32,
    },
    ShardStatus,
    Meta(MetaOp),
}

impl Op {
    /// Bytes of client payload the op carries (what the mailbox charges).
    pub fn payload_bytes(&self) -> u64 {
        match self {
            Op::Produce { batch, .. } => batch.len() as u64,
            _ => 0,
        }
    }
}

/// Where a reply goes.
#[derive(Debug)]
pub enum ReplyTo {
    /// A forwarding shard: the reply goes to its reply mailbox.
    Shard { shard: usize, token: u64 },
    /// A plain thread (the control socket) blocked on a channel.
    Thread(Sender<Outcome>),
}

#[derive(Debug)]
pub struct Envelope {
    pub op: Op,
    pub reply: ReplyTo,
}

#[derive(Debug)]
pub struct ReplyEnvelope {
    pub token: u64,
    pub outcome: Outcome,
}

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

/// Counters the mailbox keeps for metrics.
#[derive(Debug, Default)]
pub struct MailboxStats {
    pub rejected: AtomicU64,
    pub delivered: AtomicU64,
}

/// The sending side of a shard's mailboxes (cloned into every shard).
#[derive(Clone, Debug)]
pub struct MailboxTx {
    requests: Sender<Envelope>,
    replies: Sender<ReplyEnvelope>,
    wake: Arc<EventFd>,
    stats: Arc<MailboxStats>,
    /// Payload bytes queued in `requests` (shared with the receiver).
    queued_bytes: Arc<AtomicU64>,
    bytes_max: u64,
}

/// The receiving side, owned by the shard.
pub struct MailboxRx {
    requests: Receiver<Envelope>,
    pub replies: Receiver<ReplyEnvelope>,
    pub wake: Arc<EventFd>,
    queued_bytes: Arc<AtomicU64>,
}

impl MailboxRx {
    /// Takes the next request, releasing its bytes from the budget.
    pub fn try_recv(&self) -> Option<Envelope> {
        let env = self.requests.try_recv().ok()?;
        self.queued_bytes
            .fetch_sub(env.op.payload_bytes(), Ordering::AcqRel);
        Some(env)
    }

    pub fn is_empty(&self) -> bool {
        self.requests.is_empty()
    }

    pub fn len(&self) -> usize {
        self.requests.len()
    }
}

#[derive(Debug)]
pub enum SendError {
    /// The mailbox is at capacity: backpressure.
    Full(Envelope),
    /// The shard has stopped.
    Closed(Envelope),
}

/// Creates one shard's mailboxes: `capacity` requests holding at most
/// `bytes_max` payload bytes, `replies_capacity` replies.
pub fn mailbox(
    capacity: usize,
    bytes_max: u64,
    replies_capacity: usize,
) -> std::io::Result<(MailboxTx, MailboxRx)> {
    let (req_tx, req_rx) = crossbeam_channel::bounded(capacity);
    let (rep_tx, rep_rx) = crossbeam_channel::bounded(replies_capacity);
    let wake = Arc::new(EventFd::new()?);
    let queued_bytes = Arc::new(AtomicU64::new(0));
    Ok((
        MailboxTx {
            requests: req_tx,
            replies: rep_tx,
            wake: wake.clone(),
            stats: Arc::new(MailboxStats::default()),
            queued_bytes: queued_bytes.clone(),
            bytes_max,
        },
        MailboxRx {
            requests: req_rx,
            replies: rep_rx,
            wake,
            queued_bytes,
        },
    ))
}

impl MailboxTx {
    /// Queues a request without blocking, within both bounds.
    pub fn send(&self, envelope: Envelope) -> Result<(), SendError> {
        let bytes = envelope.op.payload_bytes();
        let charged = self
            .queued_bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| {
                q.checked_add(bytes).filter(|&n| n <= self.bytes_max)
            });
        if charged.is_err() {
            self.stats.rejected.fetch_add(1, Ordering::Relaxed);
            return Err(SendError::Full(envelope));
        }
        match self.requests.try_send(envelope) {
            Ok(()) => {
                self.stats.delivered.fetch_add(1, Ordering::Relaxed);
                self.wake.wake();
                Ok(())
            }
            Err(e) => {
                self.queued_bytes.fetch_sub(bytes, Ordering::AcqRel);
                match e {
                    TrySendError::Full(e) => {
                        self.stats.rejected.fetch_add(1, Ordering::Relaxed);
                        Err(SendError::Full(e))
                    }
                    TrySendError::Disconnected(e) => Err(SendError::Closed(e)),
                }
            }
        }
    }

    /// Payload bytes queued now.
    pub fn queued_bytes(&self) -> u64 {
        self.queued_bytes.load(Ordering::Acquire)
    }

    /// Delivers a reply. Never blocks: the requester bounded its outstanding
    /// forwards by this mailbox's capacity. Returns false if the requester
    /// is gone (shut down).
    pub fn reply(&self, reply: ReplyEnvelope) -> bool {
        match self.replies.try_send(reply) {
            Ok(()) => {
                self.wake.wake();
                true
            }
            Err(TrySendError::Full(r)) => {
                // Would mean the forward bound was broken: a bug. The client
                // of that request gets no answer (its connection times out);
                // nothing durable is affected.
                tracing::error!(token = r.token, "reply mailbox full; reply dropped");
                false
            }
            Err(TrySendError::Disconnected(_)) => false,
        }
    }

    /// Wakes the shard without a message (shutdown).
    pub fn wake(&self) {
        self.wake.wake();
    }

    pub fn depth(&self) -> usize {
        self.requests.len()
    }

    pub fn capacity(&self) -> usize {
        self.requests.capacity().unwrap_or(0)
    }

    pub fn stats(&self) -> &MailboxStats {
        &self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_mailbox_rejects_and_counts() {
        let (tx, rx) = mailbox(2, 1 << 20, 2).unwrap();
        let env = || Envelope {
            op: Op::ShardStatus,
            reply: ReplyTo::Shard { shard: 0, token: 1 },
        };
        tx.send(env()).unwrap();
        tx.send(env()).unwrap();
        assert!(matches!(tx.send(env()), Err(SendError::Full(_))));
        assert_eq!(tx.stats().rejected.load(Ordering::Relaxed), 1);
        assert_eq!(tx.depth(), 2);
        rx.try_recv().unwrap();
        tx.send(env()).unwrap();
        drop(rx);
        assert!(matches!(tx.send(env()), Err(SendError::Closed(_))));
    }

    #[test]
    fn mailbox_bytes_are_bounded_and_released_on_receive() {
        let (tx, rx) = mailbox(100, 10_000, 2).unwrap();
        let produce = |len: usize| Envelope {
            op: Op::Produce {
                partition_id: 0,
                batch: vec![7; len],
            },
            reply: ReplyTo::Shard { shard: 0, token: 1 },
        };
        tx.send(produce(6_000)).unwrap();
        tx.send(produce(4_000)).unwrap();
        assert_eq!(tx.queued_bytes(), 10_000);
        // One byte over the budget: refused whole (backpressure), not queued.
        match tx.send(produce(1)) {
            Err(SendError::Full(e)) => assert_eq!(e.op.payload_bytes(), 1),
            other => panic!("expected Full, got {other:?}"),
        }
        assert_eq!(tx.depth(), 2);
        // Ops without payload still pass (the count bound covers them).
        tx.send(Envelope {
            op: Op::ShardStatus,
            reply: ReplyTo::Shard { shard: 0, token: 2 },
        })
        .unwrap();
        assert_eq!(rx.try_recv().unwrap().op.payload_bytes(), 6_000);
        assert_eq!(tx.queued_bytes(), 4_000);
        tx.send(produce(6_000)).unwrap();
        assert!(matches!(tx.send(produce(1)), Err(SendError::Full(_))));
        while rx.try_recv().is_some() {}
        assert_eq!(tx.queued_bytes(), 0);
        // A count-full mailbox gives the bytes back.
        let (tx, _rx) = mailbox(1, 10_000, 2).unwrap();
        tx.send(produce(10)).unwrap();
        assert!(matches!(tx.send(produce(10)), Err(SendError::Full(_))));
        assert_eq!(tx.queued_bytes(), 10);
    }

    #[test]
    fn eventfd_wakes_a_monoio_task() {
        let fd = Arc::new(EventFd::new().unwrap());
        let remote = fd.clone();
        let mut rt = monoio::RuntimeBuilder::<monoio::IoUringDriver>::new()
            .enable_timer()
            .build()
            .unwrap();
        rt.block_on(async move {
            let reader = fd.reader().unwrap();
            let t = std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(20));
                remote.wake();
            });
            let waited = monoio::time::timeout(std::time::Duration::from_secs(5), reader.wait())
                .await
                .expect("woken before the timeout");
            waited.unwrap();
            t.join().unwrap();
        });
    }
}
