//! A TCP delay proxy on 127.0.0.1: every connection accepted is forwarded
//! to one upstream address, and every segment of bytes read in either
//! direction is queued with a release time (read at + delay) and written on
//! only once that time has passed. So the delay holds for every byte, one
//! way, not just on connect; a round trip through one proxy costs twice
//! the delay. With no delay one thread per direction copies straight on
//! (no queue): the gate is all it adds.
//!
//! Bounds: at most [`CONNECTIONS_MAX`] connections at once (more are closed
//! at once); per direction a queue of [`SEGMENTS_MAX`] segments of at most
//! [`SEGMENT_BYTES_MAX`] bytes (16 MiB, far above the bytes in flight at a
//! few ms and loopback speed), the reader blocking while it is full.
//!
//! A closed gate holds new connections (not yet connected upstream, their
//! bytes left in the kernel) until it opens, so the bench can boot a node
//! and measure it before any peer traffic reaches it.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Connections one proxy forwards at once.
pub const CONNECTIONS_MAX: usize = 16;
/// Segments queued per direction of a connection.
pub const SEGMENTS_MAX: usize = 64;
/// Largest segment one read takes.
pub const SEGMENT_BYTES_MAX: usize = 256 << 10;
/// How often a held connection and the acceptor look at the gate and stop.
const POLL: Duration = Duration::from_millis(2);

/// State shared with the proxy's threads.
struct Shared {
    upstream: SocketAddr,
    delay: Duration,
    open: AtomicBool,
    stopping: AtomicBool,
    connections: AtomicUsize,
}

/// A running proxy; dropping it stops accepting (running connections end
/// when either side closes).
pub struct DelayProxy {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

impl DelayProxy {
    /// Listens on 127.0.0.1 (a port the kernel picks) and forwards to
    /// `upstream`, holding each segment `delay`; the gate starts open.
    pub fn start(upstream: SocketAddr, delay: Duration) -> io::Result<DelayProxy> {
        let listener = TcpListener::bind(("127.0.0.1", 0))?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            upstream,
            delay,
            open: AtomicBool::new(true),
            stopping: AtomicBool::new(false),
            connections: AtomicUsize::new(0),
        });
        let s = Arc::clone(&shared);
        let acceptor = std::thread::Builder::new()
            .name("delay-proxy".into())
            .spawn(move || accept_loop(&listener, &s))?;
        Ok(DelayProxy {
            addr,
            shared,
            acceptor: Some(acceptor),
        })
    }

    /// Opens or closes the gate (see the module doc).
    pub fn set_open(&self, open: bool) {
        self.shared.open.store(open, Ordering::SeqCst);
    }

    /// Connections being forwarded or held now.
    #[cfg(test)]
    pub fn connections(&self) -> usize {
        self.shared.connections.load(Ordering::SeqCst)
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
    }
}

fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>) {
    while !shared.stopping.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((client, _)) => {
                if shared.connections.fetch_add(1, Ordering::SeqCst) >= CONNECTIONS_MAX {
                    shared.connections.fetch_sub(1, Ordering::SeqCst);
                    continue; // dropped: closed at once
                }
                let s = Arc::clone(shared);
                let spawned = std::thread::Builder::new()
                    .name("delay-proxy-conn".into())
                    .spawn(move || {
                        connection(client, &s);
                        s.connections.fetch_sub(1, Ordering::SeqCst);
                    });
                if spawned.is_err() {
                    shared.connections.fetch_sub(1, Ordering::SeqCst);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::sleep(POLL),
            Err(_) => std::thread::sleep(POLL),
        }
    }
}

/// Holds `client` while the gate is closed, then forwards both ways until
/// both directions ended.
fn connection(client: TcpStream, shared: &Shared) {
    while !shared.open.load(Ordering::SeqCst) {
        if shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        std::thread::sleep(POLL);
    }
    let Ok(upstream) = TcpStream::connect(shared.upstream) else {
        return; // the client sees its connection closed
    };
    let pairs = (|| Ok::<_, io::Error>((client.try_clone()?, upstream.try_clone()?)))();
    let Ok((client2, upstream2)) = pairs else {
        return;
    };
    for s in [&client, &upstream] {
        let _ = s.set_nodelay(true);
        let _ = s.set_nonblocking(false);
    }
    let delay = shared.delay;
    let back = std::thread::Builder::new()
        .name("delay-proxy-back".into())
        .spawn(move || pipe(upstream2, client2, delay));
    pipe(client, upstream, delay);
    if let Ok(b) = back {
        let _ = b.join();
    }
}

/// One direction: a reader queues timestamped segments, a writer releases
/// each at its time; at EOF or an error both sides of the direction close.
/// With no delay there is nothing to hold: one thread copies straight on
/// (no queue, no copy per segment, no hand-off between threads).
fn pipe(from: TcpStream, to: TcpStream, delay: Duration) {
    if delay.is_zero() {
        return forward(&from, to);
    }
    let (tx, rx) = sync_channel::<(Instant, Vec<u8>)>(SEGMENTS_MAX);
    let Ok(from_writer) = from.try_clone() else {
        return;
    };
    let Ok(writer) = std::thread::Builder::new()
        .name("delay-proxy-write".into())
        .spawn(move || release(&rx, to, &from_writer))
    else {
        return;
    };
    read_segments(&from, &tx, delay);
    drop(tx);
    // The writer drains what was queued, then closes its side.
    let _ = writer.join();
}

fn read_segments(mut from: &TcpStream, tx: &SyncSender<(Instant, Vec<u8>)>, delay: Duration) {
    let mut buf = vec![0u8; SEGMENT_BYTES_MAX];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        debug_assert!(n <= SEGMENT_BYTES_MAX);
        // Blocks while SEGMENTS_MAX segments wait: the bound.
        if tx
            .send((Instant::now() + delay, buf[..n].to_vec()))
            .is_err()
        {
            return; // the writer failed
        }
    }
}

/// Copies `from` to `to` through one buffer until EOF or an error; on a
/// write failure, also stops `from` (as [`release`]).
fn forward(mut from: &TcpStream, mut to: TcpStream) {
    let mut buf = vec![0u8; SEGMENT_BYTES_MAX];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if to.write_all(&buf[..n]).is_err() {
            let _ = to.shutdown(Shutdown::Both);
            let _ = from.shutdown(Shutdown::Both);
            return;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

/// Writes each segment at its release time; on a write failure, also
/// stops the reader (`from`), which would otherwise block on a live peer.
fn release(rx: &Receiver<(Instant, Vec<u8>)>, mut to: TcpStream, from: &TcpStream) {
    while let Ok((at, segment)) = rx.recv() {
        let now = Instant::now();
        if at > now {
            std::thread::sleep(at - now);
        }
        if to.write_all(&segment).is_err() {
            let _ = to.shutdown(Shutdown::Both);
            let _ = from.shutdown(Shutdown::Both);
            return;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server: one connection, echoes until EOF.
    fn echo() -> SocketAddr {
        let l = TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            for c in l.incoming() {
                let mut c = c.unwrap();
                std::thread::spawn(move || {
                    let mut r = c.try_clone().unwrap();
                    let _ = io::copy(&mut r, &mut c);
                });
            }
        });
        addr
    }

    /// Every round trip through the proxy costs at least twice the delay,
    /// not only the first (the delay holds per segment, both ways), and the
    /// bytes come back intact.
    #[test]
    fn every_round_trip_pays_the_delay_both_ways() {
        let delay = Duration::from_millis(15);
        let p = DelayProxy::start(echo(), delay).unwrap();
        let mut c = TcpStream::connect(p.addr).unwrap();
        c.set_nodelay(true).unwrap();
        for i in 0..5u8 {
            let t = Instant::now();
            let msg = [i; 1000];
            c.write_all(&msg).unwrap();
            let mut back = [0u8; 1000];
            c.read_exact(&mut back).unwrap();
            assert_eq!(back, msg);
            assert!(t.elapsed() >= 2 * delay, "trip {i}: {:?}", t.elapsed());
        }
    }

    /// A bulk stream larger than the queue's bound goes through whole
    /// (the reader blocks rather than dropping or growing).
    #[test]
    fn a_stream_beyond_the_queue_bound_arrives_whole() {
        for delay_ms in [1, 0] {
            stream_arrives_whole(Duration::from_millis(delay_ms));
        }
    }

    fn stream_arrives_whole(delay: Duration) {
        let p = DelayProxy::start(echo(), delay).unwrap();
        let c = TcpStream::connect(p.addr).unwrap();
        let total = 2 * SEGMENTS_MAX * SEGMENT_BYTES_MAX + 12_345;
        let mut w = c.try_clone().unwrap();
        let writer = std::thread::spawn(move || {
            let data: Vec<u8> = (0..total).map(|i| (i % 251) as u8).collect();
            w.write_all(&data).unwrap();
            w.shutdown(Shutdown::Write).unwrap();
        });
        let mut got = Vec::new();
        (&c).read_to_end(&mut got).unwrap();
        writer.join().unwrap();
        assert_eq!(got.len(), total, "delay {delay:?}");
        assert!(got.iter().enumerate().all(|(i, b)| *b == (i % 251) as u8));
    }

    /// A closed gate holds a connection's bytes until it opens; past
    /// CONNECTIONS_MAX, connections are closed at once.
    #[test]
    fn the_gate_holds_and_the_connection_bound_refuses() {
        let p = DelayProxy::start(echo(), Duration::ZERO).unwrap();
        p.set_open(false);
        let mut c = TcpStream::connect(p.addr).unwrap();
        c.write_all(b"held").unwrap();
        c.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let mut b = [0u8; 4];
        assert!(
            c.read_exact(&mut b).is_err(),
            "nothing passes a closed gate"
        );
        let mut extra: Vec<TcpStream> = Vec::new();
        while p.connections() < CONNECTIONS_MAX {
            extra.push(TcpStream::connect(p.addr).unwrap());
            std::thread::sleep(Duration::from_millis(5));
        }
        let mut over = TcpStream::connect(p.addr).unwrap();
        over.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let closed = match over.read(&mut b) {
            Ok(n) => n == 0,
            Err(e) => e.kind() == io::ErrorKind::ConnectionReset,
        };
        assert!(closed, "over the bound: closed at once");
        drop(extra);
        p.set_open(true);
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        c.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"held");
    }
}
