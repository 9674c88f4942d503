//! Routing between the peer transport and the replicas on the shards.
//!
//! The transport (`net::peer`) runs on shard 0 only: a node keeps one
//! authenticated connection per peer and direction whatever its shard
//! count, and the handshake state lives in one place. So:
//! * inbound: [`PeerRouter`] (the transport's [`PeerSink`], called on
//!   shard 0) looks up the partition's owner shard and hands the message to
//!   that shard's bounded mailbox as [`Op::PeerMessage`] (shard 0's own
//!   partitions go through its own mailbox too, so every partition takes
//!   messages in one place: its owner's turn);
//! * outbound: a shard sends what its replicas emit to shard 0's mailbox as
//!   [`Op::PeerSend`], and shard 0 queues it on the transport (shard 0
//!   queues its own replicas' messages directly).
//!
//! The cost is one cross-shard hop each way for partitions off shard 0;
//! the alternative, connections per shard, multiplies sessions and
//! handshakes by the shard count and needs a shard-to-shard addressing
//! scheme across nodes that may run different shard counts.
//!
//! Bounds: the mailboxes' own (`mailbox_capacity` envelopes and
//! `mailbox_bytes_max` payload bytes, peer payloads charged like produce
//! batches); a message that does not fit is dropped and counted
//! (`ShardMetrics::peer_drops_total`): VSR retransmits what matters
//! (prepares on a timeout, repair on a gap), so a drop costs latency, never
//! safety. The partition-to-owner map is rebuilt only when the catalog's
//! version moves and holds one entry per partition.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::Arc;

use crate::catalog::Catalog;
use crate::mailbox::MailboxTx;
use crate::metrics::{self, ShardMetrics};
use crate::net::peer::{PeerFrame, PeerSink};
use crate::ops::{Envelope, Op, ReplyTo};
use crate::placement::shard_for;

/// Delivers verified peer frames to the owning shard's mailbox.
pub struct PeerRouter {
    catalog: Arc<Catalog>,
    shards: Arc<Vec<MailboxTx>>,
    /// Counted on shard 0's metrics (the transport's shard).
    metrics: Arc<ShardMetrics>,
    /// (catalog version, partition id -> owner shard).
    owners: RefCell<(u64, BTreeMap<u32, usize>)>,
}

impl PeerRouter {
    pub fn new(
        catalog: Arc<Catalog>,
        shards: Arc<Vec<MailboxTx>>,
        metrics: Arc<ShardMetrics>,
    ) -> PeerRouter {
        PeerRouter {
            catalog,
            shards,
            metrics,
            owners: RefCell::new((0, BTreeMap::new())),
        }
    }

    /// The shard owning `partition_id`, if a topic holds it (the metadata
    /// group's replica is on shard 0).
    fn owner(&self, partition_id: u32) -> Option<usize> {
        if partition_id == crate::meta_hosted::META_PARTITION_ID {
            return Some(0);
        }
        let mut owners = self.owners.borrow_mut();
        let version = self.catalog.version();
        if owners.0 != version {
            let table = self.catalog.snapshot();
            let shards = self.shards.len();
            owners.1 = table
                .topics
                .iter()
                .flat_map(|(topic, m)| {
                    (0..m.partitions)
                        .map(move |i| (m.first_partition_id + i, shard_for(topic, i, shards)))
                })
                .collect();
            owners.0 = version;
        }
        debug_assert!(owners.1.values().all(|&s| s < self.shards.len()));
        owners.1.get(&partition_id).copied()
    }
}

impl PeerSink for PeerRouter {
    fn deliver(&self, from: u32, frame: PeerFrame) {
        let partition_id = frame.partition_id;
        let Some(owner) = self.owner(partition_id) else {
            metrics::inc(&self.metrics.peer_drops_total);
            tracing::debug!(
                from,
                partition_id,
                "peer message for a partition not on this node"
            );
            return;
        };
        let env = Envelope {
            // The payload stays in the body it was read into.
            op: Op::PeerMessage {
                from,
                partition_id,
                payload: frame.into_payload(),
            },
            reply: ReplyTo::Nobody,
        };
        if let Err(e) = self.shards[owner].send(env) {
            metrics::inc(&self.metrics.peer_drops_total);
            tracing::debug!(from, partition_id, owner, error = ?e, "peer message dropped: mailbox full or closed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{TopicMeta, TopicState, TopicTable};
    use crate::mailbox::mailbox;
    use std::sync::atomic::Ordering;

    fn table() -> TopicTable {
        let mut t = TopicTable::default();
        t.topics.insert(
            "t".into(),
            TopicMeta {
                partitions: 2,
                first_partition_id: 10,
                state: TopicState::Ready,
                replication_factor: 3,
            },
        );
        t
    }

    /// Frames reach the owner's mailbox; a full mailbox drops and counts
    /// (bound: the mailbox's capacity), as does an unknown partition.
    #[test]
    fn frames_reach_the_owner_and_a_full_mailbox_drops_and_counts() {
        let (tx0, rx0) = mailbox(2, 1 << 20, 2).unwrap();
        let (tx1, rx1) = mailbox(2, 1 << 20, 2).unwrap();
        let catalog = Arc::new(Catalog::new(table()));
        let metrics = Arc::new(ShardMetrics::default());
        let router = PeerRouter::new(catalog.clone(), Arc::new(vec![tx0, tx1]), metrics.clone());
        let owner = shard_for("t", 1, 2);
        let rx = if owner == 0 { &rx0 } else { &rx1 };
        let frame = |pid: u32, byte: u8| PeerFrame::for_test(pid, &[byte; 8]);
        for i in 0..3 {
            router.deliver(2, frame(11, i));
        }
        assert_eq!(
            metrics.peer_drops_total.load(Ordering::Relaxed),
            1,
            "third one dropped"
        );
        for i in 0..2 {
            match rx.try_recv().map(|e| e.op) {
                Some(Op::PeerMessage {
                    from,
                    partition_id,
                    payload,
                }) => {
                    assert_eq!((from, partition_id), (2, 11));
                    assert_eq!(*payload, [i; 8]);
                }
                other => panic!("expected a peer message, got {other:?}"),
            }
        }
        assert!(rx.try_recv().is_none());
        router.deliver(2, frame(99, 0));
        assert_eq!(metrics.peer_drops_total.load(Ordering::Relaxed), 2);
        // A topic created later is routed once the catalog moved.
        let mut t = table();
        t.topics.insert(
            "u".into(),
            TopicMeta {
                partitions: 1,
                first_partition_id: 99,
                state: TopicState::Creating,
                replication_factor: 3,
            },
        );
        catalog.publish(t);
        router.deliver(2, frame(99, 0));
        assert_eq!(metrics.peer_drops_total.load(Ordering::Relaxed), 2);
        let owner = shard_for("u", 0, 2);
        let rx = if owner == 0 { &rx0 } else { &rx1 };
        assert!(rx.try_recv().is_some());
        // The metadata group's frames go to shard 0, in no topic.
        let meta = crate::meta_hosted::META_PARTITION_ID;
        router.deliver(3, frame(meta, 5));
        assert_eq!(metrics.peer_drops_total.load(Ordering::Relaxed), 2);
        match rx0.try_recv().map(|e| e.op) {
            Some(Op::PeerMessage {
                from, partition_id, ..
            }) => assert_eq!((from, partition_id), (3, meta)),
            other => panic!("expected the metadata frame on shard 0, got {other:?}"),
        }
    }
}
