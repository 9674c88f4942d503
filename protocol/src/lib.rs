//! ringlog-protocol: the bytes ringlog puts on the wire and on disk. No I/O.
//!
//! The unit of everything is the **record batch** ([`batch`]): a 96-byte
//! little-endian header followed by a body of densely numbered records. The
//! same bytes travel from producer to primary, through VSR replication, and
//! land on disk unchanged, so each batch is checksummed exactly once by its
//! producer (body) and re-sealed by the primary ([`restamp`], header only).
//!
//! Integrity model:
//! - `header_checksum` covers the whole header (itself zeroed), which in turn
//!   contains `body_checksum`, so one verified header pins the whole batch.
//! - `prev_checksum` is the previous batch's `header_checksum` in the same
//!   partition, making each partition a hash chain that detects lost or
//!   reordered batches, not just corrupted ones.
//!
//! The exact layout is specified in the [`batch`] module docs; that text is
//! the format spec.
#![forbid(unsafe_code)]

pub mod batch;
pub mod checksum;
pub mod manifest;
mod reader;
pub mod replication;
pub mod wire;

pub use batch::{
    encode_header, restamp, BatchBuilder, BatchError, BatchHeader, BatchView, Record, Stamp,
    VerifiedBatch, HEADER_LEN,
};
pub use checksum::{checksum, Hasher};
