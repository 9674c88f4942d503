//! `ringlog ctl`: control socket commands printed as tables (or raw JSON).
//!
//! The socket is found without depending on the working directory: `--socket`,
//! `RINGLOG_CONTROL_SOCKET`, `<--data-dir>/control.sock`,
//! `<RINGLOG_DATA_DIR>/control.sock`, `./data/control.sock` if it exists,
//! then the socket the last `ringlog server` started by this user recorded
//! in the runtime directory (`$XDG_RUNTIME_DIR/ringlog/control-socket`, else
//! `/tmp/ringlog-<uid>/control-socket`, holding an absolute path).

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Subcommand};
use ringlog_shard::control::client::request;
use serde_json::{json, Value};

#[derive(Args)]
pub struct CtlArgs {
    /// Control socket [default: $RINGLOG_CONTROL_SOCKET, else found from
    /// --data-dir, $RINGLOG_DATA_DIR, ./data, or the last started server].
    #[arg(long, short, global = true)]
    socket: Option<PathBuf>,
    /// The server's data directory; its control.sock is used.
    #[arg(long, global = true)]
    data_dir: Option<PathBuf>,
    /// Print the raw JSON reply.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: CtlCommand,
}

#[derive(Subcommand)]
enum CtlCommand {
    /// Node, shards, uptime, partitions per shard.
    Status,
    /// Topics and their partition counts.
    Topics,
    /// Partitions of every node of the cluster (a node that cannot be
    /// asked is listed as unreachable): node, shard, role, frontier, commit
    /// (offsets), and for a replicated one its view, op, commit op and lag
    /// (behind the highest commit any replica reports); segments, bytes.
    Partitions {
        topic: Option<String>,
        /// This node's replicas only (no peer is asked).
        #[arg(long)]
        local: bool,
    },
    /// Create a topic.
    CreateTopic { topic: String, partitions: u32 },
    /// Delete a topic and its data.
    DeleteTopic { topic: String },
    /// Drop all stored records of a topic (or one partition); offsets continue.
    Purge {
        topic: String,
        #[arg(long)]
        partition: Option<u32>,
    },
    /// Consumer groups: committed offset, partition start and end, and lag
    /// per partition, as the server reads them from the offsets topic.
    Consumers { group: Option<String> },
    /// Prometheus metrics text.
    Metrics,
    /// Cluster nodes: id, peer address, client address, reachable (our
    /// session to it is up), its session to us, incarnation, last heard from.
    Cluster,
    /// State transfers running: partition, peer node, state, bytes and
    /// chunks received of the offer's total, rate, ETA.
    Transfers,
    /// Effective config: every key, its value and where it came from
    /// (default, file, environment, flag).
    Config,
    /// Change the log filter (e.g. debug, info, ringlog_shard=trace).
    LogLevel { level: String },
    /// Graceful shutdown.
    Shutdown,
    /// Send a raw JSON line.
    Raw { line: String },
}

/// The per-user directory where a server records its socket.
fn runtime_dir() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        Some(d) => PathBuf::from(d).join("ringlog"),
        // SAFETY: getuid has no preconditions.
        None => std::env::temp_dir().join(format!("ringlog-{}", unsafe { libc::getuid() })),
    }
}

fn pointer_path() -> PathBuf {
    runtime_dir().join("control-socket")
}

/// The runtime-dir record of a running server's socket, removed at exit.
pub struct SocketRecord {
    path: PathBuf,
    socket: PathBuf,
}

impl SocketRecord {
    /// Removes the record if it still names this server's socket (a later
    /// server may have replaced it).
    pub fn remove(self) {
        if std::fs::read(&self.path).ok().as_deref()
            == Some(self.socket.as_os_str().as_encoded_bytes())
        {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Records `socket` (made absolute) for `ctl` run from anywhere. Failing to
/// is logged, not fatal: `--socket` and `--data-dir` still work.
pub fn record_socket(socket: &Path) -> Option<SocketRecord> {
    let socket = std::path::absolute(socket).ok()?;
    let dir = runtime_dir();
    let path = pointer_path();
    let tmp = dir.join(format!("control-socket.{}", std::process::id()));
    let written = std::fs::create_dir_all(&dir)
        .and_then(|()| std::fs::write(&tmp, socket.as_os_str().as_encoded_bytes()))
        .and_then(|()| std::fs::rename(&tmp, &path));
    match written {
        Ok(()) => Some(SocketRecord { path, socket }),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot record the control socket for ctl");
            None
        }
    }
}

/// Where to look for the socket, in order, each with where it came from.
fn socket_candidates(args: &CtlArgs) -> Vec<(PathBuf, String)> {
    if let Some(s) = &args.socket {
        return vec![(s.clone(), "--socket".into())];
    }
    if let Some(s) = std::env::var_os("RINGLOG_CONTROL_SOCKET").filter(|s| !s.is_empty()) {
        return vec![(s.into(), "RINGLOG_CONTROL_SOCKET".into())];
    }
    if let Some(d) = &args.data_dir {
        return vec![(d.join("control.sock"), "--data-dir".into())];
    }
    if let Some(d) = std::env::var_os("RINGLOG_DATA_DIR").filter(|s| !s.is_empty()) {
        return vec![(
            PathBuf::from(d).join("control.sock"),
            "RINGLOG_DATA_DIR".into(),
        )];
    }
    let mut out = vec![(PathBuf::from("./data/control.sock"), "./data".into())];
    let pointer = pointer_path();
    if let Ok(bytes) = std::fs::read(&pointer) {
        let recorded = PathBuf::from(String::from_utf8_lossy(&bytes).into_owned());
        out.push((recorded, format!("recorded in {}", pointer.display())));
    }
    out
}

/// The first candidate that exists, or what to do about none.
fn find_socket(args: &CtlArgs) -> Result<PathBuf, String> {
    let candidates = socket_candidates(args);
    if let Some((p, _)) = candidates.iter().find(|(p, _)| p.exists()) {
        return Ok(p.clone());
    }
    let tried: Vec<String> = candidates
        .iter()
        .map(|(p, from)| format!("{} ({from})", p.display()))
        .collect();
    Err(format!(
        "no control socket at {}; is the server running? start it with `ringlog server`, \
         or point ctl at it with --data-dir DIR (or RINGLOG_DATA_DIR), --socket PATH \
         (or RINGLOG_CONTROL_SOCKET)",
        tried.join(" or ")
    ))
}

pub fn run(args: CtlArgs) -> i32 {
    // `ctl partitions | head`: a closed pipe ends ctl quietly, as it does
    // cat (Rust ignores SIGPIPE, and println! would panic on EPIPE).
    // SAFETY: restoring the default disposition of one signal at start,
    // before any thread is spawned.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let socket = match find_socket(&args) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("ringlog ctl: {e}");
            return 1;
        }
    };
    let req = match &args.command {
        CtlCommand::Status => json!({"cmd": "status"}),
        CtlCommand::Topics => json!({"cmd": "topics"}),
        CtlCommand::Partitions { topic, local } => {
            json!({"cmd": "partitions", "topic": topic, "cluster": !local})
        }
        CtlCommand::CreateTopic { topic, partitions } => {
            json!({"cmd": "create_topic", "topic": topic, "partitions": partitions})
        }
        CtlCommand::DeleteTopic { topic } => json!({"cmd": "delete_topic", "topic": topic}),
        CtlCommand::Purge { topic, partition } => {
            json!({"cmd": "purge", "topic": topic, "partition": partition})
        }
        CtlCommand::Consumers { group } => json!({"cmd": "consumers", "group": group}),
        CtlCommand::Metrics => json!({"cmd": "metrics"}),
        CtlCommand::Cluster => json!({"cmd": "cluster"}),
        CtlCommand::Transfers => json!({"cmd": "transfers"}),
        CtlCommand::Config => json!({"cmd": "config"}),
        CtlCommand::LogLevel { level } => json!({"cmd": "log_level", "level": level}),
        CtlCommand::Shutdown => json!({"cmd": "shutdown"}),
        CtlCommand::Raw { line } => match serde_json::from_str(line) {
            Ok(v) => v,
            Err(e) => {
                eprintln!("ringlog ctl: not JSON: {e}");
                return 2;
            }
        },
    };
    let reply = match request(&socket, &req, Duration::from_secs(60)) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("ringlog ctl: {e}");
            return 1;
        }
    };
    if args.json {
        println!("{reply}");
        return if reply["ok"] == json!(true) { 0 } else { 1 };
    }
    if reply["ok"] != json!(true) {
        eprintln!(
            "ringlog ctl: error: {}",
            reply["error"].as_str().unwrap_or("unknown error")
        );
        return 1;
    }
    let result = &reply["result"];
    match &args.command {
        CtlCommand::Status => print_status(result),
        CtlCommand::Topics => table(
            &["TOPIC", "PARTITIONS", "STATE"],
            rows(result, &["topic", "partitions", "state"]),
        ),
        CtlCommand::Partitions { .. } => table(
            &[
                "NODE",
                "TOPIC",
                "PART",
                "ID",
                "SHARD",
                "ROLE",
                "START",
                "FRONTIER",
                "COMMIT",
                "VIEW",
                "OP",
                "COMMIT_OP",
                "LAG_OPS",
                "SEGMENTS",
                "BYTES",
                "FAULT",
            ],
            rows(
                result,
                &[
                    "node",
                    "topic",
                    "partition",
                    "partition_id",
                    "shard",
                    "role",
                    "log_start_offset",
                    "frontier",
                    "commit",
                    "view",
                    "op",
                    "commit_op",
                    "lag_ops",
                    "sealed_segments",
                    "size_bytes",
                    "fault",
                ],
            ),
        ),
        CtlCommand::Consumers { .. } => print_consumers(result),
        CtlCommand::Transfers => table(
            &[
                "TOPIC",
                "PART",
                "SHARD",
                "PEER",
                "STATE",
                "TRIGGER",
                "BYTES",
                "OF",
                "CHUNKS",
                "OF",
                "IN_FLIGHT",
                "RATE_B/S",
                "ETA_S",
            ],
            rows(
                result,
                &[
                    "topic",
                    "partition",
                    "shard",
                    "peer_node",
                    "state",
                    "trigger",
                    "bytes_received",
                    "bytes_total",
                    "chunks_received",
                    "chunks_total",
                    "chunks_in_flight",
                    "rate_bytes_per_second",
                    "eta_seconds",
                ],
            ),
        ),
        CtlCommand::Cluster => {
            println!(
                "cluster {} (this node: {})",
                cell(&result["cluster_id"]),
                cell(&result["node_id"])
            );
            table(
                &[
                    "NODE",
                    "ADDRESS",
                    "CLIENT_ADDRESS",
                    "SELF",
                    "REACHABLE",
                    "INBOUND",
                    "INCARNATION",
                    "LAST_SEEN_MS_AGO",
                ],
                rows(
                    &result["nodes"],
                    &[
                        "id",
                        "address",
                        "client_address",
                        "self",
                        "reachable",
                        "inbound",
                        "incarnation",
                        "last_seen_ms_ago",
                    ],
                ),
            )
        }
        CtlCommand::Metrics => print!("{}", result["text"].as_str().unwrap_or("")),
        CtlCommand::Config => table(
            &["KEY", "VALUE", "SOURCE"],
            rows(result, &["key", "value", "source"]),
        ),
        _ => println!(
            "ok {}",
            if result.is_null() {
                json!({})
            } else {
                result.clone()
            }
        ),
    }
    0
}

/// `ctl consumers`: the server's table of commits (see
/// `ringlog_shard::control::consumers`); `NOTE` says when a committed
/// offset is outside the stored range, where the consumer's `--reset`
/// policy decides.
fn print_consumers(result: &Value) {
    let mut list = rows(
        result,
        &[
            "group",
            "topic",
            "partition",
            "log_start",
            "committed",
            "end",
            "lag",
        ],
    );
    let notes = result.as_array().into_iter().flatten().map(|r| {
        if r["out_of_range"] == json!(true) {
            "outside the log: --reset applies".to_string()
        } else {
            "-".to_string()
        }
    });
    for (row, note) in list.iter_mut().zip(notes) {
        row.push(note);
    }
    table(
        &[
            "GROUP",
            "TOPIC",
            "PART",
            "START",
            "COMMITTED",
            "END",
            "LAG",
            "NOTE",
        ],
        list,
    );
}

fn cell(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn rows(list: &Value, keys: &[&str]) -> Vec<Vec<String>> {
    list.as_array()
        .map(|a| {
            a.iter()
                .map(|item| keys.iter().map(|k| cell(&item[*k])).collect())
                .collect()
        })
        .unwrap_or_default()
}

fn table(headers: &[&str], rows: Vec<Vec<String>>) {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.len());
        }
    }
    let line = |cells: Vec<String>| {
        let parts: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<w$}", w = widths[i]))
            .collect();
        println!("{}", parts.join("  ").trim_end());
    };
    line(headers.iter().map(|h| h.to_string()).collect());
    for r in rows {
        line(r);
    }
}

fn print_status(v: &Value) {
    let n = &v["node"];
    println!(
        "node      ringlog {} (pid {})",
        cell(&n["version"]),
        cell(&n["pid"])
    );
    println!("listen    {}", cell(&n["listen"]));
    println!("data dir  {}", cell(&n["data_dir"]));
    println!("uptime    {}s", cell(&n["uptime_s"]));
    println!("mode      {}", cell(&n["replication"]));
    println!("topics    {}", cell(&n["topics"]));
    println!();
    table(
        &["SHARD", "CORE", "PARTITIONS", "CONNECTIONS", "MAILBOX"],
        rows(
            &v["shards"],
            &[
                "shard",
                "core",
                "partitions",
                "connections",
                "mailbox_depth",
            ],
        ),
    );
}
