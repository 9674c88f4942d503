//! The consume job: `connections` threads, each with one blocking client,
//! read their partitions of a topic from the start to the high watermark
//! with fetch requests of at most `fetch_bytes` (no waiting), one request in
//! flight per connection. Every fetched batch is parsed and verified
//! (checksums, record structure), as a consumer would.

use std::sync::Barrier;
use std::time::Instant;

use ringlog_protocol::BatchView;
use ringlog_shard::client::Client;

use crate::jobs::produce::{partitions_of, ClientJobError};
use crate::stats::{CpuMeter, LatencyRecorder, RunSummary};

#[derive(Debug, Clone)]
pub struct ConsumeConfig {
    pub addr: String,
    pub topic: String,
    pub partitions: u32,
    /// At most `partitions`: each connection reads its own partitions.
    pub connections: u32,
    /// max_bytes of each fetch.
    pub fetch_bytes: u32,
}

#[derive(Debug, Clone)]
pub struct ConsumeResult {
    /// bytes/ios (fetch requests)/runtime over all connections; lat is the
    /// per-fetch latency (request sent to reply read).
    pub summary: RunSummary,
    /// Records read (every batch parsed and verified).
    pub records: u64,
    pub batches: u64,
}

struct Tally {
    lat: LatencyRecorder,
    bytes: u64,
    fetches: u64,
    records: u64,
    batches: u64,
}

/// Reads every partition of `cfg.topic` from its log start to its high
/// watermark.
pub fn run(cfg: &ConsumeConfig) -> Result<ConsumeResult, ClientJobError> {
    assert!(cfg.connections <= cfg.partitions, "checked by the caller");
    let clients = (0..cfg.connections)
        .map(|conn| {
            Client::connect(&cfg.addr).map_err(|source| ClientJobError::Client {
                conn,
                what: format!("connecting to {}", cfg.addr),
                source,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let barrier = Barrier::new(cfg.connections as usize + 1);
    let (tallies, runtime, cpu) = std::thread::scope(|s| {
        let handles: Vec<_> = clients
            .into_iter()
            .zip(0..)
            .map(|(client, conn)| {
                let barrier = &barrier;
                s.spawn(move || {
                    let targets = partitions_of(conn, cfg.connections, cfg.partitions);
                    barrier.wait();
                    consume_loop(cfg, conn, client, &targets)
                })
            })
            .collect();
        barrier.wait();
        let cpu = CpuMeter::start();
        let start = Instant::now();
        let tallies: Vec<_> = handles
            .into_iter()
            .map(|h| h.join().expect("consumer threads do not panic"))
            .collect();
        (tallies, start.elapsed(), cpu.usage())
    });
    let mut lat = LatencyRecorder::new();
    let (mut bytes, mut fetches, mut records, mut batches) = (0, 0, 0, 0);
    for t in tallies {
        let t = t?;
        lat.merge(&t.lat);
        bytes += t.bytes;
        fetches += t.fetches;
        records += t.records;
        batches += t.batches;
    }
    Ok(ConsumeResult {
        summary: RunSummary::from_counts(bytes, fetches, runtime, lat.summary()).with_cpu(cpu),
        records,
        batches,
    })
}

fn consume_loop(
    cfg: &ConsumeConfig,
    conn: u32,
    mut client: Client,
    targets: &[u32],
) -> Result<Tally, ClientJobError> {
    let mut t = Tally {
        lat: LatencyRecorder::new(),
        bytes: 0,
        fetches: 0,
        records: 0,
        batches: 0,
    };
    let check = |what: String| ClientJobError::Check { conn, what };
    for &partition in targets {
        let mut offset = 0;
        loop {
            let sent = Instant::now();
            let page = client
                .fetch(&cfg.topic, partition, offset, cfg.fetch_bytes, 0)
                .map_err(|source| ClientJobError::Client {
                    conn,
                    what: format!("fetching {}/{partition}@{offset}", cfg.topic),
                    source,
                })?;
            t.lat.record(sent.elapsed());
            t.fetches += 1;
            t.bytes += page.batches.len() as u64;
            let mut rest = page.batches.as_slice();
            let mut next = offset.max(page.log_start_offset);
            while !rest.is_empty() {
                let view = BatchView::parse(rest).map_err(|e| {
                    check(format!(
                        "fetched batch of {}/{partition} near offset {next}: {e}",
                        cfg.topic
                    ))
                })?;
                let h = view.header();
                if h.base_offset != next {
                    return Err(check(format!(
                        "{}/{partition}: batch at offset {} where {next} was expected",
                        cfg.topic, h.base_offset
                    )));
                }
                next += u64::from(h.record_count);
                t.records += u64::from(h.record_count);
                t.batches += 1;
                rest = &rest[view.as_bytes().len()..];
            }
            if page.next_offset != next && !page.batches.is_empty() {
                return Err(check(format!(
                    "{}/{partition}: reply says next offset {} after batches ending at {next}",
                    cfg.topic, page.next_offset
                )));
            }
            if page.next_offset >= page.high_watermark {
                break;
            }
            if page.next_offset <= offset {
                return Err(check(format!(
                    "{}/{partition}: fetch at {offset} made no progress (high watermark {})",
                    cfg.topic, page.high_watermark
                )));
            }
            offset = page.next_offset;
        }
    }
    Ok(t)
}
