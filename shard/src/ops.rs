//! The vocabulary shards and connections exchange: operations on a
//! partition or the catalog, their replies and errors, status reports, and
//! the envelopes that carry them through a shard's mailbox.

use crate::peer_buf::{Outgoing, PeerPayload};
/// A produce's batch: heap or a lent aligned buffer (the replica's type,
/// named here for the ops' users).
pub use crate::vsr::ClientBatch;
use crossbeam_channel::Sender;
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

/// Latency buckets, microseconds: 50 µs to 10 s (requests, and a
/// replicated op's prepare-to-commit).
pub const LATENCY_US_BOUNDS: &[u64] = &[
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 5_000_000, 10_000_000,
];

/// A latency histogram as plain data (one owner records it; a status
/// carries a copy to the metrics): a count per bound of
/// [`LATENCY_US_BOUNDS`] plus +Inf, and the sum.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LatencyCounts {
    pub bucket_counts: Vec<u64>,
    pub sum_us: u64,
}

impl Default for LatencyCounts {
    fn default() -> LatencyCounts {
        LatencyCounts {
            bucket_counts: vec![0; LATENCY_US_BOUNDS.len() + 1],
            sum_us: 0,
        }
    }
}

impl LatencyCounts {
    pub fn record(&mut self, us: u64) {
        let i = LATENCY_US_BOUNDS.partition_point(|&b| b < us);
        debug_assert!(i < self.bucket_counts.len());
        if let Some(b) = self.bucket_counts.get_mut(i) {
            *b += 1;
        }
        self.sum_us = self.sum_us.saturating_add(us);
    }

    pub fn count(&self) -> u64 {
        self.bucket_counts.iter().sum()
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
    /// The replica's view; the VSR figures below are None for a
    /// partition that is not replicated (or is unavailable).
    pub view: Option<u32>,
    /// The last op in this replica's log (its frontier, in ops).
    pub op: Option<u64>,
    /// The last op this replica committed.
    pub commit_op: Option<u64>,
    /// Ops committed in the group (as far as this replica heard from the
    /// primary) that this replica has not committed: its lag.
    pub lag_ops: Option<u64>,
    /// View changes this replica entered since the partition opened here.
    pub view_changes: Option<u64>,
    /// Repair requests (RequestPrepares) it sent since then.
    pub repairs: Option<u64>,
    /// The state transfer this replica runs, if one is (`ctl transfers`).
    pub transfer: Option<TransferStatus>,
    /// A replicated partition's prepare-to-commit latency of the ops it
    /// acknowledged as primary since it opened here (metrics only).
    #[serde(skip)]
    pub commit_latency: Option<LatencyCounts>,
}

/// A running state transfer, as `ctl transfers` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TransferStatus {
    /// The receiver's phase (`asking`, `pulling`, ...).
    pub state: &'static str,
    /// Why it started (`vsr::Trigger::label`).
    pub trigger: &'static str,
    /// The node whose offer was taken, once one was.
    pub peer_node: Option<u32>,
    pub bytes_received: u64,
    /// The offer's bytes (its manifest's artifacts), once the install began.
    pub bytes_total: Option<u64>,
    pub chunks_received: u64,
    pub chunks_total: Option<u64>,
    pub chunks_in_flight: usize,
    /// Wall clock (ms since the epoch) when this transfer started.
    pub started_ms: u64,
    /// The replica is frozen for the install.
    pub frozen: bool,
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
    /// Whether a `PurgeTo` reached its generation on this replica.
    Purge {
        done: bool,
    },
}

pub type Outcome = Result<OpReply, OpError>;

/// Topic-level operations, run by the controller (shard 0), one at a time.
#[derive(Debug)]
pub enum MetaOp {
    CreateTopic {
        topic: String,
        partitions: u32,
    },
    DeleteTopic {
        topic: String,
    },
    /// A cluster's purge of a replicated topic, all its partitions
    /// (`controller::cluster`).
    PurgeTopic {
        topic: String,
    },
    /// A metadata command another node forwarded to this one's metadata
    /// primary (`meta_hosted::encode_forward` payload); one-way.
    Forwarded {
        from: u32,
        payload: Vec<u8>,
    },
}

/// Work for a shard.
#[derive(Debug)]
pub enum Op {
    Produce {
        partition_id: u32,
        batch: ClientBatch,
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
    /// A replicated partition's purge to its topic's purge generation
    /// (`Partition::purge_to`): answered [`OpReply::Purge`] at once.
    PurgeTo {
        partition_id: u32,
        generation: u64,
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
    /// A replication message from node `from` for the owner's partition
    /// (one-way: no reply; dropped and counted if it cannot be stepped).
    PeerMessage {
        from: u32,
        partition_id: u32,
        payload: PeerPayload,
    },
    /// A replication message for node `to`, to shard 0, which runs the
    /// peer transport (one-way).
    PeerSend {
        to: u32,
        partition_id: u32,
        payload: Outgoing,
    },
}

impl Op {
    /// Bytes of client payload the op carries (what the mailbox charges).
    pub fn payload_bytes(&self) -> u64 {
        match self {
            Op::Produce { batch, .. } => batch.as_ref().len() as u64,
            Op::PeerMessage { payload, .. } => payload.len() as u64,
            Op::PeerSend { payload, .. } => payload.payload().len() as u64,
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
    /// Nobody: a one-way op (peer messages).
    Nobody,
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

/// What a partition's transfers did (its shard sums them into metrics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TransferCounters {
    /// Transfers started, by trigger ([`crate::vsr::Trigger::index`]).
    pub started: [u64; crate::vsr::Trigger::ALL.len()],
    pub installs: u64,
    pub attempts_failed: u64,
    pub rotations: u64,
    pub refusals: u64,
    pub charges: u64,
    pub quarantines: u64,
    pub undecodable: u64,
    /// Ops refused because the partition's queue was full.
    pub ops_refused: u64,
    /// Installs that could not begin yet (the shard's install limit or
    /// budget, a busy log): retried on the receiver's flat interval.
    pub installs_deferred: u64,
}

impl TransferCounters {
    /// Adds `other`'s counts (a shard sums its partitions').
    pub fn add(&mut self, other: &Self) {
        for (sum, n) in self.started.iter_mut().zip(other.started) {
            *sum += n;
        }
        self.installs += other.installs;
        self.attempts_failed += other.attempts_failed;
        self.rotations += other.rotations;
        self.refusals += other.refusals;
        self.charges += other.charges;
        self.quarantines += other.quarantines;
        self.undecodable += other.undecodable;
        self.ops_refused += other.ops_refused;
        self.installs_deferred += other.installs_deferred;
    }
}
