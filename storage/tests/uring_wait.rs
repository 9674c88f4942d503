//! `UringBackend::wait_and_reap`: one wait in the ring for what is in flight
//! (the storage-level append job waits this way, not on an eventfd).

use std::io;
use std::time::{Duration, Instant};

use ringlog_storage::io::uring::UringBackend;
use ringlog_storage::io::{AlignedBuf, BatchId, Completion, FileId, IoBackend, Op, OpenMode, Sqe};

fn write(file: FileId, len: usize, seed: u8) -> Op {
    let mut buf = AlignedBuf::new(len);
    let bytes: Vec<u8> = (0..len).map(|i| (i as u8) ^ seed).collect();
    buf.extend_from_slice(&bytes);
    Op::Write {
        file,
        offset: 0,
        buf,
    }
}

fn errno(c: &Completion) -> Option<i32> {
    c.result.as_ref().err().and_then(io::Error::raw_os_error)
}

/// Calls `wait_and_reap` until every batch of `ids` came back (at most
/// `calls_max` times); returns their completions in the order of `ids` and
/// how many calls it took.
fn wait_for(
    backend: &mut UringBackend,
    ids: &[BatchId],
    calls_max: u32,
) -> (Vec<Vec<Completion>>, u32) {
    let mut done = Vec::new();
    for calls in 1..=calls_max {
        done.extend(backend.wait_and_reap(Duration::from_secs(10)));
        if ids.iter().all(|id| done.iter().any(|(b, _)| b == id)) {
            let ordered = ids
                .iter()
                .map(|id| {
                    let at = done.iter().position(|(b, _)| b == id).unwrap();
                    done.swap_remove(at).1
                })
                .collect();
            return (ordered, calls);
        }
    }
    panic!("batches not back after {calls_max} waits");
}

#[test]
fn one_wait_completes_a_linked_write_and_fdatasync() {
    let dir = tempfile::tempdir().unwrap();
    let mut backend = UringBackend::with_default_entries().unwrap();
    let file = backend
        .open_file(&dir.path().join("f"), OpenMode::Create)
        .unwrap();
    for round in 0..4 {
        let waits = backend.kernel_waits();
        let id = backend.submit_nowait(vec![
            Sqe::linked(write(file, 1 << 20, round)),
            Sqe::new(Op::Fdatasync { file }),
        ]);
        let (mut done, calls) = wait_for(&mut backend, &[id], 4);
        let completions = done.pop().unwrap();
        assert_eq!(completions[0].result.as_ref().unwrap(), &(1 << 20));
        assert_eq!(completions[1].result.as_ref().unwrap(), &0);
        // The kernel submitted the fdatasync behind the write inside the
        // wait: one return to user space for the whole flush.
        assert_eq!(calls, 1, "round {round}");
        assert_eq!(backend.kernel_waits(), waits + 1);
        assert_eq!(backend.batches_running(), 0);
    }
}

#[test]
fn a_failed_write_cancels_its_fdatasync_and_both_come_back() {
    let dir = tempfile::tempdir().unwrap();
    let mut backend = UringBackend::with_default_entries().unwrap();
    let file = backend
        .open_file(&dir.path().join("f"), OpenMode::Create)
        .unwrap();
    let bad = backend.submit_nowait(vec![
        Sqe::linked(write(FileId(9999), 4096, 1)),
        Sqe::new(Op::Fdatasync { file }),
    ]);
    let good = backend.submit_nowait(vec![
        Sqe::linked(write(file, 4096, 2)),
        Sqe::new(Op::Fdatasync { file: FileId(9999) }),
    ]);
    let (done, _) = wait_for(&mut backend, &[bad, good], 4);
    let (bad, good) = (&done[0], &done[1]);
    assert_eq!(errno(&bad[0]), Some(libc::EBADF));
    assert_eq!(errno(&bad[1]), Some(libc::ECANCELED));
    assert_eq!(good[0].result.as_ref().unwrap(), &4096);
    // A failed fdatasync does not cancel anything: it is reported as is.
    assert_eq!(errno(&good[1]), Some(libc::EBADF));
}

#[test]
fn with_nothing_in_flight_it_returns_at_once() {
    let mut backend = UringBackend::with_default_entries().unwrap();
    let start = Instant::now();
    assert!(backend.wait_and_reap(Duration::from_secs(5)).is_empty());
    assert!(start.elapsed() < Duration::from_secs(1));
    assert_eq!(backend.kernel_waits(), 0);
    // An empty batch finishes without the kernel: no wait either.
    let id = backend.submit_nowait(Vec::new());
    let done = backend.wait_and_reap(Duration::from_secs(5));
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].0, id);
    assert!(start.elapsed() < Duration::from_secs(1));
}
