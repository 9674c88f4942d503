use super::header::{check_offsets, encode_header};
use super::{
    BatchError, BatchHeader, Record, Stamp, BODY_LEN_MAX_BYTES, HEADERS_PER_RECORD_MAX, HEADER_LEN,
    RECORD_LEN_MIN,
};
use crate::checksum::checksum;
use crate::reader::usize_from;

/// Producer-side encoder. Records are written straight into the final buffer
/// behind a zeroed header slot, so [`BatchBuilder::finish`] never copies the
/// body.
#[derive(Debug, Clone)]
pub struct BatchBuilder {
    partition_id: u32,
    /// Header slot followed by the body built so far.
    buf: Vec<u8>,
    record_count: u32,
    /// Position of each record's timestamp_delta_ms field and its absolute
    /// timestamp: deltas are relative to the batch minimum, which is only
    /// known at finish.
    timestamps: Vec<(usize, u64)>,
    first_timestamp_ms: u64,
    max_timestamp_ms: u64,
}

impl BatchBuilder {
    pub fn new(partition_id: u32) -> Self {
        Self {
            partition_id,
            buf: vec![0u8; HEADER_LEN],
            record_count: 0,
            timestamps: Vec::new(),
            first_timestamp_ms: u64::MAX,
            max_timestamp_ms: 0,
        }
    }

    /// Appends a record. On error the builder is unchanged, so a caller can
    /// `finish` this batch and push the record into a new one.
    pub fn push(&mut self, record: &Record) -> Result<(), BatchError> {
        let index = self.record_count;
        let too_many_headers = BatchError::TooManyHeaders {
            index,
            count: record.headers.len(),
        };
        let header_count =
            u16::try_from(record.headers.len()).map_err(|_| too_many_headers.clone())?;
        if header_count > HEADERS_PER_RECORD_MAX {
            return Err(too_many_headers);
        }
        let key_len = len_u32("key", record.key.len())?;
        let value_len = len_u32("value", record.value.len())?;
        // Encoded size including the length field; saturating so absurd
        // inputs fail the capacity check instead of wrapping.
        let mut record_len = usize_from(RECORD_LEN_MIN)
            .saturating_add(record.key.len())
            .saturating_add(record.value.len());
        for (name, value) in record.headers {
            if name.len() > usize::from(u16::MAX) {
                return Err(BatchError::FieldTooLong {
                    field: "header name",
                    len: name.len(),
                });
            }
            len_u32("header value", value.len())?;
            record_len = record_len
                .saturating_add(2 + 4)
                .saturating_add(name.len())
                .saturating_add(value.len());
        }
        let body_len = self.body_len_bytes();
        if record_len > usize_from(BODY_LEN_MAX_BYTES - body_len) {
            return Err(BatchError::BatchFull {
                record_len,
                body_len,
            });
        }
        let first_timestamp_ms = self.first_timestamp_ms.min(record.timestamp_ms);
        let max_timestamp_ms = self.max_timestamp_ms.max(record.timestamp_ms);
        if max_timestamp_ms - first_timestamp_ms > u64::from(u32::MAX) {
            return Err(BatchError::TimestampSpread {
                first_timestamp_ms,
                max_timestamp_ms,
            });
        }

        // All checks passed: from here on nothing can fail. record_len fits
        // u32 because it fits in the body, which is capped below u32::MAX.
        let length = len_u32("record", record_len - 4)?;
        self.buf.reserve(record_len);
        self.buf.extend_from_slice(&length.to_le_bytes());
        self.buf.extend_from_slice(&index.to_le_bytes());
        self.timestamps.push((self.buf.len(), record.timestamp_ms));
        self.buf.extend_from_slice(&0u32.to_le_bytes()); // delta, patched in finish
        self.buf.extend_from_slice(&key_len.to_le_bytes());
        self.buf.extend_from_slice(record.key);
        self.buf.extend_from_slice(&header_count.to_le_bytes());
        self.buf.extend_from_slice(&0u16.to_le_bytes());
        for (name, value) in record.headers {
            // Widths checked above; these casts are lossless.
            self.buf
                .extend_from_slice(&(name.len() as u16).to_le_bytes());
            self.buf.extend_from_slice(name);
            self.buf
                .extend_from_slice(&(value.len() as u32).to_le_bytes());
            self.buf.extend_from_slice(value);
        }
        self.buf.extend_from_slice(&value_len.to_le_bytes());
        self.buf.extend_from_slice(record.value);

        self.record_count += 1;
        self.first_timestamp_ms = first_timestamp_ms;
        self.max_timestamp_ms = max_timestamp_ms;
        Ok(())
    }

    /// Size of the encoded batch if finished now, header included.
    #[inline]
    pub fn len_bytes(&self) -> usize {
        self.buf.len()
    }

    /// Body bytes so far (never above [`BODY_LEN_MAX_BYTES`]).
    #[inline]
    pub fn body_len_bytes(&self) -> u32 {
        // push keeps the body within BODY_LEN_MAX_BYTES, so this never saturates.
        u32::try_from(self.buf.len() - HEADER_LEN).unwrap_or(u32::MAX)
    }

    #[inline]
    pub fn record_count(&self) -> u32 {
        self.record_count
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.record_count == 0
    }

    /// Seals the batch: patches timestamp deltas, hashes the body and writes
    /// the header. Producers pass a provisional stamp (e.g. default) that the
    /// primary later replaces with [`super::restamp`].
    pub fn finish(mut self, stamp: &Stamp) -> Result<Vec<u8>, BatchError> {
        if self.record_count == 0 {
            return Err(BatchError::EmptyBatch);
        }
        check_offsets(stamp.base_offset, self.record_count)?;
        for &(pos, timestamp_ms) in &self.timestamps {
            // push bounded the spread to u32.
            let delta = u32::try_from(timestamp_ms - self.first_timestamp_ms).map_err(|_| {
                BatchError::TimestampSpread {
                    first_timestamp_ms: self.first_timestamp_ms,
                    max_timestamp_ms: self.max_timestamp_ms,
                }
            })?;
            if let Some(slot) = self.buf.get_mut(pos..pos + 4) {
                slot.copy_from_slice(&delta.to_le_bytes());
            }
        }
        let body_len = self.body_len_bytes();
        let available = self.buf.len();
        let (head, body) =
            self.buf
                .split_first_chunk_mut::<HEADER_LEN>()
                .ok_or(BatchError::Truncated {
                    needed: HEADER_LEN,
                    available,
                })?;
        let header = BatchHeader {
            header_checksum: 0,
            body_checksum: checksum(body),
            prev_checksum: stamp.prev_checksum,
            base_offset: stamp.base_offset,
            vsr_op: stamp.vsr_op,
            first_timestamp_ms: self.first_timestamp_ms,
            max_timestamp_ms: self.max_timestamp_ms,
            partition_id: self.partition_id,
            record_count: self.record_count,
            body_len,
            vsr_view: stamp.vsr_view,
            attributes: 0,
        };
        encode_header(&header, head);
        Ok(self.buf)
    }
}

fn len_u32(field: &'static str, len: usize) -> Result<u32, BatchError> {
    u32::try_from(len).map_err(|_| BatchError::FieldTooLong { field, len })
}
