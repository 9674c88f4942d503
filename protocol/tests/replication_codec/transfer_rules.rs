//! The state-transfer messages' own rules (issue 10 item 1): an offer that
//! disagrees with its manifest, a stale or unsolicited answer, a window of
//! chunk keys that repeats or runs backwards, an empty or oversized chunk,
//! each refused with a typed error, and every size checked against the
//! limits before anything is allocated.

use super::*;
use ringlog_protocol::manifest::ManifestError;

/// Body offsets of a SnapshotOffer's fields.
const OFFER_NONCE: usize = HEADER_LEN;
const OFFER_SNAPSHOT_ID: usize = HEADER_LEN + 8;
const OFFER_KIND: usize = HEADER_LEN + 24;
const OFFER_REASON: usize = HEADER_LEN + 25;
const OFFER_MANIFEST: usize = HEADER_LEN + 32;

fn encode_body(env: &Envelope, body: Body<'_>) -> Vec<u8> {
    encode(&Message {
        envelope: *env,
        body,
    })
}

fn offer_bytes(o: SnapshotOffer) -> Vec<u8> {
    encode_body(&ENV, Body::SnapshotOffer(o))
}

fn invalid_field(err: &ReplicationError) -> &'static str {
    match err {
        ReplicationError::Invalid { field, .. } => field,
        other => panic!("expected Invalid, got {other}"),
    }
}

#[test]
fn request_snapshot_and_release_refuse_zero_ids() {
    let request = sample_bytes(Command::RequestSnapshot);
    let err = refuse(&resealed(request, |b| put_u64(b, HEADER_LEN, 0)));
    assert_eq!(invalid_field(&err), "nonce");
    let release = sample_bytes(Command::ReleaseSnapshot);
    let err = refuse(&resealed(release, |b| put_u64(b, HEADER_LEN, 0)));
    assert_eq!(invalid_field(&err), "snapshot_id");
}

/// A receiver takes an offer only for the request in flight (its nonce),
/// so a refusal or offer without one, or a stale kind/reason, is refused.
#[test]
fn offer_answers_must_name_their_request() {
    let bytes = offer_bytes(offer(&ENV, 91, 12, 30, &[9000]));
    let err = refuse(&resealed(bytes.clone(), |b| put_u64(b, OFFER_NONCE, 0)));
    assert_eq!(invalid_field(&err), "nonce");
    let err = refuse(&resealed(bytes.clone(), |b| {
        put_u64(b, OFFER_SNAPSHOT_ID, 0)
    }));
    assert_eq!(invalid_field(&err), "snapshot_id");
    let busy = offer_bytes(refusal(91, 0, Refusal::Busy));
    let err = refuse(&resealed(busy.clone(), |b| put_u64(b, OFFER_NONCE, 0)));
    assert_eq!(invalid_field(&err), "nonce");
    let err = refuse(&resealed(busy.clone(), |b| {
        put_u64(b, OFFER_SNAPSHOT_ID, 4)
    }));
    assert_eq!(invalid_field(&err), "snapshot_id");
    let unknown = offer_bytes(refusal(0, 12, Refusal::UnknownSnapshot));
    let err = refuse(&resealed(unknown.clone(), |b| put_u64(b, OFFER_NONCE, 5)));
    assert_eq!(invalid_field(&err), "nonce");
    let err = refuse(&resealed(unknown, |b| put_u64(b, OFFER_SNAPSHOT_ID, 0)));
    assert_eq!(invalid_field(&err), "snapshot_id");
    for kind in [0u8, 3, 0xFF] {
        let err = refuse(&resealed(busy.clone(), |b| b[OFFER_KIND] = kind));
        assert_eq!(invalid_field(&err), "kind", "kind {kind}");
    }
    for reason in [0u8, 6, 0xFF] {
        let err = refuse(&resealed(busy.clone(), |b| b[OFFER_REASON] = reason));
        assert_eq!(invalid_field(&err), "reason", "reason {reason}");
    }
    let err = refuse(&resealed(bytes, |b| b[OFFER_REASON] = Refusal::Busy as u8));
    assert_eq!(invalid_field(&err), "reason");
    for i in OFFER_REASON + 1..OFFER_MANIFEST {
        let err = refuse(&resealed(busy.clone(), |b| b[i] = 1));
        assert!(
            matches!(err, ReplicationError::NonZeroReserved { .. }),
            "byte {i}: {err}"
        );
    }
    // A refusal carries no manifest.
    let err = refuse(&resealed(busy, |b| b.push(0)));
    assert!(matches!(
        err,
        ReplicationError::BodySize {
            command: Command::SnapshotOffer,
            ..
        }
    ));
}

#[test]
fn refusals_say_whether_to_retry_the_same_peer() {
    let transient = [Refusal::Busy, Refusal::NotNormal];
    let final_ = [
        Refusal::NotAhead,
        Refusal::Unavailable,
        Refusal::UnknownSnapshot,
    ];
    assert!(transient.iter().all(|r| r.is_transient()));
    assert!(final_.iter().all(|r| !r.is_transient()));
    for r in transient.iter().chain(&final_) {
        assert_eq!(Refusal::from_u8(*r as u8), Some(*r));
    }
}

type OfferEdit = fn(&mut SnapshotOffer, &mut Manifest);

/// The offer's manifest must be the snapshot the message names, of this
/// partition, no newer than the sender's view, its commit within
/// commit_max and its frontier at or below its commit.
#[test]
fn offer_must_agree_with_its_manifest() {
    let base = offer(&ENV, 91, 12, 30, &[9000, 4096]);
    let with = |edit: OfferEdit| {
        let mut o = base.clone();
        let Offer::Snapshot(mut m) = o.offer.clone() else {
            unreachable!("an offer")
        };
        edit(&mut o, &mut m);
        o.offer = Offer::Snapshot(m);
        o
    };
    let cases: [(OfferEdit, &str); 5] = [
        (|_, m| m.snapshot_id = 13, "snapshot_id"),
        (|_, m| m.partition_id += 1, "partition_id"),
        (|_, m| m.view = ENV.view + 1, "manifest view"),
        (|o, m| o.commit_max = m.commit - 1, "manifest commit"),
        (|_, m| m.last_op = m.commit + 1, "manifest last_op"),
    ];
    for (edit, field) in cases {
        let bad = with(edit);
        let mut out = vec![1, 2, 3];
        let err = Message {
            envelope: ENV,
            body: Body::SnapshotOffer(bad.clone()),
        }
        .encode(&mut out)
        .expect_err("the encoder refuses it");
        assert_eq!(out, [1, 2, 3], "a refused encode leaves the buffer");
        let got = match &err {
            ReplicationError::OfferMismatch { field, .. } => *field,
            other => invalid_field(other),
        };
        assert_eq!(got, field, "{err}");
        // The same offer forged past the encoder: the decoder refuses it.
        let good = offer_bytes(base.clone());
        let Offer::Snapshot(m) = &bad.offer else {
            unreachable!("an offer")
        };
        let forged = resealed(good, |b| {
            b.truncate(OFFER_MANIFEST);
            put_u64(b, HEADER_LEN + 16, bad.commit_max);
            b.extend_from_slice(&m.encode());
        });
        assert_eq!(refuse(&forged), err, "decoding {field}");
    }
}

/// A manifest that fails to decode is a typed refusal of the offer (the
/// transfer session charges the peer for it), and an oversized one is
/// refused from its length before it is parsed.
#[test]
fn undecodable_or_oversized_manifest_refused() {
    let bytes = offer_bytes(offer(&ENV, 91, 12, 30, &[9000, 4096]));
    for i in OFFER_MANIFEST..bytes.len() {
        let err = refuse(&resealed(bytes.clone(), |b| b[i] ^= 0x10));
        assert!(
            matches!(err, ReplicationError::Manifest(_)),
            "byte {i}: {err}"
        );
    }
    let err = refuse(&resealed(bytes.clone(), |b| b.truncate(OFFER_MANIFEST)));
    assert!(matches!(
        err,
        ReplicationError::Manifest(ManifestError::Truncated { .. })
    ));
    let manifest_len = bytes.len() - OFFER_MANIFEST;
    let at = ReplicationLimits {
        manifest: ManifestLimits {
            manifest_bytes_max: manifest_len,
            ..ManifestLimits::default()
        },
        ..limits()
    };
    Message::decode(&bytes, &at).expect("at the limit");
    let below = ReplicationLimits {
        manifest: ManifestLimits {
            manifest_bytes_max: manifest_len - 1,
            ..ManifestLimits::default()
        },
        ..limits()
    };
    assert_eq!(
        Message::decode(&bytes, &below).map(|_| ()),
        Err(ReplicationError::Manifest(ManifestError::TooLarge {
            len: manifest_len,
            max: manifest_len - 1
        }))
    );
}

fn chunks_request(pairs: &[(u32, u32)]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&12u64.to_le_bytes());
    out.extend_from_slice(&(pairs.len() as u32).to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    for (a, c) in pairs {
        out.extend_from_slice(&a.to_le_bytes());
        out.extend_from_slice(&c.to_le_bytes());
    }
    let template = sample_bytes(Command::RequestChunks);
    resealed(template, |b| {
        b.truncate(HEADER_LEN);
        b.extend_from_slice(&out);
    })
}

/// A window names each chunk once, in order, and is never empty: a peer
/// cannot make the server read a chunk twice per request.
#[test]
fn request_chunks_window_rules() {
    decode(&chunks_request(&[(0, 0), (0, 1), (2, 0)])).expect("increasing keys");
    for (pairs, index) in [
        (&[(0, 0), (0, 0)][..], 1),
        (&[(0, 1), (0, 0)][..], 1),
        (&[(0, 0), (1, 5), (1, 2)][..], 2),
    ] {
        let err = refuse(&chunks_request(pairs));
        assert!(
            matches!(err, ReplicationError::BrokenRun { command: Command::RequestChunks, index: i, .. } if i == index),
            "{pairs:?}: {err}"
        );
    }
    assert_eq!(invalid_field(&refuse(&chunks_request(&[]))), "count");
    let zero_id = resealed(chunks_request(&[(0, 0)]), |b| put_u64(b, HEADER_LEN, 0));
    assert_eq!(invalid_field(&refuse(&zero_id)), "snapshot_id");
    let reserved = resealed(chunks_request(&[(0, 0)]), |b| b[HEADER_LEN + 12] = 1);
    assert!(matches!(
        refuse(&reserved),
        ReplicationError::NonZeroReserved { .. }
    ));
    // A count the bytes do not hold.
    let short = resealed(chunks_request(&[(0, 0), (0, 1)]), |b| {
        b.truncate(b.len() - 8)
    });
    assert!(matches!(refuse(&short), ReplicationError::BodySize { .. }));
    let encoded = Message {
        envelope: ENV,
        body: Body::RequestChunks(RequestChunks {
            snapshot_id: 12,
            keys: keys(&[(1, 1), (1, 0)]),
        }),
    }
    .encode(&mut Vec::new());
    assert!(matches!(encoded, Err(ReplicationError::BrokenRun { .. })));
}

/// A window over `chunk_keys_max` is refused from its count, before the
/// key vector is sized by it: a count of u32::MAX costs nothing.
#[test]
fn chunk_keys_max_is_enforced_before_allocation() {
    let pairs: Vec<(u32, u32)> = (0..8).map(|c| (0, c)).collect();
    let bytes = chunks_request(&pairs);
    let at = ReplicationLimits {
        chunk_keys_max: 8,
        ..limits()
    };
    Message::decode(&bytes, &at).expect("at the limit");
    let below = ReplicationLimits {
        chunk_keys_max: 7,
        ..limits()
    };
    assert!(matches!(
        Message::decode(&bytes, &below),
        Err(ReplicationError::LimitExceeded {
            field: "chunk keys",
            value: 8,
            max: 7,
            ..
        })
    ));
    let huge = resealed(bytes, |b| {
        b[HEADER_LEN + 8..HEADER_LEN + 12].copy_from_slice(&u32::MAX.to_le_bytes())
    });
    let start = Instant::now();
    assert!(matches!(
        refuse(&huge),
        ReplicationError::LimitExceeded {
            field: "chunk keys",
            ..
        }
    ));
    assert!(start.elapsed() < Duration::from_millis(100));
}

#[test]
fn chunk_rules_and_chunk_bytes_max() {
    let bytes = sample_bytes(Command::Chunk);
    let data_len = (bytes.len() - HEADER_LEN - 16) as u32;
    let at = ReplicationLimits {
        chunk_bytes_max: data_len,
        ..limits()
    };
    let msg = Message::decode(&bytes, &at).expect("at the limit");
    let Body::Chunk(chunk) = msg.body else {
        panic!("a chunk")
    };
    assert_eq!(
        chunk.data.as_ptr(),
        bytes[HEADER_LEN + 16..].as_ptr(),
        "borrowed, not copied"
    );
    let below = ReplicationLimits {
        chunk_bytes_max: data_len - 1,
        ..limits()
    };
    assert!(matches!(
        Message::decode(&bytes, &below),
        Err(ReplicationError::LimitExceeded {
            field: "chunk bytes",
            ..
        })
    ));
    let empty = resealed(bytes.clone(), |b| b.truncate(HEADER_LEN + 16));
    assert_eq!(invalid_field(&refuse(&empty)), "data");
    let zero_id = resealed(bytes, |b| put_u64(b, HEADER_LEN, 0));
    assert_eq!(invalid_field(&refuse(&zero_id)), "snapshot_id");
}
