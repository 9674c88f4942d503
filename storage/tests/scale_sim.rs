//! What a partition costs on the sim backend (issue 8 items 9 and 14): disk
//! grows with data, buffers and recycled files are shared per shard and
//! bounded, an idle partition holds one descriptor and no write buffer, and
//! a full disk refuses appends without fencing.

mod common;

use std::path::{Path, PathBuf};

use common::{next_batch, read_all, small_config};
use ringlog_storage::io::sim::{Faults, SimBackend};
use ringlog_storage::store::{
    flush_all, PartitionStore, PoolConfig, StoreConfig, StoreError, StorePool,
};

fn pdir(i: u32) -> PathBuf {
    PathBuf::from(format!("/p{i}"))
}

/// Bytes of every file under `prefix` (the sim's files are as long as
/// their allocation).
fn bytes_under(io: &SimBackend, prefix: &Path) -> u64 {
    io.paths()
        .iter()
        .filter(|p| p.starts_with(prefix))
        .filter_map(|p| io.read_whole(p))
        .map(|b| b.len() as u64)
        .sum()
}

fn files_under(io: &SimBackend, prefix: &Path) -> usize {
    io.paths()
        .iter()
        .filter(|p| p.starts_with(prefix) && io.read_whole(p).is_some())
        .count()
}

fn shared_pool(io: &mut SimBackend, config: &StoreConfig, idle_max: usize) -> StorePool {
    let pool = StorePool::new(
        PathBuf::from("/recycle"),
        PoolConfig {
            write_buffers_idle_max: idle_max,
            ..PoolConfig::private(config)
        },
    );
    pool.load_recycled(io).unwrap();
    pool
}

/// 1,000 partitions on one pool: each holds one descriptor and, once its
/// flush completed, no write buffer; the pool keeps at most its bound idle.
#[test]
fn idle_partitions_hold_one_descriptor_and_no_write_buffer() {
    let mut io = SimBackend::new(2);
    let config = small_config();
    let pool = shared_pool(&mut io, &config, 4);
    let mut stores: Vec<PartitionStore> = (0..1000)
        .map(|i| PartitionStore::create_in(&mut io, &pdir(i), i, config.clone(), pool.clone()))
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(
        io.open_paths().len(),
        1000,
        "one descriptor per idle partition"
    );
    for round in 0..2 {
        for store in stores.iter_mut() {
            let batch = next_batch(store, 2, 200, round);
            store.append(&mut io, &batch).unwrap();
            assert!(store.holds_write_buffer());
        }
        let mut refs: Vec<&mut PartitionStore> = stores.iter_mut().collect();
        flush_all(&mut io, &mut refs).unwrap();
        assert!(stores.iter().all(|s| !s.holds_write_buffer()));
        assert_eq!(pool.idle_write_buffers(), 4, "idle buffers capped");
        assert_eq!(io.open_paths().len(), 1000);
    }
    // Reopened: still one descriptor each, no buffer, the data intact.
    for store in stores {
        store.close(&mut io).unwrap();
    }
    assert_eq!(io.open_paths().len(), 0);
    let mut stores: Vec<PartitionStore> = (0..1000)
        .map(|i| PartitionStore::open_in(&mut io, &pdir(i), i, config.clone(), pool.clone()))
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(io.open_paths().len(), 1000);
    for store in stores.iter_mut() {
        assert!(!store.holds_write_buffer());
        assert_eq!(read_all(&mut io, store).len(), 2);
    }
}

/// Retention and purge of three partitions sharing a pool bounded at two
/// recycled files: two files are kept for reuse, the rest are unlinked, and
/// the disk in use goes down.
#[test]
fn retention_and_purge_free_space_beyond_the_shared_recycle_bound() {
    let mut io = SimBackend::new(3);
    let config = StoreConfig {
        retention_bytes: Some(64 << 10),
        ..small_config()
    };
    assert_eq!(config.recycled_files_max, 2);
    let pool = shared_pool(&mut io, &config, 2);
    let mut stores: Vec<PartitionStore> = (0..3)
        .map(|i| PartitionStore::create_in(&mut io, &pdir(i), i, config.clone(), pool.clone()))
        .collect::<Result<_, _>>()
        .unwrap();
    for seed in 0..200 {
        for store in stores.iter_mut() {
            let batch = next_batch(store, 2, 1500, seed);
            store.append(&mut io, &batch).unwrap();
            store.flush(&mut io).unwrap();
        }
    }
    let all = Path::new("/");
    let before = bytes_under(&io, all);
    let mut removed = 0;
    for store in stores.iter_mut() {
        removed += store.apply_retention(&mut io, 0).unwrap().segments_removed;
    }
    assert!(removed > 6, "retention removed {removed} segments");
    assert_eq!(pool.recycled_count(), 2);
    assert_eq!(files_under(&io, Path::new("/recycle")), 2);
    assert!(io
        .paths()
        .iter()
        .all(|p| !p.ends_with("recycle") || p.starts_with("/recycle")));
    let after = bytes_under(&io, all);
    assert!(after < before, "disk in use {before} -> {after}");
    // More data, then purge everything: what is left is each partition's
    // superblock and (at most) one segment, plus the two recycled files.
    for seed in 200..400 {
        for store in stores.iter_mut() {
            let batch = next_batch(store, 2, 1500, seed);
            store.append(&mut io, &batch).unwrap();
            store.flush(&mut io).unwrap();
        }
    }
    let after = bytes_under(&io, all);
    for store in stores.iter_mut() {
        store.purge(&mut io).unwrap();
    }
    let segment = config.segment_size_bytes;
    assert!(bytes_under(&io, all) <= 3 * (65536 + segment) + 2 * segment);
    assert_eq!(
        files_under(&io, Path::new("/recycle")),
        2,
        "purge recycles within the bound"
    );
    let purged = bytes_under(&io, all);
    assert!(purged < after, "purge frees space: {after} -> {purged}");
}

/// A full disk refuses the append with DiskFull: nothing is fenced, every
/// acknowledged batch stays readable, and the append succeeds once space is
/// back. Each append first meets a full disk; those that need space (an
/// allocation step) are refused.
#[test]
fn a_full_disk_refuses_appends_and_keeps_reads() {
    let mut io = SimBackend::new(4);
    let config = StoreConfig {
        segment_size_bytes: 256 << 10,
        ..small_config()
    };
    let mut store = PartitionStore::create(&mut io, &pdir(9), 9, config.clone()).unwrap();
    let mut acked: Vec<Vec<u8>> = Vec::new();
    let contents = |io: &mut SimBackend, store: &mut PartitionStore| -> Vec<Vec<u8>> {
        read_all(io, store).into_iter().map(|(_, b)| b).collect()
    };
    let mut refused = 0;
    let full = |io: &mut SimBackend| {
        let used = io.space_used_bytes();
        io.set_faults(Faults {
            space_bytes_max: Some(used),
            ..Faults::default()
        });
    };
    for seed in 0..400 {
        let batch = next_batch(&store, 3, 700, seed);
        full(&mut io);
        match store.append(&mut io, &batch) {
            Ok(_) => {}
            Err(StoreError::DiskFull { partition_id, .. }) => {
                assert_eq!(partition_id, 9);
                refused += 1;
                assert!(store.fenced().is_none(), "a full disk does not fence");
                assert_eq!(store.next_offset(), store.durable().next_offset);
                assert!(contents(&mut io, &mut store) == acked, "reads go on");
                // Space freed: the same append goes through.
                io.set_faults(Faults::default());
                store.append(&mut io, &batch).unwrap();
            }
            Err(e) => panic!("append {seed}: {e}"),
        }
        io.set_faults(Faults::default());
        store.flush(&mut io).unwrap();
        acked.push(batch);
    }
    assert!(store.sealed_segments().count() >= 3);
    assert!(refused >= 3, "{refused} appends refused");
    assert!(contents(&mut io, &mut store) == acked);
    store.close(&mut io).unwrap();
    let mut store = PartitionStore::open(&mut io, &pdir(9), 9, config).unwrap();
    assert!(
        contents(&mut io, &mut store) == acked,
        "the reopened log holds every acknowledged batch"
    );
}

/// An append accepted on a full disk never fails later: its space (data
/// and the segment's frontier record slots) was reserved when it was
/// accepted, so its flush succeeds with the disk still full.
#[test]
fn an_append_accepted_on_a_full_disk_flushes_without_new_space() {
    let mut io = SimBackend::new(5);
    let config = StoreConfig {
        segment_size_bytes: 256 << 10,
        ..small_config()
    };
    let mut store = PartitionStore::create(&mut io, &pdir(8), 8, config).unwrap();
    let mut acked: Vec<Vec<u8>> = Vec::new();
    let mut accepted_full = 0;
    for seed in 0..400 {
        let batch = next_batch(&store, 3, 700, seed);
        let used = io.space_used_bytes();
        io.set_faults(Faults {
            space_bytes_max: Some(used),
            ..Faults::default()
        });
        match store.append(&mut io, &batch) {
            Ok(_) => {
                accepted_full += 1;
                store
                    .flush(&mut io)
                    .unwrap_or_else(|e| panic!("flush {seed}: {e}"));
            }
            Err(StoreError::DiskFull { .. }) => {
                io.set_faults(Faults::default());
                store.append(&mut io, &batch).unwrap();
                store.flush(&mut io).unwrap();
            }
            Err(e) => panic!("append {seed}: {e}"),
        }
        io.set_faults(Faults::default());
        acked.push(batch);
    }
    assert!(accepted_full > 100, "{accepted_full} accepted while full");
    assert!(store.sealed_segments().count() >= 3);
    let got: Vec<Vec<u8>> = read_all(&mut io, &mut store)
        .into_iter()
        .map(|(_, b)| b)
        .collect();
    assert!(got == acked);
}
