//! Booting against what is already there: the data dir's catalog, the
//! listen port, the data dir's filesystem.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use ringlog_shard::client::{batch_of, records};

/// Runs `ringlog server` expecting it to fail at boot; returns (exit code,
/// stderr).
fn start_fails(data_dir: &std::path::Path, extra: &[&str]) -> (Option<i32>, String) {
    let mut child = Command::new(BIN)
        .arg("server")
        .arg("--data-dir")
        .arg(data_dir)
        .arg("--control-socket")
        .arg(data_dir.join("ctl.sock"))
        .args(["--shards", "2"])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = wait_bounded(&mut child, START_TIMEOUT);
    let mut stderr = String::new();
    let mut stdout = String::new();
    use std::io::Read;
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    assert!(!stdout.contains("ready"), "server became ready: {stdout}");
    (status.code(), stderr)
}

fn produce_some(server: &Server, topic: &str) {
    let mut c = server.client();
    c.create_topic(topic, 3).unwrap();
    for p in 0..3 {
        c.produce(topic, p, batch_of(&[b"keep-me", b"and-me"]).unwrap())
            .unwrap();
    }
}

fn assert_data_kept(server: &Server, topic: &str) {
    let mut c = server.client();
    for p in 0..3 {
        let page = c.fetch(topic, p, 0, 1 << 16, 0).unwrap();
        let recs = records(&page.batches).unwrap();
        let values: Vec<&[u8]> = recs.iter().map(|r| r.value.as_slice()).collect();
        assert_eq!(values, [&b"keep-me"[..], &b"and-me"[..]], "{topic}/{p}");
    }
}

#[test]
fn missing_catalog_never_deletes_topics() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut server = Server::start(&data, &[]);
    produce_some(&server, "kept");
    produce_some(&server, "also");
    server.signal_and_wait(libc::SIGTERM, Duration::from_secs(30));
    std::fs::remove_file(data.join("topics.json")).unwrap();

    // Refuses, says how to proceed, deletes nothing.
    let (code, err) = start_fails(&data, &["--listen", "127.0.0.1:0"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("topics.json") && err.contains("--rebuild-catalog"),
        "{err}"
    );
    assert!(data.join("topics/kept/0").is_dir() && data.join("topics/also/2").is_dir());

    // Rebuilt from the partitions on disk: same topics, same data.
    let server = Server::start(&data, &["--rebuild-catalog"]);
    assert_data_kept(&server, "kept");
    assert_data_kept(&server, "also");
    let mut c = server.client();
    let mut topics: Vec<(String, u32)> = c
        .list_topics()
        .unwrap()
        .into_iter()
        .map(|t| (t.topic, t.partitions))
        .collect();
    topics.sort();
    assert_eq!(topics, [("also".to_string(), 3), ("kept".to_string(), 3)]);
    // New partitions get fresh ids, and the old ones keep working.
    c.create_topic("fresh", 2).unwrap();
    c.produce("kept", 1, batch_of(&[b"more"]).unwrap()).unwrap();
    c.produce("fresh", 1, batch_of(&[b"new"]).unwrap()).unwrap();
    let page = c.fetch("fresh", 1, 0, 1 << 16, 0).unwrap();
    assert_eq!(records(&page.batches).unwrap()[0].value, b"new");
}

#[test]
fn corrupt_catalog_refuses_to_start_and_deletes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut server = Server::start(&data, &[]);
    produce_some(&server, "kept");
    server.signal_and_wait(libc::SIGTERM, Duration::from_secs(30));
    std::fs::write(data.join("topics.json"), b"{\"format\": 1, \"topi").unwrap();
    let (code, err) = start_fails(&data, &["--listen", "127.0.0.1:0"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("topics.json") && err.contains("corrupt"),
        "{err}"
    );
    assert!(data.join("topics/kept/2").is_dir());
}

#[test]
fn second_process_on_the_same_port_fails_with_address_in_use() {
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let listen = format!("listen=\"127.0.0.1:{port}\"");
    let first = Server::start(&dir.path().join("a"), &["--set", &listen]);
    assert_eq!(first.addr, format!("127.0.0.1:{port}"));
    let (code, err) = start_fails(&dir.path().join("b"), &["--set", &listen]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.to_lowercase().contains("address in use"), "{err}");
    // The first server still answers every connection.
    for _ in 0..8 {
        let mut c = first.client();
        c.list_topics().unwrap();
    }
}

#[test]
fn a_memory_backed_data_dir_gets_a_loud_warning() {
    let shm = std::path::Path::new("/dev/shm");
    if !shm.is_dir() {
        eprintln!("no /dev/shm here; nothing to check");
        return;
    }
    let dir = tempfile::tempdir_in(shm).unwrap();
    let data = dir.path().join("data");
    // Kernels >= 6.6 give tmpfs O_DIRECT: the server starts and warns;
    // older ones refuse it, naming the dir and tmpfs.
    let mut child = Command::new(BIN)
        .arg("server")
        .arg("--data-dir")
        .arg(&data)
        .args(["--listen", "127.0.0.1:0", "--shards", "1"])
        .arg("--control-socket")
        .arg(data.join("ctl.sock"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    use std::io::BufRead;
    let _ = stdout.read_line(&mut line);
    // SAFETY: plain kill(2) on our own child.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    wait_bounded(&mut child, Duration::from_secs(30));
    let mut err = String::new();
    use std::io::Read;
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    if line.contains("ready") {
        assert!(
            err.contains("DATA IS NOT DURABLE") && err.contains("tmpfs"),
            "{err}"
        );
    } else {
        assert!(err.contains("O_DIRECT") && err.contains("tmpfs"), "{err}");
    }
}
