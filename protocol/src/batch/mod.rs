//! Record batch format: identical bytes on the wire and on disk.
//!
//! All integers are little-endian. A batch is a [`HEADER_LEN`]-byte header
//! followed by `body_len` bytes of records.
//!
//! # Header
//!
//! ```text
//! off size field
//!   0  u32 magic              MAGIC ("RLGB")
//!   4  u8  version            == FORMAT_VERSION
//!   5  u8  attributes         ATTR_PURGE or 0 (other bits reserved, 0)
//!   6  u16 reserved           0
//!   8  u64 header_checksum    checksum of the 96 header bytes with 8..16 zeroed
//!  16  u64 body_checksum      checksum of the body bytes
//!  24  u64 prev_checksum      header_checksum of the previous batch in the
//!                             partition (0 for the first ever): hash chain
//!  32  u64 base_offset        offset of record 0
//!  40  u64 vsr_op
//!  48  u64 first_timestamp_ms minimum record timestamp
//!  56  u64 max_timestamp_ms   maximum record timestamp (>= first)
//!  64  u32 partition_id
//!  68  u32 record_count       1..=RECORD_COUNT_MAX
//!  72  u32 body_len           <= BODY_LEN_MAX_BYTES
//!  76  u32 vsr_view
//!  80  [u8; 16] reserved      0
//! ```
//!
//! # Body
//!
//! `record_count` records back to back, each:
//!
//! ```text
//! u32 length              bytes of this record after this field
//! u32 offset_delta        == index of the record in the batch (dense offsets)
//! u32 timestamp_delta_ms  first_timestamp_ms + delta <= max_timestamp_ms
//! u32 key_len,   key bytes
//! u16 header_count (<= HEADERS_PER_RECORD_MAX), u16 reserved (0)
//!     header_count x { u16 name_len, name bytes, u32 value_len, value bytes }
//! u32 value_len, value bytes
//! ```
//!
//! Every length must fit exactly: a record's fields consume exactly `length`
//! bytes and the records consume exactly `body_len` bytes. Anything else is
//! rejected, so there is exactly one valid encoding of a given batch.

mod builder;
mod error;
mod header;

mod verified;
mod view;

pub use builder::BatchBuilder;
pub use error::BatchError;
pub use header::{encode_header, restamp, BatchHeader};
pub use verified::VerifiedBatch;
pub use view::{BatchView, HeaderIter, RecordIter, RecordView};

/// Header size in bytes. Every field sits at an offset aligned to its width,
/// and 16 reserved bytes leave room for future fields without a new version.
pub const HEADER_LEN: usize = 96;
/// "RLGB" when read as little-endian bytes.
pub const MAGIC: u32 = 0x4247_4C52;
pub const FORMAT_VERSION: u8 = 1;
/// Attribute: the batch is an operator's purge sequenced into the log
/// (its replicas drop every batch through it when they commit it). Set
/// by the replica, never by a producer.
pub const ATTR_PURGE: u8 = 1;
/// Attribute bits a header may carry; any other is refused on decode.
pub const ATTRIBUTES_KNOWN: u8 = ATTR_PURGE;
/// Cap on a batch body: bounds memory a reader must commit to one batch
/// before it has verified anything but the header.
pub const BODY_LEN_MAX_BYTES: u32 = 64 * 1024 * 1024;
/// Smallest encoded record (length field included): empty key, no headers,
/// empty value.
pub const RECORD_LEN_MIN: u32 = 4 + 4 + 4 + 4 + 2 + 2 + 4;
/// The most records a batch can hold given the body cap.
pub const RECORD_COUNT_MAX: u32 = BODY_LEN_MAX_BYTES / RECORD_LEN_MIN;
/// Cap on headers per record so a reader's per-record work stays bounded.
pub const HEADERS_PER_RECORD_MAX: u16 = 1024;

/// One record as supplied by a producer to [`BatchBuilder::push`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record<'a> {
    pub key: &'a [u8],
    /// `(name, value)` pairs; order is preserved.
    pub headers: &'a [(&'a [u8], &'a [u8])],
    pub value: &'a [u8],
    pub timestamp_ms: u64,
}

/// What the primary assigns to a batch when it sequences it (see [`restamp`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stamp {
    pub base_offset: u64,
    pub vsr_op: u64,
    pub vsr_view: u32,
    /// `header_checksum` of the previous batch in the partition, 0 for the first.
    pub prev_checksum: u64,
}
