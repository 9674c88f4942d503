//! State transfer in the simulator (DESIGN.md section 7): retention
//! retires committed segments, a replica whose repair peer answers
//! RangeEvicted runs the transfer `Receiver` against its peers' `Server`s
//! over the sim network; their storage operations run through
//! `transfer::io` on the node's disk (crashes hit them like any other).
//! The replica keeps being stepped while it waits for an offer (it still
//! votes, see `vsr::Replica::is_transferring`): its vote may be the one a
//! view change needs before anyone is Normal to offer a snapshot. It is
//! frozen only from the offer taken to the install's end: its storage ops
//! drain, the install runs, its commit marking the superblock wiped in
//! the same write; a failed attempt steps it again on its old log, an
//! install reboots it from its disk on the installed frontier, wiped until
//! its log is whole (not marked if the install covers the log it had:
//! `vsr` module docs). On with
//! [`super::SimOptions::transfers`].

use std::collections::VecDeque;

use crate::replica_io;
use crate::transfer::{
    self, io::Installs, Budgets, Event as XEvent, Frontier, IoId as XIoId, Local, Message as XMsg,
    Outbox as XOutbox, Output as XOutput, Receiver, ReceiverConfig, ReceiverInput, Server,
    ServerConfig, ServerInput, ServingState, Stale, TransferOp, Trigger,
};
use crate::vsr::Replica;
use ringlog_storage::store::InstallBudget;

use super::*;

/// Installs a node runs at once, and the disk bytes they may reserve.
const INSTALLS_MAX: usize = 1;
const INSTALL_BUDGET_BYTES: u64 = 64 << 20;
/// A tick of an install in progress arms a crash with this chance.
const INSTALL_CRASH_PER_MILLE: u64 = 150;
/// Retention runs on an up node with this chance per tick.
pub const RETENTION_PER_MILLE: u64 = 30;

/// One node's transfer machines and their queued storage operations.
pub struct NodeXfer {
    /// Some while a transfer runs.
    pub receiver: Option<Receiver>,
    /// A transfer is wanted, for this trigger: the receiver starts at the
    /// next tick.
    pub wanted: Option<Trigger>,
    /// An offer was taken and its BeginInstall queued: the replica gets
    /// only its storage completions until its queue drains and the
    /// install begins.
    pub install_wanted: bool,
    /// The wipe mark the starting install's commit writes (see
    /// `Installs::mark_for_commit`).
    pub commit_mark: Option<bool>,
    pub server: Server,
    pub installs: Installs,
    /// (for the receiver, id, op), in emission order.
    pub pending: VecDeque<(bool, XIoId, TransferOp)>,
    /// An install was begun and neither committed nor aborted.
    pub installing: bool,
}

impl NodeXfer {
    pub fn new() -> Self {
        Self {
            receiver: None,
            wanted: None,
            install_wanted: false,
            commit_mark: None,
            server: Server::new(ServerConfig::default()),
            installs: Installs::new(INSTALLS_MAX, InstallBudget::new(INSTALL_BUDGET_BYTES)),
            pending: VecDeque::new(),
            installing: false,
        }
    }

    /// A transfer is wanted or running (the replica may still be stepped).
    pub fn running(&self) -> bool {
        self.wanted.is_some()
            || self.install_wanted
            || self.installing
            || self.receiver.as_ref().is_some_and(Receiver::is_active)
    }

    /// The replica is not stepped with `input`: an install replaces its
    /// log. Before it begins, its storage completions still reach it (a
    /// replica that missed one would wait on it forever after a failed
    /// attempt).
    pub fn freezes(&self, input: Option<&Input>) -> bool {
        let completion = matches!(input, Some(Input::IoDone { .. }));
        self.installing || (self.install_wanted && !completion)
    }
}

impl Default for NodeXfer {
    fn default() -> Self {
        Self::new()
    }
}

/// The store's chunk size, and no artifact longer than a segment (the
/// store refuses those anyway; the receiver refuses them before staging).
fn budgets(segment_bytes: u64) -> Budgets {
    Budgets {
        chunk_size_bytes: 4096,
        artifact_bytes_max: segment_bytes,
        ..Budgets::default()
    }
}

impl Cluster {
    /// The replica asked for a transfer (once per running transfer).
    pub(super) fn transfer_wanted(&mut self, r: u8, trigger: Trigger) {
        let node = &mut self.nodes[usize::from(r)];
        if !node.xfer.receiver.as_ref().is_some_and(Receiver::is_active) {
            node.xfer.wanted = Some(trigger);
        }
    }

    /// After a step of `r`'s replica: a replica whose log grew again (a
    /// peer still held the ops) needs no transfer; its receiver is
    /// cancelled (aborting what it staged) unless its install began.
    pub(super) fn transfer_check_needed(&mut self, r: u8) -> Result<(), Violation> {
        let node = &mut self.nodes[usize::from(r)];
        let transferring = node.replica.as_ref().is_some_and(Replica::is_transferring);
        let active = node.xfer.receiver.as_ref().is_some_and(Receiver::is_active);
        if transferring || node.xfer.install_wanted || node.xfer.installing {
            return Ok(());
        }
        node.xfer.wanted = None;
        if !active {
            return Ok(());
        }
        self.trace
            .line(self.tick, format_args!("R{r} transfer cancelled"));
        self.step_receiver(r, ReceiverInput::Cancel)
    }

    /// Starts a wanted transfer: the receiver asks a peer. The replica
    /// keeps running (see the module docs).
    pub(super) fn transfer_start(&mut self, r: u8) -> Result<(), Violation> {
        let n = self.n;
        let seed = self.rng.next_u64();
        let node = &mut self.nodes[usize::from(r)];
        let Some(trigger) = node.xfer.wanted else {
            return Ok(());
        };
        if node.xfer.receiver.as_ref().is_some_and(Receiver::is_active) {
            return Ok(());
        }
        let Some(store) = node.store.as_mut() else {
            return Ok(());
        };
        let sb = store.superblock();
        let end = store.durable();
        let local = Local {
            partition_id: PARTITION_ID,
            view: sb.vsr.view,
            commit: sb.vsr.commit,
            purge_generation: sb.purge_generation,
            frontier: Frontier {
                next_offset: end.next_offset,
                last_op: end.last_op,
                last_checksum: end.last_checksum,
            },
        };
        let cfg = ReceiverConfig {
            replica_count: n,
            replica: r,
            budgets: budgets(self.segment_bytes),
        };
        if node.xfer.receiver.is_none() {
            // One receiver per boot: a cancelled one starts again, its
            // budgets' history kept.
            let receiver = Receiver::new(cfg, seed)
                .map_err(|e| violation("transfer budgets", e.0.to_string()))?;
            node.xfer.receiver = Some(receiver);
        }
        node.xfer.wanted = None;
        self.counts.transfers_started += 1;
        self.counts.transfers_by_trigger[trigger.index()] += 1;
        self.trace.line(
            self.tick,
            format_args!("R{r} transfer start {}", trigger.label()),
        );
        self.step_receiver(r, ReceiverInput::Start { trigger, local })
    }

    pub(super) fn transfer_tick(&mut self, r: u8, faults: bool) -> Result<(), Violation> {
        self.transfer_start(r)?;
        let x = &self.nodes[usize::from(r)];
        let may_crash = faults
            && x.xfer.installing
            && x.crash_deadline_tick.is_none()
            && self.down_count() < self.down_max();
        if may_crash && chance(&mut self.rng, INSTALL_CRASH_PER_MILLE) {
            // Aim crashes at installs: their I/O is a small part of a run.
            let ahead = self.rng.below(4);
            let tear = self.rng.below(100) < self.rates.tear_pct;
            let deadline = self.tick + 30;
            self.nodes[usize::from(r)].arm_crash(ahead, tear, deadline);
        }
        if !self.nodes[usize::from(r)].is_up() {
            return Ok(());
        }
        self.step_server(r, ServerInput::Tick)?;
        self.step_receiver(r, ReceiverInput::Tick)
    }

    /// A decoded transfer message for `to`.
    pub(super) fn deliver_transfer(
        &mut self,
        from: u8,
        to: u8,
        msg: XMsg,
    ) -> Result<(), Violation> {
        if msg.for_receiver() {
            return self.step_receiver(to, ReceiverInput::Message { from, msg });
        }
        if let Some(h) = self.hostile.as_mut().filter(|h| h.replica == to) {
            h.asked(from, &msg);
        }
        let node = &self.nodes[usize::from(to)];
        let state = match node.replica.as_ref() {
            Some(rep) if !node.xfer.freezes(None) => ServingState {
                available: rep.status() != Status::Fenced,
                normal: rep.status() == Status::Normal && !rep.is_wiped(),
                commit: rep.commit(),
                commit_max: rep.commit(),
            },
            _ => ServingState {
                available: false,
                normal: false,
                commit: 0,
                commit_max: 0,
            },
        };
        self.step_server(to, ServerInput::Message { from, msg, state })
    }

    fn step_server(&mut self, r: u8, input: ServerInput) -> Result<(), Violation> {
        let mut out = XOutbox::new();
        self.nodes[usize::from(r)].xfer.server.step(input, &mut out);
        self.transfer_outputs(r, false, out)
    }

    pub(super) fn step_receiver(&mut self, r: u8, input: ReceiverInput) -> Result<(), Violation> {
        let mut out = XOutbox::new();
        let Some(rx) = self.nodes[usize::from(r)].xfer.receiver.as_mut() else {
            return Ok(());
        };
        rx.step(input, &mut out);
        self.transfer_outputs(r, true, out)
    }

    fn transfer_outputs(&mut self, r: u8, rx: bool, mut out: XOutbox) -> Result<(), Violation> {
        let outputs: Vec<XOutput> = out.drain().collect();
        for o in outputs {
            match o {
                XOutput::Send { to, msg } => self.send_transfer(r, to, &msg)?,
                XOutput::Io { id, op } => {
                    if let TransferOp::BeginInstall { manifest } = &op {
                        self.check_offer_taken(r, manifest.purge_generation)?;
                        // Frozen from here: clients go elsewhere.
                        self.nodes[usize::from(r)].xfer.install_wanted = true;
                        self.client.in_flight.retain(|_, (to, _)| *to != r);
                    }
                    let node = &mut self.nodes[usize::from(r)];
                    node.xfer.pending.push_back((rx, id, op));
                    if node.xfer.pending.len() > PENDING_IO_MAX {
                        let detail =
                            format!("replica {r}: {} transfer ops", node.xfer.pending.len());
                        return Err(violation("bounded storage queue", detail));
                    }
                }
                XOutput::Event(e) => self.transfer_event(r, e)?,
            }
        }
        Ok(())
    }

    pub(super) fn send_transfer(&mut self, r: u8, to: u8, msg: &XMsg) -> Result<(), Violation> {
        let view = self.nodes[usize::from(r)]
            .store
            .as_ref()
            .map_or(0, |s| s.superblock().vsr.view);
        let bytes = self.transfer_frame(r, to, msg, view)?;
        self.counts.transfer_messages += 1;
        let now = self.tick;
        self.net
            .send(&mut self.rng, &self.rates, now, (r, to, bytes));
        Ok(())
    }

    fn transfer_event(&mut self, r: u8, e: XEvent) -> Result<(), Violation> {
        match &e {
            XEvent::OfferTaken { peer, snapshot_id } => {
                self.check_not_a_lie(r, *snapshot_id, *peer)?;
                self.counts.transfer_offers_taken += 1
            }
            XEvent::Quarantined { .. } => self.counts.transfer_quarantines += 1,
            XEvent::Dropped {
                what: "charged", ..
            } => self.counts.transfer_charges += 1,
            XEvent::OfferRefused { why, .. } => {
                self.counts.transfer_refusals += 1;
                if matches!(why, Stale::PurgeGeneration { .. }) {
                    self.counts.stale_generation_refusals += 1;
                }
            }
            XEvent::Rotated { .. } => self.counts.transfer_rotations += 1,
            XEvent::AttemptFailed { .. } => self.counts.transfer_attempts_failed += 1,
            _ => {}
        }
        if !matches!(e, XEvent::Dropped { .. }) {
            self.trace
                .line(self.tick, format_args!("R{r} transfer {e:?}"));
        }
        if let XEvent::Installed { .. } = e {
            return self.installed(r);
        }
        Ok(())
    }

    /// The install committed: the installed ops must be committed ones;
    /// the replica reboots from its disk as the commit marked it (wiped, it
    /// repairs onto them; a voter whose log the install covers votes).
    fn installed(&mut self, r: u8) -> Result<(), Violation> {
        self.counts.transfer_installs += 1;
        let seed = self.rng.next_u64();
        let cfg = replica_config(self.n, r, self.uncommitted_headroom_bytes, true);
        let node = &mut self.nodes[usize::from(r)];
        node.xfer.receiver = None;
        node.xfer.installing = false;
        let mark = node.xfer.commit_mark.take();
        let Some(store) = node.store.as_mut() else {
            return Err(violation("store after an install", "no store".into()));
        };
        // Booting reads the store like recovery does: with faults off.
        node.io
            .set_faults(ringlog_storage::io::sim::Faults::default());
        let all = replica_io::recover(store, &mut node.io, u64::MAX)
            .map_err(|e| violation("store after an install", e.reason))?;
        node.recovery_purges += u64::from(all.purged);
        let committed = self.checker.committed();
        let mut model: BTreeMap<u64, u64> = BTreeMap::new();
        if all.base.op > 0 {
            model.insert(all.base.op, all.base.checksum);
        }
        model.extend(all.headers.iter().map(|h| (h.vsr_op, h.header_checksum)));
        for (op, c) in &model {
            if committed.get(op).is_some_and(|k| k != c) {
                let detail = format!(
                    "replica {r} installed op {op} ({c:#x}), committed {:?}",
                    committed.get(op)
                );
                return Err(violation(
                    "committed prefixes identical after an install",
                    detail,
                ));
            }
        }
        if Some(all.durable.wiped) != mark {
            let detail = format!(
                "replica {r}: superblock {:?} after an install marked {mark:?}",
                all.durable
            );
            return Err(violation(
                "an install's commit writes its wipe mark",
                detail,
            ));
        }
        node.model = model;
        if all.durable.wiped {
            node.wiped = true;
            node.unwipe_asked = false;
        }
        let rec = replica_io::recover(
            store,
            &mut node.io,
            replica_io::INSTALLED_COMMITTED_OPS_KEPT,
        )
        .map_err(|e| violation("replica boots from its store", e.reason))?;
        node.io.set_faults(node.disk_faults.clone());
        let replica = Replica::restart(cfg, seed, rec.durable, rec.base, &rec.headers)
            .map_err(|e| violation("replica config", e.to_string()))?;
        node.replica = Some(replica);
        self.checker.booted(r, 0);
        self.check_purged(r)
    }

    /// Runs `r`'s oldest queued transfer op; true if there was one.
    pub(super) fn run_transfer_io(&mut self, r: u8) -> Result<bool, Violation> {
        let now_ms = self.tick;
        let node = &self.nodes[usize::from(r)];
        let begin = matches!(
            node.xfer.pending.front(),
            Some((_, _, TransferOp::BeginInstall { .. }))
        );
        if begin && !node.pending.is_empty() {
            // The frozen replica's queued ops drain first.
            self.run_io(r)?;
            return Ok(true);
        }
        let node = &mut self.nodes[usize::from(r)];
        let Some(store) = node.store.as_mut() else {
            return Ok(false);
        };
        let Some((rx, id, op)) = node.xfer.pending.pop_front() else {
            return Ok(false);
        };
        if matches!(op, TransferOp::CommitInstall) {
            // Marked in the commit's own write, as the server's
            // `transfer_host` does: a crash before it reopens a voter's log.
            let replica = node.replica.as_ref();
            let voter_op = replica.filter(|x| !x.is_wiped()).map(Replica::op);
            let pid = store.partition_id();
            node.xfer.commit_mark = node.xfer.installs.mark_for_commit(pid, voter_op);
        }
        if matches!(op, TransferOp::BeginInstall { .. }) {
            node.accept_committed = self.checker.committed().clone();
        }
        let result =
            transfer::io::execute(store, &mut node.io, &mut node.xfer.installs, &op, now_ms);
        if node.io.is_crashed() {
            if node.xfer.installing || matches!(op, TransferOp::BeginInstall { .. }) {
                self.counts.transfer_install_crashes += 1;
            }
            self.trace
                .line(self.tick, format_args!("R{r} crash in {}", op.name()));
            return self.crash(r, None).map(|()| true);
        }
        if store.fenced().is_some() {
            // A failed write fenced the store; the frozen replica never
            // sees it, so the process stops here (fail-stop, as a fenced
            // replica does) and reboots from its disk, wiped.
            self.counts.fenced += 1;
            self.trace
                .line(self.tick, format_args!("R{r} fenced in {}", op.name()));
            return self.power_off(r).map(|()| true);
        }
        match (&op, &result) {
            (TransferOp::BeginInstall { .. }, Ok(_)) => node.xfer.installing = true,
            (TransferOp::CommitInstall | TransferOp::AbortInstall, _) => {
                node.xfer.installing = false
            }
            _ => {}
        }
        if matches!(op, TransferOp::BeginInstall { .. }) {
            node.xfer.install_wanted = false;
        }
        // An install that did not commit left the old log in place: the
        // replica resumes with it (an install that committed ends in
        // `installed`, a failed commit point fenced above).
        let failed = match op {
            TransferOp::BeginInstall { .. } | TransferOp::CommitInstall => result.is_err(),
            TransferOp::AbortInstall => true,
            _ => false,
        };
        if failed {
            node.xfer.commit_mark = None;
        }
        if rx {
            self.step_receiver(r, ReceiverInput::IoDone { id, result })?;
        } else {
            self.step_server(r, ServerInput::IoDone { id, result })?;
        }
        Ok(true)
    }

    /// Retention on `r`'s store (committed, sealed segments only).
    pub(super) fn retain(&mut self, r: u8) -> Result<(), Violation> {
        let now_ms = self.tick;
        let node = &mut self.nodes[usize::from(r)];
        let Some(store) = node.store.as_mut() else {
            return Ok(());
        };
        let result = store.apply_retention(&mut node.io, now_ms);
        if node.io.is_crashed() {
            return self.crash(r, None);
        }
        match result {
            Ok(o) => self.counts.segments_retired += o.segments_removed as u64,
            Err(_) => self.counts.write_failures += 1,
        }
        if store.fenced().is_some() {
            // Fail-stop, as after a failed transfer write: the replica's
            // own ops would fence it only at its next write, and until
            // then it served from a store that refuses every read (sim
            // seed 32003147: 'acked ops readable everywhere').
            self.counts.fenced += 1;
            self.trace
                .line(self.tick, format_args!("R{r} fenced in retention"));
            return self.power_off(r);
        }
        Ok(())
    }
}
