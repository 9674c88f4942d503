//! The client protocol: framed, checksummed requests and responses over TCP.
//!
//! All integers are little-endian with explicit widths. Every message in
//! either direction is one **frame**:
//!
//! ```text
//! u32 body_len        bytes of body; at most the receiver's frame_bytes_max
//! u64 body_checksum   xxh3 (crate::checksum) of the body; of a Produce
//!                     request, of the body up to its batch (the batch's own
//!                     checksums cover the batch; see `split_request`)
//! body:
//!   u16 opcode        request: Opcode; response: opcode | RESPONSE_BIT
//!   u16 error_code    request: 0; response: ErrorCode (0 = ok)
//!   u32 correlation   chosen by the client, echoed in the response
//!   payload           per opcode (below); on error: str16 message
//! ```
//!
//! `str16` is a u16 length then UTF-8 bytes; `bytes32` a u32 length then bytes.
//!
//! A connection starts with `Hello`; anything else first is answered with
//! `HandshakeRequired` and the connection is closed. A frame longer than the
//! limit (`FrameTooLarge`) or whose checksum fails (`BadChecksum`) is answered
//! with an error (correlation 0 when the body could not be trusted) and the
//! connection is closed, since its framing can no longer be trusted. A
//! well-framed request with an unknown opcode or a malformed payload gets an
//! error and the connection stays open.
//!
//! Payloads:
//!
//! ```text
//! Hello         req: u32 magic (WIRE_MAGIC), u16 version_min, u16 version_max, str16 client
//!               resp: u16 version, u32 frame_bytes_max, u32 batch_bytes_max, u16 shards
//! CreateTopic   req: str16 topic, u32 partitions        resp: (empty)
//! DeleteTopic   req: str16 topic                        resp: (empty)
//! ListTopics    req: (empty)                            resp: u32 n, n x TopicSummary
//! DescribeTopic req: str16 topic                        resp: str16 topic, u32 n, n x PartitionInfo
//! Produce       req: str16 topic, u8 target (0: partition u32, 1: key bytes16), bytes32 batch
//!               resp: u32 partition, u64 base_offset, u64 next_offset
//! Fetch         req: str16 topic, u32 partition, u64 offset, u32 max_bytes, u32 wait_ms
//!               resp: u32 partition, u64 next_offset, u64 log_start_offset,
//!                     u64 high_watermark, bytes32 batches
//! Purge         req: str16 topic, u32 partition         resp: (empty)
//! Replicas      req: (empty)                            resp: u32 n (<= REPLICA_ROWS_MAX),
//!                                                             u32 omitted, n x ReplicaInfo
//! TopicSummary  str16 topic, u32 partitions
//! PartitionInfo u32 partition, u32 partition_id, u16 shard, u64 log_start_offset,
//!               u64 high_watermark, u64 size_bytes, u8 fenced
//! ReplicaInfo   str16 topic, u32 partition, u32 partition_id, u16 shard, str16 role,
//!               u64 log_start_offset, u64 frontier, u64 commit, u64 size_bytes,
//!               u64 purge_generation, u32 sealed_segments, u8 has_fault [str16 fault], u8 replicated
//!               [u32 view, u64 op, u64 commit_op, u64 commit_max]
//! ```
//!
//! A produce is answered only after the batch is durable (its fdatasync
//! completed); the offsets in the reply are the ones the server assigned.
//! `high_watermark` is the durable end of the partition's log.

mod error;
mod frame;
mod message;
#[cfg(test)]
mod tests;

pub use error::{ErrorCode, WireError};
pub use frame::{decode_frame_header, encode_frame, FrameHeader, FRAME_HEADER_LEN};
pub use message::{
    split_request, Body, FetchReply, HelloReply, Opcode, PartitionInfo, ProduceHead, ProduceReply,
    ProduceTarget, ReplicaInfo, ReplicaList, ReplicaVsr, Reply, Request, RequestSplit,
    TopicDescription, TopicSummary, FAULT_BYTES_MAX, FETCH_REPLY_HEAD_LEN, PRODUCE_HEAD_BYTES_MAX,
    REPLICA_ROWS_MAX, REPLICA_ROW_BYTES_MAX, RESPONSE_BIT, ROLE_BYTES_MAX,
};

/// "RLWP" as little-endian bytes: identifies a ringlog client.
pub const WIRE_MAGIC: u32 = 0x5057_4C52;
/// The protocol version this build speaks. 2: a Produce request's frame
/// checksum covers its head only (version 1 covered its batch too).
pub const PROTOCOL_VERSION: u16 = 2;
/// Default and hard cap for a frame body. Servers may configure a smaller
/// limit and announce it in the Hello reply.
pub const FRAME_BYTES_MAX: u32 = 64 * 1024 * 1024;
/// Longest topic name (bytes).
pub const TOPIC_NAME_BYTES_MAX: usize = 200;
/// Longest partition key used for key-hash routing.
pub const KEY_BYTES_MAX: usize = 4096;
/// Most partitions per topic.
pub const PARTITIONS_MAX: u32 = 4096;

/// Whether `name` is a valid topic name: 1..=TOPIC_NAME_BYTES_MAX bytes of
/// `[A-Za-z0-9._-]`, not `.` or `..` (it becomes a directory name).
pub fn valid_topic_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= TOPIC_NAME_BYTES_MAX
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// The partition a key routes to: xxh3 of the key, modulo the count. Stable
/// across versions and nodes (the checksum module is the one xxh3).
pub fn partition_for_key(key: &[u8], partitions: u32) -> u32 {
    if partitions == 0 {
        return 0;
    }
    (crate::checksum(key) % u64::from(partitions)) as u32
}
