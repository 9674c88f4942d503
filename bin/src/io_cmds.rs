//! `ringlog produce` and `ringlog consume`, with kcat-like options.

use std::io::{BufRead, Write};
use std::time::Duration;

use clap::Args;
use ringlog_protocol::wire::ErrorCode;
use ringlog_protocol::{BatchBuilder, Record, Stamp};
use ringlog_shard::client::{
    records, with_retry, Client, ClientError, FetchedRecord, FollowingClient,
};
use serde_json::json;

use crate::groups::{self, Reset};

/// Records per produced batch at most.
const BATCH_RECORDS_MAX: usize = 1000;
/// Retries of a produce refused with a retryable error (backpressure).
const PRODUCE_ATTEMPTS: u32 = 100;
/// Bytes a batch's header and a record's framing may add to the payload
/// (generous: the real overhead is 96 bytes per batch and under 32 per record).
const BATCH_OVERHEAD_BYTES: usize = 4096;
const RECORD_OVERHEAD_BYTES: usize = 64;
/// Long-poll of a followed single partition.
const FOLLOW_WAIT_MS: u32 = 1000;
/// Pause between rounds over several followed partitions that all had
/// nothing (one blocking connection cannot long-poll all of them at once).
const FOLLOW_IDLE_SLEEP: Duration = Duration::from_millis(50);

#[derive(Args)]
pub struct ProduceArgs {
    topic: String,
    /// Server address [default: $RINGLOG_ADDR or 127.0.0.1:7420].
    #[arg(long)]
    addr: Option<String>,
    /// Partition to append to.
    #[arg(long, short, default_value_t = 0, conflicts_with = "key")]
    partition: u32,
    /// Route by key hash instead of --partition (also stored as record key);
    /// the partition it went to is printed.
    #[arg(long, short)]
    key: Option<String>,
    /// Header NAME=VALUE on every record (repeatable).
    #[arg(long = "header", short = 'H', value_name = "NAME=VALUE")]
    headers: Vec<String>,
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
    /// Print only the summary, not a line per batch.
    #[arg(long, short)]
    quiet: bool,
}

#[derive(Args)]
pub struct ConsumeArgs {
    topic: String,
    /// Server address [default: $RINGLOG_ADDR or 127.0.0.1:7420].
    #[arg(long)]
    addr: Option<String>,
    /// Read this partition only [default: every partition].
    #[arg(long, short)]
    partition: Option<u32>,
    /// Where to start in each partition: `beginning`, `end`, an offset N,
    /// `-N` (N before the end), or `@MS` (the first record with a timestamp
    /// at or after MS milliseconds since the epoch; the server has no
    /// timestamp index, so this scans from the start of the log). An offset
    /// past a partition's end starts at its end.
    #[arg(
        long = "offset",
        short = 'o',
        visible_alias = "from",
        default_value = "beginning",
        allow_hyphen_values = true
    )]
    start: String,
    /// Exit after this many records (over all partitions).
    #[arg(long, short)]
    count: Option<u64>,
    /// Keep waiting for new records at the end.
    #[arg(long)]
    follow: bool,
    /// Output format per record: %p partition, %o offset, %k key,
    /// %t timestamp (ms), %h headers (name=value,...), %v value, %% a %;
    /// `\n` and `\t` are newline and tab [default: "%v\n"].
    #[arg(long, short, conflicts_with = "json")]
    format: Option<String>,
    /// One JSON object per record (topic, partition, offset, timestamp_ms,
    /// key, headers, value; key and value as strings when UTF-8, else
    /// key_hex / value_hex).
    #[arg(long)]
    json: bool,
    /// Print offsets before values (same as -f '%o\t%v\n').
    #[arg(long, conflicts_with_all = ["format", "json"])]
    offsets: bool,
    /// Bytes per fetch.
    #[arg(long, default_value_t = 1 << 20)]
    max_bytes: u32,
    /// Consumer group: resume each partition from the group's committed
    /// offset (-o applies only where it has none) and commit the position
    /// on the server after every round of output.
    #[arg(long, short)]
    group: Option<String>,
    /// With --group: what a committed offset outside the stored range
    /// (purged, past the end) becomes.
    #[arg(long, value_enum, default_value_t = Reset::Earliest, requires = "group")]
    reset: Reset,
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

fn report(cmd: &str, e: &ClientError) {
    eprintln!("ringlog {cmd}: {e}");
    if let Some(advice) = e.advice() {
        eprintln!("ringlog {cmd}: {advice}");
    }
}

pub fn produce(args: ProduceArgs) -> i32 {
    let mut progress = Progress::default();
    let result = produce_inner(&args, &mut progress);
    progress.summary(&args.topic, result.is_err());
    match result {
        Ok(()) => 0,
        Err(e) => {
            report("produce", &e);
            1
        }
    }
}

/// What a produce got acknowledged so far, per partition.
#[derive(Default)]
struct Progress {
    records: u64,
    /// (partition, first offset, next offset) in order of first ack.
    ranges: Vec<(u32, u64, u64)>,
}

impl Progress {
    fn acked(&mut self, partition: u32, base: u64, next: u64) {
        self.records += next - base;
        match self.ranges.iter_mut().find(|r| r.0 == partition) {
            Some(r) => r.2 = next,
            None => self.ranges.push((partition, base, next)),
        }
    }

    fn summary(&self, topic: &str, failed: bool) {
        let parts: Vec<String> = self
            .ranges
            .iter()
            .map(|(p, a, b)| format!("{topic}/{p} offsets {a}..{}", b.saturating_sub(1)))
            .collect();
        let detail = if parts.is_empty() {
            String::new()
        } else {
            format!(" ({})", parts.join(", "))
        };
        if failed {
            eprintln!(
                "ringlog produce: {} records acknowledged{detail}; \
                 the rest were not acknowledged (not sent, or lost with the connection)",
                self.records
            );
        } else {
            eprintln!("produced {} records{detail}", self.records);
        }
    }
}

/// Record headers as `(name, value)` pairs.
type Headers = Vec<(Vec<u8>, Vec<u8>)>;

fn parse_headers(list: &[String]) -> Result<Headers, ClientError> {
    list.iter()
        .map(|h| {
            h.split_once('=')
                .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
                .ok_or_else(|| ClientError::Usage(format!("--header {h:?}: expected NAME=VALUE")))
        })
        .collect()
}

fn produce_inner(args: &ProduceArgs, progress: &mut Progress) -> Result<(), ClientError> {
    let headers = parse_headers(&args.headers)?;
    // A backup's not-primary refusal is followed to the primary it names.
    let mut client = FollowingClient::connect(&addr(&args.addr))?;
    if let Some(p) = args.create {
        match client.client().create_topic(&args.topic, p) {
            Ok(()) => {}
            Err(e) if e.code() == Some(ErrorCode::TopicExists) => {}
            Err(e) => return Err(e),
        }
    }
    let per_batch = args.batch.clamp(1, BATCH_RECORDS_MAX);
    // A record alone over this is still sent alone, and the client refuses
    // it against the server's exact limit before it goes out.
    let budget =
        (client.client().server().batch_bytes_max as usize).saturating_sub(BATCH_OVERHEAD_BYTES);
    let key = args.key.as_deref().unwrap_or("").as_bytes().to_vec();
    let header_bytes: usize = headers.iter().map(|(n, v)| n.len() + v.len() + 8).sum();
    let overhead = RECORD_OVERHEAD_BYTES + key.len() + header_bytes;
    let mut sender = Sender {
        args,
        client: &mut client,
        key: &key,
        headers: &headers,
        routed: false,
    };
    let mut pending: Vec<Vec<u8>> = Vec::new();
    let mut pending_bytes = 0usize;
    let mut add = |v: Vec<u8>, sender: &mut Sender| -> Result<(), ClientError> {
        let bytes = v.len() + overhead;
        if !pending.is_empty() && pending_bytes + bytes > budget {
            sender.send(&mut pending, progress)?;
            pending_bytes = 0;
        }
        pending_bytes += bytes;
        pending.push(v);
        if pending.len() >= per_batch {
            sender.send(&mut pending, progress)?;
            pending_bytes = 0;
        }
        Ok(())
    };
    match args.count {
        Some(count) => {
            for i in 0..count {
                let mut v = format!("{i:0width$}", width = args.size.min(20)).into_bytes();
                v.resize(args.size, b'x');
                add(v, &mut sender)?;
            }
        }
        None => {
            for line in std::io::stdin().lock().lines() {
                add(line?.into_bytes(), &mut sender)?;
            }
        }
    }
    sender.send(&mut pending, progress)
}

struct Sender<'a> {
    args: &'a ProduceArgs,
    client: &'a mut FollowingClient,
    key: &'a [u8],
    headers: &'a [(Vec<u8>, Vec<u8>)],
    /// Whether the key's partition was printed already.
    routed: bool,
}

impl Sender<'_> {
    fn send(
        &mut self,
        values: &mut Vec<Vec<u8>>,
        progress: &mut Progress,
    ) -> Result<(), ClientError> {
        if values.is_empty() {
            return Ok(());
        }
        let ts = now_ms();
        let headers: Vec<(&[u8], &[u8])> = self
            .headers
            .iter()
            .map(|(n, v)| (n.as_slice(), v.as_slice()))
            .collect();
        let mut b = BatchBuilder::new(0);
        for v in values.iter() {
            b.push(&Record {
                key: self.key,
                headers: &headers,
                value: v,
                timestamp_ms: ts,
            })?;
        }
        let batch = b.finish(&Stamp::default())?;
        let args = self.args;
        let client = &mut *self.client;
        let followed = with_retry(
            PRODUCE_ATTEMPTS,
            Duration::from_millis(20),
            || match &args.key {
                Some(k) => client.produce_keyed(&args.topic, k.as_bytes(), batch.clone()),
                None => client.produce(&args.topic, args.partition, batch.clone()),
            },
        )?;
        if followed.redirects > 0 {
            eprintln!(
                "not the primary: produced to the primary at {} ({} redirect(s))",
                followed.addr, followed.redirects
            );
        }
        let ack = followed.ack;
        if let (Some(k), false) = (&args.key, self.routed) {
            eprintln!("key {k:?} -> partition {}", ack.partition);
            self.routed = true;
        }
        if !args.quiet {
            eprintln!(
                "{}/{} offsets {}..{} ({} records)",
                args.topic,
                ack.partition,
                ack.base_offset,
                ack.next_offset.saturating_sub(1),
                values.len()
            );
        }
        progress.acked(ack.partition, ack.base_offset, ack.next_offset);
        values.clear();
        Ok(())
    }
}

pub fn consume(args: ConsumeArgs) -> i32 {
    let result = Start::parse(&args.start)
        .map_err(ClientError::Usage)
        .and_then(|start| consume_inner(&args, start));
    match result {
        Ok(()) => 0,
        // `consume | head`: the reader is gone, which is how it says stop.
        Err(ClientError::Io(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => 0,
        Err(e) => {
            report("consume", &e);
            1
        }
    }
}

/// Where consuming starts in each partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Start {
    Beginning,
    End,
    Offset(u64),
    FromEnd(u64),
    TimestampMs(u64),
}

impl Start {
    fn parse(s: &str) -> Result<Start, String> {
        let bad = || {
            format!(
                "--offset {s:?}: expected `beginning`, `end`, an offset N, `-N` (N before \
                 the end) or `@MS` (timestamp in ms since the epoch)"
            )
        };
        match s {
            "beginning" => Ok(Start::Beginning),
            "end" => Ok(Start::End),
            _ => {
                if let Some(n) = s.strip_prefix('-') {
                    n.parse().map(Start::FromEnd).map_err(|_| bad())
                } else if let Some(t) = s.strip_prefix('@') {
                    t.parse().map(Start::TimestampMs).map_err(|_| bad())
                } else {
                    s.parse().map(Start::Offset).map_err(|_| bad())
                }
            }
        }
    }

    /// The first offset to fetch, within the partition's current range.
    /// A timestamp starts at the log start; records before it are skipped.
    fn resolve(self, log_start: u64, end: u64) -> u64 {
        match self {
            Start::Beginning | Start::TimestampMs(_) => log_start,
            Start::End => end,
            Start::Offset(n) => n.clamp(log_start, end),
            Start::FromEnd(n) => end.saturating_sub(n).max(log_start),
        }
    }
}

/// One partition being read.
struct Cursor {
    partition: u32,
    /// Where the next fetch starts.
    offset: u64,
    /// The offset after the last record printed or skipped: what a group
    /// commits.
    position: u64,
    /// What the group has committed (commits only move it forward).
    committed: Option<u64>,
    /// Skip records older than this (a timestamp start) until the first
    /// at or after it; then every record is printed.
    skip_before_ms: Option<u64>,
    done: bool,
}

/// A cursor per partition read, at its start (or the group's position).
fn cursors(
    args: &ConsumeArgs,
    client: &mut Client,
    start: Start,
) -> Result<Vec<Cursor>, ClientError> {
    let desc = client.describe_topic(&args.topic)?;
    let committed = match &args.group {
        Some(g) => groups::load(client, Some(g))?,
        None => groups::Committed::new(),
    };
    let mut out = Vec::new();
    for p in &desc.partitions {
        if args.partition.is_some_and(|want| want != p.partition) {
            continue;
        }
        let group_key = (
            args.group.clone().unwrap_or_default(),
            args.topic.clone(),
            p.partition,
        );
        let (offset, skip_before_ms) = match committed.get(&group_key) {
            Some(&c) => {
                let what = format!("group {:?} on {}/{}", group_key.0, args.topic, p.partition);
                let at = args
                    .reset
                    .apply(c, p.log_start_offset, p.high_watermark, &what)?;
                (at, None)
            }
            None => (
                start.resolve(p.log_start_offset, p.high_watermark),
                match start {
                    Start::TimestampMs(t) => Some(t),
                    _ => None,
                },
            ),
        };
        out.push(Cursor {
            partition: p.partition,
            offset,
            position: offset,
            committed: committed.get(&group_key).copied(),
            skip_before_ms,
            done: false,
        });
    }
    if let (Some(want), true) = (args.partition, out.is_empty()) {
        // Not in the topic: the fetch gets the server's own refusal.
        out.push(Cursor {
            partition: want,
            offset: 0,
            position: 0,
            committed: None,
            skip_before_ms: None,
            done: false,
        });
    }
    Ok(out)
}

/// Commits the group's position where it moved (no-op without --group).
fn commit(
    args: &ConsumeArgs,
    client: &mut Client,
    cursors: &mut [Cursor],
) -> Result<(), ClientError> {
    let Some(group) = &args.group else {
        return Ok(());
    };
    let moved: Vec<(u32, u64)> = cursors
        .iter()
        .filter(|c| c.committed != Some(c.position))
        .map(|c| (c.partition, c.position))
        .collect();
    if moved.is_empty() {
        return Ok(());
    }
    groups::ensure_topic(client)?;
    groups::commit(client, group, &args.topic, &moved)?;
    for c in cursors.iter_mut() {
        c.committed = Some(c.position);
    }
    Ok(())
}

fn consume_inner(args: &ConsumeArgs, start: Start) -> Result<(), ClientError> {
    let mut client = Client::connect(addr(&args.addr))?;
    let mut cursors = cursors(args, &mut client, start)?;
    // Fetches follow a node's refusal for a partition placed elsewhere;
    // offsets are read and committed at the node named.
    let mut fetcher = FollowingClient::connect(&addr(&args.addr))?;
    let format = match (&args.format, args.offsets) {
        (Some(f), _) => f.clone(),
        (None, true) => "%o\t%v\n".into(),
        (None, false) => "%v\n".into(),
    };
    let mut printer = Printer {
        out: std::io::BufWriter::new(std::io::stdout().lock()),
        topic: &args.topic,
        format: &format,
        json: args.json,
        left: args.count,
    };
    let single = cursors.len() == 1;
    loop {
        let mut got = false;
        let mut full = false;
        for c in cursors.iter_mut().filter(|c| !c.done) {
            let wait_ms = if args.follow && single {
                FOLLOW_WAIT_MS
            } else {
                0
            };
            let page =
                fetcher.fetch(&args.topic, c.partition, c.offset, args.max_bytes, wait_ms)?;
            for r in records(&page.batches)? {
                if r.offset < c.offset {
                    continue;
                }
                if printer.exhausted() {
                    full = true;
                    break;
                }
                if let Some(t) = c.skip_before_ms {
                    if r.timestamp_ms < t {
                        c.position = r.offset + 1;
                        continue;
                    }
                    c.skip_before_ms = None;
                }
                got = true;
                printer.print(c.partition, &r)?;
                c.position = r.offset + 1;
            }
            full |= printer.exhausted();
            if full {
                break;
            }
            c.offset = page.next_offset;
            c.position = c.offset;
            c.done = !args.follow && c.offset >= page.high_watermark;
        }
        // Committed only once the output took it.
        printer.out.flush()?;
        commit(args, &mut client, &mut cursors)?;
        if full || cursors.iter().all(|c| c.done) {
            return Ok(());
        }
        if args.follow && !got && !single {
            std::thread::sleep(FOLLOW_IDLE_SLEEP);
        }
    }
}

struct Printer<'a, W: Write> {
    out: W,
    topic: &'a str,
    format: &'a str,
    json: bool,
    /// Records still to print with --count.
    left: Option<u64>,
}

impl<W: Write> Printer<'_, W> {
    /// Whether --count records were printed.
    fn exhausted(&self) -> bool {
        self.left == Some(0)
    }

    fn print(&mut self, partition: u32, r: &FetchedRecord) -> Result<(), ClientError> {
        debug_assert!(!self.exhausted());
        if self.json {
            let line = json_record(self.topic, partition, r);
            writeln!(self.out, "{line}")?;
        } else {
            format_record(&mut self.out, self.format, partition, r)?;
        }
        if let Some(n) = &mut self.left {
            *n -= 1;
        }
        Ok(())
    }
}

fn json_record(topic: &str, partition: u32, r: &FetchedRecord) -> serde_json::Value {
    let mut doc = json!({
        "topic": topic,
        "partition": partition,
        "offset": r.offset,
        "timestamp_ms": r.timestamp_ms,
    });
    let mut put = |name: &str, bytes: &[u8]| match std::str::from_utf8(bytes) {
        Ok(s) => doc[name] = json!(s),
        Err(_) => doc[format!("{name}_hex")] = json!(hex(bytes)),
    };
    put("key", &r.key);
    put("value", &r.value);
    let headers: serde_json::Map<String, serde_json::Value> = r
        .headers
        .iter()
        .map(|(n, v)| {
            (
                String::from_utf8_lossy(n).into_owned(),
                json!(String::from_utf8_lossy(v)),
            )
        })
        .collect();
    doc["headers"] = serde_json::Value::Object(headers);
    doc
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Writes `r` as `format` says (see `ConsumeArgs::format`).
fn format_record(
    out: &mut impl Write,
    format: &str,
    partition: u32,
    r: &FetchedRecord,
) -> std::io::Result<()> {
    let mut chars = format.chars();
    let mut buf = [0u8; 4];
    while let Some(ch) = chars.next() {
        match ch {
            '%' => match chars.next() {
                Some('p') => write!(out, "{partition}")?,
                Some('o') => write!(out, "{}", r.offset)?,
                Some('t') => write!(out, "{}", r.timestamp_ms)?,
                Some('k') => out.write_all(&r.key)?,
                Some('v') => out.write_all(&r.value)?,
                Some('h') => {
                    for (i, (n, v)) in r.headers.iter().enumerate() {
                        if i > 0 {
                            out.write_all(b",")?;
                        }
                        out.write_all(n)?;
                        out.write_all(b"=")?;
                        out.write_all(v)?;
                    }
                }
                Some('%') => out.write_all(b"%")?,
                Some(other) => write!(out, "%{other}")?,
                None => out.write_all(b"%")?,
            },
            '\\' => match chars.next() {
                Some('n') => out.write_all(b"\n")?,
                Some('t') => out.write_all(b"\t")?,
                Some('\\') => out.write_all(b"\\")?,
                Some(other) => write!(out, "\\{other}")?,
                None => out.write_all(b"\\")?,
            },
            c => out.write_all(c.encode_utf8(&mut buf).as_bytes())?,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_positions_parse_and_resolve_within_the_log() {
        assert_eq!(Start::parse("beginning"), Ok(Start::Beginning));
        assert_eq!(Start::parse("-3"), Ok(Start::FromEnd(3)));
        assert_eq!(Start::parse("@17"), Ok(Start::TimestampMs(17)));
        assert!(Start::parse("soon").is_err());
        assert!(Start::parse("-x").is_err());
        assert_eq!(Start::Offset(100).resolve(5, 10), 10);
        assert_eq!(Start::Offset(1).resolve(5, 10), 5);
        assert_eq!(Start::FromEnd(20).resolve(5, 10), 5);
        assert_eq!(Start::FromEnd(2).resolve(5, 10), 8);
        assert_eq!(Start::End.resolve(5, 10), 10);
    }

    #[test]
    fn format_expands_every_field_and_escape() {
        let r = FetchedRecord {
            offset: 7,
            timestamp_ms: 99,
            key: b"k".to_vec(),
            headers: vec![
                (b"a".to_vec(), b"1".to_vec()),
                (b"b".to_vec(), b"2".to_vec()),
            ],
            value: b"v".to_vec(),
        };
        let mut out = Vec::new();
        format_record(&mut out, "%p %o %k %t %h %v %% %x\\t|\\n", 3, &r).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "3 7 k 99 a=1,b=2 v % %x\t|\n"
        );
    }
}
