//! The metadata group in the simulator ([`crate::sim::run_meta`]): the
//! group's replicas are the simulated replicas, its client submits
//! metadata commands (create, delete, purge of a small pool of topics,
//! some refused by design) through each node's [`MetaHost`] instead of
//! data batches, and every node applies its committed ops to its own
//! table. The partition run's faults all apply (network, crashes at any
//! I/O, torn writes, wipes); transfers, purges and hostile peers are off.
//!
//! Model of the host's own state: its table and its local partitions
//! survive a crash (as if persisted with each apply); a wipe loses both,
//! and the node installs a snapshot of the most advanced up peer's table
//! (through the snapshot codec), or, with no peer up, starts empty. After
//! a boot the host is fed the ops its replica commits from its recovered
//! commit on: ops at or below its table's version are replays, which apply
//! must ignore.
//!
//! Guards against: tables differing at the same op (on any node, ever);
//! a command applied twice or at another op than the one acknowledged;
//! an acknowledged command never applied; local partition actions that do
//! not take a node to its placement; a table behind its replica's commit
//! at the end.

use std::collections::BTreeMap;
use std::fmt;

use crate::meta::{
    command_batch, Applied, Change, Command, LocalAction, LocalPartition, MetaHost, MetaTable,
    Role, RouteError,
};
use crate::vsr::BatchBytes;

use super::*;

/// The topic names the client uses: few, so creates collide with
/// existing topics and deletes and purges find them.
const NAMES: &[&str] = &["t0", "t1", "t2", "t3", "t4", "t5"];
/// Partitions per created topic at most (placement diffs stay small).
const PARTITIONS_PER_TOPIC_MAX: u64 = 4;

/// What a metadata run hit.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct MetaCounts {
    /// Commands submitted to a primary's replica.
    pub submitted: u64,
    /// Answered not-primary (the client then asks the named node).
    pub not_primary: u64,
    /// No primary at the node asked (a view change or recovery).
    pub no_primary: u64,
    /// Refused by the host before submitting (against its table then).
    pub refused_early: u64,
    /// Ops applied, summed over the nodes.
    pub ops_applied: u64,
    /// Distinct ops applied (the outcomes below count each op once).
    pub ops_committed: u64,
    /// Replayed ops the tables ignored (at or below their version).
    pub ops_stale: u64,
    pub created: u64,
    pub deleted: u64,
    pub purged: u64,
    /// Commands committed but refused by the table at apply.
    pub refused_at_apply: u64,
    pub local_actions: u64,
    /// Wiped nodes that installed a peer's table snapshot.
    pub snapshot_installs: u64,
}

impl MetaCounts {
    pub fn add(&mut self, o: &MetaCounts) {
        let pairs = [
            (&mut self.submitted, o.submitted),
            (&mut self.not_primary, o.not_primary),
            (&mut self.no_primary, o.no_primary),
            (&mut self.refused_early, o.refused_early),
            (&mut self.ops_applied, o.ops_applied),
            (&mut self.ops_committed, o.ops_committed),
            (&mut self.ops_stale, o.ops_stale),
            (&mut self.created, o.created),
            (&mut self.deleted, o.deleted),
            (&mut self.purged, o.purged),
            (&mut self.refused_at_apply, o.refused_at_apply),
            (&mut self.local_actions, o.local_actions),
            (&mut self.snapshot_installs, o.snapshot_installs),
        ];
        for (sum, x) in pairs {
            *sum += x;
        }
    }
}

impl fmt::Display for MetaCounts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "meta: submitted {} not_primary {} no_primary {} refused_early {} ops_committed {} \
             ops_applied {} ops_stale {} created {} deleted {} purged {} refused_at_apply {} local_actions {} \
             snapshot_installs {}",
            self.submitted,
            self.not_primary,
            self.no_primary,
            self.refused_early,
            self.ops_committed,
            self.ops_applied,
            self.ops_stale,
            self.created,
            self.deleted,
            self.purged,
            self.refused_at_apply,
            self.local_actions,
            self.snapshot_installs
        )
    }
}

/// The metadata side of a cluster run.
pub struct MetaSim {
    hosts: Vec<MetaHost>,
    /// Per node: the partitions its local actions created, by id.
    local: Vec<BTreeMap<u32, LocalPartition>>,
    /// Per node: ops up to here were fed to its host since its boot.
    fed: Vec<u64>,
    /// Every batch any replica appended, by (op, header checksum): what a
    /// committed op's bytes were, whichever replica's journal pruned it.
    bodies: BTreeMap<(u64, u64), BatchBytes>,
    /// Op -> the digest of the table right after it, as first applied.
    digests: BTreeMap<u64, u64>,
    /// Request id -> the op its command was applied at.
    applied: BTreeMap<u64, u64>,
    pub counts: MetaCounts,
}

fn host_for(n: u8, r: u8) -> Result<MetaHost, Violation> {
    let nodes: Vec<u32> = (0..u32::from(n)).collect();
    let table = MetaTable::new(&nodes).map_err(|e| violation("meta setup", e.to_string()))?;
    // 1..=3 shards: the shard of a partition differs between nodes.
    let shards = 1 + u16::from(r % 3);
    MetaHost::new(u32::from(r), shards, PARTITION_ID, table)
        .map_err(|e| violation("meta setup", e.to_string()))
}

impl MetaSim {
    pub fn new(n: u8) -> Result<MetaSim, Violation> {
        let hosts = (0..n).map(|r| host_for(n, r)).collect::<Result<_, _>>()?;
        Ok(MetaSim {
            hosts,
            local: vec![BTreeMap::new(); usize::from(n)],
            fed: vec![0; usize::from(n)],
            bodies: BTreeMap::new(),
            digests: BTreeMap::new(),
            applied: BTreeMap::new(),
            counts: MetaCounts::default(),
        })
    }
}

/// A command drawn from the seed: mostly valid, some refused by design
/// (replication factor 0 or over the node count, a bad name).
fn draw_command(rng: &mut Rng, n: u8) -> Command {
    let name = match rng.below(20) {
        0 => "bad/name".to_string(),
        _ => NAMES[rng.below(NAMES.len() as u64) as usize].to_string(),
    };
    match rng.below(4) {
        0 | 1 => {
            // Odd and at most n, but for the refused 0, 2 and n + 2.
            let replication_factor = match rng.below(10) {
                0 => 0,
                1 => 2,
                2 => n + 2,
                _ => 1 + 2 * rng.below(u64::from(n).div_ceil(2)) as u8,
            };
            let partitions = 1 + rng.below(PARTITIONS_PER_TOPIC_MAX) as u32;
            Command::CreateTopic {
                name,
                partitions,
                replication_factor,
            }
        }
        2 => Command::DeleteTopic { name },
        _ => Command::PurgeTopic { name },
    }
}

impl Cluster {
    /// Switches this run to a metadata group (before the first tick).
    pub fn enable_meta(&mut self) -> Result<(), Violation> {
        self.meta = Some(MetaSim::new(self.n)?);
        Ok(())
    }

    /// The batch for the client's `token` at node `to`, as its host
    /// routes it; None when the host answered instead (not primary, no
    /// primary, refused), the client learning the primary it names.
    pub(super) fn meta_batch(&mut self, to: u8, token: Token) -> Option<Vec<u8>> {
        let n = self.n;
        let cmd = draw_command(&mut self.rng, n);
        let role = Role::of(self.nodes[usize::from(to)].replica.as_ref()?);
        let meta = self.meta.as_mut()?;
        // Now and then a host submits without its early check, so the
        // table's own refusals are reached too.
        let routed = match self.rng.below(4) {
            0 if role.status == Status::Normal && role.primary == role.replica => {
                command_batch(PARTITION_ID, &[(token, cmd.clone())]).map_err(RouteError::from)
            }
            _ => meta.hosts[usize::from(to)].route(token, &cmd, role),
        };
        let outcome = match &routed {
            Ok(_) => "submitted".to_string(),
            Err(e) => e.to_string(),
        };
        self.trace.line(
            self.tick,
            format_args!("meta R{to} token {token} {cmd:?}: {outcome}"),
        );
        match routed {
            Ok(batch) => {
                meta.counts.submitted += 1;
                Some(batch)
            }
            Err(RouteError::NotPrimary { primary, .. }) => {
                meta.counts.not_primary += 1;
                // Node ids are replica indexes here.
                self.client.believed_primary = primary as u8;
                None
            }
            Err(RouteError::NoPrimary { .. }) => {
                meta.counts.no_primary += 1;
                None
            }
            Err(RouteError::Refused(_) | RouteError::Encode(_)) => {
                meta.counts.refused_early += 1;
                None
            }
        }
    }

    /// Keeps the bytes of every appended batch (see `MetaSim::bodies`).
    pub(super) fn meta_appended(&mut self, batch: &BatchBytes) {
        let Some(meta) = self.meta.as_mut() else {
            return;
        };
        if let Ok(h) = BatchHeader::decode(batch) {
            meta.bodies
                .entry((h.vsr_op, h.header_checksum))
                .or_insert_with(|| batch.clone());
        }
    }

    /// A node booted: a wipe lost its table and partitions (it installs a
    /// peer's snapshot); either way its host is fed from its replica's
    /// recovered commit on.
    pub(super) fn meta_booted(&mut self, r: u8, wiped: bool) -> Result<(), Violation> {
        let Some(meta) = self.meta.as_mut() else {
            return Ok(());
        };
        let i = usize::from(r);
        let commit = self.nodes[i].replica.as_ref().map_or(0, |x| x.commit());
        if !wiped {
            // Below the table's version: replays. Never past it: no gap.
            meta.fed[i] = commit.min(meta.hosts[i].table().version());
            return Ok(());
        }
        meta.fed[i] = commit;
        meta.hosts[i] = host_for(self.n, r)?;
        meta.local[i].clear();
        let donor = (0..self.nodes.len())
            .filter(|&j| j != i && self.nodes[j].is_up())
            .max_by_key(|&j| (meta.hosts[j].table().version(), std::cmp::Reverse(j)));
        let Some(j) = donor.filter(|&j| meta.hosts[j].table().version() > 0) else {
            return Ok(());
        };
        let snapshot = meta.hosts[j].table().encode_snapshot();
        let actions = meta.hosts[i]
            .install(&snapshot)
            .map_err(|e| violation("meta snapshot installs", format!("R{r} from R{j}: {e}")))?;
        meta.counts.snapshot_installs += 1;
        self.trace.line(
            self.tick,
            format_args!(
                "meta R{r} installs R{j}'s table at {}",
                meta.hosts[i].table().version()
            ),
        );
        meta_follow(meta, r, actions)
    }

    /// Feeds node `r`'s host the ops its replica committed since the last
    /// feed, checking each apply.
    pub(super) fn meta_after_step(&mut self, r: u8) -> Result<(), Violation> {
        let i = usize::from(r);
        let (Some(meta), Some(replica)) = (self.meta.as_mut(), self.nodes[i].replica.as_ref())
        else {
            return Ok(());
        };
        while meta.fed[i] < replica.commit() {
            let op = meta.fed[i] + 1;
            let checksum = replica
                .checksum_at(op)
                .or_else(|| self.checker.committed().get(&op).copied());
            let batch = checksum.and_then(|c| meta.bodies.get(&(op, c)));
            let Some(batch) = batch else {
                let detail = format!("R{r} committed op {op} ({checksum:?}) never appended");
                return Err(violation("meta committed op known", detail));
            };
            let (applied, actions) = meta.hosts[i]
                .apply(batch)
                .map_err(|e| violation("meta committed ops apply", format!("R{r} op {op}: {e}")))?;
            meta.fed[i] = op;
            meta_applied(meta, r, applied)?;
            meta_follow(meta, r, actions)?;
        }
        Ok(())
    }

    /// The end of a converged run: every up node's table at its replica's
    /// commit, all equal, and each acknowledged command applied at its op.
    pub(super) fn meta_check_final(&mut self) -> Result<(), Violation> {
        let Some(meta) = self.meta.as_ref() else {
            return Ok(());
        };
        for (i, x) in self.nodes.iter().enumerate() {
            let Some(replica) = x.replica.as_ref() else {
                continue;
            };
            let table = meta.hosts[i].table();
            if table.version() != replica.commit() {
                let detail = format!(
                    "R{i}'s table at {}, its replica committed {}",
                    table.version(),
                    replica.commit()
                );
                return Err(violation("meta tables follow the commit", detail));
            }
            let first = meta.digests.get(&table.version());
            if table.version() > 0 && first != Some(&table.digest()) {
                let detail = format!("R{i}'s table differs from the first at {}", table.version());
                return Err(violation("meta tables agree at each op", detail));
            }
        }
        for ack in &self.checker.acked {
            if meta.applied.get(&ack.token) != Some(&ack.op) {
                let detail = format!(
                    "token {} acked at op {}, applied at {:?}",
                    ack.token,
                    ack.op,
                    meta.applied.get(&ack.token)
                );
                return Err(violation("acked meta command applied once", detail));
            }
        }
        Ok(())
    }
}

/// Checks one applied op: the table's digest agrees with every other
/// node's at that op; each command in it is applied at this op only.
fn meta_applied(meta: &mut MetaSim, r: u8, applied: Applied) -> Result<(), Violation> {
    let i = usize::from(r);
    let (op, outcomes) = match applied {
        Applied::Stale { .. } => {
            meta.counts.ops_stale += 1;
            return Ok(());
        }
        Applied::Done { op, outcomes } => (op, outcomes),
    };
    debug_assert_eq!(meta.hosts[i].table().version(), op);
    let digest = meta.hosts[i].table().digest();
    let first_apply = !meta.digests.contains_key(&op);
    let first = *meta.digests.entry(op).or_insert(digest);
    if first != digest {
        let detail = format!("R{r}'s table after op {op} differs from the first one applied");
        return Err(violation("meta tables agree at each op", detail));
    }
    meta.counts.ops_applied += 1;
    meta.counts.ops_committed += u64::from(first_apply);
    for o in outcomes {
        let Some(id) = o.request_id else {
            return Err(violation(
                "meta commands decode",
                format!("op {op}: no request id"),
            ));
        };
        let at = *meta.applied.entry(id).or_insert(op);
        if at != op {
            let detail = format!("request {id} applied at op {at} and op {op}");
            return Err(violation("acked meta command applied once", detail));
        }
        match o.result {
            _ if !first_apply => {}
            Ok(Change::Created { .. }) => meta.counts.created += 1,
            Ok(Change::Deleted { .. }) => meta.counts.deleted += 1,
            Ok(Change::Purged { .. }) => meta.counts.purged += 1,
            Err(_) => meta.counts.refused_at_apply += 1,
        }
    }
    Ok(())
}

/// Carries out `actions` on node `r`'s partitions and checks they took it
/// to its placement per its table.
fn meta_follow(meta: &mut MetaSim, r: u8, actions: Vec<LocalAction>) -> Result<(), Violation> {
    let i = usize::from(r);
    meta.counts.local_actions += actions.len() as u64;
    let local = &mut meta.local[i];
    for a in actions {
        let ok = match a {
            LocalAction::Create(p) => local.insert(p.partition_id, p).is_none(),
            LocalAction::Delete(p) => local.remove(&p.partition_id).is_some(),
            LocalAction::Purge(p) => local.insert(p.partition_id, p).is_some(),
        };
        if !ok {
            let detail = format!("R{r}: an action on a partition in the wrong state");
            return Err(violation("meta local actions follow placement", detail));
        }
    }
    if *local != meta.hosts[i].local_partitions() {
        let detail = format!("R{r}'s partitions differ from its table's placement");
        return Err(violation("meta local actions follow placement", detail));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::Outcome;

    /// A calm 3-replica metadata run that committed some ops.
    fn running() -> Cluster {
        let mut opts = SimOptions::new(11);
        opts.faults = false;
        let mut c = Cluster::new(&opts, 3).expect("cluster");
        c.calm_faults();
        c.rates.append_per_mille = 500;
        c.enable_meta().expect("meta");
        c.run_faulty(300).expect("calm run passes");
        let m = c.meta.as_ref().expect("meta");
        assert!(m.counts.ops_committed > 5, "{}", m.counts);
        c
    }

    /// Applies to node `r`'s table a command its replica never committed.
    fn apply_rogue(meta: &mut MetaSim, r: u8) {
        let next = meta.hosts[usize::from(r)].table().version() + 1;
        let cmd = Command::CreateTopic {
            name: "rogue".into(),
            partitions: 1,
            replication_factor: 1,
        };
        let mut batch = command_batch(PARTITION_ID, &[(u64::MAX, cmd)]).expect("batch");
        let stamp = ringlog_protocol::Stamp {
            vsr_op: next,
            ..Default::default()
        };
        ringlog_protocol::restamp(&mut batch, &stamp).expect("restamp");
        let (_, actions) = meta.hosts[usize::from(r)].apply(&batch).expect("applies");
        meta_follow(meta, r, actions).expect("its partitions follow its table");
    }

    /// Guards against: the digest check missing a table that diverged.
    #[test]
    fn a_diverged_table_is_caught() {
        let mut c = running();
        apply_rogue(c.meta.as_mut().expect("meta"), 1);
        let v = c.run_faulty(300).expect_err("divergence caught");
        assert_eq!(v.check, "meta tables agree at each op", "{}", v.detail);
    }

    /// Guards against: one command applied at two ops going unnoticed.
    #[test]
    fn a_command_applied_twice_is_caught() {
        let mut c = running();
        let meta = c.meta.as_mut().expect("meta");
        let (&id, &op) = meta.applied.iter().next().expect("an applied command");
        let again = Applied::Done {
            op: meta.hosts[0].table().version(),
            outcomes: vec![Outcome {
                request_id: Some(id),
                result: Ok(Change::Deleted { name: "t0".into() }),
            }],
        };
        assert_ne!(op, meta.hosts[0].table().version(), "pick an older command");
        let v = meta_applied(meta, 0, again).expect_err("caught");
        assert_eq!(v.check, "acked meta command applied once");
    }

    /// Guards against: a node whose partitions drift from its placement
    /// (an action lost, or one on a partition it does not have).
    #[test]
    fn local_partitions_off_placement_are_caught() {
        let mut c = running();
        let meta = c.meta.as_mut().expect("meta");
        let r = (0..3u8)
            .find(|&r| !meta.local[usize::from(r)].is_empty())
            .expect("a node with partitions");
        let (_, p) = meta.local[usize::from(r)].pop_first().expect("a partition");
        let v = meta_follow(meta, r, Vec::new()).expect_err("lost action caught");
        assert_eq!(v.check, "meta local actions follow placement");
        let v = meta_follow(meta, r, vec![LocalAction::Delete(p)]).expect_err("caught");
        assert_eq!(v.check, "meta local actions follow placement");
    }

    /// Guards against: an acknowledged command that no table applied.
    #[test]
    fn an_acked_command_never_applied_is_caught() {
        let mut c = running();
        c.meta_check_final().expect("a calm run's tables agree");
        apply_rogue(c.meta.as_mut().expect("meta"), 2);
        let v = c.meta_check_final().expect_err("a table past its commit");
        assert_eq!(v.check, "meta tables follow the commit");
        // Hosts that lost their tables rebuild them from the log: the
        // same table at every op as first applied, the same commands.
        let old = c.meta.take().expect("meta");
        let mut fresh = MetaSim::new(3).expect("meta");
        fresh.bodies = old.bodies;
        fresh.digests = old.digests;
        fresh.applied = old.applied;
        c.meta = Some(fresh);
        for r in 0..3 {
            c.meta_after_step(r).expect("replays the log");
        }
        c.meta_check_final()
            .expect("tables rebuilt from the log agree");
        c.checker.acked.push(super::super::Ack {
            op: 1,
            checksum: 0,
            token: u64::MAX - 1,
        });
        let v = c.meta_check_final().expect_err("caught");
        assert_eq!(v.check, "acked meta command applied once");
    }
}
