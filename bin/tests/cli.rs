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
        // A command that exits without reading stdin (a refused connect)
        // closes the pipe first; its output says what happened.
        if let Err(e) = input.write_all(text.as_bytes()) {
            assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe, "{e}");
        }
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
    assert!(String::from_utf8_lossy(&out.stdout).contains("ringlog_fsync_duration_seconds_bucket"));

    let out = run(cwd, &["ctl", "shutdown"], None);
    assert!(out.status.success());
    let status = wait_bounded(&mut server, Duration::from_secs(30));
    assert_eq!(status.code(), Some(0));
}

// ---- produce and consume like kcat (issue 13 item 1) ----

/// Runs the binary with `args` (no working-directory dependence) and stdin.
fn ringlog(args: &[&str], stdin: Option<&str>) -> std::process::Output {
    let dir = std::env::temp_dir();
    run(&dir, args, stdin)
}

fn ok_stdout(out: &std::process::Output) -> String {
    assert!(
        out.status.success(),
        "exit {:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

fn sorted_lines(text: &str) -> Vec<String> {
    let mut v: Vec<String> = text.lines().map(str::to_string).collect();
    v.sort();
    v
}

#[test]
fn keyed_records_across_partitions_are_all_consumed_and_routing_is_printed() {
    let dir = tempfile::tempdir().unwrap();
    let server = common::Server::start(&dir.path().join("d"), &[]);
    let a = server.addr.as_str();
    ok_stdout(&ringlog(
        &["produce", "t", "--addr", a, "--create", "4"],
        Some(""),
    ));
    let mut partitions = std::collections::BTreeSet::new();
    for i in 0..12 {
        let key = format!("user-{i}");
        let out = ringlog(
            &["produce", "t", "--addr", a, "--key", &key],
            Some(&format!("v{i}\n")),
        );
        ok_stdout(&out);
        let err = String::from_utf8_lossy(&out.stderr);
        // "key user-3 -> partition 2"
        let p: u32 = err
            .split(&format!("key {key:?} -> partition "))
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no routing line in {err:?}"));
        assert!(err.contains(&format!("t/{p} offsets ")), "{err}");
        partitions.insert(p);
    }
    assert!(partitions.len() > 1, "12 keys all went to {partitions:?}");
    let text = ok_stdout(&ringlog(&["consume", "t", "--addr", a], None));
    let want: Vec<String> = sorted_lines(&(0..12).map(|i| format!("v{i}\n")).collect::<String>());
    assert_eq!(sorted_lines(&text), want);
    // -p N reads one partition only.
    let one = *partitions.iter().next().unwrap();
    let text = ok_stdout(&ringlog(
        &[
            "consume",
            "t",
            "--addr",
            a,
            "-p",
            &one.to_string(),
            "-f",
            "%p\n",
        ],
        None,
    ));
    assert!(!text.is_empty());
    assert!(text.lines().all(|l| l == one.to_string()), "{text}");
}

#[test]
fn consume_start_positions_and_count() {
    let dir = tempfile::tempdir().unwrap();
    let server = common::Server::start(&dir.path().join("d"), &[]);
    let a = server.addr.as_str();
    let first: String = (0..6).map(|i| format!("a{i}\n")).collect();
    ok_stdout(&ringlog(
        &["produce", "t", "--addr", a, "--create", "2", "--batch", "3"],
        Some(&first),
    ));
    ok_stdout(&ringlog(
        &["produce", "t", "--addr", a, "--partition", "1"],
        Some("b0\nb1\n"),
    ));
    std::thread::sleep(Duration::from_millis(30));
    let since_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        .to_string();
    std::thread::sleep(Duration::from_millis(30));
    ok_stdout(&ringlog(&["produce", "t", "--addr", a], Some("a6\na7\n")));
    let consume = |extra: &[&str]| {
        let mut args = vec!["consume", "t", "--addr", a];
        args.extend_from_slice(extra);
        ok_stdout(&ringlog(&args, None))
    };
    assert_eq!(consume(&["-p", "0", "-o", "3"]), "a3\na4\na5\na6\na7\n");
    assert_eq!(consume(&["-p", "0", "-o", "-2"]), "a6\na7\n");
    assert_eq!(
        consume(&["-p", "0", "--from", "beginning", "-c", "4"]),
        "a0\na1\na2\na3\n"
    );
    assert_eq!(consume(&["-o", "end"]), "");
    assert_eq!(sorted_lines(&consume(&["-o", "-1"])), ["a7", "b1"]);
    assert_eq!(consume(&["-o", &format!("@{since_ms}")]), "a6\na7\n");
    assert_eq!(consume(&["-c", "3"]).lines().count(), 3);
    let bad = ringlog(&["consume", "t", "--addr", a, "-o", "soon"], None);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("beginning"));
}

#[test]
fn consume_follow_waits_for_new_records_until_count() {
    // From the beginning with -c 3: "old" is there, the other two arrive
    // while it waits at the end of every partition.
    let dir = tempfile::tempdir().unwrap();
    let server = common::Server::start(&dir.path().join("d"), &[]);
    let a = server.addr.clone();
    ok_stdout(&ringlog(
        &["produce", "t", "--addr", &a, "--create", "3"],
        Some("old\n"),
    ));
    let follower = Command::new(BIN)
        .args(["consume", "t", "--addr", &a, "--follow", "-c", "3"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    ok_stdout(&ringlog(
        &["produce", "t", "--addr", &a, "--partition", "2"],
        Some("new1\n"),
    ));
    ok_stdout(&ringlog(&["produce", "t", "--addr", &a], Some("new2\n")));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(follower.wait_with_output());
    });
    let out = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("consume --follow -c 3 did not exit")
        .unwrap();
    assert_eq!(sorted_lines(&ok_stdout(&out)), ["new1", "new2", "old"]);
}

#[test]
fn consume_format_and_json_parse_back() {
    let dir = tempfile::tempdir().unwrap();
    let server = common::Server::start(&dir.path().join("d"), &[]);
    let a = server.addr.as_str();
    let before_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    ok_stdout(&ringlog(
        &[
            "produce",
            "t",
            "--addr",
            a,
            "--create",
            "2",
            "--partition",
            "1",
            "-H",
            "h1=x",
            "-H",
            "h2=y z",
        ],
        Some("one\ntwo words\n"),
    ));
    let text = ok_stdout(&ringlog(
        &["consume", "t", "--addr", a, "-f", "%p|%o|%k|%t|%h|%v\\n"],
        None,
    ));
    let lines: Vec<Vec<&str>> = text.lines().map(|l| l.split('|').collect()).collect();
    assert_eq!(lines.len(), 2, "{text}");
    for (i, (f, value)) in lines.iter().zip(["one", "two words"]).enumerate() {
        assert_eq!(f[0], "1");
        assert_eq!(f[1], i.to_string());
        assert_eq!(f[2], "");
        let ts: u64 = f[3].parse().unwrap();
        assert!(ts >= before_ms, "{ts} < {before_ms}");
        assert_eq!(f[4], "h1=x,h2=y z");
        assert_eq!(f[5], value);
    }
    ok_stdout(&ringlog(
        &["produce", "t", "--addr", a, "--key", "k"],
        Some("keyed\n"),
    ));
    let text = ok_stdout(&ringlog(&["consume", "t", "--addr", a, "--json"], None));
    let docs: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(docs.len(), 3, "{text}");
    let keyed = docs.iter().find(|d| d["value"] == "keyed").unwrap();
    assert_eq!(keyed["key"], "k");
    assert_eq!(keyed["topic"], "t");
    assert!(keyed["timestamp_ms"].as_u64().unwrap() >= before_ms);
    let two = docs.iter().find(|d| d["value"] == "two words").unwrap();
    assert_eq!(two["partition"], 1);
    assert_eq!(two["offset"], 1);
    assert_eq!(two["headers"]["h2"], "y z");
}

// ---- client errors with context (issue 13 item 3) ----

#[test]
fn connection_refused_names_the_address() {
    // A port nothing listens on: bind, note, close.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    for cmd in ["produce", "consume"] {
        let out = ringlog(&[cmd, "t", "--addr", &addr], Some("x\n"));
        assert_eq!(out.status.code(), Some(1));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(&format!("cannot connect to {addr}")), "{err}");
        assert!(err.contains("ringlog server"), "{err}");
    }
}

#[test]
fn oversized_record_is_refused_before_sending_naming_the_config_key() {
    let dir = tempfile::tempdir().unwrap();
    let server = common::Server::start(
        &dir.path().join("d"),
        &["--set", "write_buffer_bytes=65536"],
    );
    let a = server.addr.as_str();
    let big = "x".repeat(70_000);
    let out = ringlog(
        &["produce", "t", "--addr", a, "--create", "1", "--batch", "1"],
        Some(&format!("a\nb\n{big}\nc\n")),
    );
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("write_buffer_bytes"), "{err}");
    assert!(err.contains("limit of 61440 bytes"), "{err}");
    assert!(err.contains("not sent"), "{err}");
    assert!(err.contains("2 records acknowledged"), "{err}");
    let text = ok_stdout(&ringlog(&["consume", "t", "--addr", a], None));
    assert_eq!(text, "a\nb\n");
}

#[test]
fn produce_cut_off_says_how_many_records_were_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = common::Server::start(&dir.path().join("d"), &[]);
    let mut c = server.client();
    c.create_topic("t", 1).unwrap();
    let mut producer = Command::new(BIN)
        .args(["produce", "t", "--addr", &server.addr, "--batch", "1"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = producer.stdin.take().unwrap();
    input.write_all(b"one\ntwo\nthree\n").unwrap();
    input.flush().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while c.fetch("t", 0, 0, 1 << 20, 0).unwrap().high_watermark < 3 {
        assert!(std::time::Instant::now() < deadline, "3 lines never acked");
        std::thread::sleep(Duration::from_millis(20));
    }
    server.kill9();
    // The next batch meets a dead connection.
    let _ = input.write_all(b"four\n");
    drop(input);
    let out = producer.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("3 records acknowledged"), "{err}");
    assert!(err.contains("not acknowledged"), "{err}");
}

#[test]
fn consume_into_a_closed_pipe_exits_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let server = common::Server::start(&dir.path().join("d"), &[]);
    let a = server.addr.clone();
    ok_stdout(&ringlog(
        &[
            "produce", "t", "--addr", &a, "--create", "1", "--count", "20000", "--size", "64",
        ],
        None,
    ));
    let mut consumer = Command::new(BIN)
        .args(["consume", "t", "--addr", &a, "--max-bytes", "4096"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // `| head -1`: read one line, close the pipe.
    let mut first = String::new();
    BufReader::new(consumer.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.starts_with("00000000000000000000"), "{first}");
    let status = wait_bounded(&mut consumer, Duration::from_secs(30));
    let mut err = String::new();
    std::io::Read::read_to_string(&mut consumer.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(err, "", "consume | head printed an error");
    assert_eq!(status.code(), Some(0));
}

// ---- ctl (issue 13 item 4) ----

/// Starts `ringlog server` in `cwd` with `args` and `envs` (no
/// --control-socket: the default `<data_dir>/control.sock`); waits for the
/// ready line.
fn start_server(
    cwd: &std::path::Path,
    args: &[&str],
    envs: &[(&str, &str)],
) -> std::process::Child {
    let mut child = Command::new(BIN)
        .current_dir(cwd)
        .arg("server")
        .args(["--listen", "127.0.0.1:0", "--shards", "1"])
        .args(args)
        .envs(envs.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        if let Some(Ok(l)) = lines.next() {
            let _ = tx.send(l);
        }
        for _ in lines {}
    });
    if rx.recv_timeout(START_TIMEOUT).is_err() {
        let _ = child.kill();
        panic!("server did not start");
    }
    child
}

/// `ringlog ctl ARGS` from `cwd` with exactly `envs` of the ringlog ones.
fn ctl_in(cwd: &std::path::Path, args: &[&str], envs: &[(&str, &str)]) -> std::process::Output {
    Command::new(BIN)
        .current_dir(cwd)
        .arg("ctl")
        .args(args)
        .env_remove("RINGLOG_CONTROL_SOCKET")
        .env_remove("RINGLOG_DATA_DIR")
        .envs(envs.iter().copied())
        .output()
        .unwrap()
}

#[test]
fn ctl_finds_the_socket_from_anywhere_and_says_what_to_do_without_one() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("srv").join("data");
    std::fs::create_dir_all(dir.path().join("srv")).unwrap();
    let runtime = dir.path().join("run");
    let elsewhere = dir.path().join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let rt = runtime.to_str().unwrap();
    // Started with a relative data dir from its own directory.
    let mut server = start_server(&dir.path().join("srv"), &[], &[("XDG_RUNTIME_DIR", rt)]);
    let d = data.to_str().unwrap();
    for (args, envs) in [
        (
            vec!["--data-dir", d, "status"],
            vec![("XDG_RUNTIME_DIR", "/nonexistent")],
        ),
        (
            vec!["status"],
            vec![("RINGLOG_DATA_DIR", d), ("XDG_RUNTIME_DIR", "/nonexistent")],
        ),
        // Nothing given: the socket the server recorded.
        (vec!["status"], vec![("XDG_RUNTIME_DIR", rt)]),
    ] {
        let out = ctl_in(&elsewhere, &args, &envs);
        assert!(
            out.status.success(),
            "{args:?} {envs:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(String::from_utf8_lossy(&out.stdout).contains("uptime"));
    }
    let empty_rt = dir.path().join("empty-run");
    let out = ctl_in(
        &elsewhere,
        &["status"],
        &[("XDG_RUNTIME_DIR", empty_rt.to_str().unwrap())],
    );
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no control socket at ./data/control.sock"),
        "{err}"
    );
    assert!(
        err.contains("--data-dir") && err.contains("ringlog server"),
        "{err}"
    );
    let out = ctl_in(&elsewhere, &["--data-dir", d, "shutdown"], &[]);
    assert!(out.status.success());
    assert_eq!(
        wait_bounded(&mut server, Duration::from_secs(30)).code(),
        Some(0)
    );
    // A clean stop removes the record it wrote.
    assert!(!runtime.join("ringlog/control-socket").exists());
}

#[test]
fn ctl_json_after_the_subcommand_unknown_topic_errors_help_and_config() {
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("ringlog.toml");
    std::fs::write(&conf, "segment_size_bytes = 8388608\n").unwrap();
    let data = dir.path().join("data");
    let mut server = start_server(
        dir.path(),
        &[
            "--config",
            conf.to_str().unwrap(),
            "--set",
            "retention_ms=5000",
        ],
        &[
            ("RINGLOG_IDLE_TIMEOUT_MS", "60000"),
            ("XDG_RUNTIME_DIR", dir.path().to_str().unwrap()),
        ],
    );
    let d = data.to_str().unwrap();
    let out = ctl_in(dir.path(), &["status", "--json", "--data-dir", d], &[]);
    let reply: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(reply["ok"], true);

    ok_stdout(&ctl_in(
        dir.path(),
        &["--data-dir", d, "create-topic", "real", "1"],
        &[],
    ));
    for sub in [vec!["partitions", "NOSUCH"], vec!["purge", "NOSUCH"]] {
        let mut args = vec!["--data-dir", d];
        args.extend(sub.iter());
        let out = ctl_in(dir.path(), &args, &[]);
        assert_eq!(out.status.code(), Some(1), "{sub:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("no topic \"NOSUCH\""),
            "{sub:?}"
        );
    }
    let text = ok_stdout(&ctl_in(
        dir.path(),
        &["--data-dir", d, "partitions", "real"],
        &[],
    ));
    assert_eq!(text.lines().count(), 2, "{text}");

    let help = ok_stdout(&ctl_in(dir.path(), &["help"], &[]));
    for sub in ["status", "partitions", "purge", "config", "shutdown"] {
        assert!(help.contains(sub), "{help}");
    }

    let out = ctl_in(dir.path(), &["config", "--json", "--data-dir", d], &[]);
    let reply: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let source = |key: &str| {
        let row = reply["result"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["key"] == key)
            .unwrap_or_else(|| panic!("no {key} in {reply}"))
            .clone();
        (
            row["value"].clone(),
            row["source"].as_str().unwrap().to_string(),
        )
    };
    assert_eq!(
        source("segment_size_bytes"),
        (8388608.into(), format!("file {}", conf.display()))
    );
    assert_eq!(
        source("retention_ms"),
        (5000.into(), "flag --retention-ms".into())
    );
    assert_eq!(
        source("idle_timeout_ms"),
        (60000.into(), "environment RINGLOG_IDLE_TIMEOUT_MS".into())
    );
    assert_eq!(source("frame_bytes_max").1, "default");
    let text = ok_stdout(&ctl_in(dir.path(), &["--data-dir", d, "config"], &[]));
    assert!(
        text.starts_with("KEY") && text.contains("flag --retention-ms"),
        "{text}"
    );

    ok_stdout(&ctl_in(dir.path(), &["--data-dir", d, "shutdown"], &[]));
    assert_eq!(
        wait_bounded(&mut server, Duration::from_secs(30)).code(),
        Some(0)
    );
}

// ---- committed consumer offsets (issue 13 item 2) ----

#[test]
fn consumer_group_commits_resumes_after_a_crash_shows_lag_and_resets() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d");
    let mut server = common::Server::start(&data, &[]);
    let a = server.addr.clone();
    let produce = |a: &str, p: &str, lines: &str| {
        ok_stdout(&ringlog(
            &["produce", "t", "--addr", a, "-p", p, "-q"],
            Some(lines),
        ));
    };
    ok_stdout(&ringlog(
        &["produce", "t", "--addr", &a, "--create", "2"],
        Some(""),
    ));
    produce(&a, "0", "a0\na1\na2\na3\na4\n");
    produce(&a, "1", "b0\nb1\nb2\n");
    let group = |a: &str, extra: &[&str]| {
        let mut args = vec!["consume", "t", "--addr", a, "-g", "g1"];
        args.extend_from_slice(extra);
        ok_stdout(&ringlog(&args, None))
    };
    assert_eq!(group(&a, &["-c", "3"]), "a0\na1\na2\n");
    assert_eq!(group(&a, &[]), "a3\na4\nb0\nb1\nb2\n");
    assert_eq!(group(&a, &[]), "");
    // -o applies only where the group has no commit.
    assert_eq!(group(&a, &["-o", "beginning"]), "");
    produce(&a, "1", "b3\nb4\n");
    let lag = |server: &common::Server| {
        let reply = server.ctl(&["consumers"]);
        assert_eq!(reply["ok"], true, "{reply}");
        reply["result"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r["partition"].as_u64().unwrap(),
                    r["committed"].as_u64().unwrap(),
                    r["lag"].as_u64().unwrap(),
                )
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(lag(&server), [(0, 5, 0), (1, 3, 2)]);
    let table = ok_stdout(&ringlog(
        &[
            "ctl",
            "consumers",
            "--socket",
            server.control.to_str().unwrap(),
        ],
        None,
    ));
    assert!(
        table.starts_with("GROUP") && table.contains("g1"),
        "{table}"
    );

    // Commits are acknowledged produces: they survive SIGKILL.
    server.kill9();
    let server = common::Server::start(&data, &[]);
    let a = server.addr.clone();
    assert_eq!(group(&a, &[]), "b3\nb4\n");
    assert_eq!(lag(&server), [(0, 5, 0), (1, 5, 0)]);

    // A position below a purge: the reset policy decides.
    let g2 = |a: &str, extra: &[&str]| {
        let mut args = vec!["consume", "t", "--addr", a, "-g", "g2", "-p", "0"];
        args.extend_from_slice(extra);
        ringlog(&args, None)
    };
    assert_eq!(ok_stdout(&g2(&a, &["-c", "2"])), "a0\na1\n");
    let g3 = ringlog(
        &[
            "consume", "t", "--addr", &a, "-g", "g3", "-p", "0", "-c", "1",
        ],
        None,
    );
    assert_eq!(ok_stdout(&g3), "a0\n");
    assert_eq!(server.ctl(&["purge", "t"])["ok"], true);
    produce(&a, "0", "a5\n");
    let refused = g2(&a, &["--reset", "error"]);
    assert_eq!(refused.status.code(), Some(1));
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        err.contains("committed offset 2 is outside the stored range 5..6"),
        "{err}"
    );
    // latest: skip to the end (a5 too); earliest (the default): a5.
    assert_eq!(ok_stdout(&g2(&a, &["--reset", "latest"])), "");
    assert_eq!(ok_stdout(&g2(&a, &[])), "");
    let g3 = ringlog(&["consume", "t", "--addr", &a, "-g", "g3", "-p", "0"], None);
    assert_eq!(ok_stdout(&g3), "a5\n");
}

#[test]
fn ctl_into_a_closed_pipe_exits_quietly() {
    use std::os::fd::{FromRawFd, OwnedFd};
    let dir = tempfile::tempdir().unwrap();
    let server = common::Server::start(&dir.path().join("d"), &["--set", "shards=1"]);
    assert_eq!(server.ctl(&["create-topic", "wide", "120"])["ok"], true);
    // A one-page pipe, so the table (about 9 KiB) cannot fit before the
    // reader closes it.
    let mut fds = [0; 2];
    // SAFETY: pipe2(2) fills two descriptors we then own; close-on-exec so
    // the child holds only the write end it is given.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: fds[0] is our open read end.
    unsafe { libc::fcntl(fds[0], libc::F_SETPIPE_SZ, 4096) };
    // SAFETY: each descriptor is owned exactly once from here.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let mut child = Command::new(BIN)
        .args([
            "ctl",
            "--socket",
            server.control.to_str().unwrap(),
            "partitions",
            "wide",
        ])
        .stdout(Stdio::from(write))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(std::fs::File::from(read))
        .read_line(&mut first)
        .unwrap();
    assert!(first.starts_with("NODE  TOPIC"), "{first}");
    let status = wait_bounded(&mut child, Duration::from_secs(30));
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(err, "", "ctl | head printed an error");
    use std::os::unix::process::ExitStatusExt;
    assert!(
        status.success() || status.signal() == Some(libc::SIGPIPE),
        "{status:?}"
    );
}
