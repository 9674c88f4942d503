//! Scenario tests of the purge replicated in the log ([`Input::ClientPurge`]):
//! the primary sequences it as an op and nothing after it until it
//! commits; every replica applies it ([`StorageOp::Purge`]) once, when it
//! commits it, before any op after it reaches its store.

use super::*;

/// The position of the first I/O of `r` matching `f`, if any.
fn io_at(c: &Cluster, r: u8, f: impl Fn(&StorageOp) -> bool) -> Option<usize> {
    c.nodes[usize::from(r)].io_log.iter().position(f)
}

fn purges_emitted(c: &Cluster, r: u8) -> usize {
    let log = &c.nodes[usize::from(r)].io_log;
    log.iter()
        .filter(|op| matches!(op, StorageOp::Purge { .. }))
        .count()
}

fn purge(c: &mut Cluster, r: u8, token: Token) {
    c.step(r, Input::ClientPurge { token });
}

/// Guards against: a purge that commits but is not applied on some
/// replica, or applied twice: two ops, a purge (op 3), one more op; every
/// replica emits exactly one Purge through op 3, before op 4's append,
/// its store ran it once and holds nothing through op 3, and op 4 links
/// to the purge op (the chain survives the purge).
#[test]
fn a_purge_op_commits_and_is_applied_once_on_every_replica() {
    let mut c = Cluster::new(3);
    c.append(0, 1, 1);
    c.append(0, 2, 2);
    purge(&mut c, 0, 3);
    c.settle();
    assert_eq!(ok_reply(&c.nodes[0], 3).op, 3, "the purge is op 3");
    c.append(0, 4, 4);
    c.settle();
    c.tick(4);
    assert_eq!(ok_reply(&c.nodes[0], 4).op, 4);
    for r in 0..3 {
        assert_eq!(c.r(r).commit(), 4, "R{r}");
        assert_eq!(purges_emitted(&c, r), 1, "R{r} purge emissions");
        let purge_at = io_at(&c, r, |op| *op == StorageOp::Purge { through_op: 3 });
        let append4 = io_at(&c, r, |op| matches!(op, StorageOp::Append { op: 4, .. }));
        assert!(
            purge_at.is_some() && purge_at < append4,
            "R{r}: purge after op 4"
        );
        let node = &c.nodes[usize::from(r)];
        assert_eq!(node.purges_run, 1, "R{r} store purges");
        assert_eq!(
            node.ops.keys().copied().collect::<Vec<_>>(),
            vec![4],
            "R{r}"
        );
        let h = node.headers();
        assert_eq!(h[0].prev_checksum, node.purged.expect("purged").checksum);
    }
}

/// Guards against: the primary sequencing past a purge op that has not
/// committed (a backup's store would then hold ops above an unapplied
/// purge, which the purge would drop): with the backups' I/O held, an
/// append after the purge waits in the queue, nothing is prepared after
/// it; once the purge commits the append is sequenced after it.
#[test]
fn a_primary_does_not_sequence_past_an_uncommitted_purge() {
    let mut c = Cluster::new(3);
    c.append(0, 1, 1);
    c.settle();
    c.node(1).auto_io = false;
    c.node(2).auto_io = false;
    purge(&mut c, 0, 2);
    c.append(0, 3, 3);
    c.settle();
    c.tick(6);
    assert_eq!(c.r(0).op(), 2, "sequenced past the uncommitted purge");
    assert_eq!(c.r(0).commit(), 1);
    let prepared_after = c.nodes[0]
        .sent
        .iter()
        .any(|(_, m)| matches!(&m.body, Body::Prepare(p) if p.op > 2));
    assert!(!prepared_after, "a prepare past the purge op");
    assert_eq!(purges_emitted(&c, 0), 0, "purged before the commit");
    c.node(1).auto_io = true;
    c.node(2).auto_io = true;
    c.settle();
    c.tick(4);
    assert_eq!(ok_reply(&c.nodes[0], 2).op, 2);
    assert_eq!(ok_reply(&c.nodes[0], 3).op, 3, "the append after the purge");
    let purge_at = io_at(&c, 0, |op| *op == StorageOp::Purge { through_op: 2 });
    let append3 = io_at(&c, 0, |op| matches!(op, StorageOp::Append { op: 3, .. }));
    assert!(purge_at.is_some() && purge_at < append3);
}

/// Guards against: a backup that learns of the op after a purge op
/// before it learns the purge committed (no Commit heartbeat reached it)
/// appending that op above the unapplied purge: the op proves the purge
/// committed, so it commits and applies the purge first.
#[test]
fn a_backup_applies_the_purge_before_the_op_after_it() {
    let mut c = Cluster::new(3);
    c.drop = Some(Box::new(|_, to, m| {
        to == 2 && matches!(m.body, Body::Commit(_))
    }));
    purge(&mut c, 0, 1);
    c.settle();
    assert_eq!(c.r(2).commit(), 0, "R2 learned the commit");
    assert_eq!(purges_emitted(&c, 2), 0);
    c.append(0, 2, 2);
    c.settle();
    assert_eq!(c.r(2).op(), 2);
    let purge_at = io_at(&c, 2, |op| *op == StorageOp::Purge { through_op: 1 });
    let append2 = io_at(&c, 2, |op| matches!(op, StorageOp::Append { op: 2, .. }));
    assert!(
        purge_at.is_some() && purge_at < append2,
        "R2 appended above it"
    );
    assert_eq!(c.nodes[2].purges_run, 1);
}

/// Guards against: a replica that crashed after it committed a purge op
/// but before its store ran the purge never applying it, or applying a
/// purge twice: R2 commits the purge, crashes with the Purge unrun,
/// restarts from its disk (the purge op its head, its commit below it)
/// and applies the purge once it commits it again; a second restart,
/// after the purge ran, boots above the purge and applies nothing.
#[test]
fn a_replica_restarted_before_applying_a_committed_purge_applies_it_once() {
    let mut c = Cluster::new(3);
    c.append(0, 1, 1);
    c.settle();
    c.tick(4);
    c.node(2).auto_io = false;
    purge(&mut c, 0, 2);
    // R2 appends and flushes the purge op, acks, then learns the commit.
    for _ in 0..100 {
        let node = &c.nodes[2];
        if node.replica.commit() >= 2 && node.synced >= 2 {
            break;
        }
        let next_purges = matches!(node.pending_io.front(), Some((_, StorageOp::Purge { .. })));
        if !next_purges {
            c.complete_io(2);
        }
        c.settle();
        c.tick(1);
    }
    assert!(
        c.nodes[2].synced >= 2 && c.r(2).commit() >= 2,
        "R2 never committed"
    );
    assert!(c.nodes[2]
        .pending_io
        .iter()
        .any(|(_, op)| *op == StorageOp::Purge { through_op: 2 }));
    c.crash(2);
    assert_eq!(c.nodes[2].purges_run, 0);
    c.restart(2);
    c.node(2).auto_io = true;
    c.tick_until(100, |c| {
        c.r(2).status() == Status::Normal && c.r(2).commit() >= 2
    });
    c.settle();
    assert_eq!(c.nodes[2].purges_run, 1, "applied after the restart");
    assert!(c.nodes[2].ops.is_empty(), "purged ops held");
    c.append(0, 3, 3);
    c.settle();
    c.tick(4);
    c.crash(2);
    c.restart(2);
    c.tick_until(100, |c| {
        c.r(2).status() == Status::Normal && c.r(2).commit() >= 3
    });
    c.settle();
    assert_eq!(c.nodes[2].purges_run, 1, "applied twice");
    assert_eq!(c.nodes[2].ops.keys().copied().collect::<Vec<_>>(), vec![3]);
}

/// Guards against: a restarted replica taking a purge op below an op
/// after it for uncommitted (it would wait for a commit it has, and its
/// primary could not sequence): booted with ops after the purge op, the
/// purge op counts as committed and no Purge is emitted for it again.
#[test]
fn a_replica_booted_above_a_purge_op_counts_it_committed() {
    let mut c = Cluster::new(3);
    purge(&mut c, 0, 1);
    c.settle();
    c.append(0, 2, 2);
    c.settle();
    // The headers of ops 1 (the purge) and 2, as a store holding them shows.
    let booted: Vec<BatchHeader> = c.nodes[0]
        .io_log
        .iter()
        .filter_map(|op| match op {
            StorageOp::Append { batch, .. } => BatchHeader::decode(batch).ok(),
            _ => None,
        })
        .collect();
    assert_eq!(booted.len(), 2);
    assert!(booted[0].is_purge() && !booted[1].is_purge());
    let vsr = VsrState::default();
    let r = Replica::restart(config(3, 1), 5, vsr, Anchor::default(), &booted).expect("boots");
    assert_eq!(r.commit(), 1, "the purge op below op 2 is committed");
    let head_only =
        Replica::restart(config(3, 1), 5, vsr, Anchor::default(), &booted[..1]).expect("boots");
    assert_eq!(
        head_only.commit(),
        0,
        "a purge op at the head is not known committed"
    );
}

/// Guards against: a producer purging the partition by setting the purge
/// attribute on its own batch: only `ClientPurge` sequences a purge.
#[test]
fn a_producer_batch_with_the_purge_attribute_is_refused() {
    let mut c = Cluster::new(3);
    let mut b = batch(1);
    let mut h = BatchHeader::decode(&b).expect("valid");
    h.attributes = ringlog_protocol::batch::ATTR_PURGE;
    let head = b.first_chunk_mut().expect("a header");
    ringlog_protocol::batch::encode_header(&h, head);
    c.step(
        0,
        Input::ClientAppend {
            token: 1,
            batch: b.into(),
        },
    );
    c.settle();
    assert!(matches!(
        c.nodes[0].replies.as_slice(),
        [(1, Err(AppendError::InvalidBatch(_)))]
    ));
    assert_eq!(c.r(0).op(), 0, "sequenced");
}
