use super::{
    BatchError, Stamp, ATTRIBUTES_KNOWN, BODY_LEN_MAX_BYTES, FORMAT_VERSION, HEADER_LEN, MAGIC,
    RECORD_COUNT_MAX, RECORD_LEN_MIN,
};
use crate::checksum::checksum;
use crate::reader::usize_from;

// Field offsets; see the layout table in the module docs.
const OFF_MAGIC: usize = 0;
const OFF_VERSION: usize = 4;
const OFF_ATTRIBUTES: usize = 5;
const OFF_RESERVED_U16: usize = 6;
const OFF_HEADER_CHECKSUM: usize = 8;
const OFF_BODY_CHECKSUM: usize = 16;
const OFF_PREV_CHECKSUM: usize = 24;
const OFF_BASE_OFFSET: usize = 32;
const OFF_VSR_OP: usize = 40;
const OFF_FIRST_TIMESTAMP: usize = 48;
const OFF_MAX_TIMESTAMP: usize = 56;
const OFF_PARTITION_ID: usize = 64;
const OFF_RECORD_COUNT: usize = 68;
const OFF_BODY_LEN: usize = 72;
const OFF_VSR_VIEW: usize = 76;
const OFF_RESERVED_TAIL: usize = 80;

/// Decoded batch header. Only [`BatchHeader::decode`] and the encoders
/// produce values that are known to be valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchHeader {
    pub header_checksum: u64,
    pub body_checksum: u64,
    pub prev_checksum: u64,
    pub base_offset: u64,
    pub vsr_op: u64,
    pub first_timestamp_ms: u64,
    pub max_timestamp_ms: u64,
    pub partition_id: u32,
    pub record_count: u32,
    pub body_len: u32,
    pub vsr_view: u32,
    /// Bits of [`super::ATTRIBUTES_KNOWN`]; 0 for a producer's batch.
    pub attributes: u8,
}

impl BatchHeader {
    /// An operator's purge sequenced into the log ([`super::ATTR_PURGE`]).
    #[inline]
    pub fn is_purge(&self) -> bool {
        self.attributes & super::ATTR_PURGE != 0
    }
}

// The offsets passed to these are the constants above, all in bounds of a
// HEADER_LEN array, so the slice indexing cannot panic.
#[inline]
fn get_u16(h: &[u8; HEADER_LEN], at: usize) -> u16 {
    let mut b = [0u8; 2];
    b.copy_from_slice(&h[at..at + 2]);
    u16::from_le_bytes(b)
}

#[inline]
fn get_u32(h: &[u8; HEADER_LEN], at: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&h[at..at + 4]);
    u32::from_le_bytes(b)
}

#[inline]
fn get_u64(h: &[u8; HEADER_LEN], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&h[at..at + 8]);
    u64::from_le_bytes(b)
}

#[inline]
fn put(h: &mut [u8; HEADER_LEN], at: usize, bytes: &[u8]) {
    h[at..at + bytes.len()].copy_from_slice(bytes);
}

/// Checksum of a header with its checksum field treated as zero.
#[inline]
fn compute_header_checksum(h: &[u8; HEADER_LEN]) -> u64 {
    // Copying 96 bytes to the stack is cheaper than a streaming hash.
    let mut copy = *h;
    copy[OFF_HEADER_CHECKSUM..OFF_HEADER_CHECKSUM + 8].fill(0);
    checksum(&copy)
}

impl BatchHeader {
    /// Decodes and validates the header in the first [`HEADER_LEN`] bytes of
    /// `bytes`. Does not look at the body. No allocation.
    pub fn decode(bytes: &[u8]) -> Result<BatchHeader, BatchError> {
        let h = bytes
            .first_chunk::<HEADER_LEN>()
            .ok_or(BatchError::Truncated {
                needed: HEADER_LEN,
                available: bytes.len(),
            })?;

        let magic = get_u32(h, OFF_MAGIC);
        if magic != MAGIC {
            return Err(BatchError::BadMagic(magic));
        }
        let version = h[OFF_VERSION];
        if version != FORMAT_VERSION {
            return Err(BatchError::UnsupportedVersion(version));
        }
        // Checksum before field checks: a corrupted header should report
        // corruption, not whichever field the flip happened to land in.
        let stored = get_u64(h, OFF_HEADER_CHECKSUM);
        let computed = compute_header_checksum(h);
        if stored != computed {
            return Err(BatchError::HeaderChecksum {
                expected: stored,
                actual: computed,
            });
        }
        if h[OFF_ATTRIBUTES] & !ATTRIBUTES_KNOWN != 0 {
            return Err(BatchError::NonZeroReserved {
                field: "attributes",
            });
        }
        if get_u16(h, OFF_RESERVED_U16) != 0 {
            return Err(BatchError::NonZeroReserved { field: "reserved" });
        }
        if h[OFF_RESERVED_TAIL..].iter().any(|&b| b != 0) {
            return Err(BatchError::NonZeroReserved {
                field: "reserved_tail",
            });
        }

        let header = BatchHeader {
            header_checksum: stored,
            body_checksum: get_u64(h, OFF_BODY_CHECKSUM),
            prev_checksum: get_u64(h, OFF_PREV_CHECKSUM),
            base_offset: get_u64(h, OFF_BASE_OFFSET),
            vsr_op: get_u64(h, OFF_VSR_OP),
            first_timestamp_ms: get_u64(h, OFF_FIRST_TIMESTAMP),
            max_timestamp_ms: get_u64(h, OFF_MAX_TIMESTAMP),
            partition_id: get_u32(h, OFF_PARTITION_ID),
            record_count: get_u32(h, OFF_RECORD_COUNT),
            body_len: get_u32(h, OFF_BODY_LEN),
            vsr_view: get_u32(h, OFF_VSR_VIEW),
            attributes: h[OFF_ATTRIBUTES],
        };
        header.check_fields()?;
        Ok(header)
    }

    /// Field-level invariants shared by decode and the encoders.
    fn check_fields(&self) -> Result<(), BatchError> {
        if self.body_len > BODY_LEN_MAX_BYTES {
            return Err(BatchError::BodyTooLarge {
                body_len: self.body_len,
                max: BODY_LEN_MAX_BYTES,
            });
        }
        if self.record_count == 0 || self.record_count > RECORD_COUNT_MAX {
            return Err(BatchError::BadRecordCount(self.record_count));
        }
        // Cheap early rejection: the body cannot hold that many records.
        if u64::from(self.record_count) * u64::from(RECORD_LEN_MIN) > u64::from(self.body_len) {
            return Err(BatchError::RecordCountExceedsBody {
                record_count: self.record_count,
                body_len: self.body_len,
            });
        }
        if self.max_timestamp_ms < self.first_timestamp_ms {
            return Err(BatchError::TimestampOrder {
                first_timestamp_ms: self.first_timestamp_ms,
                max_timestamp_ms: self.max_timestamp_ms,
            });
        }
        check_offsets(self.base_offset, self.record_count)
    }

    /// Header plus body, in bytes.
    #[inline]
    pub fn total_len(&self) -> usize {
        HEADER_LEN + usize_from(self.body_len)
    }

    /// Offset the next batch in the partition starts at.
    #[inline]
    pub fn next_offset(&self) -> u64 {
        // Cannot saturate for decoded headers: decode rejects overflow.
        self.base_offset
            .saturating_add(u64::from(self.record_count))
    }

    /// Offset of the last record in the batch.
    #[inline]
    pub fn last_offset(&self) -> u64 {
        // record_count >= 1 for decoded headers.
        self.next_offset().saturating_sub(1)
    }
}

pub(crate) fn check_offsets(base_offset: u64, record_count: u32) -> Result<(), BatchError> {
    match base_offset.checked_add(u64::from(record_count)) {
        Some(_) => Ok(()),
        None => Err(BatchError::OffsetOverflow {
            base_offset,
            record_count,
        }),
    }
}

/// Writes `h` into `out` (reserved bytes zeroed), computes the header
/// checksum over the result, stores it at offset 8 and returns it.
/// `h.header_checksum` is ignored. No validation: encoders validate first.
pub fn encode_header(h: &BatchHeader, out: &mut [u8; HEADER_LEN]) -> u64 {
    out.fill(0);
    put(out, OFF_MAGIC, &MAGIC.to_le_bytes());
    out[OFF_VERSION] = FORMAT_VERSION;
    out[OFF_ATTRIBUTES] = h.attributes;
    put(out, OFF_BODY_CHECKSUM, &h.body_checksum.to_le_bytes());
    put(out, OFF_PREV_CHECKSUM, &h.prev_checksum.to_le_bytes());
    put(out, OFF_BASE_OFFSET, &h.base_offset.to_le_bytes());
    put(out, OFF_VSR_OP, &h.vsr_op.to_le_bytes());
    put(
        out,
        OFF_FIRST_TIMESTAMP,
        &h.first_timestamp_ms.to_le_bytes(),
    );
    put(out, OFF_MAX_TIMESTAMP, &h.max_timestamp_ms.to_le_bytes());
    put(out, OFF_PARTITION_ID, &h.partition_id.to_le_bytes());
    put(out, OFF_RECORD_COUNT, &h.record_count.to_le_bytes());
    put(out, OFF_BODY_LEN, &h.body_len.to_le_bytes());
    put(out, OFF_VSR_VIEW, &h.vsr_view.to_le_bytes());
    // Checksum field is still zero here, which is exactly what it covers.
    let sum = checksum(out);
    put(out, OFF_HEADER_CHECKSUM, &sum.to_le_bytes());
    sum
}

/// Primary-side sequencing: validates the header of `batch` and rewrites
/// `base_offset`, `vsr_op`, `vsr_view` and `prev_checksum` in place, then
/// re-seals the header checksum. The body is not touched or re-hashed (its
/// checksum is carried over), so callers that need the body verified must
/// [`super::BatchView::parse`] it first. Returns the new header.
pub fn restamp(batch: &mut [u8], stamp: &Stamp) -> Result<BatchHeader, BatchError> {
    let mut header = BatchHeader::decode(batch)?;
    check_offsets(stamp.base_offset, header.record_count)?;
    header.base_offset = stamp.base_offset;
    header.vsr_op = stamp.vsr_op;
    header.vsr_view = stamp.vsr_view;
    header.prev_checksum = stamp.prev_checksum;
    let available = batch.len();
    let out = batch
        .first_chunk_mut::<HEADER_LEN>()
        .ok_or(BatchError::Truncated {
            needed: HEADER_LEN,
            available,
        })?;
    header.header_checksum = encode_header(&header, out);
    Ok(header)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> BatchHeader {
        BatchHeader {
            header_checksum: 0,
            body_checksum: 0x1122_3344_5566_7788,
            prev_checksum: 9,
            base_offset: 100,
            vsr_op: 7,
            first_timestamp_ms: 1_000,
            max_timestamp_ms: 2_000,
            partition_id: 3,
            record_count: 2,
            body_len: 48,
            vsr_view: 1,
            attributes: 0,
        }
    }

    #[test]
    fn encode_decode_round_trip() {
        let mut buf = [0u8; HEADER_LEN];
        let sum = encode_header(&sample(), &mut buf);
        assert_eq!(&buf[0..4], b"RLGB");
        let decoded = BatchHeader::decode(&buf).expect("valid header");
        assert_eq!(
            decoded,
            BatchHeader {
                header_checksum: sum,
                ..sample()
            }
        );
        assert_eq!(decoded.total_len(), HEADER_LEN + 48);
        assert_eq!(decoded.next_offset(), 102);
        assert_eq!(decoded.last_offset(), 101);
    }

    #[test]
    fn field_checks() {
        let cases = [
            (
                BatchHeader {
                    body_len: BODY_LEN_MAX_BYTES + 1,
                    ..sample()
                },
                BatchError::BodyTooLarge {
                    body_len: BODY_LEN_MAX_BYTES + 1,
                    max: BODY_LEN_MAX_BYTES,
                },
            ),
            (
                BatchHeader {
                    record_count: 0,
                    ..sample()
                },
                BatchError::BadRecordCount(0),
            ),
            (
                BatchHeader {
                    record_count: 3,
                    ..sample()
                },
                BatchError::RecordCountExceedsBody {
                    record_count: 3,
                    body_len: 48,
                },
            ),
            (
                BatchHeader {
                    max_timestamp_ms: 999,
                    ..sample()
                },
                BatchError::TimestampOrder {
                    first_timestamp_ms: 1_000,
                    max_timestamp_ms: 999,
                },
            ),
            (
                BatchHeader {
                    base_offset: u64::MAX - 1,
                    ..sample()
                },
                BatchError::OffsetOverflow {
                    base_offset: u64::MAX - 1,
                    record_count: 2,
                },
            ),
        ];
        for (header, want) in cases {
            let mut buf = [0u8; HEADER_LEN];
            encode_header(&header, &mut buf);
            assert_eq!(BatchHeader::decode(&buf), Err(want));
        }
    }

    #[test]
    fn short_input() {
        assert_eq!(
            BatchHeader::decode(&[0u8; 95]),
            Err(BatchError::Truncated {
                needed: 96,
                available: 95
            })
        );
    }
}
