//! A recycled segment file is reserved whole, once, when it becomes the
//! active segment: no flush into it follows a fallocate. On ext4 every
//! fallocate dirties the inode, and the next fdatasync then writes the inode
//! synchronously (one more device round trip on the ack path); with stepped
//! reservations that was about one flush in six of a 64 MiB segment.

mod common;

use std::io;
use std::path::{Path, PathBuf};

use common::{next_batch, read_all, small_config};
use ringlog_storage::io::sim::SimBackend;
use ringlog_storage::io::{BatchId, Completion, FileId, IoBackend, OpenMode, Sqe};
use ringlog_storage::store::{PartitionStore, PoolConfig, StoreConfig, StoreError, StorePool};

/// The sim backend, counting fallocate calls and failing the next one on
/// request.
struct Counting {
    sim: SimBackend,
    allocations: u64,
    fail_next_allocation: Option<i32>,
}

impl IoBackend for Counting {
    fn open_file(&mut self, path: &Path, mode: OpenMode) -> io::Result<FileId> {
        self.sim.open_file(path, mode)
    }
    fn open_dir(&mut self, path: &Path) -> io::Result<FileId> {
        self.sim.open_dir(path)
    }
    fn close(&mut self, file: FileId) {
        self.sim.close(file)
    }
    fn create_dir(&mut self, path: &Path) -> io::Result<()> {
        self.sim.create_dir(path)
    }
    fn list_dir(&mut self, path: &Path) -> io::Result<Vec<String>> {
        self.sim.list_dir(path)
    }
    fn exists(&mut self, path: &Path) -> io::Result<bool> {
        self.sim.exists(path)
    }
    fn file_size(&mut self, file: FileId) -> io::Result<u64> {
        self.sim.file_size(file)
    }
    fn allocate_range(&mut self, file: FileId, offset: u64, len_bytes: u64) -> io::Result<()> {
        self.allocations += 1;
        if let Some(errno) = self.fail_next_allocation.take() {
            return Err(io::Error::from_raw_os_error(errno));
        }
        self.sim.allocate_range(file, offset, len_bytes)
    }
    fn submit(&mut self, batch: Vec<Sqe>) -> Vec<Completion> {
        self.sim.submit(batch)
    }
    fn submit_nowait(&mut self, batch: Vec<Sqe>) -> BatchId {
        self.sim.submit_nowait(batch)
    }
    fn reap(&mut self) -> Vec<(BatchId, Vec<Completion>)> {
        self.sim.reap()
    }
    fn batches_running(&self) -> usize {
        self.sim.batches_running()
    }
}

fn config() -> StoreConfig {
    StoreConfig {
        // Large enough for several reservation steps per fresh segment.
        segment_size_bytes: 512 << 10,
        // Retention keeps about two segments: from the third roll on, every
        // roll reuses a file retention recycled.
        retention_bytes: Some(1 << 20),
        ..small_config()
    }
}

fn setup() -> (Counting, PartitionStore, StorePool) {
    let mut io = Counting {
        sim: SimBackend::new(7),
        allocations: 0,
        fail_next_allocation: None,
    };
    let config = config();
    let pool = StorePool::new(PathBuf::from("/recycle"), PoolConfig::private(&config));
    pool.load_recycled(&mut io).unwrap();
    let store =
        PartitionStore::create_in(&mut io, Path::new("/p0"), 0, config, pool.clone()).unwrap();
    (io, store, pool)
}

/// What one [`step`] did.
struct Step {
    rolled: bool,
    /// The roll took its file from the recycle pool.
    reused: bool,
    /// fallocate calls during the append and its flush.
    allocations: u64,
}

/// Appends and flushes one 6 KiB batch (85 to a segment), then applies retention as a
/// shard's maintenance would.
fn step(
    io: &mut Counting,
    store: &mut PartitionStore,
    pool: &StorePool,
    seed: u64,
) -> Result<Step, StoreError> {
    let sealed = store.sealed_segments().count();
    let recycled = pool.recycled_count();
    let allocations = io.allocations;
    let batch = next_batch(store, 4, 1500, seed);
    store.append(io, &batch)?;
    store.flush(io)?;
    let step = Step {
        rolled: store.sealed_segments().count() != sealed,
        reused: pool.recycled_count() < recycled,
        allocations: io.allocations - allocations,
    };
    if store.size_bytes() > 1 << 20 {
        store.apply_retention(io, 0)?;
    }
    Ok(step)
}

#[test]
fn flushes_into_a_recycled_segment_never_follow_a_fallocate() {
    let (mut io, mut store, pool) = setup();
    let segment_batches = config().segment_size_bytes / 6144;
    let mut seed = 0;
    // Fresh segments (until retention recycled something) grow in steps.
    let mut fresh_allocations = 0;
    let mut rolls = 0;
    while rolls < 2 {
        assert!(seed < 4 * segment_batches, "no roll");
        let s = step(&mut io, &mut store, &pool, seed).unwrap();
        seed += 1;
        if s.rolled {
            assert!(!s.reused);
            rolls += 1;
        } else {
            fresh_allocations += s.allocations;
        }
    }
    assert!(
        fresh_allocations >= 4,
        "fresh segments reserve in steps ({fresh_allocations} fallocates)"
    );
    // Steady state: every roll reuses a recycled file; no append into it
    // (nor its flush) calls fallocate.
    let mut checked = 0;
    let mut in_recycled = false;
    for _ in 0..6 * segment_batches {
        let s = step(&mut io, &mut store, &pool, seed).unwrap();
        seed += 1;
        if s.rolled {
            assert!(s.reused, "roll at append {seed} made a new file");
            in_recycled = true;
        } else if in_recycled {
            assert_eq!(
                s.allocations, 0,
                "append {seed} into a recycled segment called fallocate"
            );
            checked += 1;
        }
    }
    assert!(
        checked >= 3 * segment_batches,
        "only {checked} appends checked"
    );
    // Everything retention kept reads back, across a reopen.
    let next = store.next_offset();
    store.close(&mut io).unwrap();
    let mut store =
        PartitionStore::open_in(&mut io, Path::new("/p0"), 0, config(), pool.clone()).unwrap();
    assert_eq!(store.next_offset(), next);
    let batches = read_all(&mut io, &mut store);
    assert_eq!(batches.last().map(|(offset, _)| *offset), Some(next - 4));
}

/// After [`fail_the_recycled_reservation`]: the store, its error and the
/// files open before the failing append.
struct Failed {
    io: Counting,
    store: PartitionStore,
    err: StoreError,
    open_before: Vec<PathBuf>,
}

/// Runs until a roll reused a recycled file, then makes the next such
/// roll's whole-segment fallocate fail with `errno`.
fn fail_the_recycled_reservation(errno: i32) -> Failed {
    let (mut io, mut store, pool) = setup();
    let mut seed = 0;
    let mut rolls = 0;
    while rolls < 3 {
        rolls += u32::from(step(&mut io, &mut store, &pool, seed).unwrap().rolled);
        seed += 1;
    }
    for _ in 0..2 * config().segment_size_bytes / 6144 {
        let open_before = io.sim.open_paths();
        io.fail_next_allocation = Some(errno);
        let result = step(&mut io, &mut store, &pool, seed);
        seed += 1;
        match result {
            Err(err) => {
                return Failed {
                    io,
                    store,
                    err,
                    open_before,
                }
            }
            // This append needed no reservation.
            Ok(s) => assert!(!s.rolled && s.allocations == 0),
        }
        io.fail_next_allocation = None;
    }
    panic!("no roll within two segments");
}

#[test]
fn a_failed_reservation_of_a_recycled_file_fences_and_closes_it() {
    let Failed {
        io,
        store,
        err,
        open_before,
    } = fail_the_recycled_reservation(libc::EIO);
    let StoreError::Fenced { cause, .. } = &err else {
        panic!("expected the roll to fence, got {err:?}");
    };
    assert!(cause.contains("fallocate"), "{cause}");
    assert!(store.fenced().is_some());
    let open = io.sim.open_paths();
    assert!(
        open.iter().all(|p| open_before.contains(p)),
        "the recycled file is left open: {open:?} (before: {open_before:?})"
    );
}

#[test]
fn a_full_disk_at_a_recycled_reservation_refuses_without_fencing() {
    let Failed {
        mut io,
        mut store,
        err,
        open_before,
    } = fail_the_recycled_reservation(libc::ENOSPC);
    assert!(matches!(err, StoreError::DiskFull { .. }), "{err:?}");
    assert!(store.fenced().is_none());
    let open = io.sim.open_paths();
    assert!(open.iter().all(|p| open_before.contains(p)), "{open:?}");
    // Space is back: the same append goes through and rolls.
    let sealed = store.sealed_segments().count();
    let batch = next_batch(&store, 4, 1500, 10_000);
    store.append(&mut io, &batch).unwrap();
    store.flush(&mut io).unwrap();
    assert_eq!(store.sealed_segments().count(), sealed + 1);
}
