//! Which shard owns a partition: a stable hash of the topic plus the
//! partition index, modulo the shard count. Consecutive partitions of a topic
//! land on consecutive shards, so a topic spreads evenly. Placement is not
//! persisted: a restart with a different shard count just moves partitions
//! between threads of the same node (the files do not move).

/// The shard that owns partition `index` of `topic`.
pub fn shard_for(topic: &str, index: u32, shards: usize) -> usize {
    if shards <= 1 {
        return 0;
    }
    let h = ringlog_protocol::checksum(topic.as_bytes());
    (h.wrapping_add(u64::from(index)) % shards as u64) as usize
}

/// The replica group of partition `partition_id` with `replication_factor`
/// replicas among `nodes` (the cluster's node ids, ascending): the
/// `replication_factor` nodes from position `partition_id mod N`, wrapping,
/// listed in id order, so replica index `i` is the `i`-th smallest id of the
/// group and view 0's primary its lowest (every node, in id order, when the
/// factor is the node count). Empty when the factor is 0 or above N.
pub fn replicas_of(nodes: &[u32], partition_id: u32, replication_factor: u8) -> Vec<u32> {
    debug_assert!(nodes.windows(2).all(|w| w[0] < w[1]), "ascending ids");
    let (n, rf) = (nodes.len(), usize::from(replication_factor));
    if rf == 0 || rf > n {
        return Vec::new();
    }
    let start = partition_id as usize % n;
    let mut group: Vec<u32> = (0..rf).map(|j| nodes[(start + j) % n]).collect();
    group.sort_unstable();
    debug_assert_eq!(group.len(), rf);
    group
}

/// The id of one partition's replica group, stamped in every replication
/// message's envelope (its `cluster_id` field): a frame is stepped only by
/// a replica whose group id matches, so nodes that disagree about a
/// partition (another cluster, another topic on the same id, another
/// partition index or replica count) never mix their logs; the mismatch is
/// dropped and counted at the first frame.
pub fn group_id(cluster_id: &str, topic: &str, index: u32, replicas: u8) -> u128 {
    let mut h = blake3::Hasher::new_derive_key("ringlog 2026 replica group id v1");
    for part in [cluster_id.as_bytes(), topic.as_bytes()] {
        h.update(&(part.len() as u64).to_le_bytes());
        h.update(part);
    }
    h.update(&index.to_le_bytes());
    h.update(&[replicas]);
    let mut first16 = [0u8; 16];
    first16.copy_from_slice(&h.finalize().as_bytes()[..16]);
    u128::from_le_bytes(first16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_ids_differ_in_every_field() {
        let base = group_id("c", "t", 0, 3);
        assert_eq!(base, group_id("c", "t", 0, 3));
        for other in [
            group_id("d", "t", 0, 3),
            group_id("c", "u", 0, 3),
            group_id("c", "t", 1, 3),
            group_id("c", "t", 0, 5),
            // Length-prefixed: moving a byte between fields changes it.
            group_id("ct", "", 0, 3),
        ] {
            assert_ne!(base, other);
        }
    }

    #[test]
    fn replica_groups_start_at_the_partition_id_and_list_ids_in_order() {
        let nodes = [10, 20, 30, 40, 50];
        assert_eq!(replicas_of(&nodes, 0, 3), [10, 20, 30]);
        assert_eq!(replicas_of(&nodes, 3, 3), [10, 40, 50]);
        assert_eq!(replicas_of(&nodes, 9, 1), [50]);
        // Every node, in id order, for any partition at the node count.
        for p in 0..7 {
            assert_eq!(replicas_of(&nodes, p, 5), nodes);
        }
        assert!(replicas_of(&nodes, 1, 6).is_empty());
        assert!(replicas_of(&nodes, 1, 0).is_empty());
    }

    #[test]
    fn stable_and_spread() {
        assert_eq!(shard_for("t", 3, 1), 0);
        assert_eq!(shard_for("orders", 5, 4), shard_for("orders", 5, 4));
        let shards: std::collections::HashSet<usize> =
            (0..4).map(|i| shard_for("orders", i, 4)).collect();
        assert_eq!(
            shards.len(),
            4,
            "a topic with S partitions covers all S shards"
        );
        assert!((0..100).all(|i| shard_for("x", i, 3) < 3));
    }
}
