//! A bit flipped while reading the block that holds the log's end must never
//! become durable damage: open keeps that block to rewrite at the next
//! flush, and a cut rewrites the bytes below it. Each test flips every read
//! of the step in turn, then appends and flushes, reopens cleanly and
//! requires every batch the log must hold to read back byte for byte.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::{next_batch, read_all, small_config};
use ringlog_protocol::BatchHeader;
use ringlog_storage::io::sim::{Fault, FaultOp, SimBackend};
use ringlog_storage::store::{PartitionStore, StoreError};
use ringlog_storage::superblock::choose;

const DIR: &str = "/p5";
const PID: u32 = 5;
/// Batches flushed before the step under test; each ends mid-block.
const BATCHES: u64 = 8;
/// Batches `[0, KEEP)` survive the cut.
const KEEP: usize = 5;
/// Seeds per test: a flip lands in the kept part of the tail block only
/// with the odds of that part's share of the block.
const SEEDS: u64 = 64;
/// More reads than any step under test does.
const READS_MAX: u64 = 64;

fn dir() -> &'static Path {
    Path::new(DIR)
}

type Batches = Vec<(u64, Vec<u8>)>;

/// A store with [`BATCHES`] flushed batches (one flush each), `close`d or
/// not, on a rebooted disk.
fn built(seed: u64, close: bool) -> (SimBackend, Batches) {
    let mut io = SimBackend::new(seed);
    let mut store = PartitionStore::create(&mut io, dir(), PID, small_config()).unwrap();
    let mut acked = Vec::new();
    for i in 0..BATCHES {
        let b = next_batch(&store, 3, 150 + 40 * i as usize, i);
        let a = store.append(&mut io, &b).unwrap();
        store.flush(&mut io).unwrap();
        acked.push((a.base_offset, b));
    }
    if close {
        store.close(&mut io).unwrap();
    }
    (io.reboot(), acked)
}

fn typed(e: &StoreError) -> bool {
    matches!(
        e,
        StoreError::Corruption { .. }
            | StoreError::Io { .. }
            | StoreError::Fenced { .. }
            | StoreError::Superblock(_)
    )
}

/// Appends and flushes one batch (so the tail block is rewritten), records
/// it in `must`.
fn append_one(io: &mut SimBackend, store: &mut PartitionStore, must: &mut Batches) {
    let b = next_batch(store, 2, 90, 99);
    let a = store.append(io, &b).unwrap();
    store.flush(io).unwrap();
    must.push((a.base_offset, b));
}

/// Reboots, opens without faults and checks that every batch of `must` reads
/// back exactly.
fn check_clean(io: SimBackend, must: &Batches, what: &str) {
    let mut io = io.reboot();
    let mut store = PartitionStore::open(&mut io, dir(), PID, small_config())
        .unwrap_or_else(|e| panic!("{what}: clean reopen: {e}"));
    let stored: BTreeMap<u64, Vec<u8>> = read_all(&mut io, &mut store).into_iter().collect();
    for (offset, bytes) in must {
        assert!(
            stored.get(offset) == Some(bytes),
            "{what}: batch {offset} lost or damaged on disk"
        );
    }
}

#[test]
fn a_flipped_read_at_open_never_reaches_the_disk_through_the_tail_block() {
    let mut flipped = 0;
    for seed in 0..SEEDS {
        let close = seed % 2 == 1;
        for k in 0..READS_MAX {
            let (mut io, mut must) = built(seed, close);
            io.inject(FaultOp::Read, k, Fault::BitFlip);
            let opened = PartitionStore::open(&mut io, dir(), PID, small_config());
            if io.op_count(FaultOp::Read) <= k {
                break;
            }
            flipped += 1;
            let what = format!("seed {seed} close {close} read {k}");
            match opened {
                Ok(mut store) => append_one(&mut io, &mut store, &mut must),
                Err(e) => assert!(typed(&e), "{what}: {e}"),
            }
            check_clean(io, &must, &what);
        }
    }
    assert!(flipped > 10, "only {flipped} reads flipped");
}

#[test]
fn a_flipped_read_during_a_cut_never_damages_the_kept_log() {
    let mut flipped = 0;
    for seed in 0..SEEDS {
        let close = seed % 2 == 1;
        for k in 0..READS_MAX {
            let (mut io, acked) = built(seed, close);
            let mut store = PartitionStore::open(&mut io, dir(), PID, small_config()).unwrap();
            let cut_op = BatchHeader::decode(&acked[KEEP - 1].1).unwrap().vsr_op;
            let reads = io.op_count(FaultOp::Read);
            io.inject(FaultOp::Read, reads + k, Fault::BitFlip);
            let cut = store.truncate_above(&mut io, cut_op);
            if io.op_count(FaultOp::Read) <= reads + k {
                break;
            }
            flipped += 1;
            let what = format!("seed {seed} close {close} cut read {k}");
            let mut must = acked[..KEEP].to_vec();
            match cut {
                Ok(_) => append_one(&mut io, &mut store, &mut must),
                Err(e) => assert!(typed(&e), "{what}: {e}"),
            }
            check_clean(io, &must, &what);
        }
    }
    assert!(flipped > 4, "only {flipped} reads flipped");
}

#[test]
fn a_flipped_read_while_open_finishes_a_pending_cut_never_damages_the_kept_log() {
    let pending: usize = (0..SEEDS / 4).map(flip_reads_of_pending_cut_open).sum();
    assert!(pending > 0, "no crash point left a cut pending");
}

/// Crashes the cut at each of its I/Os; for each crash that leaves the cut
/// pending, flips each read of the open that finishes it. Returns how many
/// crash points left it pending.
fn flip_reads_of_pending_cut_open(seed: u64) -> usize {
    let (mut probe, acked) = built(seed, true);
    let cut_op = BatchHeader::decode(&acked[KEEP - 1].1).unwrap().vsr_op;
    let mut store = PartitionStore::open(&mut probe, dir(), PID, small_config()).unwrap();
    let start = probe.ops_count();
    store.truncate_above(&mut probe, cut_op).unwrap();
    // The crashed disk, again from the same seeds each time.
    let crashed = |crash_at: u64| {
        let (mut io, _) = built(seed, true);
        let mut store = PartitionStore::open(&mut io, dir(), PID, small_config()).unwrap();
        io.set_crash_at(crash_at, false);
        let _ = store.truncate_above(&mut io, cut_op);
        io.reboot()
    };
    let sb_path = dir().join("superblock");
    let mut pending = 0;
    for crash_at in start..probe.ops_count() {
        let is_pending = crashed(crash_at).read_whole(&sb_path).is_some_and(|bytes| {
            choose(bytes, &sb_path).is_ok_and(|c| c.superblock.frontier.cut_pending_end != 0)
        });
        if !is_pending {
            continue;
        }
        pending += 1;
        for k in 0..READS_MAX {
            let mut io = crashed(crash_at);
            io.inject(FaultOp::Read, k, Fault::BitFlip);
            let opened = PartitionStore::open(&mut io, dir(), PID, small_config());
            if io.op_count(FaultOp::Read) <= k {
                break;
            }
            let what = format!("seed {seed} crash at {crash_at} open read {k}");
            let mut must = acked[..KEEP].to_vec();
            match opened {
                Ok(mut store) => append_one(&mut io, &mut store, &mut must),
                Err(e) => assert!(typed(&e), "{what}: {e}"),
            }
            check_clean(io, &must, &what);
        }
    }
    pending
}

/// The verified tail read is retried at most 3 times in all: flips on two
/// reads in a row still open (the third read verifies), flips on three
/// refuse the open with a typed I/O error (unstable device), and neither
/// damages the disk.
#[test]
fn the_tail_block_is_read_at_most_three_times_then_the_device_is_unstable() {
    let mut refused = 0;
    for seed in 0..SEEDS {
        // The verified tail read is the last read of a clean open.
        let (mut io, _) = one_batch(seed);
        PartitionStore::open(&mut io, dir(), PID, small_config()).unwrap();
        let tail_read = io.op_count(FaultOp::Read) - 1;
        for flips in [2, 3] {
            let (mut io, mut must) = one_batch(seed);
            for k in 0..flips {
                io.inject(FaultOp::Read, tail_read + k, Fault::BitFlip);
            }
            let what = format!("seed {seed} {flips} flips");
            match PartitionStore::open(&mut io, dir(), PID, small_config()) {
                Ok(mut store) => append_one(&mut io, &mut store, &mut must),
                Err(StoreError::Io { source, .. })
                    if flips == 3 && source.to_string().contains("unstable device") =>
                {
                    refused += 1;
                }
                Err(e) => panic!("{what}: {e}"),
            }
            check_clean(io, &must, &what);
        }
    }
    // A flip misses the batch only when it lands in the block's last bytes.
    assert!(
        refused > SEEDS / 2,
        "three flipped tail reads refused only {refused} opens"
    );
    println!("{refused} of {SEEDS} opens refused after three flipped tail reads");
}

/// A store with one flushed batch filling most of the first block, so a
/// flip in the read of that block almost always lands in the batch.
fn one_batch(seed: u64) -> (SimBackend, Batches) {
    let mut io = SimBackend::new(seed);
    let mut store = PartitionStore::create(&mut io, dir(), PID, small_config()).unwrap();
    let b = next_batch(&store, 1, 3900, seed);
    assert!(b.len() > 3900 && b.len() < 4096, "{} bytes", b.len());
    let a = store.append(&mut io, &b).unwrap();
    store.flush(&mut io).unwrap();
    (io.reboot(), vec![(a.base_offset, b)])
}
