//! Accepting client connections and serving one connection: read a frame,
//! check it, dispatch it, write the reply. A connection pipelines: it reads
//! the next request while earlier ones run, up to `requests_in_flight_max`
//! read and unanswered (then it reads nothing until a reply is written), and
//! writes replies strictly in request order (see [`Pipeline`]).
//!
//! Bounds, each from the config: at most `connections_per_shard_max`
//! connections per shard (more are answered with Backpressure and closed);
//! a connection idle for `idle_timeout_ms` between frames is closed (after
//! the replies it is still owed); a
//! started frame must deliver its header within `header_timeout_ms`, and
//! its body must make progress at least that often, or the connection is
//! closed; so must a reply's write (a client that stops reading). A body is allocated at its declared length (pages become
//! resident as its bytes arrive) and only after that length was taken from
//! the shard's byte budget (`shard_request_bytes_max`), which also holds
//! room for each fetch reply until it is written. Over the budget, the
//! body is read and discarded in small chunks and the request is answered
//! with Backpressure, so the connection stays in sync and usable.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use monoio::buf::{IoBuf, IoBufMut};
use monoio::io::{AsyncReadRent, AsyncWriteRent, OwnedReadHalf, OwnedWriteHalf, Splitable};
use monoio::net::{TcpListener, TcpStream};
use ringlog_protocol::wire::{
    decode_frame_header, split_request, Body, ErrorCode, FrameHeader, HelloReply, Opcode,
    ProduceHead, ProduceTarget, Reply, Request, RequestSplit, WireError, FRAME_HEADER_LEN,
    PRODUCE_HEAD_BYTES_MAX, PROTOCOL_VERSION,
};

use ringlog_storage::io::BatchBuf;

use super::budget::{ByteBudget, Charge};
use crate::config::ServerConfig;
use crate::handle::ShardHandle;
use crate::metrics;
use crate::oneshot::{self, Notify};
use crate::ops::ClientBatch;
use crate::reply_pool::Put;

pub(crate) async fn accept_loop<S: ShardHandle + 'static>(shard: Rc<S>, listener: TcpListener) {
    let budget = ByteBudget::new(shard.config().shard_request_bytes_max);
    loop {
        if shard.is_stopping() {
            break;
        }
        let accepted = monoio::select! {
            r = listener.accept() => Some(r),
            _ = shard.stop().notified() => None,
        };
        let Some(result) = accepted else { break };
        let (stream, peer) = match result {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(shard = shard.id(), error = %e, "accept failed");
                monoio::time::sleep(std::time::Duration::from_millis(10)).await;
                continue;
            }
        };
        let open = shard.metrics().connections_open.load(Ordering::Relaxed);
        if open >= shard.config().connections_per_shard_max as u64 {
            metrics::inc(&shard.metrics().connections_refused_total);
            let stall = Duration::from_millis(shard.config().header_timeout_ms);
            monoio::spawn(refuse(stream, stall));
            continue;
        }
        metrics::inc(&shard.metrics().connections_total);
        shard
            .metrics()
            .connections_open
            .fetch_add(1, Ordering::Relaxed);
        let (s, b) = (shard.clone(), budget.clone());
        monoio::spawn(async move {
            let _ = stream.set_nodelay(true);
            tracing::debug!(shard = s.id(), %peer, "connection");
            serve(&s, &b, stream).await;
            s.metrics().connections_open.fetch_sub(1, Ordering::Relaxed);
        });
    }
    tracing::info!(shard = shard.id(), "stopped accepting connections");
}

async fn refuse(mut stream: TcpStream, stall: Duration) {
    let reply = Reply::error(
        Opcode::Hello as u16,
        0,
        ErrorCode::Backpressure,
        "too many connections on this shard; retry later",
    );
    let _ = write_reply(&mut stream, &reply, stall).await;
}

async fn write_reply(
    stream: &mut impl AsyncWriteRent,
    reply: &Reply,
    stall: Duration,
) -> std::io::Result<()> {
    let mut out = Vec::new();
    if let Err(e) = reply.encode(&mut out) {
        tracing::error!(error = %e, "reply does not encode");
        let fallback = Reply::error(
            reply.opcode,
            reply.correlation,
            ErrorCode::Internal,
            e.to_string(),
        );
        out.clear();
        fallback
            .encode(&mut out)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
    }
    write_within(stream, out, stall).await.0
}

/// Sends `reply`. A fetch's batches go out from the buffer the shard read
/// them into, after a head that frames them (no copy into a frame); the
/// buffer then goes back to the server's reply pool, whether or not the
/// client took the reply.
async fn send_reply(
    shard: &impl ShardHandle,
    stream: &mut impl AsyncWriteRent,
    reply: Reply,
    stall: Duration,
) -> std::io::Result<()> {
    let f = match reply.result {
        Ok(Body::Fetched(f)) => f,
        result => return write_reply(stream, &Reply { result, ..reply }, stall).await,
    };
    let head = match Reply::encode_fetch_head(reply.correlation, &f) {
        Ok(head) => head,
        // Too long to frame: write_reply answers with the encoding error.
        Err(_) => {
            let reply = Reply::ok(Opcode::Fetch, reply.correlation, Body::Fetched(f));
            return write_reply(stream, &reply, stall).await;
        }
    };
    let (sent, _) = write_within(stream, head.to_vec(), stall).await;
    let (sent, batches) = match sent {
        Ok(()) => write_within(stream, f.batches, stall).await,
        Err(e) => (Err(e), Some(f.batches)),
    };
    if let Some(buf) = batches {
        if shard.reply_pool().put(buf) == Put::Dropped {
            metrics::inc(&shard.metrics().reply_buffers_dropped_total);
        }
    }
    sent
}

/// Writes all of `buf`, failing with TimedOut if the peer takes no bytes
/// for `stall`: a client that stops reading cannot hold a reply (and its
/// budget) forever. Hands the buffer back unless a write timed out (the
/// runtime keeps it until the cancelled write completes).
async fn write_within(
    stream: &mut impl AsyncWriteRent,
    mut buf: Vec<u8>,
    stall: Duration,
) -> (std::io::Result<()>, Option<Vec<u8>>) {
    let mut pos = 0;
    while pos < buf.len() {
        let end = buf.len();
        match monoio::time::timeout(stall, stream.write(buf.slice(pos..end))).await {
            Err(_) => {
                let e = std::io::Error::new(std::io::ErrorKind::TimedOut, "client stopped reading");
                return (Err(e), None);
            }
            Ok((Ok(0), slice)) => {
                return (
                    Err(std::io::ErrorKind::WriteZero.into()),
                    Some(slice.into_inner()),
                )
            }
            Ok((Ok(n), slice)) => {
                buf = slice.into_inner();
                pos += n;
            }
            Ok((Err(e), slice)) => return (Err(e), Some(slice.into_inner())),
        }
    }
    (Ok(()), Some(buf))
}

/// Scratch for discarding a body that did not fit the budget.
const DRAIN_CHUNK_BYTES: usize = 4096;
/// The first read of a body: a Produce head with a short topic and a
/// partition target fits, and few batch bytes land before the batch's own
/// buffer (they are copied there).
const HEAD_READ_BYTES: usize = 256;

struct Limits {
    frame_max: u32,
    header_timeout: Duration,
    idle_timeout: Duration,
}

impl Limits {
    fn of(config: &ServerConfig) -> Limits {
        Limits {
            frame_max: config.frame_bytes_max,
            header_timeout: Duration::from_millis(config.header_timeout_ms),
            idle_timeout: Duration::from_millis(config.idle_timeout_ms),
        }
    }
}

/// Why a connection stops reading.
enum Stop {
    /// Closed or reset by the peer.
    Closed,
    TimedOut,
}

enum Frame {
    /// A whole body and the budget it holds.
    Body(Vec<u8>, Charge),
    /// A Produce whose head passed the frame checksum, its batch read into
    /// a buffer of its own (the batch's own checksums are checked when it
    /// is appended), and the budget it holds.
    Produce(ProduceHead, ClientBatch, Charge),
    /// The body did not fit the budget and was discarded.
    OverBudget { opcode: u16, correlation: u32 },
    /// The header does not decode: answer, then close.
    BadHeader(WireError),
    /// Nothing to answer: close.
    Gone,
}

/// One read into `buf[len..end]` within `limit`. The buffer is lost on a
/// timeout (the runtime owns it until the cancelled read completes); the
/// connection is closed then anyway.
async fn read_some(
    stream: &mut impl AsyncReadRent,
    buf: Vec<u8>,
    end: usize,
    limit: Duration,
) -> Result<Vec<u8>, Stop> {
    let start = buf.len();
    debug_assert!(start < end && end <= buf.capacity());
    match monoio::time::timeout(limit, stream.read(buf.slice_mut(start..end))).await {
        Err(_) => Err(Stop::TimedOut),
        Ok((Ok(0), _)) | Ok((Err(_), _)) => Err(Stop::Closed),
        Ok((Ok(_), slice)) => Ok(slice.into_inner()),
    }
}

async fn read_frame(
    shard: &impl ShardHandle,
    budget: &Rc<ByteBudget>,
    limits: &Limits,
    stream: &mut impl AsyncReadRent,
) -> Frame {
    let m = shard.metrics();
    let counted = |stop: Stop, timeouts: &AtomicU64| {
        if let Stop::TimedOut = stop {
            metrics::inc(timeouts);
        }
        Frame::Gone
    };
    let buf = Vec::with_capacity(FRAME_HEADER_LEN);
    let mut buf = match read_some(stream, buf, FRAME_HEADER_LEN, limits.idle_timeout).await {
        Ok(b) => b,
        Err(stop) => return counted(stop, &m.idle_timeouts_total),
    };
    let deadline = Instant::now() + limits.header_timeout;
    while buf.len() < FRAME_HEADER_LEN {
        let left = deadline.saturating_duration_since(Instant::now());
        buf = match read_some(stream, buf, FRAME_HEADER_LEN, left).await {
            Ok(b) => b,
            Err(stop) => return counted(stop, &m.header_timeouts_total),
        };
    }
    let mut head = [0u8; FRAME_HEADER_LEN];
    head.copy_from_slice(&buf);
    let header = match decode_frame_header(&head, limits.frame_max) {
        Ok(h) => h,
        Err(e) => return Frame::BadHeader(e),
    };
    let len = header.body_len as usize;
    let Some(charge) = budget.try_charge(u64::from(header.body_len)) else {
        return match discard_body(stream, len, limits.header_timeout).await {
            Ok((opcode, correlation)) => Frame::OverBudget {
                opcode,
                correlation,
            },
            Err(stop) => counted(stop, &m.header_timeouts_total),
        };
    };
    let stall = limits.header_timeout;
    let read = async {
        let (prefix, split) = read_head(stream, len, stall).await?;
        match split {
            RequestSplit::Produce(head) => {
                if let Err(e) = header.verify(&prefix[..head.head_len]) {
                    return Ok(Frame::BadHeader(e));
                }
                let batch_len = len - head.head_len;
                let over = &prefix[head.head_len..];
                let lent = super::dispatch::produce_destination(shard, &head.topic, &head.target)
                    .filter(|(owner, _)| *owner == shard.id())
                    .and_then(|(_, pid)| shard.lend_produce_buffer(pid, batch_len));
                let batch = match lent {
                    Some(buf) => ClientBatch::Aligned(
                        read_batch_lent(stream, over, buf, batch_len, stall).await?,
                    ),
                    None => ClientBatch::Heap(read_batch(stream, over, batch_len, stall).await?),
                };
                Ok(Frame::Produce(head, batch, charge))
            }
            _ => {
                let body = read_body(stream, prefix, len, stall).await?;
                Ok(checked(&header, body, charge))
            }
        }
    };
    match read.await {
        Ok(frame) => frame,
        Err(stop) => counted(stop, &m.header_timeouts_total),
    }
}

fn checked(header: &FrameHeader, body: Vec<u8>, charge: Charge) -> Frame {
    match header.verify(&body) {
        Ok(()) => Frame::Body(body, charge),
        Err(e) => Frame::BadHeader(e),
    }
}

/// Reads the start of a `len`-byte body until it tells what the frame
/// checksum covers ([`split_request`]): at most a Produce head's bound.
async fn read_head(
    stream: &mut impl AsyncReadRent,
    len: usize,
    stall: Duration,
) -> Result<(Vec<u8>, RequestSplit), Stop> {
    let cap = len.min(PRODUCE_HEAD_BYTES_MAX);
    let mut prefix = Vec::with_capacity(cap);
    let mut end = len.min(HEAD_READ_BYTES);
    loop {
        let split = split_request(&prefix);
        if split != RequestSplit::NeedMore {
            return Ok((prefix, split));
        }
        if prefix.len() == cap {
            return Ok((prefix, RequestSplit::Whole));
        }
        if prefix.len() == end {
            end = cap;
        }
        prefix = read_some(stream, prefix, end, stall).await?;
    }
}

/// Reads the rest of a `len`-byte body that starts with `prefix` into one
/// buffer of exactly that size: growing it as bytes arrive copied most of a
/// large body once more (64 KiB, 128 KiB, ... up to 1 MiB: 0.94 MiB copied
/// per 1 MiB body). The budget took `len` first, and pages become resident
/// only as the bytes arrive.
async fn read_body(
    stream: &mut impl AsyncReadRent,
    prefix: Vec<u8>,
    len: usize,
    stall: Duration,
) -> Result<Vec<u8>, Stop> {
    let mut body = prefix;
    body.reserve_exact(len - body.len());
    while body.len() < len {
        body = read_some(stream, body, len, stall).await?;
    }
    Ok(body)
}

/// Reads a Produce's `batch_len`-byte batch, of which `over` (read with the
/// head) came first, straight into the batch's own buffer: the request
/// decode does not copy it out of a body.
async fn read_batch(
    stream: &mut impl AsyncReadRent,
    over: &[u8],
    batch_len: usize,
    stall: Duration,
) -> Result<Vec<u8>, Stop> {
    debug_assert!(over.len() <= batch_len);
    let mut batch = Vec::with_capacity(batch_len);
    batch.extend_from_slice(over);
    while batch.len() < batch_len {
        batch = read_some(stream, batch, batch_len, stall).await?;
    }
    Ok(batch)
}

/// [`read_batch`] into `buf`, lent by the owning shard's store pool at the
/// lead the batch will have on disk, which the store then writes as it is.
async fn read_batch_lent(
    stream: &mut impl AsyncReadRent,
    over: &[u8],
    mut buf: BatchBuf,
    batch_len: usize,
    stall: Duration,
) -> Result<BatchBuf, Stop> {
    debug_assert!(over.len() <= batch_len && batch_len <= buf.batch_capacity());
    buf.extend_from_slice(over);
    let mut rx = BatchRx(buf);
    while rx.0.batch().len() < batch_len {
        let start = rx.0.batch().len();
        let read = stream.read(rx.slice_mut(start..batch_len));
        rx = match monoio::time::timeout(stall, read).await {
            Err(_) => return Err(Stop::TimedOut),
            Ok((Ok(0), _)) | Ok((Err(_), _)) => return Err(Stop::Closed),
            Ok((Ok(_), slice)) => slice.into_inner(),
        };
    }
    Ok(rx.0)
}

/// A lent batch buffer as the runtime reads into it: positions count from
/// the batch's start (after its lead).
struct BatchRx(BatchBuf);

// SAFETY: the pointer is the batch's start inside the buffer's one heap
// allocation, which stays put while the runtime holds the value (moving a
// BatchBuf moves only its handle); `bytes_total` is the room after it, and
// `set_init` only grows the batch within it (the buffer's bytes were
// zeroed when it was allocated, so all of them are initialised).
unsafe impl IoBuf for BatchRx {
    fn read_ptr(&self) -> *const u8 {
        self.0.batch().as_ptr()
    }

    fn bytes_init(&self) -> usize {
        self.0.batch().len()
    }
}

// SAFETY: as for IoBuf above.
unsafe impl IoBufMut for BatchRx {
    fn write_ptr(&mut self) -> *mut u8 {
        self.0.batch_mut().as_mut_ptr()
    }

    fn bytes_total(&mut self) -> usize {
        self.0.batch_capacity()
    }

    unsafe fn set_init(&mut self, pos: usize) {
        if pos > self.0.batch().len() {
            self.0.set_batch_len(pos);
        }
    }
}

/// Reads and drops `len` bytes; returns the opcode and correlation from the
/// body's first 8 bytes (opcode u16, flags u16, correlation u32) so the
/// refusal can be addressed.
async fn discard_body(
    stream: &mut impl AsyncReadRent,
    len: usize,
    stall: Duration,
) -> Result<(u16, u32), Stop> {
    let mut prefix = [0u8; 8];
    let mut got = 0usize;
    let mut chunk = Vec::with_capacity(DRAIN_CHUNK_BYTES.min(len));
    while got < len {
        chunk.clear();
        let end = chunk.capacity().min(len - got);
        chunk = read_some(stream, chunk, end, stall).await?;
        for (i, b) in chunk.iter().enumerate() {
            if let Some(p) = prefix.get_mut(got + i) {
                *p = *b;
            }
        }
        got += chunk.len();
    }
    let opcode = u16::from_le_bytes([prefix[0], prefix[1]]);
    let correlation = u32::from_le_bytes([prefix[4], prefix[5], prefix[6], prefix[7]]);
    Ok((opcode, correlation))
}

/// Budget a request holds beside its body until its reply is written: a
/// fetch's reply room.
fn reply_room_bytes(limits: &Limits, req: &Request) -> u64 {
    match req {
        Request::Fetch { max_bytes, .. } => u64::from((*max_bytes).min(limits.frame_max)),
        _ => 0,
    }
}

fn over_budget(shard: &impl ShardHandle, opcode: u16, correlation: u32) -> Reply {
    metrics::inc(&shard.metrics().over_budget_total);
    Reply::error(
        opcode,
        correlation,
        ErrorCode::Backpressure,
        format!(
            "shard {} has its request byte budget (shard_request_bytes_max = {}) in use; retry",
            shard.id(),
            shard.config().shard_request_bytes_max
        ),
    )
}

/// Where a request's service time is recorded: produce and fetch only.
fn latency_histogram<'m>(
    m: &'m metrics::ShardMetrics,
    req: &Request,
) -> Option<&'m metrics::Histogram> {
    match req {
        Request::Produce { .. } => Some(&m.produce_latency_us),
        Request::Fetch { .. } => Some(&m.fetch_latency_us),
        _ => None,
    }
}

fn count_write_error(shard: &impl ShardHandle, e: &std::io::Error) {
    if e.kind() == std::io::ErrorKind::TimedOut {
        metrics::inc(&shard.metrics().write_timeouts_total);
    }
}

/// A reply owed to the client, in request order: ready at once (answered
/// without the shard: errors, Hello) or from its request's task.
enum Owed {
    Ready(Reply),
    Running(oneshot::Receiver<Answered>),
}

/// A reply and the budget its request held, given back once it is written.
type Answered = (Reply, Held);

/// Budget a request holds until its reply is written: a produce's body, a
/// fetch's reply room.
type Held = (Option<Charge>, Option<Charge>);

/// One connection's requests between being read and their reply being
/// written. The reader pushes at the back, the writer pops at the front,
/// so replies go out in request order whatever order requests finish in.
/// Bound: `requests_in_flight_max` requests (queued plus the one whose
/// reply is being written); at the bound the reader waits for a write.
struct Pipeline {
    owed: RefCell<VecDeque<Owed>>,
    in_flight: Cell<usize>,
    in_flight_max: usize,
    /// Reader to writer: something was queued, or reading stopped.
    queued: Notify,
    /// Writer to reader: a reply was written (room in the bound).
    written: Notify,
    reading_stopped: Cell<bool>,
}

impl Pipeline {
    fn new(in_flight_max: usize) -> Pipeline {
        assert!(
            in_flight_max > 0,
            "requests_in_flight_max is validated positive"
        );
        Pipeline {
            owed: RefCell::new(VecDeque::with_capacity(in_flight_max)),
            in_flight: Cell::new(0),
            in_flight_max,
            queued: Notify::default(),
            written: Notify::default(),
            reading_stopped: Cell::new(false),
        }
    }

    /// Waits until one more request fits the bound.
    async fn room(&self) {
        while self.in_flight.get() >= self.in_flight_max {
            self.written.notified().await;
        }
    }

    fn push(&self, owed: Owed) {
        debug_assert!(self.in_flight.get() < self.in_flight_max);
        self.in_flight.set(self.in_flight.get() + 1);
        self.owed.borrow_mut().push_back(owed);
        self.queued.notify();
    }

    fn stop_reading(&self) {
        self.reading_stopped.set(true);
        self.queued.notify();
    }

    /// The next owed reply, or None once reading stopped and all are out.
    async fn next(&self) -> Option<Owed> {
        loop {
            if let Some(o) = self.owed.borrow_mut().pop_front() {
                return Some(o);
            }
            if self.reading_stopped.get() {
                return None;
            }
            self.queued.notified().await;
        }
    }

    fn reply_written(&self) {
        debug_assert!(self.in_flight.get() > 0);
        self.in_flight.set(self.in_flight.get() - 1);
        self.written.notify();
    }
}

/// Serves one connection until it closes, errs, times out, or the shard
/// stops. Requests are read while earlier ones run (up to
/// `requests_in_flight_max`); replies are written in request order.
async fn serve<S: ShardHandle + 'static>(
    shard: &Rc<S>,
    budget: &Rc<ByteBudget>,
    stream: TcpStream,
) {
    let (mut rd, mut wr) = stream.into_split();
    let pipeline = Pipeline::new(shard.config().requests_in_flight_max);
    let stall = Duration::from_millis(shard.config().header_timeout_ms);
    let mut reader = std::pin::pin!(read_requests(shard, budget, &mut rd, &pipeline));
    let mut writer = std::pin::pin!(write_replies(&**shard, &mut wr, &pipeline, stall));
    // The writer ends first on a failed write or a reply that closes the
    // connection: nothing more is read. The reader ends first when the
    // client is gone or sent a bad frame: the replies owed still go out.
    let reader_ended = monoio::select! {
        _ = &mut writer => false,
        _ = &mut reader => true,
    };
    if reader_ended {
        writer.await;
    }
}

/// Reads requests and starts them, queueing their replies in order, until
/// the client is gone, a frame is bad, or the shard stops.
async fn read_requests<S: ShardHandle + 'static>(
    shard: &Rc<S>,
    budget: &Rc<ByteBudget>,
    stream: &mut OwnedReadHalf<TcpStream>,
    pipeline: &Pipeline,
) {
    let limits = Limits::of(shard.config());
    let mut greeted = false;
    loop {
        pipeline.room().await;
        if shard.is_stopping() {
            let r = Reply::error(0, 0, ErrorCode::ShuttingDown, "server shutting down");
            pipeline.push(Owed::Ready(r));
            break;
        }
        match read_frame(&**shard, budget, &limits, stream).await {
            Frame::Body(body, charge) => {
                let (correlation, opcode, decoded) = Request::decode(&body);
                drop(body);
                let request = (correlation, opcode, decoded.map(Incoming::Wire));
                let owed = start_request(shard, budget, &limits, &mut greeted, request, charge);
                pipeline.push(owed);
            }
            Frame::Produce(head, batch, charge) => {
                let request = produce_request(head, batch);
                let owed = start_request(shard, budget, &limits, &mut greeted, request, charge);
                pipeline.push(owed);
            }
            Frame::Gone => break,
            Frame::BadHeader(e) => {
                metrics::inc(&shard.metrics().bad_frames_total);
                pipeline.push(Owed::Ready(Reply::error(0, 0, e.code(), e.to_string())));
                break;
            }
            Frame::OverBudget {
                opcode,
                correlation,
            } => pipeline.push(Owed::Ready(over_budget(&**shard, opcode, correlation))),
        }
    }
    pipeline.stop_reading();
}

/// Writes owed replies in order until none is left, a write fails, or a
/// reply closes the connection.
async fn write_replies(
    shard: &impl ShardHandle,
    stream: &mut OwnedWriteHalf<TcpStream>,
    pipeline: &Pipeline,
    stall: Duration,
) {
    while let Some(owed) = pipeline.next().await {
        let (reply, held) = match owed {
            Owed::Ready(r) => (r, (None, None)),
            Owed::Running(rx) => rx.await.unwrap_or_else(|| {
                // The request's task ended without answering (it panicked).
                let r = Reply::error(0, 0, ErrorCode::Internal, "request lost its reply");
                (r, (None, None))
            }),
        };
        let closes = matches!(&reply.result, Err((code, _)) if code.closes_connection());
        let written = send_reply(shard, stream, reply, stall).await;
        drop(held);
        pipeline.reply_written();
        if let Err(e) = written {
            count_write_error(shard, &e);
            return;
        }
        if closes {
            return;
        }
    }
}

/// A request as read: a decoded body, or a Produce whose batch was read
/// into its own buffer.
enum Incoming {
    Wire(Request),
    Produce {
        topic: String,
        target: ProduceTarget,
        batch: ClientBatch,
    },
}

/// A read request: correlation, raw opcode, the request or why not.
type Decoded = (u32, u16, Result<Incoming, WireError>);

/// The Produce request of a head and its batch, which must be exactly as
/// long as the head declares (or the request is malformed, as
/// `Request::decode` would say of the whole body).
fn produce_request(head: ProduceHead, batch: ClientBatch) -> Decoded {
    let opcode = Opcode::Produce as u16;
    let declared = head.batch_len as usize;
    let len = batch.as_ref().len();
    let result = match declared.cmp(&len) {
        std::cmp::Ordering::Equal => Ok(Incoming::Produce {
            topic: head.topic,
            target: head.target,
            batch,
        }),
        std::cmp::Ordering::Greater => Err(WireError::Truncated { what: "batch" }),
        std::cmp::Ordering::Less => Err(WireError::TrailingBytes {
            what: "request",
            extra: len - declared,
        }),
    };
    (head.correlation, opcode, result)
}

/// Answers one decoded request at once (bad body, Hello, no Hello yet,
/// over budget) or starts it on its own task.
fn start_request<S: ShardHandle + 'static>(
    shard: &Rc<S>,
    budget: &Rc<ByteBudget>,
    limits: &Limits,
    greeted: &mut bool,
    (correlation, opcode, decoded): Decoded,
    body_charge: Charge,
) -> Owed {
    // Only a produce keeps its body's bytes (as the batch) until the
    // reply; any other request's decoded form is small.
    let keeps_body = matches!(
        decoded,
        Ok(Incoming::Produce { .. } | Incoming::Wire(Request::Produce { .. }))
    );
    let body_charge = keeps_body.then_some(body_charge);
    let incoming = match decoded {
        Err(e) => {
            metrics::inc(&shard.metrics().bad_frames_total);
            return Owed::Ready(Reply::error(opcode, correlation, e.code(), e.to_string()));
        }
        Ok(Incoming::Wire(Request::Hello {
            version_min,
            version_max,
            client,
        })) => {
            let reply = hello(
                &**shard,
                limits,
                correlation,
                opcode,
                version_min,
                version_max,
            );
            if reply.result.is_ok() {
                *greeted = true;
                tracing::debug!(%client, "hello");
            }
            return Owed::Ready(reply);
        }
        Ok(_) if !*greeted => {
            return Owed::Ready(Reply::error(
                opcode,
                correlation,
                ErrorCode::HandshakeRequired,
                "the first request must be Hello",
            ))
        }
        Ok(incoming) => incoming,
    };
    let room = match &incoming {
        Incoming::Wire(req) => reply_room_bytes(limits, req),
        Incoming::Produce { .. } => 0,
    };
    let Some(reply_charge) = budget.try_charge(room) else {
        return Owed::Ready(over_budget(&**shard, opcode, correlation));
    };
    let (tx, rx) = oneshot::oneshot();
    let shard = shard.clone();
    monoio::spawn(async move {
        let started = Instant::now();
        let (reply, latency) = match incoming {
            Incoming::Wire(req) => {
                let latency = latency_histogram(shard.metrics(), &req);
                (
                    super::dispatch::handle(&*shard, correlation, req).await,
                    latency,
                )
            }
            Incoming::Produce {
                topic,
                target,
                batch,
            } => {
                let reply = super::dispatch::produce(&*shard, correlation, topic, target, batch);
                (reply.await, Some(&shard.metrics().produce_latency_us))
            }
        };
        if let Some(h) = latency {
            h.record(started.elapsed().as_micros() as u64);
        }
        tx.send((reply, (body_charge, Some(reply_charge))));
    });
    Owed::Running(rx)
}

fn hello(
    shard: &impl ShardHandle,
    limits: &Limits,
    correlation: u32,
    opcode: u16,
    version_min: u16,
    version_max: u16,
) -> Reply {
    if !(version_min..=version_max).contains(&PROTOCOL_VERSION) {
        return Reply::error(
            opcode,
            correlation,
            ErrorCode::UnsupportedVersion,
            format!(
                "server speaks version {PROTOCOL_VERSION}, client asked for {version_min}..={version_max}"
            ),
        );
    }
    Reply::ok(
        Opcode::Hello,
        correlation,
        Body::Hello(HelloReply {
            version: PROTOCOL_VERSION,
            frame_bytes_max: limits.frame_max,
            batch_bytes_max: shard.config().store_config().batch_bytes_max() as u32,
            shards: shard.shard_count() as u16,
        }),
    )
}
