//! Codec properties: round trips, and that every corruption or truncation
//! of a valid batch is rejected with a typed error.

use proptest::prelude::*;
use ringlog_protocol::batch::{
    BODY_LEN_MAX_BYTES, HEADERS_PER_RECORD_MAX, MAGIC, RECORD_COUNT_MAX, RECORD_LEN_MIN,
};
use ringlog_protocol::{
    checksum, encode_header, restamp, BatchBuilder, BatchError, BatchHeader, BatchView, Record,
    Stamp, HEADER_LEN,
};

#[derive(Debug, Clone)]
struct OwnedRecord {
    key: Vec<u8>,
    headers: Vec<(Vec<u8>, Vec<u8>)>,
    value: Vec<u8>,
    timestamp_ms: u64,
}

fn build(partition_id: u32, records: &[OwnedRecord], stamp: &Stamp) -> Vec<u8> {
    let mut builder = BatchBuilder::new(partition_id);
    for r in records {
        let headers: Vec<(&[u8], &[u8])> = r
            .headers
            .iter()
            .map(|(n, v)| (n.as_slice(), v.as_slice()))
            .collect();
        builder
            .push(&Record {
                key: &r.key,
                headers: &headers,
                value: &r.value,
                timestamp_ms: r.timestamp_ms,
            })
            .expect("push");
    }
    assert_eq!(builder.record_count() as usize, records.len());
    let len = builder.len_bytes();
    let bytes = builder.finish(stamp).expect("finish");
    assert_eq!(bytes.len(), len);
    bytes
}

fn assert_matches(bytes: &[u8], partition_id: u32, records: &[OwnedRecord], stamp: &Stamp) {
    let view = BatchView::parse(bytes).expect("parse");
    let h = *view.header();
    assert_eq!(view.as_bytes(), bytes);
    assert_eq!(h.total_len(), bytes.len());
    assert_eq!(h.partition_id, partition_id);
    assert_eq!(h.base_offset, stamp.base_offset);
    assert_eq!(h.vsr_op, stamp.vsr_op);
    assert_eq!(h.vsr_view, stamp.vsr_view);
    assert_eq!(h.prev_checksum, stamp.prev_checksum);
    assert_eq!(h.record_count as usize, records.len());
    assert_eq!(h.next_offset(), stamp.base_offset + records.len() as u64);
    assert_eq!(h.last_offset(), h.next_offset() - 1);
    let min = records
        .iter()
        .map(|r| r.timestamp_ms)
        .min()
        .expect("non-empty");
    let max = records
        .iter()
        .map(|r| r.timestamp_ms)
        .max()
        .expect("non-empty");
    assert_eq!(h.first_timestamp_ms, min);
    assert_eq!(h.max_timestamp_ms, max);
    assert_eq!(view.records().len(), records.len());
    let mut n = 0;
    for (i, (got, want)) in view.records().zip(records).enumerate() {
        assert_eq!(got.offset, stamp.base_offset + i as u64);
        assert_eq!(got.timestamp_ms, want.timestamp_ms);
        assert_eq!(got.key, want.key.as_slice());
        assert_eq!(got.value, want.value.as_slice());
        assert_eq!(got.headers.len(), want.headers.len());
        let headers: Vec<(&[u8], &[u8])> = got.headers.collect();
        let want_headers: Vec<(&[u8], &[u8])> = want
            .headers
            .iter()
            .map(|(n, v)| (n.as_slice(), v.as_slice()))
            .collect();
        assert_eq!(headers, want_headers);
        n += 1;
    }
    assert_eq!(n, records.len());
}

/// Recomputes the header checksum after a test edits header bytes.
fn fix_header_checksum(bytes: &mut [u8]) {
    let mut head = [0u8; HEADER_LEN];
    head.copy_from_slice(&bytes[..HEADER_LEN]);
    head[8..16].fill(0);
    let sum = checksum(&head);
    bytes[8..16].copy_from_slice(&sum.to_le_bytes());
}

/// Recomputes body and header checksums after a test edits the body (and
/// optionally header fields via `edit`), so only structural checks can fire.
fn reseal(bytes: &mut [u8], edit: impl FnOnce(&mut BatchHeader)) {
    let mut h = BatchHeader::decode(bytes).expect("header still valid");
    edit(&mut h);
    h.body_checksum = checksum(&bytes[HEADER_LEN..]);
    let head: &mut [u8; HEADER_LEN] = (&mut bytes[..HEADER_LEN]).try_into().expect("96 bytes");
    encode_header(&h, head);
}

fn rec(key: &[u8], headers: &[(&[u8], &[u8])], value: &[u8], timestamp_ms: u64) -> OwnedRecord {
    OwnedRecord {
        key: key.to_vec(),
        headers: headers
            .iter()
            .map(|(n, v)| (n.to_vec(), v.to_vec()))
            .collect(),
        value: value.to_vec(),
        timestamp_ms,
    }
}

fn sample_records() -> Vec<OwnedRecord> {
    vec![
        rec(b"k0", &[(b"h", b"v"), (b"trace", b"abc")], b"hello", 1_000),
        rec(b"", &[], b"", 990),
        rec(b"key-2", &[(b"", b"")], b"world!", 1_500),
    ]
}

const STAMP: Stamp = Stamp {
    base_offset: 1_000,
    vsr_op: 42,
    vsr_view: 3,
    prev_checksum: 0xDEAD_BEEF,
};

fn sample_batch() -> Vec<u8> {
    build(7, &sample_records(), &STAMP)
}

/// Offsets of record 0's fields inside the sample batch: length, offset_delta,
/// timestamp_delta, key_len, key b"k0", header_count, reserved.
const R0_OFFSET_DELTA: usize = HEADER_LEN + 4;
const R0_RESERVED: usize = HEADER_LEN + 4 + 4 + 4 + 4 + 2 + 2;

fn record_strategy() -> impl Strategy<Value = OwnedRecord> {
    (
        prop::collection::vec(any::<u8>(), 0..64),
        prop::collection::vec(
            (
                prop::collection::vec(any::<u8>(), 0..16),
                prop::collection::vec(any::<u8>(), 0..32),
            ),
            0..4,
        ),
        prop::collection::vec(any::<u8>(), 0..2048),
        0..=u64::from(u32::MAX),
    )
        .prop_map(|(key, headers, value, timestamp_ms)| OwnedRecord {
            key,
            headers,
            value,
            timestamp_ms,
        })
}

fn batch_strategy() -> impl Strategy<Value = (u32, Vec<OwnedRecord>, u64, Stamp)> {
    (
        any::<u32>(),
        prop::collection::vec(record_strategy(), 1..20),
        0..u64::MAX / 2,
        (0..u64::MAX - 100, any::<u64>(), any::<u32>(), any::<u64>()),
    )
        .prop_map(
            |(partition, mut records, ts_base, (base_offset, vsr_op, vsr_view, prev))| {
                for r in &mut records {
                    r.timestamp_ms += ts_base;
                }
                let stamp = Stamp {
                    base_offset,
                    vsr_op,
                    vsr_view,
                    prev_checksum: prev,
                };
                (partition, records, ts_base, stamp)
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn round_trip((partition, records, _ts, stamp) in batch_strategy()) {
        let bytes = build(partition, &records, &stamp);
        assert_matches(&bytes, partition, &records, &stamp);
    }

    #[test]
    fn restamp_round_trip((partition, records, _ts, stamp) in batch_strategy()) {
        let mut bytes = build(partition, &records, &Stamp::default());
        let body_before = bytes[HEADER_LEN..].to_vec();
        let header = restamp(&mut bytes, &stamp).expect("restamp");
        prop_assert_eq!(&bytes[HEADER_LEN..], body_before.as_slice());
        prop_assert_eq!(header, BatchHeader::decode(&bytes).expect("decode"));
        assert_matches(&bytes, partition, &records, &stamp);
        // Restamping is indistinguishable from building with the stamp.
        prop_assert_eq!(bytes, build(partition, &records, &stamp));
    }

    #[test]
    fn random_byte_flip_rejected(
        (partition, records, _ts, stamp) in batch_strategy(),
        pos in any::<prop::sample::Index>(),
        mask in 1u8..=255,
    ) {
        let mut bytes = build(partition, &records, &stamp);
        let i = pos.index(bytes.len());
        bytes[i] ^= mask;
        prop_assert!(BatchView::parse(&bytes).is_err());
    }
}

#[test]
fn every_single_byte_flip_rejected() {
    let batches = [
        sample_batch(),
        build(0, &[rec(b"", &[], b"", 0)], &Stamp::default()),
        build(
            u32::MAX,
            &[
                rec(b"a", &[(b"n", b"v")], &[0u8; 300], u64::MAX - 5),
                rec(b"b", &[], b"x", u64::MAX),
            ],
            &Stamp {
                base_offset: u64::MAX - 2,
                ..STAMP
            },
        ),
    ];
    for bytes in &batches {
        BatchView::parse(bytes).expect("pristine batch parses");
        for i in 0..bytes.len() {
            for mask in [0x01u8, 0x80, 0xFF, 0x5A] {
                let mut corrupt = bytes.clone();
                corrupt[i] ^= mask;
                let err = BatchView::parse(&corrupt).expect_err("flip must be rejected");
                // Header flips surface as header errors, body flips as body checksum.
                if i >= HEADER_LEN {
                    assert!(
                        matches!(err, BatchError::BodyChecksum { .. }),
                        "byte {i}: {err}"
                    );
                }
            }
        }
    }
}

#[test]
fn every_truncation_rejected() {
    let bytes = sample_batch();
    for len in 0..bytes.len() {
        let err = BatchView::parse(&bytes[..len]).expect_err("truncation must be rejected");
        let needed = if len < HEADER_LEN {
            HEADER_LEN
        } else {
            bytes.len()
        };
        assert_eq!(
            err,
            BatchError::Truncated {
                needed,
                available: len
            }
        );
    }
}

#[test]
fn trailing_bytes_after_batch_ignored() {
    let bytes = sample_batch();
    let mut buf = bytes.clone();
    buf.extend_from_slice(&sample_batch());
    buf.extend_from_slice(b"garbage");
    let view = BatchView::parse(&buf).expect("parse from larger buffer");
    assert_eq!(view.as_bytes(), bytes.as_slice());
    let second = BatchView::parse(&buf[view.header().total_len()..]).expect("second batch");
    assert_eq!(second.as_bytes(), bytes.as_slice());
}

#[test]
fn layout_is_pinned() {
    let bytes = sample_batch();
    assert_eq!(&bytes[0..4], b"RLGB");
    assert_eq!(
        u32::from_le_bytes(bytes[0..4].try_into().expect("4")),
        MAGIC
    );
    assert_eq!(bytes[4], 1);
    assert_eq!(
        u64::from_le_bytes(bytes[32..40].try_into().expect("8")),
        1_000
    );
    assert_eq!(u32::from_le_bytes(bytes[64..68].try_into().expect("4")), 7);
    assert_eq!(u32::from_le_bytes(bytes[68..72].try_into().expect("4")), 3);
    assert_eq!(RECORD_LEN_MIN, 24);
    assert_eq!(RECORD_COUNT_MAX, BODY_LEN_MAX_BYTES / 24);
    // An empty record is exactly RECORD_LEN_MIN bytes.
    let one = build(0, &[rec(b"", &[], b"", 0)], &Stamp::default());
    assert_eq!(one.len(), HEADER_LEN + RECORD_LEN_MIN as usize);
}

#[test]
fn hash_chain_links_batches() {
    let first = build(1, &sample_records(), &Stamp::default());
    let h1 = BatchView::parse(&first).expect("first").header().to_owned();
    let second = build(
        1,
        &sample_records(),
        &Stamp {
            base_offset: h1.next_offset(),
            vsr_op: 1,
            vsr_view: 0,
            prev_checksum: h1.header_checksum,
        },
    );
    let h2 = *BatchView::parse(&second).expect("second").header();
    assert_eq!(h2.prev_checksum, h1.header_checksum);
    assert_eq!(h2.base_offset, h1.next_offset());
}

#[test]
fn offset_delta_mismatch_rejected() {
    let mut bytes = sample_batch();
    bytes[R0_OFFSET_DELTA..R0_OFFSET_DELTA + 4].copy_from_slice(&5u32.to_le_bytes());
    reseal(&mut bytes, |_| {});
    assert_eq!(
        BatchView::parse(&bytes).map(|_| ()),
        Err(BatchError::OffsetDelta {
            index: 0,
            expected: 0,
            actual: 5
        })
    );
}

#[test]
fn non_zero_reserved_header_rejected() {
    // Attribute bit 0 is ATTR_PURGE; bit 1 is still reserved.
    for (pos, value, field) in [
        (5usize, 2u8, "attributes"),
        (5, 0x80, "attributes"),
        (6, 1, "reserved"),
        (7, 1, "reserved"),
        (80, 1, "reserved_tail"),
        (95, 1, "reserved_tail"),
    ] {
        let mut bytes = sample_batch();
        bytes[pos] = value;
        fix_header_checksum(&mut bytes);
        assert_eq!(
            BatchView::parse(&bytes).map(|_| ()),
            Err(BatchError::NonZeroReserved { field }),
            "byte {pos}"
        );
    }
}

/// Guards against: the purge attribute lost on decode or on a restamp
/// (a replica would store an operator's purge as a producer's batch).
#[test]
fn purge_attribute_decodes_and_survives_restamp() {
    let mut bytes = sample_batch();
    assert!(!BatchView::parse(&bytes).expect("valid").header().is_purge());
    bytes[5] = ringlog_protocol::batch::ATTR_PURGE;
    fix_header_checksum(&mut bytes);
    assert!(BatchView::parse(&bytes).expect("valid").header().is_purge());
    let stamp = ringlog_protocol::batch::Stamp {
        base_offset: 40,
        vsr_op: 9,
        vsr_view: 2,
        prev_checksum: 7,
    };
    let h = ringlog_protocol::batch::restamp(&mut bytes, &stamp).expect("restamps");
    assert!(h.is_purge() && h.vsr_op == 9);
    assert_eq!(bytes[5], ringlog_protocol::batch::ATTR_PURGE);
    assert!(BatchView::parse(&bytes).expect("valid").header().is_purge());
}

#[test]
fn non_zero_reserved_record_rejected() {
    let mut bytes = sample_batch();
    bytes[R0_RESERVED + 1] = 1;
    reseal(&mut bytes, |_| {});
    assert_eq!(
        BatchView::parse(&bytes).map(|_| ()),
        Err(BatchError::RecordNonZeroReserved { index: 0 })
    );
}

#[test]
fn body_too_large_rejected_before_body_is_read() {
    let mut bytes = sample_batch();
    bytes.truncate(HEADER_LEN);
    bytes[72..76].copy_from_slice(&(BODY_LEN_MAX_BYTES + 1).to_le_bytes());
    fix_header_checksum(&mut bytes);
    let want = BatchError::BodyTooLarge {
        body_len: BODY_LEN_MAX_BYTES + 1,
        max: BODY_LEN_MAX_BYTES,
    };
    assert_eq!(BatchHeader::decode(&bytes), Err(want.clone()));
    assert_eq!(BatchView::parse(&bytes).map(|_| ()), Err(want));
}

#[test]
fn record_count_mismatch_rejected() {
    // Claim more records than the body holds (but the body is big enough to
    // pass the cheap count-vs-length check).
    let big = build(0, &[rec(b"", &[], &[7u8; 100], 0)], &Stamp::default());
    let mut bytes = big.clone();
    reseal(&mut bytes, |h| h.record_count = 2);
    assert_eq!(
        BatchView::parse(&bytes).map(|_| ()),
        Err(BatchError::MissingRecords {
            expected: 2,
            found: 1
        })
    );
    // Claim fewer records than the body holds.
    let mut bytes = sample_batch();
    reseal(&mut bytes, |h| h.record_count = 2);
    assert!(matches!(
        BatchView::parse(&bytes),
        Err(BatchError::TrailingBodyBytes { .. })
    ));
}

#[test]
fn record_length_mismatch_rejected() {
    // Grow record 0's length by one: its fields then leave a byte unused.
    let mut bytes = build(
        0,
        &[rec(b"", &[], b"ab", 0), rec(b"", &[], b"", 0)],
        &Stamp::default(),
    );
    let len = u32::from_le_bytes(bytes[HEADER_LEN..HEADER_LEN + 4].try_into().expect("4"));
    bytes[HEADER_LEN..HEADER_LEN + 4].copy_from_slice(&(len + 1).to_le_bytes());
    reseal(&mut bytes, |_| {});
    assert_eq!(
        BatchView::parse(&bytes).map(|_| ()),
        Err(BatchError::RecordTrailingBytes {
            index: 0,
            unused: 1
        })
    );
    // Shrink it: the value no longer fits inside the record.
    bytes[HEADER_LEN..HEADER_LEN + 4].copy_from_slice(&(len - 1).to_le_bytes());
    reseal(&mut bytes, |_| {});
    assert_eq!(
        BatchView::parse(&bytes).map(|_| ()),
        Err(BatchError::RecordTruncated {
            index: 0,
            field: "value"
        })
    );
    // Past the end of the body.
    bytes[HEADER_LEN..HEADER_LEN + 4].copy_from_slice(&1_000u32.to_le_bytes());
    reseal(&mut bytes, |_| {});
    assert!(matches!(
        BatchView::parse(&bytes),
        Err(BatchError::RecordLength {
            index: 0,
            length: 1_000,
            ..
        })
    ));
}

#[test]
fn timestamp_delta_beyond_max_rejected() {
    let mut bytes = build(
        0,
        &[rec(b"", &[], b"", 10), rec(b"", &[], b"", 20)],
        &Stamp::default(),
    );
    let ts_delta = HEADER_LEN + 4 + 4;
    bytes[ts_delta..ts_delta + 4].copy_from_slice(&11u32.to_le_bytes());
    reseal(&mut bytes, |_| {});
    assert_eq!(
        BatchView::parse(&bytes).map(|_| ()),
        Err(BatchError::TimestampDelta {
            index: 0,
            delta_ms: 11,
            span_ms: 10
        })
    );
}

#[test]
fn builder_limits() {
    let mut b = BatchBuilder::new(0);
    assert!(b.is_empty());
    assert_eq!(
        b.clone().finish(&Stamp::default()),
        Err(BatchError::EmptyBatch)
    );

    let h: (&[u8], &[u8]) = (b"n", b"v");
    let headers = vec![h; usize::from(HEADERS_PER_RECORD_MAX) + 1];
    let too_many = Record {
        key: b"",
        headers: &headers,
        value: b"",
        timestamp_ms: 0,
    };
    assert_eq!(
        b.push(&too_many),
        Err(BatchError::TooManyHeaders {
            index: 0,
            count: headers.len()
        })
    );
    let ok = Record {
        headers: &headers[1..],
        ..too_many
    };
    b.push(&ok).expect("exactly the cap is fine");

    let long_name = vec![0u8; usize::from(u16::MAX) + 1];
    let long_headers: [(&[u8], &[u8]); 1] = [(&long_name, b"")];
    assert_eq!(
        b.push(&Record {
            headers: &long_headers,
            ..ok
        }),
        Err(BatchError::FieldTooLong {
            field: "header name",
            len: long_name.len()
        })
    );

    assert_eq!(
        b.push(&Record {
            timestamp_ms: u64::from(u32::MAX) + 1,
            ..ok
        }),
        Err(BatchError::TimestampSpread {
            first_timestamp_ms: 0,
            max_timestamp_ms: u64::from(u32::MAX) + 1
        })
    );

    let huge = vec![0u8; BODY_LEN_MAX_BYTES as usize];
    let before = b.len_bytes();
    assert!(matches!(
        b.push(&Record {
            headers: &[],
            value: &huge,
            ..ok
        }),
        Err(BatchError::BatchFull { .. })
    ));
    // Failed pushes leave the builder untouched.
    assert_eq!(b.len_bytes(), before);
    assert_eq!(b.record_count(), 1);
    let bytes = b.finish(&Stamp::default()).expect("finish");
    let view = BatchView::parse(&bytes).expect("parse");
    assert_eq!(view.records().next().expect("one").headers.len(), 1024);
}

#[test]
fn full_body_is_accepted() {
    // A single record filling the body exactly up to the cap.
    let value = vec![1u8; BODY_LEN_MAX_BYTES as usize - RECORD_LEN_MIN as usize];
    let mut b = BatchBuilder::new(0);
    b.push(&Record {
        key: b"",
        headers: &[],
        value: &value,
        timestamp_ms: 0,
    })
    .expect("fits exactly");
    assert_eq!(b.body_len_bytes(), BODY_LEN_MAX_BYTES);
    assert!(matches!(
        b.push(&Record {
            key: b"",
            headers: &[],
            value: b"",
            timestamp_ms: 0
        }),
        Err(BatchError::BatchFull { .. })
    ));
    let bytes = b.finish(&Stamp::default()).expect("finish");
    BatchView::parse(&bytes).expect("parse");
}

#[test]
fn restamp_rejects_offset_overflow_and_bad_header() {
    let mut bytes = sample_batch();
    let err = restamp(
        &mut bytes,
        &Stamp {
            base_offset: u64::MAX - 1,
            ..STAMP
        },
    );
    assert_eq!(
        err,
        Err(BatchError::OffsetOverflow {
            base_offset: u64::MAX - 1,
            record_count: 3
        })
    );
    bytes[40] ^= 1;
    assert!(matches!(
        restamp(&mut bytes, &STAMP),
        Err(BatchError::HeaderChecksum { .. })
    ));
}
