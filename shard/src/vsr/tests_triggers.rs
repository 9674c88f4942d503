//! Scenario tests of the transfer triggers the replica raises besides
//! RangeEvicted (DESIGN.md section 7): a wiped replica far behind
//! ([`Trigger::NewOrWiped`]) and a repair that makes no progress
//! ([`Trigger::RepairStuck`]). Each is raised when it should, not while
//! repair is progressing, and once per episode.

use std::cell::Cell;
use std::rc::Rc;

use super::*;

/// Ops committed before the scenarios' trouble starts.
const OPS: u64 = 40;

fn triggers_of(node: &Node, trigger: Trigger) -> usize {
    node.events
        .iter()
        .filter(|e| matches!(e, Event::TransferNeeded { trigger: t, .. } if *t == trigger))
        .count()
}

fn sent(node: &Node, kind: &str) -> usize {
    node.sent
        .iter()
        .filter(|(_, m)| m.body.name() == kind)
        .count()
}

/// Three replicas with `OPS` ops committed on all of them.
fn committed(n: u8) -> Cluster {
    let mut c = Cluster::new(n);
    for token in 1..=OPS {
        c.append(0, token, token as u8);
        c.settle();
    }
    c.tick(3);
    assert_eq!(c.r(0).commit(), OPS);
    c
}

/// Reboots R2 with its disk lost, its replica built from `cfg`.
fn wipe_with(c: &mut Cluster, cfg: Config) {
    c.wipe(2);
    c.node(2).replica = Replica::wiped(cfg, 77).expect("config");
    c.node(2).sent.clear();
    c.node(2).events.clear();
}

/// Guards against: a wiped replica far behind repairing every op one
/// round trip per `repair_batches_max` (issue 10: it installs a snapshot
/// instead). It learns the view, sees the gap is over
/// `wiped_repair_ops_max`, raises NewOrWiped once, asks for no op, acks
/// nothing and never votes; booted on the install (its superblock now
/// names the installed commit) it repairs the rest and does not ask again.
#[test]
fn a_wiped_replica_far_behind_transfers_instead_of_repairing() {
    let mut c = committed(3);
    let mut cfg = config(3, 2);
    cfg.wiped_repair_ops_max = Some(OPS / 4);
    wipe_with(&mut c, cfg.clone());
    c.tick_until(200, |c| c.r(2).is_transferring());
    // A primary-silent timeout sends it back to asking for the view (it
    // hears only heartbeats): still the one episode.
    c.tick(200);
    let r2 = &c.nodes[2];
    assert_eq!(triggers_of(r2, Trigger::NewOrWiped), 1, "{:?}", r2.events);
    assert_eq!(r2.replica.transfer_trigger(), Some(Trigger::NewOrWiped));
    for kind in [
        "request_prepares",
        "prepare_ok",
        "start_view_change",
        "do_view_change",
    ] {
        assert_eq!(sent(r2, kind), 0, "R2 sent {kind} while it waits");
    }
    assert_eq!(r2.replica.op(), 0, "nothing repaired op by op");

    // The driver's install of ops 1..=30 from R0 (see tests_transfer.rs).
    const SNAPSHOT_OP: u64 = 30;
    let last = BatchHeader::decode(&c.nodes[0].ops[&SNAPSHOT_OP]).expect("batch");
    let base = Anchor {
        op: SNAPSHOT_OP,
        checksum: last.header_checksum,
        next_offset: last.next_offset(),
    };
    let snapshot: BTreeMap<u64, BatchBytes> = c.nodes[0]
        .ops
        .range(..=SNAPSHOT_OP)
        .map(|(o, b)| (*o, b.clone()))
        .collect();
    let node = c.node(2);
    node.ops = snapshot;
    node.synced = SNAPSHOT_OP;
    node.vsr.commit = SNAPSHOT_OP;
    node.pending_io.clear();
    node.replica = Replica::restart(cfg, 78, node.vsr, base, &[]).expect("config");
    node.events.clear();
    c.tick_until(400, |c| c.r(2).op() == OPS && !c.r(2).is_wiped());
    assert_eq!(
        triggers_of(&c.nodes[2], Trigger::NewOrWiped),
        0,
        "asked again"
    );
    assert!(!c.r(2).is_transferring());
    assert_eq!(c.nodes[2].ops, c.nodes[0].ops);
}

/// The other side of the threshold: a gap within `wiped_repair_ops_max`
/// is repaired (no transfer), as is any gap with the trigger off.
#[test]
fn a_wiped_replica_a_small_gap_behind_repairs() {
    for max in [Some(OPS), None] {
        let mut c = committed(3);
        let mut cfg = config(3, 2);
        cfg.wiped_repair_ops_max = max;
        wipe_with(&mut c, cfg);
        c.tick_until(400, |c| c.r(2).op() == OPS && !c.r(2).is_wiped());
        let r2 = &c.nodes[2];
        assert_eq!(triggers_of(r2, Trigger::NewOrWiped), 0, "max {max:?}");
        assert!(!r2.replica.is_transferring());
        assert!(sent(r2, "request_prepares") > 0);
    }
}

/// Cuts R2 off, commits more ops, then lets everything through except
/// R2's repair requests while `stall` is set.
fn behind_with_stalled_repair(stall: Rc<Cell<bool>>) -> Cluster {
    let mut c = committed(3);
    c.isolate(2);
    for token in OPS + 1..=2 * OPS {
        c.append(0, token, token as u8);
        c.settle();
    }
    c.drop = Some(Box::new(move |from, _, m| {
        from == 2 && m.body.name() == "request_prepares" && stall.get()
    }));
    c
}

/// Guards against: a backup whose repair never progresses (its peer
/// never answers) retrying forever with no way out (issue 10: after
/// `repair_stuck_rounds_max` rounds it transfers). Raised once per
/// episode; it keeps repairing meanwhile, and the first op that arrives
/// ends the episode (the host cancels the transfer), after which a new
/// stall is a new episode.
#[test]
fn a_stuck_repair_raises_repair_stuck_once_per_episode() {
    let stall = Rc::new(Cell::new(true));
    let mut c = behind_with_stalled_repair(stall.clone());
    c.node(2).events.clear();
    c.tick_until(400, |c| c.r(2).is_transferring());
    c.tick(200);
    assert_eq!(triggers_of(&c.nodes[2], Trigger::RepairStuck), 1);
    assert_eq!(c.r(2).transfer_trigger(), Some(Trigger::RepairStuck));
    let acks = sent(&c.nodes[2], "prepare_ok");
    c.append(0, 1000, 1);
    c.settle();
    assert_eq!(sent(&c.nodes[2], "prepare_ok"), acks, "acked while stuck");
    // Repair gets through: the episode ends.
    stall.set(false);
    c.tick_until(400, |c| c.r(2).op() == c.r(0).op());
    assert!(!c.r(2).is_transferring());
    assert_eq!(triggers_of(&c.nodes[2], Trigger::RepairStuck), 1);
    // A second stall is a second episode.
    stall.set(true);
    c.isolate(2);
    for token in 2000..2000 + OPS {
        c.append(0, token, token as u8);
        c.settle();
    }
    let stall2 = stall.clone();
    c.drop = Some(Box::new(move |from, _, m| {
        from == 2 && m.body.name() == "request_prepares" && stall2.get()
    }));
    c.tick_until(400, |c| c.r(2).is_transferring());
    assert_eq!(triggers_of(&c.nodes[2], Trigger::RepairStuck), 2);
}

/// The other side: a repair that progresses, however slowly (two of
/// every three requests lost, below the budget of three rounds in a
/// row), never raises RepairStuck.
#[test]
fn a_slow_repair_that_progresses_is_not_stuck() {
    let mut c = committed(3);
    let mut cfg = config(3, 2);
    cfg.repair_batches_max = 2;
    cfg.repair_stuck_rounds_max = Some(3);
    c.crash(2);
    c.restart(2);
    c.node(2).replica = {
        let node = &c.nodes[2];
        Replica::restart(cfg, 5, node.vsr, Anchor::default(), &node.headers()).expect("config")
    };
    c.isolate(2);
    for token in OPS + 1..=2 * OPS {
        c.append(0, token, token as u8);
        c.settle();
    }
    let asked = Cell::new(0u64);
    c.drop = Some(Box::new(move |from, _, m| {
        if from != 2 || m.body.name() != "request_prepares" {
            return false;
        }
        asked.set(asked.get() + 1);
        !asked.get().is_multiple_of(3)
    }));
    c.node(2).events.clear();
    c.tick_until(2000, |c| c.r(2).op() == 2 * OPS);
    assert_eq!(triggers_of(&c.nodes[2], Trigger::RepairStuck), 0);
    let asked = sent(&c.nodes[2], "request_prepares");
    assert!(asked > OPS as usize, "{asked} requests: two of three lost");
}

/// Guards against: a replica whose store was set aside as corrupt
/// repairing only what it thinks it lacks, or waiting for a gap over the
/// threshold that a corrupt store never had to have: booted
/// `wiped_for(CorruptSegment)`, it raises CorruptSegment (once) for any
/// gap, asks for no op, acks nothing and never votes.
#[test]
fn a_replica_whose_store_was_corrupt_transfers_whatever_the_gap() {
    let mut c = committed(3);
    let mut cfg = config(3, 2);
    cfg.wiped_repair_ops_max = Some(10 * OPS);
    c.wipe(2);
    c.node(2).replica = Replica::wiped_for(cfg, 77, Trigger::CorruptSegment).expect("config");
    c.node(2).sent.clear();
    c.tick_until(200, |c| c.r(2).is_transferring());
    c.tick(200);
    let r2 = &c.nodes[2];
    assert_eq!(triggers_of(r2, Trigger::CorruptSegment), 1);
    assert_eq!(triggers_of(r2, Trigger::NewOrWiped), 0);
    for kind in ["request_prepares", "prepare_ok", "do_view_change"] {
        assert_eq!(sent(r2, kind), 0, "R2 sent {kind} while it waits");
    }
}

/// A repair answered RangeEvicted because the peer purged the range (not
/// retired it) raises [`Trigger::Purged`], with the answer's facts; the
/// transfer and the replica's conduct meanwhile are RangeEvicted's.
#[test]
fn a_range_evicted_by_a_purge_raises_purged() {
    let stall = Rc::new(Cell::new(true));
    let mut c = behind_with_stalled_repair(stall);
    c.tick_until(50, |c| {
        c.nodes[2]
            .sent
            .iter()
            .any(|(_, m)| m.body.name() == "request_prepares")
    });
    let op_min = c.r(2).op() + 1;
    let evicted = wire::RangeEvicted {
        op_min,
        op_max: op_min + 7,
        op_held_min: op_min + 10,
        log_start_offset: 1_000,
        purge_generation: 1,
        reason: wire::EvictedReason::Purged,
    };
    let view = c.r(0).view();
    c.node(2).events.clear();
    c.step(
        2,
        Input::Message {
            from: 0,
            msg: Message {
                view,
                body: Body::RangeEvicted(evicted),
            },
        },
    );
    let raised: Vec<&Event> = c.nodes[2]
        .events
        .iter()
        .filter(|e| matches!(e, Event::TransferNeeded { .. }))
        .collect();
    assert_eq!(
        raised,
        [&Event::TransferNeeded {
            trigger: Trigger::Purged,
            evicted: Some((0, evicted)),
        }]
    );
    assert_eq!(c.r(2).transfer_trigger(), Some(Trigger::Purged));
}
