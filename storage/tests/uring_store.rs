//! The partition store on a real disk through io_uring and O_DIRECT:
//! append/reopen/verify, group commit across partitions, and a child process
//! SIGKILLed while appending.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{make_batch, next_batch, read_all};
use ringlog_storage::io::uring::UringBackend;
use ringlog_storage::store::{flush_all, PartitionStore, StoreConfig};

fn config() -> StoreConfig {
    StoreConfig {
        segment_size_bytes: 1024 * 1024,
        write_buffer_bytes: 256 * 1024,
        index_interval_bytes: 16 * 1024,
        ..StoreConfig::default()
    }
}

#[test]
fn append_reopen_verify_across_partitions() {
    let tmp = tempfile::tempdir().unwrap();
    let mut io = UringBackend::new(64).unwrap();
    let mut stores: Vec<PartitionStore> = (0..3)
        .map(|p| {
            PartitionStore::create(&mut io, &tmp.path().join(format!("p{p}")), p, config()).unwrap()
        })
        .collect();
    let mut expected: Vec<Vec<Vec<u8>>> = vec![Vec::new(); 3];
    for round in 0..150u64 {
        for (p, store) in stores.iter_mut().enumerate() {
            let records = 1 + (round % 7) as u32;
            let value_len = [10, 500, 3000, 9000, 20_000][(round as usize + p) % 5];
            let batch = next_batch(store, records, value_len, round * 10 + p as u64);
            store.append(&mut io, &batch).unwrap();
            expected[p].push(batch);
        }
        let mut refs: Vec<&mut PartitionStore> = stores.iter_mut().collect();
        flush_all(&mut io, &mut refs).unwrap();
    }
    assert!(
        stores.iter().all(|s| s.sealed_segments().count() >= 2),
        "rolled segments"
    );
    for (p, store) in stores.iter_mut().enumerate() {
        let got: Vec<Vec<u8>> = read_all(&mut io, store)
            .into_iter()
            .map(|(_, b)| b)
            .collect();
        assert!(got == expected[p], "partition {p} before reopen");
    }
    // Half closed cleanly, half just dropped (recovered by scanning).
    let mut stores = stores.into_iter();
    stores.next().unwrap().close(&mut io).unwrap();
    drop(stores);
    drop(io);
    let mut io = UringBackend::new(64).unwrap();
    for (p, expected) in expected.iter().enumerate() {
        let mut store = PartitionStore::open(
            &mut io,
            &tmp.path().join(format!("p{p}")),
            p as u32,
            config(),
        )
        .unwrap();
        let got: Vec<Vec<u8>> = read_all(&mut io, &mut store)
            .into_iter()
            .map(|(_, b)| b)
            .collect();
        assert!(&got == expected, "partition {p} after reopen");
        // And it keeps accepting appends.
        let batch = next_batch(&store, 2, 100, 1);
        store.append(&mut io, &batch).unwrap();
        store.flush(&mut io).unwrap();
    }
}

const CHILD_DIR_ENV: &str = "RINGLOG_TEST_CHILD_DIR";

/// Not a test on its own: the body of the child process the SIGKILL test
/// starts. It appends forever, printing each acknowledged batch's seed and
/// base offset after its flush returned.
#[test]
fn child_appender() {
    let Ok(dir) = std::env::var(CHILD_DIR_ENV) else {
        return;
    };
    let mut io = UringBackend::new(64).unwrap();
    let mut store = PartitionStore::create(&mut io, Path::new(&dir), 0, config()).unwrap();
    let mut seed = 0u64;
    loop {
        let mut acked = Vec::new();
        for _ in 0..1 + seed % 3 {
            let batch = next_batch(
                &store,
                1 + (seed % 5) as u32,
                (seed as usize * 37) % 5000,
                seed,
            );
            let appended = store.append(&mut io, &batch).unwrap();
            acked.push((seed, appended.base_offset, batch.len()));
            seed += 1;
        }
        store.flush(&mut io).unwrap();
        for (seed, base, len) in acked {
            println!("acked {seed} {base} {len}");
        }
    }
}

#[test]
fn sigkill_while_appending_loses_no_acknowledged_batch() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("p0");
    for round in 0..3u64 {
        if dir.exists() {
            std::fs::remove_dir_all(&dir).unwrap();
        }
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "child_appender",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_DIR_ENV, &dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let mut acked: Vec<(u64, u64, usize)> = Vec::new();
        let want = 300 + round * 700;
        let deadline = Instant::now() + Duration::from_secs(60);
        while (acked.len() as u64) < want && Instant::now() < deadline {
            let Some(Ok(line)) = lines.next() else { break };
            acked.extend(parse_ack(&line));
        }
        // SIGKILL mid-stream: appends and flushes are in flight right now.
        unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
        child.wait().unwrap();
        // Acks printed before the kill but not yet read are still acks.
        for line in lines.map_while(Result::ok) {
            let parts: Vec<&str> = line.split_whitespace().collect();
            if parts.len() == 4 && parts[0] == "acked" {
                acked.push((
                    parts[1].parse().unwrap(),
                    parts[2].parse().unwrap(),
                    parts[3].parse().unwrap(),
                ));
            }
        }
        assert!(
            acked.len() as u64 >= want.min(100),
            "child acknowledged only {}",
            acked.len()
        );

        let mut io = UringBackend::new(64).unwrap();
        let mut store = PartitionStore::open(&mut io, &dir, 0, config()).unwrap();
        let stored: std::collections::BTreeMap<u64, Vec<u8>> =
            read_all(&mut io, &mut store).into_iter().collect();
        let mut prev = 0;
        for &(seed, base, len) in &acked {
            let got = stored
                .get(&base)
                .unwrap_or_else(|| panic!("acknowledged batch at {base} lost"));
            let expected = make_batch(
                0,
                base,
                prev,
                1 + (seed % 5) as u32,
                (seed as usize * 37) % 5000,
                seed,
            );
            assert_eq!(got.len(), len);
            if got != &expected {
                let a = ringlog_protocol::BatchHeader::decode(got).unwrap();
                let b = ringlog_protocol::BatchHeader::decode(&expected).unwrap();
                panic!("acknowledged batch at {base} changed: stored {a:?} expected {b:?}");
            }
            prev = ringlog_protocol::BatchHeader::decode(got)
                .unwrap()
                .header_checksum;
        }
        println!(
            "round {round}: {} acknowledged batches intact after SIGKILL",
            acked.len()
        );
    }
}

/// Parses "acked SEED BASE LEN" (libtest may print its own text before it on
/// the same line). A line cut short by the kill is not an ack.
fn parse_ack(line: &str) -> Option<(u64, u64, usize)> {
    let rest = &line[line.find("acked ")? + "acked ".len()..];
    let mut parts = rest.split_whitespace().map(|p| p.parse::<u64>());
    let (seed, base, len) = (
        parts.next()?.ok()?,
        parts.next()?.ok()?,
        parts.next()?.ok()?,
    );
    Some((seed, base, len as usize))
}

/// On the real kernel: a spare is created (after the unlink of a missing
/// one, linked before its open), reserved and renamed into place by the
/// roll, and a reservation ahead lands; the data survives a reopen.
#[test]
fn rolls_into_spares_and_reservations_ahead_on_io_uring() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("p");
    let mut io = UringBackend::new(64).unwrap();
    let mut store = PartitionStore::create(&mut io, &dir, 1, config()).unwrap();
    let (mut spares, mut ahead) = (0, 0);
    let mut expected = Vec::new();
    for round in 0..200u64 {
        if store.spare_due() {
            store.provision_spare(&mut io).expect("spare on io_uring");
            assert!(store.spare_ready());
            spares += 1;
        }
        if store.reserve_ahead_due() {
            let sqes = store.prepare_reserve_ahead();
            let done = ringlog_storage::io::IoBackend::submit(&mut io, sqes);
            store
                .complete_reserve_ahead(done)
                .expect("reservation ahead");
            ahead += 1;
        }
        let batch = next_batch(&store, 4, 3000, round);
        store.append(&mut io, &batch).unwrap();
        store.flush(&mut io).unwrap();
        expected.push(batch);
    }
    // ~2.4 MiB into 1 MiB segments: two rolls, each into a spare.
    assert!(spares >= 2 && ahead >= 2, "spares {spares}, ahead {ahead}");
    assert!(store.sealed_segments().count() >= 2);
    let spare_name = dir
        .join(format!("gen-{:020}", store.superblock().live_generation))
        .join(ringlog_storage::store::SPARE_FILE);
    store.close(&mut io).unwrap();
    let mut store = PartitionStore::open(&mut io, &dir, 1, config()).unwrap();
    assert!(!spare_name.exists(), "a spare left at close is garbage");
    let got: Vec<Vec<u8>> = read_all(&mut io, &mut store)
        .into_iter()
        .map(|(_, b)| b)
        .collect();
    assert_eq!(got, expected);
}
