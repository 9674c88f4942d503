//! Operator purges in the simulator (DESIGN.md sections 4 and 7): the
//! operator purges the partition on every replica; each store drops every
//! batch, keeps its chain point (offsets and ops are never reused) and
//! bumps its durable purge generation. On with [`super::SimOptions::purges`].
//!
//! The replica has no purge input: the host purges its store while the
//! replica is quiescent (Normal, its log committed to its end, no storage
//! op queued) and boots it again from the purged store, as after an
//! install, so no journal keeps a purged op. A purge of generation `g`
//! happens at op `P_g`: the client pauses, and once every up replica that
//! is not transferring is quiescent at one op, they all purge there.
//! Replicas down, transferring or serving a snapshot then (a leased
//! snapshot pins the store: the purge is refused) are purged later, once
//! they committed `P_g` (as a purge replicated in the log would be) and are
//! quiescent, or, transferring, between two attempts: the replica reboots
//! from the purged store and its transfer, if still needed, restarts from
//! it, so offers from replicas not purged yet are stale (a lower purge
//! generation) and must be refused. A replica
//! whose log ends below `P_g` is not purged: it reaches the new generation
//! by installing from a purged peer, or is purged once it commits `P_g`.
//!
//! Guards against: purged data returning (a store at purge generation
//! `g` holding an op at or below `P_g`, after a purge, an install or a
//! reboot; a replica sending one in a Prepare or a repair answer), and a
//! receiver taking an offer below its store's purge generation.

use ringlog_storage::store::{StoreError, TransferError};

use crate::replica_io;
use crate::vsr::Replica;

use super::*;

/// Per tick of the safety phase with no purge waiting: the operator asks.
pub const PURGE_PER_MILLE: u64 = 3;
/// Ticks a requested purge waits for a quiescent group (the client
/// paused meanwhile) before the operator gives it up.
const PURGE_WAIT_TICKS_MAX: u64 = 60;

/// The partition's purges so far.
#[derive(Debug, Default)]
pub struct Purges {
    /// `points[g - 1]` = `P_g`: the op purge generation `g` purged through.
    points: Vec<u64>,
    /// Since this tick the operator purges: the client waits until every
    /// up replica not transferring is purged; true once the point is taken.
    requested: Option<(u64, bool)>,
}

impl Purges {
    /// The partition's purge generation (every store reaches it).
    pub fn generation(&self) -> u64 {
        self.points.len() as u64
    }

    /// The highest op purged by generation `g` or below (0: none).
    pub fn purged_through(&self, g: u64) -> u64 {
        let g = usize::try_from(g)
            .unwrap_or(usize::MAX)
            .min(self.points.len());
        self.points[..g].iter().copied().max().unwrap_or(0)
    }

    /// The client waits while the operator purges.
    pub fn pauses_client(&self) -> bool {
        self.requested.is_some()
    }

    /// The liveness phase asks for no purge; one still waiting is dropped
    /// (replicas it missed are still purged, as any behind).
    pub fn drop_request(&mut self) {
        self.requested = None;
    }
}

impl Cluster {
    /// One tick of the operator: maybe ask for a purge, run a waiting one
    /// once the group is quiet, and purge the replicas it missed.
    pub(super) fn purge_tick(&mut self, faults: bool) -> Result<(), Violation> {
        let now = self.tick;
        if faults && self.purge.requested.is_none() && chance(&mut self.rng, PURGE_PER_MILLE) {
            self.purge.requested = Some((now, false));
            self.trace.line(now, "operator purge requested");
        }
        if let Some((since, taken)) = self.purge.requested {
            let g = self.purge.generation();
            if !taken {
                if let Some(op) = self.quiescent_op() {
                    self.purge.requested = Some((since, true));
                    self.purge.points.push(op);
                    self.counts.purges += 1;
                    self.trace.line(
                        now,
                        format_args!("operator purge {} through op {op}", g + 1),
                    );
                }
            } else if !self
                .nodes
                .iter()
                .any(|x| x.is_up() && !x.xfer.running() && behind(x, g))
            {
                self.purge.requested = None;
            }
            if now - since > PURGE_WAIT_TICKS_MAX && self.purge.requested.is_some() {
                self.purge.requested = None;
                if !taken {
                    self.counts.purges_abandoned += 1;
                    self.trace.line(now, "operator purge given up: never quiet");
                }
            }
        }
        // At most one store purge per tick (see `purge_ready`).
        match (0..self.n).find(|&r| self.purge_ready(r).is_some()) {
            Some(r) => self.purge_if_ready(r),
            None => Ok(()),
        }
    }

    /// Whether replica `r` may be purged now, and whether it transfers.
    fn purge_ready(&self, r: u8) -> Option<bool> {
        let x = &self.nodes[usize::from(r)];
        let replica = x.replica.as_ref()?;
        if !behind(x, self.purge.generation())
            || !x.pending.is_empty()
            || !x.xfer.pending.is_empty()
            || x.xfer.installing
        {
            return None;
        }
        let point = self.purge.purged_through(self.purge.generation());
        if x.xfer.running() {
            // Between two attempts only (nothing staged, nothing asked of
            // storage), and only past the purge point: a replica whose log
            // ends below it would repair the purged ops back from a replica
            // not purged yet if the transfer ends (a crash) before an install.
            let rx = x.xfer.receiver.as_ref()?;
            let past = x.store.as_ref()?.superblock().vsr.commit >= point;
            let between = matches!(rx.phase_name(), "asking" | "waiting");
            return (past && between).then_some(true);
        }
        let quiet = replica.status() == Status::Normal
            && replica.op() == replica.commit()
            && replica.commit() >= point;
        // One replica reboots at a time, the rest of the group Normal (all
        // rebooting at once would leave no primary to answer them), and the
        // primary after its backups (its reboot costs a view change).
        let others = self
            .nodes
            .iter()
            .filter(|y| y.index != r && !y.xfer.running());
        let mut others_up = others.filter_map(|y| y.replica.as_ref().map(|p| (y, p)));
        let healthy = others_up.all(|(y, p)| {
            let purged = !behind(y, self.purge.generation());
            p.status() == Status::Normal && (purged || !replica.is_primary())
        });
        (quiet && healthy).then_some(false)
    }

    /// The op every up replica not transferring is quiescent at (a quorum
    /// of them at least), if there is one.
    fn quiescent_op(&self) -> Option<u64> {
        let mut op = None;
        let mut quiet = 0;
        for x in &self.nodes {
            let Some(replica) = x.replica.as_ref() else {
                continue;
            };
            if x.xfer.running() {
                continue;
            }
            let still = replica.status() == Status::Normal
                && replica.op() == replica.commit()
                && x.pending.is_empty()
                && x.xfer.pending.is_empty();
            if !still || op.is_some_and(|o| o != replica.op()) {
                return None;
            }
            op = Some(replica.op());
            quiet += 1;
        }
        let point = self.purge.purged_through(self.purge.generation());
        op.filter(|&o| quiet >= self.quorum() && o >= point)
    }

    /// Purges `r`'s store up to the partition's purge generation if it is
    /// ready; a refusal (a leased snapshot pins it) waits for a later tick.
    fn purge_if_ready(&mut self, r: u8) -> Result<(), Violation> {
        let Some(transferring) = self.purge_ready(r) else {
            return Ok(());
        };
        let target = self.purge.generation();
        let node = &mut self.nodes[usize::from(r)];
        let Some(store) = node.store.as_mut() else {
            return Ok(());
        };
        while store.superblock().purge_generation < target {
            let result = store.purge(&mut node.io);
            if node.io.is_crashed() {
                self.counts.purge_crashes += 1;
                self.trace
                    .line(self.tick, format_args!("R{r} crash in purge"));
                return self.crash(r, None);
            }
            match result {
                Ok(()) => self.counts.replica_purges += 1,
                Err(StoreError::Transfer {
                    source: TransferError::Pinned { .. },
                    ..
                }) => {
                    self.counts.purges_pinned += 1;
                    return Ok(());
                }
                Err(e) => {
                    self.counts.write_failures += 1;
                    self.trace
                        .line(self.tick, format_args!("R{r} purge failed: {e}"));
                    if store.fenced().is_some() {
                        // Fail-stop, as for any fenced store.
                        self.counts.fenced += 1;
                        return self.power_off(r);
                    }
                    return Ok(());
                }
            }
        }
        if transferring {
            self.counts.purges_transferring += 1;
        }
        self.trace.line(
            self.tick,
            format_args!("R{r} purged to generation {target} (transferring {transferring})"),
        );
        self.purged(r, transferring)
    }

    /// `r`'s store purged: the model forgets its batches, and the replica
    /// boots from the purged store (a transferring one's transfer is
    /// dropped: its repair asks for one again if it still needs it).
    fn purged(&mut self, r: u8, transferring: bool) -> Result<(), Violation> {
        let seed = self.rng.next_u64();
        let cfg = replica_config(self.n, r, self.uncommitted_headroom_bytes);
        let node = &mut self.nodes[usize::from(r)];
        let Some(store) = node.store.as_mut() else {
            return Err(violation("store after a purge", "no store".into()));
        };
        // Booting reads the store like recovery does: with faults off.
        node.io
            .set_faults(ringlog_storage::io::sim::Faults::default());
        let rec = replica_io::recover(store, &mut node.io, BOOT_COMMITTED_OPS_KEPT)
            .map_err(|e| violation("replica boots from its store", e.reason))?;
        node.io.set_faults(node.disk_faults.clone());
        node.model.clear();
        if rec.base.op > 0 {
            node.model.insert(rec.base.op, rec.base.checksum);
        }
        node.model
            .extend(rec.headers.iter().map(|h| (h.vsr_op, h.header_checksum)));
        if transferring {
            // The old attempt's offers are stale now. The replica (stepped
            // while it waits for an offer) reboots like the others; its
            // repair asks for a transfer again if it still needs one, and
            // a new receiver asks with the purged store's state.
            node.xfer.receiver = None;
            node.xfer.wanted = false;
        }
        let replica = Replica::restart(cfg, seed, rec.durable, rec.base, &rec.headers)
            .map_err(|e| violation("replica config", e.to_string()))?;
        node.replica = Some(replica);
        node.wiped = rec.durable.wiped;
        self.client.in_flight.retain(|_, (to, _)| *to != r);
        self.checker.booted(r, 0);
        self.check_purged(r)
    }

    /// Guards against: purged data returning. A store at purge generation
    /// `g` holds no op at or below `P_g`.
    pub(super) fn check_purged(&mut self, r: u8) -> Result<(), Violation> {
        let node = &mut self.nodes[usize::from(r)];
        let Some(g) = node.store.as_ref().map(|s| s.superblock().purge_generation) else {
            return Ok(());
        };
        let point = self.purge.purged_through(g);
        if g == 0 || point == 0 {
            return Ok(());
        }
        if node.holds_op_through(point) {
            let detail = format!(
                "replica {r}'s store at purge generation {g} holds op {} or above; \
                 generation {g} purged through op {point}",
                node.op_held_min()
            );
            return Err(violation("purged data never returns", detail));
        }
        Ok(())
    }

    /// Guards against: a replica whose store was purged sending a purged
    /// op (in a Prepare or a repair answer).
    pub(super) fn check_sends_unpurged(&self, r: u8, msg: &Message) -> Result<(), Violation> {
        let g = self.nodes[usize::from(r)]
            .store
            .as_ref()
            .map_or(0, |s| s.superblock().purge_generation);
        let point = self.purge.purged_through(g);
        let op_min = match &msg.body {
            Body::Prepare(p) => Some(p.op),
            Body::Prepares(p) => p
                .batches
                .first()
                .and_then(|b| BatchHeader::decode(b).ok())
                .map(|h| h.vsr_op),
            _ => None,
        };
        match op_min {
            Some(op) if g > 0 && op <= point => {
                let detail = format!(
                    "replica {r} at purge generation {g} sent {} of op {op}, purged through {point}",
                    msg.body.name()
                );
                Err(violation("purged data never returns", detail))
            }
            _ => Ok(()),
        }
    }

    /// Guards against: a receiver taking an offer below its store's purge
    /// generation (a stale pre-purge offer; storage would refuse it again,
    /// but the receiver must refuse it before anything is staged).
    pub(super) fn check_offer_taken(&self, r: u8, offered: u64) -> Result<(), Violation> {
        let ours = self.nodes[usize::from(r)]
            .store
            .as_ref()
            .map_or(0, |s| s.superblock().purge_generation);
        if offered < ours {
            let detail = format!(
                "replica {r} at purge generation {ours} took an offer of generation {offered}"
            );
            return Err(violation("stale pre-purge offers refused", detail));
        }
        Ok(())
    }

    /// Every store reached the partition's purge generation.
    pub(super) fn purges_landed(&self) -> bool {
        let g = self.purge.generation();
        self.nodes.iter().all(|x| {
            x.store
                .as_ref()
                .is_some_and(|s| s.superblock().purge_generation >= g)
        })
    }
}

/// Whether `x`'s store is below purge generation `g`.
fn behind(x: &Node, g: u64) -> bool {
    x.store
        .as_ref()
        .is_some_and(|s| s.superblock().purge_generation < g)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(seed: u64) -> Cluster {
        let mut opts = SimOptions::new(seed);
        opts.faults = false;
        opts.transfers = true;
        opts.purges = true;
        let mut c = Cluster::new(&opts, 3).expect("cluster");
        c.calm_faults();
        c
    }

    /// Guards against: the client paused without bound by a purge the
    /// group never goes quiet for: it is given up past the wait bound.
    #[test]
    fn a_purge_never_quiet_is_given_up_at_its_wait_bound() {
        let mut c = cluster(3);
        c.purge.requested = Some((0, false));
        // A storage op that never runs: replica 0 is never quiescent.
        c.nodes[0]
            .pending
            .push_back(Queued::Io(1 << 40, StorageOp::Flush));
        for t in 1..=PURGE_WAIT_TICKS_MAX {
            c.tick = t;
            c.purge_tick(false).expect("no violation");
            assert!(c.purge.pauses_client(), "given up early, at tick {t}");
        }
        c.tick += 1;
        c.purge_tick(false).expect("no violation");
        assert!(!c.purge.pauses_client(), "still waiting past the bound");
        assert_eq!((c.counts.purges, c.counts.purges_abandoned), (0, 1));
    }

    /// Guards against: the purge check losing its teeth: a store at purge
    /// generation 1 holding an op at or below the generation's point is a
    /// violation; the same store with the point below its log is not.
    #[test]
    fn a_purged_store_holding_an_op_through_the_point_is_a_violation() {
        let mut c = cluster(5);
        c.run_faulty(60).expect("calm run");
        let purged_at = c.nodes[0].replica.as_ref().expect("up").op();
        assert!(purged_at > 0, "nothing committed");
        c.purge.points.push(purged_at);
        c.run_faulty(200)
            .expect("the operator purges every replica");
        assert!(c.purges_landed(), "{}", c.state_line());
        let op = c.nodes[0].replica.as_ref().expect("up").op();
        assert!(op > purged_at + 1, "no ops after the purge");
        c.check_purged(0)
            .expect("ops after the point are not purged");
        // As if the purge had covered the ops written after it.
        c.purge.points[0] = op;
        let v = c
            .check_purged(0)
            .expect_err("held ops at or below the point");
        assert_eq!(v.check, "purged data never returns");
    }

    /// Guards against: the send and offer checks losing their teeth: a
    /// purged replica sending an op at or below the purge point, and a
    /// receiver at generation 1 taking an offer of generation 0.
    #[test]
    fn a_purged_op_sent_or_a_stale_offer_taken_is_a_violation() {
        let mut c = cluster(7);
        c.run_faulty(60).expect("calm run");
        let purged_at = c.nodes[0].replica.as_ref().expect("up").op();
        c.purge.points.push(purged_at);
        c.run_faulty(200)
            .expect("the operator purges every replica");
        assert!(c.purges_landed(), "{}", c.state_line());
        let prepare = |op: u64| Message {
            view: 0,
            body: Body::Prepare(crate::vsr::Prepare {
                op,
                commit: op,
                batch: client_batch(op, 8).into(),
            }),
        };
        c.check_sends_unpurged(0, &prepare(purged_at + 1))
            .expect("an op after the point");
        let v = c
            .check_sends_unpurged(0, &prepare(purged_at))
            .expect_err("the purge point itself");
        assert_eq!(v.check, "purged data never returns");
        c.check_offer_taken(0, 1)
            .expect("the store's own generation");
        let v = c.check_offer_taken(0, 0).expect_err("a stale generation");
        assert_eq!(v.check, "stale pre-purge offers refused");
    }
}
