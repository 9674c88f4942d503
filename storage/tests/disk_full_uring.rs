//! A full disk on a real filesystem (issue 8 item 14): a small loop-mounted
//! ext4 fills up under a partition; appends are refused with DiskFull, the
//! partition is not fenced, every acknowledged batch stays readable, and
//! appends resume once space is freed. Needs root (mkfs.ext4, mount -o
//! loop); skipped, saying so, where that is unavailable.

mod common;

use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{next_batch, read_all};
use ringlog_storage::io::uring::UringBackend;
use ringlog_storage::store::{PartitionStore, StoreConfig, StoreError};

/// A mounted ext4 image, unmounted on drop.
struct LoopFs {
    mnt: PathBuf,
    _dir: tempfile::TempDir,
}

impl LoopFs {
    fn mount(size_bytes: u64) -> Result<LoopFs, String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("not root".into());
        }
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).map_err(|e| e.to_string())?;
        let img = dir.path().join("fs.img");
        let mnt = dir.path().join("mnt");
        fs::create_dir(&mnt).map_err(|e| e.to_string())?;
        fs::File::create(&img)
            .and_then(|f| f.set_len(size_bytes))
            .map_err(|e| e.to_string())?;
        run("mkfs.ext4", &["-q", "-F", path_str(&img)])?;
        run("mount", &["-o", "loop", path_str(&img), path_str(&mnt)])?;
        Ok(LoopFs { mnt, _dir: dir })
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        let _ = run("umount", &[path_str(&self.mnt)]);
    }
}

fn path_str(p: &Path) -> &str {
    p.to_str().expect("utf-8 temp path")
}

fn run(cmd: &str, args: &[&str]) -> Result<(), String> {
    match Command::new(cmd).args(args).output() {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => Err(format!(
            "{cmd} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Err(e) => Err(format!("{cmd}: {e}")),
    }
}

/// Writes a file until the filesystem is full; returns its path.
fn fill(dir: &Path) -> PathBuf {
    let path = dir.join("ballast");
    let mut f = fs::File::create(&path).unwrap();
    let chunk = vec![0xA5u8; 64 << 10];
    while f.write_all(&chunk).is_ok() {}
    // What the page cache accepted may still fail to reach the disk.
    let _ = f.sync_all();
    path
}

#[test]
fn a_full_ext4_refuses_appends_keeps_reads_and_recovers() {
    let lfs = match LoopFs::mount(48 << 20) {
        Ok(lfs) => lfs,
        Err(why) => {
            eprintln!("skipped: no loop-mounted ext4 ({why})");
            return;
        }
    };
    let config = StoreConfig {
        segment_size_bytes: 2 << 20,
        write_buffer_bytes: 256 << 10,
        ..StoreConfig::default()
    };
    let dir = lfs.mnt.join("p");
    let mut io = UringBackend::new(64).unwrap();
    let mut store = PartitionStore::create(&mut io, &dir, 1, config.clone()).unwrap();
    let ballast = fill(&lfs.mnt);
    let mut acked = Vec::new();
    let refusal = loop {
        let batch = next_batch(&store, 4, 4000, acked.len() as u64);
        match store.append(&mut io, &batch) {
            Ok(_) => {
                store.flush(&mut io).unwrap();
                acked.push(batch);
            }
            Err(e) => break e,
        }
        assert!(acked.len() < 10_000, "the disk never filled");
    };
    assert!(
        matches!(refusal, StoreError::DiskFull { .. }),
        "refused with {refusal}"
    );
    assert!(store.fenced().is_none(), "a full disk fenced the partition");
    let contents = |io: &mut UringBackend, store: &mut PartitionStore| -> Vec<Vec<u8>> {
        read_all(io, store).into_iter().map(|(_, b)| b).collect()
    };
    assert!(contents(&mut io, &mut store) == acked, "reads go on");
    // Free the space: appends resume where the log ended.
    fs::remove_file(&ballast).unwrap();
    for seed in 0..200 {
        let batch = next_batch(&store, 4, 4000, 100_000 + seed);
        store.append(&mut io, &batch).unwrap();
        store.flush(&mut io).unwrap();
        acked.push(batch);
    }
    assert!(contents(&mut io, &mut store) == acked);
    store.close(&mut io).unwrap();
    let mut store = PartitionStore::open(&mut io, &dir, 1, config).unwrap();
    assert!(contents(&mut io, &mut store) == acked);
    store.close(&mut io).unwrap();
}
