use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use ringlog_storage::io::sim::{Fault, FaultOp, SimBackend};
use ringlog_storage::io::{IoBackend, Op, Sqe, BLOCK_SIZE};

use super::*;
use crate::catalog::{TopicMeta, TopicState};

const DATA: &str = "/data";
const FILE: &str = "/data/topics.json";

/// A table with `topics` topics (more topics: a longer file).
fn table(topics: u32, tag: &str) -> TopicTable {
    let mut t = TopicTable {
        format: TopicTable::FORMAT,
        next_partition_id: topics * 4,
        topics: BTreeMap::new(),
        meta_applied_op: 0,
    };
    for i in 0..topics {
        t.topics.insert(
            format!("{tag}-{i:04}"),
            TopicMeta {
                partitions: 4,
                first_partition_id: i * 4,
                state: TopicState::Ready,
                replication_factor: 1,
            },
        );
    }
    t
}

/// A sim disk with a durable /data holding `old` as topics.json.
fn disk(seed: u64, old: &TopicTable) -> SimBackend {
    let mut io = SimBackend::new(seed);
    io.create_dir(Path::new(DATA)).expect("mkdir");
    for d in ["/", DATA] {
        let file = io.open_dir(Path::new(d)).expect("open dir");
        let done = io.submit(vec![Sqe::new(Op::Fsync { file })]);
        assert!(done.iter().all(|c| c.result.is_ok()));
        io.close(file);
    }
    store_table(&mut io, Path::new(DATA), old).expect("first store");
    io
}

/// What topics.json holds on `io` (parsed as boot parses it).
fn on_disk(io: &SimBackend) -> Option<TopicTable> {
    let bytes = io.read_whole(Path::new(FILE))?;
    let text = std::str::from_utf8(bytes).expect("utf-8");
    Some(serde_json::from_str(text).expect("topics.json parses"))
}

fn failed_io(e: &CatalogError) -> (&'static str, &Path, Option<i32>) {
    match e {
        CatalogError::Io { what, path, source } => (what, path.as_path(), source.raw_os_error()),
        other => panic!("not an I/O error: {other}"),
    }
}

/// The padded file is whole blocks, and the real filesystem's loader reads
/// it back (through the io_uring backend, as the server runs it).
#[test]
fn a_stored_table_loads_back_from_whole_blocks() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut io = UringBackend::new(RING_ENTRIES).expect("ring");
    let t = table(50, "t");
    store_table(&mut io, dir.path(), &t).expect("store");
    let len = std::fs::metadata(dir.path().join(TOPICS_FILE))
        .expect("stat")
        .len();
    assert_eq!(len % BLOCK_SIZE as u64, 0, "{len} bytes");
    assert_eq!(TopicTable::load(dir.path()).expect("load"), t);
    // A shorter table over a longer one: no stale tail.
    let small = table(1, "s");
    store_table(&mut io, dir.path(), &small).expect("store again");
    assert_eq!(TopicTable::load(dir.path()).expect("load"), small);
}

/// A power cut at every I/O of the replace, torn or not, leaves the old
/// table or the new one (the new one whenever the store returned Ok), and
/// the next store works over whatever temp file the crash left.
#[test]
fn a_crash_at_any_step_leaves_the_old_or_the_new_table() {
    let (old, new, next) = (table(80, "old"), table(2, "new"), table(1, "next"));
    let steps = {
        let mut io = disk(1, &old);
        let before = io.ops_count();
        store_table(&mut io, Path::new(DATA), &new).expect("clean store");
        io.ops_count() - before
    };
    assert!(steps >= 4, "a store is {steps} ops");
    let mut outcomes = [0usize; 2];
    for seed in 1..=6 {
        for step in 0..=steps {
            for tear in [false, true] {
                let mut io = disk(seed, &old);
                io.set_crash_at(io.ops_count() + step, tear);
                let stored = store_table(&mut io, Path::new(DATA), &new);
                let mut io = io.reboot();
                let got = on_disk(&io).expect("topics.json exists after the crash");
                let ctx = format!("seed {seed} step {step} tear {tear}: {stored:?}");
                assert!(got == old || got == new, "{ctx}: a third table");
                if stored.is_ok() {
                    assert_eq!(got, new, "{ctx}: acknowledged, then lost");
                }
                outcomes[usize::from(got == new)] += 1;
                store_table(&mut io, Path::new(DATA), &next).expect("store after reboot");
                assert_eq!(on_disk(&io.reboot()), Some(next.clone()), "{ctx}");
            }
        }
    }
    assert!(
        outcomes[0] > 0 && outcomes[1] > 0,
        "crash points hit only one side: {outcomes:?}"
    );
}

/// EIO or ENOSPC on the temp file's write is a typed error naming the write
/// and the file; topics.json keeps the old table, also after a reboot.
#[test]
fn a_failed_write_is_an_error_and_keeps_the_old_table() {
    let (old, new) = (table(3, "old"), table(4, "new"));
    for errno in [libc::EIO, libc::ENOSPC] {
        let mut io = disk(7, &old);
        io.inject(
            FaultOp::Write,
            io.op_count(FaultOp::Write),
            Fault::Errno(errno),
        );
        let e = store_table(&mut io, Path::new(DATA), &new).expect_err("write fails");
        let (what, path, code) = failed_io(&e);
        assert_eq!((what, code), ("write", Some(errno)), "{e}");
        assert!(path.ends_with("topics.json.tmp"), "{e}");
        assert_eq!(on_disk(&io), Some(old.clone()));
        assert_eq!(on_disk(&io.reboot()), Some(old.clone()));
    }
}

/// A failed fdatasync of the temp file stops before the rename (old table
/// kept); a failed fsync of the directory after it is an error too, named
/// by the directory, never an acknowledgement.
#[test]
fn a_failed_sync_at_either_step_is_an_error() {
    let (old, new) = (table(3, "old"), table(4, "new"));
    let mut io = disk(3, &old);
    io.inject(
        FaultOp::Sync,
        io.op_count(FaultOp::Sync),
        Fault::Errno(libc::EIO),
    );
    let e = store_table(&mut io, Path::new(DATA), &new).expect_err("fdatasync fails");
    assert_eq!(failed_io(&e).0, "fdatasync", "{e}");
    assert_eq!(on_disk(&io.reboot()), Some(old.clone()));

    let mut io = disk(3, &old);
    io.inject(
        FaultOp::Sync,
        io.op_count(FaultOp::Sync) + 1,
        Fault::Errno(libc::EIO),
    );
    let e = store_table(&mut io, Path::new(DATA), &new).expect_err("directory fsync fails");
    let (what, path, code) = failed_io(&e);
    assert_eq!(
        (what, path, code),
        ("fsync", Path::new(DATA), Some(libc::EIO))
    );
}

fn runtime() -> monoio::Runtime<monoio::time::TimeDriver<monoio::IoUringDriver>> {
    monoio::RuntimeBuilder::<monoio::IoUringDriver>::new()
        .enable_timer()
        .build()
        .expect("monoio runtime")
}

fn remove(path: &str) -> Task {
    Task::RemoveDir { path: path.into() }
}

/// The queue holds JOBS_MAX jobs; the next is refused as Busy at once, and
/// jobs queued when the thread goes are answered Stopped, not left waiting.
#[test]
fn the_queue_is_bounded_and_a_stopped_thread_answers_every_waiter() {
    let (client, jobs) = channel();
    runtime().block_on(async move {
        let waiting: Vec<_> = (0..JOBS_MAX)
            .map(|_| {
                let c = client.clone();
                monoio::spawn(async move { c.run(remove("/nowhere")).await })
            })
            .collect();
        while jobs.len() < JOBS_MAX {
            monoio::time::sleep(Duration::from_millis(1)).await;
        }
        assert!(matches!(
            client.run(remove("/nowhere")).await,
            Err(MetaIoError::Busy)
        ));
        refuse_queued(&jobs);
        drop(jobs);
        for w in waiting {
            let answered = monoio::time::timeout(Duration::from_secs(5), w).await;
            assert!(matches!(answered, Ok(Err(MetaIoError::Stopped))));
        }
        assert!(matches!(
            client.run(remove("/nowhere")).await,
            Err(MetaIoError::Stopped)
        ));
    });
}

/// End to end on the real thread and ring: a store a monoio task awaits
/// lands on disk; a failed rmdir comes back with its errno; after stop the
/// client is told the thread stopped.
#[test]
fn the_thread_runs_tasks_for_an_awaiting_task() {
    let dir = tempfile::tempdir().expect("tempdir");
    let meta = MetaIo::start().expect("start");
    let client = meta.client();
    let t = table(5, "t");
    let data_dir = dir.path().to_path_buf();
    let missing = dir.path().join("missing");
    let stored = t.clone();
    let c = client.clone();
    runtime().block_on(async move {
        let task = Task::StoreTable {
            data_dir,
            table: stored,
        };
        c.run(task).await.expect("stored");
        let e = c
            .run(Task::RemoveDir { path: missing })
            .await
            .expect_err("no such directory");
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "{e}");
    });
    assert_eq!(TopicTable::load(dir.path()).expect("load"), t);
    meta.stop();
    runtime().block_on(async move {
        assert!(matches!(
            client.run(remove("/nowhere")).await,
            Err(MetaIoError::Stopped)
        ));
    });
}
