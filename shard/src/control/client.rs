//! The `ringlog ctl` side: send one JSON line, read one JSON line.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum CtlError {
    #[error("control socket {path}: {source}")]
    Connect {
        path: String,
        source: std::io::Error,
    },
    #[error("control socket I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("server sent invalid JSON: {0}")]
    BadReply(String),
    #[error("server closed the connection without replying")]
    Closed,
}

/// Sends `request` and returns the server's reply object.
pub fn request(path: &Path, request: &Value, timeout: Duration) -> Result<Value, CtlError> {
    let stream = UnixStream::connect(path).map_err(|source| CtlError::Connect {
        path: path.display().to_string(),
        source,
    })?;
    stream.set_read_timeout(Some(timeout))?;
    let mut writer = stream.try_clone()?;
    let mut line = request.to_string();
    line.push('\n');
    writer.write_all(line.as_bytes())?;
    let mut reader = BufReader::new(stream);
    let mut reply = String::new();
    if reader.read_line(&mut reply)? == 0 {
        return Err(CtlError::Closed);
    }
    serde_json::from_str(&reply).map_err(|e| CtlError::BadReply(e.to_string()))
}
