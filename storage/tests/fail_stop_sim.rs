//! Fail-stop on the sim backend: once a write fails, every mutating entry
//! point of the partition refuses with `Fenced` (an install's commit too),
//! close releases the files without writing, and open refuses a superblock
//! that holds two different states under one sequence.

mod common;

use std::path::Path;

use common::{next_batch, small_config};
use ringlog_protocol::manifest::{Manifest, ManifestLimits};
use ringlog_storage::io::sim::SimBackend;
use ringlog_storage::store::{InstallBudget, PartitionStore, StoreError};
use ringlog_storage::superblock::{Superblock, SuperblockError, VsrState, COPIES, COPY_SIZE_BYTES};

const NOW_MS: u64 = 1_000_000;

fn fill(io: &mut SimBackend, store: &mut PartitionStore, n: u64, seed: u64) {
    for i in 0..n {
        let batch = next_batch(store, 3, 900, seed * 100 + i);
        store.append(io, &batch).unwrap();
        store.flush(io).unwrap();
    }
}

fn assert_fenced<T>(what: &str, result: Result<T, StoreError>) {
    match result {
        Err(StoreError::Fenced { partition_id, .. }) => assert_eq!(partition_id, 2, "{what}"),
        Err(e) => panic!("{what}: expected Fenced, got {e}"),
        Ok(_) => panic!("{what}: succeeded on a fenced partition"),
    }
}

#[test]
fn every_mutating_call_on_a_fenced_partition_returns_fenced() {
    let mut io = SimBackend::new(21);
    // A source to take an install offer from, and the partition under test.
    let mut src = PartitionStore::create(&mut io, Path::new("/src"), 2, small_config()).unwrap();
    fill(&mut io, &mut src, 40, 1);
    let manifest = src.open_snapshot(&mut io, NOW_MS).unwrap();
    let mut chunks = Vec::new();
    for (a, artifact) in manifest.artifacts.iter().enumerate() {
        for c in 0..artifact.chunk_checksums.len() as u32 {
            let buf = src
                .read_chunk(&mut io, manifest.snapshot_id, a as u32, c, NOW_MS)
                .unwrap();
            chunks.push((a as u32, c, buf.to_vec()));
        }
    }
    let offer = manifest.encode();
    let decode = || Manifest::decode(&offer, &ManifestLimits::default()).unwrap();
    let mut store = PartitionStore::create(&mut io, Path::new("/p2"), 2, small_config()).unwrap();
    let budget = InstallBudget::new(4 << 20);
    let mut install = store.begin_install(&mut io, decode(), &budget).unwrap();
    for (a, c, bytes) in &chunks {
        install.accept_chunk(&mut io, *a, *c, bytes).unwrap();
    }

    // The superblock write of a VSR update fails: fail-stop.
    let sb_path = Path::new("/p2/superblock");
    io.set_fail_at(io.ops_count());
    let vsr = VsrState {
        view: 1,
        ..VsrState::default()
    };
    assert_fenced("set_vsr (the failing write)", store.set_vsr(&mut io, vsr));
    assert!(store.fenced().is_some());
    let superblock = io.read_whole(sb_path).unwrap().to_vec();

    // The install staged before the fence must not commit.
    assert_fenced("commit_install", store.commit_install(&mut io, install));
    assert!(
        io.read_whole(sb_path).unwrap() == &superblock[..],
        "a fenced partition's superblock was written"
    );
    let batch = next_batch(&store, 1, 10, 7);
    assert_fenced("append", store.append(&mut io, &batch));
    assert_fenced("flush", store.flush(&mut io));
    assert_fenced("prepare_flush", store.prepare_flush(&mut Vec::new()));
    assert_fenced(
        "prepare_checkpoint",
        store.prepare_checkpoint(&mut Vec::new()),
    );
    assert_fenced("checkpoint_frontier", store.checkpoint_frontier(&mut io));
    assert_fenced("set_vsr", store.set_vsr(&mut io, vsr));
    assert_fenced("persist_indexes", store.persist_indexes(&mut io));
    assert_fenced("apply_retention", store.apply_retention(&mut io, NOW_MS));
    assert_fenced("purge", store.purge(&mut io));
    assert_fenced("open_snapshot", store.open_snapshot(&mut io, NOW_MS));
    assert_fenced(
        "begin_install",
        store.begin_install(&mut io, decode(), &budget),
    );
    assert!(
        io.read_whole(sb_path).unwrap() == &superblock[..],
        "a fenced partition's superblock was written"
    );

    // Close writes nothing, says why, and releases every file it held.
    assert_fenced("close", store.close(&mut io));
    assert!(io.read_whole(sb_path).unwrap() == &superblock[..]);
    let open: Vec<_> = io
        .open_paths()
        .into_iter()
        .filter(|p| p.starts_with("/p2"))
        .collect();
    assert!(open.is_empty(), "files left open: {open:?}");
    src.close(&mut io).unwrap();
}

#[test]
fn a_superblock_with_two_states_under_one_sequence_is_refused_at_open() {
    let mut io = SimBackend::new(22);
    let mut store = PartitionStore::create(&mut io, Path::new("/p2"), 2, small_config()).unwrap();
    fill(&mut io, &mut store, 5, 1);
    store.close(&mut io).unwrap();
    let sb_path = Path::new("/p2/superblock");
    let file = io.read_whole(sb_path).unwrap().to_vec();
    let copies: Vec<(usize, Superblock)> = (0..COPIES)
        .filter_map(|i| {
            let bytes = &file[i * COPY_SIZE_BYTES..(i + 1) * COPY_SIZE_BYTES];
            Superblock::decode(bytes).ok().map(|(sb, _, _)| (i, sb))
        })
        .collect();
    let (copy, newest) = copies
        .iter()
        .max_by_key(|(_, sb)| sb.sequence)
        .cloned()
        .unwrap();
    // Another state under the same sequence in the newest state's other copy.
    let twin = copies
        .iter()
        .find(|(i, sb)| *i != copy && sb.sequence == newest.sequence)
        .map(|(i, _)| *i)
        .expect("each state is written to two copies");
    let mut forked = newest.clone();
    forked.vsr.commit += 1;
    let mut bytes = vec![0u8; COPY_SIZE_BYTES];
    forked.encode(twin as u16, &mut bytes);
    io.corrupt(sb_path, twin * COPY_SIZE_BYTES, &bytes);
    let err = match PartitionStore::open(&mut io, Path::new("/p2"), 2, small_config()) {
        Err(e) => e,
        Ok(_) => panic!("opened a forked superblock"),
    };
    match &err {
        StoreError::Superblock(SuperblockError::SameSequenceFork { sequence, .. }) => {
            assert_eq!(*sequence, newest.sequence)
        }
        other => panic!("expected a same-sequence fork, got {other}"),
    }
    let msg = err.to_string();
    assert!(msg.contains("/p2/superblock"), "{msg}");
    // Nothing was repaired over the evidence.
    let mut after = file.clone();
    after[twin * COPY_SIZE_BYTES..(twin + 1) * COPY_SIZE_BYTES].copy_from_slice(&bytes);
    assert!(io.read_whole(sb_path).unwrap() == &after[..]);
}
