//! Cluster metadata (topics, partitions, placement) as its own VSR group
//! (DESIGN.md section 6): the same pure replica as a partition, whose log's
//! batches carry metadata commands, with a small table as its state
//! machine. Pure: no clock, socket, thread, filesystem or hash-map order.
//!
//! * [`command`]: CreateTopic, DeleteTopic, PurgeTopic, each the value of
//!   one record (key: the submitter's request id), versioned and
//!   length-checked before allocation.
//! * [`table`]: the table, [`MetaTable::apply`] of committed batches
//!   (deterministic, idempotent by op number), typed refusals, and the
//!   placement rule (which nodes hold each partition, on which shard).
//! * [`snapshot`]: the table's checksummed snapshot; its version (the last
//!   applied op) is its frontier.
//! * [`host`]: [`MetaHost`], what a node does with a command (submit if
//!   primary, else name the primary) and with an applied op (the local
//!   partition creates, deletes and purges it implies).
//!
//! The simulator runs a metadata group under faults (`sim::run_meta`).

mod codec;
pub mod command;
pub mod host;
pub mod snapshot;
pub mod table;

#[cfg(test)]
mod tests;

pub use command::{command_batch, Command, DecodeError, EncodeError};
pub use host::{diff, HostError, LocalAction, LocalPartition, MetaHost, Role, RouteError};
pub use snapshot::{SnapshotError, SNAPSHOT_BYTES_MAX};
pub use table::{
    shard_for, Applied, Change, MetaError, MetaTable, NodeId, NodesError, Outcome, Placement,
    Refusal, Topic, CLUSTER_PARTITIONS_MAX, META_PARTITION_ID, NODES_MAX, TOPICS_MAX,
};
