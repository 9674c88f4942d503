use thiserror::Error;

/// Why a batch was rejected (decode/parse) or could not be built.
///
/// Checksum variants: `expected` is the value stored in the header, `actual`
/// the value computed over the bytes.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum BatchError {
    #[error("truncated batch: need {needed} bytes, have {available}")]
    Truncated { needed: usize, available: usize },
    #[error("bad magic {0:#010x}")]
    BadMagic(u32),
    #[error("unsupported format version {0}")]
    UnsupportedVersion(u8),
    #[error("reserved header field `{field}` is not zero")]
    NonZeroReserved { field: &'static str },
    #[error("header checksum mismatch: stored {expected:#018x}, computed {actual:#018x}")]
    HeaderChecksum { expected: u64, actual: u64 },
    #[error("body checksum mismatch: stored {expected:#018x}, computed {actual:#018x}")]
    BodyChecksum { expected: u64, actual: u64 },
    #[error("body of {body_len} bytes exceeds the {max} byte cap")]
    BodyTooLarge { body_len: u32, max: u32 },
    #[error("record count {0} out of range")]
    BadRecordCount(u32),
    #[error("{record_count} records cannot fit in a {body_len} byte body")]
    RecordCountExceedsBody { record_count: u32, body_len: u32 },
    #[error("max timestamp {max_timestamp_ms} is before first timestamp {first_timestamp_ms}")]
    TimestampOrder {
        first_timestamp_ms: u64,
        max_timestamp_ms: u64,
    },
    #[error("base offset {base_offset} + {record_count} records overflows u64")]
    OffsetOverflow { base_offset: u64, record_count: u32 },
    #[error("body ends after {found} of {expected} records")]
    MissingRecords { expected: u32, found: u32 },
    #[error("record {index}: length {length} exceeds the {remaining} body bytes left")]
    RecordLength {
        index: u32,
        length: u32,
        remaining: usize,
    },
    #[error("record {index}: field `{field}` runs past the end of the record")]
    RecordTruncated { index: u32, field: &'static str },
    #[error("record {index}: {unused} bytes left over after the value")]
    RecordTrailingBytes { index: u32, unused: usize },
    #[error("record {index}: offset delta {actual}, expected {expected}")]
    OffsetDelta {
        index: u32,
        expected: u32,
        actual: u32,
    },
    #[error("record {index}: timestamp delta {delta_ms} ms exceeds batch span {span_ms} ms")]
    TimestampDelta {
        index: u32,
        delta_ms: u32,
        span_ms: u64,
    },
    #[error("record {index}: reserved field is not zero")]
    RecordNonZeroReserved { index: u32 },
    #[error("record {index}: {count} headers exceeds the cap")]
    TooManyHeaders { index: u32, count: usize },
    #[error("{unused} bytes left in the body after the last record")]
    TrailingBodyBytes { unused: usize },
    #[error("batch has no records")]
    EmptyBatch,
    #[error("`{field}` of {len} bytes does not fit its length field")]
    FieldTooLong { field: &'static str, len: usize },
    #[error(
        "record of {record_len} bytes does not fit in a batch body already {body_len} bytes long"
    )]
    BatchFull { record_len: usize, body_len: u32 },
    #[error("timestamps {first_timestamp_ms}..={max_timestamp_ms} span more than u32::MAX ms")]
    TimestampSpread {
        first_timestamp_ms: u64,
        max_timestamp_ms: u64,
    },
}
