//! Round trips, and every truncation, bit flip and oversize is rejected.

use super::*;
use crate::checksum::checksum;

fn requests() -> Vec<Request> {
    vec![
        Request::Hello {
            version_min: 1,
            version_max: 3,
            client: "test".into(),
        },
        Request::CreateTopic {
            topic: "orders".into(),
            partitions: 8,
        },
        Request::DeleteTopic { topic: "a".into() },
        Request::ListTopics,
        Request::DescribeTopic {
            topic: "x.y-z_1".into(),
        },
        Request::Produce {
            topic: "t".into(),
            target: ProduceTarget::Partition(3),
            batch: vec![1, 2, 3, 4],
        },
        Request::Produce {
            topic: "t".into(),
            target: ProduceTarget::Key(b"user-7".to_vec()),
            batch: vec![9; 100],
        },
        Request::Fetch {
            topic: "t".into(),
            partition: 2,
            offset: u64::MAX - 1,
            max_bytes: 1 << 20,
            wait_ms: 500,
        },
        Request::Purge {
            topic: "t".into(),
            partition: 0,
        },
        Request::Replicas,
    ]
}

fn replica(vsr: Option<ReplicaVsr>, fault: Option<&str>) -> ReplicaInfo {
    ReplicaInfo {
        topic: "t".into(),
        partition: 2,
        partition_id: 9,
        shard: 1,
        role: "backup".into(),
        log_start_offset: 3,
        frontier: 40,
        commit: 38,
        size_bytes: 1 << 20,
        sealed_segments: 2,
        purge_generation: 1,
        fault: fault.map(str::to_string),
        vsr,
    }
}

fn replies() -> Vec<Reply> {
    vec![
        Reply::ok(
            Opcode::Hello,
            1,
            Body::Hello(HelloReply {
                version: 1,
                frame_bytes_max: 1 << 24,
                batch_bytes_max: 1 << 22,
                shards: 2,
            }),
        ),
        Reply::ok(Opcode::CreateTopic, 2, Body::Empty),
        Reply::ok(
            Opcode::ListTopics,
            3,
            Body::Topics(vec![TopicSummary {
                topic: "a".into(),
                partitions: 4,
            }]),
        ),
        Reply::ok(
            Opcode::DescribeTopic,
            4,
            Body::Topic(TopicDescription {
                topic: "a".into(),
                partitions: vec![PartitionInfo {
                    partition: 0,
                    partition_id: 7,
                    shard: 1,
                    log_start_offset: 5,
                    high_watermark: 10,
                    size_bytes: 4096,
                    fenced: true,
                }],
            }),
        ),
        Reply::ok(
            Opcode::Produce,
            5,
            Body::Produced(ProduceReply {
                partition: 1,
                base_offset: 10,
                next_offset: 20,
            }),
        ),
        Reply::ok(
            Opcode::Fetch,
            6,
            Body::Fetched(FetchReply {
                partition: 1,
                next_offset: 20,
                log_start_offset: 0,
                high_watermark: 20,
                batches: vec![7; 33],
            }),
        ),
        Reply::ok(
            Opcode::Replicas,
            9,
            Body::Replicas(ReplicaList {
                rows: vec![
                    replica(None, Some("fsync failed")),
                    replica(
                        Some(ReplicaVsr {
                            view: 4,
                            op: 12,
                            commit_op: 11,
                            commit_max: 12,
                        }),
                        None,
                    ),
                ],
                omitted: 3,
            }),
        ),
        Reply::error(99, 7, ErrorCode::UnknownCommand, "unknown opcode 99"),
        Reply::error(6, 8, ErrorCode::Backpressure, "mailbox full"),
    ]
}

/// Splits a frame into header and verified body.
fn open(frame: &[u8]) -> Result<&[u8], WireError> {
    let mut head = [0u8; FRAME_HEADER_LEN];
    head.copy_from_slice(frame.get(..FRAME_HEADER_LEN).ok_or(WireError::Truncated {
        what: "frame header",
    })?);
    let h = decode_frame_header(&head, FRAME_BYTES_MAX)?;
    let body = &frame[FRAME_HEADER_LEN..];
    if body.len() != h.body_len as usize {
        return Err(WireError::Truncated { what: "frame body" });
    }
    h.verify_request(body)?;
    Ok(body)
}

/// A real record batch (the requests' other batches are opaque bytes).
fn record_batch() -> Vec<u8> {
    let mut b = crate::BatchBuilder::new(0);
    for value in [&b"alpha"[..], b"beta", b"gamma"] {
        b.push(&crate::Record {
            key: b"k",
            headers: &[],
            value,
            timestamp_ms: 7,
        })
        .unwrap();
    }
    b.finish(&crate::Stamp::default()).unwrap()
}

/// Where a request's frame checksum stops covering (the whole frame but a
/// Produce's batch).
fn covered_end(req: &Request, frame: &[u8]) -> usize {
    match req {
        Request::Produce { batch, .. } => frame.len() - batch.len(),
        _ => frame.len(),
    }
}

#[test]
fn requests_round_trip() {
    for (i, req) in requests().into_iter().enumerate() {
        let mut frame = Vec::new();
        req.encode(i as u32, &mut frame).unwrap();
        let body = open(&frame).unwrap();
        let (corr, op, decoded) = Request::decode(body);
        assert_eq!(corr, i as u32);
        assert_eq!(op, req.opcode() as u16);
        assert_eq!(decoded.unwrap(), req);
    }
}

#[test]
fn replies_round_trip() {
    for reply in replies() {
        let mut frame = Vec::new();
        reply.encode(&mut frame).unwrap();
        let decoded = Reply::decode(open(&frame).unwrap()).unwrap();
        assert_eq!(decoded, reply);
    }
}

#[test]
fn every_truncation_of_a_body_is_rejected() {
    for req in requests() {
        let mut frame = Vec::new();
        req.encode(1, &mut frame).unwrap();
        let body = &frame[FRAME_HEADER_LEN..];
        for cut in 0..body.len() {
            let (_, _, r) = Request::decode(&body[..cut]);
            assert!(r.is_err(), "{req:?} cut at {cut} decoded");
        }
    }
    for reply in replies() {
        let mut frame = Vec::new();
        reply.encode(&mut frame).unwrap();
        let body = &frame[FRAME_HEADER_LEN..];
        for cut in 0..body.len() {
            assert!(Reply::decode(&body[..cut]).is_err());
        }
    }
}

#[test]
fn every_bit_flip_fails_the_frame_checksum() {
    for req in requests() {
        let mut frame = Vec::new();
        req.encode(1, &mut frame).unwrap();
        for byte in FRAME_HEADER_LEN..covered_end(&req, &frame) {
            for bit in 0..8 {
                let mut bad = frame.clone();
                bad[byte] ^= 1 << bit;
                assert!(
                    matches!(open(&bad), Err(WireError::BadChecksum { .. })),
                    "flip at {byte}.{bit} passed"
                );
            }
        }
    }
}

#[test]
fn every_bit_flip_in_a_produced_batch_fails_the_batch_checksums() {
    let batch = record_batch();
    let req = Request::Produce {
        topic: "t".into(),
        target: ProduceTarget::Key(b"user".to_vec()),
        batch: batch.clone(),
    };
    let mut frame = Vec::new();
    req.encode(4, &mut frame).unwrap();
    let start = covered_end(&req, &frame);
    assert_eq!(&frame[start..], &batch[..]);
    for byte in start..frame.len() {
        for bit in 0..8 {
            let mut bad = frame.clone();
            bad[byte] ^= 1 << bit;
            // The frame checksum leaves the batch to its own checksums.
            let body = open(&bad).unwrap();
            let (_, _, decoded) = Request::decode(body);
            let Ok(Request::Produce { batch: got, .. }) = decoded else {
                panic!("flip at {byte}.{bit}: {decoded:?}");
            };
            assert!(
                crate::BatchView::parse(&got).is_err(),
                "flip at {byte}.{bit} passed the batch checks"
            );
        }
    }
}

#[test]
fn split_request_finds_a_produce_head_and_nothing_else() {
    let reqs = [
        Request::Produce {
            topic: "orders".into(),
            target: ProduceTarget::Partition(3),
            batch: record_batch(),
        },
        Request::Produce {
            topic: "t".into(),
            target: ProduceTarget::Key(vec![5; KEY_BYTES_MAX]),
            batch: vec![1, 2, 3],
        },
    ];
    for req in reqs {
        let mut frame = Vec::new();
        req.encode(9, &mut frame).unwrap();
        let body = &frame[FRAME_HEADER_LEN..];
        let head_len = covered_end(&req, &frame) - FRAME_HEADER_LEN;
        assert!(head_len <= PRODUCE_HEAD_BYTES_MAX);
        for cut in 0..head_len {
            assert_eq!(
                split_request(&body[..cut]),
                RequestSplit::NeedMore,
                "cut {cut}"
            );
        }
        let Request::Produce {
            topic,
            target,
            batch,
        } = &req
        else {
            unreachable!()
        };
        let expected = RequestSplit::Produce(ProduceHead {
            correlation: 9,
            topic: topic.clone(),
            target: target.clone(),
            batch_len: batch.len() as u32,
            head_len,
        });
        assert_eq!(split_request(&body[..head_len]), expected);
        assert_eq!(split_request(body), expected);
    }
    // Not a produce, or a produce head that does not decode: whole body.
    let mut frame = Vec::new();
    Request::ListTopics.encode(1, &mut frame).unwrap();
    assert_eq!(
        split_request(&frame[FRAME_HEADER_LEN..]),
        RequestSplit::Whole
    );
    let mut body = Vec::new();
    body.extend_from_slice(&(Opcode::Produce as u16).to_le_bytes());
    body.extend_from_slice(&[0, 0, 1, 0, 0, 0, 1, 0, b't', 7]);
    assert_eq!(split_request(&body), RequestSplit::Whole, "bad target");
}

#[test]
fn trailing_bytes_and_unknown_opcodes_are_rejected() {
    let mut frame = Vec::new();
    Request::ListTopics.encode(5, &mut frame).unwrap();
    let mut body = frame[FRAME_HEADER_LEN..].to_vec();
    body.push(0);
    let (corr, _, r) = Request::decode(&body);
    assert_eq!(corr, 5);
    assert!(matches!(r, Err(WireError::TrailingBytes { .. })));

    let mut body = frame[FRAME_HEADER_LEN..].to_vec();
    body[0] = 0x77;
    let (corr, op, r) = Request::decode(&body);
    assert_eq!((corr, op), (5, 0x77));
    let err = r.unwrap_err();
    assert_eq!(err.code(), ErrorCode::UnknownCommand);
}

#[test]
fn oversized_frame_header_is_rejected_before_allocation() {
    let mut head = [0u8; FRAME_HEADER_LEN];
    head[..4].copy_from_slice(&(1025u32).to_le_bytes());
    let err = decode_frame_header(&head, 1024).unwrap_err();
    assert_eq!(err.code(), ErrorCode::FrameTooLarge);
    head[..4].copy_from_slice(&(1024u32).to_le_bytes());
    assert!(decode_frame_header(&head, 1024).is_ok());
}

#[test]
fn bad_hello_magic_and_huge_counts_are_rejected() {
    let mut body = Vec::new();
    body.extend_from_slice(&(Opcode::Hello as u16).to_le_bytes());
    body.extend_from_slice(&0u16.to_le_bytes());
    body.extend_from_slice(&1u32.to_le_bytes());
    body.extend_from_slice(&0xdead_beefu32.to_le_bytes());
    body.extend_from_slice(&[1, 0, 1, 0, 0, 0]);
    let (_, _, r) = Request::decode(&body);
    assert!(matches!(r, Err(WireError::BadMagic(_))));

    // A ListTopics reply claiming 4 billion entries in 12 bytes.
    let mut body = Vec::new();
    body.extend_from_slice(&(Opcode::ListTopics as u16 | RESPONSE_BIT).to_le_bytes());
    body.extend_from_slice(&0u16.to_le_bytes());
    body.extend_from_slice(&1u32.to_le_bytes());
    body.extend_from_slice(&u32::MAX.to_le_bytes());
    assert!(Reply::decode(&body).is_err());
    let _ = checksum(&body);
}

#[test]
fn topic_names_and_key_routing() {
    assert!(valid_topic_name("orders.v1-eu_2"));
    for bad in ["", ".", "..", "a/b", "a b", "é"] {
        assert!(!valid_topic_name(bad), "{bad:?}");
    }
    assert!(!valid_topic_name(&"x".repeat(TOPIC_NAME_BYTES_MAX + 1)));
    for n in 1..20 {
        assert!(partition_for_key(b"k", n) < n);
    }
    assert_eq!(partition_for_key(b"abc", 7), partition_for_key(b"abc", 7));
    assert!(ErrorCode::Backpressure.is_retryable());
    assert!(ErrorCode::DiskFull.is_retryable());
    assert!(!ErrorCode::PartitionFenced.is_retryable());
    assert_eq!(ErrorCode::DiskFull.to_string(), "disk_full");
    for code in 0..=22 {
        assert_eq!(ErrorCode::from_u16(code).unwrap() as u16, code);
    }
    assert!(ErrorCode::from_u16(23).is_none());
}

#[test]
fn a_fetch_head_then_its_batches_is_the_encoded_reply() {
    for len in [0usize, 1, 33, 240, 4096, 1 << 20] {
        let f = FetchReply {
            partition: 3,
            next_offset: 1 << 40,
            log_start_offset: 7,
            high_watermark: u64::MAX,
            batches: (0..len).map(|i| (i * 31 + 5) as u8).collect(),
        };
        let mut want = Vec::new();
        Reply::ok(Opcode::Fetch, 77, Body::Fetched(f.clone()))
            .encode(&mut want)
            .unwrap();
        let head = Reply::encode_fetch_head(77, &f).unwrap();
        let mut got = head.to_vec();
        got.extend_from_slice(&f.batches);
        assert_eq!(got, want, "{len} bytes of batches");
        let decoded = Reply::decode(open(&got).unwrap()).unwrap();
        assert_eq!(decoded.result, Ok(Body::Fetched(f)));
    }
}

/// The body of an Ok Replicas reply declaring `n` rows, then `rest`.
fn replicas_body(n: u32, rest: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&(Opcode::Replicas as u16 | RESPONSE_BIT).to_le_bytes());
    body.extend_from_slice(&0u16.to_le_bytes());
    body.extend_from_slice(&1u32.to_le_bytes());
    body.extend_from_slice(&n.to_le_bytes());
    body.extend_from_slice(&0u32.to_le_bytes());
    body.extend_from_slice(rest);
    body
}

#[test]
fn a_replicas_reply_count_is_bounded_before_anything_is_allocated() {
    // More rows than the cap, and more than the bytes could hold: both
    // refused from the count alone.
    let over = Reply::decode(&replicas_body(REPLICA_ROWS_MAX + 1, &[]));
    assert!(
        matches!(
            over,
            Err(WireError::TooLong {
                what: "replicas",
                ..
            })
        ),
        "{over:?}"
    );
    let short = Reply::decode(&replicas_body(1000, &[0; 64]));
    assert!(
        matches!(short, Err(WireError::Truncated { what: "replicas" })),
        "{short:?}"
    );
    // A server refuses to encode more than the cap.
    let rows = vec![replica(None, None); REPLICA_ROWS_MAX as usize + 1];
    let mut out = Vec::new();
    let e = Reply::ok(
        Opcode::Replicas,
        1,
        Body::Replicas(ReplicaList { rows, omitted: 0 }),
    )
    .encode(&mut out)
    .unwrap_err();
    assert!(
        matches!(
            e,
            WireError::TooLong {
                what: "replicas",
                ..
            }
        ),
        "{e:?}"
    );
}

#[test]
fn a_replica_row_with_a_flag_other_than_0_or_1_is_refused_and_a_long_fault_is_cut() {
    let reply = Reply::ok(
        Opcode::Replicas,
        1,
        Body::Replicas(ReplicaList {
            rows: vec![replica(None, Some(&"é".repeat(FAULT_BYTES_MAX)))],
            omitted: 0,
        }),
    );
    let mut frame = Vec::new();
    reply.encode(&mut frame).unwrap();
    let body = &frame[FRAME_HEADER_LEN..];
    let Ok(Reply {
        result: Ok(Body::Replicas(list)),
        ..
    }) = Reply::decode(body)
    else {
        panic!("a long fault must encode, cut");
    };
    let fault = list.rows[0].fault.as_deref().unwrap();
    assert!(fault.len() <= FAULT_BYTES_MAX && fault.len() > FAULT_BYTES_MAX - 2);
    assert!(body.len() - 16 <= REPLICA_ROW_BYTES_MAX);
    // The last byte is the row's "replicated" flag.
    let mut bad = body.to_vec();
    *bad.last_mut().unwrap() = 2;
    let e = Reply::decode(&bad).unwrap_err();
    assert!(
        matches!(
            e,
            WireError::BadValue {
                what: "vsr",
                value: 2
            }
        ),
        "{e:?}"
    );
}
