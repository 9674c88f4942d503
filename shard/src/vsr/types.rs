//! What goes into and comes out of [`super::Replica::step`].
//!
//! [`Message`] mirrors the replication wire bodies
//! (`ringlog_protocol::replication`) field for field but owns its bytes:
//! the wire decoder borrows from a receive buffer, the machine keeps
//! batches across steps. The driver converts at the edge.

use std::sync::Arc;

use ringlog_protocol::batch::{BatchError, VerifiedBatch};
use ringlog_protocol::replication as wire;
use ringlog_storage::io::BatchBuf;

/// One record batch exactly as the primary stamped it (header + body).
/// Shared, so a Prepare to several backups and the journal hold one copy.
/// Built from a producer's `Vec` without copying its body (an `Arc<[u8]>`
/// would copy it: the shard's produce path moves the bytes in). One the
/// primary verified itself carries the proof ([`BatchBytes::verified`]),
/// so the store does not check its body again.
#[derive(Clone)]
pub struct BatchBytes(Arc<Held>);

enum Held {
    Plain(Vec<u8>),
    Verified(VerifiedBatch<ClientBatch>),
}

impl BatchBytes {
    /// The proof that these bytes were verified, if they were.
    pub fn verified(&self) -> Option<VerifiedBatch<&[u8]>> {
        match &*self.0 {
            Held::Verified(v) => Some(v.borrowed()),
            Held::Plain(_) => None,
        }
    }

    /// The verified batch itself, when this is its only holder (a client's
    /// batch in a cluster of one: no Prepare or log entry keeps a copy), so
    /// a store can take its buffer; else the handle back.
    pub fn into_verified(self) -> Result<VerifiedBatch<ClientBatch>, BatchBytes> {
        match Arc::try_unwrap(self.0) {
            Ok(Held::Verified(v)) => Ok(v),
            Ok(plain) => Err(BatchBytes(Arc::new(plain))),
            Err(shared) => Err(BatchBytes(shared)),
        }
    }
}

/// A producer's batch as the host hands it to the primary: in a heap
/// buffer, or read straight from the socket into a buffer lent by the
/// store's pool at the position in its block where it will be written, so
/// the store can write it as it is (`PartitionStore::append_owned_verified`).
#[derive(Debug)]
pub enum ClientBatch {
    Heap(Vec<u8>),
    Aligned(BatchBuf),
}

impl ClientBatch {
    /// The lent buffer, if it is one; else the batch back.
    pub fn into_aligned(self) -> Result<BatchBuf, ClientBatch> {
        match self {
            ClientBatch::Aligned(buf) => Ok(buf),
            heap => Err(heap),
        }
    }
}

/// A copy is a heap batch: a lent buffer has one holder.
impl Clone for ClientBatch {
    fn clone(&self) -> Self {
        ClientBatch::Heap(self.as_ref().to_vec())
    }
}

impl From<Vec<u8>> for ClientBatch {
    fn from(bytes: Vec<u8>) -> Self {
        ClientBatch::Heap(bytes)
    }
}

impl AsRef<[u8]> for ClientBatch {
    fn as_ref(&self) -> &[u8] {
        match self {
            ClientBatch::Heap(v) => v,
            ClientBatch::Aligned(b) => b.batch(),
        }
    }
}

impl AsMut<[u8]> for ClientBatch {
    fn as_mut(&mut self) -> &mut [u8] {
        match self {
            ClientBatch::Heap(v) => v,
            ClientBatch::Aligned(b) => b.batch_mut(),
        }
    }
}

impl From<Vec<u8>> for BatchBytes {
    fn from(bytes: Vec<u8>) -> Self {
        BatchBytes(Arc::new(Held::Plain(bytes)))
    }
}

impl From<&[u8]> for BatchBytes {
    fn from(bytes: &[u8]) -> Self {
        BatchBytes(Arc::new(Held::Plain(bytes.to_vec())))
    }
}

impl From<VerifiedBatch<ClientBatch>> for BatchBytes {
    fn from(batch: VerifiedBatch<ClientBatch>) -> Self {
        BatchBytes(Arc::new(Held::Verified(batch)))
    }
}

impl std::ops::Deref for BatchBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &*self.0 {
            Held::Plain(v) => v,
            Held::Verified(v) => v.as_bytes(),
        }
    }
}

impl AsRef<[u8]> for BatchBytes {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

/// Equal bytes are equal batches, verified or not.
impl PartialEq for BatchBytes {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl Eq for BatchBytes {}

impl std::fmt::Debug for BatchBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (**self).fmt(f)
    }
}

/// Names one storage operation; echoed by [`Input::IoDone`].
pub type IoId = u64;

/// Names one client append; echoed by [`Output::Reply`].
pub type Token = u64;

/// The replica's durable VSR state: written by [`StorageOp::PersistVsr`]
/// into the superblock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VsrState {
    pub view: u32,
    /// The view in which the log was last normal; at most `view`.
    pub log_view: u32,
    pub commit: u64,
    /// Booted with its disk lost and not yet repaired (see
    /// [`super::Replica::wiped`]): durable, so a crash mid-repair reboots
    /// it wiped again. A host making a store for a wiped replica writes
    /// this first.
    pub wiped: bool,
    /// Set with `wiped` when the disk was lost (an install keeps its view
    /// and leaves this clear): the view it promised before is unknown, so
    /// it acks nothing and ends the wipe only once a quorum of fresh
    /// answers (ViewNotice, StartView) named no view above its own.
    pub view_lost: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// The sender's view.
    pub view: u32,
    pub body: Body,
}

/// The protocol's owned bodies are used as they are; Prepare and Prepares
/// own their batches here (the wire types borrow them from a buffer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body {
    Prepare(Prepare),
    PrepareOk(wire::PrepareOk),
    Commit(wire::Commit),
    StartViewChange,
    DoViewChange(wire::DoViewChange),
    StartView(wire::StartView),
    RequestStartView(wire::RequestStartView),
    /// Not the normal primary: the sender's view, answering a
    /// RequestStartView (its nonce).
    ViewNotice(wire::ViewNotice),
    RequestPrepares(wire::RequestPrepares),
    Prepares(Prepares),
    /// A repair answer: the ops asked for are no longer held (the asker
    /// must transfer state; see [`Event::TransferNeeded`]).
    RangeEvicted(wire::RangeEvicted),
}

/// `op` is the batch header's `vsr_op`, `commit` the primary's (below op).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepare {
    pub op: u64,
    pub commit: u64,
    pub batch: BatchBytes,
}

/// A repair answer: consecutive batches, never empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepares {
    pub commit: u64,
    pub batches: Vec<BatchBytes>,
}

impl Body {
    pub fn name(&self) -> &'static str {
        match self {
            Body::Prepare(_) => "prepare",
            Body::PrepareOk(_) => "prepare_ok",
            Body::Commit(_) => "commit",
            Body::StartViewChange => "start_view_change",
            Body::DoViewChange(_) => "do_view_change",
            Body::StartView(_) => "start_view",
            Body::RequestStartView(_) => "request_start_view",
            Body::ViewNotice(_) => "view_notice",
            Body::RequestPrepares(_) => "request_prepares",
            Body::Prepares(_) => "prepares",
            Body::RangeEvicted(_) => "range_evicted",
        }
    }
}

#[derive(Debug, Clone)]
pub enum Input {
    Message {
        from: u8,
        msg: Message,
    },
    Tick,
    /// A producer's batch, stamped provisionally; the primary re-stamps it.
    ClientAppend {
        token: Token,
        batch: ClientBatch,
    },
    /// The operator's purge of the partition: the primary sequences it as
    /// an op (a one-record batch marked `ATTR_PURGE`) and every replica,
    /// when it commits that op, drops every batch through it
    /// ([`StorageOp::Purge`]). The primary sequences nothing after it
    /// until it commits. Answered like an append (its op and offsets).
    ClientPurge {
        token: Token,
    },
    IoDone {
        id: IoId,
        result: Result<IoOutcome, IoFailure>,
    },
}

/// What a storage operation produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IoOutcome {
    Done,
    /// For [`StorageOp::ReadBatches`]: consecutive batches from `op_min`.
    Batches(Vec<BatchBytes>),
    /// For [`StorageOp::ReadBatches`]: `op_min` is below what the store
    /// still holds (retired or purged); answered with RangeEvicted.
    Evicted(wire::RangeEvicted),
}

/// A storage operation failed. Appends, flushes, truncations and VSR
/// writes fence the replica (fail-stop, DESIGN.md section 4); a failed read
/// only fails the repair answer it was for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("storage operation failed: {reason}")]
pub struct IoFailure {
    pub reason: String,
}

/// Storage operations, executed by the driver in emission order for one
/// replica: a `Flush` makes durable every `Append` emitted before it, and
/// a `TruncateAbove` applies to everything appended before it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StorageOp {
    /// Write `batch` (op `op`) after the current last op. Not yet durable.
    Append { op: u64, batch: BatchBytes },
    /// fdatasync everything appended so far.
    Flush,
    /// Write the superblock's view, log_view and commit (and sync it).
    PersistVsr(VsrState),
    /// Cut every op above `op` (zeroed and synced before the superblock
    /// names the lower frontier).
    TruncateAbove { op: u64 },
    /// Read ops `op_min..=op_max` (or a prefix of them) from the segments.
    ReadBatches { op_min: u64, op_max: u64 },
    /// The purge op `through_op` committed: drop every batch through it
    /// (the store keeps its chain point and bumps its durable purge
    /// generation). Emitted once, before any append above it, so the
    /// store's last op is `through_op`; a store that no longer holds it
    /// applied it already (a no-op: exactly once across restarts).
    Purge { through_op: u64 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Normal,
    ViewChange,
    /// Restarted or wiped: learning the view; never votes or leads.
    Recovering,
    /// A storage write failed: fail-stop until restarted from disk.
    Fenced,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appended {
    pub op: u64,
    pub base_offset: u64,
    pub next_offset: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AppendError {
    #[error("not the primary of view {view} (primary is replica {primary})")]
    NotPrimary { view: u32, primary: u8 },
    #[error("pipeline and client queue full ({queued} queued)")]
    Busy { queued: usize },
    #[error("invalid batch: {0}")]
    InvalidBatch(#[from] BatchError),
    #[error("batch is for partition {batch}, replica holds {replica}")]
    WrongPartition { batch: u32, replica: u32 },
    /// The primary lost its view with the op in flight: it may or may not
    /// commit in a later view.
    #[error("outcome unknown: the primary lost view {view} before op {op} committed")]
    OutcomeUnknown { view: u32, op: u64 },
    #[error("replica is fenced after a storage failure")]
    Fenced,
}

/// Why a replica needs a state transfer (DESIGN.md section 7): it
/// cannot catch up by repair. Named in [`Event::TransferNeeded`]; the
/// driver starts the transfer module's receiver with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// A peer answered repair with RangeEvicted: the ops were retired.
    RangeEvicted,
    /// A peer's purge generation is ahead of ours.
    Purged,
    /// A new or wiped replica: nothing to repair from.
    NewOrWiped,
    /// Repair made no progress for its budget of rounds.
    RepairStuck,
    /// A sealed segment below the commit failed verification.
    CorruptSegment,
}

impl Trigger {
    /// Every trigger, in the order of [`Trigger::label`]'s metrics series.
    pub const ALL: [Trigger; 5] = [
        Trigger::RangeEvicted,
        Trigger::Purged,
        Trigger::NewOrWiped,
        Trigger::RepairStuck,
        Trigger::CorruptSegment,
    ];

    /// Whether an offer ending where we end helps: only when our own bytes
    /// are suspect (a corrupt segment) or absent (wiped; an empty peer
    /// then still gives us its view of the log's start). Otherwise an
    /// offer must move us forward.
    pub fn takes_level_offer(self) -> bool {
        matches!(self, Trigger::CorruptSegment | Trigger::NewOrWiped)
    }

    /// The metrics and ctl name (`trigger="..."`).
    pub fn label(self) -> &'static str {
        match self {
            Trigger::RangeEvicted => "range_evicted",
            Trigger::Purged => "purged",
            Trigger::NewOrWiped => "new_or_wiped",
            Trigger::RepairStuck => "repair_stuck",
            Trigger::CorruptSegment => "corrupt_segment",
        }
    }

    /// This trigger's place in [`Trigger::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// Whether the replica keeps repairing (rotating peers) while the
    /// transfer runs, and stops transferring when its log grows: a peer
    /// may still hold the ops. A wiped replica's or a corrupt one's
    /// transfer replaces the log instead, so its repair waits.
    pub fn repairs_meanwhile(self) -> bool {
        matches!(
            self,
            Trigger::RangeEvicted | Trigger::Purged | Trigger::RepairStuck
        )
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Committed {
        op: u64,
    },
    StatusChanged {
        status: Status,
        view: u32,
    },
    /// Ops above `op` were cut from the log.
    Truncated {
        op: u64,
    },
    Fenced {
        reason: String,
    },
    /// An input was refused; `reason` says why (trace only).
    Dropped {
        what: &'static str,
        reason: &'static str,
    },
    /// The replica cannot catch up by repair, for `trigger`: the driver
    /// starts a state transfer (the transfer module's Receiver, with this
    /// trigger) and keeps stepping the replica, which votes (unless wiped)
    /// but neither leads nor acks meanwhile
    /// ([`super::Replica::is_transferring`]). Once an offer is taken it
    /// stops stepping it, persists the superblock wiped (a crash from there
    /// on reboots the replica wiped), and once installed reboots it with
    /// [`super::Replica::restart`] on the installed frontier. Emitted once
    /// per episode. For triggers that repair meanwhile
    /// ([`Trigger::repairs_meanwhile`]) the repair keeps retrying, rotating
    /// peers: when the log grows again the replica stops transferring and
    /// the driver cancels the transfer.
    TransferNeeded {
        trigger: Trigger,
        /// For [`Trigger::RangeEvicted`] and [`Trigger::Purged`] (the
        /// answer's reason): the peer that answered, and what it still
        /// holds.
        evicted: Option<(u8, wire::RangeEvicted)>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    Send {
        to: u8,
        msg: Message,
    },
    Io {
        id: IoId,
        op: StorageOp,
    },
    Reply {
        token: Token,
        result: Result<Appended, AppendError>,
    },
    Event(Event),
}

/// Outputs of steps; the driver drains it after each step. One step emits
/// at most O(pipeline_ops_max x replica_count) outputs.
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
