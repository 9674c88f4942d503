//! Prometheus metrics on the real binary: `GET /metrics` over HTTP (text
//! format 0.0.4) parsed with a Prometheus text parser, the counters moved
//! by what a test did, the naming conventions walked over every family,
//! and the endpoint's bounds (slow and oversized requests, connection cap).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::*;
use prometheus_parse::{LineInfo, Scrape, Value};
use ringlog_shard::client::batch_of;

/// The endpoint's bounds (control/metrics_http.rs), as a client sees them.
const CONNECTIONS_MAX: usize = 4;
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

fn start(dir: &std::path::Path) -> (Server, String) {
    let server = Server::start(&dir.join("data"), &["--metrics-addr", "127.0.0.1:0"]);
    let addr = server
        .ready
        .split_whitespace()
        .find_map(|w| w.strip_prefix("metrics="))
        .unwrap_or_else(|| panic!("no metrics= in the ready line {:?}", server.ready))
        .to_string();
    (server, addr)
}

/// One HTTP exchange: sends `request` as is, returns (status, head, body).
fn http(addr: &str, request: &[u8]) -> (u16, String, String) {
    let mut s = TcpStream::connect(addr).expect("connect metrics");
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(request).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("read the response");
    split_response(&raw)
}

fn split_response(raw: &[u8]) -> (u16, String, String) {
    let text = String::from_utf8_lossy(raw).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no header end in {text:?}"));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    (status, head.to_string(), body.to_string())
}

fn scrape_text(addr: &str) -> String {
    let (status, head, body) = http(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(status, 200, "{head}\n{body}");
    let lower = head.to_ascii_lowercase();
    assert!(
        lower.contains("content-type: text/plain; version=0.0.4"),
        "{head}"
    );
    body
}

fn parse(text: &str) -> Scrape {
    Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).expect("parses")
}

/// Sum of a counter or gauge over its series whose labels include `want`.
fn total(scrape: &Scrape, name: &str, want: &[(&str, &str)]) -> f64 {
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == name)
        .filter(|s| want.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match s.value {
            Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => v,
            _ => panic!("{name} is not a scalar"),
        })
        .sum()
}

/// Observations of histogram `name`, summed over its series, and checks
/// every series' buckets are cumulative and end in +Inf = count.
fn histogram_count(scrape: &Scrape, name: &str) -> f64 {
    let mut count = 0.0;
    let mut series = 0;
    for s in scrape.samples.iter().filter(|s| s.metric == name) {
        let Value::Histogram(buckets) = &s.value else {
            panic!("{name} is not a histogram")
        };
        series += 1;
        for pair in buckets.windows(2) {
            assert!(pair[0].less_than < pair[1].less_than, "{name}: {buckets:?}");
            assert!(pair[0].count <= pair[1].count, "{name} not cumulative");
        }
        let last = buckets.last().expect("buckets");
        assert!(last.less_than.is_infinite(), "{name}: no +Inf bucket");
        let labels: Vec<(&str, &str)> = s
            .labels
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let c = total(scrape, &format!("{name}_count"), &labels);
        assert_eq!(last.count, c, "{name}: +Inf bucket is not the count");
        count += c;
    }
    assert!(series > 0, "no series of {name}");
    count
}

/// Walks every line: each family has HELP then TYPE before its samples,
/// each sample belongs to a declared family, and every name follows the
/// Prometheus conventions (base units, `_total` on counters only).
fn check_conventions(text: &str) {
    let mut helps = BTreeSet::new();
    let mut types: BTreeMap<String, String> = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').expect("HELP has text");
            assert!(!help.trim().is_empty(), "empty HELP for {name}");
            assert!(helps.insert(name.to_string()), "HELP {name} twice");
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, ty) = rest.split_once(' ').expect("TYPE has a type");
            assert!(helps.contains(name), "TYPE {name} without HELP first");
            assert!(
                types.insert(name.into(), ty.into()).is_none(),
                "TYPE {name} twice"
            );
            continue;
        }
        assert!(!line.starts_with('#'), "stray comment {line:?}");
        if line.is_empty() {
            continue;
        }
        let LineInfo::Sample { metric_name, .. } = LineInfo::parse(line) else {
            panic!("not a sample line: {line:?}")
        };
        let declared = types.iter().any(|(f, ty)| {
            metric_name == f.as_str()
                || (ty == "histogram"
                    && ["_bucket", "_sum", "_count"]
                        .iter()
                        .any(|s| metric_name == format!("{f}{s}")))
        });
        assert!(declared, "sample {metric_name} before/without its TYPE");
    }
    assert!(!types.is_empty());
    let name_ok = |n: &str| {
        n.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
            && (n.starts_with("ringlog_") || n.starts_with("process_"))
    };
    for (name, ty) in &types {
        assert!(
            name_ok(name),
            "{name}: not [a-z0-9_] or not ringlog_/process_"
        );
        assert!(helps.contains(name), "{name} has no HELP");
        assert!(
            ["counter", "gauge", "histogram"].contains(&ty.as_str()),
            "{name}: type {ty}"
        );
        assert_eq!(
            ty == "counter",
            name.ends_with("_total"),
            "{name} ({ty}): `_total` is for counters"
        );
        for bad in [
            "_us", "_ms", "_micro", "_milli", "_kb", "_mb", "_kib", "_mib", "_latency",
        ] {
            assert!(
                !name.contains(&format!("{bad}_")) && !name.ends_with(bad),
                "{name}: not a base unit ({bad}); use _seconds / _bytes"
            );
        }
        if name.contains("duration") || name.contains("_time_") || name.ends_with("_time") {
            assert!(name.contains("_seconds"), "{name}: a time is in seconds");
        }
    }
    for required in [
        "ringlog_build_info",
        "process_resident_memory_bytes",
        "process_cpu_seconds_total",
        "process_open_fds",
        "process_start_time_seconds",
        "ringlog_partition_size_bytes",
        "ringlog_partition_frontier_offset",
        "ringlog_partition_commit_offset",
        "ringlog_produce_duration_seconds",
        "ringlog_fetch_duration_seconds",
        "ringlog_consumer_lag",
    ] {
        assert!(types.contains_key(required), "no family {required}");
    }
}

fn produce_batches(server: &Server, topic: &str, partition: u32, batches: usize, per_batch: usize) {
    let mut c = server.client();
    for b in 0..batches {
        let values: Vec<Vec<u8>> = (0..per_batch)
            .map(|i| format!("b{b}-r{i}-payload").into_bytes())
            .collect();
        let refs: Vec<&[u8]> = values.iter().map(|v| v.as_slice()).collect();
        c.produce(topic, partition, batch_of(&refs).unwrap())
            .unwrap();
    }
}

#[test]
fn http_metrics_follow_conventions_and_move_with_produce_and_fetch() {
    let dir = tempfile::tempdir().unwrap();
    let (server, addr) = start(dir.path());
    server.client().create_topic("m", 2).unwrap();
    let before = parse(&scrape_text(&addr));
    let (batches, per_batch) = (7usize, 3usize);
    produce_batches(&server, "m", 1, batches, per_batch);
    let mut c = server.client();
    let fetches = 4;
    for _ in 0..fetches {
        let page = c.fetch("m", 1, 0, 1 << 20, 0).unwrap();
        assert_eq!(page.high_watermark, (batches * per_batch) as u64);
    }
    let text = scrape_text(&addr);
    check_conventions(&text);
    let after = parse(&text);

    let delta = |name: &str| total(&after, name, &[]) - total(&before, name, &[]);
    assert_eq!(delta("ringlog_appends_total"), batches as f64);
    assert_eq!(delta("ringlog_fetches_total"), fetches as f64);
    assert!(delta("ringlog_append_bytes_total") > 0.0);
    assert!(delta("ringlog_fsyncs_total") >= 1.0);
    let hist_delta = |name: &str| histogram_count(&after, name) - histogram_count(&before, name);
    assert_eq!(
        hist_delta("ringlog_produce_duration_seconds"),
        batches as f64
    );
    assert_eq!(hist_delta("ringlog_fetch_duration_seconds"), fetches as f64);
    assert!(hist_delta("ringlog_fsync_duration_seconds") >= 1.0);

    let p1 = [("topic", "m"), ("partition", "1")];
    let p0 = [("topic", "m"), ("partition", "0")];
    let records = (batches * per_batch) as f64;
    assert_eq!(
        total(&after, "ringlog_partition_frontier_offset", &p1),
        records
    );
    assert_eq!(
        total(&after, "ringlog_partition_commit_offset", &p1),
        records
    );
    assert_eq!(total(&after, "ringlog_partition_commit_offset", &p0), 0.0);
    assert!(total(&after, "ringlog_partition_size_bytes", &p1) > 0.0);
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(
        total(&after, "ringlog_build_info", &[("version", version)]),
        1.0
    );
    assert!(total(&after, "process_resident_memory_bytes", &[]) > 1e6);
    assert!(total(&after, "process_open_fds", &[]) > 3.0);
    let start = total(&after, "process_start_time_seconds", &[]);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(
        start > now - 600.0 && start <= now + 1.0,
        "start {start}, now {now}"
    );

    // A consumer group reads 5 records and commits (itself an append, so
    // after the deltas above): its committed offset and lag are metrics.
    let out = std::process::Command::new(BIN)
        .args([
            "consume",
            "m",
            "--addr",
            &server.addr,
            "-g",
            "g",
            "-p",
            "1",
            "-c",
            "5",
        ])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = scrape_text(&addr);
    check_conventions(&text);
    let lagged = parse(&text);
    let g = [("group", "g"), ("topic", "m"), ("partition", "1")];
    assert_eq!(total(&lagged, "ringlog_consumer_committed_offset", &g), 5.0);
    assert_eq!(total(&lagged, "ringlog_consumer_lag", &g), records - 5.0);

    // The control socket serves the same families.
    let v = server.ctl(&["metrics"]);
    let ctl_text = v["result"]["text"].as_str().unwrap();
    check_conventions(ctl_text);
    let names = |t: &str| -> BTreeSet<String> {
        t.lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .map(|l| l.split(' ').next().unwrap().to_string())
            .collect()
    };
    assert_eq!(names(ctl_text), names(&text));
}

#[test]
fn http_metrics_answers_only_get_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, addr) = start(dir.path());
    let (status, _, _) = http(&addr, b"GET /nope HTTP/1.1\r\n\r\n");
    assert_eq!(status, 404);
    let (status, head, _) = http(
        &addr,
        b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
    );
    assert_eq!(status, 405);
    assert!(head.to_ascii_lowercase().contains("allow: get"), "{head}");
    let (status, _, _) = http(&addr, b"garbage\r\n\r\n");
    assert_eq!(status, 400);
    let (status, _, _) = http(&addr, b"GET /metrics?x=1 HTTP/1.0\r\n\r\n");
    assert_eq!(status, 200);
}

#[test]
fn a_huge_request_gets_431_and_the_endpoint_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, addr) = start(dir.path());
    let mut req = b"GET /metrics HTTP/1.1\r\n".to_vec();
    for i in 0..2000 {
        req.extend_from_slice(format!("X-Filler-{i}: {}\r\n", "y".repeat(40)).as_bytes());
    }
    req.extend_from_slice(b"\r\n");
    assert!(req.len() > 64 * 1024);
    let (status, _, _) = http(&addr, &req);
    assert_eq!(status, 431);
    // A request line alone over the cap, never ended: 431 too.
    let (status, _, _) = http(&addr, &vec![b'G'; 20_000]);
    assert_eq!(status, 431);
    scrape_text(&addr);
}

/// Opens a connection that sends part of a request and stalls.
fn slowloris(addr: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(b"GET /metr").unwrap();
    s
}

#[test]
fn a_slow_client_does_not_stop_a_scrape_and_the_connection_cap_holds() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, addr) = start(dir.path());
    // One stalled client: a scrape beside it is answered at once.
    let mut slow = slowloris(&addr);
    let t = Instant::now();
    scrape_text(&addr);
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    // It is answered 408 and closed after the request timeout.
    slow.set_read_timeout(Some(REQUEST_TIMEOUT * 3)).unwrap();
    let mut raw = Vec::new();
    let _ = slow.read_to_end(&mut raw);
    let waited = t.elapsed();
    assert!(
        waited >= REQUEST_TIMEOUT - Duration::from_millis(500),
        "{waited:?}"
    );
    assert!(waited < REQUEST_TIMEOUT * 2, "{waited:?}");
    assert_eq!(split_response(&raw).0, 408);
    // Closing it ends the server's drain of it: its slot is free.
    drop(slow);
    std::thread::sleep(Duration::from_millis(300));

    // The cap: CONNECTIONS_MAX stalled clients, then one more is refused
    // with 503 at once; once the stalled ones time out, scrapes work.
    let stalled: Vec<TcpStream> = (0..CONNECTIONS_MAX).map(|_| slowloris(&addr)).collect();
    std::thread::sleep(Duration::from_millis(300));
    let mut extra = TcpStream::connect(&addr).unwrap();
    extra
        .set_read_timeout(Some(Duration::from_secs(3)))
        .unwrap();
    let mut raw = Vec::new();
    extra.read_to_end(&mut raw).expect("refused at once");
    assert_eq!(split_response(&raw).0, 503);
    drop(stalled);
    let deadline = Instant::now() + REQUEST_TIMEOUT * 2;
    loop {
        let (status, _, _) = http(&addr, b"GET /metrics HTTP/1.1\r\n\r\n");
        if status == 200 {
            break;
        }
        assert_eq!(status, 503);
        assert!(Instant::now() < deadline, "cap never freed");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn metrics_are_off_unless_configured() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &[]);
    assert!(!server.ready.contains("metrics="), "{}", server.ready);
    let v = server.ctl(&["config"]);
    let rows = v["result"].as_array().unwrap();
    let row = rows
        .iter()
        .find(|r| r["key"] == "metrics_addr")
        .expect("metrics_addr key");
    assert_eq!(row["value"], "");
}

/// Runs `ringlog server` with `extra` flags, expecting it to refuse to
/// start; returns (exit code, stderr).
fn refused_start(dir: &std::path::Path, extra: &[&str]) -> (Option<i32>, String) {
    let data = dir.join("data");
    let mut child = std::process::Command::new(BIN)
        .arg("server")
        .arg("--data-dir")
        .arg(&data)
        .args(["--listen", "127.0.0.1:0", "--shards", "1"])
        .arg("--control-socket")
        .arg(data.join("ctl.sock"))
        .args(extra)
        .env("XDG_RUNTIME_DIR", dir)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let status = wait_bounded(&mut child, Duration::from_secs(60));
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    (status.code(), err)
}

#[test]
fn a_bad_or_taken_metrics_address_stops_the_server_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let (code, err) = refused_start(dir.path(), &["--metrics-addr", "localhost"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("`metrics_addr`") && err.contains("flag --metrics-addr"),
        "{err}"
    );
    // Someone else listens there: the server does not start half-way.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let (code, err) = refused_start(dir.path(), &["--metrics-addr", &addr]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains(&format!("metrics address {addr}")), "{err}");
    assert!(
        !dir.path().join("data/ctl.sock").exists(),
        "control socket left behind"
    );
}

/// Produce batches of 1 MiB are read straight into buffers lent by the
/// owning shard's store pool; more in flight than its lending bound (2 per
/// shard here) go in heap buffers instead, and every batch arrives intact.
#[test]
fn produce_buffers_are_lent_up_to_their_bound_and_every_batch_arrives() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(
        &dir.path().join("data"),
        &[
            "--metrics-addr",
            "127.0.0.1:0",
            "--set",
            "produce_buffers_lent_max=2",
        ],
    );
    let addr = server
        .ready
        .split_whitespace()
        .find_map(|w| w.strip_prefix("metrics="))
        .expect("metrics address")
        .to_string();
    let mut c = server.client();
    c.create_topic("lend", 2).unwrap();
    let value = vec![0x5a_u8; 1000];
    let batch: Vec<u8> = {
        let refs: Vec<&[u8]> = (0..1000).map(|_| value.as_slice()).collect();
        batch_of(&refs).unwrap()
    };
    assert!(batch.len() > (1 << 20) - 64 * 1024, "{}", batch.len());
    // Four connections keep 16 batches each in flight, to both partitions:
    // whichever shard a connection landed on owns one of them.
    let rounds: u64 = 3;
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (mut c, batch) = (server.client(), batch.clone());
            std::thread::spawn(move || {
                for _ in 0..rounds {
                    for i in 0..16u32 {
                        c.send_produce("lend", i % 2, &batch).unwrap();
                    }
                    for _ in 0..16 {
                        c.recv_produced().unwrap();
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let s = parse(&scrape_text(&addr));
    let lent = total(&s, "ringlog_produce_buffers_lent_total", &[]);
    let refused = total(&s, "ringlog_produce_buffers_refused_total", &[]);
    assert!(lent > 0.0, "no batch went into a lent buffer");
    assert!(
        refused > 0.0,
        "the lending bound was never reached (lent {lent})"
    );
    // Every batch is stored, byte for byte, in request order per partition.
    let produced: u64 = 4 * rounds * 16 / 2;
    for p in 0..2 {
        let mut offset = 0;
        let mut batches = 0;
        while offset < produced * 1000 {
            let page = c.fetch("lend", p, offset, 4 << 20, 0).unwrap();
            let recs = ringlog_shard::client::records(&page.batches).unwrap();
            assert!(recs.iter().all(|r| r.value == value));
            batches += page.batches.len() / batch.len();
            offset = page.next_offset;
        }
        assert_eq!(offset, produced * 1000);
        assert_eq!(batches as u64, produced);
    }
}
