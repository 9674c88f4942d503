//! One shard: a pinned OS thread running a monoio io_uring runtime, its own
//! storage ring, and the partitions placed on it.
//!
//! Tasks on the runtime:
//! * accept: takes client connections (every shard listens on the same port
//!   with SO_REUSEPORT) and spawns a connection task each (see `net`);
//! * wake: awaits the shard's eventfd, routes replies from other shards to
//!   the waiting local tasks and kicks the turn task;
//! * turn: takes the queued work (local requests plus the request mailbox),
//!   applies it, then submits one group commit for the partitions it
//!   appended to, without waiting for it (`Shard::run_turn`, turn.rs);
//! * storage: awaits the storage ring's eventfd, reaps finished group
//!   commits and acknowledges what they made durable
//!   (`Shard::on_storage_completions`, turn.rs);
//! * tick: long-poll fetch deadlines, retention and replica timeouts;
//! * meta (shard 0 only): the controller, creating and deleting topics one at
//!   a time (see `controller`).
//!
//! Group commit does not block the shard: a turn appends, then queues one
//! write plus one fdatasync per touched partition as a single ring
//! submission and goes back to serving network and mailbox work. When the
//! eventfd fires, the storage task completes each partition's flush (a
//! failure fences the partition and fails its waiting appends) and only then
//! acknowledges the appends whose offsets are durable. A partition has at
//! most one flush in flight; appends into it go on and join its next flush,
//! which starts as soon as the previous one completed. An op that would make
//! the store flush on its own (purge, delete, an append that overflows the
//! write buffer or rolls the segment) is parked, with everything behind it
//! for that partition, until the flush in flight completed. Reads, opening
//! partitions and the maintenance ops stay synchronous on the same ring.
//!
//! Each partition hosts its replica (see `partition`): a cluster of one on
//! a single node, a member of an R-node group for a topic replicated in a
//! cluster. The replica sequences produces; its flushes are answered by
//! the partition's group commit, and its replies acknowledge the
//! producers (a replicated one's at commit, on a quorum). Replication
//! messages arrive as `Op::PeerMessage` work and what the replicas send is
//! routed after each turn, tick and completion (see `peer_route`); a
//! message or tick for a partition with a flush in flight waits for it
//! (it may make the replica cut or persist, synchronous flushes in the
//! store). A tick steps only the replicas with a timeout armed (none, at
//! R = 1 while Normal; every replicated one: heartbeats, primary-silent).
//!
//! This file is the runtime: the thread, the monoio tasks, the clock.
//! What a turn does to the partitions is in `shard/turn.rs`, which gets the
//! time from these tasks and touches files only through the ring.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use ringlog_protocol::wire::{ErrorCode, ProduceReply};
use ringlog_storage::io::uring::UringBackend;
use ringlog_storage::io::{
    BatchBuf, BatchId, Completion, IoBackend, Op as StorageOp, Sqe, BLOCK_SIZE,
};
use ringlog_storage::journal::{Journal, JournalError};
use ringlog_storage::store::{InstallBudget, PoolConfig, StorePool};

use crate::catalog::{Catalog, CatalogView, TopicState, TopicTable};
use crate::config::ServerConfig;
use crate::eventfd::EventFd;
use crate::handle::ShardHandle;
use crate::mailbox::{MailboxRx, MailboxTx, SendError};
use crate::meta::Role;
use crate::meta_hosted::{MetaGroup, META_PARTITION_ID};
use crate::meta_io;
use crate::metrics::{self, ShardMetrics};
use crate::oneshot::{self, Notify};
use crate::ops::{
    Envelope, MetaOp, Op, OpError, OpReply, Outcome, ReplyEnvelope, ReplyTo, ShardStatus,
};
use crate::partition::Partition;
use crate::peer_buf::Outgoing;
use crate::placement::shard_for;
use crate::reply_pool::ReplyPool;
use crate::transfer::io::Installs;
use crate::trash::{self, Poker};
use crate::vsr::Token;

/// Ring entries of each shard's storage ring.
const STORAGE_RING_ENTRIES: u32 = 256;
/// Controller requests queued at once; more get Backpressure.
const META_QUEUE_MAX: usize = 64;
/// Memory a shard's pool may keep in idle write buffers (pre-touched,
/// write_buffer_bytes each). The pool keeps no more idle than its recent
/// peak of buffers in use needs (`SharedBufPool`), so this is a ceiling,
/// not a reservation: 64 partitions with appends pending hold 64 buffers
/// in use (4 MiB each by default), and a bound below that made every turn
/// allocate and zero the rest afresh.
const WRITE_BUFFERS_IDLE_BYTES_MAX: usize = 1 << 30;
/// Idle write buffers kept whatever their size (the byte bound above
/// allows fewer only for buffers over 64 MiB).
const WRITE_BUFFERS_IDLE_MIN: usize = 16;
/// Produce batches smaller than this are read into a heap buffer: a lent
/// write buffer is `write_buffer_bytes` large, and copying a small batch
/// costs less than holding one.
const LEND_BATCH_BYTES_MIN: usize = 256 * 1024;

/// Partitions whose superblocks boot reads in one submission (64 KiB each).
const BOOT_PREFETCH_PARTITIONS: usize = 64;
/// How often deadlines of waiting fetches are checked.
const TICK_MS: u64 = 20;

/// Process-wide shutdown flag with a waiter for the main thread.
#[derive(Default)]
pub struct Shutdown {
    flag: AtomicBool,
    done: Mutex<bool>,
    cond: Condvar,
    peers: Mutex<Vec<MailboxTx>>,
}

impl Shutdown {
    pub fn set_peers(&self, peers: Vec<MailboxTx>) {
        if let Ok(mut p) = self.peers.lock() {
            *p = peers;
        }
    }

    /// Starts a graceful shutdown (idempotent; callable from any thread or a
    /// signal-waiting thread).
    pub fn trigger(&self) {
        self.flag.store(true, Ordering::SeqCst);
        if let Ok(peers) = self.peers.lock() {
            for p in peers.iter() {
                p.wake();
            }
        }
        if let Ok(mut d) = self.done.lock() {
            *d = true;
        }
        self.cond.notify_all();
    }

    pub fn is_triggered(&self) -> bool {
        self.flag.load(Ordering::SeqCst)
    }

    /// Blocks until [`Shutdown::trigger`].
    pub fn wait(&self) {
        let Ok(mut d) = self.done.lock() else { return };
        while !*d {
            d = match self.cond.wait(d) {
                Ok(d) => d,
                Err(_) => return,
            };
        }
    }
}

/// Everything a shard thread starts with.
pub struct ShardSetup {
    pub id: usize,
    pub config: Arc<ServerConfig>,
    pub catalog: Arc<Catalog>,
    pub peers: Arc<Vec<MailboxTx>>,
    pub rx: MailboxRx,
    pub metrics: Arc<ShardMetrics>,
    pub shutdown: Arc<Shutdown>,
    pub listener: std::net::TcpListener,
    pub core: Option<core_affinity::CoreId>,
    /// Told once the shard opened its partitions (or failed to start).
    pub ready: crossbeam_channel::Sender<Result<usize, String>>,
    /// Wakes the thread removing dropped partitions' directories.
    pub trash: Poker,
    /// Where the controller (shard 0) sends its topics.json writes.
    pub meta_io: meta_io::Client,
    /// The replication transport, on the one shard that runs it (shard 0
    /// in a cluster; none for a single node).
    pub peer: Option<crate::net::peer::PeerSetup>,
    /// What the transport learned of the other nodes (their client
    /// addresses, for not-primary refusals); every shard of a cluster.
    pub peer_stats: Option<Arc<crate::net::peer::PeerStats>>,
    /// Fetch reply buffers, shared by the server's shards.
    pub reply_pool: Arc<ReplyPool>,
}

/// Where a reply goes, seen from the owning shard.
pub(crate) enum Responder {
    Local(oneshot::Sender<Outcome>),
    Remote {
        shard: usize,
        token: u64,
    },
    Thread(crossbeam_channel::Sender<Outcome>),
    /// A one-way op (peer messages): the outcome goes nowhere.
    Nobody,
}

pub(crate) struct Work {
    op: Op,
    reply: Responder,
}

struct Waiter {
    offset: u64,
    max_bytes: u32,
    deadline: Instant,
    reply: Responder,
}

/// The shard's storage state, over any backend (the sim in tests).
struct Core<B: IoBackend> {
    io: B,
    /// Write and read buffers and recycled segment files, shared by this
    /// shard's partitions (an idle partition holds no buffer).
    pool: StorePool,
    partitions: HashMap<u32, Partition>,
    /// Group commits submitted to the storage ring and not reaped yet.
    flights: HashMap<BatchId, Flight>,
    /// Per partition: appends waiting for durability and work parked
    /// behind its flush in flight (absent when both are empty).
    lanes: HashMap<u32, Lane>,
    /// Partitions whose replica has a timeout armed: the only ones a tick
    /// steps, so a tick costs O(these), not O(partitions). A cluster of one
    /// that is Normal is never in it.
    ticking: BTreeSet<u32>,
    /// The shard's journal (`group_commit = "journal"`): one write and one
    /// fdatasync per turn for every partition's small appends.
    journal: Option<Journal>,
    /// Partitions with small appends waiting for the journal write in
    /// flight to complete (one at a time); flushed by the next one. At most
    /// one entry per partition.
    journal_waiting: Vec<u32>,
    /// The journal checkpoint in flight, if any.
    checkpoint: Option<(BatchId, CheckpointStep)>,
    /// Background batches of a partition (see [`Ahead`]): at most one of
    /// each kind per partition (the store refuses a second), so at most two
    /// per hosted partition in all.
    spares: HashMap<BatchId, (u32, Ahead)>,
    /// Fetches waiting for their partition's read-ahead in flight (the
    /// bytes they want), by partition; at most `fetch_waiters_max` each,
    /// more read the device at once.
    read_ahead_parked: BTreeMap<u32, Vec<Work>>,
    /// State transfer installs on this shard: at most
    /// [`TRANSFER_INSTALLS_MAX`] at once, within
    /// [`TRANSFER_INSTALL_BUDGET_BYTES`] of staged disk.
    installs: Installs,
}

/// Installs a shard runs at once: each holds a window of chunk buffers and
/// its staged files; one keeps a node's disk bandwidth for the rest.
const TRANSFER_INSTALLS_MAX: usize = 1;
/// Disk the shard's installs may reserve for staged artifacts at once.
const TRANSFER_INSTALL_BUDGET_BYTES: u64 = 16 << 30;

/// What a background batch of a partition does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ahead {
    /// Prepares the next segment before the roll.
    Spare,
    /// Reserves the active segment's next step before appends need it.
    Reserve,
}

impl<B: IoBackend> Core<B> {
    /// Group commits, spares, reads queued ahead or transfer I/O are in
    /// flight on the storage ring.
    fn storage_busy(&self) -> bool {
        !self.flights.is_empty()
            || !self.spares.is_empty()
            || self.pool.read_aheads_running() > 0
            || self.installs.batches_in_flight() > 0
    }
}

/// A journal checkpoint's two submissions (a linked chain would not stop at
/// a failed fdatasync).
enum CheckpointStep {
    /// The fdatasyncs of these partitions' active segments.
    Segments(Vec<u32>),
    /// The journal header naming the new tail, and its fdatasync.
    Header,
}

/// One group commit in flight: the partitions it flushes, with how many
/// ring entries each queued and whether through the journal (in
/// submission order), then the journal's own entries.
struct Flight {
    parts: Vec<(u32, usize, bool)>,
    journal_entries: usize,
    started: Instant,
}

#[derive(Default)]
struct Lane {
    /// Produces the replica holds, by the token it answers them with, with
    /// the turn's time at their append; at most one per append the
    /// partition's pipeline and client queue hold.
    acks: HashMap<Token, (Responder, Instant)>,
    /// Work that must wait for the flush in flight, in arrival order.
    parked: VecDeque<Work>,
}

/// What applying work produced.
struct Applied {
    replies: Vec<(Responder, Outcome)>,
    /// Partitions to flush and settle afterwards.
    touched: Vec<u32>,
    /// The time of this turn, read once by the runtime loop that started
    /// it: applying work reads no clock.
    now: Instant,
    /// Wall-clock milliseconds read with it (the store's snapshot leases
    /// and retention share this clock).
    now_ms: u64,
}

impl Applied {
    fn new(n: usize, now: Instant) -> Self {
        Self {
            replies: Vec::with_capacity(n),
            touched: Vec::new(),
            now,
            now_ms: now_ms(),
        }
    }

    fn touch(&mut self, pid: u32) {
        touch(&mut self.touched, pid);
    }
}

fn touch(touched: &mut Vec<u32>, pid: u32) {
    if !touched.contains(&pid) {
        touched.push(pid);
    }
}

pub(crate) struct Shard<B: IoBackend = UringBackend> {
    pub id: usize,
    pub config: Arc<ServerConfig>,
    pub catalog: Arc<Catalog>,
    view: RefCell<CatalogView>,
    pub peers: Arc<Vec<MailboxTx>>,
    rx: MailboxRx,
    pub metrics: Arc<ShardMetrics>,
    pub shutdown: Arc<Shutdown>,
    core_id: Option<usize>,
    core: RefCell<Core<B>>,
    queue: RefCell<VecDeque<Work>>,
    turn: Notify,
    /// Signalled by the storage ring when flushes may have finished.
    storage_wake: EventFd,
    /// Told after each batch of finished flushes was processed.
    flushed: Notify,
    pending: RefCell<HashMap<u64, oneshot::Sender<Outcome>>>,
    next_token: Cell<u64>,
    waiters: RefCell<HashMap<u32, Vec<Waiter>>>,
    meta_queue: RefCell<VecDeque<(MetaOp, Responder)>>,
    pub meta: Notify,
    pub stop: Notify,
    stopping: Cell<bool>,
    trash: Poker,
    meta_io: meta_io::Client,
    reply_pool: Arc<ReplyPool>,
    /// The cluster's nodes (id -> peer address), empty on a single node.
    nodes: std::collections::BTreeMap<u32, std::net::SocketAddr>,
    peer_stats: Option<Arc<crate::net::peer::PeerStats>>,
    /// The peer transport, on shard 0 of a cluster (see `peer_route`).
    transport: RefCell<Option<crate::net::peer::PeerHandle>>,
    /// The metadata group's state, on shard 0 of a node in the group (its
    /// replica is partition `META_PARTITION_ID` of this shard).
    meta_group: Option<RefCell<MetaGroup>>,
}

/// Runs a shard on the current thread until shutdown.
pub fn run(mut setup: ShardSetup) {
    let id = setup.id;
    let peer_setup = setup.peer.take();
    if let Some(c) = setup.core {
        if !core_affinity::set_for_current(c) {
            tracing::warn!(shard = id, core = c.id, "could not pin shard thread");
        }
    }
    let fail = |ready: &crossbeam_channel::Sender<Result<usize, String>>, msg: String| {
        let _ = ready.send(Err(msg));
    };
    let mut io = match UringBackend::new(STORAGE_RING_ENTRIES) {
        Ok(io) => io,
        Err(e) => return fail(&setup.ready, format!("shard {id}: storage ring: {e}")),
    };
    let storage_wake = match EventFd::new() {
        Ok(fd) => fd,
        Err(e) => return fail(&setup.ready, format!("shard {id}: storage eventfd: {e}")),
    };
    if let Err(e) = io.register_eventfd(storage_wake.raw_fd()) {
        return fail(&setup.ready, format!("shard {id}: storage eventfd: {e}"));
    }
    let mut rt = match monoio::RuntimeBuilder::<monoio::IoUringDriver>::new()
        .enable_timer()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(&setup.ready, format!("shard {id}: io_uring runtime: {e}")),
    };
    let (shard, listener, ready) = Shard::new(setup, io, storage_wake);
    let shard = Rc::new(shard);
    rt.block_on(async move {
        // Tasks still pending at the end are dropped without waking.
        let _end = crate::oneshot::RuntimeEnd::arm();
        let opened = shard.open_owned_partitions();
        let listener = match monoio::net::TcpListener::from_std(listener) {
            Ok(l) => l,
            Err(e) => return fail(&ready, format!("shard {id}: listener: {e}")),
        };
        let reader = match shard.rx.wake.reader() {
            Ok(r) => r,
            Err(e) => return fail(&ready, format!("shard {id}: eventfd: {e}")),
        };
        let storage_reader = match shard.storage_wake.reader() {
            Ok(r) => r,
            Err(e) => return fail(&ready, format!("shard {id}: storage eventfd: {e}")),
        };
        let peer = match peer_setup.map(crate::net::peer::start).transpose() {
            Ok(p) => p,
            Err(e) => return fail(&ready, format!("shard {id}: peer listener: {e}")),
        };
        shard.transport.replace(peer.clone());
        let _ = ready.send(Ok(opened));
        monoio::spawn(shard.clone().wake_task(reader));
        monoio::spawn(shard.clone().storage_task(storage_reader));
        monoio::spawn(shard.clone().turn_task());
        monoio::spawn(shard.clone().tick_task());
        if id == 0 {
            monoio::spawn(shard.clone().meta_task());
        }
        if shard.meta_group.is_some() {
            monoio::spawn(shard.clone().meta_apply_task());
        }
        crate::net::accept_loop(shard.clone(), listener).await;
        if let Some(p) = &peer {
            p.shutdown().await;
        }
        shard.finish().await;
    });
}

/// Yields once to the scheduler so other ready tasks run first.
pub(crate) struct YieldNow(bool);

impl Future for YieldNow {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            return Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

pub(crate) fn yield_now() -> YieldNow {
    YieldNow(false)
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl<B: IoBackend> ShardHandle for Shard<B> {
    fn id(&self) -> usize {
        self.id
    }

    fn config(&self) -> &ServerConfig {
        &self.config
    }

    fn metrics(&self) -> &ShardMetrics {
        &self.metrics
    }

    fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    fn meta_io(&self) -> &meta_io::Client {
        &self.meta_io
    }

    fn table(&self) -> Arc<TopicTable> {
        self.view.borrow_mut().get().clone()
    }

    fn shard_count(&self) -> usize {
        self.peers.len()
    }

    fn is_stopping(&self) -> bool {
        self.stopping.get() || self.shutdown.is_triggered()
    }

    fn stop(&self) -> &Notify {
        &self.stop
    }

    fn reply_pool(&self) -> &ReplyPool {
        &self.reply_pool
    }

    fn lend_produce_buffer(&self, partition_id: u32, batch_len: usize) -> Option<BatchBuf> {
        if batch_len < LEND_BATCH_BYTES_MIN {
            return None;
        }
        // A turn holds the core only between awaits: this never fails on
        // the shard's thread, and a miss just means a heap buffer.
        let core = self.core.try_borrow().ok()?;
        let lead = core
            .partitions
            .get(&partition_id)?
            .next_batch_lead_bytes()?;
        // Produces to it waiting for a turn or a flush go to the store first.
        let ahead = |w: &Work| match &w.op {
            Op::Produce {
                partition_id: p,
                batch,
            } if *p == partition_id => batch.as_ref().len(),
            _ => 0,
        };
        let queued: usize = self.queue.borrow().iter().map(ahead).sum();
        let parked: usize = core
            .lanes
            .get(&partition_id)
            .map_or(0, |l| l.parked.iter().map(ahead).sum());
        let lead = (lead + queued + parked) % BLOCK_SIZE;
        match core.pool.lend_batch(lead) {
            Ok(buf) if buf.batch_capacity() >= batch_len => {
                metrics::inc(&self.metrics.produce_buffers_lent_total);
                Some(buf)
            }
            Ok(_) => None,
            Err(_) => {
                metrics::inc(&self.metrics.produce_buffers_refused_total);
                None
            }
        }
    }

    fn meta_group(&self) -> Option<&RefCell<MetaGroup>> {
        self.meta_group.as_ref()
    }

    fn meta_role(&self) -> Option<Role> {
        let core = self.core.borrow();
        let replica = core.partitions.get(&META_PARTITION_ID)?.replica()?;
        Some(Role::of(replica))
    }

    fn send_peer(&self, to: u32, partition_id: u32, payload: Vec<u8>) {
        self.send_to_peer(to, partition_id, Outgoing::from_payload(&payload));
    }

    /// Runs `op` on shard `owner` and waits for the outcome: locally through
    /// the turn queue, or through the owner's mailbox.
    async fn call(&self, owner: usize, op: Op) -> Outcome {
        let (tx, rx) = oneshot::oneshot();
        if owner == self.id {
            self.queue.borrow_mut().push_back(Work {
                op,
                reply: Responder::Local(tx),
            });
            self.turn.notify();
        } else {
            if self.pending.borrow().len() >= self.config.forward_inflight_max {
                metrics::inc(&self.metrics.backpressure_total);
                return Err(OpError::new(
                    ErrorCode::Backpressure,
                    "too many requests forwarded to other shards; retry",
                ));
            }
            let Some(peer) = self.peers.get(owner) else {
                return Err(OpError::new(ErrorCode::Internal, "no such shard"));
            };
            let token = self.next_token.get();
            self.next_token.set(token + 1);
            let env = Envelope {
                op,
                reply: ReplyTo::Shard {
                    shard: self.id,
                    token,
                },
            };
            match peer.send(env) {
                Ok(()) => {
                    metrics::inc(&self.metrics.forwards_total);
                    self.pending.borrow_mut().insert(token, tx);
                }
                Err(SendError::Full(_)) => {
                    metrics::inc(&self.metrics.backpressure_total);
                    return Err(OpError::new(
                        ErrorCode::Backpressure,
                        format!("shard {owner} mailbox is full; retry"),
                    ));
                }
                Err(SendError::Closed(_)) => {
                    return Err(OpError::new(ErrorCode::ShuttingDown, "shard stopped"));
                }
            }
        }
        match rx.await {
            Some(outcome) => outcome,
            None => Err(OpError::new(
                ErrorCode::ShuttingDown,
                "request dropped at shutdown",
            )),
        }
    }
}

impl<B: IoBackend> Shard<B> {
    /// Builds the shard over `io` (whose completions `storage_wake` signals);
    /// hands back what of `setup` the runtime needs.
    fn new(
        setup: ShardSetup,
        io: B,
        storage_wake: EventFd,
    ) -> (
        Self,
        std::net::TcpListener,
        crossbeam_channel::Sender<Result<usize, String>>,
    ) {
        let ShardSetup {
            id,
            config,
            catalog,
            peers,
            rx,
            metrics,
            shutdown,
            listener,
            core,
            ready,
            trash,
            meta_io,
            // Taken by `run` before the shard is built.
            peer: _,
            peer_stats,
            reply_pool,
        } = setup;
        let view = CatalogView::new(catalog.clone());
        let pool = shard_pool(&config, id);
        let nodes = config.cluster_nodes();
        let meta_group = (id == 0)
            .then(|| meta_group_of(&config, &nodes, peers.len()))
            .flatten()
            .map(RefCell::new);
        let shard = Shard {
            id,
            config,
            catalog,
            view: RefCell::new(view),
            peers,
            rx,
            metrics,
            shutdown,
            core_id: core.map(|c| c.id),
            core: RefCell::new(Core {
                io,
                pool,
                partitions: HashMap::new(),
                flights: HashMap::new(),
                lanes: HashMap::new(),
                ticking: BTreeSet::new(),
                journal: None,
                journal_waiting: Vec::new(),
                checkpoint: None,
                spares: HashMap::new(),
                read_ahead_parked: BTreeMap::new(),
                installs: Installs::new(
                    TRANSFER_INSTALLS_MAX,
                    InstallBudget::new(TRANSFER_INSTALL_BUDGET_BYTES),
                ),
            }),
            queue: RefCell::new(VecDeque::new()),
            turn: Notify::default(),
            storage_wake,
            flushed: Notify::default(),
            pending: RefCell::new(HashMap::new()),
            next_token: Cell::new(1),
            waiters: RefCell::new(HashMap::new()),
            meta_queue: RefCell::new(VecDeque::new()),
            meta: Notify::default(),
            stop: Notify::default(),
            stopping: Cell::new(false),
            trash,
            meta_io,
            reply_pool,
            nodes,
            peer_stats,
            transport: RefCell::new(None),
            meta_group,
        };
        (shard, listener, ready)
    }

    /// Opens every partition placed on this shard (boot), after loading
    /// the shard's recycled segment files.
    fn open_owned_partitions(&self) -> usize {
        let table = self.table();
        let mut core = self.core.borrow_mut();
        let Core { io, pool, .. } = &mut *core;
        // The server made the recycle root and cleared foreign shards' dirs.
        let recycle_dir = pool.recycle_dir();
        if let Err(e) = pool.load_recycled(io) {
            // Recycling is an optimisation: without it segments start empty.
            tracing::warn!(shard = self.id, dir = %recycle_dir.display(), error = %e, "recycled segment files not loaded");
        }
        let journal = self.open_journal(io, pool);
        core.journal = journal;
        let Core {
            io,
            pool,
            partitions,
            ticking,
            ..
        } = &mut *core;
        let owned: Vec<(&String, u32, u32, bool, u8)> = table
            .topics
            .iter()
            .flat_map(|(topic, meta)| {
                let creating = meta.state == TopicState::Creating;
                let r = meta.replication_factor;
                (0..meta.partitions)
                    .map(move |i| (topic, i, meta.first_partition_id + i, creating, r))
            })
            .filter(|(topic, index, ..)| shard_for(topic, *index, self.shard_count()) == self.id)
            .filter(|&(_, _, id, _, r)| self.holds(id, r))
            .collect();
        // Superblocks are read a batch at a time in one submission, so boot
        // waits for the device once per batch, not once per partition.
        for batch in owned.chunks(BOOT_PREFETCH_PARTITIONS) {
            let dirs: Vec<PathBuf> = batch
                .iter()
                .map(|(topic, index, ..)| {
                    TopicTable::partition_dir(&self.config.data_dir, topic, *index)
                })
                .collect();
            let refs: Vec<&std::path::Path> = dirs.iter().map(PathBuf::as_path).collect();
            pool.prefetch_superblocks(io, &refs);
            for (&(topic, index, id, creating, r), dir) in batch.iter().zip(&dirs) {
                let config = self.config.store_config();
                let p = match self.replication(topic, index, id, r) {
                    Ok(repl) => Partition::open_replicated(
                        io, pool, dir, topic, index, id, config, creating, repl,
                    ),
                    Err(why) => Partition::unavailable(dir, topic, index, id, why),
                };
                if p.needs_tick() {
                    ticking.insert(id);
                }
                partitions.insert(id, p);
            }
            pool.clear_prefetched();
        }
        if self.meta_group.is_some() {
            let p = self.open_meta_replica(io, pool);
            if p.needs_tick() {
                ticking.insert(META_PARTITION_ID);
            }
            partitions.insert(META_PARTITION_ID, p);
        }
        // Records of partitions no topic holds any more are dead; those of
        // partitions another shard owns (a changed shard count) stay, and
        // keep checkpoints off (see `server::check_journals`).
        let known: std::collections::HashSet<u32> = table
            .topics
            .values()
            .flat_map(|m| m.first_partition_id..m.first_partition_id + m.partitions)
            .chain(self.meta_group.as_ref().map(|_| META_PARTITION_ID))
            .collect();
        for pid in pool.journal_replay_pids() {
            if !known.contains(&pid) {
                pool.discard_journal_replay(pid);
            }
        }
        if pool.journal_replay_pending() {
            tracing::error!(shard = self.id, "journal records of partitions not opened here: checkpoints stay off until they open");
        }
        partitions.len()
    }

    /// This node's replica of the metadata group, in `<data_dir>/meta/group`:
    /// created if missing (a fresh member, or wiped on a recovering node),
    /// else reopened Recovering; an unreadable one stays unavailable (never
    /// recreated: it may hold acknowledged commands). No retention: the
    /// table is rebuilt from the whole log at boot.
    fn open_meta_replica(&self, io: &mut B, pool: &StorePool) -> Partition {
        let dir = self.config.data_dir.join(crate::meta_hosted::META_DIR);
        let (topic, id) = (crate::meta_hosted::META_TOPIC, META_PARTITION_ID);
        let group: Vec<u32> = match &self.meta_group {
            Some(g) => g.borrow().host().table().group_nodes().to_vec(),
            None => Vec::new(),
        };
        let Some(replica) = group.iter().position(|&n| n == self.config.node_id) else {
            let why = format!(
                "node {} is not in the metadata group {group:?}",
                self.config.node_id
            );
            return Partition::unavailable(&dir, topic, 0, id, why);
        };
        let repl = crate::partition::Replication {
            group_id: crate::placement::group_id(
                &self.config.cluster_id,
                topic,
                0,
                group.len() as u8,
            ),
            nodes: group,
            replica: replica as u8,
            addrs: self.nodes.clone(),
            client_addrs: self.client_addrs(),
            boot_wiped: self.config.recover,
        };
        let config = ringlog_storage::store::StoreConfig {
            retention_bytes: None,
            retention_ms: None,
            ..self.config.store_config()
        };
        // A failed stat opens (and reports) rather than recreates.
        let create = !io.exists(&dir).unwrap_or(true);
        Partition::open_replicated(io, pool, &dir, topic, 0, id, config, create, Some(repl))
    }

    /// The other nodes' client addresses, as the peer transport learns them.
    fn client_addrs(&self) -> crate::partition::ClientAddrs {
        match &self.peer_stats {
            Some(stats) => {
                let stats = stats.clone();
                crate::partition::ClientAddrs::new(move |n| stats.client_addr(n))
            }
            None => crate::partition::ClientAddrs::default(),
        }
    }

    /// The replica group of partition `partition_id` with `replicas`
    /// replicas among this cluster's nodes (`placement::replicas_of`;
    /// empty if the node count cannot hold it); None on a single node.
    fn group_of(&self, partition_id: u32, replicas: u8) -> Option<Vec<u32>> {
        if self.nodes.is_empty() {
            return None;
        }
        let nodes: Vec<u32> = self.nodes.keys().copied().collect();
        Some(crate::placement::replicas_of(
            &nodes,
            partition_id,
            replicas,
        ))
    }

    /// Whether this node holds a replica of the partition: always on a
    /// single node, and when the node count cannot hold its group (it is
    /// opened, to report why).
    pub(crate) fn holds(&self, partition_id: u32, replicas: u8) -> bool {
        match self.group_of(partition_id, replicas) {
            Some(group) if !group.is_empty() => group.contains(&self.config.node_id),
            _ => true,
        }
    }

    /// How partition `index` (id `partition_id`) of `topic` with
    /// `replicas` replicas is replicated here: None for a single node or a
    /// partition of one replica; an error if this node's cluster config
    /// cannot host it (the node count changed, say).
    fn replication(
        &self,
        topic: &str,
        index: u32,
        partition_id: u32,
        replicas: u8,
    ) -> Result<Option<crate::partition::Replication>, String> {
        let Some(group) = self.group_of(partition_id, replicas) else {
            return Ok(None);
        };
        if replicas <= 1 && !group.is_empty() {
            return Ok(None);
        }
        match group.iter().position(|&n| n == self.config.node_id) {
            Some(replica) => {
                debug_assert_eq!(group.len(), usize::from(replicas));
                Ok(Some(crate::partition::Replication {
                    group_id: crate::placement::group_id(
                        &self.config.cluster_id,
                        topic,
                        index,
                        replicas,
                    ),
                    nodes: group,
                    replica: replica as u8,
                    addrs: self.nodes.clone(),
                    client_addrs: self.client_addrs(),
                    boot_wiped: self.config.recover,
                }))
            }
            None => Err(format!(
                "topic {topic:?} has {replicas} replicas per partition but this node's cluster \
                 config lists {} nodes ({:?}), node {} among them: partition {partition_id}'s \
                 group {group:?} cannot be placed",
                self.nodes.len(),
                self.nodes.keys().collect::<Vec<_>>(),
                self.config.node_id,
            )),
        }
    }

    /// Where a client reaches partition `partition_id`, which this node
    /// holds no replica of: a not-primary refusal naming a node of its group
    /// (view 0's primary, the lowest id, unless we have no session with
    /// it), which the client follows; that node redirects again if another
    /// is primary now. None if no topic
    /// holds the id, or this node holds it.
    pub(crate) fn held_elsewhere(&self, partition_id: u32) -> Option<OpError> {
        let table = self.table();
        let (topic, meta) = table.topics.iter().find(|(_, m)| {
            (m.first_partition_id..m.first_partition_id + m.partitions).contains(&partition_id)
        })?;
        let r = meta.replication_factor;
        let group = self.group_of(partition_id, r).filter(|g| !g.is_empty())?;
        if group.contains(&self.config.node_id) {
            return None;
        }
        // The lowest id of the group we hold a session with: view 0's
        // primary while it is up, else one that knows the primary now.
        let connected = |n: &u32| {
            self.peer_stats.as_ref().is_some_and(|s| {
                s.nodes
                    .get(n)
                    .is_some_and(|seen| seen.connected.load(std::sync::atomic::Ordering::Relaxed))
            })
        };
        let primary = group.iter().copied().find(connected).unwrap_or(group[0]);
        let client = self
            .client_addrs()
            .of(primary)
            .map_or_else(String::new, |a| format!(" primary_addr={a}"));
        Some(OpError::new(
            ErrorCode::NotPrimary,
            format!(
                "this node holds no replica of partition {} of topic {topic:?} (id {partition_id}; \
                 replicas on nodes {group:?}): go to primary_node={primary}{client}",
                partition_id - meta.first_partition_id
            ),
        ))
    }

    /// Opens this shard's journal (`<data_dir>/journal/shard-<id>-of-<n>`)
    /// and hands its live records to `pool` for the partitions to replay.
    /// Without one (`group_commit = "partition"`, or it failed to open:
    /// logged) every flush has its own fdatasync.
    fn open_journal(&self, io: &mut B, pool: &StorePool) -> Option<Journal> {
        let config = self.config.journal_config()?;
        let dir = self.config.data_dir.join(JOURNAL_DIR);
        let path = dir.join(journal_file_name(self.id, self.shard_count()));
        let opened = Journal::open(io, &path, config).and_then(|(j, records)| {
            // The file's name must be durable before anything is in it.
            let synced = io.open_dir(&dir).and_then(|d| {
                let done = io.submit(vec![Sqe::new(StorageOp::Fsync { file: d })]);
                io.close(d);
                done.into_iter().try_for_each(|c| c.result.map(|_| ()))
            });
            match synced {
                Ok(()) => Ok((j, records)),
                Err(source) => {
                    j.close(io);
                    Err(JournalError::Io {
                        what: "fsync directory",
                        path: dir.clone(),
                        source,
                    })
                }
            }
        });
        match opened {
            Ok((journal, records)) => {
                tracing::info!(shard = self.id, path = %path.display(), records = records.len(), "journal open");
                pool.set_journal_replay(records);
                Some(journal)
            }
            Err(e) => {
                tracing::error!(shard = self.id, error = %e, "journal unavailable: flushing each partition directly");
                None
            }
        }
    }

    fn respond(&self, reply: Responder, outcome: Outcome) {
        match reply {
            Responder::Local(tx) => tx.send(outcome),
            Responder::Remote { shard, token } => {
                if let Some(peer) = self.peers.get(shard) {
                    peer.reply(ReplyEnvelope { token, outcome });
                }
            }
            Responder::Thread(tx) => {
                let _ = tx.try_send(outcome);
            }
            Responder::Nobody => {}
        }
    }

    async fn wake_task(self: Rc<Self>, reader: crate::eventfd::EventFdReader) {
        loop {
            if let Err(e) = reader.wait().await {
                tracing::error!(shard = self.id, error = %e, "eventfd wait failed");
                monoio::time::sleep(Duration::from_millis(10)).await;
            }
            while let Ok(r) = self.rx.replies.try_recv() {
                if let Some(tx) = self.pending.borrow_mut().remove(&r.token) {
                    tx.send(r.outcome);
                }
            }
            if !self.rx.is_empty() {
                self.turn.notify();
            }
            if self.shutdown.is_triggered() {
                self.stop.notify();
            }
        }
    }

    async fn turn_task(self: Rc<Self>) {
        loop {
            self.turn.notified().await;
            // Let connections whose requests are ready enqueue them: they
            // join this group commit.
            if self.config.group_commit_delay_us > 0 {
                monoio::time::sleep(Duration::from_micros(self.config.group_commit_delay_us)).await;
            } else {
                yield_now().await;
            }
            while self.run_turn(Instant::now()) > 0 {
                yield_now().await;
            }
        }
    }

    /// Awaits the storage ring's eventfd and processes finished flushes.
    async fn storage_task(self: Rc<Self>, reader: crate::eventfd::EventFdReader) {
        loop {
            if let Err(e) = reader.wait().await {
                tracing::error!(shard = self.id, error = %e, "storage eventfd wait failed");
                monoio::time::sleep(Duration::from_millis(10)).await;
            }
            self.on_storage_completions(Instant::now());
        }
    }

    async fn tick_task(self: Rc<Self>) {
        let mut last_retention = Instant::now();
        loop {
            monoio::time::sleep(Duration::from_millis(TICK_MS)).await;
            let now = Instant::now();
            self.expire_waiters(now);
            let retention_due = now.duration_since(last_retention)
                >= Duration::from_millis(self.config.retention_check_ms);
            if retention_due && (self.config.retention_bytes > 0 || self.config.retention_ms > 0) {
                last_retention = now;
                let mut core = self.core.borrow_mut();
                let Core { io, partitions, .. } = &mut *core;
                let t = now_ms();
                for p in partitions.values_mut() {
                    p.apply_retention(io, t);
                }
            }
            self.tick_replicas(now);
            // Fetches answered from waiters count too.
            metrics::set_read_cache(&self.metrics, &self.core.borrow().pool.read_cache_stats());
            metrics::set_read_ahead(&self.metrics, &self.core.borrow().pool.read_ahead_stats());
            metrics::set_transfers(
                &self.metrics,
                &transfer_totals(&self.core.borrow().partitions),
            );
            if !self.is_stopping() {
                self.checkpoint_idle(now);
            }
        }
    }

    /// Graceful stop: no new connections (the accept loop ended), finish the
    /// queued work (appends get their group commit and acknowledgement, work
    /// parked behind a flush runs once it completed), then checkpoint and
    /// close every partition.
    async fn finish(&self) {
        self.stopping.set(true);
        tracing::info!(shard = self.id, "shard stopping");
        // Let connection tasks holding a fully read request enqueue it.
        for _ in 0..3 {
            yield_now().await;
            while self.run_turn(Instant::now()) > 0 {}
        }
        // No flush (nor spare, which work may be parked behind) may be in
        // flight when the partitions close.
        while self.core.borrow().storage_busy() {
            monoio::select! {
                _ = self.flushed.notified() => {}
                // Reaping is idempotent: do it here too should a wake-up
                // go missing.
                _ = monoio::time::sleep(Duration::from_millis(50)) => {
                    self.on_storage_completions(Instant::now());
                }
            }
            while self.run_turn(Instant::now()) > 0 {}
        }
        let mut replies = Vec::new();
        for (_, list) in self.waiters.borrow_mut().drain() {
            for w in list {
                replies.push(w.reply);
            }
        }
        for (_, works) in std::mem::take(&mut self.core.borrow_mut().read_ahead_parked) {
            // Not expected: the read-aheads they waited for were reaped.
            replies.extend(works.into_iter().map(|w| w.reply));
        }
        for (_, lane) in self.core.borrow_mut().lanes.drain() {
            // Not expected: with no flush in flight every append was
            // settled and nothing stays parked.
            replies.extend(lane.acks.into_values().map(|(r, _)| r));
            replies.extend(lane.parked.into_iter().map(|w| w.reply));
        }
        for r in replies {
            self.respond(
                r,
                Err(OpError::new(
                    ErrorCode::ShuttingDown,
                    "server shutting down",
                )),
            );
        }
        let mut core = self.core.borrow_mut();
        let Core {
            io,
            partitions,
            journal,
            pool,
            checkpoint,
            ..
        } = &mut *core;
        let mut closed_all = true;
        for (_, p) in partitions.drain() {
            let (topic, index) = (p.topic.clone(), p.index);
            if let Err(e) = p.close(io) {
                closed_all = false;
                tracing::error!(%topic, partition = index, error = %e, "close failed");
            }
        }
        // Every partition closed (flushed, its segment fdatasynced, its
        // superblock written): the journal holds nothing the next boot
        // needs, which frees the next boot to run another shard count.
        if let Some(j) = journal.take() {
            let idle = closed_all && !j.writing() && checkpoint.is_none();
            let path = j.path().to_path_buf();
            j.close(io);
            if idle && !pool.journal_replay_pending() {
                let done = io.submit(vec![Sqe::new(StorageOp::Unlink { path: path.clone() })]);
                if let Some(Err(e)) = done.into_iter().next().map(|c| c.result) {
                    tracing::warn!(path = %path.display(), error = %e, "removing the journal after a clean stop");
                }
            }
        }
        tracing::info!(shard = self.id, "shard stopped");
    }
}

/// The metadata group state of shard 0 of a cluster node in the group
/// (None: a single node, or the last node of an even count, outside the
/// group; logged).
fn meta_group_of(
    config: &ServerConfig,
    nodes: &BTreeMap<u32, std::net::SocketAddr>,
    shards: usize,
) -> Option<MetaGroup> {
    if nodes.is_empty() {
        return None;
    }
    let ids: Vec<u32> = nodes.keys().copied().collect();
    let shards = u16::try_from(shards).unwrap_or(u16::MAX);
    // Distinct per boot, so request ids of an earlier boot still in the
    // log are never taken for this one's.
    let base = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64);
    match MetaGroup::new(config.node_id, &ids, shards, base) {
        Ok(g) if g.host().table().group_nodes().contains(&config.node_id) => Some(g),
        Ok(_) => {
            tracing::warn!(
                node = config.node_id,
                "this node is outside the metadata group (an even node count): it takes no topic commands"
            );
            None
        }
        Err(e) => {
            tracing::error!(error = %e, "metadata group not hosted");
            None
        }
    }
}

impl Shard {
    /// Applies the metadata group's committed log (shard 0 of a node in
    /// the group; see `controller::apply_loop`).
    async fn meta_apply_task(self: Rc<Self>) {
        crate::controller::apply_loop(&*self).await;
    }

    /// Runs the controller's topic operations (shard 0 only). The controller
    /// is written against the io_uring shard.
    async fn meta_task(self: Rc<Self>) {
        loop {
            self.meta.notified().await;
            loop {
                let next = self.meta_queue.borrow_mut().pop_front();
                let Some((op, reply)) = next else { break };
                let outcome = crate::controller::run(&*self, op).await;
                self.respond(reply, outcome);
            }
        }
    }
}

/// Directory of the shards' recycled segment files (one dir per shard).
pub(crate) const RECYCLE_DIR: &str = "recycle";

/// The pool of shard `id`: recycled files in `<data_dir>/recycle/<id>`,
/// bounded per shard by `recycled_files_max`.
/// Where the shards' journals live, under the data directory.
pub(crate) const JOURNAL_DIR: &str = "journal";

/// The transfer counters of `partitions`, summed.
fn transfer_totals(partitions: &HashMap<u32, Partition>) -> metrics::TransferTotals {
    let mut t = metrics::TransferTotals::default();
    for x in partitions.values().filter_map(Partition::transfer) {
        t.counters.add(&x.counters());
        let (bytes_received, chunks_received) = x.received();
        let (bytes_served, chunks_served) = x.served();
        t.bytes_received += bytes_received;
        t.chunks_received += chunks_received;
        t.bytes_served += bytes_served;
        t.chunks_served += chunks_served;
    }
    t
}

/// Shard `id`'s journal file when the node runs `shards` shards: a journal
/// holds records of the partitions its shard owns, which a different shard
/// count would place elsewhere (see `server::check_journals`).
pub(crate) fn journal_file_name(id: usize, shards: usize) -> String {
    format!("shard-{id}-of-{shards}")
}

/// The idle write buffers a shard's pool keeps at most:
/// [`WRITE_BUFFERS_IDLE_BYTES_MAX`] of them, at least
/// [`WRITE_BUFFERS_IDLE_MIN`].
fn write_buffers_idle_max(config: &ServerConfig) -> usize {
    // A pooled buffer is a block larger than the data it holds.
    let buf_bytes = config.write_buffer_bytes.max(1) + ringlog_storage::io::BLOCK_SIZE;
    (WRITE_BUFFERS_IDLE_BYTES_MAX / buf_bytes).max(WRITE_BUFFERS_IDLE_MIN)
}

fn shard_pool(config: &ServerConfig, id: usize) -> StorePool {
    let store = config.store_config();
    let dir = config.data_dir.join(RECYCLE_DIR).join(id.to_string());
    StorePool::new(
        dir,
        PoolConfig {
            write_buffers_idle_max: write_buffers_idle_max(config),
            batch_buffers_lent_max: config.produce_buffers_lent_max,
            read_cache_bytes_max: usize::try_from(config.read_cache_bytes).unwrap_or(usize::MAX),
            read_ahead_bytes_max: usize::try_from(config.read_ahead_bytes).unwrap_or(usize::MAX),
            ..PoolConfig::private(&store)
        },
    )
}

pub(crate) fn unknown_partition(partition_id: u32) -> OpError {
    OpError::new(
        ErrorCode::UnknownPartition,
        format!("partition id {partition_id} is not on this node (topic deleted?)"),
    )
}

mod turn;

#[cfg(test)]
mod crash_sim;
#[cfg(test)]
mod host_tests;
#[cfg(test)]
mod turn_tests;
