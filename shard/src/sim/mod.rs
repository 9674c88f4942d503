//! The deterministic cluster simulator (VOPR-style, DESIGN.md section 8).
//!
//! R replicas (1, 3 or 5), each the pure [`crate::vsr::Replica`] driving
//! the real [`ringlog_storage::store::PartitionStore`] through the shared
//! executor ([`crate::replica_io`]) on its own sim disk; a network that
//! loses, duplicates, delays, reorders, partitions (both ways or one way)
//! and clogs; power failures at any storage op with torn writes and lost
//! unsynced renames; fsync, write and read faults; wiped disks; a client
//! producing through the primary with every acknowledgement checked.
//! Every message goes through the replication wire codec.
//!
//! Everything comes from one seed: fault rates (drawn per seed), the order
//! of deliveries and completions, the disks. No clock, thread or hash-map
//! order. A failing seed prints itself and replays exactly: `ringlog sim
//! --seed N` prints the same trace hash every time.
//!
//! A run is a safety phase (`ticks` ticks of faults, the checker after
//! every step: see [`checker`]) then a liveness phase: the network heals,
//! faults stop (a hostile transfer server stops lying), every replica
//! boots, and the group must converge (one
//! view, all normal, everything acknowledged committed everywhere and read
//! back byte-identical from every store) within [`LIVENESS_TICKS_MAX`].
//!
//! [`run_meta`] runs the same group as the cluster metadata group: its
//! client submits metadata commands through each node's
//! [`crate::meta::MetaHost`], and every node applies its committed ops to
//! its table, checked after every step (`cluster/meta.rs`).

pub mod checker;
pub mod cluster;
pub mod faults;
pub mod network;
pub mod node;
pub mod trace;

use std::fmt;

use checker::Violation;
use cluster::Cluster;
pub use cluster::MetaCounts;
use faults::FaultRates;

/// Ticks of the safety phase unless asked otherwise.
pub const TICKS_DEFAULT: u64 = 1_000;
/// The liveness phase's bound: a healed group converges within this.
pub const LIVENESS_TICKS_MAX: u64 = 3_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimOptions {
    pub seed: u64,
    /// 1, 3 or 5; None: drawn from the seed.
    pub replicas: Option<u8>,
    pub ticks: u64,
    /// False: the seed's network delays and client only, no faults.
    pub faults: bool,
    /// Bit flips on reads among the disk faults.
    pub read_bit_flips: bool,
    /// Replicas rebooted with their disk lost.
    pub wipes: bool,
    /// The stores' segment size, and the headroom past a segment's roll
    /// point for ops not yet committed (see `StoreConfig`).
    pub segment_bytes: u64,
    pub uncommitted_headroom_bytes: u64,
    /// A failure report carries every trace line, not only the last
    /// [`trace::RECENT_LINES_MAX`] (for reading a replay).
    pub full_trace: bool,
    /// Retention retires committed segments and replicas catch up by
    /// state transfer (`sim/transfer.rs`).
    pub transfers: bool,
    /// The operator purges the partition now and then (`sim/purge.rs`).
    pub purges: bool,
    /// One replica's transfer server lies, in a way drawn per seed
    /// (`sim/hostile.rs`; groups of 3 or 5, with transfers).
    pub hostile: bool,
}

/// 64 KiB segments rolling at 16 KiB once committed: runs cross rolls,
/// and ~48 KiB (~150 ops) of uncommitted tail fit (see the module docs).
pub const SEGMENT_BYTES_DEFAULT: u64 = 64 * 1024;
pub const UNCOMMITTED_HEADROOM_BYTES_DEFAULT: u64 = 48 * 1024;

impl SimOptions {
    pub fn new(seed: u64) -> Self {
        Self {
            seed,
            replicas: None,
            ticks: TICKS_DEFAULT,
            faults: true,
            read_bit_flips: true,
            wipes: true,
            segment_bytes: SEGMENT_BYTES_DEFAULT,
            uncommitted_headroom_bytes: UNCOMMITTED_HEADROOM_BYTES_DEFAULT,
            full_trace: false,
            transfers: false,
            purges: false,
            hostile: false,
        }
    }
}

/// What one run hit (summed over runs by [`Counts::add`]).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub appends: u64,
    pub acks: u64,
    pub commits: u64,
    pub outcome_unknown: u64,
    pub view_changes: u64,
    /// RequestPrepares sent.
    pub repairs: u64,
    pub crashes: u64,
    /// Crashes during a write path op with tearing on.
    pub torn_crashes: u64,
    pub restarts: u64,
    pub wipes: u64,
    pub fenced: u64,
    pub fsync_failures: u64,
    pub write_failures: u64,
    pub read_faults: u64,
    pub truncations: u64,
    /// Appends refused: the segment's headroom for uncommitted ops full.
    pub uncommitted_tail_full: u64,
    pub ops_read_back: u64,
    pub messages_sent: u64,
    pub messages_lost: u64,
    pub messages_duplicated: u64,
    pub partitions: u64,
    pub asymmetric_partitions: u64,
    pub clogs: u64,
    pub segments_retired: u64,
    pub transfers_started: u64,
    /// Transfers started, by trigger ([`crate::vsr::Trigger::index`]).
    pub transfers_by_trigger: [u64; 5],
    pub transfer_offers_taken: u64,
    pub transfer_installs: u64,
    /// Crashes during an install's storage ops.
    pub transfer_install_crashes: u64,
    pub transfer_rotations: u64,
    /// Crashes of a replica while its store held a snapshot open for a
    /// receiver (the serving peer dying mid-transfer).
    pub serving_crashes: u64,
    /// Offers the receiver refused (stale, oversized, no progress).
    pub transfer_refusals: u64,
    pub transfer_attempts_failed: u64,
    pub transfer_messages: u64,
    /// Acked ops below every store's log start (retired: not read back).
    pub acks_retired: u64,
    /// Purge ops committed (each a purge generation, through one op).
    pub purges: u64,
    /// Operator purge requests refused, lost or unanswered (not retried).
    pub purges_abandoned: u64,
    /// Store purges the executor ran when its replica committed a purge op.
    pub replica_purges: u64,
    /// Store purges that invalidated an open snapshot (a served transfer
    /// aborted with a final refusal).
    pub purges_over_snapshots: u64,
    /// Purge ops committed but not applied before a crash or install,
    /// applied when the store is recovered.
    pub purges_at_recovery: u64,
    /// Crashes during a store purge.
    pub purge_crashes: u64,
    /// Offers refused for a purge generation below the receiver's.
    pub stale_generation_refusals: u64,
    /// Frames the hostile transfer server sent as lies (or extra).
    pub hostile_frames: u64,
    /// Charges receivers put on peers (bad offers, chunks, frames).
    pub transfer_charges: u64,
    pub transfer_quarantines: u64,
}

impl Counts {
    pub fn add(&mut self, o: &Counts) {
        let pairs = [
            (&mut self.appends, o.appends),
            (&mut self.acks, o.acks),
            (&mut self.commits, o.commits),
            (&mut self.outcome_unknown, o.outcome_unknown),
            (&mut self.view_changes, o.view_changes),
            (&mut self.repairs, o.repairs),
            (&mut self.crashes, o.crashes),
            (&mut self.torn_crashes, o.torn_crashes),
            (&mut self.restarts, o.restarts),
            (&mut self.wipes, o.wipes),
            (&mut self.fenced, o.fenced),
            (&mut self.fsync_failures, o.fsync_failures),
            (&mut self.write_failures, o.write_failures),
            (&mut self.read_faults, o.read_faults),
            (&mut self.truncations, o.truncations),
            (&mut self.uncommitted_tail_full, o.uncommitted_tail_full),
            (&mut self.ops_read_back, o.ops_read_back),
            (&mut self.messages_sent, o.messages_sent),
            (&mut self.messages_lost, o.messages_lost),
            (&mut self.messages_duplicated, o.messages_duplicated),
            (&mut self.partitions, o.partitions),
            (&mut self.asymmetric_partitions, o.asymmetric_partitions),
            (&mut self.clogs, o.clogs),
            (&mut self.segments_retired, o.segments_retired),
            (&mut self.transfers_started, o.transfers_started),
            (&mut self.transfer_offers_taken, o.transfer_offers_taken),
            (&mut self.transfer_installs, o.transfer_installs),
            (
                &mut self.transfer_install_crashes,
                o.transfer_install_crashes,
            ),
            (&mut self.transfer_rotations, o.transfer_rotations),
            (&mut self.serving_crashes, o.serving_crashes),
            (&mut self.transfer_refusals, o.transfer_refusals),
            (
                &mut self.transfer_attempts_failed,
                o.transfer_attempts_failed,
            ),
            (&mut self.transfer_messages, o.transfer_messages),
            (&mut self.acks_retired, o.acks_retired),
            (&mut self.purges, o.purges),
            (&mut self.purges_abandoned, o.purges_abandoned),
            (&mut self.replica_purges, o.replica_purges),
            (&mut self.purges_over_snapshots, o.purges_over_snapshots),
            (&mut self.purges_at_recovery, o.purges_at_recovery),
            (&mut self.purge_crashes, o.purge_crashes),
            (
                &mut self.stale_generation_refusals,
                o.stale_generation_refusals,
            ),
            (&mut self.hostile_frames, o.hostile_frames),
            (&mut self.transfer_charges, o.transfer_charges),
            (&mut self.transfer_quarantines, o.transfer_quarantines),
        ];
        for (sum, x) in pairs {
            *sum += x;
        }
        for (sum, x) in self
            .transfers_by_trigger
            .iter_mut()
            .zip(o.transfers_by_trigger)
        {
            *sum += x;
        }
    }
}

impl fmt::Display for Counts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let by_trigger: Vec<String> = crate::vsr::Trigger::ALL
            .iter()
            .map(|t| format!("{} {}", t.label(), self.transfers_by_trigger[t.index()]))
            .collect();
        write!(
            f,
            "appends {} acks {} view_changes {} repairs {} crashes {} torn_writes {} \
             restarts {} wipes {} fenced {} fsync_failures {} write_failures {} \
             read_faults {} truncations {} uncommitted_tail_full {} messages {} lost {} dup {} \
             partitions {} (asymmetric {}) clogs {} ops_read_back {} retired_segments {} \
             transfers {} ({}) offers_taken {} installs {} install_crashes {} rotations {} serving_crashes {} \
             refusals {} attempts_failed {} transfer_messages {} acks_retired {} \
             purges {} (abandoned {}) replica_purges {} (over snapshots {}) purges_at_recovery {} purge_crashes {} \
             stale_generation_refusals {} hostile_frames {} charges {} quarantines {}",
            self.appends,
            self.acks,
            self.view_changes,
            self.repairs,
            self.crashes,
            self.torn_crashes,
            self.restarts,
            self.wipes,
            self.fenced,
            self.fsync_failures,
            self.write_failures,
            self.read_faults,
            self.truncations,
            self.uncommitted_tail_full,
            self.messages_sent,
            self.messages_lost,
            self.messages_duplicated,
            self.partitions,
            self.asymmetric_partitions,
            self.clogs,
            self.ops_read_back,
            self.segments_retired,
            self.transfers_started,
            by_trigger.join(" "),
            self.transfer_offers_taken,
            self.transfer_installs,
            self.transfer_install_crashes,
            self.transfer_rotations,
            self.serving_crashes,
            self.transfer_refusals,
            self.transfer_attempts_failed,
            self.transfer_messages,
            self.acks_retired,
            self.purges,
            self.purges_abandoned,
            self.replica_purges,
            self.purges_over_snapshots,
            self.purges_at_recovery,
            self.purge_crashes,
            self.stale_generation_refusals,
            self.hostile_frames,
            self.transfer_charges,
            self.transfer_quarantines,
        )
    }
}

#[derive(Debug, Clone)]
pub struct Summary {
    pub seed: u64,
    pub replicas: u8,
    pub ticks: u64,
    /// Ticks the liveness phase took to converge.
    pub liveness_ticks: u64,
    pub trace_hash: u64,
    pub counts: Counts,
    pub rates: FaultRates,
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "seed {} replicas {} ticks {}: converged in {} ticks; trace hash {:016x}\n  {}",
            self.seed, self.replicas, self.ticks, self.liveness_ticks, self.trace_hash, self.counts
        )
    }
}

/// A failed run: enough to replay it.
#[derive(Debug, Clone)]
pub struct SimFailure {
    pub seed: u64,
    pub replicas: u8,
    pub ticks: u64,
    pub tick: u64,
    pub step: u64,
    pub check: &'static str,
    pub detail: String,
    pub trace_hash: u64,
    pub recent: Vec<String>,
    pub state: String,
}

impl fmt::Display for SimFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "sim seed {} replicas {} failed check '{}' at tick {} step {}: {}",
            self.seed, self.replicas, self.check, self.tick, self.step, self.detail
        )?;
        writeln!(
            f,
            "  trace hash {:016x}; replay: ringlog sim --seed {} --replicas {} --ticks {}",
            self.trace_hash, self.seed, self.replicas, self.ticks
        )?;
        writeln!(f, "  state: {}", self.state)?;
        for line in &self.recent {
            writeln!(f, "  | {line}")?;
        }
        Ok(())
    }
}

impl std::error::Error for SimFailure {}

/// The replica count a seed runs with unless one is given.
pub fn replicas_for(seed: u64) -> u8 {
    let mut rng = crate::vsr::timeout::Rng::new(seed ^ 0x5245_504c);
    [1, 3, 3, 5, 5][rng.below(5) as usize]
}

/// Runs one seed: the safety phase, then the liveness phase.
pub fn run(opts: SimOptions) -> Result<Summary, Box<SimFailure>> {
    run_with(opts, false).map(|(summary, _)| summary)
}

/// Runs one seed of a metadata group (`cluster/meta.rs`): of 3 or 5
/// replicas (drawn from the seed unless given), without transfers,
/// purges or hostile peers.
pub fn run_meta(mut opts: SimOptions) -> Result<(Summary, MetaCounts), Box<SimFailure>> {
    let drawn = if replicas_for(opts.seed) == 5 { 5 } else { 3 };
    opts.replicas = Some(opts.replicas.filter(|&n| n == 3 || n == 5).unwrap_or(drawn));
    opts.transfers = false;
    opts.purges = false;
    opts.hostile = false;
    let (summary, meta) = run_with(opts, true)?;
    Ok((summary, meta.unwrap_or_default()))
}

fn run_with(
    opts: SimOptions,
    meta: bool,
) -> Result<(Summary, Option<MetaCounts>), Box<SimFailure>> {
    let replicas = opts.replicas.unwrap_or_else(|| replicas_for(opts.seed));
    let fail = |c: Option<&Cluster>, v: Violation| {
        Box::new(SimFailure {
            seed: opts.seed,
            replicas,
            ticks: opts.ticks,
            tick: c.map_or(0, |c| c.tick),
            step: c.map_or(0, |c| c.steps),
            check: v.check,
            detail: v.detail,
            trace_hash: c.map_or(0, |c| c.trace.hash()),
            recent: c.map_or_else(Vec::new, |c| c.trace.recent().cloned().collect()),
            state: c.map_or_else(String::new, Cluster::state_line),
        })
    };
    let mut cluster = Cluster::new(&opts, replicas).map_err(|v| fail(None, v))?;
    if meta {
        cluster.enable_meta().map_err(|v| fail(None, v))?;
    }
    if !opts.faults {
        cluster.calm_faults();
    }
    let liveness = cluster
        .run_faulty(opts.ticks)
        .and_then(|()| cluster.run_liveness(LIVENESS_TICKS_MAX));
    let liveness_ticks = liveness.map_err(|v| fail(Some(&cluster), v))?;
    let mut counts = cluster.counts;
    cluster.fill_network_counts(&mut counts);
    let summary = Summary {
        seed: opts.seed,
        replicas,
        ticks: opts.ticks,
        liveness_ticks,
        trace_hash: cluster.trace.hash(),
        counts,
        rates: cluster.drawn.clone(),
    };
    Ok((summary, cluster.meta.map(|m| m.counts)))
}
