//! Frames after the handshake: the client protocol's framing
//! (`u32 len | u64 xxh3 | body`, ringlog_protocol::wire: the same checksum,
//! and the length checked against `frame_bytes_max` before allocation),
//! with a body naming its target so the receiver can route it to the shard
//! owning the partition:
//!
//! ```text
//! u8  kind          16 = message, 17 = heartbeat (nothing else follows)
//! u32 partition_id  the partition (replication group) it is for
//! payload           opaque to the transport (a replication message)
//! ```

use ringlog_protocol::wire::{encode_frame, FRAME_HEADER_LEN};

const KIND_MESSAGE: u8 = 16;
const KIND_HEARTBEAT: u8 = 17;
/// Body bytes before the payload.
pub const MESSAGE_PREFIX_BYTES: usize = 5;

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

    /// A frame as the transport would deliver it (tests of its sinks).
    #[cfg(test)]
    pub(crate) fn for_test(partition_id: u32, payload: &[u8]) -> PeerFrame {
        let mut body = vec![KIND_MESSAGE];
        body.extend_from_slice(&partition_id.to_le_bytes());
        body.extend_from_slice(payload);
        PeerFrame { partition_id, body }
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

pub(crate) fn encode_message(partition_id: u32, payload: &[u8]) -> Vec<u8> {
    let mut body = Vec::with_capacity(MESSAGE_PREFIX_BYTES + payload.len());
    body.push(KIND_MESSAGE);
    body.extend_from_slice(&partition_id.to_le_bytes());
    body.extend_from_slice(payload);
    let mut out = Vec::with_capacity(FRAME_HEADER_LEN + body.len());
    encode_frame(&body, &mut out);
    out
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
        Some(&KIND_MESSAGE) if body.len() >= MESSAGE_PREFIX_BYTES => {
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

#[cfg(test)]
mod tests {
    use super::*;
    use ringlog_protocol::wire::decode_frame_header;

    #[test]
    fn frames_round_trip_and_bad_bodies_are_named() {
        let f = encode_message(42, b"prepare");
        let mut head = [0u8; FRAME_HEADER_LEN];
        head.copy_from_slice(&f[..FRAME_HEADER_LEN]);
        let h = decode_frame_header(&head, 1 << 20).unwrap();
        let body = f[FRAME_HEADER_LEN..].to_vec();
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
        for bad in [vec![], vec![16, 1, 2], vec![17, 0], vec![3; 9]] {
            assert!(decode_body(bad.clone()).is_err(), "{bad:?}");
        }
    }
}
