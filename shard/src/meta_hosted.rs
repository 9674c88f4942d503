//! The cluster metadata group as a node hosts it (DESIGN.md section 6).
//!
//! Each node of the group runs one replica of it: a replicated partition
//! with the reserved id [`META_PARTITION_ID`] (`u32::MAX`) on shard 0, its
//! log in `<data_dir>/meta/group` like any partition's (so it recovers at
//! restart and repairs from its peers). Data partition ids never reach
//! it: the table hands ids out from 0 and refuses a create whose ids
//! would reach `META_PARTITION_ID` (`Refusal::PartitionIdsExhausted`).
//!
//! [`MetaGroup`] is the node's state beside that replica: the
//! [`MetaHost`] (the table rebuilt by applying the committed log from its
//! start at every boot; the log is never trimmed), the offset of the next
//! batch to apply, the window of applied request ids (so a retransmitted
//! command runs once, the same on every replica: the window is a function
//! of the log alone) and the outcomes this node's own requests wait for.
//! The controller drives it (`controller::apply_loop`, `controller::submit`).
//!
//! A node whose replica is not primary forwards a command to the primary
//! as a peer frame to [`META_PARTITION_ID`] ([`encode_forward`]; told
//! apart from replication messages by its magic), and learns its outcome
//! by applying the committed op itself: no reply frame is needed.
//!
//! Pure: no clock, socket or thread; the caller passes the request id base.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use ringlog_protocol::BatchHeader;

pub use crate::meta::META_PARTITION_ID;
use crate::meta::{
    Applied, Change, Command, DecodeError, EncodeError, HostError, LocalAction, MetaError,
    MetaHost, MetaTable, NodeId, Refusal,
};

/// The metadata group's name in logs and `ctl partitions`, and in its
/// replica group id. No topic directory: its log is in [`META_DIR`].
pub const META_TOPIC: &str = "__meta";
/// The group's log, under the data directory.
pub const META_DIR: &str = "meta/group";
/// Request ids the dedup window remembers (oldest forgotten first): a
/// retransmission comes within seconds, thousands of commands later it
/// cannot.
pub const APPLIED_IDS_MAX: usize = 4096;
/// Outcomes this node waits for at once: one per queued controller
/// request at most (the controller's queue is smaller).
pub const WAITING_MAX: usize = 128;
/// A forwarded command's frame starts with this (replication messages
/// start with `RLGR`).
const FORWARD_MAGIC: [u8; 4] = *b"RLMF";
/// Bits of a request id below the node id (a u32: the id's high half).
const REQUEST_ID_NODE_SHIFT: u32 = 32;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ForwardError {
    #[error("forwarded command of {0} bytes is too short")]
    Short(usize),
    #[error("forwarded command: {0}")]
    Command(#[from] DecodeError),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WaitError {
    #[error("{max} commands wait for their outcome already")]
    Full { max: usize },
}

#[derive(Debug)]
pub struct MetaGroup {
    host: MetaHost,
    /// Offset of the next committed batch to apply.
    applied_offset: u64,
    /// Applied request ids, log order, at most [`APPLIED_IDS_MAX`].
    window: VecDeque<u64>,
    seen: BTreeSet<u64>,
    /// This node's requests: None until their op applied and its local
    /// actions ran ([`MetaGroup::release_outcomes`]).
    waiting: BTreeMap<u64, Option<Result<Change, Refusal>>>,
    /// Outcomes of the last applied op for waiting requests, held until
    /// its local actions ran (a client told "created" finds the topic).
    staged: Vec<(u64, Result<Change, Refusal>)>,
    next_request_id: u64,
}

impl MetaGroup {
    /// The group state of node `node` (of `shards` shards) in a cluster of
    /// `nodes`; request ids start at `request_id_base` (in the low bits
    /// under the node id: distinct per boot, so ids of an earlier boot in
    /// the log are not taken for this one's).
    pub fn new(
        node: NodeId,
        nodes: &[NodeId],
        shards: u16,
        request_id_base: u64,
    ) -> Result<MetaGroup, String> {
        let table = MetaTable::new(nodes).map_err(|e| e.to_string())?;
        let host = MetaHost::new(node, shards, META_PARTITION_ID, table)
            .map_err(|e: HostError| e.to_string())?;
        let low = request_id_base & ((1 << REQUEST_ID_NODE_SHIFT) - 1);
        Ok(MetaGroup {
            host,
            applied_offset: 0,
            window: VecDeque::new(),
            seen: BTreeSet::new(),
            waiting: BTreeMap::new(),
            staged: Vec::new(),
            next_request_id: u64::from(node) << REQUEST_ID_NODE_SHIFT | low,
        })
    }

    pub fn host(&self) -> &MetaHost {
        &self.host
    }

    pub fn applied_offset(&self) -> u64 {
        self.applied_offset
    }

    /// Whether request `id` applied (within the window).
    pub fn applied(&self, id: u64) -> bool {
        self.seen.contains(&id)
    }

    /// A fresh request id, registered to collect its outcome.
    pub fn start_request(&mut self) -> Result<u64, WaitError> {
        if self.waiting.len() >= WAITING_MAX {
            return Err(WaitError::Full { max: WAITING_MAX });
        }
        let id = self.next_request_id;
        self.next_request_id += 1;
        self.waiting.insert(id, None);
        debug_assert!(self.waiting.len() <= WAITING_MAX);
        Ok(id)
    }

    /// Whether request `id`'s outcome is in.
    pub fn has_outcome(&self, id: u64) -> bool {
        self.waiting.get(&id).is_some_and(Option::is_some)
    }

    /// The outcome of request `id` once applied (then forgotten).
    pub fn take_outcome(&mut self, id: u64) -> Option<Result<Change, Refusal>> {
        if self.has_outcome(id) {
            return self.waiting.remove(&id).flatten();
        }
        None
    }

    /// Gives up waiting for request `id` (timed out).
    pub fn abandon(&mut self, id: u64) {
        self.waiting.remove(&id);
    }

    /// Applies committed `batch` (the next one from
    /// [`MetaGroup::applied_offset`]); returns its op and the local
    /// actions it implies.
    pub fn apply(&mut self, batch: &[u8]) -> Result<(u64, Vec<LocalAction>), MetaError> {
        let header =
            BatchHeader::decode(batch).map_err(|source| MetaError::Batch { op: None, source })?;
        let seen = &self.seen;
        let (applied, actions) = self.host.apply_skipping(batch, |id| seen.contains(&id))?;
        if let Applied::Done { outcomes, .. } = &applied {
            for o in outcomes {
                let Some(id) = o.request_id else { continue };
                if matches!(o.result, Err(Refusal::DuplicateRequest { .. })) {
                    continue;
                }
                self.remember(id);
                if self.waiting.contains_key(&id) {
                    self.staged.push((id, o.result.clone()));
                }
            }
        }
        debug_assert!(header.next_offset() > self.applied_offset || header.record_count == 0);
        self.applied_offset = header.next_offset();
        Ok((header.vsr_op, actions))
    }

    /// Hands the outcomes of the ops applied so far to their waiters: call
    /// once their local actions ran.
    pub fn release_outcomes(&mut self) {
        for (id, result) in self.staged.drain(..) {
            if let Some(slot @ None) = self.waiting.get_mut(&id) {
                *slot = Some(result);
            }
        }
        debug_assert!(self.staged.is_empty());
    }

    fn remember(&mut self, id: u64) {
        if self.seen.insert(id) {
            self.window.push_back(id);
        }
        while self.window.len() > APPLIED_IDS_MAX {
            if let Some(old) = self.window.pop_front() {
                self.seen.remove(&old);
            }
        }
        debug_assert_eq!(self.window.len(), self.seen.len());
    }
}

/// The peer frame payload forwarding request `request_id`'s `cmd` to the
/// metadata primary.
pub fn encode_forward(request_id: u64, cmd: &Command) -> Result<Vec<u8>, EncodeError> {
    let value = cmd.encode()?;
    let mut out = Vec::with_capacity(12 + value.len());
    out.extend_from_slice(&FORWARD_MAGIC);
    out.extend_from_slice(&request_id.to_le_bytes());
    out.extend_from_slice(&value);
    Ok(out)
}

/// Whether a payload for [`META_PARTITION_ID`] is a forwarded command
/// (else a replication message).
pub fn is_forward(payload: &[u8]) -> bool {
    payload.starts_with(&FORWARD_MAGIC)
}

/// The request id and command of a forwarded command's payload.
pub fn decode_forward(payload: &[u8]) -> Result<(u64, Command), ForwardError> {
    debug_assert!(is_forward(payload));
    let Some(id) = payload.get(4..12) else {
        return Err(ForwardError::Short(payload.len()));
    };
    let mut id8 = [0u8; 8];
    id8.copy_from_slice(id);
    let cmd = Command::decode(&payload[12..])?;
    Ok((u64::from_le_bytes(id8), cmd))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::command_batch;
    use ringlog_protocol::{restamp, Stamp};

    fn create(name: &str) -> Command {
        Command::CreateTopic {
            name: name.into(),
            partitions: 2,
            replication_factor: 3,
        }
    }

    /// The batch of `cmds` committed at `op`, from offset `base`.
    fn committed(op: u64, base: u64, cmds: &[(u64, Command)]) -> Vec<u8> {
        let mut batch = command_batch(META_PARTITION_ID, cmds).expect("batch");
        let stamp = Stamp {
            vsr_op: op,
            base_offset: base,
            ..Stamp::default()
        };
        restamp(&mut batch, &stamp).expect("restamp");
        batch
    }

    #[test]
    fn forward_frames_round_trip_and_bad_ones_are_typed() {
        let cmd = create("orders");
        let frame = encode_forward(7, &cmd).expect("encode");
        assert!(is_forward(&frame));
        assert_eq!(decode_forward(&frame), Ok((7, cmd)));
        assert!(!is_forward(b"RLGR and the rest"));
        assert_eq!(decode_forward(b"RLMF1234"), Err(ForwardError::Short(8)));
        let mut bad = frame.clone();
        bad.push(0);
        assert!(matches!(
            decode_forward(&bad),
            Err(ForwardError::Command(DecodeError::Trailing(1)))
        ));
    }

    /// A waiting request gets its first outcome; a retransmission of the
    /// same id commits as a duplicate and changes nothing; the window
    /// forgets the oldest id past its bound; the waiting set is bounded.
    #[test]
    fn outcomes_reach_their_waiter_and_duplicates_apply_once() {
        let mut g = MetaGroup::new(2, &[1, 2, 3], 1, 5).expect("group");
        let id = g.start_request().expect("slot");
        assert_eq!(id, 2 << REQUEST_ID_NODE_SHIFT | 5);
        assert_eq!(g.take_outcome(id), None, "not applied yet");
        let (op, actions) = g
            .apply(&committed(1, 0, &[(id, create("a"))]))
            .expect("op 1");
        assert_eq!((op, actions.len()), (1, 2), "both partitions are local");
        assert!(g.applied(id));
        assert_eq!(g.applied_offset(), 1);
        assert_eq!(g.take_outcome(id), None, "held until its actions ran");
        let dup = committed(2, 1, &[(id, create("a")), (9, create("b"))]);
        let (_, actions) = g.apply(&dup).expect("op 2");
        g.release_outcomes();
        assert!(actions
            .iter()
            .all(|a| matches!(a, LocalAction::Create(p) if p.topic == "b")));
        assert!(matches!(
            g.take_outcome(id),
            Some(Ok(Change::Created { .. }))
        ));
        assert_eq!(g.take_outcome(id), None, "taken once");
        for i in 0..APPLIED_IDS_MAX as u64 {
            g.remember(1000 + i);
        }
        assert!(!g.applied(id), "the oldest id left the window");
        assert_eq!(g.window.len(), APPLIED_IDS_MAX);
        for _ in 0..WAITING_MAX {
            g.start_request().expect("slot");
        }
        assert_eq!(g.start_request(), Err(WaitError::Full { max: WAITING_MAX }));
    }
}
