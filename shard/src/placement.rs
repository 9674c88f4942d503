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

#[cfg(test)]
mod tests {
    use super::*;

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
