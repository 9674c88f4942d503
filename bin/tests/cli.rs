//! The README walk-through: `ringlog server` with no arguments, `ctl status`,
//! `produce` lines from stdin and `consume` them back, `ctl shutdown`.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{wait_bounded, BIN, START_TIMEOUT};

fn run(cwd: &std::path::Path, args: &[&str], stdin: Option<&str>) -> std::process::Output {
    let mut child = Command::new(BIN)
        .current_dir(cwd)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    if let Some(text) = stdin {
        input.write_all(text.as_bytes()).unwrap();
    }
    drop(input);
    child.wait_with_output().unwrap()
}

#[test]
fn server_with_no_arguments_round_trips_lines() {
    let dir = tempfile::tempdir().unwrap();
    let cwd = dir.path();
    let mut server = Command::new(BIN)
        .current_dir(cwd)
        .arg("server")
        .env_remove("RINGLOG_LISTEN")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = server.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        if let Some(Ok(l)) = lines.next() {
            let _ = tx.send(l);
        }
    });
    let ready = match rx.recv_timeout(START_TIMEOUT) {
        Ok(l) => l,
        Err(_) => {
            let _ = server.kill();
            panic!("server did not start (is 127.0.0.1:7420 in use?)");
        }
    };
    assert!(ready.contains("client=127.0.0.1:7420"), "{ready}");
    assert!(cwd.join("data/topics.json").exists() || cwd.join("data/topics").is_dir());

    let out = run(cwd, &["ctl", "status"], None);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("SHARD") && text.contains("uptime"), "{text}");

    let out = run(cwd, &["ctl", "create-topic", "greetings", "2"], None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines = "hello\nworld\n\nlast line with spaces\n";
    let out = run(cwd, &["produce", "greetings"], Some(lines));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run(cwd, &["consume", "greetings", "--from", "0"], None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), lines);
    let out = run(
        cwd,
        &["consume", "greetings", "--from", "1", "--offsets"],
        None,
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "1\tworld\n2\t\n3\tlast line with spaces\n"
    );
    // Generated records and the tables.
    let out = run(
        cwd,
        &[
            "produce",
            "greetings",
            "--partition",
            "1",
            "--count",
            "250",
            "--size",
            "32",
        ],
        None,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run(cwd, &["ctl", "partitions", "greetings"], None);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("FRONTIER") && text.contains("250"), "{text}");
    let out = run(cwd, &["ctl", "metrics"], None);
    assert!(String::from_utf8_lossy(&out.stdout).contains("ringlog_fsync_latency_us_bucket"));

    let out = run(cwd, &["ctl", "shutdown"], None);
    assert!(out.status.success());
    let status = wait_bounded(&mut server, Duration::from_secs(30));
    assert_eq!(status.code(), Some(0));
}
