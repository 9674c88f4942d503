//! `GET /metrics` over HTTP/1.x: the control socket's `metrics` text for
//! Prometheus. One accepting thread and one short-lived thread per
//! request, never a shard thread: a scrape asks each shard for its
//! partitions through its mailbox, as `ctl partitions` does.
//!
//! Bounds: at most [`CONNECTIONS_MAX`] requests in service at once (one
//! more is answered 503 and closed); a request head over
//! [`REQUEST_BYTES_MAX`] is answered 431; a head not complete within
//! [`REQUEST_TIMEOUT`] of the accept is answered 408 (a slow client holds
//! one slot for that long at most); each response write may stall for
//! [`WRITE_TIMEOUT`]. One request per connection (`Connection: close`).

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::{commands, ControlContext};

/// Requests in service at once (each holds a thread).
pub const CONNECTIONS_MAX: usize = 4;
/// Largest request head (request line and headers) read.
pub const REQUEST_BYTES_MAX: usize = 8 * 1024;
/// Time from accept to a complete request head.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest a response write may wait for the client to read.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the accepting thread looks at the stop flag.
const ACCEPT_POLL: Duration = Duration::from_millis(20);
/// Unread request bytes drained before closing, so that the client reads
/// our response rather than a reset.
const DRAIN_BYTES_MAX: usize = 256 * 1024;
const DRAIN_TIMEOUT: Duration = Duration::from_millis(200);

pub struct MetricsHttp {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsHttp {
    /// Binds `addr` and starts serving.
    pub fn start(addr: SocketAddr, ctx: Arc<ControlContext>) -> std::io::Result<MetricsHttp> {
        let listener = TcpListener::bind(addr)?;
        let addr = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("ringlog-metrics".into())
            .spawn(move || accept_loop(listener, ctx, stop2))?;
        Ok(MetricsHttp {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    /// The bound address (the port chosen for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting; requests in service finish on their own threads.
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn accept_loop(listener: TcpListener, ctx: Arc<ControlContext>, stop: Arc<AtomicBool>) {
    let open = Arc::new(AtomicUsize::new(0));
    while !stop.load(Ordering::SeqCst) {
        let stream = match listener.accept() {
            Ok((s, _)) => s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(ACCEPT_POLL);
                continue;
            }
            Err(e) => {
                tracing::warn!(error = %e, "metrics accept failed");
                std::thread::sleep(ACCEPT_POLL);
                continue;
            }
        };
        if stream.set_nonblocking(false).is_err() {
            continue;
        }
        if open.load(Ordering::SeqCst) >= CONNECTIONS_MAX {
            // Answered on this thread: a small response into an empty
            // socket buffer does not block; the write may stall 100 ms and
            // the drain DRAIN_TIMEOUT at most, so a refusal holds accepting
            // for 0.3 s at worst.
            let _ = stream.set_write_timeout(Some(Duration::from_millis(100)));
            respond_and_close(stream, &Response::text(503, "too many metrics requests\n"));
            continue;
        }
        open.fetch_add(1, Ordering::SeqCst);
        let (ctx, open2) = (ctx.clone(), open.clone());
        let spawned = std::thread::Builder::new()
            .name("ringlog-metrics-conn".into())
            .spawn(move || {
                serve(stream, &ctx);
                open2.fetch_sub(1, Ordering::SeqCst);
            });
        if spawned.is_err() {
            open.fetch_sub(1, Ordering::SeqCst);
            tracing::error!("could not start a metrics request thread");
        }
    }
}

fn serve(mut stream: TcpStream, ctx: &ControlContext) {
    let _ = stream.set_write_timeout(Some(WRITE_TIMEOUT));
    let deadline = Instant::now() + REQUEST_TIMEOUT;
    let response = match read_head(&mut stream, deadline) {
        Ok(head) => route(&head, || commands::metrics_text(ctx)),
        Err(HeadError::TooLarge) => Response::text(431, "request head over 8 KiB\n"),
        Err(HeadError::TimedOut) => Response::text(408, "request not complete in 5 s\n"),
        Err(HeadError::Closed) => return,
    };
    respond_and_close(stream, &response);
}

#[derive(Debug, PartialEq, Eq)]
enum HeadError {
    TooLarge,
    TimedOut,
    Closed,
}

/// Reads until the blank line ending the head, within `deadline` (one
/// deadline for the whole head: trickling bytes does not extend it) and
/// [`REQUEST_BYTES_MAX`].
fn read_head(stream: &mut impl ReadTimeout, deadline: Instant) -> Result<Vec<u8>, HeadError> {
    let mut head = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(HeadError::TimedOut);
        }
        stream.set_timeout(left).map_err(|_| HeadError::Closed)?;
        // Never more than one byte past the cap is held.
        let room = (REQUEST_BYTES_MAX + 1 - head.len()).min(chunk.len());
        let n = match stream.read(&mut chunk[..room]) {
            Ok(0) => return Err(HeadError::Closed),
            Ok(n) => n,
            Err(e) if is_timeout(&e) => return Err(HeadError::TimedOut),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return Err(HeadError::Closed),
        };
        // Look for the end from a little before the new bytes, since a
        // CRLFCRLF may straddle two reads.
        let from = head.len().saturating_sub(3);
        head.extend_from_slice(&chunk[..n]);
        if let Some(end) = find_head_end(&head[from..]) {
            if from + end > REQUEST_BYTES_MAX {
                return Err(HeadError::TooLarge);
            }
            head.truncate(from + end);
            return Ok(head);
        }
        if head.len() > REQUEST_BYTES_MAX {
            return Err(HeadError::TooLarge);
        }
    }
}

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

/// Where the head ends (just past its blank line), CRLF or bare LF.
fn find_head_end(bytes: &[u8]) -> Option<usize> {
    let crlf = bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| i + 4);
    let lf = bytes.windows(2).position(|w| w == b"\n\n").map(|i| i + 2);
    match (crlf, lf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// A stream whose read timeout can be set (a test double stands in for
/// TcpStream).
trait ReadTimeout: Read {
    fn set_timeout(&mut self, t: Duration) -> std::io::Result<()>;
}

impl ReadTimeout for TcpStream {
    fn set_timeout(&mut self, t: Duration) -> std::io::Result<()> {
        self.set_read_timeout(Some(t))
    }
}

struct Response {
    status: u16,
    content_type: &'static str,
    extra_headers: &'static str,
    body: String,
}

impl Response {
    fn text(status: u16, body: &str) -> Response {
        Response {
            status,
            content_type: "text/plain; charset=utf-8",
            extra_headers: "",
            body: body.into(),
        }
    }

    fn bytes(&self) -> Vec<u8> {
        let reason = match self.status {
            200 => "OK",
            400 => "Bad Request",
            404 => "Not Found",
            405 => "Method Not Allowed",
            408 => "Request Timeout",
            431 => "Request Header Fields Too Large",
            _ => "Service Unavailable",
        };
        let mut out = format!(
            "HTTP/1.1 {} {reason}\r\nContent-Type: {}\r\nContent-Length: {}\r\n{}Connection: close\r\n\r\n",
            self.status,
            self.content_type,
            self.body.len(),
            self.extra_headers,
        )
        .into_bytes();
        out.extend_from_slice(self.body.as_bytes());
        out
    }
}

/// Answers a complete request head; `render` makes the metrics text.
fn route(head: &[u8], render: impl FnOnce() -> String) -> Response {
    let Some(line) = std::str::from_utf8(head)
        .ok()
        .and_then(|h| h.lines().next())
    else {
        return Response::text(400, "request head is not UTF-8\n");
    };
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Response::text(400, "expected `GET /metrics HTTP/1.1`\n");
    };
    if !version.starts_with("HTTP/1.") || method.is_empty() || !target.starts_with('/') {
        return Response::text(400, "expected `GET /metrics HTTP/1.1`\n");
    }
    let path = target.split('?').next().unwrap_or(target);
    if path != "/metrics" {
        return Response::text(404, "only /metrics is served here\n");
    }
    if method != "GET" {
        return Response {
            extra_headers: "Allow: GET\r\n",
            ..Response::text(405, "only GET\n")
        };
    }
    Response {
        status: 200,
        content_type: crate::metrics::CONTENT_TYPE,
        extra_headers: "",
        body: render(),
    }
}

/// Writes `response`, ends our side, and drains (bounded) what the client
/// still sends, so that it sees the response and not a reset.
fn respond_and_close(mut stream: TcpStream, response: &Response) {
    if stream.write_all(&response.bytes()).is_err() {
        return;
    }
    let _ = stream.shutdown(Shutdown::Write);
    let _ = stream.set_read_timeout(Some(DRAIN_TIMEOUT));
    let mut drained = 0;
    let mut buf = [0u8; 4096];
    while drained < DRAIN_BYTES_MAX {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => drained += n,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hands out `chunks` one read at a time (a chunk larger than the
    /// read's buffer over several reads), then reports a timeout.
    struct Trickle {
        chunks: Vec<Vec<u8>>,
        timeouts: Vec<Duration>,
    }

    impl Read for Trickle {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            if self.chunks.is_empty() {
                return Err(std::io::ErrorKind::WouldBlock.into());
            }
            let c = &mut self.chunks[0];
            let n = c.len().min(buf.len());
            buf[..n].copy_from_slice(&c[..n]);
            c.drain(..n);
            if c.is_empty() {
                self.chunks.remove(0);
            }
            Ok(n)
        }
    }

    impl ReadTimeout for Trickle {
        fn set_timeout(&mut self, t: Duration) -> std::io::Result<()> {
            self.timeouts.push(t);
            Ok(())
        }
    }

    fn trickle(chunks: &[&[u8]]) -> Trickle {
        Trickle {
            chunks: chunks.iter().map(|c| c.to_vec()).collect(),
            timeouts: Vec::new(),
        }
    }

    #[test]
    fn a_head_split_anywhere_is_found_and_the_deadline_only_shrinks() {
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut t = trickle(&[b"GET /metrics HTTP/1.1\r\nHost: a\r", b"\n\r", b"\nbody"]);
        let head = read_head(&mut t, deadline).unwrap();
        assert_eq!(head, b"GET /metrics HTTP/1.1\r\nHost: a\r\n\r\n");
        assert!(
            t.timeouts.windows(2).all(|w| w[0] >= w[1]),
            "{:?}",
            t.timeouts
        );
        let mut t = trickle(&[b"GET /metrics HTTP/1.0\n\n"]);
        assert!(read_head(&mut t, deadline).is_ok());
        let mut t = trickle(&[b"GET /met"]);
        assert_eq!(read_head(&mut t, deadline), Err(HeadError::TimedOut));
        let past = Instant::now() - Duration::from_millis(1);
        let mut t = trickle(&[b"GET /metrics HTTP/1.1\r\n\r\n"]);
        assert_eq!(read_head(&mut t, past), Err(HeadError::TimedOut));
    }

    #[test]
    fn a_head_over_the_cap_is_refused_whatever_its_chunks() {
        let deadline = Instant::now() + Duration::from_secs(5);
        let big = vec![b'a'; 1000];
        let chunks: Vec<&[u8]> = (0..REQUEST_BYTES_MAX / 1000 + 2)
            .map(|_| &big[..])
            .collect();
        let mut t = trickle(&chunks);
        assert_eq!(read_head(&mut t, deadline), Err(HeadError::TooLarge));
        // Exactly at the cap, with its end: still served; one byte more
        // is refused, though its end arrives in the same read.
        let mut ok = vec![b'a'; REQUEST_BYTES_MAX - 4];
        ok.extend_from_slice(b"\r\n\r\n");
        let chunks: Vec<&[u8]> = ok.chunks(1000).collect();
        let mut t = trickle(&chunks);
        assert_eq!(
            read_head(&mut t, deadline).unwrap().len(),
            REQUEST_BYTES_MAX
        );
        ok.insert(0, b'a');
        let chunks: Vec<&[u8]> = ok.chunks(1000).collect();
        let mut t = trickle(&chunks);
        assert_eq!(read_head(&mut t, deadline), Err(HeadError::TooLarge));
    }

    #[test]
    fn routes_answer_by_method_and_path() {
        let text = || "m 1\n".to_string();
        let status = |h: &[u8]| route(h, text).status;
        assert_eq!(status(b"GET /metrics HTTP/1.1\r\n\r\n"), 200);
        assert_eq!(status(b"GET /metrics?name[]=x HTTP/1.0\r\n\r\n"), 200);
        assert_eq!(status(b"GET / HTTP/1.1\r\n\r\n"), 404);
        assert_eq!(status(b"HEAD /metrics HTTP/1.1\r\n\r\n"), 405);
        assert_eq!(status(b"GET /metrics\r\n\r\n"), 400);
        assert_eq!(status(b"GET /metrics SPDY/3\r\n\r\n"), 400);
        assert_eq!(status(b"GET  /metrics HTTP/1.1\r\n\r\n"), 400);
        assert_eq!(status(b"\xff\xfe\r\n\r\n"), 400);
        let r = route(b"GET /metrics HTTP/1.1\r\n\r\n", text);
        let bytes = String::from_utf8(r.bytes()).unwrap();
        assert!(bytes.starts_with("HTTP/1.1 200 OK\r\n"), "{bytes}");
        assert!(
            bytes.contains("Content-Type: text/plain; version=0.0.4"),
            "{bytes}"
        );
        assert!(
            bytes.ends_with("Content-Length: 4\r\nConnection: close\r\n\r\nm 1\n"),
            "{bytes}"
        );
    }
}
