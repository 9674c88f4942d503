//! Per-shard counters and histograms, written by the owning shard (relaxed
//! atomics, no locks, nothing allocated), and their Prometheus text
//! exposition (format 0.0.4), encoded only at scrape time with the
//! `prometheus-client` crate for the control socket and `GET /metrics`.
//!
//! Names follow the Prometheus conventions: base units (`_seconds`,
//! `_bytes`; histograms record microseconds and are exported in seconds),
//! `_total` on counters and only there, one HELP and one TYPE per family.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use ringlog_storage::store::{ReadAheadStats, ReadCacheStats};

use crate::mailbox::MailboxTx;
use crate::ops::TransferCounters;

/// The `Content-Type` of what [`render`] returns.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// A fixed-bucket histogram (Prometheus semantics: cumulative `le` buckets).
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [u64],
    /// One counter per bound plus +Inf.
    buckets: Vec<AtomicU64>,
    sum: AtomicU64,
    count: AtomicU64,
}

/// fdatasync latency buckets, microseconds.
pub const FSYNC_US_BOUNDS: &[u64] = &[
    50, 100, 200, 300, 500, 750, 1_000, 2_000, 5_000, 10_000, 25_000, 50_000, 100_000,
];
/// Request latency buckets (produce, fetch), microseconds: 50 µs to 10 s.
pub const REQUEST_US_BOUNDS: &[u64] = crate::ops::LATENCY_US_BOUNDS;
/// Appends per group commit.
pub const GROUP_BOUNDS: &[u64] = &[1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024];

impl Histogram {
    pub fn new(bounds: &'static [u64]) -> Histogram {
        debug_assert!(bounds.windows(2).all(|w| w[0] < w[1]), "bounds ascend");
        Histogram {
            bounds,
            buckets: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }

    pub fn record(&self, value: u64) {
        let i = self.bounds.partition_point(|&b| b < value);
        if let Some(b) = self.buckets.get(i) {
            b.fetch_add(1, Ordering::Relaxed);
        }
        self.sum.fetch_add(value, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// (upper bound / `divisor`, observations in that bucket alone), +Inf
    /// last; the sum / `divisor`; the count (the buckets' total, so that
    /// the +Inf bucket and `_count` agree under concurrent recording).
    /// Dividing (not multiplying by 1e-6) keeps 50 µs exactly `5e-05`.
    fn snapshot(&self, divisor: f64) -> (Vec<(f64, u64)>, f64, u64) {
        let mut buckets = Vec::with_capacity(self.buckets.len());
        let mut count = 0;
        for (i, b) in self.buckets.iter().enumerate() {
            let n = b.load(Ordering::Relaxed);
            count += n;
            let bound = self
                .bounds
                .get(i)
                .map_or(f64::INFINITY, |&b| b as f64 / divisor);
            buckets.push((bound, n));
        }
        let sum = self.sum.load(Ordering::Relaxed) as f64 / divisor;
        (buckets, sum, count)
    }
}

#[derive(Debug)]
pub struct ShardMetrics {
    pub appends_total: AtomicU64,
    pub append_bytes_total: AtomicU64,
    pub append_errors_total: AtomicU64,
    pub fsyncs_total: AtomicU64,
    pub fsync_latency_us: Histogram,
    pub group_commit_appends: Histogram,
    /// Produce requests, from decoded to reply ready (durable or failed).
    pub produce_latency_us: Histogram,
    /// Fetch requests, from decoded to reply ready (long-poll wait included).
    pub fetch_latency_us: Histogram,
    pub fetches_total: AtomicU64,
    pub fetch_bytes_total: AtomicU64,
    pub forwards_total: AtomicU64,
    pub backpressure_total: AtomicU64,
    pub connections_open: AtomicU64,
    pub connections_total: AtomicU64,
    pub connections_refused_total: AtomicU64,
    pub bad_frames_total: AtomicU64,
    pub parked_total: AtomicU64,
    pub idle_timeouts_total: AtomicU64,
    pub header_timeouts_total: AtomicU64,
    pub over_budget_total: AtomicU64,
    pub write_timeouts_total: AtomicU64,
    /// Replication messages stepped by this shard's replicas.
    pub peer_messages_total: AtomicU64,
    /// Replication messages dropped: undecodable, of another replica group
    /// or sender, for a partition not here, or a full mailbox on the way
    /// (VSR retransmits).
    pub peer_drops_total: AtomicU64,
    /// Copies of the shard's read cache counters (the pool is the shard
    /// thread's; see [`set_read_cache`]).
    pub read_cache_hits_total: AtomicU64,
    pub read_cache_misses_total: AtomicU64,
    pub read_cache_served_bytes_total: AtomicU64,
    pub read_cache_bytes: AtomicU64,
    /// Copies of the shard's read-ahead counters (see [`set_read_ahead`]).
    pub read_ahead_issued_total: AtomicU64,
    pub read_ahead_hits_total: AtomicU64,
    pub read_ahead_wasted_total: AtomicU64,
    pub read_ahead_refused_total: AtomicU64,
    pub read_ahead_errors_total: AtomicU64,
    pub read_ahead_bytes: AtomicU64,
    /// Sums of the shard's partitions' transfer counters (see
    /// [`set_transfers`]).
    /// By trigger, in the order of [`TRANSFER_TRIGGERS`].
    pub transfer_started_total: [AtomicU64; TRANSFER_TRIGGERS.len()],
    pub transfer_installs_total: AtomicU64,
    pub transfer_attempts_failed_total: AtomicU64,
    pub transfer_rotations_total: AtomicU64,
    pub transfer_refusals_total: AtomicU64,
    pub transfer_charges_total: AtomicU64,
    pub transfer_quarantines_total: AtomicU64,
    pub transfer_bytes_received_total: AtomicU64,
    pub transfer_chunks_received_total: AtomicU64,
    pub transfer_bytes_served_total: AtomicU64,
    pub transfer_chunks_served_total: AtomicU64,
    pub transfer_ops_refused_total: AtomicU64,
    pub transfer_installs_deferred_total: AtomicU64,
    /// Fetch reply buffers this shard allocated because the server's pool
    /// (`reply_pool`) had none idle: flat while consumers are served from
    /// kept buffers.
    pub reply_buffers_allocated_total: AtomicU64,
    /// Sent replies' buffers this shard let go (the pool full, or one grown
    /// past its size bound).
    pub reply_buffers_dropped_total: AtomicU64,
    /// Produce batches read straight into a buffer lent by the store pool.
    pub produce_buffers_lent_total: AtomicU64,
    /// Produce batches read into a heap buffer because the pool's lending
    /// bound (`batch_buffers_lent_max`) was reached.
    pub produce_buffers_refused_total: AtomicU64,
}

impl Default for ShardMetrics {
    fn default() -> Self {
        Self {
            appends_total: AtomicU64::new(0),
            append_bytes_total: AtomicU64::new(0),
            append_errors_total: AtomicU64::new(0),
            fsyncs_total: AtomicU64::new(0),
            fsync_latency_us: Histogram::new(FSYNC_US_BOUNDS),
            group_commit_appends: Histogram::new(GROUP_BOUNDS),
            produce_latency_us: Histogram::new(REQUEST_US_BOUNDS),
            fetch_latency_us: Histogram::new(REQUEST_US_BOUNDS),
            fetches_total: AtomicU64::new(0),
            fetch_bytes_total: AtomicU64::new(0),
            forwards_total: AtomicU64::new(0),
            backpressure_total: AtomicU64::new(0),
            connections_open: AtomicU64::new(0),
            connections_total: AtomicU64::new(0),
            connections_refused_total: AtomicU64::new(0),
            bad_frames_total: AtomicU64::new(0),
            parked_total: AtomicU64::new(0),
            idle_timeouts_total: AtomicU64::new(0),
            header_timeouts_total: AtomicU64::new(0),
            over_budget_total: AtomicU64::new(0),
            write_timeouts_total: AtomicU64::new(0),
            peer_messages_total: AtomicU64::new(0),
            peer_drops_total: AtomicU64::new(0),
            read_cache_hits_total: AtomicU64::new(0),
            read_cache_misses_total: AtomicU64::new(0),
            read_cache_served_bytes_total: AtomicU64::new(0),
            read_cache_bytes: AtomicU64::new(0),
            read_ahead_issued_total: AtomicU64::new(0),
            read_ahead_hits_total: AtomicU64::new(0),
            read_ahead_wasted_total: AtomicU64::new(0),
            read_ahead_refused_total: AtomicU64::new(0),
            read_ahead_errors_total: AtomicU64::new(0),
            read_ahead_bytes: AtomicU64::new(0),
            transfer_started_total: Default::default(),
            transfer_installs_total: AtomicU64::new(0),
            transfer_attempts_failed_total: AtomicU64::new(0),
            transfer_rotations_total: AtomicU64::new(0),
            transfer_refusals_total: AtomicU64::new(0),
            transfer_charges_total: AtomicU64::new(0),
            transfer_quarantines_total: AtomicU64::new(0),
            transfer_bytes_received_total: AtomicU64::new(0),
            transfer_chunks_received_total: AtomicU64::new(0),
            transfer_bytes_served_total: AtomicU64::new(0),
            transfer_chunks_served_total: AtomicU64::new(0),
            transfer_ops_refused_total: AtomicU64::new(0),
            transfer_installs_deferred_total: AtomicU64::new(0),
            reply_buffers_allocated_total: AtomicU64::new(0),
            reply_buffers_dropped_total: AtomicU64::new(0),
            produce_buffers_lent_total: AtomicU64::new(0),
            produce_buffers_refused_total: AtomicU64::new(0),
        }
    }
}

pub fn inc(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

pub fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// Publishes the read cache's counters (kept by the shard's pool).
pub fn set_read_cache(m: &ShardMetrics, s: &ReadCacheStats) {
    m.read_cache_hits_total.store(s.hits, Ordering::Relaxed);
    m.read_cache_misses_total.store(s.misses, Ordering::Relaxed);
    m.read_cache_served_bytes_total
        .store(s.served_bytes, Ordering::Relaxed);
    m.read_cache_bytes.store(s.held_bytes, Ordering::Relaxed);
}

/// Publishes the read-ahead counters (kept by the shard's pool).
pub fn set_read_ahead(m: &ShardMetrics, s: &ReadAheadStats) {
    m.read_ahead_issued_total.store(s.issued, Ordering::Relaxed);
    m.read_ahead_hits_total.store(s.hits, Ordering::Relaxed);
    m.read_ahead_wasted_total.store(s.wasted, Ordering::Relaxed);
    m.read_ahead_refused_total
        .store(s.refused, Ordering::Relaxed);
    m.read_ahead_errors_total.store(s.errors, Ordering::Relaxed);
    m.read_ahead_bytes.store(s.held_bytes, Ordering::Relaxed);
}

/// The shard's transfer counters, summed over its partitions (a closed
/// partition's are gone with it), and the bytes and chunks they moved.
#[derive(Clone, Copy, Debug, Default)]
pub struct TransferTotals {
    pub counters: TransferCounters,
    pub bytes_received: u64,
    pub chunks_received: u64,
    pub bytes_served: u64,
    pub chunks_served: u64,
}

/// The `trigger` label of `ringlog_transfer_started_total`, by index: the
/// names of `vsr::Trigger::ALL` (the shard checks they agree).
pub const TRANSFER_TRIGGERS: [&str; 5] = [
    "range_evicted",
    "purged",
    "new_or_wiped",
    "repair_stuck",
    "corrupt_segment",
];

pub fn set_transfers(m: &ShardMetrics, t: &TransferTotals) {
    let c = &t.counters;
    for (sum, n) in m.transfer_started_total.iter().zip(c.started) {
        sum.store(n, Ordering::Relaxed);
    }
    for (counter, n) in [
        (&m.transfer_installs_total, c.installs),
        (&m.transfer_attempts_failed_total, c.attempts_failed),
        (&m.transfer_rotations_total, c.rotations),
        (&m.transfer_refusals_total, c.refusals),
        (&m.transfer_charges_total, c.charges),
        (&m.transfer_quarantines_total, c.quarantines),
        (&m.transfer_ops_refused_total, c.ops_refused),
        (&m.transfer_installs_deferred_total, c.installs_deferred),
        (&m.transfer_bytes_received_total, t.bytes_received),
        (&m.transfer_chunks_received_total, t.chunks_received),
        (&m.transfer_bytes_served_total, t.bytes_served),
        (&m.transfer_chunks_served_total, t.chunks_served),
    ] {
        counter.store(n, Ordering::Relaxed);
    }
}

/// A shard's mailbox figures, read when the scrape starts.
#[derive(Clone, Debug)]
pub struct MailboxFigures {
    pub depth: u64,
    pub capacity: u64,
    pub rejected: u64,
}

impl MailboxFigures {
    pub fn of(tx: &MailboxTx) -> MailboxFigures {
        MailboxFigures {
            depth: tx.depth() as u64,
            capacity: tx.capacity() as u64,
            rejected: tx.stats().rejected.load(Ordering::Relaxed),
        }
    }
}

/// One partition's figures, as its shard reported them for this scrape.
#[derive(Clone, Debug)]
pub struct PartitionFigures {
    pub topic: String,
    pub partition: u32,
    pub log_start_offset: u64,
    pub frontier: u64,
    pub commit: u64,
    pub size_bytes: u64,
    pub faulted: bool,
    /// A replicated partition's counters since it opened (None alone).
    pub view_changes: Option<u64>,
    pub repairs: Option<u64>,
    /// A replicated partition's prepare-to-commit latency (None alone).
    pub commit_latency: Option<crate::ops::LatencyCounts>,
}

/// A consumer group's position on one partition (see `control::consumers`).
#[derive(Clone, Debug)]
pub struct ConsumerLag {
    pub group: String,
    pub topic: String,
    pub partition: u32,
    /// The next offset the group will read (its last commit).
    pub committed: u64,
    /// Records from `committed` to the partition's durable end.
    pub lag: u64,
}

/// Everything one scrape shows.
#[derive(Debug)]
pub struct Scrape {
    pub shards: Vec<(Arc<ShardMetrics>, MailboxFigures)>,
    pub partitions: Vec<PartitionFigures>,
    /// Shards whose partition figures did not come in time.
    pub shards_unanswered: u64,
    pub consumers: Vec<ConsumerLag>,
    pub uptime_s: u64,
}

/// Renders `scrape` and the process figures as Prometheus text (0.0.4).
pub fn render(scrape: Scrape) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(scrape));
    let mut out = String::new();
    if let Err(e) = prometheus_client::encoding::prometheus_text::encode(&mut out, &registry) {
        // Writing into a String fails only if an encoder reports an error.
        tracing::error!(error = %e, "metrics do not encode");
    }
    out
}

type CounterRow = (&'static str, &'static str, fn(&ShardMetrics) -> &AtomicU64);
type HistRow = (
    &'static str,
    &'static str,
    f64,
    fn(&ShardMetrics) -> &Histogram,
);

/// Counters per shard; the encoder appends `_total` to each name.
const COUNTERS: &[CounterRow] = &[
    ("ringlog_appends", "Batches appended", |m| &m.appends_total),
    ("ringlog_append_bytes", "Bytes appended", |m| {
        &m.append_bytes_total
    }),
    ("ringlog_append_errors", "Appends rejected or failed", |m| {
        &m.append_errors_total
    }),
    (
        "ringlog_fsyncs",
        "Group commits (one fdatasync per touched partition)",
        |m| &m.fsyncs_total,
    ),
    ("ringlog_fetches", "Fetches served", |m| &m.fetches_total),
    ("ringlog_fetch_bytes", "Bytes fetched", |m| {
        &m.fetch_bytes_total
    }),
    (
        "ringlog_forwards",
        "Requests forwarded to another shard",
        |m| &m.forwards_total,
    ),
    (
        "ringlog_backpressure",
        "Requests refused with Backpressure",
        |m| &m.backpressure_total,
    ),
    ("ringlog_connections", "Client connections accepted", |m| {
        &m.connections_total
    }),
    (
        "ringlog_connections_refused",
        "Client connections refused (connections_per_shard_max)",
        |m| &m.connections_refused_total,
    ),
    ("ringlog_bad_frames", "Client frames rejected", |m| {
        &m.bad_frames_total
    }),
    (
        "ringlog_parked",
        "Requests held until their partition's flush in flight completed",
        |m| &m.parked_total,
    ),
    (
        "ringlog_idle_timeouts",
        "Client connections closed after idle_timeout_ms without a request",
        |m| &m.idle_timeouts_total,
    ),
    (
        "ringlog_header_timeouts",
        "Client connections closed because a started frame stalled (header_timeout_ms)",
        |m| &m.header_timeouts_total,
    ),
    (
        "ringlog_over_budget",
        "Requests refused with Backpressure over shard_request_bytes_max",
        |m| &m.over_budget_total,
    ),
    (
        "ringlog_peer_messages",
        "Replication messages stepped by the shard's replicas",
        |m| &m.peer_messages_total,
    ),
    (
        "ringlog_peer_drops",
        "Replication messages dropped (undecodable, wrong group or sender, unknown partition, full mailbox)",
        |m| &m.peer_drops_total,
    ),
    (
        "ringlog_write_timeouts",
        "Client connections closed because a reply took no bytes for header_timeout_ms",
        |m| &m.write_timeouts_total,
    ),
    (
        "ringlog_read_cache_hits",
        "Fetches served from the read cache, without device reads",
        |m| &m.read_cache_hits_total,
    ),
    (
        "ringlog_read_cache_misses",
        "Fetches read from the device (not all in the read cache)",
        |m| &m.read_cache_misses_total,
    ),
    (
        "ringlog_read_cache_served_bytes",
        "Bytes fetches got from the read cache",
        |m| &m.read_cache_served_bytes_total,
    ),
    (
        "ringlog_read_ahead_issued",
        "Device reads queued ahead of the next sequential fetch while a reply was sent",
        |m| &m.read_ahead_issued_total,
    ),
    (
        "ringlog_read_ahead_hits",
        "Fetches whose device read a read-ahead had already made",
        |m| &m.read_ahead_hits_total,
    ),
    (
        "ringlog_read_ahead_wasted",
        "Read-aheads no fetch used (another offset came, or purge, truncation, retention dropped them)",
        |m| &m.read_ahead_wasted_total,
    ),
    (
        "ringlog_read_ahead_refused",
        "Read-aheads not queued because the shard's read_ahead_bytes were in use",
        |m| &m.read_ahead_refused_total,
    ),
    (
        "ringlog_read_ahead_errors",
        "Read-aheads that failed (the fetch read the device itself)",
        |m| &m.read_ahead_errors_total,
    ),
    (
        "ringlog_transfer_installs",
        "State transfer installs committed (the replica rebooted on the installed log)",
        |m| &m.transfer_installs_total,
    ),
    (
        "ringlog_transfer_attempts_failed",
        "State transfer attempts that ended without an install",
        |m| &m.transfer_attempts_failed_total,
    ),
    (
        "ringlog_transfer_rotations",
        "State transfer peer rotations (stalled or refusing peer)",
        |m| &m.transfer_rotations_total,
    ),
    (
        "ringlog_transfer_refusals",
        "State transfer offers refused as stale or oversized",
        |m| &m.transfer_refusals_total,
    ),
    (
        "ringlog_transfer_charges",
        "Faults charged to a transfer peer (garbage, unrequested or undecodable frames)",
        |m| &m.transfer_charges_total,
    ),
    (
        "ringlog_transfer_quarantines",
        "Transfer peers quarantined after too many charges",
        |m| &m.transfer_quarantines_total,
    ),
    (
        "ringlog_transfer_bytes_received",
        "Chunk bytes a receiving transfer accepted",
        |m| &m.transfer_bytes_received_total,
    ),
    (
        "ringlog_transfer_chunks_received",
        "Chunks a receiving transfer accepted",
        |m| &m.transfer_chunks_received_total,
    ),
    (
        "ringlog_transfer_bytes_served",
        "Chunk bytes served to transferring peers",
        |m| &m.transfer_bytes_served_total,
    ),
    (
        "ringlog_transfer_chunks_served",
        "Chunks served to transferring peers",
        |m| &m.transfer_chunks_served_total,
    ),
    (
        "ringlog_transfer_ops_refused",
        "Transfer storage ops refused because the partition's op queue was full",
        |m| &m.transfer_ops_refused_total,
    ),
    (
        "ringlog_transfer_installs_deferred",
        "State transfer installs that could not begin yet (the shard's install limit or budget); retried",
        |m| &m.transfer_installs_deferred_total,
    ),
    (
        "ringlog_reply_buffers_allocated",
        "Fetch reply buffers allocated because none was idle in the reply pool",
        |m| &m.reply_buffers_allocated_total,
    ),
    (
        "ringlog_reply_buffers_dropped",
        "Sent fetch reply buffers not kept (reply pool full or buffer over its size bound)",
        |m| &m.reply_buffers_dropped_total,
    ),
    (
        "ringlog_produce_buffers_lent",
        "Produce batches read straight into a buffer lent by the store pool (written without a copy when the lead was right)",
        |m| &m.produce_buffers_lent_total,
    ),
    (
        "ringlog_produce_buffers_refused",
        "Produce batches read into a heap buffer because the store pool's lending bound was reached",
        |m| &m.produce_buffers_refused_total,
    ),
];

/// Histograms per shard: name, help, recorded units per exported unit,
/// the histogram.
const HISTOGRAMS: &[HistRow] = &[
    (
        "ringlog_produce_duration_seconds",
        "Produce requests, from read to reply ready (durable or failed), seconds",
        1e6,
        |m| &m.produce_latency_us,
    ),
    (
        "ringlog_fetch_duration_seconds",
        "Fetch requests, from read to reply ready (a long-poll wait included), seconds",
        1e6,
        |m| &m.fetch_latency_us,
    ),
    (
        "ringlog_fsync_duration_seconds",
        "Group commit write+fdatasync latency, seconds",
        1e6,
        |m| &m.fsync_latency_us,
    ),
    (
        "ringlog_group_commit_appends",
        "Appends made durable per group commit",
        1.0,
        |m| &m.group_commit_appends,
    ),
];

type Enc<'a> = DescriptorEncoder<'a>;
type EncResult = Result<(), std::fmt::Error>;

fn gauge<L: EncodeLabelSet, V: prometheus_client::encoding::EncodeGaugeValue>(
    enc: &mut Enc<'_>,
    name: &str,
    help: &str,
    series: impl IntoIterator<Item = (L, V)>,
) -> EncResult {
    let mut family = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, value) in series {
        family.encode_family(&labels)?.encode_gauge(&value)?;
    }
    Ok(())
}

/// A series without labels (the encoder writes no `{}` for it).
const NO_LABELS: [(&str, &str); 0] = [];

fn shard_label(i: usize) -> [(&'static str, String); 1] {
    [("shard", i.to_string())]
}

impl Scrape {
    fn encode_shards(&self, enc: &mut Enc<'_>) -> EncResult {
        for (name, help, get) in COUNTERS {
            let mut family = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (i, (m, _)) in self.shards.iter().enumerate() {
                let v = get(m).load(Ordering::Relaxed);
                family
                    .encode_family(&shard_label(i))?
                    .encode_counter::<NoLabelSet, _, u64>(&v, None)?;
            }
        }
        let mut family = enc.encode_descriptor(
            "ringlog_transfer_started",
            "State transfers a replica started, by why it could not repair (trigger)",
            None,
            MetricType::Counter,
        )?;
        for (i, (m, _)) in self.shards.iter().enumerate() {
            for (trigger, n) in TRANSFER_TRIGGERS.iter().zip(&m.transfer_started_total) {
                let labels = [("shard", i.to_string()), ("trigger", trigger.to_string())];
                family
                    .encode_family(&labels)?
                    .encode_counter::<NoLabelSet, _, u64>(&n.load(Ordering::Relaxed), None)?;
            }
        }
        let mut family = enc.encode_descriptor(
            "ringlog_mailbox_rejections",
            "Sends refused because the mailbox was full",
            None,
            MetricType::Counter,
        )?;
        for (i, (_, mb)) in self.shards.iter().enumerate() {
            family
                .encode_family(&shard_label(i))?
                .encode_counter::<NoLabelSet, _, u64>(&mb.rejected, None)?;
        }
        let each = |f: fn(&ShardMetrics, &MailboxFigures) -> u64| {
            self.shards
                .iter()
                .enumerate()
                .map(move |(i, (m, mb))| (shard_label(i), f(m, mb)))
        };
        gauge(
            enc,
            "ringlog_connections_open",
            "Open client connections",
            each(|m, _| m.connections_open.load(Ordering::Relaxed)),
        )?;
        gauge(
            enc,
            "ringlog_mailbox_depth",
            "Requests waiting in the shard mailbox",
            each(|_, mb| mb.depth),
        )?;
        gauge(
            enc,
            "ringlog_mailbox_capacity",
            "Shard mailbox capacity (mailbox_capacity)",
            each(|_, mb| mb.capacity),
        )?;
        gauge(
            enc,
            "ringlog_read_cache_bytes",
            "Memory the read cache holds (at most read_cache_bytes)",
            each(|m, _| m.read_cache_bytes.load(Ordering::Relaxed)),
        )?;
        for (name, help, divisor, get) in HISTOGRAMS {
            let mut family = enc.encode_descriptor(name, help, None, MetricType::Histogram)?;
            for (i, (m, _)) in self.shards.iter().enumerate() {
                let (buckets, sum, count) = get(m).snapshot(*divisor);
                family
                    .encode_family(&shard_label(i))?
                    .encode_histogram::<NoLabelSet>(sum, count, &buckets, None)?;
            }
        }
        Ok(())
    }

    /// Per replicated partition: its ops' latency from the client append
    /// on the primary to their commit, in seconds like the others.
    fn encode_commit_latency(&self, enc: &mut Enc<'_>) -> EncResult {
        let mut family = enc.encode_descriptor(
            "ringlog_partition_prepare_commit_duration_seconds",
            "Replicated ops this node acknowledged as primary, from the client append (its Prepare) to its commit, seconds",
            None,
            MetricType::Histogram,
        )?;
        for p in &self.partitions {
            let Some(c) = &p.commit_latency else { continue };
            debug_assert_eq!(c.bucket_counts.len(), REQUEST_US_BOUNDS.len() + 1);
            let buckets: Vec<(f64, u64)> = c
                .bucket_counts
                .iter()
                .enumerate()
                .map(|(i, &n)| {
                    let bound = REQUEST_US_BOUNDS
                        .get(i)
                        .map_or(f64::INFINITY, |&b| b as f64 / 1e6);
                    (bound, n)
                })
                .collect();
            let labels = [
                ("topic", p.topic.clone()),
                ("partition", p.partition.to_string()),
            ];
            family
                .encode_family(&labels)?
                .encode_histogram::<NoLabelSet>(c.sum_us as f64 / 1e6, c.count(), &buckets, None)?;
        }
        Ok(())
    }

    fn encode_partitions(&self, enc: &mut Enc<'_>) -> EncResult {
        type Row = (&'static str, &'static str, fn(&PartitionFigures) -> u64);
        let rows: &[Row] = &[
            (
                "ringlog_partition_size_bytes",
                "Bytes the partition's segments hold",
                |p| p.size_bytes,
            ),
            (
                "ringlog_partition_log_start_offset",
                "First offset still in the partition (after retention and purge)",
                |p| p.log_start_offset,
            ),
            (
                "ringlog_partition_frontier_offset",
                "Accepted end of the partition's log (next offset to assign)",
                |p| p.frontier,
            ),
            (
                "ringlog_partition_commit_offset",
                "Durable end of the partition's log (what fetches can read)",
                |p| p.commit,
            ),
            (
                "ringlog_partition_faulted",
                "1 if the partition is stopped by a fault (see ctl partitions), else 0",
                |p| u64::from(p.faulted),
            ),
        ];
        type Counted = (
            &'static str,
            &'static str,
            fn(&PartitionFigures) -> Option<u64>,
        );
        let counted: &[Counted] = &[
            (
                "ringlog_partition_view_changes",
                "View changes the partition's replica entered since it opened here",
                |p| p.view_changes,
            ),
            (
                "ringlog_partition_repair_requests",
                "Repair requests (RequestPrepares) the partition's replica sent since it opened here",
                |p| p.repairs,
            ),
        ];
        for (name, help, get) in counted {
            let mut family = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
            for p in &self.partitions {
                let Some(v) = get(p) else { continue };
                let labels = [
                    ("topic", p.topic.clone()),
                    ("partition", p.partition.to_string()),
                ];
                family
                    .encode_family(&labels)?
                    .encode_counter::<NoLabelSet, _, u64>(&v, None)?;
            }
        }
        self.encode_commit_latency(enc)?;
        for (name, help, get) in rows {
            let series = self.partitions.iter().map(|p| {
                let labels = [
                    ("topic", p.topic.clone()),
                    ("partition", p.partition.to_string()),
                ];
                (labels, get(p))
            });
            gauge(enc, name, help, series)?;
        }
        Ok(())
    }

    fn encode_consumers(&self, enc: &mut Enc<'_>) -> EncResult {
        type Row = (&'static str, &'static str, fn(&ConsumerLag) -> u64);
        let rows: &[Row] = &[
            (
                "ringlog_consumer_lag",
                "Records from a consumer group's committed offset to the partition's durable end",
                |c| c.lag,
            ),
            (
                "ringlog_consumer_committed_offset",
                "Next offset a consumer group will read (its last commit)",
                |c| c.committed,
            ),
        ];
        for (name, help, get) in rows {
            let series = self.consumers.iter().map(|c| {
                let labels = [
                    ("group", c.group.clone()),
                    ("topic", c.topic.clone()),
                    ("partition", c.partition.to_string()),
                ];
                (labels, get(c))
            });
            gauge(enc, name, help, series)?;
        }
        Ok(())
    }
}

impl Collector for Scrape {
    fn encode(&self, mut enc: DescriptorEncoder) -> EncResult {
        gauge(
            &mut enc,
            "ringlog_build_info",
            "The running ringlog build (value 1)",
            [([("version", env!("CARGO_PKG_VERSION"))], 1u64)],
        )?;
        gauge(
            &mut enc,
            "ringlog_uptime_seconds",
            "Seconds since the server started",
            [(NO_LABELS, self.uptime_s)],
        )?;
        gauge(
            &mut enc,
            "ringlog_scrape_shards_unanswered",
            "Shards whose partitions are missing from this scrape (no answer in time)",
            [(NO_LABELS, self.shards_unanswered)],
        )?;
        encode_process(&mut enc, &process::read())?;
        self.encode_shards(&mut enc)?;
        self.encode_partitions(&mut enc)?;
        self.encode_consumers(&mut enc)
    }
}

/// The standard `process_*` families; a figure /proc did not give is left
/// out rather than reported as 0.
fn encode_process(enc: &mut Enc<'_>, p: &process::Figures) -> EncResult {
    if let Some(v) = p.cpu_seconds {
        let mut family = enc.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds",
            None,
            MetricType::Counter,
        )?;
        family.encode_counter::<NoLabelSet, _, u64>(&v, None)?;
    }
    let gauges: [(&str, &str, Option<u64>); 4] = [
        (
            "process_resident_memory_bytes",
            "Resident memory size in bytes",
            p.resident_bytes,
        ),
        (
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes",
            p.virtual_bytes,
        ),
        (
            "process_open_fds",
            "Number of open file descriptors",
            p.open_fds,
        ),
        (
            "process_max_fds",
            "Maximum number of open file descriptors (soft limit)",
            p.max_fds,
        ),
    ];
    for (name, help, value) in gauges {
        if let Some(v) = value {
            gauge(enc, name, help, [(NO_LABELS, v)])?;
        }
    }
    if let Some(v) = p.start_time_seconds {
        gauge(
            enc,
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds",
            [(NO_LABELS, v)],
        )?;
    }
    Ok(())
}

/// This process's figures from /proc (Linux).
mod process {
    #[derive(Debug, Default)]
    pub(super) struct Figures {
        pub cpu_seconds: Option<f64>,
        pub resident_bytes: Option<u64>,
        pub virtual_bytes: Option<u64>,
        pub open_fds: Option<u64>,
        pub max_fds: Option<u64>,
        pub start_time_seconds: Option<f64>,
    }

    /// Fields of /proc/self/stat after the `(comm)` field, which may hold
    /// spaces and parentheses: the text after the last `)`.
    pub(super) struct Stat {
        pub utime_ticks: u64,
        pub stime_ticks: u64,
        pub start_ticks: u64,
        pub vsize_bytes: u64,
        pub rss_pages: u64,
    }

    pub(super) fn parse_stat(text: &str) -> Option<Stat> {
        let rest = &text[text.rfind(')')? + 1..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        // f[0] is field 3 (state) of proc(5): field n is f[n - 3].
        let num = |n: usize| f.get(n - 3)?.parse::<u64>().ok();
        Some(Stat {
            utime_ticks: num(14)?,
            stime_ticks: num(15)?,
            start_ticks: num(22)?,
            vsize_bytes: num(23)?,
            rss_pages: num(24)?,
        })
    }

    /// `btime` of /proc/stat: boot time, seconds since the epoch.
    pub(super) fn parse_boot_time(text: &str) -> Option<u64> {
        text.lines()
            .find_map(|l| l.strip_prefix("btime "))
            .and_then(|v| v.trim().parse().ok())
    }

    fn sysconf(name: libc::c_int) -> Option<u64> {
        // SAFETY: sysconf only reads its argument.
        let v = unsafe { libc::sysconf(name) };
        (v > 0).then_some(v as u64)
    }

    fn max_fds() -> Option<u64> {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit only writes the struct passed.
        let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
        (rc == 0).then_some(limit.rlim_cur)
    }

    pub(super) fn read() -> Figures {
        let mut out = Figures {
            open_fds: std::fs::read_dir("/proc/self/fd")
                .ok()
                .map(|d| d.count() as u64),
            max_fds: max_fds(),
            ..Figures::default()
        };
        let stat = std::fs::read_to_string("/proc/self/stat")
            .ok()
            .and_then(|t| parse_stat(&t));
        let (Some(stat), Some(tick_hz)) = (stat, sysconf(libc::_SC_CLK_TCK)) else {
            return out;
        };
        let ticks = |t: u64| t as f64 / tick_hz as f64;
        out.cpu_seconds = Some(ticks(stat.utime_ticks + stat.stime_ticks));
        out.virtual_bytes = Some(stat.vsize_bytes);
        out.resident_bytes = sysconf(libc::_SC_PAGESIZE).map(|page| stat.rss_pages * page);
        out.start_time_seconds = std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|t| parse_boot_time(&t))
            .map(|boot| boot as f64 + ticks(stat.start_ticks));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scrape_of(m: ShardMetrics) -> String {
        render(Scrape {
            shards: vec![(
                Arc::new(m),
                MailboxFigures {
                    depth: 1,
                    capacity: 8,
                    rejected: 2,
                },
            )],
            partitions: vec![PartitionFigures {
                topic: "t\"x".into(),
                partition: 3,
                log_start_offset: 0,
                frontier: 9,
                commit: 7,
                size_bytes: 4096,
                faulted: false,
                view_changes: Some(2),
                repairs: Some(5),
                commit_latency: Some({
                    let mut c = crate::ops::LatencyCounts::default();
                    for us in [40, 300, 300, 20_000_000] {
                        c.record(us);
                    }
                    c
                }),
            }],
            shards_unanswered: 0,
            consumers: vec![ConsumerLag {
                group: "g\"1".into(),
                topic: "t".into(),
                partition: 3,
                committed: 5,
                lag: 2,
            }],
            uptime_s: 5,
        })
    }

    #[test]
    fn histograms_are_cumulative_and_in_seconds() {
        let m = ShardMetrics::default();
        for us in [40, 50, 51, 1_000, 20_000_000] {
            m.produce_latency_us.record(us);
        }
        let out = scrape_of(m);
        let p = "ringlog_produce_duration_seconds";
        for want in [
            format!("{p}_bucket{{shard=\"0\",le=\"5e-05\"}} 2"),
            format!("{p}_bucket{{shard=\"0\",le=\"0.001\"}} 4"),
            format!("{p}_bucket{{shard=\"0\",le=\"10\"}} 4"),
            format!("{p}_bucket{{shard=\"0\",le=\"+Inf\"}} 5"),
            format!("{p}_count{{shard=\"0\"}} 5"),
            format!("{p}_sum{{shard=\"0\"}} 20.001141"),
        ] {
            assert!(out.contains(&want), "no {want:?} in\n{out}");
        }
    }

    #[test]
    fn prepare_to_commit_latency_is_a_histogram_per_replicated_partition() {
        let out = scrape_of(ShardMetrics::default());
        let p = "ringlog_partition_prepare_commit_duration_seconds";
        let l = "topic=\"t\\\"x\",partition=\"3\"";
        for want in [
            format!("# TYPE {p} histogram\n"),
            format!("{p}_bucket{{{l},le=\"5e-05\"}} 1"),
            format!("{p}_bucket{{{l},le=\"0.0005\"}} 3"),
            format!("{p}_bucket{{{l},le=\"10\"}} 3"),
            format!("{p}_bucket{{{l},le=\"+Inf\"}} 4"),
            format!("{p}_count{{{l}}} 4"),
            format!("{p}_sum{{{l}}} 20.00064"),
        ] {
            assert!(out.contains(&want), "no {want:?} in\n{out}");
        }
    }

    #[test]
    fn counters_gauges_and_partitions_are_named_and_labelled() {
        let m = ShardMetrics::default();
        add(&m.append_bytes_total, 123);
        let mut totals = TransferTotals::default();
        totals.counters.started[2] = 3;
        set_transfers(&m, &totals);
        let out = scrape_of(m);
        for want in [
            "# TYPE ringlog_transfer_started_total counter\n",
            "ringlog_transfer_started_total{shard=\"0\",trigger=\"range_evicted\"} 0\n",
            "ringlog_transfer_started_total{shard=\"0\",trigger=\"new_or_wiped\"} 3\n",
            "# HELP ringlog_append_bytes_total Bytes appended\n# TYPE ringlog_append_bytes_total counter\nringlog_append_bytes_total{shard=\"0\"} 123\n",
            "ringlog_mailbox_rejections_total{shard=\"0\"} 2\n",
            "ringlog_mailbox_depth{shard=\"0\"} 1\n",
            "ringlog_uptime_seconds 5\n",
            // The label value is escaped.
            "ringlog_partition_commit_offset{topic=\"t\\\"x\",partition=\"3\"} 7\n",
            "ringlog_partition_frontier_offset{topic=\"t\\\"x\",partition=\"3\"} 9\n",
            "# TYPE ringlog_partition_view_changes_total counter\n",
            "ringlog_partition_view_changes_total{topic=\"t\\\"x\",partition=\"3\"} 2\n",
            "ringlog_partition_repair_requests_total{topic=\"t\\\"x\",partition=\"3\"} 5\n",
            "# TYPE ringlog_consumer_lag gauge\n",
            "ringlog_consumer_lag{group=\"g\\\"1\",topic=\"t\",partition=\"3\"} 2\n",
            "ringlog_consumer_committed_offset{group=\"g\\\"1\",topic=\"t\",partition=\"3\"} 5\n",
            "process_open_fds ",
            "process_resident_memory_bytes ",
        ] {
            assert!(out.contains(want), "no {want:?} in\n{out}");
        }
        let version = env!("CARGO_PKG_VERSION");
        assert!(
            out.contains(&format!("ringlog_build_info{{version=\"{version}\"}} 1\n")),
            "{out}"
        );
        // Integer figures print as integers.
        let fds = out
            .lines()
            .find_map(|l| l.strip_prefix("process_open_fds "))
            .expect("process_open_fds");
        assert!(fds.parse::<u64>().is_ok(), "{fds}");
        // One TYPE per family, none with a doubled suffix.
        let types: Vec<&str> = out.lines().filter(|l| l.starts_with("# TYPE")).collect();
        let unique: std::collections::BTreeSet<_> = types.iter().collect();
        assert_eq!(types.len(), unique.len(), "{out}");
        assert!(!out.contains("_total_total"), "{out}");
    }

    #[test]
    fn proc_stat_fields_are_found_after_a_tricky_command_name() {
        // comm holds a space and a ')': fields are counted after the last ')'.
        let line = "4242 (ring log) x) S 1 4242 4242 0 -1 4194560 100 0 0 0 \
                    250 50 0 0 20 0 9 0 123456 987654321 2048 18446744073709551615";
        let s = process::parse_stat(line).expect("parses");
        assert_eq!((s.utime_ticks, s.stime_ticks), (250, 50));
        assert_eq!(s.start_ticks, 123456);
        assert_eq!(s.vsize_bytes, 987654321);
        assert_eq!(s.rss_pages, 2048);
        assert!(process::parse_stat("4242 (truncated").is_none());
        assert_eq!(
            process::parse_boot_time("cpu 1 2\nbtime 1700000000\nprocesses 5\n"),
            Some(1_700_000_000)
        );
        assert_eq!(process::parse_boot_time("cpu 1 2\n"), None);
    }
}
