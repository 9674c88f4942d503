//! The produce job: `connections` threads, each with one blocking client,
//! send produce requests of one prebuilt batch to a running server,
//! `in_flight` requests in flight per connection (pipelined: the next is
//! sent before the oldest is acknowledged; acks come back in request
//! order). A produce's ack latency is the time from sending the request to
//! the reply, which the server sends only once the batch is durable (after
//! the fdatasync covering it).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ringlog_protocol::wire::ErrorCode;
use ringlog_shard::client::{Client, ClientError};

use crate::jobs::append::{build_batch, AppendError};
use crate::stats::{CpuMeter, LatencyRecorder, RunSummary, Timeline};

/// How long one produce may keep being refused with retryable errors
/// (backpressure) before the run fails.
pub const RETRY_FOR: Duration = Duration::from_secs(30);

/// Pause between retries of a refused produce.
pub const RETRY_BACKOFF: Duration = Duration::from_millis(1);

#[derive(Debug, thiserror::Error)]
pub enum ClientJobError {
    #[error("connection {conn}: {what}: {source}")]
    Client {
        conn: u32,
        what: String,
        #[source]
        source: ClientError,
    },
    #[error(transparent)]
    Batch(#[from] AppendError),
    #[error("connection {conn}: {what}")]
    Check { conn: u32, what: String },
}

fn client_err(conn: u32, what: impl Into<String>) -> impl FnOnce(ClientError) -> ClientJobError {
    move |source| ClientJobError::Client {
        conn,
        what: what.into(),
        source,
    }
}

#[derive(Debug, Clone)]
pub struct ProduceConfig {
    /// `host:port` of the server.
    pub addr: String,
    pub topic: String,
    /// Partitions of the topic, spread over the connections.
    pub partitions: u32,
    /// Client connections, one thread each.
    pub connections: u32,
    /// Produce requests each connection keeps in flight (at least 1).
    pub in_flight: u32,
    /// Encoded bytes of each batch, header included.
    pub batch_size: usize,
    /// Value bytes of each record.
    pub record_size: usize,
    /// Stop after this long...
    pub duration: Duration,
    /// ...or after this many batch bytes over all connections, if set.
    pub total_bytes: Option<u64>,
}

/// The result of one run.
#[derive(Debug, Clone)]
pub struct ProduceResult {
    /// bytes/ios (produce requests)/runtime over all connections; lat is the
    /// per-request ack latency.
    pub summary: RunSummary,
    /// Records acknowledged (offsets the server assigned).
    pub records: u64,
    pub records_per_batch: u32,
    /// Retryable refusals (backpressure) that were retried.
    pub retries: u64,
}

/// The partitions connection `conn` works on: every `connections`-th one
/// starting at `conn`, or one shared partition when there are fewer
/// partitions than connections.
pub fn partitions_of(conn: u32, connections: u32, partitions: u32) -> Vec<u32> {
    if partitions >= connections {
        (conn..partitions).step_by(connections as usize).collect()
    } else {
        vec![conn % partitions]
    }
}

/// Creates `topic` with `partitions` partitions.
pub fn create_topic(addr: &str, topic: &str, partitions: u32) -> Result<(), ClientJobError> {
    let mut c = Client::connect(addr).map_err(client_err(0, format!("connecting to {addr}")))?;
    c.create_topic(topic, partitions)
        .map_err(client_err(0, format!("creating topic {topic:?}")))
}

/// Whether the node at `addr` lists `topic`.
pub fn topic_listed(addr: &str, topic: &str) -> Result<bool, ClientJobError> {
    let mut c = Client::connect(addr).map_err(client_err(0, format!("connecting to {addr}")))?;
    let topics = c
        .list_topics()
        .map_err(client_err(0, format!("listing topics at {addr}")))?;
    Ok(topics.iter().any(|t| t.topic == topic))
}

/// Deletes `topic`; a topic that is already gone is fine.
pub fn delete_topic(addr: &str, topic: &str) -> Result<(), ClientJobError> {
    let mut c = Client::connect(addr).map_err(client_err(0, format!("connecting to {addr}")))?;
    match c.delete_topic(topic) {
        Err(e) if e.code() == Some(ErrorCode::UnknownTopic) => Ok(()),
        other => other.map_err(client_err(0, format!("deleting topic {topic:?}"))),
    }
}

/// Per-thread tallies.
struct Tally {
    lat: LatencyRecorder,
    /// Bytes acked per second since this thread's start.
    timeline: Timeline,
    bytes: u64,
    produces: u64,
    records: u64,
    retries: u64,
}

/// Produces into `cfg.topic` (which must exist with `cfg.partitions`
/// partitions) until the duration or the byte budget runs out.
pub fn run(cfg: &ProduceConfig) -> Result<ProduceResult, ClientJobError> {
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    // The server assigns partition id, offsets and chain; the stamp is ours
    // to leave empty.
    let (batch, records_per_batch) = build_batch(0, cfg.batch_size, cfg.record_size, now_ms)?;
    let batch_bytes = batch.len() as u64;

    let clients = (0..cfg.connections)
        .map(|conn| {
            Client::connect(&cfg.addr)
                .map_err(client_err(conn, format!("connecting to {}", cfg.addr)))
        })
        .collect::<Result<Vec<_>, _>>()?;

    let barrier = Barrier::new(cfg.connections as usize + 1);
    let reserved = AtomicU64::new(0);
    let failed = AtomicBool::new(false);
    let (tallies, runtime, cpu) = std::thread::scope(|s| {
        let handles: Vec<_> = clients
            .into_iter()
            .zip(0..)
            .map(|(client, conn)| {
                let (barrier, reserved, failed, batch) = (&barrier, &reserved, &failed, &batch);
                s.spawn(move || {
                    let targets = partitions_of(conn, cfg.connections, cfg.partitions);
                    barrier.wait();
                    let r = produce_loop(cfg, conn, client, &targets, batch, reserved, failed);
                    if r.is_err() {
                        failed.store(true, Ordering::Relaxed);
                    }
                    r
                })
            })
            .collect();
        barrier.wait();
        let cpu = CpuMeter::start();
        let start = Instant::now();
        let tallies: Vec<_> = handles
            .into_iter()
            .map(|h| h.join().expect("producer threads do not panic"))
            .collect();
        (tallies, start.elapsed(), cpu.usage())
    });

    let mut lat = LatencyRecorder::new();
    let mut timeline: Option<Timeline> = None;
    let (mut bytes, mut produces, mut records, mut retries) = (0, 0, 0, 0);
    for t in tallies {
        let t = t?;
        lat.merge(&t.lat);
        match &mut timeline {
            Some(all) => all.merge(&t.timeline),
            None => timeline = Some(t.timeline),
        }
        bytes += t.bytes;
        produces += t.produces;
        records += t.records;
        retries += t.retries;
    }
    debug_assert_eq!(bytes, produces * batch_bytes);
    Ok(ProduceResult {
        summary: {
            let s = RunSummary::from_counts(bytes, produces, runtime, lat.summary()).with_cpu(cpu);
            match timeline {
                Some(t) => s.with_timeline(t),
                None => s,
            }
        },
        records,
        records_per_batch,
        retries,
    })
}

/// A produce sent and not yet acknowledged: where to, when first sent.
struct Sent {
    partition: u32,
    first_sent: Instant,
}

fn produce_loop(
    cfg: &ProduceConfig,
    conn: u32,
    mut client: Client,
    targets: &[u32],
    batch: &[u8],
    reserved: &AtomicU64,
    failed: &AtomicBool,
) -> Result<Tally, ClientJobError> {
    assert!(cfg.in_flight >= 1, "at least one request in flight");
    let start = Instant::now();
    let batch_bytes = batch.len() as u64;
    let mut t = Tally {
        lat: LatencyRecorder::new(),
        timeline: Timeline::starting(start),
        bytes: 0,
        produces: 0,
        records: 0,
        retries: 0,
    };
    let mut next_target = targets.iter().copied().cycle();
    // Bound: `cfg.in_flight` entries, one per request the server owes.
    let mut sent: VecDeque<Sent> = VecDeque::with_capacity(cfg.in_flight as usize);
    let mut sending = true;
    loop {
        while sending && sent.len() < cfg.in_flight as usize {
            let over = start.elapsed() >= cfg.duration
                || failed.load(Ordering::Relaxed)
                || cfg.total_bytes.is_some_and(|total| {
                    reserved.fetch_add(batch_bytes, Ordering::Relaxed) >= total
                });
            let Some(partition) = next_target.next().filter(|_| !over) else {
                sending = false;
                break;
            };
            // Before the send: writing 1 MiB blocks until the server read
            // most of it, and that is part of the ack latency.
            let first_sent = Instant::now();
            send(cfg, conn, &mut client, partition, batch)?;
            sent.push_back(Sent {
                partition,
                first_sent,
            });
        }
        let Some(oldest) = sent.pop_front() else {
            break;
        };
        let partition = oldest.partition;
        let ack = match client.recv_produced() {
            Ok(ack) => ack,
            // Refused (backpressure): sent again, behind the others in
            // flight; its latency counts from the first send.
            Err(e) if e.is_retryable() && oldest.first_sent.elapsed() < RETRY_FOR => {
                t.retries += 1;
                std::thread::sleep(RETRY_BACKOFF);
                send(cfg, conn, &mut client, partition, batch)?;
                sent.push_back(oldest);
                continue;
            }
            Err(e) => {
                return Err(client_err(
                    conn,
                    format!("producing to {}/{partition}", cfg.topic),
                )(e))
            }
        };
        let acked = Instant::now();
        t.lat.record(acked - oldest.first_sent);
        t.timeline.record(acked, batch_bytes);
        if ack.partition != partition || ack.next_offset <= ack.base_offset {
            return Err(ClientJobError::Check {
                conn,
                what: format!("bad ack for {}/{partition}: {ack:?}", cfg.topic),
            });
        }
        t.bytes += batch_bytes;
        t.produces += 1;
        t.records += ack.next_offset - ack.base_offset;
    }
    Ok(t)
}

fn send(
    cfg: &ProduceConfig,
    conn: u32,
    client: &mut Client,
    partition: u32,
    batch: &[u8],
) -> Result<(), ClientJobError> {
    // The client writes the batch from where it lies (no copy per send).
    client
        .send_produce(&cfg.topic, partition, batch)
        .map(drop)
        .map_err(client_err(
            conn,
            format!("producing to {}/{partition}", cfg.topic),
        ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_are_spread_over_connections() {
        assert_eq!(partitions_of(0, 2, 2), vec![0]);
        assert_eq!(partitions_of(1, 2, 2), vec![1]);
        assert_eq!(partitions_of(0, 2, 5), vec![0, 2, 4]);
        assert_eq!(partitions_of(1, 2, 5), vec![1, 3]);
        assert_eq!(partitions_of(2, 3, 1), vec![0]);
        assert_eq!(partitions_of(3, 4, 2), vec![1]);
    }
}
