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
