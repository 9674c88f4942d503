use std::path::Path;

use ringlog_storage::io::sim::SimBackend;
use ringlog_storage::io::{IoBackend, OpenMode};

use super::*;

const DIR: &str = "/data/topics/t/0";
const FILE: &str = "/data/topics/t/0/00000000.seg";
const TRASHED_FILE: &str = "/data/trash/7/00000000.seg";

/// A sim disk with a partition directory holding one file and an empty
/// trash, all durable.
fn disk(seed: u64) -> SimBackend {
    let mut io = SimBackend::new(seed);
    for d in [
        "/data",
        "/data/topics",
        "/data/topics/t",
        DIR,
        "/data/trash",
    ] {
        io.create_dir(Path::new(d)).expect("mkdir");
    }
    let f = io
        .open_file(Path::new(FILE), OpenMode::Create)
        .expect("create");
    io.close(f);
    for d in ["/", "/data", "/data/topics", "/data/topics/t", DIR] {
        let file = io.open_dir(Path::new(d)).expect("open dir");
        let done = io.submit(vec![Sqe::new(Op::Fsync { file })]);
        assert!(done.iter().all(|c| c.result.is_ok()));
        io.close(file);
    }
    io
}

fn exists(io: &mut SimBackend, p: &str) -> bool {
    io.exists(Path::new(p)).expect("stat")
}

/// After move_in returned, a power cut finds the directory (and what it
/// holds) in the trash, not back in place: both directories were fsynced.
#[test]
fn a_directory_moved_into_the_trash_stays_there_after_a_crash() {
    for seed in 1..=20 {
        let mut io = disk(seed);
        let to = entry_path(Path::new("/data"), 7);
        move_in(&mut io, Path::new(DIR), &to).expect("moved");
        let mut io = io.reboot();
        assert!(!exists(&mut io, DIR), "seed {seed}: back in place");
        assert!(
            exists(&mut io, TRASHED_FILE),
            "seed {seed}: not in the trash"
        );
    }
}

/// A crash at any I/O of the move leaves the directory whole in exactly
/// one place; an I/O error is returned, not swallowed.
#[test]
fn a_crash_or_eio_during_the_move_leaves_the_directory_in_one_place() {
    let to = entry_path(Path::new("/data"), 7);
    let start = disk(1).ops_count();
    let mut points = 0;
    for at in start..start + 3 {
        for eio in [false, true] {
            let mut io = disk(1);
            if eio {
                io.set_fail_at(at);
            } else {
                io.set_crash_at(at, true);
            }
            let moved = move_in(&mut io, Path::new(DIR), &to);
            if eio {
                assert!(moved.is_err(), "EIO at {at} not reported");
            }
            let mut io = io.reboot();
            let here = exists(&mut io, FILE);
            let there = exists(&mut io, TRASHED_FILE);
            assert!(
                here != there,
                "at {at} eio={eio}: in place {here}, in trash {there}"
            );
            points += 1;
        }
    }
    assert_eq!(points, 6);
}

/// More pokes than the queue holds: they coalesce into the pending one
/// (the queue never exceeds POKES_MAX), and the one sweep it triggers
/// removes every entry renamed in before it ran.
#[test]
fn pokes_beyond_the_bound_are_covered_by_the_pending_sweep() {
    let dir = tempfile::tempdir().expect("tempdir");
    let trash = dir.path().join(TRASH_DIR);
    std::fs::create_dir(&trash).expect("mkdir");
    let (poker, rx) = channel();
    for i in 0..10 {
        std::fs::create_dir_all(trash.join(i.to_string()).join("sub")).expect("mkdir");
        std::fs::write(trash.join(i.to_string()).join("sub/f"), b"x").expect("write");
        let expected = if i < POKES_MAX {
            Poked::Queued
        } else {
            Poked::Pending
        };
        assert_eq!(poker.poke(), expected, "poke {i}");
        assert!(rx.len() <= POKES_MAX);
    }
    assert_eq!(rx.len(), POKES_MAX);
    rx.recv().expect("a queued poke");
    assert_eq!(sweep(&trash), 10);
    assert_eq!(std::fs::read_dir(&trash).expect("list").count(), 0);
    assert!(rx.is_empty());
    drop(rx);
    assert_eq!(poker.poke(), Poked::Stopped);
}

/// A removal cut short (a crash while the sweeper was deep in a tree)
/// leaves a partial tree: the next start finishes it before any poke.
#[test]
fn a_sweep_cut_short_is_finished_at_the_next_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let trash = dir.path().join(TRASH_DIR);
    let entry = trash.join("9");
    for i in 0..4 {
        std::fs::create_dir_all(entry.join(format!("gen{i}"))).expect("mkdir");
        std::fs::write(entry.join(format!("gen{i}/seg")), vec![1u8; 4096]).expect("write");
    }
    // What remove_dir_all leaves when stopped midway.
    std::fs::remove_dir_all(entry.join("gen0")).expect("partial removal");
    std::fs::remove_file(entry.join("gen1/seg")).expect("partial removal");
    let sweeper = Sweeper::start(trash.clone()).expect("start");
    sweeper.stop();
    assert!(trash.is_dir(), "the trash itself stays");
    assert_eq!(std::fs::read_dir(&trash).expect("list").count(), 0);
}

/// Puts a tree into the trash the way a shard does: built elsewhere,
/// renamed in whole (a sweep running meanwhile never sees it half made).
fn rename_in(dir: &Path, trash: &Path, name: &str) {
    let staged = dir.join(format!("staged-{name}"));
    std::fs::create_dir_all(staged.join("x")).expect("mkdir");
    std::fs::write(staged.join("x/seg"), b"data").expect("write");
    std::fs::rename(&staged, trash.join(name)).expect("rename into the trash");
}

/// The thread sweeps on a poke while running, not only at start and stop.
#[test]
fn a_poke_empties_the_trash_while_the_sweeper_runs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let trash = dir.path().join(TRASH_DIR);
    let sweeper = Sweeper::start(trash.clone()).expect("start");
    // Long past the sweep at start (of an empty trash): only a poke can
    // remove what comes in now.
    std::thread::sleep(std::time::Duration::from_millis(100));
    rename_in(dir.path(), &trash, "3");
    let poker = sweeper.poker();
    assert_ne!(poker.poke(), Poked::Stopped);
    let mut waited_ms = 0;
    while trash.join("3").exists() {
        assert!(waited_ms < 10_000, "the poke was not served");
        std::thread::sleep(std::time::Duration::from_millis(5));
        waited_ms += 5;
    }
    // Stop sweeps a last time: an entry nobody poked for goes too, and a
    // poker kept past the stop (as a shard's is) holds nothing up.
    rename_in(dir.path(), &trash, "4");
    sweeper.stop();
    assert!(!trash.join("4").exists(), "the last sweep missed an entry");
    assert_eq!(poker.poke(), Poked::Stopped);
}
