//! Fault rates of one run, drawn from its seed ("swarm testing", as
//! TigerBeetle's VOPR does): each seed explores a different mix, from
//! almost none to heavy, instead of every seed the same average.

use ringlog_storage::io::sim::Faults as DiskFaults;

use crate::vsr::timeout::Rng;

/// Probabilities are per mille per opportunity (per message, per tick,
/// per storage op) unless the name says otherwise.
#[derive(Debug, Clone, PartialEq)]
pub struct FaultRates {
    pub loss_per_mille: u64,
    pub duplicate_per_mille: u64,
    /// A message waits 0..=delay_ticks_max ticks (reordering comes with it).
    pub delay_ticks_max: u64,
    /// Per tick: a partition starts (when none is active).
    pub partition_per_mille: u64,
    /// Per tick: the active partition heals.
    pub heal_per_mille: u64,
    /// Share of partitions that are one-way (asymmetric), in percent.
    pub asymmetric_pct: u64,
    /// Per tick: one link is clogged (its messages held) for a while.
    pub clog_per_mille: u64,
    pub clog_ticks_max: u64,
    /// Per tick per up replica: power fails at one of its next storage ops.
    pub crash_per_mille: u64,
    /// Per tick per down replica: it boots again.
    pub restart_per_mille: u64,
    /// Share of reboots that come back with the disk lost, in percent.
    pub wipe_pct: u64,
    /// Share of crashes that may tear unsynced writes, in percent.
    pub tear_pct: u64,
    /// Per tick: a client append reaches the believed primary.
    pub append_per_mille: u64,
    /// Storage faults of every replica's disk.
    pub disk: DiskFaults,
}

impl FaultRates {
    /// This seed's mix. Zero is always possible for each kind, so some seeds
    /// run almost clean.
    pub fn draw(rng: &mut Rng, replica_count: u8) -> Self {
        let multi = replica_count > 1;
        Self {
            loss_per_mille: rng.below(200),
            duplicate_per_mille: rng.below(100),
            delay_ticks_max: rng.below(6),
            partition_per_mille: if multi { rng.below(20) } else { 0 },
            heal_per_mille: 5 + rng.below(50),
            asymmetric_pct: rng.below(101),
            clog_per_mille: if multi { rng.below(20) } else { 0 },
            clog_ticks_max: 1 + rng.below(40),
            crash_per_mille: rng.below(8),
            restart_per_mille: 20 + rng.below(100),
            wipe_pct: if multi { rng.below(30) } else { 0 },
            tear_pct: rng.below(101),
            append_per_mille: 100 + rng.below(600),
            disk: DiskFaults {
                read_eio: per_million(rng.below(3_000)),
                read_bit_flip: per_million(rng.below(3_000)),
                write_eio: per_million(rng.below(300)),
                sync_eio: per_million(rng.below(1_000)),
                space_bytes_max: None,
            },
        }
    }

    /// The liveness phase: the network healed and every fault stopped.
    pub fn calm() -> Self {
        Self {
            loss_per_mille: 0,
            duplicate_per_mille: 0,
            delay_ticks_max: 1,
            partition_per_mille: 0,
            heal_per_mille: 1000,
            asymmetric_pct: 0,
            clog_per_mille: 0,
            clog_ticks_max: 1,
            crash_per_mille: 0,
            restart_per_mille: 1000,
            wipe_pct: 0,
            tear_pct: 0,
            append_per_mille: 0,
            disk: DiskFaults::default(),
        }
    }
}

fn per_million(n: u64) -> f64 {
    n as f64 / 1_000_000.0
}

/// True with probability `per_mille` / 1000.
pub fn chance(rng: &mut Rng, per_mille: u64) -> bool {
    per_mille > 0 && rng.below(1000) < per_mille
}
