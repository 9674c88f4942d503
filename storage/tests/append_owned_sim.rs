//! `PartitionStore::append_owned` on the sim backend: a batch built in place
//! in a lent write buffer becomes the write buffer (no copy) when it sits
//! where the log ends in its block, is copied otherwise, and reads back like
//! a copied one; lent buffers go home when their flush completes or fails,
//! and the pool refuses a lend past its bound.

mod common;

use std::path::Path;

use common::{next_batch, read_all, small_config};
use ringlog_storage::io::sim::{Fault, FaultOp, SimBackend};
use ringlog_storage::io::PoolExhausted;
use ringlog_storage::store::{PartitionStore, PoolConfig, StoreConfig, StoreError, StorePool};

fn create(io: &mut SimBackend, dir: &str, lent_max: usize) -> (PartitionStore, StorePool) {
    let config = small_config();
    let pool = StorePool::new(
        Path::new(dir).join("recycle"),
        PoolConfig {
            batch_buffers_lent_max: lent_max,
            ..PoolConfig::private(&config)
        },
    );
    let store = PartitionStore::create_in(io, Path::new(dir), 1, config, pool.clone()).unwrap();
    (store, pool)
}

/// Lends a buffer at the store's current lead and builds `batch` in it.
fn lend_with(
    pool: &StorePool,
    store: &PartitionStore,
    batch: &[u8],
) -> ringlog_storage::io::BatchBuf {
    let mut buf = pool.lend_batch(store.batch_lead_bytes()).unwrap();
    buf.extend_from_slice(batch);
    buf
}

#[test]
fn owned_batches_are_written_in_place_and_read_back_like_copied_ones() {
    let mut io = SimBackend::new(41);
    let (mut store, pool) = create(&mut io, "/p", 4);
    let lent = pool.write_buffers();
    let mut expected = Vec::new();
    let (mut adopted, mut copied) = (0, 0);
    for i in 0..120u64 {
        // Odd sizes, so the log's end moves around inside its block.
        let batch = next_batch(
            &store,
            1 + (i % 3) as u32,
            300 + (i as usize * 97) % 2500,
            i,
        );
        let (held_before, lent_before) = (store.holds_write_buffer(), lent.lent());
        let buf = lend_with(&pool, &store, &batch);
        let appended = store.append_owned(&mut io, buf).unwrap();
        expected.push((appended.base_offset, batch));
        // Only an adopted buffer stays lent; a copied one went home (and a
        // flush inside the append may have sent the previous one home).
        if lent.lent() == lent_before + 1 {
            assert!(!held_before || i % 3 == 2, "adopted over a held buffer");
            adopted += 1;
        } else {
            assert!(
                lent.lent() <= lent_before,
                "a copied batch's buffer went home"
            );
            copied += 1;
        }
        // Every third batch waits for the next one's flush: that one finds
        // the write buffer taken and is copied (as are those a roll moved).
        if i % 3 != 1 {
            store.flush(&mut io).unwrap();
            assert_eq!(lent.lent(), 0, "the flush gave the adopted buffer back");
        }
    }
    store.flush(&mut io).unwrap();
    assert!(adopted > 40, "adopted {adopted} of 120");
    assert!(copied > 20, "copied {copied} of 120");
    assert!(store.sealed_segments().count() >= 2, "rolls were crossed");
    let read = read_all(&mut io, &mut store);
    assert_eq!(read, expected);
    store.close(&mut io).unwrap();
    // Recovery verifies every batch it walks: the in-place writes are
    // well-formed on disk.
    let mut store = PartitionStore::open(&mut io, Path::new("/p"), 1, small_config()).unwrap();
    assert_eq!(read_all(&mut io, &mut store), expected);
    store.close(&mut io).unwrap();
}

#[test]
fn an_owned_batch_buffer_goes_home_when_its_write_fails() {
    let mut io = SimBackend::new(42);
    let (mut store, pool) = create(&mut io, "/p", 2);
    let lent = pool.write_buffers();
    let batch = next_batch(&store, 2, 700, 1);
    store
        .append_owned(&mut io, lend_with(&pool, &store, &batch))
        .unwrap();
    assert_eq!(lent.lent(), 1, "adopted: the write buffer is the lent one");
    io.inject(
        FaultOp::Write,
        io.op_count(FaultOp::Write),
        Fault::Errno(libc::EIO),
    );
    match store.flush(&mut io) {
        Err(StoreError::Fenced { .. }) => {}
        other => panic!("expected Fenced, got {other:?}"),
    }
    assert_eq!(lent.lent(), 0, "the failed write's buffer went home");
    assert_eq!(lent.idle(), 1);
    // Fenced: a refused owned batch comes back, and dropping it sends it home.
    let buf = pool.lend_batch(store.batch_lead_bytes()).unwrap();
    let refused = store.append_owned(&mut io, buf).unwrap_err();
    assert!(matches!(refused.error, StoreError::Fenced { .. }));
    drop(refused);
    assert_eq!(lent.lent(), 0);
    let _ = store.close(&mut io);
}

#[test]
fn lending_stops_at_the_bound_and_resumes_when_a_flush_completes() {
    let mut io = SimBackend::new(43);
    let (mut store, pool) = create(&mut io, "/p", 2);
    let first = next_batch(&store, 1, 500, 1);
    store
        .append_owned(&mut io, lend_with(&pool, &store, &first))
        .unwrap();
    // The first flush in flight holds the first lent buffer...
    let mut sqes = Vec::new();
    assert!(store.prepare_flush(&mut sqes).unwrap() > 0);
    let id = ringlog_storage::io::IoBackend::submit_nowait(&mut io, sqes);
    // ...the second batch's buffer is the next write buffer...
    let second = next_batch(&store, 1, 500, 2);
    store
        .append_owned(&mut io, lend_with(&pool, &store, &second))
        .unwrap();
    // ...so a third lend is refused.
    assert_eq!(
        pool.lend_batch(0).unwrap_err(),
        PoolExhausted { lent_max: 2 }
    );
    let completions = loop {
        let mut reaped = ringlog_storage::io::IoBackend::reap(&mut io);
        if let Some(i) = reaped.iter().position(|(b, _)| *b == id) {
            break reaped.swap_remove(i).1;
        }
    };
    store.complete_flush(completions).unwrap();
    let third = pool
        .lend_batch(store.batch_lead_bytes())
        .expect("the completed flush gave its buffer back");
    drop(third);
    store.flush(&mut io).unwrap();
    assert_eq!(pool.write_buffers().lent(), 0);
    let read: Vec<_> = read_all(&mut io, &mut store)
        .into_iter()
        .map(|(_, b)| b)
        .collect();
    assert_eq!(read, vec![first, second]);
    store.close(&mut io).unwrap();
}

#[test]
fn a_refused_owned_batch_comes_back_untouched_and_can_be_appended_again() {
    let mut io = SimBackend::new(44);
    let (mut store, pool) = create(&mut io, "/p", 4);
    let config: StoreConfig = store.config().clone();
    let a = next_batch(&store, 3, 1000, 1);
    store
        .append_owned(&mut io, lend_with(&pool, &store, &a))
        .unwrap();
    // A batch that does not continue the log.
    let stale = lend_with(&pool, &store, &a);
    let refused = store.append_owned(&mut io, stale).unwrap_err();
    assert!(matches!(refused.error, StoreError::OffsetMismatch { .. }));
    assert_eq!(refused.batch.batch(), &a[..]);
    drop(refused);

    // With a flush in flight, a batch that would overflow the write buffer
    // must wait: refused, handed back, appended once the flush completed.
    let mut sqes = Vec::new();
    store.prepare_flush(&mut sqes).unwrap();
    let id = ringlog_storage::io::IoBackend::submit_nowait(&mut io, sqes);
    let b = next_batch(&store, 3, 1000, 2);
    store
        .append_owned(&mut io, lend_with(&pool, &store, &b))
        .unwrap();
    let big = next_batch(&store, 8, 1300, 3);
    assert!(a.len() + b.len() + big.len() > config.write_buffer_bytes);
    assert!(big.len() <= config.batch_bytes_max());
    let refused = store
        .append_owned(&mut io, lend_with(&pool, &store, &big))
        .unwrap_err();
    assert!(matches!(refused.error, StoreError::FlushInFlight { .. }));
    assert_eq!(refused.batch.batch(), &big[..]);
    let completions = loop {
        let mut reaped = ringlog_storage::io::IoBackend::reap(&mut io);
        if let Some(i) = reaped.iter().position(|(b, _)| *b == id) {
            break reaped.swap_remove(i).1;
        }
    };
    store.complete_flush(completions).unwrap();
    store.append_owned(&mut io, refused.batch).unwrap();
    store.flush(&mut io).unwrap();
    let read: Vec<_> = read_all(&mut io, &mut store)
        .into_iter()
        .map(|(_, b)| b)
        .collect();
    assert_eq!(read, vec![a, b, big]);
    store.close(&mut io).unwrap();
}
