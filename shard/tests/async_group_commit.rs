//! The non-blocking group commit, in process: many producers on few
//! partitions with a tiny write buffer and tiny segments, so appends pile up
//! behind flushes in flight, get parked (buffer full, segment roll) and
//! resume; every acknowledged batch must read back, once, in offset order.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{config, counter};
use ringlog_shard::client::{batch_of, records, with_retry, Client};
use ringlog_shard::server::{self, Hooks};

/// (partition, offset) -> value of every acknowledged record.
type Acked = BTreeMap<(u32, u64), Vec<u8>>;

#[test]
fn pipelined_appends_park_roll_and_are_acknowledged_once_durable() {
    let dir = tempfile::tempdir().unwrap();
    let running = server::start(config(&dir.path().join("data")), Hooks::default()).unwrap();
    let addr = running.client_addr;
    let control = running.control_socket.clone();
    let mut c = Client::connect(addr).unwrap();
    c.create_topic("pipe", 2).unwrap();

    let acked: Arc<Mutex<Acked>> = Arc::default();
    let producers: Vec<_> = (0..8u32)
        .map(|p| {
            let acked = acked.clone();
            std::thread::spawn(move || {
                let mut c = Client::connect(addr).unwrap();
                for i in 0..60u32 {
                    // 1..=6 records of up to 600 bytes: batches of up to ~4
                    // KiB, so an 8 KiB buffer fills behind a flush in flight.
                    let n = 1 + (p + i) as usize % 6;
                    let values: Vec<Vec<u8>> = (0..n)
                        .map(|r| {
                            let len = 50 + ((p * 131 + i * 17 + r as u32 * 7) % 550) as usize;
                            format!("p{p}-b{i}-r{r}-")
                                .into_bytes()
                                .into_iter()
                                .cycle()
                                .take(len)
                                .collect()
                        })
                        .collect();
                    let refs: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
                    let batch = batch_of(&refs).unwrap();
                    let partition = (p + i) % 2;
                    let reply = with_retry(50, Duration::from_millis(5), || {
                        c.produce("pipe", partition, batch.clone())
                    })
                    .unwrap();
                    assert_eq!(reply.next_offset - reply.base_offset, n as u64);
                    let mut acked = acked.lock().unwrap();
                    for (k, v) in values.into_iter().enumerate() {
                        let prev = acked.insert((partition, reply.base_offset + k as u64), v);
                        assert!(prev.is_none(), "offset acknowledged twice");
                    }
                }
            })
        })
        .collect();
    for h in producers {
        h.join().unwrap();
    }

    let acked = acked.lock().unwrap();
    assert_eq!(
        acked.len(),
        (0..8u32)
            .flat_map(|p| (0..60u32).map(move |i| 1 + (p + i) as usize % 6))
            .sum::<usize>()
    );
    for partition in 0..2u32 {
        let mine: Vec<(&u64, &Vec<u8>)> = acked
            .iter()
            .filter(|((p, _), _)| *p == partition)
            .map(|((_, o), v)| (o, v))
            .collect();
        // Offsets are dense from 0: nothing acknowledged was lost or skipped.
        for (i, (offset, _)) in mine.iter().enumerate() {
            assert_eq!(**offset, i as u64, "partition {partition}");
        }
        let mut got = Vec::new();
        let mut offset = 0;
        while offset < mine.len() as u64 {
            let f = c.fetch("pipe", partition, offset, 1 << 20, 0).unwrap();
            assert!(f.next_offset > offset, "fetch made progress");
            for r in records(&f.batches).unwrap() {
                got.push((r.offset, r.value));
            }
            offset = f.next_offset;
        }
        assert_eq!(got.len(), mine.len(), "partition {partition}");
        for ((o, v), (eo, ev)) in got.iter().zip(&mine) {
            assert_eq!(o, *eo);
            assert_eq!(v, *ev, "partition {partition} offset {o}");
        }
    }
    assert!(counter(&control, "ringlog_fsyncs_total") > 0);
    assert!(
        counter(&control, "ringlog_parked_total") > 0,
        "appends waited behind a flush in flight"
    );

    // Purge and restart behind the pipeline: the server stops cleanly with
    // no flush in flight and everything acknowledged survives.
    c.purge("pipe", 0).unwrap();
    drop(c);
    running.shutdown_handle().trigger();
    running.wait().unwrap();
    let running = server::start(config(&dir.path().join("data")), Hooks::default()).unwrap();
    let mut c = Client::connect(running.client_addr).unwrap();
    let count1 = acked.keys().filter(|(p, _)| *p == 1).count() as u64;
    let f = c.fetch("pipe", 1, 0, 1 << 20, 0).unwrap();
    assert!(!f.batches.is_empty());
    assert_eq!(f.high_watermark, count1);
    // Partition 0 was purged: empty, and its offsets keep counting.
    let count0 = acked.keys().filter(|(p, _)| *p == 0).count() as u64;
    let f = c.fetch("pipe", 0, count0, 1 << 20, 0).unwrap();
    assert!(f.batches.is_empty());
    assert_eq!((f.log_start_offset, f.high_watermark), (count0, count0));
    running.shutdown_handle().trigger();
    running.wait().unwrap();
}
