//! Helpers shared by the storage integration tests.
#![allow(dead_code)] // each test binary uses a different subset

use ringlog_protocol::{BatchBuilder, BatchView, Record, Stamp};
use ringlog_storage::io::IoBackend;
use ringlog_storage::store::{PartitionStore, PoolConfig, StoreConfig, StorePool};

/// A small configuration so tests cross segment rolls quickly.
pub fn small_config() -> StoreConfig {
    StoreConfig {
        segment_size_bytes: 64 * 1024,
        write_buffer_bytes: 16 * 1024,
        index_interval_bytes: 2048,
        recycled_files_max: 2,
        // Several chunks per segment, so transfers split batches across them.
        transfer_chunk_bytes: 16 * 1024,
        ..StoreConfig::default()
    }
}

/// Creates a store in `dir` whose private pool has a read cache of
/// `cache_bytes_max` (0: none, every read goes to the device).
pub fn create_cached(
    io: &mut impl IoBackend,
    dir: &std::path::Path,
    partition_id: u32,
    config: StoreConfig,
    cache_bytes_max: usize,
) -> PartitionStore {
    let pool = StorePool::new(
        dir.join("recycle"),
        PoolConfig {
            read_cache_bytes_max: cache_bytes_max,
            ..PoolConfig::private(&config)
        },
    );
    PartitionStore::create_in(io, dir, partition_id, config, pool).expect("create")
}

/// A batch continuing `store`'s log: `records` records whose values are
/// derived from `seed` and sized `value_len` bytes.
pub fn next_batch(store: &PartitionStore, records: u32, value_len: usize, seed: u64) -> Vec<u8> {
    make_batch(
        store.partition_id(),
        store.next_offset(),
        store.last_checksum(),
        records,
        value_len,
        seed,
    )
}

pub fn make_batch(
    partition_id: u32,
    base_offset: u64,
    prev_checksum: u64,
    records: u32,
    value_len: usize,
    seed: u64,
) -> Vec<u8> {
    let mut builder = BatchBuilder::new(partition_id);
    for i in 0..records {
        let value: Vec<u8> = (0..value_len)
            .map(|j| {
                (seed
                    .wrapping_mul(31)
                    .wrapping_add(u64::from(i) * 7 + j as u64)
                    % 251) as u8
            })
            .collect();
        let key = format!("k{seed}-{i}");
        builder
            .push(&Record {
                key: key.as_bytes(),
                headers: &[(b"h", b"v")],
                value: &value,
                timestamp_ms: 1_000 + seed,
            })
            .expect("record fits");
    }
    builder
        .finish(&Stamp {
            base_offset,
            vsr_op: base_offset + 1,
            vsr_view: 0,
            prev_checksum,
        })
        .expect("valid batch")
}

/// Every batch from the log start to the durable end, as (base offset, bytes).
pub fn read_all(io: &mut impl IoBackend, store: &mut PartitionStore) -> Vec<(u64, Vec<u8>)> {
    let mut out = Vec::new();
    let mut offset = store.log_start_offset();
    let end = store.durable().next_offset;
    while offset < end {
        let fetched = store.read(io, offset, 1 << 20).expect("read");
        assert!(
            fetched.next_offset > offset,
            "read made no progress at {offset}"
        );
        let mut rest = &fetched.bytes[..];
        while !rest.is_empty() {
            let view = BatchView::parse(rest).expect("read returns valid batches");
            let len = view.as_bytes().len();
            out.push((view.header().base_offset, rest[..len].to_vec()));
            rest = &rest[len..];
        }
        offset = fetched.next_offset;
    }
    out
}
