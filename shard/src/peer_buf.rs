//! Buffers of peer messages, shared by the transport (`net::peer`), the
//! mailboxes (`ops`) and the partitions that encode and decode them: an
//! outgoing message is encoded behind room for its frame header and body
//! prefix, so the transport frames it where it lies; a delivered payload
//! stays in the frame body it was read into. Neither side copies a payload
//! to frame or unframe it.

use ringlog_protocol::wire::FRAME_HEADER_LEN;

/// Frame body bytes before the payload (kind, partition id).
pub const MESSAGE_PREFIX_BYTES: usize = 5;
/// Payload bytes a self-checked frame's checksum covers (a replication
/// header and a Chunk's fixed fields fit); see `net::peer::codec`.
pub const SELF_CHECKED_COVERED_BYTES: usize = 128;
/// Room an [`Outgoing`] keeps before its payload.
pub const HEADROOM_BYTES: usize = FRAME_HEADER_LEN + MESSAGE_PREFIX_BYTES;

/// A delivered payload, still in the frame body it was read into.
#[derive(Debug, PartialEq, Eq)]
pub struct PeerPayload {
    body: Vec<u8>,
    start: usize,
}

impl PeerPayload {
    pub fn new(body: Vec<u8>, start: usize) -> PeerPayload {
        assert!(start <= body.len(), "a payload starts inside its body");
        PeerPayload { body, start }
    }

    /// The payload as a vector of its own (copied unless it starts the
    /// body).
    pub fn into_vec(self) -> Vec<u8> {
        if self.start == 0 {
            return self.body;
        }
        self.body[self.start..].to_vec()
    }

    /// The body it lies in, and where in it the payload starts (so a
    /// consumer can keep a part of it without copying).
    pub fn into_parts(self) -> (Vec<u8>, usize) {
        debug_assert!(self.start <= self.body.len());
        (self.body, self.start)
    }
}

impl From<Vec<u8>> for PeerPayload {
    fn from(body: Vec<u8>) -> PeerPayload {
        PeerPayload { body, start: 0 }
    }
}

impl std::ops::Deref for PeerPayload {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.body[self.start..]
    }
}

/// A message for a peer, encoded behind room for its frame header and body
/// prefix, which the transport's `codec::seal` fills in without moving the payload.
#[derive(Debug)]
pub struct Outgoing {
    frame: Vec<u8>,
    self_checked: bool,
}

impl Outgoing {
    /// An empty message with room for `payload_bytes` of payload.
    pub fn with_capacity(payload_bytes: usize) -> Outgoing {
        let mut frame = Vec::with_capacity(HEADROOM_BYTES + payload_bytes);
        frame.resize(HEADROOM_BYTES, 0);
        Outgoing {
            frame,
            self_checked: false,
        }
    }

    /// A message of `payload` (copied once, behind the room).
    pub fn from_payload(payload: &[u8]) -> Outgoing {
        let mut out = Outgoing::with_capacity(payload.len());
        out.frame.extend_from_slice(payload);
        out
    }

    /// The buffer to encode the payload into: an encoder appends to it
    /// (and may truncate back what it appended), never touching what is
    /// there already.
    pub fn append(&mut self) -> &mut Vec<u8> {
        &mut self.frame
    }

    /// Marks the payload as verified by its consumer past its first
    /// [`SELF_CHECKED_COVERED_BYTES`] (see the module docs): only the
    /// sender of such a payload may.
    pub fn self_checked(mut self) -> Outgoing {
        self.self_checked = true;
        self
    }

    pub fn payload(&self) -> &[u8] {
        &self.frame[HEADROOM_BYTES..]
    }

    /// The whole buffer (room included) and whether it is self-checked.
    pub fn into_parts(self) -> (Vec<u8>, bool) {
        debug_assert!(self.frame.len() >= HEADROOM_BYTES);
        (self.frame, self.self_checked)
    }
}
