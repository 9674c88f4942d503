//! What goes into and comes out of the transfer machines.

use std::sync::Arc;

use ringlog_protocol::manifest::Manifest;
use ringlog_protocol::replication as wire;
use ringlog_protocol::BatchHeader;

/// Names one storage operation; echoed by `IoDone`.
pub type IoId = u64;

/// A chunk's bytes, shared between the outbox and a retransmission
/// (cloning does not copy): a range of a buffer, which may be the received
/// message it arrived in, so a chunk is not copied out of it before it is
/// staged ([`ChunkData::in_buffer`]).
#[derive(Clone)]
pub struct ChunkData {
    buf: Arc<Vec<u8>>,
    start: usize,
    end: usize,
}

impl ChunkData {
    /// Bytes `range` of `buf`, kept in it.
    pub fn in_buffer(buf: Vec<u8>, range: std::ops::Range<usize>) -> ChunkData {
        assert!(
            range.start <= range.end && range.end <= buf.len(),
            "a chunk lies inside its buffer"
        );
        ChunkData {
            buf: Arc::new(buf),
            start: range.start,
            end: range.end,
        }
    }
}

/// All of `buf`, kept in it.
impl From<Vec<u8>> for ChunkData {
    fn from(buf: Vec<u8>) -> ChunkData {
        let len = buf.len();
        ChunkData::in_buffer(buf, 0..len)
    }
}

/// A copy of `bytes`.
impl From<&[u8]> for ChunkData {
    fn from(bytes: &[u8]) -> ChunkData {
        ChunkData::in_buffer(bytes.to_vec(), 0..bytes.len())
    }
}

impl std::ops::Deref for ChunkData {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }
}

impl PartialEq for ChunkData {
    fn eq(&self, other: &ChunkData) -> bool {
        self[..] == other[..]
    }
}

impl Eq for ChunkData {}

impl std::fmt::Debug for ChunkData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ChunkData({} bytes)", self.len())
    }
}

/// Why a replica starts a transfer: the replica names it
/// ([`crate::vsr::Event::TransferNeeded`]).
pub use crate::vsr::Trigger;

/// Where a log ends: the offset, op and checksum the next batch links to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Frontier {
    pub next_offset: u64,
    pub last_op: u64,
    pub last_checksum: u64,
}

impl Frontier {
    pub fn of_manifest(m: &Manifest) -> Self {
        Self {
            next_offset: m.next_offset,
            last_op: m.last_op,
            last_checksum: m.last_checksum,
        }
    }

    /// Whether `header` is the batch right after this frontier: the first
    /// repaired batch after an install must be, or the snapshot and the
    /// log the replica repairs onto it are not one chain.
    pub fn closes_chain(&self, header: &BatchHeader) -> bool {
        header.prev_checksum == self.last_checksum
            && header.base_offset == self.next_offset
            && header.vsr_op == self.last_op + 1
    }
}

/// The installed frontier is what the replica's log chains on from.
impl From<Frontier> for crate::vsr::Anchor {
    fn from(f: Frontier) -> Self {
        Self {
            op: f.last_op,
            checksum: f.last_checksum,
            next_offset: f.next_offset,
        }
    }
}

/// The receiver's own state, what an offer must not be below.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Local {
    pub partition_id: u32,
    pub view: u32,
    pub commit: u64,
    pub purge_generation: u64,
    pub frontier: Frontier,
}

impl Local {
    /// The committed ops this replica holds: its superblock's commit may
    /// be above its log's end (a commit learned in a view change, or an
    /// install below it), and an offer only has to hold what we hold. A
    /// request asking for the superblock's commit would be refused by a
    /// primary that committed less and needs our ack to commit more (sim
    /// seed 7000104).
    pub fn commit_held(&self) -> u64 {
        self.commit.min(self.frontier.last_op)
    }
}

/// Why an offer was refused as stale or oversized (each but
/// [`Stale::NoProgress`], an honest answer, charged to the offering peer;
/// then the receiver rotates).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stale {
    PurgeGeneration {
        offered: u64,
        ours: u64,
    },
    Commit {
        offered: u64,
        ours: u64,
    },
    Frontier {
        offered: u64,
        ours: u64,
    },
    View {
        offered: u32,
        ours: u32,
    },
    /// The manifest's commit is above the server's own commit_max.
    CommitAboveMax {
        commit: u64,
        commit_max: u64,
    },
    /// The manifest's last op is above its commit (uncommitted data).
    UncommittedOps {
        last_op: u64,
        commit: u64,
    },
    ChunkSize {
        offered: u32,
        ours: u32,
    },
    TooManyArtifacts {
        offered: u64,
        max: u64,
    },
    ArtifactTooLarge {
        offered: u64,
        max: u64,
    },
    TooManyBytes {
        offered: u64,
        max: u64,
    },
    WrongPartition {
        offered: u32,
        ours: u32,
    },
    /// The offer ends where we do and the trigger needs us moved forward.
    NoProgress,
}

/// Transfer messages, owned (the wire's Chunk borrows its bytes; the
/// driver converts at the edge, as for [`crate::vsr::Message`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    RequestSnapshot(wire::RequestSnapshot),
    SnapshotOffer(wire::SnapshotOffer),
    RequestChunks(wire::RequestChunks),
    Chunk {
        snapshot_id: u64,
        key: wire::ChunkKey,
        data: ChunkData,
    },
    ReleaseSnapshot(wire::ReleaseSnapshot),
}

/// Storage operations, run by [`super::io::execute`] in emission order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransferOp {
    /// Serve: open a snapshot of what is at or below `commit`.
    OpenSnapshot { commit: u64 },
    /// Serve: read these chunks (answered with their bytes, in order).
    ReadChunks {
        snapshot_id: u64,
        keys: Vec<wire::ChunkKey>,
    },
    /// Serve: the snapshot's lease can go.
    ReleaseSnapshot { snapshot_id: u64 },
    /// Receive: check the offer and stage it.
    BeginInstall { manifest: Arc<Manifest> },
    /// Receive: verified chunks (by the session, against the manifest) to
    /// stage.
    AcceptChunks {
        chunks: Vec<(wire::ChunkKey, ChunkData)>,
    },
    /// Receive: the commit point.
    CommitInstall,
    /// Receive: drop the staged install.
    AbortInstall,
}

impl TransferOp {
    pub fn name(&self) -> &'static str {
        match self {
            TransferOp::OpenSnapshot { .. } => "open_snapshot",
            TransferOp::ReadChunks { .. } => "read_chunks",
            TransferOp::ReleaseSnapshot { .. } => "release_snapshot",
            TransferOp::BeginInstall { .. } => "begin_install",
            TransferOp::AcceptChunks { .. } => "accept_chunks",
            TransferOp::CommitInstall => "commit_install",
            TransferOp::AbortInstall => "abort_install",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IoOutcome {
    Done,
    /// For OpenSnapshot: the manifest offered (cut at the commit).
    Snapshot(Arc<Manifest>),
    /// For ReadChunks: one buffer per key, in order.
    Chunks(Vec<ChunkData>),
}

/// Whose fault a failed operation was; decides what the session does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// The offer or a chunk was bad: charged to the peer, attempt failed.
    Peer,
    /// Local and passing (busy log, install budget, K installs, S
    /// snapshots): retried on the flat interval.
    Transient,
    /// The snapshot is unknown or gone (serving side).
    Gone,
    /// Local and lasting (I/O error, fenced store): the attempt fails and
    /// backs off.
    Local,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind:?} fault: {reason}")]
pub struct Fault {
    pub kind: FaultKind,
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A RequestSnapshot went to `peer` with a fresh nonce.
    Asked {
        peer: u8,
        nonce: u64,
    },
    /// An offer was taken and its install begun.
    OfferTaken {
        peer: u8,
        snapshot_id: u64,
    },
    OfferRefused {
        peer: u8,
        why: Stale,
    },
    /// The install committed: repair from `frontier`, and check the first
    /// repaired batch with [`Frontier::closes_chain`].
    Installed {
        peer: u8,
        frontier: Frontier,
    },
    /// An attempt failed; the log is still the one ending at `frontier`.
    AttemptFailed {
        peer: u8,
        reason: &'static str,
        frontier: Frontier,
        backoff_ticks: u64,
    },
    Rotated {
        from: u8,
        to: u8,
    },
    Quarantined {
        peer: u8,
        until_tick: u64,
    },
    /// An input was refused or a fault was charged (trace only).
    Dropped {
        what: &'static str,
        reason: &'static str,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    Send { to: u8, msg: Message },
    Io { id: IoId, op: TransferOp },
    Event(Event),
}

/// Outputs of steps; the driver drains it after each step. One step emits
/// at most a window of chunk messages plus a few others.
#[derive(Debug, Default)]
pub struct Outbox {
    outputs: Vec<Output>,
}

impl Outbox {
    pub fn new() -> Self {
        Self::default()
    }

    pub(super) fn push(&mut self, output: Output) {
        self.outputs.push(output);
    }

    pub(super) fn send(&mut self, to: u8, msg: Message) {
        self.outputs.push(Output::Send { to, msg });
    }

    pub(super) fn event(&mut self, event: Event) {
        self.outputs.push(Output::Event(event));
    }

    pub fn drain(&mut self) -> std::vec::Drain<'_, Output> {
        self.outputs.drain(..)
    }

    pub fn is_empty(&self) -> bool {
        self.outputs.is_empty()
    }

    pub fn as_slice(&self) -> &[Output] {
        &self.outputs
    }
}

/// The receiver's counters (metrics and ctl read them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReceiverCounters {
    pub starts: u64,
    pub requests_sent: u64,
    pub offers_taken: u64,
    pub offers_stale: u64,
    /// Offers not echoing the nonce in flight (or from another peer).
    pub offers_unsolicited: u64,
    /// Copies of an answer already handled (dropped, not charged).
    pub offers_repeated: u64,
    pub refusals_transient: u64,
    pub refusals_final: u64,
    pub decode_failures: u64,
    pub chunk_requests_sent: u64,
    pub chunks_requested: u64,
    pub chunks_rerequested: u64,
    pub chunks_received: u64,
    pub chunks_unrequested: u64,
    pub chunks_garbage: u64,
    /// Duplicates of chunks already asked for, and chunks of the attempt
    /// that ended last (dropped, not charged: the network repeats).
    pub chunks_late: u64,
    pub bytes_received: u64,
    pub stalls: u64,
    pub rotations: u64,
    pub charges: u64,
    pub quarantines: u64,
    pub attempts_failed: u64,
    pub aborts: u64,
    pub installs: u64,
    /// Consecutive failed attempts now (reset only by an install).
    pub failures_consecutive: u32,
    pub backoff_ticks_last: u64,
}

/// The serving side's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ServerCounters {
    pub requests: u64,
    pub offers: u64,
    pub refused_busy: u64,
    pub refused_not_normal: u64,
    pub refused_not_ahead: u64,
    pub refused_unavailable: u64,
    pub unknown_snapshot: u64,
    pub chunk_requests: u64,
    pub chunks_served: u64,
    pub bytes_served: u64,
    /// Keys refused: outside the manifest, or beyond the reads bound.
    pub keys_refused: u64,
    pub released: u64,
    pub expired: u64,
}

#[cfg(test)]
mod chunk_data_tests {
    use super::ChunkData;

    /// A chunk kept in its buffer is that buffer's bytes (no copy), clones
    /// share them, and equality is by bytes.
    #[test]
    fn chunk_data_stays_in_its_buffer() {
        let buf: Vec<u8> = (0..100u8).collect();
        let at = buf.as_ptr() as usize;
        let c = ChunkData::in_buffer(buf, 10..30);
        assert_eq!(c.len(), 20);
        assert_eq!(c.as_ptr() as usize, at + 10, "not copied");
        assert_eq!(c.clone().as_ptr(), c.as_ptr(), "clones share");
        let copied: Vec<u8> = (10..30u8).collect();
        assert_eq!(c, ChunkData::from(&copied[..]));
        assert_ne!(c, ChunkData::from(vec![0u8; 20]));
    }

    #[test]
    #[should_panic(expected = "inside its buffer")]
    fn a_range_past_the_buffer_is_refused() {
        let _ = ChunkData::in_buffer(vec![0; 4], 2..5);
    }
}
