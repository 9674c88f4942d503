//! The shard journal (group commit across partitions) on the sim backend
//! (and once on io_uring).
//!
//! A small "shard" here drives what the real one does each turn: appends to
//! several partitions, then one submission holding every partition's
//! segment write (written behind, no fdatasync of its own when journaled;
//! a direct flush otherwise) plus ONE journal write and ONE fdatasync;
//! appends are acknowledged only once that completed. Checkpoints run when
//! the ring passes half full. Crash-point tests crash at every I/O (with
//! and without tearing), reboot, replay and check:
//! - every acknowledged batch is present once, with identical bytes;
//! - every batch served is one that was appended (nothing torn or foreign);
//! - no partition's frontier moved back;
//! - the recovered shard journals further appends that survive a reboot.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use common::{next_batch, read_all, small_config};
use ringlog_protocol::BatchHeader;
use ringlog_storage::io::sim::{Fault, FaultOp, Faults, SimBackend};
use ringlog_storage::io::{BatchId, Completion, FileId, IoBackend, Op, OpenMode, Sqe};
use ringlog_storage::journal::{Journal, JournalConfig, JournalError, DATA_START};
use ringlog_storage::store::{
    PartitionStore, PoolConfig, StoreConfig, StorePool, SPARE_FILE, ZERO_AHEAD_BYTES,
};

const SHARD: &str = "/shard";

fn journal_path() -> PathBuf {
    Path::new(SHARD).join("journal")
}

fn partition_dir(pid: u32) -> PathBuf {
    Path::new(SHARD).join(format!("p{pid}"))
}

/// A 256 KiB journal: the workloads below wrap it and checkpoint often.
fn journal_config() -> JournalConfig {
    JournalConfig {
        journal_bytes: 256 * 1024,
        append_bytes_max: 8 * 1024,
        turn_bytes_max: 24 * 1024,
        turn_records_max: 64,
    }
}

fn store_config() -> StoreConfig {
    small_config()
}

/// What the workload had been told before the crash.
#[derive(Default, Debug)]
struct Model {
    created: bool,
    /// Every batch appended (acknowledged or not), by (partition, offset).
    appended: BTreeMap<(u32, u64), Vec<u8>>,
    acked: BTreeMap<(u32, u64), Vec<u8>>,
    /// The highest superblock frontier seen, per partition.
    frontier_max: BTreeMap<u32, u64>,
    seed: u64,
}

struct Shard {
    journal: Journal,
    pool: StorePool,
    stores: BTreeMap<u32, PartitionStore>,
    checkpoints: u64,
    journal_writes: u64,
    direct_flushes: u64,
}

fn pool(config: &StoreConfig) -> StorePool {
    StorePool::new(
        Path::new(SHARD).join("recycle"),
        PoolConfig::private(config),
    )
}

fn fsync_dir(io: &mut impl IoBackend, dir: &Path) -> Result<(), String> {
    let file = io.open_dir(dir).map_err(|e| e.to_string())?;
    let done = io.submit(vec![Sqe::new(Op::Fsync { file })]);
    io.close(file);
    done.into_iter()
        .try_for_each(|c| c.result.map(|_| ()))
        .map_err(|e| e.to_string())
}

impl Shard {
    fn create(io: &mut impl IoBackend, pids: &[u32]) -> Result<Self, String> {
        let err = |e: std::io::Error| e.to_string();
        io.create_dir(Path::new(SHARD)).map_err(err)?;
        io.create_dir(&Path::new(SHARD).join("recycle"))
            .map_err(err)?;
        fsync_dir(io, Path::new("/"))?;
        let (journal, records) =
            Journal::open(io, &journal_path(), journal_config()).map_err(|e| e.to_string())?;
        assert!(records.is_empty());
        fsync_dir(io, Path::new(SHARD))?;
        let config = store_config();
        let pool = pool(&config);
        let mut stores = BTreeMap::new();
        for &pid in pids {
            let s = PartitionStore::create_in(
                io,
                &partition_dir(pid),
                pid,
                config.clone(),
                pool.clone(),
            )
            .map_err(|e| e.to_string())?;
            stores.insert(pid, s);
        }
        Ok(Self::with(journal, pool, stores))
    }

    fn with(journal: Journal, pool: StorePool, stores: BTreeMap<u32, PartitionStore>) -> Self {
        Self {
            journal,
            pool,
            stores,
            checkpoints: 0,
            journal_writes: 0,
            direct_flushes: 0,
        }
    }

    /// Opens the journal, hands its records to the pool, opens every
    /// partition (each replays its own).
    fn boot(io: &mut impl IoBackend, pids: &[u32]) -> Result<Self, String> {
        let (journal, records) =
            Journal::open(io, &journal_path(), journal_config()).map_err(|e| e.to_string())?;
        let config = store_config();
        let pool = pool(&config);
        pool.set_journal_replay(records);
        let mut stores = BTreeMap::new();
        for &pid in pids {
            let s =
                PartitionStore::open_in(io, &partition_dir(pid), pid, config.clone(), pool.clone())
                    .map_err(|e| e.to_string())?;
            stores.insert(pid, s);
        }
        assert!(!pool.journal_replay_pending(), "every partition replayed");
        Ok(Self::with(journal, pool, stores))
    }

    /// Appends `batches` (partition, records, value length) and group
    /// commits them; the acknowledged ones go to `model.acked`.
    fn turn(
        &mut self,
        io: &mut impl IoBackend,
        batches: &[(u32, u32, usize)],
        model: &mut Model,
    ) -> Result<(), String> {
        let mut pending: BTreeMap<u32, Vec<(u64, Vec<u8>)>> = BTreeMap::new();
        for &(pid, records, value_len) in batches {
            let store = self.stores.get_mut(&pid).ok_or("no such partition")?;
            model.seed += 1;
            let batch = next_batch(store, records, value_len, model.seed);
            let appended = store.append(io, &batch).map_err(|e| e.to_string())?;
            model
                .appended
                .insert((pid, appended.base_offset), batch.clone());
            pending
                .entry(pid)
                .or_default()
                .push((appended.base_offset, batch));
        }
        let durable = self.commit(io, &pending.keys().copied().collect::<Vec<_>>())?;
        for pid in durable {
            for (offset, batch) in pending.remove(&pid).unwrap_or_default() {
                model.acked.insert((pid, offset), batch);
            }
        }
        for (pid, s) in &self.stores {
            let f = model.frontier_max.entry(*pid).or_default();
            *f = (*f).max(s.superblock().frontier.next_offset);
        }
        self.maybe_checkpoint(io)?;
        if pending.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "not durable: {:?}",
                pending.keys().collect::<Vec<_>>()
            ))
        }
    }

    /// One submission: every partition's flush (journaled when it fits)
    /// and the journal's write + fdatasync. Returns the partitions whose
    /// appends are durable now.
    fn commit(&mut self, io: &mut impl IoBackend, pids: &[u32]) -> Result<Vec<u32>, String> {
        let mut sqes = Vec::new();
        let mut parts = Vec::new();
        for &pid in pids {
            let store = self.stores.get_mut(&pid).ok_or("no such partition")?;
            let before = self.journal.turn_records();
            match store.prepare_flush_journaled(&mut sqes, &mut self.journal) {
                Ok(0) => {}
                Ok(n) => parts.push((pid, n, self.journal.turn_records() > before)),
                Err(e) => return Err(e.to_string()),
            }
        }
        let journal_entries = self.journal.prepare_write(&mut sqes);
        let mut completions = io.submit(sqes).into_iter();
        let per_part: Vec<Vec<Completion>> = parts
            .iter()
            .map(|&(_, n, _)| completions.by_ref().take(n).collect())
            .collect();
        let journal_done = if journal_entries > 0 {
            self.journal_writes += 1;
            self.journal.complete_write(completions)
        } else {
            Ok(())
        };
        let mut durable = Vec::new();
        let mut failure = journal_done.as_ref().err().map(|e| e.to_string());
        for ((pid, _, journaled), mut cs) in parts.into_iter().zip(per_part) {
            if journaled {
                cs.push(self.journal.durable_completion(&journal_done));
            } else {
                self.direct_flushes += 1;
            }
            match self.stores.get_mut(&pid).map(|s| s.complete_flush(cs)) {
                Some(Ok(())) => durable.push(pid),
                Some(Err(e)) => {
                    failure.get_or_insert(e.to_string());
                }
                None => unreachable!("flushed partitions stay"),
            }
        }
        match failure {
            Some(f) if durable.is_empty() => Err(f),
            _ => Ok(durable),
        }
    }

    /// A checkpoint when due: fdatasync the segments with live records,
    /// then commit the new tail in the journal's header.
    fn maybe_checkpoint(&mut self, io: &mut impl IoBackend) -> Result<(), String> {
        if !self.journal.checkpoint_due() || self.pool.journal_replay_pending() {
            return Ok(());
        }
        let pids = self.journal.begin_checkpoint();
        let mut sqes = Vec::new();
        for pid in &pids {
            let Some(sqe) = self.stores.get(pid).and_then(|s| s.segment_sync_sqe()) else {
                self.journal
                    .abandon_checkpoint(format!("partition {pid} fenced"));
                return Ok(());
            };
            sqes.push(sqe);
        }
        for (pid, c) in pids.iter().zip(io.submit(sqes)) {
            if let Err(e) = c.result {
                let store = self.stores.get_mut(pid).ok_or("no such partition")?;
                let fenced = store.fence_segment_sync(&e.to_string());
                self.journal.abandon_checkpoint(fenced.to_string());
                return Err(fenced.to_string());
            }
        }
        let mut sqes = Vec::new();
        self.journal.prepare_checkpoint_commit(&mut sqes);
        let done = io.submit(sqes);
        self.journal
            .complete_checkpoint(done)
            .map_err(|e| e.to_string())?;
        self.checkpoints += 1;
        Ok(())
    }

    fn close(self, io: &mut impl IoBackend) -> Result<(), String> {
        let Shard {
            journal, stores, ..
        } = self;
        for (_, s) in stores {
            s.close(io).map_err(|e| e.to_string())?;
        }
        journal.close(io);
        Ok(())
    }
}

#[derive(Clone, Debug)]
enum Step {
    /// One batch per entry: (partition, records, value length).
    Turn(Vec<(u32, u32, usize)>),
    /// Close every store and the journal, boot again (no crash).
    Restart,
    /// A superblock write on every partition (VSR state), with bytes
    /// written behind the journal pending: replay skips records naming the
    /// older superblock, so the segment must be durable before it.
    Vsr,
}

const PIDS: [u32; 4] = [1, 2, 3, 4];

fn run(io: &mut impl IoBackend, steps: &[Step], model: &mut Model) -> Result<Shard, String> {
    let mut shard = Shard::create(io, &PIDS)?;
    model.created = true;
    for step in steps {
        match step {
            Step::Turn(batches) => shard.turn(io, batches, model)?,
            Step::Restart => {
                shard.close(io)?;
                shard = Shard::boot(io, &PIDS)?;
            }
            Step::Vsr => {
                for s in shard.stores.values_mut() {
                    let vsr = s.superblock().vsr;
                    s.set_vsr(io, vsr).map_err(|e| e.to_string())?;
                }
            }
        }
    }
    Ok(shard)
}

/// Recovers after a crash and checks the invariants; false when the crash
/// came before the shard was created.
fn check_recovery(io: SimBackend, model: &Model, label: &str) -> bool {
    let mut io = io.reboot();
    let mut shard = match Shard::boot(&mut io, &PIDS) {
        Ok(shard) => shard,
        Err(e) => {
            assert!(!model.created, "{label}: boot failed after create: {e:?}");
            return false;
        }
    };
    check_stores(&mut io, &mut shard, model, label);
    // Further appends are journaled and survive another power cut.
    let mut after = Model {
        seed: 1_000_000,
        ..Model::default()
    };
    let batches: Vec<_> = PIDS.iter().map(|&p| (p, 2, 50)).collect();
    shard
        .turn(&mut io, &batches, &mut after)
        .unwrap_or_else(|e| panic!("{label}: turn after recovery: {e}"));
    assert!(
        shard.journal_writes > 0,
        "{label}: journal unused after recovery"
    );
    let mut io = io.reboot();
    let mut shard =
        Shard::boot(&mut io, &PIDS).unwrap_or_else(|e| panic!("{label}: second boot: {e:?}"));
    check_stores(&mut io, &mut shard, &after, label);
    true
}

fn check_stores(io: &mut impl IoBackend, shard: &mut Shard, model: &Model, label: &str) {
    for (&pid, store) in shard.stores.iter_mut() {
        let acked_end = model
            .acked
            .range((pid, 0)..=(pid, u64::MAX))
            .last()
            .map_or(0, |(_, b)| BatchHeader::decode(b).unwrap().next_offset());
        assert!(
            store.durable().next_offset >= acked_end,
            "{label}: partition {pid} durable end {} below acknowledged end {acked_end}",
            store.durable().next_offset
        );
        let floor = model.frontier_max.get(&pid).copied().unwrap_or(0);
        assert!(
            store.superblock().frontier.next_offset >= floor,
            "{label}: partition {pid} frontier moved back"
        );
        let stored: BTreeMap<u64, Vec<u8>> = read_all(io, store).into_iter().collect();
        for ((_, offset), bytes) in model.acked.range((pid, 0)..=(pid, u64::MAX)) {
            assert!(
                stored.get(offset) == Some(bytes),
                "{label}: partition {pid}: acknowledged batch {offset} lost or changed"
            );
        }
        for (offset, bytes) in &stored {
            if let Some(known) = model.appended.get(&(pid, *offset)) {
                assert!(
                    known == bytes,
                    "{label}: partition {pid}: batch {offset} served with other bytes"
                );
            }
        }
    }
}

/// Runs `steps` crashing at every I/O, with and without tearing. Returns
/// the crash points recovered and checked.
fn crash_everywhere(name: &str, steps: &[Step]) -> u64 {
    let mut io = SimBackend::new(1);
    let mut model = Model::default();
    let shard = run(&mut io, steps, &mut model).expect("workload runs clean without crashes");
    assert!(
        shard.checkpoints >= 2,
        "{name}: only {} checkpoints",
        shard.checkpoints
    );
    assert!(
        shard.journal_writes > 20,
        "{name}: only {} journal writes",
        shard.journal_writes
    );
    let total_ops = io.ops_count();
    let mut points = 0;
    for crash_at in 0..=total_ops {
        for tear in [false, true] {
            let seed = crash_at * 2 + u64::from(tear) + 17;
            let mut io = SimBackend::new(seed);
            io.set_crash_at(crash_at, tear);
            let mut model = Model::default();
            let result = run(&mut io, steps, &mut model);
            assert!(
                result.is_err() || crash_at == total_ops,
                "{name}: crash at {crash_at} went unnoticed"
            );
            let label = format!("{name} crash_at={crash_at} tear={tear} seed={seed}");
            if check_recovery(io, &model, &label) {
                points += 1;
            }
        }
    }
    println!("{name}: {total_ops} I/Os, {points} crash points recovered and checked");
    points
}

/// `turns` turns, each one small batch on every partition (sizes vary), a
/// big one (past `append_bytes_max`: a direct flush) every 7th turn.
fn small_turns(turns: u64, seed: u64) -> Vec<Step> {
    (0..turns)
        .map(|t| {
            let mut batches: Vec<_> = PIDS
                .iter()
                .map(|&p| {
                    (
                        p,
                        1 + ((t + u64::from(p) + seed) % 3) as u32,
                        200 + ((t * 37 + seed) % 900) as usize,
                    )
                })
                .collect();
            if t % 7 == 3 {
                batches.push((PIDS[(t % 4) as usize], 4, 3000));
            }
            Step::Turn(batches)
        })
        .collect()
}

#[test]
fn crash_during_journal_turns_and_checkpoints() {
    // Enough turns to fill the 256 KiB ring past half a few times (so
    // checkpoints and wraps happen) and to roll the 64 KiB segments.
    let mut steps = small_turns(90, 0);
    steps.insert(60, Step::Vsr);
    steps.insert(20, Step::Vsr);
    let points = crash_everywhere("journal", &steps);
    assert!(points > 500, "only {points} crash points");
}

#[test]
fn crash_around_a_restart_that_replays() {
    let mut steps = small_turns(30, 5);
    steps.push(Step::Restart);
    steps.extend(small_turns(40, 9));
    let points = crash_everywhere("restart", &steps);
    assert!(points > 300, "only {points} crash points");
}

#[test]
fn one_journal_write_and_one_fdatasync_per_turn() {
    let mut io = SimBackend::new(3);
    let mut model = Model::default();
    let mut shard = Shard::create(&mut io, &PIDS).unwrap();
    let batches: Vec<_> = PIDS.iter().map(|&p| (p, 1, 100)).collect();
    // The first turn also writes each segment's zeros ahead.
    shard.turn(&mut io, &batches, &mut model).unwrap();
    let syncs = io.op_count(FaultOp::Sync);
    let writes = io.op_count(FaultOp::Write);
    shard.turn(&mut io, &batches, &mut model).unwrap();
    // Four segment writes (behind, no fdatasync) + one journal write.
    assert_eq!(io.op_count(FaultOp::Write) - writes, 5);
    assert_eq!(
        io.op_count(FaultOp::Sync) - syncs,
        1,
        "one fdatasync for four partitions"
    );
    assert_eq!(model.acked.len(), 8);
}

/// One write to a segment file, as submitted.
struct SegmentWrite {
    file: u32,
    offset: u64,
    len: u64,
    zeros: bool,
}

/// The sim backend, recording every write to a segment file (`.log`, a
/// recycled or a spare one) on its way.
struct Recorder {
    inner: SimBackend,
    /// Ids (`FileId.0`) of the open segment files.
    segments: BTreeSet<u32>,
    writes: Vec<SegmentWrite>,
}

impl Recorder {
    fn record(&mut self, batch: &[Sqe]) {
        for sqe in batch {
            if let Op::Write { file, offset, buf } = &sqe.op {
                if self.segments.contains(&file.0) {
                    self.writes.push(SegmentWrite {
                        file: file.0,
                        offset: *offset,
                        len: buf.len() as u64,
                        zeros: buf.iter().all(|&b| b == 0),
                    });
                }
            }
        }
    }
}

impl IoBackend for Recorder {
    fn open_file(&mut self, path: &Path, mode: OpenMode) -> std::io::Result<FileId> {
        let file = self.inner.open_file(path, mode)?;
        let name = path.to_string_lossy();
        let segment =
            name.ends_with(".log") || name.contains("recycle") || name.contains(SPARE_FILE);
        if segment {
            self.segments.insert(file.0);
        } else {
            self.segments.remove(&file.0);
        }
        Ok(file)
    }
    fn open_dir(&mut self, path: &Path) -> std::io::Result<FileId> {
        self.inner.open_dir(path)
    }
    fn close(&mut self, file: FileId) {
        self.segments.remove(&file.0);
        self.inner.close(file)
    }
    fn create_dir(&mut self, path: &Path) -> std::io::Result<()> {
        self.inner.create_dir(path)
    }
    fn list_dir(&mut self, path: &Path) -> std::io::Result<Vec<String>> {
        self.inner.list_dir(path)
    }
    fn exists(&mut self, path: &Path) -> std::io::Result<bool> {
        self.inner.exists(path)
    }
    fn file_size(&mut self, file: FileId) -> std::io::Result<u64> {
        self.inner.file_size(file)
    }
    fn allocate_range(&mut self, file: FileId, offset: u64, len_bytes: u64) -> std::io::Result<()> {
        self.inner.allocate_range(file, offset, len_bytes)
    }
    fn submit(&mut self, batch: Vec<Sqe>) -> Vec<Completion> {
        self.record(&batch);
        self.inner.submit(batch)
    }
    fn submit_nowait(&mut self, batch: Vec<Sqe>) -> BatchId {
        self.record(&batch);
        self.inner.submit_nowait(batch)
    }
    fn reap(&mut self) -> Vec<(BatchId, Vec<Completion>)> {
        self.inner.reap()
    }
    fn batches_running(&self) -> usize {
        self.inner.batches_running()
    }
}

/// Small journaled flushes overwrite blocks written before (by an earlier
/// flush or the zeros ahead), so on ext4 they need no unwritten-extent
/// conversion and io_uring does not hand them to a worker thread; the
/// zeros never land on data, stay within their bound, and recovery reads
/// everything acknowledged back.
#[test]
fn journaled_flushes_overwrite_blocks_already_written() {
    let mut io = Recorder {
        inner: SimBackend::new(31),
        segments: BTreeSet::new(),
        writes: Vec::new(),
    };
    let steps: Vec<Step> = (0..120u64)
        .map(|t| {
            Step::Turn(
                PIDS.iter()
                    .map(|&p| (p, 1, 300 + (t % 5) as usize * 97))
                    .collect(),
            )
        })
        .collect();
    let mut model = Model::default();
    drop(run(&mut io, &steps, &mut model).unwrap());
    let capacity = store_config().segment_size_bytes;
    // Per file: the end of the blocks written so far, and of the data.
    let mut written_end: BTreeMap<u32, u64> = BTreeMap::new();
    let mut data_end: BTreeMap<u32, u64> = BTreeMap::new();
    let (mut zero_writes, mut data_writes, mut conversions) = (0, 0, 0);
    for w in io.writes.iter().filter(|w| w.offset < capacity) {
        let end = w.offset + w.len;
        if w.zeros {
            zero_writes += 1;
            assert!(
                w.len <= ZERO_AHEAD_BYTES,
                "zeros ahead over their bound: {}",
                w.len
            );
            assert!(
                w.offset >= data_end.get(&w.file).copied().unwrap_or(0),
                "zeros over data"
            );
        } else {
            data_writes += 1;
            // A segment's first write has nothing written before it.
            if written_end.get(&w.file).is_some_and(|&e| end > e) {
                conversions += 1;
            }
            let d = data_end.entry(w.file).or_default();
            *d = (*d).max(end);
        }
        let e = written_end.entry(w.file).or_default();
        *e = (*e).max(end);
    }
    assert_eq!(
        conversions, 0,
        "{conversions} of {data_writes} data writes past the written blocks"
    );
    assert!(
        data_writes > 400 && zero_writes > 0,
        "{data_writes} data, {zero_writes} zeros"
    );
    assert!(check_recovery(io.inner, &model, "zeros ahead"));
}

/// Without replay, the written-behind segment bytes are lost at a power cut
/// (they were never fdatasynced): the journal is what keeps them.
/// Without replay, the written-behind segment bytes are lost at a power cut
/// (they were never fdatasynced): the journal is what keeps them. The same
/// seeded run twice: once opened without the journal's records, once with.
#[test]
fn acknowledged_appends_survive_only_through_the_journal_replay() {
    let steps = small_turns(6, 1);
    let mut io = SimBackend::new(11);
    let mut model = Model::default();
    let shard = run(&mut io, &steps, &mut model).unwrap();
    assert_eq!(shard.direct_flushes, 1, "turn 3's big batch");
    drop(shard);
    let mut bare = io.reboot();
    let mut missing = 0;
    for pid in PIDS {
        let acked = model.acked.range((pid, 0)..=(pid, u64::MAX));
        match PartitionStore::open(&mut bare, &partition_dir(pid), pid, store_config()) {
            Ok(store) => {
                let end = store.durable().next_offset;
                missing += acked.filter(|((_, o), _)| *o >= end).count();
            }
            Err(_) => missing += acked.count(),
        }
    }
    assert!(
        missing > 0,
        "the segments alone held everything: the test shows nothing"
    );
    let mut io = SimBackend::new(11);
    let mut model = Model::default();
    drop(run(&mut io, &steps, &mut model).unwrap());
    assert!(check_recovery(io, &model, "with the journal"));
}

#[test]
fn eio_on_the_journal_fdatasync_fences_the_partitions_it_carried() {
    let mut io = SimBackend::new(21);
    let mut model = Model::default();
    let mut shard = Shard::create(&mut io, &PIDS).unwrap();
    for step in small_turns(5, 2) {
        let Step::Turn(b) = step else { unreachable!() };
        shard.turn(&mut io, &b, &mut model).unwrap();
    }
    let acked_before = model.acked.clone();
    // This turn's only fdatasync is the journal's (partitions 1-3, small).
    let nth = io.op_count(FaultOp::Sync);
    io.inject(FaultOp::Sync, nth, Fault::Errno(libc::EIO));
    let batches = [(1, 1, 100), (2, 1, 100), (3, 1, 100)];
    let err = shard.turn(&mut io, &batches, &mut model).unwrap_err();
    assert!(err.contains("journal") && err.contains("fenced"), "{err}");
    assert_eq!(
        model.acked, acked_before,
        "nothing of the failed turn acknowledged"
    );
    assert!(shard.journal.fenced().is_some());
    for pid in [1, 2, 3] {
        let cause = shard.stores[&pid].fenced().expect("fail-stop");
        assert!(cause.contains("journal"), "partition {pid}: {cause}");
    }
    // Partition 4 carried nothing in it: it goes on, flushing directly.
    shard.turn(&mut io, &[(4, 1, 100)], &mut model).unwrap();
    assert!(shard.stores[&4].fenced().is_none());
    let err = shard.turn(&mut io, &[(1, 1, 100)], &mut model).unwrap_err();
    assert!(err.contains("fenced"), "{err}");
    // After a restart: every acknowledged batch is there.
    drop(shard);
    assert!(check_recovery(io, &model, "eio"));
}

#[test]
fn enospc_preallocating_the_journal_is_disk_full() {
    let mut io = SimBackend::new(4);
    io.set_faults(Faults {
        space_bytes_max: Some(128 * 1024),
        ..Faults::default()
    });
    io.create_dir(Path::new(SHARD)).unwrap();
    match Journal::open(&mut io, &journal_path(), journal_config()) {
        Err(JournalError::DiskFull { bytes, .. }) => assert_eq!(bytes, 256 * 1024),
        other => panic!("expected DiskFull, got {other:?}"),
    }
    // With room, the same file is formatted and used.
    io.set_faults(Faults::default());
    let (_, records) = Journal::open(&mut io, &journal_path(), journal_config()).unwrap();
    assert!(records.is_empty());
}

/// Flips a byte of the first live record, many turns before the end: the
/// chain breaks where later, acknowledged turns follow, which is damage,
/// never taken for a torn tail.
#[test]
fn a_bad_record_followed_by_later_turns_is_corruption() {
    let mut io = SimBackend::new(8);
    let mut model = Model::default();
    let shard = run(&mut io, &small_turns(8, 3), &mut model).unwrap();
    assert_eq!(shard.checkpoints, 0);
    drop(shard);
    let mut io = io.reboot();
    let path = journal_path();
    let at = DATA_START as usize + 100; // inside the first record's body
    let byte = io.read_whole(&path).unwrap()[at];
    io.corrupt(&path, at, &[byte ^ 0x10]);
    match Journal::open(&mut io, &path, journal_config()) {
        Err(JournalError::Corruption {
            position, detail, ..
        }) => {
            assert_eq!(position, DATA_START, "{detail}");
        }
        other => panic!("expected Corruption, got {other:?}"),
    }
    // Undamaged, it opens and replays every acknowledged batch.
    io.corrupt(&path, at, &[byte]);
    assert!(check_recovery(io, &model, "undamaged"));
}

/// The same turns on io_uring in a temporary directory: the journal's
/// O_DIRECT writes, its checkpoints, and at reopen the replay of its live
/// records into the segments (a read-modify-write of their blocks).
#[test]
fn uring_journal_turns_replay_after_reopen() {
    use ringlog_storage::io::uring::UringBackend;
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let mut io = UringBackend::new(64).unwrap();
    // The driver's paths are absolute under SHARD: run it inside `root`.
    let shard_dir = root.join(SHARD.trim_start_matches('/'));
    std::fs::create_dir_all(&root).unwrap();
    let mut model = Model::default();
    let pids = PIDS;
    let journal = shard_dir.join("journal");
    io.create_dir(&shard_dir).unwrap();
    io.create_dir(&shard_dir.join("recycle")).unwrap();
    let (j, records) = Journal::open(&mut io, &journal, journal_config()).unwrap();
    assert!(records.is_empty());
    let config = store_config();
    let pool = StorePool::new(shard_dir.join("recycle"), PoolConfig::private(&config));
    let mut stores = BTreeMap::new();
    for pid in pids {
        let dir = shard_dir.join(format!("p{pid}"));
        stores.insert(
            pid,
            PartitionStore::create_in(&mut io, &dir, pid, config.clone(), pool.clone()).unwrap(),
        );
    }
    let mut shard = Shard::with(j, pool, stores);
    for step in small_turns(40, 7) {
        let Step::Turn(b) = step else { unreachable!() };
        shard.turn(&mut io, &b, &mut model).unwrap();
    }
    assert!(shard.checkpoints >= 1 && shard.journal_writes >= 40);
    assert_eq!(std::fs::metadata(&journal).unwrap().len(), 256 * 1024);
    // The process stops without closing anything (no flush, no superblock).
    drop(shard);
    let (j, records) = Journal::open(&mut io, &journal, journal_config()).unwrap();
    assert!(
        !records.is_empty(),
        "live records after the last checkpoint"
    );
    let pool = StorePool::new(shard_dir.join("recycle"), PoolConfig::private(&config));
    pool.set_journal_replay(records);
    let mut stores = BTreeMap::new();
    for pid in pids {
        let dir = shard_dir.join(format!("p{pid}"));
        stores.insert(
            pid,
            PartitionStore::open_in(&mut io, &dir, pid, config.clone(), pool.clone()).unwrap(),
        );
    }
    assert!(!pool.journal_replay_pending());
    let mut shard = Shard::with(j, pool, stores);
    check_stores(&mut io, &mut shard, &model, "uring");
}
