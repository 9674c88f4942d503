//! The replication transport between nodes: authenticated TCP sessions
//! carrying checksummed frames addressed to a partition.
//!
//! * Where it runs: on shard 0's monoio runtime, one listener and one
//!   connector per other node. Peer traffic is a few connections per node
//!   whatever the shard count (each node may run a different count), and a
//!   frame for a partition on another shard goes on through the host's
//!   [`PeerSink`] (the cross-shard mailbox once replicas are wired).
//! * Connections: each node dials every other node and sends only on the
//!   connection it dialled, so a pair has two one-way sessions and no
//!   tie-breaking is needed when both dial at once.
//! * Handshake (see `hello`): Hello, then a challenge-response with a
//!   keyed hash under the cluster secret, mutual; until the acceptor has
//!   checked the initiator's proof it reads nothing but the handshake, so a
//!   process without the secret cannot deliver a single frame. Refusals
//!   (another cluster, an unknown or duplicate node id, a version mismatch,
//!   a bad proof, garbage, a missed deadline) are typed ([`Refusal`]),
//!   logged and counted ([`PeerStats::refused_total`]).
//! * Incarnation: a random u64 drawn at each process start (not a
//!   persisted counter: it needs no durable state, and a wiped data dir,
//!   which is exactly when peers must see a new process, would reset a
//!   counter). Peers only compare it for equality: the same incarnation
//!   reconnecting replaces its old session; another incarnation claiming
//!   a node id that has a live session is refused as a duplicate (a real
//!   restart gets in once the old session ends: at once when the process
//!   died, the kernel closes its sockets; else after `idle_timeout`).
//!
//! Bounds ([`PeerLimits`], defaults stated there): the handshake within
//! `hello_timeout`, each handshake message at most `HELLO_BYTES_MAX` bytes,
//! at most `handshakes_max` handshakes at once; frames at most
//! `frame_bytes_max` (the client protocol's limit), length checked before
//! allocation; per peer a send queue of `queue_frames_max` frames and
//! `queue_bytes_max` bytes, overflow dropped and counted (replication
//! retransmits); reconnects back off from `reconnect_min` to
//! `reconnect_max` with jitter; an inbound session silent for
//! `idle_timeout` is closed (connectors send heartbeats).

mod backoff;
mod codec;
mod hello;
mod queue;
mod session;
mod signal;
#[cfg(test)]
mod tests;

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use codec::{
    Outgoing, PeerFrame, PeerPayload, MESSAGE_PREFIX_BYTES, SELF_CHECKED_COVERED_BYTES,
};
pub use hello::{Refusal, HELLO_BYTES_MAX, PEER_PROTOCOL_VERSION, REFUSAL_KINDS, REFUSAL_NAMES};

use crate::config::{ClusterConfig, ClusterSecret};
use queue::SendQueue;
use signal::{Pulse, Signal};

pub type NodeId = u32;

/// Where verified frames from authenticated peers go; the shard host
/// implements it (routing to the partition's owner). Called on the
/// transport's shard, in arrival order per peer.
pub trait PeerSink {
    fn deliver(&self, from: NodeId, frame: PeerFrame);
}

/// The transport's bounds and timings.
#[derive(Clone, Debug)]
pub struct PeerLimits {
    /// Largest frame body (the client protocol's `frame_bytes_max`).
    pub frame_bytes_max: u32,
    /// Frames one peer's send queue holds (default 4096).
    pub queue_frames_max: usize,
    /// Bytes one peer's send queue holds (default 64 MiB).
    pub queue_bytes_max: usize,
    /// The whole handshake must finish within this (default 5 s).
    pub hello_timeout: Duration,
    /// Inbound handshakes in progress at once; more are closed at once
    /// (default 16).
    pub handshakes_max: usize,
    /// A connector with nothing to send sends a heartbeat this often
    /// (default 500 ms).
    pub heartbeat_interval: Duration,
    /// An inbound session with no frame for this long is closed (default
    /// 5 s); also the stall limit of one write.
    pub idle_timeout: Duration,
    /// First reconnect delay (default 50 ms).
    pub reconnect_min: Duration,
    /// Longest reconnect delay (default 5 s).
    pub reconnect_max: Duration,
    /// Most queued bytes gathered into one write (default 1 MiB).
    pub write_batch_bytes: usize,
}

impl PeerLimits {
    pub fn new(frame_bytes_max: u32) -> PeerLimits {
        PeerLimits {
            frame_bytes_max,
            queue_frames_max: 4096,
            queue_bytes_max: 64 * 1024 * 1024,
            hello_timeout: Duration::from_secs(5),
            handshakes_max: 16,
            heartbeat_interval: Duration::from_millis(500),
            idle_timeout: Duration::from_secs(5),
            reconnect_min: Duration::from_millis(50),
            reconnect_max: Duration::from_secs(5),
            write_batch_bytes: 1024 * 1024,
        }
    }
}

/// Counters of one node's transport (readable from any thread).
#[derive(Debug, Default)]
pub struct PeerStats {
    /// Inbound sessions authenticated.
    pub sessions_accepted_total: AtomicU64,
    /// Outbound sessions authenticated (the peer welcomed us).
    pub sessions_connected_total: AtomicU64,
    /// Dials that failed before a session (refused, unreachable, reset).
    pub connect_failures_total: AtomicU64,
    /// Handshakes refused, by [`Refusal::index`] (ours or the peer's).
    pub refused_total: [AtomicU64; REFUSAL_KINDS],
    /// Inbound frames dropped as garbage after the handshake (bad
    /// checksum, too large, unknown kind); the session is closed.
    pub bad_frames_total: AtomicU64,
    pub frames_sent_total: AtomicU64,
    pub frames_delivered_total: AtomicU64,
    /// Frames not queued because the peer's queue was full, plus frames
    /// lost with a broken connection.
    pub queue_drops_total: AtomicU64,
    /// Each other node as the transport last saw it (`ctl cluster`);
    /// fixed at construction ([`PeerStats::for_nodes`]), empty by default.
    pub nodes: BTreeMap<NodeId, NodeSeen>,
}

/// One peer node's sessions as last seen (readable from any thread).
#[derive(Debug, Default)]
pub struct NodeSeen {
    /// Our session to it is up (we can send).
    pub connected: AtomicBool,
    /// Its session to us is up (it can send to us).
    pub inbound: AtomicBool,
    /// The incarnation its last authenticated session announced (0: none).
    pub incarnation: AtomicU64,
    /// Unix time (ms) it was last heard from: a frame, a heartbeat or a
    /// session change (0: never).
    pub last_seen_unix_ms: AtomicU64,
    /// The client address its last authenticated session announced
    /// (None: none yet, or it announced none).
    pub client_addr: Mutex<Option<SocketAddr>>,
}

impl NodeSeen {
    fn heard(&self) {
        let ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        self.last_seen_unix_ms.store(ms, Ordering::Relaxed);
    }
}

impl PeerStats {
    /// Counters with a [`NodeSeen`] entry for each of `nodes`.
    pub fn for_nodes(nodes: impl IntoIterator<Item = NodeId>) -> PeerStats {
        PeerStats {
            nodes: nodes
                .into_iter()
                .map(|n| (n, NodeSeen::default()))
                .collect(),
            ..PeerStats::default()
        }
    }

    fn seen(&self, node: NodeId) -> Option<&NodeSeen> {
        self.nodes.get(&node)
    }

    /// Where `node` serves clients, as its last session announced.
    pub fn client_addr(&self, node: NodeId) -> Option<SocketAddr> {
        let seen = self.seen(node)?;
        // A poisoned lock still holds a whole address (a plain store).
        *seen.client_addr.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn set_client_addr(&self, node: NodeId, addr: Option<SocketAddr>) {
        if let Some(seen) = self.seen(node) {
            *seen.client_addr.lock().unwrap_or_else(|p| p.into_inner()) = addr;
        }
    }

    pub fn refused(&self, kind: usize) -> u64 {
        self.refused_total[kind].load(Ordering::Relaxed)
    }

    fn count_refusal(&self, r: &Refusal) {
        self.refused_total[r.index()].fetch_add(1, Ordering::Relaxed);
    }
}

fn inc(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// Everything the transport starts with.
pub struct PeerSetup {
    pub cluster: ClusterConfig,
    /// Bound to `cluster.listen` by the caller (errors surface at boot).
    pub listener: std::net::TcpListener,
    pub limits: PeerLimits,
    pub shard_count: u16,
    /// This process's incarnation ([`new_incarnation`]).
    pub incarnation: u64,
    /// This node's bound client listen address, announced in the Hello.
    pub client_addr: Option<SocketAddr>,
    pub sink: Box<dyn PeerSink + Send>,
    pub stats: Arc<PeerStats>,
}

/// A random incarnation for this process start.
pub fn new_incarnation() -> std::io::Result<u64> {
    getrandom::u64().map_err(std::io::Error::from)
}

/// Why [`PeerHandle::send`] did not queue a frame.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SendError {
    #[error("node {0} is not a peer of this node")]
    UnknownPeer(NodeId),
    #[error("payload of {len_bytes} bytes exceeds the peer frame limit ({max_bytes})")]
    TooLarge { len_bytes: usize, max_bytes: usize },
    /// Dropped and counted; replication retransmits.
    #[error("send queue to node {0} is full; frame dropped")]
    QueueFull(NodeId),
}

/// One peer we dial.
struct Outbound {
    addr: SocketAddr,
    queue: RefCell<SendQueue>,
    pulse: Pulse,
    connected: Cell<bool>,
}

/// A live inbound session, per node id.
struct InboundEntry {
    incarnation: u64,
    session: u64,
    replaced: Rc<Signal>,
}

/// Shared by the transport's tasks (all on one thread).
struct Ctx {
    cluster_id: String,
    node_id: NodeId,
    shard_count: u16,
    incarnation: u64,
    client_addr: Option<SocketAddr>,
    peers: BTreeMap<NodeId, SocketAddr>,
    secret: ClusterSecret,
    limits: PeerLimits,
    sink: Box<dyn PeerSink>,
    stats: Arc<PeerStats>,
    stop: Signal,
    outbound: BTreeMap<NodeId, Outbound>,
    inbound: RefCell<HashMap<NodeId, InboundEntry>>,
    handshakes: Cell<usize>,
    next_session: Cell<u64>,
    /// The transport's tasks still running (see [`TaskGuard`]).
    tasks: Cell<usize>,
}

/// Counts a running task of the transport, so a stop can wait for all.
struct TaskGuard(Rc<Ctx>);

impl TaskGuard {
    fn new(ctx: &Rc<Ctx>) -> TaskGuard {
        ctx.tasks.set(ctx.tasks.get() + 1);
        TaskGuard(ctx.clone())
    }
}

impl Drop for TaskGuard {
    fn drop(&mut self) {
        self.0.tasks.set(self.0.tasks.get() - 1);
    }
}

/// How long [`PeerHandle::shutdown`] waits for the tasks to end.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(2);

/// The running transport; dropping it does not stop it ([`PeerHandle::stop`]).
#[derive(Clone)]
pub struct PeerHandle {
    ctx: Rc<Ctx>,
}

/// Starts the listener and one connector per other node on the current
/// monoio runtime.
pub fn start(setup: PeerSetup) -> std::io::Result<PeerHandle> {
    let listener = monoio::net::TcpListener::from_std(setup.listener)?;
    let me = setup.cluster.node_id;
    let limits = setup.limits;
    let outbound = setup
        .cluster
        .peers
        .iter()
        .filter(|(id, _)| **id != me)
        .map(|(id, addr)| {
            let out = Outbound {
                addr: *addr,
                queue: RefCell::new(SendQueue::new(
                    limits.queue_frames_max,
                    limits.queue_bytes_max,
                )),
                pulse: Pulse::default(),
                connected: Cell::new(false),
            };
            (*id, out)
        })
        .collect();
    let ctx = Rc::new(Ctx {
        cluster_id: setup.cluster.cluster_id,
        node_id: me,
        shard_count: setup.shard_count,
        incarnation: setup.incarnation,
        client_addr: setup.client_addr,
        peers: setup.cluster.peers,
        secret: setup.cluster.secret,
        limits,
        sink: setup.sink,
        stats: setup.stats,
        stop: Signal::default(),
        outbound,
        inbound: RefCell::new(HashMap::new()),
        handshakes: Cell::new(0),
        next_session: Cell::new(0),
        tasks: Cell::new(0),
    });
    let guard = TaskGuard::new(&ctx);
    monoio::spawn(session::accept_loop(ctx.clone(), listener, guard));
    for id in ctx.outbound.keys() {
        let guard = TaskGuard::new(&ctx);
        monoio::spawn(session::connector(ctx.clone(), *id, guard));
    }
    tracing::info!(node = me, cluster = %ctx.cluster_id, incarnation = ctx.incarnation,
        peers = ctx.outbound.len(), "peer transport started");
    Ok(PeerHandle { ctx })
}

impl PeerHandle {
    /// Queues a frame for `to`'s partition `partition_id`. Never blocks: a
    /// full queue drops the frame (counted).
    pub fn send(&self, to: NodeId, partition_id: u32, payload: &[u8]) -> Result<(), SendError> {
        self.send_outgoing(to, partition_id, Outgoing::from_payload(payload))
    }

    /// [`PeerHandle::send`] of a message encoded into an [`Outgoing`]:
    /// framed in its own buffer.
    pub fn send_outgoing(
        &self,
        to: NodeId,
        partition_id: u32,
        payload: Outgoing,
    ) -> Result<(), SendError> {
        let out = self
            .ctx
            .outbound
            .get(&to)
            .ok_or(SendError::UnknownPeer(to))?;
        let max_bytes = self.ctx.limits.frame_bytes_max as usize - MESSAGE_PREFIX_BYTES;
        if payload.payload().len() > max_bytes {
            return Err(SendError::TooLarge {
                len_bytes: payload.payload().len(),
                max_bytes,
            });
        }
        let frame = codec::seal(partition_id, payload);
        if out.queue.borrow_mut().push(frame).is_err() {
            inc(&self.ctx.stats.queue_drops_total);
            return Err(SendError::QueueFull(to));
        }
        out.pulse.pulse();
        Ok(())
    }

    /// Whether our session to `to` is established.
    pub fn is_connected(&self, to: NodeId) -> bool {
        self.ctx
            .outbound
            .get(&to)
            .is_some_and(|o| o.connected.get())
    }

    pub fn stats(&self) -> &Arc<PeerStats> {
        &self.ctx.stats
    }

    /// Stops accepting and dialling and closes every session; tasks end at
    /// their next wake-up (at once: each waits on the stop signal).
    pub fn stop(&self) {
        self.ctx.stop.fire();
    }

    /// [`PeerHandle::stop`], then waits (at most 2 s) until every task
    /// ended, so the peer port and sessions are closed when it returns.
    pub async fn shutdown(&self) {
        self.stop();
        let end = std::time::Instant::now() + SHUTDOWN_WAIT;
        while self.ctx.tasks.get() > 0 && std::time::Instant::now() < end {
            monoio::time::sleep(Duration::from_millis(1)).await;
        }
        if self.ctx.tasks.get() > 0 {
            tracing::warn!(
                node = self.ctx.node_id,
                tasks = self.ctx.tasks.get(),
                "peer transport tasks still running at shutdown"
            );
        }
    }

    /// Tasks of the transport still running.
    pub fn tasks_running(&self) -> usize {
        self.ctx.tasks.get()
    }
}
