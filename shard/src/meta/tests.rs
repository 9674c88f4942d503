//! The table, its snapshot and the host, driven through committed batches
//! as a replica's log would deliver them.

use ringlog_protocol::wire::PARTITIONS_MAX;
use ringlog_protocol::{restamp, Stamp};

use super::*;
use crate::vsr::Status;

const GROUP: u32 = 7;

fn create(name: &str, partitions: u32, rf: u8) -> Command {
    Command::CreateTopic {
        name: name.into(),
        partitions,
        replication_factor: rf,
    }
}

/// The batch of `cmds` as committed at `op`.
fn committed(op: u64, cmds: &[Command]) -> Vec<u8> {
    let with_ids: Vec<(u64, Command)> = cmds
        .iter()
        .enumerate()
        .map(|(i, c)| (op * 100 + i as u64, c.clone()))
        .collect();
    let mut batch = command_batch(GROUP, &with_ids).expect("batch");
    let stamp = Stamp {
        vsr_op: op,
        ..Stamp::default()
    };
    restamp(&mut batch, &stamp).expect("restamp");
    batch
}

fn results(applied: Applied) -> Vec<Result<Change, Refusal>> {
    match applied {
        Applied::Done { outcomes, .. } => outcomes.into_iter().map(|o| o.result).collect(),
        Applied::Stale { op, .. } => panic!("op {op} was stale"),
    }
}

fn table3() -> MetaTable {
    MetaTable::new(&[30, 10, 20]).expect("nodes")
}

#[test]
fn apply_creates_deletes_and_purges() {
    let mut t = table3();
    let got = results(
        t.apply(&committed(1, &[create("a", 2, 3), create("b", 3, 1)]))
            .expect("op 1"),
    );
    assert_eq!(got.len(), 2);
    assert!(got.iter().all(|r| r.is_ok()), "{got:?}");
    assert_eq!(t.version(), 1);
    assert_eq!(t.next_partition_id(), 5);
    assert_eq!(t.topics()["b"].first_partition_id, 2);
    let purge = Command::PurgeTopic { name: "b".into() };
    let got = results(
        t.apply(&committed(2, &[purge.clone(), purge]))
            .expect("op 2"),
    );
    assert_eq!(
        got[1],
        Ok(Change::Purged {
            name: "b".into(),
            generation: 2
        })
    );
    let got = results(
        t.apply(&committed(3, &[Command::DeleteTopic { name: "a".into() }]))
            .expect("op 3"),
    );
    assert_eq!(got, [Ok(Change::Deleted { name: "a".into() })]);
    // Ids are never reused: a new "a" gets fresh ones.
    results(t.apply(&committed(4, &[create("a", 1, 1)])).expect("op 4"));
    assert_eq!(t.topics()["a"].first_partition_id, 5);
}

/// Guards against: a replayed op (restart, snapshot install) applying twice.
#[test]
fn apply_is_idempotent_by_op_and_refuses_gaps() {
    let mut t = table3();
    let op1 = committed(1, &[create("a", 1, 1)]);
    results(t.apply(&op1).expect("op 1"));
    let after = t.clone();
    assert_eq!(t.apply(&op1), Ok(Applied::Stale { op: 1, version: 1 }));
    assert_eq!(t, after, "a stale op changed the table");
    let op3 = committed(3, &[create("b", 1, 1)]);
    assert_eq!(t.apply(&op3), Err(MetaError::Gap { version: 1, op: 3 }));
    assert_eq!(t, after, "a refused gap changed the table");
    let mut broken = committed(2, &[create("b", 1, 1)]);
    let last = broken.len() - 1;
    broken[last] ^= 1;
    assert!(matches!(t.apply(&broken), Err(MetaError::Batch { .. })));
    assert_eq!(t, after);
}

#[test]
fn refusals_are_typed_and_still_consume_the_op() {
    let mut t = table3();
    results(t.apply(&committed(1, &[create("a", 1, 1)])).expect("op 1"));
    let cmds = [
        create("a", 1, 1),
        create("b", 1, 4),
        create("b", 1, 0),
        create("b", 1, 2),
        create("b", 0, 1),
        create("b", PARTITIONS_MAX + 1, 1),
        create("bad/name", 1, 1),
        create("..", 1, 1),
        Command::DeleteTopic { name: "zz".into() },
        Command::PurgeTopic { name: "zz".into() },
    ];
    let got = results(t.apply(&committed(2, &cmds)).expect("op 2"));
    let want = [
        Refusal::DuplicateTopic { name: "a".into() },
        Refusal::ReplicationFactor {
            requested: 4,
            nodes: 3,
        },
        Refusal::ReplicationFactor {
            requested: 0,
            nodes: 3,
        },
        Refusal::ReplicationFactor {
            requested: 2,
            nodes: 3,
        },
        Refusal::Partitions {
            requested: 0,
            max: PARTITIONS_MAX,
        },
        Refusal::Partitions {
            requested: PARTITIONS_MAX + 1,
            max: PARTITIONS_MAX,
        },
        Refusal::InvalidName {
            name: "bad/name".into(),
        },
        Refusal::InvalidName { name: "..".into() },
        Refusal::UnknownTopic { name: "zz".into() },
        Refusal::UnknownTopic { name: "zz".into() },
    ];
    assert_eq!(got, want.map(Err));
    assert_eq!(t.version(), 2);
    assert_eq!(t.topics().len(), 1);
    assert!(create("b", PARTITIONS_MAX, 3).encode().is_ok());
    assert_eq!(t.check(&create("b", PARTITIONS_MAX, 3)), Ok(()));
}

/// Guards against: an unbounded table; a batch whose record is garbage
/// stalling the group (it is refused, identically everywhere).
#[test]
fn topic_cap_and_undecodable_records() {
    let mut t = MetaTable::new(&[1]).expect("nodes");
    for i in 0..TOPICS_MAX {
        t.topics.insert(
            format!("t{i:05}"),
            Topic {
                first_partition_id: i as u32,
                partitions: 1,
                replication_factor: 1,
                purge_generation: 0,
            },
        );
    }
    t.next_partition_id = TOPICS_MAX as u32;
    let got = results(
        t.apply(&committed(1, &[create("more", 1, 1)]))
            .expect("op 1"),
    );
    assert_eq!(got, [Err(Refusal::TopicsFull { max: TOPICS_MAX })]);
    let mut b = ringlog_protocol::BatchBuilder::new(GROUP);
    let record = ringlog_protocol::Record {
        key: b"short",
        headers: &[],
        value: b"\x01\x01",
        timestamp_ms: 0,
    };
    b.push(&record).expect("push");
    let mut batch = b
        .finish(&Stamp {
            vsr_op: 2,
            ..Stamp::default()
        })
        .expect("batch");
    restamp(
        &mut batch,
        &Stamp {
            vsr_op: 2,
            ..Stamp::default()
        },
    )
    .expect("restamp");
    let applied = t.apply(&batch).expect("op 2");
    let Applied::Done { outcomes, .. } = applied else {
        panic!("stale")
    };
    assert_eq!(outcomes[0].request_id, None);
    assert_eq!(
        outcomes[0].result,
        Err(Refusal::Undecodable(DecodeError::RequestId(5)))
    );
    assert_eq!(t.version(), 2);
}

#[test]
fn partition_ids_exhausted_is_refused() {
    let mut t = table3();
    t.next_partition_id = META_PARTITION_ID - 2;
    assert_eq!(
        t.check(&create("a", 3, 1)),
        Err(Refusal::PartitionIdsExhausted)
    );
    assert_eq!(t.check(&create("a", 2, 1)), Ok(()));
}

#[test]
fn nodes_are_checked() {
    assert_eq!(MetaTable::new(&[]), Err(NodesError::Count { count: 0 }));
    let many: Vec<NodeId> = (0..=NODES_MAX as u32).collect();
    assert_eq!(
        MetaTable::new(&many),
        Err(NodesError::Count {
            count: NODES_MAX + 1
        })
    );
    assert_eq!(MetaTable::new(&[4, 2, 4]), Err(NodesError::Duplicate(4)));
    assert_eq!(table3().nodes(), [10, 20, 30]);
    assert_eq!(table3().group_nodes(), [10, 20, 30]);
    let four = MetaTable::new(&[4, 3, 2, 1]).expect("nodes");
    assert_eq!(four.group_nodes(), [1, 2, 3], "a VSR group is odd");
    assert_eq!(MetaTable::new(&[9]).expect("nodes").group_nodes(), [9]);
}

/// The stated rule: rf nodes from position `id mod N`, wrapping, listed in
/// id order; shard `id mod shards`.
#[test]
fn placement_is_round_robin_from_the_partition_id() {
    let mut t = MetaTable::new(&[50, 40, 30, 20, 10]).expect("nodes");
    results(
        t.apply(&committed(1, &[create("x", 1, 1), create("a", 4, 3)]))
            .expect("op 1"),
    );
    let p = t.placement();
    let groups: Vec<(&str, u32, u32, Vec<NodeId>)> = p
        .iter()
        .map(|p| {
            (
                p.topic.as_str(),
                p.index,
                p.partition_id,
                p.replicas.clone(),
            )
        })
        .collect();
    assert_eq!(
        groups,
        [
            ("a", 0, 1, vec![20, 30, 40]),
            ("a", 1, 2, vec![30, 40, 50]),
            ("a", 2, 3, vec![10, 40, 50]),
            ("a", 3, 4, vec![10, 20, 50]),
            ("x", 0, 0, vec![10]),
        ]
    );
    let on_10: Vec<u32> = t.placement_for(10).into_keys().collect();
    assert_eq!(on_10, [0, 3, 4]);
    assert_eq!(
        (0..5).map(|p| shard_for(p, 2)).collect::<Vec<_>>(),
        [0, 1, 0, 1, 0]
    );
    assert_eq!(shard_for(9, 1), 0);
}

fn busy_table() -> MetaTable {
    let mut t = table3();
    let cmds = [
        create("orders", 5, 3),
        create("logs", 2, 1),
        Command::PurgeTopic {
            name: "logs".into(),
        },
    ];
    results(t.apply(&committed(1, &cmds)).expect("op 1"));
    t
}

#[test]
fn snapshot_round_trips_with_its_version() {
    for t in [table3(), busy_table()] {
        let bytes = t.encode_snapshot();
        assert!(bytes.len() <= SNAPSHOT_BYTES_MAX);
        let back = MetaTable::decode_snapshot(&bytes).expect("decodes");
        assert_eq!(back, t);
        assert_eq!(back.digest(), t.digest());
    }
    assert_ne!(table3().digest(), busy_table().digest());
}

/// Guards against: a torn or flipped snapshot installing a wrong table.
#[test]
fn every_snapshot_truncation_and_bit_flip_is_refused() {
    let bytes = busy_table().encode_snapshot();
    for len in 0..bytes.len() {
        assert!(
            MetaTable::decode_snapshot(&bytes[..len]).is_err(),
            "cut at {len}"
        );
    }
    for i in 0..bytes.len() {
        for bit in 0..8 {
            let mut b = bytes.clone();
            b[i] ^= 1 << bit;
            assert!(
                MetaTable::decode_snapshot(&b).is_err(),
                "flip byte {i} bit {bit}"
            );
        }
    }
    let mut longer = bytes;
    longer.push(0);
    assert!(matches!(
        MetaTable::decode_snapshot(&longer),
        Err(SnapshotError::Length { .. })
    ));
}

/// Re-checksummed snapshots with an invalid body: decoding checks what
/// apply keeps true, not only the checksum.
#[test]
fn snapshot_with_a_table_apply_cannot_build_is_refused() {
    let base = busy_table();
    let mut bad = Vec::new();
    let mut t = base.clone();
    t.nodes = vec![2, 1];
    bad.push(t);
    let mut t = base.clone();
    t.next_partition_id = 3; // below orders' range end
    bad.push(t);
    let mut t = base.clone();
    t.topics.get_mut("logs").expect("logs").replication_factor = 4;
    bad.push(t);
    let mut t = base.clone();
    t.topics.get_mut("logs").expect("logs").first_partition_id = 4; // overlaps orders
    bad.push(t);
    let mut t = base;
    let topic = t.topics["logs"].clone();
    t.topics.insert("bad/name".into(), topic);
    bad.push(t);
    for t in bad {
        let got = MetaTable::decode_snapshot(&t.encode_snapshot());
        assert!(
            matches!(got, Err(SnapshotError::Invalid(_))),
            "{t:?}: {got:?}"
        );
    }
}

fn role(status: Status, view: u32, replica: u8) -> Role {
    Role {
        status,
        view,
        replica,
        primary: (view % 3) as u8,
    }
}

#[test]
fn host_routes_to_the_primary() {
    let host = MetaHost::new(20, 2, GROUP, busy_table()).expect("host");
    let cmd = create("new", 1, 3);
    // Replica 1 (node 20) is view 1's primary.
    let batch = host
        .route(9, &cmd, role(Status::Normal, 1, 1))
        .expect("submit");
    let view = ringlog_protocol::BatchView::parse(&batch).expect("batch");
    assert_eq!(view.header().partition_id, GROUP);
    let rec = view.records().next().expect("one record");
    assert_eq!(Command::decode(rec.value), Ok(cmd.clone()));
    assert_eq!(
        host.route(9, &cmd, role(Status::Normal, 2, 1)),
        Err(RouteError::NotPrimary {
            view: 2,
            primary: 30
        })
    );
    assert_eq!(
        host.route(9, &cmd, role(Status::ViewChange, 1, 1)),
        Err(RouteError::NoPrimary { view: 1 })
    );
    assert_eq!(
        host.route(9, &create("orders", 1, 1), role(Status::Normal, 1, 1)),
        Err(RouteError::Refused(Refusal::DuplicateTopic {
            name: "orders".into()
        }))
    );
    let long = create(&"n".repeat(300), 1, 1);
    assert!(matches!(
        host.route(9, &long, role(Status::Normal, 1, 1)),
        Err(RouteError::Refused(Refusal::InvalidName { .. }))
    ));
}

#[test]
fn host_refuses_an_unknown_node_or_no_shards() {
    assert!(matches!(
        MetaHost::new(99, 1, GROUP, table3()),
        Err(HostError::UnknownNode { .. })
    ));
    assert_eq!(
        MetaHost::new(10, 0, GROUP, table3()).err(),
        Some(HostError::NoShards)
    );
}

fn ids(actions: &[LocalAction]) -> Vec<(char, u32, u16)> {
    actions
        .iter()
        .map(|a| match a {
            LocalAction::Create(p) => ('c', p.partition_id, p.shard),
            LocalAction::Delete(p) => ('d', p.partition_id, p.shard),
            LocalAction::Purge(p) => ('p', p.partition_id, p.shard),
        })
        .collect()
}

/// The diff of this node's placement, per op: creates of the partitions
/// it holds (on their shards), purges, deletes; nothing for a stale op.
#[test]
fn host_lists_local_actions_per_applied_op() {
    let mut host = MetaHost::new(10, 2, GROUP, table3()).expect("host");
    let op1 = committed(1, &[create("a", 4, 1)]);
    let (_, actions) = host.apply(&op1).expect("op 1");
    // a: ids 0..4 on nodes 10, 20, 30, 10.
    assert_eq!(ids(&actions), [('c', 0, 0), ('c', 3, 1)]);
    assert_eq!(host.apply(&op1).expect("again").1, []);
    let op2 = committed(
        2,
        &[Command::PurgeTopic { name: "a".into() }, create("b", 1, 1)],
    );
    let (_, actions) = host.apply(&op2).expect("op 2");
    // b: id 4, group [20]: not here.
    assert_eq!(ids(&actions), [('p', 0, 0), ('p', 3, 1)]);
    let refused = committed(3, &[create("a", 1, 1)]);
    assert_eq!(host.apply(&refused).expect("op 3").1, []);
    let op4 = committed(
        4,
        &[Command::DeleteTopic { name: "a".into() }, create("c", 1, 3)],
    );
    let (_, actions) = host.apply(&op4).expect("op 4");
    assert_eq!(ids(&actions), [('d', 0, 0), ('d', 3, 1), ('c', 5, 1)]);
    let LocalAction::Create(c) = &actions[2] else {
        panic!("create")
    };
    assert_eq!(
        (c.topic.as_str(), c.index, c.replicas.as_slice()),
        ("c", 0, &[10, 20, 30][..])
    );
    let mut other = committed(5, &[create("d", 1, 1)]);
    let wrong = {
        let mut b = ringlog_protocol::BatchBuilder::new(GROUP + 1);
        b.push(&ringlog_protocol::Record {
            key: &[0; 8],
            headers: &[],
            value: b"x",
            timestamp_ms: 0,
        })
        .expect("push");
        b.finish(&Stamp::default()).expect("batch")
    };
    assert_eq!(
        host.apply(&wrong),
        Err(MetaError::WrongGroup {
            batch: GROUP + 1,
            group: GROUP
        })
    );
    other.truncate(10);
    assert!(matches!(host.apply(&other), Err(MetaError::Batch { .. })));
}

/// A host that installs a snapshot gets the actions to its new placement;
/// a stale snapshot, or one of another cluster, is refused.
#[test]
fn host_install_diffs_and_refuses_stale_or_foreign() {
    let mut host = MetaHost::new(30, 4, GROUP, table3()).expect("host");
    let snap = busy_table().encode_snapshot();
    let actions = host.install(&snap).expect("install");
    let want: Vec<(char, u32, u16)> = (0..6).map(|id| ('c', id, (id % 4) as u16)).collect();
    assert_eq!(
        ids(&actions),
        want,
        "orders (rf 3) and logs' id 5 (rf 1, 5 mod 3 = node 30)"
    );
    assert_eq!(host.table(), &busy_table());
    assert_eq!(
        host.install(&snap),
        Err(HostError::StaleSnapshot {
            offered: 1,
            version: 1
        })
    );
    let mut foreign = MetaTable::new(&[10, 20, 31]).expect("nodes");
    foreign.version = 9;
    assert!(matches!(
        host.install(&foreign.encode_snapshot()),
        Err(HostError::OtherCluster { .. })
    ));
    let mut torn = snap;
    torn.pop();
    assert!(matches!(host.install(&torn), Err(HostError::Snapshot(_))));
    assert_eq!(
        host.table(),
        &busy_table(),
        "a refused install changed the table"
    );
}

/// The largest table: TOPICS_MAX topics with the longest names, all the
/// cluster's partitions.
fn full_table() -> MetaTable {
    let mut t = MetaTable::new(&(0..NODES_MAX as u32).collect::<Vec<_>>()).expect("nodes");
    let per_topic = (CLUSTER_PARTITIONS_MAX / TOPICS_MAX as u64) as u32;
    for i in 0..TOPICS_MAX {
        let mut name = format!("{i:05}");
        name.push_str(&"n".repeat(ringlog_protocol::wire::TOPIC_NAME_BYTES_MAX - name.len()));
        let topic = Topic {
            first_partition_id: i as u32 * per_topic,
            partitions: per_topic,
            replication_factor: NODES_MAX as u8 - 1,
            purge_generation: u64::MAX,
        };
        t.topics.insert(name, topic);
    }
    t.next_partition_id = TOPICS_MAX as u32 * per_topic;
    t
}

/// Its snapshot fits SNAPSHOT_BYTES_MAX and decodes; a header claiming
/// more is refused before anything is read.
#[test]
fn the_largest_snapshot_fits_its_bound() {
    let t = full_table();
    assert_eq!(t.partitions_total(), CLUSTER_PARTITIONS_MAX);
    assert_eq!(
        t.check(&create("zz", 1, 1)),
        Err(Refusal::TopicsFull { max: TOPICS_MAX })
    );
    let bytes = t.encode_snapshot();
    assert!(bytes.len() <= SNAPSHOT_BYTES_MAX, "{} bytes", bytes.len());
    assert_eq!(MetaTable::decode_snapshot(&bytes).as_ref(), Ok(&t));
    let mut claim = bytes[..20].to_vec();
    claim[8..12].copy_from_slice(&(SNAPSHOT_BYTES_MAX as u32 + 1).to_le_bytes());
    assert!(matches!(
        MetaTable::decode_snapshot(&claim),
        Err(SnapshotError::Length { body_len, .. }) if body_len == SNAPSHOT_BYTES_MAX + 1
    ));
}

/// Guards against: a table whose placement a host recomputes per op
/// growing without bound.
#[test]
fn cluster_partition_cap_is_refused() {
    let mut t = table3();
    let big = Topic {
        first_partition_id: 0,
        partitions: (CLUSTER_PARTITIONS_MAX - 2) as u32,
        replication_factor: 1,
        purge_generation: 0,
    };
    t.topics.insert("big".into(), big);
    t.next_partition_id = (CLUSTER_PARTITIONS_MAX - 2) as u32;
    let refused = Refusal::ClusterPartitions {
        requested: 3,
        total: CLUSTER_PARTITIONS_MAX - 2,
        max: CLUSTER_PARTITIONS_MAX,
    };
    assert_eq!(t.check(&create("more", 3, 1)), Err(refused));
    assert_eq!(t.check(&create("more", 2, 1)), Ok(()));
    let mut over = t.clone();
    over.topics.get_mut("big").expect("big").partitions += 3;
    over.next_partition_id += 3;
    assert!(matches!(
        MetaTable::decode_snapshot(&over.encode_snapshot()),
        Err(SnapshotError::Invalid(_))
    ));
}

/// A record whose request id the host's window saw is refused as a
/// duplicate (its command does not run), the op still counts, and the
/// other records of the batch apply.
#[test]
fn apply_skipping_refuses_seen_request_ids_only() {
    let mut t = table3();
    // committed() keys op 1's records 100 and 101.
    let batch = committed(1, &[create("a", 1, 3), create("b", 1, 3)]);
    let got = results(t.apply_skipping(&batch, |id| id == 100).expect("op 1"));
    assert_eq!(
        got[0],
        Err(Refusal::DuplicateRequest { request_id: 100 }),
        "{got:?}"
    );
    assert!(got[1].is_ok(), "{got:?}");
    assert_eq!(t.version(), 1);
    assert!(!t.topics().contains_key("a"));
    assert_eq!(t.topics()["b"].first_partition_id, 0);
}
