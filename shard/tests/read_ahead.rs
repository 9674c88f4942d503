//! Sequential read-ahead through the server (io_uring, O_DIRECT): a cold
//! consumer (read cache off) is served from reads queued ahead, counted in
//! the metrics, with the records a server with read-ahead off returns.

mod common;

use common::{config, counter};
use ringlog_shard::client::{batch_of, records, Client};
use ringlog_shard::config::ServerConfig;
use ringlog_shard::server::{self, Hooks};

/// Every record of partition 0 of topic `t`, fetches of `max_bytes`.
fn consume(c: &mut Client, max_bytes: u32) -> Vec<(u64, Vec<u8>)> {
    let (mut got, mut offset) = (Vec::new(), 0);
    loop {
        let f = c.fetch("t", 0, offset, max_bytes, 0).unwrap();
        if f.batches.is_empty() {
            return got;
        }
        got.extend(
            records(&f.batches)
                .unwrap()
                .into_iter()
                .map(|r| (r.offset, r.value)),
        );
        offset = f.next_offset;
    }
}

/// Runs one server on `cfg`, producing first if asked; the records and the
/// read-ahead counters issued, hits, wasted, errors.
fn run(cfg: ServerConfig, produce: bool) -> (Vec<(u64, Vec<u8>)>, [u64; 4]) {
    let running = server::start(cfg, Hooks::default()).unwrap();
    let control = running.control_socket.clone();
    let mut c = Client::connect(running.client_addr).unwrap();
    if produce {
        c.create_topic("t", 1).unwrap();
        for i in 0..200u32 {
            let value = format!("record-{i}-")
                .repeat(1 + i as usize % 60)
                .into_bytes();
            c.produce("t", 0, batch_of(&[&value, &value]).unwrap())
                .unwrap();
        }
    }
    let got = consume(&mut c, 8192);
    let names = ["issued", "hits", "wasted", "errors"];
    let counts = names.map(|n| counter(&control, &format!("ringlog_read_ahead_{n}_total")));
    drop(c);
    running.shutdown_handle().trigger();
    running.wait().unwrap();
    (got, counts)
}

#[test]
fn a_cold_sequential_consumer_is_served_from_read_ahead() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let cold = |read_ahead_bytes| ServerConfig {
        read_cache_bytes: 0,
        read_ahead_bytes,
        ..config(&data)
    };
    let (off, [issued, hits, ..]) = run(cold(0), true);
    assert_eq!(off.len(), 400);
    assert_eq!((issued, hits), (0, 0), "read-ahead off");
    let (on, [issued, hits, wasted, errors]) = run(cold(1 << 20), false);
    assert_eq!(on, off, "the same records");
    // The segments roll every 32 KiB, 8 KiB fetches: most are hits.
    assert!(
        hits > 0 && hits * 2 > issued,
        "issued {issued}, hits {hits}"
    );
    assert_eq!(errors, 0);
    assert!(
        hits + wasted <= issued,
        "issued {issued}, hits {hits}, wasted {wasted}"
    );
}
