//! A blocking client for the ringlog wire protocol (used by the CLI, tests
//! and benchmarks). [`Client::call`] and the typed calls send one request
//! and wait for its reply; [`Client::send`] and [`Client::recv`] pipeline
//! (several requests in flight, replies in request order, as many as the
//! server's `requests_in_flight_max` read at once); open several clients
//! for parallelism.
//!
//! ```no_run
//! use ringlog_shard::client::{batch_of, Client};
//! let mut c = Client::connect("127.0.0.1:7420").unwrap();
//! c.create_topic("events", 4).unwrap();
//! let ack = c.produce("events", 0, batch_of(&[b"hello"]).unwrap()).unwrap();
//! let page = c.fetch("events", 0, ack.base_offset, 1 << 20, 0).unwrap();
//! ```

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

use ringlog_protocol::wire::{
    decode_frame_header, Body, ErrorCode, FetchReply, HelloReply, ProduceReply, ProduceTarget,
    ReplicaList, Reply, Request, TopicDescription, TopicSummary, WireError, FRAME_BYTES_MAX,
    FRAME_HEADER_LEN, PROTOCOL_VERSION,
};
use ringlog_protocol::{BatchBuilder, BatchError, BatchView, Record, Stamp};
use thiserror::Error;

/// What to do about a batch over the server's limit (client- or server-side).
const BATCH_LIMIT_ADVICE: &str = "send fewer or smaller records per batch, or raise the \
     server's write_buffer_bytes (the largest batch is write_buffer_bytes less 4 KiB)";

/// Socket read timeout beyond a fetch's own wait.
const REPLY_SLACK: Duration = Duration::from_secs(30);

#[derive(Debug, Error)]
pub enum ClientError {
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        addr: String,
        source: std::io::Error,
    },
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    /// Refused by the client before sending: the server would refuse it too.
    #[error(
        "batch of {bytes} bytes is over the server's limit of {max} bytes \
         (write_buffer_bytes less 4 KiB, announced at handshake); not sent"
    )]
    BatchTooLarge { bytes: usize, max: u32 },
    /// A caller's mistake found before anything was sent (bad option).
    #[error("{0}")]
    Usage(String),
    #[error("protocol: {0}")]
    Wire(#[from] WireError),
    #[error("server error {code}: {message}")]
    Server { code: ErrorCode, message: String },
    #[error("unexpected reply: {0}")]
    Unexpected(String),
    #[error("batch: {0}")]
    Batch(#[from] BatchError),
    /// A produce refused not-primary more than [`REDIRECTS_MAX`] times in a
    /// row (the primary moves, or the nodes disagree); `last` is the final
    /// refusal.
    #[error("produce redirected {redirects} times without reaching the primary; last: {last}")]
    TooManyRedirects {
        redirects: u32,
        last: Box<ClientError>,
    },
}

/// Not-primary redirects one [`FollowingClient`] produce follows at most.
pub const REDIRECTS_MAX: u32 = 3;

impl ClientError {
    /// The server's error code, if the server answered with one.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Server { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// Whether sending the same request again later may succeed.
    pub fn is_retryable(&self) -> bool {
        self.code().is_some_and(ErrorCode::is_retryable)
    }

    /// For a not-primary refusal: the node id of the partition's primary
    /// (the server names it `primary_node=ID`).
    pub fn primary_node(&self) -> Option<u32> {
        self.not_primary_field("primary_node=")?.parse().ok()
    }

    /// For a not-primary refusal: the primary's client address, when the
    /// refusing node knows it (`primary_addr=HOST:PORT`, learned from the
    /// primary's peer Hello); [`FollowingClient`] produces there.
    pub fn primary_addr(&self) -> Option<std::net::SocketAddr> {
        self.not_primary_field("primary_addr=")?.parse().ok()
    }

    /// The text after `key` in a not-primary message, up to a space.
    fn not_primary_field(&self, key: &str) -> Option<&str> {
        let ClientError::Server {
            code: ErrorCode::NotPrimary,
            message,
        } = self
        else {
            return None;
        };
        let rest = &message[message.find(key)? + key.len()..];
        let end = rest
            .find(|c: char| c.is_whitespace() || c == ',' || c == ')')
            .unwrap_or(rest.len());
        Some(&rest[..end])
    }

    /// What a person should know or do about this error, if anything
    /// beyond its message.
    pub fn advice(&self) -> Option<&'static str> {
        match self {
            ClientError::Connect { .. } => {
                return Some(
                    "is the server running? start it with `ringlog server`, or point \
                     --addr (or RINGLOG_ADDR) at it",
                )
            }
            ClientError::BatchTooLarge { .. } => return Some(BATCH_LIMIT_ADVICE),
            ClientError::TooManyRedirects { .. } => {
                return Some(
                    "the partition's primary is changing (a view change); retry in a moment, \
                     and check `ringlog ctl partitions` on the nodes",
                )
            }
            _ => {}
        }
        match self.code()? {
            ErrorCode::BatchTooLarge => Some(BATCH_LIMIT_ADVICE),
            ErrorCode::DiskFull => Some(
                "the server's disk is full: nothing was written and reads keep working; \
                 appends resume once space is freed (retention, purge, or more disk)",
            ),
            ErrorCode::NotPrimary => Some(
                "this node holds a backup of the partition: produce to primary_addr (the \
                 node named primary_node), or retry here after a view change",
            ),
            ErrorCode::PartitionFenced => Some(
                "the partition stopped after an I/O error (fail-stop); see the server log; \
                 it recovers on restart",
            ),
            _ => None,
        }
    }
}

pub struct Client {
    stream: TcpStream,
    next_correlation: u32,
    /// Correlations sent and not yet answered, oldest first (as many as
    /// the caller pipelined).
    pending: VecDeque<u32>,
    hello: HelloReply,
    /// Reply bodies are read into this buffer, kept across replies (up to
    /// [`RX_KEPT_BYTES_MAX`]): a fresh zeroed one per 1 MiB fetch reply
    /// faulted in and cleared every page before the socket filled it.
    rx: Vec<u8>,
}

/// Writes `head` then `body` whole, with as few writes as the socket
/// takes them in.
fn write_all_of(stream: &mut TcpStream, head: &[u8], body: &[u8]) -> std::io::Result<()> {
    let mut slices = [std::io::IoSlice::new(head), std::io::IoSlice::new(body)];
    let mut left: &mut [std::io::IoSlice<'_>] = &mut slices;
    while !left.is_empty() {
        match stream.write_vectored(left) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => std::io::IoSlice::advance_slices(&mut left, n),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The largest reply body buffer a client keeps for the next reply.
pub const RX_KEPT_BYTES_MAX: usize = 16 << 20;

impl Client {
    /// Connects and performs the handshake. A failed connect names `addr`.
    pub fn connect(addr: impl ToSocketAddrs + std::fmt::Display) -> Result<Client, ClientError> {
        let stream = TcpStream::connect(&addr).map_err(|source| ClientError::Connect {
            addr: addr.to_string(),
            source,
        })?;
        Client::handshake(stream)
    }

    /// Connects and performs the handshake with every step (connect, each
    /// read and write) bounded by `timeout`, which stays the bound of the
    /// client's later calls: for asking a peer that may be down or wedged.
    pub fn connect_within(addr: SocketAddr, timeout: Duration) -> Result<Client, ClientError> {
        let connect = |source| ClientError::Connect {
            addr: addr.to_string(),
            source,
        };
        let stream = TcpStream::connect_timeout(&addr, timeout).map_err(connect)?;
        stream.set_write_timeout(Some(timeout)).map_err(connect)?;
        Client::handshake_within(stream, timeout)
    }

    /// Performs the handshake on an already connected stream.
    pub fn handshake(stream: TcpStream) -> Result<Client, ClientError> {
        Client::handshake_within(stream, REPLY_SLACK)
    }

    /// The handshake, with `read_timeout` on its reply.
    fn handshake_within(stream: TcpStream, read_timeout: Duration) -> Result<Client, ClientError> {
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(read_timeout))?;
        let mut c = Client {
            stream,
            next_correlation: 1,
            pending: VecDeque::new(),
            hello: HelloReply {
                version: PROTOCOL_VERSION,
                frame_bytes_max: FRAME_BYTES_MAX,
                batch_bytes_max: 0,
                shards: 0,
            },
            rx: Vec::new(),
        };
        let body = c.call(&Request::Hello {
            version_min: PROTOCOL_VERSION,
            version_max: PROTOCOL_VERSION,
            client: format!("ringlog-client/{}", env!("CARGO_PKG_VERSION")),
        })?;
        match body {
            Body::Hello(h) => {
                c.hello = h;
                Ok(c)
            }
            other => Err(ClientError::Unexpected(format!("{other:?}"))),
        }
    }

    /// What the server announced in the handshake.
    pub fn server(&self) -> &HelloReply {
        &self.hello
    }

    /// Sends one request and waits for its reply. Replies to requests
    /// pipelined before it ([`Client::send`]) must have been taken first.
    pub fn call(&mut self, req: &Request) -> Result<Body, ClientError> {
        if !self.pending.is_empty() {
            return Err(ClientError::Usage(format!(
                "call with {} pipelined replies not taken (recv them first)",
                self.pending.len()
            )));
        }
        self.send(req)?;
        self.recv()
    }

    /// Sends one request without waiting for its reply; returns its
    /// correlation. The replies come back from [`Client::recv`] in request
    /// order. The server reads up to its `requests_in_flight_max` ahead of
    /// the replies it writes; past that, a client that writes more without
    /// reading stalls once the socket buffers are full (with large fetch
    /// replies, until the server's write stall timeout closes it).
    pub fn send(&mut self, req: &Request) -> Result<u32, ClientError> {
        let correlation = self.take_correlation();
        let mut frame = Vec::new();
        req.encode(correlation, &mut frame)?;
        self.stream.write_all(&frame)?;
        self.pending.push_back(correlation);
        Ok(correlation)
    }

    fn take_correlation(&mut self) -> u32 {
        let correlation = self.next_correlation;
        // Correlation 0 is the server's: errors about the connection itself
        // (refused over the connection cap, bad frame, shutting down).
        self.next_correlation = self.next_correlation.checked_add(1).unwrap_or(1);
        debug_assert_ne!(correlation, 0);
        correlation
    }

    /// Requests sent with [`Client::send`] whose reply was not taken yet.
    pub fn in_flight(&self) -> usize {
        self.pending.len()
    }

    /// Waits for the reply to the oldest request sent and not yet answered.
    pub fn recv(&mut self) -> Result<Body, ClientError> {
        let Some(&correlation) = self.pending.front() else {
            return Err(ClientError::Usage("recv with no request in flight".into()));
        };
        let reply = self.read_reply()?;
        if reply.correlation == 0 {
            if let Err((code, message)) = reply.result {
                return Err(ClientError::Server { code, message });
            }
        }
        if reply.correlation != correlation {
            return Err(ClientError::Unexpected(format!(
                "reply for request {} while waiting for {correlation}",
                reply.correlation
            )));
        }
        self.pending.pop_front();
        reply
            .result
            .map_err(|(code, message)| ClientError::Server { code, message })
    }

    /// Writes raw bytes (tests of bad input).
    pub fn send_raw(&mut self, bytes: &[u8]) -> Result<(), ClientError> {
        self.stream.write_all(bytes)?;
        Ok(())
    }

    /// Reads one reply frame.
    pub fn read_reply(&mut self) -> Result<Reply, ClientError> {
        read_reply_with(
            &mut self.stream,
            self.hello.frame_bytes_max.max(FRAME_BYTES_MAX),
            &mut self.rx,
        )
    }

    pub fn create_topic(&mut self, topic: &str, partitions: u32) -> Result<(), ClientError> {
        self.call(&Request::CreateTopic {
            topic: topic.into(),
            partitions,
        })
        .map(|_| ())
    }

    pub fn delete_topic(&mut self, topic: &str) -> Result<(), ClientError> {
        self.call(&Request::DeleteTopic {
            topic: topic.into(),
        })
        .map(|_| ())
    }

    pub fn list_topics(&mut self) -> Result<Vec<TopicSummary>, ClientError> {
        match self.call(&Request::ListTopics)? {
            Body::Topics(t) => Ok(t),
            other => Err(ClientError::Unexpected(format!("{other:?}"))),
        }
    }

    pub fn describe_topic(&mut self, topic: &str) -> Result<TopicDescription, ClientError> {
        match self.call(&Request::DescribeTopic {
            topic: topic.into(),
        })? {
            Body::Topic(t) => Ok(t),
            other => Err(ClientError::Unexpected(format!("{other:?}"))),
        }
    }

    /// Every partition replica the node holds, with its replication state.
    pub fn replicas(&mut self) -> Result<ReplicaList, ClientError> {
        match self.call(&Request::Replicas)? {
            Body::Replicas(r) => Ok(r),
            other => Err(ClientError::Unexpected(format!("{other:?}"))),
        }
    }

    /// Appends one batch to a partition; returns once it is durable.
    pub fn produce(
        &mut self,
        topic: &str,
        partition: u32,
        batch: Vec<u8>,
    ) -> Result<ProduceReply, ClientError> {
        self.produce_to(topic, ProduceTarget::Partition(partition), batch)
    }

    /// Appends one batch to the partition `key` hashes to.
    pub fn produce_keyed(
        &mut self,
        topic: &str,
        key: &[u8],
        batch: Vec<u8>,
    ) -> Result<ProduceReply, ClientError> {
        self.produce_to(topic, ProduceTarget::Key(key.to_vec()), batch)
    }

    fn produce_to(
        &mut self,
        topic: &str,
        target: ProduceTarget,
        batch: Vec<u8>,
    ) -> Result<ProduceReply, ClientError> {
        self.send_produce_to(topic, &target, &batch)?;
        self.recv_produced()
    }

    /// Sends a produce to a partition without waiting for its ack (see
    /// [`Client::send`]); [`Client::recv_produced`] takes the ack. The
    /// batch is written from `batch` itself: nothing of it is copied.
    pub fn send_produce(
        &mut self,
        topic: &str,
        partition: u32,
        batch: &[u8],
    ) -> Result<u32, ClientError> {
        self.send_produce_to(topic, &ProduceTarget::Partition(partition), batch)
    }

    /// The ack of the oldest request in flight, which must be a produce.
    pub fn recv_produced(&mut self) -> Result<ProduceReply, ClientError> {
        produced(self.recv()?)
    }

    /// A Produce's frame head, then the batch where it lies, in one
    /// vectored write.
    fn send_produce_to(
        &mut self,
        topic: &str,
        target: &ProduceTarget,
        batch: &[u8],
    ) -> Result<u32, ClientError> {
        // 0: a server that announced no limit; it still checks its own.
        let max = self.hello.batch_bytes_max;
        if max > 0 && batch.len() > max as usize {
            return Err(ClientError::BatchTooLarge {
                bytes: batch.len(),
                max,
            });
        }
        let correlation = self.take_correlation();
        let head = Request::encode_produce_head(correlation, topic, target, batch.len())?;
        write_all_of(&mut self.stream, &head, batch)?;
        self.pending.push_back(correlation);
        Ok(correlation)
    }

    /// Durable batches from `offset`; with `wait_ms`, waits that long for
    /// data when there is none yet.
    pub fn fetch(
        &mut self,
        topic: &str,
        partition: u32,
        offset: u64,
        max_bytes: u32,
        wait_ms: u32,
    ) -> Result<FetchReply, ClientError> {
        self.stream.set_read_timeout(Some(
            REPLY_SLACK + Duration::from_millis(u64::from(wait_ms)),
        ))?;
        let result = self.call(&Request::Fetch {
            topic: topic.into(),
            partition,
            offset,
            max_bytes,
            wait_ms,
        });
        self.stream.set_read_timeout(Some(REPLY_SLACK))?;
        match result? {
            Body::Fetched(f) => Ok(f),
            other => Err(ClientError::Unexpected(format!("{other:?}"))),
        }
    }

    pub fn purge(&mut self, topic: &str, partition: u32) -> Result<(), ClientError> {
        self.call(&Request::Purge {
            topic: topic.into(),
            partition,
        })
        .map(|_| ())
    }
}

/// A client that produces to any node of a cluster and follows
/// not-primary refusals to the primary they name (`primary_addr=`), at
/// most [`REDIRECTS_MAX`] times per produce. It holds one connection: a
/// redirect replaces it with one to the primary, which the next produces
/// reuse, so a steady producer pays the redirect once per primary change.
/// Produces and fetches follow (a node holding no replica of a partition
/// names its group's primary the same way); other calls go through
/// [`FollowingClient::client`] to the node it is at.
pub struct FollowingClient {
    client: Client,
    addr: String,
}

/// A produce's acknowledgement, and where it went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Followed {
    pub ack: ProduceReply,
    /// The address that acknowledged it.
    pub addr: String,
    /// Not-primary refusals followed to get there.
    pub redirects: u32,
}

impl FollowingClient {
    pub fn connect(addr: &str) -> Result<FollowingClient, ClientError> {
        Ok(FollowingClient {
            client: Client::connect(addr)?,
            addr: addr.to_string(),
        })
    }

    /// The node the client is connected to (the last primary it found).
    pub fn addr(&self) -> &str {
        &self.addr
    }

    pub fn client(&mut self) -> &mut Client {
        &mut self.client
    }

    /// [`Client::produce`], following not-primary refusals.
    pub fn produce(
        &mut self,
        topic: &str,
        partition: u32,
        batch: Vec<u8>,
    ) -> Result<Followed, ClientError> {
        self.follow(|c, b| c.produce(topic, partition, b), batch)
    }

    /// [`Client::produce_keyed`], following not-primary refusals.
    pub fn produce_keyed(
        &mut self,
        topic: &str,
        key: &[u8],
        batch: Vec<u8>,
    ) -> Result<Followed, ClientError> {
        self.follow(|c, b| c.produce_keyed(topic, key, b), batch)
    }

    /// [`Client::fetch`], following a node's refusal for a partition it
    /// holds no replica of to the node it names.
    pub fn fetch(
        &mut self,
        topic: &str,
        partition: u32,
        offset: u64,
        max_bytes: u32,
        wait_ms: u32,
    ) -> Result<FetchReply, ClientError> {
        self.follow_with(|c| c.fetch(topic, partition, offset, max_bytes, wait_ms))
            .map(|(page, _)| page)
    }

    /// Sends `batch` with `send`, following not-primary refusals.
    fn follow(
        &mut self,
        mut send: impl FnMut(&mut Client, Vec<u8>) -> Result<ProduceReply, ClientError>,
        batch: Vec<u8>,
    ) -> Result<Followed, ClientError> {
        let (ack, redirects) = self.follow_with(|c| send(c, batch.clone()))?;
        let addr = self.addr.clone();
        Ok(Followed {
            ack,
            addr,
            redirects,
        })
    }

    /// Calls `call`; a not-primary refusal naming an address moves the
    /// connection there and calls again. A refusal naming no address, or
    /// any other error, is returned as is. The reply, and the refusals
    /// followed.
    fn follow_with<T>(
        &mut self,
        mut call: impl FnMut(&mut Client) -> Result<T, ClientError>,
    ) -> Result<(T, u32), ClientError> {
        let mut redirects = 0;
        loop {
            let e = match call(&mut self.client) {
                Ok(reply) => return Ok((reply, redirects)),
                Err(e) => e,
            };
            let Some(to) = e.primary_addr() else {
                return Err(e);
            };
            if redirects == REDIRECTS_MAX {
                let last = Box::new(e);
                return Err(ClientError::TooManyRedirects { redirects, last });
            }
            redirects += 1;
            let to = to.to_string();
            self.client = Client::connect(to.as_str())?;
            self.addr = to;
        }
    }
}

fn produced(body: Body) -> Result<ProduceReply, ClientError> {
    match body {
        Body::Produced(p) => Ok(p),
        other => Err(ClientError::Unexpected(format!("{other:?}"))),
    }
}

/// Reads and decodes one reply frame from `stream`.
pub fn read_reply(stream: &mut impl Read, frame_bytes_max: u32) -> Result<Reply, ClientError> {
    read_reply_with(stream, frame_bytes_max, &mut Vec::new())
}

/// [`read_reply`] through `body`, a buffer the caller keeps across
/// replies: it is filled straight from the socket (not zeroed first) and
/// let go if it grew past [`RX_KEPT_BYTES_MAX`].
fn read_reply_with(
    stream: &mut impl Read,
    frame_bytes_max: u32,
    body: &mut Vec<u8>,
) -> Result<Reply, ClientError> {
    let mut head = [0u8; FRAME_HEADER_LEN];
    stream.read_exact(&mut head)?;
    let header = decode_frame_header(&head, frame_bytes_max)?;
    let len = header.body_len as usize;
    body.clear();
    body.reserve_exact(len);
    let got = stream.by_ref().take(len as u64).read_to_end(body)?;
    let decoded = if got < len {
        Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into())
    } else {
        header
            .verify(body)
            .map_err(ClientError::from)
            .and_then(|()| Ok(Reply::decode(body)?))
    };
    if body.capacity() > RX_KEPT_BYTES_MAX {
        *body = Vec::new();
    }
    decoded
}

/// Builds one batch holding `values` (no keys, timestamps now).
pub fn batch_of(values: &[&[u8]]) -> Result<Vec<u8>, BatchError> {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let mut b = BatchBuilder::new(0);
    for v in values {
        b.push(&Record {
            key: &[],
            headers: &[],
            value: v,
            timestamp_ms: now_ms,
        })?;
    }
    b.finish(&Stamp::default())
}

/// One record of a fetched batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FetchedRecord {
    pub offset: u64,
    pub timestamp_ms: u64,
    pub key: Vec<u8>,
    /// `(name, value)` pairs in record order.
    pub headers: Vec<(Vec<u8>, Vec<u8>)>,
    pub value: Vec<u8>,
}

/// Splits fetched bytes into records, verifying every batch.
pub fn records(batches: &[u8]) -> Result<Vec<FetchedRecord>, BatchError> {
    let mut out = Vec::new();
    let mut rest = batches;
    while !rest.is_empty() {
        let view = BatchView::parse(rest)?;
        for r in view.records() {
            out.push(FetchedRecord {
                offset: r.offset,
                timestamp_ms: r.timestamp_ms,
                key: r.key.to_vec(),
                headers: r.headers.map(|(n, v)| (n.to_vec(), v.to_vec())).collect(),
                value: r.value.to_vec(),
            });
        }
        rest = &rest[view.as_bytes().len()..];
    }
    Ok(out)
}

/// Retries `f` while it fails with a retryable error, sleeping `backoff`
/// between attempts, at most `attempts` times.
pub fn with_retry<T>(
    attempts: u32,
    backoff: Duration,
    mut f: impl FnMut() -> Result<T, ClientError>,
) -> Result<T, ClientError> {
    let mut n = 0;
    loop {
        match f() {
            Err(e) if e.is_retryable() && n + 1 < attempts => {
                n += 1;
                std::thread::sleep(backoff);
            }
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_not_primary_refusal_names_the_primary_node() {
        use super::{ClientError, ErrorCode};
        let e = ClientError::Server {
            code: ErrorCode::NotPrimary,
            message: "this node holds a backup of partition 7: produce to primary_node=3 primary_addr=127.0.0.1:7423 (peer address 127.0.0.1:1, view 5)".into(),
        };
        assert_eq!(e.primary_node(), Some(3));
        assert_eq!(e.primary_addr(), Some("127.0.0.1:7423".parse().unwrap()));
        // A node that does not know the address (or an older one) names
        // only the id: nothing to follow.
        let old = ClientError::Server {
            code: ErrorCode::NotPrimary,
            message: "produce to primary_node=3 (peer address 127.0.0.1:1, view 5)".into(),
        };
        assert_eq!((old.primary_node(), old.primary_addr()), (Some(3), None));
        assert!(e.advice().is_some_and(|a| a.contains("primary_node")));
        let other = ClientError::Server {
            code: ErrorCode::Backpressure,
            message: "primary_node=3".into(),
        };
        assert_eq!(
            other.primary_node(),
            None,
            "only a not-primary refusal names one"
        );
        let garbled = ClientError::Server {
            code: ErrorCode::NotPrimary,
            message: "primary_node=x primary_addr=nowhere:1".into(),
        };
        assert_eq!(garbled.primary_node(), None);
        assert_eq!(garbled.primary_addr(), None);
    }

    use super::{Client, FollowingClient, REDIRECTS_MAX};
    use ringlog_protocol::wire::{
        decode_frame_header, Body, ErrorCode, HelloReply, Opcode, ProduceReply, Reply, Request,
        FRAME_BYTES_MAX, FRAME_HEADER_LEN, PROTOCOL_VERSION,
    };
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    /// A fake node on a thread per connection: it answers the handshake,
    /// and each produce with `answer(correlation)`. Returns its address
    /// and its count of accepted connections.
    fn fake_node(answer: fn(&str, u32) -> Reply) -> (String, Arc<AtomicU32>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let accepted = Arc::new(AtomicU32::new(0));
        let (me, count) = (addr.clone(), accepted.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                count.fetch_add(1, Ordering::Relaxed);
                let me = me.clone();
                std::thread::spawn(move || serve_fake(stream.unwrap(), &me, answer));
            }
        });
        (addr, accepted)
    }

    fn serve_fake(mut s: TcpStream, me: &str, answer: fn(&str, u32) -> Reply) {
        let mut head = [0u8; FRAME_HEADER_LEN];
        while s.read_exact(&mut head).is_ok() {
            let h = decode_frame_header(&head, FRAME_BYTES_MAX).unwrap();
            let mut body = vec![0u8; h.body_len as usize];
            s.read_exact(&mut body).unwrap();
            let (correlation, _, req) = Request::decode(&body);
            let reply = match req.unwrap() {
                Request::Hello { .. } => Reply::ok(
                    Opcode::Hello,
                    correlation,
                    Body::Hello(HelloReply {
                        version: PROTOCOL_VERSION,
                        frame_bytes_max: FRAME_BYTES_MAX,
                        batch_bytes_max: 1 << 20,
                        shards: 1,
                    }),
                ),
                _ => answer(me, correlation),
            };
            let mut out = Vec::new();
            reply.encode(&mut out).unwrap();
            s.write_all(&out).unwrap();
        }
    }

    fn not_primary(to: &str, correlation: u32) -> Reply {
        Reply::error(
            Opcode::Produce as u16,
            correlation,
            ErrorCode::NotPrimary,
            format!("produce to primary_node=1 primary_addr={to} (peer address x, view 2)"),
        )
    }

    fn acked(_: &str, correlation: u32) -> Reply {
        let ack = ProduceReply {
            partition: 0,
            base_offset: 10,
            next_offset: 11,
        };
        Reply::ok(Opcode::Produce, correlation, Body::Produced(ack))
    }

    #[test]
    fn a_produce_follows_the_named_primary_and_stays_there() {
        let (primary, primary_conns) = fake_node(acked);
        // A backup naming `primary`: the address is baked in per fake.
        static PRIMARY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        PRIMARY.set(primary.clone()).unwrap();
        let (backup, _) = fake_node(|_, c| not_primary(PRIMARY.get().unwrap(), c));
        let mut f = FollowingClient::connect(&backup).unwrap();
        let got = f.produce("t", 0, vec![1, 2, 3]).unwrap();
        assert_eq!((got.addr.as_str(), got.redirects), (primary.as_str(), 1));
        assert_eq!(got.ack.base_offset, 10);
        // The next produce reuses the connection to the primary.
        let again = f.produce_keyed("t", b"k", vec![4]).unwrap();
        assert_eq!(again.redirects, 0);
        assert_eq!(f.addr(), primary);
        assert_eq!(primary_conns.load(Ordering::Relaxed), 1);
        // A plain client sees the refusal itself.
        let e = Client::connect(backup.as_str())
            .unwrap()
            .produce("t", 0, vec![1])
            .unwrap_err();
        assert_eq!(e.primary_addr().map(|a| a.to_string()), Some(primary));
    }

    #[test]
    fn redirects_past_the_bound_fail_typed() {
        // A node that names itself as the primary, forever.
        let (addr, conns) = fake_node(not_primary);
        let mut f = FollowingClient::connect(&addr).unwrap();
        let e = f.produce("t", 0, vec![1]).unwrap_err();
        match &e {
            super::ClientError::TooManyRedirects { redirects, last } => {
                assert_eq!(*redirects, REDIRECTS_MAX);
                assert_eq!(last.code(), Some(ErrorCode::NotPrimary));
            }
            other => panic!("expected TooManyRedirects, got {other}"),
        }
        assert!(e.advice().is_some());
        // The first connection and one per redirect, no more.
        assert_eq!(conns.load(Ordering::Relaxed), 1 + REDIRECTS_MAX);
    }

    use super::*;

    fn frame(reply: &Reply) -> Vec<u8> {
        let mut out = Vec::new();
        reply.encode(&mut out).unwrap();
        out
    }

    fn fetched(correlation: u32, batches_len: usize) -> Reply {
        Reply::ok(
            ringlog_protocol::wire::Opcode::Fetch,
            correlation,
            Body::Fetched(FetchReply {
                partition: 0,
                next_offset: 9,
                log_start_offset: 0,
                high_watermark: 9,
                batches: vec![correlation as u8; batches_len],
            }),
        )
    }

    #[test]
    fn a_kept_body_buffer_reads_the_same_replies_and_is_bounded() {
        let replies = [
            fetched(1, 1 << 20),
            fetched(2, 100),
            fetched(3, RX_KEPT_BYTES_MAX + 1),
            fetched(4, 1 << 20),
        ];
        let wire: Vec<u8> = replies.iter().flat_map(frame).collect();
        let mut stream = std::io::Cursor::new(wire);
        let mut body = Vec::new();
        let mut kept = Vec::new();
        for want in &replies {
            let got = read_reply_with(&mut stream, FRAME_BYTES_MAX, &mut body).unwrap();
            assert_eq!(&got, want);
            kept.push(body.capacity());
        }
        // Kept after 1 MiB and reused for the small reply; let go after
        // the one over the bound.
        assert!(kept[0] > 1 << 20 && kept[1] == kept[0], "{kept:?}");
        assert_eq!(kept[2], 0);
        // A frame cut short is an error, not a shorter reply.
        let mut cut = frame(&fetched(5, 4096));
        cut.truncate(cut.len() - 1);
        let e = read_reply_with(&mut std::io::Cursor::new(cut), FRAME_BYTES_MAX, &mut body);
        assert!(matches!(e, Err(ClientError::Io(_))), "{e:?}");
    }

    #[test]
    fn a_bit_flipped_in_a_reply_in_flight_is_a_typed_error() {
        let good = frame(&fetched(6, 4096));
        for byte in [FRAME_HEADER_LEN + 3, good.len() - 4096, good.len() - 1] {
            let mut bad = good.clone();
            bad[byte] ^= 0x10;
            let e = read_reply_with(
                &mut std::io::Cursor::new(bad),
                FRAME_BYTES_MAX,
                &mut Vec::new(),
            );
            assert!(
                matches!(e, Err(ClientError::Wire(WireError::BadChecksum { .. }))),
                "flip at {byte}: {e:?}"
            );
        }
        let ok = read_reply_with(
            &mut std::io::Cursor::new(good),
            FRAME_BYTES_MAX,
            &mut Vec::new(),
        );
        assert_eq!(ok.unwrap(), fetched(6, 4096));
    }

    #[test]
    fn disk_full_is_retryable_and_explained() {
        let e = ClientError::Server {
            code: ErrorCode::DiskFull,
            message: "partition 3: no space left".into(),
        };
        assert!(e.is_retryable());
        assert!(e.to_string().contains("disk_full"), "{e}");
        assert!(e.advice().unwrap().contains("disk is full"));
        let other = ClientError::Server {
            code: ErrorCode::UnknownTopic,
            message: String::new(),
        };
        assert!(other.advice().is_none());
    }

    #[test]
    fn batch_limit_errors_name_the_config_key_client_and_server_side() {
        let client_side = ClientError::BatchTooLarge {
            bytes: 70_000,
            max: 61_440,
        };
        assert!(client_side.to_string().contains("write_buffer_bytes"));
        assert!(client_side.advice().unwrap().contains("write_buffer_bytes"));
        let server_side = ClientError::Server {
            code: ErrorCode::BatchTooLarge,
            message: "batch of 70000 bytes exceeds 61440".into(),
        };
        assert!(server_side.advice().unwrap().contains("write_buffer_bytes"));
        let refused = ClientError::Connect {
            addr: "10.0.0.1:7420".into(),
            source: std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
        };
        assert!(refused.to_string().contains("10.0.0.1:7420"), "{refused}");
        assert!(refused.advice().unwrap().contains("--addr"));
    }
}
