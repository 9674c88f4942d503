//! Crash-point tests on the sim backend.
//!
//! Each workload runs once to count its I/Os; then, for every I/O index and
//! with and without a torn in-flight write, it runs again on a fresh sim disk
//! that loses power at that I/O, reboots, recovers and checks:
//! - every acknowledged batch is present with identical bytes;
//! - the durable frontier did not move back;
//! - purged or retained-away data does not reappear;
//! - the recovered store accepts (and durably keeps) further appends.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::{next_batch, read_all, small_config};
use ringlog_storage::io::sim::SimBackend;
use ringlog_storage::store::{PartitionStore, StoreConfig, StoreError};

const DIR: &str = "/p7";
const PARTITION: u32 = 7;

#[derive(Clone, Copy, Debug)]
enum Step {
    /// Append `n` batches of `records` x `value_len`, then flush (acks).
    Append {
        n: u32,
        records: u32,
        value_len: usize,
    },
    /// As `Append`, preparing the next segment ahead (a spare) whenever
    /// one is due, so the rolls rename it into place.
    AppendSpared {
        n: u32,
        records: u32,
        value_len: usize,
    },
    Purge,
    Retention {
        now_ms: u64,
    },
    /// Open a snapshot (flushing, serving the active segment in place) and
    /// release it.
    Snapshot,
    Close,
}

/// What the workload had been told before the crash.
#[derive(Default, Debug)]
struct Model {
    created: bool,
    /// Acknowledged batches by base offset.
    acked: BTreeMap<u64, Vec<u8>>,
    /// The highest superblock frontier seen durable.
    frontier_max: u64,
    /// Log start after the last completed purge or retention.
    log_start_done: u64,
    /// Log starts a purge or retention in flight may leave.
    log_start_inflight: Vec<u64>,
    seed: u64,
}

fn run(
    io: &mut SimBackend,
    config: &StoreConfig,
    steps: &[Step],
    model: &mut Model,
) -> Result<(), StoreError> {
    let mut store = PartitionStore::create(io, Path::new(DIR), PARTITION, config.clone())?;
    model.created = true;
    for step in steps {
        match *step {
            Step::Append {
                n,
                records,
                value_len,
            } => {
                let mut pending = Vec::new();
                for _ in 0..n {
                    model.seed += 1;
                    let batch = next_batch(&store, records, value_len, model.seed);
                    let appended = store.append(io, &batch)?;
                    pending.push((appended.base_offset, batch));
                }
                store.flush(io)?;
                model.acked.extend(pending);
            }
            Step::AppendSpared {
                n,
                records,
                value_len,
            } => {
                for _ in 0..n {
                    if store.spare_due() {
                        store.provision_spare(io)?;
                    }
                    model.seed += 1;
                    let batch = next_batch(&store, records, value_len, model.seed);
                    let appended = store.append(io, &batch)?;
                    store.flush(io)?;
                    model.acked.insert(appended.base_offset, batch);
                }
            }
            Step::Purge => {
                model.log_start_inflight = vec![store.next_offset()];
                store.purge(io)?;
                model.log_start_done = store.log_start_offset();
                model.log_start_inflight.clear();
            }
            Step::Retention { now_ms } => {
                model.log_start_inflight = store.sealed_segments().map(|s| s.end_offset).collect();
                store.apply_retention(io, now_ms)?;
                model.log_start_done = store.log_start_offset();
                model.log_start_inflight.clear();
            }
            Step::Snapshot => {
                let manifest = store.open_snapshot(io, 0)?;
                store.release_snapshot(manifest.snapshot_id);
            }
            Step::Close => {
                let frontier = store.durable().next_offset;
                store.close(io)?;
                store = PartitionStore::open(io, Path::new(DIR), PARTITION, config.clone())?;
                assert_eq!(store.durable().next_offset, frontier);
            }
        }
        model.frontier_max = model
            .frontier_max
            .max(store.superblock().frontier.next_offset);
    }
    Ok(())
}

/// Recovers after a crash and checks every invariant. Returns false when the
/// crash came before the partition was ever created (nothing to check).
fn check_recovery(io: SimBackend, config: &StoreConfig, model: &Model, label: &str) -> bool {
    let mut io = io.reboot();
    let mut store = match PartitionStore::open(&mut io, Path::new(DIR), PARTITION, config.clone()) {
        Ok(store) => store,
        Err(e) => {
            assert!(
                !model.created,
                "{label}: open failed after create was acknowledged: {e}"
            );
            return false;
        }
    };
    let log_start = store.log_start_offset();
    assert!(
        log_start >= model.log_start_done,
        "{label}: purged data reappeared: log start {log_start} < {}",
        model.log_start_done
    );
    assert!(
        log_start == model.log_start_done || model.log_start_inflight.contains(&log_start),
        "{label}: log start {log_start} is neither the old {} nor an in-flight {:?}",
        model.log_start_done,
        model.log_start_inflight
    );
    assert!(
        store.superblock().frontier.next_offset >= model.frontier_max,
        "{label}: superblock frontier moved back"
    );
    let acked_end = model.acked.values().last().map_or(0, |b| {
        let h = ringlog_protocol::BatchHeader::decode(b).unwrap();
        h.next_offset()
    });
    assert!(
        store.durable().next_offset >= acked_end,
        "{label}: durable end {} below acknowledged end {acked_end}",
        store.durable().next_offset
    );
    let stored: BTreeMap<u64, Vec<u8>> = read_all(&mut io, &mut store).into_iter().collect();
    for (offset, bytes) in model.acked.range(log_start..) {
        let got = stored.get(offset);
        assert!(
            got == Some(bytes),
            "{label}: acknowledged batch {offset} lost or changed"
        );
    }
    // Further appends work and survive another crash.
    let batch = next_batch(&store, 3, 100, 999_999);
    let appended = store
        .append(&mut io, &batch)
        .unwrap_or_else(|e| panic!("{label}: append after recovery: {e}"));
    store.flush(&mut io).unwrap();
    let mut io = io.reboot();
    let mut store = PartitionStore::open(&mut io, Path::new(DIR), PARTITION, config.clone())
        .unwrap_or_else(|e| panic!("{label}: second recovery: {e}"));
    let again: BTreeMap<u64, Vec<u8>> = read_all(&mut io, &mut store).into_iter().collect();
    assert!(
        again.get(&appended.base_offset) == Some(&batch),
        "{label}: post-recovery append lost"
    );
    true
}

/// Runs `steps` crashing at every I/O, with and without tearing. Returns the
/// number of crash points exercised.
fn crash_everywhere(name: &str, config: &StoreConfig, steps: &[Step]) -> u64 {
    let mut io = SimBackend::new(1);
    let mut model = Model::default();
    run(&mut io, config, steps, &mut model).expect("workload runs clean without crashes");
    let total_ops = io.ops_count();
    let mut points = 0;
    for crash_at in 0..=total_ops {
        for tear in [false, true] {
            let seed = crash_at * 2 + u64::from(tear) + 17;
            let mut io = SimBackend::new(seed);
            io.set_crash_at(crash_at, tear);
            let mut model = Model::default();
            let result = run(&mut io, config, steps, &mut model);
            assert!(
                result.is_err() || crash_at == total_ops,
                "{name}: crash at {crash_at} went unnoticed"
            );
            let label = format!("{name} crash_at={crash_at} tear={tear} seed={seed}");
            if check_recovery(io, config, &model, &label) {
                points += 1;
            }
        }
    }
    println!("{name}: {total_ops} I/Os, {points} crash points recovered and checked");
    points
}

#[test]
fn crash_during_appends_and_segment_rolls() {
    let config = small_config();
    // Mixed sizes: many small batches (tail block rewritten), some large ones,
    // enough to roll several 64 KiB segments and fill the write buffer.
    let steps = [
        Step::Append {
            n: 3,
            records: 2,
            value_len: 40,
        },
        Step::Append {
            n: 1,
            records: 1,
            value_len: 10,
        },
        Step::Append {
            n: 4,
            records: 5,
            value_len: 900,
        },
        Step::Append {
            n: 2,
            records: 7,
            value_len: 1500,
        },
        Step::Append {
            n: 6,
            records: 3,
            value_len: 2000,
        },
        Step::Close,
        Step::Append {
            n: 5,
            records: 4,
            value_len: 3000,
        },
        Step::Append {
            n: 2,
            records: 1,
            value_len: 30,
        },
    ];
    let points = crash_everywhere("append+roll", &config, &steps);
    assert!(points > 100, "only {points} crash points");
}

#[test]
fn crash_during_purge() {
    let config = small_config();
    let steps = [
        Step::Append {
            n: 6,
            records: 4,
            value_len: 2500,
        },
        Step::Append {
            n: 2,
            records: 2,
            value_len: 100,
        },
        Step::Purge,
        Step::Append {
            n: 4,
            records: 3,
            value_len: 2500,
        },
        Step::Purge,
        Step::Append {
            n: 3,
            records: 2,
            value_len: 700,
        },
        Step::Purge,
        Step::Append {
            n: 2,
            records: 2,
            value_len: 300,
        },
    ];
    let points = crash_everywhere("purge", &config, &steps);
    assert!(points > 100, "only {points} crash points");
}

#[test]
fn crash_during_retention() {
    let config = StoreConfig {
        retention_bytes: Some(100 * 1024),
        retention_ms: Some(60_000),
        ..small_config()
    };
    let steps = [
        Step::Append {
            n: 8,
            records: 4,
            value_len: 3000,
        },
        Step::Append {
            n: 8,
            records: 4,
            value_len: 3000,
        },
        Step::Retention { now_ms: 2_000 },
        Step::Append {
            n: 6,
            records: 4,
            value_len: 3000,
        },
        // Everything older than a minute goes (the timestamps are ~1 s).
        Step::Retention { now_ms: 100_000 },
        Step::Append {
            n: 2,
            records: 2,
            value_len: 100,
        },
    ];
    let points = crash_everywhere("retention", &config, &steps);
    assert!(points > 100, "only {points} crash points");
}

/// 8 KiB segments: two ~3 KiB batches each, so rolls (each appending to the
/// segment table file) come every other batch.
fn tiny_segments() -> StoreConfig {
    StoreConfig {
        segment_size_bytes: 8 * 1024,
        write_buffer_bytes: 8 * 1024,
        transfer_chunk_bytes: 4096,
        ..small_config()
    }
}

#[test]
fn crash_during_rolls_that_write_the_segment_table() {
    let config = StoreConfig {
        retention_bytes: Some(16 * 1024),
        ..tiny_segments()
    };
    let big = Step::Append {
        n: 4,
        records: 1,
        value_len: 3000,
    };
    let small = Step::Append {
        n: 1,
        records: 1,
        value_len: 40,
    };
    // About 70 rolls (enough for a block of dead table entries), snapshots,
    // then retention dropping all but the newest
    // segments (which compacts the table) and rolls into the compacted table.
    let mut steps = vec![big; 32];
    steps.extend([small, Step::Snapshot, small, Step::Snapshot, Step::Close]);
    steps.extend([big; 2]);
    steps.extend([
        Step::Retention { now_ms: 1 },
        big,
        big,
        small,
        Step::Close,
        big,
    ]);
    // The workload does compact the table and roll into the compacted one.
    let mut io = SimBackend::new(1);
    run(&mut io, &config, &steps, &mut Model::default()).unwrap();
    let store = PartitionStore::open(&mut io, Path::new(DIR), PARTITION, config.clone()).unwrap();
    let table = store.superblock().table;
    assert!(
        table.id == 2 && table.first == 0 && table.count > 2,
        "{table:?}"
    );
    let points = crash_everywhere("table", &config, &steps);
    assert!(points > 500, "only {points} crash points");
}

/// Rolls into spares prepared ahead (fresh ones, then recycled ones once
/// retention fills the pool), with a purge and a close while a spare is
/// ready: a crash between preparing the spare and the roll that renames
/// it, or inside either, loses nothing acknowledged.
#[test]
fn crash_during_rolls_into_spares() {
    let config = StoreConfig {
        retention_bytes: Some(16 * 1024),
        ..tiny_segments()
    };
    let spared = Step::AppendSpared {
        n: 5,
        records: 1,
        value_len: 3000,
    };
    let half = Step::AppendSpared {
        n: 2,
        records: 1,
        value_len: 3000,
    };
    let steps = [
        spared,
        Step::Retention { now_ms: 1 },
        spared,
        half,
        Step::Purge,
        half,
        Step::Close,
        spared,
    ];
    // (Checked by hand with a trace in `take_spare`/`prepare_spare`: the
    // clean run rolls into fresh and recycled spares; spare_sim.rs pins
    // each kind.)
    let points = crash_everywhere("spares", &config, &steps);
    assert!(points > 300, "only {points} crash points");
}

#[test]
fn a_damaged_segment_table_is_reported_as_corruption() {
    let config = tiny_segments();
    let mut io = SimBackend::new(5);
    let mut model = Model::default();
    let steps = [Step::Append {
        n: 12,
        records: 1,
        value_len: 3000,
    }];
    run(&mut io, &config, &steps, &mut model).unwrap();
    let generation = Path::new(DIR).join(format!("gen-{:020}", 1));
    let tables: Vec<_> = io
        .paths()
        .into_iter()
        .filter(|p| p.starts_with(&generation) && p.extension().is_some_and(|e| e == "tbl"))
        .collect();
    assert_eq!(tables.len(), 1, "{tables:?}");
    let table = &tables[0];
    let len = io.read_whole(table).unwrap().len();
    let sealed = PartitionStore::open(&mut io, Path::new(DIR), PARTITION, config.clone())
        .unwrap()
        .sealed_segments()
        .count();
    assert!(sealed >= 5, "only {sealed} segments sealed");
    // Every byte of every live entry (64 bytes each) is covered.
    for at in 0..sealed * 64 {
        let byte = io.read_whole(table).unwrap()[at];
        io.corrupt(table, at, &[byte ^ 0x04]);
        match PartitionStore::open(&mut io, Path::new(DIR), PARTITION, config.clone()) {
            Err(StoreError::Corruption { segment, .. }) => assert_eq!(&segment, table),
            Err(e) => panic!("flip at {at}: {e}"),
            Ok(_) => panic!("flip at {at} of {len} accepted"),
        }
        io.corrupt(table, at, &[byte]);
    }
    // Undamaged, it opens again.
    PartitionStore::open(&mut io, Path::new(DIR), PARTITION, config).unwrap();
}
