//! The io_uring backend against a real file system (O_DIRECT on the temp dir).

use std::io;
use std::path::Path;

use ringlog_storage::io::uring::UringBackend;
use ringlog_storage::io::{AlignedBuf, Completion, FileId, IoBackend, Op, OpenMode, Sqe};

fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("uring-backend-")
        .tempdir_in(std::env::temp_dir())
        .expect("tempdir")
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[1] ^ seed)
        .collect()
}

fn buf_with(bytes: &[u8]) -> AlignedBuf {
    let mut buf = AlignedBuf::new(bytes.len());
    buf.extend_from_slice(bytes);
    buf
}

fn write(file: FileId, offset: u64, bytes: &[u8]) -> Op {
    Op::Write {
        file,
        offset,
        buf: buf_with(bytes),
    }
}

fn read(file: FileId, offset: u64, len: usize) -> Op {
    Op::Read {
        file,
        offset,
        len,
        buf: AlignedBuf::new(len),
    }
}

fn ok(c: &Completion) -> usize {
    match &c.result {
        Ok(n) => *n,
        Err(e) => panic!("{} failed: {e}", c.op.kind()),
    }
}

fn err(c: &Completion) -> &io::Error {
    match &c.result {
        Ok(n) => panic!("{} succeeded with {n}, expected an error", c.op.kind()),
        Err(e) => e,
    }
}

fn read_back(backend: &mut UringBackend, file: FileId, offset: u64, len: usize) -> Vec<u8> {
    let mut done = backend.submit(vec![Sqe::new(read(file, offset, len))]);
    let c = done.pop().unwrap();
    assert_eq!(ok(&c), len);
    c.op.into_buf().unwrap().to_vec()
}

#[test]
fn write_sync_read_round_trip_at_several_sizes() {
    let dir = tempdir();
    let mut backend = UringBackend::with_default_entries().unwrap();
    let sizes = [4096usize, 1 << 20, 8 << 20];
    let files: Vec<FileId> = (0..sizes.len())
        .map(|i| {
            backend
                .open_file(&dir.path().join(format!("f{i}")), OpenMode::Create)
                .unwrap()
        })
        .collect();
    let datas: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| pattern(n, i as u8))
        .collect();

    // All writes in one batch (unlinked, so concurrent), each followed by a
    // linked fdatasync of its file.
    let mut batch = Vec::new();
    for (file, data) in files.iter().zip(&datas) {
        batch.push(Sqe::linked(write(*file, 0, data)));
        batch.push(Sqe::new(Op::Fdatasync { file: *file }));
    }
    let done = backend.submit(batch);
    assert_eq!(done.len(), 6);
    for (i, &n) in sizes.iter().enumerate() {
        assert_eq!(ok(&done[2 * i]), n);
        assert_eq!(ok(&done[2 * i + 1]), 0);
        assert!(matches!(done[2 * i].op, Op::Write { .. }));
        assert!(matches!(done[2 * i + 1].op, Op::Fdatasync { .. }));
        // The buffer comes back intact.
        assert_eq!(&done[2 * i].op_buf()[..], &datas[i][..]);
    }

    // Read everything back in one batch, plus a second block-aligned slice.
    let mut batch: Vec<Sqe> = files
        .iter()
        .zip(&sizes)
        .map(|(f, &n)| Sqe::new(read(*f, 0, n)))
        .collect();
    batch.push(Sqe::new(read(files[2], 4 << 20, 8192)));
    let done = backend.submit(batch);
    for (i, &n) in sizes.iter().enumerate() {
        assert_eq!(ok(&done[i]), n);
        assert_eq!(&done[i].op_buf()[..], &datas[i][..], "file {i}");
    }
    assert_eq!(ok(&done[3]), 8192);
    assert_eq!(&done[3].op_buf()[..], &datas[2][4 << 20..(4 << 20) + 8192]);

    for (file, &n) in files.iter().zip(&sizes) {
        assert_eq!(backend.file_size(*file).unwrap(), n as u64);
        backend.close(*file);
    }
}

trait OpBuf {
    fn op_buf(&self) -> &AlignedBuf;
}

impl OpBuf for Completion {
    fn op_buf(&self) -> &AlignedBuf {
        match &self.op {
            Op::Write { buf, .. } | Op::Read { buf, .. } => buf,
            other => panic!("{} has no buffer", other.kind()),
        }
    }
}

#[test]
fn linked_write_sync_rename_dirsync_chain() {
    let dir = tempdir();
    let mut backend = UringBackend::with_default_entries().unwrap();
    let tmp = dir.path().join("seg.tmp");
    let fin = dir.path().join("seg");
    let file = backend.open_file(&tmp, OpenMode::Create).unwrap();
    let dir_fd = backend.open_dir(dir.path()).unwrap();
    let data = pattern(64 << 10, 7);

    let done = backend.submit(vec![
        Sqe::linked(write(file, 0, &data)),
        Sqe::linked(Op::Fdatasync { file }),
        Sqe::linked(Op::Rename {
            from: tmp.clone(),
            to: fin.clone(),
        }),
        Sqe::new(Op::Fsync { file: dir_fd }),
    ]);
    assert_eq!(ok(&done[0]), data.len());
    for c in &done[1..] {
        assert_eq!(ok(c), 0);
    }
    assert!(!backend.exists(&tmp).unwrap());
    assert!(backend.exists(&fin).unwrap());
    assert_eq!(std::fs::read(&fin).unwrap(), data);
    // The open fd follows the file across the rename.
    assert_eq!(read_back(&mut backend, file, 0, data.len()), data);
    let mut names = backend.list_dir(dir.path()).unwrap();
    names.sort();
    assert_eq!(names, ["seg"]);
}

#[test]
fn failures_are_reported_per_op() {
    let dir = tempdir();
    let mut backend = UringBackend::with_default_entries().unwrap();
    let file = backend
        .open_file(&dir.path().join("f"), OpenMode::Create)
        .unwrap();
    let dir_fd = backend.open_dir(dir.path()).unwrap();
    let data = pattern(4096, 1);

    let done = backend.submit(vec![
        Sqe::new(read(dir_fd, 0, 4096)),
        Sqe::new(Op::Rename {
            from: dir.path().join("missing"),
            to: dir.path().join("other"),
        }),
        Sqe::new(write(file, 0, &data)),
        Sqe::new(read(FileId(9999), 0, 4096)),
        Sqe::new(Op::Fdatasync { file: FileId(9999) }),
    ]);
    assert_eq!(err(&done[0]).raw_os_error(), Some(libc::EISDIR));
    assert_eq!(err(&done[1]).kind(), io::ErrorKind::NotFound);
    assert_eq!(ok(&done[2]), 4096);
    assert_eq!(err(&done[3]).raw_os_error(), Some(libc::EBADF));
    assert_eq!(err(&done[4]).raw_os_error(), Some(libc::EBADF));

    // A failed rename does not stop its chain.
    let data2 = pattern(4096, 2);
    let done = backend.submit(vec![
        Sqe::linked(Op::Rename {
            from: dir.path().join("missing"),
            to: dir.path().join("other"),
        }),
        Sqe::linked(write(file, 4096, &data2)),
        Sqe::new(Op::Fdatasync { file }),
    ]);
    assert_eq!(err(&done[0]).kind(), io::ErrorKind::NotFound);
    assert_eq!(ok(&done[1]), 4096);
    assert_eq!(ok(&done[2]), 0);
    assert_eq!(read_back(&mut backend, file, 4096, 4096), data2);

    // A failed write does: the rest of the chain is cancelled, and ops outside
    // the chain are unaffected.
    let done = backend.submit(vec![
        Sqe::linked(write(FileId(9999), 0, &data)),
        Sqe::linked(Op::Fdatasync { file }),
        Sqe::new(Op::Fsync { file: dir_fd }),
        Sqe::new(Op::Fsync { file: dir_fd }),
    ]);
    assert_eq!(err(&done[0]).raw_os_error(), Some(libc::EBADF));
    assert_eq!(err(&done[1]).raw_os_error(), Some(libc::ECANCELED));
    assert_eq!(err(&done[2]).raw_os_error(), Some(libc::ECANCELED));
    assert_eq!(ok(&done[3]), 0);

    // A read longer than its buffer is refused before submission.
    let done = backend.submit(vec![Sqe::new(Op::Read {
        file,
        offset: 0,
        len: 8192,
        buf: AlignedBuf::new(4096),
    })]);
    assert_eq!(err(&done[0]).kind(), io::ErrorKind::InvalidInput);
}

#[test]
fn unaligned_direct_io_fails_with_einval() {
    let dir = tempdir();
    let mut backend = UringBackend::with_default_entries().unwrap();
    let file = backend
        .open_file(&dir.path().join("f"), OpenMode::Create)
        .unwrap();
    let data = pattern(4096, 3);
    let done = backend.submit(vec![
        Sqe::new(write(file, 1, &data)),
        Sqe::new(write(file, 0, &data[..100])),
        Sqe::new(write(file, 8192, &data)),
    ]);
    assert_eq!(err(&done[0]).raw_os_error(), Some(libc::EINVAL));
    assert_eq!(err(&done[1]).raw_os_error(), Some(libc::EINVAL));
    assert_eq!(ok(&done[2]), 4096);
}

#[test]
fn batch_larger_than_the_ring_completes() {
    let dir = tempdir();
    let mut backend = UringBackend::new(8).unwrap();
    assert_eq!(backend.capacity(), 8);
    let file = backend
        .open_file(&dir.path().join("f"), OpenMode::Create)
        .unwrap();
    backend.allocate(file, 50 * 4096).unwrap();
    assert_eq!(backend.file_size(file).unwrap(), 50 * 4096);

    let datas: Vec<Vec<u8>> = (0..50).map(|i| pattern(4096, i as u8)).collect();
    let mut batch: Vec<Sqe> = datas
        .iter()
        .enumerate()
        .map(|(i, d)| Sqe::new(write(file, i as u64 * 4096, d)))
        .collect();
    // Chains of up to the ring size go through whole, in between.
    for i in 0..8u64 {
        let last = i == 7;
        let op = write(file, (50 + i) * 4096, &datas[i as usize]);
        batch.push(if last { Sqe::new(op) } else { Sqe::linked(op) });
    }
    let done = backend.submit(batch);
    assert_eq!(done.len(), 58);
    for c in &done {
        assert_eq!(ok(c), 4096);
    }
    let all = read_back(&mut backend, file, 0, 58 * 4096);
    for (i, chunk) in all.chunks(4096).enumerate() {
        assert_eq!(chunk, &datas[i % 50][..], "block {i}");
    }

    // A chain longer than the ring is refused whole; the rest still runs.
    let mut batch: Vec<Sqe> = (0..9)
        .map(|i| Sqe::linked(write(file, i * 4096, &datas[0])))
        .collect();
    batch.push(Sqe::new(Op::Fdatasync { file }));
    batch.push(Sqe::new(Op::Fdatasync { file }));
    let done = backend.submit(batch);
    for c in &done[..10] {
        assert_eq!(err(c).kind(), io::ErrorKind::InvalidInput);
    }
    assert_eq!(ok(&done[10]), 0);
}

#[test]
fn short_reads_at_end_of_file_and_in_chains() {
    let dir = tempdir();
    let mut backend = UringBackend::new(8).unwrap();
    let file = backend
        .open_file(&dir.path().join("f"), OpenMode::Create)
        .unwrap();
    let data = pattern(8192, 4);
    let done = backend.submit(vec![Sqe::new(write(file, 0, &data))]);
    assert_eq!(ok(&done[0]), 8192);

    // Reading past the end returns what is there, and the links the kernel
    // cancelled because of the short read still run.
    let data2 = pattern(4096, 5);
    let done = backend.submit(vec![
        Sqe::linked(read(file, 0, 16384)),
        Sqe::linked(write(file, 8192, &data2)),
        Sqe::new(Op::Fdatasync { file }),
    ]);
    assert_eq!(ok(&done[0]), 8192);
    assert_eq!(&done[0].op_buf()[..], &data[..]);
    assert_eq!(ok(&done[1]), 4096);
    assert_eq!(ok(&done[2]), 0);
    assert_eq!(backend.file_size(file).unwrap(), 12288);

    // Entirely past the end: zero bytes.
    let done = backend.submit(vec![Sqe::new(read(file, 1 << 20, 4096))]);
    assert_eq!(ok(&done[0]), 0);
    assert!(done[0].op_buf().is_empty());
}

#[test]
fn unlink_and_remove_dir() {
    let dir = tempdir();
    let mut backend = UringBackend::with_default_entries().unwrap();
    let sub = dir.path().join("sub");
    backend.create_dir(&sub).unwrap();
    assert_eq!(
        backend.create_dir(&sub).unwrap_err().kind(),
        io::ErrorKind::AlreadyExists
    );
    let path = sub.join("f");
    let file = backend.open_file(&path, OpenMode::Create).unwrap();
    backend.close(file);
    assert!(backend.exists(&path).unwrap());
    assert_eq!(backend.list_dir(&sub).unwrap(), ["f"]);

    let parent = backend.open_dir(dir.path()).unwrap();
    let done = backend.submit(vec![
        Sqe::linked(Op::Unlink { path: path.clone() }),
        Sqe::linked(Op::RemoveDir { path: sub.clone() }),
        Sqe::linked(Op::Fsync { file: parent }),
        Sqe::new(Op::Unlink { path: path.clone() }),
    ]);
    assert_eq!(ok(&done[0]), 0);
    assert_eq!(ok(&done[1]), 0);
    assert_eq!(ok(&done[2]), 0);
    assert_eq!(err(&done[3]).kind(), io::ErrorKind::NotFound);
    assert!(!backend.exists(&path).unwrap());
    assert!(!backend.exists(&sub).unwrap());

    // rmdir of a file and of a non-empty dir fail.
    let sub2 = dir.path().join("sub2");
    backend.create_dir(&sub2).unwrap();
    let f2 = backend
        .open_file(&sub2.join("g"), OpenMode::Create)
        .unwrap();
    backend.close(f2);
    let done = backend.submit(vec![
        Sqe::new(Op::RemoveDir { path: sub2.clone() }),
        Sqe::new(Op::RemoveDir {
            path: sub2.join("g"),
        }),
    ]);
    assert_eq!(err(&done[0]).raw_os_error(), Some(libc::ENOTEMPTY));
    assert_eq!(err(&done[1]).raw_os_error(), Some(libc::ENOTDIR));
}

#[test]
fn metadata_calls() {
    // Built on one thread, moved into its shard thread.
    fn assert_send<T: Send>() {}
    assert_send::<UringBackend>();

    let dir = tempdir();
    let mut backend = UringBackend::with_default_entries().unwrap();
    let path = dir.path().join("f");
    assert_eq!(
        backend
            .open_file(&path, OpenMode::Existing)
            .unwrap_err()
            .kind(),
        io::ErrorKind::NotFound
    );
    assert!(!backend.exists(&path).unwrap());
    let a = backend.open_file(&path, OpenMode::Create).unwrap();
    let b = backend.open_file(&path, OpenMode::Existing).unwrap();
    assert_ne!(a, b);
    assert_eq!(backend.file_size(a).unwrap(), 0);
    backend.allocate(a, 1 << 20).unwrap();
    assert_eq!(backend.file_size(b).unwrap(), 1 << 20);
    backend.close(a);
    assert_eq!(
        backend.file_size(a).unwrap_err().raw_os_error(),
        Some(libc::EBADF)
    );
    assert_eq!(backend.file_size(b).unwrap(), 1 << 20);
    assert!(backend.open_dir(&path).is_err());
    assert!(backend.open_dir(Path::new("/nonexistent-ringlog")).is_err());
    assert!(backend.submit(Vec::new()).is_empty());
}

// ---------------------------------------------------------------------------
// Asynchronous batches: submit_nowait, reap and the registered eventfd.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use ringlog_storage::io::BatchId;

fn eventfd() -> OwnedFd {
    // SAFETY: plain syscall; the result is checked.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    assert!(fd >= 0, "eventfd: {}", io::Error::last_os_error());
    // SAFETY: a fresh descriptor nothing else owns.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// Sleeps in poll(2) (not in io_uring_enter on the backend's ring) until the
/// eventfd is signalled, then clears it. False on timeout.
fn wait_signal(fd: &OwnedFd, timeout: Duration) -> bool {
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let n = unsafe { libc::poll(&mut pfd, 1, timeout.as_millis() as libc::c_int) };
    if n <= 0 {
        return false;
    }
    let mut count = [0u8; 8];
    // SAFETY: reads 8 bytes into a valid buffer.
    let r = unsafe { libc::read(fd.as_raw_fd(), count.as_mut_ptr().cast(), 8) };
    assert_eq!(r, 8);
    true
}

/// Waits on the eventfd and reaps until every batch in `ids` was handed back.
fn reap_all(
    backend: &mut UringBackend,
    fd: &OwnedFd,
    ids: &[BatchId],
) -> Vec<(BatchId, Vec<Completion>)> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut out = Vec::new();
    while out.len() < ids.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            wait_signal(fd, left),
            "eventfd not signalled; {} of {} batches reaped",
            out.len(),
            ids.len()
        );
        out.extend(backend.reap());
    }
    // Batches finish in any order; each comes back exactly once.
    out.sort_by_key(|(id, _)| *id);
    let got: Vec<BatchId> = out.iter().map(|(id, _)| *id).collect();
    assert_eq!(got, ids, "batches come back once each");
    assert_eq!(backend.batches_running(), 0);
    out
}

#[test]
fn nowait_write_and_fdatasync_complete_through_the_eventfd() {
    let dir = tempdir();
    let mut backend = UringBackend::with_default_entries().unwrap();
    let efd = eventfd();
    backend.register_eventfd(efd.as_raw_fd()).unwrap();
    let file = backend
        .open_file(&dir.path().join("f"), OpenMode::Create)
        .unwrap();
    let data = pattern(256 << 10, 5);
    let id = backend.submit_nowait(vec![
        Sqe::linked(write(file, 0, &data)),
        Sqe::new(Op::Fdatasync { file }),
    ]);
    assert_eq!(backend.batches_running(), 1);
    // The thread sleeps in poll(2), never entering the backend's ring: the
    // kernel must still post the completions and signal the eventfd.
    let mut done = reap_all(&mut backend, &efd, &[id]);
    let (_, completions) = done.pop().unwrap();
    assert_eq!(completions.len(), 2);
    assert_eq!(ok(&completions[0]), data.len());
    assert_eq!(ok(&completions[1]), 0);
    assert!(backend.reap().is_empty());
    assert_eq!(read_back(&mut backend, file, 0, data.len()), data);
}

#[test]
fn nowait_batches_report_failures_per_op() {
    let dir = tempdir();
    let mut backend = UringBackend::with_default_entries().unwrap();
    let efd = eventfd();
    backend.register_eventfd(efd.as_raw_fd()).unwrap();
    let file = backend
        .open_file(&dir.path().join("f"), OpenMode::Create)
        .unwrap();
    let data = pattern(4096, 9);
    let a = backend.submit_nowait(vec![
        Sqe::linked(write(FileId(9999), 0, &data)),
        Sqe::new(Op::Fdatasync { file }),
    ]);
    let b = backend.submit_nowait(vec![
        Sqe::linked(write(file, 0, &data)),
        Sqe::new(Op::Fdatasync { file: FileId(9999) }),
    ]);
    let done = reap_all(&mut backend, &efd, &[a, b]);
    assert_eq!(err(&done[0].1[0]).raw_os_error(), Some(libc::EBADF));
    assert_eq!(err(&done[0].1[1]).raw_os_error(), Some(libc::ECANCELED));
    assert_eq!(ok(&done[1].1[0]), 4096);
    assert_eq!(err(&done[1].1[1]).raw_os_error(), Some(libc::EBADF));
}

#[test]
fn nowait_batches_without_kernel_work_still_signal() {
    let dir = tempdir();
    let mut backend = UringBackend::with_default_entries().unwrap();
    let efd = eventfd();
    backend.register_eventfd(efd.as_raw_fd()).unwrap();
    let file = backend
        .open_file(&dir.path().join("f"), OpenMode::Create)
        .unwrap();
    let empty = backend.submit_nowait(Vec::new());
    let done = reap_all(&mut backend, &efd, &[empty]);
    assert!(done[0].1.is_empty());
    // Refused before submission: no CQE will ever come for it.
    let refused = backend.submit_nowait(vec![Sqe::new(Op::Read {
        file,
        offset: 0,
        len: 8192,
        buf: AlignedBuf::new(4096),
    })]);
    let done = reap_all(&mut backend, &efd, &[refused]);
    assert_eq!(err(&done[0].1[0]).kind(), io::ErrorKind::InvalidInput);
}

#[test]
fn nowait_batches_larger_than_the_ring_complete() {
    let dir = tempdir();
    let mut backend = UringBackend::new(8).unwrap();
    let efd = eventfd();
    backend.register_eventfd(efd.as_raw_fd()).unwrap();
    let file = backend
        .open_file(&dir.path().join("f"), OpenMode::Create)
        .unwrap();
    backend.allocate(file, 64 * 4096).unwrap();
    let datas: Vec<Vec<u8>> = (0..64).map(|i| pattern(4096, i as u8)).collect();
    // Four batches of 16 ops (two full-ring chains of 8 each): most of them
    // wait in the backend until earlier ops complete and `reap` pushes them.
    let mut ids = Vec::new();
    for b in 0..4 {
        let batch: Vec<Sqe> = (0..16)
            .map(|k| {
                let i = b * 16 + k;
                let op = write(file, i as u64 * 4096, &datas[i]);
                if k % 8 == 7 {
                    Sqe::new(op)
                } else {
                    Sqe::linked(op)
                }
            })
            .collect();
        ids.push(backend.submit_nowait(batch));
    }
    assert_eq!(backend.batches_running(), 4);
    for (_, completions) in reap_all(&mut backend, &efd, &ids) {
        assert_eq!(completions.len(), 16);
        for c in &completions {
            assert_eq!(ok(c), 4096);
        }
    }
    let all = read_back(&mut backend, file, 0, 64 * 4096);
    for (i, chunk) in all.chunks(4096).enumerate() {
        assert_eq!(chunk, &datas[i][..], "block {i}");
    }
}

#[test]
fn sync_submit_runs_while_nowait_batches_are_in_flight() {
    let dir = tempdir();
    let mut backend = UringBackend::new(8).unwrap();
    let efd = eventfd();
    backend.register_eventfd(efd.as_raw_fd()).unwrap();
    let files: Vec<FileId> = (0..3)
        .map(|i| {
            backend
                .open_file(&dir.path().join(format!("f{i}")), OpenMode::Create)
                .unwrap()
        })
        .collect();
    let old = pattern(64 << 10, 1);
    let done = backend.submit(vec![
        Sqe::linked(write(files[2], 0, &old)),
        Sqe::new(Op::Fdatasync { file: files[2] }),
    ]);
    assert_eq!(ok(&done[0]), old.len());

    // Two asynchronous flushes (write + fdatasync each), more than half the
    // ring, then synchronous work on another file.
    let datas: Vec<Vec<u8>> = (0..2).map(|i| pattern(1 << 20, 10 + i as u8)).collect();
    let ids: Vec<BatchId> = (0..2)
        .map(|i| {
            backend.submit_nowait(vec![
                Sqe::linked(write(files[i], 0, &datas[i])),
                Sqe::new(Op::Fdatasync { file: files[i] }),
            ])
        })
        .collect();
    // Reads and writes of the synchronous batch: more ops than the ring has
    // room for beside the asynchronous ones.
    let mut batch: Vec<Sqe> = (0..6)
        .map(|i| Sqe::new(read(files[2], i * 4096, 4096)))
        .collect();
    batch.push(Sqe::linked(write(files[2], 64 << 10, &old[..4096])));
    batch.push(Sqe::new(Op::Fdatasync { file: files[2] }));
    let done = backend.submit(batch);
    for (i, c) in done[..6].iter().enumerate() {
        assert_eq!(ok(c), 4096);
        let buf = match &c.op {
            Op::Read { buf, .. } => buf,
            _ => unreachable!(),
        };
        assert_eq!(&buf[..], &old[i * 4096..(i + 1) * 4096]);
    }
    assert_eq!(ok(&done[6]), 4096);
    assert_eq!(ok(&done[7]), 0);

    // Whatever the synchronous call reaped of the asynchronous batches was
    // set aside for `reap` (the eventfd was signalled for it).
    for (_, completions) in reap_all(&mut backend, &efd, &ids) {
        assert_eq!(ok(&completions[0]), 1 << 20);
        assert_eq!(ok(&completions[1]), 0);
    }
    for i in 0..2 {
        assert_eq!(read_back(&mut backend, files[i], 0, 1 << 20), datas[i]);
    }
}

#[test]
fn register_eventfd_twice_fails() {
    let mut backend = UringBackend::with_default_entries().unwrap();
    let a = eventfd();
    let b = eventfd();
    backend.register_eventfd(a.as_raw_fd()).unwrap();
    assert!(backend.register_eventfd(b.as_raw_fd()).is_err());
}

/// A blocking submit whose batch fits the ring waits in the kernel once for
/// all of it: a flush (a write and its fdatasync, linked) wakes its thread
/// once, not once per op (each wakeup is a context switch and, on a busy
/// machine, a wait for a CPU on the ack path).
#[test]
fn a_linked_write_and_fdatasync_wait_in_the_kernel_once() {
    let dir = tempdir();
    let mut backend = UringBackend::with_default_entries().unwrap();
    let file = backend
        .open_file(&dir.path().join("seg"), OpenMode::Create)
        .unwrap();
    let data = pattern(64 << 10, 3);
    for round in 0..16u64 {
        let waits = backend.kernel_waits();
        let done = backend.submit(vec![
            Sqe::linked(write(file, round * data.len() as u64, &data)),
            Sqe::new(Op::Fdatasync { file }),
        ]);
        assert_eq!(ok(&done[0]), data.len());
        assert_eq!(ok(&done[1]), 0);
        assert_eq!(backend.kernel_waits() - waits, 1, "round {round}");
    }
}

/// Many flushes in flight at once, reaped only when the eventfd fires: every
/// one comes back, round after round, within a bound. A ring that defers
/// task work (DEFER_TASKRUN) posts completions only while its thread enters
/// it, runs a bounded number of them per enter, and signals the eventfd only
/// when its list of deferred work goes from empty to non-empty: a `reap`
/// that leaves work behind gets no further signal.
#[test]
fn many_nowait_flushes_all_come_back_through_the_eventfd() {
    const FILES: usize = 96;
    const ROUNDS: u64 = 8;
    let dir = tempdir();
    let mut backend = UringBackend::with_default_entries().unwrap();
    let efd = eventfd();
    backend.register_eventfd(efd.as_raw_fd()).unwrap();
    let files: Vec<FileId> = (0..FILES)
        .map(|i| {
            backend
                .open_file(&dir.path().join(format!("f{i}")), OpenMode::Create)
                .unwrap()
        })
        .collect();
    let data = pattern(4096, 7);
    for round in 0..ROUNDS {
        // One write + fdatasync per file (as a group commit queues them),
        // as separate batches, and one batch of many unlinked writes.
        let mut ids: Vec<BatchId> = files
            .iter()
            .map(|&file| {
                backend.submit_nowait(vec![
                    Sqe::linked(write(file, round * 4096, &data)),
                    Sqe::new(Op::Fdatasync { file }),
                ])
            })
            .collect();
        let many: Vec<Sqe> = files
            .iter()
            .take(48)
            .map(|&file| Sqe::new(write(file, (ROUNDS + round) * 4096, &data)))
            .collect();
        ids.push(backend.submit_nowait(many));
        let done = reap_all(&mut backend, &efd, &ids);
        for (_, completions) in &done {
            for c in completions {
                assert!(c.result.is_ok(), "round {round}: {} failed", c.op.kind());
            }
        }
    }
}

/// The kernel's release as (major, minor), e.g. (6, 18).
fn kernel_release() -> (u32, u32) {
    // SAFETY: an all-zero utsname is valid; uname only writes into it.
    let mut uts: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to a utsname.
    assert_eq!(unsafe { libc::uname(&mut uts) }, 0);
    let release: String = uts
        .release
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8 as char)
        .collect();
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

/// Kernels from 6.1 on get a ring that defers completions (the tests above
/// then exercise that mode); older ones fall back to a plain ring.
#[test]
fn completions_are_deferred_where_the_kernel_allows_it() {
    let backend = UringBackend::with_default_entries().unwrap();
    let release = kernel_release();
    eprintln!(
        "kernel {release:?}: defers completions: {}",
        backend.defers_completions()
    );
    assert_eq!(backend.defers_completions(), release >= (6, 1));
}

/// A single-issuer ring is bound to the thread that first uses it, not to
/// the one that built it: built here, it runs blocking and asynchronous
/// batches on another thread.
#[test]
fn a_ring_built_on_one_thread_runs_on_another() {
    let dir = tempdir();
    let mut backend = UringBackend::with_default_entries().unwrap();
    let path = dir.path().join("f");
    let worker = std::thread::spawn(move || {
        let efd = eventfd();
        backend.register_eventfd(efd.as_raw_fd()).unwrap();
        let file = backend.open_file(&path, OpenMode::Create).unwrap();
        let data = pattern(64 << 10, 4);
        let done = backend.submit(vec![
            Sqe::linked(write(file, 0, &data)),
            Sqe::new(Op::Fdatasync { file }),
        ]);
        assert_eq!(ok(&done[0]), data.len());
        assert_eq!(ok(&done[1]), 0);
        let id = backend.submit_nowait(vec![
            Sqe::linked(write(file, data.len() as u64, &data)),
            Sqe::new(Op::Fdatasync { file }),
        ]);
        let done = reap_all(&mut backend, &efd, &[id]);
        assert_eq!(ok(&done[0].1[0]), data.len());
        assert_eq!(read_back(&mut backend, file, 0, data.len()), data);
    });
    worker.join().unwrap();
}

/// The metadata ops go through the ring like data ops, asynchronously:
/// mkdir, then create a file in it, stat it, reserve and measure it, in
/// linked batches reaped through the eventfd; each failure comes back on
/// its own op with the kernel's errno.
#[test]
fn metadata_ops_run_asynchronously_through_the_ring() {
    let dir = tempdir();
    let mut backend = UringBackend::with_default_entries().unwrap();
    let efd = eventfd();
    backend.register_eventfd(efd.as_raw_fd()).unwrap();
    let sub = dir.path().join("sub");
    let path = sub.join("seg");
    let id = backend.submit_nowait(vec![
        Sqe::linked(Op::MakeDir { path: sub.clone() }),
        Sqe::linked(Op::Open {
            path: path.clone(),
            mode: OpenMode::Create,
            dir: false,
        }),
        Sqe::linked(Op::Exists { path: path.clone() }),
        Sqe::new(Op::Open {
            path: sub.clone(),
            mode: OpenMode::Existing,
            dir: true,
        }),
    ]);
    let mut done = reap_all(&mut backend, &efd, &[id]).pop().unwrap().1;
    assert_eq!(done.len(), 4);
    assert_eq!(ok(&done[0]), 0);
    assert_eq!(ok(&done[2]), 1, "the created file exists");
    let dir_file = done.pop().unwrap().opened().unwrap();
    done.pop();
    let file = done.pop().unwrap().opened().unwrap();
    assert!(std::fs::metadata(&path).unwrap().is_file());

    let id = backend.submit_nowait(vec![
        Sqe::linked(Op::Allocate {
            file,
            offset: 4096,
            len_bytes: 1 << 20,
        }),
        Sqe::linked(Op::FileSize { file }),
        Sqe::new(Op::Fsync { file: dir_file }),
    ]);
    let done = reap_all(&mut backend, &efd, &[id]).pop().unwrap().1;
    assert_eq!(ok(&done[0]), 0);
    assert_eq!(ok(&done[1]), 4096 + (1 << 20), "the size covers the range");
    assert_eq!(ok(&done[2]), 0);
    // The descriptor the ring opened is a working O_DIRECT one.
    let data = pattern(8192, 9);
    let wrote = backend.submit(vec![Sqe::new(write(file, 0, &data))]);
    assert_eq!(ok(&wrote[0]), data.len());
    assert_eq!(read_back(&mut backend, file, 0, data.len()), data);

    // Failures, one per op, none stopping the others.
    backend.close(dir_file);
    let missing = dir.path().join("missing");
    let done = backend.submit(vec![
        Sqe::new(Op::Open {
            path: missing.clone(),
            mode: OpenMode::Existing,
            dir: false,
        }),
        Sqe::new(Op::Exists {
            path: missing.clone(),
        }),
        Sqe::new(Op::MakeDir { path: sub.clone() }),
        Sqe::new(Op::Allocate {
            file: dir_file,
            offset: 0,
            len_bytes: 4096,
        }),
        Sqe::new(Op::FileSize { file: dir_file }),
        Sqe::new(Op::Open {
            path: path.clone(),
            mode: OpenMode::Existing,
            dir: true,
        }),
    ]);
    assert_eq!(err(&done[0]).kind(), io::ErrorKind::NotFound);
    assert_eq!(ok(&done[1]), 0, "a missing path is not an error");
    assert_eq!(err(&done[2]).kind(), io::ErrorKind::AlreadyExists);
    assert_eq!(err(&done[3]).raw_os_error(), Some(libc::EBADF));
    assert_eq!(err(&done[4]).raw_os_error(), Some(libc::EBADF));
    assert_eq!(err(&done[5]).raw_os_error(), Some(libc::ENOTDIR));
    // A non-open completion names no file.
    let mut done = done;
    assert_eq!(
        done.swap_remove(1).opened().unwrap_err().kind(),
        io::ErrorKind::InvalidInput
    );
    backend.close(file);
}
