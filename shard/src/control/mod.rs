//! The control socket: a Unix socket (mode 0600) speaking JSON lines.
//!
//! Each request is one line holding a JSON object with a `cmd` field; each
//! reply is one line: `{"ok":true,"result":...}` or
//! `{"ok":false,"error":"..."}`. Commands: `status`, `topics`,
//! `partitions` (optional `topic`; `cluster: true` adds every peer's
//! replicas, see [`replicas`]), `create_topic` (`topic`, `partitions`),
//! `delete_topic` (`topic`), `purge` (`topic`, optional `partition`),
//! `consumers` (optional `group`: committed offset, start, end and lag per
//! group and partition, see [`consumers`]), `metrics` (Prometheus text in
//! `result.text`, consumer lag included, the same text as `GET /metrics` on
//! `metrics_addr`, see [`metrics_http`]), `config`, `log_level` (`level`),
//! `shutdown`. Each command that changes the server logs one line of target
//! `audit` (who, cmd, what, result).
//!
//! Bounds: lines up to [`LINE_BYTES_MAX`] (a longer one is skipped and
//! answered with an error; the connection stays usable), at most
//! [`CONNECTIONS_MAX`] connections at once, idle connections closed after
//! [`IDLE_TIMEOUT`].

pub mod client;
mod commands;
pub mod consumers;
pub mod metrics_http;
mod replicas;
mod server;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::catalog::Catalog;
use crate::config::ServerConfig;
use crate::mailbox::MailboxTx;
use crate::metrics::ShardMetrics;
use crate::shard::Shutdown;

pub use metrics_http::MetricsHttp;
pub use server::ControlServer;

pub const LINE_BYTES_MAX: usize = 1024 * 1024;
pub const CONNECTIONS_MAX: usize = 16;
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(300);

/// Sets the process log filter; returns a message on a bad filter.
pub type LogLevelHook = Arc<dyn Fn(&str) -> Result<(), String> + Send + Sync>;

/// What command handlers can see.
pub struct ControlContext {
    pub config: Arc<ServerConfig>,
    pub peers: Arc<Vec<MailboxTx>>,
    pub metrics: Vec<Arc<ShardMetrics>>,
    pub catalog: Arc<Catalog>,
    pub started: Instant,
    pub shutdown: Arc<Shutdown>,
    pub set_log_level: Option<LogLevelHook>,
    pub client_addr: SocketAddr,
    pub config_origins: crate::config::ConfigOrigins,
    /// Commits read so far, so `consumers` and each scrape read only new ones.
    pub consumers: consumers::ConsumerTable,
    /// The replication transport's counters and node table (a cluster
    /// node only).
    pub peer_stats: Option<Arc<crate::net::peer::PeerStats>>,
}
