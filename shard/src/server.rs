//! Booting and stopping a node.
//!
//! Start: lock the data directory, load topics.json, remove partition
//! directories it does not reference (garbage from deleted topics), bind the
//! client port once (shared by the shards, exclusive to this process), start the pinned shard threads (each
//! opens its partitions), finish topics a crash left half-created, open the
//! control socket, then print one `ready` line on stdout.
//!
//! Stop ([`Shutdown::trigger`]: SIGINT/SIGTERM via the binary, or the control
//! socket): every shard stops accepting, runs its queued work to completion
//! (group commit and acknowledgements), checkpoints and closes its
//! partitions (superblocks written); then the threads are joined.

use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use thiserror::Error;

use crate::catalog::{Catalog, CatalogError, TopicState, TopicTable, TOPICS_DIR, TOPICS_FILE};
use crate::config::ServerConfig;
use crate::control::{ControlContext, ControlServer, LogLevelHook};
use crate::mailbox::mailbox;
use crate::metrics::ShardMetrics;
use crate::shard::{self, ShardSetup, Shutdown};

/// How long shards may take to open their partitions at boot.
const BOOT_TIMEOUT: Duration = Duration::from_secs(600);

#[derive(Debug, Error)]
pub enum ServerError {
    #[error("data directory {path}: {source}")]
    DataDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("data directory {path} is in use by another ringlog process")]
    Locked { path: PathBuf },
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    #[error("listen address {addr}: address in use (another process listens on it; stop it or pick another `listen`)")]
    AddrInUse { addr: String },
    #[error("listen address {addr}: {source}")]
    Listen {
        addr: String,
        source: std::io::Error,
    },
    #[error("control socket {path}: {source}")]
    Control {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("shard startup failed: {0}")]
    Shard(String),
}

/// What the binary passes besides the config.
#[derive(Default)]
pub struct Hooks {
    /// Changes the log filter (the binary owns the tracing subscriber).
    pub set_log_level: Option<LogLevelHook>,
    /// Rebuild topics.json from the partitions on disk (`--rebuild-catalog`)
    /// instead of loading it; a present file is kept as `topics.json.replaced`.
    pub rebuild_catalog: bool,
}

/// A started node.
pub struct Running {
    pub client_addr: SocketAddr,
    pub control_socket: PathBuf,
    shutdown: Arc<Shutdown>,
    threads: Vec<JoinHandle<()>>,
    control: ControlServer,
    _lock: std::fs::File,
}

pub fn start(config: ServerConfig, hooks: Hooks) -> Result<Running, ServerError> {
    let started = Instant::now();
    let data_dir = config.data_dir.clone();
    let dir_err = |source| ServerError::DataDir {
        path: data_dir.clone(),
        source,
    };
    std::fs::create_dir_all(data_dir.join(TOPICS_DIR)).map_err(dir_err)?;
    let lock = lock_data_dir(&data_dir)?;
    let mut table = if hooks.rebuild_catalog {
        rebuild_catalog(&data_dir)?
    } else {
        TopicTable::load(&data_dir)?
    };
    collect_garbage(&data_dir, &table);

    let shards = config.shard_count();
    let addr: SocketAddr = config.listen.parse().map_err(|_| ServerError::Listen {
        addr: config.listen.clone(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "bad address"),
    })?;
    let listeners = crate::net::bind_shared(addr, shards).map_err(|source| {
        if source.kind() == std::io::ErrorKind::AddrInUse {
            ServerError::AddrInUse {
                addr: config.listen.clone(),
            }
        } else {
            ServerError::Listen {
                addr: config.listen.clone(),
                source,
            }
        }
    })?;
    let client_addr = listeners[0]
        .local_addr()
        .map_err(|source| ServerError::Listen {
            addr: config.listen.clone(),
            source,
        })?;

    let config = Arc::new(config);
    let catalog = Arc::new(Catalog::new(table.clone()));
    let mut txs = Vec::with_capacity(shards);
    let mut rxs = Vec::with_capacity(shards);
    for _ in 0..shards {
        let (tx, rx) = mailbox(
            config.mailbox_capacity,
            config.mailbox_bytes_max,
            config.forward_inflight_max,
        )
        .map_err(|e| ServerError::Shard(format!("mailbox: {e}")))?;
        txs.push(tx);
        rxs.push(rx);
    }
    let peers = Arc::new(txs);
    let shutdown = Arc::new(Shutdown::default());
    shutdown.set_peers(peers.to_vec());
    let metrics: Vec<Arc<ShardMetrics>> = (0..shards).map(|_| Arc::default()).collect();
    let cores = if config.pin_cores {
        core_affinity::get_core_ids().unwrap_or_default()
    } else {
        Vec::new()
    };
    let (ready_tx, ready_rx) = crossbeam_channel::bounded(shards);
    let mut threads = Vec::with_capacity(shards);
    for (id, (rx, listener)) in rxs.into_iter().zip(listeners).enumerate() {
        let setup = ShardSetup {
            id,
            config: config.clone(),
            catalog: catalog.clone(),
            peers: peers.clone(),
            rx,
            metrics: metrics[id].clone(),
            shutdown: shutdown.clone(),
            listener,
            core: (!cores.is_empty()).then(|| cores[id % cores.len()]),
            ready: ready_tx.clone(),
        };
        let handle = std::thread::Builder::new()
            .name(format!("ringlog-shard-{id}"))
            .spawn(move || shard::run(setup))
            .map_err(|e| ServerError::Shard(format!("spawn: {e}")))?;
        threads.push(handle);
    }
    let mut partitions = 0;
    for _ in 0..shards {
        match ready_rx.recv_timeout(BOOT_TIMEOUT) {
            Ok(Ok(n)) => partitions += n,
            Ok(Err(msg)) => {
                stop_threads(&shutdown, threads);
                return Err(ServerError::Shard(msg));
            }
            Err(_) => {
                stop_threads(&shutdown, threads);
                return Err(ServerError::Shard("shards did not start in time".into()));
            }
        }
    }
    // Topics a crash left half-created now have all their partitions.
    let creating: Vec<String> = table
        .topics
        .iter()
        .filter(|(_, m)| m.state == TopicState::Creating)
        .map(|(t, _)| t.clone())
        .collect();
    if !creating.is_empty() {
        for t in &creating {
            if let Some(m) = table.topics.get_mut(t) {
                m.state = TopicState::Ready;
            }
        }
        if let Err(e) = table.store(&data_dir) {
            stop_threads(&shutdown, threads);
            return Err(e.into());
        }
        catalog.publish(table);
        tracing::info!(topics = ?creating, "finished topics left half-created");
    }

    let control_socket = config.control_socket_path();
    let ctx = ControlContext {
        config: config.clone(),
        peers: peers.clone(),
        metrics,
        catalog,
        started,
        shutdown: shutdown.clone(),
        set_log_level: hooks.set_log_level,
        client_addr,
    };
    let control = match ControlServer::start(&control_socket, ctx) {
        Ok(c) => c,
        Err(source) => {
            stop_threads(&shutdown, threads);
            return Err(ServerError::Control {
                path: control_socket,
                source,
            });
        }
    };
    tracing::info!(
        %client_addr,
        control = %control_socket.display(),
        shards,
        partitions,
        data_dir = %data_dir.display(),
        "ringlog ready"
    );
    Ok(Running {
        client_addr,
        control_socket,
        shutdown,
        threads,
        control,
        _lock: lock,
    })
}

fn stop_threads(shutdown: &Shutdown, threads: Vec<JoinHandle<()>>) {
    shutdown.trigger();
    for t in threads {
        let _ = t.join();
    }
}

impl Running {
    pub fn shutdown_handle(&self) -> Arc<Shutdown> {
        self.shutdown.clone()
    }

    /// Blocks until shutdown was triggered and every shard stopped cleanly.
    pub fn wait(self) -> Result<(), ServerError> {
        self.shutdown.wait();
        tracing::info!("shutting down");
        let mut failed = Vec::new();
        for (i, t) in self.threads.into_iter().enumerate() {
            if t.join().is_err() {
                failed.push(i);
            }
        }
        self.control.stop();
        if !failed.is_empty() {
            return Err(ServerError::Shard(format!("shards {failed:?} panicked")));
        }
        tracing::info!("stopped");
        Ok(())
    }
}

/// An exclusive flock on `<data_dir>/LOCK`, held while the process runs.
fn lock_data_dir(data_dir: &Path) -> Result<std::fs::File, ServerError> {
    let path = data_dir.join("LOCK");
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|source| ServerError::DataDir {
            path: path.clone(),
            source,
        })?;
    // SAFETY: plain syscall on an open descriptor.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(ServerError::Locked {
            path: data_dir.into(),
        });
    }
    Ok(f)
}

/// Rebuilds topics.json from disk and stores it, keeping any previous file.
fn rebuild_catalog(data_dir: &Path) -> Result<TopicTable, ServerError> {
    let table = TopicTable::rebuild(data_dir)?;
    let path = data_dir.join(TOPICS_FILE);
    if path.exists() {
        let kept = data_dir.join(format!("{TOPICS_FILE}.replaced"));
        std::fs::rename(&path, &kept).map_err(|source| ServerError::DataDir {
            path: path.clone(),
            source,
        })?;
    }
    table.store(data_dir)?;
    let topics: Vec<_> = table
        .topics
        .iter()
        .map(|(t, m)| (t, m.partitions))
        .collect();
    tracing::warn!(?topics, "rebuilt topics.json from the partitions on disk");
    Ok(table)
}

/// Removes partition directories topics.json does not reference.
fn collect_garbage(data_dir: &Path, table: &TopicTable) {
    let root = data_dir.join(TOPICS_DIR);
    let Ok(entries) = std::fs::read_dir(&root) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        match table.topics.get(&name) {
            None => {
                tracing::warn!(dir = %path.display(), "removing directory of an unknown topic");
                if let Err(e) = std::fs::remove_dir_all(&path) {
                    tracing::error!(dir = %path.display(), error = %e, "remove failed");
                }
            }
            Some(meta) => {
                let Ok(parts) = std::fs::read_dir(&path) else {
                    continue;
                };
                for p in parts.flatten() {
                    let keep = p
                        .file_name()
                        .to_str()
                        .and_then(|s| s.parse::<u32>().ok())
                        .is_some_and(|i| i < meta.partitions);
                    if !keep {
                        let pp = p.path();
                        tracing::warn!(dir = %pp.display(), "removing unreferenced partition directory");
                        let _ = std::fs::remove_dir_all(&pp);
                    }
                }
            }
        }
    }
}
