//! The durable frontier between checkpoints, on the sim backend: after a
//! crash without `close`, recovery may drop as torn only what the last
//! flushes may have left half-written; every batch below the durable
//! frontier record must verify, and a bad one is reported as corruption.
//! Also: recovery bounds come from disk and superblock, not from the config.

mod common;

use std::path::{Path, PathBuf};

use common::{next_batch, read_all, small_config};
use ringlog_storage::io::sim::{FaultOp, SimBackend};
use ringlog_storage::segment::{FlushTrailer, TRAILER_BYTES};
use ringlog_storage::store::{
    PartitionStore, StoreConfig, StoreError, FRONTIER_SLOT_EVERY_FLUSHES,
};

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
    let (mut points, mut flipped, mut weak) = (0, 0, 0);
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
            // The one weaker case of the bound: the torn flush N+1
            // overwrote flush N's trailer and left none of its own; then
            // only the newest slot record holds (none in this short run:
            // the superblock's, at the segment's start), tested on its own
            // in `a_torn_flush_over_the_last_trailer_falls_back_to_the_slot_record`.
            let trailer_names_bound = durable_trailers(&io, &segment)
                .iter()
                .any(|t| t.durable_position >= bound);
            flip(&mut io, &segment, position, batch.len());
            let mut io = io.reboot();
            match PartitionStore::open(&mut io, dir(), PID, config.clone()) {
                Err(err) => {
                    assert_corruption_at(&err, &segment, position);
                    flipped += 1;
                }
                Ok(s) => {
                    assert!(
                        !trailer_names_bound,
                        "{label}: opened over a bad batch at {position} ({n} flushes), next offset {}",
                        s.next_offset()
                    );
                    weak += 1;
                }
            }
        }
    }
    println!(
        "flushes: {total_ops} I/Os, {points} crash points, {flipped} with a flipped byte \
         reported, {weak} dropped past the slot record (trailer torn away)"
    );
    assert!(flipped > 20, "only {flipped} corruption checks");
}

/// Every valid flush trailer in `segment` as the disk holds it now.
fn durable_trailers(io: &SimBackend, segment: &Path) -> Vec<FlushTrailer> {
    io.read_whole(segment)
        .unwrap_or_default()
        .chunks_exact(TRAILER_BYTES as usize)
        .filter_map(FlushTrailer::decode)
        .collect()
}

/// The cost of the frontier record: a flush is its data write (which
/// carries the record in a trailer) and one fdatasync; only every
/// `FRONTIER_SLOT_EVERY_FLUSHES`-th flush adds a slot record write.
#[test]
fn a_flush_is_one_write_and_one_fdatasync_but_every_nth() {
    let every = FRONTIER_SLOT_EVERY_FLUSHES;
    let mut io = SimBackend::new(31);
    let config = StoreConfig {
        segment_size_bytes: 4 * 1024 * 1024,
        ..small_config()
    };
    let mut store = PartitionStore::create(&mut io, dir(), PID, config).unwrap();
    let mut with_slot = Vec::new();
    for seed in 0..3 * every {
        let batch = next_batch(&store, 1, 300, seed);
        store.append(&mut io, &batch).unwrap();
        let (writes, syncs, ops) = (
            io.op_count(FaultOp::Write),
            io.op_count(FaultOp::Sync),
            io.ops_count(),
        );
        store.flush(&mut io).unwrap();
        let writes = io.op_count(FaultOp::Write) - writes;
        assert_eq!(io.op_count(FaultOp::Sync) - syncs, 1, "flush {seed}");
        assert_eq!(
            io.ops_count() - ops,
            writes + 1,
            "flush {seed}: only writes and one sync"
        );
        match writes {
            1 => {}
            2 => with_slot.push(seed),
            n => panic!("flush {seed}: {n} writes"),
        }
    }
    assert!(store.sealed_segments().next().is_none(), "no roll wanted");
    // The first flush has nothing durable to record yet.
    let expected: Vec<u64> = (1..=3).map(|k| k * every - 1).collect();
    assert_eq!(with_slot, expected, "flushes that wrote a slot record");
}

/// The review's repro with trailers: ten small flushes (the default write
/// buffer, so no flush fills it, and no slot record yet: only the last
/// flush's trailer names the durable end; a smaller segment than the
/// default's keeps the sim's disk small), a byte flipped in a batch's
/// header or payload, a crash. Every
/// batch but the last flush's is found by the trailer scan and reported;
/// the last flush's is taken for a torn tail; after a checkpoint, every
/// flip is reported.
#[test]
fn a_flip_in_any_batch_header_or_payload_below_the_last_flush_is_corruption() {
    let header = ringlog_protocol::HEADER_LEN;
    let config = StoreConfig {
        segment_size_bytes: 8 * 1024 * 1024,
        ..StoreConfig::default()
    };
    for checkpoint in [false, true] {
        for flipped in 0..10usize {
            for at in [0, header / 2, header - 1, header + 100] {
                let seed = 700 + (flipped * 10 + at) as u64 + u64::from(checkpoint);
                let mut io = SimBackend::new(seed);
                let (mut store, batches) = flushed(&mut io, config.clone(), 10);
                if checkpoint {
                    store.checkpoint_frontier(&mut io).unwrap();
                }
                let segment = active_segment(&store);
                drop(store);
                let (position, _) = batches[flipped];
                let byte = position as usize + at;
                let old = io.read_whole(&segment).unwrap()[byte];
                io.corrupt(&segment, byte, &[old ^ 0x10]);
                let mut io = io.reboot();
                let label = format!("batch {flipped} byte {at} checkpoint {checkpoint}");
                match PartitionStore::open(&mut io, dir(), PID, config.clone()) {
                    Ok(store) => {
                        assert!(!checkpoint && flipped == 9, "{label}: dropped as torn");
                        assert_eq!(store.next_offset(), 27, "{label}");
                    }
                    Err(err) => {
                        assert!(checkpoint || flipped < 9, "{label}: {err}");
                        assert_corruption_at(&err, &segment, position);
                        if !checkpoint {
                            assert!(err.to_string().contains("flush trailer"), "{label}: {err}");
                        }
                    }
                }
            }
        }
    }
}

/// The one weaker case of the bound (see `open.rs`): flush N+1 tears so
/// that it overwrote flush N's trailer and left no trailer of its own.
/// Then a bad batch is reported only below the newest slot record (written
/// by every FRONTIER_SLOT_EVERY_FLUSHES-th flush), and at most the flushes
/// since are dropped. When a trailer survives, the usual bound holds:
/// everything below end(N-1) is reported.
#[test]
fn a_torn_flush_over_the_last_trailer_falls_back_to_the_slot_record() {
    let every = FRONTIER_SLOT_EVERY_FLUSHES as usize;
    let n = every + 8;
    let config = StoreConfig {
        segment_size_bytes: 1024 * 1024,
        ..small_config()
    };
    // Flush N+1, a batch spanning several sectors, torn mid-write; the
    // same seed replays the same crash.
    let crashed = |seed: u64| {
        let mut io = SimBackend::new(900 + seed);
        let (mut store, batches) = flushed(&mut io, config.clone(), n as u64);
        let segment = active_segment(&store);
        let batch = next_batch(&store, 2, 1500, 5000 + seed);
        store.append(&mut io, &batch).unwrap();
        io.set_crash_at(io.ops_count(), true);
        assert!(store.flush(&mut io).is_err());
        drop(store);
        (io.reboot(), batches, segment)
    };
    let (mut weak, mut strong) = (0, 0);
    for seed in 0..48 {
        let (io, batches, segment) = crashed(seed);
        let end = |i: usize| batches[i].0 + batches[i].1.len() as u64;
        let names_end_n_1 = durable_trailers(&io, &segment)
            .iter()
            .any(|t| t.durable_position >= end(n - 2));
        // The slot record written by flush `every` (1-based) names the end
        // of the flush before it.
        let slot_end = end(every - 2);
        for flipped in [0, every - 2, every - 1, n - 2] {
            let (mut io, _, _) = crashed(seed);
            let (position, bytes) = &batches[flipped];
            flip(&mut io, &segment, *position, bytes.len());
            let mut io = io.reboot();
            let label = format!("seed {seed} batch {flipped} trailer kept {names_end_n_1}");
            match PartitionStore::open(&mut io, dir(), PID, config.clone()) {
                Ok(store) => {
                    // Dropped as torn: allowed only past the slot record,
                    // and only when no trailer names end(N-1).
                    assert!(!names_end_n_1, "{label}: dropped as torn");
                    assert!(*position >= slot_end, "{label}: below the slot record");
                    assert_eq!(store.next_offset(), flipped as u64 * 3, "{label}");
                    assert!(n - flipped <= every, "{label}: more than the bound dropped");
                }
                Err(err) => {
                    assert_corruption_at(&err, &segment, *position);
                    assert!(names_end_n_1 || *position < slot_end, "{label}: {err}");
                }
            }
        }
        if names_end_n_1 {
            strong += 1;
        } else {
            weak += 1;
        }
    }
    println!("torn flush N+1: {strong} runs kept a trailer naming end(N-1), {weak} did not");
    assert!(
        weak > 0 && strong > 0,
        "both cases wanted: {weak} weak, {strong} strong"
    );
}

/// A roll onto a recycled file (full of another segment's batches and
/// trailers) zeroes its first block before the superblock names it: after a
/// crash before its first flush it opens empty from that block alone.
/// With the stale first block put back it still opens empty (the stale
/// trailers belong to another segment), but only after scanning the rest.
#[test]
fn a_recycled_active_segment_opens_empty_without_a_scan() {
    let config = StoreConfig {
        retention_bytes: Some(64 * 1024),
        ..small_config()
    };
    let recycle = dir().join("recycle");
    let mut io = SimBackend::new(51);
    let mut store = PartitionStore::create(&mut io, dir(), PID, config.clone()).unwrap();
    let mut recycled = false;
    for seed in 0..1000 {
        let base = store.superblock().frontier.active_base;
        let batch = next_batch(&store, 1, 900, seed);
        store.append(&mut io, &batch).unwrap();
        if recycled && store.superblock().frontier.active_base != base {
            break; // rolled onto the recycled file; nothing flushed in it
        }
        store.flush(&mut io).unwrap();
        store.apply_retention(&mut io, 0).unwrap();
        recycled = io
            .paths()
            .iter()
            .any(|p| p.starts_with(&recycle) && p != &recycle);
    }
    assert!(recycled, "no file was recycled");
    let segment = active_segment(&store);
    let base = store.superblock().frontier.active_base;
    drop(store);
    let mut io = io.reboot();
    let bytes = io.read_whole(&segment).unwrap().to_vec();
    assert!(
        bytes[..4096].iter().all(|&b| b == 0),
        "first block not zeroed"
    );
    assert!(
        bytes[4096..].iter().any(|&b| b != 0),
        "no stale bytes: not a recycled file"
    );
    let opened_reads = |io: &mut SimBackend| {
        let reads = io.op_count(FaultOp::Read);
        let store = PartitionStore::open(io, dir(), PID, config.clone()).unwrap();
        assert_eq!(store.next_offset(), base, "opens empty");
        drop(store);
        io.op_count(FaultOp::Read) - reads
    };
    let zeroed = opened_reads(&mut io);
    // The stale first block back (as a crash before the zeroing landed
    // would leave it): the trailer scan reads the rest of the file.
    io.corrupt(&segment, 0, &bytes[4096..8192]);
    let mut io = io.reboot();
    let stale = opened_reads(&mut io);
    assert!(
        zeroed < stale,
        "zeroed first block: {zeroed} reads, stale: {stale}"
    );
}
