//! Scenario tests of the replica's side of state transfer (DESIGN.md
//! section 7): a repair answered with RangeEvicted, and the boot onto an
//! installed snapshot. The install itself is the transfer module's
//! (vsr may not use it); here the driver's part is played by hand: the
//! superblock marked wiped, the store's log cut to the snapshot and the
//! replica rebooted on it with [`Replica::restart`].

use super::*;

/// Ops at or below this are retired on R0 and R1 (their reads of them
/// answer Evicted, as `replica_io::execute` does for a moved log start).
const RETIRED_MAX: u64 = 10;
/// Ops committed while R2 is cut off.
const COMMITTED: u64 = 20;
/// The last op of the snapshot R2 installs (sealed, below the commit).
const SNAPSHOT_OP: u64 = 15;

/// Replicas (a bit each) whose stores retired ops `..=RETIRED_MAX`.
const RETIRED_ON_R0_R1: u8 = 0b011;
const RETIRED_ON_R0: u8 = 0b001;

/// Like `Cluster::execute`, except that reads of retired ops on the
/// `retired` replicas answer Evicted.
fn execute(c: &mut Cluster, r: u8, op: &StorageOp, retired: u8) -> Result<IoOutcome, IoFailure> {
    match op {
        StorageOp::ReadBatches { op_min, op_max }
            if retired & (1 << r) != 0 && *op_min <= RETIRED_MAX =>
        {
            Ok(IoOutcome::Evicted(wire::RangeEvicted {
                op_min: *op_min,
                op_max: *op_max,
                op_held_min: RETIRED_MAX + 1,
                log_start_offset: RETIRED_MAX,
                purge_generation: 0,
                reason: wire::EvictedReason::Retired,
            }))
        }
        _ => c.node(r).execute(op),
    }
}

/// Delivers messages and completes every node's I/O until nothing moves,
/// R0 and R1 having retired ops.
fn settle(c: &mut Cluster) {
    settle_retired(c, RETIRED_ON_R0_R1);
}

fn settle_retired(c: &mut Cluster, retired: u8) {
    loop {
        if let Some((from, to, msg)) = c.net.pop_front() {
            let dropped = c.drop.as_ref().is_some_and(|d| d(from, to, &msg));
            if c.r_up(from) && c.r_up(to) && !dropped {
                c.step(to, Input::Message { from, msg });
            }
            continue;
        }
        let busy =
            (0..c.nodes.len() as u8).find(|&r| !c.nodes[usize::from(r)].pending_io.is_empty());
        let Some(r) = busy else {
            return;
        };
        let Some((id, op)) = c.node(r).pending_io.pop_front() else {
            return;
        };
        let result = execute(c, r, &op, retired);
        c.step(r, Input::IoDone { id, result });
    }
}

/// Three replicas with manual I/O; ops 1..=COMMITTED committed by R0 and
/// R1 (which retire per `retired`) while R2 is cut off.
fn committed_without_r2(retired: u8) -> Cluster {
    let mut c = Cluster::new(3);
    for r in 0..3 {
        c.node(r).auto_io = false;
    }
    c.drop = Some(Box::new(|from, to, _| from == 2 || to == 2));
    for token in 1..=COMMITTED {
        c.append(0, token, token as u8);
        settle_retired(&mut c, retired);
    }
    c
}

fn tick(c: &mut Cluster) {
    tick_retired(c, RETIRED_ON_R0_R1);
}

fn tick_retired(c: &mut Cluster, retired: u8) {
    for r in 0..c.nodes.len() as u8 {
        if c.r_up(r) {
            c.step(r, Input::Tick);
        }
    }
    settle_retired(c, retired);
}

fn transfer_needed(node: &Node) -> Option<wire::RangeEvicted> {
    node.events.iter().find_map(|e| match e {
        Event::TransferNeeded {
            trigger: Trigger::RangeEvicted | Trigger::Purged,
            evicted: Some((_, evicted)),
        } => Some(*evicted),
        _ => None,
    })
}

/// What the driver does around a transfer of ops `..=SNAPSHOT_OP` from
/// R0: the install's commit marks the superblock wiped; after it the
/// store holds only the snapshot (its own ops are gone), the superblock
/// the snapshot's commit, and the replica boots on the installed
/// frontier.
fn install_snapshot(c: &mut Cluster) -> Anchor {
    let snapshot: BTreeMap<u64, BatchBytes> = c.nodes[0]
        .ops
        .range(RETIRED_MAX + 1..=SNAPSHOT_OP)
        .map(|(op, b)| (*op, b.clone()))
        .collect();
    let last = BatchHeader::decode(&snapshot[&SNAPSHOT_OP]).expect("snapshot batch");
    // The installed frontier, as `transfer::Frontier` converts to it.
    let base = Anchor {
        op: last.vsr_op,
        checksum: last.header_checksum,
        next_offset: last.next_offset(),
    };
    let node = c.node(2);
    node.ops = snapshot;
    node.synced = SNAPSHOT_OP;
    node.vsr.commit = SNAPSHOT_OP;
    node.vsr.wiped = true;
    node.pending_io.clear();
    node.replica = Replica::restart(config(3, 2), 55, node.vsr, base, &[]).expect("config");
    node.sent.clear();
    base
}

/// Guards against: a backup whose repair peer retired the ops it needs
/// staying behind for good (before: the peer's read found nothing and
/// the answer was dropped, and a RangeEvicted was dropped as "not part of
/// this machine"), and a replica booted on an installed snapshot acking,
/// voting or leading before its log reaches the commit: it catches up by
/// transfer, repairs from the installed frontier (the first repaired op
/// links to the snapshot's last checksum) and only then acks.
#[test]
fn backup_whose_needed_ops_were_retired_catches_up_by_transfer_and_only_then_acks() {
    let mut c = committed_without_r2(RETIRED_ON_R0_R1);
    assert_eq!(c.r(0).commit(), COMMITTED);
    assert_eq!(c.r(2).op(), 0);
    // R2 comes back; R0 and R1 retired ops 1..=RETIRED_MAX meanwhile.
    c.drop = None;
    for _ in 0..40 {
        tick(&mut c);
        if transfer_needed(&c.nodes[2]).is_some() {
            break;
        }
    }
    let evicted = transfer_needed(&c.nodes[2]).expect("R2 is told its ops were retired");
    assert_eq!((evicted.op_min, evicted.op_held_min), (1, RETIRED_MAX + 1));
    assert_eq!(c.r(2).op(), 0, "nothing repaired without the evicted ops");

    let base = install_snapshot(&mut c);
    assert!(c.r(2).is_wiped(), "held back until its log is whole");
    let mut ticks = 0;
    while c.r(2).op() < COMMITTED || c.r(2).is_wiped() {
        tick(&mut c);
        ticks += 1;
        assert!(ticks < 300, "R2 did not repair onto its snapshot");
    }
    let kinds = c.nodes[2].sent_kinds();
    for k in ["prepare_ok", "start_view_change", "do_view_change"] {
        assert!(
            !kinds.contains(&k),
            "R2 sent {k} before its log was whole: {kinds:?}"
        );
    }
    let first = BatchHeader::decode(&c.nodes[2].ops[&(SNAPSHOT_OP + 1)]).expect("repaired op");
    // What `transfer::Frontier::closes_chain` checks.
    let closes = first.prev_checksum == base.checksum
        && first.base_offset == base.next_offset
        && first.vsr_op == base.op + 1;
    assert!(closes, "first repaired op links to the snapshot");
    for op in SNAPSHOT_OP + 1..=COMMITTED {
        assert_eq!(c.nodes[2].ops.get(&op), c.nodes[0].ops.get(&op), "op {op}");
    }
    // Whole again: it acks the next op like any backup.
    c.append(0, 100, 100);
    settle(&mut c);
    tick(&mut c);
    let acked = c.nodes[2]
        .sent
        .iter()
        .any(|(to, m)| *to == 0 && matches!(&m.body, Body::PrepareOk(p) if p.op == COMMITTED + 1));
    assert!(acked, "R2 acks op {} once whole", COMMITTED + 1);
    assert_eq!(c.r(0).commit(), COMMITTED + 1);
}

/// Guards against: a RangeEvicted for a range we no longer ask for (our
/// log moved since), or from a peer we did not ask, starting a transfer.
#[test]
fn stale_or_unasked_range_evicted_starts_no_transfer() {
    let mut c = Cluster::new(3);
    c.append(0, 1, 1);
    c.settle();
    c.tick(3);
    assert_eq!(c.r(2).op(), 1);
    let evicted = |op_min| wire::RangeEvicted {
        op_min,
        op_max: op_min + 4,
        op_held_min: op_min + 5,
        log_start_offset: 9,
        purge_generation: 0,
        reason: wire::EvictedReason::Retired,
    };
    let msg = |e| Message {
        view: 0,
        body: Body::RangeEvicted(e),
    };
    // R2 asked nobody: both are unasked; a range below its log is stale.
    c.step(
        2,
        Input::Message {
            from: 0,
            msg: msg(evicted(1)),
        },
    );
    c.step(
        2,
        Input::Message {
            from: 1,
            msg: msg(evicted(2)),
        },
    );
    assert!(
        transfer_needed(&c.nodes[2]).is_none(),
        "{:?}",
        c.nodes[2].events
    );
    let dropped = c.nodes[2]
        .events
        .iter()
        .filter(|e| {
            matches!(
                e,
                Event::Dropped {
                    what: "range_evicted",
                    ..
                }
            )
        })
        .count();
    assert_eq!(dropped, 2);
}

/// Guards against: a replica that must transfer (its repair peer retired
/// the ops it lacks) holding up a view change it is needed for. With R1
/// down, R0 needs R2's vote. R2 leads the view change of its turn, and
/// its repair of the canonical log from R0 answers RangeEvicted: its log
/// is an intact prefix (it only lacks retired ops), so it keeps voting,
/// passes the turn at once (it cannot finish the view) and never acks or
/// leads until the install and the repair after it. Before: it stayed
/// the new view's primary, retrying a repair that cannot succeed, until
/// the escalation timeout; a driver that froze it for the transfer left
/// R0 without a quorum and nobody Normal to offer a snapshot (sim seed
/// 8000652).
#[test]
fn a_replica_transferring_a_retired_range_still_votes_in_a_view_change() {
    let mut c = committed_without_r2(RETIRED_ON_R0_R1);
    assert_eq!(c.r(0).commit(), COMMITTED);
    // R1 goes down for good, R0 restarts (its superblock holds its
    // commit: a store retires, and offers, only ops it knows committed),
    // R2 comes back: the view moves only with R0 and R2.
    c.crash(1);
    c.crash(0);
    c.node(0).vsr.commit = COMMITTED;
    c.restart(0);
    c.drop = None;
    let mut ticks = 0;
    while transfer_needed(&c.nodes[2]).is_none() {
        tick(&mut c);
        ticks += 1;
        assert!(ticks < 2000, "R2 never learned it must transfer");
    }
    // The view R2 was in when it learned it: the last it entered before.
    let events = &c.nodes[2].events;
    let first = events
        .iter()
        .position(|e| matches!(e, Event::TransferNeeded { .. }))
        .expect("seen above");
    let view = events[..first]
        .iter()
        .rev()
        .find_map(|e| match e {
            Event::StatusChanged {
                status: Status::ViewChange,
                view,
            } => Some(*view),
            _ => None,
        })
        .expect("R2 was in a view change");
    assert_eq!(
        c.r(2).primary_of(view),
        2,
        "the scenario: R2 learns it as view {view}'s primary"
    );
    let sent_before = c.nodes[2]
        .sent
        .iter()
        .position(|(_, m)| m.view > view)
        .unwrap_or(c.nodes[2].sent.len());
    let mut ticks = 0;
    while !c.normal_primary(0) {
        tick(&mut c);
        ticks += 1;
        assert!(
            ticks < config(3, 2).view_change_escalate_ticks,
            "R2 held view {view} until the escalation"
        );
    }
    assert_eq!(c.r(0).view(), view + 1, "R2 passed its turn to R0");
    assert_eq!(c.r(0).op(), COMMITTED, "R0 leads with the committed ops");
    let kinds: Vec<&str> = c.nodes[2].sent[sent_before..]
        .iter()
        .map(|(_, m)| m.body.name())
        .collect();
    assert!(kinds.contains(&"do_view_change"), "R2 voted: {kinds:?}");
    for k in ["start_view", "prepare_ok"] {
        assert!(!kinds.contains(&k), "R2 sent {k} while it must transfer");
    }
    assert!(c.r(2).is_transferring() && c.r(2).op() == 0);

    // The install and the repair after it make R2 whole: R0 commits again
    // with R2's ack, R1 still down.
    install_snapshot(&mut c);
    let mut ticks = 0;
    while c.r(2).op() < COMMITTED || c.r(2).is_wiped() {
        tick(&mut c);
        ticks += 1;
        assert!(ticks < 300, "R2 did not repair onto its snapshot");
    }
    c.append(0, 100, 100);
    settle(&mut c);
    tick(&mut c);
    assert_eq!(c.r(0).commit(), COMMITTED + 1, "committed with R2's ack");
    assert_eq!(c.r(0).view(), view + 1);
}

/// Guards against: a replica whose repair peer (the primary) retired the
/// ops it lacks staying behind although another peer still holds them
/// (sim seed 8000836: three of five replicas asked only the primary,
/// which had retired them, while a backup held them in its unsealed
/// segment, so no snapshot could carry them either). While it must
/// transfer it rotates its repair peer; from a peer that is not the
/// primary it takes only ops the StartView's canonical headers name; the
/// first appended op ends the transfer and it acks like any backup.
#[test]
fn a_transferring_replica_repairs_from_a_peer_that_still_holds_the_ops() {
    let mut c = committed_without_r2(RETIRED_ON_R0);
    // R2 restarts and learns the view, with its canonical headers, from
    // R0, which retired the ops R2 lacks; R1 still holds them.
    c.crash(2);
    c.restart(2);
    c.drop = None;
    let mut ticks = 0;
    while c.r(2).op() < COMMITTED {
        tick_retired(&mut c, RETIRED_ON_R0);
        ticks += 1;
        assert!(ticks < 300, "R2 asked only the peer that retired its ops");
    }
    let evicted = transfer_needed(&c.nodes[2]).expect("R0 answered RangeEvicted");
    assert_eq!(evicted.op_min, 1);
    assert!(!c.r(2).is_transferring(), "its log grew: no transfer");
    for op in 1..=COMMITTED {
        assert_eq!(c.nodes[2].ops.get(&op), c.nodes[0].ops.get(&op), "op {op}");
    }
    // R1 goes down: the next op commits only with R2's ack.
    c.crash(1);
    c.append(0, 100, 100);
    settle_retired(&mut c, RETIRED_ON_R0);
    tick_retired(&mut c, RETIRED_ON_R0);
    assert_eq!(c.r(0).commit(), COMMITTED + 1, "committed with R2's ack");
}

/// Guards against: a rotated repair peer's own ops entering the log
/// unchecked. A backup that never got a StartView (cut off since the
/// view began) knows no canonical header for the ops it lacks; from a
/// peer other than the primary (whose log may hold uncommitted ops of an
/// older view that link all the same) it takes none of them, and waits
/// for the transfer.
#[test]
fn a_rotated_repair_peer_gives_only_ops_the_canonical_headers_name() {
    let mut c = committed_without_r2(RETIRED_ON_R0);
    c.drop = None;
    for _ in 0..200 {
        tick_retired(&mut c, RETIRED_ON_R0);
    }
    assert!(transfer_needed(&c.nodes[2]).is_some());
    let asked_r1 = c.nodes[2]
        .sent
        .iter()
        .any(|(to, m)| *to == 1 && m.body.name() == "request_prepares");
    assert!(asked_r1, "R2 rotated its repair to R1");
    let refused = c.nodes[2].events.iter().any(|e| {
        matches!(
            e,
            Event::Dropped {
                what: "prepares",
                reason: "no canonical header from this peer"
            }
        )
    });
    assert!(refused, "R1's answer came and was refused");
    assert_eq!(c.r(2).op(), 0, "nothing taken without a canonical header");
    assert!(c.r(2).is_transferring());
}

/// Guards against two transferring voters passing the primary's turn for
/// ever (sim seed 34001134): the primary R0 is gone, R1 is transferring
/// because its repair was stuck and R2 because its log is below a purge.
/// R1 leads at its turn (its stuck repair was of the old view's log; the
/// new one is the DoViewChange quorum's, here its own), and R2, still
/// transferring, follows it without leading.
#[test]
fn a_replica_stuck_on_repair_leads_at_its_turn_beside_another_transferring() {
    let mut c = Cluster::new(3);
    for token in 1..=5 {
        c.append(0, token, token as u8);
        c.settle();
    }
    assert_eq!(c.r(1).op(), 5);
    c.crash(0);
    c.node(1).replica.transferring = Some(Trigger::RepairStuck);
    c.node(2).replica.transferring = Some(Trigger::Purged);
    let ticks_max = 4 * config(3, 1).view_change_escalate_ticks;
    c.tick_until(ticks_max, |c| c.normal_primary(1));
    assert!(!c.r(1).is_transferring(), "R1 stopped transferring to lead");
    assert_eq!(c.r(1).op(), 5, "R1 leads with its whole log");
    assert!(c.r(2).is_transferring(), "R2's transfer is its own");
    assert!(!c.normal_primary(2), "a transferring replica never leads");
    let dropped = |r: u8, reason: &str| {
        c.nodes[usize::from(r)]
            .events
            .iter()
            .any(|e| matches!(e, Event::Dropped { reason: x, .. } if *x == reason))
    };
    assert!(dropped(1, "leads the view change instead"));
}
