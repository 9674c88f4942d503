//! Shared by the server-level tests in this directory.

use std::path::Path;

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
