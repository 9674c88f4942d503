//! The store under the sim's injected faults: bit flips and EIO on reads,
//! EIO on writes and fsyncs, across reboots.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::{next_batch, read_all, small_config};
use ringlog_storage::io::sim::{Fault, FaultOp, Faults, SimBackend};
use ringlog_storage::store::{PartitionStore, StoreError};

const DIR: &str = "/p3";
const PID: u32 = 3;

/// A store with `n` flushed batches, closed and reopened after a reboot.
fn reopened(seed: u64, n: u64) -> (SimBackend, PartitionStore, Vec<(u64, Vec<u8>)>) {
    let mut io = SimBackend::new(seed);
    let mut store = PartitionStore::create(&mut io, Path::new(DIR), PID, small_config()).unwrap();
    let mut batches = Vec::new();
    for i in 0..n {
        let b = next_batch(&store, 3, 700, i);
        let a = store.append(&mut io, &b).unwrap();
        store.flush(&mut io).unwrap();
        batches.push((a.base_offset, b));
    }
    store.close(&mut io).unwrap();
    let mut io = io.reboot();
    let store = PartitionStore::open(&mut io, Path::new(DIR), PID, small_config()).unwrap();
    (io, store, batches)
}

/// The bytes a read returned, split into batches by base offset.
fn batches_of(bytes: &[u8]) -> Vec<(u64, Vec<u8>)> {
    let mut out = Vec::new();
    let mut rest = bytes;
    while !rest.is_empty() {
        let view = ringlog_protocol::BatchView::parse(rest).expect("reads return whole batches");
        let len = view.as_bytes().len();
        out.push((view.header().base_offset, rest[..len].to_vec()));
        rest = &rest[len..];
    }
    out
}

#[test]
fn a_bit_flip_on_read_is_reported_as_corruption_never_served() {
    let mut detected = 0;
    for k in 0..24u64 {
        let (mut io, mut store, batches) = reopened(k, 30);
        let all: BTreeMap<u64, Vec<u8>> = batches.into_iter().collect();
        let offset = *all.keys().nth((k as usize * 7) % all.len()).unwrap();
        io.inject(FaultOp::Read, io.op_count(FaultOp::Read), Fault::BitFlip);
        match store.read(&mut io, offset, 1 << 20) {
            Err(StoreError::Corruption { .. }) => detected += 1,
            Err(e) => panic!("k={k}: {e}"),
            // The flip hit bytes the read did not serve (past its last
            // whole batch): what it served must be exact.
            Ok(got) => {
                for (base, bytes) in batches_of(&got.bytes) {
                    assert!(
                        all.get(&base) == Some(&bytes),
                        "k={k}: flipped bytes served"
                    );
                }
            }
        }
        // The stored bytes are intact: the next read serves them.
        let got = store.read(&mut io, offset, 1 << 20).unwrap();
        let first = batches_of(&got.bytes).into_iter().next().unwrap();
        assert!(
            all.get(&first.0) == Some(&first.1),
            "k={k}: re-read differs"
        );
        assert!(store.fenced().is_none());
    }
    assert!(detected > 12, "only {detected} of 24 flips detected");
}

#[test]
fn a_read_eio_is_a_typed_error_and_does_not_stop_the_partition() {
    let (mut io, mut store, batches) = reopened(2, 10);
    io.inject(
        FaultOp::Read,
        io.op_count(FaultOp::Read),
        Fault::Errno(libc::EIO),
    );
    let err = store.read(&mut io, batches[0].0, 1 << 20).unwrap_err();
    assert!(matches!(err, StoreError::Io { .. }), "{err}");
    assert!(store.fenced().is_none());
    let got = store.read(&mut io, batches[0].0, 1 << 20).unwrap();
    assert_eq!(&got.bytes[..batches[0].1.len()], &batches[0].1[..]);
    let b = next_batch(&store, 1, 10, 99);
    store.append(&mut io, &b).unwrap();
    store.flush(&mut io).unwrap();
}

/// Epochs of appends under random write and fsync EIO: a failure fences the
/// store (fail-stop), the power is cut, and the next epoch recovers. No
/// acknowledged batch is ever lost or changed.
#[test]
fn random_write_and_fsync_failures_never_lose_acknowledged_data() {
    let mut fences = 0;
    for seed in 0..24 {
        let mut io = SimBackend::new(seed);
        let mut store =
            PartitionStore::create(&mut io, Path::new(DIR), PID, small_config()).unwrap();
        let mut acked: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
        let mut tag = 0;
        for epoch in 0..6 {
            io.set_faults(Faults {
                write_eio: 0.03,
                sync_eio: 0.03,
                ..Faults::default()
            });
            for _ in 0..12 {
                tag += 1;
                let b = next_batch(
                    &store,
                    1 + (tag % 4) as u32,
                    300 + 97 * (tag % 13) as usize,
                    tag,
                );
                let done = store
                    .append(&mut io, &b)
                    .and_then(|a| store.flush(&mut io).map(|()| a));
                match done {
                    Ok(a) => {
                        acked.insert(a.base_offset, b);
                    }
                    Err(e) => {
                        assert!(matches!(e, StoreError::Fenced { .. }), "seed {seed}: {e}");
                        fences += 1;
                        break;
                    }
                }
            }
            io = io.reboot();
            io.set_faults(Faults::default());
            store = PartitionStore::open(&mut io, Path::new(DIR), PID, small_config())
                .unwrap_or_else(|e| panic!("seed {seed} epoch {epoch}: open: {e}"));
            let stored: BTreeMap<u64, Vec<u8>> =
                read_all(&mut io, &mut store).into_iter().collect();
            for (offset, bytes) in &acked {
                assert!(
                    stored.get(offset) == Some(bytes),
                    "seed {seed} epoch {epoch}: acknowledged batch {offset} lost or changed"
                );
            }
            // What was accepted but never acknowledged may or may not be
            // there; the log continues from what recovery found.
            acked.retain(|o, _| stored.contains_key(o));
        }
    }
    assert!(fences > 20, "only {fences} failures injected");
}

/// A bit flip on one read during recovery (a transient fault: the stored
/// bytes are intact) may make open fail with a typed error, or succeed; if it
/// succeeds, every acknowledged batch is there: recovery reads a batch it
/// would take for a torn tail a second time, so a transient flip on the
/// last flush is not mistaken for a torn write.
#[test]
fn a_bit_flip_during_recovery_never_drops_acknowledged_batches() {
    let mut refused = 0;
    for seed in 0..8u64 {
        let value_lens = vec![700; 10 + seed as usize * 3];
        for k in 0..40u64 {
            refused += usize::from(flip_read_during_open(seed, k, (3, &value_lens)) == Some(true));
        }
    }
    println!("flip during recovery: {refused} opens refused with a typed error");
}

/// The same with the last flush holding most of the bytes read, so flips
/// land in it: a transient flip there must never be taken for a torn tail
/// (the batch is read a second time before the log is cut).
#[test]
fn a_bit_flip_on_the_last_flush_during_recovery_is_not_a_torn_tail() {
    let mut refused = 0;
    let value_lens = [50, 50, 50, 50, 50, 3000];
    for seed in 0..24u64 {
        for k in 0..6u64 {
            refused += usize::from(flip_read_during_open(seed, k, (4, &value_lens)) == Some(true));
        }
    }
    assert!(refused > 0, "no flip ever hit the scan");
    println!("flip on the last flush during recovery: {refused} opens refused");
}

/// Flushes one batch of `records` records per entry of `value_lens`, each
/// its own flush, reboots and flips a bit in read `k` of the open. The
/// open must fail with a typed error (`Some(true)`) or keep every
/// acknowledged batch (`Some(false)`); `None` if it did fewer reads.
fn flip_read_during_open(
    seed: u64,
    k: u64,
    (records, value_lens): (u32, &[usize]),
) -> Option<bool> {
    let mut io = SimBackend::new(seed);
    let mut store = PartitionStore::create(&mut io, Path::new(DIR), PID, small_config()).unwrap();
    let mut acked = Vec::new();
    for (i, &value_len) in value_lens.iter().enumerate() {
        let b = next_batch(&store, records, value_len, i as u64);
        let a = store.append(&mut io, &b).unwrap();
        store.flush(&mut io).unwrap();
        acked.push((a.base_offset, b));
    }
    let mut io = io.reboot();
    io.inject(FaultOp::Read, k, Fault::BitFlip);
    let opened = PartitionStore::open(&mut io, Path::new(DIR), PID, small_config());
    if io.op_count(FaultOp::Read) <= k {
        // Open did fewer reads: the flip never happened.
        return None;
    }
    let mut store = match opened {
        Ok(store) => store,
        Err(e) => {
            assert!(
                matches!(
                    e,
                    StoreError::Corruption { .. }
                        | StoreError::SealedSegmentCorrupt { .. }
                        | StoreError::Superblock(_)
                        | StoreError::Io { .. }
                ),
                "seed {seed} k {k}: {e}"
            );
            return Some(true);
        }
    };
    let stored: BTreeMap<u64, Vec<u8>> = read_all(&mut io, &mut store).into_iter().collect();
    for (offset, bytes) in &acked {
        assert!(
            stored.get(offset) == Some(bytes),
            "seed {seed} k {k}: acknowledged batch {offset} dropped as a torn tail (durable end {})",
            store.durable().next_offset
        );
    }
    Some(false)
}
