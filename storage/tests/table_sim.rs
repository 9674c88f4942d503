//! The segment table has no fixed cap: a partition grows past what one
//! superblock copy could list, and snapshots (each sealing the active
//! segment) consume nothing bounded.

mod common;

use std::path::Path;

use common::{next_batch, read_all, small_config};
use ringlog_storage::io::sim::SimBackend;
use ringlog_storage::store::{PartitionStore, StoreConfig};

const DIR: &str = "/p5";
const PID: u32 = 5;

/// 8 KiB segments: two ~3 KiB batches each, so every other append rolls.
fn tiny_segments() -> StoreConfig {
    StoreConfig {
        segment_size_bytes: 8 * 1024,
        write_buffer_bytes: 8 * 1024,
        index_interval_bytes: 2048,
        transfer_chunk_bytes: 4096,
        recycled_files_max: 2,
        ..StoreConfig::default()
    }
}

fn append_acked(
    io: &mut SimBackend,
    store: &mut PartitionStore,
    value_len: usize,
    seed: u64,
    all: &mut Vec<(u64, Vec<u8>)>,
) {
    let batch = next_batch(store, 1, value_len, seed);
    let appended = store.append(io, &batch).unwrap();
    store.flush(io).unwrap();
    all.push((appended.base_offset, batch));
}

#[test]
fn rolls_past_338_segments_and_reopens_with_all_data() {
    let mut io = SimBackend::new(3);
    let config = tiny_segments();
    let mut store = PartitionStore::create(&mut io, Path::new(DIR), PID, config.clone()).unwrap();
    let mut all = Vec::new();
    for seed in 0..1_000 {
        append_acked(&mut io, &mut store, 3_000, seed, &mut all);
    }
    let sealed = store.sealed_segments().count();
    assert!(sealed > 338, "only {sealed} segments sealed");
    assert_eq!(read_all(&mut io, &mut store), all);

    // Clean reopen, then a crash reopen: the whole log comes back each time.
    store.close(&mut io).unwrap();
    let mut store = PartitionStore::open(&mut io, Path::new(DIR), PID, config.clone()).unwrap();
    assert_eq!(store.sealed_segments().count(), sealed);
    assert_eq!(read_all(&mut io, &mut store), all);
    for seed in 1_000..1_100 {
        append_acked(&mut io, &mut store, 3_000, seed, &mut all);
    }
    drop(store);
    let mut io = io.reboot();
    let mut store = PartitionStore::open(&mut io, Path::new(DIR), PID, config).unwrap();
    assert!(store.sealed_segments().count() > sealed);
    assert_eq!(read_all(&mut io, &mut store), all);
}

#[test]
fn a_thousand_snapshots_in_a_row_then_appends_and_reopen() {
    let mut io = SimBackend::new(4);
    let config = small_config();
    let mut store = PartitionStore::create(&mut io, Path::new(DIR), PID, config.clone()).unwrap();
    let mut all = Vec::new();
    for i in 0..1_000u64 {
        // Each snapshot seals the tiny active segment the append started.
        append_acked(&mut io, &mut store, 50, i, &mut all);
        let manifest = store.open_snapshot(&mut io, i).unwrap();
        assert_eq!(manifest.next_offset, store.durable().next_offset);
        store.release_snapshot(manifest.snapshot_id);
    }
    assert_eq!(store.sealed_segments().count(), 1_000);
    for seed in 1_000..1_200 {
        append_acked(&mut io, &mut store, 2_000, seed, &mut all);
    }
    assert_eq!(read_all(&mut io, &mut store), all);
    drop(store);
    let mut io = io.reboot();
    let mut store = PartitionStore::open(&mut io, Path::new(DIR), PID, config).unwrap();
    assert_eq!(read_all(&mut io, &mut store), all);
    append_acked(&mut io, &mut store, 100, 5_000, &mut all);
    assert_eq!(read_all(&mut io, &mut store), all);
}
