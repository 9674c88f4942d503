//! Transfer [`Message`]s to and from the replication wire format, and the
//! driver's routing of a decoded frame: VSR commands to the replica
//! ([`crate::vsr::Message::from_wire`], which returns None for transfer
//! commands), RequestSnapshot .. ReleaseSnapshot to the transfer machines
//! beside it (the offer and chunks to the `Receiver`, the requests and
//! releases to the `Server`). The replica never steps a transfer message.

use ringlog_protocol::replication as wire;

use super::types::{ChunkData, Message};
use crate::vsr;

impl Message {
    /// This message as the wire encoder takes it, sent by `replica` in
    /// `view` (transfer messages carry the sender's view like any other).
    pub fn to_wire(
        &self,
        cluster_id: u128,
        partition_id: u32,
        replica: u8,
        view: u32,
    ) -> wire::Message<'_> {
        let envelope = wire::Envelope {
            cluster_id,
            partition_id,
            replica,
            view,
        };
        let body = match self {
            Message::RequestSnapshot(r) => wire::Body::RequestSnapshot(*r),
            Message::SnapshotOffer(o) => wire::Body::SnapshotOffer(o.clone()),
            Message::RequestChunks(r) => wire::Body::RequestChunks(r.clone()),
            Message::Chunk {
                snapshot_id,
                key,
                data,
            } => wire::Body::Chunk(wire::Chunk {
                snapshot_id: *snapshot_id,
                key: *key,
                data,
            }),
            Message::ReleaseSnapshot(r) => wire::Body::ReleaseSnapshot(*r),
        };
        wire::Message { envelope, body }
    }

    /// A decoded transfer message and its sender, a chunk's bytes copied
    /// out of the receive buffer; None for the VSR commands.
    pub fn from_wire(msg: &wire::Message<'_>) -> Option<(u8, Message)> {
        let out = match &msg.body {
            wire::Body::RequestSnapshot(r) => Message::RequestSnapshot(*r),
            wire::Body::SnapshotOffer(o) => Message::SnapshotOffer(o.clone()),
            wire::Body::RequestChunks(r) => Message::RequestChunks(r.clone()),
            wire::Body::Chunk(c) => Message::Chunk {
                snapshot_id: c.snapshot_id,
                key: c.key,
                data: ChunkData::from(c.data),
            },
            wire::Body::ReleaseSnapshot(r) => Message::ReleaseSnapshot(*r),
            _ => return None,
        };
        Some((msg.envelope.replica, out))
    }

    /// Whether the receiving side's `Receiver` takes it (else its `Server`).
    pub fn for_receiver(&self) -> bool {
        matches!(self, Message::SnapshotOffer(_) | Message::Chunk { .. })
    }
}

/// Where a decoded frame goes on the receiving replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Routed {
    /// To `Replica::step` as `Input::Message`.
    Vsr { from: u8, msg: vsr::Message },
    /// To the transfer machines ([`Message::for_receiver`] says which).
    Transfer { from: u8, msg: Message },
}

/// Routes one decoded frame; None only for a command neither side knows
/// (none today: the two `from_wire`s split the commands between them).
pub fn route(msg: &wire::Message<'_>) -> Option<Routed> {
    if let Some((from, msg)) = Message::from_wire(msg) {
        return Some(Routed::Transfer { from, msg });
    }
    vsr::Message::from_wire(msg).map(|(from, msg)| Routed::Vsr { from, msg })
}
