//! Control commands: parse a JSON line, ask the shards, build the reply.

use std::sync::atomic::Ordering;
use std::time::Duration;

use ringlog_protocol::wire::ErrorCode;
use serde::Deserialize;
use serde_json::{json, Value};

use super::ControlContext;
use crate::catalog::TopicState;
use crate::mailbox::{MailboxTx, SendError};
use crate::metrics::{ConsumerLag, MailboxFigures, PartitionFigures, Scrape};
use crate::ops::{Envelope, MetaOp, Op, OpError, OpReply, Outcome, PartitionStatus, ReplyTo};
use crate::placement::shard_for;

/// Attempts while a shard's mailbox is full, 10 ms apart.
const SEND_RETRIES: u32 = 200;
/// Longest wait for a shard's answer.
const REPLY_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest a metrics scrape waits for all shards' partition figures
/// (under Prometheus's default 10 s scrape timeout).
pub(super) const SCRAPE_WAIT: Duration = Duration::from_secs(5);

#[derive(Debug, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case", deny_unknown_fields)]
enum Command {
    Status,
    Topics,
    Partitions {
        #[serde(default)]
        topic: Option<String>,
        /// Every node's replicas, not only this node's.
        #[serde(default)]
        cluster: bool,
    },
    CreateTopic {
        topic: String,
        partitions: u32,
    },
    DeleteTopic {
        topic: String,
    },
    Purge {
        topic: String,
        #[serde(default)]
        partition: Option<u32>,
    },
    Consumers {
        #[serde(default)]
        group: Option<String>,
    },
    Metrics,
    Config,
    Cluster,
    Transfers,
    LogLevel {
        level: String,
    },
    Shutdown,
}

impl Command {
    /// What an audit line records of a command that changes the server:
    /// its name and arguments. None for read-only commands.
    fn audit(&self) -> Option<(&'static str, String)> {
        match self {
            Command::CreateTopic { topic, partitions } => Some((
                "create_topic",
                format!("topic={topic} partitions={partitions}"),
            )),
            Command::DeleteTopic { topic } => Some(("delete_topic", format!("topic={topic}"))),
            Command::Purge { topic, partition } => Some((
                "purge",
                match partition {
                    Some(p) => format!("topic={topic} partition={p}"),
                    None => format!("topic={topic}"),
                },
            )),
            Command::LogLevel { level } => Some(("log_level", format!("level={level}"))),
            Command::Shutdown => Some(("shutdown", String::new())),
            Command::Status
            | Command::Topics
            | Command::Partitions { .. }
            | Command::Consumers { .. }
            | Command::Metrics
            | Command::Config
            | Command::Cluster
            | Command::Transfers => None,
        }
    }
}

/// Runs one request line from the control peer `who` (its credentials).
pub(super) fn execute(ctx: &ControlContext, line: &[u8], who: &str) -> Value {
    let value: Value = match serde_json::from_slice(line) {
        Ok(v) => v,
        Err(e) => return fail(format!("malformed JSON: {e}")),
    };
    let Some(name) = value.get("cmd").and_then(Value::as_str).map(str::to_string) else {
        return fail("missing \"cmd\" (a string); commands: status, topics, partitions, create_topic, delete_topic, purge, consumers, metrics, config, cluster, transfers, log_level, shutdown");
    };
    let cmd: Command = match serde_json::from_value(value) {
        Ok(c) => c,
        Err(e) => {
            let msg = e.to_string();
            return if msg.contains("unknown variant") {
                fail(format!("unknown command {name:?}; commands: status, topics, partitions, create_topic, delete_topic, purge, consumers, metrics, config, cluster, transfers, log_level, shutdown"))
            } else {
                fail(format!("bad arguments for {name:?}: {msg}"))
            };
        }
    };
    let audit = cmd.audit();
    let outcome = run(ctx, cmd);
    if let Some((cmd, what)) = audit {
        let result = match &outcome {
            Ok(_) => "ok".to_string(),
            Err(e) => format!("error: {e}"),
        };
        tracing::info!(target: "audit", who = %who, cmd = %cmd, what = %what, result = %result, "operator action");
    }
    match outcome {
        Ok(result) => json!({"ok": true, "result": result}),
        Err(e) => fail(e),
    }
}

/// `cluster`: this node and each peer as the transport last saw it.
/// `reachable` is our session to it (we can send); `inbound` its session
/// to us; `last_seen_ms_ago` is null if never heard from; `client_address`
/// where it serves clients (this node's as it announces it:
/// `advertise_client_address`, else the bound one; a peer's as its Hello
/// announced it, null before a session).
fn cluster_nodes(ctx: &ControlContext) -> Value {
    let config = &ctx.config;
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let nodes: Vec<Value> = config
        .cluster_nodes()
        .into_iter()
        .map(|(id, addr)| {
            if id == config.node_id {
                let own = match config.advertise_client_address.as_str() {
                    "" => ctx.client_addr.to_string(),
                    advertised => advertised.to_string(),
                };
                return json!({"id": id, "address": addr.to_string(), "self": true,
                    "client_address": own, "reachable": true, "inbound": null, "incarnation": null, "last_seen_ms_ago": 0});
            }
            let seen = ctx.peer_stats.as_ref().and_then(|s| s.nodes.get(&id));
            let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
            let flag = |a: &std::sync::atomic::AtomicBool| a.load(Ordering::Relaxed);
            let last = seen.map_or(0, |n| load(&n.last_seen_unix_ms));
            json!({
                "id": id,
                "address": addr.to_string(),
                "self": false,
                "client_address": ctx.peer_stats.as_ref()
                    .and_then(|s| s.client_addr(id)).map(|a| a.to_string()),
                "reachable": seen.is_some_and(|n| flag(&n.connected)),
                "inbound": seen.is_some_and(|n| flag(&n.inbound)),
                "incarnation": seen.map(|n| load(&n.incarnation)).filter(|&i| i != 0),
                "last_seen_ms_ago": (last != 0).then(|| now_ms.saturating_sub(last)),
            })
        })
        .collect();
    json!({"cluster_id": config.cluster_id, "node_id": config.node_id, "nodes": nodes})
}

fn fail(message: impl Into<String>) -> Value {
    json!({"ok": false, "error": message.into()})
}

/// Sends `op` to shard `shard` and waits for its answer.
/// Every partition of every shard (of `topic`, if given), by topic and
/// index.
fn all_partitions(
    ctx: &ControlContext,
    shards: usize,
    topic: Option<String>,
) -> Result<Vec<PartitionStatus>, String> {
    if let Some(t) = &topic {
        // Like purge: a name that is not a topic is an error, not an
        // empty table.
        let table = ctx.catalog.snapshot();
        if !table.topics.contains_key(t) {
            return Err(format!("no topic {t:?}"));
        }
    }
    let mut all = Vec::new();
    for s in 0..shards {
        match ask(
            ctx,
            s,
            Op::Describe {
                partition_ids: None,
            },
        )
        .map_err(|e| e.to_string())?
        {
            OpReply::Partitions(list) => all.extend(
                list.into_iter()
                    .filter(|p| topic.as_ref().is_none_or(|t| &p.topic == t)),
            ),
            other => return Err(format!("unexpected reply {other:?}")),
        }
    }
    all.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
    Ok(all)
}

/// `ctl transfers`' row of `p`, if it runs a transfer: its progress, and
/// the rate and ETA from the clock `now_ms` (the shard's machines have
/// none).
fn transfer_row(p: &PartitionStatus, now_ms: u64) -> Option<Value> {
    let t = p.transfer.as_ref()?;
    let elapsed_ms = now_ms.saturating_sub(t.started_ms).max(1);
    let rate = t.bytes_received as f64 * 1000.0 / elapsed_ms as f64;
    let eta_seconds = t.bytes_total.and_then(|total| {
        let left = total.saturating_sub(t.bytes_received);
        (rate > 0.0).then(|| (left as f64 / rate * 10.0).round() / 10.0)
    });
    debug_assert!(rate.is_finite());
    Some(json!({
        "topic": p.topic,
        "partition": p.partition,
        "partition_id": p.partition_id,
        "shard": p.shard,
        "peer_node": t.peer_node,
        "state": t.state,
        "trigger": t.trigger,
        "frozen": t.frozen,
        "bytes_received": t.bytes_received,
        "bytes_total": t.bytes_total,
        "chunks_received": t.chunks_received,
        "chunks_total": t.chunks_total,
        "chunks_in_flight": t.chunks_in_flight,
        "elapsed_seconds": elapsed_ms as f64 / 1000.0,
        "rate_bytes_per_second": rate.round(),
        "eta_seconds": eta_seconds,
    }))
}

fn ask(ctx: &ControlContext, shard: usize, op: Op) -> Outcome {
    ask_within(&ctx.peers, shard, op, &Patience::command())
}

/// How long a request may wait on a shard.
#[derive(Clone, Copy, Debug)]
pub(super) struct Patience {
    /// Sends retried (10 ms apart) while the mailbox is full.
    pub retries: u32,
    /// When waiting for answers stops.
    pub deadline: std::time::Instant,
}

impl Patience {
    /// A control command's: the mailbox retried, 30 s per answer at most.
    pub fn command() -> Patience {
        Patience {
            retries: SEND_RETRIES,
            deadline: std::time::Instant::now() + REPLY_TIMEOUT,
        }
    }

    /// A scrape's: no retry, the scrape's own deadline.
    pub fn scrape(deadline: std::time::Instant) -> Patience {
        Patience {
            retries: 0,
            deadline,
        }
    }
}

/// Sends `op` to shard `shard` of `peers` and waits for its answer, as
/// `patience` allows.
pub(super) fn ask_within(
    peers: &[MailboxTx],
    shard: usize,
    op: Op,
    patience: &Patience,
) -> Outcome {
    let left = patience
        .deadline
        .saturating_duration_since(std::time::Instant::now());
    post(peers, shard, op, patience.retries)?
        .recv_timeout(left)
        .map_err(|_| OpError::new(ErrorCode::Internal, format!("shard {shard} did not answer")))?
}

/// Sends `op` to shard `shard`, trying `retries` more times 10 ms apart
/// while its mailbox is full; returns where the answer will come.
fn post(
    peers: &[MailboxTx],
    shard: usize,
    op: Op,
    retries: u32,
) -> Result<crossbeam_channel::Receiver<Outcome>, OpError> {
    let peer = peers
        .get(shard)
        .ok_or_else(|| OpError::new(ErrorCode::Internal, "no such shard"))?;
    let (tx, rx) = crossbeam_channel::bounded(1);
    let mut env = Envelope {
        op,
        reply: ReplyTo::Thread(tx),
    };
    let mut tries = 0;
    loop {
        match peer.send(env) {
            Ok(()) => return Ok(rx),
            Err(SendError::Full(e)) if tries < retries => {
                env = e;
                tries += 1;
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(SendError::Full(_)) => {
                return Err(OpError::new(
                    ErrorCode::Backpressure,
                    format!("shard {shard} mailbox stays full"),
                ))
            }
            Err(SendError::Closed(_)) => {
                return Err(OpError::new(
                    ErrorCode::ShuttingDown,
                    format!("shard {shard} stopped"),
                ))
            }
        }
    }
}

/// The effective config, one `{key, value, source}` per key in key order;
/// source is `default` or where the value was set.
fn config_with_origins(ctx: &ControlContext) -> Result<Value, String> {
    let Value::Object(map) =
        serde_json::to_value(ctx.config.as_ref()).map_err(|e| e.to_string())?
    else {
        return Err("config is not an object".into());
    };
    let mut keys: Vec<_> = map.into_iter().collect();
    keys.sort_by(|a, b| a.0.cmp(&b.0));
    let rows: Vec<Value> = keys
        .into_iter()
        .map(|(key, value)| {
            let source = ctx
                .config_origins
                .get(&key)
                .map_or("default", String::as_str);
            json!({"key": key, "value": value, "source": source})
        })
        .collect();
    Ok(json!(rows))
}

/// The node's Prometheus text: every shard's counters, and each
/// partition's figures as its shard reports them now. The shards are asked
/// at once and waited for together, at most [`SCRAPE_WAIT`]; a full mailbox
/// is not retried (the scrape adds nothing to an overloaded shard). A shard
/// that does not answer is logged, its partitions are left out of this
/// scrape, and it is counted in `ringlog_scrape_shards_unanswered`.
pub(super) fn metrics_text(ctx: &ControlContext) -> String {
    let deadline = std::time::Instant::now() + SCRAPE_WAIT;
    let describe = || Op::Describe {
        partition_ids: None,
    };
    let pending: Vec<_> = (0..ctx.peers.len())
        .map(|s| (s, post(&ctx.peers, s, describe(), 0)))
        .collect();
    let mut partitions = Vec::new();
    let mut unanswered = 0;
    for (s, posted) in pending {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let answer = posted.and_then(|rx| {
            rx.recv_timeout(left).map_err(|_| {
                OpError::new(
                    ErrorCode::Internal,
                    format!("shard {s} did not answer in time"),
                )
            })?
        });
        match answer {
            Ok(OpReply::Partitions(list)) => {
                partitions.extend(list.into_iter().map(|p| PartitionFigures {
                    faulted: p.fault.is_some(),
                    topic: p.topic,
                    partition: p.partition,
                    log_start_offset: p.log_start_offset,
                    frontier: p.frontier,
                    commit: p.commit,
                    size_bytes: p.size_bytes,
                    view_changes: p.view_changes,
                    repairs: p.repairs,
                    commit_latency: p.commit_latency,
                }))
            }
            Ok(other) => {
                unanswered += 1;
                tracing::warn!(shard = s, reply = ?other, "metrics: unexpected reply");
            }
            Err(e) => {
                unanswered += 1;
                tracing::warn!(shard = s, error = %e, "metrics: no partition figures");
            }
        }
    }
    partitions.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
    let shards = ctx
        .metrics
        .iter()
        .zip(ctx.peers.iter())
        .map(|(m, tx)| (m.clone(), MailboxFigures::of(tx)))
        .collect();
    let consumers = consumer_lag(ctx, &partitions, deadline);
    crate::metrics::render(Scrape {
        shards,
        partitions,
        consumers,
        shards_unanswered: unanswered,
        uptime_s: ctx.started.elapsed().as_secs(),
    })
}

/// Each group's lag against the `partitions` figures of this scrape, read
/// within the scrape's `deadline` (what a slow read leaves unread is read by
/// the next one). If the commits cannot be read now, the rest of the
/// metrics are still served and the cause is logged.
fn consumer_lag(
    ctx: &ControlContext,
    partitions: &[PartitionFigures],
    deadline: std::time::Instant,
) -> Vec<ConsumerLag> {
    let patience = Patience::scrape(deadline);
    let committed = match ctx
        .consumers
        .committed(&ctx.catalog, &ctx.peers, &patience, false)
    {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "metrics: consumer lag left out");
            return Vec::new();
        }
    };
    committed
        .into_iter()
        .filter_map(|((group, topic, partition), committed)| {
            let p = partitions
                .iter()
                .find(|p| p.topic == topic && p.partition == partition)?;
            Some(ConsumerLag {
                lag: p.commit.saturating_sub(committed),
                group,
                topic,
                partition,
                committed,
            })
        })
        .collect()
}

fn run(ctx: &ControlContext, cmd: Command) -> Result<Value, String> {
    let shards = ctx.peers.len();
    let err = |e: OpError| e.to_string();
    match cmd {
        Command::Status => {
            let mut list = Vec::with_capacity(shards);
            for s in 0..shards {
                match ask(ctx, s, Op::ShardStatus).map_err(err)? {
                    OpReply::Shard(st) => list.push(st),
                    other => return Err(format!("unexpected reply {other:?}")),
                }
            }
            let table = ctx.catalog.snapshot();
            Ok(json!({
                "node": {
                    "version": env!("CARGO_PKG_VERSION"),
                    "pid": std::process::id(),
                    "listen": ctx.client_addr.to_string(),
                    "data_dir": ctx.config.data_dir.display().to_string(),
                    "uptime_s": ctx.started.elapsed().as_secs(),
                    "shards": shards,
                    "topics": table.topics.len(),
                    "replication": "single node",
                },
                "shards": list,
            }))
        }
        Command::Topics => {
            let table = ctx.catalog.snapshot();
            let topics: Vec<Value> = table
                .topics
                .iter()
                .map(|(name, m)| {
                    json!({
                        "topic": name,
                        "partitions": m.partitions,
                        "state": if m.state == TopicState::Ready { "ready" } else { "creating" },
                    })
                })
                .collect();
            Ok(json!(topics))
        }
        Command::Cluster => Ok(cluster_nodes(ctx)),
        Command::Partitions { topic, cluster } => {
            let all = all_partitions(ctx, shards, topic.clone())?;
            match cluster {
                true => super::replicas::cluster_partitions(ctx, all, topic.as_deref()),
                false => serde_json::to_value(all).map_err(|e| e.to_string()),
            }
        }
        Command::Transfers => {
            let now_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64);
            let all = all_partitions(ctx, shards, None)?;
            Ok(json!(all
                .iter()
                .filter_map(|p| transfer_row(p, now_ms))
                .collect::<Vec<_>>()))
        }
        Command::CreateTopic { topic, partitions } => {
            ask(ctx, 0, Op::Meta(MetaOp::CreateTopic { topic, partitions })).map_err(err)?;
            Ok(json!({}))
        }
        Command::DeleteTopic { topic } => {
            ask(ctx, 0, Op::Meta(MetaOp::DeleteTopic { topic })).map_err(err)?;
            Ok(json!({}))
        }
        Command::Purge { topic, partition } => {
            let table = ctx.catalog.snapshot();
            let meta = table
                .topics
                .get(&topic)
                .filter(|m| m.state == TopicState::Ready)
                .ok_or_else(|| format!("no topic {topic:?}"))?;
            if meta.replication_factor > 1 {
                // Through the metadata group and each partition's replica
                // group: answered once every partition here purged.
                if let Some(p) = partition {
                    return Err(format!(
                        "topic {topic:?} is replicated: it is purged whole (not partition {p}), \
                         through any node: ctl purge {topic}"
                    ));
                }
                let partitions = meta.partitions;
                ask(ctx, 0, Op::Meta(MetaOp::PurgeTopic { topic })).map_err(err)?;
                return Ok(json!({"purged": (0..partitions).collect::<Vec<u32>>()}));
            }
            let indexes: Vec<u32> = match partition {
                Some(p) if p < meta.partitions => vec![p],
                Some(p) => return Err(format!("topic {topic:?} has no partition {p}")),
                None => (0..meta.partitions).collect(),
            };
            for index in &indexes {
                let owner = shard_for(&topic, *index, shards);
                let id = meta.first_partition_id + index;
                ask(ctx, owner, Op::Purge { partition_id: id }).map_err(err)?;
            }
            Ok(json!({"purged": indexes}))
        }
        Command::Consumers { group } => {
            let rows = ctx
                .consumers
                .rows(&ctx.catalog, &ctx.peers, group.as_deref())?;
            serde_json::to_value(rows).map_err(|e| e.to_string())
        }
        Command::Metrics => Ok(json!({"text": metrics_text(ctx)})),
        Command::Config => config_with_origins(ctx),
        Command::LogLevel { level } => match &ctx.set_log_level {
            Some(hook) => {
                hook(&level)?;
                Ok(json!({"level": level}))
            }
            None => Err("log level cannot be changed in this process".into()),
        },
        Command::Shutdown => {
            ctx.shutdown.trigger();
            Ok(json!({"stopping": true}))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::*;
    use crate::catalog::{Catalog, TopicTable};
    use crate::mailbox::{mailbox, MailboxRx};
    use crate::ops::PartitionStatus;

    fn context(peers: Vec<crate::mailbox::MailboxTx>) -> ControlContext {
        ControlContext {
            config: Arc::default(),
            metrics: peers.iter().map(|_| Arc::default()).collect(),
            peers: Arc::new(peers),
            catalog: Arc::new(Catalog::new(TopicTable::default())),
            started: Instant::now(),
            shutdown: Arc::default(),
            set_log_level: None,
            client_addr: "127.0.0.1:1".parse().unwrap(),
            config_origins: Default::default(),
            consumers: Default::default(),
            peer_stats: None,
        }
    }

    /// Answers every Describe on `rx` with one partition, until `rx`'s
    /// senders are gone or `stop` is set.
    fn answering(
        rx: MailboxRx,
        stop: Arc<std::sync::atomic::AtomicBool>,
    ) -> std::thread::JoinHandle<()> {
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let Some(env) = rx.try_recv() else {
                    std::thread::sleep(Duration::from_millis(1));
                    continue;
                };
                let status = partition_status();
                if let ReplyTo::Thread(tx) = env.reply {
                    let _ = tx.send(Ok(OpReply::Partitions(vec![status])));
                }
            }
        })
    }

    /// A shard that never answers (wedged) and one whose mailbox is full
    /// cost a scrape at most SCRAPE_WAIT, not the control socket's long
    /// reply timeout per shard; the answering shard's partition is there
    /// and the others are counted as unanswered.
    /// A partition as the stub shard describes it.
    fn partition_status() -> PartitionStatus {
        PartitionStatus {
            topic: "t".into(),
            partition: 0,
            partition_id: 0,
            shard: 0,
            role: "leader",
            log_start_offset: 0,
            frontier: 5,
            commit: 5,
            sealed_segments: 0,
            size_bytes: 4096,
            purge_generation: 0,
            fault: None,
            view: None,
            op: None,
            commit_op: None,
            lag_ops: None,
            view_changes: None,
            repairs: None,
            transfer: None,
            commit_latency: None,
        }
    }

    #[test]
    fn a_wedged_or_full_shard_does_not_hold_a_scrape() {
        let (tx0, rx0) = mailbox(4, 1 << 20, 4).unwrap();
        let (tx1, _wedged) = mailbox(4, 1 << 20, 4).unwrap();
        let (tx2, _full) = mailbox(1, 1 << 20, 4).unwrap();
        let (filler, _) = crossbeam_channel::bounded(1);
        tx2.send(Envelope {
            op: Op::ShardStatus,
            reply: ReplyTo::Thread(filler),
        })
        .unwrap();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let server = answering(rx0, stop.clone());
        let ctx = context(vec![tx0, tx1, tx2]);
        let t = Instant::now();
        let text = metrics_text(&ctx);
        let took = t.elapsed();
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        server.join().unwrap();
        assert!(
            took < SCRAPE_WAIT + Duration::from_secs(2),
            "scrape took {took:?}"
        );
        assert!(
            text.contains("ringlog_partition_commit_offset{topic=\"t\",partition=\"0\"} 5\n"),
            "{text}"
        );
        assert!(
            text.contains("ringlog_scrape_shards_unanswered 2\n"),
            "{text}"
        );
        assert!(
            text.contains("ringlog_appends_total{shard=\"2\"} 0\n"),
            "{text}"
        );
    }

    /// `ctl transfers`: a partition without a transfer has no row; one
    /// with shows its progress, rate from its start and ETA from its total.
    #[test]
    fn a_transfer_row_has_rate_and_eta_from_its_start_and_total() {
        use crate::ops::TransferStatus;
        let mut p = PartitionStatus {
            role: "backup",
            ..partition_status()
        };
        assert_eq!(transfer_row(&p, 5_000), None);
        p.transfer = Some(TransferStatus {
            state: "pulling",
            trigger: "new_or_wiped",
            peer_node: Some(2),
            bytes_received: 4 << 20,
            bytes_total: Some(12 << 20),
            chunks_received: 4,
            chunks_total: Some(12),
            chunks_in_flight: 4,
            started_ms: 1_000,
            frozen: true,
        });
        let row = transfer_row(&p, 3_000).unwrap();
        assert_eq!(row["peer_node"], 2);
        assert_eq!(row["rate_bytes_per_second"], f64::from(2u32 << 20));
        assert_eq!(row["eta_seconds"], 4.0);
        assert_eq!(row["chunks_total"], 12);
        // Before the install began: no total, so no ETA.
        p.transfer.as_mut().unwrap().bytes_total = None;
        assert_eq!(transfer_row(&p, 3_000).unwrap()["eta_seconds"], Value::Null);
    }
}
