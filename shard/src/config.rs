//! Server settings: defaults, a TOML file, `RINGLOG_*` environment overrides
//! and command-line overrides, applied in that order. Every key is checked;
//! a bad one is reported by name.

use std::path::{Path, PathBuf};

use ringlog_storage::journal::JournalConfig;
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
    /// State transfer's chunk: a multiple of 4096, at most 16 MiB. Every
    /// node of a cluster must use the same (an offer of another size is
    /// refused).
    pub transfer_chunk_bytes: u32,
    /// State transfer's receive window, 2..=256 chunks in flight; the
    /// receiver holds at most this many chunks in memory.
    pub transfer_window_chunks: usize,
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
    /// Requests one connection may have read and not yet answered
    /// (pipelining); at the bound the connection reads nothing more until
    /// a reply is written. Replies go out in request order.
    pub requests_in_flight_max: usize,
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
    /// Per shard: write buffers lent at once to connections reading produce
    /// batches of 256 KiB or more straight into them (each
    /// `write_buffer_bytes` plus a block; the store writes the batch from
    /// it without a copy); past it, batches go in heap buffers. 0: never.
    pub produce_buffers_lent_max: usize,
    /// Memory each shard's sequential read-ahead may hold, reads in flight
    /// included: after a fetch read the device, the next sequential fetch's
    /// read is queued while the reply is sent (one per partition, of one
    /// fetch). 0 = off.
    pub read_ahead_bytes: u64,
    /// How a shard's turn makes small appends durable: `journal` = one
    /// write and one fdatasync of the shard's journal for every partition
    /// touched (segments written behind, checkpointed); `partition` = one
    /// write and one fdatasync per touched partition.
    pub group_commit: GroupCommit,
    /// Size of each shard's journal file (`<data_dir>/journal/`), 256 KiB
    /// to 1 GiB; checkpointed when half full.
    pub journal_bytes: u64,
    /// A partition's bytes of one turn above this skip the journal and go
    /// to its segment with its own fdatasync.
    pub journal_append_bytes_max: usize,
    /// tracing filter (e.g. "info", "ringlog_shard=debug").
    pub log_level: String,
    /// Log line format on stderr.
    pub log_format: LogFormat,
    /// Name of the cluster this node belongs to; empty = a single node (the
    /// cluster keys below must then be left unset).
    pub cluster_id: String,
    /// This node's id among `peers`.
    pub node_id: u32,
    /// Every node of the cluster, this one included, as `ID=IP:PORT` (the
    /// address other nodes dial for replication).
    pub peers: Vec<String>,
    /// File holding the cluster secret (at least 32 bytes, mode 0600 or
    /// stricter): peers prove they hold it before any frame is accepted.
    pub cluster_secret_file: PathBuf,
    /// Where this node accepts peer connections; empty = its own `peers`
    /// address.
    pub peer_listen_addr: String,
    /// The client address this node announces to its peers (the Hello),
    /// which a backup names in a not-primary refusal (`primary_addr=`);
    /// empty = the bound `listen` address. Required when `listen` is an
    /// unspecified address (0.0.0.0 or ::): clients cannot dial that.
    pub advertise_client_address: String,
    /// Replicas each partition of a topic created from now on gets: odd,
    /// 1 up to the node count; 0 = the largest odd count not above the
    /// node count. The metadata table places them (`placement::replicas_of`).
    pub replication_factor: u8,
    /// This node lost its data dir and rejoins its cluster (`server
    /// --recover`): replicated partitions created here from now on boot
    /// wiped (they neither vote nor lead until they learned the view and
    /// repaired every committed op). Persisted as [`RECOVER_MARKER`] in the
    /// data dir at boot; a marker there sets this on later boots too.
    pub recover: bool,
}

/// The file in the data dir saying this node is recovering a lost disk
/// (see [`ServerConfig::recover`]); only an operator removes it.
pub const RECOVER_MARKER: &str = "RECOVER";

/// `group_commit`: see [`ServerConfig::group_commit`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GroupCommit {
    #[default]
    Journal,
    Partition,
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
            transfer_chunk_bytes: 1024 * 1024,
            transfer_window_chunks: 8,
            group_commit_appends_max: 1024,
            group_commit_delay_us: 0,
            mailbox_capacity: 1024,
            forward_inflight_max: 4096,
            mailbox_bytes_max: 256 * 1024 * 1024,
            connections_per_shard_max: 1024,
            shard_request_bytes_max: 256 * 1024 * 1024,
            header_timeout_ms: 10_000,
            idle_timeout_ms: 300_000,
            requests_in_flight_max: 16,
            frame_bytes_max: 16 * 1024 * 1024,
            fetch_waiters_max: 256,
            fetch_wait_ms_max: 60_000,
            read_cache_bytes: 128 * 1024 * 1024,
            produce_buffers_lent_max: 8,
            read_ahead_bytes: 32 * 1024 * 1024,
            group_commit: GroupCommit::default(),
            journal_bytes: ringlog_storage::journal::JOURNAL_BYTES_DEFAULT,
            journal_append_bytes_max: ringlog_storage::journal::JOURNAL_APPEND_BYTES_MAX_DEFAULT,
            log_level: "info".into(),
            log_format: LogFormat::Text,
            cluster_id: String::new(),
            node_id: 0,
            peers: Vec::new(),
            cluster_secret_file: PathBuf::new(),
            peer_listen_addr: String::new(),
            advertise_client_address: String::new(),
            replication_factor: 0,
            recover: false,
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
        peers_from_list(&mut layered.table);
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
        if let Some(j) = self.journal_config() {
            if let Err(e) = j.validate() {
                return Err(("journal_bytes", e.to_string()));
            }
        }
        positive("header_timeout_ms", self.header_timeout_ms)?;
        positive("idle_timeout_ms", self.idle_timeout_ms)?;
        positive("requests_in_flight_max", self.requests_in_flight_max as u64)?;
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
        self.validate_transfer()?;
        self.cluster()?;
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

    /// The transfer window is never lockstep and fits one RequestChunks;
    /// the chunk is whole blocks, within the store's bound.
    fn validate_transfer(&self) -> Result<(), (&'static str, String)> {
        let window = self.transfer_window_chunks;
        if !(TRANSFER_WINDOW_CHUNKS_MIN..=TRANSFER_WINDOW_CHUNKS_MAX).contains(&window) {
            return Err((
                "transfer_window_chunks",
                format!(
                    "{window} must be in {TRANSFER_WINDOW_CHUNKS_MIN}..={TRANSFER_WINDOW_CHUNKS_MAX}"
                ),
            ));
        }
        let chunk = self.transfer_chunk_bytes;
        if chunk == 0 || !chunk.is_multiple_of(4096) || chunk > TRANSFER_CHUNK_BYTES_MAX {
            return Err((
                "transfer_chunk_bytes",
                format!(
                    "{chunk} must be a positive multiple of 4096, at most \
                     {TRANSFER_CHUNK_BYTES_MAX}"
                ),
            ));
        }
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
    /// The shard journal's bounds, if `group_commit = "journal"`.
    pub fn journal_config(&self) -> Option<JournalConfig> {
        (self.group_commit == GroupCommit::Journal)
            .then(|| JournalConfig::sized(self.journal_bytes, self.journal_append_bytes_max))
    }

    pub fn store_config(&self) -> StoreConfig {
        StoreConfig {
            segment_size_bytes: self.segment_size_bytes,
            write_buffer_bytes: self.write_buffer_bytes,
            retention_bytes: (self.retention_bytes > 0).then_some(self.retention_bytes),
            retention_ms: (self.retention_ms > 0).then_some(self.retention_ms),
            transfer_chunk_bytes: self.transfer_chunk_bytes,
            transfer_window_chunks: self.transfer_window_chunks,
            ..StoreConfig::default()
        }
    }
}

/// Bounds of `transfer_window_chunks`: never lockstep; at most the keys
/// one RequestChunks carries.
pub const TRANSFER_WINDOW_CHUNKS_MIN: usize = 2;
pub const TRANSFER_WINDOW_CHUNKS_MAX: usize = 256;
/// Largest `transfer_chunk_bytes` (the store's bound; peer frames are
/// bounded by the replication limits, not the client's `frame_bytes_max`).
const TRANSFER_CHUNK_BYTES_MAX: u32 = 16 << 20;

/// Least bytes of a cluster secret (after trailing whitespace is cut).
pub const CLUSTER_SECRET_BYTES_MIN: usize = 32;
/// Longest `cluster_id`.
pub const CLUSTER_ID_BYTES_MAX: usize = 64;

/// The cluster keys, checked: present only when `cluster_id` is set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterConfig {
    pub cluster_id: String,
    pub node_id: u32,
    /// Every node, this one included.
    pub peers: std::collections::BTreeMap<u32, std::net::SocketAddr>,
    /// Where this node accepts peer connections.
    pub listen: std::net::SocketAddr,
    pub secret: ClusterSecret,
    /// The client address the Hello announces; None = the bound one.
    pub advertise: Option<std::net::SocketAddr>,
}

/// The key peers authenticate with, derived from the secret file's bytes
/// (so a file of any length past the minimum gives a full-strength key).
/// Debug never prints it.
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterSecret(pub [u8; 32]);

impl std::fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterSecret(..)")
    }
}

impl ClusterSecret {
    /// Derives the key from secret bytes (trailing whitespace ignored, so
    /// an editor's newline does not change the key).
    pub fn from_bytes(bytes: &[u8]) -> ClusterSecret {
        let end = bytes
            .iter()
            .rposition(|b| !b.is_ascii_whitespace())
            .map_or(0, |i| i + 1);
        ClusterSecret(blake3::derive_key(
            "ringlog 2026 peer authentication key v1",
            &bytes[..end],
        ))
    }

    /// Reads and checks a secret file: present, at least
    /// [`CLUSTER_SECRET_BYTES_MIN`] bytes, no permission for group or
    /// others (a secret others can read proves nothing).
    pub fn load(path: &Path) -> Result<ClusterSecret, String> {
        use std::os::unix::fs::PermissionsExt;
        let shown = path.display();
        let meta = std::fs::metadata(path).map_err(|e| format!("cannot read {shown}: {e}"))?;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(format!(
                "{shown} has mode {mode:04o}: group or others may access it; chmod 600 it"
            ));
        }
        let bytes = std::fs::read(path).map_err(|e| format!("cannot read {shown}: {e}"))?;
        let len = bytes
            .iter()
            .rposition(|b| !b.is_ascii_whitespace())
            .map_or(0, |i| i + 1);
        if len < CLUSTER_SECRET_BYTES_MIN {
            return Err(format!(
                "{shown} holds {len} bytes; a cluster secret needs at least \
                 {CLUSTER_SECRET_BYTES_MIN} (e.g. `head -c 32 /dev/urandom | base64 > FILE`)"
            ));
        }
        Ok(ClusterSecret::from_bytes(&bytes))
    }
}

impl ServerConfig {
    /// The cluster keys checked (peers parsed, the secret read); None for a
    /// single node. Errors name the key.
    pub fn cluster(&self) -> Result<Option<ClusterConfig>, (&'static str, String)> {
        if self.cluster_id.is_empty() {
            return self.no_cluster_keys().map(|()| None);
        }
        if self.cluster_id.len() > CLUSTER_ID_BYTES_MAX
            || !self
                .cluster_id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        {
            return Err((
                "cluster_id",
                format!(
                    "{:?}: at most {CLUSTER_ID_BYTES_MAX} bytes of [A-Za-z0-9._-]",
                    self.cluster_id
                ),
            ));
        }
        let peers = parse_peers(&self.peers)?;
        let Some(own) = peers.get(&self.node_id) else {
            return Err((
                "node_id",
                format!(
                    "{} is not among `peers` (ids {:?}); list every node, this one included",
                    self.node_id,
                    peers.keys().collect::<Vec<_>>()
                ),
            ));
        };
        let listen = if self.peer_listen_addr.is_empty() {
            *own
        } else {
            self.peer_listen_addr.parse().map_err(|_| {
                (
                    "peer_listen_addr",
                    format!(
                        "{:?} is not an address like 0.0.0.0:7421",
                        self.peer_listen_addr
                    ),
                )
            })?
        };
        if self.cluster_secret_file.as_os_str().is_empty() {
            return Err((
                "cluster_secret_file",
                "a cluster needs a secret file: peers prove they hold it".into(),
            ));
        }
        let rf = usize::from(self.replication_factor);
        if rf.is_multiple_of(2) && rf != 0 || rf > peers.len() {
            return Err((
                "replication_factor",
                format!(
                    "{rf} must be odd (a majority of an even group is no more fault-tolerant),                      1..={} (the node count); 0 = the largest odd count up to it",
                    peers.len()
                ),
            ));
        }
        let secret = ClusterSecret::load(&self.cluster_secret_file)
            .map_err(|m| ("cluster_secret_file", m))?;
        let advertise = self.advertise()?;
        Ok(Some(ClusterConfig {
            cluster_id: self.cluster_id.clone(),
            node_id: self.node_id,
            peers,
            listen,
            secret,
            advertise,
        }))
    }

    /// `advertise_client_address` checked: an address clients can dial
    /// (specified IP, nonzero port); None = announce the bound `listen`
    /// address, refused when that is unspecified (peers would pass
    /// 0.0.0.0 on to clients as the primary's address).
    fn advertise(&self) -> Result<Option<std::net::SocketAddr>, (&'static str, String)> {
        const KEY: &str = "advertise_client_address";
        if self.advertise_client_address.is_empty() {
            let listen: Option<std::net::SocketAddr> = self.listen.parse().ok();
            return match listen {
                Some(l) if l.ip().is_unspecified() => Err((
                    KEY,
                    format!(
                        "must be set on a cluster node listening on {l}: peers tell clients \
                         this node's client address, and {} is no address to dial \
                         (e.g. advertise_client_address = \"10.0.0.1:{}\")",
                        l.ip(),
                        l.port()
                    ),
                )),
                _ => Ok(None),
            };
        }
        let bad = |why: &str| (KEY, format!("{:?}: {why}", self.advertise_client_address));
        let addr: std::net::SocketAddr = self
            .advertise_client_address
            .parse()
            .map_err(|_| bad("not an address like 10.0.0.1:7420 (host names are not resolved)"))?;
        if addr.ip().is_unspecified() || addr.port() == 0 {
            return Err(bad("clients cannot dial an unspecified address or port 0"));
        }
        Ok(Some(addr))
    }

    /// The cluster's nodes (id -> peer address) when `cluster_id` is set;
    /// empty for a single node or unparsable peers (boot refuses those
    /// first, through [`ServerConfig::cluster`]).
    pub fn cluster_nodes(&self) -> std::collections::BTreeMap<u32, std::net::SocketAddr> {
        if self.cluster_id.is_empty() {
            return std::collections::BTreeMap::new();
        }
        parse_peers(&self.peers).unwrap_or_default()
    }

    /// Replicas each partition of a new topic gets: `replication_factor`,
    /// or the largest odd count up to the node count (1 on a single node).
    pub fn replication_factor(&self) -> u8 {
        if self.replication_factor != 0 {
            return self.replication_factor;
        }
        let nodes = self.cluster_nodes().len().max(1);
        let odd = if nodes.is_multiple_of(2) {
            nodes - 1
        } else {
            nodes
        };
        u8::try_from(odd).unwrap_or(u8::MAX)
    }

    /// a lone node: refuse it instead.
    fn no_cluster_keys(&self) -> Result<(), (&'static str, String)> {
        let set = [
            ("node_id", self.node_id != 0),
            ("peers", !self.peers.is_empty()),
            (
                "cluster_secret_file",
                !self.cluster_secret_file.as_os_str().is_empty(),
            ),
            ("peer_listen_addr", !self.peer_listen_addr.is_empty()),
            (
                "advertise_client_address",
                !self.advertise_client_address.is_empty(),
            ),
            ("recover", self.recover),
            ("replication_factor", self.replication_factor > 1),
        ];
        match set.iter().find(|(_, on)| *on) {
            Some((key, _)) => Err((
                key,
                "is set but `cluster_id` is not: set `cluster_id` to run in a cluster".into(),
            )),
            None => Ok(()),
        }
    }
}

/// Parses `peers` entries `ID=IP:PORT`; ids and addresses must be unique.
fn parse_peers(
    entries: &[String],
) -> Result<std::collections::BTreeMap<u32, std::net::SocketAddr>, (&'static str, String)> {
    let mut peers = std::collections::BTreeMap::new();
    if entries.is_empty() {
        return Err(("peers", "a cluster needs its nodes: ID=IP:PORT each".into()));
    }
    for entry in entries {
        let bad = |why: &str| ("peers", format!("{entry:?}: {why}"));
        let (id, addr) = entry
            .split_once('=')
            .ok_or_else(|| bad("expected ID=IP:PORT, e.g. 1=127.0.0.1:7421"))?;
        let id: u32 = id
            .trim()
            .parse()
            .map_err(|_| bad("the node id is not a number"))?;
        let addr: std::net::SocketAddr = addr
            .trim()
            .parse()
            .map_err(|_| bad("not an address like 127.0.0.1:7421 (host names are not resolved)"))?;
        if addr.port() == 0 {
            return Err(bad("port 0 cannot be dialled"));
        }
        if peers.values().any(|a| *a == addr) {
            return Err(bad("the address is listed twice"));
        }
        if peers.insert(id, addr).is_some() {
            return Err(bad(&format!("node id {id} is listed twice")));
        }
    }
    Ok(peers)
}

/// `peers` from the environment or a flag comes as one string of
/// comma-separated entries; the config wants a list.
fn peers_from_list(table: &mut toml::Table) {
    if let Some(toml::Value::String(list)) = table.get("peers") {
        let entries = list
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(|e| toml::Value::String(e.to_string()))
            .collect();
        table.insert("peers".into(), toml::Value::Array(entries));
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
            ("requests_in_flight_max = 0\n", "requests_in_flight_max"),
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

    /// The transfer settings reach the store at their bounds and are
    /// refused one past them, naming the key.
    #[test]
    fn transfer_window_and_chunk_are_bounded() {
        let set = |pairs: &[(&str, &str)]| {
            let o: Vec<_> = pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            ServerConfig::load(None, Vec::new(), &o)
        };
        let c = set(&[
            ("transfer_window_chunks", "256"),
            ("transfer_chunk_bytes", "2097152"),
        ])
        .unwrap();
        let store = c.store_config();
        assert_eq!(
            (store.transfer_window_chunks, store.transfer_chunk_bytes),
            (256, 2 << 20)
        );
        let c = set(&[("transfer_window_chunks", "2")]).unwrap();
        assert_eq!(c.store_config().transfer_window_chunks, 2);
        for (pairs, key) in [
            (
                &[("transfer_window_chunks", "1")][..],
                "transfer_window_chunks",
            ),
            (
                &[("transfer_window_chunks", "257")][..],
                "transfer_window_chunks",
            ),
            (&[("transfer_chunk_bytes", "0")][..], "transfer_chunk_bytes"),
            (
                &[("transfer_chunk_bytes", "4097")][..],
                "transfer_chunk_bytes",
            ),
            (
                &[("transfer_chunk_bytes", "33554432")][..],
                "transfer_chunk_bytes",
            ),
        ] {
            let err = set(pairs).unwrap_err().to_string();
            assert!(err.contains(&format!("`{key}`")), "{pairs:?}: {err}");
        }
    }

    fn secret_file(dir: &Path, text: &str, mode: u32) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join(format!("secret-{mode:o}-{}", text.len()));
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        path
    }

    const SECRET: &str = "0123456789abcdef0123456789abcdef\n";

    #[test]
    fn without_cluster_keys_the_node_runs_alone() {
        let c = ServerConfig::load(None, Vec::new(), &[]).unwrap();
        assert_eq!(c.cluster(), Ok(None));
        // A cluster key without cluster_id would silently run alone.
        for (key, value) in [
            ("node_id", "2"),
            ("peers", "1=127.0.0.1:7421"),
            ("cluster_secret_file", "/tmp/s"),
            ("peer_listen_addr", "127.0.0.1:7421"),
            ("advertise_client_address", "10.0.0.1:7420"),
            // `--recover` rejoins a cluster: alone it would mean nothing.
            ("recover", "true"),
        ] {
            let err =
                ServerConfig::load(None, Vec::new(), &[(key.into(), value.into())]).unwrap_err();
            let msg = err.to_string();
            assert!(
                msg.contains(&format!("`{key}`")) && msg.contains("cluster_id"),
                "{msg}"
            );
        }
    }

    #[test]
    fn cluster_keys_load_from_file_env_and_flags() {
        let dir = tempfile::tempdir().unwrap();
        let secret = secret_file(dir.path(), SECRET, 0o600);
        let path = dir.path().join("c.toml");
        std::fs::write(
            &path,
            format!(
                "cluster_id = \"blue\"\nnode_id = 2\npeers = [\"1=127.0.0.1:7421\", \"2=127.0.0.1:7422\"]\ncluster_secret_file = {:?}\n",
                secret.display().to_string()
            ),
        )
        .unwrap();
        let c = ServerConfig::load(Some(&path), Vec::new(), &[]).unwrap();
        let cluster = c.cluster().unwrap().unwrap();
        assert_eq!(cluster.node_id, 2);
        assert_eq!(cluster.listen, "127.0.0.1:7422".parse().unwrap());
        assert_eq!(cluster.peers.len(), 2);
        assert_eq!(cluster.secret, ClusterSecret::from_bytes(SECRET.as_bytes()));
        // Env and flags give the list as one comma-separated string.
        let c = ServerConfig::load(
            Some(&path),
            env(&[(
                "RINGLOG_PEERS",
                "1=127.0.0.1:1, 2=127.0.0.1:2,3=127.0.0.1:3",
            )]),
            &[("peer_listen_addr".into(), "\"0.0.0.0:9\"".into())],
        )
        .unwrap();
        let cluster = c.cluster().unwrap().unwrap();
        assert_eq!(cluster.peers.len(), 3);
        assert_eq!(cluster.listen, "0.0.0.0:9".parse().unwrap());
        assert_eq!(cluster.advertise, None, "the bound address is announced");
        // Bound to every interface with an address to announce: from the
        // environment, or a flag over it.
        let wild = [("listen".to_string(), "0.0.0.0:7420".to_string())];
        let c = ServerConfig::load(
            Some(&path),
            env(&[("RINGLOG_ADVERTISE_CLIENT_ADDRESS", "10.0.0.2:7420")]),
            &wild,
        )
        .unwrap();
        let cluster = c.cluster().unwrap().unwrap();
        assert_eq!(cluster.advertise, Some("10.0.0.2:7420".parse().unwrap()));
        let flag = [
            wild[0].clone(),
            ("advertise_client_address".into(), "[fd00::2]:7420".into()),
        ];
        let c = ServerConfig::load(Some(&path), Vec::new(), &flag).unwrap();
        let cluster = c.cluster().unwrap().unwrap();
        assert_eq!(cluster.advertise, Some("[fd00::2]:7420".parse().unwrap()));
    }

    #[test]
    fn the_default_replication_factor_is_the_largest_odd_count_up_to_the_nodes() {
        let of = |nodes: u32, set: u8| {
            let peers = (1..=nodes).map(|n| format!("{n}=127.0.0.1:{}", 7000 + n));
            ServerConfig {
                cluster_id: if nodes == 0 {
                    String::new()
                } else {
                    "c".into()
                },
                peers: peers.collect(),
                replication_factor: set,
                ..ServerConfig::default()
            }
            .replication_factor()
        };
        let defaults: Vec<u8> = (0..=6).map(|n| of(n, 0)).collect();
        assert_eq!(defaults, [1, 1, 1, 3, 3, 5, 5]);
        assert_eq!(of(5, 3), 3);
        assert_eq!(of(3, 1), 1);
    }

    #[test]
    fn cluster_errors_name_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let good = secret_file(dir.path(), SECRET, 0o600);
        let short = secret_file(dir.path(), "tooshort\n", 0o600);
        let readable = secret_file(dir.path(), SECRET, 0o644);
        let missing = dir.path().join("absent");
        let peers = "[\"1=127.0.0.1:7421\", \"2=127.0.0.1:7422\"]";
        let cases: Vec<(String, &str, &str)> = vec![
            (
                format!("node_id = 3\npeers = {peers}"),
                "node_id",
                "not among",
            ),
            (
                "peers = [\"1=127.0.0.1:1\", \"1=127.0.0.1:2\"]".into(),
                "peers",
                "listed twice",
            ),
            (
                "peers = [\"1=127.0.0.1:1\", \"2=127.0.0.1:1\"]".into(),
                "peers",
                "listed twice",
            ),
            (
                "peers = [\"1=localhost:1\"]".into(),
                "peers",
                "not an address",
            ),
            ("peers = [\"1:127.0.0.1:1\"]".into(), "peers", "ID=IP:PORT"),
            (
                "peers = [\"x=127.0.0.1:1\"]".into(),
                "peers",
                "not a number",
            ),
            ("peers = []".into(), "peers", "needs its nodes"),
            (
                format!("peers = {peers}\nreplication_factor = 2"),
                "replication_factor",
                "must be odd",
            ),
            (
                format!("peers = {peers}\nreplication_factor = 3"),
                "replication_factor",
                "1..=2 (the node count)",
            ),
            (
                format!("peers = {peers}\npeer_listen_addr = \"nope\""),
                "peer_listen_addr",
                "not an address",
            ),
            // Bound to every interface, the node has no address to announce.
            (
                format!("peers = {peers}\nlisten = \"0.0.0.0:7420\""),
                "advertise_client_address",
                "must be set on a cluster node listening on 0.0.0.0:7420",
            ),
            (
                format!("peers = {peers}\nlisten = \"[::]:7420\""),
                "advertise_client_address",
                "no address to dial",
            ),
            (
                format!("peers = {peers}\nadvertise_client_address = \"db1:7420\""),
                "advertise_client_address",
                "not an address",
            ),
            (
                format!("peers = {peers}\nadvertise_client_address = \"0.0.0.0:7420\""),
                "advertise_client_address",
                "cannot dial",
            ),
            (
                format!("peers = {peers}\nadvertise_client_address = \"10.0.0.1:0\""),
                "advertise_client_address",
                "cannot dial",
            ),
        ];
        let file = dir.path().join("c.toml");
        let secret_line =
            |p: &Path| format!("cluster_secret_file = {:?}\n", p.display().to_string());
        let mut all: Vec<(String, &str, &str)> = cases
            .into_iter()
            .map(|(t, k, m)| (format!("{t}\n{}", secret_line(&good)), k, m))
            .collect();
        for (path, what) in [
            (&missing, "cannot read"),
            (&short, "at least 32"),
            (&readable, "chmod 600"),
        ] {
            all.push((
                format!("node_id = 1\npeers = {peers}\n{}", secret_line(path)),
                "cluster_secret_file",
                what,
            ));
        }
        all.push((
            format!("node_id = 1\npeers = {peers}\n"),
            "cluster_secret_file",
            "needs a secret",
        ));
        all.push((
            format!("cluster_id = \"a b\"\nnode_id = 1\npeers = {peers}\n"),
            "cluster_id",
            "[A-Za-z0-9._-]",
        ));
        for (text, key, what) in all {
            let mut text = text;
            if !text.contains("node_id") {
                text = format!("node_id = 1\n{text}");
            }
            if !text.contains("cluster_id") {
                text = format!("cluster_id = \"blue\"\n{text}");
            }
            std::fs::write(&file, &text).unwrap();
            let err = ServerConfig::load(Some(&file), Vec::new(), &[]).unwrap_err();
            let msg = err.to_string();
            assert!(
                msg.contains(&format!("`{key}`")) && msg.contains(what),
                "{text}: {msg}"
            );
        }
    }
}
