//! The shard's read cache through the server: tail fetches are answered
//! from memory and counted in the metrics; a restarted server (cold cache)
//! and one with the cache off read the device, with the same records.

mod common;

use common::{config, counter};
use ringlog_shard::client::{batch_of, records, Client};
use ringlog_shard::config::ServerConfig;
use ringlog_shard::server::{self, Hooks};

/// Every record of partition 0 of topic `t`, one fetch of `max_bytes` at a time;
/// also the fetched bytes.
fn consume(c: &mut Client, max_bytes: u32) -> (Vec<(u64, Vec<u8>)>, u64) {
    let (mut got, mut bytes, mut offset) = (Vec::new(), 0, 0);
    loop {
        let f = c.fetch("t", 0, offset, max_bytes, 0).unwrap();
        if f.batches.is_empty() {
            return (got, bytes);
        }
        bytes += f.batches.len() as u64;
        got.extend(
            records(&f.batches)
                .unwrap()
                .into_iter()
                .map(|r| (r.offset, r.value)),
        );
        offset = f.next_offset;
    }
}

fn run(cfg: ServerConfig, produce: bool) -> (Vec<(u64, Vec<u8>)>, [u64; 3]) {
    let running = server::start(cfg, Hooks::default()).unwrap();
    let control = running.control_socket.clone();
    let mut c = Client::connect(running.client_addr).unwrap();
    if produce {
        c.create_topic("t", 1).unwrap();
        for i in 0..40u32 {
            let value = format!("record-{i}-")
                .repeat(1 + i as usize % 30)
                .into_bytes();
            c.produce("t", 0, batch_of(&[&value]).unwrap()).unwrap();
        }
    }
    let (got, bytes) = consume(&mut c, 4096);
    let hits = counter(&control, "ringlog_read_cache_hits_total");
    let misses = counter(&control, "ringlog_read_cache_misses_total");
    let served = counter(&control, "ringlog_read_cache_served_bytes_total");
    assert!(served <= bytes);
    drop(c);
    running.shutdown_handle().trigger();
    running.wait().unwrap();
    (got, [hits, misses, served])
}

#[test]
fn tail_fetches_are_served_from_memory_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (hot, [hits, misses, served]) = run(config(&data), true);
    assert_eq!(hot.len(), 40);
    assert!(hits > 0 && misses == 0, "hits {hits}, misses {misses}");
    assert!(served > 0);
    // Restarted: the new stores have nothing cached, the device answers.
    let (cold, [hits, misses, _]) = run(config(&data), false);
    assert_eq!(cold, hot);
    assert!(hits == 0 && misses > 0, "hits {hits}, misses {misses}");
    // Off: nothing is counted as a hit.
    let off = ServerConfig {
        read_cache_bytes: 0,
        ..config(&data)
    };
    let (off_got, [hits, _, served]) = run(off, false);
    assert_eq!(off_got, hot);
    assert_eq!((hits, served), (0, 0));
}
