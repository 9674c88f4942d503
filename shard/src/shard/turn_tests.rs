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
