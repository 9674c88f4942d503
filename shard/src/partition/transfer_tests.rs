//! State transfer hosted by the partition (`transfer_host`), three replicas
//! of one group pumped in-process on one ring: a backup cut off while the
//! others retire the ops it lacks must transfer, install, repair and end
//! byte-identical; frames of another group or garbage chunks are refused.

use super::*;
use crate::client::batch_of;
use crate::transfer::Message as XMsg;
use ringlog_protocol::replication::{ChunkKey, RequestSnapshot};
use ringlog_storage::io::uring::UringBackend;
use ringlog_storage::store::{InstallBudget, PoolConfig};

const GROUP: u128 = 0xfeed;
const PID: u32 = 7;
const SEGMENT_BYTES: u64 = 64 * 1024;

struct Group {
    io: UringBackend,
    parts: Vec<Partition>,
    /// One per replica: each stands for its own shard.
    installs: Vec<Installs>,
    now_ms: u64,
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
        let dir = tempfile::tempdir().unwrap();
        let mut io = UringBackend::new(64).unwrap();
        let parts = (0..3u8)
            .map(|r| {
                let config = store_config();
                let pool = StorePool::new(
                    dir.path().join(format!("recycle{r}")),
                    PoolConfig::private(&config),
                );
                let pdir = dir.path().join(format!("r{r}"));
                let repl = Some(replication(r));
                let p = Partition::open_replicated(
                    &mut io, &pool, &pdir, "t", 0, PID, config, true, repl,
                );
                assert!(p.status(0).fault.is_none(), "{:?}", p.status(0).fault);
                p
            })
            .collect();
        let installs = (0..3)
            .map(|_| Installs::new(1, InstallBudget::new(64 << 20)))
            .collect();
        Group {
            io,
            parts,
            installs,
            now_ms: 1,
            _dir: dir,
        }
    }

    fn flush(&mut self, i: usize) {
        let (io, p) = (&mut self.io, &mut self.parts[i]);
        let mut sqes = Vec::new();
        if p.prepare_flush(io, &mut sqes).unwrap() > 0 {
            let completions = io.submit(sqes);
            p.complete_flush(io, completions).unwrap();
        }
    }

    /// Hands every finished transfer batch to the replica whose pipeline
    /// started it (each replica stands for its own shard, all on one
    /// ring), as the shard's reaping does; waits a little in the ring when
    /// batches are in flight and none has finished. The number handed
    /// back plus the number still in flight.
    fn reap(&mut self) -> usize {
        let mut reaped: crate::transfer::io::Reaped = self
            .installs
            .iter_mut()
            .flat_map(Installs::take_foreign)
            .collect();
        let in_flight = |g: &Group| {
            g.installs
                .iter()
                .map(Installs::batches_in_flight)
                .sum::<usize>()
        };
        if reaped.is_empty() && in_flight(self) > 0 {
            reaped = self.io.reap_waiting(std::time::Duration::from_millis(5));
        } else {
            reaped.extend(self.io.reap());
        }
        let handed = reaped.len();
        for (batch, completions) in reaped {
            let i = (0..3)
                .find(|&i| self.installs[i].owner(batch).is_some())
                .expect("every batch on the ring is a transfer's");
            let (io, installs) = (&mut self.io, &mut self.installs[i]);
            let one = vec![(batch, completions)];
            self.parts[i].transfer_reaped(io, installs, self.now_ms, one);
        }
        handed + in_flight(self)
    }

    /// Hands back finished transfer I/O, flushes every replica and carries
    /// one round of their messages (nothing to or from `cut`); the number
    /// carried, plus the batches handed back or still in flight.
    fn round(&mut self, cut: Option<u32>) -> usize {
        let reaped = self.reap();
        let mut mail = Vec::new();
        for i in 0..3 {
            self.flush(i);
            let mut sends = Vec::new();
            self.parts[i].take_sends(&mut sends);
            mail.extend(sends.into_iter().map(|(to, m)| (i as u32 + 1, to, m)));
        }
        let mut carried = 0;
        for (from, to, payload) in mail {
            if Some(to) == cut || Some(from) == cut {
                continue;
            }
            carried += 1;
            let i = to as usize - 1;
            let (io, installs) = (&mut self.io, &mut self.installs[i]);
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
        for i in 0..3 {
            let (io, installs) = (&mut self.io, &mut self.installs[i]);
            self.parts[i].tick(io, installs, self.now_ms);
        }
    }

    /// Produces `n` batches of ~2 KiB on the primary, each acknowledged.
    fn produce(&mut self, n: usize, seed: usize, cut: Option<u32>) {
        for k in 0..n {
            let value = vec![(seed + k) as u8; 2000];
            let batch = batch_of(&[value.as_slice()]).unwrap();
            let token = self.parts[0].produce(&mut self.io, batch.into()).unwrap();
            self.pump(cut);
            let mut replies: Vec<Reply> = self.parts[0].take_replies().collect();
            for _ in 0..50 {
                if !replies.is_empty() {
                    break;
                }
                // A roll waits for the commit to reach the backups.
                self.tick(cut);
                replies.extend(self.parts[0].take_replies());
            }
            assert_eq!(
                replies.len(),
                1,
                "batch {k} not acknowledged: {:?} {:?}",
                self.parts[0].status(0),
                self.parts[1].status(0)
            );
            assert_eq!(replies[0].0, token);
            replies[0].1.clone().unwrap();
            // A heartbeat carries the commit to the backups before the next
            // prepare: a backup that learns a commit only with the next
            // prepare appends it first and never rolls (see the report).
            self.tick(cut);
        }
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
                .fetch(&mut self.io, at, 1 << 20, Vec::new())
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
    g.produce(3, 1, None);
    // Replica 2 (node 3) is cut off; the others roll several segments.
    g.produce(120, 10, Some(3));
    for i in 0..2 {
        g.parts[i].apply_retention(&mut g.io, g.now_ms);
        let start = g.parts[i].store().unwrap().log_start_offset();
        assert!(start > 3, "replica {i}: retention retired nothing");
    }
    assert_eq!(g.installs_of(2), 0);
    let mut charged_garbage = false;
    // What `ctl transfers` showed while the install pulled chunks.
    let mut pulling_seen = false;
    for _ in 0..2_000 {
        g.tick_only();
        // Message rounds one at a time, to catch the transfer running.
        while g.round(None) > 0 {
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
    assert!(x.counters().started >= 1);
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
        data: std::sync::Arc::from(&[0xAAu8; 4096][..]),
    };
    let mut frame = Vec::new();
    chunk.to_wire(GROUP, PID, 1, 0).encode(&mut frame).unwrap();
    let (io, installs) = (&mut g.io, &mut g.installs[2]);
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
    let (io, installs) = (&mut g.io, &mut g.installs[0]);
    let got = g.parts[0].deliver(io, installs, 1, 2, &frame);
    assert!(matches!(got, Err(PeerDrop::WrongGroup { .. })), "{got:?}");
    let mut sends = Vec::new();
    g.parts[0].take_sends(&mut sends);
    assert!(sends.is_empty(), "answered a stranger: {sends:?}");
    // The same request of the group is answered (an offer or refusal).
    let mut frame = Vec::new();
    req.to_wire(GROUP, PID, 1, 0).encode(&mut frame).unwrap();
    let (io, installs) = (&mut g.io, &mut g.installs[0]);
    g.parts[0].deliver(io, installs, 1, 2, &frame).unwrap();
    g.parts[0].take_sends(&mut sends);
    assert_eq!(sends.len(), 1);
    assert_eq!(sends[0].0, 2);
}
