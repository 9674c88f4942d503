//! The turn over the sim backend with time given as data: deadlines come
//! from the time the runtime loop passed in, and dropping a partition
//! renames its directory into the trash on the ring.

use std::path::Path;
use std::time::{Duration, Instant};

use ringlog_storage::io::sim::SimBackend;
use ringlog_storage::io::{IoBackend, Op as IoOp, Sqe};

use super::crash_sim::{batch, setup, FIRST_ID};
use super::*;

pub(super) fn queue(s: &Shard<SimBackend>, op: Op) -> crossbeam_channel::Receiver<Outcome> {
    let (tx, rx) = crossbeam_channel::bounded(1);
    s.queue.borrow_mut().push_back(Work {
        op,
        reply: Responder::Thread(tx),
    });
    rx
}

/// A long-poll fetch at the end of an empty partition waits exactly
/// `wait_ms` from the turn's time, on no clock of its own: a microsecond
/// before its deadline it still waits, at the deadline it is answered
/// empty.
#[test]
fn a_long_poll_fetch_expires_at_the_turn_time_plus_its_wait() {
    let s = setup(1);
    let t0 = Instant::now() + Duration::from_secs(3600);
    let rx = queue(
        &s,
        Op::Fetch {
            partition_id: FIRST_ID,
            offset: 0,
            max_bytes: 1 << 16,
            wait_ms: 100,
        },
    );
    assert_eq!(s.run_turn(t0), 1);
    assert!(
        rx.try_recv().is_err(),
        "answered before any data or deadline"
    );
    s.expire_waiters(t0 + Duration::from_millis(100) - Duration::from_micros(1));
    assert!(rx.try_recv().is_err(), "expired before its deadline");
    s.expire_waiters(t0 + Duration::from_millis(100));
    match rx.try_recv() {
        Ok(Ok(OpReply::Fetched(f))) => {
            assert!(f.batches.is_empty());
            assert_eq!(f.next_offset, 0);
        }
        other => panic!("expected an empty fetch at the deadline, got {other:?}"),
    }
}

/// Dropping a partition renames its directory into the trash (durably:
/// still there after a power cut), pokes the sweeper once, and the
/// partition is gone for later work; the turn removes nothing itself.
#[test]
fn dropping_a_partition_moves_it_into_the_trash_and_pokes_the_sweeper() {
    let s = setup(2);
    let dir = TopicTable::partition_dir(Path::new("/data"), "t", 0);
    let trashed = trash::entry_path(Path::new("/data"), FIRST_ID);
    let (poker, pokes) = trash::channel();
    {
        let io = &mut s.core.borrow_mut().io;
        io.create_dir(Path::new("/data/trash"))
            .expect("mkdir trash");
        let data = io.open_dir(Path::new("/data")).expect("open /data");
        let done = io.submit(vec![Sqe::new(IoOp::Fsync { file: data })]);
        assert!(done.iter().all(|c| c.result.is_ok()));
        io.close(data);
    }
    let s = Shard { trash: poker, ..s };
    let dropped = queue(
        &s,
        Op::DropPartition {
            partition_id: FIRST_ID,
        },
    );
    let produced = queue(
        &s,
        Op::Produce {
            partition_id: FIRST_ID,
            batch: batch(1, 1, 10).into(),
        },
    );
    while s.run_turn(Instant::now()) > 0 {}
    assert!(matches!(dropped.try_recv(), Ok(Ok(OpReply::Empty))));
    match produced.try_recv() {
        Ok(Err(e)) => assert_eq!(e.code, ErrorCode::UnknownPartition),
        other => panic!("produce to a dropped partition: {other:?}"),
    }
    assert_eq!(pokes.len(), 1, "the sweeper was poked once");
    let mut io = s.core.into_inner().io.reboot();
    assert!(
        !io.exists(&dir).expect("stat"),
        "back in place after a crash"
    );
    assert!(io.exists(&trashed).expect("stat"), "not in the trash");
}

/// Runs turns and storage completions until nothing is in flight.
fn settle(s: &Shard<SimBackend>) {
    for _ in 0..10_000 {
        while s.run_turn(Instant::now()) > 0 {}
        if !s.core.borrow().storage_busy() {
            return;
        }
        s.on_storage_completions(Instant::now());
    }
    panic!("storage never settles");
}

fn produced(rx: &crossbeam_channel::Receiver<Outcome>) {
    match rx.try_recv() {
        Ok(Ok(OpReply::Produced(_))) => {}
        other => panic!("produce: {other:?}"),
    }
}

fn spare_state(s: &Shard<SimBackend>) -> (bool, bool, usize) {
    let core = s.core.borrow();
    let store = core.partitions[&FIRST_ID].store().expect("open");
    (
        store.spare_ready(),
        store.spare_in_flight(),
        store.sealed_segments().count(),
    )
}

/// Once a partition's active segment is half full, the turn starts its
/// next segment (a spare) on the ring without waiting; the roll renames it
/// into place. Work that must not overtake the spare (a purge) parks behind
/// it and runs when it completed. One spare batch per partition at most.
#[test]
fn the_turn_prepares_the_next_segment_and_the_roll_takes_it() {
    let s = setup(3);
    let mut tag = 0;
    // 32 KiB segments, ~3 KiB batches: half full after six. The spare is
    // looked at right after the turn that started it (nothing reaped yet):
    // how the sim interleaves it with that turn's flush (its zeros ahead
    // included) decides whether it is still in flight once the flush is.
    let last = loop {
        tag += 1;
        let rx = queue(
            &s,
            Op::Produce {
                partition_id: FIRST_ID,
                batch: batch(tag, 2, 1400).into(),
            },
        );
        assert_eq!(s.run_turn(Instant::now()), 1);
        assert!(tag < 12, "no spare was started");
        if spare_state(&s).1 {
            break rx;
        }
        settle_flights_only(&s);
        produced(&rx);
    };
    {
        let core = s.core.borrow();
        let spares = core
            .spares
            .values()
            .filter(|(_, a)| *a == Ahead::Spare)
            .count();
        assert_eq!(spares, 1, "one spare batch for the partition");
    }
    // A purge queued now parks behind the spare in flight.
    let purge = queue(
        &s,
        Op::Purge {
            partition_id: FIRST_ID,
        },
    );
    assert_eq!(s.run_turn(Instant::now()), 1);
    assert!(purge.try_recv().is_err(), "the purge overtook the spare");
    settle(&s);
    produced(&last);
    assert!(matches!(purge.try_recv(), Ok(Ok(OpReply::Empty))));
    let (ready, in_flight, _) = spare_state(&s);
    assert!(!ready && !in_flight, "the purge released the spare");
    // Fill again: the spare gets ready, then the roll consumes it.
    let mut sealed_before = 0;
    while !spare_state(&s).0 {
        tag += 1;
        let rx = queue(
            &s,
            Op::Produce {
                partition_id: FIRST_ID,
                batch: batch(tag, 2, 1400).into(),
            },
        );
        settle(&s);
        produced(&rx);
        sealed_before = spare_state(&s).2;
        assert!(tag < 40, "the spare never got ready");
    }
    while spare_state(&s).2 == sealed_before {
        tag += 1;
        let rx = queue(
            &s,
            Op::Produce {
                partition_id: FIRST_ID,
                batch: batch(tag, 2, 1400).into(),
            },
        );
        settle(&s);
        produced(&rx);
        assert!(tag < 60, "never rolled");
    }
    let core = s.core.borrow();
    let store = core.partitions[&FIRST_ID].store().expect("open");
    let spare = store
        .dir()
        .join(format!("gen-{:020}", store.superblock().live_generation))
        .join(ringlog_storage::store::SPARE_FILE);
    assert!(!store.spare_ready(), "the roll took the spare");
    drop(core);
    let io = &mut s.core.borrow_mut().io;
    assert!(!io.exists(&spare).expect("stat"), "renamed into place");
}

/// Completes the group commits in flight, leaving spare batches alone
/// when they are not done yet.
fn settle_flights_only(s: &Shard<SimBackend>) {
    for _ in 0..10_000 {
        if s.core.borrow().flights.is_empty() {
            return;
        }
        s.on_storage_completions(Instant::now());
    }
    panic!("flushes never finish");
}
