//! A bit flipped while reading the segment table's last block must never
//! become durable damage: a seal rewrites that block with its new entry, so
//! the entries already in it must be written back only from a verified read.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::{next_batch, read_all, small_config};
use ringlog_storage::io::sim::{Fault, FaultOp, SimBackend};
use ringlog_storage::store::{PartitionStore, StoreError};

const DIR: &str = "/p6";
const PID: u32 = 6;
/// Seeds: a flip lands in the live entries (64 bytes each) of the 4 KiB
/// block with the odds of their share of it.
const SEEDS: u64 = 160;
/// More reads than one seal does.
const READS_MAX: u64 = 16;

type Batches = Vec<(u64, Vec<u8>)>;

fn dir() -> &'static Path {
    Path::new(DIR)
}

/// Appends and flushes batches until the store has sealed `sealed`
/// segments; every acknowledged batch goes into `acked`. Stops at the first
/// error and returns it.
fn fill_to(
    io: &mut SimBackend,
    store: &mut PartitionStore,
    sealed: usize,
    acked: &mut Batches,
) -> Result<(), StoreError> {
    let mut i = acked.len() as u64;
    while store.sealed_segments().count() < sealed {
        let b = next_batch(store, 4, 500 + (i as usize % 7) * 37, i);
        let a = store.append(io, &b)?;
        store.flush(io)?;
        acked.push((a.base_offset, b));
        i += 1;
    }
    Ok(())
}

fn typed(e: &StoreError) -> bool {
    matches!(
        e,
        StoreError::Corruption { .. } | StoreError::Io { .. } | StoreError::Fenced { .. }
    )
}

#[test]
fn a_flipped_read_of_the_segment_table_never_reaches_the_disk() {
    // Two entries in the table's first block, then the third seal rewrites
    // that block.
    flip_each_read_of_a_seal(SEEDS, 2);
}

/// The 65th entry starts the table's second block: its first live entry
/// chains from the last one of the first block, which is read too.
#[test]
fn a_seal_into_a_new_table_block_verifies_the_entry_before_it() {
    flip_each_read_of_a_seal(4, 64);
}

/// For each seed and each read `k` of the seal after `sealed` segments: flip
/// that read, then reopen cleanly and require every acknowledged batch.
fn flip_each_read_of_a_seal(seeds: u64, sealed: usize) {
    let mut flipped = 0;
    for seed in 0..seeds {
        for k in 0..READS_MAX {
            let mut io = SimBackend::new(seed);
            let mut store = PartitionStore::create(&mut io, dir(), PID, small_config()).unwrap();
            let mut acked = Vec::new();
            fill_to(&mut io, &mut store, sealed, &mut acked).unwrap();
            let reads = io.op_count(FaultOp::Read);
            io.inject(FaultOp::Read, reads + k, Fault::BitFlip);
            let step = fill_to(&mut io, &mut store, sealed + 1, &mut acked);
            if io.op_count(FaultOp::Read) <= reads + k {
                break;
            }
            flipped += 1;
            let what = format!("seed {seed} read {k}");
            if let Err(e) = step {
                assert!(typed(&e), "{what}: {e}");
            }
            drop(store);
            let mut io = io.reboot();
            let mut store = PartitionStore::open(&mut io, dir(), PID, small_config())
                .unwrap_or_else(|e| panic!("{what}: clean reopen: {e}"));
            let stored: BTreeMap<u64, Vec<u8>> =
                read_all(&mut io, &mut store).into_iter().collect();
            for (offset, bytes) in &acked {
                assert!(
                    stored.get(offset) == Some(bytes),
                    "{what}: batch {offset} lost or damaged on disk"
                );
            }
        }
    }
    assert!(flipped >= seeds, "only {flipped} reads flipped");
}
