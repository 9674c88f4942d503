//! The transport over real loopback sockets: nodes on one monoio runtime,
//! hostile clients as blocking std sockets on a helper thread.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ringlog_protocol::wire::FRAME_HEADER_LEN;

use super::hello::{self, Hello, Kind, Role};
use super::*;
use crate::config::{ClusterConfig, ClusterSecret};

const SECRET: &[u8] = b"the cluster secret: 32 bytes or more";

type Got = Arc<Mutex<Vec<(NodeId, u32, Vec<u8>)>>>;

struct Recorder(Got);

impl PeerSink for Recorder {
    fn deliver(&self, from: NodeId, frame: PeerFrame) {
        let mut got = self.0.lock().unwrap();
        got.push((from, frame.partition_id, frame.payload().to_vec()));
    }
}

fn listener() -> std::net::TcpListener {
    crate::net::bind_shared("127.0.0.1:0".parse().unwrap(), 1)
        .unwrap()
        .remove(0)
}

fn limits() -> PeerLimits {
    PeerLimits {
        hello_timeout: Duration::from_millis(1000),
        heartbeat_interval: Duration::from_millis(50),
        reconnect_min: Duration::from_millis(10),
        reconnect_max: Duration::from_millis(80),
        ..PeerLimits::new(1 << 20)
    }
}

/// Node `id` of a cluster "blue" whose members are `peers`.
fn node(
    id: NodeId,
    peers: &BTreeMap<NodeId, SocketAddr>,
    listener: std::net::TcpListener,
    limits: PeerLimits,
) -> (PeerSetup, Got) {
    let got = Got::default();
    let setup = PeerSetup {
        cluster: ClusterConfig {
            cluster_id: "blue".into(),
            node_id: id,
            peers: peers.clone(),
            listen: peers[&id],
            secret: ClusterSecret::from_bytes(SECRET),
            advertise: None,
        },
        listener,
        limits,
        shard_count: 2,
        incarnation: new_incarnation().unwrap(),
        client_addr: Some(SocketAddr::from(([127, 0, 0, 1], 7000 + id as u16))),
        sink: Box::new(Recorder(got.clone())),
        stats: Arc::new(PeerStats::for_nodes(
            peers.keys().copied().filter(|&n| n != id),
        )),
    };
    (setup, got)
}

fn runtime() -> monoio::Runtime<monoio::time::TimeDriver<monoio::IoUringDriver>> {
    monoio::RuntimeBuilder::<monoio::IoUringDriver>::new()
        .enable_timer()
        .build()
        .unwrap()
}

/// Waits (on the runtime) until `f` holds; false after `limit`.
async fn until(limit: Duration, f: impl Fn() -> bool) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if f() {
            return true;
        }
        monoio::time::sleep(Duration::from_millis(5)).await;
    }
    f()
}

/// Runs `client` on a thread while the runtime keeps serving; returns its
/// result.
async fn beside<T: Send + 'static>(client: impl FnOnce() -> T + Send + 'static) -> T {
    let t = std::thread::spawn(client);
    while !t.is_finished() {
        monoio::time::sleep(Duration::from_millis(5)).await;
    }
    t.join().unwrap()
}

fn get(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

fn kind(name: &str) -> usize {
    REFUSAL_NAMES.iter().position(|n| *n == name).unwrap()
}

/// Blocking frame read of a raw client; None at EOF, reset or timeout.
fn raw_frame(s: &mut TcpStream) -> Option<Vec<u8>> {
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut head = [0u8; FRAME_HEADER_LEN];
    s.read_exact(&mut head).ok()?;
    let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).ok()?;
    Some(body)
}

/// Whether the server closed `s` (EOF or reset) within `limit`, after
/// any frames it sent first.
fn closed_within(s: &mut TcpStream, limit: Duration) -> bool {
    s.set_read_timeout(Some(limit)).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) => return e.kind() == std::io::ErrorKind::ConnectionReset,
        }
    }
}

fn hello_from(node: NodeId, to: NodeId) -> Hello {
    Hello {
        version: PEER_PROTOCOL_VERSION,
        cluster_id: "blue".into(),
        node_id: node,
        to_node_id: to,
        shard_count: 1,
        incarnation: 5,
        client_addr: None,
        nonce: [3; hello::NONCE_BYTES],
    }
}

/// The refusal code a raw client got for sending `hello`, if any.
fn refusal_for(addr: SocketAddr, hello: &Hello) -> Option<u8> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(&hello::hello_frame(hello)).unwrap();
    let body = raw_frame(&mut s)?;
    match Hello::decode_challenge(&body) {
        Err(Refusal::ByPeer { code, .. }) => Some(code),
        _ => None,
    }
}

/// A raw client's whole session as node 1 holding `secret`: Hello, the
/// proof over the acceptor's challenge, then one message frame. Returns
/// every byte it sent, and whether it was welcomed.
fn raw_session(addr: SocketAddr, secret: &[u8]) -> (Vec<u8>, bool) {
    let mut s = TcpStream::connect(addr).unwrap();
    let mine = hello_from(1, 2);
    let mut sent = hello::hello_frame(&mine);
    s.write_all(&sent).unwrap();
    let body = raw_frame(&mut s).expect("a challenge");
    let (_, fields, _) = Hello::decode_challenge(&body).unwrap();
    let key = ClusterSecret::from_bytes(secret);
    let proof = hello::proof(&key, Role::Initiator, &mine.body(Kind::Hello), fields);
    let rest = [
        hello::proof_frame(&proof),
        codec::encode_message(7, b"injected"),
    ]
    .concat();
    s.write_all(&rest).unwrap();
    sent.extend_from_slice(&rest);
    let welcomed = raw_frame(&mut s).is_some_and(|b| hello::decode_welcome(&b).is_ok());
    (sent, welcomed)
}

#[test]
fn two_nodes_authenticate_and_deliver_both_ways() {
    let (la, lb) = (listener(), listener());
    let peers: BTreeMap<_, _> =
        [(1, la.local_addr().unwrap()), (2, lb.local_addr().unwrap())].into();
    let (sa, got_a) = node(1, &peers, la, limits());
    let (sb, got_b) = node(2, &peers, lb, limits());
    runtime().block_on(async move {
        let a = start(sa).unwrap();
        let b = start(sb).unwrap();
        assert!(
            until(Duration::from_secs(5), || a.is_connected(2)
                && b.is_connected(1))
            .await
        );
        a.send(2, 7, b"to b").unwrap();
        b.send(1, 8, b"to a").unwrap();
        assert!(
            until(Duration::from_secs(5), || got_a.lock().unwrap().len() == 1
                && got_b.lock().unwrap().len() == 1)
            .await
        );
        assert_eq!(got_b.lock().unwrap()[0], (1, 7, b"to b".to_vec()));
        assert_eq!(got_a.lock().unwrap()[0], (2, 8, b"to a".to_vec()));
        assert_eq!(a.send(9, 1, b""), Err(SendError::UnknownPeer(9)));
        let big = vec![0u8; 1 << 20];
        assert!(matches!(
            a.send(2, 1, &big),
            Err(SendError::TooLarge { .. })
        ));
        for s in [a.stats(), b.stats()] {
            assert_eq!(get(&s.sessions_accepted_total), 1);
            assert_eq!(get(&s.sessions_connected_total), 1);
            assert!(s.refused_total.iter().all(|c| get(c) == 0));
        }
        // Each learned the other's client address from its Hello.
        assert_eq!(
            a.stats().client_addr(2),
            Some("127.0.0.1:7002".parse().unwrap())
        );
        assert_eq!(
            b.stats().client_addr(1),
            Some("127.0.0.1:7001".parse().unwrap())
        );
        assert_eq!(a.stats().client_addr(9), None);
        // Stop ends every task: listener, connector, sessions.
        a.shutdown().await;
        b.shutdown().await;
        assert_eq!((a.tasks_running(), b.tasks_running()), (0, 0));
    });
}

/// Without the secret nothing gets through: a frame sent without a
/// handshake, after a wrong proof, or in a replay of a recorded session
/// (the acceptor's nonce is fresh) is never delivered.
#[test]
fn no_frame_without_the_secret_and_no_replay() {
    let lb = listener();
    let addr = lb.local_addr().unwrap();
    let peers: BTreeMap<_, _> = [(1, "127.0.0.1:1".parse().unwrap()), (2, addr)].into();
    let (sb, got) = node(2, &peers, lb, limits());
    runtime().block_on(async move {
        let b = start(sb).unwrap();
        let stats = b.stats().clone();
        let (replay, welcomed_wrong) = beside(move || {
            // A valid frame with no handshake at all.
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(&codec::encode_message(7, b"injected")).unwrap();
            assert!(closed_within(&mut s, Duration::from_secs(5)));
            // A proof under the wrong secret, then a frame.
            let (_, welcomed_wrong) = raw_session(addr, b"not the cluster secret, 32 bytes+");
            // A zero proof (no secret at all), then a frame.
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(&hello::hello_frame(&hello_from(1, 2))).unwrap();
            raw_frame(&mut s).unwrap();
            let rest = [hello::proof_frame(&[0; 32]), codec::encode_message(7, b"x")].concat();
            s.write_all(&rest).unwrap();
            assert!(closed_within(&mut s, Duration::from_secs(5)));
            // A real session, recorded...
            let (recorded, welcomed) = raw_session(addr, SECRET);
            assert!(welcomed);
            (recorded, welcomed_wrong)
        })
        .await;
        assert!(!welcomed_wrong);
        assert!(until(Duration::from_secs(5), || got.lock().unwrap().len() == 1).await);
        assert_eq!(got.lock().unwrap()[0], (1, 7, b"injected".to_vec()));
        // ...and replayed byte for byte.
        beside(move || {
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(&replay).unwrap();
            let body = raw_frame(&mut s).unwrap();
            assert!(Hello::decode_challenge(&body).is_ok());
            let refused = raw_frame(&mut s).map(|b| hello::decode_welcome(&b));
            assert!(
                matches!(refused, Some(Err(Refusal::ByPeer { code: 5, .. }))),
                "{refused:?}"
            );
            assert!(closed_within(&mut s, Duration::from_secs(5)));
        })
        .await;
        monoio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(
            got.lock().unwrap().len(),
            1,
            "nothing delivered but the real session's frame"
        );
        assert_eq!(get(&stats.frames_delivered_total), 1);
        assert_eq!(stats.refused(kind("bad_proof")), 3);
        assert_eq!(stats.refused(kind("malformed")), 1);
        b.stop();
    });
}

#[test]
fn another_cluster_unknown_or_duplicate_ids_and_versions_are_refused() {
    let lb = listener();
    let addr = lb.local_addr().unwrap();
    let peers: BTreeMap<_, _> = [(1, "127.0.0.1:1".parse().unwrap()), (2, addr)].into();
    let (sb, got) = node(2, &peers, lb, limits());
    runtime().block_on(async move {
        let b = start(sb).unwrap();
        let stats = b.stats().clone();
        let codes = beside(move || {
            let red = Hello {
                cluster_id: "red".into(),
                ..hello_from(1, 2)
            };
            // A node of the release before the client address.
            let v1 = Hello {
                version: 1,
                ..hello_from(1, 2)
            };
            [
                red,
                hello_from(9, 2),
                hello_from(2, 2),
                hello_from(1, 3),
                v1,
            ]
            .iter()
            .map(|h| refusal_for(addr, h))
            .collect::<Vec<_>>()
        })
        .await;
        let names = [
            "cluster",
            "unknown_node",
            "duplicate_node",
            "wrong_node",
            "version",
        ];
        let want: Vec<Option<u8>> = names.iter().map(|n| Some(kind(n) as u8)).collect();
        assert_eq!(codes, want);
        for n in names {
            assert_eq!(stats.refused(kind(n)), 1, "{n}");
        }
        assert!(got.lock().unwrap().is_empty());
        b.stop();
    });
}

/// Mutual: an acceptor without the secret cannot make a node send it a
/// frame.
#[test]
fn a_fake_acceptor_without_the_secret_receives_no_frame() {
    let fake = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let la = listener();
    let peers: BTreeMap<_, _> = [
        (1, la.local_addr().unwrap()),
        (2, fake.local_addr().unwrap()),
    ]
    .into();
    let (sa, _) = node(1, &peers, la, limits());
    runtime().block_on(async move {
        let a = start(sa).unwrap();
        a.send(2, 7, b"secret payload").unwrap();
        let stats = a.stats().clone();
        let heard = beside(move || {
            let (mut s, _) = fake.accept().unwrap();
            let body = raw_frame(&mut s).unwrap();
            let theirs = Hello::decode_hello(&body).unwrap();
            let fields = hello_from(2, theirs.node_id).body(Kind::Challenge);
            s.write_all(&hello::challenge(&fields, &[9; 32])).unwrap();
            let mut rest = Vec::new();
            s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            let _ = s.read_to_end(&mut rest);
            rest
        })
        .await;
        let refuse = Refusal::BadProof.encode();
        assert_eq!(heard, refuse, "only the refusal, never the frame");
        assert!(stats.refused(kind("bad_proof")) >= 1);
        assert_eq!(get(&stats.frames_sent_total), 0);
        a.stop();
    });
}

#[test]
fn silent_oversized_garbage_and_surplus_handshakes_are_dropped() {
    let lb = listener();
    let addr = lb.local_addr().unwrap();
    let peers: BTreeMap<_, _> = [(1, "127.0.0.1:1".parse().unwrap()), (2, addr)].into();
    let lim = PeerLimits {
        hello_timeout: Duration::from_millis(300),
        handshakes_max: 2,
        ..limits()
    };
    let (sb, got) = node(2, &peers, lb, lim);
    runtime().block_on(async move {
        let b = start(sb).unwrap();
        let stats = b.stats().clone();
        beside(move || {
            // A header declaring 1 MiB: closed at once, nothing allocated.
            let mut s = TcpStream::connect(addr).unwrap();
            let mut head = (1u32 << 20).to_le_bytes().to_vec();
            head.extend_from_slice(&[0; 8]);
            s.write_all(&head).unwrap();
            assert!(closed_within(&mut s, Duration::from_millis(250)));
            // Garbage: a bad checksum.
            let mut s = TcpStream::connect(addr).unwrap();
            let mut junk = 40u32.to_le_bytes().to_vec();
            junk.extend((0..48u8).map(|i| i.wrapping_mul(37)));
            s.write_all(&junk).unwrap();
            assert!(closed_within(&mut s, Duration::from_millis(250)));
            // Two silent clients hold both handshake slots; a third is
            // closed at once, long before the deadline.
            let mut silent: Vec<TcpStream> =
                (0..2).map(|_| TcpStream::connect(addr).unwrap()).collect();
            std::thread::sleep(Duration::from_millis(50));
            let mut third = TcpStream::connect(addr).unwrap();
            let t = Instant::now();
            assert!(closed_within(&mut third, Duration::from_millis(200)));
            assert!(t.elapsed() < Duration::from_millis(200));
            // The silent ones are closed at the hello deadline.
            for s in &mut silent {
                assert!(closed_within(s, Duration::from_secs(2)));
            }
        })
        .await;
        assert_eq!(stats.refused(kind("malformed")), 2);
        assert_eq!(stats.refused(kind("busy")), 1);
        assert_eq!(stats.refused(kind("timeout")), 2);
        assert!(got.lock().unwrap().is_empty());
        b.stop();
    });
}

#[test]
fn full_send_queues_drop_and_count_then_drain_on_connect() {
    let (la, lb) = (listener(), listener());
    let peers: BTreeMap<_, _> = [
        (1, la.local_addr().unwrap()),
        (2, lb.local_addr().unwrap()),
        (3, "127.0.0.1:1".parse().unwrap()),
    ]
    .into();
    let lim = PeerLimits {
        queue_frames_max: 4,
        queue_bytes_max: 1000,
        ..limits()
    };
    let (sa, _) = node(1, &peers, la, lim);
    let (sb, got_b) = node(2, &peers, lb, limits());
    runtime().block_on(async move {
        let a = start(sa).unwrap();
        // Node 2 is not up yet: the queue holds 4 frames, drops the rest.
        let sent: Vec<bool> = (0..10u8).map(|i| a.send(2, 1, &[i]).is_ok()).collect();
        assert_eq!(sent, [vec![true; 4], vec![false; 6]].concat());
        // Bytes: 12 + 5 + 300 each, three fit in 1000, the fourth does not.
        let sent: Vec<bool> = (0..4).map(|_| a.send(3, 1, &[0; 300]).is_ok()).collect();
        assert_eq!(sent, [true, true, true, false]);
        assert_eq!(a.send(3, 1, &[0; 300]), Err(SendError::QueueFull(3)));
        assert_eq!(get(&a.stats().queue_drops_total), 8);
        let b = start(sb).unwrap();
        assert!(until(Duration::from_secs(5), || got_b.lock().unwrap().len() == 4).await);
        let payloads: Vec<Vec<u8>> = got_b.lock().unwrap().iter().map(|g| g.2.clone()).collect();
        assert_eq!(
            payloads,
            vec![vec![0], vec![1], vec![2], vec![3]],
            "in order"
        );
        a.stop();
        b.stop();
    });
}

#[test]
fn the_connector_backs_off_and_reconnects_after_a_restart() {
    let (la, lb) = (listener(), listener());
    let addr_b = lb.local_addr().unwrap();
    let peers: BTreeMap<_, _> = [(1, la.local_addr().unwrap()), (2, addr_b)].into();
    let (sa, _) = node(1, &peers, la, limits());
    let (sb, got_b) = node(2, &peers, lb, limits());
    runtime().block_on(async move {
        let a = start(sa).unwrap();
        let b = start(sb).unwrap();
        assert!(until(Duration::from_secs(5), || a.is_connected(2)).await);
        a.send(2, 1, b"before").unwrap();
        assert!(until(Duration::from_secs(5), || got_b.lock().unwrap().len() == 1).await);
        b.shutdown().await;
        assert_eq!(b.tasks_running(), 0);
        let s = a.stats().clone();
        assert!(until(Duration::from_secs(5), || !a.is_connected(2)).await);
        // Down for a second: redials back off from 10 ms to the 80 ms cap
        // (each delay in the upper half of its step), so about 1 s / 40..80
        // ms attempts; without backoff there would be hundreds.
        let before = get(&s.connect_failures_total);
        monoio::time::sleep(Duration::from_secs(1)).await;
        let attempts = get(&s.connect_failures_total) - before;
        assert!((5..=40).contains(&attempts), "{attempts} redials in 1 s");
        let lb2 = rebind(addr_b).await;
        let (sb2, got_b2) = node(2, &peers, lb2, limits());
        let b2 = start(sb2).unwrap();
        assert!(until(Duration::from_secs(5), || a.is_connected(2)).await);
        a.send(2, 1, b"after").unwrap();
        assert!(until(Duration::from_secs(5), || got_b2.lock().unwrap().len() == 1).await);
        assert_eq!(got_b2.lock().unwrap()[0].2, b"after");
        assert_eq!(get(&s.sessions_connected_total), 2);
        a.stop();
        b2.stop();
    });
}

/// Binds `addr` again once the stopped node's listener is closed.
async fn rebind(addr: SocketAddr) -> std::net::TcpListener {
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        match crate::net::bind_shared(addr, 1) {
            Ok(mut l) => return l.remove(0),
            Err(e) if Instant::now() < end => {
                let _ = e;
                monoio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => panic!("rebind {addr}: {e}"),
        }
    }
}
