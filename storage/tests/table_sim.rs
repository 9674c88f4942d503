//! The segment table has no fixed cap: a partition grows past what one
//! superblock copy could list; and a snapshot consumes nothing bounded (it
//! serves the active segment in place instead of sealing it).

mod common;

use std::path::Path;

use common::{next_batch, read_all, small_config};
use ringlog_protocol::manifest::{Manifest, ManifestLimits};
use ringlog_storage::io::sim::SimBackend;
use ringlog_storage::io::IoBackend;
use ringlog_storage::store::{
    InstallBudget, PartitionStore, StoreConfig, StoreError, TransferError,
};

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
        // Before the fix each snapshot sealed the tiny active segment.
        append_acked(&mut io, &mut store, 50, i, &mut all);
        let manifest = store.open_snapshot(&mut io, i).unwrap();
        assert_eq!(manifest.next_offset, store.durable().next_offset);
        store.release_snapshot(manifest.snapshot_id);
    }
    // A snapshot serves the active segment's durable prefix in place: the
    // segments are the ones the bytes fill, not one per snapshot.
    let bytes: u64 = all.iter().map(|(_, b)| b.len() as u64).sum();
    let sealed = store.sealed_segments().count() as u64;
    assert!(
        sealed <= bytes / config.segment_size_bytes + 1,
        "{sealed} segments sealed for {bytes} bytes"
    );
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

#[test]
fn a_snapshot_of_the_active_segment_reads_and_installs_after_it_rolls() {
    let mut io = SimBackend::new(6);
    let config = small_config();
    let mut src = PartitionStore::create(&mut io, Path::new("/src"), PID, config.clone()).unwrap();
    let mut all = Vec::new();
    for seed in 0..30 {
        append_acked(&mut io, &mut src, 3_000, seed, &mut all);
    }
    let manifest = src.open_snapshot(&mut io, 10).unwrap();
    let sealed = src.sealed_segments().count();
    assert_eq!(manifest.artifacts.len(), sealed + 1, "the active prefix");
    let snapshot_end = manifest.next_offset;
    // Appends go on and roll the served segment; it still reads as offered.
    for seed in 30..80 {
        append_acked(&mut io, &mut src, 3_000, seed, &mut all);
    }
    assert!(src.sealed_segments().count() > sealed + 1);
    let mut chunks = Vec::new();
    for (a, artifact) in manifest.artifacts.iter().enumerate() {
        for c in 0..artifact.chunk_checksums.len() as u32 {
            let buf = src
                .read_chunk(&mut io, manifest.snapshot_id, a as u32, c, 20)
                .unwrap();
            chunks.push((a as u32, c, buf.to_vec()));
        }
    }
    src.release_snapshot(manifest.snapshot_id);

    let offer = Manifest::decode(&manifest.encode(), &ManifestLimits::default()).unwrap();
    let mut dst = PartitionStore::create(&mut io, Path::new("/dst"), PID, config.clone()).unwrap();
    let budget = InstallBudget::new(4 << 20);
    let mut install = dst.begin_install(&mut io, offer, &budget).unwrap();
    for (a, c, bytes) in &chunks {
        install.accept_chunk(&mut io, *a, *c, bytes).unwrap();
    }
    dst.commit_install(&mut io, install).unwrap();
    let expected: Vec<_> = all
        .iter()
        .filter(|(offset, _)| *offset < snapshot_end)
        .cloned()
        .collect();
    assert_eq!(read_all(&mut io, &mut dst), expected);
    drop(dst);
    let mut io = io.reboot();
    let mut dst = PartitionStore::open(&mut io, Path::new("/dst"), PID, config).unwrap();
    assert_eq!(read_all(&mut io, &mut dst), expected);
}

#[test]
fn a_snapshot_waits_for_a_flush_in_flight() {
    let mut io = SimBackend::new(7);
    let config = small_config();
    let mut store = PartitionStore::create(&mut io, Path::new(DIR), PID, config).unwrap();
    let batch = next_batch(&store, 1, 100, 1);
    store.append(&mut io, &batch).unwrap();
    let mut sqes = Vec::new();
    assert_eq!(store.prepare_flush(&mut sqes).unwrap(), 2);
    assert!(matches!(
        store.open_snapshot(&mut io, 1),
        Err(StoreError::Transfer {
            source: TransferError::Busy,
            ..
        })
    ));
    let completions = io.submit(sqes);
    store.complete_flush(completions).unwrap();
    let manifest = store.open_snapshot(&mut io, 1).unwrap();
    assert_eq!(manifest.next_offset, 1);
    assert_eq!(manifest.artifacts.len(), 1);
}

#[test]
fn retention_keeps_the_table_file_bounded_by_live_segments() {
    let mut io = SimBackend::new(8);
    let config = StoreConfig {
        retention_bytes: Some(32 * 1024),
        ..tiny_segments()
    };
    let mut store = PartitionStore::create(&mut io, Path::new(DIR), PID, config.clone()).unwrap();
    let mut all = Vec::new();
    let tables = |io: &SimBackend| -> Vec<(std::path::PathBuf, usize)> {
        io.paths()
            .into_iter()
            .filter(|p| p.extension().is_some_and(|e| e == "tbl"))
            .map(|p| {
                let len = io.read_whole(&p).unwrap().len();
                (p, len)
            })
            .collect()
    };
    let mut size_max = 0;
    for seed in 0..1_200 {
        append_acked(&mut io, &mut store, 3_000, seed, &mut all);
        if seed % 10 == 9 {
            store.apply_retention(&mut io, 0).unwrap();
            let t = tables(&io);
            assert_eq!(t.len(), 1, "old tables left behind: {t:?}");
            size_max = size_max.max(t[0].1);
        }
    }
    // ~600 segments sealed, a handful live: the file holds at most a block
    // of dead records beyond twice the live ones.
    let table = store.superblock().table;
    assert!(table.id > 5, "never compacted: {table:?}");
    assert!(size_max <= 2 * 4096, "table grew to {size_max} bytes");
    let live = store.sealed_segments().count();
    assert!(live <= 6, "{live} live segments");
    let start = store.log_start_offset();
    let kept: Vec<_> = all.into_iter().filter(|(o, _)| *o >= start).collect();
    drop(store);
    let mut io = io.reboot();
    let mut store = PartitionStore::open(&mut io, Path::new(DIR), PID, config).unwrap();
    assert_eq!(read_all(&mut io, &mut store), kept);
}
