//! Operator purges in the simulator (DESIGN.md sections 4 and 7), as a
//! purge replicated in the log: the operator submits
//! [`Input::ClientPurge`] to the replica it believes is the primary; the
//! primary sequences it as an op and nothing after it until it commits;
//! every replica, when it commits the op, emits `StorageOp::Purge`, which
//! the executor (`replica_io::purge`) runs on its store: every batch
//! through the op is dropped, the chain point kept, the durable purge
//! generation bumped. A replica that crashed between the commit and the
//! purge, or installed a snapshot ending at an unapplied purge op, applies
//! it when its store is recovered. A purge invalidates the store's open
//! snapshots: the transfers they serve end with a final refusal. On with
//! [`super::SimOptions::purges`].
//!
//! Generation `g`'s point `P_g` is the `g`-th purge op committed (the ops
//! of the `StorageOp::Purge`s replicas emit, in order: committed ops
//! agree, so every replica numbers them alike).
//!
//! Guards against: purged data returning (a store at purge generation
//! `g` holding an op at or below `P_g`, after a purge, an install or a
//! reboot; a replica sending one in a Prepare or a repair answer), stores
//! disagreeing on a generation's point (a store reaching generation `g`
//! by a purge through another op than `P_g`), and a receiver taking an
//! offer below its store's purge generation.

use crate::vsr::AppendError;

use super::*;

/// Per tick of the safety phase with no purge request in flight: the
/// operator asks for one.
pub const PURGE_PER_MILLE: u64 = 3;
/// Ticks the operator waits for the answer to a purge request before it
/// gives it up (it may still commit: the points come from the log).
const PURGE_REPLY_TICKS_MAX: u64 = 200;

/// The partition's purges so far.
#[derive(Debug, Default)]
pub struct Purges {
    /// `points[g - 1]` = `P_g`: the op purge generation `g` purged through.
    points: Vec<u64>,
    /// The operator's request in flight: (token, replica asked, since tick).
    asked: Option<(Token, u8, u64)>,
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

    /// The liveness phase asks for no purge; one in flight is forgotten
    /// (if it commits, its point is still learned from the log).
    pub fn drop_request(&mut self) {
        self.asked = None;
    }

    /// Whether `token` is the operator's purge request.
    pub fn is_request(&self, token: Token) -> bool {
        self.asked.is_some_and(|(t, ..)| t == token)
    }
}

impl Cluster {
    /// One tick of the operator: maybe ask the believed primary for a
    /// purge; give up a request unanswered past its bound.
    pub(super) fn purge_tick(&mut self, faults: bool) -> Result<(), Violation> {
        let now = self.tick;
        if let Some((token, to, since)) = self.purge.asked {
            if now - since > PURGE_REPLY_TICKS_MAX {
                self.purge.asked = None;
                self.counts.purges_abandoned += 1;
                self.trace.line(
                    now,
                    format_args!("operator purge {token} to R{to} unanswered: given up"),
                );
            }
            return Ok(());
        }
        if !faults || !chance(&mut self.rng, PURGE_PER_MILLE) {
            return Ok(());
        }
        let to = self.client.believed_primary;
        let x = &self.nodes[usize::from(to)];
        if !x.is_up() || x.xfer.freezes(None) {
            return Ok(());
        }
        self.client.next_token += 1;
        let token = self.client.next_token;
        self.purge.asked = Some((token, to, now));
        self.trace
            .line(now, format_args!("operator purge {token} -> R{to}"));
        self.step(to, Input::ClientPurge { token })
    }

    /// The answer to the operator's purge request.
    pub(super) fn purge_replied(
        &mut self,
        r: u8,
        result: Result<crate::vsr::Appended, AppendError>,
    ) {
        self.purge.asked = None;
        match result {
            Ok(a) => self
                .trace
                .line(self.tick, format_args!("R{r} purge op {} committed", a.op)),
            Err(e) => {
                if let AppendError::NotPrimary { primary, .. } = e {
                    self.client.believed_primary = primary;
                }
                self.counts.purges_abandoned += 1;
                self.trace
                    .line(self.tick, format_args!("R{r} purge refused: {e}"));
            }
        }
    }

    /// The operator's request went to `r`, which went down: no answer.
    pub(super) fn purge_target_down(&mut self, r: u8) {
        if self.purge.asked.is_some_and(|(_, to, _)| to == r) {
            self.purge.asked = None;
            self.counts.purges_abandoned += 1;
        }
    }

    /// Replica `r` committed purge op `op` (it emitted its purge): the
    /// next generation's point if no replica committed it before.
    pub(super) fn purge_committed(&mut self, r: u8, op: u64) -> Result<(), Violation> {
        match self.purge.points.last() {
            Some(&last) if op <= last => {
                if !self.purge.points.contains(&op) {
                    let detail = format!(
                        "replica {r} committed purge op {op}; the purges so far: {:?}",
                        self.purge.points
                    );
                    return Err(violation("purge generations agree", detail));
                }
            }
            _ => {
                self.purge.points.push(op);
                self.counts.purges += 1;
                let g = self.purge.generation();
                self.trace
                    .line(self.tick, format_args!("purge {g} through op {op}"));
            }
        }
        Ok(())
    }

    /// A cluster of one commits its whole durable log at recovery, so a
    /// purge op at its end that crashed before its flush completed (never
    /// emitted as committed) is committed and applied there: the log made
    /// that generation (seeds 7100990, 7101079, 7300428).
    pub(super) fn learn_lone_recovery_purge(&mut self, r: u8) -> Result<(), Violation> {
        let node = &mut self.nodes[usize::from(r)];
        let Some(op) = node.lone_recovery_purge_op.take() else {
            return Ok(());
        };
        debug_assert!(
            self.n == 1 && node.lone,
            "only a lone replica's recovery commits"
        );
        self.purge_committed(r, op)
    }

    /// `r`'s store ran a purge just now, to `generation`.
    pub(super) fn purge_ran(
        &mut self,
        r: u8,
        through_op: u64,
        (generation, over_snapshots): (u64, bool),
    ) -> Result<(), Violation> {
        self.counts.replica_purges += 1;
        self.counts.purges_over_snapshots += u64::from(over_snapshots);
        let point = usize::try_from(generation)
            .ok()
            .and_then(|g| self.purge.points.get(g.wrapping_sub(1)).copied());
        if point != Some(through_op) {
            let detail = format!(
                "replica {r}'s store reached purge generation {generation} through op \
                 {through_op}; the purges: {:?}",
                self.purge.points
            );
            return Err(violation("purge generations agree", detail));
        }
        self.trace.line(
            self.tick,
            format_args!("R{r} purged to generation {generation} through op {through_op}"),
        );
        self.check_purged(r)
    }

    /// Guards against: purged data returning. A store at purge generation
    /// `g` holds no op at or below `P_g`, and `g` is a generation the log
    /// made.
    pub(super) fn check_purged(&mut self, r: u8) -> Result<(), Violation> {
        let node = &mut self.nodes[usize::from(r)];
        self.counts.purges_at_recovery += std::mem::take(&mut node.recovery_purges);
        let Some(g) = node.store.as_ref().map(|s| s.superblock().purge_generation) else {
            return Ok(());
        };
        if g > self.purge.generation() {
            let detail = format!(
                "replica {r}'s store is at purge generation {g}; the log made {}",
                self.purge.generation()
            );
            return Err(violation("purge generations agree", detail));
        }
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

    /// Ticks without the operator's random purges (nor crashes), so the
    /// purge a test asked for is the only one however fast it commits.
    fn run_calm(c: &mut Cluster, ticks: u64) {
        for _ in 0..ticks {
            c.tick_once(false).expect("no violation");
        }
    }

    /// The operator asks the primary for a purge now.
    fn ask_purge(c: &mut Cluster) {
        let primary = (0..c.n)
            .find(|&r| {
                c.nodes[usize::from(r)]
                    .replica
                    .as_ref()
                    .is_some_and(|x| x.is_primary() && x.status() == Status::Normal)
            })
            .expect("a primary");
        c.client.believed_primary = primary;
        c.client.next_token += 1;
        let token = c.client.next_token;
        c.purge.asked = Some((token, primary, c.tick));
        c.step(primary, Input::ClientPurge { token })
            .expect("no violation");
    }

    /// Guards against: a replicated purge not reaching every store, or
    /// reaching one through another op: the operator's purge commits, every
    /// store applies it once, at the same op, and holds nothing through it.
    #[test]
    fn a_purge_op_commits_and_every_store_applies_it_once() {
        let mut c = cluster(5);
        c.run_faulty(60).expect("calm run");
        let before = c.nodes[0].replica.as_ref().expect("up").op();
        assert!(before > 0, "nothing committed");
        ask_purge(&mut c);
        run_calm(&mut c, 200);
        assert_eq!(c.purge.generation(), 1, "{}", c.state_line());
        assert!(c.purge.points[0] > before);
        assert!(c.purges_landed(), "{}", c.state_line());
        assert_eq!(c.counts.replica_purges, 3, "one store purge per replica");
        for r in 0..c.n {
            c.check_purged(r).expect("nothing through the point");
            let op = c.nodes[usize::from(r)].replica.as_ref().expect("up").op();
            assert!(op > c.purge.points[0], "R{r}: no op after the purge");
        }
    }

    /// Guards against: an operator request that is never answered holding
    /// the operator without bound: it is given up past its bound.
    #[test]
    fn an_unanswered_purge_request_is_given_up_at_its_bound() {
        let mut c = cluster(3);
        c.purge.asked = Some((1 << 40, 0, 0));
        for t in 1..=PURGE_REPLY_TICKS_MAX {
            c.tick = t;
            c.purge_tick(false).expect("no violation");
            assert!(c.purge.asked.is_some(), "given up early, at tick {t}");
        }
        c.tick += 1;
        c.purge_tick(false).expect("no violation");
        assert!(c.purge.asked.is_none(), "still waiting past the bound");
        assert_eq!((c.counts.purges, c.counts.purges_abandoned), (0, 1));
    }

    /// Guards against: the purge check losing its teeth: a store at purge
    /// generation 1 holding an op at or below the generation's point is a
    /// violation; the same store with the point below its log is not.
    #[test]
    fn a_purged_store_holding_an_op_through_the_point_is_a_violation() {
        let mut c = cluster(5);
        c.run_faulty(60).expect("calm run");
        ask_purge(&mut c);
        run_calm(&mut c, 200);
        assert!(c.purges_landed() && c.purge.generation() == 1);
        let op = c.nodes[0].replica.as_ref().expect("up").op();
        assert!(op > c.purge.points[0] + 1, "no ops after the purge");
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
        // A seed whose first 60 ticks ask no purge of their own.
        let mut c = cluster(13);
        c.run_faulty(60).expect("calm run");
        ask_purge(&mut c);
        run_calm(&mut c, 200);
        assert!(c.purges_landed() && c.purge.generation() == 1);
        let purged_at = c.purge.points[0];
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

    /// Guards against: stores disagreeing on a generation's point going
    /// unnoticed: a store reaching generation 1 through another op than
    /// the committed purge op is a violation, and so is a second purge
    /// committed at an op below the last one that is not one of them.
    #[test]
    fn a_purge_at_another_op_is_a_violation() {
        let mut c = cluster(9);
        c.purge_committed(0, 10).expect("the first purge");
        c.purge_committed(1, 10).expect("the same purge, elsewhere");
        let v = c.purge_committed(2, 7).expect_err("an op below it");
        assert_eq!(v.check, "purge generations agree");
        let v = c.purge_ran(1, 11, (1, false)).expect_err("another op");
        assert_eq!(v.check, "purge generations agree");
    }
}
