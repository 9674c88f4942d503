//! Ctrl-C: SIGINT (or SIGTERM) stops the run, the processes it started (a
//! `ringlog server`, fio) and removes its data, then exits with 128 +
//! the signal, as a shell reports a job killed by it.
//!
//! The signal handler only writes the signal number to a pipe (that is
//! async-signal-safe); a watcher thread reads it and does the cleanup from
//! what the run registered: child processes while they run, workspaces
//! while they exist. Children do not inherit the handler (exec resets it).

use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The pipe's write end, for the handler; -1 until [`install`].
static PIPE_WRITE_FD: AtomicI32 = AtomicI32::new(-1);

/// Set once a signal came: from then on the watcher owns the exit.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// What an interrupt must clean up.
struct Registry {
    /// Child processes to stop (SIGTERM, then SIGKILL).
    children: Vec<u32>,
    /// Per workspace: its id, the paths to remove, and its directory if the
    /// run created it (removed once empty).
    workspaces: Vec<(u64, Vec<PathBuf>, Option<PathBuf>)>,
    next_id: u64,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    children: Vec::new(),
    workspaces: Vec::new(),
    next_id: 0,
});

/// How long a child gets to exit after SIGTERM before SIGKILL.
const CHILD_STOP_TIMEOUT: Duration = Duration::from_secs(5);

fn registry() -> MutexGuard<'static, Registry> {
    // A panic elsewhere while holding the lock leaves plain data behind.
    REGISTRY.lock().unwrap_or_else(|e| e.into_inner())
}

/// A child process to stop on interrupt, until [`unregister_child`].
pub fn register_child(pid: u32) {
    registry().children.push(pid);
}

pub fn unregister_child(pid: u32) {
    registry().children.retain(|p| *p != pid);
}

/// Paths (and the directory, if `created`) to remove on interrupt; returns
/// the id for [`unregister_workspace`].
pub fn register_workspace(paths: Vec<PathBuf>, created: Option<PathBuf>) -> u64 {
    let mut r = registry();
    r.next_id += 1;
    let id = r.next_id;
    r.workspaces.push((id, paths, created));
    id
}

pub fn unregister_workspace(id: u64) {
    registry().workspaces.retain(|(w, _, _)| *w != id);
}

extern "C" fn on_signal(signal: libc::c_int) {
    let fd = PIPE_WRITE_FD.load(Ordering::Relaxed);
    let byte = signal as u8;
    // SAFETY: write(2) is async-signal-safe; the buffer is one local byte.
    // A failed write (full pipe: a signal is already pending) loses nothing.
    unsafe {
        libc::write(fd, (&byte as *const u8).cast(), 1);
    }
}

/// Installs the SIGINT and SIGTERM handlers and starts the watcher thread.
pub fn install() -> io::Result<()> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: pipe2 writes two fds into the array we own.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    PIPE_WRITE_FD.store(fds[1], Ordering::Relaxed);
    let read_fd = fds[0];
    std::thread::Builder::new()
        .name("interrupt".into())
        .spawn(move || watch(read_fd))?;
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: a zeroed sigaction with a plain handler and an empty mask
        // is valid; on_signal only calls write(2).
        let rc = unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
            action.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(signal, &action, std::ptr::null_mut())
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

fn watch(read_fd: libc::c_int) {
    let mut byte = 0u8;
    loop {
        // SAFETY: read(2) into one byte we own, from the pipe we created.
        let n = unsafe { libc::read(read_fd, (&mut byte as *mut u8).cast(), 1) };
        if n == 1 {
            break;
        }
        if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
            continue;
        }
        return; // The pipe failed: leave the default (no cleanup) behaviour.
    }
    INTERRUPTED.store(true, Ordering::SeqCst);
    let signal = libc::c_int::from(byte);
    let name = if signal == libc::SIGINT {
        "SIGINT"
    } else {
        "SIGTERM"
    };
    eprintln!("ringlog-bench: interrupted ({name}): stopping what the run started");
    cleanup();
    std::process::exit(128 + signal);
}

/// Parks the calling thread for good if an interrupt is being handled: the
/// run's errors from the cleanup (a stopped server refusing connections)
/// are its doing, and the watcher exits the process with the signal's code.
pub fn wait_if_interrupted() {
    while INTERRUPTED.load(Ordering::SeqCst) {
        std::thread::park();
    }
}

/// Stops the registered children, then removes the registered paths. Holds
/// the registry lock throughout, so no new child or workspace slips in.
fn cleanup() {
    let r = registry();
    for &pid in &r.children {
        stop_child(pid);
        eprintln!("ringlog-bench: stopped child process {pid}");
    }
    for (_, paths, created) in &r.workspaces {
        for p in paths {
            if let Err(e) = crate::harness::remove_if_exists(p) {
                eprintln!("ringlog-bench: {e}");
            }
        }
        if let Some(dir) = created {
            // Only if empty now: anything else in it is not ours.
            if std::fs::remove_dir(dir).is_ok() {
                eprintln!("ringlog-bench: removed {}", dir.display());
            }
        }
    }
}

/// SIGTERM, up to [`CHILD_STOP_TIMEOUT`] for it to exit (reaped), then
/// SIGKILL.
fn stop_child(pid: u32) {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return;
    };
    let reaped = || {
        let mut status = 0;
        // SAFETY: waitpid(2) on our own child with WNOHANG; the status is
        // a local we own.
        let rc = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        rc == pid || rc < 0
    };
    // SAFETY: kill(2) on a registered child. A server is unregistered
    // before its owner reaps it, so the pid still names it; fio is
    // unregistered right after (its output is read until it exits), a
    // window of a few instructions in which the pid is free.
    unsafe {
        libc::kill(pid, libc::SIGTERM);
    }
    let deadline = Instant::now() + CHILD_STOP_TIMEOUT;
    while Instant::now() < deadline {
        if reaped() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: as above; still not reaped.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
        libc::waitpid(pid, std::ptr::null_mut(), 0);
    }
}
