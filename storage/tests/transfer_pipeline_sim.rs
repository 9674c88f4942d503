//! Overlapped transfer I/O on sim stores: the serving side reads window k+1
//! (`start_read_chunks`) while the receiver's staged writes of window k are
//! in flight (`stage_chunks`). A failed write in an overlapped window fails
//! the install and the old state stays (also across a reboot); a failed
//! read is a typed error; staged writes in flight count against the window.
//! The commit runs as the store's step machine on `submit_nowait` and
//! `reap` alone (no wait of any kind), and its failures through it keep
//! their meaning: a staged fdatasync's EIO fences, a failed rename leaves
//! the old state.

mod common;

use std::path::Path;

use common::{next_batch, read_all, small_config};
use ringlog_protocol::manifest::{Manifest, ManifestLimits};
use ringlog_storage::io::sim::{Fault, FaultOp, SimBackend};
use ringlog_storage::io::{BatchId, BufPool, Completion, FileId, IoBackend, Op, OpenMode, Sqe};
use ringlog_storage::store::{
    ChunkCheck, Install, InstallBudget, PartitionStore, Step, StoreError, TransferError,
};

const PID: u32 = 5;
const NOW_MS: u64 = 1_000_000;
const EIO: i32 = 5;

fn append(io: &mut SimBackend, store: &mut PartitionStore, n: u64, seed: u64) {
    for i in 0..n {
        let batch = next_batch(store, 3, 900, seed * 1000 + i);
        store.append(io, &batch).unwrap();
    }
    store.flush(io).unwrap();
}

/// Reaps `io` until `batch` is handed back (the sim runs held ops on
/// reap); other batches finished meanwhile wait in `done`.
fn reap_into(
    io: &mut SimBackend,
    batch: BatchId,
    done: &mut Vec<(BatchId, Vec<Completion>)>,
) -> Vec<Completion> {
    for _ in 0..100_000 {
        if let Some(i) = done.iter().position(|(id, _)| *id == batch) {
            return done.swap_remove(i).1;
        }
        done.extend(io.reap());
    }
    panic!("batch {batch:?} never finished");
}

/// [`reap_into`] where nothing else is in flight.
fn reap_until(io: &mut SimBackend, batch: BatchId) -> Vec<Completion> {
    let mut done = Vec::new();
    let c = reap_into(io, batch, &mut done);
    assert!(done.is_empty(), "no other batch was in flight");
    c
}

struct Pair {
    src_io: SimBackend,
    src: PartitionStore,
    dst_io: SimBackend,
    dst: PartitionStore,
}

/// The receiver's disk after a crash, and its store reopened there.
fn rebooted(p: Pair) -> (SimBackend, PartitionStore) {
    let Pair { dst_io, dst, .. } = p;
    drop(dst);
    let mut io = dst_io.reboot();
    let dst = PartitionStore::open(&mut io, Path::new("/dst"), PID, small_config()).unwrap();
    (io, dst)
}

/// A source of 160 batches (several windows) and a receiver with a log of its own (3
/// batches), each on its own disk.
fn pair(seed: u64) -> Pair {
    let mut src_io = SimBackend::new(seed);
    let mut src = PartitionStore::create(&mut src_io, Path::new("/src"), PID, small_config())
        .expect("source");
    append(&mut src_io, &mut src, 160, 1);
    let mut dst_io = SimBackend::new(seed + 1);
    let mut dst = PartitionStore::create(&mut dst_io, Path::new("/dst"), PID, small_config())
        .expect("receiver");
    append(&mut dst_io, &mut dst, 3, 2);
    Pair {
        src_io,
        src,
        dst_io,
        dst,
    }
}

/// How the pipelined transfer of [`run`] ended.
struct Ran {
    result: Result<(), StoreError>,
    /// Windows whose read was in flight while an earlier window's staged
    /// writes were.
    overlapped: usize,
    buffered_bytes_peak: u64,
}

/// Transfers `p.src` into `p.dst` a window at a time, reading window k+1
/// while window k's staged writes are in flight; `before_stage(k, io)` runs
/// before window k is staged (to inject a fault).
fn run(p: &mut Pair, before_stage: impl FnMut(usize, &mut SimBackend)) -> Ran {
    run_with(p, before_stage, |store, io, install| {
        store.commit_install(io, install)
    })
}

/// [`run`], committing with `commit`.
fn run_with(
    p: &mut Pair,
    mut before_stage: impl FnMut(usize, &mut SimBackend),
    commit: impl FnOnce(&mut PartitionStore, &mut SimBackend, Install) -> Result<(), StoreError>,
) -> Ran {
    let m = p.src.open_snapshot(&mut p.src_io, NOW_MS).unwrap();
    let id = m.snapshot_id;
    let offer = Manifest::decode(&m.encode(), &ManifestLimits::default()).unwrap();
    let mut install = p
        .dst
        .begin_install(&mut p.dst_io, offer, &InstallBudget::new(4 << 20))
        .unwrap();
    let window = install.window_chunks();
    let keys: Vec<(u32, u32)> = install.missing().collect();
    let windows: Vec<&[(u32, u32)]> = keys.chunks(window).collect();
    let mut pool = BufPool::lazy(small_config().transfer_chunk_bytes as usize, 2 * window);
    let mut reads = Some(
        p.src
            .start_read_chunks(&mut p.src_io, id, windows[0], NOW_MS, &mut pool)
            .unwrap(),
    );
    let mut ran = Ran {
        result: Ok(()),
        overlapped: 0,
        buffered_bytes_peak: 0,
    };
    for k in 0..windows.len() {
        let r = reads.take().expect("a window read in flight");
        let batch = r.batch().expect("queued");
        let bufs = r.finish(reap_until(&mut p.src_io, batch)).unwrap();
        if let Some(next) = windows.get(k + 1) {
            // The next window is read while this one is written.
            reads = Some(
                p.src
                    .start_read_chunks(&mut p.src_io, id, next, NOW_MS, &mut pool)
                    .unwrap(),
            );
        }
        let chunks: Vec<(u32, u32, &[u8])> = windows[k]
            .iter()
            .zip(&bufs)
            .map(|(&(a, c), b)| (a, c, &b[..]))
            .collect();
        before_stage(k, &mut p.dst_io);
        let staged = match install.stage_chunks(&mut p.dst_io, &chunks, ChunkCheck::Checksum) {
            Ok(staged) => staged,
            Err(e) => {
                ran.result = Err(e);
                break;
            }
        };
        ran.buffered_bytes_peak = ran.buffered_bytes_peak.max(install.buffered_bytes());
        if let Some(batch) = staged {
            if reads.is_some() {
                ran.overlapped += 1;
            }
            let done = reap_until(&mut p.dst_io, batch);
            if let Err(e) = install.finish_staged(batch, done) {
                ran.result = Err(e);
                break;
            }
        }
        for buf in bufs {
            pool.put(buf);
        }
    }
    // A read still in flight when the install failed finishes regardless.
    if let Some(r) = reads.take() {
        let batch = r.batch().expect("queued");
        r.finish(reap_until(&mut p.src_io, batch)).unwrap();
    }
    p.src.release_snapshot(id);
    if ran.result.is_ok() {
        ran.result = commit(&mut p.dst, &mut p.dst_io, install);
    } else {
        assert!(install.poisoned().is_some(), "a failed write poisons");
        let again = install.stage_chunks(&mut p.dst_io, &[], ChunkCheck::Checksum);
        assert!(matches!(
            again,
            Err(StoreError::Transfer {
                source: TransferError::Poisoned { .. },
                ..
            })
        ));
        let commit = p.dst.commit_install(&mut p.dst_io, install);
        assert!(commit.is_err(), "a poisoned install never commits");
    }
    ran
}

#[test]
fn an_overlapped_transfer_installs_the_source_log() {
    let mut p = pair(11);
    let want = read_all(&mut p.src_io, &mut p.src);
    let ran = run(&mut p, |_, _| {});
    ran.result.expect("installed");
    assert!(
        ran.overlapped >= 2,
        "reads overlapped {} windows",
        ran.overlapped
    );
    assert_eq!(read_all(&mut p.dst_io, &mut p.dst), want);
    // Bounded by the window of chunk buffers (the pool's idle ones too).
    let cfg = small_config();
    let bound = cfg.transfer_window_chunks as u64 * u64::from(cfg.transfer_chunk_bytes);
    assert!(ran.buffered_bytes_peak > 0);
    assert!(
        ran.buffered_bytes_peak <= bound,
        "{} buffered over {bound}",
        ran.buffered_bytes_peak
    );
    let (mut io, mut dst) = rebooted(p);
    assert_eq!(read_all(&mut io, &mut dst), want);
}

#[test]
fn a_failed_staged_write_in_an_overlapped_window_fails_the_install_and_the_old_state_stays() {
    let mut p = pair(12);
    let old = read_all(&mut p.dst_io, &mut p.dst);
    let old_durable = p.dst.durable();
    let ran = run(&mut p, |k, io| {
        if k == 1 {
            // The first write of the second window, read while the first
            // was written.
            let nth = io.op_count(FaultOp::Write);
            io.inject(FaultOp::Write, nth, Fault::Errno(EIO));
        }
    });
    let err = ran.result.expect_err("the write failed");
    assert!(
        matches!(err, StoreError::Io { .. }),
        "a staged write's EIO, got {err}"
    );
    assert!(ran.overlapped >= 1);
    assert_eq!(p.dst.durable(), old_durable);
    assert_eq!(read_all(&mut p.dst_io, &mut p.dst), old);
    let (mut io, mut dst) = rebooted(p);
    assert_eq!(dst.durable(), old_durable);
    assert_eq!(read_all(&mut io, &mut dst), old);
}

#[test]
fn a_failed_read_of_a_queued_window_is_a_typed_error() {
    let mut p = pair(13);
    let m = p.src.open_snapshot(&mut p.src_io, NOW_MS).unwrap();
    let mut pool = BufPool::lazy(small_config().transfer_chunk_bytes as usize, 4);
    for (fault, want_io) in [(Fault::Errno(EIO), true), (Fault::BitFlip, false)] {
        let nth = p.src_io.op_count(FaultOp::Read);
        p.src_io.inject(FaultOp::Read, nth + 1, fault);
        let keys = [(0, 0), (0, 1), (0, 2)];
        let r = p
            .src
            .start_read_chunks(&mut p.src_io, m.snapshot_id, &keys, NOW_MS, &mut pool)
            .unwrap();
        assert_eq!(r.len(), 3);
        let batch = r.batch().unwrap();
        let err = r.finish(reap_until(&mut p.src_io, batch)).unwrap_err();
        match err {
            StoreError::Io { .. } => assert!(want_io, "{err}"),
            StoreError::Corruption { .. } => assert!(!want_io, "{err}"),
            other => panic!("unexpected {other}"),
        }
    }
    // Without a fault the same window reads as offered.
    let r = p
        .src
        .start_read_chunks(&mut p.src_io, m.snapshot_id, &[(0, 0)], NOW_MS, &mut pool)
        .unwrap();
    let batch = r.batch().unwrap();
    let bufs = r.finish(reap_until(&mut p.src_io, batch)).unwrap();
    let want = p
        .src
        .read_chunk(&mut p.src_io, m.snapshot_id, 0, 0, NOW_MS)
        .unwrap();
    assert_eq!(&bufs[0][..], &want[..]);
}

#[test]
fn staged_writes_in_flight_count_against_the_window() {
    let mut p = pair(14);
    let m = p.src.open_snapshot(&mut p.src_io, NOW_MS).unwrap();
    let offer = Manifest::decode(&m.encode(), &ManifestLimits::default()).unwrap();
    let mut install = p
        .dst
        .begin_install(&mut p.dst_io, offer, &InstallBudget::new(4 << 20))
        .unwrap();
    let window = install.window_chunks();
    let keys: Vec<(u32, u32)> = install.missing().take(window + 1).collect();
    let bufs = p
        .src
        .read_chunks(&mut p.src_io, m.snapshot_id, &keys, NOW_MS)
        .unwrap();
    let chunk = |i: usize| (keys[i].0, keys[i].1, &bufs[i][..]);
    // A window of chunks, each staged on its own and all still in flight.
    let mut batches = Vec::new();
    for i in 0..window {
        let batch = install
            .stage_chunks(&mut p.dst_io, &[chunk(i)], ChunkCheck::Checksum)
            .unwrap();
        batches.push(batch.expect("due, so written"));
    }
    assert_eq!(install.writes_in_flight(), window);
    let full = install.stage_chunks(&mut p.dst_io, &[chunk(window)], ChunkCheck::Checksum);
    assert!(
        matches!(
            full,
            Err(StoreError::Transfer {
                source: TransferError::OutsideWindow { .. },
                ..
            })
        ),
        "a chunk beyond the window while a window is being written"
    );
    // Finishing one write makes room.
    let mut reaped = Vec::new();
    let done = reap_into(&mut p.dst_io, batches[0], &mut reaped);
    install.finish_staged(batches[0], done).unwrap();
    let staged = install
        .stage_chunks(
            &mut p.dst_io,
            &[chunk(window)],
            ChunkCheck::VerifiedByCaller,
        )
        .unwrap();
    batches.push(staged.expect("due"));
    // A batch it did not queue is refused, typed.
    assert!(install
        .finish_staged(BatchId(u64::MAX), Vec::new())
        .is_err());
    for &batch in &batches[1..] {
        let done = reap_into(&mut p.dst_io, batch, &mut reaped);
        install.finish_staged(batch, done).unwrap();
    }
    assert_eq!(install.writes_in_flight(), 0);
    assert!(install.poisoned().is_none());
    p.dst.abort_install(&mut p.dst_io, install).unwrap();
}

/// A chunk staged as verified by its caller skips only the manifest hash:
/// a flipped byte in it is still caught by the log verification before
/// anything is written (and poisons the install, the chunk being consumed);
/// hashed here, the same chunk is refused as a bad chunk up front.
#[test]
fn a_corrupt_chunk_the_caller_vouched_for_is_still_verified_as_a_log() {
    let mut p = pair(15);
    let m = p.src.open_snapshot(&mut p.src_io, NOW_MS).unwrap();
    let offer = || Manifest::decode(&m.encode(), &ManifestLimits::default()).unwrap();
    let keys: Vec<(u32, u32)> = offer()
        .artifacts
        .iter()
        .enumerate()
        .flat_map(|(a, art)| (0..art.chunk_checksums.len() as u32).map(move |c| (a as u32, c)))
        .take(1)
        .collect();
    let bufs = p
        .src
        .read_chunks(&mut p.src_io, m.snapshot_id, &keys, NOW_MS)
        .unwrap();
    let mut bad = bufs[0].to_vec();
    let mid = bad.len() / 2;
    bad[mid] ^= 0x40;
    let (a, c) = keys[0];
    let budget = InstallBudget::new(4 << 20);

    let mut hashed = p
        .dst
        .begin_install(&mut p.dst_io, offer(), &budget)
        .unwrap();
    let refused = hashed.stage_chunks(&mut p.dst_io, &[(a, c, &bad)], ChunkCheck::Checksum);
    assert!(
        matches!(
            refused,
            Err(StoreError::Transfer {
                source: TransferError::BadChunk { .. },
                ..
            })
        ),
        "{refused:?}"
    );
    assert!(hashed.poisoned().is_none(), "refused before it was taken");
    p.dst.abort_install(&mut p.dst_io, hashed).unwrap();

    let mut vouched = p
        .dst
        .begin_install(&mut p.dst_io, offer(), &budget)
        .unwrap();
    let ops_before = p.dst_io.ops_count();
    let refused =
        vouched.stage_chunks(&mut p.dst_io, &[(a, c, &bad)], ChunkCheck::VerifiedByCaller);
    assert!(
        matches!(
            refused,
            Err(StoreError::Transfer {
                source: TransferError::Verification { .. },
                ..
            })
        ),
        "{refused:?}"
    );
    assert_eq!(p.dst_io.ops_count(), ops_before, "nothing written");
    assert!(vouched.poisoned().is_some());
    assert!(p.dst.commit_install(&mut p.dst_io, vouched).is_err());
}

/// A backend that counts every call that may wait (a blocking submission,
/// a waiting reap, the synchronous metadata calls, which the io_uring
/// backend runs as one-op submissions it waits for): a caller on the shard
/// thread must make none.
struct NoWait<'a> {
    io: &'a mut SimBackend,
    waits: u64,
    /// The kinds of the ops queued without waiting, in order.
    queued: Vec<&'static str>,
}

impl<'a> NoWait<'a> {
    fn new(io: &'a mut SimBackend) -> Self {
        Self {
            io,
            waits: 0,
            queued: Vec::new(),
        }
    }

    fn waited<T>(&mut self, what: T) -> T {
        self.waits += 1;
        what
    }
}

impl IoBackend for NoWait<'_> {
    fn open_file(&mut self, path: &Path, mode: OpenMode) -> std::io::Result<FileId> {
        let r = self.io.open_file(path, mode);
        self.waited(r)
    }
    fn open_dir(&mut self, path: &Path) -> std::io::Result<FileId> {
        let r = self.io.open_dir(path);
        self.waited(r)
    }
    fn close(&mut self, file: FileId) {
        self.io.close(file)
    }
    fn create_dir(&mut self, path: &Path) -> std::io::Result<()> {
        let r = self.io.create_dir(path);
        self.waited(r)
    }
    // getdents has no ring op: a plain call on every backend.
    fn list_dir(&mut self, path: &Path) -> std::io::Result<Vec<String>> {
        self.io.list_dir(path)
    }
    fn exists(&mut self, path: &Path) -> std::io::Result<bool> {
        let r = self.io.exists(path);
        self.waited(r)
    }
    fn file_size(&mut self, file: FileId) -> std::io::Result<u64> {
        let r = self.io.file_size(file);
        self.waited(r)
    }
    fn allocate_range(&mut self, file: FileId, offset: u64, len_bytes: u64) -> std::io::Result<()> {
        let r = self.io.allocate_range(file, offset, len_bytes);
        self.waited(r)
    }
    fn submit(&mut self, batch: Vec<Sqe>) -> Vec<Completion> {
        let r = self.io.submit(batch);
        self.waited(r)
    }
    fn submit_nowait(&mut self, batch: Vec<Sqe>) -> BatchId {
        self.queued.extend(batch.iter().map(|s| s.op.kind()));
        self.io.submit_nowait(batch)
    }
    fn reap(&mut self) -> Vec<(BatchId, Vec<Completion>)> {
        self.io.reap()
    }
    fn reap_waiting(&mut self, timeout: std::time::Duration) -> Vec<(BatchId, Vec<Completion>)> {
        let r = self.io.reap_waiting(timeout);
        self.waited(r)
    }
    fn batches_running(&self) -> usize {
        self.io.batches_running()
    }
}

/// Commits `install` as the shard does: each step queued with
/// `submit_nowait`, its completions reaped and fed back; `before(sqes, io)`
/// sees each step's submission first (to inject a fault). Returns the
/// result and the waits the store made.
fn commit_nowait(
    store: &mut PartitionStore,
    io: &mut SimBackend,
    install: Install,
    before: impl FnMut(&[Sqe], &mut SimBackend),
) -> (Result<(), StoreError>, u64, usize) {
    let mut io = NoWait::new(io);
    let (mut finishing, step) = store.start_commit(&mut io, install);
    let (result, steps) = steps_nowait(&mut io, step, before, |io, completions| {
        store.resume_finish(io, &mut finishing, completions)
    });
    (result, io.waits, steps)
}

/// Runs a step machine as the shard does: each step queued with
/// `submit_nowait`, its completions reaped and fed back through `resume`;
/// `before(sqes, io)` sees each step's submission first. Returns the result
/// and the steps.
fn steps_nowait<'a, T>(
    io: &mut NoWait<'a>,
    mut step: Step<T>,
    mut before: impl FnMut(&[Sqe], &mut SimBackend),
    mut resume: impl FnMut(&mut NoWait<'a>, Vec<Completion>) -> Step<T>,
) -> (Result<T, StoreError>, usize) {
    let mut steps = 0;
    loop {
        match step {
            Step::Submit(sqes) => {
                steps += 1;
                before(&sqes, io.io);
                let batch = io.submit_nowait(sqes);
                let completions = reap_until(io.io, batch);
                step = resume(io, completions);
            }
            Step::Done(result) => return (result, steps),
        }
    }
}

/// Guards against: an install's commit (its index and table writes, the
/// staged fdatasyncs, the rename, the superblock, the old generation's
/// removal) waiting on the shard thread for any I/O.
#[test]
fn a_commit_through_its_steps_never_waits_and_installs_the_source_log() {
    let mut p = pair(15);
    let want = read_all(&mut p.src_io, &mut p.src);
    let mut counted = (0, 0);
    let ran = run_with(
        &mut p,
        |_, _| {},
        |store, io, install| {
            let (result, waits, steps) = commit_nowait(store, io, install, |_, _| {});
            counted = (waits, steps);
            result
        },
    );
    ran.result.expect("installed");
    assert_eq!(counted.0, 0, "the commit waited {} times", counted.0);
    assert!(
        counted.1 >= 6,
        "{} steps: index, table, segment, sync, rename, superblock",
        counted.1
    );
    assert_eq!(read_all(&mut p.dst_io, &mut p.dst), want);
    let (mut io, mut dst) = rebooted(p);
    assert_eq!(read_all(&mut io, &mut dst), want);

    // The counter sees the waits of the blocking loop over the same steps.
    let mut p = pair(16);
    let mut waits = 0;
    let ran = run_with(
        &mut p,
        |_, _| {},
        |store, io, install| {
            let mut io = NoWait::new(io);
            let result = store.commit_install(&mut io, install);
            waits = io.waits;
            result
        },
    );
    ran.result.expect("installed");
    assert!(waits >= 6, "the blocking commit counted {waits} waits");
}

/// The staged fdatasync submission of a commit: every staged file's
/// fdatasync and the staging directory's fsync.
fn is_staged_sync(sqes: &[Sqe]) -> bool {
    sqes.len() >= 2
        && sqes
            .iter()
            .all(|s| matches!(s.op, Op::Fdatasync { .. } | Op::Fsync { .. }))
}

/// Guards against: a staged fdatasync's EIO, reaped by the step machine,
/// taken as success (the superblock would name unsynced data) or left
/// unfenced.
#[test]
fn a_staged_fdatasync_eio_in_a_stepped_commit_fences_and_the_old_state_stays() {
    let mut p = pair(17);
    let old = read_all(&mut p.dst_io, &mut p.dst);
    let old_sb = p.dst.superblock().clone();
    let mut injected = false;
    let ran = run_with(
        &mut p,
        |_, _| {},
        |store, io, install| {
            let (result, waits, _) = commit_nowait(store, io, install, |sqes, io| {
                if !injected && is_staged_sync(sqes) {
                    injected = true;
                    // The last of the batch: every completion is checked.
                    let nth = io.op_count(FaultOp::Sync) + sqes.len() as u64 - 1;
                    io.inject(FaultOp::Sync, nth, Fault::Errno(EIO));
                }
            });
            assert_eq!(waits, 0);
            result
        },
    );
    assert!(injected, "no staged sync step");
    let err = ran.result.expect_err("the fdatasync failed");
    assert!(
        matches!(err, StoreError::Fenced { .. }),
        "fenced, got {err}"
    );
    assert!(p.dst.fenced().is_some());
    assert_eq!(p.dst.superblock(), &old_sb, "no commit point");
    let (mut io, mut dst) = rebooted(p);
    assert_eq!(dst.superblock().sequence, old_sb.sequence);
    assert_eq!(read_all(&mut io, &mut dst), old);
}

/// Guards against: a failed rename, reaped by the step machine, going on
/// to the superblock, fencing, or leaving the staging directory behind.
#[test]
fn a_failed_rename_in_a_stepped_commit_aborts_and_the_old_state_stays() {
    let mut p = pair(18);
    let old = read_all(&mut p.dst_io, &mut p.dst);
    let old_sb = p.dst.superblock().clone();
    let mut injected = false;
    let ran = run_with(
        &mut p,
        |_, _| {},
        |store, io, install| {
            let (result, waits, _) = commit_nowait(store, io, install, |sqes, io| {
                if !injected
                    && matches!(sqes.first().map(|s| &s.op), Some(Op::Rename { .. }))
                    && sqes.len() == 2
                {
                    injected = true;
                    io.set_fail_at(io.ops_count());
                }
            });
            assert_eq!(waits, 0);
            result
        },
    );
    assert!(injected, "no rename step");
    let err = ran.result.expect_err("the rename failed");
    assert!(
        matches!(err, StoreError::Io { .. }),
        "an I/O error, not a fence: {err}"
    );
    assert!(p.dst.fenced().is_none());
    assert_eq!(p.dst.superblock(), &old_sb);
    assert!(
        !p.dst_io.exists(Path::new("/dst/staging")).unwrap(),
        "aborted: staging removed"
    );
    assert_eq!(read_all(&mut p.dst_io, &mut p.dst), old);
    let (mut io, mut dst) = rebooted(p);
    assert_eq!(dst.superblock().sequence, old_sb.sequence);
    assert_eq!(read_all(&mut io, &mut dst), old);
}

/// Begins an install of `manifest` as the shard does: each step queued
/// with `submit_nowait`, reaped and fed back; `before(sqes, io)` sees each
/// step's submission first (to inject a fault). Returns the result, the
/// waits the store made and the steps.
fn begin_nowait(
    store: &mut PartitionStore,
    io: &mut SimBackend,
    manifest: Manifest,
    before: impl FnMut(&[Sqe], &mut SimBackend),
) -> (Result<Install, StoreError>, u64, usize) {
    let mut io = NoWait::new(io);
    let budget = InstallBudget::new(4 << 20);
    let (mut beginning, sqes) = match store.start_begin(&mut io, manifest, &budget) {
        Ok(started) => started,
        Err(e) => return (Err(e), io.waits, 0),
    };
    let (result, steps) = steps_nowait(&mut io, Step::Submit(sqes), before, |io, completions| {
        store.resume_begin(io, &mut beginning, completions)
    });
    (result.map(|i| *i), io.waits, steps)
}

/// The source's snapshot as an offer, and every chunk of it.
fn offer_and_chunks(p: &mut Pair) -> (Manifest, Vec<(u32, u32, Vec<u8>)>) {
    let m = p.src.open_snapshot(&mut p.src_io, NOW_MS).unwrap();
    let offer = Manifest::decode(&m.encode(), &ManifestLimits::default()).unwrap();
    let mut chunks = Vec::new();
    for (a, artifact) in offer.artifacts.iter().enumerate() {
        for c in 0..artifact.chunk_checksums.len() as u32 {
            let buf = p
                .src
                .read_chunk(&mut p.src_io, m.snapshot_id, a as u32, c, NOW_MS)
                .unwrap();
            chunks.push((a as u32, c, buf.to_vec()));
        }
    }
    p.src.release_snapshot(m.snapshot_id);
    (offer, chunks)
}

/// Guards against: any step of an install on the receiver (the begin with
/// a leftover staging directory to remove, the staged writes and their
/// fallocates, the commit) waiting on the shard thread for I/O.
#[test]
fn a_whole_install_through_its_steps_never_waits_and_installs_the_source_log() {
    let mut p = pair(19);
    let want = read_all(&mut p.src_io, &mut p.src);
    let (offer, chunks) = offer_and_chunks(&mut p);
    // Left by an install abandoned in an earlier process.
    let staging = Path::new("/dst/staging");
    p.dst_io.create_dir(staging).unwrap();
    let file = p
        .dst_io
        .open_file(&staging.join("leftover.log"), OpenMode::Create)
        .unwrap();
    p.dst_io.close(file);

    let (begun, waits, steps) = begin_nowait(&mut p.dst, &mut p.dst_io, offer, |_, _| {});
    let mut install = begun.expect("begun");
    assert_eq!(waits, 0, "the begin waited {waits} times");
    assert_eq!(steps, 5, "stat, stale files, stale dir, mkdir, create");
    assert!(!p.dst_io.exists(&staging.join("leftover.log")).unwrap());

    let mut io = NoWait::new(&mut p.dst_io);
    for window in chunks.chunks(install.window_chunks()) {
        let window: Vec<(u32, u32, &[u8])> =
            window.iter().map(|(a, c, b)| (*a, *c, &b[..])).collect();
        let batch = install
            .stage_chunks(&mut io, &window, ChunkCheck::Checksum)
            .unwrap()
            .expect("a window comes due");
        let done = reap_until(io.io, batch);
        install.finish_staged(batch, done).unwrap();
    }
    assert_eq!(io.waits, 0, "staging waited {} times", io.waits);
    assert_eq!(io.queued.first(), Some(&"fallocate"), "{:?}", io.queued);
    let fallocates = io.queued.iter().filter(|k| **k == "fallocate").count();
    assert!(fallocates >= 2, "a window at a time: {:?}", io.queued);

    let (result, waits, _) = commit_nowait(&mut p.dst, &mut p.dst_io, install, |_, _| {});
    result.expect("installed");
    assert_eq!(waits, 0, "the commit waited {waits} times");
    assert_eq!(read_all(&mut p.dst_io, &mut p.dst), want);
    let (mut io, mut dst) = rebooted(p);
    assert_eq!(read_all(&mut io, &mut dst), want);
}

/// Guards against: a begin whose mkdir or one of whose file creates fails
/// leaving the staging directory or an open file behind, or waiting.
#[test]
fn a_begin_that_fails_mid_way_cleans_up_without_waiting_and_a_retry_installs() {
    for (label, seed) in [("mkdir", 21), ("create", 23)] {
        let mut p = pair(seed);
        let want = read_all(&mut p.src_io, &mut p.src);
        let (offer, chunks) = offer_and_chunks(&mut p);
        assert!(offer.artifacts.len() >= 2, "several files to create");
        let mut injected = false;
        let (begun, waits, _) =
            begin_nowait(&mut p.dst, &mut p.dst_io, offer.clone(), |sqes, io| {
                let hit = match sqes.first().map(|s| &s.op) {
                    Some(Op::MakeDir { .. }) => label == "mkdir",
                    Some(Op::Open { .. }) => label == "create" && sqes.len() > 2,
                    _ => false,
                };
                if hit && !injected {
                    injected = true;
                    // The second file's create in the create batch.
                    let nth = if label == "create" { 2 } else { 0 };
                    io.set_fail_at(io.ops_count() + nth);
                }
            });
        assert!(injected, "{label}: no such step");
        let err = begun.err().expect("the begin failed");
        assert!(matches!(err, StoreError::Io { .. }), "{label}: {err}");
        assert_eq!(waits, 0, "{label}: waited");
        assert!(
            !p.dst_io.exists(Path::new("/dst/staging")).unwrap(),
            "{label}: staging left behind"
        );
        let open_staged = p
            .dst_io
            .open_paths()
            .into_iter()
            .filter(|path| path.to_string_lossy().contains("staging"))
            .count();
        assert_eq!(open_staged, 0, "{label}: staged files left open");

        let (begun, _, _) = begin_nowait(&mut p.dst, &mut p.dst_io, offer, |_, _| {});
        let mut install = begun.expect("the retry begins");
        let all: Vec<(u32, u32, &[u8])> = chunks.iter().map(|(a, c, b)| (*a, *c, &b[..])).collect();
        for window in all.chunks(install.window_chunks()) {
            install.accept_chunks(&mut p.dst_io, window).unwrap();
        }
        p.dst.commit_install(&mut p.dst_io, install).unwrap();
        assert_eq!(read_all(&mut p.dst_io, &mut p.dst), want, "{label}");
    }
}
