//! Shared by the server-level tests in this directory.

use std::path::Path;
use std::time::Duration;

use ringlog_shard::config::ServerConfig;

/// A two-shard server on an ephemeral port with small segments and write
/// buffers, so a few appends roll segments and fill buffers.
pub fn config(data_dir: &Path) -> ServerConfig {
    ServerConfig {
        data_dir: data_dir.to_path_buf(),
        listen: "127.0.0.1:0".into(),
        shards: 2,
        pin_cores: false,
        control_socket: data_dir.join("ctl.sock"),
        segment_size_bytes: 32 * 1024,
        write_buffer_bytes: 8192,
        log_level: "warn".into(),
        ..ServerConfig::default()
    }
}

/// The sum of metric `name`'s series (every label set) in the server's
/// `ctl metrics` text. Not every test file that includes this module uses it.
#[allow(dead_code)]
pub fn counter(control: &Path, name: &str) -> u64 {
    let reply = ringlog_shard::control::client::request(
        control,
        &serde_json::json!({ "cmd": "metrics" }),
        Duration::from_secs(10),
    )
    .unwrap();
    let text = reply["result"]["text"].as_str().unwrap().to_string();
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum()
}
