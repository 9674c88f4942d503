//! The handshake, pure: message bodies, their checks, and the proofs.
//!
//! Every handshake message is one wire frame (`u32 len | u64 xxh3 | body`,
//! ringlog_protocol::wire) of at most [`HELLO_BYTES_MAX`] body bytes. The
//! dialling node (initiator, I) and the accepting node (A):
//!
//! ```text
//! I -> A  Hello      magic, kind, version, cluster, node, to_node, shards, incarnation,
//!                    client_addr, nonce_i
//! A -> I  Challenge  the same fields for A (to_node = I), nonce_a, then proof_a
//!         or Refuse  magic, kind, u8 reason, str8 detail; then A closes
//! I -> A  Proof      magic, kind, proof_i            (I checked proof_a first)
//! A -> I  Welcome    magic, kind                     (A checked proof_i)
//! ```
//!
//! `proof_a = keyed_blake3(secret, "acceptor" | Hello | Challenge fields)`,
//! `proof_i = keyed_blake3(secret, "initiator" | Hello | Challenge fields)`:
//! each covers both fresh nonces and every field either side sent, so a
//! recorded session does not verify again (the other side's nonce is new),
//! a proof cannot be reflected (the roles differ), and a field changed on
//! the way fails. Proofs are compared in constant time (blake3::Hash).
//! Integers are little-endian; `str8` is a u8 length then UTF-8.
//! `client_addr` (since version 2) is a `str8`: the sender's bound client
//! listen address as `HOST:PORT`, or empty when it has none, so a backup
//! can name its primary's client address in a not-primary refusal.

use std::net::SocketAddr;

use ringlog_protocol::wire::{encode_frame, FRAME_HEADER_LEN};
use thiserror::Error;

use crate::config::ClusterSecret;

/// "RLPR" as little-endian bytes: a ringlog peer.
pub const PEER_MAGIC: u32 = 0x5250_4C52;
/// The peer protocol version this build speaks (exact match required).
/// 2: the Hello carries the sender's client address. 3: self-checked
/// message frames (`codec`), whose checksum covers only a payload prefix.
pub const PEER_PROTOCOL_VERSION: u16 = 3;
/// Largest handshake message body; checked before anything is allocated.
pub const HELLO_BYTES_MAX: u32 = 256;
pub const NONCE_BYTES: usize = 32;
pub const PROOF_BYTES: usize = 32;

/// The first byte after the magic (handshake) or of a body (after it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    Hello = 1,
    Challenge = 2,
    Proof = 3,
    Welcome = 4,
    Refuse = 5,
}

/// What one side tells the other about itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hello {
    pub version: u16,
    pub cluster_id: String,
    pub node_id: u32,
    /// The node the sender believes it talks to.
    pub to_node_id: u32,
    pub shard_count: u16,
    /// Random per process start: tells a reconnect of the same process
    /// from another process claiming the same node id.
    pub incarnation: u64,
    /// Where the sender serves clients (None: it announced none).
    pub client_addr: Option<SocketAddr>,
    pub nonce: [u8; NONCE_BYTES],
}

/// Why a handshake was refused (by us, or by the peer and reported).
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum Refusal {
    #[error(
        "peer speaks peer protocol version {theirs}, this node speaks {ours}: \
         run the same ringlog release on every node"
    )]
    Version { ours: u16, theirs: u16 },
    #[error("peer is in cluster {theirs:?}; this node is in {ours:?}")]
    Cluster { ours: String, theirs: String },
    #[error("node {0} is not among this cluster's peers")]
    UnknownNode(u32),
    #[error("node id {0} is this node's own id or already connected from another process")]
    DuplicateNode(u32),
    #[error("expected node {expected}, reached node {got} (check `peers` addresses)")]
    WrongNode { expected: u32, got: u32 },
    #[error("authentication failed: the proof does not match the cluster secret")]
    BadProof,
    #[error("malformed handshake: {0}")]
    Malformed(String),
    #[error("handshake not completed within {0} ms")]
    Timeout(u64),
    #[error("too many handshakes in progress")]
    Busy,
    #[error("refused by the peer (reason {code}): {detail}")]
    ByPeer { code: u8, detail: String },
}

/// Refusal kinds, for counters: index by [`Refusal::index`].
pub const REFUSAL_KINDS: usize = 10;
/// Label of each refusal kind (metrics, logs).
pub const REFUSAL_NAMES: [&str; REFUSAL_KINDS] = [
    "version",
    "cluster",
    "unknown_node",
    "duplicate_node",
    "wrong_node",
    "bad_proof",
    "malformed",
    "timeout",
    "busy",
    "by_peer",
];

impl Refusal {
    pub fn index(&self) -> usize {
        match self {
            Refusal::Version { .. } => 0,
            Refusal::Cluster { .. } => 1,
            Refusal::UnknownNode(_) => 2,
            Refusal::DuplicateNode(_) => 3,
            Refusal::WrongNode { .. } => 4,
            Refusal::BadProof => 5,
            Refusal::Malformed(_) => 6,
            Refusal::Timeout(_) => 7,
            Refusal::Busy => 8,
            Refusal::ByPeer { .. } => 9,
        }
    }

    /// The Refuse message telling the peer why (its code is the index).
    pub fn encode(&self) -> Vec<u8> {
        let mut body = header(Kind::Refuse);
        body.push(self.index() as u8);
        put_str8(&mut body, &self.to_string());
        framed(&body)
    }
}

fn header(kind: Kind) -> Vec<u8> {
    let mut body = Vec::with_capacity(HELLO_BYTES_MAX as usize);
    body.extend_from_slice(&PEER_MAGIC.to_le_bytes());
    body.push(kind as u8);
    body
}

/// `s` cut to 255 bytes at a char boundary, with its u8 length.
fn put_str8(out: &mut Vec<u8>, s: &str) {
    let mut end = s.len().min(255);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    out.push(end as u8);
    out.extend_from_slice(&s.as_bytes()[..end]);
}

fn framed(body: &[u8]) -> Vec<u8> {
    debug_assert!(body.len() <= HELLO_BYTES_MAX as usize);
    let mut out = Vec::with_capacity(FRAME_HEADER_LEN + body.len());
    encode_frame(body, &mut out);
    out
}

/// Reads fields off a body, each failure a Malformed refusal.
struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Refusal> {
        if self.rest.len() < n {
            return Err(Refusal::Malformed(format!(
                "body ends early ({} bytes left, {n} needed)",
                self.rest.len()
            )));
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], Refusal> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    fn u8(&mut self) -> Result<u8, Refusal> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, Refusal> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    fn u32(&mut self) -> Result<u32, Refusal> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, Refusal> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn str8(&mut self) -> Result<String, Refusal> {
        let n = usize::from(self.u8()?);
        let bytes = self.take(n)?;
        String::from_utf8(bytes.to_vec())
            .map_err(|_| Refusal::Malformed("a string is not UTF-8".into()))
    }

    fn end(&self) -> Result<(), Refusal> {
        if self.rest.is_empty() {
            Ok(())
        } else {
            Err(Refusal::Malformed(format!(
                "{} bytes after the message",
                self.rest.len()
            )))
        }
    }
}

/// Checks the magic and returns the kind and a reader of the rest.
fn open(body: &[u8]) -> Result<(u8, Reader<'_>), Refusal> {
    let mut r = Reader { rest: body };
    if r.u32()? != PEER_MAGIC {
        return Err(Refusal::Malformed("not a ringlog peer (bad magic)".into()));
    }
    let kind = r.u8()?;
    Ok((kind, r))
}

fn expect_kind(got: u8, want: Kind) -> Result<(), Refusal> {
    if got == want as u8 {
        Ok(())
    } else {
        Err(Refusal::Malformed(format!(
            "expected message kind {} ({want:?}), got {got}",
            want as u8
        )))
    }
}

impl Hello {
    /// The body: Hello or the fields part of a Challenge.
    pub fn body(&self, kind: Kind) -> Vec<u8> {
        let mut body = header(kind);
        body.extend_from_slice(&self.version.to_le_bytes());
        put_str8(&mut body, &self.cluster_id);
        body.extend_from_slice(&self.node_id.to_le_bytes());
        body.extend_from_slice(&self.to_node_id.to_le_bytes());
        body.extend_from_slice(&self.shard_count.to_le_bytes());
        body.extend_from_slice(&self.incarnation.to_le_bytes());
        let addr = self.client_addr.map(|a| a.to_string()).unwrap_or_default();
        debug_assert!(addr.len() <= 255, "a socket address is short");
        put_str8(&mut body, &addr);
        body.extend_from_slice(&self.nonce);
        body
    }

    /// Decodes a Hello (`kind` Hello) or a Challenge's fields; a version
    /// other than ours is refused before the rest is read (its layout may
    /// differ). Returns the Hello and what follows it.
    fn decode(body: &[u8], kind: Kind) -> Result<(Hello, &[u8]), Refusal> {
        let (got, mut r) = open(body)?;
        if got == Kind::Refuse as u8 {
            let code = r.u8()?;
            let detail = r.str8()?;
            return Err(Refusal::ByPeer { code, detail });
        }
        expect_kind(got, kind)?;
        let version = r.u16()?;
        if version != PEER_PROTOCOL_VERSION {
            return Err(Refusal::Version {
                ours: PEER_PROTOCOL_VERSION,
                theirs: version,
            });
        }
        let hello = Hello {
            version,
            cluster_id: r.str8()?,
            node_id: r.u32()?,
            to_node_id: r.u32()?,
            shard_count: r.u16()?,
            incarnation: r.u64()?,
            client_addr: client_addr(&r.str8()?)?,
            nonce: r.array()?,
        };
        Ok((hello, r.rest))
    }

    pub fn decode_hello(body: &[u8]) -> Result<Hello, Refusal> {
        let (hello, rest) = Hello::decode(body, Kind::Hello)?;
        Reader { rest }.end()?;
        Ok(hello)
    }

    /// Decodes a Challenge: the acceptor's Hello, its fields' bytes (for
    /// the proofs) and its proof. A Refuse decodes to `Refusal::ByPeer`.
    pub fn decode_challenge(body: &[u8]) -> Result<(Hello, &[u8], [u8; PROOF_BYTES]), Refusal> {
        let (hello, rest) = Hello::decode(body, Kind::Challenge)?;
        let fields = &body[..body.len() - rest.len()];
        let mut r = Reader { rest };
        let proof = r.array()?;
        r.end()?;
        Ok((hello, fields, proof))
    }
}

/// A Hello's client address: empty for none, else `HOST:PORT`.
fn client_addr(s: &str) -> Result<Option<SocketAddr>, Refusal> {
    if s.is_empty() {
        return Ok(None);
    }
    s.parse().map(Some).map_err(|_| {
        Refusal::Malformed(format!(
            "client address {s:?} is not an IP address and port"
        ))
    })
}

/// Roles bound into the proofs so one side's proof never passes as the
/// other's.
#[derive(Clone, Copy, Debug)]
pub enum Role {
    Acceptor,
    Initiator,
}

/// The proof `role` gives over the transcript (the Hello body and the
/// Challenge's fields), keyed by the cluster secret.
pub fn proof(
    secret: &ClusterSecret,
    role: Role,
    hello: &[u8],
    challenge_fields: &[u8],
) -> [u8; PROOF_BYTES] {
    let label: &[u8] = match role {
        Role::Acceptor => b"ringlog peer proof: acceptor",
        Role::Initiator => b"ringlog peer proof: initiator",
    };
    let mut h = blake3::Hasher::new_keyed(&secret.0);
    for part in [label, hello, challenge_fields] {
        h.update(&(part.len() as u32).to_le_bytes());
        h.update(part);
    }
    *h.finalize().as_bytes()
}

/// Constant-time comparison of a received proof with the expected one.
pub fn proof_matches(expected: &[u8; PROOF_BYTES], got: &[u8; PROOF_BYTES]) -> bool {
    blake3::Hash::from_bytes(*expected) == blake3::Hash::from_bytes(*got)
}

pub fn challenge(fields: &[u8], proof: &[u8; PROOF_BYTES]) -> Vec<u8> {
    let mut body = fields.to_vec();
    body.extend_from_slice(proof);
    framed(&body)
}

pub fn hello_frame(hello: &Hello) -> Vec<u8> {
    framed(&hello.body(Kind::Hello))
}

pub fn proof_frame(proof: &[u8; PROOF_BYTES]) -> Vec<u8> {
    let mut body = header(Kind::Proof);
    body.extend_from_slice(proof);
    framed(&body)
}

pub fn welcome_frame() -> Vec<u8> {
    framed(&header(Kind::Welcome))
}

/// Decodes a Proof (or a Refuse, as `ByPeer`).
pub fn decode_proof(body: &[u8]) -> Result<[u8; PROOF_BYTES], Refusal> {
    let (kind, mut r) = open(body)?;
    if kind == Kind::Refuse as u8 {
        return Err(Refusal::ByPeer {
            code: r.u8()?,
            detail: r.str8()?,
        });
    }
    expect_kind(kind, Kind::Proof)?;
    let proof = r.array()?;
    r.end()?;
    Ok(proof)
}

/// Decodes a Welcome (or a Refuse, as `ByPeer`).
pub fn decode_welcome(body: &[u8]) -> Result<(), Refusal> {
    let (kind, mut r) = open(body)?;
    if kind == Kind::Refuse as u8 {
        return Err(Refusal::ByPeer {
            code: r.u8()?,
            detail: r.str8()?,
        });
    }
    expect_kind(kind, Kind::Welcome)?;
    r.end()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello(nonce: u8) -> Hello {
        Hello {
            version: PEER_PROTOCOL_VERSION,
            cluster_id: "blue".into(),
            node_id: 1,
            to_node_id: 2,
            shard_count: 4,
            incarnation: 77,
            client_addr: Some("127.0.0.1:7420".parse().unwrap()),
            nonce: [nonce; NONCE_BYTES],
        }
    }

    #[test]
    fn messages_round_trip_and_bad_bytes_are_refused() {
        let h = hello(9);
        let body = h.body(Kind::Hello);
        assert_eq!(Hello::decode_hello(&body).unwrap(), h);
        assert!(body.len() <= HELLO_BYTES_MAX as usize);
        // Every cut is refused as malformed, never a panic.
        for n in 0..body.len() {
            assert!(matches!(
                Hello::decode_hello(&body[..n]),
                Err(Refusal::Malformed(_))
            ));
        }
        let mut longer = body.clone();
        longer.push(0);
        assert!(matches!(
            Hello::decode_hello(&longer),
            Err(Refusal::Malformed(_))
        ));
        let mut bad_magic = body.clone();
        bad_magic[0] ^= 1;
        assert!(matches!(
            Hello::decode_hello(&bad_magic),
            Err(Refusal::Malformed(_))
        ));
        // A version-1 peer (no client address) is refused by version,
        // before its shorter layout is read, with a reason naming both.
        let mut v1 = body.clone();
        v1[5] = 1;
        let refused = Hello::decode_hello(&v1).unwrap_err();
        assert_eq!(
            refused,
            Refusal::Version {
                ours: PEER_PROTOCOL_VERSION,
                theirs: 1
            }
        );
        assert!(
            refused.to_string().contains("same ringlog release"),
            "{refused}"
        );
        let refuse = Refusal::BadProof.encode();
        let refused = Hello::decode_hello(&refuse[FRAME_HEADER_LEN..]).unwrap_err();
        assert!(
            matches!(refused, Refusal::ByPeer { code: 5, .. }),
            "{refused}"
        );
    }

    /// Where the client address sits in a Hello body of cluster "blue".
    const ADDR_AT: usize = 5 + 2 + 5 + 4 + 4 + 2 + 8;

    #[test]
    fn the_client_address_round_trips_and_a_bad_one_is_refused() {
        let mut h = hello(4);
        h.client_addr = None;
        assert_eq!(Hello::decode_hello(&h.body(Kind::Hello)).unwrap(), h);
        // The longest cluster id and IPv6 address still fit a Challenge.
        h.cluster_id = "c".repeat(crate::config::CLUSTER_ID_BYTES_MAX);
        h.client_addr = Some(
            "[ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff%4294967295]:65535"
                .parse()
                .unwrap(),
        );
        let fields = h.body(Kind::Challenge);
        assert!(fields.len() + PROOF_BYTES <= HELLO_BYTES_MAX as usize);
        let frame = challenge(&fields, &[1; PROOF_BYTES]);
        let (got, _, _) = Hello::decode_challenge(&frame[FRAME_HEADER_LEN..]).unwrap();
        assert_eq!(got, h);
        // Same length, not an address: refused with a reason, no panic.
        let mut bad = hello(4).body(Kind::Hello);
        assert_eq!(usize::from(bad[ADDR_AT]), "127.0.0.1:7420".len());
        bad[ADDR_AT + 1..ADDR_AT + 15].copy_from_slice(b"localhost:7420");
        let refused = Hello::decode_hello(&bad).unwrap_err();
        assert!(
            matches!(&refused, Refusal::Malformed(m) if m.contains("client address")),
            "{refused}"
        );
    }

    #[test]
    fn proofs_bind_role_secret_and_both_nonces() {
        let secret = ClusterSecret::from_bytes(&[7u8; 32]);
        let other = ClusterSecret::from_bytes(&[8u8; 32]);
        let hi = hello(1).body(Kind::Hello);
        let ha = hello(2).body(Kind::Challenge);
        let p = proof(&secret, Role::Acceptor, &hi, &ha);
        assert!(proof_matches(&p, &proof(&secret, Role::Acceptor, &hi, &ha)));
        assert!(!proof_matches(
            &p,
            &proof(&secret, Role::Initiator, &hi, &ha)
        ));
        assert!(!proof_matches(&p, &proof(&other, Role::Acceptor, &hi, &ha)));
        // The client address is in the transcript: rewriting it in transit
        // fails the proof.
        let mut moved = hello(2);
        moved.client_addr = Some("10.0.0.9:7420".parse().unwrap());
        let moved = moved.body(Kind::Challenge);
        assert!(!proof_matches(
            &p,
            &proof(&secret, Role::Acceptor, &hi, &moved)
        ));
        let fresh = hello(3).body(Kind::Challenge);
        assert!(!proof_matches(
            &p,
            &proof(&secret, Role::Acceptor, &hi, &fresh)
        ));
        let frame = challenge(&ha, &p);
        let (h, fields, got) = Hello::decode_challenge(&frame[FRAME_HEADER_LEN..]).unwrap();
        assert_eq!((h, fields, got), (hello(2), ha.as_slice(), p));
    }
}
