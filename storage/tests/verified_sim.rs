//! `PartitionStore::append_verified`: a batch the caller verified is stored
//! without a second check of its body, the header checks still refuse what
//! does not continue the log, and a bit flipped on disk after it was
//! written is caught when it is read.

mod common;

use std::path::Path;

use common::{next_batch, read_all, small_config};
use ringlog_protocol::VerifiedBatch;
use ringlog_storage::io::sim::SimBackend;
use ringlog_storage::store::{PartitionStore, StoreError};

const PID: u32 = 3;

#[test]
fn verified_batches_are_stored_checked_by_header_and_a_flip_on_disk_is_caught_at_read() {
    let dir = Path::new("/v");
    let mut io = SimBackend::new(5);
    let mut store = PartitionStore::create(&mut io, dir, PID, small_config()).unwrap();
    let mut written = Vec::new();
    for i in 0..4 {
        let b = next_batch(&store, 3, 700, i);
        let v = VerifiedBatch::parse(&b[..]).unwrap();
        let a = store.append_verified(&mut io, v).unwrap();
        store.flush(&mut io).unwrap();
        written.push((a.base_offset, b));
    }
    assert_eq!(read_all(&mut io, &mut store), written);

    // The proof covers the bytes, not their place: a batch that does not
    // continue the log is refused, and nothing changes.
    let stale = &written[1].1;
    let e = store
        .append_verified(&mut io, VerifiedBatch::parse(&stale[..]).unwrap())
        .unwrap_err();
    assert!(matches!(e, StoreError::OffsetMismatch { .. }), "{e}");
    assert_eq!(store.next_offset(), written[3].0 + 3);

    // A bit flipped in the second batch's body on disk: its read fails
    // with a typed error naming it, the first still reads.
    let log = io
        .paths()
        .into_iter()
        .find(|p| p.extension().is_some_and(|e| e == "log"))
        .expect("a segment file");
    let at = written[0].1.len() + 200;
    let byte = io.read_whole(&log).unwrap()[at];
    io.corrupt(&log, at, &[byte ^ 0x20]);
    // Read by the open store (its private pool has no cache: the device).
    let first = store.read(&mut io, written[0].0, 1).unwrap();
    assert_eq!(first.bytes, written[0].1);
    let e = store.read(&mut io, written[1].0, 1).unwrap_err();
    assert!(matches!(e, StoreError::Corruption { .. }), "{e}");
    // And at the next open, which verifies the log below its frontier.
    drop(store);
    let mut io = io.reboot();
    let Err(e) = PartitionStore::open(&mut io, dir, PID, small_config()) else {
        panic!("a flipped bit below the frontier opened");
    };
    assert!(matches!(e, StoreError::Corruption { .. }), "{e}");
    assert!(e.to_string().contains(".log at byte"), "{e}");
}

/// Guards against: a replicated partition never learning that a sealed
/// segment below its commit went bad while it runs (issue 10's
/// CorruptSegment trigger: the host replaces the store when
/// `corruption_seen` is set). A read that finds a flipped byte in a sealed
/// segment sets it; one in the active segment (whose last block an append
/// may rewrite under a read) does not; a purge, which replaces the
/// generation holding the bad bytes, clears it.
#[test]
fn a_flipped_sealed_segment_read_is_remembered_until_its_generation_goes() {
    let dir = Path::new("/s");
    let mut io = SimBackend::new(6);
    let mut store = PartitionStore::create(&mut io, dir, PID, small_config()).unwrap();
    let mut written = Vec::new();
    while store.sealed_segments().count() < 1 || written.len() < 6 {
        let b = next_batch(&store, 2, 900, written.len() as u64);
        let v = VerifiedBatch::parse(&b[..]).unwrap();
        let a = store.append_verified(&mut io, v).unwrap();
        store.flush(&mut io).unwrap();
        written.push((a.base_offset, b));
    }
    let sealed = *store.sealed_segments().next().unwrap();
    let last_base = written.last().unwrap().0;
    assert!(
        last_base >= sealed.end_offset,
        "the last batch is in the active segment"
    );
    let segment_of = |base: u64| {
        let name = format!("{base:020}.log");
        io.paths()
            .into_iter()
            .find(|p| p.file_name().is_some_and(|n| n == name.as_str()))
            .expect("the segment file")
    };
    let (sealed_log, active_log) = (
        segment_of(sealed.base_offset),
        segment_of(store.sealed_segments().last().unwrap().end_offset),
    );

    // The active segment's first batch: an error, not remembered.
    let flip_active = |io: &mut SimBackend| {
        let byte = io.read_whole(&active_log).unwrap()[100];
        io.corrupt(&active_log, 100, &[byte ^ 0x11]);
    };
    flip_active(&mut io);
    let active_base = store.sealed_segments().last().unwrap().end_offset;
    let e = store.read(&mut io, active_base, 1).unwrap_err();
    assert!(matches!(e, StoreError::Corruption { .. }), "{e}");
    assert_eq!(store.corruption_seen(), None, "active segment remembered");
    flip_active(&mut io); // flipped back
    assert!(store.read(&mut io, active_base, 1).is_ok());

    // The first sealed segment's second batch: remembered, naming it.
    let at = written[0].1.len() + 300;
    let byte = io.read_whole(&sealed_log).unwrap()[at];
    io.corrupt(&sealed_log, at, &[byte ^ 0x20]);
    assert_eq!(
        store.read(&mut io, written[0].0, 1).unwrap().bytes,
        written[0].1
    );
    assert_eq!(store.corruption_seen(), None, "a good read remembered");
    let e = store.read(&mut io, written[1].0, 1).unwrap_err();
    assert!(matches!(e, StoreError::Corruption { .. }), "{e}");
    let seen = store
        .corruption_seen()
        .expect("a sealed segment's flip remembered");
    assert!(
        seen.contains(&format!("{:020}.log", sealed.base_offset)),
        "{seen}"
    );
    // Still failing, never skipped; still remembered.
    assert!(store.read(&mut io, written[1].0, 1).is_err());
    assert!(store.corruption_seen().is_some());

    // A purge drops every batch with the generation that held them.
    store.purge(&mut io).unwrap();
    assert_eq!(store.corruption_seen(), None, "outlived its generation");
}
