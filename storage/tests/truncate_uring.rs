//! A tail cut on a real disk through io_uring and O_DIRECT: the zeroing
//! writes and the reads of the block holding the cut are aligned, and the
//! cut log reopens (cleanly and after a drop without close).

mod common;

use common::{make_batch, read_all};
use ringlog_protocol::BatchHeader;
use ringlog_storage::io::uring::UringBackend;
use ringlog_storage::store::{PartitionStore, StoreConfig};

fn config() -> StoreConfig {
    StoreConfig {
        segment_size_bytes: 1024 * 1024,
        write_buffer_bytes: 64 * 1024,
        index_interval_bytes: 16 * 1024,
        ..StoreConfig::default()
    }
}

fn ops_of(io: &mut UringBackend, store: &mut PartitionStore) -> Vec<u64> {
    read_all(io, store)
        .iter()
        .map(|(_, b)| BatchHeader::decode(b).unwrap().vsr_op)
        .collect()
}

#[test]
fn a_cut_on_a_real_disk_reopens_as_the_cut_log() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("p1");
    let mut io = UringBackend::new(16).unwrap();
    let mut store = PartitionStore::create(&mut io, &dir, 1, config()).unwrap();
    // common::make_batch stamps op = base offset + 1; batches of odd sizes
    // put the cut inside a block.
    let mut ops = Vec::new();
    for i in 0..40u64 {
        let batch = make_batch(
            1,
            store.next_offset(),
            store.last_checksum(),
            2,
            700 + 37 * i as usize,
            i,
        );
        ops.push(BatchHeader::decode(&batch).unwrap().vsr_op);
        store.append(&mut io, &batch).unwrap();
        if i % 3 == 0 {
            store.flush(&mut io).unwrap();
        }
    }
    let cut_op = ops[24];
    let end = store.truncate_above(&mut io, cut_op).unwrap();
    assert_eq!(end.last_op, cut_op);
    assert_eq!(ops_of(&mut io, &mut store), ops[..25]);
    let batch = make_batch(1, store.next_offset(), store.last_checksum(), 1, 10, 99);
    let new_op = BatchHeader::decode(&batch).unwrap().vsr_op;
    store.append(&mut io, &batch).unwrap();
    store.flush(&mut io).unwrap();
    // Dropped without close: recovery scans past the cut.
    drop(store);
    let mut store = PartitionStore::open(&mut io, &dir, 1, config()).unwrap();
    let mut want = ops[..25].to_vec();
    want.push(new_op);
    assert_eq!(ops_of(&mut io, &mut store), want);
    store.close(&mut io).unwrap();
    let mut store = PartitionStore::open(&mut io, &dir, 1, config()).unwrap();
    assert_eq!(ops_of(&mut io, &mut store), want);
}
