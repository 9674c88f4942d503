//! `ringlog server`: config layering, logging, signals (SIGINT/SIGTERM stop,
//! SIGHUP reloads `log_level`), run until stopped.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use ringlog_shard::config::{LogFormat, ServerConfig};
use ringlog_shard::control::LogLevelHook;
use ringlog_shard::server::{self, Hooks};
use serde_json::Value;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{reload, EnvFilter};

#[derive(Args)]
pub struct ServerArgs {
    /// TOML config file (keys as in `ServerConfig`; see README).
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// Data directory [default: ./data].
    #[arg(long)]
    data_dir: Option<String>,
    /// Client listen address [default: 127.0.0.1:7420].
    #[arg(long)]
    listen: Option<String>,
    /// Serve Prometheus `GET /metrics` on this address, e.g.
    /// 127.0.0.1:9420 [default: off].
    #[arg(long)]
    metrics_addr: Option<String>,
    /// Shard threads (0: one per core).
    #[arg(long)]
    shards: Option<String>,
    /// Control socket path [default: <data-dir>/control.sock].
    #[arg(long)]
    control_socket: Option<String>,
    /// Segment size in bytes (multiple of 4096).
    #[arg(long)]
    segment_size_bytes: Option<String>,
    /// Per-partition retention by size (0: off).
    #[arg(long)]
    retention_bytes: Option<String>,
    /// Per-partition retention by age (0: off).
    #[arg(long)]
    retention_ms: Option<String>,
    /// Most appends per group commit (fsync batching).
    #[arg(long)]
    group_commit_appends_max: Option<String>,
    /// Extra wait before a group commit, microseconds (fsync batching).
    #[arg(long)]
    group_commit_delay_us: Option<String>,
    /// Cross-shard mailbox capacity.
    #[arg(long)]
    mailbox_capacity: Option<String>,
    /// Cluster name; unset: a single node.
    #[arg(long)]
    cluster_id: Option<String>,
    /// This node's id among the peers.
    #[arg(long)]
    node_id: Option<String>,
    /// A cluster node, this one included, as ID=IP:PORT (repeatable;
    /// replaces the config file's `peers`).
    #[arg(long = "peer", value_name = "ID=IP:PORT")]
    peer: Vec<String>,
    /// File holding the cluster secret (at least 32 bytes, mode 0600).
    #[arg(long)]
    cluster_secret_file: Option<String>,
    /// Peer listen address [default: this node's `peers` address].
    #[arg(long)]
    peer_listen_addr: Option<String>,
    /// Client address announced to peers, which a backup names as the
    /// primary's [default: the bound --listen address; required when that
    /// is 0.0.0.0 or ::].
    #[arg(long)]
    advertise_client_address: Option<String>,
    /// Rebuild topics.json from the partition directories on disk (when it
    /// was lost or is corrupt; a present file is kept as topics.json.replaced).
    #[arg(long)]
    rebuild_catalog: bool,
    /// This node lost its data dir and rejoins its cluster: replicated
    /// partitions created here boot wiped (no vote, no lead) until they
    /// repaired every committed op. Persisted in the data dir (file
    /// RECOVER), so later boots keep it; cluster mode only.
    #[arg(long)]
    recover: bool,
    /// Any other config key: --set key=value (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
}

impl ServerArgs {
    fn overrides(&self) -> Result<Vec<(String, String)>, String> {
        let mut out = Vec::new();
        let named = [
            ("data_dir", &self.data_dir),
            ("listen", &self.listen),
            ("metrics_addr", &self.metrics_addr),
            ("shards", &self.shards),
            ("control_socket", &self.control_socket),
            ("segment_size_bytes", &self.segment_size_bytes),
            ("retention_bytes", &self.retention_bytes),
            ("retention_ms", &self.retention_ms),
            ("group_commit_appends_max", &self.group_commit_appends_max),
            ("group_commit_delay_us", &self.group_commit_delay_us),
            ("mailbox_capacity", &self.mailbox_capacity),
            ("cluster_id", &self.cluster_id),
            ("node_id", &self.node_id),
            ("cluster_secret_file", &self.cluster_secret_file),
            ("peer_listen_addr", &self.peer_listen_addr),
            ("advertise_client_address", &self.advertise_client_address),
        ];
        for (key, value) in named {
            if let Some(v) = value {
                let v = if matches!(
                    key,
                    "data_dir"
                        | "listen"
                        | "metrics_addr"
                        | "control_socket"
                        | "cluster_id"
                        | "cluster_secret_file"
                        | "peer_listen_addr"
                        | "advertise_client_address"
                ) {
                    // Paths and addresses are strings whatever they look like.
                    format!("{v:?}")
                } else {
                    v.clone()
                };
                out.push((key.to_string(), v));
            }
        }
        if self.recover {
            out.push(("recover".to_string(), "true".to_string()));
        }
        if !self.peer.is_empty() {
            // One comma-separated string, as in RINGLOG_PEERS.
            out.push(("peers".to_string(), format!("{:?}", self.peer.join(","))));
        }
        for kv in &self.set {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| format!("--set {kv:?}: expected KEY=VALUE"))?;
            out.push((k.trim().to_string(), v.trim().to_string()));
        }
        Ok(out)
    }
}

/// Levels a `log_level` directive may name.
const LEVELS: &str = "off, error, warn, info, debug, trace";

/// Parses a `log_level` filter. Stricter than tracing's own syntax: every
/// comma-separated directive must end in a level (`info`,
/// `ringlog_shard=debug`), since a bare word like `loud` would otherwise be
/// taken for a target name and silently log nothing else.
pub fn log_filter(filter: &str) -> Result<EnvFilter, String> {
    let bad = |why: String| {
        format!(
            "{filter:?} is not a log filter ({why}): levels are {LEVELS}, \
             optionally per target as in \"warn,ringlog_shard=debug\""
        )
    };
    let directives: Vec<&str> = filter
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .collect();
    if directives.is_empty() {
        return Err(bad("empty".into()));
    }
    for d in directives {
        let level = d.rsplit_once('=').map_or(d, |(_, l)| l);
        if !LEVELS.split(", ").any(|l| l.eq_ignore_ascii_case(level)) {
            return Err(bad(format!("{level:?} is not a level")));
        }
    }
    EnvFilter::try_new(filter).map_err(|e| bad(e.to_string()))
}

type FilterHandle = reload::Handle<EnvFilter, tracing_subscriber::Registry>;

/// Installs the stderr logger in `format` under `filter`; the handle swaps
/// the filter at run time (`ctl log-level`, SIGHUP).
fn init_logging(filter: EnvFilter, format: LogFormat) -> FilterHandle {
    let (filter, handle) = reload::Layer::new(filter);
    let json = format == LogFormat::Json;
    let text_layer = (!json).then(|| {
        tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
    });
    let json_layer = json.then(|| {
        tracing_subscriber::fmt::layer()
            .json()
            .with_writer(std::io::stderr)
    });
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(text_layer)
        .with(json_layer)
        .try_init();
    handle
}

/// What SIGHUP re-reads: the same file, environment and flags as at start.
struct Reload {
    file: Option<PathBuf>,
    overrides: Vec<(String, String)>,
    running: ServerConfig,
    set_level: LogLevelHook,
}

impl Reload {
    /// Loads the config again and applies `log_level`, the one key that can
    /// change while running; other changed keys are named as needing a
    /// restart. A config that does not load changes nothing.
    fn reload(&self) {
        let loaded = ServerConfig::load_with_origins(
            self.file.as_deref(),
            std::env::vars(),
            &self.overrides,
        )
        .map_err(|e| e.to_string())
        .and_then(|(c, origins)| {
            log_filter(&c.log_level)
                .map(|_| c)
                .map_err(|e| format!("config key `log_level` ({}): {e}", origin(&origins)))
        });
        let config = match loaded {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "SIGHUP: config reload refused; nothing changed");
                return;
            }
        };
        let result = match (self.set_level)(&config.log_level) {
            Ok(()) => "ok".to_string(),
            Err(e) => format!("error: {e}"),
        };
        tracing::info!(target: "audit", who = "signal SIGHUP", cmd = "log_level",
            what = %format!("level={}", config.log_level), result = %result, "operator action");
        let restart = changed_keys(&self.running, &config);
        if !restart.is_empty() {
            tracing::warn!(keys = %restart.join(", "), "SIGHUP: changed keys take effect only at restart");
        }
        tracing::info!(log_level = %config.log_level, "SIGHUP: config reloaded");
    }
}

fn origin(origins: &ringlog_shard::config::ConfigOrigins) -> &str {
    origins.get("log_level").map_or("default", String::as_str)
}

/// Keys other than `log_level` whose values differ between `a` and `b`.
fn changed_keys(a: &ServerConfig, b: &ServerConfig) -> Vec<String> {
    let (Ok(Value::Object(a)), Ok(Value::Object(b))) =
        (serde_json::to_value(a), serde_json::to_value(b))
    else {
        return vec!["(config not comparable)".into()];
    };
    a.iter()
        .filter(|(k, v)| k.as_str() != "log_level" && b.get(k.as_str()) != Some(v))
        .map(|(k, _)| k.clone())
        .collect()
}

pub fn run(args: ServerArgs) -> i32 {
    let overrides = match args.overrides() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("ringlog server: {e}");
            return 2;
        }
    };
    let loaded =
        ServerConfig::load_with_origins(args.config.as_deref(), std::env::vars(), &overrides);
    let (config, config_origins) = match loaded {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ringlog server: {e}");
            return 2;
        }
    };
    // A bad filter stops the server like any bad key (it used to fall back
    // to "info" without a word).
    let filter = match log_filter(&config.log_level) {
        Ok(f) => f,
        Err(e) => {
            eprintln!(
                "ringlog server: config key `log_level` ({}): {e}",
                origin(&config_origins)
            );
            return 2;
        }
    };
    let handle = init_logging(filter, config.log_format);
    let set_level: LogLevelHook =
        Arc::new(move |level: &str| handle.reload(log_filter(level)?).map_err(|e| e.to_string()));
    let reload = Reload {
        file: args.config.clone(),
        overrides,
        running: config.clone(),
        set_level: set_level.clone(),
    };

    // Signals are taken by one thread with sigwait; every other thread
    // (shards included) inherits the blocked mask.
    let set = block_signals();
    let running = match server::start(
        config,
        Hooks {
            set_log_level: Some(set_level),
            rebuild_catalog: args.rebuild_catalog,
            config_origins,
        },
    ) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("ringlog server: {e}");
            return 1;
        }
    };
    let metrics = running
        .metrics_addr
        .map_or_else(String::new, |a| format!(" metrics={a}"));
    println!(
        "ringlog ready client={} control={}{metrics}",
        running.client_addr,
        running.control_socket.display()
    );
    let pointer = crate::ctl::record_socket(&running.control_socket);
    let shutdown = running.shutdown_handle();
    let spawned = std::thread::Builder::new()
        .name("ringlog-signals".into())
        .spawn(move || loop {
            let mut sig: libc::c_int = 0;
            // SAFETY: set is an initialised sigset; sig is a valid out pointer.
            let rc = unsafe { libc::sigwait(&set, &mut sig) };
            if rc != 0 {
                continue;
            }
            if sig == libc::SIGHUP {
                reload.reload();
                continue;
            }
            let who = format!("signal {}", signal_name(sig));
            tracing::info!(target: "audit", who = %who, cmd = "shutdown", what = "",
                result = "ok", "operator action");
            tracing::info!(signal = sig, "signal received; shutting down");
            shutdown.trigger();
        });
    if let Err(e) = spawned {
        eprintln!("ringlog server: signal thread: {e}");
        return 1;
    }
    let result = running.wait();
    if let Some(p) = pointer {
        p.remove();
    }
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("ringlog server: {e}");
            1
        }
    }
}

fn signal_name(sig: libc::c_int) -> &'static str {
    match sig {
        libc::SIGINT => "SIGINT",
        libc::SIGTERM => "SIGTERM",
        libc::SIGHUP => "SIGHUP",
        _ => "other",
    }
}

/// SIGINT and SIGTERM stop the server; SIGHUP reloads `log_level` (its
/// default action would kill the process).
fn block_signals() -> libc::sigset_t {
    // SAFETY: sigset manipulation on a zeroed, then emptied, set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGHUP);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}
