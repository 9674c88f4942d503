//! One shard: a pinned OS thread running a monoio io_uring runtime, its own
//! storage ring, and the partitions placed on it.
//!
//! Tasks on the runtime:
//! * accept: takes client connections (every shard listens on the same port
//!   with SO_REUSEPORT) and spawns a connection task each (see `net`);
//! * wake: awaits the shard's eventfd, routes replies from other shards to
//!   the waiting local tasks and kicks the turn task;
//! * turn: takes the queued work (local requests plus the request mailbox),
//!   applies it, then makes every append durable in one group commit and
//!   acknowledges (see [`Shard::run_turn`]);
//! * tick: long-poll fetch deadlines and retention;
//! * meta (shard 0 only): the controller, creating and deleting topics one at
//!   a time (see `controller`).
//!
//! Storage I/O is synchronous on this thread for now: a group commit submits
//! one write plus one fdatasync per touched partition in a single ring
//! submission and blocks the shard until they complete (reads likewise).
//! Network I/O that arrives meanwhile waits in socket buffers and joins the
//! next turn, so batching grows with load. The non-blocking variant (ring
//! eventfd awaited by a task, `prepare_flush`/`complete_flush`) is the next
//! step; the turn structure already separates append from acknowledgement.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use ringlog_protocol::wire::{ErrorCode, ProduceReply};
use ringlog_storage::io::uring::UringBackend;
use ringlog_storage::store::{flush_all, Appended, PartitionStore};

use crate::catalog::{Catalog, CatalogView, TopicState, TopicTable};
use crate::config::ServerConfig;
use crate::local::{self, Notify};
use crate::mailbox::{
    Envelope, MailboxRx, MailboxTx, MetaOp, Op, OpError, OpReply, Outcome, ReplyEnvelope, ReplyTo,
    SendError, ShardStatus,
};
use crate::metrics::{self, ShardMetrics};
use crate::partition::Partition;
use crate::placement::shard_for;

/// Ring entries of each shard's storage ring.
const STORAGE_RING_ENTRIES: u32 = 256;
/// Controller requests queued at once; more get Backpressure.
const META_QUEUE_MAX: usize = 64;
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
}

/// Where a reply goes, seen from the owning shard.
pub(crate) enum Responder {
    Local(local::Sender<Outcome>),
    Remote { shard: usize, token: u64 },
    Thread(crossbeam_channel::Sender<Outcome>),
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

struct Core {
    io: UringBackend,
    partitions: HashMap<u32, Partition>,
}

pub(crate) struct Shard {
    pub id: usize,
    pub config: Arc<ServerConfig>,
    pub catalog: Arc<Catalog>,
    view: RefCell<CatalogView>,
    pub peers: Arc<Vec<MailboxTx>>,
    rx: MailboxRx,
    pub metrics: Arc<ShardMetrics>,
    pub shutdown: Arc<Shutdown>,
    core_id: Option<usize>,
    core: RefCell<Core>,
    queue: RefCell<VecDeque<Work>>,
    turn: Notify,
    pending: RefCell<HashMap<u64, local::Sender<Outcome>>>,
    next_token: Cell<u64>,
    waiters: RefCell<HashMap<u32, Vec<Waiter>>>,
    meta_queue: RefCell<VecDeque<(MetaOp, Responder)>>,
    pub meta: Notify,
    pub stop: Notify,
    stopping: Cell<bool>,
}

/// Runs a shard on the current thread until shutdown.
pub fn run(setup: ShardSetup) {
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
    } = setup;
    if let Some(c) = core {
        if !core_affinity::set_for_current(c) {
            tracing::warn!(shard = id, core = c.id, "could not pin shard thread");
        }
    }
    let fail = |ready: &crossbeam_channel::Sender<Result<usize, String>>, msg: String| {
        let _ = ready.send(Err(msg));
    };
    let io = match UringBackend::new(STORAGE_RING_ENTRIES) {
        Ok(io) => io,
        Err(e) => return fail(&ready, format!("shard {id}: storage ring: {e}")),
    };
    let mut rt = match monoio::RuntimeBuilder::<monoio::IoUringDriver>::new()
        .enable_timer()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(&ready, format!("shard {id}: io_uring runtime: {e}")),
    };
    let view = CatalogView::new(catalog.clone());
    let shard = Rc::new(Shard {
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
            partitions: HashMap::new(),
        }),
        queue: RefCell::new(VecDeque::new()),
        turn: Notify::default(),
        pending: RefCell::new(HashMap::new()),
        next_token: Cell::new(1),
        waiters: RefCell::new(HashMap::new()),
        meta_queue: RefCell::new(VecDeque::new()),
        meta: Notify::default(),
        stop: Notify::default(),
        stopping: Cell::new(false),
    });
    rt.block_on(async move {
        let opened = shard.open_owned_partitions();
        let listener = match monoio::net::TcpListener::from_std(listener) {
            Ok(l) => l,
            Err(e) => return fail(&ready, format!("shard {id}: listener: {e}")),
        };
        let reader = match shard.rx.wake.reader() {
            Ok(r) => r,
            Err(e) => return fail(&ready, format!("shard {id}: eventfd: {e}")),
        };
        let _ = ready.send(Ok(opened));
        monoio::spawn(shard.clone().wake_task(reader));
        monoio::spawn(shard.clone().turn_task());
        monoio::spawn(shard.clone().tick_task());
        if id == 0 {
            monoio::spawn(shard.clone().meta_task());
        }
        crate::net::accept_loop(shard.clone(), listener).await;
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

impl Shard {
    /// The current topic table.
    pub fn table(&self) -> Arc<TopicTable> {
        self.view.borrow_mut().get().clone()
    }

    pub fn shard_count(&self) -> usize {
        self.peers.len()
    }

    pub fn is_stopping(&self) -> bool {
        self.stopping.get() || self.shutdown.is_triggered()
    }

    /// Opens every partition placed on this shard (boot).
    fn open_owned_partitions(&self) -> usize {
        let table = self.table();
        let mut core = self.core.borrow_mut();
        let Core { io, partitions } = &mut *core;
        for (topic, meta) in &table.topics {
            for index in 0..meta.partitions {
                if shard_for(topic, index, self.shard_count()) != self.id {
                    continue;
                }
                let id = meta.first_partition_id + index;
                let dir = TopicTable::partition_dir(&self.config.data_dir, topic, index);
                let p = Partition::open(
                    io,
                    &dir,
                    topic,
                    index,
                    id,
                    self.config.store_config(),
                    meta.state == TopicState::Creating,
                );
                partitions.insert(id, p);
            }
        }
        partitions.len()
    }

    /// Runs `op` on shard `owner` and waits for the outcome: locally through
    /// the turn queue, or through the owner's mailbox.
    pub async fn call(&self, owner: usize, op: Op) -> Outcome {
        let (tx, rx) = local::oneshot();
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
        }
    }

    async fn wake_task(self: Rc<Self>, reader: crate::mailbox::EventFdReader) {
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
            if !self.rx.requests.is_empty() {
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
            while self.run_turn() > 0 {
                yield_now().await;
            }
        }
    }

    /// Takes up to `group_commit_appends_max` work items (local queue first,
    /// then the mailbox), applies them, group-commits and replies. Returns
    /// how many items it took.
    fn run_turn(&self) -> usize {
        let max = self.config.group_commit_appends_max;
        let mut works = Vec::new();
        {
            let mut q = self.queue.borrow_mut();
            while works.len() < max {
                let Some(w) = q.pop_front() else { break };
                works.push(w);
            }
        }
        while works.len() < max {
            let Ok(env) = self.rx.requests.try_recv() else {
                break;
            };
            let reply = match env.reply {
                ReplyTo::Shard { shard, token } => Responder::Remote { shard, token },
                ReplyTo::Thread(tx) => Responder::Thread(tx),
            };
            works.push(Work { op: env.op, reply });
        }
        let taken = works.len();
        if taken == 0 {
            return 0;
        }
        let mut replies: Vec<(Responder, Outcome)> = Vec::with_capacity(taken);
        let mut acks: Vec<(u32, Appended, u32, Responder)> = Vec::new();
        let mut touched: Vec<u32> = Vec::new();
        {
            let mut core = self.core.borrow_mut();
            let Core { io, partitions } = &mut *core;
            for Work { op, reply } in works {
                match op {
                    Op::Produce {
                        partition_id,
                        batch,
                    } => {
                        let len = batch.len() as u64;
                        let Some(p) = partitions.get_mut(&partition_id) else {
                            replies.push((reply, Err(unknown_partition(partition_id))));
                            continue;
                        };
                        match p.produce(io, batch) {
                            Ok(app) => {
                                metrics::add(&self.metrics.append_bytes_total, len);
                                if !touched.contains(&partition_id) {
                                    touched.push(partition_id);
                                }
                                acks.push((partition_id, app, p.index, reply));
                            }
                            Err(e) => {
                                metrics::inc(&self.metrics.append_errors_total);
                                replies.push((reply, Err(e)));
                            }
                        }
                    }
                    Op::Fetch {
                        partition_id,
                        offset,
                        max_bytes,
                        wait_ms,
                    } => {
                        let Some(p) = partitions.get_mut(&partition_id) else {
                            replies.push((reply, Err(unknown_partition(partition_id))));
                            continue;
                        };
                        let waits = wait_ms > 0 && p.high_watermark() == Some(offset);
                        if waits {
                            let mut waiters = self.waiters.borrow_mut();
                            let list = waiters.entry(partition_id).or_default();
                            if list.len() < self.config.fetch_waiters_max {
                                list.push(Waiter {
                                    offset,
                                    max_bytes,
                                    deadline: Instant::now()
                                        + Duration::from_millis(u64::from(wait_ms)),
                                    reply,
                                });
                                continue;
                            }
                        }
                        let outcome = p.fetch(io, offset, max_bytes).map(|f| {
                            metrics::inc(&self.metrics.fetches_total);
                            metrics::add(&self.metrics.fetch_bytes_total, f.batches.len() as u64);
                            OpReply::Fetched(f)
                        });
                        replies.push((reply, outcome));
                    }
                    Op::Purge { partition_id } => {
                        let outcome = match partitions.get_mut(&partition_id) {
                            Some(p) => p.purge(io).map(|()| OpReply::Empty),
                            None => Err(unknown_partition(partition_id)),
                        };
                        replies.push((reply, outcome));
                    }
                    Op::Describe { partition_ids } => {
                        let mut list: Vec<_> = match partition_ids {
                            Some(ids) => ids
                                .iter()
                                .filter_map(|id| partitions.get(id))
                                .map(|p| p.status(self.id))
                                .collect(),
                            None => partitions.values().map(|p| p.status(self.id)).collect(),
                        };
                        list.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
                        replies.push((reply, Ok(OpReply::Partitions(list))));
                    }
                    Op::OpenPartition {
                        topic,
                        index,
                        partition_id,
                        create,
                    } => {
                        let outcome = match partitions.entry(partition_id) {
                            std::collections::hash_map::Entry::Occupied(_) => Ok(OpReply::Empty),
                            std::collections::hash_map::Entry::Vacant(slot) => {
                                let dir =
                                    TopicTable::partition_dir(&self.config.data_dir, &topic, index);
                                let p = Partition::open(
                                    io,
                                    &dir,
                                    &topic,
                                    index,
                                    partition_id,
                                    self.config.store_config(),
                                    create,
                                );
                                let fault = p.status(self.id).fault;
                                slot.insert(p);
                                match fault {
                                    None => Ok(OpReply::Empty),
                                    Some(f) => Err(OpError::new(ErrorCode::Storage, f)),
                                }
                            }
                        };
                        replies.push((reply, outcome));
                    }
                    Op::DropPartition { partition_id } => {
                        if let Some(p) = partitions.remove(&partition_id) {
                            let dir = p.dir().to_path_buf();
                            if let Err(e) = p.close(io) {
                                tracing::warn!(partition_id, error = %e, "close before delete failed");
                            }
                            if let Err(e) = std::fs::remove_dir_all(&dir) {
                                tracing::warn!(dir = %dir.display(), error = %e, "removing partition");
                            }
                        }
                        if let Some(ws) = self.waiters.borrow_mut().remove(&partition_id) {
                            for w in ws {
                                replies.push((w.reply, Err(unknown_partition(partition_id))));
                            }
                        }
                        replies.push((reply, Ok(OpReply::Empty)));
                    }
                    Op::ShardStatus => {
                        let st = ShardStatus {
                            shard: self.id,
                            core: self.core_id,
                            partitions: partitions.len(),
                            connections: self
                                .metrics
                                .connections_open
                                .load(std::sync::atomic::Ordering::Relaxed),
                            mailbox_depth: self.rx.requests.len(),
                        };
                        replies.push((reply, Ok(OpReply::Shard(st))));
                    }
                    Op::Meta(m) => {
                        let mut q = self.meta_queue.borrow_mut();
                        if self.id != 0 {
                            replies.push((
                                reply,
                                Err(OpError::new(ErrorCode::Internal, "not the controller")),
                            ));
                        } else if q.len() >= META_QUEUE_MAX {
                            replies.push((
                                reply,
                                Err(OpError::new(
                                    ErrorCode::Backpressure,
                                    "too many topic operations queued; retry",
                                )),
                            ));
                        } else {
                            q.push_back((m, reply));
                            self.meta.notify();
                        }
                    }
                }
            }
            if !acks.is_empty() {
                self.group_commit(io, partitions, &touched, acks, &mut replies);
            }
            self.serve_waiters(io, partitions, &touched, &mut replies);
        }
        for (reply, outcome) in replies {
            self.respond(reply, outcome);
        }
        taken
    }

    /// One write plus one fdatasync per touched partition, in one ring
    /// submission; then acknowledges exactly the appends the completed
    /// fdatasync covers.
    fn group_commit(
        &self,
        io: &mut UringBackend,
        partitions: &mut HashMap<u32, Partition>,
        touched: &[u32],
        acks: Vec<(u32, Appended, u32, Responder)>,
        replies: &mut Vec<(Responder, Outcome)>,
    ) {
        let started = Instant::now();
        let mut stores: Vec<&mut PartitionStore> = partitions
            .iter_mut()
            .filter(|(id, _)| touched.contains(id))
            .filter_map(|(_, p)| p.store_mut())
            .collect();
        let result = flush_all(io, &mut stores);
        drop(stores);
        let elapsed_us = started.elapsed().as_micros() as u64;
        metrics::inc(&self.metrics.fsyncs_total);
        self.metrics.fsync_latency_us.record(elapsed_us);
        self.metrics.group_commit_appends.record(acks.len() as u64);
        if let Err(e) = &result {
            tracing::error!(shard = self.id, error = %e, "group commit failed");
        }
        for (pid, app, index, reply) in acks {
            let durable = partitions
                .get(&pid)
                .and_then(|p| p.store().ok())
                .map(|s| (s.durable().next_offset, s.fenced().map(str::to_string)));
            let outcome = match durable {
                Some((end, _)) if end >= app.next_offset => {
                    metrics::inc(&self.metrics.appends_total);
                    Ok(OpReply::Produced(ProduceReply {
                        partition: index,
                        base_offset: app.base_offset,
                        next_offset: app.next_offset,
                    }))
                }
                Some((_, Some(cause))) => Err(OpError::new(ErrorCode::PartitionFenced, cause)),
                _ => Err(OpError::new(
                    ErrorCode::Storage,
                    result
                        .as_ref()
                        .err()
                        .map_or_else(|| "append not durable".to_string(), |e| e.to_string()),
                )),
            };
            if outcome.is_err() {
                metrics::inc(&self.metrics.append_errors_total);
            }
            replies.push((reply, outcome));
        }
    }

    /// Answers long-poll fetches whose data became durable.
    fn serve_waiters(
        &self,
        io: &mut UringBackend,
        partitions: &mut HashMap<u32, Partition>,
        touched: &[u32],
        replies: &mut Vec<(Responder, Outcome)>,
    ) {
        let mut waiters = self.waiters.borrow_mut();
        for pid in touched {
            let Some(list) = waiters.get_mut(pid) else {
                continue;
            };
            let Some(p) = partitions.get_mut(pid) else {
                continue;
            };
            let hwm = p.high_watermark().unwrap_or(0);
            let (ready, waiting): (Vec<Waiter>, Vec<Waiter>) =
                list.drain(..).partition(|w| w.offset < hwm);
            *list = waiting;
            for w in ready {
                let outcome = p.fetch(io, w.offset, w.max_bytes).map(OpReply::Fetched);
                replies.push((w.reply, outcome));
            }
        }
    }

    async fn tick_task(self: Rc<Self>) {
        let mut last_retention = Instant::now();
        loop {
            monoio::time::sleep(Duration::from_millis(TICK_MS)).await;
            let now = Instant::now();
            let mut replies = Vec::new();
            {
                let core = self.core.borrow();
                let mut waiters = self.waiters.borrow_mut();
                for (pid, list) in waiters.iter_mut() {
                    let (expired, keep): (Vec<Waiter>, Vec<Waiter>) = list
                        .drain(..)
                        .partition(|w| w.deadline <= now || self.is_stopping());
                    *list = keep;
                    for w in expired {
                        let outcome = match core.partitions.get(pid) {
                            Some(p) => Ok(OpReply::Fetched(p.empty_fetch(w.offset))),
                            None => Err(unknown_partition(*pid)),
                        };
                        replies.push((w.reply, outcome));
                    }
                }
                waiters.retain(|_, l| !l.is_empty());
            }
            for (reply, outcome) in replies {
                self.respond(reply, outcome);
            }
            let retention_due = now.duration_since(last_retention)
                >= Duration::from_millis(self.config.retention_check_ms);
            if retention_due && (self.config.retention_bytes > 0 || self.config.retention_ms > 0) {
                last_retention = now;
                let mut core = self.core.borrow_mut();
                let Core { io, partitions } = &mut *core;
                let t = now_ms();
                for p in partitions.values_mut() {
                    p.apply_retention(io, t);
                }
            }
        }
    }

    async fn meta_task(self: Rc<Self>) {
        loop {
            self.meta.notified().await;
            loop {
                let next = self.meta_queue.borrow_mut().pop_front();
                let Some((op, reply)) = next else { break };
                let outcome = crate::controller::run(&self, op).await;
                self.respond(reply, outcome);
            }
        }
    }

    /// Graceful stop: no new connections (the accept loop ended), finish the
    /// queued work (appends get their group commit and acknowledgement),
    /// then checkpoint and close every partition.
    async fn finish(&self) {
        self.stopping.set(true);
        tracing::info!(shard = self.id, "shard stopping");
        // Let connection tasks holding a fully read request enqueue it.
        for _ in 0..3 {
            yield_now().await;
            while self.run_turn() > 0 {}
        }
        let mut replies = Vec::new();
        for (_, list) in self.waiters.borrow_mut().drain() {
            for w in list {
                replies.push(w.reply);
            }
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
        let Core { io, partitions } = &mut *core;
        for (_, p) in partitions.drain() {
            let (topic, index) = (p.topic.clone(), p.index);
            if let Err(e) = p.close(io) {
                tracing::error!(%topic, partition = index, error = %e, "close failed");
            }
        }
        tracing::info!(shard = self.id, "shard stopped");
    }
}

pub(crate) fn unknown_partition(partition_id: u32) -> OpError {
    OpError::new(
        ErrorCode::UnknownPartition,
        format!("partition id {partition_id} is not on this node (topic deleted?)"),
    )
}
