//! Frame header encode/decode: `u32 body_len | u64 body_checksum | body`.
//!
//! The checksum covers the whole body, except in a Produce request, where it
//! covers the body up to the record batch (see [`super::split_request`]):
//! the batch carries its own header and body checksums, which the server
//! verifies anyway before it stores the batch, so hashing its bytes for the
//! frame too would hash every produced byte twice. End to end, a flipped bit
//! in the head fails the frame checksum and one in the batch fails the
//! batch's own checksums; on disk, the batch's checksums are verified at read.

use super::WireError;
use crate::checksum::checksum;

/// Bytes before the body.
pub const FRAME_HEADER_LEN: usize = 12;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    pub body_len: u32,
    pub body_checksum: u64,
}

impl FrameHeader {
    /// Checks a request body against the header's checksum: the part
    /// [`super::split_request`] says it covers.
    pub fn verify_request(&self, body: &[u8]) -> Result<(), WireError> {
        match super::split_request(body) {
            super::RequestSplit::Produce(head) => self.verify(&body[..head.head_len]),
            _ => self.verify(body),
        }
    }

    /// Checks `covered` (the whole body, or a Produce request's head)
    /// against the header's checksum.
    pub fn verify(&self, body: &[u8]) -> Result<(), WireError> {
        let actual = checksum(body);
        if actual != self.body_checksum {
            return Err(WireError::BadChecksum {
                expected: self.body_checksum,
                actual,
            });
        }
        Ok(())
    }
}

/// Decodes a frame header, rejecting a body longer than `body_bytes_max`
/// before anything is allocated.
pub fn decode_frame_header(
    bytes: &[u8; FRAME_HEADER_LEN],
    body_bytes_max: u32,
) -> Result<FrameHeader, WireError> {
    let (len, sum) = bytes.split_at(4);
    let mut len4 = [0u8; 4];
    len4.copy_from_slice(len);
    let mut sum8 = [0u8; 8];
    sum8.copy_from_slice(sum);
    let body_len = u32::from_le_bytes(len4);
    if body_len > body_bytes_max {
        return Err(WireError::FrameTooLarge {
            len_bytes: body_len,
            max_bytes: body_bytes_max,
        });
    }
    Ok(FrameHeader {
        body_len,
        body_checksum: u64::from_le_bytes(sum8),
    })
}

/// Prepends the frame header to `body` (`out` receives header then body).
pub fn encode_frame(body: &[u8], out: &mut Vec<u8>) {
    // Bodies are built by this crate's encoders, which stay under the cap.
    let len = u32::try_from(body.len()).unwrap_or(u32::MAX);
    out.reserve(FRAME_HEADER_LEN + body.len());
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&checksum(body).to_le_bytes());
    out.extend_from_slice(body);
}
