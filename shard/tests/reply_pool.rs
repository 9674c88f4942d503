//! Fetch replies are sent from buffers the server keeps (`reply_pool`):
//! consumers are served without allocating a buffer per fetch, and a
//! connection dropped in the middle of a reply gives its buffer back.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use common::{config, counter};
use ringlog_protocol::wire::{Body, Request, FRAME_BYTES_MAX, PROTOCOL_VERSION};
use ringlog_shard::client::{batch_of, read_reply, records, Client};
use ringlog_shard::server::{self, Hooks};

const BATCHES: u32 = 40;

/// A server with topic `t` (one partition) holding `BATCHES` batches of
/// 64 KiB values (2.5 MiB), segments large enough to hold them all.
fn filled(dir: &Path) -> server::Running {
    let cfg = ringlog_shard::config::ServerConfig {
        segment_size_bytes: 16 << 20,
        write_buffer_bytes: 1 << 20,
        ..config(dir)
    };
    let running = server::start(cfg, Hooks::default()).unwrap();
    let mut c = Client::connect(running.client_addr).unwrap();
    c.create_topic("t", 1).unwrap();
    for i in 0..BATCHES {
        let value = vec![i as u8; 64 << 10];
        c.produce("t", 0, batch_of(&[&value]).unwrap()).unwrap();
    }
    running
}

/// Reads the whole partition, `max_bytes` per fetch; the values read.
fn consume(c: &mut Client, max_bytes: u32) -> Vec<Vec<u8>> {
    let (mut values, mut offset) = (Vec::new(), 0);
    loop {
        let f = c.fetch("t", 0, offset, max_bytes, 0).unwrap();
        if f.batches.is_empty() {
            return values;
        }
        values.extend(records(&f.batches).unwrap().into_iter().map(|r| r.value));
        offset = f.next_offset;
    }
}

fn allocated(running: &server::Running) -> u64 {
    counter(
        &running.control_socket,
        "ringlog_reply_buffers_allocated_total",
    )
}

#[test]
fn consumers_are_served_from_kept_buffers() {
    let dir = tempfile::tempdir().unwrap();
    let running = filled(&dir.path().join("data"));
    let mut c = Client::connect(running.client_addr).unwrap();
    // Fetches of 256 KiB (hot, from the read cache) and of 1 MiB.
    for max_bytes in [256 << 10, 1 << 20, 256 << 10] {
        let values = consume(&mut c, max_bytes);
        assert_eq!(values.len(), BATCHES as usize);
        for (i, v) in values.iter().enumerate() {
            assert_eq!(v, &vec![i as u8; 64 << 10]);
        }
    }
    // Over 20 fetches, one request in flight: the first fetch allocates,
    // the rest reuse what it gave back (the pool is shared by the shards,
    // so it does not matter which one the connection landed on).
    let n = allocated(&running);
    assert!((1..=2).contains(&n), "{n} reply buffers allocated");
    running.shutdown_handle().trigger();
    running.wait().unwrap();
}

/// Sends Hello and a fetch of everything, reads the reply's first bytes
/// only, and closes: the server's write of the rest fails (or lands in
/// the socket buffers of a closed connection).
fn fetch_and_hang_up(addr: std::net::SocketAddr) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut frame = Vec::new();
    let hello = Request::Hello {
        version_min: PROTOCOL_VERSION,
        version_max: PROTOCOL_VERSION,
        client: "hang-up".into(),
    };
    hello.encode(1, &mut frame).unwrap();
    s.write_all(&frame).unwrap();
    let reply = read_reply(&mut s, FRAME_BYTES_MAX).unwrap();
    assert!(matches!(reply.result, Ok(Body::Hello(_))), "{reply:?}");
    frame.clear();
    let fetch = Request::Fetch {
        topic: "t".into(),
        partition: 0,
        offset: 0,
        max_bytes: 4 << 20,
        wait_ms: 0,
    };
    fetch.encode(2, &mut frame).unwrap();
    s.write_all(&frame).unwrap();
    let mut first = [0u8; 64];
    s.read_exact(&mut first).unwrap();
    // Unread bytes at close: the kernel resets the connection.
    drop(s);
}

#[test]
fn a_connection_dropped_mid_reply_gives_its_buffer_back() {
    let dir = tempfile::tempdir().unwrap();
    let running = filled(&dir.path().join("data"));
    for _ in 0..10 {
        fetch_and_hang_up(running.client_addr);
    }
    // Had a dropped reply lost its buffer, each hang-up would have made
    // the next fetch allocate: ten at least. (A next fetch may come before
    // the failed write returned the last buffer: a few, not ten.)
    let mut c = Client::connect(running.client_addr).unwrap();
    assert_eq!(consume(&mut c, 4 << 20).len(), BATCHES as usize);
    let n = allocated(&running);
    assert!((1..=3).contains(&n), "{n} reply buffers allocated");
    running.shutdown_handle().trigger();
    running.wait().unwrap();
}
