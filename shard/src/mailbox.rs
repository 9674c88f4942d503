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

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender, TrySendError};

use crate::eventfd::EventFd;
use crate::ops::{Envelope, ReplyEnvelope};

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
    use crate::ops::{Op, ReplyTo};

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
                batch: vec![7; len].into(),
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
