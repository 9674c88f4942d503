//! The deterministic cluster simulator (`ringlog_shard::sim`) in CI:
//! fault-free seeds converge, a seed replays to the same trace hash.

use ringlog_shard::sim::cluster::{Hostile, HOSTILITIES};
use ringlog_shard::sim::{self, SimOptions};
use ringlog_shard::vsr::Trigger;

/// Guards against: the replica, executor and store failing to commit and
/// converge even without faults (only delays, disk speeds, a client).
#[test]
fn fault_free_seeds_converge() {
    let mut acks = 0;
    for seed in 0..64 {
        let mut opts = SimOptions::new(seed);
        opts.faults = false;
        let summary = sim::run(opts).unwrap_or_else(|f| panic!("{f}"));
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

/// Seeds that once failed, each with the check it failed and what fixed
/// it. They must keep passing (run with faults, as they were found).
const PINNED_SEEDS: &[(u64, &str)] = &[
    // 'committed ops never cut': a backup cut committed ops below a pruned
    // StartView suffix (vsr: keep unvouched ops, verify by the chain).
    (1, "committed ops never cut"),
    (
        57,
        "committed ops never cut (above op 0, a restarted replica)",
    ),
    // 'committed ops agree': kept unvouched ops were committed before the
    // chain verified them (vsr: `unverified_above` caps the commit).
    (26, "committed ops agree"),
    (16, "committed ops agree"),
    // 'acked op durable on a quorum': a voter's disk wiped after its vote
    // (sim: votes from the lost disk count).
    (58, "acked op durable on a quorum"),
    // 'committed prefixes byte-identical': convergence declared while a
    // failing truncation was still queued (sim: converged waits for I/O).
    (56, "committed prefixes byte-identical"),
];

#[test]
fn pinned_regression_seeds() {
    for &(seed, found) in PINNED_SEEDS {
        let summary = sim::run(SimOptions::new(seed))
            .unwrap_or_else(|f| panic!("pinned seed {seed} (once: {found}):\n{f}"));
        eprintln!("pinned {summary}");
    }
}

/// Fresh seeds per CI run (the replica count drawn per seed): ~10 ms each
/// in release.
const FRESH_SEEDS: u64 = 256;

/// Guards against: everything the checker checks (see
/// `ringlog_shard::sim::checker`), over seeds no run saw before, every
/// fault on (wiped disks and read bit flips included). The base is
/// printed; `RINGLOG_SIM_SEED_BASE=<base>` replays the batch, and a
/// failing seed prints its own replay command. Fails if the batch hit no
/// view change, no repair, no crash or no wipe (the faults would have lost
/// their teeth).
#[test]
fn fresh_random_seeds() {
    let base = std::env::var("RINGLOG_SIM_SEED_BASE")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or_else(seed_base_from_time);
    eprintln!("sim: {FRESH_SEEDS} seeds from base {base} (RINGLOG_SIM_SEED_BASE={base} replays)");
    let started = std::time::Instant::now();
    let mut total = sim::Counts::default();
    let mut ticks = 0;
    for seed in (0..FRESH_SEEDS).map(|i| base.wrapping_add(i)) {
        let summary = sim::run(SimOptions::new(seed))
            .unwrap_or_else(|f| panic!("fresh seed failed (batch base {base}):\n{f}"));
        ticks += summary.ticks + summary.liveness_ticks;
        total.add(&summary.counts);
    }
    eprintln!(
        "sim: {FRESH_SEEDS} seeds, {ticks} ticks in {:.1} s\nsim: {total}",
        started.elapsed().as_secs_f64()
    );
    assert!(total.view_changes > 0, "no view change in the batch");
    assert!(total.repairs > 0, "no repair in the batch");
    assert!(total.crashes > 0, "no crash in the batch");
    assert!(total.wipes > 0, "no wiped disk in the batch");
    assert!(
        total.torn_crashes > 0 && total.fsync_failures > 0 && total.read_faults > 0,
        "{total}"
    );
}

/// A base no earlier run is likely to have used (the test's only clock:
/// the simulator itself never reads one).
fn seed_base_from_time() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    // Spread out, and clear of the pinned seeds.
    nanos.wrapping_mul(0x9E37_79B9_7F4A_7C15) | (1 << 40)
}

/// Seeds the CI batch's fault mix failed before the superblock commit was
/// kept within half a journal ('converges after healing': a restarted
/// primary stuck at a commit its backups' journals no longer cover).
#[test]
fn pinned_regression_seeds_ci_mix() {
    for seed in [21174, 22380, 22947] {
        let mut opts = SimOptions::new(seed);
        opts.read_bit_flips = false;
        opts.wipes = false;
        sim::run(opts).unwrap_or_else(|f| panic!("pinned seed {seed}:\n{f}"));
    }
}

/// Storage: with bit flips on reads, stores ended up corrupt on disk ('store
/// reopens after a crash', 'acked ops readable everywhere': corruption) in
/// ~0.3% of seeds. One path seen: `truncate_above` rewrote the block holding
/// the cut from a read it did not verify (`finish_cut`, `read_range` of the
/// head block), so a flipped read landed below the cut. It now reads that
/// block verified (`verified_tail`); these seeds, pinned as an open bug
/// then, pass and stay as regressions.
#[test]
fn pinned_flipped_reads_never_become_corruption() {
    for seed in [20258, 21062, 20296] {
        sim::run(SimOptions::new(seed)).unwrap_or_else(|f| panic!("seed {seed}: {f}"));
    }
}

/// Seeds that failed with wiped disks (the fresh batch ran without them
/// then): (seed, replicas, read bit flips, the check it failed), each as
/// it was found, with what fixed it.
const PINNED_WIPE_SEEDS: &[(u64, u8, bool, &str)] = &[
    // Since also 'a new primary holds every committed op': a replica wiped
    // in view 0 counted as whole at its first superblock write, mid-repair
    // (vsr: `leave_wiped_when_whole`). Found as 21821; since ViewNotice
    // changed the message stream 21821 no longer wipes, and 21823 was the
    // next seed that did; since a new primary commits what it repairs,
    // 21826 is.
    (21826, 3, false, "converges after healing"),
    // Under a steady stream the primary's pipeline never drained, its store
    // never rolled, the uncommitted headroom filled and it fenced at every
    // view change it was needed for (vsr: `Config::drain_every_bytes`).
    (5007363, 3, true, "converges after healing"),
    // A new primary repaired the ops of its view without committing any
    // until the last one arrived: past its segment's headroom the store
    // refused the append and it fenced, at every reboot, while the third
    // replica's disk was lost (vsr: `on_prepares` commits before each
    // linked op).
    (15003536, 3, true, "converges after healing"),
];

#[test]
fn pinned_regression_seeds_wipes() {
    for &(seed, replicas, flips, found) in PINNED_WIPE_SEEDS {
        let mut opts = SimOptions::new(seed);
        opts.replicas = Some(replicas);
        opts.read_bit_flips = flips;
        let summary =
            sim::run(opts).unwrap_or_else(|f| panic!("pinned seed {seed} (once: {found}):\n{f}"));
        assert!(summary.counts.wipes > 0, "seed {seed} no longer wipes");
    }
}

/// Seeds that found a bug in the sim backend's namespace model (a crash
/// replayed the removal of a leftover staging or generation directory onto
/// the new directory created or renamed under its name, so a reinstall
/// after an interrupted install lost its segment table: 'store reopens
/// after a crash' failed). Fixed in storage/src/io/sim/names.rs; pinned in
/// `pinned_transfer_seeds_reinstall_after_interrupted_install`.
const TRANSFER_REINSTALL_SEEDS: &[u64] = &[7_000_012, 7_000_112, 7_000_118, 7_000_123];

fn transfer_opts(seed: u64) -> SimOptions {
    let mut opts = SimOptions::new(seed);
    opts.transfers = true;
    opts
}

/// The transfer batch's options: transfers, operator purges racing them,
/// and a hostile transfer server (groups of 3 and 5).
fn batch_opts(seed: u64) -> SimOptions {
    let mut opts = transfer_opts(seed);
    opts.purges = true;
    opts.hostile = true;
    opts
}

/// Seeds of the transfer batch that hit an open bug; skipped by the batch,
/// an open-bug test replays them. None open now (those it held are pinned
/// in `pinned_transfer_seeds_purge_and_floor` and
/// `pinned_transfer_seed_an_install_covering_the_log_keeps_a_voter`).
const TRANSFER_OPEN_BUG_SEEDS: &[u64] = &[];

/// 11017175 (`--transfers --purges`, 5 replicas) failed 'acked op durable
/// on a quorum': R3 voted R1 into view 1, lost its disk, rebooted where
/// only view 0's primary R0 and R2 heard it, took R0's StartView and acked
/// R0's new ops, completing view 0's quorum for ops view 1 had discarded.
/// A replica that lost its disk now acks nothing and ends its wipe only
/// once a quorum of peers' answers (ViewNotice, StartView) names no view
/// above its own (`vsr::tests::a_replica_that_lost_its_disk_acks_nothing_until_a_quorum_names_its_view`).
/// Found by `ci/vopr`-style fresh runs of 11000000..11017500.
#[test]
fn pinned_wiped_replica_learns_its_view_from_a_quorum() {
    for (seed, hostile) in [(11_017_175, false), (11_017_175, true)] {
        let mut opts = transfer_opts(seed);
        opts.purges = true;
        opts.hostile = hostile;
        opts.replicas = Some(5);
        sim::run(opts).unwrap_or_else(|f| panic!("seed {seed}: {f}"));
    }
}

/// 31009637 (batch options, 3 replicas) failed 'converges after healing':
/// the primary R1, rebooted without batch bytes to re-prepare with, held
/// ops 218..220 uncommitted; both backups had purged through op 220, so it
/// was their log base, not a journal entry, and their re-acks on a stalled
/// commit skipped it. The re-ack now includes the log's base. Found by a
/// fresh run of 31000000..31020100.
#[test]
fn pinned_stalled_commit_reacks_the_log_base() {
    sim::run(batch_opts(31_009_637)).unwrap_or_else(|f| panic!("seed 31009637: {f}"));
}

/// 31001553 (batch options, 3 replicas) failed 'converges after healing'.
/// R0 lost its disk (a non-voter until a quorum names its view), and R1
/// crashed while its superblock was being marked wiped for an install
/// that had not committed: it rebooted wiped with its old log, which holds
/// every op it acked, so it never voted and R2 alone could not finish a
/// view change. The mark is now written by the install's commit itself
/// (`Installs::mark_for_commit`): a crash leaves the old log unmarked or
/// the new one marked. Found by a fresh run of 31000000..31020100.
#[test]
fn pinned_crash_at_an_install_commit_beside_a_lost_disk() {
    sim::run(batch_opts(31_001_553)).unwrap_or_else(|f| panic!("seed 31001553: {f}"));
}

/// 32009585 (batch options, 5 replicas) failed 'acked op durable on a
/// quorum', falsely: R0 voted for op 42, lost its disk, and lost it again
/// while the primary's ack of op 42 rested on that first vote; the
/// checker's record of votes cast from lost disks kept only the last
/// disk's. It keeps every lost disk's now. Found by a fresh run of
/// 32000000..32012900.
#[test]
fn pinned_votes_from_every_lost_disk_still_count() {
    sim::run(batch_opts(32_009_585)).unwrap_or_else(|f| panic!("seed 32009585: {f}"));
}

/// 34004449 (batch options, 3 replicas) failed 'store reopens after a
/// crash': a simulator defect, not the store's. A crashed install left its
/// generation directory, whose segments the reopen renamed into the
/// recycle pool; the next install's staging directory took the same name,
/// and at the next fsync the sim's namespace replayed the old rename onto
/// the new segment of that name. A rename now moves only the node it
/// moved (`io::sim::names` test
/// `a_reused_directory_name_keeps_entries_the_old_one_renamed_away`;
/// `transfer_sim` crash points now also lose power after the fresh
/// install). Found by a fresh run of 34003000..34006000.
#[test]
fn pinned_a_reused_generation_name_keeps_its_segments() {
    sim::run(batch_opts(34_004_449)).unwrap_or_else(|f| panic!("seed 34004449: {f}"));
}

/// 34001134 (batch options, 3 replicas) failed 'converges after healing':
/// R0, the primary and the only holder of ops R1 lacked, lost its disk;
/// R1 was transferring (repair stuck on those ops) and R2 too (its log
/// below the purge R1 had applied), and a transferring replica passed its
/// turn as primary, so the two voters passed turns for ever (view 327).
/// One stuck on repair now leads at its turn: the new view's log is the
/// DoViewChange quorum's, here its own. Found by a fresh run of
/// 34000000..34003000.
#[test]
fn pinned_a_replica_stuck_on_repair_leads_at_its_turn() {
    sim::run(batch_opts(34_001_134)).unwrap_or_else(|f| panic!("seed 34001134: {f}"));
}

/// 35010082 (batch options, 5 replicas) failed 'store reopens after a
/// crash': a simulator defect again. R3's installs crashed twice and were
/// fenced once before one landed; a reopen renamed a crashed install's
/// segments into the recycle pool, the next install's directory took the
/// old generation's name, and the sim's path-keyed durable view lost the
/// renamed-out segment that a later roll renamed back in. A directory
/// renamed onto a freed name now settles that name's removal first
/// (`io::sim::names` test
/// `a_file_renamed_out_of_a_reused_directory_name_can_come_back`;
/// `transfer_sim::two_crashed_installs_then_one_that_lands_survive_power_cuts`).
/// Found by a fresh run of 35000000..35012000.
#[test]
fn pinned_a_segment_recycled_back_into_a_reused_generation_name_survives() {
    sim::run(batch_opts(35_010_082)).unwrap_or_else(|f| panic!("seed 35010082: {f}"));
}

/// 13001369 (batch options, 3 replicas) failed 'converges after healing':
/// the new primary R2 held op 195 uncommitted; R0 had installed a snapshot
/// ending at op 195, so op 195 was its log base, not a journal entry, and
/// it never acked R2's Prepare for it (nor did R1, already past it): R2's
/// commit stayed one behind forever. A Prepare that matches the log's
/// base (durable by construction: installed, or pruned only once durable)
/// is acked now.
#[test]
fn pinned_prepare_of_the_log_base_is_acked() {
    let mut opts = batch_opts(13_001_369);
    opts.replicas = Some(3);
    sim::run(opts).unwrap_or_else(|f| panic!("seed 13001369: {f}"));
}

/// With purges on, a cluster of one that crashed after appending a purge op
/// and before its flush completed ended with its store a purge generation
/// ahead of the simulator's log ('purge generations agree'). Its recovery
/// commits the durable log (R = 1), so the purge op is committed and applied
/// there; nothing had told the simulator. It now learns the generation from
/// that recovery (`Cluster::learn_lone_recovery_purge`). Seeds from fresh
/// runs of 7100000..7103000, 7300000..7300800 and 7001000..7005000.
#[test]
fn pinned_lone_replica_purge_committed_by_its_recovery() {
    for seed in [7_100_990, 7_101_079, 7_300_428, 7_003_161, 7_003_505] {
        let mut opts = batch_opts(seed);
        opts.replicas = Some(1);
        sim::run(opts).unwrap_or_else(|f| panic!("seed {seed}: {f}"));
    }
}

/// 7000168 failed 'converges after healing': the primary R0 crashed and
/// rebooted with its disk lost while R2, behind retention, installed a
/// snapshot from R1; an install rebooted its replica wiped (a non-voter
/// until its log is whole), so two of three replicas could not vote, R1
/// could not finish a view change, and nobody was Normal to make the
/// others whole. R2's install covered every op its log held before it
/// (so every op it may have acked): such an install now leaves the
/// superblock unmarked and the replica votes again as one that is behind. Found
/// when backups took each repaired op's commit before appending the next
/// (which moved this seed's trajectory onto it).
#[test]
fn pinned_transfer_seed_an_install_covering_the_log_keeps_a_voter() {
    sim::run(batch_opts(7_000_168)).unwrap_or_else(|f| panic!("{f}"));
}

/// 7200075 failed 'converges after healing' (replicas 3): R2 became primary
/// of view 14 with commit 138 from a reboot (no batch bytes to re-prepare
/// with), while its backups had committed through 141 in an older view. They
/// re-ack only above their own commit, so the primary got acks of op 142
/// alone and never committed 139. An ack of an op now votes for every
/// pipeline op below it
/// (`vsr::tests::prepare_ok_for_an_op_votes_for_every_pipeline_op_below_it`).
#[test]
fn pinned_transfer_seed_a_head_ack_commits_the_pipeline_below_it() {
    let mut opts = batch_opts(7_200_075);
    opts.replicas = Some(3);
    sim::run(opts).unwrap_or_else(|f| panic!("{f}"));
}

/// Seeds that failed 'cuts the store accepts' (7000212) and 'committed ops
/// never cut' (9000071) with transfers, purges and a hostile peer: a
/// replica rebooted from a purged store (its journal only an anchor) became
/// primary, its StartView carried no header, so nothing vouched for a
/// backup's ops above the backup's lagging commit and it cut them (sealed
/// ones in 7000212, refused by the store; a committed one in 9000071).
/// StartView and DoViewChange now carry their head's checksum
/// (`vsr::tests::start_view_from_an_empty_journal_vouches_for_its_head`).
#[test]
fn pinned_transfer_seeds_empty_journal_head_vouched() {
    // 9100078, 9100304, 9100553, 9100659, from a fresh batch of 1000
    // (9100000..9101000): they failed 'committed ops never cut' or 'cuts
    // the store accepts' before the fix and pass after (their traces were
    // not read one by one).
    for seed in [
        7_000_212, 9_000_071, 9_100_078, 9_100_304, 9_100_553, 9_100_659,
    ] {
        sim::run(batch_opts(seed)).unwrap_or_else(|f| panic!("seed {seed}: {f}"));
    }
}

/// Seed 9000152 ('converges after healing', transfers + purges + hostile):
/// R2's disk was wiped after it acked ops 30..79 with R1, R0 lagged at 29
/// and R1 retired 30..57, so only R1 held them, and R1 was the seed's
/// hostile server (undecodable manifests): no receiver could install. The
/// liveness phase now heals the lies too
/// (`sim::cluster::hostile::tests::a_healed_hostile_peer_tells_no_more_lies`).
#[test]
fn pinned_transfer_seed_the_liar_holds_the_only_copy() {
    sim::run(batch_opts(9_000_152)).unwrap_or_else(|f| panic!("{f}"));
}

/// Guards against: a replica whose peers retired the ops it needs (it
/// lagged past their retention, or lost its disk) never catching up, and
/// an install breaking the checker's invariants (acked ops lost,
/// committed prefixes differing, retired or cut data returning, the VSR
/// state or the wipe lost across a crash during the install), purged data
/// returning or a stale pre-purge offer taken (operator purges racing the
/// transfers), and a hostile transfer server costing more than its charges
/// or keeping a receiver from an honest peer. Retention on, every fault
/// on, crashes aimed at installs; prints what the batch hit and fails if
/// it hit none of a kind.
#[test]
fn transfer_seeds_converge_under_retention() {
    let started = std::time::Instant::now();
    let mut total = sim::Counts::default();
    // Per way of lying: (seeds, hostile frames, charges) of its seeds.
    let mut lies = [(0u64, 0u64, 0u64); HOSTILITIES.len()];
    let batch = 7_000_000..7_000_000 + 256;
    let skipped = TRANSFER_OPEN_BUG_SEEDS
        .iter()
        .filter(|&s| batch.contains(s))
        .count();
    let seeds = batch.filter(|s| !TRANSFER_OPEN_BUG_SEEDS.contains(s));
    for seed in seeds {
        let summary = sim::run(batch_opts(seed)).unwrap_or_else(|f| panic!("{f}"));
        total.add(&summary.counts);
        let drawn = Hostile::draw(seed, summary.replicas, true);
        if let Some(i) = drawn.and_then(|h| HOSTILITIES.iter().position(|&m| m == h.mode)) {
            let c = &summary.counts;
            lies[i].0 += 1;
            lies[i].1 += c.hostile_frames;
            lies[i].2 += c.transfer_charges;
        }
    }
    for (mode, (seeds, frames, charges)) in HOSTILITIES.iter().zip(lies) {
        eprintln!("  hostile {mode:?}: {seeds} seeds, {frames} frames, {charges} charges in them");
        assert!(
            frames > 0 && charges > 0,
            "the batch charged no {mode:?} peer"
        );
    }
    eprintln!(
        "transfer batch ({skipped} open-bug seeds skipped) in {:.1} s: {total}",
        started.elapsed().as_secs_f64()
    );
    let kinds = [
        ("segments retired", total.segments_retired),
        ("transfers started", total.transfers_started),
        ("installs", total.transfer_installs),
        ("install crashes", total.transfer_install_crashes),
        ("peer rotations", total.transfer_rotations),
        ("serving peer deaths", total.serving_crashes),
        ("refusals", total.transfer_refusals),
        ("purges", total.purges),
        ("store purges", total.replica_purges),
        ("purges over open snapshots", total.purges_over_snapshots),
        ("stale-generation refusals", total.stale_generation_refusals),
        ("hostile frames", total.hostile_frames),
        ("charges", total.transfer_charges),
        ("quarantines", total.transfer_quarantines),
        (
            "purged transfers",
            total.transfers_by_trigger[Trigger::Purged.index()],
        ),
        (
            "new_or_wiped transfers",
            total.transfers_by_trigger[Trigger::NewOrWiped.index()],
        ),
        (
            "repair_stuck transfers",
            total.transfers_by_trigger[Trigger::RepairStuck.index()],
        ),
    ];
    for (kind, n) in kinds {
        assert!(n > 0, "the batch hit no {kind}: {total}");
    }
}

/// Guards against a reinstall after an interrupted install losing its
/// segment table at a later crash; see [`TRANSFER_REINSTALL_SEEDS`].
#[test]
fn pinned_transfer_seeds_reinstall_after_interrupted_install() {
    for &seed in TRANSFER_REINSTALL_SEEDS {
        if let Err(f) = sim::run(transfer_opts(seed)) {
            panic!("{f}");
        }
    }
}

/// Guards against: a replica told RangeEvicted freezing for its whole
/// transfer (marked wiped, not stepped): at R = 3 with another replica
/// wiped, the third could not finish a view change and no server was
/// Normal to offer a snapshot ('converges after healing' failed). The
/// replica now keeps voting with its intact log while it waits for an
/// offer, refusing only primaryship and PrepareOk (vsr, see
/// `vsr::tests::transfer::a_replica_transferring_a_retired_range_still_votes_in_a_view_change`).
/// 8000836 (found with that fix): three of five replicas repaired only
/// from the primary, which had retired the ops they lacked, while a
/// backup still held them; they now rotate their repair peer
/// (`a_transferring_replica_repairs_from_a_peer_that_still_holds_the_ops`).
/// The transfer batch (with purges) once skipped 7000119 and 7000170 for
/// the freeze; it runs them again.
/// 9000208 (transfers, purges, hostile): a crash inside the write that
/// unmarks the superblock after an install that did not commit left it
/// unwiped while the sim still held the replica wiped ('a wipe survives a
/// crash'); the unwipe was then asked before the write, and now there is
/// no such write (an install's commit carries its mark).
#[test]
fn pinned_transfer_seed_a_transferring_replica_still_votes() {
    for seed in [8_000_652, 8_000_836] {
        sim::run(transfer_opts(seed)).unwrap_or_else(|f| panic!("{f}"));
    }
    sim::run(batch_opts(9_000_208)).unwrap_or_else(|f| panic!("{f}"));
}

/// Seeds the transfer batch's options failed ('converges after healing'):
/// - 7000119: under the old purge model (a per-replica admin action while
///   a replica was quiet) purge 1 through op 143 purged the backups R0 and
///   R1; the primary R2, never quiet again, stayed at purge generation 0,
///   so R0 and R1 (later behind its retention) refused every offer of its
///   as stale, and R2 could not commit without them. Purges are now ops
///   in the log applied by every replica at commit (`sim/purge.rs`).
/// - 9100137 (from a fresh batch of 1000, 9100000..9101000; only
///   replayed): R1, restarted with its superblock commit (121) behind what
///   its store had sealed, later retired everything through op 122; R0
///   (wiped) and R2 (op 113) needed a transfer and R1 held the only copy.
///   R1's server cut every snapshot to its replica's commit, found nothing
///   at or below 121 ("no committed prefix to offer below op 122") and
///   answered Busy for ~2800 ticks (`transfer::tests::
///   a_server_whose_commit_lags_its_sealed_segments_offers_them`). With
///   that fixed the receivers installed at op 122, and R1, primary at
///   commit 121, waited for acks of op 122 that they held only as their
///   installed anchor; a restart now boots committed through the sealed
///   floor (`replica_io::tests::recover_boots_at_least_at_the_sealed_floor`).
///   Its trace was read on the pre-fix code (the new purge model alone
///   changes its trajectory, so it passed for that reason first).
/// - 9200060 (a fresh batch of 500, 9200000..9200500, found with the new
///   purge model; 'messages encode'): the hostile server (endless
///   re-offers) crashed and rebooted wiped between two ticks and re-sent
///   its last offer, of view 3, from a store at view 0; it now forgets its
///   offers when its process dies.
#[test]
fn pinned_transfer_seeds_purge_and_floor() {
    for seed in [7_000_119, 9_100_137, 9_200_060] {
        sim::run(batch_opts(seed)).unwrap_or_else(|f| panic!("seed {seed}: {f}"));
    }
}
