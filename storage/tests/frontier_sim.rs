//! The durable frontier between checkpoints, on the sim backend: after a
//! crash without `close`, recovery may drop as torn only what the last
//! flushes may have left half-written; every batch below the durable
//! frontier record must verify, and a bad one is reported as corruption.
//! Also: recovery bounds come from disk and superblock, not from the config.

mod common;

use std::path::{Path, PathBuf};

use common::{next_batch, read_all, small_config};
use ringlog_storage::io::sim::SimBackend;
use ringlog_storage::store::{PartitionStore, StoreConfig, StoreError};

const DIR: &str = "/p5";
const PID: u32 = 5;

fn dir() -> &'static Path {
    Path::new(DIR)
}

fn active_segment(store: &PartitionStore) -> PathBuf {
    let sb = store.superblock();
    dir()
        .join(format!("gen-{:020}", sb.live_generation))
        .join(format!("{:020}.log", sb.frontier.active_base))
}

/// Creates the partition and appends `n` batches, one flush each (each
/// acknowledged); returns the store and every batch's (position, bytes).
fn flushed(
    io: &mut SimBackend,
    config: StoreConfig,
    n: u64,
) -> (PartitionStore, Vec<(u64, Vec<u8>)>) {
    let mut store = PartitionStore::create(io, dir(), PID, config).unwrap();
    let mut batches = Vec::new();
    let mut position = 0;
    for seed in 0..n {
        let batch = next_batch(&store, 3, 500, seed);
        store.append(io, &batch).unwrap();
        store.flush(io).unwrap();
        let len = batch.len() as u64;
        batches.push((position, batch));
        position += len;
    }
    assert!(store.sealed_segments().next().is_none(), "no roll wanted");
    (store, batches)
}

/// Flips one byte inside the batch of `len` bytes at `position`, past its
/// header.
fn flip(io: &mut SimBackend, segment: &Path, position: u64, len: usize) {
    let at = position as usize + (ringlog_protocol::HEADER_LEN + len) / 2;
    let byte = io.read_whole(segment).unwrap()[at];
    io.corrupt(segment, at, &[byte ^ 0x01]);
}

fn open_err(io: &mut SimBackend, config: StoreConfig) -> StoreError {
    match PartitionStore::open(io, dir(), PID, config) {
        Err(e) => e,
        Ok(store) => panic!(
            "opened over corruption, next offset {}",
            store.next_offset()
        ),
    }
}

fn assert_corruption_at(err: &StoreError, segment: &Path, position: u64) {
    match err {
        StoreError::Corruption {
            partition_id,
            segment: seg,
            position: pos,
            ..
        } => {
            assert_eq!(*partition_id, PID);
            assert_eq!(seg, segment);
            assert_eq!(*pos, position, "{err}");
        }
        other => panic!("expected corruption, got {other}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains(&format!("partition {PID}"))
            && msg.contains(&segment.display().to_string())
            && msg.contains(&position.to_string()),
        "{msg}"
    );
}

/// The repro: 10 flushes without a roll or a close, a byte flipped
/// in batch 5, a power cut. The store used to open at batch 5 and drop the
/// five acknowledged batches after it.
#[test]
fn a_bad_batch_below_the_flushed_end_is_corruption_after_a_crash() {
    let mut io = SimBackend::new(11);
    let (store, batches) = flushed(&mut io, small_config(), 10);
    let segment = active_segment(&store);
    drop(store);
    let (position, batch) = &batches[4];
    let position = *position;
    flip(&mut io, &segment, position, batch.len());
    let mut io = io.reboot();
    let err = open_err(&mut io, small_config());
    assert_corruption_at(&err, &segment, position);
}

/// The review's repro with the default configuration (4 MiB write buffer,
/// so small flushes are far below any size-based interval): ten small
/// flushes, a crash, a flipped byte in any batch but the last flush's is
/// corruption.
#[test]
fn small_flushes_with_the_default_config_record_every_flush() {
    for flipped in [0usize, 4, 8] {
        let mut io = SimBackend::new(21 + flipped as u64);
        let (store, batches) = flushed(&mut io, StoreConfig::default(), 10);
        let segment = active_segment(&store);
        drop(store);
        let (position, batch) = &batches[flipped];
        flip(&mut io, &segment, *position, batch.len());
        let mut io = io.reboot();
        let err = open_err(&mut io, StoreConfig::default());
        assert_corruption_at(&err, &segment, *position);
    }
}

/// The bound (see `open.rs`): after N completed flushes the durable record
/// names end(N-1). A bad byte below that is corruption; one in the last
/// flush is past every record and is taken for a torn tail (its batches
/// are dropped). After a checkpoint every flip is corruption.
#[test]
fn the_unrecorded_tail_is_bounded_and_a_checkpoint_closes_it() {
    let mut must_be_corruption = 0;
    for checkpoint in [false, true] {
        for flipped in 0..10 {
            let mut io = SimBackend::new(13 + flipped as u64);
            let (mut store, batches) = flushed(&mut io, small_config(), 10);
            assert!(store.frontier_lag_bytes() > 0);
            if checkpoint {
                store.checkpoint_frontier(&mut io).unwrap();
                assert_eq!(store.frontier_lag_bytes(), 0);
                // Nothing left to record: no I/O.
                let ops = io.ops_count();
                store.checkpoint_frontier(&mut io).unwrap();
                assert_eq!(io.ops_count(), ops);
            }
            let below_record = flipped < 9;
            must_be_corruption += usize::from(below_record && !checkpoint);
            let segment = active_segment(&store);
            drop(store);
            let (position, batch) = &batches[flipped];
            flip(&mut io, &segment, *position, batch.len());
            let mut io = io.reboot();
            match PartitionStore::open(&mut io, dir(), PID, small_config()) {
                Ok(store) => {
                    assert!(
                        !checkpoint && !below_record,
                        "flip in batch {flipped} (checkpoint {checkpoint}) dropped as torn"
                    );
                    assert_eq!(store.next_offset(), flipped as u64 * 3, "torn tail");
                }
                Err(err) => {
                    assert!(
                        checkpoint || flipped < 9,
                        "the last flush is past every record"
                    );
                    assert_corruption_at(&err, &segment, *position);
                }
            }
        }
    }
    assert_eq!(must_be_corruption, 9);
}

/// Item 2: the recovery scan is bounded by the segment's recorded capacity,
/// not by the configuration it is reopened with.
#[test]
fn lowering_the_segment_size_after_a_crash_keeps_every_batch() {
    let mut io = SimBackend::new(12);
    let mut store = PartitionStore::create(&mut io, dir(), PID, small_config()).unwrap();
    let mut expected = Vec::new();
    for seed in 0..42 {
        let batch = next_batch(&store, 1, 900, seed);
        store.append(&mut io, &batch).unwrap();
        store.flush(&mut io).unwrap();
        expected.push(batch);
    }
    assert!(store.sealed_segments().next().is_none(), "no roll wanted");
    assert!(store.size_bytes() > 32 * 1024);
    drop(store);
    let mut io = io.reboot();
    let smaller = StoreConfig {
        segment_size_bytes: 32 * 1024,
        ..small_config()
    };
    let mut store = PartitionStore::open(&mut io, dir(), PID, smaller.clone()).unwrap();
    assert_eq!(store.next_offset(), 42);
    let got: Vec<Vec<u8>> = read_all(&mut io, &mut store)
        .into_iter()
        .map(|(_, b)| b)
        .collect();
    assert!(got == expected, "recovered batches differ");
    // The old segment is full at its own size; the next one uses the new.
    for seed in 100..160 {
        let batch = next_batch(&store, 1, 900, seed);
        store.append(&mut io, &batch).unwrap();
        store.flush(&mut io).unwrap();
    }
    let sealed: Vec<_> = store.sealed_segments().copied().collect();
    assert!(sealed.len() >= 2, "{sealed:?}");
    assert!(sealed[0].length_bytes > 32 * 1024);
    for s in &sealed[1..] {
        assert!(s.length_bytes <= 32 * 1024, "{s:?}");
    }
    store.close(&mut io).unwrap();
}

/// A workload of flushes (no roll, no close) for the crash-point test:
/// each inner list is one flush's batch sizes (records, value bytes).
const FLUSHES: &[&[(u32, usize)]] = &[
    &[(2, 100)],
    &[(1, 40), (3, 700)],
    &[(2, 2500)],
    &[(1, 10)],
    &[(4, 900), (1, 30), (2, 300)],
    &[(3, 1200)],
    &[(1, 3000), (1, 20)],
    &[(2, 60)],
    &[(5, 500)],
    &[(1, 2000)],
];

/// What the workload was told before the crash.
#[derive(Default)]
struct Flushed {
    created: bool,
    /// Per completed flush: its batches as (position, bytes).
    groups: Vec<Vec<(u64, Vec<u8>)>>,
}

fn run_flushes(
    io: &mut SimBackend,
    config: &StoreConfig,
    model: &mut Flushed,
) -> Result<(), StoreError> {
    let mut store = PartitionStore::create(io, dir(), PID, config.clone())?;
    model.created = true;
    let mut position = 0;
    for (f, sizes) in FLUSHES.iter().enumerate() {
        let mut group = Vec::new();
        for (i, &(records, value_len)) in sizes.iter().enumerate() {
            let batch = next_batch(&store, records, value_len, (f * 10 + i) as u64);
            store.append(io, &batch)?;
            let len = batch.len() as u64;
            group.push((position, batch));
            position += len;
        }
        store.flush(io)?;
        model.groups.push(group);
    }
    Ok(())
}

/// Crashes at every I/O of a run of flushes (torn or not): no acknowledged
/// batch is lost, and a byte flipped in an acknowledged batch below the
/// bound of `open.rs` is reported as corruption, never dropped as torn.
#[test]
fn crash_at_every_flush_io_loses_nothing_and_reports_corruption_below_the_record() {
    let config = StoreConfig {
        segment_size_bytes: 1024 * 1024,
        ..small_config()
    };
    let mut io = SimBackend::new(1);
    run_flushes(&mut io, &config, &mut Flushed::default()).expect("clean run");
    let total_ops = io.ops_count();
    let (mut points, mut flipped) = (0, 0);
    for crash_at in 0..=total_ops {
        for tear in [false, true] {
            let seed = crash_at * 2 + u64::from(tear) + 101;
            let label = format!("crash_at={crash_at} tear={tear} seed={seed}");
            let mut io = SimBackend::new(seed);
            io.set_crash_at(crash_at, tear);
            let mut model = Flushed::default();
            let result = run_flushes(&mut io, &config, &mut model);
            assert!(
                result.is_err() || crash_at == total_ops,
                "{label}: crash unnoticed"
            );
            let mut io = io.reboot();
            let mut store = match PartitionStore::open(&mut io, dir(), PID, config.clone()) {
                Ok(store) => store,
                Err(e) => {
                    assert!(!model.created, "{label}: open failed: {e}");
                    continue;
                }
            };
            points += 1;
            let stored = read_all(&mut io, &mut store);
            for (i, (_, bytes)) in model.groups.iter().flatten().enumerate() {
                assert!(
                    stored.get(i).map(|(_, b)| b) == Some(bytes),
                    "{label}: acknowledged batch {i} lost or changed"
                );
            }
            let segment = active_segment(&store);
            drop(store);
            // The durable record names at least end(N-1) after N
            // acknowledged flushes (see open.rs): every batch below must
            // verify.
            let n = model.groups.len();
            if n < 2 {
                continue;
            }
            let (p, b) = model.groups[n - 2].last().unwrap();
            let bound = p + b.len() as u64;
            let Some((position, batch)) = model
                .groups
                .iter()
                .flatten()
                .rfind(|(p, b)| p + b.len() as u64 <= bound)
            else {
                continue;
            };
            let position = *position;
            flip(&mut io, &segment, position, batch.len());
            let mut io = io.reboot();
            let err = match PartitionStore::open(&mut io, dir(), PID, config.clone()) {
                Err(e) => e,
                Ok(s) => panic!(
                    "{label}: opened over a bad batch at {position} ({n} flushes), next offset {}",
                    s.next_offset()
                ),
            };
            assert_corruption_at(&err, &segment, position);
            flipped += 1;
        }
    }
    println!("flushes: {total_ops} I/Os, {points} crash points, {flipped} with a flipped byte");
    assert!(flipped > 20, "only {flipped} corruption checks");
}
