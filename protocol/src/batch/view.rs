use super::{BatchError, BatchHeader, HEADERS_PER_RECORD_MAX, HEADER_LEN};
use crate::checksum::checksum;
use crate::reader::{usize_from, Reader};

/// A fully validated batch borrowed from a buffer. Construct only through
/// [`BatchView::parse`], so holding one proves the bytes are well-formed.
#[derive(Debug, Clone, Copy)]
pub struct BatchView<'a> {
    header: BatchHeader,
    bytes: &'a [u8],
}

impl<'a> BatchView<'a> {
    /// Validates the batch at the start of `bytes`: header, body checksum and
    /// the complete record structure. Bytes past `total_len` are ignored so a
    /// batch can be parsed in place from a larger read buffer. No allocation.
    pub fn parse(bytes: &'a [u8]) -> Result<BatchView<'a>, BatchError> {
        // Header first: a bad body_len is rejected before touching the body.
        let header = BatchHeader::decode(bytes)?;
        let total_len = header.total_len();
        let batch = bytes.get(..total_len).ok_or(BatchError::Truncated {
            needed: total_len,
            available: bytes.len(),
        })?;
        let body = batch.get(HEADER_LEN..).unwrap_or_default();
        let actual = checksum(body);
        if actual != header.body_checksum {
            return Err(BatchError::BodyChecksum {
                expected: header.body_checksum,
                actual,
            });
        }
        validate_body(&header, body)?;
        Ok(BatchView {
            header,
            bytes: batch,
        })
    }

    #[inline]
    pub fn header(&self) -> &BatchHeader {
        &self.header
    }

    /// Exactly `header().total_len()` bytes: header and body.
    #[inline]
    pub fn as_bytes(&self) -> &'a [u8] {
        self.bytes
    }

    #[inline]
    pub fn body(&self) -> &'a [u8] {
        self.bytes.get(HEADER_LEN..).unwrap_or_default()
    }

    pub fn records(&self) -> RecordIter<'a> {
        RecordIter {
            reader: Reader::new(self.body()),
            index: 0,
            record_count: self.header.record_count,
            base_offset: self.header.base_offset,
            first_timestamp_ms: self.header.first_timestamp_ms,
        }
    }
}

fn validate_body(header: &BatchHeader, body: &[u8]) -> Result<(), BatchError> {
    // decode guarantees max >= first.
    let span_ms = header.max_timestamp_ms - header.first_timestamp_ms;
    let mut reader = Reader::new(body);
    for index in 0..header.record_count {
        if reader.remaining() == 0 {
            return Err(BatchError::MissingRecords {
                expected: header.record_count,
                found: index,
            });
        }
        let length = reader.u32().ok_or(BatchError::RecordTruncated {
            index,
            field: "length",
        })?;
        let remaining = reader.remaining();
        let record = reader
            .take(usize_from(length))
            .ok_or(BatchError::RecordLength {
                index,
                length,
                remaining,
            })?;
        validate_record(index, span_ms, record)?;
    }
    if reader.remaining() != 0 {
        return Err(BatchError::TrailingBodyBytes {
            unused: reader.remaining(),
        });
    }
    Ok(())
}

/// `record` is the record's bytes after its length field.
#[inline]
fn validate_record(index: u32, span_ms: u64, record: &[u8]) -> Result<(), BatchError> {
    let truncated = |field| BatchError::RecordTruncated { index, field };
    let mut r = Reader::new(record);

    let offset_delta = r.u32().ok_or(truncated("offset_delta"))?;
    if offset_delta != index {
        return Err(BatchError::OffsetDelta {
            index,
            expected: index,
            actual: offset_delta,
        });
    }
    let delta_ms = r.u32().ok_or(truncated("timestamp_delta_ms"))?;
    if u64::from(delta_ms) > span_ms {
        return Err(BatchError::TimestampDelta {
            index,
            delta_ms,
            span_ms,
        });
    }
    r.bytes_u32().ok_or(truncated("key"))?;
    let header_count = r.u16().ok_or(truncated("header_count"))?;
    if header_count > HEADERS_PER_RECORD_MAX {
        return Err(BatchError::TooManyHeaders {
            index,
            count: usize::from(header_count),
        });
    }
    if r.u16().ok_or(truncated("reserved"))? != 0 {
        return Err(BatchError::RecordNonZeroReserved { index });
    }
    for _ in 0..header_count {
        r.bytes_u16().ok_or(truncated("header name"))?;
        r.bytes_u32().ok_or(truncated("header value"))?;
    }
    r.bytes_u32().ok_or(truncated("value"))?;
    if r.remaining() != 0 {
        return Err(BatchError::RecordTrailingBytes {
            index,
            unused: r.remaining(),
        });
    }
    Ok(())
}

/// One record of a validated batch, borrowing from the batch bytes.
#[derive(Debug, Clone)]
pub struct RecordView<'a> {
    pub offset: u64,
    pub timestamp_ms: u64,
    pub key: &'a [u8],
    pub headers: HeaderIter<'a>,
    pub value: &'a [u8],
}

/// Records of a [`BatchView`] in offset order.
///
/// Relies on [`BatchView::parse`] having validated the body; it never
/// panics, and on (impossible) malformed input it simply stops early.
#[derive(Debug, Clone)]
pub struct RecordIter<'a> {
    reader: Reader<'a>,
    index: u32,
    record_count: u32,
    base_offset: u64,
    first_timestamp_ms: u64,
}

impl<'a> RecordIter<'a> {
    fn read_one(&mut self) -> Option<RecordView<'a>> {
        let length = self.reader.u32()?;
        let mut r = Reader::new(self.reader.take(usize_from(length))?);
        let offset_delta = r.u32()?;
        let delta_ms = r.u32()?;
        let key = r.bytes_u32()?;
        let header_count = r.u16()?;
        r.u16()?; // reserved
        let headers_start = r.clone();
        for _ in 0..header_count {
            r.bytes_u16()?;
            r.bytes_u32()?;
        }
        let headers_len = headers_start.remaining() - r.remaining();
        let headers = HeaderIter {
            reader: Reader::new(headers_start.clone().take(headers_len)?),
            remaining: header_count,
        };
        let value = r.bytes_u32()?;
        Some(RecordView {
            offset: self.base_offset.wrapping_add(u64::from(offset_delta)),
            timestamp_ms: self.first_timestamp_ms.wrapping_add(u64::from(delta_ms)),
            key,
            headers,
            value,
        })
    }
}

impl<'a> Iterator for RecordIter<'a> {
    type Item = RecordView<'a>;

    fn next(&mut self) -> Option<RecordView<'a>> {
        if self.index >= self.record_count {
            return None;
        }
        let record = self.read_one();
        // Stop for good on malformed input rather than resynchronising.
        self.index = if record.is_some() {
            self.index + 1
        } else {
            self.record_count
        };
        record
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = usize_from(self.record_count - self.index);
        (left, Some(left))
    }
}

impl ExactSizeIterator for RecordIter<'_> {}

/// `(name, value)` headers of one record, in encoded order.
#[derive(Debug, Clone)]
pub struct HeaderIter<'a> {
    reader: Reader<'a>,
    remaining: u16,
}

impl<'a> Iterator for HeaderIter<'a> {
    type Item = (&'a [u8], &'a [u8]);

    fn next(&mut self) -> Option<(&'a [u8], &'a [u8])> {
        if self.remaining == 0 {
            return None;
        }
        let pair = self
            .reader
            .bytes_u16()
            .and_then(|name| Some((name, self.reader.bytes_u32()?)));
        self.remaining = if pair.is_some() {
            self.remaining - 1
        } else {
            0
        };
        pair
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = usize::from(self.remaining);
        (left, Some(left))
    }
}

impl ExactSizeIterator for HeaderIter<'_> {}
