//! View change (StartViewChange / DoViewChange / StartView), recovery
//! (RequestStartView) and repair (RequestPrepares / Prepares).
//!
//! The merge follows DESIGN.md section 6: among a quorum of DoViewChanges
//! the suffix with the highest log_view (then the highest op) is
//! canonical; a replica cuts only its own ops that disagree with it, and
//! never at or below the highest commit of the quorum.

use ringlog_protocol::batch::BatchHeader;

use super::replica::{Ack, Dvc, Phase, Replica, Sv, T};
use ringlog_protocol::replication as wire;

use super::types::*;

impl Replica {
    pub(super) fn start_view_change(&mut self, view: u32, out: &mut Outbox) {
        assert!(
            view > self.view,
            "view change to view {view} from {}",
            self.view
        );
        debug_assert!(self.status != Status::Recovering && self.status != Status::Fenced);
        self.abandon_clients(out);
        self.view = view;
        self.view_seen_max = self.view_seen_max.max(view);
        self.status = Status::ViewChange;
        self.svc_votes = 1 << self.cfg.replica;
        self.dvc_sent = false;
        self.dvcs.clear();
        self.phase = Phase::Collecting;
        self.target.clear();
        self.repair_from = None;
        self.persist(out);
        self.arm_for_status();
        out.event(Event::StatusChanged {
            status: self.status,
            view,
        });
        self.send_all(out, Body::StartViewChange);
        self.check_svc_quorum(out);
    }

    pub(super) fn view_change_retry(&mut self, out: &mut Outbox) {
        self.send_all(out, Body::StartViewChange);
        if self.dvc_sent && !self.is_primary() {
            let primary = self.primary_of(self.view);
            let body = self.own_dvc();
            self.send(out, primary, body);
        }
        if self.phase == Phase::Repairing {
            self.repair_retry(out);
        }
        self.start(T::ViewChangeRetry);
    }

    pub(super) fn on_start_view_change(&mut self, from: u8, view: u32, out: &mut Outbox) {
        if !self.may_vote("start_view_change", view, out) {
            return;
        }
        let abdicating = from == self.primary_of(self.view);
        if view > self.view && !abdicating && self.primary_heard_recently() {
            // Check-quorum: the sender lost the primary, we did not. A view
            // change needs a quorum that lost it, or one replica cut off
            // from the primary would depose it again and again.
            return out.event(Event::Dropped {
                what: "start_view_change",
                reason: "primary heard recently",
            });
        }
        if view > self.view {
            self.start_view_change(view, out);
        } else if self.status != Status::ViewChange {
            // Normal in this view already: a laggard missed our StartView.
            if self.status == Status::Normal && self.is_primary() {
                self.send_start_view(from, 0, out);
            }
            return;
        }
        self.svc_votes |= 1 << from;
        self.check_svc_quorum(out);
    }

    /// Normal and in touch with the primary: we are it, or it spoke within
    /// the un-jittered primary-silent timeout (the PrimarySilent timeout
    /// restarts on every Prepare and Commit from it).
    fn primary_heard_recently(&self) -> bool {
        if self.status != Status::Normal {
            return false;
        }
        if self.is_primary() {
            return true;
        }
        let silent = &self.timeouts[T::PrimarySilent as usize];
        debug_assert!(silent.armed(), "a normal backup watches its primary");
        silent.elapsed_ticks() < self.cfg.primary_silent_ticks
    }

    /// Recovering replicas never vote; nobody votes for an old view.
    fn may_vote(&mut self, what: &'static str, view: u32, out: &mut Outbox) -> bool {
        let reason = if self.status == Status::Recovering {
            "recovering: learns the view before it votes"
        } else if self.wiped {
            "wiped: repairs its log before it votes"
        } else if view < self.view {
            "stale view"
        } else {
            return true;
        };
        out.event(Event::Dropped { what, reason });
        false
    }

    fn check_svc_quorum(&mut self, out: &mut Outbox) {
        if self.dvc_sent || self.svc_votes.count_ones() < self.cfg.quorum() {
            return;
        }
        let primary = self.primary_of(self.view);
        if primary == self.cfg.replica && self.transferring == Some(Trigger::RepairStuck) {
            // Its repair was stuck on the old view's log; this view's log
            // is the DoViewChange quorum's, which may be its own (sim seed
            // 34001134: the primary holding what it lacked lost its disk,
            // the other voter transferred too, and each passed its turn
            // for ever). It leads; if it cannot repair the new log either,
            // the stuck repair is raised again and passes the view. The
            // host cancels the receiver once it is not transferring.
            self.transferring = None;
            self.repair_rounds_at = (self.log.op(), 0);
            out.event(Event::Dropped {
                what: "repair-stuck transfer",
                reason: "leads the view change instead",
            });
        }
        if primary == self.cfg.replica && self.transferring.is_some() {
            // Refuses primaryship: the new log holds ops this one lacks
            // and no peer can repair. Pass the turn at once (the others
            // follow our StartViewChange) rather than wait for the
            // escalation timeout.
            out.event(Event::Dropped {
                what: "view change",
                reason: "transferring: refuses primaryship",
            });
            return self.start_view_change(self.view + 1, out);
        }
        self.dvc_sent = true;
        if primary == self.cfg.replica {
            let own = self.own_dvc_fields();
            self.dvcs.insert(self.cfg.replica, own);
            self.check_dvc_quorum(out);
        } else {
            let body = self.own_dvc();
            self.send(out, primary, body);
        }
    }

    /// Our vote: the durable log_view, and our log only as far as it is
    /// that view's log (ops of no later view; a log still being repaired
    /// into a newer view vouches for its older part only).
    fn own_dvc_fields(&self) -> Dvc {
        let log_view = if planted!(LogViewNotPersistedBeforeDoViewChange) {
            self.log_view
        } else {
            self.durable.log_view
        };
        let suffix: Vec<BatchHeader> = self
            .log
            .entries()
            .map(|e| e.header)
            .take_while(|h| h.vsr_view <= log_view)
            .collect();
        let base = self.log.base();
        let (op, head_checksum) = suffix
            .last()
            .map_or((base.op, base.checksum), |h| (h.vsr_op, h.header_checksum));
        Dvc {
            log_view,
            op,
            head_checksum,
            commit: self.commit,
            suffix,
        }
    }

    fn own_dvc(&self) -> Body {
        let d = self.own_dvc_fields();
        Body::DoViewChange(wire::DoViewChange {
            log_view: d.log_view,
            op: d.op,
            head_checksum: d.head_checksum,
            commit: d.commit,
            suffix: d.suffix,
        })
    }

    pub(super) fn on_do_view_change(&mut self, from: u8, view: u32, dvc: Dvc, out: &mut Outbox) {
        if !self.may_vote("do_view_change", view, out) {
            return;
        }
        if self.primary_of(view) != self.cfg.replica {
            return out.event(Event::Dropped {
                what: "do_view_change",
                reason: "not its primary",
            });
        }
        if dvc.log_view >= view || !suffix_ok(&dvc.suffix, dvc.op) {
            return out.event(Event::Dropped {
                what: "do_view_change",
                reason: "malformed",
            });
        }
        if view > self.view {
            self.start_view_change(view, out);
        } else if self.status != Status::ViewChange {
            if self.status == Status::Normal {
                self.send_start_view(from, 0, out);
            }
            return;
        }
        // A DoViewChange implies its sender's StartViewChange.
        self.svc_votes |= 1 << from;
        if self.transferring.is_some_and(|t| t != Trigger::RepairStuck) {
            // Never collected: at the quorum we pass the turn (one stuck
            // on repair leads instead, see `check_svc_quorum`).
            return self.check_svc_quorum(out);
        }
        self.dvcs.insert(from, dvc);
        self.check_svc_quorum(out);
        self.check_dvc_quorum(out);
    }

    fn check_dvc_quorum(&mut self, out: &mut Outbox) {
        let ready = self.phase == Phase::Collecting
            && self.dvcs.len() as u32 >= self.cfg.quorum()
            && self.dvcs.contains_key(&self.cfg.replica);
        if ready {
            self.merge_dvcs(out);
        }
    }

    /// Picks the canonical log of the quorum and adopts it.
    fn merge_dvcs(&mut self, out: &mut Outbox) {
        debug_assert!(self.is_primary() && self.status == Status::ViewChange);
        let canonical = self
            .dvcs
            .iter()
            .max_by_key(|(&r, d)| (d.log_view, d.op, r == self.cfg.replica))
            .map(|(&r, d)| (r, d.clone()));
        let Some((from, canonical)) = canonical else {
            return;
        };
        let commit_max = self.dvcs.values().map(|d| d.commit).max().unwrap_or(0);
        let commit_floor = commit_max.max(self.commit);
        let head = (canonical.op, canonical.head_checksum);
        if !self.adopt(from, head, &canonical.suffix, commit_floor, out) {
            return;
        }
        self.commit_max = self.commit_max.max(commit_max);
        self.phase = Phase::Repairing;
        self.try_finish_view(out);
    }

    /// Makes our log a prefix of the canonical log (`suffix`, ending at
    /// `head` = (op, its checksum), held by `from`): keeps our ops up to the
    /// highest one the head or the suffix vouches for (a matching checksum
    /// vouches for the whole chain below it) or our commit, cuts the rest,
    /// then repairs from `from`.
    /// Refuses (false) when the canonical log ends below `commit_floor` or
    /// below our commit: it cannot hold every committed op.
    fn adopt(
        &mut self,
        from: u8,
        head: (u64, u64),
        suffix: &[BatchHeader],
        commit_floor: u64,
        out: &mut Outbox,
    ) -> bool {
        let op = head.0;
        if op < commit_floor.max(self.commit) {
            let reason = "canonical log ends below a committed op";
            out.event(Event::Dropped {
                what: "view change",
                reason,
            });
            return false;
        }
        let (cut, vouched) = self.cut_point(head, suffix);
        debug_assert!(cut >= self.commit && cut <= self.log.op());
        self.truncate_to(cut, out);
        self.unverified_above = (cut > vouched).then_some(vouched);
        self.target = suffix
            .iter()
            .filter(|h| h.vsr_op > cut)
            .map(|h| (h.vsr_op, *h))
            .collect();
        self.repair_goal = op;
        self.repair_from = None;
        if self.log.op() < op {
            self.request_repair(from, op, out);
        }
        true
    }

    /// Where adopting the canonical log (`suffix`, ending at `op`) cuts
    /// ours: above the ops it vouches for, and above our unvouched ops too
    /// when nothing contradicts them and a repair follows (its first batch
    /// must link to our last op, which checks the whole chain below; a
    /// mismatch then cuts one op at a time, see `repair_mismatch`). A
    /// suffix that starts above our log (the primary's journal was pruned)
    /// vouches for nothing of ours, yet our ops may be committed ones:
    /// cutting them would leave them on fewer replicas than a quorum.
    /// Returns (cut, vouched): ops in `vouched + 1..=cut` are kept
    /// unverified, and not committed until verified.
    fn cut_point(&self, head: (u64, u64), suffix: &[BatchHeader]) -> (u64, u64) {
        let (op, head_checksum) = head;
        let own = self.log.op();
        let vouched = self.vouched_op(head, suffix).min(op);
        let mut contradicted = suffix
            .iter()
            .filter(|h| h.vsr_op <= own)
            .find(|h| self.log.checksum_at(h.vsr_op) != Some(h.header_checksum))
            .map(|h| h.vsr_op);
        if contradicted.is_none()
            && op <= own
            && self.log.checksum_at(op).is_some_and(|c| c != head_checksum)
        {
            contradicted = Some(op);
        }
        if let Some(first) = suffix.first() {
            let below = first.vsr_op.saturating_sub(1);
            let known = self.log.checksum_at(below);
            if below <= own && known.is_some_and(|c| c != first.prev_checksum) {
                contradicted = Some(below);
            }
        }
        let limit = contradicted.map_or(own, |c| c.saturating_sub(1)).min(op);
        if limit > vouched && limit < op {
            (limit, vouched)
        } else {
            (vouched, vouched)
        }
    }

    /// The highest op of our log that `head` or `suffix` shows is
    /// canonical; at least our commit (committed ops are in every canonical
    /// log). The head vouches even with no suffix: a new primary rebooted
    /// from a purged store holds only its anchor, and without it a backup
    /// holding the same op above its own commit would cut it.
    fn vouched_op(&self, head: (u64, u64), suffix: &[BatchHeader]) -> u64 {
        let own = self.log.op();
        let mut vouched = self.commit.min(own);
        if head.0 <= own && self.log.checksum_at(head.0) == Some(head.1) {
            vouched = vouched.max(head.0);
        }
        if let Some(first) = suffix.first() {
            let below = first.vsr_op.saturating_sub(1);
            if below <= own && self.log.checksum_at(below) == Some(first.prev_checksum) {
                vouched = vouched.max(below);
            }
        }
        for h in suffix.iter().filter(|h| h.vsr_op <= own) {
            if self.log.checksum_at(h.vsr_op) == Some(h.header_checksum) {
                vouched = vouched.max(h.vsr_op);
            }
        }
        vouched
    }

    /// New primary: once the canonical log is whole and durable, persist
    /// log_view = view; StartView follows that write (`on_persisted`).
    pub(super) fn try_finish_view(&mut self, out: &mut Outbox) {
        let ready = self.status == Status::ViewChange
            && self.phase == Phase::Repairing
            && self.log.op() >= self.repair_goal
            && self.truncations.is_empty()
            && self.log.entries().all(|e| e.durable);
        if !ready {
            return;
        }
        self.phase = Phase::Persisting;
        self.log_view = self.view;
        self.log_view_op = self.log.op();
        let commit = self.commit_max;
        self.advance_commit(commit, out);
        self.persist(out);
    }

    pub(super) fn become_primary(&mut self, out: &mut Outbox) {
        assert!(self.is_primary() && self.durable.log_view == self.view);
        assert!(
            self.transferring.is_none(),
            "a transferring replica never leads"
        );
        self.status = Status::Normal;
        self.phase = Phase::Collecting;
        self.dvcs.clear();
        // Inherited ops are at most a pipeline: count from the view's start.
        self.drain_bytes = 0;
        let me = 1u32 << self.cfg.replica;
        self.acks = self
            .log
            .entries()
            .filter(|e| e.header.vsr_op > self.commit)
            .map(|e| {
                let voters = if e.durable { me } else { 0 };
                let ack = Ack {
                    checksum: e.header.header_checksum,
                    voters,
                };
                (e.header.vsr_op, ack)
            })
            .collect();
        self.arm_for_status();
        out.event(Event::StatusChanged {
            status: self.status,
            view: self.view,
        });
        for to in 0..self.cfg.replica_count {
            if to != self.cfg.replica {
                self.send_start_view(to, 0, out);
            }
        }
        self.try_commit(out);
    }

    fn send_start_view(&mut self, to: u8, nonce: u64, out: &mut Outbox) {
        let head = self.log.head();
        let body = Body::StartView(wire::StartView {
            op: head.op,
            head_checksum: head.checksum,
            commit: self.commit,
            nonce,
            suffix: self.log.headers(),
        });
        self.send(out, to, body);
    }

    pub(super) fn on_start_view(&mut self, from: u8, view: u32, sv: Sv, out: &mut Outbox) {
        let Sv {
            head,
            commit,
            nonce,
            suffix,
        } = sv;
        let op = head.0;
        if self.view_lost && nonce == self.nonce && from == self.primary_of(view) {
            self.hear_view(from, view);
        }
        let reason = if from != self.primary_of(view) {
            "not from the view's primary"
        } else if view < self.view || (view == self.view && self.status == Status::Normal) {
            "stale view"
        } else if self.status == Status::Recovering && nonce != self.nonce {
            "recovering: answer to an older request"
        } else if commit > op || !suffix_ok(&suffix, op) {
            "malformed"
        } else {
            ""
        };
        if !reason.is_empty() {
            return out.event(Event::Dropped {
                what: "start_view",
                reason,
            });
        }
        self.abandon_clients(out);
        let (view_was, log_view_was) = (self.view, self.log_view);
        self.view = view;
        self.log_view = view;
        if !self.adopt(from, head, &suffix, self.commit, out) {
            // Keep our durable identity: this StartView contradicts it.
            self.view = view_was;
            self.log_view = log_view_was;
            return;
        }
        self.log_view_op = op;
        self.enter_normal_backup(commit, out);
    }

    fn enter_normal_backup(&mut self, commit: u64, out: &mut Outbox) {
        self.status = Status::Normal;
        self.view_seen_max = self.view_seen_max.max(self.view);
        self.dvcs.clear();
        self.persist(out);
        self.arm_for_status();
        out.event(Event::StatusChanged {
            status: self.status,
            view: self.view,
        });
        self.advance_commit(commit, out);
        // Ack every durable op above commit in the new view (held by the
        // gate until log_view = view is durable).
        self.ack_uncommitted(commit, out);
        if self.repair_goal > self.log.op() {
            self.ensure(T::RepairRetry);
        }
    }

    pub(super) fn on_request_start_view(
        &mut self,
        from: u8,
        view: u32,
        nonce: u64,
        out: &mut Outbox,
    ) {
        let normal_primary = self.status == Status::Normal && self.is_primary();
        if normal_primary && view <= self.view {
            self.send_start_view(from, nonce, out);
        } else if normal_primary {
            // A replica stuck in a newer view (it ran ahead while cut off
            // from us) hears us again: its view cannot go back, so ours
            // moves up to it. One view change per heal, never while it
            // cannot hear us (it only asks after one of our messages).
            self.start_view_change(view, out);
        } else if !self.view_lost {
            // Not the primary, but our view is a promise: a replica that
            // lost its disk needs a quorum of these before it acks.
            self.send(out, from, Body::ViewNotice(wire::ViewNotice { nonce }));
        } else {
            let reason = "not the normal primary";
            out.event(Event::Dropped {
                what: "request_start_view",
                reason,
            });
        }
    }

    /// A wiped replica that lost its primary before its log was whole goes
    /// back to asking: it may not vote on a log it cannot vouch for.
    pub(super) fn back_to_recovering(&mut self, out: &mut Outbox) {
        debug_assert!(self.wiped && self.status == Status::Normal);
        self.status = Status::Recovering;
        self.nonce = self.rng.next_u64() | 1;
        self.arm_for_status();
        out.event(Event::StatusChanged {
            status: self.status,
            view: self.view,
        });
    }

    /// A peer's view, answering our RequestStartView: counted while our
    /// own view is unknown (`view_known`); a newer one is asked for.
    pub(super) fn on_view_notice(&mut self, from: u8, view: u32, nonce: u64, out: &mut Outbox) {
        if !self.view_lost || nonce != self.nonce {
            let reason = "not asked";
            return out.event(Event::Dropped {
                what: "view_notice",
                reason,
            });
        }
        self.hear_view(from, view);
        if view > self.view {
            self.learn_view(view, out);
        }
    }

    pub(super) fn hear_view(&mut self, from: u8, view: u32) {
        debug_assert!(self.view_lost && from != self.cfg.replica);
        let heard = self.views_heard.entry(from).or_insert(view);
        *heard = (*heard).max(view);
    }

    /// Asks every peer for its view (RequestStartView), unless a round is
    /// already out; `start_view_request_retry` repeats it.
    pub(super) fn ask_views(&mut self, out: &mut Outbox) {
        debug_assert!(self.view_lost);
        if self.timeouts[T::StartViewRequest as usize].armed() {
            return;
        }
        self.ask_all_for_the_view(out);
        self.start(T::StartViewRequest);
    }

    /// RequestStartView with our nonce to every peer.
    fn ask_all_for_the_view(&mut self, out: &mut Outbox) {
        let nonce = self.nonce;
        self.send_all(
            out,
            Body::RequestStartView(wire::RequestStartView { nonce }),
        );
    }

    /// Saw a newer view in a normal-operation message: ask for StartView.
    pub(super) fn learn_view(&mut self, view: u32, out: &mut Outbox) {
        if view <= self.view_seen_max && self.timeouts[T::StartViewRequest as usize].armed() {
            return;
        }
        self.view_seen_max = self.view_seen_max.max(view);
        self.nonce = self.rng.next_u64() | 1;
        self.ask_all_for_the_view(out);
        self.start(T::StartViewRequest);
    }

    pub(super) fn start_view_request_retry(&mut self, out: &mut Outbox) {
        let behind = self.status == Status::Recovering
            || self.view_seen_max > self.view
            || (self.view_lost && !self.view_known());
        if !behind {
            return self.timeout(T::StartViewRequest).stop();
        }
        let attempts = self.timeouts[T::StartViewRequest as usize].attempts();
        if self.status == Status::Recovering
            && !self.wiped
            && attempts >= self.cfg.recovering_attempts_max
        {
            // Nobody is normal to answer: our durable state is a valid
            // promise, so vote in a new view rather than wait forever.
            self.status = Status::ViewChange;
            return self.start_view_change(self.view + 1, out);
        }
        self.ask_all_for_the_view(out);
        self.backoff(T::StartViewRequest);
    }

    // ---- repair ----

    /// Asks `from` for ops after our log, up to `op_max` (one chunk).
    pub(super) fn request_repair(&mut self, from: u8, op_max: u64, out: &mut Outbox) {
        if !self.repairs_now() || self.wiped_gap_too_wide(op_max) {
            return self.wait_for_install(from, op_max, out);
        }
        // Transferring: the rotation picks the peer (`repair_retry`), not
        // whoever made us ask (the primary may be the one that retired).
        let from = match self.repair_from {
            Some(peer) if self.transferring.is_some() => peer,
            _ => from,
        };
        let op_min = self.log.op() + 1;
        self.repair_goal = self.repair_goal.max(op_max);
        self.repair_from = Some(from);
        if op_min > op_max {
            return;
        }
        let op_max = op_max.min(op_min + self.cfg.repair_batches_max - 1);
        self.send(
            out,
            from,
            Body::RequestPrepares(wire::RequestPrepares { op_min, op_max }),
        );
        self.ensure(T::RepairRetry);
    }

    pub(super) fn repair_retry(&mut self, out: &mut Outbox) {
        match self.repair_from {
            Some(from) if self.repair_goal > self.log.op() && self.repairs_now() => {
                if self.repair_round_stuck(out) {
                    return; // we passed the view we were finishing
                }
                let goal = self.repair_goal;
                // Transferring: the peer may be down or may have retired
                // the ops too; another may hold them.
                if self.transferring.is_some() {
                    self.repair_from = Some(self.next_peer(from));
                }
                self.request_repair(from, goal, out);
                self.backoff(T::RepairRetry);
            }
            _ => self.timeout(T::RepairRetry).stop(),
        }
    }

    /// Whether repair runs: not while a transfer that replaces the log
    /// is awaited ([`Trigger::repairs_meanwhile`]).
    fn repairs_now(&self) -> bool {
        self.transferring.is_none_or(Trigger::repairs_meanwhile)
    }

    /// A wiped replica that holds nothing and knows no commit, asked to
    /// repair more than `wiped_repair_ops_max` ops: a transfer is cheaper
    /// ([`Trigger::NewOrWiped`]). Safe as any wiped replica's repair: it
    /// never votes, leads or acks until its log is whole (`may_vote`,
    /// `send_prepare_ok`), and the install reboots it wiped. After an
    /// install its superblock names the installed commit, so it does not
    /// ask again on the log that install left (even an empty one).
    fn wiped_gap_too_wide(&self, op_max: u64) -> bool {
        let empty = self.log.op() == 0 && self.durable.commit == 0;
        debug_assert!(!empty || self.log.base().op == 0);
        let max = match self.wipe_cause {
            Trigger::CorruptSegment => Some(0),
            _ => self.cfg.wiped_repair_ops_max,
        };
        self.wiped && empty && self.transferring.is_none() && max.is_some_and(|max| op_max > max)
    }

    /// Repair waits for an install (raising the wipe's cause the first
    /// time, see [`Replica::wiped_for`]):
    /// the goal is kept, nothing is asked, the retry is off.
    fn wait_for_install(&mut self, from: u8, op_max: u64, out: &mut Outbox) {
        if self.transferring.is_none() {
            out.event(Event::TransferNeeded {
                trigger: self.wipe_cause,
                evicted: None,
            });
            self.transferring = Some(self.wipe_cause);
        }
        debug_assert!(!self.repairs_now());
        self.repair_goal = self.repair_goal.max(op_max);
        self.repair_from = Some(from);
        self.timeout(T::RepairRetry).stop();
    }

    /// Counts a repair round; at `repair_stuck_rounds_max` rounds in a row
    /// without the log growing raises [`Trigger::RepairStuck`] (once: the
    /// count restarts only when the log moves). True if that made us, a
    /// new primary finishing its view, pass the view on.
    fn repair_round_stuck(&mut self, out: &mut Outbox) -> bool {
        let op = self.log.op();
        let (at, rounds) = self.repair_rounds_at;
        let rounds = if op == at {
            rounds.saturating_add(1)
        } else {
            0
        };
        self.repair_rounds_at = (op, rounds);
        let stuck = self
            .cfg
            .repair_stuck_rounds_max
            .is_some_and(|max| rounds == max);
        if !stuck || self.transferring.is_some() {
            return false;
        }
        out.event(Event::TransferNeeded {
            trigger: Trigger::RepairStuck,
            evicted: None,
        });
        self.transferring = Some(Trigger::RepairStuck);
        debug_assert!(self.repairs_now());
        self.pass_view_if_finishing(out)
    }

    /// A new primary that cannot repair the log its view needs moves to
    /// the next view (it never leads while transferring).
    fn pass_view_if_finishing(&mut self, out: &mut Outbox) -> bool {
        if self.status == Status::ViewChange && self.is_primary() {
            self.start_view_change(self.view + 1, out);
            return true;
        }
        false
    }

    pub(super) fn on_request_prepares(
        &mut self,
        from: u8,
        view: u32,
        op_min: u64,
        op_max: u64,
        out: &mut Outbox,
    ) {
        if view != self.view || self.status == Status::Recovering || op_min > self.log.op() {
            let reason = "other view or not held";
            return out.event(Event::Dropped {
                what: "request_prepares",
                reason,
            });
        }
        let op_max = op_max
            .min(self.log.op())
            .min(op_min + self.cfg.repair_batches_max - 1);
        let batches: Vec<BatchBytes> = (op_min..=op_max)
            .map_while(|op| self.log.get(op).and_then(|e| e.batch.clone()))
            .collect();
        if !batches.is_empty() {
            let commit = self.commit;
            return self.send(out, from, Body::Prepares(Prepares { commit, batches }));
        }
        if self.reads.len() >= self.cfg.repair_reads_max {
            let reason = "repair reads at their bound";
            return out.event(Event::Dropped {
                what: "request_prepares",
                reason,
            });
        }
        let id = self.io(out, StorageOp::ReadBatches { op_min, op_max });
        self.reads.insert(id, (from, view));
    }

    pub(super) fn on_read_done(
        &mut self,
        to: u8,
        view: u32,
        result: Result<IoOutcome, IoFailure>,
        out: &mut Outbox,
    ) {
        match result {
            Ok(IoOutcome::Batches(batches)) if view == self.view && !batches.is_empty() => {
                let commit = self.commit;
                self.send(out, to, Body::Prepares(Prepares { commit, batches }));
            }
            // The asker cannot repair from us: tell it, so it transfers.
            Ok(IoOutcome::Evicted(evicted)) if view == self.view => {
                self.send(out, to, Body::RangeEvicted(evicted));
            }
            _ => out.event(Event::Dropped {
                what: "repair read",
                reason: "failed or stale",
            }),
        }
    }

    pub(super) fn on_prepares(
        &mut self,
        from: u8,
        view: u32,
        commit: u64,
        batches: Vec<BatchBytes>,
        out: &mut Outbox,
    ) {
        let repairing = self.status == Status::Normal
            || (self.status == Status::ViewChange && self.phase == Phase::Repairing);
        if view != self.view || self.repair_from != Some(from) || !repairing {
            return out.event(Event::Dropped {
                what: "prepares",
                reason: "not asked for",
            });
        }
        let mut refused = false;
        for batch in batches {
            let Some(h) = self.verify_batch(&batch, out) else {
                break;
            };
            if h.vsr_op <= self.log.op() {
                continue;
            }
            let expected = self.target.get(&h.vsr_op).map(|e| e.header_checksum);
            if expected.is_none() && !self.canonical_source(from) {
                out.event(Event::Dropped {
                    what: "prepares",
                    reason: "no canonical header from this peer",
                });
                // The retry asks the next peer; asking this one again
                // now would only bring the same answer.
                refused = true;
                break;
            }
            if h.vsr_op != self.log.op() + 1 || expected.is_some_and(|c| c != h.header_checksum) {
                // A gap (our log moved since we asked), or the peer's op
                // is not the canonical one: nothing said about ours.
                out.event(Event::Dropped {
                    what: "prepares",
                    reason: "not the next canonical op",
                });
                break;
            }
            if !self.log.links(&h) {
                self.repair_mismatch(out);
                break;
            }
            self.target.remove(&h.vsr_op);
            // It links: our log below it is canonical (as `append` notes),
            // so the commit comes before each op, as `on_prepare` takes it.
            // A store rolls only once its whole tail is committed, and a
            // whole answer, or a new primary's whole repair, of uncommitted
            // batches can pass a segment's end and its headroom.
            self.unverified_above = None;
            self.advance_commit(commit, out);
            debug_assert!(self.commit >= self.commit_max.min(self.log.op()));
            self.append(h, batch, out);
        }
        if self.status == Status::Normal {
            self.advance_commit(commit, out);
        }
        let goal = self.repair_goal;
        if refused {
            // The retry timer (armed when we asked) rotates.
        } else if goal > self.log.op() {
            self.request_repair(from, goal, out);
        } else {
            self.timeout(T::RepairRetry).stop();
        }
        self.try_finish_view(out);
    }

    /// The peer we repair from retired the ops right after our log: a
    /// state transfer catches us up (the driver's, see
    /// [`Event::TransferNeeded`]) unless another peer still holds them.
    /// From here until our log grows we keep voting, repair from the next
    /// peer at each retry, pass any view we would lead to the next primary
    /// and send no PrepareOk (see `Replica::transferring`). An answer for
    /// another range (our log moved since we asked) or from a peer we did
    /// not ask is stale.
    pub(super) fn on_range_evicted(
        &mut self,
        from: u8,
        view: u32,
        evicted: wire::RangeEvicted,
        out: &mut Outbox,
    ) {
        let ours = evicted.op_min == self.log.op() + 1 && evicted.op_held_min > evicted.op_min;
        if view != self.view || self.repair_from != Some(from) || !ours {
            return out.event(Event::Dropped {
                what: "range_evicted",
                reason: "not an answer to our repair",
            });
        }
        // Purged away rather than retired: the peer's purge generation is
        // ahead of ours (counted apart; the transfer is the same).
        let trigger = match evicted.reason {
            wire::EvictedReason::Purged => Trigger::Purged,
            wire::EvictedReason::Retired => Trigger::RangeEvicted,
        };
        out.event(Event::TransferNeeded {
            trigger,
            evicted: Some((from, evicted)),
        });
        self.transferring = Some(trigger);
        // Finishing this view: the log it needs is retired.
        if self.pass_view_if_finishing(out) {
            return;
        }
        // The retry asks the next peer (not at once: every peer may have
        // retired the ops, and the retry backs off).
        self.ensure(T::RepairRetry);
    }

    /// The peer after `from` (never us), for a repair that rotates.
    fn next_peer(&self, from: u8) -> u8 {
        let n = self.cfg.replica_count;
        let next = (from + 1) % n;
        if next == self.cfg.replica {
            (next + 1) % n
        } else {
            next
        }
    }

    /// Whether `from`'s log vouches for the ops it repairs: a normal
    /// backup's repair peer is the primary unless a transfer rotated it,
    /// a new primary's is the canonical DVC's sender. A rotated peer's
    /// ops are taken only where the canonical headers name them
    /// (`target`): its own may be uncommitted ops of an older view.
    fn canonical_source(&self, from: u8) -> bool {
        self.status != Status::Normal || from == self.primary_of(self.view)
    }

    /// The canonical next op does not link to our last op: that op is not
    /// canonical (the canonical one is what it links to). Cut just it and
    /// repair from there; the ops below may be canonical (and committed),
    /// the next answer's link checks the next one.
    fn repair_mismatch(&mut self, out: &mut Outbox) {
        out.event(Event::Dropped {
            what: "prepares",
            reason: "does not link",
        });
        if self.log.op() > self.commit {
            let below = self.log.op() - 1;
            self.truncate_to(below, out);
        }
    }
}

/// A suffix is consecutive ops ending at `op` (or empty).
fn suffix_ok(suffix: &[BatchHeader], op: u64) -> bool {
    let consecutive = suffix
        .windows(2)
        .all(|w| w[1].vsr_op == w[0].vsr_op + 1 && w[1].prev_checksum == w[0].header_checksum);
    consecutive && suffix.last().is_none_or(|h| h.vsr_op == op)
}
