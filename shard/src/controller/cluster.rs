//! The controller in a cluster: create and delete are commands of the
//! metadata group (`meta_hosted`), accepted by any node of the group.
//!
//! * [`run`] takes a client's command: on the metadata primary it is
//!   submitted to the group's replica (a produce to `META_PARTITION_ID`,
//!   answered at commit); elsewhere it is forwarded to the primary as a
//!   peer frame, again every [`FORWARD_RETRY_MS`] while no outcome came
//!   (the primary may have changed or the frame been dropped). Either way
//!   the client is answered once the command's op applied on THIS node
//!   and its local actions ran (its partitions exist here by then), with the table's outcome, or a
//!   typed timeout after [`COMMAND_TIMEOUT_MS`] (no quorum, say; the
//!   command may still apply later).
//! * [`apply_loop`] follows the group's commit on every node: it applies
//!   each committed batch to the table and runs the local actions the op
//!   implies through the same topic create and delete paths as a single
//!   node, with the ids the table gave. Ops whose actions topics.json
//!   reflects already (`TopicTable::meta_applied_op`) are replayed into
//!   the table only.
//!
//! Purge of a replicated topic is a metadata command too, but no node
//! purges its store when it applies it (each at its own moment would fork
//! the partition's log): the command only bumps the topic's purge
//! generation in the table. Each partition then purges through its own
//! replica group: its primary submits a purge op (`Partition::purge_to`),
//! which every replica applies at the same op, so records produced after
//! it are kept everywhere. Level-triggered: [`apply_loop`] keeps every
//! local partition whose store is below its topic's generation in a
//! pending set (rebuilt by the replay at boot) and asks its owner again
//! each round, so a primary elected later, or a node back from a crash,
//! gets there too; a replica that missed the purge op learns it by
//! repair or by a transfer's purge generation. At most one purge op is
//! in flight per partition, so a generation purges once. The client is
//! answered once every partition of the topic here reached the
//! generation, or after [`PURGE_TIMEOUT_MS`] with a typed timeout (the
//! purge still completes when the partitions' groups can).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use ringlog_protocol::wire::ErrorCode;
use ringlog_protocol::BatchHeader;

use crate::handle::ShardHandle;
use crate::meta::{command_batch, Change, Command, LocalAction, Refusal, RouteError};
use crate::meta_hosted::{decode_forward, encode_forward, MetaGroup, META_PARTITION_ID};
use crate::ops::{MetaOp, Op, OpError, OpReply, Outcome};
use crate::vsr::Status;

/// How long a client's command may take to apply here.
pub(crate) const COMMAND_TIMEOUT_MS: u64 = 10_000;
/// A forwarded command without an outcome is sent again after this.
const FORWARD_RETRY_MS: u64 = 1_000;
/// Retry pause while the group has no primary (a view change, a replica
/// still recovering) or the primary's replica refused for now.
const NO_PRIMARY_RETRY_MS: u64 = 100;
/// How often a waiting command looks for its outcome.
const OUTCOME_POLL_MS: u64 = 10;
/// Bytes of the group's log one apply step reads at most.
const APPLY_FETCH_BYTES_MAX: u32 = 1 << 20;
/// Long-poll of the apply loop's reads; and its pause after an error.
const APPLY_WAIT_MS: u32 = 200;
/// How long a purge's partitions may take to purge once the metadata
/// command applied (with the command's own timeout, within the control
/// socket's 30 s).
pub(crate) const PURGE_TIMEOUT_MS: u64 = 10_000;
/// How often a waiting purge asks its partitions.
const PURGE_POLL_MS: u64 = 50;

pub(crate) async fn run(shard: &impl ShardHandle, op: MetaOp) -> Outcome {
    let cmd = match op {
        MetaOp::CreateTopic { topic, partitions } => {
            super::check_create(&topic, partitions)?;
            Command::CreateTopic {
                name: topic,
                partitions,
                replication_factor: shard.config().replication_factor(),
            }
        }
        MetaOp::DeleteTopic { topic } => Command::DeleteTopic { name: topic },
        MetaOp::PurgeTopic { topic } => Command::PurgeTopic { name: topic },
        MetaOp::Forwarded { from, payload } => {
            forwarded(shard, from, &payload).await;
            return Ok(OpReply::Empty);
        }
    };
    let Some(group) = shard.meta_group() else {
        return Err(OpError::new(
            ErrorCode::PartitionUnavailable,
            format!(
                "node {} hosts no metadata replica (the last node of an even node count): \
                 create, delete and purge topics through another node",
                shard.config().node_id
            ),
        ));
    };
    let id = group
        .borrow_mut()
        .start_request()
        .map_err(|e| OpError::new(ErrorCode::Backpressure, format!("metadata commands: {e}")))?;
    let deadline = Instant::now() + Duration::from_millis(COMMAND_TIMEOUT_MS);
    let outcome = drive(shard, group, id, &cmd, deadline).await;
    group.borrow_mut().abandon(id);
    match outcome? {
        Change::Purged { name, generation } => purged(shard, &name, generation).await,
        _ => Ok(OpReply::Empty),
    }
}

/// Waits until every partition of `topic` here reached purge generation
/// `generation` (see the module docs), asking their owners, which makes
/// a primary among them submit its purge op at once.
async fn purged(shard: &impl ShardHandle, topic: &str, generation: u64) -> Outcome {
    let deadline = Instant::now() + Duration::from_millis(PURGE_TIMEOUT_MS);
    let Some(meta) = shard.catalog().snapshot().topics.get(topic).cloned() else {
        // Deleted since: nothing of it is left to purge.
        return Ok(OpReply::Empty);
    };
    let mut left: Vec<u32> = (0..meta.partitions).collect();
    loop {
        let mut still = Vec::with_capacity(left.len());
        for &index in &left {
            let owner = crate::placement::shard_for(topic, index, shard.shard_count());
            let op = Op::PurgeTo {
                partition_id: meta.first_partition_id + index,
                generation,
            };
            match shard.call(owner, op).await {
                Ok(OpReply::Purge { done: true }) => {}
                Err(e) if e.code == ErrorCode::UnknownPartition => {}
                Ok(_) => still.push(index),
                Err(e) => {
                    tracing::debug!(topic, index, error = %e, "purge progress not known");
                    still.push(index);
                }
            }
        }
        debug_assert!(still.len() <= left.len());
        left = still;
        if left.is_empty() {
            return Ok(OpReply::Empty);
        }
        if Instant::now() >= deadline {
            return Err(OpError::new(
                ErrorCode::PartitionUnavailable,
                format!(
                    "purge of topic {topic:?} (generation {generation}) committed in the cluster \
                     metadata, but partitions {left:?} did not purge here within \
                     {PURGE_TIMEOUT_MS} ms (no quorum, or this replica behind?); they purge when \
                     their replica groups can"
                ),
            ));
        }
        monoio::time::sleep(Duration::from_millis(PURGE_POLL_MS)).await;
    }
}

/// Submits or forwards request `id` until its outcome applied here or
/// `deadline` passed.
async fn drive(
    shard: &impl ShardHandle,
    group: &RefCell<MetaGroup>,
    id: u64,
    cmd: &Command,
    deadline: Instant,
) -> Result<Change, OpError> {
    loop {
        let taken = group.borrow_mut().take_outcome(id);
        if let Some(result) = taken {
            return change_of(cmd, result);
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(OpError::new(
                ErrorCode::PartitionUnavailable,
                format!(
                    "{} not applied within {COMMAND_TIMEOUT_MS} ms (no metadata quorum?); \
                     its outcome is unknown: list the topics before retrying",
                    describe(cmd)
                ),
            ));
        }
        let routed = match shard.meta_role() {
            Some(role) => group.borrow().host().route(id, cmd, role),
            None => Err(RouteError::NoPrimary { view: 0 }),
        };
        let retry = Duration::from_millis(NO_PRIMARY_RETRY_MS);
        let until = match routed {
            Ok(batch) => match submit(shard, batch, deadline).await {
                // Committed: its outcome comes with the apply.
                Ok(()) => deadline,
                Err(e) => {
                    tracing::debug!(error = %e, "metadata command not committed; retrying");
                    now + retry
                }
            },
            Err(RouteError::NotPrimary { primary, .. }) => {
                let payload = encode_forward(id, cmd).map_err(invalid)?;
                shard.send_peer(primary, META_PARTITION_ID, payload);
                now + Duration::from_millis(FORWARD_RETRY_MS)
            }
            Err(RouteError::NoPrimary { .. }) => now + retry,
            Err(RouteError::Refused(r)) => return change_of(cmd, Err(r)),
            Err(RouteError::Encode(e)) => return Err(invalid(e)),
        };
        wait_outcome(group, id, until.min(deadline)).await;
    }
}

/// Steps `batch` into this node's metadata replica; Ok once committed,
/// an error if not by `deadline` (without a quorum the replica holds it;
/// it may still commit later, and then applies like any op).
async fn submit(
    shard: &impl ShardHandle,
    batch: Vec<u8>,
    deadline: Instant,
) -> Result<(), OpError> {
    let op = Op::Produce {
        partition_id: META_PARTITION_ID,
        batch: batch.into(),
    };
    let wait = deadline.saturating_duration_since(Instant::now());
    monoio::select! {
        outcome = shard.call(0, op) => outcome.map(|_| ()),
        _ = monoio::time::sleep(wait) => Err(OpError::new(
            ErrorCode::PartitionUnavailable,
            "metadata command not committed in time",
        )),
    }
}

async fn wait_outcome(group: &RefCell<MetaGroup>, id: u64, until: Instant) {
    let poll = Duration::from_millis(OUTCOME_POLL_MS);
    loop {
        let now = Instant::now();
        if now >= until || group.borrow().has_outcome(id) {
            return;
        }
        monoio::time::sleep(poll.min(until - now)).await;
    }
}

/// A command another node forwarded: submitted if this replica is the
/// primary and it did not apply yet, else dropped (its sender retries).
/// Not checked against the table first: a refusal must commit too, so
/// the sender learns it from its own apply.
async fn forwarded(shard: &impl ShardHandle, from: u32, payload: &[u8]) {
    let (id, cmd) = match decode_forward(payload) {
        Ok(decoded) => decoded,
        Err(e) => {
            tracing::warn!(from, error = %e, "forwarded metadata command dropped");
            return;
        }
    };
    let Some(group) = shard.meta_group() else {
        return;
    };
    let role = shard.meta_role();
    let primary = role.is_some_and(|r| r.status == Status::Normal && r.primary == r.replica);
    if !primary || group.borrow().applied(id) {
        tracing::debug!(
            from,
            id,
            primary,
            "forwarded metadata command not submitted"
        );
        return;
    }
    // Bounded like a local command, so this queue moves on without a
    // quorum; the sender's own deadline is the same.
    let deadline = Instant::now() + Duration::from_millis(COMMAND_TIMEOUT_MS);
    let submitted = match command_batch(META_PARTITION_ID, &[(id, cmd)]) {
        Ok(batch) => submit(shard, batch, deadline).await,
        Err(e) => Err(invalid(e)),
    };
    if let Err(e) = submitted {
        tracing::debug!(from, id, error = %e, "forwarded metadata command not committed");
    }
}

fn invalid(e: impl std::fmt::Display) -> OpError {
    OpError::new(ErrorCode::InvalidTopic, format!("metadata command: {e}"))
}

fn describe(cmd: &Command) -> String {
    match cmd {
        Command::CreateTopic { name, .. } => format!("create of topic {name:?}"),
        Command::DeleteTopic { name } => format!("delete of topic {name:?}"),
        Command::PurgeTopic { name } => format!("purge of topic {name:?}"),
    }
}

/// An applied command's outcome, as the client is told a refusal.
fn change_of(cmd: &Command, result: Result<Change, Refusal>) -> Result<Change, OpError> {
    let refusal = match result {
        Ok(change) => return Ok(change),
        Err(r) => r,
    };
    let code = match refusal {
        Refusal::DuplicateTopic { .. } => ErrorCode::TopicExists,
        Refusal::UnknownTopic { .. } => ErrorCode::UnknownTopic,
        _ => ErrorCode::InvalidTopic,
    };
    Err(OpError::new(
        code,
        format!(
            "{} refused by the cluster metadata: {refusal}",
            describe(cmd)
        ),
    ))
}

/// Follows the metadata group's commit on this node (see the module
/// docs) until shutdown.
pub(crate) async fn apply_loop(shard: &impl ShardHandle) {
    let Some(group) = shard.meta_group() else {
        return;
    };
    let pause = Duration::from_millis(u64::from(APPLY_WAIT_MS));
    let mut pending = Pending::default();
    while !shard.is_stopping() {
        pending.drive(shard).await;
        let op = Op::Fetch {
            partition_id: META_PARTITION_ID,
            offset: group.borrow().applied_offset(),
            max_bytes: APPLY_FETCH_BYTES_MAX,
            wait_ms: APPLY_WAIT_MS,
        };
        let batches = match shard.call(0, op).await {
            Ok(OpReply::Fetched(f)) => f.batches,
            Ok(other) => {
                tracing::error!(reply = ?other, "metadata log read: unexpected reply");
                Vec::new()
            }
            Err(e) => {
                tracing::debug!(error = %e, "metadata log read failed; retrying");
                Vec::new()
            }
        };
        let idle = batches.is_empty()
            || apply_batches(shard, group, &mut pending, &batches)
                .await
                .is_err();
        // A fetch reply's buffer belongs to the server's pool.
        shard.reply_pool().put(batches);
        if idle {
            monoio::time::sleep(pause).await;
        }
    }
}

/// Applies the committed batches in `bytes` (back to back) in order.
async fn apply_batches(
    shard: &impl ShardHandle,
    group: &RefCell<MetaGroup>,
    pending: &mut Pending,
    bytes: &[u8],
) -> Result<(), ()> {
    let mut at = 0;
    while at < bytes.len() {
        let len = match BatchHeader::decode(&bytes[at..]) {
            Ok(h) => h.total_len(),
            Err(e) => {
                tracing::error!(error = %e, "metadata log: undecodable batch");
                return Err(());
            }
        };
        let batch = bytes.get(at..at + len).ok_or(())?;
        let applied = group.borrow_mut().apply(batch);
        match applied {
            Ok((op, actions)) => {
                // Replayed ops too: a purge not done before a restart is
                // driven again (its partitions say whether it was).
                pending.note(shard, &actions);
                run_actions(shard, op).await;
                group.borrow_mut().release_outcomes();
            }
            Err(e) => {
                // Stuck here (retried) rather than skip an op.
                tracing::error!(error = %e, "metadata log: batch not applied");
                return Err(());
            }
        }
        at += len;
    }
    debug_assert_eq!(at, bytes.len());
    Ok(())
}

/// Runs op `op`'s local actions, unless topics.json reflects it already:
/// this node's topic table follows the metadata table's topics, every one
/// of them (clients reach any topic through any node), and opens the
/// partitions the table placed here (`OpenPartition` skips the others).
/// Level-triggered against the metadata table, so a topic none of whose
/// partitions are placed here (no local action) is listed too.
async fn run_actions(shard: &impl ShardHandle, op: u64) {
    if op <= shard.catalog().snapshot().meta_applied_op {
        return;
    }
    let Some(group) = shard.meta_group() else {
        return;
    };
    // (first id, partitions, replicas) of each topic of the metadata table.
    let cluster: BTreeMap<String, (u32, u32, u8)> = group
        .borrow()
        .host()
        .table()
        .topics()
        .iter()
        .map(|(name, t)| {
            let entry = (t.first_partition_id, t.partitions, t.replication_factor);
            (name.clone(), entry)
        })
        .collect();
    // Gone from the cluster's table, or deleted and created again (new ids).
    let deletes: Vec<String> = shard
        .catalog()
        .snapshot()
        .topics
        .iter()
        .filter(|(name, m)| {
            cluster
                .get(*name)
                .is_none_or(|c| c.0 != m.first_partition_id)
        })
        .map(|(name, _)| name.clone())
        .collect();
    for topic in deletes {
        if let Err(e) = super::delete(shard, topic.clone(), Some(op)).await {
            tracing::warn!(%topic, op, error = %e, "applied delete");
        }
    }
    let local = shard.catalog().snapshot();
    for (topic, (first, partitions, replicas)) in cluster {
        let known = local.topics.get(&topic);
        if known.is_none_or(|m| m.first_partition_id != first) {
            create_applied(shard, &topic, first, partitions, replicas, op).await;
        }
    }
}

/// Creates the partitions of `topic` the metadata table placed here (ids
/// `first..first + partitions`), recording op `op` as applied.
async fn create_applied(
    shard: &impl ShardHandle,
    topic: &str,
    first: u32,
    partitions: u32,
    replicas: u8,
    op: u64,
) {
    let mut table = (*shard.catalog().snapshot()).clone();
    if let Some(m) = table.topics.get(topic) {
        if m.first_partition_id != first || m.partitions != partitions {
            tracing::error!(
                topic,
                local_first = m.first_partition_id,
                first,
                "a local topic of this name has other partition ids than the cluster's; left as is"
            );
        }
        return;
    }
    table.meta_applied_op = table.meta_applied_op.max(op);
    if let Err(e) = super::open_topic(shard, table, topic, partitions, first, replicas).await {
        // The topic stays `creating`: its partitions are opened again at
        // boot, and the failure shows in `ctl partitions`.
        tracing::error!(topic, op, error = %e, "applied create: partitions not all opened");
    }
}

/// The local partitions whose purge is not known done: partition id ->
/// (owner shard, the topic's purge generation). One entry per partition
/// at most, so bounded by `meta::CLUSTER_PARTITIONS_MAX`.
#[derive(Default)]
struct Pending(BTreeMap<u32, (usize, u64)>);

impl Pending {
    /// Takes in the purges (and deletes) among an applied op's actions.
    fn note(&mut self, shard: &impl ShardHandle, actions: &[LocalAction]) {
        for action in actions {
            match action {
                LocalAction::Purge(p) => {
                    let owner = crate::placement::shard_for(&p.topic, p.index, shard.shard_count());
                    self.0.insert(p.partition_id, (owner, p.purge_generation));
                }
                LocalAction::Delete(p) => {
                    self.0.remove(&p.partition_id);
                }
                LocalAction::Create(_) => {}
            }
        }
        debug_assert!(self.0.len() as u64 <= crate::meta::CLUSTER_PARTITIONS_MAX);
    }

    /// Asks each pending partition's owner once (`Partition::purge_to`:
    /// its primary submits the purge op); forgets those done or gone.
    async fn drive(&mut self, shard: &impl ShardHandle) {
        if self.0.is_empty() {
            return;
        }
        let entries: Vec<(u32, (usize, u64))> = self.0.iter().map(|(&k, &v)| (k, v)).collect();
        for (partition_id, (owner, generation)) in entries {
            let op = Op::PurgeTo {
                partition_id,
                generation,
            };
            let done = match shard.call(owner, op).await {
                Ok(OpReply::Purge { done }) => done,
                Err(e) if e.code == ErrorCode::UnknownPartition => true,
                Ok(other) => {
                    tracing::error!(partition_id, reply = ?other, "purge: unexpected reply");
                    false
                }
                Err(e) => {
                    tracing::debug!(partition_id, error = %e, "purge not driven this round");
                    false
                }
            };
            if done {
                self.0.remove(&partition_id);
            }
        }
    }
}
