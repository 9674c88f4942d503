//! Nothing on a shard thread blocks on the filesystem (issue 12 item 4):
//! the release server runs under strace while a scripted workload creates
//! topics, produces, fetches, rolls segments, runs retention, purges,
//! deletes a topic and scrapes metrics; every traced syscall is mapped to
//! its thread's name (`ringlog-shard-N`) and the test fails on
//! - any durability-blocking call (fsync, fdatasync, rename, unlink, rmdir)
//!   or touch of topics.json issued by a shard thread: those go through a
//!   ring or the meta-io thread;
//! - once the server is ready, any metadata call (open, mkdir, fallocate,
//!   stat, directory listing) by a shard thread: those are ring ops
//!   (`Op::Open`, `Op::Allocate`, `Op::FileSize`, `Op::Exists`,
//!   `Op::MakeDir`), and purge names the files it removes instead of
//!   listing. Startup recovery (journal, recycle pool listing) may still make
//!   them: it runs before the server takes requests, and they are printed.
//!   procfs reads (the allocator's one look at overcommit_memory) are not
//!   storage and are not counted.
//!
//! Still blocking, counted and printed, not forbidden: waits on the storage
//! ring by a blocking `IoBackend::submit` (roll: flush, table entry,
//! superblock; checkpoint superblock writes; partition create and close;
//! purge), including the metadata ops above when their caller waits. Rolls
//! rename a spare segment prepared in the background and appends find their
//! room reserved ahead, so those no longer wait for the open and fallocates.
//!
//! Skipped, with a message, only if strace is not installed (ci/install-deps
//! installs it).

mod common;

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{wait_bounded, BIN, START_TIMEOUT};
use ringlog_shard::client::{batch_of, Client};

/// Syscalls the trace records. `write`/`pwrite64` are left out: eventfd
/// wake-ups and log lines are writes too, and the shard does its data
/// writes on the ring.
const TRACED: &str = "trace=openat,open,creat,mkdir,mkdirat,rename,renameat,renameat2,\
                      unlink,unlinkat,rmdir,fsync,fdatasync,sync_file_range,fallocate,\
                      ftruncate,truncate,statx,newfstatat,getdents64,io_uring_enter";

/// Syscalls that wait for the device or change names durably: none may
/// come from a shard thread.
const FORBIDDEN: &[&str] = &[
    "fsync",
    "fdatasync",
    "sync_file_range",
    "rename",
    "renameat",
    "renameat2",
    "unlink",
    "unlinkat",
    "rmdir",
];

/// Metadata syscalls (opens, mkdir, fallocate, stat, listing): allowed on a
/// shard thread only during startup recovery, before the server is ready;
/// afterwards they go through the storage ring or a helper thread.
const FORBIDDEN_AFTER_STARTUP: &[&str] = &[
    "openat",
    "open",
    "creat",
    "mkdir",
    "mkdirat",
    "fallocate",
    "ftruncate",
    "truncate",
    "statx",
    "newfstatat",
    "getdents64",
];

fn strace_present() -> bool {
    Command::new("strace")
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The traced server: strace is the child, the server its only child.
struct Traced {
    strace: Option<Child>,
    /// When the ready line arrived (seconds since the epoch): calls traced
    /// before it belong to startup.
    ready_s: f64,
    server_pid: i32,
    addr: String,
    control: PathBuf,
    trace: PathBuf,
}

impl Traced {
    fn start(data_dir: &Path, trace: &Path, extra: &[&str]) -> Traced {
        let control = data_dir.join("ctl.sock");
        let mut strace = Command::new("strace")
            .args(["-f", "-qq", "-ttt", "-o"])
            .arg(trace)
            .args(["-e", TRACED])
            .arg(BIN)
            .arg("server")
            .arg("--data-dir")
            .arg(data_dir)
            .args(["--listen", "127.0.0.1:0", "--shards", "2"])
            .arg("--control-socket")
            .arg(&control)
            .args(extra)
            .env("RINGLOG_LOG_LEVEL", "warn")
            .env("XDG_RUNTIME_DIR", data_dir.parent().unwrap_or(data_dir))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn strace");
        let stdout = strace.stdout.take().expect("piped stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            if let Some(Ok(line)) = lines.next() {
                let _ = tx.send(line);
            }
            for _ in lines {}
        });
        let line = rx
            .recv_timeout(START_TIMEOUT)
            .unwrap_or_else(|_| panic!("traced server did not become ready"));
        let ready_s = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock after 1970")
            .as_secs_f64();
        let addr = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("client="))
            .unwrap_or_else(|| panic!("bad ready line {line:?}"))
            .to_string();
        let children = format!("/proc/{0}/task/{0}/children", strace.id());
        let server_pid = std::fs::read_to_string(&children)
            .unwrap_or_else(|e| panic!("{children}: {e}"))
            .split_whitespace()
            .next()
            .and_then(|p| p.parse().ok())
            .expect("strace has the server as child");
        Traced {
            strace: Some(strace),
            ready_s,
            server_pid,
            addr,
            control,
            trace: trace.into(),
        }
    }

    /// tid -> thread name, read while the server runs.
    fn thread_names(&self) -> HashMap<u32, String> {
        let dir = format!("/proc/{}/task", self.server_pid);
        std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{dir}: {e}"))
            .flatten()
            .filter_map(|t| {
                let tid = t.file_name().to_str()?.parse().ok()?;
                let comm = std::fs::read_to_string(t.path().join("comm")).ok()?;
                Some((tid, comm.trim().to_string()))
            })
            .collect()
    }

    fn ctl(&self, args: &[&str]) -> serde_json::Value {
        let out = Command::new(BIN)
            .arg("ctl")
            .arg("--socket")
            .arg(&self.control)
            .arg("--json")
            .args(args)
            .output()
            .expect("run ctl");
        let reply: serde_json::Value =
            serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("ctl {args:?}: {e}"));
        assert_eq!(reply["ok"], true, "ctl {args:?}: {reply}");
        reply
    }

    /// Stops the server through the control socket and waits for strace.
    fn stop(mut self) -> String {
        self.ctl(&["shutdown"]);
        let mut strace = self.strace.take().expect("running");
        let status = wait_bounded(&mut strace, Duration::from_secs(60));
        assert_eq!(status.code(), Some(0), "server exit under strace");
        std::fs::read_to_string(&self.trace).expect("trace file")
    }
}

impl Drop for Traced {
    fn drop(&mut self) {
        if let Some(mut s) = self.strace.take() {
            // Killing strace alone would detach the server and leave it
            // running: kill the server first.
            // SAFETY: kill(2) on the pid of our own grandchild.
            unsafe {
                libc::kill(self.server_pid, libc::SIGKILL);
            }
            let _ = s.kill();
            let _ = s.wait();
        }
    }
}

/// One traced call: thread id, start time (seconds since the epoch),
/// syscall name, the raw line.
struct Call<'a> {
    tid: u32,
    at_s: f64,
    name: &'a str,
    line: &'a str,
}

/// The calls of a `strace -f -ttt` trace (each counted at its start line; a
/// `<... resumed>` line is the end of one already counted).
fn calls(trace: &str) -> impl Iterator<Item = Call<'_>> {
    trace.lines().filter_map(|line| {
        let (tid, rest) = line.split_once(' ')?;
        let (at, rest) = rest.trim_start().split_once(' ')?;
        let rest = rest.trim_start();
        let name = &rest[..rest.find('(')?];
        let plain = name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        (plain && !name.is_empty()).then_some(Call {
            tid: tid.parse().ok()?,
            at_s: at.parse().ok()?,
            name,
            line,
        })
    })
}

/// Whether `call` is a blocking wait on the storage ring: an
/// io_uring_enter waiting for completions (min_complete > 0) without a
/// timeout argument. The monoio runtime's own waits, the shard's idle
/// point, always pass one (IORING_ENTER_EXT_ARG).
fn is_storage_wait(call: &Call<'_>) -> bool {
    if call.name != "io_uring_enter" {
        return false;
    }
    let args: Vec<&str> = call.line.splitn(5, ", ").collect();
    let waits = args
        .get(2)
        .is_some_and(|m| m.parse::<u32>().is_ok_and(|m| m > 0));
    let flags = args.get(3).copied().unwrap_or("");
    waits && flags.contains("IORING_ENTER_GETEVENTS") && !flags.contains("EXT_ARG")
}

fn retrying_produce(client: &mut Client, topic: &str, partition: u32, batch: &[u8]) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match client.produce(topic, partition, batch.to_vec()) {
            Ok(_) => return,
            Err(e) if e.is_retryable() && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => panic!("produce {topic}/{partition}: {e}"),
        }
    }
}

/// Creates, produces (rolling 1 MiB segments), fetches, waits for
/// retention, purges, deletes and scrapes.
fn workload(server: &Traced) {
    server.ctl(&["create-topic", "busy", "4"]);
    server.ctl(&["create-topic", "doomed", "2"]);
    let mut client = Client::connect(&server.addr).expect("connect");
    let value = vec![b'v'; 1000];
    let values: Vec<&[u8]> = (0..64).map(|_| value.as_slice()).collect();
    let batch = batch_of(&values).expect("batch");
    // 64 KiB batches: 6 MiB into partition 1 rolls several 1 MiB segments
    // and leaves retention (2 MiB) something to delete.
    for i in 0..96 {
        retrying_produce(&mut client, "busy", 1, &batch);
        retrying_produce(&mut client, "doomed", i % 2, &batch);
        if i == 8 {
            // Before retention can have trimmed anything.
            let got = client.fetch("busy", 1, 0, 1 << 20, 0).expect("fetch");
            assert!(!got.batches.is_empty(), "fetch returned nothing");
        }
    }
    // Retention runs every 100 ms: wait until it trimmed partition 1.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let parts = server.ctl(&["partitions", "busy"]);
        let start = parts["result"]
            .as_array()
            .and_then(|ps| ps.iter().find(|p| p["partition"] == 1))
            .and_then(|p| p["log_start_offset"].as_u64())
            .unwrap_or(0);
        if start > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "retention never ran: {parts}");
        std::thread::sleep(Duration::from_millis(100));
    }
    server.ctl(&["purge", "busy", "--partition", "1"]);
    server.ctl(&["delete-topic", "doomed"]);
    server.ctl(&["metrics"]);
    server.ctl(&["status"]);
}

#[test]
fn shard_threads_make_no_blocking_filesystem_call() {
    if !strace_present() {
        eprintln!("SKIPPED: strace is not installed (ci/install-deps installs it)");
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    let trace_path = tmp.path().join("trace.txt");
    let server = Traced::start(
        &data,
        &trace_path,
        &[
            "--segment-size-bytes",
            "1048576",
            "--retention-bytes",
            "2097152",
            "--set",
            "write_buffer_bytes=262144",
            "--set",
            "retention_check_ms=100",
            "--set",
            "pin_cores=false",
        ],
    );
    workload(&server);
    let names = server.thread_names();
    let ready_s = server.ready_s;
    let trace = server.stop();
    let shard_tids: Vec<u32> = names
        .iter()
        .filter(|(_, n)| n.starts_with("ringlog-shard-"))
        .map(|(t, _)| *t)
        .collect();
    assert_eq!(shard_tids.len(), 2, "threads: {names:?}");

    let mut bad = Vec::new();
    let mut startup: BTreeMap<&str, usize> = BTreeMap::new();
    let mut waits = 0;
    let mut traced_calls = 0;
    for call in calls(&trace) {
        traced_calls += 1;
        if !shard_tids.contains(&call.tid) {
            continue;
        }
        let after_startup = call.at_s >= ready_s;
        // procfs reads (the allocator reads /proc/sys/vm/overcommit_memory
        // once) never wait for a device.
        let metadata =
            FORBIDDEN_AFTER_STARTUP.contains(&call.name) && !call.line.contains("\"/proc/");
        if FORBIDDEN.contains(&call.name)
            || call.line.contains("topics.json")
            || (metadata && after_startup)
        {
            bad.push(format!("{}: {}", names[&call.tid], call.line));
        } else if metadata {
            *startup.entry(call.name).or_default() += 1;
        } else if is_storage_wait(&call) && after_startup {
            waits += 1;
        }
    }
    assert!(traced_calls > 0, "the trace recorded nothing");
    // Startup recovery opens the journal and the recycle pools (and lists
    // them) synchronously, before the server takes requests.
    eprintln!("metadata calls of startup recovery on the shard threads: {startup:?}");
    // Still blocking: a blocking `IoBackend::submit` waits in the ring for
    // its ops (rolls, checkpoints, partition create/close, purge).
    eprintln!("blocking storage ring waits on the shard threads after startup: {waits}");
    assert!(
        bad.is_empty(),
        "{} blocking filesystem calls on shard threads (metadata calls count \
         from the ready line on):\n{}",
        bad.len(),
        bad.join("\n")
    );
}

/// The parser: a call is counted at its start line, with its thread.
#[test]
fn the_trace_parser_counts_calls_at_their_start() {
    let trace = "12 1700000000.000100 fsync(3 <unfinished ...>\n\
                 13 1700000000.000200 openat(AT_FDCWD, \"/d/topics.json\", O_RDONLY) = 4\n\
                 12 1700000000.000300 <... fsync resumed>) = 0\n\
                 14 1700000000.000400 +++ exited with 0 +++\n";
    let got: Vec<(u32, f64, &str)> = calls(trace).map(|c| (c.tid, c.at_s, c.name)).collect();
    assert_eq!(
        got,
        [
            (12, 1700000000.0001, "fsync"),
            (13, 1700000000.0002, "openat")
        ]
    );
    let waits = "7 1.0 io_uring_enter(11, 2, 2, IORING_ENTER_GETEVENTS, NULL, 8) = 2\n\
                 7 1.0 io_uring_enter(11, 1, 0, IORING_ENTER_GETEVENTS, NULL, 8) = 1\n\
                 7 1.0 io_uring_enter(14, 0, 1, IORING_ENTER_GETEVENTS|IORING_ENTER_EXT_ARG, 0x7f, 24) = 0\n";
    let storage: Vec<bool> = calls(waits).map(|c| is_storage_wait(&c)).collect();
    assert_eq!(storage, [true, false, false]);
}
