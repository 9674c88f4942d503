//! Deleting a topic through a running server: the shards move the
//! partition directories into the trash and the sweeper thread removes
//! them; what a crash left in the trash is removed by the next start.

mod common;

use std::path::Path;
use std::time::Duration;

use common::config;
use ringlog_shard::client::{batch_of, Client};
use ringlog_shard::server::{self, Hooks};

fn entries(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |d| d.count())
}

#[test]
fn a_deleted_topic_leaves_nothing_and_trash_left_by_a_crash_goes_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let trash = data.join("trash");

    let running = server::start(config(&data), Hooks::default()).unwrap();
    let mut c = Client::connect(running.client_addr).unwrap();
    c.create_topic("gone", 4).unwrap();
    for p in 0..4 {
        c.produce("gone", p, batch_of(&[b"a", b"b"]).unwrap())
            .unwrap();
    }
    c.delete_topic("gone").unwrap();
    // The names are free at once: nothing of the topic is left in place.
    assert!(!data.join("topics/gone").exists());
    c.create_topic("gone", 1).unwrap();
    let fresh = c.produce("gone", 0, batch_of(&[b"x"]).unwrap()).unwrap();
    assert_eq!(fresh.base_offset, 0, "the new topic starts empty");
    c.delete_topic("gone").unwrap();
    drop(c);
    running.shutdown_handle().trigger();
    running.wait().unwrap();
    // The sweeper finished before the server stopped.
    assert!(trash.is_dir());
    assert_eq!(entries(&trash), 0, "the trash was emptied");

    // A crash while the sweeper was removing a partition: part of it left.
    let left = trash.join("41");
    std::fs::create_dir_all(left.join("gen3")).unwrap();
    std::fs::write(left.join("gen3/00000000.seg"), vec![7u8; 8192]).unwrap();
    std::fs::write(left.join("superblock"), vec![1u8; 4096]).unwrap();
    let running = server::start(config(&data), Hooks::default()).unwrap();
    let mut waited_ms = 0;
    while left.exists() {
        assert!(waited_ms < 10_000, "leftover trash not removed after start");
        std::thread::sleep(Duration::from_millis(10));
        waited_ms += 10;
    }
    running.shutdown_handle().trigger();
    running.wait().unwrap();
    assert_eq!(entries(&trash), 0);
}

/// The shard count went down: the recycle dirs of shards that no longer
/// run go through the trash (the shards never remove them themselves), the
/// running shards' stay.
#[test]
fn stale_recycle_dirs_of_removed_shards_are_trashed_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    for stale in ["recycle/2", "recycle/7", "recycle/junk"] {
        std::fs::create_dir_all(data.join(stale)).unwrap();
        std::fs::write(data.join(stale).join("00000001.seg"), vec![0u8; 4096]).unwrap();
    }
    let running = server::start(config(&data), Hooks::default()).unwrap();
    running.shutdown_handle().trigger();
    running.wait().unwrap();
    let mut left: Vec<String> = std::fs::read_dir(data.join("recycle"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["0", "1"], "only the two running shards' dirs stay");
    assert_eq!(entries(&data.join("trash")), 0, "the trash was emptied");
}
