//! One simulated replica process: the pure [`Replica`], the real
//! [`PartitionStore`] on its own [`SimBackend`] disk, the storage
//! operations queued for the executor, and the sim's model of what the
//! store was given.
//!
//! A crash cuts the power at a storage op ([`SimBackend::set_crash_at`]:
//! unsynced sectors may tear, unsynced renames may be lost), reboots the
//! disk and reopens the store at once, so the checker can see what that
//! disk holds while the process is down. A boot later builds the replica
//! from the store ([`replica_io::recover`]) or, for a wiped disk, from
//! nothing ([`Replica::wiped`]) on a new store whose superblock says so; a
//! wiped replica that crashes before its repair is done boots from its
//! disk, wiped again by that flag.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::Path;

use ringlog_protocol::BatchHeader;
use ringlog_storage::io::sim::{Faults as DiskFaults, SimBackend};
use ringlog_storage::store::{PartitionStore, StoreConfig};
use ringlog_storage::superblock;

use crate::replica_io::{self, Recovered};
use crate::vsr::{Config, Event, IoFailure, IoId, IoOutcome, Replica, StorageOp, VsrState};

use super::checker::{violation, DurableView, Violation};
use super::cluster::NodeXfer;

/// The partition every simulated replica holds.
pub const PARTITION_ID: u32 = 1;
const STORE_DIR: &str = "/partition";

/// Storage operations queued per replica at most: far above what the
/// replica's own bounds produce (pipeline, repair chunks, one VSR write),
/// so reaching it means a replica emits I/O without bound.
pub const PENDING_IO_MAX: usize = 4096;

/// Small segments, so runs cross segment rolls and repair reads them; a
/// headroom so rolls seal committed ops only (a cut never reaches them).
pub fn store_config(segment_bytes: u64, uncommitted_headroom_bytes: u64) -> StoreConfig {
    StoreConfig {
        segment_size_bytes: segment_bytes,
        uncommitted_headroom_bytes: Some(uncommitted_headroom_bytes),
        write_buffer_bytes: 8 * 1024,
        index_interval_bytes: 1024,
        transfer_chunk_bytes: 4096,
        recycled_files_max: 2,
        ..StoreConfig::default()
    }
}

/// What waits for this replica's disk, in emission order. A commit is
/// told to the store at once (so rolls can seal it early) unless a cut
/// emitted before it is still queued: the commit may be of ops the cut's
/// repair writes, and must not reach the store before that cut (which
/// would then refuse to cut below it).
#[derive(Debug)]
pub enum Queued {
    Io(IoId, StorageOp),
    Committed(Event),
}

/// What running one queued storage op did.
pub enum RunIo {
    Idle,
    /// Power failed during `op`: the process is gone.
    Crashed {
        op: StorageOp,
    },
    Done {
        id: IoId,
        op: StorageOp,
        result: Result<IoOutcome, IoFailure>,
    },
}

pub struct Node {
    pub index: u8,
    store_config: StoreConfig,
    /// None while the process is down.
    pub replica: Option<Replica>,
    /// The store on this disk: None only if the disk failed to reopen
    /// (which is itself reported as a violation).
    pub store: Option<PartitionStore>,
    pub io: SimBackend,
    /// Storage ops and commit notes, in the order the replica emitted them.
    pub pending: VecDeque<Queued>,
    /// The replica is wiped and not yet repaired (what its superblock's
    /// wiped flag says; the checker holds the disk to it across crashes).
    pub wiped: bool,
    /// Since the last wipe, the replica asked for a superblock write that
    /// clears the wiped flag (its repair done).
    pub unwipe_asked: bool,
    /// Power fails at one of the next storage ops, or at this tick.
    pub crash_deadline_tick: Option<u64>,
    /// The armed crash may tear unsynced writes.
    pub crash_tears: bool,
    /// Op -> header checksum of every batch the store was given and not
    /// told to cut. Any op the store shows must be here with that checksum.
    pub model: BTreeMap<u64, u64>,
    /// (op, header checksum) of the durable part of `model` on every disk
    /// a wipe lost: votes this replica cast from one before its wipe still
    /// counted (a later wipe does not unsay them: sim seed 32009585, whose
    /// second wipe forgot a vote the primary's ack rested on).
    pub lost_disk: BTreeSet<(u64, u64)>,
    /// The highest durable VSR state the replica saw acknowledged by this
    /// disk: a reboot must not show less.
    pub durable_max: VsrState,
    pub disk_faults: DiskFaults,
    pub boots: u64,
    /// State transfer's machines (see `sim/transfer.rs`).
    pub xfer: NodeXfer,
    /// While an install may be on disk: the committed ops (op -> checksum)
    /// a reopened store may show besides `model`.
    pub accept_committed: BTreeMap<u64, u64>,
    /// Committed purge ops applied by store recovery, not yet counted.
    pub recovery_purges: u64,
    /// A lone replica's recovery applied the purge op at its durable end:
    /// that op is committed by the recovery itself (nothing emitted it).
    pub lone_recovery_purge_op: Option<u64>,
    /// Ops (op -> checksum) the store held durably until a purge dropped
    /// them (bounded by the ops a run writes).
    pub purged: BTreeMap<u64, u64>,
    /// The last [`RunIo::Done`] purged the store: (its new generation,
    /// whether it had snapshots open).
    pub purged_now: Option<(u64, bool)>,
    /// A cluster of one: booted as the server boots one
    /// ([`replica_io::recover_lone`]: its durable end is its commit).
    pub lone: bool,
}

/// Recovers `store` for its replica's restart, as the server does.
pub fn recover(
    store: &mut PartitionStore,
    io: &mut SimBackend,
    committed_ops_kept: u64,
    lone: bool,
) -> Result<Recovered, crate::vsr::IoFailure> {
    if lone {
        replica_io::recover_lone(store, io, committed_ops_kept)
    } else {
        replica_io::recover(store, io, committed_ops_kept)
    }
}

impl Node {
    pub fn new(
        index: u8,
        store_config: StoreConfig,
        seeds: (u64, u64),
        cfg: Config,
    ) -> Result<Self, Violation> {
        let (disk_seed, replica_seed) = seeds;
        let mut io = SimBackend::new(disk_seed);
        let store = create_store(&mut io, &store_config)?;
        let lone = cfg.replica_count == 1;
        let replica = Replica::new(cfg, replica_seed)
            .map_err(|e| violation("replica config", e.to_string()))?;
        Ok(Self {
            index,
            lone,
            store_config,
            replica: Some(replica),
            store: Some(store),
            io,
            pending: VecDeque::new(),
            wiped: false,
            unwipe_asked: false,
            crash_deadline_tick: None,
            crash_tears: false,
            model: BTreeMap::new(),
            lost_disk: BTreeSet::new(),
            durable_max: VsrState::default(),
            disk_faults: DiskFaults::default(),
            boots: 0,
            xfer: NodeXfer::new(),
            accept_committed: BTreeMap::new(),
            recovery_purges: 0,
            lone_recovery_purge_op: None,
            purged: BTreeMap::new(),
            purged_now: None,
        })
    }

    pub fn is_up(&self) -> bool {
        self.replica.is_some()
    }

    pub fn set_disk_faults(&mut self, faults: DiskFaults) {
        self.io.set_faults(faults.clone());
        self.disk_faults = faults;
    }

    /// Arms a power failure at one of the next `ops_ahead` mutating storage
    /// ops (or at `deadline_tick` if none comes).
    pub fn arm_crash(&mut self, ops_ahead: u64, tear: bool, deadline_tick: u64) {
        let at = self.io.ops_count() + ops_ahead;
        self.io.set_crash_at(at, tear);
        self.crash_deadline_tick = Some(deadline_tick);
        self.crash_tears = tear;
    }

    /// Tells the store of a commit now, or after a queued cut.
    pub fn note_commit(&mut self, event: Event) {
        let cut_queued = self
            .pending
            .iter()
            .any(|q| matches!(q, Queued::Io(_, StorageOp::TruncateAbove { .. })));
        match self.store.as_mut() {
            Some(store) if !cut_queued => replica_io::note_event(store, &event),
            _ => self.pending.push_back(Queued::Committed(event)),
        }
    }

    /// No armed crash any more (the liveness phase).
    pub fn disarm_crash(&mut self) {
        self.io.set_crash_at(u64::MAX, false);
        self.crash_deadline_tick = None;
        self.crash_tears = false;
    }

    /// The store dropped every op through `through_op` (a purge): the model
    /// keeps only that chain point, the dropped ops move to `purged`.
    /// (A purge flushes first, so every op it drops was durable.)
    fn forget_purged(&mut self, through_op: u64) {
        let mut kept = self.model.split_off(&through_op);
        kept.split_off(&(through_op + 1));
        let dropped = std::mem::replace(&mut self.model, kept);
        self.purged.extend(dropped);
        if let Some(&c) = self.model.get(&through_op) {
            self.purged.insert(through_op, c);
        }
    }

    /// Runs the oldest queued storage op.
    pub fn run_io(&mut self) -> RunIo {
        let Some(store) = self.store.as_mut() else {
            return RunIo::Idle;
        };
        let (id, op) = loop {
            match self.pending.pop_front() {
                None => return RunIo::Idle,
                Some(Queued::Committed(e)) => replica_io::note_event(store, &e),
                Some(Queued::Io(id, op)) => break (id, op),
            }
        };
        let before = (
            store.superblock().purge_generation,
            store.snapshots_open() > 0,
        );
        let result = replica_io::execute(store, &mut self.io, &op);
        if self.io.is_crashed() {
            return RunIo::Crashed { op };
        }
        let generation = store.superblock().purge_generation;
        if let (StorageOp::Purge { through_op }, true) = (&op, generation > before.0) {
            // Purged now: only the chain point is left of the log.
            self.forget_purged(*through_op);
            self.purged_now = Some((generation, before.1));
        }
        if result.is_ok() {
            match &op {
                StorageOp::Append { op, batch } => {
                    if let Ok(h) = BatchHeader::decode(batch) {
                        self.model.insert(*op, h.header_checksum);
                    }
                }
                StorageOp::TruncateAbove { op } => {
                    self.model.split_off(&(op + 1));
                }
                _ => {}
            }
        }
        RunIo::Done { id, op, result }
    }

    /// The process dies (power cut now if no armed crash fired yet); the
    /// disk reboots and its store reopens. Checks the reopened store:
    /// it shows only batches it was given and not cut, and its VSR state
    /// did not go back.
    pub fn power_off(&mut self) -> Result<(), Violation> {
        self.replica = None;
        self.pending.clear();
        self.xfer = NodeXfer::new();
        self.crash_deadline_tick = None;
        self.store = None;
        let io = std::mem::replace(&mut self.io, SimBackend::new(0));
        self.io = io.reboot();
        // Recovery itself is the storage tests' subject: reopen clean.
        self.io.set_faults(DiskFaults::default());
        let dir = Path::new(STORE_DIR);
        let mut store =
            PartitionStore::open(&mut self.io, dir, PARTITION_ID, self.store_config.clone())
                .map_err(|e| violation("store reopens after a crash", e.to_string()))?;
        let all = recover(&mut store, &mut self.io, u64::MAX, self.lone)
            .map_err(|e| violation("store reopens after a crash", e.reason))?;
        self.check_reopened(&all, store.superblock().vsr)?;
        if all.purged {
            self.recovery_purges += 1;
            self.forget_purged(all.base.op);
            self.lone_recovery_purge_op = self.lone.then_some(all.base.op);
        }
        self.accept_committed.clear();
        self.model = all
            .headers
            .iter()
            .map(|h| (h.vsr_op, h.header_checksum))
            .collect();
        if all.base.op > 0 {
            // Retention left only the active segment: its predecessor is
            // the anchor (the superblock's frontier), still this disk's.
            self.model.insert(all.base.op, all.base.checksum);
        }
        self.store = Some(store);
        let faults = self.disk_faults.clone();
        self.io.set_faults(faults);
        Ok(())
    }

    /// Guards against: cut or never-written data returning after a crash,
    /// and view, log_view or commit going back across a restart.
    fn check_reopened(&self, all: &Recovered, sb: superblock::VsrState) -> Result<(), Violation> {
        let r = self.index;
        for h in &all.headers {
            let installed = self.accept_committed.get(&h.vsr_op) == Some(&h.header_checksum);
            if self.model.get(&h.vsr_op) != Some(&h.header_checksum) && !installed {
                let detail = format!(
                    "replica {r}'s store shows op {} ({:#x}) after a crash; it was given {:?}",
                    h.vsr_op,
                    h.header_checksum,
                    self.model.get(&h.vsr_op)
                );
                return Err(violation("cut data never returns", detail));
            }
        }
        let m = self.durable_max;
        if sb.view < m.view || sb.log_view < m.log_view || sb.commit < m.commit {
            let detail = format!("replica {r}: superblock {sb:?} after reboot, had {m:?} durable");
            return Err(violation("VSR state never regresses", detail));
        }
        if self.wiped && !sb.wiped && !self.unwipe_asked {
            let detail = format!("replica {r} was wiped and not repaired; superblock {sb:?}");
            return Err(violation("a wipe survives a crash", detail));
        }
        Ok(())
    }

    /// Boots the process from its disk.
    pub fn boot(
        &mut self,
        cfg: Config,
        seed: u64,
        committed_ops_kept: u64,
    ) -> Result<(), Violation> {
        debug_assert!(!self.is_up());
        let Some(store) = self.store.as_mut() else {
            return Err(violation("store reopens after a crash", "no store".into()));
        };
        // Booting reads the store like recovery does: with faults off.
        self.io.set_faults(DiskFaults::default());
        let rec = recover(store, &mut self.io, committed_ops_kept, self.lone)
            .map_err(|e| violation("replica boots from its store", e.reason))?;
        self.io.set_faults(self.disk_faults.clone());
        if rec.purged {
            // A committed purge op applied at recovery: the store holds
            // only its chain point now.
            self.recovery_purges += 1;
            self.forget_purged(rec.base.op);
            self.lone_recovery_purge_op = self.lone.then_some(rec.base.op);
            self.model.insert(rec.base.op, rec.base.checksum);
            self.model
                .extend(rec.headers.iter().map(|h| (h.vsr_op, h.header_checksum)));
        }
        let replica = Replica::restart(cfg, seed, rec.durable, rec.base, &rec.headers)
            .map_err(|e| violation("replica config", e.to_string()))?;
        // The disk may have finished the write clearing the flag that the
        // process did not live to see (`check_reopened` allows that only if
        // the replica asked for it).
        self.wiped = replica.is_wiped();
        self.replica = Some(replica);
        self.boots += 1;
        Ok(())
    }

    /// Boots with the disk lost: a new empty store, `Replica::wiped`.
    pub fn wipe(&mut self, cfg: Config, seed: u64) -> Result<(), Violation> {
        let durable = self.store.as_ref().map_or(0, |s| s.durable().last_op);
        let mut model = std::mem::take(&mut self.model);
        model.split_off(&(durable + 1));
        self.lost_disk.extend(model);
        self.store = None;
        self.io = SimBackend::new(seed ^ 0x5749_5045);
        let mut store = create_store(&mut self.io, &self.store_config)?;
        // The host's first write for a wiped replica (see `Replica::wiped`).
        let vsr = superblock::VsrState {
            wiped: true,
            view_lost: true,
            ..superblock::VsrState::default()
        };
        store
            .set_vsr(&mut self.io, vsr)
            .map_err(|e| violation("store creates", e.to_string()))?;
        self.store = Some(store);
        self.io.set_faults(self.disk_faults.clone());
        self.durable_max = VsrState::default();
        self.pending.clear();
        self.xfer = NodeXfer::new();
        let replica =
            Replica::wiped(cfg, seed).map_err(|e| violation("replica config", e.to_string()))?;
        self.replica = Some(replica);
        self.wiped = true;
        self.unwipe_asked = false;
        self.boots += 1;
        Ok(())
    }

    /// The lowest op the store still holds (1 unless retention or an
    /// install moved its log start), faults off.
    pub fn op_held_min(&mut self) -> u64 {
        let Some(store) = self.store.as_mut() else {
            return 1;
        };
        self.io.set_faults(DiskFaults::default());
        let probe = StorageOp::ReadBatches {
            op_min: 1,
            op_max: 1,
        };
        let held = match replica_io::execute(store, &mut self.io, &probe) {
            Ok(IoOutcome::Evicted(e)) => e.op_held_min,
            _ => 1,
        };
        let faults = self.disk_faults.clone();
        self.io.set_faults(faults);
        held
    }

    /// Whether the store holds any op at or below `op` (faults off).
    pub fn holds_op_through(&mut self, op: u64) -> bool {
        let Some(store) = self.store.as_mut() else {
            return false;
        };
        let last_op = store.durable().last_op;
        self.io.set_faults(DiskFaults::default());
        let probe = StorageOp::ReadBatches {
            op_min: 1,
            op_max: op.max(1),
        };
        let held = match replica_io::execute(store, &mut self.io, &probe) {
            Ok(IoOutcome::Evicted(e)) => e.op_held_min <= op.min(last_op),
            Ok(IoOutcome::Batches(b)) => !b.is_empty(),
            _ => false,
        };
        let faults = self.disk_faults.clone();
        self.io.set_faults(faults);
        held
    }

    /// Reads every durable op `op_min..=op_max` back from the store
    /// (faults off).
    pub fn read_ops(&mut self, op_min: u64, op_max: u64) -> Result<Vec<Vec<u8>>, Violation> {
        let r = self.index;
        let Some(store) = self.store.as_mut() else {
            return Err(violation("read back", format!("replica {r} has no store")));
        };
        self.io.set_faults(DiskFaults::default());
        let mut out: Vec<Vec<u8>> = Vec::new();
        let first = op_min;
        while first + (out.len() as u64) <= op_max {
            let op_min = first + out.len() as u64;
            let read = StorageOp::ReadBatches { op_min, op_max };
            match replica_io::execute(store, &mut self.io, &read) {
                Ok(IoOutcome::Batches(b)) if !b.is_empty() => {
                    out.extend(b.iter().map(|b| b.to_vec()))
                }
                other => {
                    let detail = format!("replica {r}: op {op_min} not readable: {other:?}");
                    return Err(violation("acked ops readable everywhere", detail));
                }
            }
        }
        let faults = self.disk_faults.clone();
        self.io.set_faults(faults);
        Ok(out)
    }
}

fn create_store(io: &mut SimBackend, config: &StoreConfig) -> Result<PartitionStore, Violation> {
    PartitionStore::create(io, Path::new(STORE_DIR), PARTITION_ID, config.clone())
        .map_err(|e| violation("store creates", e.to_string()))
}

impl DurableView for Node {
    fn holds_durably(&self, op: u64, checksum: u64) -> bool {
        let durable = self.store.as_ref().map_or(0, |s| s.durable().last_op);
        op <= durable && self.model.get(&op) == Some(&checksum)
    }

    fn voted_durably(&self, op: u64, checksum: u64) -> bool {
        self.holds_durably(op, checksum)
            || self.lost_disk.contains(&(op, checksum))
            || self.purged_durably(op, checksum)
    }

    fn purged_durably(&self, op: u64, checksum: u64) -> bool {
        self.purged.get(&op) == Some(&checksum)
    }

    fn superblock_vsr(&self) -> Option<superblock::VsrState> {
        self.store.as_ref().map(|s| s.superblock().vsr)
    }
}
