//! State-transfer bodies (DESIGN.md section 7): a replica that cannot catch
//! up by repair asks a peer for a snapshot, pulls its chunks with a window
//! of requests, and releases it. Layouts are in the module docs of
//! [`super`]; this file holds the types and their codecs.
//!
//! Every field a receiver sizes anything by is checked against
//! [`ReplicationLimits`] first; the offered manifest is decoded with
//! [`ReplicationLimits::manifest`], so a hostile offer costs at most its
//! capped bytes.

use super::{Command, Envelope, ReplicationError, ReplicationLimits};
use crate::manifest::Manifest;
use crate::reader::{usize_from, Reader};

// Version-1 sizes of the fixed part of each body.
pub(super) const REQUEST_SNAPSHOT_LEN: usize = 24;
pub(super) const SNAPSHOT_OFFER_FIXED: usize = 32;
pub(super) const REQUEST_CHUNKS_FIXED: usize = 16;
pub(super) const CHUNK_KEY_LEN: usize = 8;
pub(super) const CHUNK_FIXED: usize = 16;
pub(super) const RELEASE_SNAPSHOT_LEN: usize = 8;

/// A receiver's ask for a snapshot of the envelope's partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestSnapshot {
    /// Fresh per attempt (never 0): an offer is taken only if it echoes the
    /// nonce of the request in flight, so an offer made before the receiver
    /// restarted (or before a purge) is never installed.
    pub nonce: u64,
    /// The receiver's commit: a server whose commit is not above it has
    /// nothing to offer.
    pub commit: u64,
    /// The receiver's durable purge generation.
    pub purge_generation: u64,
}

/// Why a server does not offer, or no longer serves, a snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Refusal {
    /// Every snapshot lease of the partition is taken: retry later.
    Busy = 1,
    /// The server is not Normal (view change, recovering, installing).
    NotNormal = 2,
    /// The server's commit is not above the receiver's: ask another peer.
    NotAhead = 3,
    /// The partition is fenced or not served by this replica.
    Unavailable = 4,
    /// A RequestChunks named a snapshot that expired or was released.
    UnknownSnapshot = 5,
}

impl Refusal {
    pub fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => Refusal::Busy,
            2 => Refusal::NotNormal,
            3 => Refusal::NotAhead,
            4 => Refusal::Unavailable,
            5 => Refusal::UnknownSnapshot,
            _ => return None,
        })
    }

    /// A transient refusal is retried against the same peer on a flat
    /// interval; a final one rotates to another peer.
    pub fn is_transient(self) -> bool {
        matches!(self, Refusal::Busy | Refusal::NotNormal)
    }
}

/// What a SnapshotOffer carries: a snapshot, or a refusal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Offer {
    /// The manifest holds the view, commit, frontier, purge generation and
    /// snapshot id, and the sealed segments at or below the commit.
    Snapshot(Manifest),
    Refused(Refusal),
}

/// The answer to a RequestSnapshot (or to a RequestChunks for an unknown
/// snapshot: then `Refused(UnknownSnapshot)` naming that snapshot).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotOffer {
    /// The request's nonce; 0 only for `UnknownSnapshot`, which answers a
    /// RequestChunks (no nonce).
    pub nonce: u64,
    /// The offered snapshot's id, or the unknown one; 0 for other refusals.
    pub snapshot_id: u64,
    /// The highest commit the server knows of: a manifest's commit is at
    /// most this.
    pub commit_max: u64,
    pub offer: Offer,
}

/// One chunk: `chunk` of artifact `artifact` of the manifest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ChunkKey {
    pub artifact: u32,
    pub chunk: u32,
}

/// A window of chunk requests; keys strictly increasing (no duplicates).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestChunks {
    pub snapshot_id: u64,
    pub keys: Vec<ChunkKey>,
}

/// One chunk's bytes, borrowed from the input buffer. The receiver checks
/// them against the manifest's checksum for the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk<'a> {
    pub snapshot_id: u64,
    pub key: ChunkKey,
    pub data: &'a [u8],
}

/// The receiver is done with a snapshot (installed or gave up): its lease
/// can go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReleaseSnapshot {
    pub snapshot_id: u64,
}

fn invalid(
    command: Command,
    field: &'static str,
    value: u64,
    why: &'static str,
) -> ReplicationError {
    ReplicationError::Invalid {
        command,
        field,
        value,
        reason: why,
    }
}

fn body_size(command: Command, body_len: usize, expected: usize) -> ReplicationError {
    ReplicationError::BodySize {
        command,
        body_len,
        expected,
    }
}

fn nonzero_id(command: Command, snapshot_id: u64) -> Result<(), ReplicationError> {
    if snapshot_id == 0 {
        return Err(invalid(command, "snapshot_id", 0, "0 names no snapshot"));
    }
    Ok(())
}

/// Reads exactly `len` fixed bytes at the start of `body` (`exact`: and
/// nothing after them).
fn fixed<'a>(
    command: Command,
    body: &'a [u8],
    len: usize,
    exact: bool,
) -> Result<Reader<'a>, ReplicationError> {
    if body.len() < len || (exact && body.len() != len) {
        return Err(body_size(command, body.len(), len));
    }
    Ok(Reader::new(body))
}

/// Reads a u64 of a body whose length was checked (running out is still a
/// typed error, never a panic).
fn u64_of(r: &mut Reader<'_>, command: Command, body_len: usize) -> Result<u64, ReplicationError> {
    r.u64().ok_or(body_size(command, body_len, body_len + 8))
}

fn u32_of(r: &mut Reader<'_>, command: Command, body_len: usize) -> Result<u32, ReplicationError> {
    r.u32().ok_or(body_size(command, body_len, body_len + 4))
}

pub(super) fn check_request_snapshot(r: &RequestSnapshot) -> Result<(), ReplicationError> {
    if r.nonce == 0 {
        return Err(invalid(
            Command::RequestSnapshot,
            "nonce",
            0,
            "0 is the unsolicited nonce",
        ));
    }
    Ok(())
}

pub(super) fn decode_request_snapshot(body: &[u8]) -> Result<RequestSnapshot, ReplicationError> {
    let command = Command::RequestSnapshot;
    let mut r = fixed(command, body, REQUEST_SNAPSHOT_LEN, true)?;
    let request = RequestSnapshot {
        nonce: u64_of(&mut r, command, body.len())?,
        commit: u64_of(&mut r, command, body.len())?,
        purge_generation: u64_of(&mut r, command, body.len())?,
    };
    check_request_snapshot(&request)?;
    Ok(request)
}

pub(super) fn encode_request_snapshot(
    r: &RequestSnapshot,
    out: &mut Vec<u8>,
) -> Result<(), ReplicationError> {
    check_request_snapshot(r)?;
    for v in [r.nonce, r.commit, r.purge_generation] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    Ok(())
}

/// The offer's fields must agree with each other and with its manifest.
pub(super) fn check_snapshot_offer(
    env: &Envelope,
    o: &SnapshotOffer,
) -> Result<(), ReplicationError> {
    let command = Command::SnapshotOffer;
    match &o.offer {
        Offer::Snapshot(m) => check_offered_manifest(env, o, m),
        Offer::Refused(Refusal::UnknownSnapshot) => {
            nonzero_id(command, o.snapshot_id)?;
            if o.nonce != 0 {
                return Err(invalid(command, "nonce", o.nonce, "answers no request"));
            }
            Ok(())
        }
        Offer::Refused(_) => {
            if o.nonce == 0 {
                return Err(invalid(command, "nonce", 0, "a refusal echoes the request"));
            }
            if o.snapshot_id != 0 {
                return Err(invalid(
                    command,
                    "snapshot_id",
                    o.snapshot_id,
                    "a refusal offers no snapshot",
                ));
            }
            Ok(())
        }
    }
}

fn check_offered_manifest(
    env: &Envelope,
    o: &SnapshotOffer,
    m: &Manifest,
) -> Result<(), ReplicationError> {
    let command = Command::SnapshotOffer;
    if o.nonce == 0 {
        return Err(invalid(command, "nonce", 0, "an offer echoes the request"));
    }
    nonzero_id(command, o.snapshot_id)?;
    let pairs = [
        ("snapshot_id", o.snapshot_id, m.snapshot_id),
        (
            "partition_id",
            u64::from(env.partition_id),
            u64::from(m.partition_id),
        ),
    ];
    for (field, message, manifest) in pairs {
        if message != manifest {
            return Err(ReplicationError::OfferMismatch {
                field,
                message,
                manifest,
            });
        }
    }
    if m.view > env.view {
        let view = u64::from(m.view);
        return Err(invalid(
            command,
            "manifest view",
            view,
            "is above the message's view",
        ));
    }
    if m.commit > o.commit_max {
        return Err(invalid(
            command,
            "manifest commit",
            m.commit,
            "is above commit_max",
        ));
    }
    if m.last_op > m.commit {
        return Err(invalid(
            command,
            "manifest last_op",
            m.last_op,
            "is above its commit",
        ));
    }
    Ok(())
}

pub(super) fn decode_snapshot_offer(
    env: &Envelope,
    body: &[u8],
    limits: &ReplicationLimits,
) -> Result<SnapshotOffer, ReplicationError> {
    let command = Command::SnapshotOffer;
    let mut r = fixed(command, body, SNAPSHOT_OFFER_FIXED, false)?;
    let nonce = u64_of(&mut r, command, body.len())?;
    let snapshot_id = u64_of(&mut r, command, body.len())?;
    let commit_max = u64_of(&mut r, command, body.len())?;
    let kind = r
        .u8()
        .ok_or(body_size(command, body.len(), SNAPSHOT_OFFER_FIXED))?;
    let reason = r
        .u8()
        .ok_or(body_size(command, body.len(), SNAPSHOT_OFFER_FIXED))?;
    let reserved = r.take(6).unwrap_or_default();
    if reserved.iter().any(|&b| b != 0) {
        return Err(ReplicationError::NonZeroReserved {
            field: "snapshot offer reserved",
        });
    }
    let rest = r.take(r.remaining()).unwrap_or_default();
    let offer = match (kind, reason) {
        (OFFER_KIND_SNAPSHOT, 0) => Offer::Snapshot(
            Manifest::decode(rest, &limits.manifest).map_err(ReplicationError::Manifest)?,
        ),
        (OFFER_KIND_REFUSED, _) => {
            if !rest.is_empty() {
                return Err(body_size(command, body.len(), SNAPSHOT_OFFER_FIXED));
            }
            let reason = Refusal::from_u8(reason).ok_or(invalid(
                command,
                "reason",
                u64::from(reason),
                "unknown refusal",
            ))?;
            Offer::Refused(reason)
        }
        (OFFER_KIND_SNAPSHOT, r) => {
            return Err(invalid(
                command,
                "reason",
                u64::from(r),
                "an offer has no reason",
            ))
        }
        (k, _) => return Err(invalid(command, "kind", u64::from(k), "unknown offer kind")),
    };
    let o = SnapshotOffer {
        nonce,
        snapshot_id,
        commit_max,
        offer,
    };
    check_snapshot_offer(env, &o)?;
    Ok(o)
}

const OFFER_KIND_SNAPSHOT: u8 = 1;
const OFFER_KIND_REFUSED: u8 = 2;

pub(super) fn encode_snapshot_offer(
    env: &Envelope,
    o: &SnapshotOffer,
    out: &mut Vec<u8>,
) -> Result<(), ReplicationError> {
    check_snapshot_offer(env, o)?;
    for v in [o.nonce, o.snapshot_id, o.commit_max] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    match &o.offer {
        Offer::Snapshot(m) => {
            out.extend_from_slice(&[OFFER_KIND_SNAPSHOT, 0, 0, 0, 0, 0, 0, 0]);
            out.extend_from_slice(&m.encode());
        }
        Offer::Refused(reason) => {
            out.extend_from_slice(&[OFFER_KIND_REFUSED, *reason as u8, 0, 0, 0, 0, 0, 0]);
        }
    }
    Ok(())
}

/// The structural rules (the receiver's limits are the decoder's).
pub(super) fn check_request_chunks(r: &RequestChunks) -> Result<(), ReplicationError> {
    let command = Command::RequestChunks;
    nonzero_id(command, r.snapshot_id)?;
    if r.keys.is_empty() {
        // An empty window would let a pull loop spin without progress.
        return Err(invalid(command, "count", 0, "a request names a chunk"));
    }
    if let Some(i) = r.keys.windows(2).position(|w| w[0] >= w[1]) {
        return Err(ReplicationError::BrokenRun {
            command,
            index: i as u32 + 1,
            reason: "is not above the key before it",
        });
    }
    Ok(())
}

pub(super) fn decode_request_chunks(
    body: &[u8],
    limits: &ReplicationLimits,
) -> Result<RequestChunks, ReplicationError> {
    let command = Command::RequestChunks;
    let mut r = fixed(command, body, REQUEST_CHUNKS_FIXED, false)?;
    let snapshot_id = u64_of(&mut r, command, body.len())?;
    let count = u32_of(&mut r, command, body.len())?;
    if u32_of(&mut r, command, body.len())? != 0 {
        return Err(ReplicationError::NonZeroReserved {
            field: "request chunks reserved",
        });
    }
    if count > limits.chunk_keys_max {
        return Err(ReplicationError::LimitExceeded {
            command,
            field: "chunk keys",
            value: u64::from(count),
            max: u64::from(limits.chunk_keys_max),
        });
    }
    let expected = REQUEST_CHUNKS_FIXED + usize_from(count) * CHUNK_KEY_LEN;
    if body.len() != expected {
        return Err(body_size(command, body.len(), expected));
    }
    let mut keys = Vec::with_capacity(usize_from(count));
    for _ in 0..count {
        keys.push(ChunkKey {
            artifact: u32_of(&mut r, command, body.len())?,
            chunk: u32_of(&mut r, command, body.len())?,
        });
    }
    let request = RequestChunks { snapshot_id, keys };
    check_request_chunks(&request)?;
    Ok(request)
}

pub(super) fn encode_request_chunks(
    r: &RequestChunks,
    out: &mut Vec<u8>,
) -> Result<(), ReplicationError> {
    check_request_chunks(r)?;
    let count = u32::try_from(r.keys.len()).map_err(|_| ReplicationError::LimitExceeded {
        command: Command::RequestChunks,
        field: "chunk keys",
        value: r.keys.len() as u64,
        max: u64::from(u32::MAX),
    })?;
    out.extend_from_slice(&r.snapshot_id.to_le_bytes());
    out.extend_from_slice(&count.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    for k in &r.keys {
        out.extend_from_slice(&k.artifact.to_le_bytes());
        out.extend_from_slice(&k.chunk.to_le_bytes());
    }
    Ok(())
}

pub(super) fn check_chunk(c: &Chunk<'_>) -> Result<(), ReplicationError> {
    let command = Command::Chunk;
    nonzero_id(command, c.snapshot_id)?;
    if c.data.is_empty() {
        return Err(invalid(command, "data", 0, "a chunk carries bytes"));
    }
    Ok(())
}

pub(super) fn decode_chunk<'a>(
    body: &'a [u8],
    limits: &ReplicationLimits,
) -> Result<Chunk<'a>, ReplicationError> {
    let command = Command::Chunk;
    let mut r = fixed(command, body, CHUNK_FIXED, false)?;
    let snapshot_id = u64_of(&mut r, command, body.len())?;
    let key = ChunkKey {
        artifact: u32_of(&mut r, command, body.len())?,
        chunk: u32_of(&mut r, command, body.len())?,
    };
    let data = r.take(r.remaining()).unwrap_or_default();
    if data.len() as u64 > u64::from(limits.chunk_bytes_max) {
        return Err(ReplicationError::LimitExceeded {
            command,
            field: "chunk bytes",
            value: data.len() as u64,
            max: u64::from(limits.chunk_bytes_max),
        });
    }
    let chunk = Chunk {
        snapshot_id,
        key,
        data,
    };
    check_chunk(&chunk)?;
    Ok(chunk)
}

pub(super) fn encode_chunk(c: &Chunk<'_>, out: &mut Vec<u8>) -> Result<(), ReplicationError> {
    check_chunk(c)?;
    out.extend_from_slice(&c.snapshot_id.to_le_bytes());
    out.extend_from_slice(&c.key.artifact.to_le_bytes());
    out.extend_from_slice(&c.key.chunk.to_le_bytes());
    out.extend_from_slice(c.data);
    Ok(())
}

pub(super) fn decode_release_snapshot(body: &[u8]) -> Result<ReleaseSnapshot, ReplicationError> {
    let command = Command::ReleaseSnapshot;
    let mut r = fixed(command, body, RELEASE_SNAPSHOT_LEN, true)?;
    let release = ReleaseSnapshot {
        snapshot_id: u64_of(&mut r, command, body.len())?,
    };
    nonzero_id(command, release.snapshot_id)?;
    Ok(release)
}

pub(super) fn encode_release_snapshot(
    r: &ReleaseSnapshot,
    out: &mut Vec<u8>,
) -> Result<(), ReplicationError> {
    nonzero_id(Command::ReleaseSnapshot, r.snapshot_id)?;
    out.extend_from_slice(&r.snapshot_id.to_le_bytes());
    Ok(())
}
