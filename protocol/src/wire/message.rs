//! Requests and replies: typed messages and their (strict) codecs.

use super::frame::{encode_frame, FRAME_HEADER_LEN};
use super::{ErrorCode, WireError, KEY_BYTES_MAX, TOPIC_NAME_BYTES_MAX, WIRE_MAGIC};
use crate::reader::{usize_from, Reader};

/// Set in a response's opcode.
pub const RESPONSE_BIT: u16 = 0x8000;
/// Bytes of the message header inside a frame body.
const MESSAGE_HEADER_LEN: usize = 8;
/// Error messages are cut to this many bytes on the wire.
const ERROR_MESSAGE_BYTES_MAX: usize = 1024;
/// Bytes of a fetch reply's fields before its batches: partition, three
/// offsets, the batches' length.
const FETCH_FIELDS_LEN: usize = 4 + 3 * 8 + 4;
/// Bytes of an Ok fetch reply frame before its batches (see
/// [`Reply::encode_fetch_head`]).
pub const FETCH_REPLY_HEAD_LEN: usize = FRAME_HEADER_LEN + MESSAGE_HEADER_LEN + FETCH_FIELDS_LEN;
/// Most bytes of a Produce request before its batch: message header, the
/// longest topic, a key target with the longest key, the batch's length.
pub const PRODUCE_HEAD_BYTES_MAX: usize =
    MESSAGE_HEADER_LEN + 2 + TOPIC_NAME_BYTES_MAX + 1 + 2 + KEY_BYTES_MAX + 4;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum Opcode {
    Hello = 1,
    CreateTopic = 2,
    DeleteTopic = 3,
    ListTopics = 4,
    DescribeTopic = 5,
    Produce = 6,
    Fetch = 7,
    Purge = 8,
    Replicas = 9,
}

impl Opcode {
    pub fn from_u16(v: u16) -> Option<Opcode> {
        Some(match v {
            1 => Opcode::Hello,
            2 => Opcode::CreateTopic,
            3 => Opcode::DeleteTopic,
            4 => Opcode::ListTopics,
            5 => Opcode::DescribeTopic,
            6 => Opcode::Produce,
            7 => Opcode::Fetch,
            8 => Opcode::Purge,
            9 => Opcode::Replicas,
            _ => return None,
        })
    }
}

/// Where a produced batch goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProduceTarget {
    Partition(u32),
    /// The partition is `partition_for_key(key, partitions)`.
    Key(Vec<u8>),
}

/// A Produce request up to its batch: what [`split_request`] decodes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProduceHead {
    pub correlation: u32,
    pub topic: String,
    pub target: ProduceTarget,
    /// The batch's declared length: the rest of the body, if well-formed.
    pub batch_len: u32,
    /// Bytes of the body before the batch (what the frame checksum covers).
    pub head_len: usize,
}

/// What the first bytes of a request body say about its checksum.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestSplit {
    /// Too few bytes to tell: read more (a head is at most
    /// [`PRODUCE_HEAD_BYTES_MAX`] bytes).
    NeedMore,
    /// The frame checksum covers the whole body: any request but a Produce
    /// whose head decodes.
    Whole,
    /// A Produce: the frame checksum covers its head; its batch follows.
    Produce(ProduceHead),
}

/// Tells, from the first bytes of a request body, what its frame checksum
/// covers, so a server can read a Produce batch straight into the buffer
/// it will be stored from. A Produce whose head does not decode is
/// `Whole` (its checksum then fails unless it covered the whole body).
pub fn split_request(prefix: &[u8]) -> RequestSplit {
    let mut r = Reader::new(prefix);
    let (Some(opcode), Some(_), Some(correlation)) = (r.u16(), r.u16(), r.u32()) else {
        return RequestSplit::NeedMore;
    };
    if opcode != Opcode::Produce as u16 {
        return RequestSplit::Whole;
    }
    let fields = produce_fields(&mut r).and_then(|(topic, target)| {
        let batch_len = u32_(&mut r, "batch")?;
        Ok((topic, target, batch_len))
    });
    match fields {
        Ok((topic, target, batch_len)) => RequestSplit::Produce(ProduceHead {
            correlation,
            topic,
            target,
            batch_len,
            head_len: prefix.len() - r.remaining(),
        }),
        Err(WireError::Truncated { .. }) => RequestSplit::NeedMore,
        Err(_) => RequestSplit::Whole,
    }
}

/// A Produce request's topic and target.
fn produce_fields(r: &mut Reader<'_>) -> Result<(String, ProduceTarget), WireError> {
    let topic = topic(r)?;
    let target = match u8_(r, "produce target")? {
        0 => ProduceTarget::Partition(u32_(r, "partition")?),
        1 => {
            let key = r.bytes_u16().ok_or(WireError::Truncated { what: "key" })?;
            if key.len() > KEY_BYTES_MAX {
                return Err(WireError::TooLong {
                    what: "key",
                    len: key.len(),
                    max: KEY_BYTES_MAX,
                });
            }
            ProduceTarget::Key(key.to_vec())
        }
        other => {
            return Err(WireError::BadValue {
                what: "produce target",
                value: u64::from(other),
            })
        }
    };
    Ok((topic, target))
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    Hello {
        version_min: u16,
        version_max: u16,
        client: String,
    },
    CreateTopic {
        topic: String,
        partitions: u32,
    },
    DeleteTopic {
        topic: String,
    },
    ListTopics,
    DescribeTopic {
        topic: String,
    },
    Produce {
        topic: String,
        target: ProduceTarget,
        /// One record batch (its offsets are assigned by the server).
        batch: Vec<u8>,
    },
    Fetch {
        topic: String,
        partition: u32,
        offset: u64,
        max_bytes: u32,
        /// Wait up to this long for data when none is available (0: no wait).
        wait_ms: u32,
    },
    Purge {
        topic: String,
        partition: u32,
    },
    /// Every partition replica the node holds, with its replication state
    /// (`ctl partitions` gathers these from every node of a cluster).
    Replicas,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HelloReply {
    pub version: u16,
    pub frame_bytes_max: u32,
    pub batch_bytes_max: u32,
    pub shards: u16,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicSummary {
    pub topic: String,
    pub partitions: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartitionInfo {
    pub partition: u32,
    pub partition_id: u32,
    pub shard: u16,
    pub log_start_offset: u64,
    pub high_watermark: u64,
    pub size_bytes: u64,
    pub fenced: bool,
}

/// Longest role name in a [`ReplicaInfo`].
pub const ROLE_BYTES_MAX: usize = 32;
/// A [`ReplicaInfo`]'s fault reason is cut to this many bytes.
pub const FAULT_BYTES_MAX: usize = 512;
/// Most rows in a Replicas reply: a node holding more lists the first
/// ones, by topic and index, and says how many it left out.
pub const REPLICA_ROWS_MAX: u32 = 65_536;
/// Least bytes of one encoded [`ReplicaInfo`] (empty strings, no VSR).
const REPLICA_ROW_BYTES_MIN: usize = 2 + 4 + 4 + 2 + 2 + 5 * 8 + 4 + 1 + 1;
/// Most bytes of one encoded [`ReplicaInfo`]: a server fits its reply in
/// its frame limit with this.
pub const REPLICA_ROW_BYTES_MAX: usize =
    REPLICA_ROW_BYTES_MIN + TOPIC_NAME_BYTES_MAX + ROLE_BYTES_MAX + 2 + FAULT_BYTES_MAX + 28;

/// One partition replica as a node holds it (a Replicas reply's row).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaInfo {
    pub topic: String,
    pub partition: u32,
    pub partition_id: u32,
    pub shard: u16,
    /// `primary`, `backup`, `view_change`, `recovering`, `wiped`, ...
    pub role: String,
    pub log_start_offset: u64,
    pub frontier: u64,
    pub commit: u64,
    pub size_bytes: u64,
    pub sealed_segments: u32,
    pub purge_generation: u64,
    pub fault: Option<String>,
    /// None for a partition that is not replicated.
    pub vsr: Option<ReplicaVsr>,
}

/// A replicated partition's VSR figures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplicaVsr {
    pub view: u32,
    pub op: u64,
    pub commit_op: u64,
    /// The highest commit this replica heard of in its group.
    pub commit_max: u64,
}

/// A node's replicas: at most [`REPLICA_ROWS_MAX`] rows, and how many
/// more it holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaList {
    pub rows: Vec<ReplicaInfo>,
    pub omitted: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicDescription {
    pub topic: String,
    pub partitions: Vec<PartitionInfo>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProduceReply {
    pub partition: u32,
    pub base_offset: u64,
    pub next_offset: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FetchReply {
    pub partition: u32,
    /// Where the next fetch starts.
    pub next_offset: u64,
    pub log_start_offset: u64,
    /// The durable end of the log.
    pub high_watermark: u64,
    /// Whole record batches, back to back, exactly as stored.
    pub batches: Vec<u8>,
}

/// A successful reply's payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Body {
    Hello(HelloReply),
    Empty,
    Topics(Vec<TopicSummary>),
    Topic(TopicDescription),
    Produced(ProduceReply),
    Fetched(FetchReply),
    Replicas(ReplicaList),
}

/// A response frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    /// The request's opcode (without [`RESPONSE_BIT`]), possibly unknown.
    pub opcode: u16,
    pub correlation: u32,
    pub result: Result<Body, (ErrorCode, String)>,
}

impl Request {
    pub fn opcode(&self) -> Opcode {
        match self {
            Request::Hello { .. } => Opcode::Hello,
            Request::CreateTopic { .. } => Opcode::CreateTopic,
            Request::DeleteTopic { .. } => Opcode::DeleteTopic,
            Request::ListTopics => Opcode::ListTopics,
            Request::DescribeTopic { .. } => Opcode::DescribeTopic,
            Request::Produce { .. } => Opcode::Produce,
            Request::Fetch { .. } => Opcode::Fetch,
            Request::Purge { .. } => Opcode::Purge,
            Request::Replicas => Opcode::Replicas,
        }
    }

    /// The frame of a Produce request up to its batch: `head` followed by
    /// the `batch_len` bytes of the batch is byte for byte what
    /// [`Request::encode`] writes for it (the checksum covers the head
    /// only), so a client sends a batch from where it lies, uncopied.
    pub fn encode_produce_head(
        correlation: u32,
        topic: &str,
        target: &ProduceTarget,
        batch_len: usize,
    ) -> Result<Vec<u8>, WireError> {
        let mut w = Writer::message(Opcode::Produce as u16, 0, correlation);
        w.str16("topic", topic, TOPIC_NAME_BYTES_MAX)?;
        match target {
            ProduceTarget::Partition(p) => {
                w.u8(0);
                w.u32(*p);
            }
            ProduceTarget::Key(key) => {
                w.u8(1);
                w.bytes16("key", key, KEY_BYTES_MAX)?;
            }
        }
        w.u32(len_u32("batch", batch_len)?);
        debug_assert!(w.buf.len() <= PRODUCE_HEAD_BYTES_MAX);
        let body_len = len_u32("produce request", w.buf.len() + batch_len)?;
        let mut head = Vec::with_capacity(FRAME_HEADER_LEN + w.buf.len());
        head.extend_from_slice(&body_len.to_le_bytes());
        head.extend_from_slice(&crate::checksum::checksum(&w.buf).to_le_bytes());
        head.extend_from_slice(&w.buf);
        Ok(head)
    }

    /// Appends the whole frame (header and body) to `out`.
    pub fn encode(&self, correlation: u32, out: &mut Vec<u8>) -> Result<(), WireError> {
        let mut w = Writer::message(self.opcode() as u16, 0, correlation);
        match self {
            Request::Hello {
                version_min,
                version_max,
                client,
            } => {
                w.u32(WIRE_MAGIC);
                w.u16(*version_min);
                w.u16(*version_max);
                w.str16("client name", client, 256)?;
            }
            Request::CreateTopic { topic, partitions } => {
                w.str16("topic", topic, TOPIC_NAME_BYTES_MAX)?;
                w.u32(*partitions);
            }
            Request::DeleteTopic { topic } | Request::DescribeTopic { topic } => {
                w.str16("topic", topic, TOPIC_NAME_BYTES_MAX)?;
            }
            Request::ListTopics | Request::Replicas => {}
            Request::Produce {
                topic,
                target,
                batch,
            } => {
                let head = Request::encode_produce_head(correlation, topic, target, batch.len())?;
                out.reserve(head.len() + batch.len());
                out.extend_from_slice(&head);
                out.extend_from_slice(batch);
                return Ok(());
            }
            Request::Fetch {
                topic,
                partition,
                offset,
                max_bytes,
                wait_ms,
            } => {
                w.str16("topic", topic, TOPIC_NAME_BYTES_MAX)?;
                w.u32(*partition);
                w.u64(*offset);
                w.u32(*max_bytes);
                w.u32(*wait_ms);
            }
            Request::Purge { topic, partition } => {
                w.str16("topic", topic, TOPIC_NAME_BYTES_MAX)?;
                w.u32(*partition);
            }
        }
        encode_frame(&w.buf, out);
        Ok(())
    }

    /// Decodes a verified frame body. Returns the correlation id and raw
    /// opcode whenever the message header was readable (0s otherwise), so a
    /// server can address its error reply.
    pub fn decode(body: &[u8]) -> (u32, u16, Result<Request, WireError>) {
        let mut r = Reader::new(body);
        let (Some(opcode), Some(error), Some(correlation)) = (r.u16(), r.u16(), r.u32()) else {
            return (
                0,
                0,
                Err(WireError::Truncated {
                    what: "message header",
                }),
            );
        };
        if error != 0 {
            return (correlation, opcode, Err(WireError::NonZeroReserved));
        }
        let Some(op) = Opcode::from_u16(opcode) else {
            return (correlation, opcode, Err(WireError::UnknownOpcode(opcode)));
        };
        let result = decode_request(op, &mut r).and_then(|req| {
            finish(&r, "request")?;
            Ok(req)
        });
        (correlation, opcode, result)
    }
}

fn decode_request(op: Opcode, r: &mut Reader<'_>) -> Result<Request, WireError> {
    Ok(match op {
        Opcode::Hello => {
            let magic = u32_(r, "hello")?;
            if magic != WIRE_MAGIC {
                return Err(WireError::BadMagic(magic));
            }
            Request::Hello {
                version_min: u16_(r, "hello")?,
                version_max: u16_(r, "hello")?,
                client: str16(r, "client name", 256)?,
            }
        }
        Opcode::CreateTopic => Request::CreateTopic {
            topic: topic(r)?,
            partitions: u32_(r, "partitions")?,
        },
        Opcode::DeleteTopic => Request::DeleteTopic { topic: topic(r)? },
        Opcode::ListTopics => Request::ListTopics,
        Opcode::Replicas => Request::Replicas,
        Opcode::DescribeTopic => Request::DescribeTopic { topic: topic(r)? },
        Opcode::Produce => {
            let (topic, target) = produce_fields(r)?;
            let batch = r
                .bytes_u32()
                .ok_or(WireError::Truncated { what: "batch" })?;
            Request::Produce {
                topic,
                target,
                batch: batch.to_vec(),
            }
        }
        Opcode::Fetch => Request::Fetch {
            topic: topic(r)?,
            partition: u32_(r, "partition")?,
            offset: u64_(r, "offset")?,
            max_bytes: u32_(r, "max_bytes")?,
            wait_ms: u32_(r, "wait_ms")?,
        },
        Opcode::Purge => Request::Purge {
            topic: topic(r)?,
            partition: u32_(r, "partition")?,
        },
    })
}

impl Reply {
    pub fn ok(opcode: Opcode, correlation: u32, body: Body) -> Reply {
        Reply {
            opcode: opcode as u16,
            correlation,
            result: Ok(body),
        }
    }

    pub fn error(
        opcode: u16,
        correlation: u32,
        code: ErrorCode,
        message: impl Into<String>,
    ) -> Reply {
        Reply {
            opcode,
            correlation,
            result: Err((code, message.into())),
        }
    }

    /// Appends the whole frame to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), WireError> {
        let code = match &self.result {
            Ok(_) => ErrorCode::Ok,
            Err((code, _)) => *code,
        };
        let mut w = Writer::message(self.opcode | RESPONSE_BIT, code as u16, self.correlation);
        match &self.result {
            Err((_, message)) => {
                let message = cut_at_char(message, ERROR_MESSAGE_BYTES_MAX);
                w.str16("error message", message, ERROR_MESSAGE_BYTES_MAX)?;
            }
            Ok(Body::Empty) => {}
            Ok(Body::Hello(h)) => {
                w.u16(h.version);
                w.u32(h.frame_bytes_max);
                w.u32(h.batch_bytes_max);
                w.u16(h.shards);
            }
            Ok(Body::Topics(topics)) => {
                w.u32(len_u32("topics", topics.len())?);
                for t in topics {
                    w.str16("topic", &t.topic, TOPIC_NAME_BYTES_MAX)?;
                    w.u32(t.partitions);
                }
            }
            Ok(Body::Topic(d)) => {
                w.str16("topic", &d.topic, TOPIC_NAME_BYTES_MAX)?;
                w.u32(len_u32("partitions", d.partitions.len())?);
                for p in &d.partitions {
                    w.u32(p.partition);
                    w.u32(p.partition_id);
                    w.u16(p.shard);
                    w.u64(p.log_start_offset);
                    w.u64(p.high_watermark);
                    w.u64(p.size_bytes);
                    w.u8(u8::from(p.fenced));
                }
            }
            Ok(Body::Produced(p)) => {
                w.u32(p.partition);
                w.u64(p.base_offset);
                w.u64(p.next_offset);
            }
            Ok(Body::Fetched(f)) => {
                w.u32(f.partition);
                w.u64(f.next_offset);
                w.u64(f.log_start_offset);
                w.u64(f.high_watermark);
                w.bytes32("batches", &f.batches)?;
            }
            Ok(Body::Replicas(list)) => encode_replicas(&mut w, list)?,
        }
        encode_frame(&w.buf, out);
        Ok(())
    }

    /// The frame of an Ok fetch reply up to its batches: `head` followed by
    /// `f.batches` is byte for byte what [`Reply::encode`] writes for it, so
    /// a server sends the batches from the buffer they were read into
    /// instead of copying them into a frame (the checksum covers them).
    pub fn encode_fetch_head(
        correlation: u32,
        f: &FetchReply,
    ) -> Result<[u8; FETCH_REPLY_HEAD_LEN], WireError> {
        let opcode = Opcode::Fetch as u16 | RESPONSE_BIT;
        let mut w = Writer::message(opcode, ErrorCode::Ok as u16, correlation);
        w.u32(f.partition);
        w.u64(f.next_offset);
        w.u64(f.log_start_offset);
        w.u64(f.high_watermark);
        w.u32(len_u32("batches", f.batches.len())?);
        let body_len = len_u32("fetch reply", w.buf.len() + f.batches.len())?;
        let mut sum = crate::checksum::Hasher::new();
        sum.update(&w.buf);
        sum.update(&f.batches);
        let mut head = [0u8; FETCH_REPLY_HEAD_LEN];
        head[..4].copy_from_slice(&body_len.to_le_bytes());
        head[4..FRAME_HEADER_LEN].copy_from_slice(&sum.finish().to_le_bytes());
        debug_assert_eq!(w.buf.len(), FETCH_REPLY_HEAD_LEN - FRAME_HEADER_LEN);
        head[FRAME_HEADER_LEN..].copy_from_slice(&w.buf);
        Ok(head)
    }

    /// Decodes a verified response frame body.
    pub fn decode(body: &[u8]) -> Result<Reply, WireError> {
        let mut r = Reader::new(body);
        let (Some(opcode), Some(code), Some(correlation)) = (r.u16(), r.u16(), r.u32()) else {
            return Err(WireError::Truncated {
                what: "message header",
            });
        };
        if opcode & RESPONSE_BIT == 0 {
            return Err(WireError::BadValue {
                what: "response opcode",
                value: u64::from(opcode),
            });
        }
        let opcode = opcode & !RESPONSE_BIT;
        let code = ErrorCode::from_u16(code).ok_or(WireError::UnknownErrorCode(code))?;
        let result = if code != ErrorCode::Ok {
            Err((
                code,
                str16(&mut r, "error message", ERROR_MESSAGE_BYTES_MAX)?,
            ))
        } else {
            let op = Opcode::from_u16(opcode).ok_or(WireError::UnknownOpcode(opcode))?;
            Ok(decode_body(op, &mut r)?)
        };
        finish(&r, "reply")?;
        Ok(Reply {
            opcode,
            correlation,
            result,
        })
    }
}

fn decode_body(op: Opcode, r: &mut Reader<'_>) -> Result<Body, WireError> {
    Ok(match op {
        Opcode::Hello => Body::Hello(HelloReply {
            version: u16_(r, "hello")?,
            frame_bytes_max: u32_(r, "hello")?,
            batch_bytes_max: u32_(r, "hello")?,
            shards: u16_(r, "hello")?,
        }),
        Opcode::CreateTopic | Opcode::DeleteTopic | Opcode::Purge => Body::Empty,
        Opcode::ListTopics => {
            let n = u32_(r, "topics")?;
            // Each entry takes at least 6 bytes: bound the allocation by input.
            check_count("topics", n, 6, r.remaining())?;
            let mut topics = Vec::with_capacity(usize_from(n));
            for _ in 0..n {
                topics.push(TopicSummary {
                    topic: topic(r)?,
                    partitions: u32_(r, "partitions")?,
                });
            }
            Body::Topics(topics)
        }
        Opcode::DescribeTopic => {
            let name = topic(r)?;
            let n = u32_(r, "partitions")?;
            check_count("partitions", n, 35, r.remaining())?;
            let mut partitions = Vec::with_capacity(usize_from(n));
            for _ in 0..n {
                partitions.push(PartitionInfo {
                    partition: u32_(r, "partition")?,
                    partition_id: u32_(r, "partition")?,
                    shard: u16_(r, "partition")?,
                    log_start_offset: u64_(r, "partition")?,
                    high_watermark: u64_(r, "partition")?,
                    size_bytes: u64_(r, "partition")?,
                    fenced: flag(r, "fenced")?,
                });
            }
            Body::Topic(TopicDescription {
                topic: name,
                partitions,
            })
        }
        Opcode::Produce => Body::Produced(ProduceReply {
            partition: u32_(r, "produce reply")?,
            base_offset: u64_(r, "produce reply")?,
            next_offset: u64_(r, "produce reply")?,
        }),
        Opcode::Fetch => Body::Fetched(FetchReply {
            partition: u32_(r, "fetch reply")?,
            next_offset: u64_(r, "fetch reply")?,
            log_start_offset: u64_(r, "fetch reply")?,
            high_watermark: u64_(r, "fetch reply")?,
            batches: r
                .bytes_u32()
                .ok_or(WireError::Truncated { what: "batches" })?
                .to_vec(),
        }),
        Opcode::Replicas => Body::Replicas(decode_replicas(r)?),
    })
}

fn encode_replicas(w: &mut Writer, list: &ReplicaList) -> Result<(), WireError> {
    let n = len_u32("replicas", list.rows.len())?;
    if n > REPLICA_ROWS_MAX {
        return Err(WireError::TooLong {
            what: "replicas",
            len: list.rows.len(),
            max: REPLICA_ROWS_MAX as usize,
        });
    }
    w.u32(n);
    w.u32(list.omitted);
    for p in &list.rows {
        w.str16("topic", &p.topic, TOPIC_NAME_BYTES_MAX)?;
        w.u32(p.partition);
        w.u32(p.partition_id);
        w.u16(p.shard);
        w.str16("role", &p.role, ROLE_BYTES_MAX)?;
        for v in [
            p.log_start_offset,
            p.frontier,
            p.commit,
            p.size_bytes,
            p.purge_generation,
        ] {
            w.u64(v);
        }
        w.u32(p.sealed_segments);
        match &p.fault {
            None => w.u8(0),
            Some(f) => {
                w.u8(1);
                w.str16("fault", cut_at_char(f, FAULT_BYTES_MAX), FAULT_BYTES_MAX)?;
            }
        }
        match &p.vsr {
            None => w.u8(0),
            Some(v) => {
                w.u8(1);
                w.u32(v.view);
                w.u64(v.op);
                w.u64(v.commit_op);
                w.u64(v.commit_max);
            }
        }
    }
    Ok(())
}

fn decode_replicas(r: &mut Reader<'_>) -> Result<ReplicaList, WireError> {
    let n = u32_(r, "replicas")?;
    if n > REPLICA_ROWS_MAX {
        return Err(WireError::TooLong {
            what: "replicas",
            len: usize_from(n),
            max: REPLICA_ROWS_MAX as usize,
        });
    }
    let omitted = u32_(r, "replicas")?;
    check_count("replicas", n, REPLICA_ROW_BYTES_MIN, r.remaining())?;
    let mut rows = Vec::with_capacity(usize_from(n));
    for _ in 0..n {
        let topic = topic(r)?;
        let partition = u32_(r, "replica")?;
        let partition_id = u32_(r, "replica")?;
        let shard = u16_(r, "replica")?;
        let role = str16(r, "role", ROLE_BYTES_MAX)?;
        let mut figures = [0u64; 5];
        for f in &mut figures {
            *f = u64_(r, "replica")?;
        }
        let [log_start_offset, frontier, commit, size_bytes, purge_generation] = figures;
        let sealed_segments = u32_(r, "replica")?;
        let fault = match flag(r, "fault")? {
            false => None,
            true => Some(str16(r, "fault", FAULT_BYTES_MAX)?),
        };
        let vsr = match flag(r, "vsr")? {
            false => None,
            true => Some(ReplicaVsr {
                view: u32_(r, "vsr")?,
                op: u64_(r, "vsr")?,
                commit_op: u64_(r, "vsr")?,
                commit_max: u64_(r, "vsr")?,
            }),
        };
        rows.push(ReplicaInfo {
            topic,
            partition,
            partition_id,
            shard,
            role,
            log_start_offset,
            frontier,
            commit,
            size_bytes,
            sealed_segments,
            purge_generation,
            fault,
            vsr,
        });
    }
    Ok(ReplicaList { rows, omitted })
}

/// The longest prefix of `s` of at most `bytes_max` bytes that ends on a
/// char boundary.
fn cut_at_char(s: &str, bytes_max: usize) -> &str {
    let mut cut = s.len().min(bytes_max);
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    &s[..cut]
}

/// A 0/1 byte; anything else is refused.
fn flag(r: &mut Reader<'_>, what: &'static str) -> Result<bool, WireError> {
    match u8_(r, what)? {
        0 => Ok(false),
        1 => Ok(true),
        v => Err(WireError::BadValue {
            what,
            value: u64::from(v),
        }),
    }
}

fn check_count(
    what: &'static str,
    n: u32,
    min_each: usize,
    remaining: usize,
) -> Result<(), WireError> {
    if usize_from(n).saturating_mul(min_each) > remaining {
        return Err(WireError::Truncated { what });
    }
    Ok(())
}

fn finish(r: &Reader<'_>, what: &'static str) -> Result<(), WireError> {
    match r.remaining() {
        0 => Ok(()),
        extra => Err(WireError::TrailingBytes { what, extra }),
    }
}

fn u8_(r: &mut Reader<'_>, what: &'static str) -> Result<u8, WireError> {
    r.u8().ok_or(WireError::Truncated { what })
}
fn u16_(r: &mut Reader<'_>, what: &'static str) -> Result<u16, WireError> {
    r.u16().ok_or(WireError::Truncated { what })
}
fn u32_(r: &mut Reader<'_>, what: &'static str) -> Result<u32, WireError> {
    r.u32().ok_or(WireError::Truncated { what })
}
fn u64_(r: &mut Reader<'_>, what: &'static str) -> Result<u64, WireError> {
    r.u64().ok_or(WireError::Truncated { what })
}

fn str16(r: &mut Reader<'_>, what: &'static str, max: usize) -> Result<String, WireError> {
    let bytes = r.bytes_u16().ok_or(WireError::Truncated { what })?;
    if bytes.len() > max {
        return Err(WireError::TooLong {
            what,
            len: bytes.len(),
            max,
        });
    }
    String::from_utf8(bytes.to_vec()).map_err(|_| WireError::BadUtf8 { what })
}

fn topic(r: &mut Reader<'_>) -> Result<String, WireError> {
    str16(r, "topic", TOPIC_NAME_BYTES_MAX)
}

fn len_u32(what: &'static str, len: usize) -> Result<u32, WireError> {
    u32::try_from(len).map_err(|_| WireError::TooLong {
        what,
        len,
        max: u32::MAX as usize,
    })
}

/// Little-endian message builder.
struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    fn message(opcode: u16, error: u16, correlation: u32) -> Writer {
        let mut buf = Vec::with_capacity(64);
        buf.extend_from_slice(&opcode.to_le_bytes());
        buf.extend_from_slice(&error.to_le_bytes());
        buf.extend_from_slice(&correlation.to_le_bytes());
        debug_assert_eq!(buf.len(), MESSAGE_HEADER_LEN);
        Writer { buf }
    }
    fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }
    fn u16(&mut self, v: u16) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    fn bytes16(&mut self, what: &'static str, v: &[u8], max: usize) -> Result<(), WireError> {
        if v.len() > max.min(usize::from(u16::MAX)) {
            return Err(WireError::TooLong {
                what,
                len: v.len(),
                max,
            });
        }
        self.u16(v.len() as u16);
        self.buf.extend_from_slice(v);
        Ok(())
    }
    fn str16(&mut self, what: &'static str, v: &str, max: usize) -> Result<(), WireError> {
        self.bytes16(what, v.as_bytes(), max)
    }
    fn bytes32(&mut self, what: &'static str, v: &[u8]) -> Result<(), WireError> {
        let len = len_u32(what, v.len())?;
        self.u32(len);
        self.buf.extend_from_slice(v);
        Ok(())
    }
}
