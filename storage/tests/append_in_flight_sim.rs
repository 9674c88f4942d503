//! Appends while the partition's flush is in flight (the pipelined group
//! commit of the shard and of the append benchmark): an append that would
//! have to flush first (full write buffer, segment roll) is refused with a
//! typed error and changes nothing, `append_waits_for_flush` says so before,
//! and once the flush completed the same append succeeds; the copy into the
//! write buffer still verifies every batch once and hashes what is written.

mod common;

use std::path::Path;

use common::{next_batch, read_all, small_config};
use ringlog_storage::io::sim::SimBackend;
use ringlog_storage::io::IoBackend;
use ringlog_storage::segment::{segment_checksum, SegmentHasher};
use ringlog_storage::store::{PartitionStore, StoreConfig, StoreError};

const PID: u32 = 5;

fn dir() -> &'static Path {
    Path::new("/p5")
}

/// Appends `batch` with a flush possibly in flight (`sqes` queued by
/// `prepare_flush`, not submitted): when the store says it must wait, the
/// append is refused without effect, then succeeds after the flush
/// completed. Returns whether it had to wait.
fn append_behind_flush(
    io: &mut SimBackend,
    store: &mut PartitionStore,
    batch: &[u8],
    sqes: &mut Vec<ringlog_storage::io::Sqe>,
) -> bool {
    let waits = store.append_waits_for_flush(batch.len());
    if !waits {
        store.append(io, batch).expect("append behind the flush");
        return false;
    }
    let before = store.chain();
    let size = store.size_bytes();
    match store.append(io, batch) {
        Err(StoreError::FlushInFlight { partition_id }) => assert_eq!(partition_id, PID),
        other => panic!("expected FlushInFlight, got {other:?}"),
    }
    assert_eq!(store.chain(), before, "a refused append changed the log");
    assert_eq!(store.size_bytes(), size);
    assert!(store.fenced().is_none());
    let completions = io.submit(std::mem::take(sqes));
    store.complete_flush(completions).expect("flush");
    assert!(!store.append_waits_for_flush(batch.len()));
    store.append(io, batch).expect("append after the flush");
    true
}

/// `rounds` flushes, each with three batches appended behind it while it is
/// in flight (a refused one goes in after the flush completed, and a new
/// flush is queued); checks the log before and after a reopen. Returns the
/// backend, every batch appended, how many appends had to wait and how
/// many segments were sealed.
fn run(
    config: StoreConfig,
    value_len: usize,
    rounds: u64,
) -> (SimBackend, Vec<Vec<u8>>, usize, usize) {
    let mut io = SimBackend::new(9);
    let mut store = PartitionStore::create(&mut io, dir(), PID, config.clone()).unwrap();
    let mut all = Vec::new();
    let mut waits = 0;
    let first = next_batch(&store, 2, value_len, 0);
    store.append(&mut io, &first).unwrap();
    all.push(first);
    for seed in 1..rounds {
        // Nothing to flush only when the last round's final append waited.
        let mut sqes = Vec::new();
        store.prepare_flush(&mut sqes).unwrap();
        // Three batches behind each flush: the third overflows the buffer.
        for k in 0..3 {
            let batch = next_batch(&store, 2, value_len, seed * 3 + k);
            if append_behind_flush(&mut io, &mut store, &batch, &mut sqes) {
                waits += 1;
                // The flush in flight completed: nothing is in flight now.
                assert!(store.prepare_flush(&mut sqes).unwrap() > 0);
            }
            all.push(batch);
        }
        if !sqes.is_empty() {
            let completions = io.submit(sqes);
            store.complete_flush(completions).unwrap();
        }
    }
    store.flush(&mut io).unwrap();
    let got: Vec<Vec<u8>> = read_all(&mut io, &mut store)
        .into_iter()
        .map(|(_, b)| b)
        .collect();
    assert!(got == all, "stored batches differ from the appended ones");
    let sealed = store.sealed_segments().count();
    store.close(&mut io).unwrap();
    let mut reopened = PartitionStore::open(&mut io, dir(), PID, config).unwrap();
    let got: Vec<Vec<u8>> = read_all(&mut io, &mut reopened)
        .into_iter()
        .map(|(_, b)| b)
        .collect();
    assert!(
        got == all,
        "reopened store differs from the appended batches"
    );
    (io, all, waits, sealed)
}

#[test]
fn an_append_that_would_overflow_the_buffer_waits_for_the_flush_in_flight() {
    // 16 KiB write buffer, ~5 KiB batches: the third append behind a flush
    // overflows it. Large segments: no roll.
    let config = StoreConfig {
        segment_size_bytes: 1 << 20,
        ..small_config()
    };
    let (_, all, waits, sealed) = run(config, 2500, 12);
    assert_eq!(sealed, 0);
    assert_eq!(all.len(), 34);
    assert!(waits >= 3, "the buffer bound was never hit ({waits} waits)");
}

#[test]
fn an_append_that_would_roll_waits_for_the_flush_in_flight() {
    // 64 KiB segments, ~5 KiB batches: several rolls (a roll flushes); the
    // 48 KiB write buffer never overflows (three batches and a tail block
    // are under 20 KiB), so every wait is a roll's.
    let config = StoreConfig {
        write_buffer_bytes: 48 << 10,
        ..small_config()
    };
    let (_, all, waits, sealed) = run(config, 2500, 40);
    assert_eq!(all.len(), 118);
    assert!(sealed >= 5, "only {sealed} rolls");
    assert_eq!(
        waits, sealed,
        "every roll behind a flush waited, nothing else"
    );
}

#[test]
fn a_batch_with_a_corrupted_body_is_refused_and_changes_nothing() {
    let mut io = SimBackend::new(3);
    let mut store = PartitionStore::create(&mut io, dir(), PID, small_config()).unwrap();
    let good = next_batch(&store, 3, 700, 1);
    store.append(&mut io, &good).unwrap();
    let mut bad = next_batch(&store, 3, 700, 2);
    let last = bad.len() - 1;
    bad[last] ^= 0x40;
    let before = (store.chain(), store.size_bytes());
    assert!(matches!(
        store.append(&mut io, &bad),
        Err(StoreError::InvalidBatch { .. })
    ));
    assert_eq!((store.chain(), store.size_bytes()), before);
    // The same batch, intact, goes in; only the good bytes are stored.
    bad[last] ^= 0x40;
    store.append(&mut io, &bad).unwrap();
    store.flush(&mut io).unwrap();
    let got: Vec<Vec<u8>> = read_all(&mut io, &mut store)
        .into_iter()
        .map(|(_, b)| b)
        .collect();
    assert!(got == vec![good, bad]);
}

#[test]
fn the_sealed_segment_checksum_is_the_checksum_of_the_bytes_written() {
    // Batches larger than the copy piece, so each is copied and hashed in
    // several pieces; the seal's checksum must still be that of the file's
    // bytes, chunk by chunk.
    let config = StoreConfig {
        segment_size_bytes: 512 << 10,
        write_buffer_bytes: 128 << 10,
        transfer_chunk_bytes: 48 << 10,
        ..small_config()
    };
    let chunk = config.transfer_chunk_bytes;
    let mut io = SimBackend::new(4);
    let mut store = PartitionStore::create(&mut io, dir(), PID, config).unwrap();
    let mut written = Vec::new();
    while store.sealed_segments().next().is_none() {
        let batch = next_batch(&store, 7, 13_000, written.len() as u64);
        store.append(&mut io, &batch).unwrap();
        store.flush(&mut io).unwrap();
        written.push(batch);
    }
    let sealed = *store.sealed_segments().next().unwrap();
    let bytes: Vec<u8> = written
        .iter()
        .flatten()
        .copied()
        .take(sealed.length_bytes as usize)
        .collect();
    assert_eq!(bytes.len() as u64, sealed.length_bytes);
    let mut hasher = SegmentHasher::new(chunk);
    hasher.update(&bytes);
    let expected: Vec<u64> = bytes
        .chunks(chunk as usize)
        .map(ringlog_protocol::checksum)
        .collect();
    assert_eq!(hasher.chunk_checksums(), expected);
    assert_eq!(sealed.checksum, segment_checksum(&expected));
    store.close(&mut io).unwrap();
}
