//! The shard hosting each partition's replica (a cluster of one) over the
//! sim backend: group commit through the replica, pending produces of a
//! dropped, fenced or full partition, and ticks only where needed.

use std::time::Instant;

use ringlog_storage::io::sim::{Fault, FaultOp, Faults, SimBackend};

use super::crash_sim::{batch, data_dir, shard_with, FIRST_ID};
use super::turn_tests::queue;
use super::*;
use crate::catalog::TopicState;
use crate::config::GroupCommit;

/// Bounds the drain loop: far more wake-ups than any test needs.
const DRAIN_ROUNDS_MAX: usize = 10_000;

/// Small segments and write buffers: a sim disk holds every byte in memory.
/// One fdatasync per partition (`group_commit = "partition"`), which most
/// tests here are about; `journaled` is the shard journal.
fn config() -> ServerConfig {
    ServerConfig {
        data_dir: "/data".into(),
        group_commit_appends_max: 256,
        segment_size_bytes: 256 * 1024,
        write_buffer_bytes: 64 * 1024,
        group_commit: GroupCommit::Partition,
        ..ServerConfig::default()
    }
}

fn journaled() -> ServerConfig {
    ServerConfig {
        group_commit: GroupCommit::Journal,
        journal_bytes: 1024 * 1024,
        ..config()
    }
}

fn open(partitions: u32, seed: u64) -> Shard<SimBackend> {
    open_with(partitions, seed, config())
}

fn open_with(partitions: u32, seed: u64, config: ServerConfig) -> Shard<SimBackend> {
    let s = shard_with(data_dir(seed), TopicState::Creating, partitions, config);
    assert_eq!(s.open_owned_partitions(), partitions as usize);
    s
}

/// 100 produces to eight partitions in one turn with the journal: ONE
/// fdatasync for all of them (the partitions' segment writes go behind
/// it), where `group_commit = "partition"` costs eight (checked too).
#[test]
fn the_appends_of_one_turn_across_partitions_share_one_journal_fdatasync() {
    for (config, want) in [(journaled(), 1), (config(), 8)] {
        let s = open_with(8, 1, config);
        let warm: Vec<_> = (0..8).map(|i| produce(&s, FIRST_ID + i, 0)).collect();
        settle_all(&s);
        for rx in &warm {
            produced(rx);
        }
        let before = syncs(&s);
        let rxs: Vec<_> = (0..100u32)
            .map(|i| produce(&s, FIRST_ID + i % 8, u64::from(i) + 1))
            .collect();
        assert_eq!(s.run_turn(Instant::now()), 100, "one turn takes them all");
        settle_all(&s);
        assert_eq!(
            syncs(&s) - before,
            want,
            "fdatasyncs for one turn of 8 partitions"
        );
        for rx in rxs {
            produced(&rx);
        }
    }
}

/// EIO on the journal's fdatasync: every produce it carried, on every
/// partition, is refused as fenced (fail-stop), naming the journal.
#[test]
fn a_failed_journal_fdatasync_fences_every_partition_it_carried() {
    let s = open_with(2, 3, journaled());
    let at = syncs(&s);
    s.core
        .borrow_mut()
        .io
        .inject(FaultOp::Sync, at, Fault::Errno(libc::EIO));
    let pids = [FIRST_ID, FIRST_ID + 1];
    let rxs: Vec<Vec<_>> = pids
        .iter()
        .map(|&pid| (0..3).map(|i| produce(&s, pid, i)).collect())
        .collect();
    settle_all(&s);
    for list in &rxs {
        for rx in list {
            let e = refused(rx);
            assert_eq!(e.code, ErrorCode::PartitionFenced, "{e}");
            assert!(e.message.contains("journal"), "{e}");
        }
    }
    let core = s.core.borrow();
    assert!(core.journal.as_ref().is_some_and(|j| j.fenced().is_some()));
}

/// Runs turns and storage completions until no flush is in flight.
fn settle_all(s: &Shard<SimBackend>) {
    for _ in 0..DRAIN_ROUNDS_MAX {
        while s.run_turn(Instant::now()) > 0 {}
        if !s.core.borrow().storage_busy() {
            return;
        }
        s.on_storage_completions(Instant::now());
    }
    panic!("flushes never finish");
}

fn produce(s: &Shard<SimBackend>, pid: u32, tag: u64) -> crossbeam_channel::Receiver<Outcome> {
    queue(
        s,
        Op::Produce {
            partition_id: pid,
            batch: batch(tag, 2, 100).into(),
        },
    )
}

fn produced(rx: &crossbeam_channel::Receiver<Outcome>) -> ProduceReply {
    match rx.try_recv() {
        Ok(Ok(OpReply::Produced(r))) => r,
        other => panic!("expected an acknowledgement, got {other:?}"),
    }
}

fn refused(rx: &crossbeam_channel::Receiver<Outcome>) -> OpError {
    match rx.try_recv() {
        Ok(Err(e)) => e,
        other => panic!("expected an error, got {other:?}"),
    }
}

fn syncs(s: &Shard<SimBackend>) -> u64 {
    s.core.borrow().io.op_count(FaultOp::Sync)
}

/// 100 produces to two partitions in one turn: one group commit, one
/// fdatasync per partition (not one per append, which the replica's one
/// Flush per append would be if each ran on its own), every produce
/// acknowledged at consecutive offsets.
#[test]
fn the_appends_of_one_turn_share_one_fdatasync_per_partition() {
    let s = open(2, 1);
    // The first flush of a fresh store also writes its first frontier
    // record: count from the second on.
    let warm = [produce(&s, FIRST_ID, 0), produce(&s, FIRST_ID + 1, 0)];
    settle_all(&s);
    let mut next = [
        produced(&warm[0]).next_offset,
        produced(&warm[1]).next_offset,
    ];
    let before = syncs(&s);
    let rxs: Vec<_> = (0..100u32)
        .map(|i| {
            (
                i as usize % 2,
                produce(&s, FIRST_ID + i % 2, u64::from(i) + 1),
            )
        })
        .collect();
    assert_eq!(s.run_turn(Instant::now()), 100, "one turn takes them all");
    assert_eq!(s.core.borrow().flights.len(), 1, "one group commit");
    settle_all(&s);
    assert_eq!(syncs(&s) - before, 2, "one fdatasync per partition");
    for (p, rx) in rxs {
        let r = produced(&rx);
        assert_eq!(r.base_offset, next[p]);
        assert_eq!(r.next_offset, next[p] + 2);
        next[p] = r.next_offset;
    }
}

/// A produce the replica holds when its partition is dropped gets
/// UnknownPartition: here one appended behind a flush in flight, with the
/// drop parked behind that flush. The one the flush covered is
/// acknowledged.
#[test]
fn a_produce_pending_when_its_partition_is_dropped_gets_unknown_partition() {
    let s = open(1, 2);
    let first = produce(&s, FIRST_ID, 1);
    assert_eq!(s.run_turn(Instant::now()), 1);
    assert!(s.core.borrow().partitions[&FIRST_ID].flush_in_flight());
    let behind = produce(&s, FIRST_ID, 2);
    let dropped = queue(
        &s,
        Op::DropPartition {
            partition_id: FIRST_ID,
        },
    );
    assert_eq!(s.run_turn(Instant::now()), 2);
    assert!(behind.try_recv().is_err(), "answered before durable");
    settle_all(&s);
    assert_eq!(produced(&first).base_offset, 0);
    assert_eq!(refused(&behind).code, ErrorCode::UnknownPartition);
    assert!(matches!(dropped.try_recv(), Ok(Ok(OpReply::Empty))));
    assert!(s.core.borrow().lanes.is_empty(), "nothing left pending");
}

/// A failed group-commit fdatasync fences that partition: every produce
/// its replica held gets PartitionFenced with the cause, and so do later
/// ones; the other partition of the same group commit is acknowledged.
#[test]
fn a_failed_group_commit_fails_every_pending_produce_of_that_partition() {
    let s = open(2, 3);
    let at = syncs(&s);
    s.core
        .borrow_mut()
        .io
        .inject(FaultOp::Sync, at, Fault::Errno(libc::EIO));
    let pids = [FIRST_ID, FIRST_ID + 1];
    let rxs: Vec<Vec<_>> = pids
        .iter()
        .map(|&pid| (0..3).map(|i| produce(&s, pid, i)).collect())
        .collect();
    settle_all(&s);
    // The sim runs the two flushes in a seeded order: either may fail.
    let fenced: Vec<bool> = {
        let core = s.core.borrow();
        pids.iter()
            .map(|pid| core.partitions[pid].status(0).fault.is_some())
            .collect()
    };
    assert_eq!(fenced.iter().filter(|f| **f).count(), 1, "{fenced:?}");
    for (i, list) in rxs.iter().enumerate() {
        for (n, rx) in list.iter().enumerate() {
            if fenced[i] {
                let e = refused(rx);
                assert_eq!(e.code, ErrorCode::PartitionFenced, "{e}");
                assert!(e.message.contains("fdatasync"), "{e}");
            } else {
                assert_eq!(produced(rx).base_offset, 2 * n as u64);
            }
        }
    }
    let bad = pids[usize::from(fenced[1])];
    let later = produce(&s, bad, 10);
    settle_all(&s);
    assert_eq!(refused(&later).code, ErrorCode::PartitionFenced);
}

/// A full disk refuses the append (retryable DiskFull, nothing written);
/// the replica takes the op back, so once space is free the partition
/// goes on at the same offset, not fenced.
#[test]
fn a_full_disk_refuses_the_append_and_the_partition_goes_on() {
    let s = open(1, 4);
    let used = s.core.borrow().io.space_used_bytes();
    s.core.borrow_mut().io.set_faults(Faults {
        space_bytes_max: Some(used),
        ..Faults::default()
    });
    let full = produce(&s, FIRST_ID, 1);
    settle_all(&s);
    let e = refused(&full);
    assert_eq!(e.code, ErrorCode::DiskFull, "{e}");
    s.core.borrow_mut().io.set_faults(Faults::default());
    let rxs: Vec<_> = (2..5).map(|i| produce(&s, FIRST_ID, i)).collect();
    settle_all(&s);
    let offsets: Vec<u64> = rxs.iter().map(|rx| produced(rx).base_offset).collect();
    assert_eq!(offsets, [0, 2, 4]);
    let core = s.core.borrow();
    assert!(core.partitions[&FIRST_ID].status(0).fault.is_none());
}

/// 10,000 idle partitions (and busy ones: a Normal cluster of one arms no
/// timeout) cost a tick nothing: no replica is stepped. A partition in the
/// ticking set is stepped once and leaves it when it needs no more.
#[test]
fn ten_thousand_idle_partitions_cost_no_ticks() {
    let s = open(10_000, 5);
    assert!(s.core.borrow().ticking.is_empty());
    assert_eq!(s.tick_replicas(Instant::now()), 0);
    let rxs: Vec<_> = (0..200)
        .map(|i| produce(&s, FIRST_ID + i * 50, 1))
        .collect();
    settle_all(&s);
    for rx in &rxs {
        produced(rx);
    }
    assert_eq!(s.tick_replicas(Instant::now()), 0);
    s.core.borrow_mut().ticking.insert(FIRST_ID);
    assert_eq!(s.tick_replicas(Instant::now()), 1);
    assert_eq!(s.tick_replicas(Instant::now()), 0);
}

/// 64 partitions, one produce each per turn (64 producers into 64
/// partitions), in both group commit modes: once warm, the shard's write
/// buffers all come back to its pool and are reused, so no turn allocates
/// (and zeroes, page by page) a fresh one. The pool once kept 16 idle:
/// 48 fresh write buffers a turn, the shard thread's time in page faults.
#[test]
fn a_warm_shard_reuses_its_write_buffers_across_64_partitions() {
    const PARTITIONS: u32 = 64;
    const ROUNDS: u64 = 20;
    for config in [journaled(), config()] {
        let s = open_with(PARTITIONS, 9, config);
        let pool = s.core.borrow().pool.write_buffers();
        let round = |tag: u64| {
            let rxs: Vec<_> = (0..PARTITIONS)
                .map(|i| produce(&s, FIRST_ID + i, tag))
                .collect();
            settle_all(&s);
            for rx in &rxs {
                produced(rx);
            }
        };
        for tag in 0..3 {
            round(tag);
        }
        let warm = pool.allocated_total();
        assert!(
            warm >= u64::from(PARTITIONS),
            "every partition took a buffer"
        );
        for tag in 3..3 + ROUNDS {
            round(tag);
        }
        assert_eq!(
            pool.allocated_total() - warm,
            0,
            "fresh write buffers over {ROUNDS} warm turns of {PARTITIONS} partitions"
        );
        assert!(pool.idle() <= write_buffers_idle_max(&s.config));
    }
}

/// The idle bound is a byte bound: 255 default 4 MiB buffers fit in 1 GiB,
/// and buffers too large for 16 of them still get 16.
#[test]
fn the_idle_write_buffer_bound_is_stated_in_bytes() {
    let with = |write_buffer_bytes| ServerConfig {
        write_buffer_bytes,
        ..ServerConfig::default()
    };
    assert_eq!(write_buffers_idle_max(&with(4 << 20)), 255);
    assert_eq!(
        write_buffers_idle_max(&with(64 * 1024)),
        WRITE_BUFFERS_IDLE_BYTES_MAX / (68 * 1024)
    );
    assert_eq!(
        write_buffers_idle_max(&with(256 << 20)),
        WRITE_BUFFERS_IDLE_MIN
    );
}

/// A shard's setup with everything but its id, config, topics and mailboxes
/// left idle (no peer transport, unused channels).
fn shard_setup(
    id: usize,
    config: ServerConfig,
    table: TopicTable,
    peers: Vec<crate::mailbox::MailboxTx>,
    rx: crate::mailbox::MailboxRx,
) -> ShardSetup {
    ShardSetup {
        id,
        config: Arc::new(config),
        catalog: Arc::new(Catalog::new(table)),
        peers: Arc::new(peers),
        rx,
        metrics: Arc::default(),
        shutdown: Arc::default(),
        listener: std::net::TcpListener::bind("127.0.0.1:0").expect("bind"),
        core: None,
        ready: crossbeam_channel::bounded(1).0,
        trash: crate::trash::channel().0,
        meta_io: crate::meta_io::channel().0,
        peer: None,
        peer_stats: None,
        reply_pool: Arc::new(crate::reply_pool::ReplyPool::for_shards(2)),
    }
}

/// A shard other than 0 sends its replicas' messages through shard 0's
/// mailbox (bound: its capacity, here 2): a full one drops the message and
/// counts it; nothing blocks and nothing queues elsewhere.
#[test]
fn replica_messages_from_another_shard_go_through_shard_0_and_a_full_mailbox_drops_them() {
    let (tx0, rx0) = crate::mailbox::mailbox(2, 1 << 20, 2).expect("mailbox");
    let (tx1, rx1) = crate::mailbox::mailbox(16, 1 << 20, 16).expect("mailbox");
    let setup = shard_setup(1, config(), TopicTable::default(), vec![tx0, tx1], rx1);
    let s = Shard::new(setup, data_dir(7), EventFd::new().expect("eventfd")).0;
    for i in 0..3u8 {
        s.send_to_peer(2, 9, crate::peer_buf::Outgoing::from_payload(&[i; 16]));
    }
    let drops = s
        .metrics
        .peer_drops_total
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(drops, 1, "the third message did not fit");
    for i in 0..2u8 {
        match rx0.try_recv().map(|e| (e.op, e.reply)) {
            Some((
                Op::PeerSend {
                    to,
                    partition_id,
                    payload,
                },
                ReplyTo::Nobody,
            )) => {
                assert_eq!((to, partition_id), (2, 9));
                assert_eq!(payload.payload(), [i; 16]);
            }
            other => panic!("expected a peer send, got {other:?}"),
        }
    }
    assert!(rx0.try_recv().is_none());
}

/// A shard of a cluster node hosting a partition replicated on three
/// nodes, without a transport (its sends are dropped and counted).
fn replicated_shard(seed: u64) -> Shard<SimBackend> {
    let config = ServerConfig {
        cluster_id: "c".into(),
        node_id: 1,
        peers: (1..=3)
            .map(|n| format!("{n}=127.0.0.1:{}", 7000 + n))
            .collect(),
        ..config()
    };
    let mut table = TopicTable {
        format: 1,
        next_partition_id: FIRST_ID + 1,
        ..TopicTable::default()
    };
    table.topics.insert(
        "t".into(),
        crate::catalog::TopicMeta {
            partitions: 1,
            first_partition_id: FIRST_ID,
            state: TopicState::Creating,
            replication_factor: 3,
        },
    );
    let (tx, rx) = crate::mailbox::mailbox(16, 1 << 20, 16).expect("mailbox");
    let setup = shard_setup(0, config, table, vec![tx], rx);
    let s = Shard::new(setup, data_dir(seed), EventFd::new().expect("eventfd")).0;
    // The topic's partition and shard 0's metadata replica.
    assert_eq!(s.open_owned_partitions(), 2);
    assert!(s.core.borrow().partitions.contains_key(&META_PARTITION_ID));
    s
}

/// On the shard: a replicated partition's produce stays unanswered once
/// its own flush completed (it waits for a quorum; it is not failed as
/// "not durable"); a peer message waits behind the flush in flight (it
/// may cut or persist) and is then stepped or, garbage, dropped and
/// counted; purge is refused (it would fork the group's log).
#[test]
fn a_replicated_partition_waits_for_a_quorum_and_parks_peer_messages_behind_its_flush() {
    use std::sync::atomic::Ordering::Relaxed;
    let s = replicated_shard(11);
    let status = s.core.borrow().partitions[&FIRST_ID].status(0);
    assert_eq!(status.role, "primary", "replica 0 leads view 0");
    let rx = produce(&s, FIRST_ID, 1);
    assert_eq!(s.run_turn(Instant::now()), 1);
    assert!(s.core.borrow().partitions[&FIRST_ID].flush_in_flight());
    // The prepares to nodes 2 and 3 had no transport to go to.
    assert_eq!(s.metrics.peer_drops_total.load(Relaxed), 2);
    let garbage = queue(
        &s,
        Op::PeerMessage {
            from: 2,
            partition_id: FIRST_ID,
            payload: vec![0xAB; 80].into(),
        },
    );
    let parked = s.metrics.parked_total.load(Relaxed);
    assert_eq!(s.run_turn(Instant::now()), 1);
    assert_eq!(
        s.metrics.parked_total.load(Relaxed),
        parked + 1,
        "behind the flush"
    );
    assert_eq!(
        s.metrics.peer_drops_total.load(Relaxed),
        2,
        "not stepped yet"
    );
    settle_all(&s);
    assert_eq!(s.metrics.peer_drops_total.load(Relaxed), 3, "then dropped");
    assert_eq!(s.metrics.peer_messages_total.load(Relaxed), 0);
    assert!(garbage.try_recv().is_err(), "one-way: no reply");
    assert!(
        matches!(rx.try_recv(), Err(crossbeam_channel::TryRecvError::Empty)),
        "durable here, but no quorum: not answered"
    );
    {
        let core = s.core.borrow();
        let p = &core.partitions[&FIRST_ID];
        assert_eq!(p.store().unwrap().durable().next_offset, 2);
        assert_eq!(p.high_watermark(), Some(0), "nothing committed to serve");
    }
    let purge = queue(
        &s,
        Op::Purge {
            partition_id: FIRST_ID,
        },
    );
    settle_all(&s);
    assert_eq!(refused(&purge).code, ErrorCode::PartitionUnavailable);
}

/// A replication message from replica `from` of the test group of
/// [`replicated_shard`], as its transport delivers it.
fn peer_message(from: u8, msg: crate::vsr::Message) -> Op {
    let group = crate::placement::group_id("c", "t", 0, 3);
    let mut payload = Vec::new();
    msg.to_wire(group, FIRST_ID, from)
        .expect("maps to the wire")
        .encode(&mut payload)
        .expect("encodes");
    Op::PeerMessage {
        from: u32::from(from) + 1,
        partition_id: FIRST_ID,
        payload: payload.into(),
    }
}

/// The cluster latency cause of issue 11 item 7: a PrepareOk parked behind
/// the primary's flush in flight (of a later op) held op N's commit for a
/// whole fdatasync, and a backup's Prepare parked behind its own flush
/// held its append for one. A PrepareOk in the replica's view is stepped
/// at once (the replica can only commit and reply: no store op that would
/// flush), so the produce is answered as soon as the primary's own flush
/// completes, with no second turn; garbage still waits (see above).
#[test]
fn a_prepare_ok_is_stepped_beside_the_primarys_flush_not_parked() {
    use std::sync::atomic::Ordering::Relaxed;
    let s = replicated_shard(12);
    let rx = produce(&s, FIRST_ID, 1);
    assert_eq!(s.run_turn(Instant::now()), 1);
    assert!(s.core.borrow().partitions[&FIRST_ID].flush_in_flight());
    let checksum = s.core.borrow().partitions[&FIRST_ID]
        .replica()
        .and_then(|r| r.checksum_at(1))
        .expect("op 1 is in the primary's journal");
    let ok = crate::vsr::Message {
        view: 0,
        body: crate::vsr::Body::PrepareOk(ringlog_protocol::replication::PrepareOk {
            op: 1,
            prepare_checksum: checksum,
        }),
    };
    queue(&s, peer_message(1, ok));
    let parked = s.metrics.parked_total.load(Relaxed);
    assert_eq!(s.run_turn(Instant::now()), 1);
    assert_eq!(s.metrics.parked_total.load(Relaxed), parked, "not parked");
    assert_eq!(
        s.metrics.peer_messages_total.load(Relaxed),
        1,
        "stepped now"
    );
    assert!(s.core.borrow().partitions[&FIRST_ID].flush_in_flight());
    assert!(rx.try_recv().is_err(), "not durable here yet: not answered");
    // Only the storage completion: no turn runs in between.
    for _ in 0..DRAIN_ROUNDS_MAX {
        if s.core.borrow().flights.is_empty() {
            break;
        }
        s.on_storage_completions(Instant::now());
    }
    let reply = produced(&rx);
    assert_eq!((reply.base_offset, reply.next_offset), (0, 2));
    assert_eq!(
        s.core.borrow().partitions[&FIRST_ID]
            .replica()
            .map(|r| r.commit()),
        Some(1)
    );
}

/// A fetch's reply, or None while it waits (parked behind a read-ahead).
fn fetch_now(s: &Shard<SimBackend>, offset: u64) -> crossbeam_channel::Receiver<Outcome> {
    let rx = queue(
        s,
        Op::Fetch {
            partition_id: FIRST_ID,
            offset,
            max_bytes: 32 * 1024,
            wait_ms: 0,
        },
    );
    assert_eq!(s.run_turn(Instant::now()), 1);
    rx
}

fn metric(m: &std::sync::atomic::AtomicU64) -> u64 {
    m.load(std::sync::atomic::Ordering::Relaxed)
}

/// Cold sequential fetches through the turn (read cache off): a fetch read
/// from the device queues the next one's read; the next fetch, arriving
/// while it is in flight, waits for it (no reply, no second device read)
/// and is answered from it once the ring's completions are reaped. EIO on
/// one read-ahead (injected): that fetch reads the device itself, the
/// partition stays healthy. Every batch comes back once, verified, in
/// offset order.
#[test]
fn a_sequential_fetch_waits_for_its_read_ahead_and_is_served_from_it() {
    let cold = ServerConfig {
        read_cache_bytes: 0,
        ..config()
    };
    let s = open_with(1, 9, cold);
    let rxs: Vec<_> = (0..40)
        .map(|t| {
            let op = Op::Produce {
                partition_id: FIRST_ID,
                batch: batch(t, 4, 2000).into(),
            };
            queue(&s, op)
        })
        .collect();
    settle_all(&s);
    let end = rxs.iter().map(|rx| produced(rx).next_offset).max().unwrap();
    let reads_before = s.core.borrow().io.op_count(FaultOp::Read);
    let (mut offset, mut batches, mut fetches, mut waited) = (0, 0, 0, 0);
    while offset < end {
        let rx = fetch_now(&s, offset);
        fetches += 1;
        if rx.is_empty() {
            waited += 1;
            if fetches == 5 {
                let io = &mut s.core.borrow_mut().io;
                let nth = io.op_count(FaultOp::Read);
                io.inject(FaultOp::Read, nth, Fault::Errno(libc::EIO));
            }
            for _ in 0..DRAIN_ROUNDS_MAX {
                s.on_storage_completions(Instant::now());
                if !rx.is_empty() {
                    break;
                }
            }
        }
        let f = match rx.try_recv() {
            Ok(Ok(OpReply::Fetched(f))) => f,
            other => panic!("fetch at {offset}: {other:?}"),
        };
        let mut rest = &f.batches[..];
        while !rest.is_empty() {
            let view = ringlog_protocol::BatchView::parse(rest).expect("verified batch");
            assert_eq!(view.header().base_offset, offset, "in offset order");
            offset = view.header().next_offset();
            rest = &rest[view.as_bytes().len()..];
            batches += 1;
        }
        assert_eq!(offset, f.next_offset);
    }
    assert_eq!(batches, 40);
    let m = &s.metrics;
    let (issued, hits, errors) = (
        metric(&m.read_ahead_issued_total),
        metric(&m.read_ahead_hits_total),
        metric(&m.read_ahead_errors_total),
    );
    // Every fetch but the first waited for its read-ahead.
    assert_eq!(waited, fetches - 1);
    assert_eq!(errors, 1);
    assert_eq!(hits, fetches - 2, "all but the first and the failed one");
    assert_eq!(issued, hits + errors);
    let reads = s.core.borrow().io.op_count(FaultOp::Read) - reads_before;
    assert_eq!(
        reads,
        issued + 2,
        "the first fetch and the failed one re-read"
    );
    let core = s.core.borrow();
    let p = core.partitions.get(&FIRST_ID).unwrap();
    assert!(
        p.status(0).fault.is_none(),
        "EIO on a read-ahead is not fatal"
    );
    assert_eq!(core.pool.read_ahead_stats().held_bytes, 0);
}

/// On shard 0 of a cluster node: a metadata command another node
/// forwarded (a peer frame to the metadata group's partition with the
/// forward magic) joins the controller's queue, one-way, at most
/// `META_QUEUE_MAX` of them (more are dropped and counted, the sender
/// retries); on a node without a metadata replica it is dropped too.
#[test]
fn forwarded_metadata_commands_join_the_bounded_controller_queue() {
    use std::sync::atomic::Ordering::Relaxed;
    let cmd = crate::meta::Command::DeleteTopic { name: "t".into() };
    let forward = |s: &Shard<SimBackend>, id: u64| {
        let payload = crate::meta_hosted::encode_forward(id, &cmd).unwrap();
        let op = Op::PeerMessage {
            from: 2,
            partition_id: META_PARTITION_ID,
            payload: payload.into(),
        };
        queue(s, op)
    };
    let s = replicated_shard(12);
    let drops = s.metrics.peer_drops_total.load(Relaxed);
    let replies: Vec<_> = (0..=META_QUEUE_MAX as u64)
        .map(|id| forward(&s, id))
        .collect();
    while s.run_turn(Instant::now()) > 0 {}
    let queued = s.meta_queue.borrow();
    assert_eq!(queued.len(), META_QUEUE_MAX);
    assert!(matches!(
        &queued[0],
        (MetaOp::Forwarded { from: 2, .. }, Responder::Nobody)
    ));
    assert_eq!(s.metrics.peer_drops_total.load(Relaxed), drops + 1);
    assert!(replies.iter().all(|r| r.try_recv().is_err()), "one-way");
    let alone = open(1, 13);
    assert!(alone.meta_group.is_none());
    let _reply = forward(&alone, 1);
    while alone.run_turn(Instant::now()) > 0 {}
    assert!(alone.meta_queue.borrow().is_empty());
    assert_eq!(alone.metrics.peer_drops_total.load(Relaxed), 1);
}

/// The metrics' `trigger` labels are the replica's trigger names, by index.
#[test]
fn transfer_trigger_labels_match_the_replica_triggers() {
    let labels = crate::vsr::Trigger::ALL.map(|t| t.label());
    assert_eq!(labels, metrics::TRANSFER_TRIGGERS);
    for (i, t) in crate::vsr::Trigger::ALL.iter().enumerate() {
        assert_eq!(t.index(), i);
    }
}
