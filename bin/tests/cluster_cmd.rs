//! `ringlog cluster up|down`: three local nodes from one command, a
//! replicated topic created on each by hand, produced to the primary and
//! consumed from a backup; `down` stops them (SIGKILL for one that does not
//! heed SIGTERM within its bound), and a second `down` is a no-op.

mod common;

use std::path::Path;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

use common::BIN;
use ringlog_shard::client::{batch_of, records, Client};

/// A base port whose derived client (B+1..B+3) and peer (B+101..B+103)
/// ports are free, below the ephemeral range; each call in this process
/// starts its search elsewhere, as the tests run side by side.
fn free_base() -> u16 {
    static CALLS: AtomicU16 = AtomicU16::new(0);
    let call = CALLS.fetch_add(1, Ordering::Relaxed);
    let salt = (std::process::id() % 25) as u16;
    (0..25u16)
        .map(|i| 25_000 + (salt + call * 7 + i) % 25 * 200)
        .find(|b| {
            (1..=3).all(|i| {
                std::net::TcpListener::bind(("127.0.0.1", b + i)).is_ok()
                    && std::net::TcpListener::bind(("127.0.0.1", b + 100 + i)).is_ok()
            })
        })
        .expect("a free port range")
}

fn cluster(args: &[&str], dir: &Path) -> Output {
    Command::new(BIN)
        .arg("cluster")
        .args(args)
        .arg("--dir")
        .arg(dir)
        .output()
        .unwrap()
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Stops the cluster in its dir when the test ends, passed or failed, so a
/// failure leaves no servers holding ports.
struct DownOnDrop<'a>(&'a Path);

impl Drop for DownOnDrop<'_> {
    fn drop(&mut self) {
        let _ = cluster(&["down"], self.0);
    }
}

fn pid_alive(pid: i32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    !stat.is_empty() && !stat.contains(") Z ")
}

#[test]
fn cluster_up_starts_three_nodes_that_replicate_and_down_stops_them_once() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("c");
    let base = free_base().to_string();
    let _down = DownOnDrop(&dir);
    let up = cluster(&["up", "--nodes", "3", "--base-port", &base], &dir);
    let said = text(&up);
    assert!(up.status.success(), "{said}");
    let addrs: Vec<String> = said
        .lines()
        .filter(|l| l.starts_with("node "))
        .filter_map(|l| l.split_whitespace().find_map(|w| w.strip_prefix("client=")))
        .map(str::to_string)
        .collect();
    assert_eq!(addrs.len(), 3, "{said}");
    assert!(
        said.contains("control=") && said.contains("ringlog ready"),
        "{said}"
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dir.join("cluster.secret"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    // A second `up` on the same dir is refused while it runs.
    let again = cluster(&["up", "--base-port", &base], &dir);
    assert!(!again.status.success());
    assert!(text(&again).contains("already runs"), "{}", text(&again));
    let pids_of = |dir: &Path| -> Vec<i32> {
        std::fs::read_to_string(dir.join("pids"))
            .unwrap()
            .lines()
            .map(|l| l.split_once(' ').unwrap().1.parse().unwrap())
            .collect()
    };
    // A node that died is started again by `up`; the others stay.
    let before = pids_of(&dir);
    // SAFETY: kill(2) on a server this test started.
    unsafe { libc::kill(before[1], libc::SIGKILL) };
    let deadline = Instant::now() + Duration::from_secs(10);
    while pid_alive(before[1]) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let restarted = cluster(&["up", "--base-port", &base], &dir);
    assert!(restarted.status.success(), "{}", text(&restarted));
    let after = pids_of(&dir);
    assert_eq!((after[0], after[2]), (before[0], before[2]));
    assert_ne!(after[1], before[1]);
    assert!(pid_alive(after[1]));

    // Created once, through node 2: the metadata group makes it node 1's.
    Client::connect(addrs[1].as_str())
        .unwrap()
        .create_topic("t", 1)
        .unwrap();
    let mut primary = Client::connect(addrs[0].as_str()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !primary
        .list_topics()
        .unwrap()
        .iter()
        .any(|t| t.topic == "t")
    {
        assert!(Instant::now() < deadline, "node 1 never listed topic t");
        std::thread::sleep(Duration::from_millis(50));
    }
    let values: Vec<&[u8]> = vec![b"one", b"two", b"three"];
    let acked = Client::connect(addrs[0].as_str())
        .unwrap()
        .produce("t", 0, batch_of(&values).unwrap())
        .unwrap();
    assert_eq!((acked.base_offset, acked.next_offset), (0, 3));
    // A backup serves it once it learned the commit.
    let mut backup = Client::connect(addrs[1].as_str()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let page = loop {
        let page = backup.fetch("t", 0, 0, 1 << 20, 0).unwrap();
        if page.high_watermark >= 3 || Instant::now() > deadline {
            break page;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let got: Vec<Vec<u8>> = records(&page.batches)
        .unwrap()
        .into_iter()
        .map(|r| r.value.to_vec())
        .collect();
    assert_eq!(got, [b"one".to_vec(), b"two".to_vec(), b"three".to_vec()]);

    let pids = pids_of(&dir);
    assert_eq!(pids.len(), 3);
    // Node 3 cannot heed SIGTERM while stopped: down kills it after its
    // bound.
    // SAFETY: kill(2) on a server this test started.
    unsafe { libc::kill(pids[2], libc::SIGSTOP) };
    let down = cluster(&["down"], &dir);
    let said = text(&down);
    assert!(down.status.success(), "{said}");
    assert!(
        said.contains("node 1") && said.contains("stopped"),
        "{said}"
    );
    assert!(
        said.contains("node 3") && said.contains("killed after"),
        "{said}"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while pids.iter().any(|&p| pid_alive(p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!pids.iter().any(|&p| pid_alive(p)), "all stopped");
    let again = cluster(&["down"], &dir);
    assert!(again.status.success());
    assert!(text(&again).contains("nothing to stop"), "{}", text(&again));
}

#[test]
fn up_names_a_port_another_process_holds_and_leaves_nothing_running() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("c");
    let base = free_base();
    let _down = DownOnDrop(&dir);
    let _squatter = std::net::TcpListener::bind(("127.0.0.1", base + 2)).unwrap();
    let started = Instant::now();
    let up = cluster(
        &["up", "--nodes", "3", "--base-port", &base.to_string()],
        &dir,
    );
    let said = text(&up);
    assert!(!up.status.success(), "{said}");
    assert!(
        said.contains("node 2") && said.contains(&format!("127.0.0.1:{}", base + 2)),
        "{said}"
    );
    assert!(said.contains("stayed in use"), "{said}");
    // Bounded: the port wait, not the ready wait.
    assert!(started.elapsed() < Duration::from_secs(40), "{said}");
    // Node 1 had started; a failed first `up` stops it again.
    assert!(!dir.join("pids").exists(), "{said}");
    let log = std::fs::read_to_string(dir.join("n1/server.out")).unwrap();
    assert!(log.contains("ringlog ready"), "node 1 had started: {log}");
}

#[test]
fn up_says_at_once_why_a_node_exited_before_its_ready_line() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("c");
    let base = free_base().to_string();
    let _down = DownOnDrop(&dir);
    // A file where the server wants its journal directory: it exits.
    std::fs::create_dir_all(dir.join("n1/data")).unwrap();
    std::fs::write(dir.join("n1/data/journal"), b"not a directory").unwrap();
    let started = Instant::now();
    let up = cluster(&["up", "--nodes", "1", "--base-port", &base], &dir);
    let said = text(&up);
    assert!(!up.status.success(), "{said}");
    assert!(said.contains("node 1 did not start: it exited"), "{said}");
    assert!(said.contains("journal"), "the server's own reason: {said}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "not the ready timeout: {said}"
    );
}

#[test]
fn up_refuses_an_even_node_count_and_starts_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("c");
    for nodes in ["2", "4", "8", "0"] {
        let up = cluster(&["up", "--nodes", nodes], &dir);
        let said = text(&up);
        assert!(!up.status.success(), "{said}");
        assert!(said.contains("must be odd"), "{said}");
    }
    assert!(!dir.exists(), "nothing created");
}
