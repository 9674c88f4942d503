//! State transfer hosted by the partition (`transfer_host`), three replicas
//! of one group pumped in-process on one ring: a backup cut off while the
//! others retire the ops it lacks must transfer, install, repair and end
//! byte-identical; frames of another group or garbage chunks are refused.

use super::*;
use crate::client::batch_of;
use crate::transfer::Message as XMsg;
use crate::vsr::Trigger;
use ringlog_protocol::replication::{ChunkKey, RequestSnapshot};
use ringlog_storage::io::uring::UringBackend;
use ringlog_storage::io::{BatchId, FileId, OpenMode, Sqe};
use ringlog_storage::store::{InstallBudget, PoolConfig};

const GROUP: u128 = 0xfeed;
const PID: u32 = 7;
const SEGMENT_BYTES: u64 = 64 * 1024;

/// Replicas of one or more groups: partition `g * 3 + r` is replica `r`
/// of group `g` (node `r + 1`); the partitions of node `r` share its
/// shard's ring `io[r]` and `installs[r]`.
struct Group<B: IoBackend = UringBackend> {
    io: Vec<B>,
    parts: Vec<Partition>,
    /// One per node: each stands for that node's shard.
    installs: Vec<Installs>,
    now_ms: u64,
    /// Chunks to node 3 whose last data byte [`Group::round`] still flips
    /// on the way (past what their self-checked frame's checksum covers).
    corrupt_chunks: u32,
    /// Chunk messages carried, and how many went self-checked.
    chunks_carried: (u64, u64),
    _dir: tempfile::TempDir,
}

fn replication(replica: u8) -> Replication {
    let addrs = (1..=3u32)
        .map(|n| (n, SocketAddr::from(([127, 0, 0, 1], 7000 + n as u16))))
        .collect();
    Replication {
        nodes: vec![1, 2, 3],
        replica,
        group_id: GROUP,
        addrs,
        client_addrs: Default::default(),
        boot_wiped: false,
    }
}

fn store_config() -> StoreConfig {
    StoreConfig {
        segment_size_bytes: SEGMENT_BYTES,
        write_buffer_bytes: 16 * 1024,
        transfer_chunk_bytes: 4096,
        retention_bytes: Some(SEGMENT_BYTES),
        ..StoreConfig::default()
    }
}

impl Group {
    fn new() -> Group {
        Group::with(|| UringBackend::new(64).unwrap(), &[PID])
    }
}

impl<B: IoBackend> Group<B> {
    /// One group per partition id in `pids`, each node on a ring of `ring`.
    fn with(ring: impl Fn() -> B, pids: &[u32]) -> Group<B> {
        let dir = tempfile::tempdir().unwrap();
        let mut io: Vec<B> = (0..3).map(|_| ring()).collect();
        let mut parts = Vec::new();
        for &pid in pids {
            for r in 0..3u8 {
                let config = store_config();
                let pool = StorePool::new(
                    dir.path().join(format!("recycle{pid}.{r}")),
                    PoolConfig::private(&config),
                );
                let pdir = dir.path().join(format!("p{pid}r{r}"));
                let repl = Some(replication(r));
                let p = Partition::open_replicated(
                    &mut io[usize::from(r)],
                    &pool,
                    &pdir,
                    "t",
                    0,
                    pid,
                    config,
                    true,
                    repl,
                );
                assert!(p.status(0).fault.is_none(), "{:?}", p.status(0).fault);
                parts.push(p);
            }
        }
        let installs = (0..3)
            .map(|_| Installs::new(1, InstallBudget::new(64 << 20)))
            .collect();
        Group {
            io,
            parts,
            installs,
            now_ms: 1,
            corrupt_chunks: 0,
            chunks_carried: (0, 0),
            _dir: dir,
        }
    }

    fn flush(&mut self, i: usize) {
        let (io, p) = (&mut self.io[i % 3], &mut self.parts[i]);
        let mut sqes = Vec::new();
        if p.prepare_flush(io, &mut sqes).unwrap() > 0 {
            let completions = io.submit(sqes);
            p.complete_flush(io, completions).unwrap();
        }
    }

    /// Hands every finished transfer batch of each node's ring to the
    /// partition whose pipeline started it, all of a partition's at once,
    /// as the shard's reaping does; waits a little in the ring when batches
    /// are in flight and none has finished. The number handed back plus
    /// the number still in flight.
    fn reap(&mut self) -> usize {
        let mut counted = 0;
        for r in 0..3 {
            let reaped = if self.installs[r].batches_in_flight() > 0 {
                self.io[r].reap_waiting(std::time::Duration::from_millis(5))
            } else {
                self.io[r].reap()
            };
            counted += reaped.len();
            let mut by_owner: BTreeMap<u32, crate::transfer::io::Reaped> = BTreeMap::new();
            for (batch, completions) in reaped {
                let pid = self.installs[r].owner(batch);
                let pid = pid.expect("every batch on the ring is a transfer's");
                by_owner.entry(pid).or_default().push((batch, completions));
            }
            for (pid, batches) in by_owner {
                let i = (r..self.parts.len())
                    .step_by(3)
                    .find(|&i| self.parts[i].id == pid)
                    .expect("the owner is hosted");
                let (io, installs) = (&mut self.io[r], &mut self.installs[r]);
                self.parts[i].transfer_reaped(io, installs, self.now_ms, batches);
            }
            counted += self.installs[r].batches_in_flight();
        }
        counted
    }

    /// Hands back finished transfer I/O, flushes every replica and carries
    /// one round of their messages (nothing to or from node `cut`); the
    /// number carried, plus the batches handed back or still in flight.
    fn round(&mut self, cut: Option<u32>) -> usize {
        let reaped = self.reap();
        let mut mail = Vec::new();
        for i in 0..self.parts.len() {
            self.flush(i);
            let mut sends = Vec::new();
            self.parts[i].take_sends(&mut sends);
            mail.extend(sends.into_iter().map(|(to, m)| (i, to, m)));
        }
        let mut carried = 0;
        for (i_from, to, out) in mail {
            let from = (i_from % 3) as u32 + 1;
            if Some(to) == cut || Some(from) == cut {
                continue;
            }
            let (frame, self_checked) = out.into_parts();
            let mut payload = frame[crate::peer_buf::HEADROOM_BYTES..].to_vec();
            if payload[5] == wire::Command::Chunk as u8 {
                self.chunks_carried.0 += 1;
                self.chunks_carried.1 += u64::from(self_checked);
                if to == 3 && self.corrupt_chunks > 0 {
                    self.corrupt_chunks -= 1;
                    let last = payload.len() - 1;
                    assert!(last >= crate::peer_buf::SELF_CHECKED_COVERED_BYTES);
                    payload[last] ^= 0x01;
                }
            }
            carried += 1;
            let r = to as usize - 1;
            let i = i_from - i_from % 3 + r;
            let (io, installs) = (&mut self.io[r], &mut self.installs[r]);
            self.parts[i]
                .deliver(io, installs, self.now_ms, from, &payload)
                .unwrap();
        }
        carried + reaped
    }

    fn pump(&mut self, cut: Option<u32>) {
        for _ in 0..10_000 {
            if self.round(cut) == 0 {
                return;
            }
        }
        panic!("messages never stopped");
    }

    /// One 20 ms tick of every replica, then the messages it made.
    fn tick(&mut self, cut: Option<u32>) {
        self.tick_only();
        self.pump(cut);
    }

    fn tick_only(&mut self) {
        self.now_ms += 20;
        for i in 0..self.parts.len() {
            let (io, installs) = (&mut self.io[i % 3], &mut self.installs[i % 3]);
            self.parts[i].tick(io, installs, self.now_ms);
        }
    }

    fn produce(&mut self, n: usize, seed: usize, cut: Option<u32>) {
        self.produce_in(0, n, seed, cut);
    }

    /// Produces `n` batches of ~2 KiB on group `g`'s primary, each acknowledged.
    fn produce_in(&mut self, g: usize, n: usize, seed: usize, cut: Option<u32>) {
        let primary = g * 3;
        for k in 0..n {
            let value = vec![(seed + k) as u8; 2000];
            let batch = batch_of(&[value.as_slice()]).unwrap();
            let io = &mut self.io[0];
            let token = self.parts[primary].produce(io, batch.into()).unwrap();
            self.pump(cut);
            let mut replies: Vec<Reply> = self.parts[primary].take_replies().collect();
            for _ in 0..50 {
                if !replies.is_empty() {
                    break;
                }
                // A roll waits for the commit to reach the backups.
                self.tick(cut);
                replies.extend(self.parts[primary].take_replies());
            }
            assert_eq!(
                replies.len(),
                1,
                "batch {k} not acknowledged: {:?} {:?}",
                self.parts[primary].status(0),
                self.parts[primary + 1].status(0)
            );
            assert_eq!(replies[0].0, token);
            replies[0].1.clone().unwrap();
            // A heartbeat carries the commit to the backups before the next
            // prepare: a backup that learns a commit only with the next
            // prepare appends it first and never rolls (see the report).
            self.tick(cut);
        }
    }

    /// Replica `i` loses its disk: closed, its directory removed, reopened
    /// on an empty store booted wiped (as `ServerConfig::recover` does).
    fn wipe(&mut self, i: usize) {
        let r = i % 3;
        let pid = self.parts[i].id;
        self.parts.remove(i).close(&mut self.io[r]).unwrap();
        let pdir = self._dir.path().join(format!("p{pid}r{r}"));
        std::fs::remove_dir_all(&pdir).unwrap();
        self.reopen(i, true);
    }

    /// Reopens replica `i` (closed and removed from `parts`) on its
    /// directory, booting a created store wiped if `boot_wiped`.
    fn reopen(&mut self, i: usize, boot_wiped: bool) {
        let r = i % 3;
        let pid = PID + (i / 3) as u32;
        let pdir = self._dir.path().join(format!("p{pid}r{r}"));
        let config = store_config();
        let pool = StorePool::new(
            self._dir.path().join(format!("recycle{pid}.{r}.wiped")),
            PoolConfig::private(&config),
        );
        let mut repl = replication(r as u8);
        repl.boot_wiped = boot_wiped;
        let p = Partition::open_replicated(
            &mut self.io[r],
            &pool,
            &pdir,
            "t",
            0,
            pid,
            config,
            true,
            Some(repl),
        );
        assert!(p.status(0).fault.is_none(), "{:?}", p.status(0).fault);
        self.parts.insert(i, p);
    }

    fn started_of(&self, i: usize, trigger: Trigger) -> u64 {
        self.parts[i].transfer().unwrap().counters().started[trigger.index()]
    }

    fn installs_of(&self, i: usize) -> u64 {
        self.parts[i].transfer().unwrap().counters().installs
    }

    /// Bytes of replica `i` from `from` to its high watermark.
    fn bytes(&mut self, i: usize, from: u64) -> Vec<u8> {
        let end = self.parts[i].high_watermark().unwrap();
        let mut out = Vec::new();
        let mut at = from;
        while at < end {
            let f = self.parts[i]
                .fetch(&mut self.io[i % 3], at, 1 << 20, Vec::new())
                .unwrap();
            assert!(f.next_offset > at, "fetch at {at} made no progress");
            out.extend_from_slice(&f.batches);
            at = f.next_offset;
        }
        out
    }
}

/// Guards against: a backup whose missing ops were retired everywhere
/// never catching up (transfer frames dropped by the host), an install
/// that leaves the replica frozen, or one whose bytes differ from the
/// group's; and a garbage chunk being installed rather than charged.
#[test]
fn a_backup_behind_retention_transfers_installs_and_acks_again() {
    let mut g = Group::new();
    fall_behind_retention(&mut g);
    assert_eq!(g.installs_of(2), 0);
    let mut charged_garbage = false;
    // What `ctl transfers` showed while the install pulled chunks.
    let mut pulling_seen = false;
    // Right after the install: it covered replica 2's whole log (a voter
    // then), so it reboots a voter, not wiped (vsr module docs).
    let mut voter_after_install = None;
    for _ in 0..2_000 {
        g.tick_only();
        // Message rounds one at a time, to catch the transfer running.
        while g.round(None) > 0 {
            if voter_after_install.is_none() && g.installs_of(2) > 0 {
                let sb = g.parts[2].store().unwrap().superblock();
                voter_after_install = Some(!sb.vsr.wiped && g.parts[2].status(0).role != "wiped");
            }
            let x = g.parts[2].transfer().unwrap();
            if !charged_garbage && x.progress().is_some() {
                inject_garbage_chunk(&mut g);
                charged_garbage = true;
            }
            if let Some(t) = g.parts[2].status(0).transfer {
                assert!(t.started_ms <= g.now_ms, "{t:?}");
                if let Some(total) = t.bytes_total {
                    assert!(t.bytes_received <= total, "{t:?}");
                    assert!(t.chunks_received <= t.chunks_total.unwrap(), "{t:?}");
                    assert!(matches!(t.peer_node, Some(1 | 2)), "{t:?}");
                    assert!(t.frozen, "an install began: {t:?}");
                    pulling_seen = true;
                }
            }
        }
        let caught_up = g.parts[2].high_watermark() == g.parts[0].high_watermark();
        if g.installs_of(2) > 0 && caught_up && g.parts[2].status(0).role == "backup" {
            break;
        }
    }
    assert!(charged_garbage, "the transfer was never seen running");
    assert!(pulling_seen, "ctl transfers never showed the install");
    assert_eq!(
        g.parts[2].status(0).transfer,
        None,
        "done: no transfer shown"
    );
    assert_eq!(g.installs_of(2), 1, "replica 2 never installed");
    assert_eq!(
        voter_after_install,
        Some(true),
        "rebooted wiped after a covering install"
    );
    // What the shard's metrics sum: received here, served by the others.
    let x = g.parts[2].transfer().unwrap();
    // The staged writes went on the ring without waiting: several at once
    // (1 would be lockstep), none left behind; the serving reads too.
    let (left, peak) = x.io_in_flight();
    assert_eq!(left, 0, "staged writes left in flight");
    assert!(peak > 1, "staged writes never overlapped (peak {peak})");
    let served_peak = (0..2)
        .map(|i| g.parts[i].transfer().unwrap().io_in_flight().1)
        .max();
    assert!(served_peak >= Some(1), "no serving read went on the ring");
    let (bytes_received, chunks_received) = x.received();
    assert!(x.counters().started[Trigger::RangeEvicted.index()] >= 1);
    assert!(chunks_received > 0 && bytes_received >= chunks_received);
    let served: u64 = (0..2)
        .map(|i| g.parts[i].transfer().unwrap().served().1)
        .sum();
    assert!(
        served >= chunks_received,
        "served {served} < {chunks_received}"
    );
    let hw = g.parts[0].high_watermark().unwrap();
    assert_eq!(g.parts[2].high_watermark(), Some(hw));
    let start = g.parts[2].store().unwrap().log_start_offset();
    assert!(start > 3, "replica 2 repaired ops retired everywhere?");
    assert_eq!(g.bytes(2, start), g.bytes(0, start), "bytes differ");
    // Node 2 cut off now: an ack needs replica 2's PrepareOk.
    g.produce(2, 200, Some(2));
    let hw = g.parts[0].high_watermark().unwrap();
    for _ in 0..10 {
        g.tick(Some(2));
    }
    assert_eq!(g.parts[2].high_watermark(), Some(hw));
    assert_eq!(g.bytes(2, start), g.bytes(0, start));
}

/// Every group's replica 2 (node 3) is cut off while the others roll
/// several segments and retire the ops it lacks.
fn fall_behind_retention<B: IoBackend>(g: &mut Group<B>) {
    let groups = g.parts.len() / 3;
    for gi in 0..groups {
        g.produce_in(gi, 3, 1 + gi * 1000, None);
    }
    for gi in 0..groups {
        g.produce_in(gi, 120, 10 + gi * 1000, Some(3));
    }
    for i in (0..g.parts.len()).filter(|i| i % 3 != 2) {
        g.parts[i].apply_retention(&mut g.io[i % 3], g.now_ms);
        let start = g.parts[i].store().unwrap().log_start_offset();
        assert!(start > 3, "partition {i}: retention retired nothing");
    }
}

/// Ticks, each followed by up to `rounds_per_tick` message rounds (fewer
/// once quiet), until replica 2 of every group installed once and caught
/// up with its primary, at most `ticks_max`; `watch` runs after every
/// round. Whether it did.
fn until_installed<B: IoBackend>(
    g: &mut Group<B>,
    ticks_max: usize,
    rounds_per_tick: usize,
    mut watch: impl FnMut(&mut Group<B>),
) -> bool {
    for _ in 0..ticks_max {
        g.tick_only();
        for _ in 0..rounds_per_tick {
            let busy = g.round(None) > 0;
            watch(g);
            if !busy {
                break;
            }
        }
        let done = (0..g.parts.len()).step_by(3).all(|p| {
            let caught_up = g.parts[p + 2].high_watermark() == g.parts[p].high_watermark();
            caught_up && g.installs_of(p + 2) > 0 && g.parts[p + 2].status(0).role == "backup"
        });
        if done {
            return true;
        }
    }
    false
}

/// The transfer host of a replicated partition, to reach into its bounds.
fn host_mut(p: &mut Partition) -> &mut TransferHost {
    match &mut p.state {
        State::Open(h) => h.xfer.as_deref_mut().expect("replicated"),
        State::Unavailable(e) => panic!("unavailable: {e}"),
    }
}

/// Whether replica `i` is still frozen for an install (as `ctl` shows it).
fn frozen<B: IoBackend>(g: &Group<B>, i: usize) -> bool {
    g.parts[i].status(0).transfer.is_some_and(|t| t.frozen)
}

/// The ring, failing the writes of chosen nowait batches: the next
/// `staged_writes_to_fail` batches holding a write complete with EIO for
/// each write, as a failing disk reports it. Here only a transfer's staged
/// writes are nowait batches with writes (the harness flushes with
/// `submit`).
struct FailingRing {
    ring: UringBackend,
    staged_writes_to_fail: u64,
    failing: std::collections::BTreeSet<BatchId>,
    /// Batches answered with EIO so far.
    failed: u64,
}

impl FailingRing {
    fn new() -> Self {
        FailingRing {
            ring: UringBackend::new(64).unwrap(),
            staged_writes_to_fail: 0,
            failing: Default::default(),
            failed: 0,
        }
    }

    fn fail(&mut self, mut reaped: crate::transfer::io::Reaped) -> crate::transfer::io::Reaped {
        for (batch, completions) in reaped.iter_mut() {
            if !self.failing.remove(batch) {
                continue;
            }
            self.failed += 1;
            for c in completions.iter_mut() {
                if matches!(c.op, StorageOpKind::Write { .. }) {
                    c.result = Err(std::io::Error::from_raw_os_error(5));
                }
            }
        }
        reaped
    }
}

use ringlog_storage::io::Op as StorageOpKind;

impl IoBackend for FailingRing {
    fn open_file(&mut self, path: &std::path::Path, mode: OpenMode) -> std::io::Result<FileId> {
        self.ring.open_file(path, mode)
    }
    fn open_dir(&mut self, path: &std::path::Path) -> std::io::Result<FileId> {
        self.ring.open_dir(path)
    }
    fn close(&mut self, file: FileId) {
        self.ring.close(file)
    }
    fn create_dir(&mut self, path: &std::path::Path) -> std::io::Result<()> {
        self.ring.create_dir(path)
    }
    fn list_dir(&mut self, path: &std::path::Path) -> std::io::Result<Vec<String>> {
        self.ring.list_dir(path)
    }
    fn exists(&mut self, path: &std::path::Path) -> std::io::Result<bool> {
        self.ring.exists(path)
    }
    fn file_size(&mut self, file: FileId) -> std::io::Result<u64> {
        self.ring.file_size(file)
    }
    fn allocate_range(&mut self, file: FileId, offset: u64, len_bytes: u64) -> std::io::Result<()> {
        self.ring.allocate_range(file, offset, len_bytes)
    }
    fn submit(&mut self, batch: Vec<Sqe>) -> Vec<Completion> {
        self.ring.submit(batch)
    }
    fn submit_nowait(&mut self, batch: Vec<Sqe>) -> BatchId {
        let writes = batch
            .iter()
            .any(|s| matches!(s.op, StorageOpKind::Write { .. }));
        let id = self.ring.submit_nowait(batch);
        if writes && self.staged_writes_to_fail > 0 {
            self.staged_writes_to_fail -= 1;
            self.failing.insert(id);
        }
        id
    }
    fn reap(&mut self) -> crate::transfer::io::Reaped {
        let reaped = self.ring.reap();
        self.fail(reaped)
    }
    fn reap_waiting(&mut self, timeout: std::time::Duration) -> crate::transfer::io::Reaped {
        let reaped = self.ring.reap_waiting(timeout);
        self.fail(reaped)
    }
    fn batches_running(&self) -> usize {
        self.ring.batches_running()
    }
}

/// Guards against: a staged write that failed on the disk being taken as
/// written (the completion unchecked), or a failed attempt that leaves the
/// superblock marked wiped, the replica frozen, or the shard's install slot
/// held, so that no later attempt can install.
#[test]
fn a_failed_staged_write_fails_the_attempt_and_a_later_one_installs() {
    let mut g = Group::with(FailingRing::new, &[PID]);
    fall_behind_retention(&mut g);
    g.io[2].staged_writes_to_fail = 1;
    let mut failure_seen = false;
    let installed = until_installed(&mut g, 3_000, usize::MAX, |g| {
        let x = g.parts[2].transfer().unwrap();
        let c = x.counters();
        // The failed attempt's abort runs on the ring: checked once over.
        if failure_seen || c.attempts_failed == 0 || x.ends_install() {
            return;
        }
        failure_seen = true;
        assert_eq!(g.io[2].failed, 1, "an attempt failed, but not on the EIO");
        assert_eq!(c.installs, 0, "installed despite the failed write");
        let sb = g.parts[2].store().unwrap().superblock();
        assert!(!sb.vsr.wiped, "the wiped mark was left set");
        assert!(!frozen(g, 2), "the replica was left frozen");
        assert_eq!(g.installs[2].active(), 0, "the install slot is held");
    });
    assert!(failure_seen, "the EIO never failed an attempt");
    assert!(installed, "no later attempt installed");
    let x = g.parts[2].transfer().unwrap();
    // What `ringlog_transfer_attempts_failed_total` sums over the shard.
    assert!(x.counters().attempts_failed >= 1);
    assert_eq!(x.counters().installs, 1);
    let start = g.parts[2].store().unwrap().log_start_offset();
    assert_eq!(g.bytes(2, start), g.bytes(0, start), "bytes differ");
}

/// Guards against: ops beyond the transfer op queue's bound queued anyway
/// (an unbounded queue) or dropped unanswered (a machine waiting forever
/// for an IoDone): each is refused with a transient fault and counted, the
/// attempt ends without freezing the replica, and once the queue has room
/// the transfer installs.
#[test]
fn a_full_transfer_op_queue_refuses_counts_and_then_installs() {
    let mut g = Group::new();
    fall_behind_retention(&mut g);
    // A bound of 0: the first op the receiver queues (its install's begin)
    // finds the queue full.
    host_mut(&mut g.parts[2]).set_pending_ops_max(0);
    let installed = until_installed(&mut g, 200, usize::MAX, |g| {
        assert!(!frozen(g, 2), "a refused begin froze the replica");
    });
    assert!(!installed, "installed past a full queue");
    let c = g.parts[2].transfer().unwrap().counters();
    assert!(c.ops_refused >= 1, "nothing refused: {c:?}");
    assert_eq!(c.installs, 0);
    assert_eq!(g.installs[2].active(), 0, "a refused begin holds the slot");
    let sb = g.parts[2].store().unwrap().superblock();
    assert!(!sb.vsr.wiped, "marked wiped for a begin that never ran");
    host_mut(&mut g.parts[2]).set_pending_ops_max(super::transfer_host::PENDING_OPS_MAX);
    assert!(
        until_installed(&mut g, 3_000, usize::MAX, |_| {}),
        "never installed"
    );
    let start = g.parts[2].store().unwrap().log_start_offset();
    assert_eq!(g.bytes(2, start), g.bytes(0, start), "bytes differ");
}

/// Guards against: a second partition of the shard beginning its install
/// while the first one's runs (past the shard's limit of one), or being
/// refused for good rather than retrying once the slot is free.
#[test]
fn two_partitions_of_one_shard_install_one_after_the_other() {
    let mut g = Group::with(|| UringBackend::new(64).unwrap(), &[PID, PID + 1]);
    fall_behind_retention(&mut g);
    // Replica 2 of group 0 and of group 1 share node 3's shard.
    let mut both_frozen = false;
    let mut one_waited = false;
    // One message round per tick: an install spans ticks, so the other
    // partition's transfer starts while it runs.
    let installed = until_installed(&mut g, 20_000, 1, |g| {
        assert!(g.installs[2].active() <= 1, "two installs on one shard");
        both_frozen |= frozen(g, 2) && frozen(g, 5);
        let running = |i: usize| g.parts[i].status(0).transfer.is_some();
        one_waited |= (frozen(g, 2) && running(5) && !frozen(g, 5))
            || (frozen(g, 5) && running(2) && !frozen(g, 2));
    });
    assert!(installed, "not both installed");
    assert!(!both_frozen, "both replicas frozen at once");
    let deferred: u64 = [2, 5]
        .iter()
        .map(|&i| g.parts[i].transfer().unwrap().counters().installs_deferred)
        .sum();
    assert!(deferred >= 1 && one_waited, "the installs never contended");
    for p in [0, 3] {
        assert_eq!(g.installs_of(p + 2), 1);
        let start = g.parts[p + 2].store().unwrap().log_start_offset();
        assert_eq!(g.bytes(p + 2, start), g.bytes(p, start), "bytes differ");
    }
}

/// Guards against: a chunk whose data was damaged past what its frame's
/// checksum covers (a self-checked frame: only the manifest check guards
/// the data) being staged. Each is refused, charged to its peer and asked
/// again, and the install ends byte-identical; every chunk went
/// self-checked. Also: the serving side reuses its read buffers and drops
/// them once idle.
#[test]
fn a_chunk_damaged_past_its_frame_checksum_is_charged_and_pulled_again() {
    let mut g = Group::new();
    fall_behind_retention(&mut g);
    g.corrupt_chunks = 3;
    let mut idle_peak = 0;
    let installed = until_installed(&mut g, 2_000, 1_000, |g| {
        for i in 0..2 {
            let idle = g.parts[i].transfer().unwrap().idle_read_buffers();
            idle_peak = idle_peak.max(idle);
        }
    });
    assert!(installed, "replica 2 never installed");
    // Read buffers were reused while serving (bounded), and none is held
    // once every snapshot was released.
    assert!(
        (1..=transfer_host::READ_BUFFERS_IDLE_MAX).contains(&idle_peak),
        "{idle_peak}"
    );
    for _ in 0..5 {
        g.tick(None);
    }
    for i in 0..2 {
        let x = g.parts[i].transfer().unwrap();
        assert_eq!(x.idle_read_buffers(), 0, "replica {i} holds idle buffers");
    }
    assert_eq!(g.corrupt_chunks, 0, "fewer chunks than damaged ones");
    let (carried, self_checked) = g.chunks_carried;
    assert!(carried > 3, "{carried} chunks");
    assert_eq!(self_checked, carried, "a chunk went with a full checksum");
    let x = g.parts[2].transfer().unwrap();
    assert!(
        x.counters().charges >= 3,
        "damaged chunks not charged: {:?}",
        x.counters()
    );
    assert_eq!(x.counters().installs, 1);
    let start = g.parts[2].store().unwrap().log_start_offset();
    assert_eq!(g.bytes(2, start), g.bytes(0, start), "bytes differ");
}

/// A chunk of a snapshot nobody offered, "from" node 2, to replica 2's
/// running transfer: charged, and nothing installed.
fn inject_garbage_chunk(g: &mut Group) {
    let x = g.parts[2].transfer().unwrap();
    let before = x.counters().charges;
    let chunk = XMsg::Chunk {
        snapshot_id: 0xdead_beef,
        key: ChunkKey {
            artifact: 0,
            chunk: 0,
        },
        data: crate::transfer::ChunkData::from(&[0xAAu8; 4096][..]),
    };
    let mut frame = Vec::new();
    chunk.to_wire(GROUP, PID, 1, 0).encode(&mut frame).unwrap();
    let (io, installs) = (&mut g.io[2], &mut g.installs[2]);
    g.parts[2]
        .deliver(io, installs, g.now_ms, 2, &frame)
        .unwrap();
    let x = g.parts[2].transfer().unwrap();
    assert_eq!(
        x.counters().charges,
        before + 1,
        "garbage chunk not charged"
    );
    assert_eq!(x.counters().installs, 0);
}

/// Guards against: a transfer frame of another group reaching the server
/// machine (it would open snapshots for strangers).
#[test]
fn a_transfer_frame_of_another_group_is_dropped() {
    let mut g = Group::new();
    let req = XMsg::RequestSnapshot(RequestSnapshot {
        nonce: 5,
        commit: 0,
        purge_generation: 0,
    });
    let mut frame = Vec::new();
    req.to_wire(GROUP + 1, PID, 1, 0)
        .encode(&mut frame)
        .unwrap();
    let (io, installs) = (&mut g.io[0], &mut g.installs[0]);
    let got = g.parts[0].deliver(io, installs, 1, 2, &frame);
    assert!(matches!(got, Err(PeerDrop::WrongGroup { .. })), "{got:?}");
    let mut sends = Vec::new();
    g.parts[0].take_sends(&mut sends);
    assert!(sends.is_empty(), "answered a stranger: {sends:?}");
    // The same request of the group is answered (an offer or refusal).
    let mut frame = Vec::new();
    req.to_wire(GROUP, PID, 1, 0).encode(&mut frame).unwrap();
    let (io, installs) = (&mut g.io[0], &mut g.installs[0]);
    g.parts[0].deliver(io, installs, 1, 2, &frame).unwrap();
    g.parts[0].take_sends(&mut sends);
    assert_eq!(sends.len(), 1);
    assert_eq!(sends[0].0, 2);
}

/// Guards against: a replica that lost its disk repairing the group's
/// whole log op by op (issue 10: a new or wiped replica installs a
/// snapshot). Booted wiped on an empty store with the group more than
/// `vsr::WIPED_REPAIR_OPS_MAX` ops ahead, it raises NewOrWiped (counted
/// under that trigger, no other), installs, repairs the active tail, ends
/// byte-identical and acknowledges again: with node 2 cut off, produces
/// commit only with its PrepareOk.
#[test]
fn a_wiped_replica_installs_by_transfer_and_acks_again() {
    let mut g = Group::new();
    let ops = crate::vsr::WIPED_REPAIR_OPS_MAX as usize + 20;
    g.produce(ops, 1, None);
    g.wipe(2);
    assert_eq!(g.parts[2].status(0).role, "wiped");
    assert!(
        until_installed(&mut g, 3_000, 50, |_| {}),
        "never installed"
    );
    assert_eq!(g.started_of(2, Trigger::NewOrWiped), 1);
    for t in Trigger::ALL
        .into_iter()
        .filter(|&t| t != Trigger::NewOrWiped)
    {
        assert_eq!(g.started_of(2, t), 0, "{t:?}");
    }
    let repairs = g.parts[2].status(0).repairs.unwrap();
    assert!(
        repairs < (ops / 16) as u64,
        "{repairs} repair requests: it repaired instead of installing"
    );
    let start = g.parts[2].store().unwrap().log_start_offset();
    assert_eq!(g.bytes(2, start), g.bytes(0, start), "bytes differ");
    g.produce(3, 5_000, Some(2));
    for _ in 0..5 {
        g.tick(Some(2)); // the last commit reaches replica 2
    }
    let hw = g.parts[0].high_watermark();
    assert_eq!(g.parts[2].high_watermark(), hw, "acked without replica 2");
}

/// Replica 2's first (`oldest`) or last sealed segment's base offset, its
/// directory, and the segment's file (in its live generation).
fn replica2_sealed(g: &Group, oldest: bool) -> (u64, std::path::PathBuf, std::path::PathBuf) {
    let store = g.parts[2].store().unwrap();
    let mut sealed = store.sealed_segments();
    let picked = if oldest { sealed.next() } else { sealed.last() };
    let base = picked.expect("rolled").base_offset;
    let generation = format!("gen-{:020}", store.superblock().live_generation);
    let pdir = g._dir.path().join(format!("p{PID}r2"));
    let log = pdir.join(generation).join(format!("{base:020}.log"));
    (base, pdir, log)
}

fn flip_byte(path: &std::path::Path, at: usize) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[at] ^= 0x5a;
    std::fs::write(path, bytes).unwrap();
}

/// Replica 2, wiped on an empty store with its bad one set aside under
/// `pdir`, installs with trigger CorruptSegment (only), ends
/// byte-identical with the primary, and acknowledges again.
fn installs_after_corruption(g: &mut Group, pdir: &std::path::Path) {
    assert_eq!(g.parts[2].status(0).role, "wiped");
    assert!(pdir.with_extension("corrupt").exists(), "not set aside");
    assert!(until_installed(g, 3_000, 50, |_| {}), "never installed");
    assert_eq!(g.started_of(2, Trigger::CorruptSegment), 1);
    assert_eq!(g.started_of(2, Trigger::NewOrWiped), 0);
    assert_eq!(g.parts[2].store().unwrap().corruption_seen(), None);
    let start = g.parts[2].store().unwrap().log_start_offset();
    assert_eq!(g.bytes(2, start), g.bytes(0, start), "bytes differ");
    g.produce(3, 5_000, Some(2));
    for _ in 0..5 {
        g.tick(Some(2)); // the last commit reaches replica 2
    }
    assert_eq!(g.parts[2].high_watermark(), g.parts[0].high_watermark());
}

/// Guards against: a replica whose sealed segment fails verification at
/// open either stopping the partition for good or serving the bad bytes
/// (issue 10: it installs a good copy). A byte of replica 2's first sealed
/// segment is flipped while it is down and its index removed (as after a
/// crash before the index write), so open verifies the segment: the store
/// is set aside (`<dir>.corrupt`), the replica boots wiped on an empty
/// one, transfers with trigger CorruptSegment, ends byte-identical and
/// acknowledges again.
#[test]
fn a_corrupt_sealed_segment_is_set_aside_and_installed_from_a_peer() {
    let mut g = Group::new();
    g.produce(60, 1, None);
    let (_, pdir, log) = replica2_sealed(&g, true);
    g.parts.remove(2).close(&mut g.io[2]).unwrap();
    flip_byte(&log, 500);
    std::fs::remove_file(log.with_extension("idx")).unwrap();
    g.reopen(2, false);
    installs_after_corruption(&mut g, &pdir);
}

/// Guards against: a sealed segment that goes bad while the node runs
/// failing every read of it for good, on a replica that keeps acking as if
/// whole (issue 10's CorruptSegment trigger, found by a read rather than
/// at open). A byte of replica 2's first sealed segment is flipped under
/// the open store; a fetch of it fails with Corruption (never the bad
/// bytes), and the next tick sets the store aside (`<dir>.corrupt`),
/// boots the replica wiped, and installs a good copy: byte-identical, and
/// acknowledging again.
#[test]
fn a_sealed_segment_found_corrupt_by_a_read_is_set_aside_and_installed_from_a_peer() {
    let mut g = Group::new();
    g.produce(60, 3, None);
    let (base, pdir, log) = replica2_sealed(&g, true);
    flip_byte(&log, 700);
    let e = g.parts[2]
        .fetch(&mut g.io[2], base, 1 << 20, Vec::new())
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::Corruption, "{e:?}");
    assert!(g.parts[2].needs_tick(), "the replacement waits for a tick");
    assert_eq!(g.parts[2].status(0).role, "backup");
    g.tick_only();
    assert!(g.parts[2].take_replaced(), "the shard is told");
    assert!(!g.parts[2].take_replaced(), "told once");
    installs_after_corruption(&mut g, &pdir);
}

/// Guards against: a replica whose restart reads a bad sealed segment
/// (its recovery reads the last committed ops' headers; open verifies only
/// the segments it reindexes) coming up Unavailable for good. The byte is
/// flipped while replica 2 is down, its index kept; the reopened replica
/// boots wiped on an empty store, the bad one set aside, and installs.
#[test]
fn a_sealed_segment_found_corrupt_by_the_restart_is_set_aside_and_installed_from_a_peer() {
    let mut g = Group::new();
    g.produce(60, 7, None);
    let (_, pdir, log) = replica2_sealed(&g, false);
    g.parts.remove(2).close(&mut g.io[2]).unwrap();
    flip_byte(&log, 700);
    assert!(log.with_extension("idx").exists());
    g.reopen(2, false);
    installs_after_corruption(&mut g, &pdir);
}
