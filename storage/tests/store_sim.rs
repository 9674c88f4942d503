//! Partition store behaviour on the sim backend: superblock repair, corruption
//! reporting, fail-stop on fsync errors, append refusals, reads, indexes.

mod common;

use std::path::{Path, PathBuf};

use common::{create_cached, make_batch, next_batch, read_all, small_config};
use ringlog_storage::io::sim::SimBackend;
use ringlog_storage::io::{IoBackend, Op, Sqe};
use ringlog_storage::segment::SealedIndex;
use ringlog_storage::store::{
    PartitionStore, StoreConfig, StoreError, PRIVATE_READ_CACHE_BYTES_MAX,
};
use ringlog_storage::superblock::{Superblock, SuperblockError, COPIES, COPY_SIZE_BYTES};

const DIR: &str = "/p3";
const PID: u32 = 3;

fn dir() -> &'static Path {
    Path::new(DIR)
}

/// A store with `batches` appended and acknowledged, plus their bytes.
fn filled(
    io: &mut SimBackend,
    config: StoreConfig,
    batches: u64,
) -> (PartitionStore, Vec<Vec<u8>>) {
    filled_with_cache(io, config, batches, PRIVATE_READ_CACHE_BYTES_MAX)
}

/// [`filled`] with a read cache of `cache_bytes_max` (0: reads go to disk).
fn filled_with_cache(
    io: &mut SimBackend,
    config: StoreConfig,
    batches: u64,
    cache_bytes_max: usize,
) -> (PartitionStore, Vec<Vec<u8>>) {
    let mut store = create_cached(io, dir(), PID, config, cache_bytes_max);
    let mut all = Vec::new();
    for seed in 0..batches {
        let batch = next_batch(&store, 3, 700, seed);
        store.append(io, &batch).unwrap();
        store.flush(io).unwrap();
        all.push(batch);
    }
    (store, all)
}

fn assert_contents(io: &mut SimBackend, store: &mut PartitionStore, expected: &[Vec<u8>]) {
    let got: Vec<Vec<u8>> = read_all(io, store).into_iter().map(|(_, b)| b).collect();
    assert_eq!(got.len(), expected.len());
    assert!(
        got == expected,
        "stored batches differ from the acknowledged ones"
    );
}

fn superblock_path() -> PathBuf {
    dir().join("superblock")
}

fn active_segment(store: &PartitionStore) -> PathBuf {
    let sb = store.superblock();
    dir()
        .join(format!("gen-{:020}", sb.live_generation))
        .join(format!("{:020}.log", sb.frontier.active_base))
}

#[test]
fn one_corrupt_superblock_copy_is_repaired() {
    let mut io = SimBackend::new(1);
    let (store, batches) = filled(&mut io, small_config(), 5);
    store.close(&mut io).unwrap();
    io.corrupt(&superblock_path(), 2 * COPY_SIZE_BYTES + 40, &[0xEE; 8]);
    let mut store = PartitionStore::open(&mut io, dir(), PID, small_config()).unwrap();
    assert_contents(&mut io, &mut store, &batches);
    let file = io.read_whole(&superblock_path()).unwrap().to_vec();
    let copies: Vec<Superblock> = file
        .chunks(COPY_SIZE_BYTES)
        .take(COPIES)
        .map(|c| {
            Superblock::decode(c)
                .expect("every copy valid after repair")
                .0
        })
        .collect();
    // The current state is in both copies of its half, and in the repaired
    // one; the other half may keep the previous state (the next write
    // replaces it), which open does not rewrite.
    let current = store.superblock().clone();
    let [a, b] = ringlog_storage::superblock::half_for(current.sequence);
    assert_eq!((&copies[a], &copies[b]), (&current, &current));
    assert_eq!(copies[2], current, "the damaged copy was rewritten");
    for c in &copies {
        assert!(c.sequence + 1 >= current.sequence, "{c:?}");
    }
}

/// Opening a cleanly closed partition writes nothing: the half holding the
/// previous superblock state is left as every write leaves it.
#[test]
fn open_after_close_rewrites_no_superblock_copy() {
    let mut io = SimBackend::new(11);
    let (store, _) = filled(&mut io, small_config(), 3);
    store.close(&mut io).unwrap();
    let before = io.read_whole(&superblock_path()).unwrap().to_vec();
    let store = PartitionStore::open(&mut io, dir(), PID, small_config()).unwrap();
    let after = io.read_whole(&superblock_path()).unwrap().to_vec();
    assert!(before == after, "open rewrote superblock copies");
    drop(store);
}

#[test]
fn all_superblock_copies_corrupt_is_a_clear_error_and_nothing_is_overwritten() {
    let mut io = SimBackend::new(2);
    let (store, _) = filled(&mut io, small_config(), 3);
    store.close(&mut io).unwrap();
    for copy in 0..COPIES {
        io.corrupt(&superblock_path(), copy * COPY_SIZE_BYTES + 100, &[0x55; 4]);
    }
    let before = io.read_whole(&superblock_path()).unwrap().to_vec();
    let segment_before = io.paths();
    let err = match PartitionStore::open(&mut io, dir(), PID, small_config()) {
        Err(e) => e,
        Ok(_) => panic!("opened with every superblock copy corrupt"),
    };
    assert!(matches!(
        err,
        StoreError::Superblock(SuperblockError::NoValidCopy { .. })
    ));
    assert!(err.to_string().contains("/p3/superblock"), "{err}");
    assert!(
        io.read_whole(&superblock_path()).unwrap() == &before[..],
        "superblock was modified"
    );
    assert_eq!(io.paths(), segment_before);
}

#[test]
fn corrupt_batch_below_the_frontier_is_reported_not_truncated() {
    let mut io = SimBackend::new(3);
    let (store, batches) = filled(&mut io, small_config(), 6);
    let segment = active_segment(&store);
    store.close(&mut io).unwrap();
    // Flip a byte inside the third batch's body.
    let position = (batches[0].len() + batches[1].len()) as u64;
    let target = position as usize + 200;
    let original = io.read_whole(&segment).unwrap().to_vec();
    io.corrupt(&segment, target, &[original[target] ^ 0x01]);
    let err = match PartitionStore::open(&mut io, dir(), PID, small_config()) {
        Err(e) => e,
        Ok(_) => panic!("opened over a corrupt batch below the frontier"),
    };
    match &err {
        StoreError::Corruption {
            partition_id,
            segment: seg,
            position: pos,
            ..
        } => {
            assert_eq!(*partition_id, PID);
            assert_eq!(seg, &segment);
            assert_eq!(*pos, position);
        }
        other => panic!("expected corruption, got {other}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains("partition 3")
            && msg.contains(&segment.display().to_string())
            && msg.contains(&position.to_string()),
        "{msg}"
    );
    // Nothing was truncated: the bytes after the bad batch are still there.
    let after = io.read_whole(&segment).unwrap();
    assert!(
        after[target + 1..] == original[target + 1..],
        "bytes after the corruption changed"
    );
}

#[test]
fn corrupt_sealed_segment_is_reported_on_read_and_on_index_rebuild() {
    let mut io = SimBackend::new(4);
    // No read cache: the read must come from the device to see the damage.
    let (mut store, _) = filled_with_cache(&mut io, small_config(), 60, 0);
    let sealed = *store
        .sealed_segments()
        .next()
        .expect("rolled at least once");
    let generation = dir().join(format!("gen-{:020}", store.superblock().live_generation));
    let log = generation.join(format!("{:020}.log", sealed.base_offset));
    io.corrupt(&log, 500, &[0xAB]);
    let err = store
        .read(&mut io, sealed.base_offset, 1 << 20)
        .unwrap_err();
    assert!(
        matches!(err, StoreError::Corruption { ref segment, .. } if segment == &log),
        "{err}"
    );
    store.close(&mut io).unwrap();
    let idx = generation.join(format!("{:020}.idx", sealed.base_offset));
    unlink(&mut io, &idx);
    let err = PartitionStore::open(&mut io, dir(), PID, small_config())
        .err()
        .expect("corrupt sealed segment must not open");
    // Typed, so a replicated partition can install a good copy instead.
    assert!(
        matches!(
            err,
            StoreError::SealedSegmentCorrupt { ref segment, base_offset, .. }
                if segment == &log && base_offset == sealed.base_offset
        ),
        "{err}"
    );
}

fn unlink(io: &mut SimBackend, path: &Path) {
    let c = io.submit(vec![Sqe::new(Op::Unlink { path: path.into() })]);
    c.into_iter().next().unwrap().result.unwrap();
}

#[test]
fn missing_index_is_rebuilt_from_the_log() {
    let mut io = SimBackend::new(5);
    let (store, batches) = filled(&mut io, small_config(), 60);
    let generation = dir().join(format!("gen-{:020}", store.superblock().live_generation));
    let bases: Vec<u64> = store.sealed_segments().map(|s| s.base_offset).collect();
    assert!(bases.len() >= 2);
    store.close(&mut io).unwrap();
    let idx = generation.join(format!("{:020}.idx", bases[1]));
    let original = io.read_whole(&idx).unwrap().to_vec();
    unlink(&mut io, &idx);
    let mut store = PartitionStore::open(&mut io, dir(), PID, small_config()).unwrap();
    assert_eq!(
        io.read_whole(&idx).unwrap(),
        &original[..],
        "index rebuilt identically"
    );
    assert_contents(&mut io, &mut store, &batches);
}

/// An `.idx` that is whole (its own checksum holds) but whose chunk
/// checksums are not the ones the superblock's segment checksum was computed
/// from (another checksum format, a stale file) is rebuilt, not trusted:
/// transfers verify chunks against those checksums.
#[test]
fn index_whose_chunk_checksums_disagree_with_the_segment_is_rebuilt() {
    let mut io = SimBackend::new(15);
    let (store, batches) = filled(&mut io, small_config(), 60);
    let generation = dir().join(format!("gen-{:020}", store.superblock().live_generation));
    let bases: Vec<u64> = store.sealed_segments().map(|s| s.base_offset).collect();
    assert!(bases.len() >= 2);
    store.close(&mut io).unwrap();
    let idx = generation.join(format!("{:020}.idx", bases[1]));
    let original = io.read_whole(&idx).unwrap().to_vec();
    let mut doctored = SealedIndex::decode(&original, bases[1]).unwrap();
    doctored.chunk_checksums[0] ^= 1;
    let bytes = doctored.encode(bases[1]);
    assert!(
        SealedIndex::decode(&bytes, bases[1]).is_some(),
        "still a valid file"
    );
    io.corrupt(&idx, 0, &bytes);
    let mut store = PartitionStore::open(&mut io, dir(), PID, small_config()).unwrap();
    assert_eq!(
        io.read_whole(&idx).unwrap(),
        &original[..],
        "index rebuilt from the log"
    );
    // The chunk serves against the true checksum.
    let manifest = store.open_snapshot(&mut io, 1).unwrap();
    let artifact = manifest
        .artifacts
        .iter()
        .position(|a| a.base_offset == bases[1])
        .unwrap();
    store
        .read_chunk(&mut io, manifest.snapshot_id, artifact as u32, 0, 1)
        .unwrap();
    store.release_snapshot(manifest.snapshot_id);
    assert_contents(&mut io, &mut store, &batches);
}

#[test]
fn fsync_failure_fences_the_partition_and_restart_recovers() {
    let mut io = SimBackend::new(6);
    let (mut store, batches) = filled(&mut io, small_config(), 4);
    let batch = next_batch(&store, 2, 100, 77);
    store.append(&mut io, &batch).unwrap();
    // The flush is a write then an fdatasync: fail the fdatasync.
    io.set_fail_at(io.ops_count() + 1);
    let err = store.flush(&mut io).unwrap_err();
    assert!(matches!(err, StoreError::Fenced { .. }), "{err}");
    assert!(store.fenced().is_some());
    // Fail-stop: nothing more is accepted or served, no retry.
    let next = next_batch(&store, 1, 10, 78);
    assert!(matches!(
        store.append(&mut io, &next),
        Err(StoreError::Fenced { .. })
    ));
    assert!(matches!(
        store.flush(&mut io),
        Err(StoreError::Fenced { .. })
    ));
    assert!(matches!(
        store.read(&mut io, 0, 100),
        Err(StoreError::Fenced { .. })
    ));
    let mut io = io.reboot();
    let mut store = PartitionStore::open(&mut io, dir(), PID, small_config()).unwrap();
    let got: Vec<Vec<u8>> = read_all(&mut io, &mut store)
        .into_iter()
        .map(|(_, b)| b)
        .collect();
    assert!(got.len() >= batches.len());
    assert!(
        got[..batches.len()] == batches[..],
        "acknowledged batches lost after fence"
    );
}

#[test]
fn appends_that_do_not_continue_the_log_are_refused() {
    let mut io = SimBackend::new(7);
    let (mut store, batches) = filled(&mut io, small_config(), 2);
    let next = store.next_offset();
    let last = store.last_checksum();
    let wrong_offset = make_batch(PID, next + 1, last, 1, 10, 1);
    assert!(matches!(
        store.append(&mut io, &wrong_offset),
        Err(StoreError::OffsetMismatch { expected, actual, .. }) if expected == next && actual == next + 1
    ));
    let wrong_chain = make_batch(PID, next, last ^ 1, 1, 10, 1);
    assert!(matches!(
        store.append(&mut io, &wrong_chain),
        Err(StoreError::ChainMismatch { .. })
    ));
    let wrong_partition = make_batch(PID + 1, next, last, 1, 10, 1);
    assert!(matches!(
        store.append(&mut io, &wrong_partition),
        Err(StoreError::WrongPartition { .. })
    ));
    let mut corrupt = make_batch(PID, next, last, 1, 10, 1);
    let n = corrupt.len();
    corrupt[n - 1] ^= 0xFF;
    assert!(matches!(
        store.append(&mut io, &corrupt),
        Err(StoreError::InvalidBatch { .. })
    ));
    let huge = make_batch(PID, next, last, 4, 4000, 1);
    assert!(matches!(
        store.append(&mut io, &huge),
        Err(StoreError::BatchTooLarge { .. })
    ));
    // Nothing was changed by the refusals.
    assert_eq!(store.next_offset(), next);
    let ok = make_batch(PID, next, last, 1, 10, 1);
    store.append(&mut io, &ok).unwrap();
    store.flush(&mut io).unwrap();
    let mut expected = batches;
    expected.push(ok);
    assert_contents(&mut io, &mut store, &expected);
}

#[test]
fn reads_start_at_the_batch_holding_the_offset_and_respect_limits() {
    let mut io = SimBackend::new(8);
    let (mut store, batches) = filled(&mut io, small_config(), 80);
    assert!(store.sealed_segments().count() >= 2);
    // Each batch has 3 records: offset 3k+1 lives in batch k.
    for k in [0usize, 1, 17, 40, 79] {
        let fetched = store.read(&mut io, 3 * k as u64 + 1, 1).unwrap();
        assert!(fetched.bytes == batches[k], "batch {k} differs");
        assert_eq!(fetched.next_offset, 3 * k as u64 + 3);
    }
    let end = store.durable().next_offset;
    assert!(store.read(&mut io, end, 100).unwrap().bytes.is_empty());
    assert!(matches!(
        store.read(&mut io, end + 1, 100),
        Err(StoreError::OffsetOutOfRange { .. })
    ));
    // Unflushed appends are not served.
    let pending = next_batch(&store, 1, 10, 1000);
    store.append(&mut io, &pending).unwrap();
    assert!(store.read(&mut io, end, 100).unwrap().bytes.is_empty());
}

#[test]
fn retention_moves_the_log_start_and_old_offsets_are_out_of_range() {
    let config = StoreConfig {
        retention_bytes: Some(128 * 1024),
        ..small_config()
    };
    let mut io = SimBackend::new(9);
    let (mut store, _) = filled(&mut io, config.clone(), 120);
    let before = store.size_bytes();
    let outcome = store.apply_retention(&mut io, 0).unwrap();
    assert!(outcome.segments_removed > 0);
    assert_eq!(store.size_bytes(), before - outcome.bytes_removed);
    assert!(store.size_bytes() <= 128 * 1024 + config.segment_size_bytes);
    let start = store.log_start_offset();
    assert!(start > 0);
    assert!(matches!(
        store.read(&mut io, 0, 100),
        Err(StoreError::OffsetOutOfRange { .. })
    ));
    store.close(&mut io).unwrap();
    let store = PartitionStore::open(&mut io, dir(), PID, config).unwrap();
    assert_eq!(store.log_start_offset(), start);
}

#[test]
fn create_refuses_an_existing_directory_and_bad_config() {
    let mut io = SimBackend::new(10);
    let (_store, _) = filled(&mut io, small_config(), 1);
    assert!(matches!(
        PartitionStore::create(&mut io, dir(), PID, small_config()),
        Err(StoreError::AlreadyExists { .. })
    ));
    let bad = StoreConfig {
        segment_size_bytes: 5000,
        ..small_config()
    };
    let err = PartitionStore::create(&mut io, Path::new("/other"), PID, bad)
        .err()
        .unwrap();
    assert!(matches!(err, StoreError::Config(_)));
    assert!(err.to_string().contains("segment_size_bytes"), "{err}");
}

#[test]
fn small_appends_share_the_tail_block() {
    // The tail block is rewritten, not padded: 50 tiny flushed batches take
    // their own size on disk, not 50 blocks.
    let mut io = SimBackend::new(11);
    let mut store = PartitionStore::create(&mut io, dir(), PID, small_config()).unwrap();
    let mut total = 0;
    for seed in 0..50 {
        let batch = next_batch(&store, 1, 8, seed);
        total += batch.len() as u64;
        store.append(&mut io, &batch).unwrap();
        store.flush(&mut io).unwrap();
    }
    assert_eq!(store.size_bytes(), total);
    assert!(total < 50 * 4096 / 8);
    store.close(&mut io).unwrap();
    let mut io = io.reboot();
    let mut store = PartitionStore::open(&mut io, dir(), PID, small_config()).unwrap();
    assert_eq!(read_all(&mut io, &mut store).len(), 50);
}
