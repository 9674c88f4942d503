//! Sequential read-ahead (`store/readahead.rs`): the next fetch's device
//! read queued while a reply is sent, served with the bytes a device read
//! gives, never past the durable end of its time, never after a tail cut or
//! purge, bounded per pool, and a failed one is not fatal.

mod common;

use std::path::Path;

use common::{next_batch, small_config};
use ringlog_storage::io::sim::{Fault, FaultOp, SimBackend};
use ringlog_storage::io::IoBackend;
use ringlog_storage::store::{PartitionStore, PoolConfig, StorePool};

const PID: u32 = 9;

fn pool(io: &mut SimBackend, read_ahead_bytes_max: usize) -> StorePool {
    let pool = StorePool::new(
        "/pool-recycle".into(),
        PoolConfig {
            read_ahead_bytes_max,
            ..PoolConfig::private(&small_config())
        },
    );
    pool.load_recycled(io).unwrap();
    pool
}

fn create(io: &mut SimBackend, pool: &StorePool, dir: &str) -> PartitionStore {
    PartitionStore::create_in(io, Path::new(dir), PID, small_config(), pool.clone()).unwrap()
}

/// `n` batches of 3 records, one flush each, values from `seed`.
fn append(io: &mut SimBackend, store: &mut PartitionStore, n: u64, seed: u64) -> Vec<u8> {
    let mut all = Vec::new();
    for i in 0..n {
        let batch = next_batch(store, 3, 600, seed * 1000 + i);
        store.append(io, &batch).unwrap();
        store.flush(io).unwrap();
        all.extend_from_slice(&batch);
    }
    all
}

/// Reaps every batch in flight as the shard does, offering each to
/// read-ahead first (nothing else runs without being waited for here).
fn reap_all(io: &mut SimBackend, pool: &StorePool) {
    while io.batches_running() > 0 {
        for (id, completions) in io.reap() {
            assert!(
                pool.complete_read_ahead(id, completions).is_none(),
                "only read-aheads are queued without waiting"
            );
        }
    }
}

/// Reads from `offset` to the durable end, reaping between reads (the
/// shard reaps while it sends the reply); returns the bytes and the reads.
fn consume(
    io: &mut SimBackend,
    pool: &StorePool,
    store: &mut PartitionStore,
    mut offset: u64,
    max_bytes: usize,
) -> (Vec<u8>, u64) {
    let mut out = Vec::new();
    let mut reads = 0;
    while offset < store.durable().next_offset {
        let f = store.read(io, offset, max_bytes).unwrap();
        assert!(f.next_offset > offset);
        out.extend_from_slice(&f.bytes);
        offset = f.next_offset;
        reads += 1;
        reap_all(io, pool);
    }
    (out, reads)
}

/// Every read after the first is served by the read queued behind the one
/// before, across segment rolls, with the device's bytes and no second
/// device read of them.
#[test]
fn a_sequential_consumer_is_served_from_read_ahead_with_the_device_bytes() {
    let mut io = SimBackend::new(1);
    let pool = pool(&mut io, 1 << 20);
    let mut store = create(&mut io, &pool, "/seq");
    let written = append(&mut io, &mut store, 120, 1);
    assert!(store.sealed_segments().count() >= 3);
    let device_reads = io.op_count(FaultOp::Read);
    let (got, reads) = consume(&mut io, &pool, &mut store, 0, 8 * 1024);
    assert_eq!(got, written);
    let s = pool.read_ahead_stats();
    assert_eq!(s.hits, reads - 1, "{s:?}");
    assert_eq!((s.wasted, s.errors, s.refused), (0, 0, 0), "{s:?}");
    // The last read ended at the durable end: nothing was read past it.
    assert_eq!(s.issued, s.hits);
    assert_eq!(s.held_bytes, 0);
    assert_eq!(
        io.op_count(FaultOp::Read) - device_reads,
        s.issued + 1,
        "a read-ahead's bytes were read again"
    );
}

/// A read-ahead planned when the durable end was early in a block, served after
/// more batches became durable (the flush rewrote that block): the reply
/// runs on through the new batches, read from the device. Fails if the
/// read-ahead's bytes past its durable end are used (that block's old
/// padding and trailer: corruption).
#[test]
fn read_ahead_never_serves_bytes_past_the_durable_end_it_was_read_at() {
    let mut io = SimBackend::new(2);
    let pool = pool(&mut io, 1 << 20);
    let mut store = create(&mut io, &pool, "/end");
    // Two batches of ~1 KiB: a 1500-byte fetch takes one, and the read
    // queued for the next such fetch covers the rest of the block, past
    // the durable end (~2 KiB in).
    let mut written = Vec::new();
    for i in 0..2 {
        let batch = next_batch(&store, 3, 300, 200 + i);
        store.append(&mut io, &batch).unwrap();
        store.flush(&mut io).unwrap();
        written.extend_from_slice(&batch);
    }
    assert!(written.len() < 3000);
    let first = store.read(&mut io, 0, 1500).unwrap();
    assert!(first.bytes.len() < 1500);
    assert_eq!(pool.read_ahead_stats().issued, 1);
    reap_all(&mut io, &pool);
    let more = append(&mut io, &mut store, 5, 22);
    written.extend_from_slice(&more);
    let rest = store.read(&mut io, first.next_offset, 1 << 20).unwrap();
    assert_eq!(pool.read_ahead_stats().hits, 1);
    assert_eq!([first.bytes, rest.bytes].concat(), written);
    assert_eq!(rest.next_offset, store.durable().next_offset);
    // At the durable end nothing is read ahead.
    assert_eq!(pool.read_ahead_stats().issued, 1);
    assert_eq!(pool.read_ahead_stats().held_bytes, 0);
}

/// Reads one batch at a time up to offset 9 (batches hold 3 records), so a
/// read-ahead for offset 9 is queued (and, if `reap`, held).
fn read_up_to_9(io: &mut SimBackend, pool: &StorePool, store: &mut PartitionStore, reap: bool) {
    let mut offset = 0;
    while offset < 9 {
        offset = store.read(io, offset, 1).unwrap().next_offset;
        if reap || offset < 9 {
            reap_all(io, pool);
        }
    }
    assert!(store.read_ahead_pending(9) != reap);
}

/// A tail cut then other batches at the same offsets: the read-ahead of
/// the old tail, held or still in flight at the cut, is never served (it
/// has the same file and position as the new bytes). Purge drops a held
/// one's memory.
#[test]
fn a_tail_cut_or_purge_drops_the_read_ahead_so_it_is_never_served_stale() {
    for reap in [true, false] {
        let mut io = SimBackend::new(3);
        let pool = pool(&mut io, 1 << 20);
        let mut store = create(&mut io, &pool, "/cut");
        append(&mut io, &mut store, 6, 3);
        read_up_to_9(&mut io, &pool, &mut store, reap);
        // Batches carry op = base offset + 1: keep offsets 0, 3 and 6.
        store.truncate_above(&mut io, 7).unwrap();
        assert_eq!(store.durable().next_offset, 9);
        reap_all(&mut io, &pool);
        let new = append(&mut io, &mut store, 4, 33);
        let hits = pool.read_ahead_stats().hits;
        let got = store.read(&mut io, 9, 1 << 20).unwrap();
        assert_eq!(got.bytes, new, "reap={reap}");
        assert_eq!(pool.read_ahead_stats().hits, hits);
        assert!(pool.read_ahead_stats().wasted >= 1);
    }
    let mut io = SimBackend::new(4);
    let pool = pool(&mut io, 1 << 20);
    let mut store = create(&mut io, &pool, "/purge");
    append(&mut io, &mut store, 6, 4);
    read_up_to_9(&mut io, &pool, &mut store, true);
    assert!(pool.read_ahead_stats().held_bytes > 0);
    store.purge(&mut io).unwrap();
    assert_eq!(pool.read_ahead_stats().held_bytes, 0, "purge kept it");
}

/// EIO on the read queued ahead: counted, the partition stays healthy, and
/// the fetch it was for reads the device itself and gets the right bytes.
#[test]
fn a_failed_read_ahead_is_not_fatal_and_the_fetch_reads_the_device() {
    let mut io = SimBackend::new(5);
    let pool = pool(&mut io, 1 << 20);
    let mut store = create(&mut io, &pool, "/eio");
    let written = append(&mut io, &mut store, 20, 5);
    let first = store.read(&mut io, 0, 1).unwrap();
    // The next device read is the read-ahead's (queued, not run yet).
    assert!(store.read_ahead_pending(first.next_offset));
    io.inject(
        FaultOp::Read,
        io.op_count(FaultOp::Read),
        Fault::Errno(libc::EIO),
    );
    reap_all(&mut io, &pool);
    assert_eq!(pool.read_ahead_stats().errors, 1);
    assert_eq!(pool.read_ahead_stats().held_bytes, 0);
    let rest = store.read(&mut io, first.next_offset, 1 << 20).unwrap();
    assert_eq!(pool.read_ahead_stats().hits, 0);
    assert_eq!([first.bytes, rest.bytes].concat(), written);
    // Not fenced: appends are still made durable.
    let more = append(&mut io, &mut store, 1, 55);
    reap_all(&mut io, &pool);
    let end = store.read(&mut io, rest.next_offset, 1 << 20).unwrap();
    assert_eq!(end.bytes, more);
}

/// Two partitions, a pool bound of one read-ahead: the
/// second consumer's is refused (it reads the device as before) while the
/// first one's is held; the memory held never exceeds the bound.
#[test]
fn the_pool_bound_refuses_read_ahead_past_it() {
    let mut io = SimBackend::new(6);
    // A read-ahead for 8 KiB fetches is 12 or 16 KiB (8 KiB and a header
    // from an unaligned position): room for one.
    let pool = pool(&mut io, 20 * 1024);
    let mut a = create(&mut io, &pool, "/a");
    let mut b = create(&mut io, &pool, "/b");
    let wa = append(&mut io, &mut a, 20, 6);
    let wb = append(&mut io, &mut b, 20, 7);
    let fa = a.read(&mut io, 0, 8 * 1024).unwrap();
    let fb = b.read(&mut io, 0, 8 * 1024).unwrap();
    let s = pool.read_ahead_stats();
    assert_eq!((s.issued, s.refused), (1, 1), "{s:?}");
    assert!(s.held_bytes > 0 && s.held_bytes <= s.bytes_max, "{s:?}");
    assert!(a.read_ahead_pending(fa.next_offset));
    assert!(!b.read_ahead_pending(fb.next_offset));
    reap_all(&mut io, &pool);
    // b's next read goes to the device; its later read-aheads may be
    // smaller (at a segment's end) and fit beside a's held one.
    let fb2 = b.read(&mut io, fb.next_offset, 8 * 1024).unwrap();
    assert_eq!(pool.read_ahead_stats().hits, 0);
    reap_all(&mut io, &pool);
    let (rb, _) = consume(&mut io, &pool, &mut b, fb2.next_offset, 8 * 1024);
    assert_eq!([fb.bytes, fb2.bytes, rb].concat(), wb);
    let s = pool.read_ahead_stats();
    assert!(s.held_bytes <= s.bytes_max, "{s:?}");
    let (ra, _) = consume(&mut io, &pool, &mut a, fa.next_offset, 8 * 1024);
    assert_eq!([fa.bytes, ra].concat(), wa);
    let s = pool.read_ahead_stats();
    assert!(s.hits >= 1 && s.held_bytes == 0, "{s:?}");
}
