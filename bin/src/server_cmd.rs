//! `ringlog server`: config layering, logging, signals, run until stopped.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use ringlog_shard::config::ServerConfig;
use ringlog_shard::server::{self, Hooks};
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
    /// Rebuild topics.json from the partition directories on disk (when it
    /// was lost or is corrupt; a present file is kept as topics.json.replaced).
    #[arg(long)]
    rebuild_catalog: bool,
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
            ("shards", &self.shards),
            ("control_socket", &self.control_socket),
            ("segment_size_bytes", &self.segment_size_bytes),
            ("retention_bytes", &self.retention_bytes),
            ("retention_ms", &self.retention_ms),
            ("group_commit_appends_max", &self.group_commit_appends_max),
            ("group_commit_delay_us", &self.group_commit_delay_us),
            ("mailbox_capacity", &self.mailbox_capacity),
        ];
        for (key, value) in named {
            if let Some(v) = value {
                let v = if matches!(key, "data_dir" | "listen" | "control_socket") {
                    // Paths and addresses are strings whatever they look like.
                    format!("{v:?}")
                } else {
                    v.clone()
                };
                out.push((key.to_string(), v));
            }
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
    let filter = EnvFilter::try_new(&config.log_level).unwrap_or_else(|_| EnvFilter::new("info"));
    let (filter, handle) = reload::Layer::new(filter);
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())),
        )
        .try_init();
    let set_level: ringlog_shard::control::LogLevelHook = Arc::new(move |level: &str| {
        let f = EnvFilter::try_new(level).map_err(|e| format!("bad log filter {level:?}: {e}"))?;
        handle.reload(f).map_err(|e| e.to_string())
    });

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
    println!(
        "ringlog ready client={} control={}",
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
            if rc == 0 {
                tracing::info!(signal = sig, "signal received; shutting down");
                shutdown.trigger();
            }
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

fn block_signals() -> libc::sigset_t {
    // SAFETY: sigset manipulation on a zeroed, then emptied, set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}
