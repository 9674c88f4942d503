use thiserror::Error;

use super::Command;
use crate::manifest::ManifestError;
use crate::BatchError;

/// Why a replication message was refused (decode) or could not be built
/// (encode). Checksum variants: `expected` is the stored value, `actual` the
/// one computed over the bytes.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ReplicationError {
    #[error("replication message truncated: need {needed} bytes, have {available}")]
    Truncated { needed: usize, available: usize },
    #[error("{extra} bytes after the replication message")]
    TrailingBytes { extra: usize },
    #[error("bad replication magic {0:#010x}")]
    BadMagic(u32),
    #[error("unsupported replication version {0}")]
    UnsupportedVersion(u8),
    #[error("version {version} has a {expected} byte header, this one says {header_len}")]
    HeaderLength {
        version: u8,
        header_len: u16,
        expected: u16,
    },
    #[error("replication header checksum: stored {expected:#018x}, computed {actual:#018x}")]
    HeaderChecksum { expected: u64, actual: u64 },
    #[error("{command:?} body checksum: stored {expected:#018x}, computed {actual:#018x}")]
    BodyChecksum {
        command: Command,
        expected: u64,
        actual: u64,
    },
    #[error("unknown replication command {0}")]
    UnknownCommand(u8),
    #[error("reserved field `{field}` is not zero")]
    NonZeroReserved { field: &'static str },
    #[error("body of {body_len} bytes exceeds the {max} byte cap")]
    BodyTooLarge { body_len: u64, max: u64 },
    #[error("{command:?} body is {body_len} bytes, version 1 needs {expected}")]
    BodySize {
        command: Command,
        body_len: usize,
        expected: usize,
    },
    #[error("{command:?}: {field} = {value} exceeds the limit {max}")]
    LimitExceeded {
        command: Command,
        field: &'static str,
        value: u64,
        max: u64,
    },
    #[error("{command:?}: {count} items cannot fit in {available} bytes")]
    CountExceedsBody {
        command: Command,
        count: u32,
        available: usize,
    },
    #[error("{command:?}: batch {index}: {source}")]
    Batch {
        command: Command,
        index: u32,
        #[source]
        source: BatchError,
    },
    #[error("{command:?}: {field} is {message} in the message but {batch} in the batch")]
    Mismatch {
        command: Command,
        field: &'static str,
        message: u64,
        batch: u64,
    },
    #[error("{command:?}: entry {index} {reason}")]
    BrokenRun {
        command: Command,
        index: u32,
        reason: &'static str,
    },
    #[error("{command:?}: {field} = {value} is invalid: {reason}")]
    Invalid {
        command: Command,
        field: &'static str,
        value: u64,
        reason: &'static str,
    },
    #[error("SnapshotOffer: manifest: {0}")]
    Manifest(#[source] ManifestError),
    #[error("SnapshotOffer: {field} is {message} in the message but {manifest} in the manifest")]
    OfferMismatch {
        field: &'static str,
        message: u64,
        manifest: u64,
    },
}
