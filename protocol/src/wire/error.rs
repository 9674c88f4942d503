//! Wire error codes (what a peer is told) and decode errors (what went wrong).

use thiserror::Error;

/// The error code of a response. Every failure a client can see has one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum ErrorCode {
    Ok = 0,
    /// No protocol version in common; the connection is closed.
    UnsupportedVersion = 1,
    /// The first request was not Hello; the connection is closed.
    HandshakeRequired = 2,
    /// The payload does not decode.
    Malformed = 3,
    /// The frame checksum failed; the connection is closed.
    BadChecksum = 4,
    /// The frame exceeds the limit; the connection is closed.
    FrameTooLarge = 5,
    UnknownCommand = 6,
    UnknownTopic = 7,
    UnknownPartition = 8,
    TopicExists = 9,
    /// Bad topic name or partition count.
    InvalidTopic = 10,
    /// The record batch fails validation.
    InvalidBatch = 11,
    BatchTooLarge = 12,
    OffsetOutOfRange = 13,
    /// A queue on the way is full: retry later. Nothing was written. The
    /// queues: a shard's mailbox and connection budgets, and a partition's
    /// replica (its pipeline of uncommitted appends and the client queue
    /// behind it, `vsr::AppendError::Busy`).
    Backpressure = 14,
    /// The partition stopped after an I/O failure (fail-stop); it recovers
    /// on restart.
    PartitionFenced = 15,
    /// The partition could not be opened (missing or corrupt); see the log.
    PartitionUnavailable = 16,
    /// A storage error other than fencing.
    Storage = 17,
    /// The server is shutting down: retry against it after restart.
    ShuttingDown = 18,
    Internal = 19,
    /// A read found corrupted durable data.
    Corruption = 20,
    /// The partition's disk is full: nothing was written, reads keep
    /// working; retry once space is freed.
    DiskFull = 21,
    /// This node holds a backup of the partition: produce to its primary.
    /// The message names the primary as `primary_node=ID` (and its peer
    /// address); during a view change that is the view's would-be primary,
    /// so a client that finds it refusing too retries after a pause.
    NotPrimary = 22,
}

impl ErrorCode {
    pub fn from_u16(code: u16) -> Option<ErrorCode> {
        use ErrorCode::*;
        Some(match code {
            0 => Ok,
            1 => UnsupportedVersion,
            2 => HandshakeRequired,
            3 => Malformed,
            4 => BadChecksum,
            5 => FrameTooLarge,
            6 => UnknownCommand,
            7 => UnknownTopic,
            8 => UnknownPartition,
            9 => TopicExists,
            10 => InvalidTopic,
            11 => InvalidBatch,
            12 => BatchTooLarge,
            13 => OffsetOutOfRange,
            14 => Backpressure,
            15 => PartitionFenced,
            16 => PartitionUnavailable,
            17 => Storage,
            18 => ShuttingDown,
            19 => Internal,
            20 => Corruption,
            21 => DiskFull,
            22 => NotPrimary,
            _ => return None,
        })
    }

    /// Whether the same request may succeed if simply sent again later.
    pub fn is_retryable(self) -> bool {
        matches!(
            self,
            ErrorCode::Backpressure | ErrorCode::ShuttingDown | ErrorCode::DiskFull
        )
    }

    /// Whether the server closes the connection after this error.
    pub fn closes_connection(self) -> bool {
        matches!(
            self,
            ErrorCode::UnsupportedVersion
                | ErrorCode::HandshakeRequired
                | ErrorCode::BadChecksum
                | ErrorCode::FrameTooLarge
        )
    }

    pub fn name(self) -> &'static str {
        use ErrorCode::*;
        match self {
            Ok => "ok",
            UnsupportedVersion => "unsupported_version",
            HandshakeRequired => "handshake_required",
            Malformed => "malformed",
            BadChecksum => "bad_checksum",
            FrameTooLarge => "frame_too_large",
            UnknownCommand => "unknown_command",
            UnknownTopic => "unknown_topic",
            UnknownPartition => "unknown_partition",
            TopicExists => "topic_exists",
            InvalidTopic => "invalid_topic",
            InvalidBatch => "invalid_batch",
            BatchTooLarge => "batch_too_large",
            OffsetOutOfRange => "offset_out_of_range",
            Backpressure => "backpressure",
            PartitionFenced => "partition_fenced",
            PartitionUnavailable => "partition_unavailable",
            Storage => "storage",
            ShuttingDown => "shutting_down",
            Internal => "internal",
            Corruption => "corruption",
            DiskFull => "disk_full",
            NotPrimary => "not_primary",
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Why bytes did not decode as a frame or message.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum WireError {
    #[error("frame of {len_bytes} bytes exceeds the limit {max_bytes}")]
    FrameTooLarge { len_bytes: u32, max_bytes: u32 },
    #[error("frame checksum mismatch: stored {expected:#018x}, computed {actual:#018x}")]
    BadChecksum { expected: u64, actual: u64 },
    #[error("truncated {what}")]
    Truncated { what: &'static str },
    #[error("{extra} trailing bytes after {what}")]
    TrailingBytes { what: &'static str, extra: usize },
    #[error("unknown opcode {0:#06x}")]
    UnknownOpcode(u16),
    #[error("unknown error code {0}")]
    UnknownErrorCode(u16),
    #[error("reserved field is not zero")]
    NonZeroReserved,
    #[error("{what} is not valid UTF-8")]
    BadUtf8 { what: &'static str },
    #[error("{what} of {len} bytes exceeds the limit {max}")]
    TooLong {
        what: &'static str,
        len: usize,
        max: usize,
    },
    #[error("bad {what} value {value}")]
    BadValue { what: &'static str, value: u64 },
    #[error("bad magic {0:#010x}")]
    BadMagic(u32),
}

impl WireError {
    /// The code a server answers this decode failure with.
    pub fn code(&self) -> ErrorCode {
        match self {
            WireError::FrameTooLarge { .. } => ErrorCode::FrameTooLarge,
            WireError::BadChecksum { .. } => ErrorCode::BadChecksum,
            WireError::UnknownOpcode(_) => ErrorCode::UnknownCommand,
            _ => ErrorCode::Malformed,
        }
    }
}
