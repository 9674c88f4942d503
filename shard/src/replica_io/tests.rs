//! The executor on the sim backend: each operation, its failures, and a
//! restart's recovery.

use std::path::Path;

use ringlog_protocol::{BatchBuilder, BatchHeader, Record, Stamp};
use ringlog_storage::io::sim::{Fault, FaultOp, SimBackend};
use ringlog_storage::store::{PartitionStore, StoreConfig};

use super::*;
use crate::vsr::{Config, Replica, Status};

const PID: u32 = 4;
const DIR: &str = "/r0";

fn small_config() -> StoreConfig {
    StoreConfig {
        segment_size_bytes: 16 * 1024,
        write_buffer_bytes: 8 * 1024,
        index_interval_bytes: 1024,
        transfer_chunk_bytes: 4096,
        ..StoreConfig::default()
    }
}

/// Ops 1..=n as a primary would stamp them (view 0, chained), ~`len` bytes.
fn chain(n: u64, len: usize) -> Vec<BatchBytes> {
    let mut out: Vec<BatchBytes> = Vec::new();
    let (mut offset, mut prev) = (0, 0);
    for op in 1..=n {
        let mut b = BatchBuilder::new(PID);
        let value = vec![op as u8; len];
        let record = Record {
            key: b"k",
            headers: &[],
            value: &value,
            timestamp_ms: op,
        };
        b.push(&record).expect("fits");
        let stamp = Stamp {
            base_offset: offset,
            vsr_op: op,
            vsr_view: 0,
            prev_checksum: prev,
        };
        let bytes = b.finish(&stamp).expect("seals");
        let h = BatchHeader::decode(&bytes).expect("decodes");
        offset = h.next_offset();
        prev = h.header_checksum;
        out.push(bytes.into());
    }
    out
}

fn fresh() -> (SimBackend, PartitionStore) {
    let mut io = SimBackend::new(11);
    let store =
        PartitionStore::create(&mut io, Path::new(DIR), PID, small_config()).expect("store");
    (io, store)
}

fn run(store: &mut PartitionStore, io: &mut SimBackend, op: StorageOp) -> IoOutcome {
    execute(store, io, &op).unwrap_or_else(|e| panic!("{op:?}: {e}"))
}

fn append_all(store: &mut PartitionStore, io: &mut SimBackend, batches: &[BatchBytes]) {
    for (i, b) in batches.iter().enumerate() {
        let op = i as u64 + 1;
        let batch = b.clone();
        assert_eq!(
            run(store, io, StorageOp::Append { op, batch }),
            IoOutcome::Done
        );
    }
    run(store, io, StorageOp::Flush);
}

fn read(
    store: &mut PartitionStore,
    io: &mut SimBackend,
    op_min: u64,
    op_max: u64,
) -> Vec<BatchBytes> {
    match run(store, io, StorageOp::ReadBatches { op_min, op_max }) {
        IoOutcome::Batches(b) => b,
        other => panic!("read returned {other:?}"),
    }
}

/// Guards against: appended, flushed ops read back as other bytes, or a
/// read across segment rolls returning gaps or the wrong ops.
#[test]
fn append_flush_read_back_across_segment_rolls() {
    let (mut io, mut store) = fresh();
    let batches = chain(40, 900);
    append_all(&mut store, &mut io, &batches);
    assert!(
        store.sealed_segments().count() >= 2,
        "the test crosses rolls"
    );
    assert_eq!(store.durable().last_op, 40);
    assert_eq!(read(&mut store, &mut io, 1, 40), batches);
    for (lo, hi) in [(1, 1), (7, 19), (33, 40), (40, 40)] {
        let got = read(&mut store, &mut io, lo, hi);
        let want = &batches[lo as usize - 1..hi as usize];
        assert_eq!(got, want, "ops {lo}..={hi}");
    }
    // Beyond the durable end: a prefix, or nothing.
    assert_eq!(read(&mut store, &mut io, 38, 60), &batches[37..]);
    assert!(read(&mut store, &mut io, 41, 50).is_empty());
}

/// Guards against: unflushed ops served to a peer as if durable.
#[test]
fn read_returns_durable_ops_only() {
    let (mut io, mut store) = fresh();
    let batches = chain(3, 100);
    append_all(&mut store, &mut io, &batches[..2]);
    let batch = batches[2].clone();
    run(&mut store, &mut io, StorageOp::Append { op: 3, batch });
    assert_eq!(read(&mut store, &mut io, 1, 3), &batches[..2]);
}

/// Guards against: an append out of op order (a replica and store that
/// disagree) silently written.
#[test]
fn append_out_of_order_is_refused() {
    let (mut io, mut store) = fresh();
    let batches = chain(3, 100);
    let wrong = [
        (2, batches[1].clone()), // skips op 1
        (1, batches[1].clone()), // op field and batch differ
    ];
    for (op, batch) in wrong {
        let err =
            execute(&mut store, &mut io, &StorageOp::Append { op, batch }).expect_err("refused");
        assert!(err.reason.contains(&format!("append of op {op}")), "{err}");
    }
    assert_eq!(store.chain().last_op, 0, "nothing was appended");
}

/// Guards against: view, log_view or commit not durable after PersistVsr
/// (a restart would vote on a view it never made durable, or go back).
#[test]
fn persist_vsr_survives_a_reboot() {
    let (mut io, mut store) = fresh();
    append_all(&mut store, &mut io, &chain(5, 100));
    let state = VsrState {
        view: 4,
        log_view: 3,
        commit: 2,
        wiped: false,
        view_lost: false,
    };
    run(&mut store, &mut io, StorageOp::PersistVsr(state));
    drop(store);
    let mut io = io.reboot();
    let mut store =
        PartitionStore::open(&mut io, Path::new(DIR), PID, small_config()).expect("reopens");
    let r = recover(&mut store, &mut io, 1).expect("recovers");
    assert_eq!(r.durable, state);
    assert_eq!(r.base.op, 1, "anchor is commit less the kept ops");
    let ops: Vec<u64> = r.headers.iter().map(|h| h.vsr_op).collect();
    assert_eq!(ops, [2, 3, 4, 5]);
    assert_eq!(r.headers[0].prev_checksum, r.base.checksum);
}

/// Guards against: a restart claiming ops the crash lost, or losing
/// flushed ones: recovery returns the flushed ops, plus (when the crash
/// let unsynced sectors land) a chained prefix of the rest, never more.
#[test]
fn recover_after_crash_mid_flush_holds_only_what_the_disk_kept() {
    for (seed, tear) in [(1, false), (2, true), (3, true), (4, true)] {
        let mut io = SimBackend::new(seed);
        let mut store =
            PartitionStore::create(&mut io, Path::new(DIR), PID, small_config()).expect("store");
        let batches = chain(6, 300);
        append_all(&mut store, &mut io, &batches[..4]);
        for (i, b) in batches[4..].iter().enumerate() {
            let op = i as u64 + 5;
            let batch = b.clone();
            run(&mut store, &mut io, StorageOp::Append { op, batch });
        }
        // Power fails during the flush's write.
        io.set_crash_at(io.ops_count(), tear);
        let err = execute(&mut store, &mut io, &StorageOp::Flush).expect_err("power failed");
        assert!(err.reason.starts_with("flush"), "{err}");
        drop(store);
        let mut io = io.reboot();
        let mut store =
            PartitionStore::open(&mut io, Path::new(DIR), PID, small_config()).expect("reopens");
        let r = recover(&mut store, &mut io, 0).expect("recovers");
        let ops: Vec<u64> = r.headers.iter().map(|h| h.vsr_op).collect();
        if tear {
            assert!((4..=6).contains(&ops.len()), "seed {seed}: {ops:?}");
        } else {
            assert_eq!(ops.len(), 4, "seed {seed}: synced ops only");
        }
        let want: Vec<BatchHeader> = batches[..ops.len()]
            .iter()
            .map(|b| BatchHeader::decode(b).expect("decodes"))
            .collect();
        assert_eq!(r.headers, want, "seed {seed}");
        assert_eq!(r.durable, VsrState::default());
    }
}

/// Guards against: an fsync failure reported as success, or the replica
/// carrying on writing after it (the store fences; every later write fails).
#[test]
fn injected_fsync_eio_fails_flush_and_fences() {
    let (mut io, mut store) = fresh();
    let batches = chain(2, 100);
    let batch = batches[0].clone();
    run(&mut store, &mut io, StorageOp::Append { op: 1, batch });
    let nth = io.op_count(FaultOp::Sync);
    io.inject(FaultOp::Sync, nth, Fault::Errno(libc::EIO));
    let err = execute(&mut store, &mut io, &StorageOp::Flush).expect_err("EIO");
    assert!(err.reason.contains("flush"), "{err}");
    let batch = batches[1].clone();
    let err =
        execute(&mut store, &mut io, &StorageOp::Append { op: 2, batch }).expect_err("fenced");
    assert!(err.reason.contains("fenced"), "{err}");
    let state = VsrState {
        view: 1,
        log_view: 0,
        commit: 0,
        wiped: false,
        view_lost: false,
    };
    assert!(execute(&mut store, &mut io, &StorageOp::PersistVsr(state)).is_err());
}

/// Guards against: a failed superblock write reported as a durable view.
#[test]
fn injected_write_eio_fails_persist_vsr() {
    let (mut io, mut store) = fresh();
    let nth = io.op_count(FaultOp::Write);
    io.inject(FaultOp::Write, nth, Fault::Errno(libc::EIO));
    let state = VsrState {
        view: 1,
        log_view: 0,
        commit: 0,
        wiped: false,
        view_lost: false,
    };
    let err = execute(&mut store, &mut io, &StorageOp::PersistVsr(state)).expect_err("EIO");
    assert!(err.reason.starts_with("persist vsr"), "{err}");
}

/// Guards against: a read error or a flipped bit handed to a peer as a
/// repair answer.
#[test]
fn injected_read_faults_fail_read_batches() {
    let (mut io, mut store) = fresh();
    append_all(&mut store, &mut io, &chain(4, 100));
    for fault in [Fault::Errno(libc::EIO), Fault::BitFlip] {
        let nth = io.op_count(FaultOp::Read);
        io.inject(FaultOp::Read, nth, fault);
        let op = StorageOp::ReadBatches {
            op_min: 2,
            op_max: 3,
        };
        let err = execute(&mut store, &mut io, &op).expect_err("fault");
        assert!(err.reason.contains("read"), "{fault:?}: {err}");
    }
    assert_eq!(read(&mut store, &mut io, 2, 3).len(), 2, "transient");
}

/// Guards against: cut ops coming back after a reboot, appends not
/// continuing at the cut, or a cut of committed ops accepted.
#[test]
fn truncate_above_cuts_durably_and_refuses_committed_ops() {
    let (mut io, mut store) = fresh();
    let batches = chain(4, 100);
    append_all(&mut store, &mut io, &batches);
    note_event(&mut store, &Event::Committed { op: 2 });
    let err = execute(&mut store, &mut io, &StorageOp::TruncateAbove { op: 1 })
        .expect_err("below commit");
    assert!(err.reason.contains("truncate above op 1"), "{err}");
    assert!(err.reason.contains("refused"), "{err}");
    assert_eq!(store.durable().last_op, 4, "a refused cut changes nothing");
    assert_eq!(
        run(&mut store, &mut io, StorageOp::TruncateAbove { op: 2 }),
        IoOutcome::Done
    );
    assert_eq!(store.chain().last_op, 2);
    assert!(read(&mut store, &mut io, 3, 4).is_empty());
    // A new view's op 3 continues the log at the cut.
    let h2 = BatchHeader::decode(&batches[1]).expect("decodes");
    let mut b = BatchBuilder::new(PID);
    let record = Record {
        key: b"x",
        headers: &[],
        value: b"other",
        timestamp_ms: 9,
    };
    b.push(&record).expect("fits");
    let stamp = Stamp {
        base_offset: h2.next_offset(),
        vsr_op: 3,
        vsr_view: 1,
        prev_checksum: h2.header_checksum,
    };
    let other3 = BatchBytes::from(b.finish(&stamp).expect("seals"));
    let batch = other3.clone();
    run(&mut store, &mut io, StorageOp::Append { op: 3, batch });
    run(&mut store, &mut io, StorageOp::Flush);
    drop(store);
    let mut io = io.reboot();
    let mut store =
        PartitionStore::open(&mut io, Path::new(DIR), PID, small_config()).expect("reopens");
    let got = read(&mut store, &mut io, 1, 4);
    assert_eq!(got, vec![batches[0].clone(), batches[1].clone(), other3]);
}

/// Guards against: booting a lone replica (R = 1) reading its whole log.
/// The server never persists commit at R = 1 (no view change writes the
/// superblock), so `recover` reads every batch above commit 0; a cluster
/// of one takes its durable end as committed and reads only the journal
/// it is asked to keep (none: no read at all).
#[test]
fn lone_recover_reads_only_the_kept_journal() {
    let (mut io, mut store) = fresh();
    let batches = chain(40, 300);
    append_all(&mut store, &mut io, &batches);
    drop(store);
    let mut io = io.reboot();
    let mut store =
        PartitionStore::open(&mut io, Path::new(DIR), PID, small_config()).expect("reopens");
    assert_eq!(store.superblock().vsr.commit, 0, "commit never persisted");
    let headers: Vec<BatchHeader> = batches
        .iter()
        .map(|b| BatchHeader::decode(b).expect("decodes"))
        .collect();

    let reads = io.op_count(FaultOp::Read);
    let all = recover(&mut store, &mut io, 0).expect("recovers");
    assert_eq!(all.headers.len(), 40, "recover reads the whole log");
    assert!(io.op_count(FaultOp::Read) > reads);

    let reads = io.op_count(FaultOp::Read);
    let r = recover_lone(&mut store, &mut io, 0).expect("recovers");
    assert_eq!(io.op_count(FaultOp::Read), reads, "no read at all");
    assert!(r.headers.is_empty());
    let last = headers[39];
    let want = Anchor {
        op: 40,
        checksum: last.header_checksum,
        next_offset: last.next_offset(),
    };
    assert_eq!(r.base, want);
    let replica =
        Replica::restart(Config::new(PID, 1, 0), 1, r.durable, r.base, &r.headers).expect("config");
    assert_eq!((replica.status(), replica.commit()), (Status::Normal, 40));

    let r = recover_lone(&mut store, &mut io, 3).expect("recovers");
    let ops: Vec<u64> = r.headers.iter().map(|h| h.vsr_op).collect();
    assert_eq!(ops, [38, 39, 40]);
    assert_eq!(r.base.op, 37);
    assert_eq!(r.base.checksum, headers[36].header_checksum);

    // A failing read is reported, not papered over.
    let nth = io.op_count(FaultOp::Read);
    io.inject(FaultOp::Read, nth, Fault::Errno(libc::EIO));
    let err = recover_lone(&mut store, &mut io, 3).expect_err("read failed");
    assert!(err.reason.contains("read"), "{err}");
}

/// Guards against: a repair read of ops retention removed answering an
/// empty read (the asker then retried forever, dropped as "failed or
/// stale") instead of Evicted, which the replica turns into RangeEvicted
/// so the asker transfers state.
#[test]
fn read_of_retired_ops_answers_evicted_with_the_lowest_held_op() {
    let (mut io, mut store, batches, held_min) = retired_store();
    let start = store.log_start_offset();
    let op = StorageOp::ReadBatches {
        op_min: 1,
        op_max: 4,
    };
    match run(&mut store, &mut io, op) {
        IoOutcome::Evicted(e) => {
            assert_eq!((e.op_min, e.op_max, e.op_held_min), (1, 4, held_min));
            assert_eq!(e.log_start_offset, start);
            assert_eq!(e.reason, wire::EvictedReason::Retired);
        }
        other => panic!("read of retired op 1: {other:?}"),
    }
    let held = StorageOp::ReadBatches {
        op_min: held_min,
        op_max: held_min,
    };
    match run(&mut store, &mut io, held) {
        IoOutcome::Batches(b) => assert_eq!(b, vec![batches[held_min as usize - 1].clone()]),
        other => panic!("read of held op {held_min}: {other:?}"),
    }
}

/// A store holding ops 1..=80 (committed and flushed) whose retention
/// removed its oldest segments; and the lowest op it still holds.
fn retired_store() -> (SimBackend, PartitionStore, Vec<BatchBytes>, u64) {
    let config = StoreConfig {
        retention_bytes: Some(20 * 1024),
        ..small_config()
    };
    let mut io = SimBackend::new(12);
    let mut store = PartitionStore::create(&mut io, Path::new(DIR), PID, config).expect("store");
    let batches = chain(80, 900);
    append_all(&mut store, &mut io, &batches);
    store.note_commit(80);
    run(
        &mut store,
        &mut io,
        StorageOp::PersistVsr(VsrState {
            commit: 80,
            ..VsrState::default()
        }),
    );
    store.apply_retention(&mut io, 0).expect("retention");
    let start = store.log_start_offset();
    assert!(start > 0, "retention removed no segment");
    let held_min = batches
        .iter()
        .map(|b| BatchHeader::decode(b).expect("decodes"))
        .find(|h| h.base_offset == start)
        .expect("the log starts at a batch")
        .vsr_op;
    (io, store, batches, held_min)
}

/// Guards against: a replica whose store retired old segments failing
/// to boot because the journal it keeps reaches below the log start
/// ("recover: op N is not in the store"): here every sealed segment was
/// retired, so the journal is anchored on the op just below the active
/// segment (from the superblock's frontier; never on an op of the active
/// segment, which may be uncommitted).
#[test]
fn recover_keeps_no_journal_below_the_retired_log_start() {
    let (mut io, mut store, batches, held_min) = retired_store();
    let r = recover(&mut store, &mut io, 1_000).expect("recovers above the log start");
    let below = BatchHeader::decode(&batches[held_min as usize - 2]).expect("decodes");
    assert_eq!(r.base.op, held_min - 1, "anchored below the lowest op held");
    assert_eq!(r.base.checksum, below.header_checksum);
    assert_eq!(r.base.next_offset, store.log_start_offset());
    let ops: Vec<u64> = r.headers.iter().map(|h| h.vsr_op).collect();
    let want: Vec<u64> = (held_min..=80).collect();
    assert_eq!(ops, want);
    assert_eq!(r.durable.commit, 80);
    // A journal that fits above the log start is kept as asked.
    let r = recover(&mut store, &mut io, 5).expect("recovers");
    assert_eq!(r.base.op, 75);
}

/// A store with an uncommitted headroom (rolls seal only committed ops).
fn headroom_config() -> StoreConfig {
    StoreConfig {
        uncommitted_headroom_bytes: Some(8 * 1024),
        ..small_config()
    }
}

/// Guards against: a restarted replica whose superblock commit lags what
/// its store sealed (committed ops: a headroom store rolls only when every
/// op is committed) booting at the stale commit. As primary it then waited
/// for acks of ops it had long committed, which backups that installed a
/// snapshot ending there hold only as their anchor and never ack (seed
/// 9100137 after its server fix: stuck at commit 121 with op 122 sealed
/// and retired). Recovery anchors the journal at the sealed floor.
#[test]
fn recover_boots_at_least_at_the_sealed_floor() {
    let mut io = SimBackend::new(21);
    let mut store =
        PartitionStore::create(&mut io, Path::new(DIR), PID, headroom_config()).expect("store");
    let batches = chain(80, 900);
    for (i, b) in batches.iter().enumerate() {
        let op = i as u64 + 1;
        run(
            &mut store,
            &mut io,
            StorageOp::Append {
                op,
                batch: b.clone(),
            },
        );
        run(&mut store, &mut io, StorageOp::Flush);
        store.note_commit(op);
        if op == 1 {
            let state = VsrState {
                commit: 1,
                ..VsrState::default()
            };
            run(&mut store, &mut io, StorageOp::PersistVsr(state));
        }
    }
    let floor = store.superblock().frontier.active_prev_op;
    assert!(floor > 1, "no segment sealed");
    let r = recover(&mut store, &mut io, 4).expect("recovers");
    assert_eq!(r.durable.commit, 1, "the superblock's own commit");
    assert_eq!(r.base.op, floor, "anchored below the sealed floor");
    let replica =
        Replica::restart(Config::new(PID, 3, 0), 1, r.durable, r.base, &r.headers).expect("config");
    assert_eq!(replica.commit(), floor);
    // Without a headroom a roll seals uncommitted ops too: no floor.
    let (mut io, mut store) = fresh();
    append_all(&mut store, &mut io, &batches);
    assert!(store.superblock().frontier.active_prev_op > 0);
    let r = recover(&mut store, &mut io, 4).expect("recovers");
    assert_eq!(r.base.op, 0);
}

/// A headroom store holding ops 1..=n, the last one a purge op, flushed,
/// its superblock commit at `commit`.
fn store_ending_in_a_purge(n: u64, commit: u64) -> (SimBackend, PartitionStore) {
    let mut io = SimBackend::new(22);
    let mut store =
        PartitionStore::create(&mut io, Path::new(DIR), PID, headroom_config()).expect("store");
    let mut batches = chain(n, 300);
    let last = batches.pop().expect("n > 0");
    let mut bytes = last.to_vec();
    let mut h = BatchHeader::decode(&bytes).expect("decodes");
    h.attributes = ringlog_protocol::batch::ATTR_PURGE;
    let head = bytes.first_chunk_mut().expect("a header");
    ringlog_protocol::encode_header(&h, head);
    batches.push(bytes.into());
    append_all(&mut store, &mut io, &batches);
    let state = VsrState {
        commit,
        ..VsrState::default()
    };
    run(&mut store, &mut io, StorageOp::PersistVsr(state));
    (io, store)
}

/// Guards against: a purge applied twice or not at all by the executor,
/// or dropping ops above it: it purges once (the generation bumps, no op
/// is held, the chain point stays), a second run is a no-op, and a store
/// holding ops above the purge op refuses it.
#[test]
fn purge_runs_once_and_never_drops_ops_above_it() {
    let (mut io, mut store) = store_ending_in_a_purge(10, 10);
    let chain_before = store.chain();
    run(&mut store, &mut io, StorageOp::Purge { through_op: 10 });
    assert_eq!(store.superblock().purge_generation, 1);
    assert_eq!(store.chain(), chain_before, "the chain point moved");
    assert_eq!(store.log_start_offset(), store.durable().next_offset);
    run(&mut store, &mut io, StorageOp::Purge { through_op: 10 });
    assert_eq!(store.superblock().purge_generation, 1, "purged twice");
    let (mut io, mut store) = store_ending_in_a_purge(10, 10);
    let err = execute(&mut store, &mut io, &StorageOp::Purge { through_op: 9 })
        .expect_err("ops above the purge op");
    assert!(err.reason.contains("above"), "{err}");
    assert_eq!(store.superblock().purge_generation, 0);
}

/// Guards against: a purge waiting without bound for a transfer's lease,
/// or purging under a snapshot that then serves purged bytes: the open
/// snapshot is invalidated (its reads answer SnapshotGone) and the purge
/// runs.
#[test]
fn purge_invalidates_open_snapshots() {
    let (mut io, mut store) = store_ending_in_a_purge(10, 10);
    let m = store.open_snapshot(&mut io, 0).expect("opens");
    assert!(!m.artifacts.is_empty());
    run(&mut store, &mut io, StorageOp::Purge { through_op: 10 });
    assert_eq!(store.superblock().purge_generation, 1);
    let err = store
        .read_chunks(&mut io, m.snapshot_id, &[(0, 0)], 0)
        .expect_err("a purged snapshot reads");
    assert!(err.to_string().contains("gone"), "{err}");
}

/// Guards against: a replica that crashed after committing a purge op but
/// before its store ran it never applying it, or applying it twice:
/// recovery applies a committed purge op at the store's head once, and
/// leaves an uncommitted one (a view change may still cut it).
#[test]
fn recover_applies_a_committed_unapplied_purge_once() {
    let (mut io, mut store) = store_ending_in_a_purge(10, 9);
    let r = recover(&mut store, &mut io, 4).expect("recovers");
    assert!(!r.purged, "applied an uncommitted purge op");
    assert_eq!(store.superblock().purge_generation, 0);
    let (mut io, mut store) = store_ending_in_a_purge(10, 10);
    let r = recover(&mut store, &mut io, 4).expect("recovers");
    assert!(r.purged);
    assert_eq!(store.superblock().purge_generation, 1);
    assert_eq!((r.base.op, r.headers.len()), (10, 0));
    let r = recover(&mut store, &mut io, 4).expect("recovers");
    assert!(!r.purged, "applied twice");
    assert_eq!(store.superblock().purge_generation, 1);
    // A cluster of one commits its durable end: applied there too, when
    // it keeps a journal (with none, recovery reads nothing at all).
    let (mut io, mut store) = store_ending_in_a_purge(10, 0);
    let r = recover_lone(&mut store, &mut io, 0).expect("recovers");
    assert!(!r.purged && store.superblock().purge_generation == 0);
    let r = recover_lone(&mut store, &mut io, 1).expect("recovers");
    assert!(r.purged && store.superblock().purge_generation == 1);
}

/// Guards against: a restart's recovery (the reboot after every install)
/// seeking each [`REPAIR_READ_BYTES_MAX`] piece of the journal anew, a
/// binary search of reads each, so batches near that size (one or two per
/// piece) cost a search per batch: ~1 s of a 1 GiB install's 3 s reading
/// a 64-op journal of 1 MiB batches. One search, then reads straight on.
#[test]
fn recover_seeks_the_journal_once() {
    let cfg = StoreConfig {
        segment_size_bytes: 64 * 1024 * 1024,
        ..StoreConfig::default()
    };
    let mut io = SimBackend::new(11);
    let mut store =
        PartitionStore::create(&mut io, Path::new(DIR), PID, cfg.clone()).expect("store");
    let n = 48;
    // Just over half the piece: each read_batches answers two batches.
    let batches = chain(n, REPAIR_READ_BYTES_MAX / 2 + 1024);
    append_all(&mut store, &mut io, &batches);
    drop(store);
    let mut io = io.reboot();
    let mut store = PartitionStore::open(&mut io, Path::new(DIR), PID, cfg).expect("reopens");

    let reads = io.op_count(FaultOp::Read);
    let r = recover_lone(&mut store, &mut io, n - 1).expect("recovers");
    let ops: Vec<u64> = r.headers.iter().map(|h| h.vsr_op).collect();
    assert_eq!(ops, (2..=n).collect::<Vec<_>>());
    assert_eq!(r.base.op, 1);
    let used = io.op_count(FaultOp::Read) - reads;
    // A search (about log2(n) probes, each a read or two), then about a
    // read per batch; a search per piece would be ~n/2 searches.
    let bound = 2 * n + 32;
    assert!(used <= bound, "{used} reads for {n} ops (bound {bound})");
}

/// Guards against: a replica rebooting on a snapshot it just installed
/// reading a journal of installed (committed) ops back, a read of each
/// batch on the shard thread (64 batches of 1 MiB took ~130 ms of a 1 GiB
/// install between processes). With [`INSTALLED_COMMITTED_OPS_KEPT`] it
/// keeps none and reads about one batch; the boot's journal reads each.
#[test]
fn an_installed_replica_boots_without_reading_back_its_committed_ops() {
    let cfg = StoreConfig {
        segment_size_bytes: 64 * 1024 * 1024,
        ..StoreConfig::default()
    };
    let mut io = SimBackend::new(12);
    let mut store =
        PartitionStore::create(&mut io, Path::new(DIR), PID, cfg.clone()).expect("store");
    let n = 64;
    append_all(
        &mut store,
        &mut io,
        &chain(n, REPAIR_READ_BYTES_MAX / 2 + 1024),
    );
    let state = VsrState {
        view: 0,
        log_view: 0,
        commit: n,
        wiped: false,
        view_lost: false,
    };
    run(&mut store, &mut io, StorageOp::PersistVsr(state));
    drop(store);
    let mut io = io.reboot();
    let mut store = PartitionStore::open(&mut io, Path::new(DIR), PID, cfg).expect("reopens");

    let reads = io.op_count(FaultOp::Read);
    let r = recover(&mut store, &mut io, INSTALLED_COMMITTED_OPS_KEPT).expect("recovers");
    let used = io.op_count(FaultOp::Read) - reads;
    assert!(r.headers.is_empty(), "{} headers kept", r.headers.len());
    assert_eq!((r.base.op, r.durable.commit), (n, n));
    // One search for the anchor's batch: about 2 x log2(n) reads.
    let bound = 2 * u64::from(n.ilog2()) + 4;
    assert!(
        used <= bound,
        "{used} reads to boot on {n} committed ops (bound {bound})"
    );

    let reads = io.op_count(FaultOp::Read);
    let r = recover(&mut store, &mut io, n).expect("recovers");
    assert_eq!(r.headers.len() as u64, n);
    let used = io.op_count(FaultOp::Read) - reads;
    assert!(used >= n, "a kept journal reads each batch ({used} reads)");
}
