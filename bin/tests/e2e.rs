//! End-to-end: concurrent producers across topics, partitions and shards;
//! read back exactly once, in order, byte-identical; graceful restart;
//! SIGKILL during production; backpressure with a tiny mailbox.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;

fn spawn_producers(
    addr: &str,
    targets: &[(String, u32)],
    producers: usize,
    batches: usize,
    per_batch: usize,
    acked: &Arc<Mutex<Acked>>,
    tolerate_errors: bool,
) -> Vec<std::thread::JoinHandle<u64>> {
    (0..producers)
        .map(|p| {
            let addr = addr.to_string();
            // Each producer walks all targets from a different start.
            let mut t = targets.to_vec();
            t.rotate_left(p % targets.len());
            let acked = acked.clone();
            std::thread::spawn(move || {
                produce_run(
                    &addr,
                    p,
                    &t,
                    batches,
                    per_batch,
                    64,
                    &acked,
                    tolerate_errors,
                )
            })
        })
        .collect()
}

#[test]
fn concurrent_producers_then_consumers_read_every_ack_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &[]);
    let mut c = server.client();
    let targets = create_topics(&mut c, &[("alpha", 3), ("beta", 2), ("gamma", 4)]);
    let used = shards_used(&mut c, &["alpha", "beta", "gamma"]);
    assert!(
        used.len() >= 2,
        "partitions on more than one shard: {used:?}"
    );
    let acked = Arc::new(Mutex::new(Acked::new()));
    let handles = spawn_producers(&server.addr, &targets, 6, 40, 5, &acked, false);
    for h in handles {
        h.join().unwrap();
    }
    let acked = acked.lock().unwrap();
    let total: usize = acked.values().map(|m| m.len()).sum();
    assert_eq!(total, 6 * 40 * 5);
    // Consumers on fresh connections (which land on either shard).
    for _ in 0..2 {
        let mut reader = server.client();
        verify(&mut reader, &acked, true);
    }
    // Group commit happened: some fsync covered more than one append.
    let metrics = server.ctl(&["metrics"]);
    let text = metrics["result"]["text"].as_str().unwrap();
    assert!(
        text.contains("ringlog_appends_total{shard=\"0\"}"),
        "{text}"
    );
}

#[test]
fn graceful_restart_keeps_every_ack_and_never_reuses_offsets() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut server = Server::start(
        &data,
        &[
            "--segment-size-bytes",
            "16384",
            "--set",
            "write_buffer_bytes=8192",
        ],
    );
    let mut c = server.client();
    let targets = create_topics(&mut c, &[("r1", 2), ("r2", 3)]);
    let acked = Arc::new(Mutex::new(Acked::new()));
    for h in spawn_producers(&server.addr, &targets, 3, 30, 10, &acked, false) {
        h.join().unwrap();
    }
    let status = server.signal_and_wait(libc::SIGTERM, Duration::from_secs(30));
    assert_eq!(status.code(), Some(0), "graceful exit: {}", server.stderr());
    assert!(!server.control.exists(), "control socket removed");

    let server = Server::start(
        &data,
        &[
            "--segment-size-bytes",
            "16384",
            "--set",
            "write_buffer_bytes=8192",
        ],
    );
    let mut c = server.client();
    let before = acked.lock().unwrap().clone();
    verify(&mut c, &before, true);
    // Segments rolled (small segments), and the log continues after them.
    let parts = server.ctl(&["partitions"]);
    let sealed: u64 = parts["result"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["sealed_segments"].as_u64().unwrap())
        .sum();
    assert!(sealed > 0, "expected rolled segments: {parts}");
    for h in spawn_producers(&server.addr, &targets, 2, 10, 3, &acked, false) {
        h.join().unwrap();
    }
    let after = acked.lock().unwrap().clone();
    verify(&mut c, &after, true);
}

#[test]
fn sigkill_during_production_loses_no_ack_and_reuses_no_offset() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut server = Server::start(&data, &[]);
    let mut c = server.client();
    let targets = create_topics(&mut c, &[("k1", 2), ("k2", 2)]);
    let acked = Arc::new(Mutex::new(Acked::new()));
    let handles = spawn_producers(&server.addr, &targets, 4, 100_000, 4, &acked, true);
    // Let production run, then kill without grace.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while acked
        .lock()
        .unwrap()
        .values()
        .map(|m| m.len())
        .sum::<usize>()
        < 2000
    {
        assert!(
            std::time::Instant::now() < deadline,
            "producers made no progress"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    server.kill9();
    for h in handles {
        h.join().unwrap();
    }
    let before = acked.lock().unwrap().clone();
    assert!(before.values().map(|m| m.len()).sum::<usize>() >= 2000);

    let server = Server::start(&data, &[]);
    let mut c = server.client();
    verify(&mut c, &before, false);
    // New appends get offsets past everything acknowledged before.
    for (topic, partition) in &targets {
        let top = before
            .get(&(topic.clone(), *partition))
            .and_then(|m| m.keys().next_back().copied());
        let ack = c
            .produce(
                topic,
                *partition,
                ringlog_shard::client::batch_of(&[b"after"]).unwrap(),
            )
            .unwrap();
        if let Some(top) = top {
            assert!(
                ack.base_offset > top,
                "offset {} handed out again",
                ack.base_offset
            );
        }
    }
}

#[test]
fn tiny_mailbox_pushes_back_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(
        &dir.path().join("data"),
        &["--mailbox-capacity", "1", "--group-commit-delay-us", "3000"],
    );
    let mut c = server.client();
    let targets = create_topics(&mut c, &[("bp", 4)]);
    let acked = Arc::new(Mutex::new(Acked::new()));
    let handles = spawn_producers(&server.addr, &targets, 12, 25, 2, &acked, false);
    let refusals: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    let acked = acked.lock().unwrap();
    assert_eq!(acked.values().map(|m| m.len()).sum::<usize>(), 12 * 25 * 2);
    verify(&mut c, &acked, true);
    let text = server.ctl(&["metrics"])["result"]["text"]
        .as_str()
        .unwrap()
        .to_string();
    let rejections: u64 = text
        .lines()
        .filter(|l| l.starts_with("ringlog_mailbox_rejections_total{"))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert!(refusals > 0, "producers saw Backpressure");
    assert!(rejections > 0, "mailbox rejections counted: {text}");
}

#[test]
fn keyed_produce_purge_and_delete() {
    use ringlog_protocol::wire::{partition_for_key, ErrorCode};
    use ringlog_shard::client::batch_of;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Server::start(&data, &[]);
    let mut c = server.client();
    c.create_topic("keyed", 5).unwrap();
    let ack = c
        .produce_keyed("keyed", b"user-42", batch_of(&[b"v1"]).unwrap())
        .unwrap();
    assert_eq!(ack.partition, partition_for_key(b"user-42", 5));
    let again = c
        .produce_keyed("keyed", b"user-42", batch_of(&[b"v2"]).unwrap())
        .unwrap();
    assert_eq!((again.partition, again.base_offset), (ack.partition, 1));
    let topics = c.list_topics().unwrap();
    assert_eq!(topics.len(), 1);
    assert_eq!(topics[0].partitions, 5);

    // Purge: data gone, offsets continue.
    c.purge("keyed", ack.partition).unwrap();
    let err = c.fetch("keyed", ack.partition, 0, 1 << 16, 0).unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::OffsetOutOfRange));
    let next = c
        .produce("keyed", ack.partition, batch_of(&[b"v3"]).unwrap())
        .unwrap();
    assert_eq!(next.base_offset, 2);
    let page = c.fetch("keyed", ack.partition, 2, 1 << 16, 0).unwrap();
    assert_eq!(page.log_start_offset, 2);

    // Delete: gone from the catalog and the disk; the name can be reused.
    c.delete_topic("keyed").unwrap();
    assert!(c.list_topics().unwrap().is_empty());
    assert!(!data.join("topics/keyed").exists());
    let err = c
        .produce("keyed", 0, batch_of(&[b"x"]).unwrap())
        .unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::UnknownTopic));
    c.create_topic("keyed", 2).unwrap();
    let fresh = c.produce("keyed", 0, batch_of(&[b"x"]).unwrap()).unwrap();
    assert_eq!(fresh.base_offset, 0);
    let d = c.describe_topic("keyed").unwrap();
    assert_eq!(d.partitions.len(), 2);
    assert!(
        d.partitions.iter().all(|p| p.partition_id >= 5),
        "ids never reused"
    );
}
