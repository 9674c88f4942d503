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

/// Like `Cluster::execute`, except that R0's and R1's reads of retired
/// ops answer Evicted.
fn execute(c: &mut Cluster, r: u8, op: &StorageOp) -> Result<IoOutcome, IoFailure> {
    match op {
        StorageOp::ReadBatches { op_min, op_max } if r != 2 && *op_min <= RETIRED_MAX => {
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

/// Delivers messages and completes every node's I/O until nothing moves.
fn settle(c: &mut Cluster) {
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
        let result = execute(c, r, &op);
        c.step(r, Input::IoDone { id, result });
    }
}

fn tick(c: &mut Cluster) {
    for r in 0..c.nodes.len() as u8 {
        if c.r_up(r) {
            c.step(r, Input::Tick);
        }
    }
    settle(c);
}

fn transfer_needed(node: &Node) -> Option<wire::RangeEvicted> {
    node.events.iter().find_map(|e| match e {
        Event::TransferNeeded { evicted, .. } => Some(*evicted),
        _ => None,
    })
}

/// What the driver does around a transfer of ops `..=SNAPSHOT_OP` from
/// R0: it marks the superblock wiped before the install; after it the
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
    let mut c = Cluster::new(3);
    for r in 0..3 {
        c.node(r).auto_io = false;
    }
    c.drop = Some(Box::new(|from, to, _| from == 2 || to == 2));
    for token in 1..=COMMITTED {
        c.append(0, token, token as u8);
        settle(&mut c);
    }
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
