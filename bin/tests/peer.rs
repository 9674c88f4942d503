//! Cluster config and the peer transport across real server processes.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::*;

/// Writes a secret file with `mode`.
fn secret(dir: &Path, name: &str, text: &str, mode: u32) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    path
}

/// Runs `ringlog server` expecting it to refuse its config; returns (exit
/// code, stderr).
fn refused(data_dir: &Path, extra: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(BIN)
        .arg("server")
        .arg("--data-dir")
        .arg(data_dir)
        .args(["--listen", "127.0.0.1:0", "--shards", "1"])
        .args(extra)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.contains("ready"), "server became ready: {stdout}");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn bad_cluster_flags_and_env_are_refused_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let good = secret(dir.path(), "good", &"s".repeat(40), 0o600);
    let open = secret(dir.path(), "open", &"s".repeat(40), 0o644);
    let data = dir.path().join("data");
    let good = good.to_str().unwrap();
    let open = open.to_str().unwrap();
    let base = ["--cluster-id", "blue", "--node-id", "1"];
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["--peer", "1=127.0.0.1:7601", "--peer", "1=127.0.0.1:7602"],
            "`peers`",
        ),
        (vec!["--peer", "2=127.0.0.1:7602"], "`node_id`"),
        (vec!["--peer", "1=nowhere:1"], "`peers`"),
        (
            vec!["--peer", "1=127.0.0.1:7601", "--cluster-secret-file", open],
            "chmod 600",
        ),
        (
            vec![
                "--peer",
                "1=127.0.0.1:7601",
                "--cluster-secret-file",
                "/nonexistent/s",
            ],
            "`cluster_secret_file`",
        ),
    ];
    for (extra, expect) in cases {
        let mut args: Vec<&str> = base.to_vec();
        args.extend(&extra);
        if !args.contains(&"--cluster-secret-file") {
            args.extend(["--cluster-secret-file", good]);
        }
        let (code, stderr) = refused(&data, &args);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(expect), "{args:?}: {stderr}");
    }
    // A cluster key without cluster_id is refused, not silently ignored.
    let (code, stderr) = refused(&data, &["--node-id", "3"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("`node_id`") && stderr.contains("cluster_id"),
        "{stderr}"
    );
}

/// A free port on 127.0.0.1 (bound, then released for the server).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Waits until `server`'s log has a line with every one of `words`.
fn logged(server: &Server, words: &[&str], limit: std::time::Duration) -> bool {
    let end = std::time::Instant::now() + limit;
    loop {
        let log = server.stderr();
        if log.lines().any(|l| words.iter().all(|w| l.contains(w))) {
            return true;
        }
        if std::time::Instant::now() > end {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Three real server processes: nodes 1 and 2 share the secret and
/// connect both ways; node 3 holds another secret and is refused by both
/// (and refuses them), never connected. SIGTERM stops a cluster node
/// cleanly.
#[test]
fn two_nodes_with_the_secret_connect_and_a_third_without_it_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let good = secret(dir.path(), "good", &"g".repeat(40), 0o600);
    let bad = secret(dir.path(), "bad", &"b".repeat(40), 0o600);
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let peers: Vec<String> = ports
        .iter()
        .enumerate()
        .map(|(i, p)| format!("{}=127.0.0.1:{p}", i + 1))
        .collect();
    let start = |id: usize, secret: &Path| {
        let data = dir.path().join(format!("n{id}"));
        std::fs::create_dir_all(&data).unwrap();
        let id_text = id.to_string();
        let mut args = vec![
            "--cluster-id",
            "test",
            "--node-id",
            &id_text,
            "--cluster-secret-file",
            secret.to_str().unwrap(),
        ];
        for p in &peers {
            args.extend(["--peer", p.as_str()]);
        }
        Server::start(&data, &args)
    };
    let mut n1 = start(1, &good);
    let n2 = start(2, &good);
    let n3 = start(3, &bad);
    let limit = std::time::Duration::from_secs(20);
    for (server, to) in [(&n1, "to=2"), (&n2, "to=1")] {
        assert!(
            logged(server, &["peer connected", to], limit),
            "{}",
            server.stderr()
        );
        assert!(logged(server, &["peer session accepted"], limit));
    }
    // Node 3's proofs fail at 1 and 2; theirs fail at 3.
    for server in [&n1, &n2, &n3] {
        assert!(
            logged(server, &["authentication failed"], limit),
            "{}",
            server.stderr()
        );
    }
    for server in [&n1, &n2] {
        let log = server.stderr();
        assert!(
            !log.lines()
                .any(|l| l.contains("peer connected") && l.contains("to=3")),
            "{log}"
        );
    }
    assert!(!n3.stderr().contains("peer connected"), "{}", n3.stderr());
    assert!(!n3.stderr().contains("peer session accepted"));
    let status = n1.signal_and_wait(libc::SIGTERM, std::time::Duration::from_secs(30));
    assert!(status.success(), "{status:?}: {}", n1.stderr());
    assert!(
        n1.stderr().contains("peer listener stopped"),
        "{}",
        n1.stderr()
    );
}
