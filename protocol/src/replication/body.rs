//! Body codecs, one pair per command; layouts in the module docs.

use super::run::check_run;
use super::transfer;
use super::{
    Body, Command, Commit, DoViewChange, Envelope, EvictedReason, Header, Prepare, PrepareOk,
    Prepares, RangeEvicted, ReplicationError, ReplicationLimits, RequestPrepares, RequestStartView,
    StartView, ViewNotice,
};
use crate::batch::{
    encode_header, BatchHeader, BatchView, HEADER_LEN as BATCH_HEADER_LEN, RECORD_LEN_MIN,
};
use crate::reader::{usize_from, Reader};

// Version-1 sizes of the fixed part of each body.
const PREPARE_FIXED: usize = 16;
const PREPARE_OK_LEN: usize = 16;
const COMMIT_LEN: usize = 16;
const DO_VIEW_CHANGE_FIXED: usize = 40;
const START_VIEW_FIXED: usize = 40;
const REQUEST_START_VIEW_LEN: usize = 8;
const REQUEST_PREPARES_LEN: usize = 16;
const PREPARES_FIXED: usize = 16;
const RANGE_EVICTED_LEN: usize = 48;
/// The smallest valid batch: a header and one empty record.
const BATCH_LEN_MIN: usize = BATCH_HEADER_LEN + RECORD_LEN_MIN as usize;

/// Field reader over a body whose length was already checked, so running
/// out of bytes (impossible) still surfaces as a typed error, not a panic.
struct Fields<'a> {
    r: Reader<'a>,
    command: Command,
    body_len: usize,
    expected: usize,
}

impl<'a> Fields<'a> {
    /// `body` must be exactly `len` bytes (`exact`) or at least `len`.
    fn new(
        command: Command,
        body: &'a [u8],
        len: usize,
        exact: bool,
    ) -> Result<Self, ReplicationError> {
        if body.len() < len || (exact && body.len() != len) {
            return Err(ReplicationError::BodySize {
                command,
                body_len: body.len(),
                expected: len,
            });
        }
        Ok(Self {
            r: Reader::new(body),
            command,
            body_len: body.len(),
            expected: len,
        })
    }

    fn short(&self) -> ReplicationError {
        ReplicationError::BodySize {
            command: self.command,
            body_len: self.body_len,
            expected: self.expected,
        }
    }

    fn u64(&mut self) -> Result<u64, ReplicationError> {
        self.r.u64().ok_or_else(|| self.short())
    }

    fn u32(&mut self) -> Result<u32, ReplicationError> {
        self.r.u32().ok_or_else(|| self.short())
    }

    fn u8(&mut self) -> Result<u8, ReplicationError> {
        self.r.u8().ok_or_else(|| self.short())
    }

    fn zero_u32(&mut self, field: &'static str) -> Result<(), ReplicationError> {
        match self.u32()? {
            0 => Ok(()),
            _ => Err(ReplicationError::NonZeroReserved { field }),
        }
    }

    /// Everything not read yet.
    fn rest(&mut self) -> &'a [u8] {
        let n = self.r.remaining();
        self.r.take(n).unwrap_or_default()
    }
}

fn invalid(
    command: Command,
    field: &'static str,
    value: u64,
    reason: &'static str,
) -> ReplicationError {
    ReplicationError::Invalid {
        command,
        field,
        value,
        reason,
    }
}

fn too_many(command: Command, field: &'static str, value: u64, max: u32) -> ReplicationError {
    ReplicationError::LimitExceeded {
        command,
        field,
        value,
        max: u64::from(max),
    }
}

pub(super) fn decode<'a>(
    header: &Header,
    body: &'a [u8],
    limits: &ReplicationLimits,
) -> Result<Body<'a>, ReplicationError> {
    let env = &header.envelope;
    let command = header.command;
    Ok(match command {
        Command::Prepare => Body::Prepare(decode_prepare(env, body)?),
        Command::PrepareOk => {
            let mut f = Fields::new(command, body, PREPARE_OK_LEN, true)?;
            let ok = PrepareOk {
                op: f.u64()?,
                prepare_checksum: f.u64()?,
            };
            check_prepare_ok(&ok)?;
            Body::PrepareOk(ok)
        }
        Command::Commit => {
            let mut f = Fields::new(command, body, COMMIT_LEN, true)?;
            let commit = Commit {
                commit: f.u64()?,
                commit_checksum: f.u64()?,
            };
            check_commit(&commit)?;
            Body::Commit(commit)
        }
        Command::StartViewChange => {
            Fields::new(command, body, 0, true)?;
            Body::StartViewChange
        }
        Command::DoViewChange => Body::DoViewChange(decode_do_view_change(env, body, limits)?),
        Command::StartView => Body::StartView(decode_start_view(env, body, limits)?),
        Command::RequestStartView => {
            let mut f = Fields::new(command, body, REQUEST_START_VIEW_LEN, true)?;
            Body::RequestStartView(RequestStartView { nonce: f.u64()? })
        }
        Command::ViewNotice => {
            let mut f = Fields::new(command, body, REQUEST_START_VIEW_LEN, true)?;
            Body::ViewNotice(ViewNotice { nonce: f.u64()? })
        }
        Command::RequestPrepares => {
            let mut f = Fields::new(command, body, REQUEST_PREPARES_LEN, true)?;
            let request = RequestPrepares {
                op_min: f.u64()?,
                op_max: f.u64()?,
            };
            check_request_prepares(&request)?;
            Body::RequestPrepares(request)
        }
        Command::Prepares => Body::Prepares(decode_prepares(env, body, limits)?),
        Command::RangeEvicted => Body::RangeEvicted(decode_range_evicted(body)?),
        Command::RequestSnapshot => Body::RequestSnapshot(transfer::decode_request_snapshot(body)?),
        Command::SnapshotOffer => {
            Body::SnapshotOffer(transfer::decode_snapshot_offer(env, body, limits)?)
        }
        Command::RequestChunks => {
            Body::RequestChunks(transfer::decode_request_chunks(body, limits)?)
        }
        Command::Chunk => Body::Chunk(transfer::decode_chunk(body, limits)?),
        Command::ReleaseSnapshot => Body::ReleaseSnapshot(transfer::decode_release_snapshot(body)?),
    })
}

fn decode_prepare<'a>(env: &Envelope, body: &'a [u8]) -> Result<Prepare<'a>, ReplicationError> {
    let command = Command::Prepare;
    let mut f = Fields::new(command, body, PREPARE_FIXED, false)?;
    let op = f.u64()?;
    let commit = f.u64()?;
    let rest = f.rest();
    let batch = BatchView::parse(rest).map_err(|source| ReplicationError::Batch {
        command,
        index: 0,
        source,
    })?;
    if batch.as_bytes().len() != rest.len() {
        return Err(ReplicationError::BodySize {
            command,
            body_len: body.len(),
            expected: PREPARE_FIXED + batch.as_bytes().len(),
        });
    }
    let prepare = Prepare { op, commit, batch };
    check_prepare(env, &prepare)?;
    Ok(prepare)
}

/// The Prepare's fields must be the batch's own: a backup stores the batch
/// as stamped and never re-stamps it.
fn check_prepare(env: &Envelope, p: &Prepare<'_>) -> Result<(), ReplicationError> {
    let command = Command::Prepare;
    let h = p.batch.header();
    let pairs = [
        ("op", p.op, h.vsr_op),
        ("view", u64::from(env.view), u64::from(h.vsr_view)),
        (
            "partition_id",
            u64::from(env.partition_id),
            u64::from(h.partition_id),
        ),
    ];
    for (field, message, batch) in pairs {
        if message != batch {
            return Err(ReplicationError::Mismatch {
                command,
                field,
                message,
                batch,
            });
        }
    }
    if p.commit >= p.op {
        return Err(invalid(command, "commit", p.commit, "must be below op"));
    }
    Ok(())
}

fn check_prepare_ok(ok: &PrepareOk) -> Result<(), ReplicationError> {
    if ok.op == 0 {
        return Err(invalid(
            Command::PrepareOk,
            "op",
            0,
            "op 0 is never prepared",
        ));
    }
    Ok(())
}

fn check_commit(c: &Commit) -> Result<(), ReplicationError> {
    if c.commit == 0 && c.commit_checksum != 0 {
        return Err(invalid(
            Command::Commit,
            "commit_checksum",
            c.commit_checksum,
            "must be 0 when nothing is committed",
        ));
    }
    Ok(())
}

fn check_request_prepares(r: &RequestPrepares) -> Result<(), ReplicationError> {
    let command = Command::RequestPrepares;
    if r.op_min == 0 {
        return Err(invalid(command, "op_min", 0, "op 0 is never prepared"));
    }
    if r.op_max < r.op_min {
        return Err(invalid(command, "op_max", r.op_max, "is below op_min"));
    }
    Ok(())
}

/// Reads `count` suffix headers filling exactly the rest of the body.
fn decode_suffix(
    f: &mut Fields<'_>,
    limits: &ReplicationLimits,
) -> Result<Vec<BatchHeader>, ReplicationError> {
    let command = f.command;
    let count = f.u32()?;
    f.zero_u32("suffix reserved")?;
    if count > limits.suffix_headers_max {
        return Err(too_many(
            command,
            "suffix headers",
            u64::from(count),
            limits.suffix_headers_max,
        ));
    }
    let rest = f.rest();
    let expected = usize_from(count) * BATCH_HEADER_LEN;
    if rest.len() != expected {
        return Err(ReplicationError::BodySize {
            command,
            body_len: f.body_len,
            expected: f.expected + expected,
        });
    }
    let mut suffix = Vec::with_capacity(usize_from(count));
    for (index, bytes) in (0u32..).zip(rest.chunks_exact(BATCH_HEADER_LEN)) {
        let h = BatchHeader::decode(bytes).map_err(|source| ReplicationError::Batch {
            command,
            index,
            source,
        })?;
        suffix.push(h);
    }
    Ok(suffix)
}

/// A suffix is a run ending at `op`.
fn check_suffix(
    command: Command,
    env: &Envelope,
    view_max: u32,
    op: u64,
    suffix: &[BatchHeader],
) -> Result<(), ReplicationError> {
    check_run(command, env.partition_id, view_max, suffix)?;
    match suffix.last() {
        Some(last) if last.vsr_op != op => Err(ReplicationError::Mismatch {
            command,
            field: "op",
            message: op,
            batch: last.vsr_op,
        }),
        _ => Ok(()),
    }
}

fn decode_do_view_change(
    env: &Envelope,
    body: &[u8],
    limits: &ReplicationLimits,
) -> Result<DoViewChange, ReplicationError> {
    let mut f = Fields::new(Command::DoViewChange, body, DO_VIEW_CHANGE_FIXED, false)?;
    let log_view = f.u32()?;
    f.zero_u32("log_view reserved")?;
    let op = f.u64()?;
    let head_checksum = f.u64()?;
    let commit = f.u64()?;
    let suffix = decode_suffix(&mut f, limits)?;
    let dvc = DoViewChange {
        log_view,
        op,
        head_checksum,
        commit,
        suffix,
    };
    check_do_view_change(env, &dvc)?;
    Ok(dvc)
}

fn check_do_view_change(env: &Envelope, dvc: &DoViewChange) -> Result<(), ReplicationError> {
    let command = Command::DoViewChange;
    if dvc.log_view > env.view {
        return Err(invalid(
            command,
            "log_view",
            u64::from(dvc.log_view),
            "is above the message's view",
        ));
    }
    check_suffix(command, env, dvc.log_view, dvc.op, &dvc.suffix)?;
    check_head(command, dvc.op, dvc.head_checksum, &dvc.suffix)
}

/// The head checksum is the suffix's last header's, and 0 for op 0.
fn check_head(
    command: Command,
    op: u64,
    head_checksum: u64,
    suffix: &[BatchHeader],
) -> Result<(), ReplicationError> {
    match suffix.last() {
        Some(last) if last.header_checksum != head_checksum => Err(ReplicationError::Mismatch {
            command,
            field: "head_checksum",
            message: head_checksum,
            batch: last.header_checksum,
        }),
        None if op == 0 && head_checksum != 0 => Err(invalid(
            command,
            "head_checksum",
            head_checksum,
            "is not 0 at op 0",
        )),
        _ => Ok(()),
    }
}

fn decode_start_view(
    env: &Envelope,
    body: &[u8],
    limits: &ReplicationLimits,
) -> Result<StartView, ReplicationError> {
    let mut f = Fields::new(Command::StartView, body, START_VIEW_FIXED, false)?;
    let op = f.u64()?;
    let head_checksum = f.u64()?;
    let commit = f.u64()?;
    let nonce = f.u64()?;
    let suffix = decode_suffix(&mut f, limits)?;
    let sv = StartView {
        op,
        head_checksum,
        commit,
        nonce,
        suffix,
    };
    check_start_view(env, &sv)?;
    Ok(sv)
}

fn check_start_view(env: &Envelope, sv: &StartView) -> Result<(), ReplicationError> {
    let command = Command::StartView;
    if sv.commit > sv.op {
        return Err(invalid(command, "commit", sv.commit, "is above op"));
    }
    check_suffix(command, env, env.view, sv.op, &sv.suffix)?;
    check_head(command, sv.op, sv.head_checksum, &sv.suffix)
}

fn decode_prepares<'a>(
    env: &Envelope,
    body: &'a [u8],
    limits: &ReplicationLimits,
) -> Result<Prepares<'a>, ReplicationError> {
    let command = Command::Prepares;
    let mut f = Fields::new(command, body, PREPARES_FIXED, false)?;
    let commit = f.u64()?;
    let count = f.u32()?;
    f.zero_u32("prepares reserved")?;
    check_prepares_count(count, limits)?;
    let mut rest = f.rest();
    if rest.len() > usize_from(limits.prepares_bytes_max) {
        return Err(too_many(
            command,
            "batch bytes",
            rest.len() as u64,
            limits.prepares_bytes_max,
        ));
    }
    // Every batch takes at least BATCH_LEN_MIN bytes: a count the bytes
    // cannot hold is refused before the Vec is sized by it.
    if usize_from(count).saturating_mul(BATCH_LEN_MIN) > rest.len() {
        return Err(ReplicationError::CountExceedsBody {
            command,
            count,
            available: rest.len(),
        });
    }
    let mut batches = Vec::with_capacity(usize_from(count));
    for index in 0..count {
        let batch = BatchView::parse(rest).map_err(|source| ReplicationError::Batch {
            command,
            index,
            source,
        })?;
        rest = rest.get(batch.as_bytes().len()..).unwrap_or_default();
        batches.push(batch);
    }
    if !rest.is_empty() {
        return Err(ReplicationError::BodySize {
            command,
            body_len: body.len(),
            expected: body.len() - rest.len(),
        });
    }
    let prepares = Prepares { commit, batches };
    check_prepares(env, &prepares)?;
    Ok(prepares)
}

fn check_prepares_count(count: u32, limits: &ReplicationLimits) -> Result<(), ReplicationError> {
    let command = Command::Prepares;
    if count == 0 {
        // An empty answer would let a repair loop spin without progress.
        return Err(invalid(command, "count", 0, "a Prepares carries a batch"));
    }
    if count > limits.prepares_batches_max {
        return Err(too_many(
            command,
            "batches",
            u64::from(count),
            limits.prepares_batches_max,
        ));
    }
    Ok(())
}

fn check_prepares(env: &Envelope, p: &Prepares<'_>) -> Result<(), ReplicationError> {
    if p.batches.is_empty() {
        return Err(invalid(
            Command::Prepares,
            "count",
            0,
            "a Prepares carries a batch",
        ));
    }
    let headers = p.batches.iter().map(|b| b.header());
    check_run(Command::Prepares, env.partition_id, env.view, headers)
}

fn decode_range_evicted(body: &[u8]) -> Result<RangeEvicted, ReplicationError> {
    let command = Command::RangeEvicted;
    let mut f = Fields::new(command, body, RANGE_EVICTED_LEN, true)?;
    let op_min = f.u64()?;
    let op_max = f.u64()?;
    let op_held_min = f.u64()?;
    let log_start_offset = f.u64()?;
    let purge_generation = f.u64()?;
    let reason_byte = f.u8()?;
    let reason = EvictedReason::from_u8(reason_byte)
        .ok_or_else(|| invalid(command, "reason", u64::from(reason_byte), "unknown reason"))?;
    if f.rest().iter().any(|&b| b != 0) {
        return Err(ReplicationError::NonZeroReserved {
            field: "range evicted reserved",
        });
    }
    let evicted = RangeEvicted {
        op_min,
        op_max,
        op_held_min,
        log_start_offset,
        purge_generation,
        reason,
    };
    check_range_evicted(&evicted)?;
    Ok(evicted)
}

fn check_range_evicted(e: &RangeEvicted) -> Result<(), ReplicationError> {
    let command = Command::RangeEvicted;
    if e.op_max < e.op_min {
        return Err(invalid(command, "op_max", e.op_max, "is below op_min"));
    }
    if e.op_held_min <= e.op_min {
        return Err(invalid(
            command,
            "op_held_min",
            e.op_held_min,
            "the asked range is still held",
        ));
    }
    Ok(())
}

fn put_u64s(out: &mut Vec<u8>, values: &[u64]) {
    for v in values {
        out.extend_from_slice(&v.to_le_bytes());
    }
}

/// Appends the body, after the same checks the decoder runs.
pub(super) fn encode(
    env: &Envelope,
    body: &Body<'_>,
    out: &mut Vec<u8>,
) -> Result<(), ReplicationError> {
    match body {
        Body::Prepare(p) => {
            check_prepare(env, p)?;
            put_u64s(out, &[p.op, p.commit]);
            out.extend_from_slice(p.batch.as_bytes());
        }
        Body::PrepareOk(ok) => {
            check_prepare_ok(ok)?;
            put_u64s(out, &[ok.op, ok.prepare_checksum]);
        }
        Body::Commit(c) => {
            check_commit(c)?;
            put_u64s(out, &[c.commit, c.commit_checksum]);
        }
        Body::StartViewChange => {}
        Body::DoViewChange(dvc) => {
            check_do_view_change(env, dvc)?;
            out.extend_from_slice(&dvc.log_view.to_le_bytes());
            out.extend_from_slice(&0u32.to_le_bytes());
            put_u64s(out, &[dvc.op, dvc.head_checksum, dvc.commit]);
            encode_suffix(Command::DoViewChange, &dvc.suffix, out)?;
        }
        Body::StartView(sv) => {
            check_start_view(env, sv)?;
            put_u64s(out, &[sv.op, sv.head_checksum, sv.commit, sv.nonce]);
            encode_suffix(Command::StartView, &sv.suffix, out)?;
        }
        Body::RequestStartView(r) => put_u64s(out, &[r.nonce]),
        Body::ViewNotice(r) => put_u64s(out, &[r.nonce]),
        Body::RequestPrepares(r) => {
            check_request_prepares(r)?;
            put_u64s(out, &[r.op_min, r.op_max]);
        }
        Body::Prepares(p) => encode_prepares(env, p, out)?,
        Body::RangeEvicted(e) => {
            check_range_evicted(e)?;
            put_u64s(
                out,
                &[
                    e.op_min,
                    e.op_max,
                    e.op_held_min,
                    e.log_start_offset,
                    e.purge_generation,
                ],
            );
            out.push(e.reason as u8);
            out.extend_from_slice(&[0u8; 7]);
        }
        Body::RequestSnapshot(r) => transfer::encode_request_snapshot(r, out)?,
        Body::SnapshotOffer(o) => transfer::encode_snapshot_offer(env, o, out)?,
        Body::RequestChunks(r) => transfer::encode_request_chunks(r, out)?,
        Body::Chunk(c) => transfer::encode_chunk(c, out)?,
        Body::ReleaseSnapshot(r) => transfer::encode_release_snapshot(r, out)?,
    }
    Ok(())
}

fn count_u32(command: Command, len: usize) -> Result<u32, ReplicationError> {
    u32::try_from(len).map_err(|_| too_many(command, "count", len as u64, u32::MAX))
}

/// Writes the count and the headers, refusing a header the decoder would
/// refuse or whose `header_checksum` is not the one its fields seal to
/// (the run checks trust that field).
fn encode_suffix(
    command: Command,
    suffix: &[BatchHeader],
    out: &mut Vec<u8>,
) -> Result<(), ReplicationError> {
    out.extend_from_slice(&count_u32(command, suffix.len())?.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    for (index, h) in (0u32..).zip(suffix) {
        let mut bytes = [0u8; BATCH_HEADER_LEN];
        encode_header(h, &mut bytes);
        let decoded = BatchHeader::decode(&bytes).map_err(|source| ReplicationError::Batch {
            command,
            index,
            source,
        })?;
        if decoded != *h {
            return Err(ReplicationError::BrokenRun {
                command,
                index,
                reason: "has a header_checksum its fields do not seal to",
            });
        }
        out.extend_from_slice(&bytes);
    }
    Ok(())
}

fn encode_prepares(
    env: &Envelope,
    p: &Prepares<'_>,
    out: &mut Vec<u8>,
) -> Result<(), ReplicationError> {
    check_prepares(env, p)?;
    put_u64s(out, &[p.commit]);
    out.extend_from_slice(&count_u32(Command::Prepares, p.batches.len())?.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    for batch in &p.batches {
        out.extend_from_slice(batch.as_bytes());
    }
    Ok(())
}
