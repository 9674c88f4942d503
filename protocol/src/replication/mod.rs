//! Replica-to-replica messages of Viewstamped Replication (DESIGN.md
//! section 6). No I/O: [`Message::encode`] appends bytes to a buffer and
//! [`Message::decode`] validates a buffer holding exactly one message.
//!
//! All integers are little-endian. A message is a [`HEADER_LEN`]-byte header
//! followed by `body_len` bytes of body.
//!
//! # Header (version 1)
//!
//! ```text
//! off size field
//!   0  u32  magic            MAGIC ("RLGR")
//!   4  u8   version          1
//!   5  u8   command          Command
//!   6  u16  header_len       64 in version 1
//!   8  u64  header_checksum  checksum of the header_len bytes with 8..16 zeroed
//!  16  u64  body_checksum    checksum of the body bytes (a Chunk's: of its
//!                            fixed fields only, see below)
//!  24  u128 cluster_id
//!  40  u32  partition_id
//!  44  u32  view             the sender's view
//!  48  u32  body_len         <= ReplicationLimits::body_bytes_max
//!  52  u8   replica          the sender's index
//!  53  [u8; 11] reserved     0
//! ```
//!
//! # Bodies (version 1)
//!
//! `headers` is `count` x 96-byte batch headers ([`crate::batch`]), `batch`
//! one whole record batch. Every body has exactly the length below.
//!
//! ```text
//! Prepare          u64 op, u64 commit, batch
//! PrepareOk        u64 op, u64 prepare_checksum
//! Commit           u64 commit, u64 commit_checksum
//! StartViewChange  (empty)
//! DoViewChange     u32 log_view, u32 reserved, u64 op, u64 head_checksum,
//!                  u64 commit, u32 count, u32 reserved, headers
//! StartView        u64 op, u64 head_checksum, u64 commit, u64 nonce,
//!                  u32 count, u32 reserved, headers
//! RequestStartView u64 nonce
//! ViewNotice       u64 nonce    (the answer of a replica that is not the
//!                               normal primary: its view, in the header)
//! RequestPrepares  u64 op_min, u64 op_max            (inclusive range)
//! Prepares         u64 commit, u32 count, u32 reserved, count x batch
//! RangeEvicted     u64 op_min, u64 op_max, u64 op_held_min,
//!                  u64 log_start_offset, u64 purge_generation,
//!                  u8 reason, [u8; 7] reserved
//! RequestSnapshot  u64 nonce, u64 commit, u64 purge_generation
//! SnapshotOffer    u64 nonce, u64 snapshot_id, u64 commit_max,
//!                  u8 kind (1 offer, 2 refused), u8 reason (0 for an offer),
//!                  [u8; 6] reserved, then for an offer the manifest
//!                  ([`crate::manifest`]) filling the rest of the body
//! RequestChunks    u64 snapshot_id, u32 count, u32 reserved,
//!                  count x (u32 artifact, u32 chunk), strictly increasing
//! Chunk            u64 snapshot_id, u32 artifact, u32 chunk, data (the rest)
//! ReleaseSnapshot  u64 snapshot_id
//! ```
//!
//! The last five are state transfer (DESIGN.md section 7, [`transfer`]).
//! An offer's manifest names the snapshot's view, commit, frontier and
//! purge generation; the decoder checks it agrees with the message
//! (snapshot id, partition, view at most the message's, commit at most
//! `commit_max`, frontier at most its commit). A refusal carries no
//! manifest and says whether it is transient ([`Refusal::is_transient`]).
//! A Chunk's bytes are checked by the receiver against the manifest's
//! checksum for its key, so a Chunk's body checksum covers only its fixed
//! fields (snapshot id, artifact, chunk: [`body_checksum_len`]): hashing
//! the data for the transit too would hash every transferred byte twice on
//! each side. End to end, a flipped bit in the header fails the header
//! checksum, one in the fixed fields the body checksum, and one in the data
//! the manifest's chunk checksum (the receiver charges the peer and asks
//! again); on disk, the serving side checks each chunk it reads back
//! against the same checksum before it sends it.
//!
//! A Prepare carries the batch bytes exactly as the primary stamped them:
//! the batch header already holds op, view, offset and chain link, so the
//! decoder checks that the Prepare's `op`, the header's `view` and
//! `partition_id` equal the batch's, and a backup stores the bytes without
//! re-stamping. The Prepare's checksum (what PrepareOk echoes and Commit
//! names) is the batch's `header_checksum`.
//!
//! The view-change suffix (DoViewChange, StartView) is sent as the full
//! 96-byte batch headers rather than a compact (op, view, offset, checksum)
//! summary: each header verifies itself (its own checksum), the run verifies
//! as a chain (`prev_checksum`, offsets, ops), a repaired body is matched
//! against it by `header_checksum`, and no second format has to be kept in
//! step with the batch header. A suffix is bounded by the pipeline, so the
//! extra 64 bytes per op are small.
//!
//! Runs of batches or headers (a suffix, the batches of a Prepares) must be
//! one piece of a log: ops consecutive, each `prev_checksum` the previous
//! `header_checksum`, each `base_offset` the previous next offset, views
//! never decreasing, all of the header's partition.
//!
//! # Versions
//!
//! The version says which fields exist. A later version only appends: new
//! header fields after offset 64 (raising `header_len`), new body fields
//! after the version-1 fields of that body. A decoder accepts exactly the
//! versions it knows, with the header and body lengths each of them implies,
//! and refuses any other version with [`ReplicationError::UnsupportedVersion`]
//! (peers agree on a version before talking; this build knows version 1).
//!
//! # Limits and ownership
//!
//! Every length and count is checked against [`ReplicationLimits`] (and
//! against the bytes actually present) before anything is sized by it; a
//! header declaring a 4 GiB body is refused from its 64 bytes alone.
//! Decoding borrows: a [`Prepare`] and a [`Prepares`] hold [`BatchView`]s
//! into the input bytes (batches are the only large payloads); suffix
//! headers are decoded into a bounded `Vec<BatchHeader>`.
//!
//! [`Message::encode`] runs the same checks as the decoder (except the
//! receiver's limits), so it never emits a message a peer must refuse.

mod body;
mod error;
mod header;
mod run;
#[cfg(test)]
mod tests;
pub mod transfer;

pub use error::ReplicationError;
pub use header::Header;
pub use transfer::{
    Chunk, ChunkKey, Offer, Refusal, ReleaseSnapshot, RequestChunks, RequestSnapshot, SnapshotOffer,
};

use crate::batch::{BatchHeader, BatchView, BODY_LEN_MAX_BYTES, HEADER_LEN as BATCH_HEADER_LEN};
use crate::manifest::ManifestLimits;

/// How many leading bytes of a `command` body of `body_len` bytes its
/// body checksum covers: all of them, but for a Chunk only its fixed fields
/// (its data is verified against the manifest; see the module docs).
pub fn body_checksum_len(command: Command, body_len: usize) -> usize {
    match command {
        Command::Chunk => body_len.min(transfer::CHUNK_FIXED),
        _ => body_len,
    }
}

fn checksum_body(command: Command, body: &[u8]) -> u64 {
    let covered = body_checksum_len(command, body.len());
    debug_assert!(covered <= body.len());
    crate::checksum(&body[..covered])
}

/// "RLGR" when read as little-endian bytes.
pub const MAGIC: u32 = u32::from_le_bytes(*b"RLGR");
/// The version this build writes (and the only one it reads).
pub const VERSION: u8 = 1;
/// Header size in version 1.
pub const HEADER_LEN: usize = 64;

/// What a message is; the header's `command` byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Command {
    Prepare = 1,
    PrepareOk = 2,
    Commit = 3,
    StartViewChange = 4,
    DoViewChange = 5,
    StartView = 6,
    RequestStartView = 7,
    RequestPrepares = 8,
    Prepares = 9,
    RangeEvicted = 10,
    RequestSnapshot = 11,
    SnapshotOffer = 12,
    RequestChunks = 13,
    Chunk = 14,
    ReleaseSnapshot = 15,
    ViewNotice = 16,
}

impl Command {
    pub fn from_u8(v: u8) -> Option<Command> {
        Some(match v {
            1 => Command::Prepare,
            2 => Command::PrepareOk,
            3 => Command::Commit,
            4 => Command::StartViewChange,
            5 => Command::DoViewChange,
            6 => Command::StartView,
            7 => Command::RequestStartView,
            8 => Command::RequestPrepares,
            9 => Command::Prepares,
            10 => Command::RangeEvicted,
            11 => Command::RequestSnapshot,
            12 => Command::SnapshotOffer,
            13 => Command::RequestChunks,
            14 => Command::Chunk,
            15 => Command::ReleaseSnapshot,
            16 => Command::ViewNotice,
            _ => return None,
        })
    }
}

/// Caps a receiver enforces before it allocates or hashes anything sized by
/// the peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicationLimits {
    /// Any message body, checked from the header alone.
    pub body_bytes_max: u32,
    /// Headers in a DoViewChange or StartView suffix.
    pub suffix_headers_max: u32,
    /// Batches in one Prepares.
    pub prepares_batches_max: u32,
    /// Batch bytes in one Prepares.
    pub prepares_bytes_max: u32,
    /// Chunk keys in one RequestChunks (a pull window).
    pub chunk_keys_max: u32,
    /// Data bytes of one Chunk.
    pub chunk_bytes_max: u32,
    /// The manifest of a SnapshotOffer.
    pub manifest: ManifestLimits,
}

/// Room for one largest batch plus a Prepare's own fields.
const BATCH_BYTES_MAX: u32 = BATCH_HEADER_LEN as u32 + BODY_LEN_MAX_BYTES;

impl Default for ReplicationLimits {
    fn default() -> Self {
        Self {
            // A Prepares may carry one batch of the largest size.
            body_bytes_max: BATCH_BYTES_MAX + 64,
            suffix_headers_max: 1024,
            prepares_batches_max: 256,
            prepares_bytes_max: BATCH_BYTES_MAX,
            chunk_keys_max: 256,
            chunk_bytes_max: ManifestLimits::default().chunk_size_bytes_max,
            manifest: ManifestLimits::default(),
        }
    }
}

/// Who sent a message, for which partition, in which view: the header
/// fields every message has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Envelope {
    pub cluster_id: u128,
    pub partition_id: u32,
    pub replica: u8,
    pub view: u32,
}

/// The primary's request to store one batch. Build with [`Prepare::new`].
#[derive(Debug, Clone, Copy)]
pub struct Prepare<'a> {
    /// `batch.header().vsr_op`; kept apart so the wire carries both and a
    /// backup can check them against each other.
    pub op: u64,
    /// The primary's commit number: always below `op`.
    pub commit: u64,
    pub batch: BatchView<'a>,
}

impl<'a> Prepare<'a> {
    /// A Prepare of `batch` (its op taken from the batch header).
    pub fn new(batch: BatchView<'a>, commit: u64) -> Self {
        Self {
            op: batch.header().vsr_op,
            commit,
            batch,
        }
    }

    /// What PrepareOk echoes: the batch's header checksum.
    pub fn checksum(&self) -> u64 {
        self.batch.header().header_checksum
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrepareOk {
    pub op: u64,
    /// `header_checksum` of the prepared batch, so an ack for a different
    /// batch at the same op (from another view) is never counted.
    pub prepare_checksum: u64,
}

/// The primary's heartbeat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Commit {
    pub commit: u64,
    /// `header_checksum` of the batch at op `commit` (0 when `commit` is
    /// 0), so a backup holding a different op there knows it must repair.
    pub commit_checksum: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DoViewChange {
    /// The view in which the sender's log was last normal; at most the
    /// header's view.
    pub log_view: u32,
    /// The sender's highest op.
    pub op: u64,
    /// `header_checksum` of op `op` (0 when `op` is 0): vouches for the
    /// chain below `op` even when the suffix is empty (a journal rebooted
    /// from a purged or installed store holds only its anchor).
    pub head_checksum: u64,
    /// The sender's commit number (not bounded by `op`: a replica may know
    /// ops are committed before it holds them).
    pub commit: u64,
    /// Headers of the sender's last ops, ending at `op` (empty only when
    /// the sender sends none).
    pub suffix: Vec<BatchHeader>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartView {
    pub op: u64,
    /// `header_checksum` of op `op` (0 when `op` is 0), as in
    /// [`DoViewChange::head_checksum`].
    pub head_checksum: u64,
    /// At most `op`: the new primary holds every committed op.
    pub commit: u64,
    /// Echoes a RequestStartView's nonce (0 when unsolicited), so a
    /// restarted replica takes only an answer given after it asked.
    pub nonce: u64,
    /// The canonical suffix, ending at `op`.
    pub suffix: Vec<BatchHeader>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestStartView {
    pub nonce: u64,
}

/// A replica's answer to a RequestStartView when it is not the normal
/// primary: its view (the header's) and the request's nonce, so a replica
/// that lost its disk learns the view from a quorum of fresh answers
/// before it acks or votes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ViewNotice {
    pub nonce: u64,
}

/// Asks for the batches of ops `op_min..=op_max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestPrepares {
    pub op_min: u64,
    pub op_max: u64,
}

/// Repair answer: a run of consecutive batches (never empty).
#[derive(Debug, Clone)]
pub struct Prepares<'a> {
    pub commit: u64,
    pub batches: Vec<BatchView<'a>>,
}

/// Why a range can no longer be served from the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum EvictedReason {
    /// The partition was purged.
    Purged = 1,
    /// Retention removed the segments.
    Retired = 2,
}

impl EvictedReason {
    pub fn from_u8(v: u8) -> Option<Self> {
        match v {
            1 => Some(EvictedReason::Purged),
            2 => Some(EvictedReason::Retired),
            _ => None,
        }
    }
}

/// Answer to a RequestPrepares whose start is gone: the asker must state
/// transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RangeEvicted {
    /// The range asked for.
    pub op_min: u64,
    pub op_max: u64,
    /// The lowest op the sender still holds; above `op_min`.
    pub op_held_min: u64,
    pub log_start_offset: u64,
    pub purge_generation: u64,
    pub reason: EvictedReason,
}

/// The body of a message, one variant per [`Command`].
#[derive(Debug, Clone)]
pub enum Body<'a> {
    Prepare(Prepare<'a>),
    PrepareOk(PrepareOk),
    Commit(Commit),
    StartViewChange,
    DoViewChange(DoViewChange),
    StartView(StartView),
    RequestStartView(RequestStartView),
    ViewNotice(ViewNotice),
    RequestPrepares(RequestPrepares),
    Prepares(Prepares<'a>),
    RangeEvicted(RangeEvicted),
    RequestSnapshot(RequestSnapshot),
    SnapshotOffer(SnapshotOffer),
    RequestChunks(RequestChunks),
    Chunk(Chunk<'a>),
    ReleaseSnapshot(ReleaseSnapshot),
}

impl Body<'_> {
    pub fn command(&self) -> Command {
        match self {
            Body::Prepare(_) => Command::Prepare,
            Body::PrepareOk(_) => Command::PrepareOk,
            Body::Commit(_) => Command::Commit,
            Body::StartViewChange => Command::StartViewChange,
            Body::DoViewChange(_) => Command::DoViewChange,
            Body::StartView(_) => Command::StartView,
            Body::RequestStartView(_) => Command::RequestStartView,
            Body::ViewNotice(_) => Command::ViewNotice,
            Body::RequestPrepares(_) => Command::RequestPrepares,
            Body::Prepares(_) => Command::Prepares,
            Body::RangeEvicted(_) => Command::RangeEvicted,
            Body::RequestSnapshot(_) => Command::RequestSnapshot,
            Body::SnapshotOffer(_) => Command::SnapshotOffer,
            Body::RequestChunks(_) => Command::RequestChunks,
            Body::Chunk(_) => Command::Chunk,
            Body::ReleaseSnapshot(_) => Command::ReleaseSnapshot,
        }
    }
}

/// One replication message. `'a` is the input buffer a decoded Prepare or
/// Prepares borrows its batches from.
#[derive(Debug, Clone)]
pub struct Message<'a> {
    pub envelope: Envelope,
    pub body: Body<'a>,
}

impl<'a> Message<'a> {
    pub fn command(&self) -> Command {
        self.body.command()
    }

    /// Appends the encoded message to `out`. Refuses (leaving `out` as it
    /// was) a message the decoder would refuse for its contents.
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), ReplicationError> {
        let start = out.len();
        let result = self.encode_inner(start, out);
        if result.is_err() {
            out.truncate(start);
        }
        result
    }

    fn encode_inner(&self, start: usize, out: &mut Vec<u8>) -> Result<(), ReplicationError> {
        out.resize(start + HEADER_LEN, 0);
        body::encode(&self.envelope, &self.body, out)?;
        let body_len = out.len() - start - HEADER_LEN;
        let body_len = u32::try_from(body_len).map_err(|_| ReplicationError::BodyTooLarge {
            body_len: body_len as u64,
            max: u64::from(u32::MAX),
        })?;
        let header = Header {
            version: VERSION,
            command: self.command(),
            header_checksum: 0,
            body_checksum: checksum_body(self.command(), &out[start + HEADER_LEN..]),
            envelope: self.envelope,
            body_len,
        };
        let mut head = [0u8; HEADER_LEN];
        header.encode(&mut head);
        // In bounds: `out` was grown by HEADER_LEN at `start` above.
        out[start..start + HEADER_LEN].copy_from_slice(&head);
        Ok(())
    }

    /// Decodes `bytes`, which must hold exactly one message, checking
    /// everything (checksums, limits, batch structure, runs) before
    /// returning. Prepare and Prepares borrow their batches from `bytes`.
    pub fn decode(
        bytes: &'a [u8],
        limits: &ReplicationLimits,
    ) -> Result<Message<'a>, ReplicationError> {
        let header = Header::decode(bytes, limits)?;
        let total = HEADER_LEN + crate::reader::usize_from(header.body_len);
        let body = match bytes.get(HEADER_LEN..total) {
            Some(body) => body,
            None => {
                return Err(ReplicationError::Truncated {
                    needed: total,
                    available: bytes.len(),
                })
            }
        };
        if bytes.len() > total {
            return Err(ReplicationError::TrailingBytes {
                extra: bytes.len() - total,
            });
        }
        let actual = checksum_body(header.command, body);
        if actual != header.body_checksum {
            return Err(ReplicationError::BodyChecksum {
                command: header.command,
                expected: header.body_checksum,
                actual,
            });
        }
        let body = body::decode(&header, body, limits)?;
        Ok(Message {
            envelope: header.envelope,
            body,
        })
    }
}
