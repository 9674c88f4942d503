//! `partitions` across a cluster: this node's replicas, and every peer's as
//! it answers a Replicas request on its client address, in one table with
//! each replica's lag behind the highest commit any of them reports.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use ringlog_protocol::wire::{ReplicaInfo, ReplicaList};
use serde_json::{json, Value};

use super::ControlContext;
use crate::client::{Client, ClientError};
use crate::ops::PartitionStatus;

/// Bound on each step of asking one peer (connect, each read and write).
pub(super) const PEER_STEP_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest the whole table waits for the peers (asked in parallel): a
/// peer later than this is listed as unreachable.
pub(super) const PEERS_WAIT: Duration = Duration::from_secs(3);

/// The rows of `local` (this node's replicas) and of every peer's, by
/// topic, partition and node; of `topic` only, if given. A peer that
/// cannot be asked gets one row with role `unreachable` and the reason.
pub(super) fn cluster_partitions(
    ctx: &ControlContext,
    local: Vec<PartitionStatus>,
    topic: Option<&str>,
) -> Result<Value, String> {
    let own = ctx.config.node_id;
    let mut rows = Vec::with_capacity(local.len());
    for p in local {
        let mut row = serde_json::to_value(p).map_err(|e| e.to_string())?;
        row["node"] = json!(own);
        rows.push(row);
    }
    let peers: BTreeMap<u32, Option<SocketAddr>> = ctx
        .config
        .cluster_nodes()
        .into_keys()
        .filter(|&id| id != own)
        .map(|id| {
            let addr = ctx.peer_stats.as_ref().and_then(|s| s.client_addr(id));
            (id, addr)
        })
        .collect();
    for (id, answer) in ask_peers(&peers) {
        match answer {
            Ok(list) => rows.extend(peer_rows(id, list, topic)),
            Err(reason) => rows.push(json!({"node": id, "role": "unreachable", "fault": reason})),
        }
    }
    set_group_lag(&mut rows);
    rows.sort_by_key(row_key);
    debug_assert!(rows.iter().all(|r| r["node"].is_u64()));
    Ok(Value::Array(rows))
}

/// Asks every peer at once; each answer, or why there is none, by node.
fn ask_peers(
    peers: &BTreeMap<u32, Option<SocketAddr>>,
) -> BTreeMap<u32, Result<ReplicaList, String>> {
    let (tx, rx) = mpsc::channel();
    let mut answers = BTreeMap::new();
    for (&id, addr) in peers {
        let Some(addr) = *addr else {
            answers.insert(
                id,
                Err("no session with it yet: its client address is not known".into()),
            );
            continue;
        };
        let tx = tx.clone();
        // A thread per peer (the cluster's node count bounds them), each
        // ending within its socket timeouts; one later than PEERS_WAIT is
        // left to end on its own.
        let spawned = std::thread::Builder::new()
            .name("ringlog-ctl-peer".into())
            .spawn(move || {
                let answer = ask_peer(addr).map_err(|e| match e {
                    // It names the address already.
                    ClientError::Connect { .. } => e.to_string(),
                    e => format!("{addr}: {e}"),
                });
                let _ = tx.send((id, answer));
            });
        if let Err(e) = spawned {
            answers.insert(id, Err(format!("cannot start a thread to ask it: {e}")));
        }
    }
    drop(tx);
    let deadline = Instant::now() + PEERS_WAIT;
    while answers.len() < peers.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((id, answer)) => {
                answers.insert(id, answer);
            }
            Err(_) => break,
        }
    }
    for &id in peers.keys() {
        answers
            .entry(id)
            .or_insert_with(|| Err(format!("no answer within {PEERS_WAIT:?}")));
    }
    debug_assert_eq!(answers.len(), peers.len());
    answers
}

fn ask_peer(addr: SocketAddr) -> Result<ReplicaList, ClientError> {
    Client::connect_within(addr, PEER_STEP_TIMEOUT)?.replicas()
}

/// A peer's replicas as rows shaped like this node's.
fn peer_rows(node: u32, list: ReplicaList, topic: Option<&str>) -> Vec<Value> {
    let mut rows: Vec<Value> = list
        .rows
        .into_iter()
        .filter(|r| topic.is_none_or(|t| r.topic == t))
        .map(|r| peer_row(node, r))
        .collect();
    if list.omitted > 0 {
        rows.push(json!({"node": node, "role": "omitted",
            "fault": format!("{} more replicas than one reply holds", list.omitted)}));
    }
    rows
}

fn peer_row(node: u32, r: ReplicaInfo) -> Value {
    let vsr = r.vsr;
    json!({
        "node": node,
        "topic": r.topic,
        "partition": r.partition,
        "partition_id": r.partition_id,
        "shard": r.shard,
        "role": r.role,
        "log_start_offset": r.log_start_offset,
        "frontier": r.frontier,
        "commit": r.commit,
        "size_bytes": r.size_bytes,
        "sealed_segments": r.sealed_segments,
        "purge_generation": r.purge_generation,
        "fault": r.fault,
        "view": vsr.map(|v| v.view),
        "op": vsr.map(|v| v.op),
        "commit_op": vsr.map(|v| v.commit_op),
        "lag_ops": vsr.map(|v| v.commit_max.saturating_sub(v.commit_op)),
    })
}

/// Sets each replicated row's `lag_ops` to the highest commit any replica
/// of its partition reports or heard of, less its own commit: a replica
/// cut off from its primary shows its lag even though it heard of nothing.
fn set_group_lag(rows: &mut [Value]) {
    let heard = |r: &Value| {
        let commit = r["commit_op"].as_u64()?;
        Some(commit.saturating_add(r["lag_ops"].as_u64().unwrap_or(0)))
    };
    let mut highest: BTreeMap<(String, u64), u64> = BTreeMap::new();
    for r in rows.iter() {
        if let (Some(key), Some(h)) = (group_key(r), heard(r)) {
            let e = highest.entry(key).or_default();
            *e = (*e).max(h);
        }
    }
    for r in rows.iter_mut() {
        let (Some(key), Some(commit)) = (group_key(r), r["commit_op"].as_u64()) else {
            continue;
        };
        let top = highest.get(&key).copied().unwrap_or(commit);
        debug_assert!(top >= commit);
        r["lag_ops"] = json!(top - commit);
    }
}

fn group_key(r: &Value) -> Option<(String, u64)> {
    Some((r["topic"].as_str()?.to_string(), r["partition"].as_u64()?))
}

/// Rows by topic, partition and node; rows of no partition (unreachable
/// peers) last.
fn row_key(r: &Value) -> (bool, String, u64, u64) {
    let key = group_key(r);
    let node = r["node"].as_u64().unwrap_or(0);
    match key {
        Some((topic, partition)) => (false, topic, partition, node),
        None => (true, String::new(), 0, node),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(node: u64, partition: u64, commit_op: u64, lag_ops: u64) -> Value {
        json!({"node": node, "topic": "t", "partition": partition,
            "commit_op": commit_op, "lag_ops": lag_ops})
    }

    #[test]
    fn a_replica_s_lag_is_measured_against_the_highest_commit_of_its_group() {
        let mut rows = vec![
            row(1, 0, 10, 0),
            // Cut off: heard of nothing past its own commit.
            row(2, 0, 4, 0),
            // Heard of 12 from the primary before it committed it.
            row(3, 0, 9, 3),
            row(1, 1, 7, 0),
            json!({"node": 4, "role": "unreachable", "fault": "refused"}),
            json!({"node": 1, "topic": "single", "partition": 0, "commit_op": null}),
        ];
        set_group_lag(&mut rows);
        let lag: Vec<Value> = rows.iter().map(|r| r["lag_ops"].clone()).collect();
        assert_eq!(
            lag,
            vec![
                json!(2),
                json!(8),
                json!(3),
                json!(0),
                json!(null),
                json!(null)
            ]
        );
    }

    #[test]
    fn unreachable_peers_sort_after_every_partition_row() {
        let mut rows = [
            json!({"node": 4, "role": "unreachable"}),
            row(3, 1, 0, 0),
            row(2, 0, 0, 0),
            row(1, 1, 0, 0),
        ];
        rows.sort_by_key(row_key);
        let order: Vec<(Value, Value)> = rows
            .iter()
            .map(|r| (r["partition"].clone(), r["node"].clone()))
            .collect();
        assert_eq!(
            order,
            vec![
                (json!(0), json!(2)),
                (json!(1), json!(1)),
                (json!(1), json!(3)),
                (json!(null), json!(4)),
            ]
        );
    }

    #[test]
    fn a_peer_that_was_never_reached_or_refuses_is_named_with_its_reason() {
        // A bound then dropped listener: nothing accepts there.
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let peers = BTreeMap::from([(2, None), (3, Some(closed))]);
        let answers = ask_peers(&peers);
        let reason = |id| answers[&id].as_ref().unwrap_err().clone();
        assert!(reason(2).contains("no session"), "{}", reason(2));
        assert!(reason(3).contains(&closed.to_string()), "{}", reason(3));
    }

    #[test]
    fn a_peer_that_accepts_and_never_answers_is_given_up_on_within_the_wait() {
        // The kernel completes the connect into the backlog; nobody reads.
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = silent.local_addr().unwrap();
        let started = Instant::now();
        let answers = ask_peers(&BTreeMap::from([(2, Some(addr))]));
        let waited = started.elapsed();
        assert!(answers[&2].is_err(), "{:?}", answers[&2]);
        assert!(waited >= PEER_STEP_TIMEOUT.min(PEERS_WAIT), "{waited:?}");
        assert!(waited < PEERS_WAIT + Duration::from_secs(1), "{waited:?}");
    }
}
