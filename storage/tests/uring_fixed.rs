//! Fixed buffers on a real disk: a store whose pool's write buffers sit in a
//! registered arena writes them as WRITE_FIXED, in place or copied, and reads
//! back what it wrote; a registration the backend refuses (one exists, too
//! many regions) leaves plain writes that work the same.

mod common;

use std::path::Path;

use common::{next_batch, read_all};
use ringlog_storage::io::uring::{UringBackend, FIXED_REGIONS_MAX};
use ringlog_storage::io::SharedBufPool;
use ringlog_storage::store::{PartitionStore, PoolConfig, StoreConfig, StorePool};

fn config() -> StoreConfig {
    StoreConfig {
        segment_size_bytes: 1024 * 1024,
        write_buffer_bytes: 64 * 1024,
        index_interval_bytes: 16 * 1024,
        ..StoreConfig::default()
    }
}

fn fixed_pool(dir: &Path) -> StorePool {
    StorePool::new(
        dir.join("recycle"),
        PoolConfig {
            write_buffers_fixed: 2,
            ..PoolConfig::private(&config())
        },
    )
}

/// Appends `n` batches (every other one built in place in a lent buffer),
/// flushing each; returns them.
fn fill(
    io: &mut UringBackend,
    store: &mut PartitionStore,
    pool: &StorePool,
    n: u64,
) -> Vec<Vec<u8>> {
    let mut batches = Vec::new();
    for i in 0..n {
        let batch = next_batch(
            store,
            1 + (i % 4) as u32,
            200 + (i as usize * 331) % 9000,
            i,
        );
        if i % 2 == 0 {
            let mut buf = pool.lend_batch(store.batch_lead_bytes()).unwrap();
            buf.extend_from_slice(&batch);
            store.append_owned(io, buf).unwrap();
        } else {
            store.append(io, &batch).unwrap();
        }
        store.flush(io).unwrap();
        batches.push(batch);
    }
    batches
}

fn reopen_and_check(io: &mut UringBackend, dir: &Path, expected: &[Vec<u8>]) {
    let mut store = PartitionStore::open(io, dir, 0, config()).unwrap();
    let read: Vec<_> = read_all(io, &mut store)
        .into_iter()
        .map(|(_, b)| b)
        .collect();
    assert_eq!(read, expected);
    store.close(io).unwrap();
}

#[test]
fn writes_from_a_registered_arena_go_fixed_and_read_back() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("p");
    let mut io = UringBackend::new(64).unwrap();
    let pool = fixed_pool(&dir);
    let mut store = PartitionStore::create_in(&mut io, &dir, 0, config(), pool.clone()).unwrap();
    let region = pool.write_buffers().fixed_region().expect("an arena");
    assert!(io.register_fixed_buffers(vec![region]));
    let expected = fill(&mut io, &mut store, &pool, 60);
    // Every data write came from the arena (two buffers, never more needed).
    assert!(
        io.fixed_writes() >= 60,
        "fixed writes: {}",
        io.fixed_writes()
    );
    assert_eq!(pool.write_buffers().lent(), 0);
    // A second registration is refused; writes go on, still fixed.
    let again = pool.write_buffers().fixed_region().unwrap();
    assert!(!io.register_fixed_buffers(vec![again]));
    let before = io.fixed_writes();
    let mut expected = expected;
    let more = next_batch(&store, 3, 5000, 99);
    store.append(&mut io, &more).unwrap();
    store.flush(&mut io).unwrap();
    expected.push(more);
    assert!(io.fixed_writes() > before);
    store.close(&mut io).unwrap();
    reopen_and_check(&mut io, &dir, &expected);
}

#[test]
fn a_refused_registration_falls_back_to_plain_writes() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("p");
    let mut io = UringBackend::new(64).unwrap();
    let pool = fixed_pool(&dir);
    let mut store = PartitionStore::create_in(&mut io, &dir, 0, config(), pool.clone()).unwrap();
    // One region past the bound: the whole registration is refused.
    let others: Vec<_> = (0..FIXED_REGIONS_MAX)
        .map(|_| SharedBufPool::with_fixed(4096, 1, 0, 0))
        .collect();
    let mut regions: Vec<_> = others.iter().filter_map(|p| p.fixed_region()).collect();
    regions.push(pool.write_buffers().fixed_region().unwrap());
    assert!(!io.register_fixed_buffers(regions));
    let expected = fill(&mut io, &mut store, &pool, 30);
    assert_eq!(io.fixed_writes(), 0, "nothing registered: plain writes");
    store.close(&mut io).unwrap();
    reopen_and_check(&mut io, &dir, &expected);
}
