//! The simulated cluster: R nodes, the network, a client, the fault
//! schedule and the checker, stepped one input at a time from one seed.

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};

use ringlog_protocol::replication as wire;
use ringlog_protocol::{BatchBuilder, BatchHeader, Record, Stamp, HEADER_LEN};

use crate::vsr::timeout::Rng;
use crate::vsr::{
    AppendError, Body, Config, Event, Input, Message, Outbox, Output, Status, StorageOp, Token,
};

use super::checker::{violation, Ack, Checker, DurableView, Violation};
use super::faults::{chance, FaultRates};
use super::network::{Network, Packet};
use super::node::{store_config, Node, Queued, RunIo, PARTITION_ID, PENDING_IO_MAX};
use super::trace::Trace;
use super::{Counts, SimOptions};

#[path = "transfer.rs"]
mod transfer;
pub use transfer::NodeXfer;
#[path = "purge.rs"]
mod purge;
pub use purge::Purges;
#[path = "hostile.rs"]
mod hostile;
pub use hostile::{Hostile, Hostility, HOSTILITIES};
#[path = "meta.rs"]
mod meta;
pub use meta::{MetaCounts, MetaSim};

pub const CLUSTER_ID: u128 = 0x5eed_c1a5;
/// Deliveries and storage completions per tick at most (the rest wait).
const EVENTS_PER_TICK_MAX: u32 = 4096;
/// Appends the client has in flight at most (it waits past this).
pub const CLIENT_IN_FLIGHT_MAX: usize = 64;
/// Committed ops a booting replica keeps in its journal.
const BOOT_COMMITTED_OPS_KEPT: u64 = 8;

/// The replica settings of the simulation: small bounds, so pipelines
/// fill, journals prune (repair then reads the segments) and timeouts fire.
/// The primary drains its pipeline every third of the stores' uncommitted
/// headroom, so under a steady stream every store still rolls.
pub fn replica_config(n: u8, r: u8, uncommitted_headroom_bytes: u64, transfers: bool) -> Config {
    let mut c = Config::new(PARTITION_ID, n, r);
    c.drain_every_bytes = Some(uncommitted_headroom_bytes / 3);
    c.pipeline_ops_max = 4;
    c.client_queue_max = 16;
    c.journal_ops_max = 16;
    c.repair_batches_max = 8;
    c.heartbeat_ticks = 2;
    c.prepare_retry_ticks = 4;
    c.primary_silent_ticks = 10;
    c.view_change_retry_ticks = 4;
    c.view_change_escalate_ticks = 20;
    c.start_view_request_ticks = 4;
    c.repair_retry_ticks = 4;
    // Small against a run's few hundred ops, so wiped replicas transfer;
    // without transfers nobody answers the triggers.
    c.wiped_repair_ops_max = transfers.then_some(SIM_WIPED_REPAIR_OPS_MAX);
    c.repair_stuck_rounds_max = transfers.then_some(SIM_REPAIR_STUCK_ROUNDS_MAX);
    c
}

/// The simulator's [`Config::wiped_repair_ops_max`] with transfers on.
pub const SIM_WIPED_REPAIR_OPS_MAX: u64 = 24;
/// The simulator's [`Config::repair_stuck_rounds_max`] with transfers on.
pub const SIM_REPAIR_STUCK_ROUNDS_MAX: u32 = 6;

/// The producer: appends through the replica it believes is the primary,
/// remembers what it sent, learns the primary from refusals.
#[derive(Debug, Default)]
struct Client {
    next_token: Token,
    believed_primary: u8,
    /// Token -> (replica it went to, the batch body).
    in_flight: BTreeMap<Token, (u8, Vec<u8>)>,
    /// Bodies of acknowledged appends, by token.
    acked_bodies: BTreeMap<Token, Vec<u8>>,
}

pub struct Cluster {
    pub seed: u64,
    pub n: u8,
    rng: Rng,
    pub rates: FaultRates,
    /// The rates this seed drew (the liveness phase replaces `rates`).
    pub drawn: FaultRates,
    net: Network,
    nodes: Vec<Node>,
    checker: Checker,
    pub trace: Trace,
    pub tick: u64,
    pub steps: u64,
    pub counts: Counts,
    client: Client,
    io_ops_per_tick_max: u64,
    uncommitted_headroom_bytes: u64,
    /// Retention and state transfer on ([`SimOptions::transfers`]).
    transfers: bool,
    /// Operator purges on ([`SimOptions::purges`]).
    purges: bool,
    purge: Purges,
    /// The seed's hostile transfer server ([`SimOptions::hostile`]).
    pub hostile: Option<Hostile>,
    segment_bytes: u64,
    /// A metadata group's run ([`Cluster::enable_meta`]).
    pub meta: Option<MetaSim>,
}

impl Cluster {
    pub fn new(opts: &SimOptions, n: u8) -> Result<Self, Violation> {
        let seed = opts.seed;
        let mut rng = Rng::new(seed);
        let mut rates = FaultRates::draw(&mut rng, n);
        if !opts.read_bit_flips {
            rates.disk.read_bit_flip = 0.0;
        }
        if !opts.wipes {
            rates.wipe_pct = 0;
        }
        let io_ops_per_tick_max = 1 + rng.below(12);
        let mut store = store_config(opts.segment_bytes, opts.uncommitted_headroom_bytes);
        if opts.transfers {
            // Little kept past the active segment: a replica lagging past it, or
            // wiped, must transfer.
            store.retention_bytes = Some(opts.segment_bytes / 4);
        }
        let mut nodes = Vec::new();
        for r in 0..n {
            let seeds = (rng.next_u64(), rng.next_u64());
            let cfg = replica_config(n, r, opts.uncommitted_headroom_bytes, opts.transfers);
            let mut node = Node::new(r, store.clone(), seeds, cfg)?;
            node.set_disk_faults(rates.disk.clone());
            nodes.push(node);
        }
        Ok(Self {
            seed,
            n,
            rng,
            drawn: rates.clone(),
            rates,
            net: Network::new(n),
            nodes,
            checker: Checker::new(n),
            trace: if opts.full_trace {
                Trace::keeping(usize::MAX)
            } else {
                Trace::new()
            },
            tick: 0,
            steps: 0,
            counts: Counts::default(),
            client: Client::default(),
            io_ops_per_tick_max,
            uncommitted_headroom_bytes: opts.uncommitted_headroom_bytes,
            transfers: opts.transfers,
            purges: opts.purges,
            purge: Purges::default(),
            hostile: Hostile::draw(seed, n, opts.hostile),
            segment_bytes: opts.segment_bytes,
            meta: None,
        })
    }

    fn quorum(&self) -> usize {
        usize::from(self.n) / 2 + 1
    }

    /// Replicas down or wiped (not voting) at most while faults run.
    fn down_max(&self) -> usize {
        ((usize::from(self.n) - 1) / 2).max(1)
    }

    fn down_count(&self) -> usize {
        self.nodes.iter().filter(|x| !x.is_up() || x.wiped).count()
    }

    /// No faults from now on: only the seed's delays, disk speeds and
    /// client appends stay.
    pub fn calm_faults(&mut self) {
        let append = self.rates.append_per_mille;
        let delay = self.rates.delay_ticks_max;
        self.rates = FaultRates::calm();
        self.rates.append_per_mille = append;
        self.rates.delay_ticks_max = delay;
        for node in &mut self.nodes {
            node.set_disk_faults(Default::default());
        }
    }

    /// The safety phase: `ticks` ticks under this seed's faults.
    pub fn run_faulty(&mut self, ticks: u64) -> Result<(), Violation> {
        for _ in 0..ticks {
            self.tick_once(true)?;
        }
        Ok(())
    }

    /// The liveness phase: network healed, faults stopped, every replica
    /// booted; the group must converge within `ticks_max` ticks. Returns
    /// the ticks it took.
    pub fn run_liveness(&mut self, ticks_max: u64) -> Result<u64, Violation> {
        self.rates = FaultRates::calm();
        self.net.heal();
        self.purge.drop_request();
        if let Some(h) = self.hostile.as_mut() {
            h.heal();
        }
        for node in &mut self.nodes {
            node.disarm_crash();
            node.set_disk_faults(Default::default());
        }
        for r in 0..self.n {
            if !self.nodes[usize::from(r)].is_up() {
                self.boot(r, false)?;
            }
        }
        for t in 0..ticks_max {
            if self.converged() {
                self.check_final()?;
                return Ok(t);
            }
            self.tick_once(false)?;
        }
        Err(violation(
            "converges after healing",
            format!(
                "not converged within {ticks_max} ticks: {}",
                self.state_line()
            ),
        ))
    }

    pub fn fill_network_counts(&self, c: &mut Counts) {
        let n = &self.net.counts;
        c.messages_sent = n.sent;
        c.messages_lost = n.lost + n.cut + n.overflowed;
        c.messages_duplicated = n.duplicated;
        c.partitions = n.partitions;
        c.asymmetric_partitions = n.asymmetric_partitions;
        c.clogs = n.clogs;
    }

    pub fn state_line(&self) -> String {
        let mut s = String::new();
        for x in &self.nodes {
            match &x.replica {
                Some(r) => s.push_str(&format!(
                    "[R{} {:?} v{} lv{} op{} c{} durable {:?} wiped {}] ",
                    x.index,
                    r.status(),
                    r.view(),
                    r.log_view(),
                    r.op(),
                    r.commit(),
                    r.durable(),
                    x.wiped
                )),
                None => s.push_str(&format!("[R{} down] ", x.index)),
            }
        }
        s
    }

    fn tick_once(&mut self, faults: bool) -> Result<(), Violation> {
        self.tick += 1;
        let now = self.tick;
        self.net.weather(&mut self.rng, &self.rates, now);
        for r in 0..self.n {
            let node = &self.nodes[usize::from(r)];
            if !node.is_up() {
                if chance(&mut self.rng, self.rates.restart_per_mille) {
                    self.boot(r, faults)?;
                }
                continue;
            }
            if node.crash_deadline_tick.is_some_and(|d| d <= now) {
                self.crash(r, None)?;
                continue;
            }
            let may_crash =
                faults && node.crash_deadline_tick.is_none() && self.down_count() < self.down_max();
            if may_crash && chance(&mut self.rng, self.rates.crash_per_mille) {
                let ahead = self.rng.below(6);
                let tear = self.rng.below(100) < self.rates.tear_pct;
                self.nodes[usize::from(r)].arm_crash(ahead, tear, now + 30);
            }
            self.step(r, Input::Tick)?;
            if self.transfers && self.nodes[usize::from(r)].is_up() {
                self.transfer_tick(r, faults)?;
                if chance(&mut self.rng, transfer::RETENTION_PER_MILLE) {
                    self.retain(r)?;
                }
            }
        }
        if self.purges {
            self.purge_tick(faults)?;
        }
        if self.transfers {
            self.hostile_tick()?;
        }
        if chance(&mut self.rng, self.rates.append_per_mille) {
            self.client_append()?;
        }
        self.run_events()
    }

    /// Delivers due messages and runs storage ops, interleaved by the seed,
    /// each replica's disk doing a seeded number of ops this tick.
    fn run_events(&mut self) -> Result<(), Violation> {
        let now = self.tick;
        let mut io_left: Vec<u64> = (0..self.n)
            .map(|_| self.rng.below(self.io_ops_per_tick_max + 1))
            .collect();
        let mut due = self.net.due(&mut self.rng, now);
        for _ in 0..EVENTS_PER_TICK_MAX {
            let ready: Vec<u8> = (0..self.n)
                .filter(|&r| {
                    let x = &self.nodes[usize::from(r)];
                    let queued = !x.pending.is_empty() || !x.xfer.pending.is_empty();
                    io_left[usize::from(r)] > 0 && x.is_up() && queued
                })
                .collect();
            if due.is_empty() && ready.is_empty() {
                due = self.net.due(&mut self.rng, now);
                if due.is_empty() {
                    break;
                }
                continue;
            }
            if !due.is_empty() && (ready.is_empty() || self.rng.below(2) == 0) {
                if let Some(p) = due.pop() {
                    self.deliver(p)?;
                }
            } else {
                let r = ready[self.rng.below(ready.len() as u64) as usize];
                io_left[usize::from(r)] -= 1;
                let x = &self.nodes[usize::from(r)];
                let xfer_first = x.pending.is_empty() || self.rng.below(2) == 0;
                if x.xfer.pending.is_empty() || !xfer_first {
                    self.run_io(r)?;
                } else {
                    self.run_transfer_io(r)?;
                }
            }
        }
        Ok(())
    }

    fn deliver(&mut self, p: Packet) -> Result<(), Violation> {
        let limits = wire::ReplicationLimits::default();
        let decoded = match wire::Message::decode(&p.bytes, &limits) {
            Ok(d) => d,
            Err(_) if self.hostile_undecodable(p.from) => {
                // A hostile offer: the receiver charges its sender.
                if !self.nodes[usize::from(p.to)].is_up() {
                    return Ok(());
                }
                let from = p.from;
                return self
                    .step_receiver(p.to, crate::transfer::ReceiverInput::Undecodable { from });
            }
            Err(e) => {
                let detail = format!("R{} -> R{}: {e}", p.from, p.to);
                return Err(violation("messages decode", detail));
            }
        };
        let env = decoded.envelope;
        if env.cluster_id != CLUSTER_ID || env.partition_id != PARTITION_ID {
            let detail = format!("envelope {env:?}");
            return Err(violation("messages decode", detail));
        }
        let (from, msg) = match crate::transfer::route(&decoded) {
            Some(crate::transfer::Routed::Vsr { from, msg }) => (from, msg),
            Some(crate::transfer::Routed::Transfer { from, msg }) => {
                if from != p.from || !self.nodes[usize::from(p.to)].is_up() {
                    return Ok(());
                }
                return self.deliver_transfer(from, p.to, msg);
            }
            None => {
                let detail = format!("{:?} is neither VSR nor transfer", decoded.command());
                return Err(violation("messages decode", detail));
            }
        };
        if from != p.from {
            let detail = format!("sent by R{}, decoded as from R{from}", p.from);
            return Err(violation("messages decode", detail));
        }
        if !self.nodes[usize::from(p.to)].is_up() {
            return Ok(());
        }
        self.trace.line(
            self.tick,
            format_args!("R{from}->R{} {}", p.to, msg.body.name()),
        );
        self.step(p.to, Input::Message { from, msg })
    }

    pub(super) fn run_io(&mut self, r: u8) -> Result<(), Violation> {
        match self.nodes[usize::from(r)].run_io() {
            RunIo::Idle => Ok(()),
            RunIo::Crashed { op } => {
                if matches!(op, StorageOp::Purge { .. }) {
                    self.counts.purge_crashes += 1;
                }
                self.crash(r, Some(&op))
            }
            RunIo::Done { id, op, result } => {
                if let Err(e) = &result {
                    self.count_failure(r, &op, &e.reason)?;
                }
                let purged = self.nodes[usize::from(r)].purged_now.take();
                if let (StorageOp::Purge { through_op }, Some(p)) = (&op, purged) {
                    self.purge_ran(r, *through_op, p)?;
                }
                let ok = if result.is_ok() { "ok" } else { "failed" };
                self.trace.line(
                    self.tick,
                    format_args!("R{r} io {id} {} {ok}", op_name(&op)),
                );
                self.step(r, Input::IoDone { id, result })
            }
        }
    }

    /// Counts a failed storage op. Guards against: the replica asking the
    /// store for a cut it must never ask (of committed or sealed ops, past
    /// its log): the store refuses it, and that refusal is a replica bug.
    fn count_failure(&mut self, r: u8, op: &StorageOp, reason: &str) -> Result<(), Violation> {
        match op {
            StorageOp::TruncateAbove { .. } if reason.contains("tail cut refused") => {
                let detail = format!("replica {r}: {reason}");
                return Err(violation("cuts the store accepts", detail));
            }
            StorageOp::ReadBatches { .. } => self.counts.read_faults += 1,
            StorageOp::Append { .. } if reason.contains("above the commit") => {
                self.counts.uncommitted_tail_full += 1
            }
            StorageOp::Flush if reason.contains("fdatasync") => self.counts.fsync_failures += 1,
            _ => self.counts.write_failures += 1,
        }
        Ok(())
    }

    /// Power fails at `r` (during `op`, if one was in flight).
    fn crash(&mut self, r: u8, op: Option<&StorageOp>) -> Result<(), Violation> {
        self.counts.crashes += 1;
        let writing = matches!(
            op,
            Some(StorageOp::Append { .. } | StorageOp::Flush | StorageOp::PersistVsr(_))
        );
        if writing && self.nodes[usize::from(r)].crash_tears {
            self.counts.torn_crashes += 1;
        }
        self.trace.line(self.tick, format_args!("R{r} crash"));
        self.power_off(r)
    }

    fn power_off(&mut self, r: u8) -> Result<(), Violation> {
        let node = &self.nodes[usize::from(r)];
        if node.is_up() && node.store.as_ref().is_some_and(|s| s.snapshots_open() > 0) {
            self.counts.serving_crashes += 1;
        }
        self.client.in_flight.retain(|_, (to, _)| *to != r);
        self.purge_target_down(r);
        if let Some(h) = self.hostile.as_mut().filter(|h| h.replica == r) {
            h.forget_offers();
        }
        self.nodes[usize::from(r)].power_off()?;
        self.learn_lone_recovery_purge(r)?;
        self.check_purged(r)
    }

    fn boot(&mut self, r: u8, faults: bool) -> Result<(), Violation> {
        let others_whole = self
            .nodes
            .iter()
            .all(|x| x.index == r || (x.is_up() && !x.wiped));
        let seed = self.rng.next_u64();
        let cfg = replica_config(self.n, r, self.uncommitted_headroom_bytes, self.transfers);
        let wipe =
            faults && self.n > 1 && others_whole && self.rng.below(100) < self.rates.wipe_pct;
        let node = &mut self.nodes[usize::from(r)];
        if wipe {
            node.wipe(cfg, seed)?;
            self.counts.wipes += 1;
        } else {
            node.boot(cfg, seed, BOOT_COMMITTED_OPS_KEPT)?;
            self.counts.restarts += 1;
        }
        self.trace
            .line(self.tick, format_args!("R{r} boot wiped {}", node.wiped));
        self.checker.booted(r, 0);
        self.learn_lone_recovery_purge(r)?;
        self.check_purged(r)?;
        self.meta_booted(r, wipe)
    }

    fn client_append(&mut self) -> Result<(), Violation> {
        if self.client.in_flight.len() >= CLIENT_IN_FLIGHT_MAX {
            return Ok(());
        }
        let mut to = self.client.believed_primary;
        if !self.nodes[usize::from(to)].is_up() {
            to = self.rng.below(u64::from(self.n)) as u8;
        }
        let x = &self.nodes[usize::from(to)];
        if !x.is_up() || x.xfer.freezes(None) {
            return Ok(());
        }
        self.client.next_token += 1;
        let token = self.client.next_token;
        let len = 8 + self.rng.below(300) as usize;
        let batch = match self.meta.is_some() {
            false => client_batch(token, len),
            true => match self.meta_batch(to, token) {
                Some(batch) => batch,
                None => return Ok(()),
            },
        };
        let body = batch[HEADER_LEN..].to_vec();
        self.client.in_flight.insert(token, (to, body));
        self.counts.appends += 1;
        self.trace
            .line(self.tick, format_args!("client -> R{to} token {token}"));
        let batch = batch.into();
        self.step(to, Input::ClientAppend { token, batch })
    }

    /// Steps replica `r` with `input`, then handles and checks its outputs.
    fn step(&mut self, r: u8, input: Input) -> Result<(), Violation> {
        self.steps += 1;
        if self.nodes[usize::from(r)].xfer.freezes(Some(&input)) {
            return Ok(()); // a transfer replaces this replica
        }
        let Some(replica) = self.nodes[usize::from(r)].replica.as_mut() else {
            return Ok(());
        };
        let mut out = Outbox::new();
        // The replica's own assertions are checks too; its outputs up to
        // the panic are still checked first, so a sim check names the bug.
        let panicked = catch_unwind(AssertUnwindSafe(|| replica.step(input, &mut out))).err();
        let outputs: Vec<Output> = out.drain().collect();
        for o in outputs {
            self.output(r, o)?;
        }
        if let Some(p) = panicked {
            return Err(violation("replica invariants", panic_text(&p)));
        }
        let node = &mut self.nodes[usize::from(r)];
        let Some(replica) = node.replica.as_ref() else {
            return Ok(());
        };
        self.checker.after_step(r, replica)?;
        self.meta_after_step(r)?;
        let node = &mut self.nodes[usize::from(r)];
        let Some(replica) = node.replica.as_ref() else {
            return Ok(());
        };
        let d = replica.durable();
        let m = &mut node.durable_max;
        m.view = m.view.max(d.view);
        m.log_view = m.log_view.max(d.log_view);
        m.commit = m.commit.max(d.commit);
        if node.wiped && !replica.is_wiped() {
            node.wiped = false;
        }
        if replica.status() == Status::Fenced {
            // Fail-stop: the process stops; an operator restarts it.
            self.counts.fenced += 1;
            self.trace.line(self.tick, format_args!("R{r} fenced"));
            return self.power_off(r);
        }
        if self.transfers {
            self.transfer_check_needed(r)?;
        }
        Ok(())
    }

    fn output(&mut self, r: u8, output: Output) -> Result<(), Violation> {
        match output {
            Output::Send { to, msg } => self.send(r, to, msg),
            Output::Io { id, op } => {
                if let StorageOp::Append { batch, .. } = &op {
                    self.meta_appended(batch);
                }
                let node = &mut self.nodes[usize::from(r)];
                if matches!(op, StorageOp::PersistVsr(s) if !s.wiped) {
                    node.unwipe_asked = true;
                }
                if let StorageOp::Purge { through_op } = op {
                    self.purge_committed(r, through_op)?;
                }
                let node = &mut self.nodes[usize::from(r)];
                if let StorageOp::TruncateAbove { op } = op {
                    let purged = self.purge.purged_through(self.purge.generation());
                    self.checker.on_truncate(r, op, &node.model, purged)?;
                    self.counts.truncations += 1;
                }
                node.pending.push_back(Queued::Io(id, op));
                if node.pending.len() > PENDING_IO_MAX {
                    let detail =
                        format!("replica {r} has {} storage ops queued", node.pending.len());
                    return Err(violation("bounded storage queue", detail));
                }
                Ok(())
            }
            Output::Reply { token, result } => self.reply(r, token, result),
            Output::Event(e) => {
                if matches!(e, Event::Committed { .. }) {
                    self.nodes[usize::from(r)].note_commit(e.clone());
                }
                match &e {
                    Event::StatusChanged {
                        status: Status::ViewChange,
                        ..
                    } => self.counts.view_changes += 1,
                    Event::Committed { .. } => self.counts.commits += 1,
                    Event::TransferNeeded { trigger, .. } if self.transfers => {
                        self.transfer_wanted(r, *trigger)
                    }
                    _ => {}
                }
                if !matches!(e, Event::Committed { .. }) {
                    self.trace.line(self.tick, format_args!("R{r} {e:?}"));
                }
                Ok(())
            }
        }
    }

    fn send(&mut self, r: u8, to: u8, msg: Message) -> Result<(), Violation> {
        self.checker.on_send(r, &msg, &self.nodes[usize::from(r)])?;
        self.check_sends_unpurged(r, &msg)?;
        if matches!(msg.body, Body::RequestPrepares(_)) {
            self.counts.repairs += 1;
        }
        let frame = msg
            .to_wire(CLUSTER_ID, PARTITION_ID, r)
            .map_err(|e| violation("messages encode", format!("R{r} {}: {e}", msg.body.name())))?;
        let mut bytes = Vec::new();
        frame
            .encode(&mut bytes)
            .map_err(|e| violation("messages encode", format!("R{r} {}: {e}", msg.body.name())))?;
        self.trace.bytes(&bytes);
        let now = self.tick;
        self.net
            .send(&mut self.rng, &self.rates, now, (r, to, bytes));
        Ok(())
    }

    fn reply(
        &mut self,
        r: u8,
        token: Token,
        result: Result<crate::vsr::Appended, AppendError>,
    ) -> Result<(), Violation> {
        if self.purge.is_request(token) {
            self.purge_replied(r, result);
            return Ok(());
        }
        let sent = self.client.in_flight.remove(&token);
        match result {
            Ok(a) => {
                self.counts.acks += 1;
                let checksum = self.nodes[usize::from(r)]
                    .replica
                    .as_ref()
                    .and_then(|x| x.checksum_at(a.op));
                let Some(checksum) = checksum else {
                    let detail = format!("replica {r} acked op {} it does not hold", a.op);
                    return Err(violation("acked op durable on a quorum", detail));
                };
                let ack = Ack {
                    op: a.op,
                    checksum,
                    token,
                };
                let stores: Vec<&dyn DurableView> =
                    self.nodes.iter().map(|x| x as &dyn DurableView).collect();
                let quorum = self.quorum();
                self.checker.on_ack(r, ack, &stores, quorum)?;
                if let Some((_, body)) = sent {
                    self.client.acked_bodies.insert(token, body);
                }
            }
            Err(AppendError::NotPrimary { primary, .. }) => {
                self.client.believed_primary = primary;
            }
            Err(AppendError::OutcomeUnknown { .. }) => self.counts.outcome_unknown += 1,
            Err(_) => {}
        }
        Ok(())
    }

    /// One normal primary, every replica normal in its view, committed to
    /// its last op (and to every acknowledged op) and durable that far.
    fn converged(&self) -> bool {
        let primary = self.nodes.iter().find_map(|x| {
            let r = x.replica.as_ref()?;
            (r.status() == Status::Normal && r.is_primary()).then_some(r)
        });
        let Some(p) = primary else { return false };
        let acked_max = self.checker.acked.iter().map(|a| a.op).max().unwrap_or(0);
        let head = p.checksum_at(p.op());
        // The store, not only the journal, holds the head durably and no
        // storage op is pending (a failing one could still fence).
        p.commit() >= acked_max
            && self.purges_landed()
            && self.nodes.iter().all(|x| {
                let normal = x.replica.as_ref().is_some_and(|r| {
                    r.status() == Status::Normal && r.view() == p.view() && r.commit() == p.op()
                });
                let stored = p.op() == 0 || head.is_some_and(|c| x.holds_durably(p.op(), c));
                normal && stored && x.pending.is_empty()
            })
    }

    /// Guards against: committed prefixes differing between replicas, and
    /// an acknowledged batch unreadable, or not the producer's bytes, on
    /// any replica. Reads every store back, up to the commit.
    fn check_final(&mut self) -> Result<(), Violation> {
        let prefix = self
            .nodes
            .iter()
            .filter_map(|x| {
                let r = x.replica.as_ref()?;
                Some(r.commit().min(x.store.as_ref()?.durable().last_op))
            })
            .min()
            .unwrap_or(0);
        // Ops below some store's log start were retired there (and may
        // be on no store any more): compare what every store holds.
        let mut lo = 1;
        for i in 0..self.nodes.len() {
            self.check_purged(i as u8)?;
            if self.nodes[i].is_up() {
                lo = lo.max(self.nodes[i].op_held_min());
            }
        }
        let mut first: Option<Vec<Vec<u8>>> = None;
        for i in 0..self.nodes.len() {
            if !self.nodes[i].is_up() {
                continue;
            }
            let ops = self.nodes[i].read_ops(lo, prefix)?;
            match &first {
                None => first = Some(ops),
                Some(f) if *f != ops => {
                    let at = f.iter().zip(&ops).position(|(a, b)| a != b).unwrap_or(0) as u64 + lo;
                    let detail =
                        format!("replica {i} differs from the first up replica at op {at}");
                    return Err(violation("committed prefixes byte-identical", detail));
                }
                Some(_) => {}
            }
        }
        let ops = first.unwrap_or_default();
        let mut retired = 0;
        for ack in &self.checker.acked {
            if ack.op < lo {
                retired += 1;
                continue;
            }
            let Some(bytes) = ops.get((ack.op - lo) as usize) else {
                let detail = format!("acked op {} beyond the committed prefix", ack.op);
                return Err(violation("acked ops readable everywhere", detail));
            };
            let header = BatchHeader::decode(bytes).ok();
            let body = self.client.acked_bodies.get(&ack.token);
            let same = header.is_some_and(|h| h.header_checksum == ack.checksum)
                && body.is_some_and(|b| bytes.get(HEADER_LEN..) == Some(&b[..]));
            if !same {
                let detail = format!("acked op {} (token {}) differs on disk", ack.op, ack.token);
                return Err(violation("acked ops readable everywhere", detail));
            }
        }
        self.counts.ops_read_back += ops.len() as u64;
        self.counts.acks_retired += retired;
        self.meta_check_final()
    }
}

/// The client's batch for `token`: one record, `len` bytes of value.
fn client_batch(token: Token, len: usize) -> Vec<u8> {
    let mut b = BatchBuilder::new(PARTITION_ID);
    let value: Vec<u8> = (0..len).map(|i| (token as usize + i) as u8).collect();
    let key = token.to_le_bytes();
    let record = Record {
        key: &key,
        headers: &[],
        value: &value,
        timestamp_ms: token,
    };
    // A single small record always fits a batch; the primary restamps it.
    match b.push(&record).and_then(|()| b.finish(&Stamp::default())) {
        Ok(batch) => batch,
        Err(e) => unreachable!("a {len}-byte record fits a batch: {e}"),
    }
}

fn op_name(op: &StorageOp) -> &'static str {
    match op {
        StorageOp::Append { .. } => "append",
        StorageOp::Flush => "flush",
        StorageOp::PersistVsr(_) => "persist_vsr",
        StorageOp::TruncateAbove { .. } => "truncate_above",
        StorageOp::ReadBatches { .. } => "read_batches",
        StorageOp::Purge { .. } => "purge",
    }
}

fn panic_text(p: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "replica panicked".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster() -> Cluster {
        let mut opts = SimOptions::new(5);
        opts.faults = false;
        let mut c = Cluster::new(&opts, 3).expect("cluster");
        c.calm_faults();
        c
    }

    /// Guards against: the client's in-flight appends growing without bound.
    #[test]
    fn client_waits_at_its_in_flight_bound() {
        let mut c = cluster();
        for token in 0..CLIENT_IN_FLIGHT_MAX as u64 {
            c.client.in_flight.insert(1_000 + token, (0, Vec::new()));
        }
        c.client_append().expect("no violation");
        assert_eq!(c.counts.appends, 0, "appended past the bound");
        c.client.in_flight.clear();
        c.client_append().expect("no violation");
        assert_eq!(c.counts.appends, 1);
    }

    /// Guards against: a replica queueing storage ops without bound going
    /// unnoticed: past PENDING_IO_MAX the run fails with its check.
    #[test]
    fn storage_queue_past_its_bound_is_a_violation() {
        let mut c = cluster();
        for id in 0..PENDING_IO_MAX as u64 {
            c.nodes[0]
                .pending
                .push_back(Queued::Io(id, StorageOp::Flush));
        }
        let v = c
            .output(
                0,
                Output::Io {
                    id: 1 << 40,
                    op: StorageOp::Flush,
                },
            )
            .expect_err("over the bound");
        assert_eq!(v.check, "bounded storage queue");
    }
}
