//! The machine's [`Message`] to and from the replication wire format
//! (`ringlog_protocol::replication`). The driver decodes a frame, checks
//! its cluster and partition, and steps `Input::Message` with
//! [`Message::from_wire`]; it encodes each `Output::Send` through
//! [`Message::to_wire`].

use ringlog_protocol::batch::{BatchError, BatchView};
use ringlog_protocol::replication as wire;

use super::types::{BatchBytes, Body, Message, Prepare, Prepares};

impl Message {
    /// This message as the wire encoder takes it, sent by `replica`.
    /// Batches are re-parsed (and so re-verified) into views.
    pub fn to_wire(
        &self,
        cluster_id: u128,
        partition_id: u32,
        replica: u8,
    ) -> Result<wire::Message<'_>, BatchError> {
        let envelope = wire::Envelope {
            cluster_id,
            partition_id,
            replica,
            view: self.view,
        };
        let body = match &self.body {
            Body::Prepare(p) => wire::Body::Prepare(wire::Prepare {
                op: p.op,
                commit: p.commit,
                batch: BatchView::parse(&p.batch)?,
            }),
            Body::PrepareOk(b) => wire::Body::PrepareOk(*b),
            Body::Commit(b) => wire::Body::Commit(*b),
            Body::StartViewChange => wire::Body::StartViewChange,
            Body::DoViewChange(b) => wire::Body::DoViewChange(b.clone()),
            Body::StartView(b) => wire::Body::StartView(b.clone()),
            Body::RequestStartView(b) => wire::Body::RequestStartView(*b),
            Body::ViewNotice(b) => wire::Body::ViewNotice(*b),
            Body::RequestPrepares(b) => wire::Body::RequestPrepares(*b),
            Body::Prepares(p) => {
                let batches = p.batches.iter().map(|b| BatchView::parse(b));
                wire::Body::Prepares(wire::Prepares {
                    commit: p.commit,
                    batches: batches.collect::<Result<_, _>>()?,
                })
            }
            Body::RangeEvicted(b) => wire::Body::RangeEvicted(*b),
        };
        Ok(wire::Message { envelope, body })
    }

    /// A decoded message as the machine's input: its sender and the
    /// message, batches copied out of the receive buffer. `None` for the
    /// state-transfer commands (RequestSnapshot .. ReleaseSnapshot): they
    /// are not the replica's to step.
    pub fn from_wire(msg: &wire::Message<'_>) -> Option<(u8, Message)> {
        let own = |b: &BatchView<'_>| -> BatchBytes { b.as_bytes().into() };
        let body = match &msg.body {
            wire::Body::Prepare(p) => Body::Prepare(Prepare {
                op: p.op,
                commit: p.commit,
                batch: own(&p.batch),
            }),
            wire::Body::PrepareOk(b) => Body::PrepareOk(*b),
            wire::Body::Commit(b) => Body::Commit(*b),
            wire::Body::StartViewChange => Body::StartViewChange,
            wire::Body::DoViewChange(b) => Body::DoViewChange(b.clone()),
            wire::Body::StartView(b) => Body::StartView(b.clone()),
            wire::Body::RequestStartView(b) => Body::RequestStartView(*b),
            wire::Body::ViewNotice(b) => Body::ViewNotice(*b),
            wire::Body::RequestPrepares(b) => Body::RequestPrepares(*b),
            wire::Body::Prepares(p) => Body::Prepares(Prepares {
                commit: p.commit,
                batches: p.batches.iter().map(own).collect(),
            }),
            wire::Body::RangeEvicted(b) => Body::RangeEvicted(*b),
            wire::Body::RequestSnapshot(_)
            | wire::Body::SnapshotOffer(_)
            | wire::Body::RequestChunks(_)
            | wire::Body::Chunk(_)
            | wire::Body::ReleaseSnapshot(_) => return None,
        };
        let message = Message {
            view: msg.envelope.view,
            body,
        };
        Some((msg.envelope.replica, message))
    }
}
