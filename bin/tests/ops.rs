//! Operating the server (issue 13 item 5): what a restart logs, audit lines
//! for operator actions, SIGHUP, a bad `log_level`, JSON logs.

mod common;

use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{wait_bounded, Server, BIN, START_TIMEOUT};
use ringlog_shard::client::batch_of;

/// Words a log must not hold after a clean stop and restart.
const ALARMING: &[&str] = &[
    " WARN ",
    " ERROR ",
    "torn",
    "stale",
    "bad magic",
    "damaged",
    "rewriting",
    "rebuilding",
    "recreating",
];

fn alarming_lines(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| ALARMING.iter().any(|w| l.contains(w)))
        .collect()
}

fn produce_to(server: &Server, topic: &str, partition: u32, batches: usize) {
    let mut c = server.client();
    for b in 0..batches {
        let value = format!("{topic}-{partition}-{b}-{}", "v".repeat(200));
        c.produce(topic, partition, batch_of(&[value.as_bytes()]).unwrap())
            .unwrap();
    }
}

fn count_records(server: &Server, topic: &str, partition: u32) -> usize {
    common::read_all(&mut server.client(), topic, partition).len()
}

/// Stops `server` through `ctl shutdown` and checks it exits 0.
fn shutdown(mut server: Server) -> String {
    assert_eq!(server.ctl(&["shutdown"])["ok"], true);
    let mut child = server.child.take().unwrap();
    assert_eq!(
        wait_bounded(&mut child, Duration::from_secs(30)).code(),
        Some(0)
    );
    server.stderr()
}

/// The active segment of partition `index` of `topic`: the highest base
/// offset in its newest generation directory.
fn active_segment(data: &Path, topic: &str, index: u32) -> PathBuf {
    let part = data.join("topics").join(topic).join(index.to_string());
    let newest = |dir: &Path, prefix: &str, suffix: &str| {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| {
                let name = p.file_name().unwrap().to_string_lossy().to_string();
                name.starts_with(prefix) && name.ends_with(suffix)
            })
            .max()
            .unwrap_or_else(|| panic!("no {prefix}*{suffix} in {}", dir.display()))
    };
    let generation = newest(&part, "gen-", "");
    newest(&generation, "", ".log")
}

/// A torn write of the flush in flight at a crash: garbage from the log's
/// end over the last flush trailer (the trailer with the highest end
/// position names where the log ends). Returns that end.
fn tear_the_tail(segment: &Path) -> u64 {
    const SECTOR: usize = 512;
    let bytes = std::fs::read(segment).unwrap();
    let u64_at = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().unwrap());
    // Trailer layout (storage/src/segment.rs): magic at 0, end_position
    // is the tenth u64 field from byte 32.
    let end = (0..bytes.len() / SECTOR)
        .map(|s| s * SECTOR)
        .filter(|&at| &bytes[at..at + 8] == b"RLGTRAIL")
        .map(|at| u64_at(at + 32 + 8 * 9))
        .max()
        .expect("the active segment holds a flush trailer");
    let trailer_end = end.next_multiple_of(SECTOR as u64) + SECTOR as u64;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(segment)
        .unwrap();
    f.seek(SeekFrom::Start(end)).unwrap();
    f.write_all(&vec![0xA5; (trailer_end - end) as usize])
        .unwrap();
    f.sync_all().unwrap();
    end
}

#[test]
fn a_clean_restart_logs_nothing_alarming_but_a_torn_tail_is_logged() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d");
    // Small segments so partitions roll, a purge so a partition moves to a
    // new generation and recycles files, a dropped topic: the paths that
    // leave unusual files behind.
    let flags = [
        "--segment-size-bytes",
        "262144",
        "--set",
        "write_buffer_bytes=65536",
    ];
    let server = Server::start(&data, &flags);
    common::create_topics(&mut server.client(), &[("t", 3), ("gone", 1)]);
    for p in 0..3 {
        produce_to(&server, "t", p, 3000);
    }
    assert_eq!(server.ctl(&["purge", "t", "--partition", "1"])["ok"], true);
    produce_to(&server, "t", 1, 10);
    assert_eq!(server.ctl(&["delete-topic", "gone"])["ok"], true);
    let first = shutdown(server);
    assert_eq!(alarming_lines(&first), Vec::<&str>::new(), "{first}");

    let server = Server::start(&data, &flags);
    assert_eq!(count_records(&server, "t", 0), 3000);
    assert_eq!(count_records(&server, "t", 2), 3000);
    let restart = shutdown(server);
    assert_eq!(alarming_lines(&restart), Vec::<&str>::new(), "{restart}");
    assert!(restart.contains("ringlog ready"), "{restart}");

    // SIGKILL, then the write that was in flight torn: that is logged.
    let mut server = Server::start(&data, &flags);
    produce_to(&server, "t", 2, 5);
    let id = server.ctl(&["partitions", "t"])["result"][2]["partition_id"]
        .as_u64()
        .unwrap();
    server.kill9();
    let end = tear_the_tail(&active_segment(&data, "t", 2));
    let server = Server::start(&data, &flags);
    assert_eq!(count_records(&server, "t", 2), 3005);
    let log = server.stderr();
    let torn: Vec<&str> = log.lines().filter(|l| l.contains("torn")).collect();
    assert_eq!(torn.len(), 1, "{log}");
    assert!(
        torn[0].contains(&format!("partition={id}")) && torn[0].contains(&format!("{end}")),
        "{log}"
    );
}

/// The log lines of target `audit`.
fn audit_lines(log: &str) -> Vec<&str> {
    log.lines().filter(|l| l.contains(" audit: ")).collect()
}

#[test]
fn operator_actions_log_one_audit_line_each() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("d"), &[]);
    // Read-only commands are not audited.
    assert_eq!(server.ctl(&["status"])["ok"], true);
    assert_eq!(server.ctl(&["topics"])["ok"], true);
    assert_eq!(server.ctl(&["create-topic", "a", "2"])["ok"], true);
    assert_eq!(server.ctl(&["purge", "a", "--partition", "1"])["ok"], true);
    assert_eq!(server.ctl(&["purge", "nosuch"])["ok"], false);
    assert_eq!(server.ctl(&["log-level", "debug"])["ok"], true);
    assert_eq!(server.ctl(&["log-level", "info"])["ok"], true);
    assert_eq!(server.ctl(&["delete-topic", "a"])["ok"], true);
    let log = shutdown(server);
    let audit = audit_lines(&log);
    let want = [
        ("cmd=create_topic", "topic=a partitions=2", "result=ok"),
        ("cmd=purge", "topic=a partition=1", "result=ok"),
        ("cmd=purge", "topic=nosuch", "result=error: no topic"),
        ("cmd=log_level", "level=debug", "result=ok"),
        ("cmd=log_level", "level=info", "result=ok"),
        ("cmd=delete_topic", "topic=a", "result=ok"),
        ("cmd=shutdown", "", "result=ok"),
    ];
    assert_eq!(audit.len(), want.len(), "{log}");
    // SAFETY: getuid(2) cannot fail.
    let me = unsafe { libc::getuid() };
    for (line, (cmd, what, result)) in audit.iter().zip(want) {
        assert!(
            line.contains(" INFO ")
                && line.contains(&format!("who=uid={me} pid="))
                && line.contains(cmd)
                && line.contains(what)
                && line.contains(result),
            "want {cmd} {what} {result}: {line}"
        );
    }
}

/// `ringlog server` with `config` as its file, no RINGLOG_* variables but
/// `envs`, stderr into `log`; None if it exited before becoming ready.
fn spawn(
    dir: &Path,
    config: &str,
    args: &[&str],
    envs: &[(&str, &str)],
) -> (Child, PathBuf, Option<String>) {
    let file = dir.join("ringlog.toml");
    std::fs::write(&file, config).unwrap();
    let log = dir.join("server.log");
    let mut cmd = Command::new(BIN);
    cmd.arg("server")
        .arg("--config")
        .arg(&file)
        .arg("--data-dir")
        .arg(dir.join("d"))
        .args(["--listen", "127.0.0.1:0", "--shards", "1"])
        .args(args)
        .env("XDG_RUNTIME_DIR", dir);
    for (k, _) in std::env::vars() {
        if k.starts_with("RINGLOG_") {
            cmd.env_remove(k);
        }
    }
    let mut child = cmd
        .envs(envs.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        let _ = tx.send(lines.next().and_then(Result::ok));
        for _ in lines {}
    });
    let ready = rx.recv_timeout(START_TIMEOUT).unwrap_or_else(|_| {
        let _ = child.kill();
        panic!("server neither started nor exited");
    });
    (child, log, ready)
}

fn ctl(dir: &Path, args: &[&str]) -> serde_json::Value {
    let out = Command::new(BIN)
        .arg("ctl")
        .arg("--data-dir")
        .arg(dir.join("d"))
        .arg("--json")
        .args(args)
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "ctl {args:?}: {e}: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// Waits (bounded) until `log` holds `count` lines containing `what`.
fn wait_for_lines(log: &Path, what: &str, count: usize) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if text.lines().filter(|l| l.contains(what)).count() >= count {
            return text;
        }
        assert!(Instant::now() < deadline, "no {what:?} in:\n{text}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn send(child: &Child, sig: i32) {
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as i32, sig) }, 0);
}

#[test]
fn sighup_reloads_the_log_level_from_the_config_file_and_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (mut child, log, ready) = spawn(d, "log_level = \"warn\"\n", &[], &[]);
    assert!(
        ready.is_some(),
        "{}",
        std::fs::read_to_string(&log).unwrap()
    );
    assert_eq!(ctl(d, &["create-topic", "quiet", "1"])["ok"], true);

    // A bad file: the reload is refused, loudly, and the server goes on.
    std::fs::write(d.join("ringlog.toml"), "log_level = \"loud\"\n").unwrap();
    send(&child, libc::SIGHUP);
    let text = wait_for_lines(&log, "reload", 1);
    assert!(
        text.contains(" WARN ") && text.contains("`log_level`"),
        "{text}"
    );
    assert!(
        child.try_wait().unwrap().is_none(),
        "SIGHUP stopped the server"
    );

    // A good one: the new level applies; keys that need a restart are named.
    std::fs::write(
        d.join("ringlog.toml"),
        "log_level = \"info\"\nretention_ms = 5000\n",
    )
    .unwrap();
    send(&child, libc::SIGHUP);
    let text = wait_for_lines(&log, "reloaded", 1);
    assert!(text.contains("retention_ms"), "{text}");
    assert_eq!(ctl(d, &["create-topic", "loud", "1"])["ok"], true);
    assert_eq!(ctl(d, &["status"])["ok"], true);
    send(&child, libc::SIGTERM);
    assert_eq!(
        wait_bounded(&mut child, Duration::from_secs(30)).code(),
        Some(0)
    );
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!text.contains("topic created topic=quiet"), "{text}");
    assert!(text.contains("topic created topic=loud"), "{text}");
}

/// (config file, flags, environment, the origin the error must name).
type Case<'a> = (&'a str, &'a [&'a str], &'a [(&'a str, &'a str)], &'a str);

#[test]
fn an_invalid_log_level_stops_the_server_naming_the_key_and_the_valid_values() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let cases: [Case; 4] = [
        ("log_level = \"loud\"\n", &[], &[], "file "),
        (
            "",
            &[],
            &[("RINGLOG_LOG_LEVEL", "verbose")],
            "RINGLOG_LOG_LEVEL",
        ),
        (
            "",
            &["--set", "log_level=ringlog_shard=lots"],
            &[],
            "flag --log-level",
        ),
        ("", &["--set", "log_format=xml"], &[], "flag --log-format"),
    ];
    for (config, args, envs, origin) in cases {
        let (mut child, log, ready) = spawn(d, config, args, envs);
        let status = wait_bounded(&mut child, START_TIMEOUT);
        let text = std::fs::read_to_string(&log).unwrap();
        assert_eq!(ready, None, "{text}");
        assert_eq!(status.code(), Some(2), "{text}");
        assert!(text.contains(origin), "{origin}: {text}");
        if origin.contains("format") {
            assert!(
                text.contains("`log_format`") && text.contains("text") && text.contains("json"),
                "{text}"
            );
        } else {
            assert!(
                text.contains("`log_level`")
                    && text.contains("off, error, warn, info, debug, trace"),
                "{text}"
            );
        }
    }
    // A filter with targets is accepted.
    let (mut child, log, ready) = spawn(d, "log_level = \"warn,ringlog_shard=info\"\n", &[], &[]);
    assert!(
        ready.is_some(),
        "{}",
        std::fs::read_to_string(&log).unwrap()
    );
    send(&child, libc::SIGTERM);
    assert_eq!(
        wait_bounded(&mut child, Duration::from_secs(30)).code(),
        Some(0)
    );
}

#[test]
fn json_logs_are_one_object_per_line() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (mut child, log, ready) = spawn(d, "log_format = \"json\"\n", &[], &[]);
    assert!(
        ready.is_some(),
        "{}",
        std::fs::read_to_string(&log).unwrap()
    );
    assert_eq!(ctl(d, &["create-topic", "j", "1"])["ok"], true);
    send(&child, libc::SIGTERM);
    assert_eq!(
        wait_bounded(&mut child, Duration::from_secs(30)).code(),
        Some(0)
    );
    let mut text = String::new();
    std::fs::File::open(&log)
        .unwrap()
        .read_to_string(&mut text)
        .unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert!(lines.len() >= 3, "{text}");
    for l in &lines {
        assert!(l["timestamp"].is_string() && l["level"].is_string(), "{l}");
    }
    let audit: Vec<_> = lines.iter().filter(|l| l["target"] == "audit").collect();
    assert_eq!(audit.len(), 2, "{text}");
    assert_eq!(audit[0]["fields"]["cmd"], "create_topic", "{text}");
    assert_eq!(audit[0]["fields"]["what"], "topic=j partitions=1", "{text}");
    assert_eq!(audit[0]["fields"]["result"], "ok", "{text}");
    assert!(
        lines
            .iter()
            .any(|l| l["fields"]["message"] == "signal received; shutting down"),
        "{text}"
    );
}

// ---- consumer groups the server knows (issue 13 item 2) ----

/// Runs `ringlog ARGS` with `stdin`; returns (exit code, stdout, stderr).
fn ringlog(args: &[&str], stdin: &str) -> (Option<i32>, String, String) {
    let mut child = Command::new(BIN)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.as_bytes()).unwrap();
    drop(input);
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

fn ok(args: &[&str], stdin: &str) -> String {
    let (code, out, err) = ringlog(args, stdin);
    assert_eq!(code, Some(0), "{args:?}: {err}");
    out
}

/// (group, topic, partition, committed, end, lag, out_of_range) rows of
/// the server's `consumers` command.
fn consumers(server: &Server) -> Vec<(String, String, u64, u64, u64, u64, bool)> {
    let reply = server.ctl(&["raw", r#"{"cmd":"consumers"}"#]);
    assert_eq!(reply["ok"], true, "{reply}");
    reply["result"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["group"].as_str().unwrap().to_string(),
                r["topic"].as_str().unwrap().to_string(),
                r["partition"].as_u64().unwrap(),
                r["committed"].as_u64().unwrap(),
                r["end"].as_u64().unwrap(),
                r["lag"].as_u64().unwrap(),
                r["out_of_range"].as_bool().unwrap(),
            )
        })
        .collect()
}

fn metric_lines(server: &Server, name: &str) -> Vec<String> {
    let reply = server.ctl(&["metrics"]);
    let text = reply["result"]["text"].as_str().unwrap();
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .map(str::to_string)
        .collect()
}

#[test]
fn the_server_reports_each_groups_position_and_lag_also_as_a_metric() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("d"), &["--metrics-addr", "127.0.0.1:0"]);
    let a = server.addr.clone();
    let produce = |p: &str, lines: &str| {
        ok(&["produce", "t", "--addr", &a, "-p", p, "-q"], lines);
    };
    ok(&["produce", "t", "--addr", &a, "--create", "2"], "");
    produce("0", "a0\na1\na2\n");
    produce("1", "b0\nb1\n");
    let consume = |group: &str, extra: &[&str]| {
        let mut args = vec!["consume", "t", "--addr", &a, "-g", group];
        args.extend_from_slice(extra);
        ok(&args, "")
    };
    assert_eq!(consume("g1", &["-p", "0", "-c", "2"]), "a0\na1\n");
    assert_eq!(consume("g2", &[]), "a0\na1\na2\nb0\nb1\n");
    produce("1", "b2\nb3\nb4\n");
    let row = |g: &str, p: u64, c: u64, end: u64, lag: u64| {
        (g.to_string(), "t".to_string(), p, c, end, lag, false)
    };
    assert_eq!(
        consumers(&server),
        [
            row("g1", 0, 2, 3, 1),
            row("g2", 0, 3, 3, 0),
            row("g2", 1, 2, 5, 3)
        ]
    );
    assert_eq!(
        metric_lines(&server, "ringlog_consumer_lag"),
        [
            r#"ringlog_consumer_lag{group="g1",topic="t",partition="0"} 1"#,
            r#"ringlog_consumer_lag{group="g2",topic="t",partition="0"} 0"#,
            r#"ringlog_consumer_lag{group="g2",topic="t",partition="1"} 3"#,
        ]
    );
    // New commits are picked up by the same server (it reads only those).
    assert_eq!(consume("g1", &["-p", "0"]), "a2\n");
    assert_eq!(consume("g2", &["-p", "1"]), "b2\nb3\nb4\n");
    assert_eq!(
        consumers(&server),
        [
            row("g1", 0, 3, 3, 0),
            row("g2", 0, 3, 3, 0),
            row("g2", 1, 5, 5, 0)
        ]
    );
    assert_eq!(
        metric_lines(&server, "ringlog_consumer_committed_offset")[2],
        r#"ringlog_consumer_committed_offset{group="g2",topic="t",partition="1"} 5"#
    );
    // GET /metrics serves the same figures.
    let http = server
        .ready
        .split_whitespace()
        .find_map(|w| w.strip_prefix("metrics="))
        .unwrap_or_else(|| panic!("no metrics= in {:?}", server.ready));
    let mut conn = std::net::TcpStream::connect(http).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    conn.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut body = String::new();
    conn.read_to_string(&mut body).unwrap();
    let scraped: Vec<&str> = body
        .lines()
        .filter(|l| l.starts_with("ringlog_consumer_lag{"))
        .collect();
    assert_eq!(
        scraped,
        metric_lines(&server, "ringlog_consumer_lag"),
        "{body}"
    );
    assert_eq!(scraped.len(), 3, "{body}");
    // The table, one group.
    let table = ok(
        &[
            "ctl",
            "consumers",
            "g1",
            "--socket",
            server.control.to_str().unwrap(),
        ],
        "",
    );
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 2, "{table}");
    assert!(
        lines[0].starts_with("GROUP") && lines[0].contains("LAG"),
        "{table}"
    );
    assert!(
        lines[1].starts_with("g1") && lines[1].ends_with('-'),
        "{table}"
    );
}

#[test]
fn purged_or_past_the_end_commits_are_flagged_and_follow_the_reset_policy() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("d"), &[]);
    let a = server.addr.clone();
    let consume = |group: &str, extra: &[&str]| {
        let mut args = vec!["consume", "t", "--addr", &a, "-g", group, "-p", "0"];
        args.extend_from_slice(extra);
        ringlog(&args, "")
    };
    ok(
        &["produce", "t", "--addr", &a, "--create", "1", "-q"],
        "x0\nx1\nx2\nx3\n",
    );
    assert_eq!(consume("below", &["-c", "1"]).1, "x0\n");
    assert_eq!(consume("beyond", &[]).1, "x0\nx1\nx2\nx3\n");
    // Purge: "below" (1) is under the new start (4).
    assert_eq!(server.ctl(&["purge", "t"])["ok"], true);
    ok(&["produce", "t", "--addr", &a, "-q"], "x4\n");
    let rows = consumers(&server);
    assert_eq!(rows[0].0, "below");
    assert_eq!((rows[0].3, rows[0].4, rows[0].6), (1, 5, true));
    assert_eq!((rows[1].3, rows[1].4, rows[1].6), (4, 5, false));
    // Recreated: "beyond" (5 after reading x4) is past the new end (1).
    assert_eq!(consume("beyond", &[]).1, "x4\n");
    assert_eq!(server.ctl(&["delete-topic", "t"])["ok"], true);
    ok(
        &["produce", "t", "--addr", &a, "--create", "1", "-q"],
        "y0\n",
    );
    let rows = consumers(&server);
    assert_eq!((rows[1].3, rows[1].4, rows[1].6), (5, 1, true));
    let table = ok(
        &[
            "ctl",
            "consumers",
            "--socket",
            server.control.to_str().unwrap(),
        ],
        "",
    );
    assert!(table.contains("reset"), "{table}");

    let (code, out, err) = consume("beyond", &["--reset", "error"]);
    assert_eq!((code, out.as_str()), (Some(1), ""), "{err}");
    assert!(
        err.contains("committed offset 5 is outside the stored range 0..1"),
        "{err}"
    );
    assert_eq!(consume("beyond", &[]).1, "y0\n", "default: earliest");
    assert_eq!(consume("below", &["--reset", "latest"]).1, "");
    ok(&["produce", "t", "--addr", &a, "-q"], "y1\n");
    assert_eq!(consume("below", &[]).1, "y1\n");
    assert!(consumers(&server).iter().all(|r| !r.6));

    let help = ok(&["consume", "--help"], "");
    assert!(help.contains("[default: earliest]"), "{help}");
}
