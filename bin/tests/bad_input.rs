//! Bad input on every surface gets a clear error and the server keeps
//! serving: control socket, client port, config.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::process::Command;
use std::time::Duration;

use common::*;
use ringlog_protocol::wire::{
    encode_frame, ErrorCode, Opcode, ProduceTarget, Request, FRAME_HEADER_LEN, PROTOCOL_VERSION,
    WIRE_MAGIC,
};
use ringlog_shard::client::{read_reply, Client};

fn ctl_line(
    stream: &mut UnixStream,
    reader: &mut BufReader<UnixStream>,
    line: &[u8],
) -> serde_json::Value {
    stream.write_all(line).unwrap();
    stream.write_all(b"\n").unwrap();
    let mut reply = String::new();
    reader.read_line(&mut reply).unwrap();
    serde_json::from_str(&reply).unwrap_or_else(|e| panic!("{e}: {reply:?}"))
}

#[test]
fn control_socket_rejects_bad_lines_and_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &[]);
    let mode = std::fs::metadata(&server.control)
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "control socket mode");
    let mut s = UnixStream::connect(&server.control).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());

    let v = ctl_line(&mut s, &mut r, b"{\"cmd\": \"status\",");
    assert_eq!(v["ok"], false);
    assert!(
        v["error"].as_str().unwrap().contains("malformed JSON"),
        "{v}"
    );

    let v = ctl_line(&mut s, &mut r, br#"{"cmd":"frobnicate"}"#);
    assert_eq!(v["ok"], false);
    assert!(
        v["error"].as_str().unwrap().contains("unknown command"),
        "{v}"
    );

    let v = ctl_line(&mut s, &mut r, br#"{"cmd":"purge"}"#);
    assert_eq!(v["ok"], false);
    assert!(v["error"].as_str().unwrap().contains("topic"), "{v}");

    let huge = vec![b'x'; 10 * 1024 * 1024];
    let v = ctl_line(&mut s, &mut r, &huge);
    assert_eq!(v["ok"], false);
    assert!(
        v["error"].as_str().unwrap().contains("exceeds the limit"),
        "{v}"
    );

    // Same connection still works, and so do new ones.
    let v = ctl_line(&mut s, &mut r, br#"{"cmd":"status"}"#);
    assert_eq!(v["ok"], true, "{v}");
    assert_eq!(v["result"]["node"]["shards"], 2);
    let v = server.ctl(&["topics"]);
    assert_eq!(v["ok"], true);
    let v = server.ctl(&["log-level", "debug"]);
    assert_eq!(v["ok"], true, "{v}");
    let v = server.ctl(&["log-level", "=[bad"]);
    assert_eq!(v["ok"], false, "{v}");
}

fn raw_stream(server: &Server) -> TcpStream {
    let s = TcpStream::connect(&server.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s
}

fn hello_frame(version_min: u16, version_max: u16) -> Vec<u8> {
    let mut f = Vec::new();
    Request::Hello {
        version_min,
        version_max,
        client: "test".into(),
    }
    .encode(1, &mut f)
    .unwrap();
    f
}

/// After an error that closes the connection, the next read sees EOF.
fn assert_closed(s: &mut TcpStream) {
    let mut buf = [0u8; 1];
    match s.read(&mut buf) {
        Ok(0) => {}
        Ok(_) => panic!("connection still sends data"),
        Err(e) => assert!(
            matches!(
                e.kind(),
                std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
            ),
            "{e}"
        ),
    }
}

#[test]
fn bad_frames_get_errors_and_the_server_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(
        &dir.path().join("data"),
        &["--set", "frame_bytes_max=65536"],
    );
    let mut c = server.client();
    c.create_topic("ok", 1).unwrap();

    // Wrong version: error, then closed.
    let mut s = raw_stream(&server);
    s.write_all(&hello_frame(PROTOCOL_VERSION + 5, PROTOCOL_VERSION + 9))
        .unwrap();
    let r = read_reply(&mut s, 1 << 20).unwrap();
    assert_eq!(r.result.unwrap_err().0, ErrorCode::UnsupportedVersion);
    assert_closed(&mut s);

    // No handshake first.
    let mut s = raw_stream(&server);
    let mut f = Vec::new();
    Request::ListTopics.encode(3, &mut f).unwrap();
    s.write_all(&f).unwrap();
    let r = read_reply(&mut s, 1 << 20).unwrap();
    assert_eq!(r.result.unwrap_err().0, ErrorCode::HandshakeRequired);
    assert_closed(&mut s);

    // Bad checksum: error, then closed.
    let mut s = raw_stream(&server);
    let mut f = hello_frame(1, 1);
    let last = f.len() - 1;
    f[last] ^= 0x40;
    s.write_all(&f).unwrap();
    let r = read_reply(&mut s, 1 << 20).unwrap();
    assert_eq!(r.result.unwrap_err().0, ErrorCode::BadChecksum);
    assert_closed(&mut s);

    // Oversized frame: rejected from the header alone, then closed.
    let mut s = raw_stream(&server);
    let mut head = Vec::new();
    head.extend_from_slice(&(10u32 * 1024 * 1024).to_le_bytes());
    head.extend_from_slice(&0u64.to_le_bytes());
    s.write_all(&head).unwrap();
    let r = read_reply(&mut s, 1 << 20).unwrap();
    let (code, msg) = r.result.unwrap_err();
    assert_eq!(code, ErrorCode::FrameTooLarge, "{msg}");
    assert_closed(&mut s);

    // Unknown command on a greeted connection: error, connection stays open.
    let mut c2 = server.client();
    let mut body = Vec::new();
    body.extend_from_slice(&0x0777u16.to_le_bytes());
    body.extend_from_slice(&0u16.to_le_bytes());
    body.extend_from_slice(&42u32.to_le_bytes());
    let mut f = Vec::new();
    encode_frame(&body, &mut f);
    c2.send_raw(&f).unwrap();
    let r = c2.read_reply().unwrap();
    assert_eq!(r.correlation, 42);
    assert_eq!(r.result.unwrap_err().0, ErrorCode::UnknownCommand);
    // Malformed payload (truncated produce): error, still open.
    let mut body = Vec::new();
    body.extend_from_slice(&(Opcode::Produce as u16).to_le_bytes());
    body.extend_from_slice(&0u16.to_le_bytes());
    body.extend_from_slice(&43u32.to_le_bytes());
    body.extend_from_slice(&[2, 0, b'o']);
    let mut f = Vec::new();
    encode_frame(&body, &mut f);
    c2.send_raw(&f).unwrap();
    let r = c2.read_reply().unwrap();
    assert_eq!(r.result.unwrap_err().0, ErrorCode::Malformed);
    // A corrupted record batch inside a valid frame: InvalidBatch.
    let mut batch = ringlog_shard::client::batch_of(&[b"hello"]).unwrap();
    let last = batch.len() - 1;
    batch[last] ^= 1;
    let err = c2.produce("ok", 0, batch).unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::InvalidBatch), "{err}");
    let err = c2
        .produce(
            "missing",
            0,
            ringlog_shard::client::batch_of(&[b"x"]).unwrap(),
        )
        .unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::UnknownTopic));
    let err = c2
        .produce("ok", 9, ringlog_shard::client::batch_of(&[b"x"]).unwrap())
        .unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::UnknownPartition));
    let err = c2.create_topic("bad/name", 1).unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::InvalidTopic));
    let err = c2.create_topic("ok", 1).unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::TopicExists));
    let err = c2.fetch("ok", 0, 99, 1024, 0).unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::OffsetOutOfRange));

    // The same connection and a fresh one still work.
    let ack = c2
        .produce(
            "ok",
            0,
            ringlog_shard::client::batch_of(&[b"fine"]).unwrap(),
        )
        .unwrap();
    assert_eq!(ack.base_offset, 0);
    let mut c3 = Client::connect(&server.addr).unwrap();
    let page = c3.fetch("ok", 0, 0, 1 << 16, 0).unwrap();
    let recs = ringlog_shard::client::records(&page.batches).unwrap();
    assert_eq!(recs.len(), 1);
    assert_eq!(recs[0].value, b"fine");
    let _ = (FRAME_HEADER_LEN, WIRE_MAGIC);
}

/// A Produce frame as a client encodes it and where its batch starts.
fn produce_frame(topic: &str, batch: Vec<u8>) -> (Vec<u8>, usize) {
    let len = batch.len();
    let mut f = Vec::new();
    Request::Produce {
        topic: topic.into(),
        target: ProduceTarget::Partition(0),
        batch,
    }
    .encode(77, &mut f)
    .unwrap();
    let start = f.len() - len;
    (f, start)
}

#[test]
fn a_bit_flipped_in_a_produce_in_flight_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &[]);
    let mut c = server.client();
    c.create_topic("flip", 1).unwrap();
    let batch = ringlog_shard::client::batch_of(&[&[7u8; 3000][..], b"tail"]).unwrap();
    // In the batch (header, body, last byte): the frame checksum leaves it
    // to the batch's own checksums, which the server checks before storing;
    // the request is refused and the connection stays open.
    for at in [0, 9, 40, 100, batch.len() - 1] {
        let (mut f, start) = produce_frame("flip", batch.clone());
        f[start + at] ^= 0x04;
        c.send_raw(&f).unwrap();
        let r = c.read_reply().unwrap();
        assert_eq!(r.correlation, 77);
        let (code, message) = r.result.unwrap_err();
        assert_eq!(code, ErrorCode::InvalidBatch, "flip at {at}: {message}");
    }
    // In the head (the topic): the frame checksum fails, and the
    // connection closes (its framing cannot be trusted).
    let mut s = raw_stream(&server);
    s.write_all(&hello_frame(PROTOCOL_VERSION, PROTOCOL_VERSION))
        .unwrap();
    read_reply(&mut s, 1 << 20).unwrap().result.unwrap();
    let (mut f, _) = produce_frame("flip", batch.clone());
    f[FRAME_HEADER_LEN + 11] ^= 0x01;
    s.write_all(&f).unwrap();
    let r = read_reply(&mut s, 1 << 20).unwrap();
    assert_eq!(r.result.unwrap_err().0, ErrorCode::BadChecksum);
    assert_closed(&mut s);
    // Nothing of them was stored; the intact batch is, on the same connection.
    let ack = c.produce("flip", 0, batch).unwrap();
    assert_eq!(ack.base_offset, 0);
    let page = c.fetch("flip", 0, 0, 1 << 16, 0).unwrap();
    let recs = ringlog_shard::client::records(&page.batches).unwrap();
    assert_eq!(recs.len(), 2);
    assert_eq!(recs[1].value, b"tail");
}

#[test]
fn long_poll_fetch_waits_for_new_data() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &[]);
    let mut c = server.client();
    c.create_topic("lp", 2).unwrap();
    // Times out empty.
    let t = std::time::Instant::now();
    let page = c.fetch("lp", 1, 0, 1 << 16, 300).unwrap();
    assert!(page.batches.is_empty());
    assert!(
        t.elapsed() >= Duration::from_millis(250),
        "{:?}",
        t.elapsed()
    );
    // Woken by a produce.
    let addr = server.addr.clone();
    let h = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        let mut p = Client::connect(&addr).unwrap();
        p.produce(
            "lp",
            1,
            ringlog_shard::client::batch_of(&[b"late"]).unwrap(),
        )
        .unwrap();
    });
    let t = std::time::Instant::now();
    let page = c.fetch("lp", 1, 0, 1 << 16, 10_000).unwrap();
    assert!(t.elapsed() < Duration::from_secs(5));
    let recs = ringlog_shard::client::records(&page.batches).unwrap();
    assert_eq!(recs[0].value, b"late");
    h.join().unwrap();
}

#[test]
fn bad_config_names_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("ringlog.toml");
    for (text, key) in [
        ("shards = \"lots\"\n", "shards"),
        ("segmnet_size_bytes = 4096\n", "segmnet_size_bytes"),
        ("segment_size_bytes = 1000\n", "segment_size_bytes"),
    ] {
        std::fs::write(&cfg, text).unwrap();
        let out = Command::new(BIN)
            .args(["server", "--config"])
            .arg(&cfg)
            .arg("--data-dir")
            .arg(dir.path().join("d"))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains(&format!("`{key}`")), "{text:?}: {err}");
    }
    let out = Command::new(BIN)
        .args(["server", "--data-dir"])
        .arg(dir.path().join("d"))
        .env("RINGLOG_MAILBOX_CAPACITY", "zero")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("mailbox_capacity") && err.contains("RINGLOG_MAILBOX_CAPACITY"),
        "{err}"
    );
}
