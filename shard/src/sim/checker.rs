//! The safety checks, run after every step of any replica. Each names what
//! it guards against; a failure carries the check's name and the details.
//!
//! The checker reads replicas through their public accessors and stores
//! through the sim's per-replica model of what each store was given (see
//! `node.rs`), which is itself checked against the store at every reboot
//! and read back byte for byte at the end.

use std::collections::{BTreeMap, BTreeSet};

use crate::vsr::{Body, Message, Replica, Status, Token};

/// A failed check: which one, and what it saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub check: &'static str,
    pub detail: String,
}

pub fn violation(check: &'static str, detail: String) -> Violation {
    Violation { check, detail }
}

/// One acknowledged append.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ack {
    pub op: u64,
    pub checksum: u64,
    pub token: Token,
}

/// What a replica's store holds durably, as the checker needs it.
pub trait DurableView {
    /// Whether op `op` with header checksum `checksum` is durable there.
    fn holds_durably(&self, op: u64, checksum: u64) -> bool;
    /// Whether it held that op durably on its disk now, or on the disk its
    /// last wipe lost (a PrepareOk sent before a wipe is a valid vote).
    fn voted_durably(&self, op: u64, checksum: u64) -> bool;
    /// Whether it held that op durably until a purge dropped it (a
    /// committed op: a PrepareOk re-acking it is still a true vote).
    fn purged_durably(&self, op: u64, checksum: u64) -> bool;
    /// The durable VSR state in its superblock (None while it has no store).
    fn superblock_vsr(&self) -> Option<ringlog_storage::superblock::VsrState>;
}

#[derive(Debug, Default)]
pub struct Checker {
    /// Every op some replica committed or a primary acknowledged, with its
    /// header checksum: one checksum per op, ever.
    committed: BTreeMap<u64, u64>,
    /// The replica that was the normal primary of each view.
    primaries: BTreeMap<u32, u8>,
    /// Views whose primary's log was checked against `committed_view`.
    primaries_checked: BTreeSet<u32>,
    /// Op -> the lowest view in which a replica had it committed.
    committed_view: BTreeMap<u64, u32>,
    /// Per replica: commits up to here are recorded.
    seen_commit: Vec<u64>,
    pub acked: Vec<Ack>,
}

impl Checker {
    pub fn new(n: u8) -> Self {
        Self {
            seen_commit: vec![0; usize::from(n)],
            ..Self::default()
        }
    }

    pub fn committed(&self) -> &BTreeMap<u64, u64> {
        &self.committed
    }

    /// A replica booted: its commits are recorded from its journal's start.
    pub fn booted(&mut self, r: u8, commit_from: u64) {
        self.seen_commit[usize::from(r)] = commit_from;
    }

    /// Guards against: two replicas committing different batches at one op
    /// (a forked log), two primaries in one view, and a new primary whose
    /// log lacks an op committed in an older view (a view change lost it;
    /// its old holders would refuse that view forever).
    pub fn after_step(&mut self, r: u8, replica: &Replica) -> Result<(), Violation> {
        let view = replica.view();
        let seen = &mut self.seen_commit[usize::from(r)];
        let from = (*seen).min(replica.commit());
        *seen = replica.commit();
        for op in from + 1..=replica.commit() {
            if let Some(checksum) = replica.checksum_at(op) {
                self.record(op, checksum, r)?;
                let first = self.committed_view.entry(op).or_insert(view);
                *first = (*first).min(view);
            }
        }
        if replica.status() == Status::Normal && replica.is_primary() {
            let first = *self.primaries.entry(view).or_insert(r);
            if first != r {
                let detail =
                    format!("replicas {first} and {r} were both normal primary of view {view}");
                return Err(violation("one primary per view", detail));
            }
            if self.primaries_checked.insert(view) {
                self.check_new_primary(r, replica)?;
            }
        }
        Ok(())
    }

    /// A primary's log only grows while it is normal, so this runs once, when
    /// it becomes normal. An op seen committed by a replica in view w was
    /// decided in a view at most w: below `view`, every DoViewChange quorum
    /// of `view` holds it.
    fn check_new_primary(&self, r: u8, replica: &Replica) -> Result<(), Violation> {
        let view = replica.view();
        let older = self
            .committed_view
            .iter()
            .rev()
            .find(|&(_, &w)| w < view)
            .map(|(&op, _)| op);
        match older {
            Some(op) if replica.op() < op => {
                let detail = format!(
                    "replica {r} leads view {view} with its log ending at op {}, below op {op} \
                     committed in an older view",
                    replica.op()
                );
                Err(violation("a new primary holds every committed op", detail))
            }
            _ => Ok(()),
        }
    }

    fn record(&mut self, op: u64, checksum: u64, r: u8) -> Result<(), Violation> {
        let known = *self.committed.entry(op).or_insert(checksum);
        if known != checksum {
            let detail = format!(
                "replica {r} committed op {op} as {checksum:#x}, already committed as {known:#x}"
            );
            return Err(violation("committed ops agree", detail));
        }
        Ok(())
    }

    /// Guards against: an acknowledgement for a batch that is not durable on
    /// a quorum (ack before fsync, a vote counted twice), or that differs
    /// from what was committed at its op.
    pub fn on_ack(
        &mut self,
        primary: u8,
        ack: Ack,
        stores: &[&dyn DurableView],
        quorum: usize,
    ) -> Result<(), Violation> {
        self.record(ack.op, ack.checksum, primary)?;
        let holders = stores
            .iter()
            .filter(|s| s.voted_durably(ack.op, ack.checksum))
            .count();
        if holders < quorum {
            let detail = format!(
                "replica {primary} acknowledged op {} (token {}) held durably by {holders} \
                 replicas, quorum {quorum}",
                ack.op, ack.token
            );
            return Err(violation("acked op durable on a quorum", detail));
        }
        self.acked.push(ack);
        Ok(())
    }

    /// Guards against: a message leaving before what it depends on is
    /// durable: its view in the superblock; the log_view a DoViewChange,
    /// StartView or PrepareOk vouches for; PrepareOk(op) before that op's
    /// fdatasync completed.
    pub fn on_send(&self, r: u8, msg: &Message, store: &dyn DurableView) -> Result<(), Violation> {
        let Some(sb) = store.superblock_vsr() else {
            let detail = format!("replica {r} sent {} with no store", msg.body.name());
            return Err(violation("durable before send", detail));
        };
        let what = msg.body.name();
        if msg.view > sb.view {
            let detail = format!(
                "replica {r} sent {what} of view {} with view {} durable",
                msg.view, sb.view
            );
            return Err(violation("view durable before send", detail));
        }
        let vouched = match &msg.body {
            Body::DoViewChange(d) => Some(d.log_view),
            Body::StartView(_) | Body::PrepareOk(_) => Some(msg.view),
            _ => None,
        };
        if let Some(log_view) = vouched.filter(|&lv| lv > sb.log_view) {
            let detail = format!(
                "replica {r} sent {what} vouching for log_view {log_view} with log_view {} durable",
                sb.log_view
            );
            return Err(violation("log_view durable before send", detail));
        }
        if let Body::PrepareOk(ok) = &msg.body {
            let (op, checksum) = (ok.op, ok.prepare_checksum);
            if !store.holds_durably(op, checksum) && !store.purged_durably(op, checksum) {
                let detail = format!(
                    "replica {r} sent PrepareOk for op {} ({:#x}) before it was durable",
                    ok.op, ok.prepare_checksum
                );
                return Err(violation("PrepareOk after fsync", detail));
            }
        }
        Ok(())
    }

    /// Guards against: a replica cutting an op that is committed (with the
    /// committed checksum) from its log. Ops an operator purge dropped
    /// (through `purged_through`) are gone by intent: cutting them is not.
    pub fn on_truncate(
        &self,
        r: u8,
        cut_above: u64,
        held: &BTreeMap<u64, u64>,
        purged_through: u64,
    ) -> Result<(), Violation> {
        let from = cut_above.max(purged_through) + 1;
        for (&op, &checksum) in held.range(from..) {
            if self.committed.get(&op) == Some(&checksum) {
                let detail = format!(
                    "replica {r} cuts above op {cut_above}, losing committed op {op} ({checksum:#x})"
                );
                return Err(violation("committed ops never cut", detail));
            }
        }
        Ok(())
    }
}
