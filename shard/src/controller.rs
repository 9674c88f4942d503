//! The controller: topic create/delete, run on shard 0 one at a time.
//!
//! Create: write the topic as `creating` to topics.json (durable), open the
//! partitions on their owner shards, rewrite it as `ready`, publish. A crash
//! in between leaves a `creating` topic whose partitions boot creates.
//! Delete: remove it from topics.json (durable), publish, then drop the
//! partitions on their owners; directories a crash leaves behind are garbage
//! that boot removes.

use std::time::Duration;

use ringlog_protocol::wire::{valid_topic_name, ErrorCode, PARTITIONS_MAX};

use crate::catalog::{TopicMeta, TopicState, TopicTable};
use crate::handle::ShardHandle;
use crate::ops::{MetaOp, Op, OpError, OpReply, Outcome};
use crate::placement::shard_for;

/// Attempts to reach a shard whose mailbox is full, 10 ms apart.
const MAILBOX_RETRIES: u32 = 500;

pub(crate) async fn run(shard: &impl ShardHandle, op: MetaOp) -> Outcome {
    match op {
        MetaOp::CreateTopic { topic, partitions } => create(shard, topic, partitions).await,
        MetaOp::DeleteTopic { topic } => delete(shard, topic).await,
    }
}

fn storage(e: impl std::fmt::Display) -> OpError {
    OpError::new(ErrorCode::Storage, format!("topics.json: {e}"))
}

/// `call` with bounded retries while the owner's mailbox is full.
async fn call_retrying(
    shard: &impl ShardHandle,
    owner: usize,
    mut make: impl FnMut() -> Op,
) -> Outcome {
    let mut tries = 0;
    loop {
        match shard.call(owner, make()).await {
            Err(e) if e.code == ErrorCode::Backpressure && tries < MAILBOX_RETRIES => {
                tries += 1;
                monoio::time::sleep(Duration::from_millis(10)).await;
            }
            other => return other,
        }
    }
}

async fn create(shard: &impl ShardHandle, topic: String, partitions: u32) -> Outcome {
    if !valid_topic_name(&topic) {
        return Err(OpError::new(
            ErrorCode::InvalidTopic,
            format!("invalid topic name {topic:?}: use 1-200 of [A-Za-z0-9._-]"),
        ));
    }
    if partitions == 0 || partitions > PARTITIONS_MAX {
        return Err(OpError::new(
            ErrorCode::InvalidTopic,
            format!("partition count {partitions} must be 1..={PARTITIONS_MAX}"),
        ));
    }
    let data_dir = shard.config().data_dir.clone();
    let mut table = (*shard.catalog().snapshot()).clone();
    if table.topics.contains_key(&topic) {
        return Err(OpError::new(
            ErrorCode::TopicExists,
            format!("topic {topic:?} exists"),
        ));
    }
    let first = table.next_partition_id;
    let Some(next) = first.checked_add(partitions) else {
        return Err(OpError::new(ErrorCode::Internal, "partition ids exhausted"));
    };
    table.next_partition_id = next;
    table.topics.insert(
        topic.clone(),
        TopicMeta {
            partitions,
            first_partition_id: first,
            state: TopicState::Creating,
        },
    );
    table.store(&data_dir).map_err(storage)?;
    // Publish the creating state too, so id allocation stays monotonic for
    // the next create even if this one fails half-way.
    shard.catalog().publish(table.clone());
    let shards = shard.shard_count();
    let mut failure = None;
    for index in 0..partitions {
        let owner = shard_for(&topic, index, shards);
        let outcome = call_retrying(shard, owner, || Op::OpenPartition {
            topic: topic.clone(),
            index,
            partition_id: first + index,
            create: true,
        })
        .await;
        if let Err(e) = outcome {
            failure = Some(e);
            break;
        }
    }
    if let Some(e) = failure {
        tracing::error!(%topic, error = %e, "topic creation failed; rolling back");
        let _ = delete(shard, topic).await;
        return Err(e);
    }
    let mut table = (*shard.catalog().snapshot()).clone();
    if let Some(meta) = table.topics.get_mut(&topic) {
        meta.state = TopicState::Ready;
    }
    table.store(&data_dir).map_err(storage)?;
    shard.catalog().publish(table);
    tracing::info!(%topic, partitions, "topic created");
    Ok(OpReply::Empty)
}

async fn delete(shard: &impl ShardHandle, topic: String) -> Outcome {
    let data_dir = shard.config().data_dir.clone();
    let mut table: TopicTable = (*shard.catalog().snapshot()).clone();
    let Some(meta) = table.topics.remove(&topic) else {
        return Err(OpError::new(
            ErrorCode::UnknownTopic,
            format!("no topic {topic:?}"),
        ));
    };
    table.store(&data_dir).map_err(storage)?;
    shard.catalog().publish(table);
    let shards = shard.shard_count();
    for index in 0..meta.partitions {
        let owner = shard_for(&topic, index, shards);
        let id = meta.first_partition_id + index;
        if let Err(e) = call_retrying(shard, owner, || Op::DropPartition { partition_id: id }).await
        {
            tracing::warn!(%topic, index, error = %e, "dropping partition failed; boot removes it");
        }
    }
    let dir = data_dir.join(crate::catalog::TOPICS_DIR).join(&topic);
    if let Err(e) = std::fs::remove_dir(&dir) {
        tracing::debug!(dir = %dir.display(), error = %e, "topic directory not removed");
    }
    tracing::info!(%topic, "topic deleted");
    Ok(OpReply::Empty)
}
