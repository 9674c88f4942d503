//! The table's snapshot: what a replica of the metadata group installs by
//! state transfer, and what a host may keep on disk to restart from.
//!
//! Layout (little-endian): a header `magic u32 | format u16 | reserved u16
//! | body_len u32 | body_checksum u64` then the body `version u64 |
//! next_partition_id u32 | node_count u8 | node ids u32.. | topic_count
//! u32 | topics..`, each topic `name_len u16 | name | first_partition_id
//! u32 | partitions u32 | replication_factor u8 | purge_generation u64`,
//! in name order. `body_len` is checked against [`SNAPSHOT_BYTES_MAX`]
//! and the bytes present, and the checksum verified, before the body is
//! parsed; every count is checked against its cap before anything is
//! allocated for it. Decoding also checks what apply keeps true (names
//! valid and ascending, nodes ascending, partition ids below the next one
//! and disjoint, replication factors within the node count), so an
//! installed table is one apply could have built.

use std::collections::BTreeMap;

use ringlog_protocol::wire::{valid_topic_name, PARTITIONS_MAX, TOPIC_NAME_BYTES_MAX};

use super::codec::{get_name, put_name, Cursor, NameError, Short};
use super::table::{MetaTable, Topic, CLUSTER_PARTITIONS_MAX, NODES_MAX, TOPICS_MAX};

/// "RLMT" as little-endian bytes.
pub const SNAPSHOT_MAGIC: u32 = 0x544D_4C52;
pub const SNAPSHOT_FORMAT: u16 = 1;
const HEADER_BYTES: usize = 4 + 2 + 2 + 4 + 8;
const TOPIC_FIXED_BYTES: usize = 2 + 4 + 4 + 1 + 8;
/// The largest snapshot a full table makes.
pub const SNAPSHOT_BYTES_MAX: usize = HEADER_BYTES
    + 8
    + 4
    + 1
    + 4 * NODES_MAX
    + 4
    + TOPICS_MAX * (TOPIC_FIXED_BYTES + TOPIC_NAME_BYTES_MAX);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotError {
    #[error("snapshot truncated reading {}: {} bytes needed, {} left", .0.field, .0.needed, .0.available)]
    Truncated(Short),
    #[error("not a metadata snapshot (magic {0:#x})")]
    Magic(u32),
    #[error("snapshot format {0} is not {SNAPSHOT_FORMAT}")]
    Format(u16),
    #[error("snapshot body of {body_len} bytes: over {SNAPSHOT_BYTES_MAX} or not the {available} present")]
    Length { body_len: usize, available: usize },
    #[error("snapshot checksum {actual:#x}, header says {expected:#x}")]
    Checksum { expected: u64, actual: u64 },
    #[error("snapshot invalid: {0}")]
    Invalid(String),
}

impl From<Short> for SnapshotError {
    fn from(s: Short) -> Self {
        SnapshotError::Truncated(s)
    }
}

fn invalid(detail: String) -> SnapshotError {
    SnapshotError::Invalid(detail)
}

impl MetaTable {
    pub fn encode_snapshot(&self) -> Vec<u8> {
        let mut body = Vec::new();
        body.extend_from_slice(&self.version.to_le_bytes());
        body.extend_from_slice(&self.next_partition_id.to_le_bytes());
        body.push(self.nodes.len() as u8); // at most NODES_MAX
        for n in &self.nodes {
            body.extend_from_slice(&n.to_le_bytes());
        }
        body.extend_from_slice(&(self.topics.len() as u32).to_le_bytes());
        for (name, t) in &self.topics {
            put_name(&mut body, name);
            body.extend_from_slice(&t.first_partition_id.to_le_bytes());
            body.extend_from_slice(&t.partitions.to_le_bytes());
            body.push(t.replication_factor);
            body.extend_from_slice(&t.purge_generation.to_le_bytes());
        }
        let mut out = Vec::with_capacity(HEADER_BYTES + body.len());
        out.extend_from_slice(&SNAPSHOT_MAGIC.to_le_bytes());
        out.extend_from_slice(&SNAPSHOT_FORMAT.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(&(body.len() as u32).to_le_bytes());
        out.extend_from_slice(&ringlog_protocol::checksum(&body).to_le_bytes());
        out.extend_from_slice(&body);
        debug_assert!(out.len() <= SNAPSHOT_BYTES_MAX);
        out
    }

    pub fn decode_snapshot(bytes: &[u8]) -> Result<MetaTable, SnapshotError> {
        let mut c = Cursor::new(bytes);
        let magic = c.u32("magic")?;
        if magic != SNAPSHOT_MAGIC {
            return Err(SnapshotError::Magic(magic));
        }
        let format = c.u16("format")?;
        if format != SNAPSHOT_FORMAT {
            return Err(SnapshotError::Format(format));
        }
        let reserved = c.u16("reserved")?;
        if reserved != 0 {
            return Err(invalid(format!("reserved field {reserved:#x}")));
        }
        let body_len = c.u32("body length")? as usize;
        let expected = c.u64("checksum")?;
        let available = c.remaining();
        if body_len > SNAPSHOT_BYTES_MAX || body_len != available {
            return Err(SnapshotError::Length {
                body_len,
                available,
            });
        }
        let body = c.take("body", body_len)?;
        let actual = ringlog_protocol::checksum(body);
        if actual != expected {
            return Err(SnapshotError::Checksum { expected, actual });
        }
        decode_body(&mut Cursor::new(body))
    }
}

fn decode_body(c: &mut Cursor<'_>) -> Result<MetaTable, SnapshotError> {
    let version = c.u64("version")?;
    let next_partition_id = c.u32("next partition id")?;
    let node_count = usize::from(c.u8("node count")?);
    if node_count == 0 || node_count > NODES_MAX {
        return Err(invalid(format!("{node_count} nodes")));
    }
    let mut nodes = Vec::with_capacity(node_count);
    for _ in 0..node_count {
        nodes.push(c.u32("node id")?);
    }
    if nodes.windows(2).any(|w| w[0] >= w[1]) {
        return Err(invalid(format!("nodes {nodes:?} not ascending")));
    }
    let topic_count = c.u32("topic count")? as usize;
    if topic_count > TOPICS_MAX || topic_count * TOPIC_FIXED_BYTES > c.remaining() {
        return Err(invalid(format!("{topic_count} topics")));
    }
    let mut topics: BTreeMap<String, Topic> = BTreeMap::new();
    let mut ids_end = 0u64;
    for _ in 0..topic_count {
        let (name, t) = decode_topic(c, node_count)?;
        if topics
            .last_key_value()
            .is_some_and(|(last, _)| *last >= name)
        {
            return Err(invalid(format!("topic {name:?} out of order")));
        }
        // Name order is not id order; ids only grow, so sort-free check:
        // every range is below next_partition_id and ranges are disjoint.
        ids_end = ids_end.max(u64::from(t.first_partition_id) + u64::from(t.partitions));
        topics.insert(name, t);
    }
    if ids_end > u64::from(next_partition_id) || !disjoint(&topics) {
        return Err(invalid("partition ids overlap or pass the next id".into()));
    }
    if c.remaining() != 0 {
        return Err(invalid(format!("{} bytes after the topics", c.remaining())));
    }
    let table = MetaTable {
        version,
        nodes,
        next_partition_id,
        topics,
    };
    if table.partitions_total() > CLUSTER_PARTITIONS_MAX {
        return Err(invalid(format!("{} partitions", table.partitions_total())));
    }
    Ok(table)
}

fn decode_topic(c: &mut Cursor<'_>, nodes: usize) -> Result<(String, Topic), SnapshotError> {
    let name = get_name(c, TOPIC_NAME_BYTES_MAX).map_err(|e| match e {
        NameError::Short(s) => SnapshotError::Truncated(s),
        other => invalid(format!("topic name: {other:?}")),
    })?;
    if !valid_topic_name(name) {
        return Err(invalid(format!("topic name {name:?}")));
    }
    let t = Topic {
        first_partition_id: c.u32("first partition id")?,
        partitions: c.u32("partitions")?,
        replication_factor: c.u8("replication factor")?,
        purge_generation: c.u64("purge generation")?,
    };
    let rf = usize::from(t.replication_factor);
    if t.partitions == 0 || t.partitions > PARTITIONS_MAX || rf.is_multiple_of(2) || rf > nodes {
        return Err(invalid(format!("topic {name:?}: {t:?}")));
    }
    Ok((name.to_string(), t))
}

/// Whether the topics' partition id ranges are pairwise disjoint.
fn disjoint(topics: &BTreeMap<String, Topic>) -> bool {
    let mut ranges: Vec<(u32, u32)> = topics
        .values()
        .map(|t| (t.first_partition_id, t.partitions))
        .collect();
    ranges.sort_unstable();
    ranges
        .windows(2)
        .all(|w| u64::from(w[0].0) + u64::from(w[0].1) <= u64::from(w[1].0))
}
