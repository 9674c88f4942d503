//! Metadata commands and their encoding: each is the value of one record
//! in a batch of the metadata group's log; the record's key is the
//! submitter's 8-byte request id (echoed in the outcome, so the host that
//! took the command can answer its client).
//!
//! Value layout (little-endian), format [`COMMAND_FORMAT`]:
//! `format u8 | kind u8 | name_len u16 | name | (create only) partitions u32, replication_factor u8`.
//! The name's length is checked against `TOPIC_NAME_BYTES_MAX` before
//! its bytes are taken; trailing bytes are an error (one encoding per
//! command, so equal tables come from equal logs byte for byte).

use ringlog_protocol::batch::{BatchBuilder, BatchError};
use ringlog_protocol::wire::TOPIC_NAME_BYTES_MAX;
use ringlog_protocol::{Record, Stamp};

use super::codec::{get_name, put_name, Cursor, NameError, Short};

pub const COMMAND_FORMAT: u8 = 1;
const KIND_CREATE: u8 = 1;
const KIND_DELETE: u8 = 2;
const KIND_PURGE: u8 = 3;
/// The longest command value: header, the longest name, create's fields.
pub const COMMAND_BYTES_MAX: usize = 4 + TOPIC_NAME_BYTES_MAX + 5;
/// Commands per submitted batch at most (a host batches what it has).
pub const COMMANDS_PER_BATCH_MAX: usize = 64;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    CreateTopic {
        name: String,
        partitions: u32,
        replication_factor: u8,
    },
    DeleteTopic {
        name: String,
    },
    /// Drops every record of the topic: bumps its purge generation.
    PurgeTopic {
        name: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("command truncated reading {}: {} bytes needed, {} left", .0.field, .0.needed, .0.available)]
    Truncated(Short),
    #[error("command format {0} is not {COMMAND_FORMAT}")]
    Format(u8),
    #[error("unknown command kind {0}")]
    Kind(u8),
    #[error("topic name of {len} bytes is over {bytes_max}")]
    NameTooLong { len: usize, bytes_max: usize },
    #[error("topic name is not UTF-8")]
    NameUtf8,
    #[error("{0} bytes after the command")]
    Trailing(usize),
    #[error("request id must be 8 bytes, not {0}")]
    RequestId(usize),
}

impl From<Short> for DecodeError {
    fn from(s: Short) -> Self {
        DecodeError::Truncated(s)
    }
}

impl From<NameError> for DecodeError {
    fn from(e: NameError) -> Self {
        match e {
            NameError::Short(s) => DecodeError::Truncated(s),
            NameError::TooLong { len, bytes_max } => DecodeError::NameTooLong { len, bytes_max },
            NameError::Utf8 => DecodeError::NameUtf8,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    #[error("topic name of {len} bytes is over {bytes_max}")]
    NameTooLong { len: usize, bytes_max: usize },
    #[error("{count} commands in one batch, at most {COMMANDS_PER_BATCH_MAX}")]
    TooMany { count: usize },
    #[error("no command to submit")]
    Empty,
    #[error("building the batch: {0}")]
    Batch(#[from] BatchError),
}

impl Command {
    pub fn name(&self) -> &str {
        match self {
            Command::CreateTopic { name, .. }
            | Command::DeleteTopic { name }
            | Command::PurgeTopic { name } => name,
        }
    }

    /// The record value. Refuses a name over the cap (the decoder would).
    pub fn encode(&self) -> Result<Vec<u8>, EncodeError> {
        let name = self.name();
        if name.len() > TOPIC_NAME_BYTES_MAX {
            let (len, bytes_max) = (name.len(), TOPIC_NAME_BYTES_MAX);
            return Err(EncodeError::NameTooLong { len, bytes_max });
        }
        let kind = match self {
            Command::CreateTopic { .. } => KIND_CREATE,
            Command::DeleteTopic { .. } => KIND_DELETE,
            Command::PurgeTopic { .. } => KIND_PURGE,
        };
        let mut out = Vec::with_capacity(COMMAND_BYTES_MAX);
        out.extend_from_slice(&[COMMAND_FORMAT, kind]);
        put_name(&mut out, name);
        if let Command::CreateTopic {
            partitions,
            replication_factor,
            ..
        } = self
        {
            out.extend_from_slice(&partitions.to_le_bytes());
            out.push(*replication_factor);
        }
        debug_assert!(out.len() <= COMMAND_BYTES_MAX);
        Ok(out)
    }

    pub fn decode(value: &[u8]) -> Result<Command, DecodeError> {
        let mut c = Cursor::new(value);
        let format = c.u8("format")?;
        if format != COMMAND_FORMAT {
            return Err(DecodeError::Format(format));
        }
        let kind = c.u8("kind")?;
        if !matches!(kind, KIND_CREATE | KIND_DELETE | KIND_PURGE) {
            return Err(DecodeError::Kind(kind));
        }
        let name = get_name(&mut c, TOPIC_NAME_BYTES_MAX)?.to_string();
        let cmd = match kind {
            KIND_CREATE => Command::CreateTopic {
                name,
                partitions: c.u32("partitions")?,
                replication_factor: c.u8("replication factor")?,
            },
            KIND_DELETE => Command::DeleteTopic { name },
            _ => Command::PurgeTopic { name },
        };
        match c.remaining() {
            0 => Ok(cmd),
            n => Err(DecodeError::Trailing(n)),
        }
    }
}

/// The request id a record's key holds.
pub fn request_id(key: &[u8]) -> Result<u64, DecodeError> {
    let bytes: [u8; 8] = key
        .try_into()
        .map_err(|_| DecodeError::RequestId(key.len()))?;
    Ok(u64::from_le_bytes(bytes))
}

/// A batch for the metadata group (`partition_id`, provisionally stamped:
/// the primary re-stamps it), one record per `(request_id, command)`.
pub fn command_batch(
    partition_id: u32,
    commands: &[(u64, Command)],
) -> Result<Vec<u8>, EncodeError> {
    if commands.is_empty() {
        return Err(EncodeError::Empty);
    }
    if commands.len() > COMMANDS_PER_BATCH_MAX {
        return Err(EncodeError::TooMany {
            count: commands.len(),
        });
    }
    let mut b = BatchBuilder::new(partition_id);
    for (id, cmd) in commands {
        let value = cmd.encode()?;
        let key = id.to_le_bytes();
        let record = Record {
            key: &key,
            headers: &[],
            value: &value,
            timestamp_ms: 0,
        };
        b.push(&record)?;
    }
    Ok(b.finish(&Stamp::default())?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples() -> Vec<Command> {
        vec![
            Command::CreateTopic {
                name: "orders".into(),
                partitions: 12,
                replication_factor: 3,
            },
            Command::DeleteTopic { name: "a".into() },
            Command::PurgeTopic {
                name: "x".repeat(TOPIC_NAME_BYTES_MAX),
            },
        ]
    }

    #[test]
    fn commands_round_trip() {
        for cmd in samples() {
            let bytes = cmd.encode().expect("encodes");
            assert!(bytes.len() <= COMMAND_BYTES_MAX);
            assert_eq!(Command::decode(&bytes), Ok(cmd));
        }
    }

    /// Guards against: a cut command decoding as a shorter valid one.
    #[test]
    fn every_truncation_and_extension_is_refused() {
        for cmd in samples() {
            let bytes = cmd.encode().expect("encodes");
            for len in 0..bytes.len() {
                let got = Command::decode(&bytes[..len]);
                assert!(
                    matches!(got, Err(DecodeError::Truncated(_))),
                    "{cmd:?} cut to {len}: {got:?}"
                );
            }
            let mut longer = bytes.clone();
            longer.push(0);
            assert_eq!(Command::decode(&longer), Err(DecodeError::Trailing(1)));
        }
    }

    /// Guards against: a hostile length allocating or reading past the cap.
    #[test]
    fn bad_format_kind_length_and_utf8_are_typed() {
        let good = samples()[0].encode().expect("encodes");
        let mut b = good.clone();
        b[0] = 2;
        assert_eq!(Command::decode(&b), Err(DecodeError::Format(2)));
        let mut b = good.clone();
        b[1] = 9;
        assert_eq!(Command::decode(&b), Err(DecodeError::Kind(9)));
        let mut b = good.clone();
        b[2..4].copy_from_slice(&u16::MAX.to_le_bytes());
        let too_long = DecodeError::NameTooLong {
            len: usize::from(u16::MAX),
            bytes_max: TOPIC_NAME_BYTES_MAX,
        };
        assert_eq!(Command::decode(&b), Err(too_long));
        let mut b = good;
        b[4] = 0xff;
        assert_eq!(Command::decode(&b), Err(DecodeError::NameUtf8));
        let long = Command::DeleteTopic {
            name: "y".repeat(TOPIC_NAME_BYTES_MAX + 1),
        };
        assert!(matches!(
            long.encode(),
            Err(EncodeError::NameTooLong { .. })
        ));
    }

    #[test]
    fn batches_are_bounded_and_carry_request_ids() {
        let cmds: Vec<(u64, Command)> = samples()
            .into_iter()
            .enumerate()
            .map(|(i, c)| (i as u64 + 7, c))
            .collect();
        let batch = command_batch(3, &cmds).expect("batch");
        let view = ringlog_protocol::batch::BatchView::parse(&batch).expect("parses");
        let got: Vec<(u64, Command)> = view
            .records()
            .map(|r| {
                (
                    request_id(r.key).expect("id"),
                    Command::decode(r.value).expect("cmd"),
                )
            })
            .collect();
        assert_eq!(got, cmds);
        assert_eq!(command_batch(3, &[]), Err(EncodeError::Empty));
        let many = vec![(1, samples()[1].clone()); COMMANDS_PER_BATCH_MAX + 1];
        assert_eq!(
            command_batch(3, &many),
            Err(EncodeError::TooMany {
                count: COMMANDS_PER_BATCH_MAX + 1
            })
        );
        assert!(command_batch(3, &many[..COMMANDS_PER_BATCH_MAX]).is_ok());
        assert_eq!(request_id(&[1, 2, 3]), Err(DecodeError::RequestId(3)));
    }
}
