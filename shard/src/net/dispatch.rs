//! Turns a client request into shard operations: resolves topic and
//! partition through the catalog and calls the owning shard.

use ringlog_protocol::wire::{
    partition_for_key, Body, ErrorCode, Opcode, PartitionInfo, ProduceReply, ProduceTarget,
    ReplicaInfo, ReplicaList, ReplicaVsr, Reply, Request, TopicDescription, TopicSummary,
    REPLICA_ROWS_MAX, REPLICA_ROW_BYTES_MAX,
};

use crate::catalog::{TopicMeta, TopicState};
use crate::handle::ShardHandle;
use crate::ops::{ClientBatch, MetaOp, Op, OpError, OpReply, PartitionStatus};
use crate::placement::shard_for;

/// Space a fetch reply needs beside its batches.
const FETCH_REPLY_OVERHEAD_BYTES: u32 = 64;

pub(crate) async fn handle(shard: &impl ShardHandle, correlation: u32, req: Request) -> Reply {
    let opcode = req.opcode();
    match run(shard, req).await {
        Ok(body) => Reply::ok(opcode, correlation, body),
        Err(e) => Reply::error(opcode as u16, correlation, e.code, e.message),
    }
}

fn topic_meta(shard: &impl ShardHandle, topic: &str) -> Result<TopicMeta, OpError> {
    match shard.table().topics.get(topic) {
        Some(m) if m.state == TopicState::Ready => Ok(m.clone()),
        _ => Err(OpError::new(
            ErrorCode::UnknownTopic,
            format!("no topic {topic:?}"),
        )),
    }
}

fn locate(shard: &impl ShardHandle, topic: &str, partition: u32) -> Result<(usize, u32), OpError> {
    let meta = topic_meta(shard, topic)?;
    let id = meta.partition_id(partition).ok_or_else(|| {
        OpError::new(
            ErrorCode::UnknownPartition,
            format!(
                "topic {topic:?} has {} partitions, no partition {partition}",
                meta.partitions
            ),
        )
    })?;
    Ok((shard_for(topic, partition, shard.shard_count()), id))
}

/// The owning shard and partition id a produce goes to; None when the
/// topic or partition does not exist (the produce's own path says so).
pub(crate) fn produce_destination(
    shard: &impl ShardHandle,
    topic: &str,
    target: &ProduceTarget,
) -> Option<(usize, u32)> {
    let partition = match target {
        ProduceTarget::Partition(p) => *p,
        ProduceTarget::Key(key) => {
            partition_for_key(key, topic_meta(shard, topic).ok()?.partitions)
        }
    };
    locate(shard, topic, partition).ok()
}

/// A produce whose batch the connection read into its own buffer (see
/// `conn::read_batch`): answered as [`handle`] answers a Produce request.
pub(crate) async fn produce(
    shard: &impl ShardHandle,
    correlation: u32,
    topic: String,
    target: ProduceTarget,
    batch: ClientBatch,
) -> Reply {
    let result = if shard.is_stopping() {
        Err(OpError::new(
            ErrorCode::ShuttingDown,
            "server shutting down",
        ))
    } else {
        produce_op(shard, &topic, &target, batch).await
    };
    match result {
        Ok(p) => Reply::ok(Opcode::Produce, correlation, Body::Produced(p)),
        Err(e) => Reply::error(Opcode::Produce as u16, correlation, e.code, e.message),
    }
}

async fn produce_op(
    shard: &impl ShardHandle,
    topic: &str,
    target: &ProduceTarget,
    batch: ClientBatch,
) -> Result<ProduceReply, OpError> {
    let partition = match target {
        ProduceTarget::Partition(p) => *p,
        ProduceTarget::Key(key) => partition_for_key(key, topic_meta(shard, topic)?.partitions),
    };
    let (owner, partition_id) = locate(shard, topic, partition)?;
    let op = Op::Produce {
        partition_id,
        batch,
    };
    match shard.call(owner, op).await? {
        OpReply::Produced(p) => Ok(p),
        r => Err(unexpected(r)),
    }
}

fn unexpected(r: OpReply) -> OpError {
    OpError::new(ErrorCode::Internal, format!("unexpected reply {r:?}"))
}

async fn run(shard: &impl ShardHandle, req: Request) -> Result<Body, OpError> {
    if shard.is_stopping() {
        return Err(OpError::new(
            ErrorCode::ShuttingDown,
            "server shutting down",
        ));
    }
    match req {
        Request::Hello { .. } => Err(OpError::new(ErrorCode::Malformed, "repeated Hello")),
        Request::CreateTopic { topic, partitions } => {
            match shard
                .call(0, Op::Meta(MetaOp::CreateTopic { topic, partitions }))
                .await?
            {
                OpReply::Empty => Ok(Body::Empty),
                r => Err(unexpected(r)),
            }
        }
        Request::DeleteTopic { topic } => {
            match shard
                .call(0, Op::Meta(MetaOp::DeleteTopic { topic }))
                .await?
            {
                OpReply::Empty => Ok(Body::Empty),
                r => Err(unexpected(r)),
            }
        }
        Request::ListTopics => Ok(Body::Topics(
            shard
                .table()
                .topics
                .iter()
                .filter(|(_, m)| m.state == TopicState::Ready)
                .map(|(name, m)| TopicSummary {
                    topic: name.clone(),
                    partitions: m.partitions,
                })
                .collect(),
        )),
        Request::DescribeTopic { topic } => {
            let meta = topic_meta(shard, &topic)?;
            let shards = shard.shard_count();
            let mut by_owner: Vec<Vec<u32>> = vec![Vec::new(); shards];
            for index in 0..meta.partitions {
                by_owner[shard_for(&topic, index, shards)].push(meta.first_partition_id + index);
            }
            let mut partitions = Vec::with_capacity(meta.partitions as usize);
            for (owner, ids) in by_owner.into_iter().enumerate() {
                if ids.is_empty() {
                    continue;
                }
                match shard
                    .call(
                        owner,
                        Op::Describe {
                            partition_ids: Some(ids),
                        },
                    )
                    .await?
                {
                    OpReply::Partitions(list) => {
                        partitions.extend(list.into_iter().map(|p| PartitionInfo {
                            partition: p.partition,
                            partition_id: p.partition_id,
                            shard: p.shard as u16,
                            log_start_offset: p.log_start_offset,
                            high_watermark: p.commit,
                            size_bytes: p.size_bytes,
                            fenced: p.fault.is_some(),
                        }))
                    }
                    r => return Err(unexpected(r)),
                }
            }
            partitions.sort_by_key(|p| p.partition);
            Ok(Body::Topic(TopicDescription { topic, partitions }))
        }
        Request::Produce {
            topic,
            target,
            batch,
        } => produce_op(shard, &topic, &target, batch.into())
            .await
            .map(Body::Produced),
        Request::Fetch {
            topic,
            partition,
            offset,
            max_bytes,
            wait_ms,
        } => {
            let (owner, partition_id) = locate(shard, &topic, partition)?;
            let cap = shard
                .config()
                .frame_bytes_max
                .saturating_sub(FETCH_REPLY_OVERHEAD_BYTES);
            let op = Op::Fetch {
                partition_id,
                offset,
                max_bytes: max_bytes.min(cap),
                wait_ms: wait_ms.min(shard.config().fetch_wait_ms_max),
            };
            match shard.call(owner, op).await? {
                OpReply::Fetched(f) => Ok(Body::Fetched(f)),
                r => Err(unexpected(r)),
            }
        }
        Request::Purge { topic, partition } => {
            let (owner, partition_id) = locate(shard, &topic, partition)?;
            match shard.call(owner, Op::Purge { partition_id }).await? {
                OpReply::Empty => Ok(Body::Empty),
                r => Err(unexpected(r)),
            }
        }
        Request::Replicas => replicas(shard).await.map(Body::Replicas),
    }
}

/// Every partition of every shard, by topic and index, as many as fit
/// the reply's frame (and [`REPLICA_ROWS_MAX`]); the rest are counted.
async fn replicas(shard: &impl ShardHandle) -> Result<ReplicaList, OpError> {
    let mut all = Vec::new();
    for owner in 0..shard.shard_count() {
        match shard
            .call(
                owner,
                Op::Describe {
                    partition_ids: None,
                },
            )
            .await?
        {
            OpReply::Partitions(list) => all.extend(list),
            r => return Err(unexpected(r)),
        }
    }
    all.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
    let omitted = keep_what_fits(&mut all, shard.config().frame_bytes_max);
    Ok(ReplicaList {
        rows: all.into_iter().map(replica_info).collect(),
        omitted,
    })
}

/// Cuts `rows` to what a Replicas reply holds within a frame of
/// `frame_bytes_max` (each row at most [`REPLICA_ROW_BYTES_MAX`]) and
/// [`REPLICA_ROWS_MAX`]; returns how many it cut.
fn keep_what_fits<T>(rows: &mut Vec<T>, frame_bytes_max: u32) -> u32 {
    let fit = (frame_bytes_max as usize).saturating_sub(64) / REPLICA_ROW_BYTES_MAX;
    let rows_max = fit.min(REPLICA_ROWS_MAX as usize);
    let omitted = u32::try_from(rows.len().saturating_sub(rows_max)).unwrap_or(u32::MAX);
    rows.truncate(rows_max);
    debug_assert!(
        rows.len() * REPLICA_ROW_BYTES_MAX <= (frame_bytes_max as usize).saturating_sub(64)
    );
    omitted
}

fn replica_info(p: PartitionStatus) -> ReplicaInfo {
    let vsr = match (p.view, p.op, p.commit_op, p.lag_ops) {
        (Some(view), Some(op), Some(commit_op), Some(lag_ops)) => Some(ReplicaVsr {
            view,
            op,
            commit_op,
            commit_max: commit_op.saturating_add(lag_ops),
        }),
        _ => None,
    };
    ReplicaInfo {
        topic: p.topic,
        partition: p.partition,
        partition_id: p.partition_id,
        shard: u16::try_from(p.shard).unwrap_or(u16::MAX),
        role: p.role.to_string(),
        log_start_offset: p.log_start_offset,
        frontier: p.frontier,
        commit: p.commit,
        size_bytes: p.size_bytes,
        sealed_segments: u32::try_from(p.sealed_segments).unwrap_or(u32::MAX),
        purge_generation: p.purge_generation,
        fault: p.fault,
        vsr,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replicas_reply_keeps_what_its_frame_and_the_row_cap_hold_and_counts_the_rest() {
        // A 1 MiB frame holds fewer rows than the cap.
        let small = 1 << 20;
        let fit = (small as usize - 64) / REPLICA_ROW_BYTES_MAX;
        let mut rows: Vec<u32> = (0..5000).collect();
        let omitted = keep_what_fits(&mut rows, small);
        assert_eq!(rows.len(), fit);
        assert_eq!(omitted as usize, 5000 - fit);
        assert_eq!(
            rows.last(),
            Some(&(fit as u32 - 1)),
            "the first rows are kept"
        );
        // The largest frame: the row cap binds.
        let mut rows: Vec<u32> = (0..REPLICA_ROWS_MAX + 7).collect();
        let omitted = keep_what_fits(&mut rows, ringlog_protocol::wire::FRAME_BYTES_MAX);
        assert_eq!(rows.len(), REPLICA_ROWS_MAX as usize);
        assert_eq!(omitted, 7);
        // Under both bounds nothing is cut.
        let mut rows = vec![1, 2, 3];
        assert_eq!(keep_what_fits(&mut rows, small), 0);
        assert_eq!(rows, vec![1, 2, 3]);
    }
}
