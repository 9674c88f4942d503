//! Walking a segment file batch by batch with bounded memory.
//!
//! Recovery, index rebuilds and reads all need the same thing: read a segment
//! from some position in chunks and parse consecutive batches until the data
//! ends or stops parsing. The walker owns one aligned buffer, at most
//! `chunk_bytes` or one batch (whichever is larger) plus a block.

use ringlog_protocol::{BatchHeader, BatchView, HEADER_LEN};

use super::ChainPoint;
use crate::io::{align_down, align_up, AlignedBuf, FileId, IoBackend, Op, Sqe};

/// The first batch overlapping the block a walk ends in, and the chain
/// point before it: where a re-read that verifies the end block's bytes
/// starts (see `open::verified_tail`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct TailFrom {
    pub(crate) position: u64,
    pub(crate) chain: ChainPoint,
}

impl TailFrom {
    /// Notes the batch of `len` bytes at `position`, `chain` the point
    /// before it. Only a batch holding a block boundary can hold the start
    /// of the block the walk ends in; every batch after the last such one
    /// lies inside that block.
    pub(crate) fn observe(&mut self, position: u64, len: usize, chain: &ChainPoint) {
        if align_up(position) < position + len as u64 {
            *self = Self {
                position,
                chain: *chain,
            };
        }
    }
}

/// Why a walk stopped before its limit.
#[derive(Debug)]
pub(crate) enum WalkStop {
    /// Reached the limit or the end of the file at `position`.
    End,
    /// The bytes at `position` are not a valid batch (torn, garbage or
    /// corrupt: the caller decides which by where it is).
    Invalid { position: u64, reason: String },
    /// A `walk_until` stop condition held (the caller has what it needs).
    Visitor,
}

/// What the visitor says after each batch.
pub(crate) enum Visit {
    Continue,
    /// The batch parses but does not belong here (offset or chain break).
    Reject(String),
}

pub(crate) struct Walker {
    file: FileId,
    buf: AlignedBuf,
    /// File position of `buf[0]`.
    buf_start: u64,
    chunk_bytes: usize,
}

impl Walker {
    /// A walker reading into `buf` (grown if needed): callers that walk
    /// often reuse one pre-touched buffer instead of faulting in fresh pages.
    pub(crate) fn with_buf(file: FileId, chunk_bytes: usize, mut buf: AlignedBuf) -> Self {
        buf.clear();
        Self {
            file,
            buf,
            buf_start: 0,
            chunk_bytes: align_up(chunk_bytes as u64) as usize,
        }
    }

    /// A walker whose first read was already made: `buf` holds the file's
    /// bytes from `buf_start` (a read-ahead). Walks past them read as
    /// usual, into the same buffer.
    pub(crate) fn with_read(
        file: FileId,
        chunk_bytes: usize,
        buf: AlignedBuf,
        buf_start: u64,
    ) -> Self {
        debug_assert_eq!(buf_start, align_down(buf_start), "reads are aligned");
        Self {
            file,
            buf,
            buf_start,
            chunk_bytes: align_up(chunk_bytes as u64) as usize,
        }
    }

    /// The buffered bytes `[position, position + len)`, if the last read
    /// covered them.
    pub(crate) fn buffered(&self, position: u64, len: usize) -> Option<&[u8]> {
        let at = usize::try_from(position.checked_sub(self.buf_start)?).ok()?;
        self.buf.get(at..at.checked_add(len)?)
    }

    /// Hands the buffer back for reuse.
    pub(crate) fn into_buf(self) -> AlignedBuf {
        self.buf
    }

    /// Makes `[position, position + len)` available in the buffer, reading
    /// ahead at most to `limit` (the bytes past it are not the walk's: the
    /// rest of a segment's capacity, its frontier record slots); returns
    /// false if the file ends first.
    fn ensure(
        &mut self,
        io: &mut impl IoBackend,
        (position, len): (u64, usize),
        limit: u64,
    ) -> std::io::Result<bool> {
        debug_assert!(position + len as u64 <= limit);
        let have_end = self.buf_start + self.buf.len() as u64;
        if position >= self.buf_start && position + len as u64 <= have_end {
            return Ok(true);
        }
        let start = align_down(position);
        let needed = align_up(position + len as u64 - start);
        let ahead = (self.chunk_bytes as u64).min(align_up(limit) - start);
        let want = needed.max(ahead) as usize;
        let mut buf = std::mem::replace(&mut self.buf, AlignedBuf::new(0));
        if buf.capacity() < want {
            buf = AlignedBuf::new(want);
        }
        let read = Op::Read {
            file: self.file,
            offset: start,
            len: want,
            buf,
        };
        let mut completions = io.submit(vec![Sqe::new(read)]);
        let c = completions.pop().expect("one completion per op");
        self.buf = c.op.into_buf().expect("read returns its buffer");
        self.buf_start = start;
        let n = c.result?;
        Ok(start + n as u64 >= position + len as u64)
    }

    /// Walks batches from `position` while they end at or before `limit`,
    /// calling `visit` with each batch's position and view.
    pub(crate) fn walk(
        &mut self,
        io: &mut impl IoBackend,
        position: u64,
        limit: u64,
        visit: impl FnMut(u64, &BatchView<'_>) -> Visit,
    ) -> std::io::Result<(u64, WalkStop)> {
        self.walk_until(io, position, limit, |_| false, visit)
    }

    /// [`walk`](Walker::walk), stopping (with [`WalkStop::Visitor`]) before
    /// reading the body of the first batch whose header `stop_before`
    /// accepts, so a reader with enough bytes does not fetch one more batch.
    pub(crate) fn walk_until(
        &mut self,
        io: &mut impl IoBackend,
        mut position: u64,
        limit: u64,
        mut stop_before: impl FnMut(&BatchHeader) -> bool,
        mut visit: impl FnMut(u64, &BatchView<'_>) -> Visit,
    ) -> std::io::Result<(u64, WalkStop)> {
        loop {
            if position + HEADER_LEN as u64 > limit {
                // No batch fits before the limit; callers that expect to end
                // exactly at it compare the returned position.
                return Ok((position, WalkStop::End));
            }
            if !self.ensure(io, (position, HEADER_LEN), limit)? {
                return Ok((position, WalkStop::End));
            }
            let at = (position - self.buf_start) as usize;
            let header = match BatchHeader::decode(&self.buf[at..]) {
                Ok(h) => h,
                Err(e) => return Ok((position, invalid(position, e))),
            };
            if stop_before(&header) {
                return Ok((position, WalkStop::Visitor));
            }
            let total = header.total_len();
            if position + total as u64 > limit {
                return Ok((
                    position,
                    WalkStop::Invalid {
                        position,
                        reason: format!("batch of {total} bytes runs past {limit}"),
                    },
                ));
            }
            if !self.ensure(io, (position, total), limit)? {
                return Ok((
                    position,
                    WalkStop::Invalid {
                        position,
                        reason: "file ends inside a batch".into(),
                    },
                ));
            }
            let at = (position - self.buf_start) as usize;
            let view = match BatchView::parse(&self.buf[at..at + total]) {
                Ok(v) => v,
                Err(e) => return Ok((position, invalid(position, e))),
            };
            match visit(position, &view) {
                Visit::Continue => position += total as u64,
                Visit::Reject(reason) => {
                    return Ok((position, WalkStop::Invalid { position, reason }))
                }
            }
        }
    }
}

fn invalid(position: u64, e: impl std::fmt::Display) -> WalkStop {
    WalkStop::Invalid {
        position,
        reason: e.to_string(),
    }
}
