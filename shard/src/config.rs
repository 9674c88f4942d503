//! Server settings: defaults, a TOML file, `RINGLOG_*` environment overrides
//! and command-line overrides, applied in that order. Every key is checked;
//! a bad one is reported by name.

use std::path::{Path, PathBuf};

use ringlog_storage::store::StoreConfig;
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Prefix of environment overrides: `RINGLOG_<KEY>` (key upper-cased).
pub const ENV_PREFIX: &str = "RINGLOG_";

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Where topics.json and the partitions live.
    pub data_dir: PathBuf,
    /// Client protocol address (host:port; port 0 picks a free port).
    pub listen: String,
    /// `GET /metrics` (Prometheus text) over HTTP on this address
    /// (host:port; port 0 picks a free port); empty = off.
    pub metrics_addr: String,
    /// Shard threads; 0 = one per available core.
    pub shards: usize,
    /// Pin each shard thread to a core (core_affinity).
    pub pin_cores: bool,
    /// Control socket path; empty = `<data_dir>/control.sock`.
    pub control_socket: PathBuf,
    /// Segment size; a multiple of 4096.
    pub segment_size_bytes: u64,
    /// Per-partition write buffer; also bounds one batch (less 4 KiB).
    pub write_buffer_bytes: usize,
    /// Delete old sealed segments beyond this size per partition (0 = off).
    pub retention_bytes: u64,
    /// Delete sealed segments older than this (0 = off).
    pub retention_ms: u64,
    /// How often each shard applies retention.
    pub retention_check_ms: u64,
    /// Fsync batching: most appends collected into one group commit (one
    /// flush of every touched partition, one fdatasync each).
    pub group_commit_appends_max: usize,
    /// Fsync batching: extra wait before a group commit to gather more
    /// appends (0 = commit as soon as the current turn's appends are in).
    pub group_commit_delay_us: u64,
    /// Bound of each shard's cross-shard request mailbox. Full = the client
    /// gets a retryable Backpressure error.
    pub mailbox_capacity: usize,
    /// Requests one shard may have forwarded and unanswered at once (bounds
    /// its reply mailbox).
    pub forward_inflight_max: usize,
    /// Bytes of produce batches one shard's request mailbox may hold; a
    /// forward that would exceed it gets a retryable Backpressure error.
    /// At least `frame_bytes_max`, so any batch can be forwarded.
    pub mailbox_bytes_max: u64,
    /// Client connections per shard; more are refused with an error.
    pub connections_per_shard_max: usize,
    /// Byte budget of each shard's client connections: request bodies from
    /// their header until their reply is written, and the reply room of
    /// each fetch. Over it, requests get a retryable Backpressure error.
    /// At least `frame_bytes_max`.
    pub shard_request_bytes_max: u64,
    /// A started frame must deliver its 12-byte header within this, and its
    /// body must make progress at least this often; else the connection is
    /// closed.
    pub header_timeout_ms: u64,
    /// A connection with no request for this long is closed.
    pub idle_timeout_ms: u64,
    /// Largest client frame body accepted.
    pub frame_bytes_max: u32,
    /// Long-poll fetches waiting per partition; more return at once.
    pub fetch_waiters_max: usize,
    /// Longest long-poll wait a fetch may ask for.
    pub fetch_wait_ms_max: u32,
    /// Memory each shard's read cache of recently durable batches may hold
    /// (shared by the shard's partitions, oldest evicted first): fetches
    /// within it are served without device reads. 0 = off.
    pub read_cache_bytes: u64,
    /// tracing filter (e.g. "info", "ringlog_shard=debug").
    pub log_level: String,
    /// Log line format on stderr.
    pub log_format: LogFormat,
}

/// `log_format`: human-readable lines, or one JSON object per line.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            data_dir: PathBuf::from("./data"),
            listen: "127.0.0.1:7420".into(),
            metrics_addr: String::new(),
            shards: 0,
            pin_cores: true,
            control_socket: PathBuf::new(),
            segment_size_bytes: 256 * 1024 * 1024,
            write_buffer_bytes: 4 * 1024 * 1024,
            retention_bytes: 0,
            retention_ms: 0,
            retention_check_ms: 10_000,
            group_commit_appends_max: 1024,
            group_commit_delay_us: 0,
            mailbox_capacity: 1024,
            forward_inflight_max: 4096,
            mailbox_bytes_max: 256 * 1024 * 1024,
            connections_per_shard_max: 1024,
            shard_request_bytes_max: 256 * 1024 * 1024,
            header_timeout_ms: 10_000,
            idle_timeout_ms: 300_000,
            frame_bytes_max: 16 * 1024 * 1024,
            fetch_waiters_max: 256,
            fetch_wait_ms_max: 60_000,
            read_cache_bytes: 128 * 1024 * 1024,
            log_level: "info".into(),
            log_format: LogFormat::Text,
        }
    }
}

#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path} is not valid TOML: {message}")]
    Syntax { path: PathBuf, message: String },
    #[error("config key `{key}` ({origin}): {message}")]
    Key {
        key: String,
        origin: String,
        message: String,
    },
}

/// Key -> where its value came from (`file PATH`, `environment RINGLOG_X`,
/// `flag --x`); a key not in it has its default.
pub type ConfigOrigins = std::collections::BTreeMap<String, String>;

/// Where a setting came from, for error messages.
#[derive(Clone, Debug)]
struct Layered {
    table: toml::Table,
    origins: Vec<(String, String)>,
}

impl Layered {
    fn set(&mut self, key: &str, value: toml::Value, origin: String) {
        self.table.insert(key.to_string(), value);
        self.origins.retain(|(k, _)| k != key);
        self.origins.push((key.to_string(), origin));
    }

    fn origin(&self, key: &str) -> String {
        self.origins
            .iter()
            .find(|(k, _)| k == key)
            .map_or_else(|| "default".to_string(), |(_, o)| o.clone())
    }
}

impl ServerConfig {
    /// Builds the config: defaults, then `file` (if any), then `RINGLOG_*`
    /// variables from `env`, then `overrides` (`key`, `value` as written in
    /// TOML or as a bare string).
    pub fn load(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
        overrides: &[(String, String)],
    ) -> Result<ServerConfig, ConfigError> {
        Self::load_with_origins(file, env, overrides).map(|(config, _)| config)
    }

    /// [`ServerConfig::load`], also returning where each key not left at
    /// its default came from (`ctl config`).
    pub fn load_with_origins(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
        overrides: &[(String, String)],
    ) -> Result<(ServerConfig, ConfigOrigins), ConfigError> {
        let mut layered = Layered {
            table: toml::Table::new(),
            origins: Vec::new(),
        };
        if let Some(path) = file {
            let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                path: path.into(),
                source,
            })?;
            let table: toml::Table =
                text.parse()
                    .map_err(|e: toml::de::Error| ConfigError::Syntax {
                        path: path.into(),
                        message: e.to_string(),
                    })?;
            for (k, v) in table {
                layered.set(&k, v, format!("file {}", path.display()));
            }
        }
        let known = known_keys();
        for (name, value) in env {
            let Some(key) = name.strip_prefix(ENV_PREFIX) else {
                continue;
            };
            let key = key.to_ascii_lowercase();
            if !known.contains(&key) {
                // Not a config variable (e.g. RINGLOG_LOG used by tests).
                continue;
            }
            layered.set(&key, scalar(&value), format!("environment {name}"));
        }
        for (key, value) in overrides {
            layered.set(
                key,
                scalar(value),
                format!("flag --{}", key.replace('_', "-")),
            );
        }
        for key in layered.table.keys() {
            if !known.contains(key) {
                return Err(ConfigError::Key {
                    key: key.clone(),
                    origin: layered.origin(key),
                    message: format!("unknown key; known keys: {}", known.join(", ")),
                });
            }
        }
        let config: ServerConfig = match layered.table.clone().try_into() {
            Ok(c) => c,
            Err(e) => return Err(blame(&layered, e)),
        };
        config
            .validate()
            .map_err(|(key, message)| ConfigError::Key {
                key: key.to_string(),
                origin: layered.origin(key),
                message,
            })?;
        Ok((config, layered.origins.into_iter().collect()))
    }

    /// Semantic checks; returns the offending key.
    fn validate(&self) -> Result<(), (&'static str, String)> {
        let positive = |key: &'static str, v: u64| {
            if v == 0 {
                Err((key, "must be at least 1".to_string()))
            } else {
                Ok(())
            }
        };
        if self.shards > 256 {
            return Err(("shards", format!("{} is above the limit 256", self.shards)));
        }
        positive("mailbox_capacity", self.mailbox_capacity as u64)?;
        positive("forward_inflight_max", self.forward_inflight_max as u64)?;
        positive(
            "connections_per_shard_max",
            self.connections_per_shard_max as u64,
        )?;
        positive(
            "group_commit_appends_max",
            self.group_commit_appends_max as u64,
        )?;
        positive("retention_check_ms", self.retention_check_ms)?;
        positive("header_timeout_ms", self.header_timeout_ms)?;
        positive("idle_timeout_ms", self.idle_timeout_ms)?;
        if self.listen.parse::<std::net::SocketAddr>().is_err() {
            return Err((
                "listen",
                format!("{:?} is not an address like 127.0.0.1:7420", self.listen),
            ));
        }
        if !self.metrics_addr.is_empty()
            && self.metrics_addr.parse::<std::net::SocketAddr>().is_err()
        {
            return Err((
                "metrics_addr",
                format!(
                    "{:?} is not an address like 127.0.0.1:9420 (empty: off)",
                    self.metrics_addr
                ),
            ));
        }
        if self.frame_bytes_max < 4096
            || self.frame_bytes_max > ringlog_protocol::wire::FRAME_BYTES_MAX
        {
            return Err((
                "frame_bytes_max",
                format!(
                    "{} must be between 4096 and {}",
                    self.frame_bytes_max,
                    ringlog_protocol::wire::FRAME_BYTES_MAX
                ),
            ));
        }
        for (key, value) in [
            ("shard_request_bytes_max", self.shard_request_bytes_max),
            ("mailbox_bytes_max", self.mailbox_bytes_max),
        ] {
            if value < u64::from(self.frame_bytes_max) {
                return Err((
                    key,
                    format!(
                        "{value} is below frame_bytes_max ({}): the largest frame would never fit",
                        self.frame_bytes_max
                    ),
                ));
            }
        }
        let store = self.store_config();
        store.validate().map_err(|e| {
            let msg = e.to_string();
            let key = if msg.contains("segment_size_bytes") {
                "segment_size_bytes"
            } else {
                "write_buffer_bytes"
            };
            (key, msg)
        })?;
        Ok(())
    }

    /// The shard count to run: `shards`, or one per available core.
    pub fn shard_count(&self) -> usize {
        if self.shards > 0 {
            return self.shards;
        }
        std::thread::available_parallelism().map_or(1, |n| n.get())
    }

    pub fn control_socket_path(&self) -> PathBuf {
        if self.control_socket.as_os_str().is_empty() {
            self.data_dir.join("control.sock")
        } else {
            self.control_socket.clone()
        }
    }

    /// Settings of each partition store.
    pub fn store_config(&self) -> StoreConfig {
        StoreConfig {
            segment_size_bytes: self.segment_size_bytes,
            write_buffer_bytes: self.write_buffer_bytes,
            retention_bytes: (self.retention_bytes > 0).then_some(self.retention_bytes),
            retention_ms: (self.retention_ms > 0).then_some(self.retention_ms),
            ..StoreConfig::default()
        }
    }
}

fn known_keys() -> Vec<String> {
    match toml::Value::try_from(ServerConfig::default()) {
        Ok(toml::Value::Table(t)) => t.keys().cloned().collect(),
        _ => Vec::new(),
    }
}

/// A value given as text: TOML if it parses as a TOML value, else a string.
fn scalar(text: &str) -> toml::Value {
    let doc = format!("v = {text}");
    match doc.parse::<toml::Table>() {
        Ok(mut t) => t
            .remove("v")
            .unwrap_or_else(|| toml::Value::String(text.into())),
        Err(_) => toml::Value::String(text.into()),
    }
}

/// Finds which key makes deserialization fail (serde's message alone does
/// not name it for values that came from a table).
fn blame(layered: &Layered, err: toml::de::Error) -> ConfigError {
    for (key, value) in &layered.table {
        let mut single = toml::Table::new();
        single.insert(key.clone(), value.clone());
        if let Err(e) = toml::Value::Table(single).try_into::<ServerConfig>() {
            return ConfigError::Key {
                key: key.clone(),
                origin: layered.origin(key),
                message: e.message().to_string(),
            };
        }
    }
    ConfigError::Key {
        key: "?".into(),
        origin: "combined".into(),
        message: err.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn defaults_are_valid() {
        let c = ServerConfig::load(None, Vec::new(), &[]).unwrap();
        assert_eq!(c, ServerConfig::default());
        assert_eq!(
            c.control_socket_path(),
            PathBuf::from("./data/control.sock")
        );
    }

    #[test]
    fn file_env_and_flags_layer_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(
            &path,
            "shards = 3\nlisten = \"127.0.0.1:1\"\nretention_ms = 5\n",
        )
        .unwrap();
        let c = ServerConfig::load(
            Some(&path),
            env(&[
                ("RINGLOG_SHARDS", "4"),
                ("RINGLOG_DATA_DIR", "/tmp/x"),
                ("OTHER", "1"),
            ]),
            &[("shards".into(), "2".into())],
        )
        .unwrap();
        assert_eq!(c.shards, 2);
        assert_eq!(c.listen, "127.0.0.1:1");
        assert_eq!(c.data_dir, PathBuf::from("/tmp/x"));
        assert_eq!(c.store_config().retention_ms, Some(5));
    }

    #[test]
    fn errors_name_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        for (text, key) in [
            ("shards = \"many\"\n", "shards"),
            ("bogus_key = 1\n", "bogus_key"),
            ("segment_size_bytes = 1000\n", "segment_size_bytes"),
            ("mailbox_capacity = 0\n", "mailbox_capacity"),
            ("listen = \"nope\"\n", "listen"),
            ("metrics_addr = \"localhost\"\n", "metrics_addr"),
            (
                "shard_request_bytes_max = 4096\n",
                "shard_request_bytes_max",
            ),
            ("mailbox_bytes_max = 100\n", "mailbox_bytes_max"),
            ("idle_timeout_ms = 0\n", "idle_timeout_ms"),
            ("log_format = \"xml\"\n", "log_format"),
        ] {
            std::fs::write(&path, text).unwrap();
            let err = ServerConfig::load(Some(&path), Vec::new(), &[]).unwrap_err();
            let msg = err.to_string();
            assert!(msg.contains(&format!("`{key}`")), "{text:?}: {msg}");
        }
        std::fs::write(&path, "shards = = 1").unwrap();
        let err = ServerConfig::load(Some(&path), Vec::new(), &[]).unwrap_err();
        assert!(matches!(err, ConfigError::Syntax { .. }), "{err}");
        let err = ServerConfig::load(None, env(&[("RINGLOG_SHARDS", "x")]), &[]).unwrap_err();
        assert!(err.to_string().contains("RINGLOG_SHARDS"), "{err}");
    }
}
