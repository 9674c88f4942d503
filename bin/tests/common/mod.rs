//! Test harness: start the real `ringlog` binary on 127.0.0.1 with a free
//! port and a temp data dir; kill it on drop. Every wait is bounded.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use ringlog_shard::client::{batch_of, records, Client, ClientError};

pub const BIN: &str = env!("CARGO_BIN_EXE_ringlog");
pub const START_TIMEOUT: Duration = Duration::from_secs(60);

pub struct Server {
    pub child: Option<Child>,
    pub addr: String,
    pub control: PathBuf,
    pub data_dir: PathBuf,
    pub stderr_path: PathBuf,
    /// The `ringlog ready ...` line the server printed.
    pub ready: String,
}

impl Server {
    /// Starts a server on `data_dir` with extra flags.
    pub fn start(data_dir: &Path, extra: &[&str]) -> Server {
        let control = data_dir.join("ctl.sock");
        let stderr_path = data_dir.with_extension(format!(
            "stderr.{}",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        let stderr = std::fs::File::create(&stderr_path).unwrap();
        let mut cmd = Command::new(BIN);
        cmd.arg("server")
            .arg("--data-dir")
            .arg(data_dir)
            .arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--control-socket")
            .arg(&control)
            .args(["--shards", "2"])
            .args(extra)
            // RINGLOG_TEST_LOG_LEVEL overrides it when debugging a test.
            .env(
                "RINGLOG_LOG_LEVEL",
                std::env::var("RINGLOG_TEST_LOG_LEVEL").unwrap_or_else(|_| "info".into()),
            )
            // The server records its socket for ctl there: keep test
            // servers out of the user's runtime directory.
            .env("XDG_RUNTIME_DIR", data_dir.parent().unwrap_or(data_dir))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr));
        let mut child = cmd.spawn().expect("spawn ringlog server");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            if let Some(Ok(line)) = lines.next() {
                let _ = tx.send(line);
            }
            for _ in lines {}
        });
        let line = match rx.recv_timeout(START_TIMEOUT) {
            Ok(l) => l,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "server did not become ready; stderr:\n{}",
                    std::fs::read_to_string(&stderr_path).unwrap_or_default()
                );
            }
        };
        let addr = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("client="))
            .unwrap_or_else(|| panic!("bad ready line {line:?}"))
            .to_string();
        Server {
            child: Some(child),
            addr,
            control,
            data_dir: data_dir.into(),
            stderr_path,
            ready: line,
        }
    }

    pub fn client(&self) -> Client {
        Client::connect(&self.addr).expect("connect")
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// Sends `sig` and waits (bounded) for the exit status.
    pub fn signal_and_wait(&mut self, sig: i32, timeout: Duration) -> ExitStatus {
        let mut child = self.child.take().expect("running");
        // SAFETY: plain kill(2) on our own child's pid.
        unsafe {
            libc::kill(child.id() as i32, sig);
        }
        wait_bounded(&mut child, timeout)
    }

    /// SIGKILL, no grace.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Runs `ringlog ctl --json` with `args`; returns the parsed reply.
    pub fn ctl(&self, args: &[&str]) -> serde_json::Value {
        let out = Command::new(BIN)
            .arg("ctl")
            .arg("--socket")
            .arg(&self.control)
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
}

pub fn wait_bounded(child: &mut Child, timeout: Duration) -> ExitStatus {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("process did not exit within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Acknowledged records: (topic, partition) -> offset -> value.
pub type Acked = BTreeMap<(String, u32), BTreeMap<u64, Vec<u8>>>;

/// The value of record `i` of producer `p`: unique and self-describing.
pub fn value(p: usize, batch: usize, i: usize, size: usize) -> Vec<u8> {
    let mut v = format!("p{p}-b{batch}-r{i}-").into_bytes();
    let fill = (p * 31 + batch * 7 + i) as u8;
    while v.len() < size {
        v.push(b'a' + fill % 26);
    }
    v
}

#[allow(clippy::too_many_arguments)]
/// Produces `batches` batches of `per_batch` records to each target in
/// turn, retrying retryable errors; records what was acknowledged. Returns
/// the number of retryable refusals seen. Stops early on other errors if
/// `tolerate_errors` (a server being killed), else panics.
pub fn produce_run(
    addr: &str,
    producer: usize,
    targets: &[(String, u32)],
    batches: usize,
    per_batch: usize,
    size: usize,
    acked: &std::sync::Mutex<Acked>,
    tolerate_errors: bool,
) -> u64 {
    let mut client = match Client::connect(addr) {
        Ok(c) => c,
        Err(e) if tolerate_errors => {
            eprintln!("producer {producer}: {e}");
            return 0;
        }
        Err(e) => panic!("connect: {e}"),
    };
    let mut refusals = 0;
    for b in 0..batches {
        let (topic, partition) = &targets[b % targets.len()];
        let values: Vec<Vec<u8>> = (0..per_batch)
            .map(|i| value(producer, b, i, size))
            .collect();
        let refs: Vec<&[u8]> = values.iter().map(|v| v.as_slice()).collect();
        let batch = batch_of(&refs).unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        let ack = loop {
            match client.produce(topic, *partition, batch.clone()) {
                Ok(a) => break Some(a),
                Err(e) if e.is_retryable() && Instant::now() < deadline => {
                    refusals += 1;
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(e) if tolerate_errors => {
                    let _ = e;
                    break None;
                }
                Err(e) => panic!("produce: {e}"),
            }
        };
        let Some(ack) = ack else { return refusals };
        assert_eq!(ack.partition, *partition);
        assert_eq!(ack.next_offset - ack.base_offset, per_batch as u64);
        let mut map = acked.lock().unwrap();
        let part = map.entry((topic.clone(), *partition)).or_default();
        for (i, v) in values.into_iter().enumerate() {
            let prev = part.insert(ack.base_offset + i as u64, v);
            assert!(
                prev.is_none(),
                "offset {} handed out twice",
                ack.base_offset + i as u64
            );
        }
    }
    refusals
}

/// Reads a whole partition: offset -> value, checking offsets are dense and
/// strictly increasing from the log start.
pub fn read_all(client: &mut Client, topic: &str, partition: u32) -> BTreeMap<u64, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut offset = 0;
    let mut expected_next: Option<u64> = None;
    loop {
        let page = client
            .fetch(topic, partition, offset, 1 << 20, 0)
            .unwrap_or_else(|e| panic!("fetch {topic}/{partition}@{offset}: {e}"));
        for r in records(&page.batches).unwrap() {
            if let Some(n) = expected_next {
                assert_eq!(r.offset, n, "offsets not dense in {topic}/{partition}");
            }
            expected_next = Some(r.offset + 1);
            assert!(out.insert(r.offset, r.value).is_none(), "duplicate offset");
        }
        if page.next_offset >= page.high_watermark {
            return out;
        }
        assert!(page.next_offset > offset, "fetch made no progress");
        offset = page.next_offset;
    }
}

/// Every acknowledged record is in the log at its assigned offset with the
/// same bytes. With `exact`, the log holds nothing else.
pub fn verify(client: &mut Client, acked: &Acked, exact: bool) {
    for ((topic, partition), want) in acked {
        let got = read_all(client, topic, *partition);
        for (offset, value) in want {
            match got.get(offset) {
                Some(v) => assert_eq!(v, value, "{topic}/{partition}@{offset} differs"),
                None => panic!("acknowledged {topic}/{partition}@{offset} is missing"),
            }
        }
        if exact {
            assert_eq!(got.len(), want.len(), "{topic}/{partition}: extra records");
        }
    }
}

pub fn create_topics(client: &mut Client, topics: &[(&str, u32)]) -> Vec<(String, u32)> {
    let mut targets = Vec::new();
    for (t, n) in topics {
        client.create_topic(t, *n).unwrap();
        for p in 0..*n {
            targets.push((t.to_string(), p));
        }
    }
    targets
}

/// Shards that own at least one of `topics`' partitions.
pub fn shards_used(client: &mut Client, topics: &[&str]) -> std::collections::BTreeSet<u16> {
    let mut s = std::collections::BTreeSet::new();
    for t in topics {
        for p in client.describe_topic(t).unwrap().partitions {
            s.insert(p.shard);
        }
    }
    s
}

pub fn is_retryable(e: &ClientError) -> bool {
    e.is_retryable()
}

pub fn write_all(stream: &mut std::net::TcpStream, bytes: &[u8]) {
    stream.write_all(bytes).unwrap();
}
