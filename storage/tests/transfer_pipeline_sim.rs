//! Overlapped transfer I/O on sim stores: the serving side reads window k+1
//! (`start_read_chunks`) while the receiver's staged writes of window k are
//! in flight (`stage_chunks`). A failed write in an overlapped window fails
//! the install and the old state stays (also across a reboot); a failed
//! read is a typed error; staged writes in flight count against the window.

mod common;

use std::path::Path;

use common::{next_batch, read_all, small_config};
use ringlog_protocol::manifest::{Manifest, ManifestLimits};
use ringlog_storage::io::sim::{Fault, FaultOp, SimBackend};
use ringlog_storage::io::{BatchId, BufPool, Completion, IoBackend};
use ringlog_storage::store::{
    ChunkCheck, InstallBudget, PartitionStore, StoreError, TransferError,
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
fn run(p: &mut Pair, mut before_stage: impl FnMut(usize, &mut SimBackend)) -> Ran {
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
        ran.result = p.dst.commit_install(&mut p.dst_io, install);
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
    let Pair { dst_io, dst, .. } = p;
    drop(dst);
    let mut io = dst_io.reboot();
    let mut dst = PartitionStore::open(&mut io, Path::new("/dst"), PID, small_config()).unwrap();
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
    let Pair { dst_io, dst, .. } = p;
    drop(dst);
    let mut io = dst_io.reboot();
    let mut dst = PartitionStore::open(&mut io, Path::new("/dst"), PID, small_config()).unwrap();
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
