//! `ringlog produce` and `ringlog consume`.

use std::io::{BufRead, Write};
use std::time::Duration;

use clap::Args;
use ringlog_protocol::{BatchBuilder, Record, Stamp};
use ringlog_shard::client::{records, with_retry, Client, ClientError};

/// Records per produced batch at most.
const BATCH_RECORDS_MAX: usize = 1000;
/// Retries of a produce refused with a retryable error (backpressure).
const PRODUCE_ATTEMPTS: u32 = 100;

#[derive(Args)]
pub struct ProduceArgs {
    topic: String,
    /// Server address [default: $RINGLOG_ADDR or 127.0.0.1:7420].
    #[arg(long)]
    addr: Option<String>,
    /// Partition to append to.
    #[arg(long, default_value_t = 0, conflicts_with = "key")]
    partition: u32,
    /// Route by key hash instead of --partition (also stored as record key).
    #[arg(long)]
    key: Option<String>,
    /// Generate this many records instead of reading stdin.
    #[arg(long)]
    count: Option<u64>,
    /// Size of generated records in bytes.
    #[arg(long, default_value_t = 100)]
    size: usize,
    /// Records per batch.
    #[arg(long, default_value_t = 100)]
    batch: usize,
    /// Create the topic with this many partitions if it does not exist.
    #[arg(long)]
    create: Option<u32>,
}

#[derive(Args)]
pub struct ConsumeArgs {
    topic: String,
    /// Server address [default: $RINGLOG_ADDR or 127.0.0.1:7420].
    #[arg(long)]
    addr: Option<String>,
    #[arg(long, default_value_t = 0)]
    partition: u32,
    /// First offset to read.
    #[arg(long, default_value_t = 0)]
    from: u64,
    /// Keep waiting for new records.
    #[arg(long)]
    follow: bool,
    /// Print offsets before values.
    #[arg(long)]
    offsets: bool,
    /// Bytes per fetch.
    #[arg(long, default_value_t = 1 << 20)]
    max_bytes: u32,
}

fn addr(a: &Option<String>) -> String {
    a.clone()
        .or_else(|| std::env::var("RINGLOG_ADDR").ok())
        .unwrap_or_else(|| "127.0.0.1:7420".into())
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

pub fn produce(args: ProduceArgs) -> i32 {
    match produce_inner(&args) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("ringlog produce: {e}");
            if let Some(advice) = e.advice() {
                eprintln!("ringlog produce: {advice}");
            }
            1
        }
    }
}

fn produce_inner(args: &ProduceArgs) -> Result<(), ClientError> {
    let mut client = Client::connect(addr(&args.addr))?;
    if let Some(p) = args.create {
        match client.create_topic(&args.topic, p) {
            Ok(()) => {}
            Err(e) if e.code() == Some(ringlog_protocol::wire::ErrorCode::TopicExists) => {}
            Err(e) => return Err(e),
        }
    }
    let per_batch = args.batch.clamp(1, BATCH_RECORDS_MAX);
    let batch_bytes_max = (client.server().batch_bytes_max as usize).max(4096);
    let key = args.key.as_deref().unwrap_or("").as_bytes().to_vec();
    let mut pending: Vec<Vec<u8>> = Vec::new();
    let mut pending_bytes = 0usize;
    let mut total = 0u64;
    let mut first: Option<u64> = None;
    let mut last = 0u64;
    let mut send = |values: &mut Vec<Vec<u8>>, client: &mut Client| -> Result<(), ClientError> {
        if values.is_empty() {
            return Ok(());
        }
        let ts = now_ms();
        let mut b = BatchBuilder::new(0);
        for v in values.iter() {
            b.push(&Record {
                key: &key,
                headers: &[],
                value: v,
                timestamp_ms: ts,
            })?;
        }
        let batch = b.finish(&Stamp::default())?;
        let ack = with_retry(PRODUCE_ATTEMPTS, Duration::from_millis(20), || {
            if args.key.is_some() {
                client.produce_keyed(&args.topic, &key, batch.clone())
            } else {
                client.produce(&args.topic, args.partition, batch.clone())
            }
        })?;
        first.get_or_insert(ack.base_offset);
        last = ack.next_offset;
        total += values.len() as u64;
        values.clear();
        Ok(())
    };
    let overhead = 64 + key.len();
    match args.count {
        Some(count) => {
            for i in 0..count {
                let mut v = format!("{i:0width$}", width = args.size.min(20)).into_bytes();
                v.resize(args.size, b'x');
                pending_bytes += v.len() + overhead;
                pending.push(v);
                if pending.len() >= per_batch || pending_bytes * 2 > batch_bytes_max {
                    send(&mut pending, &mut client)?;
                    pending_bytes = 0;
                }
            }
        }
        None => {
            let stdin = std::io::stdin();
            for line in stdin.lock().lines() {
                let v = line?.into_bytes();
                pending_bytes += v.len() + overhead;
                pending.push(v);
                if pending.len() >= per_batch || pending_bytes * 2 > batch_bytes_max {
                    send(&mut pending, &mut client)?;
                    pending_bytes = 0;
                }
            }
        }
    }
    send(&mut pending, &mut client)?;
    match first {
        Some(f) => eprintln!(
            "produced {total} records to {} (offsets {f}..{last})",
            args.topic
        ),
        None => eprintln!("produced 0 records"),
    }
    Ok(())
}

pub fn consume(args: ConsumeArgs) -> i32 {
    match consume_inner(&args) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("ringlog consume: {e}");
            if let Some(advice) = e.advice() {
                eprintln!("ringlog consume: {advice}");
            }
            1
        }
    }
}

fn consume_inner(args: &ConsumeArgs) -> Result<(), ClientError> {
    let mut client = Client::connect(addr(&args.addr))?;
    let mut offset = args.from;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    loop {
        let wait_ms = if args.follow { 1000 } else { 0 };
        let page = client.fetch(&args.topic, args.partition, offset, args.max_bytes, wait_ms)?;
        for r in records(&page.batches)? {
            if r.offset < offset {
                continue;
            }
            if args.offsets {
                write!(out, "{}\t", r.offset)?;
            }
            out.write_all(&r.value)?;
            out.write_all(b"\n")?;
        }
        out.flush()?;
        offset = page.next_offset;
        if !args.follow && offset >= page.high_watermark {
            return Ok(());
        }
    }
}
