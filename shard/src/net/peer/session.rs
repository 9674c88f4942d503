//! The transport's tasks: accepting and authenticating inbound sessions and
//! delivering their frames; dialling, authenticating and feeding outbound
//! sessions; the deadline-bounded reads and writes under both.

use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use monoio::buf::{IoBuf, IoBufMut};
use monoio::io::{AsyncReadRent, AsyncWriteRent};
use monoio::net::{TcpListener, TcpStream};
use ringlog_protocol::wire::{decode_frame_header, WireError, FRAME_HEADER_LEN};

use super::backoff::Backoff;
use super::codec::{self, Inbound};
use super::hello::{self, Hello, Kind, Refusal, Role, HELLO_BYTES_MAX, PEER_PROTOCOL_VERSION};
use super::signal::Signal;
use super::{inc, Ctx, InboundEntry, NodeId, TaskGuard};

/// Largest first allocation of a frame body; the rest is allocated once
/// these bytes arrived, so a peer declaring a large frame and sending
/// nothing holds little memory (one sending a piece and stalling holds at
/// most `frame_bytes_max`, as a whole frame would).
const BODY_CHUNK_BYTES: usize = 64 * 1024;

/// Why a frame read stopped.
#[derive(Debug)]
pub(crate) enum ReadError {
    Closed,
    TimedOut,
    Wire(WireError),
}

/// How a handshake failed: a refusal (counted), or the connection itself.
#[derive(Debug)]
enum Failed {
    Refused(Refusal),
    Io(std::io::Error),
}

impl From<Refusal> for Failed {
    fn from(r: Refusal) -> Failed {
        Failed::Refused(r)
    }
}

/// One read into `buf[len..end]` by `deadline`.
async fn read_some(
    stream: &mut TcpStream,
    buf: Vec<u8>,
    end: usize,
    deadline: Instant,
) -> Result<Vec<u8>, ReadError> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(ReadError::TimedOut);
    }
    let start = buf.len();
    debug_assert!(start < end && end <= buf.capacity());
    match monoio::time::timeout(left, stream.read(buf.slice_mut(start..end))).await {
        Err(_) => Err(ReadError::TimedOut),
        Ok((Ok(0), _)) | Ok((Err(_), _)) => Err(ReadError::Closed),
        Ok((Ok(_), slice)) => Ok(slice.into_inner()),
    }
}

/// Reads one frame by `deadline`: its length checked against `body_max`
/// before any body byte is allocated, its checksum verified over the whole
/// body, or, for a session's frames (`session`), over what
/// [`codec::checksummed_len`] says it covers.
pub(crate) async fn read_frame(
    stream: &mut TcpStream,
    body_max: u32,
    deadline: Instant,
    session: bool,
) -> Result<Vec<u8>, ReadError> {
    let mut head = Vec::with_capacity(FRAME_HEADER_LEN);
    while head.len() < FRAME_HEADER_LEN {
        head = read_some(stream, head, FRAME_HEADER_LEN, deadline).await?;
    }
    let mut h = [0u8; FRAME_HEADER_LEN];
    h.copy_from_slice(&head);
    let header = decode_frame_header(&h, body_max).map_err(ReadError::Wire)?;
    let len = header.body_len as usize;
    let mut body = Vec::with_capacity(len.min(BODY_CHUNK_BYTES));
    while body.len() < len {
        if body.len() == body.capacity() {
            // Once the first piece arrived, room for the rest at once: one
            // move of at most BODY_CHUNK_BYTES, not a doubling's many.
            body.reserve_exact(len - body.len());
        }
        let end = body.capacity().min(len);
        body = read_some(stream, body, end, deadline).await?;
    }
    let covered = if session {
        codec::checksummed_len(&body)
    } else {
        body.len()
    };
    header.verify(&body[..covered]).map_err(ReadError::Wire)?;
    Ok(body)
}

/// Writes all of `buf`, failing with TimedOut if the peer takes no bytes
/// for `stall`; gives the buffer back for reuse.
async fn write_all(
    stream: &mut TcpStream,
    mut buf: Vec<u8>,
    stall: Duration,
) -> std::io::Result<Vec<u8>> {
    let mut pos = 0;
    while pos < buf.len() {
        let end = buf.len();
        match monoio::time::timeout(stall, stream.write(buf.slice(pos..end))).await {
            Err(_) => return Err(std::io::ErrorKind::TimedOut.into()),
            Ok((Ok(0), _)) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok((Ok(n), slice)) => {
                buf = slice.into_inner();
                pos += n;
            }
            Ok((Err(e), _)) => return Err(e),
        }
    }
    Ok(buf)
}

/// A handshake read's failure as a refusal (the caller counts it).
fn handshake_read(ctx: &Ctx, e: ReadError) -> Failed {
    match e {
        ReadError::TimedOut => Refusal::Timeout(ctx.limits.hello_timeout.as_millis() as u64).into(),
        ReadError::Closed => Failed::Io(std::io::ErrorKind::UnexpectedEof.into()),
        ReadError::Wire(w) => Refusal::Malformed(w.to_string()).into(),
    }
}

fn nonce() -> std::io::Result<[u8; hello::NONCE_BYTES]> {
    let mut n = [0u8; hello::NONCE_BYTES];
    getrandom::fill(&mut n).map_err(std::io::Error::from)?;
    Ok(n)
}

fn my_hello(ctx: &Ctx, to: NodeId) -> std::io::Result<Hello> {
    Ok(Hello {
        version: PEER_PROTOCOL_VERSION,
        cluster_id: ctx.cluster_id.clone(),
        node_id: ctx.node_id,
        to_node_id: to,
        shard_count: ctx.shard_count,
        incarnation: ctx.incarnation,
        client_addr: ctx.client_addr,
        nonce: nonce()?,
    })
}

/// Counts a refusal and logs it; tells the peer why.
async fn refuse(ctx: &Ctx, stream: &mut TcpStream, r: &Refusal, peer: SocketAddr) {
    ctx.stats.count_refusal(r);
    tracing::warn!(node = ctx.node_id, %peer, reason = super::REFUSAL_NAMES[r.index()],
        error = %r, "peer handshake refused");
    tell(stream, r).await;
}

/// Sends the Refuse message, best effort, unless the peer told us (or went
/// silent, so nobody listens).
async fn tell(stream: &mut TcpStream, r: &Refusal) {
    if !matches!(r, Refusal::ByPeer { .. } | Refusal::Timeout(_)) {
        let stall = Duration::from_millis(200);
        let _ = write_all(stream, r.encode(), stall).await;
    }
}

/// Decrements the in-progress handshake count when the handshake ends.
struct HandshakeSlot(Rc<Ctx>);

impl Drop for HandshakeSlot {
    fn drop(&mut self) {
        self.0.handshakes.set(self.0.handshakes.get() - 1);
    }
}

pub(crate) async fn accept_loop(ctx: Rc<Ctx>, listener: TcpListener, _task: TaskGuard) {
    loop {
        let accepted = monoio::select! {
            r = listener.accept() => Some(r),
            _ = ctx.stop.wait() => None,
        };
        let Some(result) = accepted else { break };
        let (stream, peer) = match result {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(node = ctx.node_id, error = %e, "peer accept failed");
                monoio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        if ctx.handshakes.get() >= ctx.limits.handshakes_max {
            // Unauthenticated connections must not pile up: close at once.
            ctx.stats.count_refusal(&Refusal::Busy);
            tracing::warn!(node = ctx.node_id, %peer, "peer handshake refused: too many in progress");
            continue;
        }
        ctx.handshakes.set(ctx.handshakes.get() + 1);
        let slot = HandshakeSlot(ctx.clone());
        let task = TaskGuard::new(&ctx);
        monoio::spawn(inbound(ctx.clone(), stream, peer, slot, task));
    }
    tracing::info!(node = ctx.node_id, "peer listener stopped");
}

/// Checks an initiator's Hello against this node before the challenge.
fn check_hello(ctx: &Ctx, h: &Hello) -> Result<(), Refusal> {
    if h.cluster_id != ctx.cluster_id {
        return Err(Refusal::Cluster {
            ours: ctx.cluster_id.clone(),
            theirs: h.cluster_id.clone(),
        });
    }
    if h.to_node_id != ctx.node_id {
        return Err(Refusal::WrongNode {
            expected: h.to_node_id,
            got: ctx.node_id,
        });
    }
    if h.node_id == ctx.node_id {
        return Err(Refusal::DuplicateNode(h.node_id));
    }
    if !ctx.peers.contains_key(&h.node_id) {
        return Err(Refusal::UnknownNode(h.node_id));
    }
    Ok(())
}

/// The acceptor's side of the handshake, all of it by `hello_timeout`.
async fn accept_handshake(ctx: &Ctx, stream: &mut TcpStream) -> Result<Hello, Failed> {
    let deadline = Instant::now() + ctx.limits.hello_timeout;
    let body = read_frame(stream, HELLO_BYTES_MAX, deadline, false)
        .await
        .map_err(|e| handshake_read(ctx, e))?;
    let theirs = Hello::decode_hello(&body)?;
    check_hello(ctx, &theirs)?;
    let fields = my_hello(ctx, theirs.node_id)
        .map_err(Failed::Io)?
        .body(Kind::Challenge);
    let proof_a = hello::proof(&ctx.secret, Role::Acceptor, &body, &fields);
    let left = deadline.saturating_duration_since(Instant::now());
    write_all(stream, hello::challenge(&fields, &proof_a), left)
        .await
        .map_err(Failed::Io)?;
    let reply = read_frame(stream, HELLO_BYTES_MAX, deadline, false)
        .await
        .map_err(|e| handshake_read(ctx, e))?;
    let got = hello::decode_proof(&reply)?;
    let want = hello::proof(&ctx.secret, Role::Initiator, &body, &fields);
    if !hello::proof_matches(&want, &got) {
        return Err(Refusal::BadProof.into());
    }
    Ok(theirs)
}

/// Records an authenticated session from `h.node_id`: the same process
/// reconnecting replaces its old session; another process with that id
/// while a session is live is a duplicate.
fn register(ctx: &Ctx, h: &Hello) -> Result<(u64, Rc<Signal>), Refusal> {
    let mut map = ctx.inbound.borrow_mut();
    if let Some(old) = map.get(&h.node_id) {
        if old.incarnation != h.incarnation {
            return Err(Refusal::DuplicateNode(h.node_id));
        }
        old.replaced.fire();
    }
    let session = ctx.next_session.get() + 1;
    ctx.next_session.set(session);
    let replaced = Rc::new(Signal::default());
    let entry = InboundEntry {
        incarnation: h.incarnation,
        session,
        replaced: replaced.clone(),
    };
    map.insert(h.node_id, entry);
    Ok((session, replaced))
}

async fn inbound(
    ctx: Rc<Ctx>,
    mut stream: TcpStream,
    peer: SocketAddr,
    slot: HandshakeSlot,
    _task: TaskGuard,
) {
    let _ = stream.set_nodelay(true);
    let shaken = monoio::select! {
        r = accept_handshake(&ctx, &mut stream) => r,
        _ = ctx.stop.wait() => return,
    };
    let hello = match shaken {
        Ok(h) => h,
        Err(Failed::Refused(r)) => return refuse(&ctx, &mut stream, &r, peer).await,
        Err(Failed::Io(e)) => {
            tracing::debug!(node = ctx.node_id, %peer, error = %e, "peer handshake ended");
            return;
        }
    };
    let (session, replaced) = match register(&ctx, &hello) {
        Ok(s) => s,
        Err(r) => return refuse(&ctx, &mut stream, &r, peer).await,
    };
    drop(slot);
    let stall = ctx.limits.idle_timeout;
    if write_all(&mut stream, hello::welcome_frame(), stall)
        .await
        .is_ok()
    {
        inc(&ctx.stats.sessions_accepted_total);
        tracing::info!(node = ctx.node_id, from = hello.node_id, %peer,
            incarnation = hello.incarnation, shards = hello.shard_count, "peer session accepted");
        let seen = ctx.stats.seen(hello.node_id);
        if let Some(seen) = seen {
            seen.incarnation.store(hello.incarnation, Ordering::Relaxed);
            seen.inbound.store(true, Ordering::Relaxed);
            seen.heard();
        }
        ctx.stats.set_client_addr(hello.node_id, hello.client_addr);
        serve(&ctx, hello.node_id, &mut stream, &replaced).await;
    }
    let mut map = ctx.inbound.borrow_mut();
    if map
        .get(&hello.node_id)
        .is_some_and(|e| e.session == session)
    {
        map.remove(&hello.node_id);
        // Not if a newer session of the node replaced this one.
        if let Some(seen) = ctx.stats.seen(hello.node_id) {
            seen.inbound.store(false, Ordering::Relaxed);
        }
    }
}

/// Reads frames of an authenticated session and delivers them, until the
/// peer closes, falls silent for `idle_timeout`, sends a bad frame, the
/// session is replaced or the transport stops.
async fn serve(ctx: &Ctx, from: NodeId, stream: &mut TcpStream, replaced: &Signal) {
    let max = ctx.limits.frame_bytes_max;
    loop {
        let deadline = Instant::now() + ctx.limits.idle_timeout;
        let read = monoio::select! {
            r = read_frame(stream, max, deadline, true) => r,
            _ = ctx.stop.wait() => return,
            _ = replaced.wait() => return,
        };
        if read.is_ok() {
            if let Some(seen) = ctx.stats.seen(from) {
                seen.heard();
            }
        }
        let why = match read.map(codec::decode_body) {
            Ok(Ok(Inbound::Heartbeat)) => continue,
            Ok(Ok(Inbound::Message(frame))) => {
                inc(&ctx.stats.frames_delivered_total);
                ctx.sink.deliver(from, frame);
                continue;
            }
            Ok(Err(bad)) => bad.to_string(),
            Err(ReadError::Wire(w)) => w.to_string(),
            Err(ReadError::Closed) => "closed by the peer".to_string(),
            Err(ReadError::TimedOut) => "silent past idle_timeout".to_string(),
        };
        if !why.starts_with("closed") && !why.starts_with("silent") {
            inc(&ctx.stats.bad_frames_total);
        }
        tracing::warn!(node = ctx.node_id, from, reason = %why, "peer session closed");
        return;
    }
}

/// The initiator's side: dial, Hello, check the challenge, prove, wait for
/// Welcome; all by `hello_timeout`. Returns the session and the client
/// address the peer announced.
async fn dial(
    ctx: &Ctx,
    to: NodeId,
    addr: SocketAddr,
) -> Result<(TcpStream, Option<SocketAddr>), Failed> {
    let deadline = Instant::now() + ctx.limits.hello_timeout;
    let mut stream =
        match monoio::time::timeout(ctx.limits.hello_timeout, TcpStream::connect(addr)).await {
            Err(_) => return Err(Failed::Io(std::io::ErrorKind::TimedOut.into())),
            Ok(r) => r.map_err(Failed::Io)?,
        };
    let _ = stream.set_nodelay(true);
    let mine = my_hello(ctx, to).map_err(Failed::Io)?;
    let hello_body = mine.body(Kind::Hello);
    let left = deadline.saturating_duration_since(Instant::now());
    write_all(&mut stream, hello::hello_frame(&mine), left)
        .await
        .map_err(Failed::Io)?;
    let body = read_frame(&mut stream, HELLO_BYTES_MAX, deadline, false)
        .await
        .map_err(|e| handshake_read(ctx, e))?;
    let checked = check_challenge(ctx, to, &hello_body, &body);
    let (proof_i, client_addr) = match checked {
        Ok(p) => p,
        Err(r) => {
            tell(&mut stream, &r).await;
            return Err(r.into());
        }
    };
    let left = deadline.saturating_duration_since(Instant::now());
    write_all(&mut stream, hello::proof_frame(&proof_i), left)
        .await
        .map_err(Failed::Io)?;
    let reply = read_frame(&mut stream, HELLO_BYTES_MAX, deadline, false)
        .await
        .map_err(|e| handshake_read(ctx, e))?;
    hello::decode_welcome(&reply)?;
    Ok((stream, client_addr))
}

/// Checks the acceptor's Challenge; returns our proof and the client
/// address it announced.
fn check_challenge(
    ctx: &Ctx,
    to: NodeId,
    hello_body: &[u8],
    body: &[u8],
) -> Result<([u8; hello::PROOF_BYTES], Option<SocketAddr>), Refusal> {
    let (theirs, fields, proof_a) = Hello::decode_challenge(body)?;
    if theirs.cluster_id != ctx.cluster_id {
        return Err(Refusal::Cluster {
            ours: ctx.cluster_id.clone(),
            theirs: theirs.cluster_id,
        });
    }
    if theirs.node_id != to || theirs.to_node_id != ctx.node_id {
        return Err(Refusal::WrongNode {
            expected: to,
            got: theirs.node_id,
        });
    }
    let want = hello::proof(&ctx.secret, Role::Acceptor, hello_body, fields);
    if !hello::proof_matches(&want, &proof_a) {
        return Err(Refusal::BadProof);
    }
    let proof_i = hello::proof(&ctx.secret, Role::Initiator, hello_body, fields);
    Ok((proof_i, theirs.client_addr))
}

/// Keeps a session to `to` up: dial, feed it the queue, and on failure
/// back off (jittered, capped) and dial again, until the transport stops.
pub(crate) async fn connector(ctx: Rc<Ctx>, to: NodeId, _task: TaskGuard) {
    let Some(out) = ctx.outbound.get(&to) else {
        return;
    };
    let mut backoff = Backoff::new(ctx.limits.reconnect_min, ctx.limits.reconnect_max);
    // Warn once per outage, not at every redial.
    let mut warned = false;
    while !ctx.stop.is_set() {
        let dialled = monoio::select! {
            r = dial(&ctx, to, out.addr) => r,
            _ = ctx.stop.wait() => break,
        };
        match dialled {
            Ok((mut stream, client_addr)) => {
                backoff.reset();
                ctx.stats.set_client_addr(to, client_addr);
                warned = false;
                inc(&ctx.stats.sessions_connected_total);
                out.connected.set(true);
                if let Some(seen) = ctx.stats.seen(to) {
                    seen.connected.store(true, Ordering::Relaxed);
                    seen.heard();
                }
                tracing::info!(node = ctx.node_id, to, addr = %out.addr, "peer connected");
                let result = pump(&ctx, to, &mut stream).await;
                out.connected.set(false);
                if let Some(seen) = ctx.stats.seen(to) {
                    seen.connected.store(false, Ordering::Relaxed);
                }
                if let Err(e) = result {
                    tracing::warn!(node = ctx.node_id, to, error = %e, "peer connection lost");
                }
            }
            Err(failed) => {
                inc(&ctx.stats.connect_failures_total);
                match failed {
                    Failed::Refused(r) => {
                        // Ours (its Challenge did not check) or the peer's.
                        ctx.stats.count_refusal(&r);
                        tracing::warn!(node = ctx.node_id, to, reason = super::REFUSAL_NAMES[r.index()],
                            error = %r, "peer refused the session");
                    }
                    Failed::Io(e) if !warned => {
                        warned = true;
                        tracing::warn!(node = ctx.node_id, to, addr = %out.addr, error = %e,
                            "peer unreachable; retrying with backoff");
                    }
                    Failed::Io(_) => {}
                }
            }
        }
        let random = getrandom::u64().unwrap_or(0);
        let delay = backoff.next_delay(random);
        monoio::select! {
            _ = monoio::time::sleep(delay) => {},
            _ = ctx.stop.wait() => {},
        }
    }
}

/// Writes queued frames (batched up to `write_batch_bytes`) and heartbeats
/// while idle, until a write fails or the transport stops.
async fn pump(ctx: &Ctx, to: NodeId, stream: &mut TcpStream) -> std::io::Result<()> {
    let Some(out) = ctx.outbound.get(&to) else {
        return Ok(());
    };
    let mut buf = Vec::with_capacity(ctx.limits.write_batch_bytes);
    loop {
        if ctx.stop.is_set() {
            return Ok(());
        }
        buf.clear();
        let batch_bytes = ctx.limits.write_batch_bytes;
        // A frame of a batch's size goes as it is (no copy into the batch).
        let whole = out.queue.borrow_mut().pop_whole(batch_bytes);
        if let Some(frame) = whole {
            if let Err(e) = write_all(stream, frame, ctx.limits.idle_timeout).await {
                inc(&ctx.stats.queue_drops_total);
                return Err(e);
            }
            inc(&ctx.stats.frames_sent_total);
            continue;
        }
        let n = out.queue.borrow_mut().drain_into(&mut buf, batch_bytes);
        if n == 0 {
            let idle = monoio::select! {
                _ = out.pulse.wait() => false,
                _ = monoio::time::sleep(ctx.limits.heartbeat_interval) => true,
                _ = ctx.stop.wait() => return Ok(()),
            };
            if !idle {
                continue;
            }
            buf.extend_from_slice(&codec::encode_heartbeat());
        }
        match write_all(stream, buf, ctx.limits.idle_timeout).await {
            Ok(b) => {
                buf = b;
                ctx.stats
                    .frames_sent_total
                    .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
            }
            Err(e) => {
                ctx.stats
                    .queue_drops_total
                    .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
                return Err(e);
            }
        }
    }
}
