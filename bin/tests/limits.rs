//! Every connection bound on the real binary: the per-shard byte budget
//! (RSS stays bounded however large the frames that headers declare),
//! header and idle timeouts, and the connection cap.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::*;
use ringlog_protocol::wire::ErrorCode;
use ringlog_shard::client::{batch_of, Client};

const MIB: u64 = 1024 * 1024;

fn rss_bytes(server: &Server) -> u64 {
    let pid = server.child.as_ref().expect("running").id();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no VmRSS in {status}"));
    kib * 1024
}

/// Blocks until the server closes `s` (EOF or reset) or `limit` passes;
/// returns how long that took.
fn wait_closed(s: &mut TcpStream, limit: Duration) -> Duration {
    let t = Instant::now();
    s.set_read_timeout(Some(limit)).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return t.elapsed(),
            Ok(_) => continue, // an error reply before the close is fine
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
                ) =>
            {
                return t.elapsed()
            }
            Err(e) => panic!("connection still open after {:?}: {e}", t.elapsed()),
        }
    }
}

fn metric(server: &Server, name: &str) -> u64 {
    let v = server.ctl(&["metrics"]);
    let text = v["result"]["text"].as_str().unwrap().to_string();
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

#[test]
fn frames_declaring_16_mib_keep_rss_bounded_and_are_refused_over_budget() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(
        &dir.path().join("data"),
        &[
            "--set",
            "shards=1",
            "--set",
            "shard_request_bytes_max=33554432",
            "--set",
            "header_timeout_ms=2000",
        ],
    );
    let mut c = server.client();
    c.create_topic("t", 1).unwrap();
    let before = rss_bytes(&server);
    // 72 connections each declare a 16 MiB body and send 256 KiB of it.
    let declared = 16 * MIB as u32 - 4096;
    let mut stallers: Vec<TcpStream> = (0..72)
        .map(|_| {
            let mut s = TcpStream::connect(&server.addr).unwrap();
            let mut head = declared.to_le_bytes().to_vec();
            head.extend_from_slice(&0u64.to_le_bytes());
            s.write_all(&head).unwrap();
            s.write_all(&vec![0u8; 256 * 1024]).unwrap();
            s
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let during = rss_bytes(&server);
    // Two declared bodies fill the 32 MiB budget: a real produce is refused
    // with a retryable Backpressure error, and the connection stays usable.
    let err = c
        .produce("t", 0, batch_of(&[&vec![b'x'; 512 * 1024][..]]).unwrap())
        .unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::Backpressure), "{err}");
    assert!(err.is_retryable());
    assert!(err.to_string().contains("shard_request_bytes_max"), "{err}");
    // The stalled bodies are closed after the header (stall) timeout.
    for s in &mut stallers {
        let took = wait_closed(s, Duration::from_secs(20));
        assert!(took < Duration::from_secs(10), "closed after {took:?}");
    }
    drop(stallers);
    std::thread::sleep(Duration::from_millis(300));
    let after = rss_bytes(&server);
    eprintln!(
        "VmRSS: before {} MiB, 72 stalled 16 MiB frames {} MiB, after close {} MiB",
        before / MIB,
        during / MIB,
        after / MIB
    );
    assert!(
        during < before + 48 * MIB,
        "RSS grew from {before} to {during} bytes"
    );
    assert!(after < before + 48 * MIB, "RSS stayed at {after} bytes");
    assert!(metric(&server, "ringlog_header_timeouts_total") >= 72);
    assert!(metric(&server, "ringlog_over_budget_total") >= 1);
    // Budget released: the same produce now succeeds on the same connection.
    let ack = c
        .produce("t", 0, batch_of(&[&vec![b'x'; 512 * 1024][..]]).unwrap())
        .unwrap();
    assert_eq!(ack.base_offset, 0);
}

#[test]
fn idle_connections_are_closed_after_the_idle_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &["--set", "idle_timeout_ms=1000"]);
    // A busy connection outlives the idle timeout.
    let mut busy = server.client();
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(2500) {
        busy.list_topics().unwrap();
        std::thread::sleep(Duration::from_millis(300));
    }
    // An idle one (greeted, then silent) is closed after about a second.
    let mut idle = TcpStream::connect(&server.addr).unwrap();
    let mut hello = Vec::new();
    ringlog_protocol::wire::Request::Hello {
        version_min: 1,
        version_max: ringlog_protocol::wire::PROTOCOL_VERSION,
        client: "idle".into(),
    }
    .encode(1, &mut hello)
    .unwrap();
    idle.write_all(&hello).unwrap();
    let reply = ringlog_shard::client::read_reply(&mut idle, 1 << 20).unwrap();
    assert!(reply.result.is_ok());
    let took = wait_closed(&mut idle, Duration::from_secs(10));
    assert!(took >= Duration::from_millis(800), "closed after {took:?}");
    assert!(metric(&server, "ringlog_idle_timeouts_total") >= 1);
}

#[test]
fn a_header_stalled_midway_is_closed_after_the_header_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(
        &dir.path().join("data"),
        &["--set", "header_timeout_ms=1000"],
    );
    let mut s = TcpStream::connect(&server.addr).unwrap();
    s.write_all(&[16, 0, 0, 0, 9]).unwrap(); // 5 of the 12 header bytes
    let took = wait_closed(&mut s, Duration::from_secs(10));
    assert!(
        took >= Duration::from_millis(800) && took < Duration::from_secs(5),
        "closed after {took:?}"
    );
    assert!(metric(&server, "ringlog_header_timeouts_total") >= 1);
    // Others are served meanwhile and after.
    server.client().list_topics().unwrap();
}

#[test]
fn connections_over_the_cap_get_a_clear_retryable_error() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(
        &dir.path().join("data"),
        &["--set", "shards=1", "--set", "connections_per_shard_max=2"],
    );
    let a = server.client();
    let mut b = server.client();
    let err = Client::connect(&server.addr).map(|_| ()).unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::Backpressure), "{err}");
    assert!(err.to_string().contains("too many connections"), "{err}");
    b.list_topics().unwrap();
    drop(a);
    // The slot frees once the server saw the close.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut c = loop {
        match Client::connect(&server.addr) {
            Ok(c) => break c,
            Err(e) if e.is_retryable() && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50))
            }
            Err(e) => panic!("{e}"),
        }
    };
    c.list_topics().unwrap();
    assert!(metric(&server, "ringlog_connections_refused_total") >= 1);
}

#[test]
fn mailbox_byte_budget_pushes_back_and_loses_nothing() {
    use std::sync::{Arc, Mutex};
    let dir = tempfile::tempdir().unwrap();
    // One ~3 KiB batch fills a shard's mailbox byte budget; the count bound
    // is far away, so every refusal here comes from the bytes.
    let server = Server::start(
        &dir.path().join("data"),
        &[
            "--set",
            "frame_bytes_max=4096",
            "--set",
            "mailbox_bytes_max=4096",
            "--group-commit-delay-us",
            "3000",
        ],
    );
    let mut c = server.client();
    let targets = create_topics(&mut c, &[("mb", 4)]);
    let acked = Arc::new(Mutex::new(Acked::new()));
    let handles: Vec<_> = (0..12)
        .map(|p| {
            let (addr, acked) = (server.addr.clone(), acked.clone());
            let mut t = targets.clone();
            t.rotate_left(p % targets.len());
            std::thread::spawn(move || produce_run(&addr, p, &t, 20, 2, 1500, &acked, false))
        })
        .collect();
    let refusals: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    let acked = acked.lock().unwrap();
    assert_eq!(acked.values().map(|m| m.len()).sum::<usize>(), 12 * 20 * 2);
    verify(&mut c, &acked, true);
    assert!(refusals > 0, "producers saw Backpressure");
    assert!(metric(&server, "ringlog_mailbox_rejections_total") > 0);
}

#[test]
fn a_client_that_stops_reading_is_closed_and_frees_its_reply_budget() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(
        &dir.path().join("data"),
        &[
            "--set",
            "shards=1",
            "--set",
            "header_timeout_ms=1000",
            "--set",
            "shard_request_bytes_max=16777216",
        ],
    );
    let mut c = server.client();
    c.create_topic("big", 1).unwrap();
    let value = vec![b'v'; 1 << 20];
    for _ in 0..15 {
        c.produce("big", 0, batch_of(&[&value[..]]).unwrap())
            .unwrap();
    }
    // A fetch of ~15 MiB that the client never reads: more than the socket
    // buffers hold, so the server's write stalls.
    let mut slow = TcpStream::connect(&server.addr).unwrap();
    let mut frames = Vec::new();
    ringlog_protocol::wire::Request::Hello {
        version_min: 1,
        version_max: ringlog_protocol::wire::PROTOCOL_VERSION,
        client: "slow".into(),
    }
    .encode(1, &mut frames)
    .unwrap();
    ringlog_protocol::wire::Request::Fetch {
        topic: "big".into(),
        partition: 0,
        offset: 0,
        max_bytes: 16 << 20,
        wait_ms: 0,
    }
    .encode(2, &mut frames)
    .unwrap();
    slow.write_all(&frames).unwrap();
    std::thread::sleep(Duration::from_secs(3));
    assert!(metric(&server, "ringlog_write_timeouts_total") >= 1);
    // What it can still read ends early: the server gave up on the reply.
    slow.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut got = 0usize;
    let mut buf = vec![0u8; 1 << 16];
    loop {
        match slow.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("still open after reading {got} bytes: {e}"),
        }
    }
    assert!(got < 15 << 20, "read {got} bytes: the whole reply");
    // Its reply room (the whole 16 MiB budget) is free again.
    let page = c.fetch("big", 0, 0, 8 << 20, 0).unwrap();
    assert!(!page.batches.is_empty());
}
