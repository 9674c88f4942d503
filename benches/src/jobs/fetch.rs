//! The storage-level fetch job: reads by offset straight from a partition
//! store (`PartitionStore::read`), no server.
//!
//! The store is filled once, un-timed, with `total_bytes` of batches and
//! flushed; then each timed read asks for up to `read_bytes` starting at an
//! offset that is either the previous read's `next_offset` (sequential,
//! wrapping to the log start at the end) or uniformly random over the log.
//! A read's latency is the whole `read()` call (I/O, batch verification and
//! the copy into the returned buffer).

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ringlog_protocol::{restamp, Stamp};
use ringlog_storage::io::uring::UringBackend;
use ringlog_storage::store::{PartitionStore, StoreConfig, StoreError};

use crate::jobs::append::{build_batch, store_config_for, AppendError, RING_ENTRIES};
use crate::stats::{CpuMeter, LatencyRecorder, RunSummary, Timeline};

const PARTITION_ID: u32 = 0;

#[derive(Debug, thiserror::Error)]
pub enum FetchJobError {
    #[error(transparent)]
    Append(#[from] AppendError),
    #[error("io_uring setup failed: {0}")]
    Ring(#[source] std::io::Error),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the filled store is empty")]
    EmptyStore,
}

/// Where each read starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    /// At the previous read's `next_offset`, wrapping at the end.
    Sequential,
    /// At a uniformly random offset of the log.
    Random,
}

#[derive(Debug, Clone)]
pub struct FetchConfig {
    /// The store goes in `dir/fetch`.
    pub dir: PathBuf,
    /// Bytes appended (un-timed) before reading, rounded up to whole batches.
    pub total_bytes: u64,
    pub batch_size: usize,
    pub record_size: usize,
    pub segment_size: u64,
    /// `max_bytes` of each read.
    pub read_bytes: usize,
    pub pattern: Pattern,
    pub duration: Duration,
    /// Stop after reading this many bytes, if that comes first.
    pub read_total_bytes: Option<u64>,
    /// Un-timed reads for this long before the timed region.
    pub ramp: Duration,
    /// Seed of the random offsets.
    pub seed: u64,
}

impl FetchConfig {
    pub fn store_dir(&self) -> PathBuf {
        self.dir.join("fetch")
    }

    pub fn fill_batches(&self) -> u64 {
        self.total_bytes
            .max(1)
            .div_ceil(self.batch_size.max(1) as u64)
    }

    pub fn store_config(&self) -> StoreConfig {
        let base = store_config_for(self.batch_size, self.segment_size);
        StoreConfig {
            read_bytes_max: base.read_bytes_max.max(self.read_bytes),
            ..base
        }
    }
}

/// The result of one timed run.
#[derive(Debug, Clone)]
pub struct FetchResult {
    /// bytes = batch bytes returned, ios = read() calls, lat = per read().
    pub summary: RunSummary,
    pub records: u64,
    /// Reads that returned nothing (none expected: reads start below the end).
    pub empty_reads: u64,
}

/// A filled store, read by every rep.
pub struct Store {
    io: UringBackend,
    store: PartitionStore,
    records_per_batch: u32,
    log_bytes: u64,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// xorshift64*: cheap, deterministic offsets.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

impl Store {
    /// Creates the store in `cfg.store_dir()` (which must not exist) and
    /// appends `cfg.total_bytes`, un-timed.
    pub fn fill(cfg: &FetchConfig) -> Result<Store, FetchJobError> {
        let (mut batch, records_per_batch) =
            build_batch(PARTITION_ID, cfg.batch_size, cfg.record_size, now_ms())?;
        let mut io = UringBackend::new(RING_ENTRIES).map_err(FetchJobError::Ring)?;
        let mut store =
            PartitionStore::create(&mut io, &cfg.store_dir(), PARTITION_ID, cfg.store_config())?;
        let batches = cfg.fill_batches();
        for op in 1..=batches {
            let stamp = Stamp {
                base_offset: store.next_offset(),
                vsr_op: op,
                vsr_view: 0,
                prev_checksum: store.last_checksum(),
            };
            restamp(&mut batch, &stamp).map_err(AppendError::from)?;
            // Flushes by itself whenever the write buffer fills.
            store.append(&mut io, &batch)?;
        }
        store.flush(&mut io)?;
        if store.next_offset() == store.log_start_offset() {
            return Err(FetchJobError::EmptyStore);
        }
        Ok(Store {
            io,
            store,
            records_per_batch,
            log_bytes: batches * cfg.batch_size as u64,
        })
    }

    /// Bytes of log in the store.
    pub fn log_bytes(&self) -> u64 {
        self.log_bytes
    }

    /// One un-timed ramp (if any), then the timed reads.
    pub fn run(&mut self, cfg: &FetchConfig) -> Result<FetchResult, FetchJobError> {
        let start_offset = self.store.log_start_offset();
        let end_offset = self.store.next_offset();
        let span = end_offset - start_offset;
        let mut rng = Rng(cfg.seed | 1);
        let mut next = start_offset;
        let mut pick = |prev_next: u64| match cfg.pattern {
            Pattern::Sequential if prev_next >= end_offset => start_offset,
            Pattern::Sequential => prev_next,
            Pattern::Random => start_offset + rng.next() % span,
        };

        let ramp_start = Instant::now();
        while ramp_start.elapsed() < cfg.ramp {
            let from = pick(next);
            next = self
                .store
                .read(&mut self.io, from, cfg.read_bytes)?
                .next_offset;
        }

        let mut lat = LatencyRecorder::new();
        let mut bytes = 0u64;
        let mut ios = 0u64;
        let mut empty_reads = 0u64;
        let cpu = CpuMeter::start();
        let start = Instant::now();
        let mut timeline = Timeline::starting(start);
        loop {
            if start.elapsed() >= cfg.duration || cfg.read_total_bytes.is_some_and(|t| bytes >= t) {
                break;
            }
            let from = pick(next);
            let t = Instant::now();
            let fetched = self.store.read(&mut self.io, from, cfg.read_bytes)?;
            let done = Instant::now();
            lat.record(done - t);
            let n = fetched.bytes.len() as u64;
            if n == 0 {
                empty_reads += 1;
            }
            timeline.record(done, n);
            bytes += n;
            ios += 1;
            next = fetched.next_offset;
        }
        let runtime = start.elapsed();
        let cpu = cpu.usage();
        let batch = cfg.batch_size as u64;
        Ok(FetchResult {
            summary: RunSummary::from_counts(bytes, ios, runtime, lat.summary())
                .with_cpu(cpu)
                .with_timeline(timeline),
            records: bytes.checked_div(batch).unwrap_or(0) * u64::from(self.records_per_batch),
            empty_reads,
        })
    }

    pub fn close(self) -> Result<(), FetchJobError> {
        let Store { mut io, store, .. } = self;
        store.close(&mut io)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rng_spreads_over_the_span() {
        let mut rng = Rng(7);
        let mut seen = [false; 16];
        for _ in 0..1000 {
            seen[(rng.next() % 16) as usize] = true;
        }
        assert!(seen.iter().all(|s| *s));
    }
}
