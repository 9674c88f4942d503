//! Tail cuts (`PartitionStore::truncate_above`), sealing only committed data
//! and the durability of the VSR state, on the sim backend.
//!
//! The crash-point tests run a workload once to count its I/Os, then again
//! for every I/O index, with and without torn writes, losing power there;
//! the recovered log must be one the workload allows:
//! - before the cut started: a prefix of what was appended, holding every
//!   acknowledged batch;
//! - while the cut ran: that, or exactly the log below the cut (never a mix,
//!   never less than the kept part);
//! - once the cut returned: the kept part, then a prefix of what was
//!   appended after the cut holding its acknowledged batches. The first
//!   batch appended after the cut is byte-identical to the first cut one, so
//!   a cut batch left on disk after it would chain and come back.

mod common;

use std::path::Path;

use common::small_config;
use ringlog_protocol::{BatchBuilder, BatchHeader, Record, Stamp};
use ringlog_storage::io::sim::SimBackend;
use ringlog_storage::io::IoBackend;
use ringlog_storage::store::{CutError, PartitionStore, StoreConfig, StoreError, TransferError};
use ringlog_storage::superblock::{choose, VsrState};

const DIR: &str = "/p9";
const PID: u32 = 9;
/// The workload cuts every op above this one.
const CUT_OP: u64 = 5;

fn dir() -> &'static Path {
    Path::new(DIR)
}

/// A batch continuing `store`'s log carrying VSR op `op`; its bytes depend
/// only on the log end, `op` and `seed`.
fn op_batch(store: &PartitionStore, op: u64, seed: u64, value_len: usize) -> Vec<u8> {
    padded_batch(store, op, seed, (value_len, 0))
}

/// [`op_batch`] with `pad` more bytes in its second record.
fn padded_batch(
    store: &PartitionStore,
    op: u64,
    seed: u64,
    (value_len, pad): (usize, usize),
) -> Vec<u8> {
    let mut builder = BatchBuilder::new(PID);
    for i in 0..2u32 {
        let len = value_len + if i == 1 { pad } else { 0 };
        let value: Vec<u8> = (0..len)
            .map(|j| (seed.wrapping_mul(131) + u64::from(i) + j as u64) as u8)
            .collect();
        let key = format!("op{op}-s{seed}-{i}");
        builder
            .push(&Record {
                key: key.as_bytes(),
                headers: &[],
                value: &value,
                timestamp_ms: 1_000 + op,
            })
            .expect("record fits");
    }
    builder
        .finish(&Stamp {
            base_offset: store.next_offset(),
            vsr_op: op,
            vsr_view: 0,
            prev_checksum: store.last_checksum(),
        })
        .expect("valid batch")
}

fn op_of(batch: &[u8]) -> u64 {
    BatchHeader::decode(batch).expect("header").vsr_op
}

/// What the workload did before the power failed.
#[derive(Default, Debug)]
struct Model {
    created: bool,
    /// Every batch appended before the cut, in order, and how many of them
    /// were acknowledged (a flush covering them completed).
    old: Vec<Vec<u8>>,
    old_acked: usize,
    cut_started: bool,
    cut_done: bool,
    /// Appended after the cut returned, and how many acknowledged.
    post: Vec<Vec<u8>>,
    post_acked: usize,
    /// The VSR state set_vsr was asked for, and whether it returned.
    vsr_asked: Option<VsrState>,
    vsr_done: bool,
}

impl Model {
    fn kept(&self) -> Vec<Vec<u8>> {
        self.old
            .iter()
            .filter(|b| op_of(b) <= CUT_OP)
            .cloned()
            .collect()
    }

    /// Whether `log` is one this model allows (see the file docs).
    fn allows(&self, log: &[Vec<u8>]) -> Result<(), String> {
        let old_log = log.len() >= self.old_acked
            && log.len() <= self.old.len()
            && log.iter().zip(&self.old).all(|(a, b)| a == b);
        let kept = self.kept();
        let cut_log = log.len() >= kept.len() + self.post_acked
            && log.len() <= kept.len() + self.post.len()
            && log
                .iter()
                .zip(kept.iter().chain(&self.post))
                .all(|(a, b)| a == b);
        let ok = if self.cut_done {
            cut_log
        } else if self.cut_started {
            old_log || cut_log
        } else {
            old_log
        };
        if ok {
            return Ok(());
        }
        let ops: Vec<u64> = log.iter().map(|b| op_of(b)).collect();
        Err(format!(
            "log with ops {ops:?} not allowed (old {} acked {}, kept {}, post {} acked {}, cut started {} done {})",
            self.old.len(),
            self.old_acked,
            kept.len(),
            self.post.len(),
            self.post_acked,
            self.cut_started,
            self.cut_done
        ))
    }
}

fn append_old(
    io: &mut SimBackend,
    store: &mut PartitionStore,
    model: &mut Model,
    (op, value_len): (u64, usize),
) -> Result<(), StoreError> {
    let batch = op_batch(store, op, op, value_len);
    store.append(io, &batch)?;
    model.old.push(batch);
    Ok(())
}

fn flush_old(
    io: &mut SimBackend,
    store: &mut PartitionStore,
    model: &mut Model,
) -> Result<(), StoreError> {
    store.flush(io)?;
    model.old_acked = model.old.len();
    Ok(())
}

/// The padding that makes op 6 end on a block boundary: a flush ending
/// inside a block zeroes the rest of it, which would hide a cut op 7 left
/// on disk after a re-appended op 6.
fn block_ending_pad(store: &PartitionStore) -> usize {
    (0..4096)
        .find(|&pad| {
            let len = padded_batch(store, 6, 6, (OP6_VALUE_LEN, pad)).len() as u64;
            (store.size_bytes() + len).is_multiple_of(4096)
        })
        .expect("some padding ends the batch on a block")
}

const OP6_VALUE_LEN: usize = 4300;

/// Ops 1..=6 flushed one by one (6 ending on a block boundary), a VSR
/// state, a close (so the superblock frontier lies above the cut), ops
/// 7..=9 flushed, 10 only accepted; the cut above op 5; then op 6 again
/// with the very bytes it had, and 7, 8.
fn workload(
    io: &mut SimBackend,
    config: &StoreConfig,
    model: &mut Model,
) -> Result<(), StoreError> {
    let mut store = PartitionStore::create(io, dir(), PID, config.clone())?;
    model.created = true;
    for op in 1..=5 {
        append_old(io, &mut store, model, (op, 300 + 700 * op as usize))?;
        flush_old(io, &mut store, model)?;
    }
    let pad = block_ending_pad(&store);
    let op6 = padded_batch(&store, 6, 6, (OP6_VALUE_LEN, pad));
    store.append(io, &op6)?;
    model.old.push(op6);
    flush_old(io, &mut store, model)?;
    let vsr = VsrState {
        view: 2,
        log_view: 1,
        commit: 3,
        op: 6,
        wiped: false,
        view_lost: false,
    };
    model.vsr_asked = Some(vsr);
    store.set_vsr(io, vsr)?;
    model.vsr_done = true;
    store.close(io)?;
    let mut store = PartitionStore::open(io, dir(), PID, config.clone())?;
    for op in 7..=9 {
        append_old(io, &mut store, model, (op, 2500))?;
    }
    flush_old(io, &mut store, model)?;
    append_old(io, &mut store, model, (10, 100))?;

    model.cut_started = true;
    let end = store.truncate_above(io, CUT_OP)?;
    model.cut_done = true;
    assert_eq!(end.last_op, CUT_OP);
    assert_eq!(store.durable(), end);

    // Op 6 again, byte for byte: a cut op 7 left on disk would chain to it.
    let again = padded_batch(&store, 6, 6, (OP6_VALUE_LEN, pad));
    assert_eq!(again, model.old[5], "the re-appended op is identical");
    for (op, seed, value_len) in [
        (6, 6, (OP6_VALUE_LEN, pad)),
        (7, 70, (900, 0)),
        (8, 80, (40, 0)),
    ] {
        let batch = padded_batch(&store, op, seed, value_len);
        store.append(io, &batch)?;
        model.post.push(batch);
        store.flush(io)?;
        model.post_acked = model.post.len();
    }
    Ok(())
}

/// Every batch from the start to the durable end.
fn log_of(io: &mut SimBackend, store: &mut PartitionStore) -> Vec<Vec<u8>> {
    common::read_all(io, store)
        .into_iter()
        .map(|(_, b)| b)
        .collect()
}

/// Opens after a crash and checks the log, the VSR state and that appends
/// go on. False if the crash came before the partition existed.
fn check_recovery(io: SimBackend, config: &StoreConfig, model: &Model, label: &str) -> bool {
    let mut io = io.reboot();
    let mut store = match PartitionStore::open(&mut io, dir(), PID, config.clone()) {
        Ok(store) => store,
        Err(e) => {
            assert!(!model.created, "{label}: open failed: {e}");
            return false;
        }
    };
    let log = log_of(&mut io, &mut store);
    model
        .allows(&log)
        .unwrap_or_else(|e| panic!("{label}: {e}"));
    let sb = store.superblock();
    assert_eq!(
        sb.frontier.cut_pending_end, 0,
        "{label}: open left a cut pending"
    );
    let vsr = sb.vsr;
    let asked = model.vsr_asked.unwrap_or_default();
    assert!(
        vsr == asked || (vsr == VsrState::default() && !model.vsr_done),
        "{label}: VSR state {vsr:?} is neither {asked:?} nor the initial one before set_vsr returned"
    );
    // Appends continue the recovered log and survive another power cut.
    let batch = op_batch(&store, store.chain().last_op + 1, 999, 500);
    store
        .append(&mut io, &batch)
        .unwrap_or_else(|e| panic!("{label}: append after recovery: {e}"));
    store.flush(&mut io).unwrap();
    let mut io = io.reboot();
    let mut store = PartitionStore::open(&mut io, dir(), PID, config.clone())
        .unwrap_or_else(|e| panic!("{label}: second recovery: {e}"));
    let again = log_of(&mut io, &mut store);
    assert_eq!(again.len(), log.len() + 1, "{label}: second recovery");
    assert!(
        again[..log.len()] == log[..] && again[log.len()] == batch,
        "{label}"
    );
    true
}

#[test]
fn a_crash_at_any_io_of_a_cut_opens_the_old_or_the_cut_log() {
    let config = small_config();
    let mut io = SimBackend::new(1);
    let mut model = Model::default();
    workload(&mut io, &config, &mut model).expect("clean run");
    let total_ops = io.ops_count();
    let mut points = 0;
    for crash_at in 0..=total_ops {
        for tear in [false, true] {
            let seed = crash_at * 2 + u64::from(tear) + 3;
            let mut io = SimBackend::new(seed);
            io.set_crash_at(crash_at, tear);
            let mut model = Model::default();
            let result = workload(&mut io, &config, &mut model);
            assert!(
                result.is_err() || crash_at == total_ops,
                "crash at {crash_at} unnoticed"
            );
            let label = format!("crash_at={crash_at} tear={tear} seed={seed}");
            points += u64::from(check_recovery(io, &config, &model, &label));
        }
    }
    println!("cut: {total_ops} I/Os, {points} crash points checked");
    // A flush is two I/Os (its trailer rides in its data write), so the
    // workload has about 57 I/Os.
    assert!(points > 80, "only {points} crash points");
}

/// The crash points that leave a cut pending on disk (its superblock landed,
/// its zeroing or the superblock that ends it did not).
fn pending_cut_points(config: &StoreConfig) -> Vec<(u64, bool)> {
    let mut io = SimBackend::new(1);
    workload(&mut io, config, &mut Model::default()).unwrap();
    let total_ops = io.ops_count();
    let mut points = Vec::new();
    for crash_at in 0..total_ops {
        for tear in [false, true] {
            let mut io = SimBackend::new(crash_at * 2 + u64::from(tear) + 3);
            io.set_crash_at(crash_at, tear);
            let _ = workload(&mut io, config, &mut Model::default());
            let io = io.reboot();
            let sb_path = dir().join("superblock");
            let Some(bytes) = io.read_whole(&sb_path) else {
                continue;
            };
            let pending =
                choose(bytes, &sb_path).is_ok_and(|c| c.superblock.frontier.cut_pending_end != 0);
            if pending {
                points.push((crash_at, tear));
            }
        }
    }
    points
}

/// Replays the workload to the crash point `(crash_at, tear)`, then runs a
/// recovery open that itself loses power at its I/O `open_crash_at`.
fn crash_twice(
    config: &StoreConfig,
    (crash_at, tear): (u64, bool),
    open_crash_at: Option<u64>,
) -> (SimBackend, Model, bool) {
    let mut io = SimBackend::new(crash_at * 2 + u64::from(tear) + 3);
    io.set_crash_at(crash_at, tear);
    let mut model = Model::default();
    let _ = workload(&mut io, config, &mut model);
    let mut io = io.reboot();
    if let Some(at) = open_crash_at {
        io.set_crash_at(at, true);
    }
    let opened = PartitionStore::open(&mut io, dir(), PID, config.clone()).is_ok();
    (io, model, opened)
}

#[test]
fn an_open_that_finishes_a_cut_may_crash_at_any_io() {
    let config = small_config();
    let points = pending_cut_points(&config);
    assert!(
        points.len() >= 4,
        "only {} crash points leave a cut pending",
        points.len()
    );
    let mut checked = 0;
    for point in points {
        let (io, _, opened) = crash_twice(&config, point, None);
        assert!(opened, "{point:?}: open over a pending cut failed");
        let open_ops = io.ops_count();
        assert!(
            open_ops >= 4,
            "{point:?}: finishing the cut took {open_ops} I/Os"
        );
        for at in 0..open_ops {
            let (io, mut model, _) = crash_twice(&config, point, Some(at));
            // The pending superblock committed the cut: only the cut log
            // may open, as if the cut had returned.
            model.cut_done = true;
            let label = format!("{point:?} open_crash_at={at}");
            assert!(check_recovery(io, &config, &model, &label));
            checked += 1;
        }
    }
    println!("{checked} crashes inside the open that finishes a cut");
}

/// A partition holding ops 1..=n, one flush each; ops above `commit` are
/// uncommitted.
fn partition_with_ops(io: &mut SimBackend, config: StoreConfig, n: u64) -> PartitionStore {
    let mut store = PartitionStore::create(io, dir(), PID, config).unwrap();
    for op in 1..=n {
        let batch = op_batch(&store, op, op, 1500);
        store.append(io, &batch).unwrap();
        store.flush(io).unwrap();
    }
    store
}

fn assert_cut_refused(
    io: &mut SimBackend,
    store: &mut PartitionStore,
    op: u64,
    expected: CutError,
) {
    let (ops, chain, sb) = (io.ops_count(), store.chain(), store.superblock().clone());
    match store.truncate_above(io, op) {
        Err(StoreError::Cut {
            partition_id,
            source,
        }) => {
            assert_eq!(partition_id, PID);
            assert_eq!(source, expected);
        }
        other => panic!("cut above {op}: expected {expected:?}, got {other:?}"),
    }
    assert_eq!(io.ops_count(), ops, "a refused cut above {op} did I/O");
    assert_eq!(store.chain(), chain);
    assert_eq!(store.superblock(), &sb);
    assert!(store.fenced().is_none());
}

#[test]
fn bad_cuts_are_refused_with_typed_errors_and_change_nothing() {
    let mut io = SimBackend::new(7);
    let mut store = partition_with_ops(&mut io, small_config(), 8);
    let vsr = VsrState {
        view: 1,
        log_view: 1,
        commit: 4,
        op: 8,
        wiped: false,
        view_lost: false,
    };
    store.set_vsr(&mut io, vsr).unwrap();
    // Below the durable commit: op 4 would go.
    assert_cut_refused(
        &mut io,
        &mut store,
        3,
        CutError::BelowCommit { op: 3, commit: 4 },
    );
    // Below a commit only noted in memory.
    store.note_commit(6);
    assert_eq!(store.commit_known(), 6);
    assert_cut_refused(
        &mut io,
        &mut store,
        5,
        CutError::BelowCommit { op: 5, commit: 6 },
    );
    assert_cut_refused(
        &mut io,
        &mut store,
        9,
        CutError::AboveEnd { op: 9, last_op: 8 },
    );
    // With a flush in flight.
    let batch = op_batch(&store, 9, 9, 100);
    store.append(&mut io, &batch).unwrap();
    let mut sqes = Vec::new();
    assert!(store.prepare_flush(&mut sqes).unwrap() > 0);
    assert_cut_refused(&mut io, &mut store, 7, CutError::FlushInFlight);
    let completions = io.submit(sqes);
    store.complete_flush(completions).unwrap();
    // At the commit: allowed; at the last op: nothing to cut, no I/O.
    let ops = io.ops_count();
    assert_eq!(store.truncate_above(&mut io, 9).unwrap().last_op, 9);
    assert_eq!(io.ops_count(), ops);
    let end = store.truncate_above(&mut io, 6).unwrap();
    assert_eq!((end.last_op, store.chain(), store.durable()), (6, end, end));
    // The commit is not lost by the cut, and reopening agrees.
    drop(store);
    let mut io = io.reboot();
    let mut store = PartitionStore::open(&mut io, dir(), PID, small_config()).unwrap();
    assert_eq!(store.durable(), end);
    assert_eq!(store.superblock().vsr, vsr);
    let ops: Vec<u64> = log_of(&mut io, &mut store)
        .iter()
        .map(|b| op_of(b))
        .collect();
    assert_eq!(ops, (1..=6).collect::<Vec<_>>());
}

#[test]
fn a_cut_never_reaches_sealed_data() {
    let mut io = SimBackend::new(8);
    // 64 KiB segments of ~3 KiB batches: ops 1..=40 roll several times.
    let mut store = partition_with_ops(&mut io, small_config(), 40);
    let sealed_end = store.sealed_segments().last().expect("rolled").end_offset;
    let log = log_of(&mut io, &mut store);
    let first_active = log
        .iter()
        .find(|b| BatchHeader::decode(b).unwrap().base_offset == sealed_end)
        .map(|b| op_of(b))
        .unwrap();
    assert_cut_refused(
        &mut io,
        &mut store,
        first_active - 2,
        CutError::IntoSealed {
            op: first_active - 2,
            sealed_last_op: first_active - 1,
        },
    );
    // Right at the segment start: the whole active segment goes.
    let end = store.truncate_above(&mut io, first_active - 1).unwrap();
    assert_eq!(end.next_offset, sealed_end);
    let batch = op_batch(&store, first_active, 77, 100);
    store.append(&mut io, &batch).unwrap();
    store.flush(&mut io).unwrap();
    let mut io = io.reboot();
    let mut store = PartitionStore::open(&mut io, dir(), PID, small_config()).unwrap();
    let after = log_of(&mut io, &mut store);
    let kept = log.iter().take_while(|b| op_of(b) < first_active);
    assert!(after.iter().take(after.len() - 1).eq(kept));
    assert_eq!(after.last(), Some(&batch));
}

#[test]
fn a_fenced_partition_refuses_a_cut() {
    let mut io = SimBackend::new(9);
    let mut store = partition_with_ops(&mut io, small_config(), 4);
    let batch = op_batch(&store, 5, 5, 100);
    store.append(&mut io, &batch).unwrap();
    io.set_fail_at(io.ops_count());
    assert!(matches!(
        store.flush(&mut io),
        Err(StoreError::Fenced { .. })
    ));
    let ops = io.ops_count();
    match store.truncate_above(&mut io, 2) {
        Err(StoreError::Fenced { partition_id, .. }) => assert_eq!(partition_id, PID),
        other => panic!("expected Fenced, got {other:?}"),
    }
    assert_eq!(io.ops_count(), ops);
}

/// A failed write or fsync at any I/O of the cut fences the partition; the
/// reopen shows the old log or the cut one.
#[test]
fn a_failed_io_during_a_cut_fences_and_the_reopen_is_consistent() {
    let config = small_config();
    let build = |seed| {
        let mut io = SimBackend::new(seed);
        let store = partition_with_ops(&mut io, config.clone(), 12);
        (io, store)
    };
    let (mut io, mut store) = build(10);
    let old = log_of(&mut io, &mut store);
    let before = io.ops_count();
    store.truncate_above(&mut io, 7).unwrap();
    let cut_ops = io.ops_count() - before;
    assert!(cut_ops >= 5, "the cut took {cut_ops} I/Os");
    let kept: Vec<Vec<u8>> = old.iter().filter(|b| op_of(b) <= 7).cloned().collect();
    for k in 0..cut_ops {
        let (mut io, mut store) = build(10);
        io.set_fail_at(io.ops_count() + k);
        match store.truncate_above(&mut io, 7) {
            Err(StoreError::Fenced { .. }) => {}
            other => panic!("failure at cut I/O {k}: expected Fenced, got {other:?}"),
        }
        assert!(store.fenced().is_some());
        let batch = op_batch(&store, 8, 8, 10);
        assert!(matches!(
            store.append(&mut io, &batch),
            Err(StoreError::Fenced { .. })
        ));
        drop(store);
        let mut io = io.reboot();
        let mut store = PartitionStore::open(&mut io, dir(), PID, config.clone())
            .unwrap_or_else(|e| panic!("failure at cut I/O {k}: reopen: {e}"));
        let log = log_of(&mut io, &mut store);
        assert!(
            log == old || log == kept,
            "failure at cut I/O {k}: mixed log"
        );
    }
}

/// Seal only committed data: with a headroom, a segment past its roll point
/// holding uncommitted ops keeps them; full, it refuses the append (the
/// bound) until the ops commit; then the roll seals only committed ops.
#[test]
fn a_roll_never_seals_uncommitted_ops_and_the_headroom_is_a_hard_bound() {
    let config = StoreConfig {
        uncommitted_headroom_bytes: Some(16 * 1024),
        ..small_config()
    };
    let mut io = SimBackend::new(11);
    let mut store = PartitionStore::create(&mut io, dir(), PID, config.clone()).unwrap();
    let capacity = store.active_capacity_bytes();
    let mut op = 0;
    let refused = loop {
        op += 1;
        let batch = op_batch(&store, op, op, 1500);
        let (ops, chain) = (io.ops_count(), store.chain());
        match store.append(&mut io, &batch) {
            Ok(_) => store.flush(&mut io).unwrap(),
            Err(StoreError::UncommittedTail {
                partition_id,
                last_op,
                commit,
                capacity_bytes,
            }) => {
                assert_eq!((partition_id, last_op, commit), (PID, op - 1, 0));
                assert_eq!(capacity_bytes, capacity);
                assert_eq!((io.ops_count(), store.chain()), (ops, chain));
                break batch;
            }
            Err(e) => panic!("op {op}: {e}"),
        }
        assert!(
            store.sealed_segments().next().is_none(),
            "op {op}: sealed uncommitted ops"
        );
    };
    // It filled the headroom: past the roll point, up to the capacity.
    assert!(store.size_bytes() > capacity - 16 * 1024);
    assert!(store.seal_waits_for_commit());
    assert!(!store.append_rolls(refused.len()));
    assert!(store.size_bytes() + refused.len() as u64 > capacity);
    // Committed (the replica noted it): the refused append rolls and fits.
    store.note_commit(op - 1);
    assert!(!store.seal_waits_for_commit());
    assert!(store.append_rolls(refused.len()));
    store.append(&mut io, &refused).unwrap();
    store.flush(&mut io).unwrap();
    let sealed: Vec<_> = store.sealed_segments().copied().collect();
    assert_eq!(sealed.len(), 1);
    assert_eq!(
        sealed[0].end_offset,
        BatchHeader::decode(&refused).unwrap().base_offset
    );
    // With ops committed as they come, rolls happen at the roll point.
    for _ in 0..40 {
        op += 1;
        store.note_commit(op - 1);
        let batch = op_batch(&store, op, op, 1500);
        store.append(&mut io, &batch).unwrap();
        store.flush(&mut io).unwrap();
    }
    let lengths: Vec<u64> = store
        .sealed_segments()
        .skip(1)
        .map(|s| s.length_bytes)
        .collect();
    assert!(!lengths.is_empty());
    assert!(
        lengths.iter().all(|&l| l <= capacity - 16 * 1024),
        "{lengths:?}"
    );
    // The refusal is stable across a reopen (the uncommitted end is on disk).
    drop(store);
    let mut io = io.reboot();
    let store = PartitionStore::open(&mut io, dir(), PID, config).unwrap();
    assert_eq!(store.chain().last_op, op);
}

/// `set_vsr` makes view, log_view, commit and op durable together: a crash
/// at any of its I/Os reopens the old state or the new one, never a mix.
#[test]
fn vsr_state_survives_a_crash_at_any_io_of_set_vsr() {
    // The old state has the wiped flag, the new one clears it (a wiped
    // replica's repair done): a crash leaves one or the other, whole.
    let old = VsrState {
        view: 3,
        log_view: 2,
        commit: 5,
        op: 7,
        wiped: true,
        view_lost: false,
    };
    let new = VsrState {
        view: 4,
        log_view: 4,
        commit: 6,
        op: 7,
        wiped: false,
        view_lost: false,
    };
    let prepare = |seed| {
        let mut io = SimBackend::new(seed);
        let mut store = partition_with_ops(&mut io, small_config(), 7);
        store.set_vsr(&mut io, old).unwrap();
        (io, store)
    };
    let (mut io, mut store) = prepare(12);
    let before = io.ops_count();
    store.set_vsr(&mut io, new).unwrap();
    let ios = io.ops_count() - before;
    drop(store);
    let mut io = io.reboot();
    let store = PartitionStore::open(&mut io, dir(), PID, small_config()).unwrap();
    assert_eq!(store.superblock().vsr, new);
    for k in 0..ios {
        for tear in [false, true] {
            let (mut io, mut store) = prepare(12);
            io.set_crash_at(io.ops_count() + k, tear);
            assert!(store.set_vsr(&mut io, new).is_err());
            drop(store);
            let mut io = io.reboot();
            let store = PartitionStore::open(&mut io, dir(), PID, small_config()).unwrap();
            let got = store.superblock().vsr;
            assert!(
                got == old || got == new,
                "crash at set_vsr I/O {k} tear={tear}: {got:?}"
            );
        }
    }
}

/// A snapshot serving the active segment's bytes above the cut is gone
/// after it: a peer must not read cut batches as the log.
#[test]
fn a_cut_invalidates_snapshots_serving_the_cut_bytes() {
    let mut io = SimBackend::new(13);
    let mut store = partition_with_ops(&mut io, small_config(), 8);
    let manifest = store.open_snapshot(&mut io, 1_000).unwrap();
    let last = manifest.artifacts.len() as u32 - 1;
    store
        .read_chunk(&mut io, manifest.snapshot_id, last, 0, 1_000)
        .unwrap();
    store.truncate_above(&mut io, 5).unwrap();
    match store.read_chunk(&mut io, manifest.snapshot_id, last, 0, 1_000) {
        Err(StoreError::Transfer {
            source: TransferError::SnapshotGone { id },
            ..
        }) => assert_eq!(id, manifest.snapshot_id),
        other => panic!("expected SnapshotGone, got {other:?}"),
    }
}

/// The cut zeroes past the log's end too, by one write buffer: a flush torn
/// at an earlier crash can leave whole batches there that recovery dropped
/// (the one before them was torn). Were they left, re-appending the batches
/// before them byte for byte after a cut would make them chain again.
#[test]
fn a_cut_also_zeroes_the_dropped_torn_tail_past_the_end() {
    let config = small_config();
    let mut io = SimBackend::new(14);
    let mut store = partition_with_ops(&mut io, config.clone(), 4);
    // Ops 5..=7 in one flush, op 5 ending on a block boundary (a flush
    // ending inside a block zeroes the rest of it, which would hide op 6).
    let pad = (0..4096)
        .find(|&pad| {
            let len = padded_batch(&store, 5, 5, (1500, pad)).len() as u64;
            (store.size_bytes() + len).is_multiple_of(4096)
        })
        .unwrap();
    let op5 = padded_batch(&store, 5, 5, (1500, pad));
    let op5_at = store.size_bytes() as usize;
    store.append(&mut io, &op5).unwrap();
    for op in 6..=7 {
        let batch = op_batch(&store, op, op, 1500);
        store.append(&mut io, &batch).unwrap();
    }
    store.flush(&mut io).unwrap();
    // Op 5 damaged past the frontier record: recovery takes it for a torn
    // tail and drops 5..=7, leaving 6 and 7 whole on disk.
    let segment = dir()
        .join(format!("gen-{:020}", 1))
        .join(format!("{:020}.log", 0));
    drop(store);
    let byte = io.read_whole(&segment).unwrap()[op5_at + 200];
    io.corrupt(&segment, op5_at + 200, &[byte ^ 1]);
    let mut io = io.reboot();
    let mut store = PartitionStore::open(&mut io, dir(), PID, config.clone()).unwrap();
    let log = log_of(&mut io, &mut store);
    assert_eq!(
        log.iter().map(|b| op_of(b)).collect::<Vec<_>>(),
        [1, 2, 3, 4]
    );
    // Cut above op 2, then ops 3, 4 and 5 again, byte for byte.
    store.truncate_above(&mut io, 2).unwrap();
    for batch in &log[2..] {
        store.append(&mut io, batch).unwrap();
    }
    assert_eq!(padded_batch(&store, 5, 5, (1500, pad)), op5);
    store.append(&mut io, &op5).unwrap();
    store.flush(&mut io).unwrap();
    drop(store);
    let mut io = io.reboot();
    let mut store = PartitionStore::open(&mut io, dir(), PID, config).unwrap();
    let ops: Vec<u64> = log_of(&mut io, &mut store)
        .iter()
        .map(|b| op_of(b))
        .collect();
    assert_eq!(ops, [1, 2, 3, 4, 5], "dropped ops came back after the cut");
}

/// What a random run expects of the log: every batch accepted, in order,
/// the first `acked` of them durable.
struct RandomModel {
    log: Vec<Vec<u8>>,
    acked: usize,
    vsr: VsrState,
}

impl RandomModel {
    /// Whether `got` may open after a crash inside a step that started
    /// from `self` and, had it finished, would have left `after`: a cut
    /// leaves the old log or the cut one; any other step a prefix of what
    /// it accepted holding what was acknowledged before it.
    fn allows(&self, after: &RandomModel, got: &[Vec<u8>]) -> bool {
        let prefix_of = |log: &[Vec<u8>], min: usize| {
            got.len() >= min && got.len() <= log.len() && got.iter().zip(log).all(|(a, b)| a == b)
        };
        if after.log.len() < self.log.len() {
            prefix_of(&self.log, self.acked) || got == after.log
        } else {
            prefix_of(&after.log, self.acked)
        }
    }
}

/// One random step on `store`: the model it leaves if it finishes (what it
/// set out to do, also on a crash inside it) and how it went.
fn random_step(
    io: &mut SimBackend,
    store: &mut PartitionStore,
    model: &RandomModel,
    rng: &mut ringlog_storage::io::sim::SimRng,
) -> (RandomModel, Result<(), StoreError>) {
    let mut after = RandomModel {
        log: model.log.clone(),
        ..*model
    };
    let result = match rng.below(10) {
        0..=4 => random_appends(io, store, &mut after, rng),
        5 | 6 => {
            let sealed_end = store.sealed_segments().last().map_or(0, |s| s.end_offset);
            let sealed_op = after
                .log
                .iter()
                .map(|b| BatchHeader::decode(b).unwrap())
                .filter(|h| h.base_offset < sealed_end)
                .map(|h| h.vsr_op)
                .max()
                .unwrap_or(0);
            let lo = store.commit_known().max(sealed_op);
            let last = store.chain().last_op;
            if lo <= last {
                let op = lo + rng.below(last - lo + 1);
                // A cut flushes, then cuts; one above the last op does
                // neither.
                if op < last {
                    after.log.retain(|b| op_of(b) <= op);
                    after.acked = after.log.len();
                }
                store.truncate_above(io, op).map(|_| ())
            } else {
                Ok(())
            }
        }
        7 => {
            let last = store.chain().last_op;
            let commit = store.commit_known() + rng.below(last - store.commit_known() + 1);
            if rng.chance(1, 2) {
                store.note_commit(commit);
                Ok(())
            } else {
                after.vsr = VsrState {
                    commit: commit.max(model.vsr.commit),
                    ..model.vsr
                };
                store.set_vsr(io, after.vsr)
            }
        }
        _ => {
            after.acked = after.log.len();
            store.flush(io)
        }
    };
    (after, result)
}

/// Up to three appends, then (mostly) a flush.
fn random_appends(
    io: &mut SimBackend,
    store: &mut PartitionStore,
    after: &mut RandomModel,
    rng: &mut ringlog_storage::io::sim::SimRng,
) -> Result<(), StoreError> {
    for _ in 0..=rng.below(3) {
        let op = store.chain().last_op + 1;
        let len = 100 + rng.below(3000) as usize;
        let batch = op_batch(store, op, rng.next_u64(), len);
        match store.append(io, &batch) {
            Ok(_) => after.log.push(batch),
            // The headroom is full: commit it all, as a replica would.
            Err(StoreError::UncommittedTail { .. }) => store.note_commit(op - 1),
            Err(e) => return Err(e),
        }
    }
    if rng.chance(3, 4) {
        after.acked = after.log.len();
        store.flush(io)?;
    }
    Ok(())
}

/// Random appends, flushes, cuts, commits and power cuts (between steps and
/// inside them, torn or not), with the seal-only-committed headroom on: the
/// log that opens is always one the steps allow, so cut data never returns
/// across many cuts, rolls and restarts.
#[test]
fn random_cuts_commits_and_crashes_never_bring_cut_data_back() {
    let config = StoreConfig {
        uncommitted_headroom_bytes: Some(16 * 1024),
        ..small_config()
    };
    let mut cuts = 0;
    let mut crashes = 0;
    for seed in 0..200 {
        let mut rng = ringlog_storage::io::sim::SimRng::new(seed);
        let mut io = SimBackend::new(seed + 100);
        let mut store = PartitionStore::create(&mut io, dir(), PID, config.clone()).unwrap();
        let mut model = RandomModel {
            log: Vec::new(),
            acked: 0,
            vsr: VsrState::default(),
        };
        for step in 0..80 {
            let crash = rng.chance(1, 10);
            if crash {
                io.set_crash_at(io.ops_count() + rng.below(12), rng.chance(1, 2));
            }
            let ops_before = io.ops_count();
            let (after, result) = random_step(&mut io, &mut store, &model, &mut rng);
            let cut = result.is_ok() && after.log.len() < model.log.len();
            cuts += u64::from(cut);
            match result {
                Ok(()) if !io.is_crashed() => {}
                result => {
                    assert!(
                        io.is_crashed(),
                        "seed {seed} step {step}: {:?}",
                        result.err()
                    );
                    // Inside the step: the log from before it, or after it.
                    let crash_io = io.ops_count() - ops_before;
                    drop(store);
                    io = io.reboot();
                    store = PartitionStore::open(&mut io, dir(), PID, config.clone())
                        .unwrap_or_else(|e| panic!("seed {seed} step {step}: open: {e}"));
                    let got = log_of(&mut io, &mut store);
                    assert!(
                        model.allows(&after, &got),
                        "seed {seed} step {step} (crash {} I/Os in): ops {:?} open; before {:?} acked {}, after {:?} acked {}",
                        crash_io,
                        got.iter().map(|b| op_of(b)).collect::<Vec<_>>(),
                        model.log.iter().map(|b| op_of(b)).collect::<Vec<_>>(),
                        model.acked,
                        after.log.iter().map(|b| op_of(b)).collect::<Vec<_>>(),
                        after.acked,
                    );
                    crashes += 1;
                    let vsr = store.superblock().vsr;
                    assert!(
                        vsr == model.vsr || vsr == after.vsr,
                        "seed {seed} step {step}"
                    );
                    model = RandomModel {
                        acked: got.len(),
                        log: got,
                        vsr,
                    };
                    continue;
                }
            }
            model = after;
            if crash {
                io.set_crash_at(u64::MAX, false);
            }
            if rng.chance(1, 12) {
                // A power cut between steps: the acknowledged log, and
                // maybe appends a full write buffer or a roll flushed.
                drop(store);
                io = io.reboot();
                store = PartitionStore::open(&mut io, dir(), PID, config.clone()).unwrap();
                let got = log_of(&mut io, &mut store);
                assert!(
                    model.allows(&model, &got),
                    "seed {seed} step {step}: ops {:?} open; accepted {:?} acked {}",
                    got.iter().map(|b| op_of(b)).collect::<Vec<_>>(),
                    model.log.iter().map(|b| op_of(b)).collect::<Vec<_>>(),
                    model.acked
                );
                model.acked = got.len();
                model.log = got;
                assert_eq!(store.superblock().vsr, model.vsr);
            }
        }
    }
    println!("{cuts} cuts, {crashes} crashes inside a step");
    assert!(
        cuts > 1000 && crashes > 200,
        "{cuts} cuts, {crashes} crashes"
    );
}

/// A cut voids the flush trailers written before it by their slot
/// sequence, not only by zeroing them: one that survived on disk (a lost
/// or misdirected zeroing write, put back here by hand) must not make
/// recovery call a torn tail past the cut Corruption.
#[test]
fn a_flush_trailer_from_before_a_cut_is_void_even_if_it_survives() {
    use ringlog_storage::segment::{FlushTrailer, TRAILER_BYTES};
    let config = small_config();
    let mut io = SimBackend::new(15);
    let mut store = partition_with_ops(&mut io, config.clone(), 10);
    let segment = dir()
        .join(format!("gen-{:020}", 1))
        .join(format!("{:020}.log", 0));
    let before = io.read_whole(&segment).unwrap().to_vec();
    // Where the cut lands: the batches of ops 1..=5 (one segment, from 0).
    let log = log_of(&mut io, &mut store);
    assert!(store.sealed_segments().next().is_none());
    let end: u64 = log.iter().take(5).map(|b| b.len() as u64).sum();
    let stale: Vec<(usize, Vec<u8>)> = before
        .chunks_exact(TRAILER_BYTES as usize)
        .enumerate()
        .map(|(i, s)| (i * TRAILER_BYTES as usize, s))
        .filter(|(at, s)| {
            FlushTrailer::decode(s).is_some_and(|t| t.durable_position > end) && *at as u64 > end
        })
        .map(|(at, s)| (at, s.to_vec()))
        .collect();
    assert!(!stale.is_empty(), "no trailer past the cut to put back");
    store.truncate_above(&mut io, 5).unwrap();
    // One batch after the cut, then damage to it: past every record, it is
    // a torn tail, unless a trailer claims it durable.
    let batch = op_batch(&store, 6, 600, 100);
    store.append(&mut io, &batch).unwrap();
    store.flush(&mut io).unwrap();
    drop(store);
    let (at, sector) = stale.last().unwrap();
    assert!(*at as u64 > end + batch.len() as u64 + 4096);
    io.corrupt(&segment, *at, sector);
    let flip = end as usize + 100;
    let byte = io.read_whole(&segment).unwrap()[flip];
    io.corrupt(&segment, flip, &[byte ^ 1]);
    let mut io = io.reboot();
    let mut store = PartitionStore::open(&mut io, dir(), PID, config)
        .unwrap_or_else(|e| panic!("a trailer from before the cut was trusted: {e}"));
    let ops: Vec<u64> = log_of(&mut io, &mut store)
        .iter()
        .map(|b| op_of(b))
        .collect();
    assert_eq!(ops, [1, 2, 3, 4, 5]);
}

/// With a headroom, a roll due while a flush is in flight waits for a
/// later append (the batch goes into the headroom), so a caller that
/// waits for its flush only before batches past the capacity (the shard's
/// rule) never makes the store flush twice at once.
#[test]
fn a_roll_due_during_a_flush_in_flight_waits_for_the_next_append() {
    let headroom = 16 * 1024;
    let config = StoreConfig {
        uncommitted_headroom_bytes: Some(headroom),
        ..small_config()
    };
    let mut io = SimBackend::new(16);
    let mut store = PartitionStore::create(&mut io, dir(), PID, config).unwrap();
    let capacity = store.active_capacity_bytes();
    let mut op = 0;
    // Committed batches up to just below the roll point.
    loop {
        let batch = op_batch(&store, op + 1, op + 1, 1500);
        if store.size_bytes() + batch.len() as u64 > capacity - headroom {
            break;
        }
        op += 1;
        store.append(&mut io, &batch).unwrap();
        store.flush(&mut io).unwrap();
        store.note_commit(op);
    }
    // A flush in flight, then a batch past the roll point that fits.
    store
        .append(&mut io, &op_batch(&store, op + 1, op + 1, 10))
        .unwrap();
    op += 1;
    store.note_commit(op);
    let mut sqes = Vec::new();
    assert!(store.prepare_flush(&mut sqes).unwrap() > 0);
    let batch = op_batch(&store, op + 1, op + 1, 1500);
    assert!(!store.append_rolls(batch.len()));
    store.append(&mut io, &batch).unwrap();
    op += 1;
    assert!(
        store.sealed_segments().next().is_none(),
        "rolled with a flush in flight"
    );
    assert!(store.size_bytes() > capacity - headroom);
    let completions = io.submit(sqes);
    store.complete_flush(completions).unwrap();
    store.flush(&mut io).unwrap();
    store.note_commit(op);
    // No flush in flight: the next append rolls.
    let batch = op_batch(&store, op + 1, op + 1, 100);
    assert!(store.append_rolls(batch.len()));
    store.append(&mut io, &batch).unwrap();
    assert_eq!(store.sealed_segments().count(), 1);
}

/// Guards against: a slot record that open found below the superblock's
/// frontier (a checkpoint written after it, here by `close`) was left out of
/// the slot sequence in effect, so a later cut's `slot_floor` did not void
/// it. A cut below that record then left a record naming cut bytes: the
/// rescan after the cut, and every open after it, refused the log as
/// corrupt ("bad magic" where the cut ends it; sim seed 13006067 with
/// transfers and purges).
#[test]
fn a_cut_voids_slot_records_that_open_found_below_the_checkpoint() {
    use ringlog_storage::store::FRONTIER_SLOT_EVERY_FLUSHES;
    let config = small_config();
    let mut io = SimBackend::new(21);
    // Two slot records (sequences 0 and 1), then a few flushes past them.
    let flushes = 2 * FRONTIER_SLOT_EVERY_FLUSHES + 5;
    let mut store = PartitionStore::create(&mut io, dir(), PID, config.clone()).unwrap();
    for op in 1..=flushes {
        let batch = op_batch(&store, op, op, 100);
        store.append(&mut io, &batch).unwrap();
        store.flush(&mut io).unwrap();
    }
    assert!(store.sealed_segments().next().is_none(), "one segment");
    // A checkpoint at the durable end, above both slot records.
    store.close(&mut io).unwrap();
    let mut io = io.reboot();
    let mut store = PartitionStore::open(&mut io, dir(), PID, config.clone()).unwrap();
    assert_eq!(store.chain().last_op, flushes);
    let cut_op = 10;
    store
        .truncate_above(&mut io, cut_op)
        .unwrap_or_else(|e| panic!("the cut read its own log back as corrupt: {e}"));
    drop(store);
    let mut io = io.reboot();
    let mut store = PartitionStore::open(&mut io, dir(), PID, config)
        .unwrap_or_else(|e| panic!("a slot record from before the cut was trusted: {e}"));
    let ops: Vec<u64> = log_of(&mut io, &mut store)
        .iter()
        .map(|b| op_of(b))
        .collect();
    assert_eq!(ops, (1..=cut_op).collect::<Vec<_>>());
}
