//! The controller: topic create/delete, run on shard 0 one at a time.
//!
//! Create: write the topic as `creating` to topics.json (durable), open the
//! partitions on their owner shards, rewrite it as `ready`, publish. A crash
//! in between leaves a `creating` topic whose partitions boot creates.
//! Delete: remove it from topics.json (durable), publish, then drop the
//! partitions on their owners; directories a crash leaves behind are garbage
//! that boot removes.
//!
//! In a cluster, create and delete are commands of the metadata group
//! (see `cluster`): the topic's partition ids come from its table, and
//! each node creates or drops its partitions when the command applies.
//!
//! The file work (topics.json, the emptied topic directory) runs on the
//! meta I/O thread (`meta_io`): this task awaits it, shard 0's thread never
//! waits for a sync.

use std::time::Duration;

use ringlog_protocol::wire::{valid_topic_name, ErrorCode, PARTITIONS_MAX};

use crate::catalog::{TopicMeta, TopicState, TopicTable};
use crate::handle::ShardHandle;
use crate::meta_io::{MetaIoError, Task};
use crate::ops::{MetaOp, Op, OpError, OpReply, Outcome};
use crate::placement::shard_for;

mod cluster;

/// Attempts to reach a shard whose mailbox is full, 10 ms apart.
const MAILBOX_RETRIES: u32 = 500;

pub(crate) async fn run(shard: &impl ShardHandle, op: MetaOp) -> Outcome {
    if !shard.config().cluster_id.is_empty() {
        return cluster::run(shard, op).await;
    }
    match op {
        MetaOp::CreateTopic { topic, partitions } => create(shard, topic, partitions).await,
        MetaOp::DeleteTopic { topic } => delete(shard, topic, None).await,
        MetaOp::PurgeTopic { topic } => Err(OpError::new(
            ErrorCode::Internal,
            format!("a cluster purge of topic {topic:?} reached a single node"),
        )),
        MetaOp::Forwarded { from, .. } => Err(OpError::new(
            ErrorCode::Internal,
            format!("a metadata command forwarded by node {from} to a single node"),
        )),
    }
}

pub(crate) use cluster::apply_loop;

/// Replaces topics.json with `table` on the meta I/O thread. A full disk is
/// the retryable `disk_full`, a full queue `backpressure`.
async fn store(shard: &impl ShardHandle, table: &TopicTable) -> Result<(), OpError> {
    let task = Task::StoreTable {
        data_dir: shard.config().data_dir.clone(),
        table: table.clone(),
    };
    shard.meta_io().run(task).await.map_err(store_error)
}

fn store_error(e: MetaIoError) -> OpError {
    let code = match (&e, e.raw_os_error()) {
        (MetaIoError::Busy, _) => ErrorCode::Backpressure,
        (_, Some(libc::ENOSPC)) => ErrorCode::DiskFull,
        _ => ErrorCode::Storage,
    };
    OpError::new(code, format!("topics.json: {e}"))
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

/// Checks a create's name and partition count.
fn check_create(topic: &str, partitions: u32) -> Result<(), OpError> {
    if !valid_topic_name(topic) {
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
    Ok(())
}

/// A single node's create: ids from the local table.
async fn create(shard: &impl ShardHandle, topic: String, partitions: u32) -> Outcome {
    check_create(&topic, partitions)?;
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
    let opened = open_topic(shard, table, &topic, partitions, first, 1).await;
    if let Err(e) = opened {
        tracing::error!(%topic, error = %e, "topic creation failed; rolling back");
        let _ = delete(shard, topic, None).await;
        return Err(e);
    }
    Ok(OpReply::Empty)
}

/// Writes `topic` into `table` as `creating` (durable), opens its
/// partitions on their owners, then marks it `ready`. On an open failure
/// the topic stays `creating` and the error is returned.
async fn open_topic(
    shard: &impl ShardHandle,
    mut table: TopicTable,
    topic: &str,
    partitions: u32,
    first: u32,
    replication_factor: u8,
) -> Result<(), OpError> {
    debug_assert!(partitions > 0);
    table.topics.insert(
        topic.to_string(),
        TopicMeta {
            partitions,
            first_partition_id: first,
            state: TopicState::Creating,
            replication_factor,
        },
    );
    store(shard, &table).await?;
    // Publish the creating state too, so id allocation stays monotonic for
    // the next create even if this one fails half-way.
    shard.catalog().publish(table.clone());
    let shards = shard.shard_count();
    for index in 0..partitions {
        let owner = shard_for(topic, index, shards);
        call_retrying(shard, owner, || Op::OpenPartition {
            topic: topic.to_string(),
            index,
            partition_id: first + index,
            create: true,
        })
        .await?;
    }
    let mut table = (*shard.catalog().snapshot()).clone();
    if let Some(meta) = table.topics.get_mut(topic) {
        meta.state = TopicState::Ready;
    }
    store(shard, &table).await?;
    shard.catalog().publish(table);
    tracing::info!(%topic, partitions, replication_factor, first, "topic created");
    Ok(())
}

/// Removes `topic` from the table (durable; in a cluster recording
/// metadata op `meta_op` as applied), then drops its partitions.
async fn delete(shard: &impl ShardHandle, topic: String, meta_op: Option<u64>) -> Outcome {
    let data_dir = shard.config().data_dir.clone();
    let mut table: TopicTable = (*shard.catalog().snapshot()).clone();
    let Some(meta) = table.topics.remove(&topic) else {
        return Err(OpError::new(
            ErrorCode::UnknownTopic,
            format!("no topic {topic:?}"),
        ));
    };
    if let Some(op) = meta_op {
        table.meta_applied_op = table.meta_applied_op.max(op);
    }
    store(shard, &table).await?;
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
    if let Err(e) = shard.meta_io().run(Task::RemoveDir { path: dir }).await {
        tracing::debug!(error = %e, "topic directory not removed");
    }
    tracing::info!(%topic, "topic deleted");
    Ok(OpReply::Empty)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::catalog::CatalogError;

    fn io_failure(errno: i32) -> MetaIoError {
        MetaIoError::Catalog(CatalogError::Io {
            what: "write",
            path: PathBuf::from("/data/topics.json.tmp"),
            source: std::io::Error::from_raw_os_error(errno),
        })
    }

    /// What the ctl caller is told when topics.json cannot be replaced: a
    /// full disk and a full queue are retryable, with the cause in the text.
    #[test]
    fn a_failed_topics_json_write_reaches_the_caller_typed() {
        let full = store_error(io_failure(libc::ENOSPC));
        assert_eq!(full.code, ErrorCode::DiskFull, "{full}");
        assert!(full.to_string().contains("topics.json.tmp"), "{full}");
        let eio = store_error(io_failure(libc::EIO));
        assert_eq!(eio.code, ErrorCode::Storage, "{eio}");
        assert_eq!(store_error(MetaIoError::Busy).code, ErrorCode::Backpressure);
        assert_eq!(store_error(MetaIoError::Stopped).code, ErrorCode::Storage);
    }
}
