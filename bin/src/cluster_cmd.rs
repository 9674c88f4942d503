//! `ringlog cluster up|down`: a local cluster on 127.0.0.1 for trying
//! replication. `up` writes one config and data dir per node under DIR, a
//! generated cluster secret (mode 0600), starts the servers detached (their
//! own process group, so the shell's Ctrl-C does not reach them), waits for
//! each one's ready line and records the pids in DIR/pids (on a DIR where
//! some nodes still run, it starts only the others); `down` stops
//! them (SIGTERM, then SIGKILL after [`STOP_TIMEOUT`]) and is idempotent.
//!
//! Ports derive from `--base-port` B: node i serves clients on B + i and
//! peers on B + 100 + i.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use thiserror::Error;

/// Most nodes `up` starts (replicas are every node; 7 is plenty to try).
const NODES_MAX: u32 = 7;
/// A node that has not printed its ready line by then failed to start.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// A node still running this long after SIGTERM gets SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// A node's ports still held this long (say by a killed predecessor whose
/// threads are still exiting) mean another process has them.
const PORTS_TIMEOUT: Duration = Duration::from_secs(10);
/// How often `up`/`down` look at a node's state while waiting.
const POLL: Duration = Duration::from_millis(50);
const PIDS_FILE: &str = "pids";
const SECRET_FILE: &str = "cluster.secret";
/// Secret bytes drawn from the OS (hex-encoded in the file).
const SECRET_BYTES: usize = 32;

#[derive(Subcommand)]
pub enum ClusterCmd {
    /// Start N local nodes of one cluster on 127.0.0.1 (or, on a DIR
    /// where some still run, the ones that do not).
    Up(UpArgs),
    /// Stop the nodes `up` started in DIR (a no-op if none run).
    Down(DirArg),
}

#[derive(Args)]
pub struct UpArgs {
    /// Nodes to start (odd, 1 to 7).
    #[arg(long, default_value_t = 3)]
    nodes: u32,
    #[command(flatten)]
    dir: DirArg,
    /// Node i listens for clients on BASE + i and for peers on BASE + 100 + i.
    #[arg(long, default_value_t = 7440)]
    base_port: u16,
    /// Shard threads per node (unpinned).
    #[arg(long, default_value_t = 1)]
    shards: u32,
}

#[derive(Args)]
pub struct DirArg {
    /// Where the nodes' configs, data dirs, logs and pids live.
    #[arg(long, default_value = "./cluster")]
    dir: PathBuf,
}

#[derive(Debug, Error)]
enum ClusterError {
    #[error(
        "--nodes {0}: must be odd, 1 to {NODES_MAX} (a replica group has an odd number of nodes)"
    )]
    Nodes(u32),
    #[error("--base-port {0}: node ports would pass 65535")]
    Ports(u16),
    #[error("every node already runs in {dir} (pids {pids:?}): run `ringlog cluster down --dir {dir}` first")]
    Running { dir: String, pids: Vec<i32> },
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("node {id}: {addr} stayed in use for {PORTS_TIMEOUT:?}; stop what listens there or pick another --base-port")]
    PortBusy { id: u32, addr: String },
    #[error("node {id} did not start: {why}; its log: {log}")]
    Start { id: u32, why: String, log: PathBuf },
    #[error("{path}: unreadable line {line:?}")]
    Pids { path: PathBuf, line: String },
}

fn io_err(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> ClusterError {
    let path = path.to_path_buf();
    move |source| ClusterError::Io { what, path, source }
}

pub fn run(cmd: ClusterCmd) -> i32 {
    let result = match cmd {
        ClusterCmd::Up(a) => up(&a),
        ClusterCmd::Down(d) => down(&d.dir),
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("ringlog cluster: {e}");
            1
        }
    }
}

/// One node's place: its ports and files.
struct Node {
    id: u32,
    client: String,
    peer: String,
    dir: PathBuf,
}

impl Node {
    fn config(&self) -> PathBuf {
        self.dir.join("node.toml")
    }
    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }
    fn control(&self) -> PathBuf {
        self.data().join("control.sock")
    }
    fn out(&self) -> PathBuf {
        self.dir.join("server.out")
    }
    fn log(&self) -> PathBuf {
        self.dir.join("server.log")
    }
}

fn up(a: &UpArgs) -> Result<(), ClusterError> {
    if a.nodes.is_multiple_of(2) || a.nodes > NODES_MAX {
        return Err(ClusterError::Nodes(a.nodes));
    }
    if u32::from(a.base_port) + 100 + a.nodes > u32::from(u16::MAX) {
        return Err(ClusterError::Ports(a.base_port));
    }
    let dir = &a.dir.dir;
    let live = live_pids(dir)?;
    if live.len() >= a.nodes as usize {
        return Err(ClusterError::Running {
            dir: dir.display().to_string(),
            pids: live.iter().map(|(_, p)| *p).collect(),
        });
    }
    std::fs::create_dir_all(dir).map_err(io_err("create", dir))?;
    // Absolute paths in the servers' command lines: `down` knows its own.
    let root = dir.canonicalize().map_err(io_err("resolve", dir))?;
    let secret = root.join(SECRET_FILE);
    write_secret(&secret)?;
    let nodes: Vec<Node> = (1..=a.nodes)
        .map(|id| Node {
            id,
            client: format!("127.0.0.1:{}", u32::from(a.base_port) + id),
            peer: format!("127.0.0.1:{}", u32::from(a.base_port) + 100 + id),
            dir: root.join(format!("n{id}")),
        })
        .collect();
    let peers: Vec<String> = nodes
        .iter()
        .map(|n| format!("{}={}", n.id, n.peer))
        .collect();
    // Nodes still running stay (so `up` restarts the ones that died).
    let mut pids = live.clone();
    let mut started = Vec::new();
    for n in nodes
        .iter()
        .filter(|n| !live.iter().any(|(id, _)| *id == n.id))
    {
        match wait_ports_free(n).and_then(|()| start_node(n, &peers, &secret, a.shards)) {
            Ok((pid, child)) => {
                started.push((n.id, child));
                pids.push((n.id, pid));
                pids.sort_unstable();
                record_pids(dir, &pids)?;
            }
            Err(e) => {
                if live.is_empty() {
                    // Leave nothing half up.
                    let _ = down(dir);
                }
                return Err(e);
            }
        }
    }
    for n in &nodes {
        let child = started.iter_mut().find(|(id, _)| *id == n.id);
        let ready = wait_ready(n, child.map(|(_, c)| c))?;
        println!(
            "node {} client={} control={} log={} ({ready})",
            n.id,
            n.client,
            n.control().display(),
            n.log().display()
        );
    }
    println!(
        "cluster up: {} nodes, pids in {}; try `ringlog ctl --socket {} status`; \
         create a topic once, through any node; stop with \
         `ringlog cluster down --dir {}`",
        nodes.len(),
        dir.join(PIDS_FILE).display(),
        nodes[0].control().display(),
        dir.display()
    );
    Ok(())
}

/// A fresh random secret, hex, created 0600 (an existing one is kept: the
/// nodes' data dirs were made with it).
fn write_secret(path: &Path) -> Result<(), ClusterError> {
    if path.exists() {
        return Ok(());
    }
    let mut raw = [0u8; SECRET_BYTES];
    let urandom = Path::new("/dev/urandom");
    File::open(urandom)
        .and_then(|mut f| f.read_exact(&mut raw))
        .map_err(io_err("read", urandom))?;
    let hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(io_err("create", path))?;
    writeln!(f, "{hex}").map_err(io_err("write", path))
}

/// Waits (bounded by [`PORTS_TIMEOUT`]) until `n`'s client and peer ports
/// can be bound: a node killed just before may hold them until its last
/// thread has exited, after its pid already shows as a zombie.
fn wait_ports_free(n: &Node) -> Result<(), ClusterError> {
    let deadline = Instant::now() + PORTS_TIMEOUT;
    for addr in [&n.client, &n.peer] {
        while let Err(e) = std::net::TcpListener::bind(addr.as_str()) {
            if e.kind() != std::io::ErrorKind::AddrInUse {
                return Err(io_err("bind", Path::new(addr))(e));
            }
            if Instant::now() > deadline {
                return Err(ClusterError::PortBusy {
                    id: n.id,
                    addr: addr.clone(),
                });
            }
            std::thread::sleep(POLL);
        }
    }
    Ok(())
}

/// Writes `n`'s config and starts its server detached; returns its pid
/// and handle.
fn start_node(
    n: &Node,
    peers: &[String],
    secret: &Path,
    shards: u32,
) -> Result<(i32, Child), ClusterError> {
    std::fs::create_dir_all(n.data()).map_err(io_err("create", &n.data()))?;
    let quoted: Vec<String> = peers.iter().map(|p| format!("{p:?}")).collect();
    let config = format!(
        "data_dir = {:?}\nlisten = {:?}\nshards = {shards}\npin_cores = false\n\
         cluster_id = \"local\"\nnode_id = {}\npeers = [{}]\ncluster_secret_file = {:?}\n",
        n.data().display().to_string(),
        n.client,
        n.id,
        quoted.join(", "),
        secret.display().to_string(),
    );
    std::fs::write(n.config(), config).map_err(io_err("write", &n.config()))?;
    let out = File::create(n.out()).map_err(io_err("create", &n.out()))?;
    let log = File::create(n.log()).map_err(io_err("create", &n.log()))?;
    let exe = std::env::current_exe().map_err(io_err("find", Path::new("ringlog")))?;
    let child = Command::new(exe)
        .arg("server")
        .arg("--config")
        .arg(n.config())
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(log)
        .process_group(0)
        .spawn()
        .map_err(io_err("start", &n.config()))?;
    let pid = i32::try_from(child.id()).map_err(|_| ClusterError::Start {
        id: n.id,
        why: format!("pid {} out of range", child.id()),
        log: n.log(),
    })?;
    Ok((pid, child))
}

/// Waits (bounded by [`READY_TIMEOUT`]) for `n`'s ready line; `child`, if
/// this `up` started it, is watched so that a server that exits says why at
/// once.
fn wait_ready(n: &Node, mut child: Option<&mut Child>) -> Result<String, ClusterError> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        let out = File::open(n.out()).map_err(io_err("read", &n.out()))?;
        let ready = BufReader::new(out)
            .lines()
            .map_while(Result::ok)
            .find(|l| l.starts_with("ringlog ready"));
        if let Some(line) = ready {
            return Ok(line);
        }
        if let Some(status) = child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
            let last = std::fs::read_to_string(n.log()).unwrap_or_default();
            return Err(ClusterError::Start {
                id: n.id,
                why: format!(
                    "it exited ({status}): {}",
                    last.lines().last().unwrap_or("no output")
                ),
                log: n.log(),
            });
        }
        if Instant::now() > deadline {
            return Err(ClusterError::Start {
                id: n.id,
                why: format!("no ready line within {READY_TIMEOUT:?}"),
                log: n.log(),
            });
        }
        std::thread::sleep(POLL);
    }
}

fn record_pids(dir: &Path, pids: &[(u32, i32)]) -> Result<(), ClusterError> {
    let path = dir.join(PIDS_FILE);
    let text: String = pids
        .iter()
        .map(|(id, pid)| format!("{id} {pid}\n"))
        .collect();
    std::fs::write(&path, text).map_err(io_err("write", &path))
}

/// The recorded nodes still running a ringlog server of DIR (a pid reused
/// by another process is not one).
fn live_pids(dir: &Path) -> Result<Vec<(u32, i32)>, ClusterError> {
    let path = dir.join(PIDS_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_err("read", &path)(e)),
    };
    let mut live = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let parsed = line
            .split_once(' ')
            .and_then(|(id, pid)| Some((id.parse().ok()?, pid.parse().ok()?)));
        let Some((id, pid)) = parsed else {
            return Err(ClusterError::Pids {
                path,
                line: line.into(),
            });
        };
        if is_our_server(pid, dir) {
            live.push((id, pid));
        }
    }
    Ok(live)
}

/// Whether `pid` runs (not a zombie) `ringlog server` with a config in DIR.
fn is_our_server(pid: i32, dir: &Path) -> bool {
    let proc_dir = PathBuf::from(format!("/proc/{pid}"));
    let Ok(stat) = std::fs::read_to_string(proc_dir.join("stat")) else {
        return false;
    };
    // The state follows the parenthesised command name.
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next());
    if state == Some("Z") {
        return false;
    }
    let Ok(cmdline) = std::fs::read(proc_dir.join("cmdline")) else {
        return false;
    };
    let Ok(root) = dir.canonicalize() else {
        return false;
    };
    let args: Vec<PathBuf> = cmdline
        .split(|&b| b == 0)
        .map(|a| PathBuf::from(String::from_utf8_lossy(a).into_owned()))
        .collect();
    args.iter().any(|a| a == Path::new("server"))
        && args
            .iter()
            .any(|a| a.starts_with(&root) && a.ends_with("node.toml"))
}

fn down(dir: &Path) -> Result<(), ClusterError> {
    let live = live_pids(dir)?;
    if live.is_empty() {
        println!("no cluster runs in {}: nothing to stop", dir.display());
        return remove_pids(dir);
    }
    for &(_, pid) in &live {
        // SAFETY: kill(2) on a pid just checked to be our server.
        unsafe { libc::kill(pid, libc::SIGTERM) };
    }
    let deadline = Instant::now() + STOP_TIMEOUT;
    for (id, pid) in live {
        while is_our_server(pid, dir) && Instant::now() < deadline {
            std::thread::sleep(POLL);
        }
        if is_our_server(pid, dir) {
            // SAFETY: as above; it ignored SIGTERM for STOP_TIMEOUT.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            println!("node {id} (pid {pid}) killed after {STOP_TIMEOUT:?}");
        } else {
            println!("node {id} (pid {pid}) stopped");
        }
    }
    remove_pids(dir)
}

fn remove_pids(dir: &Path) -> Result<(), ClusterError> {
    let path = dir.join(PIDS_FILE);
    match std::fs::remove_file(&path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io_err("remove", &path)(e)),
        _ => Ok(()),
    }
}
