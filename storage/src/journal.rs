//! The per-shard journal: group commit across partitions.
//!
//! Without it, a turn that touched N partitions costs N writes and N
//! fdatasyncs (one flush per partition). With it, the small appends of
//! every partition of a turn go into ONE journal write followed by ONE
//! fdatasync of the journal file; the partitions' segment writes are issued
//! in the same submission but without an fdatasync of their own ("written
//! behind"), and their appends are acknowledged once the journal's
//! fdatasync completed, never before.
//!
//! ## File
//!
//! One preallocated file of `journal_bytes` per shard, written O_DIRECT in
//! whole blocks:
//! ```text
//! [0, 4096)        header copy 0   (the tail: where replay starts)
//! [4096, 8192)     header copy 1   (copies alternate; the newer valid wins)
//! [8192, end)      the ring of records
//! ```
//! A turn's records are one block-aligned write at the ring's head. A
//! record is an 80-byte header (magic, flags, sequence number, turn number,
//! the checksum of the record before it, partition key, segment position,
//! length, and a checksum over header and body) plus the appended bytes,
//! 8-byte aligned; the last record of a write is flagged, the next write
//! starts at the next block. Records form a hash chain (each names its
//! predecessor's checksum and the next sequence number), so a stale record
//! left from an earlier lap, or past a crash, can never continue the chain.
//! A write that does not fit before the ring's end goes to its start; the
//! reader, finding no continuation where the chain left off, looks there.
//!
//! ## Durability and replay
//!
//! One journal write is in flight at a time: turn N+1's records are written
//! only after turn N's fdatasync completed. So a torn or bad record ends the
//! replay and nothing after it was acknowledged: every record after it
//! belongs to the same, unfinished write (whose appends were not
//! acknowledged), or was never written.
//!
//! A record names the partition's active segment exactly (partition id,
//! superblock sequence, segment base and random nonce) and the position of
//! its bytes there. At open a partition store replays, before it recovers
//! the active segment, every live record that names its current superblock
//! state, in sequence order, and fdatasyncs the segment (see
//! `store/open.rs`). Records naming an older superblock state are skipped:
//! a partition store fdatasyncs its segment before any superblock write
//! (`PartitionStore::sync_behind`), so what they carried is in the segment
//! already, or was cut (truncation), purged or replaced (install) on
//! purpose and must not come back.
//!
//! ## Checkpoint
//!
//! Once the ring is more than half full ([`Journal::checkpoint_due`]) and no
//! journal write is in flight, the shard fdatasyncs the active segment of
//! every partition with live records ([`Journal::begin_checkpoint`]), then,
//! in a second submission (a linked chain does not stop at a failed fsync),
//! writes the header naming the head as the new tail, and its fdatasync
//! ([`Journal::prepare_checkpoint_commit`]). Only when that completed is the
//! space reused. A failed segment fdatasync freezes checkpoints (the records
//! are needed by the restart); the ring then fills and every flush goes to
//! its segment directly, as without a journal.
//!
//! ## Bounds
//!
//! - `journal_bytes`: default 32 MiB, at least 256 KiB, at most 1 GiB; at
//!   open the whole ring is read into memory once (and the live records
//!   kept until their partitions opened).
//! - `journal_append_bytes_max`: a partition's bytes for one turn above
//!   this (default 64 KiB) go straight to its segment with its own
//!   fdatasync, as without a journal.
//! - `journal_turn_bytes_max` (default 4 MiB, at most a quarter of the
//!   ring) and `journal_turn_records_max` (default 4096) bound one turn's
//!   write; a partition that does not fit flushes directly.

use std::collections::VecDeque;
use std::io;
use std::path::{Path, PathBuf};

use ringlog_protocol::checksum;
use thiserror::Error;

use crate::io::{
    align_up, AlignedBuf, Completion, FileId, IoBackend, Op, OpenMode, Sqe, BLOCK_SIZE,
};

/// Where the ring starts: past the two header copies.
pub const DATA_START: u64 = 2 * BLOCK_SIZE as u64;
/// Bytes of a record's header.
pub const RECORD_HEADER_BYTES: usize = 80;
const RECORD_MAGIC: u32 = 0x524c_4a52; // "RLJR"
const HEADER_MAGIC: u32 = 0x524c_4a48; // "RLJH"
const HEADER_VERSION: u16 = 1;
const HEADER_BYTES: usize = 72;
/// The record is the last of its write: the next starts at the next block.
const FLAG_LAST: u16 = 1;
/// Reads at open go in pieces this large.
const READ_CHUNK_BYTES: usize = 1024 * 1024;

pub const JOURNAL_BYTES_DEFAULT: u64 = 32 * 1024 * 1024;
pub const JOURNAL_BYTES_MIN: u64 = 256 * 1024;
pub const JOURNAL_BYTES_MAX: u64 = 1024 * 1024 * 1024;
pub const JOURNAL_APPEND_BYTES_MAX_DEFAULT: usize = 64 * 1024;
pub const JOURNAL_TURN_BYTES_MAX_DEFAULT: usize = 4 * 1024 * 1024;
pub const JOURNAL_TURN_RECORDS_MAX_DEFAULT: usize = 4096;

/// Bounds of a journal (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JournalConfig {
    /// Size of the journal file, headers included. Multiple of 4096.
    pub journal_bytes: u64,
    /// A partition's bytes of one turn above this go to its segment directly.
    pub append_bytes_max: usize,
    /// One turn's journal write holds at most this many bytes.
    pub turn_bytes_max: usize,
    /// One turn's journal write holds at most this many records.
    pub turn_records_max: usize,
}

impl Default for JournalConfig {
    fn default() -> Self {
        Self {
            journal_bytes: JOURNAL_BYTES_DEFAULT,
            append_bytes_max: JOURNAL_APPEND_BYTES_MAX_DEFAULT,
            turn_bytes_max: JOURNAL_TURN_BYTES_MAX_DEFAULT,
            turn_records_max: JOURNAL_TURN_RECORDS_MAX_DEFAULT,
        }
    }
}

impl JournalConfig {
    /// A journal of `journal_bytes` whose turns take appends up to
    /// `append_bytes_max`: the turn bound is the default, or a quarter of
    /// a smaller ring (so a checkpoint at half full leaves room for turns).
    pub fn sized(journal_bytes: u64, append_bytes_max: usize) -> Self {
        let quarter = journal_bytes.saturating_sub(DATA_START) / 4;
        let quarter = (quarter - quarter % BLOCK_SIZE as u64) as usize;
        Self {
            journal_bytes,
            append_bytes_max,
            turn_bytes_max: JOURNAL_TURN_BYTES_MAX_DEFAULT.min(quarter),
            ..Self::default()
        }
    }

    pub fn validate(&self) -> Result<(), JournalError> {
        let fail = |m: String| Err(JournalError::Config(m));
        if !(JOURNAL_BYTES_MIN..=JOURNAL_BYTES_MAX).contains(&self.journal_bytes)
            || !self.journal_bytes.is_multiple_of(BLOCK_SIZE as u64)
        {
            return fail(format!(
                "journal_bytes {} must be a multiple of {BLOCK_SIZE} in [{JOURNAL_BYTES_MIN}, {JOURNAL_BYTES_MAX}]",
                self.journal_bytes
            ));
        }
        let ring = self.journal_bytes - DATA_START;
        if self.turn_bytes_max < BLOCK_SIZE || self.turn_bytes_max as u64 > ring / 4 {
            return fail(format!(
                "journal_turn_bytes_max {} must be in [{BLOCK_SIZE}, journal ring / 4 = {}]",
                self.turn_bytes_max,
                ring / 4
            ));
        }
        if self.append_bytes_max + RECORD_HEADER_BYTES + 8 > self.turn_bytes_max {
            return fail(format!(
                "journal_append_bytes_max {} must leave room for a record header in journal_turn_bytes_max {}",
                self.append_bytes_max, self.turn_bytes_max
            ));
        }
        if self.turn_records_max == 0 {
            return fail("journal_turn_records_max must be at least 1".into());
        }
        Ok(())
    }
}

#[derive(Debug, Error)]
pub enum JournalError {
    #[error("journal {path}: {what}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Preallocating the journal found no room: nothing is journaled.
    #[error("journal {path}: disk full preallocating {bytes} bytes")]
    DiskFull { path: PathBuf, bytes: u64 },
    #[error("invalid journal config: {0}")]
    Config(String),
    #[error("journal {path}: corruption at byte {position}: {detail}")]
    Corruption {
        path: PathBuf,
        position: u64,
        detail: String,
    },
    /// A journal write or fdatasync failed: fail-stop for the journal and
    /// for every partition whose appends it carried.
    #[error("journal {path} is fenced after an I/O failure: {cause}")]
    Fenced { path: PathBuf, cause: String },
}

/// The partition segment a record's bytes belong to (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JournalKey {
    pub partition_id: u32,
    /// The sequence of the partition's superblock when the bytes were
    /// accepted.
    pub sb_sequence: u64,
    /// The active segment's base offset and random nonce.
    pub active_base: u64,
    pub nonce: u64,
}

/// A live record found at open, for its partition to replay.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplayRecord {
    pub seq: u64,
    pub key: JournalKey,
    /// Where `bytes` go in the active segment.
    pub position: u64,
    pub bytes: Vec<u8>,
}

/// A place in the record chain: where the next record goes and what it
/// must carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Cursor {
    offset: u64,
    seq: u64,
    prev: u64,
    turn: u64,
}

/// One journal write (a turn), durable or in flight.
#[derive(Debug)]
struct Span {
    start: u64,
    /// The cursor after it.
    end: Cursor,
    pids: Vec<u32>,
}

/// A checkpoint between its segment fdatasyncs and its header commit.
#[derive(Debug)]
struct Checkpoint {
    target: Cursor,
    committing: bool,
}

/// What `open` found in the ring, decoded.
struct Decoded {
    key: JournalKey,
    seq: u64,
    turn: u64,
    prev: u64,
    position: u64,
    len: usize,
    flags: u16,
    checksum: u64,
}

pub struct Journal {
    path: PathBuf,
    file: FileId,
    config: JournalConfig,
    /// The ring's end (the file size the header records).
    ring_end: u64,
    /// Mixed into every record's checksum (see `record_checksum`).
    nonce: u64,
    /// Where the next write goes.
    head: Cursor,
    /// Where replay starts (as the newest durable header names it).
    tail: Cursor,
    header_seq: u64,
    /// Writes since the tail, oldest first (the last may be in flight).
    spans: VecDeque<Span>,
    /// The turn being built: records at `turn_records` offsets of `turn_buf`.
    turn_buf: Option<AlignedBuf>,
    turn_records: Vec<(usize, u32)>,
    in_flight: bool,
    checkpoint: Option<Checkpoint>,
    /// Why checkpoints stopped (a segment fdatasync failed).
    frozen: Option<String>,
    fenced: Option<String>,
    header_buf: Option<AlignedBuf>,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal")
            .field("path", &self.path)
            .field("head", &self.head)
            .field("tail", &self.tail)
            .field("spans", &self.spans.len())
            .field("fenced", &self.fenced)
            .finish()
    }
}

impl Journal {
    /// Opens the journal at `path`, creating and preallocating it if
    /// missing (its directory must exist; the caller fsyncs it), and returns
    /// the live records for the partitions to replay, oldest first.
    pub fn open(
        io: &mut impl IoBackend,
        path: &Path,
        config: JournalConfig,
    ) -> Result<(Self, Vec<ReplayRecord>), JournalError> {
        config.validate()?;
        let err = |what, source| JournalError::Io {
            what,
            path: path.into(),
            source,
        };
        let exists = io.exists(path).map_err(|e| err("stat", e))?;
        let file = io
            .open_file(path, OpenMode::Create)
            .map_err(|e| err("open", e))?;
        let opened = if exists {
            Self::recover(io, path, file, &config)
        } else {
            Err(None)
        };
        let (g, tail, header_seq, records, head, spans) = match opened {
            Ok(found) => found,
            Err(Some(e)) => {
                io.close(file);
                return Err(e);
            }
            // New, or created by a boot that crashed before its header was
            // durable (all zeros): format it.
            Err(None) => match Self::format(io, path, file, &config) {
                Ok((g, tail)) => (g, tail, 1, Vec::new(), tail, VecDeque::new()),
                Err(e) => {
                    io.close(file);
                    return Err(e);
                }
            },
        };
        let turn_buf = AlignedBuf::new(config.turn_bytes_max);
        let journal = Self {
            path: path.into(),
            file,
            config,
            ring_end: g.ring_end,
            nonce: g.nonce,
            head,
            tail,
            header_seq,
            spans,
            turn_buf: Some(turn_buf),
            turn_records: Vec::new(),
            in_flight: false,
            checkpoint: None,
            frozen: None,
            fenced: None,
            header_buf: None,
        };
        Ok((journal, records))
    }

    /// Preallocates a new journal and writes both header copies durably.
    fn format(
        io: &mut impl IoBackend,
        path: &Path,
        file: FileId,
        config: &JournalConfig,
    ) -> Result<(Geometry, Cursor), JournalError> {
        let bytes = config.journal_bytes;
        if let Err(e) = io.allocate(file, bytes) {
            if e.raw_os_error() == Some(libc::ENOSPC) {
                return Err(JournalError::DiskFull {
                    path: path.into(),
                    bytes,
                });
            }
            return Err(JournalError::Io {
                what: "fallocate",
                path: path.into(),
                source: e,
            });
        }
        let random = || {
            crate::segment::new_nonce().map_err(|e| JournalError::Io {
                what: "getrandom",
                path: path.into(),
                source: e,
            })
        };
        let anchor = random()?;
        let g = Geometry {
            ring_end: bytes,
            nonce: random()?,
        };
        let tail = Cursor {
            offset: DATA_START,
            seq: 1,
            prev: anchor,
            turn: 1,
        };
        let mut sqes = Vec::with_capacity(3);
        for copy in 0..2u64 {
            let mut buf = AlignedBuf::new(BLOCK_SIZE);
            buf.set_len(BLOCK_SIZE);
            encode_header(&mut buf, 1, g, &tail);
            sqes.push(Sqe::linked(Op::Write {
                file,
                offset: copy * BLOCK_SIZE as u64,
                buf,
            }));
        }
        sqes.push(Sqe::new(Op::Fdatasync { file }));
        for c in io.submit(sqes) {
            if let Err(e) = c.result {
                return Err(JournalError::Io {
                    what: c.op.kind(),
                    path: path.into(),
                    source: e,
                });
            }
        }
        Ok((g, tail))
    }

    /// Reads the whole file and walks the chain from the newest header's
    /// tail. `Err(None)`: all zeros, a journal never formatted.
    #[allow(clippy::type_complexity)]
    fn recover(
        io: &mut impl IoBackend,
        path: &Path,
        file: FileId,
        config: &JournalConfig,
    ) -> Result<
        (
            Geometry,
            Cursor,
            u64,
            Vec<ReplayRecord>,
            Cursor,
            VecDeque<Span>,
        ),
        Option<JournalError>,
    > {
        let io_err = |what, source| {
            Some(JournalError::Io {
                what,
                path: path.into(),
                source,
            })
        };
        let size = io.file_size(file).map_err(|e| io_err("stat", e))?;
        let heads = read_at(io, file, 0, DATA_START as usize).map_err(|e| io_err("read", e))?;
        let best = [0usize, 1]
            .iter()
            .filter_map(|&c| decode_header(&heads[c * BLOCK_SIZE..(c + 1) * BLOCK_SIZE]))
            .max_by_key(|h| h.0);
        let Some((header_seq, g, tail)) = best else {
            if heads.iter().all(|&b| b == 0) {
                return Err(None);
            }
            return Err(Some(JournalError::Corruption {
                path: path.into(),
                position: 0,
                detail: "no valid header copy".into(),
            }));
        };
        let ring_end = g.ring_end;
        if ring_end > size || ring_end < DATA_START + BLOCK_SIZE as u64 {
            return Err(Some(JournalError::Corruption {
                path: path.into(),
                position: 0,
                detail: format!("header names {ring_end} bytes, the file has {size}"),
            }));
        }
        if ring_end != config.journal_bytes {
            tracing::warn!(path = %path.display(), ring_end, configured = config.journal_bytes,
                "journal_bytes differs from the file's size; keeping the file's");
        }
        let mut ring = Vec::with_capacity(ring_end as usize);
        let mut at = 0u64;
        while at < ring_end {
            let len = READ_CHUNK_BYTES.min((ring_end - at) as usize);
            let chunk = read_at(io, file, at, len).map_err(|e| io_err("read", e))?;
            ring.extend_from_slice(&chunk[..len]);
            at += len as u64;
        }
        let (records, head, spans, in_write) = walk(&ring, tail, g);
        // Turn N+1 is written only once turn N is durable: a record of a
        // later turn than the one the walk stopped in proves that turn was
        // acknowledged, so its bad record is damage, not a torn write.
        if let Some((position, turn)) = later_turn(&ring, g, in_write) {
            return Err(Some(JournalError::Corruption {
                path: path.into(),
                position: head.offset,
                detail: format!(
                    "the record chain breaks in turn {in_write}, but a record of turn {turn} follows at byte {position}"
                ),
            }));
        }
        Ok((g, tail, header_seq, records, head, spans))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn config(&self) -> &JournalConfig {
        &self.config
    }

    /// Why the journal stopped, if it did (a failed write or fdatasync).
    pub fn fenced(&self) -> Option<&str> {
        self.fenced.as_deref()
    }

    /// Why checkpoints stopped, if they did.
    pub fn frozen(&self) -> Option<&str> {
        self.frozen.as_deref()
    }

    /// Bytes of the ring holding live records (durable or in flight).
    pub fn used_bytes(&self) -> u64 {
        let Some(first) = self.spans.front() else {
            return 0;
        };
        let (start, head) = (first.start, self.head.offset);
        match head.cmp(&start) {
            std::cmp::Ordering::Greater => head - start,
            std::cmp::Ordering::Less => (self.ring_end - start) + (head - DATA_START),
            std::cmp::Ordering::Equal => self.ring_bytes(),
        }
    }

    /// Bytes of the ring (the file less its headers).
    pub fn ring_bytes(&self) -> u64 {
        self.ring_end - DATA_START
    }

    /// Whether a turn may add records now: not fenced, and no journal write
    /// in flight (one at a time, so a later turn is never durable, and
    /// acknowledged, before an earlier one).
    pub fn accepts(&self) -> bool {
        self.fenced.is_none() && !self.in_flight
    }

    /// Whether a journal write is in flight (not fenced).
    pub fn writing(&self) -> bool {
        self.in_flight && self.fenced.is_none()
    }

    /// Whether a record of `len_bytes` fits this turn: small enough
    /// (`append_bytes_max`), within the turn's bounds, and with room in the
    /// ring.
    pub fn fits(&self, len_bytes: usize) -> bool {
        let Some(buf) = self.turn_buf.as_ref() else {
            return false;
        };
        if !self.accepts()
            || len_bytes > self.config.append_bytes_max
            || self.turn_records.len() >= self.config.turn_records_max
        {
            return false;
        }
        let end = buf.len() + record_len(len_bytes);
        end <= self.config.turn_bytes_max && self.placement(align_up(end as u64)).is_some()
    }

    /// Adds a record of `bytes`, which go at `position` of `key`'s segment.
    /// The caller checked [`Journal::fits`].
    pub fn add(&mut self, key: JournalKey, position: u64, bytes: &[u8]) {
        assert!(self.fits(bytes.len()), "journal record does not fit");
        let Some(buf) = self.turn_buf.as_mut() else {
            unreachable!("fits() checked the turn buffer");
        };
        let at = buf.len();
        let mut header = [0u8; RECORD_HEADER_BYTES];
        header[0..4].copy_from_slice(&RECORD_MAGIC.to_le_bytes());
        header[32..36].copy_from_slice(&key.partition_id.to_le_bytes());
        header[36..40].copy_from_slice(&(bytes.len() as u32).to_le_bytes());
        header[40..48].copy_from_slice(&key.sb_sequence.to_le_bytes());
        header[48..56].copy_from_slice(&key.nonce.to_le_bytes());
        header[56..64].copy_from_slice(&key.active_base.to_le_bytes());
        header[64..72].copy_from_slice(&position.to_le_bytes());
        buf.extend_from_slice(&header);
        buf.extend_from_slice(bytes);
        let padded = at + record_len(bytes.len());
        buf.full_mut()[at + RECORD_HEADER_BYTES + bytes.len()..padded].fill(0);
        buf.set_len(padded);
        self.turn_records.push((at, key.partition_id));
    }

    /// Records added this turn.
    pub fn turn_records(&self) -> usize {
        self.turn_records.len()
    }

    /// Queues this turn's journal write and its fdatasync (linked: a failed
    /// write cancels it) onto `sqes`. Returns the entries added (0: no
    /// records). Completions go to [`Journal::complete_write`].
    pub fn prepare_write(&mut self, sqes: &mut Vec<Sqe>) -> usize {
        if self.turn_records.is_empty() {
            return 0;
        }
        assert!(self.accepts(), "one journal write at a time");
        let Some(mut buf) = self.turn_buf.take() else {
            unreachable!("records were added to the turn buffer");
        };
        let len = align_up(buf.len() as u64) as usize;
        let Some(offset) = self.placement(len as u64) else {
            unreachable!("fits() checked the room of every record");
        };
        let mut cursor = self.head;
        let last = self.turn_records.len() - 1;
        let mut pids = Vec::new();
        for (i, &(at, pid)) in self.turn_records.iter().enumerate() {
            let body_len = u32_at(&buf, at + 36);
            let end = at + RECORD_HEADER_BYTES + body_len as usize;
            let h = &mut buf[at..at + RECORD_HEADER_BYTES];
            let flags = if i == last { FLAG_LAST } else { 0 };
            h[4..6].copy_from_slice(&flags.to_le_bytes());
            h[8..16].copy_from_slice(&cursor.seq.to_le_bytes());
            h[16..24].copy_from_slice(&cursor.turn.to_le_bytes());
            h[24..32].copy_from_slice(&cursor.prev.to_le_bytes());
            let sum = record_checksum(self.nonce, &buf[at..end]);
            buf[at + 72..at + 80].copy_from_slice(&sum.to_le_bytes());
            cursor.seq += 1;
            cursor.prev = sum;
            if !pids.contains(&pid) {
                pids.push(pid);
            }
        }
        let used = buf.len();
        buf.full_mut()[used..len].fill(0);
        buf.set_len(len);
        cursor.offset = offset + len as u64;
        cursor.turn += 1;
        self.turn_records.clear();
        self.spans.push_back(Span {
            start: offset,
            end: cursor,
            pids,
        });
        self.head = cursor;
        self.in_flight = true;
        sqes.push(Sqe::linked(Op::Write {
            file: self.file,
            offset,
            buf,
        }));
        sqes.push(Sqe::new(Op::Fdatasync { file: self.file }));
        2
    }

    /// Takes the completions of [`Journal::prepare_write`]'s entries. A
    /// failure fences the journal: every partition with records in this
    /// write is fail-stop (the caller fences them with the error).
    pub fn complete_write(
        &mut self,
        completions: impl IntoIterator<Item = Completion>,
    ) -> Result<(), JournalError> {
        assert!(self.in_flight, "complete_write without prepare_write");
        self.in_flight = false;
        let mut failure = None;
        for c in completions {
            if let Err(e) = &c.result {
                failure.get_or_insert_with(|| format!("{} failed: {e}", c.op.kind()));
            }
            if let Some(mut buf) = c.op.into_buf() {
                buf.clear();
                self.turn_buf = Some(buf);
            }
        }
        if self.turn_buf.is_none() {
            self.turn_buf = Some(AlignedBuf::new(self.config.turn_bytes_max));
        }
        match failure {
            None => Ok(()),
            Some(cause) => Err(self.fence(cause)),
        }
    }

    /// A completion standing for the journal's fdatasync, for a partition
    /// store's `complete_flush` (which treats a failed one as its own).
    pub fn durable_completion(&self, result: &Result<(), JournalError>) -> Completion {
        Completion {
            op: Op::Fdatasync { file: self.file },
            result: match result {
                Ok(()) => Ok(0),
                Err(e) => Err(io::Error::other(e.to_string())),
            },
        }
    }

    fn fence(&mut self, cause: String) -> JournalError {
        tracing::error!(path = %self.path.display(), %cause, "journal fenced");
        self.fenced.get_or_insert(cause.clone());
        JournalError::Fenced {
            path: self.path.clone(),
            cause,
        }
    }

    /// Whether a checkpoint should start: the ring is more than half full,
    /// none is running, nothing is in flight, checkpoints are not frozen.
    pub fn checkpoint_due(&self) -> bool {
        self.fenced.is_none()
            && self.frozen.is_none()
            && self.checkpoint.is_none()
            && !self.in_flight
            && self.used_bytes() * 2 > self.ring_bytes()
    }

    /// Starts a checkpoint up to the head: returns the partitions whose
    /// active segments the caller must fdatasync (each, successfully)
    /// before [`Journal::prepare_checkpoint_commit`].
    pub fn begin_checkpoint(&mut self) -> Vec<u32> {
        assert!(self.checkpoint.is_none() && !self.in_flight);
        self.checkpoint = Some(Checkpoint {
            target: self.head,
            committing: false,
        });
        let mut pids: Vec<u32> = self
            .spans
            .iter()
            .flat_map(|s| s.pids.iter().copied())
            .collect();
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    /// Whether a checkpoint is running.
    pub fn checkpointing(&self) -> bool {
        self.checkpoint.is_some()
    }

    /// A partition's segment fdatasync failed: the checkpoint is dropped and
    /// no other starts (its records are needed by the restart's replay).
    pub fn abandon_checkpoint(&mut self, cause: String) {
        tracing::error!(path = %self.path.display(), %cause, "journal checkpoints stopped");
        self.checkpoint = None;
        self.frozen.get_or_insert(cause);
    }

    /// Queues the header naming the checkpoint's target as the tail (the
    /// copy the last header did not use) and its fdatasync.
    pub fn prepare_checkpoint_commit(&mut self, sqes: &mut Vec<Sqe>) -> usize {
        let Some(cp) = self.checkpoint.as_mut() else {
            panic!("prepare_checkpoint_commit without begin_checkpoint");
        };
        assert!(!cp.committing, "one header write at a time");
        cp.committing = true;
        let target = cp.target;
        let next_seq = self.header_seq + 1;
        let mut buf = self
            .header_buf
            .take()
            .unwrap_or_else(|| AlignedBuf::new(BLOCK_SIZE));
        buf.set_len(BLOCK_SIZE);
        let g = Geometry {
            ring_end: self.ring_end,
            nonce: self.nonce,
        };
        encode_header(&mut buf, next_seq, g, &target);
        sqes.push(Sqe::linked(Op::Write {
            file: self.file,
            offset: (next_seq % 2) * BLOCK_SIZE as u64,
            buf,
        }));
        sqes.push(Sqe::new(Op::Fdatasync { file: self.file }));
        2
    }

    /// Takes the header commit's completions: on success the ring up to the
    /// target is free. A failure fences the journal.
    pub fn complete_checkpoint(
        &mut self,
        completions: impl IntoIterator<Item = Completion>,
    ) -> Result<(), JournalError> {
        let Some(cp) = self.checkpoint.take() else {
            panic!("complete_checkpoint without a checkpoint");
        };
        let mut failure = None;
        for c in completions {
            if let Err(e) = &c.result {
                failure.get_or_insert_with(|| format!("header {} failed: {e}", c.op.kind()));
            }
            if let Some(buf) = c.op.into_buf() {
                self.header_buf = Some(buf);
            }
        }
        if let Some(cause) = failure {
            return Err(self.fence(cause));
        }
        self.header_seq += 1;
        self.tail = cp.target;
        while self
            .spans
            .front()
            .is_some_and(|s| s.end.seq <= cp.target.seq)
        {
            self.spans.pop_front();
        }
        Ok(())
    }

    /// Where a write of `len` bytes goes, if the ring has room: at the
    /// head, or at the ring's start when it does not fit before the end;
    /// never over a live record.
    fn placement(&self, len: u64) -> Option<u64> {
        let head = self.head.offset;
        let fits_end = head + len <= self.ring_end;
        let Some(first) = self.spans.front() else {
            return if fits_end {
                Some(head)
            } else {
                (DATA_START + len <= self.ring_end).then_some(DATA_START)
            };
        };
        let start = first.start;
        match head.cmp(&start) {
            std::cmp::Ordering::Greater if fits_end => Some(head),
            std::cmp::Ordering::Greater => (DATA_START + len <= start).then_some(DATA_START),
            std::cmp::Ordering::Less => (head + len <= start).then_some(head),
            std::cmp::Ordering::Equal => None,
        }
    }

    /// Closes the file (nothing is written: the records stay for the next
    /// open's replay, harmless for partitions that closed since).
    pub fn close(self, io: &mut impl IoBackend) {
        io.close(self.file);
    }
}

/// A record's bytes in the ring: header and body, 8-byte aligned.
fn record_len(body_bytes: usize) -> usize {
    (RECORD_HEADER_BYTES + body_bytes).next_multiple_of(8)
}

/// Checksum of a record: the journal's random nonce (never sent out, so a
/// producer cannot forge a record inside a batch), its header (checksum
/// field excluded) and body.
fn record_checksum(nonce: u64, record: &[u8]) -> u64 {
    let mut h = ringlog_protocol::checksum::Hasher::new();
    h.update(&nonce.to_le_bytes());
    h.update(&record[..72]);
    h.update(&record[RECORD_HEADER_BYTES..]);
    h.finish()
}

/// The ring's size and the file's record nonce (both fixed at format).
#[derive(Clone, Copy, Debug)]
struct Geometry {
    ring_end: u64,
    nonce: u64,
}

fn encode_header(buf: &mut [u8], header_seq: u64, g: Geometry, tail: &Cursor) {
    let ring_end = g.ring_end;
    buf.fill(0);
    buf[0..4].copy_from_slice(&HEADER_MAGIC.to_le_bytes());
    buf[4..6].copy_from_slice(&HEADER_VERSION.to_le_bytes());
    buf[8..16].copy_from_slice(&header_seq.to_le_bytes());
    buf[16..24].copy_from_slice(&ring_end.to_le_bytes());
    buf[24..32].copy_from_slice(&tail.offset.to_le_bytes());
    buf[32..40].copy_from_slice(&tail.seq.to_le_bytes());
    buf[40..48].copy_from_slice(&tail.prev.to_le_bytes());
    buf[48..56].copy_from_slice(&tail.turn.to_le_bytes());
    buf[56..64].copy_from_slice(&g.nonce.to_le_bytes());
    let sum = checksum(&buf[..HEADER_BYTES - 8]);
    buf[HEADER_BYTES - 8..HEADER_BYTES].copy_from_slice(&sum.to_le_bytes());
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

/// (header sequence, geometry, tail) of a valid header copy.
fn decode_header(b: &[u8]) -> Option<(u64, Geometry, Cursor)> {
    let valid = u32_at(b, 0) == HEADER_MAGIC
        && u16_at(b, 4) == HEADER_VERSION
        && u64_at(b, HEADER_BYTES - 8) == checksum(&b[..HEADER_BYTES - 8]);
    if !valid {
        return None;
    }
    let ring_end = u64_at(b, 16);
    let tail = Cursor {
        offset: u64_at(b, 24),
        seq: u64_at(b, 32),
        prev: u64_at(b, 40),
        turn: u64_at(b, 48),
    };
    let aligned = tail.offset.is_multiple_of(BLOCK_SIZE as u64);
    let g = Geometry {
        ring_end,
        nonce: u64_at(b, 56),
    };
    (aligned && tail.offset >= DATA_START && tail.offset < ring_end).then_some((
        u64_at(b, 8),
        g,
        tail,
    ))
}

/// The record at `at` if it continues the chain at `cursor`.
fn decode_record(ring: &[u8], at: u64, cursor: &Cursor, g: Geometry) -> Option<Decoded> {
    let Geometry { ring_end, nonce } = g;
    let at = at as usize;
    if at + RECORD_HEADER_BYTES > ring_end as usize {
        return None;
    }
    let h = &ring[at..at + RECORD_HEADER_BYTES];
    if u32_at(h, 0) != RECORD_MAGIC || u64_at(h, 8) != cursor.seq || u64_at(h, 24) != cursor.prev {
        return None;
    }
    let len = u32_at(h, 36) as usize;
    let end = at + RECORD_HEADER_BYTES + len;
    if end > ring_end as usize {
        return None;
    }
    let sum = record_checksum(nonce, &ring[at..end]);
    if u64_at(h, 72) != sum {
        return None;
    }
    Some(Decoded {
        key: JournalKey {
            partition_id: u32_at(h, 32),
            sb_sequence: u64_at(h, 40),
            nonce: u64_at(h, 48),
            active_base: u64_at(h, 56),
        },
        seq: cursor.seq,
        turn: u64_at(h, 16),
        prev: cursor.prev,
        position: u64_at(h, 64),
        len,
        flags: u16_at(h, 4),
        checksum: sum,
    })
}

/// Walks the chain from `tail`: the live records, the head after the last
/// one, the writes (turns) they came in, and the turn the walk stopped in
/// (the last record's, unless that one ended its write).
fn walk(
    ring: &[u8],
    tail: Cursor,
    g: Geometry,
) -> (Vec<ReplayRecord>, Cursor, VecDeque<Span>, u64) {
    let ring_end = g.ring_end;
    let mut in_write = tail.turn;
    let mut records = Vec::new();
    let mut spans: VecDeque<Span> = VecDeque::new();
    let mut cursor = tail;
    let mut at = tail.offset;
    loop {
        // The chain goes on right after the last record within a write; at
        // the next block after a write, or after a torn write's whole prefix
        // (where a restart's first write goes); at the ring's start where
        // the writer wrapped.
        let found = [at, align_up(at), DATA_START]
            .into_iter()
            .find_map(|from| decode_record(ring, from, &cursor, g).map(|d| (from, d)));
        let Some((from, d)) = found else { break };
        at = from;
        debug_assert_eq!((d.seq, d.prev), (cursor.seq, cursor.prev));
        let body = at as usize + RECORD_HEADER_BYTES;
        records.push(ReplayRecord {
            seq: d.seq,
            key: d.key,
            position: d.position,
            bytes: ring[body..body + d.len].to_vec(),
        });
        let end = at + record_len(d.len) as u64;
        in_write = if d.flags & FLAG_LAST != 0 {
            d.turn + 1
        } else {
            d.turn
        };
        let next = if d.flags & FLAG_LAST != 0 {
            align_up(end)
        } else {
            end
        };
        let new_span = spans.back().is_none_or(|s| s.end.turn != d.turn + 1);
        cursor = Cursor {
            offset: align_up(end),
            seq: d.seq + 1,
            prev: d.checksum,
            turn: d.turn + 1,
        };
        if new_span {
            spans.push_back(Span {
                start: at,
                end: cursor,
                pids: vec![d.key.partition_id],
            });
        } else if let Some(s) = spans.back_mut() {
            s.end = cursor;
            if !s.pids.contains(&d.key.partition_id) {
                s.pids.push(d.key.partition_id);
            }
        }
        at = if next >= ring_end { DATA_START } else { next };
        // Sequence numbers only grow, so the chain cannot loop; a guard.
        if records.len() as u64 > ring_end / RECORD_HEADER_BYTES as u64 {
            break;
        }
    }
    (records, cursor, spans, in_write)
}

/// The first whole record (magic and checksum) of a turn after `turn`
/// anywhere in the ring: (position, its turn).
fn later_turn(ring: &[u8], g: Geometry, turn: u64) -> Option<(u64, u64)> {
    let Geometry { ring_end, nonce } = g;
    let end = ring_end as usize;
    let magic = RECORD_MAGIC.to_le_bytes();
    (DATA_START as usize..end.saturating_sub(RECORD_HEADER_BYTES))
        .step_by(8)
        .filter(|&at| ring[at..at + 4] == magic && u64_at(ring, at + 16) > turn)
        .find_map(|at| {
            let len = u32_at(ring, at + 36) as usize;
            let rec_end = at + RECORD_HEADER_BYTES + len;
            let whole = rec_end <= end
                && u64_at(ring, at + 72) == record_checksum(nonce, &ring[at..rec_end]);
            whole.then_some((at as u64, u64_at(ring, at + 16)))
        })
}

/// Reads `len` bytes at `offset` (block-aligned) synchronously.
fn read_at(
    io: &mut impl IoBackend,
    file: FileId,
    offset: u64,
    len: usize,
) -> io::Result<AlignedBuf> {
    let buf = AlignedBuf::new(len);
    let cap = buf.capacity();
    let read = Op::Read {
        file,
        offset,
        len: cap,
        buf,
    };
    let mut completions = io.submit(vec![Sqe::new(read)]);
    let Some(c) = completions.pop() else {
        return Err(io::Error::other("no completion for a read"));
    };
    c.result?;
    let Some(mut buf) = c.op.into_buf() else {
        return Err(io::Error::other("a read without its buffer"));
    };
    // Past the end of file reads as zeros (the buffer was zeroed).
    buf.set_len(cap);
    Ok(buf)
}
