//! The simulator catches each planted bug (feature `planted-bugs`; run by
//! ci/test: `cargo test --release -p ringlog-shard --features planted-bugs
//! --test planted`), so its checkers cannot silently lose their teeth.
#![cfg(feature = "planted-bugs")]

use ringlog_shard::sim::{self, SimOptions};
use ringlog_shard::vsr::planted::{self, Plant};

/// Seeds a plant must be caught within.
const SEEDS_MAX: u64 = 500;

/// The first seed (of 0..SEEDS_MAX) that fails with `plant` on, and the
/// check that failed; `shape` sets the runs' options.
fn caught(plant: Plant, shape: fn(&mut SimOptions)) -> Option<(u64, &'static str)> {
    planted::set(Some(plant));
    let found = (0..SEEDS_MAX).find_map(|seed| {
        let mut opts = SimOptions::new(seed);
        shape(&mut opts);
        let failure = sim::run(opts).err()?;
        Some((seed, failure.check))
    });
    planted::set(None);
    found
}

fn assert_caught(plant: Plant, checks: &[&str]) {
    assert_caught_with(plant, checks, |_| {});
}

fn assert_caught_with(plant: Plant, checks: &[&str], shape: fn(&mut SimOptions)) {
    let Some((seed, check)) = caught(plant, shape) else {
        panic!("{plant:?} not caught within {SEEDS_MAX} seeds");
    };
    eprintln!(
        "{plant:?}: caught at seed {seed} ({} seeds) by '{check}'",
        seed + 1
    );
    assert!(
        checks.contains(&check),
        "{plant:?} caught by '{check}', expected one of {checks:?}"
    );
}

#[test]
fn ack_before_fsync_is_caught() {
    assert_caught(Plant::AckBeforeFsync, &["PrepareOk after fsync"]);
}

#[test]
fn log_view_not_persisted_before_do_view_change_is_caught() {
    assert_caught(
        Plant::LogViewNotPersistedBeforeDoViewChange,
        &["log_view durable before send"],
    );
}

#[test]
fn duplicate_prepare_ok_counted_is_caught() {
    assert_caught(
        Plant::DuplicatePrepareOkCounted,
        &["acked op durable on a quorum"],
    );
}

#[test]
fn truncation_below_commit_is_caught() {
    assert_caught(
        Plant::TruncateBelowCommit,
        &["committed ops never cut", "cuts the store accepts"],
    );
}

/// Runs with retention, state transfer, operator purges and a hostile
/// transfer server on (as the transfer batch in tests/sim.rs): a stale
/// pre-purge offer reaches a purged receiver only there. With purges
/// replicated in the log an honest one is rare (its server committed the
/// purge op and has not run it yet); the hostile server's stale offers
/// (one purge generation below the requester's) make one within the bound.
/// Taking such a lie is caught as a lie taken ('hostile offers refused',
/// checked as the offer is taken, before the install's generation check):
/// with only the generation check planted away, the lies it lets through
/// are the stale-generation ones.
#[test]
fn install_ignoring_the_purge_generation_is_caught() {
    assert_caught_with(
        Plant::InstallIgnoresPurgeGeneration,
        &["stale pre-purge offers refused", "hostile offers refused"],
        |o| {
            o.transfers = true;
            o.purges = true;
            o.hostile = true;
        },
    );
}

/// The plants are off unless set: the same seeds pass without them.
#[test]
fn without_a_plant_the_seeds_pass() {
    planted::set(None);
    for seed in 0..20 {
        sim::run(SimOptions::new(seed)).unwrap_or_else(|f| panic!("{f}"));
    }
    assert_eq!(planted::ALL.len(), 5);
}
