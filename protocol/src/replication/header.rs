use super::{Command, Envelope, ReplicationError, ReplicationLimits, HEADER_LEN, MAGIC, VERSION};
use crate::checksum::checksum;

// Field offsets; see the layout table in the module docs.
const OFF_MAGIC: usize = 0;
const OFF_VERSION: usize = 4;
const OFF_COMMAND: usize = 5;
const OFF_HEADER_LEN: usize = 6;
const OFF_HEADER_CHECKSUM: usize = 8;
const OFF_BODY_CHECKSUM: usize = 16;
const OFF_CLUSTER_ID: usize = 24;
const OFF_PARTITION_ID: usize = 40;
const OFF_VIEW: usize = 44;
const OFF_BODY_LEN: usize = 48;
const OFF_REPLICA: usize = 52;
const OFF_RESERVED: usize = 53;

// The layout table is the spec: pin it at compile time.
const _: () = assert!(HEADER_LEN == 64);
const _: () = assert!(OFF_CLUSTER_ID % 16 == 8 && OFF_CLUSTER_ID + 16 == OFF_PARTITION_ID);
const _: () = assert!(OFF_BODY_LEN + 4 == OFF_REPLICA && OFF_REPLICA + 1 == OFF_RESERVED);
const _: () = assert!(OFF_RESERVED + 11 == HEADER_LEN);

/// The header length each known version implies; `None` for versions this
/// build does not know.
fn header_len_of(version: u8) -> Option<u16> {
    match version {
        VERSION => Some(HEADER_LEN as u16),
        _ => None,
    }
}

/// A decoded, verified message header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub version: u8,
    pub command: Command,
    pub header_checksum: u64,
    pub body_checksum: u64,
    pub envelope: Envelope,
    pub body_len: u32,
}

fn array<const N: usize>(h: &[u8; HEADER_LEN], at: usize) -> [u8; N] {
    let mut b = [0u8; N];
    // The offsets are the constants above, in bounds of the header.
    b.copy_from_slice(&h[at..at + N]);
    b
}

fn compute_checksum(h: &[u8; HEADER_LEN]) -> u64 {
    let mut copy = *h;
    copy[OFF_HEADER_CHECKSUM..OFF_HEADER_CHECKSUM + 8].fill(0);
    checksum(&copy)
}

impl Header {
    /// Decodes and verifies the header at the start of `bytes` and checks
    /// `body_len` against `limits`, without looking at the body: a transport
    /// reads [`HEADER_LEN`] bytes, calls this, and only then reads (and
    /// sizes a buffer for) `body_len` more.
    pub fn decode(bytes: &[u8], limits: &ReplicationLimits) -> Result<Header, ReplicationError> {
        let h = bytes
            .first_chunk::<HEADER_LEN>()
            .ok_or(ReplicationError::Truncated {
                needed: HEADER_LEN,
                available: bytes.len(),
            })?;
        let magic = u32::from_le_bytes(array(h, OFF_MAGIC));
        if magic != MAGIC {
            return Err(ReplicationError::BadMagic(magic));
        }
        // The version decides the layout, so it is checked before the
        // checksum that the layout defines.
        let version = h[OFF_VERSION];
        let expected =
            header_len_of(version).ok_or(ReplicationError::UnsupportedVersion(version))?;
        let header_len = u16::from_le_bytes(array(h, OFF_HEADER_LEN));
        if header_len != expected {
            return Err(ReplicationError::HeaderLength {
                version,
                header_len,
                expected,
            });
        }
        let stored = u64::from_le_bytes(array(h, OFF_HEADER_CHECKSUM));
        let actual = compute_checksum(h);
        if stored != actual {
            return Err(ReplicationError::HeaderChecksum {
                expected: stored,
                actual,
            });
        }
        let command = Command::from_u8(h[OFF_COMMAND])
            .ok_or(ReplicationError::UnknownCommand(h[OFF_COMMAND]))?;
        if h[OFF_RESERVED..].iter().any(|&b| b != 0) {
            return Err(ReplicationError::NonZeroReserved {
                field: "header reserved",
            });
        }
        let body_len = u32::from_le_bytes(array(h, OFF_BODY_LEN));
        if body_len > limits.body_bytes_max {
            return Err(ReplicationError::BodyTooLarge {
                body_len: u64::from(body_len),
                max: u64::from(limits.body_bytes_max),
            });
        }
        Ok(Header {
            version,
            command,
            header_checksum: stored,
            body_checksum: u64::from_le_bytes(array(h, OFF_BODY_CHECKSUM)),
            envelope: Envelope {
                cluster_id: u128::from_le_bytes(array(h, OFF_CLUSTER_ID)),
                partition_id: u32::from_le_bytes(array(h, OFF_PARTITION_ID)),
                replica: h[OFF_REPLICA],
                view: u32::from_le_bytes(array(h, OFF_VIEW)),
            },
            body_len,
        })
    }

    /// Writes the header (reserved bytes zero) and seals its checksum;
    /// `self.header_checksum` is ignored. Returns the checksum.
    pub(super) fn encode(&self, out: &mut [u8; HEADER_LEN]) -> u64 {
        let mut put = |at: usize, bytes: &[u8]| out[at..at + bytes.len()].copy_from_slice(bytes);
        put(0, &[0u8; HEADER_LEN]);
        put(OFF_MAGIC, &MAGIC.to_le_bytes());
        put(OFF_VERSION, &[self.version]);
        put(OFF_COMMAND, &[self.command as u8]);
        put(OFF_HEADER_LEN, &(HEADER_LEN as u16).to_le_bytes());
        put(OFF_BODY_CHECKSUM, &self.body_checksum.to_le_bytes());
        put(OFF_CLUSTER_ID, &self.envelope.cluster_id.to_le_bytes());
        put(OFF_PARTITION_ID, &self.envelope.partition_id.to_le_bytes());
        put(OFF_VIEW, &self.envelope.view.to_le_bytes());
        put(OFF_BODY_LEN, &self.body_len.to_le_bytes());
        put(OFF_REPLICA, &[self.envelope.replica]);
        // The checksum field is still zero, which is what it covers.
        let sum = checksum(out);
        out[OFF_HEADER_CHECKSUM..OFF_HEADER_CHECKSUM + 8].copy_from_slice(&sum.to_le_bytes());
        sum
    }
}
