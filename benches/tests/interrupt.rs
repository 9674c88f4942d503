//! Ctrl-C on the real binary: SIGINT during a produce run stops the run,
//! stops the server the job started and removes the data directory. Needs
//! the `ringlog` binary next to ringlog-bench (ci/test's `cargo test
//! --workspace` builds it; alone: `cargo build --release -p ringlog` first).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The children of process `pid` (every thread's), from /proc.
fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for task in tasks.flatten() {
        let list = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        out.extend(
            list.split_whitespace()
                .filter_map(|p| p.parse::<u32>().ok()),
        );
    }
    out
}

/// Whether `pid` names a process that has not exited (a zombie has).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z')),
        Err(_) => false,
    }
}

fn wait_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn sigint_stops_the_server_and_removes_the_data_dir() {
    let tmp = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
    let dir = tmp.path().join("data");
    let mut bench = Command::new(env!("CARGO_BIN_EXE_ringlog-bench"))
        .arg("produce")
        .arg("--dir")
        .arg(&dir)
        .args(["--shards", "1", "--segment-size", "4m", "--duration", "2m"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let stderr = bench.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    // Into the timed run: the server is up and the clients produce.
    let mut seen = Vec::new();
    while !seen.iter().any(|l: &String| l.contains("rep 1/1")) {
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(line) => seen.push(line),
            Err(e) => panic!("no rep line ({e}); stderr so far: {seen:#?}"),
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    let servers = children(bench.id());
    assert_eq!(servers.len(), 1, "one server child: {servers:?}");
    assert!(dir.join("server").is_dir());

    // SAFETY: kill(2) on our own child, not yet waited for.
    let rc = unsafe { libc::kill(bench.id() as libc::pid_t, libc::SIGINT) };
    assert_eq!(rc, 0);
    let mut status = None;
    wait_until("ringlog-bench to exit", Duration::from_secs(30), || {
        status = bench.try_wait().unwrap();
        status.is_some()
    });
    let status = status.unwrap();
    seen.extend(rx.try_iter());
    assert_eq!(status.code(), Some(130), "exit 128 + SIGINT: {seen:#?}");
    wait_until("the server to exit", Duration::from_secs(10), || {
        !alive(servers[0])
    });
    assert!(!dir.exists(), "data dir removed: {seen:#?}");
    assert!(
        seen.iter().any(|l| l.contains("interrupted")),
        "says so: {seen:#?}"
    );
    assert!(Path::new(tmp.path()).exists());
}
