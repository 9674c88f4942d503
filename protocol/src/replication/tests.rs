use super::*;
use crate::batch::{BatchBuilder, Record, Stamp};

const ENV: Envelope = Envelope {
    cluster_id: 0x0123_4567_89ab_cdef_0011_2233_4455_6677,
    partition_id: 5,
    replica: 2,
    view: 7,
};

fn batch(op: u64, view: u32, base_offset: u64, prev_checksum: u64) -> Vec<u8> {
    let mut b = BatchBuilder::new(ENV.partition_id);
    b.push(&Record {
        key: b"k",
        headers: &[],
        value: b"value",
        timestamp_ms: 10,
    })
    .expect("push");
    b.finish(&Stamp {
        base_offset,
        vsr_op: op,
        vsr_view: view,
        prev_checksum,
    })
    .expect("finish")
}

fn encode(body: Body<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    Message {
        envelope: ENV,
        body,
    }
    .encode(&mut out)
    .expect("encode");
    out
}

#[test]
fn header_layout_is_pinned() {
    let bytes = encode(Body::Commit(Commit {
        commit: 3,
        commit_checksum: 9,
    }));
    assert_eq!(bytes.len(), HEADER_LEN + 16);
    assert_eq!(&bytes[0..4], b"RLGR");
    assert_eq!(bytes[4], VERSION);
    assert_eq!(bytes[5], Command::Commit as u8);
    assert_eq!(&bytes[6..8], &64u16.to_le_bytes());
    assert_eq!(&bytes[16..24], &crate::checksum(&bytes[64..]).to_le_bytes());
    assert_eq!(&bytes[24..40], &ENV.cluster_id.to_le_bytes());
    assert_eq!(&bytes[40..44], &5u32.to_le_bytes());
    assert_eq!(&bytes[44..48], &7u32.to_le_bytes());
    assert_eq!(&bytes[48..52], &16u32.to_le_bytes());
    assert_eq!(bytes[52], 2);
    assert!(bytes[53..64].iter().all(|&b| b == 0));
    let mut head = [0u8; HEADER_LEN];
    head.copy_from_slice(&bytes[..HEADER_LEN]);
    head[8..16].fill(0);
    assert_eq!(&bytes[8..16], &crate::checksum(&head).to_le_bytes());
    assert_eq!(&bytes[64..72], &3u64.to_le_bytes());
    assert_eq!(&bytes[72..80], &9u64.to_le_bytes());
}

#[test]
fn encode_refuses_a_prepare_whose_view_is_not_the_batch_view() {
    let bytes = batch(4, ENV.view + 1, 0, 0);
    let view = BatchView::parse(&bytes).expect("batch");
    let mut out = vec![0xAA];
    let err = Message {
        envelope: ENV,
        body: Body::Prepare(Prepare::new(view, 1)),
    }
    .encode(&mut out)
    .expect_err("mismatched view");
    assert!(matches!(
        err,
        ReplicationError::Mismatch { field: "view", .. }
    ));
    // A refused encode leaves the buffer as it was.
    assert_eq!(out, vec![0xAA]);
}

#[test]
fn encode_refuses_a_suffix_header_with_a_stale_checksum() {
    let bytes = batch(4, 3, 0, 0);
    let mut h = *BatchView::parse(&bytes).expect("batch").header();
    h.header_checksum ^= 1;
    let mut out = Vec::new();
    let err = Message {
        envelope: ENV,
        body: Body::StartView(StartView {
            op: 4,
            head_checksum: h.header_checksum,
            commit: 3,
            nonce: 0,
            suffix: vec![h],
        }),
    }
    .encode(&mut out)
    .expect_err("stale checksum");
    assert!(matches!(err, ReplicationError::BrokenRun { index: 0, .. }));
}

#[test]
fn decoded_prepare_borrows_the_input() {
    let b = batch(4, ENV.view, 100, 0);
    let view = BatchView::parse(&b).expect("batch");
    let bytes = encode(Body::Prepare(Prepare::new(view, 3)));
    let msg = Message::decode(&bytes, &ReplicationLimits::default()).expect("decode");
    let Body::Prepare(p) = msg.body else {
        panic!("not a prepare: {:?}", msg.body)
    };
    let start = bytes.as_ptr() as usize + HEADER_LEN + 16;
    assert_eq!(p.batch.as_bytes().as_ptr() as usize, start);
    assert_eq!(p.batch.as_bytes(), b.as_slice());
    assert_eq!(p.checksum(), view.header().header_checksum);
}

#[test]
fn header_decode_alone_refuses_an_oversized_body() {
    let mut bytes = encode(Body::StartViewChange);
    bytes[48..52].copy_from_slice(&u32::MAX.to_le_bytes());
    let mut head = [0u8; HEADER_LEN];
    head.copy_from_slice(&bytes[..HEADER_LEN]);
    head[8..16].fill(0);
    let sum = crate::checksum(&head);
    bytes[8..16].copy_from_slice(&sum.to_le_bytes());
    assert_eq!(
        Header::decode(&bytes, &ReplicationLimits::default()),
        Err(ReplicationError::BodyTooLarge {
            body_len: u64::from(u32::MAX),
            max: u64::from(ReplicationLimits::default().body_bytes_max),
        })
    );
}
