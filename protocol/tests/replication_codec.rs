//! Replication message codec properties (issue 9): round trips; every
//! truncation and bit flip refused with a typed error; every limit refused
//! before allocation; and each structural rule (magic, version, command,
//! reserved bytes, batch/message agreement, contiguous runs) enforced.

use std::time::{Duration, Instant};

use proptest::prelude::*;
use ringlog_protocol::manifest::{Artifact, ArtifactKind, Manifest, ManifestLimits};
use ringlog_protocol::replication::{
    body_checksum_len, Body, Chunk, ChunkKey, Command, Commit, DoViewChange, Envelope,
    EvictedReason, Message, Offer, Prepare, PrepareOk, Prepares, RangeEvicted, Refusal,
    ReleaseSnapshot, ReplicationError, ReplicationLimits, RequestChunks, RequestPrepares,
    RequestSnapshot, RequestStartView, SnapshotOffer, StartView, ViewNotice, HEADER_LEN, MAGIC,
};
use ringlog_protocol::{checksum, BatchBuilder, BatchHeader, BatchView, Record, Stamp};

#[path = "replication_codec/transfer_rules.rs"]
mod transfer_rules;

const ENV: Envelope = Envelope {
    cluster_id: 0xfeed_0000_0000_0000_0000_0000_0000_beef,
    partition_id: 9,
    replica: 1,
    view: 6,
};

fn limits() -> ReplicationLimits {
    ReplicationLimits::default()
}

/// One batch of `records` small records stamped as op `op` of view `view`.
fn batch(env: &Envelope, op: u64, view: u32, base_offset: u64, prev: u64, records: u8) -> Vec<u8> {
    let mut b = BatchBuilder::new(env.partition_id);
    for i in 0..records.max(1) {
        let value = vec![i; usize::from(i) * 3];
        b.push(&Record {
            key: &[i],
            headers: &[(b"h", b"v")],
            value: &value,
            timestamp_ms: 1_000 + u64::from(i),
        })
        .expect("push");
    }
    b.finish(&Stamp {
        base_offset,
        vsr_op: op,
        vsr_view: view,
        prev_checksum: prev,
    })
    .expect("finish")
}

/// A contiguous, chained log piece: ops `first_op..first_op + views.len()`,
/// op i in view `views[i]` (non-decreasing).
fn chain(env: &Envelope, first_op: u64, views: &[u32], sizes: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let (mut offset, mut prev) = (first_op * 10, first_op.wrapping_mul(0x9e37));
    for (i, &view) in views.iter().enumerate() {
        let bytes = batch(
            env,
            first_op + i as u64,
            view,
            offset,
            prev,
            sizes[i % sizes.len()],
        );
        let h = BatchHeader::decode(&bytes).expect("header");
        offset = h.next_offset();
        prev = h.header_checksum;
        out.push(bytes);
    }
    out
}

/// The head checksum a suffix implies (its last header's; 0 when empty).
fn last_checksum(suffix: &[BatchHeader]) -> u64 {
    suffix.last().map_or(0, |h| h.header_checksum)
}

fn headers(batches: &[Vec<u8>]) -> Vec<BatchHeader> {
    batches
        .iter()
        .map(|b| BatchHeader::decode(b).expect("header"))
        .collect()
}

fn views(batches: &[Vec<u8>]) -> Vec<BatchView<'_>> {
    batches
        .iter()
        .map(|b| BatchView::parse(b).expect("batch"))
        .collect()
}

fn encode(msg: &Message<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    msg.encode(&mut out).expect("encode");
    out
}

/// Owned description of a message, so strategies can generate batches and
/// a test can borrow them into a [`Message`].
#[derive(Debug, Clone)]
enum Spec {
    Prepare {
        commit: u64,
        batch: Vec<u8>,
    },
    PrepareOk(PrepareOk),
    Commit(Commit),
    StartViewChange,
    DoViewChange(DoViewChange),
    StartView(StartView),
    RequestStartView(RequestStartView),
    ViewNotice(ViewNotice),
    RequestPrepares(RequestPrepares),
    Prepares {
        commit: u64,
        batches: Vec<Vec<u8>>,
    },
    RangeEvicted(RangeEvicted),
    RequestSnapshot(RequestSnapshot),
    SnapshotOffer(SnapshotOffer),
    RequestChunks(RequestChunks),
    Chunk {
        snapshot_id: u64,
        key: ChunkKey,
        data: Vec<u8>,
    },
    ReleaseSnapshot(ReleaseSnapshot),
}

impl Spec {
    fn body(&self) -> Body<'_> {
        match self {
            Spec::Prepare { commit, batch } => Body::Prepare(Prepare::new(
                BatchView::parse(batch).expect("batch"),
                *commit,
            )),
            Spec::PrepareOk(m) => Body::PrepareOk(*m),
            Spec::Commit(m) => Body::Commit(*m),
            Spec::StartViewChange => Body::StartViewChange,
            Spec::DoViewChange(m) => Body::DoViewChange(m.clone()),
            Spec::StartView(m) => Body::StartView(m.clone()),
            Spec::RequestStartView(m) => Body::RequestStartView(*m),
            Spec::ViewNotice(m) => Body::ViewNotice(*m),
            Spec::RequestPrepares(m) => Body::RequestPrepares(*m),
            Spec::Prepares { commit, batches } => Body::Prepares(Prepares {
                commit: *commit,
                batches: views(batches),
            }),
            Spec::RangeEvicted(m) => Body::RangeEvicted(*m),
            Spec::RequestSnapshot(m) => Body::RequestSnapshot(*m),
            Spec::SnapshotOffer(m) => Body::SnapshotOffer(m.clone()),
            Spec::RequestChunks(m) => Body::RequestChunks(m.clone()),
            Spec::Chunk {
                snapshot_id,
                key,
                data,
            } => Body::Chunk(Chunk {
                snapshot_id: *snapshot_id,
                key: *key,
                data,
            }),
            Spec::ReleaseSnapshot(m) => Body::ReleaseSnapshot(*m),
        }
    }
}

/// A manifest of `partition_id` in `view`: `lengths.len()` contiguous
/// segments in chunks of 4 KiB, its frontier at op `commit`.
fn manifest(
    partition_id: u32,
    view: u32,
    commit: u64,
    snapshot_id: u64,
    lengths: &[u64],
) -> Manifest {
    let chunk_size_bytes = 4096u32;
    let artifacts: Vec<Artifact> = (0u64..)
        .zip(lengths)
        .map(|(i, &length_bytes)| Artifact {
            kind: ArtifactKind::Segment,
            base_offset: i * 100,
            end_offset: (i + 1) * 100,
            length_bytes,
            checksum: 0xa0 + i,
            last_batch_checksum: 0xb0 + i,
            max_timestamp_ms: 1_000 + i,
            chunk_checksums: (0..Manifest::chunk_count(length_bytes, chunk_size_bytes))
                .map(|c| c * 31 + i)
                .collect(),
        })
        .collect();
    Manifest {
        partition_id,
        view,
        commit,
        next_offset: lengths.len() as u64 * 100,
        last_op: commit,
        last_checksum: 0xc0ffee,
        purge_generation: 3,
        snapshot_id,
        chunk_size_bytes,
        artifacts,
    }
}

fn offer(
    env: &Envelope,
    nonce: u64,
    snapshot_id: u64,
    commit: u64,
    lengths: &[u64],
) -> SnapshotOffer {
    SnapshotOffer {
        nonce,
        snapshot_id,
        commit_max: commit + 5,
        offer: Offer::Snapshot(manifest(
            env.partition_id,
            env.view,
            commit,
            snapshot_id,
            lengths,
        )),
    }
}

fn refusal(nonce: u64, snapshot_id: u64, reason: Refusal) -> SnapshotOffer {
    SnapshotOffer {
        nonce,
        snapshot_id,
        commit_max: 40,
        offer: Offer::Refused(reason),
    }
}

fn keys(pairs: &[(u32, u32)]) -> Vec<ChunkKey> {
    pairs
        .iter()
        .map(|&(artifact, chunk)| ChunkKey { artifact, chunk })
        .collect()
}

fn encode_spec(env: &Envelope, spec: &Spec) -> Vec<u8> {
    encode(&Message {
        envelope: *env,
        body: spec.body(),
    })
}

/// One of each command, with non-trivial fields.
fn samples() -> Vec<Spec> {
    let log = chain(&ENV, 20, &[3, 3, 5, 6], &[1, 4, 2]);
    let suffix = headers(&log);
    vec![
        Spec::Prepare {
            commit: 22,
            batch: batch(&ENV, 23, ENV.view, 500, 0xabc, 3),
        },
        Spec::PrepareOk(PrepareOk {
            op: 23,
            prepare_checksum: 0x1234_5678,
        }),
        Spec::Commit(Commit {
            commit: 22,
            commit_checksum: 0x55,
        }),
        Spec::StartViewChange,
        Spec::DoViewChange(DoViewChange {
            log_view: 6,
            op: 23,
            head_checksum: last_checksum(&suffix),
            commit: 21,
            suffix: suffix.clone(),
        }),
        Spec::DoViewChange(DoViewChange {
            log_view: 0,
            op: 0,
            head_checksum: 0,
            commit: 0,
            suffix: vec![],
        }),
        Spec::StartView(StartView {
            op: 23,
            head_checksum: last_checksum(&suffix),
            commit: 22,
            nonce: 77,
            suffix,
        }),
        Spec::RequestStartView(RequestStartView { nonce: 77 }),
        Spec::ViewNotice(ViewNotice { nonce: 78 }),
        Spec::RequestPrepares(RequestPrepares {
            op_min: 20,
            op_max: 23,
        }),
        Spec::Prepares {
            commit: 22,
            batches: log[1..].to_vec(),
        },
        Spec::RangeEvicted(RangeEvicted {
            op_min: 3,
            op_max: 9,
            op_held_min: 40,
            log_start_offset: 400,
            purge_generation: 2,
            reason: EvictedReason::Retired,
        }),
        Spec::RequestSnapshot(RequestSnapshot {
            nonce: 91,
            commit: 17,
            purge_generation: 2,
        }),
        Spec::SnapshotOffer(offer(&ENV, 91, 12, 30, &[9000, 4096])),
        Spec::SnapshotOffer(refusal(91, 0, Refusal::Busy)),
        Spec::SnapshotOffer(refusal(91, 0, Refusal::NotAhead)),
        Spec::SnapshotOffer(refusal(0, 12, Refusal::UnknownSnapshot)),
        Spec::RequestChunks(RequestChunks {
            snapshot_id: 12,
            keys: keys(&[(0, 0), (0, 2), (1, 0)]),
        }),
        Spec::Chunk {
            snapshot_id: 12,
            key: ChunkKey {
                artifact: 1,
                chunk: 0,
            },
            data: vec![7; 333],
        },
        Spec::ReleaseSnapshot(ReleaseSnapshot { snapshot_id: 12 }),
    ]
}

/// Recomputes both checksums after a test edited header or body bytes, so
/// only the structural checks can refuse the message.
fn reseal(bytes: &mut [u8]) {
    let body_len = bytes.len() - HEADER_LEN;
    // An unknown command's body is refused before any checksum.
    let covered = Command::from_u8(bytes[5]).map_or(body_len, |c| body_checksum_len(c, body_len));
    let body_sum = checksum(&bytes[HEADER_LEN..HEADER_LEN + covered]);
    bytes[16..24].copy_from_slice(&body_sum.to_le_bytes());
    let mut head = [0u8; HEADER_LEN];
    head.copy_from_slice(&bytes[..HEADER_LEN]);
    head[8..16].fill(0);
    let sum = checksum(&head);
    bytes[8..16].copy_from_slice(&sum.to_le_bytes());
}

/// Sets the header's body_len to the body actually present.
fn fix_body_len(bytes: &mut [u8]) {
    let len = (bytes.len() - HEADER_LEN) as u32;
    bytes[48..52].copy_from_slice(&len.to_le_bytes());
}

fn decode(bytes: &[u8]) -> Result<Message<'_>, ReplicationError> {
    Message::decode(bytes, &limits())
}

fn refuse(bytes: &[u8]) -> ReplicationError {
    decode(bytes).expect_err("message must be refused")
}

/// Encode, decode, encode again: same bytes, same fields.
fn assert_round_trip(env: &Envelope, spec: &Spec) {
    let msg = Message {
        envelope: *env,
        body: spec.body(),
    };
    let bytes = encode(&msg);
    let decoded = decode(&bytes).expect("decode");
    assert_eq!(decoded.envelope, *env);
    assert_eq!(decoded.command(), msg.command());
    assert_eq!(format!("{:?}", decoded.body), format!("{:?}", msg.body));
    assert_eq!(encode(&decoded), bytes);
}

fn assert_every_truncation_refused(bytes: &[u8]) {
    for len in 0..bytes.len() {
        let needed = if len < HEADER_LEN {
            HEADER_LEN
        } else {
            bytes.len()
        };
        assert_eq!(
            decode(&bytes[..len]).map(|_| ()),
            Err(ReplicationError::Truncated {
                needed,
                available: len
            }),
            "cut at {len} of {}",
            bytes.len()
        );
    }
}

/// A corrupted header byte is caught by the field read before the checksum
/// (magic, version, header_len) or by the header checksum; a corrupted body
/// byte by the body checksum, but in a Chunk's data, which the body
/// checksum does not cover (the receiver checks it against the manifest):
/// that decodes, with the flipped byte in the data.
fn assert_flip_refused(bytes: &[u8], i: usize, mask: u8) {
    let mut bad = bytes.to_vec();
    bad[i] ^= mask;
    let chunk_data = HEADER_LEN + 16;
    if bytes[5] == Command::Chunk as u8 && i >= chunk_data {
        let msg = Message::decode(&bad, &ReplicationLimits::default()).expect("data not covered");
        let Body::Chunk(c) = msg.body else {
            panic!("a chunk decodes as a chunk")
        };
        assert_eq!(c.data[i - chunk_data], bytes[i] ^ mask, "byte {i}");
        return;
    }
    let err = refuse(&bad);
    let ok = match i {
        0..4 => matches!(err, ReplicationError::BadMagic(_)),
        4 => matches!(err, ReplicationError::UnsupportedVersion(_)),
        6..8 => matches!(err, ReplicationError::HeaderLength { .. }),
        _ if i < HEADER_LEN => matches!(err, ReplicationError::HeaderChecksum { .. }),
        _ => matches!(err, ReplicationError::BodyChecksum { .. }),
    };
    assert!(ok, "byte {i} mask {mask:#04x}: {err}");
}

#[test]
fn samples_round_trip() {
    let specs = samples();
    let commands: std::collections::BTreeSet<u8> = specs
        .iter()
        .map(|s| {
            assert_round_trip(&ENV, s);
            s.body().command() as u8
        })
        .collect();
    assert_eq!(commands.len(), 16, "every command has a sample");
}

#[test]
fn every_truncation_of_every_sample_refused() {
    for spec in samples() {
        assert_every_truncation_refused(&encode_spec(&ENV, &spec));
    }
}

#[test]
fn every_bit_flip_of_every_sample_refused() {
    for spec in samples() {
        let bytes = encode_spec(&ENV, &spec);
        for i in 0..bytes.len() {
            for bit in 0..8 {
                assert_flip_refused(&bytes, i, 1 << bit);
            }
            for mask in [0xFF, 0x5A, 0xA5] {
                assert_flip_refused(&bytes, i, mask);
            }
        }
    }
}

#[test]
fn trailing_bytes_refused() {
    let mut bytes = encode_spec(&ENV, &samples()[1]);
    bytes.push(0);
    assert_eq!(
        decode(&bytes).map(|_| ()),
        Err(ReplicationError::TrailingBytes { extra: 1 })
    );
}

// ---- strategies ----

fn envelope() -> impl Strategy<Value = Envelope> {
    (any::<u128>(), any::<u32>(), any::<u8>(), 0u32..1_000).prop_map(
        |(cluster_id, partition_id, replica, view)| Envelope {
            cluster_id,
            partition_id,
            replica,
            view,
        },
    )
}

/// Views for a run of `len` ops: non-decreasing, at most `view_max`.
fn run_views(len: usize, view_max: u32) -> impl Strategy<Value = Vec<u32>> {
    prop::collection::vec(0..=view_max, len).prop_map(|mut v| {
        v.sort_unstable();
        v
    })
}

fn spec(env: Envelope) -> impl Strategy<Value = Spec> {
    let view = env.view;
    prop_oneof![
        (1u64..u64::MAX / 8, any::<u8>(), 1u8..8).prop_map(move |(op, c, n)| Spec::Prepare {
            commit: (op - 1).saturating_sub(u64::from(c)),
            batch: batch(&env, op, view, op * 3, op ^ 0x77, n),
        }),
        (1u64.., any::<u64>()).prop_map(|(op, prepare_checksum)| {
            Spec::PrepareOk(PrepareOk {
                op,
                prepare_checksum,
            })
        }),
        (1u64.., any::<u64>()).prop_map(|(commit, commit_checksum)| Spec::Commit(Commit {
            commit,
            commit_checksum
        })),
        Just(Spec::StartViewChange),
        (0..=view, 1u64..1 << 40, any::<u64>(), 0usize..8).prop_flat_map(
            move |(log_view, first_op, commit, len)| {
                run_views(len, log_view).prop_map(move |views| {
                    let log = chain(&env, first_op, &views, &[1, 2]);
                    Spec::DoViewChange(DoViewChange {
                        log_view,
                        op: first_op + len as u64 - 1,
                        head_checksum: last_checksum(&headers(&log)),
                        commit,
                        suffix: headers(&log),
                    })
                })
            }
        ),
        (1u64..1 << 40, any::<u64>(), 1usize..8).prop_flat_map(move |(first_op, nonce, len)| {
            run_views(len, view).prop_map(move |views| {
                let log = chain(&env, first_op, &views, &[1, 3]);
                let op = first_op + len as u64 - 1;
                Spec::StartView(StartView {
                    op,
                    head_checksum: last_checksum(&headers(&log)),
                    commit: op - (nonce % (len as u64)),
                    nonce,
                    suffix: headers(&log),
                })
            })
        }),
        any::<u64>().prop_map(|nonce| Spec::RequestStartView(RequestStartView { nonce })),
        any::<u64>().prop_map(|nonce| Spec::ViewNotice(ViewNotice { nonce })),
        (1u64..u64::MAX / 2, 0u64..1000).prop_map(|(op_min, n)| Spec::RequestPrepares(
            RequestPrepares {
                op_min,
                op_max: op_min + n
            }
        )),
        (1u64..1 << 40, any::<u64>(), 1usize..6).prop_flat_map(move |(first_op, commit, len)| {
            run_views(len, view).prop_map(move |views| Spec::Prepares {
                commit,
                batches: chain(&env, first_op, &views, &[2, 1, 5]),
            })
        }),
        (
            0u64..u64::MAX / 2,
            0u64..100,
            1u64..100,
            any::<u64>(),
            any::<u64>(),
            any::<bool>()
        )
            .prop_map(
                |(op_min, n, d, log_start_offset, purge_generation, purged)| {
                    Spec::RangeEvicted(RangeEvicted {
                        op_min,
                        op_max: op_min + n,
                        op_held_min: op_min + d,
                        log_start_offset,
                        purge_generation,
                        reason: if purged {
                            EvictedReason::Purged
                        } else {
                            EvictedReason::Retired
                        },
                    })
                }
            ),
        transfer_spec(env),
    ]
}

fn refusal_reason() -> impl Strategy<Value = Refusal> {
    prop_oneof![
        Just(Refusal::Busy),
        Just(Refusal::NotNormal),
        Just(Refusal::NotAhead),
        Just(Refusal::Unavailable),
    ]
}

/// The state-transfer commands.
fn transfer_spec(env: Envelope) -> impl Strategy<Value = Spec> {
    prop_oneof![
        (1u64.., any::<u64>(), any::<u64>()).prop_map(|(nonce, commit, purge_generation)| {
            Spec::RequestSnapshot(RequestSnapshot {
                nonce,
                commit,
                purge_generation,
            })
        }),
        (
            1u64..,
            1u64..,
            0u64..1 << 40,
            prop::collection::vec(1u64..20_000, 0..4)
        )
            .prop_map(
                move |(nonce, id, commit, lengths)| Spec::SnapshotOffer(offer(
                    &env, nonce, id, commit, &lengths
                ))
            ),
        (1u64.., refusal_reason())
            .prop_map(|(nonce, reason)| Spec::SnapshotOffer(refusal(nonce, 0, reason))),
        (1u64..).prop_map(|id| Spec::SnapshotOffer(refusal(0, id, Refusal::UnknownSnapshot))),
        (
            1u64..,
            prop::collection::btree_set((0u32..4, any::<u32>()), 1..40)
        )
            .prop_map(|(snapshot_id, set)| {
                let pairs: Vec<(u32, u32)> = set.into_iter().collect();
                Spec::RequestChunks(RequestChunks {
                    snapshot_id,
                    keys: keys(&pairs),
                })
            }),
        (
            1u64..,
            any::<u32>(),
            any::<u32>(),
            prop::collection::vec(any::<u8>(), 1..600)
        )
            .prop_map(|(snapshot_id, artifact, chunk, data)| Spec::Chunk {
                snapshot_id,
                key: ChunkKey { artifact, chunk },
                data,
            }),
        (1u64..).prop_map(|snapshot_id| Spec::ReleaseSnapshot(ReleaseSnapshot { snapshot_id })),
    ]
}

fn case() -> impl Strategy<Value = (Envelope, Spec)> {
    envelope().prop_flat_map(|env| spec(env).prop_map(move |s| (env, s)))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn round_trip((env, spec) in case()) {
        assert_round_trip(&env, &spec);
    }

    #[test]
    fn random_flip_refused(
        (env, spec) in case(),
        pos in any::<prop::sample::Index>(),
        mask in 1u8..=255,
    ) {
        let bytes = encode_spec(&env, &spec);
        assert_flip_refused(&bytes, pos.index(bytes.len()), mask);
    }
}

proptest! {
    // Each case walks every prefix, so fewer cases.
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn every_truncation_refused((env, spec) in case()) {
        assert_every_truncation_refused(&encode_spec(&env, &spec));
    }
}

// ---- header rules ----

fn sample_bytes(command: Command) -> Vec<u8> {
    let spec = samples()
        .into_iter()
        .find(|s| s.body().command() == command)
        .expect("sample");
    encode_spec(&ENV, &spec)
}

#[test]
fn bad_magic_refused() {
    let mut bytes = sample_bytes(Command::Commit);
    bytes[0..4].copy_from_slice(b"RLGB");
    reseal(&mut bytes);
    assert_eq!(
        refuse(&bytes),
        ReplicationError::BadMagic(u32::from_le_bytes(*b"RLGB"))
    );
    assert_eq!(MAGIC, u32::from_le_bytes(*b"RLGR"));
}

#[test]
fn unknown_versions_refused() {
    for version in [0u8, 2, 3, 0x80, 0xFF] {
        let mut bytes = sample_bytes(Command::Commit);
        bytes[4] = version;
        reseal(&mut bytes);
        assert_eq!(
            refuse(&bytes),
            ReplicationError::UnsupportedVersion(version)
        );
    }
}

/// A version-1 header is exactly 64 bytes: a longer (later-version) or
/// shorter header under version 1 is refused, not skipped.
#[test]
fn wrong_header_len_refused() {
    for header_len in [0u16, 63, 65, 128, u16::MAX] {
        let mut bytes = sample_bytes(Command::Commit);
        bytes[6..8].copy_from_slice(&header_len.to_le_bytes());
        reseal(&mut bytes);
        assert_eq!(
            refuse(&bytes),
            ReplicationError::HeaderLength {
                version: 1,
                header_len,
                expected: 64
            }
        );
    }
}

#[test]
fn unknown_commands_refused() {
    for command in (0u8..=255).filter(|&c| Command::from_u8(c).is_none()) {
        let mut bytes = sample_bytes(Command::Commit);
        bytes[5] = command;
        reseal(&mut bytes);
        assert_eq!(refuse(&bytes), ReplicationError::UnknownCommand(command));
    }
}

#[test]
fn non_zero_header_reserved_refused() {
    for i in 53..HEADER_LEN {
        let mut bytes = sample_bytes(Command::Commit);
        bytes[i] = 1;
        reseal(&mut bytes);
        assert_eq!(
            refuse(&bytes),
            ReplicationError::NonZeroReserved {
                field: "header reserved"
            },
            "byte {i}"
        );
    }
}

/// A message resealed as another command must not decode as that command.
#[test]
fn body_of_another_command_refused() {
    let fixed = [
        Command::PrepareOk,
        Command::Commit,
        Command::StartViewChange,
        Command::RequestStartView,
        Command::ViewNotice,
        Command::RequestPrepares,
        Command::RangeEvicted,
        Command::RequestSnapshot,
        Command::ReleaseSnapshot,
    ];
    for spec in samples() {
        let from = spec.body().command();
        for to in fixed.into_iter().filter(|&c| c != from) {
            // Same-size fixed bodies are each other's valid encodings.
            let same_size = [[from, to], [to, from]].iter().any(|pair| {
                pair.iter().all(|c| {
                    matches!(
                        c,
                        Command::PrepareOk | Command::Commit | Command::RequestPrepares
                    )
                }) || pair.iter().all(|c| {
                    matches!(
                        c,
                        Command::RequestStartView | Command::ViewNotice | Command::ReleaseSnapshot
                    )
                })
            });
            if same_size {
                continue;
            }
            let mut bytes = encode_spec(&ENV, &spec);
            bytes[5] = to as u8;
            reseal(&mut bytes);
            let err = refuse(&bytes);
            assert!(
                matches!(err, ReplicationError::BodySize { command, .. } if command == to),
                "{from:?} as {to:?}: {err}"
            );
        }
    }
}

// ---- limits: refused before allocation ----

/// A header declaring a 4 GiB body, followed by 10 bytes: refused from the
/// header alone, at once.
#[test]
fn huge_declared_body_refused_at_once() {
    let mut bytes = sample_bytes(Command::StartViewChange);
    bytes.extend_from_slice(&[0u8; 10]);
    bytes[48..52].copy_from_slice(&u32::MAX.to_le_bytes());
    reseal(&mut bytes);
    let start = Instant::now();
    assert_eq!(
        refuse(&bytes),
        ReplicationError::BodyTooLarge {
            body_len: u64::from(u32::MAX),
            max: u64::from(limits().body_bytes_max),
        }
    );
    assert!(start.elapsed() < Duration::from_millis(100));
}

#[test]
fn body_bytes_max_is_enforced() {
    let bytes = sample_bytes(Command::Prepare);
    let body_len = (bytes.len() - HEADER_LEN) as u32;
    let tight = ReplicationLimits {
        body_bytes_max: body_len,
        ..limits()
    };
    Message::decode(&bytes, &tight).expect("at the limit");
    let tighter = ReplicationLimits {
        body_bytes_max: body_len - 1,
        ..limits()
    };
    assert_eq!(
        Message::decode(&bytes, &tighter).map(|_| ()),
        Err(ReplicationError::BodyTooLarge {
            body_len: u64::from(body_len),
            max: u64::from(body_len - 1),
        })
    );
}

/// Byte offset of the count field in a DoViewChange / StartView body.
const SUFFIX_COUNT_AT: usize = HEADER_LEN + 32;
const PREPARES_COUNT_AT: usize = HEADER_LEN + 8;

#[test]
fn suffix_headers_max_is_enforced() {
    for command in [Command::DoViewChange, Command::StartView] {
        let bytes = sample_bytes(command);
        let at = ReplicationLimits {
            suffix_headers_max: 4,
            ..limits()
        };
        Message::decode(&bytes, &at).expect("at the limit");
        let below = ReplicationLimits {
            suffix_headers_max: 3,
            ..limits()
        };
        assert_eq!(
            Message::decode(&bytes, &below).map(|_| ()),
            Err(ReplicationError::LimitExceeded {
                command,
                field: "suffix headers",
                value: 4,
                max: 3
            })
        );
        // A count of u32::MAX with no headers behind it: refused by the
        // limit before anything is sized by it.
        let mut bad = bytes[..SUFFIX_COUNT_AT + 8].to_vec();
        bad[SUFFIX_COUNT_AT..SUFFIX_COUNT_AT + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        fix_body_len(&mut bad);
        reseal(&mut bad);
        assert!(matches!(
            refuse(&bad),
            ReplicationError::LimitExceeded { value, .. } if value == u64::from(u32::MAX)
        ));
        // Within the limit but more than the bytes hold.
        bad[SUFFIX_COUNT_AT..SUFFIX_COUNT_AT + 4].copy_from_slice(&1000u32.to_le_bytes());
        reseal(&mut bad);
        assert_eq!(
            refuse(&bad),
            ReplicationError::BodySize {
                command,
                body_len: 40,
                expected: 40 + 1000 * 96
            }
        );
    }
}

#[test]
fn prepares_batches_max_is_enforced() {
    let bytes = sample_bytes(Command::Prepares);
    let at = ReplicationLimits {
        prepares_batches_max: 3,
        ..limits()
    };
    Message::decode(&bytes, &at).expect("at the limit");
    let below = ReplicationLimits {
        prepares_batches_max: 2,
        ..limits()
    };
    assert_eq!(
        Message::decode(&bytes, &below).map(|_| ()),
        Err(ReplicationError::LimitExceeded {
            command: Command::Prepares,
            field: "batches",
            value: 3,
            max: 2
        })
    );
    let mut bad = bytes.clone();
    bad[PREPARES_COUNT_AT..PREPARES_COUNT_AT + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    reseal(&mut bad);
    assert!(matches!(
        refuse(&bad),
        ReplicationError::LimitExceeded { field: "batches", value, .. } if value == u64::from(u32::MAX)
    ));
    // Within the limit, but the bytes cannot hold that many batches.
    bad[PREPARES_COUNT_AT..PREPARES_COUNT_AT + 4].copy_from_slice(&200u32.to_le_bytes());
    reseal(&mut bad);
    assert!(matches!(
        refuse(&bad),
        ReplicationError::CountExceedsBody { count: 200, .. }
    ));
}

#[test]
fn prepares_bytes_max_is_enforced() {
    let bytes = sample_bytes(Command::Prepares);
    let batch_bytes = (bytes.len() - HEADER_LEN - 16) as u32;
    let at = ReplicationLimits {
        prepares_bytes_max: batch_bytes,
        ..limits()
    };
    Message::decode(&bytes, &at).expect("at the limit");
    let below = ReplicationLimits {
        prepares_bytes_max: batch_bytes - 1,
        ..limits()
    };
    assert_eq!(
        Message::decode(&bytes, &below).map(|_| ()),
        Err(ReplicationError::LimitExceeded {
            command: Command::Prepares,
            field: "batch bytes",
            value: u64::from(batch_bytes),
            max: u64::from(batch_bytes - 1)
        })
    );
}

// ---- body rules ----

fn put_u64(bytes: &mut [u8], at: usize, v: u64) {
    bytes[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

fn resealed(mut bytes: Vec<u8>, edit: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    edit(&mut bytes);
    fix_body_len(&mut bytes);
    reseal(&mut bytes);
    bytes
}

#[test]
fn fixed_bodies_must_have_their_exact_length() {
    for command in [
        Command::PrepareOk,
        Command::Commit,
        Command::StartViewChange,
        Command::RequestStartView,
        Command::ViewNotice,
        Command::RequestPrepares,
        Command::RangeEvicted,
    ] {
        let bytes = sample_bytes(command);
        let expected = bytes.len() - HEADER_LEN;
        let longer = resealed(bytes.clone(), |b| b.push(0));
        assert_eq!(
            refuse(&longer),
            ReplicationError::BodySize {
                command,
                body_len: expected + 1,
                expected
            }
        );
        if expected > 0 {
            let shorter = resealed(bytes, |b| {
                b.pop();
            });
            assert_eq!(
                refuse(&shorter),
                ReplicationError::BodySize {
                    command,
                    body_len: expected - 1,
                    expected
                }
            );
        }
    }
}

/// A backup must be able to trust that the Prepare's fields are the batch's.
#[test]
fn prepare_must_agree_with_its_batch() {
    let bytes = sample_bytes(Command::Prepare);
    let op_at = HEADER_LEN;
    let err = refuse(&resealed(bytes.clone(), |b| put_u64(b, op_at, 24)));
    assert!(matches!(
        err,
        ReplicationError::Mismatch {
            field: "op",
            message: 24,
            batch: 23,
            ..
        }
    ));
    let err = refuse(&resealed(bytes.clone(), |b| b[44] += 1));
    assert!(matches!(
        err,
        ReplicationError::Mismatch { field: "view", .. }
    ));
    let err = refuse(&resealed(bytes.clone(), |b| b[40] ^= 1));
    assert!(matches!(
        err,
        ReplicationError::Mismatch {
            field: "partition_id",
            ..
        }
    ));
    let err = refuse(&resealed(bytes.clone(), |b| put_u64(b, op_at + 8, 23)));
    assert!(matches!(
        err,
        ReplicationError::Invalid {
            field: "commit",
            value: 23,
            ..
        }
    ));
    // Bytes after the batch.
    let err = refuse(&resealed(bytes.clone(), |b| b.push(0)));
    assert!(matches!(
        err,
        ReplicationError::BodySize {
            command: Command::Prepare,
            ..
        }
    ));
    // No batch at all.
    let err = refuse(&resealed(bytes, |b| b.truncate(HEADER_LEN + 16)));
    assert!(matches!(err, ReplicationError::Batch { index: 0, .. }));
}

/// Corruption inside the carried batch, even under a valid message
/// checksum, is caught by the batch parser.
#[test]
fn every_flip_inside_a_prepared_batch_refused() {
    let bytes = sample_bytes(Command::Prepare);
    for i in HEADER_LEN + 16..bytes.len() {
        for mask in [0x01u8, 0x80, 0xFF] {
            let bad = resealed(bytes.clone(), |b| b[i] ^= mask);
            let err = refuse(&bad);
            assert!(
                matches!(
                    err,
                    ReplicationError::Batch {
                        command: Command::Prepare,
                        index: 0,
                        ..
                    }
                ),
                "byte {i} mask {mask:#04x}: {err}"
            );
        }
    }
}

#[test]
fn prepares_batches_must_be_a_valid_run() {
    let bytes = sample_bytes(Command::Prepares);
    let err = refuse(&resealed(bytes.clone(), |b| {
        b[PREPARES_COUNT_AT..PREPARES_COUNT_AT + 4].copy_from_slice(&0u32.to_le_bytes());
        b.truncate(HEADER_LEN + 16);
    }));
    assert!(matches!(
        err,
        ReplicationError::Invalid {
            field: "count",
            value: 0,
            ..
        }
    ));
    let err = refuse(&resealed(bytes.clone(), |b| b[HEADER_LEN + 12] = 1));
    assert_eq!(
        err,
        ReplicationError::NonZeroReserved {
            field: "prepares reserved"
        }
    );
    // A count one short leaves a whole batch unread.
    let err = refuse(&resealed(bytes.clone(), |b| {
        b[PREPARES_COUNT_AT..PREPARES_COUNT_AT + 4].copy_from_slice(&2u32.to_le_bytes());
    }));
    assert!(matches!(
        err,
        ReplicationError::BodySize {
            command: Command::Prepares,
            ..
        }
    ));

    // Batches out of order: swap the first two.
    let log = chain(&ENV, 20, &[3, 3, 5, 6], &[1, 4, 2]);
    let swapped = [log[2].clone(), log[1].clone(), log[3].clone()];
    let err = refuse(&prepares_raw(&swapped));
    assert!(matches!(err, ReplicationError::BrokenRun { index: 1, .. }));
    // A gap: op 21 then op 23.
    let gap = [log[1].clone(), log[3].clone()];
    let err = refuse(&prepares_raw(&gap));
    assert!(matches!(
        err,
        ReplicationError::BrokenRun {
            index: 1,
            reason: "does not follow the previous op",
            ..
        }
    ));
    // A batch of a newer view than the sender's.
    let future = chain(&ENV, 20, &[3, ENV.view + 1], &[1]);
    let err = refuse(&prepares_raw(&future));
    assert!(matches!(
        err,
        ReplicationError::BrokenRun {
            index: 1,
            reason: "has a view above the message's",
            ..
        }
    ));
}

/// Encodes a Prepares around `batches` without the encoder's checks.
fn prepares_raw(batches: &[Vec<u8>]) -> Vec<u8> {
    let first = [batches[0].clone()];
    let mut bytes = encode_spec(
        &ENV,
        &Spec::Prepares {
            commit: 1,
            batches: first.to_vec(),
        },
    );
    bytes.truncate(HEADER_LEN + 16);
    bytes[PREPARES_COUNT_AT..PREPARES_COUNT_AT + 4]
        .copy_from_slice(&(batches.len() as u32).to_le_bytes());
    for b in batches {
        bytes.extend_from_slice(b);
    }
    resealed(bytes, |_| {})
}

/// Encodes a StartView (op = the last header's op) without the encoder's
/// checks, from raw 96-byte headers.
fn start_view_raw(env: &Envelope, headers: &[[u8; 96]], op: u64) -> Vec<u8> {
    let mut bytes = encode_spec(
        env,
        &Spec::StartView(StartView {
            op: 0,
            head_checksum: 0,
            commit: 0,
            nonce: 1,
            suffix: vec![],
        }),
    );
    put_u64(&mut bytes, HEADER_LEN, op);
    if let Some(last) = headers.last() {
        bytes[HEADER_LEN + 8..HEADER_LEN + 16].copy_from_slice(&last[8..16]);
    }
    bytes[SUFFIX_COUNT_AT..SUFFIX_COUNT_AT + 4]
        .copy_from_slice(&(headers.len() as u32).to_le_bytes());
    for h in headers {
        bytes.extend_from_slice(h);
    }
    resealed(bytes, |_| {})
}

fn raw_headers(batches: &[Vec<u8>]) -> Vec<[u8; 96]> {
    batches
        .iter()
        .map(|b| b[..96].try_into().expect("96"))
        .collect()
}

#[test]
fn suffix_must_be_a_valid_run_ending_at_op() {
    let log = chain(&ENV, 20, &[3, 3, 5, 6], &[1, 4, 2]);
    let h = raw_headers(&log);
    start_view_raw_ok(&h, 23);
    let cases: [(&[[u8; 96]], u64, &str); 3] = [
        (&[h[0], h[2]], 22, "does not follow the previous op"),
        (&[h[1], h[0]], 20, "does not follow the previous op"),
        (&[h[0], h[1], h[3]], 23, "does not follow the previous op"),
    ];
    for (headers, op, reason) in cases {
        let err = refuse(&start_view_raw(&ENV, headers, op));
        assert!(
            matches!(err, ReplicationError::BrokenRun { reason: r, .. } if r == reason),
            "{err}"
        );
    }
    let zero = chain(&ENV, 0, &[3], &[1]);
    let err = refuse(&start_view_raw(&ENV, &raw_headers(&zero), 0));
    assert!(matches!(
        err,
        ReplicationError::BrokenRun {
            reason: "has op 0, which is never prepared",
            ..
        }
    ));
    // Last header is not op.
    let err = refuse(&start_view_raw(&ENV, &h, 24));
    assert!(matches!(
        err,
        ReplicationError::Mismatch {
            field: "op",
            message: 24,
            batch: 23,
            ..
        }
    ));
    // Op 21 of another history: right op, view and offset, wrong link.
    let forked = fork_after(&log[0]);
    let mixed = [h[0], raw_headers(std::slice::from_ref(&forked))[0]];
    let err = refuse(&start_view_raw(&ENV, &mixed, 21));
    assert!(matches!(
        err,
        ReplicationError::BrokenRun {
            index: 1,
            reason: "does not link to the previous checksum",
            ..
        }
    ));
    let err = refuse(&prepares_raw(&[log[0].clone(), forked]));
    assert!(matches!(
        err,
        ReplicationError::BrokenRun {
            index: 1,
            reason: "does not link to the previous checksum",
            ..
        }
    ));
    // Right op and link, but not starting where the previous batch ended.
    let h0 = BatchHeader::decode(&log[0]).expect("header");
    let shifted = batch(&ENV, 21, 3, h0.next_offset() + 1, h0.header_checksum, 1);
    let err = refuse(&prepares_raw(&[log[0].clone(), shifted]));
    assert!(matches!(
        err,
        ReplicationError::BrokenRun {
            index: 1,
            reason: "does not start at the previous next offset",
            ..
        }
    ));
    // Views decreasing along the ops.
    let down = chain(&ENV, 20, &[5, 3], &[1]);
    let err = refuse(&start_view_raw(&ENV, &raw_headers(&down), 21));
    assert!(matches!(
        err,
        ReplicationError::BrokenRun {
            reason: "has a view below the previous op's",
            ..
        }
    ));
    // Another partition's headers.
    let foreign_env = Envelope {
        partition_id: ENV.partition_id + 1,
        ..ENV
    };
    let foreign = chain(&foreign_env, 20, &[3], &[1]);
    let err = refuse(&start_view_raw(&ENV, &raw_headers(&foreign), 20));
    assert!(matches!(
        err,
        ReplicationError::BrokenRun {
            reason: "belongs to another partition",
            ..
        }
    ));
    // A corrupted header inside the suffix (message checksum resealed).
    let mut bad = start_view_raw(&ENV, &h, 23);
    bad[HEADER_LEN + 40 + 96 + 40] ^= 1;
    let bad = resealed(bad, |_| {});
    assert!(matches!(
        refuse(&bad),
        ReplicationError::Batch { index: 1, .. }
    ));
}

/// The batch that would follow `prev` in every field but its chain link.
fn fork_after(prev: &[u8]) -> Vec<u8> {
    let p = BatchHeader::decode(prev).expect("header");
    batch(
        &ENV,
        p.vsr_op + 1,
        p.vsr_view,
        p.next_offset(),
        p.header_checksum ^ 1,
        1,
    )
}

fn start_view_raw_ok(headers: &[[u8; 96]], op: u64) {
    decode(&start_view_raw(&ENV, headers, op)).expect("valid suffix");
}

#[test]
fn do_view_change_rules() {
    let bytes = sample_bytes(Command::DoViewChange);
    // log_view above the message's view.
    let err = refuse(&resealed(bytes.clone(), |b| {
        b[HEADER_LEN..HEADER_LEN + 4].copy_from_slice(&(ENV.view + 1).to_le_bytes());
    }));
    assert!(matches!(
        err,
        ReplicationError::Invalid {
            field: "log_view",
            ..
        }
    ));
    // Suffix views above log_view: the sample's last header is view 6.
    let err = refuse(&resealed(bytes.clone(), |b| {
        b[HEADER_LEN..HEADER_LEN + 4].copy_from_slice(&5u32.to_le_bytes());
    }));
    assert!(matches!(
        err,
        ReplicationError::BrokenRun {
            index: 3,
            reason: "has a view above the message's",
            ..
        }
    ));
    for (at, field) in [(4, "log_view reserved"), (36, "suffix reserved")] {
        let err = refuse(&resealed(bytes.clone(), |b| b[HEADER_LEN + at] = 1));
        assert_eq!(err, ReplicationError::NonZeroReserved { field });
    }
}

#[test]
fn start_view_rules() {
    let bytes = sample_bytes(Command::StartView);
    let err = refuse(&resealed(bytes.clone(), |b| {
        put_u64(b, HEADER_LEN + 16, 24)
    }));
    assert!(matches!(
        err,
        ReplicationError::Invalid {
            field: "commit",
            value: 24,
            ..
        }
    ));
    // A head checksum that is not the suffix's last header's.
    let err = refuse(&resealed(bytes.clone(), |b| b[HEADER_LEN + 8] ^= 1));
    assert!(matches!(
        err,
        ReplicationError::Mismatch {
            field: "head_checksum",
            ..
        }
    ));
    let err = refuse(&resealed(bytes, |b| b[HEADER_LEN + 36] = 1));
    assert_eq!(
        err,
        ReplicationError::NonZeroReserved {
            field: "suffix reserved"
        }
    );
}

#[test]
fn small_message_rules() {
    let ok = sample_bytes(Command::PrepareOk);
    let err = refuse(&resealed(ok, |b| put_u64(b, HEADER_LEN, 0)));
    assert!(matches!(
        err,
        ReplicationError::Invalid {
            field: "op",
            value: 0,
            ..
        }
    ));

    let commit = sample_bytes(Command::Commit);
    let err = refuse(&resealed(commit, |b| put_u64(b, HEADER_LEN, 0)));
    assert!(matches!(
        err,
        ReplicationError::Invalid {
            field: "commit_checksum",
            ..
        }
    ));

    let rp = sample_bytes(Command::RequestPrepares);
    let err = refuse(&resealed(rp.clone(), |b| put_u64(b, HEADER_LEN, 0)));
    assert!(matches!(
        err,
        ReplicationError::Invalid {
            field: "op_min",
            value: 0,
            ..
        }
    ));
    let err = refuse(&resealed(rp, |b| put_u64(b, HEADER_LEN + 8, 19)));
    assert!(matches!(
        err,
        ReplicationError::Invalid {
            field: "op_max",
            value: 19,
            ..
        }
    ));
}

#[test]
fn range_evicted_rules() {
    let bytes = sample_bytes(Command::RangeEvicted);
    let reason_at = HEADER_LEN + 40;
    for reason in [0u8, 3, 0xFF] {
        let err = refuse(&resealed(bytes.clone(), |b| b[reason_at] = reason));
        assert!(
            matches!(err, ReplicationError::Invalid { field: "reason", value, .. } if value == u64::from(reason))
        );
    }
    let purged = resealed(bytes.clone(), |b| {
        b[reason_at] = EvictedReason::Purged as u8
    });
    decode(&purged).expect("purged is a known reason");
    for i in reason_at + 1..bytes.len() {
        let err = refuse(&resealed(bytes.clone(), |b| b[i] = 1));
        assert_eq!(
            err,
            ReplicationError::NonZeroReserved {
                field: "range evicted reserved"
            }
        );
    }
    let err = refuse(&resealed(bytes.clone(), |b| put_u64(b, HEADER_LEN + 8, 2)));
    assert!(matches!(
        err,
        ReplicationError::Invalid {
            field: "op_max",
            value: 2,
            ..
        }
    ));
    let err = refuse(&resealed(bytes, |b| put_u64(b, HEADER_LEN + 16, 3)));
    assert!(matches!(
        err,
        ReplicationError::Invalid {
            field: "op_held_min",
            value: 3,
            ..
        }
    ));
}

/// The encoder runs the decoder's checks, so a replica cannot emit what
/// its peers must refuse; a refused encode leaves the buffer untouched.
#[test]
fn encoder_refuses_what_the_decoder_refuses() {
    let log = chain(&ENV, 20, &[3, 3], &[1]);
    let gap = chain(&ENV, 30, &[3], &[1]);
    let broken = [log[0].clone(), gap[0].clone()];
    let bodies = [
        Body::Prepares(Prepares {
            commit: 1,
            batches: vec![],
        }),
        Body::Prepares(Prepares {
            commit: 1,
            batches: views(&broken),
        }),
        Body::RequestPrepares(RequestPrepares {
            op_min: 5,
            op_max: 4,
        }),
        Body::PrepareOk(PrepareOk {
            op: 0,
            prepare_checksum: 1,
        }),
        Body::DoViewChange(DoViewChange {
            log_view: ENV.view + 1,
            op: 0,
            head_checksum: 0,
            commit: 0,
            suffix: vec![],
        }),
        Body::StartView(StartView {
            op: 20,
            head_checksum: last_checksum(&headers(&log)),
            commit: 20,
            nonce: 0,
            suffix: headers(&log),
        }),
        Body::RangeEvicted(RangeEvicted {
            op_min: 5,
            op_max: 9,
            op_held_min: 5,
            log_start_offset: 0,
            purge_generation: 0,
            reason: EvictedReason::Purged,
        }),
        Body::Prepare(Prepare {
            op: 21,
            commit: 0,
            batch: BatchView::parse(&log[0]).expect("batch"),
        }),
    ];
    for body in bodies {
        let mut out = vec![7u8; 3];
        let msg = Message {
            envelope: ENV,
            body,
        };
        assert!(msg.encode(&mut out).is_err(), "{:?}", msg.body);
        assert_eq!(out, vec![7u8; 3]);
    }
}
