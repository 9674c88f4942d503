//! The metadata table and its deterministic state machine.
//!
//! State: the cluster's node ids (fixed at bootstrap), the topics (name ->
//! first partition id, partition count, replication factor, purge
//! generation), the next partition id to hand out (ids are never reused,
//! so a deleted topic's data can never be mistaken for a new one's) and
//! `version`, the op of the last applied batch: the table's frontier.
//!
//! [`MetaTable::apply`] takes committed batches in op order. A batch at or
//! below `version` is a no-op ([`Applied::Stale`]): a host replaying its
//! log after a restart, or after installing a snapshot, applies nothing
//! twice. A refused command (duplicate topic, bad name, ...) still
//! consumes its op: every replica refuses it identically, so the tables
//! stay equal; the refusal goes back to the submitter.
//!
//! Placement rule: the replicas of partition id `p` are the
//! `replication_factor` nodes starting at position `p mod N` of the sorted
//! node list, wrapping (round-robin; a topic's partitions have consecutive
//! ids, so its first partition starts at a per-topic offset and the rest
//! follow it around the ring). Listed in id order (replica index `i` the
//! `i`-th smallest id, view 0's primary the lowest: `placement::replicas_of`,
//! which the data partitions' groups use too). A node holding partition `p`
//! runs it on shard `p mod shard_count` ([`shard_for`]).

use std::collections::BTreeMap;

use ringlog_protocol::batch::{BatchError, BatchView};
use ringlog_protocol::wire::{valid_topic_name, PARTITIONS_MAX};

use super::command::{request_id, Command, DecodeError};

/// Node ids as the config names them.
pub type NodeId = u32;
/// Nodes in a cluster at most (a VSR group has at most 32 replicas).
pub const NODES_MAX: usize = 32;
/// Topics in the table at most: bounds the table and its snapshot.
pub const TOPICS_MAX: usize = 4096;
/// Partitions of all topics together at most: bounds the placement a host
/// computes per applied op.
pub const CLUSTER_PARTITIONS_MAX: u64 = 65_536;
/// The metadata group's own partition id: data partitions stay below it.
pub const META_PARTITION_ID: u32 = u32::MAX;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topic {
    /// Partition `i` has id `first_partition_id + i`.
    pub first_partition_id: u32,
    pub partitions: u32,
    pub replication_factor: u8,
    /// Bumped by each purge: records of older generations are gone.
    pub purge_generation: u64,
}

/// Where one partition lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub topic: String,
    pub index: u32,
    pub partition_id: u32,
    /// Its replica group, replica index order.
    pub replicas: Vec<NodeId>,
    pub purge_generation: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("topic {name:?} already exists")]
    DuplicateTopic { name: String },
    #[error("no topic {name:?}")]
    UnknownTopic { name: String },
    /// A VSR group has an odd number of replicas.
    #[error("replication factor {requested} must be odd, 1..={nodes} (the node count)")]
    ReplicationFactor { requested: u8, nodes: usize },
    #[error("partition count {requested} must be 1..={max}")]
    Partitions { requested: u32, max: u32 },
    #[error("invalid topic name {name:?} (1..=200 bytes of [A-Za-z0-9._-], not . or ..)")]
    InvalidName { name: String },
    #[error("the table holds {max} topics already")]
    TopicsFull { max: usize },
    #[error("{requested} more partitions would pass the cluster's {max} ({total} now)")]
    ClusterPartitions {
        requested: u32,
        total: u64,
        max: u64,
    },
    #[error("partition ids exhausted")]
    PartitionIdsExhausted,
    #[error("undecodable command: {0}")]
    Undecodable(DecodeError),
    /// The request id applied before (a retransmitted submission): the
    /// first outcome stands, the command does not run twice.
    #[error("request {request_id:#x} was applied before")]
    DuplicateRequest { request_id: u64 },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Created {
        name: String,
        first_partition_id: u32,
        partitions: u32,
    },
    Deleted {
        name: String,
    },
    Purged {
        name: String,
        generation: u64,
    },
}

/// What one record of an applied batch did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// None when the record's key was no request id.
    pub request_id: Option<u64>,
    pub result: Result<Change, Refusal>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// `op` is at or below the table's version: nothing changed.
    Stale { op: u64, version: u64 },
    /// `op` applied, one outcome per record.
    Done { op: u64, outcomes: Vec<Outcome> },
}

/// A batch the table cannot take: nothing changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetaError {
    #[error("op {op:?}: not a valid batch: {source}")]
    Batch { op: Option<u64>, source: BatchError },
    #[error("op {op} is past the next op {} (table at version {version})", version + 1)]
    Gap { version: u64, op: u64 },
    #[error("batch of partition {batch} given to the metadata group {group}")]
    WrongGroup { batch: u32, group: u32 },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodesError {
    #[error("{count} nodes: a cluster has 1..={NODES_MAX}")]
    Count { count: usize },
    #[error("node id {0} listed twice")]
    Duplicate(NodeId),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaTable {
    pub(super) version: u64,
    /// Sorted, unique.
    pub(super) nodes: Vec<NodeId>,
    pub(super) next_partition_id: u32,
    pub(super) topics: BTreeMap<String, Topic>,
}

/// The shard of a node's `shards` that runs partition `partition_id`.
pub fn shard_for(partition_id: u32, shards: u16) -> u16 {
    debug_assert!(shards > 0, "a node has at least one shard");
    (partition_id % u32::from(shards.max(1))) as u16
}

impl MetaTable {
    /// The empty table of a cluster of `nodes` (any order), version 0.
    pub fn new(nodes: &[NodeId]) -> Result<MetaTable, NodesError> {
        let mut sorted = nodes.to_vec();
        sorted.sort_unstable();
        if sorted.is_empty() || sorted.len() > NODES_MAX {
            return Err(NodesError::Count {
                count: sorted.len(),
            });
        }
        if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
            return Err(NodesError::Duplicate(w[0]));
        }
        Ok(MetaTable {
            version: 0,
            nodes: sorted,
            next_partition_id: 0,
            topics: BTreeMap::new(),
        })
    }

    /// The op of the last applied batch.
    pub fn version(&self) -> u64 {
        self.version
    }

    pub fn nodes(&self) -> &[NodeId] {
        &self.nodes
    }

    /// The metadata group's replicas, replica index order: the nodes in id
    /// order, less the last one of an even count (a VSR group is odd).
    pub fn group_nodes(&self) -> &[NodeId] {
        let odd = self.nodes.len() - (1 - self.nodes.len() % 2);
        debug_assert!(odd % 2 == 1 && odd <= self.nodes.len());
        &self.nodes[..odd]
    }

    pub fn topics(&self) -> &BTreeMap<String, Topic> {
        &self.topics
    }

    pub fn next_partition_id(&self) -> u32 {
        self.next_partition_id
    }

    /// Partitions of all topics together.
    pub fn partitions_total(&self) -> u64 {
        self.topics.values().map(|t| u64::from(t.partitions)).sum()
    }

    /// Whether `cmd` would apply to the table as it is now (a host's early
    /// answer; the applied outcome is the one that counts).
    pub fn check(&self, cmd: &Command) -> Result<(), Refusal> {
        let name = cmd.name();
        if !valid_topic_name(name) {
            return Err(Refusal::InvalidName { name: name.into() });
        }
        let exists = self.topics.contains_key(name);
        match cmd {
            Command::CreateTopic {
                partitions,
                replication_factor,
                ..
            } => self.check_create(name, exists, *partitions, *replication_factor),
            Command::DeleteTopic { .. } | Command::PurgeTopic { .. } if !exists => {
                Err(Refusal::UnknownTopic { name: name.into() })
            }
            Command::DeleteTopic { .. } | Command::PurgeTopic { .. } => Ok(()),
        }
    }

    fn check_create(
        &self,
        name: &str,
        exists: bool,
        partitions: u32,
        rf: u8,
    ) -> Result<(), Refusal> {
        if exists {
            return Err(Refusal::DuplicateTopic { name: name.into() });
        }
        if partitions == 0 || partitions > PARTITIONS_MAX {
            let (requested, max) = (partitions, PARTITIONS_MAX);
            return Err(Refusal::Partitions { requested, max });
        }
        if rf.is_multiple_of(2) || usize::from(rf) > self.nodes.len() {
            let nodes = self.nodes.len();
            return Err(Refusal::ReplicationFactor {
                requested: rf,
                nodes,
            });
        }
        if self.topics.len() >= TOPICS_MAX {
            return Err(Refusal::TopicsFull { max: TOPICS_MAX });
        }
        let total = self.partitions_total();
        if total + u64::from(partitions) > CLUSTER_PARTITIONS_MAX {
            let max = CLUSTER_PARTITIONS_MAX;
            return Err(Refusal::ClusterPartitions {
                requested: partitions,
                total,
                max,
            });
        }
        let end = u64::from(self.next_partition_id) + u64::from(partitions);
        if end > u64::from(META_PARTITION_ID) {
            return Err(Refusal::PartitionIdsExhausted);
        }
        Ok(())
    }

    fn execute(&mut self, cmd: Command) -> Result<Change, Refusal> {
        self.check(&cmd)?;
        let change = match cmd {
            Command::CreateTopic {
                name,
                partitions,
                replication_factor,
            } => {
                let first_partition_id = self.next_partition_id;
                // check() bounded the sum below META_PARTITION_ID.
                self.next_partition_id += partitions;
                let topic = Topic {
                    first_partition_id,
                    partitions,
                    replication_factor,
                    purge_generation: 0,
                };
                self.topics.insert(name.clone(), topic);
                Change::Created {
                    name,
                    first_partition_id,
                    partitions,
                }
            }
            Command::DeleteTopic { name } => {
                self.topics.remove(&name);
                Change::Deleted { name }
            }
            Command::PurgeTopic { name } => {
                let generation = match self.topics.get_mut(&name) {
                    Some(t) => {
                        t.purge_generation += 1;
                        t.purge_generation
                    }
                    None => return Err(Refusal::UnknownTopic { name }),
                };
                Change::Purged { name, generation }
            }
        };
        debug_assert!(self.topics.len() <= TOPICS_MAX);
        debug_assert!(self.partitions_total() <= CLUSTER_PARTITIONS_MAX);
        Ok(change)
    }

    /// Applies committed batch `batch` (its op is the header's `vsr_op`).
    /// Errors change nothing; see the module docs for the rest.
    pub fn apply(&mut self, batch: &[u8]) -> Result<Applied, MetaError> {
        self.apply_skipping(batch, |_| false)
    }

    /// [`MetaTable::apply`], refusing (as [`Refusal::DuplicateRequest`])
    /// each record whose request id `seen` says applied before. `seen`
    /// must answer from the log alone (the host's window of applied ids),
    /// so every replica refuses the same records.
    pub fn apply_skipping(
        &mut self,
        batch: &[u8],
        mut seen: impl FnMut(u64) -> bool,
    ) -> Result<Applied, MetaError> {
        let view = BatchView::parse(batch).map_err(|source| {
            let op = ringlog_protocol::BatchHeader::decode(batch)
                .ok()
                .map(|h| h.vsr_op);
            MetaError::Batch { op, source }
        })?;
        let op = view.header().vsr_op;
        if op <= self.version {
            return Ok(Applied::Stale {
                op,
                version: self.version,
            });
        }
        if op != self.version + 1 {
            return Err(MetaError::Gap {
                version: self.version,
                op,
            });
        }
        let mut outcomes = Vec::with_capacity(view.records().len());
        for record in view.records() {
            let id = request_id(record.key);
            let result = match id.clone().and_then(|_| Command::decode(record.value)) {
                Ok(_) if id.as_ref().is_ok_and(|&r| seen(r)) => Err(Refusal::DuplicateRequest {
                    request_id: id.clone().unwrap_or_default(),
                }),
                Ok(cmd) => self.execute(cmd),
                Err(e) => Err(Refusal::Undecodable(e)),
            };
            outcomes.push(Outcome {
                request_id: id.ok(),
                result,
            });
        }
        self.version = op;
        debug_assert_eq!(outcomes.len(), view.header().record_count as usize);
        Ok(Applied::Done { op, outcomes })
    }

    /// The replica group of partition `partition_id` (the rule in the
    /// module docs).
    pub fn replicas_of(&self, partition_id: u32, replication_factor: u8) -> Vec<NodeId> {
        debug_assert!(usize::from(replication_factor) <= self.nodes.len());
        crate::placement::replicas_of(&self.nodes, partition_id, replication_factor)
    }

    /// Every partition of every topic, in name then index order.
    pub fn placement(&self) -> Vec<Placement> {
        let mut out = Vec::new();
        for (name, t) in &self.topics {
            for index in 0..t.partitions {
                let partition_id = t.first_partition_id + index;
                out.push(Placement {
                    topic: name.clone(),
                    index,
                    partition_id,
                    replicas: self.replicas_of(partition_id, t.replication_factor),
                    purge_generation: t.purge_generation,
                });
            }
        }
        out
    }

    /// The partitions `node` holds a replica of, by partition id.
    pub fn placement_for(&self, node: NodeId) -> BTreeMap<u32, Placement> {
        self.placement()
            .into_iter()
            .filter(|p| p.replicas.contains(&node))
            .map(|p| (p.partition_id, p))
            .collect()
    }

    /// A checksum of the whole table (its snapshot's bytes): equal tables,
    /// equal digests.
    pub fn digest(&self) -> u64 {
        ringlog_protocol::checksum(&self.encode_snapshot())
    }
}
