//! State transfer hosted beside a replicated partition's replica (DESIGN.md
//! section 7), the server's counterpart of `sim/transfer.rs`: a transfer
//! `Server` always, a `Receiver` from the replica's `TransferNeeded` until
//! the transfer ends.
//!
//! The replica keeps being stepped while its receiver waits for an offer
//! (it still votes). From the receiver's BeginInstall on it is frozen: it
//! takes only storage completions, which here are its waiting group-commit
//! flushes (every other op of the replica runs synchronously inside its
//! step, so nothing else is queued). Before the install begins the store is
//! flushed and those flushes answered: a frozen replica is a backup (a
//! transferring replica never leads), its appends are durable before the
//! install, and the PrepareOks they earn go out; an op it never
//! acknowledged is the primary's to retransmit. Then the install runs; its
//! commit's superblock write also marks the replica wiped
//! (`transfer::io::Installs::mark_for_commit`), unless the install covers
//! the log the replica had as a voter: a crash before that write reopens
//! the old log unmarked, one after it the installed log as marked. An
//! attempt that does not commit leaves the old log and the replica is
//! stepped again on it; an install reboots it (`replica_io::recover` +
//! `Replica::restart`) on the installed frontier, wiped (it repairs from
//! there) or, covered, as a voter that is behind (`vsr` module docs).
//!
//! Storage: chunk reads (serving) and staged writes (installing) go on the
//! shard's ring through `transfer::io::Pipeline` without waiting: the
//! shard's reaping hands their batches back (`Hosted::transfer_reaped`),
//! and each completion, checked (a failed read or write is a Fault to its
//! machine), is fed to it as an `IoDone`, so the serving side reads the
//! next window while earlier chunks are on the wire and the receiver pulls
//! while a window is being written. Snapshot leases run at once. An
//! install's begin, commit and abort run only while no flush or spare of
//! the partition is in flight (as a replica's synchronous cut or persist):
//! reached from a completion while one is, they wait in the queue, in
//! emission order, for the next tick or message. Started, they wait on the
//! pipeline, without blocking, for the partition's transfer I/O in flight
//! (at most a window of each machine's chunks); the commit and abort then
//! run on the ring a step per batch, and nothing queued behind them starts
//! until they are answered.

use std::collections::{BTreeMap, VecDeque};

use ringlog_storage::io::IoBackend;
use ringlog_storage::store::PartitionStore;

use super::Hosted;
use crate::ops::TransferStatus;
use crate::replica_io;
use crate::transfer::io::{Installs, Pipeline, Reaped};
use crate::transfer::{
    Budgets, Event as XEvent, Frontier, IoId, Local, Message as XMsg, Outbox, Output, Receiver,
    ReceiverConfig, ReceiverInput, Server, ServerConfig, ServerInput, ServingState, TransferOp,
    Trigger,
};
use crate::vsr::{Input, Replica, Status};

/// Transfer ops queued behind one another in a partition: a step emits at
/// most a window of chunk ops plus a few, and they start before the step
/// returns unless an install's begin, commit or abort waits at the head
/// for a flush (see the module docs). Beyond it an op is refused with a
/// transient fault (counted in `ops_refused`), except those that release
/// what an attempt holds (abort, commit, snapshot release: at most one of
/// each per attempt or lease), which are always queued.
pub(super) const PENDING_OPS_MAX: usize = 256;

/// Idle chunk read buffers a serving partition keeps for its next reads:
/// a receiver's default window (`Budgets::default().window_chunks`).
pub(super) const READ_BUFFERS_IDLE_MAX: usize = 8;

pub use crate::ops::TransferCounters;

/// A running transfer, for `ctl transfers`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransferProgress {
    pub state: &'static str,
    pub trigger: Option<Trigger>,
    /// The replica whose offer was taken, once one was.
    pub peer: Option<u8>,
    pub bytes_received: u64,
    pub chunks_received: u64,
    /// The offer's bytes and chunks, once its install began.
    pub bytes_total: Option<u64>,
    pub chunks_total: Option<u64>,
    pub chunks_in_flight: usize,
    /// The driver's clock when the transfer started.
    pub started_ms: u64,
    pub frozen: bool,
}

/// What kind of op a started one is, for what its answer changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Begin,
    Commit,
    Abort,
    Other,
}

/// An op on the pipeline: which machine asked, and its id there.
#[derive(Debug, Clone, Copy)]
struct Started {
    rx: bool,
    id: IoId,
    kind: Kind,
}

impl Kind {
    fn of(op: &TransferOp) -> Kind {
        match op {
            TransferOp::BeginInstall { .. } => Kind::Begin,
            TransferOp::CommitInstall => Kind::Commit,
            TransferOp::AbortInstall => Kind::Abort,
            _ => Kind::Other,
        }
    }

    /// It drains the partition's transfer I/O and writes the store's
    /// files or superblock: only while no flush or spare is in flight.
    fn drains(self) -> bool {
        self != Kind::Other
    }
}

/// What `ctl transfers` shows of the running transfer beyond the
/// receiver's counters: the host keeps it (the machine has no clock).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Running {
    started_ms: u64,
    peer: Option<u8>,
    /// (bytes, chunks) the offer holds; counters received at its start.
    total: Option<(u64, u64)>,
    received_at_start: (u64, u64),
}

/// One replicated partition's transfer machines and driver state.
pub struct TransferHost {
    server: Server,
    receiver: Option<Receiver>,
    /// The replica asked for a transfer, for this trigger: the receiver
    /// starts at the next tick.
    wanted: Option<Trigger>,
    /// BeginInstall was emitted: the replica takes only completions.
    frozen: bool,
    /// The wipe mark the starting install's commit writes (see
    /// [`Installs::mark_for_commit`]): the rebooted replica must show it.
    commit_mark: Option<bool>,
    /// An install was begun and neither committed nor aborted.
    installing: bool,
    /// An install committed: the replica is rebooted before its next step.
    installed: bool,
    /// (for the receiver, id, op), in emission order; at most
    /// `pending_ops_max` but for the releasing ops (see [`PENDING_OPS_MAX`]).
    pending: VecDeque<(bool, IoId, TransferOp)>,
    pending_ops_max: usize,
    /// The partition's transfer I/O on the shard's ring.
    pipeline: Pipeline,
    /// Ops started and not answered, by the host's id for them (the two
    /// machines number their ops independently): at most the pipeline's
    /// batches in flight.
    started: BTreeMap<IoId, Started>,
    next_io: IoId,
    /// Messages for peers (replica index), taken with the replica's.
    pub(super) sends: Vec<(u8, XMsg)>,
    seed: u64,
    counters: TransferCounters,
    running: Running,
}

impl TransferHost {
    /// `chunk_bytes`: the store's transfer chunk size.
    pub(super) fn new(seed: u64, chunk_bytes: u32) -> Self {
        Self {
            server: Server::new(ServerConfig::default()),
            receiver: None,
            wanted: None,
            frozen: false,
            commit_mark: None,
            installing: false,
            installed: false,
            pending: VecDeque::new(),
            pending_ops_max: PENDING_OPS_MAX,
            // Reused while serving (a fresh zeroed 1 MiB buffer per chunk
            // cost more than the copy out of it); an idle partition holds
            // none (`run_pending` drops them once no snapshot is open).
            pipeline: Pipeline::new(chunk_bytes, READ_BUFFERS_IDLE_MAX),
            started: BTreeMap::new(),
            next_io: 1,
            sends: Vec::new(),
            seed,
            counters: TransferCounters::default(),
            running: Running::default(),
        }
    }

    pub fn counters(&self) -> TransferCounters {
        self.counters
    }

    /// Bytes served to peers, and chunks (from the serving machine).
    pub fn served(&self) -> (u64, u64) {
        let c = self.server.counters();
        (c.bytes_served, c.chunks_served)
    }

    /// Bytes and chunks received by every transfer of this boot.
    pub fn received(&self) -> (u64, u64) {
        self.receiver.as_ref().map_or((0, 0), |r| {
            let c = r.counters();
            (c.bytes_received, c.chunks_received)
        })
    }

    /// The transfer running, if one is.
    pub fn progress(&self) -> Option<TransferProgress> {
        let rx = self.receiver.as_ref().filter(|r| r.is_active())?;
        let c = rx.counters();
        let run = &self.running;
        // The receiver's counters span its boot; this transfer's are the
        // growth since it started.
        let (bytes0, chunks0) = run.received_at_start;
        debug_assert!(c.bytes_received >= bytes0 && c.chunks_received >= chunks0);
        Some(TransferProgress {
            state: rx.phase_name(),
            trigger: rx.trigger(),
            peer: run.peer,
            bytes_received: c.bytes_received.saturating_sub(bytes0),
            chunks_received: c.chunks_received.saturating_sub(chunks0),
            bytes_total: run.total.map(|t| t.0),
            chunks_total: run.total.map(|t| t.1),
            chunks_in_flight: rx.in_flight_chunks(),
            started_ms: run.started_ms,
            frozen: self.frozen,
        })
    }

    /// The replica must not be stepped with `input` (see the module docs).
    pub(super) fn freezes(&self, input: &Input) -> bool {
        self.frozen && !matches!(input, Input::IoDone { .. })
    }

    pub(super) fn is_frozen(&self) -> bool {
        self.frozen
    }

    /// A tick does something: a transfer is wanted or running, or a
    /// snapshot is leased out.
    pub(super) fn needs_tick(&self) -> bool {
        self.wanted.is_some()
            || self.receiver.as_ref().is_some_and(Receiver::is_active)
            || self.server.snapshots_open() > 0
            || !self.pending.is_empty()
    }

    /// Transfer batches of this partition on the ring now, and the most
    /// there were at once.
    pub fn io_in_flight(&self) -> (usize, usize) {
        (self.pipeline.in_flight(), self.pipeline.in_flight_peak())
    }

    /// An install's begin, commit or abort is held or running on the ring.
    pub fn ends_install(&self) -> bool {
        self.pipeline.ends_install()
    }

    /// Chunk read buffers kept idle for the next serving reads.
    pub fn idle_read_buffers(&self) -> usize {
        self.pipeline.idle_buffers()
    }

    /// Lowers the queue bound (tests reach it without a full window).
    #[cfg(test)]
    pub(super) fn set_pending_ops_max(&mut self, ops_max: usize) {
        self.pending_ops_max = ops_max;
    }

    /// The replica emitted `TransferNeeded` for `trigger`.
    pub(super) fn want(&mut self, trigger: Trigger) {
        if !self.receiver.as_ref().is_some_and(Receiver::is_active) {
            self.wanted = Some(trigger);
        }
    }
}

fn budgets(store: &PartitionStore) -> Budgets {
    let cfg = store.config();
    Budgets {
        chunk_size_bytes: cfg.transfer_chunk_bytes,
        window_chunks: cfg.transfer_window_chunks,
        artifact_bytes_max: cfg.segment_size_bytes,
        ..Budgets::default()
    }
}

impl Hosted {
    /// One tick of the transfer machines; starts a wanted transfer.
    pub(super) fn transfer_tick(
        &mut self,
        io: &mut impl IoBackend,
        installs: &mut Installs,
        now_ms: u64,
    ) {
        self.transfer_start(io, installs, now_ms);
        self.step_server(io, installs, now_ms, ServerInput::Tick);
        self.step_receiver(io, installs, now_ms, ReceiverInput::Tick);
    }

    /// The running transfer, as `ctl transfers` shows it.
    pub(super) fn transfer_status(&self) -> Option<TransferStatus> {
        let p = self.xfer.as_ref()?.progress()?;
        let repl = self.repl.as_ref()?;
        let peer_node = p.peer.and_then(|r| repl.nodes.get(usize::from(r)).copied());
        debug_assert!(
            p.peer.is_none() || peer_node.is_some(),
            "a peer of the group"
        );
        Some(TransferStatus {
            state: p.state,
            trigger: p.trigger.map_or("", |t| t.label()),
            peer_node,
            bytes_received: p.bytes_received,
            bytes_total: p.bytes_total,
            chunks_received: p.chunks_received,
            chunks_total: p.chunks_total,
            chunks_in_flight: p.chunks_in_flight,
            started_ms: p.started_ms,
            frozen: p.frozen,
        })
    }

    fn transfer_start(&mut self, io: &mut impl IoBackend, installs: &mut Installs, now_ms: u64) {
        let (Some(x), Some(repl)) = (self.xfer.as_mut(), self.repl.as_ref()) else {
            return;
        };
        let Some(trigger) = x.wanted else {
            return;
        };
        if x.receiver.as_ref().is_some_and(Receiver::is_active) {
            return;
        }
        x.wanted = None;
        if x.receiver.is_none() {
            let cfg = ReceiverConfig {
                replica_count: repl.nodes.len() as u8,
                replica: repl.replica,
                budgets: budgets(&self.store),
            };
            x.seed = x.seed.wrapping_mul(6364136223846793005).wrapping_add(1);
            match Receiver::new(cfg, x.seed) {
                Ok(r) => x.receiver = Some(r),
                Err(e) => {
                    tracing::error!(partition_id = self.store.partition_id(), error = %e.0, "transfer budgets refused");
                    return;
                }
            }
        }
        x.counters.started[trigger.index()] += 1;
        let received_at_start = x.received();
        x.running = Running {
            started_ms: now_ms,
            received_at_start,
            ..Running::default()
        };
        let sb = self.store.superblock();
        let end = self.store.durable();
        let local = Local {
            partition_id: self.store.partition_id(),
            view: sb.vsr.view,
            commit: sb.vsr.commit,
            purge_generation: sb.purge_generation,
            frontier: Frontier {
                next_offset: end.next_offset,
                last_op: end.last_op,
                last_checksum: end.last_checksum,
            },
        };
        tracing::info!(
            partition_id = local.partition_id,
            trigger = trigger.label(),
            "state transfer started"
        );
        self.step_receiver(
            io,
            installs,
            now_ms,
            ReceiverInput::Start { trigger, local },
        );
    }

    /// After the replica stepped: one whose log grew again (a peer still
    /// held the ops) needs no transfer; its receiver is cancelled unless
    /// its install began.
    pub(super) fn transfer_check_needed(
        &mut self,
        io: &mut impl IoBackend,
        installs: &mut Installs,
        now_ms: u64,
    ) {
        let Some(x) = self.xfer.as_mut() else {
            return;
        };
        if self.replica.is_transferring() || x.frozen || x.installing {
            return;
        }
        x.wanted = None;
        if x.receiver.as_ref().is_some_and(Receiver::is_active) {
            self.step_receiver(io, installs, now_ms, ReceiverInput::Cancel);
        }
    }

    /// A transfer message from replica `from`.
    pub(super) fn deliver_transfer(
        &mut self,
        io: &mut impl IoBackend,
        installs: &mut Installs,
        now_ms: u64,
        from: u8,
        msg: XMsg,
    ) {
        if msg.for_receiver() {
            let input = ReceiverInput::Message { from, msg };
            return self.step_receiver(io, installs, now_ms, input);
        }
        let frozen = self.xfer.as_ref().is_some_and(|x| x.is_frozen());
        let r = &self.replica;
        let state = ServingState {
            available: !frozen && r.status() != Status::Fenced,
            normal: !frozen && r.status() == Status::Normal && !r.is_wiped(),
            commit: r.commit(),
            commit_max: r.commit(),
        };
        let input = ServerInput::Message { from, msg, state };
        self.step_server(io, installs, now_ms, input);
    }

    /// A frame from `from` that did not decode: charged by the receiver.
    pub(super) fn transfer_undecodable(
        &mut self,
        io: &mut impl IoBackend,
        installs: &mut Installs,
        now_ms: u64,
        from: u8,
    ) {
        if let Some(x) = self.xfer.as_mut() {
            x.counters.undecodable += 1;
        }
        let input = ReceiverInput::Undecodable { from };
        self.step_receiver(io, installs, now_ms, input);
    }

    fn step_server(
        &mut self,
        io: &mut impl IoBackend,
        installs: &mut Installs,
        now_ms: u64,
        input: ServerInput,
    ) {
        let Some(x) = self.xfer.as_mut() else {
            return;
        };
        let mut out = Outbox::new();
        x.server.step(input, &mut out);
        self.transfer_outputs(io, installs, now_ms, false, out);
    }

    fn step_receiver(
        &mut self,
        io: &mut impl IoBackend,
        installs: &mut Installs,
        now_ms: u64,
        input: ReceiverInput,
    ) {
        let Some(rx) = self.xfer.as_mut().and_then(|x| x.receiver.as_mut()) else {
            return;
        };
        let mut out = Outbox::new();
        rx.step(input, &mut out);
        self.transfer_outputs(io, installs, now_ms, true, out);
    }

    /// Queues the machines' outputs, then starts the queued ops in order
    /// (answers ready at once step the machines again, which may queue
    /// more). Only from a message or a tick: no flush of the partition is
    /// in flight.
    fn transfer_outputs(
        &mut self,
        io: &mut impl IoBackend,
        installs: &mut Installs,
        now_ms: u64,
        rx: bool,
        out: Outbox,
    ) {
        self.queue_outputs(rx, out);
        self.run_pending(io, installs, now_ms, true);
    }

    /// Starts the queued ops in emission order; while not `quiet` (a flush
    /// or spare of the partition in flight) it stops at the first that
    /// drains (see the module docs).
    fn run_pending(
        &mut self,
        io: &mut impl IoBackend,
        installs: &mut Installs,
        now_ms: u64,
        quiet: bool,
    ) {
        while let Some(x) = self.xfer.as_mut() {
            if x.pipeline.ends_install() {
                // Nothing overtakes an install's begin, commit or abort:
                // its last completion runs what is queued behind it.
                break;
            }
            let blocked = |(_, _, op): &(bool, IoId, TransferOp)| !quiet && Kind::of(op).drains();
            if x.pending.front().is_none_or(blocked) {
                break;
            }
            let Some((rx, id, op)) = x.pending.pop_front() else {
                break;
            };
            self.start_transfer_op(io, installs, now_ms, rx, id, op);
        }
        if let Some(x) = self.xfer.as_mut() {
            if x.server.snapshots_open() == 0 {
                x.pipeline.drop_idle_buffers();
            }
        }
        if self.xfer.as_ref().is_some_and(|x| x.installed) {
            self.reboot_installed(io);
        }
    }

    /// Batches of this partition's transfer I/O the shard reaped: each is
    /// answered to its machine, and what that queues starts (`quiet`: no
    /// flush or spare of the partition is in flight).
    pub(super) fn transfer_reaped(
        &mut self,
        io: &mut impl IoBackend,
        installs: &mut Installs,
        now_ms: u64,
        reaped: Reaped,
        quiet: bool,
    ) {
        let mut done = Vec::with_capacity(reaped.len());
        for (batch, completions) in reaped {
            let reaped = (batch, completions);
            let Some(x) = self.xfer.as_mut().filter(|x| x.pipeline.owns(batch)) else {
                if self.xfer.is_some() {
                    tracing::error!(partition_id = self.store.partition_id(), batch = ?batch, "a transfer batch the pipeline does not hold");
                }
                installs.forget(io, reaped);
                continue;
            };
            let store = &mut self.store;
            let completed = x
                .pipeline
                .complete(store, io, installs, reaped, now_ms, &mut done);
            debug_assert!(completed, "the pipeline owns the batch");
        }
        for (hid, result) in done {
            self.answer_transfer_op(hid, result);
        }
        self.run_pending(io, installs, now_ms, quiet);
    }

    fn queue_outputs(&mut self, rx: bool, mut out: Outbox) {
        let pid = self.store.partition_id();
        let Some(x) = self.xfer.as_mut() else {
            return;
        };
        let mut refused = Vec::new();
        for o in out.drain() {
            match o {
                Output::Send { to, msg } => x.sends.push((to, msg)),
                Output::Io { id, op } => {
                    let releases = matches!(
                        op,
                        TransferOp::AbortInstall
                            | TransferOp::CommitInstall
                            | TransferOp::ReleaseSnapshot { .. }
                    );
                    if x.pending.len() >= x.pending_ops_max && !releases {
                        tracing::warn!(
                            partition_id = pid,
                            op = op.name(),
                            "transfer op queue full; refused"
                        );
                        x.counters.ops_refused += 1;
                        refused.push(id);
                        continue;
                    }
                    if let TransferOp::BeginInstall { manifest } = &op {
                        x.frozen = true;
                        let bytes = manifest.artifacts.iter().map(|a| a.length_bytes).sum();
                        let chunks = manifest
                            .artifacts
                            .iter()
                            .map(|a| a.chunk_checksums.len() as u64)
                            .sum();
                        x.running.total = Some((bytes, chunks));
                    }
                    x.pending.push_back((rx, id, op));
                }
                Output::Event(e) => x.installed |= x.note(pid, &e),
            }
        }
        for id in refused {
            let fault = crate::transfer::Fault {
                kind: crate::transfer::FaultKind::Transient,
                reason: format!("{} transfer ops queued, the limit", x.pending.len()),
            };
            x.step_machine(rx, id, Err(fault), &mut out);
        }
        if !out.is_empty() {
            // What the refusals made the machine emit (an abort, a
            // release: always queued), so this recursion ends here.
            self.queue_outputs(rx, out);
        }
    }

    /// Starts one transfer op on the pipeline, and answers what finished
    /// at once.
    fn start_transfer_op(
        &mut self,
        io: &mut impl IoBackend,
        installs: &mut Installs,
        now_ms: u64,
        rx: bool,
        id: IoId,
        op: TransferOp,
    ) {
        let kind = Kind::of(&op);
        let Some(x) = self.xfer.as_mut() else {
            return;
        };
        let hid = x.next_io;
        x.next_io += 1;
        x.started.insert(hid, Started { rx, id, kind });
        let mut done = Vec::new();
        let ready = match kind {
            Kind::Begin => self.prepare_install(io),
            Kind::Commit => {
                // In the commit's own superblock write: until it lands, a
                // crash reopens the old log, which holds every op the
                // replica acked, so it reboots a voter (sim seed 31001553:
                // a mark written apart, a crash between, one disk lost
                // beside, and no quorum of voters was left).
                let voter_op = (!self.replica.is_wiped()).then(|| self.replica.op());
                let mark = installs.mark_for_commit(self.store.partition_id(), voter_op);
                if let Some(x) = self.xfer.as_mut() {
                    x.commit_mark = mark;
                }
                true
            }
            Kind::Abort | Kind::Other => true,
        };
        if !ready {
            let fault = crate::transfer::Fault {
                kind: crate::transfer::FaultKind::Local,
                reason: "the store could not be made ready for the install".into(),
            };
            done.push((hid, Err(fault)));
        } else if let Some(x) = self.xfer.as_mut() {
            let store = &mut self.store;
            x.pipeline
                .start(store, io, installs, (hid, &op), now_ms, &mut done);
        }
        for (hid, result) in done {
            self.answer_transfer_op(hid, result);
        }
    }

    /// Feeds the result of started op `hid` back to its machine.
    fn answer_transfer_op(
        &mut self,
        hid: IoId,
        result: Result<crate::transfer::IoOutcome, crate::transfer::Fault>,
    ) {
        let Some(x) = self.xfer.as_mut() else {
            return;
        };
        let Some(Started { rx, id, kind }) = x.started.remove(&hid) else {
            debug_assert!(false, "an answer to an op never started");
            return;
        };
        match (kind, &result) {
            (Kind::Begin, Ok(_)) => x.installing = true,
            (Kind::Begin, Err(f)) if f.kind == crate::transfer::FaultKind::Transient => {
                x.counters.installs_deferred += 1;
            }
            (Kind::Commit | Kind::Abort, _) => x.installing = false,
            _ => {}
        }
        let failed = match kind {
            Kind::Begin | Kind::Commit => result.is_err(),
            Kind::Abort => true,
            Kind::Other => false,
        };
        if failed {
            // The old log is in place, unmarked: the replica resumes with it.
            x.frozen = false;
            x.commit_mark = None;
        }
        let mut out = Outbox::new();
        x.step_machine(rx, id, result, &mut out);
        self.queue_outputs(rx, out);
    }

    /// Before an install begins: the frozen replica's waiting flushes are
    /// made durable and answered. False if that failed (the store is
    /// fenced then).
    fn prepare_install(&mut self, io: &mut impl IoBackend) -> bool {
        if !self.flushes.is_empty() {
            if let Err(e) = self.store.flush(io) {
                tracing::warn!(partition_id = self.store.partition_id(), error = %e, "flush before an install failed");
            }
            self.answer_flushes(io);
        }
        self.store.fenced().is_none()
    }

    /// The install committed: the replica reboots from the store on the
    /// installed frontier, wiped as the commit marked it (the transfer
    /// machines are kept: their counters, and the server's leases).
    fn reboot_installed(&mut self, io: &mut impl IoBackend) {
        let pid = self.store.partition_id();
        let (Some(x), Some(repl)) = (self.xfer.as_mut(), self.repl.as_ref()) else {
            return;
        };
        x.installed = false;
        x.seed = x.seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mark = x.commit_mark.take();
        let cfg = repl.replica_config(pid, self.store.config());
        let seed = x.seed;
        let booted = replica_io::recover(
            &mut self.store,
            io,
            replica_io::INSTALLED_COMMITTED_OPS_KEPT,
        )
        .map_err(|e| e.to_string())
        .and_then(|rec| {
            debug_assert_eq!(Some(rec.durable.wiped), mark, "the commit's mark");
            Replica::restart(cfg, seed, rec.durable, rec.base, &rec.headers)
                .map_err(|e| e.to_string())
        });
        let replica = match booted {
            Ok(replica) => replica,
            Err(e) => {
                // The store holds the install; the old replica must not
                // step on it: it stays frozen (fail-stop for this
                // partition), and a restart recovers it wiped.
                tracing::error!(partition_id = pid, error = %e, "replica reboot after an install failed");
                return;
            }
        };
        debug_assert_eq!(
            Some(replica.is_wiped()),
            mark,
            "boots as the commit marked it"
        );
        self.replica = replica;
        self.flushes.clear();
        self.inputs.clear();
        if let Some(x) = self.xfer.as_mut() {
            x.frozen = false;
            x.installing = false;
            x.wanted = None;
        }
        tracing::info!(
            partition_id = pid,
            "state transfer installed; replica rebooted"
        );
    }
}

impl TransferHost {
    /// Steps the machine that asked for op `id` with its result.
    fn step_machine(
        &mut self,
        rx: bool,
        id: IoId,
        result: Result<crate::transfer::IoOutcome, crate::transfer::Fault>,
        out: &mut Outbox,
    ) {
        if rx {
            if let Some(r) = self.receiver.as_mut() {
                r.step(ReceiverInput::IoDone { id, result }, out);
            }
        } else {
            self.server.step(ServerInput::IoDone { id, result }, out);
        }
    }

    /// Counts an event; true for an install.
    fn note(&mut self, pid: u32, e: &XEvent) -> bool {
        let c = &mut self.counters;
        match e {
            XEvent::Installed { .. } => c.installs += 1,
            XEvent::OfferTaken { peer, .. } => self.running.peer = Some(*peer),
            XEvent::AttemptFailed { .. } => c.attempts_failed += 1,
            XEvent::Rotated { .. } => c.rotations += 1,
            XEvent::OfferRefused { .. } => c.refusals += 1,
            XEvent::Quarantined { .. } => c.quarantines += 1,
            XEvent::Dropped {
                what: "charged", ..
            } => c.charges += 1,
            _ => {}
        }
        if !matches!(e, XEvent::Dropped { .. }) {
            tracing::info!(partition_id = pid, event = ?e, "state transfer");
        }
        matches!(e, XEvent::Installed { .. })
    }
}
