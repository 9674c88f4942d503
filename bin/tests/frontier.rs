//! The durable frontier through the real server: after a SIGKILL, a byte
//! flipped inside an acknowledged batch is reported (the partition is
//! unavailable with a corruption error naming the segment), never taken for
//! a torn tail that would drop the acknowledged batches and hand their
//! offsets out again. The shard checkpoints an idle partition's frontier
//! record within a few ticks, so even the last acknowledged batch is below
//! the record.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use ringlog_protocol::wire::ErrorCode;
use ringlog_protocol::BatchView;

/// The active segment file of partition `index` of `topic` (the only `.log`
/// of its live generation while nothing rolled).
fn segment_file(data: &Path, topic: &str, index: u32) -> PathBuf {
    let partition = data.join("topics").join(topic).join(index.to_string());
    let mut logs = Vec::new();
    for generation in std::fs::read_dir(&partition).unwrap() {
        let generation = generation.unwrap().path();
        if !generation
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("gen-"))
        {
            continue;
        }
        for file in std::fs::read_dir(&generation).unwrap() {
            let file = file.unwrap().path();
            if file.extension().is_some_and(|e| e == "log") {
                logs.push(file);
            }
        }
    }
    assert_eq!(logs.len(), 1, "{logs:?}");
    logs.pop().unwrap()
}

/// The segment's own frontier contract: with the shard journal, replay would
/// rewrite the flipped bytes from the journal's copy before recovery reads
/// them, so these run with one fdatasync per partition.
const PARTITION_MODE: &[&str] = &["--set", "group_commit=partition"];

#[test]
fn sigkill_then_a_flipped_byte_in_the_last_acknowledged_batch_is_corruption() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut server = Server::start(&data, PARTITION_MODE);
    let mut c = server.client();
    create_topics(&mut c, &[("f", 1)]);
    let mut last_base = 0;
    for i in 0..10u8 {
        let value = vec![i; 300];
        let ack = c
            .produce("f", 0, ringlog_shard::client::batch_of(&[&value]).unwrap())
            .unwrap();
        last_base = ack.base_offset;
    }
    // Idle for many ticks: the shard checkpoints the frontier record.
    std::thread::sleep(Duration::from_millis(500));
    server.kill9();

    let segment = segment_file(&data, "f", 0);
    let mut bytes = std::fs::read(&segment).unwrap();
    let mut position = 0;
    let last = loop {
        let view = BatchView::parse(&bytes[position..]).expect("acknowledged batches parse");
        if view.header().base_offset == last_base {
            break position;
        }
        position += view.as_bytes().len();
    };
    let len = BatchView::parse(&bytes[last..]).unwrap().as_bytes().len();
    bytes[last + len - 10] ^= 0x01;
    std::fs::write(&segment, &bytes).unwrap();

    let server = Server::start(&data, PARTITION_MODE);
    let mut c = server.client();
    let err = c.fetch("f", 0, 0, 1 << 20, 0).unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::PartitionUnavailable), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("corruption") && msg.contains(&segment.display().to_string()),
        "{msg}"
    );
    // Nothing is acknowledged at an offset that held acknowledged data.
    let produced = c.produce("f", 0, ringlog_shard::client::batch_of(&[b"x"]).unwrap());
    assert!(produced.is_err(), "{produced:?}");
}
