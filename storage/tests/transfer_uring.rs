//! State transfer on a real disk (io_uring, O_DIRECT): 256 MiB move between
//! two stores while the source keeps appending; the installed store equals
//! the snapshot byte for byte, and the receiving side's memory stays within
//! the chunk window plus a small constant (measured by a counting allocator).

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use common::{next_batch, read_all};
use ringlog_protocol::manifest::{Manifest, ManifestLimits};
use ringlog_storage::io::uring::UringBackend;
use ringlog_storage::store::{InstallBudget, PartitionStore, StoreConfig};

/// Counts live heap bytes and their peak.
struct Counting;

static LIVE_BYTES: AtomicUsize = AtomicUsize::new(0);
static PEAK_BYTES: AtomicUsize = AtomicUsize::new(0);

// SAFETY: defers to the system allocator and only adds bookkeeping.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let live = LIVE_BYTES.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK_BYTES.fetch_max(live, Ordering::Relaxed);
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            let live = LIVE_BYTES.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK_BYTES.fetch_max(live, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        unsafe { System.dealloc(p, layout) };
        LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const MIB: u64 = 1024 * 1024;
const WINDOW_CHUNKS: usize = 4;

fn config() -> StoreConfig {
    StoreConfig {
        segment_size_bytes: 64 * MIB,
        write_buffer_bytes: 4 * MIB as usize,
        transfer_window_chunks: WINDOW_CHUNKS,
        ..StoreConfig::default()
    }
}

#[test]
fn transfer_256_mib_while_the_source_appends() {
    let tmp = tempfile::tempdir().unwrap();
    let mut src_io = UringBackend::new(64).unwrap();
    let mut dst_io = UringBackend::new(64).unwrap();
    let mut src =
        PartitionStore::create(&mut src_io, &tmp.path().join("src"), 1, config()).unwrap();
    let mut dst =
        PartitionStore::create(&mut dst_io, &tmp.path().join("dst"), 1, config()).unwrap();
    let mut seed = 0;
    while src.size_bytes() < 256 * MIB {
        for _ in 0..8 {
            seed += 1;
            let batch = next_batch(&src, 16, 8 * 1024, seed);
            src.append(&mut src_io, &batch).unwrap();
        }
        src.flush(&mut src_io).unwrap();
    }

    let now_ms = 1_000;
    let manifest = src.open_snapshot(&mut src_io, now_ms).unwrap();
    let total = manifest.total_length_bytes();
    assert!(total >= 256 * MIB, "snapshot holds {total} bytes");
    let offer = Manifest::decode(&manifest.encode(), &ManifestLimits::default()).unwrap();
    let chunk_bytes = u64::from(offer.chunk_size_bytes);

    // Memory the receiving side may use: its window of chunk buffers plus a
    // constant (the streaming verifier's carried batch, manifests, indexes).
    // Sender and receiver share this process, so the chunks in flight (read
    // by the sender, not yet taken) are counted too: one more window.
    let baseline = LIVE_BYTES.load(Ordering::Relaxed);
    PEAK_BYTES.store(baseline, Ordering::Relaxed);
    let started = std::time::Instant::now();
    // The shard's install budget: one window of disk ahead of the writes.
    let window_bytes = WINDOW_CHUNKS as u64 * chunk_bytes;
    let budget = InstallBudget::new(window_bytes);
    let mut install = dst.begin_install(&mut dst_io, offer, &budget).unwrap();
    let staging = tmp.path().join("dst").join("staging");
    let mut written = 0u64;
    // Before any chunk: the first window only (it used to be the offer).
    let mut ahead_peak = allocated_bytes(&staging);
    assert_eq!(budget.reserved_bytes(), window_bytes);
    let wanted: Vec<(u32, u32)> = install.missing().collect();
    let mut appended_during = 0;
    for window in wanted.chunks(WINDOW_CHUNKS) {
        let bufs = src
            .read_chunks(&mut src_io, manifest.snapshot_id, window, now_ms)
            .unwrap();
        let in_flight: Vec<_> = window
            .iter()
            .zip(bufs)
            .map(|(&(a, c), buf)| (a, c, buf))
            .collect();
        // The source keeps taking appends while it serves.
        let batch = next_batch(&src, 4, 4096, 1_000_000 + appended_during);
        src.append(&mut src_io, &batch).unwrap();
        src.flush(&mut src_io).unwrap();
        appended_during += 1;
        let delivered: Vec<(u32, u32, &[u8])> = in_flight
            .iter()
            .map(|(a, c, buf)| (*a, *c, &buf[..]))
            .collect();
        install.accept_chunks(&mut dst_io, &delivered).unwrap();
        written += delivered
            .iter()
            .map(|(_, _, b)| ringlog_storage::io::align_up(b.len() as u64))
            .sum::<u64>();
        ahead_peak = ahead_peak.max(allocated_bytes(&staging).saturating_sub(written));
        assert!(budget.reserved_bytes() <= window_bytes);
    }
    dst.commit_install(&mut dst_io, install).unwrap();
    let elapsed = started.elapsed();
    src.release_snapshot(manifest.snapshot_id);
    let peak = PEAK_BYTES.load(Ordering::Relaxed) - baseline;
    let bound = 2 * WINDOW_CHUNKS as u64 * chunk_bytes + 4 * MIB;
    println!(
        "transferred {} MiB in {:.2} s ({:.0} MiB/s) while the source took {appended_during} appends; \
         peak extra memory {:.1} MiB (window {WINDOW_CHUNKS} x {} MiB chunks, twice: receiver + in flight; bound {} MiB)",
        total / MIB,
        elapsed.as_secs_f64(),
        total as f64 / MIB as f64 / elapsed.as_secs_f64(),
        peak as f64 / MIB as f64,
        chunk_bytes / MIB,
        bound / MIB
    );
    assert!(
        (peak as u64) <= bound,
        "peak {peak} bytes over the bound {bound}"
    );
    // Disk: allocated only a window ahead of what was written, never the
    // whole offer up front (1 MiB of slack for filesystem rounding).
    println!(
        "staged disk allocated ahead of the written bytes: peak {:.1} MiB (window {} MiB, offer {} MiB)",
        ahead_peak as f64 / MIB as f64,
        window_bytes / MIB,
        total / MIB
    );
    assert!(
        ahead_peak <= window_bytes + MIB,
        "{ahead_peak} bytes allocated ahead of the writes"
    );

    // Byte for byte: the receiver holds exactly the snapshot's batches.
    assert_eq!(dst.durable().next_offset, manifest.next_offset);
    assert_eq!(dst.last_checksum(), manifest.last_checksum);
    let installed = read_all(&mut dst_io, &mut dst);
    let source: Vec<(u64, Vec<u8>)> = read_all(&mut src_io, &mut src)
        .into_iter()
        .filter(|(offset, _)| *offset < manifest.next_offset)
        .collect();
    assert_eq!(installed.len(), source.len());
    assert!(
        installed == source,
        "installed batches differ from the snapshot"
    );

    // The installed store survives a restart and keeps appending.
    drop(dst);
    let mut dst = PartitionStore::open(&mut dst_io, &tmp.path().join("dst"), 1, config()).unwrap();
    assert_eq!(dst.durable().next_offset, manifest.next_offset);
    let batch = next_batch(&dst, 2, 100, 7);
    dst.append(&mut dst_io, &batch).unwrap();
    dst.flush(&mut dst_io).unwrap();
}

/// Disk blocks allocated to the files in `dir` (0 once it is gone).
fn allocated_bytes(dir: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(|e| e.ok()?.metadata().ok())
        .map(|m| m.blocks() * 512)
        .sum()
}
