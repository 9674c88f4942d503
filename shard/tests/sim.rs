//! The deterministic cluster simulator (`ringlog_shard::sim`) in CI:
//! fault-free seeds converge, a seed replays to the same trace hash.

use ringlog_shard::sim::{self, SimOptions};

/// Guards against: the replica, executor and store failing to commit and
/// converge even without faults (only delays, disk speeds, a client).
#[test]
fn fault_free_seeds_converge() {
    let mut acks = 0;
    for seed in 0..64 {
        let mut opts = SimOptions::new(seed);
        opts.faults = false;
        let summary = sim::run(opts).unwrap_or_else(|f| panic!("{f}"));
        assert!(summary.liveness_ticks.is_some(), "{summary}");
        assert_eq!(summary.counts.crashes, 0);
        acks += summary.counts.acks;
    }
    assert!(acks > 64 * 50, "too few acks to mean anything: {acks}");
}

/// Guards against: hidden nondeterminism (a clock, thread or hash-map
/// order) making a failing seed unreplayable.
#[test]
fn same_seed_same_trace_hash() {
    for seed in [3, 11, 12] {
        let mut opts = SimOptions::new(seed);
        opts.faults = false;
        let a = sim::run(opts).unwrap_or_else(|f| panic!("{f}"));
        let b = sim::run(opts).unwrap_or_else(|f| panic!("{f}"));
        assert_eq!(a.trace_hash, b.trace_hash, "seed {seed}");
        assert_eq!(a.counts, b.counts, "seed {seed}");
        opts.seed += 1000;
        let c = sim::run(opts).unwrap_or_else(|f| panic!("{f}"));
        assert_ne!(a.trace_hash, c.trace_hash, "seeds {seed} and {}", opts.seed);
    }
}
