//! Booting and stopping a node.
//!
//! Start: lock the data directory, check its filesystem (O_DIRECT, and a
//! warning on tmpfs/ramfs), load topics.json (a missing or corrupt one
//! refuses to start unless `--rebuild-catalog`), remove partition
//! directories it does not reference (garbage from deleted topics), start
//! the trash sweeper (see `trash`), bind
//! the client port once (shared by the shards, exclusive to this process),
//! and in a cluster the peer port (the replication transport runs on shard
//! 0 and stops with it; what it receives goes to the owning shards through
//! `peer_route`), start the pinned shard threads (each opens its partitions), finish
//! topics a crash left half-created, open the control socket (0600 from the
//! start), then print one `ready` line on stdout.
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
use crate::control::{ControlContext, ControlServer, LogLevelHook, MetricsHttp};
use crate::mailbox::mailbox;
use crate::meta_io::MetaIo;
use crate::metrics::ShardMetrics;
use crate::net::peer::{PeerLimits, PeerSetup, PeerStats};
use crate::peer_route::PeerRouter;
use crate::reply_pool::ReplyPool;
use crate::shard::{self, ShardSetup, Shutdown, RECYCLE_DIR};
use crate::trash::{Sweeper, TRASH_DIR};

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
    #[error("metrics address {addr}: {source}")]
    Metrics {
        addr: String,
        source: std::io::Error,
    },
    #[error(
        "data directory {path} is on a {fs} filesystem, which does not support O_DIRECT \
         (direct I/O); ringlog needs it: put data_dir on ext4 or xfs"
    )]
    NoDirectIo { path: PathBuf, fs: String },
    #[error("shard startup failed: {0}")]
    Shard(String),
    #[error("config key `{key}`: {message}")]
    Cluster { key: &'static str, message: String },
    #[error("peer listen address {addr}: {source}")]
    PeerListen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    /// A journal of a run with another shard count holds records of
    /// partitions this run would place on other shards.
    #[error(
        "journal {path} is from a run with {shards} shards (this one has {ours}): it may hold \
         acknowledged appends only its shard replays; start once with shards = {shards} and stop \
         cleanly (which removes it), then change the shard count"
    )]
    ForeignJournal {
        path: PathBuf,
        shards: usize,
        ours: usize,
    },
}

/// What the binary passes besides the config.
#[derive(Default)]
pub struct Hooks {
    /// Changes the log filter (the binary owns the tracing subscriber).
    pub set_log_level: Option<LogLevelHook>,
    /// Rebuild topics.json from the partitions on disk (`--rebuild-catalog`)
    /// instead of loading it; a present file is kept as `topics.json.replaced`.
    pub rebuild_catalog: bool,
    /// Where each config key came from, for `ctl config` (empty: defaults).
    pub config_origins: crate::config::ConfigOrigins,
}

/// A started node.
pub struct Running {
    pub client_addr: SocketAddr,
    pub control_socket: PathBuf,
    /// Where `GET /metrics` is served (`metrics_addr`; None: off).
    pub metrics_addr: Option<SocketAddr>,
    shutdown: Arc<Shutdown>,
    threads: Vec<JoinHandle<()>>,
    sweeper: Sweeper,
    meta_io: MetaIo,
    control: ControlServer,
    metrics_http: Option<MetricsHttp>,
    _lock: std::fs::File,
}

pub fn start(mut config: ServerConfig, hooks: Hooks) -> Result<Running, ServerError> {
    let started = Instant::now();
    let data_dir = config.data_dir.clone();
    let dir_err = |source| ServerError::DataDir {
        path: data_dir.clone(),
        source,
    };
    std::fs::create_dir_all(data_dir.join(TOPICS_DIR)).map_err(dir_err)?;
    let lock = lock_data_dir(&data_dir)?;
    check_filesystem(&data_dir, open_direct)?;
    config.recover = recover_marker(&data_dir, &config)?;
    let files_max = raise_files_limit();
    tracing::info!(files_max, "file descriptor limit");
    let mut table = if hooks.rebuild_catalog {
        rebuild_catalog(&data_dir)?
    } else {
        TopicTable::load(&data_dir)?
    };
    collect_garbage(&data_dir, &table);
    // Started before the shards so that what a crash left in the trash goes
    // first; it works beside the boot, not before it.
    let trash_dir = data_dir.join(TRASH_DIR);
    prepare_recycle_dirs(&data_dir, &trash_dir, config.shard_count())?;
    check_journals(&data_dir, config.shard_count())?;
    let sweeper = Sweeper::start(trash_dir.clone()).map_err(|source| ServerError::DataDir {
        path: trash_dir,
        source,
    })?;
    // The controller's topics.json writes run there, off shard 0's thread.
    let meta_io =
        MetaIo::start().map_err(|e| ServerError::Shard(format!("meta I/O thread: {e}")))?;

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
    let router = PeerRouter::new(catalog.clone(), peers.clone(), metrics[0].clone());
    let mut peer = peer_setup(&config, shards, router, client_addr)?;
    let peer_stats = peer.as_ref().map(|p| p.stats.clone());
    let cores = if config.pin_cores {
        core_affinity::get_core_ids().unwrap_or_default()
    } else {
        Vec::new()
    };
    let reply_pool = Arc::new(ReplyPool::for_shards(shards));
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
            trash: sweeper.poker(),
            meta_io: meta_io.client(),
            peer: if id == 0 { peer.take() } else { None },
            peer_stats: peer_stats.clone(),
            reply_pool: reply_pool.clone(),
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
    let ctx = Arc::new(ControlContext {
        config: config.clone(),
        peers: peers.clone(),
        metrics,
        catalog,
        started,
        shutdown: shutdown.clone(),
        set_log_level: hooks.set_log_level,
        client_addr,
        config_origins: hooks.config_origins,
        consumers: Default::default(),
        peer_stats,
    });
    let metrics_http = match start_metrics_http(&config.metrics_addr, &ctx) {
        Ok(m) => m,
        Err(e) => {
            stop_threads(&shutdown, threads);
            return Err(e);
        }
    };
    let control = match ControlServer::start(&control_socket, ctx) {
        Ok(c) => c,
        Err(source) => {
            if let Some(m) = metrics_http {
                m.stop();
            }
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
        metrics_addr: metrics_http.as_ref().map(MetricsHttp::local_addr),
        shutdown,
        threads,
        sweeper,
        meta_io,
        control,
        metrics_http,
        _lock: lock,
    })
}

/// The replication transport's setup for a cluster node (None alone): the
/// peer address bound here, once and exclusively, so a bad or taken address
/// stops the boot. It runs on shard 0 (see `net::peer`); `router` takes
/// what it receives to the partitions' shards (see `peer_route`).
fn peer_setup(
    config: &ServerConfig,
    shards: usize,
    router: PeerRouter,
    client_addr: SocketAddr,
) -> Result<Option<PeerSetup>, ServerError> {
    let cluster = match config.cluster() {
        Ok(Some(c)) => c,
        Ok(None) => return Ok(None),
        Err((key, message)) => return Err(ServerError::Cluster { key, message }),
    };
    let addr = cluster.listen;
    let err = |source| ServerError::PeerListen { addr, source };
    let listener = crate::net::bind_shared(addr, 1).map_err(err)?.remove(0);
    let incarnation = crate::net::peer::new_incarnation().map_err(err)?;
    tracing::info!(node = cluster.node_id, cluster = %cluster.cluster_id, peer_addr = %addr,
        incarnation, "cluster node");
    let others = cluster
        .peers
        .keys()
        .copied()
        .filter(|&n| n != cluster.node_id);
    let stats = Arc::new(PeerStats::for_nodes(others));
    // Announced to peers: what a backup names as the primary's address.
    let announced = cluster.advertise.unwrap_or(client_addr);
    Ok(Some(PeerSetup {
        cluster,
        listener,
        limits: PeerLimits::new(config.frame_bytes_max),
        shard_count: u16::try_from(shards).unwrap_or(u16::MAX),
        incarnation,
        client_addr: Some(announced),
        sink: Box::new(router),
        stats,
    }))
}

/// Starts `GET /metrics` on `addr` (validated by the config); none if empty.
fn start_metrics_http(
    addr: &str,
    ctx: &Arc<ControlContext>,
) -> Result<Option<MetricsHttp>, ServerError> {
    if addr.is_empty() {
        return Ok(None);
    }
    let err = |source| ServerError::Metrics {
        addr: addr.to_string(),
        source,
    };
    let parsed: SocketAddr = addr.parse().map_err(|_| {
        err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "bad address",
        ))
    })?;
    let http = MetricsHttp::start(parsed, ctx.clone()).map_err(err)?;
    tracing::info!(addr = %http.local_addr(), "serving GET /metrics");
    Ok(Some(http))
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
        if let Some(m) = self.metrics_http {
            m.stop();
        }
        // The shards (holding the other pokers) are gone: the sweeper ends
        // after the sweep queued last, so a deleted topic is off the disk.
        self.sweeper.stop();
        self.meta_io.stop();
        if !failed.is_empty() {
            return Err(ServerError::Shard(format!("shards {failed:?} panicked")));
        }
        tracing::info!("stopped");
        Ok(())
    }
}

/// Name of the file that probes O_DIRECT support at boot.
const DIRECT_PROBE_FILE: &str = ".direct-io-probe";

fn open_direct(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
}

/// The filesystem type of `dir` (statfs f_type), e.g. 0xEF53 for ext4.
fn filesystem_type(dir: &Path) -> std::io::Result<i64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    // SAFETY: all-zero is a valid statfs to be filled in.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: c is a NUL-terminated path; st is a valid out pointer.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(st.f_type as i64)
}

const TMPFS_MAGIC: i64 = 0x0102_1994;
const RAMFS_MAGIC: i64 = 0x8584_58f6;

fn filesystem_name(f_type: i64) -> String {
    match f_type {
        0xEF53 => "ext4".into(),
        0x5846_5342 => "xfs".into(),
        0x9123_683E => "btrfs".into(),
        TMPFS_MAGIC => "tmpfs".into(),
        RAMFS_MAGIC => "ramfs".into(),
        0x794C_7630 => "overlayfs".into(),
        0x6969 => "nfs".into(),
        0x6573_5546 => "fuse".into(),
        0x2FC1_2FC1 => "zfs".into(),
        other => format!("type {other:#x}"),
    }
}

/// Refuses a data dir whose filesystem lacks O_DIRECT (the partitions'
/// files need it) with an error naming the dir and the filesystem, and
/// warns loudly when it is memory-backed (tmpfs, ramfs): fdatasync there
/// makes nothing durable. `open` is the O_DIRECT open (a parameter so a
/// test can inject EINVAL).
fn check_filesystem(
    data_dir: &Path,
    open: impl Fn(&Path) -> std::io::Result<std::fs::File>,
) -> Result<(), ServerError> {
    let dir_err = |source| ServerError::DataDir {
        path: data_dir.into(),
        source,
    };
    let f_type = filesystem_type(data_dir).map_err(dir_err)?;
    let fs = filesystem_name(f_type);
    if matches!(f_type, TMPFS_MAGIC | RAMFS_MAGIC) {
        tracing::warn!(
            data_dir = %data_dir.display(),
            filesystem = %fs,
            "DATA IS NOT DURABLE: the data directory is on {fs}, a memory-backed \
             filesystem; every acknowledged record is lost at reboot or power loss"
        );
    }
    let probe = data_dir.join(DIRECT_PROBE_FILE);
    let opened = open(&probe);
    let _ = std::fs::remove_file(&probe);
    match opened {
        Ok(_) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Err(ServerError::NoDirectIo {
            path: data_dir.into(),
            fs,
        }),
        Err(e) => Err(dir_err(e)),
    }
}

/// Whether this node boots recovering a lost disk: writes the marker
/// durably (file and directory fsynced, here on the boot thread before any
/// shard starts) for `recover`, and finds one an earlier `--recover` left.
/// The marker is never removed here: the node cannot tell which topics the
/// cluster still has it hold, so any replicated partition it creates from
/// now on boots wiped, which only delays a new topic's replica until it
/// heard the view from a quorum. An operator removes it once `ctl
/// partitions` shows no wiped replica and every topic was re-created (see
/// README "Cluster notes"). Ignored by a single node (config refuses
/// `recover` there).
fn recover_marker(data_dir: &Path, config: &ServerConfig) -> Result<bool, ServerError> {
    if config.cluster_id.is_empty() {
        return Ok(false);
    }
    let path = data_dir.join(crate::config::RECOVER_MARKER);
    let err = |source| ServerError::DataDir {
        path: path.clone(),
        source,
    };
    if config.recover {
        let text = format!("node {} recovering a lost disk\n", config.node_id);
        let file = std::fs::File::create(&path).map_err(err)?;
        std::io::Write::write_all(&mut &file, text.as_bytes()).map_err(err)?;
        file.sync_all().map_err(err)?;
        std::fs::File::open(data_dir)
            .and_then(|d| d.sync_all())
            .map_err(err)?;
        tracing::warn!(marker = %path.display(), "recovering: replicated partitions created here boot wiped");
        return Ok(true);
    }
    let found = path.try_exists().map_err(err)?;
    if found {
        tracing::warn!(marker = %path.display(), "recover marker present: replicated partitions created here boot wiped");
    }
    Ok(found)
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

/// Makes `<data_dir>/recycle` (each shard makes its own dir in it) and moves
/// the recycle dirs of shards this process does not run (the shard count
/// went down; their files are garbage) into the trash, whose sweeper removes
/// them beside the boot. A dir that cannot be moved is logged and left for
/// the next boot.
fn prepare_recycle_dirs(data_dir: &Path, trash: &Path, shards: usize) -> Result<(), ServerError> {
    let root = data_dir.join(RECYCLE_DIR);
    for dir in [&root, trash] {
        std::fs::create_dir_all(dir).map_err(|source| ServerError::DataDir {
            path: dir.to_path_buf(),
            source,
        })?;
    }
    let Ok(entries) = std::fs::read_dir(&root) else {
        return Ok(());
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let ours = name.parse::<usize>().is_ok_and(|n| n < shards);
        if ours {
            continue;
        }
        let to = trash.join(format!("{RECYCLE_DIR}-{name}"));
        if let Err(e) = std::fs::rename(entry.path(), &to) {
            tracing::warn!(dir = %entry.path().display(), error = %e, "moving a stale recycle directory into the trash");
        }
    }
    Ok(())
}

/// Makes `<data_dir>/journal/` and refuses to start over a journal left by
/// a run with another shard count (see [`ServerError::ForeignJournal`]);
/// a clean stop removes the journals, so only a crash leaves one.
fn check_journals(data_dir: &Path, shards: usize) -> Result<(), ServerError> {
    let dir = data_dir.join(crate::shard::JOURNAL_DIR);
    let dir_err = |source| ServerError::DataDir {
        path: dir.clone(),
        source,
    };
    std::fs::create_dir_all(&dir).map_err(dir_err)?;
    // Its name is durable before a shard puts a journal in it.
    std::fs::File::open(data_dir)
        .and_then(|d| d.sync_all())
        .map_err(|source| ServerError::DataDir {
            path: data_dir.into(),
            source,
        })?;
    for entry in std::fs::read_dir(&dir).map_err(dir_err)?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let count = name
            .strip_prefix("shard-")
            .and_then(|rest| rest.split_once("-of-"))
            .and_then(|(_, n)| n.parse::<usize>().ok());
        match count {
            Some(n) if n == shards => {}
            Some(n) => {
                return Err(ServerError::ForeignJournal {
                    path: entry.path(),
                    shards: n,
                    ours: shards,
                })
            }
            None => tracing::warn!(path = %entry.path().display(), "not a journal; ignored"),
        }
    }
    Ok(())
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

/// Raises this process's soft RLIMIT_NOFILE to its hard limit and returns
/// the soft limit in force: each partition holds one descriptor while idle
/// (its active segment, plus one per sealed segment), so thousands of
/// partitions need more than the usual default of 1,024.
fn raise_files_limit() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct passed.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return 0;
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: limit.rlim_max,
                ..limit
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                limit = raised;
            } else {
                tracing::warn!(
                    soft = limit.rlim_cur,
                    hard = limit.rlim_max,
                    "could not raise the file descriptor limit"
                );
            }
        }
    }
    limit.rlim_cur
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A soft limit below the hard one (the usual default is 1,024) is
    /// raised to the hard limit: 10,000 idle partitions need 10,000
    /// descriptors. Lowers this test process's soft limit by one only, so
    /// tests running beside it keep their descriptors.
    #[test]
    fn the_soft_file_limit_is_raised_to_the_hard_one() {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit/setrlimit only read and write the struct passed.
        unsafe {
            assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit), 0);
            if limit.rlim_max == libc::RLIM_INFINITY {
                eprintln!("skipped: no finite hard limit to raise to");
                return;
            }
            let lowered = libc::rlimit {
                rlim_cur: limit.rlim_max - 1,
                ..limit
            };
            assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lowered), 0);
        }
        assert_eq!(raise_files_limit(), limit.rlim_max);
        let mut now = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: as above.
        unsafe {
            assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut now), 0);
        }
        assert_eq!(now.rlim_cur, limit.rlim_max);
    }

    #[test]
    fn a_filesystem_without_direct_io_is_named_in_the_error() {
        let dir = tempfile::tempdir().unwrap();
        let einval = |_: &Path| -> std::io::Result<std::fs::File> {
            Err(std::io::Error::from_raw_os_error(libc::EINVAL))
        };
        let err = check_filesystem(dir.path(), einval).unwrap_err();
        let msg = err.to_string();
        let fs = filesystem_name(filesystem_type(dir.path()).unwrap());
        assert!(matches!(err, ServerError::NoDirectIo { .. }), "{msg}");
        assert!(msg.contains(&dir.path().display().to_string()), "{msg}");
        assert!(msg.contains(&fs) && msg.contains("O_DIRECT"), "{msg}");
        // Other failures stay I/O errors on the data dir; no probe is left.
        let eacces = |_: &Path| -> std::io::Result<std::fs::File> {
            Err(std::io::Error::from_raw_os_error(libc::EACCES))
        };
        let err = check_filesystem(dir.path(), eacces).unwrap_err();
        assert!(matches!(err, ServerError::DataDir { .. }), "{err}");
        check_filesystem(dir.path(), open_direct).unwrap();
        assert!(!dir.path().join(DIRECT_PROBE_FILE).exists());
    }
}
