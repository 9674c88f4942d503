//! Frames after the handshake: the client protocol's framing
//! (`u32 len | u64 xxh3 | body`, ringlog_protocol::wire: the same checksum,
//! and the length checked against `frame_bytes_max` before allocation),
//! with a body naming its target so the receiver can route it to the shard
//! owning the partition:
//!
//! ```text
//! u8  kind          16 = message, 17 = heartbeat (nothing else follows),
//!                   18 = self-checked message
//! u32 partition_id  the partition (replication group) it is for
//! payload           opaque to the transport (a replication message)
//! ```
//!
//! A message frame's checksum covers the whole body. A self-checked one's
//! covers the kind, the partition id and the first
//! [`SELF_CHECKED_COVERED_BYTES`] of the payload only: its sender vouches
//! that the payload's consumer verifies the rest anyway (a transfer Chunk,
//! whose data the receiving partition checks against the manifest's chunk
//! checksum before it stages it), so hashing it for the transit too would
//! hash every transferred byte twice on each side.
//!
//! Outgoing messages are encoded into an [`Outgoing`] behind room for the
//! frame header and the body's prefix, and framed where they lie
//! ([`seal`]); a delivered frame's payload stays in the body it was read
//! into ([`PeerPayload`]): neither side copies a payload to frame it.

use ringlog_protocol::checksum;
use ringlog_protocol::wire::{encode_frame, FRAME_HEADER_LEN};

use crate::peer_buf::HEADROOM_BYTES;
pub use crate::peer_buf::{
    Outgoing, PeerPayload, MESSAGE_PREFIX_BYTES, SELF_CHECKED_COVERED_BYTES,
};

const KIND_MESSAGE: u8 = 16;
const KIND_HEARTBEAT: u8 = 17;
const KIND_SELF_CHECKED: u8 = 18;

/// A verified frame from an authenticated peer.
#[derive(Debug, PartialEq, Eq)]
pub struct PeerFrame {
    pub partition_id: u32,
    body: Vec<u8>,
}

impl PeerFrame {
    pub fn payload(&self) -> &[u8] {
        &self.body[MESSAGE_PREFIX_BYTES..]
    }

    /// The payload, without copying it out of the body.
    pub fn into_payload(self) -> PeerPayload {
        PeerPayload::new(self.body, MESSAGE_PREFIX_BYTES)
    }

    /// A frame as the transport would deliver it (tests of its sinks).
    #[cfg(test)]
    pub(crate) fn for_test(partition_id: u32, payload: &[u8]) -> PeerFrame {
        let mut body = vec![KIND_MESSAGE];
        body.extend_from_slice(&partition_id.to_le_bytes());
        body.extend_from_slice(payload);
        PeerFrame { partition_id, body }
    }
}

/// Body bytes of a frame whose body starts with `body`, and how many of
/// them its checksum covers (see the module docs).
pub(crate) fn checksummed_len(body: &[u8]) -> usize {
    match body.first() {
        Some(&KIND_SELF_CHECKED) => body
            .len()
            .min(MESSAGE_PREFIX_BYTES + SELF_CHECKED_COVERED_BYTES),
        _ => body.len(),
    }
}

/// The frame of `out` for partition `partition_id`, in `out`'s own buffer.
pub(crate) fn seal(partition_id: u32, out: Outgoing) -> Vec<u8> {
    let (mut frame, self_checked) = out.into_parts();
    assert!(frame.len() >= HEADROOM_BYTES, "an encoder ate the headroom");
    let body_len = frame.len() - FRAME_HEADER_LEN;
    let kind = if self_checked {
        KIND_SELF_CHECKED
    } else {
        KIND_MESSAGE
    };
    frame[FRAME_HEADER_LEN] = kind;
    frame[FRAME_HEADER_LEN + 1..HEADROOM_BYTES].copy_from_slice(&partition_id.to_le_bytes());
    let covered = checksummed_len(&frame[FRAME_HEADER_LEN..]);
    let sum = checksum(&frame[FRAME_HEADER_LEN..FRAME_HEADER_LEN + covered]);
    // The client protocol's header layout: u32 body length, u64 checksum.
    let len = u32::try_from(body_len).unwrap_or(u32::MAX);
    frame[..4].copy_from_slice(&len.to_le_bytes());
    frame[4..FRAME_HEADER_LEN].copy_from_slice(&sum.to_le_bytes());
    debug_assert_eq!(frame.len(), FRAME_HEADER_LEN + body_len);
    frame
}

#[cfg(test)]
pub(crate) fn encode_message(partition_id: u32, payload: &[u8]) -> Vec<u8> {
    seal(partition_id, Outgoing::from_payload(payload))
}

pub(crate) fn encode_heartbeat() -> Vec<u8> {
    let mut out = Vec::with_capacity(FRAME_HEADER_LEN + 1);
    encode_frame(&[KIND_HEARTBEAT], &mut out);
    out
}

/// Decodes a body whose checksum was verified.
pub(crate) fn decode_body(body: Vec<u8>) -> Result<Inbound, BadFrame> {
    match body.first() {
        Some(&KIND_HEARTBEAT) if body.len() == 1 => Ok(Inbound::Heartbeat),
        Some(&(KIND_MESSAGE | KIND_SELF_CHECKED)) if body.len() >= MESSAGE_PREFIX_BYTES => {
            let mut id = [0u8; 4];
            id.copy_from_slice(&body[1..MESSAGE_PREFIX_BYTES]);
            Ok(Inbound::Message(PeerFrame {
                partition_id: u32::from_le_bytes(id),
                body,
            }))
        }
        Some(kind) => Err(BadFrame(format!(
            "kind {kind} with {} body bytes",
            body.len()
        ))),
        None => Err(BadFrame("empty body".into())),
    }
}

/// What a checked body holds.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Inbound {
    Heartbeat,
    Message(PeerFrame),
}

/// A body that is not a frame of this protocol.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("bad peer frame: {0}")]
pub struct BadFrame(pub String);

#[cfg(test)]
mod tests {
    use super::*;
    use ringlog_protocol::wire::decode_frame_header;

    fn split(f: &[u8]) -> (ringlog_protocol::wire::FrameHeader, Vec<u8>) {
        let mut head = [0u8; FRAME_HEADER_LEN];
        head.copy_from_slice(&f[..FRAME_HEADER_LEN]);
        let h = decode_frame_header(&head, 1 << 20).unwrap();
        assert_eq!(h.body_len as usize, f.len() - FRAME_HEADER_LEN);
        (h, f[FRAME_HEADER_LEN..].to_vec())
    }

    #[test]
    fn frames_round_trip_and_bad_bodies_are_named() {
        let f = encode_message(42, b"prepare");
        let (h, body) = split(&f);
        assert_eq!(checksummed_len(&body), body.len());
        h.verify(&body).unwrap();
        match decode_body(body).unwrap() {
            Inbound::Message(m) => assert_eq!((m.partition_id, m.payload()), (42, &b"prepare"[..])),
            other => panic!("{other:?}"),
        }
        let hb = encode_heartbeat();
        assert_eq!(
            decode_body(hb[FRAME_HEADER_LEN..].to_vec()),
            Ok(Inbound::Heartbeat)
        );
        for bad in [vec![], vec![16, 1, 2], vec![17, 0], vec![3; 9], vec![18, 0]] {
            assert!(decode_body(bad.clone()).is_err(), "{bad:?}");
        }
    }

    /// A self-checked frame's checksum covers its prefix and first payload
    /// bytes: a flip there fails it, one further on reaches the consumer
    /// (which must verify it); a plain message's covers every byte.
    #[test]
    fn a_self_checked_frame_covers_only_its_payload_prefix() {
        let payload: Vec<u8> = (0..1000u32).map(|i| i as u8).collect();
        let mut out = Outgoing::with_capacity(payload.len());
        out.append().extend_from_slice(&payload);
        assert_eq!(out.payload(), &payload[..]);
        let f = seal(7, out.self_checked());
        let (h, body) = split(&f);
        let covered = MESSAGE_PREFIX_BYTES + SELF_CHECKED_COVERED_BYTES;
        assert_eq!(checksummed_len(&body), covered);
        h.verify(&body[..checksummed_len(&body)]).unwrap();
        for i in [0, 1, MESSAGE_PREFIX_BYTES, covered - 1] {
            let mut bad = body.clone();
            bad[i] ^= 0x10;
            let n = checksummed_len(&bad);
            assert!(h.verify(&bad[..n]).is_err(), "byte {i} is covered");
        }
        let mut late = body.clone();
        late[covered] ^= 0x10;
        h.verify(&late[..checksummed_len(&late)]).unwrap();
        match decode_body(late).unwrap() {
            Inbound::Message(m) => {
                assert_eq!(m.partition_id, 7);
                let p = m.into_payload();
                assert_eq!(
                    p[SELF_CHECKED_COVERED_BYTES],
                    payload[SELF_CHECKED_COVERED_BYTES] ^ 0x10
                );
            }
            other => panic!("{other:?}"),
        }
        let plain = encode_message(7, &payload);
        let (h, mut body) = split(&plain);
        body[covered] ^= 0x10;
        assert!(h.verify(&body[..checksummed_len(&body)]).is_err());
    }

    #[test]
    fn a_payload_is_handed_on_in_its_body() {
        let f = encode_message(3, b"abc");
        let (_, body) = split(&f);
        let ptr = body.as_ptr();
        let Ok(Inbound::Message(m)) = decode_body(body) else {
            panic!("a message")
        };
        let p = m.into_payload();
        assert_eq!(&p[..], b"abc");
        let (body, start) = p.into_parts();
        assert_eq!((body.as_ptr(), start), (ptr, MESSAGE_PREFIX_BYTES));
        assert_eq!(PeerPayload::from(b"xy".to_vec()).into_vec(), b"xy");
    }
}
