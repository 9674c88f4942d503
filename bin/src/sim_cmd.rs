//! `ringlog sim`: replays seeds of the deterministic cluster simulator
//! (the logic is `ringlog_shard::sim`; this only parses and prints).

use clap::Args;
use ringlog_shard::sim::{self, SimOptions, TICKS_DEFAULT};

#[derive(Args)]
pub struct SimArgs {
    /// The seed to run (a failing run prints its seed).
    #[arg(long)]
    seed: u64,
    /// Replica count: 1, 3 or 5 [default: drawn from the seed].
    #[arg(long, value_parser = parse_replicas)]
    replicas: Option<u8>,
    /// Ticks of the faulty (safety) phase.
    #[arg(long, default_value_t = TICKS_DEFAULT)]
    ticks: u64,
    /// Run this many consecutive seeds from --seed (for ci/vopr).
    #[arg(long, default_value_t = 1)]
    count: u64,
    /// No faults: network delays, disk speeds and the client only.
    #[arg(long)]
    no_faults: bool,
    /// No bit flips on reads (the other disk faults stay).
    #[arg(long)]
    no_read_bit_flips: bool,
    /// No replica rebooted with its disk lost.
    #[arg(long)]
    no_wipes: bool,
    /// Segment size of the simulated stores.
    #[arg(long, default_value_t = sim::SEGMENT_BYTES_DEFAULT)]
    segment_bytes: u64,
    /// Headroom past a segment's roll point for uncommitted ops.
    #[arg(long, default_value_t = sim::UNCOMMITTED_HEADROOM_BYTES_DEFAULT)]
    headroom_bytes: u64,
    /// A failing seed prints its whole trace, not only the last lines.
    #[arg(long)]
    full_trace: bool,
    /// Retention retires committed segments; replicas catch up by state
    /// transfer (the counts line then shows transfers, installs, install
    /// crashes, rotations and refusals).
    #[arg(long)]
    transfers: bool,
    /// The operator purges the partition now and then (the counts line
    /// then shows purges, store purges and stale-generation refusals).
    #[arg(long)]
    purges: bool,
    /// With --transfers: one replica's transfer server lies (garbage
    /// chunks, wrong checksums, stale offers, inflated sizes, endless
    /// re-offers or undecodable manifests, drawn per seed).
    #[arg(long)]
    hostile: bool,
}

fn parse_replicas(s: &str) -> Result<u8, String> {
    match s.parse::<u8>() {
        Ok(n @ (1 | 3 | 5)) => Ok(n),
        _ => Err(format!("replicas must be 1, 3 or 5, not {s}")),
    }
}

/// Exit code 0 when every seed passed, 1 when one failed (printed). More
/// than one seed: a last line sums what they hit.
pub fn run(a: SimArgs) -> i32 {
    let mut total = sim::Counts::default();
    for seed in a.seed..a.seed.saturating_add(a.count) {
        let opts = SimOptions {
            seed,
            replicas: a.replicas,
            ticks: a.ticks,
            faults: !a.no_faults,
            read_bit_flips: !a.no_read_bit_flips,
            wipes: !a.no_wipes,
            segment_bytes: a.segment_bytes,
            uncommitted_headroom_bytes: a.headroom_bytes,
            full_trace: a.full_trace,
            transfers: a.transfers,
            purges: a.purges,
            hostile: a.hostile,
        };
        match sim::run(opts) {
            Ok(summary) => {
                total.add(&summary.counts);
                println!("{summary}");
            }
            Err(failure) => {
                eprintln!("{failure}");
                return 1;
            }
        }
    }
    if a.count > 1 {
        println!("{} seeds from {}: {total}", a.count, a.seed);
    }
    0
}
