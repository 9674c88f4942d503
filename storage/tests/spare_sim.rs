//! The next segment prepared ahead of the roll (a spare, `store/spare.rs`),
//! on the sim backend: a roll renames a ready spare into place; a failed
//! spare (EIO, ENOSPC) is dropped without fencing and the roll provisions
//! its segment itself; purge, close and an orphaned op in flight release
//! the spare's file; at most one spare op is in flight per partition.

mod common;

use std::path::{Path, PathBuf};

use common::{next_batch, read_all};
use ringlog_storage::io::sim::{Faults, SimBackend};
use ringlog_storage::io::{Completion, IoBackend, BLOCK_SIZE};
use ringlog_storage::store::{PartitionStore, StoreConfig, StoreError, SPARE_FILE};

const DIR: &str = "/p3";

/// 8 KiB segments: a ~3 KiB batch leaves the segment under half full, a
/// second one past half (a spare is due), a third rolls.
fn config() -> StoreConfig {
    StoreConfig {
        segment_size_bytes: 8 * 1024,
        write_buffer_bytes: 8 * 1024,
        transfer_chunk_bytes: 4096,
        recycled_files_max: 2,
        ..common::small_config()
    }
}

fn spare_path(store: &PartitionStore) -> PathBuf {
    generation_dir(store).join(SPARE_FILE)
}

fn generation_dir(store: &PartitionStore) -> PathBuf {
    store
        .dir()
        .join(format!("gen-{:020}", store.superblock().live_generation))
}

fn append(io: &mut SimBackend, store: &mut PartitionStore, seed: u64) -> u64 {
    let batch = next_batch(store, 1, 3000, seed);
    let at = store.append(io, &batch).expect("append").base_offset;
    store.flush(io).expect("flush");
    at
}

/// Appends until a spare is due (the active segment half full).
fn fill_to_due(io: &mut SimBackend, store: &mut PartitionStore, seed: &mut u64) {
    while !store.spare_due() {
        *seed += 1;
        append(io, store, *seed);
    }
}

fn new_store(io: &mut SimBackend) -> PartitionStore {
    PartitionStore::create(io, Path::new(DIR), 3, config()).expect("create")
}

#[test]
fn a_roll_renames_the_ready_spare_into_place() {
    let mut io = SimBackend::new(5);
    let mut store = new_store(&mut io);
    let mut seed = 0;
    fill_to_due(&mut io, &mut store, &mut seed);
    assert!(generation_dir(&store).ends_with("gen-00000000000000000001"));
    store.provision_spare(&mut io).expect("spare");
    assert!(store.spare_ready());
    let spare = spare_path(&store);
    assert!(io.exists(&spare).unwrap());
    let sealed = store.sealed_segments().count();
    let ops_before = io.ops_count();
    // The next append rolls into the spare: no create, no fallocate.
    seed += 1;
    let base = append(&mut io, &mut store, seed);
    let with_spare = io.ops_count() - ops_before;
    assert_eq!(store.sealed_segments().count(), sealed + 1);
    // The same roll without a spare: the create and the first append's two
    // reservations (slots, data) happen in the roll, on the crash clock.
    let mut twin = SimBackend::new(5);
    let mut other = new_store(&mut twin);
    let mut twin_seed = 0;
    fill_to_due(&mut twin, &mut other, &mut twin_seed);
    assert_eq!(twin_seed + 1, seed);
    let twin_before = twin.ops_count();
    append(&mut twin, &mut other, seed);
    let without = twin.ops_count() - twin_before;
    assert_eq!(without, with_spare + 2, "create + 2 fallocates vs a rename");
    assert!(!store.spare_ready());
    assert!(!io.exists(&spare).unwrap(), "the spare was renamed");
    let new_log = generation_dir(&store).join(format!(
        "{:020}.log",
        store.superblock().frontier.active_base
    ));
    assert!(io.exists(&new_log).unwrap(), "{new_log:?}");
    // It survives a crash and reopen with everything acknowledged.
    let acked = read_all(&mut io, &mut store);
    let mut io = io.reboot();
    let mut store = PartitionStore::open(&mut io, Path::new(DIR), 3, config()).expect("open");
    assert_eq!(read_all(&mut io, &mut store), acked);
    assert!(acked.iter().any(|(at, _)| *at == base));
}

/// Runs the spare's first batch, then fails the next op on the crash clock
/// (the reservation) with EIO.
fn fail_the_spare_reservation(io: &mut SimBackend, store: &mut PartitionStore) -> StoreError {
    let first = store.prepare_spare();
    let done = io.submit(first);
    let next = store
        .complete_spare(io, done)
        .expect("open succeeds")
        .expect("a reservation follows");
    assert!(store.spare_in_flight());
    io.set_fail_at(io.ops_count());
    let done = io.submit(next);
    store.complete_spare(io, done).expect_err("EIO surfaces")
}

#[test]
fn eio_on_the_spare_reservation_drops_the_spare_without_fencing() {
    let mut io = SimBackend::new(6);
    let mut store = new_store(&mut io);
    let mut seed = 0;
    fill_to_due(&mut io, &mut store, &mut seed);
    let open_before = io.open_paths();
    let err = fail_the_spare_reservation(&mut io, &mut store);
    match &err {
        StoreError::Io {
            what, path, source, ..
        } => {
            assert_eq!(*what, "fallocate");
            assert!(path.ends_with(SPARE_FILE), "{path:?}");
            assert_eq!(source.raw_os_error(), Some(libc::EIO));
        }
        other => panic!("{other:?}"),
    }
    assert!(store.fenced().is_none());
    assert!(!store.spare_ready() && !store.spare_in_flight());
    assert_eq!(io.open_paths(), open_before, "the spare's file is closed");
    // The roll provisions its own segment; a later spare starts afresh.
    let sealed = store.sealed_segments().count();
    seed += 1;
    append(&mut io, &mut store, seed);
    assert_eq!(store.sealed_segments().count(), sealed + 1);
    fill_to_due(&mut io, &mut store, &mut seed);
    store.provision_spare(&mut io).expect("a new spare");
    assert!(store.spare_ready());
}

#[test]
fn a_full_disk_at_the_spare_refuses_without_fencing() {
    let mut io = SimBackend::new(7);
    let mut store = new_store(&mut io);
    let mut seed = 0;
    fill_to_due(&mut io, &mut store, &mut seed);
    let used = io.space_used_bytes();
    io.set_faults(Faults {
        space_bytes_max: Some(used + BLOCK_SIZE as u64),
        ..Faults::default()
    });
    let err = store.provision_spare(&mut io).expect_err("no room");
    match &err {
        StoreError::Io { source, .. } => assert_eq!(source.raw_os_error(), Some(libc::ENOSPC)),
        other => panic!("{other:?}"),
    }
    assert!(store.fenced().is_none());
    assert!(!store.spare_ready() && !store.spare_in_flight());
    // The roll itself then finds the disk full: refused, not fenced.
    let batch = next_batch(&store, 1, 3000, 99);
    let refused = store
        .append(&mut io, &batch)
        .and_then(|_| store.flush(&mut io));
    assert!(
        matches!(refused, Err(StoreError::DiskFull { .. })),
        "{refused:?}"
    );
    assert!(store.fenced().is_none());
    io.set_faults(Faults::default());
    store.append(&mut io, &batch).expect("room again");
    store.flush(&mut io).expect("flush");
}

#[test]
fn a_spare_comes_from_the_recycle_pool_when_it_has_a_file() {
    let config = StoreConfig {
        retention_bytes: Some(8 * 1024),
        ..config()
    };
    let mut io = SimBackend::new(8);
    let mut store = PartitionStore::create(&mut io, Path::new(DIR), 3, config.clone()).unwrap();
    for seed in 0..8 {
        append(&mut io, &mut store, seed);
    }
    store.apply_retention(&mut io, 0).expect("retention");
    let recycle = Path::new(DIR).join("recycle");
    let pooled = io.list_dir(&recycle).unwrap().len();
    assert!(pooled > 0, "retention recycled nothing");
    let mut seed = 100;
    fill_to_due(&mut io, &mut store, &mut seed);
    store.provision_spare(&mut io).expect("spare");
    assert_eq!(io.list_dir(&recycle).unwrap().len(), pooled - 1);
    // Its first block is zeroed durably, so recovery finds the end at once.
    let spare = spare_path(&store);
    let bytes = io.read_whole(&spare).unwrap();
    assert!(bytes.len() as u64 >= config.segment_size_bytes);
    assert!(bytes[..BLOCK_SIZE].iter().all(|&b| b == 0));
    let acked = read_all(&mut io, &mut store);
    seed += 1;
    append(&mut io, &mut store, seed);
    let mut io = io.reboot();
    let mut store = PartitionStore::open(&mut io, Path::new(DIR), 3, config).expect("open");
    let got = read_all(&mut io, &mut store);
    assert_eq!(&got[..acked.len()], &acked[..]);
    assert_eq!(got.len(), acked.len() + 1);
}

#[test]
fn purge_and_close_release_a_ready_spare() {
    let mut io = SimBackend::new(9);
    let mut store = new_store(&mut io);
    let mut seed = 0;
    fill_to_due(&mut io, &mut store, &mut seed);
    store.provision_spare(&mut io).unwrap();
    let spare = spare_path(&store);
    store.purge(&mut io).expect("purge");
    assert!(!store.spare_ready());
    assert!(
        !io.exists(&spare).unwrap(),
        "the old generation's spare is gone"
    );
    assert!(!io.open_paths().contains(&spare));
    fill_to_due(&mut io, &mut store, &mut seed);
    store.provision_spare(&mut io).unwrap();
    let spare = spare_path(&store);
    store.close(&mut io).expect("close");
    assert!(io.open_paths().is_empty(), "{:?}", io.open_paths());
    // The next open removes it as garbage.
    let store = PartitionStore::open(&mut io, Path::new(DIR), 3, config()).expect("open");
    assert!(!io.exists(&spare).unwrap());
    store.close(&mut io).unwrap();
}

/// Reaps until the batch comes back.
fn reap_one(io: &mut SimBackend) -> Vec<Completion> {
    loop {
        if let Some((_, done)) = io.reap().pop() {
            return done;
        }
    }
}

#[test]
fn a_spare_in_flight_across_a_purge_is_orphaned_and_released() {
    let mut io = SimBackend::new(10);
    let mut store = new_store(&mut io);
    let mut seed = 0;
    fill_to_due(&mut io, &mut store, &mut seed);
    let first = store.prepare_spare();
    io.submit_nowait(first);
    let done = reap_one(&mut io);
    let next = store.complete_spare(&mut io, done).unwrap().unwrap();
    io.submit_nowait(next);
    // The purge leaves the generation while the reservation is in flight.
    store.purge(&mut io).expect("purge");
    assert!(store.spare_in_flight());
    assert!(!store.spare_due(), "one spare op in flight at a time");
    let done = reap_one(&mut io);
    assert!(store.complete_spare(&mut io, done).unwrap().is_none());
    assert!(!store.spare_in_flight() && !store.spare_ready());
    let leaked: Vec<PathBuf> = io
        .open_paths()
        .into_iter()
        .filter(|p| p.ends_with(SPARE_FILE))
        .collect();
    assert!(leaked.is_empty(), "{leaked:?}");
    // Appends go on in the new generation.
    seed += 1;
    append(&mut io, &mut store, seed);
}

#[test]
#[should_panic(expected = "prepare_spare when no spare is due")]
fn a_second_spare_op_in_flight_is_refused() {
    let mut io = SimBackend::new(11);
    let mut store = new_store(&mut io);
    let mut seed = 0;
    fill_to_due(&mut io, &mut store, &mut seed);
    let first = store.prepare_spare();
    assert!(store.spare_in_flight() && !store.spare_due());
    io.submit_nowait(first);
    store.prepare_spare();
}

// ---------------------------------------------------------------------------
// Reservations ahead of the appends.

/// 1 MiB segments: the reservation grows in steps well inside a segment.
fn big_config() -> StoreConfig {
    StoreConfig {
        segment_size_bytes: 1 << 20,
        write_buffer_bytes: 64 * 1024,
        ..config()
    }
}

/// Appends ~3 KiB batches until a reservation ahead is due.
fn fill_to_reserve_due(io: &mut SimBackend, store: &mut PartitionStore, seed: &mut u64) {
    while !store.reserve_ahead_due() {
        *seed += 1;
        append(io, store, *seed);
        assert!(*seed < 10_000, "no reservation ahead came due");
    }
}

/// Ops on the crash clock of `n` appends (each flushed). (The sim's file
/// size cannot show reservations: the first one, of the frontier record
/// slots past the data, already sizes the file past the segment.)
fn appends_ops(io: &mut SimBackend, store: &mut PartitionStore, seed: u64, n: u64) -> u64 {
    let before = io.ops_count();
    for i in 0..n {
        append(io, store, seed + i);
    }
    io.ops_count() - before
}

#[test]
fn a_reservation_ahead_spares_the_appends_their_fallocate() {
    let run = |ahead: bool| {
        let mut io = SimBackend::new(12);
        let mut store = PartitionStore::create(&mut io, Path::new(DIR), 3, big_config()).unwrap();
        let mut seed = 0;
        fill_to_reserve_due(&mut io, &mut store, &mut seed);
        if ahead {
            let sqes = store.prepare_reserve_ahead();
            assert!(store.reserve_ahead_in_flight() && !store.reserve_ahead_due());
            let done = io.submit(sqes);
            store.complete_reserve_ahead(done).expect("reserved");
            assert!(!store.reserve_ahead_in_flight());
        }
        // Enough appends (~120 KiB) to pass the reservation's end (within
        // half a step of it, at most 64 KiB away here).
        appends_ops(&mut io, &mut store, 1000, 40)
    };
    let with_ahead = run(true);
    let without = run(false);
    // The run without it reserves in an append (one fallocate on the
    // clock); the reservation ahead was made before the counting.
    assert!(
        with_ahead < without,
        "appends after a reservation ahead: {with_ahead} ops, without: {without}"
    );
}

#[test]
fn a_failed_reservation_ahead_changes_nothing_and_the_append_reserves() {
    let mut io = SimBackend::new(13);
    let mut store = PartitionStore::create(&mut io, Path::new(DIR), 3, big_config()).unwrap();
    let mut seed = 0;
    fill_to_reserve_due(&mut io, &mut store, &mut seed);
    let sqes = store.prepare_reserve_ahead();
    io.set_fail_at(io.ops_count());
    let done = io.submit(sqes);
    match store.complete_reserve_ahead(done) {
        Err(StoreError::Io { what, source, .. }) => {
            assert_eq!(what, "fallocate");
            assert_eq!(source.raw_os_error(), Some(libc::EIO));
        }
        other => panic!("{other:?}"),
    }
    assert!(store.fenced().is_none());
    assert!(store.reserve_ahead_due(), "due again");
    // Past the old reservation's end: the appends reserve it themselves.
    appends_ops(&mut io, &mut store, 2000, 40);
    let acked = read_all(&mut io, &mut store);
    let mut io = io.reboot();
    let mut store = PartitionStore::open(&mut io, Path::new(DIR), 3, big_config()).unwrap();
    assert_eq!(read_all(&mut io, &mut store), acked);
}

/// A reservation that lands after its segment rolled claims nothing for
/// the new active segment.
#[test]
fn a_reservation_ahead_landing_after_the_roll_is_ignored() {
    let mut seed = 0;
    // Big enough for a reservation step inside the segment.
    let config = StoreConfig {
        segment_size_bytes: 256 * 1024,
        ..config()
    };
    let mut io2 = SimBackend::new(14);
    let mut store = PartitionStore::create(&mut io2, Path::new(DIR), 3, config.clone()).unwrap();
    fill_to_reserve_due(&mut io2, &mut store, &mut seed);
    let sqes = store.prepare_reserve_ahead();
    io2.submit_nowait(sqes);
    let sealed = store.sealed_segments().count();
    while store.sealed_segments().count() == sealed {
        seed += 1;
        append(&mut io2, &mut store, seed);
    }
    let done = reap_one(&mut io2);
    store
        .complete_reserve_ahead(done)
        .expect("reserved (the old file)");
    // The new segment's reservations stay the appends' own (the old
    // file's completion claimed nothing for it): they go on, and
    // everything survives.
    for _ in 0..60 {
        seed += 1;
        append(&mut io2, &mut store, seed);
    }
    assert!(store.fenced().is_none());
    let acked = read_all(&mut io2, &mut store);
    let mut io2 = io2.reboot();
    let mut store = PartitionStore::open(&mut io2, Path::new(DIR), 3, config).unwrap();
    assert_eq!(read_all(&mut io2, &mut store), acked);
}

#[test]
#[should_panic(expected = "prepare_reserve_ahead when none is due")]
fn a_second_reservation_ahead_in_flight_is_refused() {
    let mut io = SimBackend::new(15);
    let mut store = PartitionStore::create(&mut io, Path::new(DIR), 3, big_config()).unwrap();
    let mut seed = 0;
    fill_to_reserve_due(&mut io, &mut store, &mut seed);
    let sqes = store.prepare_reserve_ahead();
    io.submit_nowait(sqes);
    store.prepare_reserve_ahead();
}
