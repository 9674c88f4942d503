//! A `ringlog server` process started for a benchmark: its own data
//! directory, a kernel-picked 127.0.0.1 port, a control socket next to the
//! data; stopped with SIGTERM and its exit status checked.

use std::fs;
use std::io::{self, BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use ringlog_shard::client::Client;

/// The server binary's file name.
pub const SERVER_BIN_NAME: &str = "ringlog";

/// How long the server may take to print its ready line and accept.
pub const START_TIMEOUT: Duration = Duration::from_secs(60);

/// How long the server may take to exit after SIGTERM.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(60);

/// Longest Unix socket path (sun_path is 108 bytes, NUL included).
const SOCKET_PATH_MAX: usize = 107;

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(
        "no `{SERVER_BIN_NAME}` binary next to {exe} (looked in {looked}); build it \
         (`cargo build --release -p ringlog`, same profile and target dir) or pass --server-bin PATH"
    )]
    BinaryNotFound { exe: String, looked: String },
    #[error("{what} {path}: {source}")]
    Fs {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("control socket path {0} is too long for a Unix socket; use a shorter --dir")]
    SocketPath(PathBuf),
    #[error("starting {bin}: {source}")]
    Spawn {
        bin: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("the server did not become ready within {timeout:?}: {why}; its stderr:\n{stderr}")]
    NotReady {
        timeout: Duration,
        why: String,
        stderr: String,
    },
    #[error("the server exited with {status} after SIGTERM; its stderr:\n{stderr}")]
    BadExit { status: ExitStatus, stderr: String },
    #[error("the server did not exit within {0:?} of SIGTERM (killed)")]
    StopTimeout(Duration),
}

/// The `ringlog` binary: `explicit` if given, else next to the running
/// executable (`target/<profile>/`), or one directory up when the running
/// executable is a test in `target/<profile>/deps/`.
pub fn locate_binary(explicit: Option<&Path>) -> Result<PathBuf, ServerError> {
    if let Some(p) = explicit {
        return Ok(p.to_owned());
    }
    let exe = std::env::current_exe().unwrap_or_default();
    let mut looked = Vec::new();
    let mut dir = exe.parent();
    for _ in 0..2 {
        let Some(d) = dir else { break };
        let candidate = d.join(SERVER_BIN_NAME);
        if candidate.is_file() {
            return Ok(candidate);
        }
        looked.push(d.display().to_string());
        dir = d.parent();
    }
    Err(ServerError::BinaryNotFound {
        exe: exe.display().to_string(),
        looked: looked.join(", "),
    })
}

/// A running server. Dropping it without [`ServerProcess::stop`] kills it
/// (SIGKILL); the directory is left for the caller to remove.
pub struct ServerProcess {
    child: Option<Child>,
    /// `host:port` the server listens on (from its ready line).
    pub addr: String,
    stderr_path: PathBuf,
    control: PathBuf,
}

impl ServerProcess {
    /// Starts `bin server` with its data, control socket and stderr in `dir`
    /// (created; must not exist), on 127.0.0.1 port 0 (the kernel picks a
    /// free port, the server prints it), with `shards` shards (0: one per
    /// core) and `extra` flags. Returns once it printed its ready line and
    /// accepted a client handshake.
    pub fn start(
        bin: &Path,
        dir: &Path,
        shards: u32,
        extra: &[String],
    ) -> Result<ServerProcess, ServerError> {
        fs::create_dir(dir).map_err(|source| ServerError::Fs {
            what: "create",
            path: dir.to_owned(),
            source,
        })?;
        Self::launch(bin, dir, shards, extra, None)
    }

    /// As [`ServerProcess::start`], in a `dir` that exists (a restart over
    /// the data a previous server left there). With `files_max`, the server
    /// runs with that RLIMIT_NOFILE (soft and hard; raising the hard limit
    /// needs privilege), as an operator's `ulimit -n` would set it.
    pub fn launch(
        bin: &Path,
        dir: &Path,
        shards: u32,
        extra: &[String],
        files_max: Option<u64>,
    ) -> Result<ServerProcess, ServerError> {
        let fs_err = |what, path: &Path| {
            let path = path.to_owned();
            move |source| ServerError::Fs { what, path, source }
        };
        let control = dir.join("ctl.sock");
        if control.as_os_str().len() > SOCKET_PATH_MAX {
            return Err(ServerError::SocketPath(control));
        }
        let stderr_path = dir.join("server.stderr");
        let stderr = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&stderr_path)
            .map_err(fs_err("create", &stderr_path))?;
        let mut command = Command::new(bin);
        if let Some(n) = files_max {
            set_files_max(&mut command, n);
        }
        let mut child = command
            .arg("server")
            .arg("--data-dir")
            .arg(dir.join("data"))
            .args(["--listen", "127.0.0.1:0"])
            .arg("--control-socket")
            .arg(&control)
            .args(["--shards", &shards.to_string()])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr))
            .spawn()
            .map_err(|source| ServerError::Spawn {
                bin: bin.to_owned(),
                source,
            })?;
        crate::interrupt::register_child(child.id());
        // The ready line comes on stdout; keep draining it afterwards so the
        // server never blocks on a full pipe.
        let stdout = child.stdout.take().expect("stdout is piped");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            let _ = tx.send(lines.next());
            for _ in lines {}
        });
        let mut server = ServerProcess {
            child: Some(child),
            addr: String::new(),
            stderr_path,
            control,
        };
        let started = Instant::now();
        let line = match rx.recv_timeout(START_TIMEOUT) {
            Ok(Some(Ok(line))) => line,
            Ok(_) => return Err(server.not_ready("it exited before printing its ready line")),
            Err(_) => return Err(server.not_ready("no ready line")),
        };
        let Some(addr) = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("client="))
        else {
            return Err(server.not_ready(&format!("unexpected first line {line:?}")));
        };
        server.addr = addr.to_owned();
        // The ready line is printed once the listener is bound; confirm with
        // a handshake, retrying briefly.
        loop {
            match Client::connect(&server.addr) {
                Ok(_) => return Ok(server),
                Err(e) if started.elapsed() > START_TIMEOUT => {
                    return Err(server.not_ready(&format!("connecting to {}: {e}", server.addr)));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    /// The server's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    fn not_ready(&mut self, why: &str) -> ServerError {
        self.kill();
        ServerError::NotReady {
            timeout: START_TIMEOUT,
            why: why.to_owned(),
            stderr: self.stderr(),
        }
    }

    /// The server's control socket (`ringlog ctl --socket`).
    pub fn control_socket(&self) -> PathBuf {
        self.control.clone()
    }

    /// The server's stderr so far.
    pub fn stderr(&self) -> String {
        fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// SIGTERM, then waits (bounded) for a successful exit.
    pub fn stop(mut self) -> Result<(), ServerError> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        crate::interrupt::unregister_child(child.id());
        let pid = libc::pid_t::try_from(child.id()).expect("pids fit in pid_t");
        // SAFETY: kill(2) on our own child, which has not been waited for,
        // so the pid still names it.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
        let deadline = Instant::now() + STOP_TIMEOUT;
        loop {
            match child.try_wait() {
                Ok(Some(status)) if status.success() => return Ok(()),
                Ok(Some(status)) => {
                    return Err(ServerError::BadExit {
                        status,
                        stderr: self.stderr(),
                    })
                }
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(ServerError::StopTimeout(STOP_TIMEOUT));
                }
            }
        }
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            crate::interrupt::unregister_child(child.id());
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Makes `command`'s child run with RLIMIT_NOFILE = `n` (soft and hard).
fn set_files_max(command: &mut Command, n: u64) {
    use std::os::unix::process::CommandExt as _;
    let limit = libc::rlimit {
        rlim_cur: n as libc::rlim_t,
        rlim_max: n as libc::rlim_t,
    };
    // SAFETY: the closure runs in the forked child before exec and only
    // calls setrlimit(2), which is async-signal-safe.
    unsafe {
        command.pre_exec(move || {
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) == 0 {
                Ok(())
            } else {
                Err(io::Error::last_os_error())
            }
        });
    }
}
