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
