//! The read cache (`store/cache.rs`): tailing reads served from memory,
//! never a non-durable or stale byte (tail cut, install, purge, retention),
//! the memory bound, and the same bytes as the device path.

mod common;

use std::path::Path;

use common::{create_cached, make_batch, next_batch, read_all, small_config};
use proptest::prelude::*;
use ringlog_protocol::manifest::{Manifest, ManifestLimits};
use ringlog_storage::io::sim::{Fault, FaultOp, SimBackend};
use ringlog_storage::io::IoBackend;
use ringlog_storage::store::{
    InstallBudget, PartitionStore, PoolConfig, StoreConfig, StoreError, StorePool,
};

const PID: u32 = 7;
const CACHE_BYTES: usize = 8 << 20;

fn dir(name: &str) -> &Path {
    Path::new(name)
}

/// `n` batches of 3 records, one flush each, values from `seed`.
fn append(io: &mut SimBackend, store: &mut PartitionStore, n: u64, seed: u64) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| {
            let batch = next_batch(store, 3, 600, seed * 1000 + i);
            store.append(io, &batch).unwrap();
            store.flush(io).unwrap();
            batch
        })
        .collect()
}

/// Every batch from the log start, one read each (`max_bytes` 1: the read
/// returns exactly the batch holding the offset).
fn read_each(io: &mut SimBackend, store: &mut PartitionStore) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut offset = store.log_start_offset();
    while offset < store.durable().next_offset {
        let f = store.read(io, offset, 1).unwrap();
        out.push(f.bytes);
        offset = f.next_offset;
    }
    out
}

fn batches_of(store_reads: Vec<(u64, Vec<u8>)>) -> Vec<Vec<u8>> {
    store_reads.into_iter().map(|(_, b)| b).collect()
}

#[test]
fn a_tailing_consumer_is_served_from_memory_without_device_reads() {
    let mut io = SimBackend::new(1);
    let mut store = create_cached(&mut io, dir("/hot"), PID, small_config(), CACHE_BYTES);
    // Several segment rolls (64 KiB segments): reads stop at each segment
    // end as on disk, and the next read continues from memory.
    let written = append(&mut io, &mut store, 120, 1);
    assert!(store.sealed_segments().count() >= 3);
    let reads_before = io.op_count(FaultOp::Read);
    assert_eq!(batches_of(read_all(&mut io, &mut store)), written);
    assert_eq!(read_each(&mut io, &mut store), written);
    assert_eq!(
        io.op_count(FaultOp::Read),
        reads_before,
        "a hit read the device"
    );
    let stats = store.read_cache_stats();
    assert_eq!(stats.misses, 0);
    assert!(stats.hits >= 120);
    let total: usize = written.iter().map(Vec::len).sum();
    assert_eq!(stats.served_bytes as usize, 2 * total);

    // The same log without a cache reads the device for every batch.
    let mut cold_io = SimBackend::new(1);
    let mut cold = create_cached(&mut cold_io, dir("/cold"), PID, small_config(), 0);
    append(&mut cold_io, &mut cold, 120, 1);
    let reads_before = cold_io.op_count(FaultOp::Read);
    assert_eq!(read_each(&mut cold_io, &mut cold), written);
    assert!(cold_io.op_count(FaultOp::Read) >= reads_before + 120);
}

#[test]
fn bytes_not_yet_durable_are_never_served() {
    let mut io = SimBackend::new(2);
    let mut store = create_cached(&mut io, dir("/nd"), PID, small_config(), CACHE_BYTES);
    let written = append(&mut io, &mut store, 3, 2);
    let end = store.durable().next_offset;
    let b = next_batch(&store, 3, 600, 99);
    store.append(&mut io, &b).unwrap();
    // Accepted, then in flight: neither is readable.
    assert!(store.read(&mut io, end, 1 << 20).unwrap().bytes.is_empty());
    let mut sqes = Vec::new();
    store.prepare_flush(&mut sqes).unwrap();
    assert!(store.read(&mut io, end, 1 << 20).unwrap().bytes.is_empty());
    let completions = io.submit(sqes);
    store.complete_flush(completions).unwrap();
    assert_eq!(store.read(&mut io, end, 1 << 20).unwrap().bytes, b);
    // A flush that failed makes nothing readable (the store is fenced).
    let c = next_batch(&store, 3, 600, 100);
    store.append(&mut io, &c).unwrap();
    io.inject(FaultOp::Write, io.op_count(FaultOp::Write), fail());
    assert!(store.flush(&mut io).is_err());
    assert!(matches!(
        store.read(&mut io, end, 1 << 20),
        Err(StoreError::Fenced { .. })
    ));
    let _ = written;
}

fn fail() -> Fault {
    Fault::Errno(libc::EIO)
}

/// A tail cut followed by different batches at the same offsets: every
/// read returns the new ones. Fails without the cut's invalidation (a read
/// from below the cut ran on through the old cached tail).
#[test]
fn a_cut_tail_is_not_served_from_memory_after_other_bytes_replace_it() {
    let mut io = SimBackend::new(3);
    let mut store = create_cached(&mut io, dir("/cut"), PID, small_config(), CACHE_BYTES);
    let mut expected = append(&mut io, &mut store, 6, 3);
    // Cache the whole tail, as a consumer would.
    assert_eq!(batches_of(read_all(&mut io, &mut store)), expected);
    // Batches carry op = base offset + 1; keep three (offsets 0, 3, 6).
    let keep_op = 6 + 1;
    store.truncate_above(&mut io, keep_op).unwrap();
    expected.truncate(3);
    assert_eq!(store.durable().next_offset, 9);
    expected.extend(append(&mut io, &mut store, 4, 33));
    assert_eq!(batches_of(read_all(&mut io, &mut store)), expected);
    assert_eq!(read_each(&mut io, &mut store), expected);
    assert!(store.read_cache_stats().hits > 0);
}

fn install_from(
    src_io: &mut SimBackend,
    src: &mut PartitionStore,
    io: &mut SimBackend,
    dst: &mut PartitionStore,
) {
    let now_ms = 1_000_000;
    let manifest = src.open_snapshot(src_io, now_ms).unwrap();
    let mut chunks = Vec::new();
    for (a, artifact) in manifest.artifacts.iter().enumerate() {
        for c in 0..artifact.chunk_checksums.len() as u32 {
            let buf = src
                .read_chunk(src_io, manifest.snapshot_id, a as u32, c, now_ms)
                .unwrap();
            chunks.push((a as u32, c, buf.to_vec()));
        }
    }
    src.release_snapshot(manifest.snapshot_id);
    let manifest = Manifest::decode(&manifest.encode(), &ManifestLimits::default()).unwrap();
    let mut install = dst
        .begin_install(io, manifest, &InstallBudget::new(4 << 20))
        .unwrap();
    for (a, c, bytes) in &chunks {
        install.accept_chunk(io, *a, *c, bytes).unwrap();
    }
    dst.commit_install(io, install).unwrap();
}

/// An install replaces the log with a peer's, whose batches at the offsets
/// the cache held differ. Fails without the generation switch's
/// invalidation (one-batch reads were answered from the old log).
#[test]
fn an_install_replaces_what_memory_serves() {
    let mut io = SimBackend::new(4);
    let mut dst = create_cached(&mut io, dir("/dst"), PID, small_config(), CACHE_BYTES);
    let old = append(&mut io, &mut dst, 12, 4);
    assert_eq!(read_each(&mut io, &mut dst), old);
    let mut src_io = SimBackend::new(5);
    let mut src = PartitionStore::create(&mut src_io, dir("/src"), PID, small_config()).unwrap();
    let new = append(&mut src_io, &mut src, 40, 44);
    install_from(&mut src_io, &mut src, &mut io, &mut dst);
    assert_eq!(read_each(&mut io, &mut dst), new);
    assert_eq!(batches_of(read_all(&mut io, &mut dst)), new);
    // Appends after the install are cached and served again.
    let more = append(&mut io, &mut dst, 2, 45);
    let end = dst.durable().next_offset;
    let hits = dst.read_cache_stats().hits;
    let tail = dst.read(&mut io, end - 6, 1 << 20).unwrap();
    assert_eq!(tail.bytes, more.concat());
    assert_eq!(dst.read_cache_stats().hits, hits + 1);
}

/// Purge, retention and closing a store release what they made unreadable.
/// Fails without each invalidation (the memory stays held).
#[test]
fn purge_retention_and_close_release_the_cached_bytes() {
    let mut io = SimBackend::new(6);
    let pool = StorePool::new(
        "/pool-recycle".into(),
        PoolConfig {
            read_cache_bytes_max: 256 * 1024,
            ..PoolConfig::private(&small_config())
        },
    );
    pool.load_recycled(&mut io).unwrap();
    let config = StoreConfig {
        retention_bytes: Some(128 * 1024),
        ..small_config()
    };
    let mut a =
        PartitionStore::create_in(&mut io, dir("/a"), PID, config.clone(), pool.clone()).unwrap();
    append(&mut io, &mut a, 120, 6);
    let held = pool.read_cache_stats().held_bytes;
    assert!(held > 128 * 1024, "held {held}");
    let removed = a.apply_retention(&mut io, 0).unwrap();
    assert!(removed.segments_removed > 0);
    let after = pool.read_cache_stats().held_bytes;
    assert!(
        after + removed.bytes_removed / 2 <= held,
        "retention removed {} bytes, the cache went from {held} to {after}",
        removed.bytes_removed
    );
    // What remains is still served, and is the log.
    let kept = read_each(&mut io, &mut a);
    assert_eq!(batches_of(read_all(&mut io, &mut a)), kept);

    a.purge(&mut io).unwrap();
    assert_eq!(
        pool.read_cache_stats().held_bytes,
        0,
        "purge kept cached bytes"
    );
    append(&mut io, &mut a, 2, 7);
    assert!(pool.read_cache_stats().held_bytes > 0);
    a.close(&mut io).unwrap();
    assert_eq!(
        pool.read_cache_stats().held_bytes,
        0,
        "close kept cached bytes"
    );
}

/// Four partitions share one pool whose cache is far smaller than what
/// they write: it never holds more than its bound, evicts the oldest, and
/// still serves the newest flushes.
#[test]
fn a_shared_cache_never_holds_more_than_its_bound() {
    let mut io = SimBackend::new(8);
    let bytes_max = 192 * 1024;
    let pool = StorePool::new(
        "/pool-recycle".into(),
        PoolConfig {
            read_cache_bytes_max: bytes_max,
            ..PoolConfig::private(&small_config())
        },
    );
    pool.load_recycled(&mut io).unwrap();
    let mut stores: Vec<PartitionStore> = (0..4)
        .map(|i| {
            let d = format!("/s{i}");
            PartitionStore::create_in(
                &mut io,
                Path::new(&d),
                PID + i,
                small_config(),
                pool.clone(),
            )
            .unwrap()
        })
        .collect();
    let mut peak = 0;
    for round in 0..100u64 {
        for (i, s) in stores.iter_mut().enumerate() {
            let b = make_batch(
                s.partition_id(),
                s.next_offset(),
                s.last_checksum(),
                3,
                900,
                round * 10 + i as u64,
            );
            s.append(&mut io, &b).unwrap();
            s.flush(&mut io).unwrap();
            let held = pool.read_cache_stats().held_bytes;
            assert!(held <= bytes_max as u64, "held {held} of {bytes_max}");
            peak = peak.max(held);
        }
    }
    let stats = pool.read_cache_stats();
    assert!(stats.evictions > 0);
    // 4 x 100 batches of ~2.8 KiB: ~1.1 MiB written, the bound is 192 KiB.
    assert!(peak > bytes_max as u64 / 2, "peak {peak}");
    // The newest batches are hits, the oldest misses.
    let reads = io.op_count(FaultOp::Read);
    let s = &mut stores[3];
    let end = s.durable().next_offset;
    s.read(&mut io, end - 3, 1 << 20).unwrap();
    assert_eq!(io.op_count(FaultOp::Read), reads);
    s.read(&mut io, 0, 1).unwrap();
    assert!(io.op_count(FaultOp::Read) > reads);
}

#[derive(Clone, Debug)]
enum Action {
    Append {
        records: u32,
        value_len: usize,
    },
    Flush,
    /// A read from `at` (per mille of the log) of up to `max_bytes`.
    Read {
        at: u16,
        max_bytes: usize,
    },
    /// A cut keeping `keep` per mille of the log's ops.
    Cut {
        keep: u16,
    },
    Retention,
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        6 => (1u32..6, 10usize..3000).prop_map(|(records, value_len)| Action::Append { records, value_len }),
        3 => Just(Action::Flush),
        6 => (0u16..=1000, prop_oneof![Just(1usize), 1usize..20_000, Just(1 << 20)])
            .prop_map(|(at, max_bytes)| Action::Read { at, max_bytes }),
        1 => (0u16..=1000).prop_map(|keep| Action::Cut { keep }),
        1 => Just(Action::Retention),
    ]
}

/// One step on `store`; what a read or a refusal returned, for comparing.
fn step(io: &mut SimBackend, store: &mut PartitionStore, action: &Action, seed: u64) -> String {
    match *action {
        Action::Append { records, value_len } => {
            let b = next_batch(store, records, value_len, seed);
            format!("{:?}", store.append(io, &b).map(|_| ()))
        }
        Action::Flush => format!("{:?}", store.flush(io)),
        Action::Read { at, max_bytes } => {
            let start = store.log_start_offset();
            let end = store.durable().next_offset;
            let offset = start + (end - start) * u64::from(at) / 1000;
            format!("{:?}", store.read(io, offset, max_bytes))
        }
        Action::Cut { keep } => {
            let op = store.chain().last_op * u64::from(keep) / 1000;
            format!("{:?}", store.truncate_above(io, op).map(|c| c.next_offset))
        }
        Action::Retention => format!("{:?}", store.apply_retention(io, 0)),
    }
}

fn same_answers(actions: &[Action]) {
    let config = StoreConfig {
        retention_bytes: Some(160 * 1024),
        ..small_config()
    };
    let mut hot_io = SimBackend::new(9);
    let mut cold_io = SimBackend::new(9);
    // A small cache, so eviction runs too.
    let mut hot = create_cached(&mut hot_io, dir("/p"), PID, config.clone(), 96 * 1024);
    let mut cold = create_cached(&mut cold_io, dir("/p"), PID, config, 0);
    for (i, a) in actions.iter().enumerate() {
        let h = step(&mut hot_io, &mut hot, a, i as u64);
        let c = step(&mut cold_io, &mut cold, a, i as u64);
        assert_eq!(h, c, "step {i}: {a:?}");
    }
    hot.flush(&mut hot_io).unwrap();
    cold.flush(&mut cold_io).unwrap();
    assert_eq!(
        read_each(&mut hot_io, &mut hot),
        read_each(&mut cold_io, &mut cold)
    );
    assert_eq!(
        read_all(&mut hot_io, &mut hot),
        read_all(&mut cold_io, &mut cold)
    );
    assert_eq!(cold.read_cache_stats().hits, 0);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn reads_from_memory_equal_reads_from_the_device(actions in proptest::collection::vec(action(), 1..120)) {
        same_answers(&actions);
    }
}

/// A fixed history through every action, so the property's paths run even
/// if the random cases happen to miss one; the cache must answer some reads.
#[test]
fn a_fixed_history_reads_the_same_with_and_without_the_cache() {
    let mut actions = Vec::new();
    for round in 0..40u16 {
        actions.push(Action::Append {
            records: 3,
            value_len: 1500 + usize::from(round) * 37,
        });
        if round % 2 == 0 {
            actions.push(Action::Flush);
        }
        actions.push(Action::Read {
            at: 1000 - round * 7,
            max_bytes: 1 + usize::from(round) * 997,
        });
        if round % 13 == 12 {
            actions.push(Action::Cut { keep: 950 });
        }
        if round % 17 == 16 {
            actions.push(Action::Retention);
        }
    }
    same_answers(&actions);
    let mut io = SimBackend::new(9);
    let mut hot = create_cached(&mut io, dir("/h"), PID, small_config(), 96 * 1024);
    for a in &actions {
        step(&mut io, &mut hot, a, 0);
    }
    assert!(hot.read_cache_stats().hits > 0);
}

/// Every read from the log start into one reused buffer of `capacity`
/// bytes: each answer equals `read`'s, and the buffer is reallocated only
/// when an answer does not fit it.
fn read_into_reused(
    io: &mut SimBackend,
    store: &mut PartitionStore,
    capacity: usize,
    max_bytes: usize,
) -> usize {
    let mut buf = Vec::with_capacity(capacity);
    let mut offset = store.log_start_offset();
    let mut reads = 0;
    while offset < store.durable().next_offset {
        let want = store.read(io, offset, max_bytes).unwrap();
        let at = buf.as_ptr();
        let fits = want.bytes.len() <= buf.capacity();
        let got = store.read_into(io, offset, max_bytes, buf).unwrap();
        assert_eq!(got, want, "at offset {offset}");
        if fits {
            assert_eq!(got.bytes.as_ptr(), at, "a reply that fits was reallocated");
        }
        offset = got.next_offset;
        buf = got.bytes;
        reads += 1;
    }
    reads
}

#[test]
fn read_into_writes_the_same_bytes_into_the_callers_buffer_hot_and_cold() {
    for cache_bytes in [CACHE_BYTES, 0] {
        let mut io = SimBackend::new(9);
        let mut store = create_cached(&mut io, dir("/into"), PID, small_config(), cache_bytes);
        append(&mut io, &mut store, 60, 9);
        let reads_before = io.op_count(FaultOp::Read);
        // Reads of many batches, of one, and a buffer smaller than a batch
        // (it grows, then is reused).
        for (capacity, max_bytes) in [(64 << 10, 1 << 20), (4096, 1), (16, 8 << 10)] {
            assert!(read_into_reused(&mut io, &mut store, capacity, max_bytes) > 1);
        }
        let device_reads = io.op_count(FaultOp::Read) - reads_before;
        assert_eq!(device_reads == 0, cache_bytes > 0, "{device_reads} reads");
    }
}

#[test]
fn a_read_that_misses_the_cache_leaves_no_cached_bytes_in_the_buffer() {
    // A cache of 64 KiB keeps only the newest ~30 batches: reads from the
    // start miss and go to the device, tail reads hit.
    let mut io = SimBackend::new(10);
    let mut store = create_cached(&mut io, dir("/miss"), PID, small_config(), 64 << 10);
    append(&mut io, &mut store, 120, 10);
    read_into_reused(&mut io, &mut store, 1 << 20, 1 << 20);
    let stats = store.read_cache_stats();
    assert!(stats.misses > 0 && stats.hits > 0, "{stats:?}");
}

#[test]
fn large_flushes_are_kept_as_their_written_buffer_and_their_lends_end() {
    let mut io = SimBackend::new(3);
    let config = StoreConfig {
        segment_size_bytes: 64 << 20,
        write_buffer_bytes: 2 << 20,
        ..StoreConfig::default()
    };
    let pool = StorePool::new(
        dir("/big").join("recycle"),
        PoolConfig {
            read_cache_bytes_max: 2 * CACHE_BYTES,
            batch_buffers_lent_max: 2,
            ..PoolConfig::private(&config)
        },
    );
    let mut store =
        PartitionStore::create_in(&mut io, dir("/big"), PID, config, pool.clone()).unwrap();
    let mut written = Vec::new();
    // Three times the lend bound: each lent buffer's lend ends when its
    // flush completed, though the cache keeps the buffer.
    for i in 0..6 {
        let batch = next_batch(&store, 1000, 1000, i);
        let mut buf = pool.lend_batch(store.batch_lead_bytes()).unwrap();
        buf.extend_from_slice(&batch);
        store.append_owned(&mut io, buf).unwrap();
        store.flush(&mut io).unwrap();
        written.push(batch);
    }
    let stats = store.read_cache_stats();
    assert!(
        stats.held_bytes >= 6 * (2 << 20),
        "the buffers are held whole: {stats:?}"
    );
    let reads_before = io.op_count(FaultOp::Read);
    assert_eq!(read_each(&mut io, &mut store), written);
    assert_eq!(
        io.op_count(FaultOp::Read),
        reads_before,
        "a hit read the device"
    );
    assert_eq!(store.read_cache_stats().misses, 0);
    // Past the bound, the oldest buffers are evicted; reads of them miss
    // and read the same bytes from the device.
    for i in 6..12 {
        let batch = next_batch(&store, 1000, 1000, i);
        store.append(&mut io, &batch).unwrap();
        store.flush(&mut io).unwrap();
        written.push(batch);
    }
    let stats = store.read_cache_stats();
    assert!(stats.evictions > 0 && stats.held_bytes <= 2 * CACHE_BYTES as u64);
    assert_eq!(read_each(&mut io, &mut store), written);
    assert!(store.read_cache_stats().misses > 0);
}
