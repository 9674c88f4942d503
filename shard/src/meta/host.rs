//! [`MetaHost`]: the pure driver a node runs beside its replica of the
//! metadata group. It answers two questions for the server:
//!
//! * A client's command reached this node: [`MetaHost::route`] says to
//!   submit a batch to the local replica (it is the normal primary), or
//!   answers not-primary naming the primary's node, or "no primary now"
//!   during a view change, or refuses early what the table refuses now.
//! * An op committed: [`MetaHost::apply`] applies it and lists the local
//!   partition actions it implies for this node (create, delete, purge):
//!   the diff of this node's placement before and after. The same diff
//!   follows a snapshot install ([`MetaHost::install`]).
//!
//! The metadata group's replicas are [`MetaTable::group_nodes`]: the
//! cluster's nodes in id order (less the last of an even count), replica
//! index `i` the `i`-th smallest node id. A node outside the group (the
//! last of an even count) would follow the table without a vote: not
//! built yet.

use std::collections::BTreeMap;

use crate::vsr::{Replica, Status};

use super::command::{command_batch, Command, EncodeError};
use super::snapshot::SnapshotError;
use super::table::{shard_for, Applied, MetaError, MetaTable, NodeId, Placement, Refusal};

/// What the host needs of its replica's state to route a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Role {
    pub status: Status,
    pub view: u32,
    /// This replica's index in the group.
    pub replica: u8,
    /// The index of `view`'s primary.
    pub primary: u8,
}

impl Role {
    pub fn of(replica: &Replica) -> Role {
        Role {
            status: replica.status(),
            view: replica.view(),
            replica: replica.replica(),
            primary: replica.primary_of(replica.view()),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    #[error("not the metadata primary of view {view}: node {primary} is")]
    NotPrimary { view: u32, primary: NodeId },
    #[error("the metadata group has no primary now (view {view} changing); retry")]
    NoPrimary { view: u32 },
    #[error("refused: {0}")]
    Refused(Refusal),
    #[error("encoding the command: {0}")]
    Encode(#[from] EncodeError),
}

/// One partition as this node runs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalPartition {
    pub topic: String,
    pub index: u32,
    pub partition_id: u32,
    pub shard: u16,
    pub replicas: Vec<NodeId>,
    pub purge_generation: u64,
}

/// What an applied op asks of this node's shards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LocalAction {
    Create(LocalPartition),
    Delete(LocalPartition),
    /// Drop the partition's records up to this purge generation.
    Purge(LocalPartition),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    #[error("node {node} is not in the table's nodes {nodes:?}")]
    UnknownNode { node: NodeId, nodes: Vec<NodeId> },
    #[error("a node has at least one shard")]
    NoShards,
    #[error("snapshot: {0}")]
    Snapshot(#[from] SnapshotError),
    #[error("snapshot at version {offered} is not newer than the table's {version}")]
    StaleSnapshot { offered: u64, version: u64 },
    #[error("snapshot of nodes {offered:?}, this cluster is {nodes:?}")]
    OtherCluster {
        offered: Vec<NodeId>,
        nodes: Vec<NodeId>,
    },
}

#[derive(Debug, Clone)]
pub struct MetaHost {
    node: NodeId,
    shards: u16,
    /// The metadata group's partition id (its batches carry it).
    group_partition_id: u32,
    table: MetaTable,
}

impl MetaHost {
    pub fn new(
        node: NodeId,
        shards: u16,
        group_partition_id: u32,
        table: MetaTable,
    ) -> Result<MetaHost, HostError> {
        if !table.nodes().contains(&node) {
            let nodes = table.nodes().to_vec();
            return Err(HostError::UnknownNode { node, nodes });
        }
        if shards == 0 {
            return Err(HostError::NoShards);
        }
        Ok(MetaHost {
            node,
            shards,
            group_partition_id,
            table,
        })
    }

    pub fn table(&self) -> &MetaTable {
        &self.table
    }

    pub fn node(&self) -> NodeId {
        self.node
    }

    /// The node that is replica `index` of the metadata group.
    pub fn node_of_replica(&self, index: u8) -> Option<NodeId> {
        self.table.group_nodes().get(usize::from(index)).copied()
    }

    /// What to do with command `cmd` (request `request_id`) that reached
    /// this node: Ok is the batch to step into the local replica as a
    /// `ClientAppend`.
    pub fn route(&self, request_id: u64, cmd: &Command, role: Role) -> Result<Vec<u8>, RouteError> {
        let view = role.view;
        if role.status != Status::Normal {
            return Err(RouteError::NoPrimary { view });
        }
        if role.primary != role.replica {
            let primary = self
                .node_of_replica(role.primary)
                .ok_or(RouteError::NoPrimary { view })?;
            return Err(RouteError::NotPrimary { view, primary });
        }
        self.table.check(cmd).map_err(RouteError::Refused)?;
        let batch = command_batch(self.group_partition_id, &[(request_id, cmd.clone())])?;
        Ok(batch)
    }

    /// The partitions this node holds per the current table.
    pub fn local_partitions(&self) -> BTreeMap<u32, LocalPartition> {
        local_of(&self.table, self.node, self.shards)
    }

    /// Applies committed `batch` and returns what it did, with the local
    /// actions it implies (none for a stale op or a refused command).
    pub fn apply(&mut self, batch: &[u8]) -> Result<(Applied, Vec<LocalAction>), MetaError> {
        self.apply_skipping(batch, |_| false)
    }

    /// [`MetaHost::apply`] with [`MetaTable::apply_skipping`]'s `seen`.
    pub fn apply_skipping(
        &mut self,
        batch: &[u8],
        seen: impl FnMut(u64) -> bool,
    ) -> Result<(Applied, Vec<LocalAction>), MetaError> {
        let header = ringlog_protocol::BatchHeader::decode(batch)
            .map_err(|source| MetaError::Batch { op: None, source })?;
        if header.partition_id != self.group_partition_id {
            let (batch, group) = (header.partition_id, self.group_partition_id);
            return Err(MetaError::WrongGroup { batch, group });
        }
        let before = self.local_partitions();
        let applied = self.table.apply_skipping(batch, seen)?;
        let actions = match applied {
            Applied::Stale { .. } => Vec::new(),
            Applied::Done { .. } => diff(&before, &self.local_partitions()),
        };
        Ok((applied, actions))
    }

    /// Installs a snapshot newer than the table, of this cluster's nodes;
    /// returns the local actions that take this node to its placement.
    pub fn install(&mut self, snapshot: &[u8]) -> Result<Vec<LocalAction>, HostError> {
        let table = MetaTable::decode_snapshot(snapshot)?;
        if table.nodes() != self.table.nodes() {
            let offered = table.nodes().to_vec();
            let nodes = self.table.nodes().to_vec();
            return Err(HostError::OtherCluster { offered, nodes });
        }
        if table.version() <= self.table.version() {
            let (offered, version) = (table.version(), self.table.version());
            return Err(HostError::StaleSnapshot { offered, version });
        }
        let before = self.local_partitions();
        self.table = table;
        Ok(diff(&before, &self.local_partitions()))
    }
}

fn local_of(table: &MetaTable, node: NodeId, shards: u16) -> BTreeMap<u32, LocalPartition> {
    let local = |p: Placement| LocalPartition {
        shard: shard_for(p.partition_id, shards),
        topic: p.topic,
        index: p.index,
        partition_id: p.partition_id,
        replicas: p.replicas,
        purge_generation: p.purge_generation,
    };
    table
        .placement_for(node)
        .into_iter()
        .map(|(id, p)| (id, local(p)))
        .collect()
}

/// Deletes, then purges, then creates, each in partition id order.
/// Partition ids are never reused, so an id present in both maps is the
/// same partition (only its purge generation can have moved).
pub fn diff(
    before: &BTreeMap<u32, LocalPartition>,
    after: &BTreeMap<u32, LocalPartition>,
) -> Vec<LocalAction> {
    let mut out: Vec<LocalAction> = before
        .iter()
        .filter(|(id, _)| !after.contains_key(id))
        .map(|(_, p)| LocalAction::Delete(p.clone()))
        .collect();
    for (id, p) in after {
        if let Some(old) = before.get(id) {
            debug_assert_eq!(old.replicas, p.replicas, "a partition's group never moves");
            if old.purge_generation != p.purge_generation {
                out.push(LocalAction::Purge(p.clone()));
            }
        }
    }
    out.extend(
        after
            .iter()
            .filter(|(id, _)| !before.contains_key(id))
            .map(|(_, p)| LocalAction::Create(p.clone())),
    );
    out
}
