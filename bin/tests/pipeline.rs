//! Pipelining on one connection, on the real binary: several requests in
//! flight (`requests_in_flight_max`), replies strictly in request order,
//! a failed request in the middle changes nothing for the others, and the
//! shard's byte budget still bounds what the pipelined requests hold.

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::*;
use ringlog_protocol::wire::{
    Body, ErrorCode, ProduceTarget, Reply, Request, FRAME_BYTES_MAX, PROTOCOL_VERSION,
};
use ringlog_shard::client::{batch_of, read_reply, records};

/// A raw connection that writes requests without waiting for replies.
struct Raw {
    stream: TcpStream,
    next_correlation: u32,
}

impl Raw {
    fn connect(server: &Server) -> Raw {
        let stream = TcpStream::connect(&server.addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let mut raw = Raw {
            stream,
            next_correlation: 1,
        };
        let c = raw.send(&Request::Hello {
            version_min: PROTOCOL_VERSION,
            version_max: PROTOCOL_VERSION,
            client: "pipeline-test".into(),
        });
        let hello = raw.recv();
        assert_eq!(hello.correlation, c);
        assert!(hello.result.is_ok(), "{:?}", hello.result);
        raw
    }

    /// Writes one request; returns its correlation.
    fn send(&mut self, req: &Request) -> u32 {
        let c = self.next_correlation;
        self.next_correlation += 1;
        let mut frame = Vec::new();
        req.encode(c, &mut frame).unwrap();
        self.stream.write_all(&frame).unwrap();
        c
    }

    fn recv(&mut self) -> Reply {
        read_reply(&mut self.stream, FRAME_BYTES_MAX).unwrap()
    }
}

fn produce(topic: &str, batch: Vec<u8>) -> Request {
    Request::Produce {
        topic: topic.into(),
        target: ProduceTarget::Partition(0),
        batch,
    }
}

fn fetch(topic: &str, offset: u64, max_bytes: u32, wait_ms: u32) -> Request {
    Request::Fetch {
        topic: topic.into(),
        partition: 0,
        offset,
        max_bytes,
        wait_ms,
    }
}

fn values_of(body: &Body) -> Vec<(u64, Vec<u8>)> {
    match body {
        Body::Fetched(f) => records(&f.batches)
            .unwrap()
            .into_iter()
            .map(|r| (r.offset, r.value))
            .collect(),
        other => panic!("not a fetch reply: {other:?}"),
    }
}

/// Batch `i` of the tests: 4 records naming it.
fn test_batch(i: usize) -> (Vec<Vec<u8>>, Vec<u8>) {
    let values: Vec<Vec<u8>> = (0..4).map(|r| value(0, i, r, 200)).collect();
    let refs: Vec<&[u8]> = values.iter().map(|v| &v[..]).collect();
    let batch = batch_of(&refs).unwrap();
    (values, batch)
}

/// N produces, each followed by a long-poll fetch of the partition's start,
/// all sent before any reply is read, behind a long-poll fetch of the
/// first offset: served one at a time, that first fetch would wait its
/// whole 20 s for data that is not read yet; pipelined, the produces behind
/// it answer it. Requests run concurrently (a fetch does not wait for the
/// produce ahead of it to be durable, as no fetch ever sees bytes that are
/// not), so each fetch checks the durable prefix it got, and a last fetch,
/// sent once every produce was acknowledged, checks all the bytes.
#[test]
fn pipelined_produces_and_fetches_come_back_in_order_with_their_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &[]);
    server.client().create_topic("t", 1).unwrap();
    let mut raw = Raw::connect(&server);
    const N: usize = 6;
    let written: Vec<(u64, Vec<u8>)> = (0..N)
        .flat_map(|i| {
            let values = test_batch(i).0;
            (0..4).map(move |r| ((4 * i + r) as u64, values[r].clone()))
        })
        .collect();
    let started = Instant::now();
    let first = raw.send(&fetch("t", 0, 1 << 20, 20_000));
    let mut sent = Vec::new();
    for i in 0..N {
        let p = raw.send(&produce("t", test_batch(i).1));
        let f = raw.send(&fetch("t", 0, 1 << 20, 20_000));
        sent.push((p, f));
    }
    let head = raw.recv();
    assert_eq!(head.correlation, first);
    let got = values_of(&head.result.unwrap());
    assert!(!got.is_empty());
    assert_eq!(got, written[..got.len()], "first fetch bytes");
    for (i, (p, f)) in sent.into_iter().enumerate() {
        let ack = raw.recv();
        assert_eq!(ack.correlation, p, "reply out of request order");
        match ack.result {
            Ok(Body::Produced(a)) => {
                assert_eq!(a.base_offset, 4 * i as u64, "batch {i} out of order");
                assert_eq!(a.next_offset, 4 * i as u64 + 4);
            }
            other => panic!("produce {i}: {other:?}"),
        }
        let page = raw.recv();
        assert_eq!(page.correlation, f, "reply out of request order");
        let got = values_of(&page.result.unwrap());
        assert!(!got.is_empty());
        assert_eq!(got, written[..got.len()], "fetch {i} bytes");
    }
    let last = raw.send(&fetch("t", 0, 1 << 20, 0));
    let page = raw.recv();
    assert_eq!(page.correlation, last);
    assert_eq!(values_of(&page.result.unwrap()), written, "all bytes");
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(10),
        "took {took:?}: the first fetch waited for produces behind it"
    );
}

/// With `requests_in_flight_max = 4`, four long-poll fetches fill the
/// connection: the produce behind them is not read until a reply is
/// written, so the fetches wait their whole time and come back empty.
/// Three fetches leave room: the produce is read at once and answers them.
#[test]
fn the_server_stops_reading_at_requests_in_flight_max() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(
        &dir.path().join("data"),
        &["--set", "requests_in_flight_max=4"],
    );
    let mut c = server.client();
    c.create_topic("full", 1).unwrap();
    c.create_topic("room", 1).unwrap();
    const WAIT_MS: u32 = 1500;
    for (topic, fetches) in [("full", 4usize), ("room", 3)] {
        let mut raw = Raw::connect(&server);
        let started = Instant::now();
        let ids: Vec<u32> = (0..fetches)
            .map(|_| raw.send(&fetch(topic, 0, 1 << 20, WAIT_MS)))
            .collect();
        let p = raw.send(&produce(topic, test_batch(0).1));
        for (n, id) in ids.into_iter().enumerate() {
            let r = raw.recv();
            assert_eq!(r.correlation, id);
            let got = values_of(&r.result.unwrap());
            if topic == "room" {
                assert_eq!(got.len(), 4, "the produce was not read within the bound");
            } else if n == 0 {
                // The others may time out after the produce was read.
                assert!(got.is_empty(), "the produce was read past the bound");
                assert!(started.elapsed() >= Duration::from_millis(u64::from(WAIT_MS) - 100));
            }
        }
        let ack = raw.recv();
        assert_eq!(ack.correlation, p);
        assert!(
            matches!(ack.result, Ok(Body::Produced(_))),
            "{:?}",
            ack.result
        );
        if topic == "room" {
            assert!(started.elapsed() < Duration::from_millis(u64::from(WAIT_MS)));
        }
    }
}

/// Errors in the middle of a pipeline (unknown topic, a batch with bad
/// bytes) are answered in their place; the requests around them succeed.
#[test]
fn a_failed_request_in_the_middle_neither_reorders_nor_loses_replies() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &[]);
    server.client().create_topic("t", 1).unwrap();
    let mut raw = Raw::connect(&server);
    let (v0, b0) = test_batch(0);
    let (v1, b1) = test_batch(1);
    let mut bad = b1.clone();
    let last = bad.len() - 1;
    bad[last] ^= 0x40; // the body checksum no longer matches
    let ids = [
        raw.send(&produce("t", b0)),
        raw.send(&produce("nope", test_batch(9).1)),
        raw.send(&produce("t", bad)),
        raw.send(&produce("t", b1)),
        raw.send(&fetch("t", 0, 1 << 20, 5_000)),
    ];
    let replies: Vec<Reply> = ids.iter().map(|_| raw.recv()).collect();
    let got: Vec<u32> = replies.iter().map(|r| r.correlation).collect();
    assert_eq!(got, ids, "replies out of request order");
    assert!(matches!(replies[0].result, Ok(Body::Produced(ref a)) if a.base_offset == 0));
    assert!(matches!(
        replies[1].result,
        Err((ErrorCode::UnknownTopic, _))
    ));
    assert!(
        matches!(replies[2].result, Err((ErrorCode::InvalidBatch, _))),
        "{:?}",
        replies[2].result
    );
    assert!(matches!(replies[3].result, Ok(Body::Produced(ref a)) if a.base_offset == 4));
    // The pipelined fetch ran beside the produces: it got a durable prefix.
    let written = [v0, v1].concat();
    let page = values_of(replies[4].result.as_ref().unwrap());
    let values: Vec<Vec<u8>> = page.into_iter().map(|(_, v)| v).collect();
    assert!(!values.is_empty());
    assert_eq!(values, written[..values.len()], "fetched bytes");
    let f = raw.send(&fetch("t", 0, 1 << 20, 0));
    let all = raw.recv();
    assert_eq!(all.correlation, f);
    let values: Vec<Vec<u8>> = values_of(&all.result.unwrap())
        .into_iter()
        .map(|(_, v)| v)
        .collect();
    assert_eq!(values, written, "fetched bytes");
}

/// Pipelined requests take the shard's byte budget as before: with room
/// for two fetch replies of 1 MiB, the third and fourth pipelined fetch get
/// Backpressure (answered in their place, after the first two), and the
/// budget is whole again once the replies are written.
#[test]
fn pipelined_requests_stay_within_the_shard_byte_budget() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(
        &dir.path().join("data"),
        &[
            "--set",
            "shards=1",
            "--set",
            "frame_bytes_max=1048576",
            "--set",
            "shard_request_bytes_max=2621440",
            "--set",
            "requests_in_flight_max=8",
        ],
    );
    server.client().create_topic("t", 1).unwrap();
    let mut raw = Raw::connect(&server);
    let ids: Vec<u32> = (0..4)
        .map(|_| raw.send(&fetch("t", 0, 1 << 20, 1000)))
        .collect();
    let replies: Vec<Reply> = ids.iter().map(|_| raw.recv()).collect();
    let got: Vec<u32> = replies.iter().map(|r| r.correlation).collect();
    assert_eq!(got, ids, "replies out of request order");
    assert!(values_of(replies[0].result.as_ref().unwrap()).is_empty());
    assert!(values_of(replies[1].result.as_ref().unwrap()).is_empty());
    for r in &replies[2..] {
        assert!(
            matches!(r.result, Err((ErrorCode::Backpressure, _))),
            "{:?}",
            r.result
        );
    }
    let p = raw.send(&produce("t", test_batch(0).1));
    let ack = raw.recv();
    assert_eq!(ack.correlation, p);
    assert!(ack.result.is_ok(), "{:?}", ack.result);
    let f = raw.send(&fetch("t", 0, 1 << 20, 0));
    let page = raw.recv();
    assert_eq!(page.correlation, f);
    assert_eq!(values_of(page.result.as_ref().unwrap()).len(), 4);
}
