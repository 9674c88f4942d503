//! `ringlog ctl`: control socket commands printed as tables (or raw JSON).

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};
use ringlog_shard::control::client::request;
use serde_json::{json, Value};

#[derive(Args)]
pub struct CtlArgs {
    /// Control socket [default: $RINGLOG_CONTROL_SOCKET or ./data/control.sock].
    #[arg(long, short)]
    socket: Option<PathBuf>,
    /// Print the raw JSON reply.
    #[arg(long)]
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
    /// Partitions: shard, frontier, commit, segments, bytes.
    Partitions { topic: Option<String> },
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
    /// Prometheus metrics text.
    Metrics,
    /// Change the log filter (e.g. debug, info, ringlog_shard=trace).
    LogLevel { level: String },
    /// Graceful shutdown.
    Shutdown,
    /// Send a raw JSON line.
    Raw { line: String },
}

pub fn run(args: CtlArgs) -> i32 {
    let socket = args.socket.clone().unwrap_or_else(|| {
        std::env::var_os("RINGLOG_CONTROL_SOCKET")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("./data/control.sock"))
    });
    let req = match &args.command {
        CtlCommand::Status => json!({"cmd": "status"}),
        CtlCommand::Topics => json!({"cmd": "topics"}),
        CtlCommand::Partitions { topic } => json!({"cmd": "partitions", "topic": topic}),
        CtlCommand::CreateTopic { topic, partitions } => {
            json!({"cmd": "create_topic", "topic": topic, "partitions": partitions})
        }
        CtlCommand::DeleteTopic { topic } => json!({"cmd": "delete_topic", "topic": topic}),
        CtlCommand::Purge { topic, partition } => {
            json!({"cmd": "purge", "topic": topic, "partition": partition})
        }
        CtlCommand::Metrics => json!({"cmd": "metrics"}),
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
                "TOPIC", "PART", "ID", "SHARD", "ROLE", "START", "FRONTIER", "COMMIT", "SEGMENTS",
                "BYTES", "FAULT",
            ],
            rows(
                result,
                &[
                    "topic",
                    "partition",
                    "partition_id",
                    "shard",
                    "role",
                    "log_start_offset",
                    "frontier",
                    "commit",
                    "sealed_segments",
                    "size_bytes",
                    "fault",
                ],
            ),
        ),
        CtlCommand::Metrics => print!("{}", result["text"].as_str().unwrap_or("")),
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
