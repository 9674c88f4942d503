//! The state-transfer job: a whole partition log moved from a source store
//! to an empty receiver store, through the snapshot API a replica catching
//! up would use, both stores on the same filesystem, each on its own
//! io_uring backend (one thread).
//!
//! The source is filled once, un-timed, with batches built as the append job
//! builds them; the fill ends with an (un-timed) snapshot open and release,
//! which seals the active segment, so every timed rep serves the same sealed
//! segments and none of them pays for the roll. Each rep then creates a fresh
//! receiver (un-timed) and times `open_snapshot` through `commit_install`:
//! manifest encode/decode, `begin_install`, every chunk read from the source
//! and written into the receiver (`--window` chunks read in one submission,
//! then verified and written in one), and `commit_install` (index files,
//! fdatasyncs, commit by rename + superblock).

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ringlog_protocol::manifest::{Manifest, ManifestError, ManifestLimits};
use ringlog_protocol::{restamp, Stamp};
use ringlog_storage::io::uring::UringBackend;
use ringlog_storage::store::{InstallBudget, PartitionStore, StoreConfig, StoreError};

use super::append::{build_batch, store_config_for, AppendError, RING_ENTRIES};
use crate::stats::{CpuMeter, LatencyRecorder, LatencySummary, RunSummary, Timeline};

/// Partition id of both stores (an install must be for the same partition).
const PARTITION_ID: u32 = 0;

#[derive(Debug, thiserror::Error)]
pub enum TransferJobError {
    #[error(transparent)]
    Batch(#[from] AppendError),
    #[error("io_uring setup failed: {0}")]
    Ring(#[source] std::io::Error),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("decoding the manifest failed: {0}")]
    Manifest(#[from] ManifestError),
    #[error("the source store is empty after the fill")]
    EmptySource,
}

#[derive(Debug, Clone)]
pub struct TransferConfig {
    /// The source store goes in `dir/src`, the receiver in `dir/dst`.
    pub dir: PathBuf,
    /// Batch bytes appended to the source (rounded up to whole batches).
    pub total_bytes: u64,
    pub segment_size: u64,
    /// StoreConfig::transfer_chunk_bytes, the same on both sides.
    pub chunk_size: u32,
    /// Chunks read from the source before they are written to the receiver.
    pub window: usize,
    /// Encoded bytes of each batch of the fill.
    pub batch_size: usize,
    /// Value bytes of each record of the fill.
    pub record_size: usize,
}

impl TransferConfig {
    pub fn source_dir(&self) -> PathBuf {
        self.dir.join("src")
    }

    pub fn receiver_dir(&self) -> PathBuf {
        self.dir.join("dst")
    }

    /// Batches the fill appends: `total_bytes` rounded up to whole batches.
    pub fn fill_batches(&self) -> u64 {
        self.total_bytes
            .max(1)
            .div_ceil(self.batch_size.max(1) as u64)
    }

    /// Both stores' config.
    pub fn store_config(&self) -> StoreConfig {
        StoreConfig {
            transfer_chunk_bytes: self.chunk_size,
            transfer_window_chunks: self.window.max(1),
            ..store_config_for(self.batch_size, self.segment_size)
        }
    }
}

/// Wall time of the parts of one timed transfer.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Phases {
    /// `open_snapshot`, manifest encode + decode and `begin_install`.
    pub open: Duration,
    /// Every chunk read from the source and written into the receiver.
    pub chunks: Duration,
    /// `commit_install`: index files, fdatasyncs, rename,
    /// directory fsync and superblock.
    pub commit: Duration,
}

/// The result of one timed transfer.
#[derive(Debug, Clone)]
pub struct TransferResult {
    /// bytes = artifact bytes, ios = chunks, runtime = open_snapshot ..
    /// commit_install; lat = per chunk, the read_chunks + accept_chunks of
    /// its window.
    pub summary: RunSummary,
    pub artifacts: u32,
    /// `read_chunks` of the chunk's window.
    pub read_lat: LatencySummary,
    /// `accept_chunks` (verify + write) of the chunk's window.
    pub write_lat: LatencySummary,
    pub phases: Phases,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The filled source store and its backend, kept across reps.
pub struct Source {
    io: UringBackend,
    store: PartitionStore,
    /// Bytes of the sealed segments a snapshot serves.
    bytes: u64,
}

impl Source {
    /// Creates the source store in `cfg.source_dir()` (which must not exist)
    /// and appends [`TransferConfig::fill_batches`] batches to it, then seals
    /// the active segment. Un-timed.
    pub fn fill(cfg: &TransferConfig) -> Result<Source, TransferJobError> {
        let now = now_ms();
        let (mut batch, _) = build_batch(PARTITION_ID, cfg.batch_size, cfg.record_size, now)?;
        let mut io = UringBackend::new(RING_ENTRIES).map_err(TransferJobError::Ring)?;
        let mut store =
            PartitionStore::create(&mut io, &cfg.source_dir(), PARTITION_ID, cfg.store_config())?;
        for op in 1..=cfg.fill_batches() {
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
        // Seal the active segment now, so no timed rep pays for the roll.
        let manifest = store.open_snapshot(&mut io, now_ms())?;
        store.release_snapshot(manifest.snapshot_id);
        let bytes = manifest.total_length_bytes();
        if bytes == 0 {
            return Err(TransferJobError::EmptySource);
        }
        Ok(Source { io, store, bytes })
    }

    /// Bytes one transfer moves.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Creates an empty receiver in `cfg.receiver_dir()` (which must not
    /// exist; un-timed), transfers the source's log into it (timed) and
    /// closes it (un-timed). The receiver's directory is left for the
    /// caller to remove.
    pub fn transfer(&mut self, cfg: &TransferConfig) -> Result<TransferResult, TransferJobError> {
        let mut dst_io = UringBackend::new(RING_ENTRIES).map_err(TransferJobError::Ring)?;
        let mut receiver = PartitionStore::create(
            &mut dst_io,
            &cfg.receiver_dir(),
            PARTITION_ID,
            cfg.store_config(),
        )?;
        let window = cfg.window.max(1);
        let mut lat = LatencyRecorder::new();
        let mut read_lat = LatencyRecorder::new();
        let mut write_lat = LatencyRecorder::new();
        let src_io = &mut self.io;
        let source = &mut self.store;

        let cpu = CpuMeter::start();
        let start = Instant::now();
        let mut timeline = Timeline::starting(start);
        let manifest = source.open_snapshot(src_io, now_ms())?;
        let offer = Manifest::decode(&manifest.encode(), &ManifestLimits::default())?;
        // One window of chunks reserved ahead of the writes: what one
        // install needs.
        let budget = InstallBudget::new(
            u64::from(receiver.config().transfer_chunk_bytes)
                * receiver.config().transfer_window_chunks as u64,
        );
        let mut install = receiver.begin_install(&mut dst_io, offer, &budget)?;
        let opened = Instant::now();
        let missing: Vec<(u32, u32)> = install.missing().collect();
        // A window of chunks is read in one submission and written in one
        // submission; each chunk's latency is its window's.
        for group in missing.chunks(window) {
            let t = Instant::now();
            let bufs = source.read_chunks(src_io, manifest.snapshot_id, group, now_ms())?;
            let read = t.elapsed();
            let delivered: Vec<(u32, u32, &[u8])> = group
                .iter()
                .zip(&bufs)
                .map(|(&(artifact, chunk), buf)| (artifact, chunk, &buf[..]))
                .collect();
            let t = Instant::now();
            install.accept_chunks(&mut dst_io, &delivered)?;
            let write = t.elapsed();
            timeline.record(
                Instant::now(),
                delivered.iter().map(|(_, _, b)| b.len() as u64).sum(),
            );
            for _ in group {
                read_lat.record(read);
                write_lat.record(write);
                lat.record(read + write);
            }
        }
        let chunks_done = Instant::now();
        receiver.commit_install(&mut dst_io, install)?;
        let end = Instant::now();
        let cpu = cpu.usage();
        source.release_snapshot(manifest.snapshot_id);
        receiver.close(&mut dst_io)?;

        let bytes = manifest.total_length_bytes();
        Ok(TransferResult {
            summary: RunSummary::from_counts(
                bytes,
                missing.len() as u64,
                end - start,
                lat.summary(),
            )
            .with_cpu(cpu)
            .with_timeline(timeline),
            artifacts: manifest.artifacts.len() as u32,
            read_lat: read_lat.summary(),
            write_lat: write_lat.summary(),
            phases: Phases {
                open: opened - start,
                chunks: chunks_done - opened,
                commit: end - chunks_done,
            },
        })
    }

    /// Checkpoints and closes the source store.
    pub fn close(self) -> Result<(), TransferJobError> {
        let Source { mut io, store, .. } = self;
        store.close(&mut io)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> TransferConfig {
        TransferConfig {
            dir: PathBuf::from("d"),
            total_bytes: 512 << 20,
            segment_size: 256 << 20,
            chunk_size: 1 << 20,
            window: 4,
            batch_size: 1 << 20,
            record_size: 1024,
        }
    }

    #[test]
    fn fill_rounds_up_to_whole_batches() {
        let mut c = cfg();
        assert_eq!(c.fill_batches(), 512);
        c.total_bytes = (512 << 20) + 1;
        assert_eq!(c.fill_batches(), 513);
        c.total_bytes = 1;
        assert_eq!(c.fill_batches(), 1);
    }

    #[test]
    fn both_stores_use_the_chunk_size_and_a_valid_config() {
        let mut c = cfg();
        c.chunk_size = 256 << 10;
        let sc = c.store_config();
        assert_eq!(sc.transfer_chunk_bytes, 256 << 10);
        assert_eq!(sc.segment_size_bytes, 256 << 20);
        assert!(sc.batch_bytes_max() >= c.batch_size);
        assert!(sc.validate().is_ok());
        c.segment_size = 4 << 20;
        assert!(c.store_config().validate().is_ok());
    }

    /// A real transfer on the repo's filesystem (O_DIRECT), two reps into
    /// fresh receivers.
    #[test]
    fn transfers_every_byte_of_the_source() {
        let tmp = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let c = TransferConfig {
            dir: tmp.path().to_owned(),
            total_bytes: 6 << 20,
            segment_size: 2 << 20,
            chunk_size: 256 << 10,
            window: 3,
            batch_size: 64 << 10,
            record_size: 1024,
        };
        let mut source = Source::fill(&c).unwrap();
        assert_eq!(source.bytes(), 6 << 20);
        for _ in 0..2 {
            let r = source.transfer(&c).unwrap();
            assert_eq!(r.summary.bytes, 6 << 20);
            assert_eq!(r.artifacts, 3);
            assert_eq!(r.summary.ios, 24);
            assert_eq!(r.summary.lat.samples, 24);
            assert_eq!(r.read_lat.samples, 24);
            assert!(r.summary.runtime >= r.phases.chunks);
            std::fs::remove_dir_all(c.receiver_dir()).unwrap();
        }
        source.close().unwrap();
    }
}
