//! Control socket listener: one thread accepting, one thread per connection
//! (at most CONNECTIONS_MAX).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::{commands, ControlContext, CONNECTIONS_MAX, IDLE_TIMEOUT, LINE_BYTES_MAX};

pub struct ControlServer {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ControlServer {
    /// Binds `path` (replacing a stale socket file), private to the owner
    /// (0600) from the moment the name exists, and starts serving.
    pub fn start(path: &Path, ctx: Arc<ControlContext>) -> std::io::Result<ControlServer> {
        if path.exists() {
            if UnixStream::connect(path).is_ok() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::AddrInUse,
                    "another server answers on this control socket",
                ));
            }
            std::fs::remove_file(path)?;
        }
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent)?;
        }
        let listener = bind_private(path)?;
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("ringlog-control".into())
            .spawn(move || accept_loop(listener, ctx, stop2))?;
        Ok(ControlServer {
            path: path.into(),
            stop,
            thread: Some(thread),
        })
    }

    /// Stops accepting and removes the socket file.
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Binds a Unix socket at `path` that no other user can ever connect to: it
/// is bound inside a fresh 0700 directory next to `path`, set to 0600 there,
/// then renamed into place, so the name `path` only ever refers to a 0600
/// socket. (A umask around bind would be process-wide and race with shard
/// threads creating files.)
fn bind_private(path: &Path) -> std::io::Result<UnixListener> {
    use std::os::unix::fs::DirBuilderExt;
    let parent = match path.parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(p) => p.to_path_buf(),
        None => PathBuf::from("."),
    };
    let name = path.file_name().ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "socket path has no file name",
        )
    })?;
    let staging = parent.join(format!(
        ".{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id()
    ));
    // A leftover from a crashed start of the same pid cannot be trusted.
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::DirBuilder::new().mode(0o700).create(&staging)?;
    let inner = staging.join("sock");
    let bound = UnixListener::bind(&inner).and_then(|l| {
        std::fs::set_permissions(&inner, std::fs::Permissions::from_mode(0o600))?;
        std::fs::rename(&inner, path)?;
        Ok(l)
    });
    let cleanup = std::fs::remove_dir_all(&staging);
    let listener = bound?;
    cleanup?;
    Ok(listener)
}

fn accept_loop(listener: UnixListener, ctx: Arc<ControlContext>, stop: Arc<AtomicBool>) {
    let open = Arc::new(AtomicUsize::new(0));
    while !stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((stream, _)) => {
                let _ = stream.set_nonblocking(false);
                if open.load(Ordering::SeqCst) >= CONNECTIONS_MAX {
                    let mut s = stream;
                    let _ = writeln!(
                        s,
                        "{}",
                        serde_json::json!({"ok": false, "error": "too many control connections"})
                    );
                    continue;
                }
                open.fetch_add(1, Ordering::SeqCst);
                let (ctx, open, stop) = (ctx.clone(), open.clone(), stop.clone());
                let spawned = std::thread::Builder::new()
                    .name("ringlog-control-conn".into())
                    .spawn(move || {
                        serve(stream, &ctx, &stop);
                        open.fetch_sub(1, Ordering::SeqCst);
                    });
                if spawned.is_err() {
                    tracing::error!("could not start a control connection thread");
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => {
                tracing::warn!(error = %e, "control accept failed");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// Reads one line of at most LINE_BYTES_MAX; a longer line is consumed
/// through its newline and reported as `Err(len)`.
fn read_line(
    reader: &mut impl BufRead,
    line: &mut Vec<u8>,
) -> std::io::Result<Option<Result<(), usize>>> {
    line.clear();
    let mut skipped = 0usize;
    loop {
        let buf = reader.fill_buf()?;
        if buf.is_empty() {
            return Ok(if line.is_empty() && skipped == 0 {
                None
            } else if skipped > 0 {
                Some(Err(skipped))
            } else {
                Some(Ok(()))
            });
        }
        let (chunk, found) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (&buf[..i], Some(i + 1)),
            None => (buf, None),
        };
        if skipped == 0 && line.len() + chunk.len() <= LINE_BYTES_MAX {
            line.extend_from_slice(chunk);
        } else {
            skipped += line.len() + chunk.len();
            line.clear();
        }
        let consumed = found.unwrap_or(buf.len());
        reader.consume(consumed);
        if found.is_some() {
            return Ok(Some(if skipped > 0 { Err(skipped) } else { Ok(()) }));
        }
    }
}

/// The connected peer's credentials, for audit lines.
fn peer(stream: &UnixStream) -> String {
    use std::os::fd::AsRawFd;
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: SO_PEERCRED fills a ucred of `len` bytes on a live socket.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc == 0 {
        format!("uid={} pid={}", cred.uid, cred.pid)
    } else {
        format!("unknown ({})", std::io::Error::last_os_error())
    }
}

fn serve(stream: UnixStream, ctx: &ControlContext, stop: &AtomicBool) {
    let who = peer(&stream);
    let _ = stream.set_read_timeout(Some(IDLE_TIMEOUT));
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::with_capacity(64 * 1024, stream);
    let mut line = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        let reply = match read_line(&mut reader, &mut line) {
            Ok(None) | Err(_) => return,
            Ok(Some(Err(len))) => serde_json::json!({
                "ok": false,
                "error": format!("line of {len} bytes exceeds the limit of {LINE_BYTES_MAX} bytes"),
            }),
            Ok(Some(Ok(()))) => {
                if line.iter().all(|b| b.is_ascii_whitespace()) {
                    continue;
                }
                commands::execute(ctx, &line, &who)
            }
        };
        let mut text = reply.to_string();
        text.push('\n');
        if writer.write_all(text.as_bytes()).is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_is_private_whenever_its_name_exists() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ctl.sock");
        // A watcher stats the name as fast as it can while we bind: it
        // must never see the socket with any mode but 0600.
        let stop = Arc::new(AtomicBool::new(false));
        let (p2, s2) = (path.clone(), stop.clone());
        let watcher = std::thread::spawn(move || {
            let mut seen = Vec::new();
            while !s2.load(Ordering::SeqCst) {
                if let Ok(m) = std::fs::symlink_metadata(&p2) {
                    seen.push(m.permissions().mode() & 0o777);
                }
            }
            seen
        });
        for _ in 0..200 {
            let l = bind_private(&path).unwrap();
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
            assert!(UnixStream::connect(&path).is_ok(), "renamed socket answers");
            drop(l);
            std::fs::remove_file(&path).unwrap();
        }
        stop.store(true, Ordering::SeqCst);
        let seen = watcher.join().unwrap();
        assert!(seen.iter().all(|&m| m == 0o600), "modes seen: {seen:?}");
        // Nothing is left beside the socket.
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn long_lines_are_skipped_whole() {
        let mut input = Vec::new();
        input.extend_from_slice(b"{\"cmd\":\"a\"}\n");
        input.extend(std::iter::repeat_n(b'x', LINE_BYTES_MAX + 10));
        input.extend_from_slice(b"\n{\"cmd\":\"b\"}\nlast");
        let mut r = BufReader::with_capacity(4096, &input[..]);
        let mut line = Vec::new();
        assert_eq!(read_line(&mut r, &mut line).unwrap(), Some(Ok(())));
        assert_eq!(line, b"{\"cmd\":\"a\"}");
        assert_eq!(
            read_line(&mut r, &mut line).unwrap(),
            Some(Err(LINE_BYTES_MAX + 10))
        );
        assert_eq!(read_line(&mut r, &mut line).unwrap(), Some(Ok(())));
        assert_eq!(line, b"{\"cmd\":\"b\"}");
        assert_eq!(read_line(&mut r, &mut line).unwrap(), Some(Ok(())));
        assert_eq!(line, b"last");
        assert_eq!(read_line(&mut r, &mut line).unwrap(), None);
    }
}
