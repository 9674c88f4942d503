//! Disk grows with data on a real filesystem (issue 8 item 9): a new
//! partition allocates no segment space, and the active segment's blocks
//! stay within one allocation step of the data as it grows.

mod common;

use std::os::unix::fs::MetadataExt as _;
use std::path::Path;

use common::{next_batch, read_all};
use ringlog_storage::io::uring::UringBackend;
use ringlog_storage::store::{PartitionStore, StoreConfig};

/// Bytes allocated to `path` (st_blocks), not its apparent size.
fn allocated(path: &Path) -> u64 {
    std::fs::metadata(path).unwrap().blocks() * 512
}

#[test]
fn an_empty_partition_allocates_nothing_and_the_segment_grows_in_steps() {
    let tmp = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
    let dir = tmp.path().join("p");
    let config = StoreConfig {
        segment_size_bytes: 64 << 20,
        write_buffer_bytes: 1 << 20,
        ..StoreConfig::default()
    };
    let mut io = UringBackend::new(64).unwrap();
    let mut store = PartitionStore::create(&mut io, &dir, 1, config).unwrap();
    let log = dir
        .join("gen-00000000000000000001")
        .join("00000000000000000000.log");
    assert_eq!(allocated(&log), 0, "nothing preallocated");
    store
        .append(&mut io, &next_batch(&store, 1, 100, 1))
        .unwrap();
    store.flush(&mut io).unwrap();
    // The first step, plus the frontier record's slot after the capacity.
    let first = allocated(&log);
    assert!((4096..=192 << 10).contains(&first), "first step {first}");
    let mut seed = 2;
    while store.size_bytes() < 20 << 20 {
        store
            .append(&mut io, &next_batch(&store, 8, 8000, seed))
            .unwrap();
        seed += 1;
        if seed % 16 == 0 {
            store.flush(&mut io).unwrap();
        }
        let len = allocated(&log);
        let end = store.size_bytes();
        assert!(
            len <= end + (8 << 20) + (192 << 10),
            "allocated {len} for {end}"
        );
    }
    store.flush(&mut io).unwrap();
    assert!(allocated(&log) >= store.size_bytes());
    assert_eq!(read_all(&mut io, &mut store).len() as u64, seed - 1);
    store.close(&mut io).unwrap();
}
