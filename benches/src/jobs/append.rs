//! The storage-level append job: group-committed appends straight into
//! partition stores over one io_uring backend, as a shard would do them.
//!
//! Pipelined like the shard's group commit: while round N's flushes (one
//! write + one fdatasync per partition, linked, all in one non-blocking
//! submission) are in the kernel, the job restamps and appends round N+1's
//! batches (the store's body check, the copy into the write buffer and the
//! segment hashing); the moment round N completes, it submits round N+1's
//! flushes. Each partition has one flush in flight at a time, so its file
//! sees the same qd1 write + fdatasync stream as fio's, with the append CPU
//! off the device's critical path. An append that would have to flush
//! first (a segment roll; a full write buffer) waits for the flush in flight
//! ([`PartitionStore::append_waits_for_flush`]). A batch's ack latency is the
//! time from its `append()` to the completion (reaped) of the flush that
//! made it durable.
//!
//! Batches are built once per partition and restamped for each append
//! (new base offset, op and previous checksum; the header checksum is
//! recomputed, the body is not rehashed), which is what a primary does.
//! They are appended in place ([`PartitionStore::append_owned`]): each sits
//! in a write buffer lent by the partition's pool at the position it is
//! written from, so the store does not copy it. A lent buffer that comes
//! back from a completed flush still holds the partition's batch where the
//! next one goes (whole-block batches always start a block), so it is only
//! restamped; any other (fresh, or used at another position) is filled from
//! the built batch first, as a connection's read would fill it. The store
//! verifies every body before writing it, so a stale one fails the run.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ringlog_protocol::{restamp, BatchBuilder, BatchError, BatchHeader, Record, Stamp, HEADER_LEN};
use ringlog_storage::io::uring::UringBackend;
use ringlog_storage::io::{BatchBuf, BatchId, IoBackend, PoolExhausted, BLOCK_SIZE};
use ringlog_storage::store::{PartitionStore, PoolConfig, StoreConfig, StoreError, StorePool};

use crate::stats::{CpuMeter, LatencyRecorder, RunSummary, Timeline};

/// Encoded size of a record with an empty key, no headers and an empty value
/// (length field included); matches the protocol's record layout.
pub const RECORD_OVERHEAD_BYTES: usize = 4 + 4 + 4 + 4 + 2 + 2 + 4;

/// io_uring SQ entries for the job's backend.
pub const RING_ENTRIES: u32 = 256;

#[derive(Debug, thiserror::Error)]
pub enum AppendError {
    #[error(
        "batch size {batch_size} is too small for one {record_size}-byte record \
         (needs at least {min} bytes: {HEADER_LEN}-byte header, {RECORD_OVERHEAD_BYTES}-byte record framing)"
    )]
    BatchTooSmall {
        batch_size: usize,
        record_size: usize,
        min: usize,
    },
    #[error("building the batch failed: {0}")]
    Batch(#[from] BatchError),
    #[error("io_uring setup failed: {0}")]
    Ring(#[source] std::io::Error),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("lending a write buffer failed: {0}")]
    Pool(#[from] PoolExhausted),
}

#[derive(Debug, Clone)]
pub struct AppendConfig {
    /// Partition stores go in `dir/p<i>`.
    pub dir: PathBuf,
    pub partitions: u32,
    /// Encoded bytes of each batch, header included (what lands on disk).
    pub batch_size: usize,
    /// Value bytes of each record.
    pub record_size: usize,
    /// Stop after this long...
    pub duration: Duration,
    /// ...or after this many batch bytes over all partitions, if set.
    pub total_bytes: Option<u64>,
    pub segment_size: u64,
    /// Per-partition retention (StoreConfig::retention_bytes). When set, the
    /// job applies retention after each round that leaves a partition above
    /// it, as a shard's maintenance turn would; removed segment files are
    /// recycled, so later segments overwrite written blocks.
    pub retention_bytes: Option<u64>,
    /// Batch bytes (over all partitions) appended un-timed before the timed
    /// run, e.g. to fill the recycled-file pool through retention.
    pub warmup_bytes: u64,
    /// Un-timed rounds for this long after the warm-up bytes, before the
    /// timed run (fio's ramp_time).
    pub ramp: Duration,
}

impl AppendConfig {
    pub fn partition_dir(&self, index: u32) -> PathBuf {
        self.dir.join(format!("p{index}"))
    }
}

/// The result of one run.
#[derive(Debug, Clone)]
pub struct AppendResult {
    /// bytes/ios/runtime over all partitions; lat is per-batch ack latency.
    pub summary: RunSummary,
    pub records: u64,
    pub records_per_batch: u32,
}

/// One batch of `partition_id`, exactly `batch_size` bytes long: as many
/// `record_size`-byte values as fit, the last one padded to fill the batch.
/// Returns the batch and its record count.
pub fn build_batch(
    partition_id: u32,
    batch_size: usize,
    record_size: usize,
    timestamp_ms: u64,
) -> Result<(Vec<u8>, u32), AppendError> {
    let record_bytes = record_size + RECORD_OVERHEAD_BYTES;
    let min = HEADER_LEN + record_bytes;
    if batch_size < min {
        return Err(AppendError::BatchTooSmall {
            batch_size,
            record_size,
            min,
        });
    }
    let body = batch_size - HEADER_LEN;
    let count = body / record_bytes;
    let padding = body - count * record_bytes;

    let mut value = vec![0u8; record_size + padding];
    // Incompressible-looking payload; the contents do not matter to the disk.
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15 ^ u64::from(partition_id);
    for b in value.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }

    let mut builder = BatchBuilder::new(partition_id);
    for i in 0..count {
        let len = if i + 1 == count {
            record_size + padding
        } else {
            record_size
        };
        builder.push(&Record {
            key: &[],
            headers: &[],
            value: &value[..len],
            timestamp_ms,
        })?;
    }
    let records = builder.record_count();
    let bytes = builder.finish(&Stamp::default())?;
    debug_assert_eq!(bytes.len(), batch_size);
    Ok((bytes, records))
}

/// The store config for a run: the requested segment size, and a write
/// buffer large enough for one batch plus the rewritten tail block.
pub fn store_config(cfg: &AppendConfig) -> StoreConfig {
    StoreConfig {
        retention_bytes: cfg.retention_bytes,
        ..store_config_for(cfg.batch_size, cfg.segment_size)
    }
}

/// The default store config with `segment_size` segments and a write buffer
/// sized for `batch_size` batches (shared with the transfer job's stores).
pub fn store_config_for(batch_size: usize, segment_size: u64) -> StoreConfig {
    let defaults = StoreConfig::default();
    let needed = (batch_size + 2 * BLOCK_SIZE).div_ceil(BLOCK_SIZE) * BLOCK_SIZE;
    StoreConfig {
        segment_size_bytes: segment_size,
        // The default, shrunk for small segments, grown for large batches.
        write_buffer_bytes: defaults
            .write_buffer_bytes
            .min(usize::try_from(segment_size).unwrap_or(usize::MAX))
            .max(needed),
        ..defaults
    }
}

/// Creates the partition stores under `cfg.dir` (which must exist; the
/// `p<i>` directories must not) and appends until the duration or the byte
/// budget runs out.
pub fn run(cfg: &AppendConfig) -> Result<AppendResult, AppendError> {
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let mut batches = Vec::with_capacity(cfg.partitions as usize);
    let mut records_per_batch = 0;
    for p in 0..cfg.partitions {
        let (bytes, records) = build_batch(p, cfg.batch_size, cfg.record_size, now_ms)?;
        records_per_batch = records;
        batches.push(bytes);
    }

    let mut io = UringBackend::new(RING_ENTRIES).map_err(AppendError::Ring)?;
    let store_cfg = store_config(cfg);
    // Each partition's pool: its write buffers in an arena the ring
    // registers (WRITE_FIXED: no page pinning per write), two of them: the
    // one in the flush in flight and the one being appended to.
    let pool_cfg = PoolConfig {
        write_buffers_fixed: 2,
        ..PoolConfig::private(&store_cfg)
    };
    let mut stores = Vec::with_capacity(cfg.partitions as usize);
    let mut pools = Vec::with_capacity(cfg.partitions as usize);
    for p in 0..cfg.partitions {
        // A store's own (private) pool, kept to lend batch buffers from.
        let dir = cfg.partition_dir(p);
        let pool = StorePool::new(dir.join("recycle"), pool_cfg.clone());
        let store = PartitionStore::create_in(&mut io, &dir, p, store_cfg.clone(), pool.clone())?;
        stores.push(store);
        pools.push(pool);
    }
    // Refused (a warning says why): plain writes, which pin pages per I/O.
    let regions = pools
        .iter()
        .filter_map(|p| p.write_buffers().fixed_region())
        .collect();
    io.register_fixed_buffers(regions);

    let mut job = Job {
        io,
        stores,
        pools,
        batches,
        ops: vec![0; cfg.partitions as usize],
        waiting: vec![VecDeque::with_capacity(2); cfg.partitions as usize],
        flight: None,
        retention_bytes: cfg.retention_bytes,
        now_ms,
    };
    let round_bytes = cfg.batch_size as u64 * u64::from(cfg.partitions);

    // Untimed warm-up, drained so the timed region starts with nothing in
    // flight.
    let mut warm = LatencyRecorder::new();
    let mut warmed = 0u64;
    while warmed < cfg.warmup_bytes {
        job.round(&mut warm)?;
        warmed += round_bytes;
    }
    let ramp_start = Instant::now();
    while ramp_start.elapsed() < cfg.ramp {
        job.round(&mut warm)?;
    }
    job.wait_flight(&mut warm)?;

    let mut lat = LatencyRecorder::new();
    let mut bytes = 0u64;
    let mut acked = 0u64;
    let mut ios = 0u64;
    let cpu = CpuMeter::start();
    let start = Instant::now();
    let mut timeline = Timeline::starting(start);
    loop {
        if start.elapsed() >= cfg.duration || cfg.total_bytes.is_some_and(|t| bytes >= t) {
            break;
        }
        let done = job.round(&mut lat)?;
        timeline.record(Instant::now(), done);
        acked += done;
        bytes += round_bytes;
        ios += u64::from(cfg.partitions);
    }
    // The last round's flush is part of the timed run.
    let done = job.wait_flight(&mut lat)?;
    timeline.record(Instant::now(), done);
    acked += done;
    let runtime = start.elapsed();
    let cpu = cpu.usage();
    debug_assert_eq!(acked, bytes, "every timed append acknowledged");
    // Untimed: checkpoint the frontier and close the files.
    job.close()?;

    Ok(AppendResult {
        summary: RunSummary::from_counts(bytes, ios, runtime, lat.summary())
            .with_cpu(cpu)
            .with_timeline(timeline),
        records: ios * u64::from(records_per_batch),
        records_per_batch,
    })
}

/// The state of a running job.
struct Job {
    io: UringBackend,
    stores: Vec<PartitionStore>,
    /// Each store's pool, which lends the buffers batches are built in.
    pools: Vec<StorePool>,
    /// One prebuilt batch per partition: what each append's buffer holds.
    batches: Vec<Vec<u8>>,
    ops: Vec<u64>,
    /// Per partition, appends not durable yet: (next offset, append time).
    /// At most two: one in the flush in flight, one appended behind it.
    waiting: Vec<VecDeque<(u64, Instant)>>,
    /// The group commit in flight: its batch and each partition's entry
    /// count in it (0: nothing of that partition).
    flight: Option<(BatchId, Vec<usize>)>,
    retention_bytes: Option<u64>,
    now_ms: u64,
}

impl Job {
    /// Appends one batch to every partition while the previous round's
    /// group commit is in flight, waits for that commit (acknowledging its
    /// batches), applies retention where due (nothing is in flight then)
    /// and submits this round's group commit without waiting for it.
    /// Returns the batch bytes acknowledged.
    fn round(&mut self, lat: &mut LatencyRecorder) -> Result<u64, AppendError> {
        let mut acked = 0;
        for i in 0..self.stores.len() {
            acked += self.append_one(i, lat)?;
        }
        acked += self.wait_flight(lat)?;
        if let Some(max) = self.retention_bytes {
            for store in &mut self.stores {
                if store.size_bytes() > max {
                    store.apply_retention(&mut self.io, self.now_ms)?;
                }
            }
        }
        self.submit_flight()?;
        Ok(acked)
    }

    /// Restamps and appends partition `i`'s batch; one that would have to
    /// flush first waits for the flush in flight. Returns the bytes
    /// acknowledged meanwhile (that wait, or the append's own flush).
    fn append_one(&mut self, i: usize, lat: &mut LatencyRecorder) -> Result<u64, AppendError> {
        let mut acked = 0;
        if self.stores[i].append_waits_for_flush(self.batches[i].len()) {
            acked += self.wait_flight(lat)?;
        }
        let store = &mut self.stores[i];
        self.ops[i] += 1;
        let stamp = Stamp {
            base_offset: store.next_offset(),
            vsr_op: self.ops[i],
            vsr_view: 0,
            prev_checksum: store.last_checksum(),
        };
        let mut buf = self.pools[i].lend_batch(store.batch_lead_bytes())?;
        fill_unless_held(&mut buf, &self.batches[i]);
        restamp(buf.batch_mut(), &stamp)?;
        let appended_at = Instant::now();
        let appended = store
            .append_owned(&mut self.io, buf)
            .map_err(|refused| refused.error)?;
        self.waiting[i].push_back((appended.next_offset, appended_at));
        debug_assert!(self.waiting[i].len() <= 2);
        // A roll or a full write buffer flushes inside the append.
        Ok(acked + self.settle(i, lat))
    }

    /// Queues every partition's flush in one submission, not waiting.
    fn submit_flight(&mut self) -> Result<(), AppendError> {
        debug_assert!(self.flight.is_none(), "one group commit at a time");
        let mut sqes = Vec::with_capacity(3 * self.stores.len());
        let mut counts = Vec::with_capacity(self.stores.len());
        for store in &mut self.stores {
            counts.push(store.prepare_flush(&mut sqes)?);
        }
        if !sqes.is_empty() {
            self.flight = Some((self.io.submit_nowait(sqes), counts));
        }
        Ok(())
    }

    /// Waits (blocked in the ring) for the group commit in
    /// flight, if any, completes every partition's flush in it and
    /// acknowledges what became durable. Returns the bytes acknowledged.
    fn wait_flight(&mut self, lat: &mut LatencyRecorder) -> Result<u64, AppendError> {
        let Some((id, counts)) = self.flight.take() else {
            return Ok(0);
        };
        let completions = loop {
            // Only this batch is in flight: one wait in the ring for all of
            // its ops (the kernel submits the fdatasync linked behind the
            // write inside it), then its completions.
            let reaped = self.io.wait_and_reap(WAKE_TIMEOUT);
            if let Some((_, completions)) = reaped.into_iter().find(|(b, _)| *b == id) {
                break completions;
            }
        };
        let mut completions = completions.into_iter();
        let mut first_error = None;
        for (store, n) in self.stores.iter_mut().zip(counts) {
            if n > 0 {
                if let Err(e) = store.complete_flush(completions.by_ref().take(n)) {
                    first_error.get_or_insert(e);
                }
            }
        }
        if let Some(e) = first_error {
            return Err(e.into());
        }
        let mut acked = 0;
        for i in 0..self.stores.len() {
            acked += self.settle(i, lat);
        }
        Ok(acked)
    }

    /// Acknowledges partition `i`'s appends that are durable now: records
    /// their latency and returns their bytes.
    fn settle(&mut self, i: usize, lat: &mut LatencyRecorder) -> u64 {
        let durable = self.stores[i].durable().next_offset;
        let now = Instant::now();
        let mut acked = 0;
        while let Some(&(next_offset, at)) = self.waiting[i].front() {
            if next_offset > durable {
                break;
            }
            self.waiting[i].pop_front();
            lat.record(now - at);
            acked += self.batches[i].len() as u64;
        }
        acked
    }

    /// Waits for the flush in flight, then checkpoints the frontier and
    /// closes every store.
    fn close(mut self) -> Result<(), AppendError> {
        self.wait_flight(&mut LatencyRecorder::new())?;
        let Job { mut io, stores, .. } = self;
        for store in stores {
            store.close(&mut io)?;
        }
        Ok(())
    }
}

/// Makes `buf` hold `batch` (up to its stamp): as it is when the buffer
/// already holds this partition's batch (its header decodes to the same
/// length and body checksum), else by copying it in.
fn fill_unless_held(buf: &mut BatchBuf, batch: &[u8]) {
    let held = |buf: &BatchBuf| {
        let (Ok(theirs), Ok(ours)) = (BatchHeader::decode(buf.batch()), BatchHeader::decode(batch))
        else {
            return false;
        };
        theirs.total_len() == ours.total_len() && theirs.body_checksum == ours.body_checksum
    };
    if batch.len() <= buf.batch_capacity() {
        buf.set_batch_len(batch.len());
        if held(buf) {
            return;
        }
    }
    buf.set_batch_len(0);
    buf.extend_from_slice(batch);
}

/// Longest one wait in the ring blocks before the job reaps again: a
/// bound on a stall, never a hang.
const WAKE_TIMEOUT: Duration = Duration::from_millis(100);

#[cfg(test)]
mod tests {
    use super::*;
    use ringlog_protocol::BatchView;

    #[test]
    fn batches_are_exactly_the_requested_size() {
        for (batch, record) in [(64 << 10, 1024), (1 << 20, 1024), (4096, 100), (4096, 3000)] {
            let (bytes, records) = build_batch(3, batch, record, 1_000).unwrap();
            assert_eq!(bytes.len(), batch);
            let expected = (batch - HEADER_LEN) / (record + RECORD_OVERHEAD_BYTES);
            assert_eq!(records as usize, expected);
            let view = BatchView::parse(&bytes).unwrap();
            assert_eq!(view.header().partition_id, 3);
            assert_eq!(view.header().record_count, records);
        }
    }

    #[test]
    fn pipelined_rounds_wait_at_rolls_and_acknowledge_every_batch() {
        // 64 KiB batches into 192 KiB segments over 3 partitions: an append
        // rolls every third round, each with a flush in flight, which the
        // job must wait for; every batch is acknowledged and on disk.
        let tmp = tempfile::tempdir().unwrap();
        let cfg = AppendConfig {
            dir: tmp.path().to_path_buf(),
            partitions: 3,
            batch_size: 64 << 10,
            record_size: 1024,
            duration: Duration::from_secs(30),
            total_bytes: Some(3 * (2 << 20)),
            segment_size: 192 << 10,
            retention_bytes: Some(512 << 10),
            warmup_bytes: 3 * (1 << 20),
            ramp: Duration::ZERO,
        };
        let result = run(&cfg).unwrap();
        let batches = 3 * 32;
        assert_eq!(result.summary.ios, batches);
        assert_eq!(result.summary.bytes, batches * (64 << 10));
        assert_eq!(result.summary.lat.samples, batches);
        let mut io = UringBackend::new(RING_ENTRIES).unwrap();
        for p in 0..cfg.partitions {
            let store = PartitionStore::open(&mut io, &cfg.partition_dir(p), p, store_config(&cfg))
                .unwrap();
            // Warm-up and timed batches, all durable.
            let expected = (16 + 32) * u64::from(result.records_per_batch);
            assert_eq!(store.durable().next_offset, expected);
            assert!(store.sealed_segments().count() >= 1);
            assert!(store.log_start_offset() > 0, "retention never ran");
            store.close(&mut io).unwrap();
        }
    }

    #[test]
    fn a_buffer_is_filled_unless_it_holds_the_partitions_batch_already() {
        let pool = ringlog_storage::io::SharedBufPool::new(2 * 4096, 1, 1);
        let (batch, _) = build_batch(1, 4096, 100, 1_000).unwrap();
        let mut buf = pool.try_lend_batch(0).unwrap();
        fill_unless_held(&mut buf, &batch);
        assert_eq!(buf.batch(), &batch[..], "a fresh buffer is filled");
        // A restamp changes the header, not the body: still held, not
        // copied again (a value byte flipped in the buffer stays flipped).
        let last = batch.len() - 1;
        buf.batch_mut()[last] ^= 0xFF;
        restamp(
            buf.batch_mut(),
            &Stamp {
                base_offset: 7,
                ..Stamp::default()
            },
        )
        .unwrap();
        fill_unless_held(&mut buf, &batch);
        assert_ne!(buf.batch()[last], batch[last], "held: not copied");
        // Another partition's batch is not this one's.
        let (other, _) = build_batch(2, 4096, 100, 1_000).unwrap();
        fill_unless_held(&mut buf, &other);
        assert_eq!(buf.batch(), &other[..]);
    }

    #[test]
    fn too_small_batch_is_a_typed_error() {
        assert!(matches!(
            build_batch(0, 1000, 1024, 0),
            Err(AppendError::BatchTooSmall { .. })
        ));
    }

    #[test]
    fn write_buffer_grows_for_large_batches() {
        let mut cfg = AppendConfig {
            dir: PathBuf::from("x"),
            partitions: 1,
            batch_size: 64 << 10,
            record_size: 1024,
            duration: Duration::from_secs(1),
            total_bytes: None,
            segment_size: 256 << 20,
            retention_bytes: None,
            warmup_bytes: 0,
            ramp: Duration::ZERO,
        };
        let small = store_config(&cfg);
        assert_eq!(
            small.write_buffer_bytes,
            StoreConfig::default().write_buffer_bytes
        );
        cfg.batch_size = 8 << 20;
        let big = store_config(&cfg);
        assert!(big.batch_bytes_max() >= cfg.batch_size);
        assert!(big.validate().is_ok());
        cfg.batch_size = 64 << 10;
        cfg.segment_size = 1 << 20;
        let small_segments = store_config(&cfg);
        assert_eq!(small_segments.write_buffer_bytes, 1 << 20);
        assert!(small_segments.validate().is_ok());
    }
}
